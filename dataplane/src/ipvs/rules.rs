//! The iptables rules of IPVS mode (pure), kube-proxy's: they do what IPVS does not, by
//! matching the ipsets ([`super::sets`]) rather than naming services, so they only change
//! with the node's settings. Masquerade is a mark set in nat and applied in
//! POSTROUTING (IPVS keeps conntrack entries for its connections, `net.ipv4.vs.conntrack`);
//! load-balancer source ranges drop in filter; KUBE-IPVS-FILTER refuses new connections to
//! a bound service address on a port no service has, which would otherwise reach the node.

use super::sets::SetName;
use crate::iptables::plan::fixed::{forward_rules, masquerade_marked, nat_jumps};
use crate::iptables::plan::{detector, Chains, FamilyLayout, Jump, TableName, Tables};
use crate::model::{IpFamily, NodeConfig};

pub const SERVICES: &str = "KUBE-SERVICES";
pub const POSTROUTING: &str = "KUBE-POSTROUTING";
pub const MARK_MASQ: &str = "KUBE-MARK-MASQ";
pub const NODE_PORT: &str = "KUBE-NODE-PORT";
pub const LOAD_BALANCER: &str = "KUBE-LOAD-BALANCER";
pub const FORWARD: &str = "KUBE-FORWARD";
pub const PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
pub const SOURCE_RANGES_FIREWALL: &str = "KUBE-SOURCE-RANGES-FIREWALL";
pub const IPVS_FILTER: &str = "KUBE-IPVS-FILTER";

fn comment(text: &str) -> String {
    format!("-m comment --comment \"{text}\"")
}

/// `-m set --match-set NAME FLAGS`.
fn set(s: SetName, family: IpFamily, flags: &str) -> String {
    format!("-m set --match-set {} {flags}", s.name(family))
}

/// One family's chains.
pub fn layout(node: &NodeConfig, family: IpFamily) -> FamilyLayout {
    use SetName::*;
    let m = format!("{:#x}", node.masquerade_mark());
    let f = family;
    let mut nat = Chains::new();
    let mut filter = Chains::new();

    let mut services = vec![format!(
        "{} {} -j {LOAD_BALANCER}",
        comment("Kubernetes service lb portal"),
        set(LoadBalancer, f, "dst,dst")
    )];
    let cluster = format!(
        "{} {}",
        comment("Kubernetes service cluster ip + port for masquerade purpose"),
        set(ClusterIp, f, "dst,dst")
    );
    if node.masquerade_all {
        services.push(format!("{cluster} -j {MARK_MASQ}"));
    } else if let Some((_, not_local)) = detector(node, f) {
        // Traffic to a cluster IP from outside this node's pods may come back through
        // another node; masquerade it.
        services.push(format!("{cluster} {not_local} -j {MARK_MASQ}"));
    } else {
        // No detector: masquerade what the node itself sends from a service address (the
        // kernel picks the bound VIP as the source of a connection to a VIP).
        services.push(format!(
            "{} {} -j {MARK_MASQ}",
            comment("Kubernetes service cluster ip + port for masquerade purpose"),
            set(ClusterIp, f, "src,dst")
        ));
    }
    let ext = format!(
        "{} {}",
        comment("Kubernetes service external ip + port for masquerade and filter purpose"),
        set(ExternalIp, f, "dst,dst")
    );
    services.push(format!("{ext} -j {MARK_MASQ}"));
    let ext_local = format!(
        "{} {}",
        comment("Kubernetes service external ip + port with externalTrafficPolicy=local"),
        set(ExternalIpLocal, f, "dst,dst")
    );
    for e in [&ext, &ext_local] {
        // Traffic from off the node (not bridged, not local) and traffic to an external IP
        // the node holds itself go on to IPVS.
        services.push(format!(
            "{e} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT"
        ));
        services.push(format!("{e} -m addrtype --dst-type LOCAL -j ACCEPT"));
    }
    // Node ports are not served on loopback (IPVS cannot DNAT there): leave it alone
    // rather than masquerade it.
    let loopback = match f {
        IpFamily::V4 => "127.0.0.0/8",
        IpFamily::V6 => "::1/128",
    };
    services.push(format!(
        "-m addrtype --dst-type LOCAL ! -d {loopback} -j {NODE_PORT}"
    ));
    services.push(format!("{} -j ACCEPT", set(ClusterIp, f, "dst,dst")));
    services.push(format!("{} -j ACCEPT", set(LoadBalancer, f, "dst,dst")));
    nat.insert(SERVICES.into(), services);

    nat.insert(
        LOAD_BALANCER.into(),
        vec![
            format!("{} -j RETURN", set(LoadBalancerLocal, f, "dst,dst")),
            format!("-j {MARK_MASQ}"),
        ],
    );
    let mut node_port = Vec::new();
    for (proto, all, local) in [
        ("tcp", NodePortTcp, NodePortLocalTcp),
        ("udp", NodePortUdp, NodePortLocalUdp),
    ] {
        node_port.push(format!("-p {proto} {} -j RETURN", set(local, f, "dst")));
        node_port.push(format!("-p {proto} {} -j {MARK_MASQ}", set(all, f, "dst")));
    }
    nat.insert(NODE_PORT.into(), node_port);
    nat.insert(MARK_MASQ.into(), vec![format!("-j MARK --or-mark {m}")]);
    let mut postrouting = vec![format!(
        "{} {} -j MASQUERADE",
        comment("Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"),
        set(LoopBack, f, "dst,dst,src")
    )];
    postrouting.extend(masquerade_marked(&m));
    nat.insert(POSTROUTING.into(), postrouting);

    filter.insert(FORWARD.into(), forward_rules(&m));
    filter.insert(
        NODE_PORT.into(),
        vec![format!(
            "{} {} -j ACCEPT",
            comment("Kubernetes health check node port"),
            set(HealthCheckNodePort, f, "dst")
        )],
    );
    let mut firewall = vec![
        format!(
            "{} {} -j DROP",
            comment("Local traffic policy, no local endpoint"),
            set(NoLocalEndpoints, f, "dst,dst")
        ),
        format!(
            "{} -j {SOURCE_RANGES_FIREWALL}",
            set(LoadBalancerFw, f, "dst,dst")
        ),
    ];
    // As nftables mode: an address of the service CIDRs that no service holds is dropped.
    for cidr in node
        .service_cidrs
        .iter()
        .filter(|c| IpFamily::of_net(c) == f)
    {
        firewall.push(format!(
            "-d {}/{} {} -m set ! --match-set {} dst -j DROP",
            cidr.network(),
            cidr.prefix(),
            comment("unallocated service address"),
            IpvsIps.name(f)
        ));
    }
    filter.insert(PROXY_FIREWALL.into(), firewall);
    filter.insert(
        SOURCE_RANGES_FIREWALL.into(),
        vec![
            format!(
                "{} -j RETURN",
                set(LoadBalancerSourceCidr, f, "dst,dst,src")
            ),
            format!("{} -j RETURN", set(LoadBalancerSourceIp, f, "dst,dst,src")),
            "-j DROP".into(),
        ],
    );
    let mut ipvs_filter: Vec<String> = [
        (LoadBalancer, "dst,dst"),
        (ClusterIp, "dst,dst"),
        (ExternalIp, "dst,dst"),
        (ExternalIpLocal, "dst,dst"),
        (HealthCheckNodePort, "dst"),
    ]
    .iter()
    .map(|(s, flags)| format!("{} -j RETURN", set(*s, f, flags)))
    .collect();
    ipvs_filter.push(format!(
        "-m conntrack --ctstate NEW {} -j REJECT",
        set(IpvsIps, f, "dst")
    ));
    filter.insert(IPVS_FILTER.into(), ipvs_filter);

    let mut t = Tables::default();
    t.tables.insert(TableName::Nat, nat);
    t.tables.insert(TableName::Filter, filter);
    FamilyLayout {
        fixed: t,
        ..FamilyLayout::default()
    }
}

