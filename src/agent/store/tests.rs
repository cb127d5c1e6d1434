use super::*;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::net::IpAddr;
use std::time::Duration;

struct NoInterfaces;
impl NodeAddressSource for NoInterfaces {
    fn addresses(&self) -> Vec<IpAddr> {
        vec!["10.0.0.1".parse().unwrap()]
    }
}

fn store() -> Store {
    Store::new(
        ProxyConfig::default(),
        "node-a".into(),
        Box::new(NoInterfaces),
    )
}

fn svc(name: &str, ip: &str, rv: &str) -> SourceEvent {
    let s: Service = serde_saphyr::from_str(&format!(
        "metadata: {{name: {name}, namespace: ns, resourceVersion: '{rv}'}}\n\
         spec: {{clusterIP: {ip}, ports: [{{port: 80, protocol: TCP}}]}}"
    ))
    .unwrap();
    SourceEvent::Apply(Object::Service(Box::new(s)))
}

fn slice(name: &str, service: &str, ips: &[&str], trigger: Option<&str>) -> SourceEvent {
    let eps: Vec<String> = ips
        .iter()
        .map(|ip| format!("{{addresses: [{ip}], conditions: {{ready: true}}}}"))
        .collect();
    let ann = trigger
        .map(|t| format!(", annotations: {{'{ANNOTATION_TRIGGER_TIME}': '{t}'}}"))
        .unwrap_or_default();
    let s: EndpointSlice = serde_saphyr::from_str(&format!(
        "metadata: {{name: {name}, namespace: ns, labels: {{'kubernetes.io/service-name': {service}}}{ann}}}\n\
         addressType: IPv4\nports: [{{port: 8080, protocol: TCP}}]\nendpoints: [{}]",
        eps.join(", ")
    ))
    .unwrap();
    SourceEvent::Apply(Object::EndpointSlice(Box::new(s)))
}

fn endpoint_ips(st: &Store) -> Vec<String> {
    st.snapshot()
        .endpoints
        .values()
        .flat_map(|e| e.iter())
        .map(|e| e.ip.to_string())
        .collect()
}

#[test]
fn metadata_only_updates_are_not_changes() {
    let mut st = store();
    let t = Instant::now();
    assert_eq!(st.apply(svc("web", "10.96.0.10", "1"), t).service_events, 1);
    st.take_changes();
    let rec = st.apply(svc("web", "10.96.0.10", "2"), t);
    assert_eq!(rec, Recorded::default());
    assert_eq!(st.pending_services(), 0);
    assert!(!st.has_pending());
}

#[test]
fn a_change_undone_before_the_sync_is_merged_away() {
    let mut st = store();
    let t = Instant::now();
    st.apply(svc("web", "10.96.0.10", "1"), t);
    st.take_changes();
    st.apply(svc("web", "10.96.0.11", "2"), t);
    assert_eq!(st.pending_services(), 1);
    st.apply(svc("web", "10.96.0.10", "3"), t);
    assert_eq!(st.pending_services(), 0);
    assert_eq!(
        st.snapshot()
            .services
            .values()
            .next()
            .unwrap()
            .cluster_ip
            .to_string(),
        "10.96.0.10"
    );
}

#[test]
fn slices_of_one_service_merge_and_changes_keep_first_previous() {
    let mut st = store();
    let t0 = Instant::now();
    st.apply(svc("web", "10.96.0.10", "1"), t0);
    st.apply(slice("web-a", "web", &["10.1.0.1"], None), t0);
    st.take_changes();

    let t1 = t0 + Duration::from_millis(5);
    let rec = st.apply(slice("web-b", "web", &["10.1.0.2"], None), t1);
    assert_eq!(rec.endpoint_events, 1);
    st.apply(
        slice("web-b", "web", &["10.1.0.2", "10.1.0.3"], None),
        t1 + Duration::from_millis(5),
    );
    assert_eq!(endpoint_ips(&st), ["10.1.0.1", "10.1.0.2", "10.1.0.3"]);
    assert_eq!(st.pending_endpoints(), 1);
    let changes = st.take_changes();
    let (key, change) = &changes.endpoints[0];
    assert_eq!(key, &("ns".to_string(), "web".to_string()));
    assert_eq!(
        change.previous.iter().flat_map(|(_, e)| e.iter()).count(),
        1
    );
    assert_eq!(change.first_event, t1);
}

