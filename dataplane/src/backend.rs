//! The backend interface every dataplane mode implements, and what a sync reports.

use crate::model::IpFamily;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// A backend's failure, as the agent and the commands need it: a stable reason for
/// metrics, the one IP family it concerns when known, whether the other family was
/// programmed all the same, and the backend's own error as its source. Each backend
/// converts its errors into this one (`From` impls beside them), so this contract names no
/// backend.
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct BackendError {
    reason: &'static str,
    family: Option<IpFamily>,
    other_family_programmed: bool,
    program_not_run: Option<String>,
    source: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl BackendError {
    /// A failure with a short, stable label for metrics (`rejected`, `spawn`, `read`, ...).
    pub fn new(
        reason: &'static str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> BackendError {
        BackendError {
            reason,
            family: None,
            other_family_programmed: false,
            program_not_run: None,
            source: Box::new(source),
        }
    }

    /// It concerns `family` alone.
    pub fn in_family(mut self, family: IpFamily) -> BackendError {
        self.family = Some(family);
        self
    }

    /// It concerns one family, and the other family's rules were programmed.
    pub fn other_family_programmed(mut self) -> BackendError {
        self.other_family_programmed = true;
        self
    }

    /// The program the backend runs could not be started (not installed, most often).
    pub fn program_not_run(mut self, program: &str) -> BackendError {
        self.program_not_run = Some(program.to_string());
        self
    }

    /// A short, stable label for metrics.
    pub fn reason(&self) -> &'static str {
        self.reason
    }

    /// The one IP family a failure is known to concern; `None` when it may concern both
    /// (kube-proxy counts failures per family, in its per-family proxiers).
    pub fn family(&self) -> Option<IpFamily> {
        self.family
    }

    /// Whether the other family's rules were programmed despite this failure, so that what
    /// follows a sync (health-check servers, conntrack cleanup) still applies to them.
    pub fn is_other_family_programmed(&self) -> bool {
        self.other_family_programmed
    }

    /// The program that could not be started, when that is the failure.
    pub fn program(&self) -> Option<&str> {
        self.program_not_run.as_deref()
    }
}

/// Counts of what a sync wrote to the kernel, for the one-line summary and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxStats {
    pub tables_deleted: usize,
    pub chains_written: usize,
    pub chains_deleted: usize,
    pub rules_written: usize,
    pub elements_added: usize,
    pub elements_deleted: usize,
}

impl TxStats {
    /// Kernel objects touched.
    pub fn operations(&self) -> usize {
        self.tables_deleted
            + self.chains_written
            + self.chains_deleted
            + self.rules_written
            + self.elements_added
            + self.elements_deleted
    }
}

/// Service ports with endpoints but none local, per policy (kube-proxy's `traffic_policy`
/// label).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoLocalEndpoints {
    pub internal: usize,
    pub external: usize,
}

impl NoLocalEndpoints {
    fn add(&mut self, o: NoLocalEndpoints) {
        self.internal += o.internal;
        self.external += o.external;
    }
}

/// [`NoLocalEndpoints`] per IP family: kube-proxy runs one proxier per family and labels
/// the counts with `ip_family`, so the report keeps them apart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NoLocalByFamily(BTreeMap<IpFamily, NoLocalEndpoints>);

impl NoLocalByFamily {
    pub fn add(&mut self, family: IpFamily, n: NoLocalEndpoints) {
        self.0.entry(family).or_default().add(n);
    }

    /// Takes back what [`NoLocalByFamily::add`] gave (saturating: never below zero).
    pub fn sub(&mut self, family: IpFamily, n: NoLocalEndpoints) {
        let e = self.0.entry(family).or_default();
        e.internal = e.internal.saturating_sub(n.internal);
        e.external = e.external.saturating_sub(n.external);
    }

    pub fn merge(&mut self, o: &NoLocalByFamily) {
        for (f, n) in &o.0 {
            self.add(*f, *n);
        }
    }

    /// The counts of one family (zero when it has none).
    pub fn of(&self, family: IpFamily) -> NoLocalEndpoints {
        self.0.get(&family).copied().unwrap_or_default()
    }

