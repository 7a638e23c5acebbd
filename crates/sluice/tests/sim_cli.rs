//! Every `sluice sim` experiment of seeds 000, 003 and 004 end to end through the real
//! binary, at a tiny size: one JSON object on stdout with `--json`, its CSV and SVG files in
//! `--out`, and nothing but plain text on stderr when it is not a terminal.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// A fresh output directory for one test.
fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-sim-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Runs `sluice sim ARGS --json --out DIR`; checks it succeeded and printed exactly one
/// JSON object, and that every file in `files` was written (and is not empty).
fn sim(args: &[&str], dir: &Path, files: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("sim")
        .args(args)
        .args(["--json", "--out"])
        .arg(dir)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{args:?}: {stderr}");
    // Progress goes to stderr, and stderr is a pipe here: no bar, no terminal escapes.
    assert!(!stderr.contains('\u{1b}'), "{args:?}: {stderr:?}");
    assert_eq!(stdout.lines().count(), 1, "{args:?}: {stdout}");
    let json: Value = serde_json::from_str(&stdout).unwrap();
    for f in files {
        let meta = std::fs::metadata(dir.join(f));
        assert!(
            meta.is_ok_and(|m| m.len() > 0),
            "{args:?}: {f} missing in {}",
            dir.display()
        );
    }
    let _ = std::fs::remove_dir_all(dir);
    json
}

fn number(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn dst_example2() {
    let dir = out_dir("dst-example2");
    let v = sim(
        &["dst-example2", "--cycles", "30", "--seed", "2"],
        &dir,
        &["summary.csv", "trace.csv", "accepted.svg"],
    );
    assert_eq!(v["cycles"], 30);
    assert_eq!(v["seed"], 2);
    assert_eq!(v["out"], dir.to_str().unwrap());
    // Two graphs × (dst-sync at two gains, Sluice at two gains, static).
    assert_eq!(v["runs"].as_array().unwrap().len(), 10);
    assert!((number(&v["gamma_opt"][0]) - 0.4226).abs() < 5e-4, "{v}");
}

#[test]
fn gdrl_ring() {
    let dir = out_dir("gdrl-ring");
    let v = sim(
        &["gdrl-ring", "--nodes", "5", "--slots", "200"],
        &dir,
        &["trace.csv", "q.svg", "jfi.svg", "lambda.svg"],
    );
    assert_eq!(v["nodes"], 5);
    assert_eq!(v["slots"], 200);
    assert!(number(&v["max_sum_over_limit"]) <= 0.0, "{v}");
    assert!(number(&v["q_mean_final"]).is_finite(), "{v}");
}

#[test]
fn gdrl_dynamic() {
    let dir = out_dir("gdrl-dynamic");
    let v = sim(
        &["gdrl-dynamic", "--nodes", "5", "--tau0", "50"],
        &dir,
        &["trace.csv", "q.svg", "jfi.svg", "lambda.svg"],
    );
    assert_eq!(v["tau0"], 50);
    assert_eq!(v["run"]["slots"], 200);
    assert_eq!(v["phases"].as_array().unwrap().len(), 4);
}

#[test]
fn gdrl_scale() {
    let dir = out_dir("gdrl-scale");
    let v = sim(
        &[
            "gdrl-scale",
            "--sizes",
            "10",
            "--degrees",
            "2,4",
            "--slots",
            "200",
        ],
        &dir,
        &["jfi.csv", "cases.csv", "jfi-N10.svg"],
    );
    let cases = v["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 2);
    for c in cases {
        // The nodes are not recorded per cycle, and the final mean q is still a number.
        assert!(number(&c["q_mean_final"]).is_finite(), "{c}");
    }
}

#[test]
fn token_account() {
    let dir = out_dir("token-account");
    let v = sim(
        &[
            "token-account",
            "--nodes",
            "100",
            "--periods",
            "10",
            "--pairs",
            "2:4",
            "--kinds",
            "randomized",
            "--threads",
            "1",
        ],
        &dir,
        &[
            "runs.csv",
            "series.csv",
            "push-gossip.svg",
            "gossip-learning.svg",
            "power-iteration.svg",
            "tokens.svg",
        ],
    );
    assert_eq!(v["experiment"], "token-account");
    assert_eq!(v["apps"].as_array().unwrap().len(), 3);
    // Three applications × (proactive, randomized A=2 C=4), at most one message per node
    // and period each.
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6);
    for r in runs {
        assert!(number(&r["messages_per_node_period"]) <= 1.0, "{r}");
    }
}

#[test]
fn baselines() {
    let dir = out_dir("baselines");
    let v = sim(
        &[
            "baselines",
            "--topology",
            "ring:4",
            "--workloads",
            "steady",
            "--strategies",
            "sluice,static,central",
            "--loss",
            "0,0.1",
            "--cycles",
            "30",
        ],
        &dir,
        &["baselines.csv", "error-loss-0.svg", "error-loss-0.1.svg"],
    );
    assert_eq!(v["nodes"], 4);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6);
    for r in rows.iter().filter(|r| r["strategy"] == "sluice") {
        assert_eq!(number(&r["overshoot_pct"]), 0.0, "{r}");
    }
}

#[test]
fn cluster_units_per_request() {
    let dir = out_dir("cluster-units");
    let args = [
        "cluster",
        "--topology",
        "ring:5",
        "--limit",
        "50",
        "--cycles",
        "40",
        "--units-per-request",
        "1048576",
    ];
    let v = sim(&args, &dir, &["cluster.csv", "cluster.svg"]);
    assert_eq!(v["units_per_request"], 1_048_576);
    assert_eq!(v["limit"], 50);
    assert!(number(&v["max_share_sum_over_limit"]) <= 0.0, "{v}");
    // Without the option the JSON is what it was: no new field.
    let v = sim(&args[..args.len() - 2], &dir, &[]);
    assert!(v.get("units_per_request").is_none(), "{v}");
}

#[test]
fn cluster_refuses_zero_units_per_request() {
    for (k, why) in [
        ("0", "at least one capacity unit"),
        ("1e3", "invalid value"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args([
                "sim",
                "cluster",
                "--topology",
                "ring:3",
                "--units-per-request",
                k,
            ])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{k}: {stderr}");
        assert!(
            stderr.contains("--units-per-request") && stderr.contains(why),
            "{k}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{k}: {stderr}");
        assert!(out.stdout.is_empty(), "{k}");
    }
}
