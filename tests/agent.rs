//! `switchyard run` as a process on a real kernel in a namespace, fed by manifest files:
//! it programs, follows edits, survives a bad edit, repairs drift on its full syncs,
//! answers health and metrics as kube-proxy does, and leaves the rules on SIGTERM.

#![allow(clippy::expect_used, clippy::unwrap_used)]
#![allow(dead_code)]

#[path = "rig/netns.rs"]
mod netns;

#[path = "rig/exposition.rs"]
mod exposition;

#[path = "rig/http.rs"]
mod http;

mod apiserver;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

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
    /// A command the agent runs under, inside the namespace (`prlimit --nofile=...`).
    wrapper: Vec<String>,
    /// More environment for the agent.
    env: Vec<(&'static str, String)>,
    /// `mode` and `syncPeriod` of the agent's configuration.
    mode: &'static str,
    sync_period: &'static str,
    /// More lines of the agent's configuration.
    config_extra: &'static str,
}

impl Agent {
    fn start(tag: &str, dir: &Path) -> Option<Agent> {
        let mut agent = Agent::namespace(tag)?;
        let manifests = dir.join("cluster.yaml");
        agent.spawn(dir, &["--manifests".as_ref(), manifests.as_os_str()]);
        Some(agent)
    }

    /// Faults injected into the agent through the file `dir/faults` (SWITCHYARD_FAULTS),
    /// while it exists; its path.
    fn faults_file(&mut self, dir: &Path) -> std::path::PathBuf {
        let faults = dir.join("faults");
        self.env
            .push(("SWITCHYARD_FAULTS", faults.to_string_lossy().into_owned()));
        faults
    }

    /// A namespace for an agent not started yet; `None` (a skip) without root.
    fn namespace(tag: &str) -> Option<Agent> {
        let ns = netns::create_or_skip(&format!("agent-{tag}"))?;
        Some(Agent {
            ns,
            child: None,
            log: std::path::PathBuf::new(),
            wrapper: Vec::new(),
            env: Vec::new(),
            mode: "nftables",
            sync_period: "2s",
            config_extra: "",
        })
    }

