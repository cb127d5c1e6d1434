//! UDP conntrack cleanup. UDP has no connection end, so a conntrack entry keeps sending a
//! client's datagrams where the entry points: to an endpoint that is gone, or (when the
//! service had no endpoints, or no rules yet) past the service altogether. After a sync,
//! the entries whose original destination is a UDP front end and whose NAT no longer
//! matches that front end's endpoints are deleted, as kube-proxy does.
//!
//! Which entries are stale is pure ([`UdpFrontends`], [`UdpFrontends::stale`]); the kernel
//! is reached over ctnetlink behind [`Conntrack`] ([`Ctnetlink`] is the real one). The
//! `rtnetlink` crate has no conntrack messages and shelling out to `conntrack` costs a
//! process per entry, so the few messages needed are written here, on [`crate::netlink`]'s
//! socket.

use crate::model::{IpFamily, Protocol, Snapshot};
use crate::netlink::{
    be16, find, ip, nfproto, Attrs, NetlinkError, Request, Socket, NETLINK_NETFILTER,
    NFNL_SUBSYS_CTNETLINK, NLM_F_ACK, NLM_F_DUMP,
};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

/// One UDP conntrack entry: where the client sent, and where replies come from (the
/// endpoint, when the flow was DNATed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Flow {
    pub source: SocketAddr,
    pub destination: SocketAddr,
    pub reply_source: SocketAddr,
    pub zone: u16,
}

impl Flow {
    fn dnat(&self) -> bool {
        self.reply_source != self.destination
    }
}

/// Where UDP service traffic may still go: per front end (cluster, external and
/// load-balancer IPs with the port), and per node port, the addresses of the service's
/// serving endpoints. As kube-proxy, regardless of traffic policy, topology or terminating
/// state, so that a flow to an endpoint that still serves is never cut.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UdpFrontends {
    pub addresses: BTreeMap<SocketAddr, BTreeSet<IpAddr>>,
    pub node_ports: BTreeMap<(IpFamily, u16), BTreeSet<IpAddr>>,
    /// Node addresses: the destinations that can carry node-port traffic.
    pub node_ips: BTreeSet<IpAddr>,
}

impl UdpFrontends {
    pub fn of(snapshot: &Snapshot) -> UdpFrontends {
        let mut out = UdpFrontends {
            node_ips: snapshot.node.node_ips.iter().copied().collect(),
            ..UdpFrontends::default()
        };
        for ((name, family), svc) in &snapshot.services {
            if name.protocol != Protocol::Udp {
                continue;
            }
            let reachable: BTreeSet<IpAddr> = snapshot
                .endpoints_of(name)
                .iter()
                .filter(|e| e.serving && IpFamily::of(&e.ip) == *family)
                .map(|e| e.ip)
                .collect();
            let ips = std::iter::once(svc.cluster_ip)
                .chain(svc.external_ips.iter().copied())
                .chain(svc.load_balancer_ips.iter().copied())
                .filter(|ip| IpFamily::of(ip) == *family);
            for ip in ips {
                out.addresses
                    .entry(SocketAddr::new(ip, svc.port))
                    .or_default()
                    .extend(reachable.iter().copied());
            }
            if svc.node_port != 0 {
                out.node_ports
                    .entry((*family, svc.node_port))
                    .or_default()
                    .extend(reachable.iter().copied());
            }
        }
        out
    }

    /// The endpoints a flow to `dst` may reach now; `None` when `dst` is no front end. A
    /// DNATed flow to a node port counts whatever local address it was sent to (iptables
    /// mode serves node ports on every one); one not DNATed only on a node address.
    fn endpoints_for(&self, dst: SocketAddr, dnat: bool) -> Option<&BTreeSet<IpAddr>> {
        if let Some(e) = self.addresses.get(&dst) {
            return Some(e);
        }
        if dnat || self.node_ips.contains(&dst.ip()) {
            return self.node_ports.get(&(IpFamily::of(&dst.ip()), dst.port()));
        }
        None
    }

    /// Whether a flow is one this cleanup looks at (see [`Self::stale`]).
    pub fn concerns(&self, previous: &UdpFrontends, f: &Flow) -> bool {
        self.endpoints_for(f.destination, f.dnat()).is_some()
            || previous.endpoints_for(f.destination, f.dnat()).is_some()
    }

