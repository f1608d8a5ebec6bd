//! The NodeFence custom resource, `fencing.nodekeeper.io/v1alpha1`: one per node, named
//! after the node. Its status is the controller's whole memory: the step and phase, every
//! agent execution started (written before the agent starts), retries, the confirmation
//! that makes releasing the node's pods safe, and why a fence is paused. A controller that
//! restarts at any instant reads it back and continues where the last one stopped.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use kube::core::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::fencing::{FenceAction, PowerState, Step};

/// The API group of nodekeeper's fencing resources.
pub const GROUP: &str = "fencing.nodekeeper.io";
/// The field manager of every write the controller makes.
pub const FIELD_MANAGER: &str = "nodekeeper-controller";
/// At most this many executions are kept in a status; the oldest finished ones of earlier
/// steps go first, so a status stays far below the API server's object size limit.
pub const MAX_EXECUTIONS: usize = 64;

/// Fence one node: isolate it, power-manage it, and recover it when it comes back.
// The kube derive takes one `printcolumn(...)` per column, which clippy reads as the same
// attribute repeated.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "fencing.nodekeeper.io",
    version = "v1alpha1",
    kind = "NodeFence",
    plural = "nodefences",
    singular = "nodefence",
    shortname = "nf",
    category = "nodekeeper",
    status = "NodeFenceStatus",
    derive = "PartialEq",
    doc = "A fence of one node (named after it) through ClusterLabs fence agents, driven by the node-fencing ConfigMaps. Created by nodekeeper controller for a lost node, or by an operator with spec.force to fence a node by hand.",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
    printcolumn(name = "Step", type_ = "string", json_path = ".status.step"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Last Result",
        type_ = "string",
        json_path = ".status.lastResult"
    ),
    printcolumn(
        name = "Paused",
        type_ = "string",
        json_path = ".status.pause.reason",
        priority = "1"
    ),
    printcolumn(
        name = "Retries",
        type_ = "integer",
        json_path = ".status.retries",
        priority = "1"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeFenceSpec {
    /// The node to fence; by convention also the resource's name.
    pub node_name: String,
    /// Fence even though the node has not been unhealthy for `unhealthyDuration`, and
    /// whether or not it runs pods that need fencing. Every other rule still holds: the
    /// exclusion label, the storm guard, the zone rate limit, a confirmed fence before any
    /// pod is released.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
}

/// The three steps of the original design.
#[derive(
    Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum FenceStep {
    Isolation,
    PowerManagement,
    Recovery,
}

impl From<Step> for FenceStep {
    fn from(step: Step) -> FenceStep {
        match step {
            Step::Isolation => FenceStep::Isolation,
            Step::PowerManagement => FenceStep::PowerManagement,
            Step::Recovery => FenceStep::Recovery,
        }
    }
}

impl From<FenceStep> for Step {
    fn from(step: FenceStep) -> Step {
        match step {
            FenceStep::Isolation => Step::Isolation,
            FenceStep::PowerManagement => Step::PowerManagement,
            FenceStep::Recovery => Step::Recovery,
        }
    }
}

impl std::fmt::Display for FenceStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Step::from(*self).fmt(f)
    }
}

/// Where the current step stands.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
pub enum FencePhase {
    /// Not started yet (waiting, paused, or about to start).
    New,
    /// Methods are being run.
    Running,
    /// One alternative succeeded.
    Done,
    /// Every alternative failed; retried after a backoff until the retry limit.
    Error,
}

/// Whether an execution carried out the method's action or only asked the device for its
/// power state (after an execution was interrupted, so that nothing is done twice).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
pub enum ExecutionKind {
    Act,
    Verify,
}

/// How an execution ended.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
pub enum ExecutionResult {
    Succeeded,
    Failed,
    /// The deadline passed: a failure, never a success.
    TimedOut,
    /// The executor lost it (the controller restarted while it ran): whether the device
    /// acted is unknown until a `Verify` asks it.
    Interrupted,
}

