//! A set's or map's elements, ordered by key: each key and value in its compact form
//! ([`super::packed`]: addresses as their bytes, ports as numbers), held inside its 32-byte
//! entry of the tree when it fits (any IPv4 element of our layout does), shared until written.
//!
//! Elements as text took a 24-byte entry and an allocation each: at 10k services x 10
//! endpoints the applied ruleset's 120k elements took about 18 MB (heaptrack), most of it the
//! backends map. The tree sits behind an `Arc` so that a transaction that adds every element
//! of a set (a first sync, a flushed set) shares it with the desired ruleset instead of
//! copying it: that copy was the largest block at the heap's peak of a first sync (18 MB at
//! 10k x 10, heaptrack). A write to a shared tree copies it (`Arc::make_mut`); the
//! transaction is gone by the next sync's writes.
//!
//! Keys and values go in and come back as nft's text; in between they are compared, ordered
//! and looked up in their compact form ([`Packed`]), so that the order is that of the compact
//! bytes, not of the text.

use super::packed;
use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::fmt;
use std::ops::Bound;
use std::sync::Arc;

/// Bytes held inside the entry: a key and value of IPv4 addresses, protocol and ports, or a
/// `goto` to a chain named up to 17 bytes, fit.
const INLINE: usize = 29;

/// One element: its key's compact form, then, for a map, a separator byte and its value's.
#[derive(Clone)]
enum Element {
    Inline {
        len: u8,
        key_len: u8,
        bytes: [u8; INLINE],
    },
    Held {
        key_len: u32,
        bytes: Box<[u8]>,
    },
}

/// Between a key and its value (no field tag is 0).
const VALUE: u8 = 0;

impl Element {
    fn new(key: &str, value: Option<&str>) -> Element {
        let mut b = Vec::with_capacity(key.len() + value.map_or(0, str::len) + 1);
        packed::pack(key, &mut b);
        let key_len = b.len();
        if let Some(v) = value {
            b.push(VALUE);
            packed::pack(v, &mut b);
        }
        Element::from_bytes(&b, key_len)
    }

    fn from_parts(key: Packed<'_>, value: Option<Packed<'_>>) -> Element {
        let mut b = Vec::with_capacity(key.0.len() + value.map_or(0, |v| v.0.len() + 1));
        b.extend_from_slice(key.0);
        if let Some(v) = value {
            b.push(VALUE);
            b.extend_from_slice(v.0);
        }
        Element::from_bytes(&b, key.0.len())
    }

    fn from_bytes(b: &[u8], key_len: usize) -> Element {
        match (u8::try_from(b.len()), u8::try_from(key_len)) {
            (Ok(len), Ok(key_len)) if b.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..b.len()].copy_from_slice(b);
                Element::Inline {
                    len,
                    key_len,
                    bytes,
                }
            }
            _ => Element::Held {
                // An element's text is addresses, ports and chain names: far below 4 GiB.
                key_len: u32::try_from(key_len).unwrap_or(u32::MAX),
                bytes: b.into(),
            },
        }
    }

    fn all(&self) -> (&[u8], usize) {
        match self {
            Element::Inline {
                len,
                key_len,
                bytes,
            } => (&bytes[..usize::from(*len)], usize::from(*key_len)),
            Element::Held { key_len, bytes } => (bytes, *key_len as usize),
        }
    }

    fn key(&self) -> Packed<'_> {
        let (b, k) = self.all();
        Packed(&b[..k])
    }

    fn value(&self) -> Option<Packed<'_>> {
        let (b, k) = self.all();
        b.get(k + 1..).map(Packed)
    }
}

impl Borrow<[u8]> for Element {
    fn borrow(&self) -> &[u8] {
        self.key().0
    }
}

// Ordered and equal by key alone, as a map's keys are (and as `Borrow<[u8]>` requires).
impl Ord for Element {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
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

/// A key or value in its compact form: ordered and compared as bytes, printed as nft's text.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Packed<'a>(&'a [u8]);

impl<'a> Packed<'a> {
    /// nft's text.
    pub fn text(&self) -> String {
        packed::text(self.0)
    }

    /// The compact form's bytes ([`super::packed`]).
    pub fn bytes(&self) -> &'a [u8] {
        self.0
    }

