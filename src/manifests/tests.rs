use super::yaml::document_at;
use super::*;

/// A Service in two files is not merged port by port: the later file's copy wins whole,
/// with a warning naming both places (issue 29).
#[test]
fn an_object_defined_twice_is_taken_whole_from_the_last_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
            dir.path().join("a.yaml"),
            "kind: Service\napiVersion: v1\nmetadata: {name: web, namespace: ns}\nspec: {clusterIP: 10.96.0.1, ports: [{name: http, port: 80}, {name: https, port: 443}]}\n",
        )
        .unwrap();
    std::fs::write(
            dir.path().join("b.yaml"),
            "kind: Service\napiVersion: v1\nmetadata: {name: other, namespace: ns}\nspec: {clusterIP: 10.96.0.3, ports: [{port: 53}]}\n---\nkind: Service\napiVersion: v1\nmetadata: {name: web, namespace: ns}\nspec: {clusterIP: 10.96.0.2, ports: [{name: http, port: 8080}]}\n",
        )
        .unwrap();
    let m = load(dir.path()).unwrap();
    assert_eq!(m.services.len(), 2);
    let web = &m.services[0];
    assert_eq!(web.metadata.name.as_deref(), Some("web"));
    let spec = web.spec.as_ref().unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.2"));
    assert_eq!(spec.ports.as_ref().unwrap().len(), 1);
    assert_eq!(m.duplicates.len(), 1, "{:?}", m.duplicates);
    let w = &m.duplicates[0];
    assert!(
        w.contains("Service ns/web")
            && w.contains("a.yaml (object 1)")
            && w.contains("b.yaml (object 2)"),
        "{w}"
    );
}

#[test]
fn multi_document_and_lists() {
    let text = r#"
apiVersion: v1
kind: Service
metadata: { name: a, namespace: ns }
spec: { clusterIP: 10.96.0.1, ports: [{ port: 80 }] }
---
apiVersion: v1
kind: List
items:
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: { name: a-1, namespace: ns, labels: { kubernetes.io/service-name: a } }
  addressType: IPv4
  endpoints: [{ addresses: [10.0.0.1] }]
- apiVersion: v1
  kind: ConfigMap
  metadata: { name: ignored }
---
{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}
"#;
    let objs = parse(text, Path::new("x.yaml")).unwrap();
    assert_eq!(objs.len(), 3);
    assert!(matches!(objs[0], Object::Service(_)));
    assert!(matches!(objs[1], Object::EndpointSlice(_)));
    assert!(matches!(objs[2], Object::Node(_)));
}

#[test]
fn json_documents_and_lists() {
    let text = r#"{"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a", "namespace": "ns"},
             "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}}]}
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}"#;
    let objs = parse(text, Path::new("x.json")).unwrap();
    assert_eq!(objs.len(), 2);
    let e = parse(r#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}, "spec": {"ports": [{"port": "x"}]}}"#, Path::new("y.json")).unwrap_err().to_string();
    assert!(
        e.contains("y.json") && e.contains("Service a") && e.contains("spec.ports[0].port"),
        "{e}"
    );
}

