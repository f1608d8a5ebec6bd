//! Evicting a pod the way the kubelet does, through the API: a Warning `Evicted` event
//! with the eviction message and annotations, the `DisruptionTarget` condition (reason
//! `TerminationByKubelet`) for threshold evictions, and a delete with the order's grace
//! period and a UID precondition. For immediate (hard-threshold, 1 s) evictions the pod's
//! cgroup is also killed locally at once: memory comes back in milliseconds, and the
//! kubelet does not restart a pod that is being deleted. The API writes go through the
//! outbox, so this never waits on the API server.

use std::collections::HashMap;
use std::time::SystemTime;

use super::api::event_name;
use super::outbox::{ApiAction, ConditionRecord, EventRecord, EventType, InvolvedObject, PodRef};
use super::worker::OutboxHandle;
use crate::act::CgroupKiller;
use crate::eviction::{EVICTED_REASON, EvictionOrder, IMMEDIATE_GRACE_PERIOD_SECONDS};
use crate::pods::Pod;
use crate::ports::{EvictError, Evictor};

pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
pub const TERMINATION_BY_KUBELET: &str = "TerminationByKubelet";

/// Kills every process of a pod's cgroup now.
pub trait LocalKiller: Send {
    fn kill(&mut self, pod: &Pod) -> Result<(), String>;
}

/// `DisruptionTarget=True` with reason `TerminationByKubelet`, as the kubelet sets it on
/// pods it evicts and on pods it stops at node shutdown.
pub fn disruption_target(message: &str, now: SystemTime) -> ConditionRecord {
    ConditionRecord {
        condition_type: DISRUPTION_TARGET.to_string(),
        status: true,
        reason: TERMINATION_BY_KUBELET.to_string(),
        message: message.to_string(),
        last_transition: now,
        last_heartbeat: None,
    }
}

