//! The Helm chart, rendered by the real Helm library (helm-python-sdk, Helm v4, through
//! `tests/chart/render.py`) for the default values and several value sets: it lints clean,
//! every object decodes into its k8s-openapi type, the RBAC grants exactly what the agent
//! needs, the DaemonSet is what a node proxy needs, the KubeProxyConfiguration it builds is
//! one `switchyard` accepts without a warning, the alert rules pass `promtool`, and values
//! the schema forbids are refused with the field named. Without helm_python installed it
//! prints SKIP (fails if SWITCHYARD_REQUIRE_HELM=1, as in CI).

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde_json::{json, Value};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Renders the chart with `values`; `None` means helm_python is missing (a skip).
fn render(values: &Value) -> Option<Value> {
    let dir = tempfile::tempdir().unwrap();
    let values_file = dir.path().join("values.json");
    std::fs::write(&values_file, values.to_string()).unwrap();
    let out = Command::new("python3")
        .arg(root().join("tests/chart/render.py"))
        .arg(root().join("charts/switchyard"))
        .arg(&values_file)
        .output()
        .expect("running python3");
    if out.status.code() == Some(3) {
        let why = String::from_utf8_lossy(&out.stderr);
        assert!(
            std::env::var("SWITCHYARD_REQUIRE_HELM").as_deref() != Ok("1"),
            "SWITCHYARD_REQUIRE_HELM=1 but {why}"
        );
        println!("SKIP: {why}");
        return None;
    }
    assert!(
        out.status.success(),
        "render.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).expect("render.py prints JSON"))
}

/// Every YAML document of every rendered template, with its template.
fn documents(rendered: &Value) -> Vec<(String, Value)> {
    let mut docs = Vec::new();
    for (template, text) in rendered["manifests"].as_object().unwrap() {
        if template.ends_with("NOTES.txt") {
            continue;
        }
        // Null (empty) documents are skipped by the parser.
        let rendered: Vec<Value> =
            serde_saphyr::from_multiple(text.as_str().unwrap()).expect("rendered YAML");
        docs.extend(rendered.into_iter().map(|v| (template.clone(), v)));
    }
    docs
}

fn of_kind<'a>(docs: &'a [(String, Value)], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|(_, d)| d["kind"] == kind)
        .map(|(_, d)| d)
        .collect()
}

fn typed<T: serde::de::DeserializeOwned>(v: &Value) -> T {
    let name = format!("{} {}", v["kind"], v["metadata"]["name"]);
    serde_path_to_error::deserialize(v.clone())
        .unwrap_or_else(|e| panic!("{name} does not decode: {} at {}", e, e.path()))
}

/// Every object decodes into its k8s-openapi type; the CRD objects have their shape.
fn check_types(docs: &[(String, Value)]) {
    for (template, d) in docs {
        let kind = d["kind"].as_str().unwrap_or_default();
        match kind {
            "DaemonSet" => drop(typed::<DaemonSet>(d)),
            "ServiceAccount" => drop(typed::<ServiceAccount>(d)),
            "ClusterRole" => drop(typed::<ClusterRole>(d)),
            "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(d)),
            "ConfigMap" => drop(typed::<ConfigMap>(d)),
            "Service" => drop(typed::<Service>(d)),
            "ServiceMonitor" | "PrometheusRule" => {
                assert_eq!(d["apiVersion"], "monitoring.coreos.com/v1", "{template}");
                assert!(d["spec"].is_object(), "{template}");
            }
            other => panic!("{template}: unexpected kind {other:?}"),
        }
        let labels = &d["metadata"]["labels"];
        for l in [
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
        ] {
            assert!(labels[l].is_string(), "{template}: label {l} missing");
        }
    }
}