/// A power state as `status` reported it.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
pub enum PowerSeen {
    On,
    Off,
}

impl From<PowerState> for PowerSeen {
    fn from(state: PowerState) -> PowerSeen {
        match state {
            PowerState::On => PowerSeen::On,
            PowerState::Off => PowerSeen::Off,
        }
    }
}

/// The action a method takes, as written in the status.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MethodAction {
    Off,
    On,
    Reboot,
    /// Only `status`: a `Verify` execution.
    Status,
}

impl MethodAction {
    /// The action as the agents spell it.
    pub fn name(self) -> &'static str {
        match self {
            MethodAction::Off => "off",
            MethodAction::On => "on",
            MethodAction::Reboot => "reboot",
            MethodAction::Status => "status",
        }
    }
}

impl From<FenceAction> for MethodAction {
    fn from(action: FenceAction) -> MethodAction {
        match action {
            FenceAction::Off => MethodAction::Off,
            FenceAction::On => MethodAction::On,
            FenceAction::Reboot => MethodAction::Reboot,
        }
    }
}

/// One run of one fence method's agent, recorded before the agent starts.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Execution {
    /// Unique within the fence and deterministic: step, attempt, alternative, method,
    /// kind. A Job executor names its Job from it and the NodeFence's uid.
    pub name: String,
    pub step: FenceStep,
    /// 1-based: the first try of the step is attempt 1, each retry adds one.
    pub attempt: u32,
    /// 1-based alternative of the step (`|` in the configuration).
    pub alternative: u32,
    /// The method's name in the node's fence configuration.
    pub method: String,
    /// The fence agent it runs, e.g. `fence_ipmilan`.
    pub agent: String,
    pub kind: ExecutionKind,
    pub action: MethodAction,
    /// Recorded before the agent starts.
    pub started_at: Time,
    /// When the executor reported its end (or the controller found it lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<ExecutionResult>,
    /// `status` reported the power off after the action: the proof a fence needs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub off_confirmed: bool,
    /// The last power state `status` reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<PowerSeen>,
    /// One line for a person: why it failed, or what it saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Execution {
    pub fn is_finished(&self) -> bool {
        self.result.is_some()
    }
}

/// Why a fence is waiting instead of acting.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
pub enum PauseReason {
    /// More nodes are unhealthy than `maxUnhealthy` allows: maybe a partition or a
    /// control-plane failure, not dead nodes.
    StormGuard,
    /// A storm ended recently; fencing resumes after `stormCooldown`.
    StormCooldown,
    /// The zone's fence rate (the node lifecycle controller's semantics) is used up, or is
    /// zero because the zone or every zone is disrupted.
    ZoneRateLimit,
    /// The node has no usable fence configuration.
    NoConfiguration,
    /// The node carries the exclusion label.
    Excluded,
    /// Waiting for the node to be unhealthy for `unhealthyDuration`.
    WaitingForUnhealthyDuration,
    /// The node's agent said it drained cleanly, but pods that need fencing are still
    /// bound to it: it is fenced as a silent node once it is one.
    DrainContradicted,
    /// The node is not Ready, but its Lease or its agent's reports show it alive: a
    /// partitioned node is never powered off blind.
    NodeAlive,
    /// The controller started leading too recently to know whether the not-Ready node's
    /// agent still reports (`reports.reconnectGrace`).
    WaitingForAgentReports,
    /// The node is cut off from the API server and its agent was asked to isolate it:
    /// waiting for its report of the isolation, at most `isolationTimeout`.
    WaitingForIsolation,
    /// Waiting `powerManagementDelay` after isolation for the node to come back by itself.
    WaitingForPowerManagementDelay,
    /// The node announced its crash kernel (kdump): the power step waits for the dump to
    /// finish, while its notifications keep coming and at most `kdumpWait`.
    WaitingForKdump,
    /// A node with no fence device whose agent promised to isolate (or reset) it by
    /// itself, backed by its watchdog: its pods are released once the promise has run
    /// out, plus `selfIsolationMargin`.
    WaitingForSelfIsolation,
    /// Waiting for the retry backoff.
    RetryBackoff,
    /// The node object is gone.
    NodeGone,
    /// The resource's name is not its `spec.nodeName`: one fence per node is guaranteed
    /// by naming, so a fence named otherwise is never acted on.
    NameMismatch,
    /// The power step confirmed the node off, yet the node is back on the boot it ran
    /// before the power-off: the power-off did not reach this machine (a fence device of
    /// another), or its device said off wrongly. Recovery waits for the node to boot
    /// again; its pods stay released and its taints stay.
    PowerOffContradicted,
}

