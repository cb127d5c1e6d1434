//! New iptables-nft chains written straight over nf_tables netlink, each rule encoded byte
//! for byte as iptables-nft-restore 1.8.9 encodes it, so that iptables-nft-save,
//! `iptables-nft -L/-D` and later restores find exactly what a restore would have left.
//!
//! Why: at 10k services x 10 endpoints iptables-nft-restore spends about 6 s of a cold load
//! in userspace, most of it walking 512-bucket hash tables of chain names in which every
//! new chain misses; the kernel's share is about 4.5 s. Only the rule shapes our layout
//! writes into endpoint and service chains are encoded (addresses, protocol, `-m tcp/udp`
//! with or without `--dport`, comments, `-m statistic` random, jumps, DNAT to an address
//! and port, MARK `--or-mark`); [`super::rule_parse`] reads them, its
//! [`encodable`](super::rule_parse::encodable) says which, and any other rule leaves its
//! chain to the restore. The `nftables` crate drives `nft`, which cannot write xtables
//! matches and targets, so this writes the messages itself and commits them as one
//! [`crate::netlink::Batch`].

use super::plan::TableName;
use super::rule_parse::{parse, Addr, Match, Rule, Target};
use crate::model::IpFamily;
use crate::netlink::expr::{Expressions, Verdict};
use crate::netlink::*;

/// Why a direct write failed.
#[derive(Debug, thiserror::Error)]
pub enum DirectError {
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
}

/// An IPv4 address match as iptables-nft writes it, at `offset` of the network header.
fn addr(e: &mut Attrs<'_>, offset: u32, a: Addr) {
    let op = if a.negated { NFT_CMP_NEQ } else { NFT_CMP_EQ };
    e.prefix_match(offset, &a.ip.octets(), u32::from(a.prefix), op);
}

fn xt_ports() -> [u8; 16] {
    // xt_tcp / xt_udp: every source and destination port, no flags, padded to 16.
    [0, 0, 0xff, 0xff, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0]
}

/// Chains created and rules appended in one nf_tables transaction.
pub struct Batch {
    batch: crate::netlink::Batch,
    steps: Steps,
    index: std::collections::HashMap<String, u32>,
    pub chains: usize,
    pub rules: usize,
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Chain(u32),
    Rule(u32),
}

/// What each message after the table's does (a chain created, or a rule appended to one),
/// so that an error can name it.
struct Steps {
    table: &'static str,
    steps: Vec<Step>,
    names: Vec<String>,
}

/// A batch ready to send, with what each of its messages does.
pub struct Finished {
    batch: crate::netlink::Batch,
    steps: Steps,
    pub chains: usize,
}

impl Steps {
    /// What the batch's message `i` does, for an error.
    fn about(&self, i: usize) -> String {
        let name = |n: u32| self.names.get(n as usize).map_or("?", String::as_str);
        match i.checked_sub(1).and_then(|k| self.steps.get(k)) {
            Some(Step::Chain(n)) => format!("table {} chain {}: creating it", self.table, name(*n)),
            Some(Step::Rule(n)) => {
                format!("table {} chain {}: appending a rule", self.table, name(*n))
            }
            None => format!("table {}", self.table),
        }
    }
}

impl Batch {
    /// A batch for `table` of `family`; only IPv4 is encoded.
    pub fn new(family: IpFamily, table: TableName) -> Result<Batch, DirectError> {
        if family != IpFamily::V4 {
            return Err(DirectError::Unsupported(format!(
                "{family}: only IPv4 rules are written directly"
            )));
        }
        let mut batch = crate::netlink::Batch::new();
        let table = table.as_str();
        // As iptables-nft does: the table, created if missing (a node's first start).
        batch.push(NFT_MSG_NEWTABLE, NLM_F_CREATE, NFPROTO_IPV4, |a| {
            a.str(NFTA_TABLE_NAME, table)
        });
        Ok(Batch {
            batch,
            steps: Steps {
                table,
                steps: Vec::new(),
                names: Vec::new(),
            },
            index: Default::default(),
            chains: 0,
            rules: 0,
        })
    }

