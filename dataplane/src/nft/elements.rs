//! A set's or map's elements as canonical text, ordered by key: one allocation per element
//! holding its key and value together, in a tree of 24-byte entries, shared until written.
//!
//! A `BTreeMap<String, Option<String>>` cost two allocations and a 48-byte entry per element:
//! at 10k services x 10 endpoints the applied ruleset's 120k elements took about 18 MB
//! (heaptrack), most of it the backends map. The tree sits behind an `Arc` so that a
//! transaction that adds every element of a set (a first sync, a flushed set) shares it
//! with the desired ruleset instead of copying it: that copy was the largest block at the
//! heap's peak of a first sync (18 MB at 10k x 10, heaptrack). A write to a shared tree
//! copies it (`Arc::make_mut`); the transaction is gone by the next sync's writes.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::fmt;
use std::ops::Bound;
use std::sync::Arc;

/// One element: `text` is its key followed by its value, if any.
#[derive(Clone)]
struct Element {
    text: Box<str>,
    key_len: u32,
    has_value: bool,
}

impl Element {
    fn new(key: &str, value: Option<&str>) -> Element {
        let mut text = String::with_capacity(key.len() + value.map_or(0, str::len));
        text.push_str(key);
        text.push_str(value.unwrap_or_default());
        Element {
            text: text.into_boxed_str(),
            // Element text comes from addresses, ports and chain names: far below 4 GiB.
            key_len: u32::try_from(key.len()).unwrap_or(u32::MAX),
            has_value: value.is_some(),
        }
    }

    fn key(&self) -> &str {
        &self.text[..self.key_len as usize]
    }

    fn value(&self) -> Option<&str> {
        self.has_value.then(|| &self.text[self.key_len as usize..])
    }

    fn into_value(self) -> Option<String> {
        self.value().map(str::to_string)
    }
}

impl Borrow<str> for Element {
    fn borrow(&self) -> &str {
        self.key()
    }
}

// Ordered and equal by key alone, as a map's keys are (and as `Borrow<str>` requires).
impl Ord for Element {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(other.key())
    }
}

impl PartialOrd for Element {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Element {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Element {}

/// Key to value (`None` in a plain set), ordered by key. A clone shares the tree.
#[derive(Clone, Default)]
pub struct Elements(Arc<BTreeSet<Element>>);

impl Elements {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value of `key` (`Some(None)`: in the set, without a value).
    pub fn get(&self, key: &str) -> Option<Option<&str>> {
        self.0.get(key).map(Element::value)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.0.contains(key)
    }

    /// Put `key` in with `value`; returns the value it replaced, if `key` was in.
    pub fn insert(&mut self, key: &str, value: Option<&str>) -> Option<Option<String>> {
        if Arc::get_mut(&mut self.0).is_none() {
            if let Some(held) = self.get(key).filter(|held| *held == value) {
                // Unchanged: a shared tree stays shared.
                return Some(held.map(str::to_string));
            }
        }
        Arc::make_mut(&mut self.0)
            .replace(Element::new(key, value))
            .map(Element::into_value)
    }

    /// Take `key` out; returns its value, if it was in.
    pub fn remove(&mut self, key: &str) -> Option<Option<String>> {
        if Arc::get_mut(&mut self.0).is_none() && !self.contains_key(key) {
            return None;
        }
        Arc::make_mut(&mut self.0)
            .take(key)
            .map(Element::into_value)
    }

    /// Whether `self` and `other` are one tree (a clone not written to since).
    pub fn shares_with(&self, other: &Elements) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Rebuild the tree with full nodes. Added in key order, as a layout adds them, a
    /// B-tree's nodes end up about half full: at 10k services x 10 endpoints its nodes
    /// took 45 bytes per 24-byte element (heaptrack).
    pub fn compact(&mut self) {
        // Collected from a sorted sequence, a B-tree is built bottom-up with full nodes.
        let tree = std::mem::take(&mut self.0);
        self.0 = Arc::new(match Arc::try_unwrap(tree) {
            Ok(tree) => tree.into_iter().collect(),
            Err(shared) => shared.iter().cloned().collect(),
        });
    }

    #[cfg(test)]
    pub fn clear(&mut self) {
        self.0 = Arc::default();
    }

    /// Take the first element out.
    #[cfg(test)]
    pub fn pop_first(&mut self) -> Option<(String, Option<String>)> {
        Arc::make_mut(&mut self.0)
            .pop_first()
            .map(|e| (e.key().to_string(), e.into_value()))
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&str, Option<&str>)> + '_ {
        self.0.iter().map(|e| (e.key(), e.value()))
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &str> + '_ {
        self.0.iter().map(Element::key)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = Option<&str>> + '_ {
        self.0.iter().map(Element::value)
    }

