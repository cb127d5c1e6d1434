//! The one netlink socket: sequence numbers, the one message header writer, sending,
//! reading a datagram and splitting it into messages, requests answered by replies, dumps
//! or acknowledgements, and the one error type, which names the operation that failed.

use super::attr::align;
use super::consts::{
    NLMSG_DONE, NLMSG_ERROR, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST,
};
use netlink_packet_core::{Emitable, ErrorBuffer, NetlinkBuffer, NetlinkHeader};
use netlink_sys::SocketAddr;

/// What can go wrong talking to the kernel over netlink. `op` says which socket (nfnetlink,
/// IPVS) and what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("{op}: {error}")]
    Socket { op: String, error: std::io::Error },
    #[error("{op}: kernel answered error {errno} ({})", std::io::Error::from_raw_os_error(*errno))]
    Kernel { op: String, errno: i32 },
    #[error("{op}: malformed reply: {detail}")]
    Malformed { op: String, detail: String },
    #[error("{op}: the ruleset kept changing during the dump")]
    Interrupted { op: String },
}

/// A large buffer matters: the kernel sizes each dump batch by the largest read seen (up to
/// 32 KiB), and every batch of a hash set's dump walks the set from the start, so small
/// reads make a 100k-element dump quadratic and take seconds.
const RECV_BUFFER: usize = 1 << 16;

/// Appends the header of a message whose payload the caller writes next: the netlink
/// header, its length left for [`finish_message`], and the 4-byte header of the family
/// (nfgenmsg or genlmsghdr). Returns where the message starts.
pub fn start_message(buf: &mut Vec<u8>, kind: u16, flags: u16, seq: u32, head: [u8; 4]) -> usize {
    let mut header = NetlinkHeader::default();
    header.message_type = kind;
    header.flags = flags;
    header.sequence_number = seq;
    let at = buf.len();
    buf.resize(at + header.buffer_len(), 0);
    header.emit(&mut buf[at..]);
    buf.extend_from_slice(&head);
    at
}

/// Fills in the length of the message started at `at`, which ends the buffer.
pub fn finish_message(buf: &mut [u8], at: usize) {
    let len = (buf.len() - at) as u32;
    NetlinkBuffer::new(&mut buf[at..]).set_length(len);
}

/// Appends one whole message.
pub fn message(buf: &mut Vec<u8>, kind: u16, flags: u16, seq: u32, head: [u8; 4], attrs: &[u8]) {
    let at = start_message(buf, kind, flags, seq, head);
    buf.extend_from_slice(attrs);
    finish_message(buf, at);
}

/// The nfgenmsg of a message about `family` (`res_id`: the subsystem, in batch markers).
pub fn nfgenmsg(family: u8, res_id: u16) -> [u8; 4] {
    let [hi, lo] = res_id.to_be_bytes();
    [family, 0, hi, lo]
}

/// One request: message type, flags (NLM_F_REQUEST is implied), the family header and the
/// attributes.
pub struct Request<'a> {
    pub kind: u16,
    pub flags: u16,
    pub head: [u8; 4],
    pub attrs: &'a [u8],
}

impl<'a> Request<'a> {
    /// Message `msg` of nfnetlink subsystem `subsys` about protocol family `family`.
    pub fn nfnl(subsys: u16, msg: u16, flags: u16, family: u8, attrs: &'a [u8]) -> Self {
        Request {
            kind: (subsys << 8) | msg,
            flags,
            head: nfgenmsg(family, 0),
            attrs,
        }
    }

    /// Command `cmd` (at `version`) of the generic netlink family numbered `family`.
    pub fn genl(family: u16, cmd: u8, version: u8, flags: u16, attrs: &'a [u8]) -> Self {
        Request {
            kind: family,
            flags,
            head: [cmd, version, 0, 0],
            attrs,
        }
    }

    pub fn write(&self, buf: &mut Vec<u8>, seq: u32) {
        message(
            buf,
            self.kind,
            NLM_F_REQUEST | self.flags,
            seq,
            self.head,
            self.attrs,
        );
    }
}

