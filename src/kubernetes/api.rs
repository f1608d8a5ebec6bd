//! Executes one [`ApiAction`] against the API server and classifies the result for the
//! outbox. Every write names us as its field manager, so `managedFields` shows what is
//! ours. Conditions (the node's and a pod's `DisruptionTarget`) are server-side applies
//! to the status subresource carrying only our condition types: `conditions` is a list
//! keyed by `type`, so the kubelet's conditions are never re-sent or overwritten, and
//! `force` takes our types over from whoever wrote them before (they are ours by name).
//! The condition is read first, to keep its `lastTransitionTime` when the status did not
//! change. Taints have no merge key, so they stay a read-modify-write merge patch guarded
//! by the node's `resourceVersion` that only changes our taint keys: a concurrent writer
//! makes the server answer 409, after which we read again and retry.

use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::{Value, json};

use super::outbox::{ApiAction, ConditionRecord, EventRecord, Outcome, PodRef, TaintRecord};
use crate::pods::MIN_GRACE_PERIOD_SECONDS;

/// The field manager of every write, visible in `managedFields`.
pub const FIELD_MANAGER: &str = "nodekeeper";
/// The `source.component` of our events.
pub const EVENT_COMPONENT: &str = "nodekeeper";
/// Optimistic-concurrency retries within one attempt before backing off.
const CONFLICT_RETRIES: usize = 5;

/// Writes for one node.
#[derive(Clone)]
pub struct ApiWriter {
    client: kube::Client,
    node_name: String,
}

impl ApiWriter {
    pub fn new(client: kube::Client, node_name: String) -> Self {
        ApiWriter { client, node_name }
    }

    pub async fn execute(&self, action: &ApiAction) -> Outcome {
        match action {
            ApiAction::CreateEvent(event) => self.create_event(event).await,
            ApiAction::SetPodCondition { pod, condition } => {
                self.set_pod_condition(pod, condition).await
            }
            ApiAction::DeletePod {
                pod,
                grace_period_seconds,
            } => self.delete_pod(pod, *grace_period_seconds).await,
            ApiAction::SetNodeConditions(conditions) => self.set_node_conditions(conditions).await,
            ApiAction::SetNodeTaints(taints) => self.set_node_taints(taints).await,
        }
    }

    async fn create_event(&self, record: &EventRecord) -> Outcome {
        let api: Api<Event> = Api::namespaced(self.client.clone(), &record.namespace);
        let event = event_object(record, &self.node_name);
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        match api.create(&params, &event).await {
            Ok(_) => Outcome::Done,
            // The same occurrence again (or a retry whose first try got through):
            // update the count, as the kubelet's event aggregation does.
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let patch = json!({
                    "count": record.count,
                    "message": record.message,
                    "lastTimestamp": timestamp(record.last_seen),
                });
                match api
                    .patch(&record.name, &patch_params(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => Outcome::Done,
                    Err(error) => classify(error),
                }
            }
            Err(error) => classify(error),
        }
    }

