//! The subcommands: load inputs, build the snapshot, and hand it to the backend.

use crate::agent::{self, AgentError};
use crate::cli::{CleanupArgs, Command, Inputs, RunArgs, StatusArgs, SyncArgs, TraceArgs};
use crate::config::{self, ConfigError, ProxyConfig, ProxyMode};
use crate::kube_proxy_cli::{self, Action, Invocation};
use crate::manifests::{self, ManifestError};
use crate::nodeaddr::Interfaces;
use crate::snapshot::{self, Skipped};
use crate::{leftovers, node_setup};
use dataplane::backend::{Backend, BackendError, Scope};
use dataplane::conntrack::{self, Ctnetlink, UdpFrontends};
use dataplane::iptables::kernel::IptablesCommand;
use dataplane::iptables::IptablesBackend;
use dataplane::ipvs::genl::GenlError;
use dataplane::ipvs::kernel::{IpvsError, RealIpvs, DUMMY};
use dataplane::ipvs::{IpvsBackend, IpvsOptions};
use dataplane::model::Snapshot;
use dataplane::nft::kernel::NftKernel;
use dataplane::nft::NftBackend;

/// Errors that end a command.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("sync failed: {0}")]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error("`sync` without --once is the continuous agent: use `switchyard run`, or pass --once")]
    NeedOnce,
    #[error("listing the cluster's objects: {0}")]
    Live(String),
    #[error("cleanup: {0}")]
    Cleanup(String),
    #[error("trace: {field} {value:?}: {message}")]
    Trace {
        field: &'static str,
        value: String,
        message: &'static str,
    },
    #[error("--write-config-to {}: {source}", path.display())]
    WriteConfig {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("init: {0}")]
    Init(String),
    #[error("status: cannot read the agent's metrics at {addr} (--metrics-address): {source}")]
    Status {
        addr: String,
        source: std::io::Error,
    },
}

pub fn run(cmd: Command) -> Result<(), CommandError> {
    match cmd {
        Command::Render(inputs) => render(&inputs),
        Command::Sync(args) => sync(&args),
        Command::Run(args) => run_agent(&args),
        Command::Cleanup(args) => cleanup(&args),
        Command::Status(args) => status(&args),
        Command::Trace(args) => trace(&args),
    }
}

fn run_agent(args: &RunArgs) -> Result<(), CommandError> {
    let cfg = load_config(args.config.as_deref(), &args.flags)?;
    let source = match &args.manifests {
        Some(path) => agent::Source::Files(path.clone()),
        None => agent::Source::Kube(connection(args, &cfg)),
    };
    start_agent(cfg, source)
}

/// How to reach the API server: the flags, else the configuration's kubeconfig.
fn connection(args: &RunArgs, cfg: &ProxyConfig) -> agent::kube_source::Connection {
    agent::kube_source::Connection {
        kubeconfig: args.kubeconfig.clone().or_else(|| cfg.kubeconfig.clone()),
        master: args.master.clone(),
        qps: cfg.client.qps,
        burst: cfg.client.burst,
        streaming_lists: cfg.gate("WatchListClient"),
    }
}

/// Configuration from file and flags.
fn load_config(
    path: Option<&std::path::Path>,
    flags: &crate::cli::ProxyFlags,
) -> Result<ProxyConfig, CommandError> {
    let mut cfg = match path {
        Some(path) => {
            let (cfg, warnings) = config::load_file(path)?;
            for w in warnings {
                tracing::warn!("{w}");
            }
            config::validate(&cfg, &path.display().to_string())?;
            cfg
        }
        None => ProxyConfig::default(),
    };
    config::apply_flags(&mut cfg, flags)?;
    Ok(cfg)
}

fn report_skipped(skipped: &Skipped) {
    for (_, msg) in &skipped.invalid {
        tracing::warn!("{msg}");
    }
    for msg in &skipped.ignored {
        tracing::debug!("{msg}");
    }
    for msg in &skipped.warnings {
        tracing::warn!("{msg}");
    }
}

/// The configuration, and the snapshot of the manifests: each object converted as it is
/// decoded (`snapshot::Builder`).
fn load(inputs: &Inputs) -> Result<(ProxyConfig, Snapshot), CommandError> {
    let cfg = load_config(inputs.config.as_deref(), &inputs.flags)?;
    let mut builder = snapshot::Builder::new(&cfg);
    manifests::load_each(&inputs.manifests, &mut |o, place| builder.push(o, place))?;
    let (snap, skipped) = builder.finish(&Interfaces);
    report_skipped(&skipped);
    Ok((cfg, snap))
}

