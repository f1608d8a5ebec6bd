//! The report protocol between a node's agent and the fence controller: what an agent
//! says about its node, what the controller answers, and the decoder that refuses what it
//! cannot understand. Plain data and pure functions; docs/protocol.md is the
//! specification.
//!
//! Versioning: every body carries `version: "MAJOR.MINOR"`. A decoder accepts any minor
//! version of the major it speaks (unknown fields and enum values are ignored or read as
//! `unknown`), and refuses another major version by name, so an old controller never
//! misreads a newer agent.

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// The major version this build speaks.
pub const MAJOR: u32 = 1;
/// The minor version this build writes.
pub const MINOR: u32 = 3;
/// The path reports are posted to.
pub const REPORTS_PATH: &str = "/v1/reports";
/// The largest report body the controller reads by default. A real report is about 1 KiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024;

/// `"1.3"`.
pub fn version() -> String {
    format!("{MAJOR}.{MINOR}")
}

/// One report: everything an agent knows about its node that the controller needs to
/// tell a drained node from a dead or partitioned one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentReport {
    /// `"MAJOR.MINOR"` of the protocol the body follows.
    pub version: String,
    /// The node this report is about; the credential must belong to it.
    pub node: String,
    /// `/proc/sys/kernel/random/boot_id`: a new boot starts a new sequence.
    pub boot_id: String,
    /// When this boot began (`btime` in `/proc/stat`). A report of another boot replaces
    /// the node's current one only when its boot began later, so an old report replayed
    /// or delayed can never push the live boot aside.
    pub boot_time: Timestamp,
    /// Grows with every report within one boot, also across agent restarts (it counts
    /// milliseconds since boot), so a replayed or reordered report is recognised.
    pub sequence: u64,
    /// The agent's release, for operators.
    pub agent_version: String,
    /// How often this agent reports; three intervals without a report and the node's
    /// agent counts as silent.
    pub interval_millis: u64,
    /// The agent's wall clock when it sent the report (informational: the controller
    /// times silence with its own clock).
    pub sent_at: Timestamp,
    /// Why this report was sent now.
    #[serde(default)]
    pub trigger: Trigger,
    /// The agent runs in dry-run mode: it evicts and stops nothing, so a finished
    /// shutdown does not mean its pods were stopped.
    #[serde(default)]
    pub dry_run: bool,
    /// The node conditions the agent holds true now, by their Kubernetes names
    /// (`MemoryPressure`, `DiskPressure`, `PIDPressure`).
    #[serde(default)]
    pub conditions: Vec<String>,
    #[serde(default)]
    pub shutdown: ShutdownReport,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_eviction: Option<EvictionReport>,
    #[serde(default)]
    pub api_server: ApiServerReport,
    #[serde(default)]
    pub isolation: IsolationReport,
    /// (1.3) Whether the agent isolates its node by itself once cut off, backed by a
    /// watchdog; older agents never do.
    #[serde(default)]
    pub self_isolation: SelfIsolationReport,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Trigger {
    /// The agent just started (or its controller connection came back).
    Start,
    /// The periodic report.
    #[default]
    Interval,
    /// Something in the report changed.
    Change,
    /// A value a newer minor version added.
    #[serde(other)]
    Unknown,
}

/// Graceful node shutdown as the agent runs it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownReport {
    pub state: ShutdownPhase,
    /// Whether the agent holds its logind delay lock (a node that cannot drain on
    /// shutdown shows `false`).
    #[serde(default)]
    pub lock_held: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    #[serde(default)]
    pub phases_total: u32,
    #[serde(default)]
    pub phases_done: u32,
    /// Every phase finished and the lock was released: logind may power off now.
    #[serde(default)]
    pub about_to_power_off: bool,
    /// (1.1) The shutdown finished with every pod stopped: each phase completed (or had no
    /// pods), none timed out, no pod failed to stop, and the agent is not in dry-run mode.
    /// A 1.0 agent never says so, and its reports read `false`.
    #[serde(default)]
    pub all_pods_stopped: bool,
}