    async fn set_pod_condition(&self, pod: &PodRef, condition: &ConditionRecord) -> Outcome {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        for _ in 0..CONFLICT_RETRIES {
            let current = match api.get(&pod.name).await {
                Ok(current) => current,
                Err(error) => return gone_is_done(error),
            };
            if current.metadata.uid.as_deref() != Some(pod.uid.as_str()) {
                // A replacement with the same name: our pod is gone.
                return Outcome::Done;
            }
            let recorded =
                recorded_conditions(current.status.as_ref().and_then(|s| s.conditions.as_ref()));
            let condition = keep_transition_time(&recorded, condition_value(condition));
            // The resourceVersion we read makes the apply fail (409) if the pod changed
            // since, e.g. was replaced by a namesake after the UID check: read again.
            let body = json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod.name,
                    "namespace": pod.namespace,
                    "resourceVersion": current.metadata.resource_version,
                },
                "status": {"conditions": [condition]},
            });
            match api
                .patch_status(&pod.name, &apply_params(), &Patch::Apply(&body))
                .await
            {
                Ok(_) => return Outcome::Done,
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(error) => return gone_is_done(error),
            }
        }
        Outcome::Retry("pods/status kept conflicting".to_string())
    }

    async fn delete_pod(&self, pod: &PodRef, grace_period_seconds: i64) -> Outcome {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let params = DeleteParams {
            // Never 0: to the API server that is a forced delete that does not wait for
            // the kubelet to stop the containers.
            grace_period_seconds: u32::try_from(grace_period_seconds.max(MIN_GRACE_PERIOD_SECONDS))
                .ok(),
            preconditions: Some(Preconditions {
                uid: Some(pod.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&pod.name, &params).await {
            Ok(_) => Outcome::Done,
            // 409: the UID precondition failed, so the pod we meant is already gone and
            // a replacement must not be touched.
            Err(kube::Error::Api(status)) if status.code == 409 => Outcome::Done,
            Err(error) => gone_is_done(error),
        }
    }

    async fn set_node_conditions(&self, ours: &[ConditionRecord]) -> Outcome {
        let api: Api<Node> = Api::all(self.client.clone());
        let node = match api.get(&self.node_name).await {
            Ok(node) => node,
            Err(error) => return classify(error),
        };
        let recorded =
            recorded_conditions(node.status.as_ref().and_then(|s| s.conditions.as_ref()));
        let conditions: Vec<Value> = ours
            .iter()
            .map(|condition| keep_transition_time(&recorded, condition_value(condition)))
            .collect();
        // No resourceVersion: only we write these condition types, so what we read of
        // them cannot be stale, and a lock would make every kubelet status update in
        // between a conflict.
        let body = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name},
            "status": {"conditions": conditions},
        });
        match api
            .patch_status(&self.node_name, &apply_params(), &Patch::Apply(&body))
            .await
        {
            Ok(_) => Outcome::Done,
            Err(error) => classify(error),
        }
    }

    async fn set_node_taints(&self, ours: &[TaintRecord]) -> Outcome {
        let api: Api<Node> = Api::all(self.client.clone());
        for _ in 0..CONFLICT_RETRIES {
            let node = match api.get(&self.node_name).await {
                Ok(node) => node,
                Err(error) => return classify(error),
            };
            let mut taints: Vec<Value> = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .into_iter()
                .flatten()
                .filter(|t| !t.key.starts_with(super::node::TAINT_PREFIX))
                .map(|t| serde_json::to_value(t).unwrap_or(Value::Null))
                .collect();
            taints.extend(
                ours.iter()
                    .map(|t| json!({"key": t.key, "effect": t.effect})),
            );
            let patch = json!({
                "metadata": {"resourceVersion": node.metadata.resource_version},
                "spec": {"taints": taints},
            });
            match api
                .patch(&self.node_name, &patch_params(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Outcome::Done,
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(error) => return classify(error),
            }
        }
        Outcome::Retry("node kept conflicting".to_string())
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

/// Server-side apply as [`FIELD_MANAGER`], forcing: our condition types are ours, even
/// if an older nodekeeper (merge patches) or someone else wrote them.
fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Whether the API server itself answered, even with a refusal or a 500: not a
/// transport error, and not a gateway saying the API server is not there (502-504). The
/// agent's reports say from this whether it reaches the API server.
pub fn answered(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if !(502..=504).contains(&status.code))
}

/// Transient failures are retried; the server's refusals are not. No answer at all (see
/// [`answered`]) is told apart.
pub fn classify(error: kube::Error) -> Outcome {
    let answered = answered(&error);
    match error {
        kube::Error::Api(status) => {
            let text = format!("{} {}: {}", status.code, status.reason, status.message);
            match status.code {
                _ if !answered => Outcome::Unreachable(text),
                408 | 429 | 500..=599 => Outcome::Retry(text),
                _ => Outcome::Rejected(text),
            }
        }
        other => Outcome::Unreachable(other.to_string()),
    }
}

/// For writes about a pod: a 404 means the pod is gone, which is what eviction wants.
fn gone_is_done(error: kube::Error) -> Outcome {
    match &error {
        kube::Error::Api(status) if status.code == 404 => Outcome::Done,
        _ => classify(error),
    }
}

/// RFC 3339 with seconds, as `metav1.Time` serializes.
pub fn timestamp(time: SystemTime) -> Value {
    match k8s_openapi::jiff::Timestamp::try_from(time) {
        Ok(ts) => serde_json::to_value(Time(ts)).unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

fn time(time: SystemTime) -> Option<Time> {
    k8s_openapi::jiff::Timestamp::try_from(time).ok().map(Time)
}

fn condition_value(condition: &ConditionRecord) -> Value {
    let mut value = json!({
        "type": condition.condition_type,
        "status": if condition.status { "True" } else { "False" },
        "reason": condition.reason,
        "message": condition.message,
        "lastTransitionTime": timestamp(condition.last_transition),
    });
    if let Some(heartbeat) = condition.last_heartbeat {
        value["lastHeartbeatTime"] = timestamp(heartbeat);
    }
    value
}

/// `condition` (JSON, as sent) with the `lastTransitionTime` of the condition of the
/// same type in `recorded` (the object's conditions as JSON, or null) when that one has
/// the same status: a heartbeat or an agent restart is not a transition.
pub fn keep_transition_time(recorded: &Value, mut condition: Value) -> Value {
    let previous = recorded
        .as_array()
        .into_iter()
        .flatten()
        .find(|item| item.get("type") == condition.get("type"));
    if let Some(previous) = previous
        && previous.get("status") == condition.get("status")
        && let Some(since) = previous.get("lastTransitionTime").filter(|t| !t.is_null())
    {
        condition["lastTransitionTime"] = since.clone();
    }
    condition
}

/// An object's status conditions as JSON (null when there are none), for
/// [`keep_transition_time`].
fn recorded_conditions<T: serde::Serialize>(conditions: Option<&Vec<T>>) -> Value {
    conditions
        .and_then(|list| serde_json::to_value(list).ok())
        .unwrap_or(Value::Null)
}

fn event_object(record: &EventRecord, node_name: &str) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(record.name.clone()),
            namespace: Some(record.namespace.clone()),
            annotations: (!record.annotations.is_empty()).then(|| record.annotations.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            kind: Some(record.involved.kind.to_string()),
            api_version: Some("v1".to_string()),
            namespace: record.involved.namespace.clone(),
            name: Some(record.involved.name.clone()),
            uid: Some(record.involved.uid.clone()),
            ..ObjectReference::default()
        },
        reason: Some(record.reason.clone()),
        message: Some(record.message.clone()),
        type_: Some(record.event_type.as_str().to_string()),
        count: Some(record.count),
        first_timestamp: time(record.first_seen),
        last_timestamp: time(record.last_seen),
        source: Some(EventSource {
            component: Some(EVENT_COMPONENT.to_string()),
            host: Some(node_name.to_string()),
        }),
        reporting_component: Some(EVENT_COMPONENT.to_string()),
        reporting_instance: Some(node_name.to_string()),
        ..Event::default()
    }
}

/// A stable event name: the object's name plus a hash of what the event is about, so
/// the same occurrence always maps to the same Event object.
pub fn event_name(object_name: &str, key: &str) -> String {
    // FNV-1a: stable across runs and builds, unlike the std hasher.
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    let prefix: String = object_name.chars().take(200).collect();
    format!("{prefix}.{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unchanged_status_keeps_its_recorded_transition_time() {
        let recorded = json!([
            {"type": "Ready", "status": "True", "lastTransitionTime": "2025-01-01T00:00:00Z"},
            {"type": "NodekeeperMemoryPressure", "status": "False", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ]);
        let same = json!({"type": "NodekeeperMemoryPressure", "status": "False", "lastTransitionTime": "2026-02-02T00:00:00Z", "lastHeartbeatTime": "2026-02-02T00:00:00Z"});
        assert_eq!(
            keep_transition_time(&recorded, same),
            json!({"type": "NodekeeperMemoryPressure", "status": "False", "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": "2026-02-02T00:00:00Z"})
        );
        let flipped = json!({"type": "NodekeeperMemoryPressure", "status": "True", "lastTransitionTime": "2026-02-02T00:00:00Z"});
        assert_eq!(keep_transition_time(&recorded, flipped.clone()), flipped);
        let new = json!({"type": "DisruptionTarget", "status": "True", "lastTransitionTime": "2026-02-02T00:00:00Z"});
        assert_eq!(keep_transition_time(&recorded, new.clone()), new);
        assert_eq!(keep_transition_time(&Value::Null, new.clone()), new);
    }

    #[test]
    fn event_names_are_stable_and_distinct() {
        let a = event_name("web", "Evicted/uid-1");
        assert_eq!(a, event_name("web", "Evicted/uid-1"));
        assert_ne!(a, event_name("web", "Evicted/uid-2"));
        assert!(a.starts_with("web."));
        assert_eq!(a.len(), "web.".len() + 16);
        assert!(event_name(&"x".repeat(300), "k").len() <= 253);
    }

    #[test]
    fn timestamps_are_rfc3339_seconds() {
        let time = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(86_400 + 61);
        assert_eq!(timestamp(time), json!("1970-01-02T00:01:01Z"));
    }
}
