//! Graceful node shutdown through the API: the shutdown manager drains this node's pods
//! by deleting them (`DisruptionTarget` first, then a delete with the phase's grace and a
//! UID precondition, both through the outbox), and the node shows the shutdown with our
//! condition, taint and the kubelet's `Shutdown` events.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod as ApiPod;
use kube::runtime::reflector::{ObjectRef, Store};

use super::convert::{convert_pod, has_finished};
use super::evictor::disruption_target;
use super::node::{Moment, NodeStatusTracker};
use super::outbox::{ApiAction, PodRef};
use super::source::TaskGuard;
use super::worker::OutboxHandle;
use crate::ports::ShutdownObserver;
use crate::shutdown::manager::{ManagerStatus, PodLister};
use crate::shutdown::plan::PlannedPod;
use crate::shutdown::runner::{PodTerminator, TerminateError, Termination};

/// The kubelet's `DisruptionTarget` message for pods killed by a node shutdown.
pub const SHUTDOWN_DISRUPTION_MESSAGE: &str =
    "Pod was terminated in response to imminent node shutdown.";
/// How long past its grace period a deleted pod may take to leave the watch cache.
const DELETE_SLACK: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(100);

/// Deletes pods through the API and waits for them to leave the watch cache.
pub struct KubeTerminator {
    outbox: OutboxHandle,
    store: Store<ApiPod>,
    _tasks: Arc<TaskGuard>,
}

impl KubeTerminator {
    pub fn new(outbox: OutboxHandle, store: Store<ApiPod>, tasks: Arc<TaskGuard>) -> Self {
        KubeTerminator {
            outbox,
            store,
            _tasks: tasks,
        }
    }

    /// The pod is still there, as the same object, and has not finished.
    fn present(&self, pod: &PodRef) -> Option<bool> {
        let found = self
            .store
            .get(&ObjectRef::new(&pod.name).within(&pod.namespace))?;
        if found.metadata.uid.as_deref() != Some(pod.uid.as_str()) {
            return None;
        }
        (!has_finished(&found)).then_some(found.metadata.deletion_timestamp.is_some())
    }
}

impl PodTerminator for KubeTerminator {
    async fn terminate(
        &self,
        pod: &PlannedPod,
        grace: Duration,
    ) -> Result<Termination, TerminateError> {
        let uid = pod.uid.clone().ok_or_else(|| TerminateError {
            pod: pod.key(),
            message: "the pod has no UID, so it cannot be deleted safely".to_string(),
        })?;
        let pod_ref = PodRef {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid,
        };
        if self.present(&pod_ref).is_none() {
            return Ok(Termination::NotFound);
        }
        self.outbox.push(ApiAction::SetPodCondition {
            pod: pod_ref.clone(),
            condition: disruption_target(SHUTDOWN_DISRUPTION_MESSAGE, SystemTime::now()),
        });
        self.outbox.push(ApiAction::DeletePod {
            pod: pod_ref.clone(),
            grace_period_seconds: i64::try_from(grace.as_secs()).unwrap_or(i64::MAX),
        });
        let deadline = tokio::time::Instant::now() + grace + DELETE_SLACK;
        loop {
            match self.present(&pod_ref) {
                None => return Ok(Termination::Graceful),
                // The kubelet kills what outlives its grace period.
                Some(true) if tokio::time::Instant::now() >= deadline => {
                    return Ok(Termination::Killed);
                }
                Some(false) if tokio::time::Instant::now() >= deadline => {
                    return Err(TerminateError {
                        pod: pod_ref.key(),
                        message: format!(
                            "the API server did not accept the delete within {}s",
                            (grace + DELETE_SLACK).as_secs()
                        ),
                    });
                }
                Some(_) => tokio::time::sleep(POLL).await,
            }
        }
    }
}

/// Every pod bound to this node that has not finished, critical and static ones
/// included: at shutdown the kubelet stops them all.
pub fn node_pods(store: Store<ApiPod>) -> PodLister {
    Arc::new(move || {
        // An empty cache before the first list is not "no pods".
        use futures::FutureExt;
        if !matches!(store.wait_until_ready().now_or_never(), Some(Ok(()))) {
            return Err("the pod cache has not been filled from the API server yet".to_string());
        }
        let mut pods = Vec::new();
        for api_pod in store.state() {
            if has_finished(&api_pod) {
                continue;
            }
            match convert_pod(&api_pod) {
                Ok(node_pod) => pods.push(node_pod.pod),
                Err(error) => tracing::warn!(%error, "pod left out of the shutdown plan"),
            }
        }
        Ok(pods)
    })
}

/// Publishes the shutdown manager's state on the node through the shared tracker, so
/// the shutdown taint and our pressure taints are always written as one set.
pub struct NodeShutdownPublisher {
    tracker: Arc<Mutex<NodeStatusTracker>>,
    outbox: OutboxHandle,
}

impl NodeShutdownPublisher {
    pub fn new(tracker: Arc<Mutex<NodeStatusTracker>>, outbox: OutboxHandle) -> Self {
        NodeShutdownPublisher { tracker, outbox }
    }
}

impl ShutdownObserver for NodeShutdownPublisher {
    fn observe(&mut self, status: &ManagerStatus) {
        let mut tracker = self.tracker.lock().unwrap_or_else(PoisonError::into_inner);
        // Pushed under the lock: a cycle's taint set cannot overtake this one.
        for action in tracker.set_shutting_down(status.shutting_down, Moment::now()) {
            self.outbox.push(action);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher;

    #[test]
    fn an_unfilled_pod_cache_is_an_error_not_an_empty_node() {
        let (store, mut writer) = kube::runtime::reflector::store::<ApiPod>();
        let pods = node_pods(store);
        let error = pods().expect_err("not filled yet");
        assert!(error.contains("not been filled"), "{error}");
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        assert_eq!(pods().expect("filled").len(), 0);
    }
}
