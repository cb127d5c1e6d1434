//! Switchyard as a drop-in for kube-proxy v1.37: the binary started as `kube-proxy` with
//! kubeadm's and kind's command lines and ConfigMaps programs a real kernel (in a network
//! namespace) from an API server, answers kube-proxy's endpoints, `--cleanup` leaves no
//! proxy's rules, a node carrying kube-proxy's iptables layout is taken over with live
//! connections and none fails, and every flag of the pinned release parses.

#![allow(clippy::expect_used, clippy::unwrap_used)]
#![allow(dead_code)]

#[path = "rig/netns.rs"]
mod netns;

#[path = "rig/http.rs"]
mod http;

mod apiserver;

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KUBEADM_CONFIG: &str = include_str!("compat/kubeadm-kube-proxy-config.conf");
const KIND_CONFIG: &str = include_str!("compat/kind-kube-proxy-config.conf");
const HELP: &str = include_str!("cluster/kube-proxy-v1.37.2-help.txt");

/// The binary under the name kube-proxy, as an image swap puts it at
/// /usr/local/bin/kube-proxy.
fn kube_proxy_binary(dir: &Path) -> PathBuf {
    let link = dir.join("kube-proxy");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_switchyard"), &link).unwrap();
    link
}

/// A namespace, deleted on drop even when the test fails; `None` is a skip without root.
struct Ns(String);

impl Ns {
    fn new(tag: &str) -> Option<Ns> {
        netns::create_or_skip(&format!("kp-{tag}")).map(Ns)
    }

    fn exec(&self, program: &str, args: &[&str]) -> netns::CmdOutput {
        let mut all = vec!["netns", "exec", &self.0, program];
        all.extend_from_slice(args);
        netns::run("ip", &all, None, netns::CMD_TIMEOUT)
    }

    fn must(&self, program: &str, args: &[&str]) -> String {
        let out = self.exec(program, args);
        assert!(out.success(), "{}", out.transcript());
        out.stdout
    }

    fn nft_tables(&self) -> String {
        self.must("nft", &["list", "tables"])
    }

    fn iptables_save(&self) -> String {
        self.must("iptables-nft-save", &[])
    }

    fn get(&self, addr: &str, path: &str) -> (u16, String) {
        http::get(&self.0, addr, path).expect("http get in namespace")
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        netns::delete_namespace(&self.0);
    }
}

/// A process killed on drop.
struct Proc(Child, PathBuf);

impl Proc {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.1).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `kube-proxy ARGS` in the namespace, as the DaemonSet's container would.
fn start_kube_proxy(ns: &Ns, dir: &Path, args: &[String]) -> Proc {
    let bin = kube_proxy_binary(dir);
    let log = dir.join("kube-proxy.log");
    let child = Command::new("ip")
        .args(["netns", "exec", &ns.0])
        .arg(&bin)
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start kube-proxy");
    Proc(child, log)
}

fn wait_for(what: &str, proc: &Proc, mut pred: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pred() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\nlog:\n{}",
            proc.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn service(name: &str, ip: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"clusterIP": ip, "clusterIPs": [ip],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}})
}

fn slice(service: &str, endpoints: &[&str]) -> Value {
    let eps: Vec<Value> = endpoints
        .iter()
        .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-1"), "namespace": "ns",
            "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": eps})
}

/// iptables-save lines of a proxy's KUBE- chains. KUBE-FIREWALL is left out: kubelet makes
/// and owns it too, and kube-proxy's own cleanup leaves it
/// (pkg/proxy/iptables/cleanup.go cleanupLeftoversForFamily).
fn proxy_lines(save: &str) -> Vec<&str> {
    save.lines()
        .filter(|l| l.contains("KUBE-") && !l.contains("KUBE-FIREWALL"))
        .collect()
}

/// Objects as one `kind: List` manifest.
fn list(items: &[Value]) -> String {
    json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

/// The fixture API server listening inside the namespace (kube-proxy's kubeconfig points
/// at it), holding this node and one service.
fn api_in(ns: &Ns, endpoint: &str) -> apiserver::ApiServer {
    let name = ns.0.clone();
    let api = apiserver::ApiServer::start(move || {
        netns::in_netns(&name, || TcpListener::bind("127.0.0.1:6443")).unwrap()
    });
    api.apply(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a"},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.200.0.1"}]}}));
    api.apply(service("web", "172.30.0.1"));
    api.apply(slice("web", &[endpoint]));
    api
}