/// A fence that is waiting, with the reason and when it may go on (if known).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pause {
    pub reason: PauseReason,
    /// What holds the fence back, for a person.
    pub message: String,
    /// Paused for this reason since then.
    pub since: Time,
    /// When the pause ends by itself, if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Time>,
}

/// What made the controller take the node for lost, and since when it was in trouble.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LostRecord {
    /// `NotReady` (the Ready condition for `unhealthyDuration`), `Silence` (the node's
    /// Lease and its agent's reports both silent for `silenceTimeout`), `Drained` (the
    /// same silence after the agent reported a clean drain) or `Partitioned` (not Ready,
    /// its Lease silent, its agent still reporting).
    pub evidence: crate::controller::liveness::Evidence,
    /// When the Ready condition turned, or when the node was last heard.
    pub since: Time,
}

/// Everything the controller knows about a fence.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeFenceStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<FenceStep>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<FencePhase>,
    /// When the current step entered its current phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_since: Option<Time>,
    /// Retries of the current step so far (the attempt is `retries + 1`).
    #[serde(default)]
    pub retries: u32,
    /// When the first method of the fence started; the zone rate limit counts these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// The node's zone when the fence started, for the zone rate limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Why the node was taken for lost when the fence began (not set for a forced fence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<LostRecord>,
    /// When a step's winning alternative proved the node off or its storage isolated;
    /// the node's pods may be released only once this is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed_at: Option<Time>,
    /// The step and methods whose results are that proof.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed_by: Option<String>,
    /// When the out-of-service taint was first asked for; only a taint recorded here is
    /// ever removed by the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_of_service_at: Option<Time>,
    /// When the controller first deleted the node's pods (the optional cluster fence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_deleted_at: Option<Time>,
    /// Recovery finished and the taints were asked to go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered_at: Option<Time>,
    /// The node's isolation by its own agent, for a node cut off from the API server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_isolation: Option<SelfIsolation>,
    /// The node's kdump notifications, once they confirmed the fence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kdump: Option<KdumpRecord>,
    /// The self-isolation promise the fence rests on (a node with no fence device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promise: Option<PromiseRecord>,
    /// The boot the node ran when the power step's last action began: its agent's, while
    /// it reported over TLS, else the one its kubelet last reported
    /// (`status.nodeInfo.bootID`); cleared when the step succeeds without confirming the
    /// power off. A node powered off can only come back on another boot: after a
    /// power-off the device confirmed, recovery waits until the node reports a different
    /// one, and an agent or kubelet heard from this one pauses the fence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_off_boot: Option<String>,
    /// Why the fence is waiting, if it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<Pause>,
    /// The last execution's outcome in a few words, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_result: Option<String>,
    #[serde(default)]
    pub executions: Vec<Execution>,
    /// `Paused`, `Confirmed` and `Failed`, with the usual meaning of status and reason.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A crashed node's kdump notifications (`fence_kdump_send` from its crash kernel), as the
