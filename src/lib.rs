//! Switchyard, a kube-proxy replacement: the agent, its configuration (its own and
//! kube-proxy's), its commands and the node-side helpers, as a library so that the binary,
//! the tests and the benchmarks share one build of them.
#![forbid(unsafe_code)]

// Public for tests/fuzz.rs, which drives the health and metrics servers' request path.
pub mod agent;
mod backends;
pub mod cli;
pub mod commands;
// Public for tests/fuzz.rs, which fuzzes the KubeProxyConfiguration and duration parsers.
pub mod config;
// Public for tests/fuzz.rs, which converts the fuzzed manifests' objects to the model.
pub mod convert;
mod feature_gates;
pub mod ipvs_link;
pub mod kube_proxy_cli;
mod leftovers;
pub mod logging;
// Public for tests/fuzz.rs, which fuzzes the manifest parser.
pub mod manifests;
mod node_setup;
mod nodeaddr;
mod rtnl;
mod snapshot;
mod status;
