//! Our node conditions, taints and node events, decided from each cycle's outcome. The
//! kubelet owns `MemoryPressure`, `DiskPressure` and `PIDPressure` and the node lifecycle
//! controller owns the matching taints, so we publish our own, node-problem-detector
//! style: `NodekeeperMemoryPressure` and friends, heartbeated every few minutes even
//! when unchanged, optional `nodekeeper.io/*-pressure:NoSchedule` taints, an
//! `EvictionThresholdMet` event while a resource is starved, and an event on every
//! condition transition. The opt-in PSI contention conditions of KEP-5394 go out beside
//! them under the KEP's own names (the kubelet writes those only with its alpha
//! `PSINodeCondition` gate, in which case the agent publishes none). Pure: the caller
//! passes the wall clock and sends the actions.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use super::api::event_name;
use super::outbox::{
    ApiAction, ConditionRecord, EventRecord, EventType, InvolvedObject, TaintRecord,
};
use crate::signals::contention::{ContentionEventKind, ContentionReport};
use crate::signals::{Contention, NodeCondition, Resource};

/// Every taint key we own starts with this; others' taints are never touched.
pub const TAINT_PREFIX: &str = "nodekeeper.io/";
/// The namespace of events about the node, as the kubelet uses.
pub const NODE_EVENT_NAMESPACE: &str = "default";

/// Our condition while a node shutdown drains pods. The kubelet reports the same state
/// through `Ready=False` ("node is shutting down"), which only it may write.
pub const SHUTDOWN_CONDITION: &str = "NodekeeperShuttingDown";
/// Keeps new pods off a node that is draining for shutdown.
pub const SHUTDOWN_TAINT: &str = "nodekeeper.io/shutting-down";
/// The kubelet's event reason for both a shutdown and its cancellation.
pub const SHUTDOWN_EVENT_REASON: &str = "Shutdown";
pub const SHUTDOWN_EVENT_MESSAGE: &str = "Shutdown manager detected shutdown event";
pub const SHUTDOWN_CANCELLED_EVENT_MESSAGE: &str =
    "Shutdown manager detected shutdown cancellation";

struct ConditionText {
    condition_type: &'static str,
    taint: &'static str,
    on_reason: &'static str,
    on_message: &'static str,
    off_reason: &'static str,
    off_message: &'static str,
}

fn text(condition: NodeCondition) -> ConditionText {
    match condition {
        NodeCondition::MemoryPressure => ConditionText {
            condition_type: "NodekeeperMemoryPressure",
            taint: "nodekeeper.io/memory-pressure",
            on_reason: "NodekeeperHasInsufficientMemory",
            on_message: "nodekeeper: memory available is below an eviction threshold",
            off_reason: "NodekeeperHasSufficientMemory",
            off_message: "nodekeeper: node has sufficient memory available",
        },
        NodeCondition::DiskPressure => ConditionText {
            condition_type: "NodekeeperDiskPressure",
            taint: "nodekeeper.io/disk-pressure",
            on_reason: "NodekeeperHasDiskPressure",
            on_message: "nodekeeper: disk space or inodes available are below an eviction threshold",
            off_reason: "NodekeeperHasNoDiskPressure",
            off_message: "nodekeeper: node has no disk pressure",
        },
        NodeCondition::PidPressure => ConditionText {
            condition_type: "NodekeeperPIDPressure",
            taint: "nodekeeper.io/pid-pressure",
            on_reason: "NodekeeperHasInsufficientPID",
            on_message: "nodekeeper: process IDs available are below an eviction threshold",
            off_reason: "NodekeeperHasSufficientPID",
            off_message: "nodekeeper: node has sufficient PID available",
        },
    }
}

const CONDITIONS: [NodeCondition; 3] = [
    NodeCondition::MemoryPressure,
    NodeCondition::DiskPressure,
    NodeCondition::PidPressure,
];

/// The condition type we publish for a node condition, e.g. `NodekeeperMemoryPressure`.
pub fn condition_type(condition: NodeCondition) -> &'static str {
    text(condition).condition_type
}

/// The taint key we publish for a node condition, e.g. `nodekeeper.io/memory-pressure`.
pub fn taint_key(condition: NodeCondition) -> &'static str {
    text(condition).taint
}

#[derive(Debug, Clone, Copy)]
struct Published {
    on: bool,
    since: SystemTime,
}

