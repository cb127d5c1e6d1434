//! A small HTTP/1.1 server (hyper) for the metrics and health endpoints: GET and HEAD on
//! fixed paths, answered by a routing function. A slow or hostile client cannot hold it:
//! request heads must arrive in time, silent connections are closed, and each pool of
//! servers holds a bounded number of connections.

pub mod activity;
pub mod limit;

use activity::{Activity, Watched};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use limit::Pool;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// Default time for a request head to arrive, on a new connection or on a kept-alive one
/// waiting for its next request (hyper starts the timer whenever it waits for a head).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time a connection may go without moving a byte either way, in the middle of a
/// request or its answer (a client that stopped reading, or stopped sending).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Test-only: overrides [`HEADER_READ_TIMEOUT`], in milliseconds, so that a test need not
/// wait 10 s to see a connection closed. Not a supported setting.
pub const HEADER_READ_TIMEOUT_ENV: &str = "SWITCHYARD_HTTP_HEADER_TIMEOUT_MS";
/// Test-only: overrides [`IDLE_TIMEOUT`], in milliseconds. Not a supported setting.
pub const IDLE_TIMEOUT_ENV: &str = "SWITCHYARD_HTTP_IDLE_TIMEOUT_MS";

/// How long a connection may keep the server waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub header_read: Duration,
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            header_read: HEADER_READ_TIMEOUT,
            idle: IDLE_TIMEOUT,
        }
    }
}

impl Timeouts {
    /// The defaults, or the test-only overrides from the environment.
    pub fn from_env() -> Timeouts {
        let var = |name| std::env::var(name).ok();
        Timeouts {
            header_read: millis(
                HEADER_READ_TIMEOUT_ENV,
                var(HEADER_READ_TIMEOUT_ENV).as_deref(),
                HEADER_READ_TIMEOUT,
            ),
            idle: millis(
                IDLE_TIMEOUT_ENV,
                var(IDLE_TIMEOUT_ENV).as_deref(),
                IDLE_TIMEOUT,
            ),
        }
    }
}

/// A positive number of milliseconds, else the default (a bad value is logged).
fn millis(name: &str, value: Option<&str>, default: Duration) -> Duration {
    match value.map(|v| v.trim().parse::<u64>()) {
        None => default,
        Some(Ok(ms)) if ms > 0 => Duration::from_millis(ms),
        Some(_) => {
            tracing::warn!("{name}: not a positive number of milliseconds; using {default:?}");
            default
        }
    }
}

/// What a server needs besides its listener and routes: its timeouts and the pool its
/// connections count against.
#[derive(Clone)]
pub struct Limits {
    pub timeouts: Timeouts,
    pub pool: Arc<Pool>,
}

/// A routed answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
    /// More response headers.
    pub headers: Vec<(&'static str, String)>,
}

impl Reply {
    pub fn json(status: u16, body: String) -> Reply {
        Reply {
            status,
            content_type: "application/json",
            body,
            headers: Vec::new(),
        }
    }

    pub fn text(status: u16, body: String) -> Reply {
        Reply {
            status,
            content_type: "text/plain; charset=utf-8",
            body,
            headers: Vec::new(),
        }
    }

    fn not_found() -> Reply {
        Reply::text(404, "404 page not found\n".into())
    }
}

/// Maps a path to a reply; `None` is 404.
pub type Router = Arc<dyn Fn(&str) -> Option<Reply> + Send + Sync>;

/// Serve until the task is aborted; each connection on its own task, holding a place in
/// the pool until it closes.
pub async fn serve(listener: TcpListener, route: Router, limits: Limits) {
    let mut backoff = Backoff::default();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                if let Some(failures) = backoff.reset() {
                    tracing::info!(
                        "{}: accepting connections again after {failures} failed accepts",
                        limits.pool.name()
                    );
                }
                stream
            }
            // The client gave up before we took its connection; the next one is fine.
            Err(e) if per_connection(&e) => continue,
            Err(e) => {
                // Out of descriptors (or memory): the pending connection stays queued and
                // the listener stays readable, so retrying at once would spin. Wait, longer
                // each time, until something is closed.
                let pause = backoff.next();
                if backoff.failures() == 1 {
                    tracing::warn!(
                        "{}: accept failed: {e}; retrying with backoff (up to {:?})",
                        limits.pool.name(),
                        Backoff::MAX
                    );
                }
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        let Some(slot) = limits.pool.admit().await else {
            tracing::debug!(
                "{}: no place came free; closing a new connection",
                limits.pool.name()
            );
            continue;
        };
        tokio::spawn(connection(stream, slot, route.clone(), limits.timeouts));
    }
}

