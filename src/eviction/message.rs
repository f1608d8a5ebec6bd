//! The kubelet's eviction messages and event annotations, word for word.

use std::collections::BTreeMap;

use super::{
    ANNOTATION_OFFENDING_CONTAINERS, ANNOTATION_OFFENDING_CONTAINERS_USAGE,
    ANNOTATION_STARVED_RESOURCE,
};
use crate::config::Threshold;
use crate::pods::{ContainerStats, Pod};
use crate::quantity::{Quantity, QuantityFormat};
use crate::signals::{Observations, Resource};

/// A measured byte count as the kubelet prints it (`NewQuantity(n, BinarySI)`).
fn quantity(value: i64) -> String {
    Quantity::from_value(value).to_string()
}

/// What is left of `resource`, as the kubelet's observations print it: bytes in
/// `BinarySI`, inode and PID counts in `DecimalSI` (`makeSignalObservations`).
fn available(resource: Resource, value: i64) -> String {
    let format = match resource {
        Resource::Memory | Resource::EphemeralStorage => QuantityFormat::BinarySi,
        Resource::Inodes | Resource::Pids => QuantityFormat::DecimalSi,
    };
    Quantity::from_value_in(value, format).to_string()
}

/// The message and annotations for a threshold eviction (`evictionMessage`).
/// `thresholds` are the thresholds acted on this cycle; the first one starving the same
/// resource, with an observation, supplies the "Threshold quantity" sentence.
pub(super) fn threshold_eviction_message(
    resource: Resource,
    pod: &Pod,
    thresholds: &[Threshold],
    observations: &Observations,
) -> (String, BTreeMap<String, String>) {
    let mut message = format!("The node was low on resource: {resource}. ");
    let threshold_met = thresholds
        .iter()
        .filter(|t| t.signal.resource() == resource)
        .find_map(|t| observations.get(&t.signal).map(|observed| (t, observed)));
    if let Some((threshold, observed)) = threshold_met {
        message += &format!(
            "Threshold quantity: {}, available: {}. ",
            threshold.value.resolve(observed.capacity),
            available(resource, observed.available),
        );
    }
    let mut annotations = BTreeMap::new();
    if !pod.has_stats() {
        return (message, annotations);
    }
    let mut offenders = Vec::new();
    let mut offender_usage = Vec::new();
    for container in &pod.containers {
        let Some(usage) = container_usage(container, resource) else {
            continue;
        };
        let request = container_request(container, resource);
        if Quantity::from_value(usage) > request {
            message += &format!(
                "Container {} was using {}, request is {request}, has larger consumption of {resource}. ",
                container.name,
                quantity(usage),
            );
            offenders.push(container.name.as_str());
            offender_usage.push(quantity(usage));
        }
    }
    annotations.insert(
        ANNOTATION_OFFENDING_CONTAINERS.to_string(),
        offenders.join(","),
    );
    annotations.insert(
        ANNOTATION_OFFENDING_CONTAINERS_USAGE.to_string(),
        offender_usage.join(","),
    );
    annotations.insert(
        ANNOTATION_STARVED_RESOURCE.to_string(),
        resource.to_string(),
    );
    (message, annotations)
}

/// Working set for memory; writable layer plus logs for storage, only when both are
/// measured. Other resources have no per-container usage in the kubelet's message.
fn container_usage(container: &ContainerStats, resource: Resource) -> Option<i64> {
    match resource {
        Resource::Memory => container.usage.memory,
        Resource::EphemeralStorage => Some(container.usage.rootfs? + container.usage.logs?),
        Resource::Inodes | Resource::Pids => None,
    }
}

/// The container's own request as its spec wrote it; none is 0.
fn container_request(container: &ContainerStats, resource: Resource) -> Quantity {
    match resource {
        Resource::Memory => container.requests.memory_quantity(),
        Resource::EphemeralStorage => container.requests.ephemeral_storage_quantity(),
        Resource::Inodes | Resource::Pids => None,
    }
    .unwrap_or(Quantity::ZERO)
}

pub(super) fn empty_dir_message(volume: &str, size_limit: Quantity) -> String {
    format!(
        "Usage of EmptyDir volume {volume:?} exceeds the limit {:?}. ",
        size_limit.to_string()
    )
}

pub(super) fn pod_ephemeral_storage_message(limit: Quantity) -> String {
    format!("Pod ephemeral local storage usage exceeds the total limit of containers {limit}. ")
}

pub(super) fn container_ephemeral_storage_message(container: &str, limit: Quantity) -> String {
    format!(
        "Container {container} exceeded its local ephemeral storage limit {:?}. ",
        limit.to_string()
    )
}