    fn spawn(&mut self, dir: &Path, source: &[&std::ffi::OsStr]) {
        let ns = self.ns.clone();
        let cfg = dir.join("kube-proxy.yaml");
        std::fs::write(
            &cfg,
            format!(
                "kind: KubeProxyConfiguration\napiVersion: kubeproxy.config.k8s.io/v1alpha1\n\
                 mode: {}\nhostnameOverride: node-a\nminSyncPeriod: 100ms\nsyncPeriod: {}\n\
                 healthzBindAddress: 127.0.0.1:10256\nmetricsBindAddress: 127.0.0.1:10249\n{}",
                self.mode, self.sync_period, self.config_extra
            ),
        )
        .unwrap();
        let log = dir.join("agent.log");
        let mut cmd = Command::new("ip");
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let child = cmd
            .args(["netns", "exec", &ns])
            .args(&self.wrapper)
            .args([env!("CARGO_BIN_EXE_switchyard"), "run"])
            .arg("--config")
            .arg(&cfg)
            .args(source)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start switchyard run");
        self.child = Some(child);
        self.log = log;
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

    /// `iptables-save` (iptables-nft, what a fresh node uses) in the namespace.
    fn iptables_save(&self) -> String {
        let out = netns::run(
            "ip",
            &["netns", "exec", &self.ns, "iptables-nft-save"],
            None,
            netns::CMD_TIMEOUT,
        );
        assert!(out.success(), "{}", out.transcript());
        out.stdout
    }

    /// Runs a command in the namespace and asserts it succeeded.
    fn must(&self, program: &str, args: &[&str]) {
        let mut all = vec!["netns", "exec", &self.ns, program];
        all.extend_from_slice(args);
        let out = netns::run("ip", &all, None, netns::CMD_TIMEOUT);
        assert!(out.success(), "{}", out.transcript());
    }

    /// Waits (bounded) until `pred` holds for the ruleset (the iptables rules in iptables
    /// mode).
    fn wait_ruleset(&self, what: &str, pred: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let rs = if self.mode == "iptables" {
                self.iptables_save()
            } else {
                self.ruleset()
            };
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
        self.try_get(addr, path).expect("http get in namespace")
    }

    fn try_get(&self, addr: &str, path: &str) -> std::io::Result<(u16, String)> {
        http::get(&self.ns, addr, path)
    }

    /// Waits (bounded) until metric `name` reaches `min`; returns that scrape. A change
    /// lands in the kernel a moment before the agent books its sync.
    fn wait_metric(&self, name: &str, min: f64) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (_, text) = self.get(METRICS, "/metrics");
            if exposition::value(&text, name).is_some_and(|v| v >= min) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "{name} never reached {min}\n{text}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn metric(&self, text: &str, name: &str) -> f64 {
        exposition::value(text, name)
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

    // With nobody else committing to nftables, the periodic check (syncPeriod 2s) needs no
    // read: the kernel's generation moved only by our own commits.
    let by_generation = r#"switchyard_kernel_checks_total{method="generation"}"#;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, text) = agent.get(METRICS, "/metrics");
        if exposition::value(&text, by_generation).unwrap_or(0.0) >= 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no periodic check by generation\n{text}\nagent log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

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

    agent.wait_metric("switchyard_drift_repairs_total", 1.0);
    let (code, text) = agent.get(METRICS, "/metrics");
    assert_eq!(code, 200);
    let syncs = agent.metric(
        &text,
        &exposition::v4("kubeproxy_sync_proxy_rules_duration_seconds_count"),
    );
    assert!(syncs >= 3.0, "{syncs} syncs\n{text}");
    assert!(
        agent.metric(
            &text,
            &exposition::v4("kubeproxy_sync_full_proxy_rules_duration_seconds_count")
        ) >= 2.0
    );
    for le in [
        "0.001", "0.002", "0.004", "0.008", "0.016", "0.032", "0.064", "0.128", "0.256", "0.512",
        "1.024", "2.048", "4.096", "8.192", "16.384", "+Inf",
    ] {
        let line = format!(
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{{ip_family=\"IPv4\",le=\"{le}\"}}"
        );
        assert!(text.contains(&line), "{line} missing");
    }
    assert!(
        agent.metric(&text, "switchyard_drift_repairs_total") >= 1.0,
        "{text}"
    );
    // The deletion moved the generation, so the periodic check read the kernel back (in
    // the background) and found it.
    assert!(
        agent.metric(&text, "switchyard_kernel_check_duration_seconds_count") >= 1.0,
        "{text}"
    );
    assert!(
        agent.metric(&text, r#"switchyard_kernel_checks_total{method="read"}"#) >= 1.0,
        "{text}"
    );
    assert!(agent.metric(&text, "kubeproxy_sync_proxy_rules_endpoint_changes_total") >= 3.0);
    assert_eq!(
        agent.metric(&text, "kubeproxy_sync_proxy_rules_endpoint_changes_pending"),
        0.0
    );
    let last = agent.metric(
        &text,
        &exposition::v4("kubeproxy_sync_proxy_rules_last_timestamp_seconds"),
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((now - last).abs() < 60.0, "last sync {last}, now {now}");
    assert!(agent.metric(&text, "kubeproxy_proxy_healthz_total{code=\"200\"}") >= 1.0);
    assert_eq!(
        agent.metric(
            &text,
            &exposition::v4("kubeproxy_sync_proxy_rules_nftables_sync_failures_total")
        ),
        0.0
    );

    // SIGTERM: exit 0 and leave the rules serving.
    let status = agent.terminate();
    assert!(status.success(), "{status:?}\n{}", agent.log());
    assert!(agent.ruleset().contains("10.0.0.3"));
}

/// iptables mode: the agent follows edits with partial restores, finds flushed chains by
/// their canary between full syncs (syncPeriod 1h here) and repairs them, and exports the
/// iptables metrics.
#[test]
fn run_in_iptables_mode_follows_edits_and_repairs_flushed_chains() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster.yaml");
    write_atomically(&cluster, &manifests("10.0.0.1"));
    let Some(mut agent) = Agent::namespace("iptables") else {
        return;
    };
    agent.mode = "iptables";
    agent.sync_period = "1h";
    agent.spawn(dir.path(), &["--manifests".as_ref(), cluster.as_os_str()]);
    agent.wait_ruleset("the first sync", |rs| {
        rs.contains("--to-destination 10.0.0.1:8080")
    });
    write_atomically(&cluster, &manifests("10.0.0.2"));
    agent.wait_ruleset("the edited endpoint", |rs| {
        rs.contains("--to-destination 10.0.0.2:8080") && !rs.contains("10.0.0.1")
    });
    let (_, text) = agent.get(METRICS, "/metrics");
    assert!(
        agent.metric(
            &text,
            &exposition::v4("kubeproxy_sync_partial_proxy_rules_duration_seconds_count")
        ) >= 1.0,
        "the edit was a partial sync\n{text}"
    );
    assert!(
        agent.metric(
            &text,
            r#"kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv4",table="nat"}"#
        ) >= 8.0,
        "{text}"
    );

    // Someone flushes and deletes every chain of the nat table, as `iptables -t nat -F; -X`.
    agent.must("iptables-nft", &["-t", "nat", "-F"]);
    agent.must("iptables-nft", &["-t", "nat", "-X"]);
    assert!(!agent.iptables_save().contains("KUBE-SVC-"));
    agent.wait_ruleset("the repair after the canary vanished", |rs| {
        rs.contains("--to-destination 10.0.0.2:8080")
            && rs.contains("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES")
    });
    let text = agent.wait_metric("switchyard_drift_repairs_total", 1.0);
    assert_eq!(
        agent.metric(
            &text,
            &exposition::v4("kubeproxy_sync_proxy_rules_iptables_restore_failures_total")
        ),
        0.0
    );
    // The jumps from the built-in chains are there once, after all of that.
    let rs = agent.iptables_save();
    assert_eq!(
        rs.matches(
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
        )
        .count(),
        1,
        "{rs}"
    );
    let status = agent.terminate();
    assert!(status.success(), "{status:?}\n{}", agent.log());
    assert!(agent
        .iptables_save()
        .contains("--to-destination 10.0.0.2:8080"));
}

/// A LoadBalancer service with externalTrafficPolicy Local and its health-check node port,
/// one endpoint on `endpoint_node`; `None` leaves the service out.
fn health_check_manifests(endpoint_node: Option<&str>) -> String {
    let node = r#"
apiVersion: v1
kind: Node
metadata: { name: node-a }
status: { addresses: [{ type: InternalIP, address: 192.168.77.2 }] }
"#;
    let Some(on) = endpoint_node else {
        return node.to_string();
    };
    format!(
        r#"{node}---
apiVersion: v1
kind: Service
metadata: {{ name: lb, namespace: shop }}
spec:
  type: LoadBalancer
  clusterIP: 172.30.0.5
  externalTrafficPolicy: Local
  healthCheckNodePort: 30555
  ports: [{{ name: http, port: 80, nodePort: 30080 }}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{ name: lb-1, namespace: shop, labels: {{ kubernetes.io/service-name: lb }} }}
addressType: IPv4
ports: [{{ name: http, port: 8080 }}]
endpoints: [{{ addresses: [10.0.0.1], nodeName: {on} }}]
"#
    )
}

type Answer = std::io::Result<(u16, String)>;

/// The health-check node port answers as kube-proxy's (200 or 503 with its JSON), only on
/// the node addresses inside nodePortAddresses (the primary one by default), follows the
/// local endpoints, and closes when the service goes.
#[test]
fn health_check_node_ports_follow_local_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster.yaml");
    write_atomically(&cluster, &health_check_manifests(Some("node-a")));
    let Some(mut agent) = Agent::namespace("hcnp") else {
        return;
    };
    agent.must("ip", &["addr", "add", "192.168.77.2/32", "dev", "lo"]);
    agent.spawn(dir.path(), &["--manifests".as_ref(), cluster.as_os_str()]);
    let hc = "192.168.77.2:30555";
    let wait = |what: &str, pred: &dyn Fn(&Answer) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let got = agent.try_get(hc, "/any/path");
            if pred(&got) {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: last {got:?}\n{}",
                agent.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let (status, body) = wait("200", &|r| matches!(r, Ok((200, _)))).unwrap();
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).expect("JSON body");
    assert_eq!(
        v,
        json!({"service": {"namespace": "shop", "name": "lb"}, "localEndpoints": 1, "serviceProxyHealthy": true})
    );
    assert!(
        agent.try_get("127.0.0.1:30555", "/").is_err(),
        "only the node address inside nodePortAddresses listens"
    );

    write_atomically(&cluster, &health_check_manifests(Some("node-b")));
    let (_, body) = wait("503", &|r| matches!(r, Ok((503, _)))).unwrap();
    let v: Value = serde_json::from_str(&body).expect("JSON body");
    assert_eq!(v["localEndpoints"], 0);
    assert_eq!(v["serviceProxyHealthy"], true);

    write_atomically(&cluster, &health_check_manifests(None));
    let closed = wait("the port to close", &|r| r.is_err());
    assert!(closed.is_err());
    let status = agent.terminate();
    assert!(status.success(), "{status:?}\n{}", agent.log());
}

/// `switchyard status` beside a running agent shows what it programs and its health; with
/// no agent there, it fails naming the address it tried.
#[test]
fn status_shows_what_a_running_agent_programs() {
    let dir = tempfile::tempdir().unwrap();
    write_atomically(&dir.path().join("cluster.yaml"), &manifests("10.0.0.1"));
    let Some(agent) = Agent::start("status", dir.path()) else {
        return;
    };
    agent.wait_ruleset("the first sync", |rs| rs.contains("10.0.0.1"));
    agent.wait_metric(
        &exposition::v4("kubeproxy_sync_proxy_rules_duration_seconds_count"),
        1.0,
    );
    let run = |args: &[&str]| {
        let mut all = vec![
            "netns",
            "exec",
            &agent.ns,
            env!("CARGO_BIN_EXE_switchyard"),
            "status",
        ];
        all.extend_from_slice(args);
        netns::run("ip", &all, None, netns::CMD_TIMEOUT)
    };
    let out = run(&[]);
    assert!(out.success(), "{}", out.transcript());
    let row = |name: &str| -> String {
        out.stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row:\n{}", out.stdout))
            .trim_start_matches(name)
            .trim()
            .to_string()
    };
    assert_eq!(row("service ports"), "1");
    assert_eq!(row("endpoints"), "1");
    assert!(row("health").starts_with("healthy"), "{}", out.stdout);
    assert!(row("last sync").ends_with("s ago"), "{}", out.stdout);
    assert_eq!(row("sync failures"), "none");
    let bad = run(&["--metrics-address", "127.0.0.1:1"]);
    assert!(!bad.success());
    assert!(
        bad.stderr.contains("--metrics-address"),
        "{}",
        bad.transcript()
    );
}

/// `switchyard trace` against a live cluster (the fixture API server over real HTTP): it
/// lists what the agent would watch, once, and traces on it.
#[test]
fn trace_against_a_live_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let api = apiserver::ApiServer::start(|| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    api.apply(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.10"}]}}));
    api.apply(service("web", "172.30.0.1", json!({})));
    api.apply(slice("web", &["10.1.0.1", "10.1.0.2"]));
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["trace", "--hostname-override", "node-a", "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["--from", "10.9.0.1", "--to", "172.30.0.1:80/TCP", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verdict"], "DNAT", "{v}");
    let eps: Vec<&str> = v["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["endpoint"].as_str().unwrap())
        .collect();
    assert_eq!(eps, ["10.1.0.1:8080", "10.1.0.2:8080"], "{v}");
    assert_eq!(v["endpoints"][0]["probability"], 0.5);

    // For a node the cluster does not have, it says so instead of tracing on guesses.
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["trace", "--hostname-override", "node-z", "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["--from", "10.9.0.1", "--to", "172.30.0.1:80/TCP"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("node-z") && err.contains("--hostname-override"),
        "{err}"
    );
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

fn service(name: &str, ip: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "ns", "labels": labels},
        "spec": {"clusterIP": ip, "ports": [{"name": "http", "port": 80}]}})
}

fn slice(service: &str, endpoints: &[&str]) -> Value {
    let eps: Vec<Value> = endpoints
        .iter()
        .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-1"), "namespace": "ns",
            "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}], "endpoints": eps})
}

#[test]
fn run_against_the_api_server_follows_watches_and_survives_outages() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut agent) = Agent::namespace("api") else {
        return;
    };
    let ns = agent.ns.clone();
    let api = apiserver::ApiServer::start(move || {
        netns::in_netns(&ns, || std::net::TcpListener::bind("127.0.0.1:6443")).unwrap()
    });
    api.apply(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.10"}]}}));
    api.apply(service("web", "172.30.0.1", json!({})));
    api.apply(slice("web", &["10.1.0.1"]));
    // Not ours: kube-proxy's label selector leaves them out on the server side.
    api.apply(service(
        "other",
        "172.30.0.99",
        json!({"service.kubernetes.io/service-proxy-name": "other"}),
    ));
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
    agent.spawn(
        dir.path(),
        &["--kubeconfig".as_ref(), kubeconfig.as_os_str()],
    );

    agent.wait_ruleset("the first sync from the API server", |rs| {
        rs.contains("10.1.0.1") && rs.contains("172.30.0.1")
    });
    assert!(!agent.ruleset().contains("172.30.0.99"));
    let reqs = api.requests();
    assert!(
        reqs.iter().any(|r| r.starts_with("/api/v1/services?")
            && r.contains("labelSelector=%21service.kubernetes.io%2Fservice-proxy-name")),
        "{reqs:?}"
    );
    assert!(
        reqs.iter()
            .any(|r| r.starts_with("/api/v1/nodes?") && r.contains("metadata.name%3Dnode-a")),
        "{reqs:?}"
    );

    // Scale up: the watch carries it.
    api.apply(slice("web", &["10.1.0.1", "10.1.0.2"]));
    agent.wait_ruleset("the scaled endpoints", |rs| rs.contains("10.1.0.2"));

    // Dropped watch connections: the client re-watches and keeps following.
    api.drop_connections();
    api.apply(slice("web", &["10.1.0.3"]));
    agent.wait_ruleset("a change after dropped watches", |rs| {
        rs.contains("10.1.0.3") && !rs.contains("10.1.0.1")
    });

    // The API server goes away; changes made meanwhile apply when it is back, even though
    // its history was compacted (the watch gets 410 Gone and relists).
    api.stop();
    api.apply(slice("web", &["10.1.0.4"]));
    api.apply(service("db", "172.30.0.2", json!({})));
    api.compact();
    std::thread::sleep(Duration::from_secs(2));
    let rs = agent.ruleset();
    assert!(
        rs.contains("10.1.0.3") && !rs.contains("172.30.0.2"),
        "{rs}"
    );
    assert_eq!(agent.get(HEALTH, "/healthz").0, 200);
    api.resume();
    agent.wait_ruleset("the changes made during the outage", |rs| {
        rs.contains("10.1.0.4") && rs.contains("172.30.0.2") && !rs.contains("10.1.0.3")
    });

    // Deleting a service removes it.
    api.delete("Service", "ns", "db");
    agent.wait_ruleset("the deleted service gone", |rs| !rs.contains("172.30.0.2"));

    // The autoscaler marks the node for deletion: /healthz fails (load balancers drain the
    // node), /livez does not (the agent must not be restarted for it).
    api.apply(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a"},
        "spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.10"}]}}));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (code, body) = agent.get(HEALTH, "/healthz");
        if code == 503 {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["nodeEligible"], false, "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "healthz stayed {code}: {body}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(agent.get(HEALTH, "/livez").0, 200);

    let (_, text) = agent.get(METRICS, "/metrics");
    assert!(
        text.contains("switchyard_watch_errors_total{kind=\""),
        "{text}"
    );
    assert!(agent.metric(&text, "kubeproxy_proxy_healthz_total{code=\"503\"}") >= 1.0);
    assert!(agent.metric(&text, "kubeproxy_sync_proxy_rules_service_changes_total") >= 2.0);
    let status = agent.terminate();
    assert!(status.success(), "{status:?}\n{}", agent.log());
}

