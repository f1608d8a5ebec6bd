//! The queue of API writes the agent owes the cluster, in two lanes: pod actions
//! (`DisruptionTarget`, delete) and bookkeeping (events, node conditions, taints). Each
//! lane sends one write at a time, in the order they were made, and backs off on its own,
//! so an eviction never waits behind an event the server keeps refusing, as the kubelet's
//! event recorder never delays an eviction. Within a lane order holds: a pod's
//! `DisruptionTarget` goes before its delete, taint sets and node conditions stay in
//! order. While the API server is unreachable writes wait here and are flushed once it
//! returns. Memory is bounded: beyond the capacity (both lanes together) the oldest event
//! or node-condition heartbeat is dropped (a later one supersedes it), but a pod deletion,
//! pod condition or taint change is never dropped. Deduplication by each action's
//! identity keeps retries and repeated decisions from doubling up. In dry-run mode nothing
//! is queued: every pushed action is only counted, for the caller to log.
//!
//! Pure state: the async worker in `worker.rs` executes what [`Outbox::begin`] hands out
//! and reports back through [`Outbox::finish`].

use std::collections::{BTreeMap, VecDeque};
use std::time::SystemTime;

/// A reference to the pod an action is about; the UID guards against acting on a
/// replacement pod with the same name.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
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

/// Which queue an action waits in; each lane has its own in-flight slot and backoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Lane {
    /// Pod conditions and deletes: evictions and shutdown terminations.
    Pods,
    /// Events, node conditions and node taints.
    Bookkeeping,
}

impl Lane {
    pub const ALL: [Lane; 2] = [Lane::Pods, Lane::Bookkeeping];

    fn index(self) -> usize {
        match self {
            Lane::Pods => 0,
            Lane::Bookkeeping => 1,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Pods => "pods",
            Lane::Bookkeeping => "bookkeeping",
        }
    }
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

    /// Whether a restarted agent must still send it, so the journal keeps it: everything
    /// but node conditions and taints, which a restarted agent publishes again from what
    /// it sees.
    pub fn kept_across_restart(&self) -> bool {
        !matches!(
            self,
            ApiAction::SetNodeConditions(_) | ApiAction::SetNodeTaints(_)
        )
    }

    /// The lane it is sent in: pod actions never queue behind bookkeeping.
    pub fn lane(&self) -> Lane {
        match self {
            ApiAction::SetPodCondition { .. } | ApiAction::DeletePod { .. } => Lane::Pods,
            ApiAction::CreateEvent(_)
            | ApiAction::SetNodeConditions(_)
            | ApiAction::SetNodeTaints(_) => Lane::Bookkeeping,
        }
    }

    /// The object written to, e.g. `pod default/web` or `node`.
    pub fn target(&self) -> String {
        match self {
            ApiAction::CreateEvent(event) => format!("event {}/{}", event.namespace, event.name),
            ApiAction::SetPodCondition { pod, .. } | ApiAction::DeletePod { pod, .. } => {
                format!("pod {} (uid {})", pod.key(), pod.uid)
            }
            ApiAction::SetNodeConditions(_) | ApiAction::SetNodeTaints(_) => "node".to_string(),
        }
    }

