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
            if !allowed && (mode != Mode::Iptables || has_any) {
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
            if eps.is_empty() {
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
