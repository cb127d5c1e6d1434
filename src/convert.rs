//! Conversion from Kubernetes API objects to the dataplane model, skipping (with a reason that
//! names the object and the field) whatever kube-proxy would not or could not program.

use dataplane::interned;
use dataplane::model::{
    Endpoint, Endpoints, IpFamily, Protocol, Seniority, ServicePort, ServicePortName,
    SessionAffinity, TrafficDistribution, TrafficPolicy,
};
use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Label that ties a slice to its service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Label naming the proxy that should handle a service (kube-proxy skips labelled ones).
pub const LABEL_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Label marking a headless service.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// The value of the proxy-name label that means us.
pub const PROXY_NAME: &str = "switchyard";

/// Why an object was not programmed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Skip {
    /// Deliberately not proxied (headless, ExternalName, another proxy's): not an error.
    #[error("{object}: not proxied: {why}")]
    NotProxied { object: String, why: String },
    /// Invalid: a warning and a metric.
    #[error("{object}: field {field}: {message}; object skipped")]
    Invalid {
        object: String,
        field: String,
        message: String,
        /// Metric label.
        reason: &'static str,
    },
}

fn invalid(
    object: &str,
    field: impl Into<String>,
    message: impl Into<String>,
    reason: &'static str,
) -> Skip {
    Skip::Invalid {
        object: object.to_string(),
        field: field.into(),
        message: message.into(),
        reason,
    }
}

/// RFC 1123 label (namespaces, port names): lowercase alphanumerics and `-`, starting and
/// ending alphanumeric, at most 63 characters. The API server allows nothing else, and
/// these names reach tool inputs (iptables comments), so a file may not either.
fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1035 label (Service names): an RFC 1123 label that starts with a letter.
fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.starts_with(|c: char| c.is_ascii_lowercase())
}

/// RFC 1123 subdomain (EndpointSlice names): labels joined by dots, at most 253 characters.
fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// A label value (the `kubernetes.io/service-name` label): at most 63 characters of
/// alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric; may be empty.
fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// An invalid name, skipped with the field named, as the API server would refuse it.
fn check_name(
    object: &str,
    field: &str,
    value: &str,
    ok: fn(&str) -> bool,
    rule: &str,
) -> Result<(), Skip> {
    if ok(value) {
        Ok(())
    } else {
        Err(invalid(
            object,
            field,
            format!("{value:?} is not {rule}"),
            "bad_name",
        ))
    }
}

/// `Kind ns/name` for messages, once the namespace (an RFC 1123 label) and the name (by
/// `name_ok`) are checked; names that fail are quoted in the message, since they cannot be
/// printed safely as they are.
fn named_object(
    kind: &str,
    ns: &str,
    name: &str,
    name_ok: fn(&str) -> bool,
    name_rule: &str,
) -> Result<String, Skip> {
    let object = if is_dns1123_label(ns) && name_ok(name) {
        format!("{kind} {ns}/{name}")
    } else {
        format!("{kind} {ns:?}/{name:?}")
    };
    check_name(
        &object,
        "metadata.namespace",
        ns,
        is_dns1123_label,
        "an RFC 1123 label",
    )?;
    check_name(&object, "metadata.name", name, name_ok, name_rule)?;
    Ok(object)
}

fn parse_ip(object: &str, field: &str, raw: &str) -> Result<IpAddr, Skip> {
    raw.trim().parse::<IpAddr>().map_err(|_| {
        invalid(
            object,
            field,
            format!("{raw:?} is not an IP address"),
            "bad_address",
        )
    })
}

fn protocol(object: &str, field: &str, raw: Option<&str>) -> Result<Protocol, Skip> {
    match raw.unwrap_or("TCP") {
        "TCP" => Ok(Protocol::Tcp),
        "UDP" => Ok(Protocol::Udp),
        "SCTP" => Ok(Protocol::Sctp),
        other => Err(invalid(
            object,
            field,
            format!("{other:?} is not TCP, UDP or SCTP"),
            "bad_protocol",
        )),
    }
}

fn port_number(object: &str, field: &str, value: i32, allow_zero: bool) -> Result<u16, Skip> {
    let min = if allow_zero { 0 } else { 1 };
    if (min..=65535).contains(&value) {
        Ok(value as u16)
    } else {
        Err(invalid(
            object,
            field,
            format!("{value} is out of range {min}-65535"),
            "bad_port",
        ))
    }
}

