//! iptables mode beside other tools, on a real kernel in a namespace, for iptables-nft and
//! iptables-legacy: Docker-like chains and rules and a built-in chain's policy survive
//! `switchyard sync` and `cleanup`; our jumps sit above theirs, once; a stale service chain
//! left by an earlier run is deleted; cleanup removes every chain of ours and nothing else
//! (but KUBE-FIREWALL, which kubelet shares).

#![allow(clippy::expect_used, clippy::unwrap_used)]
#![allow(dead_code)]

#[path = "rig/netns.rs"]
mod netns;

use std::path::Path;

const CLUSTER: &str = r#"
apiVersion: v1
kind: Service
metadata: { name: web, namespace: ns }
spec: { clusterIP: 172.30.0.1, type: NodePort, ports: [{ name: http, port: 80, nodePort: 30080 }] }
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: web-1, namespace: ns, labels: { kubernetes.io/service-name: web } }
addressType: IPv4
ports: [{ name: http, port: 8080 }]
endpoints: [{ addresses: [10.0.0.1] }, { addresses: [10.0.0.2] }]
"#;

/// A namespace deleted on drop, even when the test fails.
struct Ns(String);

impl Drop for Ns {
    fn drop(&mut self) {
        netns::delete_namespace(&self.0);
    }
}

impl Ns {
    fn run(&self, program: &str, args: &[&str]) -> netns::CmdOutput {
        let mut all = vec!["netns", "exec", &self.0, program];
        all.extend_from_slice(args);
        netns::run("ip", &all, None, netns::CMD_TIMEOUT)
    }

    fn must(&self, program: &str, args: &[&str]) -> String {
        let out = self.run(program, args);
        assert!(out.success(), "{}", out.transcript());
        out.stdout
    }

    fn switchyard(&self, dir: &Path, variant: &str, args: &[&str]) -> String {
        let cfg = dir.join("kube-proxy.yaml").to_string_lossy().to_string();
        let manifests = dir.join("cluster.yaml").to_string_lossy().to_string();
        let mut all: Vec<&str> = args.to_vec();
        if args[0] != "cleanup" {
            all.extend(["--config", &cfg, "--manifests", &manifests]);
        }
        all.extend(["--iptables-backend", variant]);
        self.must(env!("CARGO_BIN_EXE_switchyard"), &all)
    }
}

impl Ns {
    /// A new namespace named after `what`; `None` (the test skips) when this machine
    /// cannot make one and SWITCHYARD_REQUIRE_NETNS is not 1.
    fn create(what: &str) -> Option<Ns> {
        netns::create_or_skip(&format!("ipt-{what}")).map(Ns)
    }
}

fn lines_of<'a>(save: &'a str, chain: &str) -> Vec<&'a str> {
    let prefix = format!("-A {chain} ");
    save.lines().filter(|l| l.starts_with(&prefix)).collect()
}

