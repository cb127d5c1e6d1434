//! Manifest files as a source. A dedicated thread looks at the path every [`POLL`]: it lists
//! the files (recursively, without reading them) and stamps each one (inode, size, times); only
//! a file whose stamp changed, or a new one, is read and parsed again, and the other files'
//! objects come from the last read. The first read streams each kind's complete set, each
//! object as it is decoded (the agent converts it and drops it); after
//! that, when anything changed and every file parses, only the difference is reported: the
//! objects whose copy in effect is new or was decoded from other text than the store's copy
//! (each object's [`Print`]), and the deletions of what is no longer defined anywhere. So one
//! edited file costs its own parse and the store's work on the objects that changed in it:
//! which copy of each object is in effect is kept as files are read ([`copies`]), a report
//! looks only at the objects of the files that changed, and an object read again unchanged is
//! dropped as soon as it is decoded. A file
//! that fails to parse is reported once and the previous
//! objects stay in effect; it is read again only when its stamp changes. A file that could not
//! be read at all (permissions, I/O) is retried with exponential backoff up to [`MAX_BACKOFF`].
//! The agent's loop never waits for a file: a hung read holds only this thread.

use super::store::{self, Arrival, Kind, ObjectKey, SourceEvent};
use crate::manifests::{self, ManifestError, Object, Print, Stamp};
use dataplane::interned::intern;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How often the path is looked at: edits are picked up well within a second.
pub const POLL: Duration = Duration::from_millis(200);

/// The longest wait before a file that could not be read is tried again with an unchanged
/// stamp.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// One file as last read: the stamp of the version read and its objects, or why it failed.
struct Entry {
    /// Its path, shared by the winners it holds.
    path: Arc<Path>,
    stamp: Stamp,
    /// The path named on the command line (see [`manifests::Found`]).
    named: bool,
    parsed: Result<Objects, ManifestError>,
}

/// (kind, namespace, name) of an object among the files, as [`manifests::identity`] gives
/// it, in interned names: shared with the store's names and between the watcher's own
/// records (at 10k services the watcher's strings were 8 MB, heaptrack).
type Id = (&'static str, Arc<str>, Arc<str>);

/// The store's key of an object, in interned names.
type Key = (Arc<str>, Arc<str>);

/// What identifies an object once the store has it: the kind and key the store knows it by,
/// from which its identity among the files follows ([`Known::id`]), and the print of the
/// text it was decoded from.
#[derive(Debug, Clone, PartialEq)]
struct Known {
    kind: Kind,
    key: Key,
    print: Print,
}

impl Known {
    fn of(o: &Object, print: Print) -> Known {
        let (ns, name) = store::object_key(o);
        Known {
            kind: store::kind_of(o),
            key: (intern(&ns), intern(&name)),
            print,
        }
    }

    /// As [`manifests::identity`]: a namespaced object's absent or empty namespace is the
    /// default one, and a cluster-scoped object has none.
    fn id(&self) -> Id {
        let ns = match self.kind {
            Kind::Node | Kind::ServiceCidr => intern(""),
            Kind::Service | Kind::EndpointSlice if self.key.0.is_empty() => intern("default"),
            Kind::Service | Kind::EndpointSlice => self.key.0.clone(),
        };
        (self.kind.as_str(), ns, self.key.1.clone())
    }
}

fn owned_key(key: &Key) -> ObjectKey {
    (key.0.to_string(), key.1.to_string())
}

/// A file's objects: what identifies each, in file order, and the decoded objects not yet
/// reported that may have to be, by their place in the file. Once reported, the store has
/// them (10k services from files kept about 90 MB of whole objects here); and an object
/// read again with the text the store's copy was decoded from is not kept at all.
#[derive(Default)]
struct Objects {
    known: Vec<Known>,
    kept: BTreeMap<usize, Object>,
}

/// Where the copy of an object that is in effect was read: the file and the object's place
/// in it, with the kind and key the store knows it by and its print.
#[derive(Debug, Clone, PartialEq)]
struct Winner {
    path: Arc<Path>,
    index: usize,
    kind: Kind,
    key: Key,
    print: Print,
}

/// What the store holds of an object, as far as a copy's place in the files does not
/// matter: its kind and key, and the print of the text it was decoded from. Two copies with
/// the same content need not both be sent.
type Content<'a> = (Kind, &'a Key, Print);

