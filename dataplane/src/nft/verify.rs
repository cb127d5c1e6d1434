//! Checking the kernel against what we committed, while syncs go on.
//!
//! Reading 100k elements back costs the kernel most of a second, too long to hold every
//! other sync for. So the periodic check reads in the background and compares afterwards;
//! whatever a commit touched while the read ran may show either version, and is left out.

use super::diff::{Op, Transaction};
use super::tables::Ruleset;
use crate::model::IpFamily;
use std::collections::{HashMap, HashSet};

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
                        .extend(elements.iter().map(|(k, _)| k.clone()));
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
    if recent.tables {
        return Vec::new();
    }
    let mut out = Vec::new();
    let families: HashSet<IpFamily> = kernel
        .tables
        .keys()
        .chain(committed.tables.keys())
        .copied()
        .collect();
    for family in IpFamily::ALL.into_iter().filter(|f| families.contains(f)) {
        let (k, c) = match (kernel.table(family), committed.table(family)) {
            (Some(k), Some(c)) => (k, c),
            (None, Some(_)) => {
                out.push(format!("{family} table missing"));
                continue;
            }
            (Some(_), None) => {
                out.push(format!("{family} table present, not ours any more"));
                continue;
            }
            (None, None) => continue,
        };
        for (name, set) in &c.sets {
            let Some(ks) = k.sets.get(name) else {
                out.push(format!("{family} set {name} missing"));
                continue;
            };
            if ks.fingerprint != set.fingerprint {
                out.push(format!("{family} set {name} redeclared"));
            }
            if ks.unread {
                continue;
            }
            let touched = recent.elements.get(&(family, name.clone()));
            let recent_key = |key: &str| touched.is_some_and(|t| t.contains(key));
            for (key, ours, theirs) in side_by_side(set.elements.iter(), ks.elements.iter()) {
                if ours == theirs || recent_key(key) {
                    continue;
                }
                out.push(match ours {
                    Some(_) => format!("{family} set {name}: element {key} missing or changed"),
                    None => format!("{family} set {name}: element {key} not ours"),
                });
            }
        }
        for name in k.sets.keys().filter(|n| !c.sets.contains_key(*n)) {
            out.push(format!("{family} set {name} not ours"));
        }
        let recent_chain = |name: &String| recent.chains.contains(&(family, name.clone()));
        for (name, ours, theirs) in side_by_side(c.chains.iter(), k.chains.iter()) {
            let what = match (ours, theirs) {
                (Some(o), Some(t)) if o.same_as(t) => continue,
                (Some(_), Some(_)) => ": rules changed",
                (Some(_), None) => " missing",
                (None, _) => " not ours",
            };
            if !recent_chain(name) {
                out.push(format!("{family} chain {name}{what}"));
            }
        }
    }
    out
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

        // A missing table always shows.
        let mut gone = committed.clone();
        gone.tables.remove(&IpFamily::V6);
        assert_eq!(
            differences(&gone, &committed, &Recent::default()),
            vec!["IPv6 table missing".to_string()]
        );
    }
}
