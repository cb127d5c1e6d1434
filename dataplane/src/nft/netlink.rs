//! Reading our tables straight from the kernel over nfnetlink.
//!
//! `nft -j list table` decodes every element into expressions before printing it: at 10k
//! services x 10 endpoints that takes 5 s of CPU, which would stall every full sync. The
//! kernel's own dump of the same table takes milliseconds. The `nftables` crate only wraps
//! nft's JSON, so this module asks for the four dumps it needs (sets, their elements, chains,
//! rules) itself, over [`crate::netlink`], and decodes elements into the same canonical text
//! as [`super::listing`] (checked against it on a real kernel in `tests/kernel_listing.rs`).
//! Writes go as netlink batches too ([`super::wire`]).

use super::elements::Elements;
use super::pacing::Pacer;
use super::skeleton::*;
use super::tables::{family_name, Chain, Set, Table, TABLE};
use crate::model::IpFamily;
use crate::netlink::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

// libnftnl's user-data TLV types, where nft keeps comments.
const UDATA_SET_COMMENT: u8 = 7;
const UDATA_RULE_COMMENT: u8 = 0;

/// A comment kept in libnftnl's user-data TLVs.
fn udata_comment(data: &[u8], kind: u8) -> String {
    let mut rest = data;
    while rest.len() >= 2 {
        let (t, len) = (rest[0], rest[1] as usize);
        let Some(value) = rest.get(2..2 + len) else {
            break;
        };
        if t == kind {
            return text(value);
        }
        rest = &rest[2 + len..];
    }
    String::new()
}

/// An open nfnetlink socket in the calling thread's network namespace, reading nf_tables.
pub struct Reader {
    socket: Socket,
    /// Waits before each request and receive while another program's commit settles (a
    /// check's background read).
    pacer: Option<Pacer>,
}

impl Reader {
    pub fn open() -> Result<Reader, NetlinkError> {
        Ok(Reader {
            socket: Socket::open(NETLINK_NETFILTER, "nfnetlink")?,
            pacer: None,
        })
    }

    /// A reader on a socket already open (kept: see `NftKernel`).
    pub fn on(socket: Socket) -> Reader {
        Reader {
            socket,
            pacer: None,
        }
    }

    /// This reader, waiting before each request and receive as `pacer` says.
    pub fn paced(mut self, pacer: Pacer) -> Reader {
        self.pacer = Some(pacer);
        self
    }

    /// How long the reader waited for others' commits to settle.
    pub fn waited(&self) -> Duration {
        self.pacer.as_ref().map_or(Duration::ZERO, |p| p.waited)
    }

    pub fn into_socket(self) -> Socket {
        self.socket
    }

    /// Sends one nf_tables request; the payloads (after the nfgenmsg header) of the replies.
    fn request(
        &mut self,
        what: &str,
        msg: u16,
        flags: u16,
        family: u8,
        attrs: &[u8],
    ) -> Result<Vec<Vec<u8>>, NetlinkError> {
        let request = Request::nfnl(NFNL_SUBSYS_NFTABLES, msg, flags, family, attrs);
        let mut out = Vec::new();
        let pacer = &mut self.pacer;
        self.socket.request_each_paced(
            what,
            &request,
            &mut |body| out.push(body.to_vec()),
            &mut || {
                if let Some(p) = pacer.as_mut() {
                    p.wait_if_settling();
                }
            },
        )?;
        Ok(out)
    }

    fn dump(
        &mut self,
        what: &str,
        msg: u16,
        family: u8,
        attrs: &[u8],
    ) -> Result<Vec<Vec<u8>>, NetlinkError> {
        // A dump interrupted by a concurrent change is retried, as nft does.
        for _ in 0..3 {
            match self.request(what, msg, NLM_F_DUMP, family, attrs) {
                Err(NetlinkError::Interrupted { .. }) => continue,
                other => return other,
            }
        }
        Err(NetlinkError::Interrupted {
            op: format!("nfnetlink {what}"),
        })
    }

    /// The ruleset generation: it changes with every commit, so equal values before and
    /// after a read mean the read is consistent.
    pub fn generation(&mut self) -> Result<u32, NetlinkError> {
        generation_on(&mut self.socket)
    }

    /// Our table of `family` as the kernel holds it; `None` when there is none.
    pub fn table(&mut self, family: IpFamily) -> Result<Option<Table>, NetlinkError> {
        self.table_without(family, &|_| false)
    }

