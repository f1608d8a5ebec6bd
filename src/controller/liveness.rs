//! Whether a node is lost, from everything the controller hears of it: the Ready
//! condition, and for a node with an agent its Lease renewals and its agent's reports.
//!
//! The Ready condition is a late and ambiguous signal: the node lifecycle controller turns
//! it Unknown 40-50 s after the kubelet's last Lease renewal, and it reads the same for a
//! dead node and for one cut off from the API server. A node whose agent reports to the
//! controller has two independent channels instead: its kubelet's Lease (through the API
//! server) and the reports (straight to the controller). Both silent for `silenceTimeout`
//! is the evidence a node is dead, and it is taken without waiting for NotReady or for
//! `unhealthyDuration` on top. Either channel alive means the node is not dead, whatever
//! its Ready condition says: a node whose agent still reports while its Lease has stopped
//! is partitioned from the API server, and powering it off blind is never the answer.
//! Nodes without an agent keep the Ready condition rule.
//!
//! Everything here is pure: the shell (`node_leases.rs`, the report ledger) turns what it
//! heard, on the monotonic clock, into timestamps on the decision's clock.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::facts::NodeHealth;
use super::policy::FencePolicy;
use super::resource::PauseReason;
use crate::report::ledger::{BootId, DrainedStatement, IsolationHeard, PromiseHeard};

/// What the controller heard from the node itself, besides its Ready condition.
// `Heard` carries a boot ID inline so the whole stays `Copy`; one is built per decision.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Liveness {
    /// The Ready condition alone tells: silence detection is off, or no agent of this
    /// node has reported since the controller began listening.
    NoAgent,
    /// Too early to tell whether the node has an agent: the controller has listened for
    /// less time than a running agent takes to reach a new controller (its backoff).
    /// Known at `until`.
    AgentUnknown { until: Timestamp },
    /// The node has an agent; when each channel was last heard.
    Heard(Channels),
}

/// When the controller last heard each of a node's channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Channels {
    /// The last renewal of the node's Lease the controller saw change, or when it began
    /// watching the Leases if it has seen none.
    pub lease: Timestamp,
    /// Two of the kubelet's renewal intervals (half the Lease's `leaseDurationSeconds`):
    /// a kubelet that renews less often than `silenceTimeout` is not silent between two
    /// renewals.
    pub lease_fresh_within: Duration,
    /// The last accepted report.
    pub report: Timestamp,
    /// Three of the agent's own report intervals: an agent that reports less often than
    /// `silenceTimeout` is not silent between two reports.
    pub reports_fresh_within: Duration,
    /// The last report said the node drained cleanly and was about to power off (only
    /// taken from reports that arrived over TLS).
    pub drained: Option<DrainedStatement>,
    /// What the last report said about the node's isolation; `None` when reports come
    /// over plain HTTP, where their content decides nothing and no instruction is given.
    pub isolation: Option<IsolationHeard>,
    /// Since when the agent's reports have said, one after the other, that it reaches the
    /// API server (the controller's clock); `None` while it does not, and over plain HTTP.
    pub api_reachable_since: Option<Timestamp>,
    /// The last report's self-isolation promise (over TLS only).
    pub promise: Option<PromiseHeard>,
    /// The boot the last report came from (over TLS only).
    pub boot: Option<BootId>,
}

impl Channels {
    /// When the Lease counts as silent.
    pub fn lease_silent_at(&self, silence_timeout: Duration) -> Timestamp {
        self.lease + silence_timeout.max(self.lease_fresh_within)
    }

    /// When the reports count as silent.
    pub fn reports_silent_at(&self, silence_timeout: Duration) -> Timestamp {
        self.report + silence_timeout.max(self.reports_fresh_within)
    }

    /// When both count as silent.
    pub fn silent_at(&self, silence_timeout: Duration) -> Timestamp {
        self.lease_silent_at(silence_timeout)
            .max(self.reports_silent_at(silence_timeout))
    }

