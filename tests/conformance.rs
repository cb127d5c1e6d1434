//! Packet-level conformance: each vendored kube-proxy scenario (tests/conformance/cases.json)
//! is built in network namespaces, programmed by `switchyard sync --once`, and probed with
//! real TCP/UDP connections. Needs root; prints SKIP otherwise (fails if
//! SWITCHYARD_REQUIRE_NETNS=1).

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod rig;

use rig::cases::{Expect, Flow, Mode, Protocol, SourceKind, Verdict};
use rig::{Cases, Rig, RigOptions};

/// Scenarios enabled in this suite (the rest need features switchyard lacks so far).
const ENABLED: &[&str] = &[
    "clusterip-general",
    "no-endpoints-reject",
    "nodeports-ipv4-primary-only",
    "nodeports-ipv4-multiple-cidrs",
    "nodeports-ipv6",
    "itp-cluster",
    "nodeports-ipv4-all-addresses-localhost",
    "itp-local-one-local",
    "itp-local-no-local",
    "itp-local-endpoints-deleted",
    "terminating-etp-local-ready-endpoints-exist",
    "terminating-etp-local-only-terminating-endpoints-exist",
    "terminating-etp-local-no-usable-endpoints-on-any-node",
    "terminating-etp-cluster-ready-endpoints-exist",
    "terminating-etp-cluster-terminating-endpoints-on-remote-node",
    "terminating-etp-cluster-no-usable-endpoints-on-any-node",
    "terminating-etp-local-endpoints-deleted",
    "external-traffic-policy-local",
    "masquerade-matrix-base",
    "masquerade-matrix-no-local-detector",
    "masquerade-matrix-masquerade-all",
];

#[test]
fn cases_parse_and_enabled_scenarios_exist() {
    let cases = Cases::vendored();
    assert_eq!(cases.schema, "kube-proxy-conformance-cases/v1");
    assert!(!cases.scenarios.is_empty());
    for id in ENABLED {
        let s = cases.scenario(id);
        assert!(!s.flows.is_empty(), "{id} has no flows");
    }
    let mut ids: Vec<&str> = cases.scenarios.iter().map(|s| s.id.as_str()).collect();
    let n = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n, "scenario ids are unique");
}

#[test]
fn manifests_render_for_every_scenario() {
    let cases = Cases::vendored();
    for s in &cases.scenarios {
        let yaml = rig::manifests::scenario_yaml(s);
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&yaml).expect("valid YAML documents");
        let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        let want = 1 + s.node.service_cidrs.len() + s.services.len() + s.endpoint_slices.len();
        assert_eq!(kinds.len(), want, "{}: one document per object", s.id);
        assert_eq!(kinds.iter().filter(|k| **k == "Node").count(), 1);
        assert_eq!(
            kinds.iter().filter(|k| **k == "Service").count(),
            s.services.len()
        );
        for d in &docs {
            if d["kind"] == "EndpointSlice" {
                assert!(d["metadata"]["labels"]["kubernetes.io/service-name"].is_string());
            }
        }
        let cfg: serde_json::Value =
            serde_saphyr::from_str(&rig::manifests::kube_proxy_config(&s.node, Mode::Nftables))
                .expect("config is YAML");
        assert_eq!(cfg["kind"], "KubeProxyConfiguration");
        assert_eq!(cfg["hostnameOverride"], s.node.name.as_str());
    }
}

