//! The API server as a source: kube-runtime watchers on Services and EndpointSlices (with
//! kube-proxy's label selector), this node's Node and the ServiceCIDRs. Each initial list
//! (and every relist after 410 Gone or a lost connection) is buffered and reported as one
//! complete set, so objects deleted during an outage disappear when the watch comes back.
//! Lists are streaming watches (`sendInitialEvents`), as client-go's are in kube-proxy v1.37,
//! unless the WatchListClient gate is off or the API server refuses them.

use super::metrics::Metrics;
use super::store::{object_key, Arrival, Kind, SourceEvent};
use crate::manifests::Object;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;

/// kube-proxy's selector: services another proxy handles and headless ones are not ours.
pub const SERVICE_SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// Where the API server is and how to reach it.
#[derive(Debug, Clone, Default)]
pub struct Connection {
    /// A kubeconfig file; without one, in-cluster configuration (or $KUBECONFIG).
    pub kubeconfig: Option<PathBuf>,
    /// Overrides the server address of the kubeconfig (kube-proxy's --master).
    pub master: Option<String>,
    /// clientConnection.qps and burst (client-go's token bucket); zero qps: no limit.
    pub qps: f32,
    pub burst: i32,
    /// The WatchListClient gate: initial lists and relists as streaming watches.
    pub streaming_lists: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("no API server configuration (not in a cluster and no --kubeconfig): {0}")]
    Infer(#[from] kube::config::InferConfigError),
    #[error("--master {url:?} is not a URL: {message}")]
    Master { url: String, message: String },
    #[error("cannot build the API client: {0}")]
    Client(#[from] kube::Error),
}

/// Build the client as kube-proxy would: kubeconfig if given, else in-cluster; rate-limited
/// and counted as client-go's is when `metrics` are given.
pub async fn client_with(
    conn: &Connection,
    metrics: Option<super::api_client::ClientMetrics>,
) -> Result<Client, ConnectError> {
    let config = config(conn).await?;
    let Some(metrics) = metrics else {
        return Ok(Client::try_from(config)?);
    };
    let host = match (config.cluster_url.host(), config.cluster_url.port_u16()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_string(),
        _ => String::new(),
    };
    let layer = super::api_client::ApiClientLayer {
        metrics,
        limiter: std::sync::Arc::new(super::api_client::TokenBucket::new(conn.qps, conn.burst)),
        host,
    };
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&layer)
        .build())
}

/// The client for one-off listings (`trace`): no limiter, no metrics.
pub async fn client(conn: &Connection) -> Result<Client, ConnectError> {
    client_with(conn, None).await
}

async fn config(conn: &Connection) -> Result<kube::Config, ConnectError> {
    let mut config = match &conn.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|source| {
                ConnectError::Kubeconfig {
                    path: path.clone(),
                    source,
                }
            })?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|source| ConnectError::Kubeconfig {
                    path: path.clone(),
                    source,
                })?
        }
        None => kube::Config::infer().await?,
    };
    if let Some(url) = &conn.master {
        config.cluster_url =
            url.parse()
                .map_err(|e: ::http::uri::InvalidUri| ConnectError::Master {
                    url: url.clone(),
                    message: e.to_string(),
                })?;
    }
    Ok(config)
}

/// Everything the agent would watch, listed once (for `switchyard trace` against a live
/// cluster): the same selectors, this node only.
pub async fn list_once(
    client: Client,
    node_name: &str,
) -> Result<crate::manifests::Manifests, kube::Error> {
    use kube::api::ListParams;
    let selected = ListParams::default().labels(SERVICE_SELECTOR);
    let this_node = ListParams::default().fields(&format!("metadata.name={node_name}"));
    Ok(crate::manifests::Manifests {
        services: Api::<Service>::all(client.clone())
            .list(&selected)
            .await?
            .items,
        slices: Api::<EndpointSlice>::all(client.clone())
            .list(&selected)
            .await?
            .items,
        nodes: Api::<Node>::all(client.clone())
            .list(&this_node)
            .await?
            .items,
        // Before Kubernetes 1.33 there are no ServiceCIDRs to list, as the watcher allows.
        service_cidrs: match Api::<ServiceCIDR>::all(client)
            .list(&ListParams::default())
            .await
        {
            Ok(list) => list.items,
            Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
            Err(e) => return Err(e),
        },
        duplicates: Vec::new(),
    })
}

/// Start one watcher per kind; they run until the receiver goes away.
pub fn spawn(
    client: Client,
    node_name: &str,
    streaming_lists: bool,
    tx: mpsc::Sender<Arrival>,
    metrics: Metrics,
) {
    let lists = if streaming_lists {
        Lists::Streaming
    } else {
        Lists::Paged
    };
    let services: Api<Service> = Api::all(client.clone());
    let slices: Api<EndpointSlice> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let cidrs: Api<ServiceCIDR> = Api::all(client);
    let svc_cfg = watcher::Config::default().labels(SERVICE_SELECTOR);
    // Slices of headless services and of other proxies' services carry the same labels.
    let slice_cfg = watcher::Config::default().labels(SERVICE_SELECTOR);
    let node_cfg = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
    tokio::spawn(run(
        Kind::Service,
        services,
        svc_cfg,
        lists,
        tx.clone(),
        metrics.clone(),
        |s| Object::Service(Box::new(s)),
    ));
    tokio::spawn(run(
        Kind::EndpointSlice,
        slices,
        slice_cfg,
        lists,
        tx.clone(),
        metrics.clone(),
        |s| Object::EndpointSlice(Box::new(s)),
    ));
    tokio::spawn(run(
        Kind::Node,
        nodes,
        node_cfg,
        lists,
        tx.clone(),
        metrics.clone(),
        |n| Object::Node(Box::new(n)),
    ));
    tokio::spawn(run(
        Kind::ServiceCidr,
        cidrs,
        watcher::Config::default(),
        lists,
        tx,
        metrics,
        |c| Object::ServiceCidr(Box::new(c)),
    ));
}

