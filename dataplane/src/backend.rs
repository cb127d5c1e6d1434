//! The backend interface every dataplane mode implements, and what a sync reports.

use crate::iptables::exec::IptablesError;
use crate::model::IpFamily;
use crate::nft::exec::NftError;
use crate::nft::transaction::TxStats;
use std::collections::BTreeSet;
use std::time::Duration;

/// Errors of a backend sync.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Nft(#[from] NftError),
    #[error(transparent)]
    Iptables(#[from] IptablesError),
    #[error(transparent)]
    Ipvs(#[from] crate::ipvs::kernel::IpvsError),
}

impl BackendError {
    /// A short, stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            BackendError::Nft(NftError::Rejected { .. } | NftError::Family { .. }) => "rejected",
            BackendError::Nft(NftError::Spawn { .. }) => "spawn",
            BackendError::Nft(_) => "read",
            BackendError::Iptables(IptablesError::Rejected { .. } | IptablesError::Fake(_)) => {
                "rejected"
            }
            BackendError::Iptables(IptablesError::Spawn { .. }) => "spawn",
            BackendError::Iptables(IptablesError::Sysctl(_)) => "sysctl",
            BackendError::Iptables(_) => "read",
            BackendError::Ipvs(e) => e.reason(),
        }
    }

    /// The one IP family a failure is known to concern; `None` when it may concern both
    /// (kube-proxy counts failures per family, in its per-family proxiers).
    pub fn family(&self) -> Option<IpFamily> {
        match self {
            BackendError::Nft(NftError::Family { family, .. }) => Some(*family),
            // Each family has its own restore program; the error names the one that failed.
            BackendError::Iptables(
                IptablesError::Spawn { program, .. }
                | IptablesError::Rejected { program, .. }
                | IptablesError::Save { program, .. }
                | IptablesError::Parse { program, .. },
            ) => Some(if program.starts_with("ip6") {
                IpFamily::V6
            } else {
                IpFamily::V4
            }),
            BackendError::Iptables(IptablesError::Sysctl(_)) => Some(IpFamily::V4),
            _ => None,
        }
    }
}

/// What one sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub full: bool,
    /// A full sync found the kernel no longer holding what the previous sync committed
    /// (someone deleted a table, chain or elements) and repaired it.
    pub drift: bool,
    pub stats: TxStats,
    pub duration: Duration,
    /// Front ends left out because another service holds them.
    pub conflicts: Vec<String>,
    pub no_local_endpoints: crate::nft::layout::NoLocalByFamily,
    pub services: usize,
    pub endpoints: usize,
}

impl SyncReport {
    /// One human line: what changed and how long it took.
    pub fn summary(&self) -> String {
        let s = &self.stats;
        let what = if s.operations() == 0 {
            "no changes".to_string()
        } else {
            let mut parts = Vec::new();
            if s.tables_deleted > 0 {
                parts.push(format!("{} tables replaced", s.tables_deleted));
            }
            if s.chains_written > 0 {
                parts.push(format!(
                    "{} chains written ({} rules)",
                    s.chains_written, s.rules_written
                ));
            }
            if s.chains_deleted > 0 {
                parts.push(format!("{} chains deleted", s.chains_deleted));
            }
            parts.push(format!(
                "+{} -{} elements",
                s.elements_added, s.elements_deleted
            ));
            parts.join(", ")
        };
        format!(
            "{} sync: {} service ports, {} endpoints; {what}; {:.1} ms",
            if self.full { "full" } else { "partial" },
            self.services,
            self.endpoints,
            self.duration.as_secs_f64() * 1000.0
        )
    }
}

/// (namespace, name) of a Service.
pub type ServiceKey = (String, String);

/// How much of the kernel state a sync brings up to date.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// Re-read the kernel and repair whatever differs from the layout (someone's edits or
    /// deletions): nftables mode rewrites every chain, iptables mode every chain whose
    /// rules differ from what iptables-save shows.
    Full,
    /// Lay out every service again, against what the last sync committed.
    All,
    /// Only these services changed since the last sync (their ports, their endpoints or
    /// both); everything else stays as the last sync left it. A backend may widen this.
    Services(&'a BTreeSet<ServiceKey>),
}

impl Scope<'_> {
    pub fn is_full(&self) -> bool {
        matches!(self, Scope::Full)
    }
}

/// A dataplane mode.
pub trait Backend {
    /// Bring the kernel to `snapshot`, within `scope`.
    fn sync(
        &mut self,
        snapshot: &crate::model::Snapshot,
        scope: Scope<'_>,
    ) -> Result<SyncReport, BackendError>;
    /// Remove everything this backend installed; returns how many tables went away.
    fn cleanup(&mut self) -> Result<usize, BackendError>;
}
