//! The decision engine: Envoy RLS v3 `ShouldRateLimit` with envoyproxy/ratelimit's
//! semantics, as a pure function of the configuration, the per-key state and `now`.
//!
//! [`Request`], [`Response`] and [`DescriptorStatus`] mirror the protobuf messages field for
//! field, so the gRPC and HTTP layers are straight mappings.
//!
//! What envoyproxy/ratelimit does, and so does this engine:
//! - each descriptor gets the rule found by [`crate::Domain::rule_for`], or its own `limit`
//!   override when it has one (a fixed window; Sluice counts it apart from the configured
//!   rule's counter, where envoyproxy/ratelimit shares one);
//! - a rule whose `name` is listed in the `replaces` of another rule matched by the same
//!   request is dropped: that descriptor gets no limit and its counter is not touched;
//! - no rule (or a replaced one): `OK`, no `current_limit`, `limit_remaining` 0;
//! - `unlimited`: `OK`, no `current_limit`, `limit_remaining` `u32::MAX`, nothing counted;
//! - a limited rule counts `hits_addend` against the counter of the descriptor's own
//!   key/value pairs — so a key configured without a value has one counter per runtime
//!   value; the request's `hits_addend` 0 counts as 1, a descriptor's own `hits_addend` 0
//!   is a check that consumes nothing; `shadow_mode` answers `OK` whatever the count says;
//! - every hit is counted in a fixed window, refused ones included (envoyproxy/ratelimit
//!   increments its counter past the limit): after 8 of 10, a refused request of 5 leaves
//!   the window over the limit, so a request of 1 is refused too (Sluice's other
//!   algorithms meter what they admit); an `OVER_LIMIT` status says 0 remaining;
//! - the status names the rule (`current_limit.name` is the rule's `name`);
//! - the overall code is `OVER_LIMIT` if any status is;
//! - an unknown domain is not an error: every descriptor is answered `OK` with no limit;
//!   an empty domain or an empty descriptor list is an error ([`RequestError`]).
//!
//! Where Sluice can differ, when asked to ([`Engine::set_count_refused`] with `false`): a
//! refused request is not counted. With `hits_addend` 1 the answers are the same (once
//! over, a fixed window stays over until it ends); with a larger addend a refused request
//! then leaves its permits to smaller requests. Refused hits are counted only where this
//! node decides; Redis and the token server count admitted hits.
//!
//! Scope of this engine: it decides from this node's state alone. A `coordination: cluster`
//! rule applies this node's share of the limit when a cluster is attached
//! ([`Engine::attach_cluster`]: the cluster driver keeps the [`Shares`] up to date), and the
//! whole limit otherwise (a cluster of one).
//!
//! A `coordination: redis` rule is decided by Redis when one is attached
//! ([`Engine::attach_redis`]) and the request goes through [`Engine::should_rate_limit_async`]:
//! every node shares one state per descriptor there (seed 002 §4.3), and while Redis does not
//! answer within its timeout the node decides with its share of the limit (seed 002 §4.4(4);
//! [`Engine::central_status`] says which). Without Redis, and in the synchronous calls, such a
//! rule is decided from this node's own state: with the whole limit when no Redis is attached
//! (a single node), with the fallback share when one is.
//!
//! A `coordination: token-server` rule is decided the same way through the attached token
//! client ([`Engine::attach_token_server`], [`crate::token_server`]): from this node's leased
//! batch while it lasts, by a call to the token server when it runs out (seed 002 §4.4(3)),
//! and with the node's share while no server answers within the timeout.

// Registered here so the module compiles with the engine; `lib.rs` re-exports it as
// `sluice_server::central`.
#[path = "central.rs"]
pub mod central;
// envoyproxy/ratelimit's counting details: share_threshold counters, near_limit, checks of 0.
#[path = "upstream.rs"]
mod upstream;
// The key a descriptor's counter is stored under, and its borrowed view for lookups.
#[path = "counter_key.rs"]
mod counter_key;
// The keys held: forgetting idle ones, the cap and its evictions.
#[path = "engine_keys.rs"]
mod keys;
// What the engine is asked and answers: requests, descriptors, statuses.
#[path = "engine_types.rs"]
mod types;
pub use types::{Code, Descriptor, DescriptorStatus, Entry, Request, RequestError, Response};

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use foldhash::HashMap;
use sluice_limits::{AlgorithmKind, AnyAlgorithm, KeyedStore, Limit, Nanos, Options};

