//! Manifest input: YAML or JSON files (multi-document, `kind: List`) holding the objects a
//! cluster would stream, decoded into their k8s-openapi types.

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One object read from a manifest.
#[derive(Debug, Clone)]
pub enum Object {
    Service(Box<Service>),
    EndpointSlice(Box<EndpointSlice>),
    Node(Box<Node>),
    ServiceCidr(Box<ServiceCIDR>),
}

/// Everything read from a manifest path.
#[derive(Debug, Clone, Default)]
pub struct Manifests {
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    pub nodes: Vec<Node>,
    pub service_cidrs: Vec<ServiceCIDR>,
    /// One warning per object defined more than once, naming both places.
    pub duplicates: Vec<String>,
}

/// (kind, namespace, name) of an object, for finding one defined twice.
pub(crate) type Identity = (&'static str, String, String);

pub(crate) fn identity(o: &Object) -> Identity {
    let (kind, meta, namespaced) = match o {
        Object::Service(s) => ("Service", &s.metadata, true),
        Object::EndpointSlice(s) => ("EndpointSlice", &s.metadata, true),
        Object::Node(n) => ("Node", &n.metadata, false),
        Object::ServiceCidr(c) => ("ServiceCIDR", &c.metadata, false),
    };
    // An empty namespace is the default one, as an absent one is (the store keys both "").
    let ns = match (namespaced, meta.namespace.as_deref()) {
        (false, _) => String::new(),
        (true, ns) => ns
            .filter(|n| !n.is_empty())
            .unwrap_or("default")
            .to_string(),
    };
    (kind, ns, meta.name.clone().unwrap_or_default())
}

/// Where an object was read, for the warning about an object defined twice.
pub(crate) fn place(path: &Path, index: usize) -> String {
    format!("{} (object {})", path.display(), index + 1)
}

/// The warning about an object defined twice, at `earlier` and at `later` (see
/// [`place`]): the later copy is used whole.
pub(crate) fn defined_twice(id: &Identity, earlier: &str, later: &str) -> String {
    let (kind, ns, name) = id;
    let shown = if ns.is_empty() {
        name.clone()
    } else {
        format!("{ns}/{name}")
    };
    format!(
        "{kind} {shown} is defined twice, at {earlier} and at {later}; the later one is used whole"
    )
}

impl Manifests {
    /// Add `o`, read at `place`. An object defined twice (same kind, namespace and name) is
    /// never merged: the copy read last, in sorted file order and then document order (as
    /// `kubectl apply -f` of the same files would leave it), replaces the earlier one whole,
    /// and a warning names both places.
    pub(crate) fn push(
        &mut self,
        o: Object,
        place: String,
        seen: &mut BTreeMap<Identity, (usize, String)>,
    ) {
        let kept = match &o {
            Object::Service(_) => self.services.len(),
            Object::EndpointSlice(_) => self.slices.len(),
            Object::Node(_) => self.nodes.len(),
            Object::ServiceCidr(_) => self.service_cidrs.len(),
        };
        let at = replaces(seen, identity(&o), place, kept, &mut self.duplicates);
        match o {
            Object::Service(s) => put(&mut self.services, at, *s),
            Object::EndpointSlice(s) => put(&mut self.slices, at, *s),
            Object::Node(n) => put(&mut self.nodes, at, *n),
            Object::ServiceCidr(c) => put(&mut self.service_cidrs, at, *c),
        }
    }
}

/// Where an object `id`, read at `place`, goes among the `kept` objects of its kind kept so
/// far: `Some(at)` when it is defined twice, to replace the earlier copy at `at` whole (a
/// warning naming both places goes to `duplicates`), `None` to be added after them. `seen`
/// is where each object is kept and was read.
pub(crate) fn replaces(
    seen: &mut BTreeMap<Identity, (usize, String)>,
    id: Identity,
    place: String,
    kept: usize,
    duplicates: &mut Vec<String>,
) -> Option<usize> {
    match seen.get(&id).cloned() {
        Some((at, earlier)) => {
            duplicates.push(defined_twice(&id, &earlier, &place));
            seen.insert(id, (at, place));
            Some(at)
        }
        None => {
            seen.insert(id, (kept, place));
            None
        }
    }
}

/// `x` in `v`: at `at` (see [`replaces`]), else after the rest.
pub(crate) fn put<T>(v: &mut Vec<T>, at: Option<usize>, x: T) {
    match at.and_then(|at| v.get_mut(at)) {
        Some(slot) => *slot = x,
        None => v.push(x),
    }
}

/// A manifest that cannot be used, naming the file, the object and the field.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not valid YAML or JSON (document {doc}): {message}", path.display())]
    Syntax {
        path: PathBuf,
        doc: usize,
        message: String,
    },
    #[error("{}: {kind} {name}: field {field}: {message}", path.display())]
    Decode {
        path: PathBuf,
        kind: String,
        name: String,
        field: String,
        message: String,
    },
    #[error(
        "{}: too large: {size} bytes, over the limit of {cap} bytes for one manifest file",
        path.display()
    )]
    TooLarge { path: PathBuf, size: u64, cap: u64 },
    #[error("{}: no manifest files (*.yaml, *.yml, *.json) found", path.display())]
    Empty { path: PathBuf },
}