    /// The first field, and the rest (as the text's `split_once(" . ")`).
    pub fn split_first(&self) -> Option<(Packed<'a>, Packed<'a>)> {
        let n = packed::first_field_len(self.0)?;
        (n < self.0.len()).then(|| (Packed(&self.0[..n]), Packed(&self.0[n..])))
    }

    /// All fields but the last, and the last (as the text's `rsplit_once(" . ")`).
    pub fn split_last(&self) -> Option<(Packed<'a>, Packed<'a>)> {
        let mut at = packed::first_field_len(self.0)?;
        let mut last = 0;
        while at < self.0.len() {
            last = at;
            at += packed::first_field_len(&self.0[at..])?;
        }
        (last > 0).then(|| (Packed(&self.0[..last]), Packed(&self.0[last..])))
    }
}

impl fmt::Display for Packed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        packed::unpack(self.0, f)
    }
}

impl fmt::Debug for Packed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.text())
    }
}

impl PartialEq<&str> for Packed<'_> {
    fn eq(&self, other: &&str) -> bool {
        self.text() == *other
    }
}

fn key_bytes(key: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(key.len());
    packed::pack(key, &mut b);
    b
}

/// What [`Elements::insert_changed`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Put {
    /// The element held that value already.
    Unchanged,
    /// The key was not in.
    Added,
    /// The key held this other value.
    Replaced(Option<String>),
}

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
    pub fn get(&self, key: &str) -> Option<Option<Packed<'_>>> {
        self.0.get(key_bytes(key).as_slice()).map(Element::value)
    }

    /// [`Elements::get`] as text.
    pub fn text_of(&self, key: &str) -> Option<Option<String>> {
        self.get(key).map(|v| v.map(|v| v.text()))
    }

    /// [`Elements::get`] by a key of another tree.
    pub fn get_packed(&self, key: Packed<'_>) -> Option<Option<Packed<'_>>> {
        self.0.get(key.0).map(Element::value)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.0.contains(key_bytes(key).as_slice())
    }

    /// Put `key` in with `value`; returns the value it replaced, if `key` was in.
    pub fn insert(&mut self, key: &str, value: Option<&str>) -> Option<Option<String>> {
        self.put(Element::new(key, value))
    }

    /// [`Elements::insert`], but an element that already holds `value` is left as it is
    /// (a shared tree stays shared): what a layout in place writes back is mostly unchanged.
    pub fn insert_changed(&mut self, key: &str, value: Option<&str>) -> Put {
        self.put_changed(Element::new(key, value))
    }

    /// [`Elements::insert_changed`] of a key and value in their compact form, as
    /// [`super::packed`] builds them.
    pub fn insert_changed_packed(&mut self, key: &[u8], value: Option<&[u8]>) -> Put {
        self.put_changed(Element::from_parts(Packed(key), value.map(Packed)))
    }

    /// [`Elements::insert`] of a key and value in their compact form.
    pub fn insert_bytes(&mut self, key: &[u8], value: Option<&[u8]>) {
        self.put(Element::from_parts(Packed(key), value.map(Packed)));
    }

    fn put_changed(&mut self, e: Element) -> Put {
        match self.0.get(e.key().0) {
            Some(held) if held.value() == e.value() => Put::Unchanged,
            Some(held) => {
                let old = held.value().map(|v| v.text());
                Arc::make_mut(&mut self.0).replace(e);
                Put::Replaced(old)
            }
            None => {
                Arc::make_mut(&mut self.0).insert(e);
                Put::Added
            }
        }
    }

    /// [`Elements::insert`] of another tree's element.
    pub fn insert_packed(&mut self, key: Packed<'_>, value: Option<Packed<'_>>) {
        self.put(Element::from_parts(key, value));
    }

    fn put(&mut self, e: Element) -> Option<Option<String>> {
        if Arc::get_mut(&mut self.0).is_none() {
            if let Some(held) = self
                .0
                .get(e.key().0)
                .filter(|held| held.value() == e.value())
            {
                // Unchanged: a shared tree stays shared.
                return Some(held.value().map(|v| v.text()));
            }
        }
        Arc::make_mut(&mut self.0)
            .replace(e)
            .map(|old| old.value().map(|v| v.text()))
    }

    /// Take `key` out; returns its value, if it was in.
    pub fn remove(&mut self, key: &str) -> Option<Option<String>> {
        let k = key_bytes(key);
        if Arc::get_mut(&mut self.0).is_none() && !self.0.contains(k.as_slice()) {
            return None;
        }
        Arc::make_mut(&mut self.0)
            .take(k.as_slice())
            .map(|old| old.value().map(|v| v.text()))
    }

    /// Whether `self` and `other` are one tree (a clone not written to since).
    pub fn shares_with(&self, other: &Elements) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Rebuild the tree with full nodes. Added in key order, as a layout adds them, a
    /// B-tree's nodes end up about half full: at 10k services x 10 endpoints its nodes
    /// took 45 bytes per 24-byte element (heaptrack), when elements were text.
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
            .map(|e| (e.key().text(), e.value().map(|v| v.text())))
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (Packed<'_>, Option<Packed<'_>>)> + '_ {
        self.0.iter().map(|e| (e.key(), e.value()))
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = Packed<'_>> + '_ {
        self.0.iter().map(Element::key)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = Option<Packed<'_>>> + '_ {
        self.0.iter().map(Element::value)
    }

    /// The elements whose keys begin with the whole fields of `prefix` (a key's start ending
    /// in `" . "`), in key order.
    pub fn with_prefix<'a>(
        &'a self,
        prefix: &str,
    ) -> impl Iterator<Item = (Packed<'a>, Option<Packed<'a>>)> + 'a {
        let start = packed::pack_prefix(prefix);
        let whole = prefix.ends_with(" . ");
        let len = start.len();
        self.0
            .range::<[u8], _>((Bound::Included(start.as_slice()), Bound::Unbounded))
            .map(|e| (e.key(), e.value()))
            .take_while(move |(k, _)| k.0.starts_with(&start))
            // `10.0.0.0/8 . tcp` does not begin with the fields `10.0.0.0 . `.
            .filter(move |(k, _)| match whole {
                true => !packed::continues_field(&k.0[len..]),
                false => k.0.len() == len,
            })
    }

    /// [`Elements::with_prefix`] of whole fields in their compact form.
    pub fn with_packed_prefix<'a>(
        &'a self,
        start: &'a [u8],
    ) -> impl Iterator<Item = (Packed<'a>, Option<Packed<'a>>)> + 'a {
        self.0
            .range::<[u8], _>((Bound::Included(start), Bound::Unbounded))
            .map(|e| (e.key(), e.value()))
            .take_while(move |(k, _)| k.0.starts_with(start))
            .filter(move |(k, _)| !packed::continues_field(&k.0[start.len()..]))
    }

    /// The elements whose keys come after `key` (all of them for `None`), in key order.
    pub fn after<'a>(
        &'a self,
        key: Option<&str>,
    ) -> impl Iterator<Item = (Packed<'a>, Option<Packed<'a>>)> + 'a {
        let start = key.map(key_bytes);
        self.0
            .range::<[u8], _>((
                start.as_deref().map_or(Bound::Unbounded, Bound::Excluded),
                Bound::Unbounded,
            ))
            .map(|e| (e.key(), e.value()))
    }
}

