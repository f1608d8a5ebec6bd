//! The fence state machine: `decide(fence, facts, reports, guard, policy, now)` returns
//! the NodeFence's next status and the actions that go with it. It is pure; the
//! reconciler persists the status first (guarded by the object's resourceVersion) and
//! carries out the actions only once that write succeeded. Every execution is in the
//! status before its agent starts, so a controller restarted at any instant finds it, and
//! one whose executor no longer knows it is asked about with `status` instead of being
//! repeated.
//!
//! The rules, in the order they win:
//! - an execution in flight is never joined by another one for the same node;
//! - a node is lost by its Ready condition and `unhealthyDuration` when it has no agent,
//!   by the silence of both its Lease and its agent's reports when it has one (see
//!   `liveness.rs`); a node either channel shows alive gets no new step but recovery;
//! - a node cut off from the API server (not Ready, its Lease silent, its agent reporting
//!   over TLS) is asked to isolate itself through its agent, and released on the agent's
//!   report of it; only when the agent fails, refuses, falls silent or takes longer than
//!   `isolationTimeout` do the configured steps run against it;
//! - the storm guard holds back every power action (isolation and power management), the
//!   zone rate every new fence; recovery is never held back;
//! - the node's pods are released (out-of-service taint, optional deletion) only once a
//!   step's winning alternative proved the node off or its storage isolated, the node
//!   said it drained, its agent reported it isolated, or (with `kdump=true`) its crash
//!   kernel announced itself from its InternalIP after the node's last sign of life;
//! - a node with no fence device whose agent promised, in its last report over TLS, to
//!   isolate or reset it by itself once cut off (self-isolation, backed by a watchdog) is
//!   released once it has been silent for the promise and `selfIsolationMargin`;
//! - the power step waits while such a node dumps: until its kdump notifications stop for
//!   `kdumpSilence`, at most `kdumpWait`;
//! - a failed step is retried after an exponential backoff up to the retry limit, then
//!   the fence stays failed and says so;
//! - our taints are removed only after recovery, and only the ones we recorded adding.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::fencing::Step;

use super::facts::{MethodOutline, NodeFacts, Readiness};
use super::kdump::KdumpHeard;
use super::liveness::{Evidence, Liveness, NodeState, judge};
use super::policy::FencePolicy;
use super::progress::{Progress, progress};
use super::resource::{
    Execution, ExecutionKind, ExecutionResult, FencePhase, FenceStep, IsolationOutcome,
    KdumpRecord, LostRecord, MAX_EXECUTIONS, MethodAction, NodeFence, NodeFenceStatus,
    PROMISE_PROOF, Pause, PauseReason, PowerSeen, PromiseRecord, SelfIsolation,
};
use super::storm::{Guard, GuardBlock};
use crate::report::ledger::BootId;
use crate::report::ledger::IsolationHeard;
use crate::report::protocol::{Instruction, IsolationState};

/// How long to wait before looking again when nothing else says when.
pub const IDLE_REQUEUE: Duration = Duration::from_secs(30);
/// How often to look at a fence whose execution is running.
pub const RUNNING_REQUEUE: Duration = Duration::from_secs(5);
/// How often to look at the agent's reports of a node asked to isolate itself (a report
/// arrives every 2 s by default; no event wakes the fence for it).
pub const ISOLATION_REQUEUE: Duration = Duration::from_secs(1);

/// How soon a fence whose node's Lease could not be read afresh tries again.
const LEASE_CHECK_RETRY: Duration = Duration::from_secs(10);

/// When a node last heard at `last_heard`, with a self-isolation promise of `within`,
/// may be released: the promise, the margin, and one per cent of the promise for the
/// two machines' clocks running at different rates (a watchdog's timer and NTP's slew
/// stay well within that), rounded up to the next whole second (the status keeps whole
/// seconds).
fn release_time(last_heard: Timestamp, within: Duration, margin: Duration) -> Timestamp {
    ceil_second(last_heard + within + margin + within / 100)
}

/// `moment` rounded up to a whole second.
fn ceil_second(moment: Timestamp) -> Timestamp {
    let whole = moment.as_second() + i64::from(moment.subsec_nanosecond() > 0);
    Timestamp::from_second(whole).unwrap_or(moment)
}

/// How long a node's agent must have said, report after report, that it reaches the API
/// server before its isolation is ended: one answer on a flaky link, or a state left from
/// before a partition the agent has not noticed yet, does not start the kubelet on a node
/// still cut off. Longer than the agent's API probe interval and timeout (10 s + 5 s).
pub const API_REACHABLE_BEFORE_ENDING_ISOLATION: Duration = Duration::from_secs(15);

/// The identifier of a fence's isolation request, as the instruction carries it and the
/// agent's report names it: when it was requested, in milliseconds.
fn request_id(isolation: &SelfIsolation) -> u64 {
    u64::try_from(isolation.requested_at.0.as_millisecond()).unwrap_or(0)
}

/// What the executor says about an execution recorded in the status.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionReport {
    pub name: String,
    pub state: ReportedState,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ReportedState {
    Running,
    Finished(Outcome),
    /// The executor has no trace of it: it was started by a controller that is gone.
    Lost,
}

/// How an execution ended, as the runner or a Job reported it.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub succeeded: bool,
    pub timed_out: bool,
    pub off_confirmed: bool,
    pub power: Option<PowerSeen>,
    pub detail: Option<String>,
    pub finished_at: Timestamp,
}

/// An execution to start; it is already recorded in the returned status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExecutionRequest {
    pub name: String,
    pub step: Step,
    pub attempt: u32,
    pub alternative: u32,
    pub method: String,
    pub kind: ExecutionKind,
}

/// A taint change on the fenced node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TaintChange {
    AddRemediation,
    RemoveRemediation,
    AddOutOfService,
    RemoveOutOfService,
}

impl TaintChange {
    /// For the log: which taint, added or removed.
    pub fn describe(&self) -> &'static str {
        match self {
            TaintChange::AddRemediation => "remediation taint added",
            TaintChange::RemoveRemediation => "remediation taint removed",
            TaintChange::AddOutOfService => "out-of-service taint added",
            TaintChange::RemoveOutOfService => "out-of-service taint removed",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Action {
    Start(ExecutionRequest),
    Taint(TaintChange),
    /// Force-delete the node's pods (the optional cluster fence).
    DeletePods,
    /// The fence is over (recovered, cancelled, or its node is gone): delete the NodeFence.
    DeleteFence,
}

/// An Event for the NodeFence and its Node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FenceEvent {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub status: NodeFenceStatus,
    pub actions: Vec<Action>,
    pub events: Vec<FenceEvent>,
    /// What the node's agent is asked in the answers to its reports from now on (none:
    /// nothing). Level-based, like the taints: every decision says it again.
    pub instructions: Vec<Instruction>,
    pub requeue_after: Duration,
}

/// The whole decision for one fence. `reports` covers the status's unfinished
/// executions; one with no report is waited for, never assumed lost.
pub fn decide(
    fence: &NodeFence,
    facts: &NodeFacts,
    reports: &[ExecutionReport],
    guard: &Guard,
    policy: &FencePolicy,
    now: Timestamp,
) -> Decision {
    let mut machine = Machine {
        status: fence.status.clone().unwrap_or_default(),
        forced: fence.spec.force,
        state: judge(&facts.health, &facts.liveness, policy, now),
        facts,
        guard,
        policy,
        now,
        actions: Vec::new(),
        events: Vec::new(),
        instructions: Vec::new(),
        wake_at: None,
        pause: None,
    };
    machine.record_reports(reports);
    let name = fence.metadata.name.as_deref().unwrap_or_default();
    if name != fence.spec.node_name {
        // Only a fence named after its node may act: that is what makes it the node's
        // only fence. Whatever already runs is still recorded when it ends.
        machine.pause(
            PauseReason::NameMismatch,
            format!(
                "this NodeFence is named {name:?} but fences node {:?}; create it as {:?} instead",
                fence.spec.node_name, fence.spec.node_name
            ),
            None,
        );
        return machine.finish(fence.metadata.generation);
    }
    if !machine.in_flight() {
        // Each pass makes at most one transition; a handful settle any state.
        for _ in 0..8 {
            if !machine.advance() {
                break;
            }
        }
    }
    machine.note_kdump();
    machine.release_and_taints();
    machine.end_isolation_when_released();
    machine.finish(fence.metadata.generation)
}

struct Machine<'a> {
    status: NodeFenceStatus,
    forced: bool,
    /// The node as judged from its Ready condition and its channels, at `now`.
    state: NodeState,
    facts: &'a NodeFacts,
    guard: &'a Guard,
    policy: &'a FencePolicy,
    now: Timestamp,
    actions: Vec<Action>,
    events: Vec<FenceEvent>,
    instructions: Vec<Instruction>,
    wake_at: Option<Timestamp>,
    pause: Option<(PauseReason, String, Option<Timestamp>)>,
}

