//! The IPVS backend on fakes: what a sync asks of the kernel.

use super::genl::{Op, ServiceId, ServiceSpec};
use super::kernel::FakeIpvs;
use super::*;
use crate::iptables::kernel::FakeIptables;
use crate::iptables::plan::TableName;
use crate::model::{Endpoint, Protocol};
use crate::synth;

fn backend() -> IpvsBackend<FakeIpvs, FakeIptables> {
    let mut k = FakeIpvs::default();
    k.addresses.local = vec!["127.0.0.1".parse().unwrap(), "192.168.0.2".parse().unwrap()];
    IpvsBackend::new(k, FakeIptables::default(), IpvsOptions::default())
}

fn id(i: usize) -> ServiceId {
    ServiceId {
        addr: synth::cluster_ip(i),
        protocol: Protocol::Tcp,
        port: 80,
    }
}

fn changed(i: usize) -> BTreeSet<(String, String)> {
    [("bench".to_string(), format!("svc-{i}"))].into()
}

#[test]
fn first_sync_programs_everything() {
    let mut b = backend();
    let snap = synth::cluster(3, 2);
    let r = b.sync(&snap, Scope::AllServices).unwrap();
    assert!(r.full);
    let k = b.kernel();
    assert_eq!(k.sysctls_set, 1);
    assert_eq!(k.services.len(), 3);
    assert!(k.services.values().all(|(_, d)| d.len() == 2));
    assert_eq!(k.addresses.bound.len(), 3);
    assert!(k.ipsets.contains("KUBE-CLUSTER-IP") && k.ipsets.contains("KUBE-6-CLUSTER-IP"));
    let nat = &b.ipt.families[&IpFamily::V4].tables["nat"];
    assert!(nat.jumps_to("PREROUTING", "KUBE-SERVICES"));
    assert!(nat.chains.contains("KUBE-NODE-PORT"));
    let filter = &b.ipt.families[&IpFamily::V4].tables[TableName::Filter.as_str()];
    assert!(filter.jumps_to("INPUT", "KUBE-IPVS-FILTER"));
    // 3 services + 6 servers, one request each, plus the dump.
    assert_eq!(b.last.operations, 9);
    assert_eq!(b.last.requests, 10);
}

#[test]
fn one_endpoint_change_is_one_netlink_request() {
    let mut b = backend();
    let mut snap = synth::cluster(50, 10);
    b.sync(&snap, Scope::AllServices).unwrap();
    let inputs = b.ipt.inputs.len();
    synth::replace_endpoint(&mut snap, 7, 3, 1);
    b.sync(&snap, Scope::Services(&changed(7))).unwrap();
    // Add the new server, delete the old one (no connections, so no dump).
    assert_eq!(
        b.last.operations,
        2,
        "{:?}",
        &b.kernel().ops[b.kernel().ops.len() - 2..]
    );
    assert_eq!(
        b.last.requests, 3,
        "a TCP removal reads the connection counts first"
    );
    assert_eq!(
        b.ipt.inputs.len(),
        inputs,
        "iptables rules do not change per service"
    );
    let mut ep = Endpoint::ready(synth::endpoint_ip(7, 50, 0), 8080);
    ep.node_name = None;
    let name = crate::model::ServicePortName::new("bench", "svc-7", "http", Protocol::Tcp);
    crate::model::edit_endpoints(snap.endpoints.get_mut(&name).unwrap(), |e| e.push(ep));
    b.sync(&snap, Scope::Services(&changed(7))).unwrap();
    assert_eq!((b.last.operations, b.last.requests), (1, 1));
}

#[test]
fn removed_tcp_server_with_connections_drains_then_goes() {
    let mut b = backend();
    // Every partial sync looks at drained servers again (by default every 5 s).
    b.drain_recheck = std::time::Duration::ZERO;
    let mut snap = synth::cluster(2, 2);
    b.sync(&snap, Scope::AllServices).unwrap();
    let gone = synth::endpoint_ip(1, 0, 0);
    b.kernel_mut()
        .services
        .get_mut(&id(1))
        .unwrap()
        .1
        .values_mut()
        .find(|d| d.addr == gone)
        .unwrap()
        .active_conns = 2;
    crate::model::edit_endpoints(snap.endpoints.values_mut().nth(1).unwrap(), |eps| {
        eps.retain(|e| e.ip != gone)
    });
    let report = b.sync(&snap, Scope::Services(&changed(1))).unwrap();
    assert_eq!(report.endpoints, 3, "the count kept service by service");
    assert_eq!(
        b.kernel().ops.last(),
        Some(&Op::UpdateDest(id(1), gone, 8080, 0))
    );
    assert_eq!(b.draining(), 1);
    // Another service changes; the drained one is looked at again, still busy.
    b.sync(&snap, Scope::Services(&changed(0))).unwrap();
    assert_eq!(b.last.operations, 0);
    assert_eq!(b.draining(), 1);
    for d in b
        .kernel_mut()
        .services
        .get_mut(&id(1))
        .unwrap()
        .1
        .values_mut()
    {
        d.active_conns = 0;
    }
    b.sync(&snap, Scope::Services(&changed(0))).unwrap();
    assert_eq!(
        b.kernel().ops.last(),
        Some(&Op::DeleteDest(id(1), gone, 8080))
    );
    assert_eq!(b.draining(), 0);
    assert_eq!(b.kernel().services[&id(1)].1.len(), 1);
}

