//! Runs ClusterLabs fence agents safely.
//!
//! - Every option goes to the agent's standard input as a `key=value` line and the agent
//!   gets no arguments at all (agents read stdin only when argv is empty), so credentials
//!   never show in `ps`. The action is always explicit and written last (an agent given
//!   no action reboots; on stdin the last occurrence of a key wins).
//! - Each call has a deadline; a timeout is a failure, and the agent's whole process
//!   group (with its ipmitool or snmpget children) is killed.
//! - Output is captured up to a limit, with every credential of the call replaced by
//!   `***`.
//! - Exit codes follow the ClusterLabs convention: 0 success (for `status`: ON), 2 OFF
//!   (status only), anything else failure.
//! - `off` counts only once `status` reports OFF (an agent may report success before the
//!   power is really off); `reboot` is a verified `off` followed by `on`.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::config::{FenceAction, MethodPlan, Parameter};
use super::metadata::ParameterSpec;
use super::metadata::{AgentMetadata, MetadataError, parse_metadata};
use super::secret::MASK;
use crate::process::{Waited, in_own_group, kill_group, wait_or_kill_group};

/// Where Debian and RHEL install the agents.
pub const DEFAULT_AGENTS_DIR: &str = "/usr/sbin";

/// The `PATH` agents run with: they find ipmitool, snmpget and python here.
const AGENT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The only variables of nodekeeper's environment an agent sees: how to reach a device
/// through a proxy, which CA bundle to trust, the time zone.
const PASSED_ENVIRONMENT: [&str; 10] = [
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "REQUESTS_CA_BUNDLE",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "TZ",
];

/// How the runner calls agents.
#[derive(Debug, Clone)]
pub struct RunnerSettings {
    /// The directory the agents are looked up in (never `PATH`).
    pub agents_dir: PathBuf,
    /// The deadline of one agent call.
    pub call_timeout: Duration,
    /// How long `status` may take to confirm an `off` or `on` the agent reported done.
    pub verify_timeout: Duration,
    /// The pause between two `status` calls while verifying.
    pub verify_interval: Duration,
    /// Output kept per stream, from its end; the rest is read and dropped.
    pub output_limit: usize,
}

impl Default for RunnerSettings {
    fn default() -> RunnerSettings {
        RunnerSettings {
            agents_dir: PathBuf::from(DEFAULT_AGENTS_DIR),
            // Pacemaker's fencing-timeout and Fence Agents Remediation's per-call timeout.
            call_timeout: Duration::from_secs(60),
            verify_timeout: Duration::from_secs(30),
            verify_interval: Duration::from_secs(1),
            output_limit: 64 * 1024,
        }
    }
}

/// The power state a `status` call reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PowerState {
    On,
    Off,
}

impl std::fmt::Display for PowerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PowerState::On => "ON",
            PowerState::Off => "OFF",
        })
    }
}

/// How an agent call ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Exit {
    Code {
        code: i32,
    },
    Signal {
        signal: i32,
    },
    TimedOut {
        seconds: f64,
    },
    /// The agent could not be started at all.
    NotStarted {
        reason: String,
    },
    /// The agent started, but its end could not be observed; its group was killed.
    Lost {
        reason: String,
    },
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code { code } => write!(f, "exit code {code}"),
            Exit::Signal { signal } => write!(f, "killed by signal {signal}"),
            Exit::TimedOut { seconds } => write!(f, "timed out after {seconds:.1}s"),
            Exit::NotStarted { reason } => write!(f, "not started: {reason}"),
            Exit::Lost { reason } => write!(f, "lost: {reason}"),
        }
    }
}

/// One run of an agent.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCall {
    pub agent: String,
    pub action: String,
    pub exit: Exit,
    /// What `status` reported; none for other actions or a failed status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power: Option<PowerState>,
    #[serde(serialize_with = "seconds")]
    pub duration: Duration,
    /// Standard output then standard error, credentials redacted.
    pub output: String,
}

impl AgentCall {
    /// Success by the ClusterLabs convention: 0, or 2 (OFF) for `status`.
    pub fn succeeded(&self) -> bool {
        match self.exit {
            Exit::Code { code: 0 } => true,
            Exit::Code { code: 2 } => self.action == "status",
            _ => false,
        }
    }

    /// The last non-empty output line, for one-line summaries.
    pub fn last_line(&self) -> &str {
        self.output
            .lines()
            .rev()
            .map(str::trim)
            .find(|line| !line.is_empty())
            .unwrap_or("")
    }

