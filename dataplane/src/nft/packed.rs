//! The compact form of an element's key or value: nft's canonical text (`172.30.0.41 . tcp .
//! 443 . 0`, `goto cluster-2`) as typed fields, addresses as their bytes, ports and slots as
//! numbers, protocols as one byte, anything else as its text; exactly the text comes back.
//!
//! Fields are `" . "`-separated parts of the text. Each starts with a tag byte and knows its
//! own length, so a run of whole fields is a byte prefix of the longer run: the elements whose
//! keys begin with given fields sit together in a tree ordered by these bytes.

use std::fmt::{self, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const V4: u8 = 1;
const V6: u8 = 2;
/// `/len` after an address.
const PREFIX: u8 = 3;
/// A decimal number up to 65535: ports, protocol numbers, backend slots.
const NUM: u8 = 4;
const TCP: u8 = 5;
const UDP: u8 = 6;
const SCTP: u8 = 7;
/// `goto <chain>`, the chain's name after a length byte.
const GOTO: u8 = 8;
/// Any other text, after a length byte.
const TEXT: u8 = 9;
/// Text longer than 255 bytes, after two length bytes.
const LONG: u8 = 10;

/// Append the compact form of `text` to `out`.
pub fn pack(text: &str, out: &mut Vec<u8>) {
    // `text.split(" . ")`, by hand: the substring searcher it sets up per call was a tenth
    // of packing a first sync's elements (perf).
    let b = text.as_bytes();
    let (mut start, mut i) = (0, 0);
    while i + 2 < b.len() {
        if b[i] == b' ' && b[i + 1] == b'.' && b[i + 2] == b' ' {
            field_into(&text[start..i], out);
            i += 3;
            start = i;
        } else {
            i += 1;
        }
    }
    field_into(&text[start..], out);
}

/// The compact form of the whole fields of `prefix`, a key's start ending in `" . "` (or a
/// whole key): the bytes every key beginning with those fields begins with.
pub fn pack_prefix(prefix: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len());
    match prefix.strip_suffix(" . ") {
        Some(whole) => pack(whole, &mut out),
        None => pack(prefix, &mut out),
    }
    out
}

/// Append the field [`pack`] writes for `ip`'s text, without the text.
pub fn push_addr(ip: IpAddr, out: &mut Vec<u8>) {
    match ip {
        IpAddr::V4(a) => {
            out.push(V4);
            out.extend_from_slice(&a.octets());
        }
        IpAddr::V6(a) => {
            out.push(V6);
            out.extend_from_slice(&a.octets());
        }
    }
}

/// Append the field [`pack`] writes for `n`'s text (a port, a backend slot).
pub fn push_number(n: usize, out: &mut Vec<u8>) {
    match u16::try_from(n) {
        Ok(n) => {
            out.push(NUM);
            out.extend_from_slice(&n.to_be_bytes());
        }
        Err(_) => field_into(&n.to_string(), out),
    }
}

/// The number `bytes` holds if it is one number field and nothing else.
pub fn as_number(bytes: &[u8]) -> Option<u16> {
    match bytes {
        [NUM, hi, lo] => Some(u16::from_be_bytes([*hi, *lo])),
        _ => None,
    }
}