    /// Creates `chain`, which must not exist.
    pub fn chain(&mut self, chain: &str) {
        let table = self.steps.table;
        self.batch
            .push(NFT_MSG_NEWCHAIN, NLM_F_EXCL, NFPROTO_IPV4, |a| {
                a.str(NFTA_CHAIN_TABLE, table);
                a.str(NFTA_CHAIN_NAME, chain);
            });
        let i = self.steps.names.len() as u32;
        self.steps.names.push(chain.to_string());
        self.index.insert(chain.to_string(), i);
        self.steps.steps.push(Step::Chain(i));
        self.chains += 1;
    }

    /// Appends `rule` to `chain`; false, writing nothing, when it is not
    /// [`encodable`](super::rule_parse::encodable).
    pub fn rule(&mut self, chain: &str, rule: &str) -> bool {
        let Some(r) = parse(rule) else {
            return false;
        };
        let table = self.steps.table;
        let flags = NLM_F_CREATE | NLM_F_APPEND;
        self.batch.push(NFT_MSG_NEWRULE, flags, NFPROTO_IPV4, |a| {
            a.str(NFTA_RULE_TABLE, table);
            a.str(NFTA_RULE_CHAIN, chain);
            a.nest(NFTA_RULE_EXPRESSIONS, |e| expressions(e, &r));
            a.nest(NFTA_RULE_COMPAT, |c| {
                c.be32(NFTA_RULE_COMPAT_PROTO, u32::from(r.proto.unwrap_or(0)));
                c.be32(NFTA_RULE_COMPAT_FLAGS, 0);
            });
        });
        let i = self.index.get(chain).copied().unwrap_or(u32::MAX);
        self.steps.steps.push(Step::Rule(i));
        self.rules += 1;
        true
    }

    /// The batch, ready to send.
    pub fn finish(self) -> Finished {
        Finished {
            batch: self.batch,
            steps: self.steps,
            chains: self.chains,
        }
    }
}

/// iptables-nft's order: protocol, source, destination, the matches as written, a
/// counter, the target.
fn expressions(e: &mut Attrs<'_>, r: &Rule<'_>) {
    if let Some(p) = r.proto {
        e.meta(NFT_META_L4PROTO, NFT_REG_1);
        e.cmp(NFT_REG_1, NFT_CMP_EQ, &[p]);
    }
    if let Some(s) = r.src {
        addr(e, 12, s);
    }
    if let Some(d) = r.dst {
        addr(e, 16, d);
    }
    for m in &r.matches {
        match m {
            Match::Port {
                dport: Some(port), ..
            } => {
                // The destination port: two bytes at offset 2 of the transport header.
                e.payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, NFT_REG_1);
                e.cmp(NFT_REG_1, NFT_CMP_EQ, &port.to_be_bytes());
            }
            Match::Port { name, dport: None } => e.xt("match", name, 0, &xt_ports()),
            Match::Comment(c) => {
                let mut info = [0u8; 256];
                info[..c.len()].copy_from_slice(c.as_bytes());
                e.xt("match", "comment", 0, &info);
            }
            Match::Random { probability, .. } => {
                // xt_statistic_info: mode, flags, then every (= the probability),
                // packet, count (iptables sets every - packet), and the kernel's pointer.
                let p = probability.unwrap_or(0);
                let mut info = [0u8; 24];
                info[4..8].copy_from_slice(&p.to_ne_bytes());
                info[12..16].copy_from_slice(&p.to_ne_bytes());
                e.xt("match", "statistic", 0, &info);
            }
        }
    }
    e.expr("counter", |a| {
        a.put(NFTA_COUNTER_BYTES, &0u64.to_be_bytes());
        a.put(NFTA_COUNTER_PACKETS, &0u64.to_be_bytes());
    });
    match r.target {
        Target::Jump(chain) => e.verdict(Verdict::Jump(chain)),
        Target::Dnat(ip, port) => {
            // nf_nat_range2: flags (MAP_IPS | PROTO_SPECIFIED), the address range, the
            // port range and a base port, padded to 48.
            let mut info = [0u8; 48];
            info[0..4].copy_from_slice(&3u32.to_ne_bytes());
            info[4..8].copy_from_slice(&ip.octets());
            info[20..24].copy_from_slice(&ip.octets());
            info[36..38].copy_from_slice(&port.to_be_bytes());
            info[38..40].copy_from_slice(&port.to_be_bytes());
            e.xt("target", "DNAT", 2, &info);
        }
        Target::OrMark(m) => {
            // xt_mark_tginfo2: `--or-mark m` is mark m, mask m.
            let mut info = [0u8; 8];
            info[0..4].copy_from_slice(&m.to_ne_bytes());
            info[4..8].copy_from_slice(&m.to_ne_bytes());
            e.xt("target", "MARK", 2, &info);
        }
    }
}

