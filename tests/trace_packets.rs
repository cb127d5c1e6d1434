//! `switchyard trace` against real packets on random clusters. Seeded random node states
//! (every Service type, TCP and UDP, target ports apart from ports, both traffic policies,
//! external and load-balancer IPs, an external IP that is another Service's cluster IP,
//! source ranges that admit or refuse the client, endpoints local and remote in every
//! condition, masqueradeAll and the local detector on and off, IPv4 or IPv6) are traced
//! flow by flow; then each is built in network namespaces (tests/rig), programmed with
//! `sync --once`, and every sampled flow's real packets must do exactly what trace said:
//! verdict, the set of endpoints reached, masquerade.
//!
//! nftables and iptables modes on the host; IPVS mode in the QEMU guest (tests/guest), whose
//! kernel has IPVS. SWITCHYARD_TRACE_CASES node states per mode (default 2 on the host, 1
//! in the guest), SWITCHYARD_PROPERTY_SEED moves them; a failure names its seed.
//! Needs root; prints SKIP otherwise (fails if SWITCHYARD_REQUIRE_NETNS=1).

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod guest;
mod rig;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use rig::cases::{
    EndpointSlice, Expect, Flow, Mode, NodeConfig, Protocol, Scenario, Service, ServicePort,
    SlicePort, SourceKind, TargetPort, Verdict,
};
use rig::net::Outcome;
use rig::random::{env_or, Rng};
use rig::{Rig, RigOptions, Status};

/// The most flows probed per node state (DNAT flows make 36 connections each).
const FLOWS: usize = 28;

/// Per endpoint, whether trace says its connections are masqueraded (hairpin flows).
type Hairpin = Option<BTreeMap<String, bool>>;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The addresses of one family.
struct Plan {
    v6: bool,
}

impl Plan {
    fn addr(&self, v4: String, v6: String) -> IpAddr {
        ip(if self.v6 { &v6 } else { &v4 })
    }
    fn cluster_ip(&self, i: usize) -> IpAddr {
        self.addr(
            format!("172.30.0.{}", 10 + i),
            format!("fd00:172:30::{:x}", 10 + i),
        )
    }
    /// An endpoint: `node` 0 is this node's pods, 1 and 2 remote nodes'.
    fn endpoint(&self, node: usize, n: usize) -> IpAddr {
        self.addr(
            format!("10.180.{node}.{n}"),
            format!("fd00:10:180::{node}:{n:x}"),
        )
    }
    fn pod_client(&self) -> IpAddr {
        self.addr("10.0.0.2".into(), "fd00:10::2".into())
    }
    fn external_client(&self) -> IpAddr {
        self.addr("203.0.113.2".into(), "2600:5200::1".into())
    }
    fn primary(&self) -> IpAddr {
        self.addr("192.168.0.2".into(), "2001:db8::1".into())
    }
    fn host(&self, ip: IpAddr) -> String {
        format!("{ip}/{}", if self.v6 { 128 } else { 32 })
    }
}

fn node(rng: &mut Rng, plan: &Plan) -> NodeConfig {
    let detector = !rng.one_in(4);
    NodeConfig {
        name: "test-node".into(),
        ip_family: if plan.v6 { "IPv6" } else { "IPv4" }.into(),
        ips: ["192.168.0.2", "192.168.1.2", "2001:db8::1", "2001:db8:1::2"]
            .map(ip)
            .to_vec(),
        primary_ip: plan.primary(),
        pod_cidr: None,
        cluster_cidr: detector.then(|| {
            if plan.v6 {
                "fd00:10::/32"
            } else {
                "10.0.0.0/8"
            }
            .into()
        }),
        local_detect_mode: Some(if detector { "ClusterCIDR" } else { "None" }.into()),
        service_cidrs: vec![if plan.v6 {
            "fd00:172:30::/112"
        } else {
            "172.30.0.0/16"
        }
        .into()],
        masquerade_all: rng.one_in(4),
        node_port_addresses: if rng.one_in(2) {
            None
        } else {
            Some(vec![plan.host(plan.primary())])
        },
        localhost_node_ports: rng.one_in(2),
        zone: None,
        bridge_interface: None,
        interface_name_prefix: None,
    }
}

