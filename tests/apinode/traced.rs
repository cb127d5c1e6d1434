//! A connection to a service that, when its handshake is not answered in time, asks the
//! kernel what became of it: the conntrack entry of that very flow says whether our rules
//! DNATed it to a pod (the rules did their part; the SYN or its answer was late or lost
//! past them) or left it on the service address (no rule met it).

use crate::netns;
use socket2::{Domain, Protocol, Socket, Type};
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

/// How long an unanswered connection is watched after its timeout: past the kernel's first
/// SYN retransmission (1 s), so that a lost SYN shows as answered late.
const WATCH_AFTER: Duration = Duration::from_millis(2500);

/// What became of a connection whose handshake outlived its timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unanswered {
    pub to: Ipv4Addr,
    pub local_port: u16,
    /// Where conntrack says the flow goes (its reply source); `None` when it has no entry.
    pub dnat: Option<SocketAddr>,
    /// The conntrack line as listed, for the report.
    pub conntrack: String,
    /// When the handshake completed after all, counted from the start.
    pub answered_after: Option<Duration>,
}

impl Unanswered {
    /// The flow was translated to `pods` at `port`: the rules met it and chose a pod.
    pub fn dnat_to_one_of(&self, pods: &[&str], port: u16) -> bool {
        self.dnat.is_some_and(|a| {
            a.port() == port
                && pods
                    .iter()
                    .any(|p| p.parse::<IpAddr>().ok() == Some(a.ip()))
        })
    }
}

/// Why a connection failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The handshake did not finish within the timeout.
    Unanswered(Unanswered),
    /// Anything else (refused, reset, a wrong answer), as text.
    Other(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Other(s) => f.write_str(s),
            Failure::Unanswered(u) => write!(
                f,
                "{}: connect from port {} timed out; conntrack: {}; {}",
                u.to,
                u.local_port,
                if u.conntrack.is_empty() {
                    "no entry"
                } else {
                    &u.conntrack
                },
                match u.answered_after {
                    Some(d) => format!("answered after {} ms", d.as_millis()),
                    None => format!("still unanswered after {} ms", WATCH_AFTER.as_millis()),
                }
            ),
        }
    }
}

/// One connection to `to`:80 from the namespace `ns`, read to its end ("ok\n" expected).
pub fn connect_traced(ns: &str, to: Ipv4Addr, timeout: Duration) -> Result<(), Failure> {
    let other = |e: std::io::Error| Failure::Other(format!("{to}: {e}"));
    let socket = netns::in_netns(ns, || {
        let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
        s.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)).into())?;
        Ok(s)
    })
    .map_err(other)?;
    let local_port = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map_or(0, |a| a.port());
    let target = SocketAddr::from((to, 80));
    let t0 = Instant::now();
    match socket.connect_timeout(&target.into(), timeout) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
            // Asked while the socket still waits, so the entry is the flow's own.
            let conntrack = conntrack_line(ns, to, local_port);
            let dnat = reply_source(&conntrack);
            let answered_after = answered_within(&socket, t0, timeout + WATCH_AFTER);
            return Err(Failure::Unanswered(Unanswered {
                to,
                local_port,
                dnat,
                conntrack,
                answered_after,
            }));
        }
        Err(e) => return Err(Failure::Other(format!("{to}: connect: {e}"))),
    }
    let mut stream: std::net::TcpStream = socket.into();
    stream
        .set_read_timeout(Some(Duration::from_secs(1)))
        .map_err(other)?;
    let mut buf = String::new();
    stream
        .read_to_string(&mut buf)
        .map_err(|e| Failure::Other(format!("{to}: read: {e}")))?;
    if buf == "ok\n" {
        Ok(())
    } else {
        Err(Failure::Other(format!("{to}: answered {buf:?}")))
    }
}

/// Waits (until `limit` from `t0`) for a connect in flight to complete; looks at least
/// once, however long asking conntrack took.
fn answered_within(socket: &Socket, t0: Instant, limit: Duration) -> Option<Duration> {
    loop {
        if socket.peer_addr().is_ok() {
            return Some(t0.elapsed());
        }
        if matches!(socket.take_error(), Ok(Some(_))) || t0.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The conntrack entry of the TCP flow from `port` to `to`:80, as `conntrack -L` lists it.
fn conntrack_line(ns: &str, to: Ipv4Addr, port: u16) -> String {
    let (to, port) = (to.to_string(), port.to_string());
    let args = [
        "netns",
        "exec",
        ns,
        "conntrack",
        "-L",
        "-p",
        "tcp",
        "-d",
        &to,
        "--sport",
        &port,
        "--dport",
        "80",
    ];
    let out = netns::run("ip", &args, None, netns::CMD_TIMEOUT);
    if !out.success() {
        return format!("(conntrack failed: {})", out.transcript().trim());
    }
    out.stdout.trim().to_string()
}

/// The reply direction's source in a `conntrack -L` line: where the flow was translated to.
fn reply_source(line: &str) -> Option<SocketAddr> {
    let field = |key: &str| {
        line.split_whitespace()
            .filter_map(move |w| w.strip_prefix(key))
            .nth(1)
    };
    let ip: IpAddr = field("src=")?.parse().ok()?;
    let port: u16 = field("sport=")?.parse().ok()?;
    Some(SocketAddr::new(ip, port))
}

#[test]
fn the_reply_source_is_where_the_flow_was_translated_to() {
    let line = "tcp      6 119 SYN_SENT src=10.180.0.1 dst=10.96.0.176 sport=43210 dport=80 \
        [UNREPLIED] src=10.180.0.3 dst=10.180.0.1 sport=8080 dport=43210 mark=0 use=1";
    assert_eq!(reply_source(line), Some("10.180.0.3:8080".parse().unwrap()));
    assert_eq!(reply_source(""), None);
    let u = Unanswered {
        to: Ipv4Addr::new(10, 96, 0, 176),
        local_port: 43210,
        dnat: reply_source(line),
        conntrack: line.into(),
        answered_after: None,
    };
    assert!(u.dnat_to_one_of(&["10.180.0.3"], 8080));
    assert!(!u.dnat_to_one_of(&["10.180.0.3"], 80));
    let missed = "tcp 6 119 SYN_SENT src=10.180.0.1 dst=10.96.0.176 sport=43210 dport=80 \
        [UNREPLIED] src=10.96.0.176 dst=10.180.0.1 sport=80 dport=43210 mark=0 use=1";
    assert!(!Unanswered {
        dnat: reply_source(missed),
        ..u
    }
    .dnat_to_one_of(&["10.180.0.3"], 8080));
}
