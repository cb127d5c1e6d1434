//! Log output: text or JSON lines on stderr, colour only when stderr is a terminal, the
//! level from `--log-level`, kube-proxy's `-v`, or RUST_LOG.

use std::io::IsTerminal;

/// klog verbosity onto levels: 0-2 are kube-proxy's steady-state messages (info), 3-4 its
/// detail (debug), 5 and up its tracing.
pub fn level_for_verbosity(v: u32) -> &'static str {
    match v {
        0..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    }
}

/// Install the subscriber once, at start. `format` is `text` or `json` (validated before).
pub fn init(level: &str, format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    if format == "json" {
        builder.json().with_current_span(false).init();
    } else {
        // A log file or a container runtime's pipe gets no escape codes.
        builder.with_ansi(std::io::stderr().is_terminal()).init();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_maps_onto_levels() {
        assert_eq!(level_for_verbosity(0), "info");
        assert_eq!(level_for_verbosity(2), "info");
        assert_eq!(level_for_verbosity(4), "debug");
        assert_eq!(level_for_verbosity(9), "trace");
    }
}