use crate::config::{
    Config, ConfigError, ConfigSource, Coordination, Limited, Policy, RateLimit, Rule,
};
use crate::shares::{Shares, cluster_key, scaled};
use crate::stats::{Outcome, RuleStats, StatsRegistry};
use central::{Central, CentralStatus};
use counter_key::{CounterKey, CounterView};
use upstream::{near_limit_hits, over_already, shared_counter};

use crate::token_server::{ServerStatus, TokenClient, TokenServerNode, TokenStatus};

/// A center that decides some rules for all nodes, as attached to the engine.
#[derive(Clone, Copy)]
enum Center<'e> {
    /// `coordination: redis`.
    Redis(&'e Central),
    /// `coordination: token-server`.
    TokenServer(&'e TokenClient),
}

impl Center<'_> {
    /// The rules it decides.
    fn coordination(self) -> Coordination {
        match self {
            Self::Redis(_) => Coordination::Redis,
            Self::TokenServer(_) => Coordination::TokenServer,
        }
    }

    /// Decides `cost` permits of `key` (the center, or its fallback); never fails, never
    /// waits longer than the center's timeout.
    async fn decide(
        self,
        kind: AlgorithmKind,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> sluice_limits::Decision {
        match self {
            Self::Redis(c) => c.decide(kind, key, limit, now, cost).await,
            Self::TokenServer(t) => t.decide(kind, key, limit, now, cost).await,
        }
    }

    /// The share of `limit` this node applies on its own in fallback.
    fn fallback_limit(self, limit: &Limit) -> Limit {
        match self {
            Self::Redis(c) => c.fallback_limit(limit),
            Self::TokenServer(t) => t.fallback_limit(limit),
        }
    }
}

/// The rule a descriptor gets.
#[derive(Debug)]
enum Matched<'c> {
    /// None (no match, or replaced).
    Nothing,
    /// A rule of the configuration, with the descriptor its counter is kept under when
    /// that is not the request's own (values that matched a `share_threshold` wildcard
    /// replaced by its pattern), and the statistics path its hits are counted under when
    /// that is not the rule's (`detailed_metric`, `value_to_metric`).
    Rule(&'c Rule, Option<Descriptor>, Option<String>),
    /// The descriptor's own `limit`.
    Override(Limited),
}

/// A descriptor's `limit` override, as envoyproxy/ratelimit applies it: a fixed window
/// aligned to the epoch, local, never shadowed, replacing and replaced by nothing.
fn override_rule(rate: RateLimit) -> Limited {
    Limited {
        rate,
        algorithm: AlgorithmKind::FixedWindow,
        burst: None,
        coordination: Coordination::Local,
        fairness: crate::config::Fairness::default(),
        limit: Limit::from_nanos(u64::from(rate.requests_per_unit), rate.unit.nanos()).ok(),
    }
}

/// Consume, or only look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Check,
    Peek,
}

/// Decides `ShouldRateLimit` requests for one node. Safe to share between threads; the
/// configuration can be swapped while requests are decided, and per-key state survives the
/// swap (a changed limit applies from then on, as [`sluice_limits::Algorithm`] allows).
///
/// `now` is nanoseconds since the unix epoch: windows are aligned to it, like
/// envoyproxy/ratelimit's.
///
/// Memory: a key is stored from its first admitted request until [`Engine::retain_idle`]
/// finds it idle; the server shell calls that periodically.
pub struct Engine {
    /// The configuration in force. `ArcSwap`: a decision reads it without writing to any
    /// shared cache line (a lock or a reference count would bounce between the cores
    /// deciding at once).
    loaded: ArcSwap<Loaded>,
    /// One store per algorithm kind, in the order of [`AlgorithmKind::ALL`].
    stores: Vec<KeyedStore<CounterKey, AnyAlgorithm>>,
    stats: StatsRegistry,
    shares: OnceLock<Arc<Shares>>,
    central: OnceLock<Arc<Central>>,
    token: OnceLock<Arc<TokenClient>>,
    token_node: OnceLock<Arc<TokenServerNode>>,
    /// Refused hits are counted too (envoyproxy/ratelimit's way; the default).
    count_refused: AtomicBool,
}

