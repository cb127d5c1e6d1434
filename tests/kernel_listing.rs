//! The netlink reader against nft's own JSON listing, on a real kernel: a table with every
//! kind of element the layout writes (concatenated keys, verdicts, backend slots, interval
//! sets, IPv6) must read back identically both ways, and equal to what was written; and
//! element-only transactions committed as netlink batches must land exactly, or not at all;
//! no DNAT rule may carry nft's hidden protocol match; a family the kernel refuses must not
//! hold back the other.
//! Needs root; prints SKIP otherwise (fails if SWITCHYARD_REQUIRE_NETNS=1).

#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "rig/netns.rs"]
#[allow(dead_code)]
mod netns;

use dataplane::model::*;
use dataplane::nft::diff::diff;
use dataplane::nft::kernel::{NftExecutor, NftKernel};
use dataplane::nft::plan;
use dataplane::nft::tables::Ruleset;
use dataplane::nft::NftBackend;
use std::collections::BTreeMap;
use std::net::IpAddr;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Every front-end kind, both families, sets with prefixes, hosts and ranges.
fn snapshot() -> Snapshot {
    let mut s = dataplane::synth::cluster(30, 3);
    s.node.service_cidrs = vec![
        "172.16.0.0/12".parse().unwrap(),
        "192.168.7.5/32".parse().unwrap(),
        "fd00:30::/108".parse().unwrap(),
    ];
    s.node.node_port_addresses = NodePortAddresses::Cidrs(vec![
        "192.168.0.2/32".parse().unwrap(),
        "192.168.9.0/24".parse().unwrap(),
        "2001:db8::1/128".parse().unwrap(),
    ]);
    let name = ServicePortName::new("bench", "svc-3", "http", Protocol::Tcp);
    let svc = s.services.get_mut(&(name.clone(), IpFamily::V4)).unwrap();
    svc.node_port = 30080;
    svc.external_ips = vec![ip("192.168.99.11")];
    svc.load_balancer_ips = vec![ip("203.0.113.7")];
    // One range holds the node's address: the load-balancer IP is admitted as a source too.
    svc.load_balancer_source_ranges = vec![
        "198.51.100.0/24".parse().unwrap(),
        "198.51.100.128/25".parse().unwrap(),
        format!("{}/16", s.node.node_ips[0]).parse().unwrap(),
    ];
    let udp = ServicePortName::new("bench", "dns", "dns", Protocol::Udp);
    let mut dns = ServicePort::cluster(udp.clone(), ip("172.16.0.53"), 53);
    dns.node_port = 30053;
    dns.external_traffic_policy = TrafficPolicy::Local;
    dns.load_balancer_ips = vec![ip("203.0.113.53")];
    s.services.insert((udp.clone(), IpFamily::V4), dns);
    s.endpoints.insert(
        udp,
        vec![Endpoint {
            node_name: Some(s.node.name.as_str().into()),
            ..Endpoint::ready(ip("10.9.0.53"), 5353)
        }]
        .into(),
    );
    let v6 = ServicePortName::new("bench", "web6", "https", Protocol::Tcp);
    let mut web6 = ServicePort::cluster(v6.clone(), ip("fd00:30::10"), 443);
    web6.family = IpFamily::V6;
    web6.node_port = 30443;
    s.services.insert((v6.clone(), IpFamily::V6), web6);
    s.endpoints.insert(
        v6,
        vec![
            Endpoint::ready(ip("fd10::1"), 8443),
            Endpoint::ready(ip("fd10::2:0:1"), 8443),
        ]
        .into(),
    );
    // A service without endpoints: no-endpoint verdicts.
    let empty = ServicePortName::new("bench", "empty", "", Protocol::Tcp);
    let mut e = ServicePort::cluster(empty.clone(), ip("172.16.0.99"), 81);
    e.node_port = 30081;
    s.services.insert((empty, IpFamily::V4), e);
    s
}

/// A namespace of the test's own, deleted on drop even when the test fails; `None` (a skip)
/// without root.
struct Namespace(String);

impl Namespace {
    fn create(tag: &str) -> Option<Namespace> {
        netns::create_or_skip(tag).map(Namespace)
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        netns::delete_namespace(&self.0);
    }
}

