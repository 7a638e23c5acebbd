//! Prometheus metrics of a node (`GET /metrics`), in the OpenMetrics text format of the
//! `prometheus-client` crate.
//!
//! Two kinds of series:
//! - **kept here**, by the shells (HTTP and gRPC) around each engine call: the decision
//!   latency histogram and the requests answered per API and answer;
//! - **collected at scrape time** from the engine and the cluster driver, so the hot path pays
//!   nothing for them: per-rule decisions and hits (the engine's [`StatsRegistry`] counters,
//!   named after envoyproxy/ratelimit's `total_hits` / `over_limit` / `within_limit` /
//!   `shadow_mode` statistics), the number of keys with state, this node's share of every
//!   cluster key, link states, the lease and the peer transport's counters
//!   ([`ClusterStatus`]; a node without a cluster reports [`ClusterStatus::single`]).
//!
//! | series | type | labels |
//! |---|---|---|
//! | `sluice_decision_duration_seconds` | histogram | `api` |
//! | `sluice_requests_total` | counter | `api`, `answer` (`ok`, `over_limit`, `invalid`) |
//! | `sluice_rule_decisions_total` | counter | `domain`, `rule`, `code` (`ok`, `over_limit`) |
//! | `sluice_rule_shadow_decisions_total` | counter | `domain`, `rule` |
//! | `sluice_rule_hits_total` | counter | `domain`, `rule`, `outcome` (`within_limit`, `over_limit`, `shadow_mode`) |
//! | `ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,within_limit,shadow_mode}` | gauge (only grows) | `domain`, `key1`, `key2` (envoyproxy/ratelimit's names, from its statsd exporter mapping) |
//! | `ratelimit_service_global_shadow_mode` | gauge (only grows) | (envoyproxy/ratelimit's `global_shadow_mode`: requests `SHADOW_MODE` answered `OK` instead of `OVER_LIMIT`) |
//! | `sluice_engine_keys`, `sluice_engine_max_keys` | gauge | |
//! | `sluice_engine_evictions_total` | counter | `reason` (`idle`, `forced`) |
//! | `sluice_cluster_lifecycle`, `sluice_cluster_lease` | gauge (state set: 1 for the current state) | `state` |
//! | `sluice_cluster_link` | gauge (state set) | `peer`, `state` (`up`, `suspect`, `down`) |
//! | `sluice_cluster_peer_wire_version` | gauge | `peer` |
//! | `sluice_cluster_share`, `sluice_cluster_limit`, `sluice_cluster_demand` | gauge | `key`, `domain`, `rule` |
//! | `sluice_cluster_default_share`, `sluice_cluster_gamma`, `sluice_cluster_cycle_seconds`, `sluice_cluster_dead_floors`, `sluice_cluster_pending_votes`, `sluice_cluster_quarantine_seconds`, `sluice_cluster_audit_minted_share` | gauge | |
//! | `sluice_cluster_audit_rounds_total`, `sluice_cluster_incarnation_conflicts_total`, `sluice_cluster_node_id_redraws_total` | counter | (the second: dead floors heard above this node's own incarnation: another process with its id, or an incarnation that went backwards; the third: random node ids given up because another process drew the same one) |
//! | `sluice_cluster_keys`, `sluice_cluster_max_keys` | gauge | (keys with coordinated state, and the cap: docs/PROTOCOL.md "Many keys") |
//! | `sluice_cluster_keys_refused_total`, `sluice_cluster_keys_evicted_total`, `sluice_cluster_keys_over_cap_total` | counter | (refused coordination at the cap; idle keys retired early at the cap; keys given state beyond the cap because an entry held capacity) |
//! | `sluice_peer_messages_total`, `sluice_peer_bytes_total` | counter | `direction` (`sent`, `received`) |
//! | `sluice_peer_rejected_total` | counter | `reason` (`unauthenticated`, `malformed`, `version`, `membership`) |
//! | `sluice_cluster_membership_changes_total` | counter | `change` (`join`, `leave`, `fence`, `refused`) |
//! | `sluice_cluster_voters`, `sluice_cluster_members`, `sluice_cluster_discovery_candidates` | gauge | |
//! | `sluice_peer_directories_total` | counter | `direction` (`sent`, `received`) |
//! | `sluice_cluster_peers_unresolved` | gauge | |
//! | `sluice_peer_unaddressed_total` | counter | |
//! | `sluice_peer_oversized_total` | counter | |
//! | `sluice_config_reloads_total` | counter | `result` (`ok`, `refused`: the configuration in force stayed) |
//!
//! The shares are this node's part of each key's global limit: they add up to at most 1
//! across the cluster (seed 003 §IV conservation), which is what a dashboard summing
//! `sluice_cluster_share` by `key` over all nodes shows. `domain` and `rule` name the rule a
//! key falls under as the `sluice_rule_*` series do (`rule` is the descriptor path); both are
//! empty for a key this node has only heard of from its peers.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::engine::{Code, Engine};
use crate::stats::StatsRegistry;
mod central;
mod membership;

