//! The nftables backend: `plan` (the desired tables, pure), `diff` (the transaction that
//! moves the kernel there, pure), `wire` (that transaction as one nf_tables netlink batch)
//! and `kernel` (the netlink reads and the commit).

pub mod affinity;
pub mod budget;
mod checking;
pub mod commits;
pub mod diff;
pub mod elements;
pub mod generations;
pub mod getelem;
pub mod kernel;
pub mod listing;
pub mod lookups;
pub mod netlink;
pub mod ownership;
pub mod pacing;
pub mod packed;
pub mod plan;
pub mod sizing;
pub mod skeleton;
pub mod slots;
pub mod tables;
pub mod verify;
pub mod wire;

use crate::backend::{
    Backend, BackendError, CheckStep, FailureCounter, ReadJob, Readback, Scope, ServiceKey,
    Subscribe, SyncReport, Upkeep,
};
use crate::model::{IpFamily, Snapshot};
use crate::tally::EndpointTally;
use kernel::{NftError, NftExecutor, Unread};
use ownership::Index;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use tables::Ruleset;

/// Sets with more elements than this are not read back: a check of the kernel looks their
/// elements up one by one instead ([`lookups`]). The kernel's dump of a set walks it from
/// the first element again for each reply of about 32 KB, so reading a set costs it time
/// quadratic in the set's size: a sync that read our 10k-service tables (120k elements)
/// took 0.4 s, one that read the 100k-service ones (1.2M, a 1M-element backends map) 32 s
/// (`rhashtable_walk_next` 91% of the reading thread's samples). Such a set is flushed and
/// filled again in the sync's one transaction.
pub const READ_LIMIT: usize = 100_000;

/// The sets of `committed` too large to read back. Interval sets are always read: their
/// elements are ranges, which lookups by key do not find.
fn too_large(committed: &Ruleset, limit: usize) -> Unread {
    committed
        .tables
        .iter()
        .flat_map(|(family, t)| {
            t.sets
                .iter()
                .filter(|(_, s)| s.elements.len() > limit && !s.interval())
                .map(move |(name, _)| (*family, name.clone()))
        })
        .collect()
}

/// Before any sync, the sets likely too large to read back: the backend maps, when the
/// snapshot has more endpoints than `limit`.
fn likely_too_large(snapshot: &Snapshot, limit: usize) -> Unread {
    if snapshot.endpoint_count() <= limit {
        return Unread::new();
    }
    IpFamily::ALL
        .into_iter()
        .flat_map(|f| skeleton::BACKEND_MAPS.map(|m| (f, m.to_string())))
        .collect()
}

/// What the last successful sync committed, and who contributed what to it.
#[derive(Debug)]
struct Applied {
    ruleset: Ruleset,
    index: Index,
    endpoints: EndpointTally,
}

/// Programs Switchyard's `ip`/`ip6 switchyard` tables through an [`NftExecutor`].
#[derive(Debug)]
pub struct NftBackend<E: NftExecutor> {
    exec: E,
    /// `None` forces a read of the kernel.
    applied: Option<Applied>,
    /// While a background read of the kernel runs: what our commits touched since it began.
    verifying: Option<verify::Recent>,
    /// A check whose read is back: being compared, then its left-out sets looked up.
    check: Option<checking::Check>,
    /// The lookups found differences in sets the repair does not read: it reports drift.
    drift_looked_up: bool,
    /// The kernel generation at which the kernel is known to hold `applied`: set by a read
    /// no commit overlapped, carried over our own commits while each moves it on by one.
    /// Anyone else's commit breaks the chain, and then only a read can tell.
    held_at: Option<u32>,
    /// Whether the kernel may hold remembered session-affinity clients to check.
    remembered: bool,
    /// A purge of stale remembered clients is owed (at start-up, after a failed one).
    purge_pending: bool,
    /// Sets larger than this are not read back ([`READ_LIMIT`]).
    read_limit: usize,
}

impl<E: NftExecutor> NftBackend<E> {
    pub fn new(exec: E) -> Self {
        NftBackend {
            exec,
            applied: None,
            verifying: None,
            check: None,
            drift_looked_up: false,
            held_at: None,
            // A restarted agent may find clients remembered by its predecessor.
            remembered: true,
            purge_pending: true,
            read_limit: READ_LIMIT,
        }
    }

    /// With another limit on the sets read back (the tests use small ones).
    pub fn with_read_limit(mut self, limit: usize) -> Self {
        self.read_limit = limit;
        self
    }

    pub fn executor(&self) -> &E {
        &self.exec
    }

    /// The transaction that would program `snapshot` into an empty kernel.
    pub fn render(snapshot: &Snapshot) -> diff::Transaction {
        let empty = Ruleset::default();
        let (desired, _) = plan::desired(snapshot, &empty);
        diff::diff(&empty, &desired, false)
    }

    /// A background read of the kernel (see [`kernel::read_kernel`]) starts now; true when
    /// there is a committed state to check it against.
    pub fn begin_verify(&mut self) -> bool {
        self.verifying = self.applied.as_ref().map(|_| verify::Recent::default());
        self.verifying.is_some()
    }

