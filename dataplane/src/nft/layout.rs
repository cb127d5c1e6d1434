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
//! ```
//!
//! Slots are assigned stably against the previous state: an endpoint keeps its slot while it
//! stays, and a removed one's slot is refilled by the last, so a change costs O(changed).

use super::state::{Chain, Ruleset, Set, Table};
use crate::model::{
    Endpoint, IpFamily, LocalDetector, NodeConfig, NodePortAddresses, ServicePort, Snapshot,
    TrafficPolicy,
};
use crate::selection;
use ipnetwork::IpNetwork;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

pub const SET_CLUSTER_IPS: &str = "cluster-ips";
pub const SET_SERVICE_CIDRS: &str = "service-cidrs";
pub const SET_NODEPORT_ADDRS: &str = "nodeport-addrs";
pub const SET_HAIRPIN: &str = "hairpin";
pub const MAP_SERVICE_IPS: &str = "service-ips";
pub const MAP_SERVICE_NODEPORTS: &str = "service-nodeports";
pub const MAP_NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
pub const MAP_NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
pub const MAP_BACKENDS: &str = "backends";
pub const MAP_NODEPORT_BACKENDS: &str = "nodeport-backends";

/// Verdict for a front end whose service has no endpoints at all.
const REJECT: &str = "goto reject-chain";
/// Verdict for a front end whose policy leaves no endpoint (e.g. Local with none here).
const DROP: &str = "drop";

/// Service ports with endpoints but none local, per policy (kube-proxy's `traffic_policy`
/// label).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoLocalEndpoints {
    pub internal: usize,
    pub external: usize,
}

/// What the layout had to leave out, for logs and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayoutReport {
    /// One line per skipped front end, naming the service that lost it.
    pub conflicts: Vec<String>,
    /// Service ports with endpoints but none usable under their Local policy.
    pub no_local_endpoints: NoLocalEndpoints,
}

/// Family-specific words.
struct Words {
    fam: &'static str,
    addr_type: &'static str,
    loopback: &'static str,
}

fn words(family: IpFamily) -> Words {
    match family {
        IpFamily::V4 => Words {
            fam: "ip",
            addr_type: "ipv4_addr",
            loopback: "127.0.0.0/8",
        },
        IpFamily::V6 => Words {
            fam: "ip6",
            addr_type: "ipv6_addr",
            loopback: "::1",
        },
    }
}

/// Canonical element text of a CIDR: a host prefix prints as the bare address, as nft lists it.
pub fn cidr_text(net: &IpNetwork) -> String {
    let full = match net {
        IpNetwork::V4(_) => 32,
        IpNetwork::V6(_) => 128,
    };
    if net.prefix() == full {
        net.ip().to_string()
    } else {
        format!("{}/{}", net.network(), net.prefix())
    }
}

/// CIDRs of one family with duplicates and nested ranges removed (nft rejects overlaps).
pub fn disjoint_cidrs(nets: &[IpNetwork], family: IpFamily) -> Vec<IpNetwork> {
    let mut of_family: Vec<IpNetwork> = nets
        .iter()
        .filter(|n| IpFamily::of_net(n) == family)
        .map(|n| match IpNetwork::new(n.network(), n.prefix()) {
            Ok(canon) => canon,
            Err(_) => *n,
        })
        .collect();
    of_family.sort_by_key(|n| n.prefix());
    let mut kept: Vec<IpNetwork> = Vec::new();
    for n in of_family {
        if !kept.iter().any(|k| k.contains(n.network())) {
            kept.push(n);
        }
    }
    kept.sort_by(|a, b| {
        a.network()
            .cmp(&b.network())
            .then(a.prefix().cmp(&b.prefix()))
    });
    kept
}

fn set(map: bool, decl: String) -> Set {
    let fingerprint = super::state::fingerprint(&decl);
    Set {
        map,
        decl,
        fingerprint,
        elements: BTreeMap::new(),
    }
}

/// Rule that sends non-local traffic to mark-for-masquerade in a cluster-N chain, if any.
fn masquerade_rule(node: &NodeConfig, family: IpFamily) -> Option<String> {
    let w = words(family);
    if node.masquerade_all {
        return Some("jump mark-for-masquerade".to_string());
    }
    match &node.local_detector {
        LocalDetector::None => None,
        LocalDetector::Cidrs(cidrs) => {
            let cidrs = disjoint_cidrs(cidrs, family);
            match cidrs.as_slice() {
                [] => None,
                [one] => Some(format!(
                    "{} saddr != {} jump mark-for-masquerade",
                    w.fam,
                    cidr_text(one)
                )),
                many => Some(format!(
                    "{} saddr != {{ {} }} jump mark-for-masquerade",
                    w.fam,
                    many.iter().map(cidr_text).collect::<Vec<_>>().join(", ")
                )),
            }
        }
        LocalDetector::Bridge(name) => Some(format!(
            "iifname != \"{}\" jump mark-for-masquerade",
            name.replace('"', "")
        )),
        LocalDetector::InterfacePrefix(prefix) => Some(format!(
            "iifname != \"{}*\" jump mark-for-masquerade",
            prefix.replace('"', "")
        )),
    }
}

