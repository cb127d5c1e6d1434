//! The real kube-proxy v1.37.2 beside Switchyard (issue 26 section 3). For each proxy
//! (kube-proxy in nftables mode, kube-proxy in iptables mode, Switchyard in nftables mode,
//! Switchyard in iptables mode), one at a time so they do not compete for the cores: a
//! network namespace of its own, watching one real control plane (tests/cluster/up.sh, its
//! port relayed into the namespace) that holds N services x 10 endpoints and this node,
//! written through kube-apiserver once per size (or, with SY_BENCH_API=fixture or without
//! the built components, the fixture API server in each namespace), the proxy started with the same
//! KubeProxyConfiguration (same node name, same sync periods), then endpoint churn at each
//! rate for a bounded time. Each EndpointSlice carries
//! `endpoints.kubernetes.io/last-change-trigger-time`, set when the bench writes it, so both
//! proxies' `kubeproxy_network_programming_duration_seconds` measure from the change.
//!
//! Measured per proxy: start to the first complete sync (the proxy's
//! `kubeproxy_sync_proxy_rules_last_timestamp_seconds` set, and its rules holding the first
//! and the last service), sync duration p50/p99 and network programming latency p50/p99/mean
//! from the proxies' own histograms (deltas over each churn window), peak RSS (the process
//! tree sampled every 50 ms: the proxy's VmRSS plus the VmHWM of each nft /
//! iptables-restore child it runs; and the proxy's own VmHWM), steady RSS (VmRSS after the
//! churn), CPU share (utime+stime, children waited for included, over each churn window).
//!
//! Run: `cargo bench --bench vs_kube_proxy` as root, with the real kube-proxy built
//! (tests/cluster/build.sh). Knobs: SY_BENCH_SERVICES (1000; a comma list runs each size),
//! SY_BENCH_RATE (10,100 changes per second, each a window), SY_BENCH_SECONDS (20 per
//! window), SY_BENCH_MIN_SYNC (1s, both proxies' default), SY_BENCH_PROXIES
//! (kube-proxy-nftables,kube-proxy-iptables,switchyard-nftables,switchyard-iptables),
//! SY_BENCH_KUBE_PROXY (path of the real binary), SY_BENCH_FIRST_SYNC_LIMIT (300 s: a
//! proxy without a complete first sync by then is recorded with an `error` and skipped),
//! SY_BENCH_API (real or fixture). Results are merged into
//! target/vs_kube_proxy.json (one object per proxy and size).

#![allow(clippy::expect_used, clippy::unwrap_used)]
#![allow(dead_code)]

#[path = "../tests/rig/netns.rs"]
mod netns;

#[path = "../tests/apiserver/mod.rs"]
mod apiserver;
#[path = "../tests/rig/exposition.rs"]
mod exposition;

#[path = "../tests/rig/control_plane.rs"]
mod control_plane;

#[path = "vs_kube_proxy/api.rs"]
mod api;
#[path = "vs_kube_proxy/packets.rs"]
mod packets;

use exposition::quantile;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const NODE: &str = "bench-node";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// RFC 3339 with nanoseconds, UTC, as the EndpointSlice controller writes the trigger time
/// (`time.RFC3339Nano`).
fn rfc3339_nano(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// Inside up.sh's Service CIDR (10.96.0.0/16), past the addresses the control plane
/// allocates itself (10.96.0.x), so kube-apiserver takes them as given.
fn cluster_ip(i: usize) -> String {
    let i = i + 256;
    format!("10.{}.{}.{}", 96 + i / 65536, (i / 256) % 256, i % 256)
}

/// The cluster of a run: the node, `services` Services and their EndpointSlices (and, for
/// a real API server, their namespace first).
fn cluster_objects(services: usize, real: bool) -> Vec<Value> {
    let mut out = Vec::with_capacity(2 * services + 2);
    if real {
        out.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}}));
    }
    out.push(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.200.0.1"}]}}));
    for i in 0..services {
        out.push(service(i));
        out.push(slice(i, 0));
    }
    // The probe Service (network programming from packets), after the N.
    let mut probe = service(services);
    probe["metadata"]["name"] = json!(PROBE);
    out.push(probe);
    out.push(packets::slice(PROBE, 1));
    out
}

/// The probe Service's name.
const PROBE: &str = "probe";