/// The largest manifest file read, in bytes: a little over [`yaml_options`]' size of the
/// largest dump we accept (a 100k-service cluster in one file is about 460 MB; the limits take
/// a dump of that shape up to about 1.2 GB). A larger file is an error naming it and this cap,
/// found from its size before anything is read.
pub const MAX_FILE_BYTES: u64 = 1_200_000_000;

/// What identifies one version of a file without reading it: device, inode, size, and the
/// modification and change times (nanoseconds). An edit in place changes the times and
/// usually the size; a replacement by rename changes the inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    pub fn of(md: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            dev: md.dev(),
            ino: md.ino(),
            size: md.size(),
            mtime: (md.mtime(), md.mtime_nsec()),
            ctime: (md.ctime(), md.ctime_nsec()),
        }
    }
}

/// One manifest file found under the path.
#[derive(Debug, Clone)]
pub struct Found {
    pub path: PathBuf,
    pub stamp: Stamp,
    /// The path named on the command line itself (read whatever it is, so that
    /// `--manifests <(kubectl ...)` works), not a file found in a directory (read only if it
    /// is a regular file).
    pub named: bool,
}

/// The manifest files under a path, sorted, and the entries skipped (one warning each).
#[derive(Debug, Default)]
pub struct Listing {
    pub files: Vec<Found>,
    pub skipped: Vec<String>,
}

