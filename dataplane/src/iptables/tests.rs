//! Unit tests of the iptables layout and restore logic against the fake executor.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::diff::{parse_save, Saved};
use super::kernel::{choose_variant, FakeIptables, Variant};
use super::names::*;
use super::plan::{render, TableName};
use super::IptablesBackend;
use crate::backend::{Backend, Scope};
use crate::model::*;
use std::collections::BTreeSet;
use std::net::IpAddr;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn node() -> NodeConfig {
    NodeConfig {
        name: "me".into(),
        node_ips: vec![ip("192.168.0.2")],
        local_detector: LocalDetector::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]),
        masquerade_bit: 14,
        node_port_addresses: NodePortAddresses::All,
        ..NodeConfig::default()
    }
}

fn snapshot(endpoints: &[&str]) -> Snapshot {
    let name = ServicePortName::new("ns1", "svc1", "p80", Protocol::Tcp);
    let mut svc = ServicePort::cluster(name.clone(), ip("172.30.0.41"), 80);
    svc.node_port = 3001;
    let mut s = Snapshot {
        node: node(),
        ..Snapshot::default()
    };
    s.services.insert((name.clone(), IpFamily::V4), svc);
    let empty = ServicePortName::new("ns2", "empty", "", Protocol::Udp);
    s.services.insert(
        (empty.clone(), IpFamily::V4),
        ServicePort::cluster(empty, ip("172.30.0.42"), 53),
    );
    s.endpoints.insert(
        name,
        endpoints
            .iter()
            .map(|e| Endpoint::ready(ip(e), 80))
            .collect(),
    );
    s
}

fn table(s: &Snapshot, family: IpFamily, table: TableName) -> super::plan::Chains {
    render(s).families[&family].tables().tables[&table].clone()
}

fn nat(s: &Snapshot) -> super::plan::Chains {
    table(s, IpFamily::V4, TableName::Nat)
}

#[test]
fn layout_is_kube_proxys() {
    let s = snapshot(&["10.180.0.1", "10.180.0.2", "10.180.0.3"]);
    let nat = nat(&s);
    let svc = "KUBE-SVC-XPGD46QRK7WJZT7O";
    assert_eq!(
        nat[SERVICES],
        vec![
            format!("-m comment --comment \"ns1/svc1:p80 cluster IP\" -m tcp -p tcp -d 172.30.0.41/32 --dport 80 -j {svc}"),
            format!("-m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j {NODEPORTS}"),
        ]
    );
    let lb = &nat[svc];
    assert!(
        lb[0].ends_with("! -s 10.0.0.0/8 -j KUBE-MARK-MASQ"),
        "{}",
        lb[0]
    );
    assert!(
        lb[1].contains("--probability 0.3333333333 -j KUBE-SEP-SXIVWICOYRO3J4NJ"),
        "{}",
        lb[1]
    );
    assert!(
        lb[2].contains("--probability 0.5000000000 -j KUBE-SEP-"),
        "{}",
        lb[2]
    );
    assert!(
        !lb[3].contains("statistic"),
        "the last endpoint takes the rest: {}",
        lb[3]
    );
    assert_eq!(
        nat["KUBE-SEP-SXIVWICOYRO3J4NJ"],
        vec![
            "-m comment --comment \"ns1/svc1:p80\" -s 10.180.0.1/32 -j KUBE-MARK-MASQ".to_string(),
            "-m comment --comment \"ns1/svc1:p80\" -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80".to_string(),
        ]
    );
    assert_eq!(
        nat[NODEPORTS],
        vec!["-m comment --comment \"ns1/svc1:p80\" -m tcp -p tcp --dport 3001 -j KUBE-EXT-XPGD46QRK7WJZT7O".to_string()]
    );
    assert_eq!(
        nat["KUBE-EXT-XPGD46QRK7WJZT7O"],
        vec![
            "-m comment --comment \"masquerade traffic for ns1/svc1:p80 external destinations\" -j KUBE-MARK-MASQ".to_string(),
            format!("-j {svc}"),
        ]
    );
    let filter = &table(&s, IpFamily::V4, TableName::Filter);
    assert_eq!(
        filter[SERVICES],
        vec!["-m comment --comment \"ns2/empty has no endpoints\" -m udp -p udp -d 172.30.0.42/32 --dport 53 -j REJECT".to_string()]
    );
}

#[test]
fn probabilities_give_equal_shares() {
    for n in 1..=40usize {
        let mut left = 1.0f64;
        for i in 0..n {
            let p: f64 = if i + 1 < n {
                super::plan::probability(n - i).parse().unwrap()
            } else {
                1.0
            };
            let share = left * p;
            left -= share;
            assert!(
                (share - 1.0 / n as f64).abs() < 1e-8,
                "n={n} i={i} share={share}"
            );
        }
    }
}

