//! Standalone mode's pods: the child cgroups of a configured workload parent, with
//! priority and requests from the configuration and usage from their own cgroup files.

use crate::config::WorkloadsConfig;
use crate::signals::{CgroupReader, SignalError};

use crate::pods::{Pod, PodUsage};

/// The workloads under the configured parent. A workload whose files cannot be read is
/// still listed, without stats, exactly as the kubelet treats a pod without stats; the
/// read error is returned for logging and metrics.
pub fn workload_pods(
    reader: &CgroupReader,
    workloads: &WorkloadsConfig,
) -> Result<(Vec<Pod>, Vec<SignalError>), SignalError> {
    let mut errors = Vec::new();
    let children = reader.list_child_cgroups(&workloads.parent_cgroup)?;
    let pods = children
        .into_iter()
        .map(|cgroup| {
            let name = cgroup
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let settings = workloads.pods.iter().find(|p| p.matches(&name));
            let usage = match reader.read_pod_usage(&cgroup) {
                Ok(usage) => PodUsage {
                    memory: Some(saturating_i64(usage.working_set_bytes)),
                    pids: Some(saturating_i64(usage.process_count)),
                    ..PodUsage::default()
                },
                Err(error) => {
                    errors.push(error);
                    PodUsage::default()
                }
            };
            Pod {
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
            }
        })
        .collect();
    Ok((pods, errors))
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
