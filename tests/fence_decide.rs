//! The fence state machine, driven through a simulated world: a node whose health we
//! set, fence devices that really change state (a storage port and a power supply), an
//! executor that runs one method at a time and can be lost with the controller, and the
//! storm guard's word. Scenario tests walk the documented flows; property tests throw
//! arbitrary sequences of health changes, agent failures, storms and controller restarts
//! at it and check the safety rules on every decision, against the devices' real state.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use nodekeeper::controller::decide::{
    Action, Decision, ExecutionReport, Outcome, ReportedState, TaintChange, decide,
};
use nodekeeper::controller::facts::{
    MethodOutline, NodeFacts, NodeHealth, NodeTaints, PlanOutline, Readiness,
};
use nodekeeper::controller::kdump::KdumpHeard;
use nodekeeper::controller::liveness::{Channels, Evidence, Liveness, NodeState, judge};
use nodekeeper::controller::policy::FencePolicy;
use nodekeeper::controller::resource::{
    ExecutionKind, ExecutionResult, FencePhase, FenceStep, IsolationOutcome, NodeFence,
    NodeFenceSpec, PauseReason, PowerSeen,
};
use nodekeeper::controller::storm::{Guard, GuardBlock};
use nodekeeper::fencing::{FenceAction, Step};
use nodekeeper::report::ledger::{BootId, DrainedStatement, IsolationHeard, PromiseHeard};
use nodekeeper::report::protocol::{Instruction, IsolationState};
use proptest::prelude::*;

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).expect("in range")
}

fn method(name: &str, action: FenceAction) -> MethodOutline {
    MethodOutline {
        name: name.to_string(),
        agent: if name.starts_with("scsi") {
            "fence_scsi"
        } else {
            "fence_ipmilan"
        }
        .to_string(),
        action,
        must_succeed: true,
    }
}

/// The storm guard's block, saying `message`.
fn storm(message: &str) -> GuardBlock {
    GuardBlock {
        reason: PauseReason::StormGuard,
        message: message.to_string(),
        until: None,
    }
}

/// Isolation cuts the storage port, power management powers off, recovery re-enables
/// the port: the original design's example.
fn full_plan() -> PlanOutline {
    let mut plan = PlanOutline::default();
    plan.steps.insert(
        Step::Isolation,
        vec![vec![method("scsi", FenceAction::Off)]],
    );
    plan.steps.insert(
        Step::PowerManagement,
        vec![
            vec![method("ipmi", FenceAction::Off)],
            vec![method("ipmi-backup", FenceAction::Off)],
        ],
    );
    plan.steps.insert(
        Step::Recovery,
        vec![vec![method("scsi-on", FenceAction::On)]],
    );
    plan
}

/// What an agent run does to its device and reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Works,
    /// Exits non-zero; the device is untouched.
    Fails,
    /// Hits the deadline; whether the device acted is the bool.
    TimesOut(bool),
    /// Reports success but `status` never sees the device change (unconfirmed).
    Unconfirmed,
}

/// The devices: `true` means on (power on, storage port enabled).
#[derive(Debug, Clone)]
struct Devices {
    storage_on: bool,
    power_on: bool,
}

impl Devices {
    fn fenced(&self) -> bool {
        !self.storage_on || !self.power_on
    }

    fn device_of(&mut self, method: &str) -> &mut bool {
        if method.starts_with("scsi") {
            &mut self.storage_on
        } else {
            &mut self.power_on
        }
    }
}

struct Running {
    name: String,
    method: String,
    kind: ExecutionKind,
    fate: Fate,
}

struct World {
    fence: Option<NodeFence>,
    facts: NodeFacts,
    plan: PlanOutline,
    devices: Devices,
    running: Option<Running>,
    finished: Vec<ExecutionReport>,
    now: Timestamp,
    policy: FencePolicy,
    guard: Guard,
    fates: Vec<Fate>,
    /// Every decision, in order.
    log: Vec<Decision>,
    restarts: usize,
    power_offs: usize,
    /// For a node with an agent: whether its kubelet renews the Lease and its agent
    /// reports (only while the power is on); `None` for a node without one.
    channels: Option<(bool, bool)>,
    /// The agent's last report said the node drained cleanly; the node then powered
    /// itself off.
    drained: Option<DrainedStatement>,
    /// What the node's agent does when asked to isolate the node.
    isolation_fate: IsolationFate,
    /// The agent isolated the node: the kubelet is stopped and no pod process runs.
    isolated: bool,
    /// What the agent last said about its isolation.
    isolation_state: IsolationState,
    /// A report's sequence, growing.
    sequence: u64,
    /// The request the agent's isolation state answers.
    isolation_request: u64,
    /// Since when the agent's reports have said it reaches the API server.
    api_reachable_since: Option<Timestamp>,
    /// Reports come over TLS, so what they say counts and instructions are given.
    over_tls: bool,
    /// The node crashed into its crash kernel (it runs no pod) until it is powered off.
    in_crash_kernel: bool,
    /// The node crashed and has not been powered on since: it runs no pod, though the
    /// controller may hear its last notifications after a power-off it cannot confirm.
    crashed: bool,
    /// The power device the plan names is another machine's: switching it off leaves
    /// this node running.
    power_device_of_another: bool,
    /// Its crash kernel's kdump notifications: the first one, and whether they still come.
    kdump_first: Option<Timestamp>,
    kdump_sending: bool,
    kdump_last: Option<Timestamp>,
    /// The agent's self-isolation promise, as its reports make it now (`None`: none).
    promise: Option<Duration>,
    /// The promise the controller last heard; the agent keeps it (its watchdog stays
    /// armed until the controller hears it withdrawn).
    promise_heard: Option<(Duration, u32)>,
    /// When one of the node's channels last spoke (the agent's last contact), whatever
    /// the controller made of it.
    last_spoke: Option<Timestamp>,
    /// When the controller last heard the Lease and the reports (long ago at first).
    heard_at: (Timestamp, Timestamp),
    /// The Lease's last renewal in truth (its watch may not have delivered it).
    true_lease: Timestamp,
    /// The controller's Lease watch delivers nothing.
    watch_stalled: bool,
    /// The node's boot, as its kubelet reports it.
    boot: u32,
    /// The boot the agent's last report came from.
    report_boot: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IsolationFate {
    Works,
    Fails,
    /// Says nothing of it (an old agent, or one stuck).
    Silent,
}

impl World {
    fn new(plan: PlanOutline, force: bool) -> World {
        let fence = NodeFence {
            metadata: ObjectMeta {
                name: Some("worker-1".to_string()),
                generation: Some(1),
                ..ObjectMeta::default()
            },
            spec: NodeFenceSpec {
                node_name: "worker-1".to_string(),
                force,
            },
            status: None,
        };
        World {
            fence: Some(fence),
            facts: NodeFacts {
                exists: true,
                health: NodeHealth {
                    readiness: Readiness::Unknown,
                    since: Some(at(0)),
                },
                liveness: Liveness::NoAgent,
                zone: String::new(),
                excluded: false,
                runs_pods_needing_fencing: true,
                pods_to_release: 1,
                volumes_attached: 0,
                taints: NodeTaints::default(),
                plan: Ok(plan.clone()),
                kdump: None,
                kdump_listening_since: Some(at(0)),
                lease_heard: None,
                boot_id: Some("boot-1".to_string()),
                lease_unchanged: Some(true),
            },
            plan,
            devices: Devices {
                storage_on: true,
                power_on: true,
            },
            running: None,
            finished: Vec::new(),
            now: at(0),
            policy: FencePolicy::default(),
            guard: Guard::open(),
            fates: Vec::new(),
            log: Vec::new(),
            restarts: 0,
            power_offs: 0,
            channels: None,
            drained: None,
            isolation_fate: IsolationFate::Works,
            isolated: false,
            isolation_state: IsolationState::None,
            sequence: 0,
            isolation_request: 0,
            api_reachable_since: None,
            over_tls: true,
            in_crash_kernel: false,
            crashed: false,
            power_device_of_another: false,
            kdump_first: None,
            kdump_sending: false,
            kdump_last: None,
            promise: None,
            promise_heard: None,
            last_spoke: None,
            heard_at: (at(-10_000), at(-10_000)),
            true_lease: at(-10_000),
            watch_stalled: false,
            boot: 1,
            report_boot: None,
        }
    }

    /// The agent keeps the promise the controller heard: cut off from both channels for
    /// that long, the node runs no pod (isolated by its agent, or reset).
    fn keep_promise(&mut self) {
        let power = self.devices.power_on && !self.in_crash_kernel;
        if power && !self.isolated && self.promise_ran_out() {
            self.isolated = true;
            self.isolation_state = IsolationState::Isolated;
            // An isolation the agent began itself answers no request.
            self.isolation_request = 0;
            self.hear();
        }
    }

    /// The promise the controller heard has run out since the node was last heard, and
    /// the boot that made it is the node's (a new boot's agent keeps no earlier promise).
    fn promise_ran_out(&self) -> bool {
        self.promise_heard
            .zip(self.last_spoke)
            .is_some_and(|((within, boot), spoke)| boot == self.boot && self.now >= spoke + within)
    }

    /// The node boots again: its kubelet starts anew (and runs its pods again if it
    /// reaches the API server), its agent has promised nothing yet in this boot.
    fn reboot(&mut self) {
        // (A crashed node's way back is its power cycle, modelled with kdump.)
        if !self.devices.power_on || self.crashed {
            return;
        }
        self.boot += 1;
        self.facts.boot_id = Some(format!("boot-{}", self.boot));
        self.isolated = false;
        self.isolation_state = IsolationState::None;
        self.last_spoke = None;
        self.hear();
    }

    /// Someone powers the node on: it boots afresh, and its kubelet reports the new boot.
    fn power_on_by_hand(&mut self) {
        self.devices.power_on = true;
        self.crashed = false;
        self.boot += 1;
        self.facts.boot_id = Some(format!("boot-{}", self.boot));
    }

    /// The node's kernel crashes: its kubelet and agent stop at once, and a few seconds
    /// later its crash kernel starts sending kdump notifications (`fence_kdump_send`).
    fn crash(&mut self) {
        if !self.devices.power_on || self.in_crash_kernel {
            return;
        }
        self.in_crash_kernel = true;
        self.crashed = true;
        // (The node lifecycle controller notices within its grace period.)
        self.set_ready(false);
        self.kdump_first = Some(self.now + Duration::from_secs(5));
        self.kdump_sending = true;
        self.hear();
    }

    /// What the controller heard of the crash kernel's notifications by now.
    fn hear_kdump(&mut self) {
        if let Some(first) = self.kdump_first
            && self.kdump_sending
            && self.in_crash_kernel
            && self.devices.power_on
            && self.now >= first
        {
            self.kdump_last = Some(self.now);
        }
        self.facts.kdump = self
            .kdump_first
            .zip(self.kdump_last)
            .map(|(first, last)| KdumpHeard {
                from: "10.0.0.1".parse().expect("address"),
                first,
                last,
                notifications: 1 + u64::try_from(last.duration_since(first).as_secs() / 10)
                    .unwrap_or(0),
            });
    }

    fn status_opt(&self) -> Option<&nodekeeper::controller::NodeFenceStatus> {
        self.fence.as_ref().and_then(|f| f.status.as_ref())
    }

    fn status(&self) -> &nodekeeper::controller::NodeFenceStatus {
        self.fence
            .as_ref()
            .and_then(|f| f.status.as_ref())
            .expect("the fence has a status")
    }

    fn set_ready(&mut self, ready: bool) {
        // A powered-off or crashed node cannot report Ready.
        let powered = self.devices.power_on || self.power_device_of_another;
        let ready = ready && powered && !self.in_crash_kernel;
        let readiness = if ready {
            Readiness::Ready
        } else {
            Readiness::Unknown
        };
        if self.facts.health.readiness != readiness {
            self.facts.health = NodeHealth {
                readiness,
                since: Some(self.now),
            };
        }
    }

    /// The node gets an agent (or loses it) and its channels speak or fall silent; what
    /// speaks is heard now.
    fn set_channels(&mut self, channels: Option<(bool, bool)>) {
        self.channels = channels;
        self.hear();
    }

    /// The machine runs: its power is on (or the device the plan names is another
    /// machine's) and it is not in its crash kernel.
    fn has_power(&self) -> bool {
        (self.devices.power_on || self.power_device_of_another) && !self.in_crash_kernel
    }

