//! iptables-save parsing and iptables-restore input: what a family's `--noflush` restore
//! (two on iptables-nft when a whole-table block leaves the jumps for later) must say to
//! move the kernel from what it holds (or what we last wrote) to the layout.
//!
//! With `--noflush`, a `:CHAIN - [0:0]` line creates or empties that chain and leaves every
//! other chain alone, so built-in chains and other tools' chains are never touched: only
//! the chains written, the chains deleted (`-X`, emptied first) and the jumps inserted.

use super::names;
use super::plan::{ports_of, Chains, FamilyLayout, Jump, PortRules, TableName};
use super::rule_parse::{encodable, rule_words};
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
    /// Each chain's rules, in order.
    pub fn rules_by_chain(&self) -> BTreeMap<&str, Vec<&str>> {
        let mut out: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (c, r) in &self.rules {
            out.entry(c.as_str()).or_default().push(r.as_str());
        }
        out
    }

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

/// Whether rule `a` and rule `b` (each the text after `-A <chain> `) say the same, one as
/// iptables-save prints it and one as we write it: iptables-save reorders the options
/// (addresses and protocol first), drops quotes from one-word comments, prints a
/// probability as the kernel's fixed-point value (0.1000000000 comes back as
/// 0.10000000009), MARK's `--or-mark m` as `--set-xmark m/m`, and defaults we leave out
/// (REJECT's `--reject-with`, `-m recent`'s all-ones `--mask` and `--rsource`). Each option
/// with its values (and a `!` before it) is one group; the groups are compared sorted,
/// duplicates kept, so order does not matter and repetition does.
pub fn same_rule(a: &str, b: &str) -> bool {
    canonical(a) == canonical(b)
}

