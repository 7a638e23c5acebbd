//! The incarnation a `sluice serve` node starts as: one more than its state file says, the
//! one given, or the wall clock. It must be larger than any an earlier start of the node
//! held (docs/PROTOCOL.md, "Incarnations").

use std::path::Path;

use anyhow::Context as _;

/// The incarnation to start as, and the one it follows when that is known exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Start {
    pub(crate) incarnation: u64,
    /// The incarnation the previous start ended as (the state file's), `None` on a first
    /// start or when it is not known (`--incarnation`, the clock).
    pub(crate) previous: Option<u64>,
}

/// The incarnation to start as: with a state file, the next one (recorded before the node
/// starts); else `given`; else the clock's.
pub(crate) fn at_start(state_file: Option<&Path>, given: Option<u64>) -> anyhow::Result<Start> {
    match (state_file, given) {
        (Some(p), _) => next_incarnation(p),
        (None, Some(i)) => {
            anyhow::ensure!(i >= 1, "--incarnation: must be at least 1");
            Ok(Start {
                incarnation: i,
                previous: None,
            })
        }
        (None, None) => Ok(Start {
            incarnation: clock_incarnation()?,
            previous: None,
        }),
    }
}

/// Reads, increments and writes back the incarnation (written before the node starts, so a
/// crash right after start still moves it on).
fn next_incarnation(path: &Path) -> anyhow::Result<Start> {
    let last = match std::fs::read_to_string(path) {
        Ok(t) => t
            .trim()
            .parse::<u64>()
            .with_context(|| format!("{}: not an incarnation number", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let next = last + 1;
    sluice_server::cluster::persist_incarnation(path, next)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(Start {
        incarnation: next,
        previous: (last >= 1).then_some(last),
    })
}

/// An incarnation from the wall clock, milliseconds since 1970: larger than any incarnation
/// an earlier start of this node held (a start takes more than a millisecond, and a node
/// reincarnates at run time at most once per lease), unless the clock was set back by more
/// than the time between the two starts. Never 1: a start without a state file cannot tell
/// whether it is the first.
fn clock_incarnation() -> anyhow::Result<u64> {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the system clock is before 1970: give --incarnation or --state-file")?
        .as_millis();
    Ok(u64::try_from(ms).unwrap_or(u64::MAX).max(2))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test

    use super::*;

    #[test]
    fn a_state_file_moves_on_and_the_clock_only_grows() {
        let dir = std::env::temp_dir().join(format!("sluice-inc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("incarnation");
        let _ = std::fs::remove_file(&file);
        let start = |i, p| Start {
            incarnation: i,
            previous: p,
        };
        assert_eq!(
            at_start(Some(&file), None).unwrap(),
            start(1, None),
            "first"
        );
        assert_eq!(
            at_start(Some(&file), Some(9)).unwrap(),
            start(2, Some(1)),
            "the file wins, and says which incarnation the restart follows"
        );
        assert_eq!(at_start(None, Some(9)).unwrap(), start(9, None));
        assert!(at_start(None, Some(0)).is_err());
        let a = at_start(None, None).unwrap();
        assert_eq!(a.previous, None, "the clock does not know the previous one");
        std::thread::sleep(std::time::Duration::from_millis(2));
        let (a, b) = (a.incarnation, at_start(None, None).unwrap().incarnation);
        assert!(a > 1 && b > a, "clock incarnations {a} then {b}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
