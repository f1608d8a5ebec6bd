//! The controller's memory of its agents: the latest accepted report of every node, and
//! the rules a report must pass to replace it. Pure: the caller passes the credential's
//! node and its clocks. Nothing here is persisted; agents report every interval, so a
//! restarted controller knows every live agent again within one interval.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use super::protocol::{AgentReport, ApiServerState, IsolationState, RefusalReason, ShutdownPhase};

/// How a report's sender proved which node it runs on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Credential {
    /// A projected ServiceAccount token, checked with a TokenReview; its bound pod runs
    /// on the node.
    #[serde(rename_all = "camelCase")]
    ServiceAccount { username: String, pod: String },
    /// The node's own token from the node-token Secret (agents run as systemd units).
    NodeToken,
}

/// Who sent a report, once authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub node: String,
    pub credential: Credential,
}

/// The latest report of one node, and when it arrived.
#[derive(Debug, Clone)]
pub struct NodeReports {
    pub latest: AgentReport,
    /// The controller's monotonic clock at arrival: silence is measured with it.
    pub received: Instant,
    /// The controller's wall clock at arrival, for people.
    pub received_at: Timestamp,
    pub credential: Credential,
    /// Since when (the arrival of the first of them) this boot's reports have said, one
    /// after the other, that the agent reaches the API server; `None` while the latest
    /// says it does not. The controller's own clock, so the agent's cannot skew it.
    pub api_reachable_since: Option<Instant>,
}

impl NodeReports {
    /// Reports are due every interval the agent announced; three missed and it is silent.
    pub fn fresh_within(&self) -> Duration {
        Duration::from_millis(self.latest.interval_millis.saturating_mul(3))
    }

    pub fn is_fresh(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.received) <= self.fresh_within()
    }
}

/// When an agent was last heard, as silence detection needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentHeard {
    pub received: Instant,
    /// Three of the agent's report intervals.
    pub fresh_within: Duration,
    /// The latest report says the node drained cleanly and is about to power off.
    pub drained: Option<DrainedStatement>,
    /// What the latest report says about the node's isolation.
    pub isolation: IsolationHeard,
    /// See [`NodeReports::api_reachable_since`].
    pub api_reachable_since: Option<Instant>,
    /// The latest report's self-isolation promise, if it makes one.
    pub promise: Option<PromiseHeard>,
    /// The boot the latest report came from.
    pub boot_id: BootId,
}

/// A node's self-isolation promise, as its latest report makes it (see
/// [`crate::report::protocol::SelfIsolationReport`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PromiseHeard {
    /// No pod process runs later than this after the agent's last contact.
    pub within: Duration,
    /// The boot whose agent made it (`/proc/sys/kernel/random/boot_id`): a promise
    /// holds for that boot only.
    pub boot_id: BootId,
    /// The report that makes it.
    pub boot_time: Timestamp,
    pub sequence: u64,
}

/// A boot ID kept as `Copy` data (the protocol bounds it to 128 bytes; a longer one,
/// which the decoder refuses anyway, would never equal a real one: it is kept empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootId {
    bytes: [u8; BOOT_ID_BYTES],
    len: u8,
}

const BOOT_ID_BYTES: usize = 128;

impl BootId {
    pub fn new(id: &str) -> BootId {
        let mut bytes = [0u8; BOOT_ID_BYTES];
        let id = id.trim().as_bytes();
        let len = if id.len() <= BOOT_ID_BYTES {
            id.len()
        } else {
            0
        };
        bytes[..len].copy_from_slice(&id[..len]);
        BootId {
            bytes,
            len: len as u8,
        }
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }

    /// Names the same boot as `other` (never an empty or unknown one).
    pub fn is(&self, other: &str) -> bool {
        self.len > 0 && self.as_str() == other.trim()
    }
}

impl Serialize for BootId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// The node's isolation as its latest report tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IsolationHeard {
    pub state: IsolationState,
    /// The report's evidence shows the node isolated: the kubelet stopped and masked,
    /// no pod process left.
    pub confirmed: bool,
    /// The report that says so.
    pub sequence: u64,
    /// The controller's request the state answers (0: none).
    pub request: u64,
}

/// Which report said the node drained, for the NodeFence's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DrainedStatement {
    pub boot_time: Timestamp,
    pub sequence: u64,
    /// When the agent says its shutdown finished (its own clock).
    pub finished_at: Option<Timestamp>,
}

