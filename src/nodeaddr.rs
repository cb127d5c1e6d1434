//! The node's own addresses from its interfaces, over rtnetlink, for when no Node object
//! names them. Addresses of the default-route interface come first (the primary ones).

use crate::snapshot::NodeAddressSource;
use futures_util::stream::TryStreamExt;
use std::net::IpAddr;

/// Reads the current network namespace's interface addresses.
#[derive(Debug, Default, Clone, Copy)]
pub struct Interfaces;

impl NodeAddressSource for Interfaces {
    fn addresses(&self) -> Vec<IpAddr> {
        match read() {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!("cannot list interface addresses over rtnetlink: {e}");
                Vec::new()
            }
        }
    }
}

fn usable(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local() && !v4.is_unspecified(),
        IpAddr::V6(v6) => {
            !v6.is_loopback() && !v6.is_unspecified() && (v6.segments()[0] & 0xffc0) != 0xfe80
        }
    }
}

fn read() -> Result<Vec<IpAddr>, String> {
    crate::rtnl::with_rtnetlink(|handle| async move {
        let mut default_links = Vec::new();
        for version in [rtnetlink::IpVersion::V4, rtnetlink::IpVersion::V6] {
            let req = rtnetlink::RouteMessageBuilder::<IpAddr>::new();
            let msg = match version {
                rtnetlink::IpVersion::V4 => req.table_id(254).build(),
                rtnetlink::IpVersion::V6 => {
                    rtnetlink::RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                        .table_id(254)
                        .build()
                }
            };
            let mut routes = handle.route().get(msg).execute();
            while let Some(r) = routes.try_next().await.map_err(|e| e.to_string())? {
                if r.header.destination_prefix_length == 0 {
                    for attr in &r.attributes {
                        if let netlink_packet_route::route::RouteAttribute::Oif(i) = attr {
                            default_links.push(*i);
                        }
                    }
                }
            }
        }
        let mut addrs = Vec::new();
        let mut stream = handle.address().get().execute();
        while let Some(msg) = stream.try_next().await.map_err(|e| e.to_string())? {
            for attr in &msg.attributes {
                if let netlink_packet_route::address::AddressAttribute::Address(ip) = attr {
                    if usable(ip) {
                        let primary = default_links.contains(&msg.header.index);
                        addrs.push((!primary, msg.header.index, *ip));
                    }
                }
            }
        }
        addrs.sort();
        let mut out: Vec<IpAddr> = Vec::new();
        for (_, _, ip) in addrs {
            if !out.contains(&ip) {
                out.push(ip);
            }
        }
        Ok(out)
    })
}
