//! Fuzzing of the parsers that read untrusted bytes, on the stable toolchain (proptest, with
//! the engine in `tests/fuzz/engine.rs`): manifests (YAML and JSON, with their objects
//! converted to the model), `KubeProxyConfiguration` files and Go durations, kube-proxy's
//! command line, and the HTTP request path of the health and metrics servers over real TCP.
//! Each target starts from its seeds in `tests/fuzz/corpus/<target>/` and runs
//! `SWITCHYARD_FUZZ_CASES` cases (256 by default). The iptables-save parser's target is in
//! `dataplane/tests/fuzz_iptables_save.rs`; the netlink decoders are not fuzzed here.
//! The regression tests at the end hold the inputs the fuzzing found to fail, exactly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "fuzz/engine.rs"]
mod engine;
#[path = "fuzz/objects.rs"]
mod objects;

use engine::{fuzz, inputs, Bytes, Verdict};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchyard::agent::api_client::TokenBucket;
use switchyard::agent::{health::Health, http, metrics::Metrics, servers, service_health};
use switchyard::config::{self, duration, v1alpha1};
use switchyard::{convert, kube_proxy_cli, manifests};

fn corpus_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz/corpus")
}

fn tmp() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// YAML and JSON syntax, and the fields and values of the objects the manifests hold.
#[rustfmt::skip]
const MANIFEST_TOKENS: &[&str] = &[
    ": ", ":", "- ", "---\n", "...\n", "\n", "\n  ", "\n    ", "{", "}", "[", "]", ", ", "#",
    "&a ", "*a", "&a [1, 2]", "<<: *a\n", "<<: ", "!!str ", "!!binary ", "!!int ", "!!map ",
    "!!set ", "!!null ", "!local ", "? ", "|\n  ", ">-\n  ", "%YAML 1.2\n",
    "%TAG ! tag:x,2000:\n", "~", "null", "true", "false", "yes", "0o17", "0b101", "1_000",
    "007", ".nan", ".inf", "-.inf", "1.5", "1e3", "\"\\u0000\"", "\"\\ud800\"", "\"\\x00\"",
    "apiVersion: v1\n", "apiVersion: discovery.k8s.io/v1\n",
    "apiVersion: networking.k8s.io/v1\n", "kind: Service\n", "kind: EndpointSlice\n",
    "kind: Node\n", "kind: ServiceCIDR\n", "kind: List\n", "kind: ServiceList\n", "items:\n",
    "items: ", "metadata:\n", "name: ", "namespace: ", "labels:\n",
    "kubernetes.io/service-name: ", "service.kubernetes.io/headless: ",
    "service.kubernetes.io/service-proxy-name: ", "spec:\n", "ports:\n", "port: ",
    "targetPort: ", "nodePort: ", "protocol: ", "SCTP", "UDP", "clusterIP: ", "clusterIPs: ",
    "None", "type: ", "LoadBalancer", "NodePort", "ExternalName", "selector:\n",
    "externalIPs: ", "sessionAffinity: ClientIP\n", "sessionAffinityConfig:\n",
    "timeoutSeconds: ", "externalTrafficPolicy: Local\n", "internalTrafficPolicy: Local\n",
    "healthCheckNodePort: ", "loadBalancerSourceRanges: ", "ipFamilies: ", "IPv4", "IPv6",
    "FQDN", "endpoints:\n", "addresses: ", "addressType: ", "conditions:\n", "ready: ",
    "serving: ", "terminating: ", "nodeName: ", "zone: ", "hints:\n", "forZones: ",
    "creationTimestamp: ", "2024-02-30T25:61:61Z", "resourceVersion: ", "cidrs: ", "podCIDRs: ",
    "status:\n", "loadBalancer:\n", "ingress:\n", "ip: ", "ipMode: Proxy\n", "taints:\n",
    "10.0.0.1", "::1", "fd00::/8", "256.0.0.1", "10.0.0.0/33", "::ffff:10.0.0.1",
    "fe80::1%eth0", "\"apiVersion\": \"v1\"", "\"kind\": \"Service\"", "\"kind\": \"List\"",
    "\"items\": [", "\"metadata\": {", "\"name\": ", "\"spec\": {", "\"ports\": [",
    "\"port\": ", "\"clusterIP\": ", "\"endpoints\": [", "\"addresses\": [",
];

