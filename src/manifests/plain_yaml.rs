//! A fast reader for the plain block YAML that `kubectl get -o yaml` and Helm print: block
//! mappings and sequences, plain, quoted and `|` literal scalars. Anything else, or anything
//! it is not sure a YAML parser reads as it would, makes it give up ([`Bail`]) and the file
//! goes to serde-saphyr whole, which then decides (and reports any error).
//!
//! serde-saphyr reads about 7 MB/s here: reading, parsing and decoding a 100k-service dump of
//! 133 MB took 19.5 of the 21.7 s of a cold `sync --once`. This reader goes line by line with
//! no events or tokens between the text and the tree.

use super::turns;
use super::yaml::{is_list, Decoded, Doc, Items, Listed};
use super::Sink;
use serde_json::{Map, Value};

/// Why the reader gave up, and on which 1-based line.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Bail {
    pub line: usize,
    pub why: &'static str,
}

/// Nesting beyond this goes to serde-saphyr, whose limit (64) then reports it.
const MAX_DEPTH: usize = 60;

/// The documents of `text` decoded as [`super::yaml`]'s serde-saphyr path decodes them, each
/// object handed to `each` as soon as it is known to be one (the returned `Decoded` holds
/// none), or where and why it gave up.
///
/// A list's items are objects only once its `kind` says it is a list, which kubectl prints
/// after them: such items are skipped over to find where they end (a look at each line's
/// indentation), then read and decoded, so that a dump never stands in memory as objects.
pub(super) fn read<const PRINTING: bool>(
    text: &str,
    each: Sink<'_>,
) -> Result<Decoded<PRINTING>, Bail> {
    let mut decoded = Decoded::<PRINTING>::default();
    Reader::new(text).documents::<PRINTING>(&mut decoded, each)?;
    Ok(decoded)
}

/// Every document as its tree (a list's items included), for comparing with serde-saphyr.
#[cfg(test)]
pub(super) fn trees(text: &str) -> Result<Vec<Value>, Bail> {
    let mut r = Reader::new(text);
    let mut out = Vec::new();
    while let Some(l) = r.peek()? {
        if l.marker {
            r.next();
            if r.peek()?.is_none_or(|n| n.marker) {
                out.push(Value::Null);
            }
            continue;
        }
        if l.indent != 0 {
            return Err(r.bail(l.no, "a document indented"));
        }
        out.push(r.block(0, 0)?);
        r.end_of_document()?;
    }
    Ok(out)
}

#[derive(Clone, Copy)]
struct Line<'a> {
    indent: usize,
    /// After the indentation, trailing spaces trimmed.
    body: &'a str,
    no: usize,
    /// `---` alone: a document starts.
    marker: bool,
    /// Where the line starts in the text.
    start: usize,
}

impl Line<'_> {
    fn is_entry(&self) -> bool {
        !self.marker && (self.body == "-" || self.body.starts_with("- "))
    }
}

struct Reader<'a> {
    text: &'a str,
    /// Where the next unread line starts.
    pos: usize,
    /// 1-based number of the line at `pos`.
    no: usize,
    peeked: Option<Line<'a>>,
}

impl<'a> Reader<'a> {
    fn new(text: &'a str) -> Self {
        Reader {
            text,
            pos: 0,
            no: 1,
            peeked: None,
        }
    }

    fn bail(&self, line: usize, why: &'static str) -> Bail {
        Bail { line, why }
    }

    /// The next line at `pos`, unconsumed, as it stands.
    fn raw(&self) -> Option<(&'a str, usize)> {
        if self.pos >= self.text.len() {
            return None;
        }
        let rest = &self.text[self.pos..];
        let len = rest.find('\n').unwrap_or(rest.len());
        Some((&rest[..len], (len + 1).min(rest.len())))
    }

    fn advance(&mut self, by: usize) {
        self.pos += by;
        self.no += 1;
    }

