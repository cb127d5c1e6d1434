//! kube-proxy's start event: one events.k8s.io/v1 Event, Normal "Starting" with action
//! StartKubeProxy, regarding this node's Node (cmd/kube-proxy/app/server.go, after the
//! health and metrics servers start), so `kubectl get events` and `kubectl describe node`
//! show the proxy starting as they do for kube-proxy. It needs the chart's (and kubeadm's
//! system:node-proxier) `events` create grant; a refusal is logged and nothing else waits
//! for it.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};
use std::time::{SystemTime, UNIX_EPOCH};

/// The name client-go's event recorder reports as (`events.NewRecorder(.., "kube-proxy")`).
const REPORTING_CONTROLLER: &str = "kube-proxy";

/// The event kube-proxy records when it starts, at `now`, as client-go's recorder writes it:
/// in namespace `default` (a Node has none), named `<node>.<unix nanoseconds in hex>`,
/// reported by `kube-proxy` from instance `kube-proxy-<hostname>`.
pub fn starting(node: &str, hostname: &str, now: SystemTime) -> Event {
    let nanos = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{node}.{nanos:x}")),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        event_time: k8s_openapi::jiff::Timestamp::try_from(now)
            .ok()
            .map(MicroTime),
        reporting_controller: Some(REPORTING_CONTROLLER.into()),
        reporting_instance: Some(format!("{REPORTING_CONTROLLER}-{hostname}")),
        action: Some("StartKubeProxy".into()),
        reason: Some("Starting".into()),
        regarding: Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            ..ObjectReference::default()
        }),
        note: None,
        type_: Some("Normal".into()),
        ..Event::default()
    }
}

/// Records the start event in the background.
pub fn record(client: Client, node: &str) {
    // client-go takes os.Hostname(): the kernel's, which /proc holds without a syscall.
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| node.to_string());
    let event = starting(node, &hostname, SystemTime::now());
    tokio::spawn(async move {
        let events: Api<Event> = Api::namespaced(client, "default");
        match events.create(&PostParams::default(), &event).await {
            Ok(_) => tracing::debug!("recorded the Starting event"),
            Err(e) => tracing::warn!(
                "cannot record the Starting event (events.k8s.io/v1 in namespace default): {e}"
            ),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_start_event_is_kube_proxys() {
        let at = UNIX_EPOCH + Duration::from_nanos(0x187_6543_2100);
        let e = serde_json::to_value(starting("node-a", "host-1", at)).unwrap();
        assert_eq!(e["metadata"]["name"], "node-a.18765432100");
        assert_eq!(e["metadata"]["namespace"], "default");
        assert_eq!(e["reason"], "Starting");
        assert_eq!(e["action"], "StartKubeProxy");
        assert_eq!(e["type"], "Normal");
        assert_eq!(e["reportingController"], "kube-proxy");
        assert_eq!(e["reportingInstance"], "kube-proxy-host-1");
        assert_eq!(
            e["regarding"],
            serde_json::json!({"apiVersion": "v1", "kind": "Node", "name": "node-a"})
        );
        assert!(
            e["eventTime"]
                .as_str()
                .unwrap()
                .starts_with("1970-01-01T00:28:"),
            "{e}"
        );
    }
}