/// A configuration in force, with its rules' counters found by the rule's address (stable
/// while this `Arc` lives), so the hot path hashes a pointer rather than a name.
struct Loaded {
    config: Arc<Config>,
    rule_stats: HashMap<usize, Arc<RuleStats>>,
}

impl Loaded {
    fn new(config: Config, stats: &StatsRegistry) -> Self {
        let mut rule_stats = HashMap::default();
        for domain in config.domains() {
            for rule in domain.rules() {
                rule_stats.insert(rule_addr(rule), stats.rule(domain.name(), &rule.path));
            }
        }
        Self {
            config: Arc::new(config),
            rule_stats,
        }
    }
}

fn rule_addr(rule: &Rule) -> usize {
    std::ptr::from_ref(rule) as usize
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("keys", &self.len())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine with no counted key, deciding under `config`.
    #[must_use]
    pub fn new(config: Config) -> Self {
        Self::with_max_keys(config, None)
    }

    /// [`Engine::new`] holding at most about `max_keys` keys per algorithm (`None`: no cap).
    /// A new key at a full table evicts idle keys first (no decision changes), then the
    /// least recently used (each may admit one more burst; counted in
    /// [`Engine::evictions`]).
    #[must_use]
    pub fn with_max_keys(config: Config, max_keys: Option<usize>) -> Self {
        let stores = AlgorithmKind::ALL
            .iter()
            .map(|&k| {
                KeyedStore::new(AnyAlgorithm::new(k, Options::default()), 16)
                    .with_max_keys(max_keys)
            })
            .collect();
        let stats = StatsRegistry::default();
        Self {
            loaded: ArcSwap::from_pointee(Loaded::new(config, &stats)),
            stores,
            stats,
            shares: OnceLock::new(),
            central: OnceLock::new(),
            token: OnceLock::new(),
            token_node: OnceLock::new(),
            count_refused: AtomicBool::new(true),
        }
    }

    /// The configuration in force.
    #[must_use]
    pub fn config(&self) -> Arc<Config> {
        self.loaded.load().config.clone()
    }

    /// Puts `config` in force for the following requests.
    pub fn set_config(&self, config: Config) {
        let loaded = Arc::new(Loaded::new(config, &self.stats));
        self.loaded.store(loaded);
    }

    /// Every rule's decision counters (they survive reloads).
    #[must_use]
    pub fn stats(&self) -> &StatsRegistry {
        &self.stats
    }

    /// From now on, `coordination: cluster` rules apply this node's share from `shares`
    /// (kept up to date by the cluster driver). Returns `false`, changing nothing, if a
    /// cluster was already attached.
    pub fn attach_cluster(&self, shares: Arc<Shares>) -> bool {
        self.shares.set(shares).is_ok()
    }

    /// From now on, `coordination: redis` rules are decided by `central` (built by
    /// [`central::connect`]) in [`Engine::should_rate_limit_async`]. Returns `false`,
    /// changing nothing, if a Redis was already attached.
    pub fn attach_redis(&self, central: impl Into<Arc<Central>>) -> bool {
        self.central.set(central.into()).is_ok()
    }

    /// The attached Redis, if any.
    #[must_use]
    pub fn redis(&self) -> Option<&Arc<Central>> {
        self.central.get()
    }

    /// Where `coordination: redis` rules are decided now (Redis or the local fallback, since
    /// when, how many changes), for `/metrics` and `/v1/cluster`; `None` without Redis.
    #[must_use]
    pub fn central_status(&self) -> Option<CentralStatus> {
        self.central.get().map(|c| c.status())
    }

    /// From now on, `coordination: token-server` rules are decided through `client` (leases
    /// from the token servers) in [`Engine::should_rate_limit_async`]. Returns `false`,
    /// changing nothing, if a token client was already attached.
    pub fn attach_token_server(&self, client: impl Into<Arc<TokenClient>>) -> bool {
        self.token.set(client.into()).is_ok()
    }

    /// The attached token client, if any.
    #[must_use]
    pub fn token_server(&self) -> Option<&Arc<TokenClient>> {
        self.token.get()
    }

    /// Where `coordination: token-server` rules are decided now (leases or the local
    /// fallback, since when, how many changes), for `/metrics` and `/v1/cluster`; `None`
    /// without token servers.
    #[must_use]
    pub fn token_status(&self) -> Option<TokenStatus> {
        self.token.get().map(|t| t.status())
    }

    /// Shows `node`, this node's own token server, in `/metrics` and `/v1/cluster`; `false`
    /// if one was already attached.
    pub fn attach_token_server_node(&self, node: Arc<TokenServerNode>) -> bool {
        self.token_node.set(node).is_ok()
    }

    /// This node's token server's state (serving or standing by, lease, what it granted and
    /// refused), if it is one.
    #[must_use]
    pub fn token_server_node_status(&self) -> Option<ServerStatus> {
        self.token_node.get().map(|n| n.status())
    }

    /// The attached cluster's shares, if any.
    #[must_use]
    pub fn shares(&self) -> Option<&Arc<Shares>> {
        self.shares.get()
    }

    /// Loads `source` again: on success the new configuration is in force; on error the old
    /// one stays in force, untouched, and the error says file, line and reason.
    ///
    /// # Errors
    /// As [`ConfigSource::load`].
    pub fn reload(&self, source: &ConfigSource) -> Result<(), ConfigError> {
        let config = source.load()?;
        self.set_config(config);
        Ok(())
    }

    /// Decides `request` at `now`, counting the hits of every descriptor whose limit admits
    /// them.
    ///
    /// # Errors
    /// [`RequestError`] for an empty domain or descriptor list; nothing is counted then.
    pub fn should_rate_limit(
        &self,
        now: Nanos,
        request: &Request,
    ) -> Result<Response, RequestError> {
        self.decide(now, request, Mode::Check)
    }

    /// Answers as [`Engine::should_rate_limit`] would at `now`, changing nothing. (Two equal
    /// descriptors in one request both see the state before the request.)
    ///
    /// # Errors
    /// As [`Engine::should_rate_limit`].
    pub fn check_only(&self, now: Nanos, request: &Request) -> Result<Response, RequestError> {
        self.decide(now, request, Mode::Peek)
    }

    /// Decides `request` at `now` as [`Engine::should_rate_limit`] does, except that
    /// `coordination: redis` rules are decided by the attached Redis ([`Engine::attach_redis`])
    /// and `coordination: token-server` rules through the attached token client
    /// ([`Engine::attach_token_server`]). Each call is bounded by its center's timeout; once
    /// one times out that center is in fallback and its rules decide locally at once (with
    /// one probe per 100 ms), and the two centers are asked concurrently, so a request waits
    /// at most about one timeout whatever its descriptors. Without either it is
    /// [`Engine::should_rate_limit`].
    ///
    /// # Errors
    /// As [`Engine::should_rate_limit`].
    pub async fn should_rate_limit_async(
        &self,
        now: Nanos,
        request: &Request,
    ) -> Result<Response, RequestError> {
        let redis = self.center_for(Coordination::Redis);
        let token = self.center_for(Coordination::TokenServer);
        let Some(either) = redis.or(token) else {
            return self.decide(now, request, Mode::Check);
        };
        let loaded = self.loaded.load_full();
        let Some(rules) = self.plan(&loaded, request)? else {
            return Ok(no_domain(request));
        };
        let decided = match (redis, token) {
            (Some(redis), Some(token)) => {
                // Redis and the token server are asked at once, so a request with
                // descriptors of both waits for one timeout, not two.
                let (mut by_redis, by_token) = tokio::join!(
                    self.centrally(redis, now, request, &rules),
                    self.centrally(token, now, request, &rules),
                );
                for (slot, status) in by_redis.iter_mut().zip(by_token) {
                    if status.is_some() {
                        *slot = status;
                    }
                }
                by_redis
            }
            // Only one is attached.
            _ => self.centrally(either, now, request, &rules).await,
        };
        let mut statuses = Vec::with_capacity(rules.len());
        for ((d, rule), decided) in request.descriptors.iter().zip(&rules).zip(decided) {
            let cost = cost_of(request, d);
            statuses.push(self.status(
                &loaded,
                now,
                &request.domain,
                d,
                rule,
                cost,
                Mode::Check,
                decided,
            ));
        }
        Ok(respond(statuses))
    }

    /// The statuses of the descriptors `center` decides, by index (`None` for the others).
    /// In request order, one after the other: two equal descriptors of one request see each
    /// other's hits, as in the synchronous path, and once a call times out the center is in
    /// fallback and the rest decide at once.
    async fn centrally(
        &self,
        center: Center<'_>,
        now: Nanos,
        request: &Request,
        rules: &[Matched<'_>],
    ) -> Vec<Option<DescriptorStatus>> {
        let mut out = vec![None; rules.len()];
        let coordination = center.coordination();
        for ((d, rule), slot) in request.descriptors.iter().zip(rules).zip(&mut out) {
            let Matched::Rule(r, shared, _) = rule else {
                continue;
            };
            let Policy::Limited(l) = &r.policy else {
                continue;
            };
            if l.coordination != coordination {
                continue;
            }
            let cost = cost_of(request, d);
            let d = shared.as_ref().unwrap_or(d);
            *slot = Some(center_limited(center, now, &request.domain, d, l, cost).await);
        }
        out
    }

    /// The center attached for `coordination`, if any.
    fn center_for(&self, coordination: Coordination) -> Option<Center<'_>> {
        match coordination {
            Coordination::Redis => self.central.get().map(|c| Center::Redis(c)),
            Coordination::TokenServer => self.token.get().map(|t| Center::TokenServer(t)),
            _ => None,
        }
    }

    /// The rule each descriptor gets, after `replaces`; `None` for an unknown domain.
    fn plan<'l>(
        &self,
        loaded: &'l Loaded,
        request: &Request,
    ) -> Result<Option<Vec<Matched<'l>>>, RequestError> {
        if request.domain.is_empty() {
            return Err(RequestError::EmptyDomain);
        }
        if request.descriptors.is_empty() {
            return Err(RequestError::NoDescriptors);
        }
        let config = &loaded.config;
        let Some(domain) = config.domain(&request.domain) else {
            return Ok(None);
        };
        let mut rules: Vec<Matched<'_>> = request
            .descriptors
            .iter()
            .map(|d| match d.limit {
                Some(rate) => Matched::Override(override_rule(rate)),
                None => domain
                    .lookup(d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())))
                    .map_or(Matched::Nothing, |l| {
                        Matched::Rule(l.rule, shared_counter(d, &l.shared), l.metric_path)
                    }),
            })
            .collect();
        // `replaces`: a named rule matched by one descriptor is dropped when another rule
        // matched by the same request replaces it.
        let replaced: Vec<&str> = rules
            .iter()
            .filter_map(|m| match m {
                Matched::Rule(r, ..) => Some(r.replaces.iter().map(String::as_str)),
                _ => None,
            })
            .flatten()
            .collect();
        for slot in &mut rules {
            if let Matched::Rule(r, ..) = slot
                && r.name.as_deref().is_some_and(|n| replaced.contains(&n))
            {
                *slot = Matched::Nothing;
            }
        }
        Ok(Some(rules))
    }

    fn decide(&self, now: Nanos, request: &Request, mode: Mode) -> Result<Response, RequestError> {
        let loaded = self.loaded.load();
        let Some(rules) = self.plan(&loaded, request)? else {
            return Ok(no_domain(request));
        };
        let statuses = request
            .descriptors
            .iter()
            .zip(&rules)
            .map(|(d, rule)| {
                let cost = cost_of(request, d);
                self.status(&loaded, now, &request.domain, d, rule, cost, mode, None)
            })
            .collect();
        Ok(respond(statuses))
    }

    /// One descriptor's status under its rule: `decided` when Redis has decided it already,
    /// else from this node's state; shadow mode and the rule's counters applied.
    #[allow(clippy::too_many_arguments)]
    fn status(
        &self,
        loaded: &Loaded,
        now: Nanos,
        domain: &str,
        d: &Descriptor,
        rule: &Matched<'_>,
        cost: u64,
        mode: Mode,
        decided: Option<DescriptorStatus>,
    ) -> DescriptorStatus {
        match rule {
            Matched::Nothing => DescriptorStatus::NO_LIMIT,
            Matched::Override(l) => self.limited(now, domain, "", d, l, cost, mode),
            Matched::Rule(rule, shared, metric) => match &rule.policy {
                Policy::Unlimited => DescriptorStatus::UNLIMITED,
                Policy::Limited(l) => {
                    let d = shared.as_ref().unwrap_or(d);
                    let mut s = decided
                        .unwrap_or_else(|| self.limited(now, domain, &rule.path, d, l, cost, mode));
                    // envoyproxy/ratelimit's limiter answers a `shadow_mode` rule over its
                    // limit OK (`GetResponseDescriptorStatus`); a `quota_mode` rule's answer
                    // stays OVER_LIMIT, and the service decides what it means for the
                    // request (`shouldRateLimitWorker`: [`overall_code`]).
                    let outcome = match (s.code, rule.shadow_mode) {
                        (Code::Ok, _) => Outcome::Within,
                        (Code::OverLimit, false) => Outcome::Over,
                        (Code::OverLimit, true) => Outcome::Shadow,
                    };
                    if rule.shadow_mode {
                        s.code = Code::Ok;
                        s.retry_after = None;
                    }
                    s.quota_mode = rule.quota_mode;
                    if metric.is_none() {
                        s.metadata.clone_from(&rule.metadata);
                    }
                    s.limit_name.clone_from(&rule.name);
                    if mode == Mode::Check {
                        // Per runtime value (`detailed_metric`, `value_to_metric`): found by
                        // name, as their number is the clients' doing.
                        // (The rule's own are found by address: no reference count to
                        // bounce between cores.)
                        let by_name;
                        let stats = match metric {
                            Some(path) => {
                                by_name = self.stats.rule(domain, path);
                                Some(&by_name)
                            }
                            None => loaded.rule_stats.get(&rule_addr(rule)),
                        };
                        if let Some(stats) = stats {
                            stats.record(outcome, cost);
                            if outcome == Outcome::Within {
                                stats.record_near(near_limit_hits(l, &s, cost));
                            }
                        }
                    }
                    s
                }
            },
        }
    }

    /// `path`: the rule's descriptor path, naming the key's share for operators.
    #[allow(clippy::too_many_arguments)]
    fn limited(
        &self,
        now: Nanos,
        domain: &str,
        path: &str,
        d: &Descriptor,
        rule: &Limited,
        cost: u64,
        mode: Mode,
    ) -> DescriptorStatus {
        let (limit, window_reset) = match limit_and_reset(rule, now) {
            Ok(v) => v,
            Err(blocked) => return blocked,
        };
        let share;
        // The cluster key, for a `coordination: cluster` rule: a refusal is noted on it.
        let mut refusable = None;
        let limit = match (rule.coordination, self.shares.get()) {
            (Coordination::Cluster, Some(shares)) => {
                let key = rule.fairness.key(cluster_key(
                    domain,
                    d.entries.iter().map(|e| (&*e.key, &*e.value)),
                ));
                refusable = Some((shares, key));
                // Windows count a whole period: a share that moved within it must not be
                // used twice (`shares` module documentation); buckets meter a rate.
                let windowed = matches!(
                    rule.algorithm,
                    AlgorithmKind::FixedWindow
                        | AlgorithmKind::FixedWindowFirst
                        | AlgorithmKind::SlidingWindow
                        | AlgorithmKind::SlidingLog
                );
                let (count, period) = (limit.count(), limit.period());
                let units = match (mode, windowed) {
                    // Refused hits count too: the cluster divides by demand, not throughput.
                    (Mode::Check, _) => {
                        shares.on_rule_hit(key, (domain, path), count, period, cost, windowed)
                    }
                    (Mode::Peek, false) => shares.units(key),
                    (Mode::Peek, true) => shares.units_windowed(key),
                };
                let count = scaled(limit.count(), units);
                let Some(l) = Limit::from_nanos(count, limit.period()).ok().map(|l| {
                    l.with_burst(scaled(limit.burst(), units).max(1))
                        .unwrap_or(l)
                }) else {
                    // This node holds no part of the limit now (the others use it all).
                    if mode == Mode::Check {
                        shares.note_refused(key);
                    }
                    return DescriptorStatus {
                        code: Code::OverLimit,
                        current_limit: Some(rule.rate),
                        limit_name: None,
                        quota_mode: false,
                        metadata: None,
                        limit_remaining: 0,
                        duration_until_reset: Some(window_reset),
                        retry_after: None,
                    };
                };
                share = l;
                &share
            }
            // Decided here only in the synchronous calls, or when no center is attached: with
            // one, as its fallback would (this node's share); without, as a single node.
            (Coordination::Redis | Coordination::TokenServer, _) => {
                match self.center_for(rule.coordination) {
                    Some(center) => {
                        share = center.fallback_limit(limit);
                        &share
                    }
                    None => limit,
                }
            }
            _ => limit,
        };
        let store = &self.stores[rule.algorithm.index()];
        // Refused hits are counted in the fixed windows, envoyproxy/ratelimit's algorithm;
        // Sluice's other algorithms meter what they admit (a bucket charged with refused
        // hits would refuse everything under sustained overload).
        let counts_refused = self.counts_refused()
            && matches!(
                rule.algorithm,
                AlgorithmKind::FixedWindow | AlgorithmKind::FixedWindowFirst
            );
        let key = CounterView {
            domain,
            descriptor: d,
        };
        // Only called when a full table makes room for a new key (then once per stored key:
        // the configuration is loaded once). A key no rule governs is idle, as in
        // `retain_idle`.
        let config_now = std::cell::OnceCell::new();
        let judge = |k: &CounterKey| {
            keys::limit_of(config_now.get_or_init(|| self.config()), k)
                .or_else(|| Limit::from_nanos(1, 1).ok())
        };
        let decision = match mode {
            // A check of 0 hits consumes nothing; it is over the limit only when the hits
            // already counted are (refused ones included).
            _ if cost == 0 => {
                let mut d = store.peek_view(&key, limit, now, 0);
                d.allowed = !(counts_refused && over_already(store, &key, limit, now));
                d
            }
            Mode::Check if counts_refused => {
                store.check_counting_refused_view_judged(&key, limit, now, cost, &judge)
            }
            Mode::Check => store.check_view_judged(&key, limit, now, cost, &judge),
            Mode::Peek => store.peek_view(&key, limit, now, cost),
        };
        let status = to_status(rule, &decision, window_reset);
        // A refusal says the static split is not enough here: the key is worth coordinating
        // (`Shares::note_refused`).
        if mode == Mode::Check
            && status.code == Code::OverLimit
            && let Some((shares, key)) = refusable
        {
            shares.note_refused(key);
        }
        status
    }
}

