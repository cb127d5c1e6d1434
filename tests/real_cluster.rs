//! Switchyard against a real control plane: etcd, kube-apiserver and kube-controller-manager
//! of the pinned release (`tests/cluster/up.sh`, one per test on ports of its own), so the
//! RBAC is the real authorizer's and the EndpointSlices are the real controller's.
//!
//! - The chart, rendered by Helm, is applied for real (its DaemonSet by server-side dry run);
//!   the agent runs with a token of the chart's own ServiceAccount; the grants in effect are
//!   exactly the chart's; each rule it needs is shown needed (without it, a 403).
//! - Pods are network namespaces registered as Pod objects (Ready through the status
//!   subresource); Services of several types select them; real TCP and UDP reach the right
//!   pods; a deletion, readiness flips and a new pod are in the kernel within a second of the
//!   controller's slice; `kubeproxy_network_programming_duration_seconds` shows it; `switchyard
//!   trace` against the cluster agrees with the packets.
//! - kube-apiserver restarted under live traffic: the rules stay, no connection fails, and
//!   the agent follows the next change.
//!
//! Without the binaries (tests/cluster/build.sh), root, helm_python, openssl or curl it prints
//! SKIP, unless SWITCHYARD_REQUIRE_CLUSTER=1 (CI), where that is a failure.

#![allow(clippy::expect_used, clippy::unwrap_used)]
#![allow(dead_code)]

#[path = "rig/netns.rs"]
mod netns;

#[path = "rig/http.rs"]
mod http;

#[path = "rig/net.rs"]
mod net;

#[path = "rig/exposition.rs"]
mod exposition;

#[path = "rig/control_plane.rs"]
mod control_plane;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use control_plane::{k8s_bin, pdeathsig, Cluster, Relay};
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, Node as NodeObject, Pod, Service, ServiceAccount,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{json, Value};

const NODE_NAME: &str = "node-a";
const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
const EXT_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 2);
/// The node's address on every pod's veth (the pods' default gateway).
const POD_GW: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// A pod that only sends (no Pod object, no Service selects it).
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 100);
const HTTP_PORT: u16 = 8080;
const DNS_PORT: u16 = 5353;
const LB_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
const EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 20);
/// The IPv6 gateway every pod routes through (a veth's node end), as POD_GW for IPv4.
const POD_GW6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x169, 0x254, 0, 0, 0, 0, 1);

/// A pod's (or the client's) IPv6 address in a dual-stack node: fd00:10:244:: and the last
/// octet of its IPv4 address.
fn v6_of(ip: Ipv4Addr) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x10, 0x244, 0, 0, 0, 0, u16::from(ip.octets()[3]))
}

