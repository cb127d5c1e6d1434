//! Pure layout: the nftables tables a snapshot needs, as [`Ruleset`] data.
//!
//! Shared maps keyed by front end and slot replace kube-proxy's chain-per-service layout, so the
//! number of chains depends only on the distinct endpoint counts, and a one-endpoint change
//! touches a few map elements:
//!
//! ```text
//! services:   daddr . proto . dport  vmap @service-ips        -> goto cluster-N | external-N
//!             <node port address>    vmap @service-nodeports  -> goto nodeport-N
//! cluster-N:  [mark for masquerade unless local]  dnat to daddr . proto . dport . numgen mod N map @backends
//! nodeport-N: mark for masquerade                 dnat to proto . dport . numgen mod N map @nodeport-backends
//! external-local-N, nodeport-local-N (externalTrafficPolicy Local):
//!             from pods, or from the node (masqueraded): vmap @shortcut-* -> goto shortcut-M
//!             anything else: dnat to one of the N local endpoints
//! ```
//!
//! Slots are assigned stably against the previous state: an endpoint keeps its slot while it
//! stays, and a removed one's slot is refilled by the last, so a change costs O(changed).

use super::elements::Put;
use super::ownership::{self, FamilyIndex, Index, Record, Shared, Touched};
use super::packed;
use super::sizing;
pub use super::skeleton::{
    cidr_text, MAP_AFFINITY, MAP_AFFINITY_FRONTENDS, MAP_BACKENDS, MAP_NODEPORT_BACKENDS,
    MAP_NODEPORT_SHORTCUT_BACKENDS, MAP_NO_ENDPOINT_NODEPORTS, MAP_NO_ENDPOINT_SERVICES,
    MAP_SERVICE_IPS, MAP_SERVICE_NODEPORTS, MAP_SHORTCUT_BACKENDS, MAP_SHORTCUT_IPS,
    MAP_SHORTCUT_NODEPORTS, SET_CLUSTER_IPS, SET_FIREWALL_ALLOW, SET_FIREWALL_IPS, SET_HAIRPIN,
    SET_NODEPORT_ADDRS, SET_SERVICE_CIDRS,
};
use super::skeleton::{lb_chain, skeleton, LbKind};
use super::slots::{assign_slots, backend_values, previous_slots};
use super::tables::{Ruleset, Set, Table};
use crate::backend::LayoutReport;
use crate::model::{
    disjoint_cidrs, Endpoint, IpFamily, NodeConfig, NodePortAddresses, ServicePort,
    ServicePortName, SessionAffinity, Snapshot, TrafficPolicy,
};
use crate::selection;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;

/// Verdict for a front end whose service has no endpoints at all.
const REJECT: &str = "goto reject-chain";
/// Verdict for a front end whose policy leaves no endpoint (e.g. Local with none here).
const DROP: &str = "drop";

/// One front end of a service port: the key its packets match, where that key goes, and
/// which of the port's endpoint sets serves it.
struct Frontend {
    key: String,
    dispatch: &'static str,
    none: &'static str,
    backends: &'static str,
    kind: LbKind,
    external: bool,
    /// Under externalTrafficPolicy Local: where pods and the node reach every endpoint.
    shortcut: Option<Shortcut>,
    /// A load-balancer IP with loadBalancerSourceRanges: the sources it admits.
    firewall: Option<Vec<String>>,
}

/// The maps and chain kind of a front end's short-circuit to all endpoints.
struct Shortcut {
    dispatch: &'static str,
    backends: &'static str,
    kind: LbKind,
}

/// The sources a load-balancer IP of `svc` admits, if it has loadBalancerSourceRanges in
/// `family`: the ranges, and, when one holds the node's primary address, the load-balancer
/// IPs themselves (a node reaching a VIP bound on itself sends from the VIP).
fn firewall_sources(svc: &ServicePort, node: &NodeConfig, family: IpFamily) -> Option<Vec<String>> {
    let ranges = svc.source_ranges();
    if ranges.is_empty() || svc.load_balancer_ips.is_empty() {
        return None;
    }
    let mut sources = ranges.clone();
    let node_ip = node.primary_ip(family);
    if node_ip.is_some_and(|n| ranges.iter().any(|r| r.contains(n))) {
        sources.extend(
            svc.load_balancer_ips
                .iter()
                .filter(|ip| IpFamily::of(ip) == family)
                .map(|ip| ipnetwork::IpNetwork::from(*ip)),
        );
    }
    Some(
        disjoint_cidrs(&sources, family)
            .iter()
            .map(cidr_text)
            .collect(),
    )
}

