//! Network programming measured from packets: a probe Service with one endpoint on a "pod"
//! (a network namespace behind the proxy's), moved to an address never used before once a
//! second; the time from the API write until a connection to the ClusterIP is answered by
//! the new address. Both proxies see the same change, so this is the latency their own
//! `kubeproxy_network_programming_duration_seconds` estimates, taken from outside.

use super::netns;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// The pod's port (the probe Service's targetPort).
const PORT: u16 = 8080;
/// The node end of the pod's veth, and the address the proxy's connections leave from.
const GATEWAY: &str = "169.254.1.1";

/// The pod's address at `generation` (12.0.0.0/16, used by nothing else).
pub fn address(generation: usize) -> Ipv4Addr {
    Ipv4Addr::new(
        12,
        0,
        ((generation >> 8) & 0xff) as u8,
        (generation & 0xff) as u8,
    )
}

/// The probe Service's EndpointSlice with its one endpoint at `address(generation)`.
pub fn slice(name: &str, generation: usize) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{name}-1"), "namespace": "bench",
            "labels": {"kubernetes.io/service-name": name,
                       "endpointslice.kubernetes.io/managed-by": "switchyard-bench"},
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time":
                super::rfc3339_nano(SystemTime::now())}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": PORT, "protocol": "TCP"}],
        "endpoints": [{"addresses": [address(generation).to_string()],
            "conditions": {"ready": true, "serving": true, "terminating": false}}]})
}

/// The pod behind a proxy's namespace, answering every connection with the address it
/// was made to.
pub struct Pod {
    proxy_ns: String,
    ns: String,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Pod {
    /// The pod namespace and its veth; routes in the proxy's namespace for the pod's
    /// addresses and for the Service CIDR (a connection to a ClusterIP needs a route before
    /// the proxy's DNAT), both through the veth.
    pub fn start(proxy_ns: &str, service_cidr: &str) -> Pod {
        let ns = format!("{proxy_ns}-pod");
        netns::create_namespace(&ns).expect("pod namespace");
        for n in [proxy_ns, ns.as_str()] {
            netns::sysctls(
                n,
                &[
                    "net.ipv4.conf.all.rp_filter=0",
                    "net.ipv4.conf.default.rp_filter=0",
                ],
            );
        }
        netns::ip_batch(
            proxy_ns,
            &[
                format!("link add vp type veth peer name eth0 netns {ns}"),
                format!("addr add {GATEWAY}/32 dev vp"),
                "link set vp up".into(),
                "route add 12.0.0.0/16 dev vp".into(),
                format!("route add {service_cidr} dev vp src {GATEWAY}"),
            ],
        );
        netns::ip_batch(
            &ns,
            &[
                format!("addr add {}/32 dev eth0", address(1)),
                "link set eth0 up".into(),
                "link set lo up".into(),
                format!("route add {GATEWAY} dev eth0"),
                format!("route add default via {GATEWAY} dev eth0"),
            ],
        );
        let listener = netns::in_netns(&ns, || {
            let l = TcpListener::bind(("0.0.0.0", PORT))?;
            l.set_nonblocking(true)?;
            Ok(l)
        })
        .expect("pod listener");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        if let Ok(local) = s.local_addr() {
                            let _ = writeln!(s, "{}", local.ip());
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Pod {
            proxy_ns: proxy_ns.to_string(),
            ns,
            stop,
            thread: Some(thread),
        }
    }

    /// The pod takes `address(generation)` (before the API hears of it, so the first
    /// connection the proxy sends there is answered).
    pub fn add(&self, generation: usize) {
        netns::ip_batch(
            &self.ns,
            &[format!("addr add {}/32 dev eth0", address(generation))],
        );
    }

    /// Which pod address answers a connection to `vip` from the proxy's namespace, if any.
    fn answer(&self, vip: SocketAddr) -> Option<Ipv4Addr> {
        netns::in_netns(&self.proxy_ns, || {
            let s = TcpStream::connect_timeout(&vip, Duration::from_millis(200))?;
            s.set_read_timeout(Some(Duration::from_millis(500)))?;
            let mut line = String::new();
            BufReader::new(s).read_line(&mut line)?;
            Ok(line.trim().parse().ok())
        })
        .ok()
        .flatten()
    }

    /// From `written` (just before the API write that moved the endpoint there) until a
    /// connection to `vip` is answered by `address(generation)`; `None` after `limit`.
    pub fn until_moved(
        &self,
        vip: SocketAddr,
        generation: usize,
        written: Instant,
        limit: Duration,
    ) -> Option<Duration> {
        let want = address(generation);
        while written.elapsed() < limit {
            if self.answer(vip) == Some(want) {
                return Some(written.elapsed());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        netns::delete_namespace(&self.ns);
    }
}
