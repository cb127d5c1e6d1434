//! kube-proxy's own command line (v1.37, cmd/kube-proxy/app/options.go plus component-base's
//! logging and version flags), parsed as pflag parses it, for the binary started as
//! `kube-proxy` or with a flag first: an image swap in kube-proxy's DaemonSet then runs the
//! agent with the arguments that DaemonSet already passes.

use crate::config::{
    self, append_port_if_needed, duration, parse_cidrs, ConfigError, ProxyConfig, ProxyMode,
};
use crate::feature_gates;
use std::path::PathBuf;

/// How a flag takes its value, as pflag does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `--flag` is true; a value only as `--flag=false`.
    Bool,
    /// `--flag=v` or `--flag v`.
    Value,
    /// `--version`, `--version=raw`: a bool that also takes a word.
    OptionalValue,
}

/// What Switchyard does with a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Applied to the configuration or acted on.
    Honoured,
    /// Parsed and logged once: kube-proxy has it, Switchyard has nothing it could change.
    Ignored(&'static str),
}

pub struct Flag {
    pub name: &'static str,
    pub kind: Kind,
    pub usage: Use,
    /// Applied even when `--config` is given (kube-proxy applies these over its file).
    pub over_file: bool,
}

const fn f(name: &'static str, kind: Kind) -> Flag {
    Flag {
        name,
        kind,
        usage: Use::Honoured,
        over_file: false,
    }
}

const fn over(name: &'static str, kind: Kind) -> Flag {
    Flag {
        name,
        kind,
        usage: Use::Honoured,
        over_file: true,
    }
}

const fn ignored(name: &'static str, kind: Kind, why: &'static str) -> Flag {
    Flag {
        name,
        kind,
        usage: Use::Ignored(why),
        over_file: false,
    }
}

use Kind::{Bool, OptionalValue, Value};

/// Every flag of kube-proxy v1.37 on Linux, and Switchyard's own two.
pub const FLAGS: &[Flag] = &[
    over("config", Value),
    over("write-config-to", Value),
    over("cleanup", Bool),
    over("init-only", Bool),
    f("feature-gates", Value),
    f("kubeconfig", Value),
    over("master", Value),
    f("kube-api-content-type", Value),
    f("kube-api-burst", Value),
    f("kube-api-qps", Value),
    over("hostname-override", Value),
    f("bind-address", Value),
    f("healthz-bind-address", Value),
    f("metrics-bind-address", Value),
    f("bind-address-hard-fail", Bool),
    f("profiling", Bool),
    f("show-hidden-metrics-for-version", Value),
    f("proxy-mode", Value),
    f("iptables-masquerade-bit", Value),
    f("masquerade-all", Bool),
    f("iptables-localhost-nodeports", Bool),
    f("iptables-sync-period", Value),
    f("iptables-min-sync-period", Value),
    f("ipvs-sync-period", Value),
    f("ipvs-min-sync-period", Value),
    f("ipvs-scheduler", Value),
    f("ipvs-exclude-cidrs", Value),
    f("ipvs-strict-arp", Bool),
    f("ipvs-tcp-timeout", Value),
    f("ipvs-tcpfin-timeout", Value),
    f("ipvs-udp-timeout", Value),
    f("detect-local-mode", Value),
    f("pod-bridge-interface", Value),
    f("pod-interface-name-prefix", Value),
    f("cluster-cidr", Value),
    f("nodeport-addresses", Value),
    f("oom-score-adj", Value),
    f("conntrack-max-per-core", Value),
    f("conntrack-min", Value),
    f("conntrack-tcp-timeout-established", Value),
    f("conntrack-tcp-timeout-close-wait", Value),
    f("conntrack-tcp-be-liberal", Bool),
    f("conntrack-udp-timeout", Value),
    f("conntrack-udp-timeout-stream", Value),
    ignored(
        "config-sync-period",
        Value,
        "Switchyard watches and never re-lists on a timer",
    ),
    f("healthz-port", Value),
    f("metrics-port", Value),
    // component-base logging: applied over the file, as kube-proxy copies them.
    over("v", Value),
    over("vmodule", Value),
    over("logging-format", Value),
    over("log-flush-frequency", Value),
    over("log-text-split-stream", Bool),
    over("log-text-info-buffer-size", Value),
    over("log-json-split-stream", Bool),
    over("log-json-info-buffer-size", Value),
    over("version", OptionalValue),
    over("help", Bool),
    // Switchyard's own.
    over("iptables-backend", Value),
    over("manifests", Value),
];

