//! Real sockets inside namespaces: TCP/UDP responders that report who they are and who
//! they saw, and bounded client probes that classify what a connection attempt observed.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use socket2::{Domain, Protocol as SockProto, SockAddr, Socket, Type};

use super::netns::in_netns;

/// How long a client waits for a connection or an answer before calling it a timeout.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(1500);
/// How long a UDP client whose send was refused locally waits for the ICMP error of a REJECT.
const LOCAL_REJECT_WAIT: Duration = Duration::from_millis(300);
/// How often serving threads look at the stop flag.
const POLL: Duration = Duration::from_millis(50);

/// What a TCP responder does with an accepted connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponderMode {
    /// Write the identity line and close.
    OneShot,
    /// Write the identity line, then echo every line back until the client closes.
    Echo,
}

/// The identity line a responder sends: `"<local ip:port> <peer ip>\n"`.
pub fn identity_line(local: SocketAddr, peer: IpAddr) -> String {
    format!("{local} {peer}\n")
}

/// Parses an identity line back into (responder address, observed peer).
pub fn parse_identity(line: &str) -> Option<(SocketAddr, IpAddr)> {
    let mut parts = line.split_whitespace();
    let local = parts.next()?.parse().ok()?;
    let peer = parts.next()?.parse().ok()?;
    if parts.next().is_some() {
        return None;
    }
    Some((local, peer))
}

fn domain(addr: &SocketAddr) -> Domain {
    if addr.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    }
}

/// Starts a TCP responder bound to `addr` inside `ns`. Binding errors are returned at once.
pub fn spawn_tcp_responder(
    ns: &str,
    addr: SocketAddr,
    mode: ResponderMode,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    let listener: TcpListener = in_netns(ns, || {
        let s = Socket::new(domain(&addr), Type::STREAM, Some(SockProto::TCP))?;
        s.set_reuse_address(true)?;
        if addr.is_ipv6() {
            s.set_only_v6(true)?;
        }
        s.bind(&SockAddr::from(addr))?;
        s.listen(256)?;
        // SO_RCVTIMEO bounds accept(), so the loop sees the stop flag.
        s.set_read_timeout(Some(POLL))?;
        Ok(s.into())
    })?;
    Ok(std::thread::spawn(move || {
        let mut conns: Vec<JoinHandle<()>> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((stream, peer)) => match mode {
                    ResponderMode::OneShot => serve_one_shot(stream, addr, peer.ip()),
                    ResponderMode::Echo => {
                        let stop = stop.clone();
                        conns.push(std::thread::spawn(move || {
                            serve_echo(stream, addr, peer.ip(), &stop)
                        }));
                    }
                },
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => std::thread::sleep(POLL),
            }
            conns.retain(|h| !h.is_finished());
        }
        for h in conns {
            let _ = h.join();
        }
    }))
}

fn serve_one_shot(mut stream: TcpStream, local: SocketAddr, peer: IpAddr) {
    let _ = stream.set_write_timeout(Some(PROBE_TIMEOUT));
    let _ = stream.write_all(identity_line(local, peer).as_bytes());
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

fn serve_echo(stream: TcpStream, local: SocketAddr, peer: IpAddr, stop: &AtomicBool) {
    let _ = stream.set_write_timeout(Some(PROBE_TIMEOUT));
    let _ = stream.set_read_timeout(Some(POLL));
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    if writer
        .write_all(identity_line(local, peer).as_bytes())
        .is_err()
    {
        return;
    }
    let mut pending: Vec<u8> = Vec::new();
    let mut reader = stream;
    let mut buf = [0u8; 1024];
    while !stop.load(Ordering::Relaxed) {
        match reader.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                pending.extend_from_slice(&buf[..n]);
                while let Some(pos) = pending.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=pos).collect();
                    if writer.write_all(&line).is_err() {
                        return;
                    }
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

/// Starts a UDP responder bound to `addr` inside `ns`: every datagram gets the identity line.
pub fn spawn_udp_responder(
    ns: &str,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    let socket: UdpSocket = in_netns(ns, || {
        let s = Socket::new(domain(&addr), Type::DGRAM, Some(SockProto::UDP))?;
        s.set_reuse_address(true)?;
        if addr.is_ipv6() {
            s.set_only_v6(true)?;
        }
        s.bind(&SockAddr::from(addr))?;
        s.set_read_timeout(Some(POLL))?;
        Ok(s.into())
    })?;
    Ok(std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while !stop.load(Ordering::Relaxed) {
            match socket.recv_from(&mut buf) {
                Ok((_, peer)) => {
                    let _ = socket.send_to(identity_line(addr, peer.ip()).as_bytes(), peer);
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => std::thread::sleep(POLL),
            }
        }
    }))
}

/// What one connection attempt observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A responder answered: its own address and the source address it saw.
    Reply { local: SocketAddr, peer: IpAddr },
    /// ECONNREFUSED: ICMP port unreachable or TCP RST.
    Refused,
    /// No answer within the probe timeout.
    Timeout,
    /// The local stack refused to send (EPERM: dropped by a local OUTPUT filter).
    LocalDrop,
    /// An ICMP error other than port unreachable (e.g. the packet leaked to the uplink,
    /// whose catch-all answers admin-prohibited).
    Unreachable(String),
    /// Connected, but the peer closed or sent something that is not an identity line.
    Garbled(String),
    /// Anything else (socket setup failures and the like).
    Error(String),
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Reply { local, peer } => write!(f, "reply from {local} (saw peer {peer})"),
            Outcome::Refused => f.write_str("REFUSED"),
            Outcome::Timeout => f.write_str("TIMEOUT"),
            Outcome::LocalDrop => f.write_str("LOCAL DROP (EPERM)"),
            Outcome::Unreachable(e) => write!(f, "UNREACHABLE ({e})"),
            Outcome::Garbled(s) => write!(f, "GARBLED ({s:?})"),
            Outcome::Error(e) => write!(f, "ERROR ({e})"),
        }
    }
}

