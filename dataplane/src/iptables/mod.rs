//! The iptables backend: `plan` (kube-proxy's chain layout, pure), `diff` (restore inputs
//! computed against the kernel for a full sync or our last write for a partial one, pure)
//! and `kernel` (the iptables binaries).

pub mod diff;
pub mod direct;
pub mod kernel;
pub mod names;
pub mod plan;
pub mod rule_parse;

use crate::backend::{
    Backend, BackendError, FailureCounter, RuleCount, Scope, ServiceKey, SyncReport, TxStats,
    Upkeep,
};
use crate::model::{IpFamily, Snapshot};
use diff::{Base, Input, RestoreStats, Style};
use kernel::{IptablesError, IptablesExecutor};
use plan::{FamilyLayout, Rendered};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// Programs kube-proxy-compatible iptables chains through an [`IptablesExecutor`].
#[derive(Debug)]
pub struct IptablesBackend<E: IptablesExecutor> {
    exec: E,
    /// What the last successful restores left in our chains, per family, as the layout
    /// that produced it; a family missing here is synced in full, against the kernel.
    applied: Rendered,
    /// The iptables-nft here refused a whole-table input's `-S` (only 1.8.9 is known to
    /// take it): every input is written chain by chain from then on.
    plain_only: bool,
    /// A direct write failed: chains go through iptables-nft-restore only from then on.
    no_direct: bool,
    /// Rules written into our chains by the last sync, per family and table.
    last_written: BTreeMap<(IpFamily, plan::TableName), usize>,
    /// The endpoint count of the last successful sync, for the next one's report.
    tally: Option<crate::tally::EndpointTally>,
}

impl<E: IptablesExecutor> IptablesBackend<E> {
    pub fn new(exec: E) -> Self {
        IptablesBackend {
            exec,
            applied: Rendered::default(),
            plain_only: false,
            no_direct: false,
            last_written: BTreeMap::new(),
            tally: None,
        }
    }

    pub fn executor(&self) -> &E {
        &self.exec
    }

    pub fn executor_mut(&mut self) -> &mut E {
        &mut self.exec
    }

    /// Rules we own per family and table, as the last syncs left them.
    pub fn rules_held(&self) -> BTreeMap<(IpFamily, plan::TableName), usize> {
        let mut out = BTreeMap::new();
        for (family, layout) in &self.applied.families {
            for (table, _, rules) in layout.chains() {
                *out.entry((*family, table)).or_insert(0) += rules.len();
            }
        }
        out
    }

    /// Rules the last sync wrote, per family and table (a partial sync writes only the
    /// changed services' chains; a family it did not touch wrote none).
    pub fn rules_written_last(&self) -> BTreeMap<(IpFamily, plan::TableName), usize> {
        let mut out = self.last_written.clone();
        for family in self.applied.families.keys() {
            for table in plan::TableName::ALL {
                out.entry((*family, table)).or_insert(0);
            }
        }
        out
    }

