//! Pure layout of kube-proxy's iptables mode: a snapshot becomes, per family, the chains
//! of the filter, nat and mangle tables with their rules, in iptables-restore syntax.
//!
//! ```text
//! nat KUBE-SERVICES  -d clusterIP --dport p -j KUBE-SVC-x | KUBE-SVL-x   (ITP)
//!                    -d externalIP|lbIP --dport p -j KUBE-EXT-x
//!                    <node port addresses> -j KUBE-NODEPORTS               (last rule)
//! KUBE-EXT-x         mark masquerade (Cluster) | short-circuit pods and the node (Local)
//!                    -j KUBE-SVC-x | KUBE-SVL-x                           (ETP)
//! KUBE-SVC-x         masquerade off-cluster sources; -m statistic 1/n, 1/(n-1).. -j KUBE-SEP-y
//! KUBE-SEP-y         hairpin masquerade; DNAT --to-destination ip:port
//! filter             REJECT "has no endpoints", DROP "has no local endpoints"
//! ```

use super::names::{self, *};
use crate::model::{
    Endpoint, IpFamily, LocalDetector, NodeConfig, NodePortAddresses, ServicePort, Snapshot,
    TrafficPolicy,
};
use crate::nft::layout::{disjoint_cidrs, LayoutReport};
use crate::selection;
use ipnetwork::IpNetwork;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};

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

    pub fn chain_count(&self) -> usize {
        self.tables.values().map(BTreeMap::len).sum()
    }

    pub fn rule_count(&self) -> usize {
        self.tables
            .values()
            .flat_map(|c| c.values())
            .map(Vec::len)
            .sum()
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
    pub families: BTreeMap<IpFamily, Tables>,
    pub jumps: BTreeMap<IpFamily, Vec<Jump>>,
    pub report: LayoutReport,
}

/// Whether NodePorts are served on 127.0.0.1, which needs `route_localnet` and kube-proxy's
/// rule against martian packets (IPv6 never serves them on ::1).
pub fn localhost_node_ports(node: &NodeConfig) -> bool {
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    node.localhost_node_ports
        && match &node.node_port_addresses {
            NodePortAddresses::All => true,
            NodePortAddresses::Cidrs(c) => c.iter().any(|n| n.contains(loopback)),
        }
}

const NEW: &str = "-m conntrack --ctstate NEW";

