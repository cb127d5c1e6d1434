//! The agent's Prometheus metrics: kube-proxy's names, labels and buckets, so existing
//! dashboards and alerts keep working, plus `switchyard_` metrics for what kube-proxy lacks.

use dataplane::model::IpFamily;
use prometheus::{
    exponential_buckets, linear_buckets, Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec,
    IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Every metric the agent exports, registered in one registry.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// The `ip_family` label values of the families this node serves (kube-proxy runs a
    /// proxier per family and labels most of its metrics so).
    families: Vec<&'static str>,
    pub sync_duration: HistogramVec,
    pub sync_full_duration: HistogramVec,
    pub sync_partial_duration: HistogramVec,
    pub network_programming: HistogramVec,
    pub last_sync_timestamp: GaugeVec,
    pub last_queued_timestamp: GaugeVec,
    pub service_changes_pending: IntGauge,
    pub service_changes_total: IntCounter,
    pub endpoint_changes_pending: IntGauge,
    pub endpoint_changes_total: IntCounter,
    pub nftables_sync_failures: IntCounterVec,
    pub iptables_restore_failures: IntCounterVec,
    pub iptables_partial_restore_failures: IntCounterVec,
    pub iptables_rules: IntGaugeVec,
    pub iptables_rules_last: IntGaugeVec,
    pub no_local_endpoints: IntGaugeVec,
    pub conntrack_reconcile: HistogramVec,
    pub conntrack_deleted: IntCounterVec,
    pub conntrack_failures: IntCounter,
    pub drift_repairs: IntCounter,
    pub objects_invalid: IntGaugeVec,
    pub frontend_conflicts: IntGauge,
    pub kernel_operations: Histogram,
    pub event_to_kernel: Histogram,
    pub kernel_checks: Histogram,
    pub kernel_checks_by: IntCounterVec,
    pub watch_errors: IntCounterVec,
    pub sync_failures: IntCounterVec,
    pub programmed: GaugeVec,
    pub healthz: IntCounterVec,
    pub livez: IntCounterVec,
    /// client-go's API client metrics.
    pub client: super::api_client::ClientMetrics,
}

/// A metric could not be registered (a programming error: duplicate or malformed names).
#[derive(Debug, thiserror::Error)]
#[error("cannot register metrics: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: Vec<f64>,
) -> Result<Histogram, MetricsError> {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))?;
    registry.register(Box::new(h.clone()))?;
    Ok(h)
}

/// A histogram with kube-proxy's `ip_family` label.
fn family_histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: Vec<f64>,
) -> Result<HistogramVec, MetricsError> {
    register(
        registry,
        HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), &[FAMILY])?,
    )
}

fn register<T: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    c: T,
) -> Result<T, MetricsError> {
    registry.register(Box::new(c.clone()))?;
    Ok(c)
}

/// kube-proxy's sync latency buckets: 1 ms doubling, 15 buckets.
fn sync_buckets() -> Result<Vec<f64>, MetricsError> {
    Ok(exponential_buckets(0.001, 2.0, 15)?)
}

/// kube-proxy's network programming buckets: 0, then 0.25 s steps to 0.5 s, 1 s to 59 s,
/// 5 s to 115 s, 30 s to 5 min.
fn programming_buckets() -> Result<Vec<f64>, MetricsError> {
    let mut b = vec![0.0];
    b.extend(linear_buckets(0.25, 0.25, 2)?);
    b.extend(linear_buckets(1.0, 1.0, 59)?);
    b.extend(linear_buckets(60.0, 5.0, 12)?);
    b.extend(linear_buckets(120.0, 30.0, 7)?);
    Ok(b)
}

/// kube-proxy's label for the IP family of a per-family proxier.
const FAMILY: &str = "ip_family";

/// kube-proxy's values of `ip_family` (v1.IPFamily).
pub fn family_label(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    }
}

