//! Manifest files as a source. A dedicated thread looks at the path every [`POLL`]: it lists
//! the files (recursively, without reading them) and stamps each one (inode, size, times); only
//! a file whose stamp changed, or a new one, is read and parsed again, and the other files'
//! objects come from the last read. When anything changed and every file parses, each kind's
//! complete set is reported. A file that fails to parse is reported once and the previous
//! objects stay in effect; it is read again only when its stamp changes. A file that could not
//! be read at all (permissions, I/O) is retried with exponential backoff up to [`MAX_BACKOFF`].
//! The agent's loop never waits for a file: a hung read holds only this thread.

use super::store::{Arrival, Kind, SourceEvent};
use crate::manifests::{self, ManifestError, Manifests, Object, Stamp};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How often the path is looked at: edits are picked up well within a second.
pub const POLL: Duration = Duration::from_millis(200);

/// The longest wait before a file that could not be read is tried again with an unchanged
/// stamp.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The events that replace every kind with what the manifests hold.
pub fn replace_all(m: Manifests) -> Vec<SourceEvent> {
    for d in &m.duplicates {
        tracing::warn!("{d}");
    }
    vec![
        SourceEvent::Replace(
            Kind::Service,
            m.services
                .into_iter()
                .map(|s| Object::Service(Box::new(s)))
                .collect(),
        ),
        SourceEvent::Replace(
            Kind::EndpointSlice,
            m.slices
                .into_iter()
                .map(|s| Object::EndpointSlice(Box::new(s)))
                .collect(),
        ),
        SourceEvent::Replace(
            Kind::Node,
            m.nodes
                .into_iter()
                .map(|n| Object::Node(Box::new(n)))
                .collect(),
        ),
        SourceEvent::Replace(
            Kind::ServiceCidr,
            m.service_cidrs
                .into_iter()
                .map(|c| Object::ServiceCidr(Box::new(c)))
                .collect(),
        ),
    ]
}

/// One file as last read: the stamp of the version read and its objects, or why it failed.
struct Entry {
    stamp: Stamp,
    parsed: Result<Vec<Object>, ManifestError>,
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
            let keep = old.remove(&found.path).filter(|e| {
                e.stamp == found.stamp
                    && !(retry && matches!(e.parsed, Err(ManifestError::Read { .. })))
            });
            let entry = match keep {
                Some(e) => e,
                None => {
                    changed = true;
                    self.reads += 1;
                    match manifests::read_file(&found, self.cap) {
                        Ok((stamp, objects)) => Entry {
                            stamp,
                            parsed: Ok(objects),
                        },
                        // The listing's stamp: the next poll reads again only if it changes.
                        Err(e) => Entry {
                            stamp: found.stamp,
                            parsed: Err(e),
                        },
                    }
                }
            };
            self.files.insert(found.path, entry);
        }
        changed |= !old.is_empty();
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

    fn take_error(mut self) -> Option<ManifestError> {
        if let Some(e) = self.listing.take() {
            return Some(e);
        }
        let path = self
            .files
            .iter()
            .find(|(_, e)| e.parsed.is_err())
            .map(|(p, _)| p.clone())?;
        self.files.remove(&path).and_then(|e| e.parsed.err())
    }

    /// Every file's objects, in path order (as [`manifests::load`] reads them).
    fn merged(&self) -> Manifests {
        let mut m = Manifests::default();
        let mut seen = std::collections::BTreeMap::new();
        for (path, objects) in self
            .files
            .iter()
            .filter_map(|(p, e)| e.parsed.as_ref().ok().map(|o| (p, o)))
        {
            for (i, o) in objects.iter().enumerate() {
                m.push(o.clone(), manifests::place(path, i), &mut seen);
            }
        }
        m
    }

    /// Look at the path once: the events to send when something changed and everything
    /// parses.
    pub fn poll(&mut self, now: Instant) -> Option<Vec<SourceEvent>> {
        self.pending |= self.refresh(now);
        if let Some(e) = self.error() {
            let msg = e.to_string();
            if self.reported.as_ref() != Some(&msg) {
                tracing::error!("{msg}; the previous manifests stay in effect");
                self.reported = Some(msg);
            }
            return None;
        }
        self.reported = None;
        if !std::mem::take(&mut self.pending) {
            return None;
        }
        tracing::info!("{}: manifests changed", self.path.display());
        Some(replace_all(self.merged()))
    }
}

