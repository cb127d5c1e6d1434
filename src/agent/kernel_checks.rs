//! How the agent finds that someone else changed its rules: nftables mode's commit
//! notifications and periodic read-back (confirming suspected drift before repairing), and
//! iptables mode's canary chains.

use super::{Agent, KernelRead};
use dataplane::backend::{CheckResult, CheckStep, Subscribe};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// For a mode that has them: a thread blocked on the kernel's change notifications, one
/// message per burst (a full channel already says "look"). Other modes: a channel that
/// never speaks.
pub(super) fn watch_changes(subscribe: Option<Subscribe>) -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel::<()>(1);
    let Some(subscribe) = subscribe else {
        // A closed channel: its branch of the agent's loop never fires.
        return rx;
    };
    let spawned = std::thread::Builder::new()
        .name("kernel-changes".into())
        .spawn(move || {
            let mut wait = match subscribe() {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(
                        "cannot listen to the kernel's change notifications ({e}); changes by others are found by the periodic check only"
                    );
                    return;
                }
            };
            loop {
                match wait() {
                    Ok(()) => match tx.try_send(()) {
                        Ok(()) | Err(mpsc::error::TrySendError::Full(())) => {}
                        Err(mpsc::error::TrySendError::Closed(())) => return,
                    },
                    Err(e) => {
                        tracing::warn!("the kernel's change notifications: {e}");
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the change listener: {e}");
    }
    rx
}

/// How long one step of a check (comparing, looking up) may hold the event loop: a sync
/// that comes due meanwhile waits about this long at most. At 1 ms, with a read back of a
/// 100k-service table every second (`agent_e2e`, `SY_BENCH_FOREIGN=4`), 2,018 and 2,439 of
/// 2,880 changes reached the kernel within 1 ms; at 0.5 ms, 2,785 and 2,789, the checks no
/// slower (README, "Steps of half a millisecond").
pub(super) const CHECK_STEP: Duration = Duration::from_micros(500);

/// How long a check that someone else's commit started waits before it reads our tables:
/// as long as a read in progress waits for such a commit to settle, for the reason
/// `dataplane::nft::pacing` gives. At 10k x 10 with our table touched once a second
/// (`agent_e2e`, `SY_BENCH_FOREIGN=2`), a read begun at once made one sync per check take
/// 9 to 256 ms (p99 66 to 102 ms); reading 100 ms later, p99 12.6 and 14.2 ms, what the
/// other program's close costs anyway.
pub(super) const SETTLE: Duration = dataplane::nft::pacing::SETTLE;

/// A check going on in steps between syncs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stepping {
    started: Instant,
    steps: usize,
    longest: Duration,
    /// How much of the longest step the loop's thread spent on a CPU and waiting for one
    /// (the rest it was blocked, in the kernel).
    longest_split: Option<ThreadTimes>,
    /// Steps that held the loop longer than [`LONG_STEP`].
    long: usize,
}

/// A step longer than this held a sync that came due meanwhile past what issue 28 allows
/// a check to delay one.
const LONG_STEP: Duration = Duration::from_millis(2);

impl Stepping {
    fn since(started: Instant) -> Stepping {
        Stepping {
            started,
            steps: 0,
            longest: Duration::ZERO,
            longest_split: None,
            long: 0,
        }
    }
}

/// A thread's time on a CPU and waiting for one.
#[derive(Debug, Clone, Copy)]
struct ThreadTimes {
    on_cpu: Duration,
    waiting: Duration,
}

/// The calling thread's [`ThreadTimes`] since it started, when debug logging is on: they
/// tell a long step's own work from the time the loop's thread was runnable but not
/// running, and from the time it was blocked (neither). The time on a CPU is the thread's
/// CPU clock: `/proc/thread-self/schedstat`'s first field is brought up to date only at the
/// scheduler's ticks and switches, and read that way a step of 1.5 ms had 3.7 ms on a CPU.
/// The wait is that file's second field, which is updated when the thread is switched in.
fn thread_times() -> Option<ThreadTimes> {
    use nix::time::{clock_gettime, ClockId};
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return None;
    }
    let on_cpu = Duration::from(clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).ok()?);
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let waiting = text.split_whitespace().nth(1)?.parse().ok()?;
    Some(ThreadTimes {
        on_cpu,
        waiting: Duration::from_nanos(waiting),
    })
}

