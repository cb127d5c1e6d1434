//! The size each large set and map is declared with: room the kernel allocates up front.
//!
//! A set declared without a size is a resizable hash in the kernel (`nft_rhash`), grown by
//! doubling as elements go in. Loading 1.5M elements into one map took the kernel 3.7 s
//! unsized and 0.9 s declared with a size (`strace -T` on nft's `sendmsg`, this machine; 0.9
//! and 0.3 s at 500k), and a profile of the agent starting at 100k services x 10 found 29% of
//! its samples in `rhashtable_insert_slow`. With a size the kernel can pick its fixed hash, its
//! buckets allocated at once. The size is also a limit: the kernel refuses an element past it
//! (ENFILE), and it cannot change on a live set. So a set gets room for half as much again as
//! it holds and keeps its size while it fits; a sync that outgrows it declares it anew, which
//! replaces the table in that sync's one transaction ([`super::diff::diff`] on a changed
//! declaration). A replaced table loses what the packet path remembered (session affinity),
//! so a size never shrinks: a set emptied by far keeps its buckets (8 bytes each, 4/3 of its
//! size) until the table is made anew. Sets small enough for their growth not to matter stay
//! unsized, as the layout wrote them.

use super::tables::{fingerprint, Ruleset, Set};

/// Sets holding at most this many elements are declared without a size.
pub const UNSIZED_UP_TO: usize = 4096;

/// The size to declare for a set holding `count` elements, declared now with `current`.
pub fn size_for(current: Option<u32>, count: usize) -> Option<u32> {
    match current {
        Some(size) if count <= size as usize => Some(size),
        None if count <= UNSIZED_UP_TO => None,
        _ => Some(roomy(count)),
    }
}

/// Room for `count` and half as much again, as 3 x 2^k: the kernel gives a fixed hash of size s
/// `roundup_pow_of_two(s * 4 / 3)` buckets, which for 3 x 2^k is exactly 4 x 2^k, so no
/// bucket memory is rounded away.
fn roomy(count: usize) -> u32 {
    let want = count.saturating_add(count / 2);
    let mut size: u64 = 3;
    while size < want as u64 {
        size *= 2;
    }
    u32::try_from(size).unwrap_or(u32::MAX)
}

/// Whether a set's size is ours to choose: a plain hash, no flags (intervals, timeouts and
/// the packet path's dynamic sets keep what the layout declares).
fn sizable(set: &Set) -> bool {
    set.decl
        .split(';')
        .map(str::trim)
        .all(|clause| !clause.starts_with("flags") && !clause.starts_with("size"))
}

/// Declares the sizes of `desired`'s sets, laid out fresh, against what `previous` declared.
pub fn fit(previous: &Ruleset, desired: &mut Ruleset) {
    for (family, table) in desired.tables.iter_mut() {
        for (name, set) in table.sets.iter_mut() {
            if !sizable(set) {
                continue;
            }
            let current = previous
                .table(*family)
                .and_then(|t| t.sets.get(name))
                .and_then(|s| s.size);
            set.size = size_for(current, set.elements.len());
            if let Some(size) = set.size {
                set.decl = format!("{} size {size};", set.decl);
                set.fingerprint = fingerprint(&set.decl);
            }
        }
    }
}

/// Whether an in-place update left a set holding more than its declared size: the kernel
/// would refuse the commit, so the sync must lay the table out anew.
pub fn outgrown(ruleset: &Ruleset) -> bool {
    ruleset.tables.values().any(|t| {
        t.sets
            .values()
            .any(|s| s.size.is_some_and(|size| s.elements.len() > size as usize))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::IpFamily;

    #[test]
    fn small_sets_stay_unsized_and_large_ones_get_room_to_grow_by_half() {
        assert_eq!(size_for(None, 0), None);
        assert_eq!(size_for(None, UNSIZED_UP_TO), None);
        assert_eq!(size_for(None, UNSIZED_UP_TO + 1), Some(12_288));
        assert_eq!(size_for(None, 8192), Some(12_288));
        assert_eq!(size_for(None, 8193), Some(24_576));
        assert_eq!(size_for(None, 1_000_000), Some(3 << 19));
        assert_eq!(size_for(None, 1_600_000), Some(3 << 20));
    }

    #[test]
    fn a_size_holds_until_the_set_outgrows_it_and_never_shrinks() {
        let s = Some(12_288);
        assert_eq!(size_for(s, 12_288), s);
        assert_eq!(size_for(s, 12_289), Some(24_576));
        assert_eq!(size_for(s, 0), s);
        let big = Some(3 << 20);
        assert_eq!(size_for(big, 10), big);
    }

    fn ruleset(decl: &str, count: usize, size: Option<u32>) -> Ruleset {
        let mut set = Set {
            decl: decl.to_string(),
            fingerprint: fingerprint(decl),
            size,
            ..Set::default()
        };
        for i in 0..count {
            set.elements
                .insert(&format!("10.0.{}.{}", i / 256, i % 256), None);
        }
        let mut rs = Ruleset::default();
        rs.tables
            .entry(IpFamily::V4)
            .or_default()
            .sets
            .insert("s".to_string(), set);
        rs
    }

    fn only(rs: &Ruleset) -> &Set {
        &rs.tables[&IpFamily::V4].sets["s"]
    }

    #[test]
    fn fit_declares_the_size_in_the_declaration_and_its_fingerprint() {
        let mut desired = ruleset("type ipv4_addr;", 5000, None);
        fit(&Ruleset::default(), &mut desired);
        let s = only(&desired);
        assert_eq!(s.size, Some(12_288));
        assert_eq!(s.decl, "type ipv4_addr; size 12288;");
        assert_eq!(s.fingerprint, fingerprint("type ipv4_addr; size 12288;"));
        // Kept from what was declared before, though fresh it would get less room.
        let previous = ruleset("type ipv4_addr; size 24576;", 0, Some(24_576));
        let mut desired = ruleset("type ipv4_addr;", 5000, None);
        fit(&previous, &mut desired);
        assert_eq!(only(&desired).size, Some(24_576));
    }

    #[test]
    fn flagged_sets_keep_their_declaration() {
        for decl in [
            "type ipv4_addr; flags interval;",
            "type ipv4_addr . inet_service : ipv4_addr . inet_service; size 262144; flags dynamic,timeout; timeout 3h;",
        ] {
            let mut desired = ruleset(decl, 5000, None);
            fit(&Ruleset::default(), &mut desired);
            assert_eq!(only(&desired).decl, decl);
            assert_eq!(only(&desired).size, None);
        }
    }

    #[test]
    fn a_set_past_its_size_is_outgrown() {
        assert!(!outgrown(&ruleset("type ipv4_addr;", 5000, Some(5000))));
        assert!(outgrown(&ruleset("type ipv4_addr;", 5001, Some(5000))));
        assert!(!outgrown(&ruleset("type ipv4_addr;", 5001, None)));
    }
}