/// A moment as the tracker needs it: the wall time it stamps on what it publishes, and
/// the boot clock, on which it counts its intervals (the conditions' heartbeat, an event
/// series' pace), so that a wall-clock jump neither silences nor hurries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moment {
    pub wall: SystemTime,
    pub since_boot: Duration,
}

impl Moment {
    pub fn now() -> Moment {
        Moment {
            wall: SystemTime::now(),
            since_boot: crate::boot_clock::since_boot(),
        }
    }

    /// The time passed since `earlier`, on the boot clock.
    fn since(&self, earlier: Moment) -> Duration {
        self.since_boot.saturating_sub(earlier.since_boot)
    }
}

#[derive(Debug, Clone, Copy)]
struct ThresholdSeries {
    started: SystemTime,
    last_emitted: Moment,
    count: i32,
}

/// The series under `key` once more at `now`, if its event is due: at once for a new
/// series, then with the count raised at most once per `heartbeat`. `None` while it
/// is not due.
fn next_in_series(
    series: &mut BTreeMap<String, ThresholdSeries>,
    key: &str,
    now: Moment,
    heartbeat: Duration,
) -> Option<ThresholdSeries> {
    match series.get_mut(key) {
        Some(known) if now.since(known.last_emitted) < heartbeat => None,
        Some(known) => {
            known.count += 1;
            known.last_emitted = now;
            Some(*known)
        }
        None => {
            let fresh = ThresholdSeries {
                started: now.wall,
                last_emitted: now,
                count: 1,
            };
            series.insert(key.to_string(), fresh);
            Some(fresh)
        }
    }
}

/// Milliseconds since the Unix epoch, which keep event names of one moment apart.
fn unix_millis(time: SystemTime) -> u128 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// What was last published for the node.
#[derive(Debug)]
pub struct NodeStatusTracker {
    node_name: String,
    heartbeat: Duration,
    taints: bool,
    published: BTreeMap<NodeCondition, Published>,
    last_sent: Option<Moment>,
    last_taints: Option<BTreeSet<TaintRecord>>,
    series: BTreeMap<String, ThresholdSeries>,
    /// `None` until the shutdown manager reported; then taints are managed even when
    /// pressure taints are off, so a taint left by a shutdown is removed after reboot.
    shutting_down: Option<Published>,
    /// The KEP-5394 contention conditions that are on in the configuration and have
    /// been read at least once.
    contention: BTreeMap<Contention, Published>,
    /// A contention condition changed since the conditions were last written.
    contention_changed: bool,
    /// The KEP's contention events by reason: one event object per reason, its count
    /// raised at most once per heartbeat, so pressure hovering at a threshold cannot
    /// flood the API server with events.
    contention_series: BTreeMap<String, ThresholdSeries>,
}

/// The reason of a contention condition, on or off: `NodekeeperHasSystemMemoryContentionPressure`.
fn contention_reason(contention: Contention, on: bool) -> String {
    let has = if on { "Has" } else { "HasNo" };
    format!("Nodekeeper{has}{}", contention.condition_type())
}

fn contention_message(contention: Contention, on: bool) -> String {
    let scope = if contention.is_kubepods() {
        "the pods cgroup"
    } else {
        "the node"
    };
    let resource = if contention.is_disk() { "IO" } else { "memory" };
    if on {
        format!(
            "nodekeeper: every task of {scope} is stalled on {resource} for more of the time than the threshold (PSI full, 10 s and 60 s averages)"
        )
    } else {
        format!("nodekeeper: {resource} stalls of {scope} are below the threshold")
    }
}

/// The taint a contention condition of this kind adds, e.g.
/// `nodekeeper.io/memory-contention-pressure`.
pub fn contention_taint_key(contention: Contention) -> String {
    format!("{TAINT_PREFIX}{}-contention-pressure", contention.kind())
}

impl NodeStatusTracker {
    pub fn new(node_name: String, heartbeat: Duration, taints: bool) -> Self {
        NodeStatusTracker {
            node_name,
            heartbeat,
            taints,
            published: BTreeMap::new(),
            last_sent: None,
            last_taints: None,
            series: BTreeMap::new(),
            shutting_down: None,
            contention: BTreeMap::new(),
            contention_changed: false,
            contention_series: BTreeMap::new(),
        }
    }

