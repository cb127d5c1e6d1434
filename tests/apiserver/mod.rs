//! A fixture API server: the HTTP list/watch protocol the kube client speaks, over real TCP.
//! Lists carry a resourceVersion; watches stream JSON events (chunked), with bookmarks;
//! a watch from a compacted resourceVersion gets 410 Gone; the server can be stopped
//! (every connection dropped, new ones refused) and started again on the same address.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The collections served: (path, list kind, object kind, apiVersion).
const RESOURCES: &[(&str, &str, &str)] = &[
    ("/api/v1/services", "Service", "v1"),
    (
        "/apis/discovery.k8s.io/v1/endpointslices",
        "EndpointSlice",
        "discovery.k8s.io/v1",
    ),
    ("/api/v1/nodes", "Node", "v1"),
    (
        "/apis/networking.k8s.io/v1/servicecidrs",
        "ServiceCIDR",
        "networking.k8s.io/v1",
    ),
];

#[derive(Default)]
struct State {
    rv: u64,
    /// Events kept for watches: (rv, type, kind, object).
    history: Vec<(u64, &'static str, String, Value)>,
    /// Oldest rv a watch may resume from.
    compacted: u64,
    /// Current objects per kind, keyed by namespace/name.
    objects: BTreeMap<String, BTreeMap<String, Value>>,
    /// Requests seen, for assertions: (path with query).
    requests: Vec<String>,
    /// Streaming lists refused, as by kube-apiserver with the WatchList gate off.
    refuse_streaming: bool,
    /// Faults for the next requests, first first.
    faults: std::collections::VecDeque<Fault>,
}

/// What a real API server (or what sits between it and the node) does wrong now and then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// 500 Internal Server Error with a Status body.
    Status500,
    /// 200 OK whose body is not JSON.
    Garbage,
    /// A list cut short (Content-Length promises more than comes) or a watch stream cut in
    /// the middle of an event.
    Truncated,
    /// The answer, correct, after this long.
    Slow(Duration),
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// Bumped on stop: connections of an older generation end.
    generation: Mutex<u64>,
    open: Mutex<Vec<TcpStream>>,
}

/// A running (or stopped) fixture API server.
pub struct ApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    bind: Box<dyn Fn() -> TcpListener + Send + Sync>,
    running: Arc<AtomicBool>,
}

fn key(obj: &Value) -> String {
    let m = &obj["metadata"];
    format!(
        "{}/{}",
        m["namespace"].as_str().unwrap_or(""),
        m["name"].as_str().unwrap_or("")
    )
}