#[test]
fn local_policies_use_local_chains_and_short_circuit() {
    let mut s = snapshot(&["10.180.0.1", "10.180.0.2"]);
    let name = ServicePortName::new("ns1", "svc1", "p80", Protocol::Tcp);
    let svc = s.services.get_mut(&(name.clone(), IpFamily::V4)).unwrap();
    svc.external_traffic_policy = TrafficPolicy::Local;
    svc.internal_traffic_policy = TrafficPolicy::Local;
    crate::model::edit_endpoints(s.endpoints.get_mut(&name).unwrap(), |e| {
        e[1].node_name = Some("me".into())
    });
    let nat = nat(&s);
    assert!(nat[SERVICES][0].ends_with("-j KUBE-SVL-XPGD46QRK7WJZT7O"));
    let svl = &nat["KUBE-SVL-XPGD46QRK7WJZT7O"];
    assert!(
        svl[0].ends_with("! -s 10.0.0.0/8 -j KUBE-MARK-MASQ"),
        "ClusterIP masquerade goes first in the chain ClusterIP traffic takes: {svl:?}"
    );
    assert_eq!(svl.len(), 2, "then only the local endpoint: {svl:?}");
    assert!(
        !nat["KUBE-SVC-XPGD46QRK7WJZT7O"][0].contains("KUBE-MARK-MASQ"),
        "no ClusterIP masquerade where ClusterIP traffic does not go"
    );
    let ext = &nat["KUBE-EXT-XPGD46QRK7WJZT7O"];
    assert!(
        ext[0].contains("-s 10.0.0.0/8 -j KUBE-SVC-XPGD46QRK7WJZT7O"),
        "{ext:?}"
    );
    assert!(ext[1].contains("--src-type LOCAL -j KUBE-MARK-MASQ"));
    assert!(ext[2].contains("--src-type LOCAL -j KUBE-SVC-XPGD46QRK7WJZT7O"));
    assert_eq!(ext[3], "-j KUBE-SVL-XPGD46QRK7WJZT7O");

    // No local endpoint: clusterIP and external traffic dropped in filter.
    crate::model::edit_endpoints(s.endpoints.get_mut(&name).unwrap(), |e| {
        e[1].node_name = Some("other".into())
    });
    let r = render(&s);
    let v4 = r.report.no_local_endpoints.of(IpFamily::V4);
    assert_eq!((v4.internal, v4.external), (1, 1));
    assert_eq!(r.report.no_local_endpoints.total(), v4);
    let t = r.families[&IpFamily::V4].tables();
    let filter = &t.tables[&TableName::Filter];
    assert!(
        filter[SERVICES][0].contains("has no local endpoints")
            && filter[SERVICES][0].ends_with("-j DROP")
    );
    assert!(filter[EXTERNAL_SERVICES][0].contains("--dport 3001 -j DROP"));
    let nat = &r.families[&IpFamily::V4].tables().tables[&TableName::Nat];
    assert!(!nat.contains_key("KUBE-SVL-XPGD46QRK7WJZT7O"));
    assert_eq!(
        nat["KUBE-EXT-XPGD46QRK7WJZT7O"].len(),
        3,
        "short-circuit rules stay"
    );
}

#[test]
fn a_front_end_claimed_twice_is_a_conflict() {
    let mut s = snapshot(&["10.180.0.1"]);
    let other = ServicePortName::new("ns3", "dup", "", Protocol::Tcp);
    s.services.insert(
        (other.clone(), IpFamily::V4),
        ServicePort::cluster(other, ip("172.30.0.41"), 80),
    );
    let r = render(&s);
    assert_eq!(r.report.conflicts.len(), 1, "{:?}", r.report.conflicts);
    assert!(r.report.conflicts[0].contains("ns3/dup"));
}

fn jump_count(fake: &FakeIptables, table: &str, chain: &str, target: &str) -> usize {
    fake.families[&IpFamily::V4].tables[table]
        .rules
        .iter()
        .filter(|(c, r)| c == chain && super::diff::rule_target(r) == Some(target))
        .count()
}

/// The fake kernel's IPv4 nat table, to edit as another tool would.
fn nat_mut(fake: &mut FakeIptables) -> &mut super::diff::SavedTable {
    fake.families
        .entry(IpFamily::V4)
        .or_default()
        .tables
        .entry("nat".to_string())
        .or_default()
}

/// A kernel with someone else's rules: Docker's chain and a jump to it.
fn foreign() -> FakeIptables {
    let mut fake = FakeIptables::default();
    let saved = parse_save(
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:DOCKER - [0:0]\n-A FORWARD -j DOCKER\n-A DOCKER -d 172.17.0.2/32 -j ACCEPT\nCOMMIT\n*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SEP-STALESTALESTALE1 - [0:0]\n-A KUBE-SEP-STALESTALESTALE1 -j DNAT --to-destination 10.9.9.9:80\nCOMMIT\n",
    )
    .unwrap();
    fake.families.insert(IpFamily::V4, saved);
    fake
}

#[test]
fn full_sync_adds_jumps_once_removes_stale_chains_and_keeps_foreign_rules() {
    let mut b = IptablesBackend::new(foreign());
    let s = snapshot(&["10.180.0.1"]);
    let r = b.sync(&s, Scope::RepairAll).unwrap();
    assert!(r.full);
    for _ in 0..2 {
        b.sync(&s, Scope::RepairAll).unwrap();
    }
    let f = b.executor();
    assert_eq!(jump_count(f, "nat", "PREROUTING", SERVICES), 1);
    assert_eq!(jump_count(f, "filter", "FORWARD", FORWARD), 1);
    assert_eq!(jump_count(f, "filter", "FORWARD", "DOCKER"), 1);
    let nat = &f.families[&IpFamily::V4].tables["nat"];
    assert!(!nat.chains.contains("KUBE-SEP-STALESTALESTALE1"));
    assert!(nat.chains.contains("KUBE-SVC-XPGD46QRK7WJZT7O"));
    assert!(f.families[&IpFamily::V4].tables["filter"]
        .chains
        .contains("DOCKER"));
    // Our jumps sit above the foreign one in FORWARD.
    let fwd: Vec<&str> = f.families[&IpFamily::V4].tables["filter"]
        .rules
        .iter()
        .filter(|(c, _)| c == "FORWARD")
        .filter_map(|(_, r)| super::diff::rule_target(r))
        .collect();
    assert_eq!(
        fwd,
        vec![
            PROXY_FIREWALL,
            FORWARD,
            SERVICES,
            EXTERNAL_SERVICES,
            "DOCKER"
        ]
    );
    // One restore per family for the first sync; the kernel then holds what we want, and
    // the next full syncs find nothing to write.
    assert_eq!(f.inputs.len(), 2);
}

