//! Logic tests of the nftables backend on the fake executor.

use super::diff::{apply, diff, Op};
use super::generations::next_generation;
use super::kernel::FakeNft;
use super::plan;
use super::tables::Ruleset;
use super::NftBackend;
use crate::backend::{Backend, CheckStep, Scope};
use crate::model::*;
use std::net::IpAddr;

/// Render text with each element list on one line, for substring checks.
fn flat(text: &str) -> String {
    text.replace(",\n\t", ", ")
        .replace("{\n\t", "{ ")
        .replace("\n}", " }")
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn node() -> NodeConfig {
    NodeConfig {
        name: "test-node".into(),
        node_ips: vec![ip("192.168.0.2")],
        local_detector: LocalDetector::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]),
        masquerade_bit: 14,
        node_port_addresses: NodePortAddresses::Cidrs(vec!["192.168.0.2/32".parse().unwrap()]),
        service_cidrs: vec!["172.30.0.0/16".parse().unwrap()],
        ..NodeConfig::default()
    }
}

pub(super) fn port(ns: &str, name: &str, cip: &str, p: u16) -> ServicePort {
    ServicePort::cluster(
        ServicePortName::new(ns, name, "http", Protocol::Tcp),
        ip(cip),
        p,
    )
}

pub(super) fn snapshot(services: Vec<(ServicePort, Vec<&str>)>) -> Snapshot {
    let mut s = Snapshot {
        node: node(),
        ..Snapshot::default()
    };
    for (svc, eps) in services {
        s.endpoints.insert(
            svc.name.clone(),
            eps.iter().map(|e| Endpoint::ready(ip(e), 8080)).collect(),
        );
        s.services.insert((svc.name.clone(), svc.family), svc);
    }
    s
}

fn big(n: usize, eps: usize) -> Snapshot {
    let services = (0..n)
        .map(|i| {
            let svc = port(
                "ns",
                &format!("svc{i}"),
                &format!("172.30.{}.{}", i / 250, i % 250 + 1),
                80,
            );
            (svc, vec![])
        })
        .collect();
    let mut s = snapshot(services);
    for (i, (name, _)) in s
        .services
        .keys()
        .cloned()
        .collect::<Vec<_>>()
        .into_iter()
        .enumerate()
    {
        let list = (0..eps)
            .map(|j| Endpoint::ready(ip(&format!("10.{}.{}.{}", i / 250, i % 250, j + 1)), 8080))
            .collect();
        s.endpoints.insert(name, list);
    }
    s
}

#[test]
fn render_is_deterministic_and_complete() {
    let mut svc = port("ns1", "svc1", "172.30.0.41", 80);
    svc.node_port = 3001;
    svc.external_ips = vec![ip("192.168.99.11")];
    svc.load_balancer_ips = vec![ip("1.2.3.4")];
    let s = snapshot(vec![(svc, vec!["10.180.0.1", "10.180.2.1"])]);
    let a = flat(&NftBackend::<FakeNft>::render(&s).to_nft());
    let b = flat(&NftBackend::<FakeNft>::render(&s).to_nft());
    assert_eq!(a, b);
    for needle in [
        "add table ip switchyard",
        "add table ip6 switchyard",
        "172.30.0.41 . tcp . 80 : goto cluster-2",
        "192.168.99.11 . tcp . 80 : goto external-2",
        "1.2.3.4 . tcp . 80 : goto external-2",
        "tcp . 3001 : goto nodeport-2",
        "172.30.0.41 . tcp . 80 . 0 : 10.180.0.1 . 8080",
        "172.30.0.41 . tcp . 80 . 1 : 10.180.2.1 . 8080",
        "numgen random mod 2 map @backends",
        "ip saddr != 10.0.0.0/8 jump mark-for-masquerade",
        "add element ip switchyard service-cidrs { 172.30.0.0/16 }",
    ] {
        assert!(a.contains(needle), "render lacks {needle:?}:\n{a}");
    }
}

#[test]
fn a_first_sync_shares_every_set_s_elements_with_the_desired_ruleset_instead_of_copying() {
    let (desired, _) = plan::desired(&big(20, 3), &Ruleset::default());
    let tx = diff(&Ruleset::default(), &desired, false);
    let mut shared = 0;
    for op in &tx.ops {
        if let Op::AddElements {
            family,
            set,
            elements,
        } = op
        {
            let want = &desired.table(*family).unwrap().sets[set].elements;
            assert!(
                elements.shares_with(want),
                "{set}: the transaction copied its elements"
            );
            shared += elements.len();
        }
    }
    let total: usize = desired.tables.values().map(|t| t.element_count()).sum();
    assert!(total >= 60, "the layout has {total} elements");
    assert_eq!(shared, total);
    // What it commits is still every element.
    assert_eq!(apply(&Ruleset::default(), &tx).unwrap(), desired);
}