/// One random Service `i` and its slice.
fn service(rng: &mut Rng, plan: &Plan, i: usize) -> (Service, EndpointSlice) {
    let type_ = rng
        .pick(&["ClusterIP", "NodePort", "LoadBalancer"])
        .to_string();
    let mut ports = Vec::new();
    let mut slice_ports = Vec::new();
    for k in 0..1 + rng.below(2) {
        let protocol = rng.pick(&[Protocol::Tcp, Protocol::Udp]);
        let port = rng.pick(&[80u16, 53, 443, 8080, 65535]) - k as u16;
        let target = rng.pick(&[port, 8000 + k as u16, 1]);
        ports.push(ServicePort {
            name: format!("p{k}"),
            port,
            protocol,
            node_port: (type_ != "ClusterIP").then_some(30000 + (i * 2 + k) as u16),
            target_port: Some(TargetPort::Number(target)),
        });
        slice_ports.push(SlicePort {
            name: format!("p{k}"),
            port: target,
            protocol,
        });
    }
    let mut external_ips = Vec::new();
    if rng.one_in(3) {
        // Now and then another Service's cluster IP, which must keep its own traffic.
        external_ips.push(if i > 0 && rng.one_in(2) {
            plan.cluster_ip(0).to_string()
        } else {
            plan.addr(format!("192.0.2.{i}"), format!("2001:db8:e::{i:x}"))
                .to_string()
        });
    }
    let lb = type_ == "LoadBalancer";
    let local = type_ != "ClusterIP" && rng.one_in(2);
    let service = Service {
        namespace: format!("ns{i}"),
        name: format!("svc{i}"),
        type_: type_.clone(),
        cluster_ip: Some(plan.cluster_ip(i).to_string()),
        cluster_ips: Vec::new(),
        ports,
        external_ips,
        load_balancer_ips: if lb {
            vec![plan
                .addr(format!("198.18.0.{i}"), format!("2001:db8:b::{i:x}"))
                .to_string()]
        } else {
            Vec::new()
        },
        load_balancer_source_ranges: if lb && rng.one_in(2) {
            vec![rng
                .pick(&if plan.v6 {
                    ["2600:5200::/64", "2001:db8:5::/64"]
                } else {
                    ["203.0.113.0/24", "198.51.100.0/24"]
                })
                .to_string()]
        } else {
            Vec::new()
        },
        external_traffic_policy: if local { "Local" } else { "Cluster" }.into(),
        internal_traffic_policy: rng.pick(&["Cluster", "Local"]).into(),
        // Affinity pins one client to one endpoint, which the rig's endpoint-set check
        // cannot see; tests/affinity.rs checks it with real packets.
        session_affinity: "None".into(),
        session_affinity_timeout_seconds: None,
        health_check_node_port: local.then_some(32000 + i as u16),
        notes: None,
    };
    let mut endpoints = Vec::new();
    for n in 1..=rng.below(4) {
        let node_index = rng.below(3);
        let (ready, serving, terminating) = rng.pick(&[
            (None, None, None),
            (Some(true), Some(true), Some(false)),
            (Some(false), Some(true), Some(true)),
            (Some(false), Some(false), Some(true)),
        ]);
        endpoints.push(rig::cases::Endpoint {
            addresses: vec![plan.endpoint(node_index, i * 8 + n)],
            node_name: Some(
                if node_index == 0 {
                    "test-node"
                } else {
                    "other"
                }
                .into(),
            ),
            ready,
            serving,
            terminating,
            hints: None,
        });
    }
    let slice = EndpointSlice {
        namespace: service.namespace.clone(),
        service: service.name.clone(),
        name: format!("svc{i}-1"),
        address_type: if plan.v6 { "IPv6" } else { "IPv4" }.into(),
        ports: slice_ports,
        endpoints,
    };
    (service, slice)
}

