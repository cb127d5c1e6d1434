//! The agent's object store: the converted form of every watched object, the live snapshot
//! kept up to date from them one object at a time, and the change tracker that records per
//! service what the last sync programmed (the state now is the snapshot's) until the next
//! sync takes the changes.

use crate::config::ProxyConfig;
use crate::convert::{self, Skip, SliceEndpoints, LABEL_SERVICE_NAME};
use crate::manifests::Object;
use crate::snapshot::{self, NodeAddressSource, Skipped};
use dataplane::frontends::Claims;
use dataplane::model::{Endpoints, IpFamily, ServicePort, ServicePortName, Snapshot};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

/// The annotation an EndpointSlice controller sets to when the change that produced it
/// happened; network programming latency is measured from it, as in kube-proxy.
pub const ANNOTATION_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// (namespace, name); cluster-scoped objects have an empty namespace.
pub type ObjectKey = (String, String);

/// The kinds of object the agent watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Service,
    EndpointSlice,
    Node,
    ServiceCidr,
}

impl Kind {
    pub const ALL: [Kind; 4] = [
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Node,
        Kind::ServiceCidr,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Node => "Node",
            Kind::ServiceCidr => "ServiceCIDR",
        }
    }
}

/// A source event and when the source received it: latency is measured from here, so time
/// spent queued behind a running sync counts.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub event: SourceEvent,
    pub at: Instant,
}

impl Arrival {
    pub fn now(event: SourceEvent) -> Arrival {
        Arrival {
            event,
            at: Instant::now(),
        }
    }
}

/// What a source reports.
#[derive(Debug, Clone)]
pub enum SourceEvent {
    /// An object was created or updated.
    Apply(Object),
    /// An object was deleted.
    Delete(Kind, ObjectKey),
    /// The complete current set of one kind (an initial list or a relist): objects of that
    /// kind not in it are gone. The first one of each kind completes its initial list.
    Replace(Kind, Vec<Object>),
    /// The same as a [`SourceEvent::Replace`], as the objects stream in: a list of one kind
    /// begins, ...
    ListBegin(Kind),
    /// ... each object in it is applied as it arrives, ...
    Listed(Object),
    /// ... and it ends: objects of that kind it did not name are gone. A list decoded whole
    /// before it is applied held every object of the kind at once: streamed, the agent's
    /// peak at 10k services from the API server fell from 174 to 136 MiB (`agent_e2e`).
    ListEnd(Kind),
}

pub fn kind_of(o: &Object) -> Kind {
    match o {
        Object::Service(_) => Kind::Service,
        Object::EndpointSlice(_) => Kind::EndpointSlice,
        Object::Node(_) => Kind::Node,
        Object::ServiceCidr(_) => Kind::ServiceCidr,
    }
}

fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectKey {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

pub fn object_key(o: &Object) -> ObjectKey {
    match o {
        Object::Service(s) => key_of(&s.metadata),
        Object::EndpointSlice(s) => key_of(&s.metadata),
        Object::Node(n) => key_of(&n.metadata),
        Object::ServiceCidr(c) => key_of(&c.metadata),
    }
}

/// One pending change: the state the last sync programmed. The state now is the
/// snapshot's; a copy of it in every change, which the first sync's changes hold for every
/// service and slice, was 7.7 MB of the 10k-service agent's heap at its first sync
/// (heaptrack), and freed right after it.
#[derive(Debug, Clone, PartialEq)]
pub struct Change<T> {
    pub previous: T,
    /// When the first event of this change arrived.
    pub first_event: Instant,
    /// The trigger-time annotations of the slice updates that made this change, one per
    /// update, each observed as network programming latency (as kube-proxy does).
    pub trigger_times: Vec<(IpFamily, SystemTime)>,
}

/// Endpoints of one service, per service port.
///
/// A vector sorted by port name: a service mostly has one port, and a `BTreeMap` of one
/// entry is a node of eleven (heaptrack: 1.2 KiB a service, in every pending change).
pub type ServiceEndpoints = Vec<(ServicePortName, Endpoints)>;

/// Everything that changed since the last sync.
#[derive(Debug, Default)]
pub struct Changes {
    pub services: Vec<(ObjectKey, Change<Vec<ServicePort>>)>,
    pub endpoints: Vec<(ObjectKey, Change<ServiceEndpoints>)>,
    /// The Node or the ServiceCIDRs changed what the node's configuration is.
    pub node: bool,
}

impl Changes {
    /// The services whose ports or endpoints changed.
    pub fn services_touched(&self) -> BTreeSet<ObjectKey> {
        self.services
            .iter()
            .map(|(k, _)| k.clone())
            .chain(self.endpoints.iter().map(|(k, _)| k.clone()))
            .collect()
    }
}

/// How many changes one event recorded, for the `_changes_total` counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recorded {
    pub service_events: usize,
    pub endpoint_events: usize,
}

