//! The agent end to end: the fixture API server holds 10k services x 10 endpoints, a
//! `switchyard run` in a network namespace of its own watches it, and endpoint changes
//! arrive at a steady rate. Reports the agent's event-to-kernel latency (p50, p99, from its
//! `switchyard_event_to_kernel_seconds` histogram), its syncs, its CPU share and its RSS.
//!
//! Run: `cargo bench --bench agent_e2e` as root. Knobs: SY_BENCH_SERVICES (10000),
//! SY_BENCH_RATE changes per second (100), SY_BENCH_SECONDS (60), SY_BENCH_MIN_SYNC (1ms),
//! SY_BENCH_SYNC_PERIOD (30s), SY_BENCH_FOREIGN (0; 1: another program commits to nftables
//! every second; 2: to our table, an element added and deleted, which the agent looks up; 3:
//! to our table, a chain added and deleted, which the agent checks without reading elements;
//! 4: a set added and deleted, which the agent reads back), SY_BENCH_BIN (another
//! agent binary, to compare two builds in one session), SY_BENCH_LOG (the agent's
//! `--log-level`, warn).

#![allow(clippy::expect_used, clippy::unwrap_used)]
#![allow(dead_code)]

#[path = "../tests/rig/netns.rs"]
mod netns;

#[path = "../tests/apiserver/mod.rs"]
mod apiserver;
#[path = "../tests/rig/exposition.rs"]
mod exposition;

mod common;
use common::{cpu_seconds, env_or, status_mib};

use exposition::{buckets, quantile, v4, value};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn service(i: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc-{i}"), "namespace": "bench"},
        "spec": {"clusterIP": format!("172.{}.{}.{}", 16 + i / 65536, (i / 256) % 256, i % 256),
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}})
}

