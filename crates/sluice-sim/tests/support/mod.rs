//! What the determinism tests compare: an experiment's output directory, file by file.
#![allow(clippy::unwrap_used, dead_code)]

use std::path::Path;

/// Every file of `dir` (not recursing): its name and its bytes, sorted by name.
pub(crate) fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}