/// The front ends of a service port in `family`: its cluster IP, its external and
/// load-balancer IPs, its node port.
fn frontends(svc: &ServicePort, node: &NodeConfig, family: IpFamily) -> Vec<Frontend> {
    let proto = svc.name.protocol;
    let local_policy = svc.external_traffic_policy == TrafficPolicy::Local;
    let mut out = vec![Frontend {
        key: format!("{} . {proto} . {}", svc.cluster_ip, svc.port),
        dispatch: MAP_SERVICE_IPS,
        none: MAP_NO_ENDPOINT_SERVICES,
        backends: MAP_BACKENDS,
        kind: LbKind::Cluster,
        external: false,
        shortcut: None,
        firewall: None,
    }];
    let mut ext_ips: Vec<IpAddr> = svc
        .external_ips
        .iter()
        .chain(svc.load_balancer_ips.iter())
        .copied()
        .filter(|ip| IpFamily::of(ip) == family && *ip != svc.cluster_ip)
        .collect();
    ext_ips.sort();
    ext_ips.dedup();
    let allowed = firewall_sources(svc, node, family);
    for ip in ext_ips {
        out.push(Frontend {
            key: format!("{ip} . {proto} . {}", svc.port),
            dispatch: MAP_SERVICE_IPS,
            none: MAP_NO_ENDPOINT_SERVICES,
            backends: MAP_BACKENDS,
            kind: if local_policy {
                LbKind::ExternalLocal
            } else {
                LbKind::External
            },
            external: true,
            shortcut: local_policy.then_some(Shortcut {
                dispatch: MAP_SHORTCUT_IPS,
                backends: MAP_SHORTCUT_BACKENDS,
                kind: LbKind::Shortcut,
            }),
            firewall: allowed
                .as_ref()
                .filter(|_| svc.load_balancer_ips.contains(&ip))
                .cloned(),
        });
    }
    if svc.node_port != 0 {
        out.push(Frontend {
            key: format!("{proto} . {}", svc.node_port),
            dispatch: MAP_SERVICE_NODEPORTS,
            none: MAP_NO_ENDPOINT_NODEPORTS,
            backends: MAP_NODEPORT_BACKENDS,
            kind: if local_policy {
                LbKind::NodePortLocal
            } else {
                LbKind::NodePort
            },
            external: true,
            shortcut: local_policy.then_some(Shortcut {
                dispatch: MAP_SHORTCUT_NODEPORTS,
                backends: MAP_NODEPORT_SHORTCUT_BACKENDS,
                kind: LbKind::NodePortShortcut,
            }),
            // As in kube-proxy, node ports are not subject to loadBalancerSourceRanges.
            firewall: None,
        });
    }
    out
}

fn is_frontend_map(set: &str) -> bool {
    [
        MAP_SERVICE_IPS,
        MAP_NO_ENDPOINT_SERVICES,
        MAP_SERVICE_NODEPORTS,
        MAP_NO_ENDPOINT_NODEPORTS,
    ]
    .contains(&set)
}

/// In place: what the service ports laid out again held before, until a port claims it
/// again; what is left when all are laid out is taken out ([`Builder::sweep`]). Taking a
/// port out first and putting it back wrote each of its elements twice (and text for each
/// into the transaction's record), where a one-endpoint change alters one or two of them.
#[derive(Default)]
struct Freed {
    /// Elements only they held, by set.
    elements: BTreeMap<&'static str, BTreeSet<String>>,
    /// Backend slots by map and front-end key: the first not claimed again, and how many
    /// there were.
    slots: BTreeMap<&'static str, BTreeMap<String, (usize, usize)>>,
    /// Counts they held of shared elements, passed on as they are to the new layout where it
    /// holds the same (each hold and release was a search of a large tree: an endpoint
    /// change's ten hairpin elements cost twenty), the rest released at the end.
    shared: BTreeMap<(Shared, IpAddr), usize>,
    /// Counts they held of load-balancing chains, released at the end so that what the new
    /// layout holds too is never taken out.
    lb: Vec<(LbKind, usize)>,
}