impl<'a> Machine<'a> {
    fn in_flight(&self) -> bool {
        self.status.executions.iter().any(|e| !e.is_finished())
    }

    fn event(&mut self, warning: bool, reason: &'static str, message: String) {
        self.events.push(FenceEvent {
            warning,
            reason,
            message,
        });
    }

    /// The fence ends before or instead of its next step: say why, then delete it.
    fn end_fence(&mut self, reason: &'static str, message: String) -> bool {
        self.event(false, reason, message);
        self.actions.push(Action::DeleteFence);
        false
    }

    fn wake(&mut self, at: Timestamp) {
        self.wake_at = Some(self.wake_at.map_or(at, |w| w.min(at)));
    }

    fn pause(&mut self, reason: PauseReason, message: String, until: Option<Timestamp>) {
        if let Some(until) = until {
            self.wake(until);
        }
        self.pause = Some((reason, message, until));
    }

    fn block(&mut self, block: &GuardBlock) {
        self.pause(block.reason, block.message.clone(), block.until);
    }

    /// The storm guard holds every power action and release back, the zone rate every
    /// new fence: paused with the guard's reason when either does.
    fn held_by_guard(&mut self) -> bool {
        if let Some(block) = &self.guard.storm {
            self.block(block);
            return true;
        }
        if self.status.started_at.is_none()
            && let Some(block) = &self.guard.zone
        {
            self.block(block);
            return true;
        }
        false
    }

    fn set_phase(&mut self, step: FenceStep, phase: FencePhase) {
        self.status.step = Some(step);
        self.status.phase = Some(phase);
        self.status.phase_since = Some(Time(self.now));
    }

    fn phase_since(&self) -> Timestamp {
        self.status
            .phase_since
            .as_ref()
            .map_or(self.now, |time| time.0)
    }

    fn attempt(&self) -> u32 {
        self.status.retries + 1
    }

    /// Folds the executor's reports into the recorded executions.
    fn record_reports(&mut self, reports: &[ExecutionReport]) {
        let mut finished = Vec::new();
        for execution in self
            .status
            .executions
            .iter_mut()
            .filter(|e| !e.is_finished())
        {
            let Some(report) = reports.iter().find(|r| r.name == execution.name) else {
                continue;
            };
            match &report.state {
                ReportedState::Running => {}
                ReportedState::Finished(outcome) => {
                    execution.finished_at = Some(Time(outcome.finished_at));
                    execution.result = Some(if outcome.succeeded {
                        ExecutionResult::Succeeded
                    } else if outcome.timed_out {
                        ExecutionResult::TimedOut
                    } else {
                        ExecutionResult::Failed
                    });
                    execution.off_confirmed = outcome.succeeded && outcome.off_confirmed;
                    execution.power = outcome.power;
                    execution.detail = outcome.detail.clone();
                    finished.push(execution.clone());
                }
                ReportedState::Lost => {
                    execution.finished_at = Some(Time(self.now));
                    execution.result = Some(ExecutionResult::Interrupted);
                    execution.detail = Some(
                        "interrupted: the controller restarted while it ran; the device is asked for its state before anything is done again".to_string(),
                    );
                    finished.push(execution.clone());
                }
            }
        }
        for execution in finished {
            let result = execution.result.unwrap_or(ExecutionResult::Failed);
            // A Verify execution's action is `status`.
            let mut line = format!(
                "{} {}: {result:?}",
                execution.method,
                execution.action.name()
            );
            if let Some(power) = execution.power {
                line.push_str(&format!(", power {power:?}"));
            }
            self.status.last_result = Some(line.clone());
            let warning = result != ExecutionResult::Succeeded;
            let detail = execution
                .detail
                .as_deref()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default();
            self.event(
                warning,
                if warning {
                    "ExecutionFailed"
                } else {
                    "ExecutionSucceeded"
                },
                format!(
                    "{} step, attempt {}, alternative {}: {line}{detail}",
                    execution.step, execution.attempt, execution.alternative
                ),
            );
        }
    }

    /// One transition; `false` when the fence is settled for now.
    fn advance(&mut self) -> bool {
        let facts = self.facts;
        // A fence with no step has not begun, unless it released a drained node or rests
        // on the node's isolation by its agent (neither takes a step).
        if self.status.step.is_none()
            && !self.status.is_drained()
            && !self.status.is_self_isolating()
            && !self.status.is_released_on_promise()
        {
            return self.begin();
        }
        if !facts.exists {
            return self.end_fence(
                "NodeGone",
                "the Node object was deleted; the fence ends here".to_string(),
            );
        }
        if facts.excluded && self.status.step != Some(FenceStep::Recovery) {
            self.pause(
                PauseReason::Excluded,
                "the node carries the exclusion label; nothing more is done".to_string(),
                None,
            );
            return false;
        }
        let Some(step) = self.status.step else {
            if self.status.is_self_isolating() {
                return self.settle_isolation();
            }
            if self.status.is_released_on_promise() {
                return self.settle_promise();
            }
            return self.settle_drained();
        };
        let phase = self.status.phase.unwrap_or(FencePhase::New);
        let ready = self.state.is_healthy();
        let started = self.status.started_at.is_some();
        match (step, phase) {
            (FenceStep::Recovery, FencePhase::New) => self.start_step(),
            (_, FencePhase::New) => {
                if ready && !self.forced {
                    if started {
                        return self.enter_recovery();
                    }
                    return self.end_fence(
                        "FenceCancelled",
                        format!("{} again before anything was done", self.healthy_now()),
                    );
                }
                if self.is_held() {
                    self.pause_held();
                    return false;
                }
                self.start_step()
            }
            (_, FencePhase::Running) => self.continue_step(),
            (FenceStep::Isolation, FencePhase::Done) => {
                if ready && !self.forced {
                    return self.enter_recovery();
                }
                if !self.plan_has(Step::PowerManagement) {
                    return false;
                }
                let at = self.phase_since() + self.policy.power_management_delay;
                if at > self.now {
                    self.pause(
                        PauseReason::WaitingForPowerManagementDelay,
                        format!("isolation is done; power management starts at {at} unless the node comes back first"),
                        Some(at),
                    );
                    return false;
                }
                self.status.retries = 0;
                self.set_phase(FenceStep::PowerManagement, FencePhase::New);
                true
            }
            (FenceStep::PowerManagement, FencePhase::Done) => {
                // An agent reporting from the powered-off boot is proof enough, Ready or
                // not: a partitioned node's kubelet cannot say so, its agent can.
                if let Some(boot) = self.agent_boot_that_outlived_the_power_off() {
                    self.power_off_contradicted("its agent", boot);
                    return false;
                }
                if !ready {
                    return false;
                }
                if let Some(boot) = self.boot_that_outlived_the_power_off() {
                    if !self.heard_since(self.phase_since()) {
                        // A Ready condition, or channels, from before the power-off (a
                        // forced fence's node reads Ready until the node lifecycle
                        // controller notices): not back, and no contradiction yet.
                        return false;
                    }
                    if self.fresh_agent_boot().is_some_and(|now| !now.is(boot)) {
                        // Its agent reports a new boot: the kubelet has not posted its
                        // own yet. Back, but recovery waits for the kubelet to say so.
                        return false;
                    }
                    self.power_off_contradicted("its kubelet", boot);
                    return false;
                }
                self.enter_recovery()
            }
            (FenceStep::Recovery, FencePhase::Done) => {
                if self.status.recovered_at.is_none() {
                    self.status.recovered_at = Some(Time(self.now));
                    self.event(
                        false,
                        "Recovered",
                        "recovery is done; our taints are removed".to_string(),
                    );
                }
                let ours_left = facts.taints.remediation
                    || (facts.taints.out_of_service && self.status.out_of_service_at.is_some());
                if !ours_left {
                    self.actions.push(Action::DeleteFence);
                }
                false
            }
            (_, FencePhase::Error) => {
                if ready && !self.forced && step != FenceStep::Recovery && started {
                    return self.enter_recovery();
                }
                self.retry_or_fail(step)
            }
        }
    }