    /// "exit code 1: Failed: Unable to obtain correct plug status".
    pub fn summary(&self) -> String {
        match self.last_line() {
            "" => self.exit.to_string(),
            line => format!("{}: {line}", self.exit),
        }
    }
}

fn seconds<S: serde::Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64((duration.as_secs_f64() * 1000.0).round() / 1000.0)
}

/// The result of one method: its action, confirmed or not.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MethodResult {
    pub method: String,
    pub agent: String,
    pub action: FenceAction,
    pub succeeded: bool,
    /// Why it failed, or what went wrong after the part that counts (a reboot whose
    /// `on` failed after a confirmed `off`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Whether `status` reported the power OFF after the action: the confirmation a
    /// fence needs before any pod may be released.
    pub off_confirmed: bool,
    /// The last power state `status` reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power: Option<PowerState>,
    pub calls: Vec<AgentCall>,
    #[serde(serialize_with = "seconds")]
    pub duration: Duration,
}

/// What the fire drill learned about one method's device.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeResult {
    pub method: String,
    pub agent: String,
    /// `status`, or `monitor` for an agent without status.
    pub action: String,
    /// The device answered and accepted the credentials.
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power: Option<PowerState>,
    pub call: AgentCall,
}

/// Why an agent cannot be used at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunnerError {
    #[error(
        "agent {agent:?} is not a ClusterLabs fence agent name (fence_ followed by letters, digits or '_')"
    )]
    BadName { agent: String },
    #[error("agent {agent} is not installed here: no executable {}", path.display())]
    NotInstalled { agent: String, path: PathBuf },
    #[error("{agent} -o metadata failed: {reason}")]
    MetadataCall { agent: String, reason: String },
    #[error(transparent)]
    Metadata(#[from] MetadataError),
}

/// Runs fence agents; cheap to share (`Arc`) between tasks.
#[derive(Debug)]
pub struct FenceRunner {
    settings: RunnerSettings,
    metadata: Mutex<HashMap<String, Arc<AgentMetadata>>>,
    /// Process groups of the agents running now.
    running: Mutex<HashSet<i32>>,
}

impl FenceRunner {
    pub fn new(settings: RunnerSettings) -> FenceRunner {
        FenceRunner {
            settings,
            metadata: Mutex::new(HashMap::new()),
            running: Mutex::new(HashSet::new()),
        }
    }

    pub fn settings(&self) -> &RunnerSettings {
        &self.settings
    }

