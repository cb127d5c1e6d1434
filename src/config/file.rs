//! The `KubeProxyConfiguration` file (v1alpha1, YAML or JSON): every field kube-proxy v1.37
//! accepts is read into [`ProxyConfig`], with kube-proxy's defaulting; a field of the wrong
//! type or value is an error naming it, an unknown one a warning.

use super::{
    duration, field_err, parse_cidrs, parse_detect_mode, ConfigError, ProxyConfig, ProxyMode,
    Warnings,
};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Read a KubeProxyConfiguration file.
pub fn load_file(path: &Path) -> Result<(ProxyConfig, Warnings), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// One mapping of the document and its dotted path, for errors that name the field.
struct Section<'a> {
    map: &'a Map<String, Value>,
    origin: &'a str,
    prefix: String,
}

impl<'a> Section<'a> {
    fn name(&self, field: &str) -> String {
        if self.prefix.is_empty() {
            field.to_string()
        } else {
            format!("{}.{field}", self.prefix)
        }
    }

    fn err(&self, field: &str, message: impl Into<String>) -> ConfigError {
        field_err(self.origin, &self.name(field), message)
    }

    fn warn_unknown(&self, known: &[&str], warnings: &mut Warnings) {
        for key in self.map.keys() {
            if !known.contains(&key.as_str()) {
                warnings.push(format!(
                    "{}: unknown field {:?} ignored",
                    self.origin,
                    self.name(key)
                ));
            }
        }
    }