const YAML_JSON_NESTS: &[(&str, &str)] = &[
    ("[", "]"),
    ("{\"a\": ", "}"),
    ("{a: ", "}"),
    ("- ", ""),
    ("!!seq [", "]"),
    ("[\"", "\"]"),
];

/// Cases whose manifest gave objects, and objects the conversion took: printed, to show
/// that the fuzzing gets past the parser.
static PARSED: AtomicU64 = AtomicU64::new(0);
static CONVERTED: AtomicU64 = AtomicU64::new(0);

/// Whatever a manifest parses into is converted as the agent converts it: that may refuse
/// an object, never panic.
fn convert_all(objects: &[manifests::Object]) {
    let mut warnings = Vec::new();
    let mut slices = Vec::new();
    let mut converted = 0;
    for o in objects {
        match o {
            manifests::Object::Service(s) => {
                converted += u64::from(convert::service(s, &mut warnings).is_ok());
            }
            manifests::Object::EndpointSlice(s) => {
                if let Ok(e) = convert::endpoint_slice(s, &mut warnings) {
                    slices.push(e);
                    converted += 1;
                }
            }
            manifests::Object::Node(_) | manifests::Object::ServiceCidr(_) => {}
        }
    }
    convert::merge(&slices);
    if !objects.is_empty() {
        PARSED.fetch_add(1, Ordering::Relaxed);
    }
    CONVERTED.fetch_add(converted, Ordering::Relaxed);
}

fn check_manifest(input: &Bytes) -> Verdict {
    let Ok(text) = std::str::from_utf8(&input.0) else {
        // Bytes that are not UTF-8 come in through a file, and are refused there.
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().join("m.yaml");
        std::fs::write(&path, &input.0).map_err(|e| e.to_string())?;
        let found = manifests::list(&path).map_err(|e| e.to_string())?;
        return match manifests::read_file(&found.files[0], manifests::MAX_FILE_BYTES) {
            Err(manifests::ManifestError::Read { .. }) => Ok(()),
            other => Err(format!("not UTF-8, yet read: {other:?}")),
        };
    };
    for path in ["fuzz.yaml", "fuzz.json"] {
        if let Ok(objects) = manifests::parse(text, Path::new(path)) {
            convert_all(&objects);
        }
    }
    Ok(())
}

#[test]
fn fuzz_manifests() {
    let seeds = engine::corpus(&corpus_root(), "manifests");
    assert!(
        seeds.iter().any(|s| {
            let text = String::from_utf8_lossy(s);
            manifests::parse(&text, Path::new("seed.yaml")).is_ok_and(|o| !o.is_empty())
        }),
        "no manifest seed parses into objects"
    );
    fuzz(
        "manifests",
        tmp(),
        prop_oneof![
            2 => inputs(seeds, MANIFEST_TOKENS, YAML_JSON_NESTS),
            1 => objects::manifests(),
        ],
        |input| check_manifest(&input),
    );
    println!(
        "fuzz manifests: {} parses gave objects, {} objects converted",
        PARSED.load(Ordering::Relaxed),
        CONVERTED.load(Ordering::Relaxed)
    );
}

/// The configuration file's fields and values.
#[rustfmt::skip]
const CONFIG_TOKENS: &[&str] = &[
    ": ", "- ", "---\n", "\n", "\n  ", "{", "}", "[", "]", ", ", "\"", "&a ", "*a", "<<: *a\n",
    "~", "null", "true", "false", "0", "-1", "0s", "30s", "1m0s", "1h", "-1s", "1.5h",
    "2562048h", "99999999999h", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n",
    "kind: KubeProxyConfiguration\n", "mode: ", "ipvs", "iptables", "nftables",
    "featureGates:\n", "KubeProxyIPVS: ", "clientConnection:\n", "qps: ", "burst: ",
    "kubeconfig: ", "contentType: ", "logging:\n", "format: ", "json", "text",
    "flushFrequency: ", "verbosity: ", "vmodule:\n", "- filePattern: ", "options:\n",
    "infoBufferSize: ", "splitStream: ", "hostnameOverride: ", "bindAddress: ", "::", "0.0.0.0",
    "healthzBindAddress: ", "metricsBindAddress: ", "[::1]:10249", "127.0.0.1:99999",
    "bindAddressHardFail: ", "enableProfiling: ", "showHiddenMetricsForVersion: ", "1.36",
    "iptables:\n", "ipvs:\n", "nftables:\n", "masqueradeAll: ", "masqueradeBit: ", "32",
    "syncPeriod: ", "minSyncPeriod: ", "localhostNodePorts: ", "scheduler: ", "rr",
    "strictARP: ", "excludeCIDRs: ", "tcpTimeout: ", "tcpFinTimeout: ", "udpTimeout: ",
    "winkernel:\n", "detectLocalMode: ", "BridgeInterface", "InterfaceNamePrefix", "NodeCIDR",
    "detectLocal:\n", "bridgeInterface: ", "interfaceNamePrefix: ", "clusterCIDR: ",
    "10.0.0.0/8,fd00::/64", "nodePortAddresses: ", "primary", "localhost", "oomScoreAdj: ",
    "conntrack:\n", "maxPerCore: ", "min: ", "tcpEstablishedTimeout: ", "tcpCloseWaitTimeout: ",
    "tcpBeLiberal: ", "udpStreamTimeout: ", "configSyncPeriod: ", "portRange: ",
    "windowsRunAsService: ",
];