    /// Hears whatever channel speaks at `now`; a node without power says nothing.
    fn hear(&mut self) {
        self.hear_kdump();
        let Some((lease_speaks, reports_speak)) = self.channels else {
            self.facts.liveness = Liveness::NoAgent;
            return;
        };
        let power = self.has_power();
        if reports_speak && power {
            self.promise_heard = self.promise.map(|within| (within, self.boot));
            self.report_boot = Some(self.boot);
        }
        // The kubelet renews (an isolated node's kubelet is stopped); the agent reads
        // the renewal, whether or not the controller's Lease watch delivers it.
        let renewed = lease_speaks && power && !self.isolated;
        if renewed {
            self.true_lease = self.now;
        }
        if power && (reports_speak || renewed) {
            self.last_spoke = Some(self.now);
        }
        // What was heard before, even while the controller took the node for one
        // without an agent: a controller never hears a node earlier than it spoke.
        let (lease, report) = self.heard_at;
        // A crashed node's kubelet and agent are gone with its kernel.
        let power = self.has_power();
        self.sequence += 1;
        if reports_speak && power {
            // The agent reaches the API server when the kubelet's Lease gets through.
            self.api_reachable_since = if lease_speaks {
                self.api_reachable_since.or(Some(self.now))
            } else {
                None
            };
        }
        self.facts.liveness = Liveness::Heard(Channels {
            // A stalled Lease watch delivers nothing.
            lease: if renewed && !self.watch_stalled {
                self.now
            } else {
                lease
            },
            lease_fresh_within: Duration::from_secs(20),
            report: if reports_speak && power {
                self.now
            } else {
                report
            },
            reports_fresh_within: Duration::from_secs(6),
            drained: self.drained,
            isolation: self.over_tls.then_some(IsolationHeard {
                state: self.isolation_state,
                confirmed: self.isolated && self.isolation_state == IsolationState::Isolated,
                sequence: self.sequence,
                request: self.isolation_request,
            }),
            api_reachable_since: self.api_reachable_since.filter(|_| self.over_tls),
            promise: self
                .promise_heard
                .filter(|_| self.over_tls)
                .map(|(within, boot)| PromiseHeard {
                    within,
                    boot_id: BootId::new(&format!("boot-{boot}")),
                    boot_time: at(-100_000),
                    sequence: self.sequence,
                }),
            boot: self
                .report_boot
                .filter(|_| self.over_tls)
                .map(|boot| BootId::new(&format!("boot-{boot}"))),
        });
        if let Liveness::Heard(channels) = self.facts.liveness {
            self.facts.lease_heard = Some(channels.lease);
            self.heard_at = (channels.lease, channels.report);
            // A fresh read of the Lease shows every renewal.
            self.facts.lease_unchanged = Some(channels.lease >= self.true_lease);
        }
    }

    /// The node's agent follows the controller's instructions, if it still reports.
    fn follow(&mut self, instructions: &[Instruction]) {
        if !matches!(self.channels, Some((_, true))) || !self.devices.power_on {
            return;
        }
        for instruction in instructions {
            match instruction {
                Instruction::Isolate { request, .. } => match self.isolation_fate {
                    IsolationFate::Works => {
                        self.isolated = true;
                        self.isolation_state = IsolationState::Isolated;
                        self.isolation_request = *request;
                    }
                    IsolationFate::Fails => {
                        self.isolation_state = IsolationState::Failed;
                        self.isolation_request = *request;
                    }
                    IsolationFate::Silent => {}
                },
                Instruction::EndIsolation => {
                    self.isolated = false;
                    self.isolation_state = IsolationState::None;
                }
            }
        }
        self.hear();
    }

    /// The node's agent drains it and says so, and the node powers itself off: a clean
    /// shutdown. Only a node with a reporting agent can say it. Its pods are deleted and
    /// its volume stays attached, unless `pods_left` (the agent's word is wrong).
    fn drain(&mut self, pods_left: bool) {
        if !matches!(self.channels, Some((_, true)))
            || !self.devices.power_on
            || self.in_crash_kernel
        {
            return;
        }
        if !pods_left {
            self.facts.runs_pods_needing_fencing = false;
            self.facts.pods_to_release = 0;
            self.facts.volumes_attached = 1;
        }
        self.hear();
        self.drained = Some(DrainedStatement {
            boot_time: at(-100_000),
            sequence: 1,
            finished_at: Some(self.now),
        });
        self.hear();
        self.devices.power_on = false;
        self.set_ready(false);
    }

    /// The node is alive by one of its channels (whatever its Ready condition says), and
    /// has not said it drained and stopped both.
    fn heard_alive(&self) -> bool {
        matches!(self.facts.liveness, Liveness::Heard(channels)
            if self.now < channels.silent_at(self.policy.silence_timeout)
                && channels.drained_at().is_none_or(|gone| self.now < gone))
    }

    fn advance(&mut self, seconds: u64) {
        self.now += Duration::from_secs(seconds);
        self.hear();
        self.keep_promise();
        // A running execution ends once time has passed.
        if let Some(running) = self.running.take() {
            let outcome = self.run_to_end(&running);
            self.finished.push(ExecutionReport {
                name: running.name,
                state: ReportedState::Finished(outcome),
            });
        }
        if !self.devices.power_on && !self.power_device_of_another {
            self.set_ready(false);
        }
    }

    /// The controller dies: whatever ran is lost; its agent may or may not have acted.
    fn restart(&mut self, acted: bool) {
        self.restarts += 1;
        // The new controller's kdump log hears from now on.
        self.facts.kdump_listening_since = Some(self.now);
        if let Some(running) = self.running.take()
            && acted
            && running.kind == ExecutionKind::Act
        {
            self.apply(&running.method);
        }
        self.finished.clear();
    }

    fn target_of(&self, method: &str) -> FenceAction {
        self.plan
            .steps
            .values()
            .flatten()
            .flatten()
            .find(|m| m.name == method)
            .map(|m| m.action)
            .expect("a planned method")
    }

    fn apply(&mut self, method: &str) {
        let on = self.target_of(method) == FenceAction::On;
        let device = self.devices.device_of(method);
        if *device && !on && !method.starts_with("scsi") {
            self.power_offs += 1;
            // Powering off ends the crash kernel and its dump; the node boots afresh.
            self.in_crash_kernel = false;
            self.kdump_sending = false;
        }
        let powered_on = on && !*device && !method.starts_with("scsi");
        *device = on;
        if on && !method.starts_with("scsi") {
            self.crashed = false;
        }
        if powered_on {
            // Off, then on: the node boots afresh.
            self.power_on_by_hand();
        }
    }

    fn run_to_end(&mut self, running: &Running) -> Outcome {
        let finished_at = self.now;
        let power_seen = |devices: &mut Devices, method: &str| {
            if *devices.device_of(method) {
                PowerSeen::On
            } else {
                PowerSeen::Off
            }
        };
        match (running.kind, running.fate) {
            (ExecutionKind::Verify, Fate::Fails) => Outcome {
                succeeded: false,
                timed_out: false,
                off_confirmed: false,
                power: None,
                detail: Some("status failed".into()),
                finished_at,
            },
            (ExecutionKind::Verify, _) => {
                let power = power_seen(&mut self.devices, &running.method);
                Outcome {
                    succeeded: true,
                    timed_out: false,
                    off_confirmed: false,
                    power: Some(power),
                    detail: None,
                    finished_at,
                }
            }
            (ExecutionKind::Act, Fate::Works) => {
                self.apply(&running.method);
                let power = power_seen(&mut self.devices, &running.method);
                Outcome {
                    succeeded: true,
                    timed_out: false,
                    off_confirmed: power == PowerSeen::Off,
                    power: Some(power),
                    detail: None,
                    finished_at,
                }
            }
            (ExecutionKind::Act, Fate::Fails) => Outcome {
                succeeded: false,
                timed_out: false,
                off_confirmed: false,
                power: None,
                detail: Some("exit 1".into()),
                finished_at,
            },
            (ExecutionKind::Act, Fate::TimesOut(acted)) => {
                if acted {
                    self.apply(&running.method);
                }
                Outcome {
                    succeeded: false,
                    timed_out: true,
                    off_confirmed: false,
                    power: None,
                    detail: Some("deadline".into()),
                    finished_at,
                }
            }
            (ExecutionKind::Act, Fate::Unconfirmed) => Outcome {
                succeeded: true,
                timed_out: false,
                off_confirmed: false,
                power: Some(power_seen(&mut self.devices, &running.method)),
                detail: None,
                finished_at,
            },
        }
    }

    /// What the executor knows about the status's unfinished executions.
    fn reports(&self) -> Vec<ExecutionReport> {
        let Some(status) = self.fence.as_ref().and_then(|f| f.status.as_ref()) else {
            return Vec::new();
        };
        status
            .executions
            .iter()
            .filter(|e| e.result.is_none())
            .map(|e| {
                if let Some(report) = self.finished.iter().find(|r| r.name == e.name) {
                    report.clone()
                } else if self.running.as_ref().is_some_and(|r| r.name == e.name) {
                    ExecutionReport {
                        name: e.name.clone(),
                        state: ReportedState::Running,
                    }
                } else {
                    ExecutionReport {
                        name: e.name.clone(),
                        state: ReportedState::Lost,
                    }
                }
            })
            .collect()
    }

    /// One reconcile: decide, check the safety rules, persist, act.
    fn reconcile(&mut self) -> Option<&Decision> {
        let fence = self.fence.clone()?;
        let before = fence.status.clone().unwrap_or_default();
        let decision = decide(
            &fence,
            &self.facts,
            &self.reports(),
            &self.guard,
            &self.policy,
            self.now,
        );
        self.check(&before, &decision);
        let mut fence = fence;
        // Through JSON, as the API server keeps it (whole seconds).
        let stored = serde_json::to_value(&decision.status)
            .and_then(serde_json::from_value)
            .expect("the status round-trips");
        fence.status = Some(stored);
        self.fence = Some(fence);
        self.finished.clear();
        for action in &decision.actions {
            match action {
                Action::Start(request) => {
                    let fate = if self.fates.is_empty() {
                        Fate::Works
                    } else {
                        self.fates.remove(0)
                    };
                    self.running = Some(Running {
                        name: request.name.clone(),
                        method: request.method.clone(),
                        kind: request.kind,
                        fate,
                    });
                }
                Action::Taint(TaintChange::AddRemediation) => self.facts.taints.remediation = true,
                Action::Taint(TaintChange::RemoveRemediation) => {
                    self.facts.taints.remediation = false
                }
                Action::Taint(TaintChange::AddOutOfService) => {
                    self.facts.taints.out_of_service = true
                }
                Action::Taint(TaintChange::RemoveOutOfService) => {
                    self.facts.taints.out_of_service = false
                }
                Action::DeletePods => self.facts.pods_to_release = 0,
                Action::DeleteFence => self.fence = None,
            }
        }
        self.follow(&decision.instructions);
        self.log.push(decision);
        self.log.last()
    }

