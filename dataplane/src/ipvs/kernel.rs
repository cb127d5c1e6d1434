//! What IPVS mode touches in the kernel besides iptables, behind [`IpvsKernel`]: IPVS
//! itself (generic netlink), the ipsets (`ipset restore`), the `kube-ipvs0` dummy link
//! ([`DummyLink`], implemented over rtnetlink by the agent) and the sysctls IPVS needs.
//! [`RealIpvs`] is the kernel; [`FakeIpvs`] holds the same state in memory for unit tests.

use super::genl::{Dest, GenlError, IpvsSocket, Op, ServiceId, ServiceSpec};
use crate::backend::BackendError;
use crate::netlink::NetlinkError;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// The dummy interface kube-proxy binds service addresses to.
pub const DUMMY: &str = "kube-ipvs0";

/// Errors of IPVS mode's kernel operations.
#[derive(Debug, thiserror::Error)]
pub enum IpvsError {
    #[error(transparent)]
    Netlink(#[from] GenlError),
    #[error("ipset restore failed: {0}")]
    Ipset(String),
    #[error("{DUMMY}: {0}")]
    Link(String),
    #[error("sysctl {path}: {source}")]
    Sysctl {
        path: String,
        source: std::io::Error,
    },
}

impl From<IpvsError> for BackendError {
    fn from(e: IpvsError) -> BackendError {
        BackendError::new(e.reason(), e)
    }
}

impl IpvsError {
    /// A short, stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            IpvsError::Netlink(GenlError::Netlink(NetlinkError::Kernel { .. })) => "rejected",
            IpvsError::Netlink(_) => "read",
            IpvsError::Ipset(_) => "ipset",
            IpvsError::Link(_) => "link",
            IpvsError::Sysctl { .. } => "sysctl",
        }
    }
}

/// Addresses as a sync needs them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkAddresses {
    /// On kube-ipvs0.
    pub bound: BTreeSet<IpAddr>,
    /// On every other interface (loopback included): candidates for node ports.
    pub local: Vec<IpAddr>,
}

/// The `kube-ipvs0` dummy link and the node's addresses.
pub trait DummyLink {
    /// kube-ipvs0's addresses (none when it is missing) and the other interfaces'.
    fn addresses(&mut self) -> Result<LinkAddresses, String>;
    /// Binds `ips` to kube-ipvs0, creating the link when it is missing.
    fn add(&mut self, ips: &[IpAddr]) -> Result<(), String>;
    fn delete(&mut self, ips: &[IpAddr]) -> Result<(), String>;
    /// Removes kube-ipvs0; `Ok(false)` when there was none.
    fn remove(&mut self) -> Result<bool, String>;
}

/// IPVS, ipsets, kube-ipvs0 and sysctls.
pub trait IpvsKernel {
    fn services(&mut self) -> Result<Vec<(ServiceId, ServiceSpec)>, IpvsError>;
    fn dests(&mut self, id: &ServiceId) -> Result<Vec<Dest>, IpvsError>;
    fn apply(&mut self, op: &Op) -> Result<(), IpvsError>;
    /// Applies `ops` in order, each on its own (one failing does not stop the others):
    /// the outcome of each. `Err` when none could be tried.
    fn apply_all(&mut self, ops: &[Op]) -> Result<Vec<Result<(), IpvsError>>, IpvsError> {
        Ok(ops.iter().map(|op| self.apply(op)).collect())
    }
    fn ipset_restore(&mut self, input: &str) -> Result<(), IpvsError>;
    /// Names of every ipset in the kernel.
    fn ipset_names(&mut self) -> Result<Vec<String>, IpvsError>;
    fn link(&mut self) -> &mut dyn DummyLink;
    /// Sets what IPVS mode depends on: conntrack for IPVS connections (masquerade in
    /// POSTROUTING needs it), dropping connections to removed real servers, forwarding;
    /// with `strict_arp`, ARP replies only for addresses on the asking interface (so that
    /// kube-ipvs0's addresses are not announced), as kube-proxy's `ipvs.strictARP`.
    fn set_sysctls(&mut self, strict_arp: bool) -> Result<(), IpvsError>;
    /// IPVS connection timeouts in seconds; zero leaves one as it is.
    fn set_timeouts(&mut self, tcp: u32, tcp_fin: u32, udp: u32) -> Result<(), IpvsError>;
    /// Requests sent to IPVS so far (operations and dumps).
    fn requests(&self) -> u64;
}

/// The sysctls of [`IpvsKernel::set_sysctls`], as kube-proxy sets them.
pub const SYSCTLS: [(&str, &str); 4] = [
    ("/proc/sys/net/ipv4/vs/conntrack", "1"),
    ("/proc/sys/net/ipv4/vs/expire_nodest_conn", "1"),
    ("/proc/sys/net/ipv4/vs/expire_quiescent_template", "1"),
    ("/proc/sys/net/ipv4/ip_forward", "1"),
];