/// An installer's ConfigMap, with its kubeconfig path pointed at this test's.
fn installer_config(dir: &Path, text: &str, api: &apiserver::ApiServer) -> PathBuf {
    let kubeconfig = dir.join("kubeconfig.conf");
    std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
    let text = text.replace(
        "/var/lib/kube-proxy/kubeconfig.conf",
        &kubeconfig.display().to_string(),
    );
    let path = dir.join("config.conf");
    std::fs::write(&path, text).unwrap();
    path
}

/// kubeadm's DaemonSet command line, verbatim but for the paths.
fn kubeadm_args(config: &Path) -> Vec<String> {
    vec![
        format!("--config={}", config.display()),
        "--hostname-override=node-a".into(),
    ]
}

#[test]
fn kubeadm_command_line_and_config_program_nftables_and_serve_kube_proxys_endpoints() {
    let Some(ns) = Ns::new("kubeadm") else { return };
    let dir = tempfile::tempdir().unwrap();
    let api = api_in(&ns, "10.1.0.1");
    let config = installer_config(dir.path(), KUBEADM_CONFIG, &api);
    let kp = start_kube_proxy(&ns, dir.path(), &kubeadm_args(&config));

    // mode "" is nftables here.
    wait_for("the first sync", &kp, || {
        let rs = ns
            .exec("nft", &["list", "table", "ip", "switchyard"])
            .stdout;
        rs.contains("172.30.0.1") && rs.contains("10.1.0.1")
    });
    // kube-proxy's metrics address (127.0.0.1:10249 by its defaulting of an empty field).
    let (code, mode) = ns.get("127.0.0.1:10249", "/proxyMode");
    assert_eq!((code, mode.as_str()), (200, "nftables"), "{}", kp.log());
    let (code, body) = ns.get("127.0.0.1:10249", "/healthz");
    assert_eq!((code, body.as_str()), (200, "ok"));
    let (code, _) = ns.get("127.0.0.1:10249", "/livez");
    assert_eq!(code, 200);
    let (code, configz) = ns.get("127.0.0.1:10249", "/configz");
    assert_eq!(code, 200);
    let v: Value = serde_json::from_str(&configz).unwrap();
    let c = &v["kubeproxy.config.k8s.io"];
    assert_eq!(c["apiVersion"], "kubeproxy.config.k8s.io/v1alpha1", "{v}");
    assert_eq!(c["kind"], "KubeProxyConfiguration");
    assert_eq!(c["mode"], "nftables");
    assert_eq!(c["clusterCIDR"], "10.244.0.0/16");
    assert_eq!(c["hostnameOverride"], "node-a");
    assert_eq!(c["nftables"]["syncPeriod"], "30s");
    assert_eq!(c["conntrack"]["maxPerCore"], 32768);
    assert_eq!(c["healthzBindAddress"], "0.0.0.0:10256");
    let (code, metrics) = ns.get("127.0.0.1:10249", "/metrics");
    assert_eq!(code, 200);
    for name in [
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
        "kubeproxy_network_programming_duration_seconds_bucket",
        "rest_client_requests_total{code=\"200\",host=\"127.0.0.1:6443\",method=\"GET\"}",
        "rest_client_request_duration_seconds_bucket",
    ] {
        assert!(metrics.contains(name), "{name} missing:\n{metrics}");
    }
    // The health server on every address, as kube-proxy's healthzBindAddress default.
    let (code, health) = ns.get("127.0.0.1:10256", "/healthz");
    assert_eq!(code, 200, "{health}");
    // conntrack section applied in the namespace: kube-proxy's 24h established timeout.
    let est = ns.must(
        "cat",
        &["/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established"],
    );
    assert_eq!(est.trim(), "86400", "{}", kp.log());
    assert!(
        !kp.log().contains("\u{1b}["),
        "no colour codes in a log file"
    );
}