#[test]
fn iptables_mode_coexists_with_other_tools_on_both_back_ends() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cluster.yaml"), CLUSTER).unwrap();
    std::fs::write(
        dir.path().join("kube-proxy.yaml"),
        "kind: KubeProxyConfiguration\nmode: iptables\nhostnameOverride: node-a\nclusterCIDR: 10.0.0.0/8\n",
    )
    .unwrap();
    for variant in ["nft", "legacy"] {
        let Some(ns) = Ns::create(variant) else {
            return;
        };
        let ipt = format!("iptables-{variant}");
        let save = format!("iptables-{variant}-save");
        // Another tool's state: Docker's chains and jumps, a FORWARD policy of DROP, and a
        // service chain an earlier kube-proxy left behind.
        for args in [
            "-P FORWARD DROP",
            "-N DOCKER",
            "-A DOCKER -d 172.17.0.2/32 -p tcp --dport 80 -j ACCEPT",
            "-A FORWARD -j DOCKER",
            "-t nat -N DOCKER",
            "-t nat -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER",
            "-t nat -A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE",
            "-t nat -N KUBE-SEP-LEFTOVERLEFTOVER",
            "-t nat -A KUBE-SEP-LEFTOVERLEFTOVER -p tcp -j DNAT --to-destination 10.9.9.9:80",
        ] {
            ns.must(&ipt, &args.split(' ').collect::<Vec<_>>());
        }
        let foreign = |s: &str| {
            for want in [
                ":FORWARD DROP",
                "-A DOCKER -d 172.17.0.2/32 -p tcp -m tcp --dport 80 -j ACCEPT",
                "-A FORWARD -j DOCKER",
                "-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER",
                "-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE",
            ] {
                assert!(s.contains(want), "{variant}: {want:?} is gone:\n{s}");
            }
        };

        // Two syncs, each a new process and so a full one: jumps added once.
        ns.switchyard(dir.path(), variant, &["sync", "--once"]);
        ns.switchyard(dir.path(), variant, &["sync", "--once"]);
        let s = ns.must(&save, &[]);
        foreign(&s);
        assert!(!s.contains("LEFTOVER"), "{variant}: stale chain kept:\n{s}");
        assert!(
            s.contains("--to-destination 10.0.0.1:8080") && s.contains("--dport 30080"),
            "{variant}: our rules are missing:\n{s}"
        );
        let forward: Vec<&str> = lines_of(&s, "FORWARD");
        assert_eq!(
            forward
                .iter()
                .filter(|l| l.ends_with("-j KUBE-SERVICES"))
                .count(),
            1,
            "{variant}: {forward:#?}"
        );
        assert_eq!(
            forward.last().copied(),
            Some("-A FORWARD -j DOCKER"),
            "{variant}: ours go above the others: {forward:#?}"
        );
        let prerouting = lines_of(&s, "PREROUTING");
        assert!(
            prerouting[0].ends_with("-j KUBE-SERVICES") && prerouting.len() == 2,
            "{variant}: {prerouting:#?}"
        );

        // The back end not chosen holds nothing of ours.
        let other = if variant == "nft" { "legacy" } else { "nft" };
        let other_save = ns.run(&format!("iptables-{other}-save"), &[]);
        assert!(
            !other_save.stdout.contains("KUBE-"),
            "{variant}: rules leaked into iptables-{other}:\n{}",
            other_save.stdout
        );

        let out = ns.switchyard(
            dir.path(),
            variant,
            &["cleanup", "--proxy-mode", "iptables"],
        );
        assert!(out.contains("iptables chains"), "{out}");
        let s = ns.must(&save, &[]);
        foreign(&s);
        // KUBE-FIREWALL (the guard for NodePorts on localhost) is kubelet's too, which
        // writes the same rule: it stays.
        let ours: Vec<&str> = s
            .lines()
            .filter(|l| l.contains("KUBE-") && !l.contains("KUBE-FIREWALL"))
            .collect();
        assert!(ours.is_empty(), "{variant}: cleanup left ours: {ours:#?}");
    }
}

