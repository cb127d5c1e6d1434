//! A transaction: the ordered operations that turn one ruleset into another, each rule and
//! element in nft's text syntax.
//!
//! Builders never fail; `wire` encodes the operations as one netlink batch, which the kernel
//! validates and commits atomically. The text is also what `render` prints and what the
//! tests feed nft (whose JSON input mishandles concatenated map values, see
//! ARCHITECTURE.md).

use super::elements::Elements;
use super::ownership::Touched;
use super::skeleton::BACKEND_MAPS;
use super::tables::{family_name, Chain, Ruleset, Set, Table, TABLE};
use crate::backend::TxStats;
use crate::model::IpFamily;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};

/// Elements per `add element` / `delete element` statement; keeps nft's parser and memory tame.
const ELEMENT_CHUNK: usize = 1000;

/// One operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    AddTable(IpFamily),
    DeleteTable(IpFamily),
    AddSet {
        family: IpFamily,
        name: String,
        set: Set,
    },
    AddChain {
        family: IpFamily,
        name: String,
        hook: Option<String>,
    },
    FlushChain {
        family: IpFamily,
        name: String,
    },
    AddRule {
        family: IpFamily,
        chain: String,
        rule: String,
    },
    DeleteChain {
        family: IpFamily,
        name: String,
    },
    AddElements {
        family: IpFamily,
        set: String,
        /// All of a set's elements share the desired ruleset's tree (see [`Elements`]).
        elements: Elements,
    },
    DeleteElements {
        family: IpFamily,
        set: String,
        keys: Vec<String>,
    },
    /// Every element of a set out.
    FlushSet {
        family: IpFamily,
        set: String,
    },
}

impl Op {
    /// The family whose table the operation touches.
    pub fn family(&self) -> IpFamily {
        match self {
            Op::AddTable(f) | Op::DeleteTable(f) => *f,
            Op::AddSet { family, .. }
            | Op::AddChain { family, .. }
            | Op::FlushChain { family, .. }
            | Op::AddRule { family, .. }
            | Op::DeleteChain { family, .. }
            | Op::AddElements { family, .. }
            | Op::DeleteElements { family, .. }
            | Op::FlushSet { family, .. } => *family,
        }
    }
}

/// An ordered list of operations, applied atomically.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transaction {
    pub ops: Vec<Op>,
}

impl Transaction {
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The families whose tables it touches.
    pub fn families(&self) -> BTreeSet<IpFamily> {
        self.ops.iter().map(Op::family).collect()
    }

    /// The operations on one family's table, in order.
    pub fn only(&self, family: IpFamily) -> Transaction {
        Transaction {
            ops: self
                .ops
                .iter()
                .filter(|op| op.family() == family)
                .cloned()
                .collect(),
        }
    }

    pub fn stats(&self) -> TxStats {
        let mut s = TxStats::default();
        for op in &self.ops {
            match op {
                Op::AddTable(_) => {}
                Op::DeleteTable(_) => s.tables_deleted += 1,
                Op::AddSet { set, .. } => s.elements_added += set.elements.len(),
                Op::AddChain { .. } | Op::FlushChain { .. } => {}
                Op::AddRule { .. } => s.rules_written += 1,
                Op::DeleteChain { .. } => s.chains_deleted += 1,
                Op::AddElements { elements, .. } => s.elements_added += elements.len(),
                Op::DeleteElements { keys, .. } => s.elements_deleted += keys.len(),
                // How many it held is not known.
                Op::FlushSet { .. } => {}
            }
        }
        // A chain counts as written when it got rules in this transaction.
        let mut written: Vec<(&IpFamily, &String)> = self
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::AddRule { family, chain, .. } => Some((family, chain)),
                _ => None,
            })
            .collect();
        written.dedup();
        s.chains_written = written.len();
        s
    }

    /// The nft script for `nft -f -`.
    ///
    /// nft 1.0.6 gives the first rule of a run that uses a map whose `typeof` value says
    /// `tcp dport` a hidden `meta l4proto tcp` match (it evaluates the map's value type in
    /// that rule's context), so a UDP service behind that rule would never be DNATed. A
    /// copy of that rule goes first, into a chain created and deleted in the same
    /// transaction, and takes the stray match with it.
    pub fn to_nft(&self) -> String {
        let mut out = String::new();
        let mut anchored: BTreeSet<(IpFamily, &str)> = BTreeSet::new();
        let mut anchor_chains: BTreeSet<IpFamily> = BTreeSet::new();
        for op in &self.ops {
            if let Op::AddRule { family, rule, .. } = op {
                for map in maps_used(rule) {
                    if !anchored.insert((*family, map)) {
                        continue;
                    }
                    let f = family_name(*family);
                    if anchor_chains.insert(*family) {
                        let _ = writeln!(out, "add chain {f} {TABLE} {ANCHOR_CHAIN}");
                    }
                    let _ = writeln!(out, "add rule {f} {TABLE} {ANCHOR_CHAIN} {rule}");
                }
            }
            write_op(&mut out, op);
        }
        for family in anchor_chains {
            let f = family_name(family);
            let _ = writeln!(out, "flush chain {f} {TABLE} {ANCHOR_CHAIN}");
            let _ = writeln!(out, "delete chain {f} {TABLE} {ANCHOR_CHAIN}");
        }
        out
    }
}