    /// The next line with content (blank and comment lines skipped), unconsumed.
    fn peek(&mut self) -> Result<Option<Line<'a>>, Bail> {
        if let Some(l) = self.peeked {
            return Ok(Some(l));
        }
        while let Some((raw, len)) = self.raw() {
            let (no, start) = (self.no, self.pos);
            if raw.contains('\r') || (no == 1 && raw.starts_with('\u{feff}')) {
                return Err(self.bail(no, "a carriage return or byte-order mark"));
            }
            let body = raw.trim_start_matches(' ');
            let indent = raw.len() - body.len();
            let body = body.trim_end_matches(' ');
            self.advance(len);
            if body.is_empty() || body.starts_with('#') {
                continue;
            }
            if body.starts_with('\t') || body.ends_with('\t') {
                return Err(self.bail(no, "a tab"));
            }
            let marker = indent == 0 && body == "---";
            if indent == 0
                && (body.starts_with("---") || body.starts_with("...") || body.starts_with('%'))
                && !marker
            {
                return Err(self.bail(no, "a document marker with content, or a directive"));
            }
            let line = Line {
                indent,
                body,
                no,
                marker,
                start,
            };
            self.peeked = Some(line);
            return Ok(Some(line));
        }
        Ok(None)
    }

    fn next(&mut self) {
        self.peeked = None;
    }

    /// Each document into `decoded`, its objects handed to `each`.
    fn documents<const P: bool>(
        &mut self,
        decoded: &mut Decoded<P>,
        each: Sink<'_>,
    ) -> Result<(), Bail> {
        while let Some(l) = self.peek()? {
            if l.marker {
                self.next();
                continue;
            }
            if l.indent != 0 {
                return Err(self.bail(l.no, "a document indented"));
            }
            let doc = if l.is_entry() {
                self.seq(0, 0, &mut |_| {})?;
                Doc::Other
            } else {
                // After a decode error later documents are read, not decoded, as
                // `Decoded` does with serde-saphyr's.
                let decoding = decoded.error.is_none();
                let (rest, items) = self.top_map::<P>(each, decoding)?;
                Doc::Map { rest, items }
            };
            self.end_of_document()?;
            decoded.extend(std::iter::once(doc));
            for (o, print) in decoded.objects.drain(..) {
                each(o, print);
            }
        }
        Ok(())
    }

    /// After a document's root: the file ends or another document starts.
    fn end_of_document(&mut self) -> Result<(), Bail> {
        match self.peek()? {
            Some(l) if !l.marker => Err(self.bail(l.no, "content after a document's root")),
            _ => Ok(()),
        }
    }

    /// A node nested under a line indented `parent`: a block more indented, or null.
    fn nested(&mut self, parent: usize, depth: usize) -> Result<Value, Bail> {
        match self.peek()? {
            Some(l) if !l.marker && l.indent > parent => self.block(l.indent, depth),
            _ => Ok(Value::Null),
        }
    }

    /// The block mapping or sequence whose first line, indented `indent`, is next.
    fn block(&mut self, indent: usize, depth: usize) -> Result<Value, Bail> {
        let Some(l) = self.peek()? else {
            return Ok(Value::Null);
        };
        if depth > MAX_DEPTH {
            return Err(self.bail(l.no, "nested deeper than this reader goes"));
        }
        if l.is_entry() {
            let mut items = Vec::new();
            self.seq(indent, depth, &mut |v| items.push(v))?;
            Ok(Value::Array(items))
        } else {
            Ok(Value::Object(self.map(indent, depth)?))
        }
    }

    /// The value after `key:` on a line indented `indent`: `rest` when not empty, else a
    /// sequence at the same indentation (as kubectl prints a mapping's sequences) or a
    /// nested block.
    fn value(&mut self, rest: &str, indent: usize, depth: usize) -> Result<Value, Bail> {
        if !rest.is_empty() {
            return self.scalar(rest, indent);
        }
        match self.peek()? {
            Some(n) if n.indent == indent && n.is_entry() => {
                let mut items = Vec::new();
                self.seq(indent, depth + 1, &mut |v| items.push(v))?;
                Ok(Value::Array(items))
            }
            _ => self.nested(indent, depth + 1),
        }
    }

    fn map(&mut self, indent: usize, depth: usize) -> Result<Map<String, Value>, Bail> {
        let mut out = Map::new();
        while let Some((no, key, rest)) = self.entry(indent)? {
            let v = self.value(rest, indent, depth)?;
            if out.insert(key.to_string(), v).is_some() {
                return Err(self.bail(no, "a duplicate key"));
            }
        }
        Ok(out)
    }

    /// A document's root mapping, its `items` (when a sequence) decoded item by item as
    /// [`super::yaml`]'s `ItemsSeed` does, each handed to `each` once the document is known
    /// to be a list.
    fn top_map<const P: bool>(
        &mut self,
        each: Sink<'_>,
        decoding: bool,
    ) -> Result<(Map<String, Value>, Option<Items>), Bail> {
        let (mut rest, mut items, mut later) = (Map::new(), None, None);
        while let Some((no, key, after)) = self.entry(0)? {
            if key != "items" {
                let v = self.value(after, 0, 0)?;
                if rest.insert(key.to_string(), v).is_some() {
                    return Err(self.bail(no, "a duplicate key"));
                }
                continue;
            }
            if items.is_some() || later.is_some() {
                return Err(self.bail(no, "a duplicate key"));
            }
            let first = match self.peek()? {
                Some(n) if after.is_empty() && !n.marker && n.is_entry() => Some(n),
                _ => None,
            };
            items = Some(match (after, first) {
                ("[]", _) => Items::Decoded(Listed::default()),
                ("", Some(first)) => {
                    let spans = self.skip_items(first);
                    if !rest.contains_key("kind") {
                        // Read below, once the rest says whether the document is a list.
                        later = Some(spans);
                        continue;
                    }
                    let list = decoding && is_list(&rest);
                    Items::Decoded(read_items::<P>(self.text, &spans, list, each)?)
                }
                _ => Items::Tree(self.value(after, 0, 0)?),
            });
        }
        if let Some(spans) = later {
            let list = decoding && is_list(&rest);
            items = Some(Items::Decoded(read_items::<P>(
                self.text, &spans, list, each,
            )?));
        }
        Ok((rest, items))
    }

    /// Past the entries of the sequence whose first line is `first`, to the line after
    /// them, without reading them: where they end, in chunks of [`CHUNK`] entries, for
    /// [`read_items`]. Everything inside an entry is indented more than its dash (a literal
    /// block's text included), so the first line with content indented as little that is
    /// not another entry ends them; where the entries do not read as plain YAML,
    /// [`read_items`] gives up.
    fn skip_items(&mut self, first: Line<'a>) -> Spans {
        let (mut at, mut no) = (first.start, first.no);
        let (mut chunks, mut start, mut count) = (Vec::new(), (at, no), 0);
        while let Some(rest) = self.text.get(at..).filter(|r| !r.is_empty()) {
            let len = rest.find('\n').unwrap_or(rest.len());
            let line = &rest[..len];
            let body = line.trim_start_matches(' ');
            let indent = line.len() - body.len();
            if indent <= first.indent {
                let body = body.trim_end_matches(' ');
                if !body.is_empty() && !body.starts_with('#') {
                    let entry = body == "-" || body.starts_with("- ");
                    if indent < first.indent || !entry {
                        break;
                    }
                    if count > 0 && count % CHUNK == 0 {
                        chunks.push(Span {
                            start: start.0,
                            end: at,
                            no: start.1,
                        });
                        start = (at, no);
                    }
                    count += 1;
                }
            }
            at += (len + 1).min(rest.len());
            no += 1;
        }
        chunks.push(Span {
            start: start.0,
            end: at,
            no: start.1,
        });
        (self.pos, self.no, self.peeked) = (at, no, None);
        Spans {
            indent: first.indent,
            chunks,
        }
    }

    /// The next `key: rest` line of a mapping indented `indent`, consumed; `None` where the
    /// mapping ends.
    fn entry(&mut self, indent: usize) -> Result<Option<(usize, &'a str, &'a str)>, Bail> {
        let Some(l) = self.peek()? else {
            return Ok(None);
        };
        if l.marker || l.indent < indent {
            return Ok(None);
        }
        if l.indent > indent {
            return Err(self.bail(l.no, "a line indented more than its mapping"));
        }
        if l.is_entry() {
            // A sequence entry where a mapping's key belongs: the parent's compact
            // sequence ended the mapping, or the input is malformed.
            return Ok(None);
        }
        let (key, rest) = split_key(l.body).ok_or_else(|| self.bail(l.no, "not a plain key"))?;
        self.next();
        Ok(Some((l.no, key, rest)))
    }

    /// The entries of a sequence indented `indent`, each handed to `each`.
    fn seq(
        &mut self,
        indent: usize,
        depth: usize,
        each: &mut dyn FnMut(Value),
    ) -> Result<(), Bail> {
        loop {
            let Some(l) = self.peek()? else {
                return Ok(());
            };
            if l.marker || l.indent < indent || !l.is_entry() {
                if l.indent > indent && !l.marker {
                    return Err(self.bail(l.no, "a line indented more than its sequence"));
                }
                return Ok(());
            }
            if l.indent > indent {
                return Err(self.bail(l.no, "a line indented more than its sequence"));
            }
            if depth > MAX_DEPTH {
                return Err(self.bail(l.no, "nested deeper than this reader goes"));
            }
            self.next();
            let after = &l.body[1..];
            let item = after.trim_start_matches(' ');
            let at = indent + 1 + (after.len() - item.len());
            let v = if item.is_empty() {
                self.nested(indent, depth + 1)?
            } else if item == "-" || item.starts_with("- ") {
                return Err(self.bail(l.no, "a sequence inside a sequence's entry"));
            } else if split_key(item).is_some() {
                // `- key: value`: a mapping whose keys line up with this one.
                self.peeked = Some(Line {
                    indent: at,
                    body: item,
                    no: l.no,
                    marker: false,
                    start: l.start,
                });
                Value::Object(self.map(at, depth + 1)?)
            } else {
                self.scalar(item, indent)?
            };
            each(v);
        }
    }

    /// A scalar written after a key or a sequence's dash on a line indented `parent`.
    fn scalar(&mut self, s: &str, parent: usize) -> Result<Value, Bail> {
        let no = self.no - 1;
        let v = match s.as_bytes()[0] {
            b'\'' => single_quoted(s).map(Value::String),
            b'"' => double_quoted(s).map(Value::String),
            b'|' => return self.literal(s, parent, no),
            b'{' => (s == "{}").then(|| Value::Object(Map::new())),
            b'[' => (s == "[]").then(|| Value::Array(Vec::new())),
            _ => plain(s),
        };
        v.ok_or_else(|| self.bail(no, "a scalar this reader does not resolve"))
    }

    /// A `|` or `|-` literal block whose content is indented more than `parent`.
    fn literal(&mut self, header: &str, parent: usize, no: usize) -> Result<Value, Bail> {
        let strip = match header {
            "|" => false,
            "|-" => true,
            _ => return Err(self.bail(no, "a block scalar header other than | or |-")),
        };
        if self.peeked.is_some() {
            return Err(self.bail(no, "a block scalar after a line already read"));
        }
        let (mut text, mut width, mut blanks) = (String::new(), None, 0);
        while let Some((raw, len)) = self.raw() {
            let body = raw.trim_start_matches(' ');
            let indent = raw.len() - body.len();
            if raw.contains('\r') {
                return Err(self.bail(self.no, "a carriage return"));
            }
            if body.is_empty() {
                // An empty line inside the block, unless the block ends before more text.
                if width.is_none_or(|w| indent > w) {
                    return Err(self.bail(self.no, "a blank line this reader does not place"));
                }
                blanks += 1;
                self.advance(len);
                continue;
            }
            let w = *width.get_or_insert(indent);
            if indent < w {
                break;
            }
            if w <= parent || body.starts_with('\t') {
                return Err(self.bail(self.no, "a block scalar's indentation"));
            }
            if !text.is_empty() {
                text.push('\n');
            }
            for _ in 0..blanks {
                text.push('\n');
            }
            blanks = 0;
            text.push_str(&raw[w..]);
            self.advance(len);
        }
        if width.is_none() {
            return Err(self.bail(no, "an empty block scalar"));
        }
        // Clipped, the text ends in one line break even at the end of a file without one,
        // as serde-saphyr reads it.
        if !strip {
            text.push('\n');
        }
        Ok(Value::String(text))
    }
}

