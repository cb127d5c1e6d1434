//! Checks across fields that kube-proxy v1.37 makes (pkg/proxy/apis/config/validation),
//! plus what the kernel would refuse later, so a bad value fails at start, named.

use super::{field_err, ConfigError, DetectLocalMode, ProxyConfig, ProxyMode};
use ipnetwork::IpNetwork;
use std::net::SocketAddr;

/// The kernel's interface-name limit (IFNAMSIZ less the terminating NUL).
const IFNAME_MAX: usize = 15;

/// The only value kube-proxy v1.37 takes for showHiddenMetricsForVersion: the previous minor.
pub const PREVIOUS_MINOR: &str = "1.36";

pub fn validate(cfg: &ProxyConfig, origin: &str) -> Result<(), ConfigError> {
    let mut seen: Vec<&str> = Vec::new();
    for (i, s) in cfg.node_port_addresses.iter().enumerate() {
        let field = format!("nodePortAddresses[{i}]");
        match s.as_str() {
            "primary" | "localhost" | "all" => {
                if seen.contains(&s.as_str()) {
                    return Err(field_err(origin, &field, format!("duplicate keyword {s:?}")));
                }
                seen.push(s);
            }
            other if other.parse::<IpNetwork>().is_err() => {
                return Err(field_err(
                    origin,
                    &field,
                    format!(
                        "{other:?} must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all'"
                    ),
                ))
            }
            _ => {}
        }
    }
    match cfg.detect_local_mode {
        DetectLocalMode::BridgeInterface => {
            check_ifname(origin, "detectLocal.bridgeInterface", &cfg.bridge_interface)?
        }
        DetectLocalMode::InterfaceNamePrefix => check_ifname(
            origin,
            "detectLocal.interfaceNamePrefix",
            &cfg.interface_name_prefix,
        )?,
        DetectLocalMode::ClusterCidr if cfg.cluster_cidrs.len() > 2 => {
            return Err(field_err(
                origin,
                "clusterCIDR",
                "must be a single CIDR or a dual-stack pair",
            ))
        }
        DetectLocalMode::ClusterCidr
            if cfg.cluster_cidrs.len() == 2
                && cfg.cluster_cidrs[0].is_ipv4() == cfg.cluster_cidrs[1].is_ipv4() =>
        {
            return Err(field_err(
                origin,
                "clusterCIDR",
                "two CIDRs must be one IPv4 and one IPv6",
            ))
        }
        _ => {}
    }
    // kube-proxy's client connection check. A file's negative burst is refused as it is
    // read; `--kube-api-burst`'s is refused here.
    if cfg.client.burst < 0 {
        return Err(field_err(
            origin,
            "clientConnection.burst",
            format!("{} must be non-negative", cfg.client.burst),
        ));
    }
    // kube-proxy's conntrack check, likewise: `--conntrack-max-per-core` and
    // `--conntrack-min` reach it here.
    for (field, value) in [
        ("conntrack.maxPerCore", cfg.conntrack.max_per_core),
        ("conntrack.min", cfg.conntrack.min),
    ] {
        if let Some(v) = value.filter(|v| *v < 0) {
            return Err(field_err(
                origin,
                field,
                format!("{v} must be greater than or equal to 0"),
            ));
        }
    }
    if cfg.sync_period.is_zero() {
        return Err(field_err(origin, "syncPeriod", "must be greater than 0"));
    }
    if cfg.min_sync_period > cfg.sync_period {
        return Err(field_err(
            origin,
            "syncPeriod",
            format!(
                "{:?} must be greater than or equal to minSyncPeriod ({:?})",
                cfg.sync_period, cfg.min_sync_period
            ),
        ));
    }
    if let Some(adj) = cfg.oom_score_adj {
        if !(-1000..=1000).contains(&adj) {
            return Err(field_err(
                origin,
                "oomScoreAdj",
                format!("{adj} must be within the range [-1000, 1000]"),
            ));
        }
    }
    for (field, addr) in [
        ("healthzBindAddress", &cfg.healthz_bind_address),
        ("metricsBindAddress", &cfg.metrics_bind_address),
    ] {
        // Empty turns the server off (a flag can say so); anything else must be IP:port.
        if !addr.is_empty() && addr.parse::<SocketAddr>().is_err() {
            return Err(field_err(
                origin,
                field,
                format!("{addr:?} must be IP:port"),
            ));
        }
    }
    let v = &cfg.show_hidden_metrics_for_version;
    if !v.is_empty() && v != PREVIOUS_MINOR {
        return Err(field_err(
            origin,
            "showHiddenMetricsForVersion",
            format!(
                "{v:?}: must be omitted or have the value '{PREVIOUS_MINOR}'; only the previous minor version is allowed"
            ),
        ));
    }
    match cfg.logging.format.as_str() {
        // component-base refuses per-file verbosity outside the text format.
        "json" if !cfg.logging.vmodule.is_empty() => {
            return Err(field_err(
                origin,
                "logging.vmodule",
                "only supported for the text log format",
            ))
        }
        "text" | "json" => {}
        other => {
            return Err(field_err(
                origin,
                "logging.format",
                format!("{other:?} is not one of text, json"),
            ))
        }
    }
    if cfg.mode == ProxyMode::Ipvs && !cfg.gate("KubeProxyIPVS") {
        return Err(field_err(
            origin,
            "mode",
            "\"ipvs\" needs the KubeProxyIPVS feature gate, which is disabled",
        ));
    }
    crate::feature_gates::validate(&cfg.feature_gates)
        .map_err(|message| field_err(origin, "featureGates", message))
}

fn check_ifname(origin: &str, field: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() {
        return Err(field_err(
            origin,
            field,
            "required by this detectLocalMode (must not be empty)",
        ));
    }
    if name.len() > IFNAME_MAX {
        return Err(field_err(
            origin,
            field,
            format!("{name:?} is longer than the kernel's {IFNAME_MAX}-character interface names"),
        ));
    }
    if name
        .chars()
        .any(|c| c.is_whitespace() || c == '/' || c == '"' || c.is_control())
    {
        return Err(field_err(
            origin,
            field,
            format!("{name:?} is not a valid interface name"),
        ));
    }
    Ok(())
}
