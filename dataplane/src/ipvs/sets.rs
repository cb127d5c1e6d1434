//! kube-proxy's IPVS-mode ipsets: their names, types and members, and the `ipset restore`
//! input that brings the kernel's sets to what a plan wants (pure).

use crate::model::IpFamily;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// One of kube-proxy's sets (one per family, except where the name says otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetName {
    ClusterIp,
    LoopBack,
    ExternalIp,
    ExternalIpLocal,
    LoadBalancer,
    LoadBalancerLocal,
    LoadBalancerFw,
    LoadBalancerSourceIp,
    LoadBalancerSourceCidr,
    NodePortTcp,
    NodePortLocalTcp,
    NodePortUdp,
    NodePortLocalUdp,
    HealthCheckNodePort,
    IpvsIps,
    /// Switchyard's own: front ends whose Local policy leaves no endpoint while the
    /// service has some elsewhere; dropped, as the other modes do (kube-proxy's IPVS mode
    /// would answer with an ICMP port unreachable).
    NoLocalEndpoints,
}

impl SetName {
    pub const ALL: [SetName; 16] = [
        SetName::ClusterIp,
        SetName::LoopBack,
        SetName::ExternalIp,
        SetName::ExternalIpLocal,
        SetName::LoadBalancer,
        SetName::LoadBalancerLocal,
        SetName::LoadBalancerFw,
        SetName::LoadBalancerSourceIp,
        SetName::LoadBalancerSourceCidr,
        SetName::NodePortTcp,
        SetName::NodePortLocalTcp,
        SetName::NodePortUdp,
        SetName::NodePortLocalUdp,
        SetName::HealthCheckNodePort,
        SetName::IpvsIps,
        SetName::NoLocalEndpoints,
    ];

    /// The IPv4 name, kube-proxy's.
    fn base(self) -> &'static str {
        match self {
            SetName::ClusterIp => "KUBE-CLUSTER-IP",
            SetName::LoopBack => "KUBE-LOOP-BACK",
            SetName::ExternalIp => "KUBE-EXTERNAL-IP",
            SetName::ExternalIpLocal => "KUBE-EXTERNAL-IP-LOCAL",
            SetName::LoadBalancer => "KUBE-LOAD-BALANCER",
            SetName::LoadBalancerLocal => "KUBE-LOAD-BALANCER-LOCAL",
            SetName::LoadBalancerFw => "KUBE-LOAD-BALANCER-FW",
            SetName::LoadBalancerSourceIp => "KUBE-LOAD-BALANCER-SOURCE-IP",
            SetName::LoadBalancerSourceCidr => "KUBE-LOAD-BALANCER-SOURCE-CIDR",
            SetName::NodePortTcp => "KUBE-NODE-PORT-TCP",
            SetName::NodePortLocalTcp => "KUBE-NODE-PORT-LOCAL-TCP",
            SetName::NodePortUdp => "KUBE-NODE-PORT-UDP",
            SetName::NodePortLocalUdp => "KUBE-NODE-PORT-LOCAL-UDP",
            SetName::HealthCheckNodePort => "KUBE-HEALTH-CHECK-NODE-PORT",
            SetName::IpvsIps => "KUBE-IPVS-IPS",
            SetName::NoLocalEndpoints => "SWITCHYARD-NO-LOCAL-ENDPOINTS",
        }
    }

    /// The set's name in `family`: kube-proxy's, with `KUBE-6-` for IPv6, cut to the 31
    /// characters ipset allows (only `KUBE-6-LOAD-BALANCER-SOURCE-CIDR` is longer).
    pub fn name(self, family: IpFamily) -> String {
        match family {
            IpFamily::V4 => self.base().to_string(),
            IpFamily::V6 if self == SetName::NoLocalEndpoints => {
                "SWITCHYARD-6-NO-LOCAL-ENDPOINTS".into()
            }
            IpFamily::V6 => {
                let mut n = format!("KUBE-6-{}", &self.base()["KUBE-".len()..]);
                n.truncate(31);
                n
            }
        }
    }

    /// The `ipset create` type and options.
    fn create_args(self, family: IpFamily) -> String {
        let fam = match family {
            IpFamily::V4 => "inet",
            IpFamily::V6 => "inet6",
        };
        let hash = |t: &str| format!("{t} family {fam}");
        match self {
            SetName::ClusterIp
            | SetName::ExternalIp
            | SetName::ExternalIpLocal
            | SetName::LoadBalancer
            | SetName::LoadBalancerLocal
            | SetName::LoadBalancerFw
            | SetName::NoLocalEndpoints => hash("hash:ip,port"),
            SetName::LoopBack | SetName::LoadBalancerSourceIp => hash("hash:ip,port,ip"),
            SetName::LoadBalancerSourceCidr => hash("hash:ip,port,net"),
            SetName::IpvsIps => hash("hash:ip"),
            SetName::NodePortTcp
            | SetName::NodePortLocalTcp
            | SetName::NodePortUdp
            | SetName::NodePortLocalUdp
            | SetName::HealthCheckNodePort => "bitmap:port range 0-65535".to_string(),
        }
    }

    /// Whether `name` is one of ours, in either family (for cleanup).
    pub fn is_ours(name: &str) -> bool {
        IpFamily::ALL
            .iter()
            .any(|f| SetName::ALL.iter().any(|s| s.name(*f) == name))
    }
}

