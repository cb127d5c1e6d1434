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
use super::sets::{Member, SetName, Sets};
use crate::backend::{NoLocalByFamily, NoLocalEndpoints};
use crate::model::{
    Endpoint, IpFamily, NodePortAddresses, Protocol, ServicePort, ServicePortName, SessionAffinity,
    Snapshot, TrafficPolicy,
};
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
    pub no_local_endpoints: NoLocalByFamily,
    /// How many service ports want each bound address (several ports share a cluster IP).
    bound_refs: BTreeMap<IpAddr, u32>,
    /// What each service port was given, so that [`Plan::update`] can take it back.
    held: BTreeMap<PortKey, Held>,
}

/// A service port, as the snapshot keys it.
type PortKey = (ServicePortName, IpFamily);

/// What one service port holds in a plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Held {
    ids: Vec<ServiceId>,
    bound: Vec<IpAddr>,
    members: Vec<Member>,
    no_local: NoLocalEndpoints,
}

/// One front end a service port asks for, with what comes with it if it gets it.
struct FrontEnd {
    id: ServiceId,
    want: WantedService,
    bound: Option<IpAddr>,
    members: Vec<Member>,
    node_port: bool,
}

/// What one service port asks for, before other ports are considered.
struct PortWants {
    front_ends: Vec<FrontEnd>,
    /// Node-port set members: only when one of its node-port front ends was given.
    node_port_members: Vec<Member>,
    members: Vec<Member>,
    no_local: NoLocalEndpoints,
}

/// What [`Plan::update`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    /// Virtual services whose wants changed, with what was wanted before.
    pub services: BTreeMap<ServiceId, Option<WantedService>>,
    pub bound_added: Vec<IpAddr>,
    pub bound_removed: Vec<IpAddr>,
    pub members_added: Vec<Member>,
    pub members_removed: Vec<Member>,
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
    for (key, svc) in &snapshot.services {
        let wants = port_wants(snapshot, key, svc, node_port_ips, scheduler);
        p.give(key, wants);
    }
    p
}

impl Plan {
    /// Moves the plan to `snapshot` for the service ports of the `changed` services only
    /// (the rest of the snapshot is what the plan was made from), in time proportional to
    /// what changed. `None`, with the plan untouched, when a front end is claimed twice:
    /// which port gets it depends on all of them, so the caller plans everything.
    pub fn update(
        &mut self,
        snapshot: &Snapshot,
        changed: &BTreeSet<(String, String)>,
        node_port_ips: &[IpAddr],
        scheduler: &str,
    ) -> Option<Delta> {
        if !self.conflicts.is_empty() {
            return None;
        }
        let wanted: Vec<(PortKey, PortWants)> = changed
            .iter()
            .flat_map(|(ns, name)| ports_of(&snapshot.services, ns, name))
            .map(|(key, svc)| {
                let w = port_wants(snapshot, key, svc, node_port_ips, scheduler);
                (key.clone(), w)
            })
            .collect();
        let mut claimed = BTreeSet::new();
        for (_, w) in &wanted {
            for fe in &w.front_ends {
                let taken = self
                    .services
                    .get(&fe.id)
                    .is_some_and(|h| !changed.contains(&h.service));
                if taken || !claimed.insert(fe.id) {
                    return None;
                }
            }
        }
        let gone: Vec<PortKey> = changed
            .iter()
            .flat_map(|(ns, name)| ports_of(&self.held, ns, name))
            .map(|(key, _)| key.clone())
            .collect();
        let mut before = Before::default();
        for key in gone {
            self.take_back(&key, &mut before);
        }
        for (key, w) in wanted {
            for fe in &w.front_ends {
                before.service(self, fe.id);
                if let Some(ip) = fe.bound {
                    before.bound(self, ip);
                }
                for m in &fe.members {
                    before.member(self, m);
                }
            }
            for m in w.node_port_members.iter().chain(&w.members) {
                before.member(self, m);
            }
            self.give(&key, w);
        }
        Some(before.delta(self))
    }