    /// Take a cycle's contention conditions: the KEP's events and an event for each
    /// transition now; the conditions themselves go out with the next
    /// [`update`](Self::update), which must follow.
    pub fn note_contention(&mut self, report: &ContentionReport, now: Moment) -> Vec<ApiAction> {
        let mut actions = Vec::new();
        for event in &report.events {
            let reason = event.reason();
            let Some(series) =
                next_in_series(&mut self.contention_series, &reason, now, self.heartbeat)
            else {
                continue;
            };
            let started = unix_millis(series.started);
            let event_type = match event.kind {
                ContentionEventKind::High => EventType::Warning,
                ContentionEventKind::TrendingLower => EventType::Normal,
            };
            actions.push(self.node_event(
                &format!("{reason}/{started}"),
                event_type,
                &reason,
                &event.message(),
                (series.count, series.started),
                now,
            ));
        }
        // A condition the report no longer has was withdrawn (its PSI file went
        // unreadable): the next write leaves it out, which removes it from the node.
        let before = self.contention.len();
        self.contention
            .retain(|contention, _| report.conditions.contains_key(contention));
        if self.contention.len() != before {
            self.contention_changed = true;
        }
        for (&contention, &on) in &report.conditions {
            let previous = self.contention.get(&contention).copied();
            if previous.is_some_and(|p| p.on == on) {
                continue;
            }
            self.contention.insert(
                contention,
                Published {
                    on,
                    since: now.wall,
                },
            );
            self.contention_changed = true;
            if previous.is_none() && !on {
                continue;
            }
            actions.push(self.transition_event(&contention_reason(contention, on), on, now));
        }
        actions
    }

    /// The event of a condition turning on (Warning) or off (Normal), named for its
    /// reason and moment, as the kubelet's "status is now" events read.
    fn transition_event(&self, reason: &str, on: bool, now: Moment) -> ApiAction {
        let event_type = if on {
            EventType::Warning
        } else {
            EventType::Normal
        };
        self.node_event(
            &format!("{reason}/{}", unix_millis(now.wall)),
            event_type,
            reason,
            &format!("Node {} status is now: {reason}", self.node_name),
            (1, now.wall),
            now,
        )
    }

    /// The writes owed when the shutdown manager's `shutting_down` is `on` at `now`:
    /// nothing when unchanged; else the Shutdown event (not for the first report of "not
    /// shutting down"), our conditions, and our taints.
    pub fn set_shutting_down(&mut self, on: bool, now: Moment) -> Vec<ApiAction> {
        let previous = self.shutting_down;
        if previous.is_some_and(|p| p.on == on) {
            return Vec::new();
        }
        self.shutting_down = Some(Published {
            on,
            since: now.wall,
        });
        let mut actions = Vec::new();
        if on || previous.is_some() {
            let message = if on {
                SHUTDOWN_EVENT_MESSAGE
            } else {
                SHUTDOWN_CANCELLED_EVENT_MESSAGE
            };
            let since = unix_millis(now.wall);
            actions.push(self.node_event(
                &format!("{SHUTDOWN_EVENT_REASON}/{on}/{since}"),
                EventType::Normal,
                SHUTDOWN_EVENT_REASON,
                message,
                (1, now.wall),
                now,
            ));
        }
        self.last_sent = Some(now);
        actions.push(ApiAction::SetNodeConditions(self.condition_records(now)));
        actions.extend(self.taint_update());
        actions
    }

    fn condition_records(&self, now: Moment) -> Vec<ConditionRecord> {
        let mut records: Vec<ConditionRecord> = CONDITIONS
            .iter()
            .filter_map(|condition| {
                let published = self.published.get(condition)?;
                let words = text(*condition);
                let (reason, message) = if published.on {
                    (words.on_reason, words.on_message)
                } else {
                    (words.off_reason, words.off_message)
                };
                Some(ConditionRecord {
                    condition_type: words.condition_type.to_string(),
                    status: published.on,
                    reason: reason.to_string(),
                    message: message.to_string(),
                    last_transition: published.since,
                    last_heartbeat: Some(now.wall),
                })
            })
            .collect();
        for (&contention, published) in &self.contention {
            records.push(ConditionRecord {
                condition_type: contention.condition_type().to_string(),
                status: published.on,
                reason: contention_reason(contention, published.on),
                message: contention_message(contention, published.on),
                last_transition: published.since,
                last_heartbeat: Some(now.wall),
            });
        }
        if let Some(shutdown) = self.shutting_down {
            let (reason, message) = if shutdown.on {
                (
                    "NodeShutdown",
                    "nodekeeper: the node is shutting down; pods are terminated by priority",
                )
            } else {
                (
                    "NodeNotShuttingDown",
                    "nodekeeper: the node is not shutting down",
                )
            };
            records.push(ConditionRecord {
                condition_type: SHUTDOWN_CONDITION.to_string(),
                status: shutdown.on,
                reason: reason.to_string(),
                message: message.to_string(),
                last_transition: shutdown.since,
                last_heartbeat: Some(now.wall),
            });
        }
        records
    }

