//! The controller's configuration (`ControllerConfiguration`, usually
//! `config/controller.yaml`), decoded into plain policy values the decision functions
//! read. Unknown fields are refused and every error names its field.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Serialize};

use crate::config::GoDuration;
use crate::report::ReportsPolicy;

pub const API_VERSION: &str = "nodekeeper.io/v1alpha1";
pub const KIND: &str = "ControllerConfiguration";
/// Nodes with this label set to `true` are never fenced (medik8s uses its own
/// `remediation.medik8s.io/exclude-from-remediation`, which is honoured too).
pub const EXCLUSION_LABEL: &str = "fencing.nodekeeper.io/exclude";
pub const MEDIK8S_EXCLUSION_LABEL: &str = "remediation.medik8s.io/exclude-from-remediation";
/// Our `NoSchedule` taint while a node is being fenced. Not `NoExecute`: that would evict
/// pods before the node is proven stopped.
pub const REMEDIATION_TAINT: &str = "fencing.nodekeeper.io/remediation";
/// The non-graceful shutdown taint (KEP-2268): pods force-deleted, volumes detached at once.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";
pub const OUT_OF_SERVICE_VALUE: &str = "nodeshutdown";

/// A count or a percentage of nodes, as `maxUnhealthy` is written.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum CountOrPercent {
    Count(u32),
    Percent(f64),
}

impl CountOrPercent {
    /// The largest number of unhealthy nodes out of `total` that is still allowed. A
    /// percentage rounds down, so `40%` of 5 nodes allows 2.
    pub fn allowed(self, total: usize) -> usize {
        match self {
            CountOrPercent::Count(count) => count as usize,
            CountOrPercent::Percent(percent) => {
                // Nodes are counted in the thousands at most; the product is exact enough.
                ((total as f64) * percent / 100.0 + 1e-9).floor() as usize
            }
        }
    }

    fn parse(text: &str) -> Result<CountOrPercent, String> {
        let text = text.trim();
        if let Some(number) = text.strip_suffix('%') {
            let percent: f64 = number
                .trim()
                .parse()
                .map_err(|_| format!("{text:?} is not a percentage"))?;
            if !(0.0..=100.0).contains(&percent) {
                return Err(format!("{text:?} must be between 0% and 100%"));
            }
            return Ok(CountOrPercent::Percent(percent));
        }
        text.parse()
            .map(CountOrPercent::Count)
            .map_err(|_| format!("{text:?} is neither a node count nor a percentage like 40%"))
    }
}

impl std::fmt::Display for CountOrPercent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CountOrPercent::Count(count) => write!(f, "{count}"),
            CountOrPercent::Percent(percent) => write!(f, "{percent}%"),
        }
    }
}

/// The shortest `silenceTimeout` taken: below it, a node would count as silent between
/// two of its agent's reports (every 2 s by default) or two Lease renewals of a kubelet
/// configured to renew often.
pub const MIN_SILENCE_TIMEOUT: Duration = Duration::from_secs(2);

/// The shortest non-zero `selfIsolationMargin`.
pub const MIN_SELF_ISOLATION_MARGIN: Duration = Duration::from_secs(5);

/// When and how fences run, and what happens after one is confirmed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FencePolicy {
    /// How long the Ready condition must be False or Unknown before a fence starts, for a
    /// node without an agent.
    pub unhealthy_duration: Duration,
    /// For a node with an agent: how long its Lease and its agent's reports must both be
    /// silent before it is taken for lost. Zero turns silence detection off, and every
    /// node is judged by its Ready condition.
    pub silence_timeout: Duration,
    /// How recent a node's last report must be for its statement that the node drained
    /// cleanly to release its pods and volumes without a power fence, once the node falls
    /// silent. Zero turns the drained fast path off.
    pub drained_report_max_age: Duration,
    /// How long the agent of a node cut off from the API server (its Lease silent, the
    /// node not Ready, its reports still coming over TLS) has to isolate the node and
    /// report it isolated before the fence falls back to its configured steps. Zero turns
    /// isolation off: such a node is held as alive.
    pub isolation_timeout: Duration,
    /// After a confirmed isolation, how long the node may come back by itself before the
    /// power step starts.
    pub power_management_delay: Duration,
    /// For a node whose fence configuration says `kdump=true` and that announced its
    /// crash kernel: how long, at most, the power step waits for the dump to finish.
    pub kdump_wait: Duration,
    /// The node's kdump notifications have stopped (the dump ended, or the node is gone)
    /// once none arrived for this long: the power step no longer waits.
    /// `fence_kdump_send` repeats its notification every 10 s by default.
    pub kdump_silence: Duration,
    /// For a node with no fence device whose agent promised, over TLS, to isolate or
    /// reset it by itself (self-isolation, backed by a watchdog): its pods are released
    /// this long after the promise ran out. Zero: never released on a promise.
    pub self_isolation_margin: Duration,
    /// Retries of a failed step before the fence stays failed.
    pub retry_limit: u32,
    /// The first retry's wait; each further retry doubles it, up to `retry_backoff_max`.
    pub retry_backoff: Duration,
    pub retry_backoff_max: Duration,
    /// Apply the out-of-service taint once a fence is confirmed.
    pub out_of_service_taint: bool,
    /// Also delete the node's pods once a fence is confirmed (the original design's
    /// cluster fence).
    pub delete_pods: bool,
}

impl Default for FencePolicy {
    fn default() -> FencePolicy {
        FencePolicy {
            unhealthy_duration: Duration::from_secs(60),
            silence_timeout: Duration::from_secs(20),
            drained_report_max_age: Duration::from_secs(120),
            isolation_timeout: Duration::from_secs(60),
            power_management_delay: Duration::from_secs(60),
            kdump_wait: Duration::from_secs(600),
            kdump_silence: Duration::from_secs(30),
            self_isolation_margin: Duration::from_secs(30),
            retry_limit: 3,
            retry_backoff: Duration::from_secs(30),
            retry_backoff_max: Duration::from_secs(300),
            out_of_service_taint: true,
            delete_pods: false,
        }
    }
}

impl FencePolicy {
    /// The wait before retry number `retry` (1-based).
    pub fn backoff(&self, retry: u32) -> Duration {
        crate::backoff::doubling(self.retry_backoff, retry, self.retry_backoff_max)
    }
}

/// The storm guard and the zone rate limits.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StormPolicy {
    /// No fence starts while more selected nodes than this are unhealthy.
    pub max_unhealthy: CountOrPercent,
    /// After a storm, how long fencing stays paused.
    pub storm_cooldown: Duration,
    /// Fences started per second in a healthy zone (the node lifecycle controller's
    /// `--node-eviction-rate`).
    pub zone_fence_rate: f64,
    /// ... in a partially disrupted zone larger than `large_cluster_size_threshold`
    /// (`--secondary-node-eviction-rate`); smaller disrupted zones get none.
    pub secondary_zone_fence_rate: f64,
    pub large_cluster_size_threshold: usize,
    /// The share of NotReady nodes (with more than two) that makes a zone partially
    /// disrupted (`--unhealthy-zone-threshold`).
    pub unhealthy_zone_threshold: f64,
}

