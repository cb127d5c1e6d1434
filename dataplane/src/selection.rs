//! Endpoint selection: which endpoints a service port's cluster-wide and local traffic may use.
//!
//! The rules are kube-proxy's (pkg/proxy/topology.go): ready endpoints when there are any,
//! otherwise serving-and-terminating ones; never non-serving ones; chosen independently for
//! the cluster-wide set and the node-local set. Topology hints narrow the cluster-wide set:
//! node hints when every ready endpoint has one and one names this node, else zone hints when
//! every ready endpoint has one and one names this node's zone; never the local set. As in
//! kube-proxy, a Service's `trafficDistribution` is read only through the hints the
//! EndpointSlice controller derives from it.

use crate::model::{Endpoint, IpFamily, NodeConfig, ServicePort, TrafficPolicy};

/// The endpoints each kind of traffic of one service port is spread over.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selected<'a> {
    /// For traffic subject to the Cluster policy.
    pub cluster: Vec<&'a Endpoint>,
    /// Endpoints on this node, for traffic subject to the Local policy.
    pub local: Vec<&'a Endpoint>,
}

/// Endpoints to use when no policy narrows them: ready first, else serving and terminating.
fn usable<'a, I>(endpoints: I) -> Vec<&'a Endpoint>
where
    I: Iterator<Item = &'a Endpoint> + Clone,
{
    let ready: Vec<&Endpoint> = endpoints.clone().filter(|e| e.ready).collect();
    if !ready.is_empty() {
        return ready;
    }
    endpoints.filter(|e| e.serving && e.terminating).collect()
}

/// Which hints narrow the cluster-wide endpoints on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// No hints apply: every endpoint.
    None,
    /// Endpoints hinted for this node.
    SameNode,
    /// Endpoints hinted for this node's zone.
    SameZone,
}

/// kube-proxy's choice of topology mode from the ready endpoints' hints (pkg/proxy/topology.go).
pub fn topology<'a, I>(node: &NodeConfig, endpoints: I) -> Topology
where
    I: Iterator<Item = &'a Endpoint>,
{
    let (mut any, mut all_node, mut for_node, mut all_zone, mut for_zone) =
        (false, true, false, true, false);
    let zone = node.zone.as_deref();
    for e in endpoints.filter(|e| e.ready) {
        any = true;
        if e.hint_nodes().is_empty() {
            all_node = false;
        } else if e.hint_nodes().iter().any(|h| **h == *node.name) {
            for_node = true;
        }
        if e.hint_zones().is_empty() {
            all_zone = false;
        } else if zone.is_some_and(|z| e.hint_zones().iter().any(|h| &**h == z)) {
            for_zone = true;
        }
    }
    if any && all_node && for_node {
        Topology::SameNode
    } else if any && all_zone && for_zone {
        Topology::SameZone
    } else {
        Topology::None
    }
}

fn available(e: &Endpoint, mode: Topology, node: &NodeConfig) -> bool {
    match mode {
        Topology::None => true,
        Topology::SameNode => e.hint_nodes().iter().any(|h| **h == *node.name),
        Topology::SameZone => node
            .zone
            .as_deref()
            .is_some_and(|z| e.hint_zones().iter().any(|h| &**h == z)),
    }
}

/// Select the endpoints of one service port, in the port's family only.
pub fn select<'a>(node: &NodeConfig, svc: &ServicePort, endpoints: &'a [Endpoint]) -> Selected<'a> {
    let family = svc.family;
    let of_family = endpoints
        .iter()
        .filter(move |e| IpFamily::of(&e.ip) == family);
    let mode = topology(node, of_family.clone());
    // Hints only ever pick among ready endpoints; with none ready the fallback to serving
    // and terminating ones ignores them, as kube-proxy's does.
    let mut cluster: Vec<&Endpoint> = of_family
        .clone()
        .filter(|e| e.ready && available(e, mode, node))
        .collect();
    if cluster.is_empty() {
        cluster = of_family
            .clone()
            .filter(|e| e.serving && e.terminating)
            .collect();
    }
    let local = usable(of_family.filter(|e| e.is_local(&node.name)));
    Selected { cluster, local }
}

/// The endpoints ClusterIP traffic goes to under internalTrafficPolicy.
pub fn internal<'a, 'b>(svc: &ServicePort, sel: &'b Selected<'a>) -> &'b [&'a Endpoint] {
    match svc.internal_traffic_policy {
        TrafficPolicy::Cluster => &sel.cluster,
        TrafficPolicy::Local => &sel.local,
    }
}