/// The ClusterRole grants get/list/watch on services, endpointslices, nodes and
/// servicecidrs and create on events.k8s.io events (the Starting event kube-proxy records):
/// nothing more, nothing less.
fn check_rbac(docs: &[(String, Value)]) {
    let roles = of_kind(docs, "ClusterRole");
    assert_eq!(roles.len(), 1);
    let role: ClusterRole = typed(roles[0]);
    let mut granted = BTreeSet::new();
    for rule in role.rules.unwrap_or_default() {
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
        for g in rule.api_groups.unwrap_or_default() {
            for r in rule.resources.clone().unwrap_or_default() {
                for v in &rule.verbs {
                    granted.insert((g.clone(), r.clone(), v.clone()));
                }
            }
        }
    }
    let mut want = BTreeSet::new();
    for (g, r) in [
        ("", "services"),
        ("", "nodes"),
        ("discovery.k8s.io", "endpointslices"),
        ("networking.k8s.io", "servicecidrs"),
    ] {
        for v in ["get", "list", "watch"] {
            want.insert((g.to_string(), r.to_string(), v.to_string()));
        }
    }
    want.insert((
        "events.k8s.io".to_string(),
        "events".to_string(),
        "create".to_string(),
    ));
    assert_eq!(granted, want);
    let bindings = of_kind(docs, "ClusterRoleBinding");
    let binding: ClusterRoleBinding = typed(bindings[0]);
    assert_eq!(binding.role_ref.name, role.metadata.name.unwrap());
    let sa: ServiceAccount = typed(of_kind(docs, "ServiceAccount")[0]);
    let subjects = binding.subjects.unwrap();
    assert_eq!(subjects[0].name, sa.metadata.name.unwrap());
    assert_eq!(subjects[0].namespace.as_deref(), Some("kube-system"));
}

/// What a node proxy's DaemonSet needs; returns the container's privileged flag.
fn check_daemonset(docs: &[(String, Value)]) -> bool {
    let ds: DaemonSet = typed(of_kind(docs, "DaemonSet")[0]);
    let spec = ds.spec;
    assert_eq!(
        spec.update_strategy.unwrap().type_.as_deref(),
        Some("RollingUpdate")
    );
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let tol = pod.tolerations.unwrap();
    assert!(
        tol.iter()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
        "tolerates every taint: {tol:?}"
    );
    let c = &pod.containers[0];
    let sc = c.security_context.clone().unwrap();
    // The API server refuses privileged together with allowPrivilegeEscalation false.
    if sc.privileged == Some(true) {
        assert_ne!(sc.allow_privilege_escalation, Some(false));
    } else {
        assert_eq!(sc.allow_privilege_escalation, Some(false));
    }
    let caps = sc.capabilities.unwrap();
    assert_eq!(caps.drop.unwrap(), ["ALL"]);
    assert_eq!(caps.add.unwrap(), ["NET_ADMIN", "NET_RAW"]);
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref()
            .and_then(|p| p.http_get.as_ref())
            .and_then(|h| h.path.clone())
    };
    assert_eq!(probe_path(&c.liveness_probe).as_deref(), Some("/livez"));
    assert_eq!(probe_path(&c.readiness_probe).as_deref(), Some("/healthz"));
    let mounts: BTreeSet<String> = c
        .volume_mounts
        .clone()
        .unwrap()
        .iter()
        .map(|m| m.mount_path.clone())
        .collect();
    for m in ["/run/xtables.lock", "/lib/modules", "/etc/switchyard"] {
        assert!(mounts.contains(m), "{m} mounted: {mounts:?}");
    }
    let args = c.args.clone().unwrap();
    assert!(args.contains(&"--hostname-override=$(NODE_NAME)".to_string()));
    sc.privileged.unwrap_or(false)
}

/// The ConfigMap's KubeProxyConfiguration is one `switchyard render` accepts, without a
/// single warning about it.
fn check_config(docs: &[(String, Value)]) -> String {
    let cms = of_kind(docs, "ConfigMap");
    let cm: ConfigMap = typed(
        cms.iter()
            .find(|c| c["data"]["config.yaml"].is_string())
            .expect("the config ConfigMap"),
    );
    let text = cm.data.unwrap()["config.yaml"].clone();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, &text).unwrap();
    let manifests = dir.path().join("empty.yaml");
    std::fs::write(&manifests, "").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("render")
        .arg("--config")
        .arg(&cfg)
        .arg("--manifests")
        .arg(&manifests)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}\n{stderr}");
    assert!(
        !stderr.to_lowercase().contains("warn"),
        "the chart's configuration draws a warning:\n{text}\n{stderr}"
    );
    text
}

