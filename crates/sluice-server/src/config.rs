//! Configuration: envoyproxy/ratelimit's YAML files, read unchanged, plus Sluice's own
//! per-rule fields (`algorithm`, `burst`, `coordination`, `leases`).
//!
//! A configuration is a set of *domains*; each domain is a tree of descriptors (`key`, an
//! optional `value`, an optional `rate_limit`, nested `descriptors`). Every error found while
//! loading names the file, the line and column, and the reason; loading is all or nothing, so
//! a caller that reloads keeps its old [`Config`] when the new files are refused.

use std::collections::HashMap;
use std::collections::hash_map::Entry as MapEntry;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sluice_coord::allocation::AllocationPolicy;
use sluice_limits::{AlgorithmKind, Limit, Nanos};

mod parse;
mod tree;

use parse::parse_file;
pub(crate) use tree::Level;

/// The maps of the descriptor tree, read on every request: a fast hash (keys are set by
/// the operator's files, not by clients, so flooding them is not a concern).
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The unit of a `rate_limit`, as in envoyproxy/ratelimit (names are case-insensitive).
///
/// Windows of unit `u` are `[k·u, (k+1)·u)` seconds since the unix epoch; a month is 30 days
/// and a year 365 days, as in envoyproxy/ratelimit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3 600 seconds.
    Hour,
    /// 86 400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Self::Second,
        Self::Minute,
        Self::Hour,
        Self::Day,
        Self::Week,
        Self::Month,
        Self::Year,
    ];

    /// The unit's name as written in a configuration file.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Second => "second",
            Self::Minute => "minute",
            Self::Hour => "hour",
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
            Self::Year => "year",
        }
    }

    /// Length in seconds.
    #[must_use]
    pub fn seconds(self) -> u64 {
        match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3_600,
            Self::Day => 86_400,
            Self::Week => 7 * 86_400,
            Self::Month => 30 * 86_400,
            Self::Year => 365 * 86_400,
        }
    }

    /// Length in nanoseconds.
    #[must_use]
    pub fn nanos(self) -> Nanos {
        self.seconds() * 1_000_000_000
    }

    /// Parses a unit name, ignoring case (`second`, `MINUTE`, ...).
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(s.trim()))
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Who shares a rule's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Coordination {
    /// Each node applies the whole limit on its own (envoyproxy/ratelimit with a per-node
    /// cache). The default.
    #[default]
    Local,
    /// The nodes of the cluster divide the limit among themselves.
    Cluster,
    /// Every node decides through one Redis (exact or batched, seed 002 §4.3–§4.4), and
    /// decides locally with its share of the limit while Redis does not answer. Without a
    /// Redis attached to the engine the node decides locally with the whole limit.
    Redis,
    /// One Sluice node, the token server, hands out the limit's permits to the others in
    /// leased batches (seed 002 §4.4(3), batched as in §4.4(5)); a configured successor
    /// takes over when it dies, and a node decides locally with its share while no server
    /// answers within the timeout. Without token servers attached to the engine the node
    /// decides locally with the whole limit.
    TokenServer,
}

/// How the nodes of a `coordination: cluster` rule divide its limit (Sluice's `fairness`):
/// the performance measure the share law equalises across them (seed 000 Table 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Fairness {
    /// Max-min (water-filling): every node gets its demand up to one common level, and a
    /// node's demand, however large (a flood, a greedy lease client), never pushes another
    /// below that level. The default.
    #[default]
    MaxMin,
    /// Seed 000 Case I: equal throttled amounts `r − x` (seed 003's spare capacity). A node
    /// whose demand exceeds the others' by more than the limit takes the whole limit.
    Throttled,
    /// Seed 000 Case II: equal throttled fractions `(r − x)/r`: each node gets the same
    /// fraction of its demand.
    Ratio,
}

impl Fairness {
    /// The name as written in a configuration file.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::MaxMin => "max-min",
            Self::Throttled => "throttled",
            Self::Ratio => "ratio",
        }
    }

    /// The measure class of this fairness' keys (`sluice_coord::node::Config::class_measures`).
    #[must_use]
    pub fn class(self) -> u8 {
        match self {
            Self::Throttled => 0,
            Self::MaxMin => 1,
            Self::Ratio => 2,
        }
    }

    /// The cluster key `key` in this fairness' class: every node reads the measure from the
    /// key, so all divide it alike.
    #[must_use]
    pub fn key(self, key: u64) -> u64 {
        sluice_coord::node::Config::key_in_class(key, self.class())
    }

    /// The node's measures of classes 1–3 for keys whose limit is `scale` units (class 0,
    /// `throttled`, is the node's own measure, Case I).
    #[must_use]
    pub fn class_measures(scale: u64) -> [Option<sluice_coord::law::Measure>; 3] {
        use sluice_coord::law::Measure;
        [
            Some(Measure::MaxMin),
            // Demands below 1 % of the limit count as 1 %: the floor the stability bound needs.
            Some(Measure::ThrottledRatio {
                min_demand: scale as f64 / 100.0,
            }),
            None,
        ]
    }
}