    fn get(&self, field: &str) -> Option<&'a Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    fn string(&self, field: &str) -> Result<Option<String>, ConfigError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => {
                Err(self.err(field, format!("expected a string, got {}", kind_of(other))))
            }
        }
    }

    fn boolean(&self, field: &str) -> Result<Option<bool>, ConfigError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.err(
                field,
                format!("expected true or false, got {}", kind_of(other)),
            )),
        }
    }

    fn int(&self, field: &str) -> Result<Option<i64>, ConfigError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Number(n)) if n.as_i64().is_some() => Ok(n.as_i64()),
            Some(other) => Err(self.err(
                field,
                format!("expected an integer, got {}", kind_of(other)),
            )),
        }
    }

    /// An int32 field (kube-proxy's `*int32`), range-checked.
    fn int32(&self, field: &str) -> Result<Option<i32>, ConfigError> {
        match self.int(field)? {
            None => Ok(None),
            Some(v) => i32::try_from(v)
                .map(Some)
                .map_err(|_| self.err(field, format!("{v} does not fit a 32-bit integer"))),
        }
    }

    fn number(&self, field: &str) -> Result<Option<f64>, ConfigError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(other) => {
                Err(self.err(field, format!("expected a number, got {}", kind_of(other))))
            }
        }
    }

    fn duration(&self, field: &str) -> Result<Option<Duration>, ConfigError> {
        match self.string(field)? {
            None => Ok(None),
            Some(v) => duration::parse(&v).map(Some).ok_or_else(|| {
                self.err(
                    field,
                    format!("{v:?} is not a duration like 30s or 1m0s (at most 292 years)"),
                )
            }),
        }
    }

    fn section(&self, field: &str) -> Result<Option<Section<'a>>, ConfigError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Section {
                map,
                origin: self.origin,
                prefix: self.name(field),
            })),
            Some(other) => {
                Err(self.err(field, format!("expected a mapping, got {}", kind_of(other))))
            }
        }
    }

    fn strings(&self, field: &str) -> Result<Option<Vec<String>>, ConfigError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::String(s) => Ok(s.trim().to_string()),
                    other => Err(self.err(
                        &format!("{field}[{i}]"),
                        format!("expected a string, got {}", kind_of(other)),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(other) => Err(self.err(field, format!("expected a list, got {}", kind_of(other)))),
        }
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

const TOP: &[&str] = &[
    "apiVersion",
    "kind",
    "featureGates",
    "clientConnection",
    "logging",
    "hostnameOverride",
    "bindAddress",
    "healthzBindAddress",
    "metricsBindAddress",
    "bindAddressHardFail",
    "enableProfiling",
    "showHiddenMetricsForVersion",
    "mode",
    "iptables",
    "ipvs",
    "nftables",
    "winkernel",
    "detectLocalMode",
    "detectLocal",
    "clusterCIDR",
    "nodePortAddresses",
    "oomScoreAdj",
    "conntrack",
    "configSyncPeriod",
    "portRange",
    "windowsRunAsService",
    // Not in v1alpha1; Switchyard has read them at the top level since its first release.
    "syncPeriod",
    "minSyncPeriod",
];

/// Parse configuration text; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<(ProxyConfig, Warnings), ConfigError> {
    // A UTF-8 byte-order mark is not part of the document (editors on Windows add one).
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let doc: Value = if text.trim().is_empty() {
        Value::Null
    } else {
        serde_saphyr::from_str(text).map_err(|e| ConfigError::Yaml {
            path: PathBuf::from(origin),
            message: e.to_string(),
        })?
    };
    let mut cfg = ProxyConfig::default();
    let mut warnings = Vec::new();
    let map = match &doc {
        Value::Object(m) => m,
        Value::Null => return Ok((cfg, warnings)),
        other => {
            return Err(field_err(
                origin,
                "(document)",
                format!("expected a mapping, got {}", kind_of(other)),
            ))
        }
    };
    let top = Section {
        map,
        origin,
        prefix: String::new(),
    };
    match top.string("kind")?.as_deref() {
        None | Some("KubeProxyConfiguration") => {}
        Some(k) => {
            return Err(top.err(
                "kind",
                format!("expected KubeProxyConfiguration, got {k:?}"),
            ))
        }
    }
    if let Some(v) = top.string("apiVersion")? {
        if v != "kubeproxy.config.k8s.io/v1alpha1" {
            return Err(top.err(
                "apiVersion",
                format!("expected kubeproxy.config.k8s.io/v1alpha1, got {v:?}"),
            ));
        }
    }
    top.warn_unknown(TOP, &mut warnings);

    if let Some(m) = top.string("mode")? {
        cfg.mode = ProxyMode::parse(&m).ok_or_else(|| {
            top.err(
                "mode",
                format!("{m:?} is not one of nftables, iptables, ipvs (or blank: nftables)"),
            )
        })?;
    }
    cfg.hostname_override = top
        .string("hostnameOverride")?
        .map(|s| s.trim().to_lowercase())
        .filter(|s| !s.is_empty());
    read_feature_gates(&top, &mut cfg)?;
    read_client_connection(&top, &mut cfg, &mut warnings)?;
    read_logging(&top, &mut cfg, &mut warnings)?;
    read_addresses(&top, &mut cfg)?;
    if let Some(b) = top.boolean("bindAddressHardFail")? {
        cfg.bind_address_hard_fail = b;
    }
    if let Some(b) = top.boolean("enableProfiling")? {
        cfg.enable_profiling = b;
    }
    if let Some(v) = top.string("showHiddenMetricsForVersion")? {
        cfg.show_hidden_metrics_for_version = v;
    }
    if let Some(c) = top.string("clusterCIDR")? {
        cfg.cluster_cidrs = parse_cidrs(origin, "clusterCIDR", &c)?;
    }
    if let Some(m) = top.string("detectLocalMode")? {
        cfg.detect_local_mode = parse_detect_mode(&m).ok_or_else(|| {
            top.err(
                "detectLocalMode",
                format!("{m:?} is not one of ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix"),
            )
        })?;
    }
    if let Some(d) = top.section("detectLocal")? {
        d.warn_unknown(&["bridgeInterface", "interfaceNamePrefix"], &mut warnings);
        cfg.bridge_interface = d.string("bridgeInterface")?.unwrap_or_default();
        cfg.interface_name_prefix = d.string("interfaceNamePrefix")?.unwrap_or_default();
    }
    if let Some(list) = top.strings("nodePortAddresses")? {
        cfg.node_port_addresses = list;
    }
    if let Some(v) = top.int32("oomScoreAdj")? {
        cfg.oom_score_adj = Some(v);
    }
    read_conntrack(&top, &mut cfg, &mut warnings)?;
    if let Some(d) = top.duration("configSyncPeriod")? {
        if !d.is_zero() {
            cfg.config_sync_period = d;
        }
    }
    if let Some(p) = top.string("portRange")? {
        cfg.port_range = p;
    }
    if let Some(w) = top.section("winkernel")? {
        let mut merged = cfg.winkernel.clone();
        if let Value::Object(m) = &mut merged {
            for (k, v) in w.map {
                m.insert(k.clone(), v.clone());
            }
        }
        cfg.winkernel = merged;
    }
    if let Some(b) = top.boolean("windowsRunAsService")? {
        cfg.windows_run_as_service = b;
    }

    // Periods and masquerading come from the active mode's section, as kube-proxy's
    // conversion to its internal configuration takes them; every section is validated.
    let top_periods = read_periods(&top)?;
    let ipvs_periods = read_ipvs(&top, &mut cfg, &mut warnings)?;
    let mut mode_periods = top_periods;
    for name in ["iptables", "nftables"] {
        let Some(s) = top.section(name)? else {
            continue;
        };
        let mut known = vec![
            "masqueradeAll",
            "masqueradeBit",
            "syncPeriod",
            "minSyncPeriod",
        ];
        if name == "iptables" {
            known.push("localhostNodePorts");
        }
        s.warn_unknown(&known, &mut warnings);
        let masq_all = s.boolean("masqueradeAll")?;
        let bit = match s.int("masqueradeBit")? {
            None => None,
            Some(b) if (0..=31).contains(&b) => Some(b as u8),
            Some(b) => return Err(s.err("masqueradeBit", format!("{b} is not in 0..31"))),
        };
        let periods = read_periods(&s)?;
        if name == "iptables" {
            if let Some(l) = s.boolean("localhostNodePorts")? {
                cfg.localhost_node_ports = l;
            }
            if let Some(b) = bit {
                cfg.iptables_masquerade_bit = b;
            }
        } else if let Some(b) = bit {
            cfg.nftables_masquerade_bit = b;
        }
        let active = match cfg.mode {
            ProxyMode::Nftables => "nftables",
            ProxyMode::Iptables | ProxyMode::Ipvs => "iptables",
        };
        if name == active {
            if let Some(a) = masq_all {
                cfg.masquerade_all = a;
            }
            if cfg.mode != ProxyMode::Ipvs {
                mode_periods = merge_periods(top_periods, periods);
            }
        }
    }
    if cfg.mode == ProxyMode::Ipvs {
        mode_periods = merge_periods(top_periods, ipvs_periods);
    }
    // A zero period is kube-proxy's "unset": its defaulting puts 30s and 1s there.
    if let Some(d) = mode_periods.0.filter(|d| !d.is_zero()) {
        cfg.sync_period = d;
    }
    if let Some(d) = mode_periods.1.filter(|d| !d.is_zero()) {
        cfg.min_sync_period = d;
    }
    cfg.masquerade_bit = match cfg.mode {
        ProxyMode::Nftables => cfg.nftables_masquerade_bit,
        ProxyMode::Iptables | ProxyMode::Ipvs => cfg.iptables_masquerade_bit,
    };
    Ok((cfg, warnings))
}

