//! The fixed part of a family's table: the sets and maps, the base chains and the checks
//! that do not depend on any service, and the load-balancing chain for each endpoint count.

use super::tables::{Chain, Set, Table};
use crate::model::{disjoint_cidrs, IpFamily, LocalDetector, NodeConfig, NodePortAddresses};
use ipnetwork::IpNetwork;

pub const SET_CLUSTER_IPS: &str = "cluster-ips";
pub const SET_SERVICE_CIDRS: &str = "service-cidrs";
pub const SET_NODEPORT_ADDRS: &str = "nodeport-addrs";
pub const SET_HAIRPIN: &str = "hairpin";
pub const MAP_SERVICE_IPS: &str = "service-ips";
pub const MAP_SERVICE_NODEPORTS: &str = "service-nodeports";
pub const MAP_NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
pub const MAP_NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
pub const MAP_BACKENDS: &str = "backends";
pub const MAP_NODEPORT_BACKENDS: &str = "nodeport-backends";
/// The maps of backend slots (`front end . slot : endpoint . port`): all four are `typeof`
/// maps with a `tcp dport` value, and what a remembered affinity client points into.
pub const BACKEND_MAPS: [&str; 4] = [
    MAP_BACKENDS,
    MAP_NODEPORT_BACKENDS,
    MAP_SHORTCUT_BACKENDS,
    MAP_NODEPORT_SHORTCUT_BACKENDS,
];
/// externalTrafficPolicy Local short-circuit: traffic from pods and from the node to an
/// external front end goes to all of the service's endpoints, through these maps.
pub const MAP_SHORTCUT_IPS: &str = "shortcut-ips";
pub const MAP_SHORTCUT_NODEPORTS: &str = "shortcut-nodeports";
pub const MAP_SHORTCUT_BACKENDS: &str = "shortcut-backends";
pub const MAP_NODEPORT_SHORTCUT_BACKENDS: &str = "nodeport-shortcut-backends";
/// loadBalancerSourceRanges: load-balancer front ends with ranges, and the sources each one
/// admits (`lbip . proto . port . source range`).
pub const SET_FIREWALL_IPS: &str = "firewall-ips";
pub const SET_FIREWALL_ALLOW: &str = "firewall-allow";
/// sessionAffinity ClientIP: which endpoint each client reached through each front end
/// (`client . front-end address . proto . port : endpoint . port`), written by the packet
/// path with the service's timeout, and which front ends remember (-> goto affinity-<secs>).
pub const MAP_AFFINITY: &str = "affinity";
pub const MAP_AFFINITY_FRONTENDS: &str = "affinity-frontends";
/// Remembered clients per family, at most (kube-proxy's per-endpoint sets hold 65535 each).
const AFFINITY_SIZE: u32 = 262_144;

/// The protocols a service port can have, as nft names them.
const PROTOCOLS: [&str; 3] = ["tcp", "udp", "sctp"];

/// Family-specific words.
struct Words {
    fam: &'static str,
    addr_type: &'static str,
    loopback: &'static str,
}

fn words(family: IpFamily) -> Words {
    match family {
        IpFamily::V4 => Words {
            fam: "ip",
            addr_type: "ipv4_addr",
            loopback: "127.0.0.0/8",
        },
        IpFamily::V6 => Words {
            fam: "ip6",
            addr_type: "ipv6_addr",
            loopback: "::1",
        },
    }
}

/// Canonical element text of a CIDR: a host prefix prints as the bare address, as nft lists it.
pub fn cidr_text(net: &IpNetwork) -> String {
    let full = match net {
        IpNetwork::V4(_) => 32,
        IpNetwork::V6(_) => 128,
    };
    if net.prefix() == full {
        net.ip().to_string()
    } else {
        format!("{}/{}", net.network(), net.prefix())
    }
}

fn set(map: bool, decl: String) -> Set {
    let fingerprint = super::tables::fingerprint(&decl);
    Set {
        map,
        decl,
        fingerprint,
        ..Set::default()
    }
}

