//! sessionAffinity ClientIP with real connections from many client addresses, in every
//! mode: each client keeps reaching one endpoint (through the ClusterIP and through the
//! NodePort from outside), different clients spread over the endpoints, a client whose
//! endpoint goes away is sent to a live one (and stays there), and the memory ends with the
//! timeout (IPVS mode, in the QEMU guest: persistence with that timeout). Needs root;
//! prints SKIP otherwise (fails if SWITCHYARD_REQUIRE_NETNS=1).

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod guest;
mod rig;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use rig::cases::{EndpointSlice, Expect, Flow, Mode, Protocol, Scenario, Service, SourceKind};
use rig::net::Outcome;
use rig::{Rig, RigOptions};
use serde_json::json;

const CLUSTER_IP: &str = "172.30.0.41";
const SHORT_IP: &str = "172.30.0.42";
const NODE_IP: &str = "192.168.0.2";
const PODS: usize = 16;
const EXTERNALS: usize = 6;
const TRIES: usize = 6;

fn pod(i: usize) -> String {
    format!("10.0.1.{}", i + 1)
}

fn external(i: usize) -> String {
    format!("203.0.113.{}", i + 2)
}

fn service(name: &str, ip: &str, node_port: u16, timeout: u32) -> Service {
    serde_json::from_value(json!({
        "namespace": "ns1", "name": name, "type": "NodePort", "clusterIP": ip,
        "ports": [{ "name": "p", "port": 80, "protocol": "TCP", "nodePort": node_port }],
        "sessionAffinity": "ClientIP", "sessionAffinityTimeoutSeconds": timeout,
    }))
    .unwrap()
}

fn slice(name: &str, service: &str, eps: &[(&str, &str)]) -> EndpointSlice {
    let endpoints: Vec<_> = eps
        .iter()
        .map(|(ip, node)| json!({ "addresses": [ip], "nodeName": node }))
        .collect();
    serde_json::from_value(json!({
        "namespace": "ns1", "service": service, "name": name, "addressType": "IPv4",
        "ports": [{ "name": "p", "port": 80, "protocol": "TCP" }],
        "endpoints": endpoints,
    }))
    .unwrap()
}

fn flow(kind: SourceKind, src: &str, dst: &str, port: u16) -> Flow {
    Flow::new(
        "client",
        kind,
        src.parse().unwrap(),
        dst.parse().unwrap(),
        port,
        Protocol::Tcp,
        Expect::dnat(&[], false),
    )
}

fn scenario() -> Scenario {
    let mut flows: Vec<Flow> = (0..PODS)
        .map(|i| flow(SourceKind::Pod, &pod(i), CLUSTER_IP, 80))
        .collect();
    flows.extend((0..EXTERNALS).map(|i| flow(SourceKind::External, &external(i), NODE_IP, 3001)));
    let mut s: Scenario = serde_json::from_value(json!({
        "id": "session-affinity",
        "node": {
            "name": "test-node", "ipFamily": "IPv4", "ips": [NODE_IP],
            "primaryIP": NODE_IP, "podCIDR": null, "clusterCIDR": "10.0.0.0/8",
            "localDetectMode": "ClusterCIDR", "serviceCIDRs": ["172.30.0.0/16"],
            "masqueradeAll": false, "nodePortAddresses": ["192.168.0.2/32"],
            "localhostNodePorts": false
        },
        "services": [],
        "endpointSlices": [],
        "flows": [],
    }))
    .unwrap();
    s.services = vec![
        service("web", CLUSTER_IP, 3001, 10800),
        service("short", SHORT_IP, 3002, 2),
    ];
    s.endpoint_slices = vec![
        slice(
            "web-1",
            "web",
            &[("10.180.0.1", "test-node"), ("10.180.2.1", "remote")],
        ),
        slice(
            "short-1",
            "short",
            &[("10.180.0.2", "test-node"), ("10.180.2.2", "remote")],
        ),
    ];
    s.flows = flows;
    s
}

/// The endpoint each connection of `flow` reached.
fn endpoints_reached(rig: &Rig, flow: &Flow, tries: usize) -> Vec<IpAddr> {
    (0..tries)
        .map(|_| match rig.probe_once(flow) {
            Outcome::Reply { local, .. } => local.ip(),
            other => panic!("{} -> {}: {other:?}", flow.source, flow.destination),
        })
        .collect()
}

