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
}