    /// The flows to delete: DNATed to an endpoint the front end no longer has, or not
    /// DNATed to a front end that has endpoints now. `previous` are the front ends of the
    /// last cleanup: a flow DNATed through a front end that is gone since is stale too.
    pub fn stale<'f>(&self, previous: &UdpFrontends, flows: &'f [Flow]) -> Vec<&'f Flow> {
        flows
            .iter()
            .filter(|f| match self.endpoints_for(f.destination, f.dnat()) {
                Some(eps) if f.dnat() => !eps.contains(&f.reply_source.ip()),
                Some(eps) => !eps.is_empty(),
                None => f.dnat() && previous.endpoints_for(f.destination, true).is_some(),
            })
            .collect()
    }
}

/// The kernel's conntrack table, UDP entries only.
pub trait Conntrack {
    /// The UDP entries of `family` that `keep` selects (the others are dropped while the
    /// dump streams in).
    fn udp_flows(
        &mut self,
        family: IpFamily,
        keep: &dyn Fn(&Flow) -> bool,
    ) -> Result<Vec<Flow>, NetlinkError>;
    /// Delete one entry; one already gone is no error.
    fn delete(&mut self, flow: &Flow) -> Result<(), NetlinkError>;
}

/// Delete the stale UDP flows of every family; returns how many went.
pub fn clean(
    ct: &mut dyn Conntrack,
    now: &UdpFrontends,
    previous: &UdpFrontends,
) -> Result<usize, NetlinkError> {
    IpFamily::ALL.into_iter().try_fold(0, |n, family| {
        Ok(n + clean_family(ct, family, now, previous)?)
    })
}

/// Delete the stale UDP flows of one family; returns how many went. kube-proxy reconciles
/// (and reports) conntrack per family, so the agent calls this once for each.
pub fn clean_family(
    ct: &mut dyn Conntrack,
    family: IpFamily,
    now: &UdpFrontends,
    previous: &UdpFrontends,
) -> Result<usize, NetlinkError> {
    let flows = ct.udp_flows(family, &|f| now.concerns(previous, f))?;
    let stale = now.stale(previous, &flows);
    for f in &stale {
        ct.delete(f)?;
    }
    Ok(stale.len())
}

// linux/netfilter/nfnetlink_conntrack.h
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const IPPROTO_UDP: u8 = 17;
const ENOENT: i32 = 2;

/// (protocol, source, destination) of a CTA_TUPLE_* attribute.
fn tuple(data: &[u8]) -> Option<(u8, SocketAddr, SocketAddr)> {
    let addrs = find(data, CTA_TUPLE_IP)?;
    let proto = find(data, CTA_TUPLE_PROTO)?;
    let (src, dst) = match (find(addrs, CTA_IP_V4_SRC), find(addrs, CTA_IP_V4_DST)) {
        (Some(s), Some(d)) => (ip(s)?, ip(d)?),
        _ => (
            ip(find(addrs, CTA_IP_V6_SRC)?)?,
            ip(find(addrs, CTA_IP_V6_DST)?)?,
        ),
    };
    let num = *find(proto, CTA_PROTO_NUM)?.first()?;
    let sport = find(proto, CTA_PROTO_SRC_PORT).and_then(be16).unwrap_or(0);
    let dport = find(proto, CTA_PROTO_DST_PORT).and_then(be16).unwrap_or(0);
    Some((
        num,
        SocketAddr::new(src, sport),
        SocketAddr::new(dst, dport),
    ))
}

/// A UDP flow from one entry of a conntrack dump; `None` for other protocols.
fn parse_flow(body: &[u8]) -> Option<Flow> {
    let (proto, source, destination) = tuple(find(body, CTA_TUPLE_ORIG)?)?;
    if proto != IPPROTO_UDP {
        return None;
    }
    let (_, reply_source, _) = tuple(find(body, CTA_TUPLE_REPLY)?)?;
    let zone = find(body, CTA_ZONE).and_then(be16).unwrap_or(0);
    Some(Flow {
        source,
        destination,
        reply_source,
        zone,
    })
}

