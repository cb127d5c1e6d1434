use super::*;

/// The identity derived from the store's key is the one the files' duplicate check
/// uses, whatever the namespace says.
#[test]
fn an_identity_from_the_key_is_the_manifests_identity() {
    use k8s_openapi::api::core::v1::{Node, Service};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let meta = |ns: Option<&str>| ObjectMeta {
        name: Some("x".into()),
        namespace: ns.map(str::to_string),
        ..Default::default()
    };
    for ns in [None, Some(""), Some("default"), Some("other")] {
        for o in [
            Object::Service(Box::new(Service {
                metadata: meta(ns),
                ..Default::default()
            })),
            Object::Node(Box::new(Node {
                metadata: meta(ns),
                ..Default::default()
            })),
        ] {
            let (kind, ns, name) = Known::of(&o, Print::of_text("")).id();
            assert_eq!(
                (kind, ns.to_string(), name.to_string()),
                manifests::identity(&o),
                "{o:?}"
            );
        }
    }
}

fn svc(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{ name: {name}, namespace: ns }}\n\
         spec: {{ clusterIP: {ip}, ports: [{{ port: 80 }}] }}\n"
    )
}

/// The first read's events, collected, and the watcher.
fn initial(d: &Path) -> Result<(Vec<SourceEvent>, Watcher), ManifestError> {
    let mut events = Vec::new();
    let w = super::initial(d, &mut |e| events.push(e))?;
    Ok((events, w))
}

/// What a store holds after the events, as the store applies them: by kind and key; and
/// the keys named by the lists in progress.
#[derive(Default)]
struct View(
    BTreeMap<(Kind, ObjectKey), Object>,
    BTreeMap<Kind, BTreeSet<ObjectKey>>,
);

impl View {
    fn apply(&mut self, events: Vec<SourceEvent>) {
        for e in events {
            match e {
                SourceEvent::Replace(..) => panic!("the file source sends no whole lists"),
                SourceEvent::ListBegin(kind) => {
                    self.1.insert(kind, BTreeSet::new());
                }
                SourceEvent::Listed(o) => {
                    let kind = store::kind_of(&o);
                    let listing = self.1.get_mut(&kind).expect("a list was begun");
                    listing.insert(store::object_key(&o));
                    self.0.insert((kind, store::object_key(&o)), o);
                }
                SourceEvent::ListEnd(kind) => {
                    let named = self.1.remove(&kind).expect("a list was begun");
                    self.0
                        .retain(|(k, key), _| *k != kind || named.contains(key));
                }
                SourceEvent::Apply(o) => {
                    self.0
                        .insert((store::kind_of(&o), store::object_key(&o)), o);
                }
                SourceEvent::Delete(kind, key) => {
                    self.0.remove(&(kind, key));
                }
            }
        }
        assert!(self.1.is_empty(), "lists left open: {:?}", self.1.keys());
    }

    /// name=clusterIP of each Service held, in key order.
    fn services(&self) -> Vec<String> {
        self.0
            .values()
            .filter_map(|o| match o {
                Object::Service(s) => Some(format!(
                    "{}={}",
                    s.metadata.name.as_deref().unwrap(),
                    s.spec.as_ref().unwrap().cluster_ip.as_deref().unwrap()
                )),
                _ => None,
            })
            .collect()
    }
}