impl AgentReport {
    /// The node says it drained cleanly and is about to power off: its shutdown finished
    /// with every pod stopped, the lock is released, and the agent really stopped them
    /// (not in dry-run mode). The controller's drained fast path rests on this.
    pub fn says_drained(&self) -> bool {
        let shutdown = &self.shutdown;
        !self.dry_run
            && shutdown.state == ShutdownPhase::Finished
            && shutdown.about_to_power_off
            && shutdown.all_pods_stopped
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ShutdownPhase {
    /// No shutdown in this boot.
    #[default]
    None,
    InProgress,
    /// Every phase ran; the node waits for logind to power off.
    Finished,
    /// logind cancelled the shutdown before the phases were done.
    Cancelled,
    #[serde(other)]
    Unknown,
}

/// The last pod the agent evicted (or, in dry-run mode, would have).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EvictionReport {
    /// `namespace/name`.
    pub pod: String,
    /// The eviction signal that chose it, e.g. `memory.available`.
    pub signal: String,
    pub at: Timestamp,
    #[serde(default)]
    pub dry_run: bool,
}

/// Whether the agent reaches the Kubernetes API server.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiServerReport {
    pub state: ApiServerState,
    /// When the state last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ApiServerState {
    /// The agent runs standalone, without the API.
    #[default]
    NotConfigured,
    Reachable,
    Unreachable,
    #[serde(other)]
    Unknown,
}

/// (1.2) The node's isolation: the kubelet stopped through systemd (and kept from
/// starting) and every pod process killed, done by the agent when the controller asks
/// (a node cut off from the API server but still reaching the controller). The evidence
/// is checked again for every report while the node stays isolated.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IsolationReport {
    pub state: IsolationState,
    /// When the state began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
    /// When the evidence below was last checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked_at: Option<Timestamp>,
    /// The kubelet's unit was inactive and masked (it cannot be started) at the check.
    #[serde(default)]
    pub kubelet_stopped: bool,
    /// Processes left in the pods cgroup at the check.
    #[serde(default)]
    pub pod_processes: u32,
    /// Why the isolation failed or was refused, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The `request` of the `isolate` instruction this state answers (0: none), so the
    /// controller never takes a state left from an earlier request for an answer.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub request: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

impl IsolationReport {
    /// The node says it is isolated, with the evidence to show for it: the kubelet
    /// stopped and kept from starting, and no pod process left.
    pub fn is_confirmed(&self) -> bool {
        self.state == IsolationState::Isolated && self.kubelet_stopped && self.pod_processes == 0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum IsolationState {
    /// Not isolated (1.0 and 1.1 agents always say so).
    #[default]
    None,
    /// The controller asked; the kubelet is being stopped and the pods killed.
    Isolating,
    /// Done, with the evidence in the report.
    Isolated,
    /// It could not be done, or the evidence no longer holds (see `message`).
    Failed,
    /// The agent does not isolate its node (see `message`: dry-run mode, standalone mode,
    /// isolation turned off, or the instruction came over plain HTTP).
    Refused,
    #[serde(other)]
    Unknown,
}

/// (1.3) Self-isolation, for a node with no fence device: an agent that hears neither
/// the controller nor its kubelet's Lease renewals for `isolateAfterMillis` isolates the
/// node by itself (as on the controller's instruction), reboots it if that fails, and
/// holds a watchdog that resets the node if the agent hangs. `armed` is its promise: no
/// pod process runs later than `withinMillis` after the agent's last contact, and the
/// controller, which hears the node no earlier than that contact, may release the pods
/// of a node silent for that long (and its own margin) when this promise was the last
/// thing the node said.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SelfIsolationReport {
    /// The watchdog is open and petted, and the agent will isolate or reboot the node.
    #[serde(default)]
    pub armed: bool,
    /// How long without contact before the agent isolates the node.
    #[serde(default)]
    pub isolate_after_millis: u64,
    /// The promise: no pod process later than this after the agent's last contact
    /// (`isolateAfter`, the isolation's budget, then the watchdog's timeout).
    #[serde(default)]
    pub within_millis: u64,
    /// The watchdog's timeout as the device took it.
    #[serde(default)]
    pub watchdog_timeout_millis: u64,
    /// The watchdog device and its driver's name, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watchdog: Option<String>,
    /// Why it is not armed (configured but the watchdog cannot be opened, dry-run mode,
    /// the agent is stopping), for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl SelfIsolationReport {
    /// The promise the controller may rest on, if the report makes one.
    pub fn promise(&self) -> Option<std::time::Duration> {
        let within = std::time::Duration::from_millis(self.within_millis);
        (self.armed && !within.is_zero() && within <= MAX_PROMISE).then_some(within)
    }
}

/// The longest promise a report may make: a day.
pub const MAX_PROMISE_MILLIS: u64 = 24 * 3600 * 1000;
/// The same, as a duration.
pub const MAX_PROMISE: std::time::Duration = std::time::Duration::from_millis(MAX_PROMISE_MILLIS);

/// (1.2) What the controller asks of an agent, in its answer to a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Instruction {
    /// Isolate the node: stop the kubelet, kill every pod process, report the evidence.
    #[serde(rename_all = "camelCase")]
    Isolate {
        /// Why, for the agent's log.
        #[serde(default)]
        reason: String,
        /// Which request this is (the controller's own identifier; the agent's report
        /// names the request its isolation state answers).
        #[serde(default)]
        request: u64,
    },
    /// The node's pods were released elsewhere and it reaches the API server again:
    /// let the kubelet start again.
    EndIsolation,
}