/// A list streamed in object by object ends where a whole one does: what it did not name
/// is gone when it ends, not before, and the kind counts as listed only then.
#[test]
fn a_streamed_list_removes_what_it_lacked_when_it_ends() {
    let mut st = store();
    let t = Instant::now();
    st.apply(svc("web", "10.96.0.10", "1"), t);
    st.apply(svc("db", "10.96.0.20", "1"), t);
    for kind in [Kind::EndpointSlice, Kind::Node, Kind::ServiceCidr] {
        st.apply(SourceEvent::Replace(kind, vec![]), t);
    }
    st.apply(SourceEvent::ListBegin(Kind::Service), t);
    let SourceEvent::Apply(db) = svc("db", "10.96.0.21", "2") else {
        unreachable!()
    };
    st.apply(SourceEvent::Listed(db), t);
    let names = |st: &Store| -> Vec<String> {
        st.snapshot()
            .services
            .keys()
            .map(|(n, _)| n.name.to_string())
            .collect()
    };
    assert_eq!(
        names(&st),
        ["db", "web"],
        "nothing goes while the list runs"
    );
    assert!(!st.initial_lists_done());
    st.apply(SourceEvent::ListEnd(Kind::Service), t);
    assert!(st.initial_lists_done());
    assert_eq!(names(&st), ["db"]);
    let db = st.snapshot().services.values().next().unwrap();
    assert_eq!(
        db.cluster_ip.to_string(),
        "10.96.0.21",
        "the listed copy is applied"
    );
    // A relist that starts again (a new Init) forgets what the broken one had named.
    st.apply(SourceEvent::ListBegin(Kind::Service), t);
    st.apply(svc("web", "10.96.0.10", "3"), t);
    st.apply(SourceEvent::ListBegin(Kind::Service), t);
    st.apply(SourceEvent::ListEnd(Kind::Service), t);
    assert!(names(&st).is_empty());
}

#[test]
fn replace_removes_what_the_new_list_lacks() {
    let mut st = store();
    let t = Instant::now();
    st.apply(svc("web", "10.96.0.10", "1"), t);
    st.apply(svc("db", "10.96.0.20", "1"), t);
    st.apply(slice("web-a", "web", &["10.1.0.1"], None), t);
    assert!(!st.initial_lists_done());
    let SourceEvent::Apply(db) = svc("db", "10.96.0.20", "1") else {
        unreachable!()
    };
    st.apply(SourceEvent::Replace(Kind::Service, vec![db]), t);
    st.apply(SourceEvent::Replace(Kind::EndpointSlice, vec![]), t);
    st.apply(SourceEvent::Replace(Kind::Node, vec![]), t);
    assert!(!st.initial_lists_done());
    st.apply(SourceEvent::Replace(Kind::ServiceCidr, vec![]), t);
    assert!(st.initial_lists_done());
    let names: Vec<&str> = st
        .snapshot()
        .services
        .keys()
        .map(|(n, _)| &*n.name)
        .collect();
    assert_eq!(names, ["db"]);
    assert!(endpoint_ips(&st).is_empty());
}

#[test]
fn an_invalid_update_keeps_the_last_valid_version_and_is_counted() {
    let mut st = store();
    let t = Instant::now();
    st.apply(svc("web", "10.96.0.10", "1"), t);
    st.take_changes();
    st.apply(svc("web", "not-an-ip", "2"), t);
    assert_eq!(st.pending_services(), 0);
    assert_eq!(st.snapshot().services.len(), 1);
    assert_eq!(st.invalid_by_reason().get("bad_address"), Some(&1));
    // Deleting it forgets both the programmed version and the invalid record.
    st.apply(
        SourceEvent::Delete(Kind::Service, ("ns".into(), "web".into())),
        t,
    );
    assert!(st.snapshot().services.is_empty());
    assert!(st.invalid_by_reason().is_empty());
}

#[test]
fn every_trigger_time_is_kept_and_endpoints_without_change_do_not_count() {
    let mut st = store();
    st.started = parse_rfc3339("2026-12-02T09:00:00Z").unwrap();
    let t = Instant::now();
    st.apply(
        slice("web-a", "web", &["10.1.0.1"], Some("2026-12-02T10:00:00Z")),
        t,
    );
    st.apply(
        slice(
            "web-a",
            "web",
            &["10.1.0.2"],
            Some("2026-12-02T10:00:03.5Z"),
        ),
        t,
    );
    // From before the agent started: its own start-up, not programming latency.
    st.apply(
        slice("web-a", "web", &["10.1.0.3"], Some("2026-12-02T08:00:00Z")),
        t,
    );
    let changes = st.take_changes();
    let want: Vec<(IpFamily, SystemTime)> = ["2026-12-02T10:00:00Z", "2026-12-02T10:00:03.5Z"]
        .iter()
        .map(|s| (IpFamily::V4, parse_rfc3339(s).unwrap()))
        .collect();
    assert_eq!(changes.endpoints[0].1.trigger_times, want);
    let rec = st.apply(
        slice("web-a", "web", &["10.1.0.3"], Some("2026-12-02T10:00:09Z")),
        t,
    );
    assert_eq!(rec.endpoint_events, 0);
    assert!(!st.has_pending());
}

