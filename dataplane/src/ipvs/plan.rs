//! What IPVS mode wants in the kernel for a snapshot (pure): the virtual services and their
//! real servers, the addresses bound to `kube-ipvs0`, and the members of kube-proxy's
//! ipsets that its iptables rules match on.
//!
//! As kube-proxy's IPVS mode: a virtual service per cluster IP, external IP and
//! load-balancer IP with the service port, and per node-port address with the node port;
//! the cluster IP's real servers follow internalTrafficPolicy, the others
//! externalTrafficPolicy; ClientIP affinity is IPVS persistence. Node ports are served on
//! the node's own addresses (never on loopback: IPVS cannot).

use super::genl::{ServiceId, ServiceSpec, SVC_F_PERSISTENT};
use super::sets::{SetName, Sets};
use crate::model::{IpFamily, NodePortAddresses, Protocol, SessionAffinity, Snapshot};
use crate::nft::layout::NoLocalEndpoints;
use crate::selection;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// A virtual service as wanted: settings and real servers (address, port) with weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedService {
    pub spec: ServiceSpec,
    pub dests: BTreeMap<(IpAddr, u16), u32>,
    /// `ns/name:port/proto`, for logs.
    pub owner: String,
    /// The namespace and name of the service, to narrow partial syncs.
    pub service: (String, String),
}

/// Everything IPVS mode programs, for both families.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub services: BTreeMap<ServiceId, WantedService>,
    /// Addresses bound to kube-ipvs0 (cluster, external and load-balancer IPs).
    pub bound: BTreeSet<IpAddr>,
    pub sets: Sets,
    /// Front ends left out because another service port holds them.
    pub conflicts: Vec<String>,
    pub no_local_endpoints: NoLocalEndpoints,
}

