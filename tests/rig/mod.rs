//! Real-packet test rig: builds one conformance scenario (a node state) in network
//! namespaces, programs it with `switchyard sync --once`, and probes TCP/UDP flows.
//!
//! Topology (every namespace is named `sy-<pid>-<counter>-<role>`):
//!
//! ```text
//!   ext ──(uplink veth: up0)── node ──(veth pI)── pod I   (one per local pod IP)
//!                                └───(veth rm0)── remote  (all non-local endpoint IPs)
//! ```
//!
//! `node` runs switchyard and owns all node IPs; `ext` holds the uplink peer and the
//! external client addresses, and rejects anything it would have to forward (so traffic
//! that leaks out of the node un-NATed shows up as UNREACHABLE instead of a timeout).
//! Pods look like a routed CNI: `/32` (`/128`) on `eth0`, default via 169.254.1.1
//! (fe80::1). Responders in every namespace answer with `"<their ip:port> <peer ip>"`.

#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

pub mod cases;
pub mod manifests;
pub mod net;
pub mod netns;
pub mod random;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use cases::{EndpointSlice, Expect, Flow, Mode, Protocol, Scenario, Service, SourceKind, Verdict};
use net::{Outcome, ResponderMode};
use netns::CmdOutput;

pub use cases::Cases;

/// Connections made per DNAT flow (each with a new source port).
pub const DNAT_SAMPLES: usize = 36;
/// A DNAT flow stops sampling after this many unanswered connections.
const DNAT_GIVE_UP_AFTER: usize = 4;
const ACCEPT_SAMPLES: usize = 3;
const REJECT_SAMPLES: usize = 3;
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);

const REMOTE_NODE_V4: Ipv4Addr = Ipv4Addr::new(192, 168, 200, 1);
const REMOTE_PEER_V4: Ipv4Addr = Ipv4Addr::new(192, 168, 200, 2);
const REMOTE_NODE_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xffff, 0, 0, 0, 0, 0, 1);
const REMOTE_PEER_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xffff, 0, 0, 0, 0, 0, 2);
const POD_GATEWAY_V4: &str = "169.254.1.1";
const POD_GATEWAY_V6: &str = "fe80::1";

/// Options for building a rig.
#[derive(Clone, Debug)]
pub struct RigOptions {
    /// The kube-proxy mode switchyard is configured with and whose expectations apply.
    pub mode: Mode,
    /// What TCP responders do after sending their identity line.
    pub responder_mode: ResponderMode,
    /// Slices that are not programmed now but whose endpoints must exist in the topology
    /// (for re-programming later with [`Rig::reprogram`]).
    pub extra_slices: Vec<EndpointSlice>,
    /// More arguments for `switchyard sync --once` (e.g. `--iptables-backend legacy`).
    pub sync_args: Vec<String>,
}

impl Default for RigOptions {
    fn default() -> Self {
        RigOptions {
            mode: Mode::Nftables,
            responder_mode: ResponderMode::OneShot,
            extra_slices: Vec::new(),
            sync_args: Vec::new(),
        }
    }
}

/// Pass/fail/skip of one flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Pass,
    Fail,
    Skip,
}

/// The result of probing one flow.
#[derive(Clone, Debug)]
pub struct FlowReport {
    pub name: String,
    pub status: Status,
    pub expected: String,
    pub observed: String,
}

impl FlowReport {
    fn line(&self) -> String {
        let tag = match self.status {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
        };
        format!(
            "  {tag} {}\n       expected: {}\n       observed: {}",
            self.name, self.expected, self.observed
        )
    }
}

/// A built scenario. Dropping it stops all responders and deletes every namespace.
pub struct Rig {
    test: String,
    opts: RigOptions,
    /// The state currently programmed (services and slices change on re-program).
    scenario: Scenario,
    /// Every namespace created, in creation order.
    namespaces: Vec<String>,
    pub node_ns: String,
    pub ext_ns: String,
    pub remote_ns: Option<String>,
    /// Local pod IP -> its namespace.
    pub pods: BTreeMap<IpAddr, String>,
    pub remote_ips: BTreeSet<IpAddr>,
    pub ext_addrs: BTreeSet<IpAddr>,
    /// Every address configured in the node namespace (for masquerade checks).
    pub node_addrs: BTreeSet<IpAddr>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    bound: BTreeSet<(String, Protocol, SocketAddr)>,
    workdir: tempfile::TempDir,
    /// Transcripts of every `switchyard sync` run, oldest first.
    pub syncs: Vec<CmdOutput>,
}

/// Either skips (prints the reason, returns `None`) or panics when
/// `SWITCHYARD_REQUIRE_NETNS=1` demands the rig.
fn skip(test: &str, reason: &str) -> Option<Rig> {
    let line = format!("SKIP {test}: needs root and network namespaces ({reason})");
    if std::env::var("SWITCHYARD_REQUIRE_NETNS").as_deref() == Ok("1") {
        panic!("{line}; SWITCHYARD_REQUIRE_NETNS=1 makes this a failure");
    }
    println!("{line}");
    eprintln!("{line}");
    None
}

