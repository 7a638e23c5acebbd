//! The configuration watcher of a running node (`sluice serve --watch`): a [`Daemon`] on a
//! file in a temporary directory, the file changed on disk while it serves. A valid change
//! takes effect; an invalid one is refused, counted in `/metrics`, and the configuration in
//! force stays (with its counters).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test: failing loudly is the point

mod view;
use view::unix_now;

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sluice_server::ConfigSource;
use sluice_server::daemon::{Daemon, DaemonSpec};
use sluice_server::{Descriptor, Engine, Request};

fn rules(per_minute: u32) -> String {
    format!(
        "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit:\n      unit: day\n      \
         requests_per_unit: {per_minute}\n"
    )
}

const DAY: u64 = 86_400 * 1_000_000_000;

/// One request for tenant `t` (per day, windows aligned to the unix epoch): (limit in
/// force, remaining), consuming one hit.
fn check(engine: &Engine, t: &str) -> (u32, u32) {
    let req = Request::new("api", [Descriptor::new([("tenant", t)])]);
    let r = engine.should_rate_limit(unix_now(), &req).unwrap();
    let s = &r.statuses[0];
    (
        s.current_limit.unwrap().requests_per_unit,
        s.limit_remaining,
    )
}

/// `GET /metrics` of the node: the sample `sluice_config_reloads_total{result="…"}`.
fn reloads(http: SocketAddr, result: &str) -> u64 {
    let mut s = std::net::TcpStream::connect_timeout(&http, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let name = format!("sluice_config_reloads_total{{result=\"{result}\"}} ");
    out.lines()
        .find_map(|l| l.strip_prefix(name.as_str()))
        .unwrap_or_else(|| panic!("no {name} in:\n{out}"))
        .trim()
        .parse()
        .unwrap()
}

/// Waits (bounded) until `done` holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write(path: &Path, text: &str) {
    // Through a temporary file renamed into place, as editors and config managers do.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_takes_effect_and_an_invalid_one_is_refused() {
    let dir = TempDir(std::env::temp_dir().join(format!("sluice-watch-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let file = dir.0.join("limits.yaml");
    write(&file, &rules(5));
    let daemon = Daemon::start(DaemonSpec {
        source: ConfigSource::Path(file.clone()),
        grpc_addr: ([127, 0, 0, 1], 0).into(),
        http_addr: Some(([127, 0, 0, 1], 0).into()),
        cluster: None,
        watch: Some(Duration::from_millis(50)),
        redis: None,
    })
    .await
    .unwrap();
    let http = daemon.http_addr.unwrap();
    let engine = daemon.engine.clone();
    assert_eq!(check(&engine, "a"), (5, 4));

    // A valid change (the lengths differ, so even a coarse modification time shows it).
    write(&file, &rules(70));
    until("the new limit", || check(&engine, "probe").0 == 70).await;
    // The watcher counts a reload after applying it: the counter may lag the new limit.
    until("the reload counted", || reloads(http, "ok") == 1).await;
    assert_eq!(reloads(http, "ok"), 1);
    assert_eq!(reloads(http, "refused"), 0);
    let day = unix_now() / DAY;
    let (limit, left) = check(&engine, "a");
    assert_eq!(limit, 70);

    // An invalid change: refused and counted, the configuration in force stays.
    write(
        &file,
        "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
    );
    until("the refusal counted", || reloads(http, "refused") == 1).await;
    let (limit, after) = check(&engine, "a");
    assert_eq!(limit, 70, "the old configuration stays in force");
    // Its counters too (unless the day's window ended in between).
    if unix_now() / DAY == day {
        assert_eq!(after + 1, left, "tenant a's count moved on by one");
    }
    assert_eq!(reloads(http, "ok"), 1);

    // Fixed again: applied.
    write(&file, &rules(9));
    until("the fixed limit", || check(&engine, "probe2").0 == 9).await;
    until("the second reload counted", || reloads(http, "ok") == 2).await;
    assert_eq!(reloads(http, "ok"), 2);
    daemon.shutdown().await;
}
