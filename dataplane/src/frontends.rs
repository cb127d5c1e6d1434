//! Contested front ends, decided once for every backend.
//!
//! A front end is an (address, protocol, port) that a service port claims as its ClusterIP, an
//! external IP or a load-balancer IP. When ports of different services claim the same one,
//! exactly one wins, by this rule (issue 29, the CVE-2020-8554 class):
//!
//! 1. a ClusterIP beats an external IP or a load-balancer IP (an external IP must never take
//!    a ClusterIP's traffic); an external IP and a load-balancer IP are equals;
//! 2. among equals, the older Service (creationTimestamp) wins, then the smaller uid;
//! 3. only when both are equal or unknown, the smaller namespace/name/port name.
//!
//! The loser's claim is taken out of the snapshot before any backend sees it: a losing
//! external or load-balancer IP is removed from its port, a losing ClusterIP takes its
//! service port (that family) out. So nftables, iptables and IPVS program the same winner,
//! and none of them meets a conflict. kube-proxy has no such rule (its proxiers program
//! every claim in map order; see the README).

use crate::model::{IpFamily, Protocol, Seniority, ServicePort, ServicePortName, Snapshot};
use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

/// What a service port claims an address as. The order is the precedence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClaimKind {
    ClusterIp,
    /// An external IP or a load-balancer IP: equals.
    External,
}

/// An (address, protocol, port) that packets are matched on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FrontendKey {
    pub ip: IpAddr,
    pub protocol: Protocol,
    pub port: u16,
}

impl fmt::Display for FrontendKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}/{}", self.port, self.protocol),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}/{}", self.port, self.protocol),
        }
    }
}

/// One claim; the `Ord` is the precedence (the smallest wins).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Claim {
    pub kind: ClaimKind,
    pub seniority: Seniority,
    pub name: ServicePortName,
    pub family: IpFamily,
    /// The address is a load-balancer IP (reporting only; equal to an external IP).
    pub load_balancer: bool,
}

impl Claim {
    fn what(&self) -> &'static str {
        match (self.kind, self.load_balancer) {
            (ClaimKind::ClusterIp, _) => "ClusterIP",
            (ClaimKind::External, false) => "external IP",
            (ClaimKind::External, true) => "load-balancer IP",
        }
    }

    fn same_port(&self, other: &Claim) -> bool {
        self.name == other.name && self.family == other.family
    }
}

/// Every front end a service port claims.
pub fn claims_of(p: &ServicePort) -> Vec<(FrontendKey, Claim)> {
    let claim = |kind, load_balancer| Claim {
        kind,
        seniority: p.seniority.clone(),
        name: p.name.clone(),
        family: p.family,
        load_balancer,
    };
    let key = |ip| FrontendKey {
        ip,
        protocol: p.name.protocol,
        port: p.port,
    };
    let mut out = vec![(key(p.cluster_ip), claim(ClaimKind::ClusterIp, false))];
    out.extend(
        p.external_ips
            .iter()
            .map(|ip| (key(*ip), claim(ClaimKind::External, false))),
    );
    out.extend(
        p.load_balancer_ips
            .iter()
            .map(|ip| (key(*ip), claim(ClaimKind::External, true))),
    );
    out
}

/// Every claim on every front end, kept up to date port by port (the agent's store) or
/// built at once ([`resolve_snapshot`]).
#[derive(Debug, Clone, Default)]
pub struct Claims {
    /// Each front end's claims, sorted, the winner first. Almost always one: a vector of
    /// one costs one claim, where a `BTreeSet` of one costs a node of eleven (1.3 KiB a
    /// service port, 13 MiB at 10k services, measured with heaptrack).
    by_key: BTreeMap<FrontendKey, Vec<Claim>>,
}

impl Claims {
    /// Add a port's claims; returns the front ends it claims.
    pub fn add(&mut self, p: &ServicePort) -> Vec<FrontendKey> {
        claims_of(p)
            .into_iter()
            .map(|(k, c)| {
                let claims = self
                    .by_key
                    .entry(k)
                    .or_insert_with(|| Vec::with_capacity(1));
                if let Err(at) = claims.binary_search(&c) {
                    claims.insert(at, c);
                }
                k
            })
            .collect()
    }

    /// Take a port's claims out; returns the front ends it claimed.
    pub fn remove(&mut self, p: &ServicePort) -> Vec<FrontendKey> {
        claims_of(p)
            .into_iter()
            .map(|(k, c)| {
                if let Some(set) = self.by_key.get_mut(&k) {
                    if let Ok(at) = set.binary_search(&c) {
                        set.remove(at);
                    }
                    if set.is_empty() {
                        self.by_key.remove(&k);
                    }
                }
                k
            })
            .collect()
    }