    /// What the write would do, for the dry-run log.
    pub fn describe(&self) -> String {
        let status = |on: bool| if on { "True" } else { "False" };
        match self {
            ApiAction::CreateEvent(event) => format!(
                "create {} event {} on {} {}: {}",
                event.event_type.as_str(),
                event.reason,
                event.involved.kind,
                event.involved.name,
                event.message
            ),
            ApiAction::SetPodCondition { condition, .. } => format!(
                "set pod condition {}={} ({})",
                condition.condition_type,
                status(condition.status),
                condition.reason
            ),
            ApiAction::DeletePod {
                grace_period_seconds,
                ..
            } => format!("delete the pod with a {grace_period_seconds}s grace period"),
            ApiAction::SetNodeConditions(conditions) => format!(
                "set node conditions {}",
                conditions
                    .iter()
                    .map(|c| format!("{}={}", c.condition_type, status(c.status)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            ApiAction::SetNodeTaints(taints) => format!(
                "set our node taints to [{}]",
                taints
                    .iter()
                    .map(|t| format!("{}:{}", t.key, t.effect))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// Every [`ApiAction::kind`].
    pub const KINDS: [&'static str; 5] = [
        "event",
        "pod_condition",
        "pod_delete",
        "node_conditions",
        "node_taints",
    ];

    /// A short label for logs and metrics, one of [`ApiAction::KINDS`].
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
    /// Transient failure (5xx, 429, a conflict that kept coming back): keep it first in
    /// line.
    Retry(String),
    /// No answer from the API server (connection refused or reset, a timeout, a gateway
    /// error): retried like [`Outcome::Retry`].
    Unreachable(String),
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
    /// Not queued: the outbox is in dry-run mode and sends nothing.
    DryRun,
}

/// One attempt handed out by [`Outbox::begin`]; it names its lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EntryId {
    lane: Lane,
    serial: u64,
}

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
    pub dry_run: BTreeMap<&'static str, u64>,
}

#[derive(Debug, Default)]
struct LaneQueue {
    entries: VecDeque<Entry>,
    in_flight: Option<EntryId>,
}

impl LaneQueue {
    fn is_in_flight(&self, entry: &Entry) -> bool {
        self.in_flight == Some(entry.id)
    }
}

#[derive(Debug)]
pub struct Outbox {
    lanes: [LaneQueue; 2],
    capacity: usize,
    next_serial: u64,
    dry_run: bool,
    counters: OutboxCounters,
    /// Counts changes to the writes the journal keeps, so the shell rewrites the journal
    /// only when they changed.
    generation: u64,
}

impl Outbox {
    pub fn new(capacity: usize) -> Self {
        Outbox {
            lanes: Default::default(),
            capacity: capacity.max(1),
            next_serial: 0,
            dry_run: false,
            counters: OutboxCounters::default(),
            generation: 0,
        }
    }

    fn note_change(&mut self, kept: bool) {
        self.generation += u64::from(kept);
    }

    /// Changes so far to the writes the journal keeps
    /// ([`ApiAction::kept_across_restart`]).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The writes the journal keeps, in the order they are sent: the pod lane, then the
    /// events.
    pub fn kept(&self) -> impl Iterator<Item = &ApiAction> {
        self.pending().filter(|action| action.kept_across_restart())
    }

    /// From now on, count pushed actions instead of queuing them. Already queued actions
    /// are still sent.
    pub fn set_dry_run(&mut self, dry_run: bool) {
        self.dry_run = dry_run;
    }

    pub fn is_dry_run(&self) -> bool {
        self.dry_run
    }

    fn lane(&self, lane: Lane) -> &LaneQueue {
        &self.lanes[lane.index()]
    }

    fn lane_mut(&mut self, lane: Lane) -> &mut LaneQueue {
        &mut self.lanes[lane.index()]
    }

    /// Queued actions in both lanes.
    pub fn len(&self) -> usize {
        self.lanes.iter().map(|lane| lane.entries.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.lanes.iter().all(|lane| lane.entries.is_empty())
    }

    /// Queued actions in one lane.
    pub fn lane_len(&self, lane: Lane) -> usize {
        self.lane(lane).entries.len()
    }

    pub fn counters(&self) -> &OutboxCounters {
        &self.counters
    }

    /// Queued actions: the pod lane in delivery order, then the bookkeeping lane.
    pub fn pending(&self) -> impl Iterator<Item = &ApiAction> {
        self.lanes
            .iter()
            .flat_map(|lane| lane.entries.iter().map(|entry| &entry.action))
    }

    /// Queued actions of one lane in delivery order.
    pub fn pending_in(&self, lane: Lane) -> impl Iterator<Item = &ApiAction> {
        self.lane(lane).entries.iter().map(|entry| &entry.action)
    }

    pub fn push(&mut self, action: ApiAction) -> Pushed {
        if self.dry_run {
            *self.counters.dry_run.entry(action.kind()).or_default() += 1;
            return Pushed::DryRun;
        }
        let identity = action.identity();
        let lane = action.lane();
        let queue = self.lane_mut(lane);
        let mut in_flight_same = false;
        for index in 0..queue.entries.len() {
            if queue.entries[index].action.identity() != identity {
                continue;
            }
            if queue.is_in_flight(&queue.entries[index]) {
                in_flight_same = queue.entries[index]
                    .action
                    .redundant_while_in_flight(&action);
                continue;
            }
            let kept = action.kept_across_restart();
            queue.entries[index].action.absorb(action);
            self.note_change(kept);
            return Pushed::Merged;
        }
        if in_flight_same {
            return Pushed::Duplicate;
        }
        let mut outcome = Pushed::Queued;
        if self.len() >= self.capacity {
            match self.oldest_droppable() {
                Some((lane, index)) => {
                    if let Some(dropped) = self.lane_mut(lane).entries.remove(index) {
                        self.note_change(dropped.action.kept_across_restart());
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
        let id = EntryId {
            lane,
            serial: self.next_serial,
        };
        self.next_serial += 1;
        self.note_change(action.kept_across_restart());
        self.lane_mut(lane).entries.push_back(Entry {
            id,
            action,
            attempts: 0,
        });
        outcome
    }

    /// The lane and index of the oldest droppable action that is not being sent.
    fn oldest_droppable(&self) -> Option<(Lane, usize)> {
        Lane::ALL
            .into_iter()
            .filter_map(|lane| {
                let queue = self.lane(lane);
                queue
                    .entries
                    .iter()
                    .position(|entry| !queue.is_in_flight(entry) && entry.action.droppable())
                    .map(|index| (queue.entries[index].id.serial, lane, index))
            })
            .min()
            .map(|(_, lane, index)| (lane, index))
    }

    /// The next action to send in `lane`, or `None` when that lane is empty or already
    /// has one being sent.
    pub fn begin(&mut self, lane: Lane) -> Option<(EntryId, ApiAction)> {
        let queue = self.lane_mut(lane);
        if queue.in_flight.is_some() {
            return None;
        }
        let front = queue.entries.front()?;
        let handed_out = (front.id, front.action.clone());
        queue.in_flight = Some(front.id);
        Some(handed_out)
    }

    /// Record how the attempt handed out by [`Outbox::begin`] ended. Returns the number
    /// of consecutive failed attempts of that action (0 once it is gone).
    pub fn finish(&mut self, id: EntryId, outcome: Outcome) -> u32 {
        let queue = self.lane_mut(id.lane);
        if queue.in_flight == Some(id) {
            queue.in_flight = None;
        }
        let Some(index) = queue.entries.iter().position(|entry| entry.id == id) else {
            return 0;
        };
        match outcome {
            Outcome::Retry(_) | Outcome::Unreachable(_) => {
                let entry = &mut queue.entries[index];
                entry.attempts += 1;
                entry.attempts
            }
            Outcome::Done | Outcome::Rejected(_) => {
                if let Some(entry) = queue.entries.remove(index) {
                    self.note_change(entry.action.kept_across_restart());
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;

    pub(crate) fn pod(uid: &str) -> PodRef {
        PodRef {
            namespace: "shop".to_string(),
            name: format!("pod-{uid}"),
            uid: uid.to_string(),
        }
    }

    #[test]
    fn every_action_kind_is_listed_for_the_metric_series() {
        let one_of_each = [
            event("web.1", 1),
            condition("u1"),
            delete("u1", 30),
            ApiAction::SetNodeConditions(Vec::new()),
            ApiAction::SetNodeTaints(Vec::new()),
        ];
        let kinds: Vec<&str> = one_of_each.iter().map(ApiAction::kind).collect();
        assert_eq!(kinds, ApiAction::KINDS);
    }

    pub(crate) fn delete(uid: &str, grace: i64) -> ApiAction {
        ApiAction::DeletePod {
            pod: pod(uid),
            grace_period_seconds: grace,
        }
    }

    pub(crate) fn event(name: &str, count: i32) -> ApiAction {
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

    pub(crate) fn condition(uid: &str) -> ApiAction {
        ApiAction::SetPodCondition {
            pod: pod(uid),
            condition: ConditionRecord {
                condition_type: "DisruptionTarget".to_string(),
                status: true,
                reason: "TerminationByKubelet".to_string(),
                message: "m".to_string(),
                last_transition: SystemTime::UNIX_EPOCH,
                last_heartbeat: None,
            },
        }
    }

    fn taints(keys: &[&str]) -> ApiAction {
        ApiAction::SetNodeTaints(
            keys.iter()
                .map(|key| TaintRecord {
                    key: key.to_string(),
                    effect: "NoSchedule".to_string(),
                })
                .collect(),
        )
    }

    /// Everything queued, sent successfully: the pod lane, then the bookkeeping lane.
    fn drain(outbox: &mut Outbox) -> Vec<ApiAction> {
        let mut sent = Vec::new();
        for lane in Lane::ALL {
            while let Some((id, action)) = outbox.begin(lane) {
                sent.push(action);
                outbox.finish(id, Outcome::Done);
            }
        }
        sent
    }

    #[test]
    fn each_lane_delivers_in_order_and_retries_its_front_until_it_succeeds() {
        let mut outbox = Outbox::new(10);
        outbox.push(event("e1", 1));
        outbox.push(heartbeat(1));
        outbox.push(taints(&["nodekeeper.io/memory-pressure"]));
        let (id, first) = outbox.begin(Lane::Bookkeeping).unwrap();
        assert_eq!(first, event("e1", 1));
        assert_eq!(
            outbox.begin(Lane::Bookkeeping),
            None,
            "one write at a time per lane"
        );
        assert_eq!(
            outbox.finish(id, Outcome::Retry("connection refused".into())),
            1
        );
        let (id, again) = outbox.begin(Lane::Bookkeeping).unwrap();
        assert_eq!(again, event("e1", 1), "a failed write stays first");
        assert_eq!(outbox.finish(id, Outcome::Retry("503".into())), 2);
        assert_eq!(
            drain(&mut outbox),
            vec![
                event("e1", 1),
                heartbeat(1),
                taints(&["nodekeeper.io/memory-pressure"])
            ]
        );
        assert!(outbox.is_empty());
        assert_eq!(outbox.counters().done.get("node_taints"), Some(&1));
    }

    #[test]
    fn a_failing_event_does_not_hold_back_a_queued_delete() {
        let mut outbox = Outbox::new(10);
        outbox.push(event("evicted", 1));
        outbox.push(condition("a"));
        outbox.push(delete("a", 1));
        outbox.push(heartbeat(1));
        assert_eq!(outbox.lane_len(Lane::Pods), 2);
        assert_eq!(outbox.lane_len(Lane::Bookkeeping), 2);
        let (event_id, front) = outbox.begin(Lane::Bookkeeping).unwrap();
        assert_eq!(front, event("evicted", 1));

        // While the event is out (and then failing), the pod lane goes on, in order.
        let (id, first) = outbox.begin(Lane::Pods).unwrap();
        assert_eq!(first, condition("a"), "DisruptionTarget before the delete");
        assert_eq!(outbox.begin(Lane::Pods), None, "one pod write at a time");
        outbox.finish(id, Outcome::Done);
        assert_eq!(outbox.finish(event_id, Outcome::Retry("500".into())), 1);
        let (id, second) = outbox.begin(Lane::Pods).unwrap();
        assert_eq!(second, delete("a", 1));
        outbox.finish(id, Outcome::Done);
        assert_eq!(outbox.lane_len(Lane::Pods), 0);

        // The event is still owed, ahead of the heartbeat.
        assert_eq!(
            outbox.pending().cloned().collect::<Vec<_>>(),
            vec![event("evicted", 1), heartbeat(1)]
        );
        assert_eq!(drain(&mut outbox), vec![event("evicted", 1), heartbeat(1)]);
    }

    #[test]
    fn a_failing_pod_write_holds_back_only_its_own_lane() {
        let mut outbox = Outbox::new(10);
        outbox.push(condition("a"));
        outbox.push(delete("a", 1));
        outbox.push(heartbeat(1));
        let (id, _) = outbox.begin(Lane::Pods).unwrap();
        outbox.finish(id, Outcome::Retry("500".into()));
        let (id, front) = outbox.begin(Lane::Pods).unwrap();
        assert_eq!(
            front,
            condition("a"),
            "the delete never overtakes its condition"
        );
        let (heartbeat_id, sent) = outbox.begin(Lane::Bookkeeping).unwrap();
        assert_eq!(sent, heartbeat(1), "bookkeeping goes on meanwhile");
        outbox.finish(heartbeat_id, Outcome::Done);
        outbox.finish(id, Outcome::Retry("500".into()));
        assert_eq!(drain(&mut outbox), vec![condition("a"), delete("a", 1)]);
    }

    #[test]
    fn dry_run_counts_every_action_and_queues_none() {
        let mut outbox = Outbox::new(10);
        outbox.set_dry_run(true);
        for action in [
            event("e1", 1),
            condition("a"),
            delete("a", 1),
            heartbeat(1),
            taints(&["nodekeeper.io/memory-pressure"]),
        ] {
            assert_eq!(outbox.push(action), Pushed::DryRun);
        }
        assert!(outbox.is_empty());
        assert_eq!(outbox.begin(Lane::Pods), None);
        assert_eq!(outbox.begin(Lane::Bookkeeping), None);
        let counted: Vec<_> = outbox.counters().dry_run.keys().copied().collect();
        assert_eq!(
            counted,
            vec![
                "event",
                "node_conditions",
                "node_taints",
                "pod_condition",
                "pod_delete"
            ]
        );
    }

    #[test]
    fn actions_describe_what_they_would_write() {
        assert_eq!(delete("a", 1).target(), "pod shop/pod-a (uid a)");
        assert_eq!(
            delete("a", 1).describe(),
            "delete the pod with a 1s grace period"
        );
        assert_eq!(
            condition("a").describe(),
            "set pod condition DisruptionTarget=True (TerminationByKubelet)"
        );
        assert_eq!(
            taints(&["nodekeeper.io/memory-pressure"]).describe(),
            "set our node taints to [nodekeeper.io/memory-pressure:NoSchedule]"
        );
        assert_eq!(
            heartbeat(1).describe(),
            "set node conditions NodekeeperMemoryPressure=False"
        );
        assert_eq!(event("e1", 1).target(), "event shop/e1");
        assert_eq!(
            event("e1", 1).describe(),
            "create Warning event Evicted on Pod p: m"
        );
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
        let (id, _) = outbox.begin(Lane::Pods).unwrap();
        assert_eq!(outbox.push(delete("a", 1)), Pushed::Duplicate);
        // A newer heartbeat behind an in-flight one must still go out.
        outbox.finish(id, Outcome::Done);
        outbox.push(heartbeat(1));
        let (id, _) = outbox.begin(Lane::Bookkeeping).unwrap();
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
        let (id, _) = outbox.begin(Lane::Bookkeeping).unwrap();
        assert_eq!(outbox.push(event("e2", 1)), Pushed::DroppedNew);
        outbox.finish(id, Outcome::Done);
        assert!(outbox.is_empty());
    }

    #[test]
    fn rejected_actions_leave_the_queue_and_are_counted() {
        let mut outbox = Outbox::new(5);
        outbox.push(delete("a", 1));
        outbox.push(delete("b", 1));
        let (id, _) = outbox.begin(Lane::Pods).unwrap();
        outbox.finish(id, Outcome::Rejected("403 forbidden".into()));
        assert_eq!(outbox.counters().rejected.get("pod_delete"), Some(&1));
        assert_eq!(drain(&mut outbox), vec![delete("b", 1)]);
    }
}
