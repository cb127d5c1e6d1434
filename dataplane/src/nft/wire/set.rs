//! A set's declaration (`type ipv4_addr . inet_service; flags interval;`, or `typeof ..`)
//! to the NFT_MSG_NEWSET attributes nft 1.0.6 writes for it, user data included: nft reads
//! its `typeof` expressions and byte orders back from there to print the set.

use crate::model::IpFamily;
use crate::netlink::*;

/// nft's data types (src/datatype.h), as set key and data types carry them.
const TYPE_INTEGER: u32 = 4;
const TYPE_IPADDR: u32 = 7;
const TYPE_IP6ADDR: u32 = 8;
const TYPE_INET_PROTOCOL: u32 = 12;
const TYPE_INET_SERVICE: u32 = 13;

/// nft's expression types (src/expression.h) and payload templates, as its `typeof` user
/// data names them.
const EXPR_PAYLOAD: u32 = 7;
const EXPR_META: u32 = 9;
const EXPR_CONCAT: u32 = 13;
const EXPR_NUMGEN: u32 = 23;
const PROTO_IP: u32 = 12;
const PROTO_IP6: u32 = 13;
const PROTO_TCP: u32 = 8;
const PROTO_TH: u32 = 11;
const IPHDR_SADDR: u32 = 11;
const IPHDR_DADDR: u32 = 12;
const IP6HDR_SADDR: u32 = 8;
const IP6HDR_DADDR: u32 = 9;
const TH_DPORT: u32 = 2;

/// libnftnl's set user-data TLV types.
const UDATA_KEYBYTEORDER: u8 = 0;
const UDATA_DATABYTEORDER: u8 = 1;
const UDATA_MERGE_ELEMENTS: u8 = 2;
const UDATA_KEY_TYPEOF: u8 = 3;
const UDATA_DATA_TYPEOF: u8 = 4;
const UDATA_DATA_INTERVAL: u8 = 6;
const UDATA_COMMENT: u8 = 7;
const BYTEORDER_BIG_ENDIAN: u32 = 2;

/// One field of a key or value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Field {
    datatype: u32,
    len: u32,
    /// Its `typeof` expression, when declared with one.
    typeof_: Option<Typeof>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Typeof {
    Payload { desc: u32, field: u32 },
    Meta { key: u32 },
    Numgen { modulus: u32 },
}

/// What a set declaration says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration {
    key: Vec<Field>,
    /// `None`: a set; `Some(empty)`: a verdict map.
    data: Option<Vec<Field>>,
    interval: bool,
    dynamic: bool,
    timeout_ms: Option<u64>,
    /// `flags timeout`: elements may carry timeouts, with or without a default.
    timeout_flag: bool,
    size: Option<u32>,
    typeof_: bool,
}

fn type_field(name: &str) -> Result<Field, String> {
    let (datatype, len) = match name {
        "ipv4_addr" => (TYPE_IPADDR, 4),
        "ipv6_addr" => (TYPE_IP6ADDR, 16),
        "inet_proto" => (TYPE_INET_PROTOCOL, 1),
        "inet_service" => (TYPE_INET_SERVICE, 2),
        _ => return Err(format!("unknown type `{name}`")),
    };
    Ok(Field {
        datatype,
        len,
        typeof_: None,
    })
}