/// `cfg` as it prints: what the printed form says in other words is said the printed way.
fn as_printed(cfg: &config::ProxyConfig) -> config::ProxyConfig {
    let mut cfg = cfg.clone();
    // An empty nodePortAddresses means `primary` in nftables mode, and prints so (as
    // kube-proxy's does).
    if cfg.mode == config::ProxyMode::Nftables && cfg.node_port_addresses.is_empty() {
        cfg.node_port_addresses = vec!["primary".into()];
    }
    cfg
}

/// Configurations that validated (and were printed back), printed like [`PARSED`].
static VALIDATED: AtomicU64 = AtomicU64::new(0);

fn check_config(input: &Bytes) -> Verdict {
    let text = input.text();
    let Ok((cfg, _)) = config::parse(&text, "fuzz.yaml") else {
        return Ok(());
    };
    let _ = v1alpha1::configz(&cfg);
    if config::validate(&cfg, "fuzz.yaml").is_err() {
        return Ok(());
    }
    VALIDATED.fetch_add(1, Ordering::Relaxed);
    // The API client's rate limit, as the agent builds it, paces requests past the burst.
    let bucket = TokenBucket::new(cfg.client.qps, cfg.client.burst);
    let now = std::time::Instant::now();
    for _ in 0..=cfg.client.burst.clamp(0, 64) + 2 {
        let _ = bucket.reserve(now);
    }
    // What `--write-config-to` writes reads back as the same configuration.
    let printed = v1alpha1::to_yaml(&cfg);
    match config::parse(&printed, "printed") {
        Ok((again, _)) if again == as_printed(&cfg) => Ok(()),
        Ok((again, _)) => Err(format!(
            "printed back and read again, the configuration differs:\n{printed}\nread: {cfg:?}\nagain: {again:?}"
        )),
        Err(e) => Err(format!(
            "printed back, the configuration does not parse: {e}\n{printed}"
        )),
    }
}

#[test]
fn fuzz_config_file() {
    let seeds = engine::corpus(&corpus_root(), "config");
    assert!(
        seeds
            .iter()
            .any(|s| config::parse(&String::from_utf8_lossy(s), "seed").is_ok()),
        "no configuration seed parses"
    );
    fuzz(
        "config",
        tmp(),
        prop_oneof![
            2 => inputs(seeds, CONFIG_TOKENS, YAML_JSON_NESTS),
            1 => objects::configurations(),
        ],
        |input| check_config(&input),
    );
    println!(
        "fuzz config: {} configurations validated and read back",
        VALIDATED.load(Ordering::Relaxed)
    );
}

const DURATION_UNITS: &[&str] = &[
    "ns", "us", "µs", "μs", "ms", "s", "m", "h", "", "x", "S", "mm", "hh", "µ", ".", "e3",
];

/// Durations as Go writes them, and near misses: numbers of up to 30 digits with or without
/// a fraction, each with a unit or something like one, after an optional sign or space.
fn durations() -> BoxedStrategy<Bytes> {
    let digits = || vec(select(&b"0123456789"[..]), 0..30);
    let part = (
        digits(),
        proptest::option::of(digits()),
        select(DURATION_UNITS),
    )
        .prop_map(|(int, frac, unit)| {
            let mut s = String::from_utf8(int).unwrap_or_default();
            if let Some(f) = frac {
                s.push('.');
                s.push_str(&String::from_utf8(f).unwrap_or_default());
            }
            s + unit
        });
    (select(vec!["", "+", "-", " ", "\t", "++"]), vec(part, 1..6))
        .prop_map(|(sign, parts)| Bytes(format!("{sign}{}", parts.concat()).into_bytes()))
        .boxed()
}