fn v4_prefix(ip: Ipv4Addr) -> u8 {
    let o = ip.octets();
    if o[0] == 192 && o[1] == 168 && o[2] <= 1 {
        24
    } else {
        32
    }
}

/// Prefix length used for a node IP on the uplink.
fn node_ip_prefix(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(v4) => v4_prefix(v4),
        IpAddr::V6(_) => 64,
    }
}

fn host_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() {
        32
    } else {
        128
    }
}

fn nodad(ip: IpAddr) -> &'static str {
    if ip.is_ipv6() {
        " nodad"
    } else {
        ""
    }
}

/// The ext-side uplink address in the same subnet as the node gateway address.
fn uplink_peer(gw: IpAddr) -> IpAddr {
    match gw {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            let last = if o[3] == 100 { 101 } else { 100 };
            IpAddr::V4(Ipv4Addr::new(o[0], o[1], o[2], last))
        }
        IpAddr::V6(v6) => {
            let mut s = v6.segments();
            let last = if s[7] == 0x100 { 0x101 } else { 0x100 };
            s[4..].copy_from_slice(&[0, 0, 0, last]);
            IpAddr::V6(Ipv6Addr::from(s))
        }
    }
}

fn fmt_set<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let v: Vec<String> = items.into_iter().map(|i| i.to_string()).collect();
    format!("{{{}}}", v.join(", "))
}

fn describe(e: &Expect) -> String {
    match e.verdict {
        Verdict::Dnat => format!(
            "DNAT to {} masquerade={}",
            fmt_set(&e.endpoints),
            e.masquerade
                .map(|m| m.to_string())
                .unwrap_or_else(|| "unspecified".into())
        ),
        Verdict::Accept => "ACCEPT (reply from the original destination, source unchanged)".into(),
        Verdict::Reject => "REJECT (connection refused)".into(),
        Verdict::Drop => "DROP (timeout)".into(),
    }
}

/// Summarises many outcomes as "outcome xN; ...".
fn summarize(outcomes: &[Outcome]) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for o in outcomes {
        *counts.entry(o.to_string()).or_default() += 1;
    }
    counts
        .iter()
        .map(|(k, n)| format!("{k} x{n}"))
        .collect::<Vec<_>>()
        .join("; ")
}

impl Rig {
    /// Builds `scenario` in fresh namespaces. Returns `None` (after printing a SKIP line)
    /// when the machine cannot run it; panics instead if `SWITCHYARD_REQUIRE_NETNS=1`.
    pub fn build(test: &str, scenario: &Scenario, opts: RigOptions) -> Option<Rig> {
        if !netns::is_root() {
            return skip(test, "not running as root");
        }
        netns::delete_stale_namespaces();
        let prefix = netns::unique_prefix();
        let node_ns = format!("{prefix}node");
        if let Err(reason) = netns::create_namespace(&node_ns) {
            return skip(test, &reason);
        }
        let mut rig = Rig {
            test: test.to_string(),
            opts,
            scenario: scenario.clone(),
            namespaces: vec![node_ns.clone()],
            node_ns,
            ext_ns: format!("{prefix}ext"),
            remote_ns: None,
            pods: BTreeMap::new(),
            remote_ips: BTreeSet::new(),
            ext_addrs: BTreeSet::new(),
            node_addrs: BTreeSet::new(),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            bound: BTreeSet::new(),
            workdir: tempfile::Builder::new()
                .prefix("switchyard-rig-")
                .tempdir()
                .expect("creating the rig's temp dir"),
            syncs: Vec::new(),
        };
        // From here on a panic drops `rig`, which deletes what was created so far.
        rig.setup(&prefix);
        Some(rig)
    }

    fn new_namespace(&mut self, name: &str) {
        netns::create_namespace(name).unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        self.namespaces.push(name.to_string());
    }

    fn all_slices(&self) -> Vec<EndpointSlice> {
        let mut v = self.scenario.endpoint_slices.clone();
        v.extend(self.opts.extra_slices.iter().cloned());
        v
    }