fn typeof_field(expr: &str) -> Result<Field, String> {
    let words: Vec<&str> = expr.split_whitespace().collect();
    let (datatype, len, t) = match words[..] {
        ["ip", "daddr"] => (
            TYPE_IPADDR,
            4,
            Typeof::Payload {
                desc: PROTO_IP,
                field: IPHDR_DADDR,
            },
        ),
        ["ip6", "daddr"] => (
            TYPE_IP6ADDR,
            16,
            Typeof::Payload {
                desc: PROTO_IP6,
                field: IP6HDR_DADDR,
            },
        ),
        ["meta", "l4proto"] => (
            TYPE_INET_PROTOCOL,
            1,
            Typeof::Meta {
                key: NFT_META_L4PROTO,
            },
        ),
        ["th", "dport"] => (
            TYPE_INET_SERVICE,
            2,
            Typeof::Payload {
                desc: PROTO_TH,
                field: TH_DPORT,
            },
        ),
        ["tcp", "dport"] => (
            TYPE_INET_SERVICE,
            2,
            Typeof::Payload {
                desc: PROTO_TCP,
                field: TH_DPORT,
            },
        ),
        ["numgen", "random", "mod", n] => (
            TYPE_INTEGER,
            4,
            Typeof::Numgen {
                modulus: n.parse().map_err(|_| format!("modulus `{n}`"))?,
            },
        ),
        _ => return Err(format!("unknown typeof expression `{expr}`")),
    };
    Ok(Field {
        datatype,
        len,
        typeof_: Some(t),
    })
}

fn fields(text: &str, typeof_: bool) -> Result<Vec<Field>, String> {
    text.split(" . ")
        .map(|f| {
            if typeof_ {
                typeof_field(f.trim())
            } else {
                type_field(f.trim())
            }
        })
        .collect()
}

fn duration_ms(text: &str) -> Result<u64, String> {
    let (n, unit) = text.split_at(text.len().saturating_sub(1));
    let n: u64 = n.parse().map_err(|_| format!("duration `{text}`"))?;
    let per = match unit {
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(format!("duration `{text}`")),
    };
    Ok(n * per)
}

impl Declaration {
    /// Reads a declaration as [`super::super::skeleton`] writes them.
    pub fn parse(decl: &str, map: bool) -> Result<Declaration, String> {
        let mut d = Declaration {
            key: Vec::new(),
            data: None,
            interval: false,
            dynamic: false,
            timeout_ms: None,
            timeout_flag: false,
            size: None,
            typeof_: false,
        };
        for clause in decl.split(';').map(str::trim).filter(|c| !c.is_empty()) {
            let (word, rest) = clause.split_once(' ').unwrap_or((clause, ""));
            match word {
                "type" | "typeof" => {
                    d.typeof_ = word == "typeof";
                    let (key, data) = match rest.split_once(" : ") {
                        Some((k, v)) => (k, Some(v)),
                        None => (rest, None),
                    };
                    d.key = fields(key, d.typeof_)?;
                    d.data = match data {
                        Some("verdict") => Some(Vec::new()),
                        Some(v) => Some(fields(v, d.typeof_)?),
                        None => None,
                    };
                }
                "flags" => {
                    for flag in rest.split(',').map(str::trim) {
                        match flag {
                            "interval" => d.interval = true,
                            "dynamic" => d.dynamic = true,
                            "timeout" => d.timeout_flag = true,
                            f => return Err(format!("unknown flag `{f}`")),
                        }
                    }
                }
                "timeout" => d.timeout_ms = Some(duration_ms(rest)?),
                "size" => d.size = Some(rest.parse().map_err(|_| format!("size `{rest}`"))?),
                w => return Err(format!("unknown clause `{w}`")),
            }
        }
        if d.key.is_empty() {
            return Err("no type".into());
        }
        if map != d.data.is_some() {
            return Err("a map needs a value type, a set has none".into());
        }
        Ok(d)
    }

    fn concat(&self) -> bool {
        self.key.len() > 1
    }

    pub fn flags(&self) -> u32 {
        let mut f = 0;
        if self.data.is_some() {
            f |= NFT_SET_MAP;
        }
        if self.interval {
            f |= NFT_SET_INTERVAL;
            if self.concat() {
                f |= NFT_SET_CONCAT;
            }
        }
        if self.timeout_ms.is_some() || self.timeout_flag {
            f |= NFT_SET_TIMEOUT;
        }
        if self.dynamic {
            f |= NFT_SET_EVAL;
        }
        f
    }

    /// Whether the key is a concatenation with ranges (the pipapo back end), whose lookups
    /// convert the protocol's byte order.
    pub fn ranged_concat(&self) -> bool {
        self.interval && self.concat()
    }