/// How many of a list's entries one thread reads at a time.
const CHUNK: usize = 256;

/// A list's entries, as [`Reader::skip_items`] found them.
struct Spans {
    /// Of their dashes.
    indent: usize,
    chunks: Vec<Span>,
}

/// A chunk of a list's entries: where in the text, and the 1-based number of its first line.
struct Span {
    start: usize,
    end: usize,
    no: usize,
}

/// The entries of `spans` read as [`Reader::seq`] reads them and, when `list`, decoded as
/// [`Listed::add`] does, on two threads ([`turns::in_order`]): the objects reach `each` in
/// the list's order, and none after the first item that does not decode. Reading a
/// 100k-service dump's entries twice on one thread (once to find their end, once to decode
/// them) was most of the time the plain reader took.
fn read_items<const P: bool>(
    text: &str,
    spans: &Spans,
    list: bool,
    each: Sink<'_>,
) -> Result<Listed, Bail> {
    let mut listed = Listed::default();
    turns::in_order(
        &spans.chunks,
        |span| {
            let mut r = Reader {
                text: &text[..span.end],
                pos: span.start,
                no: span.no,
                peeked: None,
            };
            let mut theirs = Listed::default();
            let mut result = r.seq(spans.indent, 1, &mut |item| {
                if list {
                    theirs.add(item, P);
                }
            });
            // `skip_items` and `seq` agree on where entries end; should they not, give up.
            if result.is_ok() {
                result = match r.peek() {
                    Ok(Some(l)) => Err(r.bail(l.no, "a sequence's entries ending early")),
                    after => after.map(|_| ()),
                };
            }
            let failed = result.is_err();
            ((theirs, result), failed)
        },
        |(theirs, result)| {
            listed.follow(theirs, each);
            result
        },
    )?;
    Ok(listed)
}