    /// Our complete taint set when it changed: pressure taints (when enabled) and the
    /// shutdown taint. `None` while we manage no taints at all.
    fn taint_update(&mut self) -> Option<ApiAction> {
        if !self.taints && self.shutting_down.is_none() {
            return None;
        }
        let pressure = self
            .published
            .iter()
            .filter(|(_, published)| self.taints && published.on)
            .map(|(condition, _)| taint_key(*condition).to_string());
        let contention = self
            .contention
            .iter()
            .filter(|(_, published)| self.taints && published.on)
            .map(|(contention, _)| contention_taint_key(*contention));
        let shutdown = self
            .shutting_down
            .filter(|published| published.on)
            .map(|_| SHUTDOWN_TAINT.to_string());
        let desired: BTreeSet<TaintRecord> = pressure
            .chain(contention)
            .chain(shutdown)
            .map(|key| TaintRecord {
                key,
                effect: "NoSchedule".to_string(),
            })
            .collect();
        if self.last_taints.as_ref() == Some(&desired) {
            return None;
        }
        let action = ApiAction::SetNodeTaints(desired.iter().cloned().collect());
        self.last_taints = Some(desired);
        Some(action)
    }

    fn node(&self) -> InvolvedObject {
        InvolvedObject {
            kind: "Node",
            namespace: None,
            name: self.node_name.clone(),
            // The kubelet's node reference uses the node name as UID as well.
            uid: self.node_name.clone(),
        }
    }

    fn node_event(
        &self,
        key: &str,
        event_type: EventType,
        reason: &str,
        message: &str,
        (count, first_seen): (i32, SystemTime),
        now: Moment,
    ) -> ApiAction {
        ApiAction::CreateEvent(EventRecord {
            name: event_name(&self.node_name, key),
            namespace: NODE_EVENT_NAMESPACE.to_string(),
            involved: self.node(),
            event_type,
            reason: reason.to_string(),
            message: message.to_string(),
            annotations: BTreeMap::new(),
            count,
            first_seen,
            last_seen: now.wall,
        })
    }

    /// The writes owed after a cycle that decided `conditions` and, when pods or node
    /// resources must be reclaimed, starved `starved`.
    pub fn update(
        &mut self,
        conditions: &BTreeSet<NodeCondition>,
        starved: Option<Resource>,
        now: Moment,
    ) -> Vec<ApiAction> {
        let mut actions = Vec::new();
        let mut changed = false;
        for condition in CONDITIONS {
            let on = conditions.contains(&condition);
            let previous = self.published.get(&condition).copied();
            if previous.is_some_and(|p| p.on == on) {
                continue;
            }
            changed = true;
            self.published.insert(
                condition,
                Published {
                    on,
                    since: now.wall,
                },
            );
            // A fresh start with no pressure is not a transition worth an event.
            if previous.is_none() && !on {
                continue;
            }
            let words = text(condition);
            let reason = if on {
                words.on_reason
            } else {
                words.off_reason
            };
            actions.push(self.transition_event(reason, on, now));
        }
        let heartbeat_due = self
            .last_sent
            .is_none_or(|sent| now.since(sent) >= self.heartbeat);
        let contention_changed = std::mem::take(&mut self.contention_changed);
        if changed || heartbeat_due || contention_changed {
            self.last_sent = Some(now);
            actions.push(ApiAction::SetNodeConditions(self.condition_records(now)));
        }
        actions.extend(self.taint_update());
        match starved {
            Some(resource) => {
                let name = resource.to_string();
                if let Some(series) = next_in_series(&mut self.series, &name, now, self.heartbeat) {
                    let started = unix_millis(series.started);
                    actions.push(self.node_event(
                        &format!("EvictionThresholdMet/{name}/{started}"),
                        EventType::Warning,
                        "EvictionThresholdMet",
                        &format!("Attempting to reclaim {name}"),
                        (series.count, series.started),
                        now,
                    ));
                }
                self.series.retain(|resource, _| *resource == name);
            }
            None => self.series.clear(),
        }
        actions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> Moment {
        Moment {
            wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + seconds),
            since_boot: Duration::from_secs(seconds),
        }
    }