#[test]
fn netlink_reads_what_nft_lists_and_what_was_written() {
    let Some(guard) = Namespace::create("listing") else {
        return;
    };
    let ns = guard.0.clone();
    let snap = snapshot();
    let (via_netlink, via_json, empty) = netns::in_netns(&ns, || {
        let mut nft = NftKernel::default();
        let empty = nft.read().expect("netlink read of an empty kernel");
        nft.apply(&NftBackend::<NftKernel>::render(&snap))
            .expect("programming the table");
        let netlink = nft.read().expect("netlink read");
        let (again, generation) = dataplane::nft::kernel::read_kernel().expect("read_kernel");
        let consistent = generation.is_some();
        assert!(consistent, "nothing committed during the read");
        assert_eq!(again, netlink);
        let json = dataplane::nft::kernel::read_with_nft("nft").expect("nft -j list");
        Ok((netlink, json, empty))
    })
    .expect("in the namespace");
    assert_eq!(empty, Ruleset::default(), "no tables yet");
    assert_eq!(via_netlink.tables.len(), 2);
    for family in IpFamily::ALL {
        let (n, j) = (
            via_netlink.table(family).unwrap(),
            via_json.table(family).unwrap(),
        );
        for (name, set) in &j.sets {
            assert_eq!(n.sets.get(name), Some(set), "{family} set {name}");
        }
        assert_eq!(n.sets.len(), j.sets.len(), "{family} sets");
        assert_eq!(n.chains.len(), j.chains.len(), "{family} chains");
        for (name, c) in &j.chains {
            let got = &n.chains[name];
            assert_eq!(
                (got.hook.is_some(), got.rules.len(), &got.fingerprint),
                (c.hook.is_some(), c.rules.len(), &c.fingerprint),
                "{family} chain {name}"
            );
        }
    }
    // And it is what was written: nothing to do against the desired state.
    let (want, _) = plan::desired(&snap, &Ruleset::default());
    let tx = diff(&via_netlink, &want, false);
    assert!(
        tx.is_empty(),
        "read back differs from written:\n{}",
        tx.to_nft()
    );
    let v4 = via_netlink.table(IpFamily::V4).unwrap();
    assert!(v4.sets[plan::SET_SERVICE_CIDRS]
        .elements
        .contains_key("172.16.0.0/12"));
    assert!(v4.sets[plan::MAP_NODEPORT_BACKENDS]
        .elements
        .contains_key("udp . 30053 . 0"));
    let allow = &v4.sets[plan::SET_FIREWALL_ALLOW].elements;
    for key in [
        "203.0.113.7 . tcp . 80 . 198.51.100.0/24",
        "203.0.113.7 . tcp . 80 . 203.0.113.7",
    ] {
        assert!(
            allow.contains_key(key),
            "firewall-allow holds {key}: {allow:?}"
        );
    }
    assert_eq!(allow.len(), 3, "nested ranges merged: {allow:?}");
    // externalTrafficPolicy Local: the short-circuit maps read back too.
    for (map, key) in [
        (plan::MAP_SHORTCUT_IPS, "203.0.113.53 . udp . 53"),
        (plan::MAP_SHORTCUT_BACKENDS, "203.0.113.53 . udp . 53 . 0"),
        (plan::MAP_SHORTCUT_NODEPORTS, "udp . 30053"),
        (plan::MAP_NODEPORT_SHORTCUT_BACKENDS, "udp . 30053 . 0"),
    ] {
        assert!(
            v4.sets[map].elements.contains_key(key),
            "{map} holds {key}: {:?}",
            v4.sets[map].elements
        );
    }
}

