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
//! matches and targets, so this speaks netlink itself (netlink-sys's socket, as the nft
//! reader does).

use super::render::TableName;
use super::rule_parse::{parse, Addr, Match, Rule, Target};
use crate::model::IpFamily;
use crate::nft::netlink::{
    NFNL_SUBSYS_NFTABLES, NFT_MSG_GETRULE, NLMSG_ERROR, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLA_F_NESTED: u16 = 0x8000;
const AF_INET: u8 = 2;
const NFT_JUMP: u32 = 0xffff_fffd;

/// Why a direct write failed.
#[derive(Debug, thiserror::Error)]
pub enum DirectError {
    #[error("nf_tables netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("nf_tables refused the batch creating {chains} chains, at {what}: {source}")]
    Refused {
        chains: usize,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Read(#[from] crate::nft::netlink::NetlinkError),
}

/// Netlink attributes, appended to a buffer.
struct Attrs<'b>(&'b mut Vec<u8>);

impl Attrs<'_> {
    fn put(&mut self, ty: u16, payload: &[u8]) {
        let len = 4 + payload.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&ty.to_ne_bytes());
        self.0.extend_from_slice(payload);
        self.pad();
    }
    fn pad(&mut self) {
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
    }
    fn str(&mut self, ty: u16, s: &str) {
        let mut v = Vec::with_capacity(s.len() + 1);
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        self.put(ty, &v);
    }
    fn u32(&mut self, ty: u16, v: u32) {
        self.put(ty, &v.to_be_bytes());
    }
    fn nest(&mut self, ty: u16, f: impl FnOnce(&mut Attrs<'_>)) {
        let at = self.0.len();
        self.0.extend_from_slice(&[0, 0]);
        self.0.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        f(&mut Attrs(self.0));
        let len = (self.0.len() - at) as u16;
        self.0[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }
    /// One expression: NFTA_LIST_ELEM { NFTA_EXPR_NAME, NFTA_EXPR_DATA { .. } }.
    fn expr(&mut self, name: &str, f: impl FnOnce(&mut Attrs<'_>)) {
        self.nest(1, |e| {
            e.str(1, name);
            e.nest(2, f);
        });
    }
    fn payload(&mut self, base: u32, offset: u32, len: u32) {
        self.expr("payload", |a| {
            a.u32(1, 1);
            a.u32(2, base);
            a.u32(3, offset);
            a.u32(4, len);
        });
    }
    fn cmp(&mut self, op: u32, value: &[u8]) {
        self.expr("cmp", |a| {
            a.u32(1, 1);
            a.u32(2, op);
            a.nest(3, |d| d.put(1, value));
        });
    }
    fn xt(&mut self, kind: &str, name: &str, rev: u32, info: &[u8]) {
        self.expr(kind, |a| {
            a.str(1, name);
            a.u32(2, rev);
            a.put(3, info);
        });
    }
    fn addr(&mut self, offset: u32, a: Addr) {
        let op = u32::from(a.negated);
        let octets = a.ip.octets();
        if a.prefix.is_multiple_of(8) {
            let n = usize::from(a.prefix / 8);
            self.payload(1, offset, n as u32);
            self.cmp(op, &octets[..n]);
        } else {
            let mask = (u32::MAX << (32 - u32::from(a.prefix))).to_be_bytes();
            self.payload(1, offset, 4);
            self.expr("bitwise", |b| {
                b.u32(1, 1);
                b.u32(2, 1);
                b.u32(3, 4);
                b.nest(4, |d| d.put(1, &mask));
                b.nest(5, |d| d.put(1, &[0; 4]));
            });
            let masked: Vec<u8> = octets.iter().zip(mask).map(|(o, m)| o & m).collect();
            self.cmp(op, &masked);
        }
    }
}

fn xt_ports() -> [u8; 16] {
    // xt_tcp / xt_udp: every source and destination port, no flags, padded to 16.
    [0, 0, 0xff, 0xff, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0]
}

/// An nf_tables batch creating chains and appending rules, in one transaction.
pub struct Batch {
    buf: Vec<u8>,
    seq: u32,
    family: u8,
    table: &'static str,
    /// Where the last message starts (its flags get the acknowledgement request).
    last: usize,
    /// What each message after the table's does, by sequence number from `first`: a
    /// chain created, or a rule appended to one (so that an error can name it).
    first: u32,
    steps: Vec<Step>,
    names: Vec<String>,
    index: std::collections::HashMap<String, u32>,
    pub chains: usize,
    pub rules: usize,
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Chain(u32),
    Rule(u32),
}

/// A closed batch: its bytes, the message whose acknowledgement says it committed, and
/// what each message does.
pub struct Finished {
    bytes: Vec<u8>,
    ack: u32,
    table: &'static str,
    first: u32,
    steps: Vec<Step>,
    names: Vec<String>,
    pub chains: usize,
}

impl Finished {
    /// The object message `seq` was about, for an error.
    fn what(&self, seq: u32) -> String {
        let name = |i: u32| self.names.get(i as usize).map_or("?", String::as_str);
        match seq
            .checked_sub(self.first)
            .and_then(|k| self.steps.get(k as usize))
        {
            Some(Step::Chain(i)) => format!("table {} chain {}: creating it", self.table, name(*i)),
            Some(Step::Rule(i)) => {
                format!("table {} chain {}: appending a rule", self.table, name(*i))
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
        let mut b = Batch {
            buf: Vec::new(),
            seq: 0,
            family: AF_INET,
            table: table.as_str(),
            last: 0,
            first: 0,
            steps: Vec::new(),
            names: Vec::new(),
            index: Default::default(),
            chains: 0,
            rules: 0,
        };
        b.message(
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            0,
            NFNL_SUBSYS_NFTABLES,
            |_| {},
        );
        // As iptables-nft does: the table, created if missing (a node's first start).
        let (family, table) = (b.family, b.table);
        b.message(
            NFNL_SUBSYS_NFTABLES << 8,
            NLM_F_REQUEST | NLM_F_CREATE,
            family,
            0,
            |a| a.str(1, table),
        );
        b.first = b.seq + 1;
        Ok(b)
    }

    fn message(
        &mut self,
        ty: u16,
        flags: u16,
        family: u8,
        res_id: u16,
        f: impl FnOnce(&mut Attrs<'_>),
    ) {
        self.seq += 1;
        let at = self.buf.len();
        self.last = at;
        self.buf.extend_from_slice(&[0; 4]);
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&self.seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&[family, 0]);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        f(&mut Attrs(&mut self.buf));
        let len = (self.buf.len() - at) as u32;
        self.buf[at..at + 4].copy_from_slice(&len.to_ne_bytes());
    }

    /// Creates `chain`, which must not exist.
    pub fn chain(&mut self, chain: &str) {
        let (family, table) = (self.family, self.table);
        self.message(
            NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWCHAIN,
            NLM_F_REQUEST | NLM_F_EXCL,
            family,
            0,
            |a| {
                a.str(1, table);
                a.str(3, chain);
            },
        );
        let i = self.names.len() as u32;
        self.names.push(chain.to_string());
        self.index.insert(chain.to_string(), i);
        self.steps.push(Step::Chain(i));
        self.chains += 1;
    }

    /// Appends `rule` to `chain`; false, writing nothing, when it is not
    /// [`encodable`](super::rule_parse::encodable).
    pub fn rule(&mut self, chain: &str, rule: &str) -> bool {
        let Some(r) = parse(rule) else {
            return false;
        };
        let (family, table) = (self.family, self.table);
        self.message(
            NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWRULE,
            NLM_F_REQUEST | NLM_F_CREATE | NLM_F_APPEND,
            family,
            0,
            |a| {
                a.str(1, table);
                a.str(2, chain);
                a.nest(4, |e| expressions(e, &r));
                a.nest(5, |c| {
                    c.u32(1, u32::from(r.proto.unwrap_or(0)));
                    c.u32(2, 0);
                });
            },
        );
        let i = self.index.get(chain).copied().unwrap_or(u32::MAX);
        self.steps.push(Step::Rule(i));
        self.rules += 1;
        true
    }

    /// The batch, closed, ready to send: its last change asks for an acknowledgement,
    /// which the kernel sends only when the whole batch committed.
    pub fn finish(mut self) -> Finished {
        let flags = self.last + 6;
        let f = u16::from_ne_bytes([self.buf[flags], self.buf[flags + 1]]) | NLM_F_ACK;
        self.buf[flags..flags + 2].copy_from_slice(&f.to_ne_bytes());
        let ack = self.seq;
        self.message(
            NFNL_MSG_BATCH_END,
            NLM_F_REQUEST,
            0,
            NFNL_SUBSYS_NFTABLES,
            |_| {},
        );
        Finished {
            bytes: self.buf,
            ack,
            table: self.table,
            first: self.first,
            steps: self.steps,
            names: self.names,
            chains: self.chains,
        }
    }
}

/// iptables-nft's order: protocol, source, destination, the matches as written, a
/// counter, the target.
fn expressions(e: &mut Attrs<'_>, r: &Rule<'_>) {
    if let Some(p) = r.proto {
        e.expr("meta", |a| {
            a.u32(2, 16); // NFT_META_L4PROTO
            a.u32(1, 1);
        });
        e.cmp(0, &[p]);
    }
    if let Some(s) = r.src {
        e.addr(12, s);
    }
    if let Some(d) = r.dst {
        e.addr(16, d);
    }
    for m in &r.matches {
        match m {
            Match::Port {
                dport: Some(port), ..
            } => {
                e.payload(2, 2, 2);
                e.cmp(0, &port.to_be_bytes());
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
        a.put(1, &0u64.to_be_bytes());
        a.put(2, &0u64.to_be_bytes());
    });
    match r.target {
        Target::Jump(chain) => e.expr("immediate", |a| {
            a.u32(1, 0);
            a.nest(2, |d| {
                d.nest(2, |v| {
                    v.u32(1, NFT_JUMP);
                    v.str(2, chain);
                })
            });
        }),
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

/// Sends `batch` and waits for nf_tables' verdict on it: the kernel handles a batch
/// inside the send, so by the time the send returns it has queued an error for each
/// message it refused, or the acknowledgement of the last one if the batch committed.
pub fn send(batch: &Finished) -> Result<(), DirectError> {
    let refused = |source: std::io::Error, what: String| DirectError::Refused {
        chains: batch.chains,
        what,
        source,
    };
    let socket = Socket::new(NETLINK_NETFILTER).map_err(DirectError::Socket)?;
    // The whole batch is one message, so the send buffer must hold it (a cold 10k x 10
    // load is about 110 MiB); forcing it past wmem_max takes CAP_NET_ADMIN, which we have.
    let bytes = &batch.bytes;
    let size = bytes
        .len()
        .saturating_add(1 << 16)
        .min(i32::MAX as usize / 2);
    nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::SndBufForce, &size)
        .map_err(|e| DirectError::Socket(e.into()))?;
    let kernel = SocketAddr::new(0, 0);
    let sent = socket
        .send_to(bytes, &kernel, 0)
        .map_err(|e| refused(e, batch.what(0)))?;
    if sent != bytes.len() {
        let e = std::io::Error::other(format!("sent {sent} of {} bytes", bytes.len()));
        return Err(refused(e, batch.what(0)));
    }
    socket.set_non_blocking(true).map_err(DirectError::Socket)?;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match socket.recv(&mut &mut buf[..], 0) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let e = std::io::Error::other("no acknowledgement: the batch did not commit");
                return Err(refused(e, batch.what(0)));
            }
            Err(e) => return Err(refused(e, batch.what(0))),
        };
        let mut off = 0;
        while off + 16 <= n {
            let word = |at: usize| {
                buf.get(at..at + 4)
                    .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            };
            let len = word(off) as usize;
            let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
            if ty == NLMSG_ERROR {
                // nlmsgerr: the error, then the header of the message it answers.
                let code = word(off + 16) as i32;
                let seq = word(off + 28);
                if code != 0 {
                    let e = std::io::Error::from_raw_os_error(-code);
                    return Err(refused(e, batch.what(seq)));
                }
                if seq == batch.ack {
                    return Ok(());
                }
            }
            if len < 16 {
                break;
            }
            off += (len + 3) & !3;
        }
    }
}

/// Every rule of `table`, per chain in order, as the kernel dumps its expressions (the
/// match and target payloads included, which neither `nft --debug` nor iptables-save
/// shows whole): what a direct write is checked against a restore with.
pub fn dump_expressions(
    family: IpFamily,
    table: TableName,
) -> Result<std::collections::BTreeMap<String, Vec<Vec<u8>>>, DirectError> {
    use crate::nft::netlink::{find, Reader};
    if family != IpFamily::V4 {
        return Err(DirectError::Unsupported(format!("{family}: IPv4 only")));
    }
    let mut request = Vec::new();
    Attrs(&mut request).str(1, table.as_str());
    let replies = Reader::open()?.request_to(
        "rules",
        NFNL_SUBSYS_NFTABLES,
        NFT_MSG_GETRULE,
        NLM_F_DUMP,
        AF_INET,
        &request,
    )?;
    let mut out: std::collections::BTreeMap<String, Vec<Vec<u8>>> = Default::default();
    for body in replies {
        let chain = find(&body, 2).unwrap_or_default();
        let chain = String::from_utf8_lossy(chain)
            .trim_end_matches('\0')
            .to_string();
        let exprs = find(&body, 4).unwrap_or_default().to_vec();
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
