//! The agent's decisions on fakes: what scope each sync gets, how suspected drift is
//! confirmed before a full sync, the backoff after failures and what still follows a sync
//! that failed in one family only. The namespace tests (tests/agent.rs) cover the same
//! paths against real kernels.

use super::*;
use crate::config::ProxyConfig;
use crate::manifests::Object;
use crate::snapshot::NodeAddressSource;
use dataplane::backend::{CheckResult, CheckStep, Upkeep};
use dataplane::conntrack::Flow;
use dataplane::model::{IpFamily, Snapshot};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::net::IpAddr;
use store::SourceEvent;

/// What the fake backend was asked and what it answers.
#[derive(Default)]
struct Script {
    /// One line per sync: "full", "all", the changed services or "nothing".
    scopes: Vec<String>,
    /// The next sync fails: in this family alone (with the other programmed), or wholly.
    fail_next: Option<Option<IpFamily>>,
    unchanged: bool,
    checks_begun: usize,
    check: Option<CheckResult>,
    /// What each step of a check's lookups answers, in turn.
    steps: std::collections::VecDeque<CheckStep>,
    steps_taken: usize,
}

struct FakeBackend(Arc<Mutex<Script>>);

#[derive(Debug, thiserror::Error)]
#[error("fake kernel refused")]
struct Refused;

impl Backend for FakeBackend {
    fn sync(&mut self, snapshot: &Snapshot, scope: Scope<'_>) -> Result<SyncReport, BackendError> {
        let mut s = self.0.lock().unwrap();
        s.scopes.push(match scope {
            Scope::RepairAll => "full".to_string(),
            Scope::AllServices => "all".to_string(),
            Scope::Services(set) if set.is_empty() => "nothing".to_string(),
            Scope::Services(set) => set
                .iter()
                .map(|(ns, name)| format!("{ns}/{name}"))
                .collect::<Vec<_>>()
                .join(","),
        });
        match s.fail_next.take() {
            Some(Some(family)) => Err(BackendError::new("rejected", Refused)
                .in_family(family)
                .other_family_programmed()),
            Some(None) => Err(BackendError::new("rejected", Refused)),
            None => Ok(SyncReport {
                full: scope.is_full(),
                services: snapshot.service_count(),
                endpoints: snapshot.endpoint_count(),
                ..SyncReport::default()
            }),
        }
    }

    fn cleanup(&mut self) -> Result<usize, BackendError> {
        Ok(0)
    }

    fn upkeep(&self) -> Upkeep {
        Upkeep {
            read_back: true,
            canary: false,
        }
    }

    fn kernel_unchanged(&mut self) -> bool {
        self.0.lock().unwrap().unchanged
    }

    fn begin_check(&mut self) -> Option<dataplane::backend::ReadJob> {
        self.0.lock().unwrap().checks_begun += 1;
        Some(Box::new(|| Ok(Readback(Box::new(())))))
    }

    fn finish_check(&mut self, _read: Readback) -> bool {
        let s = self.0.lock().unwrap();
        s.check.is_some() || !s.steps.is_empty()
    }

    /// The scripted steps, then the scripted result.
    fn check_step(&mut self, _budget: Duration) -> Option<Result<CheckStep, BackendError>> {
        let mut s = self.0.lock().unwrap();
        let step = match s.steps.pop_front() {
            Some(step) => step,
            None => CheckStep::Done(s.check.clone()?),
        };
        s.steps_taken += 1;
        Some(Ok(step))
    }
}

/// A conntrack table with no flows that counts how often the cleanup opened it.
struct NoFlows;

impl Conntrack for NoFlows {
    fn udp_flows(
        &mut self,
        _family: IpFamily,
        _keep: &dyn Fn(&Flow) -> bool,
    ) -> Result<Vec<Flow>, NetlinkError> {
        Ok(Vec::new())
    }

    fn delete(&mut self, _flow: &Flow) -> Result<(), NetlinkError> {
        Ok(())
    }
}

struct OneAddress;

impl NodeAddressSource for OneAddress {
    fn addresses(&self) -> Vec<IpAddr> {
        vec!["10.0.0.1".parse().unwrap()]
    }
}

struct Rig {
    agent: Agent,
    script: Arc<Mutex<Script>>,
    cleanups: Arc<Mutex<usize>>,
    checked_rx: mpsc::Receiver<KernelRead>,
}

