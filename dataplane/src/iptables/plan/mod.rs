//! Pure layout of kube-proxy's iptables mode: a snapshot becomes, per family, the chains
//! of the filter, nat and mangle tables with their rules, in iptables-restore syntax.
//!
//! ```text
//! nat KUBE-SERVICES  -d clusterIP --dport p -j KUBE-SVC-x | KUBE-SVL-x   (ITP)
//!                    -d externalIP|lbIP --dport p -j KUBE-EXT-x
//!                    <node port addresses> -j KUBE-NODEPORTS               (last rule)
//! KUBE-FW-x          (lbIP with loadBalancerSourceRanges) -s range -j KUBE-EXT-x
//! KUBE-EXT-x         mark masquerade (Cluster) | short-circuit pods and the node (Local)
//!                    -j KUBE-SVC-x | KUBE-SVL-x                           (ETP)
//! KUBE-SVC-x         masquerade off-cluster sources; -m statistic 1/n, 1/(n-1).. -j KUBE-SEP-y
//! KUBE-SEP-y         hairpin masquerade; DNAT --to-destination ip:port
//! filter             REJECT "has no endpoints", DROP "has no local endpoints",
//!                    KUBE-PROXY-FIREWALL DROP what KUBE-FW-x did not let through
//! ```
//!
//! The chains every service shares are [`fixed`]'s; this module renders each service
//! port's own rules and puts the two together.

pub mod fixed;

use super::names::{self, *};
use crate::backend::LayoutReport;
use crate::model::disjoint_cidrs;
use crate::model::{
    Endpoint, IpFamily, LocalDetector, NodeConfig, Protocol, ServicePort, ServicePortName,
    SessionAffinity, Snapshot, TrafficPolicy,
};
use crate::selection;
use ipnetwork::IpNetwork;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

/// An iptables table Switchyard writes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TableName {
    Filter,
    Nat,
    Mangle,
}

impl TableName {
    pub const ALL: [TableName; 3] = [TableName::Filter, TableName::Nat, TableName::Mangle];

    pub fn as_str(self) -> &'static str {
        match self {
            TableName::Filter => "filter",
            TableName::Nat => "nat",
            TableName::Mangle => "mangle",
        }
    }

    pub fn parse(s: &str) -> Option<TableName> {
        TableName::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

/// Chains of one table: name to rules, each rule the text after `-A <chain> `.
pub type Chains = BTreeMap<String, Vec<String>>;

/// One family's chains in every table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tables {
    pub tables: BTreeMap<TableName, Chains>,
}

impl Tables {
    pub fn chains(&self, table: TableName) -> Option<&Chains> {
        self.tables.get(&table)
    }
}

/// A rule in a built-in chain that sends packets into ours; added once, at the top.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jump {
    pub table: TableName,
    pub builtin: &'static str,
    /// The rule after `-A <builtin> `, ending in `-j <target>`.
    pub rule: String,
    pub target: &'static str,
}

/// The whole layout: chains per family, the jumps into them, and what was left out.
#[derive(Debug, Clone, Default)]
pub struct Rendered {
    pub families: BTreeMap<IpFamily, FamilyLayout>,
    pub jumps: BTreeMap<IpFamily, Vec<Jump>>,
    pub report: LayoutReport,
}

/// `addr/32` or `addr/128`, as iptables prints a host.
fn host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => format!("{ip}/32"),
        IpAddr::V6(_) => format!("{ip}/128"),
    }
}

fn comment(text: &str) -> String {
    // Names are DNS labels; a quote could only come from a corrupt object, so drop it.
    format!("-m comment --comment \"{}\"", text.replace('"', ""))
}

/// The matches "source is one of this node's pods" and its negation, if a detector is set.
pub(crate) fn detector(node: &NodeConfig, family: IpFamily) -> Option<(String, String)> {
    match &node.local_detector {
        LocalDetector::None => None,
        LocalDetector::Cidrs(cidrs) => {
            // One iptables rule matches one source CIDR; kube-proxy likewise takes one pod
            // CIDR per family. Nested ones are merged first; the first of the rest is used.
            let net: IpNetwork = *disjoint_cidrs(cidrs, family).first()?;
            let text = format!("{}/{}", net.network(), net.prefix());
            Some((format!("-s {text}"), format!("! -s {text}")))
        }
        LocalDetector::Bridge(name) => Some((format!("-i {name}"), format!("! -i {name}"))),
        LocalDetector::InterfacePrefix(p) => Some((format!("-i {p}+"), format!("! -i {p}+"))),
    }
}

