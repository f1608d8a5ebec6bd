//! The standalone evictors: kill a pod's cgroup, or only say what would be killed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::error::ActError;
use super::kill::{CgroupKiller, StopTiming, Stopped, escalate_after_sigterm, terminate_target};
use super::scope::{workload_cgroup, workload_parent};
use crate::eviction::{EvictError, Evictor};
use crate::eviction::{EvictionOrder, IMMEDIATE_GRACE_PERIOD_SECONDS};
use crate::pods::{MIN_GRACE_PERIOD_SECONDS, Pod};
use crate::signals::CgroupLayout;

/// How a soft eviction ended.
#[derive(Debug)]
pub struct Escalation {
    pub cgroup: PathBuf,
    pub result: Result<Stopped, ActError>,
}

/// Kills workload cgroups below one parent. Hard evictions (grace of at most 1 s) are
/// killed before `evict` returns; soft ones are stopped gracefully (SIGTERM, the grace
/// period, SIGKILL) by a tokio task, so the agent loop never waits for a grace period.
pub struct CgroupEvictor {
    killer: Arc<CgroupKiller>,
    parent: PathBuf,
    escalations: BTreeMap<PathBuf, JoinHandle<Result<Stopped, ActError>>>,
}

impl CgroupEvictor {
    /// `workload_parent` is relative to the hierarchy root (e.g. `kubepods` or
    /// `workloads.slice`); nothing outside it is ever signalled.
    pub fn new(
        cgroup_root: &Path,
        layout: CgroupLayout,
        workload_parent_cgroup: &Path,
    ) -> Result<Self, ActError> {
        Ok(CgroupEvictor {
            killer: Arc::new(CgroupKiller::new(cgroup_root, layout)),
            parent: workload_parent(workload_parent_cgroup)?,
            escalations: BTreeMap::new(),
        })
    }

    /// Soft evictions whose escalation has not finished yet.
    pub fn pending(&self) -> usize {
        self.escalations
            .values()
            .filter(|task| !task.is_finished())
            .count()
    }

    /// Wait for every pending escalation and report how each ended.
    pub async fn settle(&mut self) -> Vec<Escalation> {
        let mut outcomes = Vec::new();
        for (cgroup, task) in std::mem::take(&mut self.escalations) {
            let result = task.await.unwrap_or_else(|e| {
                Err(ActError::Escalation {
                    cgroup: cgroup.clone(),
                    reason: e.to_string(),
                })
            });
            outcomes.push(Escalation { cgroup, result });
        }
        outcomes
    }

    fn forget_finished(&mut self) {
        self.escalations.retain(|_, task| !task.is_finished());
    }

    fn evict_cgroup(&mut self, order: &EvictionOrder, pod: &Pod) -> Result<(), ActError> {
        let cgroup = pod
            .cgroup
            .as_deref()
            .ok_or_else(|| ActError::NoCgroup { pod: pod.key() })?;
        let cgroup = workload_cgroup(&self.parent, cgroup)?;
        self.forget_finished();
        if order.grace_period_seconds <= IMMEDIATE_GRACE_PERIOD_SECONDS {
            let report = self.killer.kill(&cgroup)?;
            tracing::warn!(
                pod = %order.key(),
                cgroup = %cgroup.display(),
                signal = order.reason.label(),
                method = %report.method,
                processes = report.signalled,
                message = %order.message,
                "evicted pod: killed its cgroup"
            );
            return Ok(());
        }
        if self.escalations.contains_key(&cgroup) {
            tracing::debug!(pod = %order.key(), "soft eviction already in progress");
            return Ok(());
        }
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| ActError::NoRuntime { pod: pod.key() })?;
        let grace = Duration::from_secs(
            order
                .grace_period_seconds
                .max(MIN_GRACE_PERIOD_SECONDS)
                .unsigned_abs(),
        );
        let target = self.killer.target(&cgroup);
        // SIGTERM now, so the eviction happens when it is decided; only the wait for the
        // grace period and the escalation run in the background.
        let report = terminate_target(&target)?;
        tracing::warn!(
            pod = %order.key(),
            cgroup = %cgroup.display(),
            signal = order.reason.label(),
            processes = report.signalled,
            grace_period_seconds = order.grace_period_seconds,
            message = %order.message,
            "evicting pod: sent SIGTERM, SIGKILL follows after the grace period"
        );
        let task = runtime.spawn(async move {
            let stopped =
                escalate_after_sigterm(target.clone(), grace, StopTiming::default()).await;
            if let Ok(Stopped::Killed(report)) = &stopped {
                tracing::warn!(
                    cgroup = %target.tasks.display(),
                    processes = report.signalled,
                    "grace period over: killed the remaining processes"
                );
            }
            stopped
        });
        self.escalations.insert(cgroup, task);
        Ok(())
    }
}

impl Evictor for CgroupEvictor {
    fn evict(&mut self, order: &EvictionOrder, pod: &Pod) -> Result<(), EvictError> {
        self.evict_cgroup(order, pod)
            .map_err(|error| EvictError::Failed {
                pod: order.key(),
                message: error.to_string(),
            })
    }
}

/// Logs exactly what would be evicted and kills nothing.
#[derive(Debug, Default)]
pub struct DryRunEvictor {
    would_evict: Vec<String>,
}

impl DryRunEvictor {
    /// `namespace/name` of every pod ordered evicted so far, in order.
    pub fn would_evict(&self) -> &[String] {
        &self.would_evict
    }
}

impl Evictor for DryRunEvictor {
    fn evict(&mut self, order: &EvictionOrder, pod: &Pod) -> Result<(), EvictError> {
        tracing::warn!(
            pod = %order.key(),
            cgroup = %pod
                .cgroup
                .as_ref()
                .map_or_else(|| "none".to_string(), |cgroup| cgroup.display().to_string()),
            signal = order.reason.label(),
            grace_period_seconds = order.grace_period_seconds,
            message = %order.message,
            "dry run: would evict pod"
        );
        self.would_evict.push(order.key());
        Ok(())
    }
}
