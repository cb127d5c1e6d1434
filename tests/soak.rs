//! The soak: `switchyard run` (nftables mode) on the fixture API server in a network
//! namespace, with services under steady endpoint churn, a client opening connections to
//! random services all along, and faults on a cadence: the agent killed (SIGKILL) and
//! started again, the API server stopped for a while, the whole ruleset flushed by someone
//! else. It asserts what the agent promises: no connection fails except in the moment
//! between a flush and its repair, each fault is recovered from within a bound (a new
//! service answers, or the flushed rules are back), and the agent's memory does not climb.
//! A handshake that conntrack shows DNATed to a serving pod but answered only after the
//! client's timeout (a SYN delayed or lost past our rules on a loaded machine) is reported
//! apart and bounded; one that met no rule fails the soak.
//!
//! CI runs 3 minutes at 1,000 services and 50 changes per second on the debug build. The
//! documented run (README, "Reliability") is 30 minutes at 10,000 services on the release
//! build:
//! `SWITCHYARD_SOAK_SECS=1800 SWITCHYARD_SOAK_SERVICES=10000 cargo test --release --test soak -- --nocapture`.
//! Faults come every 2 min (kill), 3 min (flush) and 5 min (API server, 10 s) in a run of 30
//! minutes or more; a shorter run scales those intervals by its length over 10 minutes.
//! The report is printed and written to `target/soak-report.json`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "rig/netns.rs"]
#[allow(dead_code)]
mod netns;

#[allow(dead_code)]
mod apiserver;

mod apinode;
use apinode::traced::{connect_traced, Failure, Unanswered};
use apinode::{cluster_ip, service, slice, until_answers, Agent, PODS};

/// When a connection began (seconds into the soak) and what failed, if anything.
type Connection = (f64, Result<(), Failure>);

use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Least-squares slope of (seconds, MiB), in MiB per minute.
fn slope_per_minute(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (mx, my) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx * 60.0
    }
}

/// The agents' log lines (every `agent-<n>.log` in `dir`) stamped within `around` seconds
/// of one of the instants `at` (seconds since the UNIX epoch): what the agent did when a
/// connection failed, which the whole log's tail rarely shows.
fn log_near(dir: &std::path::Path, at: &[f64], around: f64) -> String {
    // A line begins "2026-12-07T10:20:14.160553Z": compared by its second of the day.
    let second_of_day = |line: &str| -> Option<f64> {
        let clock = line.get(11..)?.split('Z').next()?;
        let mut parts = clock.split(':');
        let h: f64 = parts.next()?.parse().ok()?;
        let m: f64 = parts.next()?.parse().ok()?;
        let s: f64 = parts.next()?.parse().ok()?;
        Some(h * 3600.0 + m * 60.0 + s)
    };
    let near = |sod: f64| {
        at.iter().any(|t| {
            let d = (sod - t.rem_euclid(86_400.0)).abs();
            d.min(86_400.0 - d) <= around
        })
    };
    let mut logs: Vec<(usize, std::path::PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let n = name
                .strip_prefix("agent-")?
                .strip_suffix(".log")?
                .parse()
                .ok()?;
            Some((n, e.path()))
        })
        .collect();
    logs.sort();
    let mut out = String::new();
    for (n, path) in logs {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for line in text.lines().filter(|l| second_of_day(l).is_some_and(near)) {
            out.push_str(&format!("agent-{n}: {line}\n"));
        }
    }
    out
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    Kill,
    Flush,
    ApiOutage,
}