#[test]
fn service_without_endpoints_rejects_on_every_front_end() {
    let mut svc = port("ns1", "svc1", "172.30.0.41", 80);
    svc.node_port = 3001;
    svc.external_ips = vec![ip("192.168.99.11")];
    let s = snapshot(vec![(svc, vec![])]);
    let (rs, _) = plan::desired(&s, &Ruleset::default());
    let t = rs.table(IpFamily::V4).unwrap();
    let none = &t.sets[plan::MAP_NO_ENDPOINT_SERVICES].elements;
    assert_eq!(
        none.text_of("172.30.0.41 . tcp . 80"),
        Some(Some("goto reject-chain".into()))
    );
    assert_eq!(
        none.text_of("192.168.99.11 . tcp . 80"),
        Some(Some("goto reject-chain".into()))
    );
    assert_eq!(
        t.sets[plan::MAP_NO_ENDPOINT_NODEPORTS]
            .elements
            .text_of("tcp . 3001"),
        Some(Some("goto reject-chain".into()))
    );
    assert!(t.sets[plan::MAP_SERVICE_IPS].elements.is_empty());
    assert!(t.sets[plan::SET_CLUSTER_IPS]
        .elements
        .contains_key("172.30.0.41"));
}

#[test]
fn diff_applied_to_old_gives_new() {
    let a = big(20, 3);
    let mut b = a.clone();
    let first = b.endpoints.keys().next().unwrap().clone();
    crate::model::edit_endpoints(b.endpoints.get_mut(&first).unwrap(), |e| {
        e.push(Endpoint::ready(ip("10.9.9.9"), 8080))
    });
    let (ra, _) = plan::desired(&a, &Ruleset::default());
    let (rb, _) = plan::desired(&b, &ra);
    let tx = diff(&ra, &rb, false);
    let got = apply(&ra, &tx).unwrap();
    assert_eq!(got.tables.len(), 2);
    for f in IpFamily::ALL {
        let (g, w) = (got.table(f).unwrap(), rb.table(f).unwrap());
        assert_eq!(g.sets, w.sets);
        for (name, c) in &w.chains {
            assert!(c.same_as(&g.chains[name]), "chain {name} differs");
        }
        assert_eq!(g.chains.len(), w.chains.len());
    }
    assert!(diff(&rb, &rb, false).is_empty(), "no-op sync must be empty");
}

#[test]
fn one_endpoint_change_touches_few_elements_at_any_scale() {
    for n in [100, 1000] {
        let a = big(n, 10);
        let mut b = a.clone();
        let key = b.endpoints.keys().nth(n / 2).unwrap().clone();
        crate::model::edit_endpoints(b.endpoints.get_mut(&key).unwrap(), |list| {
            list.remove(3);
        });
        let (ra, _) = plan::desired(&a, &Ruleset::default());
        let (rb, _) = plan::desired(&b, &ra);
        let tx = diff(&ra, &rb, false);
        let st = tx.stats();
        // Slot 3 refilled by the last endpoint, slot 9 deleted, dispatch re-pointed to
        // cluster-9 (a new chain with 2 rules); the hairpin pair of the removed endpoint goes.
        assert!(
            st.elements_added <= 3 && st.elements_deleted <= 4,
            "{st:?} at {n}"
        );
        assert_eq!(st.chains_written, 1, "{st:?}");
    }
}

#[test]
fn failed_apply_keeps_kernel_state_and_next_sync_rereads() {
    let mut be = NftBackend::new(FakeNft::default());
    let s = snapshot(vec![(port("a", "b", "172.30.0.1", 80), vec!["10.0.0.1"])]);
    be.sync(&s, Scope::AllServices).unwrap();
    let before = be.executor().state.clone();
    let mut s2 = s.clone();
    crate::model::edit_endpoints(s2.endpoints.values_mut().next().unwrap(), |e| {
        e.push(Endpoint::ready(ip("10.0.0.2"), 8080))
    });
    be.exec.fail_next = true;
    assert!(be.sync(&s2, Scope::AllServices).is_err());
    assert_eq!(
        be.executor().state,
        before,
        "a failed commit changes nothing"
    );
    let r = be.sync(&s2, Scope::AllServices).unwrap();
    assert!(r.stats.elements_added > 0);
    let r = be.sync(&s2, Scope::AllServices).unwrap();
    assert_eq!(r.stats.operations(), 0, "{}", r.summary());
}

/// Someone deletes our IPv4 `services` chain.
fn drop_services_chain(rs: &mut Ruleset) {
    let table = rs.tables.get_mut(&IpFamily::V4).expect("an IPv4 table");
    table.chains.remove("services");
}

