//! `sluice replay` end to end, through the real binary.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn trace_file(name: &str, text: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("sluice-replay-{}-{name}.csv", std::process::id()));
    std::fs::write(&p, text).unwrap();
    p
}

fn sluice(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    // The binary may exit (bad arguments) before reading: a broken pipe is fine.
    let _ = pipe.write_all(stdin.unwrap_or("").as_bytes());
    drop(pipe);
    child.wait_with_output().unwrap()
}

const TRACE: &str = "time_ns,key,cost\n\
0,alice,1\n\
100,alice,1\n\
200,alice,1\n\
300,bob,1\n\
999999999,alice,5\n\
1000000000,alice,1\n";

/// seed 002 §3.5: a sliding log of 2/1s admits alice's first two, refuses the third until
/// the first leaves the window (exactly 1 s after it), keeps bob apart, and can never admit
/// a cost of 5.
#[test]
fn sliding_log_csv() {
    let p = trace_file("log", TRACE);
    let out = sluice(
        &[
            "replay",
            "--algorithm",
            "sliding-log",
            "--limit",
            "2/1s",
            "--trace",
            p.to_str().unwrap(),
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "time_ns,key,cost,allowed,remaining,retry_after_ns\n\
         0,alice,1,true,1,0\n\
         100,alice,1,true,0,0\n\
         200,alice,1,false,0,999999800\n\
         300,bob,1,true,1,0\n\
         999999999,alice,5,false,0,\n\
         1000000000,alice,1,true,0,0\n"
    );
    std::fs::remove_file(p).unwrap();
}

/// JSON lines from standard input, written to a file; `null` for "never".
#[test]
fn fixed_window_jsonl_from_stdin_to_file() {
    let out_path =
        std::env::temp_dir().join(format!("sluice-replay-{}-out.jsonl", std::process::id()));
    let out = sluice(
        &[
            "replay",
            "--algorithm",
            "fixed-window",
            "--limit",
            "2/1s",
            "--trace",
            "-",
            "--format",
            "jsonl",
            "--output",
            out_path.to_str().unwrap(),
            "--summary",
        ],
        Some(TRACE),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty());
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "6 requests, 4 admitted (4 permits), 2 keys\n"
    );
    let text = std::fs::read_to_string(&out_path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 6);
    // The window [0, 1 s) is full after two; the next window opens at 1 s.
    assert_eq!(lines[2]["allowed"], false);
    assert_eq!(lines[2]["retry_after_ns"], 999_999_800);
    assert_eq!(lines[4]["retry_after_ns"], serde_json::Value::Null);
    assert_eq!(lines[5]["allowed"], true);
    assert_eq!(lines[5]["key"], "alice");
    std::fs::remove_file(out_path).unwrap();
}

/// Every algorithm name the contract lists runs, with --burst and --sub-windows.
#[test]
fn every_algorithm_runs() {
    for alg in [
        "fixed-window",
        "fixed-window-first",
        "sliding-window",
        "sliding-log",
        "leaky-bucket",
        "token-bucket",
        "gcra",
        "warm-up",
    ] {
        let out = sluice(
            &[
                "replay",
                "--algorithm",
                alg,
                "--limit",
                "2/1s",
                "--burst",
                "3",
                "--sub-windows",
                "4",
                "--trace",
                "-",
            ],
            Some(TRACE),
        );
        assert!(
            out.status.success(),
            "{alg}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8(out.stdout).unwrap().lines().count(),
            7,
            "{alg}"
        );
    }
}

/// Bad input is a clear error naming the line, and a failure exit status, not a panic.
#[test]
fn bad_input_is_a_clear_error() {
    let run = |trace: &str, extra: &[&str]| {
        let mut args = vec![
            "replay",
            "--algorithm",
            "gcra",
            "--limit",
            "2/1s",
            "--trace",
            "-",
        ];
        args.extend_from_slice(extra);
        let out = sluice(&args, Some(trace));
        assert!(!out.status.success());
        String::from_utf8(out.stderr).unwrap()
    };
    let e = run("time_ns,key,cost\n10,a,1\n5,a,1\n", &[]);
    assert!(e.contains("line 3: time_ns 5 goes backwards"), "{e}");
    let e = run("t,k,c\n", &[]);
    assert!(e.contains("line 1: bad header"), "{e}");
    let e = run("time_ns,key,cost\n1,a,one\n", &[]);
    assert!(
        e.contains("line 2: cost \"one\" is not a whole number"),
        "{e}"
    );
    let e = run(TRACE, &["--format", "xml"]);
    assert!(e.contains("unknown output format"), "{e}");
    let e = run(TRACE, &["--sub-windows", "0"]);
    assert!(e.contains("--sub-windows"), "{e}");
    let out = sluice(
        &[
            "replay",
            "--algorithm",
            "nope",
            "--limit",
            "2/1s",
            "--trace",
            "-",
        ],
        None,
    );
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(
        e.contains("unknown algorithm") && e.contains("sliding-log"),
        "{e}"
    );
    let out = sluice(
        &[
            "replay",
            "--algorithm",
            "gcra",
            "--limit",
            "2/1s",
            "--trace",
            "/nonexistent/x.csv",
        ],
        None,
    );
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("cannot open the trace")
    );
}
