//! Standalone-mode termination: each pod is a workload cgroup `<parent>/<namespace>/<name>`.
//! Its processes get SIGTERM, and whatever is left when the grace period ends is killed
//! as a whole: `cgroup.kill` on cgroup v2 (5.14+), otherwise freeze, SIGKILL, thaw, so no
//! process can fork its way out between listing and killing.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

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
    poll_interval: Duration,
    /// How long to wait for the cgroup to empty after SIGKILL.
    kill_wait: Duration,
}

impl CgroupTerminator {
    pub fn new(parent: impl Into<PathBuf>) -> Self {
        CgroupTerminator {
            parent: parent.into(),
            flat_namespace: None,
            poll_interval: Duration::from_millis(20),
            kill_wait: Duration::from_secs(5),
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
            let mut components = Path::new(part).components();
            let single_normal = matches!(components.next(), Some(Component::Normal(_)))
                && components.next().is_none();
            if !single_normal {
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
        let fail = |message: String| TerminateError {
            pod: pod.key(),
            message: format!("{}: {message}", cgroup.display()),
        };
        if !cgroup.is_dir() {
            return Ok(Termination::NotFound);
        }
        let pids = processes_in(&cgroup).map_err(|e| fail(e.to_string()))?;
        if pids.is_empty() {
            return Ok(Termination::NotFound);
        }
        for pid in pids {
            signal_process(pid, Signal::SIGTERM);
        }
        let deadline = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < deadline {
            if processes_in(&cgroup)
                .map_err(|e| fail(e.to_string()))?
                .is_empty()
            {
                return Ok(Termination::Graceful);
            }
            tokio::time::sleep(self.poll_interval.min(grace)).await;
        }
        if processes_in(&cgroup)
            .map_err(|e| fail(e.to_string()))?
            .is_empty()
        {
            return Ok(Termination::Graceful);
        }
        kill_cgroup(&cgroup, self.poll_interval)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let deadline = tokio::time::Instant::now() + self.kill_wait;
        loop {
            let left = processes_in(&cgroup).map_err(|e| fail(e.to_string()))?;
            if left.is_empty() {
                return Ok(Termination::Killed);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(fail(format!("processes {left:?} survived SIGKILL")));
            }
            tokio::time::sleep(self.poll_interval).await;
        }
    }
}

fn signal_process(pid: i32, signal: Signal) {
    // ESRCH only means it already exited.
    let _ = kill(Pid::from_raw(pid), signal);
}

/// Every process in the cgroup and its descendants.
pub fn processes_in(cgroup: &Path) -> std::io::Result<Vec<i32>> {
    let mut pids = Vec::new();
    let mut pending = vec![cgroup.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let procs = match std::fs::read_to_string(dir.join("cgroup.procs")) {
            Ok(text) => text,
            // Removed while we walked: nothing left in it.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => return Err(error),
        };
        pids.extend(
            procs
                .lines()
                .filter_map(|line| line.trim().parse::<i32>().ok()),
        );
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

async fn kill_cgroup(cgroup: &Path, poll: Duration) -> std::io::Result<()> {
    let kill_file = cgroup.join("cgroup.kill");
    if kill_file.exists() {
        return std::fs::write(kill_file, "1");
    }
    let v1_freezer = cgroup.join("freezer.state");
    let v2_freezer = cgroup.join("cgroup.freeze");
    if v1_freezer.exists() {
        std::fs::write(&v1_freezer, "FROZEN")?;
        wait_until(poll, || {
            Ok(std::fs::read_to_string(&v1_freezer)?.trim() == "FROZEN")
        })
        .await?;
        kill_all(cgroup)?;
        std::fs::write(&v1_freezer, "THAWED")
    } else if v2_freezer.exists() {
        std::fs::write(&v2_freezer, "1")?;
        let events = cgroup.join("cgroup.events");
        wait_until(poll, || {
            Ok(std::fs::read_to_string(&events)?
                .lines()
                .any(|line| line.trim() == "frozen 1"))
        })
        .await?;
        kill_all(cgroup)?;
        std::fs::write(&v2_freezer, "0")
    } else {
        kill_all(cgroup)
    }
}

fn kill_all(cgroup: &Path) -> std::io::Result<()> {
    for pid in processes_in(cgroup)? {
        signal_process(pid, Signal::SIGKILL);
    }
    Ok(())
}

/// Freezing normally completes in microseconds; give up after a second and kill anyway.
async fn wait_until(
    poll: Duration,
    mut done: impl FnMut() -> std::io::Result<bool>,
) -> std::io::Result<()> {
    for _ in 0..(1000 / poll.as_millis().max(1)) {
        if done()? {
            return Ok(());
        }
        tokio::time::sleep(poll).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