impl Known {
    fn content(&self) -> Content<'_> {
        (self.kind, &self.key, self.print)
    }
}

impl Winner {
    fn content(&self) -> Content<'_> {
        (self.kind, &self.key, self.print)
    }
}

/// The manifest path's files as last read, and what has been reported about them.
pub struct Watcher {
    path: PathBuf,
    cap: u64,
    files: BTreeMap<PathBuf, Entry>,
    /// Why the last listing failed (the path is gone, a directory cannot be read, no files).
    listing: Option<ManifestError>,
    /// Skipped entries already warned about.
    skipped: BTreeSet<String>,
    /// The error last logged, so that a lasting one is logged once.
    reported: Option<String>,
    /// Something changed since the objects were last reported.
    pending: bool,
    /// When files that could not be read are tried again, and the wait after that.
    retry_at: Option<Instant>,
    backoff: Duration,
    /// Files read and parsed so far (for tests).
    reads: u64,
    /// Every copy of every object in the files read, and the objects changed since the
    /// last report.
    copies: Copies,
}

impl Watcher {
    fn new(path: PathBuf, cap: u64) -> Watcher {
        Watcher {
            path,
            cap,
            files: BTreeMap::new(),
            listing: None,
            skipped: BTreeSet::new(),
            reported: None,
            pending: false,
            retry_at: None,
            backoff: POLL,
            reads: 0,
            copies: Copies::default(),
        }
    }

    /// List the path and read what changed. True if anything did.
    fn refresh(&mut self, now: Instant) -> bool {
        let listing = match manifests::list(&self.path) {
            Ok(l) => l,
            Err(e) => {
                self.listing = Some(e);
                return false;
            }
        };
        let mut changed = self.listing.take().is_some();
        let skipped: BTreeSet<String> = listing.skipped.into_iter().collect();
        for msg in skipped.difference(&self.skipped) {
            tracing::warn!("{msg}");
        }
        self.skipped = skipped;
        let retry = self.retry_at.is_none_or(|t| now >= t);
        let mut old = std::mem::take(&mut self.files);
        for found in listing.files {
            let prev = old.remove(&found.path);
            let keep = prev.as_ref().is_some_and(|e| {
                e.stamp == found.stamp
                    && !(retry && matches!(e.parsed, Err(ManifestError::Read { .. })))
            });
            let entry = match prev {
                Some(e) if keep => e,
                prev => {
                    changed = true;
                    self.reads += 1;
                    if let Some(Entry { parsed: Ok(o), .. }) = &prev {
                        self.copies.remove(&found.path, o);
                    }
                    let entry = match read_keeping(&found, self.cap, Some(&self.copies)) {
                        Ok((stamp, objects)) => Entry {
                            path: found.path.as_path().into(),
                            stamp,
                            named: found.named,
                            parsed: Ok(objects),
                        },
                        // The listing's stamp: the next poll reads again only if it changes.
                        Err(e) => Entry {
                            path: found.path.as_path().into(),
                            stamp: found.stamp,
                            named: found.named,
                            parsed: Err(e),
                        },
                    };
                    if let Ok(o) = &entry.parsed {
                        self.copies.add(&entry.path, o);
                    }
                    entry
                }
            };
            self.files.insert(found.path, entry);
        }
        changed |= !old.is_empty();
        for (path, gone) in old {
            if let Ok(o) = &gone.parsed {
                self.copies.remove(&path, o);
            }
        }
        let unreadable = self
            .files
            .values()
            .any(|e| matches!(e.parsed, Err(ManifestError::Read { .. })));
        if !unreadable {
            self.retry_at = None;
            self.backoff = POLL;
        } else if retry {
            self.retry_at = Some(now + self.backoff);
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        }
        changed
    }

    /// The first reason the objects cannot be taken as they are: the listing's, else the
    /// first failing file's in path order.
    fn error(&self) -> Option<&ManifestError> {
        self.listing
            .as_ref()
            .or_else(|| self.files.values().find_map(|e| e.parsed.as_ref().err()))
    }

    /// Whether the copy in effect `w` of an object must be sent: the object is new, or the
    /// copy in effect has another key or was decoded from other text than the copy that was
    /// in effect at the last report, `before` (wherever either was read).
    fn to_send(before: Option<&Winner>, w: &Winner) -> bool {
        before.is_none_or(|old| old.content() != w.content())
    }