/// The IPv4 backends map of `rs`.
pub(super) fn backends_mut(rs: &mut Ruleset) -> &mut super::tables::Set {
    rs.tables
        .get_mut(&IpFamily::V4)
        .unwrap()
        .sets
        .get_mut(plan::MAP_BACKENDS)
        .unwrap()
}

#[test]
fn kernel_drift_is_repaired_by_a_full_sync() {
    let mut be = NftBackend::new(FakeNft::default());
    let s = snapshot(vec![(port("a", "b", "172.30.0.1", 80), vec!["10.0.0.1"])]);
    be.sync(&s, Scope::AllServices).unwrap();
    let want = be.executor().state.clone();
    backends_mut(&mut be.exec.state).elements.clear();
    be.exec
        .state
        .tables
        .get_mut(&IpFamily::V4)
        .unwrap()
        .chains
        .get_mut("services")
        .unwrap()
        .rules
        .pop();
    let r = be.sync(&s, Scope::RepairAll).unwrap();
    assert!(r.stats.elements_added >= 1);
    assert_eq!(
        be.executor().state.table(IpFamily::V4).unwrap().sets,
        want.table(IpFamily::V4).unwrap().sets
    );
    assert_eq!(
        be.executor().state.table(IpFamily::V4).unwrap().chains["services"]
            .rules
            .len(),
        2
    );
}

/// Someone sets a policy of drop on one of our base chains: the check names the chain and
/// the repair makes it anew with ours (a flush would keep theirs), its rules and all.
#[test]
fn a_base_chain_policy_someone_changed_is_put_back() {
    let mut be = NftBackend::new(FakeNft::default());
    let s = snapshot(vec![(port("a", "b", "172.30.0.1", 80), vec!["10.0.0.1"])]);
    be.sync(&s, Scope::AllServices).unwrap();
    let want = be.executor().state.clone();
    let ours = want.table(IpFamily::V4).unwrap().chains["filter-forward"].clone();
    let hook = ours.hook.clone().expect("a base chain");
    assert!(hook.ends_with("policy accept;"), "{hook}");
    be.exec.foreign(|rs| {
        let chain = rs
            .tables
            .get_mut(&IpFamily::V4)
            .unwrap()
            .chains
            .get_mut("filter-forward");
        chain.unwrap().hook = Some(hook.replace("policy accept;", "policy drop;"));
    });
    let read = be.begin_check().expect("a check")().expect("a read");
    assert!(be.finish_check(read));
    assert_eq!(
        steps(&mut be),
        [format!(
            "{} chain filter-forward: rules changed",
            IpFamily::V4
        )]
    );
    be.sync(&s, Scope::RepairAll).unwrap();
    let tx = be.exec.last.clone().expect("the repair");
    let made_anew: Vec<&Op> = tx
        .ops
        .iter()
        .filter(|op| {
            matches!(op, Op::FlushChain { family: IpFamily::V4, name } | Op::DeleteChain { family: IpFamily::V4, name } | Op::AddChain { family: IpFamily::V4, name, .. } if name == "filter-forward")
        })
        .collect();
    assert!(
        matches!(made_anew[..], [Op::FlushChain { .. }, Op::DeleteChain { .. }, Op::AddChain { hook: Some(h), .. }] if *h == hook),
        "{made_anew:?}"
    );
    assert_eq!(be.executor().state, want);
}

/// A read that overlapped commits can miss elements that never moved, the same ones in a
/// second read too; each element such a read finds different is looked up again, and only
/// what the kernel still lacks counts, at once.
#[test]
fn elements_an_overlapping_read_misses_are_looked_up_before_they_count() {
    let mut be = NftBackend::new(FakeNft::default());
    let s = crate::synth::cluster(4, 3);
    be.sync(&s, Scope::RepairAll).unwrap();
    let result = |be: &mut NftBackend<FakeNft>, read: Ruleset| {
        assert!(be.begin_verify());
        assert!(be.finish_check(crate::backend::Readback(Box::new((read, None::<u32>)))));
        loop {
            match be.check_step(std::time::Duration::ZERO) {
                Some(Ok(CheckStep::More)) => continue,
                Some(Ok(CheckStep::Done(r))) => return r,
                other => panic!("{other:?}"),
            }
        }
    };
    let (key, _) = first_backend(&be);
    // The read missed an element the kernel holds: nothing to repair.
    let mut read = be.exec.state.clone();
    backends_mut(&mut read).elements.remove(&key);
    let r = result(&mut be, read.clone());
    assert_eq!(r.differences, Vec::<String>::new());
    assert_eq!(be.exec.looked_up, 1);
    // The kernel lacks it too: a difference, sure at once.
    be.exec
        .foreign(|rs| drop(backends_mut(rs).elements.remove(&key)));
    let r = result(&mut be, read);
    assert_eq!(
        r.differences,
        [format!(
            "{} set backends: element {key} missing",
            IpFamily::V4
        )]
    );
    assert!(r.consistent);
    // A chain a read misses cannot be looked up: a second read must confirm it.
    be.sync(&s, Scope::RepairAll).unwrap();
    let mut read = be.exec.state.clone();
    drop_services_chain(&mut read);
    let r = result(&mut be, read);
    assert_eq!(
        r.differences,
        [format!("{} chain services missing", IpFamily::V4)]
    );
    assert!(!r.consistent);
}

