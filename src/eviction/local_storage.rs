//! Local-storage limit evictions: a pod over its own emptyDir, pod or container
//! ephemeral-storage limit is evicted whatever the node's state, every offender in the
//! same cycle, with a 1 s grace period and no DisruptionTarget condition.

use std::collections::BTreeMap;

use super::message::{
    container_ephemeral_storage_message, empty_dir_message, pod_ephemeral_storage_message,
};
use super::{EvictionOrder, EvictionReason, IMMEDIATE_GRACE_PERIOD_SECONDS};
use crate::pods::{ContainerKind, Pod, aggregate_containers};
use crate::quantity::Quantity;

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
        let limit = volume.size_limit.filter(|limit| limit.is_positive())?;
        (Quantity::from_value(volume.used?) > limit).then(|| {
            (
                EvictionReason::EmptyDirLimit,
                empty_dir_message(&volume.name, limit),
            )
        })
    })
}

/// The pod's limit (`podEphemeralStorageLimitEviction`, from `PodLimits`) is its own
/// when given, else its containers' limits added up as `PodLimits` adds them; a pod
/// with no ephemeral-storage limit anywhere is never checked. Missing usage is 0.
fn pod_limit_violation(pod: &Pod) -> Option<(EvictionReason, String)> {
    let limit = pod
        .limits
        .ephemeral_storage_quantity()
        .or_else(|| containers_limit(pod))?;
    (Quantity::from_value(pod.usage.ephemeral_storage.unwrap_or(0)) > limit).then(|| {
        (
            EvictionReason::PodEphemeralStorageLimit,
            pod_ephemeral_storage_message(limit),
        )
    })
}

/// `PodLimits` over the listed containers.
fn containers_limit(pod: &Pod) -> Option<Quantity> {
    aggregate_containers(pod.containers.iter().map(|container| {
        (
            container.kind,
            container.limits.ephemeral_storage_quantity(),
        )
    }))
}

/// A regular container's use is its logs, plus its writable layer when that shares
/// nodefs. Init containers and sidecars are not checked one by one
/// (`containerEphemeralStorageLimitEviction` reads `pod.Spec.Containers` only); their
/// limits still count in the pod's total.
fn container_limit_violation(
    pod: &Pod,
    dedicated_image_fs: bool,
) -> Option<(EvictionReason, String)> {
    pod.containers
        .iter()
        .filter(|container| container.kind == ContainerKind::Regular)
        .find_map(|container| {
            let limit = container
                .limits
                .ephemeral_storage_quantity()
                .filter(|limit| *limit != Quantity::ZERO)?;
            let mut used = container.usage.logs.unwrap_or(0);
            if !dedicated_image_fs {
                used = used.saturating_add(container.usage.rootfs.unwrap_or(0));
            }
            (Quantity::from_value(used) > limit).then(|| {
                (
                    EvictionReason::ContainerEphemeralStorageLimit,
                    container_ephemeral_storage_message(&container.name, limit),
                )
            })
        })
}