fn check_duration(input: &Bytes) -> Verdict {
    let text = input.text();
    let Some(d) = duration::parse(&text) else {
        return Ok(());
    };
    if d.as_nanos() > i64::MAX as u128 {
        return Err(format!("{text:?} parsed past Go's range: {d:?}"));
    }
    let printed = duration::format(d);
    match duration::parse(&printed) {
        Some(again) if again == d => Ok(()),
        other => Err(format!(
            "{text:?} is {d:?}, printed {printed:?}, read back as {other:?}"
        )),
    }
}

#[test]
fn fuzz_config_duration() {
    let seeds = engine::corpus(&corpus_root(), "duration");
    let strategy = prop_oneof![
        1 => inputs(seeds, DURATION_UNITS, &[]),
        1 => durations(),
    ];
    fuzz("duration", tmp(), strategy, |input| check_duration(&input));
}

/// Values a kube-proxy flag might be given, good and bad.
#[rustfmt::skip]
const FLAG_VALUES: &[&str] = &[
    "", "true", "false", "True", "0", "1", "-1", "31", "32", "65535", "65536", "-1000", "1001",
    "2147483648", "99999999999999999999", "NaN", "inf", "-0", "1e3", "0.5", "30s", "1m0s", "0s",
    "-1s", "2562048h", "1.5h", "10.0.0.0/8", "10.0.0.0/8,fd00::/64", "10.0.0.0/33", "::1",
    "0.0.0.0", "127.0.0.1:10249", "[::1]:99999", "ipvs", "iptables", "nftables", "kernelspace",
    "rr", "mh", "lc", "ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix",
    "cbr0", "veth", "primary", "localhost,all", "KubeProxyIPVS=false",
    "AllowServiceExternalIPs=true,Foo", "a=b", "text", "json", "raw", "pattern=2,x=y", "-",
    "--", "=", "NODE", "Node-A.Example", "application/json", "/dev/null", "nft", "legacy",
];

/// One or two arguments: a flag with a value in any of pflag's forms, a bare flag, a
/// short one, or something that is not a flag. `--config` names one of `config_paths`.
fn cli_args(config_paths: Vec<String>) -> BoxedStrategy<Vec<String>> {
    // `--config` takes a path, so it gets its own arm: a soup of values could otherwise name
    // a device or FIFO, and reading that would block.
    let names: Vec<&'static str> = kube_proxy_cli::FLAGS
        .iter()
        .map(|f| f.name)
        .filter(|n| *n != "config")
        .collect();
    let value = prop_oneof![
        4 => select(FLAG_VALUES).prop_map(str::to_string),
        1 => inputs(
            FLAG_VALUES.iter().map(|v| v.as_bytes().to_vec()).collect(),
            FLAG_VALUES,
            &[],
        )
        .prop_map(|b| b.text().chars().take(256).collect::<String>()),
    ];
    prop_oneof![
        6 => (select(names.clone()), value.clone()).prop_map(|(n, v)| vec![format!("--{n}={v}")]),
        3 => (select(names.clone()), value.clone()).prop_map(|(n, v)| vec![format!("--{n}"), v]),
        2 => select(names.clone()).prop_map(|n| vec![format!("--{n}")]),
        1 => select(names).prop_map(|n| vec![format!("--{}", n.replace('-', "_"))]),
        1 => value.clone().prop_map(|v| vec![format!("-v{v}")]),
        1 => value.clone().prop_map(|v| vec![format!("-v={v}")]),
        1 => value.prop_map(|v| vec!["-v".to_string(), v]),
        1 => select(config_paths).prop_map(|p| vec![format!("--config={p}")]),
        1 => select(vec![
            "-h", "--", "-", "", "--=", "---", "-vv", "--v=", "-x", "--help=maybe", "--version=raw",
            "--version", "--unknown", "--help", "-hh", "kube-proxy", "--=x",
        ])
        .prop_map(|s| vec![s.to_string()]),
        1 => vec(any::<char>(), 0..16).prop_map(|cs| vec![cs.into_iter().collect()]),
    ]
    .boxed()
}

/// Command lines `invocation` took, printed like [`PARSED`].
static UNDERSTOOD: AtomicU64 = AtomicU64::new(0);

