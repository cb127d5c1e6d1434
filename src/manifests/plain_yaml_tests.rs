use super::super::yaml_options;
use super::*;

/// serde-saphyr's trees for `text`, as the slow path reads it.
fn saphyr_trees(text: &str) -> Vec<Value> {
    serde_saphyr::from_str_multiple_with_options::<Value, _>(text, yaml_options())
        .unwrap_or_else(|e| panic!("serde-saphyr refused {text:?}: {e}"))
}

/// Where the plain reader reads `text`, it reads what serde-saphyr reads.
fn agrees(text: &str) -> bool {
    match trees(text) {
        Ok(fast) => {
            assert_eq!(fast, saphyr_trees(text), "the readers differ on {text:?}");
            true
        }
        Err(_) => false,
    }
}

#[test]
fn scalars_it_reads_are_read_as_serde_saphyr_reads_them() {
    let read = [
        "80",
        "-5",
        "0",
        "9223372036854775807",
        "true",
        "false",
        "null",
        "~",
        "10.0.0.1",
        "fd00::1",
        "172.16.0.0/16",
        "svc-0",
        "node-12",
        "6b1c2f4e-0000-4000-8000-000000000001",
        "a#b",
        "2001:db8::1",
        "12:30",
        "http://example.com/x",
        "discovery.k8s.io/v1",
        "ClusterIP",
        "TCP",
        "80/TCP",
        "a b c",
        "<none>",
        "'quoted'",
        "'it''s'",
        "''",
        "\"double\"",
        "\"\"",
        "\"a\\\"b\\\\c\\n\\t\\u00e9\"",
        "\"2026-12-01T10:00:00Z\"",
        "{}",
        "[]",
    ];
    for s in read {
        assert!(agrees(&format!("k: {s}\n")), "{s:?} went to serde-saphyr");
    }
    // Each either read alike or left to serde-saphyr; these are left to it.
    let left = [
        "1.5",
        "1e5",
        "0x1F",
        "0o17",
        "012",
        "-0",
        "+1",
        "1_000",
        ".5",
        "5.",
        ".inf",
        "-.inf",
        ".nan",
        "True",
        "FALSE",
        "Null",
        "yes",
        "no",
        "on",
        "off",
        "y",
        "2026-12-01",
        "18446744073709551615",
        "99999999999999999999",
        "-foo",
        "fd00::",
        "a: b",
        "a #comment",
        "'open",
        "'a' #c",
        "\"a\\x41\"",
        "\"\\u+0e9\"",
        "{a: 1}",
        "[1, 2]",
        "&anchor x",
        "*alias",
        "!tag x",
        "@x",
        "`x",
        "%x",
        "|+",
        ">",
    ];
    for s in left {
        let text = format!("k: {s}\n");
        assert!(trees(&text).is_err(), "{s:?} was read by the plain reader");
    }
}

