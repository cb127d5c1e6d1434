//! `switchyard run` as a process on a real kernel in a namespace, fed by manifest files:
//! it programs, follows edits, survives a bad edit, repairs drift on its full syncs,
//! answers health and metrics as kube-proxy does, and leaves the rules on SIGTERM.

#![allow(clippy::expect_used, clippy::unwrap_used)]
#![allow(dead_code)]

#[path = "rig/netns.rs"]
mod netns;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HEALTH: &str = "127.0.0.1:10256";
const METRICS: &str = "127.0.0.1:10249";

fn manifests(endpoint: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{ name: web, namespace: ns }}
spec: {{ clusterIP: 172.30.0.1, ports: [{{ name: http, port: 80 }}] }}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{ name: web-1, namespace: ns, labels: {{ kubernetes.io/service-name: web }} }}
addressType: IPv4
ports: [{{ name: http, port: 8080 }}]
endpoints: [{{ addresses: [{endpoint}] }}]
"#
    )
}

/// Replace a file in one rename, as editors and config management do.
fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A namespace with a running agent; both go away on drop, even when the test fails.
struct Agent {
    ns: String,
    child: Option<Child>,
    log: std::path::PathBuf,
}

impl Agent {
    fn start(tag: &str, dir: &Path) -> Option<Agent> {
        let ns = format!("{}agent-{tag}", netns::unique_prefix());
        if let Err(e) = netns::create_namespace(&ns) {
            assert!(
                std::env::var("SWITCHYARD_REQUIRE_NETNS").as_deref() != Ok("1"),
                "SWITCHYARD_REQUIRE_NETNS=1 but: {e}"
            );
            println!("SKIP {tag}: needs root and network namespaces: {e}");
            return None;
        }
        let cfg = dir.join("kube-proxy.yaml");
        std::fs::write(
            &cfg,
            "kind: KubeProxyConfiguration\napiVersion: kubeproxy.config.k8s.io/v1alpha1\n\
             mode: nftables\nhostnameOverride: node-a\nminSyncPeriod: 100ms\nsyncPeriod: 2s\n\
             healthzBindAddress: 127.0.0.1:10256\nmetricsBindAddress: 127.0.0.1:10249\n",
        )
        .unwrap();
        let log = dir.join("agent.log");
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns,
                env!("CARGO_BIN_EXE_switchyard"),
                "run",
            ])
            .arg("--config")
            .arg(&cfg)
            .arg("--manifests")
            .arg(dir.join("cluster.yaml"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start switchyard run");
        Some(Agent {
            ns,
            child: Some(child),
            log,
        })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn ruleset(&self) -> String {
        netns::run(
            "ip",
            &[
                "netns",
                "exec",
                &self.ns,
                "nft",
                "list",
                "table",
                "ip",
                "switchyard",
            ],
            None,
            netns::CMD_TIMEOUT,
        )
        .stdout
    }

    /// Waits (bounded) until `pred` holds for the ruleset.
    fn wait_ruleset(&self, what: &str, pred: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let rs = self.ruleset();
            if pred(&rs) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}\nruleset:\n{rs}\nagent log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// GET over real TCP inside the namespace: (status, body).
    fn get(&self, addr: &str, path: &str) -> (u16, String) {
        let addr = addr.to_string();
        let path = path.to_string();
        netns::in_netns(&self.ns, move || {
            let mut s = TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(5))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            write!(
                s,
                "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
            )?;
            let mut resp = String::new();
            s.read_to_string(&mut resp)?;
            let status = resp
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let body = resp
                .split_once("\r\n\r\n")
                .map(|(_, b)| b.to_string())
                .unwrap_or_default();
            Ok((status, body))
        })
        .expect("http get in namespace")
    }

    fn metric(&self, text: &str, name: &str) -> f64 {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("metric {name} missing from\n{text}"))
    }

    /// SIGTERM and wait (bounded) for the exit status.
    fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().unwrap();
        // `ip netns exec` execs the agent, so the child's pid is the agent's.
        let ok = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("agent did not exit on SIGTERM\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        netns::delete_namespace(&self.ns);
    }
}

