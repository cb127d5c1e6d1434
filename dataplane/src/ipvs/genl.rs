//! IPVS over generic netlink: the messages that list, add, change and delete virtual
//! services and their real servers, encoded and decoded here (pure), and [`IpvsSocket`], the
//! socket that carries them.
//!
//! Why our own messages: nlrs 0.2.1 has persistence timeouts and the connection counters
//! graceful termination needs, but sends the service flags as a u32 where the kernel reads
//! `struct ip_vs_flags {flags, mask}` (so the persistent flag is ignored) and does not decode
//! the flags it reads back; the other crates that speak IPVS netlink are unmaintained; and
//! netlink-packet-generic would bring a message framework for the dozen attributes used
//! here. The socket, framing and attribute helpers are [`crate::netlink`]'s; resolving the
//! family and IPVS's attributes are this module's.

use crate::model::{IpFamily, Protocol};
use crate::netlink::{
    be16, cstr, find, ne16, ne32, push_attr, text, Attrs, NetlinkError, Request, Socket,
    NETLINK_GENERIC, NLM_F_ACK, NLM_F_DUMP,
};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const IPVS_GENL_NAME: &str = "IPVS";
const IPVS_GENL_VERSION: u8 = 1;

const CMD_NEW_SERVICE: u8 = 1;
const CMD_SET_SERVICE: u8 = 2;
const CMD_DEL_SERVICE: u8 = 3;
const CMD_GET_SERVICE: u8 = 4;
const CMD_NEW_DEST: u8 = 5;
const CMD_SET_DEST: u8 = 6;
const CMD_DEL_DEST: u8 = 7;
const CMD_GET_DEST: u8 = 8;
const CMD_SET_CONFIG: u8 = 12;
const CMD_GET_CONFIG: u8 = 13;
const CMD_FLUSH: u8 = 17;

const CMD_ATTR_SERVICE: u16 = 1;
const CMD_ATTR_DEST: u16 = 2;
const CMD_ATTR_TIMEOUT_TCP: u16 = 4;
const CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
const CMD_ATTR_TIMEOUT_UDP: u16 = 6;

const SVC_ATTR_AF: u16 = 1;
const SVC_ATTR_PROTOCOL: u16 = 2;
const SVC_ATTR_ADDR: u16 = 3;
const SVC_ATTR_PORT: u16 = 4;
const SVC_ATTR_FWMARK: u16 = 5;
const SVC_ATTR_SCHED_NAME: u16 = 6;
const SVC_ATTR_FLAGS: u16 = 7;
const SVC_ATTR_TIMEOUT: u16 = 8;
const SVC_ATTR_NETMASK: u16 = 9;

const DEST_ATTR_ADDR: u16 = 1;
const DEST_ATTR_PORT: u16 = 2;
const DEST_ATTR_FWD_METHOD: u16 = 3;
const DEST_ATTR_WEIGHT: u16 = 4;
const DEST_ATTR_U_THRESH: u16 = 5;
const DEST_ATTR_L_THRESH: u16 = 6;
const DEST_ATTR_ACTIVE_CONNS: u16 = 7;
const DEST_ATTR_INACT_CONNS: u16 = 8;
const DEST_ATTR_ADDR_FAMILY: u16 = 11;

/// `IP_VS_SVC_F_PERSISTENT`: the scheduler's choice sticks to the client for `timeout`.
pub const SVC_F_PERSISTENT: u32 = 0x1;
/// Flags the kernel sets on its own and reports back; never part of what we ask for.
const SVC_F_HASHED: u32 = 0x2;
/// Masquerading (NAT), the only forwarding method kube-proxy uses.
const FWD_MASQ: u32 = 0;

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
const IPPROTO_TCP: u16 = 6;
const IPPROTO_UDP: u16 = 17;
const IPPROTO_SCTP: u16 = 132;

/// What can go wrong talking to IPVS: no IPVS at all, or what can go wrong on netlink.
#[derive(Debug, thiserror::Error)]
pub enum GenlError {
    #[error("IPVS is not available in this kernel (no \"IPVS\" generic netlink family; load the ip_vs module)")]
    NoIpvs,
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
}

