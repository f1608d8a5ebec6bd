//! The queue of API writes the agent owes the cluster. Writes go out in order, one at a
//! time; while the API server is unreachable they wait here, and when it returns they are
//! flushed in the order they were made. Memory is bounded: beyond the capacity the oldest
//! event or node-condition heartbeat is dropped (a later one supersedes it), but a pod
//! deletion, pod condition or taint change is never dropped. Deduplication by each
//! action's identity keeps retries and repeated decisions from doubling up.
//!
//! Pure state: the async worker in `worker.rs` executes what [`Outbox::begin`] hands out
//! and reports back through [`Outbox::finish`].

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, SystemTime};

/// A reference to the pod an action is about; the UID guards against acting on a
/// replacement pod with the same name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl PodRef {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(&self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// What an event is about: a pod (namespaced) or the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvolvedObject {
    pub kind: &'static str,
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
}

/// A core/v1 Event. Its name is derived from a stable key, so a retried create that
/// already succeeded meets `AlreadyExists` instead of making a duplicate, and a repeat
/// of the same occurrence updates `count` like the kubelet's event aggregation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    pub name: String,
    pub namespace: String,
    pub involved: InvolvedObject,
    pub event_type: EventType,
    pub reason: String,
    pub message: String,
    pub annotations: BTreeMap<String, String>,
    pub count: i32,
    pub first_seen: SystemTime,
    pub last_seen: SystemTime,
}

/// One of our conditions, on a pod or on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionRecord {
    pub condition_type: String,
    pub status: bool,
    pub reason: String,
    pub message: String,
    pub last_transition: SystemTime,
    /// Node conditions only; pod conditions have no heartbeat.
    pub last_heartbeat: Option<SystemTime>,
}

/// A taint this agent owns.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TaintRecord {
    pub key: String,
    pub effect: String,
}

/// One write to the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiAction {
    CreateEvent(EventRecord),
    /// Set a condition on the pod through pods/status, leaving the others alone.
    SetPodCondition {
        pod: PodRef,
        condition: ConditionRecord,
    },
    /// Delete with a UID precondition.
    DeletePod {
        pod: PodRef,
        grace_period_seconds: i64,
    },
    /// Our node conditions, all of them; others' conditions are left alone.
    SetNodeConditions(Vec<ConditionRecord>),
    /// The complete set of our taints on the node; others' taints are left alone.
    SetNodeTaints(Vec<TaintRecord>),
}

impl ApiAction {
    /// What makes two actions the same write.
    pub fn identity(&self) -> String {
        match self {
            ApiAction::CreateEvent(event) => format!("event/{}/{}", event.namespace, event.name),
            ApiAction::SetPodCondition { pod, condition } => {
                format!("pod-condition/{}/{}", pod.uid, condition.condition_type)
            }
            ApiAction::DeletePod { pod, .. } => format!("delete/{}", pod.uid),
            ApiAction::SetNodeConditions(_) => "node-conditions".to_string(),
            ApiAction::SetNodeTaints(_) => "node-taints".to_string(),
        }
    }

    /// Events and heartbeats may be lost under memory pressure: a later one carries the
    /// same information.
    pub fn droppable(&self) -> bool {
        matches!(
            self,
            ApiAction::CreateEvent(_) | ApiAction::SetNodeConditions(_)
        )
    }

