//! Issue 5: one conformance suite for the in-memory and the Redis implementations, end to
//! end through the binary. `sluice replay --backend redis://…` must write exactly the bytes
//! `--backend memory` writes, for every algorithm (each has a Redis script), on the example
//! traces in `tests/traces/` (the README's, the CLI test's two keys, and a bursty
//! three-key trace with same-instant requests, zero costs and costs above the limit).
//!
//! Starts its own `redis-server` on a free 127.0.0.1 port; skips (saying why) only when
//! `redis-server` is not on PATH.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Every `--algorithm` value; each has a Redis script.
const REDIS_ALGORITHMS: [&str; 8] = [
    "fixed-window",
    "fixed-window-first",
    "sliding-window",
    "sliding-log",
    "leaky-bucket",
    "token-bucket",
    "gcra",
    "warm-up",
];

/// One `redis-server`, killed when dropped.
struct Redis {
    port: u16,
    child: Child,
    dir: PathBuf,
}

impl Redis {
    /// `None` when `redis-server` is not installed.
    fn start() -> Option<Self> {
        let installed = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !installed {
            return None;
        }
        // A port may be taken between reading it and the server binding it: retry.
        for attempt in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let dir = std::env::temp_dir().join(format!(
                "sluice-replay-redis-{}-{attempt}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let mut server = Self { port, child, dir };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if server.child.try_wait().unwrap().is_some() {
                    break; // exited: most likely the port was taken meanwhile
                }
                if server.pong() {
                    return Some(server);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("could not start redis-server on a free 127.0.0.1 port after 5 tries");
    }

    fn pong(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = [0u8; 16];
        s.write_all(b"PING\r\n").is_ok()
            && s.read(&mut buf)
                .is_ok_and(|n| buf[..n].starts_with(b"+PONG"))
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn traces() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/traces");
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "csv"))
        .collect();
    v.sort();
    assert!(v.len() >= 3, "example traces missing: {v:?}");
    v
}

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn ok(out: Output, what: &str) -> Vec<u8> {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn redis_writes_the_bytes_memory_writes() {
    let Some(redis) = Redis::start() else {
        eprintln!(
            "SKIPPED: redis-server is not on PATH (apt-get install -y redis-server; \
             scripts/test-all.sh installs it)"
        );
        return;
    };
    let url = redis.url();
    // Two limits: one the README uses (tight, refusals and "never"), one with a burst
    // above the rate, sub-windows that do not divide evenly and a warm-up shorter than the
    // default (its floating-point ramp is neither trivial nor a whole number of periods).
    let limits: [&[&str]; 2] = [
        &["--limit", "2/1s"],
        &[
            "--limit",
            "7/300ms",
            "--burst",
            "10",
            "--sub-windows",
            "3",
            "--warm-up",
            "700ms",
        ],
    ];
    let mut compared = 0;
    let mut refused = 0;
    for trace in traces() {
        let trace = trace.to_str().unwrap();
        for alg in REDIS_ALGORITHMS {
            for (l, limit) in limits.iter().enumerate() {
                for format in ["csv", "jsonl"] {
                    let mut args = vec!["replay", "--algorithm", alg, "--trace", trace];
                    args.extend_from_slice(limit);
                    args.extend_from_slice(&["--format", format]);
                    let what = format!("{alg} {limit:?} {format} on {trace}");
                    let memory = ok(sluice(&args), &what);
                    // Each run its own key prefix: state must not carry over between runs.
                    let prefix = format!("t:{alg}:{l}:{format}:{compared}:");
                    args.extend_from_slice(&["--backend", &url, "--redis-prefix", &prefix]);
                    let redis = ok(sluice(&args), &what);
                    assert!(
                        memory == redis,
                        "{what}: memory and Redis differ\n--- memory\n{}\n--- redis\n{}",
                        String::from_utf8_lossy(&memory),
                        String::from_utf8_lossy(&redis)
                    );
                    refused += String::from_utf8_lossy(&memory).matches("false").count();
                    compared += 1;
                }
            }
        }
    }
    assert_eq!(compared, traces().len() * REDIS_ALGORITHMS.len() * 2 * 2);
    // The traces must exercise refusals, or the comparison would prove little.
    assert!(refused > 1000, "only {refused} refusals across all runs");
}

#[test]
fn redis_state_is_per_prefix_and_the_default_prefix_is_fresh() {
    let Some(redis) = Redis::start() else {
        eprintln!("SKIPPED: redis-server is not on PATH");
        return;
    };
    let trace = traces()[0].clone();
    let args = [
        "replay",
        "--algorithm",
        "gcra",
        "--limit",
        "2/1s",
        "--trace",
        trace.to_str().unwrap(),
        "--backend",
        &redis.url(),
    ];
    let memory = ok(sluice(&args[..7]), "memory");
    // Twice with the default prefix: the second run does not see the first one's state.
    assert_eq!(ok(sluice(&args), "redis 1"), memory);
    assert_eq!(ok(sluice(&args), "redis 2"), memory);
    // Twice with one explicit prefix: the second run continues from the first's state,
    // which is what a shared prefix means (and why the default is unique).
    let mut shared = args.to_vec();
    shared.extend_from_slice(&["--redis-prefix", "shared:"]);
    assert_eq!(ok(sluice(&shared), "shared 1"), memory);
    assert_ne!(ok(sluice(&shared), "shared 2"), memory);
}

#[test]
fn what_redis_cannot_run_is_a_clear_error() {
    let trace = traces()[0].clone();
    let trace = trace.to_str().unwrap();
    // What Lua's doubles cannot compute exactly is refused before connecting, so no server
    // is needed: a token bucket of a million per day in ns, a warm-up whose cold interval
    // puts a burst past 2^53 ns.
    for (alg, limit) in [("token-bucket", "1000000/1d"), ("warm-up", "1/1d")] {
        let out = sluice(&[
            "replay",
            "--algorithm",
            alg,
            "--limit",
            limit,
            "--burst",
            "100000",
            "--trace",
            trace,
            "--backend",
            "redis://127.0.0.1:1/",
        ]);
        assert!(!out.status.success());
        let e = String::from_utf8(out.stderr).unwrap();
        assert!(
            e.contains(&format!(
                "{alg}: the state (time, or burst × period) passes 2^53 ns"
            )),
            "{e}"
        );
        assert!(out.stdout.is_empty());
    }
    // Nobody listens on port 1: a clear error, no rows.
    let out = sluice(&[
        "replay",
        "--algorithm",
        "gcra",
        "--limit",
        "2/1s",
        "--trace",
        trace,
        "--backend",
        "redis://127.0.0.1:1/",
    ]);
    assert!(!out.status.success());
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(
        e.contains("redis at redis://127.0.0.1:1/ does not answer"),
        "{e}"
    );
    assert!(out.stdout.is_empty());
    let out = sluice(&[
        "replay",
        "--algorithm",
        "gcra",
        "--limit",
        "2/1s",
        "--trace",
        trace,
        "--backend",
        "memcached://x",
    ]);
    assert!(!out.status.success());
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(e.contains("unknown backend"), "{e}");
}