/// One connection, until the client is done, a timeout fires, or the pool needs its place.
async fn connection(stream: TcpStream, slot: limit::Slot, route: Router, timeouts: Timeouts) {
    let activity: Arc<Activity> = slot.activity.clone();
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let route = route.clone();
        async move { Ok::<_, Infallible>(answer(&req, &route)) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header_read)
        // A client may shut down its sending side once its request is out (`nc -N`, some
        // load balancers' checks) and still read the answer, as Go's server gives it. Without
        // this, hyper drops such a connection unanswered when it sees the end of input
        // before the answer is written. A half-closed client that never reads is closed by
        // the idle timeout like any other.
        .half_close(true)
        .serve_connection(TokioIo::new(Watched::new(stream, activity.clone())), svc);
    tokio::select! {
        r = conn => match r {
            Ok(()) => {}
            Err(e) if e.is_timeout() => tracing::debug!("http connection closed: no request head within {:?}", timeouts.header_read),
            Err(e) => tracing::debug!("http connection ended: {e}"),
        },
        () = activity::quiet_for(&activity, timeouts.idle) => {
            tracing::debug!("http connection closed: nothing moved for {:?}", timeouts.idle);
        }
        () = slot.close.notified() => {}
    }
}

/// Accept errors that concern one connection only.
fn per_connection(e: &std::io::Error) -> bool {
    use nix::errno::Errno;
    let per = [
        Errno::ECONNABORTED,
        Errno::ECONNRESET,
        Errno::EPROTO,
        Errno::EPERM,
    ];
    e.raw_os_error()
        .is_some_and(|code| per.iter().any(|p| *p as i32 == code))
}

/// The pause after each failed accept in a row: 10 ms doubling up to 1 s.
#[derive(Debug, Default)]
struct Backoff {
    failures: u32,
}

impl Backoff {
    const MIN: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_secs(1);

    fn next(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let doublings = (self.failures - 1).min(16);
        Self::MIN.saturating_mul(1 << doublings).min(Self::MAX)
    }

    fn failures(&self) -> u32 {
        self.failures
    }

    /// Back to the first pause; the failures in a row there were, if any.
    fn reset(&mut self) -> Option<u32> {
        let n = std::mem::take(&mut self.failures);
        (n > 0).then_some(n)
    }
}

