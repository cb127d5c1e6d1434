//! `switchyard run`: the continuous agent. Wires a source (the API server or manifest files)
//! into the object store, runs syncs when the schedule says so, and serves metrics and
//! health.

pub mod api_client;
pub mod fds;
pub mod file_source;
pub mod health;
pub mod http;
mod kernel_checks;
pub mod kube_source;
pub mod metrics;
pub mod schedule;
pub mod servers;
pub mod service_health;
mod start_event;
pub mod store;

use crate::config::{ProxyConfig, ProxyMode};
use crate::manifests::ManifestError;
use crate::nodeaddr::Interfaces;
use dataplane::backend::{Backend, BackendError, FailureCounter, Readback, Scope, SyncReport};
use dataplane::conntrack::{self, Conntrack, Ctnetlink, UdpFrontends};
use dataplane::model::IpFamily;
use dataplane::netlink::NetlinkError;
use health::Health;
use kernel_checks::watch_changes;
use metrics::{family_label, Metrics};
use schedule::Schedule;
use servers::{health_router, metrics_router, serve};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use store::{Arrival, Changes, Store};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

/// Where objects come from.
#[derive(Debug, Clone)]
pub enum Source {
    Kube(kube_source::Connection),
    Files(PathBuf),
}

/// Errors that stop the agent from starting or running.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error("{field} {addr:?}: {message}")]
    Bind {
        field: &'static str,
        addr: String,
        message: String,
    },
    #[error(transparent)]
    Metrics(#[from] metrics::MetricsError),
    #[error(transparent)]
    Connect(#[from] kube_source::ConnectError),
    #[error(transparent)]
    Manifests(#[from] ManifestError),
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error("the {0} source stopped")]
    SourceEnded(&'static str),
    #[error("cannot start the dataplane: {0}")]
    Backend(BackendError),
}

/// Run the agent until SIGTERM or SIGINT. The rules stay in the kernel when it stops.
pub fn run(cfg: ProxyConfig, node_name: String, source: Source) -> Result<(), AgentError> {
    // Before any thread or socket exists, so that everything after sees the raised limit.
    let soft = open_files_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(AgentError::Runtime)?;
    rt.block_on(run_async(cfg, node_name, source, soft))
}

/// Raises the soft open-files limit to the hard one and logs it; the soft limit in effect.
fn open_files_limit() -> u64 {
    match fds::raise() {
        Ok(n) if n.soft != n.was => {
            tracing::info!(
                "open files limit {} (raised from {}; hard limit {})",
                n.soft,
                n.was,
                n.hard
            );
            n.soft
        }
        Ok(n) => {
            tracing::info!("open files limit {} (the hard limit)", n.soft);
            n.soft
        }
        Err(e @ fds::FdError::Raise { from, .. }) => {
            tracing::warn!("{e}; open files limit {from}");
            from
        }
        Err(e) => {
            // Budget as for the common default rather than not at all.
            tracing::warn!("{e}; assuming 1024");
            1024
        }
    }
}

async fn run_async(
    cfg: ProxyConfig,
    node_name: String,
    source: Source,
    open_files: u64,
) -> Result<(), AgentError> {
    let metrics = Metrics::new(&crate::node_setup::kernel_families())?;
    // Each server's connections count against a pool sized from the open-files limit, so
    // that a flood of connections never takes the descriptors a sync needs.
    let per_pool = fds::per_pool(open_files);
    let timeouts = http::Timeouts::from_env();
    let limits = |name| http::Limits {
        timeouts,
        pool: http::limit::Pool::new(name, per_pool),
    };
    tracing::info!(
        "HTTP servers: at most {per_pool} connections for metrics, as many for healthz, and as many for all health-check node ports together; request heads within {:?}, silence within a request at most {:?}",
        timeouts.header_read,
        timeouts.idle
    );
    let health = Arc::new(Mutex::new(Health::new(cfg.sync_period * 2)));
    let mut sigterm = signal(SignalKind::terminate()).map_err(AgentError::Signals)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(AgentError::Signals)?;

    // An empty address turns a server off, as in kube-proxy.
    let configz = crate::config::v1alpha1::configz(&cfg);
    serve(
        "metricsBindAddress",
        &cfg.metrics_bind_address,
        cfg.bind_address_hard_fail,
        metrics_router(metrics.clone(), health.clone(), cfg.mode, configz),
        limits("metrics"),
    )
    .await?;
    serve(
        "healthzBindAddress",
        &cfg.healthz_bind_address,
        cfg.bind_address_hard_fail,
        health_router(health.clone(), metrics.clone()),
        limits("healthz"),
    )
    .await?;

    let (checked_tx, mut checked_rx) = mpsc::channel::<KernelRead>(1);
    tracing::info!("{} mode", cfg.mode.as_str());
    let backend = crate::backends::for_mode(&cfg).map_err(AgentError::Backend)?;
    // The change notifications are listened to only from the first successful sync on:
    // while anyone listens, the kernel builds one notification per element a batch adds,
    // and a cold 10k x 10 load then spent 5 of its 6 seconds in the kernel doing that
    // (perf: allocate_slab and __nlmsg_put). Until the first sync there is nothing of ours
    // to watch over, and what came before it is seen by its own read of the kernel (and
    // anything between its commit and the subscription by the generation check). Later
    // large commits take the listener out of the group while they run (`NftKernel`); this
    // keeps the first one from racing the listener's start.
    let mut subscribe = backend.change_notifications();
    let mut commits_rx = watch_changes(None);
    let mut agent = Agent {
        store: Store::new(cfg.clone(), node_name.clone(), Box::new(Interfaces)),
        backend,
        canary_interval: cfg.sync_period.min(CANARY_INTERVAL),
        next_canary: None,
        schedule: Schedule::new(cfg.min_sync_period, cfg.sync_period),
        metrics,
        service_health: service_health::Servers::new(
            health.clone(),
            limits("health-check node ports"),
        ),
        udp_frontends: UdpFrontends::default(),
        conntrack_failed: false,
        conntrack: Box::new(ctnetlink),
        health,
        unsynced: Changes::default(),
        checked_tx,
        checking: false,
        stepping: None,
        seen_while_checking: false,
        suspect: BTreeSet::new(),
        overlapped_once: false,
        leftovers: Some(cfg.mode),
    };
    let (tx, mut rx) = mpsc::channel::<Arrival>(4096);
    let source_name = match source {
        Source::Kube(conn) => {
            if cfg.client.content_type.contains("protobuf") {
                tracing::info!(
                    "clientConnection.contentType {:?}: Switchyard's API client speaks JSON; using JSON",
                    cfg.client.content_type
                );
            }
            let client =
                kube_source::client_with(&conn, Some(agent.metrics.client.clone())).await?;
            start_event::record(client.clone(), &node_name);
            kube_source::spawn(
                client,
                &node_name,
                conn.streaming_lists,
                tx,
                agent.metrics.clone(),
            );
            "API server"
        }
        Source::Files(path) => {
            // Each object is converted as it is decoded, before the loop runs.
            let watcher = file_source::initial(&path, &mut |ev| agent.record(Arrival::now(ev)))?;
            file_source::spawn(watcher, tx).map_err(AgentError::Runtime)?;
            "manifest"
        }
    };

    tracing::info!(
        "switchyard agent started: minSyncPeriod {:?}, syncPeriod {:?}; waiting for the initial lists",
        cfg.min_sync_period,
        cfg.sync_period
    );
    loop {
        let due = agent.schedule.due(agent.store.initial_lists_done());
        let sleep = sleep_until(due);
        let canary = sleep_until(agent.next_canary);
        tokio::select! {
            _ = sigterm.recv() => {
                tracing::info!("SIGTERM: stopping; the programmed rules stay in place");
                return Ok(());
            }
            _ = sigint.recv() => {
                tracing::info!("SIGINT: stopping; the programmed rules stay in place");
                return Ok(());
            }
            ev = rx.recv() => {
                let Some(ev) = ev else {
                    return Err(AgentError::SourceEnded(source_name));
                };
                agent.record(ev);
                // Take what else is already waiting, so a burst costs one pass.
                while let Ok(ev) = rx.try_recv() {
                    agent.record(ev);
                }
            }
            Some(read) = checked_rx.recv() => agent.checked(read),
            // Between all else: after a yield to the runtime's other tasks. tokio picks
            // among ready branches at random, so a sync that came due may wait for one
            // step ([`kernel_checks::CHECK_STEP`]).
            _ = tokio::task::yield_now(), if agent.stepping.is_some() => agent.check_step(),
            Some(()) = commits_rx.recv() => agent.commit_seen(),
            _ = sleep => {
                agent.sync();
                if subscribe.is_some() && !agent.schedule.full_required() {
                    commits_rx = watch_changes(subscribe.take());
                }
            }
            _ = canary => agent.probe_canary(),
        }
    }
}

/// Sleeps until `at`; forever when there is no `at`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// How often, at most, iptables mode looks for its canary chains between full syncs
/// (kube-proxy looks every syncPeriod).
const CANARY_INTERVAL: Duration = Duration::from_secs(5);

/// The agent's state between events.
struct Agent {
    store: Store,
    backend: Box<dyn Backend>,
    /// iptables mode: when to look for the canary chains next (after the first sync).
    next_canary: Option<Instant>,
    canary_interval: Duration,
    schedule: Schedule,
    metrics: Metrics,
    health: Arc<Mutex<Health>>,
    /// Changes taken by syncs that failed; their latencies count when a sync succeeds.
    unsynced: Changes,
    /// Where the background read of the periodic kernel check reports.
    checked_tx: mpsc::Sender<KernelRead>,
    /// A check is in hand: its read runs, or its lookups go on.
    checking: bool,
    /// A check's comparison and lookups go on between syncs ([`Self::check_step`]); it
    /// began at this instant.
    stepping: Option<kernel_checks::Stepping>,
    /// Someone else's commit named our table while a check went on: look again after it.
    seen_while_checking: bool,
    /// Differences the last check found in a read that overlapped commits, to confirm.
    suspect: BTreeSet<String>,
    /// The last check of what others changed vouched for nothing: our own commits overlapped
    /// it (`dataplane::backend::CheckResult::overlapped`); it was looked at again once.
    overlapped_once: bool,
    service_health: service_health::Servers,
    /// The UDP front ends as of the last conntrack cleanup.
    udp_frontends: UdpFrontends,
    /// The last conntrack cleanup failed: the next sync, whatever it changes, tries again.
    conntrack_failed: bool,
    /// Opens the conntrack table the cleanup deletes stale UDP flows from.
    conntrack: OpenConntrack,
    /// Until the first successful sync: the mode whose rules other modes' leftovers give
    /// way to.
    leftovers: Option<ProxyMode>,
}

/// Opens the node's conntrack table (ctnetlink); a fake in the agent's unit tests.
type OpenConntrack = Box<dyn Fn() -> Result<Box<dyn Conntrack>, NetlinkError> + Send>;

/// The real conntrack table, over ctnetlink in the agent's network namespace.
fn ctnetlink() -> Result<Box<dyn Conntrack>, NetlinkError> {
    Ok(Box::new(Ctnetlink::open()?))
}

/// The kernel as the backend's background read found it (opaque to the agent), and when
/// the read began.
type KernelRead = (Result<Readback, BackendError>, Instant);

impl Agent {
    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&mut self, arrival: Arrival) {
        let rec = self.store.apply(arrival.event, arrival.at);
        self.metrics
            .service_changes_total
            .inc_by(rec.service_events as u64);
        self.metrics
            .endpoint_changes_total
            .inc_by(rec.endpoint_events as u64);
        self.update_pending_gauges();
        self.health().set_node(self.store.node());
        if self.store.has_pending() {
            self.schedule.request();
            let now = SystemTime::now();
            self.health().queued(now);
            for f in self.metrics.families(None) {
                self.metrics
                    .last_queued_timestamp
                    .with_label_values(&[f])
                    .set(unix_seconds(now));
            }
        }
    }

    fn update_pending_gauges(&self) {
        self.metrics
            .service_changes_pending
            .set(self.store.pending_services() as i64);
        self.metrics
            .endpoint_changes_pending
            .set(self.store.pending_endpoints() as i64);
        self.metrics.objects_invalid.reset();
        for (reason, n) in self.store.invalid_by_reason() {
            self.metrics
                .objects_invalid
                .with_label_values(&[reason])
                .set(n as i64);
        }
        self.metrics
            .frontend_conflicts
            .set(self.store.frontend_conflicts() as i64);
    }

    fn sync(&mut self) {
        let started = Instant::now();
        let required = self.schedule.full_required();
        let mut full = self.schedule.start(started);
        // In iptables mode the periodic sync is a full one, as kube-proxy's: iptables-save
        // shows what is gone and the restore puts everything back.
        if full && !required && self.backend.upkeep().read_back {
            // The periodic full sync. If nobody else changed our tables since the kernel
            // last matched (commits to other tables, seen by the change listener, do not
            // count), it still does, and one generation request says so. Otherwise
            // the kernel is read back; 100k elements take it most of a second, so the read
            // runs beside the syncs, and a full sync follows only if the kernel turns out
            // changed. A check still in flight covers this period.
            if !self.checking && tokio::task::block_in_place(|| self.backend.kernel_unchanged()) {
                self.metrics
                    .kernel_checks_by
                    .with_label_values(&["generation"])
                    .inc();
                tracing::debug!(
                    "periodic check: nobody else changed our tables since the kernel last matched"
                );
                self.schedule.periodic_deferred(started);
                full = false;
            } else {
                if !self.checking {
                    self.start_check(started);
                }
                if self.checking {
                    self.schedule.periodic_deferred(started);
                    full = false;
                }
            }
        }
        let changes = self.store.take_changes();
        merge_changes(&mut self.unsynced, changes);
        let changed = self.unsynced.services_touched();
        let scope = if full {
            Scope::RepairAll
        } else if self.unsynced.node {
            Scope::AllServices
        } else {
            Scope::Services(&changed)
        };
        let snapshot = self.store.snapshot();
        // The health-check ports and UDP conntrack look at every service: only after syncs
        // that can change them (a deleted service might have been one of theirs).
        let follow_ups = full
            || self.conntrack_failed
            || self.unsynced.node
            || changed.iter().any(|(ns, name)| {
                let mut ports = snapshot.ports_of_service(ns, name).peekable();
                ports.peek().is_none()
                    || ports.any(|p| {
                        p.health_check_node_port != 0
                            || p.name.protocol == dataplane::model::Protocol::Udp
                    })
            });
        // A sync can take seconds (a cold 10k load, an iptables restore); keep the
        // runtime's other tasks (HTTP, watches) going.
        let backend = &mut self.backend;
        let result = tokio::task::block_in_place(|| backend.sync(snapshot, scope));
        let done = Instant::now();
        self.update_pending_gauges();
        match result {
            Ok(report) => {
                let full = report.full;
                self.succeeded(report, done);
                // As kube-proxy: the health-check ports and UDP conntrack follow each
                // successful sync.
                if follow_ups {
                    self.service_health.reconcile(self.store.snapshot());
                    self.clean_udp_conntrack(full);
                }
            }
            Err(e) => {
                self.failed(&e, done, full);
                // One family failed, the other was programmed: what follows a sync still
                // applies to it.
                if follow_ups && e.is_other_family_programmed() {
                    self.service_health.reconcile(self.store.snapshot());
                    self.clean_udp_conntrack(full);
                }
            }
        }
    }

    fn succeeded(&mut self, report: SyncReport, done: Instant) {
        let now = SystemTime::now();
        if let Some(mode) = self.leftovers.take() {
            // Once this mode serves, what other modes (kube-proxy's or ours) left goes, in
            // the background: on a node taken over from kube-proxy it can be 10k chains.
            tokio::task::spawn_blocking(move || {
                let r = crate::leftovers::other_modes(mode);
                for line in &r.done {
                    tracing::info!("after the first sync: {line}");
                }
                for f in &r.failed {
                    tracing::warn!("removing other proxies' rules: {f}");
                }
            });
        }
        for c in self.backend.rule_counts() {
            let labels = [c.table, family_label(c.family)];
            self.metrics
                .iptables_rules
                .with_label_values(&labels)
                .set(c.total as i64);
            self.metrics
                .iptables_rules_last
                .with_label_values(&labels)
                .set(c.last_sync as i64);
        }
        if self.backend.upkeep().canary && self.next_canary.is_none() {
            self.next_canary = Some(done + self.canary_interval);
        }
        self.schedule.succeeded(done, report.full);
        let secs = report.duration.as_secs_f64();
        // One sync programs every family; each family's series records it, as each of
        // kube-proxy's per-family proxiers records its own.
        let kind = if report.full {
            &self.metrics.sync_full_duration
        } else {
            &self.metrics.sync_partial_duration
        };
        for f in self.metrics.families(None) {
            self.metrics
                .sync_duration
                .with_label_values(&[f])
                .observe(secs);
            kind.with_label_values(&[f]).observe(secs);
            self.metrics
                .last_sync_timestamp
                .with_label_values(&[f])
                .set(unix_seconds(now));
        }
        self.metrics
            .kernel_operations
            .observe(report.stats.operations() as f64);
        for family in IpFamily::ALL {
            let f = family_label(family);
            if !self.metrics.families(None).contains(&f) {
                continue;
            }
            let n = report.no_local_endpoints.of(family);
            for (policy, n) in [("internal", n.internal), ("external", n.external)] {
                self.metrics
                    .no_local_endpoints
                    .with_label_values(&[policy, f])
                    .set(n as i64);
            }
        }
        self.metrics
            .programmed
            .with_label_values(&["service_ports"])
            .set(report.services as f64);
        self.metrics
            .programmed
            .with_label_values(&["endpoints"])
            .set(report.endpoints as f64);
        if report.drift {
            self.metrics.drift_repairs.inc();
            tracing::warn!(
                "the kernel no longer held what the last sync programmed; repaired: {}",
                report.summary()
            );
        }
        for c in &report.conflicts {
            tracing::warn!("{c}");
        }
        let changes = std::mem::take(&mut self.unsynced);
        for (_, c) in &changes.endpoints {
            for (family, t) in &c.trigger_times {
                if let Ok(d) = now.duration_since(*t) {
                    self.metrics
                        .network_programming
                        .with_label_values(&[family_label(*family)])
                        .observe(d.as_secs_f64());
                }
            }
        }
        let arrivals = changes
            .services
            .iter()
            .map(|(_, c)| c.first_event)
            .chain(changes.endpoints.iter().map(|(_, c)| c.first_event));
        for first in arrivals {
            self.metrics
                .event_to_kernel
                .observe(done.duration_since(first).as_secs_f64());
        }
        // Changes that arrived while the sync ran are still queued.
        let still = self.store.oldest_pending().map(|i| {
            now.checked_sub(Instant::now().duration_since(i))
                .unwrap_or(now)
        });
        self.health().updated(now, still);
        if report.stats.operations() > 0 || report.full {
            tracing::info!("{}", report.summary());
        } else {
            tracing::debug!("{}", report.summary());
        }
    }

    /// Delete UDP conntrack entries that no longer match their service's endpoints, when the
    /// UDP front ends changed (or at a full sync). On failure the old front ends stay, so
    /// the next sync tries again.
    fn clean_udp_conntrack(&mut self, full: bool) {
        let now = UdpFrontends::of(self.store.snapshot());
        if !full && now == self.udp_frontends {
            return;
        }
        let previous = &self.udp_frontends;
        let metrics = &self.metrics;
        let open = &self.conntrack;
        let result = tokio::task::block_in_place(|| {
            let mut ct = open()?;
            IpFamily::ALL.into_iter().try_fold(0, |total, family| {
                let started = Instant::now();
                let n = conntrack::clean_family(ct.as_mut(), family, &now, previous)?;
                let label = family_label(family);
                metrics
                    .conntrack_reconcile
                    .with_label_values(&[label])
                    .observe(started.elapsed().as_secs_f64());
                metrics
                    .conntrack_deleted
                    .with_label_values(&[label])
                    .inc_by(n as u64);
                Ok::<_, NetlinkError>(total + n)
            })
        });
        match result {
            Ok(0) => {}
            Ok(n) => tracing::info!("deleted {n} stale UDP conntrack entries"),
            Err(e) => {
                self.metrics.conntrack_failures.inc();
                // One retry soon; past that, each later sync tries again.
                if !self.conntrack_failed {
                    self.schedule.request();
                }
                self.conntrack_failed = true;
                tracing::warn!("UDP conntrack cleanup failed: {e}; retrying at the next sync");
                return;
            }
        }
        self.conntrack_failed = false;
        self.udp_frontends = now;
    }

    fn failed(&mut self, e: &BackendError, done: Instant, full: bool) {
        for f in self.metrics.families(e.family()) {
            match self.backend.failure_counter() {
                Some(FailureCounter::NftablesSync) => self
                    .metrics
                    .nftables_sync_failures
                    .with_label_values(&[f])
                    .inc(),
                Some(FailureCounter::IptablesRestore) => {
                    self.metrics
                        .iptables_restore_failures
                        .with_label_values(&[f])
                        .inc();
                    if !full {
                        self.metrics
                            .iptables_partial_restore_failures
                            .with_label_values(&[f])
                            .inc();
                    }
                }
                None => {}
            }
        }
        self.metrics
            .sync_failures
            .with_label_values(&[e.reason()])
            .inc();
        let backoff = self.schedule.failed(done);
        tracing::error!(
            "sync failed ({} in a row), retrying in full in {:?}: {e}",
            self.schedule.failures(),
            backoff
        );
        // The failed sync's changes are still waiting.
        self.health().queued(SystemTime::now());
    }
}

fn merge_changes(into: &mut Changes, more: Changes) {
    into.services.extend(more.services);
    into.endpoints.extend(more.endpoints);
    into.node |= more.node;
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
}

#[cfg(test)]
mod tests;