/// controller heard them: they confirmed the fence, and hold the power step back while
/// they keep coming.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KdumpRecord {
    /// The node's InternalIP they came from.
    pub from: String,
    /// The first notification of the run that confirmed the fence.
    pub first_heard: Time,
    /// The latest notification heard.
    pub last_heard: Time,
    /// Notifications heard in that run.
    pub notifications: u64,
}

/// How `confirmedBy` begins for a fence released on a self-isolation promise.
pub const PROMISE_PROOF: &str = "self-isolation:";

/// A node's self-isolation promise as the fence recorded it, so a restarted controller
/// still knows it: no pod process of the node runs later than `withinSeconds` after the
/// agent last heard from the controller, which is no later than `lastHeard`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PromiseRecord {
    /// The promise, in seconds.
    pub within_seconds: u64,
    /// The boot that made it (its `/proc/sys/kernel/random/boot_id`, as the Node's
    /// `status.nodeInfo.bootID` shows it): it holds for that boot only.
    pub boot_id: String,
    /// The report that made it: its boot (when it began) and sequence number.
    pub boot_time: Time,
    pub sequence: u64,
    /// The last time the controller heard the node, on either channel (moved later
    /// whenever it hears it again).
    pub last_heard: Time,
    /// `lastHeard` + the promise + `selfIsolationMargin`: the pods are released then.
    pub release_at: Time,
}

/// A partitioned node's isolation by its agent: asked for, then confirmed by the agent's
/// report, or given up (the fence falls back to its configured steps).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelfIsolation {
    /// When the agent was first asked.
    pub requested_at: Time,
    /// How it ended; unset while the fence waits for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<IsolationOutcome>,
    /// When the outcome was decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<Time>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum IsolationOutcome {
    /// The agent reported the kubelet stopped and masked and no pod process left.
    Confirmed,
    /// The agent reported it could not isolate the node, refused to, or fell silent.
    Failed,
    /// No confirmation within `isolationTimeout`.
    TimedOut,
    /// Confirmed, then the agent reported that it no longer holds.
    Broken,
}

impl SelfIsolation {
    /// Asked for and not given up: the fence waits for it or rests on it.
    pub fn is_in_force(&self) -> bool {
        matches!(self.outcome, None | Some(IsolationOutcome::Confirmed))
    }
}

impl NodeFenceStatus {
    /// The fence rests on the node's isolation by its agent (asked for, or confirmed),
    /// without a step of its own.
    pub fn is_self_isolating(&self) -> bool {
        self.step.is_none()
            && self
                .self_isolation
                .as_ref()
                .is_some_and(SelfIsolation::is_in_force)
    }

    /// The node's isolation by its agent confirmed the fence.
    pub fn is_confirmed_isolation(&self) -> bool {
        self.self_isolation
            .as_ref()
            .is_some_and(|isolation| isolation.outcome == Some(IsolationOutcome::Confirmed))
    }

    /// The node's isolation was given up: the fence runs its configured steps although
    /// the node's agent still reports.
    pub fn isolation_given_up(&self) -> bool {
        self.self_isolation
            .as_ref()
            .is_some_and(|isolation| !isolation.is_in_force())
    }

    /// The fence released a node with no fence device on its agent's self-isolation
    /// promise, without a step of its own.
    pub fn is_released_on_promise(&self) -> bool {
        self.step.is_none()
            && self.promise.is_some()
            && self
                .confirmed_by
                .as_deref()
                .is_some_and(|by| by.starts_with(PROMISE_PROOF))
    }

    /// The fence released a node that drained cleanly, without a step of its own.
    pub fn is_drained(&self) -> bool {
        self.confirmed_at.is_some()
            && self
                .lost
                .as_ref()
                .is_some_and(|lost| lost.evidence == crate::controller::liveness::Evidence::Drained)
    }
}