    /// The safety rules, checked on every decision against the world's real state.
    fn check(&self, before: &nodekeeper::controller::NodeFenceStatus, decision: &Decision) {
        let starts: Vec<_> = decision
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Start(request) => Some(request),
                _ => None,
            })
            .collect();
        // (b) at most one execution in flight for the node.
        assert!(starts.len() <= 1, "two starts in one decision: {starts:?}");
        if !starts.is_empty() {
            assert!(
                self.running.is_none(),
                "started {:?} while {} still runs",
                starts[0].name,
                self.running.as_ref().map(|r| r.name.as_str()).unwrap_or("")
            );
        }
        let unfinished = decision
            .status
            .executions
            .iter()
            .filter(|e| e.result.is_none())
            .count();
        assert!(unfinished <= 1, "{unfinished} unfinished executions");
        // (a) nothing released before the node is really fenced.
        let releases = decision.actions.iter().any(|a| {
            matches!(
                a,
                Action::Taint(TaintChange::AddOutOfService) | Action::DeletePods
            )
        });
        if releases {
            // A crashed node runs no pod, but only its crash kernel's word, or a promise
            // that ran out, may tell the controller so.
            let crashed = self.crashed && (self.plan.kdump || self.promise_ran_out());
            assert!(
                self.devices.fenced() || self.isolated || crashed,
                "pods released while the node's storage and power are both on and it is not isolated: {decision:#?}"
            );
            assert!(decision.status.confirmed_at.is_some());
        }
        // (g) nothing is released on a node's own word (a drain, an isolation, a
        // promise, a crash kernel) during a storm.
        if before.confirmed_at.is_none()
            && decision.status.confirmed_at.is_some()
            && decision.status.step.is_none()
        {
            assert!(
                self.guard.storm.is_none(),
                "released without a step during a storm: {decision:#?}"
            );
        }
        for request in &starts {
            let power_step = request.step != Step::Recovery;
            // (c) the storm guard holds back every power action, the zone rate every new fence.
            if power_step && request.kind == ExecutionKind::Act {
                assert!(
                    self.guard.storm.is_none(),
                    "a power action started during a storm"
                );
                if before.started_at.is_none() {
                    assert!(
                        self.guard.zone.is_none(),
                        "a fence started against the zone rate"
                    );
                }
            }
            // (f) a node heard alive is never acted on blind: a partition is not a dead node.
            // Only once its own agent failed to isolate it, or did not in time, do the
            // configured steps run.
            if power_step
                && request.kind == ExecutionKind::Act
                && !self.forced()
                && !decision.status.isolation_given_up()
            {
                assert!(
                    !self.heard_alive(),
                    "{} started against a node whose Lease or agent still speaks: {:?}",
                    request.name,
                    self.facts.liveness
                );
            }
            // (e) an action is repeated within an attempt only after `status` showed the
            // earlier one did not take effect.
            if request.kind == ExecutionKind::Act {
                let earlier: Vec<_> = decision
                    .status
                    .executions
                    .iter()
                    .filter(|e| {
                        e.name != request.name
                            && Step::from(e.step) == request.step
                            && e.attempt == request.attempt
                            && e.alternative == request.alternative
                            && e.method == request.method
                    })
                    .collect();
                if let Some(last) = earlier.last() {
                    let target = if self.target_of(&request.method) == FenceAction::On {
                        PowerSeen::On
                    } else {
                        PowerSeen::Off
                    };
                    assert!(
                        last.kind == ExecutionKind::Verify
                            && last.result == Some(ExecutionResult::Succeeded)
                            && last.power != Some(target),
                        "{} repeated without a status showing it had not happened: {earlier:#?}",
                        request.name
                    );
                }
            }
        }
        // (g) a drained release rests on the node's own word, and does nothing to it: no
        // execution runs for a drained fence, and the storm guard and the zone rate held
        // it back like any other.
        if decision.status.is_drained() {
            assert!(
                starts.is_empty() && decision.status.executions.is_empty(),
                "a drained fence ran an execution: {decision:#?}"
            );
            if !before.is_drained() {
                assert!(
                    self.drained.is_some(),
                    "released as drained without the node saying so: {decision:#?}"
                );
                assert!(
                    self.guard.storm.is_none(),
                    "a drained release during a storm"
                );
                if before.started_at.is_none() {
                    assert!(
                        self.guard.zone.is_none(),
                        "a drained release against the zone rate"
                    );
                }
            }
        }
        // (h) a node is asked to isolate itself only while it is cut off from the API
        // server (not Ready, its Lease silent, its agent reporting), never during a storm,
        // and an isolation is confirmed only by the agent's own report of it.
        if decision
            .instructions
            .iter()
            .any(|i| matches!(i, Instruction::Isolate { .. }))
        {
            assert!(
                self.guard.storm.is_none(),
                "an isolation asked for during a storm"
            );
            let Liveness::Heard(channels) = self.facts.liveness else {
                panic!("an isolation asked of a node without an agent: {decision:#?}");
            };
            let silence = self.policy.silence_timeout;
            assert!(
                self.facts.health.readiness != Readiness::Ready
                    && self.now >= channels.lease_silent_at(silence)
                    && self.now < channels.reports_silent_at(silence),
                "an isolation asked of a node that is not cut off: {:?}",
                self.facts.liveness
            );
        }
        let confirms_isolation = decision
            .status
            .self_isolation
            .as_ref()
            .is_some_and(|i| i.outcome == Some(IsolationOutcome::Confirmed))
            && !before
                .self_isolation
                .as_ref()
                .is_some_and(|i| i.outcome == Some(IsolationOutcome::Confirmed));
        if confirms_isolation {
            assert!(self.isolated, "an isolation confirmed that did not happen");
        }
        // (i) a kdump notification confirms a fence only for a node configured with
        // kdump=true that is in its crash kernel; and while it dumps (its notifications
        // still coming), no power action runs against it before kdumpWait.
        if decision.status.kdump.is_some() && before.kdump.is_none() {
            assert!(
                self.plan.kdump && self.crashed,
                "kdump taken from a node that did not crash: {decision:#?}"
            );
        }
        if let Some(first) = self.kdump_first
            && decision.status.kdump.is_some()
            && self.kdump_sending
            && self.in_crash_kernel
            && self.devices.power_on
        {
            for request in &starts {
                if request.step == Step::PowerManagement && request.kind == ExecutionKind::Act {
                    assert!(
                        self.now >= first + self.policy.kdump_wait,
                        "{} started while the node dumps, before kdumpWait: {decision:#?}",
                        request.name
                    );
                }
            }
        }
        // (d) retries stay within the limit.
        assert!(decision.status.retries <= self.policy.retry_limit);
    }

    /// Reconciles and lets time pass until the fence settles or `limit` rounds pass.
    fn run(&mut self, rounds: usize, seconds: u64) {
        for _ in 0..rounds {
            if self.reconcile().is_none() {
                return;
            }
            self.advance(seconds);
        }
    }

    /// What the latest decision asks of the node's agent.
    fn asked(&self) -> &[Instruction] {
        &self.log.last().expect("a decision").instructions
    }

    /// How the fence's isolation by the node's agent ended, if it did.
    fn isolation_outcome(&self) -> Option<IsolationOutcome> {
        self.status()
            .self_isolation
            .as_ref()
            .and_then(|isolation| isolation.outcome)
    }

    fn forced(&self) -> bool {
        self.fence.as_ref().is_some_and(|f| f.spec.force)
    }

    fn phase(&self) -> (Option<FenceStep>, Option<FencePhase>) {
        let status = self.status();
        (status.step, status.phase)
    }

    fn events(&self) -> Vec<&'static str> {
        self.log
            .iter()
            .flat_map(|d| d.events.iter().map(|e| e.reason))
            .collect()
    }

    /// The recovery executions started so far.
    fn recoveries_started(&self) -> Vec<String> {
        self.started()
            .into_iter()
            .filter(|name| name.starts_with("recovery"))
            .collect()
    }

    fn started(&self) -> Vec<String> {
        self.log
            .iter()
            .flat_map(|d| d.actions.iter())
            .filter_map(|a| match a {
                Action::Start(r) => Some(r.name.clone()),
                _ => None,
            })
            .collect()
    }
}

#[test]
fn a_lost_node_is_isolated_released_powered_off_and_recovered_when_it_returns() {
    let mut world = World::new(full_plan(), false);
    world.now = at(30);
    let decision = world.reconcile().expect("a decision").clone();
    assert!(decision.actions.is_empty(), "{:?}", decision.actions);
    let pause = decision.status.pause.expect("waiting");
    assert_eq!(pause.reason, PauseReason::WaitingForUnhealthyDuration);
    // The reconciler is told to look again exactly when the wait ends.
    assert_eq!(decision.requeue_after, Duration::from_secs(30));

    world.now = at(60);
    let decision = world.reconcile().expect("a decision").clone();
    assert_eq!(
        world.phase(),
        (Some(FenceStep::Isolation), Some(FencePhase::Running))
    );
    assert!(
        decision
            .actions
            .contains(&Action::Taint(TaintChange::AddRemediation))
    );
    assert!(
        !decision
            .actions
            .contains(&Action::Taint(TaintChange::AddOutOfService)),
        "nothing is released before the fence is confirmed"
    );
    assert_eq!(world.started(), ["isolation-t1-a1-scsi-act1"]);

    world.advance(2);
    let decision = world.reconcile().expect("a decision").clone();
    assert_eq!(
        world.phase(),
        (Some(FenceStep::Isolation), Some(FencePhase::Done))
    );
    assert!(
        decision
            .actions
            .contains(&Action::Taint(TaintChange::AddOutOfService))
    );
    assert!(world.status().confirmed_at.is_some());
    assert_eq!(
        world.status().pause.as_ref().map(|p| p.reason),
        Some(PauseReason::WaitingForPowerManagementDelay)
    );

    world.advance(60);
    world.reconcile();
    assert_eq!(
        world.phase(),
        (Some(FenceStep::PowerManagement), Some(FencePhase::Running))
    );
    world.advance(2);
    world.reconcile();
    assert_eq!(
        world.phase(),
        (Some(FenceStep::PowerManagement), Some(FencePhase::Done))
    );
    assert!(!world.devices.power_on);
    assert_eq!(world.power_offs, 1);

    // Someone repairs the node and powers it on; it reports Ready.
    world.power_on_by_hand();
    world.advance(120);
    world.set_ready(true);
    world.run(10, 2);
    assert!(world.fence.is_none(), "the fence ends after recovery");
    assert!(
        world.devices.storage_on,
        "recovery re-enabled the storage port"
    );
    assert_eq!(
        world.facts.taints,
        NodeTaints::default(),
        "our taints are gone"
    );
    let events = world.events();
    for reason in [
        "FenceStarted",
        "FenceConfirmed",
        "OutOfServiceTaintAdded",
        "RecoveryStarted",
        "Recovered",
    ] {
        assert!(events.contains(&reason), "{reason} missing from {events:?}");
    }
}

/// The world of the first test once its power step is done: the node isolated,
/// released and powered off, on the device's word.
fn powered_off_world(boot_id: Option<&str>) -> World {
    let mut world = World::new(full_plan(), false);
    world.facts.boot_id = boot_id.map(str::to_string);
    world.now = at(60);
    world.reconcile();
    world.advance(2);
    world.reconcile();
    world.advance(60);
    world.reconcile();
    world.advance(2);
    world.reconcile();
    assert_eq!(
        world.phase(),
        (Some(FenceStep::PowerManagement), Some(FencePhase::Done))
    );
    world
}

/// What a contradicted power-off leaves: the fence paused `PowerOffContradicted`, its
/// message quoting `said`, one warning Event, no recovery started, the storage still cut
/// off and the pods still released.
fn assert_contradicted(world: &World, said: &str) {
    let pause = world.status().pause.clone().expect("paused");
    assert_eq!(pause.reason, PauseReason::PowerOffContradicted);
    assert!(pause.message.contains(said), "{}", pause.message);
    let recovery = world.recoveries_started();
    assert!(recovery.is_empty(), "{recovery:?}");
    assert!(!world.devices.storage_on, "its storage stays cut off");
    assert!(world.facts.taints.out_of_service, "its pods stay released");
    let warned = world
        .log
        .iter()
        .flat_map(|d| d.events.iter())
        .filter(|e| e.warning && e.message.starts_with("PowerOffContradicted"))
        .count();
    assert_eq!(warned, 1, "said once, as a warning");
}

#[test]
fn a_node_back_on_the_boot_its_power_off_should_have_ended_is_not_recovered() {
    let mut world = powered_off_world(Some("boot-1"));
    assert_eq!(
        world.status().power_off_boot.as_deref(),
        Some("boot-1"),
        "the boot recorded when the power step acted"
    );
    // The device said off, but what it switched off was another machine: the node's
    // kubelet is back, Ready, on the boot it ran all along.
    world.power_device_of_another = true;
    world.advance(5);
    world.set_ready(true);
    world.run(10, 5);
    assert_contradicted(&world, "its kubelet reports boot \"boot-1\"");

    // Someone power-cycles it: its kubelet reports a new boot, and recovery runs.
    world.facts.boot_id = Some("boot-2".to_string());
    world.run(10, 2);
    assert!(world.fence.is_none(), "recovered: the fence ends");
    assert!(world.devices.storage_on, "recovery re-enabled the storage");
}

/// [`powered_off_world`] on boot-1, whose device switched off another machine: the
/// node runs on, cut off from the API server (its kubelet cannot say so, the node stays
/// NotReady), and its agent reaches the controller again, over TLS, from the boot it ran
/// all along.
fn agent_heard_on_the_old_boot() -> World {
    let mut world = powered_off_world(Some("boot-1"));
    world.power_device_of_another = true;
    world.advance(5);
    world.set_channels(Some((false, true)));
    world
}

#[test]
fn a_partitioned_nodes_agent_reporting_from_the_powered_off_boot_pauses_the_fence() {
    let mut world = agent_heard_on_the_old_boot();
    world.run(10, 5);
    assert!(!world.facts.health.is_ready(), "the kubelet is never heard");
    assert_contradicted(&world, "its agent reports boot \"boot-1\"");
}

#[test]
fn a_rebooted_node_whose_new_agent_never_reports_is_recovered_despite_the_old_boots_reports() {
    let mut world = agent_heard_on_the_old_boot();
    world.run(3, 2);
    assert_eq!(
        world.status().pause.as_ref().map(|pause| pause.reason),
        Some(PauseReason::PowerOffContradicted)
    );
    // As the pause says: the operator power-cycles the node. Its kubelet is back, Ready
    // on the new boot; its agent does not come back (removed, or its reports refused),
    // so the last report the controller holds is still the old boot's.
    world.set_channels(Some((true, false)));
    world.power_on_by_hand();
    world.set_ready(true);
    world.run(10, 2);
    assert!(world.fence.is_none(), "recovered on the new boot");
    assert!(world.devices.storage_on, "recovery re-enabled the storage");
}