#[derive(Debug, Clone)]
struct SliceEntry {
    service: ObjectKey,
    endpoints: SliceEndpoints,
    /// The trigger-time annotation, with the slice's address family (kube-proxy observes
    /// it in the proxier of that family).
    trigger_time: Option<(IpFamily, SystemTime)>,
}

/// Converted objects, the live snapshot and the pending changes.
pub struct Store {
    cfg: ProxyConfig,
    node_name: String,
    interfaces: Box<dyn NodeAddressSource + Send>,
    services: HashMap<ObjectKey, Vec<ServicePort>>,
    slices: HashMap<ObjectKey, SliceEntry>,
    /// Each service's slices, sorted. A vector: most services have one slice, and a
    /// `BTreeSet` of one is a node of eleven keys (heaptrack).
    slices_by_service: HashMap<ObjectKey, Vec<ObjectKey>>,
    node: Option<Node>,
    cidrs: BTreeMap<String, ServiceCIDR>,
    /// Objects whose last version could not be used: (kind, key) -> (reason, message).
    invalid: BTreeMap<(Kind, ObjectKey), (&'static str, String)>,
    node_warnings: Vec<String>,
    snapshot: Snapshot,
    listed: BTreeSet<Kind>,
    /// Lists streaming in: the objects each has named so far.
    listing: HashMap<Kind, HashSet<ObjectKey>>,
    service_changes: HashMap<ObjectKey, Change<Vec<ServicePort>>>,
    endpoint_changes: HashMap<ObjectKey, Change<ServiceEndpoints>>,
    node_changed: bool,
    /// When this store was made; older trigger times are not this process's latency.
    started: SystemTime,
    /// Every front end claimed by the converted (unresolved) service ports; the snapshot
    /// holds the ports as [`dataplane::frontends`] decides them.
    claims: Claims,
    /// The store key of each service's ports, by the (namespace, name) they carry.
    owners: HashMap<(Arc<str>, Arc<str>), ObjectKey>,
    /// Lost front-end claims, per service: the messages last warned.
    lost: HashMap<ObjectKey, Vec<String>>,
}

impl Store {
    pub fn new(
        cfg: ProxyConfig,
        node_name: String,
        interfaces: Box<dyn NodeAddressSource + Send>,
    ) -> Store {
        let mut store = Store {
            cfg,
            node_name,
            interfaces,
            services: HashMap::new(),
            slices: HashMap::new(),
            slices_by_service: HashMap::new(),
            node: None,
            cidrs: BTreeMap::new(),
            invalid: BTreeMap::new(),
            node_warnings: Vec::new(),
            snapshot: Snapshot::default(),
            listed: BTreeSet::new(),
            listing: HashMap::new(),
            service_changes: HashMap::new(),
            endpoint_changes: HashMap::new(),
            node_changed: true,
            started: SystemTime::now(),
            claims: Claims::default(),
            owners: HashMap::new(),
            lost: HashMap::new(),
        };
        store.refresh_node();
        store
    }

    /// True once every kind has delivered its initial list.
    pub fn initial_lists_done(&self) -> bool {
        Kind::ALL.iter().all(|k| self.listed.contains(k))
    }

    /// The snapshot of everything current, pending changes included.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    pub fn pending_services(&self) -> usize {
        self.service_changes.len()
    }

    pub fn pending_endpoints(&self) -> usize {
        self.endpoint_changes.len()
    }

    pub fn has_pending(&self) -> bool {
        self.node_changed || !self.service_changes.is_empty() || !self.endpoint_changes.is_empty()
    }

