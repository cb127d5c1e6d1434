//! Incremental re-programming with real packets: endpoint changes take effect on the next
//! `switchyard sync --once` or `switchyard run` (from manifests or the fixture API server),
//! and established connections survive re-syncs, API server outages and agent restarts.
//! IPVS mode runs in the QEMU guest (tests/guest): the same changes, and graceful
//! termination of a real server that still carries a connection.
//! Needs root; prints SKIP otherwise (fails if SWITCHYARD_REQUIRE_NETNS=1).

#![allow(clippy::expect_used, clippy::unwrap_used)]

#[allow(dead_code)] // each test binary uses part of the fixture
mod apiserver;
mod guest;
mod rig;

use std::io::{BufRead, Write};
use std::net::SocketAddr;

use rig::cases::{EndpointSlice, Expect, Flow, Mode, Scenario};
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
/// Local endpoint that replaces EP_CHAT (graceful termination).
const EP_CHAT2: &str = "10.180.0.6";
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

fn options(responder: ResponderMode, mode: Mode) -> RigOptions {
    RigOptions {
        mode,
        responder_mode: responder,
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
    endpoint_change(Mode::Nftables);
}

#[test]
fn iptables_endpoint_change_reaches_exactly_the_new_set() {
    endpoint_change(Mode::Iptables);
}

fn endpoint_change(mode: Mode) {
    let s = scenario();
    let Some(mut rig) = Rig::build(
        &format!(
            "endpoint_change_reaches_exactly_the_new_set/{}",
            mode.as_str()
        ),
        &s,
        options(ResponderMode::OneShot, mode),
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
fn ipvs_endpoint_change_in_guest() {
    guest::test_in_guest(
        "guest_ipvs_endpoint_change",
        &[],
        std::time::Duration::from_secs(300),
    );
}

#[test]
#[ignore = "runs inside the QEMU guest, through ipvs_endpoint_change_in_guest"]
fn guest_ipvs_endpoint_change() {
    guest::require_guest();
    endpoint_change(Mode::Ipvs);
    established_survives(Mode::Ipvs);
}

#[test]
fn ipvs_agent_follows_changes_in_guest() {
    guest::test_in_guest(
        "guest_ipvs_agent_follows_changes",
        &[],
        std::time::Duration::from_secs(300),
    );
}

/// `switchyard run` in IPVS mode: partial syncs on the real kernel as the manifests change,
/// kill -9 and restart under load without a failed connection, a deleted service dropped.
#[test]
#[ignore = "runs inside the QEMU guest, through ipvs_agent_follows_changes_in_guest"]
fn guest_ipvs_agent_follows_changes() {
    guest::require_guest();
    agent_follows_changes(Mode::Ipvs);
}

fn chat_slice(endpoints: &[serde_json::Value]) -> EndpointSlice {
    serde_json::from_value(json!({
        "namespace": "ns2", "service": "chat", "name": "chat-1", "addressType": "IPv4",
        "ports": [{ "name": "chat", "port": 8080, "protocol": "TCP" }],
        "endpoints": endpoints,
    }))
    .expect("valid slice")
}

/// The real servers IPVS holds for chat, read in the node's namespace.
fn chat_servers(rig: &Rig) -> Vec<dataplane::ipvs::genl::Dest> {
    let id = dataplane::ipvs::genl::ServiceId {
        addr: CHAT_IP.parse().expect("address"),
        protocol: dataplane::model::Protocol::Tcp,
        port: 80,
    };
    rig::netns::in_netns(&rig.node_ns, || {
        let mut s = dataplane::ipvs::genl::IpvsSocket::open().expect("IPVS");
        Ok(s.dests(&id).expect("chat's real servers"))
    })
    .expect("the node's namespace")
}

#[test]
fn ipvs_graceful_termination_in_guest() {
    guest::test_in_guest(
        "guest_ipvs_graceful_termination",
        &[],
        std::time::Duration::from_secs(300),
    );
}

/// IPVS graceful termination with a real TCP connection: chat's only endpoint is replaced
/// while a connection to it is open. The old real server stays, at weight 0, and the
/// connection keeps working; new connections reach only the new endpoint; once the
/// connection is gone (reset), a later sync deletes the old server.
#[test]
#[ignore = "runs inside the QEMU guest, through ipvs_graceful_termination_in_guest"]
fn guest_ipvs_graceful_termination() {
    guest::require_guest();
    let s = scenario();
    let opts = RigOptions {
        mode: Mode::Ipvs,
        responder_mode: ResponderMode::Echo,
        extra_slices: vec![chat_slice(&[endpoint(EP_CHAT2, "test-node")])],
        ..RigOptions::default()
    };
    let mut rig = Rig::build("graceful_termination/ipvs", &s, opts).expect("the rig");
    rig.program();
    let chat = s.flows[1].clone();
    let (mut conn, greeting) = rig
        .connect(&chat)
        .unwrap_or_else(|o| panic!("connecting to chat: {o}"));
    let old: SocketAddr = format!("{EP_CHAT}:8080").parse().expect("socket address");
    match greeting {
        Outcome::Reply { local, .. } if local == old => {}
        other => panic!("chat greeting: expected a reply from {old}, got {other}"),
    }
    let mut echo = |msg: &str| -> std::io::Result<String> {
        conn.get_mut().write_all(msg.as_bytes())?;
        let mut line = String::new();
        conn.read_line(&mut line)?;
        Ok(line)
    };
    assert_eq!(echo("before\n").expect("echo before"), "before\n");

    let mut slices = s.endpoint_slices.clone();
    slices[1] = chat_slice(&[endpoint(EP_CHAT2, "test-node")]);
    rig.reprogram(s.services.clone(), slices.clone());
    let servers = chat_servers(&rig);
    let by_addr = |a: &str| servers.iter().find(|d| d.addr.to_string() == a).cloned();
    let draining =
        by_addr(EP_CHAT).unwrap_or_else(|| panic!("the old server went at once: {servers:?}"));
    assert_eq!(
        (draining.weight, draining.active_conns),
        (0, 1),
        "the old server drains at weight 0 with its connection: {servers:?}"
    );
    assert_eq!(by_addr(EP_CHAT2).map(|d| d.weight), Some(1), "{servers:?}");
    assert_eq!(
        echo("after\n").expect("the draining connection keeps working"),
        "after\n"
    );
    let mut fresh = chat.clone();
    fresh.name = "pod to chat (old endpoint draining)".into();
    fresh.expect = Expect::dnat(&[&format!("{EP_CHAT2}:8080")], false);
    rig.assert_flows(&[fresh.clone()]);

    // A reset ends the connection at once (IPVS keeps it 10 s in CLOSE); syncs after that
    // delete the old server. Bounded.
    socket2::SockRef::from(conn.get_ref())
        .set_linger(Some(std::time::Duration::ZERO))
        .expect("SO_LINGER 0");
    drop(conn);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(45);
    loop {
        rig.reprogram(s.services.clone(), slices.clone());
        let servers = chat_servers(&rig);
        if servers.iter().all(|d| d.addr.to_string() != EP_CHAT) {
            assert_eq!(servers.len(), 1, "{servers:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the old server outlived its connection by 45 s: {servers:?}"
        );
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    rig.assert_flows(&[fresh]);
}

#[test]
fn established_connection_survives_resync() {
    established_survives(Mode::Nftables);
}

#[test]
fn iptables_established_connection_survives_resync() {
    established_survives(Mode::Iptables);
}

fn established_survives(mode: Mode) {
    let s = scenario();
    let Some(mut rig) = Rig::build(
        &format!("established_connection_survives_resync/{}", mode.as_str()),
        &s,
        options(ResponderMode::Echo, mode),
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

/// `switchyard run --manifests` in the node namespace; killed (SIGKILL) on drop.
struct AgentProcess {
    child: Option<std::process::Child>,
    log: std::path::PathBuf,
}

impl AgentProcess {
    /// Watching the manifests the rig writes.
    fn start(rig: &Rig, dir: &std::path::Path, n: usize) -> AgentProcess {
        let (_, manifests) = rig.write_state(dir);
        Self::start_with(
            rig,
            dir,
            n,
            &["--manifests".as_ref(), manifests.as_os_str()],
        )
    }

    fn start_with(
        rig: &Rig,
        dir: &std::path::Path,
        n: usize,
        source: &[&std::ffi::OsStr],
    ) -> AgentProcess {
        let (config, _) = rig.write_state(dir);
        let log = dir.join(format!("agent-{n}.log"));
        let child = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &rig.node_ns,
                env!("CARGO_BIN_EXE_switchyard"),
                "run",
            ])
            .arg("--config")
            .arg(&config)
            .args(source)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("agent log"))
            .spawn()
            .expect("start switchyard run");
        AgentProcess {
            child: Some(child),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().expect("SIGKILL the agent");
            c.wait().expect("reap the agent");
        }
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Waits (bounded) until every flow passes; panics with the reports and the agent's log.
fn wait_flows(rig: &Rig, flows: &[Flow], agent: &AgentProcess, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let reports = rig.check_flows(flows);
        if reports.iter().all(|r| r.status == rig::Status::Pass) {
            return;
        }
        if std::time::Instant::now() > deadline {
            let lines: Vec<String> = reports
                .iter()
                .map(|r| format!("{} {:?}: {} / {}", r.name, r.status, r.expected, r.observed))
                .collect();
            panic!(
                "timed out waiting for {what}\n{}\n--- agent log ---\n{}\n--- ruleset ---\n{}",
                lines.join("\n"),
                agent.log(),
                rig.ruleset()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn agent_follows_changes_and_restarts_without_failing_a_connection() {
    agent_follows_changes(Mode::Nftables);
}

#[test]
fn iptables_agent_follows_changes_and_restarts_without_failing_a_connection() {
    agent_follows_changes(Mode::Iptables);
}

fn agent_follows_changes(mode: Mode) {
    let s = scenario();
    let Some(mut rig) = Rig::build(
        &format!(
            "agent_follows_changes_and_restarts_without_failing_a_connection/{}",
            mode.as_str()
        ),
        &s,
        options(ResponderMode::OneShot, mode),
    ) else {
        return;
    };
    let dir = rig.workdir().join("agent");
    let mut agent = AgentProcess::start(&rig, &dir, 0);
    wait_flows(&rig, &s.flows, &agent, "the first sync");

    // Scale: A goes, C comes; the agent sees the edited file and traffic follows.
    rig.set_state(s.services.clone(), changed_slices(&s));
    rig.write_state(&dir);
    wait_flows(
        &rig,
        &[web_after(), s.flows[1].clone()],
        &agent,
        "the edited endpoints",
    );

    // kill -9 and start again while a client opens new connections: none may fail, because
    // the rules stay in the kernel and the new agent replaces them in one transaction.
    let (n, bad) = restart_under_load(&rig, &s.flows[1], &mut agent, || {
        AgentProcess::start(&rig, &dir, 1)
    });
    assert!(n > 5, "only {n} connections were tried");
    assert!(
        bad.is_empty(),
        "{} of {n} connections failed: {bad:?}",
        bad.len()
    );
    wait_flows(
        &rig,
        &[web_after(), s.flows[1].clone()],
        &agent,
        "after the restart",
    );

    // Delete the web service (and its slice): its address is now an unallocated ClusterIP
    // inside the service CIDR, which kube-proxy's nftables mode drops (conformance case
    // "packet to unallocated cluster IP inside service CIDR"), so connections time out.
    let services: Vec<_> = s
        .services
        .iter()
        .filter(|x| x.name != "web")
        .cloned()
        .collect();
    let slices: Vec<_> = changed_slices(&s)
        .into_iter()
        .filter(|x| x.service != "web")
        .collect();
    rig.set_state(services, slices);
    rig.write_state(&dir);
    let mut deleted = web_after();
    deleted.name = "pod to web (deleted)".into();
    if mode == Mode::Iptables {
        // iptables mode has no rule for unallocated cluster IPs (the case's modeDifferences):
        // the packet leaves un-NATed, so no endpoint may answer.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let outcome = rig.probe_once(&deleted);
            if !matches!(outcome, Outcome::Reply { .. }) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the deleted service still answers: {outcome}\n{}",
                agent.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        wait_flows(
            &rig,
            &[s.flows[1].clone()],
            &agent,
            "chat after the deletion",
        );
        return;
    }
    deleted.expect = Expect::verdict(rig::cases::Verdict::Drop);
    wait_flows(
        &rig,
        &[deleted, s.flows[1].clone()],
        &agent,
        "the deleted service",
    );
}

/// Opens new connections to `flow` in a loop until `stop`; returns how many were tried and
/// the failures.
fn probe_until(
    rig: &Rig,
    flow: &Flow,
    stop: &std::sync::atomic::AtomicBool,
) -> (usize, Vec<String>) {
    let mut bad = Vec::new();
    let mut n = 0;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        n += 1;
        match rig.probe_once(flow) {
            Outcome::Reply { .. } => {}
            other => bad.push(format!("connection {n}: {other}")),
        }
    }
    (n, bad)
}

/// `kill -9` the agent and start it again while a client opens new connections to `flow`
/// in a loop, until the new agent's first (full) sync has replaced every chain; `agent`
/// becomes the new one. Returns how many connections were tried and the failures.
fn restart_under_load(
    rig: &Rig,
    flow: &Flow,
    agent: &mut AgentProcess,
    start: impl FnOnce() -> AgentProcess,
) -> (usize, Vec<String>) {
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let prober = scope.spawn(|| probe_until(rig, flow, &stop));
        std::thread::sleep(std::time::Duration::from_millis(300));
        agent.kill9();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let restarted = start();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        while !restarted.log().contains("full sync") {
            if std::time::Instant::now() > deadline {
                stop.store(true, std::sync::atomic::Ordering::SeqCst);
                panic!("restarted agent never synced\n{}", restarted.log());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        *agent = restarted;
        prober.join().expect("prober thread")
    })
}

/// Make the fixture API server hold the rig's current state: apply every object, delete
/// the Services and EndpointSlices it no longer has.
fn publish(
    api: &apiserver::ApiServer,
    rig: &Rig,
    before: &[serde_json::Value],
) -> Vec<serde_json::Value> {
    let now = rig.objects();
    let id = |o: &serde_json::Value| {
        (
            o["kind"].as_str().unwrap_or("").to_string(),
            o["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            o["metadata"]["name"].as_str().unwrap_or("").to_string(),
        )
    };
    let keep: std::collections::BTreeSet<_> = now.iter().map(id).collect();
    for o in before {
        let (kind, ns, name) = id(o);
        if !keep.contains(&(kind.clone(), ns.clone(), name.clone())) {
            api.delete(&kind, &ns, &name);
        }
    }
    for o in &now {
        api.apply(o.clone());
    }
    now
}

#[test]
fn agent_on_the_api_server_keeps_traffic_flowing_through_outages_and_restarts() {
    let s = scenario();
    let Some(mut rig) = Rig::build(
        "agent_on_the_api_server_keeps_traffic_flowing_through_outages_and_restarts",
        &s,
        options(ResponderMode::Echo, Mode::Nftables),
    ) else {
        return;
    };
    // The API server listens inside the node namespace, which is the rig's own: a fixed
    // port cannot collide with another test, and it can rebind it after an outage.
    let node_ns = rig.node_ns.clone();
    let api = apiserver::ApiServer::start(move || {
        rig::netns::in_netns(&node_ns, || std::net::TcpListener::bind("127.0.0.1:6443"))
            .expect("binding the fixture API server in the node namespace")
    });
    let mut published = publish(&api, &rig, &[]);
    let dir = rig.workdir().join("agent-api");
    std::fs::create_dir_all(&dir).expect("agent dir");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).expect("kubeconfig");
    let source = ["--kubeconfig".as_ref(), kubeconfig.as_os_str()];
    let mut agent = AgentProcess::start_with(&rig, &dir, 0, &source);
    wait_flows(&rig, &s.flows, &agent, "the first sync from the API server");

    // Scale web: A goes, C comes, through the watch.
    rig.set_state(s.services.clone(), changed_slices(&s));
    published = publish(&api, &rig, &published);
    let chat = s.flows[1].clone();
    wait_flows(
        &rig,
        &[web_after(), chat.clone()],
        &agent,
        "the scaled endpoints",
    );

    // The API server goes away for 10 s. An established connection and new connections to
    // existing services keep working; a change made meanwhile applies once it is back.
    let (mut conn, _) = rig
        .connect(&chat)
        .unwrap_or_else(|o| panic!("connecting to chat before the outage: {o}"));
    let mut echo = |msg: &str| -> String {
        let mut line = String::new();
        if let Err(e) = conn.get_mut().write_all(msg.as_bytes()) {
            return format!("write failed: {e}");
        }
        match conn.read_line(&mut line) {
            Ok(_) => line,
            Err(e) => format!("read failed: {e}"),
        }
    };
    assert_eq!(echo("before the outage\n"), "before the outage\n");
    api.stop();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (n, bad) = std::thread::scope(|scope| {
        let prober = scope.spawn(|| probe_until(&rig, &chat, &stop));
        std::thread::sleep(std::time::Duration::from_secs(10));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        prober.join().expect("prober thread")
    });
    assert!(n > 5, "only {n} connections were tried during the outage");
    assert!(
        bad.is_empty(),
        "{} of {n} connections failed during the outage: {bad:?}\n{}",
        bad.len(),
        agent.log()
    );
    assert_eq!(
        echo("after the outage\n"),
        "after the outage\n",
        "the established connection must survive the outage"
    );
    // Changed while the server was down: web goes back to {A, B}.
    rig.set_state(s.services.clone(), s.endpoint_slices.clone());
    published = publish(&api, &rig, &published);
    wait_flows(
        &rig,
        &[web_after(), chat.clone()],
        &agent,
        "the old rules during the outage",
    );
    api.resume();
    wait_flows(&rig, &s.flows, &agent, "the change made during the outage");

    // kill -9 and start again while a client opens new connections: none may fail.
    let (n, bad) = restart_under_load(&rig, &chat, &mut agent, || {
        AgentProcess::start_with(&rig, &dir, 1, &source)
    });
    assert!(n > 5, "only {n} connections were tried across the restart");
    assert!(
        bad.is_empty(),
        "{} of {n} connections failed across the restart: {bad:?}",
        bad.len()
    );
    wait_flows(&rig, &s.flows, &agent, "after the restart");

    // Delete web: an unallocated cluster IP inside the service CIDR is dropped.
    let services: Vec<_> = s
        .services
        .iter()
        .filter(|x| x.name != "web")
        .cloned()
        .collect();
    let slices: Vec<_> = s
        .endpoint_slices
        .iter()
        .filter(|x| x.service != "web")
        .cloned()
        .collect();
    rig.set_state(services, slices);
    publish(&api, &rig, &published);
    let mut deleted = s.flows[0].clone();
    deleted.name = "pod to web (deleted)".into();
    deleted.expect = Expect::verdict(rig::cases::Verdict::Drop);
    wait_flows(&rig, &[deleted, chat], &agent, "the deleted service");
}