/// What identifies a virtual service: address, protocol and port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceId {
    pub addr: IpAddr,
    pub protocol: Protocol,
    pub port: u16,
}

impl std::fmt::Display for ServiceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.addr {
            IpAddr::V4(a) => write!(f, "{}:{a}:{}", self.protocol, self.port),
            IpAddr::V6(a) => write!(f, "{}:[{a}]:{}", self.protocol, self.port),
        }
    }
}

/// A virtual service's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceSpec {
    pub scheduler: String,
    /// [`SVC_F_PERSISTENT`] and the scheduler flags.
    pub flags: u32,
    /// Persistence timeout in seconds (0 without persistence).
    pub timeout: u32,
}

/// A real server of a virtual service, as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    pub addr: IpAddr,
    pub port: u16,
    pub weight: u32,
    pub active_conns: u32,
    pub inactive_conns: u32,
}

/// One change to the kernel's IPVS table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    AddService(ServiceId, ServiceSpec),
    UpdateService(ServiceId, ServiceSpec),
    DeleteService(ServiceId),
    AddDest(ServiceId, IpAddr, u16, u32),
    /// Change a real server's weight (0 drains it).
    UpdateDest(ServiceId, IpAddr, u16, u32),
    DeleteDest(ServiceId, IpAddr, u16),
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sock = |ip: &IpAddr, port: &u16| std::net::SocketAddr::new(*ip, *port);
        match self {
            Op::AddService(id, s) => write!(f, "add service {id} ({})", s.scheduler),
            Op::UpdateService(id, s) => write!(f, "update service {id} ({})", s.scheduler),
            Op::DeleteService(id) => write!(f, "delete service {id}"),
            Op::AddDest(id, ip, p, w) => write!(f, "add {} weight {w} to {id}", sock(ip, p)),
            Op::UpdateDest(id, ip, p, w) => write!(f, "set {} weight {w} in {id}", sock(ip, p)),
            Op::DeleteDest(id, ip, p) => write!(f, "delete {} from {id}", sock(ip, p)),
        }
    }
}

fn af(family: IpFamily) -> u16 {
    match family {
        IpFamily::V4 => AF_INET,
        IpFamily::V6 => AF_INET6,
    }
}

fn proto_number(p: Protocol) -> u16 {
    match p {
        Protocol::Tcp => IPPROTO_TCP,
        Protocol::Udp => IPPROTO_UDP,
        Protocol::Sctp => IPPROTO_SCTP,
    }
}

fn proto_of(n: u16) -> Option<Protocol> {
    match n {
        IPPROTO_TCP => Some(Protocol::Tcp),
        IPPROTO_UDP => Some(Protocol::Udp),
        IPPROTO_SCTP => Some(Protocol::Sctp),
        _ => None,
    }
}

/// `union nf_inet_addr`: 16 bytes, an IPv4 address in the first four.
fn inet_addr(ip: &IpAddr) -> [u8; 16] {
    let mut out = [0u8; 16];
    match ip {
        IpAddr::V4(a) => out[..4].copy_from_slice(&a.octets()),
        IpAddr::V6(a) => out.copy_from_slice(&a.octets()),
    }
    out
}

fn addr_of(af: u16, data: &[u8]) -> Option<IpAddr> {
    match af {
        AF_INET => {
            let b: [u8; 4] = data.get(..4)?.try_into().ok()?;
            Some(IpAddr::V4(Ipv4Addr::from(b)))
        }
        AF_INET6 => {
            let b: [u8; 16] = data.get(..16)?.try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(b)))
        }
        _ => None,
    }
}

