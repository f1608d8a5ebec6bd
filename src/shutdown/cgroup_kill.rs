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
    use std::process::{Child, Command};
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    static NEXT: AtomicUsize = AtomicUsize::new(0);

    /// A cgroup parent this test owns, removed (children first) when dropped.
    struct TestParent(PathBuf);

    impl TestParent {
        fn under(hierarchy: &str) -> Option<TestParent> {
            let root = Path::new(hierarchy);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dir = root.join(format!("nodekeeper-test-{}-{n}", std::process::id()));
            if let Err(error) = std::fs::create_dir(&dir) {
                eprintln!("skipping: cannot create a test cgroup under {hierarchy}: {error}");
                return None;
            }
            Some(TestParent(dir))
        }
    }

    impl Drop for TestParent {
        fn drop(&mut self) {
            let mut dirs = vec![];
            let mut pending = vec![self.0.clone()];
            while let Some(dir) = pending.pop() {
                if let Ok(entries) = std::fs::read_dir(&dir) {
                    for entry in entries.flatten() {
                        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                            pending.push(entry.path());
                        }
                    }
                }
                dirs.push(dir);
            }
            for dir in dirs.iter().rev() {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }

    /// A process this test started; killed by its PID if an assertion fails first.
    struct Started(Child);

    impl Drop for Started {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn start_in(cgroup: &Path, script: &str) -> Started {
        std::fs::create_dir_all(cgroup).unwrap();
        let child = Started(Command::new("sh").arg("-c").arg(script).spawn().unwrap());
        std::fs::write(cgroup.join("cgroup.procs"), child.0.id().to_string()).unwrap();
        child
    }

    fn planned(namespace: &str, name: &str) -> PlannedPod {
        PlannedPod {
            namespace: namespace.into(),
            name: name.into(),
            uid: None,
            grace_period_seconds: 0,
        }
    }

    async fn graceful_then_forced(hierarchy: &str) {
        let Some(parent) = TestParent::under(hierarchy) else {
            return;
        };
        let terminator = CgroupTerminator::new(&parent.0);
        let polite = planned("default", "polite");
        let stubborn = planned("default", "stubborn");
        let mut children = [
            start_in(&terminator.cgroup_of(&polite).unwrap(), "exec sleep 1000"),
            start_in(
                &terminator.cgroup_of(&stubborn).unwrap(),
                "trap '' TERM; exec sleep 1000",
            ),
        ];
        let grace = Duration::from_millis(300);
        assert_eq!(
            terminator
                .terminate(&polite, Duration::from_secs(30))
                .await
                .unwrap(),
            Termination::Graceful
        );
        assert_eq!(
            terminator.terminate(&stubborn, grace).await.unwrap(),
            Termination::Killed
        );
        let statuses: Vec<Option<i32>> = children
            .iter_mut()
            .map(|c| {
                use std::os::unix::process::ExitStatusExt;
                c.0.wait().unwrap().signal()
            })
            .collect();
        assert_eq!(statuses, vec![Some(libc::SIGTERM), Some(libc::SIGKILL)]);
        assert_eq!(
            terminator.terminate(&polite, grace).await.unwrap(),
            Termination::NotFound,
            "an empty cgroup has nothing to stop"
        );
        assert_eq!(
            terminator
                .terminate(&planned("default", "absent"), grace)
                .await
                .unwrap(),
            Termination::NotFound
        );
    }

    #[tokio::test]
    async fn cgroup_v2_processes_get_sigterm_then_cgroup_kill() {
        graceful_then_forced("/sys/fs/cgroup/unified").await;
    }

    #[tokio::test]
    async fn cgroup_v1_processes_get_sigterm_then_freeze_kill_thaw() {
        graceful_then_forced("/sys/fs/cgroup/freezer").await;
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
