//! Structure-aware inputs for `tests/fuzz.rs`: manifests made of Services and
//! EndpointSlices, and `KubeProxyConfiguration` documents, with every field the agent reads
//! present or not and drawn mostly from values that are valid and now and then (one in
//! twenty) from edge and wrong ones, so that most documents get past the parser and the
//! odd value reaches the code behind it. Written as YAML or JSON.

use crate::engine::Bytes;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{json, Value};

type Values = BoxedStrategy<Value>;

/// A string from `good`, or one time in twenty from `bad`.
fn pick(good: &'static [&'static str], bad: &'static [&'static str]) -> Values {
    let good = select(good).prop_map(|s| Value::String(s.to_string()));
    if bad.is_empty() {
        return good.boxed();
    }
    let bad = select(bad).prop_map(|s| Value::String(s.to_string()));
    prop_oneof![19 => good, 1 => bad].boxed()
}

/// `values`, or (half the time) the field left out: `null`, dropped by [`without_nulls`].
fn maybe(values: Values) -> Values {
    proptest::option::weighted(0.5, values)
        .prop_map(|v| v.unwrap_or(Value::Null))
        .boxed()
}

/// `values`, or (one time in ten) the field left out.
fn often(values: Values) -> Values {
    proptest::option::weighted(0.9, values)
        .prop_map(|v| v.unwrap_or(Value::Null))
        .boxed()
}

fn list(values: Values, max: usize) -> Values {
    maybe(vec(values, 0..max).prop_map(Value::Array).boxed())
}

fn names() -> Values {
    prop_oneof![
        19 => pick(&["web", "kube-dns", "a", "x-1", "default", "kube-system", "http", "dns-tcp"], &[]),
        1 => prop_oneof![
            pick(&["", "-x", "x-", "A", "a_b", "a.b", "1a", "é", "a b", "a\nb", "\"", "%"], &[]),
            (select(vec!["a", "a."]), 1usize..80).prop_map(|(s, n)| Value::String(s.repeat(n))),
        ],
    ]
    .boxed()
}

fn ips() -> Values {
    pick(
        &[
            "10.0.0.1",
            "172.30.0.41",
            "fd00::1",
            "2001:db8::10",
            "0.0.0.0",
            "::",
            "::ffff:10.0.0.1",
        ],
        &[
            "",
            "None",
            "256.1.1.1",
            " 10.0.0.2 ",
            "1.2.3",
            "fe80::1%eth0",
            "10.0.0.0/8",
            "localhost",
        ],
    )
}

fn cidrs() -> Values {
    pick(
        &[
            "10.0.0.0/8",
            "fd00::/64",
            "0.0.0.0/0",
            "::/0",
            "192.168.0.0/24",
        ],
        &[
            "10.0.0.0/33",
            "1.2.3.4/",
            "x",
            "",
            " 10.0.0.0/8",
            "10.0.0.1",
        ],
    )
}

/// Integers from `good`, or one time in twenty one past what a field takes, or not an
/// integer.
fn ints(good: &'static [i64]) -> Values {
    let edge = prop_oneof![
        select(vec![65536i64, -1, 32, 86401, 1001, -1001]).prop_map(|n| json!(n)),
        select(vec![
            i64::from(i32::MAX),
            i64::from(i32::MIN),
            i64::MAX,
            i64::MIN
        ])
        .prop_map(|n| json!(n)),
        any::<i32>().prop_map(|n| json!(n)),
        select(vec![json!(1.5), json!("80"), json!(true), json!(u64::MAX)]),
    ];
    prop_oneof![19 => select(good).prop_map(|n| json!(n)), 1 => edge].boxed()
}

const PORTS: &[i64] = &[1, 53, 80, 443, 8080, 65535];
const NODE_PORTS: &[i64] = &[0, 30080, 31999, 32767];

fn floats() -> Values {
    let good = select(vec![0.0f64, 0.5, 1.0, 5.0, 50.0, 100.5]);
    let edge = prop_oneof![
        select(vec![
            -1.0f64,
            1e-30,
            1e-46,
            3.4e38,
            1e39,
            f64::MAX,
            f64::MIN_POSITIVE
        ])
        .prop_map(|f| json!(f)),
        any::<f64>().prop_map(|f| json!(f)),
    ];
    prop_oneof![19 => good.prop_map(|f| json!(f)), 1 => edge].boxed()
}