    fn setup(&mut self, prefix: &str) {
        let node_name = self.scenario.node.name.clone();
        // Classify addresses.
        let mut local: BTreeSet<IpAddr> = BTreeSet::new();
        let mut remote: BTreeSet<IpAddr> = BTreeSet::new();
        for slice in self.all_slices() {
            for ep in &slice.endpoints {
                for addr in &ep.addresses {
                    if ep.node_name.as_deref() == Some(node_name.as_str()) {
                        local.insert(*addr);
                    } else {
                        remote.insert(*addr);
                    }
                }
            }
        }
        for flow in &self.scenario.flows {
            match flow.source_kind {
                SourceKind::Pod | SourceKind::EndpointSelf => {
                    local.insert(flow.source);
                }
                SourceKind::External => {
                    self.ext_addrs.insert(flow.source);
                }
                _ => {}
            }
        }
        // An address that is local anywhere lives in a pod on this node.
        remote.retain(|a| !local.contains(a));
        self.remote_ips = remote;

        // Namespaces, each with its sysctls set before any interface exists.
        let common = [
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
            "net.ipv6.conf.all.accept_dad=0",
            "net.ipv6.conf.default.accept_dad=0",
            "net.ipv4.icmp_ratelimit=0",
            "net.ipv6.icmp.ratelimit=0",
        ];
        let router = [
            "net.ipv4.ip_forward=1",
            "net.ipv6.conf.all.forwarding=1",
            "net.ipv6.conf.default.forwarding=1",
            "net.ipv4.conf.all.send_redirects=0",
            "net.ipv4.conf.default.send_redirects=0",
        ];
        let router_sysctls: Vec<&str> = common.iter().chain(router.iter()).copied().collect();
        netns::sysctls(&self.node_ns, &router_sysctls);
        // The node answers every REJECT with an ICMP error, which the kernel also limits
        // per namespace as a whole (50 at once, 1000 a second by default here): raised after
        // a REJECT flow once saw one probe time out among refused ones. -e skips a kernel
        // without these settings per namespace.
        netns::run(
            "ip",
            &[
                "netns",
                "exec",
                &self.node_ns,
                "sysctl",
                "-q",
                "-e",
                "-w",
                "net.ipv4.icmp_msgs_per_sec=100000",
                "net.ipv4.icmp_msgs_burst=10000",
            ],
            None,
            netns::CMD_TIMEOUT,
        );
        let ext_ns = self.ext_ns.clone();
        self.new_namespace(&ext_ns);
        let mut ext_sysctls = router_sysctls.clone();
        ext_sysctls.extend([
            "net.ipv4.conf.all.accept_local=1",
            "net.ipv4.conf.default.accept_local=1",
        ]);
        netns::sysctls(&ext_ns, &ext_sysctls);
        for (i, ip) in local.iter().enumerate() {
            let ns = format!("{prefix}pod{i}");
            self.new_namespace(&ns);
            netns::sysctls(&ns, &common);
            self.pods.insert(*ip, ns);
        }
        if !self.remote_ips.is_empty() {
            let ns = format!("{prefix}remote");
            self.new_namespace(&ns);
            netns::sysctls(&ns, &common);
            self.remote_ns = Some(ns);
        }

        self.build_uplink();
        self.build_pods();
        self.build_remote();
        self.install_ext_catch_all();
        self.node_addrs = self.read_node_addresses();
        self.start_endpoint_responders();
        self.start_destination_sinks();
    }

    fn build_uplink(&mut self) {
        let node = self.scenario.node.clone();
        let mut ips: Vec<IpAddr> = vec![node.primary_ip];
        ips.extend(node.ips.iter().copied().filter(|i| *i != node.primary_ip));
        let gw4 = ips
            .iter()
            .copied()
            .find(|i| i.is_ipv4() && node_ip_prefix(*i) < 32);
        let gw6 = ips.iter().copied().find(|i| i.is_ipv6());
        let mut node_cmds = vec![format!(
            "link add up0 type veth peer name eth0 netns {}",
            self.ext_ns
        )];
        for ip in &ips {
            node_cmds.push(format!(
                "addr add {ip}/{} dev up0{}",
                node_ip_prefix(*ip),
                nodad(*ip)
            ));
        }
        node_cmds.push("link set up0 up".into());
        netns::ip_batch(&self.node_ns, &node_cmds);

        let mut ext_cmds = Vec::new();
        let mut node_routes = Vec::new();
        for (gw, prefix) in [(gw4, 24u8), (gw6, 64u8)] {
            let Some(gw) = gw else { continue };
            let peer = uplink_peer(gw);
            ext_cmds.push(format!("addr add {peer}/{prefix} dev eth0{}", nodad(peer)));
            self.ext_addrs.insert(peer);
        }
        ext_cmds.push("link set eth0 up".into());
        for addr in self.ext_addrs.clone() {
            if Some(addr) == gw4.map(uplink_peer) || Some(addr) == gw6.map(uplink_peer) {
                continue;
            }
            ext_cmds.push(format!(
                "addr add {addr}/{} dev lo{}",
                host_prefix(addr),
                nodad(addr)
            ));
            let gw = if addr.is_ipv4() { gw4 } else { gw6 };
            if let Some(gw) = gw {
                node_routes.push(format!(
                    "route add {addr}/{} via {} dev up0",
                    host_prefix(addr),
                    uplink_peer(gw)
                ));
            }
        }
        for gw in [gw4, gw6].into_iter().flatten() {
            ext_cmds.push(format!("route add default via {gw} dev eth0"));
            node_routes.push(format!("route add default via {} dev up0", uplink_peer(gw)));
        }
        netns::ip_batch(&self.ext_ns, &ext_cmds);
        netns::ip_batch(&self.node_ns, &node_routes);
    }

