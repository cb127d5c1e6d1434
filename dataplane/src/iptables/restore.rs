//! iptables-save parsing and iptables-restore input: what one `--noflush` restore per family
//! must say to move the kernel from what it holds (or what we last wrote) to the layout.
//!
//! With `--noflush`, a `:CHAIN - [0:0]` line creates or empties that chain and leaves every
//! other chain alone, so built-in chains and other tools' chains are never touched: only
//! the chains written, the chains deleted (`-X`, emptied first) and the jumps inserted.

use super::names;
use super::render::{Chains, FamilyLayout, Jump, PortRules, TableName};
use crate::model::ServicePortName;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// One table as iptables-save printed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedTable {
    pub chains: BTreeSet<String>,
    /// (chain, rule after `-A <chain> `), in order.
    pub rules: Vec<(String, String)>,
}

impl SavedTable {
    /// Whether a rule in `chain` jumps to `target`.
    pub fn jumps_to(&self, chain: &str, target: &str) -> bool {
        self.rules
            .iter()
            .any(|(c, r)| c == chain && rule_target(r) == Some(target))
    }
}

/// A family's tables as iptables-save printed them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Saved {
    pub tables: BTreeMap<String, SavedTable>,
}

impl Saved {
    pub fn table(&self, t: TableName) -> Option<&SavedTable> {
        self.tables.get(t.as_str())
    }
}

/// The `-j` / `-g` target of a rule.
pub fn rule_target(rule: &str) -> Option<&str> {
    let mut words = rule.split_whitespace();
    let mut target = None;
    while let Some(w) = words.next() {
        if w == "-j" || w == "-g" || w == "--jump" || w == "--goto" {
            target = words.next();
        }
    }
    target
}

/// Output of iptables-save that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("iptables-save output line {line}: {message}: {text:?}")]
pub struct SaveParseError {
    pub line: usize,
    pub text: String,
    pub message: &'static str,
}

/// Parse iptables-save output.
pub fn parse_save(text: &str) -> Result<Saved, SaveParseError> {
    let mut saved = Saved::default();
    let mut current: Option<String> = None;
    for (i, line) in text.lines().enumerate() {
        let err = |message| SaveParseError {
            line: i + 1,
            text: line.to_string(),
            message,
        };
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(t) = line.strip_prefix('*') {
            saved.tables.entry(t.to_string()).or_default();
            current = Some(t.to_string());
            continue;
        }
        if line == "COMMIT" {
            current = None;
            continue;
        }
        let table = current
            .as_ref()
            .and_then(|t| saved.tables.get_mut(t))
            .ok_or_else(|| err("outside a table"))?;
        if let Some(decl) = line.strip_prefix(':') {
            let name = decl
                .split_whitespace()
                .next()
                .ok_or_else(|| err("no chain name"))?;
            table.chains.insert(name.to_string());
        } else if let Some(rest) = line.strip_prefix("-A ") {
            let (chain, rule) = rest.split_once(' ').unwrap_or((rest, ""));
            table.rules.push((chain.to_string(), rule.to_string()));
        } else {
            return Err(err("neither a chain, a rule nor a table"));
        }
    }
    Ok(saved)
}

/// What a restore input does, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreStats {
    pub chains_written: usize,
    pub rules_written: usize,
    pub chains_deleted: usize,
    pub jumps_inserted: usize,
}

impl RestoreStats {
    pub fn add(&mut self, o: RestoreStats) {
        self.chains_written += o.chains_written;
        self.rules_written += o.rules_written;
        self.chains_deleted += o.chains_deleted;
        self.jumps_inserted += o.jumps_inserted;
    }
}

/// One table's part of a restore input.
#[derive(Default)]
struct TablePlan<'a> {
    write: Vec<(&'a str, &'a [String])>,
    /// Emptied, not deleted.
    flush: Vec<String>,
    delete: Vec<String>,
    insert: Vec<&'a Jump>,
    remove: Vec<(String, String)>,
}