/// Lists are streaming watches (`sendInitialEvents`), as client-go's are in kube-proxy v1.37
/// with its WatchListClient gate on by default: no LIST request at all. An API server that
/// refuses them (kube-apiserver with its WatchList gate off answers 422) gets LISTs instead
/// and the node is programmed all the same; `featureGates: {WatchListClient: false}` lists
/// page by page from the start, as kube-proxy does with that gate off.
#[test]
fn lists_are_streaming_watches_with_a_fallback_and_a_gate() {
    for case in ["streaming", "refused", "gate-off"] {
        let dir = tempfile::tempdir().unwrap();
        let Some(mut agent) = Agent::namespace(&format!("wl-{case}")) else {
            return;
        };
        let ns = agent.ns.clone();
        let api = apiserver::ApiServer::start(move || {
            netns::in_netns(&ns, || std::net::TcpListener::bind("127.0.0.1:6443")).unwrap()
        });
        if case == "refused" {
            api.refuse_streaming_lists();
        }
        if case == "gate-off" {
            agent.config_extra = "featureGates:\n  WatchListClient: false\n";
        }
        api.apply(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "node-a"},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.10"}]}}));
        api.apply(service("web", "172.30.0.1", json!({})));
        api.apply(slice("web", &["10.1.0.1"]));
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
        agent.spawn(
            dir.path(),
            &["--kubeconfig".as_ref(), kubeconfig.as_os_str()],
        );
        agent.wait_ruleset(&format!("{case}: the first sync"), |rs| {
            rs.contains("10.1.0.1") && rs.contains("172.30.0.1")
        });
        // And the watch that follows the list carries a change.
        api.apply(slice("web", &["10.1.0.2"]));
        agent.wait_ruleset(&format!("{case}: a change"), |rs| {
            rs.contains("10.1.0.2") && !rs.contains("10.1.0.1")
        });

        let reqs = api.requests();
        let of = |prefix: &str| -> Vec<&String> {
            reqs.iter().filter(|r| r.starts_with(prefix)).collect()
        };
        for collection in [
            "/api/v1/services?",
            "/apis/discovery.k8s.io/v1/endpointslices?",
        ] {
            let all = of(collection);
            let lists = all.iter().filter(|r| !r.contains("watch=true")).count();
            let streamed = all
                .iter()
                .filter(|r| r.contains("watch=true") && r.contains("sendInitialEvents=true"))
                .count();
            match case {
                "streaming" => {
                    assert_eq!(lists, 0, "{case} {collection}: {all:?}");
                    assert!(streamed >= 1, "{case} {collection}: {all:?}");
                }
                "refused" => {
                    assert!(streamed >= 1 && lists >= 1, "{case} {collection}: {all:?}");
                }
                _ => {
                    assert_eq!(streamed, 0, "{case} {collection}: {all:?}");
                    assert!(lists >= 1, "{case} {collection}: {all:?}");
                }
            }
        }
        let log = agent.log();
        assert_eq!(
            log.contains("refused a streaming list"),
            case == "refused",
            "{case}: {log}"
        );
        let status = agent.terminate();
        assert!(status.success(), "{case}: {status:?}\n{}", agent.log());
    }
}