    /// A short label for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            ApiAction::CreateEvent(_) => "event",
            ApiAction::SetPodCondition { .. } => "pod_condition",
            ApiAction::DeletePod { .. } => "pod_delete",
            ApiAction::SetNodeConditions(_) => "node_conditions",
            ApiAction::SetNodeTaints(_) => "node_taints",
        }
    }

    /// Fold a newer action with the same identity into this queued one.
    fn absorb(&mut self, newer: ApiAction) {
        match (self, newer) {
            (
                ApiAction::DeletePod {
                    grace_period_seconds,
                    ..
                },
                ApiAction::DeletePod {
                    grace_period_seconds: newer_grace,
                    ..
                },
            ) => *grace_period_seconds = (*grace_period_seconds).min(newer_grace),
            (ApiAction::SetPodCondition { .. }, ApiAction::SetPodCondition { .. }) => {}
            (queued, newer) => *queued = newer,
        }
    }

    /// Whether a newer action adds nothing to an identical one already being sent.
    fn redundant_while_in_flight(&self, newer: &ApiAction) -> bool {
        match (self, newer) {
            (
                ApiAction::DeletePod {
                    grace_period_seconds,
                    ..
                },
                ApiAction::DeletePod {
                    grace_period_seconds: newer_grace,
                    ..
                },
            ) => newer_grace >= grace_period_seconds,
            (ApiAction::SetPodCondition { .. }, ApiAction::SetPodCondition { .. }) => true,
            (sent, newer) => sent == newer,
        }
    }
}

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Applied, or already true (a delete that meets 404 or a failed UID precondition).
    Done,
    /// Transient failure (unreachable, 5xx, 429, timeout): keep it first in line.
    Retry(String),
    /// The server refused it for good (403, 422, …): drop it and report.
    Rejected(String),
}

/// What [`Outbox::push`] did with an action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pushed {
    Queued,
    /// Folded into a queued action with the same identity.
    Merged,
    /// The same write is already being sent.
    Duplicate,
    /// Queued, and the oldest droppable action was dropped to make room.
    QueuedDroppingOldest(&'static str),
    /// Not queued: the outbox is full and this action may be dropped.
    DroppedNew,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EntryId(u64);

#[derive(Debug, Clone)]
struct Entry {
    id: EntryId,
    action: ApiAction,
    attempts: u32,
}

/// Counters the shell exports as metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboxCounters {
    pub dropped: BTreeMap<&'static str, u64>,
    pub rejected: BTreeMap<&'static str, u64>,
    pub done: BTreeMap<&'static str, u64>,
}

#[derive(Debug)]
pub struct Outbox {
    entries: VecDeque<Entry>,
    capacity: usize,
    next_id: u64,
    in_flight: Option<EntryId>,
    counters: OutboxCounters,
}

