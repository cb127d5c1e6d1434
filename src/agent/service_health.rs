//! Health-check node ports: for every service with a `healthCheckNodePort` (LoadBalancer
//! services with externalTrafficPolicy Local), an HTTP server on that port that tells the
//! load balancer whether this node has a local endpoint, answering as kube-proxy's does.
//!
//! What to serve is pure ([`desired`], [`reply`], [`bind_addresses`]); [`Servers`] opens and
//! closes the listeners as services come and go.

use super::health::Health;
use super::http::{self, Reply};
use dataplane::model::{IpFamily, NodeConfig, NodePortAddresses, Snapshot};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;
use tokio::task::JoinHandle;

/// One health-check port: the service it speaks for and its local ready endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub namespace: String,
    pub name: String,
    /// Distinct local ready endpoint addresses over the service's ports, as kube-proxy
    /// counts them (one pod serving two ports is one endpoint).
    pub local_endpoints: usize,
}

/// The health-check ports a snapshot asks for. A dual-stack service is counted in its
/// IPv4 family (kube-proxy runs one server per family; they agree unless the families'
/// endpoints differ). A port two services claim goes to the first.
pub fn desired(snapshot: &Snapshot) -> BTreeMap<u16, Entry> {
    let node = &snapshot.node.name;
    let mut out: BTreeMap<u16, (Entry, IpFamily, BTreeSet<IpAddr>)> = BTreeMap::new();
    for ((name, family), svc) in &snapshot.services {
        let port = svc.health_check_node_port;
        if port == 0 {
            continue;
        }
        let local = snapshot
            .endpoints_of(name)
            .iter()
            .filter(|e| e.ready && e.is_local(node) && IpFamily::of(&e.ip) == *family)
            .map(|e| e.ip);
        match out.get_mut(&port) {
            Some((e, f, ips)) if name.is_of(&e.namespace, &e.name) => {
                if *f == *family {
                    ips.extend(local);
                }
            }
            Some((e, _, _)) => tracing::warn!(
                "service {}/{}: healthCheckNodePort {port} is already served for {}/{}; skipped",
                name.namespace,
                name.name,
                e.namespace,
                e.name
            ),
            None => {
                let entry = Entry {
                    namespace: name.namespace.to_string(),
                    name: name.name.to_string(),
                    local_endpoints: 0,
                };
                out.insert(port, (entry, *family, local.collect()));
            }
        }
    }
    out.into_iter()
        .map(|(p, (e, _, ips))| {
            let local_endpoints = ips.len();
            (
                p,
                Entry {
                    local_endpoints,
                    ..e
                },
            )
        })
        .collect()
}

/// kube-proxy's answer: 200 with local endpoints and a healthy proxy, else 503; `None` (404)
/// for a port whose service is gone.
pub fn reply(entry: Option<&Entry>, proxy_healthy: bool) -> Option<Reply> {
    let e = entry?;
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    let body = format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {},\n\t\"serviceProxyHealthy\": {proxy_healthy}\n}}",
        quote(&e.namespace),
        quote(&e.name),
        e.local_endpoints
    );
    let status = if e.local_endpoints > 0 && proxy_healthy {
        200
    } else {
        503
    };
    let mut r = Reply::json(status, body);
    r.headers.push((
        "x-load-balancing-endpoint-weight",
        e.local_endpoints.to_string(),
    ));
    Some(r)
}

/// Where the servers listen: every address when nodePortAddresses takes them all (`::`,
/// which also takes IPv4), else each node address inside nodePortAddresses.
pub fn bind_addresses(node: &NodeConfig) -> Vec<IpAddr> {
    match &node.node_port_addresses {
        NodePortAddresses::All => vec![IpAddr::V6(Ipv6Addr::UNSPECIFIED)],
        NodePortAddresses::Cidrs(cidrs) => {
            let mut v: Vec<IpAddr> = node
                .node_ips
                .iter()
                .copied()
                .filter(|ip| cidrs.iter().any(|c| c.contains(*ip)))
                .collect();
            v.sort();
            v.dedup();
            v
        }
    }
}

/// Opens a listener; `::` falls back to `0.0.0.0` on a node without IPv6.
fn listen(ip: IpAddr, port: u16) -> std::io::Result<tokio::net::TcpListener> {
    let l = match std::net::TcpListener::bind(SocketAddr::new(ip, port)) {
        Err(_) if ip == IpAddr::V6(Ipv6Addr::UNSPECIFIED) => {
            std::net::TcpListener::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port))?
        }
        other => other?,
    };
    l.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(l)
}

/// The running health-check servers.
pub struct Servers {
    entries: Arc<Mutex<BTreeMap<u16, Entry>>>,
    /// Per port: where it listens and the serving tasks (aborting one closes its socket).
    listening: BTreeMap<u16, (Vec<IpAddr>, Vec<JoinHandle<()>>)>,
    health: Arc<Mutex<Health>>,
    /// One pool for every port: a node may serve hundreds of them, and the open-files
    /// budget is the same however many there are.
    limits: http::Limits,
}