/// The ingress of the LoadBalancer Service with externalTrafficPolicy Local.
const LOCAL_LB_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 11);
/// The chart's metricsBindAddress and healthzBindAddress (0.0.0.0:10256), inside the node.
const METRICS: &str = "127.0.0.1:10249";
const HEALTHZ: &str = "127.0.0.1:10256";
/// The chart's ServiceAccount, release `sy` in kube-system (tests/chart/render.py).
const CHART_SA: &str = "system:serviceaccount:kube-system:sy-switchyard";
/// How soon after the controller's slice the kernel must follow (kube-proxy's minSyncPeriod
/// is 1 s too; each timed change comes after a quiet second, so no rate limit applies).
const FOLLOW_BOUND: Duration = Duration::from_secs(1);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn has_tool(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Prints SKIP, or fails under SWITCHYARD_REQUIRE_CLUSTER=1.
fn skip<T>(test: &str, why: &str) -> Option<T> {
    assert!(
        std::env::var("SWITCHYARD_REQUIRE_CLUSTER").as_deref() != Ok("1"),
        "SWITCHYARD_REQUIRE_CLUSTER=1 but {why}"
    );
    println!("SKIP {test}: {why}");
    None
}

/// Everything a test here needs, with the chart rendered; `None` is a skip.
fn preflight(test: &str) -> Option<Chart> {
    for b in [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kubectl",
    ] {
        if !k8s_bin(b).is_file() {
            return skip(
                test,
                &format!(
                    "{} is missing (tests/cluster/build.sh builds it)",
                    k8s_bin(b).display()
                ),
            );
        }
    }
    if !netns::is_root() {
        return skip(test, "needs root (network namespaces, nftables)");
    }
    for tool in ["openssl", "curl", "nft", "ip"] {
        if !has_tool(tool) {
            return skip(test, &format!("needs {tool} (tests/cluster/up.sh)"));
        }
    }
    let chart = match Chart::render() {
        Ok(c) => c,
        Err(why) => return skip(test, &why),
    };
    netns::delete_stale_namespaces();
    Some(chart)
}

// ---------------------------------------------------------------------------------------
// The chart

/// The chart rendered by the real Helm library with its default values.
struct Chart {
    docs: Vec<Value>,
}

impl Chart {
    fn render() -> Result<Chart, String> {
        let dir = tempfile::tempdir().unwrap();
        let values = dir.path().join("values.json");
        std::fs::write(&values, "{}").unwrap();
        let out = Command::new("python3")
            .arg(root().join("tests/chart/render.py"))
            .arg(root().join("charts/switchyard"))
            .arg(&values)
            .output()
            .map_err(|e| format!("python3: {e}"))?;
        if out.status.code() == Some(3) {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        assert!(
            out.status.success(),
            "render.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rendered: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(rendered["error"].is_null(), "Helm refused: {rendered}");
        let mut docs = Vec::new();
        for (template, text) in rendered["manifests"].as_object().unwrap() {
            if template.ends_with("NOTES.txt") {
                continue;
            }
            let all: Vec<Value> =
                serde_saphyr::from_multiple(text.as_str().unwrap()).expect("rendered YAML");
            docs.extend(all.into_iter().filter(|v| !v.is_null()));
        }
        Ok(Chart { docs })
    }

    fn one(&self, kind: &str) -> Value {
        let all: Vec<&Value> = self.docs.iter().filter(|d| d["kind"] == kind).collect();
        assert_eq!(all.len(), 1, "the chart renders one {kind}");
        all[0].clone()
    }

    /// The KubeProxyConfiguration of the chart's ConfigMap (what its pods mount).
    fn config(&self) -> String {
        self.one("ConfigMap")["data"]["config.yaml"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

/// The chart applied to a cluster: the files an agent needs to run as its DaemonSet would.
struct Installed {
    /// A kubeconfig with a token of the chart's ServiceAccount.
    kubeconfig: PathBuf,
    /// The ConfigMap's KubeProxyConfiguration.
    config: PathBuf,
}

/// Applies the chart's ServiceAccount, ClusterRole, ClusterRoleBinding and ConfigMap for
/// real, dry-runs its DaemonSet on the server, and makes a token for the ServiceAccount.
fn install(cluster: &Cluster, chart: &Chart) -> Installed {
    let objects: Vec<Value> = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
    ]
    .iter()
    .map(|k| chart.one(k))
    .collect();
    assert_eq!(
        objects.len() + 1,
        chart.docs.len(),
        "the default values render these and a DaemonSet; a new kind needs applying here too"
    );
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects}).to_string();
    let out = cluster.kubectl_ok(&["apply", "--validate=strict", "-f", "-"], Some(&list));
    for want in [
        "serviceaccount/sy-switchyard",
        "clusterrole.rbac.authorization.k8s.io/sy-switchyard",
        "clusterrolebinding.rbac.authorization.k8s.io/sy-switchyard",
        "configmap/sy-switchyard",
    ] {
        assert!(out.contains(want), "{want} not applied:\n{out}");
    }
    // The DaemonSet: validated and admitted by the server, not stored (no DaemonSet
    // controller or kubelet runs here).
    let ds = chart.one("DaemonSet").to_string();
    let out = cluster.kubectl_ok(
        &[
            "apply",
            "--validate=strict",
            "--dry-run=server",
            "-o",
            "json",
            "-f",
            "-",
        ],
        Some(&ds),
    );
    let admitted: Value = serde_json::from_str(&out).expect("dry-run prints the object");
    assert_eq!(
        admitted["spec"]["template"]["spec"]["serviceAccountName"],
        "sy-switchyard"
    );
    let gone = cluster.kubectl(
        &["-n", "kube-system", "get", "daemonset", "sy-switchyard"],
        None,
    );
    assert!(
        !gone.success() && gone.stderr.contains("NotFound"),
        "a dry run stored the DaemonSet:\n{}",
        gone.transcript()
    );
    let token = cluster.kubectl_ok(
        &[
            "-n",
            "kube-system",
            "create",
            "token",
            "sy-switchyard",
            "--duration=1h",
        ],
        None,
    );
    let kubeconfig = cluster.work.join("sy-switchyard.kubeconfig");
    std::fs::write(&kubeconfig, cluster.token_kubeconfig(token.trim())).unwrap();
    let config = cluster.work.join("config.yaml");
    std::fs::write(&config, chart.config()).unwrap();
    Installed { kubeconfig, config }
}

/// A test's real control plane with the chart installed. Fields drop in this order: the
/// client, then the control plane, before the scratch folder is kept or removed.
struct Setup {
    kube: Kube,
    cluster: Cluster,
    install: Installed,
    chart: Chart,
    work: Work,
    t0: Instant,
}

impl Setup {
    /// `None` (a skip) where `preflight` says the test cannot run.
    fn start(test: &str) -> Option<Setup> {
        let chart = preflight(test)?;
        let t0 = Instant::now();
        let work = Work::new(test);
        let cluster = Cluster::start(work.path());
        let kube = Kube::new(&cluster.admin_kubeconfig());
        let install = install(&cluster, &chart);
        Some(Setup {
            kube,
            cluster,
            install,
            chart,
            work,
            t0,
        })
    }
}

/// The test's scratch folder (logs of the agents and the control plane), removed at the end
/// unless the test failed or SWITCHYARD_KEEP_WORK=1.
struct Work(Option<tempfile::TempDir>);

impl Work {
    fn new(test: &str) -> Work {
        Work(Some(
            tempfile::Builder::new()
                .prefix(&format!("switchyard-real-{test}-"))
                .tempdir()
                .unwrap(),
        ))
    }

    fn path(&self) -> &Path {
        self.0.as_ref().unwrap().path()
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var("SWITCHYARD_KEEP_WORK").as_deref() == Ok("1") {
            let dir = self.0.take().unwrap().keep();
            println!("kept {}", dir.display());
        }
    }
}

// ---------------------------------------------------------------------------------------
// The API, as the admin

/// A blocking face on a kube client with the admin's kubeconfig.
struct Kube {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
}

impl Kube {
    fn new(kubeconfig: &Path) -> Kube {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(async {
            let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .unwrap();
            kube::Client::try_from(cfg).unwrap()
        });
        Kube { rt, client }
    }

    fn api(&self, kind: &str, ns: Option<&str>) -> kube::Api<DynamicObject> {
        let ar = match kind {
            "ConfigMap" => ApiResource::erase::<ConfigMap>(&()),
            "Namespace" => ApiResource::erase::<Namespace>(&()),
            "Node" => ApiResource::erase::<NodeObject>(&()),
            "Pod" => ApiResource::erase::<Pod>(&()),
            "Service" => ApiResource::erase::<Service>(&()),
            "ServiceAccount" => ApiResource::erase::<ServiceAccount>(&()),
            "EndpointSlice" => ApiResource::erase::<EndpointSlice>(&()),
            other => panic!("no API for {other} here"),
        };
        match ns {
            Some(ns) => kube::Api::namespaced_with(self.client.clone(), ns, &ar),
            None => kube::Api::all_with(self.client.clone(), &ar),
        }
    }

    /// Server-side apply.
    fn apply(&self, obj: Value) -> Value {
        let kind = obj["kind"].as_str().unwrap();
        let name = obj["metadata"]["name"].as_str().unwrap();
        let api = self.api(kind, obj["metadata"]["namespace"].as_str());
        let done = self
            .rt
            .block_on(api.patch(
                name,
                &PatchParams::apply("switchyard-real-cluster-test").force(),
                &Patch::Apply(&obj),
            ))
            .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
        serde_json::to_value(done).unwrap()
    }

    /// Creates `objects` (all of one kind, in `ns`), `parallel` requests at a time.
    fn create_all(&self, kind: &str, ns: &str, objects: Vec<Value>, parallel: usize) {
        use futures_util::StreamExt;
        let api = self.api(kind, Some(ns));
        let failed: Vec<String> = self.rt.block_on(
            futures_util::stream::iter(objects)
                .map(|obj| {
                    let api = api.clone();
                    async move {
                        let o: DynamicObject = serde_json::from_value(obj).unwrap();
                        let name = o.metadata.name.clone().unwrap_or_default();
                        api.create(&kube::api::PostParams::default(), &o)
                            .await
                            .err()
                            .map(|e| format!("{name}: {e}"))
                    }
                })
                .buffer_unordered(parallel)
                .filter_map(|r| async move { r })
                .collect(),
        );
        assert!(failed.is_empty(), "create {kind}: {failed:?}");
    }

    /// A merge patch of the status subresource.
    fn patch_status(&self, kind: &str, ns: Option<&str>, name: &str, status: Value) {
        let api = self.api(kind, ns);
        self.rt
            .block_on(api.patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            ))
            .unwrap_or_else(|e| panic!("status of {kind} {name}: {e}"));
    }

    /// Deletes at once (no kubelet here would confirm a graceful deletion).
    fn delete_now(&self, kind: &str, ns: Option<&str>, name: &str) {
        let api = self.api(kind, ns);
        self.rt
            .block_on(api.delete(name, &DeleteParams::default().grace_period(0)))
            .unwrap_or_else(|e| panic!("delete {kind} {name}: {e}"));
    }

    /// Deletes a Pod with its grace period (30 s): with no kubelet to finish the deletion it
    /// stays terminating.
    fn delete_graceful(&self, ns: &str, name: &str) {
        let api = self.api("Pod", Some(ns));
        self.rt
            .block_on(api.delete(name, &DeleteParams::default()))
            .unwrap_or_else(|e| panic!("delete Pod {name}: {e}"));
    }

    fn get(&self, kind: &str, ns: Option<&str>, name: &str) -> Option<Value> {
        let api = self.api(kind, ns);
        self.rt
            .block_on(api.get_opt(name))
            .unwrap_or_else(|e| panic!("get {kind} {name}: {e}"))
            .map(|o| serde_json::to_value(o).unwrap())
    }

    fn list(&self, kind: &str, ns: Option<&str>) -> Vec<Value> {
        let api = self.api(kind, ns);
        self.rt
            .block_on(api.list(&ListParams::default()))
            .unwrap_or_else(|e| panic!("list {kind}: {e}"))
            .items
            .into_iter()
            .map(|o| serde_json::to_value(o).unwrap())
            .collect()
    }

    /// A namespace for this test's objects, once its default ServiceAccount exists (the
    /// ServiceAccount admission plugin refuses Pods until then).
    fn namespace(&self, name: &str) {
        self.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}));
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.get("ServiceAccount", Some(name), "default").is_none() {
            assert!(
                Instant::now() < deadline,
                "no default ServiceAccount in {name}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The Node with its InternalIP (the EndpointSlice controller skips Pods on a Node it
    /// cannot find; the agent takes its primary address from here).
    fn node(&self) {
        self.apply(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE_NAME, "labels": {"kubernetes.io/hostname": NODE_NAME}}}));
        self.patch_status(
            "Node",
            None,
            NODE_NAME,
            json!({"addresses": [{"type": "InternalIP", "address": NODE_IP.to_string()},
                                 {"type": "Hostname", "address": NODE_NAME}]}),
        );
    }

    /// Another Node (a second node of the cluster, with no agent of ours): the EndpointSlice
    /// controller writes the node name of Pods on it into their endpoints.
    fn other_node(&self, name: &str, ip: Ipv4Addr) {
        self.apply(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}));
        self.patch_status(
            "Node",
            None,
            name,
            json!({"addresses": [{"type": "InternalIP", "address": ip.to_string()}]}),
        );
    }

    /// As `pod`, on Node `node`, with one address per family in `ips` (the first is podIP).
    fn pod_on(&self, ns: &str, name: &str, app: &str, node: &str, ips: &[IpAddr], since: &str) {
        self.apply(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
            "spec": {"nodeName": node, "containers": [{"name": "web",
                "image": "registry.invalid/web:1",
                "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
                          {"name": "dns", "containerPort": DNS_PORT, "protocol": "UDP"}]}]}}));
        let pod_ips: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect();
        self.patch_status(
            "Pod",
            Some(ns),
            name,
            json!({"phase": "Running", "hostIP": NODE_IP.to_string(),
                "hostIPs": [{"ip": NODE_IP.to_string()}],
                "podIP": ips[0].to_string(), "podIPs": pod_ips,
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": since}]}),
        );
    }

    /// A Pod on the node labelled `app`, with a named TCP port `http` and UDP port `dns`,
    /// Running and Ready since `since`.
    fn pod(&self, ns: &str, name: &str, app: &str, ip: Ipv4Addr, since: &str) {
        self.apply(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
            "spec": {"nodeName": NODE_NAME, "containers": [{"name": "web",
                "image": "registry.invalid/web:1",
                "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
                          {"name": "dns", "containerPort": DNS_PORT, "protocol": "UDP"}]}]}}));
        self.patch_status(
            "Pod",
            Some(ns),
            name,
            json!({"phase": "Running", "hostIP": NODE_IP.to_string(),
                "hostIPs": [{"ip": NODE_IP.to_string()}],
                "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}],
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": since}]}),
        );
    }

    fn set_ready(&self, ns: &str, name: &str, ready: bool, since: &str) {
        let status = if ready { "True" } else { "False" };
        self.patch_status(
            "Pod",
            Some(ns),
            name,
            json!({"conditions": [{"type": "Ready", "status": status, "lastTransitionTime": since}]}),
        );
    }

    /// Every endpoint in the namespace's slices (one per slice it is in).
    fn endpoints(&self, ns: &str) -> Vec<Endpoint> {
        let mut out = Vec::new();
        for s in self.list("EndpointSlice", Some(ns)) {
            for e in s["endpoints"].as_array().cloned().unwrap_or_default() {
                let c = &e["conditions"];
                for a in e["addresses"].as_array().unwrap() {
                    out.push(Endpoint {
                        address: a.as_str().unwrap().to_string(),
                        ready: c["ready"].as_bool().unwrap_or(true),
                        serving: c["serving"].as_bool().unwrap_or(true),
                        terminating: c["terminating"].as_bool().unwrap_or(false),
                    });
                }
            }
        }
        out
    }
}

/// An endpoint of an EndpointSlice, as the controller wrote it.
#[derive(Debug)]
struct Endpoint {
    address: String,
    ready: bool,
    serving: bool,
    terminating: bool,
}

/// Sleeps to just past the next whole second and returns it in RFC 3339. The EndpointSlice
/// controller copies a Pod's Ready lastTransitionTime (whole seconds) into the slice's
/// trigger-time annotation, so a change made at the start of a second gives the network
/// programming latency to within a few milliseconds.
fn next_second() -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let next = now.as_secs() + 1;
    std::thread::sleep(Duration::from_secs(next) + Duration::from_millis(5) - now);
    k8s_openapi::jiff::Timestamp::from_second(next as i64)
        .unwrap()
        .to_string()
}

fn now_rfc3339() -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    k8s_openapi::jiff::Timestamp::from_second(now.as_secs() as i64)
        .unwrap()
        .to_string()
}

// ---------------------------------------------------------------------------------------
// The node: network namespaces

/// A pod: a network namespace with a veth into the node, one address, and a TCP and a UDP
/// responder that answer with their own address and the peer they saw.
struct PodNs {
    name: String,
    ns: String,
    ip: Ipv4Addr,
}