#[test]
fn partial_sync_rewrites_only_the_changed_service() {
    let mut b = IptablesBackend::new(FakeIptables::default());
    b.sync(&snapshot(&["10.180.0.1", "10.180.0.2"]), Scope::AllServices)
        .unwrap();
    let saves = b.executor().saves;
    let changed = BTreeSet::from([("ns1".to_string(), "svc1".to_string())]);
    let r = b
        .sync(
            &snapshot(&["10.180.0.1", "10.180.0.3"]),
            Scope::Services(&changed),
        )
        .unwrap();
    assert!(!r.full);
    assert_eq!(
        b.executor().saves,
        saves,
        "a partial sync reads nothing back"
    );
    let (fam, input) = b.executor().inputs.last().unwrap().clone();
    assert_eq!(fam, IpFamily::V4);
    let declared: Vec<&str> = input
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    // The service chain, the new endpoint's chain, and the old one's, emptied.
    assert_eq!(declared.len(), 3, "{input}");
    assert!(declared.contains(&"KUBE-SVC-XPGD46QRK7WJZT7O"));
    assert!(!input.contains(":KUBE-SERVICES"), "{input}");
    assert!(
        !input.lines().any(|l| l.starts_with("-X ")),
        "deletes wait for a full sync: {input}"
    );
    let owned_nat = |b: &IptablesBackend<FakeIptables>| -> BTreeSet<String> {
        b.executor().families[&IpFamily::V4].tables["nat"]
            .chains
            .iter()
            .filter(|c| owned(c))
            .cloned()
            .collect()
    };
    let want: BTreeSet<String> = nat(&snapshot(&["10.180.0.1", "10.180.0.3"]))
        .keys()
        .cloned()
        .collect();
    let held = owned_nat(&b);
    let extra: Vec<&String> = held.difference(&want).collect();
    assert_eq!(extra.len(), 1, "only the emptied chain is extra: {extra:?}");
    let empty_left = &b.executor().families[&IpFamily::V4].tables["nat"];
    assert!(!empty_left.rules.iter().any(|(c, _)| c == extra[0]));
    // The next full sync deletes it; the kernel then holds exactly the layout.
    b.sync(&snapshot(&["10.180.0.1", "10.180.0.3"]), Scope::RepairAll)
        .unwrap();
    assert_eq!(owned_nat(&b), want);
    assert_eq!(r.stats.chains_deleted, 0);
    // IPv6 had nothing to change in the partial sync, nor in the second full one: only
    // the first restored it.
    let v6 = b
        .executor()
        .inputs
        .iter()
        .filter(|(f, _)| *f == IpFamily::V6)
        .count();
    assert_eq!(v6, 1);
}

#[test]
fn a_failed_restore_forces_a_full_sync_of_that_family() {
    let mut b = IptablesBackend::new(FakeIptables::default());
    let s = snapshot(&["10.180.0.1"]);
    b.sync(&s, Scope::AllServices).unwrap();
    b.exec.fail_next = Some("boom".into());
    assert!(b
        .sync(&snapshot(&["10.180.0.2"]), Scope::AllServices)
        .is_err());
    let saves = b.executor().saves;
    let r = b
        .sync(&snapshot(&["10.180.0.2"]), Scope::AllServices)
        .unwrap();
    assert!(r.full);
    assert_eq!(
        b.executor().saves,
        saves + 1,
        "only the failed family is read back"
    );
}

#[test]
fn drift_is_noticed_by_the_next_full_sync() {
    let mut b = IptablesBackend::new(FakeIptables::default());
    let s = snapshot(&["10.180.0.1"]);
    assert!(!b.sync(&s, Scope::AllServices).unwrap().drift);
    assert!(!b.sync(&s, Scope::RepairAll).unwrap().drift);
    // Someone flushes the nat table.
    b.exec
        .families
        .get_mut(&IpFamily::V4)
        .unwrap()
        .tables
        .remove("nat");
    assert!(b.canary_missing().unwrap(), "the canary tells");
    let r = b.sync(&s, Scope::RepairAll).unwrap();
    assert!(r.drift);
    assert!(!b.canary_missing().unwrap());
    assert!(b.executor().families[&IpFamily::V4].tables["nat"]
        .chains
        .contains("KUBE-SVC-XPGD46QRK7WJZT7O"));
}

#[test]
fn cleanup_removes_ours_and_nothing_else() {
    let mut b = IptablesBackend::new(foreign());
    b.sync(&snapshot(&["10.180.0.1"]), Scope::RepairAll)
        .unwrap();
    let removed = b.cleanup().unwrap();
    assert!(removed > 10, "{removed}");
    let f = b.executor();
    for (name, t) in &f.families[&IpFamily::V4].tables {
        assert!(t.chains.iter().all(|c| !owned(c)), "{name}: {:?}", t.chains);
        assert!(t
            .rules
            .iter()
            .all(|(_, r)| !super::diff::rule_target(r).is_some_and(owned)));
    }
    assert_eq!(jump_count(f, "filter", "FORWARD", "DOCKER"), 1);
    assert!(f.families[&IpFamily::V4].tables["filter"]
        .chains
        .contains("DOCKER"));
}

#[test]
fn localhost_node_ports_enable_route_localnet_and_the_martian_guard() {
    let mut s = snapshot(&["10.180.0.1"]);
    s.node.localhost_node_ports = true;
    let filter = &table(&s, IpFamily::V4, TableName::Filter);
    assert!(filter[KUBELET_FIREWALL][0].contains("-d 127.0.0.0/8 ! -s 127.0.0.0/8"));
    let nat = &table(&s, IpFamily::V4, TableName::Nat);
    assert!(nat[SERVICES]
        .last()
        .unwrap()
        .ends_with("--dst-type LOCAL -j KUBE-NODEPORTS"));
    let nat6 = &table(&s, IpFamily::V6, TableName::Nat);
    assert!(nat6[SERVICES].last().unwrap().contains("! -d ::1/128"));
    let mut b = IptablesBackend::new(FakeIptables::default());
    b.sync(&s, Scope::AllServices).unwrap();
    assert!(b.executor().route_localnet);
    let mut b = IptablesBackend::new(FakeIptables::default());
    b.sync(&snapshot(&["10.180.0.1"]), Scope::AllServices)
        .unwrap();
    assert!(!b.executor().route_localnet);
}

#[test]
fn the_back_end_is_chosen_like_kube_proxys_wrapper() {
    let hint = "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n";
    let canary = "*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n";
    let never = || -> (String, String) { panic!("markers decide") };
    assert_eq!(choose_variant(hint, "", never), Variant::Nft);
    assert_eq!(choose_variant("", hint, never), Variant::Legacy);
    assert_eq!(
        choose_variant(canary, hint, never),
        Variant::Legacy,
        "the hint wins over the canary"
    );
    let rules = |n: usize| {
        (0..n)
            .map(|i| format!("-A X -j R{i}\n"))
            .collect::<String>()
    };
    assert_eq!(
        choose_variant("", "", || (rules(3), rules(5))),
        Variant::Legacy
    );
    assert_eq!(
        choose_variant("", "", || (rules(5), rules(5))),
        Variant::Nft
    );
    assert_eq!(
        choose_variant("", "", || (String::new(), String::new())),
        Variant::Nft
    );
}