/// Read the path once; the agent fails to start if this fails. The watcher holds what was
/// read, for [`spawn`].
pub fn initial(path: &Path) -> Result<(Vec<SourceEvent>, Watcher), ManifestError> {
    let mut w = Watcher::new(path.to_path_buf(), manifests::MAX_FILE_BYTES);
    w.refresh(Instant::now());
    if w.error().is_some() {
        return Err(w.take_error().unwrap_or(ManifestError::Empty {
            path: path.to_path_buf(),
        }));
    }
    let events = replace_all(w.merged());
    Ok((events, w))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str, ip: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{ name: {name}, namespace: ns }}\n\
             spec: {{ clusterIP: {ip}, ports: [{{ port: 80 }}] }}\n"
        )
    }

    /// name=clusterIP of each Service the events replace the Services with.
    fn services(events: &[SourceEvent]) -> Vec<String> {
        events
            .iter()
            .find_map(|e| match e {
                SourceEvent::Replace(Kind::Service, objs) => Some(objs),
                _ => None,
            })
            .unwrap()
            .iter()
            .map(|o| match o {
                Object::Service(s) => format!(
                    "{}={}",
                    s.metadata.name.as_deref().unwrap(),
                    s.spec.as_ref().unwrap().cluster_ip.as_deref().unwrap()
                ),
                _ => panic!("not a Service"),
            })
            .collect()
    }

    fn write_in_place(path: &Path, text: &str) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(path)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn file_source_reads_only_changed_files_and_sees_edits_in_subdirectories() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("sub/deeper")).unwrap();
        std::fs::write(d.join("a.yaml"), svc("a", "172.30.0.1")).unwrap();
        std::fs::write(d.join("sub/b.yaml"), svc("b", "172.30.0.2")).unwrap();
        let c = d.join("sub/deeper/c.yaml");
        std::fs::write(&c, svc("c", "172.30.0.3")).unwrap();
        let (events, mut w) = initial(d).unwrap();
        assert_eq!(
            services(&events),
            ["a=172.30.0.1", "b=172.30.0.2", "c=172.30.0.3"]
        );
        assert_eq!(w.reads, 3);
        let now = Instant::now();
        assert!(w.poll(now).is_none());
        assert_eq!(w.reads, 3, "nothing changed, nothing read");

        // Edited in place, two levels down: only that file is read again.
        write_in_place(&c, &svc("c", "172.30.0.33"));
        let events = w.poll(now).expect("the edit is noticed");
        assert_eq!(
            services(&events),
            ["a=172.30.0.1", "b=172.30.0.2", "c=172.30.0.33"]
        );
        assert_eq!(w.reads, 4);

        // A file removed: nothing read, its objects go.
        std::fs::remove_file(d.join("a.yaml")).unwrap();
        let events = w.poll(now).expect("the removal is noticed");
        assert_eq!(services(&events), ["b=172.30.0.2", "c=172.30.0.33"]);
        assert_eq!(w.reads, 4);
        assert!(w.poll(now).is_none());
    }

    #[test]
    fn file_source_reads_a_broken_file_again_only_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let a = d.join("a.yaml");
        std::fs::write(&a, svc("a", "172.30.0.1")).unwrap();
        let (_, mut w) = initial(d).unwrap();
        let broken = d.join("broken.yaml");
        std::fs::write(&broken, "kind: Service\nspec: [\n").unwrap();
        let t0 = Instant::now();
        for i in 0..100 {
            assert!(w.poll(t0 + POLL * i).is_none());
        }
        assert_eq!(w.reads, 2, "the broken file was read once");
        assert!(w.error().unwrap().to_string().contains("broken.yaml"));

        // A good file edited meanwhile is read, but nothing is reported while one is broken.
        write_in_place(&a, &svc("a", "172.30.0.11"));
        assert!(w.poll(t0 + POLL * 101).is_none());
        assert_eq!(w.reads, 3);

        // Fixed: reported at once, with the edit made while it was broken.
        write_in_place(&broken, &svc("d", "172.30.0.4"));
        let events = w.poll(t0 + POLL * 102).expect("the fix is noticed");
        assert_eq!(services(&events), ["a=172.30.0.11", "d=172.30.0.4"]);
        assert_eq!(w.reads, 4);
        assert!(w.poll(t0 + POLL * 103).is_none());
    }

    #[test]
    fn file_source_retries_an_unreadable_file_with_backoff() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("a.yaml"), svc("a", "172.30.0.1")).unwrap();
        let (_, mut w) = initial(d).unwrap();
        // Not UTF-8: a read error, which (unlike a parse error) is tried again unchanged.
        let bad = d.join("bad.yaml");
        std::fs::write(&bad, [0xff, 0xfe, b'\n']).unwrap();
        let t0 = Instant::now();
        let mut at = Vec::new();
        for i in 1..=300u32 {
            let before = w.reads;
            assert!(w.poll(t0 + POLL * i).is_none());
            if w.reads > before {
                at.push(POLL * i);
            }
        }
        // 60 s of looking: at 0.2, 0.4, 0.8, 1.6, 3.2, 6.4 s and then every 5 s.
        assert!((12..=20).contains(&at.len()), "{at:?}");
        let gaps: Vec<Duration> = at.windows(2).map(|p| p[1] - p[0]).collect();
        assert!(gaps.windows(2).all(|g| g[0] <= g[1]), "{gaps:?}");
        assert!(gaps.iter().all(|g| *g <= MAX_BACKOFF + POLL), "{gaps:?}");
        assert!(*gaps.last().unwrap() >= MAX_BACKOFF, "{gaps:?}");

        // A change is read at once, whatever the backoff.
        write_in_place(&bad, &svc("b", "172.30.0.2"));
        let events = w.poll(t0 + POLL * 301).expect("the fix is noticed");
        assert_eq!(services(&events), ["a=172.30.0.1", "b=172.30.0.2"]);
        assert_eq!(w.backoff, POLL);
    }

    #[test]
    fn file_source_initial_names_the_failing_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), svc("a", "172.30.0.1")).unwrap();
        std::fs::write(dir.path().join("z.yaml"), "kind: Service\nspec: [\n").unwrap();
        let e = initial(dir.path()).err().unwrap().to_string();
        assert!(e.contains("z.yaml: not valid YAML"), "{e}");
        let e = initial(&dir.path().join("gone")).err().unwrap().to_string();
        assert!(e.contains("gone: cannot read"), "{e}");
    }
}
