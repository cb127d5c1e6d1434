//! Set and map elements, from their canonical text (`172.30.0.41 . tcp . 80 : goto x`) to
//! NFTA_LIST_ELEM payloads: interval sets as start and (exclusive) end elements, as nft's
//! rbtree sets hold them; concatenations with a range as one element with its inclusive
//! end, as the pipapo back end holds them.

use super::super::netlink::{Field, Fields};
use crate::model::IpFamily;
use crate::netlink::*;
use ipnetwork::IpNetwork;
use std::net::IpAddr;

fn addr_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// One field of a key or value; `None` when the text is not that field.
fn field_bytes(part: &str, field: Field, addr_len: usize) -> Option<Vec<u8>> {
    Some(match field {
        Field::Addr => {
            let bytes = addr_bytes(part.parse().ok()?);
            if bytes.len() != addr_len {
                return None;
            }
            bytes
        }
        Field::Proto => {
            let p: u8 = match part {
                "tcp" => 6,
                "udp" => 17,
                "sctp" => 132,
                n => n.parse().ok()?,
            };
            vec![p, 0, 0, 0]
        }
        Field::Port => {
            let mut b = part.parse::<u16>().ok()?.to_be_bytes().to_vec();
            b.extend_from_slice(&[0, 0]);
            b
        }
        Field::Int => part.parse::<u32>().ok()?.to_ne_bytes().to_vec(),
    })
}

/// A concatenation's bytes, each field in its 4-byte-aligned slot.
pub(in crate::nft) fn encode_fields(
    text: &str,
    fields: &[Field],
    addr_len: usize,
) -> Option<Vec<u8>> {
    let parts: Vec<&str> = text.split(" . ").collect();
    if parts.len() != fields.len() || fields.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    for (part, field) in parts.iter().zip(fields) {
        out.extend(field_bytes(part, *field, addr_len)?);
    }
    Some(out)
}

/// The NFTA_SET_ELEM_DATA payload of a map value.
fn encode_value(text: &str, layout: &Fields) -> Option<Vec<u8>> {
    use crate::netlink::expr::{verdict_data, Verdict};
    let verdict = match text.split_once(' ') {
        None if text == "drop" => Some(Verdict::Drop),
        None if text == "accept" => Some(Verdict::Accept),
        Some(("goto", c)) => Some(Verdict::Goto(c)),
        Some(("jump", c)) => Some(Verdict::Jump(c)),
        _ => None,
    };
    let mut d = Vec::new();
    match verdict {
        Some(v) => verdict_data(&mut Attrs(&mut d), v),
        None => {
            let bytes = encode_fields(text, &layout.value, layout.addr_len)?;
            push_attr(&mut d, NFTA_DATA_VALUE, &bytes);
        }
    }
    Some(d)
}

fn element(key: &[u8], key_end: Option<&[u8]>, flags: u32, data: Option<&[u8]>) -> Vec<u8> {
    let mut e = Vec::new();
    let mut a = Attrs(&mut e);
    a.nest(NFTA_SET_ELEM_KEY, |k| k.put(NFTA_DATA_VALUE, key));
    if let Some(end) = key_end {
        a.nest(NFTA_SET_ELEM_KEY_END, |k| k.put(NFTA_DATA_VALUE, end));
    }
    if flags != 0 {
        a.be32(NFTA_SET_ELEM_FLAGS, flags);
    }
    if let Some(d) = data {
        a.nest(NFTA_SET_ELEM_DATA, |v| v.raw(d));
    }
    e
}

/// The first and the one-past-last address of `net`; `None` past the end of the space.
fn bounds(net: &IpNetwork) -> (Vec<u8>, Option<Vec<u8>>) {
    match net {
        IpNetwork::V4(n) => {
            let next = u32::from(n.broadcast()).checked_add(1);
            (
                n.network().octets().to_vec(),
                next.map(|v| v.to_be_bytes().to_vec()),
            )
        }
        IpNetwork::V6(n) => {
            let last = u128::from(n.network())
                | (u128::MAX.checked_shr(u32::from(n.prefix())).unwrap_or(0));
            (
                n.network().octets().to_vec(),
                last.checked_add(1).map(|v| v.to_be_bytes().to_vec()),
            )
        }
    }
}

fn last_address(net: &IpNetwork) -> Vec<u8> {
    match net {
        IpNetwork::V4(n) => n.broadcast().octets().to_vec(),
        IpNetwork::V6(n) => {
            let host = u128::MAX.checked_shr(u32::from(n.prefix())).unwrap_or(0);
            (u128::from(n.network()) | host).to_be_bytes().to_vec()
        }
    }
}

/// The elements of one interval-set member (`10.96.0.0/12`, `192.168.0.2`): its start and,
/// unless it reaches the end of the address space, its end.
pub fn interval(net: &IpNetwork) -> Vec<Vec<u8>> {
    let (start, end) = bounds(net);
    let mut out = vec![element(&start, None, 0, None)];
    if let Some(end) = end {
        out.push(element(&end, None, NFT_SET_ELEM_INTERVAL_END, None));
    }
    out
}

/// An interval's end at the zero address, which nft puts first in a set of ranges.
pub fn interval_end(family: IpFamily) -> Vec<u8> {
    let zero = match family {
        IpFamily::V4 => vec![0; 4],
        IpFamily::V6 => vec![0; 16],
    };
    element(&zero, None, NFT_SET_ELEM_INTERVAL_END, None)
}

/// How the elements of a set are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One element per key.
    Plain,
    /// Single-field ranges: start and end elements.
    Intervals,
    /// A concatenation whose last address field may be a prefix: one element with its end.
    RangedConcat,
}

/// The NFTA_LIST_ELEM payloads of one element (`value`: a map's; `None` when deleting).
pub(in crate::nft) fn encode(
    key: &str,
    value: Option<&str>,
    shape: Shape,
    layout: &Fields,
    family: IpFamily,
) -> Option<Vec<Vec<u8>>> {
    let addr_len = layout.addr_len;
    match shape {
        Shape::Plain => {
            let k = encode_fields(key, &layout.key, addr_len)?;
            let data = match value {
                Some(v) => Some(encode_value(v, layout)?),
                None => None,
            };
            Some(vec![element(&k, None, 0, data.as_deref())])
        }
        Shape::Intervals => {
            let net: IpNetwork = key.parse().ok()?;
            same_family(&net, family)?;
            Some(interval(&net))
        }
        Shape::RangedConcat => {
            let parts: Vec<&str> = key.split(" . ").collect();
            if parts.len() != layout.key.len() {
                return None;
            }
            let (mut start, mut end) = (Vec::new(), Vec::new());
            for (part, field) in parts.iter().zip(&layout.key) {
                if *field == Field::Addr && part.contains('/') {
                    let net: IpNetwork = part.parse().ok()?;
                    same_family(&net, family)?;
                    start.extend(addr_bytes(net.network()));
                    end.extend(last_address(&net));
                } else {
                    let b = field_bytes(part, *field, addr_len)?;
                    start.extend_from_slice(&b);
                    end.extend(b);
                }
            }
            Some(vec![element(&start, Some(&end), 0, None)])
        }
    }
}

fn same_family(net: &IpNetwork, family: IpFamily) -> Option<()> {
    match (net, family) {
        (IpNetwork::V4(_), IpFamily::V4) | (IpNetwork::V6(_), IpFamily::V6) => Some(()),
        _ => None,
    }
}
