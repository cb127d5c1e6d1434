//! Every copy of every object among the manifest files, kept as the files are read, so that a
//! report works out which copy is in effect for the objects of the files that changed only.

use super::{Id, Key, Known, Objects, Winner};
use crate::agent::store::Kind;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

/// The copies of each object in path and then document order (the last one is in effect), and
/// what was in effect at the last report for each object changed since.
#[derive(Default)]
pub(super) struct Copies {
    by_id: BTreeMap<Id, Vec<Winner>>,
    changed: BTreeMap<Id, Option<Winner>>,
}

impl Copies {
    /// The copy in effect of `id`.
    pub(super) fn winner(&self, id: &Id) -> Option<&Winner> {
        self.by_id.get(id).and_then(|v| v.last())
    }

    /// Every object's copy in effect.
    #[cfg(test)]
    pub(super) fn winners(&self) -> impl Iterator<Item = (&Id, &Winner)> {
        self.by_id
            .iter()
            .filter_map(|(id, v)| Some((id, v.last()?)))
    }

    /// The copy of `id` that was in effect at the last report, which the store holds.
    pub(super) fn in_store(&self, id: &Id) -> Option<&Winner> {
        match self.changed.get(id) {
            Some(before) => before.as_ref(),
            None => self.winner(id),
        }
    }

    /// Notes what was in effect for `id` before its first change since the last report.
    fn touch(&mut self, id: &Id) {
        if !self.changed.contains_key(id) {
            let before = self.winner(id).cloned();
            self.changed.insert(id.clone(), before);
        }
    }

    /// The objects of the file at `path`, just read.
    pub(super) fn add(&mut self, path: &Arc<Path>, objects: &Objects) {
        for (index, known) in objects.known.iter().enumerate() {
            let id = known.id();
            self.touch(&id);
            let Known { kind, key, print } = known.clone();
            let copy = Winner {
                path: path.clone(),
                index,
                kind,
                key,
                print,
            };
            let copies = self.by_id.entry(id).or_default();
            let at = copies.partition_point(|c| (&*c.path, c.index) < (&**path, index));
            copies.insert(at, copy);
        }
    }

    /// The objects the file at `path` held, before it went or was read again.
    pub(super) fn remove(&mut self, path: &Path, objects: &Objects) {
        for known in &objects.known {
            let id = known.id();
            self.touch(&id);
            if let Some(copies) = self.by_id.get_mut(&id) {
                copies.retain(|c| &*c.path != path);
                if copies.is_empty() {
                    self.by_id.remove(&id);
                }
            }
        }
    }

    /// The keys of the copies not in effect that differ from their object's copy in effect
    /// (a namespace left out in one and written as `default` in the other), each once.
    pub(super) fn shadowed(&self) -> BTreeSet<(Kind, Key)> {
        let mut out = BTreeSet::new();
        for copies in self.by_id.values() {
            let Some((winner, earlier)) = copies.split_last() else {
                continue;
            };
            for c in earlier.iter().filter(|c| c.key != winner.key) {
                out.insert((c.kind, c.key.clone()));
            }
        }
        out
    }

    /// The objects changed since the last report, with the copy that was in effect then.
    pub(super) fn changed(&self) -> &BTreeMap<Id, Option<Winner>> {
        &self.changed
    }

    /// Ends a report: what is in effect now has been reported.
    pub(super) fn reported(&mut self) -> BTreeMap<Id, Option<Winner>> {
        std::mem::take(&mut self.changed)
    }

    /// The warnings about the changed objects defined more than once, each later copy
    /// against the one before it (as [`crate::manifests::Manifests::push`] words them). An
    /// object whose files did not change is not warned about again.
    pub(super) fn twice(&self) -> Vec<String> {
        let mut out = Vec::new();
        for id in self.changed.keys() {
            let Some(copies) = self.by_id.get(id) else {
                continue;
            };
            for pair in copies.windows(2) {
                let (kind, ns, name) = id;
                out.push(crate::manifests::defined_twice(
                    &(*kind, ns.to_string(), name.to_string()),
                    &crate::manifests::place(&pair[0].path, pair[0].index),
                    &crate::manifests::place(&pair[1].path, pair[1].index),
                ));
            }
        }
        out
    }
}
