use super::*;

fn svc(yaml: &str) -> Service {
    serde_saphyr::from_str(yaml).unwrap()
}

#[test]
fn ports_and_families() {
    let s = svc(r#"
metadata: { name: web, namespace: ns }
spec:
  type: LoadBalancer
  clusterIPs: [172.30.0.1, "fd00::1"]
  ipFamilies: [IPv4, IPv6]
  externalIPs: [192.168.99.11]
  loadBalancerSourceRanges: [" 203.0.113.0/25 "]
  ports: [{ name: http, port: 80, nodePort: 30080 }, { name: dns, port: 53, protocol: UDP, nodePort: 30053 }]
status: { loadBalancer: { ingress: [{ ip: 1.2.3.4 }, { ip: 5.6.7.8, ipMode: Proxy }] } }
"#);
    let ports = service(&s, &mut Vec::new()).unwrap();
    assert_eq!(ports.len(), 4);
    let v4 = ports
        .iter()
        .find(|p| p.family == IpFamily::V4 && p.port == 80)
        .unwrap();
    assert_eq!(v4.node_port, 30080);
    assert_eq!(
        v4.external_ips,
        vec!["192.168.99.11".parse::<IpAddr>().unwrap()]
    );
    assert_eq!(
        v4.load_balancer_ips,
        vec!["1.2.3.4".parse::<IpAddr>().unwrap()]
    );
    assert_eq!(v4.load_balancer_source_ranges.len(), 1);
    let v6 = ports
        .iter()
        .find(|p| p.family == IpFamily::V6 && p.port == 80)
        .unwrap();
    assert!(v6.external_ips.is_empty());
}

#[test]
fn skipped_kinds() {
    for (yaml, why) in [
            ("metadata: {name: a}\nspec: {clusterIP: None, ports: [{port: 80}]}", "headless"),
            ("metadata: {name: a}\nspec: {type: ExternalName, externalName: x.example}", "ExternalName"),
            ("metadata: {name: a, labels: {service.kubernetes.io/service-proxy-name: other}}\nspec: {clusterIP: 10.0.0.1}", "another proxy"),
            ("metadata: {name: a, labels: {service.kubernetes.io/headless: ''}}\nspec: {clusterIP: 10.0.0.1}", "headless"),
        ] {
            match service(&svc(yaml), &mut Vec::new()) {
                Err(Skip::NotProxied { why: w, .. }) => assert!(w.contains(why), "{w}"),
                other => panic!("{yaml}: {other:?}"),
            }
        }
    let ours = svc("metadata: {name: a, labels: {service.kubernetes.io/service-proxy-name: switchyard}}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80}]}");
    assert_eq!(service(&ours, &mut Vec::new()).unwrap().len(), 1);
}

#[test]
fn names_the_api_server_would_refuse_are_skipped_naming_the_field() {
    for (yaml, field) in [
            ("metadata: {name: \"a\\nb\", namespace: n}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80}]}", "metadata.name"),
            ("metadata: {name: a, namespace: \"n s\"}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80}]}", "metadata.namespace"),
            ("metadata: {name: a, namespace: n}\nspec: {clusterIP: 10.0.0.1, ports: [{name: \"x\\\"\\n-A\", port: 80}]}", "spec.ports[0].name"),
            ("metadata: {name: 1a, namespace: n}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80}]}", "metadata.name"),
        ] {
            match service(&svc(yaml), &mut Vec::new()) {
                Err(Skip::Invalid { field: f, reason, .. }) => {
                    assert_eq!((f.as_str(), reason), (field, "bad_name"), "{yaml}");
                }
                other => panic!("{yaml}: {other:?}"),
            }
        }
    assert!(is_dns1123_subdomain("web-abc12.x"));
    assert!(!is_dns1123_subdomain("Web"));
    assert!(is_label_value("web_1.x") && !is_label_value("a\nb"));
}

#[test]
fn invalid_fields_are_named() {
    for (yaml, field) in [
            ("metadata: {name: a, namespace: n}\nspec: {clusterIP: 10.0.0.300, ports: [{port: 80}]}", "spec.clusterIPs[0]"),
            ("metadata: {name: a, namespace: n}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 70000}]}", "spec.ports[0].port"),
            ("metadata: {name: a, namespace: n}\nspec: {clusterIP: 10.0.0.1, ipFamilies: [IPv6], ports: [{port: 80}]}", "spec.ipFamilies[0]"),
        ] {
            match service(&svc(yaml), &mut Vec::new()) {
                Err(Skip::Invalid { field: f, object, .. }) => {
                    assert_eq!(f, field);
                    assert_eq!(object, "Service n/a");
                }
                other => panic!("{yaml}: {other:?}"),
            }
        }
}

#[test]
fn slices_merge_and_match_ports_by_name() {
    let a: EndpointSlice = serde_saphyr::from_str(r#"
metadata: { name: s-1, namespace: ns, labels: { kubernetes.io/service-name: s } }
addressType: IPv4
ports: [{ name: https, port: 8443 }]
endpoints:
- { addresses: [10.0.0.1], conditions: { ready: false, serving: true, terminating: true }, nodeName: n1 }
- { addresses: [10.0.0.2] }
"#).unwrap();
    let b: EndpointSlice = serde_saphyr::from_str(
        r#"
metadata: { name: s-2, namespace: ns, labels: { kubernetes.io/service-name: s } }
addressType: IPv4
ports: [{ name: https, port: 8443 }]
endpoints: [{ addresses: [10.0.0.1] }]
"#,
    )
    .unwrap();
    let (a, b) = (
        endpoint_slice(&a, &mut Vec::new()).unwrap(),
        endpoint_slice(&b, &mut Vec::new()).unwrap(),
    );
    let all: BTreeMap<_, _> = merge([&a, &b]).into_iter().collect();
    let key = ServicePortName::new("ns", "s", "https", Protocol::Tcp);
    let eps = &all[&key];
    assert_eq!(eps.len(), 2, "duplicate endpoint counted once");
    assert!(eps[0].ready, "the ready copy of a duplicate wins");
    assert_eq!(eps[0].port, 8443);
}

#[test]
fn slice_family_mismatch_is_invalid() {
    let s: EndpointSlice = serde_saphyr::from_str("metadata: {name: x, namespace: n, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports: [{port: 80}]\nendpoints: [{addresses: [\"fd00::1\"]}]").unwrap();
    assert!(matches!(
        endpoint_slice(&s, &mut Vec::new()),
        Err(Skip::Invalid {
            reason: "family_mismatch",
            ..
        })
    ));
}

/// Every clamp and drop names the object and the field (issue 29).
#[test]
fn convert_clamps_and_drops_name_object_and_field() {
    for (t, used) in [(0, 1), (-5, 1), (86401, 86400)] {
        let yaml = format!("metadata: {{name: a, namespace: n}}\nspec: {{clusterIP: 10.0.0.1, ports: [{{port: 80}}], sessionAffinity: ClientIP, sessionAffinityConfig: {{clientIP: {{timeoutSeconds: {t}}}}}}}");
        let mut warnings = Vec::new();
        let ports = service(&svc(&yaml), &mut warnings).unwrap();
        assert_eq!(
            ports[0].session_affinity,
            SessionAffinity::ClientIp {
                timeout_seconds: used
            }
        );
        assert_eq!(warnings.len(), 1, "{t}: {warnings:?}");
        assert!(
            warnings[0].contains("Service n/a")
                && warnings[0].contains("spec.sessionAffinityConfig.clientIP.timeoutSeconds")
                && warnings[0].contains(&t.to_string()),
            "{warnings:?}"
        );
    }
    let mut warnings = Vec::new();
    service(&svc("metadata: {name: a, namespace: n}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80}], sessionAffinity: ClientIP, sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}}"), &mut warnings).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");

    let fqdn: EndpointSlice = serde_saphyr::from_str("metadata: {name: x, namespace: n, labels: {kubernetes.io/service-name: s}}\naddressType: FQDN\nports: [{port: 80}]\nendpoints: [{addresses: [\"a.example\"]}]").unwrap();
    match endpoint_slice(&fqdn, &mut Vec::new()) {
        Err(Skip::Invalid { object, field, .. }) => {
            assert_eq!(
                (object.as_str(), field.as_str()),
                ("EndpointSlice n/x", "addressType")
            );
        }
        other => panic!("{other:?}"),
    }

    let null_port: EndpointSlice = serde_saphyr::from_str("metadata: {name: x, namespace: n, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports: [{name: all, port: null}, {name: http, port: 80}]\nendpoints: [{addresses: [\"10.1.0.1\"]}]").unwrap();
    let mut warnings = Vec::new();
    let eps = endpoint_slice(&null_port, &mut warnings).unwrap();
    let no_address: EndpointSlice = serde_saphyr::from_str("metadata: {name: x, namespace: n, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports: [{port: 80}]\nendpoints: [{addresses: []}]").unwrap();
    let mut w = Vec::new();
    endpoint_slice(&no_address, &mut w).unwrap();
    assert!(
        w.len() == 1
            && w[0].contains("EndpointSlice n/x")
            && w[0].contains("endpoints[0].addresses"),
        "{w:?}"
    );
    assert_eq!(eps.len(), 1);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("EndpointSlice n/x") && warnings[0].contains("ports[0].port"),
        "{warnings:?}"
    );
}