    /// The agent's executable, if the name is an agent's and it is installed.
    pub fn agent_path(&self, agent: &str) -> Result<PathBuf, RunnerError> {
        let valid = agent.strip_prefix("fence_").is_some_and(|rest| {
            !rest.is_empty() && rest.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
        if !valid {
            return Err(RunnerError::BadName {
                agent: agent.to_string(),
            });
        }
        let path = self.settings.agents_dir.join(agent);
        let executable = std::fs::metadata(&path)
            .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0);
        if executable {
            Ok(path)
        } else {
            Err(RunnerError::NotInstalled {
                agent: agent.to_string(),
                path,
            })
        }
    }

    /// The agent's metadata, read once per runner.
    pub async fn metadata(&self, agent: &str) -> Result<Arc<AgentMetadata>, RunnerError> {
        if let Some(known) = self.lock_metadata().get(agent) {
            return Ok(Arc::clone(known));
        }
        self.agent_path(agent)?;
        let (call, stdout) = self.call_capturing(agent, "metadata", &[]).await;
        if !call.succeeded() {
            return Err(RunnerError::MetadataCall {
                agent: agent.to_string(),
                reason: call.summary(),
            });
        }
        let metadata = Arc::new(parse_metadata(agent, &stdout)?);
        self.lock_metadata()
            .insert(agent.to_string(), Arc::clone(&metadata));
        Ok(metadata)
    }

    fn lock_metadata(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<AgentMetadata>>> {
        // The map holds only finished entries, so a panic elsewhere cannot leave it torn.
        self.metadata
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `agent` once with `action` and `parameters`, all on standard input.
    pub async fn call(&self, agent: &str, action: &str, parameters: &[Parameter]) -> AgentCall {
        self.call_capturing(agent, action, parameters).await.0
    }

    /// [`call`](Self::call), also returning standard output alone (redacted), which is
    /// where an agent prints its metadata.
    async fn call_capturing(
        &self,
        agent: &str,
        action: &str,
        parameters: &[Parameter],
    ) -> (AgentCall, String) {
        let started = Instant::now();
        let secrets: Vec<&str> = parameters
            .iter()
            .filter(|p| p.value.is_sensitive())
            .map(|p| p.value.expose())
            .filter(|value| !value.is_empty())
            .collect();
        let finish = |exit: Exit, power: Option<PowerState>, output: &str| AgentCall {
            agent: agent.to_string(),
            action: action.to_string(),
            exit,
            power,
            duration: started.elapsed(),
            output: redact(output, &secrets),
        };
        let path = match self.agent_path(agent) {
            Ok(path) => path,
            Err(error) => {
                let exit = Exit::NotStarted {
                    reason: error.to_string(),
                };
                return (finish(exit, None, ""), String::new());
            }
        };
        let known = self.lock_metadata().get(agent).cloned();
        let parameters = as_the_agent_expects(parameters, known.as_deref());
        let input = agent_input(action, &parameters);
        // Names only: values may be credentials.
        let names: Vec<&str> = parameters.iter().map(|p| p.name.as_str()).collect();
        tracing::debug!(agent, action, parameters = ?names, "running fence agent");
        let mut command = tokio::process::Command::new(&path);
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Nothing of the controller's environment (HOME and its ssh config, a user's
            // locale) changes what an agent does; proxies and CA bundles pass through.
            .env_clear()
            .envs(std::env::vars_os().filter(|(name, _)| {
                name.to_str()
                    .is_some_and(|name| PASSED_ENVIRONMENT.contains(&name))
            }))
            .env("PATH", AGENT_PATH)
            .env("LANG", "C.UTF-8")
            // fence_ipmilan warns about a deprecated Python module on every call.
            .env("PYTHONWARNINGS", "ignore::DeprecationWarning");
        let mut child = match in_own_group(&mut command).spawn() {
            Ok(child) => child,
            Err(error) => {
                let reason = format!("{}: {error}", path.display());
                return (finish(Exit::NotStarted { reason }, None, ""), String::new());
            }
        };
        let group = child.id().and_then(|pid| i32::try_from(pid).ok());
        if let Some(group) = group {
            self.lock_running().insert(group);
        }
        let stdout = Captured::start(child.stdout.take(), self.settings.output_limit);
        let stderr = Captured::start(child.stderr.take(), self.settings.output_limit);
        if let Some(mut stdin) = child.stdin.take() {
            tokio::spawn(async move {
                // An agent that exits without reading its input closes the pipe; that
                // is its business and shows in its exit code.
                let _ = stdin.write_all(input.as_bytes()).await;
                let _ = stdin.shutdown().await;
            });
        }
        let waited = wait_or_kill_group(&mut child, self.settings.call_timeout).await;
        if let Some(group) = group {
            // Children the agent left behind (an ipmitool still running) die with it.
            kill_group(group);
            self.lock_running().remove(&group);
        }
        let limit = self.settings.output_limit;
        let stdout = stdout.finish(limit).await;
        let output = format!("{stdout}{}", stderr.finish(limit).await);
        let exit = match waited {
            Ok(Waited::Exited(status)) => {
                use std::os::unix::process::ExitStatusExt;
                match (status.code(), status.signal()) {
                    (Some(code), _) => Exit::Code { code },
                    (None, Some(signal)) => Exit::Signal { signal },
                    (None, None) => Exit::Lost {
                        reason: "no exit status".to_string(),
                    },
                }
            }
            Ok(Waited::TimedOut) => Exit::TimedOut {
                seconds: self.settings.call_timeout.as_secs_f64(),
            },
            Err(error) => Exit::Lost {
                reason: format!("waiting for {}: {error}", path.display()),
            },
        };
        // Exit code 2 alone is not trusted as OFF: the agent must also say so.
        let says = |state: &str| {
            stdout.lines().any(|line| {
                line.trim()
                    .eq_ignore_ascii_case(&format!("Status: {state}"))
            })
        };
        let power = match (action, &exit) {
            ("status", Exit::Code { code: 0 }) => Some(PowerState::On),
            ("status", Exit::Code { code: 2 }) if says("OFF") => Some(PowerState::Off),
            _ => None,
        };
        let call = finish(exit, power, &output);
        tracing::debug!(
            agent,
            action,
            result = %call.summary(),
            seconds = call.duration.as_secs_f64(),
            "fence agent finished"
        );
        (call, redact(&stdout, &secrets))
    }

    /// Kills every agent this runner has running, with its process group: for a command
    /// interrupted by Ctrl-C or SIGTERM, since the agents' own groups do not get the
    /// terminal's signal.
    pub fn kill_running(&self) {
        for group in self.lock_running().drain() {
            kill_group(group);
        }
    }

    fn lock_running(&self) -> std::sync::MutexGuard<'_, HashSet<i32>> {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Carries out a method's action and confirms it with `status`.
    pub async fn execute(&self, method: &MethodPlan) -> MethodResult {
        let started = Instant::now();
        let mut result = MethodResult {
            method: method.name.clone(),
            agent: method.agent.clone(),
            action: method.action,
            succeeded: false,
            detail: None,
            off_confirmed: false,
            power: None,
            calls: Vec::new(),
            duration: Duration::ZERO,
        };
        match method.action {
            FenceAction::Off => {
                if let Err(reason) = self
                    .act_and_verify(method, PowerState::Off, &mut result)
                    .await
                {
                    result.detail = Some(reason);
                } else {
                    result.succeeded = true;
                }
            }
            FenceAction::On => {
                if let Err(reason) = self
                    .act_and_verify(method, PowerState::On, &mut result)
                    .await
                {
                    result.detail = Some(reason);
                } else {
                    result.succeeded = true;
                }
            }
            FenceAction::Reboot => {
                match self
                    .act_and_verify(method, PowerState::Off, &mut result)
                    .await
                {
                    Err(reason) => result.detail = Some(reason),
                    Ok(()) => {
                        // The fence is the confirmed off; a failed power-on afterwards
                        // leaves the node fenced, which is what counts, and is reported.
                        result.succeeded = true;
                        if let Err(reason) = self
                            .act_and_verify(method, PowerState::On, &mut result)
                            .await
                        {
                            result.detail = Some(format!("powered off, but {reason}"));
                        }
                    }
                }
            }
        }
        result.duration = started.elapsed();
        result
    }

    /// One `off` or `on`, then `status` until it reports `target` or the verify deadline.
    async fn act_and_verify(
        &self,
        method: &MethodPlan,
        target: PowerState,
        result: &mut MethodResult,
    ) -> Result<(), String> {
        let action = match target {
            PowerState::Off => "off",
            PowerState::On => "on",
        };
        let call = self.call(&method.agent, action, &method.parameters).await;
        let acted = call.succeeded();
        let summary = call.summary();
        result.calls.push(call);
        if !acted {
            return Err(format!("{action} failed ({summary})"));
        }
        let deadline = Instant::now() + self.settings.verify_timeout;
        loop {
            let status = self.call(&method.agent, "status", &method.parameters).await;
            let power = status.power;
            let summary = status.summary();
            result.calls.push(status);
            if power.is_some() {
                result.power = power;
            }
            if power == Some(target) {
                if target == PowerState::Off {
                    result.off_confirmed = true;
                }
                return Ok(());
            }
            if Instant::now() + self.settings.verify_interval > deadline {
                let seen = match power {
                    Some(power) => format!("status still reports {power}"),
                    None => format!("status failed ({summary})"),
                };
                return Err(format!(
                    "the agent reported {action} done, but after {:.1}s {seen}",
                    self.settings.verify_timeout.as_secs_f64()
                ));
            }
            tokio::time::sleep(self.settings.verify_interval).await;
        }
    }

    /// The fire drill for one method: `status` (or `monitor`), never a power change.
    pub async fn probe(&self, method: &MethodPlan) -> ProbeResult {
        let action = match self.metadata(&method.agent).await {
            Ok(metadata) => metadata.probe_action().unwrap_or("status"),
            Err(_) => "status",
        };
        let call = self.call(&method.agent, action, &method.parameters).await;
        ProbeResult {
            method: method.name.clone(),
            agent: method.agent.clone(),
            action: action.to_string(),
            ok: call.succeeded(),
            power: call.power,
            call,
        }
    }
}

/// The parameters as the agent reads them, when its metadata is known: a boolean set to
/// false is left out (fencing.py and some agents treat any value, even `0`, as set), and
/// a true one is written `1`.
fn as_the_agent_expects(
    parameters: &[Parameter],
    metadata: Option<&AgentMetadata>,
) -> Vec<Parameter> {
    let is_boolean = |parameter: &Parameter| {
        metadata
            .and_then(|metadata| metadata.lookup(&parameter.name))
            .is_some_and(|spec: &ParameterSpec| spec.content_type == "boolean")
    };
    parameters
        .iter()
        .filter_map(|parameter| {
            if !is_boolean(parameter) {
                return Some(parameter.clone());
            }
            let value = parameter.value.expose().to_ascii_lowercase();
            if matches!(value.as_str(), "1" | "yes" | "on" | "true") {
                let mut on = parameter.clone();
                on.value = super::config::ParameterValue::Text("1".to_string());
                Some(on)
            } else {
                None
            }
        })
        .collect()
}

/// The agent's standard input: one `key=value` line per parameter, the action last.
fn agent_input(action: &str, parameters: &[Parameter]) -> String {
    let mut input = String::new();
    for parameter in parameters {
        input.push_str(&parameter.name);
        input.push('=');
        input.push_str(&stdin_value(parameter.value.expose()));
        input.push('\n');
    }
    input.push_str("action=");
    input.push_str(action);
    input.push('\n');
    input
}

/// A value as the agents' stdin parser gives it back unchanged. fencing.py strips each
/// line's surrounding whitespace and then one pair of surrounding double quotes, so a
/// value with leading or trailing whitespace, or itself wrapped in quotes (a password
/// may be either), is wrapped in one more pair of quotes.
fn stdin_value(value: &str) -> std::borrow::Cow<'_, str> {
    let quoted = value.len() >= 2 && value.starts_with('"') && value.ends_with('"');
    if quoted || value.trim() != value {
        std::borrow::Cow::Owned(format!("\"{value}\""))
    } else {
        std::borrow::Cow::Borrowed(value)
    }
}

/// `text` with every occurrence of every secret replaced by `***`, longest first so a
/// secret containing another is masked whole.
pub fn redact(text: &str, secrets: &[&str]) -> String {
    let mut secrets: Vec<&str> = secrets.iter().copied().filter(|s| !s.is_empty()).collect();
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    let mut redacted = text.to_string();
    for secret in secrets {
        if redacted.contains(secret) {
            redacted = redacted.replace(secret, MASK);
        }
    }
    redacted
}

/// One output stream read in the background, its last `limit` bytes kept: an agent's
/// verdict is its last line.
struct Captured {
    buffer: Arc<Mutex<Tail>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

#[derive(Default)]
struct Tail {
    bytes: Vec<u8>,
    truncated: bool,
}

impl Captured {
    fn start<R: AsyncRead + Unpin + Send + 'static>(stream: Option<R>, limit: usize) -> Captured {
        let buffer = Arc::new(Mutex::new(Tail::default()));
        let task = stream.map(|mut stream| {
            let buffer = Arc::clone(&buffer);
            tokio::spawn(async move {
                let mut chunk = [0u8; 8192];
                loop {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(read) => {
                            let mut tail = buffer
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                            tail.bytes.extend_from_slice(&chunk[..read]);
                            // Trim in batches, not on every read.
                            if tail.bytes.len() > limit.saturating_mul(2).max(16 * 1024) {
                                let cut = tail.bytes.len() - limit;
                                tail.bytes.drain(..cut);
                                tail.truncated = true;
                            }
                        }
                    }
                }
            })
        });
        Captured { buffer, task }
    }

    /// The text read so far. The stream ends when every process holding it exits; one
    /// that escaped the killed process group may hold it open, so wait only briefly.
    async fn finish(mut self, limit: usize) -> String {
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        let tail = std::mem::take(
            &mut *self
                .buffer
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let mut bytes = tail.bytes;
        let mut truncated = tail.truncated;
        if bytes.len() > limit {
            bytes.drain(..bytes.len() - limit);
            truncated = true;
        }
        if truncated {
            // The first kept line is cut; drop it, so that no credential is shown in part
            // (credentials hold no line breaks, so a whole one is always redacted).
            let start = bytes
                .iter()
                .position(|&b| b == b'\n')
                .map_or(bytes.len(), |i| i + 1);
            bytes.drain(..start);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What fencing.py's `_parse_input_stdin` makes of one `key=value` line: the line
    /// stripped, split at the first `=`, one pair of surrounding quotes removed.
    fn as_the_agent_reads(line: &str) -> (String, String) {
        let line = line.trim();
        let (key, value) = line.split_once('=').unwrap_or((line, ""));
        let value = if value.len() >= 2 && value.starts_with('"') && value.ends_with('"') {
            &value[1..value.len() - 1]
        } else {
            value
        };
        (key.to_string(), value.to_string())
    }

    #[test]
    fn every_value_reaches_the_agent_unchanged() {
        for value in [
            "plain",
            "with=equals",
            "\"quoted\"",
            "\"",
            "\"\"",
            " leading",
            "trailing ",
            "\" both \"",
            "in\"side",
            "#hash",
        ] {
            let line = format!("password={}", stdin_value(value));
            assert_eq!(
                as_the_agent_reads(&line),
                ("password".to_string(), value.to_string()),
                "{line}"
            );
        }
    }

    #[test]
    fn redaction_masks_the_longest_secret_whole() {
        assert_eq!(
            redact("pw=abcdef and abc", &["abc", "abcdef", ""]),
            "pw=*** and ***"
        );
    }
}