/// Every flow worth asking about: each front end of each port from each kind of client.
fn flows(plan: &Plan, services: &[Service], slices: &[EndpointSlice]) -> Vec<Flow> {
    let mut out = Vec::new();
    let mut add = |name: String, kind: SourceKind, source: IpAddr, to: IpAddr, port, proto| {
        out.push(Flow::new(
            &name,
            kind,
            source,
            to,
            port,
            proto,
            Expect::verdict(Verdict::Drop),
        ))
    };
    let (pod, ext, primary) = (plan.pod_client(), plan.external_client(), plan.primary());
    for (s, slice) in services.iter().zip(slices) {
        let local_endpoint = slice
            .endpoints
            .iter()
            .find(|e| e.node_name.as_deref() == Some("test-node"))
            .map(|e| e.addresses[0]);
        for p in &s.ports {
            let cluster_ip = ip(s.cluster_ip.as_deref().unwrap());
            let n = format!("{}/{} {}", s.name, p.name, p.protocol);
            let (port, proto) = (p.port, p.protocol);
            add(
                format!("{n} pod -> cluster IP"),
                SourceKind::Pod,
                pod,
                cluster_ip,
                port,
                proto,
            );
            add(
                format!("{n} node -> cluster IP"),
                SourceKind::Node,
                primary,
                cluster_ip,
                port,
                proto,
            );
            add(
                format!("{n} external -> cluster IP"),
                SourceKind::External,
                ext,
                cluster_ip,
                port,
                proto,
            );
            if let Some(me) = local_endpoint {
                add(
                    format!("{n} endpoint -> own cluster IP"),
                    SourceKind::EndpointSelf,
                    me,
                    cluster_ip,
                    port,
                    proto,
                );
            }
            if let Some(np) = p.node_port {
                add(
                    format!("{n} external -> node port"),
                    SourceKind::External,
                    ext,
                    primary,
                    np,
                    proto,
                );
                add(
                    format!("{n} pod -> node port"),
                    SourceKind::Pod,
                    pod,
                    primary,
                    np,
                    proto,
                );
                add(
                    format!("{n} node -> node port"),
                    SourceKind::Node,
                    primary,
                    primary,
                    np,
                    proto,
                );
                if !plan.v6 {
                    add(
                        format!("{n} localhost -> node port"),
                        SourceKind::Localhost,
                        ip("127.0.0.1"),
                        ip("127.0.0.1"),
                        np,
                        proto,
                    );
                }
            }
            for e in s.external_ips.iter().map(|e| ip(e)) {
                add(
                    format!("{n} external -> external IP {e}"),
                    SourceKind::External,
                    ext,
                    e,
                    port,
                    proto,
                );
                add(
                    format!("{n} pod -> external IP {e}"),
                    SourceKind::Pod,
                    pod,
                    e,
                    port,
                    proto,
                );
            }
            for lb in s.load_balancer_ips.iter().map(|e| ip(e)) {
                add(
                    format!("{n} external -> LB IP"),
                    SourceKind::External,
                    ext,
                    lb,
                    port,
                    proto,
                );
                add(
                    format!("{n} pod -> LB IP"),
                    SourceKind::Pod,
                    pod,
                    lb,
                    port,
                    proto,
                );
                add(
                    format!("{n} node -> LB IP"),
                    SourceKind::Node,
                    primary,
                    lb,
                    port,
                    proto,
                );
            }
        }
    }
    out
}

