//! kube-proxy configuration: the `KubeProxyConfiguration` file, kube-proxy's flags over it,
//! and validation with errors that name the field.

use crate::cli::ProxyFlags;
use dataplane::iptables::exec::Variant;
use ipnetwork::IpNetwork;
use serde_yaml::{Mapping, Value};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Dataplane mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    Nftables,
    Iptables,
    Ipvs,
}

impl ProxyMode {
    pub fn parse(s: &str) -> Option<ProxyMode> {
        match s {
            // Switchyard's default is nftables, where kube-proxy's is iptables.
            "" | "nftables" => Some(ProxyMode::Nftables),
            "iptables" => Some(ProxyMode::Iptables),
            "ipvs" => Some(ProxyMode::Ipvs),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Nftables => "nftables",
            ProxyMode::Iptables => "iptables",
            ProxyMode::Ipvs => "ipvs",
        }
    }
}

/// How local (pod) traffic is detected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DetectLocalMode {
    ClusterCidr,
    NodeCidr,
    BridgeInterface,
    InterfaceNamePrefix,
}

/// The effective configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyConfig {
    pub mode: ProxyMode,
    pub hostname_override: Option<String>,
    pub cluster_cidrs: Vec<IpNetwork>,
    pub detect_local_mode: DetectLocalMode,
    pub bridge_interface: String,
    pub interface_name_prefix: String,
    /// Raw entries: CIDRs, or the single word `primary`.
    pub node_port_addresses: Vec<String>,
    pub masquerade_bit: u8,
    pub masquerade_all: bool,
    pub localhost_node_ports: bool,
    pub sync_period: Duration,
    pub min_sync_period: Duration,
    pub bind_address: IpAddr,
    pub healthz_bind_address: String,
    pub metrics_bind_address: String,
    /// clientConnection.kubeconfig.
    pub kubeconfig: Option<PathBuf>,
    /// iptables-nft or iptables-legacy (`--iptables-backend`); `None`: the one the node uses.
    pub iptables_backend: Option<Variant>,
    /// The `ipvs` section (IPVS mode).
    pub ipvs: IpvsConfig,
}

/// kube-proxy's `ipvs` section.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct IpvsConfig {
    /// One of [`dataplane::ipvs::SCHEDULERS`]; empty means rr.
    pub scheduler: String,
    pub strict_arp: bool,
    /// IPVS services on addresses inside these are never removed.
    pub exclude_cidrs: Vec<IpNetwork>,
    /// IPVS connection timeouts; zero leaves the kernel's.
    pub tcp_timeout: Duration,
    pub tcp_fin_timeout: Duration,
    pub udp_timeout: Duration,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            mode: ProxyMode::Nftables,
            hostname_override: None,
            cluster_cidrs: Vec::new(),
            detect_local_mode: DetectLocalMode::ClusterCidr,
            bridge_interface: String::new(),
            interface_name_prefix: String::new(),
            node_port_addresses: Vec::new(),
            masquerade_bit: 14,
            masquerade_all: false,
            localhost_node_ports: true,
            sync_period: Duration::from_secs(30),
            min_sync_period: Duration::from_secs(1),
            bind_address: IpAddr::from([0, 0, 0, 0]),
            healthz_bind_address: "0.0.0.0:10256".into(),
            metrics_bind_address: "127.0.0.1:10249".into(),
            kubeconfig: None,
            iptables_backend: None,
            ipvs: IpvsConfig::default(),
        }
    }
}

/// A configuration problem, naming the file (or flag) and the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not valid YAML: {source}", path.display())]
    Yaml {
        path: PathBuf,
        source: serde_yaml::Error,
    },
    #[error("{origin}: field {field}: {message}")]
    Field {
        origin: String,
        field: String,
        message: String,
    },
}

fn field_err(origin: &str, field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        origin: origin.to_string(),
        field: field.to_string(),
        message: message.into(),
    }
}

