//! Which nf_tables generations the change listener saw committed, and whether each one left
//! our tables alone: what lets the periodic check tell from one generation request that
//! the kernel still holds what we programmed while other programs (a CNI plugin, a
//! firewall) commit to their own tables. Without it every foreign commit meant reading our
//! tables back, and at 100k services the kernel's dump of a 1M-element map takes it tens of
//! seconds (`rhashtable_walk_next` restarts from the first element for every 32 KB of
//! reply).
//!
//! The kernel announces a committed batch as one notification per object it added or
//! deleted, each carrying the committing socket's port, then `NFT_MSG_NEWGEN` with the
//! generation the batch made. Batches do not interleave: all of it is sent under the
//! commit mutex.
//!
//! A batch of someone else's that only added or deleted elements of our sets names each
//! element in its notifications: those keys are kept with its generation, so that a check
//! can look up just them instead of reading our tables back ([`Generations::touched_since`]).
//! One that added or deleted chains or rules of our table is kept as such: a check reads
//! back our chains and rules, without any set's elements.

use crate::model::IpFamily;
use std::collections::VecDeque;

/// An element of one of our sets (family, set, key as canonical text) that someone else's
/// batch added or deleted.
pub type TouchedKey = (IpFamily, String, String);

/// The most keys (and batches that changed chains or rules) kept for checks to look up;
/// beyond them the oldest batches count as changes of any kind, which a read settles.
pub const MAX_TOUCHED: usize = 10_000;

/// What someone else's batches did to our table after a generation the kernel held our
/// state at, when that was no more than adding or deleting elements, chains and rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Touches {
    /// The elements of our sets added or deleted.
    pub keys: Vec<TouchedKey>,
    /// Whether chains or rules of our table were added, changed or deleted.
    pub rules: bool,
    /// The last generation the listener saw.
    pub to: u32,
}

/// A batch's share of [`MAX_TOUCHED`].
fn weight(keys: &[TouchedKey], rules: bool) -> usize {
    keys.len() + usize::from(rules)
}

/// The generation after `g`: the kernel skips 0 when its counter wraps.
pub fn next_generation(g: u32) -> u32 {
    match g.wrapping_add(1) {
        0 => 1,
        n => n,
    }
}

/// The generation before `g` (the kernel skips 0 when its counter wraps).
pub fn previous(g: u32) -> u32 {
    match g.wrapping_sub(1) {
        0 => u32::MAX,
        p => p,
    }
}

/// What the listener saw, fed from its thread; asked by the commit path.
#[derive(Debug, Default, Clone)]
pub struct Generations {
    /// The port of the socket our own commits go through: its batches are ours.
    own_port: Option<u32>,
    /// The batch being announced named our table and was not ours, or part of what came
    /// before its generation may have been missed.
    open_changed: bool,
    /// Every generation after `.0` up to and including `.1` was seen, and each was ours or
    /// left our tables alone.
    run: Option<(u32, u32)>,
    /// The listener is out of the group or just back in it: a batch announced across its
    /// return shows only its end, so whatever it sees now counts as a change.
    rejoining: bool,
    /// Generations up to this one were committed before the listener was back in the
    /// group: each counts as a change.
    doubtful_up_to: Option<u32>,
    /// When the listener last saw another program's batch end ([`super::pacing`]).
    last_foreign: Option<std::time::Instant>,
    /// The batch being announced did more to our table than add or delete elements of
    /// our sets, chains and rules (or the listener cannot tell).
    open_other: bool,
    /// The elements of our sets the batch being announced added or deleted, if not ours.
    open_keys: Vec<TouchedKey>,
    /// The batch being announced, not ours, added, changed or deleted chains or rules of
    /// our table.
    open_rules: bool,
    /// As `run`, but a batch of someone else's that only added or deleted elements, chains
    /// or rules of our table continues it; those batches' generations, keys and whether
    /// they changed chains or rules are `touched`.
    loose: Option<(u32, u32)>,
    touched: VecDeque<(u32, Vec<TouchedKey>, bool)>,
    /// The [`weight`] of what `touched` holds.
    touched_keys: usize,
}

impl Generations {
    /// Our commits now go through the socket with this port (`None`: it was closed, and
    /// another process may be given its port).
    pub fn own_port(&mut self, port: Option<u32>) {
        self.own_port = port;
    }

    /// Whether `port` is the socket our own batches are committed on.
    pub fn is_own(&self, port: u32) -> bool {
        self.own_port == Some(port)
    }