#[test]
fn only_our_own_commits_since_the_last_match_prove_the_kernel_unchanged() {
    let mut be = NftBackend::new(FakeNft::default());
    assert!(!be.kernel_unchanged(), "nothing programmed yet");
    let one = port("a", "b", "172.30.0.1", 80);
    let s = snapshot(vec![(one.clone(), vec!["10.0.0.1"])]);
    be.sync(&s, Scope::AllServices).unwrap();
    assert!(be.kernel_unchanged(), "read, then our one commit");
    let s2 = snapshot(vec![(one.clone(), vec!["10.0.0.1", "10.0.0.2"])]);
    let changed = [("a".to_string(), "b".to_string())].into();
    let r = be.sync(&s2, Scope::Services(&changed)).unwrap();
    assert!(!r.full && r.stats.operations() > 0);
    assert!(be.kernel_unchanged(), "a partial commit of ours");

    // Someone else commits: only a read can tell whether our table was touched.
    be.exec.foreign(|_| {});
    assert!(!be.kernel_unchanged());
    // Our next commit does not restore the proof: the chain is broken.
    let s3 = snapshot(vec![(one.clone(), vec!["10.0.0.3"])]);
    be.sync(&s3, Scope::Services(&changed)).unwrap();
    assert!(!be.kernel_unchanged());
    // A read no commit overlapped that finds our state whole restores it...
    assert!(be.begin_verify());
    let read = be.exec.state.clone();
    let at = be.exec.generation;
    assert_eq!(compare(&mut be, read, Some(at)), Vec::<String>::new());
    assert!(be.kernel_unchanged());
    // ...but not one that commits overlapped, nor one beside a commit of ours.
    be.exec.foreign(|_| {});
    assert!(be.begin_verify());
    let read = be.exec.state.clone();
    assert_eq!(compare(&mut be, read, None), Vec::<String>::new());
    assert!(!be.kernel_unchanged());
    assert!(be.begin_verify());
    let (read, at) = (be.exec.state.clone(), be.exec.generation);
    be.sync(&s2, Scope::Services(&changed)).unwrap();
    assert_eq!(compare(&mut be, read, Some(at)), Vec::<String>::new());
    assert!(!be.kernel_unchanged());

    // A full sync re-reads and re-establishes it; a failed commit drops it.
    be.sync(&s2, Scope::RepairAll).unwrap();
    assert!(be.kernel_unchanged());
    be.exec.fail_next = true;
    assert!(be.sync(&s3, Scope::Services(&changed)).is_err());
    assert!(!be.kernel_unchanged());
}

