//! The periodic check in nftables mode, after its background read: the comparison with
//! what we committed and then the lookups of the sets the read left out, both a step at a
//! time between syncs, so that no sync waits for more than one step.

use super::budget::Budget;
use super::kernel::{NftExecutor, Unread};
use super::tables::Ruleset;
use super::verify::Difference;
use super::{lookups, too_large, verify, NftBackend};
use crate::backend::{BackendError, CheckResult, CheckStep, ReadJob, Readback};
use crate::model::IpFamily;
use std::time::{Duration, Instant};

/// A check whose read is back.
#[derive(Debug)]
pub(super) struct Check {
    /// The kernel as read, until the comparison ends.
    kernel: Ruleset,
    /// The generation it was read at, when no commit overlapped the read.
    generation: Option<u32>,
    phase: Phase,
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
    pub(super) fn begin_check_read(&mut self) -> Option<ReadJob> {
        self.end_check();
        let unread = too_large(&self.applied.as_ref()?.ruleset, self.read_limit);
        let read = self.exec.background_read(unread)?;
        if !self.begin_verify() {
            return None;
        }
        Some(Box::new(move || {
            read()
                .map(|r| Readback(Box::new(r)))
                .map_err(BackendError::from)
        }))
    }

    /// The read is back: compare it in steps.
    pub(super) fn finish_check_read(&mut self, read: Readback) -> bool {
        let Ok(read) = read.0.downcast::<(Ruleset, Option<u32>)>() else {
            return false;
        };
        let (kernel, generation) = *read;
        let Some(applied) = self.applied.as_ref().filter(|_| self.verifying.is_some()) else {
            // A failed sync since: the full one that follows repairs anyway.
            drop_elsewhere(kernel);
            self.end_check();
            return false;
        };
        let comparison = verify::Comparison::new(&kernel, &applied.ruleset);
        self.check = Some(Check {
            kernel,
            generation,
            phase: Phase::Comparing(comparison),
        });
        true
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
                    if found.is_empty() && consistent && recent.is_empty() {
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
                        }));
                    }
                    let (mut keys, mut others) = (Vec::new(), Vec::new());
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
                        break Some(Outcome::Done(CheckResult {
                            differences,
                            consistent: true,
                        }));
                    }
                    if !others.is_empty() {
                        break Some(Outcome::Done(CheckResult {
                            differences: std::mem::take(others),
                            consistent: false,
                        }));
                    }
                    let left_out = unread(&check.kernel);
                    drop_elsewhere(std::mem::take(&mut check.kernel));
                    if left_out.is_empty() {
                        break Some(Outcome::Done(CheckResult {
                            differences: Vec::new(),
                            consistent,
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

/// Whether our set `set` of `family` is an interval set, whose elements lookups by key do
/// not find.
fn interval(committed: &Ruleset, family: IpFamily, set: &str) -> bool {
    committed
        .table(family)
        .and_then(|t| t.sets.get(set))
        .is_some_and(|s| s.interval())
}