/// The jumps from the built-in chains, in the order they should appear at the top.
pub fn jumps(node: &NodeConfig, family: IpFamily) -> Vec<Jump> {
    use TableName::*;
    let j = |table, builtin, rule: String, target| Jump {
        table,
        builtin,
        rule,
        target,
    };
    let c = |text: &str| format!("-m comment --comment \"{text}\"");
    let fw = format!(
        "{NEW} {} -j {PROXY_FIREWALL}",
        c("kubernetes load balancer firewall")
    );
    let portals = format!("{NEW} {} -j {SERVICES}", c("kubernetes service portals"));
    let external = format!(
        "{NEW} {} -j {EXTERNAL_SERVICES}",
        c("kubernetes externally-visible service portals")
    );
    let mut out = vec![
        j(Filter, "INPUT", fw.clone(), PROXY_FIREWALL),
        j(
            Filter,
            "INPUT",
            format!(
                "{} -j {NODEPORTS}",
                c("kubernetes health check service ports")
            ),
            NODEPORTS,
        ),
        j(Filter, "INPUT", external.clone(), EXTERNAL_SERVICES),
        j(Filter, "FORWARD", fw.clone(), PROXY_FIREWALL),
        j(
            Filter,
            "FORWARD",
            format!("{} -j {FORWARD}", c("kubernetes forwarding rules")),
            FORWARD,
        ),
        j(Filter, "FORWARD", portals.clone(), SERVICES),
        j(Filter, "FORWARD", external, EXTERNAL_SERVICES),
        j(Filter, "OUTPUT", fw, PROXY_FIREWALL),
        j(Filter, "OUTPUT", portals, SERVICES),
        j(
            Nat,
            "OUTPUT",
            format!("{} -j {SERVICES}", c("kubernetes service portals")),
            SERVICES,
        ),
        j(
            Nat,
            "PREROUTING",
            format!("{} -j {SERVICES}", c("kubernetes service portals")),
            SERVICES,
        ),
        j(
            Nat,
            "POSTROUTING",
            format!("{} -j {POSTROUTING}", c("kubernetes postrouting rules")),
            POSTROUTING,
        ),
    ];
    if family == IpFamily::V4 && localhost_node_ports(node) {
        for builtin in ["INPUT", "OUTPUT"] {
            out.push(j(
                Filter,
                builtin,
                format!("-j {KUBELET_FIREWALL}"),
                KUBELET_FIREWALL,
            ));
        }
    }
    out
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
fn detector(node: &NodeConfig, family: IpFamily) -> Option<(String, String)> {
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

/// Mutable state while laying out one family.
struct Builder<'a> {
    node: &'a NodeConfig,
    family: IpFamily,
    mark: String,
    detector: Option<(String, String)>,
    nat: Chains,
    filter: Chains,
    /// nat KUBE-SERVICES, KUBE-NODEPORTS and filter chains are appended in service order.
    claimed: BTreeSet<String>,
    conflicts: Vec<String>,
    report: LayoutReport,
}

fn push(chains: &mut Chains, chain: &str, rule: String) {
    chains.entry(chain.to_string()).or_default().push(rule);
}

impl Builder<'_> {
    /// Claim a front end (`ip proto port` or `proto nodeport`); false if another service has it.
    fn claim(&mut self, svc: &ServicePort, key: String) -> bool {
        if self.claimed.insert(key.clone()) {
            return true;
        }
        self.conflicts.push(format!(
            "service port {} ({}): front end {key} is already used by another service; skipped",
            svc.name, svc.family
        ));
        false
    }

    /// The rules from `chain` to `endpoints`, each with an equal share.
    fn balance(&mut self, svc: &ServicePort, spn: &str, chain: &str, endpoints: &[&Endpoint]) {
        let n = endpoints.len();
        let rules = self.nat.entry(chain.to_string()).or_default();
        for (i, ep) in endpoints.iter().enumerate() {
            let mut rule = comment(&format!(
                "{spn} -> {}",
                names::endpoint_string(ep.ip, ep.port)
            ));
            if i + 1 < n {
                let _ = write!(
                    rule,
                    " -m statistic --mode random --probability {}",
                    probability(n - i)
                );
            }
            let _ = write!(rule, " -j {}", endpoint_chain(&svc.name, ep));
            rules.push(rule);
        }
    }

    fn endpoint(&mut self, svc: &ServicePort, spn: &str, ep: &Endpoint) {
        let proto = svc.name.protocol;
        let c = comment(spn);
        let chain = endpoint_chain(&svc.name, ep);
        // An endpoint reaching itself through the service must be masqueraded, or it
        // would answer itself directly.
        let rules = vec![
            format!("{c} -s {} -j {MARK_MASQ}", host(ep.ip)),
            format!(
                "{c} -m {proto} -p {proto} -j DNAT --to-destination {}",
                names::endpoint_string(ep.ip, ep.port)
            ),
        ];
        self.nat.insert(chain, rules);
    }

    fn service(&mut self, svc: &ServicePort, all: &[Endpoint]) {
        let spn = names::port_name_string(&svc.name);
        let proto = svc.name.protocol;
        let sel = selection::select(self.node, svc, all);
        let cluster = dedup(&sel.cluster);
        let local = dedup(&sel.local);
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

        let (int_target, int_comment, ext_target, ext_comment) = if !has_endpoints {
            let c = format!("{spn} has no endpoints");
            ("REJECT", c.clone(), "REJECT", c)
        } else {
            let c = format!("{spn} has no local endpoints");
            ("DROP", c.clone(), "DROP", c)
        };
        if has_endpoints && !has_internal {
            self.report.no_local_endpoints.internal += 1;
        }
        if has_endpoints && accessible && !has_external {
            self.report.no_local_endpoints.external += 1;
        }

        let dst =
            |ip: IpAddr| format!("-m {proto} -p {proto} -d {} --dport {}", host(ip), svc.port);
        if self.claim(svc, format!("{} {proto} {}", svc.cluster_ip, svc.port)) {
            if has_internal {
                push(
                    &mut self.nat,
                    SERVICES,
                    format!(
                        "{} {} -j {internal_chain}",
                        comment(&format!("{spn} cluster IP")),
                        dst(svc.cluster_ip)
                    ),
                );
            } else {
                push(
                    &mut self.filter,
                    SERVICES,
                    format!(
                        "{} {} -j {int_target}",
                        comment(&int_comment),
                        dst(svc.cluster_ip)
                    ),
                );
            }
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
            if !self.claim(svc, format!("{ip} {proto} {}", svc.port)) {
                continue;
            }
            if has_endpoints {
                push(
                    &mut self.nat,
                    SERVICES,
                    format!(
                        "{} {} -j {ext_chain}",
                        comment(&format!("{spn} {what}")),
                        dst(*ip)
                    ),
                );
            }
            if !has_external {
                push(
                    &mut self.filter,
                    EXTERNAL_SERVICES,
                    format!("{} {} -j {ext_target}", comment(&ext_comment), dst(*ip)),
                );
            }
        }

        if svc.node_port != 0 && self.claim(svc, format!("{proto} {}", svc.node_port)) {
            if has_endpoints {
                push(
                    &mut self.nat,
                    NODEPORTS,
                    format!(
                        "{} -m {proto} -p {proto} --dport {} -j {ext_chain}",
                        comment(&spn),
                        svc.node_port
                    ),
                );
            }
            if !has_external {
                push(
                    &mut self.filter,
                    EXTERNAL_SERVICES,
                    format!(
                        "{} -m addrtype --dst-type LOCAL -m {proto} -p {proto} --dport {} -j {ext_target}",
                        comment(&ext_comment),
                        svc.node_port
                    ),
                );
            }
        }

        if svc.health_check_node_port != 0 {
            push(
                &mut self.filter,
                NODEPORTS,
                format!(
                    "{} -m tcp -p tcp --dport {} -j ACCEPT",
                    comment(&format!("{spn} health check node port")),
                    svc.health_check_node_port
                ),
            );
        }

        let mut reachable: Vec<&Endpoint> = Vec::new();
        if uses_cluster {
            let masq = if self.node.masquerade_all {
                Some(String::new())
            } else {
                self.detector
                    .as_ref()
                    .map(|(_, not_local)| format!(" {not_local}"))
            };
            let rules = self.nat.entry(svc_chain.clone()).or_default();
            if let Some(m) = masq {
                // Off-cluster traffic to the cluster IP may bounce to another node.
                rules.push(format!(
                    "{} {}{m} -j {MARK_MASQ}",
                    comment(&format!("{spn} cluster IP")),
                    dst(svc.cluster_ip)
                ));
            }
            self.balance(svc, &spn, &svc_chain, &cluster);
            reachable.extend(&cluster);
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
            self.nat.insert(ext_chain.clone(), rules);
        }
        if uses_local {
            self.nat.insert(svl_chain.clone(), Vec::new());
            self.balance(svc, &spn, &svl_chain, &local);
            reachable.extend(&local);
        }
        for ep in reachable {
            self.endpoint(svc, &spn, ep);
        }
    }

    /// The rule(s) at the end of nat KUBE-SERVICES that send node-port traffic on.
    fn nodeport_tail(&mut self) {
        let c =
            comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain");
        let loopback = match self.family {
            IpFamily::V6 => Some("::1/128"),
            IpFamily::V4 if !self.node.localhost_node_ports => Some("127.0.0.0/8"),
            IpFamily::V4 => None,
        };
        match &self.node.node_port_addresses {
            NodePortAddresses::All => {
                let not_loopback = loopback.map(|l| format!(" ! -d {l}")).unwrap_or_default();
                push(
                    &mut self.nat,
                    SERVICES,
                    format!("{c} -m addrtype --dst-type LOCAL{not_loopback} -j {NODEPORTS}"),
                )
            }
            // Local addresses inside each CIDR: the same set kube-proxy resolves to node
            // IPs, without a resync when an address comes or goes.
            NodePortAddresses::Cidrs(cidrs) => {
                let cidrs = disjoint_cidrs(cidrs, self.family);
                if let Some(l) = loopback {
                    // A rule takes one -d, so loopback is excluded by returning first.
                    let net: Option<IpNetwork> = l.parse().ok();
                    if net.is_some_and(|n| cidrs.iter().any(|c| c.contains(n.ip()))) {
                        push(&mut self.nat, SERVICES, format!("{c} -d {l} -j RETURN"));
                    }
                }
                for net in cidrs {
                    push(
                        &mut self.nat,
                        SERVICES,
                        format!(
                            "{c} -d {}/{} -m addrtype --dst-type LOCAL -j {NODEPORTS}",
                            net.network(),
                            net.prefix()
                        ),
                    );
                }
            }
        }
    }
}

