//! The node's pod processes as isolation sees them: the whole pods cgroup (`kubepods`,
//! or `kubepods.slice` with the systemd driver), killed and counted with the one cgroup
//! killer. The whole subtree, not the pods the API lists: a partitioned node's pod list
//! may be stale, and a pod the agent does not know of must not survive either. One pod is
//! spared: the agent's own, when it runs as a DaemonSet pod, which must live on to report
//! the isolation and end it later.

use std::path::{Path, PathBuf};

use crate::act::{
    CgroupKiller, KillTarget, count_direct_members, count_processes, kill_direct_members,
    kill_target,
};

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

/// What a kill or a count covers below the pods cgroup, the agent's own pod left out.
#[derive(Debug, Default, PartialEq, Eq)]
struct Reach {
    /// Whole subtrees, relative to the pods cgroup ("" is all of it).
    subtrees: Vec<PathBuf>,
    /// Cgroups on the way to the agent's pod: only the processes directly in them.
    on_the_way: Vec<PathBuf>,
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

    /// The part of the tree to act on now.
    fn reach(&self) -> Reach {
        let own = own_pod(&self.target.tasks, std::process::id());
        reach(&self.target.tasks, own.as_deref())
    }

    fn target_at(&self, relative: &Path) -> KillTarget {
        KillTarget {
            tasks: self.target.tasks.join(relative),
            v1_freezer: self
                .target
                .v1_freezer
                .as_ref()
                .map(|freezer| freezer.join(relative)),
        }
    }
}

impl PodProcesses for PodsCgroup {
    fn kill_all(&self) -> Result<usize, String> {
        self.present()?;
        let reach = self.reach();
        let mut signalled = 0;
        for subtree in &reach.subtrees {
            signalled += kill_target(&self.target_at(subtree))
                .map(|report| report.signalled)
                .map_err(|error| error.to_string())?;
        }
        for cgroup in &reach.on_the_way {
            signalled += kill_direct_members(&self.target_at(cgroup).tasks)
                .map_err(|error| error.to_string())?;
        }
        Ok(signalled)
    }

    fn count(&self) -> Result<usize, String> {
        self.present()?;
        let reach = self.reach();
        let mut left = 0;
        for subtree in &reach.subtrees {
            left += count_processes(&self.target_at(subtree)).map_err(|e| e.to_string())?;
        }
        for cgroup in &reach.on_the_way {
            left += count_direct_members(&self.target_at(cgroup).tasks)
                .map_err(|error| error.to_string())?;
        }
        Ok(left)
    }
}

/// Whether a cgroup's name is a pod's: `pod<uid>` (cgroupfs driver) or
/// `kubepods[-<qos>]-pod<uid>.slice` (systemd driver).
fn is_pod_cgroup(name: &str) -> bool {
    name.starts_with("pod") || name.contains("-pod")
}

/// The pod cgroup below `pods` that holds process `pid` (the agent in a DaemonSet), as a
/// path relative to `pods`; `None` when the agent runs outside the pods cgroup.
fn own_pod(pods: &Path, pid: u32) -> Option<PathBuf> {
    let holder = find_process(pods, &pid.to_string())?;
    let relative = holder.strip_prefix(pods).ok()?.to_path_buf();
    // The outermost pod cgroup on the way (the pod, not one of its containers).
    let mut prefix = PathBuf::new();
    for part in relative.components() {
        prefix.push(part);
        if is_pod_cgroup(&part.as_os_str().to_string_lossy()) {
            return Some(prefix);
        }
    }
    // A process of the agent straight in a QoS cgroup: spare just that cgroup.
    Some(relative)
}

/// The cgroup below `dir` whose `cgroup.procs` lists `pid`.
fn find_process(dir: &Path, pid: &str) -> Option<PathBuf> {
    if std::fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|text| {
        // Whole lines only: `77` cut from `779` is another process.
        crate::signals::parse::complete_lines(&text)
            .lines()
            .any(|line| line.trim() == pid)
    }) {
        return Some(dir.to_path_buf());
    }
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .find_map(|entry| find_process(&entry.path(), pid))
}

/// Everything below `pods` but `spared` (relative to it): the whole tree when nothing is
/// spared; else every sibling subtree on the way down to it, and the processes directly
/// in the cgroups on the way.
fn reach(pods: &Path, spared: Option<&Path>) -> Reach {
    let Some(spared) = spared.filter(|s| !s.as_os_str().is_empty()) else {
        return Reach {
            subtrees: vec![PathBuf::new()],
            on_the_way: Vec::new(),
        };
    };
    let mut reach = Reach::default();
    let mut at = PathBuf::new();
    for part in spared.components() {
        reach.on_the_way.push(at.clone());
        if let Ok(entries) = std::fs::read_dir(pods.join(&at)) {
            let mut siblings: Vec<PathBuf> = entries
                .flatten()
                .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
                .map(|entry| at.join(entry.file_name()))
                .filter(|child| child.file_name() != Some(part.as_os_str()))
                .collect();
            siblings.sort();
            reach.subtrees.extend(siblings);
        }
        at.push(part);
    }
    reach
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_own_pod_is_found_by_its_pid_and_spared_and_everything_else_is_reached() {
        let dir = tempfile::tempdir().expect("temp dir");
        let pods = dir.path().join("kubepods.slice");
        let agent = pods.join(
            "kubepods-burstable.slice/kubepods-burstable-poda1.slice/cri-containerd-agent.scope",
        );
        let pause = pods.join(
            "kubepods-burstable.slice/kubepods-burstable-poda1.slice/cri-containerd-pause.scope",
        );
        let web = pods.join("kubepods-burstable.slice/kubepods-burstable-podb2.slice");
        let db = pods.join("kubepods-pod3c.slice");
        let besteffort = pods.join("kubepods-besteffort.slice");
        for cgroup in [&agent, &pause, &web, &db, &besteffort] {
            std::fs::create_dir_all(cgroup).expect("cgroup");
        }
        std::fs::write(agent.join("cgroup.procs"), "4242\n").expect("procs");
        let own = own_pod(&pods, 4242);
        assert_eq!(
            own.as_deref(),
            Some(Path::new(
                "kubepods-burstable.slice/kubepods-burstable-poda1.slice"
            )),
            "the whole pod, its pause container too"
        );
        assert_eq!(
            reach(&pods, own.as_deref()),
            Reach {
                subtrees: vec![
                    PathBuf::from("kubepods-besteffort.slice"),
                    PathBuf::from("kubepods-pod3c.slice"),
                    PathBuf::from("kubepods-burstable.slice/kubepods-burstable-podb2.slice"),
                ],
                on_the_way: vec![PathBuf::new(), PathBuf::from("kubepods-burstable.slice")],
            }
        );
        // An agent outside the pods cgroup (a systemd unit) spares nothing.
        assert_eq!(own_pod(&pods, 777), None);
        assert_eq!(
            reach(&pods, None),
            Reach {
                subtrees: vec![PathBuf::new()],
                on_the_way: Vec::new(),
            }
        );
    }

    #[test]
    fn pod_cgroups_are_named_as_both_drivers_name_them() {
        assert!(is_pod_cgroup("pod3c1e"));
        assert!(is_pod_cgroup("kubepods-burstable-pod3c1e.slice"));
        assert!(is_pod_cgroup("kubepods-pod3c1e.slice"));
        assert!(!is_pod_cgroup("kubepods-burstable.slice"));
        assert!(!is_pod_cgroup("burstable"));
    }
}
