//! Notifications of nf_tables changes: the kernel announces every object a committed batch
//! adds or deletes to the NFNLGRP_NFTABLES multicast group, whoever committed it (nft,
//! another firewall, `nft flush ruleset`), each naming its table. The agent listens here
//! so that a change to its own tables is looked at at once instead of at the next periodic
//! check, without polling; changes to other programs' tables (a CNI plugin adding rules per
//! pod) do not wake it, but the generations they made are noted as leaving ours alone
//! ([`Generations`]).

use super::generations::Generations;
use super::tables::TABLE;
use crate::netlink::{
    attrs, be32, find, Membership, NetlinkError, Socket, NETLINK_NETFILTER, NFNLGRP_NFTABLES,
    NFNL_SUBSYS_NFTABLES, NFTA_ANY_TABLE, NFTA_GEN_ID, NFT_MSG_NEWGEN,
};
use nix::errno::Errno::ENOBUFS;
use std::sync::Mutex;

/// A subscription to the commit notifications of the calling thread's network namespace.
pub struct Commits {
    socket: Socket,
}

impl Commits {
    pub fn subscribe() -> Result<Commits, NetlinkError> {
        Ok(Commits {
            socket: Socket::subscribe(
                NETLINK_NETFILTER,
                "nfnetlink-notifications",
                NFNLGRP_NFTABLES,
            )?,
        })
    }

    /// A handle to leave the group while our own commits run, and join it again.
    pub fn membership(&self) -> Membership {
        self.socket.membership(NFNLGRP_NFTABLES)
    }

    /// Block until someone else's change to a table named like ours is announced; how
    /// many such messages were in what was read. Every batch's end is noted in `seen`.
    /// Lost notifications (a full queue) count as one change: anything may have changed.
    pub fn wait(&mut self, seen: &Mutex<Generations>) -> Result<usize, NetlinkError> {
        loop {
            match self.socket.receive("commit notifications") {
                Ok(messages) => {
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    let mut n = 0;
                    for m in messages
                        .iter()
                        .filter(|m| m.kind >> 8 == NFNL_SUBSYS_NFTABLES)
                    {
                        if m.kind & 0xff == NFT_MSG_NEWGEN {
                            match generation_of(m.body) {
                                Some(g) => seen.committed_by(g, m.pid),
                                None => seen.lost(generation_now()),
                            }
                        } else if seen.announced(m.pid, names_our_table(m.body)) {
                            n += 1;
                        }
                    }
                    if n > 0 {
                        return Ok(n);
                    }
                }
                Err(NetlinkError::Socket { error, .. })
                    if error.raw_os_error() == Some(ENOBUFS as i32) =>
                {
                    // The socket reports the overflow once and goes on receiving.
                    tracing::info!(
                        "the kernel's change notifications overflowed (ENOBUFS, some were lost): looking at our tables"
                    );
                    let now = generation_now();
                    seen.lock().unwrap_or_else(|p| p.into_inner()).lost(now);
                    return Ok(1);
                }
                Err(e) => {
                    let now = generation_now();
                    seen.lock().unwrap_or_else(|p| p.into_inner()).lost(now);
                    return Err(e);
                }
            }
        }
    }
}

/// The kernel's generation now, asked on a socket of its own; `None` when it cannot be.
pub fn generation_now() -> Option<u32> {
    super::netlink::Reader::open()
        .and_then(|mut r| r.generation())
        .ok()
}

/// The generation a NEWGEN notification announces.
fn generation_of(body: &[u8]) -> Option<u32> {
    find(body.get(4..)?, NFTA_GEN_ID).and_then(be32)
}

/// Whether a notification's body (nfgenmsg, then attributes) names our table.
fn names_our_table(body: &[u8]) -> bool {
    attrs(body.get(4..).unwrap_or(&[])).any(|a| {
        a.kind == NFTA_ANY_TABLE && a.data.strip_suffix(&[0]).unwrap_or(a.data) == TABLE.as_bytes()
    })
}

#[cfg(test)]
mod tests {
    use super::names_our_table;

    fn body(name: &str) -> Vec<u8> {
        let mut b = vec![2, 0, 0, 0];
        let payload = format!("{name}\0");
        let len = 4 + payload.len();
        b.extend_from_slice(&(len as u16).to_ne_bytes());
        b.extend_from_slice(&1u16.to_ne_bytes());
        b.extend_from_slice(payload.as_bytes());
        while b.len() % 4 != 0 {
            b.push(0);
        }
        b
    }

    #[test]
    fn only_changes_to_our_table_wake_the_agent() {
        assert!(names_our_table(&body("switchyard")));
        assert!(!names_our_table(&body("kube-proxy")));
        assert!(!names_our_table(&body("switchyard2")));
        assert!(!names_our_table(&[2, 0, 0, 0]));
    }
}