/// `cleanup --kube-proxy` on a node kube-proxy ran on: its nftables tables and its iptables
/// chains (with the jumps to them, on both back ends) go; Docker's chains, another nft
/// table and Switchyard's own tables stay.
#[test]
fn cleanup_kube_proxy_removes_kube_proxys_leftovers_only() {
    let Some(ns) = Ns::create("kp") else {
        return;
    };
    let tables = "table ip kube-proxy {\n chain services { counter; }\n}\n\
                  table ip6 kube-proxy {\n chain services { counter; }\n}\n\
                  table inet filter {\n chain input { type filter hook input priority 0; policy accept; tcp dport 22 accept; }\n}\n\
                  table ip switchyard {\n chain services { counter; }\n}\n";
    let out = {
        let all = ["netns", "exec", &ns.0, "nft", "-f", "-"];
        netns::run("ip", &all, Some(tables), netns::CMD_TIMEOUT)
    };
    assert!(out.success(), "{}", out.transcript());
    for ipt in ["iptables-nft", "iptables-legacy"] {
        for rule in [
            "-t nat -N KUBE-SERVICES",
            "-t nat -N KUBE-SVC-XPGD46QRK7WJZT7O",
            "-t nat -N KUBE-MARK-MASQ",
            "-t nat -A KUBE-SERVICES -j KUBE-SVC-XPGD46QRK7WJZT7O",
            "-t nat -A PREROUTING -m comment --comment kubernetes-service-portals -j KUBE-SERVICES",
            "-t filter -N KUBE-FORWARD",
            "-t filter -A FORWARD -j KUBE-FORWARD",
            // kube-proxy's IPVS mode's own chains.
            "-t filter -N KUBE-IPVS-FILTER",
            "-t filter -A INPUT -j KUBE-IPVS-FILTER",
            "-t nat -N KUBE-NODE-PORT",
            "-t nat -N DOCKER",
            "-t nat -A DOCKER -j RETURN",
            "-t nat -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER",
        ] {
            let args: Vec<&str> = rule.split(' ').collect();
            ns.must(ipt, &args);
        }
    }
    // kube-proxy's IPVS mode binds service addresses to kube-ipvs0 (a dummy interface;
    // this kernel has no dummy driver, and the cleanup goes by name), beside one to keep.
    ns.must("ip", &["link", "add", "kube-ipvs0", "type", "bridge"]);
    ns.must("ip", &["link", "add", "keep0", "type", "bridge"]);
    let sy = env!("CARGO_BIN_EXE_switchyard");
    let out = ns.must(sy, &["cleanup", "--kube-proxy"]);
    assert!(out.contains("kube-proxy's nftables table"), "{out}");
    assert!(out.contains("kube-ipvs0"), "{out}");
    let links = ns.must("ip", &["-o", "link", "show"]);
    assert!(!links.contains("kube-ipvs0"), "{links}");
    assert!(links.contains("keep0"), "{links}");
    // Nothing left: a second run finds nothing and succeeds.
    let again = ns.must(sy, &["cleanup", "--kube-proxy"]);
    assert!(!again.contains("kube-ipvs0"), "{again}");

    let listed = ns.must("nft", &["list", "tables"]);
    assert!(!listed.contains("kube-proxy"), "{listed}");
    assert!(listed.contains("table inet filter"), "{listed}");
    assert!(
        listed.contains("table ip switchyard"),
        "ours stay: {listed}"
    );
    for save in ["iptables-nft-save", "iptables-legacy-save"] {
        let rules = ns.must(save, &[]);
        assert!(!rules.contains("KUBE-"), "{save}:\n{rules}");
        assert_eq!(
            lines_of(&rules, "DOCKER"),
            ["-A DOCKER -j RETURN"],
            "{save}"
        );
        assert!(
            rules.contains("-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER"),
            "{save}:\n{rules}"
        );
    }
}

/// 110 services x 10 endpoints as a JSON `List`: 1,100 endpoints and 1,210 chains, above
/// kube-proxy's large-cluster threshold and the whole-table threshold of iptables-nft
/// restores.
/// 110 services of 10 endpoints each, the endpoints in `10.<subnet>.0.0/16`.
fn large_cluster(subnet: u8) -> String {
    let mut items = Vec::new();
    for i in 0..110 {
        let name = format!("svc-{i}");
        items.push(format!(
            r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"{name}","namespace":"big"}},"spec":{{"clusterIP":"172.30.{}.{}","ports":[{{"name":"http","port":80}}]}}}}"#,
            i / 200,
            i % 200 + 1
        ));
        let eps: Vec<String> = (0..10)
            .map(|j| format!(r#"{{"addresses":["10.{subnet}.{i}.{}"]}}"#, j + 1))
            .collect();
        items.push(format!(
            r#"{{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{{"name":"{name}-1","namespace":"big","labels":{{"kubernetes.io/service-name":"{name}"}}}},"addressType":"IPv4","ports":[{{"name":"http","port":8080}}],"endpoints":[{}]}}"#,
            eps.join(",")
        ));
    }
    format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[{}]}}"#,
        items.join(",")
    )
}

