//! The one place that builds the backend for a proxy mode from the configuration, for the
//! agent and for `switchyard sync`.

use crate::config::{ProxyConfig, ProxyMode};
use dataplane::backend::{Backend, BackendError};
use dataplane::iptables::kernel::IptablesCommand;
use dataplane::iptables::IptablesBackend;
use dataplane::ipvs::kernel::RealIpvs;
use dataplane::ipvs::{IpvsBackend, IpvsOptions};
use dataplane::nft::kernel::NftKernel;
use dataplane::nft::NftBackend;

/// The backend for `cfg.mode`; fails when the kernel lacks what the mode needs (IPVS).
pub fn for_mode(cfg: &ProxyConfig) -> Result<Box<dyn Backend>, BackendError> {
    Ok(match cfg.mode {
        ProxyMode::Iptables => Box::new(IptablesBackend::new(IptablesCommand::for_variant(
            cfg.iptables_backend,
        ))),
        ProxyMode::Ipvs => Box::new(ipvs_backend(cfg)?),
        ProxyMode::Nftables => {
            let mut backend = NftBackend::new(NftKernel::default());
            if let Some(limit) = read_limit() {
                backend = backend.with_read_limit(limit);
            }
            Box::new(backend)
        }
    })
}

/// Sets with more elements than this are looked up rather than read back
/// ([`dataplane::nft::READ_LIMIT`] unless set): for tests, which make small tables take
/// the path of 100k-service ones.
pub const READ_LIMIT_ENV: &str = "SWITCHYARD_NFT_READ_LIMIT";

fn read_limit() -> Option<usize> {
    let text = std::env::var(READ_LIMIT_ENV).ok()?;
    match text.parse() {
        Ok(limit) => Some(limit),
        Err(e) => {
            tracing::warn!("{READ_LIMIT_ENV}={text:?} is not a number of elements ({e}); ignored");
            None
        }
    }
}

/// IPVS mode's settings from the configuration.
pub fn ipvs_options(cfg: &ProxyConfig) -> IpvsOptions {
    let secs = |d: std::time::Duration| d.as_secs().min(u64::from(u32::MAX)) as u32;
    IpvsOptions {
        scheduler: cfg.ipvs.scheduler.clone(),
        strict_arp: cfg.ipvs.strict_arp,
        exclude_cidrs: cfg.ipvs.exclude_cidrs.clone(),
        timeouts: (
            secs(cfg.ipvs.tcp_timeout),
            secs(cfg.ipvs.tcp_fin_timeout),
            secs(cfg.ipvs.udp_timeout),
        ),
    }
}

/// The IPVS backend on this kernel; fails when the kernel has no IPVS.
fn ipvs_backend(cfg: &ProxyConfig) -> Result<IpvsBackend<RealIpvs, IptablesCommand>, BackendError> {
    let kernel = RealIpvs::open(Box::new(crate::ipvs_link::Rtnetlink))?;
    Ok(IpvsBackend::new(
        kernel,
        IptablesCommand::for_variant(cfg.iptables_backend),
        ipvs_options(cfg),
    ))
}