    fn plan_has(&self, step: Step) -> bool {
        self.facts.plan.as_ref().is_ok_and(|plan| plan.has(step))
    }

    /// A fence with no step yet: wait for every precondition, then pick the first step.
    fn begin(&mut self) -> bool {
        let facts = self.facts;
        if !facts.exists {
            return self.end_fence("NodeGone", "the Node object does not exist".to_string());
        }
        if facts.excluded {
            self.pause(
                PauseReason::Excluded,
                "the node carries the exclusion label and is never fenced".to_string(),
                None,
            );
            return false;
        }
        // Before the configuration: a drained node needs no fence device. (With pods that
        // need fencing still bound, see `drain_contradicted` below.)
        if !self.forced
            && !facts.runs_pods_needing_fencing
            && let NodeState::Lost {
                evidence: Evidence::Drained,
                since,
                ..
            } = self.state
        {
            return self.release_drained(since);
        }
        // Also before the configuration: a partitioned node's agent isolates it, with no
        // fence device. Once that was given up, the configured steps run.
        if !self.forced
            && let NodeState::Partitioned { since, .. } = self.state
            && !self.status.isolation_given_up()
        {
            if !facts.runs_pods_needing_fencing {
                return self.end_fence(
                    "FenceCancelled",
                    "the node runs no pods that need fencing".to_string(),
                );
            }
            return self.request_isolation(since);
        }
        // A node with no fence device may rest on its agent's self-isolation promise.
        let mut promise = None;
        let plan = match &facts.plan {
            Ok(plan) if plan.can_fence() => Some(plan),
            unusable => {
                let reason = match unusable {
                    Err(reason) => reason.clone(),
                    Ok(_) => "the node's fence configuration has neither an isolation nor a power management step".to_string(),
                };
                match self.promise_now() {
                    Ok(record) if !self.forced => {
                        promise = Some(record);
                        None
                    }
                    no_promise => {
                        let why = no_promise
                            .err()
                            .unwrap_or_else(|| "a forced fence needs a fence device".to_string());
                        self.status.promise = None;
                        self.pause(
                            PauseReason::NoConfiguration,
                            format!("{reason}; {why}"),
                            None,
                        );
                        return false;
                    }
                }
            }
        };
        if !self.forced {
            if self.state.is_healthy() {
                return self.end_fence(
                    "FenceCancelled",
                    format!(
                        "{}; only a fence with spec.force runs on a healthy node",
                        self.healthy_now()
                    ),
                );
            }
            if !facts.runs_pods_needing_fencing {
                return self.end_fence(
                    "FenceCancelled",
                    "the node runs no pods that need fencing".to_string(),
                );
            }
            if self.is_held() {
                self.pause_held();
                return false;
            }
            if self.drain_contradicted() {
                return false;
            }
            if let NodeState::Lost {
                evidence,
                since,
                fence_at,
            } = self.state
            {
                // How long the node has been in trouble.
                let unhealthy =
                    Duration::try_from(self.now.duration_since(since)).unwrap_or_default();
                if fence_at > self.now {
                    self.pause(
                        PauseReason::WaitingForUnhealthyDuration,
                        format!(
                            "the node has been unhealthy for {}s of the {}s required",
                            unhealthy.as_secs(),
                            self.policy.unhealthy_duration.as_secs()
                        ),
                        Some(fence_at),
                    );
                    return false;
                }
                // Once: a fence that waits on a promise passes here again and again,
                // and must neither rewrite its status nor repeat the Event.
                let first = self
                    .status
                    .lost
                    .as_ref()
                    .is_none_or(|lost| lost.evidence != evidence);
                if first {
                    self.status.lost = Some(LostRecord {
                        evidence,
                        since: Time(since),
                    });
                }
                if first && evidence == Evidence::Silence {
                    self.event(
                        true,
                        "NodeSilent",
                        format!(
                            "the node's Lease and its agent's reports have both been silent for {}s (silenceTimeout {}s): taken for dead without waiting for NotReady",
                            unhealthy.as_secs(),
                            self.policy.silence_timeout.as_secs()
                        ),
                    );
                }
            }
        }
        let Some(plan) = plan else {
            return promise.is_some_and(|record| self.wait_on_promise(record));
        };
        let step = if plan.has(Step::Isolation) {
            FenceStep::Isolation
        } else {
            FenceStep::PowerManagement
        };
        self.status.retries = 0;
        self.set_phase(step, FencePhase::New);
        true
    }

    /// A node lost as drained that still has pods that need fencing bound to it: its word
    /// that every pod stopped does not hold, so it is judged as a silent node, fenced
    /// once it is one (`true`: paused until then).
    fn drain_contradicted(&mut self) -> bool {
        let NodeState::Lost {
            evidence: Evidence::Drained,
            since,
            ..
        } = self.state
        else {
            return false;
        };
        let silent_at = match self.facts.liveness {
            Liveness::Heard(channels) => channels.silent_at(self.policy.silence_timeout),
            _ => self.now,
        };
        if silent_at > self.now {
            self.pause(
                PauseReason::DrainContradicted,
                format!(
                    "the node's agent said every pod stopped, but pods that need fencing are still bound to it; it is fenced as a silent node at {silent_at}"
                ),
                Some(silent_at),
            );
            return true;
        }
        self.event(
            true,
            "DrainContradicted",
            "the node's agent said every pod stopped, but pods that need fencing are still bound to the node: it is fenced as a silent node".to_string(),
        );
        self.state = NodeState::Lost {
            evidence: Evidence::Silence,
            since,
            fence_at: silent_at,
        };
        false
    }

    /// The node drained cleanly, then its agent and kubelet stopped (see
    /// [`Evidence::Drained`]): it is off, by its own last word, so its volumes (and any
    /// pod left) are released at once, with no power action and no fence device. A storm
    /// the guard has declared, and the zone rate, still hold it back like any other fence.
    fn release_drained(&mut self, since: Timestamp) -> bool {
        let facts = self.facts;
        // (Called only when no pod that needs fencing is bound to the node.)
        if facts.volumes_attached == 0 {
            return self.end_fence(
                "FenceCancelled",
                "the node drained cleanly and has no pods that need fencing and no attached volumes: nothing to release".to_string(),
            );
        }
        if self.held_by_guard() {
            return false;
        }
        let silent = Duration::try_from(self.now.duration_since(since)).unwrap_or_default();
        let statement = match self.facts.liveness {
            Liveness::Heard(channels) => channels.drained,
            _ => None,
        };
        let report = statement.map_or_else(
            || "its last report".to_string(),
            |said| {
                let finished = said
                    .finished_at
                    .map(|at| format!(", shutdown finished at {at} by the node's clock"))
                    .unwrap_or_default();
                format!(
                    "its report {} of the boot that began at {}{finished}",
                    said.sequence, said.boot_time
                )
            },
        );
        let proof = format!(
            "the node's agent said in {report} that the node drained cleanly (every pod stopped, about to power off), then its Lease and reports were silent for {}s",
            silent.as_secs()
        );
        self.start_without_step(Evidence::Drained, since);
        self.confirm_without_step(
            proof,
            "drained: released without a power fence",
            "NodeDrained",
            "its pods and volumes are released without a power fence",
        );
        false
    }

    /// A fence that begins without a step of its own (a drained node, or a partitioned
    /// one its agent is asked to isolate): it counts as started, for the zone rate, from
    /// now.
    fn start_without_step(&mut self, evidence: Evidence, since: Timestamp) {
        self.status.started_at = Some(Time(self.now));
        self.status.zone = Some(self.facts.zone.clone());
        self.status.lost = Some(LostRecord {
            evidence,
            since: Time(since),
        });
        self.status.phase_since = Some(Time(self.now));
    }