    /// Both families together.
    pub fn total(&self) -> NoLocalEndpoints {
        let mut t = NoLocalEndpoints::default();
        for n in self.0.values() {
            t.add(*n);
        }
        t
    }
}

/// What the layout had to leave out, for logs and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayoutReport {
    /// One line per skipped front end, naming the service that lost it.
    pub conflicts: Vec<String>,
    /// Service ports with endpoints but none usable under their Local policy.
    pub no_local_endpoints: NoLocalByFamily,
}

/// What one sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub full: bool,
    /// A full sync found the kernel no longer holding what the previous sync committed
    /// (someone deleted a table, chain or elements) and repaired it.
    pub drift: bool,
    pub stats: TxStats,
    pub duration: Duration,
    /// Front ends left out because another service holds them.
    pub conflicts: Vec<String>,
    pub no_local_endpoints: NoLocalByFamily,
    pub services: usize,
    pub endpoints: usize,
}

impl SyncReport {
    /// One human line: what changed and how long it took.
    pub fn summary(&self) -> String {
        let s = &self.stats;
        let what = if s.operations() == 0 {
            "no changes".to_string()
        } else {
            let mut parts = Vec::new();
            if s.tables_deleted > 0 {
                parts.push(format!("{} tables replaced", s.tables_deleted));
            }
            if s.chains_written > 0 {
                parts.push(format!(
                    "{} chains written ({} rules)",
                    s.chains_written, s.rules_written
                ));
            }
            if s.chains_deleted > 0 {
                parts.push(format!("{} chains deleted", s.chains_deleted));
            }
            parts.push(format!(
                "+{} -{} elements",
                s.elements_added, s.elements_deleted
            ));
            parts.join(", ")
        };
        format!(
            "{} sync: {} service ports, {} endpoints; {what}; {:.1} ms",
            if self.full { "full" } else { "partial" },
            self.services,
            self.endpoints,
            self.duration.as_secs_f64() * 1000.0
        )
    }
}

/// (namespace, name) of a Service.
pub type ServiceKey = (String, String);

/// How much of the kernel state a sync brings up to date.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// Re-read the kernel and repair whatever differs from the layout (someone's edits or
    /// deletions): nftables mode rewrites every chain, iptables mode every chain whose
    /// rules differ from what iptables-save shows. kube-proxy's "full sync".
    RepairAll,
    /// Lay out every service again, against what the last sync committed (the kernel is
    /// not read back).
    AllServices,
    /// Only these services changed since the last sync (their ports, their endpoints or
    /// both); everything else stays as the last sync left it. A backend may widen this.
    Services(&'a BTreeSet<ServiceKey>),
}

impl Scope<'_> {
    /// Whether this is a full sync in kube-proxy's sense (the kernel read back and repaired).
    pub fn is_full(&self) -> bool {
        matches!(self, Scope::RepairAll)
    }
}

/// The kernel as a mode read it back for a check, off the event loop; only the backend that
/// read it looks inside.
pub struct Readback(pub Box<dyn std::any::Any + Send>);

/// A read of the kernel to run on a blocking thread.
pub type ReadJob = Box<dyn FnOnce() -> Result<Readback, BackendError> + Send>;

/// How a check that goes on in steps on the event loop ([`Backend::check_step`]) stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckStep {
    /// More to look at: call again.
    More,
    /// Finished: what it found.
    Done(CheckResult),
}

/// What comparing a read-back with what was programmed found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckResult {
    /// One line per difference; empty when the kernel holds what was programmed.
    pub differences: Vec<String>,
    /// No commit (ours or anyone's) overlapped the read, so what it misses really is gone.
    pub consistent: bool,
    /// Our own commits meanwhile wrote what the check compares, so it vouches for nothing
    /// (and finds nothing): look again.
    pub overlapped: bool,
}

impl CheckResult {
    /// The first few differences on one line, for a log.
    pub fn summary(&self) -> String {
        const SHOWN: usize = 5;
        let d = &self.differences;
        let mut text = d.iter().take(SHOWN).cloned().collect::<Vec<_>>().join("; ");
        if d.len() > SHOWN {
            text.push_str(&format!("; and {} more", d.len() - SHOWN));
        }
        text
    }
}

