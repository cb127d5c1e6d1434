//! Synthetic clusters of any size, for benchmarks and scale tests.

use crate::model::*;
use std::net::{IpAddr, Ipv4Addr};

/// The node every synthetic cluster is seen from.
pub fn node() -> NodeConfig {
    NodeConfig {
        name: "bench-node".into(),
        node_ips: vec![IpAddr::V4(Ipv4Addr::new(192, 168, 0, 2))],
        local_detector: LocalDetector::Cidrs(vec![ipnetwork::IpNetwork::V4(
            ipnetwork::Ipv4Network::new(Ipv4Addr::new(10, 0, 0, 0), 8)
                .unwrap_or_else(|_| unreachable!("10.0.0.0/8 is a valid network")),
        )]),
        masquerade_bit: 14,
        node_port_addresses: NodePortAddresses::All,
        ..NodeConfig::default()
    }
}

/// Cluster IP of service `i` (inside 172.16.0.0/12).
pub fn cluster_ip(i: usize) -> IpAddr {
    let i = i as u32 + 1;
    IpAddr::V4(Ipv4Addr::from(0xac10_0000u32 + i))
}

/// Address of endpoint `j` of service `i` (inside 10.0.0.0/8); generation `g > 0` names the
/// g-th replacement endpoint instead (inside 11.0.0.0/8), so every replacement is fresh.
pub fn endpoint_ip(i: usize, j: usize, generation: u32) -> IpAddr {
    if generation > 0 {
        return IpAddr::V4(Ipv4Addr::from(0x0b00_0000u32 + generation));
    }
    let v = (i as u32) * 64 + j as u32;
    IpAddr::V4(Ipv4Addr::from(0x0a00_0000u32 + (v % 0x00ff_ffff) + 1))
}

/// `services` ClusterIP services with `endpoints` ready endpoints each, spread over 50 nodes.
pub fn cluster(services: usize, endpoints: usize) -> Snapshot {
    let mut s = Snapshot {
        node: node(),
        ..Snapshot::default()
    };
    for i in 0..services {
        let name = ServicePortName::new("bench", &format!("svc-{i}"), "http", Protocol::Tcp);
        let port = ServicePort::cluster(name.clone(), cluster_ip(i), 80);
        s.services.insert((name.clone(), IpFamily::V4), port);
        let eps = (0..endpoints)
            .map(|j| Endpoint {
                node_name: Some(format!("node-{}", (i + j) % 50).into()),
                ..Endpoint::ready(endpoint_ip(i, j, 0), 8080)
            })
            .collect();
        s.endpoints.insert(name, eps);
    }
    s
}

/// Add service `i` (as [`cluster`] names it) with `endpoints` endpoints.
pub fn add_service(s: &mut Snapshot, i: usize, endpoints: usize) {
    let name = ServicePortName::new("bench", &format!("svc-{i}"), "http", Protocol::Tcp);
    let port = ServicePort::cluster(name.clone(), cluster_ip(i), 80);
    s.services.insert((name.clone(), IpFamily::V4), port);
    let eps = (0..endpoints)
        .map(|j| Endpoint::ready(endpoint_ip(i, j, 0), 8080))
        .collect();
    s.endpoints.insert(name, eps);
}

/// Replace endpoint `j` of service `i` with a new address: a one-endpoint change.
pub fn replace_endpoint(s: &mut Snapshot, i: usize, j: usize, generation: u32) {
    let name = ServicePortName::new("bench", &format!("svc-{i}"), "http", Protocol::Tcp);
    if let Some(eps) = s.endpoints.get_mut(&name) {
        crate::model::edit_endpoints(eps, |list| {
            if let Some(e) = list.get_mut(j) {
                e.ip = endpoint_ip(i, j, generation);
            }
            list.sort();
        });
    }
}
