//! Reading one configuration file: YAML with line and column, into a [`Domain`].

use std::collections::hash_map::Entry as MapEntry;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use saphyr::{MarkedYaml, ScalarStyle, YamlData, YamlLoader};
use saphyr_parser::{Marker, Parser};
use sluice_limits::{AlgorithmKind, Limit};

use super::tree::{Node, Wildcard};
use super::{
    ConfigError, ConfigErrorKind, Coordination, Domain, Fairness, Level, Limited, Location,
    Metadata, Policy, RateLimit, Rule, RuleLeases, Unit,
};

/// envoyproxy/ratelimit's `validKeys` (`src/config/config_impl.go`): its `validateYamlKeys`
/// checks every key of a file, at any depth but under `metadata`, against this one list,
/// then its YAML decoder (yaml.v2's `Unmarshal`, not `UnmarshalStrict`) ignores the keys
/// the struct at that place lacks. So a known key where it means nothing (`metadata` or
/// `name` at the top of a file, `unit` on a descriptor) is accepted and ignored; an
/// unknown one is refused wherever it is.
const UPSTREAM_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "quota_mode",
    "metadata",
];
/// The keys Sluice adds (under `rate_limit`, and `leases`' own), known to the same check;
/// outside their place they are refused, as unknown keys are.
const KNOWN_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "quota_mode",
    "metadata",
    "algorithm",
    "burst",
    "coordination",
    "fairness",
    "leases",
    "policy",
    "duration",
];
const ROOT_FIELDS: &[&str] = &["domain", "descriptors"];
const DESCRIPTOR_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    // Added upstream since late 2025.
    "quota_mode",
    "share_threshold",
    "value_to_metric",
    "metadata",
];
const RATE_LIMIT_FIELDS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "burst",
    "coordination",
    "fairness",
    "leases",
];
const LEASES_FIELDS: &[&str] = &["policy", "duration"];
const REPLACES_FIELDS: &[&str] = &["name"];

type Yaml<'i> = MarkedYaml<'i>;

/// A descriptor's flags that its rule carries.
#[derive(Debug, Clone, Copy, Default)]
struct Flags {
    shadow_mode: bool,
    quota_mode: bool,
    detailed_metric: bool,
}

struct FileParser<'f> {
    file: &'f Path,
}