/// The chain that lives only inside one transaction (see [`Transaction::to_nft`]).
const ANCHOR_CHAIN: &str = "tx-anchor";

/// The maps with a `tcp dport` value type that `rule` reads (`... map @name`).
fn maps_used(rule: &str) -> impl Iterator<Item = &'static str> + '_ {
    BACKEND_MAPS.into_iter().filter(move |m| {
        rule.split_whitespace()
            .any(|w| w.strip_prefix('@') == Some(m))
    })
}

fn write_elements(
    out: &mut String,
    verb: &str,
    family: IpFamily,
    set: &str,
    items: impl Iterator<Item = String>,
) {
    let items: Vec<String> = items.collect();
    for chunk in items.chunks(ELEMENT_CHUNK) {
        let _ = writeln!(
            out,
            "{verb} element {} {TABLE} {set} {{\n\t{}\n}}",
            family_name(family),
            chunk.join(",\n\t")
        );
    }
}

fn element_text(key: impl fmt::Display, value: Option<impl fmt::Display>) -> String {
    match value {
        Some(v) => format!("{key} : {v}"),
        None => key.to_string(),
    }
}

fn write_op(out: &mut String, op: &Op) {
    match op {
        Op::AddTable(f) => {
            let _ = writeln!(out, "add table {} {TABLE}", family_name(*f));
        }
        Op::DeleteTable(f) => {
            let _ = writeln!(out, "delete table {} {TABLE}", family_name(*f));
        }
        Op::AddSet { family, name, set } => {
            let kind = if set.map { "map" } else { "set" };
            let _ = writeln!(
                out,
                "add {kind} {} {TABLE} {name} {{ {} comment \"{}\"; }}",
                family_name(*family),
                set.decl,
                set.fingerprint
            );
            write_elements(
                out,
                "add",
                *family,
                name,
                set.elements.iter().map(|(k, v)| element_text(k, v)),
            );
        }
        Op::AddChain { family, name, hook } => match hook {
            Some(h) => {
                let _ = writeln!(
                    out,
                    "add chain {} {TABLE} {name} {{ {h} }}",
                    family_name(*family)
                );
            }
            None => {
                let _ = writeln!(out, "add chain {} {TABLE} {name}", family_name(*family));
            }
        },
        Op::FlushChain { family, name } => {
            let _ = writeln!(out, "flush chain {} {TABLE} {name}", family_name(*family));
        }
        Op::AddRule {
            family,
            chain,
            rule,
        } => {
            let _ = writeln!(
                out,
                "add rule {} {TABLE} {chain} {rule}",
                family_name(*family)
            );
        }
        Op::DeleteChain { family, name } => {
            let _ = writeln!(out, "delete chain {} {TABLE} {name}", family_name(*family));
        }
        Op::AddElements {
            family,
            set,
            elements,
        } => write_elements(
            out,
            "add",
            *family,
            set,
            elements.iter().map(|(k, v)| element_text(k, v)),
        ),
        Op::DeleteElements { family, set, keys } => {
            write_elements(out, "delete", *family, set, keys.iter().cloned())
        }
        Op::FlushSet { family, set } => {
            let _ = writeln!(out, "flush set {} {TABLE} {set}", family_name(*family));
        }
    }
}

/// The rules of a chain as written: each carries the chain's fingerprint, so that a rule of
/// someone else's among ours (one replaced, or one deleted and another added) shows when
/// the chain is read back ([`super::tables::Chain::read_rule`]).
pub fn rules_with_fingerprint(chain: &Chain) -> Vec<String> {
    chain
        .rules
        .iter()
        .map(|r| format!("{r} comment \"{}\"", chain.fingerprint))
        .collect()
}