use crate::status::{ClusterInfo, ClusterStatus};

/// The API a decision came through (the `api` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    /// Envoy RLS v3 over gRPC.
    Grpc,
    /// `POST /json` (envoyproxy/ratelimit's HTTP form).
    Json,
    /// The plain check (`/v1/check/...`): consumes.
    Check,
    /// The plain check that does not consume (`/v1/peek/...`).
    Peek,
}

impl Api {
    const ALL: [Self; 4] = [Self::Grpc, Self::Json, Self::Check, Self::Peek];

    /// The label value.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::Json => "json",
            Self::Check => "check",
            Self::Peek => "peek",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// How a request was answered (the `answer` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    /// `OK`.
    Ok,
    /// `OVER_LIMIT`.
    OverLimit,
    /// Refused before or by the engine (malformed, empty domain, ...): nothing counted.
    Invalid,
}

impl Answer {
    const ALL: [Self; 3] = [Self::Ok, Self::OverLimit, Self::Invalid];

    /// The label value.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::OverLimit => "over_limit",
            Self::Invalid => "invalid",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl From<Code> for Answer {
    fn from(code: Code) -> Self {
        match code {
            Code::Ok => Self::Ok,
            Code::OverLimit => Self::OverLimit,
        }
    }
}

/// Bucket bounds of the latency histogram: 125 ns to about 1 s, doubling. An engine
/// decision takes 0.2–0.6 µs at the median and p99 (docs/BENCHMARKS.md), so the sub-µs
/// buckets are where a target of 1 µs is read; the upper buckets catch lock contention and
/// a stalled runtime.
fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(125e-9, 2.0, 24)
}

type Labels = [(&'static str, &'static str); 1];
type Labels2 = [(&'static str, &'static str); 2];