    /// Pods on `p<i>` veths, routed; or, when the node config names a bridge, with their
    /// veths in that bridge, which holds the gateway address.
    fn build_pods(&mut self) {
        let mut node_links = Vec::new();
        let mut node_routes = Vec::new();
        let pods: Vec<(IpAddr, String)> = self.pods.iter().map(|(a, n)| (*a, n.clone())).collect();
        let bridge = self.scenario.node.bridge_interface.clone();
        if let Some(br) = &bridge {
            node_links.push(format!("link add {br} type bridge"));
            node_links.push(format!("addr add {POD_GATEWAY_V4}/32 dev {br}"));
            node_links.push(format!("addr add {POD_GATEWAY_V6}/64 dev {br} nodad"));
            node_links.push(format!("link set {br} up"));
        }
        for (i, (_, ns)) in pods.iter().enumerate() {
            node_links.push(format!("link add p{i} type veth peer name eth0 netns {ns}"));
            match &bridge {
                Some(br) => node_links.push(format!("link set p{i} master {br}")),
                None => {
                    node_links.push(format!("addr add {POD_GATEWAY_V4}/32 dev p{i}"));
                    node_links.push(format!("addr add {POD_GATEWAY_V6}/64 dev p{i} nodad"));
                }
            }
            node_links.push(format!("link set p{i} up"));
        }
        netns::ip_batch(&self.node_ns, &node_links);
        for (i, (ip, ns)) in pods.iter().enumerate() {
            let mut cmds = vec![
                format!("addr add {ip}/{} dev eth0{}", host_prefix(*ip), nodad(*ip)),
                "link set eth0 up".to_string(),
            ];
            if ip.is_ipv4() {
                cmds.push(format!("route add {POD_GATEWAY_V4} dev eth0"));
                cmds.push(format!("route add default via {POD_GATEWAY_V4} dev eth0"));
            } else {
                cmds.push(format!("route add default via {POD_GATEWAY_V6} dev eth0"));
            }
            netns::ip_batch(ns, &cmds);
            let dev = bridge.clone().unwrap_or_else(|| format!("p{i}"));
            node_routes.push(format!("route add {ip}/{} dev {dev}", host_prefix(*ip)));
        }
        netns::ip_batch(&self.node_ns, &node_routes);
    }

    fn build_remote(&mut self) {
        let Some(ns) = self.remote_ns.clone() else {
            return;
        };
        netns::ip_batch(
            &self.node_ns,
            &[
                format!("link add rm0 type veth peer name eth0 netns {ns}"),
                format!("addr add {REMOTE_NODE_V4}/24 dev rm0"),
                format!("addr add {REMOTE_NODE_V6}/64 dev rm0 nodad"),
                "link set rm0 up".into(),
            ],
        );
        let mut cmds = vec![
            format!("addr add {REMOTE_PEER_V4}/24 dev eth0"),
            format!("addr add {REMOTE_PEER_V6}/64 dev eth0 nodad"),
        ];
        let mut node_routes = Vec::new();
        for ip in &self.remote_ips {
            cmds.push(format!(
                "addr add {ip}/{} dev lo{}",
                host_prefix(*ip),
                nodad(*ip)
            ));
            let via: IpAddr = if ip.is_ipv4() {
                REMOTE_PEER_V4.into()
            } else {
                REMOTE_PEER_V6.into()
            };
            node_routes.push(format!(
                "route add {ip}/{} via {via} dev rm0",
                host_prefix(*ip)
            ));
        }
        cmds.push("link set eth0 up".into());
        cmds.push(format!("route add default via {REMOTE_NODE_V4} dev eth0"));
        cmds.push(format!("route add default via {REMOTE_NODE_V6} dev eth0"));
        netns::ip_batch(&ns, &cmds);
        netns::ip_batch(&self.node_ns, &node_routes);
    }

    /// `ext` forwards nothing: whatever the node sends it for an address nobody owns is
    /// answered with ICMP admin-prohibited, which clients see as UNREACHABLE. (ext accepts
    /// packets with its own client addresses as source, `accept_local`, so traffic the node
    /// bounces straight back to ext is answered too instead of dropped as martian.)
    fn install_ext_catch_all(&self) {
        let rules = "table inet sy_ext {\n  chain forward {\n    type filter hook forward priority 0; policy accept;\n    meta l4proto { tcp, udp } reject with icmpx type admin-prohibited\n  }\n}\n";
        netns::must(
            "ip",
            &["netns", "exec", &self.ext_ns, "nft", "-f", "-"],
            Some(rules),
        );
    }

