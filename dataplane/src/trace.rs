//! What happens to one packet, and why: the decisions the programmed rules make (front end,
//! source ranges, endpoint selection and traffic policy, masquerade), taken on the snapshot
//! the rules are rendered from, for each mode. Pure; `switchyard trace` prints it, and the
//! conformance cases check that its verdicts agree with what real packets do.

use crate::iptables::plan::fixed::localhost_node_ports;
use crate::model::disjoint_cidrs;
use crate::model::{
    Endpoint, IpFamily, LocalDetector, NodeConfig, NodePortAddresses, Protocol, ServicePort,
    SessionAffinity, Snapshot, TrafficPolicy,
};
use crate::selection;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

/// Which kube-proxy mode's rules decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Nftables,
    Iptables,
    Ipvs,
}

/// Where the packet starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A pod on this node (enters through prerouting from a pod interface).
    Pod,
    /// A process on the node using a node address (output).
    Node,
    /// A process on the node using the loopback address (output).
    Localhost,
    /// A client off the node, arriving on the uplink (prerouting).
    External,
}

impl Origin {
    /// The usual origin of a source address: loopback, a node address, else a pod when
    /// the local-traffic detector says so, else outside.
    pub fn infer(node: &NodeConfig, src: IpAddr) -> Origin {
        if src.is_loopback() {
            Origin::Localhost
        } else if node.node_ips.contains(&src) {
            Origin::Node
        } else if match &node.local_detector {
            LocalDetector::Cidrs(c) => c.iter().any(|n| n.contains(src)),
            _ => false,
        } {
            Origin::Pod
        } else {
            Origin::External
        }
    }

    fn on_the_node(self) -> bool {
        matches!(self, Origin::Node | Origin::Localhost)
    }
}

/// One packet: source, destination and where it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    pub source: IpAddr,
    pub destination: SocketAddr,
    pub protocol: Protocol,
    pub origin: Origin,
}

/// What the rules do with it.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// DNAT to one of `endpoints`, each with its probability.
    Dnat {
        endpoints: Vec<(SocketAddr, f64)>,
        /// Whether every connection is masqueraded.
        masquerade: bool,
        /// An endpoint that is the source itself, when `masquerade` is false: the one
        /// connection masqueraded anyway, or it would answer itself (hairpin).
        hairpin: Option<SocketAddr>,
    },
    Reject,
    Drop,
    Accept,
}

/// The verdict and the decisions that led to it, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    pub verdict: Verdict,
    pub steps: Vec<String>,
}

/// Which front end of a service port a packet hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frontend {
    ClusterIp,
    ExternalIp,
    LoadBalancerIp,
    NodePort,
}

/// Whether the local-traffic detector counts the packet as from this node's pods.
fn detected_local(node: &NodeConfig, p: &Packet) -> bool {
    match &node.local_detector {
        LocalDetector::None => false,
        LocalDetector::Cidrs(c) => disjoint_cidrs(c, IpFamily::of(&p.source))
            .iter()
            .any(|n| n.contains(p.source)),
        // Interface matches: only what arrives on a pod interface.
        LocalDetector::Bridge(_) | LocalDetector::InterfacePrefix(_) => p.origin == Origin::Pod,
    }
}

fn serves_node_ports(node: &NodeConfig, mode: Mode, dst: IpAddr) -> bool {
    if dst.is_loopback() {
        return mode == Mode::Iptables && dst.is_ipv4() && localhost_node_ports(node);
    }
    node.node_ips.contains(&dst)
        && match &node.node_port_addresses {
            NodePortAddresses::All => true,
            NodePortAddresses::Cidrs(c) => c.iter().any(|n| n.contains(dst)),
        }
}

fn find<'a>(s: &'a Snapshot, mode: Mode, p: &Packet) -> Option<(&'a ServicePort, Frontend)> {
    let family = IpFamily::of(&p.destination.ip());
    let (dst, port) = (p.destination.ip(), p.destination.port());
    let ports = || {
        s.services
            .iter()
            .filter(move |((n, f), _)| *f == family && n.protocol == p.protocol)
            .map(|(_, svc)| svc)
    };
    // Service addresses first, node ports last, as the rules are ordered.
    ports()
        .find_map(|svc| {
            if svc.port != port {
                None
            } else if svc.cluster_ip == dst {
                Some((svc, Frontend::ClusterIp))
            } else if svc.external_ips.contains(&dst) {
                Some((svc, Frontend::ExternalIp))
            } else if svc.load_balancer_ips.contains(&dst) {
                Some((svc, Frontend::LoadBalancerIp))
            } else {
                None
            }
        })
        .or_else(|| {
            serves_node_ports(&s.node, mode, dst)
                .then(|| {
                    ports()
                        .find(|svc| svc.node_port == port)
                        .map(|svc| (svc, Frontend::NodePort))
                })
                .flatten()
        })
}

