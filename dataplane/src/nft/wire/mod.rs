//! Everything nftables mode writes, as one nf_tables netlink batch per transaction: tables,
//! chains, rules with their expressions, sets and maps (typeof, concatenations, intervals,
//! timeouts), elements, flushes and deletes. No `nft` process runs in a sync.
//!
//! Each message is what nft 1.0.6 sends for the same text, so that `nft list ruleset`
//! prints what we meant; `tests/kernel_listing.rs` checks that against tables nft itself
//! wrote. Writing the bytes ourselves also drops the workarounds nft's parser needed (the
//! `tx-anchor` chain) and the seconds its evaluation took on a cold 10k-service load.

pub mod elements;
pub mod rule;
pub mod set;

use super::diff::{Op, Transaction};
use super::elements::Packed;
use super::netlink::Fields;
use super::tables::{family_name, TABLE};
use crate::model::IpFamily;
use crate::netlink::*;
use elements::Shape;
use ipnetwork::IpNetwork;
use set::Declaration;
use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

/// Elements per message (one more when an interval's end would be the next), well inside
/// the socket's buffers.
const PER_MESSAGE: usize = 256;

/// Why a transaction could not be written as a batch; nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error(transparent)]
    Rule(#[from] rule::RuleError),
    #[error("cannot encode the declaration of {family} {TABLE} set {set} (`{decl}`): {why}")]
    Set {
        family: &'static str,
        set: String,
        decl: String,
        why: String,
    },
    #[error("cannot encode element `{element}` of {family} {TABLE} set {set}")]
    Element {
        family: &'static str,
        set: String,
        element: String,
    },
    #[error("base chain {chain}: cannot read its hook `{hook}`")]
    Hook { chain: String, hook: String },
}

/// An anonymous set a rule's `{ a, b }` list needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anonymous {
    pub id: u32,
    pub family: IpFamily,
    /// Whether the rule looks up the source address (else the destination).
    pub source: bool,
    pub networks: Vec<IpNetwork>,
}

/// What encoding one batch keeps track of: set ids, and how each set's keys are laid out.
#[derive(Debug, Default)]
pub struct Context {
    next_id: u32,
    /// Sets declared in this batch (and those the layout always has), by family and name.
    shapes: BTreeMap<(IpFamily, String), Shape>,
    family: Option<IpFamily>,
}

impl Context {
    fn id(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }

    /// A new anonymous set: its id, and the name the rule refers to it by.
    pub fn anonymous_set(&mut self) -> (u32, String) {
        (self.id(), "__set%d".to_string())
    }

    /// Whether lookups in `set` of the current family take ranges in a concatenation.
    pub fn ranged(&self, set: &str) -> bool {
        self.shape(self.family.unwrap_or(IpFamily::V4), set) == Shape::RangedConcat
    }

    fn shape(&self, family: IpFamily, set: &str) -> Shape {
        if let Some(s) = self.shapes.get(&(family, set.to_string())) {
            return *s;
        }
        // A set not declared in this batch already exists: its shape is the layout's.
        use super::skeleton::*;
        match set {
            SET_SERVICE_CIDRS | SET_NODEPORT_ADDRS => Shape::Intervals,
            SET_FIREWALL_ALLOW => Shape::RangedConcat,
            _ => Shape::Plain,
        }
    }
}

/// A batch being written, with what each message does for errors.
struct Writer {
    batch: Batch,
    about: Vec<String>,
    ctx: Context,
}

/// A key or value as [`Writer::elements`] takes it: nft's text, and its compact form if any.
trait AsPacked: fmt::Display {
    fn packed(&self) -> Option<&[u8]>;
}

impl AsPacked for Packed<'_> {
    fn packed(&self) -> Option<&[u8]> {
        Some(self.bytes())
    }
}

impl AsPacked for &str {
    fn packed(&self) -> Option<&[u8]> {
        None
    }
}