    fn read_node_addresses(&self) -> BTreeSet<IpAddr> {
        let out = netns::must("ip", &["-n", &self.node_ns, "-j", "addr", "show"], None);
        let links: serde_json::Value =
            serde_json::from_str(&out.stdout).expect("parsing `ip -j addr show`");
        let mut addrs = BTreeSet::new();
        for link in links.as_array().into_iter().flatten() {
            for info in link["addr_info"].as_array().into_iter().flatten() {
                if let Some(ip) = info["local"].as_str().and_then(|s| s.parse().ok()) {
                    addrs.insert(ip);
                }
            }
        }
        addrs
    }

    /// The namespace that owns `addr`, if any.
    fn owner_of(&self, addr: IpAddr) -> Option<String> {
        if addr.is_loopback() || self.node_addrs.contains(&addr) {
            return Some(self.node_ns.clone());
        }
        if let Some(ns) = self.pods.get(&addr) {
            return Some(ns.clone());
        }
        if self.remote_ips.contains(&addr) {
            return self.remote_ns.clone();
        }
        if self.ext_addrs.contains(&addr) {
            return Some(self.ext_ns.clone());
        }
        None
    }

    fn bind_responder(&mut self, ns: &str, proto: Protocol, addr: SocketAddr) {
        if proto == Protocol::Sctp {
            return;
        }
        if !self.bound.insert((ns.to_string(), proto, addr)) {
            return;
        }
        let handle = match proto {
            Protocol::Tcp => {
                net::spawn_tcp_responder(ns, addr, self.opts.responder_mode, self.stop.clone())
            }
            Protocol::Udp => net::spawn_udp_responder(ns, addr, self.stop.clone()),
            Protocol::Sctp => unreachable!("SCTP is filtered above"),
        }
        .unwrap_or_else(|e| panic!("starting {proto} responder at {addr} in {ns}: {e}"));
        self.threads.push(handle);
    }

    fn start_endpoint_responders(&mut self) {
        for slice in self.all_slices() {
            for ep in &slice.endpoints {
                for addr in &ep.addresses {
                    let ns = self
                        .owner_of(*addr)
                        .expect("every endpoint address has a namespace");
                    for port in &slice.ports {
                        self.bind_responder(&ns, port.protocol, SocketAddr::new(*addr, port.port));
                    }
                }
            }
        }
    }

    /// Responders at flows' original destinations ("sinks").
    ///
    /// ACCEPT flows must reach their original destination, so it must answer; destinations
    /// nobody owns are placed beyond the uplink (on ext's loopback). REJECT and DROP flows to
    /// an owned address get a sink too: without it the owner's own stack would answer a TCP
    /// RST or ICMP port-unreachable and an un-rejected packet would look REFUSED; with it,
    /// a packet that should have been rejected or dropped visibly reaches the sink.
    fn start_destination_sinks(&mut self) {
        let mode = self.opts.mode;
        let flows: Vec<Flow> = self.scenario.flows.clone();
        for flow in flows {
            let verdict = flow.expectation(mode).verdict;
            if self.skip_reason(&flow).is_some() || verdict == Verdict::Dnat {
                continue;
            }
            let ns = match self.owner_of(flow.destination) {
                Some(ns) => ns,
                None if verdict == Verdict::Accept => {
                    let d = flow.destination;
                    netns::ip_batch(
                        &self.ext_ns,
                        &[format!(
                            "addr add {d}/{} dev lo{}",
                            host_prefix(d),
                            nodad(d)
                        )],
                    );
                    self.ext_addrs.insert(d);
                    self.ext_ns.clone()
                }
                // Unowned REJECT/DROP destinations leak to ext, which answers UNREACHABLE.
                None => continue,
            };
            self.bind_responder(
                &ns,
                flow.protocol,
                SocketAddr::new(flow.destination, flow.port),
            );
        }
    }

    /// The scenario state currently programmed.
    pub fn scenario(&self) -> &Scenario {
        &self.scenario
    }

    pub fn mode(&self) -> Mode {
        self.opts.mode
    }

    /// Writes manifests for the current state and runs `switchyard sync --once` in the node
    /// namespace. Panics (with the transcript and the ruleset) unless it exits 0.
    pub fn program(&mut self) -> CmdOutput {
        let n = self.syncs.len();
        let dir: PathBuf = self.workdir.path().join(format!("sync-{n}"));
        let (config, manifests) = self.write_state(&dir);
        let bin = env!("CARGO_BIN_EXE_switchyard");
        let config_s = config.to_string_lossy().to_string();
        let manifests_s = manifests.to_string_lossy().to_string();
        let mut args = vec![
            "netns",
            "exec",
            &self.node_ns,
            bin,
            "sync",
            "--once",
            "--config",
            &config_s,
            "--manifests",
            &manifests_s,
        ];
        args.extend(self.opts.sync_args.iter().map(String::as_str));
        let out = netns::run("ip", &args, None, SYNC_TIMEOUT);
        self.syncs.push(out.clone());
        if std::env::var("SWITCHYARD_RIG_DUMP").as_deref() == Ok("1") {
            println!(
                "{}: sync #{n}\n{}\n--- nft list ruleset (node) ---\n{}",
                self.test,
                out.transcript(),
                self.ruleset()
            );
        }
        if !out.success() {
            panic!(
                "{}: switchyard sync #{n} failed\n{}\n--- config ({config_s}) ---\n{}\n--- nft list ruleset (node) ---\n{}",
                self.test,
                out.transcript(),
                std::fs::read_to_string(&config).unwrap_or_default(),
                self.ruleset()
            );
        }
        out
    }