    /// The fence is confirmed by the node's own word (`proof`), with no step: phase Done,
    /// and an Event `reason` saying what is released.
    fn confirm_without_step(
        &mut self,
        proof: String,
        last_result: &str,
        reason: &'static str,
        released: &str,
    ) {
        let message = format!("{proof}: {released}");
        self.confirm(proof, reason, message);
        self.status.phase = Some(FencePhase::Done);
        self.status.phase_since = Some(Time(self.now));
        self.status.last_result = Some(last_result.to_string());
    }

    /// The fence is confirmed now by `proof` (what the status shows in `confirmedBy`):
    /// from here on the node's pods may be released. Said in an Event `reason`.
    fn confirm(&mut self, proof: String, reason: &'static str, message: String) {
        self.status.confirmed_at = Some(Time(self.now));
        self.status.confirmed_by = Some(proof);
        self.event(false, reason, message);
    }

    /// The fence counts as started from now, for the zone rate, unless it already does;
    /// `true` when it starts now.
    fn count_as_started(&mut self) -> bool {
        if self.status.started_at.is_some() {
            return false;
        }
        self.status.started_at = Some(Time(self.now));
        self.status.zone = Some(self.facts.zone.clone());
        true
    }

    /// The node's self-isolation promise as it stands now, or why none applies. The
    /// latest report over TLS decides whether a promise stands (a report without one
    /// withdraws it); a fence that recorded one keeps it while the controller cannot
    /// hear the node's agent at all (after a restart). The promise counts from the last
    /// time the controller heard the node on either channel, never from earlier than
    /// what it recorded before.
    fn promise_now(&self) -> Result<PromiseRecord, String> {
        let margin = self.policy.self_isolation_margin;
        if margin.is_zero() {
            return Err(
                "releasing a node on its agent's self-isolation promise is turned off (selfIsolationMargin 0s)"
                    .to_string(),
            );
        }
        // The Lease as this controller hears it: without that (silence detection off,
        // or not leading) the silence cannot be counted at all.
        let Some(lease_heard) = self.facts.lease_heard else {
            return Err(
                "this controller does not hear the node's Lease (silence detection is off)"
                    .to_string(),
            );
        };
        let recorded = self.status.promise.as_ref();
        let (within, boot_id, boot_time, sequence, heard) = match self.facts.liveness {
            Liveness::Heard(channels) => {
                let Some(promise) = channels.promise else {
                    return Err("its agent's last report makes no self-isolation promise (report.isolation.isolateAfter, over TLS)".to_string());
                };
                let within = recorded.map_or(promise.within, |r| {
                    promise.within.max(Duration::from_secs(r.within_seconds))
                });
                (
                    within,
                    promise.boot_id.as_str().to_string(),
                    promise.boot_time,
                    promise.sequence,
                    channels.lease.max(channels.report),
                )
            }
            _ => {
                let Some(recorded) = recorded else {
                    return Err("no agent of the node has reported a self-isolation promise to this controller".to_string());
                };
                (
                    Duration::from_secs(recorded.within_seconds),
                    recorded.boot_id.clone(),
                    recorded.boot_time.0,
                    recorded.sequence,
                    recorded.last_heard.0,
                )
            }
        };
        // A promise holds for the boot that made it: a node that booted again runs
        // whatever its new kubelet starts, and only a new promise covers that.
        match self.facts.boot_id.as_deref() {
            Some(current) if !boot_id.is_empty() && current == boot_id => {}
            current => {
                return Err(format!(
                    "its agent's self-isolation promise was made by boot {boot_id:?}, and the node's kubelet last reported boot {}",
                    current.map_or_else(|| "(none)".to_string(), |id| format!("{id:?}"))
                ));
            }
        }
        // Whole seconds, rounded up, as the status keeps them: a record read back is
        // the record written, and never earlier.
        let last_heard = ceil_second(
            [
                Some(heard),
                recorded.map(|r| r.last_heard.0),
                Some(lease_heard),
            ]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(heard),
        );
        // Whole seconds, rounded up, at most a day: the record never shortens the
        // promise, and a hand-edited one cannot overflow the clock.
        let within = Duration::from_secs(within.as_secs() + u64::from(within.subsec_nanos() > 0))
            .min(crate::report::protocol::MAX_PROMISE);
        Ok(PromiseRecord {
            within_seconds: within.as_secs(),
            boot_id,
            boot_time: Time(boot_time),
            sequence,
            last_heard: Time(last_heard),
            release_at: Time(release_time(last_heard, within, margin)),
        })
    }

    /// A lost node with no fence device whose agent promised to isolate (or reset) it by
    /// itself: its pods are released once the promise has run out, with the margin. The
    /// storm guard and the zone rate hold the release back like any other.
    fn wait_on_promise(&mut self, record: PromiseRecord) -> bool {
        let release_at = record.release_at.0;
        let message = format!(
            "the node has no fence device; its agent promised (report {} of the boot that began at {}) that no pod process runs later than {}s after it last heard from the controller, and it was last heard at {}: its pods are released at {release_at} ({}s of selfIsolationMargin included) unless it is heard again",
            record.sequence,
            record.boot_time.0,
            record.within_seconds,
            record.last_heard.0,
            self.policy.self_isolation_margin.as_secs()
        );
        self.status.promise = Some(record.clone());
        if self.now < release_at {
            self.pause(
                PauseReason::WaitingForSelfIsolation,
                message,
                Some(release_at),
            );
            return false;
        }
        if self.held_by_guard() {
            return false;
        }
        // The Lease read afresh must show the renewal the silence was counted from.
        match self.facts.lease_unchanged {
            Some(true) => {}
            Some(false) => {
                // A renewal the Lease watch has not delivered: the node was heard, now
                // at the latest. Counted again from here.
                let mut heard = record;
                let now = ceil_second(self.now);
                heard.last_heard = Time(now);
                heard.release_at = Time(release_time(
                    now,
                    Duration::from_secs(heard.within_seconds),
                    self.policy.self_isolation_margin,
                ));
                let until = heard.release_at.0;
                self.status.promise = Some(heard);
                self.pause(
                    PauseReason::WaitingForSelfIsolation,
                    "the node's Lease, read afresh, shows a renewal this controller's Lease watch had not delivered: the node was heard, and its promise counts again from now".to_string(),
                    Some(until),
                );
                return false;
            }
            None => {
                self.pause(
                    PauseReason::WaitingForSelfIsolation,
                    "the node's Lease cannot be read afresh to confirm its silence; nothing is released on its promise until it can".to_string(),
                    None,
                );
                self.wake(self.now + LEASE_CHECK_RETRY);
                return false;
            }
        }
        let (evidence, since) = match self.state {
            NodeState::Lost {
                evidence, since, ..
            } => (evidence, since),
            _ => (Evidence::Silence, record.last_heard.0),
        };
        let silent =
            Duration::try_from(self.now.duration_since(record.last_heard.0)).unwrap_or_default();
        let proof = format!(
            "{PROMISE_PROOF} the node's agent promised (report {} of the boot that began at {}), backed by its watchdog, that no pod process runs later than {}s after it last heard from the controller, and the node has not been heard for {}s",
            record.sequence,
            record.boot_time.0,
            record.within_seconds,
            silent.as_secs()
        );
        self.start_without_step(evidence, since);
        self.confirm_without_step(
            proof,
            "self-isolation promise kept: released without a power fence",
            "SelfIsolationPromiseRanOut",
            "its pods are released without a power fence",
        );
        false
    }

    /// A fence released on the node's self-isolation promise: it ends when the node is
    /// back (nothing was done to it). A node heard again isolated by its agent is told
    /// to end the isolation once it reaches the API server (see
    /// [`Self::end_isolation_when_released`]).
    fn settle_promise(&mut self) -> bool {
        if self.back_to_recovery("its self-isolation") {
            return true;
        }
        if matches!(self.facts.liveness, Liveness::Heard(_)) {
            // Its reports say when to end the isolation; nothing else wakes the fence.
            self.wake(self.now + 2 * ISOLATION_REQUEUE);
        }
        if self.is_held() {
            self.pause_held();
        }
        false
    }

