//! The agent's view of a pod: identity, priority, requests, limits and measured usage.
//! It is the same shape whether pods come from the API server, from workload cgroups
//! in standalone mode, or from a recorded trace.

use crate::quantity::{Quantity, QuantityFormat};

/// Amounts of the resources eviction reasons about, in bytes (memory, storage).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResourceAmounts {
    pub memory: Option<i64>,
    pub ephemeral_storage: Option<i64>,
    /// How the pod spec wrote each amount, so that messages print a request or limit as
    /// the kubelet prints the API object's own quantity (`1G` stays `1G`).
    pub formats: AmountFormats,
}

/// The format of each of [`ResourceAmounts`]' figures; binary (a plain byte count or a
/// `Ki`..`Ei` multiple) unless the pod spec said otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AmountFormats {
    pub memory: QuantityFormat,
    pub ephemeral_storage: QuantityFormat,
}

impl ResourceAmounts {
    /// The memory figure as the quantity the kubelet would print.
    pub fn memory_quantity(&self) -> Option<Quantity> {
        self.memory
            .map(|value| Quantity::from_value_in(value, self.formats.memory))
    }

    /// The ephemeral-storage figure as the quantity the kubelet would print.
    pub fn ephemeral_storage_quantity(&self) -> Option<Quantity> {
        self.ephemeral_storage
            .map(|value| Quantity::from_value_in(value, self.formats.ephemeral_storage))
    }
}

/// Measured usage; `None` means "no stats" for that resource. A pod that has stats but
/// lacks one figure ranks as if that figure were 0, as in the kubelet; only a pod with
/// no stats at all ([`Pod::has_stats`]) ranks first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodUsage {
    /// Working set in bytes.
    pub memory: Option<i64>,
    /// The pod's total local storage (the kubelet's `PodStats.EphemeralStorage`): what
    /// its ephemeral-storage limit is checked against.
    pub ephemeral_storage: Option<i64>,
    /// Inodes used by the same storage.
    pub inodes: Option<i64>,
    pub pids: Option<i64>,
    /// The same storage by where it lives, which decides what each disk signal ranks.
    pub storage: StorageUsage,
}

/// Bytes and inodes on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskAmount {
    pub bytes: i64,
    pub inodes: i64,
}

impl DiskAmount {
    pub fn saturating_add(self, other: DiskAmount) -> DiskAmount {
        DiskAmount {
            bytes: self.bytes.saturating_add(other.bytes),
            inodes: self.inodes.saturating_add(other.inodes),
        }
    }
}

/// A pod's local storage split the way the kubelet's stats split it: its containers'
/// writable layers (`rootfs`), its containers' logs, and its local volumes (emptyDirs
/// not backed by memory, configMaps, gitRepos). With a dedicated image filesystem each
/// disk signal counts only the parts on its own filesystem. `None` means "not measured".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StorageUsage {
    pub writable_layers: Option<DiskAmount>,
    pub logs: Option<DiskAmount>,
    pub local_volumes: Option<DiskAmount>,
}

/// One part of [`StorageUsage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoragePart {
    WritableLayers,
    Logs,
    LocalVolumes,
}

impl StorageUsage {
    /// Whether any part was measured.
    pub fn is_measured(&self) -> bool {
        self.writable_layers.is_some() || self.logs.is_some() || self.local_volumes.is_some()
    }

    pub fn part(&self, part: StoragePart) -> Option<DiskAmount> {
        match part {
            StoragePart::WritableLayers => self.writable_layers,
            StoragePart::Logs => self.logs,
            StoragePart::LocalVolumes => self.local_volumes,
        }
    }

    /// The measured parts together; `None` when none was measured.
    pub fn total(&self) -> Option<DiskAmount> {
        [self.writable_layers, self.logs, self.local_volumes]
            .into_iter()
            .flatten()
            .reduce(DiskAmount::saturating_add)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    pub priority: i32,
    pub termination_grace_period_seconds: Option<i64>,
    /// Static or mirror pod. Priority >= 2000000000 is critical regardless.
    pub critical: bool,
    /// Pod-effective requests (init and sidecar containers already folded in).
    pub requests: ResourceAmounts,
    pub limits: ResourceAmounts,
    pub usage: PodUsage,
    /// Per-container requests, limits and usage, when known. They refine eviction
    /// messages and enforce per-container ephemeral-storage limits; empty is fine.
    pub containers: Vec<ContainerStats>,
    /// emptyDir volumes with a size limit or measured usage, when known.
    pub empty_dirs: Vec<EmptyDirStats>,
    /// The pod's cgroup, relative to the cgroup hierarchy root (for v1, the same path in
    /// every controller hierarchy), when known. The standalone evictor kills it.
    pub cgroup: Option<std::path::PathBuf>,
    /// Its deletion was requested (the API object has a `deletionTimestamp`), but it may
    /// still run here. The kubelet keeps such a pod among its active pods, so among the
    /// eviction candidates, until it is known to have stopped (`filterOutInactivePods`).
    pub terminating: bool,
}

/// Measured usage of one container; `None` means "no stats".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ContainerUsage {
    /// Working set in bytes.
    pub memory: Option<i64>,
    /// Writable-layer bytes.
    pub rootfs: Option<i64>,
    /// Log bytes.
    pub logs: Option<i64>,
}