/// Flags that exist only in Switchyard (not an error, but not kube-proxy's either).
pub const OWN: &[&str] = &["iptables-backend", "manifests"];

fn lookup(name: &str) -> Option<&'static Flag> {
    FLAGS.iter().find(|f| f.name == name)
}

/// A command-line problem, worded as kube-proxy words its own.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("unknown flag: --{0}")]
    Unknown(String),
    #[error("unknown shorthand flag: {0:?} in {1}")]
    UnknownShorthand(char, String),
    #[error("flag needs an argument: --{0}")]
    NeedsArgument(String),
    #[error("invalid argument {value:?} for \"--{flag}\" flag: {message}")]
    Invalid {
        flag: String,
        value: String,
        message: String,
    },
    #[error("\"kube-proxy\" does not take any arguments, got {0:?}")]
    Positional(Vec<String>),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

fn invalid(flag: &str, value: &str, message: impl Into<String>) -> CliError {
    CliError::Invalid {
        flag: flag.to_string(),
        value: value.to_string(),
        message: message.into(),
    }
}

/// The flags as given, in order: (name, value); a bool given bare has "true".
pub type Given = Vec<(&'static str, String)>;

/// pflag's parse: `--name=v`, `--name v`, bare bools, `-v=N`/`-v N`/`-vN`, `-h`,
/// `_` read as `-` in names (component-base's normalisation), `--` ends the flags.
pub fn parse_args(args: &[String]) -> Result<Given, CliError> {
    let mut given: Given = Vec::new();
    let mut positional = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            positional.extend(args[i..].iter().cloned());
            break;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (raw_name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let name = raw_name.replace('_', "-");
            let flag = lookup(&name).ok_or_else(|| CliError::Unknown(name.clone()))?;
            let value = match (flag.kind, inline) {
                (_, Some(v)) => v,
                (Kind::Bool, None) => "true".into(),
                (Kind::OptionalValue, None) => "true".into(),
                (Kind::Value, None) => {
                    let v = args
                        .get(i)
                        .ok_or_else(|| CliError::NeedsArgument(name.clone()))?;
                    i += 1;
                    v.clone()
                }
            };
            given.push((flag.name, value));
        } else if let Some(short) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
            let mut chars = short.chars();
            match chars.next() {
                Some('h') if short.len() == 1 => given.push(("help", "true".into())),
                Some('v') => {
                    let rest = chars.as_str();
                    let value = if let Some(v) = rest.strip_prefix('=') {
                        v.to_string()
                    } else if !rest.is_empty() {
                        rest.to_string()
                    } else {
                        let v = args
                            .get(i)
                            .ok_or_else(|| CliError::NeedsArgument("v".into()))?;
                        i += 1;
                        v.clone()
                    };
                    given.push(("v", value));
                }
                Some(c) => return Err(CliError::UnknownShorthand(c, arg.clone())),
                None => positional.push(arg.clone()),
            }
        } else {
            positional.push(arg.clone());
        }
    }
    positional.retain(|p| !p.is_empty());
    if !positional.is_empty() {
        return Err(CliError::Positional(positional));
    }
    Ok(given)
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Run,
    /// `--cleanup`: remove every proxy's rules (ours and kube-proxy's, every mode), exit.
    Cleanup,
    /// `--init-only`: the privileged set-up (conntrack sysctls, OOM score), then exit.
    InitOnly,
    /// `--write-config-to`: the effective configuration as a file, then exit.
    WriteConfig(PathBuf),
    /// `--version` (`raw` for the JSON form).
    Version {
        raw: bool,
    },
    Help,
}