/// The CTA_TUPLE_ORIG that names a flow for deletion.
fn delete_attrs(f: &Flow) -> Vec<u8> {
    let mut out = Vec::new();
    let mut a = Attrs(&mut out);
    a.nest(CTA_TUPLE_ORIG, |tuple| {
        tuple.nest(CTA_TUPLE_IP, |ip| {
            match (f.source.ip(), f.destination.ip()) {
                (IpAddr::V4(s), IpAddr::V4(d)) => {
                    ip.put(CTA_IP_V4_SRC, &s.octets());
                    ip.put(CTA_IP_V4_DST, &d.octets());
                }
                (s, d) => {
                    let v6 = |a: IpAddr| match a {
                        IpAddr::V6(a) => a.octets(),
                        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
                    };
                    ip.put(CTA_IP_V6_SRC, &v6(s));
                    ip.put(CTA_IP_V6_DST, &v6(d));
                }
            }
        });
        tuple.nest(CTA_TUPLE_PROTO, |proto| {
            proto.put(CTA_PROTO_NUM, &[IPPROTO_UDP]);
            proto.put(CTA_PROTO_SRC_PORT, &f.source.port().to_be_bytes());
            proto.put(CTA_PROTO_DST_PORT, &f.destination.port().to_be_bytes());
        });
    });
    if f.zone != 0 {
        a.put(CTA_ZONE, &f.zone.to_be_bytes());
    }
    out
}

/// Conntrack over ctnetlink, in the calling thread's network namespace.
pub struct Ctnetlink {
    socket: Socket,
}

impl Ctnetlink {
    pub fn open() -> Result<Ctnetlink, NetlinkError> {
        Ok(Ctnetlink {
            // Its own name: errors say which netlink conversation failed, and
            // SWITCHYARD_FAULTS can aim at it apart from the nf_tables commits.
            socket: Socket::open(NETLINK_NETFILTER, "ctnetlink")?,
        })
    }
}

impl Conntrack for Ctnetlink {
    fn udp_flows(
        &mut self,
        family: IpFamily,
        keep: &dyn Fn(&Flow) -> bool,
    ) -> Result<Vec<Flow>, NetlinkError> {
        let mut flows = Vec::new();
        let dump = Request::nfnl(
            NFNL_SUBSYS_CTNETLINK,
            IPCTNL_MSG_CT_GET,
            NLM_F_DUMP,
            nfproto(family),
            &[],
        );
        self.socket
            .request_each("conntrack dump", &dump, &mut |body| {
                if let Some(f) = parse_flow(body).filter(|f| keep(f)) {
                    flows.push(f);
                }
            })?;
        Ok(flows)
    }