fn canonical(rule: &str) -> Vec<String> {
    let (words, _) = rule_words(rule);
    let mut groups: Vec<String> = Vec::new();
    let mut negate = false;
    for (w, is_quoted) in words {
        if !is_quoted && w == "!" {
            negate = true;
        } else if !is_quoted && w.starts_with('-') && w.len() > 1 {
            groups.push(if negate { format!("! {w}") } else { w });
            negate = false;
        } else if let Some(g) = groups.last_mut() {
            let value = if g.ends_with("--probability") {
                w.parse::<f64>().map_or(w.clone(), |p| {
                    format!("{}", (p * f64::from(0x8000_0000u32)).round())
                })
            } else {
                w
            };
            g.push(' ');
            g.push_str(&value);
        } else {
            groups.push(w);
        }
    }
    for g in &mut groups {
        let mark = |g: &str, op: &str| g.strip_prefix(op).map(str::to_string);
        if let Some(m) = mark(g, "--or-mark ") {
            *g = format!("--set-xmark {m}/{m}");
        } else if let Some(m) = mark(g, "--xor-mark ") {
            *g = format!("--set-xmark {m}/0x0");
        }
    }
    // Defaults iptables-save prints and we leave out: REJECT's, and `-m recent`'s
    // all-ones mask and source address.
    groups.retain(|g| {
        ![
            "--reject-with icmp-port-unreachable",
            "--reject-with icmp6-port-unreachable",
            "--mask 255.255.255.255",
            "--mask ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "--rsource",
        ]
        .contains(&g.as_str())
    });
    groups.sort();
    groups
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreStats {
    pub chains_written: usize,
    pub rules_written: usize,
    pub chains_deleted: usize,
    pub jumps_inserted: usize,
    /// Rules written into our chains, per table (kube-proxy's
    /// `sync_proxy_rules_iptables_last`; the jumps from built-in chains are not counted, as
    /// kube-proxy ensures those apart from its restore input).
    pub rules_by_table: BTreeMap<TableName, usize>,
}

impl RestoreStats {
    pub fn add(&mut self, o: RestoreStats) {
        self.chains_written += o.chains_written;
        self.rules_written += o.rules_written;
        self.chains_deleted += o.chains_deleted;
        self.jumps_inserted += o.jumps_inserted;
        for (t, n) in o.rules_by_table {
            *self.rules_by_table.entry(t).or_default() += n;
        }
    }

    fn wrote(&mut self, table: TableName, rules: usize) {
        self.rules_written += rules;
        *self.rules_by_table.entry(table).or_default() += rules;
    }
}

/// One table's part of a restore input.
#[derive(Default)]
struct TablePlan<'a, 'k> {
    write: Vec<(&'a str, &'a [String])>,
    /// Emptied, not deleted.
    flush: Vec<String>,
    delete: Vec<String>,
    insert: Vec<&'a Jump>,
    remove: Vec<(String, String)>,
    /// The chains the kernel holds, when the plan was made against it.
    held: Option<&'k BTreeSet<String>>,
}

impl TablePlan<'_, '_> {
    fn is_empty(&self) -> bool {
        self.write.is_empty()
            && self.flush.is_empty()
            && self.delete.is_empty()
            && self.insert.is_empty()
            && self.remove.is_empty()
    }

    fn declared(&self) -> usize {
        self.write.len() + self.flush.len() + self.delete.len()
    }

    /// The block for `table`, as `style` lays it out; jumps the block cannot carry go to
    /// `later`, a block of their own.
    fn emit(
        &self,
        table: TableName,
        style: Style,
        out: &mut String,
        later: &mut String,
        stats: &mut RestoreStats,
    ) {
        if self.is_empty() {
            return;
        }
        let whole_table = style != Style::Plain && self.declared() >= WHOLE_TABLE_CHAINS;
        let _ = writeln!(out, "*{}", table.as_str());
        if whole_table {
            out.push_str("-S\n");
        }
        for chain in self.delete.iter().chain(&self.flush) {
            let _ = writeln!(out, ":{chain} - [0:0]");
        }
        for (chain, rule) in &self.remove {
            let _ = writeln!(out, "-D {chain} {rule}");
        }
        if whole_table {
            for i in walk_order(&self.write) {
                let (chain, rules) = self.write[i];
                let _ = writeln!(out, ":{chain} - [0:0]");
                for rule in rules {
                    let _ = writeln!(out, "-A {chain} {rule}");
                }
            }
        } else {
            for i in write_order(&self.write) {
                let (chain, rules) = self.write[i];
                let _ = writeln!(out, ":{chain} - [0:0]");
                for rule in rules {
                    let _ = writeln!(out, "-A {chain} {rule}");
                }
            }
        }
        for (_, rules) in &self.write {
            stats.chains_written += 1;
            stats.wrote(table, rules.len());
        }
        // An emptied chain is written, with no rules.
        stats.chains_written += self.flush.len();
        // Each goes to the top, so the last inserted ends up first: insert in reverse.
        // With `-S` first, iptables-nft-restore 1.8.9 cannot add a rule to a built-in chain
        // the kernel does not have yet (it creates them on demand only without it), so the
        // jumps follow in a block of their own: a separate commit, but our chains do
        // nothing until the jumps reach them, and the jumps are only missing on first start.
        let jumps = if whole_table { &mut *later } else { &mut *out };
        if whole_table && !self.insert.is_empty() {
            let _ = writeln!(jumps, "*{}", table.as_str());
        }
        for j in self.insert.iter().rev() {
            let _ = writeln!(jumps, "-I {} 1 {}", j.builtin, j.rule);
        }
        if whole_table && !self.insert.is_empty() {
            jumps.push_str("COMMIT\n");
        }
        for chain in &self.delete {
            let _ = writeln!(out, "-X {chain}");
        }
        out.push_str("COMMIT\n");
        stats.chains_deleted += self.delete.len();
        stats.jumps_inserted += self.insert.len();
    }
}

/// Chains from which a table block is written whole-table style for iptables-nft.
pub const WHOLE_TABLE_CHAINS: usize = 1000;

/// How a restore input is laid out for the iptables binary that reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Style {
    /// Each chain declared right before its rules, in [`write_order`].
    #[default]
    Plain,
    /// iptables-nft-restore 1.8.x: it notes the chains each line names in a list sorted by
    /// name, walked from the start for every line, which is quadratic (five minutes for a
    /// 10k-service cold sync, the descending order of [`write_order`] included). A command
    /// that names no chain makes it read the whole table instead, and `-S` is the one such
    /// command that changes nothing (it prints the table; the executor discards it). So a
    /// block declaring [`WHOLE_TABLE_CHAINS`] or more starts with `-S` and writes its
    /// chains, each declared right before its rules, in [`walk_order`]. Smaller blocks are
    /// plain: reading a large table costs more than tracking a few names.
    Nft,
    /// [`Style::Nft`], and a block that would be whole-table has the chains it creates
    /// written directly over netlink first ([`Input::Create`], see [`super::direct`]) when
    /// their rules are ones that module encodes and every chain they jump to exists or is
    /// created with them; the rest goes in the restore.
    NftDirect,
}

