//! Renders a scenario as Kubernetes objects (multi-document YAML) and a KubeProxyConfiguration.

use std::net::IpAddr;

use serde_json::{json, Map, Value};

use super::cases::{EndpointSlice, Mode, NodeConfig, Scenario, Service, TargetPort};

/// All objects of a node state: Services, EndpointSlices, the Node and ServiceCIDRs.
pub fn objects(node: &NodeConfig, services: &[Service], slices: &[EndpointSlice]) -> Vec<Value> {
    let mut docs: Vec<Value> = Vec::new();
    docs.push(node_object(node));
    for (i, cidr) in node.service_cidrs.iter().enumerate() {
        let name = if i == 0 {
            "kubernetes".to_string()
        } else {
            format!("servicecidr-{i}")
        };
        docs.push(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "ServiceCIDR",
            "metadata": { "name": name },
            "spec": { "cidrs": [cidr] },
        }));
    }
    docs.extend(services.iter().map(|s| service_object(s, node)));
    docs.extend(slices.iter().map(slice_object));
    docs
}

/// The objects as one multi-document YAML stream.
pub fn manifests_yaml(node: &NodeConfig, services: &[Service], slices: &[EndpointSlice]) -> String {
    let mut out = String::new();
    for doc in objects(node, services, slices) {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&doc).expect("serializing a manifest to YAML"));
    }
    out
}

fn node_object(node: &NodeConfig) -> Value {
    let mut ips: Vec<IpAddr> = vec![node.primary_ip];
    ips.extend(node.ips.iter().copied().filter(|ip| *ip != node.primary_ip));
    let addresses: Vec<Value> = ips
        .iter()
        .map(|ip| json!({ "type": "InternalIP", "address": ip.to_string() }))
        .collect();
    let mut obj = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": node.name },
        "spec": {},
        "status": { "addresses": addresses },
    });
    if let Some(cidr) = &node.pod_cidr {
        obj["spec"] = json!({ "podCIDR": cidr, "podCIDRs": [cidr] });
    }
    if let Some(zone) = &node.zone {
        obj["metadata"]["labels"] = json!({ "topology.kubernetes.io/zone": zone });
    }
    obj
}

fn family_of(ip: &str) -> Option<&'static str> {
    match ip.parse::<IpAddr>() {
        Ok(IpAddr::V4(_)) => Some("IPv4"),
        Ok(IpAddr::V6(_)) => Some("IPv6"),
        Err(_) => None,
    }
}

fn service_object(svc: &Service, node: &NodeConfig) -> Value {
    let mut spec = Map::new();
    spec.insert("type".into(), json!(svc.type_));
    let family =
        svc.cluster_ip
            .as_deref()
            .and_then(family_of)
            .unwrap_or(if node.ip_family == "IPv6" {
                "IPv6"
            } else {
                "IPv4"
            });
    if svc.cluster_ips.len() > 1 {
        let families: Vec<&str> = svc
            .cluster_ips
            .iter()
            .filter_map(|ip| family_of(ip))
            .collect();
        spec.insert("clusterIP".into(), json!(svc.cluster_ips[0]));
        spec.insert("clusterIPs".into(), json!(svc.cluster_ips));
        spec.insert("ipFamilies".into(), json!(families));
        spec.insert("ipFamilyPolicy".into(), json!("RequireDualStack"));
    } else {
        if let Some(ip) = &svc.cluster_ip {
            spec.insert("clusterIP".into(), json!(ip));
            spec.insert("clusterIPs".into(), json!([ip]));
        }
        spec.insert("ipFamilies".into(), json!([family]));
        spec.insert("ipFamilyPolicy".into(), json!("SingleStack"));
    }
    let ports: Vec<Value> = svc
        .ports
        .iter()
        .map(|p| {
            let mut port = Map::new();
            port.insert("name".into(), json!(p.name));
            port.insert("port".into(), json!(p.port));
            port.insert("protocol".into(), json!(p.protocol.to_string()));
            if let Some(np) = p.node_port {
                port.insert("nodePort".into(), json!(np));
            }
            let target = match &p.target_port {
                None => json!(p.port),
                Some(TargetPort::Number(n)) => json!(n),
                Some(TargetPort::Name(n)) => json!(n),
            };
            port.insert("targetPort".into(), target);
            Value::Object(port)
        })
        .collect();
    spec.insert("ports".into(), Value::Array(ports));
    if !svc.external_ips.is_empty() {
        spec.insert("externalIPs".into(), json!(svc.external_ips));
    }
    if !svc.load_balancer_source_ranges.is_empty() {
        spec.insert(
            "loadBalancerSourceRanges".into(),
            json!(svc.load_balancer_source_ranges),
        );
    }
    // The API server only keeps externalTrafficPolicy on externally reachable Services.
    let external =
        svc.type_ == "NodePort" || svc.type_ == "LoadBalancer" || !svc.external_ips.is_empty();
    if external {
        spec.insert(
            "externalTrafficPolicy".into(),
            json!(svc.external_traffic_policy),
        );
    }
    spec.insert(
        "internalTrafficPolicy".into(),
        json!(svc.internal_traffic_policy),
    );
    spec.insert("sessionAffinity".into(), json!(svc.session_affinity));
    if svc.session_affinity == "ClientIP" {
        let timeout = svc.session_affinity_timeout_seconds.unwrap_or(10800);
        spec.insert(
            "sessionAffinityConfig".into(),
            json!({ "clientIP": { "timeoutSeconds": timeout } }),
        );
    }
    if let Some(hc) = svc.health_check_node_port {
        spec.insert("healthCheckNodePort".into(), json!(hc));
    }
    let ingress: Vec<Value> = svc
        .load_balancer_ips
        .iter()
        .map(|ip| json!({ "ip": ip }))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "namespace": svc.namespace, "name": svc.name },
        "spec": Value::Object(spec),
        "status": { "loadBalancer": if ingress.is_empty() { json!({}) } else { json!({ "ingress": ingress }) } },
    })
}

