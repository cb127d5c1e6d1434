//! Who put what into a table: per service port, the elements and load-balancing chains it
//! contributed, with reference counts for what several service ports share, so that one
//! service can be taken out of a table and laid out again without touching the rest.

use super::skeleton::{LbKind, SET_CLUSTER_IPS, SET_HAIRPIN};
use super::tables::{Chain, Table};
use crate::backend::NoLocalEndpoints;
use crate::model::{IpFamily, ServicePortName};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// The sets whose elements several service ports may contribute: ports of one service share
/// a cluster IP, and an endpoint may back several services. Every other element has one
/// owner: front ends are exclusive, and backend slots are keyed by their front end. Both
/// are keyed by one address, which is what the records and the counts keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Shared {
    /// `cluster-ips`: the address.
    ClusterIp,
    /// `hairpin`: an endpoint reaching itself, `address . address`.
    Hairpin,
}

impl Shared {
    pub fn set(self) -> &'static str {
        match self {
            Shared::ClusterIp => SET_CLUSTER_IPS,
            Shared::Hairpin => SET_HAIRPIN,
        }
    }

    /// The element's key.
    pub fn key(self, ip: IpAddr) -> String {
        match self {
            Shared::ClusterIp => ip.to_string(),
            Shared::Hairpin => format!("{ip} . {ip}"),
        }
    }
}

/// What one service port contributed to its family's table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    /// (set, key) of every element only it holds, but its backend slots.
    pub elements: Vec<(&'static str, String)>,
    /// The shared elements it holds a count of. Kept as addresses: with endpoints not known
    /// to run elsewhere, every endpoint is a hairpin element, and their keys as text, here
    /// and in the counts, were 12 MB at 10k services x 10 (heaptrack).
    pub shared: Vec<(Shared, IpAddr)>,
    /// Its backend slots: (backends map, front-end key, count), the elements
    /// `<key> . 0` to `<key> . <count - 1>`. Kept as a range, not one key each: at 10k
    /// services x 10 endpoints, a copy of every slot's key held here was 9 MB (heaptrack).
    pub slots: Vec<(&'static str, String, usize)>,
    /// The load-balancing chains its front ends jump to.
    pub lb: Vec<(LbKind, usize)>,
    pub no_local: NoLocalEndpoints,
    /// Front ends it lost to another service port.
    pub conflicts: usize,
}

/// The key of slot `i` of front end `key` in a backends map.
pub fn slot_key(key: &str, i: usize) -> String {
    format!("{key} . {i}")
}

/// The records of one family's table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FamilyIndex {
    pub records: BTreeMap<ServicePortName, Record>,
    shared: BTreeMap<(Shared, IpAddr), usize>,
    lb: BTreeMap<(LbKind, usize), usize>,
    /// Sums over the records.
    pub no_local: NoLocalEndpoints,
    pub conflicts: usize,
}

impl FamilyIndex {
    /// Count one more holder of a shared element; true when it is the first.
    pub fn hold(&mut self, set: Shared, ip: IpAddr) -> bool {
        count_up(&mut self.shared, (set, ip))
    }

    /// Count one holder less of a shared element; true when it was the last.
    pub fn release(&mut self, set: Shared, ip: IpAddr) -> bool {
        count_down(&mut self.shared, &(set, ip))
    }

    /// Count one more user of a load-balancing chain; true when it is the first.
    pub fn use_chain(&mut self, chain: (LbKind, usize)) -> bool {
        count_up(&mut self.lb, chain)
    }

    /// Count one user less of a load-balancing chain; true when it was the last.
    pub fn drop_chain(&mut self, chain: (LbKind, usize)) -> bool {
        count_down(&mut self.lb, &chain)
    }

    /// Rebuild the maps with full nodes, after a whole layout added to them in key order
    /// (see [`super::elements::Elements::compact`]).
    pub fn compact(&mut self) {
        self.records = std::mem::take(&mut self.records).into_iter().collect();
        self.shared = std::mem::take(&mut self.shared).into_iter().collect();
    }

    pub fn insert(&mut self, name: ServicePortName, mut record: Record) {
        // Held until the service port changes: no room to grow.
        record.elements.shrink_to_fit();
        record.shared.shrink_to_fit();
        record.slots.shrink_to_fit();
        record.lb.shrink_to_fit();
        self.no_local.internal += record.no_local.internal;
        self.no_local.external += record.no_local.external;
        self.conflicts += record.conflicts;
        self.records.insert(name, record);
    }

    pub fn remove(&mut self, name: &ServicePortName) -> Option<Record> {
        let r = self.records.remove(name)?;
        self.no_local.internal -= r.no_local.internal;
        self.no_local.external -= r.no_local.external;
        self.conflicts -= r.conflicts;
        Some(r)
    }

    /// The recorded service ports of service `namespace/name`.
    pub fn ports_of(&self, namespace: &str, name: &str) -> Vec<ServicePortName> {
        self.records
            .range(service_start(namespace, name)..)
            .map(|(k, _)| k)
            .take_while(|k| k.is_of(namespace, name))
            .cloned()
            .collect()
    }
}

fn count_up<K: Ord>(counts: &mut BTreeMap<K, usize>, key: K) -> bool {
    let n = counts.entry(key).or_insert(0);
    *n += 1;
    *n == 1
}

/// An unknown key counts as its last holder gone, so its element is removed either way.
fn count_down<K: Ord>(counts: &mut BTreeMap<K, usize>, key: &K) -> bool {
    match counts.get_mut(key) {
        Some(n) if *n > 1 => {
            *n -= 1;
            false
        }
        Some(_) => {
            counts.remove(key);
            true
        }
        None => true,
    }
}

/// The smallest service port name of a service, where a range over its ports starts.
pub fn service_start(namespace: &str, name: &str) -> ServicePortName {
    ServicePortName::new(namespace, name, "", crate::model::Protocol::Tcp)
}

/// Both families' records; an index belongs to the ruleset it was built with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Index {
    pub families: BTreeMap<IpFamily, FamilyIndex>,
}

/// What an in-place update changed in one table: the old value of every element and chain
/// it touched, taken the first time each was touched (`None`: it did not exist).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Touched {
    pub elements: BTreeMap<(&'static str, String), Option<Option<String>>>,
    pub chains: BTreeMap<String, Option<Chain>>,
}

impl Touched {
    /// Puts back in `table` what the update changed, as it was before.
    pub fn undo(&self, table: &mut Table) {
        for ((set, key), old) in &self.elements {
            let Some(s) = table.sets.get_mut(*set) else {
                continue;
            };
            match old {
                Some(value) => {
                    s.elements.insert(key, value.as_deref());
                }
                None => {
                    s.elements.remove(key);
                }
            }
        }
        for (name, old) in &self.chains {
            match old {
                Some(chain) => {
                    table.chains.insert(name.clone(), chain.clone());
                }
                None => {
                    table.chains.remove(name);
                }
            }
        }
    }
}
