//! A real Kubernetes control plane for tests and benchmarks: tests/cluster/up.sh (etcd,
//! kube-apiserver, kube-controller-manager from the pinned release) on free loopback ports,
//! its admin kubectl, kube-apiserver restarts and metrics, etcd compaction, and a relay that
//! carries the API server's port into a network namespace.

use super::netns;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The Kubernetes release whose components tests/cluster/build.sh builds.
pub const K8S_VERSION: &str = "v1.37.2";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn k8s_bin(name: &str) -> PathBuf {
    root()
        .join("target/k8s")
        .join(K8S_VERSION)
        .join("bin")
        .join(name)
}

/// Whether `setpriv --pdeathsig` is there: a process started under it gets a signal when
/// the test's thread dies, so even a killed test run leaves no control plane behind.
pub fn pdeathsig(signal: &str) -> Vec<String> {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let has = *HAS.get_or_init(|| {
        Command::new("setpriv")
            .arg("--help")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--pdeathsig"))
    });
    if has {
        ["setpriv", "--pdeathsig", signal, "--"]
            .map(String::from)
            .to_vec()
    } else {
        Vec::new()
    }
}

/// tests/cluster/up.sh in its own process group; the group is killed on drop.
pub struct Cluster {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// This test's scratch folder (the cluster's state is in `<work>/cluster*`).
    pub work: PathBuf,
    pub state: PathBuf,
    pub up_log: PathBuf,
    pub port: u16,
    pub etcd_port: u16,
    pub started: Duration,
}

/// `n` distinct free ports below the ephemeral range (32768-60999 here), so no client
/// connection can be holding one when a component binds it.
pub fn free_ports(n: usize) -> Vec<u16> {
    let mut seed = u64::from(std::process::id())
        ^ SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
    let mut held = Vec::new();
    let mut ports = Vec::new();
    while ports.len() < n {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let p = 20000 + ((seed >> 33) % 12000) as u16;
        if ports.contains(&p) {
            continue;
        }
        if let Ok(l) = TcpListener::bind(("127.0.0.1", p)) {
            held.push(l);
            ports.push(p);
        }
    }
    ports
}

