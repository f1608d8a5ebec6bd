//! The agent's view of a pod: identity, priority, requests, limits and measured usage.
//! It is the same shape whether pods come from the API server, from workload cgroups
//! in standalone mode, or from a recorded trace.

/// Amounts of the resources eviction reasons about, in bytes (memory, storage).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResourceAmounts {
    pub memory: Option<i64>,
    pub ephemeral_storage: Option<i64>,
}

/// Measured usage; `None` means "no stats" for that resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodUsage {
    /// Working set in bytes.
    pub memory: Option<i64>,
    pub ephemeral_storage: Option<i64>,
    pub inodes: Option<i64>,
    pub pids: Option<i64>,
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

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerStats {
    pub name: String,
    pub requests: ResourceAmounts,
    pub limits: ResourceAmounts,
    pub usage: ContainerUsage,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EmptyDirStats {
    /// The volume name in the pod spec.
    pub name: String,
    pub size_limit: Option<i64>,
    pub used: Option<i64>,
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

    /// Whether any measurement exists for this pod: the kubelet skips pods without a
    /// stats entry for local-storage checks and leaves their eviction events bare.
    pub fn has_stats(&self) -> bool {
        let usage = &self.usage;
        usage.memory.is_some()
            || usage.ephemeral_storage.is_some()
            || usage.inodes.is_some()
            || usage.pids.is_some()
            || !self.containers.is_empty()
            || self.empty_dirs.iter().any(|volume| volume.used.is_some())
    }
}