/// The node's metrics registry. Cheap to record into from many threads (the latency
/// histograms and counters are resolved once, at construction, so recording is a lock-free
/// counter increment plus the histogram's own short lock).
pub struct Metrics {
    registry: Registry,
    /// The latency histograms alone (the same ones as in `registry`), so they can be read
    /// without collecting every other series ([`Metrics::decision_histogram`]).
    latency_registry: Registry,
    latency: [Histogram; 4],
    requests: [[Counter; 3]; 4],
    /// Configuration reloads: applied, refused.
    reloads: [Counter; 2],
    /// Requests global shadow mode answered `OK` instead of `OVER_LIMIT`.
    global_shadow_mode: Gauge,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Metrics of `engine`'s decisions and, if given, of `cluster` (else a node alone).
    #[must_use]
    pub fn new(engine: Arc<Engine>, cluster: Option<Arc<dyn ClusterInfo>>) -> Self {
        let mut registry = Registry::default();

        let latency_family =
            Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(|| {
                Histogram::new(latency_buckets())
            });
        let latency =
            Api::ALL.map(|api| latency_family.get_or_create_owned(&[("api", api.name())]));
        let mut latency_registry = Registry::default();
        for r in [&mut registry, &mut latency_registry] {
            // A family's clones share its histograms.
            r.register_with_unit(
                "sluice_decision_duration",
                "Time the engine took to decide one request, by API",
                Unit::Seconds,
                latency_family.clone(),
            );
        }

        let requests_family = Family::<Labels2, Counter>::default();
        let requests = Api::ALL.map(|api| {
            Answer::ALL.map(|answer| {
                requests_family
                    .get_or_create_owned(&[("api", api.name()), ("answer", answer.name())])
            })
        });
        registry.register(
            "sluice_requests",
            "Rate limit requests answered, by API and answer",
            requests_family,
        );

        let reloads_family = Family::<Labels, Counter>::default();
        let reloads =
            ["ok", "refused"].map(|r| reloads_family.get_or_create_owned(&[("result", r)]));
        registry.register(
            "sluice_config_reloads",
            "Changed configuration files seen by the watcher, by result (refused: invalid, the \
             configuration in force stayed)",
            reloads_family,
        );

        // envoyproxy/ratelimit's `ratelimit.service.global_shadow_mode` counter, named as its
        // statsd exporter names an unmapped statistic. A gauge, so the name is exactly
        // upstream's (OpenMetrics would end a counter's name in `_total`); it only grows.
        let global_shadow_mode = Gauge::default();
        registry.register(
            "ratelimit_service_global_shadow_mode",
            "Requests over the limit answered OK by global shadow mode (SHADOW_MODE; \
             envoyproxy/ratelimit's name; only grows)",
            global_shadow_mode.clone(),
        );

        registry.register_collector(Box::new(Scraped { engine, cluster }));
        Self {
            registry,
            latency_registry,
            latency,
            requests,
            reloads,
            global_shadow_mode,
        }
    }

    /// The decision latency histogram of `api` as `/metrics` shows it now, read in process
    /// (no scrape that can fail or time out).
    ///
    /// # Errors
    /// Only if formatting fails (it writes into a `String`, so in practice never).
    pub fn decision_histogram(&self, api: Api) -> Result<DecisionHistogram, fmt::Error> {
        // `prometheus-client` shows a histogram's buckets only through its encoder.
        let mut out = String::with_capacity(2048);
        prometheus_client::encoding::text::encode(&mut out, &self.latency_registry)?;
        Ok(DecisionHistogram::parse(&out, api))
    }

    /// Records one reload of changed configuration files: applied (`ok`) or refused.
    pub fn record_reload(&self, ok: bool) {
        self.reloads[usize::from(!ok)].inc();
    }

    /// Records one request that global shadow mode answered `OK` instead of `OVER_LIMIT`
    /// (envoyproxy/ratelimit's `global_shadow_mode` statistic).
    pub fn record_global_shadow_mode(&self) {
        self.global_shadow_mode.inc();
    }

    /// Records one request through `api`: how it was answered and, when the engine decided
    /// it, how long the engine took.
    pub fn record(&self, api: Api, answer: Answer, decision_time: Option<Duration>) {
        self.requests[api.index()][answer.index()].inc();
        if let Some(t) = decision_time {
            self.latency[api.index()].observe(t.as_secs_f64());
        }
    }