fn slice(i: usize, generation: usize) -> Value {
    let eps: Vec<Value> = (0..10)
        .map(|j| {
            let g = if j == generation % 10 { generation } else { 0 };
            json!({"addresses": [format!("10.{}.{}.{}", (i / 256) % 256, i % 256, (j + 10 * g) % 250 + 1)],
                   "conditions": {"ready": true}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i}-1"), "namespace": "bench",
            "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}], "endpoints": eps})
}

fn scrape(ns: &str) -> String {
    netns::in_netns(ns, || common::http_get("127.0.0.1:10249", "/metrics")).unwrap_or_default()
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("agent_e2e: run with `cargo bench --bench agent_e2e`");
        return;
    }
    let services: usize = env_or("SY_BENCH_SERVICES", 10_000);
    let rate: usize = env_or("SY_BENCH_RATE", 100);
    let seconds: u64 = env_or("SY_BENCH_SECONDS", 60);
    // Not 0s: kube-proxy's defaulting (and so Switchyard's) reads a zero period as unset and
    // puts 1s there, which would hold the syncs to one a second.
    let min_sync: String = env_or("SY_BENCH_MIN_SYNC", "1ms".to_string());
    let sync_period: String = env_or("SY_BENCH_SYNC_PERIOD", "30s".to_string());
    // 1: someone else's commits to a table of their own; 2: to ours, changing nothing (an
    // element added and deleted in one commit), so that every one is checked; 3: to ours,
    // a chain added and deleted in one commit; 4: a set, so that every one is read back.
    let foreign: u8 = env_or("SY_BENCH_FOREIGN", 0u8);
    let log_level: String = env_or("SY_BENCH_LOG", "warn".to_string());
    let bin: String = env_or("SY_BENCH_BIN", env!("CARGO_BIN_EXE_switchyard").to_string());
    let ns = format!("sy-bench-agent-{}", std::process::id());
    if let Err(e) = netns::create_namespace(&ns) {
        println!("SKIP agent_e2e: {e}");
        return;
    }
    let ns2 = ns.clone();
    let api = apiserver::ApiServer::start(move || {
        netns::in_netns(&ns2, || std::net::TcpListener::bind("127.0.0.1:6443")).unwrap()
    });
    for i in 0..services {
        api.apply(service(i));
        api.apply(slice(i, 0));
    }
    api.compact();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(
        &cfg,
        format!("kind: KubeProxyConfiguration\nhostnameOverride: bench\nminSyncPeriod: {min_sync}\nsyncPeriod: {sync_period}\nhealthzBindAddress: 127.0.0.1:10256\n"),
    )
    .unwrap();
    let mut agent = std::process::Command::new("ip")
        .args(["netns", "exec", &ns, &bin, "run"])
        .arg("--config")
        .arg(&cfg)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--log-level")
        .arg(&log_level)
        .spawn()
        .expect("start the agent");
    let started = Instant::now();
    loop {
        let m = scrape(&ns);
        if value(&m, &v4("kubeproxy_sync_proxy_rules_duration_seconds_count")).unwrap_or(0.0) >= 1.0
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no first sync"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let cold = started.elapsed();
    let rss_first = status_mib(agent.id(), "VmRSS:");
    // Sampled within one poll (200 ms) of the first sync; what the sync freed goes back to
    // the kernel within jemalloc's dirty decay (100 ms, `.cargo/config.toml`), and the
    // second reading is well after it.
    std::thread::sleep(Duration::from_secs(2));
    let rss_settled = status_mib(agent.id(), "VmRSS:");
    let before = scrape(&ns);
    let cpu0 = cpu_seconds(agent.id());
    let t0 = Instant::now();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let other = (foreign > 0).then(|| {
        let (ns, stop) = (ns.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut k = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let verb = if k.is_multiple_of(2) { "add" } else { "delete" };
                let command = match foreign {
                    1 => format!("{verb} table ip someone-else"),
                    3 => "add chain ip switchyard someone-elses; delete chain ip switchyard someone-elses".to_string(),
                    4 => "add set ip switchyard someone-elses { type ipv4_addr; }; delete set ip switchyard someone-elses".to_string(),
                    _ => "add element ip switchyard cluster-ips { 192.0.2.1 }; delete element ip switchyard cluster-ips { 192.0.2.1 }".to_string(),
                };
                let _ = std::process::Command::new("ip")
                    .args(["netns", "exec", &ns, "nft", &command])
                    .status();
                k += 1;
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    });
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let total = rate * seconds as usize;
    for k in 0..total {
        let due = t0 + interval * k as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        api.apply(slice((k * 7919) % services, k + 1));
    }
    let elapsed = t0.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(t) = other {
        let _ = t.join();
    }
    std::thread::sleep(Duration::from_secs(2));
    let cpu = cpu_seconds(agent.id()) - cpu0;
    let (rss_end, rss_peak) = (
        status_mib(agent.id(), "VmRSS:"),
        status_mib(agent.id(), "VmHWM:"),
    );
    let after = scrape(&ns);
    let _ = agent.kill();
    let _ = agent.wait();
    drop(api);
    netns::delete_namespace(&ns);

    // The histogram's counts over the run, per bucket: (upper bound, cumulative count).
    let during = |name: &str| -> Vec<(f64, f64)> {
        let b0 = buckets(&before, name);
        buckets(&after, name)
            .into_iter()
            .zip(b0.iter().map(|x| x.1).chain(std::iter::repeat(0.0)))
            .map(|((le, c), c0)| (le, c - c0))
            .collect()
    };
    // Non-empty buckets, for the shape of the tail.
    let spread = |b: &[(f64, f64)]| -> String {
        let mut below = 0.0;
        let mut out = Vec::new();
        for &(le, c) in b {
            if c > below {
                out.push(format!("<={:.0}ms:{}", le * 1000.0, c - below));
            }
            below = c;
        }
        out.join(" ")
    };
    let b1 = during("switchyard_event_to_kernel_seconds");
    let syncs_by_bucket = during("kubeproxy_sync_proxy_rules_duration_seconds");
    let delta =
        |name: &str| value(&after, name).unwrap_or(0.0) - value(&before, name).unwrap_or(0.0);
    let mean_ms = |kind: &str| {
        let n = delta(&v4(&format!(
            "kubeproxy_sync_{kind}proxy_rules_duration_seconds_count"
        )));
        let sum = delta(&v4(&format!(
            "kubeproxy_sync_{kind}proxy_rules_duration_seconds_sum"
        )));
        (n, if n > 0.0 { sum / n * 1000.0 } else { 0.0 })
    };
    let (syncs, mean) = mean_ms("");
    let (full, full_mean) = mean_ms("full_");
    let (partial, partial_mean) = mean_ms("partial_");
    println!(
        "agent_e2e: {services} services x 10 endpoints, {rate} endpoint changes/s for {:.1} s, minSyncPeriod {min_sync}, syncPeriod {sync_period}{}",
        elapsed.as_secs_f64(),
        match foreign {
            0 => "",
            1 => ", a foreign nftables commit every second",
            3 => ", a foreign nftables commit to our table (a chain added and deleted) every second",
            4 => ", a foreign nftables commit to our table (a set added and deleted) every second",
            _ => ", a foreign nftables commit to our table (changing nothing) every second",
        }
    );
    println!(
        "  first sync after start (initial lists + full sync): {:.2} s",
        cold.as_secs_f64()
    );
    println!(
        "  agent RSS: {rss_first:.0} MiB after the first sync ({rss_settled:.0} MiB 2 s later), {rss_end:.0} MiB after {total} changes, peak {rss_peak:.0} MiB"
    );
    println!(
        "  event to kernel: p50 {:.1} ms, p99 {:.1} ms over {} changes",
        quantile(&b1, 0.50) * 1000.0,
        quantile(&b1, 0.99) * 1000.0,
        b1.last().map(|x| x.1).unwrap_or(0.0)
    );
    println!("  event to kernel by bucket: {}", spread(&b1));
    println!("  sync duration by bucket: {}", spread(&syncs_by_bucket));
    let checks_done = delta("switchyard_kernel_check_duration_seconds_count");
    println!(
        "  kernel checks: {} by generation, {} after notifications, {} read back, {} by looking up only what others changed, {checks_done} finished (mean {:.2} s, lookups included); drift repairs: {}",
        delta(r#"switchyard_kernel_checks_total{method="generation"}"#),
        delta(r#"switchyard_kernel_checks_total{method="notification"}"#),
        delta(r#"switchyard_kernel_checks_total{method="read"}"#),
        delta(r#"switchyard_kernel_checks_total{method="lookup"}"#),
        if checks_done > 0.0 {
            delta("switchyard_kernel_check_duration_seconds_sum") / checks_done
        } else {
            0.0
        },
        delta("switchyard_drift_repairs_total"),
    );
    println!(
        "  syncs: {syncs}, mean {mean:.1} ms ({partial} partial, mean {partial_mean:.1} ms; {full} full, mean {full_mean:.1} ms); agent CPU {:.1}% of one core",
        cpu / elapsed.as_secs_f64() * 100.0
    );
}
