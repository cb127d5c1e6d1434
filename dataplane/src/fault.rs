//! Kernel refusals and netlink errors injected on purpose, for the tests that prove what the
//! agent does when a commit fails or a socket errs (health, metrics, retries) on a real
//! kernel that would otherwise accept it.
//!
//! `SWITCHYARD_FAULTS` names a file. While it exists, each of its lines `POINT ERRNO [TIMES]`
//! makes that point fail with that error, at most TIMES times in this process (a line's
//! count is kept by its text), or every time without TIMES. The points:
//! - `nf_tables-batch`: every nf_tables commit, before anything is sent, as if the kernel
//!   had refused it;
//! - `nf_tables-batch-last ENOENT`: a message the kernel itself refuses (deleting a table
//!   that does not exist) goes at the end of the batch, after all of ours: the real kernel
//!   then aborts the whole batch in the middle of its work;
//! - `LABEL:send`, `LABEL:receive`: a netlink socket's send or receive system call (LABEL
//!   as the socket names itself in errors: `nfnetlink`, `nfnetlink-notifications`,
//!   `ctnetlink`, `IPVS`);
//! - `iptables-restore:IPv4`, `iptables-restore:IPv6`: that family's `iptables-restore`,
//!   before it runs, as if it had exited with the error.
//!
//! The variable is read once, at the first check (the tests set it before anything runs):
//! looked up at every check, as it was, it cost the agent 1.3% of its CPU under 100 endpoint
//! changes a second (perf, `agent_e2e` at 10k; a sync checks at each netlink send and receive).

use std::collections::HashMap;
use std::io::ErrorKind;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

/// The errno names a fault file may use.
fn errno(name: &str) -> Option<i32> {
    Some(match name {
        "EPERM" => 1,
        "ENOENT" => 2,
        "EINTR" => 4,
        "ENOMEM" => 12,
        "EBUSY" => 16,
        "EINVAL" => 22,
        "ENOBUFS" => 105,
        _ => return None,
    })
}

/// How often each counted line has fired, by its text.
static FIRED: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);

/// Whether `SWITCHYARD_FAULTS` was set at the first check: not yet read, unset, set.
static ARMED: AtomicU8 = AtomicU8::new(UNREAD);
const UNREAD: u8 = 0;
const UNSET: u8 = 1;
const SET: u8 = 2;

/// Whether faults may be injected at all: false unless `SWITCHYARD_FAULTS` was set.
pub fn armed() -> bool {
    match ARMED.load(Ordering::Relaxed) {
        UNSET => false,
        SET => true,
        _ => {
            let set = std::env::var_os("SWITCHYARD_FAULTS").is_some();
            ARMED.store(if set { SET } else { UNSET }, Ordering::Relaxed);
            set
        }
    }
}

/// The errno injected at `point` now, if any; a counted line's use is booked here.
pub fn injected(point: &str) -> Option<i32> {
    if !armed() {
        return None;
    }
    let path = std::env::var_os("SWITCHYARD_FAULTS")?;
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!("SWITCHYARD_FAULTS {}: {e}", path.to_string_lossy());
            return None;
        }
    };
    let fired = text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next()? == point).then_some(())?;
        let errno = errno(words.next()?)?;
        let Some(times) = words.next() else {
            return Some(errno);
        };
        let times: u64 = times.parse().ok()?;
        let mut fired = FIRED.lock().unwrap_or_else(|p| p.into_inner());
        let count = fired
            .get_or_insert_with(HashMap::new)
            .entry(line.trim().to_string())
            .or_insert(0);
        (*count < times).then(|| {
            *count += 1;
            errno
        })
    });
    if let Some(errno) = fired {
        // What the tests look for to know that the fault was met.
        tracing::warn!(
            "SWITCHYARD_FAULTS: {point} fails: {}",
            std::io::Error::from_raw_os_error(errno)
        );
    }
    fired
}

/// [`injected`] at the point `point()` names, built only when faults are armed.
pub fn injected_at(point: impl FnOnce() -> String) -> Option<i32> {
    if !armed() {
        return None;
    }
    injected(&point())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_hold_while_their_file_exists_and_counted_ones_run_out() {
        let file = std::env::temp_dir().join(format!("sy-faults-{}", std::process::id()));
        // nextest runs each test in a process of its own: the variable is this test's.
        std::env::set_var("SWITCHYARD_FAULTS", &file);
        ARMED.store(UNREAD, Ordering::Relaxed);
        assert_eq!(injected("nf_tables-batch"), None, "no file, no fault");
        std::fs::write(
            &file,
            "other EPERM\nnf_tables-batch ENOBUFS\nnfnetlink:receive EINTR 2\nbad EWHAT\n",
        )
        .unwrap();
        assert_eq!(injected("nf_tables-batch"), Some(105));
        assert_eq!(
            injected("nf_tables-batch"),
            Some(105),
            "uncounted: every time"
        );
        assert_eq!(injected("ipvs"), None);
        assert_eq!(injected("bad"), None, "an unknown errno injects nothing");
        assert_eq!(injected_at(|| "nfnetlink:receive".into()), Some(4));
        assert_eq!(injected("nfnetlink:receive"), Some(4));
        assert_eq!(injected("nfnetlink:receive"), None, "counted: twice only");
        std::fs::remove_file(&file).unwrap();
        assert_eq!(injected("nf_tables-batch"), None);
        std::env::remove_var("SWITCHYARD_FAULTS");
        assert!(armed(), "read once: still armed");
        ARMED.store(UNREAD, Ordering::Relaxed);
        assert!(!armed());
        assert_eq!(injected_at(|| unreachable!("not built when unarmed")), None);
    }
}