impl AgentHeard {
    fn of(entry: &NodeReports) -> AgentHeard {
        let latest = &entry.latest;
        AgentHeard {
            received: entry.received,
            fresh_within: entry.fresh_within(),
            drained: latest.says_drained().then_some(DrainedStatement {
                boot_time: latest.boot_time,
                sequence: latest.sequence,
                finished_at: latest.shutdown.finished_at,
            }),
            isolation: IsolationHeard {
                state: latest.isolation.state,
                confirmed: latest.isolation.is_confirmed(),
                sequence: latest.sequence,
                request: latest.isolation.request,
            },
            api_reachable_since: entry.api_reachable_since,
            boot_id: BootId::new(&latest.boot_id),
            // An agent in dry-run mode stops nothing, whatever it says.
            promise: latest
                .self_isolation
                .promise()
                .filter(|_| !latest.dry_run)
                .map(|within| PromiseHeard {
                    within,
                    boot_id: BootId::new(&latest.boot_id),
                    boot_time: latest.boot_time,
                    sequence: latest.sequence,
                }),
        }
    }
}

/// Whether `report` says its agent reaches the API server.
fn reaches_api(report: &AgentReport) -> bool {
    report.api_server.state == ApiServerState::Reachable
}

/// What an accepted report changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accepted {
    /// The first report of this node since the controller started.
    First,
    /// The node booted again (or the agent's boot ID changed).
    NewBoot { previous: String },
    /// The next report of the same boot.
    Next,
}

/// Why a report was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerRefusal {
    #[error("the credential belongs to node {credential:?}, the report names node {reported:?}")]
    OtherNode {
        credential: String,
        reported: String,
    },
    #[error("sequence {sequence} of boot {boot_id} was already received")]
    Replayed { boot_id: String, sequence: u64 },
    #[error(
        "sequence {sequence} of boot {boot_id} is behind the last one received ({last}); reports only move forward within a boot"
    )]
    Backward {
        boot_id: String,
        sequence: u64,
        last: u64,
    },
    #[error(
        "boot {boot_id} of node {node} began at {boot_time}, not after the current boot ({current_time}); a node only moves to later boots"
    )]
    EarlierBoot {
        node: String,
        boot_id: String,
        boot_time: Timestamp,
        current_time: Timestamp,
    },
}

impl LedgerRefusal {
    pub fn reason(&self) -> RefusalReason {
        match self {
            LedgerRefusal::OtherNode { .. } => RefusalReason::Forbidden,
            _ => RefusalReason::Stale,
        }
    }
}

#[derive(Debug, Default)]
pub struct ReportLedger {
    nodes: HashMap<String, NodeReports>,
}

impl ReportLedger {
    /// Records `report` from `identity` if it is news: the credential's node, and within
    /// one boot a sequence above the last.
    pub fn accept(
        &mut self,
        identity: &Identity,
        report: AgentReport,
        received: Instant,
        received_at: Timestamp,
    ) -> Result<Accepted, LedgerRefusal> {
        if identity.node != report.node {
            return Err(LedgerRefusal::OtherNode {
                credential: identity.node.clone(),
                reported: report.node,
            });
        }
        let Some(entry) = self.nodes.get_mut(&report.node) else {
            self.nodes.insert(
                report.node.clone(),
                NodeReports {
                    api_reachable_since: reaches_api(&report).then_some(received),
                    latest: report,
                    received,
                    received_at,
                    credential: identity.credential.clone(),
                },
            );
            return Ok(Accepted::First);
        };
        let outcome = if entry.latest.boot_id == report.boot_id {
            let last = entry.latest.sequence;
            if report.sequence == last {
                return Err(LedgerRefusal::Replayed {
                    boot_id: report.boot_id,
                    sequence: report.sequence,
                });
            }
            if report.sequence < last {
                return Err(LedgerRefusal::Backward {
                    boot_id: report.boot_id,
                    sequence: report.sequence,
                    last,
                });
            }
            Accepted::Next
        } else {
            // The live boot is always the latest one, so a report of an older boot,
            // replayed or delayed, never takes its place (also not after a controller
            // restart emptied the ledger: the live agent's next report wins).
            if report.boot_time <= entry.latest.boot_time {
                return Err(LedgerRefusal::EarlierBoot {
                    node: report.node,
                    boot_id: report.boot_id,
                    boot_time: report.boot_time,
                    current_time: entry.latest.boot_time,
                });
            }
            Accepted::NewBoot {
                previous: entry.latest.boot_id.clone(),
            }
        };
        // Within a boot the run goes on from its first report; a new boot starts its own.
        let run_began = match outcome {
            Accepted::Next => entry.api_reachable_since.unwrap_or(received),
            _ => received,
        };
        entry.api_reachable_since = reaches_api(&report).then_some(run_began);
        entry.latest = report;
        entry.received = received;
        entry.received_at = received_at;
        entry.credential = identity.credential.clone();
        Ok(outcome)
    }

