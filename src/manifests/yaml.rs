//! YAML manifests: plain block YAML (as kubectl and Helm print it) read by
//! [`super::plain_yaml`], anything else parsed by serde-saphyr within [`yaml_options`]' limits;
//! either way each document is decoded into objects as it is read, and a `List`'s items each
//! decoded as it is reached, so that a `kubectl get -o yaml` dump (one `List` document holding
//! the whole cluster) never stands in memory as one tree.

use super::{decode_all, ManifestError, Object, Print, Sink, Undecodable};
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;
use std::path::Path;

/// [`parse_yaml`] by serde-saphyr alone.
pub(super) fn saphyr<const PRINTING: bool>(
    text: &str,
    path: &Path,
    options: serde_saphyr::Options,
) -> Result<Decoded<PRINTING>, ManifestError> {
    serde_saphyr::from_str_multiple_with_options::<Doc<PRINTING>, _>(text, options).map_err(|e| {
        ManifestError::Syntax {
            path: path.to_path_buf(),
            doc: e.location().map_or(1, |l| {
                document_at(text, usize::try_from(l.line()).unwrap_or(usize::MAX))
            }),
            message: yaml_message(&e),
        }
    })
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
pub(super) fn yaml_options() -> serde_saphyr::Options {
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
pub(super) fn document_at(text: &str, line: usize) -> usize {
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
pub(super) struct Decoded<const PRINTING: bool> {
    /// Each with its print when `PRINTING`: YAML's text is gone once parsed, so the tree is
    /// printed here.
    pub(super) objects: Vec<(Object, Option<Print>)>,
    /// (apiVersion, kind, name) of objects of kinds we do not read.
    pub(super) ignored: Vec<(String, String, String)>,
    pub(super) error: Option<Undecodable>,
}

impl<const PRINTING: bool> Extend<Doc<PRINTING>> for Decoded<PRINTING> {
    fn extend<I: IntoIterator<Item = Doc<PRINTING>>>(&mut self, docs: I) {
        for doc in docs {
            if self.error.is_some() {
                continue;
            }
            let tree = match doc {
                Doc::Null => continue,
                // A scalar or a sequence, read as a stand-in scalar: `decode_all` notes it
                // among the ignored (no kind, no name), as it did the document's own tree.
                Doc::Other => Value::Bool(false),
                Doc::Map { mut rest, items } => match items {
                    Some(Items::Decoded(items)) if is_list(&rest) => {
                        self.objects.extend(items.objects);
                        self.ignored.extend(items.ignored);
                        self.error = items.error;
                        continue;
                    }
                    // Not a list: its `items` were no field of any object we read.
                    Some(Items::Decoded(_)) => {
                        rest.insert("items".into(), Value::Array(Vec::new()));
                        Value::Object(rest)
                    }
                    Some(Items::Tree(tree)) => {
                        rest.insert("items".into(), tree);
                        Value::Object(rest)
                    }
                    None => Value::Object(rest),
                },
            };
            let objects = &mut self.objects;
            let mut each = |o, print| objects.push((o, print));
            if let Err(e) = decode_all(tree, PRINTING, &mut each, &mut self.ignored) {
                self.error = Some(e);
            }
        }
    }
}

/// Whether a document with `items` is a list of objects, as [`decode_all`] tells one.
pub(super) fn is_list(rest: &Map<String, Value>) -> bool {
    rest.get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k.ends_with("List"))
}

/// One YAML document. A mapping's `items`, when a sequence, are decoded into objects one at
/// a time as the parser reaches each (kubectl prints a `List`'s `items` before its `kind`,
/// so they are decoded before it is known to be one); its other keys are kept as trees.
pub(super) enum Doc<const PRINTING: bool> {
    Null,
    /// A scalar or a sequence: no object ([`decode_all`] ignores it).
    Other,
    Map {
        rest: Map<String, Value>,
        items: Option<Items>,
    },
}

/// A mapping's `items`.
pub(super) enum Items {
    /// A sequence, decoded item by item.
    Decoded(Listed),
    /// Anything else, as its tree.
    Tree(Value),
}

/// The objects of a sequence of items, as [`decode_all`] decodes a list's.
#[derive(Default)]
pub(super) struct Listed {
    objects: Vec<(Object, Option<Print>)>,
    ignored: Vec<(String, String, String)>,
    /// The first item that did not decode; the items after it are parsed, not decoded (those
    /// of later chunks read on another thread are decoded and dropped, [`Listed::follow`]).
    error: Option<Undecodable>,
}

impl Listed {
    /// Decode one of a list's items, unless an earlier one failed (the items after it are
    /// parsed, not decoded).
    pub(super) fn add(&mut self, item: Value, printing: bool) {
        if self.error.is_some() {
            return;
        }
        let objects = &mut self.objects;
        let mut each = |o, print| objects.push((o, print));
        if let Err(e) = decode_all(item, printing, &mut each, &mut self.ignored) {
            self.error = Some(e);
        }
    }

    /// The items of `later`, decoded as [`Listed::add`] decoded them, added after this one's:
    /// its objects handed to `each`, unless an earlier item failed.
    pub(super) fn follow(&mut self, later: Listed, each: Sink<'_>) {
        if self.error.is_some() {
            return;
        }
        for (o, print) in later.objects {
            each(o, print);
        }
        self.ignored.extend(later.ignored);
        self.error = later.error;
    }
}

impl<'de, const PRINTING: bool> serde::Deserialize<'de> for Doc<PRINTING> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DocVisitor::<PRINTING>)
    }
}

