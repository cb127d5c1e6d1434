//! The node set-up kube-proxy does at start (pkg/proxy/conntrack/sysctls.go and
//! cmd/kube-proxy/app/server.go): conntrack sysctls from the `conntrack` section, written
//! only where they differ, and the process's OOM score. Reads and writes go through
//! [`Knobs`], so the decisions are tested on a fake.

use crate::config::{ConntrackConfig, ProxyConfig};
use dataplane::model::IpFamily;

/// kube-proxy caps maxPerCore x CPUs here (getConntrackMax).
const MAX_LIMIT: i64 = 1_048_576;

/// Where the kernel's settings are read and written.
pub trait Knobs {
    /// An integer under /proc/sys (`net/netfilter/nf_conntrack_max`), or the hash size.
    fn read(&self, key: &str) -> std::io::Result<i64>;
    fn write(&mut self, key: &str, value: i64) -> std::io::Result<()>;
    /// Logical CPUs, as kube-proxy counts them (online CPUs).
    fn cpus(&self) -> i64;
}

pub const HASHSIZE: &str = "module/nf_conntrack/parameters/hashsize";

/// One setting to make: the key, the value, and whether it is only raised (max, hash size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    pub key: &'static str,
    pub value: i64,
    pub raise_only: bool,
}

/// What the conntrack section asks for, in kube-proxy's order.
pub fn conntrack_settings(c: &ConntrackConfig, cpus: i64) -> Vec<Setting> {
    let mut out = Vec::new();
    let max = match c.max_per_core {
        Some(per_core) if per_core > 0 => {
            let scaled = i64::from(per_core) * cpus.max(1);
            let floor = i64::from(c.min.unwrap_or(0));
            if scaled > MAX_LIMIT {
                MAX_LIMIT
            } else {
                scaled.max(floor)
            }
        }
        _ => 0,
    };
    if max > 0 {
        out.push(Setting {
            key: "net/netfilter/nf_conntrack_max",
            value: max,
            raise_only: true,
        });
        out.push(Setting {
            key: HASHSIZE,
            value: max / 4,
            raise_only: true,
        });
    }
    let secs = |d: std::time::Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    let timeouts = [
        (
            "net/netfilter/nf_conntrack_tcp_timeout_established",
            c.tcp_established_timeout,
        ),
        (
            "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
            c.tcp_close_wait_timeout,
        ),
        (
            "net/netfilter/nf_conntrack_udp_timeout",
            Some(c.udp_timeout),
        ),
        (
            "net/netfilter/nf_conntrack_udp_timeout_stream",
            Some(c.udp_stream_timeout),
        ),
    ];
    for (key, d) in timeouts {
        if let Some(d) = d.filter(|d| d.as_secs() > 0) {
            out.push(Setting {
                key,
                value: secs(d),
                raise_only: false,
            });
        }
    }
    if c.tcp_be_liberal {
        out.push(Setting {
            key: "net/netfilter/nf_conntrack_tcp_be_liberal",
            value: 1,
            raise_only: false,
        });
    }
    out
}

/// What happened to each setting.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub written: Vec<(String, i64)>,
    /// Each failure names the setting, the value and the reason.
    pub failed: Vec<String>,
}

/// Apply the conntrack settings: each written only when it differs (max and hash size only
/// when lower). A failure is reported and the rest still applied; kube-proxy stops at the
/// first one and exits, which in a container without write access to the global hash size
/// would stop the node's Services over a sizing hint.
pub fn apply_conntrack(knobs: &mut dyn Knobs, c: &ConntrackConfig) -> Applied {
    let mut applied = Applied::default();
    for s in conntrack_settings(c, knobs.cpus()) {
        let current = knobs.read(s.key);
        let needed = match &current {
            Ok(cur) if s.raise_only => *cur < s.value,
            Ok(cur) => *cur != s.value,
            Err(_) => true,
        };
        if !needed {
            continue;
        }
        match knobs.write(s.key, s.value) {
            Ok(()) => applied.written.push((s.key.to_string(), s.value)),
            Err(e) => applied
                .failed
                .push(format!("conntrack: setting {} to {}: {e}", s.key, s.value)),
        }
    }
    applied
}