type Periods = (Option<Duration>, Option<Duration>);

fn read_periods(s: &Section) -> Result<Periods, ConfigError> {
    Ok((s.duration("syncPeriod")?, s.duration("minSyncPeriod")?))
}

fn merge_periods(base: Periods, over: Periods) -> Periods {
    (
        over.0.filter(|d| !d.is_zero()).or(base.0),
        over.1.filter(|d| !d.is_zero()).or(base.1),
    )
}

fn read_feature_gates(top: &Section, cfg: &mut ProxyConfig) -> Result<(), ConfigError> {
    if let Some(g) = top.section("featureGates")? {
        for (name, value) in g.map {
            match value {
                Value::Bool(b) => {
                    cfg.feature_gates.insert(name.clone(), *b);
                }
                other => {
                    return Err(g.err(
                        name,
                        format!("expected true or false, got {}", kind_of(other)),
                    ))
                }
            }
        }
    }
    Ok(())
}

fn read_client_connection(
    top: &Section,
    cfg: &mut ProxyConfig,
    warnings: &mut Warnings,
) -> Result<(), ConfigError> {
    let Some(cc) = top.section("clientConnection")? else {
        return Ok(());
    };
    cc.warn_unknown(
        &[
            "kubeconfig",
            "acceptContentTypes",
            "contentType",
            "qps",
            "burst",
        ],
        warnings,
    );
    cfg.kubeconfig = cc
        .string("kubeconfig")?
        .filter(|s| !s.is_empty())
        .map(PathBuf::from);
    if let Some(v) = cc.string("acceptContentTypes")? {
        cfg.client.accept_content_types = v;
    }
    if let Some(v) = cc.string("contentType")?.filter(|v| !v.is_empty()) {
        cfg.client.content_type = v;
    }
    if let Some(q) = cc.number("qps")? {
        if !q.is_finite() || q < 0.0 {
            return Err(cc.err("qps", format!("{q} is not a non-negative number")));
        }
        // kube-proxy's qps is a float32: a value past its range is an error there, and one
        // too small for it reads as zero, kube-proxy's "unset" (the default), not "no limit".
        let q32 = q as f32;
        if q32.is_infinite() {
            return Err(cc.err("qps", format!("{q} is too large for a 32-bit float")));
        }
        if q32 > 0.0 {
            cfg.client.qps = q32;
        }
    }
    if let Some(b) = cc.int32("burst")? {
        if b < 0 {
            return Err(cc.err("burst", format!("{b} is negative")));
        }
        if b > 0 {
            cfg.client.burst = b;
        }
    }
    Ok(())
}