/// `key: rest` or `key:` with a plain key that reads as a string in any YAML schema.
fn split_key(body: &str) -> Option<(&str, &str)> {
    let end = body
        .bytes()
        .position(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'/' | b'-')))?;
    let (key, after) = body.split_at(end);
    let rest = after.strip_prefix(':')?;
    let rest = match rest.strip_prefix(' ') {
        Some(r) => r.trim_start_matches(' '),
        None if rest.is_empty() => rest,
        None => return None,
    };
    let first = *key.as_bytes().first()?;
    (first.is_ascii_alphabetic() || first == b'_')
        .then_some(())
        .filter(|()| !ambiguous_word(key))?;
    Some((key, rest))
}

/// Words some YAML schema reads as a boolean or null.
fn ambiguous_word(s: &str) -> bool {
    if s.len() > 5 {
        return false;
    }
    const WORDS: [&str; 11] = [
        "true", "false", "null", "yes", "no", "on", "off", "y", "n", "~", "",
    ];
    WORDS.iter().any(|w| w.eq_ignore_ascii_case(s))
}

/// A plain scalar as YAML 1.2's core schema (and serde-saphyr with [`super::yaml_options`])
/// reads it, where that is certain: `true`, `false`, `null`, `~`, decimal integers that fit in
/// 64 bits, and strings that no schema reads as anything else.
fn plain(s: &str) -> Option<Value> {
    match s {
        "true" => return Some(Value::Bool(true)),
        "false" => return Some(Value::Bool(false)),
        "null" | "~" => return Some(Value::Null),
        _ => {}
    }
    let digits = s.strip_prefix('-').unwrap_or(s);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        if digits.starts_with('0') && s != "0" {
            return None; // leading zeros, `-0`
        }
        return s.parse::<i64>().ok().map(Value::from);
    }
    let first = s.as_bytes()[0];
    let indicator = b"-?:,[]{}#&*!|>'\"%@`+.".contains(&first);
    let unsure = indicator
        || ambiguous_word(s)
        || s.contains(": ")
        || s.ends_with(':')
        || s.contains(" #")
        || s.contains('\t')
        || float_like(s);
    (!unsure).then(|| Value::String(s.to_string()))
}

