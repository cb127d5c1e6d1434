//! Forgetting remembered clients (sessionAffinity ClientIP) whose endpoint is no longer
//! behind the front end they used, or whose front end no longer remembers. The packet path
//! fills the affinity map; only a sync knows when an entry went stale, so after each sync
//! that changed something the remembered entries are read back and the stale ones deleted.

use super::diff::{Op, Transaction};
use super::elements::{Elements, Packed};
use super::skeleton::{BACKEND_MAPS, MAP_AFFINITY_FRONTENDS};
use super::tables::Table;
use std::collections::{HashMap, HashSet};

/// Whether `tx` takes out something a remembered client may depend on (a re-pointed slot
/// is a delete and an add).
pub fn may_strand(tx: &Transaction) -> bool {
    tx.ops.iter().any(|op| match op {
        Op::DeleteElements { set, .. } | Op::FlushSet { set, .. } => {
            BACKEND_MAPS.contains(&set.as_str()) || set == MAP_AFFINITY_FRONTENDS
        }
        Op::DeleteTable(_) | Op::DeleteChain { .. } => true,
        _ => false,
    })
}

/// The keys of `remembered` (`client . address . proto . port : endpoint . port`) that
/// `desired` no longer backs.
pub fn stale(desired: &Table, remembered: &Elements) -> Vec<String> {
    // Nothing remembered (a cold sync, clients gone): no index of every backend to build.
    if remembered.is_empty() {
        return Vec::new();
    }
    let mut valid: HashMap<Packed<'_>, HashSet<Packed<'_>>> = HashMap::new();
    for map in BACKEND_MAPS {
        let Some(set) = desired.sets.get(map) else {
            continue;
        };
        for (key, value) in &set.elements {
            // `front end . slot`: the front end is everything before the slot.
            if let (Some((fe, _)), Some(v)) = (key.split_last(), value) {
                valid.entry(fe).or_default().insert(v);
            }
        }
    }
    let remembering = desired.sets.get(MAP_AFFINITY_FRONTENDS);
    remembered
        .iter()
        .filter(|(key, value)| {
            let Some((_, fe)) = key.split_first() else {
                return true;
            };
            if remembering.is_none_or(|s| s.elements.get_packed(fe).is_none()) {
                return true;
            }
            let backs = |k: Packed<'_>| {
                value.is_some_and(|v| valid.get(&k).is_some_and(|s| s.contains(&v)))
            };
            match valid.contains_key(&fe) {
                true => !backs(fe),
                // Not an address front end: a node port, whose slots are keyed by protocol
                // and port alone.
                false => !fe.split_first().is_some_and(|(_, np)| backs(np)),
            }
        })
        .map(|(k, _)| k.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::skeleton::{MAP_BACKENDS, MAP_NODEPORT_BACKENDS};
    use crate::nft::tables::Set;

    fn set(elements: &[(&str, &str)]) -> Set {
        Set {
            elements: elements
                .iter()
                .map(|(k, v)| (k.to_string(), Some(v.to_string())))
                .collect(),
            ..Set::default()
        }
    }

    #[test]
    fn entries_to_gone_endpoints_or_forgetful_front_ends_are_stale() {
        let mut t = Table::default();
        t.sets.insert(
            MAP_BACKENDS.into(),
            set(&[("172.30.0.1 . tcp . 80 . 0", "10.0.0.1 . 8080")]),
        );
        t.sets.insert(
            MAP_NODEPORT_BACKENDS.into(),
            set(&[("tcp . 30080 . 0", "10.0.0.1 . 8080")]),
        );
        t.sets.insert(
            MAP_AFFINITY_FRONTENDS.into(),
            set(&[
                ("172.30.0.1 . tcp . 80", "goto affinity-60"),
                ("192.168.0.2 . tcp . 30080", "goto affinity-60"),
            ]),
        );
        let remembered: Elements = [
            ("10.1.0.1 . 172.30.0.1 . tcp . 80", "10.0.0.1 . 8080"),
            ("10.1.0.2 . 172.30.0.1 . tcp . 80", "10.0.0.9 . 8080"),
            ("10.1.0.3 . 192.168.0.2 . tcp . 30080", "10.0.0.1 . 8080"),
            ("10.1.0.4 . 172.30.0.7 . tcp . 80", "10.0.0.1 . 8080"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), Some(v.to_string())))
        .collect();
        assert_eq!(
            stale(&t, &remembered),
            [
                "10.1.0.2 . 172.30.0.1 . tcp . 80",
                "10.1.0.4 . 172.30.0.7 . tcp . 80"
            ]
        );
    }
}
