//! A small HTTP/1.1 server (hyper) for the metrics and health endpoints: GET and HEAD on
//! fixed paths, answered by a routing function.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::net::TcpListener;

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

/// Serve until the listener fails; each connection on its own task.
pub async fn serve(listener: TcpListener, route: Router) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors and the like: pause rather than spin.
                tracing::warn!("http accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let route = route.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let route = route.clone();
                async move { Ok::<_, Infallible>(answer(&req, &route)) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                tracing::debug!("http connection ended: {e}");
            }
        });
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
