//! The IPVS operations that move one virtual service from what it has to what is wanted
//! (pure), with kube-proxy's graceful termination: a TCP real server that is no longer
//! wanted but still has connections is drained (weight 0) and deleted by a later sync once
//! its connections are gone; UDP and SCTP ones are deleted at once (with
//! `expire_nodest_conn`, their flows move on with the next packet).

use super::genl::{Dest, Op, ServiceId, ServiceSpec};
use super::plan::WantedService;
use crate::model::Protocol;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// A real server being drained: service, address, port.
pub type Draining = BTreeSet<(ServiceId, IpAddr, u16)>;

/// What a virtual service holds: its settings and real servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Have {
    pub spec: ServiceSpec,
    pub dests: BTreeMap<(IpAddr, u16), Dest>,
}

/// A wanted real server as [`Have`] lists one (no connections known).
pub fn have_of(want: &WantedService) -> Have {
    Have {
        spec: want.spec.clone(),
        dests: want
            .dests
            .iter()
            .map(|(&(addr, port), &weight)| {
                (
                    (addr, port),
                    Dest {
                        addr,
                        port,
                        weight,
                        active_conns: 0,
                        inactive_conns: 0,
                    },
                )
            })
            .collect(),
    }
}

/// Whether removing a real server of this protocol waits for its connections.
fn graceful(p: Protocol) -> bool {
    p == Protocol::Tcp
}