fn policy(raw: Option<&str>) -> TrafficPolicy {
    match raw {
        Some("Local") => TrafficPolicy::Local,
        _ => TrafficPolicy::Cluster,
    }
}

/// Convert one Service into its service ports, one per port and family.
/// [`service`] under the configuration's feature gates: with AllowServiceExternalIPs off,
/// externalIPs are not programmed (kube-proxy: pkg/proxy/serviceport.go ExternalIPs).
pub fn service_gated(
    svc: &Service,
    cfg: &crate::config::ProxyConfig,
    warnings: &mut Vec<String>,
) -> Result<Vec<ServicePort>, Skip> {
    let mut ports = service(svc, warnings)?;
    if !cfg.gate("AllowServiceExternalIPs") {
        for p in &mut ports {
            p.external_ips.clear();
        }
    }
    Ok(ports)
}

/// Convert one Service. Values kept in a corrected form (a clamped timeout) add a warning
/// naming the object and the field to `warnings`.
pub fn service(svc: &Service, warnings: &mut Vec<String>) -> Result<Vec<ServicePort>, Skip> {
    let meta = &svc.metadata;
    let ns = meta.namespace.as_deref().unwrap_or("default");
    let name = meta.name.as_deref().unwrap_or_default();
    let object = named_object("Service", ns, name, is_dns1035_label, "an RFC 1035 label")?;
    let not_proxied = |why: &str| Skip::NotProxied {
        object: object.clone(),
        why: why.to_string(),
    };
    if let Some(labels) = &meta.labels {
        if labels
            .get(LABEL_PROXY_NAME)
            .is_some_and(|v| v != PROXY_NAME)
        {
            return Err(not_proxied("labelled for another proxy"));
        }
        if labels.contains_key(LABEL_HEADLESS) {
            return Err(not_proxied("labelled headless"));
        }
    }
    let Some(spec) = &svc.spec else {
        return Err(invalid(&object, "spec", "missing", "missing_field"));
    };
    let kind = spec.type_.as_deref().unwrap_or("ClusterIP");
    if kind == "ExternalName" {
        return Err(not_proxied("type ExternalName"));
    }
    let raw_ips: Vec<String> = match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(list), _) if !list.is_empty() => list.clone(),
        (_, Some(one)) => vec![one.clone()],
        _ => vec![],
    };
    if raw_ips.is_empty() || raw_ips.iter().any(|s| s.is_empty()) {
        return Err(not_proxied("no cluster IP allocated"));
    }
    if raw_ips.iter().any(|s| s == "None") {
        return Err(not_proxied("headless (clusterIP: None)"));
    }
    let mut cluster_ips = Vec::new();
    for (i, raw) in raw_ips.iter().enumerate() {
        let ip = parse_ip(&object, &format!("spec.clusterIPs[{i}]"), raw)?;
        if cluster_ips
            .iter()
            .any(|c: &IpAddr| IpFamily::of(c) == IpFamily::of(&ip))
        {
            return Err(invalid(
                &object,
                format!("spec.clusterIPs[{i}]"),
                "two cluster IPs of one family",
                "family_mismatch",
            ));
        }
        cluster_ips.push(ip);
    }
    if let Some(families) = &spec.ip_families {
        for (i, (fam, ip)) in families.iter().zip(&cluster_ips).enumerate() {
            let want = if fam == "IPv6" {
                IpFamily::V6
            } else {
                IpFamily::V4
            };
            if IpFamily::of(ip) != want {
                return Err(invalid(
                    &object,
                    format!("spec.ipFamilies[{i}]"),
                    format!("{fam} does not match cluster IP {ip}"),
                    "family_mismatch",
                ));
            }
        }
    }
    let external_ok = kind == "NodePort" || kind == "LoadBalancer";
    let mut external_ips = Vec::new();
    for (i, raw) in spec.external_ips.iter().flatten().enumerate() {
        external_ips.push(parse_ip(&object, &format!("spec.externalIPs[{i}]"), raw)?);
    }
    let mut lb_ips = Vec::new();
    if kind == "LoadBalancer" {
        let ingress = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref());
        for (i, ing) in ingress.into_iter().flatten().enumerate() {
            // ipMode Proxy: the load balancer delivers to the node; kube-proxy leaves it alone.
            if ing.ip_mode.as_deref() == Some("Proxy") {
                continue;
            }
            if let Some(raw) = &ing.ip {
                lb_ips.push(parse_ip(
                    &object,
                    &format!("status.loadBalancer.ingress[{i}].ip"),
                    raw,
                )?);
            }
        }
    }
    let mut source_ranges = Vec::new();
    for (i, raw) in spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .enumerate()
    {
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            continue;
        }
        source_ranges.push(trimmed.parse::<IpNetwork>().map_err(|_| {
            invalid(
                &object,
                format!("spec.loadBalancerSourceRanges[{i}]"),
                format!("{raw:?} is not a CIDR"),
                "bad_address",
            )
        })?);
    }
    // For contested front ends (dataplane::frontends): the older Service wins.
    let seniority = Seniority {
        created: meta
            .creation_timestamp
            .as_ref()
            .map_or(i64::MAX, |t| t.0.as_second()),
        uid: meta.uid.as_deref().unwrap_or_default().into(),
    };
    let affinity = match spec.session_affinity.as_deref() {
        Some("ClientIP") => SessionAffinity::ClientIp {
            timeout_seconds: affinity_timeout(&object, spec, warnings),
        },
        _ => SessionAffinity::None,
    };
    let distribution = match spec.traffic_distribution.as_deref() {
        Some("PreferClose") => TrafficDistribution::PreferClose,
        Some("PreferSameZone") => TrafficDistribution::PreferSameZone,
        Some("PreferSameNode") => TrafficDistribution::PreferSameNode,
        _ => TrafficDistribution::Unset,
    };
    // externalTrafficPolicy only means something for services reachable from outside.
    let has_external = external_ok || !external_ips.is_empty();
    let etp = if has_external {
        policy(spec.external_traffic_policy.as_deref())
    } else {
        TrafficPolicy::Cluster
    };
    let hc_port = if kind == "LoadBalancer" && etp == TrafficPolicy::Local {
        port_number(
            &object,
            "spec.healthCheckNodePort",
            spec.health_check_node_port.unwrap_or(0),
            true,
        )?
    } else {
        0
    };
    let mut out = Vec::new();
    let ports = spec.ports.as_deref().unwrap_or_default();
    let mut seen = std::collections::BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
            check_name(
                &object,
                &format!("spec.ports[{i}].name"),
                n,
                is_dns1123_label,
                "an RFC 1123 label",
            )?;
        }
        let proto = protocol(
            &object,
            &format!("spec.ports[{i}].protocol"),
            p.protocol.as_deref(),
        )?;
        let port = port_number(&object, &format!("spec.ports[{i}].port"), p.port, false)?;
        let node_port = if external_ok {
            port_number(
                &object,
                &format!("spec.ports[{i}].nodePort"),
                p.node_port.unwrap_or(0),
                true,
            )?
        } else {
            0
        };
        let pname = p.name.clone().unwrap_or_default();
        if !seen.insert((pname.clone(), proto)) {
            return Err(invalid(
                &object,
                format!("spec.ports[{i}].name"),
                format!("duplicate port name {pname:?} for {proto}"),
                "duplicate_port",
            ));
        }
        for ip in &cluster_ips {
            let fam = IpFamily::of(ip);
            out.push(ServicePort {
                seniority: seniority.clone(),
                name: ServicePortName::new(ns, name, &pname, proto),
                family: fam,
                cluster_ip: *ip,
                port,
                node_port,
                external_ips: external_ips
                    .iter()
                    .copied()
                    .filter(|e| IpFamily::of(e) == fam)
                    .collect(),
                load_balancer_ips: lb_ips
                    .iter()
                    .copied()
                    .filter(|e| IpFamily::of(e) == fam)
                    .collect(),
                load_balancer_source_ranges: source_ranges
                    .iter()
                    .copied()
                    .filter(|n| IpFamily::of_net(n) == fam)
                    .collect(),
                external_traffic_policy: etp,
                internal_traffic_policy: policy(spec.internal_traffic_policy.as_deref()),
                session_affinity: affinity,
                traffic_distribution: distribution,
                health_check_node_port: hc_port,
            });
        }
    }
    Ok(out)
}