    /// Gives one service port what it asks for, front end by front end, unless another
    /// port holds a front end already.
    fn give(&mut self, key: &PortKey, wants: PortWants) {
        let mut held = Held {
            no_local: wants.no_local,
            ..Held::default()
        };
        let mut any_node_port = false;
        for fe in wants.front_ends {
            if let Some(holder) = self.services.get(&fe.id) {
                self.conflicts.push(format!(
                    "{}: {} left out, {} holds it",
                    fe.id, fe.want.owner, holder.owner
                ));
                continue;
            }
            self.services.insert(fe.id, fe.want);
            held.ids.push(fe.id);
            any_node_port |= fe.node_port;
            if let Some(ip) = fe.bound {
                self.bind(ip);
                held.bound.push(ip);
            }
            held.members.extend(fe.members);
        }
        if any_node_port {
            held.members.extend(wants.node_port_members);
        }
        held.members.extend(wants.members);
        for (set, family, m) in &held.members {
            self.sets.insert(*set, *family, m.clone());
        }
        self.no_local_endpoints.add(key.1, held.no_local);
        self.held.insert(key.clone(), held);
    }

    /// Takes back what `key` was given.
    fn take_back(&mut self, key: &PortKey, before: &mut Before) {
        let Some(held) = self.held.remove(key) else {
            return;
        };
        for id in &held.ids {
            before.service(self, *id);
            self.services.remove(id);
        }
        for ip in &held.bound {
            before.bound(self, *ip);
            self.unbind(*ip);
        }
        for m in &held.members {
            before.member(self, m);
            self.sets.remove(m.0, m.1, &m.2);
        }
        self.no_local_endpoints.sub(key.1, held.no_local);
    }

    fn bind(&mut self, ip: IpAddr) {
        let n = self.bound_refs.entry(ip).or_insert(0);
        *n += 1;
        if *n == 1 {
            self.bound.insert(ip);
            self.sets
                .insert(SetName::IpvsIps, IpFamily::of(&ip), ip.to_string());
        }
    }

    fn unbind(&mut self, ip: IpAddr) {
        let Some(n) = self.bound_refs.get_mut(&ip) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            self.bound_refs.remove(&ip);
            self.bound.remove(&ip);
            self.sets
                .remove(SetName::IpvsIps, IpFamily::of(&ip), &ip.to_string());
        }
    }
}

/// What an update touched, as it was before the update: compared with the result, it gives
/// the [`Delta`] (a member taken back and given again is no change).
#[derive(Default)]
struct Before {
    services: BTreeMap<ServiceId, Option<WantedService>>,
    bound: BTreeMap<IpAddr, bool>,
    members: BTreeMap<Member, bool>,
}

impl Before {
    fn service(&mut self, p: &Plan, id: ServiceId) {
        self.services
            .entry(id)
            .or_insert_with(|| p.services.get(&id).cloned());
    }

    fn bound(&mut self, p: &Plan, ip: IpAddr) {
        self.bound
            .entry(ip)
            .or_insert_with(|| p.bound.contains(&ip));
        self.members
            .entry((SetName::IpvsIps, IpFamily::of(&ip), ip.to_string()))
            .or_insert_with(|| p.bound.contains(&ip));
    }

    fn member(&mut self, p: &Plan, m: &Member) {
        if !self.members.contains_key(m) {
            let had = p.sets.contains(m.0, m.1, &m.2);
            self.members.insert(m.clone(), had);
        }
    }

    fn delta(self, p: &Plan) -> Delta {
        let mut d = Delta::default();
        for (id, old) in self.services {
            if old.as_ref() != p.services.get(&id) {
                d.services.insert(id, old);
            }
        }
        for (ip, had) in self.bound {
            match (had, p.bound.contains(&ip)) {
                (false, true) => d.bound_added.push(ip),
                (true, false) => d.bound_removed.push(ip),
                _ => {}
            }
        }
        for (m, had) in self.members {
            match (had, p.sets.contains(m.0, m.1, &m.2)) {
                (false, true) => d.members_added.push(m),
                (true, false) => d.members_removed.push(m),
                _ => {}
            }
        }
        d
    }
}