    /// When a node whose last report said it drained counts as gone: its agent missed
    /// three of its report intervals (it stopped, as a powering-off node's agent does) and
    /// its kubelet missed a renewal of the Lease (with [`DRAINED_LEASE_SLACK`]). Without
    /// that statement, `None`. A node that said it drained needs no `silenceTimeout`:
    /// its pods are stopped by its own account, and the Lease only confirms that its
    /// kubelet stopped too.
    ///
    /// A kubelet still renewing a renewal interval (and the slack) after that report
    /// voids it: the node did not go down (its power off failed, or it came back from a
    /// quick reboot whose agent has not reported yet).
    pub fn drained_at(&self) -> Option<Timestamp> {
        self.drained?;
        let renewal_interval = self.lease_fresh_within / 2;
        let kubelet_stopped_by = renewal_interval + DRAINED_LEASE_SLACK;
        if self.lease > self.report + kubelet_stopped_by {
            return None;
        }
        Some((self.report + self.reports_fresh_within).max(self.lease + kubelet_stopped_by))
    }

    /// How far apart in time nodes cut off at one instant fall silent: one spacing of the
    /// channel that falls silent last (the reports' interval, or the kubelet's renewal
    /// interval), the finer of the two when both fall silent together.
    pub fn spread(&self, silence_timeout: Duration) -> Duration {
        let lease_after = silence_timeout.max(self.lease_fresh_within);
        let reports_after = silence_timeout.max(self.reports_fresh_within);
        let report_interval = self.reports_fresh_within / 3;
        let renewal_interval = self.lease_fresh_within / 2;
        match reports_after.cmp(&lease_after) {
            std::cmp::Ordering::Greater => report_interval,
            std::cmp::Ordering::Less => renewal_interval,
            std::cmp::Ordering::Equal => report_interval.min(renewal_interval),
        }
    }

    /// Whether the storm guard counts the node as unhealthy at `now`: it is silent, or is
    /// falling silent along with nodes cut off at the same instant.
    ///
    /// A partition does not silence its nodes at one instant: each was last heard at its
    /// own time, up to one report (or renewal) interval before the cut. Counting only the
    /// nodes already silent would let the first of them be fenced while the guard still
    /// counts one unhealthy node. So the guard looks ahead by the spread (plus a second
    /// of slack): when the first node of a cut-off group falls silent, every other node of
    /// the group is counted. A node heard on either channel within that channel's own
    /// interval never is: it is counted only once its reports are one and a half report
    /// intervals old and its Lease one renewal interval old.
    pub fn counted_as_silent(&self, silence_timeout: Duration, now: Timestamp) -> bool {
        let quiet =
            |since: Timestamp| Duration::try_from(now.duration_since(since)).unwrap_or_default();
        quiet(self.report) >= self.reports_fresh_within / 2
            && quiet(self.lease) >= self.lease_fresh_within / 2
            && self.silent_at(silence_timeout) <= now + self.spread(silence_timeout) + GUARD_SLACK
    }
}

/// The storm guard's look-ahead beyond the spread, for the network's jitter.
pub const GUARD_SLACK: Duration = Duration::from_secs(1);

/// How late a kubelet's renewal may be heard before a drained node's kubelet counts as
/// stopped: the API server's and the watch's latency.
pub const DRAINED_LEASE_SLACK: Duration = Duration::from_secs(2);

/// What made the controller take a node for lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Evidence {
    /// The Ready condition was False or Unknown for `unhealthyDuration` (a node without
    /// an agent).
    NotReady,
    /// The node's Lease and its agent's reports were both silent for `silenceTimeout`.
    Silence,
    /// The agent's last report, received within `drainedReportMaxAge`, said the node
    /// had drained cleanly (every pod stopped, about to power off), and then the agent
    /// and the kubelet stopped (see [`Channels::drained_at`]). Its pods and volumes are
    /// released without a power fence.
    Drained,
    /// The node was not Ready and its Lease silent for `silenceTimeout` while its agent
    /// still reported: cut off from the API server, not dead. Its agent is asked to
    /// isolate it.
    Partitioned,
}