/// What `switchyard trace` says `flow` does on this node state, and for a hairpin flow
/// (one endpoint masqueraded, the others not) whether each endpoint is masqueraded.
fn trace(config: &std::path::Path, manifests: &std::path::Path, flow: &Flow) -> (Expect, Hairpin) {
    let got = flow.trace(config, manifests);
    let verdict: Verdict = serde_json::from_value(got["verdict"].clone()).unwrap();
    let endpoints = got["endpoints"].as_array().unwrap();
    // The rig checks one masquerade for every connection of a flow; a hairpin flow has one
    // endpoint masqueraded (the source itself) and the others not, checked apart.
    let each: BTreeMap<String, bool> = endpoints
        .iter()
        .map(|e| {
            let ep = e["endpoint"].as_str().unwrap().to_string();
            (ep, e["masquerade"].as_bool().unwrap())
        })
        .collect();
    let mixed = each.values().collect::<BTreeSet<_>>().len() > 1;
    let expect = Expect {
        verdict,
        endpoints: endpoints
            .iter()
            .map(|e| e["endpoint"].as_str().unwrap().to_string())
            .collect(),
        masquerade: (verdict == Verdict::Dnat && !mixed)
            .then(|| got["masquerade"].as_bool().unwrap()),
    };
    (expect, mixed.then_some(each))
}

/// A random node state whose sampled flows carry trace's answers as their expectations.
fn traced_scenario(
    seed: u64,
    mode: Mode,
    dir: &std::path::Path,
) -> (Scenario, BTreeMap<String, BTreeMap<String, bool>>) {
    let mut rng = Rng(seed);
    let plan = Plan { v6: rng.one_in(3) };
    let node = node(&mut rng, &plan);
    let (services, slices): (Vec<_>, Vec<_>) = (0..3 + rng.below(3))
        .map(|i| service(&mut rng, &plan, i))
        .unzip();
    let config = dir.join("config.yaml");
    let manifests = dir.join("objects.yaml");
    std::fs::write(&config, rig::manifests::kube_proxy_config(&node, mode)).unwrap();
    std::fs::write(
        &manifests,
        rig::manifests::manifests_yaml(&node, &services, &slices),
    )
    .unwrap();
    let mut all = flows(&plan, &services, &slices);
    while all.len() > FLOWS {
        all.swap_remove(rng.below(all.len()));
    }
    let mut hairpins = BTreeMap::new();
    for f in &mut all {
        let (expect, hairpin) = trace(&config, &manifests, f);
        f.expect = expect;
        if let Some(each) = hairpin {
            hairpins.insert(f.name.clone(), each);
        }
    }
    // The rig makes an ACCEPT flow's destination that nobody owns an address of its outside
    // namespace (the flow's sink), so an outside client there would reach it without ever
    // crossing the node: such flows tell nothing and are left out.
    let owned: BTreeSet<IpAddr> = node
        .ips
        .iter()
        .copied()
        .chain(
            slices
                .iter()
                .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone())),
        )
        .collect();
    let sunk: BTreeSet<IpAddr> = all
        .iter()
        .filter(|f| f.expect.verdict == Verdict::Accept && !f.destination.is_loopback())
        .map(|f| f.destination)
        .filter(|d| !owned.contains(d))
        .collect();
    all.retain(|f| !(f.source_kind == SourceKind::External && sunk.contains(&f.destination)));
    let scenario = Scenario {
        id: format!("random-{seed:#x}"),
        group: "random".into(),
        title: String::new(),
        node,
        services,
        endpoint_slices: slices,
        flows: all,
        notes: None,
    };
    (scenario, hairpins)
}

/// A hairpin flow's connections, each against what trace says of the endpoint it reached:
/// masqueraded to a node address, or the client's own address kept.
fn check_hairpin(rig: &Rig, flow: &Flow, each: &BTreeMap<String, bool>) -> Option<String> {
    let mut wrong = Vec::new();
    for _ in 0..rig::DNAT_SAMPLES {
        if let Outcome::Reply { local, peer } = rig.probe_once(flow) {
            let masqueraded = peer != flow.source && rig.node_addrs.contains(&peer);
            match each.get(&local.to_string()) {
                Some(want) if *want == masqueraded => {}
                want => wrong.push(format!("{local} saw {peer} (trace: masquerade {want:?})")),
            }
        }
    }
    (!wrong.is_empty()).then(|| format!("{} (hairpin): {}", flow.name, wrong.join("; ")))
}

