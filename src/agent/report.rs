//! The agent's reports to the fence controller: the decision cycle's conditions and
//! evictions, the shutdown manager's progress and the API connection's state go to the
//! report board, and the sender reports them (see docs/protocol.md).

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{CycleObserver, CycleReport};
use crate::config::AgentConfig;
use crate::report::protocol::{ApiServerState, EvictionReport, ShutdownPhase, ShutdownReport};
use crate::report::sender::{SenderSettings, run_sender};
use crate::report::{ApiReachability, ReportBoard};
use crate::shutdown::manager::ManagerStatus;
use crate::shutdown::state::{PhaseStatus, ShutdownOutcome};

/// Posts each cycle's conditions, and the pod it evicts, to the board.
struct BoardObserver {
    board: Arc<ReportBoard>,
    dry_run: bool,
}

impl CycleObserver for BoardObserver {
    fn observe(&mut self, report: &CycleReport) {
        let decision = &report.decision;
        self.board.set_conditions(
            decision
                .conditions
                .iter()
                .map(|condition| condition.as_str().to_string())
                .collect(),
        );
        // With node-level reclaim first, the pods are evicted only if it did not help;
        // the next cycle reports the eviction then.
        if decision.reclaim_requested.is_none()
            && let Some(order) = decision.evictions.first()
        {
            let signal = decision
                .starved
                .map(|starved| starved.signal.as_str())
                .unwrap_or("ephemeral-storage limit");
            self.board.set_last_eviction(EvictionReport {
                pod: order.key(),
                signal: signal.to_string(),
                at: Timestamp::now(),
                dry_run: self.dry_run,
            });
        }
    }
}

/// The shutdown part of a report, from the manager's status. A record of an earlier
/// boot says nothing about this one. Every pod counts as stopped only when each phase
/// completed (or had no pods) with no pod failing to stop, and never in dry-run mode,
/// where nothing is stopped: the controller releases a drained node's volumes on it.
pub fn shutdown_report(status: &ManagerStatus, boot_id: &str, dry_run: bool) -> ShutdownReport {
    let millis = |ms: u64| Timestamp::from_millisecond(ms as i64).ok();
    let mut report = ShutdownReport {
        lock_held: status.lock_held,
        ..ShutdownReport::default()
    };
    let Some(state) = status
        .last_shutdown
        .as_ref()
        .filter(|state| state.boot_id == boot_id)
    else {
        return report;
    };
    report.state = match state.outcome {
        ShutdownOutcome::InProgress => ShutdownPhase::InProgress,
        ShutdownOutcome::Finished => ShutdownPhase::Finished,
        ShutdownOutcome::Cancelled => ShutdownPhase::Cancelled,
        ShutdownOutcome::AbandonedByReboot => return report,
    };
    report.started_at = millis(state.start_unix_ms);
    report.finished_at = state.end_unix_ms.and_then(millis);
    report.phases_total = state.phases.len() as u32;
    report.phases_done = state.phases.iter().filter(|p| p.is_done()).count() as u32;
    report.about_to_power_off = state.about_to_power_off;
    report.all_pods_stopped = !dry_run
        && state.outcome == ShutdownOutcome::Finished
        && state.phases.iter().all(|phase| {
            matches!(phase.status, PhaseStatus::Completed | PhaseStatus::Skipped)
                && phase.failed_pods.is_empty()
        });
    report
}

/// The reporting tasks of a running agent.
pub struct Reporting {
    pub board: Arc<ReportBoard>,
    /// Ends by itself once the agent stops, after one last report.
    sender: JoinHandle<()>,
    /// Run until aborted.
    followers: Vec<JoinHandle<()>>,
}

impl Reporting {
    /// Lets the sender deliver its last report (it gives up after a second), then ends
    /// the rest. Called once `stop` is set.
    pub async fn stop(self) {
        let mut sender = self.sender;
        if tokio::time::timeout(SENDER_STOP_WAIT, &mut sender)
            .await
            .is_err()
        {
            sender.abort();
        }
        for task in self.followers {
            task.abort();
        }
    }
}

