//! Backend slots: which endpoint a front end's slot `i` holds. Assigned stably against what
//! the slots held before (an endpoint keeps its slot while it stays; a removed one's slot is
//! refilled by the last), and read and built in the compact form the element tree holds.

use super::packed;
use super::tables::Set;
use crate::model::Endpoint;
use std::collections::BTreeSet;
use std::ops::Range;

/// Slot assignment that keeps endpoints where they were.
///
/// `previous[i]` is what slot `i` held; the result has one slot per distinct wanted value.
pub fn assign_slots<T: Ord + Clone>(previous: &[Option<T>], wanted: &[T]) -> Vec<T> {
    let wanted_set: BTreeSet<&T> = wanted.iter().collect();
    let n = wanted_set.len();
    let mut slots: Vec<Option<T>> = vec![None; n];
    let mut placed: BTreeSet<&T> = BTreeSet::new();
    for (i, prev) in previous.iter().enumerate().take(n) {
        if let Some(v) = prev {
            if wanted_set.contains(v) && !placed.contains(v) {
                slots[i] = Some(v.clone());
                placed.insert(v);
            }
        }
    }
    let mut fresh: BTreeSet<&T> = BTreeSet::new();
    let mut rest = wanted
        .iter()
        .filter(|v| !placed.contains(v) && fresh.insert(*v));
    // Exactly n distinct values fill exactly n slots, so `rest` never runs dry.
    slots
        .into_iter()
        .filter_map(|s| s.or_else(|| rest.next().cloned()))
        .collect()
}

/// Previous slot contents of one front end, read from a backends map: under the front end's
/// key `front` in its compact form, values in theirs. Slots are compared and written in the
/// compact form, not as text: formatting and parsing each slot's key and value was about a
/// quarter of laying a service out again (perf, `agent_e2e` at 10k).
///
/// The values are copied end to end into `buf`, and each slot's is a range of it.
pub fn previous_slots(
    prev: Option<&Set>,
    front: &[u8],
    buf: &mut Vec<u8>,
) -> Vec<Option<Range<usize>>> {
    let Some(set) = prev else {
        return Vec::new();
    };
    let mut out: Vec<Option<Range<usize>>> = Vec::new();
    for (key, value) in set.elements.with_packed_prefix(front) {
        let slot = packed::as_number(&key.bytes()[front.len()..]);
        if let (Some(i), Some(v)) = (slot, value) {
            let i = usize::from(i);
            if out.len() <= i {
                out.resize(i + 1, None);
            }
            let start = buf.len();
            buf.extend_from_slice(v.bytes());
            out[i] = Some(start..buf.len());
        }
    }
    out
}

/// The backend slot values, `address . port`, of `eps` in their compact form, end to end in
/// `buf`: where each ends.
pub fn backend_values(eps: &[&Endpoint], buf: &mut Vec<u8>) -> Vec<usize> {
    eps.iter()
        .map(|e| {
            packed::push_addr(e.ip, buf);
            packed::push_number(usize::from(e.port), buf);
            buf.len()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn slots_keep_their_endpoints_and_holes_are_refilled() {
        let prev = vec![Some("a".into()), Some("b".into()), Some("c".into())];
        // b leaves: c, the last, moves into b's slot; a stays.
        assert_eq!(assign_slots(&prev, &s(&["a", "c"])), s(&["a", "c"]));
        // d joins: appended, nothing moves.
        assert_eq!(
            assign_slots(&prev, &s(&["a", "b", "c", "d"])),
            s(&["a", "b", "c", "d"])
        );
        // a replaced by z: z takes slot 0.
        assert_eq!(
            assign_slots(&prev, &s(&["b", "c", "z"])),
            s(&["z", "b", "c"])
        );
        assert_eq!(assign_slots(&[], &s(&["x", "y"])), s(&["x", "y"]));
        // The same backend twice is one slot.
        assert_eq!(assign_slots(&[], &s(&["x", "x", "y"])), s(&["x", "y"]));
        assert_eq!(assign_slots(&prev, &s(&["c", "c"])), s(&["c"]));
    }
}
