//! What the controller knows about a node and its pods, as plain data the decision
//! functions read, and the rules on which pods make a node worth fencing and on zone
//! keys. Whether the node is lost is `liveness.rs`'s judgement over these facts.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::fencing::{FenceAction, FencePlan, Step};

/// The node's `Ready` condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Readiness {
    Ready,
    /// `Ready=False`: the kubelet says the node is not ready.
    NotReady,
    /// `Ready=Unknown` (the node lifecycle controller stopped hearing from the kubelet),
    /// or no Ready condition at all.
    Unknown,
}

/// The node's health as the Ready condition tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct NodeHealth {
    pub readiness: Readiness,
    /// The condition's `lastTransitionTime`; unhealthy durations are measured from it.
    pub since: Option<Timestamp>,
}

impl NodeHealth {
    pub fn is_ready(&self) -> bool {
        self.readiness == Readiness::Ready
    }
}

/// One method of a step as the decision needs it: no parameters, no credentials.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MethodOutline {
    pub name: String,
    pub agent: String,
    pub action: FenceAction,
    pub must_succeed: bool,
}

/// A node's fence configuration reduced to its shape: per step, the alternatives, each a
/// list of methods in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PlanOutline {
    pub steps: BTreeMap<Step, Vec<Vec<MethodOutline>>>,
    /// `kdump=true`: the node's kdump notifications count (see `kdump.rs`).
    pub kdump: bool,
}

impl PlanOutline {
    pub fn from_plan(plan: &FencePlan) -> PlanOutline {
        let steps = plan
            .steps
            .iter()
            .filter(|step| !step.alternatives.is_empty())
            .map(|step| {
                let alternatives = step
                    .alternatives
                    .iter()
                    .map(|alternative| {
                        alternative
                            .methods
                            .iter()
                            .map(|method| MethodOutline {
                                name: method.name.clone(),
                                agent: method.agent.clone(),
                                action: method.action,
                                must_succeed: method.must_succeed,
                            })
                            .collect()
                    })
                    .collect();
                (step.step, alternatives)
            })
            .collect();
        PlanOutline {
            steps,
            kdump: plan.kdump,
        }
    }

    /// The step's alternatives; empty when the step is not configured.
    pub fn alternatives(&self, step: Step) -> &[Vec<MethodOutline>] {
        self.steps.get(&step).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn has(&self, step: Step) -> bool {
        !self.alternatives(step).is_empty()
    }

    /// Whether the configuration can fence at all: an isolation or a power step.
    pub fn can_fence(&self) -> bool {
        self.has(Step::Isolation) || self.has(Step::PowerManagement)
    }
}

/// Which of our taints the node carries now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct NodeTaints {
    /// Our `NoSchedule` remediation taint.
    pub remediation: bool,
    /// `node.kubernetes.io/out-of-service` (ours or anyone's).
    pub out_of_service: bool,
}

/// Everything the decision knows about the node of one fence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeFacts {
    /// `false` once the Node object is gone.
    pub exists: bool,
    pub health: NodeHealth,
    /// What the controller heard from the node itself (its Lease, its agent's reports).
    pub liveness: super::liveness::Liveness,
    /// The zone (`topology.kubernetes.io/region` and `zone`), as the node lifecycle
    /// controller keys it; empty when the node has neither label.
    pub zone: String,
    /// The node carries the exclusion label: never fenced.
    pub excluded: bool,
    /// The node runs at least one pod that needs fencing (see [`pod_needs_fencing`]).
    pub runs_pods_needing_fencing: bool,
    /// Pods still bound to the node that a release would delete (the optional cluster
    /// fence deletes them until none is left).
    pub pods_to_release: usize,
    /// Volumes attached to the node (`status.volumesAttached`). After a clean drain the
    /// node runs no pods, but a volume the kubelet had no time to report unmounted stays
    /// attached to it for six minutes unless the node is taken out of service.
    pub volumes_attached: usize,
    pub taints: NodeTaints,
    /// The node's fence configuration, or why it cannot be used.
    pub plan: Result<PlanOutline, String>,
    /// The latest run of kdump notifications from one of the node's InternalIPs, if the
    /// controller listens for them and heard any. Whether it counts is the decision's.
    pub kdump: Option<super::kdump::KdumpHeard>,
    /// Since when this controller listens for kdump notifications (`None`: it does not).
    pub kdump_listening_since: Option<Timestamp>,
    /// The last renewal of the node's Lease this controller saw (or when it began
    /// listening, if none), whether or not the node's agent reports; `None` while it
    /// does not listen. A self-isolation promise counts from no earlier than this.
    pub lease_heard: Option<Timestamp>,
    /// The boot the node's kubelet last reported (`status.nodeInfo.bootID`).
    pub boot_id: Option<String>,
    /// A fresh read of the node's Lease, taken for a fence that may release the node on
    /// a self-isolation promise: `Some(true)` when it shows the renewal the controller
    /// last heard (its Lease watch missed nothing), `Some(false)` when it shows another
    /// one, `None` when it was not read or could not be.
    pub lease_unchanged: Option<bool>,
}

