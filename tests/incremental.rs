//! Incremental re-programming with real packets: endpoint changes take effect on the next
//! `switchyard sync --once`, and established connections survive a re-sync.
//! Needs root; prints SKIP otherwise (fails if SWITCHYARD_REQUIRE_NETNS=1).

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod rig;

use std::io::{BufRead, Write};
use std::net::SocketAddr;

use rig::cases::{EndpointSlice, Expect, Flow, Scenario};
use rig::net::{Outcome, ResponderMode};
use rig::{Rig, RigOptions};
use serde_json::json;

const WEB_IP: &str = "172.30.0.10";
const CHAT_IP: &str = "172.30.0.20";
/// Local endpoint removed by the second sync.
const EP_A: &str = "10.180.0.1";
/// Remote endpoint kept across both syncs.
const EP_B: &str = "10.180.2.1";
/// Local endpoint added by the second sync.
const EP_C: &str = "10.180.0.3";
/// The chat service's only endpoint (unchanged).
const EP_CHAT: &str = "10.180.0.5";
const CLIENT: &str = "10.0.0.2";

fn endpoint(ip: &str, node: &str) -> serde_json::Value {
    json!({ "addresses": [ip], "nodeName": node, "ready": true, "serving": null, "terminating": null })
}

fn web_slice(name: &str, endpoints: &[serde_json::Value]) -> EndpointSlice {
    serde_json::from_value(json!({
        "namespace": "ns1", "service": "web", "name": name, "addressType": "IPv4",
        "ports": [{ "name": "http", "port": 80, "protocol": "TCP" }],
        "endpoints": endpoints,
    }))
    .expect("valid slice")
}

/// Two ClusterIP services: `ns1/web` (endpoints A local, B remote) and `ns2/chat`
/// (80 -> 8080 on one local endpoint).
fn scenario() -> Scenario {
    serde_json::from_value(json!({
        "id": "incremental",
        "node": {
            "name": "test-node", "ipFamily": "IPv4",
            "ips": ["192.168.0.2", "192.168.1.2", "2001:db8::1"],
            "primaryIP": "192.168.0.2", "podCIDR": null,
            "clusterCIDR": "10.0.0.0/8", "localDetectMode": "ClusterCIDR",
            "serviceCIDRs": ["172.30.0.0/16"], "masqueradeAll": false,
            "nodePortAddresses": ["192.168.0.2/32"], "localhostNodePorts": false
        },
        "services": [
            {
                "namespace": "ns1", "name": "web", "type": "ClusterIP", "clusterIP": WEB_IP,
                "ports": [{ "name": "http", "port": 80, "protocol": "TCP", "nodePort": null, "targetPort": null }]
            },
            {
                "namespace": "ns2", "name": "chat", "type": "ClusterIP", "clusterIP": CHAT_IP,
                "ports": [{ "name": "chat", "port": 80, "protocol": "TCP", "nodePort": null, "targetPort": 8080 }]
            }
        ],
        "endpointSlices": [
            {
                "namespace": "ns1", "service": "web", "name": "web-1", "addressType": "IPv4",
                "ports": [{ "name": "http", "port": 80, "protocol": "TCP" }],
                "endpoints": [endpoint(EP_A, "test-node"), endpoint(EP_B, "node2")]
            },
            {
                "namespace": "ns2", "service": "chat", "name": "chat-1", "addressType": "IPv4",
                "ports": [{ "name": "chat", "port": 8080, "protocol": "TCP" }],
                "endpoints": [endpoint(EP_CHAT, "test-node")]
            }
        ],
        "flows": [
            {
                "name": "pod to web (before)", "source": CLIENT, "sourceKind": "pod",
                "destination": WEB_IP, "port": 80, "protocol": "TCP",
                "expect": { "verdict": "DNAT", "endpoints": [format!("{EP_A}:80"), format!("{EP_B}:80")], "masquerade": false }
            },
            {
                "name": "pod to chat", "source": CLIENT, "sourceKind": "pod",
                "destination": CHAT_IP, "port": 80, "protocol": "TCP",
                "expect": { "verdict": "DNAT", "endpoints": [format!("{EP_CHAT}:8080")], "masquerade": false }
            }
        ]
    }))
    .expect("valid scenario")
}

/// The second state: web's endpoints become {B, C}; chat is unchanged.
fn changed_slices(s: &Scenario) -> Vec<EndpointSlice> {
    let mut slices = s.endpoint_slices.clone();
    slices[0] = web_slice(
        "web-1",
        &[endpoint(EP_B, "node2"), endpoint(EP_C, "test-node")],
    );
    slices
}

fn web_after() -> Flow {
    let mut f = scenario().flows[0].clone();
    f.name = "pod to web (after: A removed, C added)".into();
    f.expect = Expect::dnat(&[&format!("{EP_B}:80"), &format!("{EP_C}:80")], false);
    f
}

fn options(mode: ResponderMode) -> RigOptions {
    RigOptions {
        responder_mode: mode,
        // C only appears in the second state, but its pod must exist from the start.
        extra_slices: vec![web_slice("web-future", &[endpoint(EP_C, "test-node")])],
        ..RigOptions::default()
    }
}

fn assert_second_sync_reported(out: &rig::netns::CmdOutput) {
    println!("second sync stdout: {}", out.stdout.trim_end());
    assert!(
        !out.stdout.trim().is_empty(),
        "the second sync should report the change on stdout:\n{}",
        out.transcript()
    );
}

#[test]
fn endpoint_change_reaches_exactly_the_new_set() {
    let s = scenario();
    let Some(mut rig) = Rig::build(
        "endpoint_change_reaches_exactly_the_new_set",
        &s,
        options(ResponderMode::OneShot),
    ) else {
        return;
    };
    rig.program();
    rig.assert_scenario_flows();

    let out = rig.reprogram(s.services.clone(), changed_slices(&s));
    assert_second_sync_reported(&out);
    rig.assert_flows(&[web_after(), s.flows[1].clone()]);
}

#[test]
fn established_connection_survives_resync() {
    let s = scenario();
    let Some(mut rig) = Rig::build(
        "established_connection_survives_resync",
        &s,
        options(ResponderMode::Echo),
    ) else {
        return;
    };
    rig.program();
    rig.assert_scenario_flows();

    // Open a connection to the unchanged service before the second sync.
    let chat = s.flows[1].clone();
    let (mut conn, greeting) = rig.connect(&chat).unwrap_or_else(|o| {
        panic!(
            "connecting to chat before the re-sync: {o}\n{}",
            rig.ruleset()
        )
    });
    let want: SocketAddr = format!("{EP_CHAT}:8080").parse().expect("socket address");
    match greeting {
        Outcome::Reply { local, .. } if local == want => {}
        other => panic!("chat greeting: expected a reply from {want}, got {other}"),
    }
    let mut echo = |msg: &str| -> String {
        conn.get_mut()
            .write_all(msg.as_bytes())
            .unwrap_or_else(|e| panic!("writing {msg:?} on the established connection: {e}"));
        let mut line = String::new();
        conn.read_line(&mut line)
            .unwrap_or_else(|e| panic!("reading the echo of {msg:?}: {e}"));
        line
    };
    assert_eq!(echo("before-sync\n"), "before-sync\n");

    let out = rig.reprogram(s.services.clone(), changed_slices(&s));
    assert_second_sync_reported(&out);

    let after = echo("after-sync\n");
    assert_eq!(
        after,
        "after-sync\n",
        "the established connection must survive the re-sync\n--- nft list ruleset ---\n{}",
        rig.ruleset()
    );
    drop(conn);
    rig.assert_flows(&[web_after(), chat]);
}
