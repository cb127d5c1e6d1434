//! The pace of a check's background read: it stops receiving the dump of our sets while
//! another program's commit settles.
//!
//! A program that commits to nf_tables closes its socket after, and the close waits, with
//! nf_tables' commit mutex held, for an RCU grace period (`nft_rcv_nl_event`,
//! `__flush_work`, `nf_tables_trans_destroy_work`, `synchronize_rcu`). Each reply of a dump
//! walks one of our sets inside an RCU read-side section, so a dump going on meanwhile
//! stretched that wait, and our next commit waited for the mutex behind it (kernel stacks
//! from `perf record -e sched:sched_switch -g`, README "Checks that let another program's
//! commit settle first"). The kernel fills the next reply of a dump when the reader asks
//! for it, so a read that waits before its next receive walks nothing meanwhile.

use super::generations::Generations;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long after another program's commit a read waits before it receives more.
pub const SETTLE: Duration = Duration::from_millis(100);

/// The most one read waits in all, so that a program committing all the time cannot hold
/// a check back for good.
pub const MOST: Duration = Duration::from_secs(1);

/// How long to wait now: until `settle` after `last_foreign`, the last commit another
/// program made, and no longer than `left` of the read's allowance.
pub fn wait_for(
    last_foreign: Option<Instant>,
    now: Instant,
    settle: Duration,
    left: Duration,
) -> Duration {
    last_foreign
        .map(|t| (t + settle).saturating_duration_since(now))
        .unwrap_or_default()
        .min(left)
}

/// Waits before each request and receive of one read while another program's commit
/// settles, as the change listener reports commits in `seen`.
pub struct Pacer {
    seen: Arc<Mutex<Generations>>,
    left: Duration,
    /// How long this read has waited, for its log.
    pub waited: Duration,
}

impl Pacer {
    pub fn new(seen: Arc<Mutex<Generations>>) -> Pacer {
        Pacer {
            seen,
            left: MOST,
            waited: Duration::ZERO,
        }
    }

    /// Called before each request and each receive of the read.
    pub fn wait_if_settling(&mut self) {
        let last = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_foreign_commit();
        let wait = wait_for(last, Instant::now(), SETTLE, self.left);
        if !wait.is_zero() {
            std::thread::sleep(wait);
            self.left = self.left.saturating_sub(wait);
            self.waited += wait;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_waits_until_another_commit_has_settled_and_no_longer_than_allowed() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(wait_for(None, now, SETTLE, MOST), Duration::ZERO);
        assert_eq!(wait_for(Some(now), now, SETTLE, MOST), SETTLE);
        assert_eq!(wait_for(Some(now - ms(30)), now, SETTLE, MOST), ms(70));
        assert_eq!(
            wait_for(Some(now - ms(150)), now, SETTLE, MOST),
            Duration::ZERO
        );
        assert_eq!(wait_for(Some(now), now, SETTLE, ms(20)), ms(20));
        assert_eq!(
            wait_for(Some(now), now, SETTLE, Duration::ZERO),
            Duration::ZERO
        );
    }

    #[test]
    fn a_pacer_waits_for_a_commit_the_listener_reports_as_someone_else_s() {
        let seen = Arc::new(Mutex::new(Generations::default()));
        seen.lock().unwrap().own_port(Some(7));
        let mut pacer = Pacer::new(seen.clone());
        pacer.wait_if_settling();
        assert_eq!(pacer.waited, Duration::ZERO, "no commit seen: no wait");
        seen.lock().unwrap().committed_by(5, 7);
        pacer.wait_if_settling();
        assert_eq!(pacer.waited, Duration::ZERO, "our own commit: no wait");
        seen.lock().unwrap().committed_by(6, 99);
        let t = Instant::now();
        pacer.wait_if_settling();
        assert!(t.elapsed() >= SETTLE / 2, "waited {:?}", t.elapsed());
        assert!(pacer.waited > Duration::ZERO && pacer.waited <= SETTLE);
    }
}