fn read_logging(
    top: &Section,
    cfg: &mut ProxyConfig,
    warnings: &mut Warnings,
) -> Result<(), ConfigError> {
    let Some(l) = top.section("logging")? else {
        return Ok(());
    };
    l.warn_unknown(
        &[
            "format",
            "flushFrequency",
            "verbosity",
            "vmodule",
            "options",
        ],
        warnings,
    );
    if let Some(f) = l.string("format")?.filter(|f| !f.is_empty()) {
        cfg.logging.format = f;
    }
    // flushFrequency is a duration string, or (older files) an integer of nanoseconds.
    match l.get("flushFrequency") {
        None => {}
        // Nanoseconds as Go's time.Duration holds them: an int64 (at most 292 years).
        Some(Value::Number(n)) => match n.as_u64().filter(|ns| i64::try_from(*ns).is_ok()) {
            Some(0) => {}
            Some(ns) => cfg.logging.flush_frequency = Duration::from_nanos(ns),
            None => {
                return Err(l.err(
                    "flushFrequency",
                    format!("{n} is not a duration: nanoseconds from 0 to {}", i64::MAX),
                ))
            }
        },
        Some(Value::String(_)) => {
            if let Some(d) = l.duration("flushFrequency")?.filter(|d| !d.is_zero()) {
                cfg.logging.flush_frequency = d;
            }
        }
        Some(other) => {
            return Err(l.err(
                "flushFrequency",
                format!("expected a duration, got {}", kind_of(other)),
            ))
        }
    }
    if let Some(v) = l.int("verbosity")? {
        cfg.logging.verbosity = u32::try_from(v)
            .map_err(|_| l.err("verbosity", format!("{v} is not a verbosity level (0..)")))?;
    }
    match l.get("vmodule") {
        None => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let field = format!("vmodule[{i}]");
                let (Some(p), Some(v)) = (
                    item.get("filePattern").and_then(Value::as_str),
                    item.get("verbosity").and_then(Value::as_u64),
                ) else {
                    return Err(l.err(&field, "expected {filePattern: string, verbosity: integer}"));
                };
                // A verbosity level is a uint32 in kube-proxy.
                let v = u32::try_from(v).map_err(|_| {
                    l.err(
                        &format!("{field}.verbosity"),
                        format!("{v} is not a verbosity level (0..{})", u32::MAX),
                    )
                })?;
                cfg.logging.vmodule.push(format!("{p}={v}"));
            }
        }
        Some(other) => {
            return Err(l.err(
                "vmodule",
                format!("expected a list, got {}", kind_of(other)),
            ))
        }
    }
    if let Some(o) = l.section("options")? {
        o.warn_unknown(&["text", "json"], warnings);
        for stream in ["text", "json"] {
            let Some(s) = o.section(stream)? else {
                continue;
            };
            s.warn_unknown(&["splitStream", "infoBufferSize"], warnings);
            let split = s.boolean("splitStream")?.unwrap_or(false);
            let size = match s.get("infoBufferSize") {
                None => "0".to_string(),
                Some(Value::String(q)) => q.clone(),
                Some(Value::Number(n)) => n.to_string(),
                Some(other) => {
                    return Err(s.err(
                        "infoBufferSize",
                        format!("expected a quantity, got {}", kind_of(other)),
                    ))
                }
            };
            if stream == "text" {
                cfg.logging.text_split_stream = split;
                cfg.logging.text_info_buffer_size = size;
            } else {
                cfg.logging.json_split_stream = split;
                cfg.logging.json_info_buffer_size = size;
            }
        }
    }
    Ok(())
}