    /// A drained fence after its release: it ends when the node is back (there is
    /// nothing to recover: nothing was done to it). A node heard again without being
    /// Ready is not dead after all; what was released stays released (every pod had
    /// stopped), and the fence waits.
    fn settle_drained(&mut self) -> bool {
        if self.back_to_recovery("its drain") {
            return true;
        }
        if self.is_held() {
            self.pause_held();
        }
        false
    }

    /// A node released without a step (drained, or isolated by its agent) is back: heard
    /// healthy by its own channels, or Ready again since the release. A node that just
    /// powered off still reads Ready for the 40-50 s the node lifecycle controller takes,
    /// and a controller restarted in that time has not heard it yet.
    fn back_since_release(&self) -> bool {
        let ready_again = self
            .status
            .confirmed_at
            .as_ref()
            .is_some_and(|confirmed| self.ready_since(confirmed.0));
        self.heard_healthy() || ready_again
    }

    /// The node has read Ready since after `moment`: its kubelet posted its status since
    /// then (the Ready condition lags behind a death, but not behind a return).
    fn ready_since(&self, moment: Timestamp) -> bool {
        self.state.is_healthy() && self.facts.health.since.is_some_and(|since| since > moment)
    }

    /// A fence released without a step of its own, whose node is back (see
    /// [`Self::back_since_release`]): straight to recovery's end, with no recovery method,
    /// since no fence device did anything to the node. `true` when it went there.
    fn back_to_recovery(&mut self, after: &str) -> bool {
        if !self.back_since_release() {
            return false;
        }
        self.set_phase(FenceStep::Recovery, FencePhase::Done);
        self.event(
            false,
            "RecoveryStarted",
            format!(
                "{} again after {after}; no fence device acted on it, so no recovery method runs",
                self.healthy_now()
            ),
        );
        true
    }

    /// Since when the node's agent has said it reaches the API server (over TLS only).
    fn api_reachable_since(&self) -> Option<Timestamp> {
        match self.facts.liveness {
            Liveness::Heard(channels) => channels.api_reachable_since,
            _ => None,
        }
    }

    /// What the node's agent last said about its isolation (over TLS only).
    fn isolation_heard(&self) -> Option<IsolationHeard> {
        match self.facts.liveness {
            Liveness::Heard(channels) => channels.isolation,
            _ => None,
        }
    }

    /// A partitioned node (see [`NodeState::Partitioned`]): its agent is asked to isolate
    /// it. The storm guard and the zone rate hold the request back like a power action.
    fn request_isolation(&mut self, since: Timestamp) -> bool {
        if self.held_by_guard() {
            return false;
        }
        self.start_without_step(Evidence::Partitioned, since);
        // Heard again, the node is isolated on request; a promise it made before is moot.
        self.status.promise = None;
        self.status.self_isolation = Some(SelfIsolation {
            requested_at: Time(self.now),
            outcome: None,
            decided_at: None,
        });
        self.event(
            true,
            "IsolationRequested",
            format!(
                "the node is not Ready and its Lease has been silent since {since}, but its agent still reports: it is cut off from the API server, not dead. Its agent is asked to stop the kubelet and kill every pod process; without its report of that within {}s the fence falls back to its configured steps",
                self.policy.isolation_timeout.as_secs()
            ),
        );
        true
    }

    /// A fence that asked the node's agent to isolate the node: wait for the agent's
    /// answer to this request (at most `isolationTimeout` of hearing the node), then rest
    /// on it, or give it up.
    fn settle_isolation(&mut self) -> bool {
        let Some(isolation) = self.status.self_isolation.clone() else {
            return false;
        };
        let heard = self.isolation_heard();
        if isolation.outcome == Some(IsolationOutcome::Confirmed) {
            return self.rest_on_isolation(heard);
        }
        if self.heard_healthy() || self.ready_since(isolation.requested_at.0) {
            // The partition healed first: the kubelet runs, so the node is not isolated,
            // or no longer. Whatever the agent began is ended.
            self.instructions.push(Instruction::EndIsolation);
            let ended = heard.is_none_or(|h| {
                matches!(
                    h.state,
                    IsolationState::None | IsolationState::Refused | IsolationState::Unknown
                )
            });
            if ended {
                return self.end_fence(
                    "FenceCancelled",
                    format!(
                        "{} again before its isolation was confirmed",
                        self.healthy_now()
                    ),
                );
            }
            self.pause(
                PauseReason::NodeAlive,
                "the node is back before its isolation was confirmed; its agent is asked to end it"
                    .to_string(),
                None,
            );
            return false;
        }
        // The storm guard wins: during a storm nothing is asked, taken or given up.
        if self.held_by_guard() {
            return false;
        }
        match self.state {
            // The node cannot be heard now (a restarted controller has not heard its
            // agent yet, or has not seen its Lease): nothing is decided, and the wait
            // does not count against the request.
            NodeState::Held { .. } => {
                self.pause_held();
                return false;
            }
            NodeState::Lost { .. } => {
                return self.give_up_isolation(
                    IsolationOutcome::Failed,
                    "the node's agent fell silent before it reported the node isolated",
                );
            }
            // Ready by its condition alone (since before the request), its agent not
            // heard: nothing is asked of a node that reads Ready, and nothing given up.
            NodeState::Healthy => {
                self.pause(
                    PauseReason::NodeAlive,
                    "the node reads Ready, but its agent is not heard: nothing is asked of it until it is".to_string(),
                    None,
                );
                self.wake(self.now + RUNNING_REQUEUE);
                return false;
            }
            NodeState::Partitioned { .. } => {}
        }
        let request = request_id(&isolation);
        // Only an answer to this request counts: a state left from an earlier request
        // (an earlier fence, or before a restart) is not one.
        if let Some(answer) = heard.filter(|heard| heard.request == request) {
            if answer.confirmed && matches!(self.state, NodeState::Partitioned { .. }) {
                return self.confirm_isolation(answer);
            }
            let why = match answer.state {
                IsolationState::Failed => Some("reported that it could not isolate the node"),
                IsolationState::Refused => Some("refused to isolate the node"),
                _ => None,
            };
            if let Some(why) = why {
                return self.give_up_isolation(
                    IsolationOutcome::Failed,
                    &format!("the node's agent {why} (its report says why)"),
                );
            }
        }
        let deadline = isolation.requested_at.0 + self.policy.isolation_timeout;
        if self.now >= deadline {
            return self.give_up_isolation(
                IsolationOutcome::TimedOut,
                &format!(
                    "the node's agent did not report the node isolated within {}s",
                    self.policy.isolation_timeout.as_secs()
                ),
            );
        }
        self.instructions.push(Instruction::Isolate {
            reason: "the node's Lease is silent and it is not Ready, while its agent still reports: it is cut off from the API server".to_string(),
            request,
        });
        self.pause(
            PauseReason::WaitingForIsolation,
            format!("waiting for the node's agent to report the node isolated, until {deadline}"),
            Some(deadline),
        );
        self.wake(self.now + ISOLATION_REQUEUE);
        false
    }

    /// The agent's report shows the node isolated: the fence is confirmed, and the pods
    /// are released with no power action.
    fn confirm_isolation(&mut self, heard: IsolationHeard) -> bool {
        let proof = format!(
            "the node's agent reported (report {}) that the kubelet is stopped and masked and no pod process is left",
            heard.sequence
        );
        self.decide_isolation(IsolationOutcome::Confirmed);
        self.confirm_without_step(
            proof,
            "isolated by its agent: released without a power fence",
            "NodeIsolated",
            "its pods are released without a power fence",
        );
        false
    }

    /// Records how the isolation ended.
    fn decide_isolation(&mut self, outcome: IsolationOutcome) {
        if let Some(isolation) = self.status.self_isolation.as_mut() {
            isolation.outcome = Some(outcome);
            isolation.decided_at = Some(Time(self.now));
        }
    }

    /// The isolation is given up: the fence runs its configured steps (`true`: go on).
    fn give_up_isolation(&mut self, outcome: IsolationOutcome, why: &str) -> bool {
        self.decide_isolation(outcome);
        self.event(
            true,
            match outcome {
                IsolationOutcome::TimedOut => "IsolationTimedOut",
                IsolationOutcome::Broken => "IsolationBroken",
                _ => "IsolationFailed",
            },
            format!("{why}; the fence falls back to its configured steps"),
        );
        true
    }