/// A large cluster on iptables-nft: the chains a sync creates go straight over netlink and
/// the rest in a restore (whole-table style, `-S` first, when it still declares 1,000
/// chains): from a node without a nat table at all, then again over the loaded table with a
/// stale chain to delete, then once more with every endpoint moved (every endpoint chain
/// new, every service chain rewritten, the old ones deleted, over a loaded table with its
/// jumps). Every rule is there, the jumps once, the endpoint rules without comments
/// (kube-proxy's large-cluster mode), and iptables-nft-save reads the result; a later full
/// sync writes only what drifted; cleanup (whole-table) removes it all.
#[test]
fn a_large_cluster_is_written_whole_table_on_iptables_nft() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cluster.yaml"), large_cluster(1)).unwrap();
    std::fs::write(
        dir.path().join("kube-proxy.yaml"),
        "kind: KubeProxyConfiguration\nmode: iptables\nhostnameOverride: node-a\nclusterCIDR: 10.0.0.0/8\n",
    )
    .unwrap();
    let Some(ns) = Ns::create("big") else {
        return;
    };
    let check = |s: &str, when: &str| {
        let dnat = s
            .lines()
            .filter(|l| l.starts_with("-A KUBE-SEP-") && l.contains("-j DNAT"))
            .count();
        assert_eq!(dnat, 1100, "{when}");
        assert!(
            s.contains("-A KUBE-SEP-")
                && !s
                    .lines()
                    .any(|l| l.starts_with("-A KUBE-SEP-") && l.contains("comment")),
            "{when}: endpoint rules carry no comment in a large cluster"
        );
        assert_eq!(lines_of(s, "KUBE-SERVICES").len(), 111, "{when}");
        for builtin in ["PREROUTING", "OUTPUT"] {
            let jumps = lines_of(s, builtin)
                .iter()
                .filter(|l| l.ends_with("-j KUBE-SERVICES"))
                .count();
            assert_eq!(jumps, 1, "{when}: {builtin}");
        }
        assert_eq!(
            lines_of(s, "POSTROUTING")
                .iter()
                .filter(|l| l.ends_with("-j KUBE-POSTROUTING"))
                .count(),
            1,
            "{when}"
        );
    };
    ns.switchyard(dir.path(), "nft", &["sync", "--once"]);
    check(&ns.must("iptables-nft-save", &["-t", "nat"]), "first sync");
    ns.must(
        "iptables-nft",
        &["-t", "nat", "-N", "KUBE-SEP-LEFTOVERLEFTOVER"],
    );
    ns.switchyard(dir.path(), "nft", &["sync", "--once"]);
    let s = ns.must("iptables-nft-save", &["-t", "nat"]);
    check(&s, "second sync");
    assert!(!s.contains("LEFTOVER"), "the stale chain is deleted");
    // A full sync of an intact kernel compares what iptables-save prints with the layout
    // and writes nothing; a chain someone emptied is written again, alone.
    let out = ns.switchyard(dir.path(), "nft", &["sync", "--once"]);
    assert!(out.contains("no changes"), "{out}");
    let sep = s
        .lines()
        .find_map(|l| l.strip_prefix("-A KUBE-SEP-"))
        .and_then(|l| l.split(' ').next())
        .map(|h| format!("KUBE-SEP-{h}"))
        .unwrap();
    ns.must("iptables-nft", &["-t", "nat", "-F", &sep]);
    let out = ns.switchyard(dir.path(), "nft", &["sync", "--once"]);
    assert!(out.contains("1 chains written (2 rules)"), "{out}");
    check(
        &ns.must("iptables-nft-save", &["-t", "nat"]),
        "after repair",
    );
    std::fs::write(dir.path().join("cluster.yaml"), large_cluster(2)).unwrap();
    let out = ns.switchyard(dir.path(), "nft", &["sync", "--once"]);
    assert!(
        out.contains("1210 chains written") && out.contains("1100 chains deleted"),
        "{out}"
    );
    let s = ns.must("iptables-nft-save", &["-t", "nat"]);
    check(&s, "every endpoint moved");
    let dnat: Vec<&str> = s.lines().filter(|l| l.contains("-j DNAT")).collect();
    assert!(
        dnat.iter().all(|l| l.contains("--to-destination 10.2.")),
        "{:?}",
        &dnat[..3]
    );
    let chains = s.lines().filter(|l| l.starts_with(":KUBE-SEP-")).count();
    assert_eq!(chains, 1100, "the old endpoint chains are deleted");
    // Cleanup names every chain too, and goes whole-table as well.
    ns.switchyard(dir.path(), "nft", &["cleanup", "--proxy-mode", "iptables"]);
    let s = ns.must("iptables-nft-save", &[]);
    let ours: Vec<&str> = s
        .lines()
        .filter(|l| l.contains("KUBE-") && !l.contains("KUBE-FIREWALL"))
        .collect();
    assert!(
        ours.is_empty(),
        "cleanup left ours: {:?}",
        &ours[..ours.len().min(5)]
    );
}