impl ThreadTimes {
    fn since(self, before: ThreadTimes) -> ThreadTimes {
        ThreadTimes {
            on_cpu: self.on_cpu.saturating_sub(before.on_cpu),
            waiting: self.waiting.saturating_sub(before.waiting),
        }
    }
}

impl Agent {
    /// The background read of the periodic check is back: the backend compares it (and
    /// looks up what it left out) in steps between syncs ([`Self::check_step`]), then a
    /// full sync repairs if the kernel no longer holds what we programmed.
    pub(super) fn checked(&mut self, (read, started): KernelRead) {
        self.checking = false;
        let read = match read {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(
                    "cannot read the kernel back for the periodic check: {e}; syncing in full"
                );
                self.backend.abandon_check();
                self.schedule.require_full();
                self.after_check();
                return;
            }
        };
        if self.backend.finish_check(read) {
            let by_lookup = self.backend.checking_by_lookup();
            let method = if by_lookup { "lookup" } else { "read" };
            self.metrics
                .kernel_checks_by
                .with_label_values(&[method])
                .inc();
            if by_lookup {
                tracing::debug!(
                    "periodic check: others changed only elements, chains or rules of our table; looking those up (in {:?})",
                    started.elapsed()
                );
            } else {
                tracing::debug!("periodic check: read back in {:?}", started.elapsed());
            }
            self.checking = true;
            self.stepping = Some(Stepping::since(started));
        } else {
            self.after_check();
        }
    }

    /// Someone else committed to our table while the check went on: what they changed may
    /// lie in a part already compared, so look again (unless a full sync is due anyway).
    fn after_check(&mut self) {
        if std::mem::take(&mut self.seen_while_checking) && !self.schedule.full_required() {
            self.commit_seen();
        }
    }

    /// One step of the check in hand: the agent's loop runs it whenever it has nothing
    /// else to do, so a sync that comes due waits for one step (about [`CHECK_STEP`]: a step
    /// begins no unit of work that would overrun it, `dataplane::nft::budget`; at 100k
    /// services on a loaded 2-core machine a check took about 12,000 steps, the longest
    /// 0.66 to 1.21 ms in 8 of 11 checks, and 3 of some 133,000 steps took over 2 ms: two
    /// of them waited 1.9 and 2.8 ms for a CPU, one ran 2.5 ms on one. The debug log
    /// reports the split and the steps over [`LONG_STEP`]).
    pub(super) fn check_step(&mut self) {
        let Some(stepping) = self.stepping.as_mut() else {
            return;
        };
        let backend = &mut self.backend;
        let times = thread_times();
        let t = Instant::now();
        let step = tokio::task::block_in_place(|| backend.check_step(CHECK_STEP));
        let took = t.elapsed();
        stepping.steps += 1;
        stepping.long += usize::from(took > LONG_STEP);
        if took > stepping.longest {
            stepping.longest = took;
            stepping.longest_split = times
                .zip(thread_times())
                .map(|(before, after)| after.since(before));
        }
        let check = match step {
            Some(Ok(CheckStep::More)) => return,
            Some(Ok(CheckStep::Done(check))) => Some(check),
            Some(Err(e)) => {
                tracing::warn!(
                    "cannot look elements up in the kernel for the periodic check: {e}; syncing in full"
                );
                self.schedule.require_full();
                None
            }
            // Ended by a failed sync, whose full retry repairs anyway.
            None => None,
        };
        let stepping = self.stepping.take().unwrap_or_else(|| Stepping::since(t));
        self.checking = false;
        tracing::debug!(
            "periodic check: {} steps between syncs, {} over {LONG_STEP:?}, the longest {:?} ({})",
            stepping.steps,
            stepping.long,
            stepping.longest,
            stepping
                .longest_split
                .map_or("its time on a CPU not known".to_string(), |t| format!(
                    "{:?} on a CPU, {:?} waiting for one, the rest blocked",
                    t.on_cpu, t.waiting
                ))
        );
        if let Some(check) = check {
            self.metrics
                .kernel_checks
                .observe(stepping.started.elapsed().as_secs_f64());
            self.judge(check);
        }
        self.after_check();
    }

    /// What a check found: nothing, differences to repair, or differences to confirm first.
    fn judge(&mut self, check: CheckResult) {
        if check.overlapped {
            // Once only, as for a read that overlapped: under steady churn of our chains
            // every check might; the next periodic check or foreign commit looks again.
            if std::mem::take(&mut self.overlapped_once) {
                tracing::debug!(
                    "periodic check: our own commits overlapped it twice; looking again at the next one"
                );
            } else {
                tracing::debug!("periodic check: our own commits overlapped it; looking again");
                self.overlapped_once = true;
                self.start_check(Instant::now());
            }
            return;
        }
        self.overlapped_once = false;
        if check.differences.is_empty() {
            self.suspect.clear();
            tracing::debug!("periodic check: the kernel holds what was programmed");
            return;
        }
        // A read that overlapped our commits can miss elements that never moved; what two
        // reads in a row both find missing really is.
        let confirming = !self.suspect.is_empty();
        let confirmed =
            check.consistent || check.differences.iter().any(|x| self.suspect.contains(x));
        if confirmed {
            self.suspect.clear();
            tracing::warn!(
                "the kernel no longer holds what was programmed ({}); repairing with a full sync",
                check.summary()
            );
            self.schedule.require_full();
        } else if confirming {
            // Once only: under steady churn every read overlaps commits.
            self.suspect.clear();
            tracing::debug!("periodic check: the differences were not confirmed by a second read");
        } else {
            tracing::debug!(
                "periodic check overlapped syncs and found {} differences; reading again to confirm",
                check.differences.len()
            );
            self.suspect = check.differences.into_iter().collect();
            self.start_check(Instant::now());
        }
    }

    /// Someone else's commit named our table (or notifications were lost). Unless the
    /// generations since the kernel last matched all prove harmless, read our tables back
    /// now and repair, rather than at the next periodic check (up to syncPeriod later).
    pub(super) fn commit_seen(&mut self) {
        if self.checking {
            self.seen_while_checking = true;
            return;
        }
        let backend = &mut self.backend;
        if tokio::task::block_in_place(|| backend.kernel_unchanged()) {
            return;
        }
        self.metrics
            .kernel_checks_by
            .with_label_values(&["notification"])
            .inc();
        tracing::debug!("another commit to nf_tables: checking our tables");
        self.start_check_after(Instant::now(), SETTLE);
    }

    /// Read the kernel back in the background; [`Self::checked`] gets the result.
    pub(super) fn start_check(&mut self, now: Instant) {
        self.start_check_after(now, Duration::ZERO);
    }

    /// [`Self::start_check`], the read `settle` later. What our commits do meanwhile is
    /// recorded from now on, as during the read.
    fn start_check_after(&mut self, now: Instant, settle: Duration) {
        let Some(read) = self.backend.begin_check() else {
            return;
        };
        self.checking = true;
        let tx = self.checked_tx.clone();
        tokio::task::spawn_blocking(move || {
            std::thread::sleep(settle);
            let _ = tx.blocking_send((read(), now + settle));
        });
    }

    /// A mode with a canary (iptables): if it is gone, someone flushed our rules; a full sync
    /// puts them back.
    pub(super) fn probe_canary(&mut self) {
        let now = Instant::now();
        self.next_canary = Some(now + self.canary_interval);
        let backend = &mut self.backend;
        match tokio::task::block_in_place(|| backend.rules_flushed()) {
            Ok(false) => {}
            Ok(true) => {
                tracing::warn!(
                    "a canary is gone: someone flushed our rules; repairing with a full sync"
                );
                self.schedule.require_full();
            }
            Err(e) => tracing::warn!("cannot look for the canary chains: {e}"),
        }
    }
}