impl Default for StormPolicy {
    fn default() -> StormPolicy {
        StormPolicy {
            max_unhealthy: CountOrPercent::Percent(40.0),
            storm_cooldown: Duration::from_secs(300),
            zone_fence_rate: 0.1,
            secondary_zone_fence_rate: 0.01,
            large_cluster_size_threshold: 50,
            unhealthy_zone_threshold: 0.55,
        }
    }
}

/// How the controller runs fence agents (the local-process executor).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentsPolicy {
    /// Where the agents are installed; never looked up on `PATH`.
    pub directory: std::path::PathBuf,
    /// The deadline of one agent call; an agent still running then is killed.
    pub call_timeout: Duration,
    /// How long `status` may take to confirm an `off` or `on` the agent reported done.
    pub verify_timeout: Duration,
    /// Agent options passed although they name a file or program (fence_dummy's
    /// `status_file` on a test rig); ConfigMaps cannot allow them themselves.
    pub allowed_options: Vec<String>,
}

impl Default for AgentsPolicy {
    fn default() -> AgentsPolicy {
        let runner = crate::fencing::RunnerSettings::default();
        AgentsPolicy {
            directory: runner.agents_dir,
            call_timeout: runner.call_timeout,
            verify_timeout: runner.verify_timeout,
            allowed_options: Vec::new(),
        }
    }
}

impl AgentsPolicy {
    pub fn runner_settings(&self) -> crate::fencing::RunnerSettings {
        crate::fencing::RunnerSettings {
            agents_dir: self.directory.clone(),
            call_timeout: self.call_timeout,
            verify_timeout: self.verify_timeout,
            ..crate::fencing::RunnerSettings::default()
        }
    }

    pub fn resolve_policy(&self) -> crate::fencing::config::ResolvePolicy {
        crate::fencing::config::ResolvePolicy {
            allowed_options: self
                .allowed_options
                .iter()
                .map(|option| option.replace('-', "_"))
                .collect(),
        }
    }
}

/// Where fence agents run.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ExecutorPolicy {
    /// As child processes of the controller (its image or host has the agents).
    #[default]
    Local,
    /// One Kubernetes Job per execution, as the original node-fencing design ran them.
    Job(Box<JobPolicy>),
}

/// How the Job executor builds its Jobs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobPolicy {
    /// An image with nodekeeper and the fence agents (in `agents.directory`).
    pub image: String,
    pub image_pull_policy: Option<String>,
    /// nodekeeper's path in the image; `fence execute ...` follows.
    pub command: Vec<String>,
    /// The Jobs need no API access: their token is not mounted.
    pub service_account_name: Option<String>,
    pub priority_class_name: Option<String>,
    #[serde(skip)]
    pub node_selector: std::collections::BTreeMap<String, String>,
    #[serde(skip)]
    pub tolerations: Vec<k8s_openapi::api::core::v1::Toleration>,
    /// Where the Secret volumes are mounted in the container.
    pub secrets_path: std::path::PathBuf,
    /// Where the wrapper writes its result: the container's terminationMessagePath.
    pub result_path: std::path::PathBuf,
    /// How long a Job may wait to be scheduled and pulled before its deadline counts
    /// only the agent calls; a Job that never runs fails at this plus its agents' budget.
    pub start_timeout: Duration,
    /// Finished Jobs are deleted this long after they end (their pod's log shows the
    /// agent's redacted output until then).
    pub ttl_after_finished: Duration,
}

impl Default for JobPolicy {
    fn default() -> JobPolicy {
        JobPolicy {
            image: String::new(),
            image_pull_policy: None,
            command: vec!["nodekeeper".to_string()],
            service_account_name: None,
            priority_class_name: None,
            node_selector: Default::default(),
            tolerations: Vec::new(),
            secrets_path: "/run/nodekeeper/secrets".into(),
            result_path: "/dev/termination-log".into(),
            start_timeout: Duration::from_secs(120),
            ttl_after_finished: Duration::from_secs(3600),
        }
    }
}

/// The `coordination.k8s.io` Lease that lets exactly one replica act.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeaderElectionPolicy {
    /// The Lease's name, in the controller's `namespace`.
    pub lease_name: String,
    /// A leader that has not renewed for this long is replaced.
    pub lease_duration: Duration,
    /// How often the leader renews; it stops acting when a renewal has not succeeded
    /// within `renewDeadline`, well before another replica may take over.
    pub renew_interval: Duration,
    pub renew_deadline: Duration,
}

impl Default for LeaderElectionPolicy {
    fn default() -> LeaderElectionPolicy {
        // client-go's leader election defaults: 15 s lease, 10 s renew deadline, 2 s retry.
        LeaderElectionPolicy {
            lease_name: "nodekeeper-controller".to_string(),
            lease_duration: Duration::from_secs(15),
            renew_interval: Duration::from_secs(2),
            renew_deadline: Duration::from_secs(10),
        }
    }
}

/// The whole configuration, resolved.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ControllerPolicy {
    /// Namespace of the fence ConfigMaps and Secrets.
    pub namespace: String,
    /// Only nodes this selects are watched, counted by the storm guard and fenced.
    #[serde(skip)]
    pub node_selector: Option<kube::core::Selector>,
    /// Pods that make a node worth fencing; by default StatefulSet pods and pods with
    /// single-node volumes.
    #[serde(skip)]
    pub pod_selector: Option<kube::core::Selector>,
    pub fence: FencePolicy,
    pub storm: StormPolicy,
    pub agents: AgentsPolicy,
    pub executor: ExecutorPolicy,
    pub leader_election: LeaderElectionPolicy,
    /// The endpoint agents send their reports to.
    pub reports: ReportsPolicy,
    /// Where the controller hears kdump notifications (UDP, `fence_kdump_send`'s port is
    /// 7410); `None`: it does not listen.
    pub kdump_address: Option<std::net::SocketAddr>,
}

impl Default for ControllerPolicy {
    fn default() -> ControllerPolicy {
        ControllerPolicy {
            namespace: "nodekeeper-fencing".to_string(),
            node_selector: None,
            pod_selector: None,
            fence: FencePolicy::default(),
            storm: StormPolicy::default(),
            agents: AgentsPolicy::default(),
            executor: ExecutorPolicy::default(),
            leader_election: LeaderElectionPolicy::default(),
            reports: ReportsPolicy::default(),
            kdump_address: None,
        }
    }
}

