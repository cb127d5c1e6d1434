//! The agent fed by manifest files under edits: 10k services x 10 endpoints in JSON `List`s
//! (as `kubectl get -o json` writes them), `switchyard run --manifests` on their directory
//! in a network namespace of its own, and the first file replaced (written aside, renamed
//! over) with one endpoint changed, again and again. Reports the agent's RSS after its first
//! sync, after the edits, and after it has sat idle, with its peak (whether memory grows with
//! churn), and what an edit costs in time and agent CPU. Each edit waits for its sync.
//!
//! Run: `cargo bench --bench file_churn` as root. Knobs: SY_BENCH_SERVICES (10000),
//! SY_BENCH_EDITS (30), SY_BENCH_EDIT_GAP_MS (2000, from one edit's sync to the next edit),
//! SY_BENCH_IDLE_SECS (15), SY_BENCH_FILES (1: the services dealt out over this many files
//! in one directory, and the first file edited), SY_BENCH_BINS (comma-separated agent binaries to compare in this
//! one run, one after the other; default the one this bench was built with).

#![allow(clippy::expect_used, clippy::unwrap_used)]
#![allow(dead_code)]

#[path = "../tests/rig/exposition.rs"]
mod exposition;

mod common;
use common::{cpu_seconds, env_or, status_mib};
#[path = "../tests/rig/netns.rs"]
mod netns;

use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// The cluster as `files` JSON lists, services dealt out in turn; svc-0's first endpoint
/// address (in the first file) is `@EDIT@`.
fn cluster(services: usize, files: usize) -> Vec<String> {
    (0..files)
        .map(|f| {
            let items: Vec<Value> = (f..services)
                .step_by(files)
                .flat_map(service_and_slice)
                .collect();
            json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
        })
        .collect()
}

fn service_and_slice(i: usize) -> [Value; 2] {
    let name = format!("svc-{i}");
    let service = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "bench"},
        "spec": {"clusterIP": format!("172.{}.{}.{}", 16 + i / 65536, (i / 256) % 256, i % 256),
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}});
    let eps: Vec<Value> = (0..10)
        .map(|j| {
            let address = if i == 0 && j == 0 {
                "@EDIT@".to_string()
            } else {
                format!("10.{}.{}.{}", (i / 256) % 256, i % 256, j + 1)
            };
            json!({"addresses": [address], "nodeName": format!("node-{}", (i + j) % 50),
                   "conditions": {"ready": true}})
        })
        .collect();
    let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{name}-1"), "namespace": "bench",
            "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": eps});
    [service, slice]
}

/// Writes version `k` of a file (written aside, renamed over).
fn write_version(path: &Path, text: &str, k: usize) {
    let tmp = path.with_extension("tmp");
    let address = format!("10.250.{}.{}", k / 250, k % 250 + 1);
    std::fs::write(&tmp, text.replace("@EDIT@", &address)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn scrape(ns: &str) -> String {
    netns::in_netns(ns, || common::http_get("127.0.0.1:10249", "/metrics")).unwrap_or_default()
}

fn syncs(ns: &str) -> f64 {
    exposition::value(
        &scrape(ns),
        &exposition::v4("kubeproxy_sync_proxy_rules_duration_seconds_count"),
    )
    .unwrap_or(0.0)
}

/// Waits (bounded) until the agent has synced more than `n` times.
fn wait_syncs(ns: &str, n: f64, what: &str) -> Duration {
    let t = Instant::now();
    while syncs(ns) <= n {
        assert!(t.elapsed() < Duration::from_secs(300), "no sync of {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
    t.elapsed()
}

fn run_one(bin: &str, texts: &[String], services: usize) {
    let edits: usize = env_or("SY_BENCH_EDITS", 30);
    let gap = Duration::from_millis(env_or("SY_BENCH_EDIT_GAP_MS", 2000));
    let idle = Duration::from_secs(env_or("SY_BENCH_IDLE_SECS", 15));
    let ns = format!("sy-bench-files-{}", std::process::id());
    if let Err(e) = netns::create_namespace(&ns) {
        println!("SKIP file_churn: {e}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    let path = |f: usize| manifests.join(format!("part-{f:04}.json"));
    for (f, text) in texts.iter().enumerate() {
        write_version(&path(f), text, 0);
    }
    let cfg = dir.path().join("config.yaml");
    std::fs::write(
        &cfg,
        "kind: KubeProxyConfiguration\nhostnameOverride: bench\nminSyncPeriod: 100ms\nsyncPeriod: 30s\nhealthzBindAddress: 127.0.0.1:10256\n",
    )
    .unwrap();
    let started = Instant::now();
    let mut agent = std::process::Command::new("ip")
        .args(["netns", "exec", &ns, bin, "run", "--log-level", "warn"])
        .arg("--config")
        .arg(&cfg)
        .arg("--manifests")
        .arg(&manifests)
        .spawn()
        .expect("start the agent");
    wait_syncs(&ns, 0.0, "the first version");
    let first = started.elapsed();
    let pid = agent.id();
    let rss_first = status_mib(pid, "VmRSS:");
    let mut per_edit = Vec::new();
    let mut cpu = 0.0;
    for k in 1..=edits {
        std::thread::sleep(gap);
        let n = syncs(&ns);
        let cpu0 = cpu_seconds(pid);
        let t = Instant::now();
        write_version(&path(0), &texts[0], k);
        wait_syncs(&ns, n, "an edit");
        per_edit.push(t.elapsed());
        cpu += cpu_seconds(pid) - cpu0;
    }
    let rss_edits = status_mib(pid, "VmRSS:");
    std::thread::sleep(idle);
    let (rss_idle, peak) = (status_mib(pid, "VmRSS:"), status_mib(pid, "VmHWM:"));
    let _ = agent.kill();
    let _ = agent.wait();
    netns::delete_namespace(&ns);
    per_edit.sort();
    let median = per_edit
        .get(per_edit.len() / 2)
        .copied()
        .unwrap_or_default();
    println!(
        "file_churn {bin}: {services} services x 10 in {} file(s), {:.1} MB; first sync {:.2} s after start; \
         RSS {rss_first:.0} MiB after it, {rss_edits:.0} MiB after {edits} edits of the first file, {rss_idle:.0} MiB after {} s idle, peak {peak:.0} MiB; \
         an edit synced within {:.0} ms (median, polling included), agent CPU {:.0} ms per edit",
        texts.len(),
        texts.iter().map(String::len).sum::<usize>() as f64 / 1e6,
        first.as_secs_f64(),
        idle.as_secs(),
        median.as_secs_f64() * 1000.0,
        cpu / edits.max(1) as f64 * 1000.0,
    );
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("file_churn: run with `cargo bench --bench file_churn`");
        return;
    }
    let services: usize = env_or("SY_BENCH_SERVICES", 10_000);
    let files: usize = env_or("SY_BENCH_FILES", 1);
    let texts = cluster(services, files.max(1));
    let bins: String = env_or(
        "SY_BENCH_BINS",
        env!("CARGO_BIN_EXE_switchyard").to_string(),
    );
    for bin in bins.split(',').filter(|b| !b.is_empty()) {
        run_one(bin, &texts, services);
    }
}