#[test]
fn save_output_parses_and_garbage_does_not() {
    let text = "# Generated by iptables-nft-save v1.8.9\n*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-X - [0:0]\n-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\nCOMMIT\n";
    let saved: Saved = parse_save(text).unwrap();
    let nat = saved.table(TableName::Nat).unwrap();
    assert!(nat.chains.contains("KUBE-X"));
    assert!(nat.jumps_to("PREROUTING", "KUBE-SERVICES"));
    let e = parse_save("-A X -j Y\n").unwrap_err().to_string();
    assert!(e.contains("line 1") && e.contains("outside a table"), "{e}");
}

#[test]
fn rerendering_changed_services_equals_rendering_everything() {
    let mut s = crate::synth::cluster(40, 3);
    let mut previous = render(&s);
    crate::synth::replace_endpoint(&mut s, 7, 1, 1);
    // And one service goes away.
    let gone = s
        .services
        .keys()
        .find(|(n, _)| &*n.name == "svc-9")
        .cloned()
        .unwrap();
    s.services.remove(&gone);
    s.endpoints.remove(&gone.0);
    let changed = BTreeSet::from([
        ("bench".to_string(), "svc-7".to_string()),
        ("bench".to_string(), "svc-9".to_string()),
    ]);
    let again = super::plan::rerender(&s, &mut previous, Some(&changed));
    let scratch = render(&s);
    for family in IpFamily::ALL {
        assert_eq!(
            again.families[&family].tables(),
            scratch.families[&family].tables(),
            "{family}"
        );
    }
    // What stays behind in `previous` is the old rules of the changed ports only.
    assert_eq!(previous.families[&IpFamily::V4].ports.len(), 2);
}

#[test]
fn an_endpoint_change_writes_one_service_chain_and_one_endpoint_chain() {
    let mut s = crate::synth::cluster(30, 10);
    let mut b = IptablesBackend::new(FakeIptables::default());
    b.sync(&s, Scope::AllServices).unwrap();
    crate::synth::replace_endpoint(&mut s, 7, 3, 1);
    let changed = BTreeSet::from([("bench".to_string(), "svc-7".to_string())]);
    b.sync(&s, Scope::Services(&changed)).unwrap();
    let (_, input) = b.executor().inputs.last().unwrap().clone();
    let declared: Vec<&str> = input.lines().filter_map(|l| l.strip_prefix(':')).collect();
    assert_eq!(declared.len(), 3, "{input}");
    assert_eq!(
        input.lines().filter(|l| l.starts_with("-A ")).count(),
        11 + 2,
        "the service chain's 11 rules and the new endpoint's 2: {input}"
    );
}

#[test]
fn cleanup_keeps_a_chain_another_tool_still_jumps_to() {
    let mut fake = foreign();
    nat_mut(&mut fake).chains.insert("CALICO-NAT".into());
    let mut b = IptablesBackend::new(fake);
    b.sync(&snapshot(&["10.180.0.1"]), Scope::RepairAll)
        .unwrap();
    nat_mut(&mut b.exec)
        .rules
        .push(("CALICO-NAT".into(), format!("-j {MARK_MASQ}")));
    b.cleanup().unwrap();
    let nat = &b.executor().families[&IpFamily::V4].tables["nat"];
    assert!(nat
        .rules
        .contains(&("CALICO-NAT".to_string(), format!("-j {MARK_MASQ}"))));
    assert!(
        nat.chains.contains(MARK_MASQ),
        "kept for the rule that jumps to it"
    );
    assert!(
        !nat.rules.iter().any(|(c, _)| c == MARK_MASQ),
        "but emptied"
    );
    assert!(!nat.chains.contains(SERVICES));
}

#[test]
fn a_family_without_services_that_cannot_be_programmed_does_not_fail_the_sync() {
    let mut b = IptablesBackend::new(FakeIptables::default());
    b.exec.fail_v6 = true;
    let r = b.sync(&snapshot(&["10.180.0.1"]), Scope::AllServices);
    assert!(r.is_ok(), "{r:?}");
    let changed = BTreeSet::from([("ns1".to_string(), "svc1".to_string())]);
    let r = b
        .sync(&snapshot(&["10.180.0.2"]), Scope::Services(&changed))
        .unwrap();
    assert!(!r.full, "the IPv4 family stays partial: {}", r.summary());
}

#[test]
fn a_stale_chain_another_tool_jumps_to_is_emptied_not_deleted() {
    let mut fake = foreign();
    nat_mut(&mut fake)
        .rules
        .push(("PREROUTING".into(), "-j KUBE-SEP-STALESTALESTALE1".into()));
    let mut b = IptablesBackend::new(fake);
    b.sync(&snapshot(&["10.180.0.1"]), Scope::RepairAll)
        .unwrap();
    let nat = &b.executor().families[&IpFamily::V4].tables["nat"];
    assert!(nat.chains.contains("KUBE-SEP-STALESTALESTALE1"));
    assert!(!nat
        .rules
        .iter()
        .any(|(c, _)| c == "KUBE-SEP-STALESTALESTALE1"));
}

/// The fake kernel's IPv4 nat rules, as `-A <chain> <rule>`.
fn kernel_nat_rules(fake: &FakeIptables) -> BTreeSet<String> {
    fake.families[&IpFamily::V4].tables["nat"]
        .rules
        .iter()
        .map(|(c, r)| format!("-A {c} {r}"))
        .collect()
}

/// The endpoint rules (service chain to endpoint chain, and the endpoint chains) of `s`.
fn endpoint_rules(s: &Snapshot) -> Vec<String> {
    nat(s)
        .iter()
        .flat_map(|(c, rules)| rules.iter().map(move |r| (c, r)))
        .filter(|(c, r)| c.starts_with("KUBE-SEP-") || r.contains("-j KUBE-SEP-"))
        .map(|(c, r)| format!("-A {c} {r}"))
        .collect()
}