impl Freed {
    fn holds(&self, set: &str, key: &str) -> bool {
        self.elements
            .get(set)
            .is_some_and(|keys| keys.contains(key))
    }
}

/// Mutable state while laying out one family, from scratch or in place.
struct Builder<'a> {
    node: &'a NodeConfig,
    family: IpFamily,
    table: Table,
    index: FamilyIndex,
    /// Where previous slots are read: the previous table for a layout from scratch; `None`
    /// in place, where the table still holds the slots of the service ports laid out again.
    prev: Option<&'a Table>,
    freed: Freed,
    /// In place: the old value of everything changed, for the transaction.
    touched: Option<Touched>,
    conflicts: Vec<String>,
}

impl<'a> Builder<'a> {
    fn new(node: &'a NodeConfig, family: IpFamily, table: Table, index: FamilyIndex) -> Self {
        Builder {
            node,
            family,
            table,
            index,
            prev: None,
            freed: Freed::default(),
            touched: None,
            conflicts: Vec::new(),
        }
    }

    /// Record what a write in place did to `set`'s `key` (its text built only if it changed
    /// something), unless the key changed earlier in this update.
    fn changed(&mut self, set: &'static str, put: Put, key: impl FnOnce() -> String) {
        let old = match put {
            Put::Unchanged => return,
            Put::Added => None,
            Put::Replaced(old) => Some(old),
        };
        if let Some(t) = self.touched.as_mut() {
            t.elements.entry((set, key())).or_insert(old);
        }
    }

    fn put(&mut self, set: &'static str, key: &str, value: Option<&str>) {
        let Some(s) = self.table.sets.get_mut(set) else {
            return;
        };
        if self.touched.is_none() {
            s.elements.insert(key, value);
            return;
        }
        let put = s.elements.insert_changed(key, value);
        self.changed(set, put, || key.to_string());
    }

    /// [`Builder::put`] of a key and value in their compact form.
    fn put_packed(&mut self, set: &'static str, key: &[u8], value: Option<&[u8]>) {
        let Some(s) = self.table.sets.get_mut(set) else {
            return;
        };
        if self.touched.is_none() {
            s.elements.insert_bytes(key, value);
            return;
        }
        let put = s.elements.insert_changed_packed(key, value);
        self.changed(set, put, || packed::text(key));
    }

    fn take(&mut self, set: &'static str, key: &str) {
        let Some(s) = self.table.sets.get_mut(set) else {
            return;
        };
        if let Some(old) = s.elements.remove(key) {
            self.changed(set, Put::Replaced(old), || key.to_string());
        }
    }

    fn touch_chain(&mut self, name: &str) {
        if let Some(t) = self.touched.as_mut() {
            if !t.chains.contains_key(name) {
                t.chains
                    .insert(name.to_string(), self.table.chains.get(name).cloned());
            }
        }
    }

    /// An element only this service port holds.
    fn put_owned(
        &mut self,
        rec: &mut Record,
        set: &'static str,
        key: String,
        value: Option<String>,
    ) {
        if let Some(keys) = self.freed.elements.get_mut(set) {
            keys.remove(&key);
        }
        self.put(set, &key, value.as_deref());
        rec.elements.push((set, key));
    }

    /// An element other service ports may hold too.
    fn put_shared(&mut self, rec: &mut Record, set: Shared, ip: IpAddr) {
        rec.shared.push((set, ip));
        if let Some(n) = self.freed.shared.get_mut(&(set, ip)) {
            *n -= 1;
            if *n == 0 {
                self.freed.shared.remove(&(set, ip));
            }
            return;
        }
        if self.index.hold(set, ip) {
            self.put(set.set(), &set.key(ip), None);
        }
    }