impl ControllerPolicy {
    /// The configuration as a `ControllerConfiguration` document with every default
    /// filled in, for `check-config`.
    pub fn effective_document(&self) -> serde_json::Value {
        let go = |duration: Duration| GoDuration::from(duration).to_string();
        let selector = |selector: &Option<kube::core::Selector>| match selector {
            Some(selector) => serde_json::Value::String(selector.to_string()),
            None => serde_json::json!({}),
        };
        serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "namespace": self.namespace,
            "nodeSelector": selector(&self.node_selector),
            "podSelector": selector(&self.pod_selector),
            "unhealthyDuration": go(self.fence.unhealthy_duration),
            "silenceTimeout": go(self.fence.silence_timeout),
            "drainedReportMaxAge": go(self.fence.drained_report_max_age),
            "isolationTimeout": go(self.fence.isolation_timeout),
            "powerManagementDelay": go(self.fence.power_management_delay),
            "kdumpAddress": self.kdump_address.map(|address| address.to_string()),
            "kdumpWait": go(self.fence.kdump_wait),
            "kdumpSilence": go(self.fence.kdump_silence),
            "selfIsolationMargin": go(self.fence.self_isolation_margin),
            "retry": {
                "limit": self.fence.retry_limit,
                "backoff": go(self.fence.retry_backoff),
                "maxBackoff": go(self.fence.retry_backoff_max),
            },
            "release": {
                "outOfServiceTaint": self.fence.out_of_service_taint,
                "deletePods": self.fence.delete_pods,
            },
            "stormGuard": {
                "maxUnhealthy": self.storm.max_unhealthy.to_string(),
                "stormCooldown": go(self.storm.storm_cooldown),
                "zoneFenceRate": self.storm.zone_fence_rate,
                "secondaryZoneFenceRate": self.storm.secondary_zone_fence_rate,
                "largeClusterSizeThreshold": self.storm.large_cluster_size_threshold,
                "unhealthyZoneThreshold": self.storm.unhealthy_zone_threshold,
            },
            "agents": {
                "directory": self.agents.directory.display().to_string(),
                "callTimeout": go(self.agents.call_timeout),
                "verifyTimeout": go(self.agents.verify_timeout),
                "allowedOptions": self.agents.allowed_options,
            },
            "executor": match &self.executor {
                ExecutorPolicy::Local => serde_json::json!({"type": "local"}),
                ExecutorPolicy::Job(job) => serde_json::json!({
                    "type": "job",
                    "job": {
                        "image": job.image,
                        "imagePullPolicy": job.image_pull_policy,
                        "command": job.command,
                        "serviceAccountName": job.service_account_name,
                        "priorityClassName": job.priority_class_name,
                        "nodeSelector": job.node_selector,
                        "tolerations": job.tolerations,
                        "secretsPath": job.secrets_path.display().to_string(),
                        "resultPath": job.result_path.display().to_string(),
                        "startTimeout": go(job.start_timeout),
                        "ttlAfterFinished": go(job.ttl_after_finished),
                    },
                }),
            },
            "leaderElection": {
                "leaseName": self.leader_election.lease_name,
                "leaseDuration": go(self.leader_election.lease_duration),
                "renewInterval": go(self.leader_election.renew_interval),
                "renewDeadline": go(self.leader_election.renew_deadline),
            },
            "reports": {
                "enabled": self.reports.enabled,
                "address": self.reports.address,
                "audience": self.reports.auth.audience,
                "serviceAccounts": self.reports.auth.service_accounts,
                "nodeTokensSecret": self.reports.auth.node_tokens_secret,
                "tokenCacheTTL": go(self.reports.auth.cache_ttl),
                "reconnectGrace": go(self.reports.reconnect_grace),
                "leaderService": self.reports.leader_service,
                "maxBodyBytes": self.reports.max_body_bytes,
                "requestTimeout": go(self.reports.request_timeout),
                "maxConnections": self.reports.max_connections,
                "maxInFlight": self.reports.max_in_flight,
                "tls": self.reports.tls.as_ref().map_or(serde_json::Value::Null, |tls| serde_json::json!({
                    "certFile": tls.cert_file.display().to_string(),
                    "keyFile": tls.key_file.display().to_string(),
                })),
            },
        })
    }
}

/// Whether a YAML text is a `ControllerConfiguration` (by its `kind`).
pub fn is_controller_configuration(text: &str) -> bool {
    serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text)
        .ok()
        .and_then(|value| {
            value
                .get("kind")
                .and_then(|k| k.as_str())
                .map(|k| k == KIND)
        })
        .unwrap_or(false)
}

