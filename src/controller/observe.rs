//! Reads the controller's plain facts out of Kubernetes objects: a Node's health, zone,
//! exclusion and taints; a Pod's owner, volumes and phase; the storm guard's memory and
//! the zone's fence starts out of the NodeFence statuses. Pure functions over the API
//! types, so the reconciler's inputs are tested without a cluster.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod, Taint};
use k8s_openapi::jiff::Timestamp;

use crate::kubernetes::convert::CONFIG_MIRROR_ANNOTATION;

use super::facts::{NodeHealth, NodeTaints, PodFacts, Readiness, zone_key};
use super::policy::{
    EXCLUSION_LABEL, MEDIK8S_EXCLUSION_LABEL, OUT_OF_SERVICE_TAINT, REMEDIATION_TAINT,
};
use super::resource::{NodeFence, NodeFenceStatus, PauseReason};
use super::storm::{NodeView, StormMemory};

/// The node lifecycle controller leaves nodes with this label out of the zone states.
pub const EXCLUDE_DISRUPTION_LABEL: &str = "node.kubernetes.io/exclude-disruption";

/// The node's Ready condition as health.
pub fn node_health(node: &Node) -> NodeHealth {
    let ready = node
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(condition) => NodeHealth {
            readiness: match condition.status.as_str() {
                "True" => Readiness::Ready,
                "False" => Readiness::NotReady,
                _ => Readiness::Unknown,
            },
            since: condition.last_transition_time.as_ref().map(|time| time.0),
        },
        None => NodeHealth {
            readiness: Readiness::Unknown,
            since: None,
        },
    }
}

fn labels(node: &Node) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    node.metadata.labels.as_ref().unwrap_or(&EMPTY)
}

/// The node carries our exclusion label or medik8s' (set to `true`): never fenced.
pub fn is_excluded(node: &Node) -> bool {
    let labels = labels(node);
    [EXCLUSION_LABEL, MEDIK8S_EXCLUSION_LABEL]
        .iter()
        .any(|label| labels.get(*label).is_some_and(|value| value == "true"))
}

pub fn node_zone(node: &Node) -> String {
    zone_key(labels(node))
}

/// Whether the node is among the watched ones.
pub fn is_selected(node: &Node, selector: Option<&kube::core::Selector>) -> bool {
    selector.is_none_or(|selector| kube::core::SelectorExt::matches(selector, labels(node)))
}

/// The node as the storm guard counts it.
pub fn node_view(node: &Node) -> NodeView {
    NodeView {
        name: node.metadata.name.clone().unwrap_or_default(),
        zone: node_zone(node),
        readiness: node_health(node).readiness,
        excluded_from_zone: labels(node).contains_key(EXCLUDE_DISRUPTION_LABEL),
    }
}

pub fn node_taints(node: &Node) -> NodeTaints {
    let taints = node_taint_list(node);
    NodeTaints {
        remediation: taints.iter().any(|t| t.key == REMEDIATION_TAINT),
        out_of_service: taints.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT),
    }
}

/// The node's InternalIP addresses, the only ones its kdump notifications are taken from.
/// An address that does not parse is left out.
pub fn internal_ips(node: &Node) -> Vec<std::net::IpAddr> {
    node.status
        .as_ref()
        .and_then(|status| status.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|address| address.type_ == "InternalIP")
        .filter_map(|address| address.address.trim().parse().ok())
        .collect()
}

/// The boot the node's kubelet last reported (`status.nodeInfo.bootID`), if any.
pub fn boot_id(node: &Node) -> Option<String> {
    node.status
        .as_ref()
        .and_then(|status| status.node_info.as_ref())
        .map(|info| info.boot_id.trim().to_string())
        .filter(|id| !id.is_empty())
}

/// How many volumes the node's status lists as attached to it.
pub fn volumes_attached(node: &Node) -> usize {
    node.status
        .as_ref()
        .and_then(|status| status.volumes_attached.as_ref())
        .map_or(0, Vec::len)
}