    /// Writes `dir/config.yaml` and `dir/manifests/objects.yaml` for the current state
    /// (the manifest replaced in one rename, so a watching agent never reads half of it).
    pub fn write_state(&self, dir: &std::path::Path) -> (PathBuf, PathBuf) {
        let manifests = dir.join("manifests");
        std::fs::create_dir_all(&manifests).expect("creating the manifests dir");
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            manifests::kube_proxy_config(&self.scenario.node, self.opts.mode),
        )
        .expect("writing config.yaml");
        let tmp = dir.join("objects.yaml.tmp");
        std::fs::write(
            &tmp,
            manifests::manifests_yaml(
                &self.scenario.node,
                &self.scenario.services,
                &self.scenario.endpoint_slices,
            ),
        )
        .expect("writing objects.yaml");
        std::fs::rename(&tmp, manifests.join("objects.yaml")).expect("renaming objects.yaml");
        (config, manifests)
    }

    /// The current state as API objects (Node, ServiceCIDRs, Services, EndpointSlices).
    pub fn objects(&self) -> Vec<serde_json::Value> {
        manifests::objects(
            &self.scenario.node,
            &self.scenario.services,
            &self.scenario.endpoint_slices,
        )
    }

    /// A directory of the rig's own, removed with it.
    pub fn workdir(&self) -> &std::path::Path {
        self.workdir.path()
    }

    /// Replaces the Services and EndpointSlices without syncing (for a watching agent).
    /// Every endpoint must already be in the topology (see [`RigOptions::extra_slices`]).
    pub fn set_state(&mut self, services: Vec<Service>, slices: Vec<EndpointSlice>) {
        for slice in &slices {
            for ep in &slice.endpoints {
                for addr in &ep.addresses {
                    assert!(
                        self.owner_of(*addr).is_some(),
                        "endpoint {addr} is not in the rig's topology; list its slice in RigOptions::extra_slices"
                    );
                }
            }
        }
        self.scenario.services = services;
        self.scenario.endpoint_slices = slices;
    }

    /// Replaces the programmed Services and EndpointSlices and syncs again.
    /// Every endpoint must already be in the topology (see [`RigOptions::extra_slices`]).
    pub fn reprogram(&mut self, services: Vec<Service>, slices: Vec<EndpointSlice>) -> CmdOutput {
        self.set_state(services, slices);
        self.program()
    }

    /// Loads a hand-written nft script in the node namespace instead of running switchyard
    /// (rig self-checks: proves the expectations are reachable with a known-good ruleset).
    pub fn program_nft(&mut self, script: &str) {
        netns::must(
            "ip",
            &["netns", "exec", &self.node_ns, "nft", "-f", "-"],
            Some(script),
        );
    }

    /// Runs `program args` in the node namespace.
    pub fn node_exec(&self, program: &str, args: &[&str]) -> CmdOutput {
        let mut all = vec!["netns", "exec", &self.node_ns, program];
        all.extend_from_slice(args);
        netns::run("ip", &all, None, netns::CMD_TIMEOUT)
    }

    /// `nft list ruleset` in the node namespace.
    pub fn ruleset(&self) -> String {
        let out = netns::run(
            "ip",
            &["netns", "exec", &self.node_ns, "nft", "list", "ruleset"],
            None,
            netns::CMD_TIMEOUT,
        );
        if out.success() {
            out.stdout
        } else {
            out.transcript()
        }
    }

    /// The namespace a flow's client runs in.
    pub fn source_namespace(&self, kind: SourceKind, source: IpAddr) -> Option<String> {
        match kind {
            SourceKind::Pod | SourceKind::EndpointSelf => self.pods.get(&source).cloned(),
            SourceKind::Node | SourceKind::Localhost => Some(self.node_ns.clone()),
            SourceKind::External => Some(self.ext_ns.clone()),
            SourceKind::LbIpSelf => None,
        }
    }

    fn skip_reason(&self, flow: &Flow) -> Option<String> {
        if flow.protocol == Protocol::Sctp {
            return Some("SCTP is not available in this kernel".into());
        }
        if flow.tracer_only {
            return Some("tracerOnly: the packet never leaves the pod".into());
        }
        if flow.source_kind == SourceKind::LbIpSelf {
            return Some("lb-ip-self sources are not built by the rig yet".into());
        }
        None
    }

    /// One connection attempt for `flow`.
    pub fn probe_once(&self, flow: &Flow) -> Outcome {
        let Some(ns) = self.source_namespace(flow.source_kind, flow.source) else {
            return Outcome::Error(format!("no namespace for source {}", flow.source));
        };
        let dest = SocketAddr::new(flow.destination, flow.port);
        match flow.protocol {
            Protocol::Tcp => net::probe_tcp(&ns, flow.source, dest),
            Protocol::Udp => net::probe_udp(&ns, flow.source, dest),
            Protocol::Sctp => Outcome::Error("SCTP is not supported".into()),
        }
    }

    /// Opens a TCP connection for `flow` and returns it with the identity line's outcome.
    pub fn connect(
        &self,
        flow: &Flow,
    ) -> Result<(std::io::BufReader<std::net::TcpStream>, Outcome), Outcome> {
        let ns = self
            .source_namespace(flow.source_kind, flow.source)
            .ok_or_else(|| Outcome::Error(format!("no namespace for {}", flow.source)))?;
        net::connect_tcp(
            &ns,
            flow.source,
            SocketAddr::new(flow.destination, flow.port),
        )
    }

    /// Probes one flow against its expectation for the rig's mode.
    pub fn check_flow(&self, flow: &Flow) -> FlowReport {
        let expect = flow.expectation(self.opts.mode);
        let title = format!(
            "{} [{} {} -> {} {}]",
            flow.name,
            serde_json::to_value(flow.source_kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            flow.source,
            SocketAddr::new(flow.destination, flow.port),
            flow.protocol
        );
        let expected = describe(&expect);
        if let Some(reason) = self.skip_reason(flow) {
            return FlowReport {
                name: title,
                status: Status::Skip,
                expected,
                observed: format!("skipped: {reason}"),
            };
        }
        let samples = match expect.verdict {
            Verdict::Dnat => DNAT_SAMPLES,
            Verdict::Accept => ACCEPT_SAMPLES,
            Verdict::Reject => REJECT_SAMPLES,
            Verdict::Drop => 1,
        };
        let started = std::time::Instant::now();
        let mut outcomes: Vec<Outcome> = Vec::with_capacity(samples);
        let mut failures = 0;
        while outcomes.len() < samples {
            let o = self.probe_once(flow);
            if expect.verdict == Verdict::Dnat && !matches!(o, Outcome::Reply { .. }) {
                failures += 1;
            }
            outcomes.push(o);
            // A DNAT flow with this many unanswered connections has failed already.
            if failures >= DNAT_GIVE_UP_AFTER {
                break;
            }
        }
        let (ok, observed) = self.judge(flow, &expect, &outcomes);
        let observed = format!("{observed} ({:.1?})", started.elapsed());
        FlowReport {
            name: title,
            status: if ok { Status::Pass } else { Status::Fail },
            expected,
            observed,
        }
    }

    fn judge(&self, flow: &Flow, expect: &Expect, outcomes: &[Outcome]) -> (bool, String) {
        let replies: Vec<(SocketAddr, IpAddr)> = outcomes
            .iter()
            .filter_map(|o| match o {
                Outcome::Reply { local, peer } => Some((*local, *peer)),
                _ => None,
            })
            .collect();
        let all_replied = replies.len() == outcomes.len();
        let summary = summarize(outcomes);
        match expect.verdict {
            Verdict::Dnat => {
                let want: BTreeSet<String> = expect.endpoints.iter().cloned().collect();
                let got: BTreeSet<String> = replies.iter().map(|(l, _)| l.to_string()).collect();
                let peers: BTreeSet<IpAddr> = replies.iter().map(|(_, p)| *p).collect();
                let mut problems = Vec::new();
                if !all_replied {
                    problems.push(format!(
                        "{}/{} connections answered{}",
                        replies.len(),
                        outcomes.len(),
                        if outcomes.len() < DNAT_SAMPLES {
                            " (gave up early)"
                        } else {
                            ""
                        }
                    ));
                }
                if got != want {
                    problems.push(format!("endpoints {} != expected", fmt_set(&got)));
                }
                match expect.masquerade {
                    Some(true) => {
                        let bad: Vec<&IpAddr> = peers
                            .iter()
                            .filter(|p| !self.node_addrs.contains(p))
                            .collect();
                        if !bad.is_empty() {
                            problems.push(format!(
                                "not masqueraded: endpoints saw non-node source(s) {}",
                                fmt_set(bad)
                            ));
                        }
                        // A node-sourced client already uses a node address. Masquerade
                        // picks the egress interface's address (pod veth 169.254.1.1,
                        // remote link 192.168.200.1 / fd00:ffff::1), never the uplink
                        // address the client bound, so seeing the source means no SNAT.
                        if self.node_addrs.contains(&flow.source) && peers.contains(&flow.source) {
                            problems.push(format!(
                                "not masqueraded: endpoints saw the client's own node address {}",
                                flow.source
                            ));
                        }
                    }
                    Some(false) => {
                        let bad: Vec<&IpAddr> =
                            peers.iter().filter(|p| **p != flow.source).collect();
                        if !bad.is_empty() {
                            problems.push(format!(
                                "unexpected masquerade: endpoints saw source(s) {} instead of {}",
                                fmt_set(bad),
                                flow.source
                            ));
                        }
                    }
                    None => {}
                }
                let observed = format!(
                    "endpoints {} peers {} | {}{}",
                    fmt_set(&got),
                    fmt_set(&peers),
                    summary,
                    if problems.is_empty() {
                        String::new()
                    } else {
                        format!(" | PROBLEM: {}", problems.join("; "))
                    }
                );
                (problems.is_empty(), observed)
            }
            Verdict::Accept => {
                let dest = SocketAddr::new(flow.destination, flow.port);
                let ok =
                    all_replied && replies.iter().all(|(l, p)| *l == dest && *p == flow.source);
                (ok, summary)
            }
            Verdict::Reject => (outcomes.iter().all(|o| *o == Outcome::Refused), summary),
            Verdict::Drop => (
                outcomes
                    .iter()
                    .all(|o| matches!(o, Outcome::Timeout | Outcome::LocalDrop)),
                summary,
            ),
        }
    }

    /// Probes `flows` and returns every report (nothing panics here).
    pub fn check_flows(&self, flows: &[Flow]) -> Vec<FlowReport> {
        flows.iter().map(|f| self.check_flow(f)).collect()
    }

    /// Probes `flows`, prints the report, and panics once with the full report, the
    /// node's ruleset and the last sync transcript if any flow failed.
    pub fn assert_flows(&self, flows: &[Flow]) {
        let reports = self.check_flows(flows);
        let count = |s: Status| reports.iter().filter(|r| r.status == s).count();
        let mut text = format!(
            "{} (mode {}): {} passed, {} failed, {} skipped\n",
            self.test,
            self.opts.mode.as_str(),
            count(Status::Pass),
            count(Status::Fail),
            count(Status::Skip)
        );
        for r in &reports {
            let _ = writeln!(text, "{}", r.line());
        }
        println!("{text}");
        if count(Status::Fail) > 0 {
            let last = self
                .syncs
                .last()
                .map(|s| s.transcript())
                .unwrap_or_else(|| "(never synced)".into());
            panic!(
                "{text}\n--- node addresses ---\n{}\n--- last sync ---\n{last}\n--- nft list ruleset (node) ---\n{}",
                fmt_set(&self.node_addrs),
                self.ruleset()
            );
        }
    }

    /// Probes every flow of the programmed scenario (see [`Rig::assert_flows`]).
    pub fn assert_scenario_flows(&self) {
        let flows = self.scenario.flows.clone();
        self.assert_flows(&flows);
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
        if std::env::var("SWITCHYARD_RIG_KEEP").as_deref() == Ok("1") {
            eprintln!(
                "SWITCHYARD_RIG_KEEP=1: leaving namespaces {:?}",
                self.namespaces
            );
            return;
        }
        for ns in self.namespaces.iter().rev() {
            netns::delete_namespace(ns);
        }
    }
}