/// One step of a sync of one family, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input<'a> {
    /// Chains that do not exist yet, to create with their rules in one nf_tables batch.
    Create {
        table: TableName,
        chains: Vec<(&'a str, &'a [String])>,
    },
    /// An `iptables-restore --noflush` input.
    Restore(String),
}

/// Moves out of `plan.write` the chains [`Style::NftDirect`] creates directly: new (not
/// in `held`), every rule encodable, and every chain they jump to either held already or
/// created with them. In the kernel's walk order, which is also the order they are
/// created in (see [`walk_order`]).
fn split_direct<'a>(
    plan: &mut TablePlan<'a, '_>,
    held: &BTreeSet<String>,
) -> Vec<(&'a str, &'a [String])> {
    let new: BTreeSet<&str> = plan
        .write
        .iter()
        .map(|(c, _)| *c)
        .filter(|c| !held.contains(*c))
        .collect();
    let rules: BTreeMap<&str, &[String]> = plan.write.iter().copied().collect();
    let mut direct: BTreeSet<&str> = new
        .iter()
        .copied()
        .filter(|c| rules[c].iter().all(|r| encodable(r)))
        .collect();
    loop {
        let blocked: Vec<&str> = direct
            .iter()
            .copied()
            .filter(|c| {
                rules[c]
                    .iter()
                    .filter_map(|r| rule_target(r))
                    .any(|t| new.contains(t) && !direct.contains(t))
            })
            .collect();
        if blocked.is_empty() {
            break;
        }
        for c in blocked {
            direct.remove(c);
        }
    }
    let (moved, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut plan.write)
        .into_iter()
        .partition(|(c, _)| direct.contains(c));
    plan.write = kept;
    walk_order(&moved).into_iter().map(|i| moved[i]).collect()
}