/// Go durations from `good`; now and then an edge one or a number.
fn durations(good: &'static [&'static str]) -> Values {
    prop_oneof![
        39 => pick(good, &["2562047h", "2562048h", "-1s", "", "1", "0.000000001s", "1e3s", "1ns", "1h2m3.5s"]),
        1 => ints(&[0, 30]),
    ]
    .boxed()
}

const PERIODS: &[&str] = &["0s", "30s", "1m0s", "1h", "15m0s", "24h0m0s"];
const SHORT: &[&str] = &["0s", "1s", "500ms", "1.5s"];

fn flags() -> Values {
    prop_oneof![
        19 => any::<bool>().prop_map(Value::Bool),
        1 => select(vec![json!("true"), json!(1), json!("yes")]),
    ]
    .boxed()
}

/// `null`s dropped, as fields left out.
pub fn without_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => m
            .into_iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k, without_nulls(v)))
            .collect(),
        Value::Array(a) => a.into_iter().map(without_nulls).collect(),
        other => other,
    }
}

fn written(doc: &Value, as_json: bool) -> String {
    if as_json {
        doc.to_string()
    } else {
        serde_saphyr::to_string(doc).unwrap_or_default()
    }
}

const PROTOCOLS: &[&str] = &["TCP", "UDP", "SCTP"];
const BAD_PROTOCOLS: &[&str] = &["tcp", "", "ICMP"];

fn service() -> Values {
    let port = (
        maybe(names()),
        often(ints(PORTS)),
        maybe(prop_oneof![ints(PORTS), names()].boxed()),
        maybe(ints(NODE_PORTS)),
        maybe(pick(PROTOCOLS, BAD_PROTOCOLS)),
    )
        .prop_map(|(name, port, target, node_port, protocol)| {
            json!({"name": name, "port": port, "targetPort": target, "nodePort": node_port, "protocol": protocol})
        });
    let labels = (names(), proptest::option::weighted(0.1, names())).prop_map(
        |(app, proxy)| json!({"app": app, "service.kubernetes.io/service-proxy-name": proxy}),
    );
    let meta = (
        names(),
        maybe(names()),
        maybe(pick(
            &["2024-01-01T00:00:00Z", "2020-05-01T10:00:00+02:00"],
            &["0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z"],
        )),
        maybe(labels.boxed()),
    )
        .prop_map(|(name, ns, created, labels)| {
            json!({"name": name, "namespace": ns, "creationTimestamp": created, "labels": labels, "uid": "u"})
        });
    let policy = || maybe(pick(&["Local", "Cluster"], &["Other"]));
    let spec = (
        maybe(pick(
            &["ClusterIP", "NodePort", "LoadBalancer"],
            &["ExternalName", "Other"],
        )),
        often(ips()),
        list(ips(), 3),
        list(pick(&["IPv4", "IPv6"], &["IPv5"]), 3),
        list(ips(), 3),
        list(port.boxed(), 4),
        maybe(pick(&["ClientIP", "None"], &["Other"])),
        maybe(
            ints(&[1, 10800, 86400])
                .prop_map(|t| json!({"clientIP": {"timeoutSeconds": t}}))
                .boxed(),
        ),
        (policy(), policy()),
        maybe(ints(NODE_PORTS)),
        list(cidrs(), 3),
        maybe(pick(
            &["PreferClose", "PreferSameZone", "PreferSameNode"],
            &["Other"],
        )),
    )
        .prop_map(
            |(
                kind,
                ip,
                ips,
                families,
                external,
                ports,
                affinity,
                affinity_config,
                (etp, itp),
                hc,
                ranges,
                distribution,
            )| {
                json!({
                    "type": kind, "clusterIP": ip, "clusterIPs": ips, "ipFamilies": families,
                    "externalIPs": external, "ports": ports, "sessionAffinity": affinity,
                    "sessionAffinityConfig": affinity_config, "externalTrafficPolicy": etp,
                    "internalTrafficPolicy": itp, "healthCheckNodePort": hc,
                    "loadBalancerSourceRanges": ranges, "trafficDistribution": distribution,
                })
            },
        );
    let ingress = (maybe(ips()), maybe(pick(&["VIP", "Proxy"], &["Other"])))
        .prop_map(|(ip, mode)| json!({"ip": ip, "ipMode": mode}));
    (meta, often(spec.boxed()), list(ingress.boxed(), 3))
        .prop_map(|(metadata, spec, ingress)| {
            json!({
                "apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec,
                "status": {"loadBalancer": {"ingress": ingress}},
            })
        })
        .boxed()
}

