//! One rule of our layout, written as nft text, to the nf_tables expressions nft 1.0.6
//! writes for it, register for register, so that `nft list` prints the rule we meant.
//!
//! The grammar is closed: only the statements [`super::super::skeleton`] writes. A rule
//! outside it is an error naming the rule, never a guess.

use super::super::tables::family_name;
use super::{Anonymous, Context};
use crate::model::IpFamily;
use crate::netlink::expr::{Expressions, Verdict};
use crate::netlink::*;
use ipnetwork::IpNetwork;
use std::net::IpAddr;

/// Why a rule could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot encode rule `{rule}`: {why}")]
pub struct RuleError {
    pub rule: String,
    pub why: String,
}

/// A rule's expressions (the NFTA_RULE_EXPRESSIONS payload), its comment and the anonymous
/// sets its `{ .. }` lists need, created before it in the same batch.
#[derive(Debug, Default)]
pub struct Compiled {
    pub expressions: Vec<u8>,
    pub comment: Option<String>,
    pub anonymous: Vec<Anonymous>,
}

/// One value loaded into the registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Atom {
    Saddr,
    Daddr,
    L4proto,
    ThDport,
    CtOriginalDaddr,
    CtOriginalProtoDst,
    /// `numgen random mod N`.
    Numgen(u32),
}

impl Atom {
    fn len(self, family: IpFamily) -> u32 {
        match self {
            Atom::Saddr | Atom::Daddr | Atom::CtOriginalDaddr => addr_len(family),
            Atom::L4proto => 1,
            Atom::ThDport | Atom::CtOriginalProtoDst => 2,
            Atom::Numgen(_) => 4,
        }
    }
}

fn addr_len(family: IpFamily) -> u32 {
    match family {
        IpFamily::V4 => 4,
        IpFamily::V6 => 16,
    }
}

/// The register of 32-bit slot `slot`, numbered as nft numbers it: a slot on a 16-byte
/// boundary by its 128-bit register, any other by its 32-bit one.
pub fn register(slot: u32) -> u32 {
    if slot.is_multiple_of(4) {
        NFT_REG_1 + slot / 4
    } else {
        8 + slot
    }
}

/// Splits rule text into words, dropping list commas. Our quoted strings (interface names,
/// comments) hold no spaces.
fn words(rule: &str) -> Vec<&str> {
    rule.split_whitespace()
        .map(|w| w.strip_suffix(',').unwrap_or(w))
        .filter(|w| !w.is_empty())
        .collect()
}

struct Parser<'r, 'c> {
    rule: &'r str,
    words: Vec<&'r str>,
    at: usize,
    family: IpFamily,
    ctx: &'c mut Context,
    out: Compiled,
}

type Step<T> = Result<T, String>;

