//! The node's pod processes as isolation sees them: the whole pods cgroup (`kubepods`,
//! or `kubepods.slice` with the systemd driver), killed and counted with the one cgroup
//! killer. The whole subtree, not the pods the API lists: a partitioned node's pod list
//! may be stale, and a pod the agent does not know of must not survive either.

use std::path::Path;

use crate::act::{CgroupKiller, KillTarget, count_processes, kill_target};

/// Killing and counting the node's pod processes (blocking; the isolator runs it on the
/// blocking pool).
pub trait PodProcesses: Send + Sync + 'static {
    /// SIGKILL every process of every pod; how many were signalled.
    fn kill_all(&self) -> Result<usize, String>;
    /// How many pod processes there are.
    fn count(&self) -> Result<usize, String>;
}

/// The kubelet's pods cgroup on this node.
#[derive(Debug, Clone)]
pub struct PodsCgroup {
    target: KillTarget,
}

impl PodsCgroup {
    /// `pods_cgroup` relative to the hierarchy root of `killer`.
    pub fn new(killer: &CgroupKiller, pods_cgroup: &Path) -> PodsCgroup {
        PodsCgroup {
            target: killer.target(pods_cgroup),
        }
    }

    /// A pods cgroup that is not there is a configuration error (the wrong driver or
    /// name), never an empty node: "no pod process left" must be seen, not assumed.
    fn present(&self) -> Result<(), String> {
        if self.target.tasks.is_dir() {
            Ok(())
        } else {
            Err(format!(
                "the pods cgroup {} does not exist (kubernetes.podsCgroupName, kubernetes.cgroupDriver)",
                self.target.tasks.display()
            ))
        }
    }
}

impl PodProcesses for PodsCgroup {
    fn kill_all(&self) -> Result<usize, String> {
        self.present()?;
        kill_target(&self.target)
            .map(|report| report.signalled)
            .map_err(|error| error.to_string())
    }

    fn count(&self) -> Result<usize, String> {
        self.present()?;
        count_processes(&self.target).map_err(|error| error.to_string())
    }
}