    /// The NEWSET attributes after the table's and the set's name.
    pub fn write(&self, a: &mut Attrs<'_>, id: u32, comment: &str) {
        let (key_type, key_len) = type_and_len(&self.key);
        a.be32(NFTA_SET_FLAGS, self.flags());
        a.be32(NFTA_SET_KEY_TYPE, key_type);
        a.be32(NFTA_SET_KEY_LEN, key_len);
        match &self.data {
            Some(v) if v.is_empty() => {
                a.be32(NFTA_SET_DATA_TYPE, NFT_DATA_VERDICT);
                a.be32(NFTA_SET_DATA_LEN, 0);
            }
            Some(v) => {
                let (t, l) = type_and_len(v);
                a.be32(NFTA_SET_DATA_TYPE, t);
                a.be32(NFTA_SET_DATA_LEN, l);
            }
            None => {}
        }
        if self.size.is_some() || self.ranged_concat() {
            a.nest(NFTA_SET_DESC, |d| {
                if let Some(n) = self.size {
                    d.be32(NFTA_SET_DESC_SIZE, n);
                }
                if self.ranged_concat() {
                    d.nest(NFTA_SET_DESC_CONCAT, |c| {
                        for f in &self.key {
                            c.nest(NFTA_LIST_ELEM, |e| e.be32(NFTA_SET_FIELD_LEN, f.len));
                        }
                    });
                }
            });
        }
        a.be32(NFTA_SET_ID, id);
        if let Some(t) = self.timeout_ms {
            a.put(NFTA_SET_TIMEOUT, &t.to_be_bytes());
        }
        a.put(NFTA_SET_USERDATA, &self.udata(comment));
    }

    /// nft's user data: byte orders, `typeof` expressions, and the comment.
    fn udata(&self, comment: &str) -> Vec<u8> {
        let mut u = Udata::default();
        let order = |fields: &[Field]| match fields {
            [one] if one.typeof_.is_none() => BYTEORDER_BIG_ENDIAN,
            _ => 0,
        };
        u.u32(UDATA_KEYBYTEORDER, order(&self.key));
        if let Some(v) = &self.data {
            u.u32(UDATA_DATABYTEORDER, order(v));
        }
        if self.concat() {
            u.nest(UDATA_KEY_TYPEOF, |n| {
                concat_typeof(n, &self.key, self.typeof_)
            });
        }
        if let Some(v) = self.data.as_ref().filter(|v| v.len() > 1) {
            u.nest(UDATA_DATA_TYPEOF, |n| concat_typeof(n, v, self.typeof_));
        }
        if self.data.is_some() {
            u.u32(UDATA_DATA_INTERVAL, 0);
        }
        u.strz(UDATA_COMMENT, comment);
        u.0
    }
}

/// The key or data type of a concatenation (each field's type in 6 bits) and its length in
/// 4-byte register slots.
fn type_and_len(fields: &[Field]) -> (u32, u32) {
    if let [one] = fields {
        return (one.datatype, one.len);
    }
    let t = fields.iter().fold(0, |acc, f| (acc << 6) | f.datatype);
    let l = fields.iter().map(|f| f.len.div_ceil(4) * 4).sum();
    (t, l)
}

/// A concatenation's typeof record: nft writes one for `type` concatenations too, with no
/// expressions in it.
fn concat_typeof(n: &mut Udata, fields: &[Field], typeof_: bool) {
    n.u32(0, EXPR_CONCAT);
    n.nest(1, |list| {
        if !typeof_ {
            return;
        }
        for (i, f) in fields.iter().enumerate() {
            let Some(t) = f.typeof_ else { continue };
            list.nest(i as u8, |sub| {
                let (kind, values): (u32, Vec<u32>) = match t {
                    Typeof::Payload { desc, field } => (EXPR_PAYLOAD, vec![desc, field]),
                    Typeof::Meta { key } => (EXPR_META, vec![key]),
                    Typeof::Numgen { modulus } => (EXPR_NUMGEN, vec![NFT_NG_RANDOM, modulus, 0]),
                };
                sub.u32(0, kind);
                sub.nest(1, |d| {
                    for (j, v) in values.into_iter().enumerate() {
                        d.u32(j as u8, v);
                    }
                });
            });
        }
    });
}

