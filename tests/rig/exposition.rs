//! Reading Prometheus's text exposition format: one sample's value, a histogram's buckets,
//! and a quantile from them, for tests and benchmarks that scrape the real endpoint.

/// The value of the sample named exactly `name` (labels included), if present.
pub fn value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// `name` of the IPv4 series: kube-proxy (and so Switchyard) labels most of its metrics
/// with the `ip_family` of the proxier that recorded them.
pub fn v4(name: &str) -> String {
    format!("{name}{{ip_family=\"IPv4\"}}")
}

/// (upper bound, cumulative count) of a histogram: its unlabelled series, or its IPv4 one.
pub fn buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{");
    text.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (labels, count) = rest.split_once("} ")?;
            let mut le = None;
            for pair in labels.split(',') {
                match pair.split_once('=')? {
                    ("le", v) => le = Some(v.trim_matches('"')),
                    ("ip_family", v) if v != "\"IPv4\"" => return None,
                    _ => {}
                }
            }
            let le = match le? {
                "+Inf" => f64::INFINITY,
                v => v.parse().ok()?,
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// Quantile by linear interpolation inside the bucket, as Prometheus does.
pub fn quantile(b: &[(f64, f64)], q: f64) -> f64 {
    let total = b.last().map(|x| x.1).unwrap_or(0.0);
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, c) in b {
        if c >= rank {
            if le.is_infinite() {
                return prev.0;
            }
            let frac = if c > prev.1 {
                (rank - prev.1) / (c - prev.1)
            } else {
                0.0
            };
            return prev.0 + (le - prev.0) * frac;
        }
        prev = (le, c);
    }
    prev.0
}
