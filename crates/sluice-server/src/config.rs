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

use saphyr::{MarkedYaml, ScalarStyle, YamlData, YamlLoader};
use saphyr_parser::{Marker, Parser};
use sluice_coord::allocation::AllocationPolicy;
use sluice_limits::{AlgorithmKind, Limit, Nanos};

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

/// A `rate_limit` block of a descriptor, with the descriptor's flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The descriptor path as envoyproxy/ratelimit names it in its statistics
    /// (`key_value.key2`, without the domain): the rule's name in `/metrics`.
    pub path: String,
    /// `name`, which `replaces` of other rules may name.
    pub name: Option<String>,
    /// Names of the rules this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// `shadow_mode`: counted, but always answered OK.
    pub shadow_mode: bool,
    /// `detailed_metric` (statistics only; read and kept for the metrics layer).
    pub detailed_metric: bool,
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
    /// A directory holds no `.yaml` / `.yml` file.
    #[error("no .yaml or .yml file in this directory")]
    NoFiles,
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
    /// A required field is missing.
    #[error("missing `{0}`")]
    MissingField(&'static str),
    /// `domain` is empty.
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
    /// `leases` on a rule whose coordination cannot be leased.
    #[error("`leases` has no effect on coordination: {0} rules (leases are refused for them)")]
    LeasesUnsupported(&'static str),
    /// A rule replacing a name no rule of the domain has.
    #[error("`replaces` names {0:?}, but no rule of this domain has that name")]
    UnknownReplaces(String),
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
    /// The reason.
    #[source]
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

/// One level of the descriptor tree: the descriptors sharing a parent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Level {
    by_key: Map<String, KeyNodes>,
}

/// The descriptors of one level with a given key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct KeyNodes {
    /// `value: v` (exact).
    exact: Map<String, Node>,
    /// `value: prefix*`, in file order (the first that matches wins).
    wildcard: Vec<(String, Node)>,
    /// No value: one limit per runtime value.
    any: Option<Node>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Node {
    rule: Option<Rule>,
    children: Level,
}

impl Level {
    /// The most specific node for `key = value`: exact value, then the first matching
    /// wildcard, then key only (envoyproxy/ratelimit's order).
    fn find(&self, key: &str, value: &str) -> Option<&Node> {
        let nodes = self.by_key.get(key)?;
        nodes
            .exact
            .get(value)
            .or_else(|| {
                nodes
                    .wildcard
                    .iter()
                    .find(|(prefix, _)| value.starts_with(prefix.as_str()))
                    .map(|(_, n)| n)
            })
            .or(nodes.any.as_ref())
    }

    fn rules<'a>(&'a self, out: &mut Vec<&'a Rule>) {
        for nodes in self.by_key.values() {
            let all = nodes
                .exact
                .values()
                .chain(nodes.wildcard.iter().map(|(_, n)| n))
                .chain(nodes.any.as_ref());
            for node in all {
                out.extend(node.rule.as_ref());
                node.children.rules(out);
            }
        }
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
    /// wildcard `prefix*`, then key only); the rule applies only if it sits at the depth of
    /// the last entry (a descriptor longer or shorter than the configured path gets none —
    /// its README's Example 4).
    #[must_use]
    pub fn rule_for<'e>(
        &self,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    ) -> Option<&Rule> {
        let mut level = &self.descriptors;
        let mut entries = entries.into_iter().peekable();
        while let Some((key, value)) = entries.next() {
            let node = level.find(key, value)?;
            if entries.peek().is_none() {
                return node.rule.as_ref();
            }
            level = &node.children;
        }
        None
    }
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
        let mut domains: Map<String, Domain> = Map::default();
        for (file, text) in files {
            let domain = parse_file(&file, text)?;
            match domains.entry(domain.name.clone()) {
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
    /// The first problem found: unreadable path, empty directory, or an invalid file (with
    /// its line and column).
    pub fn load(&self) -> Result<Config, ConfigError> {
        let path = match self {
            Self::Example => return Ok(Config::example()),
            Self::Path(p) => p,
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
            files.sort();
            if files.is_empty() {
                return Err(ConfigError {
                    file: path.clone(),
                    line: None,
                    column: None,
                    kind: ConfigErrorKind::NoFiles,
                });
            }
            files
        } else {
            vec![path.clone()]
        };
        let mut texts = Vec::with_capacity(files.len());
        for f in files {
            let text = std::fs::read_to_string(&f).map_err(|e| io(&f, e))?;
            texts.push((f, text));
        }
        Config::from_files(texts.iter().map(|(f, t)| (f.clone(), t.as_str())))
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

// ---- parsing ----------------------------------------------------------------------------

const ROOT_FIELDS: &[&str] = &["domain", "descriptors"];
const DESCRIPTOR_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
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
    "leases",
];
const LEASES_FIELDS: &[&str] = &["policy", "duration"];
const REPLACES_FIELDS: &[&str] = &["name"];

type Yaml<'i> = MarkedYaml<'i>;

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

    /// The fields of a mapping, each checked against `allowed`.
    fn fields<'n, 'i>(
        &self,
        node: &'n Yaml<'i>,
        what: &str,
        allowed: &'static [&'static str],
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
                YamlData::Representation(s, _, _) => s.as_ref(),
                _ => "<not a string>",
            };
            if !allowed.contains(&name) {
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
        for (field, v) in self.fields(doc, "file", ROOT_FIELDS)? {
            match field {
                "domain" => name = Some((self.string(v, field)?.unwrap_or_default(), v)),
                _ => self.level(v, "", &mut descriptors)?,
            }
        }
        let Some((name, node)) = name else {
            return Err(self.err(doc, ConfigErrorKind::MissingField("domain")));
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
        let mut shadow_mode = false;
        let mut detailed_metric = false;
        for (field, v) in self.fields(node, "descriptor", DESCRIPTOR_FIELDS)? {
            match field {
                "key" => key = self.string(v, field)?,
                "value" => value = self.string(v, field)?,
                "rate_limit" => rate_limit = Some(v),
                "descriptors" => children = Some(v),
                "shadow_mode" => shadow_mode = self.boolean(v, field)?,
                _ => detailed_metric = self.boolean(v, field)?,
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
        let rule = match rate_limit {
            Some(rl) => Some(self.rule(rl, &composite, shadow_mode, detailed_metric)?),
            None => None,
        };
        let mut node_out = Node {
            rule,
            children: Level::default(),
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
            Some(v) => match v.strip_suffix('*') {
                Some(prefix) => {
                    if nodes.wildcard.iter().any(|(p, _)| p == prefix) {
                        return Err(duplicate());
                    }
                    nodes.wildcard.push((prefix.to_string(), node_out));
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
        shadow_mode: bool,
        detailed_metric: bool,
    ) -> Result<Rule, ConfigError> {
        let mut unit = None;
        let mut rpu = None;
        let mut unlimited = false;
        let mut name = None;
        let mut replaces = Vec::new();
        let mut algorithm = None;
        let mut burst = None;
        let mut coordination = None;
        let mut leases_node = None;
        for (field, v) in self.fields(node, "rate_limit", RATE_LIMIT_FIELDS)? {
            match field {
                "unit" => unit = self.string(v, field)?.map(|u| (u, v)),
                "requests_per_unit" => rpu = Some(v),
                "unlimited" => unlimited = self.boolean(v, field)?,
                "name" => name = self.string(v, field)?.filter(|n| !n.is_empty()),
                "replaces" => {
                    for item in self.sequence(v, field)? {
                        let mut n = None;
                        for (_, nv) in self.fields(item, "replaces entry", REPLACES_FIELDS)? {
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
                _ => coordination = Some(v),
            }
        }
        if let Some(n) = &name
            && replaces.contains(n)
        {
            return Err(self.err(node, ConfigErrorKind::ReplacesItself(n.clone())));
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
                limit,
            })
        };
        Ok(Rule {
            path: path.to_owned(),
            name,
            replaces,
            shadow_mode,
            detailed_metric,
            policy,
            leases,
            location: self.location(node),
        })
    }

    /// A rule's `leases` mapping: `policy` and `duration`, both optional.
    fn leases(&self, node: &Yaml<'_>) -> Result<RuleLeases, ConfigError> {
        let mut out = RuleLeases::default();
        for (field, v) in self.fields(node, "leases", LEASES_FIELDS)? {
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

fn parse_file(file: &Path, text: &str) -> Result<Domain, ConfigError> {
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
            kind: ConfigErrorKind::MissingField("domain"),
        }),
        [doc] => p.domain(doc),
        [_, second, ..] => Err(p.err(second, ConfigErrorKind::MultipleDocuments)),
    }
}
