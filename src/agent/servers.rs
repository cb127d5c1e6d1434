//! The agent's HTTP servers: binding (hard failure or retry, as bindAddressHardFail says)
//! and the routes of the metrics and health addresses, as kube-proxy serves them.

use super::health::Health;
use super::metrics::Metrics;
use super::{http, AgentError};
use crate::config::ProxyMode;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

async fn bind(field: &'static str, addr: &str) -> Result<tokio::net::TcpListener, AgentError> {
    let err = |message: String| AgentError::Bind {
        field,
        addr: addr.to_string(),
        message,
    };
    let sa: SocketAddr = addr
        .parse()
        .map_err(|e| err(format!("not an address:port: {e}")))?;
    tokio::net::TcpListener::bind(sa)
        .await
        .map_err(|e| err(format!("cannot listen: {e}")))
}

/// Start one HTTP server. A port that cannot be bound stops the agent with
/// bindAddressHardFail; otherwise, as kube-proxy does, it is logged and tried again every
/// 5 s while the proxy runs.
pub(super) async fn serve(
    field: &'static str,
    addr: &str,
    hard_fail: bool,
    router: http::Router,
    limits: http::Limits,
) -> Result<(), AgentError> {
    if addr.is_empty() {
        return Ok(());
    }
    match bind(field, addr).await {
        Ok(listener) => {
            tokio::spawn(http::serve(listener, router, limits));
            Ok(())
        }
        Err(e) if hard_fail => Err(e),
        Err(e) => {
            tracing::error!("{e}; trying again every 5s (bindAddressHardFail is off)");
            let addr = addr.to_string();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    if let Ok(listener) = bind(field, &addr).await {
                        tracing::info!("{field} {addr}: listening");
                        http::serve(listener, router, limits).await;
                        return;
                    }
                }
            });
            Ok(())
        }
    }
}

/// The metrics address, as kube-proxy's serves it: `/metrics`, `/healthz` (a ping: the
/// process answers), `/livez`, `/proxyMode` and `/configz`.
pub fn metrics_router(
    metrics: Metrics,
    health: Arc<Mutex<Health>>,
    mode: ProxyMode,
    configz: String,
) -> http::Router {
    Arc::new(move |path| match path {
        "/metrics" => Some(http::Reply {
            status: 200,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            body: metrics.render(),
            headers: Vec::new(),
        }),
        "/healthz" | "/healthz/ping" => Some(http::Reply::text(200, "ok".into())),
        "/livez" => {
            let reply = health
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .livez(SystemTime::now());
            Some(http::Reply::json(reply.status, reply.body))
        }
        "/proxyMode" => Some(http::Reply::text(200, mode.as_str().into())),
        "/configz" => Some(http::Reply::json(200, configz.clone())),
        _ => None,
    })
}

pub fn health_router(health: Arc<Mutex<Health>>, metrics: Metrics) -> http::Router {
    Arc::new(move |path| {
        let now = SystemTime::now();
        let (reply, counter) = {
            let h = health.lock().unwrap_or_else(|p| p.into_inner());
            match path {
                "/healthz" => (h.healthz(now), &metrics.healthz),
                "/livez" => (h.livez(now), &metrics.livez),
                _ => return None,
            }
        };
        counter
            .with_label_values(&[&reply.status.to_string()])
            .inc();
        Some(http::Reply::json(reply.status, reply.body))
    })
}