    /// Files whose objects must be sent but were reported and not kept (the earlier copy of
    /// an object defined twice, in effect again): read them again, at most once per file and
    /// report. Then the warnings about the changed objects defined twice; `None` if one of
    /// those files fails now.
    fn read_back(&mut self) -> Option<Vec<String>> {
        let mut tried = BTreeSet::new();
        loop {
            let missing: BTreeSet<PathBuf> = self
                .copies
                .changed()
                .iter()
                .filter_map(|(id, before)| {
                    let w = self.copies.winner(id)?;
                    Self::to_send(before.as_ref(), w).then_some(w)
                })
                .filter(|w| {
                    matches!(
                        self.files.get(&*w.path).map(|e| &e.parsed),
                        Some(Ok(o)) if !o.kept.contains_key(&w.index)
                    )
                })
                .map(|w| w.path.to_path_buf())
                .filter(|p| !tried.contains(p))
                .collect();
            if missing.is_empty() {
                return Some(self.copies.twice());
            }
            for path in missing {
                let Some(entry) = self.files.get_mut(&path) else {
                    continue;
                };
                let found = manifests::Found {
                    path: path.clone(),
                    stamp: entry.stamp,
                    named: entry.named,
                };
                self.reads += 1;
                let read = read_keeping(&found, self.cap, None);
                if let Ok(o) = &entry.parsed {
                    self.copies.remove(&path, o);
                }
                match read {
                    Ok((stamp, objects)) => {
                        entry.stamp = stamp;
                        entry.parsed = Ok(objects);
                        if let Ok(o) = &entry.parsed {
                            self.copies.add(&entry.path, o);
                        }
                    }
                    Err(e) => {
                        entry.parsed = Err(e);
                        return None;
                    }
                }
                tried.insert(path);
            }
        }
    }

    /// The objects kept since the last report, moved out: the files keep only what
    /// identifies them, since the store is about to have the objects. A report took
    /// copies of the objects it sent and dropped the files' afterwards: two of every object
    /// of an edited file at its peak (`file_churn`, 100k services in one file: 2,172 MiB at
    /// the peak, 1,560 MiB with the objects moved).
    fn take_objects(&mut self) -> BTreeMap<Arc<Path>, BTreeMap<usize, Object>> {
        let mut taken = BTreeMap::new();
        for e in self.files.values_mut() {
            if let Ok(o) = &mut e.parsed {
                if !o.kept.is_empty() {
                    taken.insert(e.path.clone(), std::mem::take(&mut o.kept));
                }
            }
        }
        taken
    }

    /// The events that move the store from what was last reported to what the files hold
    /// now: the objects whose copy in effect is new or was decoded from other text (only the
    /// objects of the files read again are looked at), and deletions.
    fn difference(&mut self, twice: Vec<String>) -> Vec<SourceEvent> {
        for d in &twice {
            tracing::warn!("{d}");
        }
        let changed = self.copies.reported();
        let mut objects = self.take_objects();
        let mut events = Vec::new();
        for (id, before) in &changed {
            // Gone, or its copy in effect now carries another key (a namespace left out in
            // one copy and written as `default` in the other).
            let Some(w) = before else { continue };
            if self.copies.winner(id).is_none_or(|now| now.key != w.key) {
                events.push(SourceEvent::Delete(w.kind, owned_key(&w.key)));
            }
        }
        for (id, before) in &changed {
            let Some(w) = self.copies.winner(id) else {
                continue;
            };
            if !Self::to_send(before.as_ref(), w) {
                continue;
            }
            let object = objects
                .get_mut(&w.path)
                .and_then(|kept| kept.remove(&w.index));
            match object {
                Some(o) => events.push(SourceEvent::Apply(o)),
                // `read_back` read every such file; not reached.
                None => tracing::warn!(
                    "{}: object {} is in effect but was not kept; it is sent when its file next changes",
                    w.path.display(),
                    w.index + 1
                ),
            }
        }
        events
    }

    /// Logs the first reason the objects cannot be taken as they are, once while it lasts;
    /// true if there is one.
    fn blocked(&mut self) -> bool {
        let Some(e) = self.error() else {
            self.reported = None;
            return false;
        };
        let msg = e.to_string();
        if self.reported.as_ref() != Some(&msg) {
            tracing::error!("{msg}; the previous manifests stay in effect");
            self.reported = Some(msg);
        }
        true
    }

