//! Pure-work benchmarks: layout (snapshot to desired tables) and diff (to a transaction) at
//! 1k, 10k and 30k services x 10 endpoints, cold (against an empty kernel) and for one change
//! (laid out whole, or in place as a partial sync does);
//! the iptables layout and its cold restore input; IPVS mode's plan and its partial sync on
//! the fake kernel.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use dataplane::nft::diff::diff;
use dataplane::nft::plan::desired;
use dataplane::nft::tables::Ruleset;
use dataplane::synth;
use std::hint::black_box;
use std::time::Duration;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("nft");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for n in [1_000usize, 10_000, 30_000] {
        let snap = synth::cluster(n, 10);
        let empty = Ruleset::default();
        g.bench_with_input(BenchmarkId::new("layout_cold", n), &snap, |b, s| {
            b.iter(|| black_box(desired(s, &empty)))
        });
        let (cold, _) = desired(&snap, &empty);
        g.bench_with_input(BenchmarkId::new("diff_cold_and_text", n), &cold, |b, d| {
            b.iter(|| black_box(diff(&empty, d, false).to_nft()))
        });
        let mut changed = snap.clone();
        synth::replace_endpoint(&mut changed, n / 2, 3, 1);
        g.bench_with_input(
            BenchmarkId::new("layout_and_diff_one_change", n),
            &changed,
            |b, s| {
                b.iter(|| {
                    let (next, _) = desired(s, &cold);
                    black_box(diff(&cold, &next, false))
                })
            },
        );
        // What a partial sync does for one changed EndpointSlice: lay out the one service
        // again in place, and the transaction of what that touched.
        let (mut rs, mut index, _) = dataplane::nft::plan::layout(&snap, &empty);
        let mut snap = snap;
        let mut generation = 0;
        g.bench_function(BenchmarkId::new("update_and_patch_one_change", n), |b| {
            b.iter(|| {
                let changed = change_one(&mut snap, n, &mut generation);
                let touched = dataplane::nft::plan::update(&snap, &mut rs, &mut index, &changed)
                    .expect("no front end is contested");
                black_box(dataplane::nft::diff::patch(&rs, &touched))
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("iptables");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let empty = dataplane::iptables::diff::Saved::default();
    for n in [1_000usize, 10_000, 30_000] {
        let snap = synth::cluster(n, 10);
        g.bench_with_input(BenchmarkId::new("render", n), &snap, |b, s| {
            b.iter(|| black_box(dataplane::iptables::plan::render(s)))
        });
        let r = dataplane::iptables::plan::render(&snap);
        let v4 = &r.families[&dataplane::model::IpFamily::V4];
        let jumps = &r.jumps[&dataplane::model::IpFamily::V4];
        g.bench_with_input(BenchmarkId::new("restore_input_cold", n), v4, |b, t| {
            b.iter(|| {
                black_box(dataplane::iptables::diff::sync_input(
                    t,
                    dataplane::iptables::diff::Base::Kernel(&empty),
                    jumps,
                ))
            })
        });
        // A partial sync's own work: the kernel is a null executor that takes every input.
        use dataplane::backend::Backend as _;
        let mut be = dataplane::iptables::IptablesBackend::new(NullIptables);
        let mut snap = snap;
        be.sync(&snap, dataplane::backend::Scope::AllServices)
            .unwrap();
        let mut generation = 0;
        g.bench_function(BenchmarkId::new("one_change_partial_sync", n), |b| {
            b.iter(|| {
                let changed = change_one(&mut snap, n, &mut generation);
                black_box(
                    be.sync(&snap, dataplane::backend::Scope::Services(&changed))
                        .unwrap(),
                )
            })
        });
    }
    g.finish();
}

/// The next change of a partial-sync bench: one endpoint of a service spread over the `n`
/// replaced; the changed set as a sync is told it.
fn change_one(
    snap: &mut dataplane::model::Snapshot,
    n: usize,
    generation: &mut u32,
) -> std::collections::BTreeSet<(String, String)> {
    *generation += 1;
    let i = (*generation as usize * 7919) % n;
    synth::replace_endpoint(snap, i, 3, *generation);
    std::collections::BTreeSet::from([("bench".to_string(), format!("svc-{i}"))])
}

/// A kernel that takes every restore and holds nothing, so that only our side is timed.
struct NullIptables;

impl dataplane::iptables::kernel::IptablesExecutor for NullIptables {
    fn save(
        &mut self,
        _: dataplane::model::IpFamily,
    ) -> Result<dataplane::iptables::diff::Saved, dataplane::iptables::kernel::IptablesError> {
        Ok(Default::default())
    }
    fn restore(
        &mut self,
        _: dataplane::model::IpFamily,
        input: &str,
    ) -> Result<(), dataplane::iptables::kernel::IptablesError> {
        black_box(input);
        Ok(())
    }
    fn enable_route_localnet(&mut self) -> Result<(), dataplane::iptables::kernel::IptablesError> {
        Ok(())
    }
    fn chain_exists(
        &mut self,
        _: dataplane::model::IpFamily,
        _: dataplane::iptables::plan::TableName,
        _: &str,
    ) -> Result<bool, dataplane::iptables::kernel::IptablesError> {
        Ok(true)
    }
}

/// IPVS mode's pure side: the plan, and a one-endpoint partial sync on the fake kernel (all
/// of the sync's own work, none of the kernel's).
fn bench_ipvs(c: &mut Criterion) {
    use dataplane::backend::{Backend, Scope};
    use dataplane::iptables::kernel::FakeIptables;
    use dataplane::ipvs::kernel::FakeIpvs;
    use dataplane::ipvs::{plan, IpvsBackend, IpvsOptions};
    let mut g = c.benchmark_group("ipvs");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for n in [1_000usize, 10_000, 30_000] {
        let mut snap = synth::cluster(n, 10);
        let node_ips = snap.node.node_ips.clone();
        g.bench_with_input(BenchmarkId::new("plan", n), &snap, |b, s| {
            b.iter(|| black_box(plan::plan(s, &node_ips, "rr")))
        });
        let mut k = FakeIpvs::default();
        k.addresses.local = node_ips.clone();
        let mut be = IpvsBackend::new(k, FakeIptables::default(), IpvsOptions::default());
        be.sync(&snap, Scope::AllServices).unwrap();
        let mut generation = 0;
        g.bench_function(
            BenchmarkId::new("one_change_partial_sync_on_fakes", n),
            |b| {
                b.iter(|| {
                    let changed = change_one(&mut snap, n, &mut generation);
                    black_box(be.sync(&snap, Scope::Services(&changed)).unwrap())
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench, bench_ipvs);
criterion_main!(benches);