#[test]
fn large_clusters_leave_the_comments_off_the_endpoint_rules_as_kube_proxy_does() {
    // 100 x 10 endpoints is kube-proxy's threshold itself, not above it.
    let mut s = crate::synth::cluster(100, 10);
    assert!(!super::plan::large_cluster(&s, IpFamily::V4));
    let rules = endpoint_rules(&s);
    assert_eq!(rules.len(), 100 * 10 * 3);
    assert!(
        rules.iter().all(|r| r.contains("-m comment --comment")),
        "{rules:?}"
    );
    // One more endpoint crosses it: the endpoint rules lose their comments, the rest keep them.
    crate::synth::add_service(&mut s, 100, 1);
    assert!(super::plan::large_cluster(&s, IpFamily::V4));
    let rules = endpoint_rules(&s);
    assert_eq!(rules.len(), 1001 * 3);
    let bare: Vec<&String> = rules.iter().filter(|r| !r.contains("-m comment")).collect();
    assert_eq!(bare.len(), rules.len(), "{:?}", &rules[..3]);
    let svc7 = nat(&s)
        .into_iter()
        .find(|(c, r)| c.starts_with("KUBE-SVC-") && r[0].contains("bench/svc-7:http cluster IP"))
        .unwrap();
    assert!(
        svc7.1[1].starts_with("-m statistic --mode random --probability 0.1000000000 -j KUBE-SEP-"),
        "{:?}",
        svc7.1
    );
    assert!(
        nat(&s)[SERVICES]
            .iter()
            .all(|r| r.starts_with("-m comment --comment")),
        "KUBE-SERVICES keeps its comments"
    );
    let sep = nat(&s)
        .into_iter()
        .find(|(c, _)| c.starts_with("KUBE-SEP-"))
        .unwrap()
        .1;
    assert!(
        sep[0].starts_with("-s ") && sep[0].ends_with("-j KUBE-MARK-MASQ"),
        "{sep:?}"
    );
    assert!(
        sep[1].starts_with("-m tcp -p tcp -j DNAT --to-destination "),
        "{sep:?}"
    );
    // Another family's endpoints do not count toward this family's threshold.
    assert!(!super::plan::large_cluster(&s, IpFamily::V6));
}

#[test]
fn crossing_the_large_cluster_threshold_rewrites_every_endpoint_rule_in_a_partial_sync() {
    let mut s = crate::synth::cluster(100, 10);
    let mut b = IptablesBackend::new(FakeIptables::default());
    b.sync(&s, Scope::AllServices).unwrap();
    crate::synth::add_service(&mut s, 100, 1);
    let changed = BTreeSet::from([("bench".to_string(), "svc-100".to_string())]);
    let r = b.sync(&s, Scope::Services(&changed)).unwrap();
    assert!(!r.full, "still a partial sync: nothing is read back");
    let held = &b.executor().families[&IpFamily::V4];
    assert_eq!(
        held.table(TableName::Nat).unwrap().rules.len(),
        nat(&s).values().map(Vec::len).sum::<usize>() + 3,
        "the kernel holds the new layout (and the three nat jumps)"
    );
    let kernel = kernel_nat_rules(b.executor());
    for rule in endpoint_rules(&s) {
        assert!(kernel.contains(&rule), "missing {rule}");
    }
    // And back under the threshold: the comments come back with the next partial sync.
    let gone = ServicePortName::new("bench", "svc-100", "http", Protocol::Tcp);
    s.services.remove(&(gone.clone(), IpFamily::V4));
    s.endpoints.remove(&gone);
    b.sync(&s, Scope::Services(&changed)).unwrap();
    let kernel = kernel_nat_rules(b.executor());
    for rule in endpoint_rules(&s) {
        assert!(rule.contains("-m comment"), "{rule}");
        assert!(kernel.contains(&rule), "missing {rule}");
    }
    // Nothing else is left: the removed service's chains are emptied, and no endpoint rule
    // without its comment survives beside the commented one.
    let held = &b.executor().families[&IpFamily::V4];
    assert_eq!(
        held.table(TableName::Nat).unwrap().rules.len(),
        nat(&s).values().map(Vec::len).sum::<usize>() + 3,
        "the kernel holds exactly the layout (and the three nat jumps)"
    );
}