impl Instruction {
    /// The instruction's name, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Instruction::Isolate { .. } => "isolate",
            Instruction::EndIsolation => "endIsolation",
        }
    }
}

/// The controller's answer to an accepted report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Acknowledgement {
    pub version: String,
    pub node: String,
    pub sequence: u64,
    /// What the controller asks of the agent (1.2, see [`Instruction`]). Kept as JSON
    /// values on the wire so an agent reads the kinds it knows and ignores the others.
    #[serde(default)]
    pub instructions: Vec<serde_json::Value>,
    /// (1.3) The replica that answered leads: it decides the node's fence, so the node
    /// has been heard by the controller that counts. A self-isolating agent takes only
    /// such an answer for contact (a follower's ledger decides nothing).
    #[serde(default)]
    pub heard_by_leader: bool,
}

impl Acknowledgement {
    /// The instructions this build understands, and how many it could not read (a kind
    /// it does not know, from a newer controller, or a malformed one).
    pub fn known_instructions(&self) -> (Vec<Instruction>, usize) {
        let mut known = Vec::new();
        let mut unknown = 0;
        for value in &self.instructions {
            match serde_json::from_value::<Instruction>(value.clone()) {
                Ok(instruction) => known.push(instruction),
                Err(_) => unknown += 1,
            }
        }
        (known, unknown)
    }
}

/// The controller's answer to a refused request, with an HTTP status other than 200.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Refusal {
    pub version: String,
    pub reason: RefusalReason,
    pub message: String,
}

/// Why a request was refused, one per HTTP status the controller uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RefusalReason {
    /// 400: not JSON, a field of the wrong type, or a value out of range.
    Malformed,
    /// 400: a major version this controller does not speak.
    UnsupportedVersion,
    /// 401: no bearer token, or one the controller does not accept.
    Unauthenticated,
    /// 403: the credential belongs to another node (or to no node).
    Forbidden,
    /// 409: a sequence number not above the last one of the same boot, or a boot the
    /// node has already left.
    Stale,
    /// 413: the body exceeds the limit.
    TooLarge,
    /// 408: the body did not arrive in time.
    Timeout,
    /// 429: too many reports being handled at once; retry after a pause.
    Overloaded,
    /// 503: the credential cannot be checked now (the API server is unreachable).
    Unavailable,
    /// 404 / 405 / 415.
    NotFound,
    /// A reason a newer controller added.
    #[serde(other)]
    Unknown,
}