impl TablePlan<'_> {
    fn is_empty(&self) -> bool {
        self.write.is_empty()
            && self.flush.is_empty()
            && self.delete.is_empty()
            && self.insert.is_empty()
            && self.remove.is_empty()
    }

    fn emit(&self, table: TableName, out: &mut String, stats: &mut RestoreStats) {
        if self.is_empty() {
            return;
        }
        let _ = writeln!(out, "*{}", table.as_str());
        for chain in self.delete.iter().chain(&self.flush) {
            let _ = writeln!(out, ":{chain} - [0:0]");
        }
        for (chain, rule) in &self.remove {
            let _ = writeln!(out, "-D {chain} {rule}");
        }
        for i in write_order(&self.write) {
            let (chain, rules) = self.write[i];
            let _ = writeln!(out, ":{chain} - [0:0]");
            for rule in rules {
                let _ = writeln!(out, "-A {chain} {rule}");
            }
            stats.chains_written += 1;
            stats.rules_written += rules.len();
        }
        // An emptied chain is written, with no rules.
        stats.chains_written += self.flush.len();
        // Each goes to the top, so the last inserted ends up first: insert in reverse.
        for j in self.insert.iter().rev() {
            let _ = writeln!(out, "-I {} 1 {}", j.builtin, j.rule);
        }
        for chain in &self.delete {
            let _ = writeln!(out, "-X {chain}");
        }
        out.push_str("COMMIT\n");
        stats.chains_deleted += self.delete.len();
        stats.jumps_inserted += self.insert.len();
    }
}

/// The order to write chains in: every chain after the chains it jumps to (a jump needs
/// its target to exist), and otherwise by name, descending, each chain's rules right after
/// its declaration. iptables-nft 1.8.9 keeps a table's chains in a list sorted by name and
/// walks it from the smallest for every declaration, append and jump target, so an input
/// in ascending order costs O(chains^2) string compares (a 1000 x 10 cluster took 3.5 s);
/// descending, a new chain goes in at the head and its appends find it there at once.
fn write_order(write: &[(&str, &[String])]) -> Vec<usize> {
    let index: BTreeMap<&str, usize> = write
        .iter()
        .enumerate()
        .map(|(i, (c, _))| (*c, i))
        .collect();
    let mut depth: Vec<Option<usize>> = vec![None; write.len()];
    fn depth_of(
        i: usize,
        write: &[(&str, &[String])],
        index: &BTreeMap<&str, usize>,
        depth: &mut Vec<Option<usize>>,
        seen: usize,
    ) -> usize {
        if let Some(d) = depth[i] {
            return d;
        }
        // A jump cycle is impossible in a valid layout; the bound keeps a bad one finite.
        if seen > write.len() {
            return 0;
        }
        let mut d = 0;
        for rule in write[i].1 {
            if let Some(&t) = rule_target(rule).and_then(|t| index.get(t)) {
                if t != i {
                    d = d.max(1 + depth_of(t, write, index, depth, seen + 1));
                }
            }
        }
        depth[i] = Some(d);
        d
    }
    let mut order: Vec<(usize, &str, usize)> = (0..write.len())
        .map(|i| (depth_of(i, write, &index, &mut depth, 0), write[i].0, i))
        .collect();
    order.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(a.1)));
    order.into_iter().map(|(_, _, i)| i).collect()
}