    /// Whether nobody but us has changed our tables since the kernel was last known to
    /// hold what we programmed, so that it still does: one generation request instead of
    /// reading 100k elements back. Commits by others to their own tables leave it so when
    /// the change listener saw them. False when that cannot be told.
    pub fn kernel_unchanged(&mut self) -> bool {
        let (Some(_), Some(held)) = (&self.applied, self.held_at) else {
            return false;
        };
        let Ok(Some(now)) = self.exec.generation() else {
            return false;
        };
        if now != held && !self.exec.unchanged_between(held, now) {
            return false;
        }
        self.held_at = Some(now);
        true
    }

    /// Read the kernel, without the elements of `unread`, and the generation it was read
    /// at if no commit overlapped.
    fn read(&mut self, unread: &Unread) -> Result<(Ruleset, Option<u32>), BackendError> {
        let before = self.exec.generation()?;
        let kernel = self
            .exec
            .read_without(&|f, name| unread.contains(&(f, name.to_string())))?;
        let after = self.exec.generation()?;
        Ok((kernel, after.filter(|_| before == after)))
    }

    fn commit(&mut self, tx: &diff::Transaction) -> Result<(), BackendError> {
        if tx.is_empty() {
            return Ok(());
        }
        if let Some(recent) = self.verifying.as_mut() {
            // Recorded before the commit: if it fails, the next sync is full anyway.
            recent.record(tx);
        }
        let held = self.held_at.take();
        if let Err(e) = self.exec.apply(tx) {
            // The kernel kept its previous state; the next sync must re-read it.
            self.applied = None;
            let families = tx.families();
            if families.len() < 2 {
                return Err(e.into());
            }
            // One family's problem (a kernel without IPv6 tables, an element only one
            // family rejects) must not hold back the other: each table on its own.
            let mut first = None;
            for family in families {
                if let Err(e) = self.exec.apply(&tx.only(family)) {
                    first.get_or_insert(NftError::Family {
                        family,
                        source: Box::new(e),
                    });
                }
            }
            drop(e);
            return match first {
                Some(err) => Err(err.into()),
                // Each family alone went in: the kernel holds the whole transaction.
                None => Ok(()),
            };
        }
        // Our commit moved the generation on by one; more means someone else's came
        // between (or after it), which the change listener may have seen leave our tables
        // alone, ours among them (then, or once it catches up: the held generation stays
        // for [`Self::kernel_unchanged`] to try again). A failure to ask only costs the
        // next periodic check a read.
        let now = self.exec.generation().ok().flatten();
        self.held_at = match (held, now) {
            (Some(h), Some(g))
                if g == generations::next_generation(h) || self.exec.unchanged_between(h, g) =>
            {
                Some(g)
            }
            (Some(h), Some(_)) => Some(h),
            _ => None,
        };
        Ok(())
    }

    /// After a commit that took backends or remembering front ends out (or while an
    /// earlier purge is owed): forget remembered affinity clients whose endpoint or front
    /// end is gone, or they would keep reaching it. Best effort: a failure is logged and
    /// retried at the next sync.
    fn forget_stale_clients(&mut self, desired: &Ruleset, tx: &diff::Transaction) {
        let remembering = desired.tables.values().any(|t| {
            t.sets
                .get(skeleton::MAP_AFFINITY_FRONTENDS)
                .is_some_and(|s| !s.elements.is_empty())
        });
        // Once a front end remembers, the packet path may fill the map at any time, so
        // whether there is anything to purge cannot wait for a commit that strands it: the
        // commit that takes the last remembering front end out must still purge (found by
        // Kubernetes' e2e spec "should be able to switch session affinity for service with
        // type clusterIP": clients stayed on one Pod after affinity went to None).
        self.remembered |= remembering;
        if !self.remembered || !(self.purge_pending || affinity::may_strand(tx)) {
            return;
        }
        self.remembered = remembering;
        self.purge_pending = false;
        for (family, table) in &desired.tables {
            let result = self.exec.remembered(*family).and_then(|r| {
                let stale = affinity::stale(table, &r);
                self.exec.forget(*family, &stale)
            });
            if let Err(e) = result {
                tracing::warn!("forgetting stale session-affinity clients ({family}): {e}; retrying at the next sync");
                self.remembered = true;
                self.purge_pending = true;
            }
        }
    }