impl Coordination {
    /// The name as written in a configuration file.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Cluster => "cluster",
            Self::Redis => "redis",
            Self::TokenServer => "token-server",
        }
    }
}

/// Sluice's per-rule `leases`: how `POST /v1/lease` hands out the rule's capacity to
/// clients that throttle themselves (seed 000 §7). A field left out takes the daemon's
/// setting ([`crate::lease::LeaseConfig`]).
///
/// ```yaml
/// rate_limit:
///   unit: second
///   requests_per_unit: 100
///   leases: { policy: proportional, duration: 10s }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RuleLeases {
    /// `policy`: `max-min` (seed 000 §7 Alg. 2, water-filling) or `proportional` (Alg. 1).
    pub policy: Option<AllocationPolicy>,
    /// `duration`: how long a grant is valid, from [`RuleLeases::MIN_DURATION`] to
    /// [`RuleLeases::MAX_DURATION`] (`500ms`, `10s`, `1m`, ...).
    pub duration: Option<Duration>,
}

impl RuleLeases {
    /// The shortest lease a rule may set: shorter, clients would spend their time refreshing.
    pub const MIN_DURATION: Duration = Duration::from_millis(1);
    /// The longest lease a rule may set: a grant cannot be recalled, so after a share
    /// decreases the excess drains only as old grants expire (within one lease duration).
    pub const MAX_DURATION: Duration = Duration::from_secs(86_400);

    /// Parses a policy name: `max-min` (also `max_min`, `maxmin`) or `proportional`,
    /// ignoring case.
    #[must_use]
    pub fn parse_policy(text: &str) -> Option<AllocationPolicy> {
        match text.trim().to_ascii_lowercase().as_str() {
            "max-min" | "max_min" | "maxmin" => Some(AllocationPolicy::MaxMin),
            "proportional" => Some(AllocationPolicy::Proportional),
            _ => None,
        }
    }

    /// A policy's name as written in a configuration file (and in `POST /v1/lease`'s answer).
    #[must_use]
    pub fn policy_name(policy: AllocationPolicy) -> &'static str {
        match policy {
            AllocationPolicy::MaxMin => "max-min",
            AllocationPolicy::Proportional => "proportional",
        }
    }
}

/// A limit as the Envoy RLS v3 response reports it (`current_limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateLimit {
    /// Requests admitted per unit (0: every request is over the limit).
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
}

/// A rule that limits (`rate_limit` with a `unit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limited {
    /// The rate, as configured and as reported.
    pub rate: RateLimit,
    /// The algorithm deciding (Sluice's `algorithm`; default `fixed-window`, aligned to the
    /// unix epoch like envoyproxy/ratelimit's windows).
    pub algorithm: AlgorithmKind,
    /// Sluice's `burst` (read by the bucket algorithms; `None`: `requests_per_unit`).
    pub burst: Option<u64>,
    /// Sluice's `coordination`.
    pub coordination: Coordination,
    /// Sluice's `fairness` (how a `cluster` rule's limit is divided).
    pub fairness: Fairness,
    /// The limit handed to the algorithm; `None` when `requests_per_unit` is 0 (a block rule,
    /// envoyproxy/ratelimit's "black list": every request is over the limit).
    pub limit: Option<Limit>,
}

/// What a rule does with the requests it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// `unlimited: true`: always OK, never counted.
    Unlimited,
    /// A limit.
    Limited(Limited),
}

/// A descriptor's `metadata`: a JSON object.
pub type Metadata = serde_json::Map<String, serde_json::Value>;

