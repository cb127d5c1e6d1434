//! The one nf_tables batch writer and its one commit protocol. The messages between
//! BATCH_BEGIN and BATCH_END commit together or not at all; each asks for an
//! acknowledgement, and a generation request sent after the batch fences the answers, so
//! the commit knows it has read every one and reports the first refusal with the message it
//! belongs to. Element batches (`nft::batch`) and iptables-nft chains (`iptables::direct`)
//! both commit this way.

use super::attr::Attrs;
use super::consts::{
    NETLINK_NETFILTER, NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, NFNL_SUBSYS_NFTABLES,
    NFPROTO_UNSPEC, NFT_MSG_GETGEN, NLM_F_ACK, NLM_F_REQUEST,
};
use super::socket::{
    finish_message, message, nfgenmsg, start_message, NetlinkError, Request, Socket,
};

/// Sequence number of BATCH_BEGIN; the batch's messages follow it.
const BEGIN: u32 = 1;
/// Receive buffer per acknowledgement: the kernel queues them all before the send returns
/// and accounts each small skb at about 768 bytes.
const ACK_ROOM: usize = 1024;
/// Room for the rest: the fence's answer, or an error about the batch as a whole.
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
            NLM_F_REQUEST | NLM_F_ACK | flags,
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

    /// Commits the batch, all or nothing. `what` names the batch and `about(i)` its `i`th
    /// message in errors.
    pub fn commit(
        mut self,
        what: &str,
        about: &dyn Fn(usize) -> String,
    ) -> Result<(), NetlinkError> {
        let end = seq_of(self.count);
        marker(&mut self.buf, NFNL_MSG_BATCH_END, end);
        let mut socket = Socket::open(NETLINK_NETFILTER, "nfnetlink")?;
        socket.used_up_to(end);
        size_buffers(&socket, what, self.buf.len(), self.count)?;
        socket.send(what, &self.buf)?;
        // The kernel has handled the batch inside the send; its bytes are not needed.
        self.buf = Vec::new();
        let fence = socket.next_seq();
        let mut generation = Vec::new();
        Request::nfnl(NFNL_SUBSYS_NFTABLES, NFT_MSG_GETGEN, 0, NFPROTO_UNSPEC, &[])
            .write(&mut generation, fence);
        socket.send(what, &generation)?;
        let ours = seq_of(0)..end;
        let (mut acked, mut refused) = (0usize, None);
        'read: loop {
            for m in socket.receive(what)? {
                if m.seq == fence {
                    break 'read;
                }
                match m.errno {
                    Some(0) if ours.contains(&m.seq) => acked += 1,
                    Some(0) | None => {}
                    Some(errno) => {
                        refused.get_or_insert((m.seq, errno));
                    }
                }
            }
        }
        if let Some((seq, errno)) = refused {
            let op = if ours.contains(&seq) {
                format!("{what}, at {}", about(seq.wrapping_sub(seq_of(0)) as usize))
            } else {
                what.to_string()
            };
            return Err(socket.kernel_error(&op, errno));
        }
        if acked < self.count {
            let detail = format!("{acked} of {} messages acknowledged", self.count);
            return Err(socket.malformed(what, &detail));
        }
        Ok(())
    }
}

/// The whole batch is one datagram, so the send buffer must hold it (a cold 10k x 10
/// iptables-nft load is about 110 MiB), and the receive buffer must hold every answer.
/// Forcing either past the sysctl maxima takes CAP_NET_ADMIN, as writing nf_tables does.
fn size_buffers(
    socket: &Socket,
    what: &str,
    bytes: usize,
    messages: usize,
) -> Result<(), NetlinkError> {
    use nix::sys::socket::{setsockopt, sockopt};
    let cap = |n: usize| n.min(i32::MAX as usize / 2);
    let raw = socket.raw();
    let send = cap(bytes.saturating_add(SLACK));
    let receive = cap(messages.saturating_mul(ACK_ROOM).saturating_add(SLACK));
    setsockopt(raw, sockopt::SndBufForce, &send)
        .and_then(|()| setsockopt(raw, sockopt::RcvBufForce, &receive))
        .map_err(|e| socket.io_error(what, e.into()))?;
    // A refusal would otherwise carry the refused message back, too big for ACK_ROOM.
    raw.set_cap_ack(true).map_err(|e| socket.io_error(what, e))
}