fn render(inputs: &Inputs) -> Result<(), CommandError> {
    let (cfg, snap) = load(inputs)?;
    match cfg.mode {
        ProxyMode::Iptables => print!("{}", IptablesBackend::<IptablesCommand>::render(&snap)),
        // Node ports on the node's addresses as the snapshot knows them (the agent reads
        // the interfaces).
        ProxyMode::Ipvs => print!(
            "{}",
            IpvsBackend::<RealIpvs, IptablesCommand>::render(
                &snap,
                &snap.node.node_ips,
                &cfg.ipvs.scheduler
            )
        ),
        ProxyMode::Nftables => print!("{}", NftBackend::<NftKernel>::render(&snap).to_nft()),
    }
    Ok(())
}

fn sync(args: &SyncArgs) -> Result<(), CommandError> {
    if !args.once {
        return Err(CommandError::NeedOnce);
    }
    let (cfg, snap) = load(&args.inputs)?;
    let mut backend = crate::backends::for_mode(&cfg)?;
    let scope = if args.full {
        Scope::RepairAll
    } else {
        Scope::AllServices
    };
    let report = backend.sync(&snap, scope)?;
    for c in &report.conflicts {
        tracing::warn!("{c}");
    }
    let mut summary = report.summary();
    // Without the last run's state, only flows through front ends that still exist are
    // checked (the agent also clears those of deleted services).
    let udp = UdpFrontends::of(&snap);
    match Ctnetlink::open()
        .and_then(|mut ct| conntrack::clean(&mut ct, &udp, &UdpFrontends::default()))
    {
        Ok(0) => {}
        Ok(n) => summary.push_str(&format!("; {n} stale UDP conntrack entries deleted")),
        Err(e) => tracing::warn!("UDP conntrack cleanup failed: {e}"),
    }
    match peak_rss_mib() {
        Some(mib) => println!("{summary}; peak RSS {mib:.1} MiB"),
        None => println!("{summary}"),
    }
    Ok(())
}

/// This process's peak resident set size, from /proc/self/status (VmHWM).
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// `cleanup --kube-proxy`: kube-proxy's nftables tables, its iptables chains on each back
/// end that has tables, and its IPVS services, kube-ipvs0 and ipsets.
fn cleanup_kube_proxy() -> Result<(), CommandError> {
    let mut r = leftovers::kube_proxy_nftables();
    let ipvs = leftovers::ipvs();
    let ipt = leftovers::kube_iptables();
    r.done.extend(ipvs.done.into_iter().chain(ipt.done));
    r.failed.extend(ipvs.failed.into_iter().chain(ipt.failed));
    report_removed(r)
}

fn report_removed(r: leftovers::Removed) -> Result<(), CommandError> {
    for line in &r.done {
        println!("cleanup: {line}");
    }
    if r.failed.is_empty() {
        Ok(())
    } else {
        Err(CommandError::Cleanup(r.failed.join("; ")))
    }
}

/// The binary run with kube-proxy's command line.
pub fn kube_proxy(inv: Invocation) -> Result<(), CommandError> {
    for note in &inv.notes {
        tracing::warn!("{note}");
    }
    let cfg = inv.config;
    match inv.action {
        Action::Help => {
            print!("{}", kube_proxy_cli::usage());
            Ok(())
        }
        Action::Version { raw: false } => {
            println!(
                "Switchyard {} (kube-proxy {KUBE_PROXY_VERSION} compatible)",
                env!("CARGO_PKG_VERSION")
            );
            Ok(())
        }
        Action::Version { raw: true } => {
            println!(
                "{}",
                serde_json::json!({
                    "switchyard": env!("CARGO_PKG_VERSION"),
                    "kubeProxyCompatibility": KUBE_PROXY_VERSION,
                    "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
                })
            );
            Ok(())
        }
        Action::WriteConfig(path) => {
            std::fs::write(&path, config::v1alpha1::to_yaml(&cfg)).map_err(|source| {
                CommandError::WriteConfig {
                    path: path.clone(),
                    source,
                }
            })?;
            tracing::info!("wrote the configuration to {}", path.display());
            Ok(())
        }
        // As kube-proxy: every mode's rules, ours and its own, then exit.
        Action::Cleanup => report_removed(leftovers::everything()),
        Action::InitOnly => {
            let applied = node_setup::run(&cfg);
            if applied.failed.is_empty() {
                Ok(())
            } else {
                Err(CommandError::Init(applied.failed.join("; ")))
            }
        }
        Action::Run => {
            let source = match inv.manifests {
                Some(path) => agent::Source::Files(path),
                None => agent::Source::Kube(agent::kube_source::Connection {
                    kubeconfig: cfg.kubeconfig.clone(),
                    master: inv.master,
                    qps: cfg.client.qps,
                    burst: cfg.client.burst,
                    streaming_lists: cfg.gate("WatchListClient"),
                }),
            };
            start_agent(cfg, source)
        }
    }
}

