//! The numbers of the netlink protocols spoken here, each defined once: netlink's own (taken
//! from netlink-packet-core), nfnetlink's (linux/netfilter/nfnetlink.h) and nf_tables'
//! (linux/netfilter/nf_tables.h). Numbers only one protocol module uses (ctnetlink's
//! attributes, IPVS's) stay beside their encoding.

use crate::model::IpFamily;

pub use netlink_packet_core::{
    NLA_F_NESTED, NLMSG_DONE, NLMSG_ERROR, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP,
    NLM_F_DUMP_INTR, NLM_F_EXCL, NLM_F_REQUEST,
};
pub use netlink_sys::protocols::{NETLINK_GENERIC, NETLINK_NETFILTER};

// linux/netfilter/nfnetlink.h
pub const NFNL_SUBSYS_CTNETLINK: u16 = 1;
pub const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub const NFNL_MSG_BATCH_END: u16 = 0x11;
/// The nf_tables multicast group: every committed change, whoever made it.
pub const NFNLGRP_NFTABLES: u32 = 7;

// linux/netfilter.h
pub const NFPROTO_UNSPEC: u8 = 0;
pub const NFPROTO_IPV4: u8 = 2;
pub const NFPROTO_IPV6: u8 = 10;

/// The nfgenmsg family of `family`'s tables and conntrack entries.
pub fn nfproto(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => NFPROTO_IPV4,
        IpFamily::V6 => NFPROTO_IPV6,
    }
}

// nf_tables messages.
pub const NFT_MSG_NEWTABLE: u16 = 0;
pub const NFT_MSG_GETTABLE: u16 = 1;
pub const NFT_MSG_DELTABLE: u16 = 2;
pub const NFT_MSG_NEWCHAIN: u16 = 3;
pub const NFT_MSG_GETCHAIN: u16 = 4;
pub const NFT_MSG_DELCHAIN: u16 = 5;
pub const NFT_MSG_NEWRULE: u16 = 6;
pub const NFT_MSG_GETRULE: u16 = 7;
pub const NFT_MSG_DELRULE: u16 = 8;
pub const NFT_MSG_NEWSET: u16 = 9;
pub const NFT_MSG_GETSET: u16 = 10;
pub const NFT_MSG_NEWSETELEM: u16 = 12;
pub const NFT_MSG_GETSETELEM: u16 = 13;
pub const NFT_MSG_DELSETELEM: u16 = 14;
pub const NFT_MSG_NEWGEN: u16 = 15;
pub const NFT_MSG_GETGEN: u16 = 16;

// nf_tables attributes of tables, chains, rules, sets, elements and the generation.
/// Every table, chain, rule, set, element, object and flowtable message carries its
/// table's name as attribute 1, whatever the message's own name for it.
pub const NFTA_ANY_TABLE: u16 = 1;
pub const NFTA_TABLE_NAME: u16 = 1;
pub const NFTA_GEN_ID: u16 = 1;
pub const NFTA_CHAIN_TABLE: u16 = 1;
pub const NFTA_CHAIN_NAME: u16 = 3;
pub const NFTA_CHAIN_HOOK: u16 = 4;
pub const NFTA_CHAIN_POLICY: u16 = 5;
pub const NFTA_CHAIN_TYPE: u16 = 7;
pub const NFTA_HOOK_HOOKNUM: u16 = 1;
pub const NFTA_HOOK_PRIORITY: u16 = 2;
pub const NFTA_RULE_TABLE: u16 = 1;
pub const NFTA_RULE_CHAIN: u16 = 2;
pub const NFTA_RULE_EXPRESSIONS: u16 = 4;
pub const NFTA_RULE_COMPAT: u16 = 5;
pub const NFTA_RULE_USERDATA: u16 = 7;
pub const NFTA_RULE_COMPAT_PROTO: u16 = 1;
pub const NFTA_RULE_COMPAT_FLAGS: u16 = 2;
pub const NFTA_SET_TABLE: u16 = 1;
pub const NFTA_SET_NAME: u16 = 2;
pub const NFTA_SET_FLAGS: u16 = 3;
pub const NFTA_SET_KEY_TYPE: u16 = 4;
pub const NFTA_SET_KEY_LEN: u16 = 5;
pub const NFTA_SET_DATA_TYPE: u16 = 6;
pub const NFTA_SET_DATA_LEN: u16 = 7;
pub const NFTA_SET_DESC: u16 = 9;
pub const NFTA_SET_ID: u16 = 10;
pub const NFTA_SET_TIMEOUT: u16 = 11;
pub const NFTA_SET_USERDATA: u16 = 13;
pub const NFTA_SET_DESC_SIZE: u16 = 1;
pub const NFTA_SET_DESC_CONCAT: u16 = 2;
pub const NFTA_SET_FIELD_LEN: u16 = 1;
pub const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
pub const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;
pub const NFTA_LIST_ELEM: u16 = 1;
pub const NFTA_SET_ELEM_KEY: u16 = 1;
pub const NFTA_SET_ELEM_DATA: u16 = 2;
pub const NFTA_SET_ELEM_FLAGS: u16 = 3;
pub const NFTA_SET_ELEM_KEY_END: u16 = 10;
pub const NFTA_DATA_VALUE: u16 = 1;
pub const NFTA_DATA_VERDICT: u16 = 2;
pub const NFTA_VERDICT_CODE: u16 = 1;
pub const NFTA_VERDICT_CHAIN: u16 = 2;

