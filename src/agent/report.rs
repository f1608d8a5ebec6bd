//! The agent's reports to the fence controller: the decision cycle's conditions and
//! evictions, the shutdown manager's progress and the API connection's state go to the
//! report board, and the sender reports them (see docs/protocol.md).

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::AgentConfig;
use crate::isolation::guardian::{Guardian, GuardianLinks, SelfRequest, Withdrawal, unarmed};
use crate::isolation::self_isolation::SelfIsolationPlan;
use crate::isolation::watchdog::{DeviceWatchdog, RebootNode, Watchdog};
use crate::isolation::{Isolator, IsolatorSettings, PodsCgroup};
use crate::ports::{CycleObserver, CycleReport};
use crate::report::contact::{ContactClock, follow_lease};
use crate::report::protocol::{ApiServerState, EvictionReport, ShutdownPhase, ShutdownReport};
use crate::report::sender::{SenderSettings, run_sender};
use crate::report::{ApiReachability, ReportBoard};
use crate::shutdown::manager::ManagerStatus;
use crate::shutdown::state::ShutdownOutcome;
use crate::signals::Host;
use crate::systemd::{BusAddress, LazySystemd};

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

/// How the agent drains its node, as far as a report's claims go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Draining {
    /// Dry-run mode: nothing is stopped.
    pub dry_run: bool,
    /// Pods are deleted through the API, so a completed phase means the kubelet stopped
    /// them and unmounted their volumes (standalone mode kills workload cgroups, which
    /// says nothing about the node's Kubernetes pods).
    pub through_api: bool,
}

/// The shutdown part of a report, from the manager's status. A record of an earlier
/// boot says nothing about this one; a finished record this process did not finish (a
/// restarted agent: the power off failed, or a soft reboot kept the boot) is not about
/// to power off. Every pod counts as stopped only when this process drained the node
/// through the API from a complete pod list, each phase completed (or had no pods), and
/// no pod failed to stop: the controller releases a drained node's volumes on it.
pub fn shutdown_report(
    status: &ManagerStatus,
    boot_id: &str,
    draining: Draining,
) -> ShutdownReport {
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
    report.about_to_power_off = state.about_to_power_off && status.released_for_power_off;
    report.all_pods_stopped = report.about_to_power_off
        && draining.through_api
        && !draining.dry_run
        && state.every_pod_stopped();
    report
}

/// The reporting tasks of a running agent.
pub struct Reporting {
    pub board: Arc<ReportBoard>,
    /// Ends by itself once the agent stops, after one last report.
    sender: JoinHandle<()>,
    /// Run until aborted.
    followers: Vec<JoinHandle<()>>,
    /// The self-isolation guardian, stopped after the last report.
    guardian: Option<(watch::Sender<bool>, JoinHandle<()>)>,
}

impl Reporting {
    /// Lets the sender finish the report in flight and deliver its last one (a second
    /// each at most), then ends the rest. Called once `stop` is set.
    pub async fn stop(self) {
        let mut sender = self.sender;
        if tokio::time::timeout(SENDER_STOP_WAIT, &mut sender)
            .await
            .is_err()
        {
            sender.abort();
        }
        if let Some((stop, mut guardian)) = self.guardian {
            stop.send_replace(true);
            if tokio::time::timeout(SENDER_STOP_WAIT, &mut guardian)
                .await
                .is_err()
            {
                guardian.abort();
            }
        }
        for task in self.followers {
            task.abort();
        }
    }
}