impl Cluster {
    pub fn start(work: &Path) -> Cluster {
        let up = root().join("tests/cluster/up.sh");
        for attempt in 1..=3 {
            let ports = free_ports(4);
            let state = work.join(format!("cluster{attempt}"));
            let up_log = work.join(format!("up{attempt}.log"));
            let begun = Instant::now();
            let mut argv = pdeathsig("TERM");
            argv.push("bash".into());
            argv.push(up.to_str().unwrap().into());
            let mut child = Command::new(&argv[0])
                .args(&argv[1..])
                .env("CLUSTER_DIR", &state)
                .env("SKIP_BUILD", "1")
                .env("ETCD_PORT", ports[0].to_string())
                .env("ETCD_PEER_PORT", ports[1].to_string())
                .env("APISERVER_PORT", ports[2].to_string())
                .env("KCM_PORT", ports[3].to_string())
                .env_remove("KEEP")
                .env_remove("SERVICE_CIDRS")
                .process_group(0)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(&up_log).unwrap())
                .spawn()
                .expect("start tests/cluster/up.sh");
            let (tx, lines) = mpsc::channel();
            let out = child.stdout.take().unwrap();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            let mut cluster = Cluster {
                child,
                lines,
                work: work.to_path_buf(),
                state,
                up_log,
                port: ports[2],
                etcd_port: ports[0],
                started: Duration::ZERO,
            };
            match cluster.wait_line("READY", Duration::from_secs(120)) {
                Ok(()) => {
                    cluster.started = begun.elapsed();
                    println!(
                        "control plane ready in {:.1} s on port {}",
                        cluster.started.as_secs_f64(),
                        cluster.port
                    );
                    return cluster;
                }
                Err(e) => {
                    let log = cluster.up_log();
                    drop(cluster);
                    if log.contains("is in use") && attempt < 3 {
                        println!("up.sh attempt {attempt}: a port was taken; again");
                        continue;
                    }
                    panic!("up.sh: {e}\n{log}");
                }
            }
        }
        unreachable!()
    }

    pub fn wait_line(&self, want: &str, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l == want => return Ok(()),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!("no {want} line after {timeout:?}"))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(format!("exited before printing {want}"))
                }
            }
        }
    }

    pub fn up_log(&self) -> String {
        std::fs::read_to_string(&self.up_log).unwrap_or_default()
    }

    /// The last lines of a component's log, for failure messages.
    pub fn component_log(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.state.join("logs").join(format!("{name}.log")))
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.state.join("admin.kubeconfig")
    }

    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> netns::CmdOutput {
        let kc = self.admin_kubeconfig();
        let cache = self.work.join("kubectl-cache");
        let mut all = vec![
            "--kubeconfig",
            kc.to_str().unwrap(),
            "--cache-dir",
            cache.to_str().unwrap(),
        ];
        all.extend_from_slice(args);
        netns::run(
            k8s_bin("kubectl").to_str().unwrap(),
            &all,
            stdin,
            Duration::from_secs(30),
        )
    }

    pub fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl(args, stdin);
        assert!(out.success(), "{}", out.transcript());
        out.stdout
    }

    /// A kubeconfig for this API server with a bearer token.
    pub fn token_kubeconfig(&self, token: &str) -> String {
        let ca = std::fs::read_to_string(self.state.join("pki/ca.crt")).unwrap();
        // base64 without a dependency: the `base64` tool is in coreutils.
        let out = netns::run("base64", &["-w0"], Some(&ca), netns::CMD_TIMEOUT);
        assert!(out.success(), "{}", out.transcript());
        let b64 = out.stdout.trim();
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: \
             https://127.0.0.1:{}\n    certificate-authority-data: {b64}\nusers:\n- name: sa\n  \
             user:\n    token: {token}\ncontexts:\n- name: sa\n  context: {{cluster: real, user: \
             sa}}\ncurrent-context: sa\n",
            self.port
        )
    }

    /// Restarts kube-apiserver alone (up.sh: SIGTERM, SIGKILL after 5 s, start again);
    /// returns (when it was told to stop, when it was ready again).
    pub fn restart_apiserver(&self) -> (Instant, Instant) {
        let ok = Command::new("kill")
            .args(["-USR1", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        self.wait_line("RESTARTING", Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("up.sh: {e}\n{}", self.up_log()));
        let down = Instant::now();
        self.wait_line("RESTARTED", Duration::from_secs(90))
            .unwrap_or_else(|e| {
                panic!(
                    "up.sh: {e}\n{}\n{}",
                    self.up_log(),
                    self.component_log("kube-apiserver")
                )
            });
        (down, Instant::now())
    }

    /// POSTs to etcd's JSON gateway (plain HTTP on loopback, as up.sh runs it).
    pub fn etcd(&self, call: &str, body: &Value) -> Value {
        let out = netns::run(
            "curl",
            &[
                "-fsS",
                "--max-time",
                "10",
                "-X",
                "POST",
                "-d",
                &body.to_string(),
                &format!("http://127.0.0.1:{}/v3/{call}", self.etcd_port),
            ],
            None,
            netns::CMD_TIMEOUT,
        );
        assert!(out.success(), "etcd {call}: {}", out.transcript());
        serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("etcd {call}: {e}: {}", out.stdout))
    }

    /// Compacts etcd at its current revision (physically): every older revision is gone, so
    /// a watch from one of them gets 410 Gone. Returns that revision.
    pub fn compact_etcd(&self) -> u64 {
        // Any range answers with the store's current revision in its header.
        let head = self.etcd("kv/range", &json!({"key": "Lw==", "limit": 1}));
        let rev: u64 = head["header"]["revision"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        self.etcd(
            "kv/compaction",
            &json!({"revision": rev.to_string(), "physical": true}),
        );
        rev
    }

    /// The sum of a kube-apiserver counter's series whose labels include all of `labels`
    /// (`name="value"` pieces), from its /metrics.
    pub fn apiserver_count(&self, metric: &str, labels: &[&str]) -> f64 {
        let text = self.kubectl_ok(&["get", "--raw", "/metrics"], None);
        text.lines()
            .filter(|l| l.starts_with(&format!("{metric}{{")))
            .filter(|l| labels.iter().all(|want| l.contains(want)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The whole group at once: up.sh and every component (a graceful kube-apiserver
        // stop takes seconds; this cluster is thrown away).
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
        if std::thread::panicking() || std::env::var("SWITCHYARD_KEEP_WORK").as_deref() == Ok("1") {
            // Keep the logs of a failed test; drop the bulk.
            let _ = std::fs::remove_dir_all(self.state.join("etcd"));
            println!(
                "kept the control plane's logs in {}",
                self.state.join("logs").display()
            );
        }
    }
}

/// The API server inside a network namespace: connections to 127.0.0.1:PORT there are
/// carried to the same address on the host (a namespace has a loopback of its own), so the
/// kubeconfigs work unchanged. What tests/cluster/in-netns.sh does with socat.
pub struct Relay {
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    pub fn start(ns: &str, port: u16) -> Relay {
        let listener = netns::in_netns(ns, move || {
            let l = TcpListener::bind(("127.0.0.1", port))?;
            l.set_nonblocking(true)?;
            Ok(l)
        })
        .expect("relay listener in the namespace");
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (s, c) = (stop.clone(), conns.clone());
        let accept = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((inside, _)) => {
                        // The server down: the client's connection closes at once, as a
                        // refused one would fail.
                        let Ok(host) = TcpStream::connect(("127.0.0.1", port)) else {
                            continue;
                        };
                        let _ = inside.set_nonblocking(false);
                        let _ = inside.set_nodelay(true);
                        let _ = host.set_nodelay(true);
                        {
                            let mut c = c.lock().unwrap();
                            c.extend(inside.try_clone().ok());
                            c.extend(host.try_clone().ok());
                        }
                        for (mut from, mut to) in [
                            (inside.try_clone().unwrap(), host.try_clone().unwrap()),
                            (host, inside),
                        ] {
                            std::thread::spawn(move || {
                                let _ = std::io::copy(&mut from, &mut to);
                                let _ = from.shutdown(Shutdown::Both);
                                let _ = to.shutdown(Shutdown::Both);
                            });
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Relay {
            stop,
            accept: Some(accept),
            conns,
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}