    /// Look at the path once: the events to send when something changed and everything
    /// parses.
    pub fn poll(&mut self, now: Instant) -> Option<Vec<SourceEvent>> {
        self.pending |= self.refresh(now);
        if self.blocked() || !self.pending {
            return None;
        }
        let Some(twice) = self.read_back() else {
            self.blocked();
            return None;
        };
        self.pending = false;
        let events = self.difference(twice);
        tracing::info!(
            "{}: manifests changed; {} objects to apply or delete",
            self.path.display(),
            events.len()
        );
        Some(events)
    }
}

/// Read the path once, handing the objects to `each` as they are decoded: the events of a
/// list of every kind (begun, each object, ended), in path and then document order, so that
/// an object defined twice ends as its copy read last. The agent fails to start if this
/// fails (`each` may have had part of the objects by then). The watcher holds what
/// identifies what was read, for [`spawn`].
///
/// When every object was decoded before the store converted any, the agent's peak reading
/// a JSON list of 100k Services and 100k EndpointSlices was 1,295 MiB; streamed, 564 MiB.
pub fn initial(path: &Path, each: &mut dyn FnMut(SourceEvent)) -> Result<Watcher, ManifestError> {
    let mut w = Watcher::new(path.to_path_buf(), manifests::MAX_FILE_BYTES);
    let listing = manifests::list(path)?;
    for msg in &listing.skipped {
        tracing::warn!("{msg}");
    }
    w.skipped = listing.skipped.into_iter().collect();
    for kind in Kind::ALL {
        each(SourceEvent::ListBegin(kind));
    }
    for found in listing.files {
        w.reads += 1;
        let mut known = Vec::new();
        let stamp = manifests::read_file_printed(&found, w.cap, &mut |o, print| {
            known.push(Known::of(&o, print));
            each(SourceEvent::Listed(o));
        })?;
        let path: Arc<Path> = found.path.as_path().into();
        let objects = Objects {
            known,
            kept: BTreeMap::new(),
        };
        w.copies.add(&path, &objects);
        let entry = Entry {
            path,
            stamp,
            named: found.named,
            parsed: Ok(objects),
        };
        w.files.insert(found.path, entry);
    }
    for d in w.copies.twice() {
        tracing::warn!("{d}");
    }
    // An earlier copy whose key differs from the copy in effect (one leaves the namespace
    // out, the other writes `default`) was listed under its own key: it goes.
    for (kind, key) in w.copies.shadowed() {
        each(SourceEvent::Delete(kind, owned_key(&key)));
    }
    for kind in Kind::ALL {
        each(SourceEvent::ListEnd(kind));
    }
    w.copies.reported();
    Ok(w)
}

/// Read one file, keeping only the objects `reported` does not show the store to hold
/// already (all of them without `reported`): an object whose copy in effect at the last
/// report has its key and was decoded from the same text is dropped as soon as it is
/// decoded. So an edit holds the objects it
/// changed, not its whole file: an edit of one object in a file of 100k Services and 100k
/// EndpointSlices peaked at 1,560 MiB keeping them all.
fn read_keeping(
    found: &manifests::Found,
    cap: u64,
    reported: Option<&Copies>,
) -> Result<(Stamp, Objects), ManifestError> {
    let mut objects = Objects::default();
    let stamp = manifests::read_file_printed(found, cap, &mut |o, print| {
        let known = Known::of(&o, print);
        let held = reported
            .and_then(|r| r.in_store(&known.id()))
            .is_some_and(|w| w.content() == known.content());
        if !held {
            objects.kept.insert(objects.known.len(), o);
        }
        objects.known.push(known);
    })?;
    Ok((stamp, objects))
}

/// Watch the path from [`initial`] on a thread of its own until the receiver goes away.
pub fn spawn(mut w: Watcher, tx: mpsc::Sender<Arrival>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("manifests".into())
        // The YAML parser recurses per nesting level (see `manifests::yaml_options`).
        .stack_size(8 << 20)
        .spawn(move || loop {
            std::thread::sleep(POLL);
            if tx.is_closed() {
                return;
            }
            for ev in w.poll(Instant::now()).unwrap_or_default() {
                if tx.blocking_send(Arrival::now(ev)).is_err() {
                    return;
                }
            }
        })
        .map(drop)
}

mod copies;
use copies::Copies;

#[cfg(test)]
mod tests;