impl RefusalReason {
    pub fn http_status(self) -> u16 {
        match self {
            RefusalReason::Malformed | RefusalReason::UnsupportedVersion => 400,
            RefusalReason::Unauthenticated => 401,
            RefusalReason::Forbidden => 403,
            RefusalReason::NotFound => 404,
            RefusalReason::Timeout => 408,
            RefusalReason::Stale => 409,
            RefusalReason::TooLarge => 413,
            RefusalReason::Overloaded => 429,
            RefusalReason::Unavailable | RefusalReason::Unknown => 503,
        }
    }

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Malformed => "malformed",
            RefusalReason::UnsupportedVersion => "unsupported_version",
            RefusalReason::Unauthenticated => "unauthenticated",
            RefusalReason::Forbidden => "forbidden",
            RefusalReason::Stale => "stale",
            RefusalReason::TooLarge => "too_large",
            RefusalReason::Timeout => "timeout",
            RefusalReason::Overloaded => "overloaded",
            RefusalReason::Unavailable => "unavailable",
            RefusalReason::NotFound => "not_found",
            RefusalReason::Unknown => "unknown",
        }
    }
}

impl Refusal {
    pub fn new(reason: RefusalReason, message: impl Into<String>) -> Refusal {
        Refusal {
            version: version(),
            reason,
            message: message.into(),
        }
    }
}

/// Why a body is not a report this build can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("the body is not a JSON object: {0}")]
    NotJson(String),
    #[error("the report has no \"version\" field")]
    MissingVersion,
    #[error("version {0:?} is not of the form MAJOR.MINOR")]
    BadVersion(String),
    #[error(
        "report version {found} is not supported: this controller speaks {MAJOR}.x (upgrade the controller before its agents)"
    )]
    UnsupportedVersion { found: String },
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

impl DecodeError {
    pub fn reason(&self) -> RefusalReason {
        match self {
            DecodeError::UnsupportedVersion { .. } => RefusalReason::UnsupportedVersion,
            _ => RefusalReason::Malformed,
        }
    }
}

/// `"1.4"` into (1, 4).
pub fn parse_version(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.split_once('.')?;
    let digits = |part: &str| {
        (!part.is_empty() && part.len() <= 9 && part.bytes().all(|b| b.is_ascii_digit()))
            .then(|| part.parse().ok())
            .flatten()
    };
    Some((digits(major)?, digits(minor)?))
}

/// Checks a body's `version` before anything else, so a newer major version is refused
/// by name rather than by whichever of its fields fails first.
fn check_version(body: &[u8]) -> Result<(), DecodeError> {
    #[derive(Deserialize)]
    struct Envelope {
        version: Option<serde_json::Value>,
    }
    let envelope: Envelope =
        serde_json::from_slice(body).map_err(|e| DecodeError::NotJson(e.to_string()))?;
    let version = match envelope.version {
        None | Some(serde_json::Value::Null) => return Err(DecodeError::MissingVersion),
        Some(serde_json::Value::String(text)) => text,
        Some(other) => return Err(DecodeError::BadVersion(other.to_string())),
    };
    match parse_version(&version) {
        None => Err(DecodeError::BadVersion(version)),
        Some((major, _)) if major != MAJOR => {
            Err(DecodeError::UnsupportedVersion { found: version })
        }
        Some(_) => Ok(()),
    }
}

/// Limits that keep one report small whatever the body size limit is.
const MAX_NAME: usize = 253;
const MAX_SHORT_TEXT: usize = 128;
const MAX_CONDITIONS: usize = 16;
const MAX_MESSAGE: usize = 512;
/// The shortest and longest report intervals an agent may announce.
pub const MIN_INTERVAL_MILLIS: u64 = 100;
pub const MAX_INTERVAL_MILLIS: u64 = 60_000;

/// Text an agent sends that people will read (in `controller status`): printable ASCII
/// only, so no report can carry terminal control sequences.
fn is_plain_text(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
}

/// Decodes and checks one report body.
pub fn decode_report(body: &[u8]) -> Result<AgentReport, DecodeError> {
    check_version(body)?;
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let report: AgentReport =
        serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
            let field = error.path().to_string();
            DecodeError::Invalid {
                field,
                message: error.into_inner().to_string(),
            }
        })?;
    deserializer.end().map_err(|error| DecodeError::Invalid {
        field: ".".to_string(),
        message: error.to_string(),
    })?;
    validate(&report)?;
    Ok(report)
}

