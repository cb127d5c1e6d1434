//! A node for agent tests that need many Services and real connections but not the full
//! rig: one network namespace holding four "pods" (local addresses on a veth link, each
//! answering "ok" on port 8080), a route for the service range, and the fixture API server
//! on 127.0.0.1:6443; `switchyard run` (nftables mode) is started in it on demand.

#![allow(dead_code)]

pub mod traced;

use crate::apiserver;
use crate::netns;
use serde_json::{json, Value};
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Addresses of the "pods": local to the node, on a veth link, each serving port 8080.
pub const PODS: [&str; 4] = ["10.180.0.1", "10.180.0.2", "10.180.0.3", "10.180.0.4"];

pub fn cluster_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 96, (i / 250) as u8, (i % 250 + 1) as u8)
}

pub fn service(i: usize) -> Value {
    let ip = cluster_ip(i).to_string();
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc-{i}"), "namespace": "soak"},
        "spec": {"clusterIP": ip, "clusterIPs": [ip],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}})
}

pub fn slice(i: usize, generation: usize) -> Value {
    // Two of the four pods, moving with each generation: every endpoint always serves.
    let eps: Vec<Value> = [generation % 4, (generation + 1) % 4]
        .iter()
        .map(|p| json!({"addresses": [PODS[*p]], "conditions": {"ready": true}}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i}-1"), "namespace": "soak",
            "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": eps})
}

/// The node namespace, removed on drop.
pub struct Node(pub String);

impl Drop for Node {
    fn drop(&mut self) {
        netns::delete_namespace(&self.0);
    }
}

impl Node {
    pub fn exec(&self, program: &str, args: &[&str]) -> netns::CmdOutput {
        self.exec_within(netns::CMD_TIMEOUT, program, args)
    }

    /// [`Self::exec`], killed after `timeout` rather than the usual bound.
    pub fn exec_within(&self, timeout: Duration, program: &str, args: &[&str]) -> netns::CmdOutput {
        let mut all = vec!["netns", "exec", &self.0, program];
        all.extend_from_slice(args);
        netns::run("ip", &all, None, timeout)
    }
}

/// One connection to a service: true when its pod answered within `timeout` (a SYN with
/// no rules to meet is dropped, and only the timeout ends the attempt).
pub fn connect(ns: &str, to: Ipv4Addr, timeout: Duration) -> bool {
    connect_why(ns, to, timeout).is_ok()
}

/// As `connect`, saying what went wrong: which step failed and how.
pub fn connect_why(ns: &str, to: Ipv4Addr, timeout: Duration) -> Result<(), String> {
    let r = netns::in_netns(ns, || {
        let mut s = TcpStream::connect_timeout(&SocketAddr::new(to.into(), 80), timeout)
            .map_err(|e| std::io::Error::other(format!("connect: {e}")))?;
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        let mut buf = String::new();
        s.read_to_string(&mut buf)
            .map_err(|e| std::io::Error::other(format!("read: {e}")))?;
        Ok(buf)
    });
    match r {
        Ok(b) if b == "ok\n" => Ok(()),
        Ok(b) => Err(format!("{to}: answered {b:?}")),
        Err(e) => Err(format!("{to}: {e}")),
    }
}

/// Waits (bounded by `limit`) until a connection to `to` succeeds; how long it took.
pub fn until_answers(ns: &str, to: Ipv4Addr, limit: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        // A local pod answers within a millisecond; a short timeout keeps the measure fine.
        if connect(ns, to, Duration::from_millis(50)) {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

pub struct Agent {
    child: Child,
    pub log: std::path::PathBuf,
}

impl Agent {
    pub fn start(ns: &str, dir: &std::path::Path, n: usize) -> Agent {
        let log = dir.join(format!("agent-{n}.log"));
        let child = Command::new("ip")
            .args(["netns", "exec", ns, env!("CARGO_BIN_EXE_switchyard"), "run"])
            .arg("--config")
            .arg(dir.join("config.yaml"))
            .arg("--kubeconfig")
            .arg(dir.join("kubeconfig"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start the agent");
        Agent { child, log }
    }

    pub fn rss_mib(&self) -> Option<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let kib: f64 = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        Some(kib / 1024.0)
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The namespace with its pods, the API server holding `services` Services, and the agent's
/// configuration; `None` (a skip) without root.
pub struct LocalNode {
    pub node: Node,
    pub api: Arc<apiserver::ApiServer>,
    pub dir: tempfile::TempDir,
    pods_stop: Arc<AtomicBool>,
}

impl Drop for LocalNode {
    fn drop(&mut self) {
        self.pods_stop.store(true, Ordering::Relaxed);
    }
}

impl LocalNode {
    pub fn new(tag: &str, services: usize) -> Option<LocalNode> {
        let ns = netns::create_or_skip(tag)?;
        let node = Node(ns.clone());
        // A veth pair stands in for the pod network (this kernel may lack the dummy driver).
        let mut lines = vec![
            "link add sy0 type veth peer name sy1".to_string(),
            "link set sy0 up".into(),
            "link set sy1 up".into(),
        ];
        lines.extend(PODS.iter().map(|p| format!("addr add {p}/32 dev sy0")));
        lines.push("route add 10.96.0.0/16 dev sy0".into());
        netns::ip_batch(&ns, &lines);

        // The pods: one listener per address, answering "ok"; they stop after the client.
        let pods_stop = Arc::new(AtomicBool::new(false));
        for pod in PODS {
            let listener = netns::in_netns(&ns, || TcpListener::bind((pod, 8080))).unwrap();
            listener.set_nonblocking(true).unwrap();
            let stop = pods_stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((mut s, _)) => {
                            let _ = std::io::Write::write_all(&mut s, b"ok\n");
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
            });
        }

        let api = {
            let ns = ns.clone();
            apiserver::ApiServer::start(move || {
                netns::in_netns(&ns, || TcpListener::bind("127.0.0.1:6443")).unwrap()
            })
        };
        api.apply(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.180.0.254"}]}}),
        );
        for i in 0..services {
            api.apply(service(i));
            api.apply(slice(i, i));
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kubeconfig"), api.kubeconfig()).unwrap();
        std::fs::write(
            dir.path().join("config.yaml"),
            "kind: KubeProxyConfiguration\napiVersion: kubeproxy.config.k8s.io/v1alpha1\n\
         mode: nftables\nhostnameOverride: node-a\nminSyncPeriod: 1s\nsyncPeriod: 30s\n\
         healthzBindAddress: 127.0.0.1:10256\nmetricsBindAddress: 127.0.0.1:10249\n",
        )
        .unwrap();
        Some(LocalNode {
            node,
            api: Arc::new(api),
            dir,
            pods_stop,
        })
    }

    pub fn ns(&self) -> &str {
        &self.node.0
    }

    /// `switchyard run` on the API server; `n` numbers its log.
    pub fn start_agent(&self, n: usize) -> Agent {
        Agent::start(&self.node.0, self.dir.path(), n)
    }
}
