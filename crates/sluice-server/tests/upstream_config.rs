//! envoyproxy/ratelimit's own configuration fixtures, unchanged: every file upstream loads
//! loads, every file it refuses is refused for the same reason (the expectations of its
//! `test/config/config_test.go`), its integration test's runtime directory and its README
//! examples load. Skipped, with a note, when the corpus is not next to the checkout.
#![allow(clippy::unwrap_used)]

mod conformance;

use std::path::PathBuf;

use conformance::{corpus, integration_config, upstream_config};
use sluice_server::{Config, ConfigErrorKind, ConfigSource, Policy};

fn load(path: PathBuf) -> Result<Config, sluice_server::ConfigError> {
    ConfigSource::Path(path).load()
}

/// test/config/config_test.go: TestBasicConfig, TestShadowModeConfig, TestWildcardConfig,
/// the share_threshold and metadata tests — each fixture upstream loads, loads here.
#[test]
fn every_fixture_upstream_loads_loads() {
    let Some(corpus) = corpus() else { return };
    for name in [
        "basic_config.yaml",
        "shadowmode_config.yaml",
        "wildcard.yaml",
        "share_threshold.yaml",
        "metadata.yaml",
        "merge_domain_key1.yaml",
        "merge_domain_key2.yaml",
    ] {
        let config = load(upstream_config(&corpus, name))
            .unwrap_or_else(|e| panic!("{name} must load, as upstream loads it: {e}"));
        assert!(config.domain("test-domain").is_some(), "{name}");
    }
    // test/integration/integration_test.go runs on this directory.
    let config = load(integration_config(&corpus)).unwrap();
    let mut domains: Vec<_> = config.domains().map(|d| d.name().to_owned()).collect();
    domains.sort();
    assert_eq!(domains, ["another", "basic", "share-threshold-test"]);
    // README examples (the yaml blocks of "Configuration → Examples").
    let readme = corpus.join("readme");
    let mut n = 0;
    for entry in std::fs::read_dir(&readme).unwrap() {
        let path = entry.unwrap().path();
        load(path.clone()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        n += 1;
    }
    assert!(n >= 16, "{n} README examples");
}

/// test/config/config_test.go: each refused fixture, and upstream's reason for it.
#[test]
fn every_fixture_upstream_refuses_is_refused_for_its_reason() {
    let Some(corpus) = corpus() else { return };
    type Reason = fn(&ConfigErrorKind) -> bool;
    let cases: &[(&str, &str, Reason)] = &[
        // "invalid rate limit unit 'foo'"
        (
            "bad_limit_unit.yaml",
            "unit",
            |k| matches!(k, ConfigErrorKind::BadUnit(u) if u == "foo"),
        ),
        // "error loading config file: yaml: ..."
        ("bad_yaml.yaml", "yaml", |k| {
            matches!(k, ConfigErrorKind::Yaml(_))
        }),
        // "duplicate descriptor composite key 'test-domain.key1_value1'"
        (
            "duplicate_key.yaml",
            "duplicate",
            |k| matches!(k, ConfigErrorKind::DuplicateDescriptor(d) if d == "key1_value1"),
        ),
        // "config file cannot have empty domain"
        ("empty_domain.yaml", "domain", |k| {
            matches!(k, ConfigErrorKind::EmptyDomain)
        }),
        // "descriptor has empty key"
        ("empty_key.yaml", "key", |k| {
            matches!(k, ConfigErrorKind::EmptyKey)
        }),
        // "config error, unknown key 'ratelimit'"
        (
            "misspelled_key.yaml",
            "ratelimit",
            |k| matches!(k, ConfigErrorKind::UnknownField { field, .. } if field == "ratelimit"),
        ),
        // "config error, unknown key 'requestsperunit'"
        (
            "misspelled_key2.yaml",
            "requestsperunit",
            |k| matches!(k, ConfigErrorKind::UnknownField { field, .. } if field == "requestsperunit"),
        ),
        // "config error, yaml file contains list of type other than map: a"
        ("non_map_list.yaml", "mapping", |k| {
            matches!(
                k,
                ConfigErrorKind::WrongType {
                    expected: "a mapping",
                    ..
                }
            )
        }),
        // "config error, key is not of type string: 0.25"
        (
            "non_string_key.yaml",
            "0.25",
            |k| matches!(k, ConfigErrorKind::NonStringKey(key) if key == "0.25"),
        ),
        // "should not have an empty replaces entry"
        ("replaces_empty.yaml", "replaces", |k| {
            matches!(k, ConfigErrorKind::EmptyReplaces)
        }),
        // "replaces should not contain name of same descriptor"
        (
            "replaces_self.yaml",
            "itself",
            |k| matches!(k, ConfigErrorKind::ReplacesItself(n) if n == "self"),
        ),
        // "should not specify rate limit unit when unlimited"
        ("unlimited_with_unit.yaml", "unlimited", |k| {
            matches!(k, ConfigErrorKind::UnitWithUnlimited)
        }),
    ];
    for (name, word, reason) in cases {
        let err = load(upstream_config(&corpus, name))
            .err()
            .unwrap_or_else(|| panic!("{name} must be refused, as upstream refuses it"));
        assert!(
            reason(&err.kind),
            "{name}: refused for another reason: {err}"
        );
        assert!(err.to_string().contains(word), "{name}: {err}");
        assert_eq!(
            err.file,
            upstream_config(&corpus, name),
            "{name}: names the file"
        );
    }
}

/// test/config/config_test.go (TestDuplicateDomain, TestMergeDomainConfig): two files of
/// one domain are refused ("duplicate domain 'test-domain' in config file") unless
/// `MERGE_DOMAIN_CONFIG` is set, when their descriptors are merged.
#[test]
fn a_domain_in_two_files_is_refused_unless_merged() {
    let Some(corpus) = corpus() else { return };
    let read = |name: &str| {
        let path = upstream_config(&corpus, name);
        let text = std::fs::read_to_string(&path).unwrap();
        (path, text)
    };
    let files = [read("basic_config.yaml"), read("duplicate_domain.yaml")];
    let err = Config::from_files(files.iter().map(|(p, t)| (p.clone(), t.as_str()))).unwrap_err();
    assert!(
        matches!(&err.kind, ConfigErrorKind::DuplicateDomain { domain, .. } if domain == "test-domain"),
        "{err}"
    );
    let files = [
        read("merge_domain_key1.yaml"),
        read("merge_domain_key2.yaml"),
    ];
    let texts = || files.iter().map(|(p, t)| (p.clone(), t.as_str()));
    assert!(Config::from_files(texts()).is_err());
    let merged = Config::from_files_merging(texts()).unwrap();
    let domain = merged.domain("test-domain").unwrap();
    let limit = |k: &str, v: &str| match &domain.rule_for([(k, v)]).unwrap().policy {
        Policy::Limited(l) => l.rate.requests_per_unit,
        Policy::Unlimited => panic!("limited"),
    };
    assert_eq!((limit("key1", "value1"), limit("key2", "value2")), (10, 20));
    // A descriptor defined in both files is still a duplicate.
    let twice = [
        read("merge_domain_key1.yaml"),
        read("merge_domain_key1.yaml"),
    ];
    let err =
        Config::from_files_merging(twice.iter().map(|(p, t)| (p.clone(), t.as_str()))).unwrap_err();
    assert!(
        matches!(err.kind, ConfigErrorKind::DuplicateDescriptor(_)),
        "{err}"
    );
}

/// src/config/config_impl.go: `share_threshold` only on a value with a `*` ("share_threshold
/// can only be used with wildcard values").
#[test]
fn share_threshold_without_a_wildcard_is_refused() {
    let err = Config::from_yaml(
        "t.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    value: plain\n    share_threshold: true\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n",
    )
    .unwrap_err();
    assert!(
        matches!(&err.kind, ConfigErrorKind::ShareThresholdWithoutWildcard(k) if k == "k_plain"),
        "{err}"
    );
    assert_eq!(err.line, Some(5));
}

/// src/config/config_impl.go: `validateYamlKeys` checks every key of a file, at any depth
/// but under `metadata`, against one list (`validKeys`), and `ConfigFileContentToYaml` then
/// decodes with yaml.v2's `Unmarshal` (not `UnmarshalStrict`), which ignores the keys
/// `YamlRoot` (`domain`, `descriptors`) or `YamlDescriptor` lack. So a known key where it
/// means nothing is accepted and ignored, `metadata` at the top of a file included.
#[test]
fn known_keys_where_they_mean_nothing_are_accepted_and_ignored() {
    let yaml = "domain: d
metadata: { owner: team-a, anything: [1, 2], nested: { free: form } }
name: ignored
shadow_mode: true
quota_mode: true
key: ignored
unit: fortnight
rate_limit: { unit: second, requests_per_unit: 1, replaces: [{ name: x }] }
descriptors:
  - key: k
    domain: ignored
    unit: ignored
    requests_per_unit: 7
    rate_limit: { unit: minute, requests_per_unit: 3, key: ignored, shadow_mode: true }
";
    let config = Config::from_yaml("t.yaml", yaml).unwrap();
    let domain = config.domain("d").unwrap();
    let rule = domain.rule_for([("k", "v")]).unwrap();
    match &rule.policy {
        Policy::Limited(l) => assert_eq!(l.rate.requests_per_unit, 3),
        Policy::Unlimited => panic!("limited"),
    }
    // `shadow_mode` under `rate_limit` is not the descriptor's: ignored.
    assert!(!rule.shadow_mode);
    assert_eq!(
        domain.rules().len(),
        1,
        "the top-level rate_limit is no rule"
    );
}

/// src/config/config_impl.go `validateYamlKeys`: an unknown key is refused wherever it is,
/// even under a key that is itself ignored ("config error, unknown key 'X'"); a list of
/// anything but mappings is refused ("yaml file contains list of type other than map"); a
/// value that is not a string, an int, a bool, a mapping or a list is refused ("error
/// checking config"): a float, even where Sluice would read a string. Sluice's own keys
/// are unknown outside `rate_limit`, as upstream has no such keys.
#[test]
fn unknown_keys_and_unwalkable_values_are_refused_at_any_depth() {
    type Reason = fn(&ConfigErrorKind) -> bool;
    let cases: &[(&str, usize, Reason)] = &[
        (
            "domain: d
owner: me
",
            2,
            |k| matches!(k, ConfigErrorKind::UnknownField { field, .. } if field == "owner"),
        ),
        (
            "domain: d
algorithm: gcra
",
            2,
            |k| matches!(k, ConfigErrorKind::UnknownField { field, .. } if field == "algorithm"),
        ),
        (
            "domain: d
rate_limit: { bogus: 1 }
",
            2,
            |k| matches!(k, ConfigErrorKind::UnknownField { field, .. } if field == "bogus"),
        ),
        (
            "domain: d
name: [a]
",
            2,
            |k| {
                matches!(
                    k,
                    ConfigErrorKind::WrongType {
                        expected: "a mapping",
                        ..
                    }
                )
            },
        ),
        (
            "domain: d
descriptors:
  - key: k
    value: 1.5
",
            4,
            |k| matches!(k, ConfigErrorKind::UncheckableValue { field, text } if field == "value" && text == "1.5"),
        ),
        (
            "domain: d
descriptors:
  - key: k
    rate_limit: { unit: second, requests_per_unit: 2.0 }
",
            4,
            |k| matches!(k, ConfigErrorKind::UncheckableValue { field, .. } if field == "requests_per_unit"),
        ),
        (
            "domain: d
unit: 99999999999999999999
",
            2,
            |k| matches!(k, ConfigErrorKind::UncheckableValue { .. }),
        ),
    ];
    for (yaml, line, reason) in cases {
        let err = Config::from_yaml("t.yaml", yaml).unwrap_err();
        assert!(
            reason(&err.kind),
            "{yaml:?}: refused for another reason: {err}"
        );
        assert_eq!(err.line, Some(*line), "{yaml:?}: {err}");
    }
    // Keys and values under `metadata` are not checked, at the top as on a descriptor.
    Config::from_yaml(
        "t.yaml",
        "domain: d
metadata: [1.5, { any: 0.5 }]
",
    )
    .unwrap();
}
