//! JSON manifests: each document checked whole, then decoded straight into its type, a
//! `List` item by item, without building a tree of the document.

use super::turns;
use super::{collect, ManifestError, Object, Print, Sink};
use serde_json::value::RawValue;
use std::path::Path;

/// [`super::parse_each`] for JSON text; each object printed from its own text when
/// `printing`.
pub(super) fn parse(
    text: &str,
    path: &Path,
    printing: bool,
    each: Sink<'_>,
) -> Result<(), ManifestError> {
    // Each document is checked whole first, as parsing it into a tree checked it (the
    // same errors, with their document, line and column): skipping over a list's items
    // as text checks neither nesting depth nor escapes.
    let mut docs = serde_json::Deserializer::from_str(text).into_iter::<Checked>();
    let (mut i, mut start) = (0, 0);
    while let Some(doc) = docs.next() {
        i += 1;
        let syntax = |e: serde_json::Error| ManifestError::Syntax {
            path: path.to_path_buf(),
            doc: i,
            message: e.to_string(),
        };
        doc.map_err(syntax)?;
        let end = docs.byte_offset();
        let raw: &RawValue =
            serde_json::from_str(text.get(start..end).unwrap_or_default()).map_err(syntax)?;
        start = end;
        collect_raw(raw, path, printing, each)?;
    }
    Ok(())
}

/// A JSON value walked whole and built into nothing: what parsing it into a
/// `serde_json::Value` checks (nesting at most 128 deep, escapes, numbers), without the tree.
struct Checked;

impl<'de> serde::Deserialize<'de> for Checked {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Checked, D::Error> {
        d.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> serde::de::Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_none<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Checked, D::Error> {
        <Checked as serde::Deserialize>::deserialize(d)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

/// What a JSON object says of itself before it is decoded: its type, and a list's items as
/// text. Anything else in it is skipped over, not built.
#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(rename = "apiVersion", borrow, default)]
    api: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    items: Option<Vec<&'a RawValue>>,
}

/// [`collect`] for one JSON document given as text. A `List` is decoded item by item, each
/// straight into its type: a 13 MB list of 10k Services and 10k EndpointSlices built 300 MB
/// of `serde_json::Value` trees when it was decoded whole (heaptrack, the agent's peak), and
/// glibc kept most of that for the thread afterwards. Whatever this fast path cannot take
/// as it is (a document that is not an object, a field of the wrong type, an object that
/// fails to decode) goes the `Value` way, which gives the errors their wording.
fn collect_raw(
    raw: &RawValue,
    path: &Path,
    printing: bool,
    out: Sink<'_>,
) -> Result<(), ManifestError> {
    // Only an object has a kind: `Head` would also take an array's elements as its fields.
    let head = match raw.get().starts_with('{') {
        true => serde_json::from_str::<Head<'_>>(raw.get()).ok(),
        false => None,
    };
    let Some(head) = head else {
        return collect(value_of(raw, path)?, path, printing, out);
    };
    let kind = head.kind.as_deref().unwrap_or_default();
    if let (true, Some(items)) = (kind.ends_with("List"), &head.items) {
        return collect_items(items, path, printing, out);
    }
    let typed = match (head.api.as_deref().unwrap_or_default(), kind) {
        ("v1", "Service") => typed(raw).map(|s| Object::Service(Box::new(s))),
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            typed(raw).map(|s| Object::EndpointSlice(Box::new(s)))
        }
        ("v1", "Node") => typed(raw).map(|n| Object::Node(Box::new(n))),
        ("networking.k8s.io/v1", "ServiceCIDR") => {
            typed(raw).map(|c| Object::ServiceCidr(Box::new(c)))
        }
        // The `Value` way gives it v1's apiVersion.
        ("networking.k8s.io/v1beta1", "ServiceCIDR") => None,
        _ if tracing::enabled!(tracing::Level::DEBUG) => None,
        _ => return Ok(()),
    };
    match typed {
        Some(o) => {
            out(o, printing.then(|| Print::of_text(raw.get())));
            Ok(())
        }
        None => collect(value_of(raw, path)?, path, printing, out),
    }
}

/// How many of a list's items one thread decodes at a time.
const CHUNK: usize = 256;

/// A list's items, each through [`collect_raw`], on two threads ([`turns::in_order`]): the
/// objects are handed on in the list's order, and on an error, `out` has had those before
/// it, as decoding in one thread would. Decoding the items of a 10k-service list was a
/// quarter of `sync --once`'s CPU time (perf); on two threads (in fixed turns then) the
/// command took 444 to 470 ms, against 502 to 569 ms on one, alternating in one run.
fn collect_items(
    items: &[&RawValue],
    path: &Path,
    printing: bool,
    out: Sink<'_>,
) -> Result<(), ManifestError> {
    // One chunk's objects straight to `out`: a chunk's are collected before they are handed
    // on, and a list nested in a short one would otherwise stand in memory whole.
    if items.len() <= CHUNK {
        return items
            .iter()
            .try_for_each(|item| collect_raw(item, path, printing, out));
    }
    let chunks: Vec<&[&RawValue]> = items.chunks(CHUNK).collect();
    turns::in_order(
        &chunks,
        |chunk| {
            let mut objects = Vec::with_capacity(chunk.len());
            let result = chunk.iter().try_for_each(|item| {
                collect_raw(item, path, printing, &mut |o, p| objects.push((o, p)))
            });
            let failed = result.is_err();
            ((objects, result), failed)
        },
        |(objects, result)| {
            for (o, p) in objects {
                out(o, p);
            }
            result
        },
    )
}

/// `raw` decoded into `T`, or `None` for the `Value` way to say why not.
fn typed<T: serde::de::DeserializeOwned>(raw: &RawValue) -> Option<T> {
    serde_json::from_str(raw.get()).ok()
}

/// `raw` as a tree. Its document was checked as a tree already ([`Checked`]), so this does
/// not fail; the error is kept for the type's sake.
fn value_of(raw: &RawValue, path: &Path) -> Result<serde_json::Value, ManifestError> {
    serde_json::from_str(raw.get()).map_err(|e| ManifestError::Syntax {
        path: path.to_path_buf(),
        doc: 1,
        message: e.to_string(),
    })
}