#[test]
fn structures_as_kubectl_prints_them_are_read_as_serde_saphyr_reads_them() {
    let read = [
        // kubectl's sequences at the mapping's indentation, entries that are mappings
        "apiVersion: v1\nitems:\n- kind: Service\n  metadata:\n    name: a\n  spec:\n    ports:\n    - port: 80\n      protocol: TCP\n    - port: 81\nkind: List\n",
        // sequences indented under their key, scalars, nested sequences of mappings
        "a:\n  - 1\n  - x\n  -\n    b: 2\n  - c:\n      - d\nb: end\n",
        // an empty value, then a nested one
        "a:\nb:\n  c:\nd: 1\n",
        // an entry that is null, then more
        "s:\n-\n- 2\n",
        // comments and blank lines anywhere a line starts
        "# head\na: 1\n\n  # indented comment\nb:\n\n  c: 2\n",
        // literal blocks, clipped and stripped, with inner blank and deeper lines
        "a: |\n  {\"x\": 1}\nb: |-\n  one\n\n    two\n  three\nc: 1\n",
        "- |\n  in a sequence\n- x\n",
        "m:\n- k: |-\n    v\n  j: 2\n",
        // a literal block at the end of a file without a final line break, clipped and kept
        "a: |\n  x",
        "a: |-\n  x",
        // more than one document
        "a: 1\n---\nb: 2\n",
        "---\na: 1\n---\n- 1\n- 2\n",
        // spaces after the dash or the colon
        "-   a: 1\n    b: 2\n-  x\n",
        "a:    1\n",
        // trailing spaces
        "a: 1   \nb:   \n",
        // keys with dots, slashes and dashes
        "labels:\n  kubernetes.io/service-name: svc\n  app.kubernetes.io/part-of: x\n  a_b-c: 1\n",
    ];
    for text in read {
        assert!(agrees(text), "{text:?} went to serde-saphyr");
    }
    let left = [
        // flow collections, anchors, aliases, tags, merge keys, quoted or complex keys
        "a: {b: 1}\n",
        "a: &x 1\nb: *x\n",
        "a: !!str 1\n",
        "<<: {a: 1}\n",
        "'a': 1\n",
        "? a\n: 1\n",
        "1: a\n",
        "true: a\n",
        // multi-line plain scalars, folded blocks, keep chomping, explicit indentation
        "a: one\n  two\n",
        "a: >\n  x\n",
        "a: |+\n  x\n",
        "a: |2\n   x\n",
        // a sequence inside an entry, a document marker with content, directives, tabs
        "- - a\n",
        "--- a\n",
        "%YAML 1.2\n---\na: 1\n",
        "a:\n\tb: 1\n",
        "a: 1\r\n",
        "\u{feff}a: 1\n",
        // duplicate keys are serde-saphyr's to refuse
        "a: 1\na: 2\n",
        "items: []\nitems: []\n",
        // a root scalar, a document ended
        "just text\n",
        "a: 1\n...\n",
    ];
    for text in left {
        assert!(
            trees(text).is_err(),
            "{text:?} was read by the plain reader"
        );
        assert!(
            super::read::<false>(text, &mut |_, _| {}).is_err(),
            "{text:?} was read by the plain reader"
        );
    }
}

#[test]
fn malformed_input_is_left_to_serde_saphyr_naming_the_line() {
    for (text, line) in [
        ("a: 1\n  b: 2\n", 2),
        ("a:\n- 1\n  - 2\n", 3),
        ("a: 1\nb: [x\n", 2),
        ("a:\n  b: 1\n c: 2\n", 3),
        ("x: 1\nw:\n\tz: 1\n", 3),
    ] {
        let bail = trees(text).expect_err(text);
        assert_eq!(bail.line, line, "{text:?}: {}", bail.why);
        let decoded = read::<false>(text, &mut |_, _| {});
        assert_eq!(decoded.err().expect(text).line, line);
    }
    // A list's items are read in chunks of 256 on two threads: the line is still the
    // file's, in the first, second and third chunk (whichever thread read it),
    // with the kind before the items or after them.
    for bad_item in [3, 300, 600] {
        let items: String = (0..700)
            .map(|n| match n == bad_item {
                true => "- a: 1\n  b: [x\n".to_string(),
                false => format!("- a: {n}\n  b: x\n"),
            })
            .collect();
        for (text, head) in [
            (format!("items:\n{items}kind: List\n"), 1),
            (format!("kind: List\n# two\nitems:\n{items}"), 3),
        ] {
            let bail = read::<false>(&text, &mut |_, _| {})
                .err()
                .expect("a flow sequence");
            assert_eq!(bail.line, head + 2 * bad_item + 2, "item {bad_item}");
        }
    }
}

#[test]
fn nesting_past_the_readers_depth_goes_to_serde_saphyr() {
    let nest = |levels: usize| {
        let mut text = String::new();
        for d in 0..levels {
            text.push_str(&" ".repeat(d));
            text.push_str("k:\n");
        }
        text
    };
    assert!(agrees(&nest(MAX_DEPTH)));
    let bail = trees(&nest(MAX_DEPTH + 5)).expect_err("deep nesting");
    assert_eq!(bail.why, "nested deeper than this reader goes");
}
