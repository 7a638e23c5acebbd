//! The key a descriptor's counter is stored under (envoyproxy/ratelimit's cache key without
//! the window), and the borrowed view a decision looks it up with.

use std::hash::{Hash, Hasher};

use sluice_limits::KeyView;

use super::Descriptor;
use crate::config::RateLimit;

/// The counter of one descriptor: its domain and its own key/value pairs (envoyproxy/
/// ratelimit's cache key without the window, which the algorithm keeps).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CounterKey {
    pub(super) domain: Box<str>,
    pub(super) entries: Box<[(Box<str>, Box<str>)]>,
    /// The descriptor's `limit` override, if it had one: such a counter is governed by it,
    /// not by the configuration (which is what [`Engine::retain_idle`] needs to know).
    pub(super) limit: Option<RateLimit>,
}

/// The hash of a counter key from its parts, shared by [`CounterKey`] and [`CounterView`]
/// so a request's borrowed strings find the stored key without building one.
fn hash_counter<'a, H: Hasher>(
    state: &mut H,
    domain: &str,
    entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    limit: Option<RateLimit>,
) {
    domain.hash(state);
    state.write_usize(entries.len());
    for (k, v) in entries {
        k.hash(state);
        v.hash(state);
    }
    limit.hash(state);
}

impl Hash for CounterKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        hash_counter(
            state,
            &self.domain,
            self.entries.iter().map(|(k, v)| (&**k, &**v)),
            self.limit,
        );
    }
}

/// A [`CounterKey`] borrowed from a request: the decision's lookup allocates nothing; the
/// owned key is built only when a new counter is stored.
pub(super) struct CounterView<'a> {
    pub(super) domain: &'a str,
    pub(super) descriptor: &'a Descriptor,
}

impl Hash for CounterView<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        hash_counter(
            state,
            self.domain,
            self.descriptor
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str())),
            self.descriptor.limit,
        );
    }
}

impl KeyView<CounterKey> for CounterView<'_> {
    fn matches(&self, key: &CounterKey) -> bool {
        let d = self.descriptor;
        *key.domain == *self.domain
            && key.limit == d.limit
            && key.entries.len() == d.entries.len()
            && key
                .entries
                .iter()
                .zip(&d.entries)
                .all(|((k, v), e)| **k == *e.key && **v == *e.value)
    }

    fn to_key(&self) -> CounterKey {
        CounterKey::new(self.domain, self.descriptor)
    }
}

impl CounterKey {
    pub(super) fn new(domain: &str, d: &Descriptor) -> Self {
        Self {
            limit: d.limit,
            domain: domain.into(),
            entries: d
                .entries
                .iter()
                .map(|e| (e.key.as_str().into(), e.value.as_str().into()))
                .collect(),
        }
    }
}