    /// The OpenMetrics text exposition of every series.
    ///
    /// # Errors
    /// Only if formatting fails (it writes into a `String`, so in practice never).
    pub fn encode(&self) -> Result<String, fmt::Error> {
        let mut out = String::with_capacity(4096);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// The `Content-Type` of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `sluice_decision_duration_seconds` histogram of one API read back from an exposition
/// ([`Metrics::encode`], a node's `/metrics`): what `sluice demo` reports as the decision
/// latency, the time inside the server, without the transport.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DecisionHistogram {
    /// `(upper bound in seconds, cumulative count)`, ascending; the last bound is +∞.
    pub buckets: Vec<(f64, u64)>,
}

impl DecisionHistogram {
    /// The histogram of `api` in `exposition` (empty if it has none).
    #[must_use]
    pub fn parse(exposition: &str, api: Api) -> Self {
        let want = format!("api=\"{}\"", api.name());
        let mut buckets: Vec<(f64, u64)> = exposition
            .lines()
            .filter_map(|line| {
                let rest = line.strip_prefix("sluice_decision_duration_seconds_bucket{")?;
                let (labels, value) = rest.split_once('}')?;
                if !labels.split(',').any(|l| l == want) {
                    return None;
                }
                let le = labels.split(',').find_map(|l| l.strip_prefix("le=\""))?;
                let le = le.strip_suffix('"')?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                let count: f64 = value.split_whitespace().next()?.parse().ok()?;
                // Counts are whole numbers, written as such.
                Some((le, count as u64))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Self { buckets }
    }

    /// Adds `other`'s counts (another node's histogram of the same bounds).
    pub fn merge(&mut self, other: &Self) {
        if self.buckets.is_empty() {
            self.buckets.clone_from(&other.buckets);
            return;
        }
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            mine.1 += theirs.1;
        }
    }

    /// What was observed after `earlier` (an earlier read of the same histogram).
    #[must_use]
    pub fn since(&self, earlier: &Self) -> Self {
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, &(le, c))| {
                (
                    le,
                    c.saturating_sub(earlier.buckets.get(i).map_or(0, |b| b.1)),
                )
            })
            .collect();
        Self { buckets }
    }

    /// Observations.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.buckets.last().map_or(0, |b| b.1)
    }

    /// The `q`-quantile in seconds, interpolated linearly within its bucket as Prometheus'
    /// `histogram_quantile` does: the buckets double, so it is right to within a factor of
    /// 2. `None` without observations.
    #[must_use]
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total as f64;
        let (mut below, mut below_count) = (0.0, 0u64);
        for &(le, c) in &self.buckets {
            if c as f64 >= rank && c > below_count {
                if le.is_infinite() {
                    // Above the last bound: its value is unknown, the bound is what is known.
                    return Some(below);
                }
                let within = (rank - below_count as f64) / (c - below_count) as f64;
                return Some(below + (le - below) * within.clamp(0.0, 1.0));
            }
            (below, below_count) = (le, c);
        }
        Some(below)
    }
}

/// The series computed at scrape time.
#[derive(Debug)]
struct Scraped {
    engine: Arc<Engine>,
    cluster: Option<Arc<dyn ClusterInfo>>,
}

impl Collector for Scraped {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        encode_rules(&mut encoder, self.engine.stats())?;
        gauge(
            &mut encoder,
            "sluice_engine_keys",
            "Keys with rate limit state on this node",
            self.engine.len(),
        )?;
        if let Some(max) = self.engine.max_keys() {
            gauge(
                &mut encoder,
                "sluice_engine_max_keys",
                "Most keys held per algorithm (--max-keys)",
                max,
            )?;
        }
        let e = self.engine.evictions();
        let counter = ConstCounter::new(0u64);
        let mut m = encoder.encode_descriptor(
            "sluice_engine_evictions",
            "Keys evicted at the cap: idle ones (their state was a fresh key's, no decision \
             changed), and forced ones (in use, least recently used first; each may admit \
             one more burst)",
            None,
            counter.metric_type(),
        )?;
        for (reason, v) in [("idle", e.idle), ("forced", e.forced)] {
            ConstCounter::new(v).encode(m.encode_family(&[("reason", reason)])?)?;
        }
        if let Some(c) = self.engine.central_status() {
            // `coordination: redis` rules: is Redis deciding, or this node's fallback share?
            let fallback = matches!(c.mode, crate::central::CentralMode::Fallback);
            gauge(
                &mut encoder,
                "sluice_redis_fallback",
                "1 while Redis rules are decided locally with this node's share (Redis did not \
                 answer within the timeout), 0 while Redis decides",
                i64::from(fallback),
            )?;
            gauge(
                &mut encoder,
                "sluice_redis_transitions",
                "Changes between Redis and the local fallback since start",
                i64::try_from(c.transitions).unwrap_or(i64::MAX),
            )?;
            gauge(
                &mut encoder,
                "sluice_redis_decisions_central",
                "Decisions of Redis rules made by Redis (or from a batch taken from it)",
                i64::try_from(c.decisions_central).unwrap_or(i64::MAX),
            )?;
            gauge(
                &mut encoder,
                "sluice_redis_decisions_local",
                "Decisions of Redis rules made locally (fallback)",
                i64::try_from(c.decisions_local).unwrap_or(i64::MAX),
            )?;
        }
        central::encode_token(&mut encoder, &self.engine)?;
        central::encode_token_server(&mut encoder, &self.engine)?;
        let status = self
            .cluster
            .as_ref()
            .map_or_else(ClusterStatus::single, |c| {
                c.status(crate::status::LISTED_KEYS)
            });
        encode_cluster(&mut encoder, &status)
    }
}

