//! Switchyard's own `run`/`render`/`sync` flags (kube-proxy's names) applied over the
//! file: each given flag overrides the file's value.

use super::{
    duration, field_err, parse_cidrs, parse_detect_mode, validate, ConfigError, ProxyConfig,
    ProxyMode,
};
use crate::cli::ProxyFlags;
use dataplane::iptables::kernel::Variant;

/// `auto` (the back end the node uses), `nft` or `legacy`.
pub fn parse_iptables_backend(origin: &str, s: &str) -> Result<Option<Variant>, ConfigError> {
    match s {
        "auto" => Ok(None),
        other => Variant::parse(other).map(Some).ok_or_else(|| {
            field_err(
                origin,
                "--iptables-backend",
                format!("{other:?} is not one of auto, nft, legacy"),
            )
        }),
    }
}

/// Apply kube-proxy's command-line flags over the file.
pub fn apply_flags(cfg: &mut ProxyConfig, f: &ProxyFlags) -> Result<(), ConfigError> {
    let o = "command line";
    if let Some(m) = &f.proxy_mode {
        cfg.mode = ProxyMode::parse(m).ok_or_else(|| {
            field_err(
                o,
                "--proxy-mode",
                format!("{m:?} is not one of nftables, iptables, ipvs"),
            )
        })?;
        cfg.masquerade_bit = match cfg.mode {
            ProxyMode::Nftables => cfg.nftables_masquerade_bit,
            ProxyMode::Iptables | ProxyMode::Ipvs => cfg.iptables_masquerade_bit,
        };
    }
    if let Some(b) = &f.iptables_backend {
        cfg.iptables_backend = parse_iptables_backend(o, b)?;
    }
    if let Some(h) = &f.hostname_override {
        cfg.hostname_override = Some(h.trim().to_lowercase()).filter(|s| !s.is_empty());
    }
    if let Some(c) = &f.cluster_cidr {
        cfg.cluster_cidrs = parse_cidrs(o, "--cluster-cidr", c)?;
    }
    if let Some(m) = &f.detect_local_mode {
        cfg.detect_local_mode = parse_detect_mode(m).ok_or_else(|| {
            field_err(
                o,
                "--detect-local-mode",
                format!("{m:?} is not a detect-local mode"),
            )
        })?;
    }
    if let Some(b) = &f.pod_bridge_interface {
        cfg.bridge_interface = b.clone();
    }
    if let Some(p) = &f.pod_interface_name_prefix {
        cfg.interface_name_prefix = p.clone();
    }
    if let Some(n) = &f.nodeport_addresses {
        cfg.node_port_addresses = n
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
    }
    if let Some(a) = f.masquerade_all {
        cfg.masquerade_all = a;
    }
    if let Some(b) = f.iptables_masquerade_bit {
        if b > 31 {
            return Err(field_err(
                o,
                "--iptables-masquerade-bit",
                format!("{b} is not in 0..31"),
            ));
        }
        cfg.masquerade_bit = b;
        cfg.iptables_masquerade_bit = b;
        cfg.nftables_masquerade_bit = b;
    }
    if let Some(l) = f.iptables_localhost_nodeports {
        cfg.localhost_node_ports = l;
    }
    for (flag, value, min) in [
        ("--iptables-sync-period", &f.iptables_sync_period, false),
        (
            "--iptables-min-sync-period",
            &f.iptables_min_sync_period,
            true,
        ),
    ] {
        if let Some(v) = value {
            let d = duration::parse(v)
                .ok_or_else(|| field_err(o, flag, format!("{v:?} is not a duration")))?;
            if min {
                cfg.min_sync_period = d;
            } else {
                cfg.sync_period = d;
            }
        }
    }
    if let Some(b) = &f.bind_address {
        cfg.bind_address = b
            .parse()
            .map_err(|_| field_err(o, "--bind-address", format!("{b:?} is not an IP address")))?;
    }
    // An empty address given on the command line turns that server off.
    if let Some(h) = &f.healthz_bind_address {
        cfg.healthz_bind_address = h.clone();
    }
    if let Some(m) = &f.metrics_bind_address {
        cfg.metrics_bind_address = m.clone();
    }
    validate(cfg, o)
}