/// The status of a rule a center decides (`coordination: redis` or `token-server`): by the
/// center, from what the node holds of it (a batch, a lease), or by its fallback.
async fn center_limited(
    center: Center<'_>,
    now: Nanos,
    domain: &str,
    d: &Descriptor,
    rule: &Limited,
    cost: u64,
) -> DescriptorStatus {
    let (limit, window_reset) = match limit_and_reset(rule, now) {
        Ok(v) => v,
        Err(blocked) => return blocked,
    };
    let key = central_key(domain, d);
    let decision = center.decide(rule.algorithm, &key, limit, now, cost).await;
    to_status(rule, &decision, window_reset)
}

/// The rule's limit and the time to the end of its unit's epoch-aligned window (what
/// envoyproxy/ratelimit reports as the reset); `Err` with the status of a block rule
/// (`requests_per_unit: 0`: nothing to count).
fn limit_and_reset(rule: &Limited, now: Nanos) -> Result<(&Limit, Nanos), DescriptorStatus> {
    let unit = rule.rate.unit.nanos();
    let window_reset = unit - now % unit;
    match &rule.limit {
        Some(limit) => Ok((limit, window_reset)),
        None => Err(blocked(rule, window_reset)),
    }
}

/// The key of a descriptor's state in a central store (Redis or the token server).
fn central_key(domain: &str, d: &Descriptor) -> String {
    central::redis_key(domain, d.entries.iter().map(|e| (&*e.key, &*e.value)))
}

