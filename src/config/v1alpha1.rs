//! The effective configuration printed back as kube-proxy prints its own: the v1alpha1
//! `KubeProxyConfiguration` that kube-proxy v1.37 converts its internal configuration to
//! for `/configz` and `--write-config-to` (pkg/proxy/apis/config/v1alpha1/conversion.go:
//! the active mode's section carries the periods and masqueradeAll, the others zero).

use super::duration::format as go;
use super::{ProxyConfig, ProxyMode};
use serde_json::{json, Map, Value};

pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
pub const GROUP: &str = "kubeproxy.config.k8s.io";

/// The configuration as a v1alpha1 object.
pub fn to_value(cfg: &ProxyConfig) -> Value {
    let zero = go(std::time::Duration::ZERO);
    let (sync, min_sync) = (go(cfg.sync_period), go(cfg.min_sync_period));
    let section_periods = |mode: ProxyMode| {
        if cfg.mode == mode {
            (sync.clone(), min_sync.clone())
        } else {
            (zero.clone(), zero.clone())
        }
    };
    let (ipt_sync, ipt_min) = section_periods(ProxyMode::Iptables);
    let (nft_sync, nft_min) = section_periods(ProxyMode::Nftables);
    let (ipvs_sync, ipvs_min) = section_periods(ProxyMode::Ipvs);
    let nft_masq_all = cfg.mode == ProxyMode::Nftables && cfg.masquerade_all;
    let ipt_masq_all = cfg.mode != ProxyMode::Nftables && cfg.masquerade_all;
    let exclude: Value = if cfg.ipvs.exclude_cidrs.is_empty() {
        Value::Null
    } else {
        json!(cfg
            .ipvs
            .exclude_cidrs
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>())
    };
    // nftables mode's empty nodePortAddresses means primary, and kube-proxy shows it so.
    let node_ports: Value = if !cfg.node_port_addresses.is_empty() {
        json!(cfg.node_port_addresses)
    } else if cfg.mode == ProxyMode::Nftables {
        json!(["primary"])
    } else {
        Value::Null
    };
    let mut logging = json!({
        "format": cfg.logging.format,
        "flushFrequency": go(cfg.logging.flush_frequency),
        "verbosity": cfg.logging.verbosity,
        "options": {
            "text": stream(cfg.logging.text_split_stream, &cfg.logging.text_info_buffer_size),
            "json": stream(cfg.logging.json_split_stream, &cfg.logging.json_info_buffer_size),
        },
    });
    if !cfg.logging.vmodule.is_empty() {
        let items: Vec<Value> = cfg
            .logging
            .vmodule
            .iter()
            .filter_map(|e| e.split_once('='))
            .map(|(p, v)| json!({"filePattern": p, "verbosity": v.parse::<u32>().unwrap_or(0)}))
            .collect();
        logging["vmodule"] = Value::Array(items);
    }
    let mut out = json!({
        "kind": "KubeProxyConfiguration",
        "apiVersion": API_VERSION,
        "clientConnection": {
            "kubeconfig": cfg.kubeconfig.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            "acceptContentTypes": cfg.client.accept_content_types,
            "contentType": cfg.client.content_type,
            "qps": go_float32(cfg.client.qps),
            "burst": cfg.client.burst,
        },
        "logging": logging,
        "hostnameOverride": cfg.hostname_override.clone().unwrap_or_default(),
        "bindAddress": cfg.bind_address.to_string(),
        "healthzBindAddress": cfg.healthz_bind_address,
        "metricsBindAddress": cfg.metrics_bind_address,
        "bindAddressHardFail": cfg.bind_address_hard_fail,
        "enableProfiling": cfg.enable_profiling,
        "showHiddenMetricsForVersion": cfg.show_hidden_metrics_for_version,
        "mode": cfg.mode.as_str(),
        "iptables": {
            "masqueradeBit": cfg.iptables_masquerade_bit,
            "masqueradeAll": ipt_masq_all,
            "localhostNodePorts": cfg.localhost_node_ports,
            "syncPeriod": ipt_sync,
            "minSyncPeriod": ipt_min,
        },
        "ipvs": {
            "syncPeriod": ipvs_sync,
            "minSyncPeriod": ipvs_min,
            "scheduler": cfg.ipvs.scheduler,
            "excludeCIDRs": exclude,
            "strictARP": cfg.ipvs.strict_arp,
            "tcpTimeout": go(cfg.ipvs.tcp_timeout),
            "tcpFinTimeout": go(cfg.ipvs.tcp_fin_timeout),
            "udpTimeout": go(cfg.ipvs.udp_timeout),
        },
        "nftables": {
            "masqueradeBit": cfg.nftables_masquerade_bit,
            "masqueradeAll": nft_masq_all,
            "syncPeriod": nft_sync,
            "minSyncPeriod": nft_min,
        },
        "winkernel": cfg.winkernel,
        "detectLocalMode": cfg.detect_local_mode.as_str(),
        "detectLocal": {
            "bridgeInterface": cfg.bridge_interface,
            "interfaceNamePrefix": cfg.interface_name_prefix,
        },
        "clusterCIDR": cfg.cluster_cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","),
        "nodePortAddresses": node_ports,
        "oomScoreAdj": cfg.oom_score_adj,
        "conntrack": {
            "maxPerCore": cfg.conntrack.max_per_core,
            "min": cfg.conntrack.min,
            "tcpEstablishedTimeout": cfg.conntrack.tcp_established_timeout.map(go),
            "tcpCloseWaitTimeout": cfg.conntrack.tcp_close_wait_timeout.map(go),
            "tcpBeLiberal": cfg.conntrack.tcp_be_liberal,
            "udpTimeout": go(cfg.conntrack.udp_timeout),
            "udpStreamTimeout": go(cfg.conntrack.udp_stream_timeout),
        },
        "configSyncPeriod": go(cfg.config_sync_period),
        "portRange": cfg.port_range,
    });
    if !cfg.feature_gates.is_empty() {
        out["featureGates"] = json!(cfg.feature_gates);
    }
    if cfg.windows_run_as_service {
        out["windowsRunAsService"] = Value::Bool(true);
    }
    out
}