/// Validates the rig itself, with no switchyard involved: direct pod/remote/external
/// reachability, ACCEPT sinks, hairpin-free self connections, and leak detection.
#[test]
fn rig_topology_without_switchyard() {
    let cases = Cases::vendored();
    let ip = |s: &str| s.parse().expect("ip literal");
    let v4 = cases.scenario("clusterip-general").clone();
    let Some(rig) = Rig::build(
        "rig_topology_without_switchyard",
        &v4,
        RigOptions::default(),
    ) else {
        return;
    };
    let pod = ip("10.180.0.2");
    let flows = vec![
        Flow::new(
            "pod -> local endpoint directly",
            SourceKind::Pod,
            pod,
            ip("10.180.0.1"),
            80,
            Protocol::Tcp,
            Expect::dnat(&["10.180.0.1:80"], false),
        ),
        Flow::new(
            "pod -> remote endpoint directly",
            SourceKind::Pod,
            pod,
            ip("10.180.2.1"),
            8443,
            Protocol::Tcp,
            Expect::dnat(&["10.180.2.1:8443"], false),
        ),
        Flow::new(
            "pod -> remote endpoint directly (UDP)",
            SourceKind::Pod,
            pod,
            ip("10.180.2.1"),
            53,
            Protocol::Udp,
            Expect::dnat(&["10.180.2.1:53"], false),
        ),
        Flow::new(
            "pod -> pod on a closed port",
            SourceKind::Pod,
            pod,
            ip("10.180.0.1"),
            81,
            Protocol::Tcp,
            Expect::verdict(Verdict::Reject),
        ),
        Flow::new(
            "pod -> closed UDP port on remote",
            SourceKind::Pod,
            pod,
            ip("10.180.2.1"),
            54,
            Protocol::Udp,
            Expect::verdict(Verdict::Reject),
        ),
        Flow::new(
            "node -> local endpoint directly",
            SourceKind::Node,
            ip("192.168.0.2"),
            ip("10.180.0.1"),
            5353,
            Protocol::Tcp,
            // No SNAT without switchyard: the endpoint sees the bound node address.
            Expect::dnat(&["10.180.0.1:5353"], false),
        ),
        Flow::new(
            "external -> remote endpoint directly",
            SourceKind::External,
            ip("192.168.0.100"),
            ip("10.180.2.1"),
            80,
            Protocol::Tcp,
            Expect::dnat(&["10.180.2.1:80"], false),
        ),
        Flow::new(
            "unprogrammed ClusterIP leaks to the uplink (not a timeout)",
            SourceKind::Pod,
            pod,
            ip("172.30.0.41"),
            80,
            Protocol::Tcp,
            Expect::verdict(Verdict::Drop),
        ),
    ];
    let reports = rig.check_flows(&flows);
    for r in &reports {
        println!("{} | {} | {}", r.name, r.expected, r.observed);
    }
    let failed: Vec<_> = reports[..7]
        .iter()
        .filter(|r| r.status != rig::Status::Pass)
        .collect();
    assert!(failed.is_empty(), "rig self-check failed: {failed:#?}");
    // The leak must be visible as an ICMP error from ext, not a silent timeout.
    assert_eq!(reports[7].status, rig::Status::Fail);
    assert!(
        reports[7].observed.contains("UNREACHABLE"),
        "leaks must be detectable: {:?}",
        reports[7]
    );

    // ACCEPT sinks and IPv6 plumbing.
    let v6 = cases.scenario("nodeports-ipv6").clone();
    let Some(rig6) = Rig::build(
        "rig_topology_without_switchyard/v6",
        &v6,
        RigOptions::default(),
    ) else {
        return;
    };
    let pod6 = ip("fd00:10::2");
    let flows6 = vec![
        Flow::new(
            "v6 pod -> local endpoint",
            SourceKind::Pod,
            pod6,
            ip("fd00:10:180::2:1"),
            80,
            Protocol::Tcp,
            Expect::dnat(&["[fd00:10:180::2:1]:80"], false),
        ),
        Flow::new(
            "v6 pod -> remote endpoint",
            SourceKind::Pod,
            pod6,
            ip("fd00:10:180::1"),
            80,
            Protocol::Tcp,
            Expect::dnat(&["[fd00:10:180::1]:80"], false),
        ),
        Flow::new(
            "v6 external -> remote endpoint",
            SourceKind::External,
            ip("2600:5200::1"),
            ip("fd00:10:180::1"),
            80,
            Protocol::Tcp,
            Expect::dnat(&["[fd00:10:180::1]:80"], false),
        ),
    ];
    let mut all = flows6;
    // The scenario's own ACCEPT flows are answered by the sinks even without switchyard.
    all.extend(
        v6.flows
            .iter()
            .filter(|f| f.expect.verdict == Verdict::Accept)
            .cloned(),
    );
    let reports6 = rig6.check_flows(&all);
    for r in &reports6 {
        println!("{} | {} | {}", r.name, r.expected, r.observed);
    }
    let failed6: Vec<_> = reports6
        .iter()
        .filter(|r| r.status != rig::Status::Pass)
        .collect();
    assert!(failed6.is_empty(), "v6 rig self-check failed: {failed6:#?}");
}

#[test]
fn clusterip_general() {
    rig::run_conformance("clusterip-general", Mode::Nftables);
}

#[test]
fn no_endpoints_reject() {
    rig::run_conformance("no-endpoints-reject", Mode::Nftables);
}

#[test]
fn nodeports_ipv4_primary_only() {
    rig::run_conformance("nodeports-ipv4-primary-only", Mode::Nftables);
}

#[test]
fn nodeports_ipv4_multiple_cidrs() {
    rig::run_conformance("nodeports-ipv4-multiple-cidrs", Mode::Nftables);
}

#[test]
fn nodeports_ipv6() {
    rig::run_conformance("nodeports-ipv6", Mode::Nftables);
}

