use super::*;
use crate::config::ProxyConfig;

struct NoInterfaces;

impl NodeAddressSource for NoInterfaces {
    fn addresses(&self) -> Vec<IpAddr> {
        Vec::new()
    }
}

/// The snapshot built as objects arrive is the one built from them all decoded: the later
/// copy of an object defined twice in effect, with the same warnings in the same order, the
/// same invalid and ignored objects, the node's addresses from its Node object.
#[test]
fn a_snapshot_built_as_objects_arrive_is_the_one_built_from_them_all() {
    let dir = tempfile::tempdir().unwrap();
    let svc = |name: &str, ip: &str, extra: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{ name: {name}, namespace: ns }}\n\
             spec: {{ clusterIP: {ip}, ports: [{{ name: p, port: 80 }}]{extra} }}\n"
        )
    };
    let slice = |name: &str, svc: &str, family: &str, ip: &str| {
        format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{ name: {name}, namespace: ns, labels: {{ kubernetes.io/service-name: {svc} }} }}\n\
             addressType: {family}\nports: [{{ name: p, port: 8080 }}, {{ name: all }}]\n\
             endpoints: [{{ addresses: [\"{ip}\"] }}]\n"
        )
    };
    let a = [
        svc("a", "10.96.0.1", ""),
        svc(
            "t",
            "10.96.0.4",
            ", sessionAffinity: ClientIP, sessionAffinityConfig: { clientIP: { timeoutSeconds: 999999 } }",
        ),
        slice("a-1", "a", "IPv4", "10.0.0.1"),
        slice("f-1", "a", "FQDN", "example.com"),
        "apiVersion: v1\nkind: Node\nmetadata: { name: bench }\nstatus: { addresses: [{ type: InternalIP, address: 192.168.0.9 }] }\n".to_string(),
    ];
    let b = [
        svc("a", "10.96.0.2", ""),
        svc("bad", "not-an-ip", ""),
        slice("a-1", "a", "IPv4", "10.0.0.2"),
        "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: { name: c }\nspec: { cidrs: [10.96.0.0/16] }\n".to_string(),
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: { name: nolabel, namespace: ns }\naddressType: IPv4\nendpoints: []\n".to_string(),
    ];
    std::fs::write(dir.path().join("a.yaml"), a.join("---\n")).unwrap();
    std::fs::write(dir.path().join("b.yaml"), b.join("---\n")).unwrap();
    let cfg = ProxyConfig {
        hostname_override: Some("bench".into()),
        ..ProxyConfig::default()
    };

    let whole = build(&cfg, &manifests::load(dir.path()).unwrap(), &NoInterfaces);
    let mut builder = Builder::new(&cfg);
    manifests::load_each(dir.path(), &mut |o, place| builder.push(o, place)).unwrap();
    let streamed = builder.finish(&NoInterfaces);
    assert_eq!(streamed, whole);

    let (snap, skipped) = streamed;
    let ips: Vec<String> = snap
        .services
        .values()
        .map(|p| p.cluster_ip.to_string())
        .collect();
    assert_eq!(
        ips,
        ["10.96.0.2", "10.96.0.4"],
        "the later copy of a, and t"
    );
    assert_eq!(
        snap.node.node_ips,
        ["192.168.0.9".parse::<IpAddr>().unwrap()]
    );
    let eps: Vec<String> = snap
        .endpoints
        .values()
        .flat_map(|e| e.iter().map(|e| e.ip.to_string()))
        .collect();
    assert_eq!(eps, ["10.0.0.2"], "the later copy of a-1");
    let warned = |needle: &str| skipped.warnings.iter().any(|w| w.contains(needle));
    assert!(warned("defined twice"), "{:?}", skipped.warnings);
    assert!(warned("timeoutSeconds"), "{:?}", skipped.warnings);
    assert!(warned("cannot be a DNAT target"), "{:?}", skipped.warnings);
    assert_eq!(
        skipped.invalid.len(),
        2,
        "bad and f-1: {:?}",
        skipped.invalid
    );
    assert_eq!(skipped.ignored.len(), 1, "nolabel: {:?}", skipped.ignored);
}
