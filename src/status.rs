//! `switchyard status`: what a running agent programs, read from its own metrics and health
//! endpoints, as a table for a terminal. Parsing and the table are pure; fetching is a
//! plain HTTP/1.1 GET.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One sample of the Prometheus text exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The samples of a text exposition (comments and malformed lines skipped).
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|line| {
            let (head, value) = line.rsplit_once(' ')?;
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().ok()?,
            };
            let (name, labels) = match head.split_once('{') {
                None => (head.to_string(), Vec::new()),
                Some((name, rest)) => {
                    let body = rest.strip_suffix('}')?;
                    let labels = body
                        .split("\",")
                        .filter(|p| !p.is_empty())
                        .filter_map(|p| {
                            let (k, v) = p.split_once("=\"")?;
                            Some((k.to_string(), v.trim_end_matches('"').to_string()))
                        })
                        .collect();
                    (name.to_string(), labels)
                }
            };
            Some(Sample {
                name,
                labels,
                value,
            })
        })
        .collect()
}

fn matching<'s>(
    samples: &'s [Sample],
    name: &'s str,
    label: Option<(&'s str, &'s str)>,
) -> impl Iterator<Item = f64> + 's {
    samples
        .iter()
        .filter(move |s| s.name == name && label.is_none_or(|(k, v)| s.label(k) == Some(v)))
        .map(|s| s.value)
}

/// The value of a sample with no per-family series, or the largest across families: one
/// sync is recorded in each family's series (as kube-proxy's per-family proxiers record
/// theirs), so the largest is the node's count or latest time.
fn value(samples: &[Sample], name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    matching(samples, name, label).reduce(f64::max)
}

/// The sum across families: what each family holds apart (services without local
/// endpoints).
fn total(samples: &[Sample], name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    matching(samples, name, label).reduce(|a, b| a + b)
}

/// The `q` quantile of a cumulative histogram, interpolated within its bucket as
/// Prometheus's `histogram_quantile` does; `None` without observations.
pub fn quantile(samples: &[Sample], histogram: &str, q: f64) -> Option<f64> {
    let name = format!("{histogram}_bucket");
    // Series of several families are added bucket by bucket, as `sum by (le)` does.
    let mut summed: Vec<(f64, f64)> = Vec::new();
    for s in samples.iter().filter(|s| s.name == name) {
        let Some(le) = s.label("le").and_then(|v| match v {
            "+Inf" => Some(f64::INFINITY),
            v => v.parse().ok(),
        }) else {
            continue;
        };
        match summed.iter_mut().find(|(l, _)| *l == le) {
            Some((_, c)) => *c += s.value,
            None => summed.push((le, s.value)),
        }
    }
    let mut buckets = summed;
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for (le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(prev.0);
            }
            let within = (count - prev.1).max(f64::MIN_POSITIVE);
            return Some(prev.0 + (le - prev.0) * (rank - prev.1) / within);
        }
        prev = (le, count);
    }
    Some(prev.0)
}

fn ms(secs: Option<f64>) -> String {
    secs.map(|s| format!("{:.1} ms", s * 1000.0))
        .unwrap_or_else(|| "-".into())
}

fn count(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.0}")).unwrap_or_else(|| "-".into())
}

/// The table: from the metrics text, the health reply (status and JSON body) and the
/// current Unix time.
pub fn table(metrics: &str, health: Option<(u16, &str)>, now_unix: f64) -> String {
    let s = parse(metrics);
    let mut rows: Vec<(&str, String)> = Vec::new();
    let health_row = match health {
        Some((200, _)) => "healthy (/healthz 200)".to_string(),
        Some((code, body)) => {
            let eligible = serde_json::from_str::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v["nodeEligible"].as_bool());
            match eligible {
                Some(false) => format!("node being deleted (/healthz {code})"),
                _ => format!("UNHEALTHY: updates pending too long (/healthz {code})"),
            }
        }
        None => "health endpoint unreachable".to_string(),
    };
    rows.push(("health", health_row));
    rows.push((
        "service ports",
        count(value(
            &s,
            "switchyard_programmed",
            Some(("what", "service_ports")),
        )),
    ));
    rows.push((
        "endpoints",
        count(value(
            &s,
            "switchyard_programmed",
            Some(("what", "endpoints")),
        )),
    ));
    let last = value(
        &s,
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        None,
    )
    .filter(|t| *t > 0.0);
    rows.push((
        "last sync",
        last.map(|t| format!("{:.1} s ago", (now_unix - t).max(0.0)))
            .unwrap_or_else(|| "never".into()),
    ));
    let syncs = "kubeproxy_sync_proxy_rules_duration_seconds";
    rows.push((
        "syncs (full / partial)",
        format!(
            "{} ({} / {})",
            count(value(&s, &format!("{syncs}_count"), None)),
            count(value(
                &s,
                "kubeproxy_sync_full_proxy_rules_duration_seconds_count",
                None
            )),
            count(value(
                &s,
                "kubeproxy_sync_partial_proxy_rules_duration_seconds_count",
                None
            )),
        ),
    ));
    rows.push((
        "sync latency p50 / p99 (since start)",
        format!(
            "{} / {}",
            ms(quantile(&s, syncs, 0.5)),
            ms(quantile(&s, syncs, 0.99))
        ),
    ));
    rows.push((
        "pending changes",
        format!(
            "{} services, {} endpoint slices",
            count(value(
                &s,
                "kubeproxy_sync_proxy_rules_service_changes_pending",
                None
            )),
            count(value(
                &s,
                "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                None
            )),
        ),
    ));
    let failures: Vec<String> = s
        .iter()
        .filter(|x| x.name == "switchyard_sync_failures_total" && x.value > 0.0)
        .map(|x| format!("{} {:.0}", x.label("reason").unwrap_or("?"), x.value))
        .collect();
    rows.push((
        "sync failures",
        if failures.is_empty() {
            "none".into()
        } else {
            failures.join(", ")
        },
    ));
    rows.push((
        "drift repairs",
        count(value(&s, "switchyard_drift_repairs_total", None)),
    ));
    rows.push((
        "no local endpoints",
        format!(
            "{} internal, {} external",
            count(total(
                &s,
                "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                Some(("traffic_policy", "internal"))
            )),
            count(total(
                &s,
                "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                Some(("traffic_policy", "external"))
            )),
        ),
    ));
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(k, v)| format!("{k:<width$}  {v}\n"))
        .collect()
}

