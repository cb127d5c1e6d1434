//! The service model: what the kernel must implement, independent of any API types.

use crate::interned;
use ipnetwork::IpNetwork;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

/// Transport protocol of a service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The lower-case name nft and iptables use.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// IP family of an address, a service or a kernel table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub const ALL: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

    pub fn of(addr: &IpAddr) -> IpFamily {
        match addr {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    pub fn of_net(net: &IpNetwork) -> IpFamily {
        IpFamily::of(&net.ip())
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        })
    }
}

/// The key of everything: namespace/name:port-name/protocol, as kube-proxy's ServicePortName.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ServicePortName {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub port: Arc<str>,
    pub protocol: Protocol,
}

impl ServicePortName {
    /// Names are interned ([`crate::interned`]): each of the many copies a name has costs no
    /// allocation, and a service's slices share its service's strings.
    pub fn new(namespace: &str, name: &str, port: &str, protocol: Protocol) -> Self {
        ServicePortName {
            namespace: interned::intern(namespace),
            name: interned::intern(name),
            port: interned::intern(port),
            protocol,
        }
    }

    /// The (namespace, name) of its service, as backends are told which services changed.
    pub fn service_key(&self) -> (String, String) {
        (self.namespace.to_string(), self.name.to_string())
    }

    /// Whether this is a port of service `namespace/name`.
    pub fn is_of(&self, namespace: &str, name: &str) -> bool {
        &*self.namespace == namespace && &*self.name == name
    }
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port.is_empty() {
            write!(f, "{}/{}/{}", self.namespace, self.name, self.protocol)
        } else {
            write!(
                f,
                "{}/{}:{}/{}",
                self.namespace, self.name, self.port, self.protocol
            )
        }
    }
}

/// externalTrafficPolicy / internalTrafficPolicy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum TrafficPolicy {
    #[default]
    Cluster,
    Local,
}

/// Session affinity of a service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum SessionAffinity {
    #[default]
    None,
    ClientIp {
        timeout_seconds: u32,
    },
}

/// trafficDistribution of a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum TrafficDistribution {
    #[default]
    Unset,
    PreferClose,
    PreferSameZone,
    PreferSameNode,
}

/// One port of one service, in one IP family: everything needed to program its front ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServicePort {
    pub name: ServicePortName,
    pub family: IpFamily,
    pub cluster_ip: IpAddr,
    pub port: u16,
    /// 0 when the service has no node port.
    pub node_port: u16,
    pub external_ips: Vec<IpAddr>,
    pub load_balancer_ips: Vec<IpAddr>,
    pub load_balancer_source_ranges: Vec<IpNetwork>,
    pub external_traffic_policy: TrafficPolicy,
    pub internal_traffic_policy: TrafficPolicy,
    pub session_affinity: SessionAffinity,
    pub traffic_distribution: TrafficDistribution,
    /// 0 when none.
    pub health_check_node_port: u16,
    /// Who wins a front end contested by services of the same claim kind
    /// ([`crate::frontends`]): not programmed itself.
    #[serde(skip)]
    pub seniority: Seniority,
}

/// The age of the Service a port belongs to, for deciding contested front ends without
/// regard to names: the older creationTimestamp wins, then the smaller uid; only when both
/// are equal or unknown (manifests often carry neither) does namespace/name decide.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seniority {
    /// creationTimestamp in seconds since the epoch; `i64::MAX` when unknown (youngest).
    pub created: i64,
    /// metadata.uid; empty when unknown. Shared by every copy of the service's ports.
    pub uid: Arc<str>,
}

impl Default for Seniority {
    fn default() -> Self {
        Seniority {
            created: i64::MAX,
            uid: Arc::from(""),
        }
    }
}

impl ServicePort {
    /// A ClusterIP-only service port with every policy at its default.
    pub fn cluster(name: ServicePortName, cluster_ip: IpAddr, port: u16) -> Self {
        ServicePort {
            name,
            family: IpFamily::of(&cluster_ip),
            cluster_ip,
            port,
            node_port: 0,
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            load_balancer_source_ranges: Vec::new(),
            external_traffic_policy: TrafficPolicy::Cluster,
            internal_traffic_policy: TrafficPolicy::Cluster,
            session_affinity: SessionAffinity::None,
            traffic_distribution: TrafficDistribution::Unset,
            health_check_node_port: 0,
            seniority: Seniority::default(),
        }
    }

