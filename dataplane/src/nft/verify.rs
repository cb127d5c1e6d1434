//! Checking the kernel against what we committed, while syncs go on.
//!
//! Reading 100k elements back costs the kernel most of a second, too long to hold every
//! other sync for. So the periodic check reads in the background and compares afterwards;
//! whatever a commit touched while the read ran may show either version, and is left out.

use super::budget::Budget;
use super::diff::{Op, Transaction};
use super::elements::Packed;
use super::tables::{Ruleset, Table};
use crate::model::IpFamily;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::Duration;

/// What commits touched since a background read began.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recent {
    /// Element keys, per set.
    pub elements: HashMap<(IpFamily, String), HashSet<String>>,
    pub chains: HashSet<(IpFamily, String)>,
    /// A table or set was created or deleted: the read may have seen either layout.
    pub tables: bool,
}

impl Recent {
    /// Whether no commit of ours touched anything.
    pub fn is_empty(&self) -> bool {
        self.elements.is_empty() && self.chains.is_empty() && !self.tables
    }

    pub fn record(&mut self, tx: &Transaction) {
        for op in &tx.ops {
            match op {
                // A flushed set: what the read saw of it may be either side of the flush.
                Op::AddTable(_) | Op::DeleteTable(_) | Op::AddSet { .. } | Op::FlushSet { .. } => {
                    self.tables = true
                }
                Op::AddChain { family, name, .. }
                | Op::FlushChain { family, name }
                | Op::DeleteChain { family, name } => {
                    self.chains.insert((*family, name.clone()));
                }
                Op::AddRule { family, chain, .. } => {
                    self.chains.insert((*family, chain.clone()));
                }
                Op::AddElements {
                    family,
                    set,
                    elements,
                } => {
                    self.elements
                        .entry((*family, set.clone()))
                        .or_default()
                        .extend(elements.keys().map(|k| k.text()));
                }
                Op::DeleteElements { family, set, keys } => {
                    self.elements
                        .entry((*family, set.clone()))
                        .or_default()
                        .extend(keys.iter().cloned());
                }
            }
        }
    }
}

/// How `kernel` differs from `committed`, leaving out what `recent` commits touched; empty
/// when the kernel holds what we programmed.
pub fn differences(kernel: &Ruleset, committed: &Ruleset, recent: &Recent) -> Vec<String> {
    let mut comparison = Comparison::new(kernel, committed);
    loop {
        if let Some(found) = comparison.step(kernel, committed, recent, Duration::MAX) {
            return found.iter().map(Difference::to_string).collect();
        }
    }
}

/// One way the kernel differs from what we committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Difference {
    /// An element of set `set`: ours (`true`) missing or changed, or one not ours.
    Element {
        family: IpFamily,
        set: String,
        key: String,
        ours: bool,
    },
    /// A table, set or chain.
    Other(String),
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Difference::Element {
                family,
                set,
                key,
                ours: true,
            } => write!(f, "{family} set {set}: element {key} missing or changed"),
            Difference::Element {
                family, set, key, ..
            } => write!(f, "{family} set {set}: element {key} not ours"),
            Difference::Other(text) => f.write_str(text),
        }
    }
}

/// Elements compared between looks at the clock.
const PER_CHUNK: usize = 2048;

/// One part of a comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Table(IpFamily),
    /// One of our sets; its elements in chunks.
    Set(IpFamily, String),
    /// Sets in the kernel's table that are not ours.
    OtherSets(IpFamily),
    Chains(IpFamily),
}

/// [`differences`] a part at a time, so that comparing a 100k-service table can go on
/// between syncs rather than hold one for tens of milliseconds. Sound across our commits:
/// the comparison is with what we committed when each part is compared, and what our
/// commits touched since the read began (`recent`, which grows meanwhile) is left out, so
/// whatever is compared has not changed since the read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comparison {
    parts: Vec<Part>,
    at: usize,
    /// In a set: the last key compared.
    after: Option<String>,
    found: Vec<Difference>,
}

impl Comparison {
    pub fn new(kernel: &Ruleset, committed: &Ruleset) -> Comparison {
        let families: HashSet<IpFamily> = kernel
            .tables
            .keys()
            .chain(committed.tables.keys())
            .copied()
            .collect();
        let mut parts = Vec::new();
        for family in IpFamily::ALL.into_iter().filter(|f| families.contains(f)) {
            parts.push(Part::Table(family));
            if let Some(c) = committed.table(family) {
                parts.extend(c.sets.keys().map(|n| Part::Set(family, n.clone())));
            }
            parts.push(Part::OtherSets(family));
            parts.push(Part::Chains(family));
        }
        Comparison {
            parts,
            at: 0,
            after: None,
            found: Vec::new(),
        }
    }