/// The jumps from the built-in chains.
pub fn jumps() -> Vec<Jump> {
    use TableName::*;
    let j = |table, builtin, rule: String, target| Jump {
        table,
        builtin,
        rule,
        target,
    };
    let new_fw = format!(
        "-m conntrack --ctstate NEW {} -j {PROXY_FIREWALL}",
        comment("kube-proxy firewall rules")
    );
    let mut out = nat_jumps();
    out.extend([
        j(Filter, "INPUT", new_fw.clone(), PROXY_FIREWALL),
        j(
            Filter,
            "INPUT",
            format!(
                "{} -j {NODE_PORT}",
                comment("kubernetes health check rules")
            ),
            NODE_PORT,
        ),
        j(
            Filter,
            "INPUT",
            format!(
                "{} -j {IPVS_FILTER}",
                comment("kubernetes ipvs access filter")
            ),
            IPVS_FILTER,
        ),
        j(
            Filter,
            "FORWARD",
            format!("{} -j {FORWARD}", comment("kubernetes forwarding rules")),
            FORWARD,
        ),
        j(Filter, "FORWARD", new_fw.clone(), PROXY_FIREWALL),
        j(Filter, "OUTPUT", new_fw, PROXY_FIREWALL),
    ]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detector_decides_the_cluster_ip_masquerade() {
        let mut node = crate::synth::node();
        let nat = |node: &NodeConfig| {
            layout(node, IpFamily::V4).fixed.tables[&TableName::Nat][SERVICES].clone()
        };
        assert!(nat(&node)
            .iter()
            .any(|r| r.contains("KUBE-CLUSTER-IP dst,dst ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ")));
        node.masquerade_all = true;
        assert!(nat(&node)
            .iter()
            .any(|r| r.ends_with("KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ")));
        node.masquerade_all = false;
        node.local_detector = crate::model::LocalDetector::None;
        assert!(nat(&node)
            .iter()
            .any(|r| r.contains("KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ")));
        let v6 = layout(&node, IpFamily::V6);
        assert!(v6.fixed.tables[&TableName::Filter][IPVS_FILTER]
            .iter()
            .any(|r| r.contains("KUBE-6-IPVS-IPS dst -j REJECT")));
    }
}