#[test]
fn itp_cluster() {
    rig::run_conformance("itp-cluster", Mode::Nftables);
}

// Beyond the core issue's list: these pass with the current policy and endpoint selection.

#[test]
fn nodeports_ipv4_all_addresses_localhost() {
    rig::run_conformance("nodeports-ipv4-all-addresses-localhost", Mode::Nftables);
}

#[test]
fn itp_local_one_local() {
    rig::run_conformance("itp-local-one-local", Mode::Nftables);
}

#[test]
fn itp_local_no_local() {
    rig::run_conformance("itp-local-no-local", Mode::Nftables);
}

#[test]
fn itp_local_endpoints_deleted() {
    rig::run_conformance("itp-local-endpoints-deleted", Mode::Nftables);
}

#[test]
fn terminating_etp_local_ready_endpoints_exist() {
    rig::run_conformance(
        "terminating-etp-local-ready-endpoints-exist",
        Mode::Nftables,
    );
}

#[test]
fn terminating_etp_local_only_terminating_endpoints_exist() {
    rig::run_conformance(
        "terminating-etp-local-only-terminating-endpoints-exist",
        Mode::Nftables,
    );
}

#[test]
fn terminating_etp_local_no_usable_endpoints_on_any_node() {
    rig::run_conformance(
        "terminating-etp-local-no-usable-endpoints-on-any-node",
        Mode::Nftables,
    );
}

#[test]
fn terminating_etp_cluster_ready_endpoints_exist() {
    rig::run_conformance(
        "terminating-etp-cluster-ready-endpoints-exist",
        Mode::Nftables,
    );
}

#[test]
fn terminating_etp_cluster_terminating_endpoints_on_remote_node() {
    rig::run_conformance(
        "terminating-etp-cluster-terminating-endpoints-on-remote-node",
        Mode::Nftables,
    );
}

#[test]
fn terminating_etp_cluster_no_usable_endpoints_on_any_node() {
    rig::run_conformance(
        "terminating-etp-cluster-no-usable-endpoints-on-any-node",
        Mode::Nftables,
    );
}

#[test]
fn terminating_etp_local_endpoints_deleted() {
    rig::run_conformance("terminating-etp-local-endpoints-deleted", Mode::Nftables);
}

#[test]
fn external_traffic_policy_local() {
    rig::run_conformance("external-traffic-policy-local", Mode::Nftables);
}

#[test]
fn masquerade_matrix_base() {
    rig::run_conformance("masquerade-matrix-base", Mode::Nftables);
}

#[test]
fn masquerade_matrix_no_local_detector() {
    rig::run_conformance("masquerade-matrix-no-local-detector", Mode::Nftables);
}

#[test]
fn masquerade_matrix_masquerade_all() {
    rig::run_conformance("masquerade-matrix-masquerade-all", Mode::Nftables);
}

/// Every scenario in the vendored cases is enabled: all 155 flows run in both modes.
#[test]
fn every_scenario_is_enabled() {
    let cases = Cases::vendored();
    let mut all: Vec<&str> = cases.scenarios.iter().map(|s| s.id.as_str()).collect();
    let mut enabled = ENABLED.to_vec();
    all.sort_unstable();
    enabled.sort_unstable();
    assert_eq!(all, enabled);
    let flows: usize = cases.scenarios.iter().map(|s| s.flows.len()).sum();
    assert_eq!(flows, 155);
}

/// The same scenarios in iptables mode (iptables-nft, as detected on a fresh node), with
/// each flow's `modeDifferences` for iptables as its expectation.
mod iptables_mode {
    use super::*;

    macro_rules! iptables_scenarios {
        ($($test:ident => $id:literal),* $(,)?) => {
            $(
                #[test]
                fn $test() {
                    rig::run_conformance($id, Mode::Iptables);
                }
            )*
            /// Every enabled scenario has an iptables test above.
            #[test]
            fn every_enabled_scenario_runs_in_iptables_mode() {
                let ids: &[&str] = &[$($id),*];
                assert_eq!(ids, ENABLED);
            }
        };
    }