    fn use_chain(&mut self, rec: &mut Record, kind: LbKind, n: usize) {
        if self.index.use_chain((kind, n)) {
            let name = kind.chain(n);
            self.touch_chain(&name);
            let chain = lb_chain(self.node, self.family, kind, n);
            self.table.chains.insert(name, chain);
        }
        rec.lb.push((kind, n));
    }

    /// Whether another service port holds `set`'s `key`.
    fn taken(&self, set: &str, key: &str) -> bool {
        self.table
            .sets
            .get(set)
            .is_some_and(|s| s.elements.contains_key(key))
            && !self.freed.holds(set, key)
    }

    fn previous(&self, backends: &str) -> Option<&Set> {
        self.prev.unwrap_or(&self.table).sets.get(backends)
    }

    /// The slots of `eps` behind `key` in `backends`, and the load-balancing chain of `kind`
    /// that reads them; returns the verdict that goes there.
    fn slots(
        &mut self,
        rec: &mut Record,
        key: &str,
        backends: &'static str,
        kind: LbKind,
        eps: &[&Endpoint],
    ) -> String {
        // Values as slices of two buffers, not a vector each: fewer allocations.
        let mut wanted_buf = Vec::with_capacity(eps.len() * 8);
        let ends = backend_values(eps, &mut wanted_buf);
        let wanted: Vec<&[u8]> = (0..ends.len())
            .map(|i| &wanted_buf[i.checked_sub(1).map_or(0, |j| ends[j])..ends[i]])
            .collect();
        let mut slot_key = Vec::with_capacity(key.len() + 3);
        packed::pack(key, &mut slot_key);
        let front = slot_key.len();
        let mut prev_buf = Vec::new();
        let prev: Vec<Option<&[u8]>> =
            previous_slots(self.previous(backends), &slot_key, &mut prev_buf)
                .into_iter()
                .map(|r| r.map(|r| &prev_buf[r]))
                .collect();
        let slots = assign_slots(&prev, &wanted);
        let n = slots.len();
        // In place, the table holds `prev`: a slot that keeps its endpoint is left alone.
        let held = if self.prev.is_none() { &prev[..] } else { &[] };
        for (i, v) in slots.iter().enumerate() {
            if held.get(i).is_some_and(|p| *p == Some(*v)) {
                continue;
            }
            slot_key.truncate(front);
            packed::push_number(i, &mut slot_key);
            self.put_packed(backends, &slot_key, Some(v));
        }
        if let Some(held) = self
            .freed
            .slots
            .get_mut(backends)
            .and_then(|keys| keys.get_mut(key))
        {
            held.0 = held.0.max(n);
        }
        rec.slots.push((backends, key.to_string(), n));
        self.use_chain(rec, kind, n);
        format!("goto {}", kind.chain(n))
    }

    /// Program one front end: dispatch element plus its backend slots, or a no-endpoint
    /// verdict. `all` are the endpoints a Local front end short-circuits pods and the node to.
    fn frontend(
        &mut self,
        svc: &ServicePort,
        fe: Frontend,
        eps: &[&Endpoint],
        all: &[&Endpoint],
        has_any: bool,
        rec: &mut Record,
    ) -> bool {
        if self.taken(fe.dispatch, &fe.key) || self.taken(fe.none, &fe.key) {
            rec.conflicts += 1;
            self.conflicts.push(format!(
                "service port {} ({}): front end {} is already used by another service; skipped",
                svc.name, svc.family, fe.key
            ));
            return false;
        }
        if let Some(sources) = &fe.firewall {
            // Whether or not the service has endpoints, as kube-proxy's nftables mode.
            self.put_owned(rec, SET_FIREWALL_IPS, fe.key.clone(), None);
            for src in sources {
                self.put_owned(rec, SET_FIREWALL_ALLOW, format!("{} . {src}", fe.key), None);
            }
        }
        if eps.is_empty() {
            let verdict = if has_any { DROP } else { REJECT };
            self.put_owned(rec, fe.none, fe.key.clone(), Some(verdict.to_string()));
            let Some(sc) = fe.shortcut.as_ref().filter(|_| has_any) else {
                return false;
            };
            // A Local front end with no endpoint here, as kube-proxy's nftables mode: pods
            // and the node still go through its external chain, which short-circuits them
            // to every endpoint (the node masqueraded), so the drop above, checked after
            // DNAT, never sees them; anyone else falls off its end, un-NATed, into it.
            let verdict = self.slots(rec, &fe.key, sc.backends, sc.kind, all);
            self.put_owned(rec, sc.dispatch, fe.key.clone(), Some(verdict));
            self.use_chain(rec, fe.kind, 0);
            self.put_owned(
                rec,
                fe.dispatch,
                fe.key,
                Some(format!("goto {}", fe.kind.chain(0))),
            );
            return true;
        }
        if let Some(sc) = &fe.shortcut {
            let verdict = self.slots(rec, &fe.key, sc.backends, sc.kind, all);
            self.put_owned(rec, sc.dispatch, fe.key.clone(), Some(verdict));
        }
        let verdict = self.slots(rec, &fe.key, fe.backends, fe.kind, eps);
        self.put_owned(rec, fe.dispatch, fe.key, Some(verdict));
        true
    }

