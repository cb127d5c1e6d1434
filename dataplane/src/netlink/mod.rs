//! Netlink for every kernel backend: the one socket ([`Socket`]: sequence numbers,
//! requests, dumps, acknowledgements, and kernel errors as one [`NetlinkError`] that names
//! the operation), the one attribute builder and reader ([`Attrs`], [`attrs`], [`find`]),
//! the protocol numbers, each defined once, and the one nf_tables batch writer with its one
//! commit protocol, and the nf_tables expressions ([`expr`]). nftables mode's reader and
//! writer (`nft::netlink`, `nft::wire`), the iptables-nft rule
//! writer (`iptables::direct`), ctnetlink (`conntrack`) and IPVS over generic netlink
//! (`ipvs::genl`) all speak through it; what their messages mean stays with them.
//!
//! Taken from netlink-sys: the socket itself (open, bind, connect, multicast membership,
//! send and receive). Taken from netlink-packet-core: the netlink constants, its header
//! type to write message headers, its buffers to read received headers and error codes,
//! and its attribute iterator. Not taken: its `NetlinkMessage`/`Nla` framework, which wants
//! a Rust type per payload and sizes a message in one pass before writing it in another;
//! the messages here are a few attributes each, or batches of 420k messages written once,
//! in place, into one buffer. Nor `NlaBuffer::value`, which lends a value only as long as
//! the buffer wrapper lives: [`attrs`] hands out slices of the datagram itself. It knows
//! nothing of nfnetlink's or generic netlink's family headers or of nf_tables batches, so
//! those are written here.

mod attr;
mod batch;
mod consts;
pub mod expr;
mod socket;

pub use attr::{
    attrs, be16, be32, cstr, find, ip, ne16, ne32, nested, push_attr, text, Attr, Attrs,
};
pub use batch::Batch;
pub use consts::*;
pub use socket::{message, nfgenmsg, Membership, Message, NetlinkError, Request, Socket};
