//! The IPVS backend: kube-proxy's IPVS mode. Virtual services and real servers over
//! generic netlink ([`genl`]), diffed so that one endpoint change is one or two operations
//! ([`diff`]); service addresses bound to `kube-ipvs0`; kube-proxy's ipsets ([`sets`]) and
//! the fixed iptables rules that match them for masquerade, node ports, source ranges and
//! traffic policies ([`rules`]). What to program is pure ([`plan`]); the kernel sits behind
//! [`kernel::IpvsKernel`] and the iptables executor.

pub mod diff;
pub mod genl;
pub mod kernel;
pub mod plan;
pub mod rules;
pub mod sets;

use crate::backend::{Backend, BackendError, Scope, SyncReport, TxStats};
use crate::iptables::diff::{self as iptables_diff, Base};
use crate::iptables::kernel::{IptablesError, IptablesExecutor};
use crate::iptables::plan::FamilyLayout;
use crate::model::{IpFamily, Snapshot};
use diff::{have_of, Draining, Have};
use genl::{Op, ServiceId};
use kernel::{IpvsError, IpvsKernel, LinkAddresses};
use plan::Plan;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Instant;

/// Schedulers the kernel ships (`ip_vs_<name>` modules); `ipvs.scheduler` must be one.
pub const SCHEDULERS: [&str; 13] = [
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh",
];

/// kube-apiserver's default service-node-port-range: an IPVS service on a node address
/// with a port in it is taken for a leftover node port of ours (or kube-proxy's).
const NODE_PORT_RANGE: std::ops::RangeInclusive<u16> = 30000..=32767;

/// What the last successful sync left.
#[derive(Debug, Clone, Default)]
struct Applied {
    plan: Plan,
    addresses: LinkAddresses,
    iptables: BTreeMap<IpFamily, FamilyLayout>,
}

/// What one sync did, beyond [`SyncReport`]: for the benchmarks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpvsStats {
    /// IPVS operations (adds, updates, deletes).
    pub operations: usize,
    /// IPVS requests in all, dumps included.
    pub requests: u64,
    pub address_changes: usize,
    pub set_changes: usize,
}

/// IPVS mode's settings (kube-proxy's `ipvs` section).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpvsOptions {
    /// One of [`SCHEDULERS`]; empty means rr.
    pub scheduler: String,
    pub strict_arp: bool,
    /// IPVS services on addresses inside these are never touched.
    pub exclude_cidrs: Vec<ipnetwork::IpNetwork>,
    /// Connection timeouts in seconds (tcp, tcp-fin, udp); zero leaves one as it is.
    pub timeouts: (u32, u32, u32),
}

/// Programs kube-proxy's IPVS mode.
#[derive(Debug)]
pub struct IpvsBackend<K: IpvsKernel, E: IptablesExecutor> {
    kernel: K,
    ipt: E,
    scheduler: String,
    options: IpvsOptions,
    applied: Option<Applied>,
    draining: Draining,
    /// How often partial syncs look again at drained servers outside the change (each
    /// look is one read per service; kube-proxy looks once a minute). Full syncs always do.
    drain_recheck: std::time::Duration,
    drain_checked: Option<Instant>,
    pub last: IpvsStats,
    /// The endpoint count of the last successful sync, for the next one's report.
    tally: Option<crate::tally::EndpointTally>,
}

/// [`IpvsBackend`]'s `drain_recheck`.
const DRAIN_RECHECK: std::time::Duration = std::time::Duration::from_secs(5);

impl<K: IpvsKernel, E: IptablesExecutor> IpvsBackend<K, E> {
    pub fn new(kernel: K, ipt: E, options: IpvsOptions) -> Self {
        IpvsBackend {
            kernel,
            ipt,
            scheduler: if options.scheduler.is_empty() {
                "rr".to_string()
            } else {
                options.scheduler.clone()
            },
            options,
            applied: None,
            draining: Draining::new(),
            drain_recheck: DRAIN_RECHECK,
            drain_checked: None,
            last: IpvsStats::default(),
            tally: None,
        }
    }

    pub fn kernel(&self) -> &K {
        &self.kernel
    }

