//! kube-proxy's iptables chain names: a prefix and 16 characters of base32(sha256(..)), so
//! that the chains of a service port are the ones operators and their tools already know.

use crate::model::{Endpoint, ServicePortName};
use std::net::IpAddr;

pub const SERVICES: &str = "KUBE-SERVICES";
pub const EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
pub const NODEPORTS: &str = "KUBE-NODEPORTS";
pub const POSTROUTING: &str = "KUBE-POSTROUTING";
pub const MARK_MASQ: &str = "KUBE-MARK-MASQ";
pub const FORWARD: &str = "KUBE-FORWARD";
pub const PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
pub const CANARY: &str = "KUBE-PROXY-CANARY";
/// Shared with kubelet, which writes the same rule: never deleted by cleanup.
pub const KUBELET_FIREWALL: &str = "KUBE-FIREWALL";

/// Prefixes of the per-service and per-endpoint chains; any chain with one of these that
/// the desired state lacks is stale and removed.
pub const SERVICE_CHAIN_PREFIXES: [&str; 5] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-EXT-",
    "KUBE-FW-",
    "KUBE-SEP-",
];

/// Fixed chains Switchyard writes (in some table), removed by cleanup.
pub const FIXED_CHAINS: [&str; 8] = [
    SERVICES,
    EXTERNAL_SERVICES,
    NODEPORTS,
    POSTROUTING,
    MARK_MASQ,
    FORWARD,
    PROXY_FIREWALL,
    CANARY,
];

/// Whether a chain of this name belongs to Switchyard (and to kube-proxy's iptables and
/// IPVS modes, whose names these are: a node moving from kube-proxy is taken over chain by
/// chain).
pub fn owned(chain: &str) -> bool {
    FIXED_CHAINS.contains(&chain)
        || KUBE_PROXY_IPVS_CHAINS.contains(&chain)
        || SERVICE_CHAIN_PREFIXES.iter().any(|p| chain.starts_with(p))
}

/// Chains only IPVS mode makes (its iptables side), kube-proxy's and ours.
pub const KUBE_PROXY_IPVS_CHAINS: [&str; 6] = [
    "KUBE-NODE-PORT",
    "KUBE-LOAD-BALANCER",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
    "KUBE-IPVS-FIREWALL",
];

/// A chain kube-proxy (any mode) owns: the same names as ours.
pub fn kube_proxy_owned(chain: &str) -> bool {
    owned(chain)
}

/// kube-proxy's `ServicePortName.String()`: `ns/name:port`, or `ns/name` for an unnamed port.
pub fn port_name_string(name: &ServicePortName) -> String {
    if name.port.is_empty() {
        format!("{}/{}", name.namespace, name.name)
    } else {
        format!("{}/{}:{}", name.namespace, name.name, name.port)
    }
}

const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// The first 16 characters of standard base32 of sha256(`input`): 80 bits, exactly 10 bytes.
fn hash16(input: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, input.as_bytes());
    let bytes = digest.as_ref();
    let mut bits: u128 = 0;
    for b in &bytes[..10] {
        bits = (bits << 8) | u128::from(*b);
    }
    (0..16)
        .map(|i| char::from(BASE32[((bits >> (75 - 5 * i)) & 31) as usize]))
        .collect()
}

fn port_proto_hash(name: &ServicePortName) -> String {
    hash16(&format!("{}{}", port_name_string(name), name.protocol))
}

/// `KUBE-SVC-…`: the service port's endpoints under the Cluster policy.
pub fn cluster_chain(name: &ServicePortName) -> String {
    format!("KUBE-SVC-{}", port_proto_hash(name))
}

/// `KUBE-SVL-…`: the service port's endpoints on this node (Local policy).
pub fn local_chain(name: &ServicePortName) -> String {
    format!("KUBE-SVL-{}", port_proto_hash(name))
}

/// `KUBE-EXT-…`: where traffic to the service port's external front ends goes.
pub fn external_chain(name: &ServicePortName) -> String {
    format!("KUBE-EXT-{}", port_proto_hash(name))
}

/// `KUBE-FW-…`: the loadBalancerSourceRanges check in front of `KUBE-EXT-…`.
pub fn firewall_chain(name: &ServicePortName) -> String {
    format!("KUBE-FW-{}", port_proto_hash(name))
}

/// An endpoint as kube-proxy prints it: `ip:port`, `[ip6]:port`.
pub fn endpoint_string(ip: IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(ip, port).to_string()
}

/// `KUBE-SEP-…`: one endpoint of one service port.
pub fn endpoint_chain(name: &ServicePortName, ep: &Endpoint) -> String {
    format!(
        "KUBE-SEP-{}",
        hash16(&format!(
            "{}{}{}",
            port_name_string(name),
            name.protocol,
            endpoint_string(ep.ip, ep.port)
        ))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;

    #[test]
    fn names_match_kube_proxy() {
        // Names from kube-proxy's own iptables proxier tests (pkg/proxy/iptables).
        let svc = ServicePortName::new("ns1", "svc1", "p80", Protocol::Tcp);
        assert_eq!(cluster_chain(&svc), "KUBE-SVC-XPGD46QRK7WJZT7O");
        assert_eq!(external_chain(&svc), "KUBE-EXT-XPGD46QRK7WJZT7O");
        let ep = Endpoint::ready("10.180.0.1".parse().unwrap(), 80);
        assert_eq!(endpoint_chain(&svc, &ep), "KUBE-SEP-SXIVWICOYRO3J4NJ");
    }

    #[test]
    fn names_fit_iptables_and_are_owned() {
        let svc = ServicePortName::new("a-very-long-namespace", "x", "", Protocol::Udp);
        let ep = Endpoint::ready("fd00::1".parse().unwrap(), 53);
        assert_eq!(port_name_string(&svc), "a-very-long-namespace/x");
        assert_eq!(endpoint_string(ep.ip, ep.port), "[fd00::1]:53");
        for n in [
            cluster_chain(&svc),
            local_chain(&svc),
            external_chain(&svc),
            endpoint_chain(&svc, &ep),
        ] {
            // iptables chain names are at most 28 characters.
            assert!(n.len() <= 28, "{n}");
            assert!(owned(&n));
        }
        assert!(!owned("KUBE-KUBELET-CANARY"));
        assert!(!owned(KUBELET_FIREWALL));
        assert!(!owned("DOCKER"));
    }
}