/// The match that selects packets to a node-port address.
fn nodeport_match(node: &NodeConfig, family: IpFamily) -> String {
    let w = words(family);
    match node.node_port_addresses {
        NodePortAddresses::All => {
            format!("fib daddr type local {} daddr != {}", w.fam, w.loopback)
        }
        NodePortAddresses::Cidrs(_) => format!(
            "fib daddr type local {} daddr != {} {} daddr @{SET_NODEPORT_ADDRS}",
            w.fam, w.loopback, w.fam
        ),
    }
}

/// The table skeleton: sets, maps and the chains that do not depend on services.
fn skeleton(node: &NodeConfig, family: IpFamily) -> Table {
    let w = words(family);
    let at = w.addr_type;
    let mark = node.masquerade_mark();
    let mut t = Table::default();
    let fe_key = format!("{at} . inet_proto . inet_service");
    let np_key = "inet_proto . inet_service".to_string();
    let sets = [
        (SET_CLUSTER_IPS, false, format!("type {at};")),
        (SET_SERVICE_CIDRS, false, format!("type {at}; flags interval;")),
        (SET_NODEPORT_ADDRS, false, format!("type {at}; flags interval;")),
        (SET_HAIRPIN, false, format!("type {at} . {at};")),
        (MAP_SERVICE_IPS, true, format!("type {fe_key} : verdict;")),
        (MAP_SERVICE_NODEPORTS, true, format!("type {np_key} : verdict;")),
        (MAP_NO_ENDPOINT_SERVICES, true, format!("type {fe_key} : verdict;")),
        (MAP_NO_ENDPOINT_NODEPORTS, true, format!("type {np_key} : verdict;")),
        // typeof, not type: numgen yields a plain integer, which no named type matches. The
        // value says `tcp dport`, not `th dport`: nft 1.0.6 cannot re-evaluate a `th` value
        // type loaded from the kernel ("conflicting protocols specified: ip vs. th"), which
        // breaks every later rule that uses the map. Both are inet_service.
        (
            MAP_BACKENDS,
            true,
            format!(
                "typeof {f} daddr . meta l4proto . th dport . numgen random mod 1 : {f} daddr . tcp dport;",
                f = w.fam
            ),
        ),
        (
            MAP_NODEPORT_BACKENDS,
            true,
            format!(
                "typeof meta l4proto . th dport . numgen random mod 1 : {f} daddr . tcp dport;",
                f = w.fam
            ),
        ),
    ];
    for (name, map, decl) in sets {
        t.sets.insert(name.to_string(), set(map, decl));
    }

    let base = |kind: &str, hook: &str, prio: i32| {
        Some(format!(
            "type {kind} hook {hook} priority {prio}; policy accept;"
        ))
    };
    let mut chain = |name: &str, hook: Option<String>, rules: Vec<String>| {
        t.chains.insert(name.to_string(), Chain::new(hook, rules));
    };
    let new = "ct state new";
    chain(
        "filter-forward",
        base("filter", "forward", -110),
        vec![
            format!("{new} jump service-endpoints-check"),
            format!("{new} jump cluster-ips-check"),
        ],
    );
    chain(
        "filter-input",
        base("filter", "input", -110),
        vec![
            format!("{new} jump nodeport-endpoints-check"),
            format!("{new} jump service-endpoints-check"),
        ],
    );
    chain(
        "filter-output",
        base("filter", "output", -110),
        vec![format!("{new} jump service-endpoints-check")],
    );
    // After nat-output's DNAT, so only packets that were not DNATed are checked.
    chain(
        "filter-output-post-dnat",
        base("filter", "output", -90),
        vec![format!("{new} jump cluster-ips-check")],
    );
    chain(
        "nat-prerouting",
        base("nat", "prerouting", -100),
        vec!["jump services".into()],
    );
    chain(
        "nat-output",
        base("nat", "output", -100),
        vec!["jump services".into()],
    );
    chain(
        "nat-postrouting",
        base("nat", "postrouting", 100),
        vec!["jump masquerading".into()],
    );
    chain(
        "services",
        None,
        vec![
            format!(
                "{} daddr . meta l4proto . th dport vmap @{MAP_SERVICE_IPS}",
                w.fam
            ),
            format!(
                "{} meta l4proto . th dport vmap @{MAP_SERVICE_NODEPORTS}",
                nodeport_match(node, family)
            ),
        ],
    );
    chain(
        "cluster-ips-check",
        None,
        vec![
            format!("{} daddr @{SET_CLUSTER_IPS} reject", w.fam),
            format!("{} daddr @{SET_SERVICE_CIDRS} drop", w.fam),
        ],
    );
    chain(
        "service-endpoints-check",
        None,
        vec![format!(
            "{} daddr . meta l4proto . th dport vmap @{MAP_NO_ENDPOINT_SERVICES}",
            w.fam
        )],
    );
    chain(
        "nodeport-endpoints-check",
        None,
        vec![format!(
            "{} meta l4proto . th dport vmap @{MAP_NO_ENDPOINT_NODEPORTS}",
            nodeport_match(node, family)
        )],
    );
    chain("reject-chain", None, vec!["reject".into()]);
    chain(
        "mark-for-masquerade",
        None,
        vec![format!("meta mark set meta mark | {mark:#010x}")],
    );
    chain(
        "masquerading",
        None,
        vec![
            format!(
                "ct status dnat {f} saddr . {f} daddr @{SET_HAIRPIN} meta mark set meta mark | {mark:#010x}",
                f = w.fam
            ),
            format!("meta mark & {mark:#010x} == 0 return"),
            format!("meta mark set meta mark ^ {mark:#010x}"),
            "masquerade fully-random".into(),
        ],
    );
    t
}