/// The node (where the agent runs), an external host on its uplink, the pods, and a client
/// pod. Everything is deleted on drop.
struct Node {
    node: String,
    ext: String,
    client: String,
    pods: Vec<PodNs>,
    namespaces: Vec<String>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Node {
    fn build(pods: &[(&str, Ipv4Addr)]) -> Node {
        Node::build_with(pods, false)
    }

    /// As `build`, and every pod and the client also get an IPv6 address ([`v6_of`]),
    /// routed through the node as the IPv4 ones are, with the responders on both.
    fn build_dual_stack(pods: &[(&str, Ipv4Addr)]) -> Node {
        Node::build_with(pods, true)
    }

    fn build_with(pods: &[(&str, Ipv4Addr)], dual: bool) -> Node {
        let prefix = netns::unique_prefix();
        let mut node = Node {
            node: format!("{prefix}node"),
            ext: format!("{prefix}ext"),
            client: format!("{prefix}client"),
            pods: pods
                .iter()
                .enumerate()
                .map(|(i, (name, ip))| PodNs {
                    name: name.to_string(),
                    ns: format!("{prefix}pod{i}"),
                    ip: *ip,
                })
                .collect(),
            namespaces: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
        };
        let common = [
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
            "net.ipv4.icmp_ratelimit=0",
        ];
        let router = [
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.send_redirects=0",
            "net.ipv4.conf.default.send_redirects=0",
        ];
        let mut all: Vec<(String, Ipv4Addr)> = vec![(node.client.clone(), CLIENT_IP)];
        all.extend(node.pods.iter().map(|p| (p.ns.clone(), p.ip)));
        for ns in [node.node.clone(), node.ext.clone()]
            .into_iter()
            .chain(all.iter().map(|(ns, _)| ns.clone()))
        {
            netns::create_namespace(&ns).unwrap_or_else(|e| panic!("{e}"));
            node.namespaces.push(ns.clone());
            netns::sysctls(&ns, &common);
        }
        netns::sysctls(&node.node, &router);
        let mut links = vec![
            format!("link add up0 type veth peer name eth0 netns {}", node.ext),
            format!("addr add {NODE_IP}/24 dev up0"),
            "link set up0 up".to_string(),
        ];
        for (i, (ns, _)) in all.iter().enumerate() {
            links.push(format!("link add p{i} type veth peer name eth0 netns {ns}"));
            links.push(format!("addr add {POD_GW}/32 dev p{i}"));
            links.push(format!("link set p{i} up"));
        }
        netns::ip_batch(&node.node, &links);
        netns::ip_batch(
            &node.ext,
            &[
                format!("addr add {EXT_IP}/24 dev eth0"),
                "link set eth0 up".into(),
                format!("route add default via {NODE_IP} dev eth0"),
            ],
        );
        let mut routes = vec![format!("route add default via {EXT_IP} dev up0")];
        for (i, (ns, ip)) in all.iter().enumerate() {
            netns::ip_batch(
                ns,
                &[
                    format!("addr add {ip}/32 dev eth0"),
                    "link set eth0 up".into(),
                    format!("route add {POD_GW} dev eth0"),
                    format!("route add default via {POD_GW} dev eth0"),
                ],
            );
            routes.push(format!("route add {ip}/32 dev p{i}"));
        }
        netns::ip_batch(&node.node, &routes);
        if dual {
            // Each veth's node end holds POD_GW6 (as it holds POD_GW) and routes the pod's
            // /128 to it; no duplicate address detection, so the addresses work at once.
            netns::sysctls(&node.node, &["net.ipv6.conf.all.forwarding=1"]);
            let mut routes6 = Vec::new();
            for (i, (ns, ip)) in all.iter().enumerate() {
                let v6 = v6_of(*ip);
                netns::ip_batch(
                    ns,
                    &[
                        format!("addr add {v6}/128 dev eth0 nodad"),
                        format!("route add {POD_GW6} dev eth0"),
                        format!("route add ::/0 via {POD_GW6} dev eth0"),
                    ],
                );
                routes6.push(format!("addr add {POD_GW6}/128 dev p{i} nodad"));
                routes6.push(format!("route add {v6}/128 dev p{i}"));
            }
            netns::ip_batch(&node.node, &routes6);
        }
        for p in &node.pods {
            let mut addrs = vec![IpAddr::V4(p.ip)];
            if dual {
                addrs.push(IpAddr::V6(v6_of(p.ip)));
            }
            for addr in addrs {
                let tcp = SocketAddr::new(addr, HTTP_PORT);
                let udp = SocketAddr::new(addr, DNS_PORT);
                node.threads.push(
                    net::spawn_tcp_responder(
                        &p.ns,
                        tcp,
                        net::ResponderMode::OneShot,
                        node.stop.clone(),
                    )
                    .unwrap(),
                );
                node.threads
                    .push(net::spawn_udp_responder(&p.ns, udp, node.stop.clone()).unwrap());
            }
        }
        node
    }

    fn pod(&self, name: &str) -> &PodNs {
        self.pods.iter().find(|p| p.name == name).unwrap()
    }

    /// The namespace a source address sends from.
    fn ns_of(&self, src: Ipv4Addr) -> &str {
        match src {
            NODE_IP => &self.node,
            EXT_IP => &self.ext,
            CLIENT_IP => &self.client,
            other => &self.pods.iter().find(|p| p.ip == other).unwrap().ns,
        }
    }

    /// `nft list table ip switchyard` in the node (empty when there is none).
    fn ruleset(&self) -> String {
        netns::run(
            "ip",
            &[
                "netns",
                "exec",
                &self.node,
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

    /// `n` connections (or UDP exchanges) from `src` to `dst`: who answered, how often.
    fn sample(&self, src: Ipv4Addr, dst: SocketAddr, udp: bool, n: usize) -> Seen {
        self.sample_from(IpAddr::V4(src), dst, udp, n)
    }

    /// As `sample`, from an IPv4 address or the IPv6 address ([`v6_of`]) of a pod or the
    /// client of a dual-stack node.
    fn sample_from(&self, src: IpAddr, dst: SocketAddr, udp: bool, n: usize) -> Seen {
        let v4 = match src {
            IpAddr::V4(a) => a,
            IpAddr::V6(a) => std::iter::once(CLIENT_IP)
                .chain(self.pods.iter().map(|p| p.ip))
                .find(|ip| v6_of(*ip) == a)
                .unwrap(),
        };
        let ns = self.ns_of(v4).to_string();
        let mut seen = Seen::default();
        for _ in 0..n {
            let outcome = if udp {
                net::probe_udp(&ns, src, dst)
            } else {
                net::probe_tcp(&ns, src, dst)
            };
            match outcome {
                net::Outcome::Reply { local, peer } => {
                    *seen.endpoints.entry(local).or_default() += 1;
                    seen.peers.insert(peer);
                }
                other => seen.failures.push(other.to_string()),
            }
        }
        seen
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for ns in &self.namespaces {
            netns::delete_namespace(ns);
        }
    }
}

#[derive(Default, Debug)]
struct Seen {
    endpoints: BTreeMap<SocketAddr, usize>,
    peers: BTreeSet<IpAddr>,
    failures: Vec<String>,
}

impl Seen {
    fn answered(&self) -> BTreeSet<SocketAddr> {
        self.endpoints.keys().copied().collect()
    }
}

/// Live traffic: a TCP connection from the client pod to `to` every 20 ms until stopped.
struct Prober {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<net::Outcome>>,
}

impl Prober {
    fn start(node: &Node, to: SocketAddr) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let (ns, flag) = (node.client.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut outcomes = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                outcomes.push(net::probe_tcp(&ns, IpAddr::V4(CLIENT_IP), to));
                std::thread::sleep(Duration::from_millis(20));
            }
            outcomes
        });
        Prober { stop, thread }
    }

    /// Every connection's outcome, in order.
    fn stop(self) -> Vec<net::Outcome> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

fn endpoints_at(ips: &[Ipv4Addr], port: u16) -> BTreeSet<SocketAddr> {
    ips.iter()
        .map(|ip| SocketAddr::new(IpAddr::V4(*ip), port))
        .collect()
}

/// The endpoints (`ip . port`) a frontend DNATs to in the nftables layout: the values of the
/// backends maps' elements `<key> . <slot> : <ip> . <port>`, where the key is
/// `<address> . <proto> . <port>` (or `<proto> . <port>` for a NodePort).
fn backends(ruleset: &str, key: &str) -> BTreeSet<String> {
    ruleset
        .split([',', '{', '}', '\n'])
        .map(str::trim)
        .filter_map(|element| {
            let rest = element.strip_prefix(key)?.strip_prefix(" . ")?;
            let (slot, value) = rest.split_once(" : ")?;
            slot.parse::<u32>().ok()?;
            Some(value.trim().to_string())
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// The agent

/// `switchyard run` in a namespace, as the chart's DaemonSet runs it (its ConfigMap's
/// configuration, the node's name), with the given kubeconfig; killed on drop.
struct Agent {
    child: Option<Child>,
    ns: String,
    log: PathBuf,
}

impl Agent {
    fn start(ns: &str, install: &Installed, kubeconfig: &Path, log: PathBuf) -> Agent {
        let mut argv: Vec<String> = vec!["netns".into(), "exec".into(), ns.into()];
        argv.extend(pdeathsig("KILL"));
        argv.extend([
            env!("CARGO_BIN_EXE_switchyard").to_string(),
            "run".into(),
            format!("--config={}", install.config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--hostname-override={NODE_NAME}"),
        ]);
        let child = Command::new("ip")
            .args(&argv)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start switchyard run");
        Agent {
            child: Some(child),
            ns: ns.to_string(),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (bounded) until the log holds `what`.
    fn wait_log(&self, what: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.log().contains(what) {
            assert!(
                Instant::now() < deadline,
                "no {what:?} in the agent's log after {timeout:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (bounded) until the log holds one of `what`.
    fn wait_log_any(&self, what: &[&str], timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.log();
            if what.iter().any(|w| log.contains(w)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "none of {what:?} in the agent's log after {timeout:?}:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Lines that say the API server refused the agent.
    fn forbidden(&self) -> Vec<String> {
        refusals(&self.log())
    }

    fn get(&self, addr: &str, path: &str) -> (u16, String) {
        http::get(&self.ns, addr, path)
            .unwrap_or_else(|e| panic!("GET {addr}{path} in {}: {e}\n{}", self.ns, self.log()))
    }

    fn metrics(&self) -> String {
        let (code, body) = self.get(METRICS, "/metrics");
        assert_eq!(code, 200, "{body}");
        body
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Lines of an agent's log that say the API server refused it (403 Forbidden; a log line
/// names the code, the reason, or both).
fn refusals(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| {
            l.contains("code: 403")
                || l.contains("with 403")
                || l.to_ascii_lowercase().contains("forbidden")
        })
        .map(str::to_string)
        .collect()
}

/// Waits until the namespace's EndpointSlices satisfy `slices_ok` and then the node's rules
/// `rules_ok`; returns how long the rules took after this poll saw the slices.
fn follow(
    what: &str,
    kube: &Kube,
    ns: &str,
    node: &Node,
    agent: &Agent,
    slices_ok: impl Fn(&[Endpoint]) -> bool,
    rules_ok: impl Fn(&str) -> bool,
) -> Duration {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut slices_at: Option<Instant> = None;
    loop {
        if slices_at.is_none() && slices_ok(&kube.endpoints(ns)) {
            slices_at = Some(Instant::now());
        }
        let rules = node.ruleset();
        // Right rules before right slices do not count: the controller may write an
        // intermediate state first (a Pod deleted with no grace period shows as terminating
        // for a moment, and a terminating endpoint is not used while ready ones are there),
        // so wait for the slices, then read the rules again.
        if let (true, Some(at)) = (rules_ok(&rules), slices_at) {
            return at.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not followed (slices {}) after 20 s\nslices: {:?}\nrules:\n{rules}\nagent log:\n{}",
            if slices_at.is_some() { "changed" } else { "unchanged" },
            kube.endpoints(ns),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `switchyard trace` in the node against the live cluster, as JSON.
fn trace(node: &Node, install: &Installed, from: Ipv4Addr, to: &str, kind: &str) -> Value {
    let out = netns::run(
        "ip",
        &[
            "netns",
            "exec",
            &node.node,
            env!("CARGO_BIN_EXE_switchyard"),
            "trace",
            &format!("--config={}", install.config.display()),
            &format!("--kubeconfig={}", install.kubeconfig.display()),
            &format!("--hostname-override={NODE_NAME}"),
            "--from",
            &from.to_string(),
            "--to",
            to,
            "--from-kind",
            kind,
            "--json",
        ],
        None,
        Duration::from_secs(30),
    );
    assert!(out.success(), "{}", out.transcript());
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

fn trace_endpoints(t: &Value) -> BTreeSet<SocketAddr> {
    t["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["endpoint"].as_str().unwrap().parse().unwrap())
        .collect()
}

/// `kubectl auth can-i --list` for a user, one normalized line per grant.
fn grants(cluster: &Cluster, user: &str) -> BTreeSet<String> {
    let out = cluster.kubectl_ok(&["auth", "can-i", "--list", &format!("--as={user}")], None);
    out.lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect()
}

/// Waits until the authorizer answers `want` for `user` doing `verb resource`.
fn wait_can_i(cluster: &Cluster, user: &str, verb: &str, resource: &str, want: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = cluster.kubectl(
            &["auth", "can-i", verb, resource, &format!("--as={user}")],
            None,
        );
        if out.stdout.trim() == if want { "yes" } else { "no" } {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "can-i {verb} {resource} never became {want}:\n{}",
            out.transcript()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------------------
// The tests

/// The chart's objects are accepted by the real API server, its ServiceAccount ends up with
/// exactly the chart's grants, each rule the agent needs is needed (without it, a 403), and
/// with all of them the agent lists, syncs and programs the kubernetes Service with no 403.
#[test]
fn chart_is_accepted_and_its_role_is_enough_and_no_broader() {
    let test = "chart";
    let Some(setup) = Setup::start(test) else {
        return;
    };
    let Setup {
        kube,
        cluster,
        install,
        chart,
        work,
        t0,
    } = &setup;
    kube.node();

    // What the ServiceAccount may do beyond what every authenticated user may: exactly the
    // chart's grants. (`default` in kube-system has no binding of its own.)
    let sa = grants(cluster, CHART_SA);
    let base = grants(cluster, "system:serviceaccount:kube-system:default");
    let extra: BTreeSet<String> = sa.difference(&base).cloned().collect();
    let want: BTreeSet<String> = [
        "endpointslices.discovery.k8s.io [] [] [get list watch]",
        "events.events.k8s.io [] [] [create]",
        "nodes [] [] [get list watch]",
        "servicecidrs.networking.k8s.io [] [] [get list watch]",
        "services [] [] [get list watch]",
    ]
    .map(String::from)
    .into();
    assert_eq!(extra, want, "the grants in effect for {CHART_SA}");

    // Each rule, taken out of the ClusterRole, makes the agent's lists fail with 403: the
    // role is no broader than the agent needs. A second namespace holds these agents.
    let probe_ns = format!("{}rbac", netns::unique_prefix());
    netns::create_namespace(&probe_ns).unwrap();
    struct DeleteNs(String);
    impl Drop for DeleteNs {
        fn drop(&mut self) {
            netns::delete_namespace(&self.0);
        }
    }
    let _probe_ns = DeleteNs(probe_ns.clone());
    let _relay = Relay::start(&probe_ns, cluster.port);
    let role = chart.one("ClusterRole");
    let rules = role["rules"].as_array().unwrap().clone();
    for (i, rule) in rules.iter().enumerate() {
        let mut narrowed = role.clone();
        narrowed["rules"].as_array_mut().unwrap().remove(i);
        cluster.kubectl_ok(&["replace", "-f", "-"], Some(&narrowed.to_string()));
        let resources: Vec<String> = rule["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap().to_string())
            .collect();
        let group = rule["apiGroups"][0].as_str().unwrap();
        let first = if group.is_empty() {
            resources[0].clone()
        } else {
            format!("{}.{group}", resources[0])
        };
        let verb = rule["verbs"][0].as_str().unwrap();
        wait_can_i(cluster, CHART_SA, verb, &first, false);
        let agent = Agent::start(
            &probe_ns,
            install,
            &install.kubeconfig,
            work.path().join(format!("agent-without-rule-{i}.log")),
        );
        if resources == ["events"] {
            // The agent records kube-proxy's Starting event: without this rule that one
            // request is refused (and logged), and everything else goes on.
            agent.wait_log("cannot record the Starting event", Duration::from_secs(15));
            assert!(
                agent.log().contains("forbidden") || agent.log().contains("403"),
                "{}",
                agent.log()
            );
            agent.wait_log("full sync", Duration::from_secs(15));
            continue;
        }
        // The initial list is a streaming watch (WatchListClient), so the refusal names
        // watch; a LIST (the fallback) would name list.
        for r in &resources {
            agent.wait_log_any(
                &[
                    &format!("cannot watch resource \"{r}\""),
                    &format!("cannot list resource \"{r}\""),
                ],
                Duration::from_secs(15),
            );
        }
        // Nothing syncs before every initial list is in.
        assert!(!agent.log().contains("full sync"), "{}", agent.log());
    }
    let role_json = role.to_string();
    cluster.kubectl_ok(&["replace", "-f", "-"], Some(&role_json));
    wait_can_i(
        cluster,
        CHART_SA,
        "list",
        "servicecidrs.networking.k8s.io",
        true,
    );
    wait_can_i(cluster, CHART_SA, "list", "services", true);
    wait_can_i(cluster, CHART_SA, "list", "nodes", true);
    wait_can_i(
        cluster,
        CHART_SA,
        "list",
        "endpointslices.discovery.k8s.io",
        true,
    );

    // With the chart's role whole, the agent in the node lists everything, syncs, serves its
    // health, and programs the kubernetes Service (no endpoints: up.sh runs no endpoint
    // reconciler), without one refusal.
    let node = Node::build(&[]);
    let _relay = Relay::start(&node.node, cluster.port);
    // Its lists are streaming watches, as kube-proxy v1.37's (client-go's WatchListClient):
    // kube-apiserver counts them in apiserver_watch_list_duration_seconds and sees no LIST.
    // Nothing else starts a list of these meanwhile (the controller-manager's informers
    // listed at its start).
    let counts = || -> Vec<(f64, f64)> {
        [r#"resource="services""#, r#"resource="endpointslices""#]
            .iter()
            .map(|resource| {
                (
                    cluster.apiserver_count(
                        "apiserver_watch_list_duration_seconds_count",
                        &[resource],
                    ),
                    cluster
                        .apiserver_count("apiserver_request_total", &[resource, r#"verb="LIST""#]),
                )
            })
            .collect()
    };
    let before = counts();
    let agent = Agent::start(
        &node.node,
        install,
        &install.kubeconfig,
        work.path().join("agent.log"),
    );
    for kind in ["Service", "EndpointSlice", "Node", "ServiceCIDR"] {
        agent.wait_log(&format!("{kind}: listed"), Duration::from_secs(15));
    }
    agent.wait_log("full sync", Duration::from_secs(15));
    let after = counts();
    for (i, resource) in ["services", "endpointslices"].iter().enumerate() {
        assert!(
            after[i].0 >= before[i].0 + 1.0,
            "{resource}: no streaming list counted by kube-apiserver ({:?} -> {:?})",
            before[i],
            after[i]
        );
        assert_eq!(
            after[i].1, before[i].1,
            "{resource}: the agent sent a LIST ({:?} -> {:?})",
            before[i], after[i]
        );
    }
    let rules = node.ruleset();
    assert!(
        rules.contains("10.96.0.1 . tcp . 443 : goto reject-chain"),
        "the kubernetes Service without endpoints is not rejected:\n{rules}"
    );
    assert!(
        rules.contains("10.96.0.0/16"),
        "the ServiceCIDR is not in the rules:\n{rules}"
    );
    let (code, body) = agent.get(HEALTHZ, "/healthz");
    assert_eq!(code, 200, "{body}");
    // kube-proxy's Starting event, regarding the node, as `kubectl get events` lists it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let listed: Value = serde_json::from_str(&cluster.kubectl_ok(
            &["get", "events.events.k8s.io", "-n", "default", "-o", "json"],
            None,
        ))
        .unwrap();
        let started = listed["items"].as_array().unwrap().iter().any(|e| {
            e["reason"] == "Starting"
                && e["action"] == "StartKubeProxy"
                && e["reportingController"] == "kube-proxy"
                && e["regarding"]["kind"] == "Node"
                && e["regarding"]["name"] == NODE_NAME
        });
        if started {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no Starting event for {NODE_NAME}: {listed}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(2));
    let refused = agent.forbidden();
    assert!(refused.is_empty(), "refused:\n{}", refused.join("\n"));
    // The API client's own count of answers, by code: 200s, and not one 403.
    let metrics = agent.metrics();
    let answers: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("rest_client_requests_total{"))
        .collect();
    assert!(
        answers.iter().any(|l| l.contains("code=\"200\"")),
        "{metrics}"
    );
    assert!(
        !answers.iter().any(|l| l.contains("code=\"403\"")),
        "{answers:?}"
    );
    println!("chart test: {:.1} s", t0.elapsed().as_secs_f64());
}

/// Pods registered for real, Services of several types over them, real TCP and UDP from a
/// pod, the node and outside reaching the right pods; a deletion, readiness flips and a new
/// pod each in the kernel within a second of the controller's slice, with the network
/// programming latency to show for it; trace agrees with the packets.
#[test]
fn real_slices_reach_the_right_pods_and_changes_are_followed_within_a_second() {
    let test = "traffic";
    let Some(setup) = Setup::start(test) else {
        return;
    };
    let Setup {
        kube,
        cluster,
        install,
        work,
        t0,
        ..
    } = &setup;
    // `web` pods are behind one ClusterIP Service (TCP and UDP), so each change to one of
    // them is one slice update, timed below. `front` pods are behind a NodePort Service, a
    // LoadBalancer Service with an externalIP, a ClusterIP Service with session affinity and
    // a LoadBalancer Service with externalTrafficPolicy Local.
    let (w0, w1, w2) = (
        Ipv4Addr::new(10, 244, 0, 10),
        Ipv4Addr::new(10, 244, 0, 11),
        Ipv4Addr::new(10, 244, 0, 12),
    );
    let (f0, f1) = (Ipv4Addr::new(10, 244, 0, 20), Ipv4Addr::new(10, 244, 0, 21));
    let pods = [
        ("web-0", "web", w0),
        ("web-1", "web", w1),
        ("web-2", "web", w2),
        ("front-0", "front", f0),
        ("front-1", "front", f1),
    ];
    let node = Node::build(&pods.map(|(name, _, ip)| (name, ip)));
    let _relay = Relay::start(&node.node, cluster.port);
    let agent = Agent::start(
        &node.node,
        install,
        &install.kubeconfig,
        work.path().join("agent.log"),
    );
    agent.wait_log("full sync", Duration::from_secs(20));

    let ns = "rc-traffic";
    kube.node();
    kube.namespace(ns);
    let since = now_rfc3339();
    for (name, app, ip) in pods {
        kube.pod(ns, name, app, ip, &since);
    }
    let port = |name: &str, port: u16, target: &str, proto: &str| json!({"name": name, "port": port, "targetPort": target, "protocol": proto});
    let web = kube.apply(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"selector": {"app": "web"},
            "ports": [port("http", 80, "http", "TCP"), port("dns", 53, "dns", "UDP")]}}));
    let np = kube.apply(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "front-np", "namespace": ns},
        "spec": {"type": "NodePort", "selector": {"app": "front"},
            "ports": [port("http", 80, "http", "TCP")]}}));
    let lb = kube.apply(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "front-lb", "namespace": ns},
        "spec": {"type": "LoadBalancer", "selector": {"app": "front"},
            "externalIPs": [EXTERNAL_IP.to_string()],
            "ports": [port("http", 80, "http", "TCP")]}}));
    kube.patch_status(
        "Service",
        Some(ns),
        "front-lb",
        json!({"loadBalancer": {"ingress": [{"ip": LB_IP.to_string()}]}}),
    );
    let sticky = kube.apply(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "front-sticky", "namespace": ns},
        "spec": {"selector": {"app": "front"}, "sessionAffinity": "ClientIP",
            "ports": [port("http", 80, "http", "TCP")]}}));
    // externalTrafficPolicy Local: the API server allocates its health check node port.
    let local = kube.apply(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "front-local", "namespace": ns},
        "spec": {"type": "LoadBalancer", "selector": {"app": "front"},
            "externalTrafficPolicy": "Local",
            "ports": [port("http", 80, "http", "TCP")]}}));
    kube.patch_status(
        "Service",
        Some(ns),
        "front-local",
        json!({"loadBalancer": {"ingress": [{"ip": LOCAL_LB_IP.to_string()}]}}),
    );
    let health_port = local["spec"]["healthCheckNodePort"]
        .as_u64()
        .expect("a health check node port") as u16;
    let cluster_ip =
        |svc: &Value| -> Ipv4Addr { svc["spec"]["clusterIP"].as_str().unwrap().parse().unwrap() };
    let node_port = |svc: &Value| svc["spec"]["ports"][0]["nodePort"].as_u64().unwrap() as u16;
    let web_ip = cluster_ip(&web);
    let (np_port, lb_port) = (node_port(&np), node_port(&lb));
    let web_tcp = format!("{web_ip} . tcp . 80");
    let web_udp = format!("{web_ip} . udp . 53");
    let front_keys = [
        format!("{} . tcp . 80", cluster_ip(&np)),
        format!("{} . tcp . 80", cluster_ip(&lb)),
        format!("{LB_IP} . tcp . 80"),
        format!("{EXTERNAL_IP} . tcp . 80"),
        format!("tcp . {np_port}"),
        format!("tcp . {lb_port}"),
    ];
    let values = |ips: &[Ipv4Addr], port: u16| -> BTreeSet<String> {
        ips.iter().map(|ip| format!("{ip} . {port}")).collect()
    };

    // The controller's slices, with the named ports resolved, reach the kernel: every
    // frontend DNATs to exactly its pods.
    follow(
        "five pods behind twelve frontends",
        kube,
        ns,
        &node,
        &agent,
        |eps| eps.iter().filter(|e| e.ready).count() == 3 + 4 * 2,
        |rules| {
            rules.contains(&format!("{}", cluster_ip(&sticky)))
                && rules.contains(&LOCAL_LB_IP.to_string())
                && backends(rules, &web_tcp) == values(&[w0, w1, w2], HTTP_PORT)
                && backends(rules, &web_udp) == values(&[w0, w1, w2], DNS_PORT)
                && front_keys
                    .iter()
                    .all(|k| backends(rules, k) == values(&[f0, f1], HTTP_PORT))
        },
    );
    let slices = kube.list("EndpointSlice", Some(ns));
    assert_eq!(slices.len(), 5, "{slices:?}");
    for s in &slices {
        assert_eq!(
            s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"],
            "endpointslice-controller.k8s.io"
        );
    }

    // Real traffic: each frontend reaches each of its pods, at the named target port.
    let vip = SocketAddr::new(IpAddr::V4(web_ip), 80);
    let dns = SocketAddr::new(IpAddr::V4(web_ip), 53);
    let check = |what: &str, src: Ipv4Addr, dst: SocketAddr, udp: bool, want: &[Ipv4Addr]| {
        let port = if udp { DNS_PORT } else { HTTP_PORT };
        let seen = node.sample(src, dst, udp, 30);
        assert!(
            seen.failures.is_empty() && seen.answered() == endpoints_at(want, port),
            "{what}: {src} -> {dst} {}: want {want:?}, saw {seen:?}\nrules:\n{}\nagent log:\n{}",
            if udp { "UDP" } else { "TCP" },
            node.ruleset(),
            agent.log()
        );
        seen
    };
    let web_all = [w0, w1, w2];
    let from_pod = check("ClusterIP from a pod", CLIENT_IP, vip, false, &web_all);
    assert_eq!(from_pod.peers, BTreeSet::from([IpAddr::V4(CLIENT_IP)]));
    let from_pod_udp = check("ClusterIP UDP from a pod", CLIENT_IP, dns, true, &web_all);
    check("ClusterIP from the node", NODE_IP, vip, false, &web_all);
    let nodeport = SocketAddr::new(IpAddr::V4(NODE_IP), np_port);
    let from_ext = check("NodePort from outside", EXT_IP, nodeport, false, &[f0, f1]);
    assert!(
        !from_ext.peers.contains(&IpAddr::V4(EXT_IP)),
        "externalTrafficPolicy Cluster masquerades: {from_ext:?}"
    );
    check(
        "the LoadBalancer's NodePort from outside",
        EXT_IP,
        SocketAddr::new(IpAddr::V4(NODE_IP), lb_port),
        false,
        &[f0, f1],
    );
    check(
        "LoadBalancer ingress from outside",
        EXT_IP,
        SocketAddr::new(IpAddr::V4(LB_IP), 80),
        false,
        &[f0, f1],
    );
    check(
        "externalIP from outside",
        EXT_IP,
        SocketAddr::new(IpAddr::V4(EXTERNAL_IP), 80),
        false,
        &[f0, f1],
    );

    // Session affinity: one client, one pod.
    let sticky_vip = SocketAddr::new(IpAddr::V4(cluster_ip(&sticky)), 80);
    let seen = node.sample(CLIENT_IP, sticky_vip, false, 12);
    assert!(
        seen.failures.is_empty() && seen.endpoints.len() == 1,
        "sessionAffinity ClientIP: {seen:?}"
    );
    // externalTrafficPolicy Local: the client's address reaches the pods, and the health
    // check node port counts this node's endpoints.
    let seen = check(
        "externalTrafficPolicy Local from outside",
        EXT_IP,
        SocketAddr::new(IpAddr::V4(LOCAL_LB_IP), 80),
        false,
        &[f0, f1],
    );
    assert_eq!(seen.peers, BTreeSet::from([IpAddr::V4(EXT_IP)]), "{seen:?}");
    let (code, body) = http::get(&node.ext, &format!("{NODE_IP}:{health_port}"), "/")
        .unwrap_or_else(|e| panic!("health check node port {health_port}: {e}"));
    let health: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(
        (code, &health["localEndpoints"], &health["service"]["name"]),
        (200, &json!(2), &json!("front-local")),
        "{body}"
    );

    // `switchyard trace` against the live cluster says what the packets did: the same
    // endpoints, and masquerade exactly when the pods saw another source.
    for (from, to, kind, seen) in [
        (CLIENT_IP, format!("{vip}/TCP"), "pod", &from_pod),
        (CLIENT_IP, format!("{dns}/UDP"), "pod", &from_pod_udp),
        (EXT_IP, format!("{nodeport}/TCP"), "external", &from_ext),
    ] {
        let t = trace(&node, install, from, &to, kind);
        assert_eq!(t["verdict"], "DNAT", "{from} -> {to}: {t}");
        assert_eq!(trace_endpoints(&t), seen.answered(), "{from} -> {to}: {t}");
        assert_eq!(
            t["masquerade"].as_bool().unwrap(),
            !seen.peers.contains(&IpAddr::V4(from)),
            "{from} -> {to}: trace {t}, the pods saw {:?}",
            seen.peers
        );
    }

    // Changes to the `web` pods, each after a quiet second (the chart's minSyncPeriod is
    // 1 s, as kube-proxy's: a slice that comes sooner after a sync waits for it by design)
    // and at the start of a second (see next_second); each is in the kernel within a second
    // of its slice.
    let before = agent.metrics();
    let mut followed = Vec::new();
    let mut last = Instant::now();
    let mut timed = |what: &str,
                     last: &mut Instant,
                     change: &dyn Fn(&str),
                     slices_ok: &dyn Fn(&[Endpoint]) -> bool,
                     want: &[Ipv4Addr],
                     bound: Duration| {
        let rules_ok = |rules: &str| {
            backends(rules, &web_tcp) == values(want, HTTP_PORT)
                && backends(rules, &web_udp) == values(want, DNS_PORT)
        };
        assert!(
            !rules_ok(&node.ruleset()),
            "{what}: the rules show it already"
        );
        let quiet = *last + Duration::from_millis(1050);
        std::thread::sleep(quiet.saturating_duration_since(Instant::now()));
        let at = next_second();
        change(&at);
        let took = follow(what, kube, ns, &node, &agent, slices_ok, rules_ok);
        *last = Instant::now();
        println!(
            "{what}: in the kernel {} ms after its slice",
            took.as_millis()
        );
        assert!(
            took <= bound,
            "{what}: the kernel followed the slice after {took:?}\nagent log:\n{}",
            agent.log()
        );
        followed.push((what.to_string(), took));
    };
    let has = |eps: &[Endpoint], ip: Ipv4Addr| eps.iter().any(|e| e.address == ip.to_string());
    let ready = |eps: &[Endpoint], ip: Ipv4Addr, want: bool| {
        eps.iter()
            .any(|e| e.address == ip.to_string() && e.ready == want)
    };
    let terminating = |eps: &[Endpoint], ip: Ipv4Addr| {
        eps.iter()
            .any(|e| e.address == ip.to_string() && !e.ready && e.serving && e.terminating)
    };

    // Scale down: web-2 deleted. UDP flows to it (the checks above made some) are cut by the
    // conntrack reconciliation that follows the sync, as kube-proxy's: wait for it, seen in
    // kube-proxy's own metric, before sending again.
    let reconciled = |text: &str| {
        let v = |m: &str| {
            exposition::value(
                text,
                &format!("kubeproxy_conntrack_reconciler_{m}{{ip_family=\"IPv4\"}}"),
            )
            .unwrap_or(0.0)
        };
        (v("sync_duration_seconds_count"), v("deleted_entries_total"))
    };
    let (reconciles, deleted) = reconciled(&agent.metrics());
    timed(
        "pod web-2 deleted",
        &mut last,
        &|_| kube.delete_now("Pod", Some(ns), "web-2"),
        &|eps| !has(eps, w2),
        &[w0, w1],
        FOLLOW_BOUND,
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = agent.metrics();
        let now = reconciled(&text);
        if now.1 > deleted {
            assert!(now.0 > reconciles, "{text}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the UDP flows to web-2 were not deleted 5 s after the deletion's sync \
             (reconciliations, deleted: {now:?}, before {:?})\nagent log:\n{}",
            (reconciles, deleted),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    check("after the deletion", CLIENT_IP, vip, false, &[w0, w1]);
    check("after the deletion (UDP)", CLIENT_IP, dns, true, &[w0, w1]);

    // Readiness flips: web-1 not ready, then ready again.
    timed(
        "web-1 not ready",
        &mut last,
        &|at| kube.set_ready(ns, "web-1", false, at),
        &|eps| ready(eps, w1, false),
        &[w0],
        FOLLOW_BOUND,
    );
    check("web-1 not ready", CLIENT_IP, vip, false, &[w0]);
    timed(
        "web-1 ready again",
        &mut last,
        &|at| kube.set_ready(ns, "web-1", true, at),
        &|eps| ready(eps, w1, true),
        &[w0, w1],
        FOLLOW_BOUND,
    );
    check("web-1 ready again", CLIENT_IP, vip, false, &[w0, w1]);

    // Scale up: web-2 back.
    timed(
        "pod web-2 added",
        &mut last,
        &|at| kube.pod(ns, "web-2", "web", w2, at),
        &|eps| ready(eps, w2, true),
        &web_all,
        FOLLOW_BOUND,
    );
    check("web-2 back", CLIENT_IP, vip, false, &web_all);
    check("web-2 back (UDP)", CLIENT_IP, dns, true, &web_all);

    // Terminating pods (deleted with a grace period, which no kubelet here ends): one is not
    // used while ready ones are there...
    timed(
        "web-0 terminating",
        &mut last,
        &|_| kube.delete_graceful(ns, "web-0"),
        &|eps| terminating(eps, w0),
        &[w1, w2],
        FOLLOW_BOUND,
    );
    check("web-0 terminating", CLIENT_IP, vip, false, &[w1, w2]);
    // ...and with every pod terminating, the serving ones are used (kube-proxy's fallback).
    // Two deletions may be two slice updates, and the second may come within the
    // minSyncPeriod of the first one's sync: a second more for this one.
    timed(
        "every web pod terminating",
        &mut last,
        &|_| {
            kube.delete_graceful(ns, "web-1");
            kube.delete_graceful(ns, "web-2");
        },
        &|eps| web_all.iter().all(|ip| terminating(eps, *ip)),
        &web_all,
        FOLLOW_BOUND + Duration::from_secs(1),
    );
    check("every web pod terminating", CLIENT_IP, vip, false, &web_all);

    // The agent's network programming latency, from the controller's trigger-time
    // annotations: observed for the flips and the new pod, each within a second.
    let metric = "kubeproxy_network_programming_duration_seconds";
    let after = agent.metrics();
    let count = |text: &str| {
        exposition::value(text, &exposition::v4(&format!("{metric}_count"))).unwrap_or(0.0)
    };
    let within = |text: &str| {
        exposition::buckets(text, metric)
            .iter()
            .find(|(le, _)| *le == 1.0)
            .map(|b| b.1)
            .unwrap_or_else(|| panic!("no le=\"1\" bucket in\n{text}"))
    };
    let observed = count(&after) - count(&before);
    let fast = within(&after) - within(&before);
    let sum = |text: &str| {
        exposition::value(text, &exposition::v4(&format!("{metric}_sum"))).unwrap_or(0.0)
    };
    let sum = sum(&after) - sum(&before);
    println!(
        "{metric}: {observed} new observations, {fast} within 1 s, {:.0} ms on average",
        if observed > 0.0 {
            sum / observed * 1000.0
        } else {
            0.0
        }
    );
    assert!(
        observed >= 3.0,
        "{observed} network programming observations for the flips and the new pod\n{after}"
    );
    assert_eq!(fast, observed, "observations over a second:\n{after}");

    let refused = agent.forbidden();
    assert!(refused.is_empty(), "refused:\n{}", refused.join("\n"));
    println!(
        "traffic test: {:.1} s (control plane {:.1} s); followed: {followed:?}",
        t0.elapsed().as_secs_f64(),
        cluster.started.as_secs_f64()
    );
}

/// kube-apiserver restarted (SIGTERM, SIGKILL after 5 s, started again) under live traffic:
/// the agent keeps its rules (never flushes), no connection fails meanwhile, its watches
/// come back, and the next change is followed.
#[test]
fn apiserver_restart_keeps_the_rules_and_the_agent_follows_after() {
    let test = "restart";
    let Some(setup) = Setup::start(test) else {
        return;
    };
    let Setup {
        kube,
        cluster,
        install,
        work,
        t0,
        ..
    } = &setup;
    let web = [
        ("web-0", Ipv4Addr::new(10, 244, 0, 10)),
        ("web-1", Ipv4Addr::new(10, 244, 0, 11)),
        ("web-2", Ipv4Addr::new(10, 244, 0, 12)),
    ];
    let node = Node::build(&web);
    let _relay = Relay::start(&node.node, cluster.port);
    let agent = Agent::start(
        &node.node,
        install,
        &install.kubeconfig,
        work.path().join("agent.log"),
    );
    let ns = "rc-restart";
    kube.node();
    kube.namespace(ns);
    let since = now_rfc3339();
    for (name, ip) in &web[..2] {
        kube.pod(ns, name, "web", *ip, &since);
    }
    let svc = kube.apply(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"selector": {"app": "web"}, "ports": [
            {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]}}));
    let vip = SocketAddr::new(
        IpAddr::V4(svc["spec"]["clusterIP"].as_str().unwrap().parse().unwrap()),
        80,
    );
    let (w0, w1, w2) = (web[0].1, web[1].1, web[2].1);
    let key = format!("{} . tcp . 80", vip.ip());
    let values = |ips: &[Ipv4Addr]| -> BTreeSet<String> {
        ips.iter().map(|ip| format!("{ip} . {HTTP_PORT}")).collect()
    };
    let serves = |rules: &str, ips: &[Ipv4Addr]| backends(rules, &key) == values(ips);
    follow(
        "two pods",
        kube,
        ns,
        &node,
        &agent,
        |eps| eps.iter().filter(|e| e.ready).count() == 2,
        |rules| serves(rules, &[w0, w1]),
    );

    // Live traffic and a watch on the rules, through the restart.
    let prober = Prober::start(&node, vip);
    let stop = Arc::new(AtomicBool::new(false));
    let node_ns = node.node.clone();
    let key_in_thread = key.clone();
    let watcher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let rules = netns::run(
                    "ip",
                    &[
                        "netns",
                        "exec",
                        &node_ns,
                        "nft",
                        "list",
                        "table",
                        "ip",
                        "switchyard",
                    ],
                    None,
                    netns::CMD_TIMEOUT,
                )
                .stdout;
                samples.push(backends(&rules, &key_in_thread));
                std::thread::sleep(Duration::from_millis(50));
            }
            samples
        })
    };
    // Changes the agent has seen, then etcd compacted past them: the revision its watches
    // resume from after the restart is gone.
    for i in 0..5 {
        kube.apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "churn", "namespace": ns}, "data": {"n": i.to_string()}}));
    }
    let compacted = cluster.compact_etcd();
    println!("etcd compacted at revision {compacted}");
    let log_before = agent.log().len();
    let (down, up) = cluster.restart_apiserver();
    let log_at_up = agent.log().len();
    println!(
        "kube-apiserver down and back in {:.1} s",
        up.duration_since(down).as_secs_f64()
    );
    // Traffic goes on while the agent reconnects.
    std::thread::sleep(Duration::from_secs(1));
    let since_restart = agent.log()[log_before..].to_string();
    assert!(
        since_restart.contains("retrying"),
        "the agent's watches never broke: the restart tested nothing\n{since_restart}"
    );