/// The standalone cgroup killer serves the API mode too: `cgroup.kill` on v2, freeze,
/// SIGKILL and thaw on v1, SIGKILL to each member otherwise.
impl LocalKiller for CgroupKiller {
    fn kill(&mut self, pod: &Pod) -> Result<(), String> {
        let cgroup = pod
            .cgroup
            .as_ref()
            .ok_or("pod has no cgroup on this node")?;
        CgroupKiller::kill(self, cgroup)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// The [`Evictor`] for pods from the API server.
pub struct KubeEvictor {
    outbox: OutboxHandle,
    local_killer: Option<Box<dyn LocalKiller>>,
    /// Evictions per pod UID, for the event count of a repeated eviction.
    evictions: HashMap<String, i32>,
}

impl KubeEvictor {
    pub fn new(outbox: OutboxHandle, local_killer: Option<Box<dyn LocalKiller>>) -> Self {
        KubeEvictor {
            outbox,
            local_killer,
            evictions: HashMap::new(),
        }
    }
}

impl Evictor for KubeEvictor {
    fn evict(&mut self, order: &EvictionOrder, pod: &Pod) -> Result<(), EvictError> {
        let failed = |message: &str| EvictError::Failed {
            pod: order.key(),
            message: message.to_string(),
        };
        // The core never picks these; this guards the API path independently.
        if pod.is_critical() {
            return Err(failed("cannot evict a critical pod"));
        }
        let uid = order
            .uid
            .clone()
            .or_else(|| pod.uid.clone())
            .ok_or_else(|| failed("pod has no UID, so it cannot be deleted safely"))?;
        if order.grace_period_seconds <= IMMEDIATE_GRACE_PERIOD_SECONDS
            && let Some(killer) = self.local_killer.as_mut()
        {
            match killer.kill(pod) {
                Ok(()) => tracing::warn!(pod = %order.key(), "killed the pod's cgroup locally"),
                Err(error) => {
                    tracing::warn!(pod = %order.key(), %error, "local kill failed; the API delete still follows")
                }
            }
        }
        let now = SystemTime::now();
        if self.evictions.len() > 10_000 {
            self.evictions.clear();
        }
        let count = self.evictions.entry(uid.clone()).or_insert(0);
        *count += 1;
        let pod_ref = PodRef {
            namespace: order.namespace.clone(),
            name: order.name.clone(),
            uid: uid.clone(),
        };
        // Condition and delete first in the pod lane, the event in bookkeeping; queued
        // (and kept in the journal) together.
        let mut writes = vec![ApiAction::CreateEvent(EventRecord {
            name: event_name(&order.name, &format!("{EVICTED_REASON}/{uid}")),
            namespace: order.namespace.clone(),
            involved: InvolvedObject {
                kind: "Pod",
                namespace: Some(order.namespace.clone()),
                name: order.name.clone(),
                uid: uid.clone(),
            },
            event_type: EventType::Warning,
            reason: EVICTED_REASON.to_string(),
            message: order.message.clone(),
            annotations: order.annotations.clone(),
            count: *count,
            first_seen: now,
            last_seen: now,
        })];
        if order.disruption_target {
            writes.push(ApiAction::SetPodCondition {
                pod: pod_ref.clone(),
                condition: disruption_target(&order.message, now),
            });
        }
        writes.push(ApiAction::DeletePod {
            pod: pod_ref,
            grace_period_seconds: order.grace_period_seconds,
        });
        self.outbox.push_all(writes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eviction::EvictionReason;
    use crate::signals::Signal;
    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex};

    struct Recorder(Arc<Mutex<Vec<String>>>);
    impl LocalKiller for Recorder {
        fn kill(&mut self, pod: &Pod) -> Result<(), String> {
            self.0.lock().unwrap().push(pod.key());
            Ok(())
        }
    }

    fn order(grace: i64, disruption_target: bool) -> EvictionOrder {
        EvictionOrder {
            namespace: "shop".to_string(),
            name: "web".to_string(),
            uid: Some("u1".to_string()),
            reason: EvictionReason::Threshold(Signal::MemoryAvailable),
            grace_period_seconds: grace,
            message: "The node was low on resource: memory. ".to_string(),
            annotations: BTreeMap::from([("starved_resource".to_string(), "memory".to_string())]),
            disruption_target,
        }
    }

    fn pod() -> Pod {
        Pod {
            namespace: "shop".to_string(),
            name: "web".to_string(),
            uid: Some("u1".to_string()),
            ..Default::default()
        }
    }

    #[test]
    fn queues_event_condition_and_delete_and_kills_hard_evictions_locally() {
        let killed = Arc::new(Mutex::new(Vec::new()));
        let outbox = OutboxHandle::new(10);
        let mut evictor =
            KubeEvictor::new(outbox.clone(), Some(Box::new(Recorder(killed.clone()))));
        evictor.evict(&order(1, true), &pod()).unwrap();
        assert_eq!(*killed.lock().unwrap(), vec!["shop/web"]);
        // The pod lane (condition, then delete) first, then the event in bookkeeping.
        let kinds: Vec<_> = outbox.pending().iter().map(|a| a.kind()).collect();
        assert_eq!(kinds, vec!["pod_condition", "pod_delete", "event"]);
        let pending = outbox.pending();
        let ApiAction::CreateEvent(event) = &pending[2] else {
            panic!()
        };
        assert_eq!(event.reason, "Evicted");
        assert_eq!(event.event_type, EventType::Warning);
        assert_eq!(
            event
                .annotations
                .get("starved_resource")
                .map(String::as_str),
            Some("memory")
        );
        let ApiAction::SetPodCondition { condition, .. } = &pending[0] else {
            panic!()
        };
        assert_eq!(condition.reason, "TerminationByKubelet");
        assert_eq!(
            pending[1],
            ApiAction::DeletePod {
                pod: PodRef {
                    namespace: "shop".into(),
                    name: "web".into(),
                    uid: "u1".into()
                },
                grace_period_seconds: 1
            }
        );
    }

    #[test]
    fn soft_and_local_storage_evictions_are_not_killed_locally_or_marked() {
        let killed = Arc::new(Mutex::new(Vec::new()));
        let outbox = OutboxHandle::new(10);
        let mut evictor =
            KubeEvictor::new(outbox.clone(), Some(Box::new(Recorder(killed.clone()))));
        evictor.evict(&order(30, false), &pod()).unwrap();
        assert!(killed.lock().unwrap().is_empty());
        let kinds: Vec<_> = outbox.pending().iter().map(|a| a.kind()).collect();
        assert_eq!(kinds, vec!["pod_delete", "event"]);
    }

    #[test]
    fn critical_pods_and_pods_without_uid_are_refused() {
        let outbox = OutboxHandle::new(10);
        let mut evictor = KubeEvictor::new(outbox.clone(), None);
        let critical = Pod {
            critical: true,
            ..pod()
        };
        assert!(
            evictor
                .evict(&order(1, true), &critical)
                .unwrap_err()
                .to_string()
                .contains("critical")
        );
        let mut no_uid = order(1, true);
        no_uid.uid = None;
        let anonymous = Pod { uid: None, ..pod() };
        assert!(evictor.evict(&no_uid, &anonymous).is_err());
        assert!(outbox.is_empty());
    }

    #[test]
    fn cgroup_killer_kills_every_member_of_a_real_process_tree() {
        // A fake v1 tree whose cgroup.procs lists a real child process we started.
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pod_dir = dir.path().join("memory/kubepods/podx");
        std::fs::create_dir_all(pod_dir.join("ctr")).unwrap();
        std::fs::write(pod_dir.join("cgroup.procs"), "").unwrap();
        std::fs::write(
            pod_dir.join("ctr/cgroup.procs"),
            format!("{}\n", child.id()),
        )
        .unwrap();
        let mut killer = CgroupKiller::new(dir.path(), crate::signals::CgroupLayout::Legacy);
        let target = Pod {
            cgroup: Some(PathBuf::from("/kubepods/podx")),
            ..pod()
        };
        LocalKiller::kill(&mut killer, &target).unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9));
        assert!(
            LocalKiller::kill(&mut killer, &pod())
                .unwrap_err()
                .contains("no cgroup")
        );
    }
}