/// The file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Document {
    api_version: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    node_selector: Option<LabelSelector>,
    pod_selector: Option<LabelSelector>,
    unhealthy_duration: Option<String>,
    silence_timeout: Option<String>,
    drained_report_max_age: Option<String>,
    isolation_timeout: Option<String>,
    power_management_delay: Option<String>,
    kdump_address: Option<String>,
    kdump_wait: Option<String>,
    kdump_silence: Option<String>,
    self_isolation_margin: Option<String>,
    retry: Option<RetryDocument>,
    release: Option<ReleaseDocument>,
    storm_guard: Option<StormDocument>,
    agents: Option<AgentsDocument>,
    executor: Option<ExecutorDocument>,
    leader_election: Option<LeaderElectionDocument>,
    reports: Option<ReportsDocument>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ReportsDocument {
    enabled: Option<bool>,
    address: Option<String>,
    audience: Option<String>,
    service_accounts: Option<Vec<String>>,
    node_tokens_secret: Option<String>,
    #[serde(rename = "tokenCacheTTL")]
    token_cache_ttl: Option<String>,
    reconnect_grace: Option<String>,
    max_body_bytes: Option<usize>,
    request_timeout: Option<String>,
    max_connections: Option<usize>,
    max_in_flight: Option<usize>,
    tls: Option<TlsDocument>,
    leader_service: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TlsDocument {
    cert_file: Option<String>,
    key_file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ExecutorDocument {
    #[serde(rename = "type")]
    kind: Option<String>,
    job: Option<JobDocument>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JobDocument {
    image: Option<String>,
    image_pull_policy: Option<String>,
    command: Option<Vec<String>>,
    service_account_name: Option<String>,
    priority_class_name: Option<String>,
    node_selector: Option<std::collections::BTreeMap<String, String>>,
    tolerations: Option<Vec<k8s_openapi::api::core::v1::Toleration>>,
    secrets_path: Option<std::path::PathBuf>,
    result_path: Option<std::path::PathBuf>,
    start_timeout: Option<String>,
    ttl_after_finished: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AgentsDocument {
    directory: Option<std::path::PathBuf>,
    call_timeout: Option<String>,
    verify_timeout: Option<String>,
    allowed_options: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LeaderElectionDocument {
    lease_name: Option<String>,
    lease_duration: Option<String>,
    renew_interval: Option<String>,
    renew_deadline: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RetryDocument {
    limit: Option<u32>,
    backoff: Option<String>,
    max_backoff: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ReleaseDocument {
    out_of_service_taint: Option<bool>,
    delete_pods: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StormDocument {
    max_unhealthy: Option<serde_yaml_ng::Value>,
    storm_cooldown: Option<String>,
    zone_fence_rate: Option<f64>,
    secondary_zone_fence_rate: Option<f64>,
    large_cluster_size_threshold: Option<usize>,
    unhealthy_zone_threshold: Option<f64>,
}

/// A configuration problem, naming the file and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {field}: {message}")]
pub struct PolicyError {
    pub origin: String,
    pub field: String,
    pub message: String,
}

/// Every problem of one file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct PolicyErrors(pub Vec<PolicyError>);

/// Reads and validates a `ControllerConfiguration` file.
pub fn load(path: &Path) -> Result<ControllerPolicy, PolicyErrors> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| {
        PolicyErrors(vec![PolicyError {
            origin: origin.clone(),
            field: "(file)".to_string(),
            message: format!("cannot read it: {error}"),
        }])
    })?;
    parse(&text, &origin)
}

/// Parses and validates a `ControllerConfiguration` document; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<ControllerPolicy, PolicyErrors> {
    let error = |field: &str, message: String| PolicyError {
        origin: origin.to_string(),
        field: field.to_string(),
        message,
    };
    let document: Document = if text.trim().is_empty() {
        Document::default()
    } else {
        let deserializer = serde_yaml_ng::Deserializer::from_str(text);
        serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            let message = e.into_inner().to_string();
            // serde_yaml_ng often starts its message with the path already.
            let message = message
                .strip_prefix(&format!("{path}: "))
                .map(str::to_string)
                .unwrap_or(message);
            PolicyErrors(vec![error(&path, message)])
        })?
    };
    let mut errors = Vec::new();
    let mut policy = ControllerPolicy::default();

    if let Some(version) = &document.api_version
        && version != API_VERSION
    {
        errors.push(error(
            "apiVersion",
            format!("{version:?} is not {API_VERSION:?}"),
        ));
    }
    if let Some(kind) = &document.kind
        && kind != KIND
    {
        errors.push(error("kind", format!("{kind:?} is not {KIND:?}")));
    }
    if let Some(namespace) = document.namespace {
        if namespace.is_empty() {
            errors.push(error("namespace", "must not be empty".to_string()));
        }
        policy.namespace = namespace;
    }
    let mut selector = |field: &str, value: Option<LabelSelector>| {
        let value = value?;
        match kube::core::Selector::try_from(value) {
            Ok(selector) if selector.selects_all() => None,
            Ok(selector) => Some(selector),
            Err(problem) => {
                errors.push(error(field, problem.to_string()));
                None
            }
        }
    };
    policy.node_selector = selector("nodeSelector", document.node_selector);
    policy.pod_selector = selector("podSelector", document.pod_selector);

    fn duration(
        errors: &mut Vec<PolicyError>,
        origin: &str,
        field: &str,
        text: Option<String>,
        target: &mut Duration,
        zero_ok: bool,
    ) {
        let error = |message: String| PolicyError {
            origin: origin.to_string(),
            field: field.to_string(),
            message,
        };
        let Some(text) = text else { return };
        match GoDuration::parse(&text) {
            Ok(value) if value.is_negative() => {
                errors.push(error(format!("{text:?} must not be negative")))
            }
            Ok(value) if value.is_zero() && !zero_ok => {
                errors.push(error(format!("{text:?} must be longer than zero")))
            }
            Ok(value) => *target = value.to_std(),
            Err(problem) => errors.push(error(problem.to_string())),
        }
    }
    duration(
        &mut errors,
        origin,
        "unhealthyDuration",
        document.unhealthy_duration,
        &mut policy.fence.unhealthy_duration,
        true,
    );
    duration(
        &mut errors,
        origin,
        "silenceTimeout",
        document.silence_timeout,
        &mut policy.fence.silence_timeout,
        true,
    );
    if !policy.fence.silence_timeout.is_zero() && policy.fence.silence_timeout < MIN_SILENCE_TIMEOUT
    {
        errors.push(error(
            "silenceTimeout",
            format!(
                "{} is shorter than {}s: a node would be taken for dead between two reports; give 0s to turn silence detection off",
                GoDuration::from(policy.fence.silence_timeout),
                MIN_SILENCE_TIMEOUT.as_secs()
            ),
        ));
    }
    // Unset, it follows a long silenceTimeout: a report must outlive the silence.
    let silence = policy.fence.silence_timeout;
    policy.fence.drained_report_max_age = policy
        .fence
        .drained_report_max_age
        .max(silence.saturating_mul(2));
    duration(
        &mut errors,
        origin,
        "drainedReportMaxAge",
        document.drained_report_max_age,
        &mut policy.fence.drained_report_max_age,
        true,
    );
    let max_age = policy.fence.drained_report_max_age;
    if !max_age.is_zero() && !silence.is_zero() && max_age <= silence {
        errors.push(error(
            "drainedReportMaxAge",
            format!(
                "{} is not longer than silenceTimeout ({}): a drained node's word would expire before silence fences the node anyway, and a storm or the zone rate holding its release back for a moment would void it; give more, or 0s to turn the drained fast path off",
                GoDuration::from(max_age),
                GoDuration::from(silence)
            ),
        ));
    }
    duration(
        &mut errors,
        origin,
        "isolationTimeout",
        document.isolation_timeout,
        &mut policy.fence.isolation_timeout,
        true,
    );
    duration(
        &mut errors,
        origin,
        "powerManagementDelay",
        document.power_management_delay,
        &mut policy.fence.power_management_delay,
        true,
    );
    if let Some(address) = document.kdump_address.filter(|a| !a.is_empty()) {
        match address.parse::<std::net::SocketAddr>() {
            Ok(address) => policy.kdump_address = Some(address),
            Err(_) => errors.push(error(
                "kdumpAddress",
                format!("{address:?} is not an address and port like 0.0.0.0:7410"),
            )),
        }
    }
    duration(
        &mut errors,
        origin,
        "kdumpWait",
        document.kdump_wait,
        &mut policy.fence.kdump_wait,
        true,
    );
    duration(
        &mut errors,
        origin,
        "kdumpSilence",
        document.kdump_silence,
        &mut policy.fence.kdump_silence,
        false,
    );
    duration(
        &mut errors,
        origin,
        "selfIsolationMargin",
        document.self_isolation_margin,
        &mut policy.fence.self_isolation_margin,
        true,
    );
    let margin = policy.fence.self_isolation_margin;
    if !margin.is_zero() && margin < MIN_SELF_ISOLATION_MARGIN {
        errors.push(error(
            "selfIsolationMargin",
            format!(
                "{} is shorter than {}: the margin covers a watchdog's reset and the network's delays; give more, or 0s to never release on a promise",
                GoDuration::from(margin),
                GoDuration::from(MIN_SELF_ISOLATION_MARGIN)
            ),
        ));
    }
    let retry = document.retry.unwrap_or_default();
    if let Some(limit) = retry.limit {
        policy.fence.retry_limit = limit;
    }
    duration(
        &mut errors,
        origin,
        "retry.backoff",
        retry.backoff,
        &mut policy.fence.retry_backoff,
        false,
    );
    duration(
        &mut errors,
        origin,
        "retry.maxBackoff",
        retry.max_backoff,
        &mut policy.fence.retry_backoff_max,
        false,
    );
    let release = document.release.unwrap_or_default();
    if let Some(taint) = release.out_of_service_taint {
        policy.fence.out_of_service_taint = taint;
    }
    if let Some(delete) = release.delete_pods {
        policy.fence.delete_pods = delete;
    }
    let storm = document.storm_guard.unwrap_or_default();
    duration(
        &mut errors,
        origin,
        "stormGuard.stormCooldown",
        storm.storm_cooldown,
        &mut policy.storm.storm_cooldown,
        true,
    );
    if let Some(value) = storm.max_unhealthy {
        let text = match &value {
            serde_yaml_ng::Value::String(text) => Some(text.clone()),
            serde_yaml_ng::Value::Number(number) => Some(number.to_string()),
            _ => None,
        };
        match text.map(|text| CountOrPercent::parse(&text)) {
            Some(Ok(parsed)) => policy.storm.max_unhealthy = parsed,
            Some(Err(message)) => errors.push(error("stormGuard.maxUnhealthy", message)),
            None => errors.push(error(
                "stormGuard.maxUnhealthy",
                "must be a node count or a percentage like 40%".to_string(),
            )),
        }
    }
    let mut rate = |field: &str, value: Option<f64>, target: &mut f64| {
        let Some(value) = value else { return };
        if value.is_finite() && value >= 0.0 {
            *target = value;
        } else {
            errors.push(error(
                field,
                format!("{value} must be zero or more fences per second"),
            ));
        }
    };
    rate(
        "stormGuard.zoneFenceRate",
        storm.zone_fence_rate,
        &mut policy.storm.zone_fence_rate,
    );
    rate(
        "stormGuard.secondaryZoneFenceRate",
        storm.secondary_zone_fence_rate,
        &mut policy.storm.secondary_zone_fence_rate,
    );
    if let Some(size) = storm.large_cluster_size_threshold {
        policy.storm.large_cluster_size_threshold = size;
    }
    if let Some(threshold) = storm.unhealthy_zone_threshold {
        if threshold.is_finite() && threshold > 0.0 && threshold <= 1.0 {
            policy.storm.unhealthy_zone_threshold = threshold;
        } else {
            errors.push(error(
                "stormGuard.unhealthyZoneThreshold",
                format!("{threshold} must be a share above 0 and at most 1"),
            ));
        }
    }
    let agents = document.agents.unwrap_or_default();
    if let Some(directory) = agents.directory {
        if !directory.is_absolute() {
            errors.push(error(
                "agents.directory",
                format!("{} must be an absolute path", directory.display()),
            ));
        }
        policy.agents.directory = directory;
    }
    duration(
        &mut errors,
        origin,
        "agents.callTimeout",
        agents.call_timeout,
        &mut policy.agents.call_timeout,
        false,
    );
    duration(
        &mut errors,
        origin,
        "agents.verifyTimeout",
        agents.verify_timeout,
        &mut policy.agents.verify_timeout,
        false,
    );
    if let Some(options) = agents.allowed_options {
        policy.agents.allowed_options = options;
    }
    let executor = document.executor.unwrap_or_default();
    match executor.kind.as_deref().unwrap_or("local") {
        "local" => {}
        "job" => {
            let job = executor.job.unwrap_or_default();
            let mut policy_job = JobPolicy::default();
            match job.image {
                Some(image) if !image.trim().is_empty() => policy_job.image = image,
                _ => errors.push(error(
                    "executor.job.image",
                    "is required with executor.type job: an image with nodekeeper and the fence agents".to_string(),
                )),
            }
            if let Some(pull) = job.image_pull_policy {
                if !["Always", "IfNotPresent", "Never"].contains(&pull.as_str()) {
                    errors.push(error(
                        "executor.job.imagePullPolicy",
                        format!("{pull:?} is not Always, IfNotPresent or Never"),
                    ));
                }
                policy_job.image_pull_policy = Some(pull);
            }
            if let Some(command) = job.command {
                if command.is_empty() || command.iter().any(|part| part.is_empty()) {
                    errors.push(error(
                        "executor.job.command",
                        "must name nodekeeper's path in the image, like [/usr/bin/nodekeeper]"
                            .to_string(),
                    ));
                }
                policy_job.command = command;
            }
            policy_job.service_account_name = job.service_account_name.filter(|s| !s.is_empty());
            policy_job.priority_class_name = job.priority_class_name.filter(|s| !s.is_empty());
            policy_job.node_selector = job.node_selector.unwrap_or_default();
            policy_job.tolerations = job.tolerations.unwrap_or_default();
            for (field, path, target) in [
                (
                    "executor.job.secretsPath",
                    job.secrets_path,
                    &mut policy_job.secrets_path,
                ),
                (
                    "executor.job.resultPath",
                    job.result_path,
                    &mut policy_job.result_path,
                ),
            ] {
                let Some(path) = path else { continue };
                if !path.is_absolute() || path.parent().is_none() {
                    errors.push(error(
                        field,
                        format!("{} must be an absolute path below /", path.display()),
                    ));
                }
                *target = path;
            }
            duration(
                &mut errors,
                origin,
                "executor.job.startTimeout",
                job.start_timeout,
                &mut policy_job.start_timeout,
                false,
            );
            duration(
                &mut errors,
                origin,
                "executor.job.ttlAfterFinished",
                job.ttl_after_finished,
                &mut policy_job.ttl_after_finished,
                true,
            );
            if policy_job.ttl_after_finished < Duration::from_secs(300) {
                errors.push(error(
                    "executor.job.ttlAfterFinished",
                    "must be at least 5m: a Job deleted before the controller (or the next \
                     leader) has read its result leaves the outcome unknown"
                        .to_string(),
                ));
            }
            policy.executor = ExecutorPolicy::Job(Box::new(policy_job));
        }
        other => errors.push(error(
            "executor.type",
            format!("{other:?} is neither local nor job"),
        )),
    }
    let election = document.leader_election.unwrap_or_default();
    if let Some(name) = election.lease_name {
        if name.is_empty() {
            errors.push(error(
                "leaderElection.leaseName",
                "must not be empty".to_string(),
            ));
        }
        policy.leader_election.lease_name = name;
    }
    duration(
        &mut errors,
        origin,
        "leaderElection.leaseDuration",
        election.lease_duration,
        &mut policy.leader_election.lease_duration,
        false,
    );
    duration(
        &mut errors,
        origin,
        "leaderElection.renewInterval",
        election.renew_interval,
        &mut policy.leader_election.renew_interval,
        false,
    );
    duration(
        &mut errors,
        origin,
        "leaderElection.renewDeadline",
        election.renew_deadline,
        &mut policy.leader_election.renew_deadline,
        false,
    );
    let election = &policy.leader_election;
    if election.renew_deadline >= election.lease_duration {
        errors.push(error(
            "leaderElection.renewDeadline",
            "must be shorter than leaderElection.leaseDuration, so a leader stops acting before another may take over".to_string(),
        ));
    } else if election.renew_interval >= election.renew_deadline {
        errors.push(error(
            "leaderElection.renewInterval",
            "must be shorter than leaderElection.renewDeadline".to_string(),
        ));
    }
    let reports = document.reports.unwrap_or_default();
    if let Some(enabled) = reports.enabled {
        policy.reports.enabled = enabled;
    }
    if let Some(address) = reports.address {
        if address.parse::<std::net::SocketAddr>().is_err() {
            errors.push(error(
                "reports.address",
                format!("{address:?} is not an address and port like 0.0.0.0:9849"),
            ));
        }
        policy.reports.address = address;
    }
    duration(
        &mut errors,
        origin,
        "reports.tokenCacheTTL",
        reports.token_cache_ttl,
        &mut policy.reports.auth.cache_ttl,
        true,
    );
    duration(
        &mut errors,
        origin,
        "reports.reconnectGrace",
        reports.reconnect_grace,
        &mut policy.reports.reconnect_grace,
        true,
    );
    duration(
        &mut errors,
        origin,
        "reports.requestTimeout",
        reports.request_timeout,
        &mut policy.reports.request_timeout,
        false,
    );
    if let Some(audience) = reports.audience {
        if audience.trim().is_empty() {
            errors.push(error("reports.audience", "must not be empty".to_string()));
        }
        policy.reports.auth.audience = audience;
    }
    if let Some(accounts) = reports.service_accounts {
        for account in &accounts {
            if crate::report::auth::service_account_username(account).is_none() {
                errors.push(error(
                    "reports.serviceAccounts",
                    format!("{account:?} is not namespace/name"),
                ));
            }
        }
        policy.reports.auth.service_accounts = accounts;
    }
    policy.reports.auth.node_tokens_secret = reports.node_tokens_secret.filter(|s| !s.is_empty());
    if let Some(service) = reports.leader_service.filter(|s| !s.is_empty()) {
        if !is_service_name(&service) {
            errors.push(error(
                "reports.leaderService",
                format!("{service:?} is not a Service name (lowercase letters, digits and '-', starting with a letter, at most 63)"),
            ));
        } else if !policy.reports.enabled {
            errors.push(error(
                "reports.leaderService",
                "needs reports.enabled: there are no reports to send to the leader".to_string(),
            ));
        }
        policy.reports.leader_service = Some(service);
    }
    if let Some(tls) = reports.tls {
        let file = |field: &'static str, value: Option<String>, errors: &mut Vec<PolicyError>| {
            match value.filter(|path| !path.trim().is_empty()) {
                Some(path) if path.starts_with('/') => Some(std::path::PathBuf::from(path)),
                Some(path) => {
                    errors.push(error(field, format!("{path:?} must be an absolute path")));
                    None
                }
                None => {
                    errors.push(error(
                        field,
                        "is required with reports.tls (a PEM file, like a kubernetes.io/tls Secret's tls.crt and tls.key)".to_string(),
                    ));
                    None
                }
            }
        };
        let cert_file = file("reports.tls.certFile", tls.cert_file, &mut errors);
        let key_file = file("reports.tls.keyFile", tls.key_file, &mut errors);
        if let (Some(cert_file), Some(key_file)) = (cert_file, key_file) {
            policy.reports.tls = Some(crate::report::TlsFiles {
                cert_file,
                key_file,
            });
        }
    }
    for (field, value, target, least) in [
        (
            "reports.maxBodyBytes",
            reports.max_body_bytes,
            &mut policy.reports.max_body_bytes,
            4096,
        ),
        (
            "reports.maxConnections",
            reports.max_connections,
            &mut policy.reports.max_connections,
            1,
        ),
        (
            "reports.maxInFlight",
            reports.max_in_flight,
            &mut policy.reports.max_in_flight,
            1,
        ),
    ] {
        let Some(value) = value else { continue };
        if value < least {
            errors.push(error(field, format!("{value} must be at least {least}")));
        }
        *target = value;
    }
    if policy.fence.retry_backoff_max < policy.fence.retry_backoff {
        errors.push(error(
            "retry.maxBackoff",
            "must not be shorter than retry.backoff".to_string(),
        ));
    }
    if errors.is_empty() {
        Ok(policy)
    } else {
        Err(PolicyErrors(errors))
    }
}

/// A Service name as Kubernetes requires it (an RFC 1035 label).
fn is_service_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes[0].is_ascii_lowercase()
        && bytes[bytes.len() - 1] != b'-'
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leader_service_must_be_a_service_name_with_reports_on() {
        let policy = parse(
            "reports: {leaderService: nodekeeper-controller}\n",
            "c.yaml",
        )
        .expect("valid");
        assert_eq!(
            policy.reports.leader_service.as_deref(),
            Some("nodekeeper-controller")
        );
        for (text, wanted) in [
            (
                "reports: {leaderService: Nodekeeper}\n",
                "is not a Service name",
            ),
            (
                "reports: {leaderService: 9lives}\n",
                "is not a Service name",
            ),
            (
                "reports: {leaderService: trailing-}\n",
                "is not a Service name",
            ),
            (
                "reports: {enabled: false, leaderService: svc}\n",
                "needs reports.enabled",
            ),
        ] {
            let errors = parse(text, "c.yaml").expect_err(text).to_string();
            assert!(
                errors.contains("reports.leaderService") && errors.contains(wanted),
                "{text}: {errors}"
            );
        }
        assert_eq!(parse("", "c.yaml").unwrap().reports.leader_service, None);
    }

    #[test]
    fn an_empty_file_gives_the_documented_defaults() {
        let policy = parse("", "empty.yaml").expect("valid");
        assert_eq!(policy, ControllerPolicy::default());
        assert_eq!(policy.fence.unhealthy_duration, Duration::from_secs(60));
        assert_eq!(policy.storm.max_unhealthy, CountOrPercent::Percent(40.0));
    }

    #[test]
    fn the_shipped_example_is_valid() {
        let text = include_str!("../../config/controller.yaml");
        parse(text, "config/controller.yaml").expect("the shipped file is valid");
    }

    #[test]
    fn every_field_is_read() {
        let policy = parse(
            "apiVersion: nodekeeper.io/v1alpha1\nkind: ControllerConfiguration\nnamespace: fencing\n\
             unhealthyDuration: 30s\npowerManagementDelay: 2m\n\
             retry: {limit: 5, backoff: 10s, maxBackoff: 1m}\n\
             release: {outOfServiceTaint: false, deletePods: true}\n\
             nodeSelector: {matchLabels: {role: worker}}\n\
             stormGuard: {maxUnhealthy: 2, stormCooldown: 1m, zoneFenceRate: 1, secondaryZoneFenceRate: 0.5, largeClusterSizeThreshold: 10, unhealthyZoneThreshold: 0.7}\n",
            "full.yaml",
        )
        .expect("valid");
        assert_eq!(policy.namespace, "fencing");
        assert_eq!(policy.fence.unhealthy_duration, Duration::from_secs(30));
        assert_eq!(
            policy.fence.power_management_delay,
            Duration::from_secs(120)
        );
        assert_eq!(policy.fence.retry_limit, 5);
        assert_eq!(policy.fence.backoff(1), Duration::from_secs(10));
        assert_eq!(policy.fence.backoff(3), Duration::from_secs(40));
        assert_eq!(policy.fence.backoff(9), Duration::from_secs(60));
        assert!(!policy.fence.out_of_service_taint);
        assert!(policy.fence.delete_pods);
        assert!(policy.node_selector.is_some());
        assert_eq!(policy.storm.max_unhealthy, CountOrPercent::Count(2));
        assert_eq!(policy.storm.large_cluster_size_threshold, 10);
    }

    #[test]
    fn a_self_isolation_promise_is_taken_with_a_margin_of_at_least_five_seconds_or_never() {
        let defaults = ControllerPolicy::default();
        assert_eq!(
            defaults.fence.self_isolation_margin,
            Duration::from_secs(30)
        );
        let policy = parse("selfIsolationMargin: 1m\n", "margin.yaml").expect("valid");
        assert_eq!(policy.fence.self_isolation_margin, Duration::from_secs(60));
        assert_eq!(policy.effective_document()["selfIsolationMargin"], "1m0s");
        assert!(
            parse("selfIsolationMargin: 0s\n", "off.yaml")
                .expect("0s turns it off")
                .fence
                .self_isolation_margin
                .is_zero()
        );
        let short = parse("selfIsolationMargin: 2s\n", "short.yaml")
            .expect_err("too short")
            .to_string();
        assert!(
            short.contains("selfIsolationMargin") && short.contains("shorter than 5s"),
            "{short}"
        );
    }

    #[test]
    fn kdump_is_heard_only_on_an_address_given_and_its_waits_are_checked() {
        let defaults = ControllerPolicy::default();
        assert_eq!(defaults.kdump_address, None);
        assert_eq!(defaults.fence.kdump_wait, Duration::from_secs(600));
        assert_eq!(defaults.fence.kdump_silence, Duration::from_secs(30));
        let policy = parse(
            "kdumpAddress: 0.0.0.0:7410\nkdumpWait: 15m\nkdumpSilence: 25s\n",
            "kdump.yaml",
        )
        .expect("valid");
        assert_eq!(
            policy.kdump_address,
            Some("0.0.0.0:7410".parse().expect("address"))
        );
        assert_eq!(policy.fence.kdump_wait, Duration::from_secs(900));
        assert_eq!(policy.fence.kdump_silence, Duration::from_secs(25));
        let effective = policy.effective_document();
        assert_eq!(effective["kdumpAddress"], "0.0.0.0:7410");
        assert_eq!(effective["kdumpWait"], "15m0s");
        assert_eq!(effective["kdumpSilence"], "25s");
        assert!(defaults.effective_document()["kdumpAddress"].is_null());
        assert!(
            parse("kdumpWait: 0s\n", "now.yaml")
                .expect("no wait is allowed")
                .fence
                .kdump_wait
                .is_zero()
        );
        let bad = parse("kdumpAddress: port-7410\nkdumpSilence: 0s\n", "bad.yaml")
            .expect_err("refused")
            .to_string();
        assert!(
            bad.contains(
                "bad.yaml: kdumpAddress: \"port-7410\" is not an address and port like 0.0.0.0:7410"
            ),
            "{bad}"
        );
        assert!(
            bad.contains("bad.yaml: kdumpSilence: \"0s\" must be longer than zero"),
            "{bad}"
        );
    }

    #[test]
    fn the_drained_report_bound_outlives_the_silence_and_can_be_turned_off() {
        let defaults = ControllerPolicy::default().fence;
        assert_eq!(defaults.drained_report_max_age, Duration::from_secs(120));
        assert_eq!(defaults.isolation_timeout, Duration::from_secs(60));
        let isolation = parse("isolationTimeout: 20s\n", "isolation.yaml").expect("valid");
        assert_eq!(isolation.fence.isolation_timeout, Duration::from_secs(20));
        assert_eq!(isolation.effective_document()["isolationTimeout"], "20s");
        let off = parse("isolationTimeout: 0s\n", "off.yaml").expect("valid");
        assert!(off.fence.isolation_timeout.is_zero());
        let bad = parse("isolationTimeout: soon\n", "bad.yaml").expect_err("refused");
        assert!(bad.to_string().contains("isolationTimeout"), "{bad}");
        let policy = parse("drainedReportMaxAge: 45s\n", "drained.yaml").expect("valid");
        assert_eq!(policy.fence.drained_report_max_age, Duration::from_secs(45));
        assert_eq!(policy.effective_document()["drainedReportMaxAge"], "45s");
        let off = parse("drainedReportMaxAge: 0s\n", "off.yaml").expect("valid");
        assert!(off.fence.drained_report_max_age.is_zero());
        // Unset, it follows a long silence timeout.
        let long = parse("silenceTimeout: 3m\n", "long.yaml").expect("valid");
        assert_eq!(long.fence.drained_report_max_age, Duration::from_secs(360));
        let text = parse(
            "silenceTimeout: 30s\ndrainedReportMaxAge: 30s\n",
            "short.yaml",
        )
        .expect_err("expires with the silence")
        .to_string();
        assert!(
            text.contains("short.yaml: drainedReportMaxAge:") && text.contains("0s to turn"),
            "{text}"
        );
    }

    #[test]
    fn silence_detection_is_read_can_be_turned_off_and_refuses_a_timeout_below_two_seconds() {
        assert_eq!(
            ControllerPolicy::default().fence.silence_timeout,
            Duration::from_secs(20)
        );
        assert_eq!(
            ControllerPolicy::default().reports.reconnect_grace,
            Duration::from_secs(40)
        );
        let policy = parse(
            "silenceTimeout: 45s\nreports: {reconnectGrace: 1m}\n",
            "silence.yaml",
        )
        .expect("valid");
        assert_eq!(policy.fence.silence_timeout, Duration::from_secs(45));
        assert_eq!(policy.reports.reconnect_grace, Duration::from_secs(60));
        let off = parse("silenceTimeout: 0s\n", "off.yaml").expect("valid");
        assert!(off.fence.silence_timeout.is_zero());
        let text = parse("silenceTimeout: 1500ms\n", "short.yaml")
            .expect_err("too short")
            .to_string();
        assert!(
            text.contains("short.yaml: silenceTimeout:") && text.contains("0s to turn"),
            "{text}"
        );
        let text = parse("reports: {reconnectGrace: -1s}\n", "grace.yaml")
            .expect_err("negative")
            .to_string();
        assert!(text.contains("reports.reconnectGrace"), "{text}");
        let effective = policy.effective_document();
        assert_eq!(effective["silenceTimeout"], "45s");
        assert_eq!(effective["reports"]["reconnectGrace"], "1m0s");
    }

    #[test]
    fn errors_name_the_file_and_field_and_all_are_reported() {
        let errors = parse(
            "unhealthyDuration: 10 minutes\nstormGuard: {maxUnhealthy: 140%, zoneFenceRate: -1}\n",
            "bad.yaml",
        )
        .expect_err("invalid");
        let text = errors.to_string();
        assert!(text.contains("bad.yaml: unhealthyDuration:"), "{text}");
        assert!(
            text.contains("bad.yaml: stormGuard.maxUnhealthy: \"140%\" must be between"),
            "{text}"
        );
        assert!(
            text.contains("bad.yaml: stormGuard.zoneFenceRate:"),
            "{text}"
        );
        assert_eq!(errors.0.len(), 3);
    }

    #[test]
    fn an_unknown_field_is_refused_with_its_path() {
        let errors = parse("stormGuard:\n  maxUnhealty: 2\n", "typo.yaml").expect_err("invalid");
        let text = errors.to_string();
        assert!(
            text.contains("typo.yaml: stormGuard.maxUnhealty: "),
            "{text}"
        );
        assert!(text.contains("expected one of `maxUnhealthy`"), "{text}");
        assert!(text.contains("maxUnhealty"), "{text}");
    }

    #[test]
    fn the_report_endpoints_tls_files_are_read_and_checked() {
        assert_eq!(
            ControllerPolicy::default().reports.tls,
            None,
            "plain HTTP by default"
        );
        let policy = parse(
            "reports: {tls: {certFile: /etc/tls/tls.crt, keyFile: /etc/tls/tls.key}}\n",
            "tls.yaml",
        )
        .expect("valid");
        let tls = policy.reports.tls.clone().expect("tls");
        assert_eq!(tls.cert_file, std::path::Path::new("/etc/tls/tls.crt"));
        assert_eq!(tls.key_file, std::path::Path::new("/etc/tls/tls.key"));
        assert_eq!(
            policy.effective_document()["reports"]["tls"]["keyFile"],
            "/etc/tls/tls.key"
        );
        let text = parse("reports: {tls: {certFile: tls.crt}}\n", "bad.yaml")
            .expect_err("invalid")
            .to_string();
        assert!(
            text.contains("bad.yaml: reports.tls.certFile: \"tls.crt\" must be an absolute path"),
            "{text}"
        );
        assert!(
            text.contains("bad.yaml: reports.tls.keyFile: is required with reports.tls"),
            "{text}"
        );
        let text = parse("reports: {tls: {cert: /a}}\n", "typo.yaml")
            .expect_err("unknown field")
            .to_string();
        assert!(text.contains("certFile"), "{text}");
    }

    #[test]
    fn agents_and_leader_election_are_read_and_checked() {
        let policy = parse(
            "agents: {directory: /opt/fence, callTimeout: 20s, verifyTimeout: 5s, allowedOptions: [status-file]}\n\
             leaderElection: {leaseName: fencer, leaseDuration: 30s, renewInterval: 5s, renewDeadline: 20s}\n",
            "agents.yaml",
        )
        .expect("valid");
        assert_eq!(policy.agents.directory, std::path::Path::new("/opt/fence"));
        assert_eq!(policy.agents.call_timeout, Duration::from_secs(20));
        assert!(
            policy
                .agents
                .resolve_policy()
                .allowed_options
                .contains("status_file")
        );
        assert_eq!(policy.leader_election.lease_name, "fencer");
        assert_eq!(
            policy.leader_election.renew_deadline,
            Duration::from_secs(20)
        );
        let errors = parse(
            "agents: {directory: fence}\nleaderElection: {leaseDuration: 10s, renewDeadline: 10s}\n",
            "bad.yaml",
        )
        .expect_err("invalid");
        let text = errors.to_string();
        assert!(
            text.contains("bad.yaml: agents.directory: fence must be an absolute path"),
            "{text}"
        );
        assert!(
            text.contains("bad.yaml: leaderElection.renewDeadline: must be shorter"),
            "{text}"
        );
    }

    #[test]
    fn the_report_endpoint_is_read_and_checked() {
        let policy = parse(
            "reports: {address: \"127.0.0.1:7000\", audience: fencing, \
             serviceAccounts: [ops/agent], nodeTokensSecret: node-tokens, tokenCacheTTL: 2m, maxBodyBytes: 8192, \
             requestTimeout: 2s, maxConnections: 100, maxInFlight: 10}\n",
            "reports.yaml",
        )
        .expect("valid");
        let reports = &policy.reports;
        assert_eq!(reports.address, "127.0.0.1:7000");
        assert_eq!(reports.auth.audience, "fencing");
        assert_eq!(reports.auth.service_accounts, ["ops/agent"]);
        assert_eq!(
            reports.auth.node_tokens_secret.as_deref(),
            Some("node-tokens")
        );
        assert_eq!(reports.max_body_bytes, 8192);
        assert_eq!(reports.auth.cache_ttl, Duration::from_secs(120));
        assert_eq!(reports.max_in_flight, 10);
        assert_eq!(
            policy.effective_document()["reports"]["tokenCacheTTL"],
            "2m0s"
        );

        let errors = parse(
            "reports: {address: nowhere, requestTimeout: 0s, audience: \"\", serviceAccounts: [agent], maxBodyBytes: 10, maxInFlight: 0}\n",
            "bad.yaml",
        )
        .expect_err("invalid");
        let text = errors.to_string();
        for expected in [
            "bad.yaml: reports.address: \"nowhere\" is not an address",
            "bad.yaml: reports.requestTimeout: \"0s\" must be longer than zero",
            "bad.yaml: reports.audience: must not be empty",
            "bad.yaml: reports.serviceAccounts: \"agent\" is not namespace/name",
            "bad.yaml: reports.maxBodyBytes: 10 must be at least 4096",
            "bad.yaml: reports.maxInFlight: 0 must be at least 1",
        ] {
            assert!(text.contains(expected), "{expected}\n{text}");
        }
    }

    #[test]
    fn the_job_executor_is_read_and_checked() {
        let policy = parse(
            "executor:\n  type: job\n  job:\n    image: registry.example/nodekeeper:0.1\n    command: [/usr/bin/nodekeeper]\n    \
             nodeSelector: {node-role.kubernetes.io/control-plane: \"\"}\n    \
             tolerations: [{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}]\n    \
             startTimeout: 30s\n    ttlAfterFinished: 10m\n",
            "jobs.yaml",
        )
        .expect("valid");
        let ExecutorPolicy::Job(job) = &policy.executor else {
            panic!("not the Job executor: {:?}", policy.executor);
        };
        assert_eq!(job.image, "registry.example/nodekeeper:0.1");
        assert_eq!(job.command, ["/usr/bin/nodekeeper"]);
        assert_eq!(job.tolerations.len(), 1);
        assert_eq!(job.node_selector.len(), 1);
        assert_eq!(job.start_timeout, Duration::from_secs(30));
        assert_eq!(job.ttl_after_finished, Duration::from_secs(600));
        assert_eq!(
            job.result_path,
            std::path::Path::new("/dev/termination-log")
        );
        assert_eq!(
            policy.effective_document()["executor"]["job"]["startTimeout"],
            "30s"
        );

        let errors = parse(
            "executor: {type: job, job: {imagePullPolicy: Sometimes, secretsPath: secrets, command: [], ttlAfterFinished: 0s}}\n",
            "bad.yaml",
        )
        .expect_err("invalid");
        let text = errors.to_string();
        assert!(
            text.contains("bad.yaml: executor.job.image: is required"),
            "{text}"
        );
        assert!(
            text.contains("bad.yaml: executor.job.imagePullPolicy: \"Sometimes\""),
            "{text}"
        );
        assert!(
            text.contains("bad.yaml: executor.job.secretsPath: secrets must be"),
            "{text}"
        );
        assert!(text.contains("bad.yaml: executor.job.command:"), "{text}");
        assert!(
            text.contains("bad.yaml: executor.job.ttlAfterFinished: must be at least 5m"),
            "{text}"
        );
        let errors = parse("executor: {type: pod}\n", "bad.yaml").expect_err("invalid");
        assert!(
            errors
                .to_string()
                .contains("executor.type: \"pod\" is neither"),
            "{errors}"
        );
    }

    #[test]
    fn percentages_round_down() {
        assert_eq!(CountOrPercent::Percent(40.0).allowed(5), 2);
        assert_eq!(CountOrPercent::Percent(40.0).allowed(3), 1);
        assert_eq!(CountOrPercent::Percent(40.0).allowed(2), 0);
        assert_eq!(CountOrPercent::Percent(100.0).allowed(7), 7);
        assert_eq!(CountOrPercent::Count(3).allowed(2), 3);
    }
}
