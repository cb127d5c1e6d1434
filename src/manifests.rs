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
/// several times faster and in a fraction of the memory); YAML through serde-saphyr, within
/// [`yaml_options`]' limits, one document at a time.
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
    let objects = match printing {
        true => parse_yaml::<true>(text, path, yaml_options())?,
        false => parse_yaml::<false>(text, path, yaml_options())?,
    };
    for (o, print) in objects {
        each(o, print);
    }
    Ok(())
}

/// The objects of a YAML file, each with its print when `PRINTING`.
fn parse_yaml<const PRINTING: bool>(
    text: &str,
    path: &Path,
    options: serde_saphyr::Options,
) -> Result<Vec<(Object, Option<Print>)>, ManifestError> {
    // Each document is decoded as soon as it is parsed (`Decoded::extend`), so a multi-document
    // dump never holds more than one document's tree. A syntax error anywhere in the file wins
    // over a decode error in an earlier document (the parser keeps going after a bad object).
    let decoded: Decoded<PRINTING> =
        serde_saphyr::from_str_multiple_with_options::<serde_json::Value, _>(text, options)
            .map_err(|e| ManifestError::Syntax {
                path: path.to_path_buf(),
                doc: e.location().map_or(1, |l| {
                    document_at(text, usize::try_from(l.line()).unwrap_or(usize::MAX))
                }),
                message: yaml_message(&e),
            })?;
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
        None => Ok(decoded.objects),
    }
}

/// Limits for YAML manifests, sized for the largest input we mean to accept: one file holding a
/// 100k-service cluster as `kubectl get svc,endpointslices -A -o yaml` prints it, 100k Services
/// and 100k EndpointSlices of 10 endpoints each, with kubectl's usual metadata (uid,
/// resourceVersion, last-applied-configuration, ownerReferences, targetRef, zone). The test
/// `ten_thousand_services_parse_within_a_tenth_of_the_limits` generates that shape at 10k and
/// measured 46.2 MB, 3.81M nodes (scalars, keys included, sequences and mappings), 4.42M parser
/// events, 31.7 MB of scalar text and a depth of 6; so the 100k dump is about 460 MB, 38M
/// nodes, 44M events and 320 MB of scalars. The limits accept 2.6 times that (a dump of this
/// shape up to about 1.2 GB): 100M nodes, 125M events, 1 GiB of scalars, 1M documents (the
/// multi-document form of the 100k dump has 200k). The test asserts that ten times its 10k
/// file stays within them.
///
/// The input is already in memory, so what must be stopped is amplification and recursion:
/// - aliases: kubectl and Helm never write anchors, a hand-written manifest uses a few. Alias
///   replays stop at 1M events and anchored copies at 1M events or 64 MiB (a billion-laughs
///   document stops there, having built at most about 1M nodes), nested at most 64 deep; the
///   alias-to-anchor ratio heuristic is off, since these caps bound the work by themselves;
/// - nesting: 64 levels (a Kubernetes object nests about 10 deep). Deeper input is an error,
///   not a stack overflow: the parser recurses per level, about 20 KiB a level in a debug
///   build, and 64 levels stay within the 2 MiB stack of the tokio worker that reloads
///   manifests (90 levels did too, 100 overflowed). The JSON path keeps serde_json's 128;
/// - the node, event and scalar-byte counts bound the work on everything else.
///
/// Parsing follows serde_yaml 0.9's untyped reading where serde-saphyr allows it: YAML 1.2
/// booleans only (`yes` stays a string), numbers with leading zeros or underscores stay
/// strings, `.nan` and `.inf` become null; duplicate keys are an error. Merge keys (`<<`) are
/// expanded, as kubectl expands them (serde_yaml left them as a key named `<<`).
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_events: 125_000_000,
            max_nodes: 100_000_000,
            max_total_scalar_bytes: 1 << 30,
            max_documents: 1_000_000,
            max_depth: 64,
            // One above max_depth, so that the budget reports a breach (naming the limit)
            // before the parser's own nesting check does.
            flow_nesting_limit: 65,
            max_aliases: 100_000,
            max_anchors: 100_000,
            max_merge_keys: 100_000,
            max_recorded_anchor_events: 1_000_000,
            max_recorded_anchor_bytes: 64 << 20,
            enforce_alias_anchor_ratio: false,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: 1_000_000,
            max_replay_stack_depth: 64,
        },
        emit_comments: false,
        with_snippet: false,
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        non_finite_float_policy: serde_saphyr::NonFiniteFloatPolicy::PassThrough,
    }
}

/// The parser's message, one line, saying so when one of [`yaml_options`]' limits stopped it.
fn yaml_message(e: &serde_saphyr::Error) -> String {
    use serde_saphyr::Error as E;
    let mut inner = e.without_snippet();
    while let E::AliasError { error, .. } = inner {
        inner = error.without_snippet();
    }
    let limit = matches!(
        inner,
        E::Budget { .. }
            | E::AliasReplayLimitExceeded { .. }
            | E::AliasExpansionLimitExceeded { .. }
            | E::AliasReplayStackDepthExceeded { .. }
            | E::AliasReplayCounterOverflow { .. }
    );
    if limit {
        format!("over the limits for manifest files: {e}")
    } else {
        e.to_string()
    }
}

/// The 1-based number of the YAML document that holds 1-based `line`: `---` starts a document,
/// `...` ends one, and other content outside a document starts the next.
fn document_at(text: &str, line: usize) -> usize {
    let (mut docs, mut open) = (0, false);
    for l in text.lines().take(line.max(1)) {
        let marker = |m: &str| {
            l.strip_prefix(m)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
        };
        if marker("---") {
            docs += 1;
            open = true;
        } else if marker("...") {
            open = false;
        } else if !open {
            // Outside a document, blank lines, comments and directives start none.
            let t = l.trim_start();
            if !(t.is_empty() || t.starts_with('#') || t.starts_with('%')) {
                docs += 1;
                open = true;
            }
        }
    }
    docs.max(1)
}

/// Objects decoded from a YAML stream as the parser delivers each document; the first decode
/// error is kept (later documents are parsed but no longer decoded).
#[derive(Default)]
struct Decoded<const PRINTING: bool> {
    /// Each with its print when `PRINTING`: YAML's text is gone once parsed, so the tree is
    /// printed here.
    objects: Vec<(Object, Option<Print>)>,
    /// (apiVersion, kind, name) of objects of kinds we do not read.
    ignored: Vec<(String, String, String)>,
    error: Option<Undecodable>,
}

impl<const PRINTING: bool> Extend<serde_json::Value> for Decoded<PRINTING> {
    fn extend<I: IntoIterator<Item = serde_json::Value>>(&mut self, docs: I) {
        for doc in docs {
            if self.error.is_none() {
                let objects = &mut self.objects;
                let mut each = |o, print| objects.push((o, print));
                if let Err(e) = decode_all(doc, PRINTING, &mut each, &mut self.ignored) {
                    self.error = Some(e);
                }
            }
        }
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
mod print;
pub use print::Print;

#[cfg(test)]
mod tests;