impl Outbox {
    pub fn new(capacity: usize) -> Self {
        Outbox {
            entries: VecDeque::new(),
            capacity: capacity.max(1),
            next_id: 0,
            in_flight: None,
            counters: OutboxCounters::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn counters(&self) -> &OutboxCounters {
        &self.counters
    }

    /// Queued actions in delivery order.
    pub fn pending(&self) -> impl Iterator<Item = &ApiAction> {
        self.entries.iter().map(|entry| &entry.action)
    }

    pub fn push(&mut self, action: ApiAction) -> Pushed {
        let identity = action.identity();
        let mut in_flight_same = false;
        for entry in self.entries.iter_mut() {
            if entry.action.identity() != identity {
                continue;
            }
            if Some(entry.id) == self.in_flight {
                in_flight_same = entry.action.redundant_while_in_flight(&action);
                continue;
            }
            entry.action.absorb(action);
            return Pushed::Merged;
        }
        if in_flight_same {
            return Pushed::Duplicate;
        }
        let mut outcome = Pushed::Queued;
        if self.entries.len() >= self.capacity {
            let oldest_droppable = self
                .entries
                .iter()
                .position(|entry| Some(entry.id) != self.in_flight && entry.action.droppable());
            match oldest_droppable {
                Some(index) => {
                    if let Some(dropped) = self.entries.remove(index) {
                        let kind = dropped.action.kind();
                        *self.counters.dropped.entry(kind).or_default() += 1;
                        outcome = Pushed::QueuedDroppingOldest(kind);
                    }
                }
                None if action.droppable() => {
                    *self.counters.dropped.entry(action.kind()).or_default() += 1;
                    return Pushed::DroppedNew;
                }
                // Deletions and taints are never dropped; their number is bounded by
                // the pods on the node, since each pod has one identity.
                None => {}
            }
        }
        let id = EntryId(self.next_id);
        self.next_id += 1;
        self.entries.push_back(Entry {
            id,
            action,
            attempts: 0,
        });
        outcome
    }

    /// The next action to send, or `None` when empty or one is already being sent.
    pub fn begin(&mut self) -> Option<(EntryId, ApiAction)> {
        if self.in_flight.is_some() {
            return None;
        }
        let front = self.entries.front()?;
        self.in_flight = Some(front.id);
        Some((front.id, front.action.clone()))
    }

    /// Record how the attempt handed out by [`Outbox::begin`] ended. Returns the number
    /// of consecutive failed attempts of that action (0 once it is gone).
    pub fn finish(&mut self, id: EntryId, outcome: Outcome) -> u32 {
        if self.in_flight == Some(id) {
            self.in_flight = None;
        }
        let Some(index) = self.entries.iter().position(|entry| entry.id == id) else {
            return 0;
        };
        match outcome {
            Outcome::Retry(_) => {
                let entry = &mut self.entries[index];
                entry.attempts += 1;
                entry.attempts
            }
            Outcome::Done | Outcome::Rejected(_) => {
                if let Some(entry) = self.entries.remove(index) {
                    let counter = if outcome == Outcome::Done {
                        &mut self.counters.done
                    } else {
                        &mut self.counters.rejected
                    };
                    *counter.entry(entry.action.kind()).or_default() += 1;
                }
                0
            }
        }
    }
}

/// Delay before retrying after `attempts` consecutive failures: doubling from `base`,
/// capped at `max`.
pub fn retry_delay(attempts: u32, base: Duration, max: Duration) -> Duration {
    let factor = 1u32 << attempts.saturating_sub(1).min(16);
    base.saturating_mul(factor).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str) -> PodRef {
        PodRef {
            namespace: "shop".to_string(),
            name: format!("pod-{uid}"),
            uid: uid.to_string(),
        }
    }

    fn delete(uid: &str, grace: i64) -> ApiAction {
        ApiAction::DeletePod {
            pod: pod(uid),
            grace_period_seconds: grace,
        }
    }

    fn event(name: &str, count: i32) -> ApiAction {
        ApiAction::CreateEvent(EventRecord {
            name: name.to_string(),
            namespace: "shop".to_string(),
            involved: InvolvedObject {
                kind: "Pod",
                namespace: Some("shop".to_string()),
                name: "p".to_string(),
                uid: "u".to_string(),
            },
            event_type: EventType::Warning,
            reason: "Evicted".to_string(),
            message: "m".to_string(),
            annotations: BTreeMap::new(),
            count,
            first_seen: SystemTime::UNIX_EPOCH,
            last_seen: SystemTime::UNIX_EPOCH,
        })
    }

    fn heartbeat(seconds: u64) -> ApiAction {
        ApiAction::SetNodeConditions(vec![ConditionRecord {
            condition_type: "NodekeeperMemoryPressure".to_string(),
            status: false,
            reason: "r".to_string(),
            message: "m".to_string(),
            last_transition: SystemTime::UNIX_EPOCH,
            last_heartbeat: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)),
        }])
    }

    fn drain(outbox: &mut Outbox) -> Vec<ApiAction> {
        let mut sent = Vec::new();
        while let Some((id, action)) = outbox.begin() {
            sent.push(action);
            outbox.finish(id, Outcome::Done);
        }
        sent
    }

    #[test]
    fn delivers_in_order_and_retries_the_front_until_it_succeeds() {
        let mut outbox = Outbox::new(10);
        outbox.push(event("e1", 1));
        outbox.push(delete("a", 1));
        let (id, first) = outbox.begin().unwrap();
        assert_eq!(first, event("e1", 1));
        assert_eq!(outbox.begin(), None, "one write at a time");
        assert_eq!(
            outbox.finish(id, Outcome::Retry("connection refused".into())),
            1
        );
        let (id, again) = outbox.begin().unwrap();
        assert_eq!(again, event("e1", 1), "a failed write stays first");
        assert_eq!(outbox.finish(id, Outcome::Retry("503".into())), 2);
        assert_eq!(drain(&mut outbox), vec![event("e1", 1), delete("a", 1)]);
        assert!(outbox.is_empty());
        assert_eq!(outbox.counters().done.get("pod_delete"), Some(&1));
    }

    #[test]
    fn duplicates_merge_into_the_queued_action() {
        let mut outbox = Outbox::new(10);
        assert_eq!(outbox.push(delete("a", 30)), Pushed::Queued);
        assert_eq!(outbox.push(delete("a", 1)), Pushed::Merged);
        assert_eq!(outbox.push(delete("a", 30)), Pushed::Merged);
        assert_eq!(outbox.push(event("e1", 1)), Pushed::Queued);
        assert_eq!(outbox.push(event("e1", 2)), Pushed::Merged);
        assert_eq!(outbox.push(heartbeat(1)), Pushed::Queued);
        assert_eq!(outbox.push(heartbeat(2)), Pushed::Merged);
        assert_eq!(
            drain(&mut outbox),
            vec![delete("a", 1), event("e1", 2), heartbeat(2)],
            "the shortest grace period and the newest event count and heartbeat win"
        );
    }

    #[test]
    fn a_repeat_of_the_write_in_flight_is_not_sent_twice() {
        let mut outbox = Outbox::new(10);
        outbox.push(delete("a", 1));
        let (id, _) = outbox.begin().unwrap();
        assert_eq!(outbox.push(delete("a", 1)), Pushed::Duplicate);
        // A newer heartbeat behind an in-flight one must still go out.
        outbox.finish(id, Outcome::Done);
        outbox.push(heartbeat(1));
        let (id, _) = outbox.begin().unwrap();
        assert_eq!(outbox.push(heartbeat(2)), Pushed::Queued);
        outbox.finish(id, Outcome::Done);
        assert_eq!(drain(&mut outbox), vec![heartbeat(2)]);
    }

    #[test]
    fn full_outbox_drops_oldest_events_but_never_deletions() {
        let mut outbox = Outbox::new(3);
        outbox.push(event("e1", 1));
        outbox.push(delete("a", 1));
        outbox.push(event("e2", 1));
        assert_eq!(
            outbox.push(delete("b", 1)),
            Pushed::QueuedDroppingOldest("event")
        );
        assert_eq!(
            outbox.push(delete("c", 1)),
            Pushed::QueuedDroppingOldest("event")
        );
        // Only deletions left: a new deletion goes beyond capacity, a new event is dropped.
        assert_eq!(outbox.push(delete("d", 1)), Pushed::Queued);
        assert_eq!(outbox.push(event("e3", 1)), Pushed::DroppedNew);
        assert_eq!(outbox.counters().dropped.get("event"), Some(&3));
        assert_eq!(
            drain(&mut outbox),
            vec![
                delete("a", 1),
                delete("b", 1),
                delete("c", 1),
                delete("d", 1)
            ]
        );
    }

    #[test]
    fn the_action_in_flight_is_never_dropped() {
        let mut outbox = Outbox::new(1);
        outbox.push(event("e1", 1));
        let (id, _) = outbox.begin().unwrap();
        assert_eq!(outbox.push(event("e2", 1)), Pushed::DroppedNew);
        outbox.finish(id, Outcome::Done);
        assert!(outbox.is_empty());
    }

    #[test]
    fn rejected_actions_leave_the_queue_and_are_counted() {
        let mut outbox = Outbox::new(5);
        outbox.push(delete("a", 1));
        outbox.push(delete("b", 1));
        let (id, _) = outbox.begin().unwrap();
        outbox.finish(id, Outcome::Rejected("403 forbidden".into()));
        assert_eq!(outbox.counters().rejected.get("pod_delete"), Some(&1));
        assert_eq!(drain(&mut outbox), vec![delete("b", 1)]);
    }

    #[test]
    fn retry_delay_doubles_up_to_the_cap() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(1);
        let delays: Vec<_> = (1..=6)
            .map(|n| retry_delay(n, base, max).as_millis())
            .collect();
        assert_eq!(delays, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(retry_delay(u32::MAX, base, max), max);
    }
}