    /// Compare until `budget` is spent; the differences once every part is compared.
    pub fn step(
        &mut self,
        kernel: &Ruleset,
        committed: &Ruleset,
        recent: &Recent,
        budget: Duration,
    ) -> Option<Vec<Difference>> {
        if recent.tables {
            // A layout of ours changed since the read began: it may show either. That
            // commit wrote the whole table anew (or refilled a flushed set), so what it
            // wrote is ours; anyone's commit after it starts another check.
            return Some(Vec::new());
        }
        let mut budget = Budget::starting(budget);
        while let Some(part) = self.parts.get(self.at) {
            let family = match part {
                Part::Table(f) | Part::Set(f, _) | Part::OtherSets(f) | Part::Chains(f) => *f,
            };
            let (Some(k), Some(c)) = (kernel.table(family), committed.table(family)) else {
                if let Part::Table(_) = part {
                    match (kernel.table(family), committed.table(family)) {
                        (None, Some(_)) => self.other(format!("{family} table missing")),
                        (Some(_), None) => {
                            self.other(format!("{family} table present, not ours any more"))
                        }
                        _ => {}
                    }
                }
                self.at += 1;
                continue;
            };
            let done = match part {
                Part::Table(_) => true,
                Part::Set(_, name) => {
                    let name = name.clone();
                    self.compare_set(family, &name, k, c, recent)
                }
                Part::OtherSets(_) => {
                    for name in k.sets.keys().filter(|n| !c.sets.contains_key(*n)) {
                        self.other(format!("{family} set {name} not ours"));
                    }
                    true
                }
                Part::Chains(_) => {
                    let recent_chain =
                        |name: &String| recent.chains.contains(&(family, name.clone()));
                    for (name, ours, theirs) in side_by_side(c.chains.iter(), k.chains.iter()) {
                        let what = match (ours, theirs) {
                            (Some(o), Some(t)) if o.same_as(t) => continue,
                            (Some(_), Some(_)) => ": rules changed",
                            (Some(_), None) => " missing",
                            (None, _) => " not ours",
                        };
                        if !recent_chain(name) {
                            self.other(format!("{family} chain {name}{what}"));
                        }
                    }
                    true
                }
            };
            if done {
                self.at += 1;
                self.after = None;
            }
            if !budget.another_fits() {
                return None;
            }
        }
        Some(std::mem::take(&mut self.found))
    }

    fn other(&mut self, text: String) {
        self.found.push(Difference::Other(text));
    }

    /// The next chunk of set `name`'s elements; true when the set is done.
    fn compare_set(
        &mut self,
        family: IpFamily,
        name: &str,
        k: &Table,
        c: &Table,
        recent: &Recent,
    ) -> bool {
        let Some(set) = c.sets.get(name) else {
            return true;
        };
        let Some(ks) = k.sets.get(name) else {
            self.other(format!("{family} set {name} missing"));
            return true;
        };
        if self.after.is_none() && ks.fingerprint != set.fingerprint {
            self.other(format!("{family} set {name} redeclared"));
        }
        if ks.unread {
            return true;
        }
        let touched = recent.elements.get(&(family, name.to_string()));
        let recent_key = |key: Packed<'_>| touched.is_some_and(|t| t.contains(&key.text()));
        // Our next chunk of keys, and the kernel's keys up to the last of them (all the
        // rest when ours end).
        let ours: Vec<(Packed<'_>, Option<Packed<'_>>)> = set
            .elements
            .after(self.after.as_deref())
            .take(PER_CHUNK)
            .collect();
        let last = (ours.len() == PER_CHUNK)
            .then(|| ours.last().map(|(k, _)| *k))
            .flatten();
        let theirs = ks
            .elements
            .after(self.after.as_deref())
            .take_while(|(key, _)| last.is_none_or(|l| *key <= l));
        for (key, ours, theirs) in side_by_side(ours.iter().copied(), theirs) {
            if ours == theirs || recent_key(key) {
                continue;
            }
            self.found.push(Difference::Element {
                family,
                set: name.to_string(),
                key: key.text(),
                ours: ours.is_some(),
            });
        }
        match last {
            Some(l) => {
                self.after = Some(l.text());
                false
            }
            None => true,
        }
    }
}