/// `n` services of `eps` endpoints each, TCP and UDP in turn, endpoints in 10.3.0.0/16.
fn mixed_cluster(n: usize, eps: usize) -> String {
    let mut items = Vec::new();
    for i in 0..n {
        let name = format!("svc-{i}");
        let proto = if i % 2 == 0 { "TCP" } else { "UDP" };
        items.push(format!(
            r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"{name}","namespace":"mix"}},"spec":{{"clusterIP":"172.31.{}.{}","ports":[{{"name":"p","port":53,"protocol":"{proto}"}}]}}}}"#,
            i / 200,
            i % 200 + 1
        ));
        let endpoints: Vec<String> = (0..eps)
            .map(|j| {
                format!(
                    r#"{{"addresses":["10.3.{}.{}"]}}"#,
                    i / 200,
                    (i % 200) + j + 1
                )
            })
            .collect();
        items.push(format!(
            r#"{{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{{"name":"{name}-1","namespace":"mix","labels":{{"kubernetes.io/service-name":"{name}"}}}},"addressType":"IPv4","ports":[{{"name":"p","port":5353,"protocol":"{proto}"}}],"endpoints":[{}]}}"#,
            endpoints.join(",")
        ));
    }
    format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[{}]}}"#,
        items.join(",")
    )
}

/// The chains of `table` as `nft --debug=netlink` shows their expressions, handles left
/// out, sorted by chain: what the kernel holds, whoever wrote it.
fn kernel_expressions(ns: &Ns) -> Vec<String> {
    let out = ns.run("nft", &["--debug=netlink", "list", "table", "ip", "nat"]);
    assert!(out.success(), "{}", out.transcript());
    let listing = out
        .stdout
        .split("\ntable ip nat {")
        .next()
        .unwrap_or_default();
    let mut chains: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut current = String::new();
    for line in listing.lines() {
        if let Some(header) = line.strip_prefix("ip nat ") {
            current = header.split(' ').next().unwrap_or_default().to_string();
        } else if line.starts_with("  [") {
            chains
                .entry(current.clone())
                .or_default()
                .push(line.to_string());
        } else if !line.is_empty() {
            chains.entry(current.clone()).or_default().push("--".into());
        }
    }
    chains
        .into_iter()
        .map(|(c, rules)| format!("{c}\n{}", rules.join("\n")))
        .collect()
}