    /// Whether a canary chain the last syncs wrote is gone from any table: someone
    /// flushed or deleted our chains, and only a full sync brings them back. Families
    /// without services are not probed (the periodic full sync covers them): on a node
    /// without IPv6 the probe would only fail.
    pub fn canary_missing(&mut self) -> Result<bool, IptablesError> {
        for (family, layout) in &self.applied.families {
            if layout.ports.is_empty() {
                continue;
            }
            for (table, chains) in &layout.fixed.tables {
                if chains.contains_key(names::CANARY)
                    && !self.exec.chain_exists(*family, *table, names::CANARY)?
                {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// The restore input, per family, that would program `snapshot` into a kernel with
    /// none of our chains, as `switchyard render` prints it.
    pub fn render(snapshot: &Snapshot) -> String {
        let rendered = plan::render(snapshot);
        let mut out = String::new();
        for family in IpFamily::ALL {
            let (Some(layout), Some(jumps)) =
                (rendered.families.get(&family), rendered.jumps.get(&family))
            else {
                continue;
            };
            out.push_str(&restore_for_empty_kernel(family, layout, jumps));
        }
        out
    }

    /// One family: restore against the kernel (`previous` is `None`: full) or against
    /// `previous`, the old rules of what changed (partial).
    fn sync_family(
        &mut self,
        desired: &FamilyLayout,
        jumps: &[plan::Jump],
        previous: Option<(&FamilyLayout, Option<&BTreeSet<ServiceKey>>)>,
        applied_before: Option<&FamilyLayout>,
        family: IpFamily,
    ) -> Result<(RestoreStats, bool), IptablesError> {
        // Direct writes encode IPv4 rules only.
        let style = match (self.style(), family) {
            (Style::NftDirect, IpFamily::V6) => Style::Nft,
            (style, _) => style,
        };
        let (inputs, stats, drift) = match previous {
            Some((layout, changed)) => {
                // Emptied chains stay until the next full sync deletes them with the other
                // stale chains it finds.
                let (inputs, stats) =
                    diff::sync_inputs(desired, Base::Previous { layout, changed }, jumps, style);
                (inputs, stats, false)
            }
            None => {
                let saved = self.exec.save(family)?;
                // Drift: a chain or a jump we wrote is gone (someone flushed us).
                let drift = applied_before.is_some_and(|prev| {
                    prev.chains()
                        .any(|(t, c, _)| !saved.table(t).is_some_and(|h| h.chains.contains(c)))
                        || jumps.iter().any(|j| {
                            !saved
                                .table(j.table)
                                .is_some_and(|h| h.jumps_to(j.builtin, j.target))
                        })
                });
                let (inputs, stats) =
                    diff::sync_inputs(desired, Base::Kernel(&saved), jumps, style);
                (inputs, stats, drift)
            }
        };
        for input in &inputs {
            let done = match input {
                Input::Restore(text) => self.exec.restore(family, text),
                Input::Create { table, chains } => self
                    .exec
                    .create_chains(family, *table, chains)
                    .inspect(|()| {
                        tracing::info!(
                            "{family}: {} new chains created directly over nf_tables netlink",
                            chains.len()
                        )
                    })
                    .inspect_err(|e| {
                        tracing::warn!(
                            "{family}: creating {} chains directly failed, so chains go \
                             through iptables-nft-restore from now on: {e}",
                            chains.len()
                        );
                        self.no_direct = true;
                    }),
            };
            match done {
                Ok(()) => {}
                // What a refused step committed before is read back with the rest: this
                // sync starts over, in full, without what was refused.
                // Drift found before stays found: what was repaired meanwhile hides it.
                Err(_) if matches!(input, Input::Create { .. }) => {
                    return self
                        .sync_family(desired, jumps, None, applied_before, family)
                        .map(|(s, d)| (s, d || drift));
                }
                Err(e) if self.refused_whole_table(&e) => {
                    return self
                        .sync_family(desired, jumps, None, applied_before, family)
                        .map(|(s, d)| (s, d || drift));
                }
                Err(e) => return Err(e),
            }
        }
        Ok((stats, drift))
    }

    /// Whether `e` is the refusal of a whole-table input's `-S`; if so, every input is
    /// written chain by chain from now on.
    fn refused_whole_table(&mut self, e: &IptablesError) -> bool {
        let refused = self.style() != Style::Plain
            && matches!(e, IptablesError::Rejected { line: Some(l), .. } if l.trim() == "-S");
        if refused {
            tracing::warn!(
                "{e}: this iptables-nft refuses -S in a restore; writing chain by chain from \
                 now on, which is slow for large clusters"
            );
            self.plain_only = true;
        }
        refused
    }

    /// The layout asked of restore inputs: what the executor's binary takes, unless it
    /// refused a whole-table input.
    fn style(&self) -> Style {
        match self.exec.style() {
            _ if self.plain_only => Style::Plain,
            Style::NftDirect if self.no_direct => Style::Nft,
            style => style,
        }
    }
}

impl<E: IptablesExecutor> Backend for IptablesBackend<E> {
    fn sync(&mut self, snapshot: &Snapshot, scope: Scope<'_>) -> Result<SyncReport, BackendError> {
        let started = Instant::now();
        let mut tally = self.tally.take();
        let first = self.applied.families.is_empty();
        if (scope.is_full() || first) && plan::fixed::localhost_node_ports(&snapshot.node) {
            self.exec.enable_route_localnet()?;
        }
        let all_applied = IpFamily::ALL
            .iter()
            .all(|f| self.applied.families.contains_key(f));
        // Crossing kube-proxy's large-cluster threshold changes every endpoint rule: the
        // sync compares every port with the last one then (still writing only what differs).
        let changed = match scope {
            Scope::Services(changed)
                if all_applied && !plan::mode_changed(snapshot, &self.applied) =>
            {
                Some(changed)
            }
            _ => None,
        };
        // With changed services, the rest of the layout moves over from the last sync and
        // `previous` keeps only what the changed ports had.
        let mut previous = std::mem::take(&mut self.applied);
        let mut rendered = plan::rerender(snapshot, &mut previous, changed);
        let report = std::mem::take(&mut rendered.report);
        let mut stats = RestoreStats::default();
        let mut drift = false;
        let mut full = false;
        let mut failure = None;
        self.last_written.clear();
        // A family that fails does not stop the other.
        for family in IpFamily::ALL {
            let (Some(desired), Some(jumps)) = (
                rendered.families.remove(&family),
                rendered.jumps.remove(&family),
            ) else {
                continue;
            };
            let before = previous.families.get(&family);
            let family_full = scope.is_full() || before.is_none();
            full |= family_full;
            let base = (!family_full)
                .then(|| before.map(|b| (b, changed)))
                .flatten();
            match self.sync_family(&desired, &jumps, base, before, family) {
                Ok((s, d)) => {
                    for (table, n) in &s.rules_by_table {
                        self.last_written.insert((family, *table), *n);
                    }
                    stats.add(s);
                    drift |= d;
                    self.applied.families.insert(family, desired);
                    self.applied.jumps.insert(family, jumps);
                }
                // A family with no services may simply be unusable here (IPv6 disabled, no
                // ip6tables): a warning, not a failed sync; with nothing to program, it
                // counts as programmed until a service of that family appears.
                Err(e) if desired.ports.is_empty() => {
                    tracing::warn!("{family} has no services, and programming it failed: {e}");
                    self.applied.families.insert(family, desired);
                    self.applied.jumps.insert(family, jumps);
                }
                // The family stays out of `applied`: its next sync is full.
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        if let Some(e) = failure {
            return Err(e.into());
        }
        let endpoints = crate::tally::after_sync(&mut tally, snapshot, &scope);
        self.tally = tally;
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
            endpoints,
        })
    }

    /// Removes our chains and the jumps to them from both families; returns how many
    /// chains went away.
    fn cleanup(&mut self) -> Result<usize, BackendError> {
        self.cleanup_of(&names::owned)
    }

    fn upkeep(&self) -> Upkeep {
        Upkeep {
            canary: true,
            ..Upkeep::default()
        }
    }

    fn rules_flushed(&mut self) -> Result<bool, BackendError> {
        Ok(self.canary_missing()?)
    }

    fn failure_counter(&self) -> Option<FailureCounter> {
        Some(FailureCounter::IptablesRestore)
    }

    /// kube-proxy has no mangle chains: that table shows only when we hold rules there.
    fn rule_counts(&self) -> Vec<RuleCount> {
        let last = self.rules_written_last();
        let mut held: BTreeMap<_, usize> = last.keys().map(|k| (*k, 0)).collect();
        held.extend(self.rules_held());
        held.into_iter()
            .filter(|((_, table), total)| *total > 0 || *table != plan::TableName::Mangle)
            .map(|((family, table), total)| RuleCount {
                family,
                table: table.as_str(),
                total,
                last_sync: last.get(&(family, table)).copied().unwrap_or(0),
            })
            .collect()
    }
}

impl<E: IptablesExecutor> IptablesBackend<E> {
    /// Remove kube-proxy's chains (every mode's) and the jumps to them.
    pub fn cleanup_kube_proxy(&mut self) -> Result<usize, BackendError> {
        self.cleanup_of(&names::kube_proxy_owned)
    }

    fn cleanup_of(&mut self, owned: &dyn Fn(&str) -> bool) -> Result<usize, BackendError> {
        self.applied = Rendered::default();
        let mut removed = 0;
        for family in IpFamily::ALL {
            let saved = self.exec.save(family)?;
            let (input, stats) = diff::cleanup_input_of(&saved, owned, self.style());
            if !input.is_empty() {
                match self.exec.restore(family, &input) {
                    Err(e) if self.refused_whole_table(&e) => {
                        let (input, _) = diff::cleanup_input_of(&saved, owned, Style::Plain);
                        self.exec.restore(family, &input)?;
                    }
                    r => r?,
                }
            }
            removed += stats.chains_deleted;
        }
        Ok(removed)
    }
}

/// What `render` prints for one family: the restore input that programs `layout` into a
/// kernel holding nothing of ours, under a header naming the command.
pub(crate) fn restore_for_empty_kernel(
    family: IpFamily,
    layout: &FamilyLayout,
    jumps: &[plan::Jump],
) -> String {
    let empty = diff::Saved::default();
    let (input, _) = diff::sync_input(layout, Base::Kernel(&empty), jumps);
    let cmd = match family {
        IpFamily::V4 => "iptables-restore",
        IpFamily::V6 => "ip6tables-restore",
    };
    format!("# {family}: {cmd} --noflush\n{input}")
}

#[cfg(test)]
mod tests;
