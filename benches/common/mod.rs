//! Helpers shared by the end-to-end benchmarks.

#![allow(dead_code)]

use dataplane::synth;
use std::time::Duration;

pub fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let idx = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[idx.min(v.len() - 1)]
}

pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Kubernetes manifests (JSON List) for a synthetic cluster.
pub fn manifests(services: usize, endpoints: usize) -> String {
    let mut items = Vec::with_capacity(services * 2);
    for i in 0..services {
        let name = format!("svc-{i}");
        items.push(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "bench"},
            "spec": {"clusterIP": synth::cluster_ip(i).to_string(),
                      "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
        }));
        let eps: Vec<_> = (0..endpoints)
            .map(|j| {
                serde_json::json!({
                    "addresses": [synth::endpoint_ip(i, j, 0).to_string()],
                    "nodeName": format!("node-{}", (i + j) % 50),
                    "conditions": {"ready": true}
                })
            })
            .collect();
        items.push(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-1"), "namespace": "bench",
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": eps
        }));
    }
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

/// Creates network namespace `sy-bench-<what>-<pid>` and moves this thread into it;
/// `None` (after a SKIP line) without root.
pub fn enter_netns(what: &str) -> Option<String> {
    use nix::sched::{setns, CloneFlags};
    let ns = format!("sy-bench-{what}-{}", std::process::id());
    if !std::process::Command::new("ip")
        .args(["netns", "add", &ns])
        .status()
        .is_ok_and(|s| s.success())
    {
        println!("SKIP {what}: needs root and network namespaces");
        return None;
    }
    let fd = std::fs::File::open(format!("/run/netns/{ns}")).expect("open netns");
    setns(&fd, CloneFlags::CLONE_NEWNET).expect("enter netns");
    Some(ns)
}

/// The service counts to run, from SY_BENCH_SIZES (default 10000,30000).
pub fn sizes() -> Vec<usize> {
    std::env::var("SY_BENCH_SIZES")
        .unwrap_or_else(|_| "10000,30000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

/// Replaces one endpoint of a pseudo-random service `changes` times (the same sequence in
/// every benchmark), syncing each change with `sync` (the snapshot and the changed
/// service); returns how long each sync took.
pub fn endpoint_changes(
    snap: &mut dataplane::model::Snapshot,
    services: usize,
    changes: usize,
    mut sync: impl FnMut(&dataplane::model::Snapshot, &std::collections::BTreeSet<(String, String)>),
) -> Vec<Duration> {
    let mut totals = Vec::with_capacity(changes);
    let mut seed: u64 = 0x5eed;
    for k in 0..changes {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let i = (seed >> 33) as usize % services;
        let j = (seed >> 20) as usize % 10;
        synth::replace_endpoint(snap, i, j, k as u32 + 1);
        let changed = std::collections::BTreeSet::from([("bench".to_string(), format!("svc-{i}"))]);
        let t = std::time::Instant::now();
        sync(snap, &changed);
        totals.push(t.elapsed());
    }
    totals
}

/// What one `switchyard sync --once` from manifests did.
pub struct ColdSync {
    pub wall: Duration,
    /// Peak RSS of the largest child so far (the agent or its nft / iptables-restore), MiB.
    pub max_rss_mib: f64,
    /// The agent's summary line.
    pub said: String,
}

/// Writes a synthetic cluster of `services` x 10 and `config` to a temporary directory and
/// times `switchyard sync --once` on them, with `extra` arguments; panics if it fails.
pub fn cold_sync_from_manifests(services: usize, config: &str, extra: &[&str]) -> ColdSync {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = dir.path().join("cluster.json");
    std::fs::write(&m, manifests(services, 10)).expect("write manifests");
    let cfg = dir.path().join("kp.yaml");
    std::fs::write(&cfg, config).expect("write config");
    let t = std::time::Instant::now();
    let res = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["sync", "--once"])
        .args(extra)
        .arg("--config")
        .arg(&cfg)
        .arg("--manifests")
        .arg(&m)
        .output()
        .expect("run switchyard");
    let wall = t.elapsed();
    assert!(
        res.status.success(),
        "sync failed: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .expect("getrusage");
    ColdSync {
        wall,
        max_rss_mib: usage.max_rss() as f64 / 1024.0,
        said: String::from_utf8_lossy(&res.stdout).trim().to_string(),
    }
}

/// An environment knob, or `default` when unset or unparsable.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A `/proc/<pid>/status` size in MiB: `VmRSS` now, `VmHWM` the peak.
pub fn status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// utime + stime of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime are fields 14 and 15; after the ")" they are at 11 and 12.
    let ticks: f64 = fields
        .get(11..13)
        .map(|f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum())
        .unwrap_or(0.0);
    ticks / 100.0
}

/// `GET path` from `addr` over a new connection, whole response (head and body): run it in
/// the namespace of the server (`netns::in_netns`).
pub fn http_get(addr: &str, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}
