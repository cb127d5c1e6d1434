//! iptables-mode sync benchmark on a real kernel, in a network namespace of its own, beside
//! the nftables one (`sync_e2e`):
//! (a) cold full sync of 10k services x 10 endpoints from manifests
//!     (`switchyard sync --once --proxy-mode iptables`, wall time and peak RSS);
//! (b) in process at 10k x 10 and 30k x 10: the cold sync, a full resync of the loaded
//!     state (iptables-save + full restore, as every syncPeriod), and one-endpoint changes
//!     (partial restores): p50/p99 over 100 of the iptables-restore call and of the whole sync.
//!
//! Run: `cargo bench --bench iptables_e2e` as root. SY_BENCH_SIZES=1000,3000 for a quick
//! run; SY_BENCH_IPTABLES=legacy for iptables-legacy (default nft); SY_BENCH_FULL_RESYNC=0
//! skips the full resync, SY_BENCH_COLD=0 the sync from manifests; SY_BENCH_CHANGES (100)
//! sets how many one-endpoint changes are timed. Each measurement gets
//! a fresh namespace; lines print as they finish.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use dataplane::backend::{Backend, Scope};
use dataplane::iptables::diff::{Saved, Style};
use dataplane::iptables::kernel::{IptablesCommand, IptablesError, IptablesExecutor, Variant};
use dataplane::iptables::plan::TableName;
use dataplane::iptables::IptablesBackend;
use dataplane::model::IpFamily;
use dataplane::synth;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{ms, pct};

/// Times each iptables-restore, iptables-save and direct creation of chains.
struct Timed {
    inner: IptablesCommand,
    restores: Vec<Duration>,
    saves: Vec<Duration>,
    created: Vec<Duration>,
}

impl IptablesExecutor for Timed {
    fn save(&mut self, family: IpFamily) -> Result<Saved, IptablesError> {
        let t = Instant::now();
        let r = self.inner.save(family);
        self.saves.push(t.elapsed());
        r
    }
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), IptablesError> {
        let t = Instant::now();
        let r = self.inner.restore(family, input);
        self.restores.push(t.elapsed());
        r
    }
    fn enable_route_localnet(&mut self) -> Result<(), IptablesError> {
        self.inner.enable_route_localnet()
    }
    fn style(&self) -> Style {
        self.inner.style()
    }
    fn create_chains(
        &mut self,
        family: IpFamily,
        table: TableName,
        chains: &[(&str, &[String])],
    ) -> Result<(), IptablesError> {
        let t = Instant::now();
        let r = self.inner.create_chains(family, table, chains);
        self.created.push(t.elapsed());
        r
    }
    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: TableName,
        chain: &str,
    ) -> Result<bool, IptablesError> {
        self.inner.chain_exists(family, table, chain)
    }
}

/// A fresh namespace for the next measurement: removing 110k chains through iptables-nft
/// takes as long as loading them.
fn fresh_netns(ns: &mut Option<String>) {
    if let Some(old) = ns.take() {
        let _ = Command::new("ip").args(["netns", "del", &old]).status();
    }
    *ns = common::enter_netns("iptables_e2e");
}

fn cold_from_manifests(services: usize, variant: Variant) {
    let c = common::cold_sync_from_manifests(
        services,
        "kind: KubeProxyConfiguration\nmode: iptables\nhostnameOverride: bench-node\nclusterCIDR: 10.0.0.0/8\n",
        &["--iptables-backend", variant.as_str()],
    );
    println!(
        "(a) iptables-{}: cold sync from manifests, {services} x 10: {} wall; peak RSS of the largest process (agent or iptables-restore) {:.1} MiB; agent said: {}",
        variant.as_str(),
        ms(c.wall),
        c.max_rss_mib,
        c.said
    );
}

fn in_process(services: usize, changes: usize, variant: Variant) {
    let mut snap = synth::cluster(services, 10);
    let mut be = IptablesBackend::new(Timed {
        inner: IptablesCommand::new(variant),
        restores: Vec::new(),
        saves: Vec::new(),
        created: Vec::new(),
    });
    let t = Instant::now();
    be.sync(&snap, Scope::AllServices).expect("cold sync");
    let cold = t.elapsed();
    let cold_restores: Duration = be.executor().restores.iter().sum();
    let cold_saves: Duration = be.executor().saves.iter().sum();
    let cold_created: Duration = be.executor().created.iter().sum();
    // SY_BENCH_FULL_RESYNC=0 skips it: on iptables-nft it costs about as much as the cold sync.
    let full = (std::env::var("SY_BENCH_FULL_RESYNC").as_deref() != Ok("0")).then(|| {
        let t = Instant::now();
        let r = be.sync(&snap, Scope::RepairAll).expect("full resync");
        assert!(!r.drift, "{}", r.summary());
        t.elapsed()
    });
    let before = be.executor().restores.len();
    let mut totals = common::endpoint_changes(&mut snap, services, changes, |snap, changed| {
        let r = be
            .sync(snap, Scope::Services(changed))
            .expect("partial sync");
        assert!(!r.full && r.stats.chains_written >= 2, "{}", r.summary());
    });
    let mut restores: Vec<Duration> = be.executor().restores[before..].to_vec();
    println!(
        "(b) iptables-{} {services} x 10: cold sync {} (chains created over netlink {}, iptables-restore {}, iptables-save {}); full resync {}; one-endpoint change over {changes}: iptables-restore p50 {} p99 {}; whole sync p50 {} p99 {}",
        variant.as_str(),
        ms(cold),
        ms(cold_created),
        ms(cold_restores),
        ms(cold_saves),
        full.map_or("skipped".into(), ms),
        ms(pct(&mut restores, 0.5)),
        ms(pct(&mut restores, 0.99)),
        ms(pct(&mut totals, 0.5)),
        ms(pct(&mut totals, 0.99)),
    );
}

fn main() {
    // `cargo bench` passes --bench; anything else (e.g. `cargo test --benches`) only checks it builds.
    if !std::env::args().any(|a| a == "--bench") {
        println!("iptables_e2e: run with `cargo bench --bench iptables_e2e`");
        return;
    }
    let variant = std::env::var("SY_BENCH_IPTABLES")
        .ok()
        .and_then(|v| Variant::parse(&v))
        .unwrap_or(Variant::Nft);
    let mut ns = None;
    fresh_netns(&mut ns);
    if ns.is_none() {
        return;
    }
    let sizes = common::sizes();
    // SY_BENCH_COLD=0 skips (a): the in-process cold sync of (b) measures the same restore.
    if std::env::var("SY_BENCH_COLD").as_deref() != Ok("0") {
        cold_from_manifests(sizes[0], variant);
        fresh_netns(&mut ns);
    }
    let changes = std::env::var("SY_BENCH_CHANGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    for &n in &sizes {
        in_process(n, changes, variant);
        fresh_netns(&mut ns);
    }
    if let Some(ns) = ns {
        let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    }
}