/// `view` after `events`: its Services.
fn services(view: &mut View, events: Vec<SourceEvent>) -> Vec<String> {
    view.apply(events);
    view.services()
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
    let mut view = View::default();
    assert_eq!(
        services(&mut view, events),
        ["a=172.30.0.1", "b=172.30.0.2", "c=172.30.0.3"]
    );
    assert_eq!(w.reads, 3);
    let now = Instant::now();
    assert!(w.poll(now).is_none());
    assert_eq!(w.reads, 3, "nothing changed, nothing read");

    // Edited in place, two levels down: only that file is read again.
    write_in_place(&c, &svc("c", "172.30.0.33"));
    let events = w.poll(now).expect("the edit is noticed");
    assert_eq!(events.len(), 1, "only the edited file's object: {events:?}");
    assert_eq!(
        services(&mut view, events),
        ["a=172.30.0.1", "b=172.30.0.2", "c=172.30.0.33"]
    );
    assert_eq!(w.reads, 4);

    // A file removed: nothing read, its objects go.
    std::fs::remove_file(d.join("a.yaml")).unwrap();
    let events = w.poll(now).expect("the removal is noticed");
    assert!(
        matches!(&events[..], [SourceEvent::Delete(Kind::Service, _)]),
        "{events:?}"
    );
    assert_eq!(
        services(&mut view, events),
        ["b=172.30.0.2", "c=172.30.0.33"]
    );
    assert_eq!(w.reads, 4);
    assert!(w.poll(now).is_none());
}

/// The first read hands each object on as it is decoded and keeps only what identifies
/// it: the objects before a failing one, in the same file or an earlier one, were handed on
/// before the failure was known.
#[test]
fn the_first_read_hands_each_object_on_as_it_is_decoded() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("a.yaml"), svc("a", "172.30.0.1")).unwrap();
    let item = |name: &str, ports: &str| {
        format!(
            r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"{name}","namespace":"ns"}},"spec":{{"clusterIP":"172.30.0.9","ports":{ports}}}}}"#
        )
    };
    let list = format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[{},{}]}}"#,
        item("b", r#"[{"port":80}]"#),
        item("c", r#""eighty""#)
    );
    std::fs::write(d.join("b.json"), &list).unwrap();
    let mut listed = Vec::new();
    let e = super::initial(d, &mut |ev| {
        if let SourceEvent::Listed(Object::Service(s)) = ev {
            listed.push(s.metadata.name.unwrap());
        }
    })
    .err()
    .expect("c's ports do not decode");
    assert!(e.to_string().contains("b.json"), "{e}");
    assert_eq!(listed, ["a", "b"]);

    std::fs::write(
        d.join("b.json"),
        list.replace(r#""eighty""#, r#"[{"port":81}]"#),
    )
    .unwrap();
    let (events, w) = initial(d).unwrap();
    let mut view = View::default();
    assert_eq!(
        services(&mut view, events),
        ["a=172.30.0.1", "b=172.30.0.9", "c=172.30.0.9"]
    );
    assert!(
        w.files
            .values()
            .all(|e| matches!(&e.parsed, Ok(o) if o.kept.is_empty())),
        "the files hold decoded objects"
    );
}

/// Where an object's box is: the same address for the object itself, another for a copy.
fn address(o: &Object) -> usize {
    match o {
        Object::Service(s) => std::ptr::from_ref(&**s) as usize,
        Object::EndpointSlice(s) => std::ptr::from_ref(&**s) as usize,
        Object::Node(n) => std::ptr::from_ref(&**n) as usize,
        Object::ServiceCidr(c) => std::ptr::from_ref(&**c) as usize,
    }
}

/// A report after an edit hands on the objects decoded from the file, not copies of them
/// (a copy would hold two of every object of an edited file at the peak).
#[test]
fn a_report_moves_the_objects_it_sends_rather_than_copying_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fifty_and_a(d);
    let (_, mut w) = initial(d).unwrap();
    let many: String = (0..50)
        .map(|i| svc(&format!("m{i}"), &format!("172.30.2.{i}")))
        .collect::<Vec<_>>()
        .join("---\n");
    write_in_place(&d.join("many.yaml"), &many);
    let now = Instant::now();
    assert!(w.refresh(now), "the edit is read");
    w.pending = true;
    let decoded: BTreeSet<usize> = w
        .files
        .values()
        .filter_map(|e| match &e.parsed {
            Ok(o) => Some(o.kept.values().map(address)),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(decoded.len(), 50);
    let events = w.poll(now).expect("the edit is reported");
    let sent: BTreeSet<usize> = events
        .iter()
        .filter_map(|e| match e {
            SourceEvent::Apply(o) => Some(address(o)),
            _ => None,
        })
        .collect();
    assert_eq!(sent, decoded, "the objects sent are not the ones decoded");
}

#[test]
fn file_source_reads_a_broken_file_again_only_when_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = d.join("a.yaml");
    std::fs::write(&a, svc("a", "172.30.0.1")).unwrap();
    let (events, mut w) = initial(d).unwrap();
    let mut view = View::default();
    view.apply(events);
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
    assert_eq!(
        services(&mut view, events),
        ["a=172.30.0.11", "d=172.30.0.4"]
    );
    assert_eq!(w.reads, 4);
    assert!(w.poll(t0 + POLL * 103).is_none());
}

#[test]
fn file_source_retries_an_unreadable_file_with_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("a.yaml"), svc("a", "172.30.0.1")).unwrap();
    let (events, mut w) = initial(d).unwrap();
    let mut view = View::default();
    view.apply(events);
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
    assert_eq!(
        services(&mut view, events),
        ["a=172.30.0.1", "b=172.30.0.2"]
    );
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