/// The user data nft writes for the anonymous set of an address list (`ip saddr { .. }`):
/// its byte order, that its ranges merge, and the address it matches.
pub fn anonymous_udata(family: IpFamily, source: bool) -> Vec<u8> {
    let (desc, field) = match (family, source) {
        (IpFamily::V4, true) => (PROTO_IP, IPHDR_SADDR),
        (IpFamily::V4, false) => (PROTO_IP, IPHDR_DADDR),
        (IpFamily::V6, true) => (PROTO_IP6, IP6HDR_SADDR),
        (IpFamily::V6, false) => (PROTO_IP6, IP6HDR_DADDR),
    };
    let mut u = Udata::default();
    u.u32(UDATA_KEYBYTEORDER, BYTEORDER_BIG_ENDIAN);
    u.u32(UDATA_MERGE_ELEMENTS, 1);
    u.nest(UDATA_KEY_TYPEOF, |t| {
        t.u32(0, EXPR_PAYLOAD);
        t.nest(1, |d| {
            d.u32(0, desc);
            d.u32(1, field);
        });
    });
    u.0
}

/// libnftnl's user-data TLVs: a type byte, a length byte, the value, no padding.
#[derive(Debug, Default)]
pub struct Udata(pub Vec<u8>);

impl Udata {
    pub fn put(&mut self, kind: u8, value: &[u8]) {
        self.0.push(kind);
        self.0.push(value.len().min(255) as u8);
        self.0.extend_from_slice(&value[..value.len().min(255)]);
    }
    fn u32(&mut self, kind: u8, v: u32) {
        self.put(kind, &v.to_ne_bytes());
    }
    pub fn strz(&mut self, kind: u8, s: &str) {
        self.put(kind, &cstr(s));
    }
    fn nest(&mut self, kind: u8, f: impl FnOnce(&mut Udata)) {
        let mut inner = Udata::default();
        f(&mut inner);
        self.put(kind, &inner.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The user data nft 1.0.6 wrote for `typeof ip daddr . meta l4proto . th dport .
    /// numgen random mod 1 : ip daddr . tcp dport`, read back from the kernel.
    #[test]
    fn typeof_user_data_is_what_nft_writes() {
        let d = Declaration::parse(
            "typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . tcp dport;",
            true,
        )
        .unwrap();
        let hex: String = d.udata("sy:6").iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "000400000000010400000000\
             03600004 0d000000 01580014 00040700 0000010c 00040c00 00000104 0c000000\
             010e0004 09000000 01060004 10000000 02140004 07000000 010c0004 0b000000\
             01040200 0000031a 00041700 00000112 00040100 00000104 01000000 02040000\
             00000434 00040d00 0000012c 00140004 07000000 010c0004 0c000000 01040c00\
             00000114 00040700 0000010c 00040800 00000104 02000000 06040000 00000705\
             73793a36 00"
                .replace([' ', '\n'], "")
        );
        assert_eq!(type_and_len(&d.key), (0x001c_c344, 16));
        assert_eq!(d.flags(), NFT_SET_MAP);
    }

    #[test]
    fn declarations_outside_the_layout_are_refused() {
        assert!(Declaration::parse("type ether_addr;", false).is_err());
        assert!(Declaration::parse("type ipv4_addr : verdict;", false).is_err());
        let a = Declaration::parse(
            "type ipv4_addr . ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; size 262144; flags dynamic,timeout; timeout 3h;",
            true,
        )
        .unwrap();
        assert_eq!(a.flags(), 0x38);
        assert_eq!(a.timeout_ms, Some(10_800_000));
    }
}