#[test]
fn a_kubelet_status_from_before_a_reboot_is_no_contradiction_when_the_agent_reports_the_new_boot() {
    let mut world = powered_off_world(Some("boot-1"));
    // The node is back on a new boot; its agent says so at once, its kubelet's status
    // still names the old boot (it has not posted since), next to a Ready.
    world.power_on_by_hand();
    world.set_channels(Some((false, true)));
    world.facts.boot_id = Some("boot-1".to_string());
    world.advance(5);
    world.set_ready(true);
    world.run(5, 2);
    assert_eq!(world.status().pause, None, "nothing contradicted");
    assert_eq!(
        world.phase(),
        (Some(FenceStep::PowerManagement), Some(FencePhase::Done)),
        "recovery waits for the kubelet's own word"
    );
    world.facts.boot_id = Some(format!("boot-{}", world.boot));
    world.run(10, 2);
    assert!(
        world.fence.is_none(),
        "recovered once the kubelet posts the new boot"
    );
}

#[test]
fn an_agent_reporting_from_a_new_boot_after_the_power_off_is_no_contradiction() {
    let mut world = powered_off_world(Some("boot-1"));
    // Someone powers the node on; its agent reports the new boot before its kubelet is
    // Ready.
    world.advance(30);
    world.power_on_by_hand();
    world.set_channels(Some((false, true)));
    world.run(5, 2);
    assert_eq!(world.status().pause, None, "nothing contradicted");
    assert_eq!(
        world.phase(),
        (Some(FenceStep::PowerManagement), Some(FencePhase::Done)),
        "not Ready yet: no recovery"
    );
    world.set_ready(true);
    world.run(10, 2);
    assert!(world.fence.is_none(), "recovered once Ready");
}

#[test]
fn an_agent_report_from_before_the_power_step_ended_contradicts_nothing() {
    // The agent's last report came while the power-off ran (its machine then went dark
    // for real): the same boot, but heard before the step ended.
    let mut world = World::new(full_plan(), false);
    world.set_channels(Some((false, true)));
    world.set_channels(Some((false, false)));
    world.now = at(60);
    world.run(6, 31);
    assert_eq!(
        world.phase(),
        (Some(FenceStep::PowerManagement), Some(FencePhase::Done))
    );
    world.run(5, 5);
    assert_eq!(world.status().pause, None, "nothing contradicted");
}

#[test]
fn the_power_step_records_the_boot_the_agent_reports_over_a_stale_kubelet_status() {
    // A forced fence on a node that rebooted while cut off from the API server: its
    // kubelet's status still names the old boot, its agent reports the new one.
    let mut world = World::new(full_plan(), true);
    world.set_channels(Some((false, true)));
    world.reboot();
    world.facts.boot_id = Some("boot-1".to_string());
    world.now = at(1);
    for _ in 0..20 {
        if world
            .status_opt()
            .is_some_and(|status| status.power_off_boot.is_some())
        {
            break;
        }
        world.reconcile();
        world.advance(5);
    }
    assert_eq!(
        world.status().power_off_boot.as_deref(),
        Some("boot-2"),
        "the boot its agent reports"
    );
}

#[test]
fn a_forced_fences_node_still_reading_ready_after_its_power_off_is_neither_recovered_nor_alarmed() {
    // A forced fence on a Ready node: the Ready condition the kubelet posted before the
    // power-off stays until the node lifecycle controller notices the silence.
    let mut world = World::new(full_plan(), true);
    world.set_ready(true);
    let posted = world.facts.health;
    world.now = at(1);
    world.run(6, 31);
    assert_eq!(
        world.phase(),
        (Some(FenceStep::PowerManagement), Some(FencePhase::Done))
    );
    world.power_device_of_another = true;
    world.facts.health = posted;
    world.run(5, 5);
    let recovery = world.recoveries_started();
    assert!(recovery.is_empty(), "{recovery:?}");
    assert_eq!(
        world.status().pause,
        None,
        "no contradiction on a stale Ready"
    );
    // The node boots again and its kubelet says so: recovery.
    world.power_on_by_hand();
    world.set_ready(true);
    world.run(10, 2);
    assert!(world.fence.is_none(), "recovered");
}

#[test]
fn a_power_step_that_could_not_confirm_every_supply_off_compares_no_boot() {
    // Two supplies; the second's outlet may fail (the step still succeeds, unconfirmed):
    // the node may run on, on the same boot, without contradicting anything.
    let mut plan = full_plan();
    let mut second = method("psu-2", FenceAction::Off);
    second.must_succeed = false;
    plan.steps.insert(
        Step::PowerManagement,
        vec![vec![method("ipmi", FenceAction::Off), second]],
    );
    let mut world = World::new(plan, false);
    world.fates = vec![Fate::Works, Fate::Works, Fate::Fails];
    world.now = at(60);
    world.run(6, 31);
    assert_eq!(
        world.phase(),
        (Some(FenceStep::PowerManagement), Some(FencePhase::Done))
    );
    assert_eq!(world.status().power_off_boot, None);
    world.power_device_of_another = true;
    world.set_ready(true);
    world.run(10, 2);
    assert!(world.fence.is_none(), "recovered as before");
}

#[test]
fn a_node_whose_kubelet_reports_no_boot_is_recovered_as_before() {
    let mut world = powered_off_world(None);
    assert_eq!(world.status().power_off_boot, None);
    world.power_device_of_another = true;
    world.set_ready(true);
    world.run(10, 2);
    assert!(world.fence.is_none(), "recovered with nothing to compare");
}

#[test]
fn a_controller_killed_during_the_power_off_asks_the_device_instead_of_powering_off_again() {
    let mut plan = full_plan();
    plan.steps.remove(&Step::Isolation);
    let mut world = World::new(plan, false);
    world.now = at(61);
    world.reconcile();
    assert_eq!(world.started(), ["power-management-t1-a1-ipmi-act1"]);
    // The controller dies after the agent powered the node off, before it could record it.
    world.restart(true);
    world.advance(5);
    let decision = world.reconcile().expect("a decision").clone();
    assert_eq!(
        decision.status.executions[0].result,
        Some(ExecutionResult::Interrupted)
    );
    assert_eq!(
        world.started(),
        [
            "power-management-t1-a1-ipmi-act1",
            "power-management-t1-a1-ipmi-verify1"
        ]
    );
    world.advance(1);
    let decision = world.reconcile().expect("a decision").clone();
    assert!(
        decision
            .actions
            .contains(&Action::Taint(TaintChange::AddOutOfService))
    );
    assert_eq!(world.power_offs, 1, "exactly one power-off");
    assert_eq!(world.started().len(), 2);
}

#[test]
fn a_controller_killed_before_the_agent_acted_powers_off_once_after_asking() {
    let mut plan = full_plan();
    plan.steps.remove(&Step::Isolation);
    let mut world = World::new(plan, false);
    world.now = at(61);
    world.reconcile();
    world.restart(false);
    world.advance(5);
    world.run(4, 1);
    assert_eq!(
        world.started(),
        [
            "power-management-t1-a1-ipmi-act1",
            "power-management-t1-a1-ipmi-verify1",
            "power-management-t1-a1-ipmi-act2"
        ]
    );
    assert_eq!(world.power_offs, 1);
    assert!(world.status().confirmed_at.is_some());
}

#[test]
fn a_storm_pauses_the_fence_says_why_and_it_resumes_when_the_storm_is_over() {
    let mut world = World::new(full_plan(), false);
    world.now = at(61);
    world.guard.storm = Some(storm("3 of 5 watched nodes are unhealthy"));
    let decision = world.reconcile().expect("a decision").clone();
    assert!(decision.actions.is_empty(), "{:?}", decision.actions);
    let pause = decision.status.pause.clone().expect("paused");
    assert_eq!(pause.reason, PauseReason::StormGuard);
    let paused = decision
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "Paused")
        .expect("a Paused condition");
    assert_eq!(
        (paused.status.as_str(), paused.reason.as_str()),
        ("True", "StormGuard")
    );
    assert!(
        decision
            .events
            .iter()
            .any(|e| e.reason == "FencePaused" && e.warning && e.message.contains("3 of 5"))
    );
    // The same pause again is not a new event.
    world.advance(10);
    let again = world.reconcile().expect("a decision").clone();
    assert!(again.events.is_empty(), "{:?}", again.events);
    assert_eq!(again.status.pause.expect("still paused").since, pause.since);

    world.guard = Guard::open();
    world.advance(10);
    world.reconcile();
    assert_eq!(
        world.phase(),
        (Some(FenceStep::Isolation), Some(FencePhase::Running))
    );
    assert!(world.status().pause.is_none());
}

#[test]
fn a_storm_arriving_mid_fence_holds_the_power_step_back() {
    let mut world = World::new(full_plan(), false);
    world.now = at(61);
    world.run(2, 1);
    assert_eq!(
        world.phase(),
        (Some(FenceStep::Isolation), Some(FencePhase::Done))
    );
    world.guard.storm = Some(storm("storm"));
    world.advance(600);
    world.run(5, 60);
    assert_eq!(
        world.phase(),
        (Some(FenceStep::PowerManagement), Some(FencePhase::New))
    );
    assert!(world.devices.power_on, "no power action during a storm");
}

#[test]
fn the_zone_rate_holds_back_only_the_start_of_a_fence() {
    let mut world = World::new(full_plan(), false);
    world.now = at(61);
    world.guard.zone = Some(GuardBlock {
        reason: PauseReason::ZoneRateLimit,
        message: "zone busy".to_string(),
        until: Some(at(70)),
    });
    let decision = world.reconcile().expect("a decision").clone();
    assert!(decision.actions.is_empty());
    assert_eq!(decision.requeue_after, Duration::from_secs(9));
    world.guard.zone = None;
    world.advance(9);
    world.reconcile();
    // Later steps of a started fence are not rate-limited.
    world.guard.zone = Some(GuardBlock {
        reason: PauseReason::ZoneRateLimit,
        message: "zone busy".to_string(),
        until: None,
    });
    world.run(3, 61);
    assert!(!world.devices.power_on);
}

#[test]
fn an_unconfirmed_success_never_releases_pods() {
    let mut plan = full_plan();
    plan.steps.remove(&Step::Isolation);
    let mut world = World::new(plan, false);
    world.now = at(61);
    world.fates = vec![Fate::Unconfirmed, Fate::Unconfirmed];
    world.run(6, 1);
    assert_eq!(
        world.phase(),
        (Some(FenceStep::PowerManagement), Some(FencePhase::Done))
    );
    assert!(world.status().confirmed_at.is_none());
    assert!(!world.facts.taints.out_of_service);
    assert_eq!(world.facts.pods_to_release, 1);
}

#[test]
fn failures_are_retried_with_backoff_then_the_fence_stays_failed() {
    let mut plan = full_plan();
    plan.steps.remove(&Step::Isolation);
    let mut world = World::new(plan, false);
    world.now = at(61);
    world.fates = vec![Fate::Fails; 100];
    world.run(200, 10);
    let status = world.status().clone();
    assert_eq!(status.phase, Some(FencePhase::Error));
    assert_eq!(status.retries, world.policy.retry_limit);
    let failed = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Failed")
        .expect("a Failed condition");
    assert_eq!(failed.status, "True");
    // Two alternatives per attempt, one retry limit: a bounded number of agent runs.
    let limit = 2 * (world.policy.retry_limit as usize + 1);
    assert_eq!(world.started().len(), limit);
    let events = world.events();
    assert_eq!(events.iter().filter(|e| **e == "FenceFailed").count(), 1);
    assert_eq!(
        events.iter().filter(|e| **e == "RetryScheduled").count(),
        world.policy.retry_limit as usize
    );
    // Retries honour the backoff: 30 s, 60 s, 120 s between attempts.
    let starts: Vec<Timestamp> = status
        .executions
        .iter()
        .filter(|e| e.alternative == 1)
        .map(|e| e.started_at.0)
        .collect();
    let gaps: Vec<i64> = starts
        .windows(2)
        .map(|w| w[1].as_second() - w[0].as_second())
        .collect();
    assert!(gaps[0] >= 30 && gaps[1] >= 60 && gaps[2] >= 120, "{gaps:?}");
}

#[test]
fn a_node_ready_again_before_anything_ran_cancels_the_fence() {
    let mut world = World::new(full_plan(), false);
    world.now = at(30);
    world.reconcile();
    world.set_ready(true);
    world.advance(1);
    let decision = world.reconcile().expect("a decision").clone();
    assert!(decision.actions.contains(&Action::DeleteFence));
    assert!(world.started().is_empty());
}

#[test]
fn a_forced_fence_runs_on_a_ready_node_without_waiting() {
    let mut world = World::new(full_plan(), true);
    world.set_ready(true);
    world.now = at(1);
    world.reconcile();
    assert_eq!(world.started(), ["isolation-t1-a1-scsi-act1"]);
}

