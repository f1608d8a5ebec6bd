//! The eviction decision core: the kubelet eviction manager's `synchronize` as pure
//! functions over plain data, plus the per-signal pod ranking.
//!
//! Nothing here reads the host, sleeps or kills: callers pass in the configuration, the
//! previous [`EvictionState`], fresh observations, the pods and the current time, and
//! receive a [`Decision`]. Acting on it goes through the narrow [`Evictor`] and
//! [`NodeReclaimer`] traits, implemented by the agent shell.

mod local_storage;
mod message;
mod rank;
mod reclaim;
mod synchronize;
mod thresholds;

use std::collections::{BTreeMap, BTreeSet};

pub use rank::{measured_storage, rank, rank_cmp};
pub use reclaim::{
    CommandReclaimer, NodeReclaimer, ReclaimCommand, ReclaimError, ReclaimFailure,
    ReclaimFunctions, reclaim_functions,
};
pub use synchronize::{pressure_remains_after_reclaim, synchronize};

use crate::config::{FilesystemLayout, GoDuration, HostPaths, Threshold};
use crate::pods::Pod;
use crate::signals::{NodeCondition, Observations, Resource, Signal};

/// A point on the caller's monotonic clock, in milliseconds. The core never reads a
/// clock itself, so tests and `replay` drive time explicitly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Millis(pub u64);

impl Millis {
    /// Time from `earlier` to `self`, zero if the clock went backwards.
    pub fn since(self, earlier: Millis) -> GoDuration {
        let millis = self.0.saturating_sub(earlier.0);
        GoDuration::from_nanos(i64::try_from(millis.saturating_mul(1_000_000)).unwrap_or(i64::MAX))
    }

    /// A trace offset or other duration as a clock reading; negative becomes zero.
    pub fn from_duration(duration: GoDuration) -> Millis {
        Millis(u64::try_from(duration.nanos() / 1_000_000).unwrap_or(0))
    }
}

/// Host facts that the eviction thresholds do not carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncOptions {
    /// Which filesystem holds images and writable layers: it decides what counts toward
    /// a container's storage use and which disk signals node-level reclaim can relieve.
    pub fs_layout: FilesystemLayout,
    /// Whether a [`NodeReclaimer`] is configured; without one the reclaim step is
    /// skipped and disk pressure goes straight to pod eviction.
    pub node_reclaimer_configured: bool,
}

impl Default for SyncOptions {
    fn default() -> Self {
        SyncOptions {
            fs_layout: FilesystemLayout::SingleDisk,
            node_reclaimer_configured: false,
        }
    }
}

impl SyncOptions {
    /// The layout implied by the configured filesystem paths, for tools that read no
    /// node (`replay`); the agent takes the layout its devices make
    /// (`signals::Host::fs_layout`).
    pub fn for_paths(paths: &HostPaths, node_reclaimer_configured: bool) -> Self {
        let fs_layout = paths.fs_layout();
        SyncOptions {
            fs_layout,
            node_reclaimer_configured,
        }
    }

    pub(crate) fn has_dedicated_image_fs(&self) -> bool {
        self.fs_layout != FilesystemLayout::SingleDisk
    }
}

/// A threshold together with the time it was first seen met without interruption.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedThreshold {
    pub threshold: Threshold,
    pub first_observed_at: Millis,
}

/// Everything the core remembers between cycles. Plain data: the agent keeps it, tests
/// build it by hand, and `replay` threads it through the steps.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EvictionState {
    /// Thresholds met (ignoring grace) and when each was first observed.
    pub thresholds_first_observed_at: Vec<ObservedThreshold>,
    /// When each node condition was last observed, for transition damping.
    pub node_conditions_last_observed_at: BTreeMap<NodeCondition, Millis>,
    /// Thresholds that had passed their grace period last cycle; these are held until
    /// their minimum reclaim is satisfied.
    pub thresholds_met: Vec<Threshold>,
    /// The previous cycle's observations, for the stale-stats guard.
    pub last_observations: Observations,
    /// Node conditions after damping, as last reported.
    pub node_conditions: BTreeSet<NodeCondition>,
}