/// Loads the vendored cases, builds scenario `id` in `mode`, programs it and checks
/// every flow. Returns quietly after a SKIP line when namespaces are unavailable.
pub fn run_conformance(id: &str, mode: Mode) {
    let opts = RigOptions {
        mode,
        ..RigOptions::default()
    };
    // The rig, if built, is torn down at once: its checks ran.
    let _ = run_conformance_with(id, id, opts);
}

/// [`run_conformance`] with options; the rig stays up for more checks (`None`: SKIP).
pub fn run_conformance_with(test: &str, id: &str, opts: RigOptions) -> Option<Rig> {
    run_case(&Cases::vendored(), test, id, opts)
}

/// One of Switchyard's own scenarios (`tests/conformance/own-cases.json`) in `mode`.
pub fn run_own(id: &str, mode: Mode) {
    let opts = RigOptions {
        mode,
        ..RigOptions::default()
    };
    let _ = run_case(
        &Cases::own(),
        &format!("own/{}/{id}", mode.as_str()),
        id,
        opts,
    );
}

fn run_case(cases: &Cases, test: &str, id: &str, opts: RigOptions) -> Option<Rig> {
    let scenario = cases.scenario(id).clone();
    let mut rig = Rig::build(test, &scenario, opts)?;
    rig.program();
    rig.assert_scenario_flows();
    Some(rig)
}