    fn summary(actions: &[ApiAction]) -> Vec<String> {
        actions
            .iter()
            .map(|action| match action {
                ApiAction::CreateEvent(e) => {
                    format!("event {} {} count={}", e.reason, e.message, e.count)
                }
                ApiAction::SetNodeConditions(c) => format!(
                    "conditions {}",
                    c.iter()
                        .map(|c| format!("{}={}", c.condition_type, c.status))
                        .collect::<Vec<_>>()
                        .join(",")
                ),
                ApiAction::SetNodeTaints(t) => format!(
                    "taints [{}]",
                    t.iter()
                        .map(|t| format!("{}:{}", t.key, t.effect))
                        .collect::<Vec<_>>()
                        .join(",")
                ),
                other => format!("{other:?}"),
            })
            .collect()
    }

    /// The heartbeat and an event series' pace are counted on the boot clock; what is
    /// published carries the wall time as it reads then.
    #[test]
    fn a_wall_clock_jump_neither_silences_nor_hurries_the_heartbeat_or_an_event_series() {
        let mut tracker =
            NodeStatusTracker::new("node-a".to_string(), Duration::from_secs(300), true);
        let memory = BTreeSet::from([NodeCondition::MemoryPressure]);
        tracker.update(&memory, Some(Resource::Memory), at(0));
        let hour = Duration::from_secs(3600);
        // Five minutes on, with the wall clock set an hour back meanwhile: both are due.
        let back = Moment {
            wall: at(300).wall - hour,
            since_boot: at(300).since_boot,
        };
        let actions = tracker.update(&memory, Some(Resource::Memory), back);
        assert_eq!(
            summary(&actions),
            vec![
                "conditions NodekeeperMemoryPressure=true,NodekeeperDiskPressure=false,NodekeeperPIDPressure=false",
                "event EvictionThresholdMet Attempting to reclaim memory count=2",
            ]
        );
        let Some(ApiAction::SetNodeConditions(records)) = actions.first() else {
            panic!("{actions:?}")
        };
        assert_eq!(records[0].last_heartbeat, Some(back.wall));
        // A minute later, with the wall clock set an hour forward: neither is due yet.
        let forward = Moment {
            wall: at(360).wall + hour,
            since_boot: at(360).since_boot,
        };
        assert!(
            tracker
                .update(&memory, Some(Resource::Memory), forward)
                .is_empty()
        );
    }

    #[test]
    fn publishes_transitions_heartbeats_taints_and_threshold_events() {
        let mut tracker =
            NodeStatusTracker::new("node-a".to_string(), Duration::from_secs(300), true);
        let none = BTreeSet::new();
        let memory = BTreeSet::from([NodeCondition::MemoryPressure]);
        assert_eq!(
            summary(&tracker.update(&none, None, at(0))),
            vec![
                "conditions NodekeeperMemoryPressure=false,NodekeeperDiskPressure=false,NodekeeperPIDPressure=false",
                "taints []",
            ]
        );
        assert!(
            tracker.update(&none, None, at(10)).is_empty(),
            "nothing new, no heartbeat due"
        );
        assert_eq!(
            summary(&tracker.update(&memory, Some(Resource::Memory), at(20))),
            vec![
                "event NodekeeperHasInsufficientMemory Node node-a status is now: NodekeeperHasInsufficientMemory count=1",
                "conditions NodekeeperMemoryPressure=true,NodekeeperDiskPressure=false,NodekeeperPIDPressure=false",
                "taints [nodekeeper.io/memory-pressure:NoSchedule]",
                "event EvictionThresholdMet Attempting to reclaim memory count=1",
            ]
        );
        assert!(
            tracker
                .update(&memory, Some(Resource::Memory), at(30))
                .is_empty()
        );
        assert_eq!(
            summary(&tracker.update(&memory, Some(Resource::Memory), at(320))),
            vec![
                "conditions NodekeeperMemoryPressure=true,NodekeeperDiskPressure=false,NodekeeperPIDPressure=false",
                "event EvictionThresholdMet Attempting to reclaim memory count=2",
            ],
            "heartbeat and a repeat of the threshold event after five minutes"
        );
        assert_eq!(
            summary(&tracker.update(&none, None, at(330))),
            vec![
                "event NodekeeperHasSufficientMemory Node node-a status is now: NodekeeperHasSufficientMemory count=1",
                "conditions NodekeeperMemoryPressure=false,NodekeeperDiskPressure=false,NodekeeperPIDPressure=false",
                "taints []",
            ]
        );
    }