#[test]
fn a_forced_fence_still_honours_the_exclusion_label_and_the_storm_guard() {
    let mut world = World::new(full_plan(), true);
    world.facts.excluded = true;
    let decision = world.reconcile().expect("a decision").clone();
    assert_eq!(
        decision.status.pause.map(|p| p.reason),
        Some(PauseReason::Excluded)
    );
    let mut world = World::new(full_plan(), true);
    world.guard.storm = Some(storm("storm"));
    world.reconcile();
    assert!(world.started().is_empty());
}

#[test]
fn a_fence_not_named_after_its_node_never_acts() {
    let mut world = World::new(full_plan(), true);
    if let Some(fence) = world.fence.as_mut() {
        fence.metadata.name = Some("someone-else".to_string());
    }
    world.now = at(100);
    let decision = world.reconcile().expect("a decision").clone();
    assert!(decision.actions.is_empty());
    assert_eq!(
        decision.status.pause.map(|p| p.reason),
        Some(PauseReason::NameMismatch)
    );
}

#[test]
fn a_node_without_a_usable_configuration_is_paused_with_the_reason() {
    let mut world = World::new(full_plan(), false);
    world.facts.plan = Err("fence-config-worker-1 not found in namespace fencing".to_string());
    world.now = at(100);
    let decision = world.reconcile().expect("a decision").clone();
    let pause = decision.status.pause.expect("paused");
    assert_eq!(pause.reason, PauseReason::NoConfiguration);
    assert!(pause.message.contains("fence-config-worker-1"));
}

#[test]
fn the_optional_cluster_fence_deletes_pods_only_after_confirmation() {
    let mut world = World::new(full_plan(), false);
    world.policy.delete_pods = true;
    world.now = at(61);
    let first = world.reconcile().expect("a decision").clone();
    assert!(!first.actions.contains(&Action::DeletePods));
    world.advance(1);
    let second = world.reconcile().expect("a decision").clone();
    assert!(second.actions.contains(&Action::DeletePods));
    assert_eq!(world.facts.pods_to_release, 0);
}

#[test]
fn a_node_whose_lease_and_reports_fell_silent_is_fenced_while_it_still_reads_ready() {
    let mut world = World::new(full_plan(), false);
    world.policy.unhealthy_duration = Duration::from_secs(300);
    world.set_ready(true);
    world.set_channels(Some((true, true)));
    world.advance(5);
    let decision = world.reconcile().expect("a decision").clone();
    assert!(
        decision.actions.contains(&Action::DeleteFence),
        "heard and Ready: a fence without force is cancelled"
    );

    let mut world = World::new(full_plan(), false);
    world.policy.unhealthy_duration = Duration::from_secs(300);
    world.set_ready(true);
    world.set_channels(Some((true, true)));
    // The node dies: both channels stop; the node lifecycle controller has not noticed.
    world.set_channels(Some((false, false)));
    world.advance(20);
    let decision = world.reconcile().expect("a decision").clone();
    assert!(
        !decision.actions.contains(&Action::DeleteFence),
        "a silent node is not healthy, though it reads Ready"
    );
    assert_eq!(world.started(), ["isolation-t1-a1-scsi-act1"]);
    let lost = world
        .status()
        .lost
        .clone()
        .expect("the evidence is recorded");
    assert_eq!(lost.evidence, Evidence::Silence);
    assert_eq!(lost.since.0, at(0));
    assert!(
        world.events().contains(&"NodeSilent"),
        "{:?}",
        world.events()
    );

    // Still reading Ready (the node lifecycle controller lags), the fence goes on to
    // the release and the power-off, and never takes that Ready for a recovery.
    world.run(20, 5);
    assert!(world.status().confirmed_at.is_some());
    assert!(!world.devices.power_on, "powered off");
    assert!(world.status().recovered_at.is_none());
}

#[test]
fn a_partitioned_node_whose_agent_reports_over_plain_http_is_never_powered_off() {
    let mut world = World::new(full_plan(), false);
    world.over_tls = false;
    world.policy.unhealthy_duration = Duration::from_secs(60);
    // Cut off from the API server: its Lease stops and it turns Unknown, but its agent
    // keeps reporting to the controller.
    world.set_channels(Some((false, true)));
    world.run(30, 30);
    assert!(world.started().is_empty(), "{:?}", world.started());
    let pause = world.status().pause.clone().expect("paused");
    assert_eq!(pause.reason, PauseReason::NodeAlive);
    assert!(
        pause.message.contains("cut off from the API server"),
        "{}",
        pause.message
    );
    // Its reports stop too: now it is silent, and fenced.
    world.set_channels(Some((false, false)));
    world.run(10, 5);
    assert!(!world.started().is_empty());
    assert_eq!(
        world.status().lost.as_ref().map(|lost| lost.evidence),
        Some(Evidence::Silence)
    );
}

#[test]
fn a_partitioned_node_is_isolated_by_its_agent_and_released_with_no_power_action() {
    let mut world = World::new(full_plan(), false);
    // Cut off from the API server: its Lease stops and it turns Unknown, but its agent
    // keeps reporting to the controller, over TLS.
    world.set_channels(Some((true, true)));
    world.set_channels(Some((false, true)));
    world.advance(10);
    world.reconcile();
    // Not before its Lease has been silent for silenceTimeout.
    assert!(world.status().self_isolation.is_none());
    assert_eq!(
        world.status().pause.as_ref().map(|p| p.reason),
        Some(PauseReason::NodeAlive)
    );
    world.advance(10);
    world.reconcile();
    let asked = world.asked().to_vec();
    assert!(
        matches!(asked.as_slice(), [Instruction::Isolate { .. }]),
        "{asked:?}"
    );
    // The agent isolated the node; its next report says so.
    world.advance(1);
    world.reconcile();
    let status = world.status().clone();
    assert_eq!(
        status.self_isolation.as_ref().and_then(|i| i.outcome),
        Some(IsolationOutcome::Confirmed)
    );
    assert_eq!(
        status.lost.as_ref().map(|lost| lost.evidence),
        Some(Evidence::Partitioned)
    );
    assert!(status.confirmed_at.is_some());
    assert!(world.facts.taints.out_of_service, "released");
    assert!(
        world.started().is_empty(),
        "no power action: {:?}",
        world.started()
    );
    assert!(world.devices.power_on);
    let events = world.events();
    for reason in [
        "IsolationRequested",
        "NodeIsolated",
        "OutOfServiceTaintAdded",
    ] {
        assert!(events.contains(&reason), "{events:?}");
    }
    // Nothing more is asked while its pods are still bound, nor while it cannot reach
    // the API server.
    world.run(3, 5);
    assert!(world.asked().is_empty());
    // Its pods are gone (the out-of-service taint), and the partition heals: once the
    // agent has said for 15 s that it reaches the API server again, it is told to end
    // the isolation.
    world.facts.runs_pods_needing_fencing = false;
    world.facts.pods_to_release = 0;
    world.channels = Some((true, true));
    world.hear();
    world.run(3, 5);
    world.reconcile();
    assert_eq!(world.asked(), [Instruction::EndIsolation]);
    assert!(!world.isolated, "the agent ended the isolation");
    // The kubelet is back and the node Ready: recovered, taints removed, fence gone.
    world.advance(5);
    world.set_ready(true);
    world.run(5, 5);
    assert!(world.fence.is_none(), "the fence ended");
    assert!(!world.facts.taints.out_of_service);
    assert!(world.started().is_empty());
}

/// A node cut off from the API server, its agent asked to isolate it (and silent about
/// it so far).
fn asked_to_isolate() -> World {
    let mut world = World::new(full_plan(), false);
    world.isolation_fate = IsolationFate::Silent;
    world.set_channels(Some((true, true)));
    world.set_channels(Some((false, true)));
    world.advance(20);
    world.reconcile();
    assert!(
        world
            .asked()
            .iter()
            .any(|i| matches!(i, Instruction::Isolate { .. }))
    );
    world
}

/// [`asked_to_isolate`], then the agent isolates the node and its report confirms the
/// fence.
fn isolated_by_its_agent() -> World {
    let mut world = asked_to_isolate();
    world.isolation_fate = IsolationFate::Works;
    world.advance(1);
    world.reconcile();
    world.advance(1);
    world.reconcile();
    assert_eq!(world.isolation_outcome(), Some(IsolationOutcome::Confirmed));
    world
}

#[test]
fn a_restarted_controller_that_cannot_hear_the_node_yet_gives_nothing_up() {
    let mut world = asked_to_isolate();
    // The new leader has not heard the agent yet.
    world.advance(2);
    world.facts.liveness = Liveness::AgentUnknown {
        until: world.now + Duration::from_secs(38),
    };
    world.reconcile();
    assert_eq!(world.isolation_outcome(), None);
    assert_eq!(
        world.status().pause.as_ref().map(|p| p.reason),
        Some(PauseReason::WaitingForAgentReports)
    );
    assert!(world.asked().is_empty());
    // Heard again: asked again, and the agent's isolation confirms the fence.
    world.isolation_fate = IsolationFate::Works;
    world.advance(10);
    world.reconcile();
    world.advance(1);
    world.reconcile();
    assert_eq!(world.isolation_outcome(), Some(IsolationOutcome::Confirmed));
    assert!(world.started().is_empty(), "{:?}", world.started());
}

/// A node powered off through its BMC alone, whose crash kernel announces itself.
fn kdump_plan() -> PlanOutline {
    let mut plan = PlanOutline::default();
    plan.steps.insert(
        Step::PowerManagement,
        vec![vec![method("ipmi", FenceAction::Off)]],
    );
    plan.kdump = true;
    plan
}

/// A node with an agent, heard until now, whose kernel crashes.
fn crashed_node(plan: PlanOutline) -> World {
    let mut world = World::new(plan, false);
    world.set_channels(Some((true, true)));
    world.advance(10);
    world.crash();
    world
}

fn power_actions(world: &World) -> Vec<String> {
    world
        .started()
        .into_iter()
        .filter(|name| name.starts_with("power-management") && name.ends_with("-act1"))
        .collect()
}

#[test]
fn a_crashed_nodes_kdump_releases_its_pods_and_holds_the_power_off_until_the_dump_ends() {
    let mut world = crashed_node(kdump_plan());
    // Silent for silenceTimeout: lost; its crash kernel has been sending for 15 s.
    world.advance(20);
    world.reconcile();
    let status = world.status().clone();
    let record = status
        .kdump
        .clone()
        .expect("the notifications are recorded");
    assert_eq!(record.from, "10.0.0.1");
    assert_eq!(record.first_heard.0, at(15));
    assert!(
        status.confirmed_at.is_some(),
        "confirmed by the crash kernel"
    );
    assert!(
        status
            .confirmed_by
            .as_deref()
            .is_some_and(|by| by.starts_with(
                "kdump: the node announced its crash kernel from its InternalIP 10.0.0.1"
            )),
        "{:?}",
        status.confirmed_by
    );
    assert!(
        world.facts.taints.out_of_service,
        "its pods are released at once"
    );
    assert!(world.started().is_empty(), "{:?}", world.started());
    assert_eq!(
        status.pause.as_ref().map(|p| p.reason),
        Some(PauseReason::WaitingForKdump)
    );
    assert!(world.devices.power_on);
    // The dump goes on for five minutes: no power action meanwhile.
    world.run(30, 10);
    assert!(power_actions(&world).is_empty(), "{:?}", world.started());
    assert!(
        world
            .status()
            .kdump
            .as_ref()
            .is_some_and(|r| r.last_heard.0 >= at(320))
    );
    // The dump ends; once no notification came for kdumpSilence, the node is powered
    // off, and the BMC's confirmation changes nothing about the release.
    world.kdump_sending = false;
    let ended = world.now;
    world.run(10, 5);
    assert_eq!(power_actions(&world), ["power-management-t1-a1-ipmi-act1"]);
    assert!(!world.devices.power_on, "powered off after the dump");
    assert!(world.now >= ended + world.policy.kdump_silence);
    assert_eq!(world.power_offs, 1);
}

#[test]
fn a_dump_that_never_ends_is_cut_short_after_kdump_wait() {
    let mut world = crashed_node(kdump_plan());
    world.policy.kdump_wait = Duration::from_secs(120);
    world.advance(20);
    world.reconcile();
    assert!(world.status().confirmed_at.is_some());
    world.run(8, 10);
    assert!(power_actions(&world).is_empty(), "{:?}", world.started());
    // 15 s + 120 s after the first notification, though the notifications still come.
    world.run(10, 5);
    assert_eq!(power_actions(&world), ["power-management-t1-a1-ipmi-act1"]);
    assert!(!world.devices.power_on);
}

