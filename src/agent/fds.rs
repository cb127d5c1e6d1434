//! The open-files limit: raised to the hard limit at start, and shared out so that
//! connections accepted by the HTTP servers can never take the descriptors a sync needs.

use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};

/// Descriptors kept back for the sync path (netlink sockets, the pipes of `nft` and
/// `iptables-restore`, manifest files, API client connections, the listeners themselves),
/// at most half the limit.
pub const RESERVE: u64 = 256;
/// How many pools of HTTP connections share the budget: metrics, healthz, and the
/// health-check node ports (all of them together).
pub const POOLS: u64 = 3;
/// The most connections one pool holds, however high the limit: no scraper or probe needs
/// more, and each one costs memory.
pub const POOL_MAX: usize = 512;
/// The fewest, however low the limit: a probe must still get through.
pub const POOL_MIN: usize = 4;

/// Where the kernel caps a hard limit of "unlimited".
const NR_OPEN: &str = "/proc/sys/fs/nr_open";

#[derive(Debug, thiserror::Error)]
pub enum FdError {
    #[error("cannot read the open-files limit: {0}")]
    Get(nix::Error),
    #[error("cannot raise the open-files limit from {from} to {to}: {source}")]
    Raise {
        from: u64,
        to: u64,
        source: nix::Error,
    },
}

/// The open-files limit after [`raise`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoFile {
    pub soft: u64,
    pub hard: u64,
    /// The soft limit the process started with.
    pub was: u64,
}

/// Raises the soft open-files limit to the hard one. Child processes (`nft`,
/// `iptables-restore`) inherit it; none of them use `select`, the one reason to keep a
/// soft limit of 1024.
pub fn raise() -> Result<NoFile, FdError> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(FdError::Get)?;
    let nr_open = std::fs::read_to_string(NR_OPEN)
        .ok()
        .and_then(|s| s.trim().parse().ok());
    let to = target(soft, hard, nr_open);
    if to != soft {
        setrlimit(Resource::RLIMIT_NOFILE, to, hard).map_err(|source| FdError::Raise {
            from: soft,
            to,
            source,
        })?;
    }
    Ok(NoFile {
        soft: to,
        hard,
        was: soft,
    })
}

/// The soft limit to ask for: the hard one, or the kernel's `nr_open` when the hard one is
/// unlimited (asking for "unlimited" fails). Never lower than what we have.
pub fn target(soft: u64, hard: u64, nr_open: Option<u64>) -> u64 {
    let ceiling = if hard == RLIM_INFINITY {
        nr_open.unwrap_or(soft)
    } else {
        hard
    };
    soft.max(ceiling)
}

/// How many connections each pool may hold under a soft limit of `soft`: half of what is
/// left after the reserve, split between the pools, so that even with every pool full a
/// sync has the reserve and as much again.
pub fn per_pool(soft: u64) -> usize {
    let reserve = RESERVE.min(soft / 2);
    let accepted = soft.saturating_sub(reserve) / 2;
    usize::try_from(accepted / POOLS)
        .unwrap_or(POOL_MAX)
        .clamp(POOL_MIN, POOL_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raises_to_the_hard_limit_or_nr_open() {
        assert_eq!(target(1024, 524_288, Some(1_048_576)), 524_288);
        assert_eq!(target(1024, RLIM_INFINITY, Some(1_048_576)), 1_048_576);
        assert_eq!(target(1024, RLIM_INFINITY, None), 1024);
        assert_eq!(target(256, 256, None), 256);
        // An unlimited soft limit (only possible with an unlimited hard one) stays.
        assert_eq!(
            target(RLIM_INFINITY, RLIM_INFINITY, Some(1_048_576)),
            RLIM_INFINITY
        );
    }

    #[test]
    fn pools_leave_the_reserve_and_as_much_again() {
        // The limit of the measured flood: 1,100 idle connections took every descriptor.
        assert_eq!(per_pool(1024), 128);
        assert_eq!(per_pool(256), 21);
        assert_eq!(per_pool(524_288), POOL_MAX);
        assert_eq!(per_pool(RLIM_INFINITY), POOL_MAX);
        assert_eq!(per_pool(16), POOL_MIN);
        assert_eq!(per_pool(0), POOL_MIN);
        for soft in [64, 256, 1024, 2048, 4096] {
            let all = per_pool(soft) as u64 * POOLS;
            assert!(
                soft - all >= RESERVE.min(soft / 2) + all,
                "{soft}: {all} accepted"
            );
        }
    }
}
