//! The key a descriptor's counter is stored under (envoyproxy/ratelimit's cache key without
//! the window), and the borrowed view a decision looks it up with.

use std::hash::{Hash, Hasher};

use sluice_limits::KeyView;

use super::Descriptor;
use crate::config::RateLimit;

/// The counter of one descriptor: its domain and its own key/value pairs (envoyproxy/
/// ratelimit's cache key without the window, which the algorithm keeps).
///
/// The strings live in one allocation: the number of entries, then the domain and each
/// key and value, each as its length and its bytes. Four allocations per key (domain,
/// entries, a key and a value) were most of what a held key cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CounterKey {
    parts: Box<[u8]>,
    /// The descriptor's `limit` override, if it had one: such a counter is governed by it,
    /// not by the configuration (which is what [`Engine::retain_idle`] needs to know).
    pub(super) limit: Option<RateLimit>,
}

/// Reads `parts` as [`CounterKey`] lays them out: the domain, then the entries.
struct Parts<'a>(&'a [u8]);

impl<'a> Parts<'a> {
    fn u32(&mut self) -> usize {
        let (head, rest) = self.0.split_at(4.min(self.0.len()));
        self.0 = rest;
        let mut b = [0u8; 4];
        b[..head.len()].copy_from_slice(head);
        u32::from_le_bytes(b) as usize
    }

    fn bytes(&mut self) -> &'a [u8] {
        let n = self.u32().min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }

    /// The next string (the bytes were a `&str` when stored).
    fn str(&mut self) -> &'a str {
        std::str::from_utf8(self.bytes()).unwrap_or_default()
    }
}

impl CounterKey {
    /// The domain.
    pub(super) fn domain(&self) -> &str {
        let mut p = Parts(&self.parts);
        p.u32();
        p.str()
    }

    /// The entries, in order.
    pub(super) fn entries(&self) -> impl ExactSizeIterator<Item = (&str, &str)> {
        let mut p = Parts(&self.parts);
        let n = p.u32();
        p.str();
        (0..n).map(move |_| (p.str(), p.str()))
    }
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
        hash_counter(state, self.domain(), self.entries(), self.limit);
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
        if key.limit != d.limit {
            return false;
        }
        let mut p = Parts(&key.parts);
        p.u32() == d.entries.len()
            && p.bytes() == self.domain.as_bytes()
            && d.entries
                .iter()
                .all(|e| p.bytes() == e.key.as_bytes() && p.bytes() == e.value.as_bytes())
    }

    fn to_key(&self) -> CounterKey {
        CounterKey::new(self.domain, self.descriptor)
    }
}

impl CounterKey {
    pub(super) fn new(domain: &str, d: &Descriptor) -> Self {
        let strings = std::iter::once(domain).chain(
            d.entries
                .iter()
                .flat_map(|e| [e.key.as_str(), e.value.as_str()]),
        );
        let len = 4 + strings.clone().map(|s| 4 + s.len()).sum::<usize>();
        let mut parts = Vec::with_capacity(len);
        let put = |parts: &mut Vec<u8>, n: usize| {
            parts.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
        };
        put(&mut parts, d.entries.len());
        for s in strings {
            put(&mut parts, s.len());
            parts.extend_from_slice(s.as_bytes());
        }
        Self {
            parts: parts.into_boxed_slice(),
            limit: d.limit,
        }
    }
}