/// The command line, understood.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub action: Action,
    pub config: ProxyConfig,
    pub master: Option<String>,
    pub manifests: Option<PathBuf>,
    /// Lines to log once logging is set up: flags ignored, and why.
    pub notes: Vec<String>,
}

/// Parse kube-proxy's command line and build the configuration as kube-proxy does: from
/// the file when `--config` is given (then only the flags kube-proxy applies over its file
/// count; the others are logged as ignored), else from the defaults and the flags.
pub fn invocation(args: &[String]) -> Result<Invocation, CliError> {
    let given = parse_args(args)?;
    let last = |name: &str| {
        given
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
    };
    let truthy = |name: &str| -> Result<bool, CliError> {
        match last(name) {
            None => Ok(false),
            Some(v) => {
                feature_gates::parse_go_bool(&v).ok_or_else(|| invalid(name, &v, "not a boolean"))
            }
        }
    };
    // As kube-proxy (verflag before anything else; cobra's help): these answer whatever
    // else the command line holds.
    let early = if truthy("help")? {
        Some(Action::Help)
    } else {
        last("version")
            .filter(|v| v != "false")
            .map(|v| Action::Version { raw: v == "raw" })
    };
    if let Some(action) = early {
        return Ok(Invocation {
            action,
            config: ProxyConfig::default(),
            master: None,
            manifests: None,
            notes: Vec::new(),
        });
    }
    let mut notes = Vec::new();
    let config_file = last("config").filter(|c| !c.is_empty());
    let mut cfg = match &config_file {
        Some(path) => {
            let (cfg, warnings) = config::load_file(std::path::Path::new(path))?;
            notes.extend(warnings);
            cfg
        }
        None => ProxyConfig::default(),
    };
    let mut seen: Vec<&str> = Vec::new();
    for (name, value) in &given {
        let Some(flag) = lookup(name) else { continue };
        if config_file.is_some() && !flag.over_file {
            if !seen.contains(name) {
                notes.push(format!(
                    "flag --{name} is ignored because --config is given, as kube-proxy ignores it"
                ));
            }
            seen.push(name);
            continue;
        }
        if let Use::Ignored(why) = flag.usage {
            if !seen.contains(name) {
                notes.push(format!("flag --{name} has no effect here: {why}"));
            }
            seen.push(name);
            continue;
        }
        apply(&mut cfg, name, value, &given, &mut notes)?;
    }
    let write_config = last("write-config-to").filter(|p| !p.is_empty());
    // kube-proxy's deprecated port flags decide the servers' ports (0 turns one off), but
    // not beside --config, nor (as kube-proxy's Options.Complete has it) when only writing
    // the configuration out.
    if config_file.is_none() && write_config.is_none() {
        let port = |name: &str, default: u16| -> Result<u16, CliError> {
            match last(name) {
                None => Ok(default),
                Some(v) => v
                    .parse::<u16>()
                    .map_err(|_| invalid(name, &v, "not a port number")),
            }
        };
        let healthz_port = port("healthz-port", 10256)?;
        let metrics_port = port("metrics-port", 10249)?;
        cfg.healthz_bind_address = if healthz_port == 0 {
            String::new()
        } else {
            append_port_if_needed(&cfg.healthz_bind_address, healthz_port)
        };
        cfg.metrics_bind_address = if metrics_port == 0 {
            String::new()
        } else {
            append_port_if_needed(&cfg.metrics_bind_address, metrics_port)
        };
    }
    if let Some(h) = last("hostname-override") {
        if !h.is_empty() {
            let h = h.trim();
            if h.is_empty() {
                return Err(invalid(
                    "hostname-override",
                    "",
                    "empty hostname-override is invalid",
                ));
            }
            cfg.hostname_override = Some(h.to_lowercase());
        }
    }
    if let Some(b) = last("iptables-backend") {
        cfg.iptables_backend = config::parse_iptables_backend("command line", &b)?;
    }
    // A file's values are named by the file, as when the file alone is read.
    config::validate(&cfg, config_file.as_deref().unwrap_or("command line"))?;
    notes.extend(feature_gates::not_honoured(&cfg.feature_gates));

    let action = if let Some(path) = write_config {
        Action::WriteConfig(PathBuf::from(path))
    } else if truthy("cleanup")? {
        Action::Cleanup
    } else if truthy("init-only")? {
        Action::InitOnly
    } else {
        Action::Run
    };
    Ok(Invocation {
        action,
        config: cfg,
        master: last("master").filter(|m| !m.is_empty()),
        manifests: last("manifests")
            .filter(|m| !m.is_empty())
            .map(PathBuf::from),
        notes,
    })
}