    /// A notification of one object, from the socket with `port`; true when it is someone
    /// else's change to our table.
    pub fn announced(&mut self, port: u32, names_our_table: bool) -> bool {
        let theirs = names_our_table && self.own_port != Some(port);
        self.open_changed |= theirs;
        self.open_other |= theirs;
        theirs
    }

    /// A notification that elements of our sets were added or deleted, from the socket
    /// with `port`; true when it is someone else's change.
    pub fn announced_elements(&mut self, port: u32, keys: Vec<TouchedKey>) -> bool {
        let theirs = self.own_port != Some(port);
        if theirs {
            self.open_changed = true;
            if self.open_keys.len() + keys.len() > MAX_TOUCHED {
                // A flush of a large map, say: a read settles it, and the keys are not kept.
                self.open_other = true;
                self.open_keys = Vec::new();
            } else if !self.open_other {
                self.open_keys.extend(keys);
            }
        }
        theirs
    }

    /// A notification that a chain or rule of our table was added, changed or deleted,
    /// from the socket with `port`; true when it is someone else's change.
    pub fn announced_rules(&mut self, port: u32) -> bool {
        let theirs = self.own_port != Some(port);
        if theirs {
            self.open_changed = true;
            self.open_rules = true;
        }
        theirs
    }

    /// The end of a batch committed on the socket with `port`: the kernel moved to
    /// `generation`.
    pub fn committed_by(&mut self, generation: u32, port: u32) {
        if self.own_port != Some(port) {
            self.last_foreign = Some(std::time::Instant::now());
        }
        self.committed(generation);
    }

    /// When another program's batch last ended, as far as the listener saw.
    pub fn last_foreign_commit(&self) -> Option<std::time::Instant> {
        self.last_foreign
    }

    /// The end of a batch: the kernel moved to `generation`.
    pub fn committed(&mut self, generation: u32) {
        let doubtful = self.doubtful_up_to.is_some_and(|d| !later(generation, d));
        if !doubtful {
            self.doubtful_up_to = None;
        }
        let changed = std::mem::take(&mut self.open_changed) || self.rejoining || doubtful;
        let other = std::mem::take(&mut self.open_other) || self.rejoining || doubtful;
        let keys = std::mem::take(&mut self.open_keys);
        let rules = std::mem::take(&mut self.open_rules);
        self.run = Some(continued(self.run, changed, generation));
        let follows = self
            .loose
            .is_some_and(|(_, to)| next_generation(to) == generation);
        if other || !follows {
            self.touched.clear();
            self.touched_keys = 0;
        }
        self.loose = Some(continued(self.loose, other, generation));
        if changed && !other {
            self.touched_keys += weight(&keys, rules);
            self.touched.push_back((generation, keys, rules));
            while self.touched_keys > MAX_TOUCHED {
                // What the oldest batch changed is forgotten: from it on, only a read.
                let Some((g, k, r)) = self.touched.pop_front() else {
                    break;
                };
                self.touched_keys -= weight(&k, r);
                self.loose = self.loose.map(|(_, end)| (g, end));
            }
        }
    }

    /// The elements of our sets someone else added or deleted after generation `held`,
    /// whether they added or deleted chains or rules of our table, and the last generation
    /// seen, when every batch after `held` was seen and was ours, left our tables alone or
    /// did only that; `None` otherwise.
    pub fn touched_since(&self, held: u32) -> Option<Touches> {
        if self.rejoining || self.doubtful_up_to.is_some() {
            return None;
        }
        let (start, end) = self.loose?;
        let at = |g: u32| g.wrapping_sub(start);
        if at(held) > at(end) {
            return None;
        }
        let after = || {
            self.touched
                .iter()
                .filter(move |(g, _, _)| at(*g) > at(held) && at(*g) <= at(end))
        };
        Some(Touches {
            keys: after().flat_map(|(_, k, _)| k.iter().cloned()).collect(),
            rules: after().any(|(_, _, r)| *r),
            to: end,
        })
    }

    /// A check looked up every element someone else added or deleted after `held` up to
    /// `to` ([`Self::touched_since`]) and found each as we committed it (and our chains and
    /// rules as we committed them, if theirs were touched): those batches count as having
    /// left our tables alone.
    pub fn verified(&mut self, held: u32, to: u32) {
        let Some((start, end)) = self.loose else {
            return;
        };
        let at = |g: u32| g.wrapping_sub(start);
        if at(held) > at(to) || at(to) > at(end) {
            return;
        }
        if let Some((from, last)) = self.run {
            // The run restarted at a batch of theirs no later than `to`: it now goes back
            // to `held`.
            if at(from) >= at(held) && at(from) <= at(to) {
                self.run = Some((held, last));
            }
        }
        while self
            .touched
            .front()
            .is_some_and(|(g, _, _)| at(*g) <= at(to))
        {
            if let Some((_, k, r)) = self.touched.pop_front() {
                self.touched_keys -= weight(&k, r);
            }
        }
    }

