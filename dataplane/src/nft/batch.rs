//! Committing element-only transactions as one nf_tables netlink batch.
//!
//! Most syncs only add and delete map elements. Spawning `nft` for them costs about 19 ms
//! (start-up and loading the table's cache), which dominates a partial sync; the same
//! operations as one batch of NEWSETELEM/DELSETELEM messages commit atomically in well under
//! a millisecond. Transactions that touch chains, sets or tables, or elements of sets whose
//! layout this module does not know, still go through `nft -f`.

use super::netlink::*;
use super::skeleton::{SET_FIREWALL_ALLOW, SET_NODEPORT_ADDRS, SET_SERVICE_CIDRS};
use super::state::TABLE;
use super::transaction::{Op, Transaction};
use crate::model::IpFamily;
use std::net::IpAddr;

const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NLM_F_CREATE: u16 = 0x400;
const NLA_F_NESTED: u16 = 0x8000;
/// Elements per message, well inside the socket's buffers.
const PER_MESSAGE: usize = 256;

fn encode_fields(text: &str, fields: &[Field], addr_len: usize) -> Option<Vec<u8>> {
    let parts: Vec<&str> = text.split(" . ").collect();
    if parts.len() != fields.len() || fields.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    for (part, field) in parts.iter().zip(fields) {
        match field {
            Field::Addr => {
                let bytes = match part.parse::<IpAddr>().ok()? {
                    IpAddr::V4(a) => a.octets().to_vec(),
                    IpAddr::V6(a) => a.octets().to_vec(),
                };
                if bytes.len() != addr_len {
                    return None;
                }
                out.extend_from_slice(&bytes);
            }
            Field::Proto => {
                let p: u8 = match *part {
                    "tcp" => 6,
                    "udp" => 17,
                    "sctp" => 132,
                    n => n.parse().ok()?,
                };
                out.extend_from_slice(&[p, 0, 0, 0]);
            }
            Field::Port => {
                out.extend_from_slice(&part.parse::<u16>().ok()?.to_be_bytes());
                out.extend_from_slice(&[0, 0]);
            }
            Field::Int => out.extend_from_slice(&part.parse::<u32>().ok()?.to_ne_bytes()),
        }
    }
    Some(out)
}

fn nested(buf: &mut Vec<u8>, kind: u16, inner: &[u8]) {
    push_attr(buf, kind | NLA_F_NESTED, inner);
}

/// The NFTA_SET_ELEM_DATA payload of a map value.
fn encode_value(text: &str, layout: &Fields) -> Option<Vec<u8>> {
    let verdict = |code: i32, chain: Option<&str>| {
        let mut v = Vec::new();
        push_attr(&mut v, NFTA_VERDICT_CODE, &code.to_be_bytes());
        if let Some(c) = chain {
            push_attr(&mut v, NFTA_VERDICT_CHAIN, &cstr(c));
        }
        let mut d = Vec::new();
        nested(&mut d, NFTA_DATA_VERDICT, &v);
        d
    };
    if text == "drop" {
        return Some(verdict(0, None));
    }
    if text == "accept" {
        return Some(verdict(1, None));
    }
    if let Some(c) = text.strip_prefix("goto ") {
        return Some(verdict(-4, Some(c)));
    }
    if let Some(c) = text.strip_prefix("jump ") {
        return Some(verdict(-3, Some(c)));
    }
    let bytes = encode_fields(text, &layout.value, layout.addr_len)?;
    let mut d = Vec::new();
    push_attr(&mut d, NFTA_DATA_VALUE, &bytes);
    Some(d)
}

/// One element as a NFTA_LIST_ELEM payload.
fn encode_element(key: &str, value: Option<&str>, layout: &Fields) -> Option<Vec<u8>> {
    let mut k = Vec::new();
    push_attr(
        &mut k,
        NFTA_DATA_VALUE,
        &encode_fields(key, &layout.key, layout.addr_len)?,
    );
    let mut e = Vec::new();
    nested(&mut e, NFTA_SET_ELEM_KEY, &k);
    match (value, layout.value.is_empty()) {
        (Some(v), _) => nested(&mut e, NFTA_SET_ELEM_DATA, &encode_value(v, layout)?),
        (None, true) => {}
        // A map element without a value: not ours to guess.
        (None, false) => return None,
    }
    Some(e)
}

/// One nf_tables message of a batch.
struct Message {
    kind: u16,
    flags: u16,
    family: u8,
    attrs: Vec<u8>,
}