/// Fields kube-proxy knows that Switchyard reads.
const KNOWN_TOP: &[&str] = &[
    "apiVersion",
    "kind",
    "mode",
    "hostnameOverride",
    "clusterCIDR",
    "detectLocalMode",
    "detectLocal",
    "nodePortAddresses",
    "iptables",
    "nftables",
    "bindAddress",
    "healthzBindAddress",
    "metricsBindAddress",
    "syncPeriod",
    "minSyncPeriod",
    "clientConnection",
    "ipvs",
];

/// kube-proxy fields that are valid but do not change what Switchyard programs.
const ACCEPTED_TOP: &[&str] = &[
    "bindAddressHardFail",
    "configSyncPeriod",
    "conntrack",
    "enableProfiling",
    "featureGates",
    "linux",
    "logging",
    "oomScoreAdj",
    "portRange",
    "showHiddenMetricsForVersion",
    "winkernel",
    "windowsRunAsService",
    "ipFamilyPolicy",
];

fn get_str(map: &Mapping, origin: &str, field: &str) -> Result<Option<String>, ConfigError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(field_err(
            origin,
            field,
            format!("expected a string, got {}", kind_of(other)),
        )),
    }
}

fn get_bool(map: &Mapping, origin: &str, field: &str) -> Result<Option<bool>, ConfigError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(field_err(
            origin,
            field,
            format!("expected true or false, got {}", kind_of(other)),
        )),
    }
}

fn get_int(map: &Mapping, origin: &str, field: &str) -> Result<Option<i64>, ConfigError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_i64().is_some() => Ok(n.as_i64()),
        Some(other) => Err(field_err(
            origin,
            field,
            format!("expected an integer, got {}", kind_of(other)),
        )),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

/// Parse a Go duration (`30s`, `1m0s`, `500ms`, `1h`).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return None;
        }
        let value: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += value * scale;
    }
    Some(Duration::from_secs_f64(total))
}

fn parse_cidrs(origin: &str, field: &str, raw: &str) -> Result<Vec<IpNetwork>, ConfigError> {
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<IpNetwork>()
                .map_err(|e| field_err(origin, field, format!("{s:?} is not a CIDR: {e}")))
        })
        .collect()
}

/// Warnings about the configuration that do not stop it from being used.
pub type Warnings = Vec<String>;

/// Read a KubeProxyConfiguration file.
pub fn load_file(path: &Path) -> Result<(ProxyConfig, Warnings), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, &path.display().to_string()).map_err(|e| match e {
        ConfigError::Yaml { source, .. } => ConfigError::Yaml {
            path: path.to_path_buf(),
            source,
        },
        other => other,
    })
}

