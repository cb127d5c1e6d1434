//! Kernel refusals injected on purpose, for the tests that prove what the agent does when a
//! commit fails (health, metrics, retries) on a real kernel that would otherwise accept it.
//!
//! `SWITCHYARD_FAULTS` names a file. While it exists, each of its lines `POINT ERRNO`
//! (`nf_tables-batch EPERM`) makes every commit at that point fail, before anything is
//! sent, with the error the kernel would have answered. Unset (as in production), a check
//! costs one environment lookup.

use std::io::ErrorKind;

/// The errno names a fault file may use.
fn errno(name: &str) -> Option<i32> {
    Some(match name {
        "EPERM" => 1,
        "EINTR" => 4,
        "ENOENT" => 2,
        "ENOMEM" => 12,
        "EBUSY" => 16,
        "EINVAL" => 22,
        "ENOBUFS" => 105,
        _ => return None,
    })
}

/// The errno injected at `point` now, if any.
pub fn injected(point: &str) -> Option<i32> {
    let path = std::env::var_os("SWITCHYARD_FAULTS")?;
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!("SWITCHYARD_FAULTS {}: {e}", path.to_string_lossy());
            return None;
        }
    };
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next()? == point).then_some(())?;
        errno(words.next()?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_hold_while_their_file_exists() {
        let file = std::env::temp_dir().join(format!("sy-faults-{}", std::process::id()));
        // nextest runs each test in a process of its own: the variable is this test's.
        std::env::set_var("SWITCHYARD_FAULTS", &file);
        assert_eq!(injected("nf_tables-batch"), None, "no file, no fault");
        std::fs::write(&file, "other EPERM\nnf_tables-batch ENOBUFS\n").unwrap();
        assert_eq!(injected("nf_tables-batch"), Some(105));
        assert_eq!(injected("ipvs"), None);
        std::fs::remove_file(&file).unwrap();
        assert_eq!(injected("nf_tables-batch"), None);
        std::env::remove_var("SWITCHYARD_FAULTS");
    }
}
