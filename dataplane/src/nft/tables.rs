//! The contents of Switchyard's nftables tables as plain data: what we want, or what the kernel holds.
//!
//! Elements go in and come out as nft's canonical text (`172.30.0.41 . tcp . 80`) and are
//! held in a compact form of it ([`super::packed`]), so a state rendered from a snapshot and a
//! state read back from the kernel compare directly. Chains are compared
//! by a fingerprint carried in every rule's comment plus the rule count, because nft 1.0.6
//! cannot give chain comments back through JSON and rule text is not round-trippable.

use super::elements::Elements;
use crate::model::IpFamily;
use std::collections::BTreeMap;

/// The name of our table in both families.
pub const TABLE: &str = "switchyard";

/// Table family keyword for nft.
pub fn family_name(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

/// A named set or map.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Set {
    /// A map (`add map`) rather than a set.
    pub map: bool,
    /// Declaration inside the braces, e.g. `type ipv4_addr; flags interval;`.
    pub decl: String,
    /// Fingerprint of the declaration, stored in the set's comment.
    pub fingerprint: String,
    /// Key to value (`None` for a plain set).
    pub elements: Elements,
    /// Read back without its elements (too many to dump: see `NftBackend`'s read limit):
    /// the kernel holds some, which is not known. A sync flushes such a set and adds
    /// every element it wants.
    pub unread: bool,
    /// The size it is declared with, if any (see [`super::sizing`]).
    pub size: Option<u32>,
}

impl Set {
    /// Declared with the interval flag: its elements are ranges, not single keys.
    pub fn interval(&self) -> bool {
        self.decl
            .split(';')
            .any(|part| part.trim().starts_with("flags") && part.contains("interval"))
    }
}

/// A chain and its rules.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Chain {
    /// Base-chain declaration (`type nat hook prerouting priority -100; policy accept;`).
    pub hook: Option<String>,
    /// Rule text without the fingerprint comment. Empty strings when read back from the kernel.
    pub rules: Vec<String>,
    /// Fingerprint of hook and rules, carried in the first rule's comment.
    pub fingerprint: String,
}

impl Chain {
    /// A chain whose fingerprint is computed from its content.
    pub fn new(hook: Option<String>, rules: Vec<String>) -> Chain {
        let mut text = hook.clone().unwrap_or_default();
        for r in &rules {
            text.push('\n');
            text.push_str(r);
        }
        Chain {
            hook,
            rules,
            fingerprint: fingerprint(&text),
        }
    }

    /// One more rule read back, with `comment`: the first one's is the chain's fingerprint,
    /// and a later one with another (not ours, or not written with this chain) leaves the
    /// chain matching nothing we write.
    pub fn read_rule(&mut self, comment: &str) {
        self.push_rule(String::new(), comment);
    }

    /// [`Self::read_rule`], keeping the rule's `text`.
    pub fn push_rule(&mut self, text: String, comment: &str) {
        if self.rules.is_empty() {
            self.fingerprint = comment.to_string();
        } else if comment != self.fingerprint {
            self.fingerprint = MIXED.to_string();
        }
        self.rules.push(text);
    }

    /// Whether `other` (typically read from the kernel) holds the same rules, under the same
    /// hook, priority and policy. Rules read back carry no text: their count and the
    /// fingerprint each carries stand for them.
    pub fn same_as(&self, other: &Chain) -> bool {
        self.fingerprint == other.fingerprint
            && self.rules.len() == other.rules.len()
            && self.hook == other.hook
    }
}

/// One family's table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Table {
    pub sets: BTreeMap<String, Set>,
    pub chains: BTreeMap<String, Chain>,
}

impl Table {
    pub fn element_count(&self) -> usize {
        self.sets.values().map(|s| s.elements.len()).sum()
    }
}

/// Both families' tables; a missing entry means the table does not exist.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ruleset {
    pub tables: BTreeMap<IpFamily, Table>,
}

impl Ruleset {
    pub fn table(&self, family: IpFamily) -> Option<&Table> {
        self.tables.get(&family)
    }
}

/// The fingerprint of a chain read back whose rules carry different ones: no chain we write
/// has it.
const MIXED: &str = "rules of more than one fingerprint";

/// A stable 64-bit FNV-1a fingerprint, printed as `sy:<16 hex digits>`.
///
/// std's hasher is not guaranteed stable across releases, and these values live in the kernel
/// across upgrades of the binary.
pub fn fingerprint(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("sy:{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_is_stable_and_content_sensitive() {
        assert_eq!(fingerprint(""), "sy:cbf29ce484222325");
        assert_ne!(fingerprint("a"), fingerprint("b"));
        let a = Chain::new(None, vec!["jump x".into()]);
        let b = Chain::new(None, vec!["jump y".into()]);
        assert!(!a.same_as(&b));
        assert!(a.same_as(&a.clone()));
        let base = |policy: &str| {
            let hook = format!("type nat hook prerouting priority -100; policy {policy};");
            Chain::new(Some(hook), vec!["jump x".into()])
        };
        assert!(base("accept").same_as(&base("accept")));
        assert!(!base("accept").same_as(&base("drop")), "a policy changed");
    }
}