/// Appends to `out` what brings `id` from `have` to `want`, and keeps `draining` (the
/// servers left at weight 0 for their connections) up to date.
pub fn service_ops(
    id: &ServiceId,
    have: Option<&Have>,
    want: Option<&WantedService>,
    draining: &mut Draining,
    out: &mut Vec<Op>,
) {
    match (have, want) {
        // Nothing held, nothing wanted (gone behind our back): nothing left to drain.
        (None, None) => draining.retain(|(s, _, _)| s != id),
        (Some(_), None) => {
            // A service going away takes its servers with it, drained or not.
            draining.retain(|(s, _, _)| s != id);
            out.push(Op::DeleteService(*id));
        }
        (None, Some(w)) => {
            draining.retain(|(s, _, _)| s != id);
            out.push(Op::AddService(*id, w.spec.clone()));
            for (&(ip, port), &weight) in &w.dests {
                out.push(Op::AddDest(*id, ip, port, weight));
            }
        }
        (Some(h), Some(w)) => {
            if h.spec != w.spec {
                out.push(Op::UpdateService(*id, w.spec.clone()));
            }
            for (&(ip, port), &weight) in &w.dests {
                match h.dests.get(&(ip, port)) {
                    None => out.push(Op::AddDest(*id, ip, port, weight)),
                    Some(d) if d.weight != weight => {
                        out.push(Op::UpdateDest(*id, ip, port, weight))
                    }
                    Some(_) => {}
                }
                draining.remove(&(*id, ip, port));
            }
            for (&(ip, port), d) in &h.dests {
                if w.dests.contains_key(&(ip, port)) {
                    continue;
                }
                if graceful(id.protocol) && d.active_conns + d.inactive_conns > 0 {
                    if d.weight != 0 {
                        out.push(Op::UpdateDest(*id, ip, port, 0));
                    }
                    draining.insert((*id, ip, port));
                } else {
                    out.push(Op::DeleteDest(*id, ip, port));
                    draining.remove(&(*id, ip, port));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(p: Protocol) -> ServiceId {
        ServiceId {
            addr: "172.30.0.1".parse().unwrap(),
            protocol: p,
            port: 80,
        }
    }

    fn spec() -> ServiceSpec {
        ServiceSpec {
            scheduler: "rr".into(),
            flags: 0,
            timeout: 0,
        }
    }

    fn want(eps: &[&str]) -> WantedService {
        WantedService {
            spec: spec(),
            dests: eps
                .iter()
                .map(|e| ((e.parse().unwrap(), 8080), 1))
                .collect(),
            owner: "ns/web:http".into(),
            service: ("ns".into(), "web".into()),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn one_endpoint_change_is_one_operation_each_way() {
        let mut draining = Draining::new();
        let have = have_of(&want(&["10.0.0.1", "10.0.0.2"]));
        let mut out = Vec::new();
        service_ops(
            &id(Protocol::Tcp),
            Some(&have),
            Some(&want(&["10.0.0.1", "10.0.0.2", "10.0.0.3"])),
            &mut draining,
            &mut out,
        );
        assert_eq!(
            out,
            vec![Op::AddDest(id(Protocol::Tcp), ip("10.0.0.3"), 8080, 1)]
        );
        out.clear();
        // No connections: deleted at once.
        service_ops(
            &id(Protocol::Tcp),
            Some(&have),
            Some(&want(&["10.0.0.1"])),
            &mut draining,
            &mut out,
        );
        assert_eq!(
            out,
            vec![Op::DeleteDest(id(Protocol::Tcp), ip("10.0.0.2"), 8080)]
        );
        assert!(draining.is_empty());
    }

    #[test]
    fn tcp_servers_with_connections_drain_and_udp_ones_go_at_once() {
        for (proto, drains) in [(Protocol::Tcp, true), (Protocol::Udp, false)] {
            let mut draining = Draining::new();
            let mut have = have_of(&want(&["10.0.0.1", "10.0.0.2"]));
            have.dests
                .get_mut(&(ip("10.0.0.2"), 8080))
                .unwrap()
                .active_conns = 3;
            let mut out = Vec::new();
            service_ops(
                &id(proto),
                Some(&have),
                Some(&want(&["10.0.0.1"])),
                &mut draining,
                &mut out,
            );
            if drains {
                assert_eq!(
                    out,
                    vec![Op::UpdateDest(id(proto), ip("10.0.0.2"), 8080, 0)]
                );
                assert_eq!(draining.len(), 1);
                // Next sync, still connected and at weight 0: nothing to do, still draining.
                have.dests.get_mut(&(ip("10.0.0.2"), 8080)).unwrap().weight = 0;
                out.clear();
                service_ops(
                    &id(proto),
                    Some(&have),
                    Some(&want(&["10.0.0.1"])),
                    &mut draining,
                    &mut out,
                );
                assert!(out.is_empty());
                // Connections gone: deleted.
                have.dests
                    .get_mut(&(ip("10.0.0.2"), 8080))
                    .unwrap()
                    .active_conns = 0;
                service_ops(
                    &id(proto),
                    Some(&have),
                    Some(&want(&["10.0.0.1"])),
                    &mut draining,
                    &mut out,
                );
                assert_eq!(out, vec![Op::DeleteDest(id(proto), ip("10.0.0.2"), 8080)]);
                assert!(draining.is_empty());
            } else {
                assert_eq!(out, vec![Op::DeleteDest(id(proto), ip("10.0.0.2"), 8080)]);
                assert!(draining.is_empty());
            }
        }
    }

    #[test]
    fn a_drained_server_that_comes_back_gets_its_weight_again() {
        let mut draining = Draining::new();
        let mut have = have_of(&want(&["10.0.0.1", "10.0.0.2"]));
        have.dests.get_mut(&(ip("10.0.0.2"), 8080)).unwrap().weight = 0;
        draining.insert((id(Protocol::Tcp), ip("10.0.0.2"), 8080));
        let mut out = Vec::new();
        service_ops(
            &id(Protocol::Tcp),
            Some(&have),
            Some(&want(&["10.0.0.1", "10.0.0.2"])),
            &mut draining,
            &mut out,
        );
        assert_eq!(
            out,
            vec![Op::UpdateDest(id(Protocol::Tcp), ip("10.0.0.2"), 8080, 1)]
        );
        assert!(draining.is_empty());
    }

    #[test]
    fn new_and_removed_services_and_changed_settings() {
        let mut d = Draining::new();
        let mut out = Vec::new();
        service_ops(
            &id(Protocol::Tcp),
            None,
            Some(&want(&["10.0.0.1"])),
            &mut d,
            &mut out,
        );
        assert_eq!(out.len(), 2);
        assert!(matches!(out[0], Op::AddService(..)));
        out.clear();
        let mut sticky = want(&["10.0.0.1"]);
        sticky.spec.flags = super::super::genl::SVC_F_PERSISTENT;
        sticky.spec.timeout = 30;
        let have = have_of(&want(&["10.0.0.1"]));
        service_ops(
            &id(Protocol::Tcp),
            Some(&have),
            Some(&sticky),
            &mut d,
            &mut out,
        );
        assert_eq!(
            out,
            vec![Op::UpdateService(id(Protocol::Tcp), sticky.spec.clone())]
        );
        out.clear();
        service_ops(&id(Protocol::Tcp), Some(&have), None, &mut d, &mut out);
        assert_eq!(out, vec![Op::DeleteService(id(Protocol::Tcp))]);
    }
}