/// Rule that sends non-local traffic to mark-for-masquerade in a cluster-N chain, if any.
fn masquerade_rule(node: &NodeConfig, family: IpFamily) -> Option<String> {
    let w = words(family);
    if node.masquerade_all {
        return Some("jump mark-for-masquerade".to_string());
    }
    match &node.local_detector {
        LocalDetector::None => None,
        LocalDetector::Cidrs(cidrs) => {
            let cidrs = disjoint_cidrs(cidrs, family);
            match cidrs.as_slice() {
                [] => None,
                [one] => Some(format!(
                    "{} saddr != {} jump mark-for-masquerade",
                    w.fam,
                    cidr_text(one)
                )),
                many => Some(format!(
                    "{} saddr != {{ {} }} jump mark-for-masquerade",
                    w.fam,
                    many.iter().map(cidr_text).collect::<Vec<_>>().join(", ")
                )),
            }
        }
        LocalDetector::Bridge(name) => Some(format!(
            "iifname != \"{}\" jump mark-for-masquerade",
            name.replace('"', "")
        )),
        LocalDetector::InterfacePrefix(prefix) => Some(format!(
            "iifname != \"{}*\" jump mark-for-masquerade",
            prefix.replace('"', "")
        )),
    }
}

/// The match that tells traffic from this node's pods, if the detector can tell.
fn pod_source_match(node: &NodeConfig, family: IpFamily) -> Option<String> {
    let w = words(family);
    match &node.local_detector {
        LocalDetector::None => None,
        LocalDetector::Cidrs(cidrs) => match disjoint_cidrs(cidrs, family).as_slice() {
            [] => None,
            [one] => Some(format!("{} saddr {}", w.fam, cidr_text(one))),
            many => Some(format!(
                "{} saddr {{ {} }}",
                w.fam,
                many.iter().map(cidr_text).collect::<Vec<_>>().join(", ")
            )),
        },
        LocalDetector::Bridge(name) => Some(format!("iifname \"{}\"", name.replace('"', ""))),
        LocalDetector::InterfacePrefix(prefix) => {
            Some(format!("iifname \"{}*\"", prefix.replace('"', "")))
        }
    }
}

/// The match that selects packets to a node-port address.
fn nodeport_match(node: &NodeConfig, family: IpFamily) -> String {
    let w = words(family);
    match node.node_port_addresses {
        NodePortAddresses::All => {
            format!("fib daddr type local {} daddr != {}", w.fam, w.loopback)
        }
        NodePortAddresses::Cidrs(_) => format!(
            "fib daddr type local {} daddr != {} {} daddr @{SET_NODEPORT_ADDRS}",
            w.fam, w.loopback, w.fam
        ),
    }
}