fn file_type_name(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

/// The files to read, without reading any: the path itself, or the manifest files
/// (*.yaml, *.yml, *.json, not hidden) under a directory, recursively, sorted. Symbolic links
/// are followed; a directory reached a second time (a symlink loop such as `a -> .`) and a
/// manifest name that is not a regular file (a FIFO, a socket, a device) are skipped with a
/// warning, so nothing here or in [`read_file`] can block or run forever.
pub fn list(path: &Path) -> Result<Listing, ManifestError> {
    let read_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ManifestError::Read { path, source }
    };
    let meta = std::fs::metadata(path).map_err(read_err(path))?;
    let mut listing = Listing::default();
    if !meta.is_dir() {
        listing.files.push(Found {
            path: path.to_path_buf(),
            stamp: Stamp::of(&meta),
            named: true,
        });
        return Ok(listing);
    }
    let dir_id = |md: &std::fs::Metadata| {
        use std::os::unix::fs::MetadataExt;
        (md.dev(), md.ino())
    };
    let mut visited = std::collections::HashSet::from([dir_id(&meta)]);
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(read_err(&dir))?;
        for entry in entries {
            let entry = entry.map_err(read_err(&dir))?;
            let p = entry.path();
            let hidden = p
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.'));
            if hidden {
                continue;
            }
            let manifest = matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            );
            let ft = entry.file_type().map_err(read_err(&p))?;
            if !(ft.is_dir() || ft.is_symlink() || manifest) {
                continue;
            }
            // Follows a symbolic link; a dangling one with a manifest's name cannot be read.
            let md = match std::fs::metadata(&p) {
                Ok(md) => md,
                Err(e) if manifest => return Err(read_err(&p)(e)),
                Err(_) => continue,
            };
            if md.is_dir() {
                if visited.insert(dir_id(&md)) {
                    stack.push(p);
                } else {
                    listing.skipped.push(format!(
                        "{}: skipped: a directory already read (a symbolic link loop?)",
                        p.display()
                    ));
                }
            } else if !manifest {
                continue;
            } else if md.is_file() {
                listing.files.push(Found {
                    path: p,
                    stamp: Stamp::of(&md),
                    named: false,
                });
            } else {
                listing.skipped.push(format!(
                    "{}: skipped: {}, not a regular file",
                    p.display(),
                    file_type_name(md.file_type())
                ));
            }
        }
    }
    listing.files.sort_by(|a, b| a.path.cmp(&b.path));
    listing.skipped.sort();
    if listing.files.is_empty() {
        return Err(ManifestError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(listing)
}

/// Read and parse one file found by [`list`]: the stamp of the version read (taken from the
/// open file, before reading) and its objects. A file found in a directory is opened without
/// blocking and read only if it is still a regular file; no file is read past `cap` bytes.
pub fn read_file(found: &Found, cap: u64) -> Result<(Stamp, Vec<Object>), ManifestError> {
    let mut objects = Vec::new();
    let stamp = read_file_each(found, cap, &mut |o| objects.push(o))?;
    Ok((stamp, objects))
}

/// [`read_file`], handing each object to `each` as soon as it is decoded rather than
/// collecting them: a reader that converts them as they come never holds a whole file of
/// decoded objects (the agent's first read of a JSON list of 100k Services and 100k
/// EndpointSlices peaked at 1,295 MiB decoded whole, 564 MiB streamed). On an error, `each` has had the objects decoded
/// before it.
pub fn read_file_each(
    found: &Found,
    cap: u64,
    each: &mut dyn FnMut(Object),
) -> Result<Stamp, ManifestError> {
    read_file_with(found, cap, false, &mut |o, _| each(o))
}

/// [`read_file_each`], with each object's [`Print`].
pub fn read_file_printed(
    found: &Found,
    cap: u64,
    each: &mut dyn FnMut(Object, Print),
) -> Result<Stamp, ManifestError> {
    read_file_with(found, cap, true, &mut |o, print| {
        // Asked for, so always there.
        if let Some(print) = print {
            each(o, print);
        }
    })
}

/// Where a parser hands each object it decodes, with its print when `printing`.
type Sink<'a> = &'a mut dyn FnMut(Object, Option<Print>);

fn read_file_with(
    found: &Found,
    cap: u64,
    printing: bool,
    each: Sink<'_>,
) -> Result<Stamp, ManifestError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let path = &found.path;
    let read_err = |source| ManifestError::Read {
        path: path.clone(),
        source,
    };
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    if !found.named {
        opts.custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits());
    }
    let file = opts.open(path).map_err(read_err)?;
    let md = file.metadata().map_err(read_err)?;
    if !found.named && !md.is_file() {
        return Err(read_err(std::io::Error::other(format!(
            "{}, not a regular file",
            file_type_name(md.file_type())
        ))));
    }
    let too_large = |size| ManifestError::TooLarge {
        path: path.clone(),
        size,
        cap,
    };
    if md.is_file() && md.len() > cap {
        return Err(too_large(md.len()));
    }
    let mut bytes = Vec::with_capacity(if md.is_file() {
        usize::try_from(md.len()).unwrap_or(0)
    } else {
        0
    });
    file.take(cap.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > cap {
        return Err(too_large(bytes.len() as u64));
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        read_err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        ))
    })?;
    parse_with(&text, path, printing, each)?;
    Ok(Stamp::of(&md))
}