fn endpoint_slice() -> Values {
    let port = (
        maybe(names()),
        often(ints(PORTS)),
        maybe(pick(PROTOCOLS, BAD_PROTOCOLS)),
    )
        .prop_map(
            |(name, port, protocol)| json!({"name": name, "port": port, "protocol": protocol}),
        );
    let named = || names().prop_map(|n| json!({ "name": n })).boxed();
    let endpoint = (
        vec(ips(), 0..3),
        (maybe(flags()), maybe(flags()), maybe(flags())),
        maybe(names()),
        maybe(names()),
        list(named(), 3),
        list(named(), 3),
    )
        .prop_map(
            |(addresses, (ready, serving, terminating), node, zone, zones, nodes)| {
                json!({
                    "addresses": addresses,
                    "conditions": {"ready": ready, "serving": serving, "terminating": terminating},
                    "nodeName": node, "zone": zone, "hints": {"forZones": zones, "forNodes": nodes},
                })
            },
        );
    (
        names(),
        maybe(names()),
        often(names()),
        pick(&["IPv4", "IPv6"], &["FQDN", "Other"]),
        list(port.boxed(), 4),
        list(endpoint.boxed(), 5),
    )
        .prop_map(|(name, ns, service, address_type, ports, endpoints)| {
            json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": name, "namespace": ns, "labels": {"kubernetes.io/service-name": service}},
                "addressType": address_type, "ports": ports, "endpoints": endpoints,
            })
        })
        .boxed()
}

/// Manifests of one to four Services and EndpointSlices: a JSON `List` or multi-document
/// YAML.
pub fn manifests() -> BoxedStrategy<Bytes> {
    (
        vec(prop_oneof![service(), endpoint_slice()], 1..5),
        any::<bool>(),
    )
        .prop_map(|(objects, as_json)| {
            let objects: Vec<Value> = objects.into_iter().map(without_nulls).collect();
            let text = if as_json {
                written(
                    &json!({"apiVersion": "v1", "kind": "List", "items": objects}),
                    true,
                )
            } else {
                objects
                    .iter()
                    .map(|o| written(o, false))
                    .collect::<Vec<_>>()
                    .join("---\n")
            };
            Bytes(text.into_bytes())
        })
        .boxed()
}

/// An `iptables` or `nftables` section.
fn mode_section() -> Values {
    (
        maybe(flags()),
        maybe(ints(&[0, 14, 15, 31])),
        maybe(durations(PERIODS)),
        maybe(durations(SHORT)),
        maybe(flags()),
    )
        .prop_map(|(all, bit, sync, min, localhost)| {
            json!({
                "masqueradeAll": all, "masqueradeBit": bit, "syncPeriod": sync,
                "minSyncPeriod": min, "localhostNodePorts": localhost,
            })
        })
        .boxed()
}