#[test]
fn large_blocks_for_iptables_nft_read_the_whole_table_and_follow_the_kernels_walk() {
    use super::diff::{Style, WHOLE_TABLE_CHAINS};
    let s = crate::synth::cluster(100, 10);
    // A kernel without a nat table: the jumps could not go in the whole-table block.
    let mut empty = IptablesBackend::new(FakeIptables {
        style: Style::Nft,
        ..FakeIptables::default()
    });
    empty.sync(&s, Scope::AllServices).unwrap();
    let mut b = IptablesBackend::new(FakeIptables {
        style: Style::Nft,
        ..foreign()
    });
    b.sync(&s, Scope::AllServices).unwrap();
    let inputs: Vec<&String> = b
        .executor()
        .inputs
        .iter()
        .filter(|(f, _)| *f == IpFamily::V4)
        .map(|(_, i)| i)
        .collect();
    // The chains, then the jumps on their own (the fake, like iptables-nft, refuses a rule
    // in a built-in chain the table lacks once a block has started with -S).
    assert_eq!(
        inputs.len(),
        2,
        "{:?}",
        inputs.iter().map(|i| &i[..60]).collect::<Vec<_>>()
    );
    let nat_block = inputs[0]
        .split("*nat\n")
        .nth(1)
        .and_then(|b| b.split("COMMIT\n").next())
        .unwrap();
    assert!(nat_block.starts_with("-S\n"), "{}", &nat_block[..80]);
    assert!(
        !nat_block.contains("-I "),
        "no jump in the whole-table block"
    );
    assert!(inputs[1]
        .lines()
        .all(|l| l.starts_with('*') || l.starts_with("-I ") || l == "COMMIT"));
    let declared: Vec<&str> = nat_block
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert!(declared.len() >= WHOLE_TABLE_CHAINS, "{}", declared.len());
    // Each chain's rules right after its declaration, and every chain declared after the
    // written chains it jumps to.
    let mut current = "";
    let mut before: BTreeSet<&str> = BTreeSet::new();
    for line in nat_block.lines().skip(1) {
        if let Some(decl) = line.strip_prefix(':') {
            current = decl.split(' ').next().unwrap();
            before.insert(current);
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let (chain, rule) = rule.split_once(' ').unwrap();
            assert_eq!(chain, current, "{line}");
            if let Some(t) = super::diff::rule_target(rule) {
                if declared.contains(&t) {
                    assert!(before.contains(t), "{t} after {chain}");
                }
            }
        }
    }
    // The stale chain to delete is declared (emptied) first; then the written chains in
    // the walk from KUBE-SERVICES: each service's endpoint chains, then its service chain.
    assert_eq!(declared[0], "KUBE-SEP-STALESTALESTALE1");
    let declared = &declared[1..];
    let k = declared
        .iter()
        .position(|c| c.starts_with("KUBE-SVC-"))
        .unwrap();
    let svc = declared[k];
    let held = &b.executor().families[&IpFamily::V4];
    let svc_targets: Vec<&str> = held.tables["nat"]
        .rules
        .iter()
        .filter(|(c, _)| c == svc)
        .filter_map(|(_, r)| super::diff::rule_target(r))
        .filter(|t| t.starts_with("KUBE-SEP-"))
        .collect();
    assert_eq!(svc_targets.len(), 10);
    let endpoints: Vec<&str> = declared[..k]
        .iter()
        .copied()
        .filter(|c| c.starts_with("KUBE-SEP-"))
        .collect();
    assert_eq!(endpoints, svc_targets);
    assert_eq!(declared.last(), Some(&SERVICES), "{declared:?}");
    // Not in name order, as a quicksort taking the first element as pivot needs.
    let mut sorted = declared.to_vec();
    sorted.sort();
    assert_ne!(sorted, declared);
    // The foreign rules are kept, our jumps are there once, and the layout is complete.
    assert_eq!(jump_count(b.executor(), "nat", "PREROUTING", SERVICES), 1);
    assert!(held.tables["filter"].chains.contains("DOCKER"));
    assert!(!held.tables["nat"]
        .chains
        .contains("KUBE-SEP-STALESTALESTALE1"));
    let want = nat(&s);
    for (chain, rules) in &want {
        let got: Vec<&String> = held.tables["nat"]
            .rules
            .iter()
            .filter(|(c, _)| c == chain)
            .map(|(_, r)| r)
            .collect();
        assert_eq!(got.len(), rules.len(), "{chain}");
    }
    // The next full sync finds the kernel as it should be and writes nothing; when a
    // service chain drifted, it writes that chain alone, plainly.
    let before = b.executor().inputs.len();
    let r = b.sync(&s, Scope::RepairAll).unwrap();
    assert_eq!(b.executor().inputs.len(), before, "{}", r.summary());
    let sep = {
        let nat = &mut b
            .executor_mut()
            .families
            .get_mut(&IpFamily::V4)
            .unwrap()
            .tables;
        let nat = nat.get_mut("nat").unwrap();
        let (sep, _) = nat
            .rules
            .iter()
            .find(|(c, _)| c.starts_with("KUBE-SEP-"))
            .cloned()
            .unwrap();
        nat.rules.retain(|(c, _)| *c != sep);
        sep
    };
    b.sync(&s, Scope::RepairAll).unwrap();
    let (_, last) = b.executor().inputs.last().unwrap();
    let declared: Vec<&str> = last.lines().filter(|l| l.starts_with(':')).collect();
    assert_eq!(declared, vec![format!(":{sep} - [0:0]")], "{last}");
    assert!(!last.lines().any(|l| l == "-S"), "{last}");

    let mut s2 = s.clone();
    crate::synth::replace_endpoint(&mut s2, 7, 3, 1);
    let changed = BTreeSet::from([("bench".to_string(), "svc-7".to_string())]);
    b.sync(&s2, Scope::Services(&changed)).unwrap();
    let (_, last) = b.executor().inputs.last().unwrap();
    assert!(!last.lines().any(|l| l == "-S"), "{last}");
}

#[test]
fn rules_read_back_from_iptables_save_compare_equal_to_what_we_wrote() {
    use super::diff::same_rule;
    // (iptables-nft-save 1.8.9's line, ours), from a real kernel.
    let same = [
        (
            "! -s 10.0.0.0/8 -d 10.96.19.137/32 -p tcp -m comment --comment \"bench/svc-5000:http cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ",
            "-m comment --comment \"bench/svc-5000:http cluster IP\" -m tcp -p tcp -d 10.96.19.137/32 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ",
        ),
        (
            "-m statistic --mode random --probability 0.10000000009 -j KUBE-SEP-WOLDRMRXDT4TIEGS",
            "-m statistic --mode random --probability 0.1000000000 -j KUBE-SEP-WOLDRMRXDT4TIEGS",
        ),
        (
            "-p tcp -m tcp -j DNAT --to-destination 10.129.56.200:8080",
            "-m tcp -p tcp -j DNAT --to-destination 10.129.56.200:8080",
        ),
        (
            "-m comment --comment bench/svc-1:http -s 10.0.0.1/32 -j KUBE-MARK-MASQ",
            "-m comment --comment \"bench/svc-1:http\" -s 10.0.0.1/32 -j KUBE-MARK-MASQ",
        ),
        ("-j MARK --set-xmark 0x4000/0x4000", "-j MARK --or-mark 0x4000"),
        ("-j MARK --set-xmark 0x4000/0x0", "-j MARK --xor-mark 0x4000"),
        (
            "-d 10.96.40.1/32 -p tcp -m comment --comment \"shop/reports:http has no endpoints\" -m tcp --dport 8080 -j REJECT --reject-with icmp-port-unreachable",
            "-m comment --comment \"shop/reports:http has no endpoints\" -m tcp -p tcp -d 10.96.40.1/32 --dport 8080 -j REJECT",
        ),
        (
            "! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
            "-m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
        ),
    ];
    let recent = [(
        "-m comment --comment \"ns/a:p -> 10.0.0.1:80\" -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-A --mask 255.255.255.255 --rsource -j KUBE-SEP-A",
        "-m comment --comment \"ns/a:p -> 10.0.0.1:80\" -m recent --name KUBE-SEP-A --rcheck --seconds 10800 --reap -j KUBE-SEP-A",
    )];
    for (saved, ours) in same.into_iter().chain(recent) {
        assert!(same_rule(saved, ours), "{saved}\n{ours}");
    }
    // What differs in meaning never compares equal.
    let differ = [
        (
            "-s 10.0.0.1/32 -d 10.0.0.2/32 -j X",
            "-s 10.0.0.2/32 -d 10.0.0.1/32 -j X",
        ),
        ("! -s 10.0.0.0/8 -j X", "-s 10.0.0.0/8 -j X"),
        (
            "-m statistic --mode random --probability 0.10000000009 -j A",
            "-m statistic --mode random --probability 0.1111111111 -j A",
        ),
        (
            "-p tcp -m tcp -j DNAT --to-destination 10.0.0.1:80",
            "-m tcp -p tcp -j DNAT --to-destination 10.0.0.1:81",
        ),
        (
            "-m comment --comment \"a b\" -j X",
            "-m comment --comment \"a c\" -j X",
        ),
        ("-j REJECT --reject-with icmp-host-unreachable", "-j REJECT"),
        ("-j KUBE-SEP-A", "-j KUBE-SEP-B"),
    ];
    for (a, b) in differ {
        assert!(!same_rule(a, b), "{a}\n{b}");
    }
}