fn encode_rules(encoder: &mut DescriptorEncoder<'_>, stats: &StatsRegistry) -> fmt::Result {
    let rules = stats.snapshot();
    {
        let counter = ConstCounter::new(0u64);
        let mut m = encoder.encode_descriptor(
            "sluice_rule_decisions",
            "Descriptor decisions per configured rule, by answered code (shadowed ones are ok)",
            None,
            counter.metric_type(),
        )?;
        for (domain, rule, c) in &rules {
            for (code, v) in [
                ("ok", c.decisions_ok),
                ("over_limit", c.decisions_over_limit),
            ] {
                let labels = [
                    ("domain", domain.as_str()),
                    ("rule", rule.as_str()),
                    ("code", code),
                ];
                ConstCounter::new(v).encode(m.encode_family(&labels)?)?;
            }
        }
    }
    {
        let counter = ConstCounter::new(0u64);
        let mut m = encoder.encode_descriptor(
            "sluice_rule_shadow_decisions",
            "Descriptor decisions over the limit answered ok because the rule is in shadow mode \
             (also counted in sluice_rule_decisions{code=\"ok\"})",
            None,
            counter.metric_type(),
        )?;
        for (domain, rule, c) in &rules {
            let labels = [("domain", domain.as_str()), ("rule", rule.as_str())];
            ConstCounter::new(c.decisions_shadow).encode(m.encode_family(&labels)?)?;
        }
    }
    let counter = ConstCounter::new(0u64);
    let mut m = encoder.encode_descriptor(
        "sluice_rule_hits",
        "Hits (hits_addend) per configured rule, by outcome, as envoyproxy/ratelimit's \
         within_limit, over_limit and shadow_mode statistics (their sum is its total_hits)",
        None,
        counter.metric_type(),
    )?;
    for (domain, rule, c) in &rules {
        for (outcome, v) in [
            ("within_limit", c.within_limit),
            ("over_limit", c.over_limit),
            ("shadow_mode", c.shadow_mode),
        ] {
            let labels = [
                ("domain", domain.as_str()),
                ("rule", rule.as_str()),
                ("outcome", outcome),
            ];
            ConstCounter::new(v).encode(m.encode_family(&labels)?)?;
        }
    }
    encode_upstream_rules(encoder, &rules)
}