/// Which kind of load-balancing chain a front end jumps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum LbKind {
    Cluster,
    External,
    ExternalLocal,
    NodePort,
    NodePortLocal,
}

impl LbKind {
    fn chain(self, n: usize) -> String {
        let kind = match self {
            LbKind::Cluster => "cluster",
            LbKind::External => "external",
            LbKind::ExternalLocal => "external-local",
            LbKind::NodePort => "nodeport",
            LbKind::NodePortLocal => "nodeport-local",
        };
        format!("{kind}-{n}")
    }
}

fn lb_chain(node: &NodeConfig, family: IpFamily, kind: LbKind, n: usize) -> Chain {
    let f = words(family).fam;
    let mut rules = Vec::new();
    match kind {
        LbKind::Cluster => rules.extend(masquerade_rule(node, family)),
        LbKind::External | LbKind::NodePort => rules.push("jump mark-for-masquerade".into()),
        // Local policy keeps the client address: no masquerade.
        LbKind::ExternalLocal | LbKind::NodePortLocal => {}
    }
    let dnat = match kind {
        LbKind::NodePort | LbKind::NodePortLocal => format!(
            "dnat {f} to meta l4proto . th dport . numgen random mod {n} map @{MAP_NODEPORT_BACKENDS}"
        ),
        _ => format!(
            "dnat {f} to {f} daddr . meta l4proto . th dport . numgen random mod {n} map @{MAP_BACKENDS}"
        ),
    };
    rules.push(dnat);
    Chain::new(None, rules)
}

/// Slot assignment that keeps endpoints where they were.
///
/// `previous[i]` is what slot `i` held; the result has one slot per distinct wanted value.
pub fn assign_slots(previous: &[Option<String>], wanted: &[String]) -> Vec<String> {
    let wanted_set: BTreeSet<&String> = wanted.iter().collect();
    let n = wanted_set.len();
    let mut slots: Vec<Option<String>> = vec![None; n];
    let mut placed: BTreeSet<&String> = BTreeSet::new();
    for (i, prev) in previous.iter().enumerate().take(n) {
        if let Some(v) = prev {
            if wanted_set.contains(v) && !placed.contains(v) {
                slots[i] = Some(v.clone());
                placed.insert(v);
            }
        }
    }
    let mut fresh: BTreeSet<&String> = BTreeSet::new();
    let mut rest = wanted
        .iter()
        .filter(|v| !placed.contains(v) && fresh.insert(*v));
    // Exactly n distinct values fill exactly n slots, so `rest` never runs dry.
    slots
        .into_iter()
        .filter_map(|s| s.or_else(|| rest.next().cloned()))
        .collect()
}