/// Probability of the i-th of the remaining `n` endpoints, as kube-proxy prints it.
pub fn probability(n: usize) -> String {
    format!("{:.10}", 1.0 / n as f64)
}

/// A front end of a service port: the address (or node port) it claims, and its rules in
/// the fixed chains. A front end two services claim goes to the first, as in nftables mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frontend {
    pub key: String,
    pub rules: Vec<(TableName, &'static str, String)>,
}

/// Everything one service port contributes to one family's tables: its front ends' rules
/// in the fixed chains and its own nat chains (`KUBE-SVC-`, `-SVL-`, `-EXT-`, `-SEP-`),
/// whose names no other port shares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortRules {
    /// `ns/name:port/proto (family)`, for conflict messages.
    pub label: String,
    pub frontends: Vec<Frontend>,
    /// Rules in fixed chains that claim nothing (the health-check node port).
    pub extra: Vec<(TableName, &'static str, String)>,
    pub chains: Chains,
    pub no_local_internal: bool,
    pub no_local_external: bool,
}

/// One family's layout: the fixed chains, assembled from every port's front ends, and
/// each port's own chains.
#[derive(Debug, Clone, Default)]
pub struct FamilyLayout {
    pub fixed: Tables,
    pub ports: BTreeMap<ServicePortName, PortRules>,
    /// Rendered in kube-proxy's large-cluster mode (see [`large_cluster`]).
    pub large_cluster: bool,
    /// What assembling the fixed chains left out, kept for the syncs that reuse them.
    pub report: LayoutReport,
    /// The fixed chains were moved over unchanged from the layout this one was rendered
    /// from (no changed port's front ends moved), which keeps none of them to compare.
    pub fixed_kept: bool,
}

impl FamilyLayout {
    /// Every chain of the family, table by table, fixed and per port.
    pub fn chains(&self) -> impl Iterator<Item = (TableName, &str, &[String])> + '_ {
        let fixed = self.fixed.tables.iter().flat_map(|(t, chains)| {
            chains
                .iter()
                .map(move |(c, r)| (*t, c.as_str(), r.as_slice()))
        });
        let ports = self.ports.values().flat_map(|p| {
            p.chains
                .iter()
                .map(|(c, r)| (TableName::Nat, c.as_str(), r.as_slice()))
        });
        fixed.chain(ports)
    }

    /// The family's chains as one set of tables.
    pub fn tables(&self) -> Tables {
        let mut t = Tables::default();
        for (table, chain, rules) in self.chains() {
            t.tables
                .entry(table)
                .or_default()
                .insert(chain.to_string(), rules.to_vec());
        }
        t
    }
}

/// Renders the ports of one family.
struct PortRenderer<'a> {
    node: &'a NodeConfig,
    family: IpFamily,
    detector: Option<(String, String)>,
    /// Comments on the endpoint rules (off in large-cluster mode).
    endpoint_comments: bool,
}