/// Lists a table's rules as nft prints them.
fn listed(family: &str) -> String {
    let out = std::process::Command::new("nft")
        .args(["list", "table", family, "switchyard"])
        .output()
        .expect("running nft");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// nft 1.0.6 slips a `meta l4proto tcp` match into the first rule of a run that uses a
/// backends map (it prints as `tcp dport` in the DNAT rule), which silently stops UDP
/// services behind that chain. Neither a fresh table nor a later transaction that adds a
/// load-balancing chain may carry one.
#[test]
fn no_dnat_rule_gets_a_hidden_tcp_match() {
    let Some(guard) = Namespace::create("anchor") else {
        return;
    };
    let ns = guard.0.clone();
    let before = snapshot();
    let mut after = before.clone();
    let udp = ServicePortName::new("bench", "dns7", "dns", Protocol::Udp);
    let mut svc = ServicePort::cluster(udp.clone(), ip("172.16.0.57"), 53);
    svc.node_port = 30057;
    after.services.insert((udp.clone(), IpFamily::V4), svc);
    after.endpoints.insert(
        udp,
        (1..=7)
            .map(|i| Endpoint::ready(ip(&format!("10.57.0.{i}")), 53))
            .collect(),
    );
    netns::in_netns(&ns, || {
        let mut nft = NftKernel::default();
        nft.apply(&NftBackend::<NftKernel>::render(&before))
            .expect("programming the table");
        for family in ["ip", "ip6"] {
            let text = listed(family);
            assert!(text.contains("dnat"), "{text}");
            assert!(!text.contains("tcp dport . numgen"), "{family}:\n{text}");
        }
        let kernel = nft.read().expect("read");
        let (want, _) = plan::desired(&after, &kernel);
        let tx = diff(&kernel, &want, false);
        let script = tx.to_nft();
        assert!(
            script.contains("add chain ip switchyard cluster-7"),
            "{script}"
        );
        nft.apply(&tx).expect("adding the 7-endpoint service");
        let text = listed("ip");
        assert!(text.contains("numgen random mod 7"), "{text}");
        assert!(!text.contains("tcp dport . numgen"), "{text}");
        assert!(
            !text.contains("tx-anchor"),
            "the anchor chain is gone: {text}"
        );
        Ok(())
    })
    .expect("in the namespace");
}

#[test]
fn element_batches_commit_exactly_or_not_at_all() {
    let Some(guard) = Namespace::create("batch") else {
        return;
    };
    let ns = guard.0.clone();
    let before = snapshot();
    let mut after = before.clone();
    // Same endpoint counts, other addresses, both families: elements only.
    let name = ServicePortName::new("bench", "svc-3", "http", Protocol::Tcp);
    dataplane::model::edit_endpoints(after.endpoints.get_mut(&name).unwrap(), |e| {
        e[1].ip = ip("10.77.0.1")
    });
    let v6 = ServicePortName::new("bench", "web6", "https", Protocol::Tcp);
    dataplane::model::edit_endpoints(after.endpoints.get_mut(&v6).unwrap(), |e| {
        e[0].ip = ip("fd10::77")
    });
    let dns = ServicePortName::new("bench", "dns", "dns", Protocol::Udp);
    dataplane::model::edit_endpoints(after.endpoints.get_mut(&dns).unwrap(), |e| {
        e[0].ip = ip("10.9.0.54")
    });
    netns::in_netns(&ns, || {
        let mut nft = NftKernel::default();
        nft.apply(&NftBackend::<NftKernel>::render(&before))
            .expect("programming the table");
        let kernel = nft.read().expect("read");
        let (want, _) = plan::desired(&after, &kernel);
        let tx = diff(&kernel, &want, false);
        assert!(
            tx.ops.iter().all(|op| matches!(
                op,
                dataplane::nft::diff::Op::AddElements { .. }
                    | dataplane::nft::diff::Op::DeleteElements { .. }
            )),
            "expected an element-only change:\n{}",
            tx.to_nft()
        );
        nft.apply(&tx).expect("the batch commits");
        let got = nft.read().expect("read back");
        let left = diff(&got, &want, false);
        assert!(
            left.is_empty(),
            "after the batch, still to do:\n{}",
            left.to_nft()
        );

        // A batch the kernel must refuse (deleting what is not there) changes nothing.
        let mut bad = diff(&got, &plan::desired(&before, &got).0, false);
        bad.ops.push(dataplane::nft::diff::Op::DeleteElements {
            family: IpFamily::V4,
            set: plan::SET_CLUSTER_IPS.into(),
            keys: vec!["172.31.255.254".into()],
        });
        assert!(nft.apply(&bad).is_err());
        assert_eq!(nft.read().expect("read after refusal"), got);
        Ok(())
    })
    .expect("in the namespace");
}

/// The periodic check skips reading the kernel back when only our own commits happened
/// since it last matched, which rests on the kernel moving its generation by exactly one
/// per commit: for batches of elements and of chains alike, and on every commit of anyone
/// else.
#[test]
fn our_commits_keep_the_kernel_proven_unchanged_and_anyone_elses_do_not() {
    let Some(guard) = Namespace::create("gen") else {
        return;
    };
    let ns = guard.0.clone();
    let before = snapshot();
    let name = ServicePortName::new("bench", "svc-3", "http", Protocol::Tcp);
    let key = [("bench".to_string(), "svc-3".to_string())].into();
    netns::in_netns(&ns, || {
        use dataplane::backend::{Backend, Scope};
        let nft = |args: &[&str]| {
            let out = std::process::Command::new("nft")
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "nft {args:?}: {out:?}");
        };
        let mut be = NftBackend::new(NftKernel::default());
        let r = be.sync(&before, Scope::RepairAll).expect("first sync");
        assert!(r.stats.operations() > 10, "{}", r.summary());
        assert!(be.kernel_unchanged(), "read, then one commit");

        // Same endpoint count: a netlink element batch.
        let mut moved = before.clone();
        dataplane::model::edit_endpoints(moved.endpoints.get_mut(&name).unwrap(), |e| {
            e[1].ip = ip("10.77.0.1")
        });
        let r = be.sync(&moved, Scope::Services(&key)).expect("batch");
        assert!(
            r.stats.elements_added > 0 && r.stats.chains_written == 0,
            "{r:?}"
        );
        assert!(be.kernel_unchanged(), "after an element batch");

        // One endpoint more: the service's chain is rewritten too.
        let mut grown = moved.clone();
        dataplane::model::edit_endpoints(grown.endpoints.get_mut(&name).unwrap(), |e| {
            e.push(Endpoint::ready(ip("10.77.0.2"), 8080))
        });
        let r = be.sync(&grown, Scope::Services(&key)).expect("chain");
        assert!(r.stats.chains_written > 0, "{r:?}");
        assert!(be.kernel_unchanged(), "after a batch of several operations");

        // Someone else's commit, to another table: only a read can tell.
        nft(&["add", "table", "ip", "someone-else"]);
        assert!(!be.kernel_unchanged(), "a foreign commit");
        let r = be.sync(&grown, Scope::RepairAll).expect("full sync");
        assert!(!r.drift, "the other table is not ours: {}", r.summary());
        assert!(be.kernel_unchanged(), "a full sync re-reads");

        // Someone deletes one of our elements: seen, and the full sync repairs it.
        nft(&[
            "delete",
            "element",
            "ip",
            "switchyard",
            plan::SET_CLUSTER_IPS,
            "{ 172.16.0.99 }",
        ]);
        assert!(!be.kernel_unchanged(), "a deletion in our table");
        let r = be.sync(&grown, Scope::RepairAll).expect("repair");
        assert!(r.drift && r.stats.elements_added > 0, "{}", r.summary());
        assert!(be.kernel_unchanged());
        Ok(())
    })
    .expect("in the namespace");
}

/// The real kernel behind an executor that refuses every IPv6 transaction, as a node
/// without IPv6 nf_tables would.
struct NoIpv6(NftKernel);

