//! In-place updates of changed services against layouts from scratch: over a long random
//! walk of edits, both must give the same ruleset, the same index and, through the strict
//! in-memory kernel, the same result from the patch as from the whole diff.

use super::diff::{apply, diff, patch};
use super::kernel::FakeNft;
use super::plan::{layout, update};
use super::tables::Ruleset;
use super::NftBackend;
use crate::backend::{Backend, Scope, ServiceKey};
use crate::model::*;
use std::collections::BTreeSet;
use std::net::IpAddr;

const SERVICES: usize = 6;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A small deterministic generator; the walk must be the same on every run.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n
    }
}

/// One service, in terms the walk edits.
#[derive(Debug, Clone)]
struct Spec {
    cip: u8,
    ports: Vec<u16>,
    node_port: bool,
    external_ip: bool,
    local: bool,
    dual_stack: bool,
    /// sessionAffinity ClientIP with this timeout.
    affinity: Option<u32>,
    /// A load-balancer IP with loadBalancerSourceRanges.
    ranged_lb: bool,
    /// Endpoint host numbers from a small pool, so services share endpoints (hairpin).
    endpoints: BTreeSet<u8>,
}

fn spec(i: usize) -> Spec {
    Spec {
        cip: i as u8 + 1,
        ports: vec![80],
        node_port: i.is_multiple_of(2),
        external_ip: i.is_multiple_of(3),
        local: false,
        dual_stack: i == 1,
        affinity: (i % 4 == 1).then_some(60 + i as u32 % 2),
        ranged_lb: i % 5 == 2,
        endpoints: (1..=(i as u8 % 4 + 1)).collect(),
    }
}

fn node() -> NodeConfig {
    NodeConfig {
        name: "here".into(),
        node_ips: vec![ip("192.168.0.2")],
        local_detector: LocalDetector::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]),
        masquerade_bit: 14,
        node_port_addresses: NodePortAddresses::All,
        service_cidrs: vec!["172.30.0.0/16".parse().unwrap()],
        ..NodeConfig::default()
    }
}

fn build(specs: &[Option<Spec>]) -> Snapshot {
    let mut s = Snapshot {
        node: node(),
        ..Snapshot::default()
    };
    for (i, sp) in specs.iter().enumerate() {
        let Some(sp) = sp else { continue };
        for (k, p) in sp.ports.iter().enumerate() {
            let name =
                ServicePortName::new("ns", &format!("s{i}"), &format!("p{p}"), Protocol::Tcp);
            let mut families = vec![(ip(&format!("172.30.0.{}", sp.cip)), IpFamily::V4)];
            if sp.dual_stack {
                families.push((ip(&format!("fd00::{}", sp.cip)), IpFamily::V6));
            }
            for (cip, family) in families {
                let mut svc = ServicePort::cluster(name.clone(), cip, *p);
                if sp.node_port {
                    svc.node_port = 30000 + (i * 10 + k) as u16;
                }
                if sp.external_ip {
                    svc.external_ips = vec![ip(&format!("192.168.99.{}", i + 1))];
                }
                if sp.local {
                    svc.external_traffic_policy = TrafficPolicy::Local;
                }
                if let Some(timeout_seconds) = sp.affinity {
                    svc.session_affinity = SessionAffinity::ClientIp { timeout_seconds };
                }
                if sp.ranged_lb {
                    svc.load_balancer_ips = vec![ip(&format!("203.0.113.{}", i + 1))];
                    svc.load_balancer_source_ranges = vec![
                        "198.51.100.0/24".parse().unwrap(),
                        "192.168.0.0/16".parse().unwrap(),
                    ];
                }
                s.services.insert((name.clone(), family), svc);
            }
            let mut eps: Vec<Endpoint> = sp
                .endpoints
                .iter()
                .flat_map(|e| {
                    let here = if e % 2 == 0 { "here" } else { "there" };
                    [
                        Endpoint {
                            node_name: Some(here.into()),
                            ..Endpoint::ready(ip(&format!("10.0.0.{e}")), 8080)
                        },
                        Endpoint {
                            node_name: Some(here.into()),
                            ..Endpoint::ready(ip(&format!("fd10::{e}")), 8080)
                        },
                    ]
                })
                .collect();
            eps.sort();
            s.endpoints.insert(name, eps.into());
        }
    }
    s
}