/// The table skeleton: sets, maps and the chains that do not depend on services.
pub fn skeleton(node: &NodeConfig, family: IpFamily) -> Table {
    let w = words(family);
    let at = w.addr_type;
    let mark = node.masquerade_mark();
    let mut t = Table::default();
    let fe_key = format!("{at} . inet_proto . inet_service");
    let np_key = "inet_proto . inet_service".to_string();
    let sets = [
        (SET_CLUSTER_IPS, false, format!("type {at};")),
        (SET_SERVICE_CIDRS, false, format!("type {at}; flags interval;")),
        (SET_NODEPORT_ADDRS, false, format!("type {at}; flags interval;")),
        (SET_HAIRPIN, false, format!("type {at} . {at};")),
        (MAP_SERVICE_IPS, true, format!("type {fe_key} : verdict;")),
        (MAP_SERVICE_NODEPORTS, true, format!("type {np_key} : verdict;")),
        (MAP_NO_ENDPOINT_SERVICES, true, format!("type {fe_key} : verdict;")),
        (MAP_NO_ENDPOINT_NODEPORTS, true, format!("type {np_key} : verdict;")),
        // typeof, not type: numgen yields a plain integer, which no named type matches. The
        // value says `tcp dport`, not `th dport`: nft 1.0.6 cannot re-evaluate a `th` value
        // type loaded from the kernel ("conflicting protocols specified: ip vs. th"), which
        // breaks every later rule that uses the map. Both are inet_service.
        (
            MAP_BACKENDS,
            true,
            format!(
                "typeof {f} daddr . meta l4proto . th dport . numgen random mod 1 : {f} daddr . tcp dport;",
                f = w.fam
            ),
        ),
        (
            MAP_NODEPORT_BACKENDS,
            true,
            format!(
                "typeof meta l4proto . th dport . numgen random mod 1 : {f} daddr . tcp dport;",
                f = w.fam
            ),
        ),
        (SET_FIREWALL_IPS, false, format!("type {fe_key};")),
        (
            SET_FIREWALL_ALLOW,
            false,
            format!("type {fe_key} . {at}; flags interval;"),
        ),
        (
            MAP_AFFINITY,
            true,
            format!(
                "type {at} . {fe_key} : {at} . inet_service; size {AFFINITY_SIZE}; flags dynamic,timeout; timeout 3h;"
            ),
        ),
        (MAP_AFFINITY_FRONTENDS, true, format!("type {fe_key} : verdict;")),
        (MAP_SHORTCUT_IPS, true, format!("type {fe_key} : verdict;")),
        (MAP_SHORTCUT_NODEPORTS, true, format!("type {np_key} : verdict;")),
        (
            MAP_SHORTCUT_BACKENDS,
            true,
            format!(
                "typeof {f} daddr . meta l4proto . th dport . numgen random mod 1 : {f} daddr . tcp dport;",
                f = w.fam
            ),
        ),
        (
            MAP_NODEPORT_SHORTCUT_BACKENDS,
            true,
            format!(
                "typeof meta l4proto . th dport . numgen random mod 1 : {f} daddr . tcp dport;",
                f = w.fam
            ),
        ),
    ];
    for (name, map, decl) in sets {
        t.sets.insert(name.to_string(), set(map, decl));
    }

    let base = |kind: &str, hook: &str, prio: i32| {
        Some(format!(
            "type {kind} hook {hook} priority {prio}; policy accept;"
        ))
    };
    let mut chain = |name: &str, hook: Option<String>, rules: Vec<String>| {
        t.chains.insert(name.to_string(), Chain::new(hook, rules));
    };
    let new = "ct state new";
    chain(
        "filter-forward",
        base("filter", "forward", -110),
        vec![
            format!("{new} jump service-endpoints-check"),
            format!("{new} jump cluster-ips-check"),
        ],
    );
    chain(
        "filter-input",
        base("filter", "input", -110),
        vec![
            format!("{new} jump nodeport-endpoints-check"),
            format!("{new} jump service-endpoints-check"),
        ],
    );
    // Before DNAT (dstnat - 10), where the destination is still the load-balancer IP.
    chain(
        "filter-prerouting",
        base("filter", "prerouting", -110),
        vec![format!("{new} jump firewall-check")],
    );
    chain(
        "filter-output",
        base("filter", "output", -110),
        vec![format!("{new} jump firewall-check")],
    );
    // After nat-output's DNAT, so only packets that were not DNATed are checked, as in
    // kube-proxy's filter-output (priority filter, after dstnat). The no-endpoint check
    // belongs here too: the node's own connection to an externalTrafficPolicy Local front
    // end with no endpoint here is short-circuited to every endpoint by nat-output, and
    // checked before DNAT it would meet that front end's drop meant for external clients.
    chain(
        "filter-output-post-dnat",
        base("filter", "output", -90),
        vec![
            format!("{new} jump service-endpoints-check"),
            format!("{new} jump cluster-ips-check"),
        ],
    );
    chain(
        "nat-prerouting",
        base("nat", "prerouting", -100),
        vec!["jump services".into()],
    );
    chain(
        "nat-output",
        base("nat", "output", -100),
        vec!["jump services".into()],
    );
    chain(
        "nat-postrouting",
        base("nat", "postrouting", 100),
        vec!["jump masquerading".into()],
    );
    // After DNAT and before masquerade: the client and the endpoint a new connection to an
    // affinity front end reached; in input too, for endpoints on the node's own addresses.
    // `ct original proto-dst` has a type only once the protocol is known, hence one rule
    // per protocol.
    let remember: Vec<String> = PROTOCOLS
        .iter()
        .map(|p| {
            format!(
                "ct state new ct status dnat meta l4proto {p} ct original {f} daddr . meta l4proto . ct original proto-dst vmap @{MAP_AFFINITY_FRONTENDS}",
                f = w.fam
            )
        })
        .collect();
    chain(
        "affinity-remember",
        base("filter", "postrouting", 99),
        remember.clone(),
    );
    chain(
        "affinity-remember-input",
        base("filter", "input", 99),
        remember,
    );
    chain(
        "services",
        None,
        vec![
            format!(
                "{} daddr . meta l4proto . th dport vmap @{MAP_SERVICE_IPS}",
                w.fam
            ),
            format!(
                "{} meta l4proto . th dport vmap @{MAP_SERVICE_NODEPORTS}",
                nodeport_match(node, family)
            ),
        ],
    );
    chain(
        "cluster-ips-check",
        None,
        vec![
            format!("{} daddr @{SET_CLUSTER_IPS} reject", w.fam),
            format!("{} daddr @{SET_SERVICE_CIDRS} drop", w.fam),
        ],
    );
    chain(
        "service-endpoints-check",
        None,
        vec![format!(
            "{} daddr . meta l4proto . th dport vmap @{MAP_NO_ENDPOINT_SERVICES}",
            w.fam
        )],
    );
    chain(
        "nodeport-endpoints-check",
        None,
        vec![format!(
            "{} meta l4proto . th dport vmap @{MAP_NO_ENDPOINT_NODEPORTS}",
            nodeport_match(node, family)
        )],
    );
    chain(
        "firewall-check",
        None,
        vec![format!(
            "{f} daddr . meta l4proto . th dport @{SET_FIREWALL_IPS} {f} daddr . meta l4proto . th dport . {f} saddr != @{SET_FIREWALL_ALLOW} drop",
            f = w.fam
        )],
    );
    chain("reject-chain", None, vec!["reject".into()]);
    chain(
        "mark-for-masquerade",
        None,
        vec![format!("meta mark set meta mark | {mark:#010x}")],
    );
    chain(
        "masquerading",
        None,
        vec![
            format!(
                "ct status dnat {f} saddr . {f} daddr @{SET_HAIRPIN} meta mark set meta mark | {mark:#010x}",
                f = w.fam
            ),
            format!("meta mark & {mark:#010x} == 0 return"),
            format!("meta mark set meta mark ^ {mark:#010x}"),
            "masquerade fully-random".into(),
        ],
    );
    t
}

