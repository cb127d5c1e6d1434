//! The one nf_tables batch writer and its one commit protocol, for nftables mode's
//! transactions (`nft::wire`) and iptables-nft chains (`iptables::direct`) alike. The messages between
//! BATCH_BEGIN and BATCH_END go in one datagram and commit together or not at all. The
//! kernel answers every message it refuses, by sequence number, whether or not it was asked
//! to acknowledge it, and has done so by the time the send returns; a generation request
//! sent after the batch fences those answers. No refusal before the fence's answer means
//! the batch committed; the first refusal is reported with the message it belongs to.
//!
//! The messages do not ask for acknowledgements: the kernel queues all of a batch's answers
//! before the send returns and accounts each at about 830 bytes of receive buffer, so a cold
//! 10k x 10 iptables-nft load (420k messages) would hold 350 MB of kernel memory in
//! acknowledgements and take seconds longer, to learn nothing the fence does not say.

use super::attr::Attrs;
use super::consts::{
    NETLINK_NETFILTER, NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, NFNL_SUBSYS_NFTABLES,
    NFPROTO_IPV4, NFPROTO_UNSPEC, NFTA_TABLE_NAME, NFT_MSG_DELTABLE, NFT_MSG_GETGEN, NLM_F_REQUEST,
};
use super::socket::{
    finish_message, message, nfgenmsg, start_message, Message, NetlinkError, Request, Socket,
};
use nix::errno::Errno::ENOBUFS;

/// Sequence number of BATCH_BEGIN; the batch's messages follow it.
const BEGIN: u32 = 1;
/// Send buffer beyond the batch itself.
const SLACK: usize = 1 << 16;

/// An nf_tables transaction being written.
pub struct Batch {
    buf: Vec<u8>,
    count: usize,
}

impl Default for Batch {
    fn default() -> Batch {
        Batch::new()
    }
}

fn seq_of(message: usize) -> u32 {
    BEGIN.wrapping_add(1).wrapping_add(message as u32)
}

fn marker(buf: &mut Vec<u8>, kind: u16, seq: u32) {
    let head = nfgenmsg(NFPROTO_UNSPEC, NFNL_SUBSYS_NFTABLES);
    message(buf, kind, NLM_F_REQUEST, seq, head, &[]);
}

impl Batch {
    pub fn new() -> Batch {
        let mut buf = Vec::new();
        marker(&mut buf, NFNL_MSG_BATCH_BEGIN, BEGIN);
        Batch { buf, count: 0 }
    }