/// A `rate_limit` block of a descriptor, with the descriptor's flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The descriptor path as envoyproxy/ratelimit names it in its statistics
    /// (`key_value.key2`, without the domain): the rule's name in `/metrics`.
    pub path: String,
    /// `name`, which `replaces` of other rules may name, and which responses report
    /// (`current_limit.name`).
    pub name: Option<std::sync::Arc<str>>,
    /// Names of the rules this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// `shadow_mode`: counted, but always answered OK.
    pub shadow_mode: bool,
    /// `quota_mode` (envoyproxy/ratelimit, 2026): a descriptor over its quota is answered
    /// `OVER_LIMIT`, but refuses the request only when every quota-mode descriptor of the
    /// request is over (see [`crate::engine::overall_code`]).
    pub quota_mode: bool,
    /// `detailed_metric`: the statistics count this rule's hits per runtime value
    /// ([`Lookup::metric_path`]).
    pub detailed_metric: bool,
    /// `metadata`: sent to the client in the response's `dynamic_metadata.metadata` when
    /// the descriptor is under its limit (and upstream's `RESPONSE_DYNAMIC_METADATA` is on).
    pub metadata: Option<std::sync::Arc<Metadata>>,
    /// Unlimited or limited.
    pub policy: Policy,
    /// Sluice's `leases` (client leases on this rule; none set on an unlimited rule).
    pub leases: RuleLeases,
    /// Where the rule's `rate_limit` is written.
    pub location: Location,
}

/// A place in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The file.
    pub file: PathBuf,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file.display(), self.line, self.column)
    }
}

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigErrorKind {
    /// The file or directory could not be read.
    #[error("cannot read: {0}")]
    Io(String),
    /// The YAML itself is malformed.
    #[error("invalid YAML: {0}")]
    Yaml(String),
    /// More than one YAML document in a file.
    #[error("a file holds one domain: found a second YAML document")]
    MultipleDocuments,
    /// A node of the wrong shape.
    #[error("`{field}` must be {expected}")]
    WrongType {
        /// The field (or `file` for the whole document).
        field: String,
        /// What it must be.
        expected: &'static str,
    },
    /// A field this format does not have.
    #[error("unknown field `{field}` (expected one of: {})", allowed.join(", "))]
    UnknownField {
        /// The field found.
        field: String,
        /// The fields allowed at this place.
        allowed: &'static [&'static str],
    },
    /// A mapping key that is not a string (a number, a boolean, null).
    #[error("key is not of type string: {0}")]
    NonStringKey(String),
    /// A required field is missing.
    #[error("missing `{0}`")]
    MissingField(&'static str),
    /// `domain` is empty or missing.
    #[error("the domain must not be empty")]
    EmptyDomain,
    /// Two files configure the same domain.
    #[error("duplicate domain {domain:?} (first defined at {first})")]
    DuplicateDomain {
        /// The domain.
        domain: String,
        /// Where it was first defined.
        first: String,
    },
    /// A descriptor without a key.
    #[error("a descriptor must have a non-empty `key`")]
    EmptyKey,
    /// Two descriptors with the same key and value at one level.
    #[error("duplicate descriptor {0:?} at this level")]
    DuplicateDescriptor(String),
    /// `unit` is not a known unit.
    #[error("unknown unit {0:?} (expected one of: second, minute, hour, day, week, month, year)")]
    BadUnit(String),
    /// `unlimited: true` with a `unit`.
    #[error("an unlimited rule must not have a `unit`")]
    UnitWithUnlimited,
    /// Sluice fields on an unlimited rule.
    #[error("`{0}` has no meaning on an unlimited rule")]
    FieldWithUnlimited(&'static str),
    /// `burst` with an algorithm that does not read it (the window algorithms).
    #[error(
        "`burst` has no effect with algorithm {0} (it applies to leaky-bucket, token-bucket, gcra and warm-up)"
    )]
    BurstUnused(AlgorithmKind),
    /// A number out of range or not a number.
    #[error("`{field}` must be a whole number from {min} to {max} (got {text:?})")]
    BadNumber {
        /// The field.
        field: &'static str,
        /// The text found.
        text: String,
        /// Smallest value allowed.
        min: u64,
        /// Largest value allowed.
        max: u64,
    },
    /// `algorithm` is not one of [`AlgorithmKind::NAMES`].
    #[error("{0}")]
    UnknownAlgorithm(#[from] sluice_limits::UnknownAlgorithm),
    /// `coordination` is not `local`, `cluster`, `redis` or `token-server`.
    #[error("unknown coordination {0:?} (expected local, cluster, redis or token-server)")]
    UnknownCoordination(String),
    /// A coordination Sluice knows of but does not implement yet.
    #[error(
        "coordination {0:?} is not supported yet (expected local, cluster, redis or token-server)"
    )]
    CoordinationNotSupported(String),
    /// `coordination: redis` with a limit the Redis scripts cannot compute exactly in Lua's
    /// doubles.
    #[error("`coordination: redis` cannot run this limit exactly: {0}")]
    RedisRange(String),
    /// A `replaces` entry without a name.
    #[error("a `replaces` entry must have a non-empty `name`")]
    EmptyReplaces,
    /// A rule replacing itself.
    #[error("a rule must not replace itself ({0:?})")]
    ReplacesItself(String),
    /// `leases.policy` is not a known policy.
    #[error("unknown lease policy {0:?} (expected max-min or proportional)")]
    UnknownLeasePolicy(String),
    /// `leases.duration` is not a duration, or out of range.
    #[error("`leases.duration` must be a duration from 1ms to 1d (e.g. 500ms, 10s, 1m), got {0:?}")]
    BadLeaseDuration(String),
    /// `fairness` is not `max-min`, `throttled` or `ratio`.
    #[error("unknown fairness {0:?} (expected max-min, throttled or ratio)")]
    UnknownFairness(String),
    /// `fairness` on a rule that is not `coordination: cluster`.
    #[error(
        "`fairness` divides a cluster rule's limit among the nodes: it has no effect on coordination: {0} rules"
    )]
    FairnessUnused(&'static str),
    /// `leases` on a rule whose coordination cannot be leased.
    #[error("`leases` has no effect on coordination: {0} rules (leases are refused for them)")]
    LeasesUnsupported(&'static str),
    /// `share_threshold: true` on a descriptor whose value has no `*`.
    #[error(
        "share_threshold can only be used with wildcard values (containing '*'), but found key {0:?}"
    )]
    ShareThresholdWithoutWildcard(String),
    /// A rule replacing a name no rule of the domain has.
    #[error("`replaces` names {0:?}, but no rule of this domain has that name")]
    UnknownReplaces(String),
    /// A value envoyproxy/ratelimit's key check cannot walk (its `validateYamlKeys` says
    /// "error checking config"): a number that is not a whole number within 64 bits.
    #[error(
        "`{field}` is {text}: a value must be a string, a whole number, a boolean, a mapping or a list of mappings"
    )]
    UncheckableValue {
        /// The field.
        field: String,
        /// The value as written.
        text: String,
    },
}