#[test]
fn decode_errors_name_file_object_and_field() {
    let text = "apiVersion: v1\nkind: Service\nmetadata: { name: a, namespace: ns }\nspec: { ports: [{ port: eighty }] }\n";
    let e = parse(text, Path::new("bad.yaml")).unwrap_err().to_string();
    assert!(
        e.contains("bad.yaml") && e.contains("Service ns/a") && e.contains("spec.ports[0].port"),
        "{e}"
    );
    let e = parse("a: [", Path::new("broken.yaml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("broken.yaml"), "{e}");
}

/// A Service and its EndpointSlice of `endpoints` endpoints as `kubectl get -o yaml` prints
/// them (its usual metadata included), addresses from `dataplane::synth`.
fn kubectl_pair(i: usize, endpoints: usize) -> [String; 2] {
    let ip = dataplane::synth::cluster_ip(i);
    let svc = format!(
        r#"apiVersion: v1
kind: Service
metadata:
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: |
      {{"apiVersion":"v1","kind":"Service","metadata":{{"annotations":{{}},"labels":{{"app":"svc-{i}"}},"name":"svc-{i}","namespace":"bench"}},"spec":{{"ports":[{{"name":"http","port":80,"protocol":"TCP","targetPort":8080}}],"selector":{{"app":"svc-{i}"}}}}}}
  creationTimestamp: "2026-12-01T10:00:00Z"
  labels:
    app: svc-{i}
  name: svc-{i}
  namespace: bench
  resourceVersion: "{rv}"
  uid: 6b1c2f4e-0000-4000-8000-{i:012}
spec:
  clusterIP: {ip}
  clusterIPs:
  - {ip}
  internalTrafficPolicy: Cluster
  ipFamilies:
  - IPv4
  ipFamilyPolicy: SingleStack
  ports:
  - name: http
    port: 80
    protocol: TCP
    targetPort: 8080
  selector:
    app: svc-{i}
  sessionAffinity: None
  type: ClusterIP
status:
  loadBalancer: {{}}
"#,
        rv = 1_000_000 + i,
    );
    let mut slice =
        String::from("addressType: IPv4\napiVersion: discovery.k8s.io/v1\nendpoints:\n");
    for j in 0..endpoints {
        let addr = dataplane::synth::endpoint_ip(i, j, 0);
        let node = (i + j) % 50;
        slice.push_str(&format!(
            r#"- addresses:
  - {addr}
  conditions:
    ready: true
    serving: true
    terminating: false
  nodeName: node-{node}
  targetRef:
    kind: Pod
    name: svc-{i}-7d9f8b6c5d-{j:05}
    namespace: bench
    uid: 0f3a9c1e-0000-4000-8000-{i:07}{j:05}
  zone: zone-{zone}
"#,
            zone = node % 3,
        ));
    }
    slice.push_str(&format!(
        r#"kind: EndpointSlice
metadata:
  annotations:
    endpoints.kubernetes.io/last-change-trigger-time: "2026-12-01T10:00:00Z"
  creationTimestamp: "2026-12-01T10:00:00Z"
  generateName: svc-{i}-
  generation: 3
  labels:
    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
    kubernetes.io/service-name: svc-{i}
  name: svc-{i}-x7k2p
  namespace: bench
  ownerReferences:
  - apiVersion: v1
    blockOwnerDeletion: true
    controller: true
    kind: Service
    name: svc-{i}
    uid: 6b1c2f4e-0000-4000-8000-{i:012}
  resourceVersion: "{rv}"
  uid: 9e2d7b3a-0000-4000-8000-{i:012}
ports:
- name: http
  port: 8080
  protocol: TCP
"#,
        rv = 2_000_000 + i,
    ));
    [svc, slice]
}

/// `services` Services and their slices as one `kind: List` (`kubectl get -o yaml`).
fn kubectl_list(services: usize, endpoints: usize) -> String {
    let mut out = String::from("apiVersion: v1\nitems:\n");
    for i in 0..services {
        for obj in kubectl_pair(i, endpoints) {
            for (n, line) in obj.lines().enumerate() {
                out.push_str(if n == 0 { "- " } else { "  " });
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out.push_str("kind: List\nmetadata:\n  resourceVersion: \"\"\n");
    out
}

#[test]
fn ten_thousand_services_parse_within_a_tenth_of_the_limits() {
    let (n, per) = (10_000, 10);
    let text = kubectl_list(n, per);
    let report = std::rc::Rc::new(std::cell::RefCell::new(None));
    let sink = report.clone();
    let options = yaml_options().with_budget_report(move |r| *sink.borrow_mut() = Some(r));
    let t = std::time::Instant::now();
    // serde-saphyr's own path, whose budget this measures (plain YAML like this goes to
    // the plain reader first).
    let objs = super::yaml::saphyr::<false>(&text, Path::new("dump.yaml"), options)
        .unwrap()
        .objects;
    let took = t.elapsed();
    let mut m = Manifests::default();
    let mut seen = BTreeMap::new();
    objs.into_iter()
        .for_each(|(o, _)| m.push(o, String::new(), &mut seen));
    assert_eq!((m.services.len(), m.slices.len()), (n, n));
    let last = m.slices[n - 1].endpoints.as_deref().unwrap_or_default();
    assert_eq!(last.len(), per);
    assert_eq!(
        last[per - 1].addresses,
        vec![dataplane::synth::endpoint_ip(n - 1, per - 1, 0).to_string()]
    );
    let r = report.borrow_mut().take().expect("a budget report");
    let b = yaml_options().budget.expect("a budget");
    println!(
        "{n} services x {per}: {} bytes, {} nodes, {} events, {} scalar bytes, depth {}, \
             {} documents, parsed in {took:?}",
        text.len(),
        r.nodes,
        r.events,
        r.total_scalar_bytes,
        r.max_depth,
        r.documents
    );
    // Within a tenth of each limit: a 100k-service dump of this shape fits.
    assert!(r.breached.is_none());
    assert!(r.nodes * 10 <= b.max_nodes, "nodes {}", r.nodes);
    assert!(r.events * 10 <= b.max_events, "events {}", r.events);
    assert!(r.total_scalar_bytes * 10 <= b.max_total_scalar_bytes);
}

#[test]
fn multi_document_dump_parses_and_counts_documents() {
    let mut text = String::new();
    for i in 0..200 {
        for obj in kubectl_pair(i, 10) {
            text.push_str("---\n");
            text.push_str(&obj);
        }
    }
    let objs = parse(&text, Path::new("dump.yaml")).unwrap();
    assert_eq!(objs.len(), 400);
    // A syntax error names its document (the 3rd) and line.
    let broken = format!(
        "{}---\n{}---\nkind: Service\nspec: [\n",
        kubectl_pair(0, 1)[0],
        kubectl_pair(0, 1)[1]
    );
    let e = parse(&broken, Path::new("b.yaml")).unwrap_err().to_string();
    assert!(
        e.starts_with("b.yaml: not valid YAML or JSON (document 3): "),
        "{e}"
    );
    assert!(e.contains("line "), "{e}");
}

#[test]
fn document_numbers_follow_markers_and_content() {
    let t = "# c\n%YAML 1.2\n---\na: 1\n---\n---\nb: 2\n...\nc: 3\n";
    let at: Vec<usize> = (1..=9).map(|l| document_at(t, l)).collect();
    assert_eq!(at, [1, 1, 1, 1, 2, 3, 3, 3, 4]);
    assert_eq!(document_at("a: 1\n", 1), 1);
}

#[test]
fn untyped_values_read_as_serde_yaml_read_them() {
    let text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: a\n  namespace: ns\n  labels: { a: yes, b: on, c: '0755', d: 0755, e: 1_000, f: 0x1F }\nspec: { clusterIP: 10.96.0.1, ports: [{ port: 80 }] }\n";
    let e = parse(text, Path::new("l.yaml")).unwrap_err().to_string();
    // yes, on, 0755 and 1_000 are strings; 0x1F is a number, as in serde_yaml 0.9.
    assert!(e.contains("field metadata.labels.f"), "{e}");
    let text = text.replace(", f: 0x1F", "");
    let objs = parse(&text, Path::new("l.yaml")).unwrap();
    let Object::Service(s) = &objs[0] else {
        panic!("{objs:?}")
    };
    let labels = s.metadata.labels.as_ref().unwrap();
    assert_eq!(labels["a"], "yes");
    assert_eq!(labels["b"], "on");
    assert_eq!(labels["d"], "0755");
    assert_eq!(labels["e"], "1_000");
    let v: serde_json::Value =
        serde_saphyr::from_str_with_options("{a: .nan, b: .inf, c: 1.5}", yaml_options()).unwrap();
    assert_eq!(v, serde_json::json!({"a": null, "b": null, "c": 1.5}));
}

#[test]
fn merge_keys_expand_and_duplicate_keys_fail() {
    // Anchors hold within one document, so the two Services share a List.
    let text = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: &m { name: a, namespace: ns }\n  spec: { clusterIP: 10.96.0.1, ports: [{ port: 80 }] }\n- apiVersion: v1\n  kind: Service\n  metadata: { <<: *m, name: b }\n  spec: { clusterIP: 10.96.0.2, ports: [{ port: 80 }] }\n";
    let objs = parse(text, Path::new("m.yaml")).unwrap();
    let Object::Service(b) = &objs[1] else {
        panic!("{objs:?}")
    };
    assert_eq!(b.metadata.namespace.as_deref(), Some("ns"));
    assert_eq!(b.metadata.name.as_deref(), Some("b"));
    let e = parse("kind: Service\nkind: Node\n", Path::new("d.yaml"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("d.yaml: not valid YAML or JSON (document 1): "),
        "{e}"
    );
}

#[test]
fn alias_bombs_and_deep_nesting_stop_at_the_limits() {
    // Billion laughs: 10^9 strings from a few hundred bytes.
    let mut bomb = String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for k in 1..=9 {
        let p = k - 1;
        bomb.push_str(&format!(
            "a{k}: &a{k} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    let e = parse(&bomb, Path::new("bomb.yaml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("over the limits for manifest files"), "{e}");

    let nested = |depth: usize| format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
    let e = parse(&nested(65), Path::new("deep.yaml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("over the limits for manifest files"), "{e}");
    let block: String = (0..200)
        .map(|d| format!("{}k:\n", "  ".repeat(d)))
        .collect();
    let e = parse(&block, Path::new("deep.yaml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("over the limits for manifest files"), "{e}");
    // The deepest input accepted fits the 2 MiB stack of a tokio worker (the agent's
    // manifest watcher runs on one), in a debug build.
    // So does the deepest list item, decoded (and printed) inside the list's own visitors.
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            parse(
                &format!("kind: X\nv: {}\n", nested(63)),
                Path::new("d.yaml"),
            )
            .unwrap();
            let item = format!("kind: List\nitems:\n- {{kind: X, v: {}}}\n", nested(61));
            let path = Path::new("d.yaml");
            parse_yaml::<true>(&item, path, yaml_options(), &mut |_, _| {}).unwrap();
        })
        .unwrap()
        .join()
        .unwrap();
}

const SVC: &str = "apiVersion: v1\nkind: Service\nmetadata: { name: web, namespace: ns }\nspec: { clusterIP: 172.30.0.1, ports: [{ port: 80 }] }\n";

#[test]
fn manifest_listing_skips_fifos_and_symlink_loops_and_recurses() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("sub/deeper")).unwrap();
    std::fs::write(d.join("sub/deeper/a.yaml"), SVC).unwrap();
    std::fs::write(d.join("b.yml"), SVC).unwrap();
    std::fs::write(d.join("notes.txt"), "not read").unwrap();
    nix::unistd::mkfifo(&d.join("pipe.yaml"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    std::os::unix::fs::symlink(".", d.join("loop")).unwrap();
    std::os::unix::fs::symlink("../..", d.join("sub/deeper/up")).unwrap();
    let l = list(d).unwrap();
    let names: Vec<_> = l
        .files
        .iter()
        .map(|f| f.path.strip_prefix(d).unwrap())
        .collect();
    assert_eq!(names, [Path::new("b.yml"), Path::new("sub/deeper/a.yaml")]);
    assert!(l.files.iter().all(|f| !f.named));
    assert_eq!(l.skipped.len(), 3, "{:?}", l.skipped);
    assert!(l
        .skipped
        .iter()
        .any(|s| s.ends_with("pipe.yaml: skipped: a FIFO, not a regular file")));
    assert!(l
        .skipped
        .iter()
        .any(|s| s.contains("loop: skipped: a directory already read")));
    assert!(l
        .skipped
        .iter()
        .any(|s| s.contains("up: skipped: a directory already read")));
    // And loading reads the two files, each once: the same Service in both is one
    // object, taken from the later file, with one warning.
    let m = load(d).unwrap();
    assert_eq!(m.services.len(), 1);
    assert_eq!(m.duplicates.len(), 1, "{:?}", m.duplicates);

    // Only FIFOs: nothing to read is the usual error.
    let only = tempfile::tempdir().unwrap();
    nix::unistd::mkfifo(&only.path().join("p.json"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    assert!(matches!(
        list(only.path()),
        Err(ManifestError::Empty { .. })
    ));
}

#[test]
fn manifest_read_stops_at_the_size_cap_and_refuses_a_replaced_fifo() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("a.yaml");
    std::fs::write(&f, SVC).unwrap();
    let found = list(&f).unwrap().files.remove(0);
    assert!(found.named);
    let (stamp, objs) = read_file(&found, SVC.len() as u64).unwrap();
    assert_eq!((stamp, objs.len()), (found.stamp, 1));
    let e = read_file(&found, SVC.len() as u64 - 1)
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with(&format!(
            "a.yaml: too large: {} bytes, over the limit of {} bytes for one manifest file",
            SVC.len(),
            SVC.len() - 1
        )),
        "{e}"
    );
    // A sparse file over the real cap is refused from its size, without reading it.
    let big = dir.path().join("big.yaml");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(MAX_FILE_BYTES + 1)
        .unwrap();
    let t = std::time::Instant::now();
    assert!(
        matches!(load(&big), Err(ManifestError::TooLarge { size, .. }) if size == MAX_FILE_BYTES + 1)
    );
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
    // A file found in a directory that is a FIFO by the time it is opened: refused, not
    // waited on.
    let pipe = dir.path().join("p.yaml");
    nix::unistd::mkfifo(&pipe, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let raced = Found {
        path: pipe,
        stamp: found.stamp,
        named: false,
    };
    let e = read_file(&raced, MAX_FILE_BYTES).unwrap_err().to_string();
    assert!(
        e.ends_with("p.yaml: cannot read: a FIFO, not a regular file"),
        "{e}"
    );
}

/// JSON as it was decoded before lists went item by item: each document whole, as a tree.
fn parse_json_as_trees(text: &str, path: &Path) -> Result<Vec<Object>, ManifestError> {
    let mut out = Vec::new();
    let docs = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
    for (i, doc) in docs.enumerate() {
        let value = doc.map_err(|e| ManifestError::Syntax {
            path: path.to_path_buf(),
            doc: i + 1,
            message: e.to_string(),
        })?;
        collect(value, path, false, &mut |o, _| out.push(o))?;
    }
    Ok(out)
}

/// The item-by-item decoding of JSON lists gives what decoding each document whole gave:
/// the same objects, and the same errors (object, field, wording) where an item is bad.
#[test]
fn json_lists_decode_item_by_item_as_whole_documents_did() {
    let list: serde_json::Value =
        serde_saphyr::from_str(&kubectl_list(20, 3)).expect("the kubectl list parses");
    let node = r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}"#;
    let cidr = r#"{"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR", "metadata": {"name": "c"}, "spec": {"cidrs": ["10.96.0.0/16"]}}"#;
    let svc = |spec: &str| {
        format!(
            r#"{{"apiVersion": "v1", "kind": "Service", "metadata": {{"name": "a", "namespace": "ns"}}, "spec": {spec}}}"#
        )
    };
    let inputs = [
        serde_json::to_string_pretty(&list).unwrap(),
        format!("{list}\n{node}\nnull\n{cidr}"),
        // Items before kind, as kubectl prints them; a nested list; an unknown kind.
        format!(
            r#"{{"items": [{node}, {{"kind": "List", "apiVersion": "v1", "items": [{cidr}]}}, {{"apiVersion": "v1", "kind": "ConfigMap"}}], "kind": "List", "apiVersion": "v1"}}"#
        ),
        // A key twice: the tree kept the last one.
        svc(r#"{"clusterIP": "10.96.0.1", "clusterIP": "10.96.0.2", "ports": [{"port": 80}]}"#),
        format!(r#"{{"kind": "List", "kind": "List", "items": [{node}]}}"#),
        // Bad items, first and later in a list.
        format!(
            r#"{{"kind": "List", "items": [{node}, {}]}}"#,
            svc(r#"{"ports": [{"port": "x"}]}"#)
        ),
        svc(r#"{"ports": [{"port": 70000000000}]}"#),
        format!(r#"{{"kind": "List", "items": {node}}}"#),
        r#"{"kind": "ServiceList", "items": null}"#.to_string(),
        r#"{"kind": "ServiceList"}"#.to_string(),
        r#"[1, 2]"#.to_string(),
        r#"{"apiVersion": 1, "kind": "Service"}"#.to_string(),
        "7".to_string(),
        // An array is no list, whatever its elements.
        format!(r#"[null, "List", [{node}]]"#),
        // What skipping over text would not check: nesting past the parser's limit, a lone
        // surrogate, a number out of range; and a bad object before a syntax error.
        format!(
            r#"{{"kind": "List", "items": [{node}, {{"kind": "Node", "apiVersion": "v1", "metadata": {{"name": "d"}}, "x": {}1{}}}]}}"#,
            "[".repeat(200),
            "]".repeat(200)
        ),
        format!(
            r#"{{"kind": "List", "items": [{}]}}"#,
            r#"{"kind": "List", "items": ["#.repeat(100) + &"]}".repeat(100)
        ),
        format!(
            r#"{{"kind": "List", "items": [{node}, {{"kind": "ConfigMap", "data": {{"a": "\ud800"}}}}]}}"#
        ),
        format!(
            r#"{{"kind": "List", "items": [{node}, {{"kind": "ConfigMap", "data": {{"a": 1e400}}}}]}}"#
        ),
        format!(
            "{}\n{{\"kind\": \"List\", \"items\": [}}",
            svc(r#"{"ports": [{"port": "x"}]}"#)
        ),
        format!("{node}\n\n  {cidr} {{\"kind\": ]"),
    ];
    for text in &inputs {
        let path = Path::new("x.json");
        let fmt = |r: Result<Vec<Object>, ManifestError>| match r {
            Ok(objects) => format!("{objects:?}"),
            Err(e) => format!("error: {e}"),
        };
        assert_eq!(
            fmt(parse(text, path)),
            fmt(parse_json_as_trees(text, path)),
            "{text}"
        );
    }
    let objects = parse(&inputs[0], Path::new("x.json")).unwrap();
    assert_eq!(objects.len(), 40, "20 Services and their slices");
}

/// A ServiceCIDR written as networking.k8s.io/v1beta1 (the same schema as v1) is read, not
/// refused for its apiVersion, in JSON and YAML.
#[test]
fn v1beta1_service_cidrs_are_read_as_v1() {
    let json = r#"{"apiVersion": "networking.k8s.io/v1beta1", "kind": "ServiceCIDR", "metadata": {"name": "c"}, "spec": {"cidrs": ["10.96.0.0/16"]}}"#;
    let yaml = "apiVersion: networking.k8s.io/v1beta1\nkind: ServiceCIDR\nmetadata: {name: c}\nspec: {cidrs: [10.96.0.0/16]}\n";
    for (text, file) in [(json, "c.json"), (yaml, "c.yaml")] {
        let objects = parse(text, Path::new(file)).unwrap();
        match &objects[..] {
            [Object::ServiceCidr(c)] => assert_eq!(
                c.spec.as_ref().unwrap().cidrs.as_deref(),
                Some(&["10.96.0.0/16".to_string()][..])
            ),
            other => panic!("{file}: {other:?}"),
        }
    }
}

/// An object's print follows its text: the same text prints the same wherever it stands (a
/// list item among other items, a YAML document in another file), and any change to it
/// prints otherwise.
#[test]
fn prints_follow_each_objects_text() {
    let dir = tempfile::tempdir().unwrap();
    let prints = |text: &str, name: &str| -> Vec<Print> {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let found = &list(&path).unwrap().files[0];
        let mut out = Vec::new();
        read_file_printed(found, MAX_FILE_BYTES, &mut |_, p| out.push(p)).unwrap();
        out
    };
    let item = |name: &str, port: u16| {
        format!(
            r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"{name}"}},"spec":{{"ports":[{{"port":{port}}}]}}}}"#
        )
    };
    let items = |items: &[String]| format!(r#"{{"kind":"List","items":[{}]}}"#, items.join(","));
    let one = prints(&items(&[item("a", 80), item("b", 80)]), "one.json");
    let two = prints(
        &items(&[item("a", 80), item("b", 81), item("c", 80)]),
        "two.json",
    );
    assert_eq!(one[0], two[0], "a's text is the same");
    assert_ne!(one[1], two[1], "b's port changed");
    assert_ne!(two[0], two[2], "a and c differ in name");

    let yaml = |port: u16| {
        format!("apiVersion: v1\nkind: Service\nmetadata: {{ name: a }}\nspec: {{ ports: [{{ port: {port} }}] }}\n")
    };
    let y1 = prints(&format!("{}---\n{}", yaml(80), yaml(80)), "one.yaml");
    let y2 = prints(&yaml(81), "two.yaml");
    assert_eq!(y1[0], y1[1]);
    assert_ne!(y1[0], y2[0]);
}

/// A list longer than one thread's chunk is decoded on two threads and handed on in order:
/// the same objects as the tree gave, and a bad item in any chunk, whichever thread decoded
/// it, fails the file with the tree's error after exactly the objects before it.
#[test]
fn long_json_lists_decode_on_two_threads_in_order() {
    let list: serde_json::Value =
        serde_saphyr::from_str(&kubectl_list(600, 2)).expect("the kubectl list parses");
    let path = Path::new("x.json");
    let text = list.to_string();
    let objects = parse(&text, path).unwrap();
    assert_eq!(objects.len(), 1200);
    assert_eq!(
        format!("{objects:?}"),
        format!("{:?}", parse_json_as_trees(&text, path).unwrap())
    );
    // Items 300 and 600: the second chunk of 256 begins at 256, the third at 512.
    for bad in [300, 600, 1199] {
        let mut broken = list.clone();
        broken["items"][bad]["metadata"]["name"] = serde_json::json!(7);
        let text = broken.to_string();
        let mut before = 0;
        let e = parse_each(&text, path, &mut |_| before += 1).unwrap_err();
        assert_eq!(before, bad, "objects handed on before item {bad}");
        assert_eq!(
            e.to_string(),
            parse_json_as_trees(&text, path).unwrap_err().to_string()
        );
        assert!(e.to_string().contains("field metadata.name"), "{e}");
    }
}

/// YAML decoded as before `yaml::Doc`: every document parsed into a tree, then each tree
/// decoded (a syntax error anywhere wins over a decode error).
fn parse_yaml_as_trees(text: &str, path: &Path) -> Result<Vec<Object>, ManifestError> {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_str_multiple_with_options(text, yaml_options()).map_err(|e| {
            ManifestError::Syntax {
                path: path.to_path_buf(),
                doc: e.location().map_or(1, |l| {
                    document_at(text, usize::try_from(l.line()).unwrap_or(usize::MAX))
                }),
                message: e.to_string(),
            }
        })?;
    let mut out = Vec::new();
    for doc in docs {
        collect(doc, path, false, &mut |o, _| out.push(o))?;
    }
    Ok(out)
}

/// A YAML list's items decoded as the parser reaches each give what decoding its document
/// whole gave: the same objects in the same order, the same errors, whatever the document.
#[test]
fn yaml_lists_decode_item_by_item_as_whole_documents_did() {
    let node = "{apiVersion: v1, kind: Node, metadata: {name: n1}}";
    let cidr = "{apiVersion: networking.k8s.io/v1, kind: ServiceCIDR, metadata: {name: c}, spec: {cidrs: [10.96.0.0/16]}}";
    let svc = |spec: &str| {
        format!(
            "{{apiVersion: v1, kind: Service, metadata: {{name: a, namespace: ns}}, spec: {spec}}}"
        )
    };
    let bad = svc("{ports: [{port: x}]}");
    let good = svc("{clusterIP: 10.96.0.1, ports: [{port: 80}]}");
    let inputs = [
        kubectl_list(20, 3),
        format!("{}---\n{node}\n---\nnull\n---\n{cidr}\n", kubectl_list(2, 1)),
        // Items before kind, as kubectl prints them; a nested list; an unknown kind.
        format!("items:\n- {node}\n- {{kind: List, apiVersion: v1, items: [{cidr}]}}\n- {{apiVersion: v1, kind: ConfigMap}}\nkind: List\napiVersion: v1\n"),
        format!("kind: ServiceList\nitems:\n- {good}\n- {node}\n"),
        // Bad items, first and later; the items after a bad one.
        format!("kind: List\nitems:\n- {bad}\n- {node}\n"),
        format!("items:\n- {node}\n- {bad}\n- {cidr}\nkind: List\n"),
        // Not a list: its items are no object's, bad or not.
        format!("{}\n", good.replacen('{', &format!("{{items: [{bad}], "), 1)),
        format!("kind: ConfigMap\nitems:\n- {node}\n"),
        // Items that are not a sequence.
        format!("kind: List\nitems: {node}\n"),
        "kind: ServiceList\nitems: null\n".to_string(),
        "kind: ServiceList\nitems: 12345678901234567890123\n".to_string(),
        "kind: ServiceList\n".to_string(),
        // Documents that are no mapping.
        "[1, 2]\n".to_string(),
        "7\n".to_string(),
        format!("- null\n- List\n- [{node}]\n"),
        // Keys a tree refuses, in a document that is no mapping.
        "- {~: 1}\n".to_string(),
        "- {? [a]: b}\n".to_string(),
        // Anchors and merge keys across items.
        format!("kind: List\nitems:\n- &n {node}\n- *n\n- {{<<: *n, metadata: {{name: n2}}}}\n"),
        // A key twice.
        format!("kind: List\nkind: List\nitems: [{node}]\n"),
        // A bad object before a syntax error, and a syntax error inside the items.
        format!("{bad}\n---\nkind: List\nitems: [\n"),
        format!("kind: List\nitems:\n- {node}\n- {{kind: ]\n"),
    ];
    for text in &inputs {
        let path = Path::new("x.yaml");
        let fmt = |r: Result<Vec<Object>, ManifestError>| match r {
            Ok(objects) => format!("{objects:?}"),
            Err(e) => format!("error: {e}"),
        };
        let mut objects = Vec::new();
        let streamed = parse_yaml::<false>(text, path, yaml_options(), &mut |o, _| objects.push(o))
            .map(|()| objects);
        assert_eq!(
            fmt(streamed),
            fmt(parse_yaml_as_trees(text, path)),
            "{text}"
        );
    }
    let objects = parse(&inputs[0], Path::new("x.yaml")).unwrap();
    assert_eq!(objects.len(), 40, "20 Services and their slices");
}

/// Block YAML as kubectl prints it goes to the plain reader, which gives what serde-saphyr
/// gives: the same objects in the same order, the same decode errors.
#[test]
fn plain_yaml_is_read_without_serde_saphyr_and_decodes_alike() {
    let node = "- apiVersion: v1\n  kind: Node\n  metadata:\n    name: n1\n";
    let bad = "- apiVersion: v1\n  kind: Service\n  metadata:\n    name: a\n    namespace: ns\n  spec:\n    ports:\n    - port: x\n";
    let unknown = "- apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: c\n";
    let inputs = [
        kubectl_list(20, 3),
        format!("apiVersion: v1\nitems:\n{node}{unknown}kind: List\n"),
        format!("kind: List\nitems:\n{bad}{node}"),
        format!("items:\n{node}{bad}kind: List\n"),
        format!("kind: ConfigMap\nitems:\n{node}"),
        format!("items:\n{node}kind: ConfigMap\n"),
        format!("items:\n{node}{node}"),
        // After a bad object, later lists are read but not decoded, whichever comes first.
        format!("kind: List\nitems:\n{bad}---\nkind: List\nitems:\n{node}---\nitems:\n{node}kind: List\n"),
        "kind: ServiceList\nitems: []\n".to_string(),
        "kind: ServiceList\nitems:\n".to_string(),
        "kind: ServiceList\nitems: 7\n".to_string(),
        format!(
            "{}---\nkind: List\nitems:\n{node}---\n- 1\n",
            kubectl_list(2, 1)
        ),
        // Lists long enough to be read in chunks of 256 on two threads, whichever is free: a
        // bad item in the second chunk, then items after it not decoded; other kinds in
        // three chunks (reported only in the debug log), and a bad item in the last.
        kubectl_list(300, 1),
        format!(
            "items:\n{}{bad}{}{unknown}{}kind: List\n",
            node.repeat(300),
            node.repeat(100),
            node.repeat(200)
        ),
        format!(
            "kind: List\nitems:\n{unknown}{}{unknown}{}{unknown}{bad}{node}",
            node.repeat(300),
            node.repeat(250)
        ),
        // A bad item in the first chunk: the later chunks' objects are not handed on.
        format!("items:\n{bad}{}{unknown}kind: List\n", node.repeat(300)),
    ];
    for text in &inputs {
        let path = Path::new("x.yaml");
        let fmt = |r: Result<super::yaml::Decoded<false>, ManifestError>| match r {
            Ok(d) => format!(
                "{:?} ignored {:?} error {:?}",
                d.objects.into_iter().map(|(o, _)| o).collect::<Vec<_>>(),
                d.ignored,
                d.error.map(|e| (e.kind, e.name, e.field, e.message))
            ),
            Err(e) => format!("error: {e}"),
        };
        let mut handed = Vec::new();
        let mut plain = super::plain_yaml::read::<false>(text, &mut |o, p| handed.push((o, p)))
            .unwrap_or_else(|b| {
                panic!("{text}: left to serde-saphyr at line {}: {}", b.line, b.why)
            });
        assert!(
            plain.objects.is_empty(),
            "objects kept rather than handed on"
        );
        plain.objects = handed;
        assert_eq!(
            fmt(Ok(plain)),
            fmt(super::yaml::saphyr::<false>(text, path, yaml_options())),
            "{text}"
        );
    }
    let objects = parse(&inputs[0], Path::new("x.yaml")).unwrap();
    assert_eq!(objects.len(), 40, "20 Services and their slices");
}

/// Where the plain reader gives up part way, serde-saphyr reads the file and the objects the
/// plain reader had handed on are not handed on again, whether the list's kind came before
/// its items or after them.
#[test]
fn yaml_the_plain_reader_gives_up_on_is_read_once_by_serde_saphyr() {
    let node = |n: usize| format!("- apiVersion: v1\n  kind: Node\n  metadata:\n    name: n{n}\n");
    let flow = "- {apiVersion: v1, kind: Node, metadata: {name: flow}}\n";
    let names = |text: &str| {
        let mut names = Vec::new();
        let mut calls = 0;
        let plain = super::plain_yaml::read::<false>(text, &mut |_, _| calls += 1);
        parse_yaml::<false>(text, Path::new("x.yaml"), yaml_options(), &mut |o, _| {
            names.push(identity(&o).2)
        })
        .unwrap();
        (names, calls, plain.is_err())
    };
    // Kind first: the items before the flow one are handed on by the plain reader.
    let (got, by_plain, gave_up) = names(&format!(
        "kind: List\nitems:\n{}{}{flow}{}",
        node(1),
        node(2),
        node(3)
    ));
    assert!(gave_up);
    assert_eq!(by_plain, 2);
    assert_eq!(
        got,
        ["n1", "n2", "flow", "n3"],
        "each object once, in order"
    );
    // Kind last, as kubectl prints it: the items before the flow one are handed on once the
    // kind has been read.
    let (got, by_plain, gave_up) = names(&format!(
        "items:\n{}{}{flow}{}kind: List\n",
        node(1),
        node(2),
        node(3)
    ));
    assert!(gave_up);
    assert_eq!(by_plain, 2);
    assert_eq!(got, ["n1", "n2", "flow", "n3"]);
    // In a long list, the second chunk of 256 items gives up: what came before the flow
    // item is handed on by the plain reader, the rest by serde-saphyr.
    let long: String = (0..600)
        .map(|n| if n == 300 { flow.to_string() } else { node(n) })
        .collect();
    let (got, by_plain, gave_up) = names(&format!("items:\n{long}kind: List\n"));
    assert!(gave_up);
    assert_eq!(by_plain, 300);
    let want: Vec<String> = (0..600)
        .map(|n| match n {
            300 => "flow".to_string(),
            n => format!("n{n}"),
        })
        .collect();
    assert_eq!(got, want, "each object once, in order");
    // Not a list after all: nothing handed on, nothing decoded.
    let (got, by_plain, gave_up) = names(&format!("items:\n{}{flow}kind: Other\n", node(1)));
    assert!(gave_up);
    assert_eq!(by_plain, 0);
    assert!(got.is_empty(), "{got:?}");
    // An earlier document read plainly, a later one not.
    let (got, by_plain, _) = names(&format!(
        "items:\n{}kind: List\n---\nitems:\n{flow}kind: List\n",
        node(1)
    ));
    assert_eq!(by_plain, 1);
    assert_eq!(got, ["n1", "flow"]);
}
