//! Fault injection against a running agent: the API server answering 500s, garbage,
//! truncated lists and watch streams, very slow answers and a huge object; the agent killed
//! (SIGKILL) at points spread over a cold sync. Through each, the rules already programmed
//! keep serving, the failures show in the metrics, and once the fault passes the agent
//! converges (a Service created afterwards answers). IPVS mode's kills run in the QEMU
//! guest (tests/guest), whose kernel has IPVS.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "rig/netns.rs"]
#[allow(dead_code)]
mod netns;

#[path = "rig/http.rs"]
#[allow(dead_code)]
mod http;

#[allow(dead_code)]
mod apiserver;

mod apinode;

mod guest;

use apinode::{cluster_ip, connect, service, slice, until_answers, LocalNode};
use apiserver::Fault;
use serde_json::json;
use std::time::{Duration, Instant};

const SERVICES: usize = 20;

fn metric_sum(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[test]
fn api_server_faults_leave_the_rules_serving_are_counted_and_pass() {
    let Some(node) = LocalNode::new("faults", SERVICES) else {
        return;
    };
    let agent = node.start_agent(0);
    let log = || std::fs::read_to_string(&agent.log).unwrap_or_default();
    assert!(
        until_answers(node.ns(), cluster_ip(SERVICES - 1), Duration::from_secs(30)).is_some(),
        "the first sync\n{}",
        log()
    );
    let metrics = || {
        http::get(node.ns(), "127.0.0.1:10249", "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
    };
    let mut fresh = SERVICES;
    for fault in [
        Fault::Status500,
        Fault::Garbage,
        Fault::Truncated,
        Fault::Slow(Duration::from_secs(3)),
    ] {
        let text = metrics();
        let errors_before = metric_sum(&text, "switchyard_watch_errors_total", "");
        let requests_before = metric_sum(&text, "rest_client_requests_total", "");
        // Every collection's watch reconnects and meets the faults: a failed one retries, so
        // three times over; a slow one is answered in the end and keeps its watch.
        let n = if matches!(fault, Fault::Slow(_)) {
            4
        } else {
            12
        };
        node.api.inject(fault, n);
        node.api.drop_connections();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut tried = 0;
        while node.api.faults_pending() > 0 {
            assert!(
                Instant::now() < deadline,
                "{fault:?}: the faults were never met\n{}",
                log()
            );
            let to = cluster_ip(tried % SERVICES);
            assert!(
                connect(node.ns(), to, Duration::from_secs(1)),
                "{fault:?}: {to} stopped answering\n{}",
                log()
            );
            tried += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(tried > 0, "{fault:?}: no connection tried during the fault");
        // The fault has passed: a Service created now is programmed.
        fresh += 1;
        node.api.apply(service(fresh));
        node.api.apply(slice(fresh, 0));
        let took = until_answers(node.ns(), cluster_ip(fresh), Duration::from_secs(20));
        assert!(
            took.is_some(),
            "{fault:?}: a new service never answered\n{}",
            log()
        );
        println!(
            "{fault:?}: {tried} connections during it, all answered; a new service answered {:.2} s after",
            took.unwrap().as_secs_f64()
        );
        // A slow answer is counted when it ends, up to 3 s after it met the fault: the
        // new service can answer before the last one has.
        let settle = Instant::now() + Duration::from_secs(10);
        let mut text = metrics();
        while metric_sum(&text, "rest_client_requests_total", "") < requests_before + n as f64
            && Instant::now() < settle
        {
            std::thread::sleep(Duration::from_millis(200));
            text = metrics();
        }
        let errors = metric_sum(&text, "switchyard_watch_errors_total", "");
        let requests = metric_sum(&text, "rest_client_requests_total", "");
        match fault {
            // A failed request is a watch error.
            Fault::Status500 | Fault::Garbage => {
                assert!(
                    errors > errors_before,
                    "{fault:?}: no watch error counted\n{text}"
                )
            }
            // A watch stream cut short ends that watch, as in client-go: kube's watcher
            // starts the next one without an error, so the count is of the requests.
            Fault::Truncated | Fault::Slow(_) => assert!(
                requests >= requests_before + n as f64,
                "{fault:?}: {requests} requests, {requests_before} before\n{text}"
            ),
        }
    }
    let text = metrics();
    assert!(
        metric_sum(&text, "rest_client_requests_total", "code=\"500\"") >= 1.0,
        "the 500s are not in rest_client_requests_total:\n{text}"
    );

    // A huge object (1.4 MiB of annotations, near the API server's request limit) is taken
    // like any other, and the rest keep serving.
    fresh += 1;
    let mut big = service(fresh);
    big["metadata"]["annotations"] = json!({"example.com/blob": "x".repeat(1_400_000)});
    node.api.apply(big);
    node.api.apply(slice(fresh, 1));
    assert!(
        until_answers(node.ns(), cluster_ip(fresh), Duration::from_secs(20)).is_some(),
        "the huge service never answered\n{}",
        log()
    );
    assert!(connect(node.ns(), cluster_ip(0), Duration::from_secs(1)));
}

/// Services `range` in namespace `ns`, each with one slice, as one `kind: List` manifest.
fn manifest(ns: &str, range: std::ops::Range<usize>) -> String {
    let mut items = Vec::new();
    for i in range {
        let mut s = service(i);
        s["metadata"]["namespace"] = json!(ns);
        let mut e = slice(i, i);
        e["metadata"]["namespace"] = json!(ns);
        items.push(s);
        items.push(e);
    }
    json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

/// How many of a sample of `range`'s services answer.
fn answering(ns: &str, range: std::ops::Range<usize>) -> (usize, usize) {
    let step = (range.len() / 12).max(1);
    let sample: Vec<usize> = range.clone().step_by(step).chain([range.end - 1]).collect();
    let ok = sample
        .iter()
        .filter(|i| connect(ns, cluster_ip(**i), Duration::from_millis(100)))
        .count();
    (ok, sample.len())
}

/// A node, a configuration for `mode`, and the two clusters of a kill test: A programmed by
/// `sync --once`, B by an agent started so as to be killed.
struct ColdSync<'a> {
    node: &'a LocalNode,
    cfg: std::path::PathBuf,
    a: std::path::PathBuf,
    b: std::path::PathBuf,
}

impl<'a> ColdSync<'a> {
    fn new(
        node: &'a LocalNode,
        mode: &str,
        a: std::path::PathBuf,
        b: std::path::PathBuf,
    ) -> ColdSync<'a> {
        let cfg = node.dir.path().join("kill.yaml");
        std::fs::write(
            &cfg,
            format!(
                "kind: KubeProxyConfiguration\napiVersion: kubeproxy.config.k8s.io/v1alpha1\n\
                 mode: {mode}\nhostnameOverride: node-a\nminSyncPeriod: 0s\nsyncPeriod: 30s\n\
                 healthzBindAddress: \"\"\nmetricsBindAddress: \"\"\n"
            ),
        )
        .unwrap();
        ColdSync { node, cfg, a, b }
    }

    /// `sync --once --full` of A, then every sampled service of `a` must answer. Within a
    /// minute and a half: in the IPVS guest (emulated, beside the other guests on two
    /// cores) it took over the usual 15 s bound in two full test runs in a row on one
    /// machine.
    fn program_a(&self, a: &std::ops::Range<usize>) {
        let out = self.node.node.exec_within(
            Duration::from_secs(90),
            env!("CARGO_BIN_EXE_switchyard"),
            &[
                "sync",
                "--once",
                "--full",
                "--config",
                self.cfg.to_str().unwrap(),
                "--manifests",
                self.a.to_str().unwrap(),
            ],
        );
        assert!(out.success(), "{}", out.transcript());
        assert_eq!(
            answering(self.node.ns(), a.clone()),
            answering_all(a),
            "A after sync --once"
        );
    }

    /// `switchyard run` on B, its log in `kill-<n>.log`.
    fn start_b(&self, n: usize) -> (std::process::Child, std::path::PathBuf) {
        let log = self.node.dir.path().join(format!("kill-{n}.log"));
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", self.node.ns()])
            .args([env!("CARGO_BIN_EXE_switchyard"), "run", "--config"])
            .arg(&self.cfg)
            .arg("--manifests")
            .arg(&self.b)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        (child, log)
    }
}

/// SIGKILL at points spread over a cold sync that replaces one cluster (A) by a larger one
/// (B): after each kill the node serves A whole or B whole, never a mix or nothing, and an
/// agent started again converges on B. nftables mode commits one transaction (written whole
/// to a file before nft reads it); iptables mode one restore per family.
fn killed_during_a_cold_sync(mode: &str) {
    let Some(node) = LocalNode::new(&format!("kill{}", &mode[..3]), 0) else {
        return;
    };
    let ns = node.ns().to_string();
    let dir = node.dir.path();
    let (a, b) = (0..100, 1000..4000);
    std::fs::write(dir.join("a.json"), manifest("a", a.clone())).unwrap();
    std::fs::write(dir.join("b.json"), manifest("b", b.clone())).unwrap();
    let run = ColdSync::new(&node, mode, dir.join("a.json"), dir.join("b.json"));
    let program_a = || run.program_a(&a);
    let start_b = |n: usize| run.start_b(n);
    // How long the cold sync from A to B takes, uninterrupted.
    program_a();
    let t0 = Instant::now();
    let (mut child, log) = start_b(0);
    let done = until_answers(&ns, cluster_ip(b.end - 1), Duration::from_secs(120));
    let cold = t0.elapsed();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        done.is_some(),
        "B never programmed\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    println!("{mode}: cold sync A -> B in {:.2} s", cold.as_secs_f64());

    let mut outcomes = Vec::new();
    for k in 1..=5u32 {
        program_a();
        let (mut child, log) = start_b(k as usize);
        std::thread::sleep(cold * k / 6);
        let _ = child.kill();
        let _ = child.wait();
        // Whatever the agent had started (nft reading its file, a restore) ends by itself.
        std::thread::sleep(Duration::from_millis(500));
        let (on_a, on_b) = (answering(&ns, a.clone()), answering(&ns, b.clone()));
        let whole_a = on_a == answering_all(&a) && on_b.0 == 0;
        let whole_b = on_b == answering_all(&b) && on_a.0 == 0;
        outcomes.push(format!(
            "kill at {}/6: A {}/{}, B {}/{}",
            k, on_a.0, on_a.1, on_b.0, on_b.1
        ));
        assert!(
            whole_a || whole_b,
            "{mode}: after a kill at {k}/6 of the cold sync, A answers {on_a:?} and B {on_b:?}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    println!("{mode}: {outcomes:?}");
    // Started again, the agent converges on B.
    let (mut child, log) = start_b(9);
    let converged = until_answers(&ns, cluster_ip(b.end - 1), Duration::from_secs(120));
    let on_a = answering(&ns, a.clone());
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        converged.is_some() && on_a.0 == 0,
        "{mode}: no convergence on B (A {on_a:?})\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

/// Every sampled service of `range` answering.
fn answering_all(range: &std::ops::Range<usize>) -> (usize, usize) {
    let n = range.clone().step_by((range.len() / 12).max(1)).count() + 1;
    (n, n)
}

#[test]
fn nftables_killed_during_a_cold_sync_serves_the_old_rules_or_the_new_whole() {
    killed_during_a_cold_sync("nftables");
}

#[test]
fn iptables_killed_during_a_cold_sync_serves_the_old_rules_or_the_new_whole() {
    killed_during_a_cold_sync("iptables");
}

/// Twenty minutes: the agent's start alone took 28 to 115 s in the emulated guest beside
/// the other guests (one start, then five more, one per kill), and one full test run ended
/// at the old 600 s bound after the first start took 92 s. Alone (2026-12-07, 292 s in
/// all), the first start's log (printed by the guest test) read: "ipvs mode" 0.7 s after
/// its first line, the iptables back end detected at 2.5 s, "agent started" (B's 1,240
/// services read from their manifests and converted, by a debug build under emulation) at
/// 23.9 s; the kernel's table first changed 36.5 s after the start and held B at 38.1 s.
/// On the host the same debug build reads 1,000 services x 10 in 0.42 s.
#[test]
fn ipvs_killed_during_a_cold_sync_in_guest() {
    guest::test_in_guest(
        "guest_ipvs_killed_during_a_cold_sync",
        &[],
        Duration::from_secs(1200),
    );
}

/// IPVS mode has no transaction: the kernel takes a sync one netlink message at a time,
/// so a kill leaves some of the new services and some of the old (as kube-proxy's would).
/// What it guarantees, killed at points spread over a cold sync from cluster A to cluster
/// B that share the services of namespace `keep`: those never stop answering, whatever the
/// kill interrupted, and an agent started again converges on B exactly (A's gone).
#[test]
#[ignore = "runs inside the QEMU guest, through ipvs_killed_during_a_cold_sync_in_guest"]
fn guest_ipvs_killed_during_a_cold_sync() {
    guest::require_guest();
    let node = LocalNode::new("killipvs", 0).expect("a namespace in the guest");
    let ns = node.ns().to_string();
    let dir = node.dir.path();
    let (keep, a, b) = (0..40, 100..140, 1000..2200);
    for (name, parts) in [
        ("a", [("keep", &keep), ("a", &a)]),
        ("b", [("keep", &keep), ("b", &b)]),
    ] {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for (namespace, range) in parts {
            std::fs::write(
                d.join(format!("{namespace}.json")),
                manifest(namespace, range.clone()),
            )
            .unwrap();
        }
    }
    let run = ColdSync::new(&node, "ipvs", dir.join("a"), dir.join("b"));
    let program_a = || run.program_a(&a);
    let start_b = |n: usize| run.start_b(n);
    // How many virtual services the kernel holds (one port per service).
    let virtual_services = || {
        netns::in_netns(&ns, || {
            let mut s = dataplane::ipvs::genl::IpvsSocket::open().map_err(std::io::Error::other)?;
            s.services().map(|v| v.len()).map_err(std::io::Error::other)
        })
        .unwrap()
    };
    program_a();
    assert_eq!(answering(&ns, keep.clone()), answering_all(&keep));
    // When the kernel's table starts to change and when it holds B: the window to kill in
    // (the agent's start and its reading of the manifests come before it).
    let t0 = Instant::now();
    let (mut child, log) = start_b(0);
    let (mut first, mut last) = (None, None);
    while t0.elapsed() < Duration::from_secs(300) && last.is_none() {
        let n = virtual_services();
        if n != keep.len() + a.len() && first.is_none() {
            first = Some(t0.elapsed());
        }
        if n == keep.len() + b.len() {
            last = Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = child.kill();
    let _ = child.wait();
    let (Some(first), Some(last)) = (first, last) else {
        panic!(
            "B never programmed\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    };
    println!(
        "ipvs: the kernel's table changed from {:.2} s to {:.2} s after the start; its log:\n{}",
        first.as_secs_f64(),
        last.as_secs_f64(),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let mut outcomes = Vec::new();
    for k in 1..=5u32 {
        program_a();
        let (mut child, log) = start_b(k as usize);
        // From the moment this run's first change shows: start-up time varies more than
        // the window lasts.
        let t = Instant::now();
        while virtual_services() == keep.len() + a.len() && t.elapsed() < Duration::from_secs(300) {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep((last - first) * (k - 1) / 5);
        let _ = child.kill();
        let _ = child.wait();
        let held = virtual_services();
        let (on_keep, on_a, on_b) = (
            answering(&ns, keep.clone()),
            answering(&ns, a.clone()),
            answering(&ns, b.clone()),
        );
        outcomes.push(format!(
            "kill at {}/5 of the window ({held} virtual services): keep {}/{}, A {}/{}, B {}/{}",
            k - 1,
            on_keep.0,
            on_keep.1,
            on_a.0,
            on_a.1,
            on_b.0,
            on_b.1
        ));
        assert_eq!(
            on_keep,
            answering_all(&keep),
            "ipvs: after a kill at {}/5 of the cold sync, the services A and B share stopped\n{}",
            k - 1,
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    println!("ipvs: {outcomes:?}");
    let (mut child, log) = start_b(9);
    let converged = until_answers(&ns, cluster_ip(b.end - 1), Duration::from_secs(300));
    // The last service answering is not all of B: wait for the sync to finish whole.
    let t = Instant::now();
    while answering(&ns, b.clone()) != answering_all(&b) && t.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let (on_keep, on_a, on_b) = (
        answering(&ns, keep.clone()),
        answering(&ns, a.clone()),
        answering(&ns, b.clone()),
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        converged.is_some()
            && on_b == answering_all(&b)
            && on_keep == answering_all(&keep)
            && on_a.0 == 0,
        "ipvs: no convergence on B (keep {on_keep:?}, A {on_a:?}, B {on_b:?})\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}
