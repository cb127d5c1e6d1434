//! Pure-work benchmarks: layout (snapshot to desired tables) and diff (to a transaction) at
//! 1k, 10k and 30k services x 10 endpoints, cold (against an empty kernel) and for one change;
//! the iptables layout and its cold restore input.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use dataplane::nft::layout::desired;
use dataplane::nft::state::Ruleset;
use dataplane::nft::transaction::diff;
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
    }
    g.finish();

    let mut g = c.benchmark_group("iptables");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let empty = dataplane::iptables::restore::Saved::default();
    for n in [1_000usize, 10_000, 30_000] {
        let snap = synth::cluster(n, 10);
        g.bench_with_input(BenchmarkId::new("render", n), &snap, |b, s| {
            b.iter(|| black_box(dataplane::iptables::render::render(s)))
        });
        let r = dataplane::iptables::render::render(&snap);
        let v4 = &r.families[&dataplane::model::IpFamily::V4];
        let jumps = &r.jumps[&dataplane::model::IpFamily::V4];
        g.bench_with_input(BenchmarkId::new("restore_input_cold", n), v4, |b, t| {
            b.iter(|| {
                black_box(dataplane::iptables::restore::sync_input(
                    t,
                    dataplane::iptables::restore::Base::Kernel(&empty),
                    jumps,
                ))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