/// Endpoints with the same address and port once, in order.
fn dedup<'a>(eps: &[&'a Endpoint]) -> Vec<&'a Endpoint> {
    let mut seen = BTreeSet::new();
    eps.iter()
        .copied()
        .filter(|e| seen.insert((e.ip, e.port)))
        .collect()
}

fn family_tables(snapshot: &Snapshot, family: IpFamily) -> (Tables, LayoutReport) {
    let node = &snapshot.node;
    let mark = format!("{:#x}", node.masquerade_mark());
    let mut b = Builder {
        node,
        family,
        detector: detector(node, family),
        mark,
        nat: Chains::new(),
        filter: Chains::new(),
        claimed: BTreeSet::new(),
        conflicts: Vec::new(),
        report: LayoutReport::default(),
    };
    for chain in [SERVICES, NODEPORTS, CANARY] {
        b.nat.insert(chain.to_string(), Vec::new());
    }
    for chain in [
        SERVICES,
        EXTERNAL_SERVICES,
        NODEPORTS,
        PROXY_FIREWALL,
        CANARY,
    ] {
        b.filter.insert(chain.to_string(), Vec::new());
    }
    let m = b.mark.clone();
    b.nat.insert(
        POSTROUTING.into(),
        vec![
            format!("-m mark ! --mark {m}/{m} -j RETURN"),
            format!("-j MARK --xor-mark {m}"),
            format!(
                "{} -j MASQUERADE --random-fully",
                comment("kubernetes service traffic requiring SNAT")
            ),
        ],
    );
    b.nat
        .insert(MARK_MASQ.into(), vec![format!("-j MARK --or-mark {m}")]);
    b.filter.insert(
        FORWARD.into(),
        vec![
            format!(
                "{} -m mark --mark {m}/{m} -j ACCEPT",
                comment("kubernetes forwarding rules")
            ),
            format!(
                "{} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                comment("kubernetes forwarding conntrack rule")
            ),
        ],
    );
    if family == IpFamily::V4 && localhost_node_ports(node) {
        // route_localnet lets remote hosts reach 127.0.0.1 services (issue 90259); kube-proxy
        // and kubelet both install this guard.
        b.filter.insert(
            KUBELET_FIREWALL.into(),
            vec![format!(
                "{} -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
                comment("block incoming localnet connections")
            )],
        );
    }
    for ((name, fam), svc) in &snapshot.services {
        if *fam == family {
            b.service(svc, snapshot.endpoints_of(name));
        }
    }
    b.nodeport_tail();
    let mut report = b.report;
    report.conflicts = b.conflicts;
    let mut tables = Tables::default();
    tables.tables.insert(TableName::Filter, b.filter);
    tables.tables.insert(TableName::Nat, b.nat);
    tables.tables.insert(
        TableName::Mangle,
        Chains::from([(CANARY.to_string(), Vec::new())]),
    );
    (tables, report)
}

/// The complete layout of a snapshot.
pub fn render(snapshot: &Snapshot) -> Rendered {
    let mut out = Rendered::default();
    for family in IpFamily::ALL {
        let (tables, report) = family_tables(snapshot, family);
        out.families.insert(family, tables);
        out.jumps.insert(family, jumps(&snapshot.node, family));
        out.report.conflicts.extend(report.conflicts);
        out.report.no_local_endpoints.internal += report.no_local_endpoints.internal;
        out.report.no_local_endpoints.external += report.no_local_endpoints.external;
    }
    out
}