/// iptables mode filters a node port whose service has no endpoints for outside traffic in
/// filter INPUT on every local address (`-m addrtype --dst-type LOCAL`), whatever
/// nodePortAddresses and localhostNodePorts say, as kube-proxy's iptables proxier.go does
/// (`syncProxyRules`, "Capture nodeports", the `!hasExternalEndpoints` rule in
/// KUBE-EXTERNAL-SERVICES): rejected when the service has no endpoints at all, else dropped.
/// This is what meets a node-port packet to a local address the nat rules did not capture.
fn iptables_node_port_filter(s: &Snapshot, mode: Mode, p: &Packet) -> Option<(Verdict, String)> {
    let dst = p.destination.ip();
    if mode != Mode::Iptables || !(dst.is_loopback() || s.node.node_ips.contains(&dst)) {
        return None;
    }
    let family = IpFamily::of(&dst);
    let port = p.destination.port();
    s.services.iter().find_map(|((name, f), svc)| {
        if *f != family || name.protocol != p.protocol || svc.node_port != port {
            return None;
        }
        let sel = selection::select(&s.node, svc, s.endpoints_of(&svc.name));
        let has_any = !sel.cluster.is_empty();
        let has_external = match svc.external_traffic_policy {
            TrafficPolicy::Local => !sel.local.is_empty(),
            TrafficPolicy::Cluster => has_any,
        };
        if has_external {
            return None;
        }
        let (verdict, what) = if has_any {
            (Verdict::Drop, "no endpoint on this node: dropped")
        } else {
            (Verdict::Reject, "no usable endpoints: rejected")
        };
        Some((
            verdict,
            format!(
                "node port {port} of {} on a local address its nat rules do not serve: the filter's rule for every local address meets it, {what}",
                svc.name
            ),
        ))
    })
}

fn dnat(eps: &[&Endpoint], masquerade: bool, src: IpAddr) -> Verdict {
    let n = eps.len() as f64;
    Verdict::Dnat {
        endpoints: eps
            .iter()
            .map(|e| (SocketAddr::new(e.ip, e.port), 1.0 / n))
            .collect(),
        // An endpoint reaching itself is masqueraded, or it would answer itself.
        masquerade: masquerade || eps.iter().all(|e| e.ip == src),
        hairpin: eps
            .iter()
            .find(|e| !masquerade && e.ip == src && eps.len() > 1)
            .map(|e| SocketAddr::new(e.ip, e.port)),
    }
}