#[test]
fn an_endpoint_change_reuses_the_fixed_chains_and_a_front_end_change_assembles_them() {
    let mut s = crate::synth::cluster(40, 3);
    let changed = BTreeSet::from([("bench".to_string(), "svc-7".to_string())]);
    let mut previous = render(&s);
    crate::synth::replace_endpoint(&mut s, 7, 1, 1);
    let again = super::plan::rerender(&s, &mut previous, Some(&changed));
    let v4 = &again.families[&IpFamily::V4];
    assert!(
        v4.fixed_kept,
        "an endpoint change moves the fixed chains over"
    );
    assert_eq!(v4.tables(), render(&s).families[&IpFamily::V4].tables());
    // A new cluster IP changes KUBE-SERVICES: assembled again, and equal to a fresh render.
    let mut previous = again;
    let key = s
        .services
        .keys()
        .find(|(n, _)| &*n.name == "svc-7")
        .cloned()
        .unwrap();
    s.services.get_mut(&key).unwrap().cluster_ip = ip("172.31.0.7");
    let third = super::plan::rerender(&s, &mut previous, Some(&changed));
    let v4 = &third.families[&IpFamily::V4];
    assert!(!v4.fixed_kept);
    assert_eq!(v4.tables(), render(&s).families[&IpFamily::V4].tables());
    assert!(v4.fixed.tables[&TableName::Nat][SERVICES]
        .iter()
        .any(|r| r.contains("-d 172.31.0.7/32")));
    // And the backend writes KUBE-SERVICES for it, but not for an endpoint change.
    let mut b = IptablesBackend::new(FakeIptables::default());
    let mut s = crate::synth::cluster(40, 3);
    b.sync(&s, Scope::AllServices).unwrap();
    crate::synth::replace_endpoint(&mut s, 7, 1, 2);
    b.sync(&s, Scope::Services(&changed)).unwrap();
    assert!(!b
        .executor()
        .inputs
        .last()
        .unwrap()
        .1
        .contains(":KUBE-SERVICES"));
    s.services.get_mut(&key).unwrap().cluster_ip = ip("172.31.0.7");
    b.sync(&s, Scope::Services(&changed)).unwrap();
    let (_, last) = b.executor().inputs.last().unwrap();
    assert!(last.contains(":KUBE-SERVICES"), "{last}");
    let held = &b.executor().families[&IpFamily::V4].tables["nat"];
    assert!(held
        .rules
        .iter()
        .any(|(c, r)| c == SERVICES && r.contains("-d 172.31.0.7/32")));
}

#[test]
fn an_iptables_nft_that_refuses_whole_table_inputs_is_written_chain_by_chain() {
    use super::diff::Style;
    let s = crate::synth::cluster(100, 10);
    let mut b = IptablesBackend::new(FakeIptables {
        style: Style::Nft,
        refuse_listing: true,
        ..foreign()
    });
    b.sync(&s, Scope::AllServices).unwrap();
    let with_listing = |b: &IptablesBackend<FakeIptables>| -> Vec<bool> {
        b.executor()
            .inputs
            .iter()
            .filter(|(f, _)| *f == IpFamily::V4)
            .map(|(_, i)| i.lines().any(|l| l == "-S"))
            .collect()
    };
    // Whole-table first, refused; then the same sync again, chain by chain.
    assert_eq!(with_listing(&b), vec![true, false]);
    let held = &b.executor().families[&IpFamily::V4];
    for (chain, rules) in &nat(&s) {
        let got = held.tables["nat"]
            .rules
            .iter()
            .filter(|(c, _)| c == chain)
            .count();
        assert_eq!(got, rules.len(), "{chain}");
    }
    assert_eq!(jump_count(b.executor(), "nat", "PREROUTING", SERVICES), 1);
    assert!(held.tables["filter"].chains.contains("DOCKER"));
    // It sticks: cleanup, which names every chain, goes chain by chain at once.
    let removed = b.cleanup().unwrap();
    assert!(removed > 1000, "{removed}");
    assert_eq!(with_listing(&b), vec![true, false, false]);
    let held = &b.executor().families[&IpFamily::V4];
    assert!(!held.tables["nat"]
        .chains
        .iter()
        .any(|c| c.starts_with("KUBE-")));
    assert!(held.tables["filter"].chains.contains("DOCKER"));
}

