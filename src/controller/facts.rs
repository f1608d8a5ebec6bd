//! What the controller knows about a node and its pods, as plain data the decision
//! functions read, and the rules that turn it into "this node should be fenced": the
//! Ready condition's age, the pods that need fencing, the exclusion label.

use std::collections::BTreeMap;
use std::time::Duration;

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

    /// How long the node has been unhealthy at `now`, or `None` while it is Ready. A
    /// missing or future transition time counts as "just now", so a clock skew between
    /// the API server and us can only delay a fence, never hurry one.
    pub fn unhealthy_for(&self, now: Timestamp) -> Option<Duration> {
        if self.is_ready() {
            return None;
        }
        let since = self.since.unwrap_or(now);
        Some(Duration::try_from(now.duration_since(since)).unwrap_or(Duration::ZERO))
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
        PlanOutline { steps }
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
    pub taints: NodeTaints,
    /// The node's fence configuration, or why it cannot be used.
    pub plan: Result<PlanOutline, String>,
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

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("in range")
    }

    #[test]
    fn unhealthy_time_counts_from_the_ready_condition_transition() {
        let health = NodeHealth {
            readiness: Readiness::Unknown,
            since: Some(at(0)),
        };
        assert_eq!(health.unhealthy_for(at(61)), Some(Duration::from_secs(61)));
        let ready = NodeHealth {
            readiness: Readiness::Ready,
            since: Some(at(0)),
        };
        assert_eq!(ready.unhealthy_for(at(61)), None);
    }

    #[test]
    fn a_transition_in_the_future_or_missing_counts_as_just_now() {
        let skewed = NodeHealth {
            readiness: Readiness::NotReady,
            since: Some(at(100)),
        };
        assert_eq!(skewed.unhealthy_for(at(10)), Some(Duration::ZERO));
        let missing = NodeHealth {
            readiness: Readiness::NotReady,
            since: None,
        };
        assert_eq!(missing.unhealthy_for(at(10)), Some(Duration::ZERO));
    }

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
