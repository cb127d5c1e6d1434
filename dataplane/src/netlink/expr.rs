//! The nf_tables expressions rules are made of, each written as one NFTA_LIST_ELEM of a
//! rule's NFTA_RULE_EXPRESSIONS: nftables mode's rules (`nft::wire`) and iptables-nft's
//! native matches (`iptables::direct`) alike.

use super::attr::Attrs;
use super::consts::*;
use crate::model::IpFamily;

/// A verdict, as an immediate or a map value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict<'a> {
    Accept,
    Drop,
    Return,
    Jump(&'a str),
    Goto(&'a str),
}

/// NFTA_DATA_VERDICT of `v`, written into `a`.
pub fn verdict_data(a: &mut Attrs<'_>, v: Verdict<'_>) {
    let (code, chain) = match v {
        Verdict::Accept => (NF_ACCEPT, None),
        Verdict::Drop => (NF_DROP, None),
        Verdict::Return => (NFT_RETURN, None),
        Verdict::Jump(c) => (NFT_JUMP, Some(c)),
        Verdict::Goto(c) => (NFT_GOTO, Some(c)),
    };
    a.nest(NFTA_DATA_VERDICT, |d| {
        d.put(NFTA_VERDICT_CODE, &code.to_be_bytes());
        if let Some(c) = chain {
            d.str(NFTA_VERDICT_CHAIN, c);
        }
    });
}

pub trait Expressions {
    /// One expression: NFTA_LIST_ELEM { NFTA_EXPR_NAME, NFTA_EXPR_DATA { .. } }.
    fn expr(&mut self, name: &str, f: impl FnOnce(&mut Attrs<'_>));
    fn payload(&mut self, base: u32, offset: u32, len: u32, dreg: u32);
    fn meta(&mut self, key: u32, dreg: u32);
    fn meta_set(&mut self, key: u32, sreg: u32);
    /// `direction`: Some(0) for the original direction.
    fn ct(&mut self, key: u32, direction: Option<u8>, dreg: u32);
    fn cmp(&mut self, sreg: u32, op: u32, value: &[u8]);
    /// `reg = (reg & mask) ^ xor`.
    fn bitwise(&mut self, reg: u32, mask: &[u8], xor: &[u8]);
    fn byteorder_hton(&mut self, reg: u32, size: u32, len: u32);
    fn verdict(&mut self, v: Verdict<'_>);
    fn lookup(&mut self, set: &str, sreg: u32, dreg: Option<u32>, id: Option<u32>, invert: bool);
    fn fib(&mut self, flags: u32, dreg: u32);
    fn reject(&mut self, kind: u32, code: u8);
    fn masq(&mut self, flags: u32);
    fn dnat(&mut self, family: IpFamily, addr: u32, proto: u32);
    fn numgen(&mut self, modulus: u32, dreg: u32);
    fn dynset_update(&mut self, set: &str, key: u32, data: u32, timeout_ms: u64);
    fn xt(&mut self, kind: &str, name: &str, rev: u32, info: &[u8]);
    /// `address [!=] network/prefix` on the address at `offset` of the network header, as
    /// nft and iptables-nft write it: a prefix on a byte boundary compares only its bytes;
    /// any other masks the whole address first.
    fn prefix_match(&mut self, offset: u32, network: &[u8], prefix: u32, op: u32) {
        if prefix == 0 {
            // Every address: no bytes to compare, and the kernel refuses a zero-length
            // load. One byte masked to nothing equals zero always, so `==` always holds
            // and `!=` never does.
            self.payload(NFT_PAYLOAD_NETWORK_HEADER, offset, 1, NFT_REG_1);
            self.bitwise(NFT_REG_1, &[0], &[0]);
            self.cmp(NFT_REG_1, op, &[0]);
        } else if prefix.is_multiple_of(8) {
            let n = (prefix / 8) as usize;
            self.payload(NFT_PAYLOAD_NETWORK_HEADER, offset, n as u32, NFT_REG_1);
            self.cmp(NFT_REG_1, op, &network[..n]);
        } else {
            let mask: Vec<u8> = (0..network.len() as u32)
                .map(|i| {
                    let bits = prefix.saturating_sub(i * 8).min(8);
                    (0xffu16 << (8 - bits)) as u8
                })
                .collect();
            let masked: Vec<u8> = network.iter().zip(&mask).map(|(b, m)| b & m).collect();
            let len = network.len() as u32;
            self.payload(NFT_PAYLOAD_NETWORK_HEADER, offset, len, NFT_REG_1);
            self.bitwise(NFT_REG_1, &mask, &vec![0; network.len()]);
            self.cmp(NFT_REG_1, op, &masked);
        }
    }
}

impl Expressions for Attrs<'_> {
    fn expr(&mut self, name: &str, f: impl FnOnce(&mut Attrs<'_>)) {
        self.nest(NFTA_LIST_ELEM, |e| {
            e.str(NFTA_EXPR_NAME, name);
            e.nest(NFTA_EXPR_DATA, f);
        });
    }
    fn payload(&mut self, base: u32, offset: u32, len: u32, dreg: u32) {
        self.expr("payload", |a| {
            a.be32(NFTA_PAYLOAD_DREG, dreg);
            a.be32(NFTA_PAYLOAD_BASE, base);
            a.be32(NFTA_PAYLOAD_OFFSET, offset);
            a.be32(NFTA_PAYLOAD_LEN, len);
        });
    }
    fn meta(&mut self, key: u32, dreg: u32) {
        self.expr("meta", |a| {
            a.be32(NFTA_META_KEY, key);
            a.be32(NFTA_META_DREG, dreg);
        });
    }
    fn meta_set(&mut self, key: u32, sreg: u32) {
        self.expr("meta", |a| {
            a.be32(NFTA_META_KEY, key);
            a.be32(NFTA_META_SREG, sreg);
        });
    }
    fn ct(&mut self, key: u32, direction: Option<u8>, dreg: u32) {
        self.expr("ct", |a| {
            a.be32(NFTA_CT_KEY, key);
            a.be32(NFTA_CT_DREG, dreg);
            if let Some(d) = direction {
                a.put(NFTA_CT_DIRECTION, &[d]);
            }
        });
    }
    fn cmp(&mut self, sreg: u32, op: u32, value: &[u8]) {
        self.expr("cmp", |a| {
            a.be32(NFTA_CMP_SREG, sreg);
            a.be32(NFTA_CMP_OP, op);
            a.nest(NFTA_CMP_DATA, |d| d.put(NFTA_DATA_VALUE, value));
        });
    }
    fn bitwise(&mut self, reg: u32, mask: &[u8], xor: &[u8]) {
        self.expr("bitwise", |a| {
            a.be32(NFTA_BITWISE_SREG, reg);
            a.be32(NFTA_BITWISE_DREG, reg);
            a.be32(NFTA_BITWISE_LEN, mask.len() as u32);
            a.nest(NFTA_BITWISE_MASK, |d| d.put(NFTA_DATA_VALUE, mask));
            a.nest(NFTA_BITWISE_XOR, |d| d.put(NFTA_DATA_VALUE, xor));
        });
    }
    fn byteorder_hton(&mut self, reg: u32, size: u32, len: u32) {
        self.expr("byteorder", |a| {
            a.be32(NFTA_BYTEORDER_SREG, reg);
            a.be32(NFTA_BYTEORDER_DREG, reg);
            a.be32(NFTA_BYTEORDER_OP, NFT_BYTEORDER_HTON);
            a.be32(NFTA_BYTEORDER_LEN, len);
            a.be32(NFTA_BYTEORDER_SIZE, size);
        });
    }
    fn verdict(&mut self, v: Verdict<'_>) {
        self.expr("immediate", |a| {
            a.be32(NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT);
            a.nest(NFTA_IMMEDIATE_DATA, |d| verdict_data(d, v));
        });
    }
    fn lookup(&mut self, set: &str, sreg: u32, dreg: Option<u32>, id: Option<u32>, invert: bool) {
        self.expr("lookup", |a| {
            a.str(NFTA_LOOKUP_SET, set);
            a.be32(NFTA_LOOKUP_SREG, sreg);
            if let Some(d) = dreg {
                a.be32(NFTA_LOOKUP_DREG, d);
            }
            if let Some(i) = id {
                a.be32(NFTA_LOOKUP_SET_ID, i);
            }
            if invert {
                a.be32(NFTA_LOOKUP_FLAGS, NFT_LOOKUP_F_INV);
            }
        });
    }
    fn fib(&mut self, flags: u32, dreg: u32) {
        self.expr("fib", |a| {
            a.be32(NFTA_FIB_DREG, dreg);
            a.be32(NFTA_FIB_RESULT, NFT_FIB_RESULT_ADDRTYPE);
            a.be32(NFTA_FIB_FLAGS, flags);
        });
    }
    fn reject(&mut self, kind: u32, code: u8) {
        self.expr("reject", |a| {
            a.be32(NFTA_REJECT_TYPE, kind);
            a.put(NFTA_REJECT_ICMP_CODE, &[code]);
        });
    }
    fn masq(&mut self, flags: u32) {
        self.expr("masq", |a| a.be32(NFTA_MASQ_FLAGS, flags));
    }
    fn dnat(&mut self, family: IpFamily, addr: u32, proto: u32) {
        self.expr("nat", |a| {
            a.be32(NFTA_NAT_TYPE, NFT_NAT_DNAT);
            a.be32(NFTA_NAT_FAMILY, u32::from(nfproto(family)));
            a.be32(NFTA_NAT_REG_ADDR_MIN, addr);
            a.be32(NFTA_NAT_REG_PROTO_MIN, proto);
        });
    }
    fn numgen(&mut self, modulus: u32, dreg: u32) {
        self.expr("numgen", |a| {
            a.be32(NFTA_NG_DREG, dreg);
            a.be32(NFTA_NG_MODULUS, modulus);
            a.be32(NFTA_NG_TYPE, NFT_NG_RANDOM);
            a.be32(NFTA_NG_OFFSET, 0);
        });
    }
    fn dynset_update(&mut self, set: &str, key: u32, data: u32, timeout_ms: u64) {
        self.expr("dynset", |a| {
            a.str(NFTA_DYNSET_SET_NAME, set);
            a.be32(NFTA_DYNSET_OP, NFT_DYNSET_OP_UPDATE);
            a.be32(NFTA_DYNSET_SREG_KEY, key);
            a.be32(NFTA_DYNSET_SREG_DATA, data);
            a.put(NFTA_DYNSET_TIMEOUT, &timeout_ms.to_be_bytes());
        });
    }
    fn xt(&mut self, kind: &str, name: &str, rev: u32, info: &[u8]) {
        self.expr(kind, |a| {
            a.str(NFTA_XT_NAME, name);
            a.be32(NFTA_XT_REV, rev);
            a.put(NFTA_XT_INFO, info);
        });
    }
}