/// The CustomResourceDefinition as YAML, generated from these types, readable by YAML 1.1
/// parsers as well (see [`quote_for_yaml_1_1`]).
pub fn crd_yaml() -> Result<String, serde_yaml_ng::Error> {
    let crd = NodeFence::crd();
    serde_yaml_ng::to_string(&crd).map(|yaml| quote_for_yaml_1_1(&yaml))
}

/// The plain scalars YAML 1.1 reads as booleans but YAML 1.2 (our emitter) as strings,
/// apart from the `true`/`false` spellings the emitter quotes itself.
const YAML_1_1_BOOLEANS: &[&str] = &[
    "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off", "Off",
    "OFF",
];

/// Whether YAML 1.1 (as kubectl's go-yaml reads it) takes the plain scalar `text` for
/// something other than the string a YAML 1.2 parser reads: a boolean word, or a number
/// YAML 1.2 does not know as one (with `_` separators, `0b`/`0B` binary, a capital `0X`
/// or `0O`, or base 60 like `1:30`). Numbers both read alike are quoted by the emitter.
fn is_yaml_1_1_non_string(text: &str) -> bool {
    if YAML_1_1_BOOLEANS.contains(&text) {
        return true;
    }
    let unsigned = text.trim_start_matches(['-', '+']).replace('_', "");
    let all =
        |digits: &str, radix: u32| !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix));
    let number = match unsigned.get(..2) {
        Some("0x" | "0X") => all(&unsigned[2..], 16),
        Some("0o" | "0O") => all(&unsigned[2..], 8),
        Some("0b" | "0B") => all(&unsigned[2..], 2),
        _ => {
            let (whole, fraction) = match unsigned.split_once('.') {
                Some((whole, fraction)) => (whole, Some(fraction)),
                None => (unsigned.as_str(), None),
            };
            let base_60 = whole.contains(':') && whole.split(':').all(|part| all(part, 10));
            let whole_ok = all(whole, 10) || base_60 || (whole.is_empty() && fraction.is_some());
            let fraction_ok = fraction.is_none_or(|f| f.is_empty() || all(f, 10));
            let some_digit = unsigned.chars().any(|c| c.is_ascii_digit());
            whole_ok && fraction_ok && some_digit
        }
    };
    // Only what YAML 1.2 reads differently: it has no `_`, no capital prefixes, no `0b`
    // and no base 60.
    number
        && (text.contains('_')
            || text.contains(':')
            || ["0X", "0O", "0b", "0B"]
                .iter()
                .any(|prefix| unsigned.starts_with(prefix)))
}

fn single_quoted(text: &str) -> String {
    format!("'{text}'")
}