/// The real kernel: /proc/sys and /sys.
pub struct Kernel;

fn path_of(key: &str) -> String {
    if key == HASHSIZE {
        format!("/sys/{key}")
    } else {
        format!("/proc/sys/{key}")
    }
}

impl Knobs for Kernel {
    fn read(&self, key: &str) -> std::io::Result<i64> {
        let text = std::fs::read_to_string(path_of(key))?;
        text.trim()
            .parse()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    fn write(&mut self, key: &str, value: i64) -> std::io::Result<()> {
        std::fs::write(path_of(key), value.to_string())
    }

    fn cpus(&self) -> i64 {
        online_cpus().unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get() as i64)
                .unwrap_or(1)
        })
    }
}

/// Count of /sys/devices/system/cpu/online (`0-3,8-11`).
fn online_cpus() -> Option<i64> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    let mut n = 0;
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => b.parse::<i64>().ok()? - a.parse::<i64>().ok()? + 1,
            None => 1,
        };
    }
    Some(n)
}

/// Write the OOM score adjustment of this process; kube-proxy logs a failure and goes on.
pub fn apply_oom_score(adj: Option<i32>) -> Result<(), String> {
    let Some(adj) = adj else { return Ok(()) };
    let current = std::fs::read_to_string("/proc/self/oom_score_adj").unwrap_or_default();
    if current.trim() == adj.to_string() {
        return Ok(());
    }
    std::fs::write("/proc/self/oom_score_adj", adj.to_string())
        .map_err(|e| format!("oomScoreAdj: writing {adj} to /proc/self/oom_score_adj: {e}"))
}

/// The IP families the node serves, as kube-proxy decides it for its per-family proxiers
/// (platformCheckSupported in cmd/kube-proxy/app/server_linux.go): IPv4, and IPv6 unless
/// the kernel has none (`/proc/net/if_inet6` absent) or it is disabled
/// (`net.ipv6.conf.all.disable_ipv6` = 1). kube-proxy's iptables modes also drop a family
/// whose iptables binary is missing; Switchyard's iptables mode tolerates a missing
/// ip6tables until an IPv6 service appears, so the kernel decides here.
pub fn served_families(if_inet6: bool, disable_ipv6: Option<&str>) -> Vec<IpFamily> {
    let v6 = if_inet6 && disable_ipv6.map(str::trim) != Some("1");
    let mut out = vec![IpFamily::V4];
    if v6 {
        out.push(IpFamily::V6);
    }
    out
}

/// [`served_families`] of this kernel.
pub fn kernel_families() -> Vec<IpFamily> {
    let disabled = std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6").ok();
    served_families(
        std::path::Path::new("/proc/net/if_inet6").exists(),
        disabled.as_deref(),
    )
}

/// Start-up set-up from the configuration: logs what it wrote and every failure.
pub fn run(cfg: &ProxyConfig) -> Applied {
    let applied = apply_conntrack(&mut Kernel, &cfg.conntrack);
    for (key, value) in &applied.written {
        tracing::info!("set {key} to {value}");
    }
    for f in &applied.failed {
        tracing::error!("{f}");
    }
    if let Err(e) = apply_oom_score(cfg.oom_score_adj) {
        tracing::warn!("{e}");
    }
    applied
}

/// A kernel in memory, for tests.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct FakeKnobs {
    pub values: std::collections::BTreeMap<String, i64>,
    pub read_only: Vec<String>,
    pub cpus: i64,
}

#[cfg(test)]
impl Knobs for FakeKnobs {
    fn read(&self, key: &str) -> std::io::Result<i64> {
        self.values
            .get(key)
            .copied()
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
    }