    /// Appends nf_tables message `msg` about `family`; `attrs` writes its attributes.
    pub fn push(&mut self, msg: u16, flags: u16, family: u8, attrs: impl FnOnce(&mut Attrs<'_>)) {
        let at = start_message(
            &mut self.buf,
            (NFNL_SUBSYS_NFTABLES << 8) | msg,
            NLM_F_REQUEST | flags,
            seq_of(self.count),
            nfgenmsg(family, 0),
        );
        attrs(&mut Attrs(&mut self.buf));
        finish_message(&mut self.buf, at);
        self.count += 1;
    }

    /// Messages written, the markers not counted.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Commits the batch, all or nothing, on a socket of its own. `what` names the batch
    /// and `about(i)` its `i`th message in errors.
    pub fn commit(self, what: &str, about: &dyn Fn(usize) -> String) -> Result<(), NetlinkError> {
        let mut socket = Socket::open(NETLINK_NETFILTER, "nfnetlink")?;
        self.commit_on(&mut socket, what, about)
    }

    /// [`Batch::commit`] on `socket`, which stays open for the next batch: closing an
    /// nfnetlink socket right after a commit waits for that commit's clean-up (sampled
    /// kernel stacks: `netlink_release`, nf_tables' `nft_rcv_nl_event`, `__flush_work` of
    /// `nf_tables_trans_destroy_work`, itself in `synchronize_rcu_normal`): 10 to 30 ms
    /// here, measured with `strace -T` on the close, against 0.1 to 0.3 ms for the commit
    /// itself. After an error the socket's state is unknown: open a new one.
    pub fn commit_on(
        mut self,
        socket: &mut Socket,
        what: &str,
        about: &dyn Fn(usize) -> String,
    ) -> Result<(), NetlinkError> {
        if let Some(errno) = crate::fault::injected("nf_tables-batch") {
            return Err(NetlinkError::Kernel {
                op: format!("{what} (injected by SWITCHYARD_FAULTS)"),
                errno,
            });
        }
        let ours = seq_of(0)..seq_of(self.count);
        let mut added = None;
        if crate::fault::injected_at(|| "nf_tables-batch-last".into()).is_some() {
            added = Some(seq_of(self.count));
            // A real refusal after all of ours: the kernel has done their work when it
            // meets this one, and must undo it.
            self.push(NFT_MSG_DELTABLE, 0, NFPROTO_IPV4, |a| {
                a.str(NFTA_TABLE_NAME, "switchyard-fault-no-such-table")
            });
        }
        let end = seq_of(self.count);
        marker(&mut self.buf, NFNL_MSG_BATCH_END, end);
        socket.used_up_to(end);
        size_buffers(socket, what, self.buf.len())?;
        socket.send(what, &self.buf)?;
        // The kernel has handled the batch inside the send; its bytes are not needed.
        self.buf = Vec::new();
        let fence = socket.next_seq();
        let mut generation = Vec::new();
        Request::nfnl(NFNL_SUBSYS_NFTABLES, NFT_MSG_GETGEN, 0, NFPROTO_UNSPEC, &[])
            .write(&mut generation, fence);
        socket.send(what, &generation)?;
        // The first refusal: its sequence number and errno.
        let mut refused = None;
        let mut note = |m: &Message<'_>| {
            if let Some(errno) = m.errno.filter(|e| *e != 0) {
                refused.get_or_insert((m.seq, errno));
            }
        };
        'read: loop {
            match socket.receive(what) {
                Ok(messages) => {
                    for m in messages {
                        if m.seq == fence {
                            break 'read;
                        }
                        note(&m);
                    }
                }
                Err(NetlinkError::Socket { error, .. }) if is_enobufs(&error) => {
                    // Answers were dropped, the fence's perhaps too; the kernel reports the
                    // overflow before what it did queue, which the sends left complete.
                    drain(socket, what, &mut note)?;
                    if refused.is_none() {
                        let what = format!(
                            "{what}: its answers were lost, so whether it committed is unknown"
                        );
                        return Err(socket.io_error(&what, error));
                    }
                    break 'read;
                }
                Err(e) => return Err(e),
            }
        }
        let Some((seq, errno)) = refused else {
            return Ok(());
        };
        let op = if ours.contains(&seq) {
            format!("{what}, at {}", about(seq.wrapping_sub(seq_of(0)) as usize))
        } else if added == Some(seq) {
            format!("{what}, at the message SWITCHYARD_FAULTS added")
        } else {
            what.to_string()
        };
        Err(socket.kernel_error(&op, errno))
    }
}

fn is_enobufs(error: &std::io::Error) -> bool {
    error.raw_os_error() == Some(ENOBUFS as i32)
}

/// Reads what is queued without waiting for more.
fn drain(
    socket: &mut Socket,
    what: &str,
    each: &mut dyn FnMut(&Message<'_>),
) -> Result<(), NetlinkError> {
    if let Err(e) = socket.raw().set_non_blocking(true) {
        return Err(socket.io_error(what, e));
    }
    // The kernel reports an overflow once; an endless stream of them (an injected fault
    // without a count) must not spin.
    let mut overflows = 0;
    loop {
        match socket.receive(what) {
            Ok(messages) => messages.iter().for_each(&mut *each),
            Err(NetlinkError::Socket { error, .. }) if is_enobufs(&error) && overflows < 64 => {
                overflows += 1;
            }
            Err(NetlinkError::Socket { error, .. })
                if error.kind() == std::io::ErrorKind::WouldBlock =>
            {
                return socket
                    .raw()
                    .set_non_blocking(false)
                    .map_err(|e| socket.io_error(what, e));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The whole batch is one datagram, so the send buffer must hold it (a cold 10k x 10
/// iptables-nft load is about 110 MiB); forcing it past wmem_max takes CAP_NET_ADMIN, as
/// writing nf_tables does.
fn size_buffers(socket: &Socket, what: &str, bytes: usize) -> Result<(), NetlinkError> {
    use nix::sys::socket::{setsockopt, sockopt};
    let raw = socket.raw();
    let send = bytes.saturating_add(SLACK).min(i32::MAX as usize / 2);
    setsockopt(raw, sockopt::SndBufForce, &send).map_err(|e| socket.io_error(what, e.into()))?;
    // A refusal would otherwise carry the refused message back: short answers keep the
    // first refusals of a batch that fails whole within the receive buffer.
    raw.set_cap_ack(true).map_err(|e| socket.io_error(what, e))
}