/// Load every object under `path`; skipped entries are logged as warnings.
pub fn load(path: &Path) -> Result<Manifests, ManifestError> {
    let mut m = Manifests::default();
    let mut seen = BTreeMap::new();
    load_each(path, &mut |o, place| m.push(o, place, &mut seen))?;
    Ok(m)
}

/// [`load`], handing each object to `each` as it is decoded, with where it was read (see
/// [`place`]), in path and then document order.
pub fn load_each(path: &Path, each: &mut dyn FnMut(Object, String)) -> Result<(), ManifestError> {
    let listing = list(path)?;
    for msg in &listing.skipped {
        tracing::warn!("{msg}");
    }
    for found in &listing.files {
        let mut index = 0;
        read_file_each(found, MAX_FILE_BYTES, &mut |o| {
            each(o, place(&found.path, index));
            index += 1;
        })?;
    }
    Ok(())
}

/// Parse one file's text. JSON goes straight to serde_json (large `kubectl -o json` dumps parse
/// several times faster and in a fraction of the memory); YAML through the plain reader
/// (`plain_yaml`) where it is plain block YAML, else serde-saphyr within [`yaml_options`]'
/// limits, one document at a time.
pub fn parse(text: &str, path: &Path) -> Result<Vec<Object>, ManifestError> {
    let mut objects = Vec::new();
    parse_each(text, path, &mut |o| objects.push(o))?;
    Ok(objects)
}

/// [`parse`], handing each object to `each` as it is decoded (see [`read_file_each`]).
pub fn parse_each(
    text: &str,
    path: &Path,
    each: &mut dyn FnMut(Object),
) -> Result<(), ManifestError> {
    parse_with(text, path, false, &mut |o, _| each(o))
}

fn parse_with(
    text: &str,
    path: &Path,
    printing: bool,
    each: Sink<'_>,
) -> Result<(), ManifestError> {
    let is_json = path.extension().and_then(|e| e.to_str()) == Some("json")
        || text.trim_start().starts_with('{');
    if is_json {
        return json::parse(text, path, printing, each);
    }
    match printing {
        true => parse_yaml::<true>(text, path, yaml_options(), each),
        false => parse_yaml::<false>(text, path, yaml_options(), each),
    }
}

/// The objects of a YAML file handed to `each` as they are decoded, each with its print when
/// `PRINTING`.
fn parse_yaml<const PRINTING: bool>(
    text: &str,
    path: &Path,
    options: serde_saphyr::Options,
    each: Sink<'_>,
) -> Result<(), ManifestError> {
    // Plain block YAML, as kubectl and Helm print it, goes to the faster plain reader;
    // anything else (or anything it is unsure of) to serde-saphyr, whole. Either way each
    // document is decoded as soon as it is read, and a list's items one by one, so a dump
    // never holds more than one object's tree. A syntax error anywhere in the file wins over
    // a decode error in an earlier document (the parser keeps going after a bad object).
    let mut handed = 0;
    let read = plain_yaml::read::<PRINTING>(text, &mut |o, print| {
        handed += 1;
        each(o, print);
    });
    let decoded = match read {
        Ok(decoded) => decoded,
        Err(bail) => {
            tracing::debug!(file = %path.display(), line = bail.line, why = bail.why,
                "YAML beyond the plain reader; parsing with serde-saphyr");
            let mut decoded = yaml::saphyr::<PRINTING>(text, path, options)?;
            // What the plain reader handed on before it gave up, serde-saphyr reads alike
            // (the plain reader's tests hold it to that): not handed on twice.
            for (o, print) in decoded.objects.drain(..).skip(handed) {
                each(o, print);
            }
            decoded
        }
    };
    for (api, kind, name) in &decoded.ignored {
        tracing::debug!(file = %path.display(), %api, %kind, %name, "ignoring object of another kind");
    }
    match decoded.error {
        Some(e) => Err(ManifestError::Decode {
            path: path.to_path_buf(),
            kind: e.kind,
            name: e.name,
            field: e.field,
            message: e.message,
        }),
        None => Ok(()),
    }
}

