//! Builds the dataplane [`Snapshot`] from configuration and API objects: node facts, local
//! traffic detection, node-port addresses, services and their merged endpoints.

use crate::config::{DetectLocalMode, ProxyConfig, ProxyMode};
use crate::convert::{self, Skip, SliceEndpoints};
use crate::manifests::{self, Identity, Manifests, Object};
use dataplane::model::{
    IpFamily, LocalDetector, NodeConfig, NodePortAddresses, ServicePort, Snapshot,
};
use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Label carrying the node's zone.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";

/// What could not be programmed, for logs and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Invalid objects: (metric reason, message naming the object and field).
    pub invalid: Vec<(&'static str, String)>,
    /// Objects deliberately not proxied (debug level).
    pub ignored: Vec<String>,
    /// Configuration consequences worth a warning.
    pub warnings: Vec<String>,
}

impl Skipped {
    pub fn record(&mut self, s: Skip) {
        match &s {
            Skip::NotProxied { .. } => self.ignored.push(s.to_string()),
            Skip::Invalid { reason, .. } => self.invalid.push((reason, s.to_string())),
        }
    }
}

/// The node's name: hostnameOverride, else the kernel's hostname.
pub fn node_name(cfg: &ProxyConfig) -> String {
    if let Some(h) = &cfg.hostname_override {
        return h.to_lowercase();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_lowercase())
        .unwrap_or_default()
}

/// Node addresses from the Node object: InternalIP first, then ExternalIP.
pub fn node_object_ips(node: &Node) -> Vec<IpAddr> {
    let mut out = Vec::new();
    let addrs = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .cloned()
        .unwrap_or_default();
    for kind in ["InternalIP", "ExternalIP"] {
        for a in addrs.iter().filter(|a| a.type_ == kind) {
            if let Ok(ip) = a.address.parse::<IpAddr>() {
                if !out.contains(&ip) {
                    out.push(ip);
                }
            }
        }
    }
    out
}

/// Inputs besides the objects: where node addresses come from when there is no Node object.
pub trait NodeAddressSource {
    fn addresses(&self) -> Vec<IpAddr>;
}