/// The node as a fence sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeState {
    /// Healthy: a fence not started yet is cancelled, a started one recovers.
    Healthy,
    /// Unhealthy since `since`, and lost (to be fenced) from `fence_at`.
    Lost {
        evidence: Evidence,
        since: Timestamp,
        fence_at: Timestamp,
    },
    /// Not Ready, its Lease silent for `silenceTimeout`, its agent still reporting: cut
    /// off from the API server since `since`. Never powered off blind: its agent is asked
    /// to isolate the node, and only if that fails or takes too long does the fence run
    /// its configured steps. Judged again at `until` (when the reports would count as
    /// silent too).
    Partitioned { since: Timestamp, until: Timestamp },
    /// Unhealthy, but not lost: no fence starts, and no new power action, while this
    /// holds. It is judged again at `until` if nothing changes before.
    Held {
        reason: PauseReason,
        message: String,
        until: Timestamp,
    },
}

impl NodeState {
    pub fn is_healthy(&self) -> bool {
        matches!(self, NodeState::Healthy)
    }
}

/// Judges a node from its Ready condition and what its channels said.
pub fn judge(
    health: &NodeHealth,
    liveness: &Liveness,
    policy: &FencePolicy,
    now: Timestamp,
) -> NodeState {
    match liveness {
        Liveness::NoAgent => {
            if health.is_ready() {
                return NodeState::Healthy;
            }
            // A missing or future transition time counts as now: a clock skew can only
            // delay a fence.
            let since = health.since.filter(|since| *since <= now).unwrap_or(now);
            NodeState::Lost {
                evidence: Evidence::NotReady,
                since,
                fence_at: since + policy.unhealthy_duration,
            }
        }
        Liveness::AgentUnknown { until } => {
            if health.is_ready() {
                return NodeState::Healthy;
            }
            NodeState::Held {
                reason: PauseReason::WaitingForAgentReports,
                message: format!(
                    "the node is not Ready, and the controller has not listened long enough to know whether the node's agent still reports (a partitioned node's agent would); it knows at {until}"
                ),
                until: *until,
            }
        }
        Liveness::Heard(channels) => {
            let silence = policy.silence_timeout;
            let silent_at = channels.silent_at(silence);
            let max_age = policy.drained_report_max_age;
            // A drained statement counts only while it is recent: the later the release,
            // the more could have happened on the node since it spoke.
            let drained_at = channels
                .drained_at()
                .filter(|_| !max_age.is_zero() && now <= channels.report + max_age);
            let since = channels.lease.max(channels.report);
            if let Some(drained_at) = drained_at
                && now >= drained_at
            {
                return NodeState::Lost {
                    evidence: Evidence::Drained,
                    since,
                    fence_at: drained_at.min(silent_at),
                };
            }
            if now >= silent_at {
                return NodeState::Lost {
                    evidence: Evidence::Silence,
                    since,
                    fence_at: silent_at,
                };
            }
            if health.is_ready() {
                return NodeState::Healthy;
            }
            let until = drained_at.map_or(silent_at, |at| at.min(silent_at));
            if now < channels.lease_silent_at(silence) {
                return NodeState::Held {
                    reason: PauseReason::NodeAlive,
                    message: "the node is not Ready, but its kubelet still renews its Lease: it is alive and not fenced".to_string(),
                    until,
                };
            }
            // Cut off from the API server. Its agent can be asked to isolate it only over
            // TLS, and only when isolation is on.
            if channels.isolation.is_none() || policy.isolation_timeout.is_zero() {
                let why = if channels.isolation.is_none() {
                    "its agent's reports come over plain HTTP, so it cannot be asked to isolate itself"
                } else {
                    "isolation is turned off (isolationTimeout 0s)"
                };
                return NodeState::Held {
                    reason: PauseReason::NodeAlive,
                    message: format!(
                        "the node is not Ready and its Lease is silent, but its agent still reports (last at {}): the node is cut off from the API server, not dead, and is never powered off blind; {why}",
                        channels.report
                    ),
                    until,
                };
            }
            NodeState::Partitioned {
                since: channels.lease,
                until,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::facts::Readiness;
    use proptest::prelude::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("in range")
    }

    fn policy() -> FencePolicy {
        FencePolicy {
            unhealthy_duration: Duration::from_secs(60),
            silence_timeout: Duration::from_secs(20),
            ..FencePolicy::default()
        }
    }

    fn health(readiness: Readiness, since: i64) -> NodeHealth {
        NodeHealth {
            readiness,
            since: Some(at(since)),
        }
    }

    /// A node with the default rhythms (renewals every 10 s, reports every 2 s).
    fn heard(lease: i64, report: i64) -> Liveness {
        Liveness::Heard(rhythm(lease, 10, report, 2))
    }

    #[test]
    fn without_an_agent_the_ready_condition_and_unhealthy_duration_decide() {
        let policy = policy();
        assert_eq!(
            judge(
                &health(Readiness::Ready, 0),
                &Liveness::NoAgent,
                &policy,
                at(100)
            ),
            NodeState::Healthy
        );
        assert_eq!(
            judge(
                &health(Readiness::Unknown, 10),
                &Liveness::NoAgent,
                &policy,
                at(30)
            ),
            NodeState::Lost {
                evidence: Evidence::NotReady,
                since: at(10),
                fence_at: at(70),
            }
        );
    }

    #[test]
    fn without_an_agent_a_transition_in_the_future_or_missing_counts_as_now() {
        let policy = policy();
        let skewed = NodeHealth {
            readiness: Readiness::NotReady,
            since: Some(at(100)),
        };
        let missing = NodeHealth {
            readiness: Readiness::NotReady,
            since: None,
        };
        for health in [skewed, missing] {
            assert_eq!(
                judge(&health, &Liveness::NoAgent, &policy, at(10)),
                NodeState::Lost {
                    evidence: Evidence::NotReady,
                    since: at(10),
                    fence_at: at(70),
                }
            );
        }
    }

    #[test]
    fn both_channels_silent_for_silence_timeout_is_lost_while_the_node_still_reads_ready() {
        // The node lifecycle controller has not noticed yet: Ready is still True.
        let state = judge(
            &health(Readiness::Ready, -500),
            &heard(0, 2),
            &policy(),
            at(22),
        );
        assert_eq!(
            state,
            NodeState::Lost {
                evidence: Evidence::Silence,
                since: at(2),
                fence_at: at(22),
            }
        );
        // One second earlier the reports still count: not lost, and healthy.
        assert_eq!(
            judge(
                &health(Readiness::Ready, -500),
                &heard(0, 2),
                &policy(),
                at(21)
            ),
            NodeState::Healthy
        );
    }

    #[test]
    fn silence_needs_no_unhealthy_duration_on_top() {
        let state = judge(
            &health(Readiness::Unknown, 15),
            &heard(0, 0),
            &policy(),
            at(20),
        );
        assert!(
            matches!(state, NodeState::Lost { fence_at, .. } if fence_at == at(20)),
            "{state:?}"
        );
    }

    #[test]
    fn an_agent_still_reporting_holds_a_node_whose_lease_is_silent_however_long_not_ready() {
        let state = judge(
            &health(Readiness::Unknown, 0),
            &heard(-40, 1_000),
            &policy(),
            at(1_001),
        );
        match state {
            NodeState::Held {
                reason,
                message,
                until,
            } => {
                assert_eq!(reason, PauseReason::NodeAlive);
                assert!(message.contains("cut off from the API server"), "{message}");
                assert!(message.contains("plain HTTP"), "{message}");
                assert_eq!(until, at(1_020));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_node_cut_off_from_the_api_server_whose_agent_reports_over_tls_is_partitioned() {
        let mut channels = rhythm(-40, 10, 1_000, 2);
        channels.isolation = Some(IsolationHeard {
            state: crate::report::protocol::IsolationState::None,
            confirmed: false,
            sequence: 7,
            request: 0,
        });
        let cut_off = health(Readiness::Unknown, 0);
        assert_eq!(
            judge(&cut_off, &Liveness::Heard(channels), &policy(), at(1_001)),
            NodeState::Partitioned {
                since: at(-40),
                until: at(1_020),
            }
        );
        // Not while it reads Ready (the node lifecycle controller agrees first), nor
        // before its Lease has been silent for silenceTimeout.
        assert_eq!(
            judge(
                &health(Readiness::Ready, 0),
                &Liveness::Heard(channels),
                &policy(),
                at(1_001)
            ),
            NodeState::Healthy
        );
        let mut renewing = channels;
        renewing.lease = at(990);
        assert!(matches!(
            judge(&cut_off, &Liveness::Heard(renewing), &policy(), at(1_001)),
            NodeState::Held {
                reason: PauseReason::NodeAlive,
                ..
            }
        ));
        // With isolation turned off it is held, as over plain HTTP.
        let off = FencePolicy {
            isolation_timeout: Duration::ZERO,
            ..policy()
        };
        match judge(&cut_off, &Liveness::Heard(channels), &off, at(1_001)) {
            NodeState::Held { message, .. } => {
                assert!(message.contains("isolation is turned off"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_renewing_lease_holds_a_not_ready_node_whose_agent_is_silent() {
        let state = judge(
            &health(Readiness::NotReady, 0),
            &heard(995, 0),
            &policy(),
            at(1_000),
        );
        assert!(
            matches!(&state, NodeState::Held { reason: PauseReason::NodeAlive, message, .. } if message.contains("renews its Lease")),
            "{state:?}"
        );
    }

    #[test]
    fn an_agent_reporting_less_often_than_the_timeout_is_given_three_intervals() {
        let slow = Liveness::Heard(rhythm(0, 10, 0, 30));
        let state = judge(&health(Readiness::Ready, 0), &slow, &policy(), at(60));
        assert_eq!(state, NodeState::Healthy);
        let state = judge(&health(Readiness::Ready, 0), &slow, &policy(), at(90));
        assert!(matches!(state, NodeState::Lost { .. }), "{state:?}");
    }

    #[test]
    fn a_kubelet_renewing_less_often_than_the_timeout_is_given_two_renewals() {
        // leaseDurationSeconds 120: the kubelet renews every 30 s.
        let slow = Liveness::Heard(rhythm(0, 30, -1_000, 2));
        let state = judge(&health(Readiness::Ready, 0), &slow, &policy(), at(59));
        assert_eq!(state, NodeState::Healthy);
        let state = judge(&health(Readiness::Ready, 0), &slow, &policy(), at(60));
        assert!(matches!(state, NodeState::Lost { .. }), "{state:?}");
    }

    #[test]
    fn before_the_agents_had_time_to_reach_the_controller_a_not_ready_node_is_held() {
        let unknown = Liveness::AgentUnknown { until: at(40) };
        let state = judge(
            &health(Readiness::Unknown, -600),
            &unknown,
            &policy(),
            at(5),
        );
        assert!(
            matches!(state, NodeState::Held { reason: PauseReason::WaitingForAgentReports, until, .. } if until == at(40)),
            "{state:?}"
        );
        assert_eq!(
            judge(&health(Readiness::Ready, -600), &unknown, &policy(), at(5)),
            NodeState::Healthy
        );
    }

    fn drained(lease: i64, report: i64) -> Liveness {
        let mut channels = rhythm(lease, 10, report, 2);
        channels.drained = Some(DrainedStatement {
            boot_time: at(-100_000),
            sequence: 7,
            finished_at: Some(at(report)),
        });
        Liveness::Heard(channels)
    }

    #[test]
    fn a_node_that_said_it_drained_is_lost_once_its_agent_and_kubelet_stopped() {
        let policy = policy();
        let ready = health(Readiness::Ready, -500);
        // Reports every 2 s (last at 2), renewals every 10 s (last at 0): the agent has
        // missed three reports at 8, the kubelet a renewal (and the slack) at 12.
        assert_eq!(
            judge(&ready, &drained(0, 2), &policy, at(11)),
            NodeState::Healthy
        );
        assert_eq!(
            judge(&ready, &drained(0, 2), &policy, at(12)),
            NodeState::Lost {
                evidence: Evidence::Drained,
                since: at(2),
                fence_at: at(12),
            }
        );
        // Its kubelet still renews: not gone, drained or not, and judged again when it
        // may be.
        let state = judge(
            &health(Readiness::Unknown, 0),
            &drained(10, 2),
            &policy,
            at(20),
        );
        assert!(
            matches!(state, NodeState::Held { until, .. } if until == at(22)),
            "{state:?}"
        );
        // Its agent still reports: the same.
        let state = judge(
            &health(Readiness::Unknown, 0),
            &drained(0, 10),
            &policy,
            at(14),
        );
        assert!(
            matches!(state, NodeState::Held { until, .. } if until == at(16)),
            "{state:?}"
        );
    }

    #[test]
    fn a_kubelet_renewing_long_after_the_drained_report_voids_it() {
        // The report at 0, then a renewal at 13 (more than a 10 s renewal interval and
        // the slack later): the node did not go down. Silent after that, it is fenced.
        let state = judge(
            &health(Readiness::Unknown, 0),
            &drained(13, 0),
            &policy(),
            at(40),
        );
        assert!(
            matches!(
                state,
                NodeState::Lost {
                    evidence: Evidence::Silence,
                    ..
                }
            ),
            "{state:?}"
        );
        // A last renewal within that margin is the kubelet's on its way down.
        let state = judge(
            &health(Readiness::Unknown, 0),
            &drained(12, 0),
            &policy(),
            at(24),
        );
        assert!(
            matches!(state, NodeState::Lost { evidence: Evidence::Drained, fence_at, .. } if fence_at == at(24)),
            "{state:?}"
        );
    }

    #[test]
    fn a_drained_statement_counts_only_within_its_bound_and_not_when_turned_off() {
        let policy = policy();
        let state = |policy: &FencePolicy, now| match judge(
            &health(Readiness::Unknown, 0),
            &drained(0, 0),
            policy,
            now,
        ) {
            NodeState::Lost { evidence, .. } => evidence,
            other => panic!("{other:?}"),
        };
        assert_eq!(state(&policy, at(120)), Evidence::Drained);
        assert_eq!(state(&policy, at(121)), Evidence::Silence);
        let off = FencePolicy {
            drained_report_max_age: Duration::ZERO,
            ..policy
        };
        assert_eq!(state(&off, at(20)), Evidence::Silence);
    }

    /// A node whose kubelet renews every `renewal` seconds and whose agent reports every
    /// `interval` seconds, last heard at `lease` and `report`.
    fn rhythm(lease: i64, renewal: u64, report: i64, interval: u64) -> Channels {
        Channels {
            lease: at(lease),
            lease_fresh_within: Duration::from_secs(2 * renewal),
            report: at(report),
            reports_fresh_within: Duration::from_secs(3 * interval),
            drained: None,
            isolation: None,
            api_reachable_since: None,
            promise: None,
            boot: None,
        }
    }

    /// `phase` of `period` seconds before `at(0)`, in whole seconds.
    fn within(phase: f64, period: u64) -> i64 {
        -((phase * period as f64) as i64)
    }

    proptest! {
        /// The storm guard's promise: when the first node of a group cut off at one
        /// instant falls silent (and may be fenced), the guard already counts every node
        /// of the group, so a partition of many nodes is a storm before any of them is
        /// fenced.
        #[test]
        fn when_the_first_node_of_a_cut_off_group_falls_silent_the_guard_counts_them_all(
            renewal in 1u64..30,
            interval in 1u64..20,
            timeout in 2u64..60,
            phases in prop::collection::vec((0.0f64..1.0, 0.0f64..1.0), 2..30),
        ) {
            let silence = Duration::from_secs(timeout);
            // Each node renewed its Lease within one renewal interval and reported
            // within one report interval before the cut.
            let group: Vec<Channels> = phases
                .iter()
                .map(|(l, r)| rhythm(within(*l, renewal), renewal, within(*r, interval), interval))
                .collect();
            let first = group
                .iter()
                .map(|c| c.silent_at(silence))
                .min()
                .expect("a group");
            for channels in &group {
                prop_assert!(
                    channels.counted_as_silent(silence, first),
                    "{channels:?} not counted at {first} (silent at {})",
                    channels.silent_at(silence)
                );
            }
        }

        /// A node heard on both channels within their own intervals is never counted,
        /// in every configuration where the silence timeout covers two renewals (the
        /// default does).
        #[test]
        fn a_healthy_node_is_never_counted_as_silent(
            renewal in 1u64..30,
            interval in 1u64..20,
            extra in 0u64..60,
            lease_phase in 0.0f64..1.0,
            report_phase in 0.0f64..1.0,
        ) {
            let silence = Duration::from_secs(2 * renewal + extra);
            let channels = rhythm(within(lease_phase, renewal), renewal, within(report_phase, interval), interval);
            prop_assert!(!channels.counted_as_silent(silence, at(0)), "{channels:?}");
        }

        /// With the Lease still renewed, a node whose reports stopped (the agent died,
        /// or its reports cannot reach the controller) is not counted either.
        #[test]
        fn reports_alone_stopping_is_not_counted_while_the_lease_renews(
            renewal in 1u64..30,
            interval in 1u64..20,
            extra in 0u64..60,
            lease_phase in 0.0f64..1.0,
            report_ago in 0i64..100_000,
        ) {
            let silence = Duration::from_secs(2 * renewal + extra);
            let channels = rhythm(within(lease_phase, renewal), renewal, -report_ago, interval);
            prop_assert!(!channels.counted_as_silent(silence, at(0)), "{channels:?}");
        }

        /// Either channel heard within `silenceTimeout` (and the reports within their
        /// own three intervals) means the node is never taken for lost, whatever its Ready
        /// condition; both silent means it is, whatever its Ready condition.
        #[test]
        fn a_node_is_lost_by_silence_exactly_when_both_channels_are_silent(
            lease_ago in 0i64..120,
            report_ago in 0i64..120,
            fresh in 1u64..100,
            lease_fresh in 0u64..100,
            timeout in 2u64..60,
            readiness in prop::sample::select(vec![Readiness::Ready, Readiness::NotReady, Readiness::Unknown]),
            since in -600i64..0,
        ) {
            let now = at(0);
            let policy = FencePolicy {
                silence_timeout: Duration::from_secs(timeout),
                ..policy()
            };
            let channels = Channels {
                lease: at(-lease_ago),
                lease_fresh_within: Duration::from_secs(lease_fresh),
                report: at(-report_ago),
                reports_fresh_within: Duration::from_secs(fresh),
            drained: None,
            isolation: None,
            api_reachable_since: None,
            promise: None,
            boot: None,
            };
            let state = judge(&health(readiness, since), &Liveness::Heard(channels), &policy, now);
            let lease_alive = (lease_ago as u64) < timeout.max(lease_fresh);
            let reports_alive = (report_ago as u64) < timeout.max(fresh);
            if lease_alive || reports_alive {
                prop_assert!(!matches!(state, NodeState::Lost { .. }), "{state:?}");
                prop_assert_eq!(state.is_healthy(), readiness == Readiness::Ready);
            } else {
                let lost_by_silence = matches!(state, NodeState::Lost { evidence: Evidence::Silence, fence_at, .. } if fence_at <= now);
                prop_assert!(lost_by_silence, "{:?}", state);
            }
        }
    }
}