/// Fifty Services in many.yaml and Service `a` in a.yaml.
fn fifty_and_a(d: &Path) {
    let many: String = (0..50)
        .map(|i| svc(&format!("m{i}"), &format!("172.30.1.{i}")))
        .collect::<Vec<_>>()
        .join("---\n");
    std::fs::write(d.join("many.yaml"), &many).unwrap();
    std::fs::write(d.join("a.yaml"), svc("a", "172.30.0.1")).unwrap();
}

/// After the first report only differences go out, and they leave the store where a
/// complete report would: an object moving between files, a duplicate whose later copy
/// goes (the earlier one is in effect again), a copy that differs only in spelling its
/// namespace, and an edit among many files that sends that file's objects alone.
#[test]
fn file_source_reports_differences_that_equal_a_complete_report() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fifty_and_a(d);
    std::fs::write(d.join("b.yaml"), svc("b", "172.30.0.2")).unwrap();
    let (events, mut w) = initial(d).unwrap();
    let mut view = View::default();
    view.apply(events);
    let t = Instant::now();
    // What a complete report of the files as they are would hold: a first read.
    let complete = |_: &Watcher| {
        let mut v = View::default();
        v.apply(initial(d).unwrap().0);
        v.services()
    };

    // `a` moves from a.yaml to b.yaml.
    std::fs::write(d.join("a.yaml"), "").unwrap();
    std::fs::write(
        d.join("b.yaml"),
        format!("{}---\n{}", svc("b", "172.30.0.2"), svc("a", "172.30.0.11")),
    )
    .unwrap();
    let events = w.poll(t).expect("the move is noticed");
    assert!(
        events.iter().all(|e| matches!(e, SourceEvent::Apply(_))),
        "a move is no deletion: {events:?}"
    );
    assert!(services(&mut view, events).contains(&"a=172.30.0.11".to_string()));
    assert_eq!(view.services(), complete(&w));

    // A duplicate in a later file wins; when it goes, the earlier copy is back.
    std::fs::write(d.join("c.yaml"), svc("b", "172.30.0.22")).unwrap();
    view.apply(w.poll(t).expect("the duplicate is noticed"));
    assert!(view.services().contains(&"b=172.30.0.22".to_string()));
    std::fs::remove_file(d.join("c.yaml")).unwrap();
    let reads = w.reads;
    view.apply(w.poll(t).expect("the removal is noticed"));
    assert!(view.services().contains(&"b=172.30.0.2".to_string()));
    assert_eq!(
        w.reads,
        reads + 1,
        "b.yaml's objects were not kept: it is read again for its copy of b"
    );
    assert!(
        w.files
            .values()
            .all(|e| matches!(&e.parsed, Ok(o) if o.kept.is_empty())),
        "reported objects are not kept"
    );
    assert_eq!(view.services(), complete(&w));

    // The same Service with its namespace written out: the store's key changes.
    std::fs::write(
        d.join("d.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: { name: nons }\nspec: { clusterIP: 172.30.0.9, ports: [{ port: 80 }] }\n",
    )
    .unwrap();
    view.apply(w.poll(t).expect("the new file is noticed"));
    std::fs::write(
        d.join("e.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: { name: nons, namespace: default }\nspec: { clusterIP: 172.30.0.10, ports: [{ port: 80 }] }\n",
    )
    .unwrap();
    view.apply(w.poll(t).expect("the second copy is noticed"));
    assert_eq!(
        view.services()
            .iter()
            .filter(|s| s.starts_with("nons="))
            .count(),
        1,
        "{:?}",
        view.services()
    );
    assert_eq!(view.services(), complete(&w));

    // One edit among many objects: that file's one object alone.
    write_in_place(&d.join("a.yaml"), &svc("z", "172.30.0.26"));
    let events = w.poll(t).expect("the edit is noticed");
    assert_eq!(events.len(), 1, "{events:?}");
    view.apply(events);
    assert_eq!(view.services(), complete(&w));
    assert_eq!(view.services().len(), 50 + 4);
}

#[test]
fn a_report_looks_only_at_the_objects_of_the_files_that_changed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fifty_and_a(d);
    let (_, mut w) = initial(d).unwrap();
    assert!(w.copies.changed().is_empty());
    let t = Instant::now();

    write_in_place(&d.join("a.yaml"), &svc("b", "172.30.0.2"));
    assert!(w.refresh(t));
    let names = |w: &Watcher| -> Vec<String> {
        w.copies
            .changed()
            .keys()
            .map(|id| id.2.to_string())
            .collect()
    };
    // The old object and the new one, not the other file's fifty.
    assert_eq!(names(&w), ["a", "b"]);
    w.pending = true;
    let events = w.poll(t).expect("the edit is reported");
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(matches!(&events[0], SourceEvent::Delete(Kind::Service, (_, n)) if n == "a"));
    assert!(w.copies.changed().is_empty());
}