/// The endpoints external traffic goes to under externalTrafficPolicy.
pub fn external<'a, 'b>(svc: &ServicePort, sel: &'b Selected<'a>) -> &'b [&'a Endpoint] {
    match svc.external_traffic_policy {
        TrafficPolicy::Cluster => &sel.cluster,
        TrafficPolicy::Local => &sel.local,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::*;
    use std::net::IpAddr;
    use std::sync::Arc;

    fn ep(ip: &str, ready: bool, serving: bool, terminating: bool, node: &str) -> Endpoint {
        Endpoint {
            ready,
            serving,
            terminating,
            node_name: Some(node.into()),
            ..Endpoint::ready(ip.parse::<IpAddr>().unwrap(), 80)
        }
    }

    fn svc() -> ServicePort {
        ServicePort::cluster(
            ServicePortName::new("ns", "svc", "p", Protocol::Tcp),
            "172.30.0.1".parse().unwrap(),
            80,
        )
    }

    fn node() -> NodeConfig {
        NodeConfig {
            name: "me".into(),
            ..NodeConfig::default()
        }
    }

    #[test]
    fn ready_endpoints_win_over_terminating() {
        let eps = vec![
            ep("10.0.0.1", true, true, false, "me"),
            ep("10.0.0.2", false, true, true, "other"),
        ];
        let s = select(&node(), &svc(), &eps);
        assert_eq!(s.cluster, vec![&eps[0]]);
        assert_eq!(s.local, vec![&eps[0]]);
    }

    #[test]
    fn terminating_serving_used_when_none_ready_and_local_chosen_independently() {
        let eps = vec![
            ep("10.0.0.1", false, true, true, "me"),
            ep("10.0.0.2", true, true, false, "other"),
            ep("10.0.0.3", false, false, true, "me"),
        ];
        let s = select(&node(), &svc(), &eps);
        assert_eq!(s.cluster, vec![&eps[1]]);
        assert_eq!(
            s.local,
            vec![&eps[0]],
            "non-serving endpoints are never used"
        );
    }

    fn hinted(ip: &str, node: &str, zones: &[&str], nodes: &[&str]) -> Endpoint {
        Endpoint {
            hints: Some(Box::new(Hints {
                zones: zones.iter().map(|z| Arc::from(*z)).collect(),
                nodes: nodes.iter().map(|n| Arc::from(*n)).collect(),
            })),
            ..ep(ip, true, true, false, node)
        }
    }

    fn zoned_node() -> NodeConfig {
        NodeConfig {
            zone: Some("zone-a".into()),
            ..node()
        }
    }

    fn ips(v: &[&Endpoint]) -> Vec<String> {
        v.iter().map(|e| e.ip.to_string()).collect()
    }

    #[test]
    fn zone_hints_narrow_the_cluster_set_only_when_complete_and_matching() {
        let eps = vec![
            hinted("10.0.0.1", "me", &["zone-a"], &[]),
            hinted("10.0.0.2", "other", &["zone-b"], &[]),
            hinted("10.0.0.3", "third", &["zone-a", "zone-c"], &[]),
        ];
        let s = select(&zoned_node(), &svc(), &eps);
        assert_eq!(ips(&s.cluster), ["10.0.0.1", "10.0.0.3"]);
        assert_eq!(ips(&s.local), ["10.0.0.1"], "the local set ignores hints");

        // One ready endpoint without a hint: hints are ignored.
        let mut partial = eps.clone();
        partial[1].hints = None;
        assert_eq!(select(&zoned_node(), &svc(), &partial).cluster.len(), 3);
        // An unready endpoint without a hint does not count.
        partial[1].ready = false;
        partial[1].serving = false;
        assert_eq!(
            ips(&select(&zoned_node(), &svc(), &partial).cluster),
            ["10.0.0.1", "10.0.0.3"]
        );

        // No endpoint for this zone, or a node without a zone label: hints are ignored.
        let other_zone = NodeConfig {
            zone: Some("zone-x".into()),
            ..node()
        };
        assert_eq!(select(&other_zone, &svc(), &eps).cluster.len(), 3);
        assert_eq!(select(&node(), &svc(), &eps).cluster.len(), 3);
    }

    #[test]
    fn node_hints_win_over_zone_hints() {
        let eps = vec![
            hinted("10.0.0.1", "other", &["zone-a"], &["me"]),
            hinted("10.0.0.2", "other", &["zone-a"], &["other"]),
        ];
        let s = select(&zoned_node(), &svc(), &eps);
        assert_eq!(ips(&s.cluster), ["10.0.0.1"]);
        // Node hints that do not name this node fall back to zone hints.
        let mut not_me = eps.clone();
        if let Some(h) = not_me[0].hints.as_mut() {
            h.nodes = vec!["third".into()];
        }
        assert_eq!(select(&zoned_node(), &svc(), &not_me).cluster.len(), 2);
        assert_eq!(topology(&zoned_node(), not_me.iter()), Topology::SameZone);
    }

    #[test]
    fn terminating_fallback_ignores_hints() {
        let mut a = hinted("10.0.0.1", "other", &["zone-b"], &[]);
        let mut b = hinted("10.0.0.2", "other", &["zone-a"], &[]);
        for e in [&mut a, &mut b] {
            e.ready = false;
            e.terminating = true;
        }
        let eps = vec![a, b];
        assert_eq!(select(&zoned_node(), &svc(), &eps).cluster.len(), 2);
    }

    #[test]
    fn other_family_endpoints_are_ignored() {
        let mut e6 = ep("fd00::1", true, true, false, "me");
        e6.ip = "fd00::1".parse().unwrap();
        let eps = vec![e6, ep("10.0.0.1", true, true, false, "x")];
        let s = select(&node(), &svc(), &eps);
        assert_eq!(s.cluster, vec![&eps[1]]);
        assert!(s.local.is_empty());
    }
}
