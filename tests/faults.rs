//! Fault injection against a running agent: the API server answering 500s, garbage,
//! truncated lists and watch streams, very slow answers and a huge object; the agent killed
//! (SIGKILL) at points spread over a cold sync. Through each, the rules already programmed
//! keep serving, the failures show in the metrics, and once the fault passes the agent
//! converges (a Service created afterwards answers).

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
        let text = metrics();
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