/// At 100k services the backends map holds 1M elements, which the kernel takes 40 s to
/// dump: a set over the read limit is not read back but flushed and filled in the same
/// transaction, at start-up and in a repair; and a check looks its elements up instead.
#[test]
fn sets_too_large_to_read_back_are_flushed_and_filled_and_checks_look_their_elements_up() {
    let s = crate::synth::cluster(4, 3);
    let backends = |be: &NftBackend<FakeNft>| {
        be.exec.state.table(IpFamily::V4).unwrap().sets[plan::MAP_BACKENDS]
            .elements
            .clone()
    };
    let mut first = NftBackend::new(FakeNft::default());
    first.sync(&s, Scope::RepairAll).unwrap();
    let want = backends(&first);
    assert_eq!(want.len(), 12);
    // Someone deletes one element of the map and adds one of their own.
    let (k, v) = want
        .iter()
        .next()
        .map(|(k, v)| (k.text(), v.map(|v| v.text())))
        .unwrap();
    let mut exec = first.exec.clone();
    exec.foreign(|rs| {
        let m = &mut backends_mut(rs).elements;
        m.remove(&k);
        m.insert("172.16.250.1 . tcp . 80 . 0", v.as_deref());
    });

    // A restarted agent, its snapshot over the limit: the map is not read, but flushed.
    let mut be = NftBackend::new(exec).with_read_limit(8);
    be.sync(&s, Scope::RepairAll).unwrap();
    let tx = be.exec.last.clone().unwrap();
    assert!(tx
        .ops
        .iter()
        .any(|op| matches!(op, Op::FlushSet { set, .. } if set == plan::MAP_BACKENDS)));
    assert!(
        !tx.ops
            .iter()
            .any(|op| matches!(op, Op::FlushSet { set, .. } if set == plan::SET_CLUSTER_IPS)),
        "small sets are read and patched"
    );
    assert_eq!(backends(&be), want);
    assert!(!be.exec.state.table(IpFamily::V4).unwrap().sets[plan::MAP_BACKENDS].unread);

    // A repair flushes it too, and finds drift only in what it read.
    let r = be.sync(&s, Scope::RepairAll).unwrap();
    assert!(!r.drift);
    be.exec.foreign(drop_services_chain);
    let r = be.sync(&s, Scope::RepairAll).unwrap();
    assert!(r.drift);
    assert_eq!(backends(&be), want);

    // A repair keeps each endpoint's slot as committed, though it did not read the map: an
    // endpoint gone from the middle of a list leaves the others where they were, which a
    // layout from scratch would not.
    let mut fewer = s.clone();
    let svc = fewer.endpoints.keys().next().unwrap().clone();
    crate::model::edit_endpoints(fewer.endpoints.get_mut(&svc).unwrap(), |eps| {
        eps.remove(0);
    });
    let changed = [(svc.namespace.to_string(), svc.name.to_string())].into();
    be.sync(&fewer, Scope::Services(&changed)).unwrap();
    let kept = backends(&be);
    let mut scratch = NftBackend::new(FakeNft::default());
    scratch.sync(&fewer, Scope::RepairAll).unwrap();
    assert_ne!(
        backends(&scratch),
        kept,
        "the test needs slots a fresh layout would move"
    );
    be.sync(&fewer, Scope::RepairAll).unwrap();
    let tx = be.exec.last.as_ref().unwrap();
    assert!(tx.ops.iter().any(|op| matches!(op, Op::FlushSet { .. })));
    assert_eq!(backends(&be), kept);

    // A check reads the rest and looks the map's elements up, between syncs.
    assert_eq!(check(&mut be), (Vec::<String>::new(), true));
    // A change of ours between the read and the lookups is no difference.
    let fewer_yet = {
        let mut f = fewer.clone();
        crate::model::edit_endpoints(f.endpoints.get_mut(&svc).unwrap(), |eps| {
            eps.remove(0);
        });
        f
    };
    let read = be.begin_check().unwrap()().unwrap();
    be.sync(&fewer_yet, Scope::Services(&changed)).unwrap();
    assert!(be.finish_check(read));
    assert_eq!(steps(&mut be), Vec::<String>::new());
    // A read that comes back after a failed sync ends the check: nothing is recorded on.
    let read = be.begin_check().unwrap()().unwrap();
    be.exec.fail_next = true;
    assert!(be.sync(&fewer, Scope::Services(&changed)).is_err());
    assert!(!be.finish_check(read));
    assert!(be.verifying.is_none() && be.check.is_none());
    be.sync(&fewer_yet, Scope::RepairAll).unwrap();
    // Someone else's change to the map is found by the lookups alone.
    let (key, _) = first_backend(&be);
    be.exec.foreign(|rs| {
        backends_mut(rs)
            .elements
            .insert(&key, Some("10.9.9.9 . 80"));
    });
    let (found, looked_up) = check(&mut be);
    assert!(looked_up, "{found:?}");
    assert_eq!(
        found,
        [format!(
            "{} set backends: element {key} changed",
            IpFamily::V4
        )]
    );
    // The repair that follows reports drift, though what it reads holds none; the next not.
    assert!(be.sync(&fewer_yet, Scope::RepairAll).unwrap().drift);
    assert!(!be.sync(&fewer_yet, Scope::RepairAll).unwrap().drift);
    // Nor after a repair whose own read found drift as well.
    let (key, _) = first_backend(&be);
    be.exec.foreign(|rs| {
        backends_mut(rs)
            .elements
            .insert(&key, Some("10.9.9.9 . 80"));
    });
    assert_eq!(
        check(&mut be),
        (
            vec![format!(
                "{} set backends: element {key} changed",
                IpFamily::V4
            )],
            true
        )
    );
    be.exec.foreign(drop_services_chain);
    assert!(be.sync(&fewer_yet, Scope::RepairAll).unwrap().drift);
    assert!(!be.sync(&fewer_yet, Scope::RepairAll).unwrap().drift);
    // Under the limit there is nothing to look up.
    let mut small = NftBackend::new(be.exec.clone());
    small.sync(&fewer_yet, Scope::RepairAll).unwrap();
    assert_eq!(check(&mut small), (Vec::<String>::new(), false));
}