/// sessionAffinityConfig.clientIP.timeoutSeconds: 10800 when unset; the API allows 1-86400
/// (kube-proxy never sees anything else), so a manifest's value outside is clamped, with a
/// warning naming the object, the field and both values.
fn affinity_timeout(
    object: &str,
    spec: &k8s_openapi::api::core::v1::ServiceSpec,
    warnings: &mut Vec<String>,
) -> u32 {
    let Some(t) = spec
        .session_affinity_config
        .as_ref()
        .and_then(|c| c.client_ip.as_ref())
        .and_then(|c| c.timeout_seconds)
    else {
        return 10800;
    };
    let clamped = t.clamp(1, 86400);
    if clamped != t {
        warnings.push(format!(
            "{object}: field spec.sessionAffinityConfig.clientIP.timeoutSeconds: {t} is out of range 1-86400; {clamped} is used"
        ));
    }
    clamped as u32
}

/// The endpoints one slice contributes, by the service port they belong to, sorted by it.
/// A vector: a slice mostly serves one port, and a `BTreeMap` of one entry is a node of
/// eleven (1.1 KiB a slice, heaptrack).
/// Each list is sorted and deduplicated as a merged one is, so that a service's only slice
/// is its endpoints as they are (see [`merge`]).
pub type SliceEndpoints = Vec<(ServicePortName, Endpoints)>;