    /// The loadBalancerSourceRanges of the port's family that filter anything, disjoint: none
    /// when one of them is a zero-masked CIDR, which means "allow any" as no ranges do (as
    /// kube-proxy's pkg/proxy/serviceport.go `newBaseServiceInfo` says and does). IPVS
    /// mode also depends on it: an ipset `hash:ip,port,net` refuses a /0 member.
    pub fn source_ranges(&self) -> Vec<IpNetwork> {
        let ranges = disjoint_cidrs(&self.load_balancer_source_ranges, self.family);
        if ranges.iter().any(|r| r.prefix() == 0) {
            Vec::new()
        } else {
            ranges
        }
    }

    /// True when traffic from outside the cluster is subject to externalTrafficPolicy.
    pub fn has_external_frontends(&self) -> bool {
        self.node_port != 0 || !self.external_ips.is_empty() || !self.load_balancer_ips.is_empty()
    }
}

/// One endpoint (address and target port) of a service port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub port: u16,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// Node the endpoint runs on, when the slice says; shared with every endpoint there.
    pub node_name: Option<Arc<str>>,
    pub zone: Option<Arc<str>>,
    /// Topology hints, when it has any (most endpoints have none: one pointer, not two
    /// vectors, in 100k copies).
    pub hints: Option<Box<Hints>>,
}

/// An endpoint's topology hints: the zones and nodes it is meant for.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Hints {
    pub zones: Vec<Arc<str>>,
    pub nodes: Vec<Arc<str>>,
}

impl Endpoint {
    /// A ready endpoint with no topology information.
    pub fn ready(ip: IpAddr, port: u16) -> Self {
        Endpoint {
            ip,
            port,
            ready: true,
            serving: true,
            terminating: false,
            node_name: None,
            zone: None,
            hints: None,
        }
    }

    /// The zones its hints name (none without hints).
    pub fn hint_zones(&self) -> &[Arc<str>] {
        self.hints.as_deref().map_or(&[], |h| &h.zones)
    }

    /// The nodes its hints name (none without hints).
    pub fn hint_nodes(&self) -> &[Arc<str>] {
        self.hints.as_deref().map_or(&[], |h| &h.nodes)
    }

    /// Hints of `zones` and `nodes`; none when both are empty.
    pub fn with_hints(mut self, zones: Vec<Arc<str>>, nodes: Vec<Arc<str>>) -> Self {
        self.hints =
            (!zones.is_empty() || !nodes.is_empty()).then(|| Box::new(Hints { zones, nodes }));
        self
    }

    /// True when the endpoint is known to run on `node`.
    pub fn is_local(&self, node: &str) -> bool {
        self.node_name.as_deref() == Some(node)
    }
}

/// How traffic is told apart as coming from this node's pods (local) or from outside.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub enum LocalDetector {
    /// No detector: nothing is treated as local, nothing is masqueraded for being external.
    #[default]
    None,
    /// Source address inside one of these CIDRs (ClusterCIDR and NodeCIDR modes).
    Cidrs(Vec<IpNetwork>),
    /// Packet arrived on this bridge (BridgeInterface mode).
    Bridge(String),
    /// Packet arrived on an interface with this name prefix (InterfaceNamePrefix mode).
    InterfacePrefix(String),
}

/// Which node addresses accept NodePort traffic.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub enum NodePortAddresses {
    /// Every local address (iptables default).
    #[default]
    All,
    /// Local addresses inside these CIDRs.
    Cidrs(Vec<IpNetwork>),
}

/// Everything about this node that the rules depend on.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct NodeConfig {
    pub name: String,
    /// This node's addresses, primary first within each family.
    pub node_ips: Vec<IpAddr>,
    pub local_detector: LocalDetector,
    pub masquerade_all: bool,
    /// Bit of the packet mark that requests masquerade (kube-proxy default 14).
    pub masquerade_bit: u8,
    pub node_port_addresses: NodePortAddresses,
    /// Service CIDRs (from ServiceCIDR objects): unallocated addresses inside are dropped.
    pub service_cidrs: Vec<IpNetwork>,
    pub localhost_node_ports: bool,
    pub zone: Option<String>,
}

