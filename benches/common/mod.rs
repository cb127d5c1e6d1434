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
