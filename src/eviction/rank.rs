//! The kubelet's eviction ranking per signal, as a total order.
//!
//! Each signal's comparator chain is packed into one integer sort key where smaller
//! means "evict first", so sorting moves small elements and rarely touches the pods. The kubelet's sort is unstable; ties are broken here by
//! namespace, name and uid so that every run on the same input agrees.

use std::cmp::Ordering;

use crate::pods::Pod;
use crate::signals::{Resource, Signal};

/// The signal's comparator chain packed into one integer, smaller = evict first.
/// Pods with equal keys are ordered by [`identity`].
type RankKey = u128;

/// Order-preserving maps of signed values onto unsigned fields.
fn priority_field(priority: i32) -> u128 {
    u128::from((priority as u32) ^ 0x8000_0000)
}

/// Larger amounts rank first, so they map to smaller fields.
fn larger_first(amount: i64) -> u128 {
    u128::from(u64::MAX - ((amount as u64) ^ (1 << 63)))
}

fn flag(evict_first: bool) -> u128 {
    u128::from(!evict_first)
}

/// `[no stats][exceeds request][priority][usage above request]`, most significant first.
fn request_priority_usage(no_stats: bool, exceeds: bool, priority: i32, above: i64) -> RankKey {
    flag(no_stats) << 98
        | flag(exceeds) << 97
        | priority_field(priority) << 64
        | larger_first(above)
}

fn rank_key(signal: Signal, pod: &Pod) -> RankKey {
    match signal.resource() {
        // exceeds memory request, then priority, then usage above request
        Resource::Memory => match pod.usage.memory {
            None => request_priority_usage(true, true, pod.priority, 0),
            Some(usage) => {
                let request = pod.requests.memory.unwrap_or(0);
                request_priority_usage(
                    false,
                    usage > request,
                    pod.priority,
                    usage.saturating_sub(request),
                )
            }
        },
        // priority first, then (pods without stats first) process count; no request step
        Resource::Pids => {
            let (no_stats, count) = match pod.usage.pids {
                None => (true, 0),
                Some(count) => (false, count),
            };
            priority_field(pod.priority) << 65 | flag(no_stats) << 64 | larger_first(count)
        }
        Resource::EphemeralStorage => disk_key(
            pod.usage.ephemeral_storage,
            pod.requests.ephemeral_storage.unwrap_or(0),
            pod,
        ),
        // Inodes have no request, so every pod using any "exceeds" it; the kubelet
        // still subtracts the ephemeral-storage request from the inode count.
        Resource::Inodes => disk_key(pod.usage.inodes, 0, pod),
    }
}

/// exceeds request, then priority, then usage minus the ephemeral-storage request.
fn disk_key(usage: Option<i64>, request: i64, pod: &Pod) -> RankKey {
    match usage {
        None => request_priority_usage(true, true, pod.priority, 0),
        Some(usage) => {
            let storage_request = pod.requests.ephemeral_storage.unwrap_or(0);
            request_priority_usage(
                false,
                usage > request,
                pod.priority,
                usage.saturating_sub(storage_request),
            )
        }
    }
}

/// The deterministic tie-break, standing in for the kubelet's unstable sort.
fn identity(pod: &Pod) -> (&str, &str, Option<&str>) {
    (&pod.namespace, &pod.name, pod.uid.as_deref())
}

fn compare(a: (RankKey, &Pod), b: (RankKey, &Pod)) -> Ordering {
    a.0.cmp(&b.0)
        .then_with(|| identity(a.1).cmp(&identity(b.1)))
}

/// The eviction order for `signal`: the first pod is evicted first. Critical pods are
/// ranked like any other; the eviction step skips them.
pub fn rank(signal: Signal, pods: &[Pod]) -> Vec<&Pod> {
    let mut keyed: Vec<(RankKey, &Pod)> = pods
        .iter()
        .map(|pod| (rank_key(signal, pod), pod))
        .collect();
    keyed.sort_unstable_by(|a, b| compare(*a, *b));
    keyed.into_iter().map(|(_, pod)| pod).collect()
}

/// The comparator behind [`rank`]: `Less` means `a` is evicted before `b`.
pub fn rank_cmp(signal: Signal) -> impl Fn(&Pod, &Pod) -> Ordering {
    move |a, b| compare((rank_key(signal, a), a), (rank_key(signal, b), b))
}

/// The first non-critical pod in the order of `signal`, found in one pass.
pub(super) fn first_evictable(signal: Signal, pods: &[Pod]) -> Option<&Pod> {
    pods.iter()
        .filter(|pod| !pod.is_critical())
        .map(|pod| (rank_key(signal, pod), pod))
        .min_by(|a, b| compare(*a, *b))
        .map(|(_, pod)| pod)
}