/// A pod as the "does this node need fencing" rule sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    pub labels: BTreeMap<String, String>,
    /// Kinds of the pod's controlling owner references (`StatefulSet`, `ReplicaSet`, ...).
    pub owner_kinds: Vec<String>,
    /// The pod mounts a PersistentVolumeClaim whose access modes include ReadWriteOnce or
    /// ReadWriteOncePod: its volume cannot attach elsewhere until the node is fenced.
    pub uses_single_node_volume: bool,
    /// Succeeded or Failed: nothing left to release.
    pub finished: bool,
    /// A mirror (static) pod or a DaemonSet pod: bound to this node, never released.
    pub node_bound: bool,
}

/// Which pods make a node worth fencing. By default a StatefulSet pod or a pod with a
/// ReadWriteOnce/ReadWriteOncePod volume (both stay stuck on a dead node forever); a pod
/// selector, when set, replaces that rule.
pub fn pod_needs_fencing(pod: &PodFacts, selector: Option<&kube::core::Selector>) -> bool {
    if pod.finished || pod.node_bound {
        return false;
    }
    match selector {
        Some(selector) => kube::core::SelectorExt::matches(selector, &pod.labels),
        None => {
            pod.uses_single_node_volume || pod.owner_kinds.iter().any(|kind| kind == "StatefulSet")
        }
    }
}

/// The zone key of the node lifecycle controller: region and zone joined by `:\0:`, so a
/// node with neither label is in the zone "".
pub fn zone_key(labels: &BTreeMap<String, String>) -> String {
    let region = labels
        .get("topology.kubernetes.io/region")
        .map(String::as_str)
        .unwrap_or("");
    let zone = labels
        .get("topology.kubernetes.io/zone")
        .map(String::as_str)
        .unwrap_or("");
    if region.is_empty() && zone.is_empty() {
        String::new()
    } else {
        format!("{region}:\0:{zone}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statefulset_pods_and_single_node_volumes_need_fencing_by_default() {
        let statefulset = PodFacts {
            owner_kinds: vec!["StatefulSet".into()],
            ..PodFacts::default()
        };
        let rwo = PodFacts {
            owner_kinds: vec!["ReplicaSet".into()],
            uses_single_node_volume: true,
            ..PodFacts::default()
        };
        let stateless = PodFacts {
            owner_kinds: vec!["ReplicaSet".into()],
            ..PodFacts::default()
        };
        let finished = PodFacts {
            finished: true,
            ..statefulset.clone()
        };
        let daemon = PodFacts {
            node_bound: true,
            ..rwo.clone()
        };
        assert!(pod_needs_fencing(&statefulset, None));
        assert!(pod_needs_fencing(&rwo, None));
        assert!(!pod_needs_fencing(&stateless, None));
        assert!(!pod_needs_fencing(&finished, None));
        assert!(!pod_needs_fencing(&daemon, None));
    }

    #[test]
    fn a_pod_selector_replaces_the_default_rule() {
        let selector = kube::core::Selector::from_iter([("fence", "yes")]);
        let labelled = PodFacts {
            labels: [("fence".to_string(), "yes".to_string())].into(),
            ..PodFacts::default()
        };
        let statefulset = PodFacts {
            owner_kinds: vec!["StatefulSet".into()],
            ..PodFacts::default()
        };
        assert!(pod_needs_fencing(&labelled, Some(&selector)));
        assert!(!pod_needs_fencing(&statefulset, Some(&selector)));
    }

    #[test]
    fn zones_are_keyed_like_the_node_lifecycle_controller() {
        let labels: BTreeMap<String, String> = [
            (
                "topology.kubernetes.io/region".to_string(),
                "eu".to_string(),
            ),
            (
                "topology.kubernetes.io/zone".to_string(),
                "eu-1a".to_string(),
            ),
        ]
        .into();
        assert_eq!(zone_key(&labels), "eu:\0:eu-1a");
        assert_eq!(zone_key(&BTreeMap::new()), "");
    }
}
