//! The kubelet's eviction ranking per signal, as a total order.
//!
//! Each signal's comparator chain is packed into one integer sort key where smaller
//! means "evict first", so sorting moves small elements and rarely touches the pods. The kubelet's sort is unstable; ties are broken here by
//! namespace, name and uid so that every run on the same input agrees.
//!
//! As in the kubelet, only a pod with no stats at all ranks first (every comparator
//! of the kubelet's chains checks that first); a pod with stats that lack the figure
//! being ranked counts it as 0 (`memoryUsage`, `diskUsage`, `inodeUsage` and
//! `process` all return zero for a nil figure).

use std::cmp::Ordering;

use crate::config::FilesystemLayout;
use crate::pods::{DiskAmount, Pod, StoragePart};
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

fn rank_key(signal: Signal, layout: FilesystemLayout, pod: &Pod) -> RankKey {
    if !pod.has_stats() {
        // Every chain starts with the stats check; a pod without stats has no figures,
        // so among such pods only priority orders them (the pid chain puts priority
        // before it, so there a pod without stats goes first within its priority).
        return match signal.resource() {
            Resource::Pids => priority_field(pod.priority) << 65 | larger_first(0),
            _ => request_priority_usage(true, true, pod.priority, 0),
        };
    }
    match signal.resource() {
        // exceeds memory request, then priority, then usage above request
        Resource::Memory => {
            let usage = pod.usage.memory.unwrap_or(0);
            let request = pod.requests.memory.unwrap_or(0);
            request_priority_usage(
                false,
                usage > request,
                pod.priority,
                usage.saturating_sub(request),
            )
        }
        // priority first, then process count; no request step
        Resource::Pids => {
            priority_field(pod.priority) << 65
                | flag(false) << 64
                | larger_first(pod.usage.pids.unwrap_or(0))
        }
        Resource::EphemeralStorage => disk_key(
            disk_usage(pod, signal, layout, |amount| amount.bytes),
            pod.requests.ephemeral_storage.unwrap_or(0),
            pod,
        ),
        // Inodes have no request, so every pod using any "exceeds" it; the kubelet
        // still subtracts the ephemeral-storage request from the inode count.
        Resource::Inodes => disk_key(
            disk_usage(pod, signal, layout, |amount| amount.inodes),
            0,
            pod,
        ),
    }
}

/// exceeds request, then priority, then usage minus the ephemeral-storage request.
fn disk_key(usage: i64, request: i64, pod: &Pod) -> RankKey {
    let storage_request = pod.requests.ephemeral_storage.unwrap_or(0);
    request_priority_usage(
        false,
        usage > request,
        pod.priority,
        usage.saturating_sub(storage_request),
    )
}

/// The parts of a pod's local storage a disk signal counts, per filesystem layout
/// (the kubelet's `buildSignalToRankFunc`):
///
/// | layout | `nodefs.*` | `imagefs.*` | `containerfs.*` |
/// |---|---|---|---|
/// | one filesystem | all | all | all |
/// | imagefs holds the writable layers | logs, volumes | writable layers | = imagefs |
/// | split: images on imagefs, layers on nodefs | all | nothing | = nodefs |
///
/// The kubelet also names image bytes (`fsStatsImages`), but they are never counted
/// per pod, so `imagefs.*` on a split layout orders pods by priority and
/// ephemeral-storage request alone.
pub fn measured_storage(signal: Signal, layout: FilesystemLayout) -> &'static [StoragePart] {
    use FilesystemLayout::{ImageFs, SingleDisk, SplitImageFs};
    use Signal::*;
    const ALL: &[StoragePart] = &[
        StoragePart::WritableLayers,
        StoragePart::Logs,
        StoragePart::LocalVolumes,
    ];
    const NODE_ONLY: &[StoragePart] = &[StoragePart::Logs, StoragePart::LocalVolumes];
    const LAYERS: &[StoragePart] = &[StoragePart::WritableLayers];
    match (signal, layout) {
        (MemoryAvailable | AllocatableMemoryAvailable | PidAvailable, _) => &[],
        (_, SingleDisk) => ALL,
        (NodeFsAvailable | NodeFsInodesFree, ImageFs) => NODE_ONLY,
        (
            ImageFsAvailable | ImageFsInodesFree | ContainerFsAvailable | ContainerFsInodesFree,
            ImageFs,
        ) => LAYERS,
        (ImageFsAvailable | ImageFsInodesFree, SplitImageFs) => &[],
        (
            NodeFsAvailable | NodeFsInodesFree | ContainerFsAvailable | ContainerFsInodesFree,
            SplitImageFs,
        ) => ALL,
    }
}

/// The pod's usage of the filesystem behind `signal`. A pod whose storage was measured
/// only as a total (an older trace) is ranked by that total wherever the signal counts
/// any part: exact on one filesystem, an approximation otherwise.
fn disk_usage(
    pod: &Pod,
    signal: Signal,
    layout: FilesystemLayout,
    figure: fn(DiskAmount) -> i64,
) -> i64 {
    let parts = measured_storage(signal, layout);
    if parts.is_empty() {
        return 0;
    }
    let storage = &pod.usage.storage;
    if storage.is_measured() {
        return parts
            .iter()
            .filter_map(|part| storage.part(*part))
            .map(figure)
            .fold(0, i64::saturating_add);
    }
    let total = DiskAmount {
        bytes: pod.usage.ephemeral_storage.unwrap_or(0),
        inodes: pod.usage.inodes.unwrap_or(0),
    };
    figure(total)
}

/// The deterministic tie-break, standing in for the kubelet's unstable sort.
fn identity(pod: &Pod) -> (&str, &str, Option<&str>) {
    (&pod.namespace, &pod.name, pod.uid.as_deref())
}

fn compare(a: (RankKey, &Pod), b: (RankKey, &Pod)) -> Ordering {
    a.0.cmp(&b.0)
        .then_with(|| identity(a.1).cmp(&identity(b.1)))
}

/// The eviction order for `signal` on a node with filesystem `layout`: the first pod is
/// evicted first. Critical pods are ranked like any other; the eviction step skips them.
pub fn rank(signal: Signal, layout: FilesystemLayout, pods: &[Pod]) -> Vec<&Pod> {
    let mut keyed: Vec<(RankKey, &Pod)> = pods
        .iter()
        .map(|pod| (rank_key(signal, layout, pod), pod))
        .collect();
    keyed.sort_unstable_by(|a, b| compare(*a, *b));
    keyed.into_iter().map(|(_, pod)| pod).collect()
}

/// The comparator behind [`rank`]: `Less` means `a` is evicted before `b`.
pub fn rank_cmp(signal: Signal, layout: FilesystemLayout) -> impl Fn(&Pod, &Pod) -> Ordering {
    move |a, b| {
        compare(
            (rank_key(signal, layout, a), a),
            (rank_key(signal, layout, b), b),
        )
    }
}

/// The first non-critical pod in the order of `signal`, found in one pass.
pub(super) fn first_evictable(
    signal: Signal,
    layout: FilesystemLayout,
    pods: &[Pod],
) -> Option<&Pod> {
    pods.iter()
        .filter(|pod| !pod.is_critical())
        .map(|pod| (rank_key(signal, layout, pod), pod))
        .min_by(|a, b| compare(*a, *b))
        .map(|(_, pod)| pod)
}
