//! Property tests on the real kernel. Random clusters with hostile but valid values (every
//! protocol, ports at both ends of their range, both families and dual stack, the longest
//! names the API allows, /0 and host source ranges, affinity timeouts at their bounds, every
//! traffic policy, endpoints in every condition, front ends contested by two services) are
//! programmed by the nftables and iptables backends into namespaces of their own, then
//! edited service by service in a random walk, each edit a partial sync:
//! - the kernel accepts every sync;
//! - nftables: after the walk the kernel holds exactly what a whole sync against it would
//!   write (nothing left to add or delete);
//! - iptables: after the walk the rules equal those of one sync from scratch of the final
//!   cluster into an empty namespace.
//!
//! IPVS mode's kernel is the QEMU guest's: `tests/ipvs.rs` walks the same clusters there.
//! Cases: SWITCHYARD_PROPERTY_CASES clusters (default 6) of SWITCHYARD_PROPERTY_EDITS edits
//! (default 25); SWITCHYARD_PROPERTY_SEED moves the walk. A failure names its seed.
//! Needs root; prints SKIP otherwise (fails if SWITCHYARD_REQUIRE_NETNS=1).

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod rig;

use dataplane::backend::{Backend, Scope};
use dataplane::iptables::kernel::{IptablesCommand, Variant};
use dataplane::iptables::IptablesBackend;
use dataplane::nft::diff::diff;
use dataplane::nft::kernel::{read_kernel, NftKernel};
use dataplane::nft::{plan, NftBackend};
use rig::netns;
use rig::random::{env_or, seeds, walk};

/// A namespace of the test's own, deleted on drop even when the test fails.
struct Namespace(String);

impl Drop for Namespace {
    fn drop(&mut self) {
        netns::delete_namespace(&self.0);
    }
}

fn namespace(tag: &str) -> Option<Namespace> {
    netns::create_or_skip(tag).map(Namespace)
}

#[test]
fn nftables_random_walks_leave_the_kernel_as_a_whole_sync_would() {
    let edits = env_or("SWITCHYARD_PROPERTY_EDITS", 25) as usize;
    for seed in seeds() {
        let Some(ns) = namespace("prop-nft") else {
            return;
        };
        let (first, steps) = walk(seed, edits);
        let left = netns::in_netns(&ns.0, || {
            let mut be = NftBackend::new(NftKernel::default());
            be.sync(&first, Scope::AllServices)
                .map_err(|e| std::io::Error::other(format!("first sync: {e}")))?;
            for (k, (snap, changed)) in steps.iter().enumerate() {
                be.sync(snap, Scope::Services(changed))
                    .map_err(|e| std::io::Error::other(format!("edit {k} ({changed:?}): {e}")))?;
            }
            let last = steps.last().map_or(&first, |s| &s.0);
            let (kernel, _) = read_kernel().map_err(std::io::Error::other)?;
            let (want, _) = plan::desired(last, &kernel);
            Ok(diff(&kernel, &want, false).to_nft())
        });
        let left = left.unwrap_or_else(|e| panic!("seed {seed:#x}: the kernel refused: {e}"));
        assert!(
            left.trim().is_empty(),
            "seed {seed:#x}: after the walk, a whole sync would still do:\n{left}"
        );
    }
}

#[test]
fn iptables_random_walks_equal_a_sync_from_scratch() {
    let edits = env_or("SWITCHYARD_PROPERTY_EDITS", 25) as usize;
    for seed in seeds() {
        let (Some(walked), Some(scratch)) = (namespace("prop-ipt"), namespace("prop-ipt0")) else {
            return;
        };
        let (first, steps) = walk(seed, edits);
        let last = steps.last().map_or(&first, |s| &s.0).clone();
        netns::in_netns(&walked.0, || {
            let mut be = IptablesBackend::new(IptablesCommand::new(Variant::Nft));
            be.sync(&first, Scope::AllServices)
                .map_err(|e| std::io::Error::other(format!("first sync: {e}")))?;
            for (k, (snap, changed)) in steps.iter().enumerate() {
                be.sync(snap, Scope::Services(changed))
                    .map_err(|e| std::io::Error::other(format!("edit {k} ({changed:?}): {e}")))?;
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("seed {seed:#x}: the kernel refused: {e}"));
        netns::in_netns(&scratch.0, || {
            IptablesBackend::new(IptablesCommand::new(Variant::Nft))
                .sync(&last, Scope::AllServices)
                .map(drop)
                .map_err(|e| std::io::Error::other(format!("sync from scratch: {e}")))
        })
        .unwrap_or_else(|e| panic!("seed {seed:#x}: the kernel refused: {e}"));
        let (after_walk, from_scratch) = (
            netns::saved_rules(&walked.0, netns::NFT_SAVE),
            netns::saved_rules(&scratch.0, netns::NFT_SAVE),
        );
        for key in after_walk.keys().chain(from_scratch.keys()) {
            assert_eq!(
                after_walk.get(key),
                from_scratch.get(key),
                "seed {seed:#x}: {key:?} differs between the walk and a sync from scratch"
            );
        }
        assert!(after_walk.len() > 4, "seed {seed:#x}: {after_walk:?}");
    }
}