/// `bindAddress` and the two server addresses, defaulted as kube-proxy defaults them: an
/// empty address takes the default for the bind address's family, an address without a
/// port gets the default port.
fn read_addresses(top: &Section, cfg: &mut ProxyConfig) -> Result<(), ConfigError> {
    if let Some(v) = top.string("bindAddress")?.filter(|v| !v.is_empty()) {
        cfg.bind_address = v
            .parse()
            .map_err(|_| top.err("bindAddress", format!("{v:?} is not an IP address")))?;
    }
    let (healthz_host, metrics_host) = if cfg.bind_address.is_ipv4() {
        ("0.0.0.0", "127.0.0.1")
    } else {
        ("[::]", "[::1]")
    };
    cfg.healthz_bind_address = match top.string("healthzBindAddress")? {
        Some(v) if !v.is_empty() => append_port_if_needed(&v, 10256),
        _ => format!("{healthz_host}:10256"),
    };
    cfg.metrics_bind_address = match top.string("metricsBindAddress")? {
        Some(v) if !v.is_empty() => append_port_if_needed(&v, 10249),
        _ => format!("{metrics_host}:10249"),
    };
    Ok(())
}

/// kube-proxy's `AppendPortIfNeeded`: a bare IP gets the port; anything else is kept as
/// written (and checked when the server binds).
pub fn append_port_if_needed(addr: &str, port: u16) -> String {
    match addr.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(ip)) => format!("{ip}:{port}"),
        Ok(std::net::IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
        Err(_) => addr.to_string(),
    }
}

fn read_conntrack(
    top: &Section,
    cfg: &mut ProxyConfig,
    warnings: &mut Warnings,
) -> Result<(), ConfigError> {
    let Some(c) = top.section("conntrack")? else {
        return Ok(());
    };
    c.warn_unknown(
        &[
            "maxPerCore",
            "min",
            "tcpEstablishedTimeout",
            "tcpCloseWaitTimeout",
            "tcpBeLiberal",
            "udpTimeout",
            "udpStreamTimeout",
        ],
        warnings,
    );
    for field in ["maxPerCore", "min"] {
        if let Some(v) = c.int32(field)? {
            if v < 0 {
                return Err(c.err(field, format!("{v} must be greater than or equal to 0")));
            }
            if field == "maxPerCore" {
                cfg.conntrack.max_per_core = Some(v);
            } else {
                cfg.conntrack.min = Some(v);
            }
        }
    }
    if let Some(d) = c.duration("tcpEstablishedTimeout")? {
        cfg.conntrack.tcp_established_timeout = Some(d);
    }
    if let Some(d) = c.duration("tcpCloseWaitTimeout")? {
        cfg.conntrack.tcp_close_wait_timeout = Some(d);
    }
    if let Some(b) = c.boolean("tcpBeLiberal")? {
        cfg.conntrack.tcp_be_liberal = b;
    }
    if let Some(d) = c.duration("udpTimeout")? {
        cfg.conntrack.udp_timeout = d;
    }
    if let Some(d) = c.duration("udpStreamTimeout")? {
        cfg.conntrack.udp_stream_timeout = d;
    }
    Ok(())
}

/// The `ipvs` section: always validated; returns its periods, which apply in IPVS mode.
fn read_ipvs(
    top: &Section,
    cfg: &mut ProxyConfig,
    warnings: &mut Warnings,
) -> Result<Periods, ConfigError> {
    let Some(s) = top.section("ipvs")? else {
        return Ok((None, None));
    };
    s.warn_unknown(
        &[
            "scheduler",
            "strictARP",
            "excludeCIDRs",
            "syncPeriod",
            "minSyncPeriod",
            "tcpTimeout",
            "tcpFinTimeout",
            "udpTimeout",
        ],
        warnings,
    );
    if let Some(sched) = s.string("scheduler")? {
        if !sched.is_empty() && !dataplane::ipvs::SCHEDULERS.contains(&sched.as_str()) {
            return Err(s.err(
                "scheduler",
                format!(
                    "{sched:?} is not one of {}",
                    dataplane::ipvs::SCHEDULERS.join(", ")
                ),
            ));
        }
        cfg.ipvs.scheduler = sched;
    }
    if let Some(b) = s.boolean("strictARP")? {
        cfg.ipvs.strict_arp = b;
    }
    if let Some(list) = s.strings("excludeCIDRs")? {
        for (i, raw) in list.iter().enumerate() {
            let field = s.name(&format!("excludeCIDRs[{i}]"));
            cfg.ipvs
                .exclude_cidrs
                .extend(parse_cidrs(top.origin, &field, raw)?);
        }
    }
    for field in ["tcpTimeout", "tcpFinTimeout", "udpTimeout"] {
        if let Some(d) = s.duration(field)? {
            match field {
                "tcpTimeout" => cfg.ipvs.tcp_timeout = d,
                "tcpFinTimeout" => cfg.ipvs.tcp_fin_timeout = d,
                _ => cfg.ipvs.udp_timeout = d,
            }
        }
    }
    read_periods(&s)
}
