//! The IPVS backend: kube-proxy's IPVS mode (virtual services and real servers over
//! generic netlink, service addresses on kube-ipvs0, ipsets and iptables rules for what
//! IPVS does not do).

pub mod genl;