    /// A node released on its isolation: it ends when the node is back. Once its pods are
    /// released and its agent reaches the API server again, the agent is told to end the
    /// isolation (the kubelet starts, and the node comes back). An isolation that no
    /// longer holds before then falls back to the configured steps.
    fn rest_on_isolation(&mut self, heard: Option<IsolationHeard>) -> bool {
        let facts = self.facts;
        if self.back_to_recovery("its isolation") {
            return true;
        }
        // The agent's reports say when to end it, and no event wakes the fence for them.
        self.wake(self.now + 2 * ISOLATION_REQUEUE);
        let pods_bound = facts.runs_pods_needing_fencing;
        if pods_bound && heard.is_some_and(|h| h.state == IsolationState::Failed) {
            // Released on an isolation that no longer holds: nothing more is released on
            // it, and the configured steps run.
            self.status.confirmed_at = None;
            self.status.confirmed_by = None;
            return self.give_up_isolation(
                IsolationOutcome::Broken,
                "the node's agent reported that the node's isolation no longer holds, while pods that need fencing are still bound to it; nothing more is released until the configured steps confirm a fence",
            );
        }
        false
    }

    /// Once no pod that needs fencing is bound to the node and its agent has reached the
    /// API server again for [`API_REACHABLE_BEFORE_ENDING_ISOLATION`], an isolation the
    /// agent still holds is ended (the kubelet starts):
    /// after a release, or after an isolation that was given up and a fence that followed.
    fn end_isolation_when_released(&mut self) {
        let released_on_promise = self.status.is_released_on_promise();
        if (self.status.self_isolation.is_none() && !released_on_promise)
            || (self.status.is_self_isolating() && !self.status.is_confirmed_isolation())
            || self.facts.runs_pods_needing_fencing
            || self.actions.contains(&Action::DeleteFence)
        {
            return;
        }
        let Some(heard) = self.isolation_heard() else {
            return;
        };
        let holds = matches!(
            heard.state,
            IsolationState::Isolating | IsolationState::Isolated | IsolationState::Failed
        );
        let steadily_reachable = self
            .api_reachable_since()
            .is_some_and(|since| self.now >= since + API_REACHABLE_BEFORE_ENDING_ISOLATION);
        if holds && steadily_reachable && !self.instructions.contains(&Instruction::EndIsolation) {
            self.instructions.push(Instruction::EndIsolation);
        }
    }

    /// The node is healthy and its Lease or agent says so itself (not the Ready
    /// condition alone, which lags behind a node's death).
    fn heard_healthy(&self) -> bool {
        !self.forced && self.state.is_healthy() && matches!(self.facts.liveness, Liveness::Heard(_))
    }

    /// The node is held (alive, or not known yet) and the fence is not forced: what runs
    /// is left to finish and what is proven stays proven, but nothing new is done to a
    /// node that is alive.
    fn is_held(&self) -> bool {
        !self.forced
            && match self.state {
                NodeState::Held { .. } => true,
                // Until its isolation is given up.
                NodeState::Partitioned { .. } => !self.status.isolation_given_up(),
                _ => false,
            }
    }

    /// Pauses the fence with the hold's reason, message and end.
    fn pause_held(&mut self) {
        match &self.state {
            NodeState::Held {
                reason,
                message,
                until,
            } => {
                let (reason, message, until) = (*reason, message.clone(), *until);
                self.pause(reason, message, Some(until));
            }
            NodeState::Partitioned { until, .. } => {
                let until = *until;
                self.pause(
                    PauseReason::NodeAlive,
                    "the node is cut off from the API server but its agent still reports: no power action runs against it".to_string(),
                    Some(until),
                );
            }
            _ => {}
        }
    }

