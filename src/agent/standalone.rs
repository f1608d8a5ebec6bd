//! Standalone mode's pods: the child cgroups of a configured workload parent, with
//! priority and requests from the configuration and usage from their own cgroup files.

use std::path::PathBuf;

use crate::config::WorkloadsConfig;
use crate::signals::{CgroupReader, ProcessCounts, SignalError};

use crate::pods::{Pod, PodUsage};

/// The workloads under the configured parent, each with its process count when
/// `process_counts` asks for it. A workload whose files cannot be read is still listed,
/// with its cgroup and no figures: it has stats, each figure counting as 0, as the
/// kubelet ranks a pod whose summary entry lacks its memory figures. The read error is
/// returned for logging.
pub fn workload_pods(
    reader: &CgroupReader,
    workloads: &WorkloadsConfig,
    process_counts: ProcessCounts,
) -> Result<(Vec<Pod>, Vec<SignalError>), SignalError> {
    let children = reader.list_child_cgroups(&workloads.parent_cgroup)?;
    Ok(pods_of(reader, workloads, children, process_counts))
}

/// The pods of `children`, the workload cgroups listed a moment before. A cgroup that is
/// gone by the time it is read, or going, belongs to a workload that has ended and is
/// being cleaned up: it is left out, as the kubelet's active pods leave out a pod that
/// has terminated. Listed, it would be ranked as a workload using nothing (and chosen
/// where that ranks first: the lowest priority, no workload over its request), its error
/// logged, and the record would show a workload that no longer ran.
fn pods_of(
    reader: &CgroupReader,
    workloads: &WorkloadsConfig,
    children: Vec<PathBuf>,
    process_counts: ProcessCounts,
) -> (Vec<Pod>, Vec<SignalError>) {
    let mut errors = Vec::new();
    let pods = children
        .into_iter()
        .filter_map(|cgroup| {
            let name = cgroup
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let settings = workloads.pods.iter().find(|p| p.matches(&name));
            let read = reader.read_pod_usage(&cgroup, process_counts);
            // Memory figures kept from an earlier listing (`podStatsMaxAge`) are not
            // checked so: the listing a moment before found the cgroup, and a stat per pod
            // more than doubled the cycle from its start to the decision (0.93 ms against
            // 0.44 at 110 pods, docs/performance.md); a workload gone since is ranked on
            // its last figures, as the kubelet ranks a pod on cAdvisor's until it knows
            // the pod has ended.
            let some_read_failed = matches!(read, Ok((_, Some(_))) | Err(_));
            // `rmdir` clears each controller's files, then the cgroup's own, then the
            // directory (the kernel's `cgroup_destroy_locked`: `kill_css` for each
            // controller, `css_clear_dir` of the cgroup's own, `kernfs_remove`); a new one
            // is shown only with its files (`cgroup_mkdir` activates it last). A directory without
            // `cgroup.procs`, which every live cgroup has, is being removed. One caught
            // with its memory files gone and `cgroup.procs` not yet stays listed with no
            // figure, as using nothing, as does a live cgroup with no memory files (a v2
            // child whose parent does not enable the controller): the two look alike.
            // Ended only if surely gone: a look that fails (no permission) is not proof.
            let ended = || {
                matches!(
                    reader
                        .paths()
                        .memory_dir(&cgroup)
                        .join("cgroup.procs")
                        .try_exists(),
                    Ok(false)
                )
            };
            if some_read_failed && ended() {
                tracing::debug!(cgroup = %cgroup.display(), "workload ended while it was read");
                return None;
            }
            let usage = match read {
                Ok((usage, count_error)) => {
                    errors.extend(count_error);
                    PodUsage {
                        memory: Some(saturating_i64(usage.working_set_bytes)),
                        pids: usage.process_count.map(saturating_i64),
                        ..PodUsage::default()
                    }
                }
                Err(error) => {
                    errors.push(error);
                    PodUsage::default()
                }
            };
            Some(Pod {
                namespace: workloads.namespace.clone(),
                name,
                priority: settings.map_or(0, |s| s.priority),
                termination_grace_period_seconds: settings
                    .and_then(|s| s.termination_grace_period_seconds),
                critical: settings.is_some_and(|s| s.critical),
                requests: settings.map(|s| s.requests).unwrap_or_default(),
                limits: settings.map(|s| s.limits).unwrap_or_default(),
                usage,
                cgroup: Some(cgroup),
                ..Pod::default()
            })
        })
        .collect();
    (pods, errors)
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::CgroupLayout;

    fn write(root: &std::path::Path, cgroup: &str, file: &str, text: &str) {
        let dir = root.join(cgroup);
        std::fs::create_dir_all(&dir).expect("a cgroup directory");
        std::fs::write(dir.join(file), text).expect("a cgroup file");
    }

    fn workloads() -> WorkloadsConfig {
        WorkloadsConfig {
            parent_cgroup: PathBuf::from("pods"),
            namespace: "ns".to_string(),
            pods: Vec::new(),
        }
    }

    /// issue 16 part 3: a pod's cgroup removed between the listing and the read. The
    /// workload has ended and is left out, not listed as a workload using nothing.
    #[test]
    fn a_cgroup_gone_between_listing_and_reading_is_a_workload_that_ended() {
        let root = tempfile::tempdir().expect("a fake cgroup tree");
        // Being removed: the kernel has taken its files, not yet its directory.
        std::fs::create_dir_all(root.path().join("pods/going")).expect("a cgroup");
        // Live, without the memory controller (a v2 parent that does not enable it).
        write(root.path(), "pods/no-memory-files", "cgroup.procs", "");
        write(root.path(), "pods/unreadable", "cgroup.procs", "");
        write(
            root.path(),
            "pods/unreadable",
            "memory.current",
            "garbage\n",
        );
        write(root.path(), "pods/running", "cgroup.procs", "");
        write(root.path(), "pods/running", "memory.current", "1048576\n");
        write(
            root.path(),
            "pods/running",
            "memory.stat",
            "inactive_file 0\n",
        );
        write(root.path(), "pods/running", "pids.current", "3\n");
        let reader = CgroupReader::new(root.path(), CgroupLayout::Unified);
        let listed = reader
            .list_child_cgroups(std::path::Path::new("pods"))
            .expect("the listing");
        assert_eq!(listed.len(), 4);
        // Gone after the listing: the race of a workload that exits.
        let mut children = listed;
        children.push(PathBuf::from("pods/ended"));
        let (pods, errors) = pods_of(&reader, &workloads(), children, ProcessCounts::Read);
        let names: Vec<&str> = pods.iter().map(|pod| pod.name.as_str()).collect();
        assert_eq!(names, ["no-memory-files", "running", "unreadable"]);
        assert_eq!(pods[1].usage.memory, Some(1_048_576));
        // A live cgroup whose files cannot be read stays, with no figures; it has stats
        // (its cgroup was found), so it ranks as using nothing, not first. Each error is
        // reported.
        for unread in [&pods[0], &pods[2]] {
            assert_eq!(unread.usage.memory, None);
            assert!(unread.has_stats());
        }
        assert_eq!(errors.len(), 2);
    }

    /// Without a `pid.available` threshold no decision reads a pod's process count, and
    /// the cycle does not count: `pids.current` is not read at all (garbage in it is not
    /// reported), and the pod keeps its memory figure. Asked for, it is read: garbage in it
    /// is reported and leaves the pod without a count, and the pod keeps its memory
    /// figure all the same, so a pid threshold cannot change the memory ranking.
    #[test]
    fn process_counts_are_read_only_when_asked_for() {
        let root = tempfile::tempdir().expect("a fake cgroup tree");
        write(root.path(), "pods/web", "memory.current", "1048576\n");
        write(root.path(), "pods/web", "memory.stat", "inactive_file 0\n");
        write(root.path(), "pods/web", "pids.current", "many\n");
        write(root.path(), "pods/web", "cgroup.procs", "");
        let reader = CgroupReader::new(root.path(), CgroupLayout::Unified);
        let read = |counts| workload_pods(&reader, &workloads(), counts).expect("the listing");

        let (pods, errors) = read(ProcessCounts::NotNeeded);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(pods[0].usage.memory, Some(1_048_576));
        assert_eq!(pods[0].usage.pids, None);

        let (pods, errors) = read(ProcessCounts::Read);
        assert_eq!(errors.len(), 1, "the garbage count is read and reported");
        assert!(
            errors[0].to_string().contains("pids.current"),
            "{}",
            errors[0]
        );
        assert_eq!(pods[0].usage.memory, Some(1_048_576));
        assert_eq!(pods[0].usage.pids, None);

        write(root.path(), "pods/web", "pids.current", "3\n");
        let (pods, errors) = read(ProcessCounts::Read);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(pods[0].usage.memory, Some(1_048_576));
        assert_eq!(pods[0].usage.pids, Some(3));
    }
}