impl PortRenderer<'_> {
    fn new(node: &NodeConfig, family: IpFamily, large_cluster: bool) -> PortRenderer<'_> {
        PortRenderer {
            node,
            family,
            detector: detector(node, family),
            endpoint_comments: !large_cluster,
        }
    }

    /// `-m comment --comment "text" ` for an endpoint rule, or nothing in large-cluster mode.
    fn endpoint_comment(&self, text: &str) -> String {
        if self.endpoint_comments {
            format!("{} ", comment(text))
        } else {
            String::new()
        }
    }

    /// The rules from `chain` to `endpoints`, each with an equal share; with session
    /// affinity, a client seen within `affinity` seconds goes back to its endpoint first.
    fn balance(
        &self,
        out: &mut PortRules,
        spn: &str,
        chain: &str,
        endpoints: &[(&Endpoint, String)],
        affinity: Option<u32>,
    ) {
        let n = endpoints.len();
        let rules = out.chains.entry(chain.to_string()).or_default();
        let c = |ep: &Endpoint| {
            self.endpoint_comment(&format!(
                "{spn} -> {}",
                names::endpoint_string(ep.ip, ep.port)
            ))
        };
        if let Some(secs) = affinity {
            for (ep, sep) in endpoints {
                rules.push(format!(
                    "{}-m recent --name {sep} --rcheck --seconds {secs} --reap -j {sep}",
                    c(ep)
                ));
            }
        }
        for (i, (ep, sep)) in endpoints.iter().enumerate() {
            let mut rule = c(ep);
            if i + 1 < n {
                let _ = write!(
                    rule,
                    "-m statistic --mode random --probability {} ",
                    probability(n - i)
                );
            }
            let _ = write!(rule, "-j {sep}");
            rules.push(rule);
        }
    }

    fn endpoint(
        &self,
        out: &mut PortRules,
        svc: &ServicePort,
        spn: &str,
        ep: &Endpoint,
        chain: &str,
    ) {
        if out.chains.contains_key(chain) {
            return;
        }
        let proto = svc.name.protocol;
        let c = self.endpoint_comment(spn);
        // Remember the client for session affinity (the service chain checks the list).
        let remember = match svc.session_affinity {
            SessionAffinity::ClientIp { .. } => format!("-m recent --name {chain} --set "),
            SessionAffinity::None => String::new(),
        };
        // An endpoint reaching itself through the service must be masqueraded, or it
        // would answer itself directly.
        let rules = vec![
            format!("{c}-s {} -j {MARK_MASQ}", host(ep.ip)),
            format!(
                "{c}{remember}-m {proto} -p {proto} -j DNAT --to-destination {}",
                names::endpoint_string(ep.ip, ep.port)
            ),
        ];
        out.chains.insert(chain.to_string(), rules);
    }

    fn port(&self, svc: &ServicePort, all: &[Endpoint]) -> PortRules {
        let mut out = PortRules {
            label: format!("service port {} ({})", svc.name, svc.family),
            ..PortRules::default()
        };
        let spn = names::port_name_string(&svc.name);
        let proto = svc.name.protocol;
        let sel = selection::select(self.node, svc, all);
        let affinity = match svc.session_affinity {
            SessionAffinity::ClientIp { timeout_seconds } => Some(timeout_seconds),
            SessionAffinity::None => None,
        };
        let cluster = with_chains(svc, dedup(&sel.cluster));
        let local = with_chains(svc, dedup(&sel.local));
        let internal_local = svc.internal_traffic_policy == TrafficPolicy::Local;
        let external_local = svc.external_traffic_policy == TrafficPolicy::Local;
        let accessible = svc.has_external_frontends();
        let has_endpoints = !cluster.is_empty();
        let has_internal = has_endpoints && (!internal_local || !local.is_empty());
        let has_external = has_endpoints && (!external_local || !local.is_empty());
        // Pods and the node reach an ETP=Local service through its cluster chain, so the
        // cluster chain exists whenever the service is reachable from outside.
        let uses_cluster = !cluster.is_empty() && (!internal_local || accessible);
        let uses_local = !local.is_empty() && (internal_local || (accessible && external_local));
        let uses_ext = has_endpoints && accessible;

        let svc_chain = cluster_chain(&svc.name);
        let svl_chain = local_chain(&svc.name);
        let ext_chain = external_chain(&svc.name);
        let internal_chain = if internal_local {
            &svl_chain
        } else {
            &svc_chain
        };
        let external_policy = if external_local {
            &svl_chain
        } else {
            &svc_chain
        };

        let (target, filter_comment) = if !has_endpoints {
            ("REJECT", format!("{spn} has no endpoints"))
        } else {
            ("DROP", format!("{spn} has no local endpoints"))
        };
        out.no_local_internal = has_endpoints && !has_internal;
        out.no_local_external = has_endpoints && accessible && !has_external;

        let dst =
            |ip: IpAddr| format!("-m {proto} -p {proto} -d {} --dport {}", host(ip), svc.port);
        let cluster_rule = if has_internal {
            (
                TableName::Nat,
                SERVICES,
                format!(
                    "{} {} -j {internal_chain}",
                    comment(&format!("{spn} cluster IP")),
                    dst(svc.cluster_ip)
                ),
            )
        } else {
            (
                TableName::Filter,
                SERVICES,
                format!(
                    "{} {} -j {target}",
                    comment(&filter_comment),
                    dst(svc.cluster_ip)
                ),
            )
        };
        out.frontends.push(Frontend {
            key: format!("{} {proto} {}", svc.cluster_ip, svc.port),
            rules: vec![cluster_rule],
        });

        let ranges = svc.source_ranges();
        let lb_ips: Vec<IpAddr> = svc
            .load_balancer_ips
            .iter()
            .copied()
            .filter(|ip| IpFamily::of(ip) == self.family)
            .collect();
        let fw_chain = names::firewall_chain(&svc.name);
        let uses_fw = has_endpoints && !lb_ips.is_empty() && !ranges.is_empty();
        if uses_fw {
            let c = comment(&format!("{spn} loadbalancer IP"));
            let mut rules: Vec<String> = ranges
                .iter()
                .map(|r| format!("{c} -s {r} -j {ext_chain}"))
                .collect();
            // A node reaching a VIP bound on itself sends from the VIP.
            let node_ip = self.node.primary_ip(self.family);
            if node_ip.is_some_and(|n| ranges.iter().any(|r| r.contains(n))) {
                rules.extend(
                    lb_ips
                        .iter()
                        .map(|ip| format!("{c} -s {} -j {ext_chain}", host(*ip))),
                );
            }
            out.chains.insert(fw_chain.clone(), rules);
        }

        let mut seen = BTreeSet::from([svc.cluster_ip]);
        let ext_ips = svc.external_ips.iter().map(|ip| (ip, "external IP"));
        let lb_ips = svc
            .load_balancer_ips
            .iter()
            .map(|ip| (ip, "loadbalancer IP"));
        for (ip, what) in ext_ips.chain(lb_ips) {
            if IpFamily::of(ip) != self.family || !seen.insert(*ip) {
                continue;
            }
            let mut rules = Vec::new();
            let firewalled = uses_fw && what == "loadbalancer IP";
            if has_endpoints {
                let to = if firewalled { &fw_chain } else { &ext_chain };
                rules.push((
                    TableName::Nat,
                    SERVICES,
                    format!("{} {} -j {to}", comment(&format!("{spn} {what}")), dst(*ip)),
                ));
            }
            if firewalled {
                // What KUBE-FW-x did not DNAT still has the load-balancer IP here.
                rules.push((
                    TableName::Filter,
                    PROXY_FIREWALL,
                    format!(
                        "{} {} -j DROP",
                        comment(&format!("{spn} traffic not accepted by {fw_chain}")),
                        dst(*ip)
                    ),
                ));
            }
            if !has_external {
                rules.push((
                    TableName::Filter,
                    EXTERNAL_SERVICES,
                    format!("{} {} -j {target}", comment(&filter_comment), dst(*ip)),
                ));
            }
            out.frontends.push(Frontend {
                key: format!("{ip} {proto} {}", svc.port),
                rules,
            });
        }

        if svc.node_port != 0 {
            let mut rules = Vec::new();
            if has_endpoints {
                rules.push((
                    TableName::Nat,
                    NODEPORTS,
                    format!(
                        "{} -m {proto} -p {proto} --dport {} -j {ext_chain}",
                        comment(&spn),
                        svc.node_port
                    ),
                ));
            }
            if !has_external {
                rules.push((
                    TableName::Filter,
                    EXTERNAL_SERVICES,
                    format!(
                        "{} -m addrtype --dst-type LOCAL -m {proto} -p {proto} --dport {} -j {target}",
                        comment(&filter_comment),
                        svc.node_port
                    ),
                ));
            }
            out.frontends.push(Frontend {
                key: format!("{proto} {}", svc.node_port),
                rules,
            });
        }

        if svc.health_check_node_port != 0 {
            out.extra.push((
                TableName::Filter,
                NODEPORTS,
                format!(
                    "{} -m tcp -p tcp --dport {} -j ACCEPT",
                    comment(&format!("{spn} health check node port")),
                    svc.health_check_node_port
                ),
            ));
        }

        if has_internal {
            let masq = if self.node.masquerade_all {
                Some(String::new())
            } else {
                self.detector
                    .as_ref()
                    .map(|(_, not_local)| format!(" {not_local}"))
            };
            if let Some(m) = masq {
                // Off-cluster traffic to the cluster IP may bounce to another node. First
                // in the chain ClusterIP traffic takes (KUBE-SVL under ITP Local).
                out.chains
                    .entry(internal_chain.clone())
                    .or_default()
                    .push(format!(
                        "{} {}{m} -j {MARK_MASQ}",
                        comment(&format!("{spn} cluster IP")),
                        dst(svc.cluster_ip)
                    ));
            }
        }
        if uses_cluster {
            self.balance(&mut out, &spn, &svc_chain, &cluster, affinity);
            for (ep, sep) in &cluster {
                self.endpoint(&mut out, svc, &spn, ep, sep);
            }
        }
        if uses_ext {
            let mut rules = Vec::new();
            if !external_local {
                rules.push(format!(
                    "{} -j {MARK_MASQ}",
                    comment(&format!(
                        "masquerade traffic for {spn} external destinations"
                    ))
                ));
            } else {
                // Pods and the node are subject to neither policy, as if they went out to
                // the load balancer and came back; the node needs masquerade, since the
                // address it would send from is the service's own.
                if let Some((is_local, _)) = &self.detector {
                    rules.push(format!(
                        "{} {is_local} -j {svc_chain}",
                        comment(&format!("pod traffic for {spn} external destinations"))
                    ));
                }
                rules.push(format!(
                    "{} -m addrtype --src-type LOCAL -j {MARK_MASQ}",
                    comment(&format!(
                        "masquerade LOCAL traffic for {spn} external destinations"
                    ))
                ));
                rules.push(format!(
                    "{} -m addrtype --src-type LOCAL -j {svc_chain}",
                    comment(&format!(
                        "route LOCAL traffic for {spn} external destinations"
                    ))
                ));
            }
            if has_external {
                rules.push(format!("-j {external_policy}"));
            }
            out.chains.insert(ext_chain, rules);
        }
        if uses_local {
            out.chains.entry(svl_chain.clone()).or_default();
            self.balance(&mut out, &spn, &svl_chain, &local, affinity);
            for (ep, sep) in &local {
                self.endpoint(&mut out, svc, &spn, ep, sep);
            }
        }
        out
    }
}