    /// The elements from `start` on, in key order.
    pub fn range_from<'a>(
        &'a self,
        start: &str,
    ) -> impl Iterator<Item = (&'a str, Option<&'a str>)> + 'a {
        self.0
            .range::<str, _>((Bound::Included(start), Bound::Unbounded))
            .map(|e| (e.key(), e.value()))
    }

    /// The elements whose keys come after `key` (all of them for `None`), in key order.
    pub fn after<'a>(
        &'a self,
        key: Option<&str>,
    ) -> impl Iterator<Item = (&'a str, Option<&'a str>)> + 'a {
        let start = key.map_or(Bound::Unbounded, Bound::Excluded);
        self.0
            .range::<str, _>((start, Bound::Unbounded))
            .map(|e| (e.key(), e.value()))
    }
}

impl<'a> IntoIterator for &'a Elements {
    type Item = (&'a str, Option<&'a str>);
    type IntoIter = Box<dyn DoubleEndedIterator<Item = (&'a str, Option<&'a str>)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl PartialEq for Elements {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Elements {}

impl fmt::Debug for Elements {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, Option<V>)> for Elements {
    fn from_iter<I: IntoIterator<Item = (K, Option<V>)>>(iter: I) -> Self {
        let mut out = Elements::default();
        out.extend(iter);
        out
    }
}

impl<K: AsRef<str>, V: AsRef<str>> Extend<(K, Option<V>)> for Elements {
    fn extend<I: IntoIterator<Item = (K, Option<V>)>>(&mut self, iter: I) {
        for (k, v) in iter {
            self.insert(k.as_ref(), v.as_ref().map(AsRef::as_ref));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_of_text_in_key_order() {
        let mut e: Elements = [("b . 1", Some("x")), ("a", None), ("b . 0", Some(""))]
            .into_iter()
            .collect();
        assert_eq!(e.len(), 3);
        assert_eq!(e.get("a"), Some(None));
        assert_eq!(
            e.get("b . 0"),
            Some(Some("")),
            "an empty value is still a value"
        );
        assert_eq!(e.get("b"), None);
        assert_eq!(e.keys().collect::<Vec<_>>(), ["a", "b . 0", "b . 1"]);
        assert_eq!(
            e.range_from("b . ").collect::<Vec<_>>(),
            [("b . 0", Some("")), ("b . 1", Some("x"))]
        );
        assert_eq!(
            e.after(Some("b . 0")).collect::<Vec<_>>(),
            [("b . 1", Some("x"))]
        );
        assert_eq!(e.after(None).count(), 3);
        assert_eq!(e.insert("b . 1", Some("y")), Some(Some("x".to_string())));
        assert_eq!(e.get("b . 1"), Some(Some("y")));
        assert_eq!(e.remove("a"), Some(None));
        assert_eq!(e.remove("a"), None);
        let same: Elements = [("b . 0", Some("")), ("b . 1", Some("y"))]
            .into_iter()
            .collect();
        assert_eq!(e, same);
        let other: Elements = [("b . 0", Some("")), ("b . 1", Some("z"))]
            .into_iter()
            .collect();
        assert_ne!(e, other, "equal keys with another value differ");
    }

    #[test]
    fn a_clone_shares_the_tree_until_either_is_written() {
        let mut a: Elements = [("k1", Some("v1")), ("k2", None)].into_iter().collect();
        let b = a.clone();
        assert!(a.shares_with(&b));
        // Writes that change nothing keep the tree shared.
        assert_eq!(a.insert("k1", Some("v1")), Some(Some("v1".to_string())));
        assert_eq!(a.remove("absent"), None);
        assert!(
            a.shares_with(&b),
            "a write that changes nothing copied the tree"
        );
        assert_eq!(a.insert("k1", Some("v2")), Some(Some("v1".to_string())));
        assert!(!a.shares_with(&b));
        assert_eq!(
            b.get("k1"),
            Some(Some("v1")),
            "the clone saw the other's write"
        );
        assert_eq!(a.get("k1"), Some(Some("v2")));
        let mut c = b.clone();
        assert_eq!(c.remove("k2"), Some(None));
        assert_eq!(b.get("k2"), Some(None), "the clone saw the other's removal");
        let mut d = b.clone();
        d.compact();
        assert_eq!(d, b, "compacting a shared tree changed what it holds");
    }
}