    pub fn get(&self, node: &str) -> Option<&NodeReports> {
        self.nodes.get(node)
    }

    /// When node `node`'s agent was last heard, if it has reported.
    pub fn heard(&self, node: &str) -> Option<AgentHeard> {
        self.nodes.get(node).map(AgentHeard::of)
    }

    /// The agents whose next report is overdue by half an interval: the only ones that
    /// can be silent, so the controller looks at their Leases and no others.
    pub fn overdue(&self, now: Instant) -> Vec<(String, AgentHeard)> {
        self.nodes
            .iter()
            .filter(|(_, entry)| {
                now.saturating_duration_since(entry.received) >= entry.fresh_within() / 2
            })
            .map(|(node, entry)| (node.clone(), AgentHeard::of(entry)))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Forgets nodes whose agents have been silent for longer than `after` (nodes that
    /// left the cluster, agents removed), so the ledger does not grow for ever.
    pub fn forget_silent(&mut self, now: Instant, after: Duration) -> usize {
        let before = self.nodes.len();
        self.nodes
            .retain(|_, entry| now.saturating_duration_since(entry.received) <= after);
        before - self.nodes.len()
    }

    /// Every node's latest report with its age, sorted by node, as `/reports` serves it.
    pub fn views(&self, now: Instant) -> Vec<AgentView> {
        let mut views: Vec<AgentView> = self
            .nodes
            .values()
            .map(|entry| AgentView::of(entry, now))
            .collect();
        views.sort_by(|a, b| a.report.node.cmp(&b.report.node));
        views
    }

    /// How many agents are in each state, for the metrics.
    pub fn census(&self, now: Instant) -> Census {
        let mut census = Census::default();
        for entry in self.nodes.values() {
            if !entry.is_fresh(now) {
                census.silent += 1;
                continue;
            }
            census.reporting += 1;
            let report = &entry.latest;
            if !report.conditions.is_empty() {
                census.under_pressure += 1;
            }
            match report.shutdown.state {
                ShutdownPhase::InProgress => census.shutting_down += 1,
                ShutdownPhase::Finished => census.shut_down += 1,
                _ => {}
            }
            if report.api_server.state == ApiServerState::Unreachable {
                census.api_unreachable += 1;
            }
        }
        census
    }
}

/// Agents by state; a silent agent counts only as silent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Census {
    /// Reported within the freshness bound.
    pub reporting: usize,
    /// Known, but no report within the freshness bound.
    pub silent: usize,
    pub under_pressure: usize,
    pub shutting_down: usize,
    pub shut_down: usize,
    pub api_unreachable: usize,
}

/// One node's latest report as people and `controller status` see it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentView {
    pub received_at: Timestamp,
    /// Seconds since the report arrived, by the controller's monotonic clock.
    pub age_seconds: f64,
    /// Whether it arrived within three of the agent's report intervals.
    pub fresh: bool,
    /// `serviceAccount` or `nodeToken`.
    pub credential: String,
    pub report: AgentReport,
}

impl AgentView {
    fn of(entry: &NodeReports, now: Instant) -> AgentView {
        let age = now.saturating_duration_since(entry.received);
        AgentView {
            received_at: entry.received_at,
            age_seconds: (age.as_millis() as f64) / 1000.0,
            fresh: entry.is_fresh(now),
            credential: match entry.credential {
                Credential::ServiceAccount { .. } => "serviceAccount",
                Credential::NodeToken => "nodeToken",
            }
            .to_string(),
            report: entry.latest.clone(),
        }
    }