/// Whether `s` could be a number in some YAML schema: digits with at most one dot and an
/// exponent, underscores, or a base prefix. Dotted quads and dates are not.
fn float_like(s: &str) -> bool {
    let b = s.as_bytes();
    if !b[0].is_ascii_digit() {
        return false;
    }
    if b[0] == b'0' && s.len() > 1 && matches!(b[1], b'x' | b'X' | b'o' | b'O' | b'b' | b'B') {
        return true;
    }
    let dots = b.iter().filter(|&&c| c == b'.').count();
    b.iter()
        .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'e' | b'E' | b'+' | b'-'))
        && dots <= 1
        || s.contains('_') && b.iter().all(|c| c.is_ascii_digit() || *c == b'_')
}

/// `'...'` ending the line, with `''` for a quote.
fn single_quoted(s: &str) -> Option<String> {
    let inner = s.strip_prefix('\'')?.strip_suffix('\'')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\'' && chars.next() != Some('\'') {
            return None;
        }
        out.push(c);
    }
    Some(out)
}

/// `"..."` ending the line, with the common escapes.
fn double_quoted(s: &str) -> Option<String> {
    let inner = s.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return None,
            '\\' => out.push(match chars.next()? {
                '\\' => '\\',
                '"' => '"',
                '/' => '/',
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    let four = hex.len() == 4 && hex.bytes().all(|b| b.is_ascii_hexdigit());
                    let code = u32::from_str_radix(&hex, 16).ok().filter(|_| four)?;
                    char::from_u32(code)?
                }
                _ => return None,
            }),
            c => out.push(c),
        }
    }
    Some(out)
}

#[cfg(test)]
#[path = "plain_yaml_tests.rs"]
mod tests;