/// Hits a descriptor takes: its own `hits_addend` (0: a check that takes nothing), else
/// the request's (0, the field's default, counts as 1), as envoyproxy/ratelimit.
fn cost_of(request: &Request, d: &Descriptor) -> u64 {
    d.hits_addend
        .unwrap_or_else(|| u64::from(request.hits_addend.max(1)))
}

/// The answer for a domain no file defines: `OK`, no limit.
fn no_domain(request: &Request) -> Response {
    Response {
        overall_code: Code::Ok,
        statuses: vec![DescriptorStatus::NO_LIMIT; request.descriptors.len()],
    }
}

fn respond(statuses: Vec<DescriptorStatus>) -> Response {
    Response {
        overall_code: overall_code(&statuses, false),
        statuses,
    }
}

/// The response's code, as envoyproxy/ratelimit's `shouldRateLimitWorker` decides it:
/// `OVER_LIMIT` when a descriptor that is not in quota mode is over its limit, or when the
/// request has quota-mode descriptors and every one of them is over its quota. With
/// `global_quota_mode` (upstream's `QUOTA_MODE`) every descriptor but an `unlimited` one is
/// in quota mode, those without a rule included.
#[must_use]
pub fn overall_code(statuses: &[DescriptorStatus], global_quota_mode: bool) -> Code {
    let (mut quota, mut quota_over) = (0_usize, 0_usize);
    for s in statuses {
        if s.is_unlimited() {
            continue;
        }
        let over = s.code == Code::OverLimit;
        if global_quota_mode || s.quota_mode {
            quota += 1;
            quota_over += usize::from(over);
        } else if over {
            return Code::OverLimit;
        }
    }
    if quota > 0 && quota_over == quota {
        Code::OverLimit
    } else {
        Code::Ok
    }
}