    fn write(&mut self, key: &str, value: i64) -> std::io::Result<()> {
        if self.read_only.iter().any(|k| k == key) {
            return Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied));
        }
        self.values.insert(key.to_string(), value);
        Ok(())
    }

    fn cpus(&self) -> i64 {
        self.cpus
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn fake(cpus: i64) -> FakeKnobs {
        let mut f = FakeKnobs {
            cpus,
            ..FakeKnobs::default()
        };
        for (k, v) in [
            ("net/netfilter/nf_conntrack_max", 65536),
            (HASHSIZE, 16384),
            ("net/netfilter/nf_conntrack_tcp_timeout_established", 432000),
            ("net/netfilter/nf_conntrack_tcp_timeout_close_wait", 3600),
            ("net/netfilter/nf_conntrack_udp_timeout", 30),
            ("net/netfilter/nf_conntrack_udp_timeout_stream", 120),
            ("net/netfilter/nf_conntrack_tcp_be_liberal", 0),
        ] {
            f.values.insert(k.into(), v);
        }
        f
    }

    #[test]
    fn families_are_kube_proxys_choice() {
        use IpFamily::*;
        assert_eq!(served_families(true, Some("0\n")), vec![V4, V6]);
        assert_eq!(served_families(true, None), vec![V4, V6]);
        assert_eq!(served_families(true, Some("1\n")), vec![V4]);
        assert_eq!(served_families(false, Some("0")), vec![V4]);
    }

    #[test]
    fn defaults_size_conntrack_as_kube_proxy_does() {
        // 2 CPUs x 32768 = 65536 is below min 131072: min wins; hash size a quarter.
        let mut k = fake(2);
        let a = apply_conntrack(&mut k, &ConntrackConfig::default());
        assert_eq!(
            a.written,
            vec![
                ("net/netfilter/nf_conntrack_max".to_string(), 131072),
                (HASHSIZE.to_string(), 32768),
                (
                    "net/netfilter/nf_conntrack_tcp_timeout_established".to_string(),
                    86400
                ),
            ],
            "close_wait already 3600, UDP timeouts zero: untouched"
        );
        assert!(a.failed.is_empty());
        // A second run writes nothing.
        assert_eq!(
            apply_conntrack(&mut k, &ConntrackConfig::default()),
            Applied::default()
        );
    }

    #[test]
    fn max_is_only_raised_and_capped() {
        let mut k = fake(64);
        k.values
            .insert("net/netfilter/nf_conntrack_max".into(), 4_000_000);
        let c = ConntrackConfig {
            max_per_core: Some(32768),
            ..ConntrackConfig::default()
        };
        let a = apply_conntrack(&mut k, &c);
        assert!(!a
            .written
            .iter()
            .any(|(key, _)| key.ends_with("conntrack_max")));
        let s = conntrack_settings(&c, 64);
        assert_eq!(s[0].value, MAX_LIMIT, "64 x 32768 is capped at 1048576");
    }

    #[test]
    fn zero_max_per_core_leaves_sizing_alone_and_failures_are_named() {
        let mut k = fake(2);
        k.read_only
            .push("net/netfilter/nf_conntrack_tcp_be_liberal".into());
        let c = ConntrackConfig {
            max_per_core: Some(0),
            tcp_be_liberal: true,
            udp_timeout: Duration::from_secs(45),
            ..ConntrackConfig::default()
        };
        let a = apply_conntrack(&mut k, &c);
        assert!(!a
            .written
            .iter()
            .any(|(key, _)| key.contains("max") || key == HASHSIZE));
        assert!(a
            .written
            .contains(&("net/netfilter/nf_conntrack_udp_timeout".to_string(), 45)));
        assert_eq!(a.failed.len(), 1);
        assert!(
            a.failed[0].contains("nf_conntrack_tcp_be_liberal") && a.failed[0].contains("to 1")
        );
    }
}