/// GET `path` from `addr`: (status, body).
pub fn get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let sa: SocketAddr = addr.parse().map_err(|e| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{addr}: {e}"))
    })?;
    let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(3))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(raw.len());
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let body = raw.get(split + 4..).unwrap_or(&[]);
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_vec()
    };
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}

/// The payload of a chunked body, on bytes (a chunk may end inside a character).
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = body.windows(2).position(|w| w == b"\r\n") {
        let size = String::from_utf8_lossy(&body[..eol]);
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        let rest = &body[eol + 2..];
        if n == 0 || rest.len() < n {
            break;
        }
        out.extend_from_slice(&rest[..n]);
        body = rest[n..].strip_prefix(b"\r\n").unwrap_or(&rest[n..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Per family, as kube-proxy v1.37 and the agent export them: each sync in both.
    const TEXT: &str = r#"# HELP x
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.001"} 0
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.002"} 5
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.004"} 10
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 10
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 10
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.001"} 0
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.002"} 5
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.004"} 10
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="+Inf"} 10
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 10
kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv6"} 1
kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"} 9
kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv6"} 9
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 999
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 1000
kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="external"} 1
switchyard_programmed{what="service_ports"} 42
switchyard_programmed{what="endpoints"} 420
switchyard_sync_failures_total{reason="rejected"} 2
switchyard_drift_repairs_total 1
kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"} 2
"#;

    #[test]
    fn chunked_bodies_join_on_bytes() {
        assert_eq!(
            dechunk(b"3\r\nab\xc3\r\n2\r\n\xa9c\r\n0\r\n\r\n"),
            "abéc".as_bytes()
        );
    }

    #[test]
    fn quantiles_interpolate_within_the_bucket() {
        let s = parse(TEXT);
        assert_eq!(
            quantile(&s, "kubeproxy_sync_proxy_rules_duration_seconds", 0.5),
            Some(0.002)
        );
        let p75 = quantile(&s, "kubeproxy_sync_proxy_rules_duration_seconds", 0.75).unwrap();
        assert!((p75 - 0.003).abs() < 1e-9, "{p75}");
        assert_eq!(quantile(&[], "x", 0.5), None);
    }

    fn row(t: &str, name: &str) -> String {
        t.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} row in\n{t}"))
            .trim()
            .to_string()
    }

    #[test]
    fn the_table_says_what_is_programmed_and_what_went_wrong() {
        let t = table(TEXT, Some((200, "{}")), 1003.0);
        for (name, want) in [
            ("service ports", "42"),
            ("endpoints", "420"),
            ("last sync", "3.0 s ago"),
            ("syncs (full / partial)", "10 (1 / 9)"),
            ("sync latency p50 / p99 (since start)", "2.0 ms / 4.0 ms"),
            ("sync failures", "rejected 2"),
            ("drift repairs", "1"),
            ("no local endpoints", "- internal, 3 external"),
            ("health", "healthy (/healthz 200)"),
        ] {
            assert_eq!(row(&t, name), want, "{name} in\n{t}");
        }
        let t = table(TEXT, Some((503, r#"{"nodeEligible": true}"#)), 1003.0);
        assert!(row(&t, "health").starts_with("UNHEALTHY"), "{t}");
        assert_eq!(row(&table("", None, 0.0), "last sync"), "never");
    }
}
