//! Loading configuration: every refusal names file, line, column and reason; directories;
//! Sluice's own fields; reload keeps the old configuration when the new one is refused.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use sluice_limits::AlgorithmKind;
use sluice_server::{
    Code, Config, ConfigErrorKind, ConfigSource, Coordination, Descriptor, Engine, Policy, Request,
    config::EXAMPLE_YAML,
};

/// A fresh empty directory under the system's temp dir.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-server-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

/// (file contents, line, column, reason predicate, words the message must hold)
type Case = (
    &'static str,
    usize,
    usize,
    fn(&ConfigErrorKind) -> bool,
    &'static str,
);

#[test]
fn refusals_name_file_line_column_and_reason() {
    let cases: &[Case] = &[
        (
            "domain: d\ndescriptors:\n  - key: a\n    valeu: b\n",
            4,
            5,
            |k| matches!(k, ConfigErrorKind::UnknownField { field, .. } if field == "valeu"),
            "unknown field `valeu`",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
            5,
            13,
            |k| matches!(k, ConfigErrorKind::BadUnit(u) if u == "fortnight"),
            "unknown unit \"fortnight\"",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: -3\n",
            6,
            26,
            |k| {
                matches!(
                    k,
                    ConfigErrorKind::BadNumber {
                        field: "requests_per_unit",
                        ..
                    }
                )
            },
            "requests_per_unit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      algorithm: leaky\n",
            7,
            18,
            |k| matches!(k, ConfigErrorKind::UnknownAlgorithm(_)),
            "unknown algorithm \"leaky\"",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      algorithm: gcra\n      burst: 0\n",
            8,
            14,
            |k| matches!(k, ConfigErrorKind::BadNumber { field: "burst", .. }),
            "burst",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      coordination: zookeeper\n",
            7,
            21,
            |k| matches!(k, ConfigErrorKind::UnknownCoordination(c) if c == "zookeeper"),
            "unknown coordination \"zookeeper\"",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    value: b\n  - key: c\n  - key: a\n    value: b\n",
            6,
            5,
            |k| matches!(k, ConfigErrorKind::DuplicateDescriptor(c) if c == "a_b"),
            "duplicate descriptor \"a_b\"",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: x\n      - key: x\n",
            6,
            9,
            |k| matches!(k, ConfigErrorKind::DuplicateDescriptor(c) if c == "a.x"),
            "duplicate descriptor \"a.x\"",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      replaces:\n        - name: ghost\n      unit: second\n      requests_per_unit: 5\n",
            5,
            7,
            |k| matches!(k, ConfigErrorKind::UnknownReplaces(n) if n == "ghost"),
            "no rule of this domain has that name",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n",
            6,
            13,
            |k| matches!(k, ConfigErrorKind::UnitWithUnlimited),
            "unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      burst: 9\n",
            7,
            14,
            |k| {
                matches!(
                    k,
                    ConfigErrorKind::BurstUnused(sluice_limits::AlgorithmKind::FixedWindow)
                )
            },
            "`burst` has no effect with algorithm fixed-window",
        ),
        (
            "domain: d\ndescriptors:\n  - value: b\n",
            3,
            5,
            |k| matches!(k, ConfigErrorKind::EmptyKey),
            "key",
        ),
        (
            "domain: \"\"\ndescriptors: []\n",
            1,
            9,
            |k| matches!(k, ConfigErrorKind::EmptyDomain),
            "domain must not be empty",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      requests_per_unit: 5\n",
            5,
            7,
            |k| matches!(k, ConfigErrorKind::MissingField("unit")),
            "missing `unit`",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n   bad: [\n",
            4,
            4,
            |k| matches!(k, ConfigErrorKind::Yaml(_)),
            "invalid YAML",
        ),
        (
            "domain: d\ndomain: e\n",
            2,
            1,
            |k| matches!(k, ConfigErrorKind::Yaml(m) if m.contains("duplicated key")),
            "duplicated key",
        ),
    ];
    for (text, line, column, reason, words) in cases {
        let err = Config::from_yaml("rules.yaml", text).unwrap_err();
        let msg = err.to_string();
        assert_eq!(err.file, Path::new("rules.yaml"), "{msg}");
        assert_eq!(
            (err.line, err.column),
            (Some(*line), Some(*column)),
            "{msg}\n--- in:\n{text}"
        );
        assert!(reason(&err.kind), "{msg}");
        assert!(
            msg.starts_with(&format!("rules.yaml:{line}:{column}: ")),
            "{msg}"
        );
        assert!(msg.contains(words), "{msg} lacks {words:?}");
    }
}

#[test]
fn sluice_fields_are_read_with_defaults() {
    let config = Config::from_yaml(
        "a.yaml",
        "domain: d
descriptors:
  - key: plain
    rate_limit: { unit: minute, requests_per_unit: 60 }
  - key: tuned
    rate_limit:
      unit: second
      requests_per_unit: 100
      algorithm: gcra
      burst: 20
      coordination: cluster
",
    )
    .unwrap();
    let d = config.domain("d").unwrap();
    let limited = |key| match &d.rule_for([(key, "x")]).unwrap().policy {
        Policy::Limited(l) => l.clone(),
        Policy::Unlimited => panic!("limited"),
    };
    let plain = limited("plain");
    assert_eq!(plain.algorithm, AlgorithmKind::FixedWindow);
    assert_eq!(plain.coordination, Coordination::Local);
    assert_eq!(plain.burst, None);
    assert_eq!(plain.limit.unwrap().burst(), 60);
    let tuned = limited("tuned");
    assert_eq!(tuned.algorithm, AlgorithmKind::Gcra);
    assert_eq!(tuned.coordination, Coordination::Cluster);
    assert_eq!(tuned.limit.unwrap().burst(), 20);
    assert_eq!(tuned.limit.unwrap().period(), 1_000_000_000);

    // GCRA with burst 20 at 100/s: 20 at once, then one every 10 ms.
    let engine = Engine::new(config);
    let req = Request::new("d", [Descriptor::new([("tuned", "x")])]);
    let t0 = 1_700_000_000_000_000_000;
    for _ in 0..20 {
        assert_eq!(
            engine.should_rate_limit(t0, &req).unwrap().overall_code,
            Code::Ok
        );
    }
    assert_eq!(
        engine.should_rate_limit(t0, &req).unwrap().overall_code,
        Code::OverLimit
    );
    assert_eq!(
        engine
            .should_rate_limit(t0 + 10_000_000, &req)
            .unwrap()
            .overall_code,
        Code::Ok
    );
}

#[test]
fn example_config_is_valid_and_limits() {
    assert_eq!(
        Config::from_yaml("<built-in example>", EXAMPLE_YAML).unwrap(),
        Config::example()
    );
    let engine = Engine::new(Config::example());
    let req = Request::new(
        "example",
        [Descriptor::new([("remote_address", "10.0.0.1")])],
    );
    let codes: Vec<Code> = (0..11)
        .map(|_| engine.should_rate_limit(0, &req).unwrap().overall_code)
        .collect();
    assert_eq!(codes.iter().filter(|&&c| c == Code::Ok).count(), 10);
    assert_eq!(codes[10], Code::OverLimit);
    assert_eq!(ConfigSource::Example.load().unwrap(), Config::example());
}

#[test]
fn directory_loads_yaml_files_and_refuses_duplicate_domains() {
    let dir = temp_dir("dir");
    write(
        &dir,
        "a.yaml",
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1 }\n",
    );
    write(&dir, "b.yml", "domain: b\ndescriptors: []\n");
    write(&dir, "notes.txt", "not yaml: [");
    write(&dir, ".hidden.yaml", "not yaml: [");
    let config = ConfigSource::Path(dir.clone()).load().unwrap();
    let mut names: Vec<&str> = config.domains().map(|d| d.name()).collect();
    names.sort_unstable();
    assert_eq!(names, ["a", "b"]);

    write(&dir, "c.yaml", "# again\ndomain: a\n");
    let err = ConfigSource::Path(dir.clone()).load().unwrap_err();
    assert_eq!(err.file, dir.join("c.yaml"));
    assert_eq!(err.line, Some(2));
    assert!(
        matches!(&err.kind, ConfigErrorKind::DuplicateDomain { domain, first } if domain == "a" && first.contains("a.yaml:1:9")),
        "{err}"
    );

    // An empty directory is no domain, as envoyproxy/ratelimit serves an empty runtime
    // directory.
    let empty = temp_dir("empty");
    let config = ConfigSource::Path(empty).load().unwrap();
    assert_eq!(config.domains().count(), 0);
    let err = ConfigSource::Path(dir.join("missing.yaml"))
        .load()
        .unwrap_err();
    assert!(matches!(err.kind, ConfigErrorKind::Io(_)), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn reload_keeps_old_config_and_state_on_error() {
    let dir = temp_dir("reload");
    write(
        &dir,
        "a.yaml",
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n",
    );
    let source = ConfigSource::Path(dir.clone());
    let engine = Engine::new(source.load().unwrap());
    let req = Request::new("a", [Descriptor::new([("k", "v")])]);
    let t = 1_700_006_400_000_000_000;
    assert_eq!(
        engine.should_rate_limit(t, &req).unwrap().statuses[0].limit_remaining,
        1
    );

    // A broken second file: refused with its place; the old config and the count stay.
    write(
        &dir,
        "b.yaml",
        "domain: b\ndescriptors:\n  - key: k\n    rate_limit: { unit: lightyear, requests_per_unit: 2 }\n",
    );
    let before = engine.config();
    let err = engine.reload(&source).unwrap_err();
    assert_eq!(
        (err.file.clone(), err.line),
        (dir.join("b.yaml"), Some(4)),
        "{err}"
    );
    assert!(matches!(err.kind, ConfigErrorKind::BadUnit(_)), "{err}");
    assert_eq!(*engine.config(), *before);
    assert_eq!(
        engine.should_rate_limit(t, &req).unwrap().statuses[0].limit_remaining,
        0
    );

    // The same through `ConfigSource::reload` on a plain `Config`.
    let mut config = (*before).clone();
    assert!(source.reload(&mut config).is_err());
    assert_eq!(config, *before);

    // Fixed: the new config is in force, and the counter of `a` survives the reload.
    write(
        &dir,
        "b.yaml",
        "domain: b\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 2 }\n",
    );
    engine.reload(&source).unwrap();
    assert!(engine.config().domain("b").is_some());
    assert_eq!(
        engine.should_rate_limit(t, &req).unwrap().overall_code,
        Code::OverLimit
    );
    let _ = std::fs::remove_dir_all(&dir);
}
