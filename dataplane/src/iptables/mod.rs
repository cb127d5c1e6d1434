//! The iptables backend: kube-proxy's chain layout (pure), restore inputs computed against
//! the kernel (full sync) or our last write (partial), and the iptables binaries.

pub mod exec;
pub mod names;
pub mod render;
pub mod restore;

use crate::backend::{Backend, BackendError, Scope, SyncReport};
use crate::model::{IpFamily, Snapshot};
use crate::nft::transaction::TxStats;
use exec::{IptablesError, IptablesExecutor};
use render::{Rendered, Tables};
use restore::{Base, RestoreStats};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

/// Programs kube-proxy-compatible iptables chains through an [`IptablesExecutor`].
#[derive(Debug)]
pub struct IptablesBackend<E: IptablesExecutor> {
    exec: E,
    /// What the last successful restore of each family left in our chains; a family
    /// missing here is synced in full, against what iptables-save shows.
    applied: BTreeMap<IpFamily, Tables>,
}

impl<E: IptablesExecutor> IptablesBackend<E> {
    pub fn new(exec: E) -> Self {
        IptablesBackend {
            exec,
            applied: BTreeMap::new(),
        }
    }

    pub fn executor(&self) -> &E {
        &self.exec
    }

    /// The restore input, per family, that would program `snapshot` into a kernel with
    /// none of our chains, as `switchyard render` prints it.
    pub fn render(snapshot: &Snapshot) -> String {
        let rendered = render::render(snapshot);
        let empty = restore::Saved::default();
        let mut out = String::new();
        for family in IpFamily::ALL {
            let (Some(tables), Some(jumps)) =
                (rendered.families.get(&family), rendered.jumps.get(&family))
            else {
                continue;
            };
            let (input, _) = restore::sync_input(tables, Base::Kernel(&empty), jumps);
            let cmd = match family {
                IpFamily::V4 => "iptables-restore",
                IpFamily::V6 => "ip6tables-restore",
            };
            let _ = writeln!(out, "# {family}: {cmd} --noflush");
            out.push_str(&input);
        }
        out
    }

    /// One family: restore against the kernel (full) or our last write (partial).
    fn sync_family(
        &mut self,
        rendered: &mut Rendered,
        family: IpFamily,
        full: bool,
    ) -> Result<(RestoreStats, bool), IptablesError> {
        let desired = rendered.families.remove(&family).unwrap_or_default();
        let jumps = rendered.jumps.remove(&family).unwrap_or_default();
        let last = self.applied.remove(&family);
        let (previous, partial_base) = if full { (last, None) } else { (None, last) };
        let (input, stats, drift) = match &partial_base {
            Some(prev) => {
                let (input, stats) = restore::sync_input(&desired, Base::Previous(prev), &jumps);
                (input, stats, false)
            }
            None => {
                let saved = self.exec.save(family)?;
                // Drift: a chain or a jump we wrote is gone (someone flushed us).
                let drift = previous.as_ref().is_some_and(|prev| {
                    prev.tables.iter().any(|(t, chains)| {
                        let held = saved.table(*t);
                        chains
                            .keys()
                            .any(|c| !held.is_some_and(|h| h.chains.contains(c)))
                    }) || jumps.iter().any(|j| {
                        !saved
                            .table(j.table)
                            .is_some_and(|h| h.jumps_to(j.builtin, j.target))
                    })
                });
                let (input, stats) = restore::sync_input(&desired, Base::Kernel(&saved), &jumps);
                (input, stats, drift)
            }
        };
        if !input.is_empty() {
            // On failure the family stays out of `applied`: the next sync is full.
            self.exec.restore(family, &input)?;
        }
        self.applied.insert(family, desired);
        Ok((stats, drift))
    }
}

impl<E: IptablesExecutor> Backend for IptablesBackend<E> {
    fn sync(&mut self, snapshot: &Snapshot, scope: Scope<'_>) -> Result<SyncReport, BackendError> {
        let started = Instant::now();
        let mut rendered = render::render(snapshot);
        let report = std::mem::take(&mut rendered.report);
        let first = self.applied.is_empty();
        if (scope.is_full() || first) && render::localhost_node_ports(&snapshot.node) {
            self.exec.enable_route_localnet()?;
        }
        let mut stats = RestoreStats::default();
        let mut drift = false;
        let mut full = scope.is_full();
        let mut failure = None;
        // A family that fails does not stop the other.
        for family in IpFamily::ALL {
            let family_full = scope.is_full() || !self.applied.contains_key(&family);
            full |= family_full;
            match self.sync_family(&mut rendered, family, family_full) {
                Ok((s, d)) => {
                    stats.add(s);
                    drift |= d;
                }
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        if let Some(e) = failure {
            return Err(e.into());
        }
        Ok(SyncReport {
            full,
            drift,
            stats: TxStats {
                chains_written: stats.chains_written,
                rules_written: stats.rules_written + stats.jumps_inserted,
                chains_deleted: stats.chains_deleted,
                ..TxStats::default()
            },
            duration: started.elapsed(),
            conflicts: report.conflicts,
            no_local_endpoints: report.no_local_endpoints,
            services: snapshot.service_count(),
            endpoints: snapshot.endpoint_count(),
        })
    }

    /// Removes our chains and the jumps to them from both families; returns how many
    /// chains went away.
    fn cleanup(&mut self) -> Result<usize, BackendError> {
        self.applied.clear();
        let mut removed = 0;
        for family in IpFamily::ALL {
            let saved = self.exec.save(family)?;
            let (input, stats) = restore::cleanup_input(&saved);
            if !input.is_empty() {
                self.exec.restore(family, &input)?;
            }
            removed += stats.chains_deleted;
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests;