/// Why a pod is evicted: a node threshold, or one of its own local-storage limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionReason {
    Threshold(Signal),
    EmptyDirLimit,
    PodEphemeralStorageLimit,
    ContainerEphemeralStorageLimit,
}

impl EvictionReason {
    /// The `eviction_signal` label the kubelet uses in metrics for this reason.
    pub fn label(&self) -> &'static str {
        match self {
            EvictionReason::Threshold(signal) => signal.as_str(),
            EvictionReason::EmptyDirLimit => "emptydirfs.limit",
            EvictionReason::PodEphemeralStorageLimit => "ephemeralpodfs.limit",
            EvictionReason::ContainerEphemeralStorageLimit => "ephemeralcontainerfs.limit",
        }
    }
}

/// Event annotation keys, as the kubelet sets them on the `Evicted` event.
pub const ANNOTATION_OFFENDING_CONTAINERS: &str = "offending_containers";
pub const ANNOTATION_OFFENDING_CONTAINERS_USAGE: &str = "offending_containers_usage";
pub const ANNOTATION_STARVED_RESOURCE: &str = "starved_resource";

/// The grace period of hard-threshold and local-storage evictions
/// (`immediateEvictionGracePeriodSeconds`).
pub const IMMEDIATE_GRACE_PERIOD_SECONDS: i64 = 1;

/// The pod status reason and event reason of an eviction.
pub const EVICTED_REASON: &str = "Evicted";

/// One pod to evict, with everything the evictor needs to do it the kubelet's way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionOrder {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    pub reason: EvictionReason,
    pub grace_period_seconds: i64,
    /// Pod status message and event message.
    pub message: String,
    /// Event annotations; empty for local-storage evictions and pods without stats.
    pub annotations: BTreeMap<String, String>,
    /// Threshold evictions mark the pod with `DisruptionTarget=True`
    /// (reason `TerminationByKubelet`); local-storage evictions do not.
    pub disruption_target: bool,
}

impl EvictionOrder {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether this order is for `pod` (a pod's namespace and name are unique on a node).
    pub fn is_for(&self, pod: &Pod) -> bool {
        pod.namespace == self.namespace && pod.name == self.name
    }
}

/// The signal whose threshold the cycle is acting on, and the resource it starves
/// (the kubelet's `EvictionThresholdMet` event: "Attempting to reclaim <resource>").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Starvation {
    pub signal: Signal,
    pub resource: Resource,
}

/// The outcome of one cycle.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decision {
    pub state: EvictionState,
    /// Node conditions after transition damping.
    pub conditions: BTreeSet<NodeCondition>,
    /// Thresholds met after grace periods, in configuration order.
    pub thresholds_met: Vec<Threshold>,
    /// The threshold being acted on, when pods or node resources must be reclaimed.
    pub starved: Option<Starvation>,
    /// Set when node-level reclaim must run first. The caller runs the reclaimer, takes
    /// fresh observations, and applies `evictions` only if
    /// [`pressure_remains_after_reclaim`] says so.
    pub reclaim_requested: Option<Signal>,
    /// Pods to evict: every local-storage offender, or at most one pod for a threshold.
    pub evictions: Vec<EvictionOrder>,
}

/// Kills or evicts one pod as ordered. Implemented by the agent's standalone cgroup
/// evictor and by the Kubernetes API evictor.
pub trait Evictor {
    fn evict(&mut self, order: &EvictionOrder, pod: &Pod) -> Result<(), EvictError>;
}

#[derive(Debug, thiserror::Error)]
pub enum EvictError {
    #[error("cannot evict pod {pod}: {message}")]
    Failed { pod: String, message: String },
    #[error("cannot evict pod {pod}: {error}")]
    Io { pod: String, error: std::io::Error },
}

#[cfg(test)]
mod tests;