/// How long a stopping agent waits for its last report.
const SENDER_STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Starts reporting when `report:` is configured: installs the cycle observer and
/// returns the board (for the shutdown manager) and the tasks to stop with the agent.
pub fn start(agent: &mut super::Agent, stop: watch::Receiver<bool>) -> Option<Reporting> {
    let settings = sender_settings(agent.config())?;
    let board = Arc::new(ReportBoard::new());
    agent.add_cycle_observer(Box::new(BoardObserver {
        board: board.clone(),
        dry_run: settings.dry_run,
    }));
    let mut followers = Vec::new();
    if let Some(reachability) = agent.api_reachability() {
        followers.push(tokio::spawn(follow_api(reachability, board.clone())));
    }
    let stopped = async move {
        let mut stop = stop;
        let _ = stop.wait_for(|stop| *stop).await;
    };
    let sender = tokio::spawn(run_sender(
        settings,
        board.clone(),
        agent.metrics(),
        stopped,
    ));
    Some(Reporting {
        board,
        sender,
        followers,
    })
}

/// The sender's settings from the configuration and this boot; `None` (logged) when
/// reports are off or cannot name their node and boot.
fn sender_settings(config: &AgentConfig) -> Option<SenderSettings> {
    let report = config.report.as_ref()?;
    let Some(node) = config.node_name.clone() else {
        tracing::error!(
            "report: no node name to report for (set nodeName or NODE_NAME); not reporting"
        );
        return None;
    };
    let boot_id = match crate::shutdown::manager::read_boot_id() {
        Ok(id) => id,
        Err(error) => {
            tracing::error!(%error, "report: cannot read this boot's id; not reporting");
            return None;
        }
    };
    let boot_time = match crate::report::sender::read_boot_time() {
        Ok(time) => time,
        Err(error) => {
            tracing::error!(%error, "report: cannot read when this boot began; not reporting");
            return None;
        }
    };
    Some(SenderSettings {
        controller_url: report.controller_url.clone(),
        node,
        boot_id,
        boot_time,
        interval: report.interval.to_std(),
        timeout: report.timeout.to_std(),
        token_file: report.token_file.clone(),
        ca_file: report.ca_file.clone(),
        dry_run: config.dry_run,
    })
}