    /// The listener may have seen only part of what was committed up to `now`, the
    /// kernel's generation asked after the fact (it just joined the group, or notifications
    /// were lost): each of those batches counts as a change. Without `now`, every batch
    /// does until [`Self::back_at`].
    pub fn partly_seen_through(&mut self, now: Option<u32>) {
        self.forget_touched();
        match now {
            Some(g) => self.doubt_through(g),
            None => {
                self.run = None;
                self.rejoining = true;
            }
        }
    }

    /// Notifications were lost: the socket's queue overflowed (the kernel reports it before
    /// the older messages still queued) or a datagram could not be read. `now` as in
    /// [`Self::partly_seen_through`].
    pub fn lost(&mut self, now: Option<u32>) {
        self.open_changed = true;
        self.partly_seen_through(now);
    }

    /// The listener leaves the group while a commit of ours runs.
    pub fn leaving(&mut self) {
        self.rejoining = true;
        self.forget_touched();
    }

    /// What was missed may have changed anything: no batch so far is vouched for by keys.
    fn forget_touched(&mut self) {
        self.loose = None;
        self.touched.clear();
        self.touched_keys = 0;
    }

    /// The kernel was at `generation` after the listener was back in the group: whatever
    /// was committed up to it may have been seen in part.
    pub fn back_at(&mut self, generation: u32) {
        if self.rejoining {
            self.rejoining = false;
            self.doubt_through(generation);
        }
    }

    fn doubt_through(&mut self, generation: u32) {
        self.doubtful_up_to = Some(match self.doubtful_up_to {
            Some(d) if later(d, generation) => d,
            _ => generation,
        });
    }

    /// Whether every generation after `from` up to `to` was seen and left our tables as
    /// they were (or was ours).
    pub fn unchanged_between(&self, from: u32, to: u32) -> bool {
        if from == to {
            return true;
        }
        let Some((start, end)) = self.run else {
            return false;
        };
        let at = |g: u32| g.wrapping_sub(start);
        at(from) <= at(to) && at(to) <= at(end)
    }
}

/// `run` with `generation` committed after it: restarted there when the batch `changed`
/// what the run is about, or when generations went by unseen.
fn continued(run: Option<(u32, u32)>, changed: bool, generation: u32) -> (u32, u32) {
    match run {
        _ if changed => (generation, generation),
        Some((from, to)) if next_generation(to) == generation => (from, generation),
        _ => (previous(generation), generation),
    }
}

