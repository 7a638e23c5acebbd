//! `sluice demo` end to end, through the real binary, shortened (2 nodes, 2 s phases): the
//! summary reports what it promises — the decision latency inside the nodes and the gRPC
//! round trip, each labelled — and the CSV and SVG land in `--out`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test: failing loudly is the point

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The number after `label` on its summary line (`  LABEL   12.34 µs`).
fn value(stdout: &str, label: &str) -> f64 {
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no `{label}` line in:\n{stdout}"));
    line[line.find(label).unwrap() + label.len()..]
        .split_whitespace()
        .next()
        .and_then(|v| v.trim_end_matches('%').parse().ok())
        .unwrap_or_else(|| panic!("no number on `{line}`"))
}

#[test]
fn a_short_demo_summarises_and_writes_its_csv_and_chart() {
    let out = std::env::temp_dir().join(format!("sluice-demo-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "demo",
            "--nodes",
            "2",
            "--rate",
            "200",
            "--phase-seconds",
            "2",
        ])
        .arg("--out")
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Four phases of 2 s, plus start and stop: bounded well above that.
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sluice demo did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );

    // Decision latency inside the nodes, and the round trip the load generators saw.
    let p50 = value(&stdout, "p50 decision latency (in the nodes)");
    let p99 = value(&stdout, "p99 decision latency (in the nodes)");
    assert!(
        p50 > 0.0 && p99 >= p50,
        "decision p50 {p50} µs, p99 {p99} µs"
    );
    let rt50 = value(&stdout, "p50 latency (gRPC round trip)");
    let rt99 = value(&stdout, "p99 latency (gRPC round trip)");
    assert!(
        rt50 > 0.0 && rt99 >= rt50,
        "round trip p50 {rt50} µs, p99 {rt99} µs"
    );
    let over_throttling = value(&stdout, "over-throttling (seed 000 §6)");
    assert!((0.0..=100.0).contains(&over_throttling), "{stdout}");
    // The nodes divide the limit: above it only for a moment while demand moves.
    let overshoot = value(&stdout, "overshoot above the global limit");
    assert!((0.0..10.0).contains(&overshoot), "{stdout}");
    // 70 % to 150 % of 200/s offered in the phases: decisions every second.
    assert!(
        value(&stdout, "decisions per second (all nodes)") > 0.0,
        "{stdout}"
    );
    // Two nodes that divide a limit talk to each other.
    for label in [
        "peer messages per node per second",
        "peer bytes per node per second",
    ] {
        assert!(value(&stdout, label) > 0.0, "{label}: {stdout}");
    }
    assert_eq!(value(&stdout, "errors"), 0.0, "{stdout}");

    // One CSV row per second of the four phases, with the per-second decision latency.
    let csv = std::fs::read_to_string(out.join("demo.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(
        header,
        [
            "t",
            "phase",
            "offered",
            "admitted",
            "limit",
            "share_0",
            "admitted_0",
            "share_1",
            "admitted_1",
            "decision_p50_us",
            "decision_p99_us"
        ]
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 8, "{csv}");
    assert!(rows.iter().all(|r| r.len() == header.len()), "{csv}");
    // Every second had decisions, so every second has a latency (read in process from each
    // node: nothing to fail).
    for r in &rows {
        let p50: f64 = r[9].parse().unwrap_or_else(|_| panic!("{csv}"));
        let p99: f64 = r[10].parse().unwrap_or_else(|_| panic!("{csv}"));
        assert!(p50 > 0.0 && p99 >= p50, "{csv}");
    }
    let svg = std::fs::read_to_string(out.join("demo.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.trim_end().ends_with("</svg>"));
    std::fs::remove_dir_all(&out).unwrap();
}