fn parse_bool(name: &str, v: &str) -> Result<bool, CliError> {
    feature_gates::parse_go_bool(v).ok_or_else(|| invalid(name, v, "not a boolean"))
}

fn parse_duration(name: &str, v: &str) -> Result<std::time::Duration, CliError> {
    duration::parse(v).ok_or_else(|| invalid(name, v, "not a duration like 30s or 1m0s"))
}

fn parse_int<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, CliError> {
    v.trim()
        .parse::<T>()
        .map_err(|_| invalid(name, v, "not an integer in range"))
}

/// `--flag` applied to the configuration, as kube-proxy's flag binds it.
fn apply(
    cfg: &mut ProxyConfig,
    name: &str,
    v: &str,
    given: &Given,
    notes: &mut Vec<String>,
) -> Result<(), CliError> {
    let mode_is_ipvs = || {
        // kube-proxy applies the iptables-/ipvs- periods by the final mode.
        let mode = given
            .iter()
            .rev()
            .find(|(n, _)| *n == "proxy-mode")
            .map(|(_, m)| m.as_str());
        match mode {
            Some(m) => m == "ipvs",
            None => cfg.mode == ProxyMode::Ipvs,
        }
    };
    match name {
        "feature-gates" => {
            let gates = feature_gates::parse_flag(v).map_err(|m| invalid(name, v, m))?;
            cfg.feature_gates.extend(gates);
        }
        "kubeconfig" => cfg.kubeconfig = Some(PathBuf::from(v)).filter(|_| !v.is_empty()),
        "kube-api-content-type" => cfg.client.content_type = v.to_string(),
        "kube-api-burst" => cfg.client.burst = parse_int(name, v)?,
        "kube-api-qps" => {
            let q: f32 = parse_int(name, v)?;
            if !q.is_finite() || q < 0.0 {
                return Err(invalid(name, v, "not a non-negative number"));
            }
            cfg.client.qps = q;
        }
        "bind-address" => {
            cfg.bind_address = v
                .parse()
                .map_err(|_| invalid(name, v, "not an IP address"))?
        }
        "healthz-bind-address" | "metrics-bind-address" => {
            let ok = v.is_empty()
                || v.parse::<std::net::IpAddr>().is_ok()
                || v.parse::<std::net::SocketAddr>().is_ok();
            if !ok {
                return Err(invalid(name, v, "not in a valid format (ip or ip:port)"));
            }
            if name == "healthz-bind-address" {
                cfg.healthz_bind_address = v.to_string();
            } else {
                cfg.metrics_bind_address = v.to_string();
            }
        }
        "bind-address-hard-fail" => cfg.bind_address_hard_fail = parse_bool(name, v)?,
        "profiling" => cfg.enable_profiling = parse_bool(name, v)?,
        "show-hidden-metrics-for-version" => cfg.show_hidden_metrics_for_version = v.to_string(),
        "proxy-mode" => {
            cfg.mode = ProxyMode::parse(v)
                .ok_or_else(|| invalid(name, v, "not one of nftables, iptables, ipvs"))?;
            cfg.masquerade_bit = match cfg.mode {
                ProxyMode::Nftables => cfg.nftables_masquerade_bit,
                ProxyMode::Iptables | ProxyMode::Ipvs => cfg.iptables_masquerade_bit,
            };
        }
        "iptables-masquerade-bit" => {
            let b: u8 = parse_int(name, v)?;
            if b > 31 {
                return Err(invalid(name, v, "must be within the range [0, 31]"));
            }
            cfg.iptables_masquerade_bit = b;
            if cfg.mode != ProxyMode::Nftables {
                cfg.masquerade_bit = b;
            }
        }
        "masquerade-all" => cfg.masquerade_all = parse_bool(name, v)?,
        "iptables-localhost-nodeports" => cfg.localhost_node_ports = parse_bool(name, v)?,
        "iptables-sync-period" | "ipvs-sync-period" => {
            let d = parse_duration(name, v)?;
            if (name == "ipvs-sync-period") == mode_is_ipvs() {
                cfg.sync_period = d;
            }
        }
        "iptables-min-sync-period" | "ipvs-min-sync-period" => {
            let d = parse_duration(name, v)?;
            if (name == "ipvs-min-sync-period") == mode_is_ipvs() {
                cfg.min_sync_period = d;
            }
        }
        "ipvs-scheduler" => {
            if !v.is_empty() && !dataplane::ipvs::SCHEDULERS.contains(&v) {
                return Err(invalid(
                    name,
                    v,
                    format!("not one of {}", dataplane::ipvs::SCHEDULERS.join(", ")),
                ));
            }
            cfg.ipvs.scheduler = v.to_string();
        }
        "ipvs-exclude-cidrs" => cfg.ipvs.exclude_cidrs = parse_cidrs("command line", name, v)?,
        "ipvs-strict-arp" => cfg.ipvs.strict_arp = parse_bool(name, v)?,
        "ipvs-tcp-timeout" => cfg.ipvs.tcp_timeout = parse_duration(name, v)?,
        "ipvs-tcpfin-timeout" => cfg.ipvs.tcp_fin_timeout = parse_duration(name, v)?,
        "ipvs-udp-timeout" => cfg.ipvs.udp_timeout = parse_duration(name, v)?,
        "detect-local-mode" => {
            cfg.detect_local_mode = config::parse_detect_mode(v)
                .ok_or_else(|| invalid(name, v, "not a detect-local mode"))?
        }
        "pod-bridge-interface" => cfg.bridge_interface = v.to_string(),
        "pod-interface-name-prefix" => cfg.interface_name_prefix = v.to_string(),
        "cluster-cidr" => cfg.cluster_cidrs = parse_cidrs("command line", "--cluster-cidr", v)?,
        "nodeport-addresses" => {
            cfg.node_port_addresses = v
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        }
        "oom-score-adj" => cfg.oom_score_adj = Some(parse_int(name, v)?),
        "conntrack-max-per-core" => cfg.conntrack.max_per_core = Some(parse_int(name, v)?),
        "conntrack-min" => cfg.conntrack.min = Some(parse_int(name, v)?),
        "conntrack-tcp-timeout-established" => {
            cfg.conntrack.tcp_established_timeout = Some(parse_duration(name, v)?)
        }
        "conntrack-tcp-timeout-close-wait" => {
            cfg.conntrack.tcp_close_wait_timeout = Some(parse_duration(name, v)?)
        }
        "conntrack-tcp-be-liberal" => cfg.conntrack.tcp_be_liberal = parse_bool(name, v)?,
        "conntrack-udp-timeout" => cfg.conntrack.udp_timeout = parse_duration(name, v)?,
        "conntrack-udp-timeout-stream" => {
            cfg.conntrack.udp_stream_timeout = parse_duration(name, v)?
        }
        "v" => cfg.logging.verbosity = parse_int(name, v)?,
        "vmodule" => {
            for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let ok = item
                    .split_once('=')
                    .is_some_and(|(p, n)| !p.is_empty() && n.parse::<u32>().is_ok());
                if !ok {
                    return Err(invalid(name, v, "expected pattern=N[,pattern=N]"));
                }
                cfg.logging.vmodule.push(item.to_string());
            }
        }
        "logging-format" => cfg.logging.format = v.to_string(),
        "log-flush-frequency" => cfg.logging.flush_frequency = parse_duration(name, v)?,
        "log-text-split-stream" => cfg.logging.text_split_stream = parse_bool(name, v)?,
        "log-json-split-stream" => cfg.logging.json_split_stream = parse_bool(name, v)?,
        "log-text-info-buffer-size" => cfg.logging.text_info_buffer_size = v.to_string(),
        "log-json-info-buffer-size" => cfg.logging.json_info_buffer_size = v.to_string(),
        // Acted on by `invocation` or validated there.
        "config" | "write-config-to" | "cleanup" | "init-only" | "master" | "hostname-override"
        | "healthz-port" | "metrics-port" | "version" | "help" | "iptables-backend"
        | "manifests" => {
            if let "cleanup" | "init-only" | "help" = name {
                parse_bool(name, v)?;
            }
        }
        other => notes.push(format!("flag --{other} is not handled")),
    }
    Ok(())
}