/// Parse configuration text; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<(ProxyConfig, Warnings), ConfigError> {
    let doc: Value = serde_yaml::from_str(text).map_err(|source| ConfigError::Yaml {
        path: PathBuf::from(origin),
        source,
    })?;
    let mut cfg = ProxyConfig::default();
    let mut warnings = Vec::new();
    let map = match doc {
        Value::Mapping(m) => m,
        Value::Null => return Ok((cfg, warnings)),
        other => {
            return Err(field_err(
                origin,
                "(document)",
                format!("expected a mapping, got {}", kind_of(&other)),
            ))
        }
    };
    match get_str(&map, origin, "kind")?.as_deref() {
        None | Some("KubeProxyConfiguration") => {}
        Some(k) => {
            return Err(field_err(
                origin,
                "kind",
                format!("expected KubeProxyConfiguration, got {k:?}"),
            ))
        }
    }
    if let Some(v) = get_str(&map, origin, "apiVersion")? {
        if !v.starts_with("kubeproxy.config.k8s.io/") {
            return Err(field_err(
                origin,
                "apiVersion",
                format!("expected kubeproxy.config.k8s.io/v1alpha1, got {v:?}"),
            ));
        }
    }
    for key in map.keys() {
        let name = key.as_str().unwrap_or("?");
        if !KNOWN_TOP.contains(&name) && !ACCEPTED_TOP.contains(&name) {
            warnings.push(format!("{origin}: unknown field {name:?} ignored"));
        }
    }
    if let Some(m) = get_str(&map, origin, "mode")? {
        cfg.mode = ProxyMode::parse(&m).ok_or_else(|| {
            field_err(
                origin,
                "mode",
                format!("{m:?} is not one of nftables, iptables, ipvs"),
            )
        })?;
    }
    cfg.hostname_override = get_str(&map, origin, "hostnameOverride")?.filter(|s| !s.is_empty());
    match map.get("clientConnection") {
        None | Some(Value::Null) => {}
        Some(Value::Mapping(cc)) => {
            cfg.kubeconfig = match cc.get("kubeconfig") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) if s.is_empty() => None,
                Some(Value::String(s)) => Some(PathBuf::from(s)),
                Some(other) => {
                    return Err(field_err(
                        origin,
                        "clientConnection.kubeconfig",
                        format!("expected a string, got {}", kind_of(other)),
                    ))
                }
            };
        }
        Some(other) => {
            return Err(field_err(
                origin,
                "clientConnection",
                format!("expected a mapping, got {}", kind_of(other)),
            ))
        }
    }
    if let Some(c) = get_str(&map, origin, "clusterCIDR")? {
        cfg.cluster_cidrs = parse_cidrs(origin, "clusterCIDR", &c)?;
    }
    if let Some(m) = get_str(&map, origin, "detectLocalMode")? {
        cfg.detect_local_mode = parse_detect_mode(&m)
            .ok_or_else(|| field_err(origin, "detectLocalMode", format!("{m:?} is not one of ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix")))?;
    }
    match map.get("detectLocal") {
        None | Some(Value::Null) => {}
        Some(Value::Mapping(d)) => {
            let o = format!("{origin}: detectLocal");
            cfg.bridge_interface = get_str(d, &o, "bridgeInterface")?.unwrap_or_default();
            cfg.interface_name_prefix = get_str(d, &o, "interfaceNamePrefix")?.unwrap_or_default();
            for k in d.keys() {
                let n = k.as_str().unwrap_or("?");
                if n != "bridgeInterface" && n != "interfaceNamePrefix" {
                    warnings.push(format!(
                        "{origin}: unknown field \"detectLocal.{n}\" ignored"
                    ));
                }
            }
        }
        Some(other) => {
            return Err(field_err(
                origin,
                "detectLocal",
                format!("expected a mapping, got {}", kind_of(other)),
            ))
        }
    }
    match map.get("nodePortAddresses") {
        None | Some(Value::Null) => {}
        Some(Value::Sequence(items)) => {
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::String(s) => cfg.node_port_addresses.push(s.trim().to_string()),
                    other => {
                        return Err(field_err(
                            origin,
                            &format!("nodePortAddresses[{i}]"),
                            format!("expected a string, got {}", kind_of(other)),
                        ))
                    }
                }
            }
        }
        Some(other) => {
            return Err(field_err(
                origin,
                "nodePortAddresses",
                format!("expected a list, got {}", kind_of(other)),
            ))
        }
    }
    for (field, target) in [
        ("bindAddress", 0),
        ("healthzBindAddress", 1),
        ("metricsBindAddress", 2),
    ] {
        if let Some(v) = get_str(&map, origin, field)? {
            match target {
                0 => {
                    cfg.bind_address = v.parse().map_err(|_| {
                        field_err(origin, field, format!("{v:?} is not an IP address"))
                    })?
                }
                1 => cfg.healthz_bind_address = v,
                _ => cfg.metrics_bind_address = v,
            }
        }
    }
    // Top-level periods (newer config versions), then the mode's own section wins.
    read_periods(&map, origin, &mut cfg)?;
    read_ipvs(&map, origin, &mut cfg, &mut warnings)?;
    let section_for_mode = match cfg.mode {
        ProxyMode::Nftables => "nftables",
        ProxyMode::Iptables | ProxyMode::Ipvs => "iptables",
    };
    for section in ["iptables", "nftables"] {
        match map.get(section) {
            None | Some(Value::Null) => {}
            Some(Value::Mapping(m)) => {
                let o = format!("{origin}: {section}");
                let known = [
                    "masqueradeAll",
                    "masqueradeBit",
                    "localhostNodePorts",
                    "syncPeriod",
                    "minSyncPeriod",
                ];
                for k in m.keys() {
                    let n = k.as_str().unwrap_or("?");
                    if !known.contains(&n) {
                        warnings.push(format!("{origin}: unknown field \"{section}.{n}\" ignored"));
                    }
                }
                // Validate both sections; only the active mode's values apply.
                let masq_all = get_bool(m, &o, "masqueradeAll")?;
                let bit = get_int(m, &o, "masqueradeBit")?;
                let localhost = get_bool(m, &o, "localhostNodePorts")?;
                let mut periods = cfg.clone();
                read_periods(m, &o, &mut periods)?;
                if let Some(b) = bit {
                    if !(0..=31).contains(&b) {
                        return Err(field_err(
                            &o,
                            "masqueradeBit",
                            format!("{b} is not in 0..31"),
                        ));
                    }
                }
                if section == "iptables" {
                    if let Some(l) = localhost {
                        cfg.localhost_node_ports = l;
                    }
                }
                if section == section_for_mode {
                    if let Some(a) = masq_all {
                        cfg.masquerade_all = a;
                    }
                    if let Some(b) = bit {
                        cfg.masquerade_bit = b as u8;
                    }
                    // IPVS mode takes masquerading from `iptables`, periods from `ipvs`.
                    if cfg.mode != ProxyMode::Ipvs {
                        cfg.sync_period = periods.sync_period;
                        cfg.min_sync_period = periods.min_sync_period;
                    }
                }
            }
            Some(other) => {
                return Err(field_err(
                    origin,
                    section,
                    format!("expected a mapping, got {}", kind_of(other)),
                ))
            }
        }
    }
    Ok((cfg, warnings))
}