/// One message from the kernel.
pub struct Message<'a> {
    pub kind: u16,
    pub flags: u16,
    pub seq: u32,
    /// The port of the socket the message came from or answers (for a notification, the
    /// socket whose request caused it).
    pub pid: u32,
    /// What follows the netlink header.
    pub body: &'a [u8],
    /// For NLMSG_ERROR, the errno (0 acknowledges); `None` for any other message.
    pub errno: Option<i32>,
}

/// The messages of one datagram.
fn split(mut rest: &[u8]) -> Result<Vec<Message<'_>>, &'static str> {
    let mut out = Vec::new();
    while rest.len() >= 16 {
        let nl = NetlinkBuffer::new_checked(rest).map_err(|_| "bad message length")?;
        let kind = nl.message_type();
        let body = nl.payload();
        let errno = match kind {
            NLMSG_ERROR => {
                let e = ErrorBuffer::new_checked(body).map_err(|_| "short error")?;
                // Saturating: a code of i32::MIN (no real errno) must not overflow the negation.
                Some(e.code().map_or(0, |c| c.get().saturating_neg()))
            }
            _ => None,
        };
        out.push(Message {
            kind,
            flags: nl.flags(),
            seq: nl.sequence_number(),
            pid: nl.port_number(),
            body,
            errno,
        });
        rest = rest.get(align(nl.length() as usize)..).unwrap_or(&[]);
    }
    Ok(out)
}

/// A netlink socket in the calling thread's network namespace.
pub struct Socket {
    /// Shared only with [`Membership`] handles.
    socket: std::sync::Arc<netlink_sys::Socket>,
    /// What the socket talks to, for errors ("nfnetlink", "IPVS").
    label: &'static str,
    seq: u32,
    buf: Vec<u8>,
}

/// A subscribed socket's membership of its multicast group, which another thread can
/// leave and join again while the socket's owner waits on it.
#[derive(Clone)]
pub struct Membership {
    socket: std::sync::Arc<netlink_sys::Socket>,
    group: u32,
}

impl Membership {
    pub fn leave(&self) -> std::io::Result<()> {
        self.socket.drop_membership(self.group)
    }

    pub fn join(&self) -> std::io::Result<()> {
        self.socket.add_membership(self.group)
    }
}

/// Consecutive EINTRs a system call is retried through before the error is given up to the
/// caller: a signal interrupts a call once, not forever; a bound keeps an endless stream
/// (an injected fault without a count) from spinning a core.
const INTERRUPTED_RETRIES: usize = 64;

/// `call`, again while a signal interrupts it (EINTR), as std's own I/O does.
fn retry_interrupted<T>(mut call: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    let mut tries = 0;
    loop {
        match call() {
            Err(e)
                if e.kind() == std::io::ErrorKind::Interrupted && tries < INTERRUPTED_RETRIES =>
            {
                tries += 1;
            }
            result => return result,
        }
    }
}

impl Socket {
    fn new(protocol: isize, label: &'static str) -> Result<Socket, NetlinkError> {
        let open = |error| NetlinkError::Socket {
            op: format!("{label} socket"),
            error,
        };
        let mut socket = netlink_sys::Socket::new(protocol).map_err(open)?;
        socket.bind_auto().map_err(open)?;
        Ok(Socket {
            socket: std::sync::Arc::new(socket),
            label,
            seq: 0,
            buf: Vec::with_capacity(RECV_BUFFER),
        })
    }

    /// A socket of `protocol` that talks to the kernel; `label` names it in errors.
    pub fn open(protocol: isize, label: &'static str) -> Result<Socket, NetlinkError> {
        let s = Socket::new(protocol, label)?;
        s.socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(|e| s.io_error("socket", e))?;
        Ok(s)
    }

    /// A socket of `protocol` that receives what the kernel announces to `group`.
    pub fn subscribe(
        protocol: isize,
        label: &'static str,
        group: u32,
    ) -> Result<Socket, NetlinkError> {
        let s = Socket::new(protocol, label)?;
        s.socket
            .add_membership(group)
            .map_err(|e| s.io_error("socket", e))?;
        Ok(s)
    }

    /// A handle on this socket's membership of `group`, for another thread.
    pub fn membership(&self, group: u32) -> Membership {
        Membership {
            socket: self.socket.clone(),
            group,
        }
    }