/// Whether `old` can be updated in place to `new`: same sets and same base chain hooks.
fn compatible(old: &Table, new: &Table) -> bool {
    new.sets.iter().all(|(name, s)| {
        old.sets
            .get(name)
            .is_none_or(|o| o.fingerprint == s.fingerprint && o.map == s.map)
    }) && new.chains.iter().all(|(name, c)| {
        old.chains
            .get(name)
            .is_none_or(|o| o.hook.is_some() == c.hook.is_some())
    }) && old.sets.keys().all(|k| new.sets.contains_key(k))
}

fn declaration(set: &Set) -> Set {
    Set {
        elements: Default::default(),
        ..set.clone()
    }
}

fn create_table(tx: &mut Transaction, family: IpFamily, new: &Table) {
    tx.ops.push(Op::AddTable(family));
    for (name, set) in &new.sets {
        tx.ops.push(Op::AddSet {
            family,
            name: name.clone(),
            set: declaration(set),
        });
    }
    for (name, chain) in &new.chains {
        tx.ops.push(Op::AddChain {
            family,
            name: name.clone(),
            hook: chain.hook.clone(),
        });
    }
    for (name, chain) in &new.chains {
        for rule in rules_with_fingerprint(chain) {
            tx.ops.push(Op::AddRule {
                family,
                chain: name.clone(),
                rule,
            });
        }
    }
    // Elements last: verdict-map elements name chains that must exist first.
    for (name, set) in &new.sets {
        tx.ops.extend(every_element(family, name, set));
    }
}

/// The addition of every element of `set`; none for an empty one.
fn every_element(family: IpFamily, name: &str, set: &Set) -> Option<Op> {
    (!set.elements.is_empty()).then(|| Op::AddElements {
        family,
        set: name.to_string(),
        elements: set.elements.clone(),
    })
}

/// The rules of each named chain of `table`, after its flush or creation.
fn write_rules(tx: &mut Transaction, family: IpFamily, table: &Table, names: &[&String]) {
    for name in names {
        if let Some(chain) = table.chains.get(*name) {
            for rule in rules_with_fingerprint(chain) {
                tx.ops.push(Op::AddRule {
                    family,
                    chain: (*name).clone(),
                    rule,
                });
            }
        }
    }
}

/// Empty a chain, then delete it.
fn remove_chain(tx: &mut Transaction, family: IpFamily, name: &str) {
    tx.ops.push(Op::FlushChain {
        family,
        name: name.to_string(),
    });
    tx.ops.push(Op::DeleteChain {
        family,
        name: name.to_string(),
    });
}

fn update_table(tx: &mut Transaction, family: IpFamily, old: &Table, new: &Table, full: bool) {
    let mut changed_chains = Vec::new();
    for (name, set) in &new.sets {
        if !old.sets.contains_key(name) {
            tx.ops.push(Op::AddSet {
                family,
                name: name.clone(),
                set: declaration(set),
            });
        }
    }
    for (name, chain) in &new.chains {
        match old.chains.get(name) {
            None => {
                tx.ops.push(Op::AddChain {
                    family,
                    name: name.clone(),
                    hook: chain.hook.clone(),
                });
                changed_chains.push(name);
            }
            // A base chain whose hook, priority or policy someone changed (a policy of
            // drop would drop what no rule accepts): made anew, since a flush keeps them
            // and the kernel refuses another hook or priority for a chain. Nothing jumps
            // to a base chain.
            Some(o) if o.hook.is_some() && chain.hook.is_some() && o.hook != chain.hook => {
                remove_chain(tx, family, name);
                tx.ops.push(Op::AddChain {
                    family,
                    name: name.clone(),
                    hook: chain.hook.clone(),
                });
                changed_chains.push(name);
            }
            Some(o) if full || !chain.same_as(o) => {
                tx.ops.push(Op::FlushChain {
                    family,
                    name: name.clone(),
                });
                changed_chains.push(name);
            }
            Some(_) => {}
        }
    }
    write_rules(tx, family, new, &changed_chains);
    // Deletions first, so a changed map value is delete + add within the same commit.
    let mut adds = Vec::new();
    let none = Set::default();
    for (name, set) in &new.sets {
        let o = old.sets.get(name).unwrap_or(&none);
        if o.unread {
            // What it holds is not known: all of it goes, all we want goes in.
            tx.ops.push(Op::FlushSet {
                family,
                set: name.clone(),
            });
            adds.extend(every_element(family, name, set));
            continue;
        }
        let deleted: Vec<String> = o
            .elements
            .iter()
            .filter(|(k, v)| set.elements.get_packed(*k) != Some(*v))
            .map(|(k, _)| k.text())
            .collect();
        if !deleted.is_empty() {
            tx.ops.push(Op::DeleteElements {
                family,
                set: name.clone(),
                keys: deleted,
            });
        }
        let added: Elements = set
            .elements
            .iter()
            .filter(|(k, v)| o.elements.get_packed(*k) != Some(*v))
            .collect();
        if !added.is_empty() {
            adds.push(Op::AddElements {
                family,
                set: name.clone(),
                elements: added,
            });
        }
    }
    tx.ops.extend(adds);
    // Chains go last: the elements and rules that referenced them are gone by now.
    for name in old.chains.keys() {
        if !new.chains.contains_key(name) {
            remove_chain(tx, family, name);
        }
    }
}