fn slice_object(slice: &EndpointSlice) -> Value {
    let ports: Vec<Value> = slice
        .ports
        .iter()
        .map(|p| json!({ "name": p.name, "port": p.port, "protocol": p.protocol.to_string() }))
        .collect();
    let endpoints: Vec<Value> = slice
        .endpoints
        .iter()
        .map(|e| {
            let mut ep = Map::new();
            let addrs: Vec<String> = e.addresses.iter().map(|a| a.to_string()).collect();
            ep.insert("addresses".into(), json!(addrs));
            let mut cond = Map::new();
            for (k, v) in [
                ("ready", e.ready),
                ("serving", e.serving),
                ("terminating", e.terminating),
            ] {
                if let Some(v) = v {
                    cond.insert(k.into(), json!(v));
                }
            }
            ep.insert("conditions".into(), Value::Object(cond));
            if let Some(n) = &e.node_name {
                ep.insert("nodeName".into(), json!(n));
            }
            if let Some(h) = &e.hints {
                let zones: Vec<Value> = h.for_zones.iter().map(|z| json!({ "name": z })).collect();
                let nodes: Vec<Value> = h.for_nodes.iter().map(|n| json!({ "name": n })).collect();
                let mut hints = Map::new();
                if !zones.is_empty() {
                    hints.insert("forZones".into(), Value::Array(zones));
                }
                if !nodes.is_empty() {
                    hints.insert("forNodes".into(), Value::Array(nodes));
                }
                ep.insert("hints".into(), Value::Object(hints));
            }
            Value::Object(ep)
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "namespace": slice.namespace,
            "name": slice.name,
            "labels": {
                "kubernetes.io/service-name": slice.service,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
        },
        "addressType": slice.address_type,
        "ports": ports,
        "endpoints": endpoints,
    })
}

/// The KubeProxyConfiguration for a scenario's node config in `mode`.
pub fn kube_proxy_config(node: &NodeConfig, mode: Mode) -> String {
    let mut cfg = Map::new();
    cfg.insert(
        "apiVersion".into(),
        json!("kubeproxy.config.k8s.io/v1alpha1"),
    );
    cfg.insert("kind".into(), json!("KubeProxyConfiguration"));
    cfg.insert("mode".into(), json!(mode.as_str()));
    cfg.insert("hostnameOverride".into(), json!(node.name));
    if let Some(c) = &node.cluster_cidr {
        cfg.insert("clusterCIDR".into(), json!(c));
    }
    // cases.json spells "no LocalTrafficDetector" as "None"; KubeProxyConfiguration has no
    // such value: leaving detectLocalMode unset (with no clusterCIDR) means no detector.
    if let Some(m) = node.local_detect_mode.as_deref().filter(|m| *m != "None") {
        cfg.insert("detectLocalMode".into(), json!(m));
    }
    let mut detect = Map::new();
    if let Some(b) = &node.bridge_interface {
        detect.insert("bridgeInterface".into(), json!(b));
    }
    if let Some(p) = &node.interface_name_prefix {
        detect.insert("interfaceNamePrefix".into(), json!(p));
    }
    if !detect.is_empty() {
        cfg.insert("detectLocal".into(), Value::Object(detect));
    }
    // null in cases.json is the proxier's nil: NodePorts on every node address. In a
    // KubeProxyConfiguration an unset field means "primary" in nftables mode, so spell
    // "all" out explicitly.
    let node_port_addresses = match &node.node_port_addresses {
        Some(a) => json!(a),
        None => json!(["0.0.0.0/0", "::/0"]),
    };
    cfg.insert("nodePortAddresses".into(), node_port_addresses);
    cfg.insert(
        "nftables".into(),
        json!({ "masqueradeAll": node.masquerade_all }),
    );
    cfg.insert(
        "iptables".into(),
        json!({
            "masqueradeAll": node.masquerade_all,
            "localhostNodePorts": node.localhost_node_ports,
        }),
    );
    serde_saphyr::to_string(&Value::Object(cfg)).expect("serializing KubeProxyConfiguration")
}

/// Convenience for a whole scenario.
pub fn scenario_yaml(s: &Scenario) -> String {
    manifests_yaml(&s.node, &s.services, &s.endpoint_slices)
}