    /// iptables-legacy, chosen with the override flag: the rules land in the legacy
    /// tables, none in iptables-nft's, and the flows behave the same.
    #[test]
    fn iptables_legacy_backend() {
        for id in [
            "clusterip-general",
            "nodeports-ipv4-all-addresses-localhost",
        ] {
            let opts = RigOptions {
                mode: Mode::Iptables,
                sync_args: vec!["--iptables-backend".into(), "legacy".into()],
                ..RigOptions::default()
            };
            let Some(rig) = rig::run_conformance_with(&format!("legacy/{id}"), id, opts) else {
                return;
            };
            let legacy = rig.node_exec("iptables-legacy-save", &["-t", "nat"]);
            assert!(legacy.success(), "{}", legacy.transcript());
            assert!(
                legacy.stdout.contains(":KUBE-SERVICES"),
                "{}",
                legacy.stdout
            );
            let nft = rig.node_exec("iptables-nft-save", &["-t", "nat"]);
            assert!(
                !nft.stdout.contains("KUBE-"),
                "nothing in iptables-nft: {}",
                nft.stdout
            );
        }
    }

    iptables_scenarios! {
        clusterip_general => "clusterip-general",
        no_endpoints_reject => "no-endpoints-reject",
        nodeports_ipv4_primary_only => "nodeports-ipv4-primary-only",
        nodeports_ipv4_multiple_cidrs => "nodeports-ipv4-multiple-cidrs",
        nodeports_ipv6 => "nodeports-ipv6",
        itp_cluster => "itp-cluster",
        nodeports_ipv4_all_addresses_localhost => "nodeports-ipv4-all-addresses-localhost",
        itp_local_one_local => "itp-local-one-local",
        itp_local_no_local => "itp-local-no-local",
        itp_local_endpoints_deleted => "itp-local-endpoints-deleted",
        terminating_etp_local_ready_endpoints_exist => "terminating-etp-local-ready-endpoints-exist",
        terminating_etp_local_only_terminating_endpoints_exist => "terminating-etp-local-only-terminating-endpoints-exist",
        terminating_etp_local_no_usable_endpoints_on_any_node => "terminating-etp-local-no-usable-endpoints-on-any-node",
        terminating_etp_cluster_ready_endpoints_exist => "terminating-etp-cluster-ready-endpoints-exist",
        terminating_etp_cluster_terminating_endpoints_on_remote_node => "terminating-etp-cluster-terminating-endpoints-on-remote-node",
        terminating_etp_cluster_no_usable_endpoints_on_any_node => "terminating-etp-cluster-no-usable-endpoints-on-any-node",
        terminating_etp_local_endpoints_deleted => "terminating-etp-local-endpoints-deleted",
        external_traffic_policy_local => "external-traffic-policy-local",
        masquerade_matrix_base => "masquerade-matrix-base",
        masquerade_matrix_no_local_detector => "masquerade-matrix-no-local-detector",
        masquerade_matrix_masquerade_all => "masquerade-matrix-masquerade-all",
    }
}

/// Switchyard's own scenarios (`tests/conformance/own-cases.json`: topology hints,
/// dual-stack, UDP through every front end, loadBalancerSourceRanges, the NodeCIDR,
/// InterfaceNamePrefix and BridgeInterface local-traffic detectors, an external IP that
/// contests another Service's ClusterIP), in both modes.
mod own_cases {
    use super::*;

    macro_rules! own_scenarios {
        ($($test:ident => $id:literal),* $(,)?) => {
            $(
                mod $test {
                    use super::*;
                    #[test]
                    fn nftables() {
                        rig::run_own($id, Mode::Nftables);
                    }
                    #[test]
                    fn iptables() {
                        rig::run_own($id, Mode::Iptables);
                    }
                }
            )*
            /// Every own scenario has a test above.
            #[test]
            fn every_own_scenario_runs() {
                let mut ids: Vec<&str> = vec![$($id),*];
                let cases = Cases::own();
                let mut all: Vec<&str> = cases.scenarios.iter().map(|s| s.id.as_str()).collect();
                ids.sort_unstable();
                all.sort_unstable();
                assert_eq!(ids, all);
            }
        };
    }

    own_scenarios! {
        topology_hints => "own-topology-hints",
        dual_stack => "own-dual-stack",
        udp_frontends => "own-udp-frontends",
        lb_source_ranges => "own-lb-source-ranges",
        detect_node_cidr => "own-detect-node-cidr",
        detect_interface_prefix => "own-detect-interface-prefix",
        detect_bridge => "own-detect-bridge",
        etp_local_no_local_endpoint => "own-etp-local-no-local-endpoint",
        contested_frontend => "own-contested-frontend",
    }
}