/// The transaction that turns `old` into `new`. With `full`, every chain is rewritten too.
pub fn diff(old: &Ruleset, new: &Ruleset, full: bool) -> Transaction {
    let mut tx = Transaction::default();
    for family in IpFamily::ALL {
        match (old.table(family), new.table(family)) {
            (None, None) => {}
            (Some(_), None) => tx.ops.push(Op::DeleteTable(family)),
            (None, Some(n)) => create_table(&mut tx, family, n),
            (Some(o), Some(n)) if !compatible(o, n) => {
                // The layout itself changed (an upgrade): replace the table in the same commit.
                tx.ops.push(Op::DeleteTable(family));
                create_table(&mut tx, family, n);
            }
            (Some(o), Some(n)) => update_table(&mut tx, family, o, n, full),
        }
    }
    tx
}

/// The transaction for an in-place update: `new` is the ruleset after it, `touched` the old
/// value of everything it touched per family. Ordered as [`diff`] orders an update, and
/// equivalent to `diff(old, new, false)` at the cost of the touched part only.
pub fn patch(new: &Ruleset, touched: &[(IpFamily, Touched)]) -> Transaction {
    let mut tx = Transaction::default();
    let empty = Table::default();
    for (family, t) in touched {
        let family = *family;
        let table = new.table(family).unwrap_or(&empty);
        let mut written = Vec::new();
        let mut gone = Vec::new();
        for (name, old) in &t.chains {
            match (old, table.chains.get(name)) {
                (None, Some(c)) => {
                    tx.ops.push(Op::AddChain {
                        family,
                        name: name.clone(),
                        hook: c.hook.clone(),
                    });
                    written.push(name);
                }
                (Some(o), Some(c)) if !c.same_as(o) => {
                    tx.ops.push(Op::FlushChain {
                        family,
                        name: name.clone(),
                    });
                    written.push(name);
                }
                (Some(_), None) => gone.push(name),
                _ => {}
            }
        }
        write_rules(&mut tx, family, table, &written);
        let mut deleted: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        let mut added: BTreeMap<&str, Elements> = BTreeMap::new();
        for ((set, key), old) in &t.elements {
            let now = table.sets.get(*set).and_then(|s| s.elements.get(key));
            if *old == now.map(|v| v.map(|v| v.text())) {
                continue;
            }
            if old.is_some() {
                deleted.entry(set).or_default().push(key.clone());
            }
            if let Some(v) = now {
                added
                    .entry(set)
                    .or_default()
                    .insert(key, v.map(|v| v.text()).as_deref());
            }
        }
        for (set, keys) in deleted {
            tx.ops.push(Op::DeleteElements {
                family,
                set: set.to_string(),
                keys,
            });
        }
        for (set, elements) in added {
            tx.ops.push(Op::AddElements {
                family,
                set: set.to_string(),
                elements,
            });
        }
        for name in gone {
            remove_chain(&mut tx, family, name);
        }
    }
    tx
}

/// Why a transaction cannot be applied to an in-memory ruleset (what nft would refuse).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ApplyError(pub String);

/// Apply a transaction to an in-memory ruleset, all or nothing, with nft's rules for what fails.
pub fn apply(rs: &Ruleset, tx: &Transaction) -> Result<Ruleset, ApplyError> {
    let mut out = rs.clone();
    for op in &tx.ops {
        apply_op(&mut out, op)?;
    }
    Ok(out)
}

fn table_mut(rs: &mut Ruleset, family: IpFamily) -> Result<&mut Table, ApplyError> {
    rs.tables.get_mut(&family).ok_or_else(|| {
        ApplyError(format!(
            "table {} {TABLE}: no such table",
            family_name(family)
        ))
    })
}