    /// How a person is told the node is healthy.
    fn healthy_now(&self) -> &'static str {
        match self.facts.liveness {
            Liveness::Heard(_) => {
                "the node is Ready and heard from (its Lease or its agent's reports)"
            }
            _ => "the node is Ready",
        }
    }

    /// Whether the node spoke after `at`: its kubelet turned Ready or renewed its Lease,
    /// or its agent reported.
    fn heard_since(&self, at: Timestamp) -> bool {
        let facts = self.facts;
        let ready_since = facts.health.since.filter(|_| facts.health.is_ready());
        let channels = match &facts.liveness {
            Liveness::Heard(channels) => Some(channels.lease.max(channels.report)),
            _ => None,
        };
        [ready_since, channels, facts.lease_heard]
            .into_iter()
            .flatten()
            .any(|then| then > at)
    }

    /// The node's boot, when its kubelet reports the boot it ran when the power step's
    /// last action began and the step confirmed the power off: such a node cannot still
    /// be on it.
    fn boot_that_outlived_the_power_off(&self) -> Option<&'a str> {
        let facts: &'a NodeFacts = self.facts;
        let now = facts.boot_id.as_deref()?;
        (self.status.power_off_boot.as_deref() == Some(now)).then_some(now)
    }

    /// The boot of an agent report that arrived after the power step ended, when it is
    /// the boot the node ran as the step's last action began.
    /// Only while its reports keep coming: a report from the old boot must not hold the
    /// fence once the node rebooted and its new boot's agent does not report.
    fn agent_boot_that_outlived_the_power_off(&self) -> Option<&'a str> {
        let facts: &'a NodeFacts = self.facts;
        let Liveness::Heard(channels) = &facts.liveness else {
            return None;
        };
        let boot = self.fresh_agent_boot()?;
        let recorded = self.status.power_off_boot.as_deref()?;
        (boot.is(recorded) && channels.report > self.phase_since()).then(|| boot.as_str())
    }

    /// The boot the agent's reports come from, while they keep coming (within three of
    /// its report intervals; over TLS only).
    fn fresh_agent_boot(&self) -> Option<&'a BootId> {
        let facts: &'a NodeFacts = self.facts;
        let Liveness::Heard(channels) = &facts.liveness else {
            return None;
        };
        channels
            .boot
            .as_ref()
            .filter(|boot| !boot.as_str().is_empty())
            .filter(|_| self.now < channels.report + channels.reports_fresh_within)
    }

    /// The boot the node runs, as far as the controller knows: its agent's while its
    /// reports keep coming (the agent reads it for every report, and a partitioned
    /// kubelet's status may predate a reboot), else the one its kubelet last reported.
    fn current_boot(&self) -> Option<String> {
        self.fresh_agent_boot()
            .map(|boot| boot.as_str().to_string())
            .or_else(|| self.facts.boot_id.clone())
    }

    /// The power step confirmed the node off, yet `who` (its kubelet or its agent)
    /// speaks from the boot it ran when the power-off began.
    fn power_off_contradicted(&mut self, who: &str, boot: &str) {
        self.pause(
            PauseReason::PowerOffContradicted,
            format!(
                "the power step confirmed the node off, yet {who} reports boot {boot:?}, the one it ran when the power-off began: the power-off did not reach this machine (is the fence device in the node's fence configuration its own?) or its device said off wrongly. Its pods stay released and its taints stay. Stop the node's old pods, then power-cycle or reboot it: on a new boot, recovery runs by itself"
            ),
            None,
        );
    }

    fn enter_recovery(&mut self) -> bool {
        self.status.retries = 0;
        self.set_phase(FenceStep::Recovery, FencePhase::New);
        self.event(
            false,
            "RecoveryStarted",
            "the node is Ready again; running the recovery methods".to_string(),
        );
        true
    }

    /// The current step and its configured alternatives, borrowed from the facts; without
    /// a usable configuration the fence pauses and there are none.
    fn step_alternatives(&mut self) -> Option<(FenceStep, &'a [Vec<MethodOutline>])> {
        let step = self.status.step.unwrap_or(FenceStep::Isolation);
        let facts: &'a NodeFacts = self.facts;
        match &facts.plan {
            Ok(plan) => Some((step, plan.alternatives(step.into()))),
            Err(reason) => {
                self.pause(PauseReason::NoConfiguration, reason.clone(), None);
                None
            }
        }
    }

    /// The node's kdump notifications, when they count (see `kdump.rs`): its fence
    /// configuration says `kdump=true`, the node is lost, they still come (the last
    /// within `kdumpSilence`), and they came after its last
    /// sign of life: all of them after its last Lease renewal and report, or, for a node
    /// without an agent (whose Ready condition is all the controller has), still coming
    /// after it turned `Unknown`.
    fn kdump_notice(&self) -> Option<KdumpHeard> {
        let heard = self.facts.kdump?;
        let configured = self.facts.plan.as_ref().is_ok_and(|plan| plan.kdump);
        // A run that ended before this controller took note of it is no longer news: only
        // notifications still coming count.
        let current = self.now <= heard.last + self.policy.kdump_silence;
        if !configured || !current || !matches!(self.state, NodeState::Lost { .. }) {
            return None;
        }
        let after_last_sign_of_life = match self.facts.liveness {
            Liveness::Heard(channels) => heard.first > channels.lease.max(channels.report),
            // Without an agent, only `Unknown` says the kubelet fell silent (its Lease
            // lapsed); `False` is a kubelet alive enough to say so.
            Liveness::NoAgent => {
                self.facts.health.readiness == Readiness::Unknown
                    && self
                        .facts
                        .health
                        .since
                        .is_some_and(|since| heard.last > since)
            }
            Liveness::AgentUnknown { .. } => false,
        };
        after_last_sign_of_life.then_some(heard)
    }

    /// A begun fence whose node announces its crash kernel: the announcement confirms the
    /// fence (a node running its crash kernel runs no pod), and is kept in the status,
    /// where later notifications move its last time, so the power step waits for the
    /// dump (see [`Self::waiting_for_kdump`]), also across a controller restart. The
    /// storm guard and the zone rate hold it back like any other release.
    fn note_kdump(&mut self) {
        let begun = self
            .status
            .step
            .is_some_and(|step| step != FenceStep::Recovery);
        if !begun || self.status.recovered_at.is_some() || !self.facts.exists {
            return;
        }
        // Later notifications from the node's address move the last time of a dump
        // already taken note of, whatever the node is judged now (a restarted controller
        // that has not heard its agent yet must not end the wait early).
        if let Some(record) = self.status.kdump.as_mut() {
            if let Some(heard) = self.facts.kdump
                && heard.last > record.last_heard.0
            {
                record.last_heard = Time(heard.last);
                record.notifications = record.notifications.max(heard.notifications);
            }
            return;
        }
        // An excluded node is never fenced, so nothing is released for it either.
        if self.facts.excluded {
            return;
        }
        let Some(heard) = self.kdump_notice() else {
            return;
        };
        if self.held_by_guard() {
            return;
        }
        let from = heard.from.to_string();
        self.status.kdump = Some(KdumpRecord {
            from: from.clone(),
            first_heard: Time(heard.first),
            last_heard: Time(heard.last),
            notifications: heard.notifications,
        });
        self.count_as_started();
        let proof = format!(
            "kdump: the node announced its crash kernel from its InternalIP {from} ({} notification(s) since {}, all after its last sign of life)",
            heard.notifications, heard.first
        );
        if self.status.confirmed_at.is_none() {
            let message = format!(
                "{proof}: it runs no pod, so its pods may be released; its power step waits for the dump"
            );
            self.confirm(proof, "FenceConfirmed", message);
        } else {
            self.event(
                false,
                "KdumpHeard",
                format!("{proof}: its power step waits for the dump"),
            );
        }
    }

    /// The power step waits while the node dumps: until its notifications have stopped
    /// for `kdumpSilence`, and at most `kdumpWait` after the first one. The latest
    /// notifications are taken note of first.
    fn waiting_for_kdump(&mut self) -> bool {
        self.note_kdump();
        let Some(record) = &self.status.kdump else {
            return false;
        };
        // A controller that started listening after the last notification it knows of
        // (a restart, a new leader) has not had `kdumpSilence` to hear the next one yet.
        let heard_or_listening = match self.facts.kdump_listening_since {
            Some(since) => record.last_heard.0.max(since),
            None => record.last_heard.0,
        };
        let dumping_until = heard_or_listening + self.policy.kdump_silence;
        let wait_until = record.first_heard.0 + self.policy.kdump_wait;
        let until = dumping_until.min(wait_until);
        if self.now >= until {
            return false;
        }
        let message = format!(
            "the node runs its crash kernel (kdump notifications from {} since {}, the latest at {}): the power step waits for the dump, until no notification came for {}s, at most until {wait_until}",
            record.from,
            record.first_heard.0,
            record.last_heard.0,
            self.policy.kdump_silence.as_secs()
        );
        self.pause(PauseReason::WaitingForKdump, message, Some(until));
        true
    }

    /// Phase New of any step: the guard, the backoff, then the first method.
    fn start_step(&mut self) -> bool {
        let Some((step, alternatives)) = self.step_alternatives() else {
            return false;
        };
        if alternatives.is_empty() {
            // Nothing configured for this step: it is trivially done (an unconfigured
            // step proves nothing, so nothing is confirmed).
            self.set_phase(step, FencePhase::Done);
            return true;
        }
        if self.status.retries > 0 {
            let at = self.phase_since() + self.policy.backoff(self.status.retries);
            if at > self.now {
                self.pause(
                    PauseReason::RetryBackoff,
                    format!(
                        "retry {} of the {step} step starts at {at}",
                        self.status.retries
                    ),
                    Some(at),
                );
                return false;
            }
        }
        if step != FenceStep::Recovery && self.held_by_guard() {
            return false;
        }
        if step == FenceStep::PowerManagement && self.waiting_for_kdump() {
            return false;
        }
        self.set_phase(step, FencePhase::Running);
        self.event(
            false,
            "StepStarted",
            format!("{step} step, attempt {}", self.attempt()),
        );
        self.continue_step()
    }

    /// Phase Running with nothing in flight: the next method, or the step's end.
    fn continue_step(&mut self) -> bool {
        let Some((step, alternatives)) = self.step_alternatives() else {
            return false;
        };
        let attempt = self.attempt();
        let runs: Vec<&Execution> = self
            .status
            .executions
            .iter()
            .filter(|e| e.step == step && e.attempt == attempt)
            .collect();
        match progress(alternatives, &runs) {
            Progress::Next {
                alternative,
                method,
                kind,
            } => {
                let count = runs
                    .iter()
                    .filter(|e| {
                        e.alternative == alternative && e.method == method.name && e.kind == kind
                    })
                    .count();
                if step != FenceStep::Recovery && kind == ExecutionKind::Act {
                    if let Some(block) = &self.guard.storm {
                        self.block(block);
                        return false;
                    }
                    if self.is_held() {
                        self.pause_held();
                        return false;
                    }
                    if self.heard_healthy() && self.status.started_at.is_some() {
                        // Its own channels say the node is back: no more power actions,
                        // whatever this step still had to do.
                        return self.enter_recovery();
                    }
                    // Nor while it dumps, whichever alternative is next.
                    if step == FenceStep::PowerManagement && self.waiting_for_kdump() {
                        return false;
                    }
                }
                let kind_name = match kind {
                    ExecutionKind::Act => "act",
                    ExecutionKind::Verify => "verify",
                };
                let name = format!(
                    "{}-t{attempt}-a{alternative}-{}-{kind_name}{}",
                    Step::from(step).name(),
                    method.name,
                    count + 1
                );
                let action = match kind {
                    ExecutionKind::Act => MethodAction::from(method.action),
                    ExecutionKind::Verify => MethodAction::Status,
                };
                if step == FenceStep::PowerManagement && kind == ExecutionKind::Act {
                    // The boot a node this action powers off can no longer be on.
                    self.status.power_off_boot = self.current_boot();
                }
                if self.count_as_started() {
                    self.event(
                        true,
                        "FenceStarted",
                        format!("fencing the node: {step} step, method {}", method.name),
                    );
                }
                self.status.executions.push(Execution {
                    name: name.clone(),
                    step,
                    attempt,
                    alternative,
                    method: method.name.clone(),
                    agent: method.agent.clone(),
                    kind,
                    action,
                    started_at: Time(self.now),
                    finished_at: None,
                    result: None,
                    off_confirmed: false,
                    power: None,
                    detail: None,
                });
                self.actions.push(Action::Start(ExecutionRequest {
                    name,
                    step: step.into(),
                    attempt,
                    alternative,
                    method: method.name,
                    kind,
                }));
                false
            }
            Progress::Succeeded {
                alternative,
                confirmed,
                methods,
            } => {
                self.set_phase(step, FencePhase::Done);
                self.event(
                    false,
                    "StepSucceeded",
                    format!(
                        "{step} step: alternative {alternative} ({}) succeeded",
                        methods.join(", ")
                    ),
                );
                if step == FenceStep::PowerManagement && !confirmed {
                    // Something of the node may still have power (an optional second
                    // supply whose outlet failed): it may run on, on the same boot.
                    self.status.power_off_boot = None;
                }
                if confirmed && step != FenceStep::Recovery && self.status.confirmed_at.is_none() {
                    let methods = methods.join(", ");
                    self.confirm(
                        format!("{step} step, attempt {attempt}, alternative {alternative}: {methods}"),
                        "FenceConfirmed",
                        format!("{step} step proved the node fenced ({methods}); its pods may be released"),
                    );
                }
                true
            }
            Progress::Failed => {
                self.set_phase(step, FencePhase::Error);
                self.event(
                    true,
                    "StepFailed",
                    format!("{step} step, attempt {attempt}: every alternative failed"),
                );
                true
            }
        }
    }

    fn retry_or_fail(&mut self, step: FenceStep) -> bool {
        if self.status.retries < self.policy.retry_limit {
            self.status.retries += 1;
            self.set_phase(step, FencePhase::New);
            let at = self.now + self.policy.backoff(self.status.retries);
            self.event(
                true,
                "RetryScheduled",
                format!(
                    "{step} step: retry {} of {} at {at}",
                    self.status.retries, self.policy.retry_limit
                ),
            );
            return true;
        }
        let already = self
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == "Failed" && c.status == "True");
        if !already {
            self.event(
                true,
                "FenceFailed",
                format!(
                    "{step} step failed {} time(s); nothing more is tried until an operator acts (delete the NodeFence to start over)",
                    self.status.retries + 1
                ),
            );
        }
        false
    }

    /// Level-based: taints and releases as the status says they should be, compared with
    /// what the node carries now, so a lost write is simply made again.
    fn release_and_taints(&mut self) {
        let facts = self.facts;
        if !facts.exists {
            return;
        }
        let status = &self.status;
        let active = status.started_at.is_some() && status.recovered_at.is_none();
        // Once recovery starts nothing more is released: the node is coming back.
        let confirmed = status.confirmed_at.is_some()
            && status.recovered_at.is_none()
            && status.step != Some(FenceStep::Recovery);
        if active && !facts.taints.remediation {
            self.actions
                .push(Action::Taint(TaintChange::AddRemediation));
        }
        if status.recovered_at.is_some() && facts.taints.remediation {
            self.actions
                .push(Action::Taint(TaintChange::RemoveRemediation));
        }
        if confirmed && self.policy.out_of_service_taint && !facts.taints.out_of_service {
            self.actions
                .push(Action::Taint(TaintChange::AddOutOfService));
            if self.status.out_of_service_at.is_none() {
                self.status.out_of_service_at = Some(Time(self.now));
                self.event(
                    false,
                    "OutOfServiceTaintAdded",
                    "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute: Kubernetes force-deletes the node's pods and detaches their volumes".to_string(),
                );
            }
        }
        if self.status.recovered_at.is_some()
            && self.status.out_of_service_at.is_some()
            && facts.taints.out_of_service
        {
            self.actions
                .push(Action::Taint(TaintChange::RemoveOutOfService));
        }
        if confirmed
            && self.policy.delete_pods
            && facts.pods_to_release > 0
            && !self.state.is_healthy()
        {
            self.actions.push(Action::DeletePods);
            if self.status.pods_deleted_at.is_none() {
                self.status.pods_deleted_at = Some(Time(self.now));
                self.event(
                    false,
                    "PodsDeleted",
                    format!("deleting the node's {} pod(s)", facts.pods_to_release),
                );
            }
        }
    }

    fn finish(mut self, generation: Option<i64>) -> Decision {
        let now = self.now;
        // The pause, with its own start kept while the reason stays the same.
        let previous = self.status.pause.take();
        let deleting = self.actions.contains(&Action::DeleteFence);
        self.status.pause = match self.pause.take() {
            Some((reason, message, until)) if !deleting => {
                let since = match &previous {
                    Some(p) if p.reason == reason => p.since.clone(),
                    _ => Time(now),
                };
                if previous.as_ref().map(|p| p.reason) != Some(reason) {
                    self.event(
                        reason_is_warning(reason),
                        "FencePaused",
                        format!("{reason:?}: {message}"),
                    );
                }
                Some(Pause {
                    reason,
                    message,
                    since,
                    until: until.map(Time),
                })
            }
            _ => None,
        };
        if self.status.phase.is_none() && self.status.step.is_none() {
            self.status.phase = Some(FencePhase::New);
        }
        let failed = self.status.phase == Some(FencePhase::Error)
            && self.status.retries >= self.policy.retry_limit;
        let paused = self.status.pause.clone();
        let confirmed = self.status.confirmed_at.is_some();
        let confirmed_by = self.status.confirmed_by.clone().unwrap_or_default();
        let conditions = &mut self.status.conditions;
        set_condition(
            conditions,
            "Paused",
            paused.is_some(),
            paused
                .as_ref()
                .map_or("NotPaused".to_string(), |p| format!("{:?}", p.reason)),
            paused.as_ref().map_or(String::new(), |p| p.message.clone()),
            generation,
            now,
        );
        set_condition(
            conditions,
            "Confirmed",
            confirmed,
            if confirmed {
                "FenceConfirmed"
            } else {
                "NotConfirmed"
            }
            .to_string(),
            confirmed_by,
            generation,
            now,
        );
        set_condition(
            conditions,
            "Failed",
            failed,
            if failed {
                "RetriesExhausted"
            } else {
                "NotFailed"
            }
            .to_string(),
            if failed {
                format!(
                    "the {} step failed after {} retries",
                    self.status.step.map(|s| s.to_string()).unwrap_or_default(),
                    self.status.retries
                )
            } else {
                String::new()
            },
            generation,
            now,
        );
        prune_executions(&mut self.status);
        let running = self.status.executions.iter().any(|e| !e.is_finished());
        let mut requeue = if running {
            RUNNING_REQUEUE
        } else {
            IDLE_REQUEUE
        };
        if let Some(at) = self.wake_at
            && at > now
        {
            let wait = Duration::try_from(at.duration_since(now)).unwrap_or(Duration::ZERO);
            requeue = requeue.min(wait.max(Duration::from_millis(100)));
        }
        let instructions = if deleting {
            Vec::new()
        } else {
            self.instructions
        };
        Decision {
            status: self.status,
            actions: self.actions,
            events: self.events,
            instructions,
            requeue_after: requeue,
        }
    }
}