/// Whether generation `a` came after `b` (within half the counter's range).
fn later(a: u32, b: u32) -> bool {
    a != b && a.wrapping_sub(b) < 1 << 31
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: u32 = 7;
    const THEIRS: u32 = 9;

    fn seen() -> Generations {
        let mut g = Generations::default();
        g.own_port(Some(OURS));
        g
    }

    #[test]
    fn commits_elsewhere_and_our_own_keep_the_kernel_unchanged_and_one_to_our_table_does_not() {
        let mut g = seen();
        // Someone else's table.
        assert!(!g.announced(THEIRS, false));
        g.committed(11);
        // Ours.
        assert!(!g.announced(OURS, true));
        g.committed(12);
        assert!(g.unchanged_between(10, 12));
        assert!(g.unchanged_between(11, 12));
        assert!(!g.unchanged_between(9, 12), "generation 10 was not seen");
        assert!(
            !g.unchanged_between(10, 13),
            "generation 13 was not seen yet"
        );
        // Someone else changes our table.
        assert!(g.announced(THEIRS, true));
        g.committed(13);
        assert!(!g.unchanged_between(12, 13));
        assert!(!g.unchanged_between(10, 13));
        // Later commits elsewhere are fine again, from the changed generation on.
        g.committed(14);
        assert!(g.unchanged_between(13, 14));
        assert!(!g.unchanged_between(12, 14));
    }

    #[test]
    fn a_generation_never_seen_breaks_the_run() {
        let mut g = seen();
        g.committed(20);
        g.committed(21);
        // 22 went by unseen (the listener was out of the group).
        g.committed(23);
        assert!(g.unchanged_between(22, 23));
        assert!(!g.unchanged_between(20, 23));
        assert!(!Generations::default().unchanged_between(1, 2));
        assert!(Generations::default().unchanged_between(5, 5));
    }

    #[test]
    fn lost_notifications_make_every_batch_up_to_the_generation_after_the_loss_a_change() {
        let mut g = seen();
        g.committed(30);
        // Batch 32 lost notifications; the loss is reported before 31, queued intact, and
        // the kernel was at 32 when asked.
        g.lost(Some(32));
        g.committed(31);
        g.committed(32);
        assert!(!g.unchanged_between(30, 32));
        assert!(!g.unchanged_between(31, 32));
        g.committed(33);
        assert!(g.unchanged_between(32, 33));
        // Without the generation, nothing counts until one is asked.
        g.lost(None);
        g.committed(34);
        assert!(!g.unchanged_between(33, 34));
        g.back_at(34);
        g.committed(35);
        assert!(g.unchanged_between(34, 35));
    }

    #[test]
    fn a_listener_that_just_joined_doubts_what_was_committed_before_it_asked() {
        let mut g = seen();
        // Joined while batch 51 was being announced: only its end is seen.
        g.partly_seen_through(Some(51));
        assert!(!g.announced(THEIRS, false));
        g.committed(51);
        assert!(!g.unchanged_between(50, 51));
        g.committed(52);
        assert!(g.unchanged_between(51, 52));
    }

    #[test]
    fn notifications_from_our_old_port_are_someone_elses() {
        let mut g = seen();
        g.own_port(None);
        assert!(g.announced(OURS, true));
    }

    #[test]
    fn batches_seen_across_a_return_to_the_group_count_as_changes() {
        let mut g = seen();
        g.committed(40);
        g.leaving();
        // Announced while the listener was coming back: maybe only its end was seen.
        g.committed(42);
        assert!(!g.unchanged_between(41, 42));
        g.back_at(43);
        // Committed before the listener was back, handled after.
        g.committed(43);
        assert!(!g.unchanged_between(42, 43));
        // Wholly after.
        g.committed(44);
        assert!(g.unchanged_between(43, 44));
    }

    fn key(k: &str) -> TouchedKey {
        (IpFamily::V4, "cluster-ips".into(), k.into())
    }

    fn touches(keys: Vec<TouchedKey>, to: u32) -> Touches {
        Touches {
            keys,
            rules: false,
            to,
        }
    }

    #[test]
    fn batches_of_theirs_that_touch_chains_or_rules_are_kept_as_such() {
        let mut g = seen();
        g.committed(110);
        // A chain added and deleted in our table, in one batch.
        assert!(g.announced_rules(THEIRS));
        assert!(g.announced_rules(THEIRS));
        g.committed(111);
        assert!(!g.unchanged_between(110, 111));
        let rules = |keys, to| Touches {
            keys,
            rules: true,
            to,
        };
        assert_eq!(g.touched_since(110), Some(rules(vec![], 111)));
        // Elements in a later batch: both are named; from 111 on, only the elements.
        g.announced_elements(THEIRS, vec![key("a")]);
        g.committed(112);
        assert_eq!(g.touched_since(110), Some(rules(vec![key("a")], 112)));
        assert_eq!(g.touched_since(111), Some(touches(vec![key("a")], 112)));
        // Ours are not theirs.
        assert!(!g.announced_rules(OURS));
        g.committed(113);
        assert_eq!(g.touched_since(112), Some(touches(vec![], 113)));
        // Checked and found as committed: from 110 on, nothing changed.
        g.verified(110, 113);
        assert!(g.unchanged_between(110, 113));
        assert_eq!(g.touched_since(110), Some(touches(vec![], 113)));
        assert_eq!(g.touched_keys, 0);
        // A batch of rules and anything else is a change of any kind.
        g.announced_rules(THEIRS);
        g.announced(THEIRS, true);
        g.committed(114);
        assert_eq!(g.touched_since(113), None);
        // Batches of rules count against the cap one each.
        for generation in 115..=115 + MAX_TOUCHED as u32 {
            g.announced_rules(THEIRS);
            g.committed(generation);
        }
        assert_eq!(g.touched_since(114), None, "the oldest is forgotten");
        assert!(g.touched_since(115).is_some_and(|t| t.rules));
    }

    #[test]
    fn batches_of_theirs_that_only_touch_elements_name_them_for_lookups() {
        let mut g = seen();
        g.committed(60);
        assert!(g.announced_elements(THEIRS, vec![key("192.0.2.1")]));
        g.committed(61);
        assert!(!g.unchanged_between(60, 61));
        assert_eq!(
            g.touched_since(60),
            Some(touches(vec![key("192.0.2.1")], 61))
        );
        // Ours (its keys are not kept) and commits elsewhere continue it.
        assert!(!g.announced_elements(OURS, vec![key("10.96.0.1")]));
        g.committed(62);
        assert_eq!(
            g.touched_since(60),
            Some(touches(vec![key("192.0.2.1")], 62))
        );
        assert_eq!(g.touched_since(61), Some(touches(vec![], 62)));
        assert_eq!(g.touched_since(58), None, "generation 59 was not seen");
        // Looked up and found as committed: from 60 on, nothing changed.
        g.verified(60, 62);
        assert!(g.unchanged_between(60, 62));
        assert_eq!(g.touched_since(60), Some(touches(vec![], 62)));
        // Anything else of theirs to our table starts over.
        assert!(g.announced(THEIRS, true));
        g.committed(63);
        assert_eq!(g.touched_since(62), None);
        assert_eq!(g.touched_since(63), Some(touches(vec![], 63)));
        // So does a batch of elements and more.
        g.announced_elements(THEIRS, vec![key("a")]);
        g.announced(THEIRS, true);
        g.committed(64);
        assert_eq!(g.touched_since(63), None);
    }

    #[test]
    fn a_verification_covers_only_the_batches_it_looked_at() {
        let mut g = seen();
        g.committed(70);
        g.announced_elements(THEIRS, vec![key("a")]);
        g.committed(71);
        g.announced_elements(THEIRS, vec![key("b")]);
        g.committed(72);
        assert_eq!(
            g.touched_since(70),
            Some(touches(vec![key("a"), key("b")], 72))
        );
        // A check that took the keys up to 71 only.
        g.verified(70, 71);
        assert!(!g.unchanged_between(70, 72));
        assert_eq!(g.touched_since(70), Some(touches(vec![key("b")], 72)));
        g.verified(70, 72);
        assert!(g.unchanged_between(70, 72));
    }

    #[test]
    fn too_many_keys_leave_the_oldest_batches_to_a_read_and_lost_ones_all() {
        let mut g = seen();
        g.committed(80);
        let many = (0..MAX_TOUCHED).map(|i| key(&i.to_string())).collect();
        g.announced_elements(THEIRS, many);
        g.committed(81);
        assert_eq!(g.touched_since(80).map(|t| t.keys.len()), Some(MAX_TOUCHED));
        g.announced_elements(THEIRS, vec![key("one more")]);
        g.committed(82);
        assert_eq!(g.touched_since(80), None);
        assert_eq!(
            g.touched_since(81),
            Some(touches(vec![key("one more")], 82))
        );
        // Lost notifications may have named anything.
        g.lost(Some(83));
        g.announced_elements(THEIRS, vec![key("c")]);
        g.committed(83);
        assert_eq!(g.touched_since(82), None);
    }

    #[test]
    fn what_the_listener_may_have_missed_is_never_vouched_for_by_keys() {
        for miss in [
            Generations::leaving as fn(&mut Generations),
            |g| g.lost(Some(92)),
            |g| g.lost(None),
            |g| g.partly_seen_through(Some(92)),
        ] {
            let mut g = seen();
            g.committed(90);
            g.announced_elements(THEIRS, vec![key("a")]);
            g.committed(91);
            assert_eq!(g.touched_since(90), Some(touches(vec![key("a")], 91)));
            // Until the next batch's end is seen, and after it, nothing from before counts.
            miss(&mut g);
            assert_eq!(g.touched_since(90), None);
            assert_eq!(g.touched_since(91), None);
            g.back_at(92);
            g.committed(92);
            assert_eq!(g.touched_since(90), None);
        }
    }

    #[test]
    fn a_batch_naming_more_keys_than_are_kept_is_a_change_of_any_kind() {
        let mut g = seen();
        g.committed(100);
        for chunk in 0..=MAX_TOUCHED / 1000 {
            let keys = (0..1000).map(|i| key(&format!("{chunk}.{i}"))).collect();
            g.announced_elements(THEIRS, keys);
        }
        assert!(g.open_keys.is_empty(), "not held past the cap");
        g.committed(101);
        assert_eq!(g.touched_since(100), None);
        assert_eq!(g.touched_since(101), Some(touches(vec![], 101)));
    }

    #[test]
    fn the_counter_wraps_past_zero() {
        let mut g = seen();
        g.committed(u32::MAX - 1);
        g.committed(u32::MAX);
        g.committed(1);
        assert!(g.unchanged_between(u32::MAX - 2, 1));
        assert!(g.unchanged_between(u32::MAX, 1));
        assert!(!g.unchanged_between(u32::MAX - 3, 1));
        assert!(later(1, u32::MAX));
        assert!(!later(u32::MAX, 1));
    }
}