#[test]
fn fuzz_kube_proxy_command_line() {
    // The configuration seeds, as files `--config` can name; and paths that are not one.
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut config_paths = vec![
        String::new(),
        "/nonexistent/config.conf".to_string(),
        "/dev/null".to_string(),
        "/".to_string(),
    ];
    for (i, seed) in engine::corpus(&corpus_root(), "config")
        .into_iter()
        .enumerate()
    {
        let path = dir.path().join(format!("config-{i}.yaml"));
        std::fs::write(&path, seed).expect("write a configuration");
        config_paths.push(path.display().to_string());
    }
    let seeds: Vec<Vec<String>> = engine::corpus(&corpus_root(), "kube-proxy-cli")
        .into_iter()
        .map(|s| {
            String::from_utf8_lossy(&s)
                .lines()
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect()
        })
        .collect();
    let strategy = (select(seeds), vec(cli_args(config_paths), 0..12)).prop_map(
        |(seed, extra): (Vec<String>, Vec<Vec<String>>)| {
            let mut args = vec!["kube-proxy".to_string()];
            args.extend(seed);
            args.extend(extra.into_iter().flatten());
            args
        },
    );
    fuzz("kube-proxy-cli", tmp(), strategy, |args: Vec<String>| {
        let _ = kube_proxy_cli::wanted(&args);
        let _ = kube_proxy_cli::parse_args(&args[1..]);
        let Ok(inv) = kube_proxy_cli::invocation(&args[1..]) else {
            return Ok(());
        };
        UNDERSTOOD.fetch_add(1, Ordering::Relaxed);
        if matches!(
            inv.action,
            kube_proxy_cli::Action::Help | kube_proxy_cli::Action::Version { .. }
        ) {
            return Ok(());
        }
        // What `--write-config-to` writes for this command line is a file that reads and
        // validates.
        let printed = v1alpha1::to_yaml(&inv.config);
        match config::parse(&printed, "printed") {
            Ok((cfg, _)) => config::validate(&cfg, "printed").map_err(|e| {
                format!("written out, the configuration does not validate: {e}\n{printed}")
            })?,
            Err(e) => {
                return Err(format!(
                    "written out, the configuration does not parse: {e}\n{printed}"
                ))
            }
        }
        // The API client's rate limit, as the agent builds it, paces requests past the burst.
        let bucket = TokenBucket::new(inv.config.client.qps, inv.config.client.burst);
        let now = std::time::Instant::now();
        for _ in 0..=inv.config.client.burst.clamp(0, 64) + 2 {
            let _ = bucket.reserve(now);
        }
        Ok(())
    });
    println!(
        "fuzz kube-proxy-cli: {} command lines understood",
        UNDERSTOOD.load(Ordering::Relaxed)
    );
    drop(dir);
}

/// HTTP/1 request pieces: methods, targets, versions, header names and values.
#[rustfmt::skip]
const HTTP_TOKENS: &[&str] = &[
    "GET ", "HEAD ", "POST ", "OPTIONS ", "CONNECT ", "PRI ", " ", "\r\n", "\n", "\r\n\r\n",
    "HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/0.9", "/healthz", "/livez", "/metrics",
    "/proxyMode", "/configz", "/healthz/ping", "*", "http://x/healthz", "x:80", "?a=b", "#f",
    "%2e%2e/", "//", "Host: x\r\n", "Content-Length: ", "Transfer-Encoding: chunked\r\n",
    "Connection: close\r\n", "Connection: keep-alive\r\n", "Expect: 100-continue\r\n",
    "Upgrade: h2c\r\n", "Accept: */*\r\n", ": ", ":", "0\r\n\r\n", "5\r\nhello\r\n",
    "ffffffffffffffffff\r\n", "\r\n ", "\t",
];

