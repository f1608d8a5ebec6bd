//! Graceful node shutdown inside the agent: start the logind shutdown manager with the
//! configured phases, drain the agent's own workloads (standalone) or this node's pods
//! through the API (Kubernetes), and export its status.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::service::ServiceReporter;
use super::standalone::workload_pods;
use crate::config::AgentConfig;
use crate::metrics::{Metrics, PhaseLabels};
use crate::ports::{ShutdownHooks, ShutdownObserver};
use crate::shutdown::cgroup_kill::CgroupTerminator;
use crate::shutdown::logind::BusAddress;
use crate::shutdown::manager::{ManagerOptions, ManagerStatus, PodLister, run_shutdown_manager};
use crate::shutdown::plan::phases_from_config;
use crate::shutdown::runner::{DryRunTerminator, PodTerminator, SystemClock};
use crate::shutdown::state::metrics_from_state;
use crate::signals::{CgroupLayout, CgroupReader, Host, ProcessCounts, join_relative};

/// Start the shutdown manager when graceful shutdown is configured: with `kube` hooks it
/// drains this node's pods through the API, else the agent's workload cgroups. In dry-run
/// mode it holds the lock and plans the phases as usual, but only logs each pod it would
/// stop. Returns the tasks to await on stop; `None` when the feature is off or cannot run here (logged).
pub fn start<T: PodTerminator>(
    config: &AgentConfig,
    kube: Option<ShutdownHooks<T>>,
    host: &Host,
    metrics: Arc<Metrics>,
    board: Option<Arc<crate::report::ReportBoard>>,
    service: &Arc<ServiceReporter>,
    stop: watch::Receiver<bool>,
) -> Option<(JoinHandle<()>, JoinHandle<()>)> {
    let phases = phases_from_config(&config.shutdown);
    if phases.is_empty() {
        tracing::info!(
            "graceful node shutdown disabled (shutdownGracePeriod is 0 and no shutdownGracePeriodByPodPriority)"
        );
        return None;
    }
    let boot_id = match host.boot_id() {
        Ok(id) => id.to_string(),
        Err(error) => {
            tracing::error!(%error, "cannot read this boot's id; graceful node shutdown disabled");
            return None;
        }
    };
    service.expect_lock();
    let mut options = ManagerOptions::new(phases, boot_id.clone());
    options.service = service.link().clone();
    options.state_path = config.shutdown_state_file.clone();
    options.logind_dropin_path = config.logind_drop_in_path.clone();
    options.state_write_failures = metrics.state_write_failures("shutdown_state");
    if let Some(address) = &config.dbus_address {
        options.bus = BusAddress::Address(address.clone());
    }

    let (status_tx, status_rx) = watch::channel(ManagerStatus::default());
    let clock = Arc::new(SystemClock);
    let dry_run = config.dry_run;
    let through_api = kube.is_some();
    let (manager, node_status) = match kube {
        Some(hooks) if dry_run => (
            tokio::spawn(run_shutdown_manager(
                options,
                Arc::new(DryRunTerminator),
                hooks.pods,
                clock,
                status_tx,
                stop,
            )),
            Some(hooks.node_status),
        ),
        Some(hooks) => (
            tokio::spawn(run_shutdown_manager(
                options,
                hooks.terminator,
                hooks.pods,
                clock,
                status_tx,
                stop,
            )),
            Some(hooks.node_status),
        ),
        None => {
            let (terminator, pods) = workload_terminator(config, host.cgroups());
            let manager = if dry_run {
                tokio::spawn(run_shutdown_manager(
                    options,
                    Arc::new(DryRunTerminator),
                    pods,
                    clock,
                    status_tx,
                    stop,
                ))
            } else {
                tokio::spawn(run_shutdown_manager(
                    options,
                    Arc::new(terminator),
                    pods,
                    clock,
                    status_tx,
                    stop,
                ))
            };
            (manager, None)
        }
    };
    let publisher = tokio::spawn(publish_status(
        status_rx,
        metrics,
        service.clone(),
        node_status,
        board.map(|board| ReportTo {
            board,
            boot_id,
            draining: super::report::Draining {
                dry_run,
                through_api,
            },
        }),
    ));
    Some((manager, publisher))
}