/// A refused configuration: where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file (or directory) at fault.
    pub file: PathBuf,
    /// 1-based line, when the fault is at a place in the file.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// The reason (part of this error's message, so not also its `source`: a chain of
    /// causes printed in full says it once).
    pub kind: ConfigErrorKind,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        write!(f, ": {}", self.kind)
    }
}

/// A domain: a tree of descriptors, from one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    name: String,
    location: Location,
    descriptors: Level,
}

impl Domain {
    /// The domain's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the domain is defined.
    #[must_use]
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// Every rule of the domain (in no particular order).
    #[must_use]
    pub fn rules(&self) -> Vec<&Rule> {
        let mut out = Vec::new();
        self.descriptors.rules(&mut out);
        out
    }

    /// The rule governing a descriptor, with envoyproxy/ratelimit's matching: walk the tree
    /// one entry per level, taking at each level the most specific match (exact value, then
    /// wildcard (`*` anywhere in the value), then key only); the rule applies only if it sits at the depth of
    /// the last entry (a descriptor longer or shorter than the configured path gets none —
    /// its README's Example 4).
    #[must_use]
    pub fn rule_for<'e>(
        &self,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    ) -> Option<&Rule> {
        self.walk(entries, |_, _, _, _| {})
    }

    /// [`Domain::rule_for`], with the entries whose values matched a wildcard marked
    /// `share_threshold: true` on the way (at any depth): their counter is the pattern's,
    /// shared by every value it matches, as in envoyproxy/ratelimit.
    #[must_use]
    pub fn lookup<'e>(
        &self,
        entries: impl IntoIterator<Item = (&'e str, &'e str), IntoIter: Clone>,
    ) -> Option<Lookup<'_>> {
        let entries = entries.into_iter();
        let mut shared = Vec::new();
        let mut any_valued = false;
        let rule = self.walk(entries.clone(), |i, _, _, found| {
            if let Some(pattern) = shared_pattern(found) {
                shared.push((i, pattern));
            }
            any_valued |= found.node.value_to_metric;
        })?;
        // The statistics names, built only for a rule that uses one: the same walk again
        // (most rules use neither, and the names cost more than the walk).
        let metric = if rule.detailed_metric || any_valued {
            // The names envoyproxy/ratelimit would use: with every runtime value
            // (`detailed_metric`), and with `value_to_metric`'s runtime values.
            let (mut detailed, mut valued) = (Vec::new(), Vec::new());
            self.walk(entries, |_, key, value, found| {
                let pattern = shared_pattern(found);
                let with = |v: &str| {
                    if v.is_empty() {
                        key.to_owned()
                    } else {
                        format!("{key}_{v}")
                    }
                };
                detailed.push(with(pattern.unwrap_or(value)));
                valued.push(match (found.exact, found.wildcard) {
                    (true, _) => with(value),
                    (false, Some(w)) if pattern.is_some() || !found.node.value_to_metric => with(w),
                    (false, Some(_)) => with(value),
                    (false, None) if found.node.value_to_metric => with(value),
                    (false, None) => key.to_owned(),
                });
            });
            Some(if rule.detailed_metric {
                detailed.join(".")
            } else {
                valued.join(".")
            })
        } else {
            None
        };
        let metric_path = metric.filter(|m| *m != rule.path);
        Some(Lookup {
            rule,
            shared,
            metric_path,
        })
    }

    /// The matching of [`Domain::rule_for`]: `each` sees every entry matched on the way
    /// (index, key, value, match), also when no rule ends the walk.
    fn walk<'c, 'e>(
        &'c self,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
        mut each: impl FnMut(usize, &str, &str, &tree::Found<'c>),
    ) -> Option<&'c Rule> {
        let mut level = &self.descriptors;
        let mut entries = entries.into_iter().enumerate().peekable();
        while let Some((i, (key, value))) = entries.next() {
            let found = level.find(key, value)?;
            each(i, key, value, &found);
            if entries.peek().is_none() {
                return found.node.rule.as_ref();
            }
            level = &found.node.children;
        }
        None
    }
}

