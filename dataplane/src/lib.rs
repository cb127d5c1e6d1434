//! Switchyard's dataplane: the service model, endpoint selection and the kernel backends.
//!
//! Nothing here knows about the Kubernetes API; the agent converts API objects into
//! [`model::Snapshot`] and hands it to a [`backend::Backend`].
#![forbid(unsafe_code)]

pub mod backend;
pub mod conntrack;
pub mod fault;
pub mod frontends;
pub mod interned;
pub mod iptables;
pub mod ipvs;
pub mod model;
pub mod netlink;
pub mod nft;
pub mod process;
pub mod selection;
pub mod synth;
pub mod tally;
pub mod trace;