/// A service: what names it (enough for delete and for listing its servers), and with
/// `spec` its settings.
fn service_attrs(id: &ServiceId, spec: Option<&ServiceSpec>) -> Vec<u8> {
    let mut out = Vec::new();
    Attrs(&mut out).nest(CMD_ATTR_SERVICE, |s| {
        s.put(SVC_ATTR_AF, &af(IpFamily::of(&id.addr)).to_ne_bytes());
        s.put(SVC_ATTR_PROTOCOL, &proto_number(id.protocol).to_ne_bytes());
        s.put(SVC_ATTR_ADDR, &inet_addr(&id.addr));
        s.put(SVC_ATTR_PORT, &id.port.to_be_bytes());
        let Some(spec) = spec else {
            return;
        };
        s.str(SVC_ATTR_SCHED_NAME, &spec.scheduler);
        let mut flags = spec.flags.to_ne_bytes().to_vec();
        flags.extend_from_slice(&u32::MAX.to_ne_bytes());
        s.put(SVC_ATTR_FLAGS, &flags);
        s.put(SVC_ATTR_TIMEOUT, &spec.timeout.to_ne_bytes());
        // Persistence granularity: the whole client address, as kube-proxy asks.
        let netmask: u32 = match id.addr {
            IpAddr::V4(_) => u32::MAX,
            IpAddr::V6(_) => 128,
        };
        s.put(SVC_ATTR_NETMASK, &netmask.to_ne_bytes());
    });
    out
}

/// A real server; with `weight`, its settings too.
fn dest_attrs(out: &mut Vec<u8>, ip: &IpAddr, port: u16, weight: Option<u32>) {
    Attrs(out).nest(CMD_ATTR_DEST, |d| {
        d.put(DEST_ATTR_ADDR_FAMILY, &af(IpFamily::of(ip)).to_ne_bytes());
        d.put(DEST_ATTR_ADDR, &inet_addr(ip));
        d.put(DEST_ATTR_PORT, &port.to_be_bytes());
        if let Some(w) = weight {
            d.put(DEST_ATTR_FWD_METHOD, &FWD_MASQ.to_ne_bytes());
            d.put(DEST_ATTR_WEIGHT, &w.to_ne_bytes());
            d.put(DEST_ATTR_U_THRESH, &0u32.to_ne_bytes());
            d.put(DEST_ATTR_L_THRESH, &0u32.to_ne_bytes());
        }
    });
}

/// The generic netlink command and attributes of one operation.
pub fn encode(op: &Op) -> (u8, Vec<u8>) {
    match op {
        Op::AddService(id, spec) => (CMD_NEW_SERVICE, service_attrs(id, Some(spec))),
        Op::UpdateService(id, spec) => (CMD_SET_SERVICE, service_attrs(id, Some(spec))),
        Op::DeleteService(id) => (CMD_DEL_SERVICE, service_attrs(id, None)),
        Op::AddDest(id, ip, port, w) | Op::UpdateDest(id, ip, port, w) => {
            let cmd = if matches!(op, Op::AddDest(..)) {
                CMD_NEW_DEST
            } else {
                CMD_SET_DEST
            };
            let mut a = service_attrs(id, None);
            dest_attrs(&mut a, ip, *port, Some(*w));
            (cmd, a)
        }
        Op::DeleteDest(id, ip, port) => {
            let mut a = service_attrs(id, None);
            dest_attrs(&mut a, ip, *port, None);
            (CMD_DEL_DEST, a)
        }
    }
}

/// One service of a dump. `None` for what this layer does not manage (fwmark services,
/// unknown protocols): listed by others, left alone by us.
pub fn decode_service(body: &[u8]) -> Result<Option<(ServiceId, ServiceSpec)>, String> {
    let svc = find(body, CMD_ATTR_SERVICE).ok_or("no service attribute")?;
    let family = find(svc, SVC_ATTR_AF)
        .and_then(ne16)
        .ok_or("no address family")?;
    if find(svc, SVC_ATTR_FWMARK)
        .and_then(ne32)
        .is_some_and(|m| m != 0)
    {
        return Ok(None);
    }
    let Some(protocol) = find(svc, SVC_ATTR_PROTOCOL)
        .and_then(ne16)
        .and_then(proto_of)
    else {
        return Ok(None);
    };
    let addr = find(svc, SVC_ATTR_ADDR)
        .and_then(|d| addr_of(family, d))
        .ok_or("no address")?;
    let port = find(svc, SVC_ATTR_PORT).and_then(be16).ok_or("no port")?;
    let scheduler = find(svc, SVC_ATTR_SCHED_NAME).map(text).unwrap_or_default();
    let flags = find(svc, SVC_ATTR_FLAGS).and_then(ne32).unwrap_or(0) & !SVC_F_HASHED;
    let timeout = find(svc, SVC_ATTR_TIMEOUT).and_then(ne32).unwrap_or(0);
    Ok(Some((
        ServiceId {
            addr,
            protocol,
            port,
        },
        ServiceSpec {
            scheduler,
            flags,
            timeout,
        },
    )))
}