fn classify(e: &std::io::Error) -> Outcome {
    match e.kind() {
        ErrorKind::ConnectionRefused => return Outcome::Refused,
        ErrorKind::TimedOut | ErrorKind::WouldBlock => return Outcome::Timeout,
        _ => {}
    }
    match e.raw_os_error().map(nix::errno::Errno::from_raw) {
        Some(nix::errno::Errno::EPERM) => Outcome::LocalDrop,
        Some(
            errno @ (nix::errno::Errno::EHOSTUNREACH
            | nix::errno::Errno::ENETUNREACH
            | nix::errno::Errno::EACCES
            | nix::errno::Errno::EPROTO),
        ) => Outcome::Unreachable(format!("{errno}")),
        _ => Outcome::Error(e.to_string()),
    }
}

/// A client socket created in `ns` and bound to `source` (ephemeral port).
fn client_socket(ns: &str, source: IpAddr, dest: &SocketAddr, ty: Type) -> std::io::Result<Socket> {
    let dest = *dest;
    in_netns(ns, move || {
        let proto = if ty == Type::STREAM {
            SockProto::TCP
        } else {
            SockProto::UDP
        };
        let s = Socket::new(domain(&dest), ty, Some(proto))?;
        if dest.is_ipv6() {
            s.set_only_v6(true)?;
        }
        s.bind(&SockAddr::from(SocketAddr::new(source, 0)))?;
        Ok(s)
    })
}

fn read_identity(stream: &mut BufReader<TcpStream>) -> Outcome {
    let mut line = String::new();
    match stream.read_line(&mut line) {
        Ok(_) => match parse_identity(&line) {
            Some((local, peer)) => Outcome::Reply { local, peer },
            None => Outcome::Garbled(line),
        },
        Err(e) => match classify(&e) {
            Outcome::Timeout => Outcome::Garbled("connected, but no identity line".into()),
            other => other,
        },
    }
}

/// One TCP connection attempt from `source` (in `ns`) to `dest`.
pub fn probe_tcp(ns: &str, source: IpAddr, dest: SocketAddr) -> Outcome {
    match connect_tcp(ns, source, dest) {
        Ok((_, outcome)) => outcome,
        Err(outcome) => outcome,
    }
}

/// Connects over TCP and reads the identity line; keeps the stream for further use.
pub fn connect_tcp(
    ns: &str,
    source: IpAddr,
    dest: SocketAddr,
) -> Result<(BufReader<TcpStream>, Outcome), Outcome> {
    let socket = client_socket(ns, source, &dest, Type::STREAM)
        .map_err(|e| Outcome::Error(format!("client socket: {e}")))?;
    socket
        .connect_timeout(&SockAddr::from(dest), PROBE_TIMEOUT)
        .map_err(|e| classify(&e))?;
    let stream: TcpStream = socket.into();
    stream
        .set_read_timeout(Some(PROBE_TIMEOUT))
        .map_err(|e| Outcome::Error(e.to_string()))?;
    let mut reader = BufReader::new(stream);
    let outcome = read_identity(&mut reader);
    Ok((reader, outcome))
}

/// One UDP exchange from `source` (in `ns`) to `dest`, on a connected socket.
pub fn probe_udp(ns: &str, source: IpAddr, dest: SocketAddr) -> Outcome {
    let socket = match client_socket(ns, source, &dest, Type::DGRAM) {
        Ok(s) => s,
        Err(e) => return Outcome::Error(format!("client socket: {e}")),
    };
    if let Err(e) = socket.connect(&SockAddr::from(dest)) {
        return classify(&e);
    }
    let socket: UdpSocket = socket.into();
    if let Err(e) = socket.set_read_timeout(Some(PROBE_TIMEOUT)) {
        return Outcome::Error(e.to_string());
    }
    let mut buf = [0u8; 1500];
    if let Err(e) = socket.send(b"probe\n") {
        // A REJECT in the local OUTPUT path answers with ICMP port unreachable and drops
        // the datagram, so send fails with EPERM as for a plain drop; the ICMP error then
        // reaches the connected socket, and the next receive tells the two apart.
        return match classify(&e) {
            Outcome::LocalDrop => {
                let _ = socket.set_read_timeout(Some(LOCAL_REJECT_WAIT));
                match socket.recv(&mut buf) {
                    Err(e) if classify(&e) == Outcome::Refused => Outcome::Refused,
                    _ => Outcome::LocalDrop,
                }
            }
            other => other,
        };
    }
    match socket.recv(&mut buf) {
        Ok(n) => {
            let line = String::from_utf8_lossy(&buf[..n]).to_string();
            match parse_identity(&line) {
                Some((local, peer)) => Outcome::Reply { local, peer },
                None => Outcome::Garbled(line),
            }
        }
        Err(e) => classify(&e),
    }
}