/// Standalone mode: kill the agent's own workload cgroups.
fn workload_terminator(
    config: &AgentConfig,
    reader: Option<&CgroupReader>,
) -> (CgroupTerminator, PodLister) {
    match (&config.workloads, reader) {
        (Some(workloads), Some(reader)) => {
            let dir = workload_dir(&config.paths.cgroup_root, reader, &workloads.parent_cgroup);
            let terminator = CgroupTerminator::flat(dir, &workloads.namespace);
            let (reader, workloads) = (reader.clone(), workloads.clone());
            let pods: PodLister = Arc::new(move || {
                // The shutdown order is by priority alone: no process counts.
                workload_pods(&reader, &workloads, ProcessCounts::NotNeeded)
                    .map(|(pods, _)| pods)
                    .map_err(|e| e.to_string())
            });
            (terminator, pods)
        }
        _ => (
            CgroupTerminator::new(PathBuf::from("/nonexistent")),
            Arc::new(|| Ok(Vec::new())),
        ),
    }
}

/// The directory whose `cgroup.procs` lists a workload's processes and which can be
/// frozen: the v1 freezer hierarchy when the workload parent exists there, else the
/// memory hierarchy (v1) or the unified hierarchy (v2).
fn workload_dir(
    cgroup_root: &std::path::Path,
    reader: &CgroupReader,
    parent: &std::path::Path,
) -> PathBuf {
    if reader.layout() != CgroupLayout::Unified {
        let freezer = join_relative(&cgroup_root.join("freezer"), parent);
        if freezer.is_dir() {
            return freezer;
        }
    }
    reader.paths().memory_dir(parent)
}

/// Where the shutdown's progress goes into the agent's reports.
struct ReportTo {
    board: Arc<crate::report::ReportBoard>,
    boot_id: String,
    draining: super::report::Draining,
}

async fn publish_status(
    mut status: watch::Receiver<ManagerStatus>,
    metrics: Arc<Metrics>,
    service: Arc<ServiceReporter>,
    mut node_status: Option<Box<dyn ShutdownObserver>>,
    report: Option<ReportTo>,
) {
    let mut was_shutting_down = false;
    loop {
        {
            let current = status.borrow_and_update();
            if let Some(report) = &report {
                report.board.set_shutdown(super::report::shutdown_report(
                    &current,
                    &report.boot_id,
                    report.draining,
                ));
            }
            if let Some(node_status) = node_status.as_mut() {
                node_status.observe(&current);
            }
            service.shutdown(&current);
            metrics
                .shutdown_in_progress
                .set(i64::from(current.shutting_down));
            metrics
                .shutdown_inhibit_lock_held
                .set(i64::from(current.lock_held));
            let sufficient = !matches!(current.inhibit_delay, Some(Err(_)));
            metrics
                .shutdown_inhibit_delay_sufficient
                .set(i64::from(sufficient));
            if let Some(Err(message)) = &current.inhibit_delay {
                tracing::error!("{message}");
            }
            let figures = metrics_from_state(current.last_shutdown.as_ref());
            metrics
                .graceful_shutdown_start_time
                .set(figures.start_time_seconds);
            metrics
                .graceful_shutdown_end_time
                .set(figures.end_time_seconds);
            for (priority, seconds) in figures.phase_durations {
                metrics
                    .graceful_shutdown_phase_duration
                    .get_or_create(&PhaseLabels {
                        priority: priority.to_string(),
                    })
                    .set(seconds);
            }
            if current.shutting_down != was_shutting_down {
                was_shutting_down = current.shutting_down;
                if was_shutting_down {
                    tracing::warn!("node is shutting down: draining workloads by priority phase");
                } else {
                    tracing::info!("node shutdown finished or cancelled");
                }
            }
        }
        if status.changed().await.is_err() {
            return;
        }
    }
}