    /// When the oldest pending change's first event arrived.
    pub fn oldest_pending(&self) -> Option<Instant> {
        self.service_changes
            .values()
            .map(|c| c.first_event)
            .chain(self.endpoint_changes.values().map(|c| c.first_event))
            .min()
    }

    /// The Node object, if the source has one for this node.
    pub fn node(&self) -> Option<&Node> {
        self.node.as_ref()
    }

    /// Objects currently skipped as invalid, per metric reason.
    pub fn invalid_by_reason(&self) -> BTreeMap<&'static str, usize> {
        let mut out = BTreeMap::new();
        for (reason, _) in self.invalid.values() {
            *out.entry(*reason).or_insert(0) += 1;
        }
        out
    }

    /// Take every pending change; the caller is about to program the current snapshot.
    pub fn take_changes(&mut self) -> Changes {
        let node = std::mem::take(&mut self.node_changed);
        // Taken whole, not drained: a drained map keeps its table, which after the initial
        // lists holds a slot for every service (4.5 MB at 10k services, heaptrack).
        Changes {
            services: std::mem::take(&mut self.service_changes)
                .into_iter()
                .collect(),
            endpoints: std::mem::take(&mut self.endpoint_changes)
                .into_iter()
                .collect(),
            node,
        }
    }

    /// Record one source event at time `now`.
    pub fn apply(&mut self, event: SourceEvent, now: Instant) -> Recorded {
        let listed = self.initial_lists_done();
        let rec = self.apply_event(event, now);
        if !listed && self.initial_lists_done() {
            self.snapshot.compact();
        }
        rec
    }

    fn apply_event(&mut self, event: SourceEvent, now: Instant) -> Recorded {
        match event {
            SourceEvent::Apply(obj) => self.upsert(obj, now),
            SourceEvent::Delete(kind, key) => self.remove(kind, &key, now),
            SourceEvent::Replace(kind, objs) => {
                self.listed.insert(kind);
                let keep: HashSet<ObjectKey> = objs.iter().map(object_key).collect();
                let mut rec = self.remove_all_but(kind, &keep, now);
                for obj in objs {
                    add(&mut rec, self.upsert(obj, now));
                }
                rec
            }
            SourceEvent::ListBegin(kind) => {
                self.listing.insert(kind, HashSet::new());
                Recorded::default()
            }
            SourceEvent::Listed(obj) => {
                if let Some(seen) = self.listing.get_mut(&kind_of(&obj)) {
                    seen.insert(object_key(&obj));
                }
                self.upsert(obj, now)
            }
            SourceEvent::ListEnd(kind) => {
                self.listed.insert(kind);
                let keep = self.listing.remove(&kind).unwrap_or_default();
                self.remove_all_but(kind, &keep, now)
            }
        }
    }

    /// Remove the objects of `kind` not in `keep`.
    fn remove_all_but(&mut self, kind: Kind, keep: &HashSet<ObjectKey>, now: Instant) -> Recorded {
        let gone: Vec<ObjectKey> = self
            .keys(kind)
            .into_iter()
            .filter(|k| !keep.contains(k))
            .collect();
        let mut rec = Recorded::default();
        for key in gone {
            add(&mut rec, self.remove(kind, &key, now));
        }
        rec
    }

    fn keys(&self, kind: Kind) -> Vec<ObjectKey> {
        match kind {
            Kind::Service => self.services.keys().cloned().collect::<Vec<_>>(),
            Kind::EndpointSlice => self.slices.keys().cloned().collect(),
            Kind::Node => self.node.iter().map(|n| key_of(&n.metadata)).collect(),
            Kind::ServiceCidr => self
                .cidrs
                .keys()
                .map(|n| (String::new(), n.clone()))
                .collect(),
        }
        .into_iter()
        // An object that is only known as invalid still has to be forgotten when it goes.
        .chain(
            self.invalid
                .keys()
                .filter(|(k, _)| *k == kind)
                .map(|(_, key)| key.clone()),
        )
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
    }

    fn upsert(&mut self, obj: Object, now: Instant) -> Recorded {
        let kind = kind_of(&obj);
        let key = object_key(&obj);
        // Values corrected or dropped in conversion (the object itself is programmed).
        let mut warnings = Vec::new();
        match obj {
            Object::Service(svc) => match convert::service_gated(&svc, &self.cfg, &mut warnings) {
                Ok(ports) => {
                    warn_all(&warnings);
                    self.invalid.remove(&(kind, key.clone()));
                    self.set_service(key, ports, now)
                }
                Err(skip) => self.skip(kind, key, skip, now),
            },
            Object::EndpointSlice(slice) => {
                let trigger_time = slice
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(ANNOTATION_TRIGGER_TIME))
                    .and_then(|t| parse_rfc3339(t))
                    .and_then(|t| Some((convert::address_family(&slice.address_type)?, t)));
                let service = slice
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_SERVICE_NAME))
                    .map(|s| (key.0.clone(), s.clone()));
                match (convert::endpoint_slice(&slice, &mut warnings), service) {
                    (Ok(endpoints), Some(service)) => {
                        warn_all(&warnings);
                        self.invalid.remove(&(kind, key.clone()));
                        let entry = SliceEntry {
                            service,
                            endpoints,
                            trigger_time,
                        };
                        self.set_slice(key, Some(entry), now)
                    }
                    (Err(skip), _) => self.skip(kind, key, skip, now),
                    // Without the label the slice belongs to no service.
                    (Ok(_), None) => self.set_slice(key, None, now),
                }
            }
            Object::Node(node) => {
                if key.1 != self.node_name {
                    return Recorded::default();
                }
                if self
                    .node
                    .as_ref()
                    .is_some_and(|n| same_node_facts(n, &node))
                {
                    return Recorded::default();
                }
                self.node = Some(*node);
                self.refresh_node();
                Recorded::default()
            }
            Object::ServiceCidr(cidr) => {
                if self.cidrs.get(&key.1) == Some(&cidr) {
                    return Recorded::default();
                }
                self.cidrs.insert(key.1, *cidr);
                self.refresh_node();
                Recorded::default()
            }
        }
    }

    /// An invalid version of an object: warn, count, and keep programming the last valid
    /// version (if any), so a bad edit does not take a working service down.
    fn skip(&mut self, kind: Kind, key: ObjectKey, skip: Skip, now: Instant) -> Recorded {
        match skip {
            Skip::NotProxied { .. } => {
                tracing::debug!("{skip}");
                self.invalid.remove(&(kind, key.clone()));
                // Not proxied (any more): whatever it contributed goes.
                self.remove(kind, &key, now)
            }
            Skip::Invalid { reason, .. } => {
                let msg = skip.to_string();
                let known = self.invalid.get(&(kind, key.clone())).map(|(_, m)| m);
                if known != Some(&msg) {
                    let kept = match kind {
                        Kind::Service => self.services.contains_key(&key),
                        Kind::EndpointSlice => self.slices.contains_key(&key),
                        _ => false,
                    };
                    if kept {
                        tracing::warn!("{msg}; the previous version stays programmed");
                    } else {
                        tracing::warn!("{msg}");
                    }
                }
                self.invalid.insert((kind, key), (reason, msg));
                Recorded::default()
            }
        }
    }

    fn remove(&mut self, kind: Kind, key: &ObjectKey, now: Instant) -> Recorded {
        self.invalid.remove(&(kind, key.clone()));
        match kind {
            Kind::Service => self.set_service(key.clone(), Vec::new(), now),
            Kind::EndpointSlice => self.set_slice(key.clone(), None, now),
            Kind::Node => {
                if self.node.as_ref().map(|n| key_of(&n.metadata)).as_ref() == Some(key) {
                    self.node = None;
                    self.refresh_node();
                }
                Recorded::default()
            }
            Kind::ServiceCidr => {
                if self.cidrs.remove(&key.1).is_some() {
                    self.refresh_node();
                }
                Recorded::default()
            }
        }
    }

    fn set_service(&mut self, key: ObjectKey, ports: Vec<ServicePort>, now: Instant) -> Recorded {
        let old = if ports.is_empty() {
            self.services.remove(&key).unwrap_or_default()
        } else {
            self.services
                .insert(key.clone(), ports.clone())
                .unwrap_or_default()
        };
        if old == ports {
            return Recorded::default();
        }
        // Contested front ends: this service and every other claimant of a front end it
        // claimed or claims are decided again (dataplane::frontends), so all three modes
        // program the same winner whatever the order of events.
        let mut touched = BTreeSet::new();
        for p in &old {
            self.owners
                .remove(&(p.name.namespace.clone(), p.name.name.clone()));
            touched.extend(self.claims.remove(p));
        }
        for p in &ports {
            self.owners
                .insert((p.name.namespace.clone(), p.name.name.clone()), key.clone());
            touched.extend(self.claims.add(p));
        }
        let mut affected = BTreeSet::from([key.clone()]);
        for fe in &touched {
            for c in self.claims.claimants(fe) {
                if let Some(k) = self
                    .owners
                    .get(&(c.name.namespace.clone(), c.name.name.clone()))
                {
                    affected.insert(k.clone());
                }
            }
        }
        for k in affected {
            let previous = if k == key { &old[..] } else { &[] };
            self.decide(k, previous, now);
        }
        Recorded {
            service_events: 1,
            endpoint_events: 0,
        }
    }

    /// Put service `key`'s ports into the snapshot as the front-end claims decide them,
    /// recording a change when what is programmed changes. `old` are the ports the
    /// snapshot held for the service being set (their names may be gone from its new ports).
    fn decide(&mut self, key: ObjectKey, old: &[ServicePort], now: Instant) {
        let raw = self.services.get(&key).cloned().unwrap_or_default();
        let mut lost = Vec::new();
        let current: Vec<ServicePort> = raw
            .iter()
            .filter_map(|p| self.claims.resolve(p, &mut lost))
            .collect();
        let mut names: BTreeSet<(Arc<str>, Arc<str>)> = raw
            .iter()
            .chain(old)
            .map(|p| (p.name.namespace.clone(), p.name.name.clone()))
            .collect();
        if names.is_empty() {
            return;
        }
        let mut previous = Vec::new();
        for (ns, name) in std::mem::take(&mut names) {
            previous.extend(self.snapshot.ports_of_service(&ns, &name).cloned());
        }
        if self.lost.get(&key).map_or(&[][..], Vec::as_slice) != lost.as_slice() {
            for msg in &lost {
                tracing::warn!("{msg}");
            }
        }
        if lost.is_empty() {
            self.lost.remove(&key);
        } else {
            self.lost.insert(key.clone(), lost);
        }
        if previous == current {
            return;
        }
        for p in &previous {
            self.snapshot.services.remove(&(p.name.clone(), p.family));
        }
        for p in &current {
            self.snapshot
                .services
                .insert((p.name.clone(), p.family), p.clone());
        }
        track(
            &mut self.service_changes,
            key,
            previous,
            current,
            now,
            Trigger::None,
        );
    }

    /// Front-end claims that lose to another service's (the conflicts metric).
    pub fn frontend_conflicts(&self) -> usize {
        self.lost.values().map(Vec::len).sum()
    }

    fn set_slice(&mut self, key: ObjectKey, entry: Option<SliceEntry>, now: Instant) -> Recorded {
        let old_service = self.slices.get(&key).map(|e| e.service.clone());
        let new_service = entry.as_ref().map(|e| e.service.clone());
        // Times from before this process started would count the agent's own start-up, and a
        // deletion's annotation is the time of the last update, not of the deletion.
        let trigger = match entry.as_ref().map(|e| e.trigger_time) {
            None => Trigger::Reset,
            Some(Some((f, t))) if t > self.started => Trigger::At(f, t),
            Some(_) => Trigger::None,
        };
        let unchanged = match (self.slices.get(&key), &entry) {
            (Some(a), Some(b)) => a.service == b.service && a.endpoints == b.endpoints,
            (None, None) => true,
            _ => false,
        };
        if unchanged {
            return Recorded::default();
        }
        let affected: BTreeSet<ObjectKey> = old_service
            .iter()
            .chain(new_service.iter())
            .cloned()
            .collect();
        let before: Vec<(ObjectKey, ServiceEndpoints)> = affected
            .iter()
            .map(|s| (s.clone(), self.merged(s)))
            .collect();
        if let Some(svc) = &old_service {
            if let Some(set) = self.slices_by_service.get_mut(svc) {
                if let Ok(at) = set.binary_search(&key) {
                    set.remove(at);
                }
                if set.is_empty() {
                    self.slices_by_service.remove(svc);
                }
            }
        }
        match entry {
            Some(e) => {
                let set = self
                    .slices_by_service
                    .entry(e.service.clone())
                    .or_insert_with(|| Vec::with_capacity(1));
                if let Err(at) = set.binary_search(&key) {
                    set.insert(at, key.clone());
                }
                self.slices.insert(key, e);
            }
            None => {
                self.slices.remove(&key);
            }
        }
        let mut rec = Recorded::default();
        for (svc, old) in before {
            let new = self.merged(&svc);
            if old == new {
                continue;
            }
            // A port that stays is replaced in place: taking it out first cost another search
            // of the tree and its rebalancing (perf, `agent_e2e` at 100k).
            for (name, _) in &old {
                if !new.iter().any(|(n, _)| n == name) {
                    self.snapshot.endpoints.remove(name);
                }
            }
            for (name, eps) in &new {
                self.snapshot.endpoints.insert(name.clone(), eps.clone());
            }
            track(&mut self.endpoint_changes, svc, old, new, now, trigger);
            rec.endpoint_events += 1;
        }
        rec
    }

    /// A service's endpoints merged over all its slices.
    fn merged(&self, service: &ObjectKey) -> ServiceEndpoints {
        convert::merge(
            self.slices_by_service
                .get(service)
                .into_iter()
                .flatten()
                .filter_map(|key| self.slices.get(key))
                .map(|e| &e.endpoints),
        )
    }

    fn refresh_node(&mut self) {
        let mut skipped = Skipped::default();
        let cidrs: Vec<ServiceCIDR> = self.cidrs.values().cloned().collect();
        let node = snapshot::node_config(
            &self.cfg,
            self.node_name.clone(),
            self.node.as_ref(),
            &cidrs,
            self.interfaces.as_ref(),
            &mut skipped,
        );
        let warnings: Vec<String> = skipped
            .warnings
            .into_iter()
            .chain(skipped.invalid.into_iter().map(|(_, m)| m))
            .collect();
        if warnings != self.node_warnings {
            for w in &warnings {
                tracing::warn!("{w}");
            }
            self.node_warnings = warnings;
        }
        if node != self.snapshot.node {
            self.snapshot.node = node;
            self.node_changed = true;
        }
    }
}