#[test]
fn soak_under_churn_kills_outages_and_flushes() {
    let secs = env_or("SWITCHYARD_SOAK_SECS", 180);
    let services = env_or("SWITCHYARD_SOAK_SERVICES", 1000) as usize;
    let rate = env_or("SWITCHYARD_SOAK_RATE", 50);
    let Some(local) = apinode::LocalNode::new("soak", services) else {
        return;
    };
    let (ns, api, dir, node) = (
        local.ns().to_string(),
        local.api.clone(),
        local.dir.path(),
        &local.node,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let mut agents = 0;
    let mut agent = Agent::start(&ns, dir, agents);
    let first = until_answers(&ns, cluster_ip(services - 1), Duration::from_secs(120));
    assert!(
        first.is_some(),
        "the first sync never made the last service answer\n{}",
        std::fs::read_to_string(&agent.log).unwrap_or_default()
    );
    println!(
        "soak: {services} services, first sync answered after {:.2} s; {secs} s at {rate} changes/s",
        first.unwrap().as_secs_f64()
    );

    // Churn and the client run on their own threads for the whole soak.
    let t0 = Instant::now();
    // The same instant on the clock the agents' log lines carry.
    let wall0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let changes = Arc::new(AtomicU64::new(0));
    let churn = {
        let (api, stop, changes) = (api.clone(), stop.clone(), changes.clone());
        std::thread::spawn(move || {
            let interval = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
            let mut k = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let i = (k * 7919) % services;
                api.apply(slice(i, i + k / services + 1));
                changes.fetch_add(1, Ordering::Relaxed);
                k += 1;
                std::thread::sleep(interval);
            }
        })
    };
    // (seconds since t0, what failed) of every connection.
    let outcomes: Arc<Mutex<Vec<Connection>>> = Arc::default();
    let client = {
        let (ns, stop, outcomes) = (ns.clone(), stop.clone(), outcomes.clone());
        std::thread::spawn(move || {
            let mut k = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let to = cluster_ip((k * 104_729) % services);
                let at = t0.elapsed().as_secs_f64();
                let result = connect_traced(&ns, to, Duration::from_millis(500));
                outcomes.lock().unwrap().push((at, result));
                k += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };

    // The fault plan.
    let scale = if secs >= 1800 {
        1.0
    } else {
        secs as f64 / 600.0
    };
    let every = |base: f64| (base * scale).max(20.0);
    let outage = (10.0 * scale.min(1.0)).max(3.0);
    let mut plan: Vec<(f64, Fault)> = Vec::new();
    for (fault, base, offset) in [
        (Fault::Kill, 120.0, 0.0),
        (Fault::Flush, 180.0, 0.3),
        (Fault::ApiOutage, 300.0, 0.6),
    ] {
        let step = every(base);
        let mut at = step * (1.0 + offset) / 2.0;
        while at + outage + 5.0 < secs as f64 {
            plan.push((at, fault));
            at += step;
        }
    }
    plan.sort_by(|a, b| a.0.total_cmp(&b.0));

    let mut rss: Vec<(f64, f64)> = Vec::new();
    let mut flush_windows: Vec<(f64, f64)> = Vec::new();
    let mut recoveries: Vec<Value> = Vec::new();
    let mut failed_recoveries: Vec<String> = Vec::new();
    let mut marker = services;
    let mut fresh_service = |api: &apiserver::ApiServer| {
        marker += 1;
        api.apply(service(marker));
        api.apply(slice(marker, 0));
        cluster_ip(marker)
    };
    let mut next = plan.into_iter().peekable();
    while t0.elapsed().as_secs() < secs {
        if let Some(m) = agent.rss_mib() {
            rss.push((t0.elapsed().as_secs_f64(), m));
        }
        let due = next
            .peek()
            .is_some_and(|(at, _)| t0.elapsed().as_secs_f64() >= *at);
        if !due {
            std::thread::sleep(Duration::from_millis(500));
            continue;
        }
        let (_, fault) = next.next().unwrap();
        let at = t0.elapsed().as_secs_f64();
        let took = match fault {
            Fault::Kill => {
                agent.kill9();
                agents += 1;
                agent = Agent::start(&ns, dir, agents);
                // Recovered when a service created after the restart answers.
                let ip = fresh_service(&api);
                until_answers(&ns, ip, Duration::from_secs(60))
            }
            Fault::Flush => {
                let out = node.exec("nft", &["flush", "ruleset"]);
                assert!(out.success(), "{}", out.transcript());
                let r = until_answers(&ns, cluster_ip(0), Duration::from_secs(30));
                flush_windows.push((at, t0.elapsed().as_secs_f64()));
                r
            }
            Fault::ApiOutage => {
                api.stop();
                std::thread::sleep(Duration::from_secs_f64(outage));
                // Made while the server was away; applied once it is back.
                let ip = fresh_service(&api);
                api.resume();
                until_answers(&ns, ip, Duration::from_secs(60))
            }
        };
        let what = format!("{fault:?} at {at:.0} s");
        match took {
            Some(d) => recoveries.push(json!({"fault": format!("{fault:?}"), "at_s": at,
                "recovered_s": d.as_secs_f64()})),
            None => failed_recoveries.push(what),
        }
    }
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap();
    client.join().unwrap();

    let outcomes = outcomes.lock().unwrap().clone();
    // A connection begun in the moment between a flush and its repair has no rules to meet.
    let in_flush = |t: f64| {
        flush_windows
            .iter()
            .any(|(a, b)| t >= *a - 0.6 && t <= *b + 0.6)
    };
    // Outside the flush windows every connection must be answered. One whose handshake
    // outlived its timeout is ours to answer for unless conntrack shows our rules DNATed it
    // to a serving pod and it was answered late (a SYN or its answer delayed or lost past
    // the rules, as on this loaded 2-core machine); those are counted and bounded apart.
    let beyond_rules = |r: &Result<(), Failure>| match r {
        Err(Failure::Unanswered(u)) => u.dnat_to_one_of(&PODS, 8080) && u.answered_after.is_some(),
        _ => false,
    };
    let outside: Vec<&Connection> = outcomes
        .iter()
        .filter(|(t, r)| r.is_err() && !in_flush(*t))
        .collect();
    let (late, failed): (Vec<&Connection>, Vec<&Connection>) =
        outside.into_iter().partition(|c| beyond_rules(&c.1));
    let describe = |cs: &[&Connection]| -> Vec<String> {
        cs.iter()
            .map(|c| match &c.1 {
                Err(e) => format!("{:.3} s: {e}", c.0),
                Ok(()) => String::new(),
            })
            .collect()
    };
    // When each happened, on the clock of the agents' log lines.
    let wall = |cs: &[&Connection]| -> Vec<f64> { cs.iter().map(|c| wall0 + c.0).collect() };
    let (failed_at, late_at) = (wall(&failed), wall(&late));
    let (failed, late) = (describe(&failed), describe(&late));
    let during_flush = outcomes
        .iter()
        .filter(|(t, r)| r.is_err() && in_flush(*t))
        .count();
    // Memory over the last agent's life, from 10 s after its start.
    let last_start = recoveries
        .iter()
        .filter(|r| r["fault"] == "Kill")
        .map(|r| r["at_s"].as_f64().unwrap())
        .fold(0.0, f64::max);
    let last_life: Vec<(f64, f64)> = rss
        .iter()
        .copied()
        .filter(|(t, _)| *t > last_start + 10.0)
        .collect();
    let slope = slope_per_minute(&last_life);
    let worst = |f: &str| {
        recoveries
            .iter()
            .filter(|r| r["fault"] == f)
            .map(|r| r["recovered_s"].as_f64().unwrap())
            .fold(0.0, f64::max)
    };
    let report = json!({
        "seconds": secs, "services": services, "changes_per_s": rate,
        "changes": changes.load(Ordering::Relaxed),
        "connections": outcomes.len(),
        "failed_outside_flush_windows": failed.len(),
        "dnat_to_a_pod_but_answered_late": late,
        "failed_during_flush_windows": during_flush,
        "recoveries": recoveries,
        "worst_recovery_s": {"kill": worst("Kill"), "flush": worst("Flush"), "api_outage": worst("ApiOutage")},
        "rss_mib": {"first": rss.first().map(|r| r.1), "last": rss.last().map(|r| r.1),
            "max": rss.iter().map(|r| r.1).fold(0.0, f64::max),
            "slope_mib_per_min_last_life": slope},
    });
    let text = serde_json::to_string_pretty(&report).unwrap();
    println!("{text}");
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/soak-report.json");
    let _ = std::fs::write(out, &text);

    let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
    assert!(
        failed_recoveries.is_empty(),
        "not recovered: {failed_recoveries:?}\n{log}"
    );
    assert!(
        failed.is_empty(),
        "{} of {} connections failed outside the flush windows: {:?}\n{text}\n\
         the agents' log within 2 s of each:\n{}",
        failed.len(),
        outcomes.len(),
        &failed[..failed.len().min(20)],
        log_near(dir, &failed_at, 2.0)
    );
    assert!(
        late.len() * 1000 <= outcomes.len(),
        "more than one connection in 1,000 was answered late: {text}\n\
         the agents' log within 2 s of each:\n{}",
        log_near(dir, &late_at, 2.0)
    );
    assert!(
        outcomes.len() > secs as usize * 10,
        "too few connections: {text}"
    );
    // A flush is repaired within a second and a half (the commit notification starts the
    // repair at once; under churn the full sync may wait for minSyncPeriod, 1 s, after the
    // last partial one). A change made while the API server was away is applied within the
    // watch's reconnect (at most 1 s) plus minSyncPeriod. A restarted agent serves a new
    // service within its start-up and a cold sync.
    assert!(worst("Flush") <= 1.5, "{text}");
    assert!(worst("ApiOutage") <= 2.5, "{text}");
    assert!(worst("Kill") <= 10.0, "{text}");
    // A climb is what a leak looks like; RSS falling as the allocator returns the cold
    // sync's memory is not (the 30-minute run at 10k measured -15.3 MiB/min there).
    assert!(slope <= 5.0, "memory climbs: {slope:.2} MiB/min\n{text}");
}

/// The soak's client, on a connection that timed out, asks conntrack what became of it: one
/// that met no rule keeps the service address as its reply source (a failure of ours); one
/// DNATed to a serving pod whose answer was held back is named as such, and as answered
/// late once the SYN's retransmission gets through. No agent runs here; the rules are
/// written by hand.
#[test]
fn a_timed_out_connection_is_named_by_what_conntrack_shows() {
    let Some(local) = apinode::LocalNode::new("traced", 1) else {
        return;
    };
    let (ns, to) = (local.ns().to_string(), cluster_ip(0));
    let nft = |script: &str| {
        let out = local.node.exec("nft", &[script]);
        assert!(out.success(), "{}", out.transcript());
    };
    // A NAT chain with no rule, and a rule that asks conntrack (so that it follows every
    // flow, as under the agent's rules): nothing is translated.
    nft(
        "add table ip t; add chain ip t out { type nat hook output priority -100; }; \
         add chain ip t seen { type filter hook output priority -10; }; \
         add rule ip t seen ct state new counter",
    );
    let unanswered = |timeout_ms| match connect_traced(&ns, to, Duration::from_millis(timeout_ms)) {
        Err(Failure::Unanswered(u)) => u,
        other => panic!("{other:?}"),
    };
    let missed: Unanswered = unanswered(200);
    assert!(!missed.dnat_to_one_of(&PODS, 8080), "{missed:?}");
    assert_eq!(missed.dnat, Some((to, 80).into()), "{missed:?}");
    assert!(missed.conntrack.contains("SYN_SENT"), "{missed:?}");
    assert_eq!(missed.answered_after, None);

    // DNATed to a pod, its SYN-ACK dropped for 700 ms: the retransmission at 1 s is answered.
    // (Without the first flow's entry, which a reused port would meet untranslated.)
    let flushed = local.node.exec("conntrack", &["-F"]);
    assert!(flushed.success(), "{}", flushed.transcript());
    nft(&format!(
        "add rule ip t out ip daddr {to} tcp dport 80 dnat to {}:8080; \
         add chain ip t filter {{ type filter hook output priority 0; }}; \
         add rule ip t filter tcp flags & (syn | ack) == syn | ack drop",
        PODS[1]
    ));
    let lift = std::thread::spawn({
        let ns = ns.clone();
        move || {
            std::thread::sleep(Duration::from_millis(700));
            let args = ["netns", "exec", &ns, "nft", "flush chain ip t filter"];
            netns::run("ip", &args, None, netns::CMD_TIMEOUT)
        }
    });
    let late = unanswered(200);
    let lifted = lift.join().unwrap();
    assert!(lifted.success(), "{}", lifted.transcript());
    assert!(late.dnat_to_one_of(&PODS, 8080), "{late:?}");
    let after = late
        .answered_after
        .expect("answered after the retransmission");
    assert!(after >= Duration::from_millis(700), "{late:?}");
}
