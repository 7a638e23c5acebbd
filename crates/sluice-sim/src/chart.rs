//! A small, dependency-free SVG line chart: series of (x, y) points, a title, axis labels,
//! "nice" ticks and a legend. Enough to look at an experiment's curves without a plotting
//! stack.
//!
//! ```
//! use sluice_sim::chart::LineChart;
//! let svg = LineChart::new("Backlog", "slot", "work")
//!     .series("JSQ", vec![(0.0, 0.0), (1.0, 2.0), (2.0, 1.5)])
//!     .series("JSQT", vec![(0.0, 0.0), (1.0, 1.0), (2.0, 0.5)])
//!     .to_svg();
//! assert!(svg.starts_with("<svg") && svg.contains("JSQT"));
//! ```

use std::fmt::Write as _;
use std::path::Path;

/// One named curve.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points in drawing order; non-finite points are skipped.
    pub points: Vec<(f64, f64)>,
}

/// A line chart with any number of series.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    /// Title above the plot.
    pub title: String,
    /// Label under the x axis.
    pub x_label: String,
    /// Label beside the y axis.
    pub y_label: String,
    /// The curves.
    pub series: Vec<Series>,
    /// Size in pixels (width, height).
    pub size: (f64, f64),
}

const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];
const MARGIN: (f64, f64, f64, f64) = (70.0, 20.0, 40.0, 50.0); // left, right, top, bottom

impl LineChart {
    /// An empty chart, 800×450 pixels.
    #[must_use]
    pub fn new(
        title: impl Into<String>,
        x_label: impl Into<String>,
        y_label: impl Into<String>,
    ) -> Self {
        Self {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            series: Vec::new(),
            size: (800.0, 450.0),
        }
    }

    /// Adds a series (builder style).
    #[must_use]
    pub fn series(mut self, label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        self.series.push(Series {
            label: label.into(),
            points,
        });
        self
    }

    /// Writes the SVG to `path`.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.to_svg())
    }

    fn bounds(&self) -> ((f64, f64), (f64, f64)) {
        let pts = self
            .series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|(x, y)| x.is_finite() && y.is_finite());
        let (mut x0, mut x1, mut y0, mut y1) = (
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::INFINITY,
            f64::NEG_INFINITY,
        );
        for &(x, y) in pts {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if !x0.is_finite() {
            return ((0.0, 1.0), (0.0, 1.0));
        }
        // Include zero on the y axis when the data is close to it; pad degenerate ranges.
        if y0 > 0.0 && y0 < 0.5 * y1 {
            y0 = 0.0;
        }
        let pad = |a: f64, b: f64| {
            if b > a {
                (a, b)
            } else {
                (a - 0.5 - a.abs() * 0.1, b + 0.5 + b.abs() * 0.1)
            }
        };
        (pad(x0, x1), pad(y0, y1))
    }

    /// Renders the chart as a standalone SVG document.
    #[must_use]
    pub fn to_svg(&self) -> String {
        let (w, h) = self.size;
        let (ml, mr, mt, mb) = MARGIN;
        let (pw, ph) = (w - ml - mr, h - mt - mb);
        let ((x0, x1), (y0, y1)) = self.bounds();
        let (xt, yt) = (nice_ticks(x0, x1, 8), nice_ticks(y0, y1, 6));
        let (x0, x1) = (x0.min(xt[0]), x1.max(xt[xt.len() - 1]));
        let (y0, y1) = (y0.min(yt[0]), y1.max(yt[yt.len() - 1]));
        let sx = |x: f64| ml + (x - x0) / (x1 - x0) * pw;
        let sy = |y: f64| mt + ph - (y - y0) / (y1 - y0) * ph;
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
        );
        let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        let _ = write!(
            s,
            r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
            w / 2.0,
            esc(&self.title)
        );
        for &t in &xt {
            let x = sx(t);
            let _ = write!(
                s,
                r##"<line x1="{x:.1}" y1="{mt}" x2="{x:.1}" y2="{:.1}" stroke="#e5e5e5"/>"##,
                mt + ph
            );
            let _ = write!(
                s,
                r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                mt + ph + 16.0,
                fmt_tick(t)
            );
        }
        for &t in &yt {
            let y = sy(t);
            let _ = write!(
                s,
                r##"<line x1="{ml}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e5e5e5"/>"##,
                ml + pw
            );
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                ml - 6.0,
                y + 4.0,
                fmt_tick(t)
            );
        }
        let _ = write!(
            s,
            r##"<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
        );
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            ml + pw / 2.0,
            h - 10.0,
            esc(&self.x_label)
        );
        let _ = write!(
            s,
            r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">{}</text>"#,
            mt + ph / 2.0,
            mt + ph / 2.0,
            esc(&self.y_label)
        );
        for (i, series) in self.series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let mut d = String::new();
            for &(x, y) in series
                .points
                .iter()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
            {
                let _ = write!(
                    d,
                    "{}{:.2},{:.2}",
                    if d.is_empty() { "M" } else { " L" },
                    sx(x),
                    sy(y)
                );
            }
            if !d.is_empty() {
                let _ = write!(
                    s,
                    r#"<path d="{d}" fill="none" stroke="{color}" stroke-width="1.5"/>"#
                );
            }
            let ly = mt + 14.0 + 16.0 * i as f64;
            let lx = ml + 10.0;
            let _ = write!(
                s,
                r#"<line x1="{lx}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{color}" stroke-width="3"/>"#,
                ly - 4.0,
                lx + 18.0,
                ly - 4.0
            );
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{ly:.1}">{}</text>"#,
                lx + 24.0,
                esc(&series.label)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