impl ApiServer {
    /// Start on a listener made by `bind` (called again on restart, so it can bind inside a
    /// network namespace).
    pub fn start(bind: impl Fn() -> TcpListener + Send + Sync + 'static) -> ApiServer {
        let listener = bind();
        let addr = listener.local_addr().expect("fixture address");
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                rv: 100,
                ..State::default()
            }),
            changed: Condvar::new(),
            generation: Mutex::new(0),
            open: Mutex::new(Vec::new()),
        });
        let server = ApiServer {
            shared,
            addr,
            bind: Box::new(bind),
            running: Arc::new(AtomicBool::new(false)),
        };
        server.serve(listener);
        server
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig pointing at this server.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: fixture, cluster: {{server: \"{}\"}}}}]\n\
             users: [{{name: u, user: {{}}}}]\ncontexts: [{{name: c, context: {{cluster: fixture, user: u}}}}]\n\
             current-context: c\n",
            self.url()
        )
    }

    fn serve(&self, listener: TcpListener) {
        self.running.store(true, Ordering::SeqCst);
        let shared = self.shared.clone();
        let running = self.running.clone();
        let generation = *shared.generation.lock().unwrap();
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        std::thread::spawn(move || {
            while running.load(Ordering::SeqCst) && *shared.generation.lock().unwrap() == generation
            {
                match listener.accept() {
                    Ok((stream, _)) => {
                        stream.set_nonblocking(false).ok();
                        if let Ok(c) = stream.try_clone() {
                            shared.open.lock().unwrap().push(c);
                        }
                        let shared = shared.clone();
                        std::thread::spawn(move || handle(stream, shared, generation));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
    }

    /// The next `n` requests (of any collection) meet `fault`.
    pub fn inject(&self, fault: Fault, n: usize) {
        let mut st = self.shared.state.lock().unwrap();
        st.faults.extend(std::iter::repeat_n(fault, n));
    }

    /// From now on, refuse streaming lists (`sendInitialEvents=true`) with kube-apiserver's
    /// answer when its WatchList gate is off: 422 Invalid.
    pub fn refuse_streaming_lists(&self) {
        self.shared.state.lock().unwrap().refuse_streaming = true;
    }

    /// Faults injected and not met yet.
    pub fn faults_pending(&self) -> usize {
        self.shared.state.lock().unwrap().faults.len()
    }

    /// Drop every connection and refuse new ones until `resume`.
    pub fn stop(&self) {
        self.running.store(false, Ordering::SeqCst);
        *self.shared.generation.lock().unwrap() += 1;
        for s in self.shared.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        self.shared.changed.notify_all();
        // Let the acceptor see the flag and close the listening socket.
        std::thread::sleep(Duration::from_millis(50));
    }

    /// Listen again on the same address.
    pub fn resume(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let l = (self.bind)();
            if l.local_addr().ok() == Some(self.addr) {
                self.serve(l);
                return;
            }
            assert!(Instant::now() < deadline, "cannot rebind {}", self.addr);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Drop the open watches (the server stays up): clients re-watch.
    pub fn drop_connections(&self) {
        for s in self.shared.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Forget history: a watch from any resourceVersion older than the current one gets
    /// 410 Gone, so clients must relist.
    pub fn compact(&self) {
        let mut st = self.shared.state.lock().unwrap();
        st.compacted = st.rv;
        st.history.clear();
    }

    /// Create or replace an object (its `kind` picks the collection).
    pub fn apply(&self, mut obj: Value) {
        let kind = obj["kind"].as_str().expect("object kind").to_string();
        let mut st = self.shared.state.lock().unwrap();
        st.rv += 1;
        let rv = st.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let k = key(&obj);
        let existed = st
            .objects
            .entry(kind.clone())
            .or_default()
            .insert(k, obj.clone())
            .is_some();
        let ty = if existed { "MODIFIED" } else { "ADDED" };
        st.history.push((rv, ty, kind, obj));
        drop(st);
        self.shared.changed.notify_all();
    }

    pub fn delete(&self, kind: &str, namespace: &str, name: &str) {
        let mut st = self.shared.state.lock().unwrap();
        let Some(mut obj) = st
            .objects
            .get_mut(kind)
            .and_then(|m| m.remove(&format!("{namespace}/{name}")))
        else {
            return;
        };
        st.rv += 1;
        let rv = st.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        st.history.push((rv, "DELETED", kind.to_string(), obj));
        drop(st);
        self.shared.changed.notify_all();
    }

    /// Requests seen so far (path and query).
    pub fn requests(&self) -> Vec<String> {
        self.shared.state.lock().unwrap().requests.clone()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Decode a query string value (%XX and +).
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let hex = (b[i] == b'%' && i + 2 < b.len())
            .then(|| std::str::from_utf8(&b[i + 1..i + 3]).ok())
            .flatten()
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (hex, b[i]) {
            (Some(v), _) => {
                out.push(v);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, c) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Label selector terms the kube client sends: `k`, `!k`, `k=v`, `k!=v`.
fn labels_match(selector: &str, obj: &Value) -> bool {
    let labels = obj["metadata"]["labels"].as_object();
    let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    selector.split(',').filter(|t| !t.is_empty()).all(|t| {
        if let Some(k) = t.strip_prefix('!') {
            get(k).is_none()
        } else if let Some((k, v)) = t.split_once("!=") {
            get(k) != Some(v)
        } else if let Some((k, v)) = t.split_once('=') {
            get(k.trim_end_matches('=')) == Some(v)
        } else {
            get(t).is_some()
        }
    })
}

fn fields_match(selector: &str, obj: &Value) -> bool {
    selector
        .split(',')
        .filter(|t| !t.is_empty())
        .all(|t| match t.split_once('=') {
            Some(("metadata.name", v)) => obj["metadata"]["name"].as_str() == Some(v),
            Some(("metadata.namespace", v)) => obj["metadata"]["namespace"].as_str() == Some(v),
            _ => true,
        })
}

fn write_head(s: &mut TcpStream, status: &str, chunked: bool, len: usize) -> std::io::Result<()> {
    if chunked {
        write!(
            s,
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
    } else {
        write!(
            s,
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
        )
    }
}

fn chunk(s: &mut TcpStream, line: &str) -> std::io::Result<()> {
    let data = format!("{line}\n");
    write!(s, "{:x}\r\n{data}\r\n", data.len())?;
    s.flush()
}

/// An object as served: its fields with `kind` and `apiVersion` set, written straight from
/// the stored object. Cloning each object to set them cost a 100k-object list seconds of
/// page faults in the fixture (perf: 72% of its samples in `clear_page_erms` under malloc),
/// time the agent's first sync in `agent_e2e` was measured waiting for.
fn write_typed(out: &mut Vec<u8>, o: &Value, kind: &str, api_version: &str) {
    let typed = |out: &mut Vec<u8>| {
        out.extend_from_slice(b"{\"kind\":");
        let _ = serde_json::to_writer(&mut *out, kind);
        out.extend_from_slice(b",\"apiVersion\":");
        let _ = serde_json::to_writer(&mut *out, api_version);
    };
    typed(out);
    for (k, v) in o.as_object().into_iter().flatten() {
        if k == "kind" || k == "apiVersion" {
            continue;
        }
        out.push(b',');
        let _ = serde_json::to_writer(&mut *out, k);
        out.push(b':');
        let _ = serde_json::to_writer(&mut *out, v);
    }
    out.push(b'}');
}

/// One watch event's line as kube-apiserver writes it: `type` before `object`, the field
/// order of apimachinery's `metav1.WatchEvent` (`pkg/apis/meta/v1/watch.go`). serde_json's
/// `json!` sorts keys, putting `object` first, and a decoder that meets the object before
/// the type must buffer it whole before reading it as its type (serde's `Content`), work
/// the agent does not do against a real API server.
fn event_line(ty: &str, object: &Value) -> String {
    format!("{{\"type\":\"{ty}\",\"object\":{object}}}")
}

/// A stored object's watch event line, typed, in [`event_line`]'s order.
fn write_event(out: &mut Vec<u8>, ty: &str, o: &Value, kind: &str, api_version: &str) {
    out.extend_from_slice(format!("{{\"type\":\"{ty}\",\"object\":").as_bytes());
    write_typed(out, o, kind, api_version);
    out.extend_from_slice(b"}\n");
}

/// Event lines in chunks of about 64 KiB, each ending at a line's end, for the initial
/// events of a streaming list. Watch events after it still go through [`chunk`], one each:
/// sent whole in one write, even one per chunk, the agent took `agent_e2e`'s changes two at
/// a time a third of the time (951 syncs for 1,440 changes, against 1,440); why was not found.
fn send_lines(s: &mut TcpStream, lines: &[u8]) -> std::io::Result<()> {
    let mut rest = lines;
    while !rest.is_empty() {
        let cut = rest
            .get(64 * 1024..)
            .and_then(|tail| tail.iter().position(|b| *b == b'\n'))
            .map_or(rest.len(), |i| 64 * 1024 + i + 1);
        let (piece, tail) = rest.split_at(cut);
        let mut out = format!("{:x}\r\n", piece.len()).into_bytes();
        out.extend_from_slice(piece);
        out.extend_from_slice(b"\r\n");
        s.write_all(&out)?;
        rest = tail;
    }
    Ok(())
}

/// One request per connection (every answer says `Connection: close`); the socket is shut
/// down at the end because a clone of it stays in the open list.
fn handle(stream: TcpStream, shared: Arc<Shared>, generation: u64) {
    let Ok(closer) = stream.try_clone() else {
        return;
    };
    answer(stream, shared, generation);
    let _ = closer.shutdown(std::net::Shutdown::Both);
}

fn answer(mut stream: TcpStream, shared: Arc<Shared>, generation: u64) {
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    // Headers: read and ignore (GET carries no body).
    loop {
        let mut h = String::new();
        match reader.read_line(&mut h) {
            Ok(0) | Err(_) => return,
            Ok(_) if h == "\r\n" || h == "\n" => break,
            Ok(_) => {}
        }
    }
    let target = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let fault = {
        let mut st = shared.state.lock().unwrap();
        st.requests.push(target.clone());
        st.faults.pop_front()
    };
    let watch = target.contains("watch=true");
    match fault {
        None => {}
        Some(Fault::Slow(d)) => std::thread::sleep(d),
        Some(Fault::Status500) => {
            let body = json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                "message":"etcdserver: request timed out","reason":"InternalError","code":500})
            .to_string();
            let _ = write_head(&mut stream, "500 Internal Server Error", false, body.len())
                .and_then(|_| stream.write_all(body.as_bytes()));
            return;
        }
        Some(Fault::Garbage) => {
            let body = "<html>502 bad gateway \u{0} {\"kind\":";
            let _ = write_head(&mut stream, "200 OK", false, body.len())
                .and_then(|_| stream.write_all(body.as_bytes()));
            return;
        }
        Some(Fault::Truncated) if watch => {
            let _ = write_head(&mut stream, "200 OK", true, 0).and_then(|_| {
                stream.write_all(b"40\r\n{\"type\":\"ADDED\",\"object\":{\"kind\":\"Serv")
            });
            return;
        }
        Some(Fault::Truncated) => {
            let body = r#"{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[{"#;
            let _ = write_head(&mut stream, "200 OK", false, body.len() + 4096)
                .and_then(|_| stream.write_all(body.as_bytes()));
            return;
        }
    }
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let params: BTreeMap<String, String> = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), decode(v)))
        .collect();
    let Some(&(_, kind, api_version)) = RESOURCES.iter().find(|(p, _, _)| *p == path) else {
        let body = json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
            "message":format!("the server could not find the requested resource ({path})"),
            "reason":"NotFound","code":404})
        .to_string();
        let _ = write_head(&mut stream, "404 Not Found", false, body.len())
            .and_then(|_| stream.write_all(body.as_bytes()));
        return;
    };
    let streaming_list = params.get("watch").map(String::as_str) == Some("true")
        && params.get("sendInitialEvents").map(String::as_str) == Some("true");
    if streaming_list && shared.state.lock().unwrap().refuse_streaming {
        // apimachinery's ValidateListOptions, as the API server sends it.
        let body = json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
            "message":"ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
            "reason":"Invalid","details":{"group":"meta.k8s.io","kind":"ListOptions",
            "causes":[{"reason":"FieldValueForbidden","message":"Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled","field":"sendInitialEvents"}]},
            "code":422})
        .to_string();
        let _ = write_head(&mut stream, "422 Unprocessable Entity", false, body.len())
            .and_then(|_| stream.write_all(body.as_bytes()));
        return;
    }
    let labels = params.get("labelSelector").cloned().unwrap_or_default();
    let fields = params.get("fieldSelector").cloned().unwrap_or_default();
    let selected = |o: &Value| labels_match(&labels, o) && fields_match(&fields, o);

    if params.get("watch").map(String::as_str) != Some("true") {
        let st = shared.state.lock().unwrap();
        let mut body = format!(
            "{{\"kind\":\"{kind}List\",\"apiVersion\":\"{api_version}\",\"metadata\":{{\"resourceVersion\":\"{}\"}},\"items\":[",
            st.rv
        )
        .into_bytes();
        let items = st.objects.get(kind).into_iter().flat_map(|m| m.values());
        for (i, o) in items.filter(|o| selected(o)).enumerate() {
            if i > 0 {
                body.push(b',');
            }
            write_typed(&mut body, o, kind, api_version);
        }
        drop(st);
        body.extend_from_slice(b"]}");
        let _ = write_head(&mut stream, "200 OK", false, body.len())
            .and_then(|_| stream.write_all(&body));
        return;
    }

    let mut from: u64 = params
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let bookmarks = params.get("allowWatchBookmarks").map(String::as_str) == Some("true");
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(290u64);
    let deadline = Instant::now() + Duration::from_secs(timeout);
    if write_head(&mut stream, "200 OK", true, 0).is_err() {
        return;
    }
    let mut last_bookmark = Instant::now();
    let mut st = shared.state.lock().unwrap();
    let streaming = params.get("sendInitialEvents").map(String::as_str) == Some("true");
    // A streaming list starts from the current state, whatever was compacted.
    if !streaming && from < st.compacted {
        let gone = event_line(
            "ERROR",
            &json!({"kind":"Status","apiVersion":"v1","metadata":{},
            "status":"Failure","message":format!("too old resource version: {from} ({})", st.compacted),
            "reason":"Expired","code":410}),
        );
        drop(st);
        let _ = chunk(&mut stream, &gone).and_then(|_| stream.write_all(b"0\r\n\r\n"));
        return;
    }
    // The streaming list (client-go's WatchList, on in kube-proxy v1.37): the current state
    // as ADDED events, then a bookmark marked as the end of the initial events.
    if streaming {
        let mut initial = Vec::new();
        let objects = st.objects.get(kind).into_iter().flat_map(|m| m.values());
        for o in objects.filter(|o| selected(o)) {
            write_event(&mut initial, "ADDED", o, kind, api_version);
        }
        let rv_now = st.rv;
        drop(st);
        if send_lines(&mut stream, &initial).is_err() {
            return;
        }
        let end = event_line(
            "BOOKMARK",
            &json!({"kind":kind,"apiVersion":api_version,
            "metadata":{"resourceVersion": rv_now.to_string(),
                "annotations": {"k8s.io/initial-events-end": "true"}}}),
        );
        if chunk(&mut stream, &end).is_err() {
            return;
        }
        from = rv_now;
        st = shared.state.lock().unwrap();
    }
    loop {
        if *shared.generation.lock().unwrap() != generation || Instant::now() > deadline {
            drop(st);
            let _ = stream.write_all(b"0\r\n\r\n");
            return;
        }
        let events: Vec<(u64, &'static str, Value)> = st
            .history
            .iter()
            .filter(|(rv, _, k, o)| *rv > from && k == kind && selected(o))
            .map(|(rv, t, _, o)| (*rv, *t, o.clone()))
            .collect();
        let rv_now = st.rv;
        drop(st);
        for (rv, ty, obj) in events {
            let mut line = Vec::new();
            write_event(&mut line, ty, &obj, kind, api_version);
            if chunk(&mut stream, &String::from_utf8_lossy(line.trim_ascii_end())).is_err() {
                return;
            }
            from = rv;
        }
        if bookmarks && last_bookmark.elapsed() > Duration::from_secs(1) {
            let bm = event_line(
                "BOOKMARK",
                &json!({"kind":kind,"apiVersion":api_version,
                "metadata":{"resourceVersion": rv_now.to_string()}}),
            );
            if chunk(&mut stream, &bm).is_err() {
                return;
            }
            from = from.max(rv_now);
            last_bookmark = Instant::now();
        }
        st = shared.state.lock().unwrap();
        st = shared
            .changed
            .wait_timeout(st, Duration::from_millis(200))
            .unwrap()
            .0;
    }
}