#[test]
fn kind_command_line_and_config_program_iptables() {
    let Some(ns) = Ns::new("kind") else { return };
    let dir = tempfile::tempdir().unwrap();
    let api = api_in(&ns, "10.1.0.2");
    let config = installer_config(dir.path(), KIND_CONFIG, &api);
    let mut args = kubeadm_args(&config);
    args.push("--v=4".into());
    args.push("--logging-format=json".into());
    let kp = start_kube_proxy(&ns, dir.path(), &args);
    wait_for("the first iptables sync", &kp, || {
        let rs = ns.exec("iptables-nft-save", &[]).stdout;
        rs.contains("KUBE-SERVICES") && rs.contains("172.30.0.1") && rs.contains("10.1.0.2")
    });
    let (_, mode) = ns.get("127.0.0.1:10249", "/proxyMode");
    assert_eq!(mode, "iptables");
    // kind turns tcpBeLiberal on.
    let liberal = ns.must(
        "cat",
        &["/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"],
    );
    assert_eq!(liberal.trim(), "1");
    // --logging-format=json: every line a JSON object; -v=4 reaches debug.
    let log = kp.log();
    let lines: Vec<&str> = log.lines().filter(|l| !l.is_empty()).collect();
    assert!(!lines.is_empty());
    for l in &lines {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert!(v.get("level").is_some(), "{l}");
    }
    assert!(lines.iter().any(|l| l.contains("\"DEBUG\"")), "{log}");
}

#[test]
fn cleanup_removes_every_proxys_rules_and_nothing_else() {
    let Some(ns) = Ns::new("cleanup") else { return };
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster.yaml");
    std::fs::write(
        &cluster,
        list(&[service("web", "172.30.0.1"), slice("web", &["10.1.0.1"])]),
    )
    .unwrap();
    let sw = env!("CARGO_BIN_EXE_switchyard");
    let cluster = cluster.display().to_string();
    // Ours in nftables mode, kube-proxy's iptables layout (our iptables mode writes its
    // chain names), kube-proxy's nftables table, and someone else's rules.
    ns.must(sw, &["sync", "--once", "--manifests", &cluster]);
    ns.must(
        sw,
        &[
            "sync",
            "--once",
            "--proxy-mode",
            "iptables",
            "--manifests",
            &cluster,
        ],
    );
    ns.must("nft", &["add", "table", "ip", "kube-proxy"]);
    ns.must("nft", &["add", "table", "ip6", "kube-proxy"]);
    ns.must("nft", &["add", "table", "inet", "someone-else"]);
    ns.must("iptables-nft", &["-t", "nat", "-N", "DOCKER"]);
    assert!(ns.iptables_save().contains("KUBE-SERVICES"));

    let bin = kube_proxy_binary(dir.path());
    let out = ns.exec(bin.to_str().unwrap(), &["--cleanup"]);
    assert!(out.success(), "{}", out.transcript());
    let tables = ns.nft_tables();
    assert!(!tables.contains("switchyard"), "{tables}");
    assert!(!tables.contains("kube-proxy"), "{tables}");
    assert!(tables.contains("someone-else"), "{tables}");
    let ipt = ns.iptables_save();
    assert!(proxy_lines(&ipt).is_empty(), "{ipt}");
    assert!(ipt.contains(":DOCKER"), "{ipt}");
}