fn str_at<'a>(v: &'a serde_json::Value, keys: &[&str]) -> Option<&'a str> {
    let mut cur = v;
    for k in keys {
        cur = cur.get(*k)?;
    }
    cur.as_str()
}

fn decode<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let field = e.path().to_string();
        (field, e.into_inner().to_string())
    })
}

/// An object that does not decode into its type: kind, namespace/name, field and why.
struct Undecodable {
    kind: String,
    name: String,
    field: String,
    message: String,
}

fn collect(
    value: serde_json::Value,
    path: &Path,
    printing: bool,
    out: Sink<'_>,
) -> Result<(), ManifestError> {
    let mut ignored = Vec::new();
    let result = decode_all(value, printing, out, &mut ignored);
    for (api, kind, name) in &ignored {
        tracing::debug!(file = %path.display(), %api, %kind, %name, "ignoring object of another kind");
    }
    result.map_err(|e| ManifestError::Decode {
        path: path.to_path_buf(),
        kind: e.kind,
        name: e.name,
        field: e.field,
        message: e.message,
    })
}

/// Decode one document (an object, a `kind: List` of them, or null) into `out`, each object
/// printed from its tree when `printing`; objects of other kinds go to `ignored` as
/// (apiVersion, kind, name).
fn decode_all(
    mut value: serde_json::Value,
    printing: bool,
    out: Sink<'_>,
    ignored: &mut Vec<(String, String, String)>,
) -> Result<(), Undecodable> {
    if value.is_null() {
        return Ok(());
    }
    let kind = str_at(&value, &["kind"]).unwrap_or_default().to_string();
    let api = str_at(&value, &["apiVersion"])
        .unwrap_or_default()
        .to_string();
    let name = match (
        str_at(&value, &["metadata", "namespace"]),
        str_at(&value, &["metadata", "name"]),
    ) {
        (Some(ns), Some(n)) => format!("{ns}/{n}"),
        (None, Some(n)) => n.to_string(),
        _ => "(unnamed)".to_string(),
    };
    if kind == "List" || (kind.ends_with("List") && value.get("items").is_some()) {
        if let serde_json::Value::Array(items) = value["items"].take() {
            for item in items {
                decode_all(item, printing, out, ignored)?;
            }
        }
        return Ok(());
    }
    let print = printing.then(|| Print::of_tree(&value));
    let obj = match (api.as_str(), kind.as_str()) {
        ("v1", "Service") => decode(value).map(|s| Object::Service(Box::new(s))),
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            decode(value).map(|s| Object::EndpointSlice(Box::new(s)))
        }
        ("v1", "Node") => decode(value).map(|n| Object::Node(Box::new(n))),
        ("networking.k8s.io/v1", "ServiceCIDR") => {
            decode(value).map(|c| Object::ServiceCidr(Box::new(c)))
        }
        // The same schema; k8s-openapi's type takes only its own apiVersion.
        ("networking.k8s.io/v1beta1", "ServiceCIDR") => {
            value["apiVersion"] = "networking.k8s.io/v1".into();
            decode(value).map(|c| Object::ServiceCidr(Box::new(c)))
        }
        _ => {
            if tracing::enabled!(tracing::Level::DEBUG) {
                ignored.push((api, kind, name));
            }
            return Ok(());
        }
    };
    match obj {
        Ok(o) => {
            out(o, print);
            Ok(())
        }
        Err((field, message)) => Err(Undecodable {
            kind,
            name,
            field,
            message,
        }),
    }
}

mod json;
mod plain_yaml;
mod print;
mod turns;
mod yaml;
pub use print::Print;
use yaml::yaml_options;

#[cfg(test)]
mod tests;
