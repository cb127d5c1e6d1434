//! IPVS mode in a real kernel with IPVS: the host's has none, so each `*_in_guest` test
//! boots Debian's kernel under QEMU (tests/guest) and runs its `guest_*` partner there.
//! The partners are `#[ignore]`d on the host, where they cannot run, and refuse to run
//! outside the guest. Needs root, QEMU and the prepared kernel; prints SKIP otherwise
//! (fails if SWITCHYARD_REQUIRE_GUEST=1).

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod guest;
mod rig;

use dataplane::ipvs::genl::{IpvsSocket, Op, ServiceId, ServiceSpec, SVC_F_PERSISTENT};
use dataplane::model::Protocol;
use std::net::IpAddr;
use std::time::Duration;

/// Boots the guest for `test` and fails with its transcript unless it passed.
fn in_guest(test: &str, timeout: Duration) {
    let Some(kernel) = guest::kernel() else {
        return;
    };
    // Narrowing the guest's run by hand (SWITCHYARD_IPVS_SCENARIOS=a,b) carries over.
    let only = std::env::var("SWITCHYARD_IPVS_SCENARIOS").unwrap_or_default();
    let env: Vec<(&str, &str)> = if only.is_empty() {
        Vec::new()
    } else {
        vec![("SWITCHYARD_IPVS_SCENARIOS", only.as_str())]
    };
    let run = guest::run_test(&kernel, test, &env, timeout);
    if let Ok(path) = std::env::var("SWITCHYARD_GUEST_LOG") {
        let _ = std::fs::write(path, &run.output);
    }
    eprintln!("{}", run.transcript());
    assert!(run.passed(), "{test} failed in the guest");
    // With --nocapture the test's own output lands between "test NAME ..." and "ok", so
    // the summary line is what proves the one test ran and passed.
    assert!(
        run.output.contains(&format!("test {test} ..."))
            && run.output.contains("test result: ok. 1 passed"),
        "{test} did not run in the guest"
    );
}

fn require_guest() {
    assert_eq!(
        std::env::var(guest::IN_GUEST_ENV).as_deref(),
        Ok("1"),
        "runs only inside the QEMU guest (through its *_in_guest partner)"
    );
}

/// A fresh namespace for one guest test, deleted when dropped.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("{}-{tag}", rig::netns::unique_prefix());
        rig::netns::create_namespace(&name).unwrap();
        Netns(name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        rig::netns::delete_namespace(&self.0);
    }
}

#[test]
fn ipvs_netlink_in_guest() {
    in_guest("guest_ipvs_netlink", Duration::from_secs(240));
}