/// A check's read, its comparison and, where the read left sets out, their lookups, to
/// the end: what it found, and whether it looked anything up.
fn check(be: &mut NftBackend<FakeNft>) -> (Vec<String>, bool) {
    let read = be.begin_check().expect("a check")().expect("the read");
    assert!(be.finish_check(read));
    let found = steps(be);
    let looked_up = be.exec.looked_up > 0;
    be.exec.looked_up = 0;
    (found, looked_up)
}

/// A read begun with `begin_verify`, taken at `generation`, compared to the end.
fn compare(be: &mut NftBackend<FakeNft>, read: Ruleset, generation: Option<u32>) -> Vec<String> {
    assert!(be.finish_check(crate::backend::Readback(Box::new((read, generation)))));
    steps(be)
}

pub(super) fn steps(be: &mut NftBackend<FakeNft>) -> Vec<String> {
    for _ in 0..10_000 {
        match be.check_step(std::time::Duration::ZERO) {
            Some(Ok(CheckStep::More)) => continue,
            Some(Ok(CheckStep::Done(r))) => return r.differences,
            other => panic!("{other:?}"),
        }
    }
    panic!("the lookups never end");
}

pub(super) fn first_backend(be: &NftBackend<FakeNft>) -> (String, Option<String>) {
    let (k, v) = be.exec.state.table(IpFamily::V4).unwrap().sets[plan::MAP_BACKENDS]
        .elements
        .iter()
        .next()
        .unwrap();
    (k.text(), v.map(|v| v.text()))
}

#[test]
fn commits_by_others_to_their_own_tables_keep_the_kernel_unchanged_and_one_to_ours_does_not() {
    let mut be = NftBackend::new(FakeNft::default());
    let one = port("a", "b", "172.30.0.1", 80);
    let changed = [("a".to_string(), "b".to_string())].into();
    be.sync(
        &snapshot(vec![(one.clone(), vec!["10.0.0.1"])]),
        Scope::AllServices,
    )
    .unwrap();
    assert!(be.kernel_unchanged());

    // A CNI plugin commits to its own table, before and between commits of ours.
    be.exec.foreign_elsewhere();
    assert!(be.kernel_unchanged(), "a commit elsewhere, seen");
    be.exec.foreign_elsewhere();
    let s2 = snapshot(vec![(one.clone(), vec!["10.0.0.1", "10.0.0.2"])]);
    be.sync(&s2, Scope::Services(&changed)).unwrap();
    be.exec.foreign_elsewhere();
    assert!(be.kernel_unchanged(), "ours and theirs interleaved");

    // One the listener did not see (our commit ran without it) cannot be vouched for.
    be.exec.generation = next_generation(be.exec.generation);
    assert!(!be.kernel_unchanged());
    be.sync(&s2, Scope::RepairAll).unwrap();
    assert!(be.kernel_unchanged(), "a full sync read the kernel again");

    // Someone else commits to our table right after a commit of ours, before we ask the
    // generation, and the listener has not seen it yet: it is not taken for ours.
    be.exec.foreign_after_next_commit = true;
    let s4 = snapshot(vec![(one.clone(), vec!["10.0.0.4"])]);
    be.sync(&s4, Scope::Services(&changed)).unwrap();
    assert!(!be.kernel_unchanged());
    be.exec.catch_up();
    assert!(!be.kernel_unchanged());
    be.sync(&s2, Scope::RepairAll).unwrap();
    assert!(be.kernel_unchanged());

    // Someone else's commit to our table: only a read can tell, now and after later
    // commits of ours and theirs.
    be.exec.foreign(|_| {});
    assert!(!be.kernel_unchanged());
    let s3 = snapshot(vec![(one.clone(), vec!["10.0.0.3"])]);
    be.sync(&s3, Scope::Services(&changed)).unwrap();
    be.exec.foreign_elsewhere();
    assert!(!be.kernel_unchanged());
}

#[test]
fn cleanup_removes_both_tables_only() {
    let mut be = NftBackend::new(FakeNft::default());
    be.sync(&snapshot(vec![]), Scope::AllServices).unwrap();
    assert_eq!(be.cleanup().unwrap(), 2);
    assert!(be.executor().state.tables.is_empty());
    let tx = be.executor().last.clone().unwrap();
    assert!(tx.ops.iter().all(|op| matches!(op, Op::DeleteTable(_))));
}