impl Servers {
    pub fn new(health: Arc<Mutex<Health>>, limits: http::Limits) -> Servers {
        Servers {
            entries: Arc::default(),
            listening: BTreeMap::new(),
            health,
            limits,
        }
    }

    /// Serve what `snapshot` asks for: new counts at once, new ports opened, gone ones
    /// closed. A port that cannot be opened is retried at the next call. Needs a tokio
    /// runtime.
    pub fn reconcile(&mut self, snapshot: &Snapshot) {
        let want = desired(snapshot);
        let addrs = bind_addresses(&snapshot.node);
        {
            let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            *entries = want.clone();
        }
        let stale: Vec<u16> = self
            .listening
            .iter()
            .filter(|(port, (at, _))| !want.contains_key(port) || *at != addrs)
            .map(|(port, _)| *port)
            .collect();
        for port in stale {
            if let Some((_, tasks)) = self.listening.remove(&port) {
                tasks.iter().for_each(JoinHandle::abort);
                tracing::info!("health-check node port {port} closed");
            }
        }
        for (port, entry) in &want {
            if self.listening.contains_key(port) {
                continue;
            }
            let mut tasks = Vec::new();
            for ip in &addrs {
                match listen(*ip, *port) {
                    Ok(l) => tasks.push(tokio::spawn(http::serve(
                        l,
                        self.router(*port),
                        self.limits.clone(),
                    ))),
                    Err(e) => tracing::warn!(
                        "service {}/{}: cannot listen on healthCheckNodePort {}: {e}; retrying at the next sync",
                        entry.namespace,
                        entry.name,
                        SocketAddr::new(*ip, *port)
                    ),
                }
            }
            if tasks.len() == addrs.len() && !addrs.is_empty() {
                tracing::info!(
                    "health-check node port {port} open for service {}/{}",
                    entry.namespace,
                    entry.name
                );
                self.listening.insert(*port, (addrs.clone(), tasks));
            } else {
                tasks.iter().for_each(JoinHandle::abort);
            }
        }
    }

    fn router(&self, port: u16) -> http::Router {
        let entries = self.entries.clone();
        let health = self.health.clone();
        // Every path answers, as kube-proxy's handler is mounted at `/`.
        Arc::new(move |_path| {
            let healthy = {
                let h = health.lock().unwrap_or_else(|p| p.into_inner());
                h.proxier_healthy(SystemTime::now())
            };
            let entries = entries.lock().unwrap_or_else(|p| p.into_inner());
            reply(entries.get(&port), healthy)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::model::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn snapshot() -> Snapshot {
        let mut s = Snapshot::default();
        s.node.name = "me".into();
        for (port, proto) in [("http", Protocol::Tcp), ("dns", Protocol::Udp)] {
            let name = ServicePortName::new("ns", "web", port, proto);
            let mut svc = ServicePort::cluster(name.clone(), ip("172.30.0.1"), 80);
            svc.health_check_node_port = 30100;
            svc.external_traffic_policy = TrafficPolicy::Local;
            s.services.insert((name.clone(), IpFamily::V4), svc);
            let mine = |a: &str, ready: bool| Endpoint {
                node_name: Some("me".into()),
                ready,
                ..Endpoint::ready(ip(a), 8080)
            };
            s.endpoints.insert(
                name,
                vec![
                    mine("10.0.0.1", true),
                    mine("10.0.0.2", false),
                    Endpoint {
                        node_name: Some("other".into()),
                        ..Endpoint::ready(ip("10.0.0.3"), 8080)
                    },
                ]
                .into(),
            );
        }
        s
    }

    #[test]
    fn counts_distinct_local_ready_endpoints_over_the_service_ports() {
        let want = desired(&snapshot());
        assert_eq!(
            want,
            BTreeMap::from([(
                30100,
                Entry {
                    namespace: "ns".into(),
                    name: "web".into(),
                    local_endpoints: 1
                }
            )])
        );
    }

    #[test]
    fn answers_as_kube_proxy() {
        let e = Entry {
            namespace: "ns".into(),
            name: "web".into(),
            local_endpoints: 1,
        };
        let r = reply(Some(&e), true).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(
            r.body,
            "{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 1,\n\t\"serviceProxyHealthy\": true\n}"
        );
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["service"]["name"], "web");
        assert_eq!(reply(Some(&e), false).unwrap().status, 503);
        let none = Entry {
            local_endpoints: 0,
            ..e
        };
        assert_eq!(reply(Some(&none), true).unwrap().status, 503);
        assert!(reply(None, true).is_none());
    }

    #[test]
    fn listens_on_node_addresses_inside_node_port_addresses() {
        let mut node = NodeConfig {
            node_ips: vec![ip("192.168.0.2"), ip("10.1.0.5"), ip("2001:db8::1")],
            ..NodeConfig::default()
        };
        assert_eq!(bind_addresses(&node), vec![ip("::")]);
        node.node_port_addresses =
            NodePortAddresses::Cidrs(vec!["192.168.0.0/24".parse().unwrap()]);
        assert_eq!(bind_addresses(&node), vec![ip("192.168.0.2")]);
    }
}