/// Trace `p` through the rules `mode` renders for `s`.
pub fn trace(s: &Snapshot, mode: Mode, p: &Packet) -> Trace {
    let mut steps = Vec::new();
    let node = &s.node;
    let local = detected_local(node, p);
    steps.push(format!(
        "packet {} -> {}/{} from {:?}{}",
        p.source,
        p.destination,
        p.protocol,
        p.origin,
        if local {
            ", local traffic by the detector"
        } else {
            ""
        }
    ));
    let Some((svc, fe)) = find(s, mode, p) else {
        let dst = p.destination.ip();
        let verdict = if let Some((verdict, why)) = iptables_node_port_filter(s, mode, p) {
            steps.push(why);
            verdict
        } else if s.services.values().any(|v| v.cluster_ip == dst) {
            steps.push(format!(
                "{dst} is a cluster IP, but no service port matches"
            ));
            match mode {
                // IPVS mode: KUBE-IPVS-FILTER, for a bound address on a port no service has.
                Mode::Nftables | Mode::Ipvs => Verdict::Reject,
                Mode::Iptables => Verdict::Accept,
            }
        } else if node.service_cidrs.iter().any(|c| c.contains(dst)) {
            steps.push(format!(
                "{dst} is in a ServiceCIDR but allocated to nothing"
            ));
            match mode {
                Mode::Nftables | Mode::Ipvs => Verdict::Drop,
                Mode::Iptables => Verdict::Accept,
            }
        } else {
            steps.push("no service front end matches: not touched".into());
            Verdict::Accept
        };
        return Trace { verdict, steps };
    };
    steps.push(format!("front end: {} {fe:?}", svc.name));
    let sel = selection::select(node, svc, s.endpoints_of(&svc.name));
    let has_any = !sel.cluster.is_empty();

    if fe == Frontend::LoadBalancerIp {
        let ranges = svc.source_ranges();
        if !ranges.is_empty() {
            let node_in_range = node
                .primary_ip(svc.family)
                .is_some_and(|n| ranges.iter().any(|r| r.contains(n)));
            let allowed = ranges.iter().any(|r| r.contains(p.source))
                || (node_in_range && svc.load_balancer_ips.contains(&p.source));
            // kube-proxy's IPVS proxier.go (`iptablesJumpChain`) filters source ranges in
            // filter INPUT and FORWARD only; IPVS takes the node's own packet in LOCAL_OUT.
            let unfiltered = mode == Mode::Ipvs && p.origin.on_the_node();
            if unfiltered && !allowed {
                steps.push(format!(
                    "{} is outside loadBalancerSourceRanges, but IPVS meets the node's own packet before the range filter in INPUT and FORWARD: not filtered",
                    p.source
                ));
            }
            if !allowed && !unfiltered && (mode != Mode::Iptables || has_any) {
                let shown: Vec<String> = ranges.iter().map(|r| r.to_string()).collect();
                steps.push(format!(
                    "{} is outside loadBalancerSourceRanges {}: dropped",
                    p.source,
                    shown.join(", ")
                ));
                return Trace {
                    verdict: Verdict::Drop,
                    steps,
                };
            }
        }
    }
    let dst = p.destination.ip();
    let outside = !(dst.is_loopback() || node.node_ips.contains(&dst));
    if !has_any
        && mode == Mode::Iptables
        && p.origin.on_the_node()
        && outside
        && matches!(fe, Frontend::ExternalIp | Frontend::LoadBalancerIp)
    {
        // kube-proxy's iptables proxier.go puts this reject in KUBE-EXTERNAL-SERVICES, which
        // only filter INPUT and FORWARD jump to (`iptablesJumpChains`).
        steps.push("the service has no usable endpoints, but iptables mode rejects that in filter INPUT and FORWARD, which a packet the node sends to an outside address never crosses: not touched".into());
        return Trace {
            verdict: Verdict::Accept,
            steps,
        };
    }
    if !has_any {
        steps.push("the service has no usable endpoints: rejected".into());
        return Trace {
            verdict: Verdict::Reject,
            steps,
        };
    }
    if let SessionAffinity::ClientIp { timeout_seconds } = svc.session_affinity {
        steps.push(format!(
            "sessionAffinity ClientIP: a client seen within {timeout_seconds} s returns to its endpoint"
        ));
    }
    let masq_internal =
        node.masquerade_all || (!matches!(node.local_detector, LocalDetector::None) && !local);
    let verdict = match fe {
        Frontend::ClusterIp => {
            let eps = selection::internal(svc, &sel);
            if eps.is_empty() && mode == Mode::Ipvs && p.origin.on_the_node() {
                steps.push("internalTrafficPolicy Local and no endpoint on this node: IPVS meets the node's packet before the filter and refuses it (a virtual service without real servers)".into());
                Verdict::Reject
            } else if eps.is_empty() {
                steps.push(
                    "internalTrafficPolicy Local and no endpoint on this node: dropped".into(),
                );
                Verdict::Drop
            } else {
                steps.push(format!(
                    "internalTrafficPolicy {:?}: {} endpoints{}",
                    svc.internal_traffic_policy,
                    eps.len(),
                    if masq_internal {
                        "; masqueraded (not local traffic, or masqueradeAll)"
                    } else {
                        ""
                    }
                ));
                dnat(eps, masq_internal, p.source)
            }
        }
        _ if svc.external_traffic_policy == TrafficPolicy::Cluster => {
            steps.push(format!(
                "externalTrafficPolicy Cluster: {} endpoints, masqueraded",
                sel.cluster.len()
            ));
            dnat(&sel.cluster, true, p.source)
        }
        // One virtual service, one set of real servers, whoever sends.
        _ if mode == Mode::Ipvs && sel.local.is_empty() && p.origin.on_the_node() => {
            steps.push("externalTrafficPolicy Local and no endpoint on this node: IPVS meets the node's packet before the filter and refuses it (a virtual service without real servers)".into());
            Verdict::Reject
        }
        _ if mode == Mode::Ipvs && sel.local.is_empty() => {
            steps.push("externalTrafficPolicy Local and no endpoint on this node: dropped, pods' packets too (IPVS has one set of real servers for every client)".into());
            Verdict::Drop
        }
        _ if mode == Mode::Ipvs => {
            steps.push(format!(
                "externalTrafficPolicy Local: the {} local endpoints for every client (IPVS), client address kept",
                sel.local.len()
            ));
            dnat(&sel.local, false, p.source)
        }
        _ if local => {
            steps.push(
                "externalTrafficPolicy Local, from a pod: short-circuited to every endpoint".into(),
            );
            dnat(&sel.cluster, false, p.source)
        }
        // With or without an endpoint here: both modes DNAT the node's packet in nat OUTPUT
        // before the filter's no-local-endpoint drop sees it, as kube-proxy's do.
        _ if p.origin.on_the_node() => {
            steps.push("externalTrafficPolicy Local, from the node: short-circuited to every endpoint, masqueraded".into());
            dnat(&sel.cluster, true, p.source)
        }
        _ if sel.local.is_empty() => {
            steps.push("externalTrafficPolicy Local and no endpoint on this node: dropped".into());
            Verdict::Drop
        }
        _ => {
            steps.push(format!(
                "externalTrafficPolicy Local: the {} local endpoints, client address kept",
                sel.local.len()
            ));
            dnat(&sel.local, false, p.source)
        }
    };
    Trace { verdict, steps }
}