fn field_into(field: &str, out: &mut Vec<u8>) {
    match field {
        "tcp" => return out.push(TCP),
        "udp" => return out.push(UDP),
        "sctp" => return out.push(SCTP),
        _ => {}
    }
    if !field.contains(['.', ':']) {
        if let Some(n) = number(field) {
            out.push(NUM);
            return out.extend_from_slice(&n.to_be_bytes());
        }
    }
    let (addr, len) = match field.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (field, None),
    };
    let len = len.map(|l| l.parse::<u8>().ok().filter(|n| n.to_string() == l));
    if len != Some(None) {
        // The parser refuses leading zeros and anything else non-canonical, so a dotted quad
        // it reads prints back as it was (`every_text_comes_back_exactly` holds it to that).
        if let Ok(a) = addr.parse::<Ipv4Addr>() {
            out.push(V4);
            out.extend_from_slice(&a.octets());
            return prefix_into(len.flatten(), out);
        }
        if let Some(a) = addr.parse::<Ipv6Addr>().ok().filter(|a| same(a, addr)) {
            out.push(V6);
            out.extend_from_slice(&a.octets());
            return prefix_into(len.flatten(), out);
        }
    }
    if let Some(chain) = field.strip_prefix("goto ") {
        if let Ok(n) = u8::try_from(chain.len()) {
            out.extend_from_slice(&[GOTO, n]);
            return out.extend_from_slice(chain.as_bytes());
        }
    }
    match u8::try_from(field.len()) {
        Ok(n) => out.extend_from_slice(&[TEXT, n]),
        Err(_) => {
            // Element text is addresses, ports and chain names: far below 64 KiB.
            let n = u16::try_from(field.len()).unwrap_or(u16::MAX);
            out.push(LONG);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
    out.extend_from_slice(field.as_bytes());
}

fn prefix_into(len: Option<u8>, out: &mut Vec<u8>) {
    if let Some(n) = len {
        out.extend_from_slice(&[PREFIX, n]);
    }
}

/// Whether `a` prints as `text`: only then does the compact form give the text back.
fn same(a: &impl fmt::Display, text: &str) -> bool {
    let mut buf = Small::default();
    write!(buf, "{a}").is_ok() && buf.as_str() == text
}

/// A decimal number nft prints as such: no sign, no leading zero, up to 65535.
fn number(s: &str) -> Option<u16> {
    let ok =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    ok.then(|| s.parse().ok()).flatten()
}

/// Whether `rest`, what follows some whole fields of a key, goes on with the last of them (an
/// address's `/len`) rather than starting another.
pub fn continues_field(rest: &[u8]) -> bool {
    rest.first() == Some(&PREFIX)
}

/// Where the first field of `bytes` ends (an address's `/len` included).
pub fn first_field_len(bytes: &[u8]) -> Option<usize> {
    let (&tag, after) = bytes.split_first()?;
    let len = 1 + match tag {
        V4 => 4,
        V6 => 16,
        NUM => 2,
        TCP | UDP | SCTP => 0,
        GOTO | TEXT => 1 + usize::from(*after.first()?),
        LONG => 2 + usize::from(u16::from_be_bytes(*after.first_chunk::<2>()?)),
        _ => return None,
    };
    match bytes.get(len..)? {
        [PREFIX, _, ..] => Some(len + 2),
        _ => Some(len),
    }
}

/// One field, or an address's `/len`, of a compact form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Token<'a> {
    V4([u8; 4]),
    V6([u8; 16]),
    Prefix(u8),
    Num(u16),
    /// `tcp`, `udp` or `sctp`, as its protocol number.
    Proto(u8),
    /// `goto` the named chain.
    Goto(&'a str),
    Text(&'a str),
}

/// The tokens of `bytes`, which `pack` wrote; `Err` at bytes it did not.
pub fn tokens(bytes: &[u8]) -> impl Iterator<Item = Result<Token<'_>, fmt::Error>> + '_ {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        let (&tag, after) = rest.split_first()?;
        let next = token(tag, after);
        rest = match next {
            Ok((_, r)) => r,
            Err(_) => &[],
        };
        Some(next.map(|(t, _)| t))
    })
}

fn text_of(n: usize, r: &[u8]) -> Result<(&str, &[u8]), fmt::Error> {
    let t = r.get(..n).ok_or(fmt::Error)?;
    Ok((std::str::from_utf8(t).map_err(|_| fmt::Error)?, &r[n..]))
}

fn token(tag: u8, after: &[u8]) -> Result<(Token<'_>, &[u8]), fmt::Error> {
    Ok(match tag {
        V4 => {
            let (o, r) = after.split_first_chunk::<4>().ok_or(fmt::Error)?;
            (Token::V4(*o), r)
        }
        V6 => {
            let (o, r) = after.split_first_chunk::<16>().ok_or(fmt::Error)?;
            (Token::V6(*o), r)
        }
        PREFIX => {
            let (n, r) = after.split_first().ok_or(fmt::Error)?;
            (Token::Prefix(*n), r)
        }
        NUM => {
            let (n, r) = after.split_first_chunk::<2>().ok_or(fmt::Error)?;
            (Token::Num(u16::from_be_bytes(*n)), r)
        }
        TCP => (Token::Proto(6), after),
        UDP => (Token::Proto(17), after),
        SCTP => (Token::Proto(132), after),
        GOTO | TEXT => {
            let (n, r) = after.split_first().ok_or(fmt::Error)?;
            let (t, r) = text_of(usize::from(*n), r)?;
            (
                if tag == GOTO {
                    Token::Goto(t)
                } else {
                    Token::Text(t)
                },
                r,
            )
        }
        LONG => {
            let (n, r) = after.split_first_chunk::<2>().ok_or(fmt::Error)?;
            let (t, r) = text_of(usize::from(u16::from_be_bytes(*n)), r)?;
            (Token::Text(t), r)
        }
        _ => return Err(fmt::Error),
    })
}

/// Write the text of the compact form `bytes` to `out`.
pub fn unpack(bytes: &[u8], out: &mut impl fmt::Write) -> fmt::Result {
    let mut first = true;
    for t in tokens(bytes) {
        let t = t?;
        if !matches!(t, Token::Prefix(_)) && !std::mem::take(&mut first) {
            out.write_str(" . ")?;
        }
        match t {
            Token::V4(o) => write_v4(o, out)?,
            Token::V6(o) => write!(out, "{}", Ipv6Addr::from(o))?,
            Token::Prefix(n) => {
                out.write_char('/')?;
                write_u16(u16::from(n), out)?;
            }
            Token::Num(n) => write_u16(n, out)?,
            Token::Proto(p) => out.write_str(match p {
                6 => "tcp",
                17 => "udp",
                _ => "sctp",
            })?,
            Token::Goto(c) => {
                out.write_str("goto ")?;
                out.write_str(c)?;
            }
            Token::Text(t) => out.write_str(t)?,
        }
    }
    Ok(())
}