/// How long a stopping agent waits for its reports: the one in flight and the last one
/// get a second each.
const SENDER_STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Starts reporting when `report:` is configured: installs the cycle observer and
/// returns the board (for the shutdown manager) and the tasks to stop with the agent.
pub fn start(agent: &mut super::Agent, stop: watch::Receiver<bool>) -> Option<Reporting> {
    let settings = sender_settings(agent.config(), agent.host())?;
    let board = Arc::new(ReportBoard::new());
    agent.add_cycle_observer(Box::new(BoardObserver {
        board: board.clone(),
        dry_run: settings.dry_run,
    }));
    let mut followers = Vec::new();
    if let Some(reachability) = agent.api_reachability() {
        followers.push(tokio::spawn(follow_api(reachability, board.clone())));
    }
    let (instructions, followed) = watch::channel(Vec::new());
    let mut contact = Arc::new(ContactClock::in_memory());
    let mut guardian = None;
    let mut withdrawal = None;
    if let Some(mut isolator) = isolator(agent, &settings, board.clone()) {
        if let Some(armed) = self_isolation(agent, &settings, board.clone()) {
            isolator = isolator.with_self_requests(armed.requests);
            contact = armed.contact;
            withdrawal = Some(armed.withdrawal);
            if let Some(lease) = armed.lease {
                followers.push(tokio::spawn(lease));
            }
            let (stop_guardian, guardian_stopped) = watch::channel(false);
            guardian = Some((
                stop_guardian,
                tokio::spawn(armed.guardian.run(guardian_stopped)),
            ));
        }
        followers.push(tokio::spawn(isolator.run(followed)));
    }
    let stopped = async move {
        let mut stop = stop;
        let _ = stop.wait_for(|stop| *stop).await;
        // Before the last report: it must say the promise is withdrawn.
        if let Some(withdrawal) = withdrawal {
            withdrawal.announce(crate::boot_clock::since_boot());
        }
    };
    let sender = tokio::spawn(run_sender(
        settings,
        board.clone(),
        agent.metrics(),
        instructions,
        contact,
        stopped,
    ));
    Some(Reporting {
        board,
        sender,
        followers,
        guardian,
    })
}

/// Self-isolation, armed: the guardian with its watchdog, what it shares with the
/// sender and the isolator, and the Lease reader.
struct Armed {
    guardian: Guardian,
    requests: watch::Receiver<SelfRequest>,
    contact: Arc<ContactClock>,
    withdrawal: Arc<Withdrawal>,
    lease: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
}

/// Arms self-isolation when it is configured and this agent can keep the promise;
/// otherwise the reports say why not (the log too).
fn self_isolation(
    agent: &super::Agent,
    settings: &SenderSettings,
    board: Arc<ReportBoard>,
) -> Option<Armed> {
    let config = agent.config();
    let report_config = config.report.as_ref()?;
    let isolation = &report_config.isolation;
    let isolate_after = isolation.isolate_after?.to_std();
    let refusal = isolation_refusal(
        isolation.enabled,
        config.dry_run,
        settings.over_tls(),
        agent.pods_cgroup().is_some(),
    )
    .or_else(|| {
        agent.node_lease().is_none().then(|| {
            "the agent does not use the Kubernetes API, so it cannot read its node's Lease"
                .to_string()
        })
    });
    let not_armed = |why: String| {
        tracing::error!(%why, "self-isolation is configured but not armed; the controller will not release this node's pods on its promise");
        board.set_self_isolation(unarmed(&why));
        None
    };
    if let Some(why) = refusal {
        return not_armed(why);
    }
    let watchdog = match DeviceWatchdog::open(
        &isolation.watchdog_device,
        isolation.watchdog_timeout.to_std(),
    ) {
        Ok(watchdog) => watchdog,
        Err(error) => return not_armed(error),
    };
    let plan = SelfIsolationPlan::new(
        isolate_after,
        isolation.stop_timeout.to_std(),
        watchdog.timeout(),
    );
    if plan.within() > crate::report::protocol::MAX_PROMISE {
        if let Err(error) = Box::new(watchdog).disarm() {
            tracing::error!(%error, "the watchdog could not be stopped");
        }
        return not_armed(format!(
            "its promise ({}s: isolateAfter, twice isolation.stopTimeout and 70 s, the watchdog's timeout) is longer than a day, more than the controller takes",
            plan.within().as_secs()
        ));
    }
    let contact = Arc::new(
        ContactClock::persistent(&isolation.contact_file(), &settings.boot_id)
            .counting_failures(agent.metrics().state_write_failures("controller_contact")),
    );
    let (requests, requested) = watch::channel(None);
    let withdrawal = Withdrawal::new(board.clone());
    // A renewal counts from the read before it, so a slower read only brings the
    // deadline forward, and the API server gets one GET per node per interval, as many as
    // the kubelets' own renewals.
    let lease_every = crate::config::lease_read_interval(
        config.kubernetes.api_probe_interval,
        report_config.interval,
    )
    .to_std();
    let lease = agent.node_lease().map(|source| {
        Box::pin(follow_lease(
            source,
            contact.clone(),
            lease_every,
            config.kubernetes.api_probe_timeout.to_std(),
        )) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
    });
    let guardian = Guardian::new(
        plan,
        Box::new(watchdog),
        Arc::new(RebootNode),
        GuardianLinks {
            contact: contact.clone(),
            board,
            requests,
            withdrawal: withdrawal.clone(),
        },
        // The isolator checks its evidence every report interval.
        (3 * settings.interval).max(std::time::Duration::from_secs(10)),
    );
    Some(Armed {
        guardian,
        requests: requested,
        contact,
        withdrawal,
        lease,
    })
}