/// Ticks at 1, 2 or 5 × 10^k covering [lo, hi] with about `target` intervals.
fn nice_ticks(lo: f64, hi: f64, target: usize) -> Vec<f64> {
    let raw = (hi - lo) / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|st| *st >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).floor() * step;
    let mut ticks = Vec::new();
    let mut k = 0.0;
    loop {
        let t = first + k * step;
        ticks.push(t);
        if t >= hi - 1e-12 * step.abs() || ticks.len() > 100 {
            break;
        }
        k += 1.0;
    }
    ticks
}

fn fmt_tick(t: f64) -> String {
    let a = t.abs();
    if a != 0.0 && !(1e-3..1e7).contains(&a) {
        format!("{t:.1e}")
    } else if (t - t.round()).abs() < 1e-9 {
        format!("{}", t.round())
    } else {
        let s = format!("{t:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_cover_the_range_with_round_steps() {
        let t = nice_ticks(0.0, 1_000_000.0, 8);
        assert_eq!(t.first(), Some(&0.0));
        assert!(*t.last().unwrap() >= 1_000_000.0);
        assert!((t[1] - t[0] - 200_000.0).abs() < 1e-6);
        let t = nice_ticks(0.33, 0.67, 6);
        assert!(t[0] <= 0.33 && *t.last().unwrap() >= 0.67);
    }

    #[test]
    fn svg_is_well_formed_and_escaped() {
        let svg = LineChart::new("a < b & c", "x", "y")
            .series("s\"1", vec![(0.0, 1.0), (f64::NAN, 2.0), (2.0, 3.0)])
            .series("empty", vec![])
            .to_svg();
        assert!(svg.contains("a &lt; b &amp; c") && svg.contains("s&quot;1"));
        assert_eq!(svg.matches("<path").count(), 1);
        assert!(svg.trim_end().ends_with("</svg>"));
        // A chart with no data still renders.
        assert!(LineChart::new("t", "x", "y").to_svg().contains("</svg>"));
        assert!(
            LineChart::new("t", "x", "y")
                .series("flat", vec![(1.0, 5.0), (1.0, 5.0)])
                .to_svg()
                .contains("<path")
        );
    }
}
