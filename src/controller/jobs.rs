//! The Job executor's pure parts: a Job's deterministic name, the Job built for one
//! execution, and how a Job and its pods stand, as the state machine reads it.
//!
//! A Job is named from the NodeFence's uid and the execution's name (which holds the
//! step, attempt, alternative, method and kind), so a controller that restarts, or a
//! new leader, finds the Job the previous one created and adopts it instead of starting
//! a second one for the same execution.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, KeyToPath, NodeAffinity, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec, PodTemplateSpec,
    PreferredSchedulingTerm, SeccompProfile, SecretVolumeSource, SecurityContext, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

use crate::fencing::ExecutionResult;
use crate::fencing::job::{JobExecution, decode_result};

use super::decide::{ExecutionRequest, Outcome, ReportedState};
use super::executor::{FenceId, outcome};
use super::policy::JobPolicy;

/// Selects every Job (and Job pod) the controller creates.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "nodekeeper-controller";
/// The NodeFence's uid, on the Job and its pods.
pub const FENCE_UID_LABEL: &str = "fencing.nodekeeper.io/fence-uid";
/// The NodeFence's name, the node and the execution, on the Job and its pods (names
/// may be longer than a label value allows).
pub const FENCE_ANNOTATION: &str = "fencing.nodekeeper.io/fence";
pub const NODE_ANNOTATION: &str = "fencing.nodekeeper.io/node";
pub const EXECUTION_ANNOTATION: &str = "fencing.nodekeeper.io/execution";
/// When every agent of the Job has certainly ended (RFC 3339), on the Job and its pods.
pub const ENDS_BY_ANNOTATION: &str = "fencing.nodekeeper.io/ends-by";
/// The container's name in every fence Job.
pub const CONTAINER: &str = "fence-agent";

/// The Job of one execution: `fence-<node>-<hash>`, at most 63 characters (the Job
/// controller puts the name in a label), the same for the same uid and execution.
pub fn job_name(fence: &FenceId, execution: &str) -> String {
    let mut node: String = fence
        .node
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    while node.ends_with('-') {
        node.pop();
    }
    let hash = fnv1a(&[fence.uid.as_bytes(), b"\n", execution.as_bytes()]);
    if node.is_empty() {
        format!("fence-{hash:016x}")
    } else {
        format!("fence-{node}-{hash:016x}")
    }
}

/// FNV-1a, 64 bits: stable across releases and platforms, which a name must be.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in parts.iter().flat_map(|part| part.iter()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// What the Job of one execution is built from.
pub struct JobInput<'a> {
    pub policy: &'a JobPolicy,
    /// Where the agents are installed in the Job's image.
    pub agents_dir: &'a Path,
    pub namespace: &'a str,
    pub fence: &'a FenceId,
    pub request: &'a ExecutionRequest,
    pub execution: &'a JobExecution,
    /// Nodes where earlier failed Jobs of this fence ran: a retry prefers another one.
    pub avoid_nodes: &'a [String],
}

