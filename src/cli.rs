//! Command-line interface: subcommands and kube-proxy's flag names.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "switchyard",
    version,
    about = "A kube-proxy replacement: Kubernetes Services on nftables"
)]
pub struct Cli {
    /// Log level filter (error, warn, info, debug, trace); RUST_LOG overrides it.
    #[arg(long, global = true, default_value = "info")]
    pub log_level: String,
    /// Log format: text, or json (one JSON object per line).
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    pub logging_format: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the transaction that would program these manifests into an empty kernel.
    Render(Inputs),
    /// Program the kernel of the current network namespace.
    Sync(SyncArgs),
    /// The agent: watch the API server (or manifest files) and keep the kernel in sync.
    Run(RunArgs),
    /// Remove everything Switchyard installed, and nothing else.
    Cleanup(CleanupArgs),
    /// What a running agent programs, from its metrics and health endpoints.
    Status(StatusArgs),
    /// What the rules do with one packet, and why.
    Trace(TraceArgs),
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    /// Where the objects come from: manifests, or a live cluster listed once.
    #[command(flatten)]
    pub source: RunArgs,
    /// Source address.
    #[arg(long)]
    pub from: String,
    /// Destination, as IP:PORT/PROTO ([IPv6]:PORT/PROTO; PROTO defaults to TCP).
    #[arg(long)]
    pub to: String,
    /// Where the packet starts: pod, node, localhost or external (default: from the source
    /// address).
    #[arg(long)]
    pub from_kind: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The agent's metricsBindAddress.
    #[arg(long, default_value = "127.0.0.1:10249")]
    pub metrics_address: String,
    /// The agent's healthzBindAddress.
    #[arg(long, default_value = "127.0.0.1:10256")]
    pub healthz_address: String,
}

/// Configuration and manifests.
#[derive(Debug, Args)]
pub struct Inputs {
    /// KubeProxyConfiguration file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A manifest file or a directory of them (YAML or JSON, multi-document, kind: List).
    #[arg(long)]
    pub manifests: PathBuf,
    #[command(flatten)]
    pub flags: ProxyFlags,
}

#[derive(Debug, Args)]
pub struct SyncArgs {
    /// Sync once and exit (the continuous agent is `switchyard run`).
    #[arg(long)]
    pub once: bool,
    /// Re-read the kernel and repair whatever differs from the layout, not only what
    /// changed (nftables mode rewrites every chain, iptables mode every chain that differs).
    #[arg(long)]
    pub full: bool,
    #[command(flatten)]
    pub inputs: Inputs,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// KubeProxyConfiguration file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// These manifest files (a file or a directory) instead of an API server (`run` watches
    /// them).
    #[arg(long, conflicts_with_all = ["kubeconfig", "master"])]
    pub manifests: Option<PathBuf>,
    /// kubeconfig file (default: clientConnection.kubeconfig, else in-cluster configuration).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The API server's address, overriding the kubeconfig's.
    #[arg(long)]
    pub master: Option<String>,
    #[command(flatten)]
    pub flags: ProxyFlags,
}

#[derive(Debug, Args)]
pub struct CleanupArgs {
    /// Dataplane mode whose rules to remove (default: all Switchyard installs).
    #[arg(long)]
    pub proxy_mode: Option<String>,
    /// iptables: auto (the back end holding rules), nft or legacy.
    #[arg(long, default_value = "auto")]
    pub iptables_backend: String,
    /// Remove kube-proxy's leftovers instead (its `kube-proxy` nftables tables and its
    /// iptables chains on both back ends), for a node moving from kube-proxy. Switchyard's
    /// iptables mode uses the same chain names: run it before Switchyard starts in iptables
    /// mode, or let Switchyard's next full sync rewrite them.
    #[arg(long, conflicts_with_all = ["proxy_mode"])]
    pub kube_proxy: bool,
}

/// kube-proxy's flags; each overrides the configuration file.
#[derive(Debug, Args, Default, Clone)]
pub struct ProxyFlags {
    /// nftables (default), iptables or ipvs.
    #[arg(long)]
    pub proxy_mode: Option<String>,
    /// iptables mode: auto (the back end the node's rules are in), nft or legacy.
    #[arg(long)]
    pub iptables_backend: Option<String>,
    /// The node's name, instead of the hostname.
    #[arg(long)]
    pub hostname_override: Option<String>,
    /// Pod CIDRs (comma-separated), for local-traffic detection.
    #[arg(long)]
    pub cluster_cidr: Option<String>,
    /// ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix.
    #[arg(long)]
    pub detect_local_mode: Option<String>,
    #[arg(long)]
    pub pod_bridge_interface: Option<String>,
    #[arg(long)]
    pub pod_interface_name_prefix: Option<String>,
    /// CIDRs (comma-separated) or "primary": node addresses that accept NodePorts.
    #[arg(long)]
    pub nodeport_addresses: Option<String>,
    /// Masquerade all traffic sent to service addresses.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub masquerade_all: Option<bool>,
    /// Bit of the packet mark that requests masquerade.
    #[arg(long)]
    pub iptables_masquerade_bit: Option<u8>,
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub iptables_localhost_nodeports: Option<bool>,
    #[arg(long)]
    pub iptables_sync_period: Option<String>,
    #[arg(long)]
    pub iptables_min_sync_period: Option<String>,
    #[arg(long)]
    pub bind_address: Option<String>,
    #[arg(long)]
    pub healthz_bind_address: Option<String>,
    #[arg(long)]
    pub metrics_bind_address: Option<String>,
}
