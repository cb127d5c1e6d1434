//! UDP conntrack cleanup with a real UDP flow: a client keeps one socket (one conntrack
//! entry) while its service's endpoint is replaced, and while a service appears in front of
//! an address it had been sending to; right after the sync the stale entry is gone and the
//! same socket reaches the new endpoint. In every mode (IPVS mode in the QEMU guest, where
//! IPVS keeps a connection of its own beside conntrack's). Needs root and `conntrack` (to
//! look); prints SKIP otherwise (fails if SWITCHYARD_REQUIRE_NETNS=1).

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod guest;
mod rig;

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use rig::cases::{EndpointSlice, Mode, Scenario, Service};
use rig::net::parse_identity;
use rig::{Rig, RigOptions};
use serde_json::json;

const CLIENT: &str = "10.0.0.2";
const EP_A: &str = "10.180.0.1";
const EP_B: &str = "10.180.2.1";
const DNS_IP: &str = "172.30.0.53";
/// Not a node address and outside the service CIDR: before the service exists, datagrams
/// to it leave the node un-NATed (and the uplink answers with an ICMP error).
const LATE_IP: &str = "198.51.100.53";

fn slice(name: &str, service: &str, ep: &str, node: &str) -> EndpointSlice {
    serde_json::from_value(json!({
        "namespace": "ns1", "service": service, "name": name, "addressType": "IPv4",
        "ports": [{ "name": "dns", "port": 53, "protocol": "UDP" }],
        "endpoints": [{ "addresses": [ep], "nodeName": node }],
    }))
    .unwrap()
}

fn service(name: &str, cluster_ip: &str, external: &[&str]) -> Service {
    serde_json::from_value(json!({
        "namespace": "ns1", "name": name, "type": "ClusterIP", "clusterIP": cluster_ip,
        "ports": [{ "name": "dns", "port": 53, "protocol": "UDP" }],
        "externalIPs": external,
    }))
    .unwrap()
}

fn scenario() -> Scenario {
    serde_json::from_value(json!({
        "id": "udp-conntrack",
        "node": {
            "name": "test-node", "ipFamily": "IPv4", "ips": ["192.168.0.2"],
            "primaryIP": "192.168.0.2", "podCIDR": null, "clusterCIDR": "10.0.0.0/8",
            "localDetectMode": "ClusterCIDR", "serviceCIDRs": ["172.30.0.0/16"],
            "masqueradeAll": false, "nodePortAddresses": ["192.168.0.2/32"],
            "localhostNodePorts": false
        },
        "services": [service("dns", DNS_IP, &[])],
        "endpointSlices": [slice("dns-1", "dns", EP_A, "test-node")],
        "flows": [{
            "name": "pod to the UDP service", "source": CLIENT, "sourceKind": "pod",
            "destination": DNS_IP, "port": 53, "protocol": "UDP",
            "expect": { "verdict": "DNAT", "endpoints": [format!("{EP_A}:53")], "masquerade": false }
        }]
    }))
    .unwrap()
}

/// A UDP socket in the client pod, bound to a fixed port, connected to `dest`.
fn client(rig: &Rig, port: u16, dest: &str) -> UdpSocket {
    let ns = rig.pods[&CLIENT.parse().unwrap()].clone();
    let dest: SocketAddr = format!("{dest}:53").parse().unwrap();
    rig::netns::in_netns(&ns, move || {
        let s = UdpSocket::bind(format!("{CLIENT}:{port}"))?;
        s.connect(dest)?;
        s.set_read_timeout(Some(Duration::from_millis(500)))?;
        Ok(s)
    })
    .unwrap()
}