/// The `ipvs` section: always validated; its periods apply in IPVS mode.
fn read_ipvs(
    map: &Mapping,
    origin: &str,
    cfg: &mut ProxyConfig,
    warnings: &mut Warnings,
) -> Result<(), ConfigError> {
    let m = match map.get("ipvs") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Mapping(m)) => m,
        Some(other) => {
            return Err(field_err(
                origin,
                "ipvs",
                format!("expected a mapping, got {}", kind_of(other)),
            ))
        }
    };
    let o = format!("{origin}: ipvs");
    let known = [
        "scheduler",
        "strictARP",
        "excludeCIDRs",
        "syncPeriod",
        "minSyncPeriod",
        "tcpTimeout",
        "tcpFinTimeout",
        "udpTimeout",
    ];
    for k in m.keys() {
        let n = k.as_str().unwrap_or("?");
        if !known.contains(&n) {
            warnings.push(format!("{origin}: unknown field \"ipvs.{n}\" ignored"));
        }
    }
    if let Some(s) = get_str(m, &o, "scheduler")? {
        if !s.is_empty() && !dataplane::ipvs::SCHEDULERS.contains(&s.as_str()) {
            return Err(field_err(
                &o,
                "scheduler",
                format!(
                    "{s:?} is not one of {}",
                    dataplane::ipvs::SCHEDULERS.join(", ")
                ),
            ));
        }
        cfg.ipvs.scheduler = s;
    }
    if let Some(b) = get_bool(m, &o, "strictARP")? {
        cfg.ipvs.strict_arp = b;
    }
    match m.get("excludeCIDRs") {
        None | Some(Value::Null) => {}
        Some(Value::Sequence(items)) => {
            for (i, item) in items.iter().enumerate() {
                let field = format!("excludeCIDRs[{i}]");
                let raw = item.as_str().ok_or_else(|| {
                    field_err(
                        &o,
                        &field,
                        format!("expected a CIDR, got {}", kind_of(item)),
                    )
                })?;
                cfg.ipvs.exclude_cidrs.extend(parse_cidrs(&o, &field, raw)?);
            }
        }
        Some(other) => {
            return Err(field_err(
                &o,
                "excludeCIDRs",
                format!("expected a list, got {}", kind_of(other)),
            ))
        }
    }
    for field in ["tcpTimeout", "tcpFinTimeout", "udpTimeout"] {
        if let Some(v) = get_str(m, &o, field)? {
            let d = parse_duration(&v).ok_or_else(|| {
                field_err(
                    &o,
                    field,
                    format!("{v:?} is not a duration like 900s or 15m0s"),
                )
            })?;
            match field {
                "tcpTimeout" => cfg.ipvs.tcp_timeout = d,
                "tcpFinTimeout" => cfg.ipvs.tcp_fin_timeout = d,
                _ => cfg.ipvs.udp_timeout = d,
            }
        }
    }
    let mut periods = cfg.clone();
    read_periods(m, &o, &mut periods)?;
    if cfg.mode == ProxyMode::Ipvs {
        cfg.sync_period = periods.sync_period;
        cfg.min_sync_period = periods.min_sync_period;
    }
    Ok(())
}

