//! A list's items worked on in chunks by this thread and a helper, each taking the next
//! chunk when it is free, the results taken in the list's order: how both readers decode a
//! large list on two cores.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many chunks this thread holds worked ahead of the one it waits for; past it, it waits.
const AHEAD: usize = 4;

/// `work` on each chunk of `chunks` once, by whichever thread is free, and `take` on the
/// results in the chunks' order, on this thread, until `take` returns an error. `work` says
/// whether its chunk failed: the helper takes no chunk after one that did. If the helper
/// cannot start, this thread works every chunk; if it panics, the panic is raised here once
/// this thread is done.
///
/// `take` hands on what the sync needs (on this thread, the one that owns the sink), so
/// this thread also takes chunks whenever the next one in order is not ready: with chunks
/// dealt out in fixed turns instead, a 100k-service YAML dump kept the two uneven (perf of
/// one `sync --once`: the helper 2.0 s of CPU, this thread 8.1 s, 3.4 s of them the sync).
pub(super) fn in_order<C, X, E>(
    chunks: &[C],
    work: impl Fn(&C) -> (X, bool) + Sync,
    mut take: impl FnMut(X) -> Result<(), E>,
) -> Result<(), E>
where
    C: Sync,
    X: Send,
{
    if chunks.len() <= 1 {
        return chunks.iter().try_for_each(|c| take(work(c).0));
    }
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<(usize, X)>(2);
        let (work, next) = (&work, &next);
        // A helper that cannot start leaves every chunk to this thread.
        let _ = std::thread::Builder::new()
            .name("manifest-items".into())
            // The stack of the manifest thread that reads files (`file_source::spawn`):
            // whatever an item's nesting takes there, it takes here too.
            .stack_size(8 << 20)
            .spawn_scoped(scope, move || loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(chunk) = chunks.get(k) else {
                    return;
                };
                let (done, failed) = work(chunk);
                // The receiver is gone once this thread's work is no longer wanted.
                if tx.send((k, done)).is_err() || failed {
                    return;
                }
            });
        let mut ready = BTreeMap::new();
        for k in 0..chunks.len() {
            let done = loop {
                if let Some(done) = ready.remove(&k) {
                    break done;
                }
                // Only while chunk `k` is missing: the helper's results come in order, so
                // this holds none but `k`, and the channel holds the helper back.
                if let Ok((j, done)) = rx.try_recv() {
                    ready.insert(j, done);
                    continue;
                }
                if ready.len() < AHEAD {
                    let j = next.fetch_add(1, Ordering::Relaxed);
                    if let Some(chunk) = chunks.get(j) {
                        ready.insert(j, work(chunk).0);
                        continue;
                    }
                }
                match rx.recv() {
                    Ok((j, done)) => {
                        ready.insert(j, done);
                    }
                    // The helper stopped before chunk `k`: it panicked, and the scope
                    // raises that once it ends. Work it here rather than wait for nothing.
                    Err(_) => break work(&chunks[k]).0,
                }
            };
            take(done)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks of numbers taken one by one until `fail_at`.
    fn order(chunks: &[Vec<u32>], fail_at: Option<u32>) -> (Vec<u32>, Result<(), u32>) {
        let mut seen = Vec::new();
        let result = in_order(
            chunks,
            |c: &Vec<u32>| {
                let failed = fail_at.is_some_and(|f| c.contains(&f));
                (c.clone(), failed)
            },
            |c| {
                for n in c {
                    if Some(n) == fail_at {
                        return Err(n);
                    }
                    seen.push(n);
                }
                Ok(())
            },
        );
        (seen, result)
    }

    #[test]
    fn chunks_are_taken_in_order_whoever_worked_them() {
        let chunks: Vec<Vec<u32>> = (0..300).map(|k| vec![2 * k, 2 * k + 1]).collect();
        let (seen, result) = order(&chunks, None);
        assert_eq!(result, Ok(()));
        assert_eq!(seen, (0..600).collect::<Vec<_>>());
        let (seen, result) = order(&chunks[..1], None);
        assert_eq!((seen, result), (vec![0, 1], Ok(())));
        assert_eq!(order(&[], None), (vec![], Ok(())));
    }

    #[test]
    fn the_first_error_stops_them_with_what_came_before_it_taken() {
        let chunks: Vec<Vec<u32>> = (0..300).map(|k| vec![2 * k, 2 * k + 1]).collect();
        for fail in [0, 7, 8, 301, 599] {
            let (seen, result) = order(&chunks, Some(fail));
            assert_eq!(result, Err(fail));
            assert_eq!(seen, (0..fail).collect::<Vec<_>>());
        }
    }

    /// However slow `take` is, the chunks worked and not yet taken stay few: the helper's in
    /// the channel and at hand, and this thread's held ahead.
    #[test]
    fn a_slow_taker_holds_the_workers_back() {
        use std::sync::atomic::AtomicUsize;
        let chunks: Vec<u32> = (0..200).collect();
        let (outstanding, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let result: Result<(), ()> = in_order(
            &chunks,
            |&c| {
                let now = outstanding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                (c, false)
            },
            |_| {
                std::thread::sleep(std::time::Duration::from_micros(300));
                outstanding.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            },
        );
        assert_eq!(result, Ok(()));
        let most = most.load(Ordering::SeqCst);
        // Two in the channel, one being sent, and what this thread holds.
        assert!(most <= AHEAD + 4, "{most} chunks worked and not taken");
    }

    /// Both threads work chunks when the work is slow enough for the helper to start.
    #[test]
    fn the_helper_works_chunks_too() {
        let chunks: Vec<u32> = (0..100).collect();
        let main = std::thread::current().id();
        let (mut by_helper, mut taken) = (0, 0);
        let result: Result<(), ()> = in_order(
            &chunks,
            |&c| {
                std::thread::sleep(std::time::Duration::from_millis(2));
                ((c, std::thread::current().id() != main), false)
            },
            |(c, helped)| {
                assert_eq!(c, taken, "in order");
                taken += 1;
                by_helper += usize::from(helped);
                Ok(())
            },
        );
        assert_eq!((result, taken), (Ok(()), 100));
        assert!(
            (1..=99).contains(&by_helper),
            "{by_helper} of 100 by the helper"
        );
    }
}