/// `--help`: kube-proxy's flags, with what Switchyard does with each.
pub fn usage() -> String {
    let mut out = String::from(
        "Switchyard, started as kube-proxy: takes kube-proxy v1.37's command line.\n\
         Usage: kube-proxy [flags]   (or: switchyard --flag ...; `switchyard --help` for its own commands)\n\nFlags:\n",
    );
    for flag in FLAGS {
        let shape = match flag.kind {
            Kind::Bool => "",
            Kind::Value => " value",
            Kind::OptionalValue => "[=raw]",
        };
        let note = match flag.usage {
            Use::Honoured if OWN.contains(&flag.name) => " (Switchyard's own)".to_string(),
            Use::Honoured => String::new(),
            Use::Ignored(why) => format!(" (ignored: {why})"),
        };
        let dash = if flag.name.len() == 1 { "-" } else { "--" };
        out.push_str(&format!("  {dash}{}{shape}{note}\n", flag.name));
    }
    out
}

/// Whether argv asks for the kube-proxy command line: started as `kube-proxy`, or with a
/// flag first (but not Switchyard's own `--help`/`--version`/`--log-level`).
pub fn wanted(args: &[String]) -> bool {
    let name = args
        .first()
        .map(|a| a.rsplit('/').next().unwrap_or(a))
        .unwrap_or("");
    if name == "kube-proxy" {
        return true;
    }
    match args.get(1) {
        Some(first) if first.starts_with('-') => {
            !matches!(
                first.as_str(),
                "-h" | "--help" | "-V" | "--version" | "--log-level"
            ) && !first.starts_with("--log-level=")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn pflag_shapes_parse() {
        let g = parse_args(&args(&[
            "--v=2",
            "-v",
            "4",
            "-v5",
            "--hostname_override=NODE-A",
            "--masquerade-all",
            "--cleanup=false",
            "--proxy-mode",
            "iptables",
            "--version=raw",
        ]))
        .unwrap();
        let names: Vec<&str> = g.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "v",
                "v",
                "v",
                "hostname-override",
                "masquerade-all",
                "cleanup",
                "proxy-mode",
                "version"
            ]
        );
        assert_eq!(g[2].1, "5");
        assert_eq!(g[4].1, "true");
        assert_eq!(g[6].1, "iptables");
    }

    #[test]
    fn flags_kube_proxy_lacks_are_errors() {
        assert!(matches!(
            parse_args(&args(&["--no-such-flag"])),
            Err(CliError::Unknown(n)) if n == "no-such-flag"
        ));
        assert!(matches!(
            parse_args(&args(&["-config=x"])),
            Err(CliError::UnknownShorthand('c', _))
        ));
        assert!(matches!(
            parse_args(&args(&["--proxy-mode"])),
            Err(CliError::NeedsArgument(_))
        ));
        assert!(matches!(
            parse_args(&args(&["run"])),
            Err(CliError::Positional(_))
        ));
        // A bare bool does not take the next word (pflag): it is then an argument.
        assert!(matches!(
            parse_args(&args(&["--cleanup", "false"])),
            Err(CliError::Positional(_))
        ));
    }

    #[test]
    fn without_config_flags_build_the_configuration() {
        let inv = invocation(&args(&[
            "--proxy-mode=iptables",
            "--cluster-cidr=10.0.0.0/8",
            "--iptables-sync-period=45s",
            "--ipvs-sync-period=5s",
            "--conntrack-max-per-core=0",
            "--oom-score-adj=-500",
            "--healthz-bind-address=127.0.0.1",
            "--healthz-port=12345",
            "--metrics-port=0",
            "--feature-gates=AllowServiceExternalIPs=false",
            "--config-sync-period=1m",
            "--v=3",
        ]))
        .unwrap();
        let c = &inv.config;
        assert_eq!(inv.action, Action::Run);
        assert_eq!(c.mode, ProxyMode::Iptables);
        assert_eq!(c.sync_period, std::time::Duration::from_secs(45));
        assert_eq!(c.conntrack.max_per_core, Some(0));
        assert_eq!(c.oom_score_adj, Some(-500));
        assert_eq!(c.healthz_bind_address, "127.0.0.1:12345");
        assert_eq!(c.metrics_bind_address, "");
        assert!(!c.gate("AllowServiceExternalIPs"));
        assert_eq!(c.logging.verbosity, 3);
        assert!(inv.notes.iter().any(|n| n.contains("--config-sync-period")));
    }

    #[test]
    fn with_config_only_kube_proxys_over_file_flags_apply() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.conf");
        std::fs::write(&path, "mode: iptables\nclusterCIDR: 10.0.0.0/8\n").unwrap();
        let inv = invocation(&args(&[
            &format!("--config={}", path.display()),
            "--hostname-override=Node-1",
            "--proxy-mode=ipvs",
            "--v=2",
            "--logging-format=json",
        ]))
        .unwrap();
        assert_eq!(inv.config.mode, ProxyMode::Iptables, "the file wins");
        assert_eq!(inv.config.hostname_override.as_deref(), Some("node-1"));
        assert_eq!(inv.config.logging.verbosity, 2);
        assert_eq!(inv.config.logging.format, "json");
        assert!(inv
            .notes
            .iter()
            .any(|n| n.contains("--proxy-mode is ignored")));
    }

    #[test]
    fn actions() {
        let a = |s: &[&str]| invocation(&args(s)).unwrap().action;
        assert_eq!(a(&["--cleanup"]), Action::Cleanup);
        assert_eq!(a(&["--init-only"]), Action::InitOnly);
        assert_eq!(a(&["--version"]), Action::Version { raw: false });
        assert_eq!(a(&["--version=raw"]), Action::Version { raw: true });
        assert_eq!(a(&["-h"]), Action::Help);
        // Answered before a configuration is read, as kube-proxy's verflag does.
        assert_eq!(
            a(&["--config=/nonexistent/config.conf", "--version"]),
            Action::Version { raw: false }
        );
        assert_eq!(
            a(&["--write-config-to=/tmp/x.yaml"]),
            Action::WriteConfig(PathBuf::from("/tmp/x.yaml"))
        );
    }

    #[test]
    fn argv_decides_the_command_line() {
        assert!(wanted(&args(&["/usr/local/bin/kube-proxy"])));
        assert!(wanted(&args(&["kube-proxy", "run"])));
        assert!(wanted(&args(&["switchyard", "--config=/x"])));
        assert!(wanted(&args(&["switchyard", "--v=2"])));
        assert!(!wanted(&args(&["switchyard", "run", "--config=/x"])));
        assert!(!wanted(&args(&["switchyard", "--help"])));
        assert!(!wanted(&args(&[
            "switchyard",
            "--log-level",
            "debug",
            "run"
        ])));
        assert!(!wanted(&args(&["switchyard"])));
    }
}