async fn follow_api(reachability: ApiReachability, board: Arc<ReportBoard>) {
    let mut changes = reachability.subscribe();
    loop {
        let state = if *changes.borrow_and_update() {
            ApiServerState::Reachable
        } else {
            ApiServerState::Unreachable
        };
        board.set_api_server(state, Timestamp::now());
        if changes.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shutdown::plan::{PlannedPhase, ShutdownPlan};
    use crate::shutdown::state::ShutdownState;

    const BOOT: &str = "this-boot";

    fn three_phases() -> ShutdownState {
        let phase = |priority| PlannedPhase {
            priority,
            seconds: 10,
            pods: Vec::new(),
        };
        let plan = ShutdownPlan {
            total_seconds: 30,
            phases: vec![phase(0), phase(1000), phase(2_000_000_000)],
        };
        ShutdownState::begin(&plan, BOOT, 1_763_900_000_000)
    }

    fn status(state: Option<ShutdownState>) -> ManagerStatus {
        ManagerStatus {
            lock_held: true,
            last_shutdown: state,
            ..ManagerStatus::default()
        }
    }

    #[test]
    fn a_shutdown_in_progress_reports_its_phases() {
        let mut state = three_phases();
        state.start_phase(0, 1_763_900_001_000);
        state.end_phase(0, PhaseStatus::Completed, Vec::new(), 1_763_900_004_000);
        let report = shutdown_report(&status(Some(state)), BOOT, false);
        assert_eq!(report.state, ShutdownPhase::InProgress);
        assert_eq!((report.phases_done, report.phases_total), (1, 3));
        assert!(report.lock_held);
        assert_eq!(
            report.started_at,
            Some(Timestamp::from_millisecond(1_763_900_000_000).expect("time"))
        );
        assert_eq!(report.finished_at, None);
        assert!(!report.about_to_power_off);
    }

    #[test]
    fn a_finished_or_cancelled_shutdown_says_so() {
        let mut state = three_phases();
        for index in 0..3 {
            state.end_phase(index, PhaseStatus::Skipped, Vec::new(), 1_763_900_001_000);
        }
        state.finish(1_763_900_002_000);
        state.about_to_power_off = true;
        let report = shutdown_report(&status(Some(state)), BOOT, false);
        assert_eq!(report.state, ShutdownPhase::Finished);
        assert_eq!(report.phases_done, 3);
        assert!(report.about_to_power_off);
        assert!(report.finished_at.is_some());

        let mut state = three_phases();
        state.cancel(1_763_900_002_000);
        assert_eq!(
            shutdown_report(&status(Some(state)), BOOT, false).state,
            ShutdownPhase::Cancelled
        );
    }

    /// Ends phase `index` with `status` and the pods that failed to stop.
    fn end(state: &mut ShutdownState, index: usize, status: PhaseStatus, failed: &[&str]) {
        let failed = failed.iter().map(|pod| pod.to_string()).collect();
        state.end_phase(index, status, failed, 1_763_900_001_000);
    }

    #[test]
    fn every_pod_stopped_only_when_each_phase_completed_or_had_no_pods() {
        let finished = |outcomes: [(PhaseStatus, &[&str]); 3]| {
            let mut state = three_phases();
            for (index, (status, failed)) in outcomes.into_iter().enumerate() {
                end(&mut state, index, status, failed);
            }
            state.finish(1_763_900_002_000);
            state.about_to_power_off = true;
            state
        };
        let clean = finished([
            (PhaseStatus::Completed, &[]),
            (PhaseStatus::Skipped, &[]),
            (PhaseStatus::Completed, &[]),
        ]);
        assert!(shutdown_report(&status(Some(clean.clone())), BOOT, false).all_pods_stopped);
        // Dry-run: the phases ran, but nothing was stopped.
        assert!(!shutdown_report(&status(Some(clean)), BOOT, true).all_pods_stopped);
        // A phase whose timer fired with pods still terminating.
        let timed_out = finished([
            (PhaseStatus::Completed, &[]),
            (PhaseStatus::TimedOut, &[]),
            (PhaseStatus::Completed, &[]),
        ]);
        let report = shutdown_report(&status(Some(timed_out)), BOOT, false);
        assert_eq!(report.state, ShutdownPhase::Finished);
        assert!(!report.all_pods_stopped);
        // A pod whose termination failed.
        let failed = finished([
            (PhaseStatus::Completed, &["default/web-0"]),
            (PhaseStatus::Completed, &[]),
            (PhaseStatus::Completed, &[]),
        ]);
        assert!(!shutdown_report(&status(Some(failed)), BOOT, false).all_pods_stopped);
        // Not finished yet, or cancelled.
        let mut running = three_phases();
        end(&mut running, 0, PhaseStatus::Completed, &[]);
        assert!(!shutdown_report(&status(Some(running.clone())), BOOT, false).all_pods_stopped);
        running.cancel(1_763_900_002_000);
        assert!(!shutdown_report(&status(Some(running)), BOOT, false).all_pods_stopped);
    }

    #[test]
    fn an_earlier_boots_record_says_nothing_about_this_one() {
        // Finished before the reboot: in this boot, no shutdown has happened.
        let mut state = three_phases();
        state.finish(1_763_900_002_000);
        let report = shutdown_report(&status(Some(state)), "the-next-boot", false);
        assert_eq!(report.state, ShutdownPhase::None);
        assert_eq!(report.phases_total, 0);
        assert!(report.lock_held, "the lock is this boot's");
        let mut abandoned = three_phases();
        abandoned.abandon();
        assert_eq!(
            shutdown_report(&status(Some(abandoned)), BOOT, false).state,
            ShutdownPhase::None
        );
        assert_eq!(
            shutdown_report(&status(None), BOOT, false),
            ShutdownReport {
                lock_held: true,
                ..ShutdownReport::default()
            }
        );
    }
}