/// The isolator that follows the controller's instructions (see `crate::isolation`);
/// one that refuses them says why in its reports.
fn isolator(
    agent: &super::Agent,
    settings: &SenderSettings,
    board: Arc<ReportBoard>,
) -> Option<Isolator<LazySystemd, PodsCgroup>> {
    let config = agent.config();
    let isolation = &config.report.as_ref()?.isolation;
    let pods = agent.pods_cgroup();
    let refusal = isolation_refusal(
        isolation.enabled,
        config.dry_run,
        settings.over_tls(),
        pods.is_some(),
    );
    if let Some(why) = &refusal {
        tracing::info!(%why, "this agent does not isolate its node when the controller asks");
    }
    let bus = BusAddress::from_config(config.dbus_address.as_deref());
    Some(Isolator::new(
        IsolatorSettings {
            kubelet_unit: isolation.kubelet_unit.clone(),
            stop_timeout: isolation.stop_timeout.to_std(),
            state_file: isolation.state_file.clone(),
            boot_id: settings.boot_id.clone(),
            check_every: settings.interval,
            refusal,
            write_failures: agent.metrics().state_write_failures("isolation_record"),
        },
        LazySystemd::new(bus),
        pods,
        board,
    ))
}

/// Why this agent does not isolate its node when asked, if it does not.
fn isolation_refusal(
    enabled: bool,
    dry_run: bool,
    over_tls: bool,
    knows_pods: bool,
) -> Option<String> {
    if !enabled {
        return Some(
            "isolation is turned off on this node (report.isolation.enabled: false)".to_string(),
        );
    }
    if dry_run {
        return Some("dry-run mode: the agent stops nothing".to_string());
    }
    if !over_tls {
        return Some(
            "instructions are followed only over TLS, and report.controllerURL is plain http"
                .to_string(),
        );
    }
    if !knows_pods {
        return Some(
            "the agent knows no pods cgroup to isolate (standalone mode, or no cgroup tree)"
                .to_string(),
        );
    }
    None
}