fn validate(report: &AgentReport) -> Result<(), DecodeError> {
    let invalid = |field: &str, message: String| DecodeError::Invalid {
        field: field.to_string(),
        message,
    };
    if !is_node_name(&report.node) {
        return Err(invalid(
            "node",
            format!(
                "{:?} is not a node name (lowercase letters, digits, '-' and '.', at most {MAX_NAME})",
                truncate(&report.node)
            ),
        ));
    }
    if report.boot_id.is_empty()
        || report.boot_id.len() > MAX_SHORT_TEXT
        || !is_plain_text(&report.boot_id)
    {
        return Err(invalid(
            "bootId",
            format!("must hold 1 to {MAX_SHORT_TEXT} printable characters"),
        ));
    }
    if report.agent_version.len() > MAX_SHORT_TEXT || !is_plain_text(&report.agent_version) {
        return Err(invalid(
            "agentVersion",
            format!("must hold at most {MAX_SHORT_TEXT} printable characters"),
        ));
    }
    if !(MIN_INTERVAL_MILLIS..=MAX_INTERVAL_MILLIS).contains(&report.interval_millis) {
        return Err(invalid(
            "intervalMillis",
            format!(
                "{} is not between {MIN_INTERVAL_MILLIS} and {MAX_INTERVAL_MILLIS}",
                report.interval_millis
            ),
        ));
    }
    if report.conditions.len() > MAX_CONDITIONS {
        return Err(invalid(
            "conditions",
            format!(
                "holds {} entries; at most {MAX_CONDITIONS}",
                report.conditions.len()
            ),
        ));
    }
    // Condition types are words (MemoryPressure); anything else is refused.
    if let Some(long) = report.conditions.iter().find(|c| {
        c.is_empty() || c.len() > MAX_SHORT_TEXT || !c.bytes().all(|b| b.is_ascii_alphabetic())
    }) {
        return Err(invalid(
            "conditions",
            format!("{:?} is not a condition type", truncate(long)),
        ));
    }
    if let Some(eviction) = &report.last_eviction
        && (eviction.pod.len() > 2 * MAX_NAME
            || eviction.signal.len() > MAX_SHORT_TEXT
            || !is_plain_text(&eviction.pod)
            || !is_plain_text(&eviction.signal))
    {
        return Err(invalid(
            "lastEviction",
            "pod or signal is too long or not printable text".to_string(),
        ));
    }
    if let Some(message) = &report.isolation.message
        && (message.len() > MAX_MESSAGE || !is_plain_text(message))
    {
        return Err(invalid(
            "isolation.message",
            format!("must hold at most {MAX_MESSAGE} printable characters"),
        ));
    }
    let own = &report.self_isolation;
    for (field, text) in [
        ("selfIsolation.message", &own.message),
        ("selfIsolation.watchdog", &own.watchdog),
    ] {
        if let Some(text) = text
            && (text.len() > MAX_MESSAGE || !is_plain_text(text))
        {
            return Err(invalid(
                field,
                format!("must hold at most {MAX_MESSAGE} printable characters"),
            ));
        }
    }
    if own.armed && !(1..=MAX_PROMISE_MILLIS).contains(&own.within_millis) {
        return Err(invalid(
            "selfIsolation.withinMillis",
            format!(
                "{} is not between 1 and {MAX_PROMISE_MILLIS} for an armed agent",
                own.within_millis
            ),
        ));
    }
    let shutdown = &report.shutdown;
    if shutdown.phases_done > shutdown.phases_total {
        return Err(invalid(
            "shutdown.phasesDone",
            format!(
                "{} is more than phasesTotal {}",
                shutdown.phases_done, shutdown.phases_total
            ),
        ));
    }
    Ok(())
}

/// A DNS subdomain, as Kubernetes names nodes.
pub fn is_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name
            .split('.')
            .all(|label| !label.is_empty() && !label.starts_with('-') && !label.ends_with('-'))
}

/// Untrusted text, shortened for an error message.
fn truncate(text: &str) -> String {
    text.chars().take(64).collect()
}

