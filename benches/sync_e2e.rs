//! End-to-end sync benchmark on a real kernel, in a network namespace of its own:
//! (a) cold full sync of 10k services x 10 endpoints from manifests to committed kernel state
//!     (`switchyard sync --once`, wall time and peak RSS);
//! (b) one-endpoint changes at 10k x 10 and 30k x 10: p50/p99 over 100 changes of the kernel
//!     transaction (one nf_tables netlink batch), and of the whole sync (layout + diff +
//!     transaction).
//!
//! Run: `cargo bench --bench sync_e2e` as root. Set SY_BENCH_SIZES=1000,3000 for a quick run.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use dataplane::backend::{Backend, Scope};
use dataplane::model::IpFamily;
use dataplane::nft::diff::Transaction;
use dataplane::nft::getelem::Found;
use dataplane::nft::kernel::{NftError, NftExecutor, NftKernel};
use dataplane::nft::tables::Ruleset;
use dataplane::nft::NftBackend;
use dataplane::synth;
use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{ms, pct};

/// Times each kernel transaction.
struct Timed {
    inner: NftKernel,
    applies: Vec<Duration>,
}

impl NftExecutor for Timed {
    fn read(&mut self) -> Result<Ruleset, NftError> {
        self.inner.read()
    }
    fn apply(&mut self, tx: &Transaction) -> Result<(), NftError> {
        let t = Instant::now();
        let r = self.inner.apply(tx);
        self.applies.push(t.elapsed());
        r
    }
    fn look_up(&mut self, family: IpFamily, set: &str, keys: &[&str]) -> Result<Found, NftError> {
        self.inner.look_up(family, set, keys)
    }
}

fn cold_from_manifests(services: usize, out: &mut String) {
    let c = common::cold_sync_from_manifests(
        services,
        "kind: KubeProxyConfiguration\nhostnameOverride: bench-node\nclusterCIDR: 10.0.0.0/8\n",
        &[],
    );
    let _ = writeln!(
        out,
        "(a) cold sync from manifests, {services} x 10: {} wall; peak RSS of the largest child (counting the pages it shared with this bench when forked) {:.1} MiB; agent said: {}",
        ms(c.wall),
        c.max_rss_mib,
        c.said
    );
    let _ = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("cleanup")
        .output();
}

fn one_change(services: usize, changes: usize, out: &mut String) {
    let mut snap = synth::cluster(services, 10);
    let mut be = NftBackend::new(Timed {
        inner: NftKernel::default(),
        applies: Vec::new(),
    });
    let t = Instant::now();
    be.sync(&snap, Scope::AllServices).expect("cold sync");
    let cold = t.elapsed();
    let mut totals = common::endpoint_changes(&mut snap, services, changes, |snap, changed| {
        let r = be
            .sync(snap, Scope::Services(changed))
            .expect("incremental sync");
        assert!(r.stats.elements_added >= 1, "{}", r.summary());
    });
    let mut applies: Vec<Duration> = be.executor().applies[1..].to_vec();
    let _ = writeln!(
        out,
        "(b) {services} x 10: cold in-process sync {}; one-endpoint change over {changes}: kernel transaction p50 {} p99 {}; whole sync p50 {} p99 {}",
        ms(cold),
        ms(pct(&mut applies, 0.5)),
        ms(pct(&mut applies, 0.99)),
        ms(pct(&mut totals, 0.5)),
        ms(pct(&mut totals, 0.99)),
    );
    let _ = Command::new("nft")
        .args(["delete", "table", "ip", "switchyard"])
        .status();
    let _ = Command::new("nft")
        .args(["delete", "table", "ip6", "switchyard"])
        .status();
}

fn main() {
    // `cargo bench` passes --bench; anything else (e.g. `cargo test --benches`) only checks it builds.
    if !std::env::args().any(|a| a == "--bench") {
        println!("sync_e2e: run with `cargo bench --bench sync_e2e`");
        return;
    }
    let Some(ns) = common::enter_netns("sync_e2e") else {
        return;
    };
    let sizes = common::sizes();
    let mut out = String::new();
    cold_from_manifests(sizes[0], &mut out);
    for &n in &sizes {
        one_change(n, 100, &mut out);
    }
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    print!("{out}");
}