/// The sender's settings from the configuration and this boot; `None` (logged) when
/// reports are off or cannot name their node and boot.
fn sender_settings(config: &AgentConfig, host: &Host) -> Option<SenderSettings> {
    let report = config.report.as_ref()?;
    let Some(node) = config.node_name.clone() else {
        tracing::error!(
            "report: no node name to report for (set nodeName or NODE_NAME); not reporting"
        );
        return None;
    };
    let boot_id = match host.boot_id() {
        Ok(id) => id.to_string(),
        Err(error) => {
            tracing::error!(%error, "report: cannot read this boot's id; not reporting");
            return None;
        }
    };
    let boot_time = match crate::report::sender::read_boot_time(&host.paths().proc_root) {
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
    use crate::shutdown::state::at;
    use crate::shutdown::state::{PhaseStatus, ShutdownState};

    const BOOT: &str = "this-boot";

    #[test]
    fn the_report_names_the_boot_found_under_the_configured_proc_root() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = dir.path().join("proc");
        std::fs::create_dir_all(proc_root.join("sys/kernel/random")).unwrap();
        std::fs::write(proc_root.join("sys/kernel/random/boot_id"), "fake-boot-1\n").unwrap();
        std::fs::write(proc_root.join("stat"), "cpu  1 2 3\nbtime 1700000000\n").unwrap();
        let yaml = format!(
            "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\nnodeName: worker-1\n\
             procRoot: {}\nreport:\n  controllerURL: http://127.0.0.1:9\n",
            proc_root.display()
        );
        let config =
            crate::config::from_yaml_str(&yaml, "agent.yaml", &Default::default()).unwrap();
        let settings = sender_settings(&config, &Host::detect(&config.paths)).expect("reports on");
        assert_eq!(settings.boot_id, "fake-boot-1");
        assert_eq!(
            settings.boot_time,
            Timestamp::from_second(1_700_000_000).unwrap()
        );

        // Without a boot id there is no report: a report must name its boot.
        std::fs::remove_file(proc_root.join("sys/kernel/random/boot_id")).unwrap();
        assert!(sender_settings(&config, &Host::detect(&config.paths)).is_none());
    }

    #[test]
    fn an_agent_isolates_its_node_only_in_kubernetes_mode_over_tls_for_real_and_when_allowed() {
        assert_eq!(isolation_refusal(true, false, true, true), None);
        for (enabled, dry_run, over_tls, knows_pods, says) in [
            (false, false, true, true, "report.isolation.enabled: false"),
            (true, true, true, true, "dry-run"),
            (true, false, false, true, "only over TLS"),
            (true, false, true, false, "no pods cgroup"),
        ] {
            let why = isolation_refusal(enabled, dry_run, over_tls, knows_pods).expect("refused");
            assert!(why.contains(says), "{why}");
        }
    }

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

    /// The status of a manager that finished the shutdown itself and released the lock.
    fn released(state: ShutdownState) -> ManagerStatus {
        ManagerStatus {
            lock_held: false,
            last_shutdown: Some(state),
            released_for_power_off: true,
            ..ManagerStatus::default()
        }
    }

    /// An agent draining through the API, not in dry-run mode.
    const THROUGH_API: Draining = Draining {
        dry_run: false,
        through_api: true,
    };

    #[test]
    fn a_shutdown_in_progress_reports_its_phases() {
        let mut state = three_phases();
        state.start_phase(0, at(1_763_900_001_000));
        state.end_phase(0, PhaseStatus::Completed, Vec::new(), at(1_763_900_004_000));
        let report = shutdown_report(&status(Some(state)), BOOT, THROUGH_API);
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
            state.end_phase(
                index,
                PhaseStatus::Skipped,
                Vec::new(),
                at(1_763_900_001_000),
            );
        }
        state.finish(1_763_900_002_000);
        state.about_to_power_off = true;
        let report = shutdown_report(&released(state.clone()), BOOT, THROUGH_API);
        assert_eq!(report.state, ShutdownPhase::Finished);
        assert_eq!(report.phases_done, 3);
        assert!(report.about_to_power_off);
        assert!(report.finished_at.is_some());
        // A restarted agent finds that record: the node did not power off after all.
        let report = shutdown_report(&status(Some(state)), BOOT, THROUGH_API);
        assert_eq!(report.state, ShutdownPhase::Finished);
        assert!(!report.about_to_power_off);
        assert!(!report.all_pods_stopped);

        let mut state = three_phases();
        state.cancel(1_763_900_002_000);
        assert_eq!(
            shutdown_report(&status(Some(state)), BOOT, THROUGH_API).state,
            ShutdownPhase::Cancelled
        );
    }

    /// Ends phase `index` with `status` and the pods that failed to stop.
    fn end(state: &mut ShutdownState, index: usize, status: PhaseStatus, failed: &[&str]) {
        let failed = failed.iter().map(|pod| pod.to_string()).collect();
        state.end_phase(index, status, failed, at(1_763_900_001_000));
    }

    #[test]
    fn every_pod_stopped_only_when_drained_through_the_api_from_a_full_list_and_each_phase_completed_or_had_no_pods()
     {
        let finished = |outcomes: [(PhaseStatus, &[&str]); 3]| {
            let mut state = three_phases();
            state.pods_listed = true;
            for (index, (status, failed)) in outcomes.into_iter().enumerate() {
                end(&mut state, index, status, failed);
            }
            state.finish(1_763_900_002_000);
            state.about_to_power_off = true;
            state
        };
        let stopped = |status: &ManagerStatus, draining| {
            shutdown_report(status, BOOT, draining).all_pods_stopped
        };
        let clean = finished([
            (PhaseStatus::Completed, &[]),
            (PhaseStatus::Skipped, &[]),
            (PhaseStatus::Completed, &[]),
        ]);
        assert!(stopped(&released(clean.clone()), THROUGH_API));
        // Dry-run: the phases ran, but nothing was stopped.
        let dry_run = Draining {
            dry_run: true,
            through_api: true,
        };
        assert!(!stopped(&released(clean.clone()), dry_run));
        // Standalone: workload cgroups were killed, which says nothing of the pods.
        let standalone = Draining {
            dry_run: false,
            through_api: false,
        };
        assert!(!stopped(&released(clean.clone()), standalone));
        // A restarted agent that found the record: not this process's drain.
        assert!(!stopped(&status(Some(clean.clone())), THROUGH_API));
        // The pods could not be listed: every phase was skipped, nothing was drained.
        let mut unlisted = clean;
        unlisted.pods_listed = false;
        assert!(!stopped(&released(unlisted), THROUGH_API));
        // A phase whose timer fired with pods still terminating.
        let timed_out = finished([
            (PhaseStatus::Completed, &[]),
            (PhaseStatus::TimedOut, &[]),
            (PhaseStatus::Completed, &[]),
        ]);
        let report = shutdown_report(&released(timed_out), BOOT, THROUGH_API);
        assert_eq!(report.state, ShutdownPhase::Finished);
        assert!(report.about_to_power_off);
        assert!(!report.all_pods_stopped);
        // A pod whose termination failed.
        let failed = finished([
            (PhaseStatus::Completed, &["default/web-0"]),
            (PhaseStatus::Completed, &[]),
            (PhaseStatus::Completed, &[]),
        ]);
        assert!(!stopped(&released(failed), THROUGH_API));
        // Not finished yet, or cancelled.
        let mut running = three_phases();
        running.pods_listed = true;
        end(&mut running, 0, PhaseStatus::Completed, &[]);
        assert!(!stopped(&released(running.clone()), THROUGH_API));
        running.cancel(1_763_900_002_000);
        assert!(!stopped(&released(running), THROUGH_API));
    }

    #[test]
    fn an_earlier_boots_record_says_nothing_about_this_one() {
        // Finished before the reboot: in this boot, no shutdown has happened.
        let mut state = three_phases();
        state.finish(1_763_900_002_000);
        let report = shutdown_report(&status(Some(state)), "the-next-boot", THROUGH_API);
        assert_eq!(report.state, ShutdownPhase::None);
        assert_eq!(report.phases_total, 0);
        assert!(report.lock_held, "the lock is this boot's");
        let mut abandoned = three_phases();
        abandoned.abandon();
        assert_eq!(
            shutdown_report(&status(Some(abandoned)), BOOT, THROUGH_API).state,
            ShutdownPhase::None
        );
        assert_eq!(
            shutdown_report(&status(None), BOOT, THROUGH_API),
            ShutdownReport {
                lock_held: true,
                ..ShutdownReport::default()
            }
        );
    }
}