    /// Only the changed services, in place, when the layout allows it.
    fn sync_services(
        &mut self,
        snapshot: &Snapshot,
        changed: &BTreeSet<ServiceKey>,
        mut applied: Applied,
    ) -> Result<Result<SyncReport, BackendError>, Applied> {
        let started = Instant::now();
        let Some(touched) =
            plan::update(snapshot, &mut applied.ruleset, &mut applied.index, changed)
        else {
            return Err(applied);
        };
        if sizing::outgrown(&applied.ruleset) {
            // The kernel would refuse the elements past a set's size: the full layout
            // declares it larger, replacing that table, from what the kernel holds (the
            // other family's table is updated, so it must not hold the changes already).
            for (family, t) in &touched {
                if let Some(table) = applied.ruleset.tables.get_mut(family) {
                    t.undo(table);
                }
            }
            return Err(applied);
        }
        let tx = diff::patch(&applied.ruleset, &touched);
        if let Err(e) = self.commit(&tx) {
            return Ok(Err(e));
        }
        self.forget_stale_clients(&applied.ruleset, &tx);
        let report = plan::report_of(&applied.index, Vec::new());
        applied.endpoints.update(snapshot, changed);
        let endpoints = applied.endpoints.total();
        self.applied = Some(applied);
        Ok(Ok(SyncReport {
            full: false,
            drift: false,
            stats: tx.stats(),
            duration: started.elapsed(),
            conflicts: report.conflicts,
            no_local_endpoints: report.no_local_endpoints,
            services: snapshot.service_count(),
            endpoints,
        }))
    }
}

impl<E: NftExecutor> Backend for NftBackend<E> {
    fn sync(&mut self, snapshot: &Snapshot, scope: Scope<'_>) -> Result<SyncReport, BackendError> {
        let started = Instant::now();
        let full = scope.is_full();
        let mut drift = false;
        let current = match (scope, self.applied.take()) {
            (Scope::Services(changed), Some(applied)) => {
                match self.sync_services(snapshot, changed, applied) {
                    Ok(result) => return result,
                    Err(applied) => applied.ruleset,
                }
            }
            (Scope::RepairAll, Some(mut applied)) => {
                let unread = too_large(&applied.ruleset, self.read_limit);
                let (mut kernel, at) = self.read(&unread)?;
                // Of what could be read: a set left unread is flushed and filled anyway.
                let found =
                    verify::differences(&kernel, &applied.ruleset, &verify::Recent::default());
                let looked_up = std::mem::take(&mut self.drift_looked_up);
                drift = !found.is_empty() || looked_up;
                self.held_at = at;
                // The layout keeps an endpoint's slot as the previous state had it: for a
                // set left unread, as we committed it (the set stays marked unread).
                for (family, name) in &unread {
                    let ours = applied
                        .ruleset
                        .tables
                        .get_mut(family)
                        .and_then(|t| t.sets.get_mut(name));
                    let theirs = kernel
                        .tables
                        .get_mut(family)
                        .and_then(|t| t.sets.get_mut(name));
                    if let (Some(o), Some(k)) = (ours, theirs) {
                        if k.unread {
                            k.elements = std::mem::take(&mut o.elements);
                        }
                    }
                }
                kernel
            }
            (_, Some(applied)) => applied.ruleset,
            (_, None) => {
                drift = std::mem::take(&mut self.drift_looked_up);
                let unread = likely_too_large(snapshot, self.read_limit);
                let (kernel, at) = self.read(&unread)?;
                self.held_at = at;
                kernel
            }
        };
        let (desired, index, layout) = plan::layout(snapshot, &current);
        let tx = diff::diff(&current, &desired, full);
        self.commit(&tx)?;
        self.forget_stale_clients(&desired, &tx);
        let endpoints = EndpointTally::of(snapshot);
        let endpoint_count = endpoints.total();
        self.applied = Some(Applied {
            ruleset: desired,
            index,
            endpoints,
        });
        Ok(SyncReport {
            full,
            drift,
            stats: tx.stats(),
            duration: started.elapsed(),
            conflicts: layout.conflicts,
            no_local_endpoints: layout.no_local_endpoints,
            services: snapshot.service_count(),
            endpoints: endpoint_count,
        })
    }

    fn cleanup(&mut self) -> Result<usize, BackendError> {
        // Only which tables there are matters: no set's elements are read.
        let current = self.exec.read_without(&|_, _| true)?;
        let tx = diff::diff(&current, &Ruleset::default(), false);
        let removed = current.tables.len();
        if !tx.is_empty() {
            self.exec.apply(&tx)?;
        }
        self.applied = None;
        self.held_at = None;
        Ok(removed)
    }

    fn upkeep(&self) -> Upkeep {
        Upkeep {
            read_back: true,
            canary: false,
        }
    }

    fn change_notifications(&self) -> Option<Subscribe> {
        self.exec.change_notifications()
    }

    fn kernel_unchanged(&mut self) -> bool {
        NftBackend::kernel_unchanged(self)
    }

    fn begin_check(&mut self) -> Option<ReadJob> {
        self.begin_check_read()
    }

    fn finish_check(&mut self, read: Readback) -> bool {
        self.finish_check_read(read)
    }

    fn checking_by_lookup(&self) -> bool {
        NftBackend::checking_by_lookup(self)
    }

    fn abandon_check(&mut self) {
        self.end_check();
    }

    fn check_step(&mut self, budget: Duration) -> Option<Result<CheckStep, BackendError>> {
        self.next_check_step(budget)
    }

    fn failure_counter(&self) -> Option<FailureCounter> {
        Some(FailureCounter::NftablesSync)
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod touched_tests;
#[cfg(test)]
mod update_tests;