pub fn node_taint_list(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|spec| spec.taints.as_deref())
        .unwrap_or(&[])
}

/// The claims (namespace, name) of the pod's PersistentVolumeClaim volumes, the ones whose
/// access modes decide whether the pod holds a single-node volume.
pub fn claims(pod: &Pod) -> Vec<(String, String)> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    pod.spec
        .iter()
        .flat_map(|spec| spec.volumes.iter().flatten())
        .filter_map(|volume| volume.persistent_volume_claim.as_ref())
        .map(|claim| (namespace.clone(), claim.claim_name.clone()))
        .collect()
}

/// Whether a claim can be attached to one node only.
pub fn is_single_node_claim(claim: &PersistentVolumeClaim) -> bool {
    let modes = claim
        .status
        .as_ref()
        .and_then(|status| status.access_modes.as_ref())
        .or_else(|| {
            claim
                .spec
                .as_ref()
                .and_then(|spec| spec.access_modes.as_ref())
        });
    modes.is_some_and(|modes| {
        modes
            .iter()
            .any(|mode| mode == "ReadWriteOnce" || mode == "ReadWriteOncePod")
    })
}

/// A pod as the "does this node need fencing" rule reads it. `single_node_claims` holds
/// the (namespace, name) of the claims known to be ReadWriteOnce or ReadWriteOncePod.
pub fn pod_facts(pod: &Pod, single_node_claims: &BTreeSet<(String, String)>) -> PodFacts {
    let owners = pod.metadata.owner_references.as_deref().unwrap_or(&[]);
    let controller_kinds: Vec<String> = owners
        .iter()
        .filter(|owner| owner.controller == Some(true))
        .map(|owner| owner.kind.clone())
        .collect();
    let mirror = is_mirror(pod);
    PodFacts {
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        node_bound: mirror || controller_kinds.iter().any(|kind| kind == "DaemonSet"),
        owner_kinds: controller_kinds,
        uses_single_node_volume: claims(pod)
            .iter()
            .any(|claim| single_node_claims.contains(claim)),
        finished: crate::kubernetes::convert::has_finished(pod),
    }
}

/// Pods a release deletes: every pod still on the node except mirror pods, which the
/// kubelet owns and recreates. (The out-of-service taint's garbage collector deletes the
/// same set; DaemonSet pods go too and come back with the node.)
pub fn is_releasable(pod: &Pod) -> bool {
    !is_mirror(pod)
}

/// The API copy of a static pod, which the kubelet owns.
fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|annotations| annotations.contains_key(CONFIG_MIRROR_ANNOTATION))
}

/// The storm guard's memory as the fences' statuses tell it, for a controller that just
/// started: a fence paused by the storm guard means a storm was under way, one paused by
/// the cooldown carries when the cooldown ends.
pub fn storm_memory_from<'a>(fences: impl IntoIterator<Item = &'a NodeFence>) -> StormMemory {
    let mut memory = StormMemory::default();
    for pause in fences
        .into_iter()
        .filter_map(|fence| fence.status.as_ref()?.pause.as_ref())
    {
        match pause.reason {
            PauseReason::StormGuard => memory.storm_active = true,
            PauseReason::StormCooldown => {
                if let Some(until) = pause.until.as_ref().map(|time| time.0) {
                    memory.cooldown_until =
                        Some(memory.cooldown_until.map_or(until, |u| u.max(until)));
                }
            }
            _ => {}
        }
    }
    memory
}

/// When the fences of `zone` started, the zone rate limit's input.
pub fn starts_in_zone<'a>(
    fences: impl IntoIterator<Item = &'a NodeFence>,
    zone: &str,
) -> Vec<Timestamp> {
    fences
        .into_iter()
        .filter_map(|fence| fence.status.as_ref())
        .filter(|status| status.zone.as_deref() == Some(zone))
        .filter_map(|status| status.started_at.as_ref().map(|time| time.0))
        .collect()
}