/// Which kind of load-balancing chain a front end jumps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LbKind {
    Cluster,
    External,
    ExternalLocal,
    NodePort,
    NodePortLocal,
    /// All endpoints of an externalTrafficPolicy Local front end, for pods and the node.
    Shortcut,
    NodePortShortcut,
    /// Remembers the client's endpoint for this many seconds (sessionAffinity ClientIP);
    /// `n` is the timeout, not an endpoint count.
    Affinity,
}

impl LbKind {
    pub fn chain(self, n: usize) -> String {
        let kind = match self {
            LbKind::Cluster => "cluster",
            LbKind::External => "external",
            LbKind::ExternalLocal => "external-local",
            LbKind::NodePort => "nodeport",
            LbKind::NodePortLocal => "nodeport-local",
            LbKind::Shortcut => "shortcut",
            LbKind::NodePortShortcut => "nodeport-shortcut",
            LbKind::Affinity => "affinity",
        };
        format!("{kind}-{n}")
    }
}

/// The load-balancing chain of `kind` for front ends with `n` endpoints.
pub fn lb_chain(node: &NodeConfig, family: IpFamily, kind: LbKind, n: usize) -> Chain {
    let f = words(family).fam;
    if kind == LbKind::Affinity {
        let rules = PROTOCOLS
            .iter()
            .map(|p| {
                format!(
                    "meta l4proto {p} update @{MAP_AFFINITY} {{ {f} saddr . ct original {f} daddr . meta l4proto . ct original proto-dst timeout {n}s : {f} daddr . th dport }}"
                )
            })
            .collect();
        return Chain::new(None, rules);
    }
    let mut rules = Vec::new();
    match kind {
        LbKind::Cluster => rules.extend(masquerade_rule(node, family)),
        LbKind::External | LbKind::NodePort => rules.push("jump mark-for-masquerade".into()),
        // Local policy keeps the client address, except for traffic from pods and from the
        // node, which kube-proxy short-circuits to every endpoint (the node's masqueraded,
        // so that replies come back through it).
        LbKind::ExternalLocal | LbKind::NodePortLocal => {
            let (key, map) = if kind == LbKind::ExternalLocal {
                (
                    format!("{f} daddr . meta l4proto . th dport"),
                    MAP_SHORTCUT_IPS,
                )
            } else {
                (
                    "meta l4proto . th dport".to_string(),
                    MAP_SHORTCUT_NODEPORTS,
                )
            };
            if let Some(pods) = pod_source_match(node, family) {
                rules.push(format!("{pods} {key} vmap @{map}"));
            }
            rules.push("fib saddr type local jump mark-for-masquerade".into());
            rules.push(format!("fib saddr type local {key} vmap @{map}"));
        }
        LbKind::Shortcut | LbKind::NodePortShortcut | LbKind::Affinity => {}
    }
    let (key, map) = match kind {
        LbKind::NodePort | LbKind::NodePortLocal => {
            ("meta l4proto . th dport".to_string(), MAP_NODEPORT_BACKENDS)
        }
        LbKind::NodePortShortcut => (
            "meta l4proto . th dport".to_string(),
            MAP_NODEPORT_SHORTCUT_BACKENDS,
        ),
        LbKind::Shortcut => (
            format!("{f} daddr . meta l4proto . th dport"),
            MAP_SHORTCUT_BACKENDS,
        ),
        LbKind::Cluster | LbKind::External | LbKind::ExternalLocal | LbKind::Affinity => {
            (format!("{f} daddr . meta l4proto . th dport"), MAP_BACKENDS)
        }
    };
    // No endpoint of its own (a Local front end with none here): only the short-circuit.
    if n == 0 {
        return Chain::new(None, rules);
    }
    // A client an affinity front end remembers goes where it went before; nobody else is
    // ever remembered, so for other services this lookup always misses.
    rules.push(format!(
        "dnat {f} to {f} saddr . {f} daddr . meta l4proto . th dport map @{MAP_AFFINITY}"
    ));
    rules.push(format!(
        "dnat {f} to {key} . numgen random mod {n} map @{map}"
    ));
    Chain::new(None, rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    /// The priority in a base chain's hook declaration.
    fn priority(chain: &Chain) -> i32 {
        let hook = chain.hook.as_deref().unwrap();
        let (_, rest) = hook.split_once("priority ").unwrap();
        rest.split(';').next().unwrap().trim().parse().unwrap()
    }

    /// kube-proxy's nftables mode checks for no (local) endpoints in filter-output at
    /// priority filter, after nat-output's DNAT (pkg/proxy/nftables/proxier.go,
    /// nftablesBaseChains and nftablesJumpChains): the node's connection to a Local front end
    /// with no endpoint here is short-circuited before that drop can see it.
    #[test]
    fn the_node_meets_the_no_endpoint_check_after_dnat() {
        let node = NodeConfig::default();
        for family in [IpFamily::V4, IpFamily::V6] {
            let t = skeleton(&node, family);
            let nat = priority(&t.chains["nat-output"]);
            let jumps_to = |chain: &Chain, target: &str| {
                chain
                    .rules
                    .iter()
                    .any(|r| r.ends_with(&format!("jump {target}")))
            };
            for (name, chain) in &t.chains {
                let Some(hook) = &chain.hook else { continue };
                if !hook.contains("hook output") || !hook.starts_with("type filter") {
                    continue;
                }
                if jumps_to(chain, "service-endpoints-check")
                    || jumps_to(chain, "cluster-ips-check")
                {
                    assert!(
                        priority(chain) > nat,
                        "{name} runs before nat-output's DNAT"
                    );
                }
                if jumps_to(chain, "firewall-check") {
                    assert!(priority(chain) < nat, "{name} runs after nat-output's DNAT");
                }
            }
            let post = &t.chains["filter-output-post-dnat"].rules;
            assert_eq!(
                post,
                &s(&[
                    "ct state new jump service-endpoints-check",
                    "ct state new jump cluster-ips-check"
                ]),
                "no-endpoint verdicts (drop) come before the cluster-IP reject"
            );
        }
    }

    #[test]
    fn cidrs_are_made_disjoint_per_family() {
        let nets: Vec<IpNetwork> = [
            "10.0.0.0/8",
            "10.1.0.0/16",
            "192.168.0.2/32",
            "fd00::/64",
            "10.0.0.0/8",
        ]
        .iter()
        .map(|n| n.parse().unwrap())
        .collect();
        let v4: Vec<String> = disjoint_cidrs(&nets, IpFamily::V4)
            .iter()
            .map(cidr_text)
            .collect();
        assert_eq!(v4, s(&["10.0.0.0/8", "192.168.0.2"]));
        let v6: Vec<String> = disjoint_cidrs(&nets, IpFamily::V6)
            .iter()
            .map(cidr_text)
            .collect();
        assert_eq!(v6, s(&["fd00::/64"]));
    }
}