impl NftExecutor for NoIpv6 {
    fn read(&mut self) -> Result<Ruleset, dataplane::nft::kernel::NftError> {
        self.0.read()
    }
    fn apply(
        &mut self,
        tx: &dataplane::nft::diff::Transaction,
    ) -> Result<(), dataplane::nft::kernel::NftError> {
        if tx.families().contains(&IpFamily::V6) {
            return Err(dataplane::nft::kernel::NftError::Rejected {
                ops: tx.ops.len(),
                reason: "no IPv6 tables on this node".into(),
            });
        }
        self.0.apply(tx)
    }
    fn look_up(
        &mut self,
        family: IpFamily,
        set: &str,
        keys: &[&str],
    ) -> Result<dataplane::nft::getelem::Found, dataplane::nft::kernel::NftError> {
        self.0.look_up(family, set, keys)
    }
}

/// A kernel that refuses one family's table still gets the other family programmed, and
/// the error names the family that failed.
#[test]
fn one_family_refused_leaves_the_other_programmed() {
    let Some(guard) = Namespace::create("family") else {
        return;
    };
    let snap = snapshot();
    let ns = guard.0.clone();
    let (err, kernel) = netns::in_netns(&ns, move || {
        use dataplane::backend::Backend;
        let mut be = NftBackend::new(NoIpv6(NftKernel::default()));
        let err = be
            .sync(&snap, dataplane::backend::Scope::AllServices)
            .unwrap_err();
        Ok((err.to_string(), NftKernel::default().read().unwrap()))
    })
    .unwrap();
    assert!(
        err.contains("IPv6") && err.contains("no IPv6 tables"),
        "{err}"
    );
    assert!(kernel.table(IpFamily::V6).is_none());
    let v4 = kernel
        .table(IpFamily::V4)
        .expect("the IPv4 table is programmed");
    assert!(v4.sets[plan::MAP_SERVICE_IPS]
        .elements
        .contains_key("172.16.0.53 . udp . 53"));
}

/// One family's `switchyard` table as the kernel dumps it: each set's and chain's
/// attributes (handles, ids and use counts left out), and each chain's rules (expressions
/// and user data) in order.
#[derive(Debug, PartialEq, Eq)]
struct Raw {
    sets: BTreeMap<String, Vec<(u16, Vec<u8>)>>,
    chains: BTreeMap<String, Vec<(u16, Vec<u8>)>>,
    rules: BTreeMap<String, Vec<RawRule>>,
}

/// A rule's expressions and user data.
type RawRule = (Vec<u8>, Vec<u8>);

fn raw_table(family: IpFamily) -> Raw {
    use dataplane::netlink::*;
    let mut socket = Socket::open(NETLINK_NETFILTER, "nfnetlink").unwrap();
    let mut table = Vec::new();
    push_attr(&mut table, NFTA_TABLE_NAME, &cstr("switchyard"));
    let mut dump = |msg: u16| {
        let request = Request::nfnl(
            NFNL_SUBSYS_NFTABLES,
            msg,
            NLM_F_DUMP,
            nfproto(family),
            &table,
        );
        socket.request("dump", &request).unwrap()
    };
    let keep = |body: &[u8], skip: &[u16]| -> (String, Vec<(u16, Vec<u8>)>) {
        let name = find(body, 2)
            .or_else(|| find(body, 3))
            .map(text)
            .unwrap_or_default();
        let attrs = attrs(body)
            .filter(|a| !skip.contains(&a.kind))
            .map(|a| (a.kind, a.data.to_vec()))
            .collect();
        (name, attrs)
    };
    let mut raw = Raw {
        sets: BTreeMap::new(),
        chains: BTreeMap::new(),
        rules: BTreeMap::new(),
    };
    for body in dump(NFT_MSG_GETSET) {
        // NFTA_SET_ID, NFTA_SET_HANDLE.
        let (_, attrs) = keep(&body, &[10, 16]);
        let name = find(&body, NFTA_SET_NAME).map(text).unwrap_or_default();
        raw.sets.insert(name, attrs);
    }
    for body in dump(NFT_MSG_GETCHAIN) {
        // NFTA_CHAIN_HANDLE, NFTA_CHAIN_USE, NFTA_CHAIN_COUNTERS, NFTA_CHAIN_ID.
        let (_, attrs) = keep(&body, &[2, 6, 8, 11]);
        let name = find(&body, NFTA_CHAIN_NAME).map(text).unwrap_or_default();
        raw.chains.insert(name, attrs);
    }
    for body in dump(NFT_MSG_GETRULE) {
        let chain = find(&body, NFTA_RULE_CHAIN).map(text).unwrap_or_default();
        let exprs = find(&body, NFTA_RULE_EXPRESSIONS)
            .unwrap_or_default()
            .to_vec();
        let udata = find(&body, NFTA_RULE_USERDATA).unwrap_or_default().to_vec();
        raw.rules.entry(chain).or_default().push((exprs, udata));
    }
    raw
}