/// Blocks until the kernel reports a change that may concern the mode's rules; called over
/// and over on a thread of its own.
pub type WaitForChange = Box<dyn FnMut() -> Result<(), BackendError> + Send>;

/// Subscribes to the kernel's change notifications (on the thread that will wait on them).
pub type Subscribe = Box<dyn FnOnce() -> Result<WaitForChange, BackendError> + Send>;

/// What a mode does between syncs to find that someone else changed its rules.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Upkeep {
    /// The periodic full sync may be replaced by [`Backend::kernel_unchanged`] or a
    /// read-back ([`Backend::begin_check`]), a full sync following only on differences.
    pub read_back: bool,
    /// A cheap probe ([`Backend::rules_flushed`]) runs between full syncs.
    pub canary: bool,
}

/// The failure counters of kube-proxy's a mode's failed syncs count in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureCounter {
    /// `kubeproxy_sync_proxy_rules_nftables_sync_failures_total`
    NftablesSync,
    /// `kubeproxy_sync_proxy_rules_iptables_restore_failures_total` (and the partial one)
    IptablesRestore,
}

/// Rules a mode owns in one table of one family (kube-proxy's iptables rule gauges).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleCount {
    pub family: IpFamily,
    pub table: &'static str,
    /// Held now, as the last syncs left them.
    pub total: usize,
    /// Written by the last sync.
    pub last_sync: usize,
}

/// A dataplane mode. Besides syncing and cleaning up, a mode says how it keeps watch on the
/// kernel between syncs; the defaults are "not at all".
pub trait Backend {
    /// Bring the kernel to `snapshot`, within `scope`.
    fn sync(
        &mut self,
        snapshot: &crate::model::Snapshot,
        scope: Scope<'_>,
    ) -> Result<SyncReport, BackendError>;
    /// Remove everything this backend installed; returns how many tables went away.
    fn cleanup(&mut self) -> Result<usize, BackendError>;

    /// How this mode keeps watch between syncs.
    fn upkeep(&self) -> Upkeep {
        Upkeep::default()
    }

    /// The kernel's change notifications, for a mode that has them: each one tells the
    /// agent to look ([`Backend::kernel_unchanged`], then a read-back).
    fn change_notifications(&self) -> Option<Subscribe> {
        None
    }

    /// Whether nobody but us changed the kernel since it last matched what was programmed
    /// (cheap); false when that cannot be told.
    fn kernel_unchanged(&mut self) -> bool {
        false
    }

    /// Start a read-back check: the read to run off the event loop, or `None` when there is
    /// nothing committed to check against.
    fn begin_check(&mut self) -> Option<ReadJob> {
        None
    }

    /// Hand over a read begun with [`Backend::begin_check`]: it is compared (and what it
    /// left out looked at) in [`Backend::check_step`]s. False when it can no longer be
    /// judged (a failed sync since, which forces a full sync anyway).
    fn finish_check(&mut self, _read: Readback) -> bool {
        false
    }

    /// Whether the check in hand, handed over by [`Backend::finish_check`], looks up only
    /// the elements others added or deleted (the change listener saw nothing else of
    /// theirs in our tables) rather than comparing a read.
    fn checking_by_lookup(&self) -> bool {
        false
    }

    /// A check's read failed: drop what was kept for it.
    fn abandon_check(&mut self) {}

    /// The next step of a check whose read was handed over, taking about `budget` on the
    /// event loop, between syncs; `None` when no check is in hand (a failed sync since
    /// ends it: the full sync that follows repairs anyway).
    fn check_step(&mut self, _budget: Duration) -> Option<Result<CheckStep, BackendError>> {
        None
    }

    /// The canary probe: true when our rules were flushed by someone else.
    fn rules_flushed(&mut self) -> Result<bool, BackendError> {
        Ok(false)
    }

    /// The kube-proxy failure counters this mode's failed syncs count in.
    fn failure_counter(&self) -> Option<FailureCounter> {
        None
    }

    /// Rules owned per family and table, for kube-proxy's rule gauges; empty when the mode
    /// has none to report.
    fn rule_counts(&self) -> Vec<RuleCount> {
        Vec::new()
    }
}
