//! The `kube-ipvs0` dummy link over rtnetlink, for IPVS mode: the addresses bound to it,
//! the node's other addresses (node-port candidates), and adding and removing them.
//! Depends only on `crate::rtnl`, so the benches can include it.
//! kube-proxy leaves the link down; its addresses are local all the same.

use crate::rtnl::with_rtnetlink;
use dataplane::ipvs::kernel::{DummyLink, LinkAddresses, DUMMY};
use futures_util::stream::TryStreamExt;
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage, CacheInfo};
use std::net::IpAddr;

/// The real kube-ipvs0, in the current network namespace.
#[derive(Debug, Default, Clone, Copy)]
pub struct Rtnetlink;

/// kube-ipvs0's index, creating the link when it is missing.
async fn ensure(handle: &rtnetlink::Handle) -> Result<u32, String> {
    if let Some(i) = index(handle).await? {
        return Ok(i);
    }
    handle
        .link()
        .add(rtnetlink::LinkDummy::new(DUMMY).build())
        .execute()
        .await
        .map_err(|e| format!("creating the dummy link: {e} (is the dummy module there?)"))?;
    index(handle)
        .await?
        .ok_or_else(|| "created, then not found".to_string())
}

async fn index(handle: &rtnetlink::Handle) -> Result<Option<u32>, String> {
    let mut links = handle.link().get().match_name(DUMMY.to_string()).execute();
    match links.try_next().await {
        Ok(Some(link)) => Ok(Some(link.header.index)),
        Ok(None) => Ok(None),
        // The kernel answers a name it does not know with ENODEV.
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -19 => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

fn address_of(msg: &AddressMessage) -> Option<IpAddr> {
    msg.attributes.iter().find_map(|a| match a {
        AddressAttribute::Address(ip) => Some(*ip),
        _ => None,
    })
}

async fn messages(handle: &rtnetlink::Handle) -> Result<Vec<AddressMessage>, String> {
    handle
        .address()
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(|e| e.to_string())
}

impl DummyLink for Rtnetlink {
    fn addresses(&mut self) -> Result<LinkAddresses, String> {
        with_rtnetlink(|handle| async move {
            // Not created here: cleanup reads addresses too. `add` creates it.
            let dummy = index(&handle).await?;
            let mut out = LinkAddresses::default();
            for msg in messages(&handle).await? {
                let Some(ip) = address_of(&msg) else { continue };
                if Some(msg.header.index) == dummy {
                    out.bound.insert(ip);
                } else if !out.local.contains(&ip) {
                    out.local.push(ip);
                }
            }
            Ok(out)
        })
    }

    fn add(&mut self, ips: &[IpAddr]) -> Result<(), String> {
        with_rtnetlink(|handle| async move {
            let dummy = ensure(&handle).await?;
            for ip in ips {
                add_one(&handle, dummy, *ip).await?;
            }
            Ok(())
        })
    }

    fn delete(&mut self, ips: &[IpAddr]) -> Result<(), String> {
        with_rtnetlink(|handle| async move {
            let Some(dummy) = index(&handle).await? else {
                return Ok(());
            };
            for msg in messages(&handle).await? {
                let on_dummy = msg.header.index == dummy;
                let Some(ip) = address_of(&msg).filter(|ip| on_dummy && ips.contains(ip)) else {
                    continue;
                };
                handle
                    .address()
                    .del(msg)
                    .execute()
                    .await
                    .map_err(|e| format!("removing {ip}: {e}"))?;
            }
            Ok(())
        })
    }

    fn remove(&mut self) -> Result<bool, String> {
        crate::rtnl::delete_link(DUMMY)
    }
}

async fn add_one(handle: &rtnetlink::Handle, dummy: u32, ip: IpAddr) -> Result<(), String> {
    let prefix = if ip.is_ipv4() { 32 } else { 128 };
    let mut req = handle.address().add(dummy, ip, prefix);
    if ip.is_ipv6() {
        // Deprecated (preferred lifetime 0) and without duplicate detection: still local,
        // but never chosen as a source address. Otherwise IPv6 source selection (longest
        // matching prefix) can pick a service address for masqueraded traffic, whose
        // replies then never come back.
        let msg = req.message_mut();
        let mut lifetimes = CacheInfo::default();
        lifetimes.ifa_preferred = 0;
        lifetimes.ifa_valid = u32::MAX;
        msg.attributes.push(AddressAttribute::CacheInfo(lifetimes));
        msg.attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
    }
    match req.execute().await {
        Ok(()) => Ok(()),
        // Already there (EEXIST): what we wanted.
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -17 => Ok(()),
        Err(e) => Err(format!("adding {ip}: {e}")),
    }
}