/// The chains in the order the kernel walks them from the top-level chains (those no
/// other written chain jumps to), depth first along each chain's jumps in rule order, each
/// chain after the chains it jumps to (a jump needs its target to exist); any left over
/// after. So a service's endpoint chains come right before its service chain, the service
/// chains before KUBE-SERVICES. Why this order:
/// - the kernel allocates chains and rules in input order and, on every commit that adds a
///   jump, walks everything reachable from the base chains: with neighbours adjacent in
///   memory, a one-endpoint change's commit took 0.24 s instead of 0.34 s at 10k x 10;
/// - iptables-nft 1.8.9 finds a chain by name in a hash table of 512 buckets, newest
///   first in each: with each chain declared right before its rules, and its targets just
///   before it, most lookups stop at a bucket's head. Declaring every chain first made
///   each append walk a bucket of ~200 chains at 10k x 10: a cold sync took 12.6-14.4 s
///   that way and 9.0-10.1 s this way, in one run on one machine;
/// - chains are created in hash order, not by name, which keeps iptables-nft-save's sort
///   (a quicksort that takes the first chain as its pivot) from degenerating: on chains
///   created in descending order it recursed once per chain and overflowed its stack at
///   10k services.
fn walk_order(write: &[(&str, &[String])]) -> Vec<usize> {
    let index = chain_index(write);
    let targets = |i: usize| -> Vec<usize> {
        write[i]
            .1
            .iter()
            .filter_map(|r| rule_target(r).and_then(|t| index.get(t).copied()))
            .filter(|&t| t != i)
            .collect()
    };
    let mut reached = vec![false; write.len()];
    for i in 0..write.len() {
        for t in targets(i) {
            reached[t] = true;
        }
    }
    let mut order = Vec::with_capacity(write.len());
    let mut seen = vec![false; write.len()];
    let roots: Vec<usize> = (0..write.len()).filter(|&i| !reached[i]).collect();
    for start in roots.into_iter().chain(0..write.len()) {
        if std::mem::replace(&mut seen[start], true) {
            continue;
        }
        // Depth first, each chain left once all its targets are in `order`: a chain, its
        // targets, and how many of them have been visited.
        let mut stack = vec![(start, targets(start), 0)];
        while let Some((i, next, done)) = stack.last_mut() {
            match next.get(*done) {
                Some(&t) => {
                    *done += 1;
                    // A target already seen is in `order`, or is on the stack: a jump
                    // cycle, impossible in a valid layout and left to the restore to refuse.
                    if !std::mem::replace(&mut seen[t], true) {
                        stack.push((t, targets(t), 0));
                    }
                }
                None => {
                    order.push(*i);
                    stack.pop();
                }
            }
        }
    }
    order
}

/// Each written chain's position in `write`, by name.
fn chain_index<'a>(write: &[(&'a str, &[String])]) -> BTreeMap<&'a str, usize> {
    write
        .iter()
        .enumerate()
        .map(|(i, (c, _))| (*c, i))
        .collect()
}