/// A node configuration for every rule shape the skeleton has: each local-traffic
/// detector, masquerade-all, node-port addresses from CIDRs.
fn node_variants() -> Vec<(&'static str, Snapshot)> {
    let base = snapshot();
    let with = |f: &dyn Fn(&mut NodeConfig)| {
        let mut s = base.clone();
        f(&mut s.node);
        s
    };
    vec![
        ("default", base.clone()),
        (
            "two pod CIDRs per family",
            with(&|n| {
                n.local_detector = LocalDetector::Cidrs(vec![
                    "10.244.0.0/16".parse().unwrap(),
                    "10.96.0.0/12".parse().unwrap(),
                    "fd44::/64".parse().unwrap(),
                    "fd45::/108".parse().unwrap(),
                ])
            }),
        ),
        (
            "one pod CIDR off a byte boundary",
            with(&|n| {
                n.local_detector = LocalDetector::Cidrs(vec![
                    "10.96.0.0/12".parse().unwrap(),
                    "fd45::/108".parse().unwrap(),
                ])
            }),
        ),
        (
            "bridge",
            with(&|n| n.local_detector = LocalDetector::Bridge("cbr0".into())),
        ),
        (
            "interface prefix",
            with(&|n| n.local_detector = LocalDetector::InterfacePrefix("veth".into())),
        ),
        (
            "masquerade all, node ports on every address",
            with(&|n| {
                n.masquerade_all = true;
                n.node_port_addresses = NodePortAddresses::All;
            }),
        ),
    ]
}

/// Lists one family's table as nft prints it, or why it could not.
fn nft_list(family: &str) -> Result<String, String> {
    let out = std::process::Command::new("nft")
        .args(["list", "table", family, "switchyard"])
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Everything nftables mode writes goes over netlink, and it is what nft 1.0.6 writes for
/// the same transaction text: the same set declarations and user data, the same chains,
/// the same expressions register for register, so that `nft list` prints both alike and
/// the netlink reader reads both alike.
#[test]
fn netlink_writes_what_nft_writes() {
    for (what, mut snap) in node_variants() {
        // nft 1.0.6 cannot write IPv6 session affinity (see the next test): IPv4 only.
        let name = ServicePortName::new("bench", "svc-3", "http", Protocol::Tcp);
        snap.services
            .get_mut(&(name, IpFamily::V4))
            .unwrap()
            .session_affinity = SessionAffinity::ClientIp {
            timeout_seconds: 600,
        };
        let tx = NftBackend::<NftKernel>::render(&snap);
        let (Some(ours), Some(theirs)) = (
            Namespace::create("wire-ours"),
            Namespace::create("wire-nft"),
        ) else {
            return;
        };
        let (ours_raw, ours_read, ours_text) = netns::in_netns(&ours.0, || {
            NftKernel::default()
                .apply(&tx)
                .expect("the netlink batch commits");
            let raw: Vec<Raw> = IpFamily::ALL.iter().map(|f| raw_table(*f)).collect();
            let text: Vec<Result<String, String>> = ["ip", "ip6"].map(nft_list).to_vec();
            Ok((raw, NftKernel::default().read().unwrap(), text))
        })
        .unwrap();
        let script = tx.to_nft();
        let (nft_raw, nft_read, nft_text) = netns::in_netns(&theirs.0, || {
            let out = dataplane::process::run("nft", &["-f", "-"], Some(&script)).unwrap();
            assert!(out.success, "{what}: nft -f: {}", out.stderr);
            let raw: Vec<Raw> = IpFamily::ALL.iter().map(|f| raw_table(*f)).collect();
            let text: Vec<Result<String, String>> = ["ip", "ip6"].map(nft_list).to_vec();
            Ok((raw, NftKernel::default().read().unwrap(), text))
        })
        .unwrap();
        assert_eq!(ours_text, nft_text, "{what}: nft lists them alike");
        assert!(ours_text.iter().all(Result::is_ok), "{what}: {ours_text:?}");
        assert_eq!(
            ours_read, nft_read,
            "{what}: the netlink reader reads them alike"
        );
        for (o, n) in ours_raw.iter().zip(&nft_raw) {
            assert_eq!(o.chains, n.chains, "{what}: chains");
            assert_eq!(
                o.sets.keys().collect::<Vec<_>>(),
                n.sets.keys().collect::<Vec<_>>(),
                "{what}: sets"
            );
            for (set, attrs) in &n.sets {
                assert_eq!(&o.sets[set], attrs, "{what}: set {set}");
            }
            for (chain, rules) in &n.rules {
                assert_eq!(&o.rules[chain], rules, "{what}: rules of {chain}");
            }
            assert_eq!(o.rules.len(), n.rules.len(), "{what}: chains with rules");
        }
    }
}

/// nft 1.0.6 aborts on an IPv6 session-affinity chain (`netlink_gen_expr: Assertion 'dreg <
/// ctx->reg_low' failed`; the IPv4 one goes in), which
/// failed the whole sync of a dual-stack node with one such service. The kernel itself
/// takes it: written over netlink, it reads back as written.
#[test]
fn ipv6_session_affinity_is_written_where_nft_could_not() {
    let Some(guard) = Namespace::create("affinity6") else {
        return;
    };
    let mut snap = snapshot();
    let v6 = ServicePortName::new("bench", "web6", "https", Protocol::Tcp);
    snap.services
        .get_mut(&(v6, IpFamily::V6))
        .unwrap()
        .session_affinity = SessionAffinity::ClientIp {
        timeout_seconds: 10800,
    };
    let tx = NftBackend::<NftKernel>::render(&snap);
    assert!(tx.to_nft().contains("ip6 saddr . ct original ip6 daddr"));
    let kernel = netns::in_netns(&guard.0, || {
        NftKernel::default().apply(&tx).expect("the batch commits");
        Ok(NftKernel::default().read().unwrap())
    })
    .unwrap();
    let (want, _) = plan::desired(&snap, &Ruleset::default());
    let left = diff(&kernel, &want, false);
    assert!(left.is_empty(), "still to do:\n{}", left.to_nft());
    assert!(kernel
        .table(IpFamily::V6)
        .unwrap()
        .chains
        .contains_key("affinity-10800"));
}

/// `nft`'s change listener on a thread of its own, started from (so in the namespace of)
/// the calling thread, once it listens; one message per wake-up.
fn listen(nft: &NftKernel) -> std::sync::mpsc::Receiver<()> {
    use std::time::Duration;
    let subscribe = nft.change_notifications().expect("a listener");
    let (woke, wakes) = std::sync::mpsc::channel();
    let (ready, listening) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut wait = subscribe().expect("subscribed");
        ready.send(()).unwrap();
        while wait().is_ok() {
            if woke.send(()).is_err() {
                return;
            }
        }
    });
    listening
        .recv_timeout(Duration::from_secs(5))
        .expect("listening");
    wakes
}

