//! Committing element-only transactions as one nf_tables netlink batch.
//!
//! Most syncs only add and delete map elements. Spawning `nft` for them costs about 19 ms
//! (start-up and loading the table's cache), which dominates a partial sync; the same
//! operations as one batch of NEWSETELEM/DELSETELEM messages commit atomically in well under
//! a millisecond. Transactions that touch chains, sets or tables, or elements of sets whose
//! layout this module does not know, still go through `nft -f`.

use super::diff::{Op, Transaction};
use super::netlink::{Field, Fields};
use super::skeleton::{SET_FIREWALL_ALLOW, SET_NODEPORT_ADDRS, SET_SERVICE_CIDRS};
use super::tables::{family_name, TABLE};
use crate::model::IpFamily;
use crate::netlink::*;
use std::net::IpAddr;

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

/// The NFTA_SET_ELEM_DATA payload of a map value.
fn encode_value(text: &str, layout: &Fields) -> Option<Vec<u8>> {
    let verdict = |code: i32, chain: Option<&str>| {
        let mut d = Vec::new();
        Attrs(&mut d).nest(NFTA_DATA_VERDICT, |v| {
            v.put(NFTA_VERDICT_CODE, &code.to_be_bytes());
            if let Some(c) = chain {
                v.str(NFTA_VERDICT_CHAIN, c);
            }
        });
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

/// Writes the messages that add (or delete) `items` in `set` into `batch`, and what each
/// does into `about`; `None` when one cannot be encoded.
fn element_messages(
    batch: &mut Batch,
    about: &mut Vec<String>,
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
        let (msg, flags, verb) = if delete {
            (NFT_MSG_DELSETELEM, 0, "deleting")
        } else {
            (NFT_MSG_NEWSETELEM, NLM_F_CREATE, "adding")
        };
        batch.push(msg, flags, nfproto(family), |a| {
            a.str(NFTA_SET_ELEM_LIST_TABLE, TABLE);
            a.str(NFTA_SET_ELEM_LIST_SET, set);
            a.nest(NFTA_SET_ELEM_LIST_ELEMENTS, |l| l.raw(&list));
        });
        about.push(format!(
            "{verb} {} elements of {} {TABLE} set {set}",
            chunk.len(),
            family_name(family)
        ));
    }
    Some(())
}

/// The batch of an element-only transaction with what each message does, or `None` when
/// any operation is not an element operation this module can encode.
fn encode(tx: &Transaction) -> Option<(Batch, Vec<String>)> {
    let mut batch = Batch::new();
    let mut about = Vec::new();
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
                element_messages(&mut batch, &mut about, *family, set, &items, false)?;
            }
            Op::DeleteElements { family, set, keys } => {
                let items: Vec<(&str, Option<&str>)> =
                    keys.iter().map(|k| (k.as_str(), None)).collect();
                element_messages(&mut batch, &mut about, *family, set, &items, true)?;
            }
            _ => return None,
        }
    }
    Some((batch, about))
}

/// Commit `tx` as one batch if it only adds and deletes elements we can encode. `Ok(false)`
/// means it was not tried (use `nft`); an error means the kernel refused the batch, which
/// then changed nothing.
pub fn try_commit(tx: &Transaction) -> Result<bool, NetlinkError> {
    let Some((batch, about)) = encode(tx) else {
        return Ok(false);
    };
    if batch.is_empty() {
        return Ok(true);
    }
    let what = format!("element batch of {} operations", tx.ops.len());
    let about = |i: usize| about.get(i).cloned().unwrap_or_default();
    batch.commit(&what, &about)?;
    Ok(true)
}