/// A request built from parts: a method, a target, a version, headers (some conflicting or
/// malformed) and a body, with one line ending throughout.
fn requests() -> BoxedStrategy<Bytes> {
    let method = prop_oneof![
        4 => select(vec!["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "CONNECT", "PATCH", "PRI", "get", "G ET", ""]).prop_map(|m| m.as_bytes().to_vec()),
        1 => vec(any::<u8>(), 0..12),
    ];
    let segment = prop_oneof![
        4 => select(vec!["healthz", "livez", "metrics", "proxyMode", "configz", "ping", "", "..", ".", "%2e", "%00", "%", "%zz", "?", "#", "a b", "\u{e9}", "\u{0}"]).prop_map(str::to_string),
        1 => vec(any::<char>(), 0..8).prop_map(|c| c.into_iter().collect()),
        1 => (select(vec!["a", "%41", "/"]), 1usize..9000).prop_map(|(s, n)| s.repeat(n)),
    ];
    let target = prop_oneof![
        4 => vec(segment, 1..5).prop_map(|s| format!("/{}", s.join("/"))),
        1 => select(vec!["*", "", "healthz", "http://x/healthz", "http://[::1/", "x:80", "//healthz", "/healthz?x=1", "/healthz#f"]).prop_map(str::to_string),
    ];
    let version = select(vec![
        "HTTP/1.1",
        "HTTP/1.0",
        "HTTP/2.0",
        "HTTP/0.9",
        "http/1.1",
        "HTTP/1.12",
        "",
        "HTTP/9.9",
        "HTTP/1.1 x",
    ]);
    let header_name = prop_oneof![
        4 => select(vec!["Host", "Content-Length", "Transfer-Encoding", "Connection", "Expect", "Upgrade", "Accept", "User-Agent", "", " Host", "Host ", "Bad\0Name", "X-\u{e9}"]).prop_map(str::to_string),
        1 => vec(any::<char>(), 0..12).prop_map(|c| c.into_iter().collect()),
    ];
    let header_value = prop_oneof![
        4 => select(vec!["x", "0", "5", "-1", "18446744073709551616", "chunked", "gzip, chunked", "close", "keep-alive", "100-continue", "h2c", "a\r\n b", "\0", "\u{e9}", ""]).prop_map(str::to_string),
        1 => vec(any::<char>(), 0..24).prop_map(|c| c.into_iter().collect()),
        1 => (1usize..40000).prop_map(|n| "v".repeat(n)),
    ];
    let body = prop_oneof![
        3 => Just(Vec::new()),
        1 => vec(any::<u8>(), 0..256),
        1 => select(vec!["5\r\nhello\r\n0\r\n\r\n", "ffffffffffffffffff\r\n", "0\r\n", "x\r\n\r\n", "5;a=b\r\nhello\r\n0\r\nT: v\r\n\r\n"]).prop_map(|b| b.as_bytes().to_vec()),
    ];
    let eol = select(vec!["\r\n", "\n", "\r", "\n\r"]);
    (
        method,
        target,
        version,
        vec((header_name, header_value), 0..12),
        body,
        eol,
    )
        .prop_map(|(method, target, version, headers, body, eol)| {
            let mut r = method;
            r.extend(format!(" {target} {version}{eol}").into_bytes());
            for (n, v) in headers {
                r.extend(format!("{n}: {v}{eol}").into_bytes());
            }
            r.extend(eol.as_bytes());
            r.extend(body);
            r.truncate(engine::MAX_INPUT);
            Bytes(r)
        })
        .boxed()
}

/// Send `request` on a new connection, end the sending side, and read until the server
/// closes. `Err` when it neither answered nor closed within `wait`.
fn exchange(addr: SocketAddr, request: &[u8], wait: Duration) -> Result<Vec<u8>, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(wait)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(wait)).map_err(|e| e.to_string())?;
    // The server may answer and close before all is sent: a failed write is fine.
    let _ = s.write_all(request);
    let _ = s.shutdown(Shutdown::Write);
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(out),
            Err(e) => {
                return Err(format!(
                    "no answer and not closed within {wait:?} ({e}); got {} bytes",
                    out.len()
                ))
            }
        }
    }
}

/// Servers on 127.0.0.1 as the agent runs them: the metrics routes, the healthz routes and
/// a health-check node port, on a runtime of their own. Their addresses.
fn http_servers() -> (tokio::runtime::Runtime, Vec<SocketAddr>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let metrics = Metrics::new(&[dataplane::model::IpFamily::V4]).expect("metrics");
    let health = Arc::new(Mutex::new(Health::new(Duration::from_secs(60))));
    let entry = service_health::Entry {
        namespace: "default".into(),
        name: "web".into(),
        local_endpoints: 1,
    };
    let routers: Vec<http::Router> = vec![
        servers::metrics_router(
            metrics.clone(),
            health.clone(),
            config::ProxyMode::Nftables,
            v1alpha1::configz(&config::ProxyConfig::default()),
        ),
        servers::health_router(health, metrics),
        Arc::new(move |_path| service_health::reply(Some(&entry), true)),
    ];
    let addrs = rt.block_on(async {
        let mut addrs = Vec::new();
        for route in routers {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            addrs.push(listener.local_addr().expect("address"));
            let limits = http::Limits {
                timeouts: http::Timeouts {
                    header_read: Duration::from_secs(2),
                    idle: Duration::from_secs(2),
                },
                pool: http::limit::Pool::new("fuzz", 64),
            };
            tokio::spawn(http::serve(listener, route, limits));
        }
        addrs
    });
    (rt, addrs)
}