/// Our own commits do not wake our change listener: it leaves the notification group while
/// a large one runs, so the kernel builds no notification per element for it, and knows a
/// small one by our socket's port. Anyone else's commit to our table still wakes it.
#[test]
fn our_commits_do_not_wake_our_listener_and_anyone_elses_do() {
    use std::time::Duration;
    let Some(guard) = Namespace::create("listener") else {
        return;
    };
    let snap = snapshot();
    netns::in_netns(&guard.0, || {
        let mut nft = NftKernel::default();
        let wakes = listen(&nft);
        nft.apply(&NftBackend::<NftKernel>::render(&snap))
            .expect("programming the table");
        assert!(
            wakes.recv_timeout(Duration::from_millis(500)).is_err(),
            "our own commit woke the listener"
        );
        let foreign = |verb: &str| {
            let out = dataplane::process::run(
                "nft",
                &[&format!(
                    "{verb} element ip switchyard cluster-ips {{ 172.31.0.1 }}"
                )],
                None,
            )
            .unwrap();
            assert!(out.success, "{}", out.stderr);
        };
        foreign("add");
        wakes
            .recv_timeout(Duration::from_secs(5))
            .expect("a foreign commit to our table wakes the listener");
        // The listener is back in the group after every commit of ours.
        nft.apply(&NftBackend::<NftKernel>::render(&snap))
            .expect("a commit with nothing new");
        assert!(wakes.recv_timeout(Duration::from_millis(500)).is_err());
        foreign("delete");
        wakes
            .recv_timeout(Duration::from_secs(5))
            .expect("a second foreign commit wakes the listener");
        Ok(())
    })
    .unwrap();
}