fn check_lint(rendered: &Value) {
    let lint = &rendered["lint"];
    assert_eq!(lint["errors"], json!([]), "{lint}");
    for m in lint["messages"].as_array().unwrap() {
        assert!(m["severity"].as_u64().unwrap() < 2, "lint: {m}");
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(program))
            .find(|p| p.is_file())
    })
}

fn promtool_check(rules: &Path) {
    let Some(promtool) = which("promtool") else {
        assert!(
            std::env::var("SWITCHYARD_REQUIRE_HELM").as_deref() != Ok("1"),
            "promtool missing"
        );
        println!("SKIP: promtool not installed");
        return;
    };
    let out = Command::new(promtool)
        .args(["check", "rules"])
        .arg(rules)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn default_values_render_a_node_proxy() {
    let Some(r) = render(&json!({})) else { return };
    check_lint(&r);
    let docs = documents(&r);
    check_types(&docs);
    check_rbac(&docs);
    assert!(!check_daemonset(&docs), "not privileged in nftables mode");
    let cfg = check_config(&docs);
    assert!(cfg.contains("mode: nftables"), "{cfg}");
    assert!(of_kind(&docs, "ServiceMonitor").is_empty());
    let notes = r["manifests"]["switchyard/templates/NOTES.txt"]
        .as_str()
        .unwrap();
    assert!(notes.contains("kube-proxy"), "{notes}");
}

#[test]
fn iptables_mode_with_monitoring_renders_and_its_rules_pass_promtool() {
    let values = json!({
        "config": {
            "mode": "iptables", "clusterCIDR": "10.244.0.0/16,fd00:10:244::/56",
            "nodePortAddresses": ["primary"], "masqueradeAll": true,
            "iptablesBackend": "legacy", "syncPeriod": "1m", "minSyncPeriod": "2s"
        },
        "metrics": { "port": 19249, "bindAddress": "::" },
        "apiServer": { "host": "10.0.0.1", "port": 6443 },
        "prometheus": {
            "serviceMonitor": { "enabled": true, "labels": { "release": "prom" } },
            "rules": { "enabled": true },
            "dashboard": { "enabled": true }
        },
        "tolerations": [{ "operator": "Exists" }, { "key": "special", "effect": "NoSchedule" }]
    });
    let Some(r) = render(&values) else { return };
    check_lint(&r);
    let docs = documents(&r);
    check_types(&docs);
    check_rbac(&docs);
    // NodePorts only on the primary address: no route_localnet, not privileged.
    assert!(!check_daemonset(&docs));
    let ds = of_kind(&docs, "DaemonSet")[0];
    let container = &ds["spec"]["template"]["spec"]["containers"][0];
    let args = container["args"].to_string();
    assert!(args.contains("--iptables-backend=legacy"), "{args}");
    let env = container["env"].to_string();
    assert!(
        env.contains("KUBERNETES_SERVICE_HOST") && env.contains("10.0.0.1"),
        "{env}"
    );
    let cfg = check_config(&docs);
    for want in [
        "mode: iptables",
        "masqueradeAll: true",
        "[::]:19249",
        "10.244.0.0/16",
    ] {
        assert!(cfg.contains(want), "{want} in\n{cfg}");
    }
    let sm = of_kind(&docs, "ServiceMonitor")[0];
    assert_eq!(sm["metadata"]["labels"]["release"], "prom");
    let svc: Service = typed(of_kind(&docs, "Service")[0]);
    assert_eq!(svc.spec.unwrap().ports.unwrap()[0].port, 19249);

    let rule = of_kind(&docs, "PrometheusRule")[0];
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, serde_saphyr::to_string(&rule["spec"]).unwrap()).unwrap();
    promtool_check(&rules);
    promtool_check(&root().join("charts/switchyard/files/alerts.yaml"));

    let dash = of_kind(&docs, "ConfigMap")
        .into_iter()
        .find(|c| c["data"]["switchyard.json"].is_string())
        .expect("dashboard ConfigMap");
    let board: Value =
        serde_json::from_str(dash["data"]["switchyard.json"].as_str().unwrap()).unwrap();
    let exprs = board["panels"].to_string();
    for metric in [
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
        "kubeproxy_network_programming_duration_seconds_bucket",
        "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
        "switchyard_sync_failures_total",
        "switchyard_drift_repairs_total",
    ] {
        assert!(exprs.contains(metric), "dashboard shows {metric}");
    }
    assert!(exprs.contains("node"), "per node");
}