    /// [`Self::table`], with the sets `unread` names declared but their elements not
    /// dumped ([`Set::unread`]).
    pub fn table_without(
        &mut self,
        family: IpFamily,
        unread: &dyn Fn(&str) -> bool,
    ) -> Result<Option<Table>, NetlinkError> {
        let fam = nfproto(family);
        let what = |o: &str| format!("{o} of {} {TABLE}", family_name(family));
        let mut a = Vec::new();
        push_attr(&mut a, NFTA_TABLE_NAME, &cstr(TABLE));
        match self.request(&what("table"), NFT_MSG_GETTABLE, NLM_F_ACK, fam, &a) {
            Err(NetlinkError::Kernel { errno: 2, .. }) => return Ok(None),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let mut table = Table::default();
        let mut intervals = Vec::new();
        for body in self.dump(&what("sets"), NFT_MSG_GETSET, fam, &a)? {
            if find(&body, NFTA_SET_TABLE).map(text).as_deref() != Some(TABLE) {
                continue;
            }
            let name = find(&body, NFTA_SET_NAME).map(text).unwrap_or_default();
            let flags = find(&body, NFTA_SET_FLAGS).and_then(be32).unwrap_or(0);
            let set = Set {
                map: flags & NFT_SET_MAP != 0,
                fingerprint: find(&body, NFTA_SET_USERDATA)
                    .map(|d| udata_comment(d, UDATA_SET_COMMENT))
                    .unwrap_or_default(),
                size: find(&body, NFTA_SET_DESC)
                    .and_then(|d| find(d, NFTA_SET_DESC_SIZE))
                    .and_then(be32),
                ..Set::default()
            };
            if flags & NFT_SET_INTERVAL != 0 {
                intervals.push(name.clone());
            }
            table.sets.insert(name, set);
        }
        let names: Vec<String> = table.sets.keys().cloned().collect();
        for name in names {
            // What the packet path writes is not state we program: leave it out.
            if name == MAP_AFFINITY {
                continue;
            }
            if unread(&name) {
                if let Some(s) = table.sets.get_mut(&name) {
                    s.unread = true;
                }
                continue;
            }
            let elements = self.elements(family, &name, intervals.contains(&name))?;
            if let Some(s) = table.sets.get_mut(&name) {
                s.elements = elements;
            }
        }
        for body in self.dump(&what("chains"), NFT_MSG_GETCHAIN, fam, &a)? {
            if find(&body, NFTA_CHAIN_TABLE).map(text).as_deref() != Some(TABLE) {
                continue;
            }
            let name = find(&body, NFTA_CHAIN_NAME).map(text).unwrap_or_default();
            let hook = find(&body, NFTA_CHAIN_HOOK).map(|h| {
                let num = find(h, NFTA_HOOK_HOOKNUM).and_then(be32).unwrap_or(0);
                let prio = find(h, NFTA_HOOK_PRIORITY).and_then(be32).unwrap_or(0) as i32;
                let kind = find(&body, NFTA_CHAIN_TYPE).map(text).unwrap_or_default();
                let hook = ["prerouting", "input", "forward", "output", "postrouting"]
                    .get(num as usize)
                    .copied()
                    .unwrap_or("unknown");
                // NF_DROP is 0; the other base-chain policy, accept, is 1.
                let policy = match find(&body, NFTA_CHAIN_POLICY).and_then(be32) {
                    Some(0) => "drop",
                    _ => "accept",
                };
                format!("type {kind} hook {hook} priority {prio}; policy {policy};")
            });
            table.chains.insert(
                name,
                Chain {
                    hook,
                    ..Chain::default()
                },
            );
        }
        for body in self.dump(&what("rules"), NFT_MSG_GETRULE, fam, &a)? {
            if find(&body, NFTA_RULE_TABLE).map(text).as_deref() != Some(TABLE) {
                continue;
            }
            let chain = find(&body, NFTA_RULE_CHAIN).map(text).unwrap_or_default();
            let Some(c) = table.chains.get_mut(&chain) else {
                let detail = format!("rule of unknown chain {chain}");
                return Err(self.socket.malformed(&what("rules"), &detail));
            };
            let comment = find(&body, NFTA_RULE_USERDATA)
                .map(|d| udata_comment(d, UDATA_RULE_COMMENT))
                .unwrap_or_default();
            c.read_rule(&comment);
        }
        Ok(Some(table))
    }

    /// The elements of our set `name` in `family`, as canonical text (`interval`: the set
    /// has the interval flag).
    pub fn elements(
        &mut self,
        family: IpFamily,
        name: &str,
        interval: bool,
    ) -> Result<Elements, NetlinkError> {
        let fam = nfproto(family);
        let mut q = Vec::new();
        push_attr(&mut q, NFTA_SET_ELEM_LIST_TABLE, &cstr(TABLE));
        push_attr(&mut q, NFTA_SET_ELEM_LIST_SET, &cstr(name));
        let replies = self.dump(
            &format!("elements of {name} of {} {TABLE}", family_name(family)),
            NFT_MSG_GETSETELEM,
            fam,
            &q,
        )?;
        let layout = Fields::of(name, family);
        let mut raw: Vec<(Vec<u8>, Option<String>, bool)> = Vec::new();
        // A concatenation with ranges (pipapo): each element carries its inclusive end.
        let ranged = interval && layout.key.len() > 1;
        let mut ranges = Elements::default();
        for body in replies {
            let Some(list) = find(&body, NFTA_SET_ELEM_LIST_ELEMENTS) else {
                continue;
            };
            for elem in attrs(list).filter(|a| a.kind == NFTA_LIST_ELEM) {
                let key = find(elem.data, NFTA_SET_ELEM_KEY)
                    .and_then(|k| find(k, NFTA_DATA_VALUE))
                    .unwrap_or(&[])
                    .to_vec();
                let end = find(elem.data, NFTA_SET_ELEM_FLAGS)
                    .and_then(be32)
                    .is_some_and(|f| f & NFT_SET_ELEM_INTERVAL_END != 0);
                let value = find(elem.data, NFTA_SET_ELEM_DATA)
                    .map(|d| data_text(d, &layout.value, layout.addr_len));
                if ranged {
                    let last = find(elem.data, NFTA_SET_ELEM_KEY_END)
                        .and_then(|k| find(k, NFTA_DATA_VALUE))
                        .unwrap_or(&key);
                    ranges.insert(
                        &ranged_text(&key, last, &layout.key, layout.addr_len, family),
                        value.as_deref(),
                    );
                    continue;
                }
                raw.push((key, value, end));
            }
        }
        Ok(if ranged {
            ranges
        } else if interval {
            interval_elements(raw, family)
        } else {
            raw.into_iter()
                .map(|(k, v, _)| (fields_text(&k, &layout.key, layout.addr_len), v))
                .collect()
        })
    }
}

/// The family, set and keys (canonical text, as [`Reader::elements`] reads them) of a
/// NEWSETELEM or DELSETELEM notification (`body`: nfgenmsg, then attributes); `None` when
/// it does not read as elements of a set with a key (a catch-all element, say).
pub(super) fn notified_elements(body: &[u8]) -> Option<(IpFamily, String, Vec<String>)> {
    let family = match body.first()? {
        2 => IpFamily::V4,
        10 => IpFamily::V6,
        _ => return None,
    };
    let list = body.get(4..)?;
    let set = text(find(list, NFTA_SET_ELEM_LIST_SET)?);
    let layout = Fields::of(&set, family);
    let keys = attrs(find(list, NFTA_SET_ELEM_LIST_ELEMENTS)?)
        .filter(|a| a.kind == NFTA_LIST_ELEM)
        .map(|elem| {
            find(elem.data, NFTA_SET_ELEM_KEY)
                .and_then(|k| find(k, NFTA_DATA_VALUE))
                .map(|k| fields_text(k, &layout.key, layout.addr_len))
        })
        .collect::<Option<Vec<String>>>()?;
    Some((family, set, keys))
}

/// The ruleset generation, asked on `socket`.
pub fn generation_on(socket: &mut Socket) -> Result<u32, NetlinkError> {
    let request = Request::nfnl(NFNL_SUBSYS_NFTABLES, NFT_MSG_GETGEN, 0, 0, &[]);
    let replies = socket.request("generation", &request)?;
    replies
        .first()
        .and_then(|b| find(b, NFTA_GEN_ID))
        .and_then(be32)
        .ok_or_else(|| socket.malformed("generation", "no generation id"))
}

/// One field of a concatenated key or value; each takes a 4-byte-aligned register slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Field {
    Addr,
    Proto,
    Port,
    /// A numgen slot: an integer in host byte order.
    Int,
}