    pub fn kernel_mut(&mut self) -> &mut K {
        &mut self.kernel
    }

    /// Whether this partial sync looks again at every drained server (and notes when).
    fn recheck_drained(&mut self) -> bool {
        let due = self
            .drain_checked
            .is_none_or(|t| t.elapsed() >= self.drain_recheck);
        if due {
            self.drain_checked = Some(Instant::now());
        }
        due
    }

    /// Real servers waiting at weight 0 for their connections to end.
    pub fn draining(&self) -> usize {
        self.draining.len()
    }

    /// What `render` prints: the plan as IPVS services, kube-ipvs0's addresses, the ipset
    /// and the iptables-restore inputs a first sync would apply.
    pub fn render(snapshot: &Snapshot, node_port_ips: &[IpAddr], scheduler: &str) -> String {
        use std::fmt::Write as _;
        let p = plan::plan(snapshot, node_port_ips, scheduler);
        let mut out = String::from("# IPVS virtual services and their real servers\n");
        for (id, w) in &p.services {
            let persist = if w.spec.timeout > 0 {
                format!(" persistent {}", w.spec.timeout)
            } else {
                String::new()
            };
            let _ = writeln!(out, "{id} {}{persist}  # {}", w.spec.scheduler, w.owner);
            for ((ip, port), weight) in &w.dests {
                let _ = writeln!(
                    out,
                    "  -> {} weight {weight}",
                    std::net::SocketAddr::new(*ip, *port)
                );
            }
        }
        let _ = writeln!(out, "# addresses bound to {}", kernel::DUMMY);
        for ip in &p.bound {
            let _ = writeln!(out, "{} address {ip}", kernel::DUMMY);
        }
        out.push_str("# ipset restore\n");
        for family in IpFamily::ALL {
            out.push_str(&sets::full_input(&p.sets, &[family]));
        }
        let jumps = rules::jumps();
        for family in IpFamily::ALL {
            let layout = rules::layout(&snapshot.node, family);
            out.push_str(&crate::iptables::restore_for_empty_kernel(
                family, &layout, &jumps,
            ));
        }
        out
    }

    fn sync_sets(&mut self, plan: &Plan, full: bool) -> Result<usize, IpvsError> {
        let (input, changes) = match (&self.applied, full) {
            (Some(a), false) => sets::partial_input(&a.plan.sets, &plan.sets),
            _ => (
                sets::full_input(&plan.sets, &IpFamily::ALL),
                plan.sets.len(),
            ),
        };
        if !input.is_empty() {
            self.kernel.ipset_restore(&input)?;
        }
        Ok(changes)
    }

