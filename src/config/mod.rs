//! kube-proxy configuration: the effective settings (kube-proxy's internal
//! `KubeProxyConfiguration`, v1.37), read from a `KubeProxyConfiguration` file, overridden
//! by flags, validated with errors that name the field, and printed back as v1alpha1.

pub mod duration;
mod file;
mod flags;
pub mod v1alpha1;
mod validate;

pub use file::{append_port_if_needed, load_file, parse};
pub use flags::{apply_flags, parse_iptables_backend};
pub use validate::validate;

use dataplane::iptables::kernel::Variant;
use ipnetwork::IpNetwork;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
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

impl DetectLocalMode {
    pub fn as_str(self) -> &'static str {
        match self {
            DetectLocalMode::ClusterCidr => "ClusterCIDR",
            DetectLocalMode::NodeCidr => "NodeCIDR",
            DetectLocalMode::BridgeInterface => "BridgeInterface",
            DetectLocalMode::InterfaceNamePrefix => "InterfaceNamePrefix",
        }
    }
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
    /// Raw entries: CIDRs, or the keywords `primary`, `localhost`, `all`.
    pub node_port_addresses: Vec<String>,
    /// The active mode's masquerade bit (from `nftables` in nftables mode, else `iptables`).
    pub masquerade_bit: u8,
    /// Each section's own bit, for printing the configuration back.
    pub iptables_masquerade_bit: u8,
    pub nftables_masquerade_bit: u8,
    pub masquerade_all: bool,
    pub localhost_node_ports: bool,
    pub sync_period: Duration,
    pub min_sync_period: Duration,
    pub bind_address: IpAddr,
    pub healthz_bind_address: String,
    pub metrics_bind_address: String,
    pub bind_address_hard_fail: bool,
    /// clientConnection.kubeconfig.
    pub kubeconfig: Option<PathBuf>,
    pub client: ClientConnection,
    /// iptables-nft or iptables-legacy (`--iptables-backend`); `None`: the one the node uses.
    pub iptables_backend: Option<Variant>,
    /// The `ipvs` section (IPVS mode).
    pub ipvs: IpvsConfig,
    pub conntrack: ConntrackConfig,
    /// Written to /proc/self/oom_score_adj at start; kube-proxy's default is -999.
    pub oom_score_adj: Option<i32>,
    pub feature_gates: BTreeMap<String, bool>,
    pub logging: LoggingConfig,
    pub enable_profiling: bool,
    pub show_hidden_metrics_for_version: String,
    /// Informer resync in kube-proxy; a watch needs none (kept for printing back).
    pub config_sync_period: Duration,
    /// Obsolete userspace-proxy field: accepted and printed back.
    pub port_range: String,
    /// Windows-only settings: accepted and printed back as given.
    pub winkernel: serde_json::Value,
    pub windows_run_as_service: bool,
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

/// kube-proxy's `conntrack` section: sysctls applied at start.
#[derive(Debug, Clone, PartialEq)]
pub struct ConntrackConfig {
    /// nf_conntrack_max = maxPerCore x CPUs (at least `min`); 0 leaves it alone.
    pub max_per_core: Option<i32>,
    pub min: Option<i32>,
    pub tcp_established_timeout: Option<Duration>,
    pub tcp_close_wait_timeout: Option<Duration>,
    pub tcp_be_liberal: bool,
    /// Zero leaves the kernel's value.
    pub udp_timeout: Duration,
    pub udp_stream_timeout: Duration,
}

impl Default for ConntrackConfig {
    /// kube-proxy's defaults (pkg/proxy/apis/config/v1alpha1/defaults.go).
    fn default() -> Self {
        ConntrackConfig {
            max_per_core: Some(32 * 1024),
            min: Some(128 * 1024),
            tcp_established_timeout: Some(Duration::from_secs(24 * 3600)),
            tcp_close_wait_timeout: Some(Duration::from_secs(3600)),
            tcp_be_liberal: false,
            udp_timeout: Duration::ZERO,
            udp_stream_timeout: Duration::ZERO,
        }
    }
}

