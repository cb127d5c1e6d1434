//! A plain HTTP/1.1 GET over real TCP from inside a network namespace, for the tests that
//! read an agent's (or kube-proxy's) metrics and health endpoints.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// GET `path` from `addr` inside namespace `ns`: (status, body), a chunked body joined.
pub fn get(ns: &str, addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let addr = addr.to_string();
    let path = path.to_string();
    crate::netns::in_netns(ns, move || {
        let sock: std::net::SocketAddr = addr
            .parse()
            .map_err(|e| std::io::Error::other(format!("{addr}: {e}")))?;
        let mut s = TcpStream::connect_timeout(&sock, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?;
        let mut resp = String::new();
        s.read_to_string(&mut resp)?;
        let status = resp
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        let body = if chunked {
            dechunk(body)
        } else {
            body.to_string()
        };
        Ok((status, body))
    })
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}