impl<'a> IntoIterator for &'a Elements {
    type Item = (Packed<'a>, Option<Packed<'a>>);
    type IntoIter = Box<dyn DoubleEndedIterator<Item = Self::Item> + 'a>;

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

impl<'a> FromIterator<(Packed<'a>, Option<Packed<'a>>)> for Elements {
    fn from_iter<I: IntoIterator<Item = (Packed<'a>, Option<Packed<'a>>)>>(iter: I) -> Self {
        let mut out = Elements::default();
        let tree = Arc::make_mut(&mut out.0);
        for (k, v) in iter {
            tree.replace(Element::from_parts(k, v));
        }
        out
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
        assert_eq!(e.text_of("a"), Some(None));
        assert_eq!(
            e.text_of("b . 0"),
            Some(Some(String::new())),
            "an empty value is still a value"
        );
        assert_eq!(e.text_of("b"), None);
        let texts = |i: &mut dyn Iterator<Item = (Packed<'_>, Option<Packed<'_>>)>| {
            i.map(|(k, v)| (k.text(), v.map(|v| v.text())))
                .collect::<Vec<_>>()
        };
        let owned = |v: &[(&str, Option<&str>)]| {
            v.iter()
                .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            e.keys().map(|k| k.text()).collect::<Vec<_>>(),
            ["a", "b . 0", "b . 1"]
        );
        assert_eq!(
            texts(&mut e.with_prefix("b . ")),
            owned(&[("b . 0", Some("")), ("b . 1", Some("x"))])
        );
        let nets: Elements = [
            ("10.0.0.0/8 . tcp", None::<&str>),
            ("10.0.0.0 . tcp", None),
            ("10.0.0.0 . udp", None),
            ("10.0.0.1 . tcp", None),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            texts(&mut nets.with_prefix("10.0.0.0 . ")),
            owned(&[("10.0.0.0 . tcp", None), ("10.0.0.0 . udp", None)]),
            "an address's /len is part of its field"
        );
        assert_eq!(
            texts(&mut e.after(Some("b . 0"))),
            owned(&[("b . 1", Some("x"))])
        );
        assert_eq!(e.after(None).count(), 3);
        assert_eq!(e.insert("b . 1", Some("y")), Some(Some("x".to_string())));
        assert_eq!(e.text_of("b . 1"), Some(Some("y".into())));
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
            b.text_of("k1"),
            Some(Some("v1".into())),
            "the clone saw the other's write"
        );
        assert_eq!(a.text_of("k1"), Some(Some("v2".into())));
        let mut c = b.clone();
        assert_eq!(c.remove("k2"), Some(None));
        assert_eq!(
            b.text_of("k2"),
            Some(None),
            "the clone saw the other's removal"
        );
        let mut d = b.clone();
        d.compact();
        assert_eq!(d, b, "compacting a shared tree changed what it holds");
    }

    #[test]
    fn an_insert_that_changes_nothing_says_so_and_keeps_the_tree_shared() {
        let mut a: Elements = [("10.0.0.1 . tcp . 80 . 0", Some("10.1.0.1 . 8080"))]
            .into_iter()
            .collect();
        let b = a.clone();
        let key = "10.0.0.1 . tcp . 80 . 0";
        assert_eq!(
            a.insert_changed(key, Some("10.1.0.1 . 8080")),
            Put::Unchanged
        );
        assert!(a.shares_with(&b), "an unchanged element copied the tree");
        assert_eq!(
            a.insert_changed(key, Some("10.1.0.2 . 8080")),
            Put::Replaced(Some("10.1.0.1 . 8080".into()))
        );
        assert_eq!(a.text_of(key), Some(Some("10.1.0.2 . 8080".into())));
        assert_eq!(b.text_of(key), Some(Some("10.1.0.1 . 8080".into())));
        assert_eq!(a.insert_changed("10.0.0.2", None), Put::Added);
        assert_eq!(a.insert_changed("10.0.0.2", None), Put::Unchanged);
        assert_eq!(a.len(), 2);
    }

    #[test]
    fn an_ipv4_element_of_our_layout_is_held_in_its_entry() {
        assert_eq!(std::mem::size_of::<Element>(), 32);
        for (key, value) in [
            ("172.30.0.41 . tcp . 443 . 65535", Some("10.180.0.1 . 8443")),
            ("255.255.255.255 . sctp . 65535", Some("goto cluster-65535")),
            ("10.0.0.0/8 . tcp . 80 . 192.168.0.0/16", None),
            ("10.180.0.1 . 10.180.0.1", None),
        ] {
            assert!(
                matches!(Element::new(key, value), Element::Inline { .. }),
                "{key} {value:?} took an allocation"
            );
        }
        let long = Element::new("fd00::1 . tcp . 443 . 0", Some("fd00:1:2:3:4:5:6:7 . 8443"));
        assert!(matches!(long, Element::Held { .. }));
        assert_eq!(long.key().text(), "fd00::1 . tcp . 443 . 0");
        assert_eq!(
            long.value().map(|v| v.text()).as_deref(),
            Some("fd00:1:2:3:4:5:6:7 . 8443")
        );
    }
}