fn reason_is_warning(reason: PauseReason) -> bool {
    matches!(
        reason,
        PauseReason::StormGuard
            | PauseReason::DrainContradicted
            | PauseReason::StormCooldown
            | PauseReason::ZoneRateLimit
            | PauseReason::NoConfiguration
            | PauseReason::NameMismatch
            | PauseReason::PowerOffContradicted
    )
}

/// Sets a condition, keeping its `lastTransitionTime` while its status stays the same.
fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: String,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) {
    let status = if status { "True" } else { "False" }.to_string();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(condition) => {
            if condition.status != status {
                condition.last_transition_time = Time(now);
            }
            condition.status = status;
            condition.reason = reason;
            condition.message = message;
            condition.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_string(),
            status,
            reason,
            message,
            observed_generation: generation,
            last_transition_time: Time(now),
        }),
    }
}

/// Drops the oldest finished executions of earlier steps or attempts beyond
/// [`MAX_EXECUTIONS`]; the current attempt's are always kept, since progress is read
/// from them.
fn prune_executions(status: &mut NodeFenceStatus) {
    let excess = status.executions.len().saturating_sub(MAX_EXECUTIONS);
    if excess == 0 {
        return;
    }
    let current = (status.step, status.retries + 1);
    let mut dropped = 0;
    status.executions.retain(|e| {
        let removable = dropped < excess && e.is_finished() && (Some(e.step), e.attempt) != current;
        if removable {
            dropped += 1;
        }
        !removable
    });
}