#[test]
fn conflicting_front_ends_keep_the_first_service() {
    let mut a = port("a", "one", "172.30.0.1", 80);
    a.external_ips = vec![ip("192.168.99.11")];
    let mut b = port("b", "two", "172.30.0.2", 80);
    b.external_ips = vec![ip("192.168.99.11")];
    let s = snapshot(vec![(a, vec!["10.0.0.1"]), (b, vec!["10.0.0.2"])]);
    let (rs, report) = plan::desired(&s, &Ruleset::default());
    assert_eq!(report.conflicts.len(), 1);
    assert!(
        report.conflicts[0].contains("b/two:http/tcp"),
        "{:?}",
        report.conflicts
    );
    let be = &rs.table(IpFamily::V4).unwrap().sets[plan::MAP_BACKENDS].elements;
    assert_eq!(
        be.text_of("192.168.99.11 . tcp . 80 . 0"),
        Some(Some("10.0.0.1 . 8080".into()))
    );
}

#[test]
fn ipv6_services_go_to_the_ip6_table() {
    let s = snapshot(vec![(
        port("a", "b", "fd00:172:30::41", 80),
        vec!["fd00:10:180::1"],
    )]);
    let text = flat(&NftBackend::<FakeNft>::render(&s).to_nft());
    assert!(text.contains("add element ip6 switchyard service-ips { fd00:172:30::41 . tcp . 80 : goto cluster-1 }"), "{text}");
    assert!(text.contains(
        "dnat ip6 to ip6 daddr . meta l4proto . th dport . numgen random mod 1 map @backends"
    ));
}

#[test]
fn a_family_the_kernel_refuses_does_not_hold_back_the_other() {
    let mut be = NftBackend::new(FakeNft {
        fail_family: Some(IpFamily::V6),
        ..FakeNft::default()
    });
    let v4 = port("a", "web", "172.30.0.1", 80);
    let v6 = port("a", "web6", "fd00:172:30::1", 80);
    let s = snapshot(vec![
        (v4.clone(), vec!["10.0.0.1"]),
        (v6.clone(), vec!["fd00:10::1"]),
    ]);
    let err = be.sync(&s, Scope::AllServices).unwrap_err().to_string();
    assert!(
        err.contains("IPv6") && err.contains("other family"),
        "{err}"
    );
    let state = &be.executor().state;
    assert!(state.table(IpFamily::V4).is_some(), "IPv4 is programmed");
    assert!(state.table(IpFamily::V6).is_none());

    // The next sync (after a failure, a whole one) still moves IPv4 on.
    let s2 = snapshot(vec![(v4, vec!["10.0.0.2"]), (v6, vec!["fd00:10::1"])]);
    assert!(be.sync(&s2, Scope::AllServices).is_err());
    let v4_backends =
        &be.executor().state.table(IpFamily::V4).unwrap().sets[plan::MAP_BACKENDS].elements;
    assert!(
        v4_backends
            .values()
            .any(|v| v.is_some_and(|v| v == "10.0.0.2 . 8080")),
        "{v4_backends:?}"
    );
}

/// Kubernetes' e2e spec "should be able to switch session affinity for service with type
/// clusterIP" (test/e2e/network/service.go, execAffinityTestForNonLBServiceWithTransition):
/// once sessionAffinity goes from ClientIP to None, new connections spread over every
/// endpoint again, so what the packet path remembered for that front end must go, in a
/// long-lived agent too (whose first sync saw no remembering front end at all).
#[test]
fn switching_affinity_off_forgets_the_remembered_clients() {
    let mut be = NftBackend::new(FakeNft::default());
    let plain = snapshot(vec![(
        port("a", "other", "172.30.0.9", 80),
        vec!["10.0.0.9"],
    )]);
    be.sync(&plain, Scope::AllServices).unwrap();

    let mut sticky = port("a", "web", "172.30.0.1", 80);
    sticky.session_affinity = SessionAffinity::ClientIp {
        timeout_seconds: 10800,
    };
    let web = |svc: &ServicePort| {
        let mut s = plain.clone();
        s.endpoints.insert(
            svc.name.clone(),
            vec![
                Endpoint::ready(ip("10.0.0.1"), 8080),
                Endpoint::ready(ip("10.0.0.2"), 8080),
            ]
            .into(),
        );
        s.services
            .insert((svc.name.clone(), svc.family), svc.clone());
        s
    };
    let changed: std::collections::BTreeSet<crate::backend::ServiceKey> =
        [("a".to_string(), "web".to_string())].into();
    be.sync(&web(&sticky), Scope::Services(&changed)).unwrap();
    // A client connects and the packet path remembers its endpoint.
    let key = "10.0.0.50 . 172.30.0.1 . tcp . 80".to_string();
    be.exec
        .remembered
        .entry(IpFamily::V4)
        .or_default()
        .insert(&key, Some("10.0.0.2 . 8080"));

    let mut plain_web = sticky.clone();
    plain_web.session_affinity = SessionAffinity::None;
    be.sync(&web(&plain_web), Scope::Services(&changed))
        .unwrap();
    assert!(
        !be.exec.remembered[&IpFamily::V4].contains_key(&key),
        "the client is still held to its old endpoint: {:?}",
        be.exec.remembered
    );
}