// nf_tables attributes of expressions (what iptables-nft's rules are made of).
pub const NFTA_EXPR_NAME: u16 = 1;
pub const NFTA_EXPR_DATA: u16 = 2;
pub const NFTA_PAYLOAD_DREG: u16 = 1;
pub const NFTA_PAYLOAD_BASE: u16 = 2;
pub const NFTA_PAYLOAD_OFFSET: u16 = 3;
pub const NFTA_PAYLOAD_LEN: u16 = 4;
pub const NFTA_CMP_SREG: u16 = 1;
pub const NFTA_CMP_OP: u16 = 2;
pub const NFTA_CMP_DATA: u16 = 3;
pub const NFTA_BITWISE_SREG: u16 = 1;
pub const NFTA_BITWISE_DREG: u16 = 2;
pub const NFTA_BITWISE_LEN: u16 = 3;
pub const NFTA_BITWISE_MASK: u16 = 4;
pub const NFTA_BITWISE_XOR: u16 = 5;
pub const NFTA_META_DREG: u16 = 1;
pub const NFTA_META_KEY: u16 = 2;
pub const NFTA_META_SREG: u16 = 3;
pub const NFTA_IMMEDIATE_DREG: u16 = 1;
pub const NFTA_IMMEDIATE_DATA: u16 = 2;
pub const NFTA_CT_DREG: u16 = 1;
pub const NFTA_CT_KEY: u16 = 2;
pub const NFTA_CT_DIRECTION: u16 = 3;
pub const NFTA_LOOKUP_SET: u16 = 1;
pub const NFTA_LOOKUP_SREG: u16 = 2;
pub const NFTA_LOOKUP_DREG: u16 = 3;
pub const NFTA_LOOKUP_SET_ID: u16 = 4;
pub const NFTA_LOOKUP_FLAGS: u16 = 5;
pub const NFTA_FIB_DREG: u16 = 1;
pub const NFTA_FIB_RESULT: u16 = 2;
pub const NFTA_FIB_FLAGS: u16 = 3;
pub const NFTA_REJECT_TYPE: u16 = 1;
pub const NFTA_REJECT_ICMP_CODE: u16 = 2;
pub const NFTA_NAT_TYPE: u16 = 1;
pub const NFTA_NAT_FAMILY: u16 = 2;
pub const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
pub const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
pub const NFTA_MASQ_FLAGS: u16 = 1;
pub const NFTA_NG_DREG: u16 = 1;
pub const NFTA_NG_MODULUS: u16 = 2;
pub const NFTA_NG_TYPE: u16 = 3;
pub const NFTA_NG_OFFSET: u16 = 4;
pub const NFTA_DYNSET_SET_NAME: u16 = 1;
pub const NFTA_DYNSET_OP: u16 = 3;
pub const NFTA_DYNSET_SREG_KEY: u16 = 4;
pub const NFTA_DYNSET_SREG_DATA: u16 = 5;
pub const NFTA_DYNSET_TIMEOUT: u16 = 6;
pub const NFTA_BYTEORDER_SREG: u16 = 1;
pub const NFTA_BYTEORDER_DREG: u16 = 2;
pub const NFTA_BYTEORDER_OP: u16 = 3;
pub const NFTA_BYTEORDER_LEN: u16 = 4;
pub const NFTA_BYTEORDER_SIZE: u16 = 5;
pub const NFTA_COUNTER_BYTES: u16 = 1;
pub const NFTA_COUNTER_PACKETS: u16 = 2;
/// The xtables match and target expressions share their attribute numbers.
pub const NFTA_XT_NAME: u16 = 1;
pub const NFTA_XT_REV: u16 = 2;
pub const NFTA_XT_INFO: u16 = 3;

// nf_tables values.
pub const NFT_REG_VERDICT: u32 = 0;
pub const NFT_REG_1: u32 = 1;
pub const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
pub const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
pub const NFT_CMP_EQ: u32 = 0;
pub const NFT_CMP_NEQ: u32 = 1;
pub const NFT_META_L4PROTO: u32 = 16;
pub const NFT_META_MARK: u32 = 3;
pub const NFT_META_IIFNAME: u32 = 6;
pub const NFT_CT_STATE: u32 = 0;
pub const NFT_CT_STATUS: u32 = 2;
pub const NFT_CT_PROTO_DST: u32 = 12;
pub const NFT_CT_DST_IP: u32 = 20;
pub const NFT_CT_DST_IP6: u32 = 22;
pub const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;
pub const NFT_FIB_F_SADDR: u32 = 1;
pub const NFT_FIB_F_DADDR: u32 = 2;
pub const NFT_LOOKUP_F_INV: u32 = 1;
pub const NFT_REJECT_ICMP_UNREACH: u32 = 0;
pub const NFT_NAT_DNAT: u32 = 1;
pub const NFT_NG_RANDOM: u32 = 1;
pub const NFT_DYNSET_OP_UPDATE: u32 = 1;
pub const NFT_BYTEORDER_HTON: u32 = 1;
pub const NFT_DATA_VERDICT: u32 = 0xffff_ff00;
pub const NF_ACCEPT: i32 = 1;
pub const NF_DROP: i32 = 0;
pub const NFT_RETURN: i32 = -5;
pub const NFT_GOTO: i32 = -4;
pub const NFT_JUMP: i32 = -3;
/// NF_NAT_RANGE_PROTO_RANDOM_FULLY.
pub const NF_NAT_RANGE_PROTO_RANDOM_FULLY: u32 = 0x10;
pub const NFT_SET_ANONYMOUS: u32 = 0x1;
pub const NFT_SET_CONSTANT: u32 = 0x2;
pub const NFT_SET_INTERVAL: u32 = 0x4;
pub const NFT_SET_MAP: u32 = 0x8;
pub const NFT_SET_TIMEOUT: u32 = 0x10;
pub const NFT_SET_EVAL: u32 = 0x20;
pub const NFT_SET_CONCAT: u32 = 0x80;
pub const NFT_SET_ELEM_INTERVAL_END: u32 = 0x1;