#[test]
fn kdump_counts_only_when_configured_after_the_last_sign_of_life_and_not_in_a_storm() {
    // Not configured: the notifications change nothing, the node is powered off.
    let mut plan = kdump_plan();
    plan.kdump = false;
    let mut world = crashed_node(plan);
    world.advance(20);
    world.run(3, 5);
    assert!(world.status().kdump.is_none());
    assert_eq!(power_actions(&world), ["power-management-t1-a1-ipmi-act1"]);

    // Notifications that began while the node's agent still reported are no crash
    // kernel's (the address is sending while the node lives): the node is fenced as a
    // silent node.
    let mut world = World::new(kdump_plan(), false);
    world.set_channels(Some((true, true)));
    world.kdump_first = Some(at(0));
    world.kdump_last = Some(at(0));
    world.advance(10);
    world.facts.kdump = Some(KdumpHeard {
        from: "10.0.0.1".parse().expect("address"),
        first: at(5),
        last: at(10),
        notifications: 2,
    });
    world.set_channels(Some((false, false)));
    world.advance(20);
    world.facts.kdump = Some(KdumpHeard {
        from: "10.0.0.1".parse().expect("address"),
        first: at(5),
        last: world.now,
        notifications: 5,
    });
    world.reconcile();
    assert!(world.status().kdump.is_none(), "{:?}", world.status());
    assert_eq!(power_actions(&world), ["power-management-t1-a1-ipmi-act1"]);

    // During a storm nothing is taken, released or powered off; after it, the dump is.
    let mut world = crashed_node(kdump_plan());
    world.guard.storm = Some(storm("storm"));
    world.advance(20);
    world.run(3, 5);
    assert!(world.status().kdump.is_none());
    assert!(world.status().confirmed_at.is_none());
    assert!(!world.facts.taints.out_of_service);
    world.guard = Guard::open();
    world.reconcile();
    assert!(world.status().kdump.is_some());
    assert!(world.facts.taints.out_of_service);
    assert!(power_actions(&world).is_empty());
}

#[test]
fn a_node_without_an_agent_counts_notifications_that_come_after_it_turned_not_ready() {
    let mut world = World::new(kdump_plan(), false);
    world.set_ready(true);
    world.advance(10);
    world.crash();
    world.advance(60);
    world.reconcile();
    assert!(world.status().kdump.is_some(), "{:?}", world.status());
    assert!(world.facts.taints.out_of_service);
    assert!(power_actions(&world).is_empty());

    // Ready=False is a kubelet alive enough to say so (its Lease may still be renewed):
    // datagrams from its address count for nothing, and it is fenced as usual.
    let mut world = World::new(kdump_plan(), false);
    world.set_ready(true);
    world.advance(10);
    world.crash();
    world.facts.health = NodeHealth {
        readiness: Readiness::NotReady,
        since: Some(world.now),
    };
    world.advance(60);
    world.run(3, 5);
    assert!(world.status().kdump.is_none(), "{:?}", world.status());
    assert_eq!(power_actions(&world), ["power-management-t1-a1-ipmi-act1"]);
}

#[test]
fn a_node_excluded_mid_fence_is_not_released_on_its_kdump() {
    // The fence begins its power step during a storm, which holds everything back;
    // meanwhile an operator labels the node excluded.
    let mut world = crashed_node(kdump_plan());
    world.guard.storm = Some(storm("storm"));
    world.advance(20);
    world.reconcile();
    assert_eq!(world.status().step, Some(FenceStep::PowerManagement));
    world.facts.excluded = true;
    world.guard = Guard::open();
    world.run(3, 5);
    assert!(world.status().kdump.is_none(), "{:?}", world.status());
    assert!(world.status().confirmed_at.is_none());
    assert!(!world.facts.taints.out_of_service);
    assert_eq!(
        world.status().pause.as_ref().map(|p| p.reason),
        Some(PauseReason::Excluded)
    );
}

#[test]
fn a_restarted_controller_keeps_waiting_for_the_dump_it_recorded() {
    let mut world = crashed_node(kdump_plan());
    world.advance(20);
    world.reconcile();
    assert!(world.status().kdump.is_some());
    // A new leader has heard no notification yet (its log is empty) nor the agent.
    world.advance(10);
    world.restart(false);
    world.facts.kdump = None;
    world.facts.liveness = Liveness::AgentUnknown {
        until: world.now + Duration::from_secs(38),
    };
    world.reconcile();
    assert!(power_actions(&world).is_empty());
    // It hears the agent is gone and the notifications again: still waiting.
    world.advance(20);
    world.reconcile();
    world.advance(20);
    world.reconcile();
    assert!(power_actions(&world).is_empty(), "{:?}", world.started());
    assert_eq!(
        world.status().pause.as_ref().map(|p| p.reason),
        Some(PauseReason::WaitingForKdump)
    );

    // A restart that takes longer than kdumpSilence, with reports off (no agent known,
    // so nothing holds the node): the new controller waits kdumpSilence from when it
    // began listening before it takes the notifications for stopped.
    let mut world = crashed_node(kdump_plan());
    world.advance(20);
    world.reconcile();
    assert!(world.status().kdump.is_some());
    world.advance(60);
    world.restart(false);
    world.channels = None;
    world.hear();
    world.facts.kdump = None;
    world.reconcile();
    assert!(power_actions(&world).is_empty(), "{:?}", world.started());
    assert_eq!(
        world.status().pause.as_ref().map(|p| p.reason),
        Some(PauseReason::WaitingForKdump)
    );
    // The dump ends: no notification in kdumpSilence since the new controller began
    // listening, and the node is powered off.
    world.kdump_sending = false;
    world.advance(31);
    world.facts.kdump = None;
    world.reconcile();
    assert_eq!(power_actions(&world), ["power-management-t1-a1-ipmi-act1"]);
}

#[test]
fn a_node_that_reads_ready_while_its_agent_is_not_heard_is_never_asked_to_isolate() {
    // Its agent's reports stop reaching this controller (reports turned off after a
    // restart), and then the node reads Ready again: its kubelet posted its status after
    // the request, so the partition healed and the fence ends, with nothing released.
    let mut world = asked_to_isolate();
    world.advance(2);
    world.set_channels(None);
    world.set_ready(true);
    world.reconcile();
    assert!(
        !world
            .asked()
            .iter()
            .any(|i| matches!(i, Instruction::Isolate { .. })),
        "{:?}",
        world.asked()
    );
    assert!(
        world.fence.is_none(),
        "the fence ended: {:?}",
        world.status()
    );
    assert!(world.events().contains(&"FenceCancelled"));
    assert!(!world.facts.taints.out_of_service);
    assert!(world.started().is_empty());

    // A Ready condition from before the request (another controller's clock), with the
    // agent not heard yet: nothing is asked and nothing given up until it is heard.
    let mut world = asked_to_isolate();
    let requested_at = world
        .status()
        .self_isolation
        .as_ref()
        .map(|i| i.requested_at.0)
        .expect("asked");
    world.advance(2);
    world.facts.liveness = Liveness::AgentUnknown {
        until: world.now + Duration::from_secs(38),
    };
    world.facts.health = NodeHealth {
        readiness: Readiness::Ready,
        since: Some(requested_at - Duration::from_secs(1)),
    };
    world.reconcile();
    assert!(world.asked().is_empty(), "{:?}", world.asked());
    assert_eq!(world.isolation_outcome(), None);
    assert_eq!(
        world.status().pause.as_ref().map(|p| p.reason),
        Some(PauseReason::NodeAlive)
    );
}

#[test]
fn a_state_left_from_an_earlier_request_is_no_answer() {
    let mut world = asked_to_isolate();
    // The agent still shows the failure of an earlier request.
    world.isolation_state = IsolationState::Failed;
    world.isolation_request = 1;
    world.advance(1);
    world.reconcile();
    assert_eq!(
        world.isolation_outcome(),
        None,
        "not given up on another request's failure"
    );
    // Its answer to this request counts.
    world.isolation_fate = IsolationFate::Works;
    world.reconcile();
    world.advance(1);
    world.reconcile();
    assert_eq!(world.isolation_outcome(), Some(IsolationOutcome::Confirmed));
}

#[test]
fn during_a_storm_an_isolation_is_neither_asked_taken_nor_given_up() {
    let mut world = asked_to_isolate();
    world.guard.storm = Some(storm("storm"));
    // The agent isolated the node before the storm was declared.
    world.isolated = true;
    world.isolation_state = IsolationState::Isolated;
    world.isolation_request = world
        .status()
        .self_isolation
        .as_ref()
        .map(|i| i.requested_at.0.as_millisecond() as u64)
        .expect("asked");
    world.hear();
    world.advance(120);
    world.reconcile();
    let status = world.status().clone();
    assert_eq!(status.self_isolation.as_ref().and_then(|i| i.outcome), None);
    assert!(status.confirmed_at.is_none());
    assert!(!world.facts.taints.out_of_service);
    assert!(world.asked().is_empty());
    // The storm passes: the isolation is taken.
    world.guard = Guard::open();
    world.reconcile();
    assert_eq!(world.isolation_outcome(), Some(IsolationOutcome::Confirmed));
}

#[test]
fn an_isolation_that_stops_holding_releases_nothing_more_and_the_configured_steps_run() {
    let mut world = isolated_by_its_agent();
    assert!(world.status().confirmed_at.is_some());
    // The pods are still bound, and the agent reports the isolation broken.
    world.isolation_state = IsolationState::Failed;
    world.isolated = false;
    world.hear();
    world.advance(1);
    world.reconcile();
    let status = world.status().clone();
    assert_eq!(
        status.self_isolation.as_ref().and_then(|i| i.outcome),
        Some(IsolationOutcome::Broken)
    );
    assert!(status.confirmed_at.is_none(), "nothing more rests on it");
    assert!(world.events().contains(&"IsolationBroken"));
    world.run(5, 5);
    assert!(
        world
            .started()
            .first()
            .is_some_and(|name| name.starts_with("isolation-")),
        "{:?}",
        world.started()
    );
}

#[test]
fn the_isolation_is_ended_once_no_pod_that_needs_fencing_is_left_whatever_else_runs() {
    let mut world = isolated_by_its_agent();
    // A DaemonSet pod stays bound; the StatefulSet pod is gone; the partition heals.
    world.facts.runs_pods_needing_fencing = false;
    world.facts.pods_to_release = 1;
    world.channels = Some((true, true));
    world.hear();
    world.run(3, 5);
    world.reconcile();
    assert!(world.asked().contains(&Instruction::EndIsolation));
}

#[test]
fn an_isolation_ends_only_after_the_agent_steadily_reaches_the_api_server() {
    let mut world = isolated_by_its_agent();
    world.facts.runs_pods_needing_fencing = false;
    world.facts.pods_to_release = 0;
    let ends = |world: &World| world.asked().contains(&Instruction::EndIsolation);
    // The first reports that the agent reaches the API server again: not yet.
    world.channels = Some((true, true));
    world.hear();
    world.run(2, 5);
    world.reconcile();
    assert!(!ends(&world), "10 s of reaching it is not enough");
    // The link flaps: one report says unreachable, and the wait starts over.
    world.channels = Some((false, true));
    world.advance(2);
    world.reconcile();
    world.channels = Some((true, true));
    world.advance(2);
    world.run(2, 5);
    world.reconcile();
    assert!(!ends(&world), "10 s since the flap is not enough");
    world.advance(5);
    world.reconcile();
    assert!(ends(&world), "15 s of reaching it ends the isolation");
}

#[test]
fn an_isolation_that_fails_or_never_comes_falls_back_to_the_configured_steps() {
    for (fate, reason, outcome) in [
        (
            IsolationFate::Fails,
            "IsolationFailed",
            IsolationOutcome::Failed,
        ),
        (
            IsolationFate::Silent,
            "IsolationTimedOut",
            IsolationOutcome::TimedOut,
        ),
    ] {
        let mut world = World::new(full_plan(), false);
        world.isolation_fate = fate;
        world.set_channels(Some((false, true)));
        world.advance(20);
        world.reconcile();
        world.run(20, 10);
        let status = world.status().clone();
        assert_eq!(
            status.self_isolation.as_ref().and_then(|i| i.outcome),
            Some(outcome),
            "{fate:?}"
        );
        assert!(world.events().contains(&reason), "{:?}", world.events());
        assert!(
            world
                .started()
                .first()
                .is_some_and(|name| name.starts_with("isolation-")),
            "the configured steps run: {:?}",
            world.started()
        );
        if fate == IsolationFate::Silent {
            // Not before isolationTimeout.
            let requested = status
                .self_isolation
                .as_ref()
                .expect("asked")
                .requested_at
                .0;
            let decided = status
                .self_isolation
                .as_ref()
                .expect("asked")
                .decided_at
                .clone();
            assert!(decided.is_some_and(|at| at.0 >= requested + world.policy.isolation_timeout));
        }
    }
}