/// The sysctls of `ipvs.strictARP`.
pub const STRICT_ARP_SYSCTLS: [(&str, &str); 2] = [
    ("/proc/sys/net/ipv4/conf/all/arp_ignore", "1"),
    ("/proc/sys/net/ipv4/conf/all/arp_announce", "2"),
];

/// The kernel.
pub struct RealIpvs {
    socket: IpvsSocket,
    link: Box<dyn DummyLink + Send>,
}

impl std::fmt::Debug for RealIpvs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealIpvs").finish_non_exhaustive()
    }
}

impl RealIpvs {
    /// Opens IPVS's netlink family; fails with [`GenlError::NoIpvs`] when the kernel has none.
    pub fn open(link: Box<dyn DummyLink + Send>) -> Result<RealIpvs, IpvsError> {
        Ok(RealIpvs {
            socket: IpvsSocket::open()?,
            link,
        })
    }

    /// `f` on the socket. A failure of the conversation itself (the socket erred, a reply
    /// was lost or garbled) leaves it where nobody knows: a dump cut short stays running in
    /// the kernel, which then answered every later dump on that socket with EBUSY (the
    /// guest's `ipvs_netlink_faults_in_guest`). So the socket is replaced; a refusal by the
    /// kernel (an errno answer) leaves the conversation sound.
    fn on_socket<T>(
        &mut self,
        f: impl FnOnce(&mut IpvsSocket) -> Result<T, GenlError>,
    ) -> Result<T, IpvsError> {
        let result = f(&mut self.socket);
        if let Err(GenlError::Netlink(e)) = &result {
            if !matches!(e, NetlinkError::Kernel { .. }) {
                match IpvsSocket::open() {
                    Ok(mut fresh) => {
                        fresh.requests = self.socket.requests;
                        self.socket = fresh;
                    }
                    Err(e) => tracing::warn!("IPVS: cannot open a new socket: {e}"),
                }
            }
        }
        Ok(result?)
    }
}

impl IpvsKernel for RealIpvs {
    fn services(&mut self) -> Result<Vec<(ServiceId, ServiceSpec)>, IpvsError> {
        self.on_socket(|s| s.services())
    }

    fn dests(&mut self, id: &ServiceId) -> Result<Vec<Dest>, IpvsError> {
        self.on_socket(|s| s.dests(id))
    }

    fn apply(&mut self, op: &Op) -> Result<(), IpvsError> {
        self.on_socket(|s| s.apply(op))
    }

    fn apply_all(&mut self, ops: &[Op]) -> Result<Vec<Result<(), IpvsError>>, IpvsError> {
        Ok(self
            .on_socket(|s| s.apply_all(ops))?
            .into_iter()
            .map(|r| r.map_err(IpvsError::from))
            .collect())
    }

    fn ipset_restore(&mut self, input: &str) -> Result<(), IpvsError> {
        let out = crate::process::run("ipset", &["restore"], Some(input))
            .map_err(|e| IpvsError::Ipset(format!("cannot run ipset: {e}")))?;
        if out.success {
            Ok(())
        } else {
            Err(IpvsError::Ipset(out.stderr))
        }
    }

    fn ipset_names(&mut self) -> Result<Vec<String>, IpvsError> {
        let out = crate::process::run("ipset", &["list", "-n"], None)
            .map_err(|e| IpvsError::Ipset(format!("cannot run ipset: {e}")))?;
        if !out.success {
            return Err(IpvsError::Ipset(out.stderr));
        }
        Ok(out.stdout.lines().map(str::to_string).collect())
    }

    fn link(&mut self) -> &mut dyn DummyLink {
        self.link.as_mut()
    }

    fn set_sysctls(&mut self, strict_arp: bool) -> Result<(), IpvsError> {
        let extra = if strict_arp {
            &STRICT_ARP_SYSCTLS[..]
        } else {
            &[]
        };
        for &(path, value) in SYSCTLS.iter().chain(extra) {
            if std::fs::read_to_string(path).is_ok_and(|v| v.trim() == value) {
                continue;
            }
            std::fs::write(path, value).map_err(|source| IpvsError::Sysctl {
                path: path.to_string(),
                source,
            })?;
        }
        Ok(())
    }

    fn set_timeouts(&mut self, tcp: u32, tcp_fin: u32, udp: u32) -> Result<(), IpvsError> {
        self.on_socket(|s| s.set_timeouts(tcp, tcp_fin, udp))
    }

    fn requests(&self) -> u64 {
        self.socket.requests
    }
}

/// A fake virtual service: settings and real servers by address and port.
pub type FakeService = (ServiceSpec, BTreeMap<(IpAddr, u16), Dest>);

/// IPVS, ipsets and kube-ipvs0 in memory, for unit tests.
#[derive(Debug, Default, Clone)]
pub struct FakeIpvs {
    pub services: BTreeMap<ServiceId, FakeService>,
    pub ops: Vec<Op>,
    pub dumps: u64,
    pub ipset_inputs: Vec<String>,
    pub ipsets: BTreeSet<String>,
    pub addresses: LinkAddresses,
    pub link_present: bool,
    pub sysctls_set: usize,
    pub strict_arp: bool,
    pub timeouts: (u32, u32, u32),
    /// Fail the next operation naming this service.
    pub fail_op_on: Option<ServiceId>,
}