/// One real server of a dump.
pub fn decode_dest(body: &[u8]) -> Result<Dest, String> {
    let d = find(body, CMD_ATTR_DEST).ok_or("no destination attribute")?;
    let family = find(d, DEST_ATTR_ADDR_FAMILY)
        .and_then(ne16)
        .ok_or("no address family")?;
    Ok(Dest {
        addr: find(d, DEST_ATTR_ADDR)
            .and_then(|a| addr_of(family, a))
            .ok_or("no address")?,
        port: find(d, DEST_ATTR_PORT).and_then(be16).ok_or("no port")?,
        weight: find(d, DEST_ATTR_WEIGHT).and_then(ne32).unwrap_or(0),
        active_conns: find(d, DEST_ATTR_ACTIVE_CONNS).and_then(ne32).unwrap_or(0),
        inactive_conns: find(d, DEST_ATTR_INACT_CONNS).and_then(ne32).unwrap_or(0),
    })
}

/// A generic netlink socket bound to the IPVS family, in the calling thread's network
/// namespace.
pub struct IpvsSocket {
    socket: Socket,
    family: u16,
    /// Requests sent (one per operation and per dump), for the benchmarks and reports.
    pub requests: u64,
}

impl std::fmt::Debug for IpvsSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpvsSocket")
            .field("family", &self.family)
            .finish()
    }
}

impl IpvsSocket {
    /// Opens the socket and resolves the IPVS family; [`GenlError::NoIpvs`] when the kernel
    /// has none (ip_vs not loaded or not built).
    pub fn open() -> Result<IpvsSocket, GenlError> {
        let mut s = IpvsSocket {
            socket: Socket::open(NETLINK_GENERIC, "IPVS")?,
            family: GENL_ID_CTRL,
            requests: 0,
        };
        let mut a = Vec::new();
        push_attr(&mut a, CTRL_ATTR_FAMILY_NAME, &cstr(IPVS_GENL_NAME));
        let replies = match s.exchange("family lookup", CTRL_CMD_GETFAMILY, 1, 0, &a) {
            Err(GenlError::Netlink(NetlinkError::Kernel { errno: 2, .. })) => {
                return Err(GenlError::NoIpvs)
            }
            other => other?,
        };
        let id = replies
            .iter()
            .find_map(|b| find(b, CTRL_ATTR_FAMILY_ID).and_then(ne16))
            .ok_or(GenlError::NoIpvs)?;
        s.family = id;
        Ok(s)
    }

    /// Sends one request and collects the attribute payloads of its replies.
    fn exchange(
        &mut self,
        what: &str,
        cmd: u8,
        version: u8,
        flags: u16,
        attrs_buf: &[u8],
    ) -> Result<Vec<Vec<u8>>, GenlError> {
        self.requests += 1;
        let request = Request::genl(self.family, cmd, version, flags, attrs_buf);
        Ok(self.socket.request(what, &request)?)
    }

    /// Every address/protocol/port virtual service in the kernel.
    pub fn services(&mut self) -> Result<Vec<(ServiceId, ServiceSpec)>, GenlError> {
        let what = "list services";
        let replies = self.exchange(what, CMD_GET_SERVICE, IPVS_GENL_VERSION, NLM_F_DUMP, &[])?;
        let mut out = Vec::new();
        for body in replies {
            let parsed = decode_service(&body).map_err(|d| self.socket.malformed(what, &d))?;
            out.extend(parsed);
        }
        Ok(out)
    }