/// The trace as text for a terminal.
pub fn render(t: &Trace) -> String {
    let mut out = String::new();
    for s in &t.steps {
        let _ = writeln!(out, "  {s}");
    }
    let _ = match &t.verdict {
        Verdict::Dnat {
            endpoints,
            masquerade,
            hairpin,
        } => {
            let eps: Vec<String> = endpoints
                .iter()
                .map(|(e, p)| format!("{e} (p={p:.3})"))
                .collect();
            writeln!(
                out,
                "verdict: DNAT to {}; {}{}",
                eps.join(", "),
                if *masquerade {
                    "masqueraded"
                } else {
                    "source address kept"
                },
                hairpin.map_or(String::new(), |h| format!(
                    ", but masqueraded when it reaches itself at {h}"
                ))
            )
        }
        Verdict::Reject => writeln!(out, "verdict: REJECT"),
        Verdict::Drop => writeln!(out, "verdict: DROP"),
        Verdict::Accept => writeln!(out, "verdict: ACCEPT (not touched)"),
    };
    out
}

#[cfg(test)]
mod tests {
    //! The verdicts real packets showed on random clusters (tests/trace_packets.rs), pinned.
    use super::*;
    use crate::model::ServicePortName;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]))
    }

    /// One TCP NodePort service on port 80 / node port 30080, with `endpoints` (all on
    /// another node), on a node whose NodePorts are only on its primary address.
    fn cluster(endpoints: &[&str], etp: TrafficPolicy, itp: TrafficPolicy) -> Snapshot {
        let mut s = Snapshot::default();
        s.node.name = "here".into();
        s.node.node_ips = vec![ip("192.168.0.2"), ip("192.168.1.2")];
        s.node.node_port_addresses =
            NodePortAddresses::Cidrs(vec!["192.168.0.2/32".parse().unwrap()]);
        let name = ServicePortName::new("ns", "svc", "p", Protocol::Tcp);
        let mut svc = ServicePort::cluster(name.clone(), ip("172.30.0.10"), 80);
        svc.node_port = 30080;
        svc.external_ips = vec![ip("192.0.2.10")];
        svc.external_traffic_policy = etp;
        svc.internal_traffic_policy = itp;
        s.services.insert((name.clone(), IpFamily::V4), svc);
        let eps = endpoints
            .iter()
            .map(|e| Endpoint {
                node_name: Some("there".into()),
                ..Endpoint::ready(ip(e), 8080)
            })
            .collect();
        s.endpoints.insert(name, eps);
        s
    }

    fn packet(from: &str, origin: Origin, to: &str, port: u16) -> Packet {
        Packet {
            source: ip(from),
            destination: SocketAddr::new(ip(to), port),
            protocol: Protocol::Tcp,
            origin,
        }
    }

    /// kube-proxy's iptables proxier.go, syncProxyRules, "Capture nodeports": without
    /// endpoints for outside traffic, KUBE-EXTERNAL-SERVICES refuses the node port on
    /// `-m addrtype --dst-type LOCAL`, whatever nodePortAddresses and localhostNodePorts say.
    #[test]
    fn iptables_refuses_a_node_port_without_endpoints_on_every_local_address() {
        let none = cluster(&[], TrafficPolicy::Cluster, TrafficPolicy::Cluster);
        for (from, origin, to) in [
            ("127.0.0.1", Origin::Localhost, "127.0.0.1"),
            ("203.0.113.2", Origin::External, "192.168.1.2"),
        ] {
            let p = packet(from, origin, to, 30080);
            assert_eq!(trace(&none, Mode::Iptables, &p).verdict, Verdict::Reject);
            assert_eq!(trace(&none, Mode::Nftables, &p).verdict, Verdict::Accept);
        }
        let remote_only = cluster(&["10.1.0.1"], TrafficPolicy::Local, TrafficPolicy::Cluster);
        let p = packet("203.0.113.2", Origin::External, "192.168.1.2", 30080);
        assert_eq!(
            trace(&remote_only, Mode::Iptables, &p).verdict,
            Verdict::Drop
        );
    }

    /// kube-proxy's iptables proxier.go, `iptablesJumpChains`: KUBE-EXTERNAL-SERVICES, where
    /// an external IP without endpoints is refused, hangs off INPUT and FORWARD only.
    #[test]
    fn iptables_leaves_the_nodes_own_packet_to_an_outside_service_address_alone() {
        let none = cluster(&[], TrafficPolicy::Cluster, TrafficPolicy::Cluster);
        let from_node = packet("192.168.0.2", Origin::Node, "192.0.2.10", 80);
        assert_eq!(
            trace(&none, Mode::Iptables, &from_node).verdict,
            Verdict::Accept
        );
        assert_eq!(
            trace(&none, Mode::Nftables, &from_node).verdict,
            Verdict::Reject
        );
        let from_pod = packet("10.0.0.2", Origin::Pod, "192.0.2.10", 80);
        assert_eq!(
            trace(&none, Mode::Iptables, &from_pod).verdict,
            Verdict::Reject
        );
    }

    /// IPVS meets the node's own packet in LOCAL_OUT: a cluster IP whose internal endpoint
    /// set is empty (internalTrafficPolicy Local, none here) is a virtual service without
    /// real servers, which refuses it; a pod's packet is dropped by the filter.
    #[test]
    fn ipvs_refuses_the_nodes_packet_to_a_local_only_cluster_ip_without_local_endpoints() {
        let s = cluster(&["10.1.0.1"], TrafficPolicy::Cluster, TrafficPolicy::Local);
        let from_node = packet("192.168.0.2", Origin::Node, "172.30.0.10", 80);
        assert_eq!(trace(&s, Mode::Ipvs, &from_node).verdict, Verdict::Reject);
        assert_eq!(trace(&s, Mode::Nftables, &from_node).verdict, Verdict::Drop);
        let from_pod = packet("10.0.0.2", Origin::Pod, "172.30.0.10", 80);
        assert_eq!(trace(&s, Mode::Ipvs, &from_pod).verdict, Verdict::Drop);
    }

    /// kube-proxy's IPVS proxier.go, `iptablesJumpChain`: KUBE-PROXY-FIREWALL (source ranges)
    /// hangs off filter INPUT and FORWARD only, and IPVS takes the node's own packet to a
    /// load-balancer IP in LOCAL_OUT: the node is not filtered, a pod is.
    #[test]
    fn ipvs_does_not_filter_the_nodes_own_packet_by_source_range() {
        let mut s = cluster(
            &["10.1.0.1"],
            TrafficPolicy::Cluster,
            TrafficPolicy::Cluster,
        );
        for svc in s.services.values_mut() {
            svc.load_balancer_ips = vec![ip("198.18.0.1")];
            svc.load_balancer_source_ranges = vec!["203.0.113.0/24".parse().unwrap()];
        }
        let from_node = packet("192.168.0.2", Origin::Node, "198.18.0.1", 80);
        assert!(matches!(
            trace(&s, Mode::Ipvs, &from_node).verdict,
            Verdict::Dnat { .. }
        ));
        assert_eq!(trace(&s, Mode::Nftables, &from_node).verdict, Verdict::Drop);
        let from_pod = packet("10.0.0.2", Origin::Pod, "198.18.0.1", 80);
        assert_eq!(trace(&s, Mode::Ipvs, &from_pod).verdict, Verdict::Drop);
    }

    /// An endpoint reaching its own service: only the connection that comes back to it is
    /// masqueraded (kube-proxy's per-endpoint `-s <endpoint> -j KUBE-MARK-MASQ`).
    #[test]
    fn a_hairpin_connection_is_masqueraded_alone() {
        let mut s = cluster(
            &["10.1.0.1", "10.1.0.2"],
            TrafficPolicy::Cluster,
            TrafficPolicy::Cluster,
        );
        s.node.local_detector = LocalDetector::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]);
        let p = packet("10.1.0.1", Origin::Pod, "172.30.0.10", 80);
        let Verdict::Dnat {
            masquerade,
            hairpin,
            ..
        } = trace(&s, Mode::Nftables, &p).verdict
        else {
            panic!("not DNAT");
        };
        assert!(!masquerade);
        assert_eq!(hairpin, Some(SocketAddr::new(ip("10.1.0.1"), 8080)));
    }
}