impl Metrics {
    /// Metrics for a node serving `families` (their `ip_family` series start at zero, so
    /// that rates and alerts have a series before the first event).
    pub fn new(families: &[IpFamily]) -> Result<Metrics, MetricsError> {
        let r = Registry::new();
        #[cfg(target_os = "linux")]
        r.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        let sync_help = |what: &str| format!("SyncProxyRules latency in seconds{what}");
        let client = super::api_client::ClientMetrics {
            requests: register(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "rest_client_requests_total",
                        "Number of HTTP requests, partitioned by status code, method, and host.",
                    ),
                    &["code", "host", "method"],
                )?,
            )?,
            duration: register(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "rest_client_request_duration_seconds",
                        "Request latency in seconds. Broken down by verb, and host.",
                    )
                    .buckets(super::api_client::DURATION_BUCKETS.to_vec()),
                    &["host", "verb"],
                )?,
            )?,
        };
        let m = Metrics {
            families: families.iter().map(|f| family_label(*f)).collect(),
            client,
            sync_duration: family_histogram(
                &r,
                "kubeproxy_sync_proxy_rules_duration_seconds",
                &sync_help(""),
                sync_buckets()?,
            )?,
            sync_full_duration: family_histogram(
                &r,
                "kubeproxy_sync_full_proxy_rules_duration_seconds",
                &sync_help(" for full resyncs"),
                sync_buckets()?,
            )?,
            sync_partial_duration: family_histogram(
                &r,
                "kubeproxy_sync_partial_proxy_rules_duration_seconds",
                &sync_help(" for partial resyncs"),
                sync_buckets()?,
            )?,
            network_programming: family_histogram(
                &r,
                "kubeproxy_network_programming_duration_seconds",
                "In Cluster Network Programming Latency in seconds",
                programming_buckets()?,
            )?,
            last_sync_timestamp: register(
                &r,
                GaugeVec::new(
                    Opts::new(
                        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                        "The last time proxy rules were successfully synced",
                    ),
                    &[FAMILY],
                )?,
            )?,
            last_queued_timestamp: register(
                &r,
                GaugeVec::new(
                    Opts::new(
                        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                        "The last time a sync of proxy rules was queued",
                    ),
                    &[FAMILY],
                )?,
            )?,
            service_changes_pending: register(
                &r,
                IntGauge::new(
                    "kubeproxy_sync_proxy_rules_service_changes_pending",
                    "Pending proxy rules Service changes",
                )?,
            )?,
            service_changes_total: register(
                &r,
                IntCounter::new(
                    "kubeproxy_sync_proxy_rules_service_changes_total",
                    "Cumulative proxy rules Service changes",
                )?,
            )?,
            endpoint_changes_pending: register(
                &r,
                IntGauge::new(
                    "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                    "Pending proxy rules Endpoint changes",
                )?,
            )?,
            endpoint_changes_total: register(
                &r,
                IntCounter::new(
                    "kubeproxy_sync_proxy_rules_endpoint_changes_total",
                    "Cumulative proxy rules Endpoint changes",
                )?,
            )?,
            nftables_sync_failures: register(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
                        "Cumulative proxy nftables sync failures",
                    ),
                    &[FAMILY],
                )?,
            )?,
            iptables_restore_failures: register(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
                        "Cumulative proxy iptables restore failures",
                    ),
                    &[FAMILY],
                )?,
            )?,
            iptables_partial_restore_failures: register(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
                        "Cumulative proxy iptables partial restore failures",
                    ),
                    &[FAMILY],
                )?,
            )?,
            iptables_rules: register(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "kubeproxy_sync_proxy_rules_iptables_total",
                        "Total number of iptables rules owned by kube-proxy",
                    ),
                    &["table", FAMILY],
                )?,
            )?,
            iptables_rules_last: register(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "kubeproxy_sync_proxy_rules_iptables_last",
                        "Number of iptables rules written by kube-proxy in last sync",
                    ),
                    &["table", FAMILY],
                )?,
            )?,
            no_local_endpoints: register(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                        "Number of services with a Local traffic policy and no endpoints",
                    ),
                    &["traffic_policy", FAMILY],
                )?,
            )?,
            // kube-proxy registers these in every Linux mode and observes them at each
            // conntrack reconciliation (pkg/proxy/conntrack/cleanup.go, CleanStaleEntries).
            conntrack_reconcile: register(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "kubeproxy_conntrack_reconciler_sync_duration_seconds",
                        "ReconcileConntrackFlowsLatency latency in seconds",
                    )
                    .buckets(sync_buckets()?),
                    &["ip_family"],
                )?,
            )?,
            conntrack_deleted: register(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "kubeproxy_conntrack_reconciler_deleted_entries_total",
                        "Cumulative conntrack flows deleted by conntrack reconciler",
                    ),
                    &["ip_family"],
                )?,
            )?,
            conntrack_failures: register(
                &r,
                IntCounter::new(
                    "switchyard_conntrack_cleanup_failures_total",
                    "UDP conntrack cleanups that failed (retried at the next sync; stale UDP flows may reach a gone endpoint until then)",
                )?,
            )?,
            drift_repairs: register(
                &r,
                IntCounter::new(
                    "switchyard_drift_repairs_total",
                    "Full syncs that found the kernel no longer holding what was programmed, and repaired it",
                )?,
            )?,
            objects_invalid: register(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "switchyard_objects_invalid",
                        "Objects whose current version is invalid and is not programmed, by reason",
                    ),
                    &["reason"],
                )?,
            )?,
            frontend_conflicts: register(
                &r,
                IntGauge::new(
                    "switchyard_frontend_conflicts",
                    "Front-end claims (ClusterIP, external or load-balancer IP with protocol and port) \
                     that lose to another Service's claim and are not programmed",
                )?,
            )?,
            kernel_operations: histogram(
                &r,
                "switchyard_sync_kernel_operations",
                "Kernel operations (rules, elements, chains, sets) per committed sync",
                exponential_buckets(1.0, 4.0, 12)?,
            )?,
            event_to_kernel: histogram(
                &r,
                "switchyard_event_to_kernel_seconds",
                "From the arrival of a watch event to the kernel commit that carries it; free of control-plane clock skew",
                vec![
                    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
                    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
                ],
            )?,
            kernel_checks: histogram(
                &r,
                "switchyard_kernel_check_duration_seconds",
                "Periodic checks that the kernel holds what was programmed: reading it back in the background and comparing",
                exponential_buckets(0.001, 2.0, 15)?,
            )?,
            kernel_checks_by: register(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "switchyard_kernel_checks_total",
                        "Kernel checks, by method: \"generation\" when nobody else had changed our tables since the kernel last matched, \"read\" when it was read back and compared (the sets too large to read back looked up element by element, between syncs), \"lookup\" when others had changed only elements, chains or rules of our table since it last matched and just those were looked at (elements by key; chains and rules read back without any set's elements), \"notification\" when someone else's commit named our table",
                    ),
                    &["method"],
                )?,
            )?,
            watch_errors: register(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "switchyard_watch_errors_total",
                        "Errors of the API watches (each is retried with backoff), by kind",
                    ),
                    &["kind"],
                )?,
            )?,
            sync_failures: register(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "switchyard_sync_failures_total",
                        "Failed syncs by reason",
                    ),
                    &["reason"],
                )?,
            )?,
            programmed: register(
                &r,
                GaugeVec::new(
                    Opts::new(
                        "switchyard_programmed",
                        "What the last committed sync programs: service ports and endpoints",
                    ),
                    &["what"],
                )?,
            )?,
            healthz: register(
                &r,
                IntCounterVec::new(
                    Opts::new("kubeproxy_proxy_healthz_total", "Cumulative proxy healthz HTTP status"),
                    &["code"],
                )?,
            )?,
            livez: register(
                &r,
                IntCounterVec::new(
                    Opts::new("kubeproxy_proxy_livez_total", "Cumulative proxy livez HTTP status"),
                    &["code"],
                )?,
            )?,
            registry: r,
        };
        for f in &m.families {
            for h in [
                &m.sync_duration,
                &m.sync_full_duration,
                &m.sync_partial_duration,
                &m.network_programming,
            ] {
                h.with_label_values(&[f]);
            }
            for c in [
                &m.nftables_sync_failures,
                &m.iptables_restore_failures,
                &m.iptables_partial_restore_failures,
            ] {
                c.with_label_values(&[f]);
            }
        }
        Ok(m)
    }

    /// The `ip_family` values a sync of these families reports under: the one family a
    /// change or failure is known to concern, or every family the node serves.
    pub fn families(&self, only: Option<IpFamily>) -> Vec<&'static str> {
        match only {
            Some(f) => vec![family_label(f)],
            None => self.families.clone(),
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::warn!("cannot encode metrics: {e}");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_kube_proxys() {
        let b = sync_buckets().unwrap();
        assert_eq!(b.len(), 15);
        assert_eq!(b[0], 0.001);
        assert_eq!(b[14], 16.384);
        let p = programming_buckets().unwrap();
        assert_eq!(p[..4], [0.0, 0.25, 0.5, 1.0]);
        assert_eq!(p.len(), 81);
        assert_eq!(p[p.len() - 1], 300.0);
    }

    #[test]
    fn renders_every_kube_proxy_name() {
        let m = Metrics::new(&[IpFamily::V4, IpFamily::V6]).unwrap();
        for f in m.families(None) {
            m.sync_duration.with_label_values(&[f]).observe(0.002);
            m.last_sync_timestamp.with_label_values(&[f]).set(1.0);
        }
        m.no_local_endpoints
            .with_label_values(&["external", "IPv4"])
            .set(0);
        let text = m.render();
        for name in [
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.002\"} 1",
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv6\",le=\"0.002\"} 1",
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"} 1",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total",
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"} 0",
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv6\"} 0",
            "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family=\"IPv4\"} 0",
            "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"} 0",
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"external\"}",
        ] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
        // A node without IPv6 has no IPv6 series, as kube-proxy's single-stack proxier.
        let v4 = Metrics::new(&[IpFamily::V4]).unwrap().render();
        assert!(!v4.contains("IPv6"), "{v4}");
        assert_eq!(
            Metrics::new(&[IpFamily::V4, IpFamily::V6])
                .unwrap()
                .families(Some(IpFamily::V6)),
            vec!["IPv6"]
        );
    }
}
