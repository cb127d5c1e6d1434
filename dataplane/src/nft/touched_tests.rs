//! Checks after someone else changed only elements, chains or rules of our table: the
//! change listener named the elements, and the check looks up just those (and reads our
//! chains and rules back without any element) instead of reading our tables back.

use super::generations::TouchedKey;
use super::kernel::FakeNft;
use super::skeleton::{MAP_AFFINITY, MAP_BACKENDS, SET_CLUSTER_IPS, SET_SERVICE_CIDRS};
use super::tables::Chain;
use super::tests::{backends_mut, first_backend, port, snapshot, steps};
use super::NftBackend;
use crate::backend::{Backend, Scope};
use crate::model::IpFamily;

/// Elements the fake's background reads read back so far.
fn elements_read(be: &NftBackend<FakeNft>) -> usize {
    be.exec
        .elements_read
        .load(std::sync::atomic::Ordering::Relaxed)
}

fn key(set: &str, key: &str) -> TouchedKey {
    (IpFamily::V4, set.to_string(), key.to_string())
}

/// A check to its end: whether it only looked elements up, how many, and what it found.
fn check(be: &mut NftBackend<FakeNft>) -> (bool, usize, Vec<String>) {
    let read = be.begin_check().expect("a check")().expect("its background work");
    assert!(be.finish_check(read));
    let by_lookup = be.checking_by_lookup();
    let found = steps(be);
    let looked_up = std::mem::take(&mut be.exec.looked_up);
    (by_lookup, looked_up, found)
}

#[test]
fn a_check_after_others_changed_only_elements_looks_up_just_those() {
    let mut be = NftBackend::new(FakeNft::default());
    let s = snapshot(vec![(port("a", "b", "172.30.0.1", 80), vec!["10.0.0.1"])]);
    be.sync(&s, Scope::AllServices).unwrap();
    assert!(be.kernel_unchanged());

    // Another program adds an element to our cluster-ips and deletes it in one batch.
    let stranger = key(SET_CLUSTER_IPS, "192.0.2.1");
    be.exec
        .foreign_elements(vec![stranger.clone(), stranger], |_| {});
    assert!(!be.kernel_unchanged());
    assert_eq!(check(&mut be), (true, 1, vec![]));
    assert!(
        be.kernel_unchanged(),
        "their batch is settled by the lookup"
    );

    // It deletes one of ours: its lookup alone finds it missing, and the full sync that
    // repairs it reports drift.
    let (slot, _) = first_backend(&be);
    be.exec
        .foreign_elements(vec![key(MAP_BACKENDS, &slot)], |rs| {
            backends_mut(rs).elements.remove(&slot);
        });
    let missing = format!("{} set backends: element {slot} missing", IpFamily::V4);
    assert_eq!(check(&mut be), (true, 1, vec![missing]));
    assert!(!be.kernel_unchanged());
    assert!(be.sync(&s, Scope::RepairAll).unwrap().drift);
    assert!(be.kernel_unchanged());

    // It adds one to a set of ours that is not: found by its lookup too.
    be.exec
        .foreign_elements(vec![key(SET_CLUSTER_IPS, "192.0.2.9")], |rs| {
            rs.tables
                .get_mut(&IpFamily::V4)
                .unwrap()
                .sets
                .get_mut(SET_CLUSTER_IPS)
                .unwrap()
                .elements
                .insert("192.0.2.9", None);
        });
    let (by_lookup, _, found) = check(&mut be);
    assert!(by_lookup);
    assert_eq!(
        found,
        [format!(
            "{} set cluster-ips: element 192.0.2.9 not ours",
            IpFamily::V4
        )]
    );
    assert!(be.sync(&s, Scope::RepairAll).unwrap().drift);
}

#[test]
fn elements_a_lookup_cannot_settle_and_any_other_change_are_read_back() {
    let mut be = NftBackend::new(FakeNft::default());
    let s = snapshot(vec![(port("a", "b", "172.30.0.1", 80), vec!["10.0.0.1"])]);
    be.sync(&s, Scope::AllServices).unwrap();

    // An interval set's elements are ranges, which lookups by key do not find.
    be.exec
        .foreign_elements(vec![key(SET_SERVICE_CIDRS, "192.0.2.0/24")], |_| {});
    assert_eq!(check(&mut be), (false, 0, vec![]));
    // The affinity map, which the packet path fills and a read leaves out.
    be.exec.foreign_elements(
        vec![key(MAP_AFFINITY, "10.1.1.1 . 172.30.0.1 . tcp . 80")],
        |_| {},
    );
    assert_eq!(check(&mut be), (false, 0, vec![]));
    // A set we do not have.
    be.exec
        .foreign_elements(vec![key("someone-elses", "192.0.2.1")], |_| {});
    assert_eq!(check(&mut be), (false, 0, vec![]));
    // Elements and then anything else.
    be.exec
        .foreign_elements(vec![key(SET_CLUSTER_IPS, "192.0.2.1")], |_| {});
    be.exec.foreign(|_| {});
    assert_eq!(check(&mut be), (false, 0, vec![]));
}