    /// The real servers of one virtual service.
    pub fn dests(&mut self, id: &ServiceId) -> Result<Vec<Dest>, GenlError> {
        let what = format!("list real servers of {id}");
        let replies = self.exchange(
            &what,
            CMD_GET_DEST,
            IPVS_GENL_VERSION,
            NLM_F_DUMP,
            &service_attrs(id, None),
        )?;
        replies
            .iter()
            .map(|b| Ok(decode_dest(b).map_err(|d| self.socket.malformed(&what, &d))?))
            .collect()
    }

    /// Applies `ops` in order, many requests to a datagram, and reads the answers after
    /// each datagram: the kernel still handles and acknowledges each on its own, so one
    /// that fails does not stop the others. The outcome of each, in order; `Err` only when
    /// the socket itself fails.
    pub fn apply_all(&mut self, ops: &[Op]) -> Result<Vec<Result<(), GenlError>>, GenlError> {
        // Small enough that the acknowledgements of a batch fit the socket's buffer.
        const BATCH: usize = 128;
        let mut out = Vec::with_capacity(ops.len());
        for chunk in ops.chunks(BATCH) {
            let mut buf = Vec::new();
            let mut first = None;
            for op in chunk {
                let seq = self.socket.next_seq();
                first.get_or_insert(seq);
                self.requests += 1;
                let (cmd, a) = encode(op);
                let request = Request::genl(self.family, cmd, IPVS_GENL_VERSION, NLM_F_ACK, &a);
                request.write(&mut buf, seq);
            }
            let first = first.unwrap_or_default();
            let answers = self.socket.acks("apply", &buf, first, chunk.len())?;
            out.extend(chunk.iter().zip(answers).map(|(op, errno)| match errno {
                0 => Ok(()),
                e => Err(self.socket.kernel_error(&op.to_string(), e).into()),
            }));
        }
        Ok(out)
    }

    /// Applies one operation.
    pub fn apply(&mut self, op: &Op) -> Result<(), GenlError> {
        let (cmd, a) = encode(op);
        self.exchange(&op.to_string(), cmd, IPVS_GENL_VERSION, NLM_F_ACK, &a)
            .map(|_| ())
    }

    /// Sets IPVS's connection timeouts in seconds (`ipvs.tcpTimeout` and the others); a
    /// zero leaves that one as it is.
    pub fn set_timeouts(&mut self, tcp: u32, tcp_fin: u32, udp: u32) -> Result<(), GenlError> {
        let mut a = Vec::new();
        for (kind, v) in [
            (CMD_ATTR_TIMEOUT_TCP, tcp),
            (CMD_ATTR_TIMEOUT_TCP_FIN, tcp_fin),
            (CMD_ATTR_TIMEOUT_UDP, udp),
        ] {
            if v > 0 {
                push_attr(&mut a, kind, &v.to_ne_bytes());
            }
        }
        if a.is_empty() {
            return Ok(());
        }
        self.exchange(
            "set timeouts",
            CMD_SET_CONFIG,
            IPVS_GENL_VERSION,
            NLM_F_ACK,
            &a,
        )
        .map(|_| ())
    }

    /// IPVS's connection timeouts in seconds: tcp, tcp-fin, udp.
    pub fn timeouts(&mut self) -> Result<(u32, u32, u32), GenlError> {
        let replies = self.exchange("get timeouts", CMD_GET_CONFIG, IPVS_GENL_VERSION, 0, &[])?;
        let body = replies
            .first()
            .ok_or_else(|| self.socket.malformed("get timeouts", "no reply"))?;
        let get = |kind| find(body, kind).and_then(ne32).unwrap_or(0);
        Ok((
            get(CMD_ATTR_TIMEOUT_TCP),
            get(CMD_ATTR_TIMEOUT_TCP_FIN),
            get(CMD_ATTR_TIMEOUT_UDP),
        ))
    }

    /// Removes every virtual service (tests and `cleanup`).
    pub fn flush(&mut self) -> Result<(), GenlError> {
        self.exchange("flush", CMD_FLUSH, IPVS_GENL_VERSION, NLM_F_ACK, &[])
            .map(|_| ())
    }
}