/// The pattern an entry is counted under: its wildcard's, when that is `share_threshold`.
fn shared_pattern<'c>(found: &tree::Found<'c>) -> Option<&'c str> {
    found.wildcard.filter(|_| found.node.share_threshold)
}

/// What a descriptor matched ([`Domain::lookup`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup<'c> {
    /// The rule.
    pub rule: &'c Rule,
    /// `(entry index, pattern)` of the entries counted under their `share_threshold`
    /// wildcard's pattern instead of their own value.
    pub shared: Vec<(usize, &'c str)>,
    /// The path the hits are counted under in the statistics when it is not the rule's
    /// ([`Rule::path`]): with the runtime values, for `detailed_metric` (every entry, a
    /// `share_threshold` one by its pattern) or `value_to_metric` (the entries matched by
    /// a wildcard or the key alone under that flag), as envoyproxy/ratelimit names them.
    pub metric_path: Option<String>,
}

/// A loaded, validated configuration: the domains by name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Config {
    domains: Map<String, Domain>,
}

/// The configuration `sluice serve` runs without any file: domain `example`, 10 requests
/// per second per `remote_address`.
pub const EXAMPLE_YAML: &str = "\
# 10 requests per second for each client address.
domain: example
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
";

impl Config {
    /// The built-in example ([`EXAMPLE_YAML`]).
    #[must_use]
    pub fn example() -> Self {
        // The example is a constant checked by the tests; an empty config is the safe
        // fallback should that ever be broken.
        Self::from_yaml("<built-in example>", EXAMPLE_YAML).unwrap_or_default()
    }

    /// Parses one file's contents; `file` names it in errors.
    ///
    /// # Errors
    /// The first problem found, with its line and column.
    pub fn from_yaml(file: impl Into<PathBuf>, text: &str) -> Result<Self, ConfigError> {
        Self::from_files([(file.into(), text)])
    }

    /// Parses several files' contents, each holding one domain.
    ///
    /// # Errors
    /// The first problem found, with its file, line and column; a domain defined twice.
    pub fn from_files<'t>(
        files: impl IntoIterator<Item = (PathBuf, &'t str)>,
    ) -> Result<Self, ConfigError> {
        Self::load_files(files, false)
    }

    /// [`Config::from_files`], except that files of one domain are merged into it, as
    /// envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG=true` does: their top-level descriptors
    /// join the domain's, and one defined twice is a duplicate.
    ///
    /// # Errors
    /// The first problem found, with its file, line and column; a top-level descriptor
    /// defined in two files (at the second file's domain).
    pub fn from_files_merging<'t>(
        files: impl IntoIterator<Item = (PathBuf, &'t str)>,
    ) -> Result<Self, ConfigError> {
        Self::load_files(files, true)
    }

