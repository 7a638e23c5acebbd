//! A small ordered map for a node's links: the same iteration order and results as a
//! `BTreeMap` (ascending keys), kept as two sorted vectors. A node touches a handful of
//! links per message, each lookup on a cold node; a B-tree leaf sized for eleven entries
//! spreads one lookup over several cache lines (its length sits after the values), and
//! that was most of the per-message cost of a 1,000-node run. Insertion and removal are
//! O(n): fine for links (a node has tens, not thousands), not meant for keys.

use std::iter::Zip;
use std::ops::{Deref, DerefMut};
use std::slice;

/// A vector that lives on the stack up to `N` items, then on the heap: the working
/// lists of one event (relay plans, neighbours to notify, gifts to sort) hold one item
/// per key or per neighbour, and a heap allocation per event for each, or a buffer kept
/// in every node (cold in cache by the node's next event), cost more than the work.
#[derive(Debug)]
pub(super) struct StackVec<T, const N: usize> {
    len: usize,
    inline: [T; N],
    /// All the items once more than `N` were pushed.
    heap: Vec<T>,
}

impl<T: Copy + Default, const N: usize> StackVec<T, N> {
    pub(super) fn new() -> Self {
        Self {
            len: 0,
            inline: [T::default(); N],
            heap: Vec::new(),
        }
    }

    pub(super) fn push(&mut self, v: T) {
        if self.len < N {
            self.inline[self.len] = v;
            self.len += 1;
        } else {
            if self.heap.is_empty() {
                self.heap.extend_from_slice(&self.inline);
            }
            self.heap.push(v);
        }
    }

    pub(super) fn clear(&mut self) {
        self.len = 0;
        self.heap.clear();
    }

    /// Removes consecutive repeated items (all repeats, once sorted).
    pub(super) fn dedup(&mut self)
    where
        T: PartialEq,
    {
        if self.heap.is_empty() {
            let mut w = 0;
            for r in 0..self.len {
                if w == 0 || self.inline[r] != self.inline[w - 1] {
                    self.inline[w] = self.inline[r];
                    w += 1;
                }
            }
            self.len = w;
        } else {
            self.heap.dedup();
        }
    }
}

impl<T: Copy + Default, const N: usize> Extend<T> for StackVec<T, N> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, iter: I) {
        for v in iter {
            self.push(v);
        }
    }
}

impl<'a, T, const N: usize> IntoIterator for &'a StackVec<T, N> {
    type Item = &'a T;
    type IntoIter = slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<T, const N: usize> Deref for StackVec<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        if self.heap.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }
}

impl<T, const N: usize> DerefMut for StackVec<T, N> {
    fn deref_mut(&mut self) -> &mut [T] {
        if self.heap.is_empty() {
            &mut self.inline[..self.len]
        } else {
            &mut self.heap
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct SmallMap<K, V> {
    keys: Vec<K>,
    vals: Vec<V>,
}

impl<K, V> Default for SmallMap<K, V> {
    fn default() -> Self {
        Self {
            keys: Vec::new(),
            vals: Vec::new(),
        }
    }
}

impl<K: Ord + Copy, V> SmallMap<K, V> {
    pub(super) fn new() -> Self {
        Self::default()
    }

    fn find(&self, k: &K) -> Result<usize, usize> {
        self.keys.binary_search(k)
    }

    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }

    pub(super) fn get(&self, k: &K) -> Option<&V> {
        self.find(k).ok().map(|i| &self.vals[i])
    }

    pub(super) fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        self.find(k).ok().map(|i| &mut self.vals[i])
    }

    pub(super) fn contains_key(&self, k: &K) -> bool {
        self.find(k).is_ok()
    }

    pub(super) fn insert(&mut self, k: K, v: V) -> Option<V> {
        match self.find(&k) {
            Ok(i) => Some(std::mem::replace(&mut self.vals[i], v)),
            Err(i) => {
                self.keys.insert(i, k);
                self.vals.insert(i, v);
                None
            }
        }
    }

    pub(super) fn remove(&mut self, k: &K) -> Option<V> {
        let i = self.find(k).ok()?;
        self.keys.remove(i);
        Some(self.vals.remove(i))
    }

    pub(super) fn entry(&mut self, k: K) -> Entry<'_, K, V> {
        Entry { map: self, key: k }
    }