/// The entries of `map` for service `ns/name`, every port and family: a range, since the
/// keys sort by namespace and name first.
fn ports_of<'a, V>(
    map: &'a BTreeMap<PortKey, V>,
    ns: &'a str,
    name: &'a str,
) -> impl Iterator<Item = (&'a PortKey, &'a V)> + 'a {
    let start = (
        ServicePortName::new(ns, name, "", Protocol::Tcp),
        IpFamily::V4,
    );
    map.range(start..)
        .take_while(move |((n, _), _)| n.is_of(ns, name))
}

/// What one service port asks for (pure; no other port is looked at).
fn port_wants(
    snapshot: &Snapshot,
    (name, family): &PortKey,
    svc: &ServicePort,
    node_port_ips: &[IpAddr],
    scheduler: &str,
) -> PortWants {
    let node = &snapshot.node;
    let sel = selection::select(node, svc, snapshot.endpoints_of(name));
    let internal = selection::internal(svc, &sel);
    let external = selection::external(svc, &sel);
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
    let service = name.service_key();
    let proto = name.protocol;
    let f = *family;
    let local_policy = svc.external_traffic_policy == TrafficPolicy::Local;
    // A Local policy that leaves nothing while the service has endpoints elsewhere.
    let stranded = !sel.cluster.is_empty() && sel.local.is_empty();
    let internal_stranded = stranded && svc.internal_traffic_policy == TrafficPolicy::Local;
    let external_stranded = stranded && local_policy;
    // As the other modes count them: usable endpoints, none of them here, Local policy.
    let no_local = NoLocalEndpoints {
        internal: usize::from(internal_stranded),
        external: usize::from(external_stranded && svc.has_external_frontends()),
    };
    let front_end = |addr: IpAddr, port: u16, eps: &[&Endpoint], stranded: bool| {
        let mut members = Vec::new();
        if stranded {
            members.push((SetName::NoLocalEndpoints, f, ip_port(addr, proto, port)));
        }
        FrontEnd {
            id: ServiceId {
                addr,
                protocol: proto,
                port,
            },
            want: WantedService {
                spec: spec.clone(),
                dests: eps.iter().map(|e| ((e.ip, e.port), 1)).collect(),
                owner: owner.clone(),
                service: service.clone(),
            },
            bound: None,
            members,
            node_port: false,
        }
    };
    let mut front_ends = Vec::new();
    let mut cluster = front_end(svc.cluster_ip, svc.port, internal, internal_stranded);
    cluster.bound = Some(svc.cluster_ip);
    cluster.members.push((
        SetName::ClusterIp,
        f,
        ip_port(svc.cluster_ip, proto, svc.port),
    ));
    front_ends.push(cluster);
    for ip in svc.external_ips.iter().filter(|ip| IpFamily::of(ip) == f) {
        let mut fe = front_end(*ip, svc.port, external, external_stranded);
        fe.bound = Some(*ip);
        let set = if local_policy {
            SetName::ExternalIpLocal
        } else {
            SetName::ExternalIp
        };
        fe.members.push((set, f, ip_port(*ip, proto, svc.port)));
        front_ends.push(fe);
    }
    let ranges = svc.source_ranges();
    // Hairpin from the node itself (its address inside a range): kube-proxy lets the
    // load-balancer IP through as a source, as the node sends with it.
    let node_in_range = node
        .node_ips
        .iter()
        .any(|nip| ranges.iter().any(|n| n.contains(*nip)));
    for ip in svc
        .load_balancer_ips
        .iter()
        .filter(|ip| IpFamily::of(ip) == f)
    {
        let mut fe = front_end(*ip, svc.port, external, external_stranded);
        fe.bound = Some(*ip);
        let entry = ip_port(*ip, proto, svc.port);
        fe.members.push((SetName::LoadBalancer, f, entry.clone()));
        if local_policy {
            fe.members
                .push((SetName::LoadBalancerLocal, f, entry.clone()));
        }
        if !ranges.is_empty() {
            fe.members.push((SetName::LoadBalancerFw, f, entry.clone()));
            for n in &ranges {
                fe.members.push((
                    SetName::LoadBalancerSourceCidr,
                    f,
                    format!("{entry},{}/{}", n.network(), n.prefix()),
                ));
            }
            if node_in_range {
                fe.members
                    .push((SetName::LoadBalancerSourceIp, f, format!("{entry},{ip}")));
            }
        }
        front_ends.push(fe);
    }
    let mut node_port_members = Vec::new();
    if svc.node_port != 0 {
        for ip in node_port_ips.iter().filter(|ip| IpFamily::of(ip) == f) {
            let mut fe = front_end(*ip, svc.node_port, external, external_stranded);
            fe.node_port = true;
            front_ends.push(fe);
        }
        if let Some((all, local)) = node_port_sets(proto) {
            node_port_members.push((all, f, svc.node_port.to_string()));
            if local_policy {
                node_port_members.push((local, f, svc.node_port.to_string()));
            }
        }
    }
    let mut members = Vec::new();
    if svc.health_check_node_port != 0 {
        members.push((
            SetName::HealthCheckNodePort,
            f,
            svc.health_check_node_port.to_string(),
        ));
    }
    // A pod reaching itself through the service: masqueraded, or the reply would go
    // straight back to it from its own address.
    for e in internal.iter().chain(external.iter()) {
        if e.is_local(&node.name) {
            members.push((
                SetName::LoopBack,
                f,
                format!("{},{}:{},{}", e.ip, proto.as_str(), e.port, e.ip),
            ));
        }
    }
    // A port that names one front end twice (an external IP that is also its load-balancer
    // IP) keeps the first: not a conflict between services.
    let mut seen = BTreeSet::new();
    front_ends.retain(|fe| seen.insert(fe.id));
    PortWants {
        front_ends,
        node_port_members,
        members,
        no_local,
    }
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
        s.endpoints.insert(name, vec![local, remote].into());
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

    fn key(name: &str) -> BTreeSet<(String, String)> {
        [("bench".to_string(), name.to_string())].into()
    }

    /// A cluster where services share addresses, have node ports, external and
    /// load-balancer IPs, Local policies and local endpoints.
    fn rich() -> Snapshot {
        let mut s = crate::synth::cluster(30, 3);
        s.node.name = "node-1".into();
        for (i, ((_, _), svc)) in s.services.iter_mut().enumerate() {
            if i % 3 == 0 {
                svc.node_port = 30000 + i as u16;
            }
            if i % 5 == 0 {
                svc.external_ips = vec![ip("198.51.100.7")];
                svc.port = 1000 + i as u16;
            }
            if i % 7 == 0 {
                svc.load_balancer_ips = vec![ip(&format!("203.0.113.{i}"))];
                svc.load_balancer_source_ranges = vec!["192.168.0.0/16".parse().unwrap()];
                svc.external_traffic_policy = TrafficPolicy::Local;
                svc.health_check_node_port = 32000 + i as u16;
            }
        }
        s
    }

    /// Updating in place lands exactly where planning from scratch does, whatever changed:
    /// an endpoint, a policy, a service gone, a service new.
    #[test]
    fn update_matches_a_fresh_plan() {
        let mut s = rich();
        let nodes = [ip("192.168.0.2")];
        let mut p = plan(&s, &nodes, "rr");
        assert!(p.conflicts.is_empty(), "{:?}", p.conflicts);
        let name =
            |i: usize| ServicePortName::new("bench", &format!("svc-{i}"), "http", Protocol::Tcp);

        crate::synth::replace_endpoint(&mut s, 4, 1, 1);
        let d = p.update(&s, &key("svc-4"), &nodes, "rr").unwrap();
        assert_eq!(p, plan(&s, &nodes, "rr"));
        let svc4 = p
            .services
            .values()
            .filter(|w| w.service.1 == "svc-4")
            .count();
        assert_eq!(d.services.len(), svc4, "svc-4's front ends only: {d:?}");
        assert!(d
            .services
            .keys()
            .all(|id| p.services[id].service.1 == "svc-4"));
        assert!(d.bound_added.is_empty() && d.bound_removed.is_empty());

        // An endpoint becomes local: its loopback member appears, nothing else.
        crate::model::edit_endpoints(s.endpoints.get_mut(&name(8)).unwrap(), |e| {
            e[0].node_name = Some("node-1".into())
        });
        let d = p.update(&s, &key("svc-8"), &nodes, "rr").unwrap();
        assert_eq!(p, plan(&s, &nodes, "rr"));
        assert_eq!(d.members_added.len(), 1, "{d:?}");
        assert_eq!(d.members_added[0].0, SetName::LoopBack);

        // Local policy on a node-port service; then the service goes; then a new one.
        let k = s
            .services
            .keys()
            .find(|(n, _)| &*n.name == "svc-3")
            .cloned()
            .unwrap();
        s.services.get_mut(&k).unwrap().external_traffic_policy = TrafficPolicy::Local;
        p.update(&s, &key("svc-3"), &nodes, "rr").unwrap();
        assert_eq!(p, plan(&s, &nodes, "rr"));
        // svc-0 and svc-5 share 198.51.100.7: removing one keeps the address bound.
        let k0 = s
            .services
            .keys()
            .find(|(n, _)| &*n.name == "svc-0")
            .cloned()
            .unwrap();
        s.services.remove(&k0);
        let d = p.update(&s, &key("svc-0"), &nodes, "rr").unwrap();
        assert_eq!(p, plan(&s, &nodes, "rr"));
        assert!(p.bound.contains(&ip("198.51.100.7")));
        assert!(!d.bound_removed.contains(&ip("198.51.100.7")));
        assert!(
            d.bound_removed.contains(&crate::synth::cluster_ip(0)),
            "{d:?}"
        );
        let fresh = ServicePortName::new("bench", "svc-new", "http", Protocol::Tcp);
        let svc = ServicePort::cluster(fresh.clone(), ip("172.31.9.9"), 80);
        s.services.insert((fresh.clone(), IpFamily::V4), svc);
        s.endpoints
            .insert(fresh, vec![Endpoint::ready(ip("10.9.9.9"), 80)].into());
        let d = p.update(&s, &key("svc-new"), &nodes, "rr").unwrap();
        assert_eq!(p, plan(&s, &nodes, "rr"));
        assert_eq!(d.bound_added, vec![ip("172.31.9.9")]);
    }

    /// A changed service that claims a front end another holds cannot be updated alone:
    /// who wins depends on every service. The plan stays as it was.
    #[test]
    fn update_refuses_a_front_end_claimed_twice() {
        let mut s = rich();
        let nodes = [ip("192.168.0.2")];
        let mut p = plan(&s, &nodes, "rr");
        let before = p.clone();
        let k = s
            .services
            .keys()
            .find(|(n, _)| &*n.name == "svc-2")
            .cloned()
            .unwrap();
        s.services.get_mut(&k).unwrap().cluster_ip = crate::synth::cluster_ip(1);
        assert!(p.update(&s, &key("svc-2"), &nodes, "rr").is_none());
        assert_eq!(p, before);
        // With a conflict in the plan, every update is refused.
        let p2 = plan(&s, &nodes, "rr");
        assert_eq!(p2.conflicts.len(), 1);
        let mut p2b = p2.clone();
        assert!(p2b.update(&s, &key("svc-9"), &nodes, "rr").is_none());
    }

    /// An external IP that is also the port's load-balancer IP is one front end, not a
    /// conflict, so partial updates still apply; Local policies count stranded ports only.
    #[test]
    fn a_port_naming_one_front_end_twice_is_no_conflict() {
        let mut s = snapshot();
        let k = s.services.keys().next().cloned().unwrap();
        s.services.get_mut(&k).unwrap().external_ips = vec![ip("1.2.3.4")];
        let nodes = [ip("192.168.0.2")];
        let mut p = plan(&s, &nodes, "rr");
        assert!(p.conflicts.is_empty(), "{:?}", p.conflicts);
        assert_eq!(p.no_local_endpoints.total(), NoLocalEndpoints::default());
        // The local endpoint goes: the Local front ends are stranded, the ClusterIP is not.
        let name = k.0.clone();
        crate::model::edit_endpoints(s.endpoints.get_mut(&name).unwrap(), |eps| {
            eps.retain(|e| e.node_name.is_none())
        });
        let changed: BTreeSet<(String, String)> = [("ns".to_string(), "web".to_string())].into();
        assert!(p.update(&s, &changed, &nodes, "rr").is_some());
        assert_eq!(p, plan(&s, &nodes, "rr"));
        assert_eq!(
            (
                p.no_local_endpoints.total().internal,
                p.no_local_endpoints.total().external
            ),
            (0, 1)
        );
    }
}