/// Attribute types present in a payload, for tests that check the encoding.
#[cfg(test)]
fn kinds(buf: &[u8]) -> Vec<u16> {
    crate::netlink::attrs(buf).map(|a| a.kind).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::nested;

    fn id() -> ServiceId {
        ServiceId {
            addr: "172.30.0.10".parse().unwrap(),
            protocol: Protocol::Udp,
            port: 53,
        }
    }

    fn spec() -> ServiceSpec {
        ServiceSpec {
            scheduler: "rr".into(),
            flags: SVC_F_PERSISTENT,
            timeout: 10800,
        }
    }

    /// What we encode for a service add is what a dump of it decodes to (the kernel
    /// answers with the same attributes, plus stats and the hashed flag).
    #[test]
    fn service_round_trips() {
        let (cmd, a) = encode(&Op::AddService(id(), spec()));
        assert_eq!(cmd, CMD_NEW_SERVICE);
        assert_eq!(kinds(&a), vec![CMD_ATTR_SERVICE]);
        let inner = find(&a, CMD_ATTR_SERVICE).unwrap();
        assert_eq!(
            kinds(inner),
            vec![
                SVC_ATTR_AF,
                SVC_ATTR_PROTOCOL,
                SVC_ATTR_ADDR,
                SVC_ATTR_PORT,
                SVC_ATTR_SCHED_NAME,
                SVC_ATTR_FLAGS,
                SVC_ATTR_TIMEOUT,
                SVC_ATTR_NETMASK
            ]
        );
        // Port in network order, as the kernel reads it.
        assert_eq!(find(inner, SVC_ATTR_PORT).unwrap(), &[0, 53]);
        assert_eq!(decode_service(&a).unwrap(), Some((id(), spec())));
    }

    #[test]
    fn dest_round_trips_and_delete_names_only_the_server() {
        let ip: IpAddr = "fd00:10::5".parse().unwrap();
        let v6 = ServiceId {
            addr: "fd00:30::1".parse().unwrap(),
            ..id()
        };
        let (cmd, a) = encode(&Op::AddDest(v6, ip, 8053, 1));
        assert_eq!(cmd, CMD_NEW_DEST);
        assert_eq!(kinds(&a), vec![CMD_ATTR_SERVICE, CMD_ATTR_DEST]);
        let d = decode_dest(&a).unwrap();
        assert_eq!((d.addr, d.port, d.weight), (ip, 8053, 1));
        let (cmd, a) = encode(&Op::DeleteDest(v6, ip, 8053));
        assert_eq!(cmd, CMD_DEL_DEST);
        let inner = find(&a, CMD_ATTR_DEST).unwrap();
        assert_eq!(
            kinds(inner),
            vec![DEST_ATTR_ADDR_FAMILY, DEST_ATTR_ADDR, DEST_ATTR_PORT]
        );
    }

    #[test]
    fn fwmark_services_are_not_ours() {
        let mut s = Vec::new();
        push_attr(&mut s, SVC_ATTR_AF, &AF_INET.to_ne_bytes());
        push_attr(&mut s, SVC_ATTR_FWMARK, &7u32.to_ne_bytes());
        let mut a = Vec::new();
        nested(&mut a, CMD_ATTR_SERVICE, &s);
        assert_eq!(decode_service(&a).unwrap(), None);
    }

    /// IPVS replies are untrusted bytes: decoding a service or a destination never panics.
    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]
            #[test]
            fn any_reply_decodes_or_fails_without_panicking(
                noise in proptest::collection::vec(any::<u8>(), 0..512),
                edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8),
                cut in any::<usize>(),
            ) {
                let _ = decode_service(&noise);
                let _ = decode_dest(&noise);
                let mut svc = service_attrs(&id(), None);
                let n = svc.len();
                for (at, b) in &edits {
                    svc[at % n] = *b;
                }
                svc.truncate(cut % (n + 1));
                let _ = decode_service(&svc);
                let _ = decode_dest(&svc);
            }
        }
    }
}