impl NodeConfig {
    pub fn masquerade_mark(&self) -> u32 {
        1u32 << u32::from(self.masquerade_bit.min(31))
    }

    /// The node's primary address of a family, if it has one.
    pub fn primary_ip(&self, family: IpFamily) -> Option<IpAddr> {
        self.node_ips
            .iter()
            .copied()
            .find(|ip| IpFamily::of(ip) == family)
    }
}

/// An immutable, ordered picture of everything to program.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Snapshot {
    pub node: NodeConfig,
    /// Keyed by (port name, family): a dual-stack service has one entry per family.
    pub services: BTreeMap<(ServicePortName, IpFamily), ServicePort>,
    /// Endpoints per service port, merged over its slices, deduplicated and sorted.
    pub endpoints: BTreeMap<ServicePortName, Endpoints>,
}

/// One service port's endpoints, shared: the agent's store hands the list of a service's
/// only slice to the snapshot as it is, without a copy (at 10k services x 10 endpoints the
/// copies were 10 MB, heaptrack).
pub type Endpoints = Arc<[Endpoint]>;

/// Change a shared endpoint list: `f` edits a copy, which replaces it.
pub fn edit_endpoints(eps: &mut Endpoints, f: impl FnOnce(&mut Vec<Endpoint>)) {
    let mut list = eps.to_vec();
    f(&mut list);
    *eps = list.into();
}

impl Snapshot {
    /// The ports (every family) of service `namespace/name`.
    pub fn ports_of_service<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> impl Iterator<Item = &'a ServicePort> + 'a {
        let start = ServicePortName::new(namespace, name, "", Protocol::Tcp);
        self.services
            .range((start, IpFamily::V4)..)
            .take_while(move |((n, _), _)| n.is_of(namespace, name))
            .map(|(_, svc)| svc)
    }

    pub fn endpoints_of(&self, name: &ServicePortName) -> &[Endpoint] {
        self.endpoints.get(name).map(|e| &e[..]).unwrap_or(&[])
    }

    /// Rebuild the maps with full nodes: filled in key order, as an initial list fills them,
    /// a B-tree's nodes end up about half full.
    pub fn compact(&mut self) {
        self.services = std::mem::take(&mut self.services).into_iter().collect();
        self.endpoints = std::mem::take(&mut self.endpoints).into_iter().collect();
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// Every service port's endpoints: a walk over every service, O(cluster).
    pub fn endpoint_count(&self) -> usize {
        self.endpoints.values().map(|e| e.len()).sum()
    }

    /// The endpoints of service `namespace/name`, over its ports.
    pub fn endpoints_of_service(&self, namespace: &str, name: &str) -> usize {
        let start = ServicePortName::new(namespace, name, "", Protocol::Tcp);
        self.endpoints
            .range(start..)
            .take_while(|(n, _)| n.is_of(namespace, name))
            .map(|(_, e)| e.len())
            .sum()
    }
}

/// CIDRs of one family with duplicates and nested ranges removed (nft rejects overlaps, and
/// one iptables rule matches one range).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lb(ranges: &[&str]) -> ServicePort {
        let name = ServicePortName::new("ns", "svc", "p", Protocol::Tcp);
        let mut svc = ServicePort::cluster(name, "172.30.0.1".parse().unwrap(), 80);
        svc.load_balancer_source_ranges = ranges.iter().map(|r| r.parse().unwrap()).collect();
        svc
    }

    /// kube-proxy's pkg/proxy/serviceport.go `newBaseServiceInfo`: a zero-masked CIDR in a
    /// family's ranges means "allow any", the same as no ranges. Ranges of the other family
    /// do not count.
    #[test]
    fn a_zero_masked_source_range_admits_everyone_as_no_ranges_do() {
        assert!(lb(&["198.51.100.0/24", "0.0.0.0/0"])
            .source_ranges()
            .is_empty());
        assert_eq!(
            lb(&["198.51.100.0/24", "::/0"]).source_ranges(),
            vec!["198.51.100.0/24".parse::<IpNetwork>().unwrap()]
        );
        assert_eq!(
            lb(&["10.0.0.0/8", "10.1.0.0/16"]).source_ranges(),
            vec!["10.0.0.0/8".parse::<IpNetwork>().unwrap()]
        );
    }
}