/// An agent on the fake backend: a second between syncs at least, a full sync every hour.
fn rig() -> Rig {
    let script = Arc::new(Mutex::new(Script::default()));
    let cleanups = Arc::new(Mutex::new(0));
    let (checked_tx, checked_rx) = mpsc::channel(1);
    let health = Arc::new(Mutex::new(Health::new(Duration::from_secs(7200))));
    let opened = cleanups.clone();
    let agent = Agent {
        store: Store::new(
            ProxyConfig::default(),
            "node-a".into(),
            Box::new(OneAddress),
        ),
        backend: Box::new(FakeBackend(script.clone())),
        next_canary: None,
        canary_interval: CANARY_INTERVAL,
        schedule: Schedule::new(Duration::from_secs(1), Duration::from_secs(3600)),
        metrics: Metrics::new(&[IpFamily::V4]).unwrap(),
        service_health: service_health::Servers::new(
            health.clone(),
            http::Limits {
                timeouts: http::Timeouts::default(),
                pool: http::limit::Pool::new("test", 16),
            },
        ),
        health,
        unsynced: Changes::default(),
        checked_tx,
        checking: false,
        stepping: None,
        seen_while_checking: false,
        suspect: BTreeSet::new(),
        overlapped_once: false,
        udp_frontends: UdpFrontends::default(),
        conntrack_failed: false,
        conntrack: Box::new(move || {
            *opened.lock().unwrap() += 1;
            Ok(Box::new(NoFlows))
        }),
        // Never the real leftovers' cleanup from a unit test.
        leftovers: None,
    };
    Rig {
        agent,
        script,
        cleanups,
        checked_rx,
    }
}

fn service(name: &str, ip: &str, protocol: &str) -> Arrival {
    let s: Service = serde_saphyr::from_str(&format!(
        "metadata: {{name: {name}, namespace: ns}}\n\
         spec: {{clusterIP: {ip}, ports: [{{port: 53, protocol: {protocol}}}]}}"
    ))
    .unwrap();
    Arrival::now(SourceEvent::Apply(Object::Service(Box::new(s))))
}

fn slice(service: &str, ips: &[&str], protocol: &str) -> Arrival {
    let eps: Vec<String> = ips
        .iter()
        .map(|ip| format!("{{addresses: [{ip}], conditions: {{ready: true}}}}"))
        .collect();
    let s: EndpointSlice = serde_saphyr::from_str(&format!(
        "metadata: {{name: {service}-1, namespace: ns, labels: {{'kubernetes.io/service-name': {service}}}}}\n\
         addressType: IPv4\nports: [{{port: 5353, protocol: {protocol}}}]\nendpoints: [{}]",
        eps.join(", ")
    ))
    .unwrap();
    Arrival::now(SourceEvent::Apply(Object::EndpointSlice(Box::new(s))))
}

impl Rig {
    fn scopes(&self) -> Vec<String> {
        self.script.lock().unwrap().scopes.clone()
    }

    fn cleanups(&self) -> usize {
        *self.cleanups.lock().unwrap()
    }

    /// The background read the agent started, as its event loop would hand it back.
    async fn deliver_read(&mut self) {
        let read = tokio::time::timeout(Duration::from_secs(5), self.checked_rx.recv())
            .await
            .expect("a check was started")
            .expect("the channel is open");
        self.agent.checked(read);
    }

