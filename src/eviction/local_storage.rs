//! Local-storage limit evictions: a pod over its own emptyDir, pod or container
//! ephemeral-storage limit is evicted whatever the node's state, every offender in the
//! same cycle, with a 1 s grace period and no DisruptionTarget condition.

use std::collections::BTreeMap;

use super::message::{
    container_ephemeral_storage_message, empty_dir_message, pod_ephemeral_storage_message,
};
use super::{EvictionOrder, EvictionReason, IMMEDIATE_GRACE_PERIOD_SECONDS};
use crate::pods::Pod;

/// The local-storage evictions for this cycle; critical pods and pods without stats
/// are never included.
pub(super) fn local_storage_evictions(
    pods: &[Pod],
    dedicated_image_fs: bool,
) -> Vec<EvictionOrder> {
    pods.iter()
        .filter(|pod| pod.has_stats() && !pod.is_critical())
        .filter_map(|pod| {
            let (reason, message) = empty_dir_violation(pod)
                .or_else(|| pod_limit_violation(pod))
                .or_else(|| container_limit_violation(pod, dedicated_image_fs))?;
            Some(EvictionOrder {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                reason,
                grace_period_seconds: IMMEDIATE_GRACE_PERIOD_SECONDS,
                message,
                annotations: BTreeMap::new(),
                disruption_target: false,
            })
        })
        .collect()
}

fn empty_dir_violation(pod: &Pod) -> Option<(EvictionReason, String)> {
    pod.empty_dirs.iter().find_map(|volume| {
        let limit = volume.size_limit.filter(|limit| *limit > 0)?;
        (volume.used? > limit).then(|| {
            (
                EvictionReason::EmptyDirLimit,
                empty_dir_message(&volume.name, limit),
            )
        })
    })
}

/// The pod's limit is its own when given, else the sum of its containers' limits; a
/// pod with no ephemeral-storage limit anywhere is never checked. Missing usage is 0.
fn pod_limit_violation(pod: &Pod) -> Option<(EvictionReason, String)> {
    let limit = pod.limits.ephemeral_storage.or_else(|| {
        pod.containers
            .iter()
            .filter_map(|c| c.limits.ephemeral_storage)
            .reduce(|a, b| a.saturating_add(b))
    })?;
    (pod.usage.ephemeral_storage.unwrap_or(0) > limit).then(|| {
        (
            EvictionReason::PodEphemeralStorageLimit,
            pod_ephemeral_storage_message(limit),
        )
    })
}

/// A container's use is its logs, plus its writable layer when that shares nodefs.
fn container_limit_violation(
    pod: &Pod,
    dedicated_image_fs: bool,
) -> Option<(EvictionReason, String)> {
    pod.containers.iter().find_map(|container| {
        let limit = container
            .limits
            .ephemeral_storage
            .filter(|limit| *limit != 0)?;
        let mut used = container.usage.logs.unwrap_or(0);
        if !dedicated_image_fs {
            used = used.saturating_add(container.usage.rootfs.unwrap_or(0));
        }
        (used > limit).then(|| {
            (
                EvictionReason::ContainerEphemeralStorageLimit,
                container_ephemeral_storage_message(&container.name, limit),
            )
        })
    })
}