/// The per-rule statistics under envoyproxy/ratelimit's own Prometheus names (its statsd
/// exporter mapping, `src/prometheusstats/default_mapper.yaml`), so its dashboards and
/// alerts keep working: `ratelimit_service_rate_limit_<stat>{domain, key1[, key2]}`, `key1`
/// the rule path's first level (`key` or `key_value`), `key2` the rest.
fn encode_upstream_rules(
    encoder: &mut DescriptorEncoder<'_>,
    rules: &[(String, String, crate::stats::RuleCounts)],
) -> fmt::Result {
    type Stat = fn(&crate::stats::RuleCounts) -> u64;
    let stats: [(&str, &str, Stat); 5] = [
        ("total_hits", "Hits of the rule (hits_addend)", |c| {
            c.total_hits
        }),
        ("over_limit", "Hits over the limit", |c| c.over_limit),
        (
            "near_limit",
            "Hits admitted above 80 % of the limit (fixed windows)",
            |c| c.near_limit,
        ),
        ("within_limit", "Hits within the limit", |c| c.within_limit),
        (
            "shadow_mode",
            "Hits over the limit answered OK (shadow mode)",
            |c| c.shadow_mode,
        ),
    ];
    for (stat, help, value) in stats {
        // Gauges, so the names are exactly upstream's: OpenMetrics would end a counter's
        // name in `_total`. The values only ever grow, as counters do.
        let gauge = ConstGauge::new(0i64);
        let (name, help) = (
            format!("ratelimit_service_rate_limit_{stat}"),
            format!("{help} (envoyproxy/ratelimit's name; only grows)"),
        );
        let mut m = encoder.encode_descriptor(&name, &help, None, gauge.metric_type())?;
        for (domain, rule, c) in rules {
            let (key1, key2) = rule.split_once('.').unwrap_or((rule.as_str(), ""));
            let mut labels = vec![("domain", domain.as_str()), ("key1", key1)];
            if !key2.is_empty() {
                labels.push(("key2", key2));
            }
            let v = i64::try_from(value(c)).unwrap_or(i64::MAX);
            ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

fn gauge<V: prometheus_client::encoding::EncodeGaugeValue + Copy>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    v: V,
) -> fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

/// A state set as gauges: 1 for `current`, 0 for the other `states` (and for `current` too
/// if it is not one of them, it is added so an unexpected state is still visible).
fn state_set(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    extra: Option<(&'static str, &str)>,
    states: &[&str],
    current: &str,
) -> fmt::Result {
    let g = ConstGauge::new(0i64);
    let mut m = encoder.encode_descriptor(name, help, None, g.metric_type())?;
    state_samples(&mut m, extra, states, current)
}

fn state_samples(
    m: &mut prometheus_client::encoding::MetricEncoder<'_>,
    extra: Option<(&'static str, &str)>,
    states: &[&str],
    current: &str,
) -> fmt::Result {
    let unknown = (!states.contains(&current)).then_some(current);
    for state in states.iter().copied().chain(unknown) {
        let v = i64::from(state == current);
        match extra {
            Some(label) => {
                let labels = [label, ("state", state)];
                ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
            }
            None => {
                let labels = [("state", state)];
                ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
            }
        }
    }
    Ok(())
}

fn encode_cluster(encoder: &mut DescriptorEncoder<'_>, s: &ClusterStatus) -> fmt::Result {
    state_set(
        encoder,
        "sluice_cluster_lifecycle",
        "This node's lifecycle in the cluster (1 for the current state)",
        None,
        &["single", "joining", "active", "leaving", "left"],
        &s.lifecycle,
    )?;
    state_set(
        encoder,
        "sluice_cluster_lease",
        "This node's lease on the shared capacity (1 for the current state; expired: \
         enforcing the fallback)",
        None,
        &["none", "valid", "expiring", "expired"],
        &s.lease,
    )?;
    {
        let g = ConstGauge::new(0i64);
        let mut m = encoder.encode_descriptor(
            "sluice_cluster_link",
            "Link state of every configured peer (1 for the current state)",
            None,
            g.metric_type(),
        )?;
        for member in &s.members {
            let peer = member.id.to_string();
            state_samples(
                &mut m,
                Some(("peer", peer.as_str())),
                &["up", "suspect", "down"],
                &member.link,
            )?;
        }
    }
    {
        let g = ConstGauge::new(0i64);
        let mut m = encoder.encode_descriptor(
            "sluice_cluster_peer_wire_version",
            "Wire version this node speaks to the peer (the latest it heard from it, at most \
             its own)",
            None,
            g.metric_type(),
        )?;
        for member in &s.members {
            let peer = member.id.to_string();
            ConstGauge::new(i64::from(member.wire_version))
                .encode(m.encode_family(&[("peer", peer.as_str())])?)?;
        }
    }
    for (name, help, value) in [
        (
            "sluice_cluster_share",
            "Fraction of the key's global limit this node enforces",
            (|k: &crate::status::KeyShareStatus| k.share) as fn(&_) -> f64,
        ),
        (
            "sluice_cluster_limit",
            "Requests per unit this node enforces for the key",
            |k| k.limit as f64,
        ),
        (
            "sluice_cluster_demand",
            "Smoothed demand of the key on this node, as a fraction of its limit",
            |k| k.demand,
        ),
    ] {
        let g = ConstGauge::new(0.0f64);
        let mut m = encoder.encode_descriptor(name, help, None, g.metric_type())?;
        for k in &s.keys {
            let labels = [
                ("key", k.key.as_str()),
                ("domain", k.domain.as_deref().unwrap_or("")),
                ("rule", k.rule.as_deref().unwrap_or("")),
            ];
            ConstGauge::new(value(k)).encode(m.encode_family(&labels)?)?;
        }
    }
    gauge(
        encoder,
        "sluice_cluster_default_share",
        "Share of a cluster key this node has no state for",
        s.default_share,
    )?;
    gauge(
        encoder,
        "sluice_cluster_dead_floors",
        "Nodes with a dead or fenced incarnation (their capacity is minted again by an audit; a departed joiner's is forgotten after --forget-departed)",
        s.dead.len() as f64,
    )?;
    gauge(
        encoder,
        "sluice_cluster_pending_votes",
        "Votes to fence an incarnation that a quorum has not yet made a fence",
        s.pending_votes.len() as f64,
    )?;
    gauge(
        encoder,
        "sluice_cluster_quarantine_seconds",
        "Time left in this restarted node's quarantine (it echoes nobody until then)",
        s.quarantine_ms / 1e3,
    )?;
    gauge(
        encoder,
        "sluice_cluster_peers_unresolved",
        "Peers given by host name whose name has not resolved yet (nothing is sent to them)",
        s.peers_unresolved as f64,
    )?;
    gauge(
        encoder,
        "sluice_cluster_gamma",
        "The gain of the share update in use",
        s.gamma,
    )?;
    gauge(
        encoder,
        "sluice_cluster_cycle_seconds",
        "The share update cycle",
        s.cycle_ms / 1000.0,
    )?;
    gauge(
        encoder,
        "sluice_cluster_keys",
        "Keys this node holds coordinated state for",
        s.cap.coordinated_keys as f64,
    )?;
    gauge(
        encoder,
        "sluice_cluster_max_keys",
        "The most keys this node holds coordinated state for (0: no cap)",
        s.cap.max_cluster_keys as f64,
    )?;
    let p = &s.peer;
    let counter = ConstCounter::new(0u64);
    for (name, help, v) in [
        (
            "sluice_cluster_keys_refused",
            "Times a key was refused coordination at the cap (it stayed on the static split)",
            s.cap.keys_refused,
        ),
        (
            "sluice_cluster_keys_evicted",
            "Idle keys retired early because the cap was held",
            s.cap.keys_evicted,
        ),
        (
            "sluice_cluster_keys_over_cap",
            "Keys given state beyond the cap because what arrived for them held capacity",
            s.cap.keys_over_cap,
        ),
    ] {
        let m = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
        ConstCounter::new(v).encode(m)?;
    }
    {
        let m = encoder.encode_descriptor(
            "sluice_cluster_audit_rounds",
            "Capacity audits this node confirmed as their root",
            None,
            counter.metric_type(),
        )?;
        ConstCounter::new(s.audit_rounds).encode(m)?;
    }
    {
        let m = encoder.encode_descriptor(
            "sluice_cluster_incarnation_conflicts",
            "Dead floors heard above this node's own incarnation: another process with its id, \
             or an incarnation that went backwards",
            None,
            counter.metric_type(),
        )?;
        ConstCounter::new(s.incarnation_conflicts).encode(m)?;
    }
    {
        let m = encoder.encode_descriptor(
            "sluice_cluster_node_id_redraws",
            "Random node ids this process gave up because another process drew the same one",
            None,
            counter.metric_type(),
        )?;
        ConstCounter::new(s.node_id_redraws).encode(m)?;
    }
    gauge(
        encoder,
        "sluice_cluster_audit_minted_share",
        "Capacity the audits found lost and minted again, as a fraction of every key's limit",
        s.audit_minted_share,
    )?;
    {
        let mut m = encoder.encode_descriptor(
            "sluice_peer_messages",
            "Peer protocol messages, sent and received (received: authenticated and applied)",
            None,
            counter.metric_type(),
        )?;
        for (direction, v) in [("sent", p.messages_sent), ("received", p.messages_received)] {
            ConstCounter::new(v).encode(m.encode_family(&[("direction", direction)])?)?;
        }
    }
    {
        let bytes = Unit::Bytes;
        let mut m = encoder.encode_descriptor(
            "sluice_peer",
            "Peer protocol bytes, sent and received (datagrams, headers and MACs included)",
            Some(&bytes),
            counter.metric_type(),
        )?;
        for (direction, v) in [("sent", p.bytes_sent), ("received", p.bytes_received)] {
            ConstCounter::new(v).encode(m.encode_family(&[("direction", direction)])?)?;
        }
    }
    {
        let m = encoder.encode_descriptor(
            "sluice_peer_unaddressed",
            "Peer messages not sent: the peer's host name had not resolved yet",
            None,
            counter.metric_type(),
        )?;
        ConstCounter::new(p.unaddressed).encode(m)?;
    }
    {
        let m = encoder.encode_descriptor(
            "sluice_peer_oversized",
            "Peer messages not sent: too large for one datagram",
            None,
            counter.metric_type(),
        )?;
        ConstCounter::new(p.oversized).encode(m)?;
    }
    {
        let mut m = encoder.encode_descriptor(
            "sluice_peer_rejected",
            "Peer datagrams rejected, never applied",
            None,
            counter.metric_type(),
        )?;
        for (reason, v) in [
            ("unauthenticated", p.rejected_unauthenticated),
            ("malformed", p.rejected_malformed),
            ("version", p.rejected_version),
            ("membership", p.rejected_membership),
        ] {
            ConstCounter::new(v).encode(m.encode_family(&[("reason", reason)])?)?;
        }
    }
    membership::encode(encoder, s)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn decision_latency_reads_back_from_the_exposition() {
        let engine = Arc::new(Engine::new(crate::Config::example()));
        let m = Metrics::new(engine, None);
        // 90 decisions at 300 ns (bucket 250–500 ns), 10 at 3 µs (bucket 2–4 µs).
        for _ in 0..90 {
            m.record(Api::Grpc, Answer::Ok, Some(Duration::from_nanos(300)));
        }
        for _ in 0..10 {
            m.record(Api::Grpc, Answer::Ok, Some(Duration::from_micros(3)));
        }
        m.record(Api::Json, Answer::Ok, Some(Duration::from_secs(1)));
        let h = DecisionHistogram::parse(&m.encode().unwrap(), Api::Grpc);
        assert_eq!(h.count(), 100);
        let p50 = h.quantile(0.5).unwrap();
        assert!((250e-9..=500e-9).contains(&p50), "{p50}");
        let p99 = h.quantile(0.99).unwrap();
        assert!((2e-6..=4e-6).contains(&p99), "{p99}");
        // Two nodes, and what happened since an earlier read.
        let mut both = h.clone();
        both.merge(&h);
        assert_eq!(both.count(), 200);
        assert_eq!(both.since(&h), h);
        assert_eq!(h.since(&h).quantile(0.5), None);
        assert_eq!(DecisionHistogram::parse("", Api::Grpc).count(), 0);
        // Read in process: the same histogram as the exposition, of that API only.
        assert_eq!(m.decision_histogram(Api::Grpc).unwrap(), h);
        assert_eq!(m.decision_histogram(Api::Json).unwrap().count(), 1);
        assert_eq!(m.decision_histogram(Api::Peek).unwrap().count(), 0);
    }

    #[test]
    fn reloads_are_counted_by_result() {
        let engine = Arc::new(Engine::new(crate::Config::example()));
        let m = Metrics::new(engine, None);
        m.record_reload(true);
        m.record_reload(false);
        m.record_reload(false);
        let text = m.encode().unwrap();
        assert!(
            text.contains("sluice_config_reloads_total{result=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("sluice_config_reloads_total{result=\"refused\"} 2"),
            "{text}"
        );
    }
}