/// The kube-proxy release whose command line, configuration and behaviour Switchyard follows.
pub const KUBE_PROXY_VERSION: &str = "v1.37.2";

/// Settings kube-proxy honours that have nothing to act on here, each said once at start.
fn not_acted_on(cfg: &ProxyConfig) -> Vec<&'static str> {
    let mut out = Vec::new();
    if cfg.enable_profiling {
        out.push("enableProfiling: Switchyard has no Go profiler, so /debug/pprof is not served (use perf)");
    }
    if !cfg.logging.vmodule.is_empty() {
        out.push(
            "logging.vmodule: per-file verbosity has no effect here; -v and RUST_LOG set the level",
        );
    }
    if cfg.logging.text_split_stream || cfg.logging.json_split_stream {
        out.push("logging.options splitStream: every log line goes to stderr here");
    }
    out
}

fn start_agent(cfg: ProxyConfig, source: agent::Source) -> Result<(), CommandError> {
    for note in not_acted_on(&cfg) {
        tracing::warn!("{note}");
    }
    node_setup::run(&cfg);
    let node = snapshot::node_name(&cfg);
    agent::run(cfg, node, source)?;
    Ok(())
}

fn trace(args: &TraceArgs) -> Result<(), CommandError> {
    use dataplane::trace::{self as tr, Origin, Packet, Verdict};
    let bad = |field: &'static str, value: &str, message: &'static str| CommandError::Trace {
        field,
        value: value.to_string(),
        message,
    };
    let (cfg, snap) = match &args.source.manifests {
        Some(path) => load(&Inputs {
            config: args.source.config.clone(),
            manifests: path.clone(),
            flags: args.source.flags.clone(),
        })?,
        None => trace_live(&args.source)?,
    };
    let source: std::net::IpAddr = args
        .from
        .parse()
        .map_err(|_| bad("--from", &args.from, "not an IP address"))?;
    let (addr, proto) = args.to.rsplit_once('/').unwrap_or((&args.to, "TCP"));
    let destination: std::net::SocketAddr = addr
        .parse()
        .map_err(|_| bad("--to", &args.to, "not IP:PORT/PROTO"))?;
    let protocol = match proto.to_ascii_uppercase().as_str() {
        "TCP" => dataplane::model::Protocol::Tcp,
        "UDP" => dataplane::model::Protocol::Udp,
        "SCTP" => dataplane::model::Protocol::Sctp,
        _ => return Err(bad("--to", &args.to, "protocol is not TCP, UDP or SCTP")),
    };
    let origin = match args.from_kind.as_deref() {
        None => Origin::infer(&snap.node, source),
        Some("pod") => Origin::Pod,
        Some("node") => Origin::Node,
        Some("localhost") => Origin::Localhost,
        Some("external") => Origin::External,
        Some(other) => {
            return Err(bad(
                "--from-kind",
                other,
                "not one of pod, node, localhost, external",
            ))
        }
    };
    let mode = match cfg.mode {
        ProxyMode::Iptables => tr::Mode::Iptables,
        ProxyMode::Nftables => tr::Mode::Nftables,
        ProxyMode::Ipvs => tr::Mode::Ipvs,
    };
    let t = tr::trace(
        &snap,
        mode,
        &Packet {
            source,
            destination,
            protocol,
            origin,
        },
    );
    if args.json {
        let (verdict, endpoints, masquerade, hairpin) = match &t.verdict {
            Verdict::Dnat {
                endpoints,
                masquerade,
                hairpin,
            } => ("DNAT", endpoints.clone(), Some(*masquerade), *hairpin),
            Verdict::Reject => ("REJECT", Vec::new(), None, None),
            Verdict::Drop => ("DROP", Vec::new(), None, None),
            Verdict::Accept => ("ACCEPT", Vec::new(), None, None),
        };
        // Per endpoint too: a hairpin connection is masqueraded when the others are not.
        let eps: Vec<serde_json::Value> = endpoints
            .iter()
            .map(|(e, p)| {
                serde_json::json!({
                    "endpoint": e.to_string(),
                    "probability": p,
                    "masquerade": masquerade == Some(true) || hairpin == Some(*e),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "verdict": verdict, "endpoints": eps, "masquerade": masquerade, "steps": t.steps })
        );
    } else {
        print!("{}", tr::render(&t));
    }
    Ok(())
}

/// The configuration and a snapshot of a live cluster, listed once.
fn trace_live(args: &RunArgs) -> Result<(ProxyConfig, Snapshot), CommandError> {
    let cfg = load_config(args.config.as_deref(), &args.flags)?;
    let conn = connection(args, &cfg);
    let node = snapshot::node_name(&cfg);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(AgentError::Runtime)?;
    let objs = rt.block_on(async {
        let client = agent::kube_source::client(&conn)
            .await
            .map_err(AgentError::from)?;
        agent::kube_source::list_once(client, &node)
            .await
            .map_err(|e| CommandError::Live(e.to_string()))
    })?;
    if objs.nodes.is_empty() {
        // Off the node, its addresses and endpoints' locality would come out wrong.
        return Err(CommandError::Live(format!(
            "no Node named {node:?} in the cluster; name the node to trace on with --hostname-override"
        )));
    }
    let (snap, skipped) = snapshot::build(&cfg, &objs, &Interfaces);
    report_skipped(&skipped);
    Ok((cfg, snap))
}

fn status(args: &StatusArgs) -> Result<(), CommandError> {
    let (code, metrics) =
        crate::status::get(&args.metrics_address, "/metrics").map_err(|source| {
            CommandError::Status {
                addr: args.metrics_address.clone(),
                source,
            }
        })?;
    if code != 200 {
        return Err(CommandError::Status {
            addr: args.metrics_address.clone(),
            source: std::io::Error::other(format!("HTTP {code}")),
        });
    }
    let health = crate::status::get(&args.healthz_address, "/healthz").ok();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    print!(
        "{}",
        crate::status::table(
            &metrics,
            health.as_ref().map(|(c, b)| (*c, b.as_str())),
            now
        )
    );
    Ok(())
}

fn cleanup(args: &CleanupArgs) -> Result<(), CommandError> {
    if args.kube_proxy {
        return cleanup_kube_proxy();
    }
    let mode = match &args.proxy_mode {
        None => None,
        Some(m) => match ProxyMode::parse(m) {
            Some(mode) => Some(mode),
            None => {
                return Err(ConfigError::Field {
                    origin: "command line".into(),
                    field: "--proxy-mode".into(),
                    message: format!("{m:?} is not one of nftables, iptables, ipvs"),
                }
                .into())
            }
        },
    };
    let variant = config::parse_iptables_backend("command line", &args.iptables_backend)?;
    if mode.is_none_or(|m| m == ProxyMode::Nftables) {
        let mut backend = NftBackend::new(NftKernel::default());
        let removed = backend.cleanup()?;
        println!("cleanup: removed {removed} switchyard nftables tables");
    }
    if mode.is_none_or(|m| m == ProxyMode::Ipvs) {
        match RealIpvs::open(Box::new(crate::ipvs_link::Rtnetlink)) {
            // A kernel without IPVS holds nothing of IPVS mode's.
            Err(IpvsError::Netlink(GenlError::NoIpvs)) if mode.is_none() => {}
            Err(e) => return Err(BackendError::from(e).into()),
            Ok(kernel) => {
                let ipt = IptablesCommand::for_variant(variant);
                let mut backend = IpvsBackend::new(kernel, ipt, IpvsOptions::default());
                let removed = backend.cleanup()?;
                println!(
                    "cleanup: removed {removed} IPVS services, chains and ipsets, and {DUMMY}"
                );
            }
        }
    }
    if mode.is_none_or(|m| m == ProxyMode::Iptables) {
        let mut backend = IptablesBackend::new(IptablesCommand::for_variant(variant));
        match backend.cleanup() {
            Ok(removed) => println!("cleanup: removed {removed} iptables chains"),
            // Without iptables installed there is nothing of ours in it, unless asked for.
            Err(e) if mode.is_none() && e.program().is_some() => println!(
                "cleanup: {} is not installed; no iptables rules to remove",
                e.program().unwrap_or("iptables")
            ),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