/// Restore input that brings one family from what the kernel holds (full sync: every
/// chain written, stale service chains deleted, missing jumps inserted) or from what our
/// last restore wrote (partial: only chains whose rules changed are written; chains no
/// longer wanted are emptied, and deleted by the next full sync, because a
/// `-X` makes iptables-nft load every rule of the table). Empty when nothing needs doing.
pub fn sync_input(
    desired: &FamilyLayout,
    base: Base<'_>,
    jumps: &[Jump],
) -> (String, RestoreStats) {
    let mut plans: BTreeMap<TableName, TablePlan> = BTreeMap::new();
    let empty = PortRules::default();
    match base {
        Base::Kernel(saved) => {
            let mut wanted: BTreeMap<TableName, BTreeSet<&str>> = BTreeMap::new();
            for (table, chain, rules) in desired.chains() {
                plans.entry(table).or_default().write.push((chain, rules));
                wanted.entry(table).or_default().insert(chain);
            }
            for table in TableName::ALL {
                let held = saved.table(table);
                let plan = plans.entry(table).or_default();
                if let Some(held) = held {
                    let want = wanted.get(&table);
                    // A stale chain another tool's rule jumps to cannot be deleted without
                    // editing that rule: it is emptied instead, and the restore still applies.
                    let foreign_targets: BTreeSet<&str> = held
                        .rules
                        .iter()
                        .filter(|(c, _)| !names::owned(c))
                        .filter_map(|(_, r)| rule_target(r))
                        .collect();
                    for c in held.chains.iter() {
                        if !stale(c) || want.is_some_and(|w| w.contains(c.as_str())) {
                            continue;
                        }
                        if foreign_targets.contains(c.as_str()) {
                            plan.flush.push(c.clone());
                        } else {
                            plan.delete.push(c.clone());
                        }
                    }
                }
                plan.insert = jumps
                    .iter()
                    .filter(|j| j.table == table)
                    .filter(|j| !held.is_some_and(|h| h.jumps_to(j.builtin, j.target)))
                    .collect();
            }
        }
        Base::Previous {
            layout: prev,
            changed,
        } => {
            let none = Chains::new();
            for (table, chains) in &desired.fixed.tables {
                let had = prev.fixed.chains(*table).unwrap_or(&none);
                let plan = plans.entry(*table).or_default();
                for (c, r) in chains {
                    if had.get(c) != Some(r) {
                        plan.write.push((c, r));
                    }
                }
            }
            let touched = |name: &ServicePortName| {
                changed.is_none_or(|set| set.contains(&(name.namespace.clone(), name.name.clone())))
            };
            let names: BTreeSet<&ServicePortName> = desired
                .ports
                .keys()
                .chain(prev.ports.keys())
                .filter(|n| touched(n))
                .collect();
            let nat = plans.entry(TableName::Nat).or_default();
            for name in names {
                let new = desired.ports.get(name).unwrap_or(&empty);
                let old = prev.ports.get(name).unwrap_or(&empty);
                for (c, r) in &new.chains {
                    if old.chains.get(c) != Some(r) {
                        nat.write.push((c, r));
                    }
                }
                for c in old.chains.keys() {
                    if !new.chains.contains_key(c) {
                        nat.flush.push(c.clone());
                    }
                }
            }
        }
    }
    let mut out = String::new();
    let mut stats = RestoreStats::default();
    for table in TableName::ALL {
        if let Some(plan) = plans.get(&table) {
            plan.emit(table, &mut out, &mut stats);
        }
    }
    (out, stats)
}

/// What a sync's restore input is computed against.
#[derive(Debug, Clone, Copy)]
pub enum Base<'a> {
    /// What iptables-save shows now: a full sync.
    Kernel(&'a Saved),
    /// What the last successful restore wrote: a partial sync, of the ports of `changed`
    /// services only (`None`: every port).
    Previous {
        layout: &'a FamilyLayout,
        changed: Option<&'a BTreeSet<(String, String)>>,
    },
}

/// Per-service chains are stale when unwanted; fixed chains are always written.
fn stale(chain: &str) -> bool {
    names::SERVICE_CHAIN_PREFIXES
        .iter()
        .any(|p| chain.starts_with(p))
}

/// Restore input that removes every chain of ours from a family and our jumps to them from
/// the built-in chains; nothing else. A chain of ours that another tool's chain still jumps
/// to is emptied but kept, since deleting it would mean editing that tool's rules. Empty
/// when there is nothing of ours.
pub fn cleanup_input(saved: &Saved) -> (String, RestoreStats) {
    cleanup_input_of(saved, &names::owned)
}

/// [`cleanup_input`] for the chains `owned` names.
pub fn cleanup_input_of(saved: &Saved, owned: &dyn Fn(&str) -> bool) -> (String, RestoreStats) {
    const BUILTIN: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];
    let mut out = String::new();
    let mut stats = RestoreStats::default();
    for table in TableName::ALL {
        let Some(held) = saved.table(table) else {
            continue;
        };
        let ours: BTreeSet<&str> = held
            .chains
            .iter()
            .map(String::as_str)
            .filter(|c| owned(c))
            .collect();
        let jumps_to_ours = |(chain, rule): &&(String, String)| {
            !ours.contains(chain.as_str()) && rule_target(rule).is_some_and(|t| ours.contains(t))
        };
        let remove: Vec<(String, String)> = held
            .rules
            .iter()
            .filter(jumps_to_ours)
            .filter(|(chain, _)| BUILTIN.contains(&chain.as_str()))
            .cloned()
            .collect();
        let kept: BTreeSet<&str> = held
            .rules
            .iter()
            .filter(jumps_to_ours)
            .filter(|(chain, _)| !BUILTIN.contains(&chain.as_str()))
            .filter_map(|(_, rule)| rule_target(rule))
            .collect();
        let plan = TablePlan {
            delete: ours
                .iter()
                .filter(|c| !kept.contains(*c))
                .map(|c| c.to_string())
                .collect(),
            flush: kept.iter().map(|c| c.to_string()).collect(),
            remove,
            ..TablePlan::default()
        };
        plan.emit(table, &mut out, &mut stats);
    }
    (out, stats)
}