    pub(super) fn iter(&self) -> Zip<slice::Iter<'_, K>, slice::Iter<'_, V>> {
        self.keys.iter().zip(self.vals.iter())
    }

    pub(super) fn iter_mut(&mut self) -> Zip<slice::Iter<'_, K>, slice::IterMut<'_, V>> {
        self.keys.iter().zip(self.vals.iter_mut())
    }

    pub(super) fn keys(&self) -> slice::Iter<'_, K> {
        self.keys.iter()
    }

    pub(super) fn values(&self) -> slice::Iter<'_, V> {
        self.vals.iter()
    }

    pub(super) fn values_mut(&mut self) -> slice::IterMut<'_, V> {
        self.vals.iter_mut()
    }
}

impl<'a, K: Ord + Copy, V> IntoIterator for &'a SmallMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Zip<slice::Iter<'a, K>, slice::Iter<'a, V>>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'a, K: Ord + Copy, V> IntoIterator for &'a mut SmallMap<K, V> {
    type Item = (&'a K, &'a mut V);
    type IntoIter = Zip<slice::Iter<'a, K>, slice::IterMut<'a, V>>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
    }
}

/// `BTreeMap::entry`'s two uses here.
pub(super) struct Entry<'a, K, V> {
    map: &'a mut SmallMap<K, V>,
    key: K,
}

impl<'a, K: Ord + Copy, V> Entry<'a, K, V> {
    pub(super) fn or_insert_with(self, f: impl FnOnce() -> V) -> &'a mut V {
        let i = match self.map.find(&self.key) {
            Ok(i) => i,
            Err(i) => {
                self.map.keys.insert(i, self.key);
                self.map.vals.insert(i, f());
                i
            }
        };
        &mut self.map.vals[i]
    }

    pub(super) fn or_default(self) -> &'a mut V
    where
        V: Default,
    {
        self.or_insert_with(V::default)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::{SmallMap, StackVec};

    proptest! {
        /// `SmallMap` answers every operation the links use exactly as the `BTreeMap` it
        /// replaces, iteration order included.
        #[test]
        fn small_map_is_a_btree_map(ops in prop::collection::vec((0u8..5, 0u32..24, any::<u16>()), 0..200)) {
            let mut s: SmallMap<u32, u16> = SmallMap::new();
            let mut b: BTreeMap<u32, u16> = BTreeMap::new();
            for (op, k, v) in ops {
                match op {
                    0 => prop_assert_eq!(s.insert(k, v), b.insert(k, v)),
                    1 => prop_assert_eq!(s.remove(&k), b.remove(&k)),
                    2 => {
                        let x = s.entry(k).or_default();
                        *x = x.wrapping_add(1);
                        let y = b.entry(k).or_default();
                        *y = y.wrapping_add(1);
                    }
                    3 => {
                        if let (Some(x), Some(y)) = (s.get_mut(&k), b.get_mut(&k)) {
                            *x = v;
                            *y = v;
                        }
                    }
                    _ => {
                        s.entry(k).or_insert_with(|| v);
                        b.entry(k).or_insert(v);
                    }
                }
                prop_assert_eq!(s.len(), b.len());
                prop_assert_eq!(s.contains_key(&k), b.contains_key(&k));
                prop_assert_eq!(s.get(&k), b.get(&k));
                prop_assert!(s.iter().eq(b.iter()));
                prop_assert!(s.keys().eq(b.keys()));
                prop_assert!(s.values().eq(b.values()));
            }
        }

        /// `StackVec` holds what a `Vec` holds, on either side of its inline size.
        #[test]
        fn stack_vec_is_a_vec(items in prop::collection::vec(0u32..10, 0..40), cut in 0usize..40) {
            let mut s = StackVec::<u32, 8>::new();
            let mut v = Vec::new();
            for (i, &x) in items.iter().enumerate() {
                if i == cut {
                    s.clear();
                    v.clear();
                }
                s.push(x);
                v.push(x);
                prop_assert_eq!(&s[..], &v[..]);
            }
            s.sort_unstable();
            v.sort_unstable();
            s.dedup();
            v.dedup();
            prop_assert_eq!(&s[..], &v[..]);
        }
    }
}
