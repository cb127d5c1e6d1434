//! Reading our tables back from the kernel: `nft -j list table` JSON into [`Table`] data.
//!
//! The nftables crate (0.6.3) cannot parse a listing that holds a named verdict map, so the
//! JSON is walked here with serde_json. Only what the diff needs is read: set fingerprints
//! (from set comments) and elements in canonical text, chains' hooks, rule counts and the
//! fingerprint comments of their rules.

use super::tables::{Chain, Set, Table};
use serde_json::Value;
use std::net::IpAddr;

/// A listing that does not have the shape nft produces.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read nft listing: {0}")]
pub struct ListingError(pub String);

/// Canonical text of one element value or key part, as [`super::plan`] writes it.
fn atom(v: &Value) -> Result<String, ListingError> {
    match v {
        Value::String(s) => Ok(match s.parse::<IpAddr>() {
            Ok(ip) => ip.to_string(),
            Err(_) => s.clone(),
        }),
        Value::Number(n) => Ok(n.to_string()),
        Value::Object(o) => {
            if let Some(c) = o.get("concat").and_then(Value::as_array) {
                let parts: Result<Vec<String>, _> = c.iter().map(atom).collect();
                return Ok(parts?.join(" . "));
            }
            if let Some(p) = o.get("prefix") {
                let addr = p.get("addr").map(atom).transpose()?.unwrap_or_default();
                let len = p.get("len").and_then(Value::as_u64).unwrap_or(0);
                return Ok(format!("{addr}/{len}"));
            }
            if let Some(r) = o.get("range").and_then(Value::as_array) {
                let parts: Result<Vec<String>, _> = r.iter().map(atom).collect();
                return Ok(parts?.join("-"));
            }
            for verdict in ["goto", "jump"] {
                if let Some(t) = o.get(verdict) {
                    let target = t.get("target").and_then(Value::as_str).unwrap_or_default();
                    return Ok(format!("{verdict} {target}"));
                }
            }
            for verdict in ["drop", "accept", "continue", "return"] {
                if o.contains_key(verdict) {
                    return Ok(verdict.to_string());
                }
            }
            if let Some(e) = o.get("elem") {
                // An element with options (timeout, comment): the value is inside.
                if let Some(val) = e.get("val") {
                    return atom(val);
                }
            }
            Err(ListingError(format!("unexpected element {v}")))
        }
        other => Err(ListingError(format!("unexpected element {other}"))),
    }
}

fn hook_text(c: &serde_json::Map<String, Value>) -> Option<String> {
    let kind = c.get("type")?.as_str()?;
    let hook = c.get("hook")?.as_str()?;
    let prio = c.get("prio")?.as_i64()?;
    let policy = c.get("policy").and_then(Value::as_str).unwrap_or("accept");
    Some(format!(
        "type {kind} hook {hook} priority {prio}; policy {policy};"
    ))
}

