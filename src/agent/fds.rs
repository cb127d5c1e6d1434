//! The open-files limit, raised to the hard limit at start: a busy node's sockets, pipes and
//! files must not run into a soft limit of 1024 that the hard limit does not impose.

use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};

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
}