/// The Job for one execution. Credentials are only referenced: each Secret the
/// execution reads is a volume limited to the keys it needs.
pub fn build_job(input: &JobInput<'_>) -> Job {
    let policy = input.policy;
    let name = job_name(input.fence, &input.request.name);
    let labels = BTreeMap::from([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
        (
            "app.kubernetes.io/name".to_string(),
            "nodekeeper".to_string(),
        ),
        (
            "app.kubernetes.io/component".to_string(),
            "fence-execution".to_string(),
        ),
        (FENCE_UID_LABEL.to_string(), input.fence.uid.clone()),
    ]);
    let mut annotations = BTreeMap::from([
        (FENCE_ANNOTATION.to_string(), input.fence.name.clone()),
        (NODE_ANNOTATION.to_string(), input.fence.node.clone()),
        (EXECUTION_ANNOTATION.to_string(), input.request.name.clone()),
    ]);
    if let Some(end) = input.execution.ends_by() {
        annotations.insert(ENDS_BY_ANNOTATION.to_string(), end.to_string());
    }
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    for (index, (secret, keys)) in input.execution.secrets().into_iter().enumerate() {
        let volume = format!("secret-{index}");
        volumes.push(Volume {
            name: volume.clone(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.clone()),
                items: Some(
                    keys.into_iter()
                        .map(|key| KeyToPath {
                            path: key.clone(),
                            key,
                            mode: None,
                        })
                        .collect(),
                ),
                default_mode: Some(0o400),
                optional: Some(false),
            }),
            ..Volume::default()
        });
        mounts.push(VolumeMount {
            name: volume,
            mount_path: policy.secrets_path.join(&secret).display().to_string(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
    // The execution document holds no credential; serializing plain data cannot fail.
    let document = serde_json::to_string(input.execution).unwrap_or_default();
    let mut args: Vec<String> = policy.command.iter().skip(1).cloned().collect();
    args.extend([
        "fence".to_string(),
        "execute".to_string(),
        "--execution".to_string(),
        document,
        "--secrets-dir".to_string(),
        policy.secrets_path.display().to_string(),
        "--result-file".to_string(),
        policy.result_path.display().to_string(),
        "--agents-dir".to_string(),
        input.agents_dir.display().to_string(),
    ]);
    let container = Container {
        name: CONTAINER.to_string(),
        image: Some(policy.image.clone()),
        image_pull_policy: policy.image_pull_policy.clone(),
        command: Some(policy.command.iter().take(1).cloned().collect()),
        args: Some(args),
        volume_mounts: Some(mounts),
        termination_message_path: Some(policy.result_path.display().to_string()),
        termination_message_policy: Some("File".to_string()),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_string()]),
                add: None,
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_string(),
                localhost_profile: None,
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };
    let field_not_in = |nodes: Vec<String>| NodeSelectorTerm {
        match_fields: Some(vec![NodeSelectorRequirement {
            key: "metadata.name".to_string(),
            operator: "NotIn".to_string(),
            values: Some(nodes),
        }]),
        match_expressions: None,
    };
    let preferred = (!input.avoid_nodes.is_empty()).then(|| {
        vec![PreferredSchedulingTerm {
            weight: 100,
            preference: field_not_in(input.avoid_nodes.to_vec()),
        }]
    });
    let affinity = Affinity {
        node_affinity: Some(NodeAffinity {
            // Never on the node being fenced: it is lost, or about to lose its power.
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![field_not_in(vec![input.fence.node.clone()])],
            }),
            preferred_during_scheduling_ignored_during_execution: preferred,
        }),
        ..Affinity::default()
    };
    let deadline = policy.start_timeout + input.execution.budget();
    Job {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(input.namespace.to_string()),
            labels: Some(labels.clone()),
            annotations: Some(annotations.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            // A failed execution is retried by the state machine as a new attempt, a new
            // Job, after its backoff; never by the Job controller behind its back.
            backoff_limit: Some(0),
            active_deadline_seconds: Some(deadline.as_secs().max(1) as i64),
            ttl_seconds_after_finished: Some(
                i32::try_from(policy.ttl_after_finished.as_secs()).unwrap_or(i32::MAX),
            ),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: Some(annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".to_string()),
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    service_account_name: policy.service_account_name.clone(),
                    priority_class_name: policy.priority_class_name.clone(),
                    node_selector: (!policy.node_selector.is_empty())
                        .then(|| policy.node_selector.clone()),
                    tolerations: (!policy.tolerations.is_empty())
                        .then(|| policy.tolerations.clone()),
                    affinity: Some(affinity),
                    containers: vec![container],
                    volumes: Some(volumes),
                    ..PodSpec::default()
                }),
            },
            ..JobSpec::default()
        }),
        status: None,
    }
}

