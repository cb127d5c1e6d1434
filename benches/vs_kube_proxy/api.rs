//! Where the proxies read the cluster from: the fixture API server (started inside each
//! proxy's namespace and filled alike), or one real control plane (tests/cluster/up.sh),
//! filled once through kube-apiserver and relayed into each proxy's namespace, so every
//! proxy watches the same kube-apiserver.

use super::{apiserver, control_plane, netns, NODE};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::{json, Value};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The field manager of everything the bench writes.
const MANAGER: &str = "switchyard-bench";

/// The real control plane with the bench's cluster in it. Fields drop in order: the client,
/// then the control plane, then its scratch folder.
pub struct Real {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
    /// Writes in flight (churn is sent at its rate, not at the server's pace).
    pending: Mutex<Vec<tokio::task::JoinHandle<Result<(), String>>>>,
    cluster: control_plane::Cluster,
    _work: tempfile::TempDir,
}

fn resource(obj: &Value) -> (ApiResource, Option<String>) {
    let ar = match obj["kind"].as_str().unwrap_or("") {
        "Namespace" => ApiResource::erase::<Namespace>(&()),
        "Node" => ApiResource::erase::<Node>(&()),
        "Service" => ApiResource::erase::<Service>(&()),
        "EndpointSlice" => ApiResource::erase::<EndpointSlice>(&()),
        other => panic!("the bench writes no {other}"),
    };
    let ns = obj["metadata"]["namespace"].as_str().map(str::to_string);
    (ar, ns)
}

/// Server-side apply of one object, as the bench's field manager.
async fn apply(client: kube::Client, obj: Value) -> Result<(), String> {
    let (ar, ns) = resource(&obj);
    let api: kube::Api<DynamicObject> = match &ns {
        Some(ns) => kube::Api::namespaced_with(client, ns, &ar),
        None => kube::Api::all_with(client, &ar),
    };
    let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&obj),
    )
    .await
    .map(|_| ())
    .map_err(|e| format!("{} {name}: {e}", obj["kind"]))
}

impl Real {
    /// Starts the control plane and writes `objects` through it, 64 requests at a time.
    pub fn start(objects: Vec<Value>) -> Real {
        let work = tempfile::Builder::new()
            .prefix("switchyard-vs-kube-proxy-")
            .tempdir()
            .unwrap();
        let cluster = control_plane::Cluster::start(work.path());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let kubeconfig = cluster.admin_kubeconfig();
        let client = rt.block_on(async {
            let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .unwrap();
            kube::Client::try_from(cfg).unwrap()
        });
        let real = Real {
            rt,
            client,
            pending: Mutex::default(),
            cluster,
            _work: work,
        };
        let t0 = Instant::now();
        let n = objects.len();
        let client = real.client.clone();
        // The namespace and the node first, one by one; then the rest, many at a time.
        let (first, rest): (Vec<Value>, Vec<Value>) = objects
            .into_iter()
            .partition(|o| o["kind"] == "Namespace" || o["kind"] == "Node");
        for o in first {
            real.rt.block_on(apply(client.clone(), o)).unwrap();
        }
        let failed: Vec<String> = real.rt.block_on(
            futures_util::stream::iter(rest)
                .map(|o| apply(client.clone(), o))
                .buffered(64)
                .filter_map(|r| async move { r.err() })
                .collect(),
        );
        assert!(failed.is_empty(), "writing the cluster: {failed:?}");
        // The Node's address is status: a merge patch of the subresource.
        let nodes: kube::Api<Node> = kube::Api::all(real.client.clone());
        real.rt
            .block_on(nodes.patch_status(
                NODE,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"addresses": [
                    {"type": "InternalIP", "address": "10.200.0.1"}]}})),
            ))
            .unwrap();
        println!(
            "vs_kube_proxy: {n} objects written through kube-apiserver in {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        real
    }

    /// The admin's kubeconfig (its server is 127.0.0.1:PORT, which [`Real::relay`] carries
    /// into a namespace).
    pub fn kubeconfig(&self) -> String {
        std::fs::read_to_string(self.cluster.admin_kubeconfig()).unwrap()
    }

    pub fn relay(&self, ns: &str) -> control_plane::Relay {
        control_plane::Relay::start(ns, self.cluster.port)
    }

    /// Sends `obj` now and does not wait for the answer.
    pub fn apply(&self, obj: Value) {
        let h = self.rt.spawn(apply(self.client.clone(), obj));
        self.pending.lock().unwrap().push(h);
    }

    /// Waits (bounded) for the writes in flight; the ones that failed.
    pub fn settle(&self) -> Vec<String> {
        let pending: Vec<_> = self.pending.lock().unwrap().drain(..).collect();
        self.rt.block_on(async {
            let mut failed = Vec::new();
            for h in pending {
                match tokio::time::timeout(Duration::from_secs(30), h).await {
                    Ok(Ok(Ok(()))) => {}
                    Ok(Ok(Err(e))) => failed.push(e),
                    Ok(Err(e)) => failed.push(e.to_string()),
                    Err(_) => failed.push("no answer in 30 s".into()),
                }
            }
            failed
        })
    }
}

/// Where one proxy's cluster comes from while it runs.
pub enum Attached<'a> {
    Fixture(apiserver::ApiServer),
    Real(&'a Real, control_plane::Relay),
}

impl<'a> Attached<'a> {
    /// The fixture API server in `ns`, holding `objects`; or the real one relayed there.
    pub fn to(ns: &str, real: Option<&'a Real>, objects: impl FnOnce() -> Vec<Value>) -> Self {
        match real {
            Some(r) => Attached::Real(r, r.relay(ns)),
            None => {
                let inside = ns.to_string();
                let api = apiserver::ApiServer::start(move || {
                    netns::in_netns(&inside, || std::net::TcpListener::bind("127.0.0.1:6443"))
                        .unwrap()
                });
                for o in objects() {
                    api.apply(o);
                }
                Attached::Fixture(api)
            }
        }
    }

    pub fn kubeconfig(&self) -> String {
        match self {
            Attached::Fixture(api) => api.kubeconfig(),
            Attached::Real(r, _) => r.kubeconfig(),
        }
    }

    pub fn apply(&self, obj: Value) {
        match self {
            Attached::Fixture(api) => api.apply(obj),
            Attached::Real(r, _) => r.apply(obj),
        }
    }

    /// Writes that failed (none can with the fixture).
    pub fn settle(&self) -> Vec<String> {
        match self {
            Attached::Fixture(_) => Vec::new(),
            Attached::Real(r, _) => r.settle(),
        }
    }
}

/// A writer another thread may use while the churn goes on.
pub enum Writer<'a> {
    Fixture(&'a apiserver::ApiServer),
    Real(kube::Client, tokio::runtime::Handle),
}

impl Writer<'_> {
    /// Writes `obj` and waits for the answer.
    pub fn apply_now(&self, obj: Value) -> Result<(), String> {
        match self {
            Writer::Fixture(api) => {
                api.apply(obj);
                Ok(())
            }
            Writer::Real(client, rt) => rt.block_on(apply(client.clone(), obj)),
        }
    }
}

impl Attached<'_> {
    pub fn writer(&self) -> Writer<'_> {
        match self {
            Attached::Fixture(api) => Writer::Fixture(api),
            Attached::Real(r, _) => Writer::Real(r.client.clone(), r.rt.handle().clone()),
        }
    }
}