    /// The port the kernel gave this socket.
    pub fn port(&self) -> Result<u32, NetlinkError> {
        let mut addr = SocketAddr::new(0, 0);
        self.socket
            .get_address(&mut addr)
            .map_err(|e| self.io_error("getsockname", e))?;
        Ok(addr.port_number())
    }

    /// The underlying socket, for socket options.
    pub(super) fn raw(&self) -> &netlink_sys::Socket {
        &self.socket
    }

    /// The next sequence number.
    pub fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Numbers from here on follow `seq`, which the caller used.
    pub(super) fn used_up_to(&mut self, seq: u32) {
        self.seq = seq;
    }

    fn op(&self, what: &str) -> String {
        format!("{} {what}", self.label)
    }

    pub fn io_error(&self, what: &str, error: std::io::Error) -> NetlinkError {
        NetlinkError::Socket {
            op: self.op(what),
            error,
        }
    }

    pub fn kernel_error(&self, what: &str, errno: i32) -> NetlinkError {
        NetlinkError::Kernel {
            op: self.op(what),
            errno,
        }
    }

    pub fn malformed(&self, what: &str, detail: &str) -> NetlinkError {
        NetlinkError::Malformed {
            op: self.op(what),
            detail: detail.to_string(),
        }
    }

    /// Sends one datagram, whole.
    pub fn send(&mut self, what: &str, bytes: &[u8]) -> Result<(), NetlinkError> {
        let label = self.label;
        let sent = retry_interrupted(|| {
            if let Some(errno) = crate::fault::injected_at(|| format!("{label}:send")) {
                return Err(std::io::Error::from_raw_os_error(errno));
            }
            self.socket.send(bytes, 0)
        })
        .map_err(|e| self.io_error(what, e))?;
        if sent != bytes.len() {
            let e = std::io::Error::other(format!("sent {sent} of {} bytes", bytes.len()));
            return Err(self.io_error(what, e));
        }
        Ok(())
    }

