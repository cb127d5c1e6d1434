//! Set and map elements, from their canonical text (`172.30.0.41 . tcp . 80 : goto x`) to
//! NFTA_LIST_ELEM payloads: interval sets as start and (exclusive) end elements, as nft's
//! rbtree sets hold them; concatenations with a range as one element with its inclusive
//! end, as the pipapo back end holds them.

use super::super::netlink::{Field, Fields};
use super::super::packed::{self, Token};
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

/// One field of a key or value, appended to `out`; `None` when the text is not that field
/// (then `out` may hold part of it).
fn field_into(out: &mut Vec<u8>, part: &str, field: Field, addr_len: usize) -> Option<()> {
    match field {
        Field::Addr => match part.parse().ok()? {
            IpAddr::V4(a) if addr_len == 4 => out.extend_from_slice(&a.octets()),
            IpAddr::V6(a) if addr_len == 16 => out.extend_from_slice(&a.octets()),
            _ => return None,
        },
        Field::Proto => {
            let p: u8 = match part {
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
    Some(())
}

/// One field of a key or value; `None` when the text is not that field.
fn field_bytes(part: &str, field: Field, addr_len: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(16);
    field_into(&mut out, part, field, addr_len)?;
    Some(out)
}

/// A concatenation's bytes, each field in its 4-byte-aligned slot, appended to `out`.
fn fields_into(out: &mut Vec<u8>, text: &str, fields: &[Field], addr_len: usize) -> Option<()> {
    if fields.is_empty() {
        return None;
    }
    let mut parts = text.split(" . ");
    for field in fields {
        field_into(out, parts.next()?, *field, addr_len)?;
    }
    parts.next().is_none().then_some(())
}

/// A concatenation's bytes, each field in its 4-byte-aligned slot.
pub(in crate::nft) fn encode_fields(
    text: &str,
    fields: &[Field],
    addr_len: usize,
) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    fields_into(&mut out, text, fields, addr_len)?;
    Some(out)
}

/// The NFTA_SET_ELEM_DATA payload of a map value, appended.
fn value_into(d: &mut Attrs<'_>, text: &str, layout: &Fields) -> Option<()> {
    use crate::netlink::expr::{verdict_data, Verdict};
    let verdict = match text.split_once(' ') {
        None if text == "drop" => Some(Verdict::Drop),
        None if text == "accept" => Some(Verdict::Accept),
        Some(("goto", c)) => Some(Verdict::Goto(c)),
        Some(("jump", c)) => Some(Verdict::Jump(c)),
        _ => None,
    };
    match verdict {
        Some(v) => {
            verdict_data(d, v);
            Some(())
        }
        None => d.put_with(NFTA_DATA_VALUE, |b| {
            fields_into(b, text, &layout.value, layout.addr_len)
        }),
    }
}

/// One element of a set or map of [`Shape::Plain`], NFTA_LIST_ELEM and all, appended to
/// `out` in place: the key's bytes by `key`, the value's attributes by `value` (none when
/// deleting). 120k elements at 10k x 10 made three to eight short-lived vectors each when
/// every part was built apart and copied in.
fn plain_element_into(
    out: &mut Vec<u8>,
    key: impl FnOnce(&mut Vec<u8>) -> Option<()>,
    value: Option<impl FnOnce(&mut Attrs<'_>) -> Option<()>>,
) -> Option<()> {
    Attrs(out).nest_with(NFTA_LIST_ELEM, |e| {
        e.nest_with(NFTA_SET_ELEM_KEY, |k| k.put_with(NFTA_DATA_VALUE, key))?;
        match value {
            Some(v) => e.nest_with(NFTA_SET_ELEM_DATA, v),
            None => Some(()),
        }
    })
}

/// [`plain_element_into`] from the element's text.
fn plain_into(out: &mut Vec<u8>, key: &str, value: Option<&str>, layout: &Fields) -> Option<()> {
    plain_element_into(
        out,
        |b| fields_into(b, key, &layout.key, layout.addr_len),
        value.map(|v| move |d: &mut Attrs<'_>| value_into(d, v, layout)),
    )
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

/// One element of a [`Shape::Plain`] set or map from its compact form ([`packed`]: `key`,
/// and `value` unless deleting), appended as [`encode_into`] appends it from its text; `None`,
/// with `out` as it was, for any other shape, or where the compact form holds anything but
/// the fields of the layout, or a value other than those or a `goto` (the text then goes
/// through [`encode_into`]).
pub(in crate::nft) fn encode_packed_into(
    out: &mut Vec<u8>,
    key: &[u8],
    value: Option<&[u8]>,
    shape: Shape,
    layout: &Fields,
) -> Option<usize> {
    if shape != Shape::Plain {
        return None;
    }
    plain_element_into(
        out,
        |b| packed_fields_into(b, key, &layout.key, layout.addr_len),
        value.map(|v| move |d: &mut Attrs<'_>| packed_value_into(d, v, layout)),
    )?;
    Some(1)
}

/// [`fields_into`] from a compact form.
fn packed_fields_into(
    out: &mut Vec<u8>,
    bytes: &[u8],
    fields: &[Field],
    addr_len: usize,
) -> Option<()> {
    if fields.is_empty() {
        return None;
    }
    let mut tokens = packed::tokens(bytes);
    for field in fields {
        match (field, tokens.next()?.ok()?) {
            (Field::Addr, Token::V4(o)) if addr_len == 4 => out.extend_from_slice(&o),
            (Field::Addr, Token::V6(o)) if addr_len == 16 => out.extend_from_slice(&o),
            (Field::Proto, Token::Proto(p)) => out.extend_from_slice(&[p, 0, 0, 0]),
            (Field::Proto, Token::Num(n)) => {
                out.extend_from_slice(&[u8::try_from(n).ok()?, 0, 0, 0])
            }
            (Field::Port, Token::Num(n)) => {
                out.extend_from_slice(&n.to_be_bytes());
                out.extend_from_slice(&[0, 0]);
            }
            (Field::Int, Token::Num(n)) => out.extend_from_slice(&u32::from(n).to_ne_bytes()),
            _ => return None,
        }
    }
    tokens.next().is_none().then_some(())
}

/// [`value_into`] from a compact form: a `goto`, or the layout's value fields.
fn packed_value_into(d: &mut Attrs<'_>, bytes: &[u8], layout: &Fields) -> Option<()> {
    use crate::netlink::expr::{verdict_data, Verdict};
    let mut tokens = packed::tokens(bytes);
    match (tokens.next()?.ok()?, tokens.next()) {
        (Token::Goto(chain), None) => {
            verdict_data(d, Verdict::Goto(chain));
            Some(())
        }
        (Token::Text(_), _) => None,
        _ => d.put_with(NFTA_DATA_VALUE, |b| {
            packed_fields_into(b, bytes, &layout.value, layout.addr_len)
        }),
    }
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

/// The NFTA_LIST_ELEMs of one element (`value`: a map's; `None` when deleting), appended
/// to `out`, and how many; `None`, with `out` as it was, when the text is not an element of
/// this layout.
pub(in crate::nft) fn encode_into(
    out: &mut Vec<u8>,
    key: &str,
    value: Option<&str>,
    shape: Shape,
    layout: &Fields,
    family: IpFamily,
) -> Option<usize> {
    let payloads = match shape {
        Shape::Plain => {
            plain_into(out, key, value, layout)?;
            return Some(1);
        }
        Shape::Intervals => {
            let net: IpNetwork = key.parse().ok()?;
            same_family(&net, family)?;
            interval(&net)
        }
        Shape::RangedConcat => vec![ranged_concat(key, layout, family)?],
    };
    for payload in &payloads {
        Attrs(out).nest(NFTA_LIST_ELEM, |x| x.raw(payload));
    }
    Some(payloads.len())
}

/// A concatenation whose address field may be a prefix: one element, start and inclusive end.
fn ranged_concat(key: &str, layout: &Fields, family: IpFamily) -> Option<Vec<u8>> {
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
            let b = field_bytes(part, *field, layout.addr_len)?;
            start.extend_from_slice(&b);
            end.extend(b);
        }
    }
    Some(element(&start, Some(&end), 0, None))
}

fn same_family(net: &IpNetwork, family: IpFamily) -> Option<()> {
    match (net, family) {
        (IpNetwork::V4(_), IpFamily::V4) | (IpNetwork::V6(_), IpFamily::V6) => Some(()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::skeleton::{MAP_BACKENDS, MAP_SERVICE_IPS, SET_CLUSTER_IPS};
    use super::*;
    use crate::netlink::expr::{verdict_data, Verdict};

    /// An element built the way every one was before it was written in place: each part
    /// encoded apart, then copied into its nests.
    fn by_parts(key: &str, value: Option<&str>, layout: &Fields) -> Option<Vec<u8>> {
        let k = encode_fields(key, &layout.key, layout.addr_len)?;
        let data = match value {
            None => None,
            Some(v) => {
                let mut d = Vec::new();
                match v.split_once(' ') {
                    Some(("goto", c)) => verdict_data(&mut Attrs(&mut d), Verdict::Goto(c)),
                    _ if v == "drop" => verdict_data(&mut Attrs(&mut d), Verdict::Drop),
                    _ => push_attr(
                        &mut d,
                        NFTA_DATA_VALUE,
                        &encode_fields(v, &layout.value, layout.addr_len)?,
                    ),
                }
                Some(d)
            }
        };
        let mut out = Vec::new();
        let e = element(&k, None, 0, data.as_deref());
        Attrs(&mut out).nest(NFTA_LIST_ELEM, |x| x.raw(&e));
        Some(out)
    }

    /// Written in place, an element has the bytes it had built by parts, in both families,
    /// with a verdict, a data value or none; text that is not an element of the layout
    /// leaves nothing behind.
    #[test]
    fn elements_written_in_place_have_the_bytes_built_by_parts() {
        let cases = [
            (SET_CLUSTER_IPS, IpFamily::V4, "172.30.0.41", None),
            (
                MAP_SERVICE_IPS,
                IpFamily::V4,
                "172.30.0.41 . tcp . 80",
                Some("goto svc-abc"),
            ),
            (
                MAP_SERVICE_IPS,
                IpFamily::V6,
                "fd00::29 . udp . 53",
                Some("drop"),
            ),
            (
                MAP_BACKENDS,
                IpFamily::V4,
                "172.30.0.41 . tcp . 80 . 3",
                Some("10.0.0.7 . 8080"),
            ),
            (
                MAP_BACKENDS,
                IpFamily::V6,
                "fd00::29 . sctp . 9 . 0",
                Some("fd00::1:7 . 9"),
            ),
            (
                MAP_BACKENDS,
                IpFamily::V4,
                "172.30.0.41 . tcp . 80 . 3",
                None,
            ),
        ];
        for (set, family, key, value) in cases {
            let layout = Fields::of(set, family);
            // After what a message holds before it: attributes are 4-byte aligned.
            let mut out = vec![0xaa; 4];
            let n = encode_into(&mut out, key, value, Shape::Plain, &layout, family);
            assert_eq!(n, Some(1), "{set} {key}");
            assert_eq!(
                out[4..],
                by_parts(key, value, &layout).unwrap()[..],
                "{set} {key}"
            );
        }
        let layout = Fields::of(MAP_BACKENDS, IpFamily::V4);
        for (key, value) in [
            ("172.30.0.41 . tcp . 80", Some("10.0.0.7 . 8080")),
            ("172.30.0.41 . tcp . 80 . 3 . 4", None),
            ("fd00::29 . tcp . 80 . 3", None),
            ("172.30.0.41 . tcp . 80 . 3", Some("10.0.0.7")),
            ("172.30.0.41 . tcp . 80 . 3", Some("10.0.0.7 . 99999")),
        ] {
            let mut out = vec![0xaa; 4];
            let n = encode_into(&mut out, key, value, Shape::Plain, &layout, IpFamily::V4);
            assert_eq!((n, out), (None, vec![0xaa; 4]), "{key} {value:?}");
        }
    }

    /// Every element of a layout, and the hand-written cases above, encode from their compact
    /// form to the bytes their text encodes to; the compact path takes every IPv4 element of
    /// the plain sets and maps, and leaves the rest to the text.
    #[test]
    fn the_compact_form_encodes_as_the_text_does() {
        use crate::nft::elements::Elements;
        use crate::nft::skeleton::{SET_FIREWALL_ALLOW, SET_NODEPORT_ADDRS, SET_SERVICE_CIDRS};
        let snap = crate::synth::cluster(40, 3);
        let (rs, _) = crate::nft::plan::desired(&snap, &Default::default());
        let mut cases: Vec<(String, IpFamily, Elements, bool)> = Vec::new();
        for (family, table) in &rs.tables {
            for (name, set) in &table.sets {
                cases.push((name.clone(), *family, set.elements.clone(), true));
            }
        }
        let hand = [
            (
                MAP_SERVICE_IPS,
                IpFamily::V6,
                "fd00::29 . udp . 53",
                Some("drop"),
            ),
            (
                MAP_SERVICE_IPS,
                IpFamily::V4,
                "172.30.0.41 . tcp . 80",
                Some("jump x"),
            ),
            (
                MAP_SERVICE_IPS,
                IpFamily::V4,
                "172.30.0.41 . 6 . 80",
                Some("goto svc-abc"),
            ),
            (
                MAP_BACKENDS,
                IpFamily::V6,
                "fd00::29 . tcp . 80 . 3",
                Some("fd00::7 . 8080"),
            ),
            (
                MAP_BACKENDS,
                IpFamily::V4,
                "172.30.0.41 . tcp . 80 . 70000",
                Some("10.0.0.7 . 8080"),
            ),
            (
                MAP_BACKENDS,
                IpFamily::V4,
                "fd00::29 . tcp . 80 . 3",
                Some("10.0.0.7 . 8080"),
            ),
            (
                MAP_BACKENDS,
                IpFamily::V4,
                "172.30.0.41 . tcp . 80",
                Some("10.0.0.7 . 8080"),
            ),
            (
                MAP_BACKENDS,
                IpFamily::V4,
                "172.30.0.41 . tcp . 80 . 3",
                Some("10.0.0.0/8 . 1"),
            ),
            (SET_CLUSTER_IPS, IpFamily::V4, "172.30.0.0/16", None),
        ];
        for (set, family, key, value) in hand {
            let one = [(key, value)].into_iter().collect();
            cases.push((set.to_string(), family, one, false));
        }
        let (mut compact, mut elements) = (0, 0);
        for (name, family, set, of_layout) in &cases {
            let layout = Fields::of(name, *family);
            let shape = match name.as_str() {
                SET_SERVICE_CIDRS | SET_NODEPORT_ADDRS => Shape::Intervals,
                SET_FIREWALL_ALLOW => Shape::RangedConcat,
                _ => Shape::Plain,
            };
            for (k, v) in set.iter() {
                for v in [v, None] {
                    elements += 1;
                    let (kt, vt) = (k.text(), v.map(|v| v.text()));
                    let mut by_text = Vec::new();
                    let n = encode_into(&mut by_text, &kt, vt.as_deref(), shape, &layout, *family);
                    let mut by_bytes = Vec::new();
                    let m = encode_packed_into(
                        &mut by_bytes,
                        k.bytes(),
                        v.map(|v| v.bytes()),
                        shape,
                        &layout,
                    );
                    if m.is_none() {
                        assert!(by_bytes.is_empty(), "{name} {kt} {vt:?} left bytes behind");
                        let plain_v4 = shape == Shape::Plain && *family == IpFamily::V4;
                        assert!(
                            !(plain_v4 && *of_layout),
                            "{name} {kt} {vt:?} went by its text"
                        );
                        continue;
                    }
                    compact += 1;
                    assert_eq!(m, n, "{name} {kt} {vt:?}");
                    assert_eq!(by_bytes, by_text, "{name} {kt} {vt:?}");
                }
            }
        }
        assert!(
            compact * 2 > elements,
            "{compact} of {elements} by the compact form"
        );
    }
}