/// Members of every set, per family; a set not listed is empty. Each member counts the
/// service ports that want it, so that one port's going removes only what it alone held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sets {
    members: BTreeMap<(SetName, IpFamily), BTreeMap<String, u32>>,
}

impl Sets {
    /// Adds one want of `member`; true when it is new to the set.
    pub fn insert(&mut self, set: SetName, family: IpFamily, member: String) -> bool {
        let n = self
            .members
            .entry((set, family))
            .or_default()
            .entry(member)
            .or_insert(0);
        *n += 1;
        *n == 1
    }

    /// Drops one want of `member`; true when nothing wants it any more (it left the set).
    pub fn remove(&mut self, set: SetName, family: IpFamily, member: &str) -> bool {
        let Some(m) = self.members.get_mut(&(set, family)) else {
            return false;
        };
        let Some(n) = m.get_mut(member) else {
            return false;
        };
        *n -= 1;
        if *n > 0 {
            return false;
        }
        m.remove(member);
        if m.is_empty() {
            self.members.remove(&(set, family));
        }
        true
    }

    pub fn contains(&self, set: SetName, family: IpFamily, member: &str) -> bool {
        self.members
            .get(&(set, family))
            .is_some_and(|m| m.contains_key(member))
    }

    pub fn members(&self, set: SetName, family: IpFamily) -> Vec<&str> {
        self.members
            .get(&(set, family))
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    fn get(&self, set: SetName, family: IpFamily) -> Option<&BTreeMap<String, u32>> {
        self.members.get(&(set, family))
    }

    pub fn len(&self) -> usize {
        self.members.values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One set member: the set, its family and the member as ipset writes it.
pub type Member = (SetName, IpFamily, String);

/// Families whose sets a sync writes.
fn families(families: &[IpFamily]) -> impl Iterator<Item = (SetName, IpFamily)> + '_ {
    families
        .iter()
        .flat_map(|f| SetName::ALL.iter().map(move |s| (*s, *f)))
}

/// Restore input that replaces every set of `families` with `want`'s members, each set in
/// one swap (a set is never seen half filled): sets are created when missing, filled
/// under a temporary name, swapped in, and the temporary one destroyed.
pub fn full_input(want: &Sets, fams: &[IpFamily]) -> String {
    let mut out = String::new();
    for (i, (set, family)) in families(fams).enumerate() {
        let name = set.name(family);
        let args = set.create_args(family);
        let tmp = format!("SWITCHYARD-TMP-{i}");
        let _ = writeln!(out, "create {name} {args} -exist");
        let _ = writeln!(out, "create {tmp} {args} -exist");
        let _ = writeln!(out, "flush {tmp}");
        for m in want.get(set, family).into_iter().flat_map(|m| m.keys()) {
            let _ = writeln!(out, "add {tmp} {m} -exist");
        }
        let _ = writeln!(out, "swap {tmp} {name}");
        let _ = writeln!(out, "destroy {tmp}");
    }
    out
}

/// Restore input that moves the sets from `had` (what the last sync wrote) to `want`:
/// only the members that differ. Empty when nothing does.
pub fn partial_input(had: &Sets, want: &Sets) -> (String, usize) {
    let empty = BTreeMap::new();
    let keys: BTreeSet<&(SetName, IpFamily)> =
        had.members.keys().chain(want.members.keys()).collect();
    let (mut removed, mut added) = (Vec::new(), Vec::new());
    for key in keys {
        let (set, family) = *key;
        let old = had.members.get(key).unwrap_or(&empty);
        let new = want.members.get(key).unwrap_or(&empty);
        removed.extend(
            old.keys()
                .filter(|m| !new.contains_key(*m))
                .map(|m| (set, family, m.clone())),
        );
        added.extend(
            new.keys()
                .filter(|m| !old.contains_key(*m))
                .map(|m| (set, family, m.clone())),
        );
    }
    (delta_input(&removed, &added), removed.len() + added.len())
}

/// Restore input that deletes `removed` and adds `added`.
pub fn delta_input(removed: &[Member], added: &[Member]) -> String {
    let mut out = String::new();
    for (set, family, m) in removed {
        let _ = writeln!(out, "del {} {m} -exist", set.name(*family));
    }
    for (set, family, m) in added {
        let _ = writeln!(out, "add {} {m} -exist", set.name(*family));
    }
    out
}

/// Restore input that destroys `names` (ours, as `ipset list -n` showed them).
pub fn destroy_input(names: &[String]) -> String {
    names
        .iter()
        .filter(|n| SetName::is_ours(n) || n.starts_with("SWITCHYARD-TMP-"))
        .map(|n| format!("destroy {n}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_kube_proxys_and_fit_ipset() {
        assert_eq!(SetName::ClusterIp.name(IpFamily::V4), "KUBE-CLUSTER-IP");
        assert_eq!(SetName::ClusterIp.name(IpFamily::V6), "KUBE-6-CLUSTER-IP");
        for f in IpFamily::ALL {
            for s in SetName::ALL {
                assert!(s.name(f).len() <= 31, "{}", s.name(f));
            }
        }
        assert!(SetName::is_ours("KUBE-6-NODE-PORT-UDP"));
        assert!(!SetName::is_ours("KUBE-SOMETHING-ELSE"));
    }

    #[test]
    fn full_input_swaps_each_set_and_partial_touches_only_differences() {
        let mut want = Sets::default();
        want.insert(
            SetName::ClusterIp,
            IpFamily::V4,
            "172.30.0.1,tcp:443".into(),
        );
        want.insert(SetName::NodePortTcp, IpFamily::V4, "30080".into());
        let full = full_input(&want, &[IpFamily::V4]);
        assert!(full.contains("create KUBE-CLUSTER-IP hash:ip,port family inet -exist\n"));
        assert!(full.contains("create KUBE-NODE-PORT-TCP bitmap:port range 0-65535 -exist\n"));
        assert!(full.contains("add SWITCHYARD-TMP-0 172.30.0.1,tcp:443 -exist\nswap SWITCHYARD-TMP-0 KUBE-CLUSTER-IP\n"));
        assert_eq!(full.matches("swap ").count(), SetName::ALL.len());

        let mut next = want.clone();
        next.insert(SetName::ClusterIp, IpFamily::V4, "172.30.0.2,udp:53".into());
        let mut gone = next.clone();
        gone.members.remove(&(SetName::NodePortTcp, IpFamily::V4));
        let (input, n) = partial_input(&want, &gone);
        assert_eq!(n, 2);
        assert_eq!(
            input,
            "del KUBE-NODE-PORT-TCP 30080 -exist\nadd KUBE-CLUSTER-IP 172.30.0.2,udp:53 -exist\n"
        );
        assert_eq!(partial_input(&gone, &gone), (String::new(), 0));

        // A member two service ports want stays until both let go.
        let mut shared = Sets::default();
        assert!(shared.insert(SetName::LoopBack, IpFamily::V4, "m".into()));
        assert!(!shared.insert(SetName::LoopBack, IpFamily::V4, "m".into()));
        assert!(!shared.remove(SetName::LoopBack, IpFamily::V4, "m"));
        assert!(shared.contains(SetName::LoopBack, IpFamily::V4, "m"));
        assert!(shared.remove(SetName::LoopBack, IpFamily::V4, "m"));
        assert!(shared.is_empty());
    }
}