#[test]
fn fuzz_http_request_path() {
    let (rt, addrs) = http_servers();
    let seeds = engine::corpus(&corpus_root(), "http");
    let strategy = (
        select(addrs),
        prop_oneof![
            1 => inputs(seeds, HTTP_TOKENS, &[]),
            1 => requests(),
        ],
    );
    fuzz(
        "http",
        tmp(),
        strategy,
        |(addr, request): (SocketAddr, Bytes)| {
            let wait = Duration::from_secs(10);
            let answer = exchange(addr, &request.0, wait)?;
            if !answer.is_empty() {
                let status = answer
                    .strip_prefix(b"HTTP/1.1 ")
                    .or_else(|| answer.strip_prefix(b"HTTP/1.0 "))
                    .and_then(|rest| rest.get(..3))
                    .and_then(|code| std::str::from_utf8(code).ok())
                    .and_then(|code| code.parse::<u16>().ok());
                match status {
                    Some(500..=502) | None => {
                        return Err(format!(
                            "not an answer expected: {:?}",
                            Bytes(answer[..answer.len().min(200)].to_vec())
                        ))
                    }
                    Some(_) => {}
                }
            }
            // Whatever came before, the next plain request is answered.
            let probe = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
            let answer = exchange(addr, probe, wait)?;
            if !answer.starts_with(b"HTTP/1.1 200 ") {
                return Err(format!(
                    "after it, GET /healthz was answered {:?}",
                    Bytes(answer[..answer.len().min(200)].to_vec())
                ));
            }
            Ok(())
        },
    );
    drop(rt);
}

// Regression tests: each input the fuzzing found to fail, exactly as it was found.

/// Found by `fuzz_http_request_path`: a client that shuts down its sending side right after
/// its request (the fuzz target's every request) sometimes got no answer at all, since hyper
/// dropped a connection on the end of its input while the answer was still to be written
/// (`half_close` off). Hundreds of plain requests, each half-closed, all answered.
#[test]
fn half_closed_requests_are_answered() {
    let (rt, addrs) = http_servers();
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    for i in 0..3000 {
        let addr = addrs[i % addrs.len()];
        let answer = exchange(addr, request, Duration::from_secs(10)).expect("answered or closed");
        assert!(
            answer.starts_with(b"HTTP/1.1 200 "),
            "request {i} to {addr}: {:?}",
            Bytes(answer)
        );
    }
    drop(rt);
}

/// Found by `fuzz_config_file`: `clientConnection.qps: 1.0e-30` was taken, and the API
/// client's rate limit panicked once the burst was spent (a wait of 1e30 s does not fit a
/// `Duration`); `--kube-api-qps=1e-30` did the same. Such a rate now waits for ever.
#[test]
fn a_tiny_qps_waits_for_ever_instead_of_panicking() {
    let input = b"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nclientConnection:\n  qps: 1.0e-30\nkind: KubeProxyConfiguration\n";
    check_config(&Bytes(input.to_vec())).unwrap();
    let (from_file, _) = config::parse(std::str::from_utf8(input).unwrap(), "f").unwrap();
    let from_flags = kube_proxy_cli::invocation(&["--kube-api-qps=1e-30".to_string()])
        .unwrap()
        .config;
    for cfg in [from_file, from_flags] {
        let bucket = TokenBucket::new(cfg.client.qps, cfg.client.burst);
        let now = std::time::Instant::now();
        for _ in 0..cfg.client.burst {
            assert_eq!(bucket.reserve(now), Duration::ZERO);
        }
        assert_eq!(bucket.reserve(now), Duration::MAX);
    }
}

