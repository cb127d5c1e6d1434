//! The periodic check in nftables mode, after its background read: the comparison with
//! what we committed and then the lookups of the sets the read left out, both a step at a
//! time between syncs, so that no sync waits for more than one step.

use super::budget::Budget;
use super::generations::TouchedKey;
use super::kernel::{NftExecutor, Unread};
use super::skeleton::MAP_AFFINITY;
use super::tables::Ruleset;
use super::verify::Difference;
use super::{lookups, too_large, verify, NftBackend};
use crate::backend::{BackendError, CheckResult, CheckStep, ReadJob, Readback};
use crate::model::IpFamily;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// A check whose read is back.
#[derive(Debug)]
pub(super) struct Check {
    /// The kernel as read, until the comparison ends.
    kernel: Ruleset,
    /// The generation it was read at, when no commit overlapped the read.
    generation: Option<u32>,
    /// A check of only what others changed since the kernel last held what we committed,
    /// at this generation ([`Touched`]).
    since: Option<u32>,
    /// The elements others changed, to look up once `kernel`, a read of our chains and
    /// rules without any set's elements, is compared.
    touched: Vec<TouchedKey>,
    phase: Phase,
}

/// What a check's background work brings back instead of a read when the change listener
/// saw others do nothing to our tables since `held` but add or delete elements of sets the
/// check can look up, chains or rules: those keys (up to the generation `to`), and if they
/// touched chains or rules, our tables read at `to` without any set's elements (`rules`).
/// Looking the keys up and comparing the chains costs a few requests where a read of 100k
/// services' tables costs a core for seconds.
#[derive(Debug)]
struct Touched {
    held: u32,
    keys: Vec<TouchedKey>,
    to: u32,
    rules: Option<Ruleset>,
}

/// The sets of `committed` whose elements a lookup by key finds (all but interval sets), and
/// that a read compares (not the affinity map, which the packet path fills).
fn lookable(committed: &Ruleset) -> BTreeSet<(IpFamily, String)> {
    committed
        .tables
        .iter()
        .flat_map(|(f, t)| {
            t.sets
                .iter()
                .filter(|(name, s)| !s.interval() && name.as_str() != MAP_AFFINITY)
                .map(move |(name, _)| (*f, name.clone()))
        })
        .collect()
}

#[derive(Debug)]
enum Phase {
    Comparing(verify::Comparison),
    /// The read overlapped commits and found elements different: each is looked up again.
    /// `others` are the differences lookups cannot settle (tables, chains, interval sets),
    /// which a second read must confirm.
    Confirming {
        confirmation: lookups::Confirmation,
        others: Vec<String>,
    },
    /// The sets the read left out.
    LookingUp(lookups::Lookups),
}

/// What a step came to, worked out before the backend's state is changed.
enum Outcome {
    More,
    Done(CheckResult),
    Failed(BackendError),
}

