//! iptables-save parsing and iptables-restore input: what one `--noflush` restore per family
//! must say to move the kernel from what it holds (or what we last wrote) to the layout.
//!
//! With `--noflush`, a `:CHAIN - [0:0]` line creates or empties that chain and leaves every
//! other chain alone, so built-in chains and other tools' chains are never touched: only
//! the chains written, the chains deleted (`-X`, emptied first) and the jumps inserted.

use super::names;
use super::render::{Chains, Jump, TableName, Tables};
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

    /// How many rules the family holds (the back-end detection counts these).
    pub fn rule_count(&self) -> usize {
        self.tables.values().map(|t| t.rules.len()).sum()
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
    delete: Vec<String>,
    insert: Vec<&'a Jump>,
    remove: Vec<(String, String)>,
}

impl TablePlan<'_> {
    fn is_empty(&self) -> bool {
        self.write.is_empty()
            && self.delete.is_empty()
            && self.insert.is_empty()
            && self.remove.is_empty()
    }

    fn emit(&self, table: TableName, out: &mut String, stats: &mut RestoreStats) {
        if self.is_empty() {
            return;
        }
        let _ = writeln!(out, "*{}", table.as_str());
        for (chain, _) in &self.write {
            let _ = writeln!(out, ":{chain} - [0:0]");
        }
        for chain in &self.delete {
            let _ = writeln!(out, ":{chain} - [0:0]");
        }
        for (chain, rule) in &self.remove {
            let _ = writeln!(out, "-D {chain} {rule}");
        }
        // Each goes to the top, so the last inserted ends up first: insert in reverse.
        for j in self.insert.iter().rev() {
            let _ = writeln!(out, "-I {} 1 {}", j.builtin, j.rule);
        }
        for (chain, rules) in &self.write {
            for rule in rules.iter() {
                let _ = writeln!(out, "-A {chain} {rule}");
            }
            stats.chains_written += 1;
            stats.rules_written += rules.len();
        }
        for chain in &self.delete {
            let _ = writeln!(out, "-X {chain}");
        }
        out.push_str("COMMIT\n");
        stats.chains_deleted += self.delete.len();
        stats.jumps_inserted += self.insert.len();
    }
}

/// Restore input that brings one family from `kernel` (full sync: everything is written,
/// stale service chains the kernel holds are deleted, missing jumps inserted) or from
/// `previous`, what our last restore wrote (partial: only chains whose rules changed are
/// written, chains no longer wanted deleted). Empty when nothing needs doing.
pub fn sync_input(desired: &Tables, base: Base<'_>, jumps: &[Jump]) -> (String, RestoreStats) {
    let mut out = String::new();
    let mut stats = RestoreStats::default();
    let none = Chains::new();
    for table in TableName::ALL {
        let want = desired.chains(table).unwrap_or(&none);
        let mut plan = TablePlan::default();
        match base {
            Base::Kernel(saved) => {
                let held = saved.table(table);
                plan.write = want
                    .iter()
                    .map(|(c, r)| (c.as_str(), r.as_slice()))
                    .collect();
                if let Some(held) = held {
                    plan.delete = held
                        .chains
                        .iter()
                        .filter(|c| stale(c) && !want.contains_key(*c))
                        .cloned()
                        .collect();
                }
                plan.insert = jumps
                    .iter()
                    .filter(|j| j.table == table)
                    .filter(|j| !held.is_some_and(|h| h.jumps_to(j.builtin, j.target)))
                    .collect();
            }
            Base::Previous(prev) => {
                let had = prev.chains(table).unwrap_or(&none);
                plan.write = want
                    .iter()
                    .filter(|(c, r)| had.get(*c) != Some(*r))
                    .map(|(c, r)| (c.as_str(), r.as_slice()))
                    .collect();
                plan.delete = had
                    .keys()
                    .filter(|c| !want.contains_key(*c))
                    .cloned()
                    .collect();
            }
        }
        plan.emit(table, &mut out, &mut stats);
    }
    (out, stats)
}

/// What a sync's restore input is computed against.
#[derive(Debug, Clone, Copy)]
pub enum Base<'a> {
    /// What iptables-save shows now: a full sync.
    Kernel(&'a Saved),
    /// What the last successful restore wrote: a partial sync.
    Previous(&'a Tables),
}

/// Per-service chains are stale when unwanted; fixed chains are always written.
fn stale(chain: &str) -> bool {
    names::SERVICE_CHAIN_PREFIXES
        .iter()
        .any(|p| chain.starts_with(p))
}

/// Restore input that removes every chain of ours from a family, and the rules in other
/// chains that jump to them; nothing else. Empty when there is nothing of ours.
pub fn cleanup_input(saved: &Saved) -> (String, RestoreStats) {
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
            .filter(|c| names::owned(c))
            .collect();
        let remove = held
            .rules
            .iter()
            .filter(|(chain, rule)| {
                !ours.contains(chain.as_str())
                    && rule_target(rule).is_some_and(|t| ours.contains(t))
            })
            .cloned()
            .collect();
        let plan = TablePlan {
            delete: ours.iter().map(|c| c.to_string()).collect(),
            remove,
            ..TablePlan::default()
        };
        plan.emit(table, &mut out, &mut stats);
    }
    (out, stats)
}