/// Found by `fuzz_config_file`: `clientConnection.qps: 1.0e-46`, below what a float32 holds,
/// became 0, which the API client takes for no limit at all (and `--write-config-to` wrote
/// 0, read back as the default). kube-proxy reads it as zero, its "unset": the default, 5.
/// A qps past float32, which kube-proxy refuses, is now refused too, naming the field.
#[test]
fn a_qps_outside_float32_is_read_as_kube_proxy_reads_it() {
    let input = b"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nclientConnection:\n  qps: 1.0e-46\nkind: KubeProxyConfiguration\n";
    check_config(&Bytes(input.to_vec())).unwrap();
    let (cfg, _) = config::parse(std::str::from_utf8(input).unwrap(), "f").unwrap();
    assert_eq!(cfg.client.qps, 5.0);
    let e = config::parse("clientConnection:\n  qps: 1.0e39\n", "f")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("field clientConnection.qps") && e.contains("32-bit"),
        "{e}"
    );
}

/// Found by `fuzz_config_file`: a `logging.vmodule` verbosity past uint32 (kube-proxy's type,
/// which refuses it) was taken, and written back by `--write-config-to` as 0. It is now an
/// error naming the field.
#[test]
fn a_vmodule_verbosity_past_uint32_is_an_error() {
    let input = b"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nlogging:\n  options: {}\n  vmodule:\n  - filePattern: web\n    verbosity: 18446744073709551615\n";
    check_config(&Bytes(input.to_vec())).unwrap();
    let e = config::parse(std::str::from_utf8(input).unwrap(), "f")
        .unwrap_err()
        .to_string();
    assert!(e.contains("field logging.vmodule[0].verbosity"), "{e}");
}

/// Found by `fuzz_config_file`: `logging.flushFrequency` as an integer of nanoseconds took
/// any u64, past Go's int64 Duration (kube-proxy refuses it), and `--write-config-to` then
/// wrote `5124095h34m33.709551615s`, which does not read back. It is now an error naming the
/// field.
#[test]
fn a_flush_frequency_past_int64_nanoseconds_is_an_error() {
    let input = b"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nlogging:\n  flushFrequency: 18446744073709551615\n  options: {}\n";
    check_config(&Bytes(input.to_vec())).unwrap();
    let e = config::parse(std::str::from_utf8(input).unwrap(), "f")
        .unwrap_err()
        .to_string();
    assert!(e.contains("field logging.flushFrequency"), "{e}");
    let (cfg, _) = config::parse("logging:\n  flushFrequency: 9223372036854775807\n", "f").unwrap();
    assert_eq!(cfg.logging.flush_frequency.as_nanos(), i64::MAX as u128);
}

/// The command line the fuzzer found these with, ending in `last`.
fn found_command_line(last: &str) -> Vec<String> {
    [
        "--proxy-mode=iptables",
        "--cluster-cidr=10.244.0.0/16",
        "--conntrack-max-per-core=0",
        "--iptables-min-sync-period=0s",
        "--kube-api-content-type=application/json",
        "--hostname-override",
        "node-a",
        "-v=4",
        "--logging-format=json",
        "--feature-gates=AllowServiceExternalIPs=false",
        "--nodeport-addresses=primary,10.0.0.0/8",
        "--healthz-port=0",
        last,
    ]
    .map(String::from)
    .to_vec()
}

/// Found by `fuzz_kube_proxy_command_line`: `--kube-api-burst=-1000` was taken, although
/// kube-proxy's validation refuses a negative burst (as Switchyard did in a file), and
/// `--write-config-to` wrote a file that does not read back. It is now refused, naming
/// clientConnection.burst.
#[test]
fn a_negative_burst_flag_is_refused() {
    let args = found_command_line("--kube-api-burst=-1000");
    let e = kube_proxy_cli::invocation(&args).unwrap_err().to_string();
    assert!(e.contains("clientConnection.burst"), "{e}");
    assert!(kube_proxy_cli::invocation(&["--kube-api-burst=0".to_string()]).is_ok());
}

/// Found by `fuzz_kube_proxy_command_line`: `--conntrack-max-per-core=-1000` was taken
/// (and so was a negative `--conntrack-min`), although kube-proxy's validation refuses both,
/// as Switchyard did in a file; `--write-config-to` wrote a file that does not read back.
/// Both are now refused, naming the field.
#[test]
fn negative_conntrack_flags_are_refused() {
    let args = found_command_line("--conntrack-max-per-core=-1000");
    let e = kube_proxy_cli::invocation(&args).unwrap_err().to_string();
    assert!(e.contains("conntrack.maxPerCore"), "{e}");
    let e = kube_proxy_cli::invocation(&["--conntrack-min=-1".to_string()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("conntrack.min"), "{e}");
}
