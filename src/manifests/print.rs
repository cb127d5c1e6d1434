//! An object's print: a fingerprint of the text it was decoded from, so that a file read
//! again hands on only the objects whose text changed.

use std::hash::{DefaultHasher, Hasher};

/// Two SipHash sums of an object's text under different keys: two copies with the same
/// print were decoded from the same text (a chance collision of both is about 1 in 2^128).
/// Only compared within one process: the hash may change between Rust releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Print(u64, u64);

impl Print {
    /// The print of a JSON object's text as its file wrote it.
    pub fn of_text(text: &str) -> Print {
        let mut twin = Twin::new();
        twin.0.write(text.as_bytes());
        twin.1.write(text.as_bytes());
        twin.finish()
    }

    /// The print of a YAML document's object, by its tree written out as JSON: YAML's text
    /// is not kept past the parser.
    pub fn of_tree(tree: &serde_json::Value) -> Print {
        let mut twin = Twin::new();
        // Writing into a hasher does not fail, nor does writing out a tree.
        let _ = serde_json::to_writer(&mut twin, tree);
        twin.finish()
    }
}

struct Twin(DefaultHasher, DefaultHasher);

impl Twin {
    fn new() -> Twin {
        let mut second = DefaultHasher::new();
        second.write_u8(0x5a);
        Twin(DefaultHasher::new(), second)
    }

    fn finish(&self) -> Print {
        Print(self.0.finish(), self.1.finish())
    }
}

impl std::io::Write for Twin {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf);
        self.1.write(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