/// Every key of two sorted maps once, in order, with its value on each side: a merge, so
/// comparing 100k elements costs one pass instead of 100k lookups (the comparison runs on
/// the agent's event loop).
fn side_by_side<K: Ord, V>(
    ours: impl Iterator<Item = (K, V)>,
    theirs: impl Iterator<Item = (K, V)>,
) -> impl Iterator<Item = (K, Option<V>, Option<V>)> {
    let mut a = ours.peekable();
    let mut b = theirs.peekable();
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (None, None) => None,
        (Some(_), None) => a.next().map(|(k, v)| (k, Some(v), None)),
        (None, Some(_)) => b.next().map(|(k, v)| (k, None, Some(v))),
        (Some((ka, _)), Some((kb, _))) => match ka.cmp(kb) {
            std::cmp::Ordering::Less => a.next().map(|(k, v)| (k, Some(v), None)),
            std::cmp::Ordering::Greater => b.next().map(|(k, v)| (k, None, Some(v))),
            std::cmp::Ordering::Equal => {
                let (k, va) = a.next()?;
                let (_, vb) = b.next()?;
                Some((k, Some(va), Some(vb)))
            }
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::*;
    use crate::nft::diff::diff;
    use crate::nft::plan;

    /// Every part to the end, with no time for more than a chunk per step.
    fn stepped(kernel: &Ruleset, committed: &Ruleset, recent: &Recent) -> (Vec<String>, usize) {
        let mut comparison = Comparison::new(kernel, committed);
        for steps in 1.. {
            if let Some(found) = comparison.step(kernel, committed, recent, Duration::ZERO) {
                return (found.iter().map(Difference::to_string).collect(), steps);
            }
        }
        unreachable!()
    }

    /// A map of 10,000 elements compared in chunks finds what the whole comparison does:
    /// elements gone, changed and added, at chunk edges and past our last key, each once.
    #[test]
    fn a_comparison_in_chunks_finds_what_the_whole_one_does() {
        let mut committed = Ruleset::default();
        let mut table = crate::nft::tables::Table::default();
        let elements: crate::nft::elements::Elements = (0..10_000)
            .map(|i| (format!("k{i:05}"), Some(format!("v{i}"))))
            .collect();
        table.sets.insert(
            "backends".into(),
            crate::nft::tables::Set {
                map: true,
                elements,
                ..Default::default()
            },
        );
        committed.tables.insert(IpFamily::V4, table);
        let mut kernel = committed.clone();
        let e = &mut kernel
            .tables
            .get_mut(&IpFamily::V4)
            .unwrap()
            .sets
            .get_mut("backends")
            .unwrap()
            .elements;
        let last_of_first_chunk = format!("k{:05}", PER_CHUNK - 1);
        e.remove(&last_of_first_chunk);
        e.insert(&format!("k{:05}", PER_CHUNK), Some("changed"));
        e.insert(&format!("k{:05}x", PER_CHUNK - 1), Some("theirs"));
        e.insert("k99999", Some("theirs, past our last"));
        let whole = differences(&kernel, &committed, &Recent::default());
        assert_eq!(whole.len(), 4, "{whole:?}");
        let (found, steps) = stepped(&kernel, &committed, &Recent::default());
        assert_eq!(found, whole);
        assert!(steps > 10_000 / PER_CHUNK, "{steps} steps");
    }

    fn ruleset(endpoints: &[&str]) -> Ruleset {
        let mut s = crate::synth::cluster(3, 2);
        let name = ServicePortName::new("bench", "svc-0", "http", Protocol::Tcp);
        s.endpoints.insert(
            name,
            endpoints
                .iter()
                .map(|e| Endpoint::ready(e.parse().unwrap(), 8080))
                .collect(),
        );
        plan::desired(&s, &Ruleset::default()).0
    }

    #[test]
    fn deletions_by_others_show_and_our_own_commits_meanwhile_do_not() {
        let committed = ruleset(&["10.9.0.1", "10.9.0.2"]);
        assert!(differences(&committed, &committed, &Recent::default()).is_empty());

        // Someone deletes an element and a chain.
        let mut kernel = committed.clone();
        let v4 = kernel.tables.get_mut(&IpFamily::V4).unwrap();
        v4.sets
            .get_mut(plan::MAP_BACKENDS)
            .unwrap()
            .elements
            .pop_first();
        v4.chains.remove("services");
        let d = differences(&kernel, &committed, &Recent::default());
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(
            d.iter().any(|x| x.contains("chain services missing")),
            "{d:?}"
        );

        // We committed a change while the kernel was read: the read shows the old state.
        let old = ruleset(&["10.9.0.1", "10.9.0.2"]);
        let new = ruleset(&["10.9.0.1", "10.9.0.3"]);
        let mut recent = Recent::default();
        recent.record(&diff(&old, &new, false));
        assert!(differences(&old, &new, &recent).is_empty());
        assert!(!differences(&old, &new, &Recent::default()).is_empty());

        // Compared a part at a time, the same.
        assert_eq!(stepped(&kernel, &committed, &Recent::default()).0, d);

        // A missing table always shows.
        let mut gone = committed.clone();
        gone.tables.remove(&IpFamily::V6);
        assert_eq!(
            differences(&gone, &committed, &Recent::default()),
            vec!["IPv6 table missing".to_string()]
        );
    }
}