/// The node's facts and the configuration's consequences for this node. `interfaces` is
/// asked only when there is no Node object.
pub fn node_config(
    cfg: &ProxyConfig,
    name: String,
    node_obj: Option<&Node>,
    service_cidrs: &[ServiceCIDR],
    interfaces: &dyn NodeAddressSource,
    skipped: &mut Skipped,
) -> NodeConfig {
    let node_ips = match node_obj {
        Some(n) => node_object_ips(n),
        None => interfaces.addresses(),
    };
    let pod_cidrs: Vec<IpNetwork> = node_obj
        .and_then(|n| n.spec.as_ref())
        .and_then(|s| s.pod_cidrs.clone())
        .unwrap_or_default()
        .iter()
        .filter_map(|c| c.parse().ok())
        .collect();
    let zone = node_obj
        .and_then(|n| n.metadata.labels.as_ref())
        .and_then(|l| l.get(LABEL_ZONE).cloned());

    let local_detector = match cfg.detect_local_mode {
        DetectLocalMode::ClusterCidr if cfg.cluster_cidrs.is_empty() => LocalDetector::None,
        DetectLocalMode::ClusterCidr => LocalDetector::Cidrs(cfg.cluster_cidrs.clone()),
        DetectLocalMode::NodeCidr if pod_cidrs.is_empty() => {
            skipped.warnings.push(format!(
                "detectLocalMode NodeCIDR: Node {name} has no spec.podCIDRs; no traffic is treated as local"
            ));
            LocalDetector::None
        }
        DetectLocalMode::NodeCidr => LocalDetector::Cidrs(pod_cidrs),
        DetectLocalMode::BridgeInterface => LocalDetector::Bridge(cfg.bridge_interface.clone()),
        DetectLocalMode::InterfaceNamePrefix => {
            LocalDetector::InterfacePrefix(cfg.interface_name_prefix.clone())
        }
    };

    let primary = || -> Vec<IpNetwork> {
        IpFamily::ALL
            .iter()
            .filter_map(|f| node_ips.iter().find(|ip| IpFamily::of(ip) == *f))
            .filter_map(|ip| IpNetwork::new(*ip, if ip.is_ipv4() { 32 } else { 128 }).ok())
            .collect()
    };
    // kube-proxy v1.37's keywords expand to CIDRs (primary: the node's primary address of
    // each family; localhost: 127.0.0.0/8 and ::1/128; all: everything) and combine with
    // literal CIDRs. Unset is primary in nftables mode, all in the others, as kube-proxy.
    let entries: Vec<&str> = if cfg.node_port_addresses.is_empty() {
        if cfg.mode == ProxyMode::Nftables {
            vec!["primary"]
        } else {
            vec!["all"]
        }
    } else {
        cfg.node_port_addresses.iter().map(String::as_str).collect()
    };
    let node_port_addresses = if entries.contains(&"all") {
        NodePortAddresses::All
    } else {
        let mut cidrs = Vec::new();
        for e in entries {
            match e {
                "primary" => cidrs.extend(primary()),
                "localhost" => cidrs.extend(
                    ["127.0.0.0/8", "::1/128"]
                        .iter()
                        .filter_map(|c| c.parse::<IpNetwork>().ok()),
                ),
                cidr => cidrs.extend(cidr.parse::<IpNetwork>().ok()),
            }
        }
        NodePortAddresses::Cidrs(cidrs)
    };

    let service_cidrs: Vec<IpNetwork> = service_cidrs
        .iter()
        .flat_map(|c| {
            let name = c.metadata.name.clone().unwrap_or_default();
            c.spec
                .as_ref()
                .and_then(|s| s.cidrs.clone())
                .unwrap_or_default()
                .into_iter()
                .enumerate()
                .map(move |(i, cidr)| (name.clone(), i, cidr))
        })
        .filter_map(|(name, i, c)| match c.parse() {
            Ok(n) => Some(n),
            Err(_) => {
                skipped.invalid.push((
                    "bad_address",
                    format!(
                        "ServiceCIDR {name}: field spec.cidrs[{i}]: {c:?} is not a CIDR; ignored"
                    ),
                ));
                None
            }
        })
        .collect();

    NodeConfig {
        name,
        node_ips,
        local_detector,
        masquerade_all: cfg.masquerade_all,
        masquerade_bit: cfg.masquerade_bit,
        node_port_addresses,
        service_cidrs,
        localhost_node_ports: cfg.localhost_node_ports,
        zone,
    }
}

/// Build the snapshot. `interfaces` is asked only when the Node object is missing.
pub fn build(
    cfg: &ProxyConfig,
    objs: &Manifests,
    interfaces: &dyn NodeAddressSource,
) -> (Snapshot, Skipped) {
    let parts = Parts {
        duplicates: objs.duplicates.clone(),
        services: objs.services.iter().map(|s| service(cfg, s)).collect(),
        slices: objs.slices.iter().map(slice).collect(),
    };
    parts.assemble(cfg, &objs.nodes, &objs.service_cidrs, interfaces)
}

/// [`build`] as the objects arrive: each Service and EndpointSlice is converted when it
/// comes and only what it converts to is kept, so that a 10k-service manifest is never held
/// decoded whole (`sync --once`).
pub struct Builder<'a> {
    cfg: &'a ProxyConfig,
    seen: BTreeMap<Identity, (usize, String)>,
    parts: Parts,
    nodes: Vec<Node>,
    service_cidrs: Vec<ServiceCIDR>,
}