    /// The service ports claiming `key`.
    pub fn claimants(&self, key: &FrontendKey) -> impl Iterator<Item = &Claim> + '_ {
        self.by_key.get(key).into_iter().flatten()
    }

    /// The winning claim of `key`.
    pub fn winner(&self, key: &FrontendKey) -> Option<&Claim> {
        self.by_key.get(key).and_then(|s| s.first())
    }

    /// How many claims lose to another service port's (the metric).
    pub fn lost(&self) -> usize {
        self.by_key
            .values()
            .map(|set| {
                let top = set.iter().next();
                set.iter()
                    .filter(|c| top.is_some_and(|t| !t.same_port(c)))
                    .count()
            })
            .sum()
    }

    /// `p` as it may be programmed: `None` when its ClusterIP is lost, else without the
    /// external and load-balancer IPs it lost. Each loss adds a message to `lost` naming
    /// both service ports, the front end and the rule.
    pub fn resolve(&self, p: &ServicePort, lost: &mut Vec<String>) -> Option<ServicePort> {
        let mut out = p.clone();
        for (key, claim) in claims_of(p) {
            let Some(winner) = self.winner(&key) else {
                continue;
            };
            if winner.same_port(&claim) {
                continue;
            }
            let rule = if winner.kind < claim.kind {
                "a ClusterIP beats an external or load-balancer IP"
            } else if winner.seniority.created < claim.seniority.created {
                "the older Service wins"
            } else if winner.seniority != claim.seniority {
                "equal age: the smaller uid wins"
            } else {
                "equal age and uid: the smaller namespace/name wins"
            };
            lost.push(format!(
                "front end {key}: the {} of service port {} ({}) loses to the {} of {} ({}); \
                 rule: {rule}; the losing claim is not programmed",
                claim.what(),
                claim.name,
                claim.family,
                winner.what(),
                winner.name,
                winner.family,
            ));
            match claim.kind {
                ClaimKind::ClusterIp => return None,
                ClaimKind::External if claim.load_balancer => {
                    out.load_balancer_ips.retain(|ip| *ip != key.ip)
                }
                ClaimKind::External => out.external_ips.retain(|ip| *ip != key.ip),
            }
        }
        Some(out)
    }
}

/// Decide every contested front end of `snapshot` in place; returns one message per lost
/// claim (also the number for the metric).
pub fn resolve_snapshot(snapshot: &mut Snapshot) -> Vec<String> {
    let mut claims = Claims::default();
    for p in snapshot.services.values() {
        claims.add(p);
    }
    if claims.lost() == 0 {
        return Vec::new();
    }
    let mut lost = Vec::new();
    let mut resolved = BTreeMap::new();
    for (k, p) in &snapshot.services {
        if let Some(r) = claims.resolve(p, &mut lost) {
            resolved.insert(k.clone(), r);
        }
    }
    snapshot.services = resolved;
    lost
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ServicePortName;

    fn port(ns: &str, name: &str, cip: &str, ext: &[&str], created: i64) -> ServicePort {
        let mut p = ServicePort::cluster(
            ServicePortName::new(ns, name, "http", Protocol::Tcp),
            cip.parse().unwrap(),
            80,
        );
        p.external_ips = ext.iter().map(|e| e.parse().unwrap()).collect();
        p.seniority.created = created;
        p
    }

    fn snap(ports: Vec<ServicePort>) -> Snapshot {
        let mut s = Snapshot::default();
        for p in ports {
            s.services.insert((p.name.clone(), p.family), p);
        }
        s
    }

    /// CVE-2020-8554 class: a Service named to sort first, even older, cannot take another
    /// Service's ClusterIP with an external IP.
    #[test]
    fn a_cluster_ip_beats_an_external_ip_whatever_the_names_and_ages() {
        let mut s = snap(vec![
            port("aaa", "evil", "10.96.0.99", &["10.96.0.10"], 1),
            port("kube-system", "dns", "10.96.0.10", &[], 1000),
        ]);
        let lost = resolve_snapshot(&mut s);
        assert_eq!(lost.len(), 1, "{lost:?}");
        assert!(
            lost[0].contains("aaa/evil:http/tcp") && lost[0].contains("kube-system/dns:http/tcp"),
            "{lost:?}"
        );
        let evil = s
            .services
            .values()
            .find(|p| &*p.name.name == "evil")
            .unwrap();
        assert!(evil.external_ips.is_empty());
        let dns = s
            .services
            .values()
            .find(|p| &*p.name.name == "dns")
            .unwrap();
        assert_eq!(dns.cluster_ip.to_string(), "10.96.0.10");
    }

    #[test]
    fn among_equals_the_older_service_wins_not_the_smaller_name() {
        let mut s = snap(vec![
            port("aaa", "young", "10.96.0.1", &["192.0.2.1"], 2000),
            port("zzz", "old", "10.96.0.2", &["192.0.2.1"], 1000),
        ]);
        let lost = resolve_snapshot(&mut s);
        assert_eq!(lost.len(), 1, "{lost:?}");
        let young = s
            .services
            .values()
            .find(|p| &*p.name.name == "young")
            .unwrap();
        let old = s
            .services
            .values()
            .find(|p| &*p.name.name == "old")
            .unwrap();
        assert!(young.external_ips.is_empty());
        assert_eq!(old.external_ips.len(), 1);
        // Two ClusterIPs: the younger port goes.
        let mut s = snap(vec![
            port("aaa", "young", "10.96.0.1", &[], 2000),
            port("zzz", "old", "10.96.0.1", &[], 1000),
        ]);
        assert_eq!(resolve_snapshot(&mut s).len(), 1);
        assert_eq!(s.services.len(), 1);
        assert_eq!(&*s.services.values().next().unwrap().name.name, "old");
    }

    #[test]
    fn a_port_claiming_its_own_front_end_twice_is_no_conflict() {
        let mut s = snap(vec![port("ns", "a", "10.96.0.1", &["10.96.0.1"], 1)]);
        let before = s.clone();
        assert!(resolve_snapshot(&mut s).is_empty());
        assert_eq!(s, before);
    }

    #[test]
    fn incremental_claims_follow_adds_and_removes() {
        let dns = port("kube-system", "dns", "10.96.0.10", &[], 1000);
        let evil = port("aaa", "evil", "10.96.0.99", &["10.96.0.10"], 1);
        let mut c = Claims::default();
        c.add(&evil);
        let mut lost = Vec::new();
        assert_eq!(c.resolve(&evil, &mut lost).as_ref(), Some(&evil));
        c.add(&dns);
        assert_eq!(c.lost(), 1);
        assert!(c.resolve(&evil, &mut lost).unwrap().external_ips.is_empty());
        c.remove(&dns);
        assert_eq!(c.lost(), 0);
    }
}