    fn load_files<'t>(
        files: impl IntoIterator<Item = (PathBuf, &'t str)>,
        merge: bool,
    ) -> Result<Self, ConfigError> {
        let mut domains: Map<String, Domain> = Map::default();
        for (file, text) in files {
            let domain = parse_file(&file, text)?;
            match domains.entry(domain.name.clone()) {
                MapEntry::Occupied(mut first) if merge => {
                    let l = domain.location.clone();
                    first
                        .get_mut()
                        .descriptors
                        .merge(domain.descriptors)
                        .map_err(|composite| ConfigError {
                            file: l.file,
                            line: Some(l.line),
                            column: Some(l.column),
                            kind: ConfigErrorKind::DuplicateDescriptor(composite),
                        })?;
                }
                MapEntry::Occupied(first) => {
                    let l = &domain.location;
                    return Err(ConfigError {
                        file: l.file.clone(),
                        line: Some(l.line),
                        column: Some(l.column),
                        kind: ConfigErrorKind::DuplicateDomain {
                            domain: domain.name,
                            first: first.get().location.to_string(),
                        },
                    });
                }
                MapEntry::Vacant(slot) => {
                    slot.insert(domain);
                }
            }
        }
        Ok(Self { domains })
    }

    /// The domain named `name`.
    #[must_use]
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// Every domain (in no particular order).
    pub fn domains(&self) -> impl Iterator<Item = &Domain> {
        self.domains.values()
    }
}

/// Where a configuration comes from: a file, a directory of `*.yaml` / `*.yml` files, or
/// the built-in example. [`ConfigSource::load`] reads it again each time it is called,
/// which is how a reload is done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    /// A path, file or directory (which one is decided at each load).
    Path(PathBuf),
    /// A path whose files may share a domain, merged into one ([`Config::from_files_merging`],
    /// envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG=true`).
    Merged(PathBuf),
    /// [`Config::example`].
    Example,
}

impl ConfigSource {
    /// Reads and validates the whole configuration.
    ///
    /// A directory's files are read in name order, skipping dot files and files whose name
    /// does not end in `.yaml` or `.yml` (envoyproxy/ratelimit reads `*.yaml` in its
    /// runtime directory).
    ///
    /// # Errors
    /// The first problem found: unreadable path or an invalid file (with its line and
    /// column). A directory without any `.yaml` file is a configuration of no domain.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let path = match self {
            Self::Example => return Ok(Config::example()),
            Self::Path(p) | Self::Merged(p) => p,
        };
        let io = |file: &Path, e: std::io::Error| ConfigError {
            file: file.to_path_buf(),
            line: None,
            column: None,
            kind: ConfigErrorKind::Io(e.to_string()),
        };
        let meta = std::fs::metadata(path).map_err(|e| io(path, e))?;
        let files: Vec<PathBuf> = if meta.is_dir() {
            let mut files = Vec::new();
            for entry in std::fs::read_dir(path).map_err(|e| io(path, e))? {
                let p = entry.map_err(|e| io(path, e))?.path();
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
                if yaml && !name.starts_with('.') && p.is_file() {
                    files.push(p);
                }
            }
            // No file: no domain, as envoyproxy/ratelimit serves an empty runtime directory
            // (every request is then answered OK without a limit).
            files.sort();
            files
        } else {
            vec![path.clone()]
        };
        let mut texts = Vec::with_capacity(files.len());
        for f in files {
            let text = std::fs::read_to_string(&f).map_err(|e| io(&f, e))?;
            texts.push((f, text));
        }
        let texts = texts.iter().map(|(f, t)| (f.clone(), t.as_str()));
        match self {
            Self::Merged(_) => Config::from_files_merging(texts),
            _ => Config::from_files(texts),
        }
    }

    /// The file or directory read, if any.
    #[must_use]
    pub fn path(&self) -> Option<&Path> {
        match self {
            Self::Path(p) | Self::Merged(p) => Some(p),
            Self::Example => None,
        }
    }

    /// Loads the configuration again: `Ok` with the new one, or the error — in which case
    /// the caller keeps `current` in force, untouched.
    ///
    /// # Errors
    /// As [`ConfigSource::load`].
    pub fn reload(&self, current: &mut Config) -> Result<(), ConfigError> {
        *current = self.load()?;
        Ok(())
    }
}
