//! Names shared: every endpoint on a node names it, so 100k endpoints over 50 nodes hold 50
//! node names, not 100k; every copy of a service port's name (in the snapshot, the store,
//! the changes, the nftables ownership index) shares one namespace, name and port name.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

struct Names {
    set: HashSet<Arc<str>>,
    /// The size at which names no endpoint holds any more are dropped: a cluster whose
    /// nodes come and go does not grow this for ever.
    prune_at: usize,
}

static NAMES: Mutex<Option<Names>> = Mutex::new(None);

/// The one shared copy of `name`.
pub fn intern(name: &str) -> Arc<str> {
    let mut guard = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    let names = guard.get_or_insert_with(|| Names {
        set: HashSet::new(),
        prune_at: 1024,
    });
    if let Some(shared) = names.set.get(name) {
        return shared.clone();
    }
    if names.set.len() >= names.prune_at {
        names.set.retain(|n| Arc::strong_count(n) > 1);
        names.prune_at = (names.set.len() * 2).max(1024);
    }
    let shared: Arc<str> = Arc::from(name);
    names.set.insert(shared.clone());
    shared
}

#[cfg(test)]
mod tests {
    use super::intern;
    use std::sync::Arc;

    #[test]
    fn one_copy_per_name_and_unused_names_go() {
        let a = intern("interned-test-node-a");
        let b = intern("interned-test-node-a");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(&*a, "interned-test-node-a");
        // Past the prune size, names nobody holds are dropped; held ones stay shared.
        for i in 0..3000 {
            intern(&format!("interned-test-gone-{i}"));
        }
        let c = intern("interned-test-node-a");
        assert!(Arc::ptr_eq(&a, &c));
        let guard = super::NAMES.lock().unwrap();
        assert!(guard.as_ref().unwrap().set.len() < 3000);
    }
}