/// The chains a whole-table sync on iptables-nft creates go over netlink first, when every
/// rule is one the direct writer encodes and everything they jump to exists or comes with
/// them; the rest (here, a service with session affinity, whose `-m recent` rules are not
/// encoded, and the fixed chains with their addrtype and mark matches) follows in one
/// plain restore.
#[test]
fn new_chains_of_a_large_sync_are_created_directly_and_the_rest_restored() {
    use super::diff::Style;
    let mut s = crate::synth::cluster(100, 10);
    let sticky = ServicePortName::new("bench", "svc-7", "http", Protocol::Tcp);
    s.services
        .get_mut(&(sticky.clone(), IpFamily::V4))
        .unwrap()
        .session_affinity = SessionAffinity::ClientIp {
        timeout_seconds: 10800,
    };
    let mut b = IptablesBackend::new(FakeIptables {
        style: Style::NftDirect,
        ..foreign()
    });
    let r = b.sync(&s, Scope::AllServices).unwrap();
    let f = b.executor();
    assert_eq!(f.created.len(), 1, "one batch");
    let created: BTreeSet<&str> = f.created[0].1.iter().map(String::as_str).collect();
    let want = nat(&s);
    let sticky_chains: BTreeSet<&str> = want
        .iter()
        .filter(|(_, rules)| rules.iter().any(|r| r.contains("-m recent")))
        .map(|(c, _)| c.as_str())
        .collect();
    assert!(!sticky_chains.is_empty());
    for (chain, rules) in &want {
        let direct = rules.iter().all(|r| super::rule_parse::encodable(r))
            && !sticky_chains.contains(chain.as_str())
            && !rules
                .iter()
                .filter_map(|r| super::diff::rule_target(r))
                .any(|t| sticky_chains.contains(t));
        assert_eq!(created.contains(chain.as_str()), direct, "{chain}");
    }
    assert!(created.contains(MARK_MASQ));
    assert!(created.len() > 1000, "{}", created.len());
    // The rest in one plain restore (few chains left: no -S), with the jumps.
    let v4: Vec<&String> = f
        .inputs
        .iter()
        .filter(|(fam, _)| *fam == IpFamily::V4)
        .map(|(_, i)| i)
        .collect();
    assert_eq!(v4.len(), 1);
    assert!(!v4[0].lines().any(|l| l == "-S"));
    let nat_block = v4[0]
        .split("*nat\n")
        .nth(1)
        .unwrap()
        .split("COMMIT")
        .next()
        .unwrap();
    for chain in &created {
        assert!(
            !nat_block.contains(&format!(":{chain} ")),
            "{chain} restored too"
        );
    }
    // The kernel holds the layout, whoever wrote it; the stats count both.
    let held = &f.families[&IpFamily::V4].tables["nat"];
    for (chain, rules) in &want {
        let got: Vec<&String> = held
            .rules
            .iter()
            .filter(|(c, _)| c == chain)
            .map(|(_, r)| r)
            .collect();
        assert_eq!(got, rules.iter().collect::<Vec<_>>(), "{chain}");
    }
    assert_eq!(jump_count(f, "nat", "PREROUTING", SERVICES), 1);
    assert!(!held.chains.contains("KUBE-SEP-STALESTALESTALE1"));
    let mut restored_only = IptablesBackend::new(FakeIptables {
        style: Style::Nft,
        ..foreign()
    });
    let r2 = restored_only.sync(&s, Scope::AllServices).unwrap();
    assert_eq!(r.stats, r2.stats, "{} / {}", r.summary(), r2.summary());
    // Each chain holds what a restore alone leaves (the fake keeps rules of different
    // chains in write order, which differs).
    let other = &restored_only.executor().families[&IpFamily::V4];
    for (name, table) in &f.families[&IpFamily::V4].tables {
        let theirs = &other.tables[name];
        assert!(table.chains == theirs.chains, "{name}: chains differ");
        assert!(
            table.rules_by_chain() == theirs.rules_by_chain(),
            "{name}: rules differ"
        );
    }
    // A partial sync never creates directly.
    let mut s2 = s.clone();
    crate::synth::replace_endpoint(&mut s2, 3, 3, 1);
    let changed = BTreeSet::from([("bench".to_string(), "svc-3".to_string())]);
    b.sync(&s2, Scope::Services(&changed)).unwrap();
    assert_eq!(b.executor().created.len(), 1);
}

/// When a direct write fails, the sync is done again in full through the restore, and
/// later syncs do not try again.
#[test]
fn a_refused_direct_write_falls_back_to_the_restore_for_good() {
    use super::diff::Style;
    let s = crate::synth::cluster(100, 10);
    let mut b = IptablesBackend::new(FakeIptables {
        style: Style::NftDirect,
        refuse_direct: true,
        ..foreign()
    });
    b.sync(&s, Scope::AllServices).unwrap();
    let f = b.executor();
    assert_eq!(f.created.len(), 1);
    let held = &f.families[&IpFamily::V4].tables["nat"];
    for (chain, rules) in &nat(&s) {
        let got = held.rules.iter().filter(|(c, _)| c == chain).count();
        assert_eq!(got, rules.len(), "{chain}");
    }
    // Whole-table style, as without direct writes.
    assert!(f.inputs.iter().any(|(_, i)| i.lines().any(|l| l == "-S")));
    b.cleanup().unwrap();
    b.sync(&s, Scope::RepairAll).unwrap();
    assert_eq!(b.executor().created.len(), 1, "not tried again");
}

#[test]
fn a_partial_sync_reports_the_endpoint_count_kept_service_by_service() {
    let mut s = crate::synth::cluster(30, 10);
    let mut b = IptablesBackend::new(FakeIptables::default());
    assert_eq!(b.sync(&s, Scope::AllServices).unwrap().endpoints, 300);
    crate::synth::replace_endpoint(&mut s, 7, 3, 1);
    let eight = s
        .endpoints
        .keys()
        .find(|n| &*n.name == "svc-8")
        .cloned()
        .unwrap();
    crate::model::edit_endpoints(s.endpoints.get_mut(&eight).unwrap(), |e| {
        e.pop();
    });
    let changed = BTreeSet::from([
        ("bench".to_string(), "svc-7".to_string()),
        ("bench".to_string(), "svc-8".to_string()),
    ]);
    let report = b.sync(&s, Scope::Services(&changed)).unwrap();
    assert_eq!(report.endpoints, 299);
    assert_eq!(report.endpoints, s.endpoint_count());
}

/// A sync that changes nothing (the agent's retry of a failed conntrack cleanup) writes
/// nothing and succeeds.
#[test]
fn a_partial_sync_of_no_service_writes_nothing() {
    let s = crate::synth::cluster(5, 2);
    let mut b = IptablesBackend::new(FakeIptables::default());
    b.sync(&s, Scope::AllServices).unwrap();
    let inputs = b.executor().inputs.len();
    let report = b.sync(&s, Scope::Services(&BTreeSet::new())).unwrap();
    assert_eq!(report.endpoints, 10);
    assert_eq!(report.stats.operations(), 0);
    let written: Vec<_> = b.executor().inputs[inputs..]
        .iter()
        .filter(|(_, input)| input.lines().any(|l| l.starts_with("-A ")))
        .collect();
    assert!(written.is_empty(), "{written:?}");
}