    /// sessionAffinity ClientIP: the front ends that remember their clients, keyed as the
    /// packet path sees them after DNAT (`ct original` address, protocol and port); a node
    /// port under each node address that serves it.
    fn affinity_keys(&self, svc: &ServicePort, fe: &Frontend) -> Vec<String> {
        if fe.dispatch != MAP_SERVICE_NODEPORTS {
            return vec![fe.key.clone()];
        }
        self.node
            .node_ips
            .iter()
            .filter(|ip| IpFamily::of(ip) == self.family)
            .filter(|ip| match &self.node.node_port_addresses {
                NodePortAddresses::All => true,
                NodePortAddresses::Cidrs(c) => c.iter().any(|n| n.contains(**ip)),
            })
            .map(|ip| format!("{ip} . {} . {}", svc.name.protocol, svc.node_port))
            .collect()
    }

    fn service(&mut self, svc: &ServicePort, endpoints: &[Endpoint]) {
        let sel = selection::select(self.node, svc, endpoints);
        let has_any = !sel.cluster.is_empty();
        let internal = selection::internal(svc, &sel).to_vec();
        let external = selection::external(svc, &sel).to_vec();
        let mut rec = Record::default();
        if has_any && svc.internal_traffic_policy == TrafficPolicy::Local && internal.is_empty() {
            rec.no_local.internal = 1;
        }
        if has_any
            && svc.external_traffic_policy == TrafficPolicy::Local
            && svc.has_external_frontends()
            && external.is_empty()
        {
            rec.no_local.external = 1;
        }
        self.put_shared(&mut rec, Shared::ClusterIp, svc.cluster_ip);
        let affinity = match svc.session_affinity {
            SessionAffinity::ClientIp { timeout_seconds } => Some(timeout_seconds.max(1) as usize),
            SessionAffinity::None => None,
        };
        let mut remembered = Vec::new();
        for fe in frontends(svc, self.node, self.family) {
            let eps = if fe.external { &external } else { &internal };
            let keys = match affinity {
                Some(_) => self.affinity_keys(svc, &fe),
                None => Vec::new(),
            };
            if self.frontend(svc, fe, eps, &sel.cluster, has_any, &mut rec) {
                remembered.extend(keys);
            }
        }
        if let (Some(secs), false) = (affinity, remembered.is_empty()) {
            self.use_chain(&mut rec, LbKind::Affinity, secs);
            let verdict = format!("goto {}", LbKind::Affinity.chain(secs));
            for key in remembered {
                // A node port's key can equal a front end another service holds only if
                // that service's port, on a node address, equals the node port: the first
                // keeps it, and as a conflict it makes the next change lay out in whole.
                if self.taken(MAP_AFFINITY_FRONTENDS, &key) {
                    rec.conflicts += 1;
                    self.conflicts.push(format!(
                        "service port {} ({}): session affinity for {key} is already kept for another service; skipped",
                        svc.name, svc.family
                    ));
                    continue;
                }
                self.put_owned(&mut rec, MAP_AFFINITY_FRONTENDS, key, Some(verdict.clone()));
            }
        }
        // Hairpin: an endpoint reaching itself through the service must be masqueraded, or
        // it would answer itself directly. Endpoints known to run elsewhere never start here.
        let hairpin: BTreeSet<IpAddr> = sel
            .cluster
            .iter()
            .chain(sel.local.iter())
            .filter(|e| e.node_name.as_deref().is_none_or(|n| n == self.node.name))
            .map(|e| e.ip)
            .collect();
        for ip in hairpin {
            self.put_shared(&mut rec, Shared::Hairpin, ip);
        }
        self.index.insert(svc.name.clone(), rec);
    }