/// Quotes every plain key and value in `yaml` that a YAML 1.1 parser would not read as
/// the string it is. kubectl and kustomize parse YAML 1.1, so the enum `[off, on]` of an
/// execution's action, written plain, would reach the API server as `[false, true]` and
/// the status the controller writes (`"off"`) would not match its own schema. The
/// emitter writes one entry per line (`- `, `key: value`, `key:`), never a comment;
/// the lines of a block scalar (`|`, `>`) are text and left as they are.
fn quote_for_yaml_1_1(yaml: &str) -> String {
    let mut quoted = String::with_capacity(yaml.len());
    // The indentation of the line that opened the block scalar being read, if any.
    let mut block_opened_at: Option<usize> = None;
    for line in yaml.lines() {
        let indent = line.len() - line.trim_start().len();
        if let Some(opened_at) = block_opened_at {
            if line.trim().is_empty() || indent > opened_at {
                quoted.push_str(line);
                quoted.push('\n');
                continue;
            }
            block_opened_at = None;
        }
        let mut entry_at = indent;
        while line[entry_at..].starts_with("- ") {
            entry_at += 2;
        }
        let entry = &line[entry_at..];
        let (key, value) = match entry.find(": ") {
            Some(colon) => (Some(&entry[..colon]), Some(&entry[colon + 2..])),
            None => match entry.strip_suffix(':') {
                Some(key) => (Some(key), None),
                None => (None, Some(entry)),
            },
        };
        quoted.push_str(&line[..entry_at]);
        if let Some(key) = key {
            if is_yaml_1_1_non_string(key) {
                quoted.push_str(&single_quoted(key));
            } else {
                quoted.push_str(key);
            }
            quoted.push(':');
            if value.is_some() {
                quoted.push(' ');
            }
        }
        if let Some(value) = value {
            if value.starts_with(['|', '>']) {
                // The text is indented deeper than what holds it: the key, or the `- `
                // of a bare list entry.
                block_opened_at = Some(if key.is_some() {
                    entry_at
                } else {
                    entry_at - 2
                });
                quoted.push_str(value);
            } else if is_yaml_1_1_non_string(value) {
                quoted.push_str(&single_quoted(value));
            } else {
                quoted.push_str(value);
            }
        }
        quoted.push('\n');
    }
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crd_yaml_quotes_what_yaml_1_1_would_not_read_as_a_string() {
        let yaml = crd_yaml().unwrap();
        // The action and power enums are strings that YAML 1.1 would read as booleans.
        for quoted in ["- 'off'", "- 'on'", "- 'On'", "- 'Off'"] {
            assert!(yaml.contains(quoted), "{quoted} missing");
        }
        // Quoting changed no value for a YAML 1.2 reader (ours). kubectl's YAML 1.1
        // reading is checked by tests/manifests.rs, with Debian's kubectl.
        let ours: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
        assert_eq!(ours, serde_json::to_value(NodeFence::crd()).unwrap());
        // Nothing plain is left that YAML 1.1 reads otherwise: quoting again changes
        // nothing.
        assert_eq!(quote_for_yaml_1_1(&yaml), yaml);
    }

    #[test]
    fn keys_values_and_list_entries_are_quoted_and_block_text_is_left_alone() {
        let yaml = "\
a: off
b: offline
on: 1
- on
- 'on'
- name: no
- - N
count: 1_000
time: 1:30
bits: 0b101
hex: 0x_1F
upper: 0X1F
float: 1_0.5
port: 9849
version: 1.2.3
nested:
  description: |-
    Default: no
    - Off
    yes
  after: yes
- description: |-
    a doc comment
  enum:
  - off
- |
  - on
- on
";
        assert_eq!(
            quote_for_yaml_1_1(yaml),
            "\
a: 'off'
b: offline
'on': 1
- 'on'
- 'on'
- name: 'no'
- - 'N'
count: '1_000'
time: '1:30'
bits: '0b101'
hex: '0x_1F'
upper: '0X1F'
float: '1_0.5'
port: 9849
version: 1.2.3
nested:
  description: |-
    Default: no
    - Off
    yes
  after: 'yes'
- description: |-
    a doc comment
  enum:
  - 'off'
- |
  - on
- 'on'
"
        );
    }

    #[test]
    fn the_crd_is_cluster_scoped_with_a_status_subresource_and_printer_columns() {
        let crd = NodeFence::crd();
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.group, GROUP);
        let version = &crd.spec.versions[0];
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
        let columns: Vec<&str> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|column| column.name.as_str())
            .collect();
        assert_eq!(
            columns,
            [
                "Node",
                "Step",
                "Phase",
                "Age",
                "Last Result",
                "Paused",
                "Retries"
            ]
        );
    }

    #[test]
    fn a_status_round_trips_through_json_with_the_documented_field_names() {
        let status = NodeFenceStatus {
            step: Some(FenceStep::PowerManagement),
            phase: Some(FencePhase::Running),
            ..NodeFenceStatus::default()
        };
        let json = serde_json::to_value(&status).expect("serializable");
        assert_eq!(json["step"], "PowerManagement");
        assert_eq!(json["phase"], "Running");
        let back: NodeFenceStatus = serde_json::from_value(json).expect("deserializable");
        assert_eq!(back, status);
    }
}