    /// A few words on the node as its agent sees it: `ok`, or what stands out.
    pub fn summary(&self) -> String {
        let report = &self.report;
        let mut parts = Vec::new();
        match report.shutdown.state {
            ShutdownPhase::InProgress => parts.push(format!(
                "shutting down ({}/{} phases)",
                report.shutdown.phases_done, report.shutdown.phases_total
            )),
            ShutdownPhase::Finished => parts.push("shut down".to_string()),
            ShutdownPhase::Cancelled => parts.push("shutdown cancelled".to_string()),
            ShutdownPhase::None | ShutdownPhase::Unknown => {}
        }
        if report.api_server.state == ApiServerState::Unreachable {
            parts.push("API server unreachable".to_string());
        }
        parts.extend(report.conditions.iter().cloned());
        if parts.is_empty() {
            "ok".to_string()
        } else {
            parts.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::protocol::sample;
    use proptest::prelude::*;

    fn identity(node: &str) -> Identity {
        Identity {
            node: node.to_string(),
            credential: Credential::NodeToken,
        }
    }

    /// A report of boot `boot`; boots named later in the alphabet began later.
    fn report(boot: &str, sequence: u64) -> AgentReport {
        let offset = i64::from(boot.bytes().next().unwrap_or(b'a') - b'a');
        AgentReport {
            boot_id: boot.to_string(),
            boot_time: sample()
                .boot_time
                .checked_add(k8s_openapi::jiff::SignedDuration::from_hours(offset))
                .expect("time"),
            sequence,
            ..sample()
        }
    }

    fn now() -> Timestamp {
        "2026-11-24T05:00:00Z".parse().expect("timestamp")
    }

    #[test]
    fn only_the_latest_report_s_drained_statement_is_heard() {
        let mut ledger = ReportLedger::default();
        let me = identity("worker-1");
        let mut drained = report("b", 10);
        drained.shutdown = crate::report::protocol::ShutdownReport {
            state: ShutdownPhase::Finished,
            about_to_power_off: true,
            all_pods_stopped: true,
            finished_at: Some(now()),
            ..Default::default()
        };
        ledger
            .accept(&me, drained.clone(), Instant::now(), now())
            .expect("accepted");
        let heard = ledger.heard("worker-1").expect("heard");
        assert_eq!(
            heard.drained,
            Some(DrainedStatement {
                boot_time: drained.boot_time,
                sequence: 10,
                finished_at: Some(now()),
            })
        );
        // A later report that says otherwise (the shutdown went on in another way, or a
        // new boot) voids it.
        ledger
            .accept(&me, report("c", 1), Instant::now(), now())
            .expect("accepted");
        assert_eq!(ledger.heard("worker-1").expect("heard").drained, None);
    }

    #[test]
    fn reaching_the_api_server_is_dated_from_the_first_of_an_unbroken_run_of_reports() {
        let mut ledger = ReportLedger::default();
        let me = identity("worker-1");
        let start = Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        let saying = |boot: &str, sequence: u64, state: ApiServerState| {
            let mut report = report(boot, sequence);
            report.api_server.state = state;
            report
        };
        let mut accept = |report: AgentReport, seconds: u64| {
            ledger
                .accept(&me, report, at(seconds), now())
                .expect("accepted");
            ledger.heard("worker-1").expect("heard").api_reachable_since
        };
        accept(saying("b", 1, ApiServerState::Reachable), 0);
        assert_eq!(
            accept(saying("b", 2, ApiServerState::Reachable), 2),
            Some(at(0))
        );
        assert_eq!(accept(saying("b", 3, ApiServerState::Unreachable), 4), None);
        accept(saying("b", 4, ApiServerState::Reachable), 6);
        assert_eq!(
            accept(saying("b", 5, ApiServerState::Reachable), 8),
            Some(at(6)),
            "the run starts over"
        );
        // A new boot starts its own run.
        assert_eq!(
            accept(saying("c", 1, ApiServerState::Reachable), 10),
            Some(at(10))
        );
    }

    #[test]
    fn a_report_for_another_node_is_forbidden() {
        let mut ledger = ReportLedger::default();
        let refusal = ledger
            .accept(&identity("worker-2"), report("b", 1), Instant::now(), now())
            .expect_err("refused");
        assert_eq!(refusal.reason(), RefusalReason::Forbidden);
        assert!(ledger.is_empty(), "nothing recorded for either node");
    }

    #[test]
    fn within_a_boot_only_a_higher_sequence_is_news() {
        let mut ledger = ReportLedger::default();
        let at = Instant::now();
        let me = identity("worker-1");
        assert_eq!(
            ledger.accept(&me, report("b", 10), at, now()),
            Ok(Accepted::First)
        );
        assert_eq!(
            ledger.accept(&me, report("b", 10), at, now()),
            Err(LedgerRefusal::Replayed {
                boot_id: "b".to_string(),
                sequence: 10
            })
        );
        assert!(matches!(
            ledger.accept(&me, report("b", 9), at, now()),
            Err(LedgerRefusal::Backward { last: 10, .. })
        ));
        assert_eq!(
            ledger.accept(&me, report("b", 11), at, now()),
            Ok(Accepted::Next)
        );
        assert_eq!(ledger.get("worker-1").map(|e| e.latest.sequence), Some(11));
    }

    #[test]
    fn a_new_boot_restarts_the_sequence_and_the_old_boot_cannot_return() {
        let mut ledger = ReportLedger::default();
        let at = Instant::now();
        let me = identity("worker-1");
        ledger
            .accept(&me, report("first", 900), at, now())
            .expect("first");
        assert_eq!(
            ledger.accept(&me, report("second", 3), at, now()),
            Ok(Accepted::NewBoot {
                previous: "first".to_string()
            })
        );
        // A report of the first boot delayed in the network arrives late.
        assert!(matches!(
            ledger.accept(&me, report("first", 901), at, now()),
            Err(LedgerRefusal::EarlierBoot { .. })
        ));
        assert_eq!(
            ledger.get("worker-1").map(|e| e.latest.boot_id.as_str()),
            Some("second")
        );
    }

    #[test]
    fn the_census_counts_fresh_agents_by_state_and_stale_ones_as_silent() {
        let mut ledger = ReportLedger::default();
        let start = Instant::now();
        let mut busy = report("b", 1);
        busy.shutdown.state = ShutdownPhase::InProgress;
        busy.api_server.state = ApiServerState::Unreachable;
        ledger
            .accept(&identity("worker-1"), busy, start, now())
            .expect("accepted");
        let mut other = report("c", 1);
        other.node = "worker-2".to_string();
        other.conditions.clear();
        ledger
            .accept(
                &identity("worker-2"),
                other,
                start + Duration::from_secs(10),
                now(),
            )
            .expect("accepted");
        // Both agents report every 2 s: silent after 6 s.
        let census = ledger.census(start + Duration::from_secs(12));
        assert_eq!(
            census,
            Census {
                reporting: 1,
                silent: 1,
                ..Census::default()
            }
        );
        let census = ledger.census(start + Duration::from_secs(1));
        assert_eq!(census.shutting_down, 1);
        assert_eq!(census.api_unreachable, 1);
        assert_eq!(census.under_pressure, 1);
        let views = ledger.views(start + Duration::from_secs(12));
        assert_eq!(views.len(), 2);
        assert_eq!(views[0].report.node, "worker-1");
        assert!(!views[0].fresh && views[1].fresh);
        assert_eq!(
            views[0].summary(),
            "shutting down (0/0 phases), API server unreachable, MemoryPressure"
        );
        assert_eq!(
            ledger.forget_silent(start + Duration::from_secs(12), Duration::from_secs(5)),
            1
        );
        assert_eq!(ledger.len(), 1, "the agent silent for 12 s is forgotten");
    }

    proptest! {
        /// Whatever order reports of a few boots arrive in, the sequence numbers the
        /// ledger accepts for a boot strictly increase, and a boot once left is never
        /// current again.
        #[test]
        fn accepted_sequences_only_grow_within_a_boot(
            arrivals in proptest::collection::vec((0usize..3, 0u64..20), 1..60)
        ) {
            // Boot times follow the names: a, then b, then c.
            let boots = ["a", "b", "c"];
            let mut ledger = ReportLedger::default();
            let me = identity("worker-1");
            let mut last: HashMap<&str, u64> = HashMap::new();
            let mut left: Vec<&str> = Vec::new();
            let mut current: Option<&str> = None;
            for (boot, sequence) in arrivals {
                let boot = boots[boot];
                let result = ledger.accept(&me, report(boot, sequence), Instant::now(), now());
                if result.is_ok() {
                    prop_assert!(!left.contains(&boot), "boot {boot} came back");
                    if let Some(previous) = current {
                        prop_assert!(boot >= previous, "went back from {previous} to {boot}");
                    }
                    if current == Some(boot) {
                        prop_assert!(sequence > last[boot]);
                    }
                    if let Some(previous) = current
                        && previous != boot
                    {
                        left.push(previous);
                    }
                    current = Some(boot);
                    last.insert(boot, sequence);
                } else {
                    let expected_refusal = current == Some(boot) && sequence <= last[boot]
                        || current.is_some_and(|current| boot < current);
                    prop_assert!(expected_refusal, "refused {boot}/{sequence}: {result:?}");
                }
            }
        }
    }
}
