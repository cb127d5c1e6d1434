//! Notifications of nf_tables commits: every batch the kernel commits ends with a NEWGEN
//! message to the NFNLGRP_NFTABLES multicast group, whoever committed it (nft, another
//! firewall, `nft flush ruleset`). The agent listens here so that a change to its tables is
//! looked at at once instead of at the next periodic check, without polling.

use super::netlink::{NetlinkError, Reader, NFNL_SUBSYS_NFTABLES};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};

/// linux/netfilter/nfnetlink.h: the nf_tables multicast group.
const NFNLGRP_NFTABLES: u32 = 7;
/// linux/netfilter/nf_tables.h.
const NFT_MSG_NEWGEN: u16 = 15;
/// errno ENOBUFS: the socket's queue overflowed and notifications were lost.
const ENOBUFS: i32 = 105;

/// A subscription to the commit notifications of the calling thread's network namespace.
pub struct Commits {
    reader: Reader,
}

impl Commits {
    pub fn subscribe() -> Result<Commits, NetlinkError> {
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(NetlinkError::Socket)?;
        socket.bind_auto().map_err(NetlinkError::Socket)?;
        socket
            .add_membership(NFNLGRP_NFTABLES)
            .map_err(NetlinkError::Socket)?;
        Ok(Commits {
            reader: Reader { socket, seq: 0 },
        })
    }

    /// Block until at least one commit is announced; how many were in what was read. Lost
    /// notifications (a full queue) count as one: something was committed.
    pub fn wait(&mut self) -> Result<usize, NetlinkError> {
        loop {
            match self.reader.receive() {
                Ok(messages) => {
                    let n = messages
                        .iter()
                        .filter(|m| m.kind == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN)
                        .count();
                    if n > 0 {
                        return Ok(n);
                    }
                }
                Err(NetlinkError::Socket(e)) if e.raw_os_error() == Some(ENOBUFS) => return Ok(1),
                Err(e) => return Err(e),
            }
        }
    }
}
