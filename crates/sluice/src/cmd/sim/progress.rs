//! Progress of long `sluice sim` runs, on stderr only (stdout carries the results and the
//! JSON): a bar when stderr is a terminal, else a plain line at every tenth, so that logs
//! and CI stay readable. A run that ends within a second shows nothing.

use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Runs shorter than this need no progress.
const QUIET_FOR: Duration = Duration::from_secs(1);

/// One long run's progress, fed by the library's `progress(done, total)` callbacks.
#[derive(Debug)]
pub(crate) struct Progress {
    label: String,
    unit: &'static str,
    started: Instant,
    terminal: bool,
    bar: Option<ProgressBar>,
    /// Plain lines: the last tenth printed.
    tenth: u64,
    message: String,
}

impl Progress {
    /// Progress of `label`, counted in `unit` (`cycles`, `runs`, …).
    pub(crate) fn new(label: impl Into<String>, unit: &'static str) -> Self {
        Self {
            label: label.into(),
            unit,
            started: Instant::now(),
            terminal: std::io::stderr().is_terminal(),
            bar: None,
            tenth: 0,
            message: String::new(),
        }
    }

    /// `done` of `total` units are done.
    pub(crate) fn update(&mut self, done: u64, total: u64) {
        if self.started.elapsed() < QUIET_FOR {
            return;
        }
        if self.terminal {
            let (label, unit, message) = (&self.label, self.unit, &self.message);
            let elapsed = self.started.elapsed();
            let bar = self.bar.get_or_insert_with(|| {
                // Hidden until set up, so that its first frame is the real position.
                let bar = ProgressBar::hidden().with_elapsed(elapsed);
                bar.set_style(style(unit));
                bar.set_prefix(label.clone());
                bar.set_message(message.clone());
                bar.set_length(total);
                bar.set_position(done);
                bar.set_draw_target(ProgressDrawTarget::stderr());
                bar
            });
            bar.set_length(total);
            bar.set_position(done);
            return;
        }
        let tenth = done.saturating_mul(10) / total.max(1);
        if tenth > self.tenth {
            self.tenth = tenth;
            let what = if self.message.is_empty() {
                String::new()
            } else {
                format!(", {}", self.message)
            };
            eprintln!(
                "{}: {}% ({done}/{total} {}{what}, {:.0} s)",
                self.label,
                tenth * 10,
                self.unit,
                self.started.elapsed().as_secs_f64()
            );
        }
    }

    /// What is running now (shown next to the bar, or in the plain lines).
    pub(crate) fn set_message(&mut self, message: impl Into<String>) {
        self.message = message.into();
        if let Some(bar) = &self.bar {
            bar.set_message(self.message.clone());
        }
    }

    /// A line on stderr that does not tear the bar.
    pub(crate) fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| eprintln!("{line}")),
            None => eprintln!("{line}"),
        }
    }

    /// Removes the bar (the summary follows).
    pub(crate) fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // An error ends the run early: its message must not land on a half-drawn bar.
        self.finish();
    }
}

fn style(unit: &str) -> ProgressStyle {
    let template = format!(
        "{{prefix}} [{{wide_bar}}] {{pos}}/{{len}} {unit}, {{elapsed}} (~{{eta}} left) {{msg}}"
    );
    ProgressStyle::with_template(&template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}