fn seeds() -> Vec<u64> {
    let base = env_or("SWITCHYARD_PROPERTY_SEED", 0x7ace_2026);
    (0..env_or("SWITCHYARD_TRACE_CASES", 2))
        .map(|k| base.wrapping_add(k.wrapping_mul(0x9e37_79b9)))
        .collect()
}

fn trace_agrees_with_packets(mode: Mode) {
    let mut verdicts = BTreeSet::new();
    for seed in seeds() {
        let dir = tempfile::tempdir().unwrap();
        let (scenario, hairpins) = traced_scenario(seed, mode, dir.path());
        let test = format!("trace-packets/{}/{seed:#x}", mode.as_str());
        let opts = RigOptions {
            mode,
            ..RigOptions::default()
        };
        let Some(mut rig) = Rig::build(&test, &scenario, opts) else {
            return;
        };
        rig.program();
        let reports = rig.check_flows(&scenario.flows);
        let mut failed: Vec<String> = reports
            .iter()
            .filter(|r| r.status != Status::Pass)
            .map(|r| {
                format!(
                    "{}\n  trace said: {}\n  packets:    {}",
                    r.name, r.expected, r.observed
                )
            })
            .collect();
        for f in scenario
            .flows
            .iter()
            .filter(|f| hairpins.contains_key(&f.name))
        {
            failed.extend(check_hairpin(&rig, f, &hairpins[&f.name]));
        }
        assert!(
            failed.is_empty(),
            "seed {seed:#x} ({}): {} of {} flows differ from trace:\n{}\n--- node state ---\n{}\n--- ruleset ---\n{}",
            mode.as_str(),
            failed.len(),
            reports.len(),
            failed.join("\n"),
            serde_json::to_string_pretty(&scenario).unwrap(),
            rig.ruleset()
        );
        verdicts.extend(scenario.flows.iter().map(|f| f.expect.verdict.to_string()));
    }
    // The walk must reach more than one outcome, or it proves little.
    if !seeds().is_empty() {
        assert!(verdicts.len() >= 2, "only {verdicts:?} reached");
    }
}

/// IPVS mode in the QEMU guest, whose kernel has IPVS: one node state unless
/// SWITCHYARD_TRACE_CASES says otherwise (software emulation makes each connection slow).
#[test]
fn trace_agrees_with_real_packets_on_random_clusters_ipvs_in_guest() {
    let cases = std::env::var("SWITCHYARD_TRACE_CASES").unwrap_or_else(|_| "1".into());
    let seed = std::env::var("SWITCHYARD_PROPERTY_SEED").unwrap_or_else(|_| "2026".into());
    guest::test_in_guest(
        "guest_trace_agrees_with_real_packets_on_random_clusters_ipvs",
        &[
            ("SWITCHYARD_TRACE_CASES", &cases),
            ("SWITCHYARD_PROPERTY_SEED", &seed),
        ],
        std::time::Duration::from_secs(900),
    );
}

#[test]
#[ignore = "runs inside the QEMU guest, through trace_agrees_with_real_packets_on_random_clusters_ipvs_in_guest"]
fn guest_trace_agrees_with_real_packets_on_random_clusters_ipvs() {
    guest::require_guest();
    trace_agrees_with_packets(Mode::Ipvs);
}

#[test]
fn trace_agrees_with_real_packets_on_random_clusters_nftables() {
    trace_agrees_with_packets(Mode::Nftables);
}

#[test]
fn trace_agrees_with_real_packets_on_random_clusters_iptables() {
    trace_agrees_with_packets(Mode::Iptables);
}