/// `n` endpoints of `service` in `s`, at addresses of their own.
fn with_endpoints(mut s: Snapshot, service: usize, n: usize) -> Snapshot {
    let name = s.services.keys().nth(service).unwrap().0.clone();
    let list = (0..n)
        .map(|j| {
            Endpoint::ready(
                ip(&format!(
                    "10.{}.{}.{}",
                    200 + j / 62_500,
                    j / 250 % 250,
                    j % 250 + 1
                )),
                8080,
            )
        })
        .collect();
    s.endpoints.insert(name, list);
    s
}

#[test]
fn a_partial_sync_that_outgrows_a_sets_size_replaces_the_table_with_a_larger_one() {
    use super::skeleton::MAP_BACKENDS;
    let size =
        |be: &NftBackend<FakeNft>| be.exec.state.tables[&IpFamily::V4].sets[MAP_BACKENDS].size;
    // 1,000 services x 5 endpoints: 5,000 backends, more than sets are left unsized with.
    let s1 = big(1000, 5);
    let mut be = NftBackend::new(FakeNft::default());
    be.sync(&s1, Scope::AllServices).unwrap();
    assert_eq!(size(&be), Some(12_288));
    let changed = [("ns".to_string(), "svc0".to_string())].into();

    // Within the size: in place, elements only.
    let s2 = with_endpoints(s1.clone(), 0, 7000);
    let r = be.sync(&s2, Scope::Services(&changed)).unwrap();
    let tx = be.exec.last.clone().unwrap();
    assert!(!tx
        .ops
        .iter()
        .any(|op| matches!(op, Op::DeleteTable(_) | Op::AddSet { .. })));
    assert!(r.stats.elements_added > 6995);
    assert_eq!(size(&be), Some(12_288));

    // Past it: the kernel would refuse the elements, so the table is laid out anew, larger,
    // in one commit.
    let s3 = with_endpoints(s2.clone(), 0, 8000);
    be.sync(&s3, Scope::Services(&changed)).unwrap();
    let tx = be.exec.last.clone().unwrap();
    assert!(tx.ops.contains(&Op::DeleteTable(IpFamily::V4)));
    assert_eq!(size(&be), Some(24_576));
    let (want, _) = plan::desired(&s3, &Ruleset::default());
    assert_eq!(
        be.exec.state.tables[&IpFamily::V4].sets[MAP_BACKENDS].elements,
        want.tables[&IpFamily::V4].sets[MAP_BACKENDS].elements
    );

    // And the next change is in place again.
    let s4 = with_endpoints(s3, 0, 8001);
    be.sync(&s4, Scope::Services(&changed)).unwrap();
    let tx = be.exec.last.clone().unwrap();
    assert!(!tx.ops.iter().any(|op| matches!(op, Op::DeleteTable(_))));
}

/// The in-place update changes both families before it finds a set outgrown in one: the
/// full layout must start from what the kernel holds, or the other family's changes would
/// never be committed.
#[test]
fn an_outgrown_set_in_one_family_leaves_the_other_familys_change_committed() {
    use super::skeleton::MAP_BACKENDS;
    let mut s1 = big(1000, 5);
    let name = s1.services.keys().next().unwrap().0.clone();
    let v6 = ServicePort::cluster(name.clone(), ip("fd00::10"), 80);
    s1.services.insert((name.clone(), IpFamily::V6), v6);
    let with = |v4: usize, v6: &str| {
        let mut s = with_endpoints(s1.clone(), 0, v4);
        let mut list = s.endpoints[&name].to_vec();
        list.push(Endpoint::ready(ip(v6), 8080));
        s.endpoints.insert(name.clone(), list.into());
        s
    };
    let mut be = NftBackend::new(FakeNft::default());
    be.sync(&with(5, "fd00::1"), Scope::AllServices).unwrap();
    let changed = [(name.namespace.to_string(), name.name.to_string())].into();
    // The IPv4 backends outgrow their size; the IPv6 endpoint changes.
    let s2 = with(13_000, "fd00::2");
    be.sync(&s2, Scope::Services(&changed)).unwrap();
    let (want, _) = plan::desired(&s2, &Ruleset::default());
    for family in IpFamily::ALL {
        assert_eq!(
            be.exec.state.tables[&family].sets[MAP_BACKENDS].elements,
            want.tables[&family].sets[MAP_BACKENDS].elements,
            "{family}"
        );
    }
    let v6 = &be.exec.state.tables[&IpFamily::V6].sets[MAP_BACKENDS].elements;
    assert!(v6
        .iter()
        .any(|(_, v)| v.is_some_and(|v| v.text().contains("fd00::2"))));
}