#[test]
fn a_deleted_slice_forgets_the_trigger_times_of_its_service() {
    let mut st = store();
    st.started = parse_rfc3339("2026-12-02T09:00:00Z").unwrap();
    let t = Instant::now();
    st.apply(slice("web-a", "web", &["10.1.0.1"], None), t);
    st.apply(
        slice("web-b", "web", &["10.1.0.2"], Some("2026-12-02T10:00:00Z")),
        t,
    );
    st.take_changes();
    st.apply(
        slice("web-b", "web", &["10.1.0.3"], Some("2026-12-02T10:00:05Z")),
        t,
    );
    st.apply(
        SourceEvent::Delete(Kind::EndpointSlice, ("ns".into(), "web-b".into())),
        t,
    );
    let changes = st.take_changes();
    assert_eq!(changes.endpoints.len(), 1);
    assert!(changes.endpoints[0].1.trigger_times.is_empty());
}

#[test]
fn only_this_nodes_node_object_counts() {
    let mut st = store();
    let t = Instant::now();
    let other: Node = serde_saphyr::from_str(
        "metadata: {name: node-b}\nstatus: {addresses: [{type: InternalIP, address: 10.0.0.9}]}",
    )
    .unwrap();
    st.take_changes();
    st.apply(SourceEvent::Apply(Object::Node(Box::new(other))), t);
    assert!(!st.has_pending());
    let mine: Node = serde_saphyr::from_str(
        "metadata: {name: node-a}\nstatus: {addresses: [{type: InternalIP, address: 10.0.0.5}]}",
    )
    .unwrap();
    st.apply(SourceEvent::Apply(Object::Node(Box::new(mine))), t);
    assert!(st.take_changes().node);
    assert_eq!(
        st.snapshot().node.node_ips,
        vec!["10.0.0.5".parse::<IpAddr>().unwrap()]
    );
}

fn svc_yaml(yaml: &str) -> SourceEvent {
    let s: Service = serde_saphyr::from_str(yaml).unwrap();
    SourceEvent::Apply(Object::Service(Box::new(s)))
}

/// CVE-2020-8554 class (issue 29): a Service whose external IP is another Service's
/// ClusterIP never takes it, whichever arrives first and whatever the names; the winner
/// changing marks the loser changed too, and the conflict is counted.
#[test]
fn store_a_cluster_ip_beats_an_external_ip_in_any_event_order() {
    let evil = || {
        svc_yaml(
        "metadata: {name: evil, namespace: aaa, creationTimestamp: '2020-01-01T00:00:00Z'}\n\
         spec: {clusterIP: 10.96.0.99, externalIPs: [10.96.0.10], ports: [{port: 80, protocol: TCP}]}",
    )
    };
    let dns = || {
        svc_yaml(
        "metadata: {name: dns, namespace: kube-system, creationTimestamp: '2024-01-01T00:00:00Z'}\n\
         spec: {clusterIP: 10.96.0.10, ports: [{port: 80, protocol: TCP}]}",
    )
    };
    let evil_external = |st: &Store| {
        st.snapshot()
            .services
            .values()
            .find(|p| &*p.name.name == "evil")
            .unwrap()
            .external_ips
            .clone()
    };
    let t = Instant::now();
    for dns_first in [true, false] {
        let mut st = store();
        if dns_first {
            st.apply(dns(), t);
            st.apply(evil(), t);
        } else {
            st.apply(evil(), t);
            assert_eq!(evil_external(&st).len(), 1, "uncontested until dns comes");
            st.take_changes();
            st.apply(dns(), t);
            let touched = st.take_changes().services_touched();
            assert!(
                touched.contains(&("aaa".to_string(), "evil".to_string())),
                "{touched:?}"
            );
        }
        assert!(evil_external(&st).is_empty(), "dns_first {dns_first}");
        assert_eq!(st.frontend_conflicts(), 1);
        // The ClusterIP leaves: the external IP is programmed again.
        st.take_changes();
        st.apply(
            SourceEvent::Delete(Kind::Service, ("kube-system".into(), "dns".into())),
            t,
        );
        assert_eq!(evil_external(&st).len(), 1);
        assert_eq!(st.frontend_conflicts(), 0);
        assert!(st
            .take_changes()
            .services_touched()
            .contains(&("aaa".to_string(), "evil".to_string())));
    }
}