/// The messages that add (or delete) `items` in `set`; `None` when one cannot be encoded.
fn element_messages(
    out: &mut Vec<Message>,
    family: IpFamily,
    set: &str,
    items: &[(&str, Option<&str>)],
    delete: bool,
) -> Option<()> {
    // Interval sets take start and end elements (or key ends); they change only with the
    // node or a service's source ranges, so nft writes them.
    if set == SET_SERVICE_CIDRS || set == SET_NODEPORT_ADDRS || set == SET_FIREWALL_ALLOW {
        return None;
    }
    let layout = Fields::of(set, family);
    let key_only = Fields {
        key: layout.key.clone(),
        value: Vec::new(),
        addr_len: layout.addr_len,
    };
    let fam = match family {
        IpFamily::V4 => NFPROTO_IPV4,
        IpFamily::V6 => NFPROTO_IPV6,
    };
    for chunk in items.chunks(PER_MESSAGE) {
        let mut list = Vec::new();
        for (k, v) in chunk {
            // A deletion names the key only.
            let e = if delete {
                encode_element(k, None, &key_only)?
            } else {
                encode_element(k, *v, &layout)?
            };
            nested(&mut list, NFTA_LIST_ELEM, &e);
        }
        let mut attrs = Vec::new();
        push_attr(&mut attrs, NFTA_SET_ELEM_LIST_TABLE, &cstr(TABLE));
        push_attr(&mut attrs, NFTA_SET_ELEM_LIST_SET, &cstr(set));
        nested(&mut attrs, NFTA_SET_ELEM_LIST_ELEMENTS, &list);
        out.push(Message {
            kind: if delete {
                NFT_MSG_DELSETELEM
            } else {
                NFT_MSG_NEWSETELEM
            },
            flags: if delete { 0 } else { NLM_F_CREATE },
            family: fam,
            attrs,
        });
    }
    Some(())
}

/// The netlink messages of an element-only transaction, or `None` when any operation is
/// not an element operation this module can encode.
fn encode(tx: &Transaction) -> Option<Vec<Message>> {
    let mut msgs = Vec::new();
    for op in &tx.ops {
        match op {
            Op::AddElements {
                family,
                set,
                elements,
            } => {
                let items: Vec<(&str, Option<&str>)> = elements
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_deref()))
                    .collect();
                element_messages(&mut msgs, *family, set, &items, false)?;
            }
            Op::DeleteElements { family, set, keys } => {
                let items: Vec<(&str, Option<&str>)> =
                    keys.iter().map(|k| (k.as_str(), None)).collect();
                element_messages(&mut msgs, *family, set, &items, true)?;
            }
            _ => return None,
        }
    }
    Some(msgs)
}

/// Commit `tx` as one batch if it only adds and deletes elements we can encode. `Ok(false)`
/// means it was not tried (use `nft`); an error means the kernel refused the batch, which
/// then changed nothing.
pub fn try_commit(tx: &Transaction) -> Result<bool, NetlinkError> {
    let Some(msgs) = encode(tx) else {
        return Ok(false);
    };
    if msgs.is_empty() {
        return Ok(true);
    }
    let mut reader = Reader::open()?;
    let mut buf = Vec::new();
    let mut seq = reader.seq;
    seq += 1;
    message(
        &mut buf,
        NFNL_MSG_BATCH_BEGIN,
        NLM_F_REQUEST,
        seq,
        0,
        NFNL_SUBSYS_NFTABLES,
        &[],
    );
    for m in &msgs {
        seq += 1;
        message(
            &mut buf,
            (NFNL_SUBSYS_NFTABLES << 8) | m.kind,
            NLM_F_REQUEST | NLM_F_ACK | m.flags,
            seq,
            m.family,
            0,
            &m.attrs,
        );
    }
    seq += 1;
    message(
        &mut buf,
        NFNL_MSG_BATCH_END,
        NLM_F_REQUEST,
        seq,
        0,
        NFNL_SUBSYS_NFTABLES,
        &[],
    );
    reader.seq = seq;
    reader.socket.send(&buf, 0).map_err(NetlinkError::Socket)?;
    // Every message asked for an acknowledgement, errors included; a generation request
    // after the batch is answered only once they all are.
    let mut first_error: Option<i32> = None;
    let fence = reader.seq + 1;
    reader.seq = fence;
    let mut g = Vec::new();
    message(
        &mut g,
        (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN,
        NLM_F_REQUEST,
        fence,
        0,
        0,
        &[],
    );
    reader.socket.send(&g, 0).map_err(NetlinkError::Socket)?;
    loop {
        for reply in reader.receive()? {
            if reply.seq == fence {
                return match first_error {
                    None => Ok(true),
                    Some(errno) => Err(NetlinkError::Kernel {
                        what: format!("element batch of {} operations", tx.ops.len()),
                        errno,
                    }),
                };
            }
            if reply.kind == NLMSG_ERROR {
                let errno = reply
                    .body
                    .get(..4)
                    .and_then(|b| b.try_into().ok())
                    .map(i32::from_ne_bytes)
                    .unwrap_or(0);
                if errno != 0 && first_error.is_none() {
                    first_error = Some(-errno);
                }
            }
        }
    }
}