/// The next churn change and the next probe move, counted across the runs of a process: a
/// real API server keeps what the previous proxy's run wrote, so a change must never repeat
/// an earlier one (a proxy rightly ignores a write that changes nothing).
static GENERATION: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
static PROBE_GENERATION: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(2);

fn service(i: usize) -> Value {
    let ip = cluster_ip(i);
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc-{i}"), "namespace": "bench"},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
            "ipFamilies": ["IPv4"],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}})
}

/// The slice of service `i` at `generation`: at generation 0 ten endpoints, after that
/// endpoint `generation % 10` replaced by an address no other generation uses (so every
/// change is a real one: one endpoint removed, one added); the trigger time is now, as the
/// EndpointSlice controller sets it at the change.
fn slice(i: usize, generation: usize) -> Value {
    let eps: Vec<Value> = (0..10)
        .map(|j| {
            let ip = if generation > 0 && j == generation % 10 {
                let g = generation;
                format!("11.{}.{}.{}", (g >> 16) % 256, (g >> 8) % 256, g % 256)
            } else {
                format!("10.{}.{}.{}", (i / 256) % 256, i % 256, j + 1)
            };
            json!({"addresses": [ip],
                   "conditions": {"ready": true, "serving": true, "terminating": false}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i}-1"), "namespace": "bench",
            "labels": {"kubernetes.io/service-name": format!("svc-{i}"),
                       "endpointslice.kubernetes.io/managed-by": "switchyard-bench"},
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": rfc3339_nano(SystemTime::now())}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": eps})
}

/// The proxy's metrics; retried (a few times) until they hold the sync histogram whole.
fn scrape(ns: &str) -> String {
    let mut text = String::new();
    for _ in 0..5 {
        text = scrape_once(ns);
        if text.contains("kubeproxy_sync_proxy_rules_duration_seconds_count")
            && text.contains("kubeproxy_network_programming_duration_seconds_count")
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    text
}

/// HTTP/1.0, so that the answer is not chunked (Go's server chunks a long HTTP/1.1 answer,
/// and a chunk header in the middle of a sample line would lose that sample).
fn scrape_once(ns: &str) -> String {
    netns::in_netns(ns, || {
        let mut s = TcpStream::connect_timeout(
            &"127.0.0.1:10249".parse().unwrap(),
            Duration::from_secs(2),
        )?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })
    .unwrap_or_default()
}

/// /proc/PID/stat fields after the command name.
fn stat_fields(pid: u32) -> Vec<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// utime + stime + cutime + cstime (children the proxy waited for: its nft and
/// iptables-restore runs), seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let f = stat_fields(pid);
    // utime, stime, cutime, cstime are fields 14 to 17; after the ")" they are 11 to 14.
    let ticks: f64 = f
        .get(11..15)
        .map(|f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum())
        .unwrap_or(0.0);
    ticks / 100.0
}

/// A field of /proc/PID/status in KiB (VmRSS, VmHWM).
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The process's descendants, from each process's parent in /proc.
fn descendants(root: u32) -> Vec<u32> {
    let mut parent: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(pp) = stat_fields(pid).get(1).and_then(|p| p.parse().ok()) {
                parent.push((pid, pp));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(c, pp) in &parent {
            if pp == p {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}

/// Samples the proxy's process tree until stopped: the largest (proxy VmRSS + each
/// child's VmHWM) seen, and the largest child VmHWM, KiB. A child is counted once it has
/// exec'd another program (nft, iptables-restore, ...).
struct Sampler {
    stop: Arc<AtomicBool>,
    tree_peak: Arc<AtomicU64>,
    child_peak: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(pid: u32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let tree_peak = Arc::new(AtomicU64::new(0));
        let child_peak = Arc::new(AtomicU64::new(0));
        let (s, t, c) = (stop.clone(), tree_peak.clone(), child_peak.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let mut sum = status_kib(pid, "VmRSS");
                let comm = |p: u32| std::fs::read_to_string(format!("/proc/{p}/comm")).ok();
                let own = comm(pid);
                // A child between fork (or Go's vfork) and exec still shows the proxy's
                // memory: count only children that are another program already.
                for child in descendants(pid).into_iter().filter(|c| comm(*c) != own) {
                    let hwm = status_kib(child, "VmHWM");
                    sum += hwm;
                    c.fetch_max(hwm, Ordering::Relaxed);
                }
                t.fetch_max(sum, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Sampler {
            stop,
            tree_peak,
            child_peak,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        (
            self.tree_peak.load(Ordering::Relaxed),
            self.child_peak.load(Ordering::Relaxed),
        )
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Proxy {
    KubeProxy,
    Switchyard,
}

struct Run {
    name: String,
    proxy: Proxy,
    mode: &'static str,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Whether a sample line's labels select it: kube-proxy v1.37 labels its sync metrics with
/// `ip_family` (it runs a proxier per family); the services are IPv4, so IPv4 is compared.
fn ipv4_or_unlabelled(labels: &str) -> bool {
    !labels.contains("ip_family=") || labels.contains("ip_family=\"IPv4\"")
}

/// The value of sample `name` (any labels, IPv4 family where labelled).
fn value(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        let (labels, v) = if let Some(r) = rest.strip_prefix('{') {
            r.split_once("} ")?
        } else {
            ("", rest.strip_prefix(' ')?)
        };
        if !ipv4_or_unlabelled(labels) {
            return None;
        }
        v.trim().parse().ok()
    })
}

/// (upper bound, cumulative count) of histogram `name` (IPv4 family where labelled).
fn buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{");
    text.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (labels, count) = rest.split_once("} ")?;
            if !ipv4_or_unlabelled(labels) {
                return None;
            }
            let le = labels.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// The histogram's counts between two scrapes, per bucket: (upper bound, cumulative count),
/// buckets matched by their bound.
fn during(before: &str, after: &str, name: &str) -> Vec<(f64, f64)> {
    let b0 = buckets(before, name);
    buckets(after, name)
        .into_iter()
        .map(|(le, c)| {
            let c0 = b0.iter().find(|x| x.0 == le).map(|x| x.1).unwrap_or(0.0);
            (le, c - c0)
        })
        .collect()
}

fn delta(before: &str, after: &str, name: &str) -> f64 {
    value(after, name).unwrap_or(0.0) - value(before, name).unwrap_or(0.0)
}

/// The proxy's rules, as text: its nftables table or the nat table.
fn rules(ns: &str, run: &Run) -> String {
    let out = if run.mode == "iptables" {
        netns::run(
            "ip",
            &["netns", "exec", ns, "iptables-save", "-t", "nat"],
            None,
            Duration::from_secs(60),
        )
    } else {
        netns::run(
            "ip",
            &["netns", "exec", ns, "nft", "list", "ruleset"],
            None,
            Duration::from_secs(60),
        )
    };
    out.stdout
}

/// Whether the rules text names `ip` (not as the prefix of a longer address).
fn holds(rules: &str, ip: &str) -> bool {
    rules.match_indices(ip).any(|(k, _)| {
        !rules[k + ip.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

fn round(v: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (v * m).round() / m
}

fn bench_one(
    run: &Run,
    real: Option<&api::Real>,
    services: usize,
    rates: &[usize],
    seconds: u64,
    min_sync: &str,
) -> Value {
    let ns = format!("sy-vs-{}-{}", run.name, std::process::id());
    netns::create_namespace(&ns).expect("network namespace");
    let api = api::Attached::to(&ns, real, || cluster_objects(services, false));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
    // One configuration for both: kube-proxy's own format, which Switchyard reads too.
    let cfg = dir.path().join("config.yaml");
    std::fs::write(
        &cfg,
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
             mode: {mode}\nhostnameOverride: {NODE}\n\
             clientConnection:\n  kubeconfig: {kc}\n  contentType: application/json\n\
             conntrack:\n  maxPerCore: 0\n\
             iptables:\n  minSyncPeriod: {min_sync}\n  syncPeriod: 30s\n\
             nftables:\n  minSyncPeriod: {min_sync}\n  syncPeriod: 30s\n\
             metricsBindAddress: 127.0.0.1:10249\nhealthzBindAddress: 127.0.0.1:10256\n",
            mode = run.mode,
            kc = kubeconfig.display()
        ),
    )
    .unwrap();
    let log = dir.path().join("proxy.log");
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns]);
    match run.proxy {
        Proxy::KubeProxy => {
            cmd.arg(kube_proxy_binary());
            cmd.arg(format!("--config={}", cfg.display()));
        }
        Proxy::Switchyard => {
            cmd.args([env!("CARGO_BIN_EXE_switchyard"), "run"]);
            cmd.arg("--config").arg(&cfg);
            cmd.arg("--kubeconfig").arg(&kubeconfig);
            cmd.args(["--log-level", "info"]);
        }
    }
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start the proxy");
    let pid = child.id();
    let started = Instant::now();
    let sampler = Sampler::start(pid);
    let first = cluster_ip(0);
    let last = cluster_ip(services - 1);
    let mut synced_at = None;
    let first_sync_limit = Duration::from_secs(env_or("SY_BENCH_FIRST_SYNC_LIMIT", 300));
    let first_sync = loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{} exited ({status}):\n{}",
                run.name,
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        let m = scrape(&ns);
        if synced_at.is_none()
            && value(&m, "kubeproxy_sync_proxy_rules_last_timestamp_seconds").unwrap_or(0.0) > 0.0
        {
            synced_at = Some(started.elapsed());
        }
        if let Some(at) = synced_at {
            let r = rules(&ns, run);
            if holds(&r, &first) && holds(&r, &last) {
                break at;
            }
        }
        if started.elapsed() > first_sync_limit {
            // Recorded, not fatal: the other proxies still run.
            let logged = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = logged.lines().rev().take(5).collect();
            let children: Vec<String> = descendants(pid)
                .into_iter()
                .filter_map(|c| std::fs::read_to_string(format!("/proc/{c}/cmdline")).ok())
                .map(|c| c.replace('\0', " ").trim().to_string())
                .collect();
            let peak = status_kib(pid, "VmHWM");
            let cpu = cpu_seconds(pid);
            let _ = sampler.finish();
            kill_tree(pid);
            let _ = child.kill();
            let _ = child.wait();
            drop(api);
            netns::delete_namespace(&ns);
            keep_log(&log, run, services);
            return json!({
                "proxy": run.name,
                "implementation": if run.proxy == Proxy::KubeProxy { "kube-proxy v1.37.2" } else { "switchyard" },
                "mode": run.mode,
                "api_server": if real.is_some() { "kube-apiserver v1.37.2" } else { "fixture" },
                "services": services,
                "endpoints_per_service": 10,
                "min_sync_period": min_sync,
                "error": format!("no complete first sync within {} s", first_sync_limit.as_secs()),
                "first_sync_s": Value::Null,
                "startup_cpu_s": round(cpu, 2),
                "peak_rss_mib": round(mib(peak), 1),
                "running_then": children,
                "log_tail": tail,
                "churn": [],
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let cpu_start = cpu_seconds(pid);
    let m0 = scrape(&ns);
    let first_sync_duration = value(&m0, "kubeproxy_sync_proxy_rules_duration_seconds_sum")
        .unwrap_or(0.0)
        / value(&m0, "kubeproxy_sync_proxy_rules_duration_seconds_count")
            .unwrap_or(1.0)
            .max(1.0);
    std::thread::sleep(Duration::from_secs(2));
    let rss_after_first = status_kib(pid, "VmRSS");

    // The probe's pod, and its first address answering through the proxy.
    let pod = packets::Pod::start(&ns, "10.96.0.0/16");
    let probe_vip: std::net::SocketAddr = format!("{}:80", cluster_ip(services)).parse().unwrap();
    let writer = api.writer();
    // A first move of the probe Service to the new pod, answered through the proxy (a real
    // API server still holds where the previous proxy's run left it).
    let first_move = PROBE_GENERATION.fetch_add(1, Ordering::Relaxed);
    pod.add(first_move);
    let written = Instant::now();
    let probing = writer.apply_now(packets::slice(PROBE, first_move)).is_ok()
        && pod
            .until_moved(probe_vip, first_move, written, Duration::from_secs(10))
            .is_some();
    if !probing {
        println!(
            "  the probe Service never answered: no latency from packets for {}",
            run.name
        );
    }
    let mut windows = Vec::new();
    for &rate in rates {
        let before = scrape(&ns);
        let cpu0 = cpu_seconds(pid);
        let t0 = Instant::now();
        let interval = Duration::from_secs_f64(1.0 / rate as f64);
        let total = rate * seconds as usize;
        let stop = AtomicBool::new(false);
        // One probe move a second beside the churn, each timed from its write to the first
        // connection the new address answers.
        let (moved, missed) = std::thread::scope(|scope| {
            let prober = scope.spawn(|| {
                let (mut moved, mut missed) = (Vec::new(), 0usize);
                while probing && !stop.load(Ordering::Relaxed) {
                    let g = PROBE_GENERATION.fetch_add(1, Ordering::Relaxed);
                    pod.add(g);
                    let written = Instant::now();
                    if writer.apply_now(packets::slice(PROBE, g)).is_err() {
                        missed += 1;
                        continue;
                    }
                    match pod.until_moved(probe_vip, g, written, Duration::from_secs(10)) {
                        Some(d) => moved.push(d.as_secs_f64()),
                        None => missed += 1,
                    }
                    if let Some(rest) = Duration::from_secs(1).checked_sub(written.elapsed()) {
                        std::thread::sleep(rest);
                    }
                }
                (moved, missed)
            });
            for k in 0..total {
                let due = t0 + interval * k as u32;
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
                api.apply(slice((generation * 7919) % services, generation));
            }
            stop.store(true, Ordering::Relaxed);
            prober.join().unwrap()
        });
        let churn = t0.elapsed();
        let write_failures = api.settle();
        // Let the last changes land (both proxies' minSyncPeriod is at most a second or two).
        std::thread::sleep(Duration::from_secs(3));
        let wall = t0.elapsed();
        let cpu = cpu_seconds(pid) - cpu0;
        let after = scrape(&ns);
        let sync = during(
            &before,
            &after,
            "kubeproxy_sync_proxy_rules_duration_seconds",
        );
        let prog = during(
            &before,
            &after,
            "kubeproxy_network_programming_duration_seconds",
        );
        let syncs = delta(
            &before,
            &after,
            "kubeproxy_sync_proxy_rules_duration_seconds_count",
        );
        let sync_sum = delta(
            &before,
            &after,
            "kubeproxy_sync_proxy_rules_duration_seconds_sum",
        );
        let progs = delta(
            &before,
            &after,
            "kubeproxy_network_programming_duration_seconds_count",
        );
        let prog_sum = delta(
            &before,
            &after,
            "kubeproxy_network_programming_duration_seconds_sum",
        );
        windows.push(json!({
            "rate_per_s": rate,
            "changes": total,
            "churn_s": round(churn.as_secs_f64(), 2),
            "syncs": syncs,
            "sync_p50_ms": round(quantile(&sync, 0.50) * 1000.0, 2),
            "sync_p99_ms": round(quantile(&sync, 0.99) * 1000.0, 2),
            "sync_mean_ms": round(if syncs > 0.0 { sync_sum / syncs * 1000.0 } else { 0.0 }, 2),
            "netprog_count": progs,
            "netprog_p50_ms": round(quantile(&prog, 0.50) * 1000.0, 1),
            "netprog_p99_ms": round(quantile(&prog, 0.99) * 1000.0, 1),
            "netprog_mean_ms": round(if progs > 0.0 { prog_sum / progs * 1000.0 } else { 0.0 }, 1),
            "write_failures": write_failures.len(),
            "packets_count": moved.len(),
            "packets_missed": missed,
            "packets_p50_ms": round(sample_quantile(&moved, 0.50) * 1000.0, 1),
            "packets_p99_ms": round(sample_quantile(&moved, 0.99) * 1000.0, 1),
            "packets_mean_ms": round(moved.iter().sum::<f64>() / moved.len().max(1) as f64 * 1000.0, 1),
            "cpu_percent": round(cpu / wall.as_secs_f64() * 100.0, 1),
            "rss_mib": round(mib(status_kib(pid, "VmRSS")), 1),
        }));
    }
    let steady = status_kib(pid, "VmRSS");
    let hwm = status_kib(pid, "VmHWM");
    let cpu_total = cpu_seconds(pid);
    let (tree_peak, child_peak) = sampler.finish();
    kill_tree(pid);
    let _ = child.kill();
    let _ = child.wait();
    drop(writer);
    drop(pod);
    keep_log(&log, run, services);
    drop(api);
    netns::delete_namespace(&ns);
    json!({
        "proxy": run.name,
        "implementation": if run.proxy == Proxy::KubeProxy { "kube-proxy v1.37.2" } else { "switchyard" },
        "mode": run.mode,
        "api_server": if real.is_some() { "kube-apiserver v1.37.2" } else { "fixture" },
        "services": services,
        "endpoints_per_service": 10,
        "min_sync_period": min_sync,
        "first_sync_s": round(first_sync.as_secs_f64(), 2),
        "first_sync_duration_s": round(first_sync_duration, 3),
        "startup_cpu_s": round(cpu_start, 2),
        "peak_rss_mib": round(mib(hwm), 1),
        "peak_tree_rss_mib": round(mib(tree_peak.max(hwm)), 1),
        "peak_child_rss_mib": round(mib(child_peak), 1),
        "rss_after_first_sync_mib": round(mib(rss_after_first), 1),
        "steady_rss_mib": round(mib(steady), 1),
        "total_cpu_s": round(cpu_total, 2),
        "churn": windows,
    })
}

/// Kills what the proxy started (its nft or iptables-restore): a child outliving the proxy
/// would hold a core through the next proxy's run (kube-proxy's first iptables-restore at
/// 10k runs for minutes).
fn kill_tree(pid: u32) {
    for child in descendants(pid) {
        let _ = Command::new("kill")
            .args(["-KILL", &child.to_string()])
            .status();
    }
}

/// Copies a proxy's log to target/vs_kube_proxy-logs/<proxy>-<services>.log.
fn keep_log(log: &Path, run: &Run, services: usize) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/vs_kube_proxy-logs");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::copy(log, dir.join(format!("{}-{services}.log", run.name)));
}

/// The `q` quantile of samples (nearest rank); 0 without samples.
fn sample_quantile(samples: &[f64], q: f64) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return 0.0;
    }
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

fn kube_proxy_binary() -> PathBuf {
    std::env::var("SY_BENCH_KUBE_PROXY")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("target/k8s/v1.37.2/bin/kube-proxy")
        })
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "-".into()
    }
}

/// One table per size: each proxy's figures, and Switchyard (same mode) / kube-proxy.
fn print_table(results: &[Value]) {
    let mut sizes: Vec<u64> = results
        .iter()
        .filter_map(|r| r["services"].as_u64())
        .collect();
    sizes.dedup();
    for size in sizes {
        for r in results
            .iter()
            .filter(|r| r["services"].as_u64() == Some(size) && !r["error"].is_null())
        {
            println!("\n{} at {size}: {}", r["proxy"], r["error"]);
        }
        let at: Vec<&Value> = results
            .iter()
            .filter(|r| r["services"].as_u64() == Some(size) && r["error"].is_null())
            .collect();
        println!("\nvs_kube_proxy: {size} services x 10 endpoints");
        let mut rows: Vec<(String, Vec<f64>)> = vec![
            ("start to first complete sync, s".into(), vec![]),
            ("first sync duration, s".into(), vec![]),
            ("peak RSS, proxy, MiB".into(), vec![]),
            ("peak RSS, proxy + children, MiB".into(), vec![]),
            ("steady RSS, MiB".into(), vec![]),
        ];
        for r in &at {
            rows[0].1.push(f(&r["first_sync_s"]));
            rows[1].1.push(f(&r["first_sync_duration_s"]));
            rows[2].1.push(f(&r["peak_rss_mib"]));
            rows[3].1.push(f(&r["peak_tree_rss_mib"]));
            rows[4].1.push(f(&r["steady_rss_mib"]));
        }
        let windows = at
            .first()
            .and_then(|r| r["churn"].as_array())
            .map(Vec::len)
            .unwrap_or(0);
        for w in 0..windows {
            let rate = at[0]["churn"][w]["rate_per_s"].as_u64().unwrap_or(0);
            for (label, key) in [
                ("sync p50, ms", "sync_p50_ms"),
                ("sync p99, ms", "sync_p99_ms"),
                ("syncs", "syncs"),
                ("net. programming p50, ms", "netprog_p50_ms"),
                ("net. programming p99, ms", "netprog_p99_ms"),
                ("net. programming mean, ms", "netprog_mean_ms"),
                ("from packets p50, ms", "packets_p50_ms"),
                ("from packets p99, ms", "packets_p99_ms"),
                ("from packets mean, ms", "packets_mean_ms"),
                ("CPU, % of one core", "cpu_percent"),
            ] {
                rows.push((
                    format!("{rate}/s: {label}"),
                    at.iter().map(|r| f(&r["churn"][w][key])).collect(),
                ));
            }
        }
        let names: Vec<String> = at
            .iter()
            .map(|r| r["proxy"].as_str().unwrap_or("").to_string())
            .collect();
        // Ratio columns: switchyard-<mode> / kube-proxy-<mode>.
        let pairs: Vec<(usize, usize, String)> = ["nftables", "iptables"]
            .iter()
            .filter_map(|m| {
                let sy = names.iter().position(|n| *n == format!("switchyard-{m}"))?;
                let kp = names.iter().position(|n| *n == format!("kube-proxy-{m}"))?;
                Some((sy, kp, format!("SY/KP {m}")))
            })
            .collect();
        print!("{:<36}", "");
        for n in &names {
            print!(" {n:>20}");
        }
        for (_, _, h) in &pairs {
            print!(" {h:>15}");
        }
        println!();
        for (label, vals) in rows {
            print!("{label:<36}");
            for v in &vals {
                print!(" {v:>20.2}");
            }
            for (sy, kp, _) in &pairs {
                print!(" {:>15}", ratio(vals[*sy], vals[*kp]));
            }
            println!();
        }
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("vs_kube_proxy: run with `cargo bench --bench vs_kube_proxy`");
        return;
    }
    if !netns::is_root() {
        println!("SKIP vs_kube_proxy: needs root and network namespaces");
        return;
    }
    if !kube_proxy_binary().exists() {
        println!(
            "SKIP vs_kube_proxy: the real kube-proxy is not built at {} (tests/cluster/build.sh)",
            kube_proxy_binary().display()
        );
        return;
    }
    let sizes: Vec<usize> = env_list("SY_BENCH_SERVICES", "1000")
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect();
    let rates: Vec<usize> = env_list("SY_BENCH_RATE", "10,100")
        .iter()
        .filter_map(|s| s.parse().ok())
        .filter(|r| *r > 0)
        .collect();
    let seconds: u64 = env_or("SY_BENCH_SECONDS", 20);
    let min_sync: String = env_or("SY_BENCH_MIN_SYNC", "1s".to_string());
    let runs: Vec<Run> = env_list(
        "SY_BENCH_PROXIES",
        "kube-proxy-nftables,kube-proxy-iptables,switchyard-nftables,switchyard-iptables",
    )
    .into_iter()
    .filter_map(|name| {
        let (proxy, mode) = match name.as_str() {
            "kube-proxy-nftables" => (Proxy::KubeProxy, "nftables"),
            "kube-proxy-iptables" => (Proxy::KubeProxy, "iptables"),
            "switchyard-nftables" => (Proxy::Switchyard, "nftables"),
            "switchyard-iptables" => (Proxy::Switchyard, "iptables"),
            _ => {
                println!("vs_kube_proxy: unknown proxy {name}, skipped");
                return None;
            }
        };
        Some(Run { name, proxy, mode })
    })
    .collect();
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/vs_kube_proxy.json");
    let mut all: BTreeMap<(String, u64), Value> = std::fs::read_to_string(&out)
        .ok()
        .and_then(|t| serde_json::from_str::<Vec<Value>>(&t).ok())
        .unwrap_or_default()
        .into_iter()
        .map(|v| {
            (
                (
                    v["proxy"].as_str().unwrap_or("").to_string(),
                    v["services"].as_u64().unwrap_or(0),
                ),
                v,
            )
        })
        .collect();
    // The real control plane where it is built, else the fixture (SY_BENCH_API=fixture
    // asks for the fixture).
    let real_api = match std::env::var("SY_BENCH_API").as_deref() {
        Ok("fixture") => false,
        Ok("real") => true,
        _ => control_plane::k8s_bin("kube-apiserver").exists(),
    };
    let mut results = Vec::new();
    for &services in &sizes {
        let real = real_api.then(|| api::Real::start(cluster_objects(services, true)));
        for run in &runs {
            println!(
                "vs_kube_proxy: {} at {services} services x 10, churn {rates:?}/s for {seconds} s each, minSyncPeriod {min_sync}",
                run.name
            );
            let mut r = bench_one(run, real.as_ref(), services, &rates, seconds, &min_sync);
            r["date"] = json!(rfc3339_nano(SystemTime::now())[..10].to_string());
            println!("  {r}");
            all.insert((run.name.clone(), services as u64), r.clone());
            results.push(r);
            let list: Vec<&Value> = all.values().collect();
            std::fs::write(&out, serde_json::to_string_pretty(&list).unwrap()).unwrap();
        }
    }
    print_table(&results);
    println!("\nwritten to {}", out.display());
}