#[test]
fn a_node_heard_again_mid_fence_gets_no_further_step() {
    let mut world = World::new(full_plan(), false);
    world.set_channels(Some((false, false)));
    world.advance(20);
    world.reconcile();
    assert_eq!(world.started(), ["isolation-t1-a1-scsi-act1"]);
    // The isolation finishes; then the agent is heard again, the Lease still silent.
    world.advance(1);
    world.set_channels(Some((false, true)));
    world.run(20, 30);
    let power_steps: Vec<_> = world
        .started()
        .into_iter()
        .filter(|name| name.starts_with("powermanagement"))
        .collect();
    assert!(power_steps.is_empty(), "{power_steps:?}");
    assert_eq!(
        world.status().pause.as_ref().map(|pause| pause.reason),
        Some(PauseReason::NodeAlive)
    );
    assert!(
        world.status().confirmed_at.is_some(),
        "what the isolation proved stays proven"
    );
}

#[test]
fn without_an_agent_the_ready_condition_rule_is_unchanged() {
    let mut world = World::new(full_plan(), false);
    world.now = at(59);
    world.reconcile();
    assert!(world.started().is_empty());
    world.now = at(60);
    world.reconcile();
    assert_eq!(world.started(), ["isolation-t1-a1-scsi-act1"]);
    assert_eq!(
        world.status().lost.as_ref().map(|lost| lost.evidence),
        Some(Evidence::NotReady)
    );
}

/// A Ready node with a reporting agent and a kubelet renewing its Lease, that drains
/// cleanly and powers itself off at `at(10)`.
fn drained_world(plan: PlanOutline) -> World {
    let mut world = World::new(plan, false);
    world.policy.unhealthy_duration = Duration::from_secs(300);
    world.set_ready(true);
    world.set_channels(Some((true, true)));
    world.advance(10);
    world.drain(false);
    world
}

fn taint_actions(world: &World) -> Vec<TaintChange> {
    world
        .log
        .iter()
        .flat_map(|d| d.actions.iter())
        .filter_map(|a| match a {
            Action::Taint(change) => Some(*change),
            _ => None,
        })
        .collect()
}

#[test]
fn a_node_that_drained_cleanly_is_released_once_its_agent_and_kubelet_stopped_without_any_power_action()
 {
    let mut world = drained_world(full_plan());
    // Its agent reported every 2 s and its kubelet renewed every 10 s: the agent has
    // missed three reports after 6 s, the kubelet a renewal (with 2 s of slack) after 12.
    world.advance(11);
    // (The node watch creates the fence when the node is due; this world's fence exists
    // from the start, so the judgement is asked directly.)
    let judged = |world: &World| {
        judge(
            &world.facts.health,
            &world.facts.liveness,
            &world.policy,
            world.now,
        )
    };
    assert!(
        matches!(judged(&world), NodeState::Held { .. }),
        "one second before its kubelet counts as stopped, it is not lost: {:?}",
        judged(&world)
    );
    world.advance(1);
    assert!(matches!(
        judged(&world),
        NodeState::Lost {
            evidence: Evidence::Drained,
            ..
        }
    ));
    world.reconcile();
    world.run(10, 5);
    assert!(world.started().is_empty(), "{:?}", world.started());
    assert_eq!(world.power_offs, 0);
    let status = world.status().clone();
    assert_eq!(
        status.lost.as_ref().map(|lost| lost.evidence),
        Some(Evidence::Drained)
    );
    assert_eq!(status.confirmed_at.as_ref().map(|t| t.0), Some(at(22)));
    let proof = status.confirmed_by.clone().unwrap_or_default();
    assert!(
        proof.contains("drained cleanly") && proof.contains("silent for 12s"),
        "{proof}"
    );
    assert_eq!(status.phase, Some(FencePhase::Done));
    assert!(world.facts.taints.out_of_service && world.facts.taints.remediation);
    assert!(
        world.events().contains(&"NodeDrained"),
        "{:?}",
        world.events()
    );
    assert!(world.fence.is_some(), "kept while the node is away");
}

#[test]
fn a_drained_node_needs_no_fence_device() {
    let mut world = drained_world(full_plan());
    world.facts.plan = Err("no ConfigMap fence-config-worker-1".to_string());
    world.advance(20);
    world.reconcile();
    assert!(world.status().is_drained());
    assert!(world.facts.taints.out_of_service);
}

#[test]
fn the_storm_guard_and_the_zone_rate_hold_back_a_drained_release() {
    let mut world = drained_world(full_plan());
    world.advance(20);
    world.guard.storm = Some(storm("half the nodes are silent"));
    world.run(3, 5);
    assert!(!world.facts.taints.out_of_service);
    assert_eq!(
        world.status().pause.as_ref().map(|p| p.reason),
        Some(PauseReason::StormGuard)
    );
    world.guard = Guard::open();
    world.guard.zone = Some(GuardBlock {
        reason: PauseReason::ZoneRateLimit,
        message: "zone".to_string(),
        until: None,
    });
    world.run(2, 5);
    assert!(!world.facts.taints.out_of_service);
    world.guard = Guard::open();
    world.run(2, 5);
    assert!(world.facts.taints.out_of_service);
    assert!(world.started().is_empty());
}

#[test]
fn a_drained_statement_older_than_its_bound_releases_nothing() {
    let mut world = drained_world(full_plan());
    world.guard.storm = Some(storm("storm"));
    // The storm lasts past drainedReportMaxAge (2 minutes after the last report).
    world.advance(20);
    world.run(30, 5);
    assert!(!world.facts.taints.out_of_service);
    world.guard = Guard::open();
    world.run(40, 5);
    // Judged as a silent node now, whose pods are gone: nothing to fence for, and the
    // old word releases nothing.
    assert!(world.fence.is_none(), "cancelled");
    assert!(
        taint_actions(&world).is_empty(),
        "{:?}",
        taint_actions(&world)
    );
    assert!(world.events().contains(&"FenceCancelled"));
}

#[test]
fn the_drained_fast_path_can_be_turned_off() {
    let mut world = drained_world(full_plan());
    world.policy.drained_report_max_age = Duration::ZERO;
    world.advance(12);
    world.reconcile();
    assert!(
        world.fence.is_none(),
        "not lost yet, and no pods: cancelled"
    );
    assert!(taint_actions(&world).is_empty());
}

#[test]
fn a_drained_node_back_from_its_reboot_has_its_taints_removed_and_nothing_recovered() {
    let mut world = drained_world(full_plan());
    world.advance(20);
    world.run(3, 5);
    assert!(world.facts.taints.out_of_service);
    // The node boots again: a new boot, its kubelet and agent speak, it turns Ready.
    world.devices.power_on = true;
    world.drained = None;
    world.set_channels(Some((true, true)));
    world.set_ready(true);
    world.run(10, 5);
    assert!(world.started().is_empty(), "{:?}", world.started());
    assert!(!world.facts.taints.out_of_service && !world.facts.taints.remediation);
    assert!(
        world.fence.is_none(),
        "the fence ends once its taints are gone"
    );
    let changes = taint_actions(&world);
    assert!(
        changes.contains(&TaintChange::RemoveOutOfService),
        "{changes:?}"
    );
}

#[test]
fn a_drained_node_with_neither_pods_nor_volumes_has_nothing_to_release() {
    let mut world = drained_world(full_plan());
    world.facts.volumes_attached = 0;
    world.advance(20);
    let decision = world.reconcile().expect("a decision").clone();
    assert!(decision.actions.contains(&Action::DeleteFence));
}

#[test]
fn pods_still_bound_to_a_node_that_said_it_drained_get_the_normal_fence_once_it_is_silent() {
    let mut world = World::new(full_plan(), false);
    world.policy.unhealthy_duration = Duration::from_secs(300);
    world.set_ready(true);
    world.set_channels(Some((true, true)));
    world.advance(10);
    world.drain(true);
    // Gone by its word at 22, silent only at 30.
    world.advance(12);
    world.reconcile();
    assert!(world.started().is_empty());
    assert!(!world.facts.taints.out_of_service);
    let pause = world.status().pause.clone().expect("paused");
    assert_eq!(pause.reason, PauseReason::DrainContradicted);
    assert_eq!(pause.until.map(|t| t.0), Some(at(30)));
    world.advance(8);
    world.reconcile();
    assert_eq!(world.started(), ["isolation-t1-a1-scsi-act1"]);
    assert_eq!(
        world.status().lost.as_ref().map(|lost| lost.evidence),
        Some(Evidence::Silence)
    );
}

#[test]
fn a_drained_node_still_reading_ready_to_a_restarted_controller_is_not_taken_for_back() {
    let mut world = drained_world(full_plan());
    world.advance(20);
    world.run(2, 1);
    assert!(world.facts.taints.out_of_service);
    // The node lifecycle controller has not noticed yet: Ready, as it read before the
    // shutdown. A restarted controller has heard no report yet.
    world.facts.health = NodeHealth {
        readiness: Readiness::Ready,
        since: Some(at(-500)),
    };
    world.facts.liveness = Liveness::AgentUnknown { until: at(100) };
    world.channels = None;
    world.run(5, 5);
    assert!(world.facts.taints.out_of_service, "still out of service");
    assert!(world.fence.is_some());
    // Ready again after the release (the node booted, without its agent): back.
    world.facts.health = NodeHealth {
        readiness: Readiness::Ready,
        since: Some(world.now),
    };
    world.run(5, 5);
    assert!(!world.facts.taints.out_of_service);
    assert!(world.fence.is_none());
}

#[test]
fn a_forced_fence_of_a_drained_node_runs_its_steps() {
    let mut world = drained_world(full_plan());
    world.fence.as_mut().expect("fence").spec.force = true;
    world.advance(20);
    world.reconcile();
    assert_eq!(world.started(), ["isolation-t1-a1-scsi-act1"]);
}

/// Something that can happen between two reconciles.
#[derive(Debug, Clone)]
enum Happening {
    Time(u64),
    Ready(bool),
    Storm(bool),
    ZoneBlocked(bool),
    Restart {
        agent_acted: bool,
    },
    NextAgent(Fate),
    ConfigGone(bool),
    /// The node has an agent with these channels speaking (Lease, reports), or none.
    Channels(Option<(bool, bool)>),
    /// The node drains, says it did, and powers itself off; with `true`, pods that need
    /// fencing are still bound to it.
    Drain(bool),
    /// What the node's agent does when asked to isolate the node.
    Isolation(IsolationFate),
    /// The node's kernel crashes into its crash kernel (`true`), or its dump ends and its
    /// notifications stop (`false`).
    Crash(bool),
    /// The node's agent promises self-isolation within this many seconds, or withdraws.
    Promise(Option<u64>),
    /// The node boots again.
    Reboot,
    /// The controller's Lease watch stalls (`true`) or recovers.
    WatchStalled(bool),
}