    /// In place: take service port `name` out of the index; what it held stays in the
    /// table, freed, until the layout claims it again or [`Builder::sweep`] takes it out.
    fn free(&mut self, name: &ServicePortName) {
        let Some(rec) = self.index.remove(name) else {
            return;
        };
        for (set, key) in rec.elements {
            self.freed.elements.entry(set).or_default().insert(key);
        }
        for (set, key, n) in rec.slots {
            self.freed.slots.entry(set).or_default().insert(key, (0, n));
        }
        for held in rec.shared {
            *self.freed.shared.entry(held).or_insert(0) += 1;
        }
        self.freed.lb.extend(rec.lb);
    }

    /// Take out what the freed service ports held and the new layout does not.
    fn sweep(&mut self) {
        let freed = std::mem::take(&mut self.freed);
        for (set, keys) in freed.elements {
            for key in keys {
                self.take(set, &key);
            }
        }
        for (set, keys) in freed.slots {
            for (key, (first, n)) in keys {
                for i in first..n {
                    self.take(set, &ownership::slot_key(&key, i));
                }
            }
        }
        for ((set, ip), n) in freed.shared {
            for _ in 0..n {
                if self.index.release(set, ip) {
                    self.take(set.set(), &set.key(ip));
                }
            }
        }
        for (kind, n) in freed.lb {
            if self.index.drop_chain((kind, n)) {
                let name = kind.chain(n);
                self.touch_chain(&name);
                self.table.chains.remove(&name);
            }
        }
    }
}

/// Lay out one family's table from scratch.
fn family_table(
    snapshot: &Snapshot,
    family: IpFamily,
    prev: Option<&Table>,
) -> (Table, FamilyIndex, Vec<String>) {
    let node = &snapshot.node;
    let mut b = Builder::new(node, family, skeleton(node, family), FamilyIndex::default());
    b.prev = prev;
    for net in disjoint_cidrs(&node.service_cidrs, family) {
        b.put(SET_SERVICE_CIDRS, &cidr_text(&net), None);
    }
    if let NodePortAddresses::Cidrs(cidrs) = &node.node_port_addresses {
        for net in disjoint_cidrs(cidrs, family) {
            b.put(SET_NODEPORT_ADDRS, &cidr_text(&net), None);
        }
    }
    for ((name, fam), svc) in &snapshot.services {
        if *fam == family {
            b.service(svc, snapshot.endpoints_of(name));
        }
    }
    for set in b.table.sets.values_mut() {
        set.elements.compact();
    }
    b.index.compact();
    (b.table, b.index, b.conflicts)
}

pub fn report_of(index: &Index, conflicts: Vec<String>) -> LayoutReport {
    let mut report = LayoutReport {
        conflicts,
        ..Default::default()
    };
    for (family, f) in &index.families {
        report.no_local_endpoints.add(*family, f.no_local);
    }
    report
}

/// The complete ruleset for a snapshot, laid out against `previous` for stable slots, with
/// the index of who contributed what.
pub fn layout(snapshot: &Snapshot, previous: &Ruleset) -> (Ruleset, Index, LayoutReport) {
    let mut conflicts = Vec::new();
    let mut rs = Ruleset::default();
    let mut index = Index::default();
    for family in IpFamily::ALL {
        let (t, fi, mut c) = family_table(snapshot, family, previous.table(family));
        rs.tables.insert(family, t);
        index.families.insert(family, fi);
        conflicts.append(&mut c);
    }
    sizing::fit(previous, &mut rs);
    let report = report_of(&index, conflicts);
    (rs, index, report)
}

