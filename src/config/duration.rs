//! Go durations (`metav1.Duration`): parsing `1m30s`-style text and printing it back the
//! way Go's `time.Duration.String` does, so `/configz` and `--write-config-to` match
//! kube-proxy's output.

use std::time::Duration;

/// The largest duration Go can represent (int64 nanoseconds, about 292 years). Anything
/// longer is refused rather than wrapped or panicking.
const GO_MAX_NANOS: u128 = i64::MAX as u128;

/// Parse a Go duration (`30s`, `1m0s`, `500ms`, `1h`, `1.5h`, `0`); `None` when it is not
/// one or does not fit Go's range.
pub fn parse(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(Duration::ZERO);
    }
    if s.is_empty() || s.starts_with('-') {
        return None;
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let mut total: u128 = 0;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return None;
        }
        let (int_part, frac_part) = match rest[..num_len].split_once('.') {
            Some((i, f)) => (i, f),
            None => (&rest[..num_len], ""),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return None;
        }
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit_nanos: u128 = match &rest[..unit_len] {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        rest = &rest[unit_len..];
        // Digits beyond what can matter are cut before any arithmetic, so a value with
        // hundreds of digits is an error, not an overflow.
        if int_part.len() > 20 {
            return None;
        }
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().ok()?
        };
        let mut nanos = whole.checked_mul(unit_nanos)?;
        let mut scale = unit_nanos;
        for d in frac_part.chars().take(20) {
            scale /= 10;
            if scale == 0 {
                break;
            }
            nanos = nanos.checked_add(u128::from(d.to_digit(10)?) * scale)?;
        }
        if !frac_part.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        total = total.checked_add(nanos)?;
        if total > GO_MAX_NANOS {
            return None;
        }
    }
    let secs = u64::try_from(total / 1_000_000_000).ok()?;
    Some(Duration::new(secs, (total % 1_000_000_000) as u32))
}

/// Go's `time.Duration.String()`: `0s`, `500ms`, `1m30s`, `24h0m0s`, `1.5s`.
pub fn format(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    if nanos < 1_000_000_000 {
        // Below a second Go picks the largest unit that keeps a whole number before the point.
        let (unit, div) = if nanos < 1_000 {
            ("ns", 1)
        } else if nanos < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{}{unit}", fraction(nanos, div));
    }
    let total_secs = nanos / 1_000_000_000;
    let sub = nanos % 1_000_000_000;
    let hours = total_secs / 3600;
    let minutes = (total_secs % 3600) / 60;
    let secs = total_secs % 60;
    let secs_text = fraction(u128::from(secs as u64) * 1_000_000_000 + sub, 1_000_000_000);
    if hours > 0 {
        format!("{hours}h{minutes}m{secs_text}s")
    } else if minutes > 0 {
        format!("{minutes}m{secs_text}s")
    } else {
        format!("{secs_text}s")
    }
}

/// `value / div` with the fraction's trailing zeros dropped, as Go prints it.
fn fraction(value: u128, div: u128) -> String {
    let whole = value / div;
    let rem = value % div;
    if rem == 0 {
        return whole.to_string();
    }
    let width = div.to_string().len() - 1;
    let frac = format!("{rem:0width$}");
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse("1m0s"), Some(Duration::from_secs(60)));
        assert_eq!(parse("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse(".5s"), Some(Duration::from_millis(500)));
        assert_eq!(parse("0"), Some(Duration::ZERO));
        assert_eq!(parse("30"), None);
        assert_eq!(parse("s"), None);
        assert_eq!(parse("."), None);
        assert_eq!(parse("-1s"), None);
        assert_eq!(parse("1x"), None);
    }

    #[test]
    fn huge_values_are_refused_not_panics() {
        assert_eq!(parse("99999999999999999999h"), None);
        assert_eq!(parse(&format!("{}s", "9".repeat(400))), None);
        assert_eq!(parse("2562048h"), None, "past Go's 292 years");
        assert!(parse("2562047h").is_some());
    }

    #[test]
    fn prints_as_go_does() {
        assert_eq!(format(Duration::ZERO), "0s");
        assert_eq!(format(Duration::from_secs(30)), "30s");
        assert_eq!(format(Duration::from_secs(60)), "1m0s");
        assert_eq!(format(Duration::from_secs(86400)), "24h0m0s");
        assert_eq!(format(Duration::from_secs(900)), "15m0s");
        assert_eq!(format(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format(Duration::from_millis(500)), "500ms");
        assert_eq!(format(Duration::from_micros(1500)), "1.5ms");
        for s in ["1h2m3.5s", "5s", "1m0s", "250ms"] {
            assert_eq!(format(parse(s).unwrap()), s);
        }
    }
}
