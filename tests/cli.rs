//! The command line as a user meets it: errors that name the file, object and field; invalid
//! objects skipped with a warning; `sync --once` and `cleanup` on a real kernel in a namespace.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

fn switchyard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .output()
        .expect("run switchyard")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn write(dir: &Path, name: &str, content: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, content).expect("write test file");
    p.display().to_string()
}

const GOOD: &str = r#"
apiVersion: v1
kind: Service
metadata: { name: good, namespace: ns }
spec: { clusterIP: 172.30.0.1, ports: [{ name: http, port: 80 }] }
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: good-1, namespace: ns, labels: { kubernetes.io/service-name: good } }
addressType: IPv4
ports: [{ name: http, port: 8080 }]
endpoints: [{ addresses: [10.0.0.1] }]
"#;

#[test]
fn malformed_manifest_fails_naming_file_object_and_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = write(
        dir.path(),
        "bad.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: { name: web, namespace: shop }\nspec: { clusterIP: 172.30.0.9, ports: [{ port: eighty }] }\n",
    );
    let out = switchyard(&["render", "--manifests", &bad]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("bad.yaml")
            && err.contains("Service shop/web")
            && err.contains("spec.ports[0].port"),
        "{err}"
    );

    let broken = write(dir.path(), "broken.yaml", "kind: Service\nspec: [\n");
    let out = switchyard(&["render", "--manifests", &broken]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("broken.yaml"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn bad_config_fails_naming_the_field_and_unknown_fields_warn() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = write(dir.path(), "m.yaml", GOOD);
    let cfg = write(
        dir.path(),
        "kp.yaml",
        "kind: KubeProxyConfiguration\nnftables: { masqueradeAll: sometimes }\n",
    );
    let out = switchyard(&["render", "--config", &cfg, "--manifests", &m]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("kp.yaml") && err.contains("masqueradeAll"),
        "{err}"
    );

    let cfg = write(
        dir.path(),
        "kp2.yaml",
        "kind: KubeProxyConfiguration\nclusterCIDR: 10.0.0.0/8\nfrobnicate: true\n",
    );
    let out = switchyard(&["render", "--config", &cfg, "--manifests", &m]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("frobnicate"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn one_invalid_object_is_skipped_with_a_warning_and_the_rest_programmed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = r#"
---
apiVersion: v1
kind: Service
metadata: { name: badport, namespace: ns }
spec: { clusterIP: 172.30.0.2, ports: [{ name: http, port: 70000 }] }
---
apiVersion: v1
kind: Service
metadata: { name: badip, namespace: ns }
spec: { clusterIP: 172.30.0.300, ports: [{ name: http, port: 80 }] }
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: mixed-1, namespace: ns, labels: { kubernetes.io/service-name: good } }
addressType: IPv4
ports: [{ name: http, port: 8080 }]
endpoints: [{ addresses: ["fd00::5"] }]
"#;
    let m = write(dir.path(), "m.yaml", &format!("{GOOD}{bad}"));
    let out = switchyard(&["render", "--manifests", &m, "--cluster-cidr", "10.0.0.0/8"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    for needle in [
        "Service ns/badport",
        "spec.ports[0].port",
        "Service ns/badip",
        "spec.clusterIPs[0]",
        "EndpointSlice ns/mixed-1",
        "endpoints[0].addresses[0]",
    ] {
        assert!(err.contains(needle), "warning lacks {needle:?}: {err}");
    }
    let rendered = text(&out.stdout);
    assert!(
        rendered.contains("172.30.0.1 . tcp . 80 : goto cluster-1"),
        "{rendered}"
    );
    assert!(!rendered.contains("172.30.0.2"), "{rendered}");
}

/// A network namespace for one test, removed on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Option<Netns> {
        let name = format!("sy-{}-cli-{tag}", std::process::id());
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(Netns(name));
        }
        assert!(
            std::env::var("SWITCHYARD_REQUIRE_NETNS").as_deref() != Ok("1"),
            "SWITCHYARD_REQUIRE_NETNS=1 but `ip netns add` failed (needs root)"
        );
        println!("SKIP {tag}: needs root and network namespaces");
        None
    }

    fn run(&self, program: &str, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.0, program])
            .args(args)
            .output()
            .expect("ip netns exec")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
fn sync_once_then_cleanup_removes_only_our_tables() {
    let Some(ns) = Netns::new("cleanup") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let m = write(dir.path(), "m.yaml", GOOD);
    // Someone else's rules, in a table and in the iptables nat table.
    let other = ns.run("nft", &["add table inet firewall; add chain inet firewall input { type filter hook input priority 0; }; add rule inet firewall input tcp dport 22 accept"]);
    assert!(other.status.success(), "{}", text(&other.stderr));
    let bin = env!("CARGO_BIN_EXE_switchyard");
    let out = ns.run(
        bin,
        &[
            "sync",
            "--once",
            "--manifests",
            &m,
            "--cluster-cidr",
            "10.0.0.0/8",
        ],
    );
    assert!(out.status.success(), "sync failed: {}", text(&out.stderr));
    let line = text(&out.stdout);
    assert!(line.contains("sync") && line.contains("ms"), "{line}");
    let listed = text(&ns.run("nft", &["list", "tables"]).stdout);
    assert!(
        listed.contains("table ip switchyard") && listed.contains("table ip6 switchyard"),
        "{listed}"
    );

    // Same input again: nothing to do.
    let again = ns.run(
        bin,
        &[
            "sync",
            "--once",
            "--manifests",
            &m,
            "--cluster-cidr",
            "10.0.0.0/8",
        ],
    );
    assert!(
        text(&again.stdout).contains("no changes"),
        "{}",
        text(&again.stdout)
    );

    let out = ns.run(bin, &["cleanup"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&ns.run("nft", &["list", "ruleset"]).stdout);
    assert!(!listed.contains("switchyard"), "{listed}");
    assert!(
        listed.contains("table inet firewall") && listed.contains("tcp dport 22 accept"),
        "{listed}"
    );
    // Cleaning up twice is fine.
    assert!(ns.run(bin, &["cleanup"]).status.success());
}

/// nftables mode writes over netlink alone: `sync --once` and `cleanup` with no `nft` on
/// the PATH program and remove the tables (nft, run afterwards, reads what they wrote).
#[test]
fn a_sync_never_runs_nft() {
    let Some(ns) = Netns::new("no-nft") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let m = write(dir.path(), "m.yaml", GOOD);
    let empty = dir.path().join("empty-path");
    std::fs::create_dir(&empty).unwrap();
    let path = format!("PATH={}", empty.display());
    let bin = env!("CARGO_BIN_EXE_switchyard");
    let sync = [
        path.as_str(),
        bin,
        "sync",
        "--once",
        "--manifests",
        &m,
        "--cluster-cidr",
        "10.0.0.0/8",
    ];
    let out = ns.run("env", &sync);
    assert!(out.status.success(), "sync failed: {}", text(&out.stderr));
    let listed = text(&ns.run("nft", &["list", "table", "ip", "switchyard"]).stdout);
    assert!(
        listed.contains("172.30.0.1 . tcp . 80 . 0 : 10.0.0.1 . 8080"),
        "{listed}"
    );
    assert!(
        listed.contains("numgen random mod 1 map @backends"),
        "{listed}"
    );
    let out = ns.run(
        "env",
        &[path.as_str(), bin, "cleanup", "--proxy-mode", "nftables"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&ns.run("nft", &["list", "ruleset"]).stdout);
    assert!(!listed.contains("switchyard"), "{listed}");
}

#[test]
fn drift_is_repaired_by_the_next_sync() {
    let Some(ns) = Netns::new("drift") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let m = write(dir.path(), "m.yaml", GOOD);
    let bin = env!("CARGO_BIN_EXE_switchyard");
    let args = [
        "sync",
        "--once",
        "--manifests",
        m.as_str(),
        "--cluster-cidr",
        "10.0.0.0/8",
    ];
    assert!(ns.run(bin, &args).status.success());
    let del = ns.run(
        "nft",
        &["flush map ip switchyard backends; flush chain ip switchyard services"],
    );
    assert!(del.status.success(), "{}", text(&del.stderr));
    let out = ns.run(bin, &args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&ns.run("nft", &["list", "table", "ip", "switchyard"]).stdout);
    assert!(
        listed.contains("172.30.0.1 . tcp . 80 . 0 : 10.0.0.1 . 8080"),
        "{listed}"
    );
    assert!(listed.contains("vmap @service-ips"), "{listed}");
}

#[test]
fn without_a_node_object_node_addresses_come_from_the_interfaces() {
    let Some(ns) = Netns::new("ifaddrs") else {
        return;
    };
    for cmd in [
        &["link", "set", "lo", "up"][..],
        &["addr", "add", "192.0.2.7/32", "dev", "lo"][..],
    ] {
        let out = ns.run("ip", cmd);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let m = write(dir.path(), "m.yaml", GOOD);
    let bin = env!("CARGO_BIN_EXE_switchyard");
    let out = ns.run(
        bin,
        &[
            "render",
            "--manifests",
            &m,
            "--nodeport-addresses",
            "primary",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rendered = text(&out.stdout);
    assert!(
        rendered.contains("add element ip switchyard nodeport-addrs {\n\t192.0.2.7\n}"),
        "{rendered}"
    );
}

/// `render --proxy-mode ipvs` shows every piece a sync would apply: the virtual service
/// with its real server, the address bound to kube-ipvs0, the ipset members and
/// kube-proxy's IPVS-mode iptables rules; a bad scheduler names the field.
#[test]
fn render_ipvs_shows_services_addresses_sets_and_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = write(dir.path(), "good.yaml", GOOD);
    let cfg = write(
        dir.path(),
        "kp.yaml",
        "kind: KubeProxyConfiguration\nmode: ipvs\nclusterCIDR: 10.0.0.0/8\nipvs: { scheduler: lc }\n",
    );
    let out = switchyard(&["render", "--config", &cfg, "--manifests", &m]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    for want in [
        "tcp:172.30.0.1:80 lc  # ns/good:http/tcp",
        "  -> 10.0.0.1:8080 weight 1",
        "kube-ipvs0 address 172.30.0.1",
        "add SWITCHYARD-TMP-0 172.30.0.1,tcp:80 -exist",
        "swap SWITCHYARD-TMP-0 KUBE-CLUSTER-IP",
        "# IPv4: iptables-restore --noflush",
        "-A KUBE-SERVICES",
        "--match-set KUBE-CLUSTER-IP dst,dst",
    ] {
        assert!(s.contains(want), "missing {want:?} in:\n{s}");
    }
    // trace follows IPVS mode's rules too.
    let out = switchyard(&[
        "trace",
        "--config",
        &cfg,
        "--manifests",
        &m,
        "--from",
        "10.0.0.9",
        "--to",
        "172.30.0.1:80/TCP",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("verdict: DNAT to 10.0.0.1:8080"),
        "{}",
        text(&out.stdout)
    );

    let bad = write(
        dir.path(),
        "bad.yaml",
        "kind: KubeProxyConfiguration\nmode: ipvs\nipvs: { scheduler: fastest }\n",
    );
    let out = switchyard(&["render", "--config", &bad, "--manifests", &m]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("bad.yaml: field ipvs.scheduler") && err.contains("\"fastest\""),
        "{err}"
    );
}

/// Run `program args` with stdout and stderr in files, killed after `limit`: the output, or
/// a panic saying it hung.
fn run_bounded(program: &str, args: &[&str], limit: std::time::Duration) -> Output {
    let out = tempfile::NamedTempFile::new().expect("temp file");
    let err = tempfile::NamedTempFile::new().expect("temp file");
    let mut child = Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(out.reopen().expect("reopen"))
        .stderr(err.reopen().expect("reopen"))
        .spawn()
        .expect("spawn");
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{program} {args:?} still running after {limit:?}\n{}",
                std::fs::read_to_string(err.path()).unwrap_or_default()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Output {
        status,
        stdout: std::fs::read(out.path()).expect("read stdout"),
        stderr: std::fs::read(err.path()).expect("read stderr"),
    }
}

/// A manifests directory with the good objects in a subdirectory, beside a FIFO with a
/// manifest's name, a symbolic link loop and a link to a directory read already.
fn hostile_manifest_dir(dir: &Path) -> std::path::PathBuf {
    let m = dir.join("manifests");
    std::fs::create_dir_all(m.join("sub")).unwrap();
    write(&m.join("sub"), "good.yaml", GOOD);
    nix::unistd::mkfifo(&m.join("pipe.yaml"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    std::os::unix::fs::symlink(".", m.join("loop")).unwrap();
    std::os::unix::fs::symlink("..", m.join("sub").join("up")).unwrap();
    m
}

#[test]
fn render_and_sync_skip_fifos_and_symlink_loops_with_a_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = hostile_manifest_dir(dir.path());
    let m = m.to_str().unwrap();
    let bin = env!("CARGO_BIN_EXE_switchyard");
    let limit = std::time::Duration::from_secs(20);
    let out = run_bounded(bin, &["render", "--manifests", m], limit);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(text(&out.stdout).contains("172.30.0.1"), "{err}");
    assert!(
        err.contains("pipe.yaml: skipped: a FIFO, not a regular file"),
        "{err}"
    );
    assert!(
        err.contains("loop: skipped: a directory already read"),
        "{err}"
    );

    let Some(ns) = Netns::new("hostile") else {
        return;
    };
    let out = run_bounded(
        "ip",
        &[
            "netns",
            "exec",
            &ns.0,
            bin,
            "sync",
            "--once",
            "--manifests",
            m,
        ],
        limit,
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("pipe.yaml: skipped"), "{err}");
}

#[test]
fn a_manifest_file_over_the_size_limit_is_refused_unread() {
    let dir = tempfile::tempdir().expect("tempdir");
    let big = dir.path().join("big.yaml");
    // Sparse: 2 GiB that take no disk and would take 2 GiB of memory to read whole.
    std::fs::File::create(&big)
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    let out = run_bounded(
        env!("CARGO_BIN_EXE_switchyard"),
        &["render", "--manifests", big.to_str().unwrap()],
        std::time::Duration::from_secs(20),
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("big.yaml: too large: 2147483648 bytes, over the limit of 1200000000 bytes"),
        "{err}"
    );
}

/// CVE-2020-8554 class (issue 29): a Service in namespace `aaa` (first in name order, and
/// older) whose external IP is another Service's ClusterIP does not take that ClusterIP's
/// traffic in any mode; `render` warns naming both, as `sync` does.
#[test]
fn an_external_ip_never_takes_a_cluster_ip_in_any_mode() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = write(
        dir.path(),
        "contested.yaml",
        r#"
apiVersion: v1
kind: Service
metadata: { name: evil, namespace: aaa, creationTimestamp: "2020-01-01T00:00:00Z" }
spec: { clusterIP: 10.96.0.99, externalIPs: [10.96.0.10], ports: [{ name: dns, port: 53 }] }
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: evil-1, namespace: aaa, labels: { kubernetes.io/service-name: evil } }
addressType: IPv4
ports: [{ name: dns, port: 5353 }]
endpoints: [{ addresses: [10.0.0.66] }]
---
apiVersion: v1
kind: Service
metadata: { name: dns, namespace: kube-system, creationTimestamp: "2024-01-01T00:00:00Z" }
spec: { clusterIP: 10.96.0.10, ports: [{ name: dns, port: 53 }] }
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: dns-1, namespace: kube-system, labels: { kubernetes.io/service-name: dns } }
addressType: IPv4
ports: [{ name: dns, port: 5353 }]
endpoints: [{ addresses: [10.0.0.53] }]
"#,
    );
    for mode in ["nftables", "iptables", "ipvs"] {
        let cfg = write(
            dir.path(),
            &format!("{mode}.yaml"),
            &format!("kind: KubeProxyConfiguration\nmode: {mode}\nclusterCIDR: 10.0.0.0/8\n"),
        );
        let out = switchyard(&["render", "--config", &cfg, "--manifests", &m]);
        assert!(out.status.success(), "{mode}: {}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(
            err.contains("front end 10.96.0.10:53/tcp")
                && err.contains("aaa/evil:dns/tcp")
                && err.contains("kube-system/dns:dns/tcp"),
            "{mode}: no conflict warning in:\n{err}"
        );
        let out = switchyard(&[
            "trace",
            "--config",
            &cfg,
            "--manifests",
            &m,
            "--from",
            "10.0.0.9",
            "--to",
            "10.96.0.10:53/TCP",
        ]);
        assert!(out.status.success(), "{mode}: {}", text(&out.stderr));
        let got = text(&out.stdout);
        assert!(got.contains("DNAT to 10.0.0.53:5353"), "{mode}:\n{got}");
        assert!(!got.contains("10.0.0.66"), "{mode}:\n{got}");
    }
}
