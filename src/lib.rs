//! Switchyard, a kube-proxy replacement: the agent, its configuration (its own and
//! kube-proxy's), its commands and the node-side helpers, as a library so that the binary,
//! the tests and the benchmarks share one build of them.
#![forbid(unsafe_code)]

mod agent;
mod backends;
pub mod cli;
pub mod commands;
mod config;
mod convert;
mod feature_gates;
pub mod ipvs_link;
pub mod kube_proxy_cli;
mod leftovers;
pub mod logging;
mod manifests;
mod node_setup;
mod nodeaddr;
mod rtnl;
mod snapshot;
mod status;