/// How a watcher takes its initial list and every relist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lists {
    /// One watch with `sendInitialEvents=true`: the current objects, then the bookmark that
    /// ends them, then the changes (client-go's WatchList).
    Streaming,
    /// LIST requests, page by page, then a watch from the list's resourceVersion.
    Paged,
}

fn watch_stream<K>(
    api: &Api<K>,
    cfg: &watcher::Config,
    lists: Lists,
) -> futures_util::stream::BoxStream<'static, watcher::Result<Event<K>>>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let cfg = match lists {
        Lists::Streaming => cfg.clone().streaming_lists(),
        Lists::Paged => cfg.clone(),
    };
    watcher::watcher(api.clone(), cfg)
        .backoff(WatchBackoff::default())
        .boxed()
}

/// The API server refused a streaming list as a request it does not serve (kube-apiserver
/// with the WatchList gate off answers 422 "sendInitialEvents is forbidden for watch unless
/// the WatchList feature gate is enabled"), not for a reason a LIST would share (403, 429,
/// 5xx, a lost connection).
fn streaming_refused(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code == 400 || s.code == 422,
        watcher::Error::WatchError(s) => s.code == 400 || s.code == 422,
        _ => false,
    }
}

async fn run<K>(
    kind: Kind,
    api: Api<K>,
    cfg: watcher::Config,
    mut lists: Lists,
    tx: mpsc::Sender<Arrival>,
    metrics: Metrics,
    wrap: fn(K) -> Object,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let mut stream = watch_stream(&api, &cfg, lists);
    // Objects a list in progress has named, for the log.
    let mut count = 0usize;
    let mut listed = false;
    while let Some(item) = stream.next().await {
        let event = match item {
            Ok(Event::Init) => {
                count = 0;
                SourceEvent::ListBegin(kind)
            }
            Ok(Event::InitApply(o)) => {
                count += 1;
                SourceEvent::Listed(wrap(o))
            }
            Ok(Event::InitDone) => {
                if listed {
                    tracing::info!("{}: relisted {count} objects", kind.as_str());
                } else {
                    tracing::info!("{}: listed {count} objects", kind.as_str());
                }
                listed = true;
                SourceEvent::ListEnd(kind)
            }
            Ok(Event::Apply(o)) => SourceEvent::Apply(wrap(o)),
            Ok(Event::Delete(o)) => SourceEvent::Delete(kind, object_key(&wrap(o))),
            Err(e) => {
                metrics
                    .watch_errors
                    .with_label_values(&[kind.as_str()])
                    .inc();
                if lists == Lists::Streaming && streaming_refused(&e) {
                    // client-go falls back to a LIST for that attempt; this server will not
                    // change its mind before it restarts, so the fallback stays.
                    tracing::warn!(
                        "{}: the API server refused a streaming list ({e}); listing page by page instead",
                        kind.as_str()
                    );
                    lists = Lists::Paged;
                    stream = watch_stream(&api, &cfg, lists);
                    continue;
                }
                if !listed && kind == Kind::ServiceCidr && is_not_found(&e) {
                    // An API server without ServiceCIDRs (before 1.33): none to read.
                    tracing::info!("ServiceCIDR: not served by this API server; none used");
                    listed = true;
                    if tx
                        .send(Arrival::now(SourceEvent::Replace(kind, Vec::new())))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    continue;
                }
                // Retried with backoff by the stream; the rules in the kernel keep serving.
                tracing::warn!("{} watch: {e}; retrying", kind.as_str());
                continue;
            }
        };
        if tx.send(Arrival::now(event)).await.is_err() {
            return;
        }
    }
}

/// Retry delays for a failed watch: 200 ms doubling to 1 s, with jitter, reset on success.
/// kube's default climbs to 30 s, which after an API server outage would leave the node
/// up to half a minute behind; converging within a second of the server's return needs the
/// short cap, and the jitter spreads a fleet's reconnects.
#[derive(Debug, Clone)]
struct WatchBackoff {
    next: Duration,
    seed: u64,
}

const BACKOFF_FIRST: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

impl Default for WatchBackoff {
    fn default() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as u64 ^ std::process::id() as u64)
            .unwrap_or(1);
        WatchBackoff {
            next: BACKOFF_FIRST,
            seed: seed | 1,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        // xorshift: cheap jitter in [75%, 100%] of the step.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let step = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        let jitter = 0.75 + (self.seed % 1000) as f64 / 4000.0;
        Some(step.mul_f64(jitter))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = BACKOFF_FIRST;
    }
}

fn is_not_found(e: &watcher::Error) -> bool {
    let inner = match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => e,
        _ => return false,
    };
    matches!(inner, kube::Error::Api(s) if s.code == 404)
}