/// Previous slot contents of one front end, read from a backends map.
fn previous_slots(prev: Option<&Set>, prefix: &str) -> Vec<Option<String>> {
    let Some(set) = prev else {
        return Vec::new();
    };
    let start = format!("{prefix} . ");
    let mut out: Vec<Option<String>> = Vec::new();
    for (key, value) in set.elements.range(start.clone()..) {
        let Some(slot) = key.strip_prefix(&start) else {
            break;
        };
        if let (Ok(i), Some(v)) = (slot.parse::<usize>(), value) {
            if i < 1 << 16 {
                if out.len() <= i {
                    out.resize(i + 1, None);
                }
                out[i] = Some(v.clone());
            }
        }
    }
    out
}

fn backend_value(e: &Endpoint) -> String {
    format!("{} . {}", e.ip, e.port)
}

/// Mutable state while laying out one family.
struct Builder<'a> {
    node: &'a NodeConfig,
    family: IpFamily,
    table: Table,
    prev: Option<&'a Table>,
    lb: BTreeSet<(LbKind, usize)>,
    report: LayoutReport,
}

impl<'a> Builder<'a> {
    fn insert(&mut self, set: &str, key: String, value: Option<String>) {
        if let Some(s) = self.table.sets.get_mut(set) {
            s.elements.insert(key, value);
        }
    }

    fn taken(&self, set: &str, key: &str) -> bool {
        self.table
            .sets
            .get(set)
            .is_some_and(|s| s.elements.contains_key(key))
    }

    /// Program one front end: dispatch element plus its backend slots, or a no-endpoint verdict.
    #[allow(clippy::too_many_arguments)]
    fn frontend(
        &mut self,
        svc: &ServicePort,
        key: String,
        dispatch_map: &str,
        none_map: &str,
        backends_map: &str,
        kind: LbKind,
        eps: &[&Endpoint],
        has_any: bool,
    ) {
        if self.taken(dispatch_map, &key) || self.taken(none_map, &key) {
            self.report.conflicts.push(format!(
                "service port {} ({}): front end {key} is already used by another service; skipped",
                svc.name, svc.family
            ));
            return;
        }
        if eps.is_empty() {
            let verdict = if has_any { DROP } else { REJECT };
            self.insert(none_map, key, Some(verdict.to_string()));
            return;
        }
        let wanted: Vec<String> = eps.iter().map(|e| backend_value(e)).collect();
        let prev = previous_slots(self.prev.and_then(|t| t.sets.get(backends_map)), &key);
        let slots = assign_slots(&prev, &wanted);
        for (i, v) in slots.into_iter().enumerate() {
            self.insert(backends_map, format!("{key} . {i}"), Some(v));
        }
        self.lb.insert((kind, eps.len()));
        self.insert(
            dispatch_map,
            key,
            Some(format!("goto {}", kind.chain(eps.len()))),
        );
    }

    fn service(&mut self, svc: &ServicePort, endpoints: &[Endpoint]) {
        let sel = selection::select(self.node, svc, endpoints);
        let has_any = !sel.cluster.is_empty();
        let proto = svc.name.protocol;
        let internal = selection::internal(svc, &sel).to_vec();
        let external = selection::external(svc, &sel).to_vec();
        let local_policy = svc.external_traffic_policy == TrafficPolicy::Local;
        if has_any && svc.internal_traffic_policy == TrafficPolicy::Local && internal.is_empty() {
            self.report.no_local_endpoints.internal += 1;
        }
        if has_any && local_policy && svc.has_external_frontends() && external.is_empty() {
            self.report.no_local_endpoints.external += 1;
        }

        self.insert(SET_CLUSTER_IPS, svc.cluster_ip.to_string(), None);
        self.frontend(
            svc,
            format!("{} . {proto} . {}", svc.cluster_ip, svc.port),
            MAP_SERVICE_IPS,
            MAP_NO_ENDPOINT_SERVICES,
            MAP_BACKENDS,
            LbKind::Cluster,
            &internal,
            has_any,
        );
        let ext_kind = if local_policy {
            LbKind::ExternalLocal
        } else {
            LbKind::External
        };
        let mut ext_ips: Vec<IpAddr> = svc
            .external_ips
            .iter()
            .chain(svc.load_balancer_ips.iter())
            .copied()
            .filter(|ip| IpFamily::of(ip) == self.family && *ip != svc.cluster_ip)
            .collect();
        ext_ips.sort();
        ext_ips.dedup();
        for ip in ext_ips {
            self.frontend(
                svc,
                format!("{ip} . {proto} . {}", svc.port),
                MAP_SERVICE_IPS,
                MAP_NO_ENDPOINT_SERVICES,
                MAP_BACKENDS,
                ext_kind,
                &external,
                has_any,
            );
        }
        if svc.node_port != 0 {
            let kind = if local_policy {
                LbKind::NodePortLocal
            } else {
                LbKind::NodePort
            };
            self.frontend(
                svc,
                format!("{proto} . {}", svc.node_port),
                MAP_SERVICE_NODEPORTS,
                MAP_NO_ENDPOINT_NODEPORTS,
                MAP_NODEPORT_BACKENDS,
                kind,
                &external,
                has_any,
            );
        }
        // Hairpin: an endpoint reaching itself through the service must be masqueraded, or
        // it would answer itself directly. Endpoints known to run elsewhere never start here.
        let node_name = self.node.name.clone();
        for e in sel.cluster.iter().chain(sel.local.iter()) {
            let elsewhere = e.node_name.as_deref().is_some_and(|n| n != node_name);
            if !elsewhere {
                self.insert(SET_HAIRPIN, format!("{} . {}", e.ip, e.ip), None);
            }
        }
    }
}

