//! The descriptor tree of a domain, and envoyproxy/ratelimit's matching of a request's
//! entries against it.

use super::{Map, Rule};

/// One level of the descriptor tree: the descriptors sharing a parent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Level {
    pub(super) by_key: Map<String, KeyNodes>,
}

/// The descriptors of one level with a given key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct KeyNodes {
    /// `value: v` (exact).
    pub(super) exact: Map<String, Node>,
    /// Values holding a `*` (anywhere: `foo*`, `bar*b`, `/api/*/action`), in file order
    /// (the first that matches wins).
    pub(super) wildcard: Vec<(Wildcard, Node)>,
    /// No value: one limit per runtime value.
    pub(super) any: Option<Node>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Node {
    pub(super) rule: Option<Rule>,
    pub(super) children: Level,
    /// `share_threshold: true` on a wildcard value: every value it matches shares one
    /// counter (the pattern's), instead of one counter per value.
    pub(super) share_threshold: bool,
    /// `value_to_metric: true`: statistics name the runtime value matched here (by a
    /// wildcard or by the key alone) rather than the configured one.
    pub(super) value_to_metric: bool,
}

/// A configured value with `*` in it: each `*` stands for any run of characters, empty
/// included (envoyproxy/ratelimit's `wildcardMatch`, `src/config/config_impl.go`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wildcard {
    /// The value as written, e.g. `foo*bar*baz`.
    pattern: String,
    /// The literal runs between the stars, e.g. `["foo", "bar", "baz"]` (at least two).
    parts: Vec<String>,
}

impl Wildcard {
    /// The pattern of `value`, if it has a `*`.
    pub(crate) fn new(value: &str) -> Option<Self> {
        value.contains('*').then(|| Self {
            pattern: value.to_owned(),
            parts: value.split('*').map(str::to_owned).collect(),
        })
    }

    /// The value as written.
    pub(crate) fn pattern(&self) -> &str {
        &self.pattern
    }

    /// Whether `value` matches: it starts with the first run, ends with the last, holds
    /// the runs between in order, and none of them overlap.
    pub(crate) fn matches(&self, value: &str) -> bool {
        let (Some(first), Some(last)) = (self.parts.first(), self.parts.last()) else {
            return false;
        };
        let fixed: usize = self.parts.iter().map(String::len).sum();
        if value.len() < fixed || !value.starts_with(first.as_str()) {
            return false;
        }
        let Some(mut rest) = value[first.len()..].strip_suffix(last.as_str()) else {
            return false;
        };
        for part in &self.parts[1..self.parts.len() - 1] {
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

/// What a request's entry matched at one level.
#[derive(Debug, Clone, Copy)]
pub(super) struct Found<'c> {
    pub(super) node: &'c Node,
    /// The wildcard pattern it matched through, if any.
    pub(super) wildcard: Option<&'c str>,
    /// Matched by its exact value.
    pub(super) exact: bool,
}

impl Level {
    /// The most specific node for `key = value`: exact value, then the first matching
    /// wildcard, then key only (envoyproxy/ratelimit's order).
    pub(super) fn find(&self, key: &str, value: &str) -> Option<Found<'_>> {
        let nodes = self.by_key.get(key)?;
        if let Some(node) = nodes.exact.get(value) {
            return Some(Found {
                node,
                wildcard: None,
                exact: true,
            });
        }
        if let Some((w, node)) = nodes.wildcard.iter().find(|(w, _)| w.matches(value)) {
            return Some(Found {
                node,
                wildcard: Some(w.pattern()),
                exact: false,
            });
        }
        nodes.any.as_ref().map(|node| Found {
            node,
            wildcard: None,
            exact: false,
        })
    }

    /// Adds `other`'s descriptors to this level; `Err` with the composite key (`key` or
    /// `key_value`) of one both define.
    pub(super) fn merge(&mut self, other: Level) -> Result<(), String> {
        for (key, theirs) in other.by_key {
            let ours = self.by_key.entry(key.clone()).or_default();
            for (value, node) in theirs.exact {
                if ours.exact.contains_key(&value) {
                    return Err(format!("{key}_{value}"));
                }
                ours.exact.insert(value, node);
            }
            for (w, node) in theirs.wildcard {
                if ours
                    .wildcard
                    .iter()
                    .any(|(o, _)| o.pattern() == w.pattern())
                {
                    return Err(format!("{key}_{}", w.pattern()));
                }
                ours.wildcard.push((w, node));
            }
            if let Some(node) = theirs.any {
                if ours.any.is_some() {
                    return Err(key);
                }
                ours.any = Some(node);
            }
        }
        Ok(())
    }

    pub(super) fn rules<'a>(&'a self, out: &mut Vec<&'a Rule>) {
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

#[cfg(test)]
mod tests {
    use super::Wildcard;

    fn m(pattern: &str, value: &str) -> bool {
        Wildcard::new(pattern).is_some_and(|w| w.matches(value))
    }

    /// The cases of envoyproxy/ratelimit's `wildcardMatch` (src/config/config_impl.go).
    #[test]
    fn a_star_matches_any_run_anywhere() {
        assert!(m("foo*", "foo"));
        assert!(m("foo*", "foo123"));
        assert!(!m("foo*", "fo"));
        assert!(m("bar*b", "barb"));
        assert!(m("bar*b", "bar123b"));
        assert!(!m("bar*b", "bar123"));
        // The runs must not overlap: "bab" is shorter than "bar" + "b".
        assert!(!m("bar*b", "bar"));
        assert!(m("foo*bar*baz", "foobarbaz"));
        assert!(m("foo*bar*baz", "foo1bar2baz"));
        assert!(!m("foo*bar*baz", "foo1baz"));
        assert!(!m("foo*bar*baz", "foo1baz2bar"));
        assert!(m("/api/*/action", "/api/v1/action"));
        assert!(!m("/api/*/action", "/api/v1/other"));
        assert!(m("*", ""));
        assert!(m("*", "anything"));
        assert!(m("*x", "x"));
        assert!(!m("*x", "xy"));
        assert!(m("a**b", "ab"));
    }
}