/// One random edit of service `i`.
fn edit(rng: &mut Lcg, slot: &mut Option<Spec>, i: usize) {
    let Some(sp) = slot else {
        *slot = Some(spec(i));
        return;
    };
    if sp.cip != i as u8 + 1 {
        // A contested front end is given back at the next edit.
        sp.cip = i as u8 + 1;
        return;
    }
    match rng.below(12) {
        0..=2 => {
            if let Some(&e) = sp
                .endpoints
                .iter()
                .nth(rng.below(sp.endpoints.len().max(1)))
            {
                sp.endpoints.remove(&e);
            }
            sp.endpoints.insert(rng.below(12) as u8 + 1);
        }
        3 => {
            sp.endpoints.insert(rng.below(12) as u8 + 1);
        }
        4 => {
            if let Some(&e) = sp.endpoints.iter().next() {
                sp.endpoints.remove(&e);
            }
        }
        5 => sp.endpoints.clear(),
        6 => sp.node_port = !sp.node_port,
        7 => sp.external_ip = !sp.external_ip,
        8 => sp.local = !sp.local,
        9 => {
            sp.dual_stack = !sp.dual_stack;
            match rng.below(3) {
                0 => sp.affinity = sp.affinity.xor(Some(60)),
                1 => sp.ranged_lb = !sp.ranged_lb,
                _ => {}
            }
        }
        10 => {
            if sp.ports.len() < 3 {
                sp.ports.push(81 + sp.ports.len() as u16);
            } else {
                sp.ports.truncate(1);
            }
        }
        _ => {
            if rng.below(3) == 0 {
                // Take the cluster IP of service 0: a contested front end.
                sp.cip = 1;
            } else {
                *slot = None;
            }
        }
    }
}

#[test]
fn in_place_updates_equal_whole_layouts_over_a_random_walk() {
    let mut rng = Lcg(0x5917_c4a2);
    let mut specs: Vec<Option<Spec>> = (0..SERVICES).map(|i| Some(spec(i))).collect();
    let (mut rs, mut index, _) = layout(&build(&specs), &Ruleset::default());
    let (mut updated, mut refused) = (0, 0);
    for step in 0..600 {
        let i = rng.below(SERVICES);
        let mut changed: BTreeSet<ServiceKey> = BTreeSet::new();
        changed.insert(("ns".into(), format!("s{i}")));
        edit(&mut rng, &mut specs[i], i);
        // Now and then two services change in one sync.
        if rng.below(4) == 0 {
            let j = rng.below(SERVICES);
            edit(&mut rng, &mut specs[j], j);
            changed.insert(("ns".into(), format!("s{j}")));
        }
        let snap = build(&specs);
        let (want, want_index, report) = layout(&snap, &rs);
        let (mut got, mut got_index) = (rs.clone(), index.clone());
        match update(&snap, &mut got, &mut got_index, &changed) {
            Some(touched) => {
                assert!(
                    report.conflicts.is_empty(),
                    "step {step}: updated in place past a conflict"
                );
                assert_eq!(got, want, "step {step}: ruleset");
                assert_eq!(got_index, want_index, "step {step}: index");
                // Only what changed is recorded: an element written back as it was is not.
                for (family, t) in &touched {
                    let table = got.table(*family).unwrap();
                    for ((set, key), old) in &t.elements {
                        let now = table.sets.get(*set).and_then(|s| s.elements.text_of(key));
                        assert_ne!(old, &now, "step {step}: {set} {key} recorded unchanged");
                    }
                }
                let tx = patch(&got, &touched);
                let patched =
                    apply(&rs, &tx).unwrap_or_else(|e| panic!("step {step}: {e}\n{}", tx.to_nft()));
                let whole = apply(&rs, &diff(&rs, &want, false)).unwrap();
                assert_eq!(patched, whole, "step {step}: patch and diff disagree");
                assert!(diff(&patched, &want, false).is_empty(), "step {step}");
                updated += 1;
            }
            None => {
                assert_eq!(got, rs, "step {step}: a refused update changed the ruleset");
                assert_eq!(
                    got_index, index,
                    "step {step}: a refused update changed the index"
                );
                refused += 1;
            }
        }
        rs = want;
        index = want_index;
    }
    // The walk must exercise both paths, mostly the in-place one.
    eprintln!("{updated} in place, {refused} refused");
    assert!(updated > 400, "only {updated} in-place updates");
    assert!(refused > 0, "no contested front end was ever met");
}

