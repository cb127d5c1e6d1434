//! Tests of reading, overriding and validating the configuration.
use super::*;
use crate::cli::ProxyFlags;

const FULL: &str = r#"
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: test-node
clusterCIDR: 10.0.0.0/8,fd00:10::/64
detectLocalMode: ClusterCIDR
nodePortAddresses: ["192.168.0.0/24"]
bindAddress: 0.0.0.0
healthzBindAddress: 0.0.0.0:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: { maxPerCore: 32768 }
iptables: { masqueradeAll: false, masqueradeBit: 14, localhostNodePorts: false, syncPeriod: 1m0s }
nftables: { masqueradeAll: true, masqueradeBit: 13, syncPeriod: 45s, minSyncPeriod: 500ms }
bogus: 1
"#;

#[test]
fn full_file_parses_with_mode_specific_sections() {
    let (c, w) = parse(FULL, "kp.yaml").unwrap();
    assert_eq!(c.mode, ProxyMode::Nftables);
    assert_eq!(c.hostname_override.as_deref(), Some("test-node"));
    assert_eq!(c.cluster_cidrs.len(), 2);
    assert!(c.masquerade_all);
    assert_eq!(c.masquerade_bit, 13);
    assert!(!c.localhost_node_ports);
    assert_eq!(c.sync_period, Duration::from_secs(45));
    assert_eq!(c.min_sync_period, Duration::from_millis(500));
    assert_eq!(
        w,
        vec!["kp.yaml: unknown field \"bogus\" ignored".to_string()]
    );
}