/// How a set's keys and values read, by set name: the layout is ours, so the names say it.
pub(super) struct Fields {
    pub(super) key: Vec<Field>,
    pub(super) value: Vec<Field>,
    pub(super) addr_len: usize,
}

impl Fields {
    pub(super) fn of(set: &str, family: IpFamily) -> Fields {
        use Field::*;
        let (key, value): (Vec<Field>, Vec<Field>) = match set {
            SET_CLUSTER_IPS | SET_SERVICE_CIDRS | SET_NODEPORT_ADDRS => (vec![Addr], vec![]),
            SET_HAIRPIN => (vec![Addr, Addr], vec![]),
            MAP_SERVICE_IPS | MAP_NO_ENDPOINT_SERVICES | MAP_SHORTCUT_IPS | SET_FIREWALL_IPS => {
                (vec![Addr, Proto, Port], vec![])
            }
            SET_FIREWALL_ALLOW => (vec![Addr, Proto, Port, Addr], vec![]),
            MAP_AFFINITY_FRONTENDS => (vec![Addr, Proto, Port], vec![]),
            MAP_AFFINITY => (vec![Addr, Addr, Proto, Port], vec![Addr, Port]),
            MAP_SERVICE_NODEPORTS | MAP_NO_ENDPOINT_NODEPORTS | MAP_SHORTCUT_NODEPORTS => {
                (vec![Proto, Port], vec![])
            }
            MAP_BACKENDS | MAP_SHORTCUT_BACKENDS => {
                (vec![Addr, Proto, Port, Int], vec![Addr, Port])
            }
            MAP_NODEPORT_BACKENDS | MAP_NODEPORT_SHORTCUT_BACKENDS => {
                (vec![Proto, Port, Int], vec![Addr, Port])
            }
            _ => (vec![], vec![]),
        };
        let addr_len = match family {
            IpFamily::V4 => 4,
            IpFamily::V6 => 16,
        };
        Fields {
            key,
            value,
            addr_len,
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Canonical text of a concatenation, as nft prints it; unknown layouts print as hex, which
/// never equals what we want and so reads as drift to repair.
pub(super) fn fields_text(bytes: &[u8], fields: &[Field], addr_len: usize) -> String {
    if fields.is_empty() {
        return hex(bytes);
    }
    let mut parts = Vec::new();
    let mut at = 0;
    for f in fields {
        let width = match f {
            Field::Addr => addr_len,
            _ => 4,
        };
        let Some(b) = bytes.get(at..at + width) else {
            return hex(bytes);
        };
        parts.push(match f {
            Field::Addr => match ip(b) {
                Some(a) => a.to_string(),
                None => return hex(bytes),
            },
            Field::Proto => match b[0] {
                6 => "tcp".to_string(),
                17 => "udp".to_string(),
                132 => "sctp".to_string(),
                n => n.to_string(),
            },
            Field::Port => u16::from_be_bytes([b[0], b[1]]).to_string(),
            Field::Int => u32::from_ne_bytes([b[0], b[1], b[2], b[3]]).to_string(),
        });
        at += width.div_ceil(4) * 4;
    }
    if at != bytes.len() {
        return hex(bytes);
    }
    parts.join(" . ")
}

pub(super) fn data_text(data: &[u8], fields: &[Field], addr_len: usize) -> String {
    if let Some(v) = find(data, NFTA_DATA_VERDICT) {
        let code = find(v, NFTA_VERDICT_CODE).and_then(be32).unwrap_or(0) as i32;
        let chain = find(v, NFTA_VERDICT_CHAIN).map(text).unwrap_or_default();
        return match code {
            0 => "drop".into(),
            1 => "accept".into(),
            -1 => "continue".into(),
            -3 => format!("jump {chain}"),
            -4 => format!("goto {chain}"),
            -5 => "return".into(),
            n => format!("verdict {n}"),
        };
    }
    fields_text(find(data, NFTA_DATA_VALUE).unwrap_or(&[]), fields, addr_len)
}

fn to_u128(bytes: &[u8]) -> Option<u128> {
    match bytes.len() {
        4 => Some(u32::from_be_bytes(bytes.try_into().ok()?) as u128),
        16 => Some(u128::from_be_bytes(bytes.try_into().ok()?)),
        _ => None,
    }
}

fn from_u128(v: u128, family: IpFamily) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::from(v as u32)),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

/// One range of addresses as nft prints it: a prefix as `addr/len`, a single address bare,
/// anything else as `first-last`.
fn range_text(start: u128, last: u128, family: IpFamily) -> String {
    let (bits, max): (u32, u128) = match family {
        IpFamily::V4 => (32, u32::MAX as u128),
        IpFamily::V6 => (128, u128::MAX),
    };
    let size = last.wrapping_sub(start);
    if size == 0 {
        from_u128(start, family).to_string()
    } else if start == 0 && last == max {
        format!("{}/0", from_u128(0, family))
    } else if (size.wrapping_add(1)).is_power_of_two() && start & size == 0 {
        let len = bits - (size.wrapping_add(1)).trailing_zeros();
        format!("{}/{len}", from_u128(start, family))
    } else {
        format!("{}-{}", from_u128(start, family), from_u128(last, family))
    }
}

/// A concatenation with per-field ranges (`key` to the inclusive `last`), as nft prints it:
/// equal fields once, address ranges as [`range_text`]; unknown layouts as hex.
fn ranged_text(
    key: &[u8],
    last: &[u8],
    fields: &[Field],
    addr_len: usize,
    family: IpFamily,
) -> String {
    let mut parts = Vec::new();
    let mut at = 0;
    for f in fields {
        let width = match f {
            Field::Addr => addr_len,
            _ => 4,
        };
        let (Some(a), Some(b)) = (key.get(at..at + width), last.get(at..at + width)) else {
            return format!("{}-{}", hex(key), hex(last));
        };
        let text = match (f, a == b) {
            (_, true) => fields_text(a, &[*f], addr_len),
            (Field::Addr, false) => match (to_u128(a), to_u128(b)) {
                (Some(s), Some(e)) => range_text(s, e, family),
                _ => return format!("{}-{}", hex(key), hex(last)),
            },
            _ => format!(
                "{}-{}",
                fields_text(a, &[*f], addr_len),
                fields_text(b, &[*f], addr_len)
            ),
        };
        parts.push(text);
        at += width.div_ceil(4) * 4;
    }
    parts.join(" . ")
}

/// Pair interval starts with their (exclusive) ends and print each range as nft does: a
/// prefix as `addr/len`, a single address bare, anything else as `first-last`.
fn interval_elements(raw: Vec<(Vec<u8>, Option<String>, bool)>, family: IpFamily) -> Elements {
    let bits: u32 = match family {
        IpFamily::V4 => 32,
        IpFamily::V6 => 128,
    };
    let max: u128 = if bits == 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    };
    let mut points: Vec<(u128, bool)> = raw
        .iter()
        .filter_map(|(k, _, end)| Some((to_u128(k)?, *end)))
        .collect();
    // At one address an end sorts before a start: [a, b) followed by [b, c).
    points.sort_by_key(|(v, end)| (*v, !*end));
    let mut out = Elements::default();
    let mut i = 0;
    while i < points.len() {
        let (start, is_end) = points[i];
        i += 1;
        if is_end {
            continue;
        }
        let last = match points.get(i) {
            Some((e, true)) => {
                i += 1;
                e.saturating_sub(1)
            }
            _ => max,
        };
        let text = range_text(start, last, family);
        out.insert(&text, None);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A NEWSETELEM notification's body as the kernel sends it: nfgenmsg, then the table,
    /// the set and the element list.
    fn notification(family: u8, set: &str, keys: &[Vec<u8>]) -> Vec<u8> {
        let mut body = vec![family, 0, 0, 0];
        push_attr(&mut body, NFTA_SET_ELEM_LIST_TABLE, &cstr(TABLE));
        push_attr(&mut body, NFTA_SET_ELEM_LIST_SET, &cstr(set));
        let mut list = Vec::new();
        for k in keys {
            let (mut value, mut key, mut elem) = (Vec::new(), Vec::new(), Vec::new());
            push_attr(&mut value, NFTA_DATA_VALUE, k);
            nested(&mut key, NFTA_SET_ELEM_KEY, &value);
            nested(&mut elem, NFTA_LIST_ELEM, &key);
            list.extend_from_slice(&elem);
        }
        nested(&mut body, NFTA_SET_ELEM_LIST_ELEMENTS, &list);
        body
    }

    #[test]
    fn notified_elements_read_as_the_dump_reads_them() {
        let mut backend = vec![172, 30, 0, 41, 6, 0, 0, 0, 0, 80, 0, 0];
        backend.extend_from_slice(&3u32.to_ne_bytes());
        let body = notification(2, MAP_BACKENDS, &[backend]);
        assert_eq!(
            notified_elements(&body),
            Some((
                IpFamily::V4,
                MAP_BACKENDS.to_string(),
                vec!["172.30.0.41 . tcp . 80 . 3".to_string()]
            ))
        );
        let two = notification(10, SET_CLUSTER_IPS, &[vec![0xfd; 16], vec![0; 16]]);
        assert_eq!(
            notified_elements(&two).map(|n| n.2),
            Some(vec![
                "fdfd:fdfd:fdfd:fdfd:fdfd:fdfd:fdfd:fdfd".into(),
                "::".into()
            ])
        );
        // Another family, or an element without a key: not read.
        assert_eq!(
            notified_elements(&notification(1, SET_CLUSTER_IPS, &[])).map(|n| n.2),
            None
        );
        let mut keyless = vec![2, 0, 0, 0];
        push_attr(&mut keyless, NFTA_SET_ELEM_LIST_SET, &cstr(SET_CLUSTER_IPS));
        let mut elem = Vec::new();
        nested(&mut elem, NFTA_LIST_ELEM, &[]);
        nested(&mut keyless, NFTA_SET_ELEM_LIST_ELEMENTS, &elem);
        assert_eq!(notified_elements(&keyless), None);
    }

    #[test]
    fn concatenations_print_as_nft_does() {
        let mut key = vec![172, 30, 0, 41];
        key.extend_from_slice(&[6, 0, 0, 0]);
        key.extend_from_slice(&[0, 80, 0, 0]);
        key.extend_from_slice(&3u32.to_ne_bytes());
        use Field::*;
        assert_eq!(
            fields_text(&key, &[Addr, Proto, Port, Int], 4),
            "172.30.0.41 . tcp . 80 . 3"
        );
        let mut v6 = vec![0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        v6.extend_from_slice(&[0x1f, 0x90, 0, 0]);
        assert_eq!(fields_text(&v6, &[Addr, Port], 16), "fd00::1 . 8080");
        assert_eq!(fields_text(&[1, 2, 3], &[Addr], 4), "010203");
    }

    #[test]
    fn intervals_pair_up_into_prefixes_and_ranges() {
        let p = |a: [u8; 4], end: bool| (a.to_vec(), None, end);
        let raw = vec![
            p([192, 168, 0, 3], true),
            p([192, 168, 0, 2], false),
            p([172, 30, 0, 0], false),
            p([172, 31, 0, 0], true),
            p([10, 0, 0, 5], false),
            p([10, 0, 0, 8], true),
        ];
        let mut got: Vec<String> = interval_elements(raw, IpFamily::V4)
            .keys()
            .map(|k| k.text())
            .collect();
        got.sort();
        assert_eq!(got, ["10.0.0.5-10.0.0.7", "172.30.0.0/16", "192.168.0.2"]);
    }

    /// Set elements and comments read back from the kernel are untrusted bytes: printing
    /// them never panics, whatever their length or the fields the set is said to have.
    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        const FIELDS: [Field; 4] = [Field::Addr, Field::Proto, Field::Port, Field::Int];

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]
            #[test]
            fn any_element_prints_without_panicking(
                data in proptest::collection::vec(any::<u8>(), 0..96),
                fields in proptest::collection::vec(0usize..4, 0..5),
                v6 in any::<bool>(),
                kind in any::<u8>(),
                raw in proptest::collection::vec(
                    (proptest::collection::vec(any::<u8>(), 0..20), any::<bool>()),
                    0..6,
                ),
            ) {
                let fields: Vec<Field> = fields.into_iter().map(|i| FIELDS[i]).collect();
                let addr_len = if v6 { 16 } else { 4 };
                let _ = fields_text(&data, &fields, addr_len);
                let _ = data_text(&data, &fields, addr_len);
                let _ = udata_comment(&data, kind);
                let family = if v6 { IpFamily::V6 } else { IpFamily::V4 };
                let raw = raw.into_iter().map(|(k, end)| (k, None, end)).collect();
                let _ = interval_elements(raw, family);
            }
        }
    }
}