/// Discrimination check: on a node that nobody programmed, every enabled scenario flow
/// that expects switchyard to act (DNAT, REJECT, DROP) must fail, and every ACCEPT flow
/// must pass. A flow passing here would pass even with a do-nothing switchyard.
#[test]
fn rig_fails_every_flow_on_an_unprogrammed_node() {
    let (cases, own) = (Cases::vendored(), Cases::own());
    let mut wrongly_passing = Vec::new();
    let scenarios = ENABLED
        .iter()
        .map(|id| cases.scenario(id))
        .chain(own.scenarios.iter());
    for scenario in scenarios {
        let id = &scenario.id;
        let test = format!("rig_unprogrammed/{id}");
        let Some(rig) = Rig::build(&test, scenario, RigOptions::default()) else {
            return;
        };
        for (flow, report) in scenario.flows.iter().zip(rig.check_flows(&scenario.flows)) {
            println!(
                "{id}: {:?} {} | {}",
                report.status, report.name, report.observed
            );
            let accept = flow.expectation(Mode::Nftables).verdict == Verdict::Accept;
            let want = if accept {
                rig::Status::Pass
            } else {
                rig::Status::Fail
            };
            if report.status != want && report.status != rig::Status::Skip {
                wrongly_passing.push(format!("{id}: {} -> {:?}", report.name, report.status));
            }
        }
    }
    assert!(
        wrongly_passing.is_empty(),
        "flows whose outcome does not depend on switchyard: {wrongly_passing:#?}"
    );
}

/// A hand-written, kube-proxy-like ruleset for `clusterip-general` (hairpin masquerade,
/// targetPort, TCP/UDP on one port, REJECT for wrong port/protocol, DROP for an
/// unallocated ClusterIP). Used only to prove the rig's expectations are reachable.
const REFERENCE_CLUSTERIP_GENERAL: &str = r#"
table ip rigref {
  chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; jump services; }
  chain nat-output { type nat hook output priority -100; policy accept; jump services; }
  chain nat-postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    meta mark & 0x4000 == 0x4000 masquerade
  }
  chain svc1 {
    ip saddr 10.180.0.1 meta mark set meta mark | 0x4000
    meta l4proto tcp dnat to 10.180.0.1:80
  }
  chain services {
    ip daddr 172.30.0.41 tcp dport 80 jump svc1
    ip daddr 172.30.0.42 tcp dport 80 dnat ip to numgen random mod 2 map { 0 : 10.180.0.1 . 80, 1 : 10.180.2.1 . 80 }
    ip daddr 172.30.0.42 tcp dport 443 dnat ip to numgen random mod 2 map { 0 : 10.180.0.1 . 8443, 1 : 10.180.2.1 . 8443 }
    ip daddr 172.30.0.42 tcp dport 53 dnat ip to numgen random mod 2 map { 0 : 10.180.0.1 . 5353, 1 : 10.180.2.1 . 5353 }
    ip daddr 172.30.0.42 udp dport 53 dnat ip to numgen random mod 2 map { 0 : 10.180.0.1 . 53, 1 : 10.180.2.1 . 53 }
  }
  chain filter-forward {
    type filter hook forward priority 0; policy accept;
    ip daddr 172.30.0.41 tcp dport 443 reject
    ip daddr 172.30.0.42 udp dport 80 reject
    ip daddr 172.30.0.50 drop
  }
}
"#;

/// A hand-written ruleset for `nodeports-ipv6` (ClusterIP, NodePort on the primary
/// IPv6 node IP only, masquerade for external and node-originated NodePort traffic).
const REFERENCE_NODEPORTS_IPV6: &str = r#"
table ip6 rigref {
  chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; jump services; }
  chain nat-output { type nat hook output priority -100; policy accept; jump services; }
  chain nat-postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    meta mark & 0x4000 == 0x4000 masquerade
  }
  chain svc1 {
    meta l4proto tcp dnat ip6 to numgen random mod 2 map { 0 : fd00:10:180::1 . 80, 1 : fd00:10:180::2:1 . 80 }
  }
  chain services {
    ip6 daddr fd00:172:30::41 tcp dport 80 jump svc1
    ip6 daddr 2001:db8::1 tcp dport 3001 meta mark set meta mark | 0x4000 jump svc1
  }
}
"#;

fn check_reference(id: &str, script: &str) {
    let cases = Cases::vendored();
    let test = format!("rig_reference/{id}");
    let Some(mut rig) = Rig::build(&test, cases.scenario(id), RigOptions::default()) else {
        return;
    };
    rig.program_nft(script);
    rig.assert_scenario_flows();
}

/// The rig passes `clusterip-general` against a known-good hand-written ruleset.
#[test]
fn rig_reference_ruleset_clusterip_general() {
    check_reference("clusterip-general", REFERENCE_CLUSTERIP_GENERAL);
}

/// The rig passes `nodeports-ipv6` against a known-good hand-written ruleset.
#[test]
fn rig_reference_ruleset_nodeports_ipv6() {
    check_reference("nodeports-ipv6", REFERENCE_NODEPORTS_IPV6);
}
