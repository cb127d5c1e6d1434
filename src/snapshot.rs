//! Builds the dataplane [`Snapshot`] from configuration and API objects: node facts, local
//! traffic detection, node-port addresses, services and their merged endpoints.

use crate::config::{DetectLocalMode, ProxyConfig, ProxyMode};
use crate::convert::{self, Skip};
use crate::manifests::Manifests;
use dataplane::model::{IpFamily, LocalDetector, NodeConfig, NodePortAddresses, Snapshot};
use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::networking::v1::ServiceCIDR;
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
    let mut skipped = Skipped::default();
    skipped.warnings.extend(objs.duplicates.iter().cloned());
    let name = node_name(cfg);
    let node_obj = objs
        .nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(name.as_str()));
    let node = node_config(
        cfg,
        name,
        node_obj,
        &objs.service_cidrs,
        interfaces,
        &mut skipped,
    );
    let mut snapshot = Snapshot {
        node,
        ..Snapshot::default()
    };
    for svc in &objs.services {
        match convert::service_gated(svc, cfg, &mut skipped.warnings) {
            Ok(ports) => {
                for p in ports {
                    snapshot.services.insert((p.name.clone(), p.family), p);
                }
            }
            Err(s) => skipped.record(s),
        }
    }
    let mut slices = Vec::new();
    for slice in &objs.slices {
        match convert::endpoint_slice(slice, &mut skipped.warnings) {
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