/// Where a container sits in the pod spec, which decides which of the kubelet's rules
/// apply to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContainerKind {
    /// In `spec.containers`: its own ephemeral-storage limit is enforced.
    #[default]
    Regular,
    /// In `spec.initContainers`, run to completion before the next one starts.
    Init,
    /// In `spec.initContainers` with `restartPolicy: Always`: runs beside the regular
    /// containers.
    Sidecar,
}

/// One resource added up over a pod's containers as the kubelet's resource helpers add
/// it (`AggregateContainerRequests`, `AggregateContainerLimits`), from each container's
/// kind and amount in spec order: the regular containers sum, then, in order, each
/// sidecar adds to that sum; an init container runs beside the sidecars started before
/// it, and the peak of those moments wins over the sum if larger. A container without
/// the resource adds nothing. Sums keep the first figure's format (`Quantity.Add`); a
/// larger peak replaces the sum, format and all (`maxResourceList`).
/// The containers are walked twice (regular ones first, for the sum's format), hence a
/// cloneable iterator rather than a collected list: this runs for every pod every cycle.
pub fn aggregate_containers(
    containers: impl IntoIterator<Item = (ContainerKind, Option<Quantity>), IntoIter: Clone>,
) -> Option<Quantity> {
    let containers = containers.into_iter();
    let add = |sum: Option<Quantity>, more: Quantity| Some(sum.map_or(more, |s| s.plus(more)));
    let max = |peak: Option<Quantity>, other: Quantity| match peak {
        Some(peak) if peak >= other => Some(peak),
        _ => Some(other),
    };
    let mut total = containers
        .clone()
        .filter(|(kind, _)| *kind == ContainerKind::Regular)
        .filter_map(|(_, amount)| amount)
        .fold(None, add);
    let mut sidecars: Option<Quantity> = None;
    let mut init_peak: Option<Quantity> = None;
    for (kind, own) in containers {
        match kind {
            ContainerKind::Regular => {}
            ContainerKind::Sidecar => {
                if let Some(own) = own {
                    total = add(total, own);
                    sidecars = add(sidecars, own);
                }
                if let Some(running) = sidecars {
                    init_peak = max(init_peak, running);
                }
            }
            ContainerKind::Init => {
                let running = match (own, sidecars) {
                    (Some(own), Some(sidecars)) => Some(own.plus(sidecars)),
                    (own, sidecars) => own.or(sidecars),
                };
                if let Some(running) = running {
                    init_peak = max(init_peak, running);
                }
            }
        }
    }
    match (total, init_peak) {
        (Some(total), Some(peak)) if peak > total => Some(peak),
        (total, peak) => total.or(peak),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerStats {
    pub name: String,
    pub kind: ContainerKind,
    pub requests: ResourceAmounts,
    pub limits: ResourceAmounts,
    pub usage: ContainerUsage,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EmptyDirStats {
    /// The volume name in the pod spec.
    pub name: String,
    /// Exact, in the format the pod spec wrote it (the kubelet prints it back).
    pub size_limit: Option<Quantity>,
    pub used: Option<i64>,
    /// `medium: Memory` or `HugePages*`: memory, not the node's disk. The kubelet counts
    /// an emptyDir as local storage only with the default medium
    /// (`IsLocalEphemeralVolume`); its sizeLimit is checked all the same.
    pub memory_backed: bool,
}

/// The shortest grace period a pod is ever stopped with. The kubelet's pod worker
/// (`calculateEffectiveGracePeriod`): "no matter what, we always supply a grace period
/// of 1". A 0 would also mean something else to the API server: deletion without waiting
/// for the kubelet at all.
pub const MIN_GRACE_PERIOD_SECONDS: i64 = 1;

/// The grace period a pod is actually stopped with when `requested` is asked for (an
/// eviction's override or a shutdown phase's), as the kubelet's pod worker
/// (`calculateEffectiveGracePeriod`) computes it for a pod not yet terminating: a request
/// of exactly 0 counts as "no value" and the pod's own `terminationGracePeriodSeconds`
/// applies (which is why the kubelet's hard evictions ask for 1, not 0, since
/// kubernetes#124063); anything below 1 is then raised to 1.
pub fn effective_grace_period_seconds(requested: i64, own: Option<i64>) -> i64 {
    let grace = match (requested, own) {
        (0, Some(own)) => own,
        _ => requested,
    };
    grace.max(MIN_GRACE_PERIOD_SECONDS)
}

/// `SystemCriticalPriority` in the kubelet.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

impl Pod {
    /// Static, mirror, or system-critical priority: never evicted.
    pub fn is_critical(&self) -> bool {
        self.critical || self.priority >= SYSTEM_CRITICAL_PRIORITY
    }

    /// `namespace/name`, the key used for deterministic tie-breaking and output.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether the pod has a stats entry, as the kubelet's summary would: its cgroup was
    /// found, or any figure was measured. A pod without one ranks first for every signal;
    /// the kubelet also skips it for local-storage checks and leaves its eviction events
    /// bare. Containers listed only for their requests and limits are not stats.
    pub fn has_stats(&self) -> bool {
        let usage = &self.usage;
        self.cgroup.is_some()
            || usage.memory.is_some()
            || usage.ephemeral_storage.is_some()
            || usage.inodes.is_some()
            || usage.pids.is_some()
            || usage.storage.is_measured()
            || self.containers.iter().any(|container| {
                let usage = &container.usage;
                usage.memory.is_some() || usage.rootfs.is_some() || usage.logs.is_some()
            })
            || self.empty_dirs.iter().any(|volume| volume.used.is_some())
    }
}