/// What lets the periodic check skip reading 100k elements back: commits by others to their
/// own tables, seen by our listener, leave our tables known unchanged, across commits of
/// ours both large (the listener out of the group) and small (announced to it); a commit by
/// someone else to our table does not, nor do later ones. The real listener, the real
/// kernel's notifications and generations, and `nft` as the other program.
#[test]
fn commits_elsewhere_keep_our_tables_known_unchanged_and_one_to_ours_does_not() {
    use dataplane::backend::{Backend, Scope};
    use std::time::{Duration, Instant};
    let Some(guard) = Namespace::create("generations") else {
        return;
    };
    netns::in_netns(&guard.0, || {
        let mut be = NftBackend::new(NftKernel::default());
        let wakes = listen(be.executor());
        let nft = |command: &str| {
            let out = dataplane::process::run("nft", &[command], None).unwrap();
            assert!(out.success, "nft {command}: {}", out.stderr);
        };
        // Within a bound: the listener sees a batch's end a moment after the commit.
        let soon_unchanged = |be: &mut NftBackend<NftKernel>| {
            let until = Instant::now() + Duration::from_secs(5);
            while !be.kernel_unchanged() {
                if Instant::now() > until {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            true
        };

        // A large first sync: thousands of elements, committed with the listener out.
        let mut snap = dataplane::synth::cluster(300, 10);
        let full = be.sync(&snap, Scope::RepairAll).expect("the first sync");
        assert!(full.stats.elements_added > 3000, "{:?}", full.stats);
        assert!(be.kernel_unchanged(), "only our commit since the read");
        nft("add table ip someone-else");
        assert!(soon_unchanged(&mut be), "a commit to another table");

        // A small commit of ours after another program's, announced to our listener: it
        // does not wake it, and, known by our socket's port, it is no change.
        nft("add chain ip someone-else input");
        let name = ServicePortName::new("bench", "svc-7", "http", Protocol::Tcp);
        dataplane::model::edit_endpoints(snap.endpoints.get_mut(&name).unwrap(), |eps| {
            eps.pop();
        });
        let changed = [("bench".to_string(), "svc-7".to_string())].into();
        let small = be
            .sync(&snap, Scope::Services(&changed))
            .expect("a partial sync");
        assert!(!small.full && small.stats.operations() > 0);
        assert!(soon_unchanged(&mut be), "theirs elsewhere, then ours");
        nft("add chain ip someone-else output");
        assert!(soon_unchanged(&mut be), "and theirs again");
        assert!(
            wakes.recv_timeout(Duration::from_millis(300)).is_err(),
            "neither our own commit nor one elsewhere wakes the listener"
        );

        // Someone else changes our table: it wakes the listener, and from then on only a
        // read can tell, whatever else commits.
        nft("add element ip switchyard cluster-ips { 172.31.0.1 }");
        wakes
            .recv_timeout(Duration::from_secs(5))
            .expect("a commit to our table wakes the listener");
        assert!(!be.kernel_unchanged());
        nft("delete table ip someone-else");
        std::thread::sleep(Duration::from_millis(300));
        assert!(!be.kernel_unchanged(), "a later commit elsewhere");
        Ok(())
    })
    .unwrap();
}

/// A set over the read limit (at 100k services the 1M-element backends map, which the
/// kernel takes 40 s to dump) is not read back: a restarted agent flushes it and fills it
/// in its one commit (a netlink deletion naming no element, as `nft flush set`), and the
/// kernel then holds exactly what it wants, whatever someone else did to the map.
#[test]
fn a_set_too_large_to_read_back_is_flushed_and_filled_in_one_commit() {
    use dataplane::backend::{Backend, Scope};
    let Some(guard) = Namespace::create("flushfill") else {
        return;
    };
    let snap = snapshot();
    netns::in_netns(&guard.0, || {
        NftBackend::new(NftKernel::default())
            .sync(&snap, Scope::RepairAll)
            .expect("the first agent's sync");
        let want = NftKernel::default().read().unwrap();
        let map = &want.table(IpFamily::V4).unwrap().sets[plan::MAP_BACKENDS].elements;
        assert!(map.len() > 20, "{}", map.len());
        let (key, value) = map.iter().next().unwrap();
        let key = key.text();
        let (front, _) = key.rsplit_once(" . ").unwrap();
        let nft = |command: String| {
            let out = dataplane::process::run("nft", &[&command], None).unwrap();
            assert!(out.success, "{command}: {}", out.stderr);
        };
        nft(format!("delete element ip switchyard backends {{ {key} }}"));
        nft(format!(
            "add element ip switchyard backends {{ {front} . 99 : {} }}",
            value.unwrap()
        ));

        let mut restarted = NftBackend::new(NftKernel::default()).with_read_limit(20);
        restarted
            .sync(&snap, Scope::RepairAll)
            .expect("the restarted agent's sync");
        assert_eq!(NftKernel::default().read().unwrap(), want);
        // Again, with nothing to change: read whole, that would commit nothing; the map
        // left unread is flushed and filled, one commit.
        let generation = || NftKernel::default().generation().unwrap().unwrap();
        let before = generation();
        restarted.sync(&snap, Scope::RepairAll).expect("a repair");
        assert_eq!(generation(), before.wrapping_add(1));
        assert_eq!(NftKernel::default().read().unwrap(), want);
        Ok(())
    })
    .unwrap();
}

/// A pod CIDR of the whole address space (`0.0.0.0/0`, `::/0`) compares no bytes at all,
/// which the kernel refuses as a zero-length load: it is written as one byte masked to
/// nothing, and the table goes in, with every source local.
#[test]
fn a_local_detector_of_every_address_programs() {
    let Some(guard) = Namespace::create("everyaddr") else {
        return;
    };
    let mut snap = snapshot();
    snap.node.local_detector =
        LocalDetector::Cidrs(vec!["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()]);
    let tx = NftBackend::<NftKernel>::render(&snap);
    assert!(tx
        .to_nft()
        .contains("ip saddr != 0.0.0.0/0 jump mark-for-masquerade"));
    let kernel = netns::in_netns(&guard.0, || {
        let mut nft = NftKernel::default();
        nft.apply(&tx).expect("the batch commits");
        Ok(nft.read().unwrap())
    })
    .unwrap();
    let (want, _) = plan::desired(&snap, &Ruleset::default());
    let left = diff(&kernel, &want, false);
    assert!(left.is_empty(), "still to do:\n{}", left.to_nft());
}

/// Sets past `sizing::UNSIZED_UP_TO` elements are declared with a size (the kernel then
/// allocates their hash at once instead of growing it under the commit), as nft lists it.
/// The kernel refuses elements past a set's size, so a change that outgrows it lays the table
/// out anew, larger, in the same commit; a restart reads the size back and keeps it.
#[test]
fn large_sets_get_a_size_and_outgrowing_it_replaces_the_table_in_one_commit() {
    use dataplane::backend::{Backend, Scope};
    let Some(guard) = Namespace::create("sized") else {
        return;
    };
    // 1,000 services x 5 endpoints: 5,000 backend slots.
    let small = dataplane::synth::cluster(1000, 5);
    let name = ServicePortName::new("bench", "svc-0", "http", Protocol::Tcp);
    let with = |n: usize| {
        let mut s = small.clone();
        let eps = (0..n)
            .map(|j| Endpoint {
                node_name: Some("node-1".into()),
                ..Endpoint::ready(dataplane::synth::endpoint_ip(0, 0, j as u32 + 1), 8080)
            })
            .collect();
        s.endpoints.insert(name.clone(), eps);
        s
    };
    let changed = [("bench".to_string(), "svc-0".to_string())].into();
    let size = || {
        NftKernel::default()
            .read()
            .unwrap()
            .table(IpFamily::V4)
            .unwrap()
            .sets[plan::MAP_BACKENDS]
            .size
    };
    let generation = || NftKernel::default().generation().unwrap().unwrap();
    netns::in_netns(&guard.0, || {
        let mut be = NftBackend::new(NftKernel::default());
        be.sync(&small, Scope::AllServices).expect("the first sync");
        assert_eq!(size(), Some(12_288));
        let text = listed("ip");
        assert!(text.contains("size 12288"), "{text}");

        // 5,000 - 5 + 10,000 slots: past the size. One commit replaces the table.
        let before = generation();
        be.sync(&with(10_000), Scope::Services(&changed))
            .expect("the sync that outgrows the map");
        assert_eq!(generation(), before.wrapping_add(1));
        assert_eq!(size(), Some(24_576));
        let read = NftKernel::default().read().unwrap();
        let (want, _) = plan::desired(&with(10_000), &Ruleset::default());
        assert_eq!(
            read.table(IpFamily::V4).unwrap().sets[plan::MAP_BACKENDS].elements,
            want.table(IpFamily::V4).unwrap().sets[plan::MAP_BACKENDS].elements
        );

        // Back to 5,000 in place: the size stays; laid out fresh it would be 12,288.
        be.sync(&small, Scope::Services(&changed))
            .expect("the shrink");
        assert_eq!(size(), Some(24_576));
        // A restarted agent reads the size back and finds nothing to change.
        let before = generation();
        NftBackend::new(NftKernel::default())
            .sync(&small, Scope::AllServices)
            .expect("the restarted agent's sync");
        assert_eq!(generation(), before, "the restart committed");
        Ok(())
    })
    .unwrap();
}

/// Runs `nft` with `args` in the calling thread's namespace, as someone else would.
fn foreign_nft(args: &[&str]) {
    let out = std::process::Command::new("nft")
        .args(args)
        .output()
        .expect("running nft");
    assert!(out.status.success(), "nft {args:?}: {out:?}");
}

/// A check of sets too large to read back looks each element we committed up in the real
/// kernel (`NftBackend::check_step`): a kernel that holds them all passes, and someone
/// else's deletion or change of one element is found, named, by the lookups alone.
#[test]
fn a_check_looks_up_the_elements_of_sets_too_large_to_read_back() {
    use dataplane::backend::{Backend, CheckStep, Scope};
    let Some(guard) = Namespace::create("lookup") else {
        return;
    };
    let snap = snapshot();
    netns::in_netns(&guard.0, move || {
        // 30 services x 3 endpoints and more: about 100 slots per family, over a limit of 50.
        let mut be = NftBackend::new(NftKernel::default()).with_read_limit(50);
        be.sync(&snap, Scope::AllServices).expect("the sync");
        let check = |be: &mut NftBackend<NftKernel>| -> Vec<String> {
            let read = be.begin_check().expect("a check")().expect("the read");
            assert!(be.finish_check(read));
            loop {
                let step = be.check_step(std::time::Duration::ZERO);
                match step.expect("lookups in hand").expect("the lookups") {
                    CheckStep::More => continue,
                    CheckStep::Done(r) => return r.differences,
                }
            }
        };
        assert_eq!(check(&mut be), Vec::<String>::new());

        // More keys than one request asks for, one of them not in the map: each answered
        // where it was asked.
        let kernel = NftKernel::default().read().expect("a read");
        let map = &kernel.table(IpFamily::V4).unwrap().sets[plan::MAP_BACKENDS].elements;
        assert!(map.len() > 64, "{}", map.len());
        let absent = "172.16.250.1 . tcp . 80 . 0";
        let texts: Vec<String> = map.keys().map(|k| k.text()).collect();
        let mut keys: Vec<&str> = texts.iter().map(String::as_str).collect();
        keys.insert(40, absent);
        let found = NftKernel::default()
            .look_up(IpFamily::V4, plan::MAP_BACKENDS, &keys)
            .expect("the lookups");
        let want: Vec<Option<Option<String>>> = keys
            .iter()
            .map(|k| map.text_of(k))
            .collect();
        assert_eq!(found, want);
        assert_eq!(found[40], None);

        // Someone else deletes one element: found, and a full sync repairs.
        let (gone, _) = map.iter().nth(70).unwrap();
        foreign_nft(&[
            "delete",
            "element",
            "ip",
            "switchyard",
            plan::MAP_BACKENDS,
            &format!("{{ {gone} }}"),
        ]);
        assert_eq!(
            check(&mut be),
            [format!("{} set backends: element {gone} missing", IpFamily::V4)]
        );
        be.sync(&snap, Scope::RepairAll).expect("the repair");
        assert_eq!(check(&mut be), Vec::<String>::new());

        // Someone else points one slot elsewhere.
        let (moved, _) = map.iter().nth(5).unwrap();
        foreign_nft(&[&format!(
            "delete element ip switchyard backends {{ {moved} }}; add element ip switchyard backends {{ {moved} : 10.9.9.9 . 80 }}"
        )]);
        assert_eq!(
            check(&mut be),
            [format!("{} set backends: element {moved} changed", IpFamily::V4)]
        );
        Ok(())
    })
    .expect("in the namespace");
}