/// `clientConnection`, beside its kubeconfig.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientConnection {
    pub accept_content_types: String,
    /// kube-proxy asks for protobuf; Switchyard's client speaks JSON only (logged).
    pub content_type: String,
    pub qps: f32,
    pub burst: i32,
}

impl Default for ClientConnection {
    fn default() -> Self {
        ClientConnection {
            accept_content_types: String::new(),
            content_type: "application/vnd.kubernetes.protobuf".into(),
            qps: 5.0,
            burst: 10,
        }
    }
}

/// component-base's `LoggingConfiguration`.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggingConfig {
    /// `text` or `json`.
    pub format: String,
    pub flush_frequency: Duration,
    pub verbosity: u32,
    /// `pattern=N` entries (text format only in kube-proxy; logged as not honoured here).
    pub vmodule: Vec<String>,
    pub text_split_stream: bool,
    pub text_info_buffer_size: String,
    pub json_split_stream: bool,
    pub json_info_buffer_size: String,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        LoggingConfig {
            format: "text".into(),
            flush_frequency: Duration::from_secs(5),
            verbosity: 0,
            vmodule: Vec::new(),
            text_split_stream: false,
            text_info_buffer_size: "0".into(),
            json_split_stream: false,
            json_info_buffer_size: "0".into(),
        }
    }
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
            iptables_masquerade_bit: 14,
            nftables_masquerade_bit: 14,
            masquerade_all: false,
            localhost_node_ports: true,
            sync_period: Duration::from_secs(30),
            min_sync_period: Duration::from_secs(1),
            bind_address: IpAddr::from([0, 0, 0, 0]),
            healthz_bind_address: "0.0.0.0:10256".into(),
            metrics_bind_address: "127.0.0.1:10249".into(),
            bind_address_hard_fail: false,
            kubeconfig: None,
            client: ClientConnection::default(),
            iptables_backend: None,
            ipvs: IpvsConfig::default(),
            conntrack: ConntrackConfig::default(),
            oom_score_adj: Some(-999),
            feature_gates: BTreeMap::new(),
            logging: LoggingConfig::default(),
            enable_profiling: false,
            show_hidden_metrics_for_version: String::new(),
            config_sync_period: Duration::from_secs(15 * 60),
            port_range: String::new(),
            winkernel: serde_json::json!({
                "networkName": "",
                "sourceVip": "",
                "enableDSR": false,
                "rootHnsEndpointName": "",
                "forwardHealthCheckVip": false
            }),
            windows_run_as_service: false,
        }
    }
}

impl ProxyConfig {
    /// A feature gate's value: the configured one, else the v1.37 default.
    pub fn gate(&self, name: &str) -> bool {
        self.feature_gates
            .get(name)
            .copied()
            .unwrap_or_else(|| crate::feature_gates::default_of(name).unwrap_or(false))
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
    #[error("{}: not valid YAML: {message}", path.display())]
    Yaml { path: PathBuf, message: String },
    #[error("{origin}: field {field}: {message}")]
    Field {
        origin: String,
        field: String,
        message: String,
    },
}

pub(crate) fn field_err(origin: &str, field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        origin: origin.to_string(),
        field: field.to_string(),
        message: message.into(),
    }
}

/// Warnings about the configuration that do not stop it from being used.
pub type Warnings = Vec<String>;

/// Parse a comma-separated CIDR list.
pub(crate) fn parse_cidrs(
    origin: &str,
    field: &str,
    raw: &str,
) -> Result<Vec<IpNetwork>, ConfigError> {
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<IpNetwork>()
                .map_err(|e| field_err(origin, field, format!("{s:?} is not a CIDR: {e}")))
        })
        .collect()
}

pub(crate) fn parse_detect_mode(s: &str) -> Option<DetectLocalMode> {
    match s {
        "" | "ClusterCIDR" => Some(DetectLocalMode::ClusterCidr),
        "NodeCIDR" => Some(DetectLocalMode::NodeCidr),
        "BridgeInterface" => Some(DetectLocalMode::BridgeInterface),
        "InterfaceNamePrefix" => Some(DetectLocalMode::InterfaceNamePrefix),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