/// A plausible report, for tests here and in the other report modules.
#[cfg(test)]
pub(crate) fn sample() -> AgentReport {
    AgentReport {
        version: version(),
        node: "worker-1".to_string(),
        boot_id: "0b6e5c1e-7c44-4b8e-9d8e-2f5b1f0e2a11".to_string(),
        boot_time: "2026-11-20T08:00:00Z".parse().expect("timestamp"),
        sequence: 1234,
        agent_version: "0.1.0".to_string(),
        interval_millis: 2000,
        sent_at: "2026-11-24T05:00:00Z".parse().expect("timestamp"),
        trigger: Trigger::Interval,
        dry_run: false,
        conditions: vec!["MemoryPressure".to_string()],
        shutdown: ShutdownReport::default(),
        last_eviction: None,
        api_server: ApiServerReport {
            state: ApiServerState::Reachable,
            since: None,
        },
        isolation: IsolationReport::default(),
        self_isolation: SelfIsolationReport::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(report: &AgentReport) -> Vec<u8> {
        serde_json::to_vec(report).expect("encode")
    }

    #[test]
    fn a_self_isolation_promise_is_read_only_from_an_armed_report_with_a_bound() {
        let mut value = serde_json::to_value(sample()).expect("encode");
        value
            .as_object_mut()
            .expect("object")
            .remove("selfIsolation");
        let older = decode_report(&serde_json::to_vec(&value).expect("encode")).expect("1.2");
        assert_eq!(
            older.self_isolation.promise(),
            None,
            "a 1.2 agent promises nothing"
        );
        value["selfIsolation"] = serde_json::json!({
            "armed": true, "isolateAfterMillis": 60000, "withinMillis": 130000,
            "watchdogTimeoutMillis": 30000, "watchdog": "/dev/watchdog (i6300ESB timer)",
        });
        let armed = decode_report(&serde_json::to_vec(&value).expect("encode")).expect("1.3");
        assert_eq!(
            armed.self_isolation.promise(),
            Some(std::time::Duration::from_secs(130))
        );
        value["selfIsolation"]["withinMillis"] = 0.into();
        let error = decode_report(&serde_json::to_vec(&value).expect("encode"))
            .expect_err("an armed promise of nothing");
        assert!(
            error.to_string().starts_with("selfIsolation.withinMillis"),
            "{error}"
        );
        value["selfIsolation"]["armed"] = false.into();
        value["selfIsolation"]["message"] = "cannot open /dev/watchdog\u{7}".into();
        let error = decode_report(&serde_json::to_vec(&value).expect("encode"))
            .expect_err("a control character");
        assert!(
            error.to_string().starts_with("selfIsolation.message"),
            "{error}"
        );
    }

    #[test]
    fn a_report_round_trips() {
        let report = sample();
        assert_eq!(decode_report(&encode(&report)), Ok(report));
    }

    #[test]
    fn a_node_says_it_drained_only_with_every_pod_stopped_about_to_power_off_and_not_in_dry_run() {
        let drained = AgentReport {
            shutdown: ShutdownReport {
                state: ShutdownPhase::Finished,
                about_to_power_off: true,
                all_pods_stopped: true,
                ..ShutdownReport::default()
            },
            ..sample()
        };
        assert!(drained.says_drained());
        let not = |change: fn(&mut AgentReport)| {
            let mut report = drained.clone();
            change(&mut report);
            !report.says_drained()
        };
        assert!(not(|r| r.dry_run = true));
        assert!(not(|r| r.shutdown.all_pods_stopped = false));
        assert!(not(|r| r.shutdown.about_to_power_off = false));
        assert!(not(|r| r.shutdown.state = ShutdownPhase::Cancelled));
        // A 1.0 agent never sends the field: it reads false.
        let mut value = serde_json::to_value(&drained).expect("value");
        value["version"] = "1.0".into();
        value["shutdown"]
            .as_object_mut()
            .expect("object")
            .remove("allPodsStopped");
        let old = decode_report(&serde_json::to_vec(&value).expect("bytes")).expect("decoded");
        assert!(!old.says_drained());
    }

    #[test]
    fn a_newer_minor_version_with_unknown_fields_and_values_is_read() {
        let mut value = serde_json::to_value(sample()).expect("value");
        value["version"] = "1.7".into();
        value["futureField"] = serde_json::json!({"x": 1});
        value["shutdown"]["state"] = "hibernating".into();
        value["isolation"]["state"] = "fenced".into();
        value["trigger"] = "reconnect".into();
        let report = decode_report(&serde_json::to_vec(&value).expect("bytes")).expect("decoded");
        assert_eq!(report.shutdown.state, ShutdownPhase::Unknown);
        assert_eq!(report.isolation.state, IsolationState::Unknown);
        assert_eq!(report.trigger, Trigger::Unknown);
    }

    #[test]
    fn an_isolated_node_is_confirmed_only_with_the_kubelet_stopped_and_no_pod_process() {
        let isolated = IsolationReport {
            state: IsolationState::Isolated,
            since: Some("2026-11-24T05:00:00Z".parse().expect("time")),
            checked_at: Some("2026-11-24T05:00:02Z".parse().expect("time")),
            kubelet_stopped: true,
            pod_processes: 0,
            message: None,
            request: 1_800_000_000_000,
        };
        assert!(isolated.is_confirmed());
        let report = AgentReport {
            isolation: isolated.clone(),
            ..sample()
        };
        assert_eq!(decode_report(&encode(&report)), Ok(report));
        for not in [
            IsolationReport {
                kubelet_stopped: false,
                ..isolated.clone()
            },
            IsolationReport {
                pod_processes: 1,
                ..isolated.clone()
            },
            IsolationReport {
                state: IsolationState::Isolating,
                ..isolated.clone()
            },
        ] {
            assert!(!not.is_confirmed(), "{not:?}");
        }
        // A 1.1 agent's report has no evidence: not isolated.
        let mut value = serde_json::to_value(sample()).expect("value");
        value["version"] = "1.1".into();
        let old = decode_report(&serde_json::to_vec(&value).expect("bytes")).expect("decoded");
        assert_eq!(old.isolation, IsolationReport::default());
        // The message is for people: printable and bounded.
        let mut value = serde_json::to_value(&AgentReport {
            isolation: isolated,
            ..sample()
        })
        .expect("value");
        value["isolation"]["message"] = "\u{1b}[2J".into();
        let error = decode_report(&serde_json::to_vec(&value).expect("bytes")).expect_err("bad");
        assert!(
            error.to_string().starts_with("isolation.message"),
            "{error}"
        );
    }

    #[test]
    fn an_agent_reads_the_instructions_it_knows_and_counts_the_others() {
        let answer: Acknowledgement = serde_json::from_str(
            r#"{"version":"1.9","node":"worker-1","sequence":5,"instructions":[
                {"kind":"isolate","reason":"cut off from the API server"},
                {"kind":"reboot"},
                {"kind":"endIsolation"},
                {"kind":"isolate","reason":7},
                "isolate"
            ]}"#,
        )
        .expect("an answer");
        let (known, unknown) = answer.known_instructions();
        assert_eq!(
            known,
            [
                Instruction::Isolate {
                    reason: "cut off from the API server".to_string(),
                    request: 0,
                },
                Instruction::EndIsolation
            ]
        );
        assert_eq!(unknown, 3);
        // The wire form of each kind.
        assert_eq!(
            serde_json::to_value(Instruction::EndIsolation).expect("json"),
            serde_json::json!({"kind": "endIsolation"})
        );
    }

    #[test]
    fn another_major_version_is_refused_by_name_before_its_fields() {
        // Version 2 may change every field; the refusal must say "version", not
        // complain about a field it renamed.
        let body = br#"{"version":"2.0","nodeName":"worker-1"}"#;
        let error = decode_report(body).expect_err("refused");
        assert_eq!(
            error,
            DecodeError::UnsupportedVersion {
                found: "2.0".to_string()
            }
        );
        assert_eq!(error.reason(), RefusalReason::UnsupportedVersion);
        assert!(error.to_string().contains("speaks 1.x"), "{error}");
    }

    #[test]
    fn versions_that_are_not_major_dot_minor_are_refused() {
        for (body, expected) in [
            (&br#"{"node":"a"}"#[..], DecodeError::MissingVersion),
            (
                br#"{"version":1}"#,
                DecodeError::BadVersion("1".to_string()),
            ),
            (
                br#"{"version":"1"}"#,
                DecodeError::BadVersion("1".to_string()),
            ),
            (
                br#"{"version":"1.x"}"#,
                DecodeError::BadVersion("1.x".to_string()),
            ),
            (
                br#"{"version":"-1.0"}"#,
                DecodeError::BadVersion("-1.0".to_string()),
            ),
        ] {
            assert_eq!(decode_report(body), Err(expected));
        }
    }

    #[test]
    fn malformed_bodies_name_what_is_wrong() {
        assert!(matches!(
            decode_report(b"{\"version\":\"1.0\","),
            Err(DecodeError::NotJson(_))
        ));
        assert!(matches!(
            decode_report(b"[1,2]"),
            Err(DecodeError::NotJson(_))
        ));
        assert!(matches!(decode_report(b""), Err(DecodeError::NotJson(_))));
        let mut value = serde_json::to_value(sample()).expect("value");
        value["sequence"] = (-5).into();
        let error = decode_report(&serde_json::to_vec(&value).expect("bytes")).expect_err("bad");
        assert!(
            matches!(&error, DecodeError::Invalid { field, .. } if field == "sequence"),
            "{error:?}"
        );
        let mut value = serde_json::to_value(sample()).expect("value");
        value["shutdown"]["phasesTotal"] = "three".into();
        let error = decode_report(&serde_json::to_vec(&value).expect("bytes")).expect_err("bad");
        assert!(
            matches!(&error, DecodeError::Invalid { field, .. } if field == "shutdown.phasesTotal"),
            "{error:?}"
        );
    }

    type Change = Box<dyn Fn(&mut AgentReport)>;

    #[test]
    fn values_out_of_range_are_refused() {
        let cases: Vec<(&str, Change)> = vec![
            ("node", Box::new(|r| r.node = "Worker_1".to_string())),
            ("node", Box::new(|r| r.node = String::new())),
            ("node", Box::new(|r| r.node = "a".repeat(254))),
            ("bootId", Box::new(|r| r.boot_id = String::new())),
            ("bootId", Box::new(|r| r.boot_id = "a\u{1b}[2J".to_string())),
            (
                "conditions",
                Box::new(|r| r.conditions = vec!["\u{1b}]0;owned\u{7}".to_string()]),
            ),
            (
                "conditions",
                Box::new(|r| r.conditions = vec!["Memory Pressure".to_string()]),
            ),
            ("intervalMillis", Box::new(|r| r.interval_millis = 0)),
            (
                "intervalMillis",
                Box::new(|r| r.interval_millis = 3_600_000),
            ),
            (
                "conditions",
                Box::new(|r| r.conditions = vec!["X".to_string(); 17]),
            ),
            (
                "shutdown.phasesDone",
                Box::new(|r| {
                    r.shutdown.phases_total = 2;
                    r.shutdown.phases_done = 3;
                }),
            ),
        ];
        for (expected_field, change) in cases {
            let mut report = sample();
            change(&mut report);
            match decode_report(&encode(&report)) {
                Err(DecodeError::Invalid { field, .. }) => assert_eq!(field, expected_field),
                other => panic!("{expected_field}: {other:?}"),
            }
        }
    }

    #[test]
    fn node_names_follow_kubernetes() {
        for good in ["a", "worker-1", "ip-10-0-0-1.ec2.internal", "0"] {
            assert!(is_node_name(good), "{good}");
        }
        for bad in ["", "-a", "a-", "a..b", "A", "a_b", "a b", ".a"] {
            assert!(!is_node_name(bad), "{bad}");
        }
    }

    #[test]
    fn refusal_reasons_map_to_http_statuses() {
        assert_eq!(RefusalReason::Stale.http_status(), 409);
        assert_eq!(RefusalReason::TooLarge.http_status(), 413);
        assert_eq!(RefusalReason::Unauthenticated.http_status(), 401);
        assert_eq!(RefusalReason::Forbidden.http_status(), 403);
        let refusal: Refusal =
            serde_json::from_str(r#"{"version":"1.3","reason":"SomethingNew","message":"m"}"#)
                .expect("a newer reason is read");
        assert_eq!(refusal.reason, RefusalReason::Unknown);
    }
}
