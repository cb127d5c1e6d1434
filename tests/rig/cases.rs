//! The conformance-case data model (`tests/conformance/cases.json`) and per-mode expectations.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The whole `cases.json` document.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cases {
    pub schema: String,
    pub conventions: serde_json::Value,
    pub semantics: serde_json::Value,
    pub scenarios: Vec<Scenario>,
}

impl Cases {
    /// Loads and parses a cases file.
    pub fn load(path: &Path) -> Cases {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
    }

    /// The vendored copy in this repository, with IPVS mode's differences.
    pub fn vendored() -> Cases {
        let mut c = Cases::load(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/cases.json"),
        );
        c.apply_ipvs_differences();
        c
    }

    /// Switchyard's own cases (same schema): topology, dual-stack, UDP.
    pub fn own() -> Cases {
        let mut c = Cases::load(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/own-cases.json"),
        );
        c.apply_ipvs_differences();
        c
    }

    /// Adds `tests/conformance/ipvs-differences.json` (where IPVS mode differs by design,
    /// each with its reason) to the flows as `modeDifferences.ipvs`. An entry naming a
    /// flow of these cases that does not exist, or one that has an IPVS entry already,
    /// panics: the file cannot go stale unnoticed.
    fn apply_ipvs_differences(&mut self) {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/ipvs-differences.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let file: IpvsDifferences = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
        for d in file.differences {
            let Some(scenario) = self.scenarios.iter_mut().find(|s| s.id == d.scenario) else {
                continue;
            };
            let flow = scenario
                .flows
                .iter_mut()
                .find(|f| f.name == d.flow)
                .unwrap_or_else(|| {
                    panic!(
                        "ipvs-differences.json: no flow {:?} in {}",
                        d.flow, d.scenario
                    )
                });
            assert!(
                d.reason.len() > 20,
                "ipvs-differences.json: {}/{}: say why",
                d.scenario,
                d.flow
            );
            let old = flow.mode_differences.insert(
                "ipvs".into(),
                ModeDifference {
                    verdict: d.verdict,
                    endpoints: d.endpoints,
                    masquerade: d.masquerade,
                    notes: Some(d.reason),
                },
            );
            assert!(
                old.is_none(),
                "ipvs-differences.json: {}/{} twice",
                d.scenario,
                d.flow
            );
        }
    }

    /// Every scenario id the differences file names, for the check that none is stale.
    pub fn ipvs_difference_scenarios() -> Vec<String> {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/ipvs-differences.json");
        let file: IpvsDifferences =
            serde_json::from_str(&std::fs::read_to_string(path).expect("ipvs-differences.json"))
                .expect("ipvs-differences.json");
        file.differences.into_iter().map(|d| d.scenario).collect()
    }

    pub fn scenario(&self, id: &str) -> &Scenario {
        self.scenarios
            .iter()
            .find(|s| s.id == id)
            .unwrap_or_else(|| panic!("scenario {id:?} not found"))
    }
}

/// One node state: config, Services, EndpointSlices and the flows to probe.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Scenario {
    pub id: String,
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub title: String,
    pub node: NodeConfig,
    pub services: Vec<Service>,
    pub endpoint_slices: Vec<EndpointSlice>,
    pub flows: Vec<Flow>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeConfig {
    pub name: String,
    pub ip_family: String,
    pub ips: Vec<IpAddr>,
    #[serde(rename = "primaryIP")]
    pub primary_ip: IpAddr,
    #[serde(rename = "podCIDR")]
    pub pod_cidr: Option<String>,
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Option<String>,
    pub local_detect_mode: Option<String>,
    #[serde(rename = "serviceCIDRs")]
    pub service_cidrs: Vec<String>,
    pub masquerade_all: bool,
    pub node_port_addresses: Option<Vec<String>>,
    pub localhost_node_ports: bool,
    /// The node's `topology.kubernetes.io/zone` label (our own cases only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// BridgeInterface detection: the pods' bridge, which the rig then builds (our own
    /// cases only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge_interface: Option<String>,
    /// InterfaceNamePrefix detection (the rig's pod veths are `p<i>`; our own cases only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_name_prefix: Option<String>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
    #[serde(rename = "SCTP")]
    Sctp,
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        })
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Service {
    pub namespace: String,
    pub name: String,
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(rename = "clusterIP")]
    pub cluster_ip: Option<String>,
    /// Dual-stack: every cluster IP, primary first (our own cases only).
    #[serde(default, rename = "clusterIPs", skip_serializing_if = "Vec::is_empty")]
    pub cluster_ips: Vec<String>,
    pub ports: Vec<ServicePort>,
    #[serde(default, rename = "externalIPs")]
    pub external_ips: Vec<String>,
    #[serde(default, rename = "loadBalancerIPs")]
    pub load_balancer_ips: Vec<String>,
    #[serde(default)]
    pub load_balancer_source_ranges: Vec<String>,
    #[serde(default = "cluster")]
    pub external_traffic_policy: String,
    #[serde(default = "cluster")]
    pub internal_traffic_policy: String,
    #[serde(default = "none")]
    pub session_affinity: String,
    #[serde(default)]
    pub session_affinity_timeout_seconds: Option<u32>,
    #[serde(default)]
    pub health_check_node_port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
}

fn cluster() -> String {
    "Cluster".to_string()
}

fn none() -> String {
    "None".to_string()
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    #[serde(default)]
    pub name: String,
    pub port: u16,
    pub protocol: Protocol,
    #[serde(default)]
    pub node_port: Option<u16>,
    #[serde(default)]
    pub target_port: Option<TargetPort>,
}