fn answer(req: &Request<Incoming>, route: &Router) -> Response<Full<Bytes>> {
    let reply = if req.method() == Method::GET || req.method() == Method::HEAD {
        route(req.uri().path()).unwrap_or_else(Reply::not_found)
    } else {
        Reply::text(405, "method not allowed\n".into())
    };
    let extra = reply.headers;
    let body = if req.method() == Method::HEAD {
        Bytes::new()
    } else {
        Bytes::from(reply.body)
    };
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::OK);
    let headers = resp.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(reply.content_type),
    );
    headers.insert(
        "x-content-type-options",
        hyper::header::HeaderValue::from_static("nosniff"),
    );
    for (name, value) in extra {
        if let Ok(v) = hyper::header::HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::time::Instant;

    #[test]
    fn accept_failures_back_off_to_a_second() {
        let mut b = Backoff::default();
        let pauses: Vec<u64> = (0..9).map(|_| b.next().as_millis() as u64).collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        assert_eq!(b.reset(), Some(9));
        assert_eq!(b.reset(), None);
        assert_eq!(b.next(), Backoff::MIN);
    }

    #[test]
    fn timeouts_take_positive_milliseconds_only() {
        let d = Duration::from_secs(10);
        assert_eq!(millis("x", None, d), d);
        assert_eq!(millis("x", Some("1500"), d), Duration::from_millis(1500));
        assert_eq!(millis("x", Some("0"), d), d);
        assert_eq!(millis("x", Some("soon"), d), d);
    }

    /// A server on 127.0.0.1 with a pool of `capacity`; its address.
    async fn server(capacity: usize, timeouts: Timeouts, body: usize) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let route: Router =
            Arc::new(move |path| (path == "/big").then(|| Reply::text(200, "x".repeat(body))));
        let limits = Limits {
            timeouts,
            pool: Pool::new("test", capacity),
        };
        tokio::spawn(serve(listener, route, limits));
        addr
    }

    /// A blocking GET on its own thread: (status, when it answered).
    async fn get(addr: std::net::SocketAddr, path: &'static str) -> (u16, Duration) {
        tokio::task::spawn_blocking(move || {
            let start = Instant::now();
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            write!(
                s,
                "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut resp = Vec::new();
            let _ = s.read_to_end(&mut resp);
            let text = String::from_utf8_lossy(&resp);
            let code = text
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            (code, start.elapsed())
        })
        .await
        .unwrap()
    }

    /// Waits (bounded) for the server to close `s`; how long it took.
    fn closed_within(mut s: std::net::TcpStream, bound: Duration) -> Option<Duration> {
        let start = Instant::now();
        s.set_read_timeout(Some(bound)).unwrap();
        let mut buf = [0u8; 64 * 1024];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return Some(start.elapsed()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return Some(start.elapsed())
                }
                Err(_) => return None,
            }
            if start.elapsed() > bound {
                return None;
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_of_silent_connections_neither_locks_out_a_request_nor_stays() {
        let timeouts = Timeouts {
            header_read: Duration::from_millis(600),
            idle: Duration::from_secs(30),
        };
        let addr = server(4, timeouts, 10).await;
        let flood: Vec<_> = (0..20)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        // Past the pool's size: each new connection took the place of the quietest.
        let (code, took) = get(addr, "/nope").await;
        assert_eq!(code, 404);
        assert!(took < Duration::from_millis(500), "{took:?}");
        let (code, _) = get(addr, "/big").await;
        assert_eq!(code, 200);
        let closed = tokio::task::spawn_blocking(move || {
            flood
                .into_iter()
                .map(|s| closed_within(s, Duration::from_secs(5)))
                .collect::<Vec<_>>()
        })
        .await
        .unwrap();
        assert!(closed.iter().all(Option::is_some), "{closed:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_connection_is_closed_after_the_header_read_timeout() {
        let timeouts = Timeouts {
            header_read: Duration::from_millis(500),
            idle: Duration::from_secs(30),
        };
        let addr = server(4, timeouts, 10).await;
        let s = std::net::TcpStream::connect(addr).unwrap();
        let took = tokio::task::spawn_blocking(move || closed_within(s, Duration::from_secs(5)))
            .await
            .unwrap()
            .expect("closed");
        assert!(
            took >= Duration::from_millis(400) && took < Duration::from_secs(3),
            "{took:?}"
        );
        // A kept-alive connection waiting for its next request is closed the same way.
        let took = tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            write!(s, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            closed_within(s, Duration::from_secs(5))
        })
        .await
        .unwrap()
        .expect("closed");
        assert!(took < Duration::from_secs(3), "{took:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_stops_reading_is_closed_after_the_idle_timeout() {
        let timeouts = Timeouts {
            header_read: Duration::from_secs(30),
            idle: Duration::from_millis(500),
        };
        // Far more than the socket buffers hold: the server's writes stall.
        let body = 64 << 20;
        let addr = server(4, timeouts, body).await;
        let (got, took) = tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            write!(s, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            std::thread::sleep(Duration::from_secs(2));
            let start = Instant::now();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut got = 0usize;
            let mut buf = vec![0u8; 1 << 20];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
            }
            (got, start.elapsed())
        })
        .await
        .unwrap();
        assert!(got < body, "the whole answer came: {got}");
        assert!(took < Duration::from_secs(4), "{took:?}");
    }
}