/// Lay out one family's table.
fn family_table(
    snapshot: &Snapshot,
    family: IpFamily,
    prev: Option<&Table>,
    report: &mut LayoutReport,
) -> Table {
    let node = &snapshot.node;
    let mut b = Builder {
        node,
        family,
        table: skeleton(node, family),
        prev,
        lb: BTreeSet::new(),
        report: LayoutReport::default(),
    };
    for net in disjoint_cidrs(&node.service_cidrs, family) {
        b.insert(SET_SERVICE_CIDRS, cidr_text(&net), None);
    }
    if let NodePortAddresses::Cidrs(cidrs) = &node.node_port_addresses {
        for net in disjoint_cidrs(cidrs, family) {
            b.insert(SET_NODEPORT_ADDRS, cidr_text(&net), None);
        }
    }
    for ((name, fam), svc) in &snapshot.services {
        if *fam == family {
            b.service(svc, snapshot.endpoints_of(name));
        }
    }
    for (kind, n) in std::mem::take(&mut b.lb) {
        b.table
            .chains
            .insert(kind.chain(n), lb_chain(node, family, kind, n));
    }
    report.conflicts.append(&mut b.report.conflicts);
    report.no_local_endpoints.internal += b.report.no_local_endpoints.internal;
    report.no_local_endpoints.external += b.report.no_local_endpoints.external;
    b.table
}

/// The complete desired ruleset for a snapshot, laid out against `previous` for stable slots.
pub fn desired(snapshot: &Snapshot, previous: &Ruleset) -> (Ruleset, LayoutReport) {
    let mut report = LayoutReport::default();
    let mut rs = Ruleset::default();
    for family in IpFamily::ALL {
        let t = family_table(snapshot, family, previous.table(family), &mut report);
        rs.tables.insert(family, t);
    }
    (rs, report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn slots_keep_their_endpoints_and_holes_are_refilled() {
        let prev = vec![Some("a".into()), Some("b".into()), Some("c".into())];
        // b leaves: c, the last, moves into b's slot; a stays.
        assert_eq!(assign_slots(&prev, &s(&["a", "c"])), s(&["a", "c"]));
        // d joins: appended, nothing moves.
        assert_eq!(
            assign_slots(&prev, &s(&["a", "b", "c", "d"])),
            s(&["a", "b", "c", "d"])
        );
        // a replaced by z: z takes slot 0.
        assert_eq!(
            assign_slots(&prev, &s(&["b", "c", "z"])),
            s(&["z", "b", "c"])
        );
        assert_eq!(assign_slots(&[], &s(&["x", "y"])), s(&["x", "y"]));
        // The same backend twice is one slot.
        assert_eq!(assign_slots(&[], &s(&["x", "x", "y"])), s(&["x", "y"]));
        assert_eq!(assign_slots(&prev, &s(&["c", "c"])), s(&["c"]));
    }

    #[test]
    fn cidrs_are_made_disjoint_per_family() {
        let nets: Vec<IpNetwork> = [
            "10.0.0.0/8",
            "10.1.0.0/16",
            "192.168.0.2/32",
            "fd00::/64",
            "10.0.0.0/8",
        ]
        .iter()
        .map(|n| n.parse().unwrap())
        .collect();
        let v4: Vec<String> = disjoint_cidrs(&nets, IpFamily::V4)
            .iter()
            .map(cidr_text)
            .collect();
        assert_eq!(v4, s(&["10.0.0.0/8", "192.168.0.2"]));
        let v6: Vec<String> = disjoint_cidrs(&nets, IpFamily::V6)
            .iter()
            .map(cidr_text)
            .collect();
        assert_eq!(v6, s(&["fd00::/64"]));
    }
}