fn apply_op(rs: &mut Ruleset, op: &Op) -> Result<(), ApplyError> {
    match op {
        Op::AddTable(f) => {
            rs.tables.entry(*f).or_default();
        }
        Op::DeleteTable(f) => {
            if rs.tables.remove(f).is_none() {
                return Err(ApplyError(format!(
                    "delete table {} {TABLE}: no such table",
                    family_name(*f)
                )));
            }
        }
        Op::AddSet { family, name, set } => {
            let t = table_mut(rs, *family)?;
            t.sets.entry(name.clone()).or_insert_with(|| set.clone());
        }
        Op::AddChain { family, name, hook } => {
            let t = table_mut(rs, *family)?;
            t.chains.entry(name.clone()).or_insert_with(|| Chain {
                hook: hook.clone(),
                ..Chain::default()
            });
        }
        Op::FlushChain { family, name } => {
            let t = table_mut(rs, *family)?;
            let c = t
                .chains
                .get_mut(name)
                .ok_or_else(|| ApplyError(format!("flush chain {name}: no such chain")))?;
            c.rules.clear();
            c.fingerprint.clear();
        }
        Op::AddRule {
            family,
            chain,
            rule,
        } => {
            let t = table_mut(rs, *family)?;
            let c = t
                .chains
                .get_mut(chain)
                .ok_or_else(|| ApplyError(format!("add rule {chain}: no such chain")))?;
            let (text, comment) = match rule.rsplit_once(" comment \"") {
                Some((text, fp)) => (text, fp.trim_end_matches('"')),
                None => (rule.as_str(), ""),
            };
            c.push_rule(text.to_string(), comment);
        }
        Op::DeleteChain { family, name } => {
            let t = table_mut(rs, *family)?;
            let target = format!(" {name}");
            let referenced = t.sets.values().any(|s| {
                s.elements.values().flatten().any(|v| {
                    let v = v.text();
                    v.ends_with(&target) && (v.starts_with("goto") || v.starts_with("jump"))
                })
            });
            if referenced {
                return Err(ApplyError(format!(
                    "delete chain {name}: Device or resource busy (still referenced)"
                )));
            }
            if t.chains.remove(name).is_none() {
                return Err(ApplyError(format!("delete chain {name}: no such chain")));
            }
        }
        Op::AddElements {
            family,
            set,
            elements,
        } => {
            let t = table_mut(rs, *family)?;
            let chains: Vec<String> = t.chains.keys().cloned().collect();
            let s = t
                .sets
                .get_mut(set)
                .ok_or_else(|| ApplyError(format!("add element {set}: no such set")))?;
            for (k, v) in elements {
                if let Some(verdict) = v.map(|v| v.text()) {
                    if let Some(target) = verdict
                        .strip_prefix("goto ")
                        .or_else(|| verdict.strip_prefix("jump "))
                    {
                        if !chains.iter().any(|c| c == target) {
                            return Err(ApplyError(format!(
                                "add element {set} {k}: chain {target} does not exist"
                            )));
                        }
                    }
                }
                match s.elements.get_packed(k) {
                    Some(existing) if existing != v => {
                        return Err(ApplyError(format!("add element {set} {k}: File exists")))
                    }
                    _ => {
                        s.elements.insert_packed(k, v);
                    }
                }
            }
            // As the kernel, which counts within the transaction (deletions and flushes
            // before the additions leave room).
            if let Some(size) = s.size.filter(|n| s.elements.len() > *n as usize) {
                return Err(ApplyError(format!(
                    "add element {set}: Too many open files in system (more than its size {size})"
                )));
            }
        }
        Op::DeleteElements { family, set, keys } => {
            let t = table_mut(rs, *family)?;
            let s = t
                .sets
                .get_mut(set)
                .ok_or_else(|| ApplyError(format!("delete element {set}: no such set")))?;
            for k in keys {
                if s.elements.remove(k).is_none() {
                    return Err(ApplyError(format!(
                        "delete element {set} {k}: No such file or directory"
                    )));
                }
            }
        }
        Op::FlushSet { family, set } => {
            let t = table_mut(rs, *family)?;
            let s = t
                .sets
                .get_mut(set)
                .ok_or_else(|| ApplyError(format!("flush set {set}: no such set")))?;
            s.elements = Default::default();
            s.unread = false;
        }
    }
    Ok(())
}