/// Whether the Job belongs to this fence's execution (a name is a hash; the labels
/// settle it).
pub fn belongs_to(job: &Job, fence: &FenceId, execution: &str) -> bool {
    let label = job
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(FENCE_UID_LABEL));
    let annotation = job
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(EXECUTION_ANNOTATION));
    label == Some(&fence.uid) && annotation.map(String::as_str) == Some(execution)
}

/// A Job's terminal condition.
struct Ended<'a> {
    complete: bool,
    reason: Option<&'a str>,
    message: Option<&'a str>,
    at: Option<Timestamp>,
}

/// The Job's end: `Complete` or `Failed`, or since Kubernetes 1.31 the
/// `SuccessCriteriaMet` or `FailureTarget` the Job controller sets first, while it waits
/// for the pods to stop (a pod on an unreachable node may never be seen to stop).
fn terminal(job: &Job) -> Option<Ended<'_>> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    ["Complete", "Failed", "SuccessCriteriaMet", "FailureTarget"]
        .iter()
        .find_map(|kind| {
            conditions
                .iter()
                .find(|c| c.type_ == *kind && c.status == "True")
        })
        .map(|c| Ended {
            complete: c.type_ == "Complete" || c.type_ == "SuccessCriteriaMet",
            reason: c.reason.as_deref(),
            message: c.message.as_deref(),
            at: c.last_transition_time.as_ref().map(|t| t.0),
        })
}

/// Whether a pod of the Job may still be running its agent.
pub fn pod_may_run(pod: &Pod) -> bool {
    !crate::kubernetes::convert::has_finished(pod)
}

/// When every agent of the Job (or of a pod of it) has certainly ended: the
/// `fencing.nodekeeper.io/ends-by` annotation the controller wrote (the wrapper starts
/// nothing after the start deadline, and each call has its own deadline), else the
/// Job's creation plus its `activeDeadlineSeconds`.
pub fn ends_by(meta: &ObjectMeta, active_deadline: Option<i64>) -> Option<Timestamp> {
    let annotated = meta
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(ENDS_BY_ANNOTATION))
        .and_then(|text| text.parse::<Timestamp>().ok());
    annotated.or_else(|| {
        let created = meta.creation_timestamp.as_ref()?.0;
        let seconds = u64::try_from(active_deadline?).ok()?;
        created.checked_add(Duration::from_secs(seconds)).ok()
    })
}

/// Whether `now` is past `end` plus `margin` (for clocks that disagree a little).
fn past(end: Option<Timestamp>, now: Timestamp, margin: Duration) -> bool {
    end.and_then(|end| end.checked_add(margin).ok())
        .is_some_and(|end| now > end)
}

/// Whether a pod of ours (its Job gone or not) may still run an agent.
pub fn pod_may_act(pod: &Pod, now: Timestamp, margin: Duration) -> bool {
    pod_may_run(pod) && !past(ends_by(&pod.metadata, None), now, margin)
}

