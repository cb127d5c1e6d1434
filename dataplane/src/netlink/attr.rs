//! Netlink attributes: the one builder every message here is written with and the one
//! reader every reply is decoded with.

use super::consts::NLA_F_NESTED;
use netlink_packet_core::NlasIterator;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Attributes appended to a message as it is written. Nesting writes in place and patches
/// the length afterwards, so a 100 MiB batch is never copied to be wrapped.
pub struct Attrs<'b>(pub &'b mut Vec<u8>);

impl Attrs<'_> {
    pub fn put(&mut self, kind: u16, value: &[u8]) {
        push_attr(self.0, kind, value);
    }

    /// A NUL-terminated string, as the kernel's NLA_STRING and NLA_NUL_STRING want.
    pub fn str(&mut self, kind: u16, s: &str) {
        push_attr(self.0, kind, &cstr(s));
    }

    pub fn be32(&mut self, kind: u16, v: u32) {
        self.put(kind, &v.to_be_bytes());
    }

    pub fn nest(&mut self, kind: u16, f: impl FnOnce(&mut Attrs<'_>)) {
        let at = self.0.len();
        self.0.extend_from_slice(&[0, 0]);
        self.0
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        f(&mut Attrs(self.0));
        let len = (self.0.len() - at) as u16;
        self.0[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    /// Attributes already encoded.
    pub fn raw(&mut self, attrs: &[u8]) {
        self.0.extend_from_slice(attrs);
    }

    /// Attribute `kind` whose value `f` appends in place (no value of its own to copy); if
    /// `f` gives `None`, nothing is left of it.
    pub fn put_with(
        &mut self,
        kind: u16,
        f: impl FnOnce(&mut Vec<u8>) -> Option<()>,
    ) -> Option<()> {
        let at = self.0.len();
        self.0.extend_from_slice(&[0, 0]);
        self.0.extend_from_slice(&kind.to_ne_bytes());
        if f(self.0).is_none() {
            self.0.truncate(at);
            return None;
        }
        let len = self.0.len() - at;
        match (u16::try_from(len).ok(), self.0.get_mut(at..at + 2)) {
            (Some(len), Some(head)) => head.copy_from_slice(&len.to_ne_bytes()),
            _ => {
                self.0.truncate(at);
                return None;
            }
        }
        self.0.resize(at + align(len), 0);
        Some(())
    }

    /// [`Attrs::nest`] whose attributes `f` may fail to write: then nothing is left of it.
    pub fn nest_with(
        &mut self,
        kind: u16,
        f: impl FnOnce(&mut Attrs<'_>) -> Option<()>,
    ) -> Option<()> {
        self.put_with(kind | NLA_F_NESTED, |buf| f(&mut Attrs(buf)))
    }
}

pub fn push_attr(buf: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(value);
    buf.resize(align(buf.len()), 0);
}

/// `inner`, already encoded attributes, as the payload of attribute `kind`.
pub fn nested(buf: &mut Vec<u8>, kind: u16, inner: &[u8]) {
    push_attr(buf, kind | NLA_F_NESTED, inner);
}

pub fn cstr(s: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(s.len() + 1);
    v.extend_from_slice(s.as_bytes());
    v.push(0);
    v
}

/// Netlink's 4-byte alignment of messages and attributes.
pub(super) fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// One netlink attribute: its type (flags masked off) and payload.
pub struct Attr<'a> {
    pub kind: u16,
    pub data: &'a [u8],
}

/// The attributes of `buf`, up to the first malformed one.
pub fn attrs(buf: &[u8]) -> impl Iterator<Item = Attr<'_>> {
    NlasIterator::new(buf).map_while(Result::ok).map(|nla| {
        let (kind, len) = (nla.kind(), usize::from(nla.length()));
        let data = nla.into_inner().get(4..len).unwrap_or(&[]);
        Attr { kind, data }
    })
}

pub fn find(buf: &[u8], kind: u16) -> Option<&[u8]> {
    attrs(buf).find(|a| a.kind == kind).map(|a| a.data)
}

/// A string attribute, its NUL dropped.
pub fn text(data: &[u8]) -> String {
    String::from_utf8_lossy(data)
        .trim_end_matches('\0')
        .to_string()
}

/// An address attribute: 4 bytes IPv4, 16 IPv6.
pub fn ip(data: &[u8]) -> Option<IpAddr> {
    match data.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(data).ok()?))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(data).ok()?))),
        _ => None,
    }
}

pub fn be16(data: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(data.get(..2)?.try_into().ok()?))
}

pub fn be32(data: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(data.get(..4)?.try_into().ok()?))
}

pub fn ne16(data: &[u8]) -> Option<u16> {
    Some(u16::from_ne_bytes(data.get(..2)?.try_into().ok()?))
}

pub fn ne32(data: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(data.get(..4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_written_in_place_read_back() {
        let mut buf = Vec::new();
        let mut a = Attrs(&mut buf);
        a.str(1, "abc");
        a.nest(2, |n| n.be32(3, 7));
        assert_eq!(buf.len() % 4, 0);
        let got: Vec<u16> = attrs(&buf).map(|a| a.kind).collect();
        assert_eq!(got, [1, 2]);
        assert_eq!(find(&buf, 1).map(text).as_deref(), Some("abc"));
        let inner = find(&buf, 2).unwrap_or_default();
        assert_eq!(find(inner, 3).and_then(be32), Some(7));
        // A truncated attribute ends the reading, as a short buffer does.
        assert_eq!(attrs(&buf[..buf.len() - 2]).count(), 1);
    }
}
