//! Random clusters for property tests on the real kernel: a seeded walk of small clusters
//! with hostile but valid values (every protocol, ports at both ends of their range, both
//! families and dual stack, the longest names the API allows, /0 and host source ranges,
//! affinity timeouts at their bounds, every traffic policy, endpoints in every condition,
//! front ends contested by two services), edited service by service. The same seed gives
//! the same walk in every backend's test (tests/kernel_properties.rs, tests/ipvs.rs).

use dataplane::backend::ServiceKey;
use dataplane::model::*;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

pub const SERVICES: usize = 8;

pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A small deterministic generator: a seed gives the same walk on every run.
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n.max(1)
    }

    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())].clone()
    }

    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

/// The longest DNS label the API allows for a namespace or a Service name.
fn longest_label(c: char) -> String {
    std::iter::repeat_n(c, 63).collect()
}

/// One random service `i`: its ports (every family it has) and its endpoints.
pub fn service(
    rng: &mut Rng,
    i: usize,
) -> (Vec<ServicePort>, BTreeMap<ServicePortName, Vec<Endpoint>>) {
    let namespace = rng.pick(&[
        "default".to_string(),
        longest_label('n'),
        "kube-system".into(),
    ]);
    let name = if rng.one_in(4) {
        format!("{}{i}", &longest_label('s')[..62])
    } else {
        format!("svc-{i}")
    };
    let families = rng.pick(&[
        vec![IpFamily::V4],
        vec![IpFamily::V6],
        IpFamily::ALL.to_vec(),
    ]);
    let protocols = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];
    let edge_ports = [1u16, 2, 53, 80, 1023, 8080, 30000, 65534, 65535];
    let mut ports = Vec::new();
    let mut endpoints = BTreeMap::new();
    let count = 1 + rng.below(3);
    // A contested front end: the cluster IP of service 0, on port 80 as its first port.
    let contested = i > 0 && rng.one_in(6);
    for k in 0..count {
        let port_name = match (count, rng.below(3)) {
            (1, 0) => String::new(),
            (_, 1) => format!("{}{k}", "p".repeat(14)),
            _ => format!("p{k}"),
        };
        let protocol = rng.pick(&protocols);
        let name = ServicePortName::new(&namespace, &name, &port_name, protocol);
        let port = if contested || (i == 0 && k == 0) {
            80
        } else {
            rng.pick(&edge_ports)
        };
        let node_port = if rng.one_in(2) {
            rng.pick(&[30000u16, 32767, 30000 + (i * 10 + k) as u16])
        } else {
            0
        };
        let local = rng.one_in(3);
        let affinity = match rng.below(4) {
            0 => SessionAffinity::ClientIp { timeout_seconds: 1 },
            1 => SessionAffinity::ClientIp {
                timeout_seconds: 86400,
            },
            _ => SessionAffinity::None,
        };
        let distribution = rng.pick(&[
            TrafficDistribution::Unset,
            TrafficDistribution::PreferClose,
            TrafficDistribution::PreferSameZone,
            TrafficDistribution::PreferSameNode,
        ]);
        let internal = rng.pick(&[TrafficPolicy::Cluster, TrafficPolicy::Local]);
        let lb = rng.one_in(2);
        for &family in &families {
            let host = if contested { 1 } else { i + 1 };
            let cluster_ip = match family {
                IpFamily::V4 => ip(&format!("172.30.0.{host}")),
                IpFamily::V6 => ip(&format!("fd00:30::{host:x}")),
            };
            let mut svc = ServicePort::cluster(name.clone(), cluster_ip, port);
            svc.node_port = node_port;
            svc.session_affinity = affinity;
            svc.traffic_distribution = distribution;
            svc.internal_traffic_policy = internal;
            if rng.one_in(3) {
                svc.external_ips = vec![match family {
                    // Now and then another service's cluster IP.
                    IpFamily::V4 if rng.one_in(3) => ip("172.30.0.1"),
                    IpFamily::V4 => ip(&format!("192.0.2.{}", i + 1)),
                    IpFamily::V6 => ip(&format!("2001:db8:e::{:x}", i + 1)),
                }];
            }
            if lb {
                svc.load_balancer_ips = vec![match family {
                    IpFamily::V4 => ip(&format!("203.0.113.{}", i + 1)),
                    IpFamily::V6 => ip(&format!("2001:db8:b::{:x}", i + 1)),
                }];
                if rng.one_in(2) {
                    svc.load_balancer_source_ranges = match family {
                        IpFamily::V4 => vec![
                            "0.0.0.0/0".parse().unwrap(),
                            "198.51.100.7/32".parse().unwrap(),
                        ],
                        IpFamily::V6 => vec![
                            "::/0".parse().unwrap(),
                            "2001:db8:5::1/128".parse().unwrap(),
                        ],
                    };
                }
            }
            if local && (lb || node_port != 0) {
                svc.external_traffic_policy = TrafficPolicy::Local;
                svc.health_check_node_port = 32000 + i as u16;
            }
            ports.push(svc);
        }
        let mut eps = Vec::new();
        for _ in 0..rng.below(5) {
            let host = 1 + rng.below(12);
            let family = rng.pick(&families);
            let address = match family {
                IpFamily::V4 => ip(&format!("10.0.{}.{host}", i % 3)),
                IpFamily::V6 => ip(&format!("fd10::{:x}:{host:x}", i % 3)),
            };
            let (ready, serving, terminating) = rng.pick(&[
                (true, true, false),
                (false, true, true),
                (false, false, true),
            ]);
            let node_name =
                rng.pick::<Option<Arc<str>>>(&[Some("here".into()), Some("there".into()), None]);
            let zone = rng.pick::<Option<Arc<str>>>(&[Some("z1".into()), Some("z2".into()), None]);
            let zones: Vec<Arc<str>> = if rng.one_in(3) {
                vec!["z1".into()]
            } else {
                Vec::new()
            };
            let nodes: Vec<Arc<str>> = if rng.one_in(4) {
                vec!["here".into()]
            } else {
                Vec::new()
            };
            eps.push(
                Endpoint {
                    ready,
                    serving,
                    terminating,
                    node_name,
                    zone,
                    ..Endpoint::ready(address, rng.pick(&[1u16, 8080, 65535]))
                }
                .with_hints(zones, nodes),
            );
        }
        eps.sort();
        eps.dedup_by(|a, b| a.ip == b.ip && a.port == b.port);
        endpoints.insert(name, eps);
    }
    (ports, endpoints)
}