/// How an execution's Job stands. `pods` are the Job's pods.
///
/// - Running while the Job has not ended, or has ended with a pod that may still run
///   its agent (a Job past its deadline fails while its pod is still being stopped), so
///   no next action for the node starts beside an agent still acting.
/// - Past the Job's `ends-by` time (plus `margin`) it is over whatever the Job and its
///   pods still say: no agent of it can be running, and a Job stuck on an unreachable
///   node must not hold its node's fence forever. It then counts as timed out, unless
///   the agent's result is there.
pub fn job_state(job: &Job, pods: &[&Pod], now: Timestamp, margin: Duration) -> ReportedState {
    let name = job.metadata.name.as_deref().unwrap_or("");
    let over = past(
        ends_by(
            &job.metadata,
            job.spec.as_ref().and_then(|s| s.active_deadline_seconds),
        ),
        now,
        margin,
    );
    let ended = terminal(job);
    let pod_running = pods.iter().any(|pod| pod_may_run(pod));
    if !over && (ended.is_none() || pod_running) {
        return ReportedState::Running;
    }
    let messages: Vec<String> = pods
        .iter()
        .filter_map(|pod| termination_message(pod))
        .collect();
    let (complete, reason, message, at) = match &ended {
        Some(ended) => (ended.complete, ended.reason, ended.message, ended.at),
        None => (false, Some("NotEndedInTime"), None, None),
    };
    let deadline = reason == Some("DeadlineExceeded") || ended.is_none();
    let result = match messages.as_slice() {
        [written] => match decode_result(written) {
            Ok(result) => result,
            Err(problem) => ExecutionResult::failed(format!("Job {name}: {problem}")),
        },
        [_, _, ..] => ExecutionResult::failed(format!(
            "Job {name}: {} pods reported a result, where one runs; none is trusted",
            messages.len()
        )),
        [] if complete => ExecutionResult::failed(format!(
            "Job {name} completed but left no result; the outcome is unknown"
        )),
        [] if ended.is_none() => ExecutionResult::failed(format!(
            "Job {name} did not end by its deadline{}; its agent has certainly stopped, the outcome is unknown",
            waiting_reason(pods).map(|r| format!(" ({r})")).unwrap_or_default()
        )),
        [] => ExecutionResult::failed(format!(
            "Job {name} failed ({}{}) before its agent reported{}",
            reason.unwrap_or("no reason given"),
            message.map(|m| format!(": {m}")).unwrap_or_default(),
            waiting_reason(pods)
                .map(|r| format!("; its pod was {r}"))
                .unwrap_or_else(|| if pods.is_empty() {
                    "; no pod was created (the Job's Events say why: a PodSecurity or quota refusal, a missing ServiceAccount)".to_string()
                } else {
                    String::new()
                })
        )),
    };
    // A Job past its deadline, or not ended by its ends-by time, timed out unless its
    // agent's own result says it succeeded.
    let result = ExecutionResult {
        timed_out: result.timed_out || (deadline && !result.succeeded),
        ..result
    };
    ReportedState::Finished(outcome(result, at.unwrap_or(now)))
}

fn container_state(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerState> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|status| status.name == CONTAINER)?
        .state
        .as_ref()
}

/// The result the wrapper wrote, as the kubelet reported it.
fn termination_message(pod: &Pod) -> Option<String> {
    container_state(pod)?
        .terminated
        .as_ref()?
        .message
        .clone()
        .filter(|message| !message.trim().is_empty())
}

/// Why a pod's container never ran: `waiting: ImagePullBackOff: ...`.
fn waiting_reason(pods: &[&Pod]) -> Option<String> {
    pods.iter().find_map(|pod| {
        let waiting = container_state(pod)?.waiting.as_ref()?;
        let reason = waiting.reason.clone()?;
        Some(match &waiting.message {
            Some(message) => format!("waiting: {reason}: {message}"),
            None => format!("waiting: {reason}"),
        })
    })
}