/// Commits `batch` (see [`crate::netlink::Batch::commit`]); a refusal names the chain.
pub fn send(batch: Finished) -> Result<(), DirectError> {
    let what = format!("batch creating {} chains", batch.chains);
    let steps = batch.steps;
    Ok(batch.batch.commit(&what, &|i| steps.about(i))?)
}

/// Every rule of `table`, per chain in order, as the kernel dumps its expressions (the
/// match and target payloads included, which neither `nft --debug` nor iptables-save
/// shows whole): what a direct write is checked against a restore with.
pub fn dump_expressions(
    family: IpFamily,
    table: TableName,
) -> Result<std::collections::BTreeMap<String, Vec<Vec<u8>>>, DirectError> {
    if family != IpFamily::V4 {
        return Err(DirectError::Unsupported(format!("{family}: IPv4 only")));
    }
    let mut attrs = Vec::new();
    Attrs(&mut attrs).str(NFTA_RULE_TABLE, table.as_str());
    let dump = Request::nfnl(
        NFNL_SUBSYS_NFTABLES,
        NFT_MSG_GETRULE,
        NLM_F_DUMP,
        NFPROTO_IPV4,
        &attrs,
    );
    let replies = Socket::open(NETLINK_NETFILTER, "nfnetlink")?.request("rules", &dump)?;
    let mut out: std::collections::BTreeMap<String, Vec<Vec<u8>>> = Default::default();
    for body in replies {
        let chain = find(&body, NFTA_RULE_CHAIN).map(text).unwrap_or_default();
        let exprs = find(&body, NFTA_RULE_EXPRESSIONS)
            .unwrap_or_default()
            .to_vec();
        out.entry(chain).or_default().push(exprs);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jump_rule_is_encoded_as_iptables_nft_encodes_it() {
        // The expressions of `-s 10.0.0.1/32 -j KUBE-MARK-MASQ` as iptables-nft-restore
        // 1.8.9 sent them (strace of its batch).
        let want: &[u8] = b"\x34\x00\x01\x80\x0c\x00\x01\x00payload\x00\x24\x00\x02\x80\x08\x00\x01\x00\x00\x00\x00\x01\x08\x00\x02\x00\x00\x00\x00\x01\x08\x00\x03\x00\x00\x00\x00\x0c\x08\x00\x04\x00\x00\x00\x00\x04\x2c\x00\x01\x80\x08\x00\x01\x00cmp\x00\x20\x00\x02\x80\x08\x00\x01\x00\x00\x00\x00\x01\x08\x00\x02\x00\x00\x00\x00\x00\x0c\x00\x03\x80\x08\x00\x01\x00\x0a\x00\x00\x01\x2c\x00\x01\x80\x0c\x00\x01\x00counter\x00\x1c\x00\x02\x80\x0c\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x0c\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x44\x00\x01\x80\x0e\x00\x01\x00immediate\x00\x00\x00\x30\x00\x02\x80\x08\x00\x01\x00\x00\x00\x00\x00\x24\x00\x02\x80\x20\x00\x02\x80\x08\x00\x01\x00\xff\xff\xff\xfd\x13\x00\x02\x00KUBE-MARK-MASQ\x00\x00";
        let r = parse("-s 10.0.0.1/32 -j KUBE-MARK-MASQ").unwrap();
        let mut got = Vec::new();
        expressions(&mut Attrs(&mut got), &r);
        assert_eq!(got, want);
    }
}