impl Writer {
    fn push(
        &mut self,
        msg: u16,
        flags: u16,
        family: IpFamily,
        about: String,
        attrs: impl FnOnce(&mut Attrs<'_>),
    ) {
        self.batch.push(msg, flags, nfproto(family), attrs);
        self.about.push(about);
    }

    /// `items` as messages of up to [`PER_MESSAGE`] elements each, encoded straight into
    /// the batch: at 10k x 10 a list of every element's bytes, and of the items, took 10 MB
    /// at the first sync's peak (heaptrack), freed right after.
    /// Each key and value is encoded from its compact form where it has one that holds only
    /// addresses, protocols, numbers and a `goto`, else from its text.
    fn elements<K: AsPacked, V: AsPacked>(
        &mut self,
        family: IpFamily,
        set: &str,
        items: impl Iterator<Item = (K, Option<V>)>,
        delete: bool,
    ) -> Result<(), EncodeError> {
        let layout = Fields::of(set, family);
        let shape = self.ctx.shape(family, set);
        let fam = family_name(family);
        let (msg, flags, verb) = if delete {
            (NFT_MSG_DELSETELEM, 0, "deleting")
        } else {
            (NFT_MSG_NEWSETELEM, NLM_F_CREATE, "adding")
        };
        // One message's NFTA_LIST_ELEMs, and how many.
        let mut pending = Vec::new();
        let mut count = 0;
        let flush = |w: &mut Writer, pending: &mut Vec<u8>, count: &mut usize| {
            if *count == 0 {
                return;
            }
            let about = format!("{verb} {count} elements of {fam} {TABLE} set {set}");
            w.push(msg, flags, family, about, |a| {
                a.str(NFTA_SET_ELEM_LIST_TABLE, TABLE);
                a.str(NFTA_SET_ELEM_LIST_SET, set);
                a.nest(NFTA_SET_ELEM_LIST_ELEMENTS, |l| l.raw(pending));
            });
            pending.clear();
            *count = 0;
        };
        let (mut key, mut value) = (String::new(), String::new());
        for (k, v) in items {
            let v = v.filter(|_| !delete);
            let compact = match (k.packed(), v.as_ref().map(AsPacked::packed)) {
                (Some(k), None) => Some((k, None)),
                (Some(k), Some(Some(v))) => Some((k, Some(v))),
                _ => None,
            };
            if let Some(n) = compact
                .and_then(|(k, v)| elements::encode_packed_into(&mut pending, k, v, shape, &layout))
            {
                count += n;
                if count >= PER_MESSAGE {
                    flush(self, &mut pending, &mut count);
                }
                continue;
            }
            key.clear();
            let _ = write!(key, "{k}");
            let v = v.map(|v| {
                value.clear();
                let _ = write!(value, "{v}");
                value.as_str()
            });
            let n = elements::encode_into(&mut pending, &key, v, shape, &layout, family)
                .ok_or_else(|| EncodeError::Element {
                    family: fam,
                    set: set.to_string(),
                    element: key.clone(),
                })?;
            // An interval's two halves go in one message: at most one over.
            count += n;
            if count >= PER_MESSAGE {
                flush(self, &mut pending, &mut count);
            }
        }
        flush(self, &mut pending, &mut count);
        Ok(())
    }

    fn anonymous(&mut self, anon: &Anonymous) {
        let family = anon.family;
        let (key_type, len) = match family {
            IpFamily::V4 => (7u32, 4u32),
            IpFamily::V6 => (8, 16),
        };
        // As nft: an end at the zero address first, unless a range starts there.
        let mut elements = Vec::new();
        if !anon
            .networks
            .iter()
            .any(|n| n.prefix() == 0 || n.network().is_unspecified())
        {
            elements.push(elements::interval_end(family));
        }
        elements.extend(anon.networks.iter().flat_map(elements::interval));
        let fam = family_name(family);
        self.push(
            NFT_MSG_NEWSET,
            NLM_F_CREATE,
            family,
            format!("adding an anonymous set to {fam} {TABLE}"),
            |a| {
                a.str(NFTA_SET_TABLE, TABLE);
                a.str(NFTA_SET_NAME, "__set%d");
                a.be32(
                    NFTA_SET_FLAGS,
                    NFT_SET_ANONYMOUS | NFT_SET_CONSTANT | NFT_SET_INTERVAL,
                );
                a.be32(NFTA_SET_KEY_TYPE, key_type);
                a.be32(NFTA_SET_KEY_LEN, len);
                a.nest(NFTA_SET_DESC, |d| {
                    d.be32(NFTA_SET_DESC_SIZE, elements.len() as u32)
                });
                a.be32(NFTA_SET_ID, anon.id);
                a.put(
                    NFTA_SET_USERDATA,
                    &set::anonymous_udata(family, anon.source),
                );
            },
        );
        self.push(
            NFT_MSG_NEWSETELEM,
            NLM_F_CREATE,
            family,
            format!("adding the elements of an anonymous set of {fam} {TABLE}"),
            |a| {
                a.str(NFTA_SET_ELEM_LIST_TABLE, TABLE);
                a.str(NFTA_SET_ELEM_LIST_SET, "__set%d");
                a.be32(NFTA_SET_ELEM_LIST_SET_ID, anon.id);
                a.nest(NFTA_SET_ELEM_LIST_ELEMENTS, |l| {
                    for e in &elements {
                        l.nest(NFTA_LIST_ELEM, |x| x.raw(e));
                    }
                });
            },
        );
    }

    fn op(&mut self, op: &Op) -> Result<(), EncodeError> {
        let family = op.family();
        let fam = family_name(family);
        self.ctx.family = Some(family);
        match op {
            Op::AddTable(_) => self.push(
                NFT_MSG_NEWTABLE,
                NLM_F_CREATE,
                family,
                format!("adding table {fam} {TABLE}"),
                |a| a.str(NFTA_TABLE_NAME, TABLE),
            ),
            Op::DeleteTable(_) => self.push(
                NFT_MSG_DELTABLE,
                0,
                family,
                format!("deleting table {fam} {TABLE}"),
                |a| a.str(NFTA_TABLE_NAME, TABLE),
            ),
            Op::AddSet { name, set, .. } => {
                let decl =
                    Declaration::parse(&set.decl, set.map).map_err(|why| EncodeError::Set {
                        family: fam,
                        set: name.clone(),
                        decl: set.decl.clone(),
                        why,
                    })?;
                let shape = match (decl.ranged_concat(), decl.flags() & NFT_SET_INTERVAL != 0) {
                    (true, _) => Shape::RangedConcat,
                    (false, true) => Shape::Intervals,
                    _ => Shape::Plain,
                };
                self.ctx.shapes.insert((family, name.clone()), shape);
                let id = self.ctx.id();
                self.push(
                    NFT_MSG_NEWSET,
                    NLM_F_CREATE,
                    family,
                    format!("adding set {name} to {fam} {TABLE}"),
                    |a| {
                        a.str(NFTA_SET_TABLE, TABLE);
                        a.str(NFTA_SET_NAME, name);
                        decl.write(a, id, &set.fingerprint);
                    },
                );
                self.elements(family, name, set.elements.iter(), false)?;
            }
            Op::AddChain { name, hook, .. } => {
                let hook = match hook {
                    Some(h) => Some(parse_hook(h).ok_or_else(|| EncodeError::Hook {
                        chain: name.clone(),
                        hook: h.clone(),
                    })?),
                    None => None,
                };
                self.push(
                    NFT_MSG_NEWCHAIN,
                    NLM_F_CREATE,
                    family,
                    format!("adding chain {name} to {fam} {TABLE}"),
                    |a| {
                        a.str(NFTA_CHAIN_TABLE, TABLE);
                        a.str(NFTA_CHAIN_NAME, name);
                        if let Some((kind, num, prio)) = hook {
                            a.str(NFTA_CHAIN_TYPE, kind);
                            a.be32(NFTA_CHAIN_POLICY, NF_ACCEPT as u32);
                            a.nest(NFTA_CHAIN_HOOK, |h| {
                                h.be32(NFTA_HOOK_HOOKNUM, num);
                                h.put(NFTA_HOOK_PRIORITY, &prio.to_be_bytes());
                            });
                        }
                    },
                );
            }
            Op::FlushChain { name, .. } => self.push(
                NFT_MSG_DELRULE,
                0,
                family,
                format!("flushing chain {name} of {fam} {TABLE}"),
                |a| {
                    a.str(NFTA_RULE_TABLE, TABLE);
                    a.str(NFTA_RULE_CHAIN, name);
                },
            ),
            Op::DeleteChain { name, .. } => self.push(
                NFT_MSG_DELCHAIN,
                0,
                family,
                format!("deleting chain {name} of {fam} {TABLE}"),
                |a| {
                    a.str(NFTA_CHAIN_TABLE, TABLE);
                    a.str(NFTA_CHAIN_NAME, name);
                },
            ),
            Op::AddRule { chain, rule, .. } => {
                let compiled = rule::compile(rule, family, &mut self.ctx)?;
                for anon in &compiled.anonymous {
                    self.anonymous(anon);
                }
                self.push(
                    NFT_MSG_NEWRULE,
                    NLM_F_CREATE | NLM_F_APPEND,
                    family,
                    format!("adding rule `{rule}` to chain {chain} of {fam} {TABLE}"),
                    |a| {
                        a.str(NFTA_RULE_TABLE, TABLE);
                        a.str(NFTA_RULE_CHAIN, chain);
                        a.nest(NFTA_RULE_EXPRESSIONS, |e| e.raw(&compiled.expressions));
                        if let Some(c) = &compiled.comment {
                            let mut u = set::Udata::default();
                            u.strz(0, c);
                            a.put(NFTA_RULE_USERDATA, &u.0);
                        }
                    },
                );
            }
            Op::AddElements { set, elements, .. } => {
                self.elements(family, set, elements.iter(), false)?;
            }
            Op::DeleteElements { set, keys, .. } => {
                let items = keys.iter().map(|k| (k.as_str(), None::<&str>));
                self.elements(family, set, items, true)?;
            }
            // As `nft flush set`: a deletion that names no element.
            Op::FlushSet { set, .. } => self.push(
                NFT_MSG_DELSETELEM,
                0,
                family,
                format!("flushing set {set} of {fam} {TABLE}"),
                |a| {
                    a.str(NFTA_SET_ELEM_LIST_TABLE, TABLE);
                    a.str(NFTA_SET_ELEM_LIST_SET, set);
                },
            ),
        }
        Ok(())
    }
}

/// `type nat hook prerouting priority -100; policy accept;` to its type, hook number and
/// priority.
fn parse_hook(hook: &str) -> Option<(&str, u32, i32)> {
    let words: Vec<&str> = hook
        .split(|c: char| c.is_whitespace() || c == ';')
        .filter(|w| !w.is_empty())
        .collect();
    let ["type", kind, "hook", name, "priority", prio, "policy", "accept"] = words[..] else {
        return None;
    };
    let num = ["prerouting", "input", "forward", "output", "postrouting"]
        .iter()
        .position(|h| *h == name)? as u32;
    Some((kind, num, prio.parse().ok()?))
}

/// The batch of `tx`, with what each of its messages does.
pub fn encode(tx: &Transaction) -> Result<(Batch, Vec<String>), EncodeError> {
    let mut w = Writer {
        batch: Batch::new(),
        about: Vec::new(),
        ctx: Context::default(),
    };
    for op in &tx.ops {
        w.op(op)?;
    }
    Ok((w.batch, w.about))
}

/// Why a commit failed: the transaction could not be encoded (nothing was sent), or the
/// kernel refused the batch (which then changed nothing).
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
}

/// Commits `tx` as one batch, all or nothing, on `socket` (see [`Batch::commit_on`]).
pub fn commit_on(tx: &Transaction, socket: &mut Socket) -> Result<(), CommitError> {
    let (batch, about) = encode(tx)?;
    if batch.is_empty() {
        return Ok(());
    }
    let what = format!("nftables batch of {} operations", tx.ops.len());
    let about = |i: usize| about.get(i).cloned().unwrap_or_default();
    batch.commit_on(socket, &what, &about)?;
    Ok(())
}