struct DocVisitor<const PRINTING: bool>;

impl<'de, const PRINTING: bool> Visitor<'de> for DocVisitor<PRINTING> {
    type Value = Doc<PRINTING>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML document")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut rest, mut items) = (Map::new(), None);
        while let Some(key) = map.next_key::<String>()? {
            if key == "items" {
                items = Some(map.next_value_seed(ItemsSeed::<PRINTING>)?);
            } else {
                rest.insert(key, map.next_value::<Value>()?);
            }
        }
        Ok(Doc::Map { rest, items })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        // Read as trees, not skipped: the parser refuses in a tree what skipping would let
        // by (a null or a sequence as a key), as the whole document's tree did.
        while seq.next_element::<Value>()?.is_some() {}
        Ok(Doc::Other)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Doc::Null)
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Doc::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Doc::Other)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Doc::Other)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Doc::Other)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Doc::Other)
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Doc::Other)
    }

    fn visit_i128<E>(self, _: i128) -> Result<Self::Value, E> {
        Ok(Doc::Other)
    }

    fn visit_u128<E>(self, _: u128) -> Result<Self::Value, E> {
        Ok(Doc::Other)
    }
}

/// Reads a mapping's `items`: a sequence item by item, anything else as a tree.
struct ItemsSeed<const PRINTING: bool>;

impl<'de, const PRINTING: bool> DeserializeSeed<'de> for ItemsSeed<PRINTING> {
    type Value = Items;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Items, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, const PRINTING: bool> Visitor<'de> for ItemsSeed<PRINTING> {
    type Value = Items;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list's items")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Items, A::Error> {
        let mut listed = Listed::default();
        while let Some(item) = seq.next_element::<Value>()? {
            listed.add(item, PRINTING);
        }
        Ok(Items::Decoded(listed))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Items, A::Error> {
        let tree =
            serde::Deserialize::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
        Ok(Items::Tree(tree))
    }

    fn visit_unit<E>(self) -> Result<Items, E> {
        Ok(Items::Tree(Value::Null))
    }

    fn visit_none<E>(self) -> Result<Items, E> {
        Ok(Items::Tree(Value::Null))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Items, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Items, E> {
        Ok(Items::Tree(Value::Bool(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Items, E> {
        Ok(Items::Tree(Value::from(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Items, E> {
        Ok(Items::Tree(Value::from(v)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Items, E> {
        Ok(Items::Tree(
            serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number),
        ))
    }

    fn visit_str<E>(self, v: &str) -> Result<Items, E> {
        Ok(Items::Tree(Value::String(v.to_string())))
    }

    // Past 64 bits: no field of any object we read, so only its print needs a value.
    fn visit_i128<E: serde::de::Error>(self, v: i128) -> Result<Items, E> {
        self.visit_f64(v as f64)
    }

    fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Items, E> {
        self.visit_f64(v as f64)
    }
}