impl<'a> Builder<'a> {
    pub fn new(cfg: &'a ProxyConfig) -> Builder<'a> {
        Builder {
            cfg,
            seen: BTreeMap::new(),
            parts: Parts::default(),
            nodes: Vec::new(),
            service_cidrs: Vec::new(),
        }
    }

    /// Add `o`, read at `place`: an object defined twice is replaced whole by its later
    /// copy, with a warning, as [`Manifests::push`] does.
    pub fn push(&mut self, o: Object, place: String) {
        let p = &mut self.parts;
        let kept = match &o {
            Object::Service(_) => p.services.len(),
            Object::EndpointSlice(_) => p.slices.len(),
            Object::Node(_) => self.nodes.len(),
            Object::ServiceCidr(_) => self.service_cidrs.len(),
        };
        let id = manifests::identity(&o);
        let at = manifests::replaces(&mut self.seen, id, place, kept, &mut p.duplicates);
        match o {
            Object::Service(s) => manifests::put(&mut p.services, at, service(self.cfg, &s)),
            Object::EndpointSlice(s) => manifests::put(&mut p.slices, at, slice(&s)),
            Object::Node(n) => manifests::put(&mut self.nodes, at, *n),
            Object::ServiceCidr(c) => manifests::put(&mut self.service_cidrs, at, *c),
        }
    }

    /// The snapshot of everything pushed. `interfaces` is asked only when the Node object
    /// is missing.
    pub fn finish(self, interfaces: &dyn NodeAddressSource) -> (Snapshot, Skipped) {
        self.parts
            .assemble(self.cfg, &self.nodes, &self.service_cidrs, interfaces)
    }
}

/// One object converted, with the warnings its conversion gave.
struct Converted<T> {
    result: Result<T, Skip>,
    warnings: Vec<String>,
}

fn service(cfg: &ProxyConfig, svc: &Service) -> Converted<Vec<ServicePort>> {
    let mut warnings = Vec::new();
    let result = convert::service_gated(svc, cfg, &mut warnings);
    Converted { result, warnings }
}

fn slice(slice: &EndpointSlice) -> Converted<SliceEndpoints> {
    let mut warnings = Vec::new();
    let result = convert::endpoint_slice(slice, &mut warnings);
    Converted { result, warnings }
}

/// The Services and EndpointSlices converted, in the order their objects were first read,
/// and the warnings about objects defined twice.
#[derive(Default)]
struct Parts {
    duplicates: Vec<String>,
    services: Vec<Converted<Vec<ServicePort>>>,
    slices: Vec<Converted<SliceEndpoints>>,
}

impl Parts {
    fn assemble(
        self,
        cfg: &ProxyConfig,
        nodes: &[Node],
        service_cidrs: &[ServiceCIDR],
        interfaces: &dyn NodeAddressSource,
    ) -> (Snapshot, Skipped) {
        let mut skipped = Skipped::default();
        skipped.warnings.extend(self.duplicates);
        let name = node_name(cfg);
        let node_obj = nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name.as_str()));
        let node = node_config(cfg, name, node_obj, service_cidrs, interfaces, &mut skipped);
        let mut snapshot = Snapshot {
            node,
            ..Snapshot::default()
        };
        for c in self.services {
            skipped.warnings.extend(c.warnings);
            match c.result {
                Ok(ports) => {
                    for p in ports {
                        snapshot.services.insert((p.name.clone(), p.family), p);
                    }
                }
                Err(s) => skipped.record(s),
            }
        }
        let mut slices = Vec::new();
        for c in self.slices {
            skipped.warnings.extend(c.warnings);
            match c.result {
                Ok(eps) => slices.push(eps),
                Err(s) => skipped.record(s),
            }
        }
        snapshot.endpoints = convert::merge(&slices).into_iter().collect();
        // Contested front ends are decided here, once, for every backend.
        skipped
            .warnings
            .extend(dataplane::frontends::resolve_snapshot(&mut snapshot));
        (snapshot, skipped)
    }
}

#[cfg(test)]
mod tests;