#[test]
fn wrong_types_and_values_name_the_field() {
    let e = parse("mode: fast\n", "kp.yaml").unwrap_err().to_string();
    assert!(e.contains("kp.yaml") && e.contains("field mode"), "{e}");
    let e = parse("nftables: { masqueradeAll: yes please }\n", "f")
        .unwrap_err()
        .to_string();
    assert!(e.contains("nftables") && e.contains("masqueradeAll"), "{e}");
    let e = parse("clusterCIDR: 10.0.0.0/33\n", "f")
        .unwrap_err()
        .to_string();
    assert!(e.contains("clusterCIDR"), "{e}");
    let e = parse("nodePortAddresses: [primary, 10.0.0.0/8, primary]\n", "f")
        .and_then(|(c, _)| validate(&c, "f").map(|_| ()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("nodePortAddresses"), "{e}");
}

#[test]
fn flags_override_the_file() {
    let (mut c, _) = parse(FULL, "f").unwrap();
    let flags = ProxyFlags {
        proxy_mode: Some("iptables".into()),
        cluster_cidr: Some("10.1.0.0/16".into()),
        masquerade_all: Some(false),
        nodeport_addresses: Some("primary".into()),
        ..ProxyFlags::default()
    };
    apply_flags(&mut c, &flags).unwrap();
    assert_eq!(c.mode, ProxyMode::Iptables);
    assert_eq!(
        c.cluster_cidrs,
        vec!["10.1.0.0/16".parse::<IpNetwork>().unwrap()]
    );
    assert!(!c.masquerade_all);
    assert_eq!(c.node_port_addresses, vec!["primary".to_string()]);
}

/// kubeadm v1.37's kube-proxy ConfigMap (`config.conf`), as kubeadm marshals it: every
/// field present, most of them zero or null.
const KUBEADM: &str = include_str!("../../tests/compat/kubeadm-kube-proxy-config.conf");
/// kind's, which kubeadm marshals the same way with kind's values.
const KIND: &str = include_str!("../../tests/compat/kind-kube-proxy-config.conf");

#[test]
fn kubeadm_config_is_accepted_whole_with_kube_proxy_defaults() {
    let (c, w) = parse(KUBEADM, "config.conf").unwrap();
    assert!(w.is_empty(), "{w:?}");
    validate(&c, "config.conf").unwrap();
    // mode "" is nftables here (kube-proxy's would be iptables).
    assert_eq!(c.mode, ProxyMode::Nftables);
    // Empty addresses take kube-proxy's defaults; they do not turn the servers off.
    assert_eq!(c.healthz_bind_address, "0.0.0.0:10256");
    assert_eq!(c.metrics_bind_address, "127.0.0.1:10249");
    assert_eq!(c.sync_period, Duration::from_secs(30));
    assert_eq!(c.min_sync_period, Duration::from_secs(1));
    assert_eq!(c.conntrack, ConntrackConfig::default());
    assert_eq!(c.oom_score_adj, Some(-999));
    assert_eq!(c.client.qps, 5.0);
    assert_eq!(c.client.burst, 10);
    assert_eq!(
        c.kubeconfig.as_deref(),
        Some(std::path::Path::new("/var/lib/kube-proxy/kubeconfig.conf"))
    );
    assert_eq!(c.logging.flush_frequency, Duration::from_secs(5));
    assert_eq!(c.masquerade_bit, 14);
    assert!(c.localhost_node_ports);
}

#[test]
fn kind_config_selects_iptables_and_its_conntrack() {
    let (c, w) = parse(KIND, "config.conf").unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(c.mode, ProxyMode::Iptables);
    assert_eq!(c.min_sync_period, Duration::from_secs(1));
    assert_eq!(c.conntrack.max_per_core, Some(0));
    assert!(c.conntrack.tcp_be_liberal);
}

#[test]
fn node_port_keywords_of_kube_proxy_1_37() {
    for ok in [
        "[primary]",
        "[localhost]",
        "[all]",
        "[primary, localhost, 10.0.0.0/8]",
    ] {
        let (c, _) = parse(&format!("nodePortAddresses: {ok}\n"), "f").unwrap();
        validate(&c, "f").unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    let (c, _) = parse("nodePortAddresses: [everything]\n", "f").unwrap();
    let e = validate(&c, "f").unwrap_err().to_string();
    assert!(
        e.contains("nodePortAddresses[0]") && e.contains("'localhost'"),
        "{e}"
    );
}

#[test]
fn hostile_values_are_errors_that_name_the_field() {
    let cases = [
        (
            "nftables: {syncPeriod: 99999999999999999999h}\n",
            "nftables.syncPeriod",
        ),
        ("conntrack: {maxPerCore: -1}\n", "conntrack.maxPerCore"),
        (
            "conntrack: {tcpEstablishedTimeout: soon}\n",
            "conntrack.tcpEstablishedTimeout",
        ),
        ("oomScoreAdj: 99999999999\n", "oomScoreAdj"),
        (
            "featureGates: {AllowServiceExternalIPs: maybe}\n",
            "featureGates.AllowServiceExternalIPs",
        ),
        ("clientConnection: {qps: fast}\n", "clientConnection.qps"),
        ("logging: {verbosity: -1}\n", "logging.verbosity"),
        ("apiVersion: kubeproxy.config.k8s.io/v9\n", "apiVersion"),
    ];
    for (text, field) in cases {
        let e = parse(text, "f").unwrap_err().to_string();
        assert!(e.contains(&format!("field {field}")), "{text}: {e}");
    }
    let invalid = [
        ("oomScoreAdj: 1001\n", "oomScoreAdj"),
        ("nftables: {syncPeriod: 1s, minSyncPeriod: 5s}\n", "syncPeriod"),
        (
            "detectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: a-very-long-bridge-name}\n",
            "detectLocal.bridgeInterface",
        ),
        ("showHiddenMetricsForVersion: \"1.30\"\n", "showHiddenMetricsForVersion"),
        ("logging: {format: xml}\n", "logging.format"),
        ("featureGates: {MultiCIDRServiceAllocator: false}\n", "featureGates"),
        ("mode: ipvs\nfeatureGates: {KubeProxyIPVS: false}\n", "mode"),
        ("clusterCIDR: 10.0.0.0/8,10.1.0.0/16\n", "clusterCIDR"),
    ];
    for (text, field) in invalid {
        let (c, _) = parse(text, "f").unwrap_or_else(|e| panic!("{text}: {e}"));
        let e = validate(&c, "f").unwrap_err().to_string();
        assert!(e.contains(&format!("field {field}")), "{text}: {e}");
    }
}

#[test]
fn a_byte_order_mark_is_not_a_second_document() {
    let (c, _) = parse("\u{feff}mode: iptables\n", "f").unwrap();
    assert_eq!(c.mode, ProxyMode::Iptables);
}

#[test]
fn addresses_without_port_get_kube_proxys_default_port() {
    let (c, _) = parse("bindAddress: \"::\"\nhealthzBindAddress: \"::1\"\n", "f").unwrap();
    assert_eq!(c.healthz_bind_address, "[::1]:10256");
    assert_eq!(c.metrics_bind_address, "[::1]:10249");
}