/// Our generic-netlink messages against the real IPVS: what is added lists back as added,
/// weight and scheduler changes land, deletes remove exactly what they name.
#[test]
#[ignore = "runs inside the QEMU guest, through ipvs_netlink_in_guest"]
fn guest_ipvs_netlink() {
    require_guest();
    let ns = Netns::new("genl");
    rig::netns::in_netns(&ns.0, || {
        let mut s = IpvsSocket::open().expect("IPVS family");
        assert!(s.services().unwrap().is_empty());
        let id = ServiceId {
            addr: "172.30.0.10".parse().unwrap(),
            protocol: Protocol::Tcp,
            port: 80,
        };
        let v6 = ServiceId {
            addr: "fd00:30::10".parse().unwrap(),
            protocol: Protocol::Udp,
            port: 53,
        };
        let rr = ServiceSpec {
            scheduler: "rr".into(),
            flags: 0,
            timeout: 0,
        };
        s.apply(&Op::AddService(id, rr.clone())).unwrap();
        s.apply(&Op::AddService(v6, rr.clone())).unwrap();
        let a: IpAddr = "10.0.1.1".parse().unwrap();
        let b: IpAddr = "10.0.1.2".parse().unwrap();
        s.apply(&Op::AddDest(id, a, 8080, 1)).unwrap();
        s.apply(&Op::AddDest(id, b, 8080, 1)).unwrap();
        let c: IpAddr = "fd00:10::3".parse().unwrap();
        s.apply(&Op::AddDest(v6, c, 5353, 1)).unwrap();

        let mut services = s.services().unwrap();
        services.sort_by_key(|(i, _)| *i);
        assert_eq!(services, vec![(id, rr.clone()), (v6, rr.clone())]);
        let mut dests: Vec<_> = s
            .dests(&id)
            .unwrap()
            .into_iter()
            .map(|d| (d.addr, d.port, d.weight))
            .collect();
        dests.sort();
        assert_eq!(dests, vec![(a, 8080, 1), (b, 8080, 1)]);
        let d6 = s.dests(&v6).unwrap();
        assert_eq!((d6[0].addr, d6[0].port), (c, 5353));

        // Persistence and another scheduler; a drained server.
        let sticky = ServiceSpec {
            scheduler: "sh".into(),
            flags: SVC_F_PERSISTENT,
            timeout: 10800,
        };
        s.apply(&Op::UpdateService(id, sticky.clone())).unwrap();
        s.apply(&Op::UpdateDest(id, a, 8080, 0)).unwrap();
        let got = s.services().unwrap();
        assert!(got.contains(&(id, sticky)), "{got:?}");
        let weights: Vec<_> = s
            .dests(&id)
            .unwrap()
            .iter()
            .map(|d| (d.addr, d.weight))
            .collect();
        assert!(
            weights.contains(&(a, 0)) && weights.contains(&(b, 1)),
            "{weights:?}"
        );

        s.apply(&Op::DeleteDest(id, a, 8080)).unwrap();
        let left: Vec<_> = s.dests(&id).unwrap().iter().map(|d| d.addr).collect();
        assert_eq!(left, vec![b]);
        // A second add of the same service is refused by the kernel, with its errno.
        let err = s.apply(&Op::AddService(id, rr.clone())).unwrap_err();
        assert!(err.to_string().contains("error 17"), "{err}");
        s.apply(&Op::DeleteService(id)).unwrap();
        assert_eq!(s.services().unwrap(), vec![(v6, rr)]);
        s.flush().unwrap();
        assert!(s.services().unwrap().is_empty());
        Ok(())
    })
    .unwrap();
}

#[test]
fn conformance_in_guest() {
    in_guest("guest_conformance", Duration::from_secs(900));
}

/// Every vendored and own conformance scenario in IPVS mode, with real packets; all
/// failures are reported together.
#[test]
#[ignore = "runs inside the QEMU guest, through conformance_in_guest"]
fn guest_conformance() {
    require_guest();
    let only = std::env::var("SWITCHYARD_IPVS_SCENARIOS").ok();
    let mut failed = Vec::new();
    for (cases, own) in [
        (rig::cases::Cases::vendored(), false),
        (rig::cases::Cases::own(), true),
    ] {
        for scenario in &cases.scenarios {
            if only
                .as_deref()
                .is_some_and(|o| !o.split(',').any(|x| x == scenario.id))
            {
                continue;
            }
            let test = format!("ipvs/{}{}", if own { "own/" } else { "" }, scenario.id);
            let opts = rig::RigOptions {
                mode: rig::cases::Mode::Ipvs,
                ..rig::RigOptions::default()
            };
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut rig = rig::Rig::build(&test, scenario, opts).expect("rig");
                rig.program();
                rig.assert_scenario_flows();
            }));
            if result.is_err() {
                failed.push(test);
            }
        }
    }
    assert!(failed.is_empty(), "failed in IPVS mode: {failed:?}");
}

/// Every entry of tests/conformance/ipvs-differences.json names a scenario we run (the
/// flows are checked when the cases load).
#[test]
fn ipvs_differences_name_known_scenarios() {
    let vendored = rig::cases::Cases::vendored();
    let own = rig::cases::Cases::own();
    let known: Vec<&str> = vendored
        .scenarios
        .iter()
        .chain(&own.scenarios)
        .map(|s| s.id.as_str())
        .collect();
    let named = rig::cases::Cases::ipvs_difference_scenarios();
    assert!(!named.is_empty());
    for id in named {
        assert!(
            known.contains(&id.as_str()),
            "ipvs-differences.json names {id:?}"
        );
    }
}