    #[test]
    fn shutdown_sets_and_clears_its_condition_taint_and_events_beside_pressure_taints() {
        let mut tracker =
            NodeStatusTracker::new("node-a".to_string(), Duration::from_secs(300), true);
        let memory = BTreeSet::from([NodeCondition::MemoryPressure]);
        tracker.update(&memory, None, at(0));
        assert_eq!(
            summary(&tracker.set_shutting_down(false, at(1))),
            vec![
                "conditions NodekeeperMemoryPressure=true,NodekeeperDiskPressure=false,NodekeeperPIDPressure=false,NodekeeperShuttingDown=false",
            ],
            "the first report clears a stale condition without an event"
        );
        assert_eq!(
            summary(&tracker.set_shutting_down(true, at(2))),
            vec![
                "event Shutdown Shutdown manager detected shutdown event count=1",
                "conditions NodekeeperMemoryPressure=true,NodekeeperDiskPressure=false,NodekeeperPIDPressure=false,NodekeeperShuttingDown=true",
                "taints [nodekeeper.io/memory-pressure:NoSchedule,nodekeeper.io/shutting-down:NoSchedule]",
            ]
        );
        assert!(tracker.set_shutting_down(true, at(3)).is_empty());
        assert_eq!(
            summary(&tracker.update(&BTreeSet::new(), None, at(4)))[2],
            "taints [nodekeeper.io/shutting-down:NoSchedule]",
            "a cycle keeps the shutdown taint"
        );
        assert_eq!(
            summary(&tracker.set_shutting_down(false, at(5))),
            vec![
                "event Shutdown Shutdown manager detected shutdown cancellation count=1",
                "conditions NodekeeperMemoryPressure=false,NodekeeperDiskPressure=false,NodekeeperPIDPressure=false,NodekeeperShuttingDown=false",
                "taints []",
            ]
        );
    }

    #[test]
    fn with_pressure_taints_off_the_first_shutdown_report_clears_a_stale_shutdown_taint() {
        let mut tracker = NodeStatusTracker::new("n".to_string(), Duration::from_secs(60), false);
        let memory = BTreeSet::from([NodeCondition::MemoryPressure]);
        assert!(
            summary(&tracker.update(&memory, None, at(0)))
                .iter()
                .all(|line| !line.starts_with("taints")),
            "no taints managed before the shutdown manager reports"
        );
        let actions = summary(&tracker.set_shutting_down(false, at(1)));
        assert_eq!(actions.last().unwrap(), "taints []");
        let actions = summary(&tracker.set_shutting_down(true, at(2)));
        assert_eq!(
            actions.last().unwrap(),
            "taints [nodekeeper.io/shutting-down:NoSchedule]",
            "no pressure taint while pressure taints are off"
        );
    }

    #[test]
    fn transition_time_is_kept_across_heartbeats() {
        let mut tracker = NodeStatusTracker::new("n".to_string(), Duration::from_secs(60), false);
        let pid = BTreeSet::from([NodeCondition::PidPressure]);
        tracker.update(&pid, None, at(0));
        let actions = tracker.update(&pid, None, at(61));
        let ApiAction::SetNodeConditions(records) = &actions[0] else {
            panic!("{actions:?}")
        };
        let pid_record = records
            .iter()
            .find(|r| r.condition_type == "NodekeeperPIDPressure")
            .unwrap();
        assert_eq!(pid_record.last_transition, at(0).wall);
        assert_eq!(pid_record.last_heartbeat, Some(at(61).wall));
        assert!(
            actions
                .iter()
                .all(|a| !matches!(a, ApiAction::SetNodeTaints(_))),
            "taints off"
        );
    }

    #[test]
    fn the_same_threshold_series_keeps_one_event_name() {
        let mut tracker = NodeStatusTracker::new("n".to_string(), Duration::from_secs(1), false);
        let memory = BTreeSet::from([NodeCondition::MemoryPressure]);
        let names: Vec<String> = [0, 2, 4]
            .into_iter()
            .flat_map(|t| tracker.update(&memory, Some(Resource::Memory), at(t)))
            .filter_map(|a| match a {
                ApiAction::CreateEvent(e) if e.reason == "EvictionThresholdMet" => Some(e.name),
                _ => None,
            })
            .collect();
        assert_eq!(names.len(), 3);
        assert!(names.iter().all(|n| *n == names[0]));
    }