/// The family of an EndpointSlice's `addressType`; none for FQDN and anything unknown.
pub fn address_family(address_type: &str) -> Option<IpFamily> {
    match address_type {
        "IPv4" => Some(IpFamily::V4),
        "IPv6" => Some(IpFamily::V6),
        _ => None,
    }
}

/// Convert one EndpointSlice. Slices without the service-name label are not proxied; an
/// addressType other than IPv4 or IPv6 (FQDN, as kube-proxy ignores) is skipped with a warning.
/// A port without a number is dropped with a warning in `warnings` naming the slice and the field.
pub fn endpoint_slice(
    slice: &EndpointSlice,
    warnings: &mut Vec<String>,
) -> Result<SliceEndpoints, Skip> {
    let meta = &slice.metadata;
    let ns = meta.namespace.as_deref().unwrap_or("default");
    let name = meta.name.as_deref().unwrap_or_default();
    let object = named_object(
        "EndpointSlice",
        ns,
        name,
        is_dns1123_subdomain,
        "an RFC 1123 subdomain",
    )?;
    let Some(service) = meta.labels.as_ref().and_then(|l| l.get(LABEL_SERVICE_NAME)) else {
        return Err(Skip::NotProxied {
            object,
            why: format!("no {LABEL_SERVICE_NAME} label"),
        });
    };
    check_name(
        &object,
        &format!("metadata.labels[{LABEL_SERVICE_NAME}]"),
        service,
        is_label_value,
        "a label value",
    )?;
    let family = match address_family(&slice.address_type) {
        Some(f) => f,
        None => {
            let other = &slice.address_type;
            // kube-proxy programs IPv4 and IPv6 slices only (FQDN ones are for DNS): the
            // slice is skipped, but with a warning, since its endpoints then serve nothing.
            return Err(invalid(
                &object,
                "addressType",
                format!("{other:?} is not IPv4 or IPv6, so it cannot be proxied"),
                "unsupported_address_type",
            ));
        }
    };
    let mut ports = Vec::new();
    for (i, p) in slice.ports.iter().flatten().enumerate() {
        if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
            check_name(
                &object,
                &format!("ports[{i}].name"),
                n,
                is_dns1123_label,
                "an RFC 1123 label",
            )?;
        }
        let proto = protocol(
            &object,
            &format!("ports[{i}].protocol"),
            p.protocol.as_deref(),
        )?;
        let Some(num) = p.port else {
            // A port without a number is "all ports": nothing kube-proxy can DNAT to.
            warnings.push(format!(
                "{object}: field ports[{i}].port: null (all ports) cannot be a DNAT target; port {:?} dropped",
                p.name.as_deref().unwrap_or_default()
            ));
            continue;
        };
        let num = port_number(&object, &format!("ports[{i}].port"), num, false)?;
        ports.push((p.name.clone().unwrap_or_default(), proto, num));
    }
    let mut endpoints = Vec::new();
    for (i, e) in slice.endpoints.iter().flatten().enumerate() {
        // kube-proxy uses the first address; the API guarantees they are one pod's.
        let Some(raw) = e.addresses.first() else {
            // The API requires one address at least; only a manifest can lack it.
            warnings.push(format!(
                "{object}: field endpoints[{i}].addresses: empty; endpoint dropped"
            ));
            continue;
        };
        // The field's name is formatted only for the error: formatting, mostly these names
        // (one per endpoint), was 15% of converting a slice (perf, `agent_e2e` at 10k).
        let ip = match raw.trim().parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) => parse_ip(&object, &format!("endpoints[{i}].addresses[0]"), raw)?,
        };
        if IpFamily::of(&ip) != family {
            return Err(invalid(
                &object,
                format!("endpoints[{i}].addresses[0]"),
                format!("{ip} is not {family} (addressType)"),
                "family_mismatch",
            ));
        }
        let cond = e.conditions.as_ref();
        let ready = cond.and_then(|c| c.ready).unwrap_or(true);
        let serving = cond.and_then(|c| c.serving).unwrap_or(ready);
        let terminating = cond.and_then(|c| c.terminating).unwrap_or(false);
        let hints = e.hints.as_ref();
        let zones = hints
            .and_then(|h| h.for_zones.as_ref())
            .map(|z| z.iter().map(|z| interned::intern(&z.name)).collect())
            .unwrap_or_default();
        let nodes = hints
            .and_then(|h| h.for_nodes.as_ref())
            .map(|n| n.iter().map(|n| interned::intern(&n.name)).collect())
            .unwrap_or_default();
        endpoints.push(
            Endpoint {
                ready,
                serving,
                terminating,
                node_name: e.node_name.as_deref().map(interned::intern),
                zone: e.zone.as_deref().map(interned::intern),
                ..Endpoint::ready(ip, 0)
            }
            .with_hints(zones, nodes),
        );
    }
    let mut out = BTreeMap::new();
    for (pname, proto, num) in ports {
        let mut list: Vec<Endpoint> = endpoints
            .iter()
            .map(|e| Endpoint {
                port: num,
                ..e.clone()
            })
            .collect();
        normalize(&mut list);
        out.insert(
            ServicePortName::new(ns, service, &pname, proto),
            list.into(),
        );
    }
    Ok(out.into_iter().collect())
}