    fn sync_iptables(
        &mut self,
        snapshot: &Snapshot,
        full: bool,
        stats: &mut TxStats,
    ) -> Result<BTreeMap<IpFamily, FamilyLayout>, IptablesError> {
        let mut out = BTreeMap::new();
        let jumps = rules::jumps();
        for family in IpFamily::ALL {
            let layout = rules::layout(&snapshot.node, family);
            let prev = self.applied.as_ref().and_then(|a| a.iptables.get(&family));
            let input = match prev {
                Some(p) if !full && p.fixed == layout.fixed => String::new(),
                Some(p) if !full => {
                    let base = Base::Previous {
                        layout: p,
                        changed: None,
                    };
                    iptables_diff::sync_input(&layout, base, &jumps).0
                }
                _ => {
                    let saved = match self.ipt.save(family) {
                        Ok(s) => s,
                        Err(e) if !has_family(snapshot, family) => {
                            tracing::warn!("{family} has no services, and reading it failed: {e}");
                            out.insert(family, layout);
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    let (input, s) =
                        iptables_diff::sync_input(&layout, Base::Kernel(&saved), &jumps);
                    stats.chains_written += s.chains_written;
                    stats.rules_written += s.rules_written + s.jumps_inserted;
                    stats.chains_deleted += s.chains_deleted;
                    input
                }
            };
            if !input.is_empty() {
                match self.ipt.restore(family, &input) {
                    Ok(()) => {}
                    Err(e) if !has_family(snapshot, family) => {
                        tracing::warn!("{family} has no services, and programming it failed: {e}");
                    }
                    Err(e) => return Err(e),
                }
            }
            out.insert(family, layout);
        }
        Ok(out)
    }

    /// A partial sync in time proportional to what changed: the last plan is updated in
    /// place for the `changed` services only, and only what that moved is written.
    /// `Ok(None)` when it cannot be (no last sync, or a front end claimed twice): the
    /// caller lays out everything.
    fn sync_changed(
        &mut self,
        snapshot: &Snapshot,
        changed: &BTreeSet<(String, String)>,
        started: Instant,
        requests_before: u64,
    ) -> Result<Option<SyncReport>, BackendError> {
        let Some(applied) = self.applied.as_mut() else {
            return Ok(None);
        };
        let node_port_ips = plan::node_port_addresses(snapshot, &applied.addresses.local);
        let Some(delta) = applied
            .plan
            .update(snapshot, changed, &node_port_ips, &self.scheduler)
        else {
            return Ok(None);
        };
        let no_local_endpoints = applied.plan.no_local_endpoints.clone();
        let mut tally = self.tally.take();
        // From here the last plan is the new one: a failure sends the next sync to the
        // kernel for the truth.
        match self.apply_delta(snapshot, &delta) {
            Ok((ops, stats)) => {
                let endpoints =
                    crate::tally::after_sync(&mut tally, snapshot, &Scope::Services(changed));
                self.tally = tally;
                let set_changes = delta.members_added.len() + delta.members_removed.len();
                let address_changes = delta.bound_added.len() + delta.bound_removed.len();
                self.last = IpvsStats {
                    operations: ops,
                    requests: self.kernel.requests() - requests_before,
                    address_changes,
                    set_changes,
                };
                Ok(Some(SyncReport {
                    full: false,
                    drift: false,
                    stats,
                    duration: started.elapsed(),
                    conflicts: Vec::new(),
                    no_local_endpoints,
                    services: snapshot.service_count(),
                    endpoints,
                }))
            }
            Err(e) => {
                self.applied = None;
                Err(e)
            }
        }
    }

    /// Writes what [`plan::Plan::update`] moved: set members, then the fixed rules if the
    /// node's settings moved them, addresses before the services on them, IPVS, and the
    /// addresses no longer used. Returns the IPVS operations done and the counts.
    fn apply_delta(
        &mut self,
        snapshot: &Snapshot,
        delta: &plan::Delta,
    ) -> Result<(usize, TxStats), BackendError> {
        let mut stats = TxStats::default();
        let input = sets::delta_input(&delta.members_removed, &delta.members_added);
        if !input.is_empty() {
            self.kernel.ipset_restore(&input)?;
        }
        let iptables = self.sync_iptables(snapshot, false, &mut stats)?;
        if !delta.bound_added.is_empty() {
            self.kernel
                .link()
                .add(&delta.bound_added)
                .map_err(IpvsError::Link)?;
        }
        let all_drained = self.recheck_drained();
        let Some(applied) = self.applied.as_mut() else {
            return Ok((0, stats));
        };
        applied.iptables = iptables;
        let mut ops = Vec::new();
        partial_ops(
            &mut self.kernel,
            &mut self.draining,
            &applied.plan,
            &delta.services,
            all_drained,
            &mut ops,
        )?;
        let (done, failed) = apply_ops(&mut self.kernel, ops);
        if let Some(e) = failed {
            return Err(e.into());
        }
        if !delta.bound_removed.is_empty() {
            self.kernel
                .link()
                .delete(&delta.bound_removed)
                .map_err(IpvsError::Link)?;
        }
        for op in &done {
            match op {
                Op::DeleteService(..) | Op::DeleteDest(..) => stats.elements_deleted += 1,
                _ => stats.elements_added += 1,
            }
        }
        stats.elements_added += delta.members_added.len() + delta.bound_added.len();
        stats.elements_deleted += delta.members_removed.len() + delta.bound_removed.len();
        Ok((done.len(), stats))
    }

    /// The IPVS operations of this sync, applied one by one; a failed one does not stop
    /// the others. Returns the operations and the first error.
    fn sync_ipvs(
        &mut self,
        plan: &Plan,
        addrs: &LinkAddresses,
        scope: &Scope<'_>,
        full: bool,
    ) -> Result<(Vec<Op>, Option<IpvsError>), IpvsError> {
        let mut ops = Vec::new();
        let applied = self.applied.as_ref();
        if full {
            let held = self.kernel.services()?;
            let held_ids: BTreeSet<ServiceId> = held.iter().map(|(id, _)| *id).collect();
            for (id, spec) in &held {
                let want = plan.services.get(id);
                let excluded = self
                    .options
                    .exclude_cidrs
                    .iter()
                    .any(|n| n.contains(id.addr));
                if want.is_none() && (excluded || !owned(id, addrs, applied.map(|a| &a.plan))) {
                    continue;
                }
                let have = match want {
                    Some(_) => {
                        let dests = self.kernel.dests(id)?;
                        Some(Have {
                            spec: spec.clone(),
                            dests: dests.into_iter().map(|d| ((d.addr, d.port), d)).collect(),
                        })
                    }
                    None => Some(Have {
                        spec: spec.clone(),
                        dests: BTreeMap::new(),
                    }),
                };
                diff::service_ops(id, have.as_ref(), want, &mut self.draining, &mut ops);
            }
            for (id, want) in &plan.services {
                if !held_ids.contains(id) {
                    diff::service_ops(id, None, Some(want), &mut self.draining, &mut ops);
                }
            }
            // Every drained server was looked at; those of services gone are forgotten.
            self.draining
                .retain(|(s, _, _)| plan.services.contains_key(s));
            self.drain_checked = Some(Instant::now());
        } else {
            let Some(applied) = self.applied.as_ref() else {
                return Ok((ops, None));
            };
            let touched = |w: &plan::WantedService| match scope {
                Scope::Services(set) => set.contains(&w.service),
                _ => true,
            };
            let changes: BTreeMap<ServiceId, Option<plan::WantedService>> = plan
                .services
                .iter()
                .filter(|(_, w)| touched(w))
                .chain(applied.plan.services.iter().filter(|(_, w)| touched(w)))
                .map(|(id, _)| (*id, applied.plan.services.get(id).cloned()))
                .collect();
            partial_ops(
                &mut self.kernel,
                &mut self.draining,
                plan,
                &changes,
                true,
                &mut ops,
            )?;
        }
        Ok(apply_ops(&mut self.kernel, ops))
    }
}

/// Whether a kernel IPVS service is one this backend (or kube-proxy before it) made: on a
/// kube-ipvs0 address, planned by the last sync, or a node port on a node address.
fn owned(id: &ServiceId, addrs: &LinkAddresses, last: Option<&Plan>) -> bool {
    addrs.bound.contains(&id.addr)
        || last.is_some_and(|p| p.services.contains_key(id))
        || (addrs.local.contains(&id.addr) && NODE_PORT_RANGE.contains(&id.port))
}

/// Applies `ops` (in batches, each operation on its own); a failed one does not stop the
/// others. Returns those done and the first error.
fn apply_ops<K: IpvsKernel>(kernel: &mut K, ops: Vec<Op>) -> (Vec<Op>, Option<IpvsError>) {
    let results = match kernel.apply_all(&ops) {
        Ok(r) => r,
        // The socket failed: what the kernel took is unknown, so nothing counts as done
        // (and the next sync reads the kernel).
        Err(e) => return (Vec::new(), Some(e)),
    };
    let mut first = None;
    let mut done = Vec::with_capacity(ops.len());
    for (op, r) in ops.into_iter().zip(results) {
        match r {
            Ok(()) => done.push(op),
            Err(e) => {
                tracing::warn!("IPVS: {e}");
                first = first.or(Some(e));
            }
        }
    }
    (done, first)
}

/// The operations that move the virtual services in `changes` (each with what the last
/// sync wanted for it) to `plan`, without reading the kernel except where a server is
/// removed from a TCP service (its connection counts decide whether it drains) and for
/// servers drained before: in the changed services, and with `all_drained` wherever
/// their service is.
fn partial_ops<K: IpvsKernel>(
    kernel: &mut K,
    draining: &mut Draining,
    plan: &Plan,
    changes: &BTreeMap<ServiceId, Option<plan::WantedService>>,
    all_drained: bool,
    ops: &mut Vec<Op>,
) -> Result<(), IpvsError> {
    let drained: BTreeSet<ServiceId> = draining
        .iter()
        .map(|(s, _, _)| *s)
        .filter(|s| all_drained || changes.contains_key(s))
        .collect();
    let mut prior: Vec<(ServiceId, Option<Have>)> = Vec::new();
    let ids: BTreeSet<ServiceId> = changes
        .keys()
        .copied()
        .chain(drained.iter().copied())
        .collect();
    for id in ids {
        let old = match changes.get(&id) {
            Some(old) => old.as_ref(),
            None => plan.services.get(&id),
        };
        let new = plan.services.get(&id);
        if old == new && !drained.contains(&id) {
            continue;
        }
        let removes = match (old, new) {
            (Some(o), Some(n)) => o.dests.keys().any(|k| !n.dests.contains_key(k)),
            _ => false,
        };
        let have = match old {
            Some(o) if drained.contains(&id) || (removes && diff_needs_counts(&id)) => {
                let dests = kernel.dests(&id)?;
                Some(Have {
                    spec: o.spec.clone(),
                    dests: dests.into_iter().map(|d| ((d.addr, d.port), d)).collect(),
                })
            }
            Some(o) => Some(have_of(o)),
            None => None,
        };
        prior.push((id, have));
    }
    for (id, have) in prior {
        diff::service_ops(&id, have.as_ref(), plan.services.get(&id), draining, ops);
    }
    Ok(())
}

fn diff_needs_counts(id: &ServiceId) -> bool {
    id.protocol == crate::model::Protocol::Tcp
}

fn has_family(snapshot: &Snapshot, family: IpFamily) -> bool {
    snapshot.services.keys().any(|(_, f)| *f == family)
}

impl<K: IpvsKernel, E: IptablesExecutor> Backend for IpvsBackend<K, E> {
    fn sync(&mut self, snapshot: &Snapshot, scope: Scope<'_>) -> Result<SyncReport, BackendError> {
        let started = Instant::now();
        let requests_before = self.kernel.requests();
        let full = scope.is_full() || self.applied.is_none();
        if full {
            self.kernel.set_sysctls(self.options.strict_arp)?;
            let (tcp, fin, udp) = self.options.timeouts;
            self.kernel.set_timeouts(tcp, fin, udp)?;
        }
        if let (false, Scope::Services(changed)) = (full, &scope) {
            if let Some(report) = self.sync_changed(snapshot, changed, started, requests_before)? {
                return Ok(report);
            }
        }
        // Counted again whole if this sync succeeds; none kept if it fails.
        self.tally = None;
        let addrs = match (&self.applied, full || matches!(scope, Scope::AllServices)) {
            (Some(a), false) => a.addresses.clone(),
            _ => self.kernel.link().addresses().map_err(IpvsError::Link)?,
        };
        let node_port_ips = plan::node_port_addresses(snapshot, &addrs.local);
        let plan = plan::plan(snapshot, &node_port_ips, &self.scheduler);
        let mut stats = TxStats::default();

        // Sets before the rules that name them; addresses before the services on them.
        let set_changes = self
            .sync_sets(&plan, full)
            .inspect_err(|_| self.applied = None)?;
        let iptables = self
            .sync_iptables(snapshot, full, &mut stats)
            .inspect_err(|_| self.applied = None)?;
        let held_bound = match (&self.applied, full) {
            (Some(a), false) => a.plan.bound.clone(),
            _ => addrs.bound.clone(),
        };
        let adds: Vec<IpAddr> = plan.bound.difference(&held_bound).copied().collect();
        if !adds.is_empty() {
            self.kernel
                .link()
                .add(&adds)
                .map_err(IpvsError::Link)
                .inspect_err(|_| self.applied = None)?;
        }
        let (ops, failed) = self
            .sync_ipvs(&plan, &addrs, &scope, full)
            .inspect_err(|_| self.applied = None)?;
        let deletes: Vec<IpAddr> = held_bound.difference(&plan.bound).copied().collect();
        if !deletes.is_empty() {
            self.kernel
                .link()
                .delete(&deletes)
                .map_err(IpvsError::Link)
                .inspect_err(|_| self.applied = None)?;
        }
        let address_changes = adds.len() + deletes.len();
        for op in &ops {
            match op {
                Op::AddService(..)
                | Op::AddDest(..)
                | Op::UpdateService(..)
                | Op::UpdateDest(..) => stats.elements_added += 1,
                Op::DeleteService(..) | Op::DeleteDest(..) => stats.elements_deleted += 1,
            }
        }
        stats.elements_added += set_changes + address_changes;
        let drift = full
            && self.applied.as_ref().is_some_and(|a| a.plan == plan)
            && (!ops.is_empty() || address_changes > 0);
        self.last = IpvsStats {
            operations: ops.len(),
            requests: self.kernel.requests() - requests_before,
            address_changes,
            set_changes,
        };
        if let Some(e) = failed {
            // The kernel is not what the plan says: the next sync looks at all of it.
            self.applied = None;
            return Err(e.into());
        }
        // The whole plan was made: the endpoints are counted whole, and kept.
        let endpoints = crate::tally::after_sync(&mut self.tally, snapshot, &Scope::AllServices);
        let report = SyncReport {
            full,
            drift,
            stats,
            duration: started.elapsed(),
            conflicts: plan.conflicts.clone(),
            no_local_endpoints: plan.no_local_endpoints.clone(),
            services: snapshot.service_count(),
            endpoints,
        };
        self.applied = Some(Applied {
            plan,
            addresses: addrs,
            iptables,
        });
        Ok(report)
    }

    /// Removes our IPVS services, kube-ipvs0, our chains and our ipsets; returns how many
    /// chains and sets went away.
    fn cleanup(&mut self) -> Result<usize, BackendError> {
        let applied = self.applied.take();
        self.draining.clear();
        let (mut removed, _) = remove_ipvs(
            &mut self.kernel,
            applied.as_ref().map(|a| &a.plan),
            &self.options.exclude_cidrs,
        )?;
        for family in IpFamily::ALL {
            let saved = match self.ipt.save(family) {
                Ok(s) => s,
                Err(e) if family == IpFamily::V6 => {
                    tracing::warn!("IPv6: {e}");
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let (input, stats) = iptables_diff::cleanup_input(&saved);
            if !input.is_empty() {
                self.ipt.restore(family, &input)?;
            }
            removed += stats.chains_deleted;
        }
        removed += destroy_sets(&mut self.kernel)?;
        Ok(removed)
    }
}

/// Deletes the IPVS services on kube-ipvs0's addresses and the node-port ones, then
/// kube-ipvs0 itself; returns how many services went away and whether the link was
/// there. For `cleanup` of ours and of kube-proxy's (same addresses, same link).
pub fn remove_ipvs<K: IpvsKernel>(
    kernel: &mut K,
    last: Option<&Plan>,
    exclude: &[ipnetwork::IpNetwork],
) -> Result<(usize, bool), IpvsError> {
    let addrs = kernel.link().addresses().map_err(IpvsError::Link)?;
    let mut removed = 0;
    for (id, _) in kernel.services()? {
        if owned(&id, &addrs, last) && !exclude.iter().any(|n| n.contains(id.addr)) {
            kernel.apply(&Op::DeleteService(id))?;
            removed += 1;
        }
    }
    let link = kernel.link().remove().map_err(IpvsError::Link)?;
    Ok((removed, link))
}

/// Destroys kube-proxy's (and our) ipsets; the rules that name them must be gone first.
pub fn destroy_sets<K: IpvsKernel>(kernel: &mut K) -> Result<usize, IpvsError> {
    let input = sets::destroy_input(&kernel.ipset_names()?);
    let n = input.lines().count();
    if n > 0 {
        kernel.ipset_restore(&input)?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests;
