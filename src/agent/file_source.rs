//! Manifest files as a source: poll the path, and when a file's size, modification time or
//! the set of files changes, read everything again and report each kind's complete set.
//! A file that fails to parse is reported and the previous objects stay in effect.

use super::store::{Arrival, Kind, SourceEvent};
use crate::manifests::{self, ManifestError, Manifests, Object};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;

/// How often the path is looked at: edits are picked up well within a second.
pub const POLL: Duration = Duration::from_millis(200);

/// What identifies one version of the manifest path without reading it.
type Stamp = Vec<(PathBuf, u64, Option<SystemTime>)>;

fn stamp(path: &Path) -> Stamp {
    let mut files = Vec::new();
    let mut add = |p: &Path| {
        if let Ok(md) = std::fs::metadata(p) {
            files.push((p.to_path_buf(), md.len(), md.modified().ok()));
        }
    };
    if path.is_dir() {
        if let Ok(rd) = std::fs::read_dir(path) {
            for e in rd.flatten() {
                add(&e.path());
            }
        }
    } else {
        add(path);
    }
    files.sort();
    files
}

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

/// Read the path once; the agent fails to start if this fails.
pub fn initial(path: &Path) -> Result<Vec<SourceEvent>, ManifestError> {
    manifests::load(path).map(replace_all)
}

/// Watch `path` until the receiver goes away. `initial` must have been read already.
pub async fn watch(path: PathBuf, tx: mpsc::Sender<Arrival>) {
    let mut last = stamp(&path);
    let mut last_error: Option<String> = None;
    loop {
        tokio::time::sleep(POLL).await;
        let now = stamp(&path);
        if now == last {
            continue;
        }
        // Reading while an editor is still writing can fail; the next poll retries because
        // the stamp is only taken as read once a load succeeds.
        match manifests::load(&path) {
            Ok(m) => {
                last = now;
                last_error = None;
                tracing::info!("{}: manifests changed", path.display());
                for ev in replace_all(m) {
                    if tx.send(Arrival::now(ev)).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                let msg = e.to_string();
                if last_error.as_ref() != Some(&msg) {
                    tracing::error!("{msg}; the previous manifests stay in effect");
                    last_error = Some(msg);
                }
            }
        }
    }
}
