//! What other proxies and other modes leave in the kernel, and removing it: kube-proxy's
//! `kube-proxy` nftables tables, the KUBE- iptables chains (kube-proxy's, or ours from
//! iptables mode; the same names), IPVS virtual services with kube-ipvs0 and its ipsets,
//! and our own `switchyard` nftables tables. Each part is best effort: one failing does not
//! stop the others, and each failure is returned named.

use crate::config::ProxyMode;
use dataplane::backend::Backend;
use dataplane::iptables::kernel::{IptablesCommand, Variant};
use dataplane::iptables::IptablesBackend;
use dataplane::ipvs::genl::GenlError;
use dataplane::ipvs::kernel::{IpvsError, RealIpvs, DUMMY};
use dataplane::model::IpFamily;
use dataplane::nft::kernel::NftKernel;
use dataplane::nft::NftBackend;

/// What was removed (lines for the operator) and what failed.
#[derive(Debug, Default)]
pub struct Removed {
    pub done: Vec<String>,
    pub failed: Vec<String>,
}

impl Removed {
    fn merge(&mut self, other: Removed) {
        self.done.extend(other.done);
        self.failed.extend(other.failed);
    }
}

/// kube-proxy's nftables mode: its `kube-proxy` tables.
pub fn kube_proxy_nftables() -> Removed {
    let mut r = Removed::default();
    let mut nft = NftKernel::default();
    for family in IpFamily::ALL {
        match nft.delete_foreign_table(family, "kube-proxy") {
            Ok(true) => r
                .done
                .push(format!("removed kube-proxy's nftables table ({family})")),
            Ok(false) => {}
            Err(e) if e.no_nftables() => {
                r.done.push(format!(
                    "this kernel has no nf_tables ({e}); kube-proxy's nftables tables not looked for"
                ));
                break;
            }
            Err(e) => r.failed.push(format!("nftables ({family}): {e}")),
        }
    }
    r
}

/// Switchyard's own nftables tables (nftables mode's).
pub fn switchyard_nftables() -> Removed {
    let mut r = Removed::default();
    match NftBackend::new(NftKernel::default()).cleanup() {
        Ok(0) => {}
        Ok(n) => r
            .done
            .push(format!("removed {n} switchyard nftables tables")),
        Err(e) => r.failed.push(format!("switchyard nftables tables: {e}")),
    }
    r
}

/// The KUBE- iptables chains and the jumps to them, on iptables-nft and (when the kernel
/// has legacy tables; looking would create them) iptables-legacy.
pub fn kube_iptables() -> Removed {
    let mut r = Removed::default();
    let legacy_tables =
        std::fs::read_to_string("/proc/net/ip_tables_names").is_ok_and(|t| !t.trim().is_empty());
    for variant in [Variant::Nft, Variant::Legacy] {
        if variant == Variant::Legacy && !legacy_tables {
            continue;
        }
        let mut backend = IptablesBackend::new(IptablesCommand::for_variant(Some(variant)));
        match backend.cleanup_kube_proxy() {
            Ok(0) => {}
            Ok(removed) => r.done.push(format!(
                "removed {removed} KUBE- iptables chains ({})",
                variant.as_str()
            )),
            Err(e) if e.program().is_some() => r.done.push(format!(
                "{} is not installed; nothing to remove there",
                e.program().unwrap_or("iptables")
            )),
            Err(e) => r.failed.push(format!("iptables-{}: {e}", variant.as_str())),
        }
    }
    r
}

/// IPVS mode's kernel objects: virtual services on kube-ipvs0's addresses (and node ports
/// on the node's), kube-ipvs0 itself, then kube-proxy's ipsets.
pub fn ipvs() -> Removed {
    let mut r = Removed::default();
    let delete_link = |r: &mut Removed| match crate::rtnl::delete_link(DUMMY) {
        Ok(true) => r.done.push(format!("removed the {DUMMY} interface")),
        Ok(false) => {}
        Err(e) => r.failed.push(e),
    };
    match RealIpvs::open(Box::new(crate::ipvs_link::Rtnetlink)) {
        // No IPVS in this kernel: nobody can have left IPVS services or ipsets.
        Err(IpvsError::Netlink(GenlError::NoIpvs)) => delete_link(&mut r),
        Err(e) => {
            r.failed.push(format!("IPVS: {e}"));
            delete_link(&mut r);
        }
        Ok(mut ipvs) => {
            match dataplane::ipvs::remove_ipvs(&mut ipvs, None, &[]) {
                Ok((services, link)) => {
                    if services > 0 {
                        r.done
                            .push(format!("removed {services} IPVS virtual services"));
                    }
                    if link {
                        r.done.push(format!("removed the {DUMMY} interface"));
                    }
                }
                Err(e) => r.failed.push(format!("IPVS: {e}")),
            }
            match dataplane::ipvs::destroy_sets(&mut ipvs) {
                Ok(0) => {}
                Ok(n) => r.done.push(format!("removed {n} KUBE- ipsets")),
                Err(e) => r.failed.push(format!("ipset: {e}")),
            }
        }
    }
    r
}

/// Everything any proxy mode (kube-proxy's or ours) leaves: `kube-proxy --cleanup`.
pub fn everything() -> Removed {
    let mut r = switchyard_nftables();
    r.merge(kube_proxy_nftables());
    // IPVS before the chains: its services are found by kube-ipvs0's addresses.
    r.merge(ipvs());
    r.merge(kube_iptables());
    r
}

/// What modes other than `mode` left, removed once `mode` has programmed the kernel, so a
/// node switched from kube-proxy (or from another of our modes) ends with one proxy's rules
/// and nothing stops serving in between. kube-proxy does this before its first sync
/// (cmd/kube-proxy/app/server_linux.go platformCleanup), leaving a gap; after is safe.
pub fn other_modes(mode: ProxyMode) -> Removed {
    let mut r = kube_proxy_nftables();
    match mode {
        ProxyMode::Nftables => {
            r.merge(ipvs());
            r.merge(kube_iptables());
        }
        // The iptables chains are this mode's own now; IPVS's kernel objects are not.
        ProxyMode::Iptables => {
            r.merge(switchyard_nftables());
            r.merge(ipvs());
        }
        ProxyMode::Ipvs => r.merge(switchyard_nftables()),
    }
    r
}