/// Every flow reaches exactly one endpoint; returns it per client.
fn sticky(rig: &Rig, flows: &[Flow]) -> BTreeMap<IpAddr, IpAddr> {
    flows
        .iter()
        .map(|f| {
            let got: BTreeSet<IpAddr> = endpoints_reached(rig, f, TRIES).into_iter().collect();
            assert_eq!(
                got.len(),
                1,
                "client {} reached {got:?} through {}:{}, not one endpoint",
                f.source,
                f.destination,
                f.port
            );
            (f.source, *got.first().unwrap())
        })
        .collect()
}

fn session_affinity(mode: Mode) {
    let opts = RigOptions {
        mode,
        extra_slices: vec![slice("web-new", "web", &[("10.180.2.3", "remote")])],
        ..RigOptions::default()
    };
    let Some(mut rig) = Rig::build(&format!("affinity/{}", mode.as_str()), &scenario(), opts)
    else {
        return;
    };
    rig.program();
    let pods: Vec<Flow> = rig.scenario().flows[..PODS].to_vec();
    let externals: Vec<Flow> = rig.scenario().flows[PODS..].to_vec();

    let by_pod = sticky(&rig, &pods);
    let spread: BTreeSet<&IpAddr> = by_pod.values().collect();
    assert_eq!(
        spread.len(),
        2,
        "16 clients spread over both endpoints: {by_pod:?}"
    );
    let by_external = sticky(&rig, &externals);
    assert!(by_external
        .values()
        .all(|e| e.to_string().starts_with("10.180.")));

    // 10.180.0.1 goes away, 10.180.2.3 arrives: its clients move to a live endpoint and
    // stay there; the others keep theirs.
    let gone: IpAddr = "10.180.0.1".parse().unwrap();
    let mut slices = rig.scenario().endpoint_slices.clone();
    slices[0] = slice(
        "web-1",
        "web",
        &[("10.180.2.1", "remote"), ("10.180.2.3", "remote")],
    );
    let services = rig.scenario().services.clone();
    rig.reprogram(services, slices);
    let after = sticky(&rig, &pods);
    for (client, before) in &by_pod {
        let now = after[client];
        assert_ne!(now, gone, "{client} still reaches the removed endpoint");
        if *before != gone {
            assert_eq!(now, *before, "{client} kept its endpoint");
        }
    }

    // The short service forgets after 2 s: a client's memory is gone then. Seen from the
    // kernel's own bookkeeping, which is what differs between the modes.
    let f = flow(SourceKind::Pod, &pod(0), SHORT_IP, 80);
    let first = endpoints_reached(&rig, &f, 3);
    assert!(first.windows(2).all(|w| w[0] == w[1]), "{first:?}");
    match mode {
        Mode::Nftables => {
            let remembers = |rig: &Rig| {
                rig.node_exec("nft", &["list", "map", "ip", "switchyard", "affinity"])
                    .stdout
                    .contains(&format!("{} . {SHORT_IP} . tcp . 80", pod(0)))
            };
            assert!(remembers(&rig), "the client is remembered");
            let deadline = Instant::now() + Duration::from_secs(10);
            while remembers(&rig) {
                assert!(Instant::now() < deadline, "not forgotten after the timeout");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Mode::Ipvs => {
            let table = rig.node_exec("cat", &["/proc/net/ip_vs"]).stdout;
            assert!(table.contains("persistent 2"), "IPVS persistence: {table}");
        }
        Mode::Iptables => {
            let save = rig.node_exec("iptables-save", &["-t", "nat"]).stdout;
            assert!(
                save.contains("--rcheck --seconds 2 --reap"),
                "kube-proxy's recent match with the timeout: {save}"
            );
        }
    }
}

#[test]
fn session_affinity_nftables() {
    session_affinity(Mode::Nftables);
}

#[test]
fn session_affinity_iptables() {
    session_affinity(Mode::Iptables);
}

#[test]
fn session_affinity_ipvs_in_guest() {
    guest::test_in_guest("guest_session_affinity_ipvs", &[], Duration::from_secs(300));
}

/// IPVS persistence, in the QEMU guest (tests/guest).
#[test]
#[ignore = "runs inside the QEMU guest, through session_affinity_ipvs_in_guest"]
fn guest_session_affinity_ipvs() {
    guest::require_guest();
    session_affinity(Mode::Ipvs);
}
