//! A bound on the connections a pool of HTTP servers holds open. When the pool is full, a
//! new connection is not turned away: the quietest open one is closed to make room, so an
//! idle flood cannot lock out the kubelet's probe or a scrape, and the count never grows.

use super::activity::Activity;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// How long a new connection waits for the connection closed to make room for it. Closing
/// is a task waking up and dropping a socket; this only bounds a pathological case.
pub const MAKE_ROOM_WAIT: Duration = Duration::from_secs(1);

/// The connections of one or more servers, at most `capacity` of them at a time.
pub struct Pool {
    name: &'static str,
    capacity: usize,
    permits: Arc<Semaphore>,
    open: Mutex<BTreeMap<u64, Open>>,
    next_id: AtomicU64,
}

/// What the pool knows of an open connection.
struct Open {
    activity: Arc<Activity>,
    close: Arc<Notify>,
}

/// A place in the pool, held for as long as the connection is open.
pub struct Slot {
    pool: Arc<Pool>,
    id: u64,
    _permit: OwnedSemaphorePermit,
    pub activity: Arc<Activity>,
    /// Notified when the pool needs this connection's place.
    pub close: Arc<Notify>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.pool.lock().remove(&self.id);
    }
}

impl Pool {
    pub fn new(name: &'static str, capacity: usize) -> Arc<Pool> {
        Arc::new(Pool {
            name,
            capacity,
            permits: Arc::new(Semaphore::new(capacity)),
            open: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
        })
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Connections open now.
    #[cfg(test)]
    pub fn open(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Open>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a connection just accepted: a free one, else the place of the quietest
    /// connection, which is told to close (waiting at most [`MAKE_ROOM_WAIT`]). `None`
    /// when no place came free: the caller closes the new connection.
    pub async fn admit(self: &Arc<Self>) -> Option<Slot> {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Some(self.register(permit));
        }
        if let Some(victim) = self.make_room() {
            tracing::debug!(
                "{}: {} connections open; closing the quietest ({victim}) for a new one",
                self.name,
                self.capacity
            );
        }
        // Permits go to waiters in order, so the place freed is ours unless another
        // accept loop of this pool was already waiting; it made room too.
        let acquire = self.permits.clone().acquire_owned();
        match tokio::time::timeout(MAKE_ROOM_WAIT, acquire).await {
            Ok(Ok(permit)) => Some(self.register(permit)),
            Ok(Err(_)) | Err(_) => None,
        }
    }

    fn register(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Slot {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let activity = Arc::new(Activity::new(Instant::now()));
        let close = Arc::new(Notify::new());
        self.lock().insert(
            id,
            Open {
                activity: activity.clone(),
                close: close.clone(),
            },
        );
        Slot {
            pool: self.clone(),
            id,
            _permit: permit,
            activity,
            close,
        }
    }

    /// Tells the connection that moved a byte longest ago (the oldest on a tie) to close,
    /// and forgets it so that nobody else picks it too. Its place is free once its task
    /// drops it.
    fn make_room(&self) -> Option<u64> {
        let mut open = self.lock();
        let victim = quietest(open.iter().map(|(id, o)| (*id, o.activity.last())))?;
        if let Some(o) = open.remove(&victim) {
            // `notify_one` keeps the wake-up for a task not yet waiting.
            o.close.notify_one();
        }
        Some(victim)
    }
}

/// The id whose last activity is oldest; ids grow with age, so the lower wins a tie.
fn quietest(open: impl Iterator<Item = (u64, Instant)>) -> Option<u64> {
    open.min_by_key(|(id, last)| (*last, *id)).map(|(id, _)| id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quietest_goes_first_and_the_oldest_on_a_tie() {
        let t = Instant::now();
        let s = Duration::from_secs(1);
        assert_eq!(
            quietest([(1, t + s), (2, t), (3, t + s)].into_iter()),
            Some(2)
        );
        assert_eq!(quietest([(5, t), (4, t)].into_iter()), Some(4));
        assert_eq!(quietest(std::iter::empty()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_pool_closes_its_quietest_connection_for_a_new_one() {
        let pool = Pool::new("test", 3);
        let mut slots = Vec::new();
        for _ in 0..3 {
            slots.push(pool.admit().await.unwrap());
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert_eq!(pool.open(), 3);
        // The oldest just moved a byte: the second is now the quietest.
        slots[0].activity.touch(Instant::now());
        let second = slots.remove(1);
        let closing = tokio::spawn(async move {
            second.close.notified().await;
            drop(second);
        });
        let new = pool.admit().await.expect("room made");
        closing.await.unwrap();
        assert_eq!(pool.open(), 3);
        assert_eq!(pool.permits.available_permits(), 0);
        drop(new);
        assert_eq!(pool.open(), 2);
        assert_eq!(pool.permits.available_permits(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_does_not_close_in_time_costs_the_new_one_its_place() {
        let pool = Pool::new("test", 1);
        let stuck = pool.admit().await.unwrap();
        let start = Instant::now();
        assert!(pool.admit().await.is_none());
        assert_eq!(start.elapsed(), MAKE_ROOM_WAIT);
        // It was asked to close, and is no longer a candidate.
        assert_eq!(pool.open(), 0);
        tokio::time::timeout(Duration::ZERO, stuck.close.notified())
            .await
            .expect("notified");
        drop(stuck);
        assert!(pool.admit().await.is_some());
    }
}