/// A Service targetPort: a number or a named container port.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub enum TargetPort {
    Number(u16),
    Name(String),
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSlice {
    pub namespace: String,
    pub service: String,
    pub name: String,
    pub address_type: String,
    pub ports: Vec<SlicePort>,
    pub endpoints: Vec<Endpoint>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlicePort {
    #[serde(default)]
    pub name: String,
    pub port: u16,
    pub protocol: Protocol,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    pub addresses: Vec<IpAddr>,
    #[serde(default)]
    pub node_name: Option<String>,
    #[serde(default)]
    pub ready: Option<bool>,
    #[serde(default)]
    pub serving: Option<bool>,
    #[serde(default)]
    pub terminating: Option<bool>,
    /// Topology hints (our own cases only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hints: Option<Hints>,
}

/// An endpoint's topology hints.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Hints {
    #[serde(default)]
    pub for_zones: Vec<String>,
    #[serde(default)]
    pub for_nodes: Vec<String>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum SourceKind {
    Pod,
    EndpointSelf,
    Node,
    Localhost,
    External,
    LbIpSelf,
}

impl SourceKind {
    /// What `switchyard trace --from-kind` calls it.
    pub fn trace_kind(self) -> &'static str {
        match self {
            SourceKind::Pod | SourceKind::EndpointSelf => "pod",
            SourceKind::Node | SourceKind::LbIpSelf => "node",
            SourceKind::Localhost => "localhost",
            SourceKind::External => "external",
        }
    }
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub enum Verdict {
    #[serde(rename = "DNAT")]
    Dnat,
    #[serde(rename = "REJECT")]
    Reject,
    #[serde(rename = "DROP")]
    Drop,
    #[serde(rename = "ACCEPT")]
    Accept,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Dnat => "DNAT",
            Verdict::Reject => "REJECT",
            Verdict::Drop => "DROP",
            Verdict::Accept => "ACCEPT",
        })
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Flow {
    pub name: String,
    pub source: IpAddr,
    pub source_kind: SourceKind,
    pub destination: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
    pub expect: Expect,
    #[serde(default)]
    pub tested_in: Vec<String>,
    #[serde(default)]
    pub origin: String,
    #[serde(default)]
    pub mode_differences: BTreeMap<String, ModeDifference>,
    #[serde(default)]
    pub tracer_only: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Expect {
    pub verdict: Verdict,
    #[serde(default)]
    pub endpoints: Vec<String>,
    #[serde(default)]
    pub masquerade: Option<bool>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModeDifference {
    pub verdict: Verdict,
    #[serde(default)]
    pub endpoints: Option<Vec<String>>,
    #[serde(default)]
    pub masquerade: Option<bool>,
    #[serde(default)]
    pub notes: Option<String>,
}

/// `tests/conformance/ipvs-differences.json`.
#[derive(Clone, Debug, Deserialize)]
struct IpvsDifferences {
    differences: Vec<IpvsDifference>,
}

#[derive(Clone, Debug, Deserialize)]
struct IpvsDifference {
    scenario: String,
    flow: String,
    verdict: Verdict,
    #[serde(default)]
    endpoints: Option<Vec<String>>,
    #[serde(default)]
    masquerade: Option<bool>,
    reason: String,
}

/// The kube-proxy mode whose expectations are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Nftables,
    Iptables,
    Ipvs,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Nftables => "nftables",
            Mode::Iptables => "iptables",
            Mode::Ipvs => "ipvs",
        }
    }
}

impl Flow {
    /// The expectation for `mode`: `expect`, overridden by `modeDifferences[mode]`.
    pub fn expectation(&self, mode: Mode) -> Expect {
        let Some(diff) = self.mode_differences.get(mode.as_str()) else {
            return self.expect.clone();
        };
        let dnat = diff.verdict == Verdict::Dnat;
        Expect {
            verdict: diff.verdict,
            endpoints: match &diff.endpoints {
                Some(e) => e.clone(),
                None if dnat => self.expect.endpoints.clone(),
                None => Vec::new(),
            },
            masquerade: match diff.masquerade {
                Some(m) => Some(m),
                None if dnat => self.expect.masquerade,
                None => None,
            },
        }
    }
}

impl Flow {
    /// What `switchyard trace --json` says of this flow, given a configuration and
    /// manifests; panics (naming the flow) when trace fails.
    pub fn trace(&self, config: &Path, manifests: &Path) -> serde_json::Value {
        let to = std::net::SocketAddr::new(self.destination, self.port);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .arg("trace")
            .arg("--config")
            .arg(config)
            .arg("--manifests")
            .arg(manifests)
            .args(["--from", &self.source.to_string()])
            .args(["--to", &format!("{to}/{}", self.protocol)])
            .args(["--from-kind", self.source_kind.trace_kind(), "--json"])
            .output()
            .expect("running switchyard trace");
        assert!(
            out.status.success(),
            "trace of {}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("trace's JSON")
    }

    /// A flow built in code (for rig self-checks and incremental tests).
    pub fn new(
        name: &str,
        source_kind: SourceKind,
        source: IpAddr,
        destination: IpAddr,
        port: u16,
        protocol: Protocol,
        expect: Expect,
    ) -> Flow {
        Flow {
            name: name.to_string(),
            source,
            source_kind,
            destination,
            port,
            protocol,
            expect,
            tested_in: Vec::new(),
            origin: "rig".to_string(),
            mode_differences: BTreeMap::new(),
            tracer_only: false,
            notes: None,
        }
    }
}

impl Expect {
    pub fn dnat(endpoints: &[&str], masquerade: bool) -> Expect {
        Expect {
            verdict: Verdict::Dnat,
            endpoints: endpoints.iter().map(|e| e.to_string()).collect(),
            masquerade: Some(masquerade),
        }
    }

    pub fn verdict(verdict: Verdict) -> Expect {
        Expect {
            verdict,
            endpoints: Vec::new(),
            masquerade: None,
        }
    }
}
