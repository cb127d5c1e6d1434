//! Endpoint selection: which endpoints a service port's cluster-wide and local traffic may use.
//!
//! The rules are kube-proxy's (pkg/proxy/topology.go): ready endpoints when there are any,
//! otherwise serving-and-terminating ones; never non-serving ones; chosen independently for
//! the cluster-wide set and the node-local set.

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

/// Select the endpoints of one service port, in the port's family only.
pub fn select<'a>(node: &NodeConfig, svc: &ServicePort, endpoints: &'a [Endpoint]) -> Selected<'a> {
    let family = svc.family;
    let of_family = endpoints
        .iter()
        .filter(move |e| IpFamily::of(&e.ip) == family);
    let cluster = usable(of_family.clone());
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

    fn ep(ip: &str, ready: bool, serving: bool, terminating: bool, node: &str) -> Endpoint {
        Endpoint {
            ready,
            serving,
            terminating,
            node_name: Some(node.to_string()),
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