impl DummyLink for FakeIpvs {
    fn addresses(&mut self) -> Result<LinkAddresses, String> {
        Ok(self.addresses.clone())
    }

    fn add(&mut self, ips: &[IpAddr]) -> Result<(), String> {
        self.link_present = true;
        self.addresses.bound.extend(ips.iter().copied());
        Ok(())
    }

    fn delete(&mut self, ips: &[IpAddr]) -> Result<(), String> {
        for ip in ips {
            self.addresses.bound.remove(ip);
        }
        Ok(())
    }

    fn remove(&mut self) -> Result<bool, String> {
        self.addresses.bound.clear();
        Ok(std::mem::take(&mut self.link_present))
    }
}

fn errno(what: &Op, errno: i32) -> IpvsError {
    IpvsError::Netlink(GenlError::Netlink(NetlinkError::Kernel {
        op: format!("IPVS {what}"),
        errno,
    }))
}

impl IpvsKernel for FakeIpvs {
    fn services(&mut self) -> Result<Vec<(ServiceId, ServiceSpec)>, IpvsError> {
        self.dumps += 1;
        Ok(self
            .services
            .iter()
            .map(|(id, (spec, _))| (*id, spec.clone()))
            .collect())
    }

    fn dests(&mut self, id: &ServiceId) -> Result<Vec<Dest>, IpvsError> {
        self.dumps += 1;
        Ok(self
            .services
            .get(id)
            .map(|(_, d)| d.values().copied().collect())
            .unwrap_or_default())
    }

    fn apply(&mut self, op: &Op) -> Result<(), IpvsError> {
        let id = match op {
            Op::AddService(id, _)
            | Op::UpdateService(id, _)
            | Op::DeleteService(id)
            | Op::AddDest(id, ..)
            | Op::UpdateDest(id, ..)
            | Op::DeleteDest(id, ..) => *id,
        };
        if self.fail_op_on == Some(id) {
            self.fail_op_on = None;
            return Err(errno(op, 22));
        }
        // ENOENT/EEXIST as the kernel answers them.
        match op {
            Op::AddService(id, spec) => {
                if self.services.contains_key(id) {
                    return Err(errno(op, 17));
                }
                self.services.insert(*id, (spec.clone(), BTreeMap::new()));
            }
            Op::UpdateService(id, spec) => {
                self.services.get_mut(id).ok_or_else(|| errno(op, 3))?.0 = spec.clone();
            }
            Op::DeleteService(id) => {
                self.services.remove(id).ok_or_else(|| errno(op, 3))?;
            }
            Op::AddDest(id, ip, port, weight) => {
                let d = &mut self.services.get_mut(id).ok_or_else(|| errno(op, 3))?.1;
                if d.contains_key(&(*ip, *port)) {
                    return Err(errno(op, 17));
                }
                d.insert(
                    (*ip, *port),
                    Dest {
                        addr: *ip,
                        port: *port,
                        weight: *weight,
                        active_conns: 0,
                        inactive_conns: 0,
                    },
                );
            }
            Op::UpdateDest(id, ip, port, weight) => {
                let d = &mut self.services.get_mut(id).ok_or_else(|| errno(op, 3))?.1;
                d.get_mut(&(*ip, *port)).ok_or_else(|| errno(op, 2))?.weight = *weight;
            }
            Op::DeleteDest(id, ip, port) => {
                let d = &mut self.services.get_mut(id).ok_or_else(|| errno(op, 3))?.1;
                d.remove(&(*ip, *port)).ok_or_else(|| errno(op, 2))?;
            }
        }
        self.ops.push(op.clone());
        Ok(())
    }

    fn ipset_restore(&mut self, input: &str) -> Result<(), IpvsError> {
        for line in input.lines() {
            let mut w = line.split_whitespace();
            match (w.next(), w.next()) {
                (Some("create"), Some(n)) => {
                    self.ipsets.insert(n.to_string());
                }
                (Some("destroy"), Some(n)) => {
                    self.ipsets.remove(n);
                }
                _ => {}
            }
        }
        self.ipset_inputs.push(input.to_string());
        Ok(())
    }

    fn ipset_names(&mut self) -> Result<Vec<String>, IpvsError> {
        Ok(self.ipsets.iter().cloned().collect())
    }

    fn link(&mut self) -> &mut dyn DummyLink {
        self
    }

    fn set_sysctls(&mut self, strict_arp: bool) -> Result<(), IpvsError> {
        self.sysctls_set += 1;
        self.strict_arp = strict_arp;
        Ok(())
    }

    fn set_timeouts(&mut self, tcp: u32, tcp_fin: u32, udp: u32) -> Result<(), IpvsError> {
        self.timeouts = (tcp, tcp_fin, udp);
        Ok(())
    }

    fn requests(&self) -> u64 {
        self.ops.len() as u64 + self.dumps
    }
}