impl<'r> Parser<'r, '_> {
    fn peek(&self) -> Option<&'r str> {
        self.words.get(self.at).copied()
    }
    fn peek_at(&self, n: usize) -> Option<&'r str> {
        self.words.get(self.at + n).copied()
    }
    fn next(&mut self) -> Step<&'r str> {
        let w = self.peek().ok_or("the rule ends too early")?;
        self.at += 1;
        Ok(w)
    }
    fn expect(&mut self, word: &str) -> Step<()> {
        match self.next()? {
            w if w == word => Ok(()),
            w => Err(format!("expected `{word}`, found `{w}`")),
        }
    }
    fn e(&mut self) -> Attrs<'_> {
        Attrs(&mut self.out.expressions)
    }

    fn statement(&mut self) -> Step<()> {
        let fam = family_name(self.family);
        match self.peek().ok_or("empty rule")? {
            "ct" if matches!(self.peek_at(1), Some("state" | "status")) => {
                self.at += 1;
                let (key, value) = match (self.next()?, self.next()?) {
                    ("state", "new") => (NFT_CT_STATE, 8u32),
                    ("status", "dnat") => (NFT_CT_STATUS, 0x20u32),
                    (k, v) => return Err(format!("unknown ct match `ct {k} {v}`")),
                };
                let mut e = self.e();
                e.ct(key, None, NFT_REG_1);
                e.bitwise(NFT_REG_1, &value.to_ne_bytes(), &[0; 4]);
                e.cmp(NFT_REG_1, NFT_CMP_NEQ, &[0; 4]);
            }
            "meta" if self.peek_at(1) == Some("l4proto") && proto(self.peek_at(2)).is_some() => {
                self.at += 2;
                let p = proto(Some(self.next()?)).unwrap_or_default();
                let mut e = self.e();
                e.meta(NFT_META_L4PROTO, NFT_REG_1);
                e.cmp(NFT_REG_1, NFT_CMP_EQ, &[p]);
            }
            "meta" if self.peek_at(1) == Some("mark") => self.mark()?,
            "fib" => {
                self.at += 1;
                let flag = match self.next()? {
                    "daddr" => NFT_FIB_F_DADDR,
                    "saddr" => NFT_FIB_F_SADDR,
                    w => return Err(format!("unknown fib address `{w}`")),
                };
                self.expect("type")?;
                self.expect("local")?;
                let mut e = self.e();
                e.fib(flag, NFT_REG_1);
                // RTN_LOCAL, in host order as the kernel stores it.
                e.cmp(NFT_REG_1, NFT_CMP_EQ, &2u32.to_ne_bytes());
            }
            "iifname" => {
                self.at += 1;
                let op = self.negation();
                let name = self.next()?;
                let name = name
                    .strip_prefix('"')
                    .and_then(|n| n.strip_suffix('"'))
                    .ok_or_else(|| format!("interface name `{name}` is not quoted"))?;
                let bytes = match name.strip_suffix('*') {
                    // Any name: a comparison of nothing, which the kernel refuses.
                    Some("") => return Err("an empty interface prefix matches every name".into()),
                    Some(prefix) => prefix.as_bytes().to_vec(),
                    None => {
                        let mut b = name.as_bytes().to_vec();
                        if b.len() >= 16 {
                            return Err(format!("interface name `{name}` is too long"));
                        }
                        b.resize(16, 0);
                        b
                    }
                };
                let mut e = self.e();
                e.meta(NFT_META_IIFNAME, NFT_REG_1);
                e.cmp(NFT_REG_1, op, &bytes);
            }
            "jump" | "goto" => {
                let kind = self.next()?;
                let chain = self.next()?;
                let v = if kind == "jump" {
                    Verdict::Jump(chain)
                } else {
                    Verdict::Goto(chain)
                };
                self.e().verdict(v);
            }
            "return" | "drop" | "accept" => {
                let v = match self.next()? {
                    "return" => Verdict::Return,
                    "drop" => Verdict::Drop,
                    _ => Verdict::Accept,
                };
                self.e().verdict(v);
            }
            "reject" => {
                self.at += 1;
                // Port unreachable: ICMP_PORT_UNREACH, ICMPV6_PORT_UNREACH.
                let code = match self.family {
                    IpFamily::V4 => 3,
                    IpFamily::V6 => 4,
                };
                self.e().reject(NFT_REJECT_ICMP_UNREACH, code);
            }
            "masquerade" => {
                self.at += 1;
                self.expect("fully-random")?;
                self.e().masq(NF_NAT_RANGE_PROTO_RANDOM_FULLY);
            }
            "update" => self.update()?,
            "dnat" => {
                self.at += 1;
                self.expect(fam)?;
                self.expect("to")?;
                let atoms = self.concatenation()?;
                self.expect("map")?;
                let set = self.set_name()?;
                self.load(&atoms, false);
                let family = self.family;
                let mut e = self.e();
                e.lookup(&set, NFT_REG_1, Some(NFT_REG_1), None, false);
                e.dnat(family, NFT_REG_1, register(addr_len(family) / 4));
            }
            "comment" => {
                self.at += 1;
                let text = self.next()?;
                let text = text
                    .strip_prefix('"')
                    .and_then(|t| t.strip_suffix('"'))
                    .ok_or_else(|| format!("comment `{text}` is not quoted"))?;
                self.out.comment = Some(text.to_string());
            }
            _ => self.matching()?,
        }
        Ok(())
    }

    /// `!=` before a value, or nothing.
    fn negation(&mut self) -> u32 {
        if self.peek() == Some("!=") {
            self.at += 1;
            NFT_CMP_NEQ
        } else {
            NFT_CMP_EQ
        }
    }

    fn set_name(&mut self) -> Step<String> {
        let w = self.next()?;
        w.strip_prefix('@')
            .map(str::to_string)
            .ok_or_else(|| format!("expected a named set, found `{w}`"))
    }

    /// `meta mark set meta mark | X`, `... ^ X` and `meta mark & X == 0`.
    fn mark(&mut self) -> Step<()> {
        self.at += 2;
        let number = |w: &str| {
            u32::from_str_radix(w.trim_start_matches("0x"), 16)
                .map_err(|_| format!("mark `{w}` is not hexadecimal"))
        };
        match self.next()? {
            "set" => {
                self.expect("meta")?;
                self.expect("mark")?;
                let op = self.next()?;
                let bits = number(self.next()?)?;
                let (mask, xor) = match op {
                    "|" => (!bits, bits),
                    "^" => (u32::MAX, bits),
                    w => return Err(format!("unknown mark operation `{w}`")),
                };
                let mut e = self.e();
                e.meta(NFT_META_MARK, NFT_REG_1);
                e.bitwise(NFT_REG_1, &mask.to_ne_bytes(), &xor.to_ne_bytes());
                e.meta_set(NFT_META_MARK, NFT_REG_1);
            }
            "&" => {
                let bits = number(self.next()?)?;
                self.expect("==")?;
                self.expect("0")?;
                let mut e = self.e();
                e.meta(NFT_META_MARK, NFT_REG_1);
                e.bitwise(NFT_REG_1, &bits.to_ne_bytes(), &[0; 4]);
                e.cmp(NFT_REG_1, NFT_CMP_EQ, &[0; 4]);
            }
            w => return Err(format!("unknown mark statement `meta mark {w}`")),
        }
        Ok(())
    }

    /// `update @set { KEY timeout Ns : DATA }`.
    fn update(&mut self) -> Step<()> {
        self.at += 1;
        let set = self.set_name()?;
        self.expect("{")?;
        let key = self.concatenation()?;
        self.expect("timeout")?;
        let t = self.next()?;
        let secs: u64 = t
            .strip_suffix('s')
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("timeout `{t}` is not in seconds"))?;
        self.expect(":")?;
        let data = self.concatenation()?;
        self.expect("}")?;
        let data_slot = self.load(&key, false);
        self.load_from(&data, data_slot, false);
        self.e().dynset_update(
            &set,
            NFT_REG_1,
            register(data_slot),
            secs.saturating_mul(1000),
        );
        Ok(())
    }

    /// An atom: `ip daddr`, `meta l4proto`, `th dport`, `ct original ...`, `numgen ...`.
    fn atom(&mut self) -> Step<Atom> {
        let fam = family_name(self.family);
        let w = self.next()?;
        Ok(match w {
            _ if w == fam => match self.next()? {
                "saddr" => Atom::Saddr,
                "daddr" => Atom::Daddr,
                f => return Err(format!("unknown address field `{fam} {f}`")),
            },
            "meta" => {
                self.expect("l4proto")?;
                Atom::L4proto
            }
            "th" => {
                self.expect("dport")?;
                Atom::ThDport
            }
            "ct" => {
                self.expect("original")?;
                match self.next()? {
                    "proto-dst" => Atom::CtOriginalProtoDst,
                    f if f == fam => {
                        self.expect("daddr")?;
                        Atom::CtOriginalDaddr
                    }
                    f => return Err(format!("unknown conntrack field `ct original {f}`")),
                }
            }
            "numgen" => {
                self.expect("random")?;
                self.expect("mod")?;
                let n = self.next()?;
                Atom::Numgen(n.parse().map_err(|_| format!("modulus `{n}`"))?)
            }
            w => return Err(format!("unknown expression `{w}`")),
        })
    }

    /// `A . B . C`: atoms joined by `.`.
    fn concatenation(&mut self) -> Step<Vec<Atom>> {
        let mut atoms = vec![self.atom()?];
        while self.peek() == Some(".") {
            self.at += 1;
            atoms.push(self.atom()?);
        }
        Ok(atoms)
    }

    /// Loads `atoms` into consecutive registers from slot 0; the slot after them.
    fn load(&mut self, atoms: &[Atom], ranged: bool) -> u32 {
        self.load_from(atoms, 0, ranged)
    }

    /// `ranged`: the key of a set with ranges in a concatenation, where nft puts the
    /// protocol number through a (one-byte, so empty) byte-order conversion.
    fn load_from(&mut self, atoms: &[Atom], mut slot: u32, ranged: bool) -> u32 {
        let family = self.family;
        let (saddr, daddr) = match family {
            IpFamily::V4 => (12, 16),
            IpFamily::V6 => (8, 24),
        };
        let mut e = Attrs(&mut self.out.expressions);
        for atom in atoms {
            let reg = register(slot);
            let len = atom.len(family);
            match atom {
                Atom::Saddr => e.payload(NFT_PAYLOAD_NETWORK_HEADER, saddr, len, reg),
                Atom::Daddr => e.payload(NFT_PAYLOAD_NETWORK_HEADER, daddr, len, reg),
                Atom::ThDport => e.payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, reg),
                Atom::L4proto => {
                    e.meta(NFT_META_L4PROTO, reg);
                    if ranged {
                        e.byteorder_hton(reg, 2, 1);
                    }
                }
                Atom::CtOriginalDaddr => {
                    let key = match family {
                        IpFamily::V4 => NFT_CT_DST_IP,
                        IpFamily::V6 => NFT_CT_DST_IP6,
                    };
                    e.ct(key, Some(0), reg);
                }
                Atom::CtOriginalProtoDst => e.ct(NFT_CT_PROTO_DST, Some(0), reg),
                Atom::Numgen(n) => e.numgen(*n, reg),
            }
            slot += len.div_ceil(4);
        }
        slot
    }

    /// A match on loaded values: `X . Y vmap @m`, `X . Y @s`, `X . Y != @s`, `X [!=] value`
    /// and `X [!=] { a, b }`.
    fn matching(&mut self) -> Step<()> {
        let atoms = self.concatenation()?;
        match self.peek() {
            Some("vmap") => {
                self.at += 1;
                let set = self.set_name()?;
                self.load(&atoms, false);
                self.e()
                    .lookup(&set, NFT_REG_1, Some(NFT_REG_VERDICT), None, false);
                return Ok(());
            }
            Some(w) if w.starts_with('@') => {
                let set = self.set_name()?;
                let ranged = self.ctx.ranged(&set);
                self.load(&atoms, ranged);
                self.e().lookup(&set, NFT_REG_1, None, None, false);
                return Ok(());
            }
            _ => {}
        }
        let op = self.negation();
        if self.peek().is_some_and(|w| w.starts_with('@')) {
            let set = self.set_name()?;
            let ranged = self.ctx.ranged(&set);
            self.load(&atoms, ranged);
            self.e()
                .lookup(&set, NFT_REG_1, None, None, op == NFT_CMP_NEQ);
            return Ok(());
        }
        let [atom] = atoms[..] else {
            return Err("a concatenation compared with a value".into());
        };
        let offset = match (atom, self.family) {
            (Atom::Saddr, IpFamily::V4) => 12,
            (Atom::Daddr, IpFamily::V4) => 16,
            (Atom::Saddr, IpFamily::V6) => 8,
            (Atom::Daddr, IpFamily::V6) => 24,
            _ => return Err("only addresses are compared with values".into()),
        };
        if self.peek() == Some("{") {
            self.at += 1;
            let mut nets = Vec::new();
            while self.peek() != Some("}") {
                nets.push(self.network()?);
            }
            self.at += 1;
            let (id, name) = self.ctx.anonymous_set();
            self.out.anonymous.push(Anonymous {
                id,
                family: self.family,
                source: atom == Atom::Saddr,
                networks: nets,
            });
            let len = addr_len(self.family);
            let mut e = self.e();
            e.payload(NFT_PAYLOAD_NETWORK_HEADER, offset, len, NFT_REG_1);
            e.lookup(&name, NFT_REG_1, None, Some(id), op == NFT_CMP_NEQ);
            return Ok(());
        }
        let net = self.network()?;
        self.compare_prefix(offset, net, op);
        Ok(())
    }

    fn network(&mut self) -> Step<IpNetwork> {
        let w = self.next()?;
        let net: IpNetwork = w.parse().map_err(|_| format!("`{w}` is not an address"))?;
        match (net.ip(), self.family) {
            (IpAddr::V4(_), IpFamily::V4) | (IpAddr::V6(_), IpFamily::V6) => Ok(net),
            _ => Err(format!("`{w}` is not an {} address", self.family)),
        }
    }

    fn compare_prefix(&mut self, offset: u32, net: IpNetwork, op: u32) {
        let bytes = match net.network() {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        self.e()
            .prefix_match(offset, &bytes, u32::from(net.prefix()), op);
    }
}

fn proto(w: Option<&str>) -> Option<u8> {
    match w? {
        "tcp" => Some(6),
        "udp" => Some(17),
        "sctp" => Some(132),
        _ => None,
    }
}

/// The expressions of `rule` in a table of `family`.
pub fn compile(rule: &str, family: IpFamily, ctx: &mut Context) -> Result<Compiled, RuleError> {
    let mut p = Parser {
        rule,
        words: words(rule),
        at: 0,
        family,
        ctx,
        out: Compiled::default(),
    };
    while p.peek().is_some() {
        if let Err(why) = p.statement() {
            return Err(RuleError {
                rule: p.rule.to_string(),
                why,
            });
        }
    }
    Ok(p.out)
}