/// An execution whose Job could not even be made.
pub fn not_started(detail: String, now: Timestamp) -> Outcome {
    outcome(ExecutionResult::failed(detail), now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::resource::ExecutionKind;
    use crate::fencing::config::{
        FenceAction, Layer, MethodPlan, Parameter, ParameterValue, SecretRef, Source, Step,
    };
    use crate::fencing::{ExecutionMode, PowerState, SecretValue};
    use serde_json::json;

    fn fence() -> FenceId {
        FenceId {
            uid: "0f6a1c2e-5b7d-4e8f-9a0b-1c2d3e4f5a6b".to_string(),
            name: "worker-1.rack-7.example.com".to_string(),
            node: "worker-1.rack-7.example.com".to_string(),
        }
    }

    fn request() -> ExecutionRequest {
        ExecutionRequest {
            name: "power-management-t1-a1-ipmi-off-act1".to_string(),
            step: Step::PowerManagement,
            attempt: 1,
            alternative: 1,
            method: "ipmi-off".to_string(),
            kind: ExecutionKind::Act,
        }
    }

    fn execution() -> JobExecution {
        let source = Source {
            config_map: "fence-method-ipmi-off-worker-1".to_string(),
            key: "method.properties".to_string(),
        };
        let method = MethodPlan {
            name: "ipmi-off".to_string(),
            source: source.clone(),
            template: None,
            agent: "fence_ipmilan".to_string(),
            action: FenceAction::Off,
            action_layer: Layer::Node,
            must_succeed: true,
            parameters: vec![
                Parameter {
                    name: "ip".to_string(),
                    written: "ip".to_string(),
                    value: ParameterValue::Text("10.0.0.9".to_string()),
                    layer: Layer::Node,
                    source: source.clone(),
                    secret: None,
                },
                Parameter {
                    name: "password".to_string(),
                    written: "password_secret".to_string(),
                    value: ParameterValue::Sensitive(SecretValue::new("hunter2")),
                    layer: Layer::Node,
                    source,
                    secret: Some(SecretRef {
                        secret: "bmc".to_string(),
                        key: "password".to_string(),
                    }),
                },
            ],
        };
        JobExecution::new(
            "worker-1.rack-7.example.com",
            &method,
            ExecutionMode::Act,
            Duration::from_secs(60),
            Duration::from_secs(30),
        )
        .expect("document")
        // Agents end by 3:00 + 60 s metadata + 60 s off + status until 30 s (up to 60 s
        // more) + 10 s = 03:03:40.
        .starting_by(AT.parse().expect("time"))
    }

    fn job(avoid: &[String]) -> Job {
        build_job(&JobInput {
            policy: &JobPolicy {
                image: "registry.example/nodekeeper:0.1".to_string(),
                command: vec!["/usr/bin/nodekeeper".to_string()],
                ..JobPolicy::default()
            },
            agents_dir: Path::new("/usr/sbin"),
            namespace: "fencing",
            fence: &fence(),
            request: &request(),
            execution: &execution(),
            avoid_nodes: avoid,
        })
    }

    #[test]
    fn a_job_name_is_stable_valid_and_differs_per_execution_and_fence() {
        let name = job_name(&fence(), &request().name);
        assert_eq!(name, job_name(&fence(), &request().name));
        assert!(name.len() <= 63, "{name}");
        assert!(
            name.starts_with("fence-worker-1-rack-7-example-com-"),
            "{name}"
        );
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{name}"
        );
        assert_ne!(
            name,
            job_name(&fence(), "power-management-t2-a1-ipmi-off-act1")
        );
        let recreated = FenceId {
            uid: "a different uid".to_string(),
            ..fence()
        };
        assert_ne!(name, job_name(&recreated, &request().name));
        let long = FenceId {
            node: "n".repeat(253),
            ..fence()
        };
        assert!(job_name(&long, "x").len() <= 63);
    }

    #[test]
    fn the_job_carries_no_credential_and_mounts_only_the_keys_it_reads() {
        let job = job(&[]);
        let text = serde_json::to_string(&job).expect("serializes");
        assert!(!text.contains("hunter2"), "{text}");
        let pod = job
            .spec
            .as_ref()
            .expect("spec")
            .template
            .spec
            .as_ref()
            .expect("pod");
        let container = &pod.containers[0];
        assert!(container.env.is_none());
        assert_eq!(
            container.command.as_deref(),
            Some(&["/usr/bin/nodekeeper".to_string()][..])
        );
        let args = container.args.as_ref().expect("args");
        assert_eq!(&args[..3], ["fence", "execute", "--execution"]);
        let volume =
            serde_json::to_value(&pod.volumes.as_ref().expect("volumes")[0]).expect("json");
        assert_eq!(
            volume,
            json!({"name": "secret-0", "secret": {"secretName": "bmc", "defaultMode": 256,
                   "optional": false, "items": [{"key": "password", "path": "password"}]}})
        );
        let mount = &container.volume_mounts.as_ref().expect("mounts")[0];
        assert_eq!(mount.mount_path, "/run/nodekeeper/secrets/bmc");
        assert_eq!(mount.read_only, Some(true));
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(
            container.termination_message_path.as_deref(),
            Some("/dev/termination-log")
        );
    }

    #[test]
    fn the_job_never_runs_on_the_fenced_node_and_a_retry_prefers_another_node() {
        let first = serde_json::to_value(job(&[])).expect("json");
        let affinity = &first["spec"]["template"]["spec"]["affinity"]["nodeAffinity"];
        assert_eq!(
            affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchFields"]
                [0],
            json!({"key": "metadata.name", "operator": "NotIn", "values": ["worker-1.rack-7.example.com"]})
        );
        assert!(
            affinity
                .get("preferredDuringSchedulingIgnoredDuringExecution")
                .is_none()
        );
        let retry = serde_json::to_value(job(&["control-2".to_string()])).expect("json");
        assert_eq!(
            retry["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
                [0]["preference"]["matchFields"][0]["values"],
            json!(["control-2"])
        );
        let spec = &first["spec"];
        assert_eq!(spec["backoffLimit"], 0);
        // 2 minutes to start, then metadata 60 s + off 60 s + status up to 30 s + 60 s.
        assert_eq!(spec["activeDeadlineSeconds"], 120 + 60 + 60 * 2 + 30);
    }

    fn finished(job: &mut Job, condition: &str, reason: &str, at: &str) {
        job.status = Some(
            serde_json::from_value(json!({"conditions": [{
                "type": condition, "status": "True", "reason": reason,
                "lastTransitionTime": at}]}))
            .expect("status"),
        );
    }

    fn pod(phase: &str, message: Option<&str>) -> Pod {
        let state = match message {
            Some(message) => json!({"terminated": {"exitCode": 0, "message": message}}),
            None => json!({"running": {}}),
        };
        serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "status": {"phase": phase, "containerStatuses": [{
                "name": CONTAINER, "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": state}]}
        }))
        .expect("pod")
    }

    const AT: &str = "2026-11-24T03:00:00Z";

    /// The termination message of an agent that switched the power off, confirmed.
    fn confirmed_off() -> String {
        crate::fencing::job::encode_result(&ExecutionResult {
            succeeded: true,
            timed_out: false,
            off_confirmed: true,
            power: Some(PowerState::Off),
            detail: None,
        })
    }

    fn at(seconds: i64) -> Timestamp {
        AT.parse::<Timestamp>().expect("time") + std::time::Duration::from_secs(seconds as u64)
    }

    #[test]
    fn a_completed_job_reports_the_result_its_agent_wrote() {
        let mut job = job(&[]);
        assert_eq!(job_state(&job, &[], at(0), MARGIN), ReportedState::Running);
        finished(&mut job, "Complete", "CompletionsReached", AT);
        let message = confirmed_off();
        let done = pod("Succeeded", Some(&message));
        let ReportedState::Finished(outcome) = job_state(&job, &[&done], at(1), MARGIN) else {
            panic!("not finished");
        };
        assert!(outcome.succeeded && outcome.off_confirmed);
        assert_eq!(outcome.finished_at, at(0));
    }

    #[test]
    fn a_job_past_its_deadline_is_a_timeout_once_its_pod_has_stopped() {
        let mut job = job(&[]);
        finished(&mut job, "Failed", "DeadlineExceeded", AT);
        let stopping = pod("Running", None);
        // Its agent may still act: the node's next action waits.
        assert_eq!(
            job_state(&job, &[&stopping], at(5), MARGIN),
            ReportedState::Running
        );
        let stopped = pod("Failed", None);
        let ReportedState::Finished(outcome) = job_state(&job, &[&stopped], at(6), MARGIN) else {
            panic!("not finished once its pod stopped");
        };
        assert!(outcome.timed_out && !outcome.succeeded && !outcome.off_confirmed);
        assert!(outcome.detail.expect("detail").contains("DeadlineExceeded"));
        // A pod never seen to stop (its node is unreachable) holds the execution only
        // until no agent of it can run: 03:03:40 plus the margin.
        assert_eq!(
            job_state(&job, &[&stopping], at(220 + 30), MARGIN),
            ReportedState::Running
        );
        let ReportedState::Finished(outcome) = job_state(&job, &[&stopping], at(220 + 31), MARGIN)
        else {
            panic!("not finished after its ends-by time");
        };
        assert!(outcome.timed_out && !outcome.succeeded);
    }

    const MARGIN: Duration = Duration::from_secs(30);

    #[test]
    fn the_first_end_condition_of_newer_clusters_ends_the_job() {
        for (condition, succeeded) in [("FailureTarget", false), ("SuccessCriteriaMet", true)] {
            let mut job = job(&[]);
            finished(&mut job, condition, "X", AT);
            let message = crate::fencing::job::encode_result(&ExecutionResult {
                succeeded,
                ..ExecutionResult::failed("status reports OFF")
            });
            let done = pod(
                if succeeded { "Succeeded" } else { "Failed" },
                Some(&message),
            );
            let ReportedState::Finished(outcome) = job_state(&job, &[&done], at(1), MARGIN) else {
                panic!("{condition} did not end the Job");
            };
            assert_eq!(outcome.succeeded, succeeded);
        }
    }

    #[test]
    fn a_job_that_never_ends_is_over_when_no_agent_of_it_can_run() {
        let job = job(&[]);
        let pending: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Pending", "containerStatuses": [{
                "name": CONTAINER, "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}]}
        }))
        .expect("pod");
        assert_eq!(
            job_state(&job, &[&pending], at(200), MARGIN),
            ReportedState::Running
        );
        let ReportedState::Finished(outcome) = job_state(&job, &[&pending], at(300), MARGIN) else {
            panic!("still running past its end");
        };
        assert!(outcome.timed_out && !outcome.succeeded);
        let detail = outcome.detail.expect("detail");
        assert!(
            detail.contains("ImagePullBackOff: no such image"),
            "{detail}"
        );
    }

    #[test]
    fn two_pods_reporting_results_are_not_trusted() {
        let mut job = job(&[]);
        finished(&mut job, "Complete", "CompletionsReached", AT);
        let message = confirmed_off();
        let (one, two) = (
            pod("Succeeded", Some(&message)),
            pod("Succeeded", Some(&message)),
        );
        let ReportedState::Finished(outcome) = job_state(&job, &[&one, &two], at(1), MARGIN) else {
            panic!("not finished");
        };
        assert!(!outcome.off_confirmed, "{outcome:?}");
    }

    #[test]
    fn a_failed_job_without_a_pod_says_where_to_look() {
        let mut job = job(&[]);
        finished(&mut job, "Failed", "BackoffLimitExceeded", AT);
        let ReportedState::Finished(outcome) = job_state(&job, &[], at(1), MARGIN) else {
            panic!("not finished");
        };
        let detail = outcome.detail.expect("detail");
        assert!(detail.contains("no pod was created"), "{detail}");
        assert!(!outcome.timed_out);
    }

    #[test]
    fn a_job_without_a_readable_result_never_confirms_a_fence() {
        let mut job = job(&[]);
        finished(&mut job, "Complete", "CompletionsReached", AT);
        for written in [None, Some("Error: exec format error")] {
            let done = pod("Succeeded", written);
            let ReportedState::Finished(outcome) = job_state(&job, &[&done], at(1), MARGIN) else {
                panic!("not finished");
            };
            assert!(!outcome.succeeded && !outcome.off_confirmed, "{outcome:?}");
        }
    }

    #[test]
    fn only_a_job_of_the_same_fence_and_execution_is_adopted() {
        let job = job(&[]);
        assert!(belongs_to(&job, &fence(), &request().name));
        assert!(!belongs_to(&job, &fence(), "recovery-t1-a1-ipmi-on-act1"));
        let other = FenceId {
            uid: "another".to_string(),
            ..fence()
        };
        assert!(!belongs_to(&job, &other, &request().name));
    }
}