/// The node addresses that serve node ports: `local` (the node's interface addresses,
/// kube-ipvs0's excluded) narrowed by nodePortAddresses; loopback never.
pub fn node_port_addresses(snapshot: &Snapshot, local: &[IpAddr]) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = local
        .iter()
        .copied()
        .filter(|ip| !ip.is_loopback())
        .filter(|ip| match &snapshot.node.node_port_addresses {
            NodePortAddresses::All => true,
            NodePortAddresses::Cidrs(c) => c.iter().any(|n| n.contains(*ip)),
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The plan for `snapshot`, with node ports on `node_port_ips` and `scheduler`.
pub fn plan(snapshot: &Snapshot, node_port_ips: &[IpAddr], scheduler: &str) -> Plan {
    let mut p = Plan::default();
    let node = &snapshot.node;
    for ((name, family), svc) in &snapshot.services {
        let sel = selection::select(node, svc, snapshot.endpoints_of(name));
        let internal = selection::internal(svc, &sel);
        let external = selection::external(svc, &sel);
        let has_endpoints = !snapshot.endpoints_of(name).is_empty();
        if has_endpoints && internal.is_empty() {
            p.no_local_endpoints.internal += 1;
        }
        if has_endpoints && external.is_empty() && svc.has_external_frontends() {
            p.no_local_endpoints.external += 1;
        }
        let (flags, timeout) = match svc.session_affinity {
            SessionAffinity::None => (0, 0),
            SessionAffinity::ClientIp { timeout_seconds } => (SVC_F_PERSISTENT, timeout_seconds),
        };
        let spec = ServiceSpec {
            scheduler: scheduler.to_string(),
            flags,
            timeout,
        };
        let owner = format!("{name} ({family})");
        let service = (name.namespace.clone(), name.name.clone());
        let proto = name.protocol;
        let dests = |eps: &[&crate::model::Endpoint]| -> BTreeMap<(IpAddr, u16), u32> {
            eps.iter().map(|e| ((e.ip, e.port), 1)).collect()
        };
        let local_policy = svc.external_traffic_policy == crate::model::TrafficPolicy::Local;
        // A Local policy that leaves nothing while the service has endpoints elsewhere.
        let stranded = !sel.cluster.is_empty() && sel.local.is_empty();
        let internal_stranded =
            stranded && svc.internal_traffic_policy == crate::model::TrafficPolicy::Local;
        let external_stranded = stranded && local_policy;
        let add = |p: &mut Plan, addr: IpAddr, port: u16, eps: &[&crate::model::Endpoint]| {
            let id = ServiceId {
                addr,
                protocol: proto,
                port,
            };
            if let Some(holder) = p.services.get(&id) {
                p.conflicts
                    .push(format!("{id}: {owner} left out, {} holds it", holder.owner));
                return false;
            }
            p.services.insert(
                id,
                WantedService {
                    spec: spec.clone(),
                    dests: dests(eps),
                    owner: owner.clone(),
                    service: service.clone(),
                },
            );
            true
        };
        let f = *family;
        let no_local = |p: &mut Plan, ip: IpAddr, port: u16, stranded: bool| {
            if stranded {
                p.sets
                    .insert(SetName::NoLocalEndpoints, f, ip_port(ip, proto, port));
            }
        };
        if add(&mut p, svc.cluster_ip, svc.port, internal) {
            p.bound.insert(svc.cluster_ip);
            p.sets.insert(
                SetName::ClusterIp,
                f,
                ip_port(svc.cluster_ip, proto, svc.port),
            );
            no_local(&mut p, svc.cluster_ip, svc.port, internal_stranded);
        }
        for ip in svc.external_ips.iter().filter(|ip| IpFamily::of(ip) == f) {
            if add(&mut p, *ip, svc.port, external) {
                p.bound.insert(*ip);
                no_local(&mut p, *ip, svc.port, external_stranded);
                let set = if local_policy {
                    SetName::ExternalIpLocal
                } else {
                    SetName::ExternalIp
                };
                p.sets.insert(set, f, ip_port(*ip, proto, svc.port));
            }
        }
        for ip in svc
            .load_balancer_ips
            .iter()
            .filter(|ip| IpFamily::of(ip) == f)
        {
            if !add(&mut p, *ip, svc.port, external) {
                continue;
            }
            p.bound.insert(*ip);
            no_local(&mut p, *ip, svc.port, external_stranded);
            let entry = ip_port(*ip, proto, svc.port);
            p.sets.insert(SetName::LoadBalancer, f, entry.clone());
            if local_policy {
                p.sets.insert(SetName::LoadBalancerLocal, f, entry.clone());
            }
            let ranges: Vec<_> = svc
                .load_balancer_source_ranges
                .iter()
                .filter(|n| IpFamily::of_net(n) == f)
                .collect();
            if !ranges.is_empty() {
                p.sets.insert(SetName::LoadBalancerFw, f, entry.clone());
                for n in &ranges {
                    p.sets.insert(
                        SetName::LoadBalancerSourceCidr,
                        f,
                        format!("{entry},{}/{}", n.network(), n.prefix()),
                    );
                }
                // Hairpin from the node itself (its address inside a range): kube-proxy
                // lets the load-balancer IP through as a source, as the node sends with it.
                if node
                    .node_ips
                    .iter()
                    .any(|nip| ranges.iter().any(|n| n.contains(*nip)))
                {
                    p.sets
                        .insert(SetName::LoadBalancerSourceIp, f, format!("{entry},{ip}"));
                }
            }
        }
        if svc.node_port != 0 {
            let mut any = false;
            for ip in node_port_ips.iter().filter(|ip| IpFamily::of(ip) == f) {
                if add(&mut p, *ip, svc.node_port, external) {
                    any = true;
                    no_local(&mut p, *ip, svc.node_port, external_stranded);
                }
            }
            if any {
                if let Some((all, local)) = node_port_sets(proto) {
                    p.sets.insert(all, f, svc.node_port.to_string());
                    if local_policy {
                        p.sets.insert(local, f, svc.node_port.to_string());
                    }
                }
            }
        }
        if svc.health_check_node_port != 0 {
            p.sets.insert(
                SetName::HealthCheckNodePort,
                f,
                svc.health_check_node_port.to_string(),
            );
        }
        // A pod reaching itself through the service: masqueraded, or the reply would go
        // straight back to it from its own address.
        for e in internal.iter().chain(external.iter()) {
            if e.is_local(&node.name) {
                p.sets.insert(
                    SetName::LoopBack,
                    f,
                    format!("{},{}:{},{}", e.ip, proto.as_str(), e.port, e.ip),
                );
            }
        }
    }
    for ip in &p.bound {
        p.sets
            .insert(SetName::IpvsIps, IpFamily::of(ip), ip.to_string());
    }
    p
}

/// `ip,proto:port`, as ipset writes a hash:ip,port member.
fn ip_port(ip: IpAddr, proto: Protocol, port: u16) -> String {
    format!("{ip},{}:{port}", proto.as_str())
}

fn node_port_sets(proto: Protocol) -> Option<(SetName, SetName)> {
    match proto {
        Protocol::Tcp => Some((SetName::NodePortTcp, SetName::NodePortLocalTcp)),
        Protocol::Udp => Some((SetName::NodePortUdp, SetName::NodePortLocalUdp)),
        // SCTP node ports need hash:ip,port sets per node address; no SCTP here.
        Protocol::Sctp => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, ServicePort, ServicePortName, TrafficPolicy};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn snapshot() -> Snapshot {
        let mut s = crate::synth::cluster(0, 0);
        s.node.name = "n1".into();
        s.node.node_ips = vec![ip("192.168.0.2")];
        let name = ServicePortName::new("ns", "web", "http", Protocol::Tcp);
        let mut svc = ServicePort::cluster(name.clone(), ip("172.30.0.10"), 80);
        svc.node_port = 30080;
        svc.external_ips = vec![ip("198.51.100.7")];
        svc.load_balancer_ips = vec![ip("1.2.3.4")];
        svc.load_balancer_source_ranges = vec!["192.168.0.0/16".parse().unwrap()];
        svc.external_traffic_policy = TrafficPolicy::Local;
        svc.session_affinity = SessionAffinity::ClientIp {
            timeout_seconds: 60,
        };
        s.services.insert((name.clone(), IpFamily::V4), svc);
        let mut local = Endpoint::ready(ip("10.0.0.5"), 8080);
        local.node_name = Some("n1".into());
        let remote = Endpoint::ready(ip("10.1.0.5"), 8080);
        s.endpoints.insert(name, vec![local, remote]);
        s
    }

    #[test]
    fn every_front_end_gets_a_virtual_service_with_its_policys_endpoints() {
        let s = snapshot();
        let p = plan(&s, &[ip("192.168.0.2"), ip("192.168.1.2")], "rr");
        let dests = |addr: &str, port: u16| -> Vec<IpAddr> {
            let id = ServiceId {
                addr: ip(addr),
                protocol: Protocol::Tcp,
                port,
            };
            p.services[&id].dests.keys().map(|(a, _)| *a).collect()
        };
        // Cluster policy inside, Local policy for the external front ends.
        assert_eq!(
            dests("172.30.0.10", 80),
            vec![ip("10.0.0.5"), ip("10.1.0.5")]
        );
        for (a, port) in [
            ("198.51.100.7", 80),
            ("1.2.3.4", 80),
            ("192.168.0.2", 30080),
            ("192.168.1.2", 30080),
        ] {
            assert_eq!(dests(a, port), vec![ip("10.0.0.5")], "{a}");
        }
        assert_eq!(p.services.len(), 5);
        let spec = &p.services.values().next().unwrap().spec;
        assert_eq!((spec.flags, spec.timeout), (SVC_F_PERSISTENT, 60));
        assert_eq!(
            p.bound,
            [ip("172.30.0.10"), ip("198.51.100.7"), ip("1.2.3.4")].into()
        );
        let members = |n| p.sets.members(n, IpFamily::V4);
        assert_eq!(members(SetName::ClusterIp), vec!["172.30.0.10,tcp:80"]);
        assert_eq!(
            members(SetName::ExternalIpLocal),
            vec!["198.51.100.7,tcp:80"]
        );
        assert!(members(SetName::ExternalIp).is_empty());
        assert_eq!(members(SetName::LoadBalancerLocal), vec!["1.2.3.4,tcp:80"]);
        assert_eq!(
            members(SetName::LoadBalancerSourceCidr),
            vec!["1.2.3.4,tcp:80,192.168.0.0/16"]
        );
        // The node's address is inside the range: its own hairpin is allowed.
        assert_eq!(
            members(SetName::LoadBalancerSourceIp),
            vec!["1.2.3.4,tcp:80,1.2.3.4"]
        );
        assert_eq!(members(SetName::NodePortTcp), vec!["30080"]);
        assert_eq!(members(SetName::NodePortLocalTcp), vec!["30080"]);
        assert_eq!(
            members(SetName::LoopBack),
            vec!["10.0.0.5,tcp:8080,10.0.0.5"]
        );
        assert_eq!(members(SetName::IpvsIps).len(), 3);
    }

    #[test]
    fn a_front_end_two_services_claim_goes_to_the_first() {
        let mut s = snapshot();
        let other = ServicePortName::new("ns", "zzz", "http", Protocol::Tcp);
        let svc = ServicePort::cluster(other.clone(), ip("172.30.0.10"), 80);
        s.services.insert((other, IpFamily::V4), svc);
        let p = plan(&s, &[], "rr");
        assert_eq!(p.conflicts.len(), 1, "{:?}", p.conflicts);
        assert!(p.conflicts[0].contains("ns/zzz:http"), "{:?}", p.conflicts);
    }

    #[test]
    fn node_ports_skip_loopback_and_follow_node_port_addresses() {
        let mut s = snapshot();
        let local = [ip("127.0.0.1"), ip("192.168.0.2"), ip("10.9.0.1")];
        assert_eq!(
            node_port_addresses(&s, &local),
            vec![ip("10.9.0.1"), ip("192.168.0.2")]
        );
        s.node.node_port_addresses =
            NodePortAddresses::Cidrs(vec!["192.168.0.0/24".parse().unwrap()]);
        assert_eq!(node_port_addresses(&s, &local), vec![ip("192.168.0.2")]);
    }
}
