//! A check step's time budget: its work goes on in units (a lookup call, a chunk of a
//! comparison) while one more unit, as long as the longest so far, still fits.
//!
//! Checking the budget only after each unit let a step overrun it by a whole unit: with a
//! 1 ms budget, steps took 1.3 to 1.8 ms at 100k services, once 2.3 ms, less their time
//! waiting for a CPU (`agent_e2e`, the debug log), and a sync that comes due waits for the
//! step in progress.

use std::time::{Duration, Instant};

/// Time left in one step, and the longest unit of work seen in it.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    started: Instant,
    limit: Duration,
    unit_began: Instant,
    longest: Duration,
}

impl Budget {
    /// A budget of `limit` from `now`.
    pub fn new(limit: Duration, now: Instant) -> Budget {
        Budget {
            started: now,
            limit,
            unit_began: now,
            longest: Duration::ZERO,
        }
    }

    /// A budget of `limit` from this instant.
    pub fn starting(limit: Duration) -> Budget {
        Budget::new(limit, Instant::now())
    }

    /// A unit of work ended at `now`: whether another as long as the longest so far still
    /// ends within the limit.
    pub fn another_fits_at(&mut self, now: Instant) -> bool {
        let unit = now.saturating_duration_since(self.unit_began);
        self.unit_began = now;
        self.longest = self.longest.max(unit);
        now.saturating_duration_since(self.started) + self.longest <= self.limit
    }

    /// [`Self::another_fits_at`] now.
    pub fn another_fits(&mut self) -> bool {
        self.another_fits_at(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Units of 0.4 ms in a 1 ms budget: two run, since a third would end at 1.2 ms.
    /// Checked only after each unit, the step would have run the third.
    #[test]
    fn a_unit_that_would_overrun_the_budget_is_not_begun() {
        let t0 = Instant::now();
        let mut b = Budget::new(MS, t0);
        assert!(b.another_fits_at(t0 + MS * 4 / 10));
        assert!(!b.another_fits_at(t0 + MS * 8 / 10));
    }

    /// The longest unit counts, not the last: after a slow unit, a fast one does not make
    /// room for another slow one.
    #[test]
    fn the_longest_unit_so_far_is_the_measure() {
        let t0 = Instant::now();
        let mut b = Budget::new(MS * 2, t0);
        assert!(b.another_fits_at(t0 + MS * 7 / 10));
        assert!(b.another_fits_at(t0 + MS * 8 / 10));
        // 1.4 ms spent and the last unit 0.6: by the last, 2.0 ms would fit.
        assert!(!b.another_fits_at(t0 + MS * 14 / 10));
    }

    /// A budget of nothing still lets the first unit run (a step always makes progress),
    /// and no second.
    #[test]
    fn an_empty_budget_allows_one_unit() {
        let t0 = Instant::now();
        let mut b = Budget::new(Duration::ZERO, t0);
        assert!(!b.another_fits_at(t0 + MS / 10));
    }
}
