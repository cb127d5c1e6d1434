//! IPVS-mode sync benchmark in a real kernel with IPVS. The host's kernel has none, so this
//! boots Debian's kernel under QEMU (tests/guest, software emulation: every number is
//! slower than on hardware) and runs itself there, in a network namespace of its own, on
//! the production pieces: our generic-netlink IPVS messages, kube-ipvs0 over rtnetlink,
//! ipset and iptables-restore.
//!
//! At 10k services x 10 endpoints (SY_BENCH_SERVICES): (a) the cold full sync, (b) a full
//! resync of the loaded state (every syncPeriod: dump and compare), (c) one-endpoint
//! changes (SY_BENCH_CHANGES, 50): netlink operations and requests per change, p50/p99 of
//! the whole sync. (d) the same cold sync and changes in nftables mode (the default), in the
//! same guest, for the ratio (SY_BENCH_REFERENCE=0 skips it; iptables-nft would take most
//! of an hour to load 10k x 10 under emulation).
//!
//! Run: `cargo bench --bench ipvs_guest` as root, after `tests/guest/prepare-kernel.sh`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../tests/guest/mod.rs"]
mod guest;
// The production kube-ipvs0 link, from the switchyard library.
use switchyard::ipvs_link;

mod common;
use common::{env_or, ms, pct};

use dataplane::backend::{Backend, Scope};
use dataplane::iptables::kernel::IptablesCommand;
use dataplane::ipvs::kernel::RealIpvs;
use dataplane::ipvs::{IpvsBackend, IpvsOptions};
use dataplane::nft::kernel::NftKernel;
use dataplane::nft::NftBackend;
use dataplane::synth;
use std::time::{Duration, Instant};

fn fresh_netns(ns: &mut Option<String>) {
    if let Some(old) = ns.take() {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &old])
            .status();
    }
    *ns = common::enter_netns("ipvs_guest");
    assert!(ns.is_some(), "a network namespace in the guest");
}

fn ipvs(services: usize, changes: usize) {
    let mut snap = synth::cluster(services, 10);
    let kernel = RealIpvs::open(Box::new(ipvs_link::Rtnetlink)).expect("IPVS in the guest");
    let mut be = IpvsBackend::new(
        kernel,
        IptablesCommand::for_variant(None),
        IpvsOptions::default(),
    );
    let t = Instant::now();
    be.sync(&snap, Scope::AllServices).expect("cold sync");
    let cold = t.elapsed();
    let c = be.last.clone();
    println!(
        "(a) ipvs {services} x 10: cold full sync {}: {} IPVS operations, {} netlink requests, {} addresses bound",
        ms(cold),
        c.operations,
        c.requests,
        c.address_changes
    );
    let t = Instant::now();
    let r = be.sync(&snap, Scope::RepairAll).expect("full resync");
    let full = t.elapsed();
    assert!(!r.drift, "{}", r.summary());
    println!(
        "(b) ipvs {services} x 10: full resync of an intact kernel {}: {} operations, {} requests (the dumps)",
        ms(full),
        be.last.operations,
        be.last.requests
    );
    let (mut ops, mut reqs) = (Vec::new(), Vec::new());
    let mut totals = common::endpoint_changes(&mut snap, services, changes, |snap, changed| {
        be.sync(snap, Scope::Services(changed))
            .expect("partial sync");
        ops.push(be.last.operations);
        reqs.push(be.last.requests);
    });
    assert!(
        ops.iter().all(|&o| o == 2),
        "one change, two operations: {ops:?}"
    );
    println!(
        "(c) ipvs {services} x 10: one-endpoint change over {changes}: {} IPVS operations and at most {} netlink requests each; whole sync p50 {} p99 {}",
        ops[0],
        reqs.iter().max().unwrap(),
        ms(pct(&mut totals, 0.5)),
        ms(pct(&mut totals, 0.99)),
    );
}

fn nftables_reference(services: usize, changes: usize) {
    let mut snap = synth::cluster(services, 10);
    let mut be = NftBackend::new(NftKernel::default());
    let t = Instant::now();
    be.sync(&snap, Scope::AllServices).expect("cold sync");
    let cold = t.elapsed();
    let mut totals = common::endpoint_changes(&mut snap, services, changes, |snap, changed| {
        be.sync(snap, Scope::Services(changed))
            .expect("partial sync");
    });
    println!(
        "(d) nftables {services} x 10, same guest: cold sync {}; one-endpoint change over {changes}: whole sync p50 {} p99 {}",
        ms(cold),
        ms(pct(&mut totals, 0.5)),
        ms(pct(&mut totals, 0.99)),
    );
}

fn in_guest() {
    let services = env_or("SY_BENCH_SERVICES", 10_000);
    let changes = env_or("SY_BENCH_CHANGES", 50);
    let mut ns = None;
    fresh_netns(&mut ns);
    ipvs(services, changes);
    if std::env::var("SY_BENCH_REFERENCE").as_deref() != Ok("0") {
        fresh_netns(&mut ns);
        nftables_reference(services, changes);
    }
    if let Some(ns) = ns {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &ns])
            .status();
    }
}

fn main() {
    if std::env::var(guest::IN_GUEST_ENV).as_deref() == Ok("1") {
        in_guest();
        return;
    }
    // `cargo bench` passes --bench; anything else (e.g. `cargo test --benches`) only checks it builds.
    if !std::env::args().any(|a| a == "--bench") {
        println!("ipvs_guest: run with `cargo bench --bench ipvs_guest`");
        return;
    }
    let Some(kernel) = guest::kernel() else {
        println!("SKIP ipvs_guest: needs root, QEMU and tests/guest/prepare-kernel.sh");
        return;
    };
    let exe = std::env::current_exe().expect("this bench binary");
    let mut script = format!(
        "set -u\ncd /tmp\nexport PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nexport {}=1\n",
        guest::IN_GUEST_ENV
    );
    for var in [
        "SY_BENCH_SERVICES",
        "SY_BENCH_CHANGES",
        "SY_BENCH_REFERENCE",
    ] {
        if let Ok(v) = std::env::var(var) {
            script.push_str(&format!("export {var}='{v}'\n"));
        }
    }
    script.push_str(&format!("exec '{}'\n", exe.display()));
    let t = Instant::now();
    let run = guest::run_script(&kernel, &script, Duration::from_secs(3600));
    for line in run.output.lines().filter(|l| l.starts_with('(')) {
        println!("{line}");
    }
    if !run.passed() {
        eprintln!("{}", run.transcript());
        std::process::exit(1);
    }
    println!(
        "ipvs_guest: {:.0} s with the boot",
        t.elapsed().as_secs_f64()
    );
}