/// The copy in effect of every object, from the files as read, the way a report once worked
/// it out each time: the last copy in path and then document order.
fn winners_by_walking(w: &Watcher) -> BTreeMap<Id, (PathBuf, usize)> {
    let mut out = BTreeMap::new();
    for (path, e) in &w.files {
        if let Ok(objects) = &e.parsed {
            for (index, known) in objects.known.iter().enumerate() {
                out.insert(known.id(), (path.clone(), index));
            }
        }
    }
    out
}

fn winners_kept(w: &Watcher) -> BTreeMap<Id, (PathBuf, usize)> {
    w.copies
        .winners()
        .map(|(id, c)| (id.clone(), (c.path.to_path_buf(), c.index)))
        .collect()
}

#[test]
fn the_copies_kept_agree_with_the_files_through_failures_duplicates_and_removals() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("a.yaml"), svc("x", "172.30.0.1")).unwrap();
    std::fs::write(
        d.join("b.yaml"),
        format!("{}---\n{}", svc("x", "172.30.0.2"), svc("y", "172.30.0.3")),
    )
    .unwrap();
    let (_, mut w) = initial(d).unwrap();
    let t = Instant::now();
    let check = |w: &Watcher, when: &str| {
        assert_eq!(winners_kept(w), winners_by_walking(w), "{when}");
    };
    check(&w, "after the first read");
    // b.yaml breaks: its copies leave, x's copy in a.yaml is in effect among the parsed files.
    write_in_place(&d.join("b.yaml"), "kind: [");
    assert!(w.poll(t).is_none());
    check(&w, "with b.yaml broken");
    // Deleted while broken; then a.yaml's copy of x is sent again, read back from the file.
    std::fs::remove_file(d.join("b.yaml")).unwrap();
    let events = w.poll(t).expect("the removal is reported");
    check(&w, "after b.yaml went");
    assert!(events
        .iter()
        .any(|e| matches!(e, SourceEvent::Delete(Kind::Service, (_, n)) if n == "y")));
    // A duplicate comes and goes, and a file breaks while the earlier copy must be read back.
    std::fs::write(d.join("c.yaml"), svc("x", "172.30.0.4")).unwrap();
    w.poll(t).expect("the duplicate is reported");
    check(&w, "with the duplicate");
    write_in_place(&d.join("a.yaml"), "kind: [");
    std::fs::remove_file(d.join("c.yaml")).unwrap();
    assert!(w.poll(t).is_none());
    check(&w, "a.yaml broken, c.yaml gone");
    write_in_place(&d.join("a.yaml"), &svc("x", "172.30.0.5"));
    w.poll(t).expect("the repair is reported");
    check(&w, "a.yaml repaired");
    assert!(w.copies.changed().is_empty());
}