/// `requests_per_unit: 0`.
fn blocked(rule: &Limited, window_reset: Nanos) -> DescriptorStatus {
    DescriptorStatus {
        code: Code::OverLimit,
        current_limit: Some(rule.rate),
        limit_name: None,
        quota_mode: false,
        metadata: None,
        limit_remaining: 0,
        duration_until_reset: Some(window_reset),
        retry_after: None,
    }
}

fn to_status(
    rule: &Limited,
    decision: &sluice_limits::Decision,
    window_reset: Nanos,
) -> DescriptorStatus {
    let reset = match rule.algorithm {
        AlgorithmKind::FixedWindow => window_reset,
        _ => decision.reset_after,
    };
    DescriptorStatus {
        code: if decision.allowed {
            Code::Ok
        } else {
            Code::OverLimit
        },
        current_limit: Some(rule.rate),
        limit_name: None,
        quota_mode: false,
        metadata: None,
        // Over the limit, nothing is left (envoyproxy/ratelimit answers 0).
        limit_remaining: if decision.allowed {
            u32::try_from(decision.remaining).unwrap_or(u32::MAX)
        } else {
            0
        },
        duration_until_reset: Some(reset),
        retry_after: if decision.allowed {
            None
        } else {
            decision.retry_after
        },
    }
}