fn warn_all(warnings: &[String]) {
    for w in warnings {
        tracing::warn!("{w}");
    }
}

fn add(into: &mut Recorded, r: Recorded) {
    into.service_events += r.service_events;
    into.endpoint_events += r.endpoint_events;
}

/// What a change says about network programming latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    None,
    At(IpFamily, SystemTime),
    /// Forget the times collected so far (a slice was deleted).
    Reset,
}

/// Record a change, merging it into a pending one; a change that ends where it started is
/// dropped with its trigger times, as kube-proxy's trackers do.
fn track<T: PartialEq>(
    pending: &mut HashMap<ObjectKey, Change<T>>,
    key: ObjectKey,
    previous: T,
    current: T,
    now: Instant,
    trigger: Trigger,
) {
    let mut c = match pending.remove(&key) {
        Some(c) => c,
        None => Change {
            previous,
            first_event: now,
            trigger_times: Vec::new(),
        },
    };
    match trigger {
        Trigger::None => {}
        Trigger::At(f, t) => c.trigger_times.push((f, t)),
        Trigger::Reset => c.trigger_times.clear(),
    }
    if c.previous != current {
        pending.insert(key, c);
    }
}

/// Equal in what the agent reads from a Node (snapshot and health); status heartbeats are
/// not changes.
fn same_node_facts(a: &Node, b: &Node) -> bool {
    a.metadata.labels == b.metadata.labels
        && a.metadata.deletion_timestamp == b.metadata.deletion_timestamp
        && a.spec == b.spec
        && a.status.as_ref().and_then(|s| s.addresses.as_ref())
            == b.status.as_ref().and_then(|s| s.addresses.as_ref())
}

/// Parse an RFC 3339 timestamp (`2026-12-02T19:24:18Z`, fractional seconds and offsets
/// allowed) into a SystemTime.
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let t: k8s_openapi::jiff::Timestamp = s.parse().ok()?;
    Some(SystemTime::from(t))
}

#[cfg(test)]
mod tests;