    // The next change after the restart is followed: a third pod.
    let at = now_rfc3339();
    let changed = Instant::now();
    kube.pod(ns, "web-2", "web", w2, &at);
    let took = follow(
        "a pod added after the restart",
        kube,
        ns,
        &node,
        &agent,
        |eps| eps.iter().any(|e| e.address == w2.to_string() && e.ready),
        |rules| serves(rules, &[w0, w1, w2]),
    );
    let total = changed.elapsed();
    println!(
        "after the restart: in the kernel {} ms after its slice, {} ms after the API call",
        took.as_millis(),
        total.as_millis()
    );
    assert!(
        took <= FOLLOW_BOUND,
        "after the restart the kernel followed the slice after {took:?}\n{}",
        agent.log()
    );
    stop.store(true, Ordering::Relaxed);
    let outcomes = prober.stop();
    let samples = watcher.join().unwrap();
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !matches!(o, net::Outcome::Reply { .. }))
        .map(|o| o.to_string())
        .collect();
    println!(
        "{} connections through the restart, {} rule samples",
        outcomes.len(),
        samples.len()
    );
    assert!(
        outcomes.len() >= 50,
        "too few connections: {}",
        outcomes.len()
    );
    assert!(failed.is_empty(), "connections failed: {failed:?}");
    // Never flushed: every sample of the rules, through the restart, DNATs to both pods
    // (and, once it is added, the third).
    let both = values(&[w0, w1]);
    let lost: Vec<&BTreeSet<String>> = samples.iter().filter(|s| !s.is_superset(&both)).collect();
    assert!(
        lost.is_empty(),
        "the rules lost endpoints during the restart ({} of {} samples, e.g. {:?})\n{}",
        lost.len(),
        samples.len(),
        lost.first(),
        agent.log()
    );
    let seen = node.sample(CLIENT_IP, vip, false, 30);
    assert_eq!(
        seen.answered(),
        endpoints_at(&[w0, w1, w2], HTTP_PORT),
        "after the restart: {seen:?}"
    );
    // A restarted kube-apiserver serves before its RBAC informers have synced, and until
    // then refuses everyone it has no bootstrap policy for: the agent's first watches after
    // the restart may get a 403 (it retries). Before the restart and once the server says it
    // is ready, none.
    let log = agent.log();
    let relists = log[log_before..].matches("relisted").count();
    let expired = log[log_before..].matches("Expired").count();
    println!(
        "after the restart the agent's watches: {relists} relists, {expired} of them after 410 Expired"
    );
    // Each watcher's resume met 410 Gone (its revision compacted away) and relisted whole.
    assert!(
        relists >= 1 && expired >= 1,
        "the watches did not relist after 410 Gone\n{}",
        &log[log_before..]
    );
    let early = refusals(&log[log_before..log_at_up]);
    if !early.is_empty() {
        println!(
            "refused while kube-apiserver was starting ({} lines), e.g.: {}",
            early.len(),
            early[0]
        );
    }
    let refused = [refusals(&log[..log_before]), refusals(&log[log_at_up..])].concat();
    assert!(refused.is_empty(), "refused:\n{}", refused.join("\n"));
    println!("restart test: {:.1} s", t0.elapsed().as_secs_f64());
}