fn read_periods(map: &Mapping, origin: &str, cfg: &mut ProxyConfig) -> Result<(), ConfigError> {
    for field in ["syncPeriod", "minSyncPeriod"] {
        if let Some(v) = get_str(map, origin, field)? {
            let d = parse_duration(&v).ok_or_else(|| {
                field_err(
                    origin,
                    field,
                    format!("{v:?} is not a duration like 30s or 1m0s"),
                )
            })?;
            if field == "syncPeriod" {
                cfg.sync_period = d;
            } else {
                cfg.min_sync_period = d;
            }
        }
    }
    Ok(())
}

fn parse_detect_mode(s: &str) -> Option<DetectLocalMode> {
    match s {
        "" | "ClusterCIDR" => Some(DetectLocalMode::ClusterCidr),
        "NodeCIDR" => Some(DetectLocalMode::NodeCidr),
        "BridgeInterface" => Some(DetectLocalMode::BridgeInterface),
        "InterfaceNamePrefix" => Some(DetectLocalMode::InterfaceNamePrefix),
        _ => None,
    }
}

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
    }
    if let Some(b) = &f.iptables_backend {
        cfg.iptables_backend = parse_iptables_backend(o, b)?;
    }
    if let Some(h) = &f.hostname_override {
        cfg.hostname_override = Some(h.clone()).filter(|s| !s.is_empty());
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
            let d = parse_duration(v)
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
    if let Some(h) = &f.healthz_bind_address {
        cfg.healthz_bind_address = h.clone();
    }
    if let Some(m) = &f.metrics_bind_address {
        cfg.metrics_bind_address = m.clone();
    }
    validate(cfg, o)
}

/// Cross-field checks kube-proxy also makes.
pub fn validate(cfg: &ProxyConfig, origin: &str) -> Result<(), ConfigError> {
    let has_primary = cfg.node_port_addresses.iter().any(|s| s == "primary");
    if has_primary && cfg.node_port_addresses.len() > 1 {
        return Err(field_err(
            origin,
            "nodePortAddresses",
            "\"primary\" cannot be combined with CIDRs",
        ));
    }
    for (i, s) in cfg.node_port_addresses.iter().enumerate() {
        if s != "primary" && s.parse::<IpNetwork>().is_err() {
            return Err(field_err(
                origin,
                &format!("nodePortAddresses[{i}]"),
                format!("{s:?} is neither a CIDR nor \"primary\""),
            ));
        }
    }
    match cfg.detect_local_mode {
        DetectLocalMode::BridgeInterface if cfg.bridge_interface.is_empty() => Err(field_err(
            origin,
            "detectLocal.bridgeInterface",
            "required when detectLocalMode is BridgeInterface",
        )),
        DetectLocalMode::InterfaceNamePrefix if cfg.interface_name_prefix.is_empty() => {
            Err(field_err(
                origin,
                "detectLocal.interfaceNamePrefix",
                "required when detectLocalMode is InterfaceNamePrefix",
            ))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let e = parse("nodePortAddresses: [primary, 10.0.0.0/8]\n", "f")
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

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("1m0s"), Some(Duration::from_secs(60)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("30"), None);
        assert_eq!(parse_duration("s"), None);
    }
}