/// Who answers one datagram (the endpoint's address), or the error; a pending ICMP error
/// from an earlier datagram is consumed first.
fn ask(s: &UdpSocket) -> Result<String, std::io::Error> {
    let mut last = None;
    for _ in 0..3 {
        s.send(b"q\n")?;
        let mut buf = [0u8; 512];
        match s.recv(&mut buf) {
            Ok(n) => {
                let line = String::from_utf8_lossy(&buf[..n]).to_string();
                let (local, _) = parse_identity(&line).expect("identity line");
                return Ok(local.ip().to_string());
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap())
}

/// The UDP conntrack entries of the client port, as `conntrack -L` prints them.
fn entries(rig: &Rig, port: u16) -> Vec<String> {
    let out = rig.node_exec("conntrack", &["-L", "-p", "udp"]);
    assert!(out.success(), "{}", out.transcript());
    out.stdout
        .lines()
        .filter(|l| l.contains(&format!("sport={port} ")))
        .map(str::to_string)
        .collect()
}

fn udp_flows_follow_their_service(mode: Mode) {
    let opts = RigOptions {
        mode,
        // B's responder exists from the start, for the change.
        extra_slices: vec![slice("dns-b", "dns", EP_B, "remote")],
        ..RigOptions::default()
    };
    let test = format!("udp_conntrack/{}", mode.as_str());
    let Some(mut rig) = Rig::build(&test, &scenario(), opts) else {
        return;
    };
    rig.program();

    // An endpoint goes away: the entry DNATed to it goes with the sync.
    let sock = client(&rig, 40000, DNS_IP);
    assert_eq!(ask(&sock).unwrap(), EP_A);
    let before = entries(&rig, 40000);
    assert!(
        before.iter().any(|l| l.contains(&format!("src={EP_A} "))),
        "the flow is DNATed to A: {before:?}"
    );
    let out = rig.reprogram(
        vec![service("dns", DNS_IP, &[])],
        vec![slice("dns-1", "dns", EP_B, "remote")],
    );
    // In IPVS mode the kernel may beat us to it: deleting a real server with
    // expire_nodest_conn set queues IPVS's own expiry of that server's connections, and
    // their conntrack entries go with them.
    assert!(
        mode == Mode::Ipvs || out.stdout.contains("stale UDP conntrack entries deleted"),
        "{}",
        out.transcript()
    );
    let after = entries(&rig, 40000);
    assert!(
        !after.iter().any(|l| l.contains(&format!("src={EP_A} "))),
        "right after the sync no entry points at A: {after:?}"
    );
    assert_eq!(ask(&sock).unwrap(), EP_B, "the same socket reaches B");

    // A service appears in front of an address the client was already sending to: the
    // un-NATed entry goes, and the same socket reaches the endpoint.
    let late = client(&rig, 40001, LATE_IP);
    assert!(
        ask(&late).is_err(),
        "nothing answers before the service exists"
    );
    let before = entries(&rig, 40001);
    assert!(
        before
            .iter()
            .any(|l| l.matches(&format!("src={LATE_IP} ")).count() == 1),
        "an un-NATed entry exists: {before:?}"
    );
    rig.reprogram(
        vec![
            service("dns", DNS_IP, &[]),
            service("late", "172.30.0.54", &[LATE_IP]),
        ],
        vec![
            slice("dns-1", "dns", EP_B, "remote"),
            slice("late-1", "late", EP_A, "test-node"),
        ],
    );
    let after = entries(&rig, 40001);
    assert!(
        !after
            .iter()
            .any(|l| l.matches(&format!("src={LATE_IP} ")).count() == 1),
        "right after the sync the un-NATed entry is gone: {after:?}"
    );
    assert_eq!(ask(&late).unwrap(), EP_A);
}

#[test]
fn udp_flows_follow_their_service_nftables() {
    udp_flows_follow_their_service(Mode::Nftables);
}

#[test]
fn udp_flows_follow_their_service_iptables() {
    udp_flows_follow_their_service(Mode::Iptables);
}

#[test]
fn udp_flows_follow_their_service_ipvs_in_guest() {
    guest::test_in_guest(
        "guest_udp_flows_follow_their_service_ipvs",
        &[],
        Duration::from_secs(300),
    );
}

#[test]
#[ignore = "runs inside the QEMU guest, through udp_flows_follow_their_service_ipvs_in_guest"]
fn guest_udp_flows_follow_their_service_ipvs() {
    guest::require_guest();
    udp_flows_follow_their_service(Mode::Ipvs);
}
