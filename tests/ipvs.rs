//! IPVS mode in a real kernel with IPVS: the host's has none, so each `*_in_guest` test
//! boots Debian's kernel under QEMU (tests/guest) and runs its `guest_*` partner there.
//! The partners are `#[ignore]`d on the host, where they cannot run, and refuse to run
//! outside the guest. Needs root, QEMU and the prepared kernel; prints SKIP otherwise
//! (fails if SWITCHYARD_REQUIRE_GUEST=1).

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod guest;
mod rig;
// The production kube-ipvs0 link, from the switchyard library.
use switchyard::ipvs_link;

use dataplane::backend::{Backend, Scope};
use dataplane::iptables::kernel::IptablesCommand;
use dataplane::ipvs::genl::{IpvsSocket, Op, ServiceId, ServiceSpec, SVC_F_PERSISTENT};
use dataplane::ipvs::kernel::{DummyLink, RealIpvs};
use dataplane::ipvs::{IpvsBackend, IpvsOptions};
use dataplane::model::Protocol;
use dataplane::synth;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

/// Boots the guest for `test`; a hand-narrowed run (SWITCHYARD_IPVS_SCENARIOS=a,b)
/// carries over.
fn in_guest(test: &str, timeout: Duration) {
    let only = std::env::var("SWITCHYARD_IPVS_SCENARIOS").unwrap_or_default();
    let env: Vec<(&str, &str)> = if only.is_empty() {
        Vec::new()
    } else {
        vec![("SWITCHYARD_IPVS_SCENARIOS", only.as_str())]
    };
    guest::test_in_guest(test, &env, timeout);
}

use guest::require_guest;

/// A fresh namespace for one guest test, deleted when dropped.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("{}-{tag}", rig::netns::unique_prefix());
        rig::netns::create_namespace(&name).unwrap();
        Netns(name)
    }
}

impl Netns {
    /// Runs `program` in the namespace; panics with the transcript unless it succeeds.
    fn must(&self, program: &str, args: &[&str]) -> String {
        let mut all = vec!["netns", "exec", &self.0, program];
        all.extend_from_slice(args);
        let out = rig::netns::run("ip", &all, None, rig::netns::CMD_TIMEOUT);
        assert!(out.success(), "{}", out.transcript());
        out.stdout
    }

    fn ipvs<T: Send>(&self, f: impl FnOnce(&mut IpvsSocket) -> T + Send) -> T {
        rig::netns::in_netns(&self.0, || Ok(f(&mut IpvsSocket::open().expect("IPVS")))).unwrap()
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
        assert_eq!(s.services().unwrap(), vec![(v6, rr.clone())]);

        // Batched: 300 operations over three datagrams, one refused in the middle; the
        // others all land and each outcome comes back in order.
        let batch_svc = ServiceId {
            addr: "172.30.0.20".parse().unwrap(),
            protocol: Protocol::Tcp,
            port: 80,
        };
        let mut ops = vec![Op::AddService(batch_svc, rr.clone())];
        for i in 0..298u32 {
            let addr = std::net::Ipv4Addr::from(0x0a02_0000 + i + 1);
            ops.push(Op::AddDest(batch_svc, IpAddr::V4(addr), 8080, 1));
        }
        ops.insert(150, Op::AddService(batch_svc, rr.clone()));
        let results = s.apply_all(&ops).unwrap();
        assert_eq!(results.len(), 300);
        for (i, r) in results.iter().enumerate() {
            if i == 150 {
                let e = r.as_ref().unwrap_err().to_string();
                assert!(e.contains("error 17"), "{e}");
            } else {
                assert!(r.is_ok(), "{i}: {r:?}");
            }
        }
        assert_eq!(s.dests(&batch_svc).unwrap().len(), 298);

        s.flush().unwrap();
        assert!(s.services().unwrap().is_empty());
        Ok(())
    })
    .unwrap();
}

#[test]
fn backend_changes_in_guest() {
    in_guest("guest_backend_changes", Duration::from_secs(300));
}

/// The servers IPVS holds for synthetic service `i`, sorted.
fn servers(s: &mut IpvsSocket, i: usize) -> Vec<IpAddr> {
    let id = ServiceId {
        addr: synth::cluster_ip(i),
        protocol: Protocol::Tcp,
        port: 80,
    };
    let mut v: Vec<IpAddr> = s.dests(&id).unwrap().iter().map(|d| d.addr).collect();
    v.sort();
    v
}

