//! Notifications of nf_tables changes: the kernel announces every object a committed batch
//! adds or deletes to the NFNLGRP_NFTABLES multicast group, whoever committed it (nft,
//! another firewall, `nft flush ruleset`), each naming its table. The agent listens here
//! so that a change to its own tables is looked at at once instead of at the next periodic
//! check, without polling; changes to other programs' tables (a CNI plugin adding rules per
//! pod) do not wake it, but the generations they made are noted as leaving ours alone
//! ([`Generations`]). A notification that someone else added or deleted elements of our
//! sets is noted with their keys, which a check then looks up instead of reading back.

use super::generations::Generations;
use super::tables::TABLE;
use crate::netlink::{
    attrs, be32, find, Membership, NetlinkError, Socket, NETLINK_NETFILTER, NFNLGRP_NFTABLES,
    NFNL_SUBSYS_NFTABLES, NFTA_ANY_TABLE, NFTA_GEN_ID, NFT_MSG_DELCHAIN, NFT_MSG_DELRULE,
    NFT_MSG_DELSETELEM, NFT_MSG_NEWCHAIN, NFT_MSG_NEWGEN, NFT_MSG_NEWRULE, NFT_MSG_NEWSETELEM,
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
                        } else if announced(&mut seen, m.kind & 0xff, m.pid, m.body) {
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

/// Notes one notification of an object (`kind`, from the socket with `port`) in `seen`:
/// the keys of elements someone else added to or deleted from our sets, so that a check
/// can look those up; that they added or deleted chains or rules of our table, which a
/// check reads back without any set's elements; or any other change to our table. True
/// when it is someone else's change to our table.
fn announced(seen: &mut Generations, kind: u16, port: u32, body: &[u8]) -> bool {
    // Our own commits announce every element they change: reading their keys only to drop
    // them was a third of this thread's time under endpoint churn (perf, `agent_e2e`).
    if seen.is_own(port) {
        return false;
    }
    if !names_our_table(body) {
        return seen.announced(port, false);
    }
    if matches!(
        kind,
        NFT_MSG_NEWCHAIN | NFT_MSG_DELCHAIN | NFT_MSG_NEWRULE | NFT_MSG_DELRULE
    ) {
        return seen.announced_rules(port);
    }
    let elements = matches!(kind, NFT_MSG_NEWSETELEM | NFT_MSG_DELSETELEM)
        .then(|| super::netlink::notified_elements(body))
        .flatten();
    match elements {
        Some((family, set, keys)) => {
            let keys = keys.into_iter().map(|k| (family, set.clone(), k)).collect();
            seen.announced_elements(port, keys)
        }
        None => seen.announced(port, true),
    }
}

/// Whether a notification's body (nfgenmsg, then attributes) names our table.
fn names_our_table(body: &[u8]) -> bool {
    attrs(body.get(4..).unwrap_or(&[])).any(|a| {
        a.kind == NFTA_ANY_TABLE && a.data.strip_suffix(&[0]).unwrap_or(a.data) == TABLE.as_bytes()
    })
}

#[cfg(test)]
mod tests {
    use super::{announced, names_our_table, Generations};
    use crate::netlink::{NFT_MSG_DELRULE, NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE, NFT_MSG_NEWSET};

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

    #[test]
    fn their_chains_and_rules_in_our_table_are_noted_apart_from_other_changes() {
        let (ours, theirs) = (7, 9);
        let mut seen = Generations::default();
        seen.own_port(Some(ours));
        seen.committed(1);
        assert!(announced(
            &mut seen,
            NFT_MSG_NEWCHAIN,
            theirs,
            &body("switchyard")
        ));
        assert!(announced(
            &mut seen,
            NFT_MSG_DELRULE,
            theirs,
            &body("switchyard")
        ));
        seen.committed(2);
        let rules_and_keys =
            |seen: &Generations, held| seen.touched_since(held).map(|t| (t.rules, t.keys.len()));
        assert_eq!(rules_and_keys(&seen, 1), Some((true, 0)));
        // Ours, and theirs elsewhere, are no change to look at.
        assert!(!announced(
            &mut seen,
            NFT_MSG_NEWRULE,
            ours,
            &body("switchyard")
        ));
        assert!(!announced(
            &mut seen,
            NFT_MSG_NEWRULE,
            theirs,
            &body("kube-proxy")
        ));
        seen.committed(3);
        assert_eq!(rules_and_keys(&seen, 2), Some((false, 0)));
        // A set of theirs in our table is a change of any kind: a read settles it.
        assert!(announced(
            &mut seen,
            NFT_MSG_NEWSET,
            theirs,
            &body("switchyard")
        ));
        seen.committed(4);
        assert_eq!(rules_and_keys(&seen, 3), None);
    }
}