impl FileParser<'_> {
    fn err_at(&self, m: Marker, kind: ConfigErrorKind) -> ConfigError {
        ConfigError {
            file: self.file.to_path_buf(),
            line: Some(m.line()),
            column: Some(m.col() + 1),
            kind,
        }
    }

    fn err(&self, node: &Yaml<'_>, kind: ConfigErrorKind) -> ConfigError {
        self.err_at(node.span.start, kind)
    }

    fn location(&self, node: &Yaml<'_>) -> Location {
        Location {
            file: self.file.to_path_buf(),
            line: node.span.start.line(),
            column: node.span.start.col() + 1,
        }
    }

    /// The fields of a mapping, each checked against `allowed`. With `lenient` (the places
    /// envoyproxy/ratelimit's format has), a key of [`UPSTREAM_KEYS`] not in `allowed` is
    /// left out, as upstream's decoder ignores it; else it is refused as unknown.
    fn fields<'n, 'i>(
        &self,
        node: &'n Yaml<'i>,
        what: &str,
        allowed: &'static [&'static str],
        lenient: bool,
    ) -> Result<Vec<(&'n str, &'n Yaml<'i>)>, ConfigError> {
        let YamlData::Mapping(map) = &node.data else {
            return Err(self.err(
                node,
                ConfigErrorKind::WrongType {
                    field: what.to_string(),
                    expected: "a mapping",
                },
            ));
        };
        let mut out = Vec::with_capacity(map.len());
        for (k, v) in map {
            let name = match &k.data {
                YamlData::Representation(s, ScalarStyle::Plain, _) if !is_yaml_string(s) => {
                    return Err(self.err(k, ConfigErrorKind::NonStringKey(s.to_string())));
                }
                YamlData::Representation(s, _, _) => s.as_ref(),
                _ => {
                    return Err(self.err(k, ConfigErrorKind::NonStringKey("<not a scalar>".into())));
                }
            };
            if !allowed.contains(&name) {
                if lenient && UPSTREAM_KEYS.contains(&name) {
                    continue;
                }
                return Err(self.err(
                    k,
                    ConfigErrorKind::UnknownField {
                        field: name.to_string(),
                        allowed,
                    },
                ));
            }
            out.push((name, v));
        }
        Ok(out)
    }

    /// envoyproxy/ratelimit's `validateYamlKeys`, run on the whole file before it is read:
    /// every key a string and a known one ([`KNOWN_KEYS`]), the items of every list
    /// mappings, every other value a mapping, a string, a whole number, a boolean or null;
    /// nothing under `metadata` is checked.
    fn validate_keys(&self, node: &Yaml<'_>) -> Result<(), ConfigError> {
        let YamlData::Mapping(map) = &node.data else {
            return Ok(());
        };
        for (k, v) in map {
            let name = match &k.data {
                YamlData::Representation(s, ScalarStyle::Plain, _) if !is_yaml_string(s) => {
                    return Err(self.err(k, ConfigErrorKind::NonStringKey(s.to_string())));
                }
                YamlData::Representation(s, _, _) => s.as_ref(),
                _ => {
                    return Err(self.err(k, ConfigErrorKind::NonStringKey("<not a scalar>".into())));
                }
            };
            if !KNOWN_KEYS.contains(&name) {
                return Err(self.err(
                    k,
                    ConfigErrorKind::UnknownField {
                        field: name.to_string(),
                        allowed: KNOWN_KEYS,
                    },
                ));
            }
            if name == "metadata" {
                continue;
            }
            match &v.data {
                YamlData::Mapping(_) => self.validate_keys(v)?,
                YamlData::Sequence(items) => {
                    for item in items {
                        if !matches!(item.data, YamlData::Mapping(_)) {
                            return Err(self.err(
                                item,
                                ConfigErrorKind::WrongType {
                                    field: format!("{name} item"),
                                    expected: "a mapping",
                                },
                            ));
                        }
                        self.validate_keys(item)?;
                    }
                }
                YamlData::Representation(s, ScalarStyle::Plain, None) if is_yaml_float(s) => {
                    return Err(self.err(
                        v,
                        ConfigErrorKind::UncheckableValue {
                            field: name.to_string(),
                            text: s.to_string(),
                        },
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// A scalar as text; `None` for null (`~`, `null`, or nothing), as YAML decoders give
    /// a Go string field its zero value.
    fn string(&self, node: &Yaml<'_>, field: &str) -> Result<Option<String>, ConfigError> {
        match &node.data {
            YamlData::Representation(s, style, _) => {
                let null = *style == ScalarStyle::Plain
                    && matches!(s.as_ref(), "" | "~" | "null" | "Null" | "NULL");
                Ok((!null).then(|| s.to_string()))
            }
            _ => Err(self.err(
                node,
                ConfigErrorKind::WrongType {
                    field: field.to_string(),
                    expected: "a string",
                },
            )),
        }
    }

    fn boolean(&self, node: &Yaml<'_>, field: &str) -> Result<bool, ConfigError> {
        let wrong = || {
            self.err(
                node,
                ConfigErrorKind::WrongType {
                    field: field.to_string(),
                    expected: "true or false",
                },
            )
        };
        match &node.data {
            YamlData::Representation(s, ScalarStyle::Plain, _) => match s.as_ref() {
                "true" | "True" | "TRUE" => Ok(true),
                "false" | "False" | "FALSE" | "" | "~" | "null" => Ok(false),
                _ => Err(wrong()),
            },
            _ => Err(wrong()),
        }
    }

    fn number(
        &self,
        node: &Yaml<'_>,
        field: &'static str,
        min: u64,
        max: u64,
    ) -> Result<u64, ConfigError> {
        let text = match &node.data {
            YamlData::Representation(s, _, _) => s.to_string(),
            _ => "<not a number>".to_string(),
        };
        text.trim()
            .parse::<u64>()
            .ok()
            .filter(|n| (min..=max).contains(n))
            .ok_or_else(|| {
                self.err(
                    node,
                    ConfigErrorKind::BadNumber {
                        field,
                        text: text.clone(),
                        min,
                        max,
                    },
                )
            })
    }

    fn sequence<'n, 'i>(
        &self,
        node: &'n Yaml<'i>,
        field: &str,
    ) -> Result<&'n [Yaml<'i>], ConfigError> {
        match &node.data {
            YamlData::Sequence(items) => Ok(items),
            YamlData::Representation(s, ScalarStyle::Plain, _)
                if matches!(s.as_ref(), "" | "~" | "null") =>
            {
                Ok(&[])
            }
            _ => Err(self.err(
                node,
                ConfigErrorKind::WrongType {
                    field: field.to_string(),
                    expected: "a list",
                },
            )),
        }
    }

    fn domain(&self, doc: &Yaml<'_>) -> Result<Domain, ConfigError> {
        let mut name = None;
        let mut descriptors = Level::default();
        for (field, v) in self.fields(doc, "file", ROOT_FIELDS, true)? {
            match field {
                "domain" => name = Some((self.string(v, field)?.unwrap_or_default(), v)),
                _ => self.level(v, "", &mut descriptors)?,
            }
        }
        let Some((name, node)) = name else {
            // envoyproxy/ratelimit: a missing domain is an empty one.
            return Err(self.err(doc, ConfigErrorKind::EmptyDomain));
        };
        if name.is_empty() {
            return Err(self.err(node, ConfigErrorKind::EmptyDomain));
        }
        let domain = Domain {
            name,
            location: self.location(node),
            descriptors,
        };
        self.check_replaces(&domain)?;
        Ok(domain)
    }

    /// Every `replaces` names a rule of the domain.
    fn check_replaces(&self, domain: &Domain) -> Result<(), ConfigError> {
        let rules = domain.rules();
        let names: Vec<&str> = rules.iter().filter_map(|r| r.name.as_deref()).collect();
        let mut missing: Vec<(&Rule, &str)> = rules
            .iter()
            .flat_map(|r| r.replaces.iter().map(move |n| (*r, n.as_str())))
            .filter(|(_, n)| !names.contains(n))
            .collect();
        // Report the first in file order, whatever the map order.
        missing.sort_by_key(|(r, _)| (r.location.line, r.location.column));
        match missing.first() {
            Some((rule, name)) => Err(ConfigError {
                file: self.file.to_path_buf(),
                line: Some(rule.location.line),
                column: Some(rule.location.column),
                kind: ConfigErrorKind::UnknownReplaces((*name).to_string()),
            }),
            None => Ok(()),
        }
    }

    /// A `descriptors` list, into `level`. `path` names the parent, for error messages.
    fn level(&self, node: &Yaml<'_>, path: &str, level: &mut Level) -> Result<(), ConfigError> {
        for item in self.sequence(node, "descriptors")? {
            self.descriptor(item, path, level)?;
        }
        Ok(())
    }

    fn descriptor(
        &self,
        node: &Yaml<'_>,
        path: &str,
        level: &mut Level,
    ) -> Result<(), ConfigError> {
        let mut key = None;
        let mut value = None;
        let mut rate_limit = None;
        let mut children = None;
        let mut flags = Flags::default();
        let mut share_threshold = None;
        let mut value_to_metric = false;
        let mut metadata = None;
        for (field, v) in self.fields(node, "descriptor", DESCRIPTOR_FIELDS, true)? {
            match field {
                "key" => key = self.string(v, field)?,
                "value" => value = self.string(v, field)?,
                "rate_limit" => rate_limit = Some(v),
                "descriptors" => children = Some(v),
                "shadow_mode" => flags.shadow_mode = self.boolean(v, field)?,
                "quota_mode" => flags.quota_mode = self.boolean(v, field)?,
                "share_threshold" => share_threshold = Some((self.boolean(v, field)?, v)),
                // Statistics names only.
                "value_to_metric" => value_to_metric = self.boolean(v, field)?,
                // Free-form data sent to the client with a descriptor under its limit.
                "metadata" => metadata = self.metadata(v)?,
                _ => flags.detailed_metric = self.boolean(v, field)?,
            }
        }
        let key = key
            .filter(|k| !k.is_empty())
            .ok_or_else(|| self.err(node, ConfigErrorKind::EmptyKey))?;
        let value = value.filter(|v| !v.is_empty());
        let composite = match &value {
            Some(v) => format!("{path}{key}_{v}"),
            None => format!("{path}{key}"),
        };
        // envoyproxy/ratelimit: `share_threshold` only on a value with a `*`.
        let share_threshold = match share_threshold {
            Some((true, v)) if !value.as_deref().is_some_and(|v| v.contains('*')) => {
                return Err(self.err(v, ConfigErrorKind::ShareThresholdWithoutWildcard(composite)));
            }
            Some((on, _)) => on,
            None => false,
        };
        let rule = match rate_limit {
            Some(rl) => Some(self.rule(rl, &composite, flags, metadata)?),
            None => None,
        };
        let mut node_out = Node {
            rule,
            children: Level::default(),
            share_threshold,
            value_to_metric,
        };
        if let Some(c) = children {
            self.level(c, &format!("{composite}."), &mut node_out.children)?;
        }
        let nodes = level.by_key.entry(key).or_default();
        let duplicate = || {
            self.err(
                node,
                ConfigErrorKind::DuplicateDescriptor(composite.clone()),
            )
        };
        match value {
            None if nodes.any.is_some() => return Err(duplicate()),
            None => nodes.any = Some(node_out),
            Some(v) => match Wildcard::new(&v) {
                Some(w) => {
                    if nodes
                        .wildcard
                        .iter()
                        .any(|(p, _)| p.pattern() == w.pattern())
                    {
                        return Err(duplicate());
                    }
                    nodes.wildcard.push((w, node_out));
                }
                None => match nodes.exact.entry(v) {
                    MapEntry::Occupied(_) => return Err(duplicate()),
                    MapEntry::Vacant(slot) => {
                        slot.insert(node_out);
                    }
                },
            },
        }
        Ok(())
    }

    fn rule(
        &self,
        node: &Yaml<'_>,
        path: &str,
        flags: Flags,
        metadata: Option<Arc<Metadata>>,
    ) -> Result<Rule, ConfigError> {
        let mut unit = None;
        let mut rpu = None;
        let mut unlimited = false;
        let mut name = None;
        let mut replaces = Vec::new();
        let mut algorithm = None;
        let mut burst = None;
        let mut coordination = None;
        let mut fairness = None;
        let mut leases_node = None;
        for (field, v) in self.fields(node, "rate_limit", RATE_LIMIT_FIELDS, true)? {
            match field {
                "unit" => unit = self.string(v, field)?.map(|u| (u, v)),
                "requests_per_unit" => rpu = Some(v),
                "unlimited" => unlimited = self.boolean(v, field)?,
                "name" => {
                    name = self
                        .string(v, field)?
                        .filter(|n| !n.is_empty())
                        .map(std::sync::Arc::<str>::from);
                }
                "replaces" => {
                    for item in self.sequence(v, field)? {
                        let mut n = None;
                        for (_, nv) in self.fields(item, "replaces entry", REPLACES_FIELDS, true)? {
                            n = self.string(nv, "name")?;
                        }
                        match n.filter(|n| !n.is_empty()) {
                            Some(n) => replaces.push(n),
                            None => return Err(self.err(item, ConfigErrorKind::EmptyReplaces)),
                        }
                    }
                }
                "algorithm" => algorithm = Some(v),
                "burst" => burst = Some(v),
                "leases" => leases_node = Some(v),
                "fairness" => fairness = Some(v),
                _ => coordination = Some(v),
            }
        }
        if let Some(n) = &name
            && replaces.iter().any(|r| **r == **n)
        {
            return Err(self.err(node, ConfigErrorKind::ReplacesItself(n.to_string())));
        }
        let leases = match leases_node {
            Some(v) => self.leases(v)?,
            None => RuleLeases::default(),
        };
        let policy = if unlimited {
            if let Some((_, v)) = unit {
                return Err(self.err(v, ConfigErrorKind::UnitWithUnlimited));
            }
            for (field, v) in [
                ("algorithm", algorithm),
                ("burst", burst),
                ("coordination", coordination),
                ("fairness", fairness),
                ("leases", leases_node),
            ] {
                if let Some(v) = v {
                    return Err(self.err(v, ConfigErrorKind::FieldWithUnlimited(field)));
                }
            }
            Policy::Unlimited
        } else {
            let (unit_text, unit_node) =
                unit.ok_or_else(|| self.err(node, ConfigErrorKind::MissingField("unit")))?;
            let unit = Unit::parse(&unit_text)
                .ok_or_else(|| self.err(unit_node, ConfigErrorKind::BadUnit(unit_text.clone())))?;
            let rpu = rpu.ok_or_else(|| {
                self.err(node, ConfigErrorKind::MissingField("requests_per_unit"))
            })?;
            let requests_per_unit =
                u32::try_from(self.number(rpu, "requests_per_unit", 0, u64::from(u32::MAX))?)
                    .unwrap_or(u32::MAX);
            let algorithm = match algorithm {
                Some(v) => {
                    let text = self.string(v, "algorithm")?.unwrap_or_default();
                    text.parse::<AlgorithmKind>()
                        .map_err(|e| self.err(v, e.into()))?
                }
                None => AlgorithmKind::FixedWindow,
            };
            let burst = match burst {
                Some(v) if !reads_burst(algorithm) => {
                    return Err(self.err(v, ConfigErrorKind::BurstUnused(algorithm)));
                }
                Some(v) => Some(self.number(v, "burst", 1, u64::from(u32::MAX))?),
                None => None,
            };
            let coordination_node = coordination;
            let coordination = match coordination {
                Some(v) => match self.string(v, "coordination")?.as_deref() {
                    Some("local") | None => Coordination::Local,
                    Some("cluster") => Coordination::Cluster,
                    Some("redis") => Coordination::Redis,
                    // Seed 002 §4.4(3)'s token server.
                    Some("token-server" | "token_server") => Coordination::TokenServer,
                    Some(other) => {
                        return Err(
                            self.err(v, ConfigErrorKind::UnknownCoordination(other.to_string()))
                        );
                    }
                },
                None => Coordination::Local,
            };
            let fairness = match fairness {
                Some(v) if coordination != Coordination::Cluster => {
                    return Err(self.err(v, ConfigErrorKind::FairnessUnused(coordination.name())));
                }
                Some(v) => match self.string(v, "fairness")?.as_deref() {
                    Some("max-min" | "max_min") | None => Fairness::MaxMin,
                    Some("throttled") => Fairness::Throttled,
                    Some("ratio") => Fairness::Ratio,
                    Some(other) => {
                        return Err(
                            self.err(v, ConfigErrorKind::UnknownFairness(other.to_string()))
                        );
                    }
                },
                None => Fairness::default(),
            };
            // Count ≥ 1, period ≥ 1 s and burst ≥ 1 are checked above, so these cannot fail.
            let limit = Limit::from_nanos(u64::from(requests_per_unit), unit.nanos())
                .ok()
                .map(|l| match burst {
                    Some(b) => l.with_burst(b).unwrap_or(l),
                    None => l,
                });
            // A rule Redis cannot run is refused here, at its place in the file, rather
            // than decided locally on every request.
            if coordination == Coordination::Redis
                && let (Some(v), Some(l)) = (coordination_node, &limit)
                && let Err(kind) = crate::engine::central::check_rule(algorithm, l)
            {
                return Err(self.err(v, kind));
            }
            // Leases of a token-server rule are refused at request time; say so here, at
            // the place in the file, rather than let settings that never apply look valid.
            if coordination == Coordination::TokenServer
                && let Some(v) = leases_node
            {
                return Err(self.err(
                    v,
                    ConfigErrorKind::LeasesUnsupported(Coordination::TokenServer.name()),
                ));
            }
            Policy::Limited(Limited {
                rate: RateLimit {
                    requests_per_unit,
                    unit,
                },
                algorithm,
                burst,
                coordination,
                fairness,
                limit,
            })
        };
        Ok(Rule {
            path: path.to_owned(),
            name,
            replaces,
            shadow_mode: flags.shadow_mode,
            quota_mode: flags.quota_mode,
            detailed_metric: flags.detailed_metric,
            metadata,
            policy,
            leases,
            location: self.location(node),
        })
    }

    /// A descriptor's `metadata`: any mapping (or null: none), kept as JSON. Its keys and
    /// values are not checked (envoyproxy/ratelimit's `validateYamlKeys` skips them);
    /// scalars become what its YAML decoder makes of them (`parseMetadata`, into a
    /// `structpb.Struct`): numbers, booleans, null or strings.
    fn metadata(&self, node: &Yaml<'_>) -> Result<Option<Arc<Metadata>>, ConfigError> {
        match self.json(node)? {
            serde_json::Value::Object(map) if !map.is_empty() => Ok(Some(Arc::new(map))),
            serde_json::Value::Object(_) | serde_json::Value::Null => Ok(None),
            _ => Err(self.err(
                node,
                ConfigErrorKind::WrongType {
                    field: "metadata".to_string(),
                    expected: "a mapping",
                },
            )),
        }
    }

    fn json(&self, node: &Yaml<'_>) -> Result<serde_json::Value, ConfigError> {
        use serde_json::Value as J;
        Ok(match &node.data {
            YamlData::Mapping(map) => {
                let mut out = Metadata::new();
                for (k, v) in map {
                    let key = match self.json(k)? {
                        J::String(s) => s,
                        other => other.to_string(),
                    };
                    out.insert(key, self.json(v)?);
                }
                J::Object(out)
            }
            YamlData::Sequence(items) => J::Array(
                items
                    .iter()
                    .map(|i| self.json(i))
                    .collect::<Result<_, _>>()?,
            ),
            YamlData::Representation(s, ScalarStyle::Plain, _) => plain_scalar(s),
            YamlData::Representation(s, _, _) => J::String(s.to_string()),
            _ => J::Null,
        })
    }

    /// A rule's `leases` mapping: `policy` and `duration`, both optional.
    fn leases(&self, node: &Yaml<'_>) -> Result<RuleLeases, ConfigError> {
        let mut out = RuleLeases::default();
        for (field, v) in self.fields(node, "leases", LEASES_FIELDS, false)? {
            let text = self.string(v, field)?.unwrap_or_default();
            if field == "policy" {
                let policy = RuleLeases::parse_policy(&text)
                    .ok_or_else(|| self.err(v, ConfigErrorKind::UnknownLeasePolicy(text)))?;
                out.policy = Some(policy);
            } else {
                let duration = sluice_limits::limit::parse_duration(text.trim())
                    .map(Duration::from_nanos)
                    .filter(|d| (RuleLeases::MIN_DURATION..=RuleLeases::MAX_DURATION).contains(d))
                    .ok_or_else(|| self.err(v, ConfigErrorKind::BadLeaseDuration(text)))?;
                out.duration = Some(duration);
            }
        }
        Ok(out)
    }
}

/// A plain scalar as YAML 1.1 decoders read it: null, a boolean, a number or a string.
fn plain_scalar(s: &str) -> serde_json::Value {
    use serde_json::Value as J;
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return J::Null,
        "true" | "True" | "TRUE" => return J::Bool(true),
        "false" | "False" | "FALSE" => return J::Bool(false),
        _ => {}
    }
    if let Ok(i) = s.parse::<i64>() {
        return J::from(i);
    }
    match s.parse::<f64>() {
        Ok(f) if f.is_finite() && s.bytes().any(|b| b.is_ascii_digit()) => J::from(f),
        _ => J::String(s.to_owned()),
    }
}

/// Whether a plain scalar is a number yaml.v2 decodes to neither `int` nor a string: a
/// float (`0.5`, `1e3`, `.inf`, `.nan`) or a whole number beyond 64 bits.
fn is_yaml_float(s: &str) -> bool {
    let t = s.replace('_', "");
    if t.parse::<i64>().is_ok() {
        return false;
    }
    let special = matches!(t.trim_start_matches(['+', '-']), ".inf" | ".Inf" | ".INF")
        || matches!(t.as_str(), ".nan" | ".NaN" | ".NAN");
    special || (t.parse::<f64>().is_ok() && t.bytes().any(|b| b.is_ascii_digit()))
}

/// Whether a plain scalar is a string to a YAML decoder (envoyproxy/ratelimit's yaml.v2
/// makes `0.25`, `10`, `true` or `null` numbers, booleans and nil, refused as keys).
fn is_yaml_string(s: &str) -> bool {
    let number = s.parse::<f64>().is_ok() && s.bytes().any(|b| b.is_ascii_digit());
    let other = matches!(
        s,
        "true"
            | "True"
            | "TRUE"
            | "false"
            | "False"
            | "FALSE"
            | "~"
            | "null"
            | "Null"
            | "NULL"
            | ""
    );
    !(number || other)
}

/// Whether `kind` reads [`Limit::burst`] (the window algorithms count per window only).
fn reads_burst(kind: AlgorithmKind) -> bool {
    matches!(
        kind,
        AlgorithmKind::LeakyBucket
            | AlgorithmKind::TokenBucket
            | AlgorithmKind::Gcra
            | AlgorithmKind::WarmUp
    )
}

pub(super) fn parse_file(file: &Path, text: &str) -> Result<Domain, ConfigError> {
    let p = FileParser { file };
    let mut loader: YamlLoader<'_, Yaml<'_>> = YamlLoader::default();
    // Keep scalars as written: `value: 010` is the string "010", not the number 8.
    loader.early_parse(false);
    let mut parser = Parser::new_from_str(text);
    let scan = parser
        .load(&mut loader, true)
        .err()
        .or_else(|| loader.error().cloned());
    if let Some(e) = scan {
        return Err(p.err_at(*e.marker(), ConfigErrorKind::Yaml(e.info().to_string())));
    }
    let docs = loader.into_documents();
    match docs.as_slice() {
        [] => Err(ConfigError {
            file: file.to_path_buf(),
            line: None,
            column: None,
            kind: ConfigErrorKind::EmptyDomain,
        }),
        [doc] => {
            p.validate_keys(doc)?;
            p.domain(doc)
        }
        [_, second, ..] => Err(p.err(second, ConfigErrorKind::MultipleDocuments)),
    }
}