/// An edit of one object among many keeps and sends that object alone, in YAML and in a JSON
/// list: the others are decoded from the text the store's copies came from, and are dropped
/// as soon as they are decoded. An object moved to another file unchanged sends nothing.
#[test]
fn an_edit_keeps_and_sends_only_the_objects_whose_text_changed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fifty_and_a(d);
    let item = |name: &str, ip: &str| {
        format!(
            r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"{name}","namespace":"ns"}},"spec":{{"clusterIP":"{ip}","ports":[{{"port":80}}]}}}}"#
        )
    };
    let list = |ips: &[&str]| {
        let items: Vec<String> = ips
            .iter()
            .enumerate()
            .map(|(i, ip)| item(&format!("j{i}"), ip))
            .collect();
        format!(
            r#"{{"apiVersion":"v1","kind":"List","items":[{}]}}"#,
            items.join(",")
        )
    };
    let ips = ["172.30.3.1", "172.30.3.2", "172.30.3.3", "172.30.3.4"];
    std::fs::write(d.join("j.json"), list(&ips)).unwrap();
    let (events, mut w) = initial(d).unwrap();
    let mut view = View::default();
    view.apply(events);
    let complete = || {
        let mut v = View::default();
        v.apply(initial(d).unwrap().0);
        v.services()
    };
    let t = Instant::now();
    let kept = |w: &Watcher| -> usize {
        w.files
            .values()
            .filter_map(|e| e.parsed.as_ref().ok())
            .map(|o| o.kept.len())
            .sum()
    };
    let applied = |events: &[SourceEvent]| -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                SourceEvent::Apply(Object::Service(s)) => s.metadata.name.clone().unwrap(),
                other => panic!("only applies of Services: {other:?}"),
            })
            .collect()
    };

    // YAML: m7's address changes among fifty.
    let many: String = (0..50)
        .map(|i| {
            let ip = if i == 7 {
                "172.30.9.7".to_string()
            } else {
                format!("172.30.1.{i}")
            };
            svc(&format!("m{i}"), &ip)
        })
        .collect::<Vec<_>>()
        .join("---\n");
    // One object of `file` changed: it alone is kept, and it alone is sent.
    let edit = |w: &mut Watcher, view: &mut View, file: &str, text: &str, changed: &str| {
        write_in_place(&d.join(file), text);
        assert!(w.refresh(t));
        w.pending = true;
        assert_eq!(kept(w), 1, "only the changed object of {file} is kept");
        let events = w.poll(t).expect("the edit is reported");
        assert_eq!(applied(&events), [changed]);
        view.apply(events);
        assert_eq!(view.services(), complete());
    };
    edit(&mut w, &mut view, "many.yaml", &many, "m7");

    // A JSON list: j2's address changes.
    let mut edited = ips;
    edited[2] = "172.30.9.3";
    edit(&mut w, &mut view, "j.json", &list(&edited), "j2");

    // `a` moves to another file as it was: nothing to apply or delete.
    std::fs::remove_file(d.join("a.yaml")).unwrap();
    std::fs::write(d.join("b.yaml"), svc("a", "172.30.0.1")).unwrap();
    let events = w.poll(t).expect("the move is noticed");
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(view.services(), complete());

    // Its text changes in the new file: sent.
    write_in_place(&d.join("b.yaml"), &svc("a", "172.30.0.100"));
    let events = w.poll(t).expect("the edit is reported");
    assert_eq!(applied(&events), ["a"]);
    view.apply(events);
    assert_eq!(view.services(), complete());
    assert_eq!(kept(&w), 0, "reported objects are not kept");
}