/// The backend on the real IPVS, the real kube-ipvs0 and real iptables: a full sync
/// programs every service (and sets the sysctls, strictARP's and the timeouts), one endpoint change is two netlink operations (add the new
/// server, delete the old one, which has no connections), a sync with nothing new and a
/// full resync of an intact kernel change nothing, a server removed behind our back is put
/// back by the full resync, and cleanup leaves nothing of ours.
#[test]
#[ignore = "runs inside the QEMU guest, through backend_changes_in_guest"]
fn guest_backend_changes() {
    require_guest();
    let ns = Netns::new("backend");
    rig::netns::in_netns(&ns.0, || {
        let kernel = RealIpvs::open(Box::new(ipvs_link::Rtnetlink)).unwrap();
        let options = IpvsOptions {
            strict_arp: true,
            timeouts: (900, 60, 240),
            ..IpvsOptions::default()
        };
        let mut b = IpvsBackend::new(kernel, IptablesCommand::for_variant(None), options);
        let (n, per) = (200, 10);
        let mut snap = synth::cluster(n, per);
        let r = b.sync(&snap, Scope::AllServices).unwrap();
        assert!(r.full);
        assert_eq!(b.last.operations, n + n * per, "{:?}", b.last);
        let mut s = IpvsSocket::open().unwrap();
        assert_eq!(s.services().unwrap().len(), n);
        // kube-proxy's sysctls, strictARP and the configured timeouts, in this namespace.
        assert_eq!(s.timeouts().unwrap(), (900, 60, 240));
        for (path, want) in [
            ("/proc/sys/net/ipv4/vs/conntrack", "1"),
            ("/proc/sys/net/ipv4/vs/expire_nodest_conn", "1"),
            ("/proc/sys/net/ipv4/vs/expire_quiescent_template", "1"),
            ("/proc/sys/net/ipv4/conf/all/arp_ignore", "1"),
            ("/proc/sys/net/ipv4/conf/all/arp_announce", "2"),
        ] {
            let got = std::fs::read_to_string(path).unwrap();
            assert_eq!(got.trim(), want, "{path}");
        }
        let want: Vec<IpAddr> = (0..per).map(|j| synth::endpoint_ip(7, j, 0)).collect();
        assert_eq!(servers(&mut s, 7), want);
        let bound = ipvs_link::Rtnetlink.addresses().unwrap().bound;
        assert_eq!(bound.len(), n, "every ClusterIP bound to kube-ipvs0");
        assert!(bound.contains(&synth::cluster_ip(7)));
        let nat = std::process::Command::new("iptables-save")
            .args(["-t", "nat"])
            .output()
            .unwrap();
        let nat = String::from_utf8_lossy(&nat.stdout);
        assert!(
            nat.contains("-A KUBE-SERVICES") && nat.contains("KUBE-CLUSTER-IP"),
            "{nat}"
        );

        synth::replace_endpoint(&mut snap, 7, 3, 1);
        let changed: BTreeSet<(String, String)> =
            [("bench".to_string(), "svc-7".to_string())].into();
        b.sync(&snap, Scope::Services(&changed)).unwrap();
        assert_eq!(b.last.operations, 2, "{:?}", b.last);
        let mut want7 = want.clone();
        want7[3] = synth::endpoint_ip(7, 3, 1);
        want7.sort();
        assert_eq!(servers(&mut s, 7), want7);
        assert_eq!(servers(&mut s, 8).len(), per);

        b.sync(&snap, Scope::AllServices).unwrap();
        assert_eq!(b.last.operations, 0, "nothing new: {:?}", b.last);
        b.sync(&snap, Scope::RepairAll).unwrap();
        assert_eq!(b.last.operations, 0, "an intact kernel: {:?}", b.last);

        // Someone deletes a server; the periodic full resync puts it back, and only it.
        let id9 = ServiceId {
            addr: synth::cluster_ip(9),
            protocol: Protocol::Tcp,
            port: 80,
        };
        s.apply(&Op::DeleteDest(id9, synth::endpoint_ip(9, 0, 0), 8080))
            .unwrap();
        b.sync(&snap, Scope::RepairAll).unwrap();
        assert_eq!(b.last.operations, 1, "{:?}", b.last);
        assert_eq!(servers(&mut s, 9).len(), per);

        // A service that goes away takes its address and its IPVS service with it.
        let gone = snap
            .services
            .keys()
            .find(|(name, _)| &*name.name == "svc-9")
            .cloned()
            .unwrap();
        snap.services.remove(&gone);
        let changed: BTreeSet<(String, String)> =
            [("bench".to_string(), "svc-9".to_string())].into();
        b.sync(&snap, Scope::Services(&changed)).unwrap();
        assert_eq!(s.services().unwrap().len(), n - 1);
        let bound = ipvs_link::Rtnetlink.addresses().unwrap().bound;
        assert!(!bound.contains(&synth::cluster_ip(9)) && bound.len() == n - 1);

        // cleanup takes away all of it: virtual services, kube-ipvs0, sets, chains.
        assert!(b.cleanup().unwrap() > 0);
        assert!(s.services().unwrap().is_empty());
        assert!(ipvs_link::Rtnetlink.addresses().unwrap().bound.is_empty());
        let run = |prog: &str, args: &[&str]| {
            let out = std::process::Command::new(prog)
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "{prog} {args:?}");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert_eq!(run("ipset", &["list", "-n"]).trim(), "");
        let links = run("ip", &["-o", "link", "show"]);
        assert!(!links.contains("kube-ipvs0"), "{links}");
        for table in ["nat", "filter"] {
            let rules = run("iptables-save", &["-t", table]);
            assert!(!rules.contains("KUBE-"), "{table}: {rules}");
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn cleanup_kube_proxy_in_guest() {
    in_guest("guest_cleanup_kube_proxy", Duration::from_secs(240));
}

fn tcp(addr: &str, port: u16) -> ServiceId {
    ServiceId {
        addr: addr.parse().unwrap(),
        protocol: Protocol::Tcp,
        port,
    }
}

/// `switchyard cleanup --kube-proxy` on what kube-proxy's IPVS mode leaves: its virtual
/// services (on kube-ipvs0's addresses, and node ports on the node's addresses), kube-ipvs0
/// and its ipsets go; another tool's virtual services and ipsets, and the node's own
/// interfaces, stay.
#[test]
#[ignore = "runs inside the QEMU guest, through cleanup_kube_proxy_in_guest"]
fn guest_cleanup_kube_proxy() {
    require_guest();
    let ns = Netns::new("kpclean");
    ns.must("ip", &["link", "add", "eth0", "type", "dummy"]);
    ns.must("ip", &["addr", "add", "192.168.0.2/24", "dev", "eth0"]);
    ns.must("ip", &["link", "set", "eth0", "up"]);
    ns.must("ip", &["link", "add", "kube-ipvs0", "type", "dummy"]);
    ns.must(
        "ip",
        &["addr", "add", "172.30.0.10/32", "dev", "kube-ipvs0"],
    );
    let rr = ServiceSpec {
        scheduler: "rr".into(),
        ..ServiceSpec::default()
    };
    let (cluster, node_port) = (tcp("172.30.0.10", 80), tcp("192.168.0.2", 30080));
    let (foreign, foreign_on_node) = (tcp("10.99.0.1", 8080), tcp("192.168.0.2", 8443));
    ns.ipvs(|s| {
        for id in [cluster, node_port, foreign, foreign_on_node] {
            s.apply(&Op::AddService(id, rr.clone())).unwrap();
            s.apply(&Op::AddDest(id, "10.180.0.1".parse().unwrap(), 8080, 1))
                .unwrap();
        }
    });
    for set in [
        "KUBE-CLUSTER-IP hash:ip,port",
        "KUBE-LOOP-BACK hash:ip,port,ip",
        "KUBE-6-NODE-PORT-TCP bitmap:port range 0-65535",
        "my-allowlist hash:ip",
    ] {
        let mut args = vec!["create"];
        args.extend(set.split(' '));
        ns.must("ipset", &args);
    }
    ns.must("ipset", &["add", "KUBE-CLUSTER-IP", "172.30.0.10,tcp:80"]);

    let sy = env!("CARGO_BIN_EXE_switchyard");
    let out = ns.must(sy, &["cleanup", "--kube-proxy"]);
    assert!(out.contains("removed 2 IPVS virtual services"), "{out}");
    assert!(out.contains("removed 3 KUBE- ipsets"), "{out}");
    let mut left: Vec<ServiceId> = ns.ipvs(|s| {
        s.services()
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    });
    left.sort();
    let mut want = vec![foreign, foreign_on_node];
    want.sort();
    assert_eq!(left, want, "only the other tool's virtual services stay");
    let sets = ns.must("ipset", &["list", "-n"]);
    assert_eq!(
        sets.split_whitespace().collect::<Vec<_>>(),
        vec!["my-allowlist"]
    );
    let links = ns.must("ip", &["-o", "link", "show"]);
    assert!(
        !links.contains("kube-ipvs0") && links.contains("eth0"),
        "{links}"
    );

    // Nothing of kube-proxy's is left: a second run removes nothing and succeeds.
    let again = ns.must(sy, &["cleanup", "--kube-proxy"]);
    assert!(
        !again.contains("IPVS virtual services") && !again.contains("ipsets"),
        "{again}"
    );
    assert_eq!(ns.ipvs(|s| s.services().unwrap().len()), 2);
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

#[test]
fn ipvs_random_walks_in_guest() {
    let mut env = Vec::new();
    let vars: Vec<(&str, String)> = [
        "SWITCHYARD_PROPERTY_CASES",
        "SWITCHYARD_PROPERTY_EDITS",
        "SWITCHYARD_PROPERTY_SEED",
    ]
    .iter()
    .filter_map(|k| std::env::var(k).ok().map(|v| (*k, v)))
    .collect();
    env.extend(vars.iter().map(|(k, v)| (*k, v.as_str())));
    guest::test_in_guest("guest_ipvs_random_walks", &env, Duration::from_secs(600));
}

/// Everything IPVS mode holds in the current namespace, as comparable text: the virtual
/// services with their real servers, the addresses on kube-ipvs0, the ipsets' members and
/// the iptables rules (read outside, by namespace name).
fn ipvs_state(ns: &str) -> Vec<String> {
    let mut out = rig::netns::in_netns(ns, || {
        let mut s = IpvsSocket::open().expect("IPVS");
        let mut lines = Vec::new();
        for (id, spec) in s.services().unwrap() {
            lines.push(format!("service {id} {spec:?}"));
            for d in s.dests(&id).unwrap() {
                lines.push(format!(
                    "  {id} real server {}:{} weight {}",
                    d.addr, d.port, d.weight
                ));
            }
        }
        for a in ipvs_link::Rtnetlink.addresses().unwrap().bound {
            lines.push(format!("kube-ipvs0 {a}"));
        }
        Ok(lines)
    })
    .unwrap();
    let sets = rig::netns::run(
        "ip",
        &["netns", "exec", ns, "ipset", "save"],
        None,
        rig::netns::CMD_TIMEOUT,
    );
    assert!(sets.success(), "{}", sets.transcript());
    for line in sets.stdout.lines() {
        // A set's hash seed (`initval`) differs from set to set; its name and type do not.
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.first() {
            Some(&"create") => out.push(words[..3.min(words.len())].join(" ")),
            Some(_) => out.push(line.to_string()),
            None => {}
        }
    }
    for ((table, chain), rules) in rig::netns::saved_rules(ns, rig::netns::NFT_SAVE) {
        out.extend(rules.iter().map(|r| format!("{table} {chain}: {r}")));
    }
    out.sort();
    out
}

/// The random walks of tests/kernel_properties.rs in IPVS mode on the real IPVS: every
/// sync is accepted, and after the walk (each edit a partial sync) the kernel holds what one
/// sync from scratch of the final cluster puts into an empty namespace: virtual services,
/// real servers and their weights, kube-ipvs0's addresses, ipsets and iptables rules.
#[test]
#[ignore = "runs inside the QEMU guest, through ipvs_random_walks_in_guest"]
fn guest_ipvs_random_walks() {
    require_guest();
    let edits = rig::random::env_or("SWITCHYARD_PROPERTY_EDITS", 25) as usize;
    let sync_all = |ns: &Netns, steps: &[(&dataplane::model::Snapshot, Scope)]| {
        rig::netns::in_netns(&ns.0, || {
            let kernel = RealIpvs::open(Box::new(ipvs_link::Rtnetlink)).unwrap();
            let mut b = IpvsBackend::new(
                kernel,
                IptablesCommand::new(dataplane::iptables::kernel::Variant::Nft),
                IpvsOptions::default(),
            );
            for (k, (snap, scope)) in steps.iter().enumerate() {
                b.sync(snap, *scope)
                    .map_err(|e| std::io::Error::other(format!("sync {k}: {e}")))?;
            }
            Ok(())
        })
    };
    for seed in rig::random::seeds() {
        let (first, steps) = rig::random::walk(seed, edits);
        let last = steps.last().map_or(&first, |s| &s.0);
        let (walked, scratch) = (Netns::new("walk"), Netns::new("scratch"));
        let mut plan = vec![(&first, Scope::AllServices)];
        plan.extend(
            steps
                .iter()
                .map(|(s, changed)| (s, Scope::Services(changed))),
        );
        sync_all(&walked, &plan)
            .unwrap_or_else(|e| panic!("seed {seed:#x}: the kernel refused: {e}"));
        sync_all(&scratch, &[(last, Scope::AllServices)])
            .unwrap_or_else(|e| panic!("seed {seed:#x}: sync from scratch: {e}"));
        let (after_walk, from_scratch) = (ipvs_state(&walked.0), ipvs_state(&scratch.0));
        let only_walk: Vec<_> = after_walk
            .iter()
            .filter(|l| !from_scratch.contains(l))
            .collect();
        let only_scratch: Vec<_> = from_scratch
            .iter()
            .filter(|l| !after_walk.contains(l))
            .collect();
        assert!(
            only_walk.is_empty() && only_scratch.is_empty(),
            "seed {seed:#x}: after the walk, not from scratch:\n{only_walk:#?}\nfrom scratch, not after the walk:\n{only_scratch:#?}"
        );
        assert!(
            after_walk.iter().any(|l| l.starts_with("service ")),
            "seed {seed:#x}: {after_walk:#?}"
        );
    }
}

#[test]
fn ipvs_netlink_faults_in_guest() {
    in_guest("guest_ipvs_netlink_faults", Duration::from_secs(240));
}

/// Netlink errors on the IPVS generic-netlink socket of the real IPVS (SWITCHYARD_FAULTS
/// `IPVS:send`, `IPVS:receive`): a signal's EINTR is retried where it happens and fails
/// nothing; a refused send and a receive that lost its answers (ENOBUFS) fail that sync with
/// an error naming IPVS; the full sync that follows (as the agent retries) leaves the kernel
/// as one sync from scratch would.
#[test]
#[ignore = "runs inside the QEMU guest, through ipvs_netlink_faults_in_guest"]
fn guest_ipvs_netlink_faults() {
    require_guest();
    let dir = tempfile::tempdir().unwrap();
    let faults = dir.path().join("faults");
    // The guest runs this test alone, in a process of its own.
    std::env::set_var("SWITCHYARD_FAULTS", &faults);
    let (ns, scratch) = (Netns::new("faults"), Netns::new("faults-scratch"));
    let mut snap = synth::cluster(20, 3);
    let backend = || {
        IpvsBackend::new(
            RealIpvs::open(Box::new(ipvs_link::Rtnetlink)).unwrap(),
            IptablesCommand::new(dataplane::iptables::kernel::Variant::Nft),
            IpvsOptions::default(),
        )
    };
    let changed: BTreeSet<(String, String)> = [("bench".to_string(), "svc-7".to_string())].into();
    let mut generation = 0;
    for (fault, fails) in [
        ("IPVS:send EINTR 3", false),
        ("IPVS:send EPERM 1", true),
        ("IPVS:receive ENOBUFS 1", true),
    ] {
        // Each replacement a fresh address (a generation names one).
        generation += 2;
        synth::replace_endpoint(&mut snap, 7, 1, generation - 1);
        let (before, changed, faults) = (snap.clone(), changed.clone(), faults.clone());
        rig::netns::in_netns(&ns.0, move || {
            let mut b = backend();
            b.sync(&before, Scope::AllServices).unwrap();
            std::fs::write(&faults, format!("{fault}\n")).unwrap();
            let mut next = before.clone();
            synth::replace_endpoint(&mut next, 7, 2, generation);
            let result = b.sync(&next, Scope::Services(&changed));
            std::fs::remove_file(&faults).unwrap();
            match (fails, result) {
                (false, Ok(_)) => {}
                (true, Err(e)) => assert!(e.to_string().contains("IPVS"), "{fault}: {e}"),
                (_, r) => panic!("{fault}: {r:?}"),
            }
            b.sync(&next, Scope::RepairAll).unwrap();
            Ok(())
        })
        .unwrap();
        let mut next = snap.clone();
        synth::replace_endpoint(&mut next, 7, 2, generation);
        rig::netns::in_netns(&scratch.0, || {
            let mut b = backend();
            b.cleanup().unwrap();
            b.sync(&next, Scope::AllServices).unwrap();
            Ok(())
        })
        .unwrap();
        assert_eq!(ipvs_state(&ns.0), ipvs_state(&scratch.0), "after {fault}");
    }
}