/// Parse the JSON printed by `nft -j list table <family> switchyard`.
pub fn parse_table(json: &str) -> Result<Table, ListingError> {
    let doc: Value =
        serde_json::from_str(json).map_err(|e| ListingError(format!("invalid JSON: {e}")))?;
    let items = doc
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or_else(|| ListingError("no \"nftables\" array".into()))?;
    let mut table = Table::default();
    for item in items {
        let Some(obj) = item.as_object() else {
            continue;
        };
        for kind in ["set", "map"] {
            let Some(s) = obj.get(kind).and_then(Value::as_object) else {
                continue;
            };
            let name = s.get("name").and_then(Value::as_str).unwrap_or_default();
            let mut set = Set {
                map: kind == "map",
                fingerprint: s
                    .get("comment")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                size: s
                    .get("size")
                    .and_then(Value::as_u64)
                    .and_then(|n| u32::try_from(n).ok()),
                ..Set::default()
            };
            // What the packet path writes is not state we program: leave it out.
            let written_by_packets = name == super::skeleton::MAP_AFFINITY;
            for e in s
                .get("elem")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|_| !written_by_packets)
            {
                match e.as_array() {
                    Some(pair) if pair.len() == 2 => {
                        set.elements
                            .insert(&atom(&pair[0])?, Some(&atom(&pair[1])?));
                    }
                    _ => {
                        set.elements.insert(&atom(e)?, None);
                    }
                }
            }
            table.sets.insert(name.to_string(), set);
        }
        if let Some(c) = obj.get("chain").and_then(Value::as_object) {
            let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
            table.chains.insert(
                name.to_string(),
                Chain {
                    hook: hook_text(c),
                    ..Chain::default()
                },
            );
        }
        if let Some(r) = obj.get("rule").and_then(Value::as_object) {
            let chain = r.get("chain").and_then(Value::as_str).unwrap_or_default();
            let Some(c) = table.chains.get_mut(chain) else {
                return Err(ListingError(format!("rule of unknown chain {chain}")));
            };
            c.read_rule(r.get("comment").and_then(Value::as_str).unwrap_or_default());
        }
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured from nft 1.0.6 on this machine (trimmed).
    const LISTING: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
      {"table": {"family": "ip", "name": "switchyard", "handle": 1}},
      {"map": {"family": "ip", "name": "backends", "table": "switchyard", "type": ["ipv4_addr", "inet_proto", "inet_service", "integer"], "handle": 5, "map": "ipv4_addr . inet_service", "comment": "sy:1", "elem": [[{"concat": ["172.30.0.41", "tcp", 80, 0]}, {"concat": ["10.180.0.1", 80]}]]}},
      {"map": {"family": "ip", "name": "service-ips", "table": "switchyard", "type": ["ipv4_addr", "inet_proto", "inet_service"], "handle": 6, "map": "verdict", "elem": [[{"concat": ["172.30.0.41", "tcp", 80]}, {"goto": {"target": "cluster-2"}}]]}},
      {"set": {"family": "ip", "name": "service-cidrs", "table": "switchyard", "type": "ipv4_addr", "flags": ["interval"], "elem": [{"prefix": {"addr": "172.30.0.0", "len": 16}}, "192.168.0.2"]}},
      {"chain": {"family": "ip", "table": "switchyard", "name": "cluster-2", "handle": 1}},
      {"chain": {"family": "ip", "table": "switchyard", "name": "nat-prerouting", "handle": 2, "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}},
      {"rule": {"family": "ip", "table": "switchyard", "chain": "cluster-2", "handle": 8, "comment": "sy:abc", "expr": []}},
      {"rule": {"family": "ip", "table": "switchyard", "chain": "cluster-2", "handle": 9, "comment": "sy:abc", "expr": []}}]}"#;

    #[test]
    fn listing_becomes_canonical_state() {
        let t = parse_table(LISTING).unwrap();
        let b = &t.sets["backends"];
        assert!(b.map);
        assert_eq!(b.fingerprint, "sy:1");
        assert_eq!(
            b.elements.text_of("172.30.0.41 . tcp . 80 . 0"),
            Some(Some("10.180.0.1 . 80".into()))
        );
        assert_eq!(
            t.sets["service-ips"]
                .elements
                .text_of("172.30.0.41 . tcp . 80"),
            Some(Some("goto cluster-2".into()))
        );
        let cidrs: Vec<String> = t.sets["service-cidrs"]
            .elements
            .keys()
            .map(|k| k.text())
            .collect();
        assert_eq!(cidrs, ["172.30.0.0/16", "192.168.0.2"]);
        assert_eq!(t.chains["cluster-2"].rules.len(), 2);
        assert_eq!(t.chains["cluster-2"].fingerprint, "sy:abc");
        // A later rule without our comment (someone else's, in place of ours) leaves the
        // chain matching nothing we write.
        let mixed = parse_table(
            &LISTING.replace(r#""handle": 9, "comment": "sy:abc", "#, r#""handle": 9, "#),
        )
        .unwrap();
        assert_eq!(mixed.chains["cluster-2"].rules.len(), 2);
        let ours = Chain {
            fingerprint: "sy:abc".into(),
            rules: vec![String::new(); 2],
            hook: None,
        };
        assert!(ours.same_as(&t.chains["cluster-2"]));
        assert!(!ours.same_as(&mixed.chains["cluster-2"]));
        assert_eq!(
            t.chains["nat-prerouting"].hook.as_deref(),
            Some("type nat hook prerouting priority -100; policy accept;")
        );
    }

    #[test]
    fn garbage_is_an_error_not_an_empty_table() {
        assert!(parse_table("{}").is_err());
        assert!(parse_table("not json").is_err());
    }
}