#[test]
fn a_check_after_others_touched_chains_or_rules_reads_back_no_elements() {
    let mut be = NftBackend::new(FakeNft::default());
    let s = snapshot(vec![(port("a", "b", "172.30.0.1", 80), vec!["10.0.0.1"])]);
    be.sync(&s, Scope::AllServices).unwrap();

    // Another program adds a chain to our table and deletes it in one batch: our chains and
    // rules are read back and compared, no element is read or looked up.
    be.exec.foreign_rules(Vec::new(), |_| {});
    assert!(!be.kernel_unchanged());
    assert_eq!(check(&mut be), (true, 0, vec![]));
    assert_eq!(elements_read(&be), 0);
    assert!(be.kernel_unchanged(), "their batch is settled by the check");

    // A chain and one of our elements in one batch: the element's lookup finds it gone.
    let (slot, _) = first_backend(&be);
    be.exec.foreign_rules(vec![key(MAP_BACKENDS, &slot)], |rs| {
        backends_mut(rs).elements.remove(&slot);
    });
    let missing = format!("{} set backends: element {slot} missing", IpFamily::V4);
    assert_eq!(check(&mut be), (true, 1, vec![missing]));
    assert!(be.sync(&s, Scope::RepairAll).unwrap().drift);
    assert!(be.kernel_unchanged());

    // A chain of theirs left in our table and a rule added to one of ours: both found, and
    // repaired.
    be.exec.foreign_rules(Vec::new(), |rs| {
        let t = rs.tables.get_mut(&IpFamily::V4).unwrap();
        t.chains.insert("someone-elses".into(), Chain::default());
        t.chains
            .get_mut("services")
            .expect("our services chain")
            .rules
            .push(String::new());
    });
    let (by_lookup, looked_up, found) = check(&mut be);
    assert!(by_lookup);
    assert_eq!(looked_up, 0);
    assert_eq!(elements_read(&be), 0);
    assert_eq!(
        found,
        [
            format!("{} chain services: rules changed", IpFamily::V4),
            format!("{} chain someone-elses not ours", IpFamily::V4),
        ]
    );
    assert!(be.sync(&s, Scope::RepairAll).unwrap().drift);
    assert!(be.kernel_unchanged());
    assert_eq!(check(&mut be), (false, 0, vec![]), "nothing is held back");
}

/// Our own commit writes a chain while the check of their chain changes runs: the comparison
/// leaves that chain out, so the check vouches for nothing and says so (`overlapped`); the
/// next one, with nothing of ours meanwhile, settles their batch.
#[test]
fn a_check_of_their_chains_that_overlapped_our_chain_writes_reads_again() {
    let mut be = NftBackend::new(FakeNft::default());
    let one = (port("a", "b", "172.30.0.1", 80), vec!["10.0.0.1"]);
    be.sync(&snapshot(vec![one.clone()]), Scope::AllServices)
        .unwrap();
    // Theirs: a chain, perhaps named as one of ours will be.
    be.exec.foreign_rules(Vec::new(), |_| {});
    let read = be.begin_check().expect("a check")().expect("its background work");
    assert!(be.finish_check(read));
    assert!(be.checking_by_lookup());
    // Ours, before the comparison: a service with two endpoints needs a chain of its own.
    let two = (
        port("c", "d", "172.30.0.2", 80),
        vec!["10.0.0.2", "10.0.0.3"],
    );
    let s = snapshot(vec![one, two]);
    be.sync(&s, Scope::AllServices).unwrap();
    let result = loop {
        match be.check_step(std::time::Duration::ZERO) {
            Some(Ok(crate::backend::CheckStep::More)) => continue,
            Some(Ok(crate::backend::CheckStep::Done(r))) => break r,
            other => panic!("{other:?}"),
        }
    };
    assert!(result.overlapped, "{result:?}");
    assert!(result.differences.is_empty());
    assert!(!be.kernel_unchanged(), "their batch is not vouched for");
    assert_eq!(check(&mut be), (true, 0, vec![]));
    assert!(be.kernel_unchanged());
}
