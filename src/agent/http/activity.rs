//! When a connection last moved a byte: a stream wrapper that records it, and the idle
//! timeout that closes a connection on which nothing has moved for too long.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// The time of a connection's last read or write, shared between its stream, its idle
/// timeout and the pool that picks whom to close when full.
#[derive(Debug)]
pub struct Activity {
    since: Instant,
    /// Milliseconds after `since`; atomic because the pool reads it from other tasks.
    last_ms: AtomicU64,
}

impl Activity {
    pub fn new(now: Instant) -> Activity {
        Activity {
            since: now,
            last_ms: AtomicU64::new(0),
        }
    }

    pub fn touch(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.since).as_millis();
        self.last_ms
            .store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub fn last(&self) -> Instant {
        self.since + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// Returns once nothing has moved for `idle`. hyper's header-read timeout covers a
/// connection waiting for a request; this covers the rest (a client that stops reading
/// its answer, or stops sending a body).
pub async fn quiet_for(activity: &Activity, idle: Duration) {
    loop {
        let deadline = activity.last() + idle;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

/// A stream that touches its [`Activity`] whenever bytes move.
pub struct Watched<S> {
    inner: S,
    activity: std::sync::Arc<Activity>,
}

impl<S> Watched<S> {
    pub fn new(inner: S, activity: std::sync::Arc<Activity>) -> Watched<S> {
        Watched { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch(Instant::now());
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch(Instant::now());
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch(Instant::now());
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn idle_counts_from_the_last_byte() {
        let a = Activity::new(Instant::now());
        tokio::time::advance(Duration::from_secs(5)).await;
        a.touch(Instant::now());
        let start = Instant::now();
        quiet_for(&a, Duration::from_secs(10)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_either_way_are_activity() {
        let (client, server) = tokio::io::duplex(64);
        let a = Arc::new(Activity::new(Instant::now()));
        let mut w = Watched::new(server, a.clone());
        let mut client = client;
        tokio::time::advance(Duration::from_secs(3)).await;
        client.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        w.read_exact(&mut b).await.unwrap();
        assert_eq!(a.last(), Instant::now());
        tokio::time::advance(Duration::from_secs(2)).await;
        w.write_all(b"y").await.unwrap();
        assert_eq!(a.last(), Instant::now());
        // A read that finds the end of the stream moves nothing.
        drop(client);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(w.read(&mut b).await.unwrap(), 0);
        assert_eq!(Instant::now() - a.last(), Duration::from_secs(2));
    }
}