/// A pod network: the node namespace and an endpoint namespace on a veth, with a TCP
/// server at the endpoint that answers each connection with one line.
fn endpoint_pod(node: &Ns, tag: &str) -> (Ns, Arc<AtomicBool>) {
    let pod = Ns::new(tag).expect("second namespace");
    let veth = format!("v{}", std::process::id() % 100000);
    netns::must(
        "ip",
        &[
            "-n", &node.0, "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns",
            &pod.0,
        ],
        None,
    );
    node.must("ip", &["addr", "add", "10.200.0.1/24", "dev", &veth]);
    node.must("ip", &["link", "set", &veth, "up"]);
    // Service addresses need a route out, as on a node with a default route.
    node.must("ip", &["route", "add", "172.30.0.0/16", "dev", &veth]);
    pod.must("ip", &["addr", "add", "10.200.0.2/24", "dev", "eth0"]);
    pod.must("ip", &["link", "set", "eth0", "up"]);
    pod.must("ip", &["route", "add", "default", "via", "10.200.0.1"]);
    let listener = netns::in_netns(&pod.0, || TcpListener::bind("10.200.0.2:8080")).unwrap();
    listener.set_nonblocking(true).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    std::thread::spawn(move || {
        while !stop2.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((mut s, _)) => {
                    let _ = s.write_all(b"pod\n");
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    });
    (pod, stop)
}

/// What serves the service on the node before the image swap.
#[derive(Clone, Copy, PartialEq)]
enum Before {
    /// kube-proxy's iptables layout as our iptables mode writes it (its chain names).
    OurIptablesLayout,
    /// The real kube-proxy v1.37.2 in this mode, run against the same API server and then
    /// stopped, its rules left in the kernel as a replaced pod leaves them.
    RealKubeProxy(&'static str),
}

#[test]
fn image_swap_over_kube_proxys_iptables_layout_loses_no_connection() {
    image_swap(Before::OurIptablesLayout, "swap");
}

#[test]
fn image_swap_over_the_real_kube_proxy_in_iptables_mode_loses_no_connection() {
    if real_kube_proxy().is_some() {
        image_swap(Before::RealKubeProxy("iptables"), "swapipt");
    }
}

#[test]
fn image_swap_over_the_real_kube_proxy_in_nftables_mode_loses_no_connection() {
    if real_kube_proxy().is_some() {
        image_swap(Before::RealKubeProxy("nftables"), "swapnft");
    }
}

fn image_swap(before: Before, tag: &str) {
    let Some(node) = Ns::new(tag) else { return };
    let (_pod, stop_server) = endpoint_pod(&node, &format!("{tag}-pod"));
    let dir = tempfile::tempdir().unwrap();
    let api = api_in(&node, "10.200.0.2");
    match before {
        Before::OurIptablesLayout => {
            let cluster = dir.path().join("cluster.yaml");
            std::fs::write(
                &cluster,
                list(&[service("web", "172.30.0.1"), slice("web", &["10.200.0.2"])]),
            )
            .unwrap();
            node.must(
                env!("CARGO_BIN_EXE_switchyard"),
                &[
                    "sync",
                    "--once",
                    "--proxy-mode",
                    "iptables",
                    "--hostname-override",
                    "node-a",
                    "--manifests",
                    cluster.to_str().unwrap(),
                ],
            );
        }
        Before::RealKubeProxy(mode) => {
            let real = real_kube_proxy().expect("checked by the caller");
            let kubeconfig = dir.path().join("real.kubeconfig");
            std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
            let log = dir.path().join("real-kube-proxy.log");
            let child = Command::new("ip")
                .args(["netns", "exec", &node.0])
                .arg(&real)
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .args([
                    &format!("--proxy-mode={mode}"),
                    "--hostname-override=node-a",
                    "--kube-api-content-type=application/json",
                    // The conntrack hash size is the whole machine's: leave it alone.
                    "--conntrack-max-per-core=0",
                    "--iptables-min-sync-period=0s",
                ])
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .expect("start the real kube-proxy");
            let real_proc = Proc(child, log);
            wait_for("the real kube-proxy's rules", &real_proc, || {
                let rules = if mode == "iptables" {
                    node.exec("iptables-nft-save", &[]).stdout
                } else {
                    node.exec("nft", &["list", "table", "ip", "kube-proxy"])
                        .stdout
                };
                rules.contains("172.30.0.1") && rules.contains("10.200.0.2")
            });
            // The old pod goes; its rules stay and keep serving.
            drop(real_proc);
        }
    }

    // A client on the node opening connections to the service all along.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let client = {
        let (stop, ok, failed, ns) = (stop.clone(), ok.clone(), failed.clone(), node.0.clone());
        std::thread::spawn(move || {
            let mut failures = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let r = netns::in_netns(&ns, || {
                    let mut s = TcpStream::connect_timeout(
                        &"172.30.0.1:80".parse().unwrap(),
                        Duration::from_secs(2),
                    )?;
                    s.set_read_timeout(Some(Duration::from_secs(2)))?;
                    let mut line = String::new();
                    s.read_to_string(&mut line)?;
                    Ok(line)
                });
                match r {
                    Ok(l) if l == "pod\n" => ok.fetch_add(1, Ordering::Relaxed),
                    other => {
                        failures.push(format!("{other:?}"));
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
                std::thread::sleep(Duration::from_millis(5));
            }
            failures
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while ok.load(Ordering::Relaxed) < 20 {
        assert!(
            Instant::now() < deadline,
            "the service did not answer before the swap"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // The image swap: kubeadm's command line and ConfigMap (mode "" is nftables here).
    let config = installer_config(dir.path(), KUBEADM_CONFIG, &api);
    let kp = start_kube_proxy(&node, dir.path(), &kubeadm_args(&config));
    wait_for(
        "nftables programmed and kube-proxy's rules gone",
        &kp,
        || {
            let nft = node
                .exec("nft", &["list", "table", "ip", "switchyard"])
                .stdout;
            let ipt = node.exec("iptables-nft-save", &[]).stdout;
            let tables = node.exec("nft", &["list", "tables"]).stdout;
            nft.contains("172.30.0.1")
                && proxy_lines(&ipt).is_empty()
                && !tables.contains("kube-proxy")
        },
    );
    let after = ok.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(10);
    while ok.load(Ordering::Relaxed) < after + 20 {
        assert!(
            Instant::now() < deadline,
            "no connection after the swap\n{}",
            kp.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let failures = client.join().unwrap();
    stop_server.store(true, Ordering::Relaxed);
    assert!(
        failures.is_empty(),
        "{} of {} connections failed during the swap: {failures:?}\n{}",
        failures.len(),
        failures.len() + ok.load(Ordering::Relaxed),
        kp.log()
    );
    let removed = match before {
        Before::RealKubeProxy("nftables") => "kube-proxy's nftables table",
        _ => "KUBE- iptables chains",
    };
    assert!(kp.log().contains(removed), "{}", kp.log());
}

/// A valid value for each flag of the pinned release's `kube-proxy --help`.
fn sample(flag: &str, dir: &Path) -> Option<String> {
    let config = dir.join("sample.conf");
    let v = match flag {
        "bind-address" => "0.0.0.0",
        "cluster-cidr" => "10.244.0.0/16",
        "config" => return Some(config.display().to_string()),
        "write-config-to" => return Some(dir.join("other.yaml").display().to_string()),
        "detect-local-mode" => "ClusterCIDR",
        "feature-gates" => "AllowServiceExternalIPs=true",
        "healthz-bind-address" => "0.0.0.0:10256",
        "metrics-bind-address" => "127.0.0.1:10249",
        "hostname-override" => "node-a",
        "ipvs-exclude-cidrs" => "10.0.0.0/8",
        "ipvs-scheduler" => "rr",
        "kube-api-burst" => "10",
        "kube-api-content-type" => "application/json",
        "kube-api-qps" => "5",
        "kubeconfig" => "/dev/null",
        "log-json-info-buffer-size" | "log-text-info-buffer-size" => "0",
        "logging-format" => "text",
        "master" => "https://127.0.0.1:6443",
        "nodeport-addresses" => "primary",
        "oom-score-adj" => "-999",
        "pod-bridge-interface" => "cbr0",
        "pod-interface-name-prefix" => "veth",
        "proxy-mode" => "nftables",
        "show-hidden-metrics-for-version" => "1.36",
        "v" => "2",
        "vmodule" => "proxier=4",
        "version" => "true",
        "help" => "true",
        f if f.starts_with("conntrack-max") || f == "conntrack-min" || f.ends_with("-bit") => "14",
        f if f.ends_with("period")
            || f.ends_with("timeout")
            || f.ends_with("timeout-established")
            || f.ends_with("timeout-close-wait")
            || f.ends_with("timeout-stream")
            || f == "log-flush-frequency" =>
        {
            "5s"
        }
        // The boolean flags.
        "bind-address-hard-fail"
        | "cleanup"
        | "conntrack-tcp-be-liberal"
        | "init-only"
        | "iptables-localhost-nodeports"
        | "ipvs-strict-arp"
        | "log-json-split-stream"
        | "log-text-split-stream"
        | "masquerade-all"
        | "profiling" => "true",
        _ => return None,
    };
    Some(v.to_string())
}

#[test]
fn every_flag_of_kube_proxy_v1_37_parses() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("sample.conf"), "mode: nftables\n").unwrap();
    let bin = kube_proxy_binary(dir.path());
    let flags: Vec<&str> = HELP
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix("-h, ")
                .or(l.strip_prefix("-v, "))
                .unwrap_or(l);
            l.strip_prefix("--")?.split([' ', '[']).next()
        })
        .collect();
    assert!(flags.len() >= 50, "{flags:?}");
    for flag in &flags {
        let value = sample(flag, dir.path())
            .unwrap_or_else(|| panic!("no sample value for --{flag}: add one"));
        let out_file = dir.path().join("written.yaml");
        // --write-config-to makes the run parse, validate and exit without touching the
        // kernel (--help and --version win over it and exit 0 too).
        let out = Command::new(&bin)
            .arg(format!("--{flag}={value}"))
            .arg(format!("--write-config-to={}", out_file.display()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "--{flag}={value}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // kube-proxy's deprecated, hidden port flags parse too.
    for flag in ["--healthz-port=10256", "--metrics-port=0"] {
        let out = Command::new(&bin)
            .args([flag, "--write-config-to=/dev/null"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{flag}");
    }
    // A flag kube-proxy does not have is an error, as in kube-proxy.
    let out = Command::new(&bin).arg("--no-such-flag").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown flag: --no-such-flag"));
    // A flag first (not the name) selects kube-proxy's command line too.
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["--v=2", "--version"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("kube-proxy v1.37.2"));
}

#[test]
fn write_config_to_writes_a_file_both_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let bin = kube_proxy_binary(dir.path());
    let out_file = dir.path().join("written.yaml");
    let out = Command::new(&bin)
        .args([
            "--proxy-mode=iptables",
            "--cluster-cidr=10.244.0.0/16",
            "--conntrack-max-per-core=0",
        ])
        .arg(format!("--write-config-to={}", out_file.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&out_file).unwrap();
    assert!(text.contains("kind: KubeProxyConfiguration"), "{text}");
    // Read back with --config: the same configuration comes out again.
    let again = dir.path().join("again.yaml");
    let out = Command::new(&bin)
        .arg(format!("--config={}", out_file.display()))
        .arg(format!("--write-config-to={}", again.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&again).unwrap(), text);
}

/// The real kube-proxy v1.37.2 (tests/cluster/build.sh), when it is built.
fn real_kube_proxy() -> Option<PathBuf> {
    let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/k8s/v1.37.2/bin/kube-proxy");
    if bin.exists() {
        return Some(bin);
    }
    assert!(
        std::env::var("SWITCHYARD_REQUIRE_CLUSTER").as_deref() != Ok("1"),
        "SWITCHYARD_REQUIRE_CLUSTER=1 but {} is missing (tests/cluster/build.sh)",
        bin.display()
    );
    println!("SKIP: the real kube-proxy is not built (tests/cluster/build.sh)");
    None
}

/// `--write-config-to` of a binary for these arguments, read back as data.
fn written_config(bin: &Path, args: &[String], dir: &Path) -> Value {
    let out_file = dir.join("written.yaml");
    let _ = std::fs::remove_file(&out_file);
    let out = Command::new(bin)
        .args(args)
        .arg(format!("--write-config-to={}", out_file.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} {args:?}: {}",
        bin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_saphyr::from_str(&std::fs::read_to_string(&out_file).unwrap()).unwrap()
}

/// The configuration Switchyard builds from kube-proxy's command line and files is the one
/// the real kube-proxy v1.37.2 builds, field for field (what `/configz` serves too), for the
/// installers' ConfigMaps and for flag sets across every mode. Where kube-proxy reads
/// `mode: ""` as iptables, Switchyard reads nftables: the one designed difference, so the
/// cases name the mode.
#[test]
fn configuration_matches_the_real_kube_proxy_field_for_field() {
    let Some(real) = real_kube_proxy() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ours = kube_proxy_binary(dir.path());
    let kubeadm = dir.path().join("kubeadm.conf");
    std::fs::write(
        &kubeadm,
        KUBEADM_CONFIG.replace("mode: \"\"", "mode: nftables"),
    )
    .unwrap();
    let kind = dir.path().join("kind.conf");
    std::fs::write(&kind, KIND_CONFIG).unwrap();
    let cases: Vec<Vec<String>> = vec![
        vec!["--proxy-mode=nftables".to_string()],
        vec![
            "--proxy-mode=iptables",
            "--cluster-cidr=10.0.0.0/8,fd00::/64",
            "--iptables-sync-period=45s",
            "--iptables-min-sync-period=2s",
            "--conntrack-max-per-core=0",
            "--masquerade-all",
            "--nodeport-addresses=primary,10.0.0.0/8",
            "--oom-score-adj=-500",
            "--healthz-bind-address=127.0.0.1:10256",
            // No effect when writing the configuration out, in kube-proxy as here.
            "--metrics-port=0",
            "--feature-gates=AllowServiceExternalIPs=false",
            "--v=3",
            "--logging-format=json",
            "--kube-api-qps=20",
            "--kube-api-burst=40",
            "--iptables-masquerade-bit=13",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        vec![
            "--proxy-mode=ipvs",
            "--ipvs-scheduler=lc",
            "--ipvs-sync-period=10s",
            "--ipvs-min-sync-period=2s",
            "--ipvs-exclude-cidrs=10.9.0.0/16",
            "--ipvs-strict-arp",
            "--ipvs-tcp-timeout=900s",
            "--conntrack-tcp-be-liberal",
            "--conntrack-udp-timeout=30s",
            "--bind-address=::",
            "--detect-local-mode=InterfaceNamePrefix",
            "--pod-interface-name-prefix=veth",
            "--vmodule=proxier=4",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        vec![
            format!("--config={}", kubeadm.display()),
            "--hostname-override=Node-A".into(),
            "--v=2".into(),
            // Ignored beside --config, by both.
            "--proxy-mode=iptables".into(),
        ],
        vec![
            format!("--config={}", kind.display()),
            "--hostname-override=kind-worker".into(),
        ],
    ];
    for args in cases {
        let want = written_config(&real, &args, dir.path());
        let got = written_config(&ours, &args, dir.path());
        assert_eq!(
            got,
            want,
            "{args:?}\nours:\n{}\nkube-proxy:\n{}",
            serde_json::to_string_pretty(&got).unwrap(),
            serde_json::to_string_pretty(&want).unwrap()
        );
    }
    // kube-proxy's own refusals are Switchyard's too.
    for bad in [
        vec!["--logging-format=json", "--vmodule=proxier=4"],
        vec!["--show-hidden-metrics-for-version=1.30"],
        vec!["--oom-score-adj=2000"],
        vec!["--nodeport-addresses=primary,primary"],
        vec!["--feature-gates=MultiCIDRServiceAllocator=false"],
        vec!["--no-such-flag"],
    ] {
        let args: Vec<String> = bad.iter().map(|s| s.to_string()).collect();
        for bin in [&real, &ours] {
            let out = Command::new(bin)
                .args(&args)
                .arg(format!(
                    "--write-config-to={}",
                    dir.path().join("x.yaml").display()
                ))
                .output()
                .unwrap();
            assert!(!out.status.success(), "{} accepted {args:?}", bin.display());
        }
    }
}

/// Metric families of a scrape: name -> (type, label names). Histogram and summary samples
/// count for their family; `le` and `quantile` are the type's own labels, not the family's.
fn families(text: &str) -> std::collections::BTreeMap<String, (String, Vec<String>)> {
    let mut out = std::collections::BTreeMap::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            out.insert(name.to_string(), (kind.to_string(), Vec::new()));
        }
    }
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, labels)) = l.split_once('{') else {
            continue;
        };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|s| name.strip_suffix(s))
            .find(|f| out.contains_key(*f))
            .unwrap_or(name);
        let Some((_, names)) = out.get_mut(family) else {
            continue;
        };
        for pair in labels.split("\",") {
            let key = pair
                .split('=')
                .next()
                .unwrap()
                .trim_matches(['{', '}', ',']);
            if !key.is_empty()
                && key != "le"
                && key != "quantile"
                && !names.iter().any(|n| n == key)
            {
                names.push(key.to_string());
            }
        }
    }
    for (_, names) in out.values_mut() {
        names.sort();
    }
    out
}

/// The metrics a dashboard reads from kube-proxy are there when Switchyard replaces it: in
/// each mode, every `kubeproxy_` family the real kube-proxy v1.37.2 exports on the same node
/// with the same services (a TCP and a UDP one), with its type and label names, and the API
/// client and process families dashboards chart. The real binary's scrape is the reference,
/// not a list of ours. (IPVS mode is left out: the real kube-proxy needs the ip_vs module,
/// which only the QEMU guest has.)
#[test]
fn metrics_are_the_real_kube_proxys_in_each_mode() {
    let Some(real) = real_kube_proxy() else {
        return;
    };
    for mode in ["iptables", "nftables"] {
        let Some(node) = Ns::new(&format!("metrics{}", &mode[..3])) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let api = api_in(&node, "10.200.0.2");
        api.apply(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "dns", "namespace": "ns"},
            "spec": {"clusterIP": "172.30.0.53", "clusterIPs": ["172.30.0.53"],
                "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}}));
        api.apply(
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "dns-1", "namespace": "ns",
                "labels": {"kubernetes.io/service-name": "dns"}},
            "addressType": "IPv4", "ports": [{"name": "dns", "port": 5353, "protocol": "UDP"}],
            "endpoints": [{"addresses": ["10.200.0.3"], "conditions": {"ready": true}}]}),
        );
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
        let args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--proxy-mode={mode}"),
            "--hostname-override=node-a".to_string(),
            "--kube-api-content-type=application/json".to_string(),
            "--conntrack-max-per-core=0".to_string(),
        ];
        let scrape = |what: &str, bin: &Path| {
            let log = dir.path().join(format!("{what}.log"));
            let child = Command::new("ip")
                .args(["netns", "exec", &node.0])
                .arg(bin)
                .args(&args)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            let p = Proc(child, log);
            // After the first sync and its conntrack reconciliation.
            let mut text = String::new();
            wait_for(&format!("{what}'s first sync in {mode} mode"), &p, || {
                text = match http::get(&node.0, "127.0.0.1:10249", "/metrics") {
                    Ok((200, body)) => body,
                    _ => return false,
                };
                text.lines().any(|l| {
                    l.starts_with("kubeproxy_sync_proxy_rules_last_timestamp_seconds")
                        && !l.ends_with(" 0")
                })
                    // Both proxies observe the reconciliation's latency and then add to its
                    // counter (kube-proxy: pkg/proxy/conntrack/cleanup.go CleanStaleEntries);
                    // a scrape between the two sees one family without the other.
                    && text.contains("kubeproxy_conntrack_reconciler_sync_duration_seconds_count")
                    && text.contains("kubeproxy_conntrack_reconciler_deleted_entries_total")
            });
            drop(p);
            text
        };
        let theirs = families(&scrape("kube-proxy", &real));
        let ours = families(&scrape("switchyard", &kube_proxy_binary(dir.path())));
        let charted = |name: &str| {
            name.starts_with("kubeproxy_")
                || [
                    "rest_client_requests_total",
                    "rest_client_request_duration_seconds",
                    "process_cpu_seconds_total",
                    "process_resident_memory_bytes",
                    "process_start_time_seconds",
                    "process_open_fds",
                    "process_max_fds",
                ]
                .contains(&name)
        };
        // kube-proxy's iptables mode counts two kinds of packets in nfacct objects; Switchyard
        // writes neither rule yet (README, "Not written"): these two are the known gap.
        let known_gap = [
            "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
            "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
        ];
        let differ: Vec<String> = theirs
            .iter()
            .filter(|(name, _)| charted(name) && !known_gap.contains(&name.as_str()))
            .filter(|(name, want)| ours.get(*name) != Some(*want))
            .map(|(name, want)| {
                format!(
                    "{name}: kube-proxy {want:?}, switchyard {:?}",
                    ours.get(name)
                )
            })
            .collect();
        assert!(
            differ.is_empty(),
            "{mode} mode, families that differ from the real kube-proxy's:\n{}\n\nkube-proxy's: {:?}",
            differ.join("\n"),
            theirs.keys().filter(|n| charted(n)).collect::<Vec<_>>()
        );
        assert!(
            theirs
                .keys()
                .filter(|n| n.starts_with("kubeproxy_"))
                .count()
                >= 10,
            "{theirs:?}"
        );
    }
}
