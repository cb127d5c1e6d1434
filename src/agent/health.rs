//! Proxier health with kube-proxy's semantics: unhealthy when a queued update has waited
//! longer than the health timeout; `/healthz` also fails while the node is going away,
//! `/livez` ignores the node. Pure: the caller passes the clock.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use std::time::{Duration, SystemTime};

/// The taint the cluster autoscaler puts on a node it is about to delete.
pub const TAINT_TO_BE_DELETED: &str = "ToBeDeletedByClusterAutoscaler";

/// What the health endpoints answer from.
#[derive(Debug, Clone)]
pub struct Health {
    timeout: Duration,
    last_updated: Option<SystemTime>,
    oldest_queued: Option<SystemTime>,
    node_eligible: bool,
}

/// A health answer: HTTP status and JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthReply {
    pub status: u16,
    pub body: String,
}

impl Health {
    /// `timeout` is kube-proxy's healthTimeout: twice the sync period.
    pub fn new(timeout: Duration) -> Health {
        Health {
            timeout,
            last_updated: None,
            oldest_queued: None,
            node_eligible: true,
        }
    }

    /// An update was queued at `now`; the oldest one not yet programmed counts.
    pub fn queued(&mut self, now: SystemTime) {
        self.oldest_queued.get_or_insert(now);
    }

    /// A sync committed at `now`. `still_queued` is the arrival of the oldest change that
    /// came in while it ran and is not in it.
    pub fn updated(&mut self, now: SystemTime, still_queued: Option<SystemTime>) {
        self.last_updated = Some(now);
        self.oldest_queued = still_queued;
    }

    pub fn set_node(&mut self, node: Option<&Node>) {
        self.node_eligible = node.is_none_or(node_eligible);
    }

    /// kube-proxy reports the current time as lastUpdated while healthy, the real last
    /// update only when unhealthy.
    fn shown_last_updated(&self, healthy: bool, now: SystemTime) -> Option<SystemTime> {
        if healthy {
            Some(now)
        } else {
            self.last_updated
        }
    }

    pub fn proxier_healthy(&self, now: SystemTime) -> bool {
        match self.oldest_queued {
            None => true,
            Some(q) => now.duration_since(q).unwrap_or_default() < self.timeout,
        }
    }

    /// `/healthz`: the proxier is healthy and the node is not being deleted.
    pub fn healthz(&self, now: SystemTime) -> HealthReply {
        let healthy = self.proxier_healthy(now);
        let ok = healthy && self.node_eligible;
        let body = format!(
            r#"{{"lastUpdated": "{}","currentTime": "{}", "nodeEligible": {}}}"#,
            fmt_time(self.shown_last_updated(healthy, now)),
            fmt_time(Some(now)),
            self.node_eligible
        );
        HealthReply {
            status: if ok { 200 } else { 503 },
            body,
        }
    }

    /// `/livez`: the proxier alone.
    pub fn livez(&self, now: SystemTime) -> HealthReply {
        let ok = self.proxier_healthy(now);
        let body = format!(
            r#"{{"lastUpdated": "{}","currentTime": "{}"}}"#,
            fmt_time(self.shown_last_updated(ok, now)),
            fmt_time(Some(now))
        );
        HealthReply {
            status: if ok { 200 } else { 503 },
            body,
        }
    }
}

/// kube-proxy treats a node as ineligible while it is being deleted or carries the
/// autoscaler's to-be-deleted taint.
pub fn node_eligible(node: &Node) -> bool {
    if node.metadata.deletion_timestamp.is_some() {
        return false;
    }
    !node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_TO_BE_DELETED))
}

/// Times as kube-proxy prints them (Go's `time.Time.String()` in UTC, without the
/// process-local monotonic suffix); Go's zero time for "never".
fn fmt_time(t: Option<SystemTime>) -> String {
    match t.and_then(|t| Timestamp::try_from(t).ok()) {
        Some(ts) => ts.strftime("%Y-%m-%d %H:%M:%S%.f +0000 UTC").to_string(),
        None => "0001-01-01 00:00:00 +0000 UTC".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(60);

    fn node(yaml: &str) -> Node {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn healthy_until_a_queued_update_waits_longer_than_the_timeout() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut h = Health::new(TIMEOUT);
        assert_eq!(h.healthz(t0).status, 200);
        h.queued(t0);
        h.queued(t0 + Duration::from_secs(30));
        assert_eq!(h.healthz(t0 + Duration::from_secs(59)).status, 200);
        let late = t0 + Duration::from_secs(61);
        assert_eq!(h.healthz(late).status, 503);
        assert_eq!(h.livez(late).status, 503);
        let body: serde_json::Value = serde_json::from_str(&h.healthz(late).body).unwrap();
        assert_eq!(body["lastUpdated"], "0001-01-01 00:00:00 +0000 UTC");
        assert_eq!(body["currentTime"], "2027-01-15 08:01:01 +0000 UTC");
        h.updated(t0 + Duration::from_millis(60_500), None);
        let body: serde_json::Value = serde_json::from_str(&h.healthz(late).body).unwrap();
        assert_eq!(h.healthz(late).status, 200);
        assert_eq!(body["lastUpdated"], "2027-01-15 08:01:01 +0000 UTC");
        assert_eq!(body["nodeEligible"], true);
        h.queued(late);
        let later = late + TIMEOUT + Duration::from_millis(250);
        let body: serde_json::Value = serde_json::from_str(&h.livez(later).body).unwrap();
        assert_eq!(body["lastUpdated"], "2027-01-15 08:01:00.5 +0000 UTC");
    }

    #[test]
    fn a_node_going_away_fails_healthz_but_not_livez() {
        let now = SystemTime::now();
        let mut h = Health::new(TIMEOUT);
        h.set_node(Some(&node(
            "metadata: {name: a}\nspec: {taints: [{key: ToBeDeletedByClusterAutoscaler, effect: NoSchedule}]}",
        )));
        assert_eq!(h.healthz(now).status, 503);
        assert_eq!(h.livez(now).status, 200);
        let body: serde_json::Value = serde_json::from_str(&h.healthz(now).body).unwrap();
        assert_eq!(body["nodeEligible"], false);
        h.set_node(Some(&node(
            "metadata: {name: a, deletionTimestamp: '2026-12-02T00:00:00Z'}",
        )));
        assert_eq!(h.healthz(now).status, 503);
        h.set_node(Some(&node("metadata: {name: a}")));
        assert_eq!(h.healthz(now).status, 200);
    }
}