/// iptables mode serving NodePorts on 127.0.0.1 (its default) writes route_localnet, so
/// only there the container is privileged.
#[test]
fn iptables_mode_with_localhost_node_ports_is_privileged() {
    let Some(r) = render(&json!({"config": {"mode": "iptables"}})) else {
        return;
    };
    check_lint(&r);
    let docs = documents(&r);
    assert!(check_daemonset(&docs));
    let notes = r["manifests"]["switchyard/templates/NOTES.txt"]
        .as_str()
        .unwrap();
    assert!(notes.contains("apiServer.host is not set"), "{notes}");
}

/// IPVS mode: the ipvs section reaches the configuration (which the agent accepts), the
/// iptables back end is passed on, and the container is privileged for the sysctls.
#[test]
fn ipvs_mode_renders_its_section_and_is_privileged() {
    let values = json!({"config": {"mode": "ipvs", "ipvs": {
        "scheduler": "lc", "strictARP": true, "excludeCIDRs": ["10.99.0.0/16"],
        "tcpTimeout": "900s"}}});
    let Some(r) = render(&values) else { return };
    check_lint(&r);
    let docs = documents(&r);
    check_types(&docs);
    assert!(check_daemonset(&docs), "privileged for IPVS mode's sysctls");
    let cfg = check_config(&docs);
    for want in [
        "mode: ipvs",
        "scheduler: lc",
        "strictARP: true",
        "- 10.99.0.0/16",
        "tcpTimeout: 900s",
    ] {
        assert!(cfg.contains(want), "{want:?} in:\n{cfg}");
    }
    let ds = of_kind(&docs, "DaemonSet")[0];
    let args = ds["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--iptables-backend=auto"), "{args}");
    // The schema offers exactly the schedulers the agent accepts.
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("charts/switchyard/values.schema.json")).unwrap(),
    )
    .unwrap();
    let offered =
        &schema["properties"]["config"]["properties"]["ipvs"]["properties"]["scheduler"]["enum"];
    assert_eq!(offered, &json!(dataplane::ipvs::SCHEDULERS));
}

#[test]
fn values_the_schema_forbids_are_refused_naming_the_field() {
    for (values, field) in [
        (json!({"config": {"mode": "userspace"}}), "/config/mode"),
        (
            json!({"config": {"ipvs": {"scheduler": "fastest"}}}),
            "/config/ipvs/scheduler",
        ),
        (json!({"config": {"sincPeriod": "1s"}}), "sincPeriod"),
        (json!({"metrics": {"port": 70000}}), "/metrics/port"),
        (
            json!({"config": {"syncPeriod": "soon"}}),
            "/config/syncPeriod",
        ),
    ] {
        let Some(r) = render(&values) else { return };
        let err = r["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{values} rendered"));
        assert!(err.contains(field), "{values}: {err}");
    }
}

/// Metrics on 127.0.0.1 by default, as kube-proxy binds them; a ServiceMonitor that could
/// never reach them is refused with the value to set.
#[test]
fn metrics_bind_to_loopback_by_default_and_a_service_monitor_needs_them_reachable() {
    let Some(r) = render(&json!({})) else { return };
    let docs = documents(&r);
    let cfg = check_config(&docs);
    assert!(
        cfg.contains("metricsBindAddress: \"127.0.0.1:10249\""),
        "{cfg}"
    );
    let Some(r) = render(&json!({"prometheus": {"serviceMonitor": {"enabled": true}}})) else {
        return;
    };
    let err = r["error"]
        .as_str()
        .expect("a loopback ServiceMonitor rendered");
    assert!(err.contains("metrics.bindAddress=0.0.0.0"), "{err}");
}