/// A cluster of SWITCHYARD_REAL_SERVICES (10,000) Services with their EndpointSlices, created
/// through the real kube-apiserver: the agent takes them in one streaming list per kind and
/// programs every one; then etcd is compacted and kube-apiserver restarted, so every watch
/// meets 410 Gone and relists all of them: through it the rules are never flushed and
/// connections through one of the services never fail.
#[test]
fn ten_thousand_services_listed_and_relisted_from_the_real_api_server() {
    let test = "scale";
    let Some(setup) = Setup::start(test) else {
        return;
    };
    let Setup {
        kube,
        cluster,
        install,
        work,
        t0,
        ..
    } = &setup;
    let n: usize = std::env::var("SWITCHYARD_REAL_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let web = ("web-0", Ipv4Addr::new(10, 244, 0, 10));
    let node = Node::build(&[web]);
    let _relay = Relay::start(&node.node, cluster.port);
    let ns = "rc-scale";
    kube.node();
    kube.namespace(ns);

    // Services without selectors and slices of our own (as a controller of another project
    // would write them): s00000 has the live pod, the others two addresses nothing answers.
    let name = |i: usize| format!("s{i:05}");
    let made = Instant::now();
    let services: Vec<Value> = (0..n)
        .map(|i| {
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name(i), "namespace": ns},
                "spec": {"ports": [{"name": "http", "port": 80, "targetPort": HTTP_PORT,
                    "protocol": "TCP"}]}})
        })
        .collect();
    kube.create_all("Service", ns, services, 32);
    let slices: Vec<Value> = (0..n)
        .map(|i| {
            let addresses: Vec<String> = if i == 0 {
                vec![web.1.to_string()]
            } else {
                (0..2)
                    .map(|k| {
                        Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 230, 0, 0)) + (2 * i + k) as u32)
                            .to_string()
                    })
                    .collect()
            };
            let eps: Vec<Value> = addresses
                .iter()
                .map(|a| json!({"addresses": [a], "conditions": {"ready": true}}))
                .collect();
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": format!("{}-1", name(i)), "namespace": ns,
                    "labels": {"kubernetes.io/service-name": name(i),
                        "endpointslice.kubernetes.io/managed-by": "switchyard-real-cluster-test"}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": HTTP_PORT, "protocol": "TCP"}],
                "endpoints": eps})
        })
        .collect();
    kube.create_all("EndpointSlice", ns, slices, 32);
    println!(
        "{n} services and {n} slices created through kube-apiserver in {:.1} s",
        made.elapsed().as_secs_f64()
    );
    let first = kube.get("Service", Some(ns), &name(0)).unwrap();
    let vip = SocketAddr::new(
        IpAddr::V4(
            first["spec"]["clusterIP"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap(),
        ),
        80,
    );
    let last = kube.get("Service", Some(ns), &name(n - 1)).unwrap();
    let last_ip = last["spec"]["clusterIP"].as_str().unwrap().to_string();

    let started = Instant::now();
    let agent = Agent::start(
        &node.node,
        install,
        &install.kubeconfig,
        work.path().join("agent.log"),
    );
    agent.wait_log("Service: listed", Duration::from_secs(120));
    let listed = started.elapsed();
    agent.wait_log("full sync", Duration::from_secs(120));
    let synced = started.elapsed();
    let rules = node.ruleset();
    let programmed = rules.matches(". tcp . 80 : goto").count();
    println!(
        "agent: services listed {:.2} s after start, first full sync done {:.2} s after start; {programmed} service ports in the rules",
        listed.as_secs_f64(),
        synced.as_secs_f64()
    );
    assert!(
        agent
            .log()
            .contains(&format!("Service: listed {} objects", n + 1)),
        "the agent did not list every Service (the kubernetes Service included)\n{}",
        agent.log()
    );
    assert_eq!(programmed, n, "service ports in the rules");
    assert!(rules.contains(&format!("{last_ip} . tcp . 80 : goto")));
    let seen = node.sample(CLIENT_IP, vip, false, 5);
    assert_eq!(
        seen.answered(),
        endpoints_at(&[web.1], HTTP_PORT),
        "{seen:?}"
    );

    // Live traffic and a watch on the one service's element (`nft get element` is a lookup,
    // not a listing of 10k services), through compaction and restart.
    let prober = Prober::start(&node, vip);
    let stop = Arc::new(AtomicBool::new(false));
    let node_ns = node.node.clone();
    let element = format!("{{ {} . tcp . 80 }}", vip.ip());
    let watcher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut missing = Vec::new();
            let mut samples = 0;
            while !stop.load(Ordering::Relaxed) {
                let out = netns::run(
                    "ip",
                    &[
                        "netns",
                        "exec",
                        &node_ns,
                        "nft",
                        "get",
                        "element",
                        "ip",
                        "switchyard",
                        "service-ips",
                        &element,
                    ],
                    None,
                    netns::CMD_TIMEOUT,
                );
                samples += 1;
                if !out.success() {
                    missing.push(out.transcript());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            (samples, missing)
        })
    };
    let compacted = cluster.compact_etcd();
    let log_before = agent.log().len();
    let (down, up) = cluster.restart_apiserver();
    println!(
        "etcd compacted at revision {compacted}; kube-apiserver down and back in {:.1} s",
        up.duration_since(down).as_secs_f64()
    );
    // The relist of every Service after 410 Gone, taken whole.
    let relisted = format!("Service: relisted {} objects", n + 1);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !agent.log()[log_before..].contains(&relisted) {
        assert!(
            Instant::now() < deadline,
            "no {relisted:?} after the restart:\n{}",
            &agent.log()[log_before..]
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let relisted_after = up.elapsed();
    // Traffic goes on a moment past the relist.
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let outcomes = prober.stop();
    let (samples, missing) = watcher.join().unwrap();
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !matches!(o, net::Outcome::Reply { .. }))
        .map(|o| o.to_string())
        .collect();
    println!(
        "relisted {n} services {:.1} s after kube-apiserver was back; {} connections, {samples} rule samples",
        relisted_after.as_secs_f64(),
        outcomes.len()
    );
    assert!(failed.is_empty(), "connections failed: {failed:?}");
    assert!(
        outcomes.len() >= 50,
        "too few connections: {}",
        outcomes.len()
    );
    assert!(
        missing.is_empty(),
        "the service's element was missing in {} of {samples} samples: {:?}",
        missing.len(),
        missing.first()
    );
    let log = agent.log();
    assert!(
        log[log_before..].contains("Expired"),
        "no 410 Gone after the restart on a compacted etcd\n{}",
        &log[log_before..]
    );
    let after = node.ruleset();
    assert_eq!(after.matches(". tcp . 80 : goto").count(), n);
    println!("scale test: {:.1} s", t0.elapsed().as_secs_f64());
}