/// `n` (at most 250) services with `endpoints` endpoints each, half of them on this node.
fn cluster(n: usize, endpoints: u8) -> Snapshot {
    let specs: Vec<Option<Spec>> = (0..n)
        .map(|i| {
            Some(Spec {
                cip: i as u8 + 1,
                endpoints: (1..=endpoints).collect(),
                ranged_lb: false,
                affinity: None,
                ..spec(i)
            })
        })
        .collect();
    build(&specs)
}

#[test]
fn backend_syncs_only_the_changed_service_and_matches_a_whole_sync() {
    let mut s = cluster(200, 5);
    let mut partial = NftBackend::new(FakeNft::default());
    let mut whole = NftBackend::new(FakeNft::default());
    partial.sync(&s, Scope::AllServices).unwrap();
    whole.sync(&s, Scope::AllServices).unwrap();
    let name = ServicePortName::new("ns", "s7", "p80", Protocol::Tcp);
    crate::model::edit_endpoints(s.endpoints.get_mut(&name).unwrap(), |eps| {
        eps.retain(|e| e.ip != ip("10.0.0.3"));
        eps.push(Endpoint::ready(ip("10.0.0.42"), 8080));
        eps.sort();
    });
    let changed = BTreeSet::from([("ns".to_string(), "s7".to_string())]);
    let r = partial.sync(&s, Scope::Services(&changed)).unwrap();
    assert!(!r.full);
    let st = r.stats;
    // One slot re-pointed (delete + add), the hairpin pairs of the old and new endpoint.
    assert!(st.elements_added <= 2 && st.elements_deleted <= 2, "{st:?}");
    assert_eq!(st.chains_written, 0, "{st:?}");
    whole.sync(&s, Scope::AllServices).unwrap();
    assert_eq!(partial.executor().state, whole.executor().state);
    // Nothing left to do afterwards, either way.
    assert_eq!(
        partial
            .sync(&s, Scope::AllServices)
            .unwrap()
            .stats
            .operations(),
        0
    );
    let full = partial.sync(&s, Scope::RepairAll).unwrap();
    assert!(
        !full.drift,
        "the kernel holds what the partial sync said it committed"
    );
}

/// The endpoint count a partial sync reports (kept up to date service by service) is the
/// snapshot's, whatever the edits: endpoints added and removed, services gone and back.
#[test]
fn partial_syncs_report_the_snapshots_endpoint_count() {
    let mut rng = Lcg(0x00e4_d9c1);
    let mut specs: Vec<Option<Spec>> = (0..SERVICES).map(|i| Some(spec(i))).collect();
    let mut be = NftBackend::new(FakeNft::default());
    let first = be.sync(&build(&specs), Scope::AllServices).unwrap();
    assert_eq!(first.endpoints, build(&specs).endpoint_count());
    for step in 0..300 {
        let i = rng.below(SERVICES);
        edit(&mut rng, &mut specs[i], i);
        let changed: BTreeSet<ServiceKey> = [("ns".to_string(), format!("s{i}"))].into();
        let snap = build(&specs);
        let r = be.sync(&snap, Scope::Services(&changed)).unwrap();
        assert_eq!(r.endpoints, snap.endpoint_count(), "step {step}");
    }
}
