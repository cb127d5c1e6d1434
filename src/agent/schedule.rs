//! When to sync: kube-proxy's bounded-frequency runner as a pure state machine over
//! instants. Requests coalesce, syncs are at least `min_interval` apart, a full sync runs
//! every `full_interval`, and a failed sync is retried, in full, with exponential backoff.

use std::time::{Duration, Instant};

/// The runner's state; the caller owns the clock.
#[derive(Debug, Clone)]
pub struct Schedule {
    min_interval: Duration,
    full_interval: Duration,
    last_start: Option<Instant>,
    next_full: Option<Instant>,
    requested: bool,
    need_full: bool,
    failures: u32,
    retry_at: Option<Instant>,
}

impl Schedule {
    pub fn new(min_interval: Duration, full_interval: Duration) -> Schedule {
        Schedule {
            min_interval,
            full_interval,
            last_start: None,
            next_full: None,
            requested: false,
            // The first sync is full: it reads the kernel and replaces what an earlier run left.
            need_full: true,
            failures: 0,
            retry_at: None,
        }
    }

    /// Something changed; a sync should follow (coalesced with any already requested).
    pub fn request(&mut self) {
        self.requested = true;
    }

    /// Consecutive failed syncs.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// When the next sync is due. `ready` is false until every source has listed; nothing
    /// runs before that.
    pub fn due(&self, ready: bool) -> Option<Instant> {
        if !ready {
            return None;
        }
        if let Some(at) = self.retry_at {
            return Some(at);
        }
        let Some(last) = self.last_start else {
            // First sync: now.
            return Some(Instant::now());
        };
        let mut due = self.next_full;
        if self.requested || self.need_full {
            let at = last + self.min_interval;
            due = Some(due.map_or(at, |d| d.min(at)));
        }
        due
    }

    /// A sync starts at `now`; returns whether it must be a full one.
    pub fn start(&mut self, now: Instant) -> bool {
        let full = self.need_full || self.next_full.is_none_or(|t| t <= now);
        self.requested = false;
        self.retry_at = None;
        self.last_start = Some(now);
        full
    }

    /// Whether the next sync must be full for a reason other than the period: the first
    /// one, a retry after a failure, or [`Self::require_full`].
    pub fn full_required(&self) -> bool {
        self.need_full
    }

    /// The periodic full check was handed off at `now` (to a background read); the next
    /// one is a period away, and this sync need not be full.
    pub fn periodic_deferred(&mut self, now: Instant) {
        self.next_full = Some(now + self.full_interval);
    }

    /// The next sync must be full (the kernel was found changed), and soon.
    pub fn require_full(&mut self) {
        self.need_full = true;
        self.requested = true;
    }

    /// The sync that started last succeeded at `now`.
    pub fn succeeded(&mut self, now: Instant, full: bool) {
        self.failures = 0;
        self.need_full = false;
        if full {
            self.next_full = Some(now + self.full_interval);
        }
    }

    /// The sync that started last failed at `now`; returns the backoff before the retry.
    pub fn failed(&mut self, now: Instant) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.need_full = true;
        let base = self.min_interval.max(Duration::from_millis(500));
        let backoff = base
            .saturating_mul(1u32 << self.failures.saturating_sub(1).min(16))
            .min(self.full_interval.max(base));
        self.retry_at = Some(now + backoff);
        backoff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(1);
    const FULL: Duration = Duration::from_secs(30);

    #[test]
    fn nothing_runs_before_the_initial_lists() {
        let s = Schedule::new(MIN, FULL);
        assert_eq!(s.due(false), None);
        assert!(s.due(true).is_some());
    }

    #[test]
    fn first_sync_is_full_then_requests_are_partial_and_spaced() {
        let mut s = Schedule::new(MIN, FULL);
        let t0 = Instant::now();
        assert!(s.start(t0));
        s.succeeded(t0, true);
        // Idle: only the periodic full sync is due.
        assert_eq!(s.due(true), Some(t0 + FULL));
        s.request();
        s.request();
        assert_eq!(s.due(true), Some(t0 + MIN));
        let t1 = t0 + MIN;
        assert!(!s.start(t1));
        s.succeeded(t1, false);
        assert_eq!(s.due(true), Some(t0 + FULL));
        // The periodic one is full.
        assert!(s.start(t0 + FULL));
    }

    #[test]
    fn failures_back_off_and_retry_in_full() {
        let mut s = Schedule::new(MIN, FULL);
        let t0 = Instant::now();
        s.start(t0);
        s.succeeded(t0, true);
        s.request();
        let t1 = t0 + MIN;
        assert!(!s.start(t1));
        assert_eq!(s.failed(t1), MIN);
        assert_eq!(s.due(true), Some(t1 + MIN));
        let t2 = t1 + MIN;
        assert!(s.start(t2));
        assert_eq!(s.failed(t2), MIN * 2);
        let t3 = t2 + MIN * 2;
        assert!(s.start(t3));
        assert_eq!(s.failed(t3), MIN * 4);
        for _ in 0..10 {
            s.start(t3);
            s.failed(t3);
        }
        assert_eq!(
            s.due(true),
            Some(t3 + FULL),
            "backoff is capped at the sync period"
        );
        assert_eq!(s.failures(), 13);
        s.start(t3 + FULL);
        s.succeeded(t3 + FULL, true);
        assert_eq!(s.failures(), 0);
        assert_eq!(s.due(true), Some(t3 + FULL + FULL));
    }
}
