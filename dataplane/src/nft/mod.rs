//! The nftables backend: layout (pure), diff into a transaction (pure), and `nft` execution.

pub mod exec;
pub mod layout;
pub mod listing;
pub mod state;
pub mod transaction;

use crate::backend::{Backend, BackendError, SyncReport};
use crate::model::Snapshot;
use exec::NftExecutor;
use state::Ruleset;
use std::time::Instant;

/// Programs Switchyard's `ip`/`ip6 switchyard` tables through an [`NftExecutor`].
#[derive(Debug)]
pub struct NftBackend<E: NftExecutor> {
    exec: E,
    /// What the last successful sync committed; `None` forces a read of the kernel.
    applied: Option<Ruleset>,
}

impl<E: NftExecutor> NftBackend<E> {
    pub fn new(exec: E) -> Self {
        NftBackend {
            exec,
            applied: None,
        }
    }

    pub fn executor(&self) -> &E {
        &self.exec
    }

    /// The transaction that would program `snapshot` into an empty kernel.
    pub fn render(snapshot: &Snapshot) -> transaction::Transaction {
        let empty = Ruleset::default();
        let (desired, _) = layout::desired(snapshot, &empty);
        transaction::diff(&empty, &desired, false)
    }
}

impl<E: NftExecutor> Backend for NftBackend<E> {
    fn sync(&mut self, snapshot: &Snapshot, full: bool) -> Result<SyncReport, BackendError> {
        let started = Instant::now();
        let mut drift = false;
        let current = match (full, self.applied.take()) {
            (false, Some(applied)) => applied,
            (true, Some(applied)) => {
                let kernel = self.exec.read()?;
                drift = !transaction::diff(&kernel, &applied, false).is_empty();
                kernel
            }
            (_, None) => self.exec.read()?,
        };
        let (desired, layout) = layout::desired(snapshot, &current);
        let tx = transaction::diff(&current, &desired, full);
        if !tx.is_empty() {
            if let Err(e) = self.exec.apply(&tx) {
                // The kernel kept its previous state; the next sync must re-read it.
                self.applied = None;
                return Err(e.into());
            }
        }
        self.applied = Some(desired);
        Ok(SyncReport {
            full,
            drift,
            stats: tx.stats(),
            duration: started.elapsed(),
            conflicts: layout.conflicts,
            no_local_endpoints: layout.no_local_endpoints,
            services: snapshot.service_count(),
            endpoints: snapshot.endpoint_count(),
        })
    }

    fn cleanup(&mut self) -> Result<usize, BackendError> {
        let current = self.exec.read()?;
        let tx = transaction::diff(&current, &Ruleset::default(), false);
        let removed = current.tables.len();
        if !tx.is_empty() {
            self.exec.apply(&tx)?;
        }
        self.applied = None;
        Ok(removed)
    }
}

#[cfg(test)]
mod tests;