/// A dotted quad, as `Ipv4Addr` prints it, without the formatting machinery (printing the
/// elements of a first sync is that machinery's busiest use).
fn write_v4(o: [u8; 4], out: &mut impl fmt::Write) -> fmt::Result {
    for (i, b) in o.into_iter().enumerate() {
        if i > 0 {
            out.write_char('.')?;
        }
        write_u16(u16::from(b), out)?;
    }
    Ok(())
}

fn write_u16(n: u16, out: &mut impl fmt::Write) -> fmt::Result {
    let mut buf = [0u8; 5];
    let mut at = buf.len();
    let mut n = n;
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.write_str(std::str::from_utf8(&buf[at..]).map_err(|_| fmt::Error)?)
}

/// The text of the compact form `bytes`.
pub fn text(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    // Only bytes `pack` wrote reach here.
    let _ = unpack(bytes, &mut s);
    s
}

/// A stack buffer for printing one address.
struct Small {
    buf: [u8; 48],
    len: usize,
}

impl Default for Small {
    fn default() -> Self {
        Small {
            buf: [0; 48],
            len: 0,
        }
    }
}

impl Small {
    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

impl fmt::Write for Small {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        self.buf
            .get_mut(self.len..end)
            .ok_or(fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(text: &str) -> Vec<u8> {
        let mut b = Vec::new();
        pack(text, &mut b);
        assert_eq!(super::text(&b), text, "{text:?} did not come back");
        b
    }

    #[test]
    fn fields_built_from_values_are_those_packed_from_their_text() {
        for ip in [
            "10.0.0.1",
            "fd00::1",
            "::ffff:10.0.0.1",
            "2001:db8::8:800:200c:417a",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let (mut built, mut packed) = (Vec::new(), Vec::new());
            push_addr(ip, &mut built);
            pack(&ip.to_string(), &mut packed);
            assert_eq!(built, packed, "{ip}");
        }
        for n in [0usize, 7, 8443, 65535, 65536, 1 << 20] {
            let (mut built, mut packed) = (Vec::new(), Vec::new());
            push_number(n, &mut built);
            pack(&n.to_string(), &mut packed);
            assert_eq!(built, packed, "{n}");
            assert_eq!(as_number(&built), u16::try_from(n).ok(), "{n}");
        }
        let mut two = Vec::new();
        pack("80 . 0", &mut two);
        assert_eq!(as_number(&two), None, "two fields are not one number");
    }

    #[test]
    fn every_text_comes_back_exactly() {
        for t in [
            "172.30.0.41 . tcp . 443 . 0",
            "10.180.0.1 . 8443",
            "goto cluster-2",
            "fd00::1 . udp . 53 . 12",
            "fd00:0::1",
            "172.30.0.0/16",
            "10.0.0.0/8 . sctp . 65535 . 192.168.0.0/16",
            "10.0.0.1-10.0.0.5",
            "010.0.0.1",
            "1.2.3.4/33",
            "1.2.3.4/08",
            "65536 . 00 . 07 . -1",
            "accept",
            "drop",
            "jump x",
            "",
            " . ",
            "a .  . b",
            "x . ",
            &"n".repeat(300),
            &format!("goto {}", "c".repeat(300)),
            "ü . 1",
            " . . ",
            "1 .. 2",
            "a . b .",
        ] {
            round(t);
        }
    }

    #[test]
    fn addresses_and_numbers_take_their_bytes_alone() {
        assert_eq!(round("172.30.0.41 . tcp . 443 . 0").len(), 5 + 1 + 3 + 3);
        assert_eq!(round("10.180.0.1 . 8443").len(), 5 + 3);
        assert_eq!(round("fd00::1 . udp . 53").len(), 17 + 1 + 3);
        assert_eq!(round("172.30.0.0/16").len(), 5 + 2);
        assert_eq!(round("goto cluster-2").len(), 2 + "cluster-2".len());
    }

    #[test]
    fn whole_fields_are_a_byte_prefix_of_longer_keys() {
        for (prefix, key, starts) in [
            (
                "172.30.0.41 . tcp . 443 . ",
                "172.30.0.41 . tcp . 443 . 7",
                true,
            ),
            (
                "172.30.0.41 . tcp . 44 . ",
                "172.30.0.41 . tcp . 443 . 7",
                false,
            ),
            ("172.30.0.4 . ", "172.30.0.41 . tcp", false),
            ("a . ", "ab . 1", false),
            ("a . ", "a . 1", true),
        ] {
            let mut k = Vec::new();
            pack(key, &mut k);
            assert_eq!(
                k.starts_with(&pack_prefix(prefix)),
                starts,
                "{prefix:?} {key:?}"
            );
        }
    }
}
