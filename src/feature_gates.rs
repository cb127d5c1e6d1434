//! kube-proxy v1.37's feature gates as far as they change what a proxy does: their
//! defaults, which are locked, and which Switchyard honours. Other gates are accepted and
//! logged once as having no effect here.

use std::collections::BTreeMap;

/// A gate that changes proxy behaviour in kube-proxy v1.37 (pkg/features/kube_features.go,
/// read where pkg/proxy and cmd/kube-proxy call `DefaultFeatureGate.Enabled`).
struct Gate {
    name: &'static str,
    default: bool,
    /// GA gates locked to their default: setting the other value is an error, as in kube-proxy.
    locked: bool,
    /// Whether Switchyard acts on it.
    honoured: bool,
}

const GATES: &[Gate] = &[
    // Off: externalIPs are not programmed (pkg/proxy/serviceport.go ExternalIPs).
    Gate {
        name: "AllowServiceExternalIPs",
        default: true,
        locked: false,
        honoured: true,
    },
    // Off: mode ipvs is refused (pkg/proxy/apis/config/validation validateProxyModeLinux).
    Gate {
        name: "KubeProxyIPVS",
        default: true,
        locked: false,
        honoured: true,
    },
    // Alpha in 1.37: TCP node ports on loopback in nftables mode. Not implemented here.
    Gate {
        name: "KubeProxyNFTablesLocalhostNodePorts",
        default: false,
        locked: false,
        honoured: false,
    },
    Gate {
        name: "MultiCIDRServiceAllocator",
        default: true,
        locked: true,
        honoured: true,
    },
    Gate {
        name: "PreferSameTrafficDistribution",
        default: true,
        locked: true,
        honoured: true,
    },
    // client-go's gate, wired into kube-proxy's --feature-gates (pkg/features
    // kube_features.go init, AddVersionedFeaturesToExistingFeatureGates); on since 1.35
    // (client-go features/known_features.go): every initial list and relist is a streaming
    // watch (sendInitialEvents) instead of a LIST.
    Gate {
        name: "WatchListClient",
        default: true,
        locked: false,
        honoured: true,
    },
];

/// The v1.37 default of a gate this module knows.
pub fn default_of(name: &str) -> Option<bool> {
    GATES.iter().find(|g| g.name == name).map(|g| g.default)
}

/// Errors kube-proxy also gives: a locked gate set against its value.
pub fn validate(gates: &BTreeMap<String, bool>) -> Result<(), String> {
    for (name, value) in gates {
        if let Some(g) = GATES.iter().find(|g| g.name == name) {
            if g.locked && *value != g.default {
                return Err(format!(
                    "cannot set feature gate {name} to {value}, feature is locked to {}",
                    g.default
                ));
            }
        }
    }
    Ok(())
}

/// One line per configured gate that Switchyard does not act on, for a log at start.
pub fn not_honoured(gates: &BTreeMap<String, bool>) -> Vec<String> {
    gates
        .iter()
        .filter_map(|(name, value)| match GATES.iter().find(|g| g.name == name) {
            Some(g) if g.honoured => None,
            Some(g) if *value == g.default => None,
            Some(_) => Some(format!(
                "feature gate {name}={value} is not implemented by Switchyard; its default ({}) applies",
                !value
            )),
            None => Some(format!(
                "feature gate {name}={value} does not change what a proxy does in kube-proxy v1.37; ignored"
            )),
        })
        .collect()
}

/// Parse `--feature-gates` (`A=true,B=false`), as kube-proxy's flag does.
pub fn parse_flag(raw: &str) -> Result<BTreeMap<String, bool>, String> {
    let mut out = BTreeMap::new();
    for item in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("missing bool value for {item:?}"))?;
        let b = parse_go_bool(v.trim())
            .ok_or_else(|| format!("invalid value of {k}={v}, err: not a boolean"))?;
        out.insert(k.trim().to_string(), b);
    }
    Ok(out)
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_parses_and_locked_gates_are_refused() {
        let g = parse_flag("AllowServiceExternalIPs=false, KubeProxyIPVS=true").unwrap();
        assert_eq!(g.get("AllowServiceExternalIPs"), Some(&false));
        assert!(validate(&g).is_ok());
        assert!(parse_flag("Foo").is_err());
        assert!(parse_flag("Foo=maybe").is_err());
        let locked = parse_flag("MultiCIDRServiceAllocator=false").unwrap();
        assert!(validate(&locked).unwrap_err().contains("locked"));
    }

    #[test]
    fn unhonoured_gates_are_reported_once_each() {
        let g = parse_flag("KubeProxyNFTablesLocalhostNodePorts=true,SomethingElse=true,AllowServiceExternalIPs=false").unwrap();
        let lines = not_honoured(&g);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines
            .iter()
            .any(|l| l.contains("KubeProxyNFTablesLocalhostNodePorts")));
        assert!(lines.iter().any(|l| l.contains("SomethingElse")));
    }
}