/// The ports in `ports` of the services in `services` (as (namespace, name)), looked up.
pub(crate) fn ports_of<'a>(
    ports: &'a BTreeMap<ServicePortName, PortRules>,
    services: &'a BTreeSet<(String, String)>,
) -> impl Iterator<Item = &'a ServicePortName> + 'a {
    services.iter().flat_map(move |(ns, name)| {
        let start = ServicePortName::new(ns, name, "", Protocol::Tcp);
        ports
            .range(start..)
            .take_while(move |(n, _)| n.is_of(ns, name))
            .map(|(n, _)| n)
    })
}

/// Whether a family of `previous` was rendered in another large-cluster mode than
/// `snapshot` needs: every port's rules change then, not only the changed services'.
pub fn mode_changed(snapshot: &Snapshot, previous: &Rendered) -> bool {
    previous
        .families
        .iter()
        .any(|(family, layout)| layout.large_cluster != large_cluster(snapshot, *family))
}

/// Each endpoint with the name of its chain.
fn with_chains<'e>(svc: &ServicePort, eps: Vec<&'e Endpoint>) -> Vec<(&'e Endpoint, String)> {
    eps.into_iter()
        .map(|e| (e, endpoint_chain(&svc.name, e)))
        .collect()
}

/// Endpoints with the same address and port once, in order.
fn dedup<'a>(eps: &[&'a Endpoint]) -> Vec<&'a Endpoint> {
    let mut seen = BTreeSet::new();
    eps.iter()
        .copied()
        .filter(|e| seen.insert((e.ip, e.port)))
        .collect()
}