/// Merge slices' endpoints: one entry per address and port, preferring the most usable copy,
/// sorted by service port; ports without endpoints are left out. One slice alone is shared
/// as it is, without a copy: it is already what a merge of it gives.
pub fn merge<'a>(
    slices: impl IntoIterator<Item = &'a SliceEndpoints>,
) -> Vec<(ServicePortName, Endpoints)> {
    let mut slices = slices.into_iter().peekable();
    let Some(first) = slices.next() else {
        return Vec::new();
    };
    if slices.peek().is_none() {
        return first
            .iter()
            .filter(|(_, e)| !e.is_empty())
            .cloned()
            .collect();
    }
    let mut out: BTreeMap<ServicePortName, Vec<Endpoint>> = BTreeMap::new();
    for (name, eps) in std::iter::once(first).chain(slices).flatten() {
        out.entry(name.clone()).or_default().extend_from_slice(eps);
    }
    out.into_iter()
        .filter(|(_, e)| !e.is_empty())
        .map(|(name, mut eps)| {
            normalize(&mut eps);
            (name, eps.into())
        })
        .collect()
}

/// Sort and deduplicate an endpoint list.
pub fn normalize(eps: &mut Vec<Endpoint>) {
    // Best first for each (ip, port): ready, then serving.
    eps.sort_by(|a, b| {
        (a.ip, a.port)
            .cmp(&(b.ip, b.port))
            .then(b.ready.cmp(&a.ready))
            .then(b.serving.cmp(&a.serving))
    });
    eps.dedup_by(|later, first| later.ip == first.ip && later.port == first.port);
}

#[cfg(test)]
mod tests;
