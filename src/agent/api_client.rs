//! The API client's own behaviour as kube-proxy's client-go has it: requests limited to
//! `clientConnection.qps` with `burst` (a token bucket, as client-go's), and client-go's
//! `rest_client_requests_total{code,host,method}` and
//! `rest_client_request_duration_seconds{host,verb}`, which kubernetes-mixin and
//! kube-prometheus dashboards read for kube-proxy. A tower layer under kube's client.

use http::{Request, Response};
use prometheus::{HistogramVec, IntCounterVec};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// client-go's request latency buckets (k8s.io/component-base/metrics/prometheus/restclient).
pub const DURATION_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// client-go's metrics for the API client.
#[derive(Clone)]
pub struct ClientMetrics {
    pub requests: IntCounterVec,
    pub duration: HistogramVec,
}

/// A token bucket: `qps` tokens a second, at most `burst` saved. As client-go builds its
/// limiter (rest/config.go, RESTClientFor): a zero qps or burst means client-go's default
/// (5 and 10), a negative qps no limit at all.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    pub fn new(qps: f32, burst: i32) -> TokenBucket {
        let qps = if qps == 0.0 { 5.0 } else { qps };
        let burst = f64::from(if burst == 0 { 10 } else { burst.max(1) });
        TokenBucket {
            qps: f64::from(qps),
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Take a token at `now`; how long to wait first if none is there yet.
    pub fn reserve(&self, now: Instant) -> Duration {
        if self.qps <= 0.0 {
            return Duration::ZERO;
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed = now.saturating_duration_since(s.1).as_secs_f64();
        s.0 = (s.0 + elapsed * self.qps).min(self.burst);
        s.1 = now;
        s.0 -= 1.0;
        if s.0 >= 0.0 {
            Duration::ZERO
        } else {
            // A qps so small that the wait does not fit a Duration (1e-30) waits for ever,
            // as asked, instead of panicking.
            Duration::try_from_secs_f64(-s.0 / self.qps).unwrap_or(Duration::MAX)
        }
    }
}

/// The layer: wraps kube's HTTP service.
#[derive(Clone)]
pub struct ApiClientLayer {
    pub metrics: ClientMetrics,
    pub limiter: Arc<TokenBucket>,
    /// `host:port` of the API server, as client-go labels it.
    pub host: String,
}

impl<S> tower::Layer<S> for ApiClientLayer {
    type Service = ApiClientService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ApiClientService {
            inner,
            layer: self.clone(),
        }
    }
}

pub struct ApiClientService<S> {
    inner: S,
    layer: ApiClientLayer,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> tower::Service<Request<B>> for ApiClientService<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let method = req.method().as_str().to_string();
        let layer = self.layer.clone();
        // The inner future does its work when polled, so the wait below delays the request.
        let fut = self.inner.call(req);
        Box::pin(async move {
            let wait = layer.limiter.reserve(Instant::now());
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            let started = Instant::now();
            let result = fut.await;
            let code = match &result {
                Ok(resp) => resp.status().as_u16().to_string(),
                Err(_) => "<error>".to_string(),
            };
            layer
                .metrics
                .requests
                .with_label_values(&[code.as_str(), layer.host.as_str(), method.as_str()])
                .inc();
            layer
                .metrics
                .duration
                .with_label_values(&[layer.host.as_str(), method.as_str()])
                .observe(started.elapsed().as_secs_f64());
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_a_burst_then_paces_at_qps() {
        let b = TokenBucket::new(5.0, 10);
        let t0 = Instant::now();
        for _ in 0..10 {
            assert_eq!(b.reserve(t0), Duration::ZERO);
        }
        let wait = b.reserve(t0);
        assert!((wait.as_secs_f64() - 0.2).abs() < 1e-6, "{wait:?}");
        // A second later five more tokens have come (one was taken on credit).
        let later = t0 + Duration::from_secs(1);
        let mut free = 0;
        while b.reserve(later).is_zero() {
            free += 1;
        }
        assert_eq!(free, 4);
        // Zero is client-go's default (5 a second, 10 saved); only a negative qps is no limit.
        let d = TokenBucket::new(0.0, 0);
        assert!((0..10).all(|_| d.reserve(t0).is_zero()));
        assert!(!d.reserve(t0).is_zero());
        let unlimited = TokenBucket::new(-1.0, 1);
        assert!((0..1000).all(|_| unlimited.reserve(t0).is_zero()));
    }
}