/// The complete desired ruleset for a snapshot, laid out against `previous` for stable slots.
pub fn desired(snapshot: &Snapshot, previous: &Ruleset) -> (Ruleset, LayoutReport) {
    let (rs, _, report) = layout(snapshot, previous);
    (rs, report)
}

/// The service ports of service `namespace/name` in `snapshot`, in `family`.
fn snapshot_ports<'s>(
    snapshot: &'s Snapshot,
    namespace: &'s str,
    name: &'s str,
    family: IpFamily,
) -> impl Iterator<Item = &'s ServicePort> + 's {
    snapshot
        .services
        .range((ownership::service_start(namespace, name), IpFamily::V4)..)
        .take_while(move |((n, _), _)| n.is_of(namespace, name))
        .filter(move |((_, f), _)| *f == family)
        .map(|(_, svc)| svc)
}

/// Whether the services in `changed` can be laid out again in place in this family: only
/// when no front end is contested, since who wins a contested one depends on every service.
fn updatable(
    snapshot: &Snapshot,
    family: IpFamily,
    table: &Table,
    index: &FamilyIndex,
    changed: &BTreeSet<(String, String)>,
) -> bool {
    if index.conflicts > 0 {
        return false;
    }
    let mut freed: HashSet<(&str, &str)> = HashSet::new();
    for (ns, name) in changed {
        for port in index.ports_of(ns, name) {
            for (set, key) in index
                .records
                .get(&port)
                .into_iter()
                .flat_map(|r| &r.elements)
            {
                if is_frontend_map(set) {
                    freed.insert((set, key.as_str()));
                }
            }
        }
    }
    let mut claimed: HashSet<(&'static str, String)> = HashSet::new();
    for (ns, name) in changed {
        for svc in snapshot_ports(snapshot, ns, name, family) {
            for fe in frontends(svc, &snapshot.node, family) {
                let held = |map: &str| {
                    table
                        .sets
                        .get(map)
                        .is_some_and(|s| s.elements.contains_key(&fe.key))
                        && !freed.contains(&(map, fe.key.as_str()))
                };
                if held(fe.dispatch) || held(fe.none) {
                    return false;
                }
                if !claimed.insert((fe.dispatch, fe.key)) {
                    return false;
                }
            }
        }
    }
    true
}

/// Lay out again, in place, only the services (namespace, name) in `changed`: take out what
/// they contributed and put in what they need now. Returns what was touched in each family,
/// for the transaction; `None`, with nothing changed, when the update cannot be done in place
/// (see [`updatable`]) and a whole layout is needed.
pub fn update(
    snapshot: &Snapshot,
    ruleset: &mut Ruleset,
    index: &mut Index,
    changed: &BTreeSet<(String, String)>,
) -> Option<Vec<(IpFamily, Touched)>> {
    for family in IpFamily::ALL {
        let (Some(table), Some(fi)) = (ruleset.table(family), index.families.get(&family)) else {
            return None;
        };
        if !updatable(snapshot, family, table, fi, changed) {
            return None;
        }
    }
    let mut out = Vec::new();
    for family in IpFamily::ALL {
        let table = ruleset.tables.remove(&family).unwrap_or_default();
        let fi = index.families.remove(&family).unwrap_or_default();
        let mut b = Builder::new(&snapshot.node, family, table, fi);
        b.touched = Some(Touched::default());
        for (ns, name) in changed {
            for port in b.index.ports_of(ns, name) {
                b.free(&port);
            }
        }
        for (ns, name) in changed {
            for svc in snapshot_ports(snapshot, ns, name, family) {
                b.service(svc, snapshot.endpoints_of(&svc.name));
            }
        }
        b.sweep();
        ruleset.tables.insert(family, b.table);
        index.families.insert(family, b.index);
        out.push((family, b.touched.unwrap_or_default()));
    }
    Some(out)
}