/// The order to write chains in: every chain after the chains it jumps to (a jump needs
/// its target to exist), and otherwise by name, descending, each chain's rules right after
/// its declaration. iptables-nft 1.8.9 keeps a table's chains in a list sorted by name and
/// walks it from the smallest for every declaration, append and jump target, so an input
/// in ascending order costs O(chains^2) string compares (a 1000 x 10 cluster took 3.5 s);
/// descending, a new chain goes in at the head and its appends find it there at once.
fn write_order(write: &[(&str, &[String])]) -> Vec<usize> {
    let index = chain_index(write);
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

/// Restore input that brings one family from what the kernel holds (full sync: each chain
/// whose rules differ from what iptables-save shows written, stale chains of ours
/// deleted, missing jumps inserted) or from what our
/// last restore wrote (partial: only chains whose rules changed are written; chains no
/// longer wanted are emptied, and deleted by the next full sync, because a
/// `-X` makes iptables-nft load every rule of the table). Empty when nothing needs doing.
pub fn sync_input(
    desired: &FamilyLayout,
    base: Base<'_>,
    jumps: &[Jump],
) -> (String, RestoreStats) {
    let (inputs, stats) = sync_inputs(desired, base, jumps, Style::Plain);
    let text = inputs
        .into_iter()
        .filter_map(|i| match i {
            Input::Restore(text) => Some(text),
            Input::Create { .. } => None,
        })
        .collect();
    (text, stats)
}

/// [`sync_input`] laid out in `style`: the steps to take one after the other (more than
/// one only when a whole-table block leaves its jumps to a second input, or chains are
/// created directly before the restore).
pub fn sync_inputs<'a>(
    desired: &'a FamilyLayout,
    base: Base<'_>,
    jumps: &'a [Jump],
    style: Style,
) -> (Vec<Input<'a>>, RestoreStats) {
    let mut plans: BTreeMap<TableName, TablePlan> = BTreeMap::new();
    let empty = PortRules::default();
    match base {
        Base::Kernel(saved) => {
            let mut wanted: BTreeMap<TableName, BTreeSet<&str>> = BTreeMap::new();
            let held_rules: BTreeMap<TableName, BTreeMap<&str, Vec<&str>>> = TableName::ALL
                .into_iter()
                .filter_map(|t| saved.table(t).map(|h| (t, h.rules_by_chain())))
                .collect();
            for (table, chain, rules) in desired.chains() {
                wanted.entry(table).or_default().insert(chain);
                // A chain the kernel already holds as we want it is left alone: a periodic
                // full sync of an intact kernel writes nothing but what drifted.
                let held = saved.table(table).filter(|h| h.chains.contains(chain));
                let same = held.is_some() && {
                    let had = held_rules
                        .get(&table)
                        .and_then(|by| by.get(chain))
                        .map_or(&[][..], Vec::as_slice);
                    had.len() == rules.len() && had.iter().zip(rules).all(|(a, b)| same_rule(a, b))
                };
                if !same {
                    plans.entry(table).or_default().write.push((chain, rules));
                }
            }
            for table in TableName::ALL {
                let held = saved.table(table);
                let plan = plans.entry(table).or_default();
                // A table the kernel lacks holds no chains.
                static NONE: BTreeSet<String> = BTreeSet::new();
                plan.held = Some(held.map_or(&NONE, |h| &h.chains));
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
            // Fixed chains moved over unchanged have nothing to compare.
            let fixed = desired.fixed.tables.iter().filter(|_| !desired.fixed_kept);
            for (table, chains) in fixed {
                let had = prev.fixed.chains(*table).unwrap_or(&none);
                let plan = plans.entry(*table).or_default();
                for (c, r) in chains {
                    if had.get(c) != Some(r) {
                        plan.write.push((c, r));
                    }
                }
            }
            // The changed services' ports are looked up, not searched for among all.
            let names: BTreeSet<&ServicePortName> = match changed {
                None => desired.ports.keys().chain(prev.ports.keys()).collect(),
                Some(set) => ports_of(&desired.ports, set)
                    .chain(ports_of(&prev.ports, set))
                    .collect(),
            };
            let nat = plans.entry(TableName::Nat).or_default();
            for name in names {
                let new = desired.ports.get(name);
                let old = prev.ports.get(name).unwrap_or(&empty);
                for (c, r) in new.iter().flat_map(|n| &n.chains) {
                    if old.chains.get(c) != Some(r) {
                        nat.write.push((c, r));
                    }
                }
                for c in old.chains.keys() {
                    if !new.is_some_and(|n| n.chains.contains_key(c)) {
                        nat.flush.push(c.clone());
                    }
                }
            }
        }
    }
    let mut out = String::new();
    let mut later = String::new();
    let mut stats = RestoreStats::default();
    let mut inputs = Vec::new();
    for table in TableName::ALL {
        if let Some(plan) = plans.get_mut(&table) {
            if style == Style::NftDirect && plan.declared() >= WHOLE_TABLE_CHAINS {
                if let Some(held) = plan.held {
                    let chains = split_direct(plan, held);
                    if !chains.is_empty() {
                        stats.chains_written += chains.len();
                        stats.wrote(table, chains.iter().map(|(_, r)| r.len()).sum::<usize>());
                        inputs.push(Input::Create { table, chains });
                    }
                }
            }
            plan.emit(table, style, &mut out, &mut later, &mut stats);
        }
    }
    inputs.extend(
        [out, later]
            .into_iter()
            .filter(|i| !i.is_empty())
            .map(Input::Restore),
    );
    (inputs, stats)
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
    cleanup_input_of(saved, &names::owned, Style::Plain)
}

/// [`cleanup_input`] for the chains `owned` names, laid out in `style` (removing a large
/// cluster's chains names as many as writing them).
pub fn cleanup_input_of(
    saved: &Saved,
    owned: &dyn Fn(&str) -> bool,
    style: Style,
) -> (String, RestoreStats) {
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
        // Nothing is inserted, so nothing goes to a second input.
        plan.emit(table, style, &mut out, &mut String::new(), &mut stats);
    }
    (out, stats)
}