/// Dual-stack, internalTrafficPolicy Local beside an endpoint on another node, and hairpin
/// traffic (a pod reaching itself through its Service), in nftables and then iptables mode,
/// against the real control plane: the EndpointSlice controller writes one slice per family
/// and the other node's name into that endpoint, and real TCP and UDP over IPv4 and IPv6 go
/// where kube-proxy sends them.
#[test]
fn dual_stack_internal_local_and_hairpin_in_both_modes() {
    let test = "dual";
    let Some(setup) = Setup::start(test) else {
        return;
    };
    let Setup {
        kube,
        cluster,
        install,
        work,
        t0,
        ..
    } = &setup;
    let ns = "rc-dual";
    kube.node();
    kube.other_node("node-b", Ipv4Addr::new(10, 200, 0, 3));
    kube.namespace(ns);
    // `here` runs on this node, `there` on node-b (its namespace is on our rig all the same,
    // so a packet sent to it would be answered: only the rules keep it away).
    let here = ("here-0", Ipv4Addr::new(10, 244, 0, 20));
    let there = ("there-0", Ipv4Addr::new(10, 244, 0, 21));
    let since = now_rfc3339();
    for ((name, ip), node) in [(here, NODE_NAME), (there, "node-b")] {
        kube.pod_on(
            ns,
            name,
            "dual",
            node,
            &[IpAddr::V4(ip), IpAddr::V6(v6_of(ip))],
            &since,
        );
    }
    let ports = json!([
        {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
        {"name": "dns", "port": 53, "targetPort": "dns", "protocol": "UDP"}]);
    let dual = kube.apply(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "dual", "namespace": ns},
        "spec": {"selector": {"app": "dual"}, "ipFamilyPolicy": "RequireDualStack",
            "ipFamilies": ["IPv4", "IPv6"], "ports": ports}}));
    let local = kube.apply(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "local", "namespace": ns},
        "spec": {"selector": {"app": "dual"}, "internalTrafficPolicy": "Local", "ports": ports}}));
    let ips = |svc: &Value| -> Vec<IpAddr> {
        svc["spec"]["clusterIPs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|ip| ip.as_str().unwrap().parse().unwrap())
            .collect()
    };
    let (dual_ips, local_ip) = (ips(&dual), ips(&local)[0]);
    assert!(
        dual_ips.len() == 2 && dual_ips[0].is_ipv4() && dual_ips[1].is_ipv6(),
        "{dual_ips:?}"
    );
    // Both slices of `dual` and the one of `local`, both endpoints ready in each.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let slices = kube.list("EndpointSlice", Some(ns));
        let ready = |svc: &str, family: &str| {
            slices
                .iter()
                .filter(|s| {
                    s["metadata"]["labels"]["kubernetes.io/service-name"] == svc
                        && s["addressType"] == family
                })
                .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
                .filter(|e| e["conditions"]["ready"] == true)
                .count()
        };
        if ready("dual", "IPv4") == 2 && ready("dual", "IPv6") == 2 && ready("local", "IPv4") == 2 {
            let remote: Vec<&Value> = slices
                .iter()
                .flat_map(|s| s["endpoints"].as_array().unwrap().iter())
                .filter(|e| e["nodeName"] == "node-b")
                .collect();
            assert_eq!(
                remote.len(),
                3,
                "the controller names node-b in there-0's endpoints"
            );
            break;
        }
        assert!(Instant::now() < deadline, "slices not written: {slices:?}");
        std::thread::sleep(Duration::from_millis(100));
    }

    let chart_config = std::fs::read_to_string(&install.config).unwrap();
    assert!(chart_config.contains("mode: nftables"), "{chart_config}");
    for mode in ["nftables", "iptables"] {
        let config = work.path().join(format!("config-{mode}.yaml"));
        std::fs::write(
            &config,
            chart_config.replace("mode: nftables", &format!("mode: {mode}")),
        )
        .unwrap();
        let installed = Installed {
            kubeconfig: install.kubeconfig.clone(),
            config,
        };
        let node = Node::build_dual_stack(&[here, there]);
        let _relay = Relay::start(&node.node, cluster.port);
        let agent = Agent::start(
            &node.node,
            &installed,
            &installed.kubeconfig,
            work.path().join(format!("agent-{mode}.log")),
        );
        agent.wait_log("full sync", Duration::from_secs(30));
        let at = |ip: IpAddr, port: u16| SocketAddr::new(ip, port);
        let both = |v6: bool, port: u16| -> BTreeSet<SocketAddr> {
            [here.1, there.1]
                .iter()
                .map(|ip| {
                    let ip = if v6 {
                        IpAddr::V6(v6_of(*ip))
                    } else {
                        IpAddr::V4(*ip)
                    };
                    at(ip, port)
                })
                .collect()
        };
        // The first sync can come before the rules of both families are in: wait for the
        // IPv6 side to answer at all before counting.
        let client6 = IpAddr::V6(v6_of(CLIENT_IP));
        let deadline = Instant::now() + Duration::from_secs(15);
        while !matches!(
            net::probe_tcp(&node.client, client6, at(dual_ips[1], 80)),
            net::Outcome::Reply { .. }
        ) {
            assert!(
                Instant::now() < deadline,
                "{mode}: the IPv6 ClusterIP never answered\n{}",
                agent.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        for (what, src, dst, udp, want) in [
            (
                "IPv4 TCP",
                IpAddr::V4(CLIENT_IP),
                at(dual_ips[0], 80),
                false,
                both(false, HTTP_PORT),
            ),
            (
                "IPv6 TCP",
                client6,
                at(dual_ips[1], 80),
                false,
                both(true, HTTP_PORT),
            ),
            (
                "IPv4 UDP",
                IpAddr::V4(CLIENT_IP),
                at(dual_ips[0], 53),
                true,
                both(false, DNS_PORT),
            ),
            (
                "IPv6 UDP",
                client6,
                at(dual_ips[1], 53),
                true,
                both(true, DNS_PORT),
            ),
        ] {
            let seen = node.sample_from(src, dst, udp, 40);
            assert!(
                seen.failures.is_empty(),
                "{mode} dual-stack {what}: {seen:?}"
            );
            assert_eq!(seen.answered(), want, "{mode} dual-stack {what}: {seen:?}");
        }
        // internalTrafficPolicy Local: only this node's endpoint, never node-b's.
        let seen = node.sample(CLIENT_IP, at(local_ip, 80), false, 30);
        assert!(
            seen.failures.is_empty(),
            "{mode} internalTrafficPolicy Local: {seen:?}"
        );
        assert_eq!(
            seen.answered(),
            endpoints_at(&[here.1], HTTP_PORT),
            "{mode} internalTrafficPolicy Local: {seen:?}"
        );
        // Hairpin: here-0 through `local` reaches itself; the reply only finds its way back
        // because the connection is masqueraded (here-0 sees the node, not itself).
        let seen = node.sample(here.1, at(local_ip, 80), false, 10);
        assert!(seen.failures.is_empty(), "{mode} hairpin: {seen:?}");
        assert_eq!(
            seen.answered(),
            endpoints_at(&[here.1], HTTP_PORT),
            "{mode} hairpin: {seen:?}"
        );
        assert!(
            !seen.peers.contains(&IpAddr::V4(here.1)),
            "{mode} hairpin not masqueraded: {seen:?}"
        );
        let refused = agent.forbidden();
        assert!(
            refused.is_empty(),
            "{mode}: refused:\n{}",
            refused.join("\n")
        );
        println!("{mode}: dual-stack, internalTrafficPolicy Local and hairpin as kube-proxy");
    }
    println!("dual-stack test: {:.1} s", t0.elapsed().as_secs_f64());
}