/// Whether the fence's Failed condition is True: it used up its retries.
pub fn has_failed(status: &NodeFenceStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|condition| condition.type_ == "Failed" && condition.status == "True")
}

/// What the gauges over every NodeFence show.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FenceFigures {
    pub total: usize,
    /// Fences whose Failed condition is True.
    pub failed: usize,
    /// Paused fences by reason (the reason's name).
    pub paused: BTreeMap<String, i64>,
}

pub fn fence_figures<'a>(fences: impl IntoIterator<Item = &'a NodeFence>) -> FenceFigures {
    let mut figures = FenceFigures::default();
    for fence in fences {
        figures.total += 1;
        let Some(status) = fence.status.as_ref() else {
            continue;
        };
        if has_failed(status) {
            figures.failed += 1;
        }
        if let Some(pause) = &status.pause {
            *figures
                .paused
                .entry(format!("{:?}", pause.reason))
                .or_insert(0) += 1;
        }
    }
    figures
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

    fn node(yaml: &str) -> Node {
        serde_yaml_ng::from_str(yaml).expect("node yaml")
    }

    #[test]
    fn health_comes_from_the_ready_condition_and_its_transition_time() {
        let unknown = node(
            "metadata: {name: a}\nstatus:\n  conditions:\n  - {type: MemoryPressure, status: 'False'}\n  - {type: Ready, status: Unknown, lastTransitionTime: '2026-11-24T01:00:00Z'}\n",
        );
        let health = node_health(&unknown);
        assert_eq!(health.readiness, Readiness::Unknown);
        assert_eq!(
            health.since,
            Some("2026-11-24T01:00:00Z".parse().expect("time"))
        );
        let no_conditions = node("metadata: {name: b}\n");
        assert_eq!(node_health(&no_conditions).readiness, Readiness::Unknown);
        let not_ready = node("status: {conditions: [{type: Ready, status: 'False'}]}\n");
        assert_eq!(node_health(&not_ready).readiness, Readiness::NotReady);
    }

    #[test]
    fn exclusion_zone_and_taints_are_read_from_labels_and_spec() {
        let n = node(
            "metadata:\n  name: a\n  labels: {fencing.nodekeeper.io/exclude: 'true', topology.kubernetes.io/zone: z1, node.kubernetes.io/exclude-disruption: ''}\n\
             spec:\n  taints:\n  - {key: fencing.nodekeeper.io/remediation, effect: NoSchedule}\n",
        );
        assert!(is_excluded(&n));
        assert_eq!(node_zone(&n), ":\0:z1");
        assert!(node_view(&n).excluded_from_zone);
        assert_eq!(
            node_taints(&n),
            NodeTaints {
                remediation: true,
                out_of_service: false
            }
        );
        let medik8s =
            node("metadata: {labels: {remediation.medik8s.io/exclude-from-remediation: 'true'}}\n");
        assert!(is_excluded(&medik8s));
        let not_true = node("metadata: {labels: {fencing.nodekeeper.io/exclude: 'false'}}\n");
        assert!(!is_excluded(&not_true));
    }

    #[test]
    fn a_pod_is_read_for_its_controller_kind_volumes_and_phase() {
        let mut pod: Pod = serde_yaml_ng::from_str(
            "metadata: {name: db-0, namespace: shop}\n\
             spec:\n  containers: [{name: db}]\n  volumes:\n  - {name: data, persistentVolumeClaim: {claimName: data-db-0}}\n\
             status: {phase: Running}\n",
        )
        .expect("pod");
        pod.metadata.owner_references = Some(vec![OwnerReference {
            kind: "StatefulSet".into(),
            name: "db".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        let rwo: BTreeSet<(String, String)> =
            [("shop".to_string(), "data-db-0".to_string())].into();
        let facts = pod_facts(&pod, &rwo);
        assert_eq!(facts.owner_kinds, ["StatefulSet"]);
        assert!(facts.uses_single_node_volume);
        assert!(!facts.finished && !facts.node_bound);
        let facts = pod_facts(&pod, &BTreeSet::new());
        assert!(!facts.uses_single_node_volume);
        pod.status.as_mut().expect("status").phase = Some("Succeeded".into());
        assert!(pod_facts(&pod, &rwo).finished);
    }

    #[test]
    fn claims_are_single_node_by_their_access_modes() {
        let rwo: PersistentVolumeClaim =
            serde_yaml_ng::from_str("spec: {accessModes: [ReadWriteOnce]}\n").expect("pvc");
        let rwop: PersistentVolumeClaim =
            serde_yaml_ng::from_str("spec: {accessModes: [ReadWriteOncePod]}\n").expect("pvc");
        let rwx: PersistentVolumeClaim =
            serde_yaml_ng::from_str("spec: {accessModes: [ReadWriteMany]}\n").expect("pvc");
        assert!(is_single_node_claim(&rwo));
        assert!(is_single_node_claim(&rwop));
        assert!(!is_single_node_claim(&rwx));
    }

    fn fence_paused(reason: PauseReason, until: Option<&str>) -> NodeFence {
        let mut fence = NodeFence::new(
            "a",
            super::super::resource::NodeFenceSpec {
                node_name: "a".into(),
                force: false,
            },
        );
        fence.status = Some(super::super::resource::NodeFenceStatus {
            pause: Some(super::super::resource::Pause {
                reason,
                message: String::new(),
                since: Time("2026-11-24T01:00:00Z".parse().expect("time")),
                until: until.map(|u| Time(u.parse().expect("time"))),
            }),
            ..Default::default()
        });
        fence
    }

    #[test]
    fn the_fence_gauges_count_every_fence_the_failed_ones_and_the_paused_by_reason() {
        let mut failed = fence_paused(PauseReason::RetryBackoff, None);
        let status = failed.status.as_mut().expect("status");
        status.pause = None;
        status.conditions = serde_json::from_value(serde_json::json!([
            {"type": "Confirmed", "status": "False", "reason": "NotYet", "message": "",
             "lastTransitionTime": "2026-11-24T01:00:00Z"},
            {"type": "Failed", "status": "True", "reason": "RetriesUsedUp", "message": "",
             "lastTransitionTime": "2026-11-24T01:00:00Z"}
        ]))
        .expect("conditions");
        let mut not_failed = failed.clone();
        not_failed.status.as_mut().expect("status").conditions[1].status = "False".into();
        let fences = [
            failed,
            not_failed,
            fence_paused(PauseReason::NoConfiguration, None),
            fence_paused(PauseReason::NoConfiguration, None),
            fence_paused(PauseReason::StormGuard, None),
            NodeFence::new(
                "b",
                super::super::resource::NodeFenceSpec {
                    node_name: "b".into(),
                    force: false,
                },
            ),
        ];
        assert_eq!(
            fence_figures(&fences),
            FenceFigures {
                total: 6,
                failed: 1,
                paused: [
                    ("NoConfiguration".to_string(), 2),
                    ("StormGuard".to_string(), 1)
                ]
                .into(),
            }
        );
        assert_eq!(fence_figures(&[]), FenceFigures::default());
    }

    #[test]
    fn the_storm_memory_is_rebuilt_from_paused_fences() {
        let storm = fence_paused(PauseReason::StormGuard, None);
        let cooling = fence_paused(PauseReason::StormCooldown, Some("2026-11-24T01:05:00Z"));
        let later = fence_paused(PauseReason::StormCooldown, Some("2026-11-24T01:06:00Z"));
        let memory = storm_memory_from([&cooling, &later]);
        assert!(!memory.storm_active);
        assert_eq!(
            memory.cooldown_until,
            Some("2026-11-24T01:06:00Z".parse().expect("time"))
        );
        assert!(storm_memory_from([&storm]).storm_active);
        assert_eq!(storm_memory_from([]), StormMemory::default());
    }
}