    fn delete(&mut self, flow: &Flow) -> Result<(), NetlinkError> {
        let family = IpFamily::of(&flow.destination.ip());
        let attrs = delete_attrs(flow);
        let delete = Request::nfnl(
            NFNL_SUBSYS_CTNETLINK,
            IPCTNL_MSG_CT_DELETE,
            NLM_F_ACK,
            nfproto(family),
            &attrs,
        );
        match self.socket.request("conntrack delete", &delete) {
            Err(NetlinkError::Kernel { errno: ENOENT, .. }) | Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::*;
    use crate::netlink::NLA_F_NESTED;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn flow(src: &str, dst: &str, reply: &str) -> Flow {
        Flow {
            source: sa(src),
            destination: sa(dst),
            reply_source: sa(reply),
            zone: 0,
        }
    }

    fn snapshot(endpoints: &[&str]) -> Snapshot {
        let mut s = Snapshot::default();
        s.node.node_ips = vec!["192.168.0.2".parse().unwrap()];
        let name = ServicePortName::new("ns", "dns", "dns", Protocol::Udp);
        let mut svc = ServicePort::cluster(name.clone(), "172.30.0.10".parse().unwrap(), 53);
        svc.node_port = 30053;
        svc.load_balancer_ips = vec!["1.2.3.4".parse().unwrap()];
        s.services.insert((name.clone(), IpFamily::V4), svc);
        s.endpoints.insert(
            name,
            endpoints
                .iter()
                .map(|e| Endpoint::ready(e.parse().unwrap(), 5353))
                .collect(),
        );
        let tcp = ServicePortName::new("ns", "web", "", Protocol::Tcp);
        s.services.insert(
            (tcp.clone(), IpFamily::V4),
            ServicePort::cluster(tcp, "172.30.0.11".parse().unwrap(), 53),
        );
        s
    }

    #[test]
    fn flows_to_gone_endpoints_and_past_revived_services_are_stale() {
        let now = UdpFrontends::of(&snapshot(&["10.0.0.1"]));
        let flows = vec![
            // DNATed to the endpoint still there: kept.
            flow("10.1.0.1:4000", "172.30.0.10:53", "10.0.0.1:5353"),
            // DNATed to an endpoint that went: deleted, through any front end.
            flow("10.1.0.1:4001", "172.30.0.10:53", "10.0.0.9:5353"),
            flow("10.1.0.1:4002", "1.2.3.4:53", "10.0.0.9:5353"),
            flow("10.1.0.1:4003", "192.168.0.2:30053", "10.0.0.9:5353"),
            // Not DNATed while the service had no endpoints: deleted now it has one.
            flow("10.1.0.1:4004", "172.30.0.10:53", "172.30.0.10:53"),
            // Not a UDP front end (a TCP service's address, another node port): kept.
            flow("10.1.0.1:4005", "172.30.0.11:53", "10.0.0.9:53"),
            flow("10.1.0.1:4006", "192.168.0.2:30054", "10.0.0.9:53"),
            flow("10.1.0.1:4007", "8.8.8.8:53", "8.8.8.8:53"),
        ];
        let stale: Vec<u16> = now
            .stale(&UdpFrontends::default(), &flows)
            .iter()
            .map(|f| f.source.port())
            .collect();
        assert_eq!(stale, [4001, 4002, 4003, 4004]);

        // No endpoints at all: flows not DNATed are left (nothing better to send them to).
        let empty = UdpFrontends::of(&snapshot(&[]));
        let f = [flow("10.1.0.1:4004", "172.30.0.10:53", "172.30.0.10:53")];
        assert!(empty.stale(&UdpFrontends::default(), &f).is_empty());

        // The service is deleted: its DNATed flows go, once it is known it was one.
        let gone = UdpFrontends::default();
        let f = [flow("10.1.0.1:4000", "172.30.0.10:53", "10.0.0.1:5353")];
        assert_eq!(gone.stale(&now, &f).len(), 1);
        assert!(gone.stale(&UdpFrontends::default(), &f).is_empty());
    }

    #[test]
    fn dump_entries_parse_and_deletes_name_the_original_tuple() {
        let f = flow("10.1.0.1:4000", "172.30.0.10:53", "10.0.0.1:5353");
        // A dump entry: the original tuple as a delete names it, plus a reply tuple.
        let mut body = delete_attrs(&f);
        let reply = Flow {
            source: f.reply_source,
            destination: f.source,
            reply_source: f.source,
            zone: 0,
        };
        let orig_of_reply = delete_attrs(&reply);
        // Re-tag the reply's CTA_TUPLE_ORIG as CTA_TUPLE_REPLY.
        let mut tagged = orig_of_reply.clone();
        tagged[2..4].copy_from_slice(&(CTA_TUPLE_REPLY | NLA_F_NESTED).to_ne_bytes());
        body.extend_from_slice(&tagged);
        assert_eq!(parse_flow(&body), Some(f));
    }

    /// A conntrack dump entry is untrusted bytes: decoding never panics, whatever it holds.
    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]
            #[test]
            fn any_entry_decodes_or_is_skipped_without_panicking(
                noise in proptest::collection::vec(any::<u8>(), 0..512),
                edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8),
                cut in any::<usize>(),
            ) {
                let _ = parse_flow(&noise);
                let f = flow("10.0.0.2:40000", "10.96.0.10:53", "10.244.0.5:53");
                let mut entry = delete_attrs(&f);
                let n = entry.len();
                for (at, b) in edits {
                    entry[at % n] = b;
                }
                entry.truncate(cut % (n + 1));
                let _ = parse_flow(&entry);
            }
        }
    }
}