    /// The read, and the check's steps to its end.
    async fn deliver_check(&mut self) {
        self.deliver_read().await;
        for _ in 0..100 {
            if self.agent.stepping.is_none() {
                return;
            }
            self.agent.check_step();
        }
        panic!("the check never ended");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_sync_is_full_and_later_ones_take_only_the_changed_services() {
    let mut r = rig();
    r.agent.record(service("dns", "10.96.0.10", "UDP"));
    r.agent.record(slice("dns", &["10.1.0.2"], "UDP"));
    r.agent.sync();
    r.agent.record(service("web", "10.96.0.20", "TCP"));
    r.agent.sync();
    r.agent
        .record(slice("dns", &["10.1.0.2", "10.1.0.3"], "UDP"));
    r.agent.sync();
    assert_eq!(r.scopes(), ["full", "ns/web", "ns/dns"]);
    assert_eq!(r.agent.schedule.failures(), 0);
    // The UDP conntrack cleanup follows the syncs that changed UDP front ends: the first
    // (full) and the new dns endpoint, not the TCP service.
    assert_eq!(r.cleanups(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_backs_off_doubling_and_the_retry_is_full() {
    let mut r = rig();
    r.agent.record(service("web", "10.96.0.20", "TCP"));
    r.agent.sync();
    r.script.lock().unwrap().fail_next = Some(None);
    r.agent.record(slice("web", &["10.1.0.2"], "TCP"));
    let before = Instant::now();
    r.agent.sync();
    assert_eq!(r.agent.schedule.failures(), 1);
    let first = r.agent.schedule.due(true).unwrap() - before;
    r.script.lock().unwrap().fail_next = Some(None);
    let before = Instant::now();
    r.agent.sync();
    assert_eq!(r.agent.schedule.failures(), 2);
    let second = r.agent.schedule.due(true).unwrap() - before;
    assert!(
        first >= Duration::from_secs(1) && second >= first * 2 - Duration::from_millis(50),
        "backoff {first:?} then {second:?}"
    );
    r.agent.sync();
    assert_eq!(r.scopes(), ["full", "ns/web", "full", "full"]);
    assert_eq!(r.agent.schedule.failures(), 0);
    // Nothing follows a sync that failed wholly: one cleanup, after the first sync.
    assert_eq!(r.cleanups(), 1 + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_in_one_family_still_cleans_up_after_the_other() {
    let mut r = rig();
    r.agent.record(service("dns", "10.96.0.10", "UDP"));
    r.agent.sync();
    assert_eq!(r.cleanups(), 1);
    r.script.lock().unwrap().fail_next = Some(Some(IpFamily::V6));
    r.agent.record(slice("dns", &["10.1.0.2"], "UDP"));
    r.agent.sync();
    assert_eq!(r.agent.schedule.failures(), 1);
    assert_eq!(
        r.cleanups(),
        2,
        "the IPv4 side was programmed: its cleanup runs"
    );
    r.script.lock().unwrap().fail_next = Some(None);
    r.agent.record(slice("dns", &["10.1.0.3"], "UDP"));
    r.agent.sync();
    assert_eq!(
        r.cleanups(),
        2,
        "a whole failure programs nothing to clean up after"
    );
    let text = r.agent.metrics.render();
    assert!(
        text.contains("switchyard_sync_failures_total{reason=\"rejected\"} 2"),
        "{text}"
    );
}

/// Make the next sync the periodic full one.
fn periodic_due(agent: &mut Agent) {
    agent
        .schedule
        .periodic_deferred(Instant::now() - Duration::from_secs(7200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_periodic_full_sync_gives_way_to_a_check_when_nobody_else_committed() {
    let mut r = rig();
    r.agent.record(service("web", "10.96.0.20", "TCP"));
    r.agent.sync();
    r.script.lock().unwrap().unchanged = true;
    periodic_due(&mut r.agent);
    r.agent.sync();
    // No full sync: only what changed (nothing) is synced.
    assert_eq!(r.scopes(), ["full", "nothing"]);
    assert_eq!(r.script.lock().unwrap().checks_begun, 0);
    assert!(r
        .agent
        .metrics
        .render()
        .contains("switchyard_kernel_checks_total{method=\"generation\"} 1"));
    // Someone else committed: the kernel is read back beside the syncs instead.
    r.script.lock().unwrap().unchanged = false;
    periodic_due(&mut r.agent);
    r.agent.sync();
    assert_eq!(r.scopes(), ["full", "nothing", "nothing"]);
    assert_eq!(r.script.lock().unwrap().checks_begun, 1);
    assert!(r.agent.checking);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_goes_on_in_steps_while_syncs_go_on() {
    let mut r = rig();
    r.agent.record(service("web", "10.96.0.20", "TCP"));
    r.agent.sync();
    let found = |lines: &[&str]| CheckResult {
        differences: lines.iter().map(|s| s.to_string()).collect(),
        consistent: true,
        ..CheckResult::default()
    };
    let begin = |r: &mut Rig, steps: Vec<CheckStep>| {
        let mut s = r.script.lock().unwrap();
        s.check = None;
        s.steps = steps.into();
        s.steps_taken = 0;
    };

    // Two steps (comparing, looking up), with a sync between them.
    begin(&mut r, vec![CheckStep::More, CheckStep::Done(found(&[]))]);
    r.agent.start_check(Instant::now());
    r.deliver_read().await;
    assert!(r.agent.stepping.is_some() && r.agent.checking);
    r.agent.check_step();
    r.agent.record(service("api", "10.96.0.21", "TCP"));
    r.agent.sync();
    // Another check neither starts nor replaces the periodic sync meanwhile.
    periodic_due(&mut r.agent);
    r.agent.sync();
    r.agent.commit_seen();
    assert_eq!(r.script.lock().unwrap().checks_begun, 1);
    r.agent.check_step();
    assert!(r.agent.stepping.is_none());
    assert_eq!(r.script.lock().unwrap().steps_taken, 2);
    assert_eq!(r.scopes(), ["full", "ns/api", "nothing"]);
    assert!(!r.agent.schedule.full_required());
    let text = r.agent.metrics.render();
    assert!(
        text.contains("switchyard_kernel_check_duration_seconds_count 1"),
        "one check, timed once it ended: {text}"
    );
    // The commit seen meanwhile may have changed a part already compared: a new check.
    assert_eq!(r.script.lock().unwrap().checks_begun, 2);
    assert!(r.agent.checking);
    r.deliver_read().await;
    assert!(
        !r.agent.checking,
        "nothing scripted for it: it ends at once"
    );

    // A step finds an element changed: a full sync repairs.
    begin(&mut r, vec![CheckStep::Done(found(&["element e changed"]))]);
    r.agent.start_check(Instant::now());
    r.deliver_check().await;
    assert!(!r.agent.checking);
    assert!(r.agent.schedule.full_required());
    r.agent.sync();
    assert_eq!(r.scopes().last().unwrap(), "full");

    // A read the backend can no longer judge (a failed sync since) ends the check at once.
    begin(&mut r, vec![]);
    r.agent.start_check(Instant::now());
    r.deliver_read().await;
    assert!(r.agent.stepping.is_none() && !r.agent.checking);
}

/// Someone else's commit starts a check whose read waits for their commit to settle
/// (`kernel_checks::SETTLE`); a periodic check reads at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_someone_elses_commit_starts_reads_once_that_commit_has_settled() {
    let mut r = rig();
    r.agent.record(service("web", "10.96.0.20", "TCP"));
    r.agent.sync();
    let seen = Instant::now();
    r.agent.commit_seen();
    assert_eq!(r.script.lock().unwrap().checks_begun, 1);
    assert!(r.agent.checking);
    let (_, started) = tokio::time::timeout(Duration::from_secs(5), r.checked_rx.recv())
        .await
        .expect("the read comes")
        .expect("the channel is open");
    assert!(
        seen.elapsed() >= super::kernel_checks::SETTLE,
        "read {:?} after the commit was seen",
        seen.elapsed()
    );
    assert!(started >= seen + super::kernel_checks::SETTLE);
    // A periodic check: no wait, and timed from when it was asked for.
    r.agent.checking = false;
    let asked = Instant::now();
    r.agent.start_check(asked);
    let (_, started) = tokio::time::timeout(Duration::from_secs(5), r.checked_rx.recv())
        .await
        .expect("the read comes")
        .expect("the channel is open");
    assert_eq!(started, asked);
}

/// A check our own commits overlapped vouches for nothing and finds nothing: the agent looks
/// again once, and twice overlapped it waits for the next check. Never a repair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_our_commits_overlapped_is_looked_at_again_once_and_repairs_nothing() {
    let mut r = rig();
    r.agent.record(service("web", "10.96.0.20", "TCP"));
    r.agent.sync();
    let overlapped = CheckResult {
        overlapped: true,
        ..CheckResult::default()
    };
    r.script.lock().unwrap().check = Some(overlapped.clone());
    r.agent.start_check(Instant::now());
    r.deliver_check().await;
    assert_eq!(r.script.lock().unwrap().checks_begun, 2, "looked at again");
    r.deliver_check().await;
    assert_eq!(r.script.lock().unwrap().checks_begun, 2, "not a third time");
    assert!(!r.agent.checking);
    assert!(!r.agent.schedule.full_required());
    assert!(r.agent.suspect.is_empty());
    // A check that ends otherwise starts the count again.
    r.script.lock().unwrap().check = Some(CheckResult::default());
    r.agent.start_check(Instant::now());
    r.deliver_check().await;
    r.script.lock().unwrap().check = Some(overlapped);
    r.agent.start_check(Instant::now());
    r.deliver_check().await;
    assert_eq!(r.script.lock().unwrap().checks_begun, 5);
    r.agent.sync();
    assert_eq!(r.scopes(), ["full", "nothing"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_seen_by_an_overlapping_read_is_confirmed_by_a_second_one() {
    let mut r = rig();
    r.agent.record(service("web", "10.96.0.20", "TCP"));
    r.agent.sync();
    let found = |lines: &[&str], consistent| CheckResult {
        differences: lines.iter().map(|s| s.to_string()).collect(),
        consistent,
        ..CheckResult::default()
    };

    // A read that overlapped commits finds an element missing: read again, no repair yet.
    r.script.lock().unwrap().check = Some(found(&["element a"], false));
    r.agent.start_check(Instant::now());
    r.deliver_check().await;
    assert!(!r.agent.schedule.full_required());
    assert_eq!(r.script.lock().unwrap().checks_begun, 2, "a second read");
    // The second read finds it missing too: repair in full.
    r.deliver_check().await;
    assert!(r.agent.schedule.full_required());
    r.agent.sync();
    assert_eq!(r.scopes(), ["full", "full"]);

    // Differences the second read does not repeat were the overlap's: no repair.
    r.script.lock().unwrap().check = Some(found(&["element b"], false));
    r.agent.start_check(Instant::now());
    r.deliver_check().await;
    r.script.lock().unwrap().check = Some(found(&["element c"], false));
    r.deliver_check().await;
    assert!(!r.agent.schedule.full_required());
    assert!(r.agent.suspect.is_empty());

    // A read no commit overlapped is believed at once.
    r.script.lock().unwrap().check = Some(found(&["element d"], true));
    r.agent.start_check(Instant::now());
    r.deliver_check().await;
    assert!(r.agent.schedule.full_required());
}