/// Frees a read of the kernel on a thread of its own: at 100k services it holds hundreds
/// of thousands of allocations, too many to free in one step of the agent's loop.
fn drop_elsewhere(read: Ruleset) {
    if read.tables.is_empty() {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("free-read".into())
        .spawn(move || drop(read));
}

/// The sets `kernel` was read without.
fn unread(kernel: &Ruleset) -> Unread {
    kernel
        .tables
        .iter()
        .flat_map(|(f, t)| {
            t.sets
                .iter()
                .filter(|(_, s)| s.unread)
                .map(move |(name, _)| (*f, name.clone()))
        })
        .collect()
}

impl<E: NftExecutor> NftBackend<E> {
    /// A background read of our tables without the sets too large to read back.
    /// Unless only elements, chains and rules were changed by others since the kernel last
    /// held what we committed ([`Touched`], decided on the background thread, once the
    /// change listener has caught up).
    pub(super) fn begin_check_read(&mut self) -> Option<ReadJob> {
        self.end_check();
        let applied = self.applied.as_ref()?;
        let unread = too_large(&applied.ruleset, self.read_limit);
        let touched = self
            .held_at
            .zip(self.exec.touched_since())
            .map(|(held, since)| {
                let rules = self.exec.background_read(every_set(&applied.ruleset));
                (held, since, lookable(&applied.ruleset), rules)
            });
        let read = self.exec.background_read(unread)?;
        if !self.begin_verify() {
            return None;
        }
        Some(Box::new(move || {
            if let Some((held, since, sets, rules)) = touched {
                if let Some(t) = since(held) {
                    // Nothing at all: then the agent asks for a read itself (it asks the
                    // generation first, `kernel_unchanged`).
                    let lookable = |(f, set, _): &TouchedKey| sets.contains(&(*f, set.to_string()));
                    if (t.rules || !t.keys.is_empty()) && t.keys.iter().all(lookable) {
                        let rules = match (t.rules, rules) {
                            (false, _) => Some(None),
                            // At the generation the listener saw last, or a read settles it.
                            (true, Some(rules)) => match rules() {
                                Ok((r, Some(at))) if at == t.to => Some(Some(r)),
                                _ => None,
                            },
                            (true, None) => None,
                        };
                        if let Some(rules) = rules {
                            return Ok(Readback(Box::new(Touched {
                                held,
                                keys: t.keys,
                                to: t.to,
                                rules,
                            })));
                        }
                    }
                }
            }
            read()
                .map(|r| Readback(Box::new(r)))
                .map_err(BackendError::from)
        }))
    }

    /// The read (or the keys to look up) is back: compare it in steps.
    pub(super) fn finish_check_read(&mut self, read: Readback) -> bool {
        let (kernel, generation, since, phase) = match read.0.downcast::<(Ruleset, Option<u32>)>() {
            Ok(read) => (read.0, read.1, None, None),
            Err(other) => {
                let Ok(t) = other.downcast::<Touched>() else {
                    return false;
                };
                let t = *t;
                match t.rules {
                    Some(rules) => (rules, Some(t.to), Some((t.held, t.keys)), None),
                    None => {
                        let phase = Phase::Confirming {
                            confirmation: lookups::Confirmation::new(t.keys),
                            others: Vec::new(),
                        };
                        let touched = (t.held, Vec::new());
                        (Ruleset::default(), Some(t.to), Some(touched), Some(phase))
                    }
                }
            }
        };
        let (since, touched) = since.unzip();
        let Some(applied) = self.applied.as_ref().filter(|_| self.verifying.is_some()) else {
            // A failed sync since: the full one that follows repairs anyway.
            drop_elsewhere(kernel);
            self.end_check();
            return false;
        };
        let phase = phase.unwrap_or_else(|| {
            Phase::Comparing(verify::Comparison::new(&kernel, &applied.ruleset))
        });
        self.check = Some(Check {
            kernel,
            generation,
            since,
            touched: touched.unwrap_or_default(),
            phase,
        });
        true
    }

    /// Whether the check in hand looks only at what others changed: the elements, looked
    /// up, and if chains or rules, our chains and rules read back without any element.
    pub(super) fn checking_by_lookup(&self) -> bool {
        self.check.as_ref().is_some_and(|c| c.since.is_some())
    }

    /// Stop checking: nothing is recorded or kept for it any more.
    pub(super) fn end_check(&mut self) {
        if let Some(check) = self.check.take() {
            drop_elsewhere(check.kernel);
        }
        self.verifying = None;
    }

    pub(super) fn next_check_step(
        &mut self,
        budget: Duration,
    ) -> Option<Result<CheckStep, BackendError>> {
        let started = Instant::now();
        let (Some(check), Some(applied)) = (self.check.as_mut(), self.applied.as_ref()) else {
            self.end_check();
            return None;
        };
        let exec = &mut self.exec;
        let mut look_up = |family, set: &str, keys: &[&str]| exec.look_up(family, set, keys);
        let consistent = check.generation.is_some();
        // A phase ended within the step is a unit of it: the next phase begins only if
        // one as long still fits (each phase keeps its own count within what is left).
        let mut phases = Budget::new(budget, started);
        let mut verified = None;
        let outcome = loop {
            let left = budget.saturating_sub(started.elapsed());
            match &mut check.phase {
                Phase::Comparing(comparison) => {
                    let Some(recent) = self.verifying.as_ref() else {
                        break None;
                    };
                    let Some(found) =
                        comparison.step(&check.kernel, &applied.ruleset, recent, left)
                    else {
                        break Some(Outcome::More);
                    };
                    // Our commits since the read wrote a table, a set's declaration or a
                    // chain: the comparison left those out, so a check of what others did
                    // vouches for none of their batches (a chain of ours created over one
                    // of theirs keeps their rules: no NLM_F_EXCL). The agent looks again,
                    // unless what was compared differs anyway.
                    let overlapped =
                        check.since.is_some() && (recent.tables || !recent.chains.is_empty());
                    // A read of our chains and rules alone says nothing of the elements.
                    if found.is_empty() && consistent && recent.is_empty() && check.since.is_none()
                    {
                        // Nothing of ours was committed since the read, which found our
                        // state whole; of the sets it left out, the lookups take this back
                        // if they find otherwise (until they end the agent asks nothing).
                        self.held_at = check.generation;
                    }
                    self.verifying = None;
                    if consistent && !found.is_empty() {
                        let differences = found.iter().map(ToString::to_string).collect();
                        break Some(Outcome::Done(CheckResult {
                            differences,
                            consistent,
                            ..CheckResult::default()
                        }));
                    }
                    if overlapped {
                        break Some(Outcome::Done(CheckResult {
                            overlapped: true,
                            ..CheckResult::default()
                        }));
                    }
                    let (mut keys, mut others) = (std::mem::take(&mut check.touched), Vec::new());
                    for d in found {
                        match d {
                            Difference::Element {
                                family, set, key, ..
                            } if !interval(&applied.ruleset, family, &set) => {
                                keys.push((family, set, key))
                            }
                            d => others.push(d.to_string()),
                        }
                    }
                    check.phase = Phase::Confirming {
                        confirmation: lookups::Confirmation::new(keys),
                        others,
                    };
                    if !phases.another_fits() {
                        break Some(Outcome::More);
                    }
                }
                Phase::Confirming {
                    confirmation,
                    others,
                } => {
                    let found = match confirmation.step(&applied.ruleset, left, &mut look_up) {
                        Ok(Some(found)) => found,
                        Ok(None) => break Some(Outcome::More),
                        Err(e) => break Some(Outcome::Failed(e.into())),
                    };
                    if !found.is_empty() {
                        // Looked up between our commits: nothing of ours was in flight.
                        let mut differences = found;
                        differences.append(others);
                        if check.since.is_some() {
                            // The repair reads back what it can; these may lie in a set
                            // it does not, so it reports drift from here.
                            self.drift_looked_up = true;
                        }
                        break Some(Outcome::Done(CheckResult {
                            differences,
                            consistent: true,
                            ..CheckResult::default()
                        }));
                    }
                    if let (Some(held), Some(to)) = (check.since, check.generation) {
                        // Each element others changed is as we committed it: their
                        // commits left our tables as they were.
                        verified = Some((held, to));
                    }
                    if !others.is_empty() {
                        break Some(Outcome::Done(CheckResult {
                            differences: std::mem::take(others),
                            consistent: false,
                            ..CheckResult::default()
                        }));
                    }
                    let left_out = unread(&check.kernel);
                    drop_elsewhere(std::mem::take(&mut check.kernel));
                    // A check of what others changed looked at all of it.
                    if left_out.is_empty() || check.since.is_some() {
                        break Some(Outcome::Done(CheckResult {
                            differences: Vec::new(),
                            consistent,
                            ..CheckResult::default()
                        }));
                    }
                    check.phase = Phase::LookingUp(lookups::Lookups::new(left_out));
                    if !phases.another_fits() {
                        break Some(Outcome::More);
                    }
                }
                Phase::LookingUp(lookups) => {
                    break Some(match lookups.step(&applied.ruleset, left, &mut look_up) {
                        Ok(lookups::Step::More) => Outcome::More,
                        Ok(lookups::Step::Done(differences)) => {
                            tracing::debug!(
                                "periodic check: looked up {} elements of the sets too large to read back in {} steps (the longest {:?})",
                                lookups.looked_up,
                                lookups.steps,
                                lookups.longest
                            );
                            if !differences.is_empty() {
                                self.held_at = None;
                                self.drift_looked_up = true;
                            }
                            Outcome::Done(CheckResult {
                                differences,
                                consistent: true,
                                ..CheckResult::default()
                            })
                        }
                        Err(e) => {
                            self.held_at = None;
                            Outcome::Failed(e.into())
                        }
                    });
                }
            }
        };
        if let Some((held, to)) = verified {
            self.exec.verified(held, to);
            // Moves the generation the kernel is known to hold our state at on to now,
            // unless someone else changed our tables again meanwhile.
            self.kernel_unchanged();
        }
        match outcome {
            Some(Outcome::More) => Some(Ok(CheckStep::More)),
            Some(Outcome::Done(result)) => {
                self.end_check();
                Some(Ok(CheckStep::Done(result)))
            }
            Some(Outcome::Failed(e)) => {
                self.end_check();
                Some(Err(e))
            }
            None => {
                self.end_check();
                None
            }
        }
    }
}

/// Every set of `committed`: a read of our chains and rules leaves out all their elements.
fn every_set(committed: &Ruleset) -> Unread {
    committed
        .tables
        .iter()
        .flat_map(|(f, t)| t.sets.keys().map(move |name| (*f, name.clone())))
        .collect()
}

/// Whether our set `set` of `family` is an interval set, whose elements lookups by key do
/// not find.
fn interval(committed: &Ruleset, family: IpFamily, set: &str) -> bool {
    committed
        .table(family)
        .and_then(|t| t.sets.get(set))
        .is_some_and(|s| s.interval())
}
