//! The kubelet's eviction ranking per signal, as a total order.
//!
//! Each signal's comparator chain is flattened into a sort key where smaller means
//! "evict first". The kubelet's sort is unstable; ties are broken here by
//! namespace, name and uid so that every run on the same input agrees.

use std::cmp::Ordering;

use crate::pods::Pod;
use crate::signals::{Resource, Signal};

/// A pod's position in the eviction order for one signal.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct RankKey<'a> {
    criteria: [i128; 4],
    namespace: &'a str,
    name: &'a str,
    uid: Option<&'a str>,
}

const EVICT_FIRST: i128 = 0;
const EVICT_LATER: i128 = 1;

fn first_if(condition: bool) -> i128 {
    if condition { EVICT_FIRST } else { EVICT_LATER }
}

fn rank_key(signal: Signal, pod: &Pod) -> RankKey<'_> {
    let priority = i128::from(pod.priority);
    let criteria = match signal.resource() {
        // exceeds memory request, then priority, then usage above request (larger first)
        Resource::Memory => match pod.usage.memory {
            None => [EVICT_FIRST, EVICT_FIRST, priority, 0],
            Some(usage) => {
                let request = pod.requests.memory.unwrap_or(0);
                [
                    EVICT_LATER,
                    first_if(usage > request),
                    priority,
                    -(i128::from(usage) - i128::from(request)),
                ]
            }
        },
        // priority first, then process count (larger first); no request step
        Resource::Pids => match pod.usage.pids {
            None => [priority, EVICT_FIRST, 0, 0],
            Some(count) => [priority, EVICT_LATER, -i128::from(count), 0],
        },
        Resource::EphemeralStorage => disk_criteria(
            pod.usage.ephemeral_storage,
            pod.requests.ephemeral_storage.unwrap_or(0),
            pod,
        ),
        // Inodes have no request, so every pod using any "exceeds" it; the kubelet
        // still subtracts the ephemeral-storage request from the inode count.
        Resource::Inodes => disk_criteria(pod.usage.inodes, 0, pod),
    };
    RankKey {
        criteria,
        namespace: &pod.namespace,
        name: &pod.name,
        uid: pod.uid.as_deref(),
    }
}

/// exceeds request, then priority, then usage minus the ephemeral-storage request.
fn disk_criteria(usage: Option<i64>, request: i64, pod: &Pod) -> [i128; 4] {
    let priority = i128::from(pod.priority);
    match usage {
        None => [EVICT_FIRST, EVICT_FIRST, priority, 0],
        Some(usage) => {
            let storage_request = pod.requests.ephemeral_storage.unwrap_or(0);
            [
                EVICT_LATER,
                first_if(usage > request),
                priority,
                -(i128::from(usage) - i128::from(storage_request)),
            ]
        }
    }
}

/// The eviction order for `signal`: the first pod is evicted first. Critical pods are
/// ranked like any other; the eviction step skips them.
pub fn rank(signal: Signal, pods: &[Pod]) -> Vec<&Pod> {
    let mut keyed: Vec<(RankKey<'_>, &Pod)> = pods
        .iter()
        .map(|pod| (rank_key(signal, pod), pod))
        .collect();
    keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    keyed.into_iter().map(|(_, pod)| pod).collect()
}

/// The comparator behind [`rank`]: `Less` means `a` is evicted before `b`.
pub fn rank_cmp(signal: Signal) -> impl Fn(&Pod, &Pod) -> Ordering {
    move |a, b| rank_key(signal, a).cmp(&rank_key(signal, b))
}

/// The first non-critical pod in the order of `signal`, found in one pass.
pub(super) fn first_evictable(signal: Signal, pods: &[Pod]) -> Option<&Pod> {
    pods.iter()
        .filter(|pod| !pod.is_critical())
        .min_by_key(|pod| rank_key(signal, pod))
}