/// A float32 as Go's encoders print it: the shortest text that reads back, `5` not `5.0`.
fn go_float32(v: f32) -> Value {
    serde_json::from_str(&v.to_string()).unwrap_or(Value::Null)
}

fn stream(split: bool, size: &str) -> Value {
    let mut m = Map::new();
    if split {
        m.insert("splitStream".into(), Value::Bool(true));
    }
    m.insert("infoBufferSize".into(), Value::String(size.to_string()));
    Value::Object(m)
}

/// `/configz`: `{"kubeproxy.config.k8s.io": {...}}`, as component-base's configz serves it.
pub fn configz(cfg: &ProxyConfig) -> String {
    json!({ GROUP: to_value(cfg) }).to_string()
}

/// `--write-config-to`: the configuration as a YAML file kube-proxy (and Switchyard) reads.
pub fn to_yaml(cfg: &ProxyConfig) -> String {
    serde_saphyr::to_string(&to_value(cfg)).unwrap_or_else(|_| to_value(cfg).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_print_as_kube_proxy_defaults_them() {
        let v = to_value(&ProxyConfig::default());
        assert_eq!(v["apiVersion"], API_VERSION);
        assert_eq!(v["mode"], "nftables");
        assert_eq!(v["nftables"]["syncPeriod"], "30s");
        assert_eq!(v["nftables"]["minSyncPeriod"], "1s");
        assert_eq!(v["iptables"]["syncPeriod"], "0s");
        assert_eq!(v["conntrack"]["maxPerCore"], 32768);
        assert_eq!(v["conntrack"]["tcpEstablishedTimeout"], "24h0m0s");
        assert_eq!(v["conntrack"]["tcpCloseWaitTimeout"], "1h0m0s");
        assert_eq!(v["oomScoreAdj"], -999);
        assert_eq!(v["configSyncPeriod"], "15m0s");
        assert_eq!(v["metricsBindAddress"], "127.0.0.1:10249");
        assert_eq!(v["nodePortAddresses"], json!(["primary"]));
        assert_eq!(
            v["clientConnection"]["contentType"],
            "application/vnd.kubernetes.protobuf"
        );
        assert!(v.get("featureGates").is_none());
    }

    #[test]
    fn written_config_reads_back_the_same() {
        let (cfg, w) = crate::config::parse(
            "mode: iptables\nclusterCIDR: 10.0.0.0/8\nconntrack: {maxPerCore: 0, udpTimeout: 5s}\niptables: {syncPeriod: 1m0s, masqueradeAll: true}\nfeatureGates: {AllowServiceExternalIPs: false}\n",
            "f",
        )
        .unwrap();
        assert!(w.is_empty(), "{w:?}");
        let yaml = to_yaml(&cfg);
        let (back, w) = crate::config::parse(&yaml, "written").unwrap();
        assert!(w.is_empty(), "{w:?}\n{yaml}");
        assert_eq!(back, cfg, "{yaml}");
    }
}
