//! `switchyard trace` against the packet-level cases: for every flow of the vendored cases
//! and of our own, in every mode, trace's verdict, endpoints and masquerade are the flow's
//! expectation, which the conformance tests check real packets against; so trace agrees
//! with what the real packet does. Needs nothing but the binary.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod rig;

use std::collections::BTreeSet;

use rig::cases::{Cases, Mode, Verdict};
use serde_json::Value;

fn check(cases: &Cases, mode: Mode) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for s in &cases.scenarios {
        let cfg = dir.path().join(format!("{}.config.yaml", s.id));
        let manifests = dir.path().join(format!("{}.yaml", s.id));
        std::fs::write(&cfg, rig::manifests::kube_proxy_config(&s.node, mode)).unwrap();
        std::fs::write(&manifests, rig::manifests::scenario_yaml(s)).unwrap();
        for f in &s.flows {
            let got: Value = f.trace(&cfg, &manifests);
            let want = f.expectation(mode);
            let verdict = match want.verdict {
                Verdict::Dnat => "DNAT",
                Verdict::Reject => "REJECT",
                Verdict::Drop => "DROP",
                Verdict::Accept => "ACCEPT",
            };
            let endpoints: BTreeSet<String> = got["endpoints"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["endpoint"].as_str().unwrap().to_string())
                .collect();
            let want_eps: BTreeSet<String> = want.endpoints.iter().cloned().collect();
            let ok = got["verdict"] == verdict
                && (want.verdict != Verdict::Dnat
                    || (endpoints == want_eps && got["masquerade"].as_bool() == want.masquerade));
            if !ok {
                wrong.push(format!(
                    "{} / {} ({}): want {verdict} {want_eps:?} masquerade {:?}, trace said {got}",
                    s.id,
                    f.name,
                    mode.as_str(),
                    want.masquerade
                ));
            }
            checked += 1;
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {checked}:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    checked
}

/// IPVS mode's expectations include its designed differences
/// (tests/conformance/ipvs-differences.json), which real packets are checked against in
/// the QEMU guest.
#[test]
fn trace_agrees_with_every_conformance_flow_in_every_mode() {
    for mode in [Mode::Nftables, Mode::Iptables, Mode::Ipvs] {
        assert_eq!(check(&Cases::vendored(), mode), 155);
        assert!(check(&Cases::own(), mode) >= 50);
    }
}