    /// Reads one datagram from the kernel, split into its messages.
    pub fn receive(&mut self, what: &str) -> Result<Vec<Message<'_>>, NetlinkError> {
        let (label, socket, buf) = (self.label, &self.socket, &mut self.buf);
        let received = retry_interrupted(|| {
            buf.clear();
            if let Some(errno) = crate::fault::injected_at(|| format!("{label}:receive")) {
                return Err(std::io::Error::from_raw_os_error(errno));
            }
            socket.recv(buf, 0)
        });
        if let Err(e) = received {
            return Err(self.io_error(what, e));
        }
        let op = || self.op(what);
        split(&self.buf).map_err(|detail| NetlinkError::Malformed {
            op: op(),
            detail: detail.to_string(),
        })
    }

    /// Sends one request and hands the payload (after the family header) of each reply to
    /// `each` as it arrives, until the dump ends, the acknowledgement comes, or (neither
    /// asked for) the first datagram of replies is read.
    pub fn request_each(
        &mut self,
        what: &str,
        request: &Request<'_>,
        each: &mut dyn FnMut(&[u8]),
    ) -> Result<(), NetlinkError> {
        self.request_each_paced(what, request, each, &mut || {})
    }

    /// [`Self::request_each`], calling `pace` before the send and before each receive: the
    /// kernel fills a dump's first reply as the request arrives and the next ones only when
    /// asked for them.
    pub fn request_each_paced(
        &mut self,
        what: &str,
        request: &Request<'_>,
        each: &mut dyn FnMut(&[u8]),
        pace: &mut dyn FnMut(),
    ) -> Result<(), NetlinkError> {
        let seq = self.next_seq();
        let mut buf = Vec::with_capacity(32 + request.attrs.len());
        request.write(&mut buf, seq);
        pace();
        self.send(what, &buf)?;
        let dump = request.flags & NLM_F_DUMP == NLM_F_DUMP;
        let ack = request.flags & NLM_F_ACK != 0;
        let mut replies = 0usize;
        loop {
            let mut end = None;
            pace();
            for m in self.receive(what)? {
                if m.seq != seq {
                    continue;
                }
                end = Some(if m.flags & NLM_F_DUMP_INTR != 0 {
                    Err(NetlinkError::Interrupted { op: self.op(what) })
                } else if m.kind == NLMSG_DONE || m.errno == Some(0) {
                    Ok(())
                } else if let Some(errno) = m.errno {
                    Err(self.kernel_error(what, errno))
                } else {
                    replies += 1;
                    each(m.body.get(4..).unwrap_or(&[]));
                    continue;
                });
                break;
            }
            match end {
                Some(result) => return result,
                None if !dump && !ack && replies > 0 => return Ok(()),
                None => {}
            }
        }
    }

    /// [`Self::request_each`], collecting the payloads.
    pub fn request(
        &mut self,
        what: &str,
        request: &Request<'_>,
    ) -> Result<Vec<Vec<u8>>, NetlinkError> {
        let mut out = Vec::new();
        self.request_each(what, request, &mut |body| out.push(body.to_vec()))?;
        Ok(out)
    }

    /// Sends `bytes`, `count` requests numbered from `first` that each ask for an
    /// acknowledgement, and reads the kernel's answer to each: 0, or the errno it refused
    /// that one with. The kernel handles each on its own, so one refused does not stop the
    /// others.
    pub fn acks(
        &mut self,
        what: &str,
        bytes: &[u8],
        first: u32,
        count: usize,
    ) -> Result<Vec<i32>, NetlinkError> {
        self.send(what, bytes)?;
        let mut out: Vec<Option<i32>> = vec![None; count];
        let mut left = count;
        while left > 0 {
            for m in self.receive(what)? {
                let i = m.seq.wrapping_sub(first) as usize;
                let Some(errno) = m.errno else {
                    continue;
                };
                if let Some(slot @ None) = out.get_mut(i) {
                    *slot = Some(errno);
                    left -= 1;
                }
            }
        }
        Ok(out.into_iter().map(|e| e.unwrap_or(0)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_split_with_their_errors() {
        let mut buf = Vec::new();
        message(
            &mut buf,
            0x0a01,
            NLM_F_REQUEST,
            7,
            nfgenmsg(2, 10),
            &[1, 2, 3],
        );
        assert_eq!(&buf[..4], &23u32.to_ne_bytes());
        assert_eq!(&buf[16..20], &[2, 0, 0, 10]);
        buf.resize(24, 0);
        message(&mut buf, NLMSG_ERROR, 0, 8, (-17i32).to_ne_bytes(), &[]);
        let got = split(&buf).unwrap_or_default();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].kind, got[0].seq, got[0].errno), (0x0a01, 7, None));
        assert_eq!(got[0].body, &[2, 0, 0, 10, 1, 2, 3]);
        assert_eq!((got[1].seq, got[1].errno), (8, Some(17)));
        assert!(split(&buf[..40]).is_err());
    }

    /// A datagram is untrusted bytes: whatever arrives, splitting it ends, and never
    /// panics. Seeds are real messages with bytes overwritten, cut or appended.
    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        fn seed() -> Vec<u8> {
            let mut buf = Vec::new();
            message(
                &mut buf,
                0x0a01,
                NLM_F_REQUEST,
                7,
                nfgenmsg(2, 10),
                &[1, 2, 3, 4],
            );
            message(
                &mut buf,
                NLMSG_ERROR,
                0,
                8,
                (-17i32).to_ne_bytes(),
                &[0; 16],
            );
            buf
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]
            #[test]
            fn any_datagram_splits_or_fails_without_panicking(
                noise in proptest::collection::vec(any::<u8>(), 0..256),
                edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8),
                cut in any::<usize>(),
            ) {
                let _ = split(&noise);
                let mut m = seed();
                for (at, b) in edits {
                    let n = m.len();
                    m[at % n] = b;
                }
                m.truncate(cut % (m.len() + 1));
                m.extend_from_slice(&noise[..noise.len().min(32)]);
                let _ = split(&m);
            }
        }

        #[test]
        fn the_most_negative_error_code_is_no_overflow() {
            let mut buf = Vec::new();
            message(
                &mut buf,
                NLMSG_ERROR,
                0,
                9,
                i32::MIN.to_ne_bytes(),
                &[0; 16],
            );
            let got = split(&buf).unwrap_or_default();
            assert_eq!(got.len(), 1);
            assert!(got[0].errno.is_some_and(|e| e != 0));
        }
    }
}
