//! Standalone-mode termination: each pod is a workload cgroup `<parent>/<namespace>/<name>`,
//! stopped by the agent's one cgroup killer (`act::kill`): SIGTERM, and whatever is left
//! when the grace period ends is killed as a whole (`cgroup.kill`, else freeze, SIGKILL,
//! thaw), so no process can fork its way out between listing and killing.

use std::path::PathBuf;
use std::time::Duration;

use crate::act::{KillTarget, StopTiming, Stopped, is_path_component, stop_gracefully};

use super::plan::PlannedPod;
use super::runner::{PodTerminator, TerminateError, Termination};

#[derive(Debug, Clone)]
pub struct CgroupTerminator {
    /// Directory holding `<namespace>/<name>` workload cgroups, inside a v2 hierarchy or
    /// the v1 freezer hierarchy (e.g. `/sys/fs/cgroup/freezer/nodekeeper-workloads`).
    parent: PathBuf,
    /// When set, workloads are `<parent>/<name>` and all carry this namespace (the agent's
    /// standalone `workloads` layout) instead of `<parent>/<namespace>/<name>`.
    flat_namespace: Option<String>,
    timing: StopTiming,
}

impl CgroupTerminator {
    pub fn new(parent: impl Into<PathBuf>) -> Self {
        CgroupTerminator {
            parent: parent.into(),
            flat_namespace: None,
            timing: StopTiming::default(),
        }
    }

    /// Workloads are the direct children `<parent>/<name>`, all in `namespace`.
    pub fn flat(parent: impl Into<PathBuf>, namespace: &str) -> Self {
        CgroupTerminator {
            flat_namespace: Some(namespace.to_string()),
            ..Self::new(parent)
        }
    }

    pub fn cgroup_of(&self, pod: &PlannedPod) -> Result<PathBuf, TerminateError> {
        for part in [&pod.namespace, &pod.name] {
            if !is_path_component(part) {
                return Err(TerminateError {
                    pod: pod.key(),
                    message: format!("{part:?} cannot name a workload cgroup directory"),
                });
            }
        }
        match &self.flat_namespace {
            None => Ok(self.parent.join(&pod.namespace).join(&pod.name)),
            Some(namespace) if *namespace == pod.namespace => Ok(self.parent.join(&pod.name)),
            Some(namespace) => Err(TerminateError {
                pod: pod.key(),
                message: format!("only workloads of namespace {namespace:?} are managed here"),
            }),
        }
    }
}

impl PodTerminator for CgroupTerminator {
    async fn terminate(
        &self,
        pod: &PlannedPod,
        grace: Duration,
    ) -> Result<Termination, TerminateError> {
        let cgroup = self.cgroup_of(pod)?;
        let stopped = stop_gracefully(KillTarget::directory(&cgroup), grace, self.timing)
            .await
            .map_err(|error| TerminateError {
                pod: pod.key(),
                message: error.to_string(),
            })?;
        Ok(match stopped {
            Stopped::NothingToStop => Termination::NotFound,
            Stopped::Exited => Termination::Graceful,
            Stopped::Killed(_) => Termination::Killed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    // The real-cgroup tests of the terminator are in tests/act.rs.

    fn planned(namespace: &str, name: &str) -> PlannedPod {
        PlannedPod {
            namespace: namespace.into(),
            name: name.into(),
            uid: None,
            grace_period_seconds: 0,
        }
    }

    #[test]
    fn pod_names_cannot_escape_the_workload_parent() {
        let terminator = CgroupTerminator::new("/sys/fs/cgroup/x");
        for (namespace, name) in [("..", "a"), ("a", "b/c"), ("a", ""), ("/", "a")] {
            let error = terminator.cgroup_of(&planned(namespace, name)).unwrap_err();
            assert!(error.to_string().contains("cannot name"), "{error}");
        }
        assert_eq!(
            terminator.cgroup_of(&planned("ns", "web-1")).unwrap(),
            Path::new("/sys/fs/cgroup/x/ns/web-1")
        );
    }
}