/// Endpoints above which kube-proxy leaves the comments off the endpoint rules (its
/// "large cluster mode"): they make up most of the rules, and a comment is a match that
/// iptables-nft stores as a 256-byte xtables blob in each rule, which the kernel walks on
/// every commit.
pub const LARGE_CLUSTER_ENDPOINTS: usize = 1000;

/// Whether `family` is rendered in large-cluster mode: the family's service ports have
/// more than [`LARGE_CLUSTER_ENDPOINTS`] endpoints in all, counted as kube-proxy counts them
/// (every endpoint of the family, whatever its conditions).
pub fn large_cluster(snapshot: &Snapshot, family: IpFamily) -> bool {
    let mut total = 0;
    for (name, fam) in snapshot.services.keys() {
        if *fam != family {
            continue;
        }
        total += snapshot
            .endpoints_of(name)
            .iter()
            .filter(|e| IpFamily::of(&e.ip) == family)
            .count();
        if total > LARGE_CLUSTER_ENDPOINTS {
            return true;
        }
    }
    false
}

/// The complete layout of a snapshot.
pub fn render(snapshot: &Snapshot) -> Rendered {
    let mut none = Rendered::default();
    rerender(snapshot, &mut none, None)
}

/// The layout of `snapshot`. With `changed` (the services, as (namespace, name), whose
/// ports or endpoints changed), every other port is moved over from `previous` instead of
/// rendered again, leaving in `previous` only the old rules of the changed ports and the
/// old fixed chains: what the restore input is computed against. The node's configuration
/// must be the one `previous` was rendered with, and so must the large-cluster mode
/// ([`mode_changed`]).
pub fn rerender(
    snapshot: &Snapshot,
    previous: &mut Rendered,
    changed: Option<&BTreeSet<(String, String)>>,
) -> Rendered {
    let node = &snapshot.node;
    let mut out = Rendered::default();
    for family in IpFamily::ALL {
        let large = large_cluster(snapshot, family);
        let r = PortRenderer::new(node, family, large);
        let mut layout = FamilyLayout {
            large_cluster: large,
            ..FamilyLayout::default()
        };
        let render_port = |layout: &mut FamilyLayout, name: &ServicePortName, svc| {
            layout
                .ports
                .insert(name.clone(), r.port(svc, snapshot.endpoints_of(name)));
        };
        let mut reuse_fixed = false;
        match changed {
            None => {
                for ((name, fam), svc) in &snapshot.services {
                    if *fam == family {
                        render_port(&mut layout, name, svc);
                    }
                }
            }
            Some(changed) => {
                let old = previous.families.entry(family).or_default();
                // Only the changed services' ports are looked up and moved back: the rest
                // of the map moves over whole.
                let mut kept = std::mem::take(&mut old.ports);
                for (ns, name) in changed {
                    let start = ServicePortName::new(ns, name, "", Protocol::Tcp);
                    let theirs: Vec<ServicePortName> = kept
                        .range(start..)
                        .take_while(|(n, _)| n.is_of(ns, name))
                        .map(|(n, _)| n.clone())
                        .collect();
                    for n in theirs {
                        if let Some(p) = kept.remove(&n) {
                            old.ports.insert(n, p);
                        }
                    }
                }
                layout.ports = kept;
                for (ns, name) in changed {
                    let start = (
                        ServicePortName::new(ns, name, "", Protocol::Tcp),
                        IpFamily::V4,
                    );
                    for ((spn, fam), svc) in snapshot.services.range(start..) {
                        if !spn.is_of(ns, name) {
                            break;
                        }
                        if *fam == family {
                            render_port(&mut layout, spn, svc);
                        }
                    }
                }
                // An endpoint change leaves the service's front ends as they were: the
                // fixed chains are then the previous ones, moved over instead of assembled
                // again from every port (which would make each sync cost O(services)).
                let same_front = |n: &ServicePortName| match (layout.ports.get(n), old.ports.get(n))
                {
                    (Some(a), Some(b)) => {
                        a.frontends == b.frontends
                            && a.extra == b.extra
                            && a.no_local_internal == b.no_local_internal
                            && a.no_local_external == b.no_local_external
                    }
                    _ => false,
                };
                let unchanged = old.large_cluster == large
                    && old.ports.keys().all(same_front)
                    && ports_of(&layout.ports, changed).all(same_front);
                if unchanged {
                    layout.fixed = std::mem::take(&mut old.fixed);
                    layout.report = std::mem::take(&mut old.report);
                    layout.fixed_kept = true;
                    reuse_fixed = true;
                }
            }
        }
        if !reuse_fixed {
            fixed::assemble(node, family, &mut layout);
        }
        out.report
            .conflicts
            .extend(layout.report.conflicts.iter().cloned());
        out.report
            .no_local_endpoints
            .merge(&layout.report.no_local_endpoints);
        out.families.insert(family, layout);
        out.jumps.insert(family, fixed::jumps(node, family));
    }
    out
}