/// Drained servers outside the change are looked at again only every `drain_recheck`:
/// each look is one read per service.
#[test]
fn drained_servers_outside_the_change_wait_for_the_recheck() {
    let mut b = backend();
    let mut snap = synth::cluster(2, 2);
    b.sync(&snap, Scope::AllServices).unwrap();
    let gone = synth::endpoint_ip(1, 0, 0);
    for d in b
        .kernel_mut()
        .services
        .get_mut(&id(1))
        .unwrap()
        .1
        .values_mut()
    {
        d.active_conns = 1;
    }
    crate::model::edit_endpoints(snap.endpoints.values_mut().nth(1).unwrap(), |eps| {
        eps.retain(|e| e.ip != gone)
    });
    b.sync(&snap, Scope::Services(&changed(1))).unwrap();
    assert_eq!(b.draining(), 1);
    b.drain_recheck = std::time::Duration::from_secs(3600);
    synth::replace_endpoint(&mut snap, 0, 1, 1);
    b.sync(&snap, Scope::Services(&changed(0))).unwrap();
    assert_eq!(
        (b.last.operations, b.last.requests),
        (2, 3),
        "svc-0's change only, without reading svc-1's servers"
    );
    b.drain_recheck = std::time::Duration::ZERO;
    synth::replace_endpoint(&mut snap, 0, 1, 2);
    b.sync(&snap, Scope::Services(&changed(0))).unwrap();
    assert_eq!(b.last.requests, 4, "and svc-1's servers read again");
    assert_eq!(b.draining(), 1, "still connected");
}

#[test]
fn full_sync_repairs_and_leaves_foreign_services_alone() {
    let mut b = backend();
    let snap = synth::cluster(2, 1);
    b.sync(&snap, Scope::AllServices).unwrap();
    let foreign = ServiceId {
        addr: "192.168.0.2".parse().unwrap(),
        protocol: Protocol::Tcp,
        port: 8443,
    };
    let leftover = ServiceId {
        addr: "192.168.0.2".parse().unwrap(),
        protocol: Protocol::Tcp,
        port: 31000,
    };
    let k = b.kernel_mut();
    for s in [foreign, leftover] {
        k.apply(&Op::AddService(s, ServiceSpec::default())).unwrap();
    }
    k.services.remove(&id(0));
    let r = b.sync(&snap, Scope::RepairAll).unwrap();
    assert!(r.drift);
    let k = b.kernel();
    assert!(k.services.contains_key(&id(0)), "repaired");
    assert!(k.services.contains_key(&foreign), "not ours: kept");
    assert!(
        !k.services.contains_key(&leftover),
        "a node port nobody wants: removed"
    );
}

#[test]
fn a_failed_operation_fails_the_sync_and_the_next_one_is_full() {
    let mut b = backend();
    let snap = synth::cluster(3, 1);
    b.kernel_mut().fail_op_on = Some(id(1));
    let err = b.sync(&snap, Scope::AllServices).unwrap_err();
    assert!(err.to_string().contains("error 22"), "{err}");
    // The others were programmed anyway.
    assert!(b.kernel().services.contains_key(&id(0)) && b.kernel().services.contains_key(&id(2)));
    let r = b.sync(&snap, Scope::Services(&BTreeSet::new())).unwrap();
    assert!(r.full);
    assert_eq!(b.kernel().services.len(), 3);
}

#[test]
fn services_going_away_take_their_addresses_and_cleanup_takes_the_rest() {
    let mut b = backend();
    let mut snap = synth::cluster(3, 1);
    b.sync(&snap, Scope::AllServices).unwrap();
    let key = snap.services.keys().next().unwrap().clone();
    snap.services.remove(&key);
    snap.endpoints.remove(&key.0);
    let svc = key.0.service_key();
    b.sync(&snap, Scope::Services(&[svc].into())).unwrap();
    assert_eq!(b.kernel().services.len(), 2);
    assert_eq!(b.kernel().addresses.bound.len(), 2);
    b.cleanup().unwrap();
    let k = b.kernel();
    assert!(k.services.is_empty() && k.addresses.bound.is_empty() && !k.link_present);
    assert!(k.ipsets.is_empty(), "{:?}", k.ipsets);
    let nat = &b.ipt.families[&IpFamily::V4].tables["nat"];
    assert!(!nat.chains.contains("KUBE-SERVICES"));
}

/// A sync that changes nothing (the agent's retry of a failed conntrack cleanup) asks
/// nothing of IPVS and succeeds.
#[test]
fn a_partial_sync_of_no_service_changes_nothing() {
    let mut b = backend();
    let snap = synth::cluster(5, 2);
    b.sync(&snap, Scope::AllServices).unwrap();
    let ops = b.kernel().ops.len();
    let report = b.sync(&snap, Scope::Services(&BTreeSet::new())).unwrap();
    assert_eq!(report.endpoints, 10);
    assert_eq!(b.kernel().ops.len(), ops);
    assert_eq!(b.last.operations, 0);
}