pub fn node() -> NodeConfig {
    NodeConfig {
        name: "here".into(),
        node_ips: vec![ip("192.168.0.2"), ip("2001:db8::2")],
        local_detector: LocalDetector::Cidrs(vec![
            "10.0.0.0/8".parse().unwrap(),
            "fd10::/64".parse().unwrap(),
        ]),
        masquerade_bit: 14,
        node_port_addresses: NodePortAddresses::All,
        service_cidrs: vec![
            "172.30.0.0/16".parse().unwrap(),
            "fd00:30::/108".parse().unwrap(),
        ],
        zone: Some("z1".into()),
        ..NodeConfig::default()
    }
}

pub type Generated = (Vec<ServicePort>, BTreeMap<ServicePortName, Vec<Endpoint>>);

pub fn snapshot(services: &[Option<Generated>]) -> Snapshot {
    let mut s = Snapshot {
        node: node(),
        ..Snapshot::default()
    };
    for (ports, endpoints) in services.iter().flatten() {
        for p in ports {
            s.services.insert((p.name.clone(), p.family), p.clone());
        }
        s.endpoints.extend(
            endpoints
                .iter()
                .map(|(name, eps)| (name.clone(), eps.as_slice().into())),
        );
    }
    s
}

pub fn key_of(g: &Generated) -> ServiceKey {
    g.0[0].name.service_key()
}

/// A random walk: the first cluster, then each edit's cluster and the services it changed.
pub fn walk(seed: u64, edits: usize) -> (Snapshot, Vec<(Snapshot, BTreeSet<ServiceKey>)>) {
    let mut rng = Rng(seed);
    let mut services: Vec<Option<Generated>> = (0..SERVICES)
        .map(|i| (!rng.one_in(4)).then(|| service(&mut rng, i)))
        .collect();
    let first = snapshot(&services);
    let mut steps = Vec::new();
    for _ in 0..edits {
        let i = rng.below(SERVICES);
        let mut changed: BTreeSet<ServiceKey> = services[i].iter().map(key_of).collect();
        services[i] = (!rng.one_in(5)).then(|| service(&mut rng, i));
        changed.extend(services[i].iter().map(key_of));
        steps.push((snapshot(&services), changed));
    }
    (first, steps)
}

pub fn seeds() -> Vec<u64> {
    let base = env_or("SWITCHYARD_PROPERTY_SEED", 0x5eed_2026);
    (0..env_or("SWITCHYARD_PROPERTY_CASES", 6))
        .map(|k| base.wrapping_add(k.wrapping_mul(0x9e37_79b9)))
        .collect()
}