    /// KEP-5394's conditions go out under the KEP's names beside ours, with an event for
    /// each transition and for each of the KEP's events, and add a
    /// `nodekeeper.io/<kind>-contention-pressure` taint while on (taints enabled).
    #[test]
    fn contention_conditions_are_published_with_their_events_and_taints() {
        use crate::signals::contention::{ContentionEvent, StallAverages};
        let mut tracker =
            NodeStatusTracker::new("node-a".to_string(), Duration::from_secs(300), true);
        let none = BTreeSet::new();
        let observe = |tracker: &mut NodeStatusTracker, report: ContentionReport, t| {
            let mut actions = tracker.note_contention(&report, at(t));
            actions.extend(tracker.update(&none, None, at(t)));
            summary(&actions)
        };
        let calm = ContentionReport {
            conditions: BTreeMap::from([(Contention::SystemDisk, false)]),
            ..Default::default()
        };
        assert_eq!(
            observe(&mut tracker, calm.clone(), 0),
            vec![
                "conditions NodekeeperMemoryPressure=false,NodekeeperDiskPressure=false,NodekeeperPIDPressure=false,SystemDiskContentionPressure=false",
                "taints []",
            ]
        );
        assert!(observe(&mut tracker, calm, 10).is_empty());
        let high = ContentionReport {
            conditions: BTreeMap::from([(Contention::SystemDisk, true)]),
            events: vec![ContentionEvent {
                contention: Contention::SystemDisk,
                kind: ContentionEventKind::High,
                averages: StallAverages {
                    avg10: 30.0,
                    avg60: 12.5,
                },
                threshold_percent: 10.0,
            }],
            transitions: vec![(Contention::SystemDisk, true)],
        };
        assert_eq!(
            observe(&mut tracker, high.clone(), 20),
            vec![
                "event SystemDiskContentionHigh every task of the node was stalled on io 12.50% of the last 60 s (threshold 10%) count=1",
                "event NodekeeperHasSystemDiskContentionPressure Node node-a status is now: NodekeeperHasSystemDiskContentionPressure count=1",
                "conditions NodekeeperMemoryPressure=false,NodekeeperDiskPressure=false,NodekeeperPIDPressure=false,SystemDiskContentionPressure=true",
                "taints [nodekeeper.io/disk-contention-pressure:NoSchedule]",
            ]
        );
        let records = tracker.condition_records(at(21));
        let record = records
            .iter()
            .find(|r| r.condition_type == "SystemDiskContentionPressure")
            .unwrap();
        assert_eq!(record.reason, "NodekeeperHasSystemDiskContentionPressure");
        assert_eq!(record.last_transition, at(20).wall);
        // The same event again within a heartbeat is not repeated; after one, the same
        // event object's count goes up.
        let again = ContentionReport {
            transitions: Vec::new(),
            ..high
        };
        assert!(observe(&mut tracker, again.clone(), 25).is_empty());
        let later = tracker.note_contention(&again, at(320));
        let [ApiAction::CreateEvent(repeated)] = later.as_slice() else {
            panic!("{later:?}")
        };
        assert_eq!(
            (repeated.reason.as_str(), repeated.count),
            ("SystemDiskContentionHigh", 2)
        );
        let first_name = event_name(
            "node-a",
            &format!("SystemDiskContentionHigh/{}", 1_700_000_020_000u64),
        );
        assert_eq!(repeated.name, first_name);
        let over = ContentionReport {
            conditions: BTreeMap::from([(Contention::SystemDisk, false)]),
            transitions: vec![(Contention::SystemDisk, false)],
            ..Default::default()
        };
        assert_eq!(
            observe(&mut tracker, over, 330),
            vec![
                "event NodekeeperHasNoSystemDiskContentionPressure Node node-a status is now: NodekeeperHasNoSystemDiskContentionPressure count=1",
                "conditions NodekeeperMemoryPressure=false,NodekeeperDiskPressure=false,NodekeeperPIDPressure=false,SystemDiskContentionPressure=false",
                "taints []",
            ]
        );
    }
}