/// `KubeProxyConfiguration` documents.
pub fn configurations() -> BoxedStrategy<Bytes> {
    let d = || maybe(durations(PERIODS));
    let short = || maybe(durations(SHORT));
    let top = (
        maybe(pick(&["nftables", "iptables", "ipvs", ""], &["userspace"])),
        maybe(names()),
        maybe(ips()),
        maybe(pick(
            &["0.0.0.0:10256", "[::]:10256", "127.0.0.1", ""],
            &["::1", "1.2.3.4:99999", "x"],
        )),
        maybe(pick(
            &["127.0.0.1:10249", "[::1]:10249", "0.0.0.0", ""],
            &["x:1"],
        )),
        (maybe(flags()), maybe(flags()), maybe(flags())),
        maybe(pick(&["", "1.36"], &["1.35"])),
        maybe(pick(
            &["10.0.0.0/8", "10.0.0.0/8,fd00::/64", "", " 10.0.0.0/8 , "],
            &["a", "10.0.0.0/8,10.1.0.0/16,fd00::/64"],
        )),
        maybe(pick(
            &[
                "ClusterCIDR",
                "NodeCIDR",
                "BridgeInterface",
                "InterfaceNamePrefix",
                "",
            ],
            &["Other"],
        )),
        maybe(
            (maybe(names()), maybe(names()))
                .prop_map(|(b, p)| json!({"bridgeInterface": b, "interfaceNamePrefix": p}))
                .boxed(),
        ),
        list(
            prop_oneof![pick(&["primary", "localhost", "all"], &["x"]), cidrs()].boxed(),
            4,
        ),
        (maybe(ints(&[-999, 0, 1000])), maybe(names())),
    );
    let client = (maybe(names()), maybe(floats()), maybe(ints(&[0, 10, 100])), maybe(pick(&["application/json", "", "application/vnd.kubernetes.protobuf"], &[])))
        .prop_map(|(kubeconfig, qps, burst, content)| json!({"kubeconfig": kubeconfig, "qps": qps, "burst": burst, "contentType": content}));
    let vmodule =
        (names(), ints(&[0, 2, 4])).prop_map(|(p, v)| json!({"filePattern": p, "verbosity": v}));
    let stream = (
        maybe(flags()),
        maybe(prop_oneof![pick(&["0", "64Ki", "1M"], &["x"]), ints(&[0, 1024])].boxed()),
    )
        .prop_map(|(split, size)| json!({"splitStream": split, "infoBufferSize": size}));
    let logging = (maybe(pick(&["text", "json", ""], &["xml"])), short(), maybe(ints(&[0, 2, 4, 10])), list(vmodule.boxed(), 3), maybe(stream.clone().boxed()), maybe(stream.boxed()))
        .prop_map(|(format, flush, verbosity, vmodule, text, json)| json!({"format": format, "flushFrequency": flush, "verbosity": verbosity, "vmodule": vmodule, "options": {"text": text, "json": json}}));
    let ipvs = (maybe(pick(&["rr", "wrr", "lc", "sh", ""], &["fifo"])), maybe(flags()), list(cidrs(), 3), d(), short(), d(), d(), d())
        .prop_map(|(scheduler, strict, exclude, sync, min, tcp, fin, udp)| json!({"scheduler": scheduler, "strictARP": strict, "excludeCIDRs": exclude, "syncPeriod": sync, "minSyncPeriod": min, "tcpTimeout": tcp, "tcpFinTimeout": fin, "udpTimeout": udp}));
    let conntrack = (maybe(ints(&[0, 32768])), maybe(ints(&[0, 131072])), d(), d(), maybe(flags()), d(), d())
        .prop_map(|(per_core, min, established, close_wait, liberal, udp, stream)| json!({"maxPerCore": per_core, "min": min, "tcpEstablishedTimeout": established, "tcpCloseWaitTimeout": close_wait, "tcpBeLiberal": liberal, "udpTimeout": udp, "udpStreamTimeout": stream}));
    let gates = btree_map(
        select(vec![
            "KubeProxyIPVS",
            "AllowServiceExternalIPs",
            "MultiCIDRServiceAllocator",
            "SomethingElse",
            "KubeProxyNFTablesLocalhostNodePorts",
        ]),
        any::<bool>(),
        0..3,
    )
    .prop_map(|g| json!(g));
    (
        top,
        (maybe(client.boxed()), maybe(logging.boxed()), maybe(ipvs.boxed()), maybe(conntrack.boxed()), maybe(gates.boxed())),
        (maybe(mode_section()), maybe(mode_section()), d(), short(), d()),
        any::<bool>(),
    )
        .prop_map(|(top, (client, logging, ipvs, conntrack, gates), (iptables, nftables, sync, min, config_sync), as_json)| {
            let (mode, hostname, bind, healthz, metrics, (hard_fail, profiling, windows), hidden, cidr, detect_mode, detect, node_ports, (oom, port_range)) = top;
            let doc = without_nulls(json!({
                "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
                "mode": mode, "hostnameOverride": hostname, "bindAddress": bind,
                "healthzBindAddress": healthz, "metricsBindAddress": metrics,
                "bindAddressHardFail": hard_fail, "enableProfiling": profiling,
                "windowsRunAsService": windows, "showHiddenMetricsForVersion": hidden,
                "clusterCIDR": cidr, "detectLocalMode": detect_mode, "detectLocal": detect,
                "nodePortAddresses": node_ports, "oomScoreAdj": oom, "portRange": port_range,
                "clientConnection": client, "logging": logging, "ipvs": ipvs,
                "conntrack": conntrack, "featureGates": gates, "iptables": iptables,
                "nftables": nftables, "syncPeriod": sync, "minSyncPeriod": min,
                "configSyncPeriod": config_sync,
            }));
            Bytes(written(&doc, as_json).into_bytes())
        })
        .boxed()
}
