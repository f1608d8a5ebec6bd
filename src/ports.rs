//! The seams between the agent loop and what plugs into it. The agent depends on these
//! traits and plain types; the Kubernetes integration (and the standalone cgroup code)
//! implements them; the command line wires one to the other. Nothing here does I/O.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::time::Instant;

// The evictor is the decision core's own seam, so the cgroup killer below the agent can
// implement it; it is listed here with the others.
pub use crate::eviction::{EvictError, Evictor};

use crate::eviction::Decision;
use crate::isolation::PodsCgroup;
use crate::notify::{WakeReason, Wakeup};
use crate::pods::Pod;
use crate::report::ApiReachability;
use crate::report::contact::LeaseSource;
use crate::shutdown::manager::{ManagerStatus, PodLister};
use crate::shutdown::runner::PodTerminator;
use crate::signals::Observations;

/// Where the agent's pods come from, instead of standalone workload cgroups. Called
/// once per cycle on the loop's thread; it must not block on the network (serve from a
/// cache kept fresh elsewhere).
pub trait PodSource: Send {
    fn pods(&mut self) -> Vec<Pod>;

    /// The UIDs of every pod the node still runs, from a list known to be whole (the
    /// kubelet's "all sources ready"): a pod missing from it is gone, so node-level
    /// reclaim may remove all its dead containers. Unlike [`PodSource::pods`], nothing is
    /// left out (pods evicted, stopping, or not understood), and a static pod counts by
    /// the UID the kubelet gives it (its mirror's `kubernetes.io/config.mirror` hash).
    /// `None` until the first full list has arrived, and where no list exists.
    fn running_pod_uids(&self) -> Option<std::collections::BTreeSet<String>> {
        None
    }

    /// Fill in `pod`'s per-container memory figures, read now; whether any was. They
    /// word a memory eviction's message ("Container app was using …") and decide
    /// nothing, so [`PodSource::pods`] leaves them out and the cycle asks for them only
    /// for the pods a memory threshold evicts: reading every container's files in every
    /// cycle doubled what the kernel does for a cycle in Kubernetes mode.
    fn measure_containers(&mut self, _pod: &mut Pod) -> bool {
        false
    }
}

/// What one cycle saw and decided, for logs, observers and tests.
#[derive(Debug, Clone)]
pub struct CycleReport {
    /// What started the cycle.
    pub started_by: CycleStart,
    /// When the cycle began, with its pods' listing.
    pub collection_started: std::time::Instant,
    /// When the cycle began reading the node's signals, after its pods: its observations
    /// are as of this moment or later (an observer can tell a crossing they may have
    /// missed).
    pub signals_read_at: std::time::Instant,
    /// The cycle read its pods afresh (`podStatsMaxAge`) until a kernel notification
    /// waited, and ranked pods it had not yet read on their kept figures.
    pub pod_reads_cut_short: bool,
    pub observations: Observations,
    pub pods: Vec<Pod>,
    pub decision: Decision,
    pub collection_errors: usize,
    /// The KEP-5394 contention conditions (only those turned on) and their events.
    pub contention: crate::signals::contention::ContentionReport,
}

/// What started a decision cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CycleStart {
    /// The housekeeping timer (and a cycle run on request, as tests do).
    Timer,
    /// A wake-up ahead of the timer: a kernel notification, or a look again after an
    /// eviction.
    Woken(Wakeup),
}

impl CycleStart {
    const TIMER: &'static str = "timer";

    /// The `started_by` label of the `nodekeeper_cycles_total` metric.
    pub fn as_str(&self) -> &'static str {
        match self {
            CycleStart::Timer => CycleStart::TIMER,
            CycleStart::Woken(wakeup) => wakeup.reason.as_str(),
        }
    }

    /// Every `started_by` label a cycle can have.
    pub fn names() -> impl Iterator<Item = &'static str> {
        std::iter::once(CycleStart::TIMER)
            .chain(WakeReason::ALL.into_iter().map(WakeReason::as_str))
    }
}

/// Sees every cycle's observations and decision, after the decision is made and before
/// the agent acts on it. Must not block.
pub trait CycleObserver: Send {
    fn observe(&mut self, report: &CycleReport);
}

/// Sees every change of the graceful shutdown's status (to show it on the Node). Must
/// not block.
pub trait ShutdownObserver: Send {
    fn observe(&mut self, status: &ManagerStatus);
}

/// What the shutdown manager uses instead of the agent's own workload cgroups: pods
/// listed and stopped elsewhere (through the API server), and an observer of its status.
pub struct ShutdownHooks<T: PodTerminator> {
    pub terminator: Arc<T>,
    pub pods: PodLister,
    pub node_status: Box<dyn ShutdownObserver>,
}

/// Writes an integration still owes the cluster (events, conditions, deletes) when the
/// agent stops.
pub trait PendingWrites: Send + Sync {
    /// Send what is queued until everything is out or `deadline` passes; whether all
    /// went out. What is left is logged, not lost silently.
    fn flush(&self, deadline: Instant) -> Pin<Box<dyn Future<Output = bool> + Send + '_>>;
}

/// Everything an integration hands the agent loop at once: where pods come from, how
/// they are evicted, who sees each cycle, and what the report to the controller needs.
pub struct Integration {
    pub pod_source: Box<dyn PodSource>,
    pub evictor: Box<dyn Evictor + Send>,
    pub observers: Vec<Box<dyn CycleObserver>>,
    pub api_reachability: Option<ApiReachability>,
    pub node_lease: Option<Arc<dyn LeaseSource>>,
    pub pods_cgroup: Option<PodsCgroup>,
    /// Flushed, bounded in time, when the agent stops.
    pub pending_writes: Option<Arc<dyn PendingWrites>>,
    /// Pod deletes an earlier run of the agent owed and this one sends: those pods are
    /// being stopped already, and are not chosen again while they are.
    pub resumed_evictions: Vec<ResumedEviction>,
}

/// A pod delete owed from before the agent restarted, by pod UID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumedEviction {
    pub uid: String,
    pub grace_period_seconds: i64,
}