/// What Switchyard writes straight over netlink on iptables-nft (the chains a large sync
/// creates) is what iptables-nft-restore writes from the same rules, expression for
/// expression, and iptables-nft-save prints it the same: for a large cluster (endpoint
/// rules without comments, TCP, a clusterCIDR that is not byte-aligned) and for 600
/// one-endpoint services (comments on every rule, TCP and UDP).
#[test]
fn chains_written_directly_equal_what_iptables_nft_restore_writes() {
    for (case, cluster, cidr) in [
        ("large", large_cluster(1), "10.0.0.0/12"),
        ("commented", mixed_cluster(600, 1), "10.0.0.0/8"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cluster.yaml"), cluster).unwrap();
        std::fs::write(
            dir.path().join("kube-proxy.yaml"),
            format!("kind: KubeProxyConfiguration\nmode: iptables\nhostnameOverride: node-a\nclusterCIDR: {cidr}\n"),
        )
        .unwrap();
        let (Some(direct), Some(restored)) = (Ns::create("direct"), Ns::create("restore")) else {
            return;
        };
        let (direct, restored) = (&direct, &restored);
        let out = direct.run(
            env!("CARGO_BIN_EXE_switchyard"),
            &[
                "sync",
                "--once",
                "--config",
                &dir.path().join("kube-proxy.yaml").to_string_lossy(),
                "--manifests",
                &dir.path().join("cluster.yaml").to_string_lossy(),
                "--iptables-backend",
                "nft",
            ],
        );
        assert!(out.success(), "{case}: {}", out.transcript());
        // Written directly, not through the restore it falls back to.
        assert!(
            out.stderr
                .contains("new chains created directly over nf_tables netlink")
                && !out.stderr.contains("directly failed"),
            "{case}: {}",
            out.transcript()
        );
        let render = format!(
            "{} render --config {} --manifests {} | sed '/^# IPv6/,$d' | iptables-nft-restore --noflush",
            env!("CARGO_BIN_EXE_switchyard"),
            dir.path().join("kube-proxy.yaml").display(),
            dir.path().join("cluster.yaml").display()
        );
        restored.must("sh", &["-c", &render]);
        let (a, b) = (kernel_expressions(direct), kernel_expressions(restored));
        assert!(a.len() > 1000, "{case}: {}", a.len());
        assert_eq!(a.len(), b.len(), "{case}");
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x, y, "{case}");
        }
        // Byte for byte, the xtables payloads included (neither listing shows them whole).
        let dump = |ns: &Ns| {
            netns::in_netns(&ns.0, || {
                dataplane::iptables::direct::dump_expressions(
                    dataplane::model::IpFamily::V4,
                    dataplane::iptables::plan::TableName::Nat,
                )
                .map_err(std::io::Error::other)
            })
            .unwrap()
        };
        let (a, b) = (dump(direct), dump(restored));
        assert!(a.len() > 1000, "{case}: {}", a.len());
        assert_eq!(
            a.keys().collect::<Vec<_>>(),
            b.keys().collect::<Vec<_>>(),
            "{case}"
        );
        for (chain, rules) in &a {
            assert_eq!(rules, &b[chain], "{case}: {chain}");
        }
        let save = |ns: &Ns| -> Vec<String> {
            ns.must("iptables-nft-save", &["-t", "nat"])
                .lines()
                .filter(|l| !l.starts_with('#'))
                .map(str::to_string)
                .collect()
        };
        assert_eq!(save(direct), save(restored), "{case}");
    }
}

/// One Service whose port name carries a newline and a quote (a name the API server would
/// refuse, but a file can hold) used to make iptables-restore reject the whole input, so
/// nothing was programmed. It is skipped with its field named; the rest is programmed.
#[test]
fn a_name_iptables_restore_would_choke_on_skips_one_service_not_all() {
    let Some(ns) = Ns::create("badname") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("kube-proxy.yaml"),
        "mode: iptables\nhostnameOverride: node-a\n",
    )
    .unwrap();
    let bad = r#"
---
apiVersion: v1
kind: Service
metadata: { name: evil, namespace: ns }
spec: { clusterIP: 172.30.0.9, ports: [{ name: "x\"\n-A KUBE-SERVICES -j ACCEPT", port: 80 }] }
"#;
    std::fs::write(dir.path().join("cluster.yaml"), format!("{CLUSTER}{bad}")).unwrap();
    let cfg = dir.path().join("kube-proxy.yaml");
    let manifests = dir.path().join("cluster.yaml");
    let out = ns.run(
        env!("CARGO_BIN_EXE_switchyard"),
        &[
            "sync",
            "--once",
            "--config",
            cfg.to_str().unwrap(),
            "--manifests",
            manifests.to_str().unwrap(),
            "--iptables-backend",
            "nft",
        ],
    );
    assert!(out.success(), "{}", out.transcript());
    assert!(
        out.stderr.contains("Service ns/evil") && out.stderr.contains("spec.ports[0].name"),
        "{}",
        out.transcript()
    );
    let save = ns.must("iptables-nft-save", &[]);
    assert!(
        save.contains("172.30.0.1"),
        "the good service is programmed:\n{save}"
    );
    assert!(!save.contains("172.30.0.9"), "{save}");
}