#[test]
fn healthz_and_livez_fail_while_a_queued_update_goes_stale() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut agent) = Agent::namespace("stale") else {
        return;
    };
    // The kernel refuses every commit while `broken` exists (SWITCHYARD_FAULTS): it keeps
    // its rules, syncs fail and are retried, and the queued update ages past the health
    // timeout (twice syncPeriod: 4 s here).
    let broken = agent.faults_file(dir.path());
    let cluster = dir.path().join("cluster.yaml");
    write_atomically(&cluster, &manifests("10.0.0.1"));
    agent.spawn(dir.path(), &["--manifests".as_ref(), cluster.as_os_str()]);
    agent.wait_ruleset("the first sync", |rs| rs.contains("10.0.0.1"));
    assert_eq!(agent.get(HEALTH, "/healthz").0, 200);

    std::fs::write(&broken, "nf_tables-batch EPERM\n").unwrap();
    // Two endpoints: a new load-balancing chain.
    write_atomically(
        &cluster,
        &manifests("10.0.0.2").replace(
            "endpoints: [{ addresses: [10.0.0.2] }]",
            "endpoints: [{ addresses: [10.0.0.2] }, { addresses: [10.0.0.3] }]",
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, body) = agent.get(HEALTH, "/healthz");
        if code == 503 {
            let v: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["nodeEligible"], true, "{body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "healthz stayed {code}: {body}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        agent.get(HEALTH, "/livez").0,
        503,
        "livez fails on a stale queue too"
    );
    let rs = agent.ruleset();
    assert!(
        rs.contains("10.0.0.1") && !rs.contains("10.0.0.2"),
        "the old rules keep serving:\n{rs}"
    );
    let (_, text) = agent.get(METRICS, "/metrics");
    assert!(
        agent.metric(
            &text,
            &exposition::v4("kubeproxy_sync_proxy_rules_nftables_sync_failures_total")
        ) >= 1.0
    );

    // The kernel takes commits again: the retry commits the update and both endpoints
    // recover.
    std::fs::remove_file(&broken).unwrap();
    agent.wait_ruleset("the update after recovery", |rs| rs.contains("10.0.0.2"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while agent.get(HEALTH, "/healthz").0 != 200 || agent.get(HEALTH, "/livez").0 != 200 {
        assert!(
            Instant::now() < deadline,
            "health did not recover\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
/// A Prometheus server started inside a namespace; killed on drop.
struct Prometheus {
    child: Child,
    log: std::path::PathBuf,
}

impl Prometheus {
    const ADDR: &'static str = "127.0.0.1:9090";

    /// `None` (a skip) where Prometheus is not installed, unless CI requires every real part.
    fn start(ns: &str, dir: &Path, target: &str) -> Option<Prometheus> {
        let Some(bin) = which("prometheus") else {
            assert!(
                std::env::var("SWITCHYARD_REQUIRE_NETNS").as_deref() != Ok("1"),
                "SWITCHYARD_REQUIRE_NETNS=1 but prometheus is not on PATH"
            );
            println!("SKIP: prometheus is not installed");
            return None;
        };
        let cfg = dir.join("prometheus.yml");
        std::fs::write(
            &cfg,
            format!(
                "global: {{ scrape_interval: 1s, scrape_timeout: 1s }}\n\
                 scrape_configs:\n\
                 - job_name: switchyard\n  static_configs: [{{ targets: ['{target}'] }}]\n"
            ),
        )
        .unwrap();
        let log = dir.join("prometheus.log");
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(bin)
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={}", Self::ADDR))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start prometheus");
        Some(Prometheus { child, log })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

#[test]
fn a_real_prometheus_scrapes_the_kube_proxy_metrics() {
    let dir = tempfile::tempdir().unwrap();
    write_atomically(&dir.path().join("cluster.yaml"), &manifests("10.0.0.1"));
    let Some(agent) = Agent::start("prometheus", dir.path()) else {
        return;
    };
    agent.wait_ruleset("the first sync", |rs| rs.contains("10.0.0.1"));
    let Some(prom) = Prometheus::start(&agent.ns, dir.path(), METRICS) else {
        return;
    };

    // Instant queries over Prometheus's HTTP API, until it has scraped at least twice.
    let query = |q: &str| -> Value {
        let q: String = q
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        // Refused until Prometheus listens.
        let Ok((200, body)) = agent.try_get(Prometheus::ADDR, &format!("/api/v1/query?query={q}"))
        else {
            return Value::Null;
        };
        serde_json::from_str(&body).unwrap_or(Value::Null)
    };
    let series = |v: &Value| v["data"]["result"].as_array().cloned().unwrap_or_default();
    let sample = |s: &Value| -> f64 { s["value"][1].as_str().unwrap().parse().unwrap() };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let up = series(&query("up"));
        let samples = series(&query("scrape_samples_scraped"));
        if up.len() == 1 && sample(&up[0]) == 1.0 && !samples.is_empty() {
            let count = series(&query("count_over_time(up[1m])"));
            if count.len() == 1 && sample(&count[0]) >= 2.0 {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "prometheus never scraped the agent successfully twice; up = {up:?}\n\
             prometheus log:\n{}\nagent log:\n{}",
            prom.log(),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // The histogram arrives with kube-proxy's buckets, parsed by Prometheus itself.
    let buckets = series(&query(
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\"}",
    ));
    let mut les: Vec<String> = buckets
        .iter()
        .map(|s| s["metric"]["le"].as_str().unwrap().to_string())
        .collect();
    les.sort_by(|a, b| {
        let f = |x: &str| x.parse::<f64>().unwrap_or(f64::INFINITY);
        f(a).total_cmp(&f(b))
    });
    assert_eq!(
        les,
        [
            "0.001", "0.002", "0.004", "0.008", "0.016", "0.032", "0.064", "0.128", "0.256",
            "0.512", "1.024", "2.048", "4.096", "8.192", "16.384", "+Inf"
        ]
    );
    // One series per IP family the node serves, as kube-proxy's per-family proxiers.
    let syncs = series(&query("kubeproxy_sync_proxy_rules_duration_seconds_count"));
    let families: std::collections::BTreeSet<&str> = syncs
        .iter()
        .map(|s| s["metric"]["ip_family"].as_str().unwrap_or("none"))
        .collect();
    assert!(
        families.contains("IPv4") && families.iter().all(|f| ["IPv4", "IPv6"].contains(f)),
        "{syncs:?}"
    );
    assert_eq!(syncs.len(), families.len(), "{syncs:?}");
    assert!(syncs.iter().all(|s| sample(s) >= 1.0), "{syncs:?}");
    // A quantile the way a dashboard asks for it.
    let p99 = series(&query(
        "histogram_quantile(0.99, sum by (le) (kubeproxy_sync_proxy_rules_duration_seconds_bucket))",
    ));
    assert_eq!(p99.len(), 1, "{p99:?}");
    let p99 = sample(&p99[0]);
    assert!(p99 > 0.0 && p99 <= 16.384, "p99 {p99}");
    // The quantile as the dashboard and the alerts ask for it: over a rate, which needs
    // syncs between scrapes. Edits make them, until Prometheus has seen some.
    let rate_p99 =
        "histogram_quantile(0.99, sum by (le) (rate(kubeproxy_sync_proxy_rules_duration_seconds_bucket[1m])))";
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut edit = 0u32;
    let p99 = loop {
        edit += 1;
        write_atomically(
            &dir.path().join("cluster.yaml"),
            &manifests(&format!("10.0.1.{}", edit % 200 + 1)),
        );
        std::thread::sleep(Duration::from_millis(400));
        let got = series(&query(rate_p99));
        let value = got
            .first()
            .and_then(|s| s["value"][1].as_str()?.parse::<f64>().ok());
        if let Some(v) = value.filter(|v| v.is_finite()) {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "{rate_p99} never had a value: {got:?}\n{}",
            agent.log()
        );
    };
    assert!(p99 > 0.0 && p99 <= 16.384, "rate p99 {p99}");
    // The gauge an alert on stale rules uses, within a minute of now.
    let last = series(&query(
        "max(kubeproxy_sync_proxy_rules_last_timestamp_seconds)",
    ));
    assert_eq!(last.len(), 1, "{last:?}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((now - sample(&last[0])).abs() < 60.0, "{last:?}");
    // Process metrics from the same endpoint.
    let rss = series(&query("process_resident_memory_bytes"));
    assert!(!rss.is_empty() && sample(&rss[0]) > 0.0, "{rss:?}");
}

/// Descriptors the process `pid` has open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Reads each socket until the other side closes it, or until `deadline`: how long each
/// stayed open after `opened` (`None`: still open).
fn watch_closes(socks: Vec<(TcpStream, Instant)>, deadline: Instant) -> Vec<Option<Duration>> {
    for (s, _) in &socks {
        s.set_nonblocking(true).unwrap();
    }
    let mut closed = vec![None; socks.len()];
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline && closed.iter().any(Option::is_none) {
        for (i, (s, opened)) in socks.iter().enumerate() {
            if closed[i].is_some() {
                continue;
            }
            match (&*s).read(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Ok(n) if n > 0 => {}
                // The end of the stream, or a reset.
                _ => closed[i] = Some(opened.elapsed()),
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    closed
}

/// Issue 25: 1,100 silent connections to :10256 took every descriptor of an agent limited to
/// 1,024 open files, and every later sync failed. Here the agent runs with 256, and more
/// connections than that are held to healthz, metrics and a health-check node port each:
/// an edit is still programmed at once, the probes still answer at once (each new
/// connection takes the place of the quietest), and the server closes the silent
/// connections after the header-read timeout (shortened by the test-only variable).
#[test]
fn http_flood_of_idle_connections_starves_neither_syncs_nor_probes() {
    const LIMIT: u64 = 256;
    const FLOOD: usize = 300;
    const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
    if which("prlimit").is_none() {
        assert!(
            std::env::var("SWITCHYARD_REQUIRE_NETNS").as_deref() != Ok("1"),
            "prlimit (util-linux) is missing"
        );
        println!("SKIP: needs prlimit (util-linux)");
        return;
    }
    // The test holds three floods itself.
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster.yaml");
    let both = |endpoint: &str| {
        format!(
            "{}---{}",
            manifests(endpoint),
            health_check_manifests(Some("node-a"))
        )
    };
    write_atomically(&cluster, &both("10.0.0.1"));
    let Some(mut agent) = Agent::namespace("flood") else {
        return;
    };
    agent.must("ip", &["addr", "add", "192.168.77.2/32", "dev", "lo"]);
    agent.wrapper = vec!["prlimit".into(), format!("--nofile={LIMIT}:{LIMIT}")];
    agent.env = vec![(
        "SWITCHYARD_HTTP_HEADER_TIMEOUT_MS",
        HEADER_TIMEOUT.as_millis().to_string(),
    )];
    agent.spawn(dir.path(), &["--manifests".as_ref(), cluster.as_os_str()]);
    let hc = "192.168.77.2:30555";
    agent.wait_ruleset("the first sync", |rs| rs.contains("10.0.0.1"));
    let deadline = Instant::now() + Duration::from_secs(15);
    while !matches!(agent.try_get(hc, "/"), Ok((200, _))) {
        assert!(
            Instant::now() < deadline,
            "no health-check port\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = agent.child.as_ref().unwrap().id();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    assert!(
        limits.lines().any(|l| l.starts_with("Max open files")
            && l.split_whitespace()
                .filter(|w| *w == LIMIT.to_string())
                .count()
                == 2),
        "{limits}"
    );
    assert!(
        agent.log().contains(&format!("open files limit {LIMIT}")),
        "{}",
        agent.log()
    );
    let before = open_fds(pid);

    // More silent connections to each server than the agent may open files at all, in
    // turns, so that all three pools are full when the probes come.
    let targets = [HEALTH, METRICS, hc];
    let started = Instant::now();
    let (socks, refused) = netns::in_netns(&agent.ns, move || {
        let mut all: Vec<(usize, TcpStream, Instant)> = Vec::new();
        // A burst can overflow a listener's backlog (128) while the agent closes connections
        // to make room; the kernel drops the SYN and the client sends it again after a
        // second, as any client does. A server that stops accepting is another matter: a
        // few connects that time out and the flood of that server is over.
        let mut refused = [0usize; 3];
        for _ in 0..FLOOD {
            for (t, addr) in targets.iter().enumerate() {
                if refused[t] >= 3 {
                    continue;
                }
                let addr = addr.parse().unwrap();
                match TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
                    Ok(s) => all.push((t, s, Instant::now())),
                    Err(_) => refused[t] += 1,
                }
            }
        }
        Ok((all, refused))
    })
    .expect("flood connections");
    let flooded = started.elapsed();
    let labels: Vec<usize> = socks.iter().map(|(t, _, _)| *t).collect();
    let watch_until = Instant::now() + HEADER_TIMEOUT + Duration::from_secs(5);
    let watcher = std::thread::spawn(move || {
        watch_closes(
            socks.into_iter().map(|(_, s, at)| (s, at)).collect(),
            watch_until,
        )
    });
    let mut most_fds = open_fds(pid);

    // (b) The probes answer at once, each through a full pool.
    let mut probes = Vec::new();
    for (addr, path) in [
        (HEALTH, "/livez"),
        (HEALTH, "/healthz"),
        (METRICS, "/metrics"),
        (hc, "/"),
    ] {
        let t = Instant::now();
        let (code, body) = agent.get(addr, path);
        let took = t.elapsed();
        assert_eq!(code, 200, "{addr}{path}: {body}\n{}", agent.log());
        assert!(took < Duration::from_secs(1), "{addr}{path} took {took:?}");
        probes.push(format!("{path} {took:?}"));
        most_fds = most_fds.max(open_fds(pid));
    }

    // (a) An edit reaches the kernel within a second (the issue's bound): the sync path has
    // its descriptors. Without the bounds every sync fails here until the connections go
    // (5 s). Measured 0.1-0.65 s, the manifest poll being 200 ms.
    let t = Instant::now();
    write_atomically(&cluster, &both("10.0.0.2"));
    let programmed = loop {
        if agent.ruleset().contains("10.0.0.2") {
            break t.elapsed();
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the edit was not programmed\n{}",
            agent.log()
        );
        most_fds = most_fds.max(open_fds(pid));
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        programmed < Duration::from_secs(1),
        "programmed after {programmed:?}"
    );

    // (c) The server closes every silent connection: the newest ones after the header-read
    // timeout, the older ones before, to make room for newer ones.
    let closed = watcher.join().unwrap();
    let mut summary = Vec::new();
    for (t, addr) in targets.iter().enumerate() {
        let mine: Vec<Option<Duration>> = labels
            .iter()
            .zip(&closed)
            .filter(|(l, _)| **l == t)
            .map(|(_, c)| *c)
            .collect();
        assert_eq!(mine.len(), FLOOD, "{addr}: {} connects failed", refused[t]);
        let open = mine.iter().filter(|c| c.is_none()).count();
        assert_eq!(open, 0, "{addr}: {open} connections never closed");
        let timed_out: Vec<Duration> = mine
            .iter()
            .flatten()
            .copied()
            .filter(|d| *d >= HEADER_TIMEOUT.mul_f64(0.8))
            .collect();
        let latest = timed_out.iter().max().copied().unwrap_or_default();
        assert!(
            !timed_out.is_empty(),
            "{addr}: none was held to the timeout"
        );
        assert!(
            latest < HEADER_TIMEOUT + Duration::from_secs(2),
            "{addr}: one was held {latest:?}"
        );
        summary.push(format!(
            "{addr}: {} closed to make room, {} at the timeout (latest {latest:?})",
            FLOOD - timed_out.len(),
            timed_out.len()
        ));
    }
    // The reserve for the sync path (half the limit, here) was never touched.
    assert!(
        most_fds <= (LIMIT / 2) as usize,
        "{most_fds} descriptors open under a limit of {LIMIT}"
    );
    let log = agent.log();
    assert!(!log.contains("Too many open files"), "{log}");
    let (_, text) = agent.get(METRICS, "/metrics");
    assert!(
        !text.contains("switchyard_sync_failures_total{"),
        "a sync failed\n{text}\n{log}"
    );
    eprintln!(
        "flood of {FLOOD} x 3 in {flooded:?}; agent descriptors {before} before, at most {most_fds} during; probes {}; edit programmed in {programmed:?}; {}",
        probes.join(", "),
        summary.join("; ")
    );
    let status = agent.terminate();
    assert!(status.success(), "{status:?}\n{}", agent.log());
}

/// Rewrite a file in place (same inode), as `echo > file` or an editor without backups does.
fn write_in_place(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

#[test]
fn fifos_and_symlink_loops_in_the_manifests_neither_wedge_nor_spin_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("manifests");
    std::fs::create_dir_all(m.join("sub")).unwrap();
    let cluster = m.join("sub").join("cluster.yaml");
    std::fs::write(&cluster, manifests("10.0.0.1")).unwrap();
    nix::unistd::mkfifo(&m.join("pipe.yaml"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    std::os::unix::fs::symlink(".", m.join("loop")).unwrap();
    let Some(mut agent) = Agent::namespace("hostile-files") else {
        return;
    };
    agent.spawn(dir.path(), &["--manifests".as_ref(), m.as_os_str()]);
    agent.wait_ruleset("the first sync", |rs| rs.contains("10.0.0.1"));
    assert_eq!(agent.get(HEALTH, "/livez").0, 200);

    // An edit in place of a file in a subdirectory is noticed.
    write_in_place(&cluster, &manifests("10.0.0.22"));
    agent.wait_ruleset("the edit in a subdirectory", |rs| rs.contains("10.0.0.22"));

    // A broken file beside it: reported once, the rules keep serving, health stays up.
    let broken = m.join("broken.yaml");
    std::fs::write(&broken, "kind: Service\nspec: [\n").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(agent.get(HEALTH, "/livez").0, 200);
    assert!(agent.ruleset().contains("10.0.0.22"));
    let log = agent.log();
    assert_eq!(
        log.matches("previous manifests stay in effect").count(),
        1,
        "{log}"
    );
    std::fs::remove_file(&broken).unwrap();
    write_in_place(&cluster, &manifests("10.0.0.3"));
    agent.wait_ruleset("the edit after the broken file went", |rs| {
        rs.contains("10.0.0.3")
    });

    // Each skipped entry is warned about once, not at every look.
    let log = agent.log();
    assert_eq!(
        log.matches("pipe.yaml: skipped: a FIFO").count(),
        1,
        "{log}"
    );
    assert_eq!(log.matches("loop: skipped").count(), 1, "{log}");
    assert_eq!(agent.get(HEALTH, "/livez").0, 200);
    assert!(agent.terminate().success(), "{}", agent.log());
}

/// A firewall reload (`nft flush ruleset`) takes our tables away. The agent hears the
/// commit on nf_tables' notification group and repairs within a second, with a syncPeriod
/// of an hour: no periodic check could have done it.
#[test]
fn a_flushed_ruleset_is_repaired_within_a_second_without_waiting_for_the_period() {
    let Some((_dir, agent)) = agent_after_first_sync("flush", Vec::new()) else {
        return;
    };
    let flush = netns::run(
        "ip",
        &["netns", "exec", &agent.ns, "nft", "flush", "ruleset"],
        None,
        netns::CMD_TIMEOUT,
    );
    assert!(flush.success(), "{}", flush.transcript());
    let flushed = Instant::now();
    loop {
        if agent.ruleset().contains("10.0.0.1") {
            break;
        }
        assert!(
            flushed.elapsed() < Duration::from_secs(1),
            "not repaired within a second of the flush\nagent log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (_, text) = agent.get(METRICS, "/metrics");
    assert!(
        exposition::value(
            &text,
            r#"switchyard_kernel_checks_total{method="notification"}"#
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{text}"
    );
}

/// Our first backends slot, as `nft list` prints it, for the one-endpoint manifests.
const SLOT: &str = "172.30.0.1 . tcp . 80 . 0 : 10.0.0.1 . 8080";

/// `switchyard run` on one manifest (endpoint 10.0.0.1) with syncPeriod an hour and `env`,
/// in a namespace of its own named after `tag`, once its first sync is in and its first
/// check has settled (our own commits accounted for); `None` (a skip) without root.
fn agent_after_first_sync(
    tag: &str,
    env: Vec<(&'static str, String)>,
) -> Option<(tempfile::TempDir, Agent)> {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster.yaml");
    write_atomically(&cluster, &manifests("10.0.0.1"));
    let mut agent = Agent::namespace(tag)?;
    agent.sync_period = "1h";
    agent.env = env;
    agent.spawn(dir.path(), &["--manifests".as_ref(), cluster.as_os_str()]);
    agent.wait_ruleset("the first sync", |rs| rs.contains(SLOT));
    std::thread::sleep(Duration::from_millis(500));
    Some((dir, agent))
}

/// Someone else deletes our first backends slot; the agent puts it back within 5 s, the
/// check that found it names it missing, and the repair counts as drift.
fn delete_a_slot_and_see_it_repaired(agent: &Agent) {
    let delete = netns::run(
        "ip",
        &[
            "netns",
            "exec",
            &agent.ns,
            "nft",
            "delete element ip switchyard backends { 172.30.0.1 . tcp . 80 . 0 }",
        ],
        None,
        netns::CMD_TIMEOUT,
    );
    // The deletion succeeding says the element was there; the agent may put it back
    // before anyone could list it missing.
    assert!(delete.success(), "{}", delete.transcript());
    let deleted = Instant::now();
    while !agent.ruleset().contains(SLOT) {
        assert!(
            deleted.elapsed() < Duration::from_secs(5),
            "not repaired within 5 s\nagent log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    agent.wait_metric("switchyard_drift_repairs_total", 1.0);
    let log = agent.log();
    assert!(
        log.contains("element 172.30.0.1 . tcp . 80 . 0 missing"),
        "the check named it\n{log}"
    );
}

/// Someone deletes one element of a set the agent does not read back (the backends map of
/// a 100k-service table; here every set, with the read limit at 0): the commit's
/// notification starts a check whose lookups find it, and a full sync puts it back, counted
/// as a drift repair.
#[test]
fn an_element_deleted_from_a_set_too_large_to_read_back_is_found_by_lookups_and_repaired() {
    let env = vec![("SWITCHYARD_NFT_READ_LIMIT", "0".to_string())];
    let Some((_dir, mut agent)) = agent_after_first_sync("lookups", env) else {
        return;
    };
    delete_a_slot_and_see_it_repaired(&agent);
    assert!(agent.terminate().success(), "{}", agent.log());
}

/// Another program adds an element to our cluster-ips set and deletes it in one batch (a
/// tool that probes, a backup that restores what was there): the check its notification
/// sets off looks that one element up instead of reading our tables back, finds nothing to
/// repair, and the kernel is known to hold our state again (the next check is by
/// generation). When it deletes one of ours, that lookup finds it missing and a full sync
/// puts it back.
#[test]
fn another_programs_element_changes_are_looked_up_not_read_back() {
    let Some((_dir, mut agent)) = agent_after_first_sync("touched", Vec::new()) else {
        return;
    };
    let reads = checks(&agent, "read");
    checked_by_lookup_with_nothing_to_repair(
        &agent,
        "add element ip switchyard cluster-ips { 192.0.2.1 }; \
         delete element ip switchyard cluster-ips { 192.0.2.1 }",
    );
    // One of ours deleted: looked up, found missing, put back, with no read.
    let lookups = checks(&agent, "lookup");
    delete_a_slot_and_see_it_repaired(&agent);
    assert!(checks(&agent, "lookup") > lookups, "{}", agent.log());
    assert_eq!(checks(&agent, "read"), reads, "{}", agent.log());
    assert!(agent.terminate().success(), "{}", agent.log());
}

/// How many kernel checks by `method` the agent counted.
fn checks(agent: &Agent, method: &str) -> f64 {
    let (_, text) = agent.get(METRICS, "/metrics");
    let name = format!("switchyard_kernel_checks_total{{method=\"{method}\"}}");
    exposition::value(&text, &name).unwrap_or(0.0)
}

/// Someone else's `nft` `command` in the agent's namespace, and the check its notification
/// sets off, to its end (5 s at most): by lookup, with no read and nothing to repair.
fn checked_by_lookup_with_nothing_to_repair(agent: &Agent, command: &str) {
    const FINISHED: &str = "switchyard_kernel_check_duration_seconds_count";
    let value = |name: &str| {
        let (_, text) = agent.get(METRICS, "/metrics");
        exposition::value(&text, name).unwrap_or(0.0)
    };
    let (reads, lookups, finished) = (
        checks(agent, "read"),
        checks(agent, "lookup"),
        value(FINISHED),
    );
    let args = ["netns", "exec", &agent.ns, "nft", command];
    let out = netns::run("ip", &args, None, netns::CMD_TIMEOUT);
    assert!(out.success(), "{}", out.transcript());
    let t0 = Instant::now();
    while checks(agent, "lookup") <= lookups || value(FINISHED) <= finished {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "no check by lookup finished within 5 s\nagent log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(checks(agent, "read"), reads, "{}", agent.log());
    assert_eq!(
        value("switchyard_drift_repairs_total"),
        0.0,
        "{}",
        agent.log()
    );
}

/// Another program adds a chain to our table and deletes it in one batch: the check its
/// notification sets off reads back our chains and rules without any set's elements
/// (counted as a lookup check; no read) and finds nothing to repair. A rule it then adds to
/// one of our chains, a policy it sets on one of our base chains and a rule of ours it
/// replaces are found the same way and undone by the repair.
#[test]
fn another_programs_chain_changes_are_checked_without_reading_elements() {
    let Some((_dir, mut agent)) = agent_after_first_sync("chains", Vec::new()) else {
        return;
    };
    let reads = checks(&agent, "read");
    checked_by_lookup_with_nothing_to_repair(
        &agent,
        "add chain ip switchyard someone-elses; delete chain ip switchyard someone-elses",
    );

    let nft = |args: &[&str]| {
        let mut all = vec!["netns", "exec", &agent.ns, "nft"];
        all.extend_from_slice(args);
        let out = netns::run("ip", &all, None, netns::CMD_TIMEOUT);
        assert!(out.success(), "{}", out.transcript());
        out.stdout
    };
    // Someone's `command` undone by the agent's `repairs`th repair: `theirs` gone from our
    // table within 5 s, found by a check that read back no element.
    let undone = |command: &str, repairs: f64, theirs: &str| {
        assert!(!agent.ruleset().contains(theirs));
        let lookups = checks(&agent, "lookup");
        // Its success says what it changed was there; the agent may undo it before anyone
        // could list it.
        nft(&[command]);
        agent.wait_metric("switchyard_drift_repairs_total", repairs);
        let t0 = Instant::now();
        while agent.ruleset().contains(theirs) {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "{theirs} still there after 5 s\n{}\nagent log:\n{}",
                agent.ruleset(),
                agent.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(checks(&agent, "lookup") > lookups, "{}", agent.log());
        assert_eq!(checks(&agent, "read"), reads, "{}", agent.log());
    };

    // A rule of theirs in our services chain.
    undone(
        "add rule ip switchyard services meta mark 0x5a5a counter",
        1.0,
        "0x00005a5a",
    );
    assert!(agent.log().contains("chain services: rules changed"));
    // A policy of theirs on one of our base chains, which would drop what no rule accepts.
    undone(
        "chain ip switchyard filter-forward { policy drop; }",
        2.0,
        "policy drop",
    );
    assert!(agent.log().contains("chain filter-forward: rules changed"));
    // A rule of ours, not the first, replaced by one of theirs: the count and the first
    // rule stay, their rule lacks our fingerprint.
    let listed = nft(&["-a", "list", "chain", "ip", "switchyard", "filter-forward"]);
    let handle = listed
        .lines()
        .filter(|l| l.contains("jump") && l.contains("# handle "))
        .nth(1)
        .and_then(|l| l.rsplit("# handle ").next())
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|| panic!("no second rule in\n{listed}"));
    undone(
        &format!(
            "replace rule ip switchyard filter-forward handle {handle} meta mark 0x5a5b accept"
        ),
        3.0,
        "0x00005a5b",
    );
    assert_eq!(checks(&agent, "read"), reads, "{}", agent.log());
    assert!(agent.terminate().success(), "{}", agent.log());
}

/// The notification listener overflowed: another program commits 30,000 set elements in one
/// batch while the agent is stopped, which the kernel announces one message each, far more
/// than the listener's socket holds, so its next read fails with ENOBUFS. It still hears what follows: two firewall
/// reloads after the storm are each repaired within a second (syncPeriod an hour).
#[test]
fn an_overflowed_notification_listener_still_hears_the_next_flush() {
    let Some((_dir, agent)) = agent_after_first_sync("overflow", Vec::new()) else {
        return;
    };
    let nft = |args: &[&str], input: Option<&str>| {
        let mut all = vec!["netns", "exec", &agent.ns, "nft"];
        all.extend_from_slice(args);
        let out = netns::run("ip", &all, input, netns::CMD_TIMEOUT);
        assert!(out.success(), "{}", out.transcript());
    };
    let elements: Vec<String> = (0..30_000u32)
        .map(|i| format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
        .collect();
    // The agent stopped (SIGSTOP) while the storm blows, so that its listener cannot keep
    // up on another core: the kernel's queue for it overflows for certain. A storm that
    // fell in a moment the listener was out of the group (during one of the agent's own
    // commits) is followed by another, in a table of its own.
    let pid = agent.child.as_ref().unwrap().id().to_string();
    let signal = |sig: &str| {
        let ok = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(ok.success(), "kill {sig} {pid}");
    };
    let overflowed = || agent.log().contains("notifications overflowed (ENOBUFS");
    for k in 0..3 {
        if overflowed() {
            break;
        }
        let storm = format!(
            "table ip storm{k} {{\n  set s {{ type ipv4_addr; }}\n}}\nadd element ip storm{k} s {{ {} }}\n",
            elements.join(", ")
        );
        signal("-STOP");
        nft(&["-f", "-"], Some(&storm));
        signal("-CONT");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        overflowed(),
        "three storms never overflowed the listener\n{}",
        agent.log()
    );
    for round in 1..=2 {
        nft(&["flush", "ruleset"], None);
        let flushed = Instant::now();
        while !agent.ruleset().contains("10.0.0.1") {
            assert!(
                flushed.elapsed() < Duration::from_secs(1),
                "flush {round} after the storm: not repaired within a second\nagent log:\n{}",
                agent.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A UDP service whose endpoint is `endpoint`, in the agent's namespace.
fn udp_manifests(endpoint: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{ name: dns, namespace: ns }}
spec: {{ clusterIP: 172.30.0.53, ports: [{{ name: dns, port: 53, protocol: UDP }}] }}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{ name: dns-1, namespace: ns, labels: {{ kubernetes.io/service-name: dns }} }}
addressType: IPv4
ports: [{{ name: dns, port: 53, protocol: UDP }}]
endpoints: [{{ addresses: [{endpoint}] }}]
"#
    )
}

/// ctnetlink refuses the UDP conntrack cleanup once (SWITCHYARD_FAULTS `ctnetlink:send`):
/// the sync itself stands, the failure is counted, and a retry that follows on its own
/// (no further change comes) deletes the stale flow of a client that kept its socket.
#[test]
fn a_refused_conntrack_cleanup_is_counted_and_retried_without_another_change() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster.yaml");
    write_atomically(&cluster, &udp_manifests("10.180.0.1"));
    let Some(mut agent) = Agent::namespace("ct-fault") else {
        return;
    };
    // No periodic sync to retry in its stead.
    agent.sync_period = "1h";
    let faults = agent.faults_file(dir.path());
    // Somewhere for the DNATed datagrams to go: a veth whose far end nobody reads.
    netns::ip_batch(
        &agent.ns,
        &[
            "link add sy0 type veth peer name sy1".into(),
            "link set sy0 up".into(),
            "link set sy1 up".into(),
            "route add 172.30.0.0/16 dev sy0".into(),
            "route add 10.180.0.0/16 dev sy0".into(),
        ],
    );
    agent.spawn(dir.path(), &["--manifests".as_ref(), cluster.as_os_str()]);
    agent.wait_ruleset("the first sync", |rs| rs.contains("10.180.0.1"));
    let client = netns::in_netns(&agent.ns, || {
        let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
        s.connect("172.30.0.53:53")?;
        s.send(b"query")?;
        Ok(s)
    })
    .unwrap();
    let flows_to = |ep: &str| {
        let out = netns::run(
            "ip",
            &["netns", "exec", &agent.ns, "conntrack", "-L", "-p", "udp"],
            None,
            netns::CMD_TIMEOUT,
        );
        out.stdout
            .lines()
            .filter(|l| l.contains("dport=53") && l.contains(&format!("src={ep} ")))
            .count()
    };
    assert_eq!(flows_to("10.180.0.1"), 1, "the client's flow, DNATed");
    std::fs::write(&faults, "ctnetlink:send EPERM 1\n").unwrap();
    write_atomically(&cluster, &udp_manifests("10.180.0.2"));
    agent.wait_ruleset("the new endpoint", |rs| rs.contains("10.180.0.2"));
    let moved = Instant::now();
    while flows_to("10.180.0.1") > 0 {
        assert!(
            moved.elapsed() < Duration::from_secs(5),
            "the stale flow outlived the retry\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, text) = agent.get(METRICS, "/metrics");
    assert_eq!(
        agent.metric(&text, "switchyard_conntrack_cleanup_failures_total"),
        1.0,
        "{}",
        agent.log()
    );
    assert!(
        agent
            .log()
            .contains("SWITCHYARD_FAULTS: ctnetlink:send fails"),
        "{}",
        agent.log()
    );
    drop(client);
}

/// The agent's failure counter for `family` in its mode's kube-proxy family.
fn failures(agent: &Agent, text: &str, family: &str) -> f64 {
    let names: &[&str] = if agent.mode == "iptables" {
        &[
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
            "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
        ]
    } else {
        &["kubeproxy_sync_proxy_rules_nftables_sync_failures_total"]
    };
    names
        .iter()
        .map(|n| agent.metric(text, &format!("{n}{{ip_family=\"{family}\"}}")))
        .sum()
}

/// Waits (bounded) until the agent's failures in `family` exceed `above`.
fn wait_failures(agent: &Agent, family: &str, above: f64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        // The metrics server may not listen yet.
        let text = agent
            .try_get(METRICS, "/metrics")
            .map(|(_, t)| t)
            .unwrap_or_default();
        let n = if text.is_empty() {
            0.0
        } else {
            failures(agent, &text, family)
        };
        if n > above {
            return n;
        }
        assert!(
            Instant::now() < deadline,
            "no {family} sync failure counted\n{text}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Netlink errors on the real kernel (SWITCHYARD_FAULTS, one file rewritten per case): a
/// signal's EINTR is retried where it happens and fails nothing; an ENOBUFS that loses the
/// commit's answers fails that sync (the outcome is unknown), and the full retry reads the
/// kernel and converges; a refused send keeps the old rules until the kernel takes commits
/// again; and a batch the real kernel refuses at its last message, after doing all of ours,
/// leaves the ruleset exactly as it was, on the first (cold) sync and on a later one.
#[test]
fn netlink_errors_are_retried_or_counted_and_the_next_sync_converges() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut agent) = Agent::namespace("netlink-faults") else {
        return;
    };
    // No periodic check: every netlink call comes from the syncs the edits cause.
    agent.sync_period = "1h";
    let faults = agent.faults_file(dir.path());
    let cluster = dir.path().join("cluster.yaml");
    write_atomically(&cluster, &manifests("10.0.0.1"));
    // The cold sync's batch is refused, whole, by the kernel itself: nothing of it stays.
    std::fs::write(&faults, "nf_tables-batch-last ENOENT\n").unwrap();
    agent.spawn(dir.path(), &["--manifests".as_ref(), cluster.as_os_str()]);
    wait_failures(&agent, "IPv4", 0.0);
    let log = agent.log();
    assert!(
        log.contains("nf_tables-batch-last fails: No such file or directory"),
        "{log}"
    );
    assert!(
        log.contains("at the message SWITCHYARD_FAULTS added: kernel answered error 2"),
        "{log}"
    );
    assert_eq!(agent.ruleset(), "", "a refused cold batch left a table");
    std::fs::remove_file(&faults).unwrap();
    agent.wait_ruleset("the first sync, retried", |rs| rs.contains("10.0.0.1"));
    // Another refused retry may have come before the fault went.
    let (_, text) = agent.get(METRICS, "/metrics");
    let mut failed = failures(&agent, &text, "IPv4");

    // EINTR on every send and receive, three times each: retried, nothing fails.
    std::fs::write(
        &faults,
        "nfnetlink:send EINTR 3\nnfnetlink:receive EINTR 3\n",
    )
    .unwrap();
    write_atomically(&cluster, &manifests("10.0.0.2"));
    agent.wait_ruleset("the edit through EINTRs", |rs| {
        rs.contains("10.0.0.2") && !rs.contains("10.0.0.1")
    });
    let (_, text) = agent.get(METRICS, "/metrics");
    assert_eq!(
        failures(&agent, &text, "IPv4"),
        failed,
        "EINTR failed a sync\n{text}"
    );
    let log = agent.log();
    assert!(
        log.contains("nfnetlink:send fails: Interrupted system call"),
        "{log}"
    );
    assert!(
        log.contains("nfnetlink:receive fails: Interrupted system call"),
        "{log}"
    );

    // ENOBUFS once on a receive: the commit's answers are lost, the sync counts as failed,
    // and the full retry converges on what the kernel holds.
    std::fs::write(&faults, "nfnetlink:receive ENOBUFS 1\n").unwrap();
    write_atomically(&cluster, &manifests("10.0.0.3"));
    failed = wait_failures(&agent, "IPv4", failed);
    agent.wait_ruleset("the edit after ENOBUFS", |rs| {
        rs.contains("10.0.0.3") && !rs.contains("10.0.0.2")
    });
    let log = agent.log();
    assert!(
        log.contains("nfnetlink:receive fails: No buffer space available"),
        "{log}"
    );
    assert!(
        log.contains("its answers were lost, so whether it committed is unknown"),
        "{log}"
    );

    // Every send refused (EPERM) while the file says so: the old rules keep serving.
    let before = agent.ruleset();
    std::fs::write(&faults, "nfnetlink:send EPERM\n").unwrap();
    write_atomically(&cluster, &manifests("10.0.0.4"));
    failed = wait_failures(&agent, "IPv4", failed);
    assert_eq!(agent.ruleset(), before, "a refused send changed the kernel");
    std::fs::remove_file(&faults).unwrap();
    agent.wait_ruleset("the edit after EPERM", |rs| {
        rs.contains("10.0.0.4") && !rs.contains("10.0.0.3")
    });

    // A partial sync with a new load-balancing chain, refused at its last message: the
    // kernel undoes everything before it.
    let before = agent.ruleset();
    std::fs::write(&faults, "nf_tables-batch-last ENOENT\n").unwrap();
    write_atomically(
        &cluster,
        &manifests("10.0.0.5").replace(
            "endpoints: [{ addresses: [10.0.0.5] }]",
            "endpoints: [{ addresses: [10.0.0.5] }, { addresses: [10.0.0.6] }]",
        ),
    );
    failed = wait_failures(&agent, "IPv4", failed);
    // And again: the retries are refused too.
    wait_failures(&agent, "IPv4", failed);
    assert_eq!(
        agent.ruleset(),
        before,
        "a refused batch left a part behind"
    );
    std::fs::remove_file(&faults).unwrap();
    agent.wait_ruleset("the edit after the refused batches", |rs| {
        rs.contains("10.0.0.5") && rs.contains("10.0.0.6") && !rs.contains("10.0.0.4")
    });
    let status = agent.terminate();
    assert!(status.success(), "{status:?}\n{}", agent.log());
}

/// Dual-stack manifests: `web` on IPv4 with endpoint `v4`, `web6` on IPv6 with `v6`.
fn dual_stack_manifests(v4: &str, v6: &str) -> String {
    format!(
        r#"{}
---
apiVersion: v1
kind: Service
metadata: {{ name: web6, namespace: ns }}
spec: {{ clusterIP: "fd00:30::1", ipFamilies: [IPv6], ports: [{{ name: http, port: 80 }}] }}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{ name: web6-1, namespace: ns, labels: {{ kubernetes.io/service-name: web6 }} }}
addressType: IPv6
ports: [{{ name: http, port: 8080 }}]
endpoints: [{{ addresses: ["{v6}"] }}]
"#,
        manifests(v4)
    )
}

/// iptables mode, a sync refused in its middle: the IPv4 restore commits, the IPv6 one is
/// refused (SWITCHYARD_FAULTS). IPv4 has the edit, IPv6 keeps its old rules whole, the
/// failure counts in IPv6's series only, and IPv6 converges once restores work again.
#[test]
fn iptables_family_refused_in_the_middle_of_a_sync_keeps_its_old_rules() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut agent) = Agent::namespace("ipt-refused") else {
        return;
    };
    agent.mode = "iptables";
    agent.sync_period = "1h";
    let faults = agent.faults_file(dir.path());
    let cluster = dir.path().join("cluster.yaml");
    write_atomically(&cluster, &dual_stack_manifests("10.0.0.1", "fd00:10::1"));
    agent.spawn(dir.path(), &["--manifests".as_ref(), cluster.as_os_str()]);
    agent.wait_ruleset("the first sync", |rs| rs.contains("10.0.0.1:8080"));
    let save6 = || {
        let out = netns::run(
            "ip",
            &[
                "netns",
                "exec",
                &agent.ns,
                "ip6tables-nft-save",
                "-t",
                "nat",
            ],
            None,
            netns::CMD_TIMEOUT,
        );
        assert!(out.success(), "{}", out.transcript());
        out.stdout
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while !save6().contains("[fd00:10::1]:8080") {
        assert!(Instant::now() < deadline, "{}\n{}", save6(), agent.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, text) = agent.get(METRICS, "/metrics");
    assert_eq!(failures(&agent, &text, "IPv6"), 0.0, "{text}");
    let before6 = save6();

    std::fs::write(&faults, "iptables-restore:IPv6 EPERM\n").unwrap();
    write_atomically(&cluster, &dual_stack_manifests("10.0.0.2", "fd00:10::2"));
    agent.wait_ruleset("IPv4's edit", |rs| {
        rs.contains("10.0.0.2:8080") && !rs.contains("10.0.0.1")
    });
    let failed = wait_failures(&agent, "IPv6", 0.0);
    // Retried, and refused again.
    wait_failures(&agent, "IPv6", failed);
    let (_, text) = agent.get(METRICS, "/metrics");
    assert_eq!(failures(&agent, &text, "IPv4"), 0.0, "{text}");
    let strip = |s: &str| {
        // Without the comments and the chains' packet counters.
        s.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split(" [").next().unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(strip(&save6()), strip(&before6), "IPv6's old rules moved");
    assert!(agent.log().contains("iptables-restore:IPv6 fails"));

    std::fs::remove_file(&faults).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = save6();
        if now.contains("[fd00:10::2]:8080") && !now.contains("fd00:10::1") {
            break;
        }
        assert!(Instant::now() < deadline, "{now}\n{}", agent.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = agent.terminate();
    assert!(status.success(), "{status:?}\n{}", agent.log());
}