fn happening() -> impl Strategy<Value = Happening> {
    prop_oneof![
        4 => (1u64..200).prop_map(Happening::Time),
        1 => any::<bool>().prop_map(Happening::Ready),
        1 => any::<bool>().prop_map(Happening::Storm),
        1 => any::<bool>().prop_map(Happening::ZoneBlocked),
        1 => any::<bool>().prop_map(|agent_acted| Happening::Restart { agent_acted }),
        2 => prop_oneof![
            Just(Fate::Works),
            Just(Fate::Fails),
            any::<bool>().prop_map(Fate::TimesOut),
            Just(Fate::Unconfirmed),
        ]
        .prop_map(Happening::NextAgent),
        1 => any::<bool>().prop_map(Happening::ConfigGone),
        2 => proptest::option::of((any::<bool>(), any::<bool>())).prop_map(Happening::Channels),
        1 => any::<bool>().prop_map(Happening::Drain),
        1 => prop_oneof![
            Just(IsolationFate::Works),
            Just(IsolationFate::Fails),
            Just(IsolationFate::Silent),
        ]
        .prop_map(Happening::Isolation),
        1 => any::<bool>().prop_map(Happening::Crash),
        1 => proptest::option::of(30u64..300).prop_map(Happening::Promise),
        1 => Just(Happening::Reboot),
        1 => any::<bool>().prop_map(Happening::WatchStalled),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// For any sequence of health changes, agent results, storms and restarts: nothing is
    /// released before a real fence, one execution at a time, the guard holds, repeats
    /// happen only after `status` showed nothing happened, retries stay bounded (all
    /// checked in `World::check` on every decision), and the fence always settles.
    #[test]
    fn the_safety_rules_hold_under_any_interleaving(
        happenings in proptest::collection::vec(happening(), 1..60),
        force in any::<bool>(),
        isolation in any::<bool>(),
        kdump in any::<bool>(),
        device in any::<bool>(),
        promise in proptest::option::of(30u64..300),
    ) {
        let mut plan = full_plan();
        plan.kdump = kdump;
        if !isolation {
            plan.steps.remove(&Step::Isolation);
        }
        let mut world = World::new(plan.clone(), force);
        if !device {
            world.facts.plan = Err("no fence-config".to_string());
        }
        if let Some(within) = promise {
            // An agent that reports, and promises self-isolation.
            world.promise = Some(Duration::from_secs(within));
            world.set_channels(Some((true, true)));
        }
        for happening in happenings {
            match happening {
                Happening::Time(seconds) => world.advance(seconds),
                Happening::Ready(ready) => world.set_ready(ready),
                Happening::Storm(on) => {
                    world.guard.storm = on.then(|| storm("storm"))
                }
                Happening::ZoneBlocked(on) => {
                    world.guard.zone = on.then(|| GuardBlock {
                        reason: PauseReason::ZoneRateLimit,
                        message: "zone".to_string(),
                        until: None,
                    })
                }
                Happening::Restart { agent_acted } => world.restart(agent_acted),
                Happening::NextAgent(fate) => world.fates.push(fate),
                Happening::Channels(channels) => world.set_channels(channels),
                Happening::Drain(pods_left) => world.drain(pods_left),
                Happening::Isolation(fate) => world.isolation_fate = fate,
                Happening::Crash(true) => world.crash(),
                Happening::Crash(false) => world.kdump_sending = false,
                Happening::Promise(within) => {
                    world.promise = within.map(Duration::from_secs);
                    world.hear();
                }
                Happening::Reboot => world.reboot(),
                Happening::WatchStalled(stalled) => {
                    world.watch_stalled = stalled;
                    world.hear();
                }
                Happening::ConfigGone(gone) => {
                    world.facts.plan = if gone {
                        Err("gone".to_string())
                    } else {
                        Ok(plan.clone())
                    }
                }
            }
            if world.reconcile().is_none() {
                break;
            }
        }
        // Calm world, working agents: the fence settles within a bounded number of rounds
        // (no endless loop), with nothing left running.
        world.guard = Guard::open();
        world.facts.plan = Ok(plan.clone());
        world.fates.clear();
        let executions_before = world.started().len();
        world.run(400, 60);
        if let Some(fence) = &world.fence {
            let status = fence.status.clone().unwrap_or_default();
            prop_assert!(status.executions.iter().all(|e| e.result.is_some()));
            let last = world.log.last().expect("decisions");
            prop_assert!(
                !last.actions.iter().any(|a| matches!(a, Action::Start(_))),
                "still starting executions after 400 rounds: {:?}", status
            );
        }
        // Bounded work: steps × attempts × alternatives × (acts + verifies) per restart.
        let bound = 3 * (world.policy.retry_limit as usize + 1) * 2 * 5 * (world.restarts + 1);
        prop_assert!(world.started().len() <= bound + executions_before,
            "{} executions", world.started().len());
    }
}

/// A node with an agent but no fence device, whose agent promises (over TLS) to isolate
/// or reset it within `within` seconds of losing contact; heard on both channels at 10 s.
fn promising_world(within: u64) -> World {
    let mut world = World::new(full_plan(), false);
    world.facts.plan = Err("no fence-config-worker-1 ConfigMap".to_string());
    world.promise = Some(Duration::from_secs(within));
    world.set_ready(true);
    world.set_channels(Some((true, true)));
    world.advance(10);
    world
}

/// The node falls silent on both channels (its power and network are gone, say).
fn fall_silent(world: &mut World) -> Timestamp {
    let last_heard = world.now;
    world.set_channels(Some((false, false)));
    world.set_ready(false);
    last_heard
}

/// When a node last heard at `last` with a promise of `within` seconds is released with
/// the default margin (30 s): one per cent of the promise on top, rounded up.
fn released_at(last: Timestamp, within: u64) -> Timestamp {
    last + Duration::from_secs(within + 30 + within.div_ceil(100))
}

fn pause_reason(world: &World) -> Option<PauseReason> {
    world.status().pause.as_ref().map(|pause| pause.reason)
}

#[test]
fn a_node_with_no_fence_device_is_released_once_its_agents_promise_has_run_out() {
    let mut world = promising_world(160);
    let last_heard = fall_silent(&mut world);
    let release_at = released_at(last_heard, 160);
    // Silent for silenceTimeout: lost, and the promise recorded.
    world.advance(25);
    world.reconcile();
    assert_eq!(
        pause_reason(&world),
        Some(PauseReason::WaitingForSelfIsolation)
    );
    let record = world
        .status()
        .promise
        .clone()
        .expect("the promise recorded");
    assert_eq!(record.within_seconds, 160);
    assert_eq!(record.last_heard.0, last_heard);
    assert_eq!(record.release_at.0, release_at);
    // Nothing is released while the promise runs, though the agent keeps it early.
    while world.now < release_at - Duration::from_secs(5) {
        world.advance(5);
        world.reconcile();
        assert!(
            !world.facts.taints.out_of_service,
            "released at {}",
            world.now
        );
    }
    assert!(
        world.isolated,
        "the agent isolated the node when its promise said"
    );
    world.advance(5);
    world.reconcile();
    assert!(world.facts.taints.out_of_service);
    let status = world.status();
    assert!(
        status
            .confirmed_by
            .as_deref()
            .is_some_and(|by| by.starts_with("self-isolation:") && by.contains("160s")),
        "{status:?}"
    );
    assert!(world.events().contains(&"SelfIsolationPromiseRanOut"));
    assert!(world.started().is_empty(), "no fence device was used");
}

#[test]
fn no_promise_no_release_without_a_fence_device() {
    // No promise at all, a promise withdrawn by the last report, one over plain HTTP, one
    // the policy does not take, and a forced fence: held for want of a fence device.
    type Change = Box<dyn Fn(&mut World)>;
    let cases: Vec<(&str, Change)> = vec![
        ("none", Box::new(|world| world.promise = None)),
        (
            "withdrawn",
            Box::new(|world| {
                world.promise = None;
                world.hear();
            }),
        ),
        ("plain http", Box::new(|world| world.over_tls = false)),
        (
            "margin 0s",
            Box::new(|world| world.policy.self_isolation_margin = Duration::ZERO),
        ),
        (
            "forced",
            Box::new(|world| world.fence.as_mut().expect("fence").spec.force = true),
        ),
    ];
    for (case, change) in cases {
        let mut world = promising_world(60);
        change(&mut world);
        world.hear();
        fall_silent(&mut world);
        world.run(100, 10);
        assert!(!world.facts.taints.out_of_service, "{case}: released");
        assert_eq!(
            pause_reason(&world),
            Some(PauseReason::NoConfiguration),
            "{case}"
        );
        assert!(world.status().promise.is_none(), "{case}");
    }
}

#[test]
fn a_lease_renewal_heard_while_waiting_moves_the_release_later() {
    let mut world = promising_world(60);
    fall_silent(&mut world);
    world.advance(25);
    world.reconcile();
    let first = world
        .status()
        .promise
        .clone()
        .expect("recorded")
        .release_at
        .0;
    // The kubelet renews once more (the agent sees that renewal too, and counts its
    // promise from it): the release moves.
    world.advance(30);
    world.set_channels(Some((true, false)));
    let renewed = world.now;
    world.set_channels(Some((false, false)));
    world.reconcile();
    world.advance(25);
    world.reconcile();
    let moved = world
        .status()
        .promise
        .clone()
        .expect("recorded")
        .release_at
        .0;
    assert_eq!(moved, released_at(renewed, 60));
    assert!(moved > first);
    world.now = first + Duration::from_secs(1);
    world.reconcile();
    assert!(
        !world.facts.taints.out_of_service,
        "released at the old time"
    );
    world.now = moved;
    world.hear();
    world.keep_promise();
    world.reconcile();
    assert!(world.facts.taints.out_of_service);
}

#[test]
fn a_restarted_controller_keeps_the_recorded_promise_and_counts_from_when_it_began_listening() {
    let mut world = promising_world(60);
    fall_silent(&mut world);
    world.advance(25);
    world.reconcile();
    let recorded = world.status().promise.clone().expect("recorded");
    // The new leader has heard no report of the node: first not known, then no agent.
    // It has seen no renewal of the Lease either: silent since it began listening.
    world.restart(false);
    let listening_since = world.now;
    world.channels = None;
    world.facts.liveness = Liveness::AgentUnknown {
        until: world.now + Duration::from_secs(40),
    };
    world.facts.lease_heard = Some(listening_since);
    world.reconcile();
    assert_eq!(
        pause_reason(&world),
        Some(PauseReason::WaitingForAgentReports)
    );
    world.advance(40);
    world.facts.liveness = Liveness::NoAgent;
    world.policy.unhealthy_duration = Duration::from_secs(10);
    world.reconcile();
    assert_eq!(
        pause_reason(&world),
        Some(PauseReason::WaitingForSelfIsolation)
    );
    let kept = world.status().promise.clone().expect("kept");
    assert_eq!(kept.within_seconds, recorded.within_seconds);
    assert_eq!(kept.boot_id, recorded.boot_id);
    assert_eq!(kept.release_at.0, released_at(listening_since, 60));
    assert!(kept.release_at.0 > recorded.release_at.0);
    // Until then nothing is released (the agent kept its promise long before).
    while world.now < kept.release_at.0 - Duration::from_secs(5) {
        world.advance(5);
        world.reconcile();
        assert!(
            !world.facts.taints.out_of_service,
            "released at {}",
            world.now
        );
    }
    assert!(world.isolated);
    world.advance(5);
    world.reconcile();
    assert!(world.facts.taints.out_of_service);
}

#[test]
fn a_promise_of_an_earlier_boot_or_a_renewal_the_lease_watch_missed_releases_nothing() {
    // The node booted again (its kubelet reported the new boot) before it fell silent:
    // the promise its old boot's agent made covers nothing the new boot runs.
    let mut world = promising_world(60);
    world.facts.boot_id = Some("boot-2".to_string());
    fall_silent(&mut world);
    world.run(30, 10);
    assert!(!world.facts.taints.out_of_service);
    assert_eq!(pause_reason(&world), Some(PauseReason::NoConfiguration));
    let status = world.status();
    let message = status
        .pause
        .as_ref()
        .map(|p| p.message.clone())
        .unwrap_or_default();
    assert!(message.contains("boot"), "{message}");

    // The Lease read afresh shows a renewal the watch did not deliver: heard now, and
    // counted again; a Lease that cannot be read releases nothing.
    let mut world = promising_world(60);
    fall_silent(&mut world);
    world.advance(100);
    world.facts.lease_unchanged = Some(false);
    world.reconcile();
    assert!(!world.facts.taints.out_of_service);
    let moved = world.status().promise.clone().expect("recorded");
    assert_eq!(moved.last_heard.0, world.now);
    world.advance(200);
    world.facts.lease_unchanged = None;
    world.reconcile();
    assert!(!world.facts.taints.out_of_service);
    world.facts.lease_unchanged = Some(true);
    world.reconcile();
    assert!(world.facts.taints.out_of_service);
}

#[test]
fn the_storm_guard_holds_a_release_on_a_promise() {
    let mut world = promising_world(60);
    fall_silent(&mut world);
    world.guard.storm = Some(storm("half the nodes are silent"));
    world.run(30, 10);
    assert!(!world.facts.taints.out_of_service);
    assert_eq!(pause_reason(&world), Some(PauseReason::StormGuard));
    world.guard = Guard::open();
    world.reconcile();
    assert!(world.facts.taints.out_of_service);
}

#[test]
fn a_node_back_from_its_self_isolation_is_told_to_end_it_and_the_fence_ends() {
    let mut world = promising_world(60);
    fall_silent(&mut world);
    world.run(20, 10);
    assert!(world.facts.taints.out_of_service);
    assert!(world.isolated);
    // Kubernetes deletes the pods of the out-of-service node.
    world.facts.runs_pods_needing_fencing = false;
    world.facts.pods_to_release = 0;
    // The node is reached again: its agent reports, isolated, the kubelet still stopped.
    world.set_channels(Some((true, true)));
    world.run(3, 2);
    assert!(
        world.fence.is_some(),
        "not back while its kubelet is stopped"
    );
    // Once its agent has reached the API server for a while, the isolation is ended; the
    // kubelet starts and the node is Ready again.
    world.run(12, 2);
    assert!(!world.isolated, "asked: {:?}", world.asked());
    world.set_ready(true);
    world.run(5, 2);
    assert!(world.fence.is_none());
    assert!(!world.facts.taints.out_of_service);
}

#[test]
fn a_fence_waiting_on_a_promise_settles_its_status_and_says_nothing_twice() {
    let mut world = promising_world(60);
    fall_silent(&mut world);
    world.advance(25);
    world.reconcile();
    world.reconcile();
    let first = world.status().clone();
    // Nothing happened since: the same status (as stored), no Event.
    let again = world.reconcile().expect("a decision").clone();
    assert_eq!(again.status, first, "the status is a fixed point");
    assert!(again.events.is_empty(), "{:?}", again.events);
    assert_eq!(
        world
            .events()
            .iter()
            .filter(|e| **e == "NodeSilent")
            .count(),
        1
    );
}
