//! The chains that exist whatever the services (KUBE-SERVICES, KUBE-NODEPORTS,
//! KUBE-FORWARD, the firewall and masquerade chains), the jumps into them from the
//! built-in chains, and their assembly from every service port's front ends.

use super::{comment, Chains, FamilyLayout, Jump, TableName, Tables};
use crate::backend::{LayoutReport, NoLocalEndpoints};
use crate::iptables::names::{
    CANARY, EXTERNAL_SERVICES, FORWARD, KUBELET_FIREWALL, MARK_MASQ, NODEPORTS, POSTROUTING,
    PROXY_FIREWALL, SERVICES,
};
use crate::model::{disjoint_cidrs, IpFamily, NodeConfig, NodePortAddresses};
use ipnetwork::IpNetwork;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

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

/// The nat table's jumps, the same in iptables and IPVS mode: service portals from
/// OUTPUT and PREROUTING, masquerading from POSTROUTING.
pub(crate) fn nat_jumps() -> Vec<Jump> {
    let j = |builtin, rule: String, target| Jump {
        table: TableName::Nat,
        builtin,
        rule,
        target,
    };
    let portals = format!("{} -j {SERVICES}", comment("kubernetes service portals"));
    vec![
        j("OUTPUT", portals.clone(), SERVICES),
        j("PREROUTING", portals, SERVICES),
        j(
            "POSTROUTING",
            format!(
                "{} -j {POSTROUTING}",
                comment("kubernetes postrouting rules")
            ),
            POSTROUTING,
        ),
    ]
}

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
    ];
    out.extend(nat_jumps());
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

/// KUBE-POSTROUTING's rules, both modes: masquerade what carries the mark `m`, clearing it
/// (a packet re-entering the stack must not be masqueraded twice).
pub(crate) fn masquerade_marked(m: &str) -> Vec<String> {
    vec![
        format!("-m mark ! --mark {m}/{m} -j RETURN"),
        format!("-j MARK --xor-mark {m}"),
        format!(
            "{} -j MASQUERADE --random-fully",
            comment("kubernetes service traffic requiring SNAT")
        ),
    ]
}

/// KUBE-FORWARD's rules, both modes: accept what we marked and what is established.
pub(crate) fn forward_rules(m: &str) -> Vec<String> {
    vec![
        format!(
            "{} -m mark --mark {m}/{m} -j ACCEPT",
            comment("kubernetes forwarding rules")
        ),
        format!(
            "{} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            comment("kubernetes forwarding conntrack rule")
        ),
    ]
}

/// The chains that do not depend on any service, empty where services add to them.
fn fixed_chains(node: &NodeConfig, family: IpFamily) -> Tables {
    let m = format!("{:#x}", node.masquerade_mark());
    let mut nat = Chains::new();
    let mut filter = Chains::new();
    for chain in [SERVICES, NODEPORTS, CANARY] {
        nat.insert(chain.to_string(), Vec::new());
    }
    for chain in [
        SERVICES,
        EXTERNAL_SERVICES,
        NODEPORTS,
        PROXY_FIREWALL,
        CANARY,
    ] {
        filter.insert(chain.to_string(), Vec::new());
    }
    nat.insert(POSTROUTING.into(), masquerade_marked(&m));
    nat.insert(MARK_MASQ.into(), vec![format!("-j MARK --or-mark {m}")]);
    filter.insert(FORWARD.into(), forward_rules(&m));
    if family == IpFamily::V4 && localhost_node_ports(node) {
        // route_localnet lets remote hosts reach 127.0.0.1 services (issue 90259); kube-proxy
        // and kubelet both install this guard.
        filter.insert(
            KUBELET_FIREWALL.into(),
            vec![format!(
                "{} -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
                comment("block incoming localnet connections")
            )],
        );
    }
    let mut t = Tables::default();
    t.tables.insert(TableName::Filter, filter);
    t.tables.insert(TableName::Nat, nat);
    t.tables.insert(
        TableName::Mangle,
        Chains::from([(CANARY.to_string(), Vec::new())]),
    );
    t
}

/// The rule(s) at the end of nat KUBE-SERVICES that send node-port traffic on.
fn nodeport_tail(node: &NodeConfig, family: IpFamily) -> Vec<String> {
    let c = comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain");
    let loopback = match family {
        IpFamily::V6 => Some("::1/128"),
        IpFamily::V4 if !node.localhost_node_ports => Some("127.0.0.0/8"),
        IpFamily::V4 => None,
    };
    match &node.node_port_addresses {
        NodePortAddresses::All => {
            let not_loopback = loopback.map(|l| format!(" ! -d {l}")).unwrap_or_default();
            vec![format!(
                "{c} -m addrtype --dst-type LOCAL{not_loopback} -j {NODEPORTS}"
            )]
        }
        // Local addresses inside each CIDR: the same set kube-proxy resolves to node IPs,
        // without a resync when an address comes or goes.
        NodePortAddresses::Cidrs(cidrs) => {
            let cidrs = disjoint_cidrs(cidrs, family);
            let mut out = Vec::new();
            if let Some(l) = loopback {
                // A rule takes one -d, so loopback is excluded by returning first.
                let net: Option<IpNetwork> = l.parse().ok();
                let overlaps = |n: IpNetwork| {
                    cidrs
                        .iter()
                        .any(|c| c.contains(n.network()) || n.contains(c.network()))
                };
                if net.is_some_and(overlaps) {
                    out.push(format!("{c} -d {l} -j RETURN"));
                }
            }
            for net in cidrs {
                out.push(format!(
                    "{c} -d {}/{} -m addrtype --dst-type LOCAL -j {NODEPORTS}",
                    net.network(),
                    net.prefix()
                ));
            }
            out
        }
    }
}

/// The fixed chains with every port's front ends, in port order; a front end already
/// claimed is left out and reported.
pub(super) fn assemble(node: &NodeConfig, family: IpFamily, layout: &mut FamilyLayout) {
    let report = &mut layout.report;
    *report = LayoutReport::default();
    let mut fixed = fixed_chains(node, family);
    let mut claimed: BTreeSet<&str> = BTreeSet::new();
    for port in layout.ports.values() {
        report.no_local_endpoints.add(
            family,
            NoLocalEndpoints {
                internal: usize::from(port.no_local_internal),
                external: usize::from(port.no_local_external),
            },
        );
        for fe in &port.frontends {
            if !claimed.insert(fe.key.as_str()) {
                report.conflicts.push(format!(
                    "{}: front end {} is already used by another service; skipped",
                    port.label, fe.key
                ));
                continue;
            }
            for (table, chain, rule) in &fe.rules {
                push(&mut fixed, *table, chain, rule.clone());
            }
        }
        for (table, chain, rule) in &port.extra {
            push(&mut fixed, *table, chain, rule.clone());
        }
    }
    for rule in nodeport_tail(node, family) {
        push(&mut fixed, TableName::Nat, SERVICES, rule);
    }
    layout.fixed = fixed;
}

fn push(t: &mut Tables, table: TableName, chain: &str, rule: String) {
    t.tables
        .entry(table)
        .or_default()
        .entry(chain.to_string())
        .or_default()
        .push(rule);
}