#[test]
fn run_programs_follows_edits_repairs_drift_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster.yaml");
    write_atomically(&cluster, &manifests("10.0.0.1"));
    let Some(mut agent) = Agent::start("edits", dir.path()) else {
        return;
    };
    agent.wait_ruleset("the first sync", |rs| rs.contains("10.0.0.1"));

    let (code, body) = agent.get(HEALTH, "/healthz");
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["nodeEligible"], true);
    assert!(
        v["lastUpdated"].as_str().unwrap().ends_with("+0000 UTC"),
        "{body}"
    );
    assert_eq!(agent.get(HEALTH, "/livez").0, 200);
    assert_eq!(agent.get(HEALTH, "/nope").0, 404);

    // An edit is followed.
    write_atomically(&cluster, &manifests("10.0.0.2"));
    agent.wait_ruleset("the edited endpoint", |rs| {
        rs.contains("10.0.0.2") && !rs.contains("10.0.0.1")
    });

    // A broken edit is reported and the rules keep serving; the next good edit applies.
    write_atomically(&cluster, "kind: Service\nspec: [\n");
    std::thread::sleep(Duration::from_millis(600));
    assert!(agent.ruleset().contains("10.0.0.2"));
    assert!(
        agent.log().contains("previous manifests stay in effect"),
        "{}",
        agent.log()
    );
    write_atomically(&cluster, &manifests("10.0.0.3"));
    agent.wait_ruleset("the fixed endpoint", |rs| rs.contains("10.0.0.3"));

    // Someone deletes our table: the next full sync (syncPeriod 2s) puts it back.
    let del = netns::run(
        "ip",
        &[
            "netns",
            "exec",
            &agent.ns,
            "nft",
            "delete",
            "table",
            "ip",
            "switchyard",
        ],
        None,
        netns::CMD_TIMEOUT,
    );
    assert!(del.success(), "{}", del.transcript());
    agent.wait_ruleset("the drift repair", |rs| rs.contains("10.0.0.3"));

    let (code, text) = agent.get(METRICS, "/metrics");
    assert_eq!(code, 200);
    let syncs = agent.metric(&text, "kubeproxy_sync_proxy_rules_duration_seconds_count");
    assert!(syncs >= 3.0, "{syncs} syncs\n{text}");
    assert!(
        agent.metric(
            &text,
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count"
        ) >= 2.0
    );
    for le in [
        "0.001", "0.002", "0.004", "0.008", "0.016", "0.032", "0.064", "0.128", "0.256", "0.512",
        "1.024", "2.048", "4.096", "8.192", "16.384", "+Inf",
    ] {
        let line = format!("kubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"{le}\"}}");
        assert!(text.contains(&line), "{line} missing");
    }
    assert!(
        agent.metric(&text, "switchyard_drift_repairs_total") >= 1.0,
        "{text}"
    );
    assert!(agent.metric(&text, "kubeproxy_sync_proxy_rules_endpoint_changes_total") >= 3.0);
    assert_eq!(
        agent.metric(&text, "kubeproxy_sync_proxy_rules_endpoint_changes_pending"),
        0.0
    );
    let last = agent.metric(&text, "kubeproxy_sync_proxy_rules_last_timestamp_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((now - last).abs() < 60.0, "last sync {last}, now {now}");
    assert!(agent.metric(&text, "kubeproxy_proxy_healthz_total{code=\"200\"}") >= 1.0);
    assert_eq!(
        agent.metric(
            &text,
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
        ),
        0.0
    );

    // SIGTERM: exit 0 and leave the rules serving.
    let status = agent.terminate();
    assert!(status.success(), "{status:?}\n{}", agent.log());
    assert!(agent.ruleset().contains("10.0.0.3"));
}

#[test]
fn run_refuses_a_bad_bind_address_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster.yaml");
    write_atomically(&cluster, &manifests("10.0.0.1"));
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args([
            "run",
            "--metrics-bind-address",
            "not-an-address",
            "--manifests",
        ])
        .arg(&cluster)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("metricsBindAddress") && err.contains("not-an-address"),
        "{err}"
    );
}
