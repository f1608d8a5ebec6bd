//! The agent as a systemd service (`Type=notify`): when it tells systemd it is ready,
//! what `systemctl status` shows on its Status line, and the watchdog. What is said is a
//! pure function of the agent's state ([`StatusParts`]); `systemd::notify` sends it.
//!
//! Ready means protecting the node: the first decision cycle has run (signals read,
//! thresholds evaluated, kernel notifications armed before it), and, where graceful
//! shutdown is configured, the logind delay lock is held or the first attempt to take it
//! has failed (the Status line then says why; the agent protects the node's memory all
//! the same, and keeps trying). [`READY_AT_THE_LATEST`] bounds the wait.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::eviction::Decision;
use crate::shutdown::manager::ManagerStatus;
use crate::systemd::notify::ServiceManagerLink;

/// Ready is said at the latest this long after start, whatever is still missing (a
/// logind that neither answers nor refuses), well inside systemd's default 90 s start
/// timeout.
pub const READY_AT_THE_LATEST: Duration = Duration::from_secs(15);

/// What the Status line is made of.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusParts {
    /// How the agent evicts.
    pub mode: String,
    /// The last cycle's thresholds and the evictions so far; `None` before the first cycle.
    pub pressure: Option<String>,
    /// The delay lock and any shutdown; `None` while graceful shutdown is off.
    pub shutdown: Option<String>,
    /// Graceful shutdown is on and the first attempt at the lock has not ended yet.
    pub awaiting_lock: bool,
    /// Nothing is evicted: the same pod would be chosen again each cycle, so evictions
    /// are not counted, only the latest named.
    pub dry_run: bool,
    pub evictions: u64,
    pub last_eviction: Option<String>,
}

impl StatusParts {
    /// Everything readiness waits for is there.
    pub fn complete(&self) -> bool {
        self.pressure.is_some() && !self.awaiting_lock
    }

    /// The Status line.
    pub fn line(&self) -> String {
        let mut parts = vec![self.mode.clone()];
        match &self.pressure {
            Some(pressure) => parts.push(pressure.clone()),
            None => parts.push("reading the node's signals".to_string()),
        }
        match (&self.last_eviction, self.dry_run) {
            (Some(pod), true) => parts.push(format!("would evict {pod}")),
            (Some(pod), false) => parts.push(format!(
                "{} evicted since start, last {pod}",
                self.evictions
            )),
            (None, _) => {}
        }
        if let Some(shutdown) = &self.shutdown {
            parts.push(shutdown.clone());
        }
        parts.join("; ")
    }
}

/// How the agent evicts, in words.
pub fn mode_text(through_api: bool, dry_run: bool) -> String {
    let mode = if through_api {
        "evicting through the Kubernetes API"
    } else {
        "evicting standalone workloads"
    };
    if dry_run {
        format!("dry run ({mode} only in the log)")
    } else {
        mode.to_string()
    }
}

/// The thresholds met after their grace periods, in words.
pub fn pressure_text(decision: &Decision) -> String {
    let met: Vec<String> = decision
        .thresholds_met
        .iter()
        .map(|threshold| threshold.signal.to_string())
        .collect();
    if met.is_empty() {
        "no eviction threshold met".to_string()
    } else {
        format!("threshold met: {}", met.join(", "))
    }
}

/// The delay lock and the shutdown, in words.
pub fn shutdown_text(status: &ManagerStatus) -> String {
    if status.released_for_power_off {
        "pods drained, delay lock released for the power-off".to_string()
    } else if status.shutting_down {
        "node shutting down: draining pods by priority".to_string()
    } else if status.lock_held {
        "logind delay lock held".to_string()
    } else if let Some(problem) = &status.lock_problem {
        format!("no logind delay lock ({problem})")
    } else {
        "taking the logind delay lock".to_string()
    }
}

/// Whether the lock's first attempt has ended, one way or the other.
fn lock_settled(status: &ManagerStatus) -> bool {
    status.lock_held
        || status.lock_problem.is_some()
        || status.shutting_down
        || status.released_for_power_off
}

/// Keeps the Status line and readiness, and sends them when they change.
pub struct ServiceReporter {
    link: Arc<ServiceManagerLink>,
    state: Mutex<ReporterState>,
}

#[derive(Debug, Default)]
struct ReporterState {
    parts: StatusParts,
    ready_sent: bool,
    last_line: Option<String>,
}

impl ServiceReporter {
    pub fn new(link: Arc<ServiceManagerLink>, through_api: bool, dry_run: bool) -> ServiceReporter {
        ServiceReporter {
            link,
            state: Mutex::new(ReporterState {
                parts: StatusParts {
                    mode: mode_text(through_api, dry_run),
                    dry_run,
                    ..StatusParts::default()
                },
                ..ReporterState::default()
            }),
        }
    }

    pub fn link(&self) -> &Arc<ServiceManagerLink> {
        &self.link
    }

    /// Graceful shutdown is on: readiness waits for the first attempt at the lock.
    pub fn expect_lock(&self) {
        self.update(|parts| {
            parts.awaiting_lock = true;
            parts.shutdown = Some(shutdown_text(&ManagerStatus::default()));
        });
    }

    /// A decision cycle ended; `evicted` lists the pods it evicted (or would have).
    pub fn cycle(&self, decision: &Decision, evicted: &[String]) {
        if !self.link.is_connected() {
            return; // no service manager to tell, no words to make each cycle
        }
        let pressure = pressure_text(decision);
        self.update(|parts| {
            parts.pressure = Some(pressure);
            if !parts.dry_run {
                parts.evictions += evicted.len() as u64;
            }
            if let Some(last) = evicted.last() {
                parts.last_eviction = Some(last.clone());
            }
        });
    }

    /// The shutdown manager's status changed.
    pub fn shutdown(&self, status: &ManagerStatus) {
        let text = shutdown_text(status);
        let settled = lock_settled(status);
        self.update(|parts| {
            parts.shutdown = Some(text);
            parts.awaiting_lock &= !settled;
        });
    }

    /// Say ready now, with whatever is still missing on the Status line.
    pub fn ready_anyway(&self) {
        let mut state = self.lock();
        if !state.ready_sent && self.link.is_connected() {
            tracing::warn!(
                status = %state.parts.line(),
                "telling systemd the agent is ready before everything it waits for is there"
            );
            self.send_ready(&mut state);
        }
    }

    pub fn stopping(&self) {
        self.link.stopping("stopping");
    }

    fn update(&self, change: impl FnOnce(&mut StatusParts)) {
        let mut state = self.lock();
        change(&mut state.parts);
        if !state.ready_sent {
            if state.parts.complete() {
                self.send_ready(&mut state);
            }
            return;
        }
        let line = state.parts.line();
        if state.last_line.as_deref() != Some(line.as_str()) {
            self.link.status(&line);
            state.last_line = Some(line);
        }
    }

    fn send_ready(&self, state: &mut ReporterState) {
        let line = state.parts.line();
        self.link.ready(&line);
        if self.link.is_connected() {
            tracing::info!(status = %line, "told systemd the agent is ready");
        }
        state.ready_sent = true;
        state.last_line = Some(line);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReporterState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts() -> StatusParts {
        StatusParts {
            mode: mode_text(false, false),
            ..StatusParts::default()
        }
    }

    #[test]
    fn ready_waits_for_the_first_cycle_and_the_locks_first_attempt() {
        let mut parts = parts();
        assert!(!parts.complete(), "no cycle yet");
        parts.pressure = Some("no eviction threshold met".to_string());
        assert!(
            parts.complete(),
            "no graceful shutdown: the cycle is enough"
        );
        parts.awaiting_lock = true;
        assert!(!parts.complete());
    }

    #[test]
    fn the_lock_has_settled_when_held_or_refused_not_before() {
        let mut status = ManagerStatus::default();
        assert!(!lock_settled(&status));
        status.lock_problem = Some("logind unreachable".to_string());
        assert!(lock_settled(&status));
        let held = ManagerStatus {
            lock_held: true,
            ..ManagerStatus::default()
        };
        assert!(lock_settled(&held));
    }

    #[test]
    fn the_status_line_reads_as_a_sentence_of_parts() {
        let mut parts = parts();
        assert_eq!(
            parts.line(),
            "evicting standalone workloads; reading the node's signals"
        );
        parts.pressure = Some("threshold met: memory.available".to_string());
        parts.evictions = 2;
        parts.last_eviction = Some("default/web".to_string());
        parts.shutdown = Some(shutdown_text(&ManagerStatus {
            lock_held: true,
            ..ManagerStatus::default()
        }));
        assert_eq!(
            parts.line(),
            "evicting standalone workloads; threshold met: memory.available; 2 evicted since start, last default/web; logind delay lock held"
        );
        assert_eq!(
            mode_text(true, true),
            "dry run (evicting through the Kubernetes API only in the log)"
        );
    }

    /// A service manager's socket and a reporter talking to it.
    fn reporter(
        dry_run: bool,
    ) -> (
        tempfile::TempDir,
        std::os::unix::net::UnixDatagram,
        ServiceReporter,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        socket.set_nonblocking(true).unwrap();
        let link = ServiceManagerLink::to(crate::systemd::notify::NotifyTarget::Path(path), None);
        (
            dir,
            socket,
            ServiceReporter::new(Arc::new(link), false, dry_run),
        )
    }

    /// The messages sent so far.
    fn sent(socket: &std::os::unix::net::UnixDatagram) -> Vec<String> {
        let mut messages = Vec::new();
        let mut buffer = [0u8; 1024];
        while let Ok(length) = socket.recv(&mut buffer) {
            messages.push(String::from_utf8_lossy(&buffer[..length]).into_owned());
        }
        messages
    }

    fn memory_pressure() -> Decision {
        let threshold = crate::config::Threshold {
            signal: crate::signal_names::Signal::MemoryAvailable,
            value: crate::config::ThresholdValue::Percentage(0.1),
            grace_period: crate::config::GoDuration::from_secs(0),
            min_reclaim: None,
        };
        Decision {
            thresholds_met: vec![threshold],
            ..Decision::default()
        }
    }

    #[test]
    fn ready_is_said_once_when_complete_then_the_status_only_when_it_changes() {
        let (_dir, socket, reporter) = reporter(false);
        reporter.expect_lock();
        reporter.cycle(&Decision::default(), &[]);
        assert!(
            sent(&socket).is_empty(),
            "not ready while the lock's first attempt runs"
        );
        reporter.shutdown(&ManagerStatus {
            lock_held: true,
            ..ManagerStatus::default()
        });
        assert_eq!(
            sent(&socket),
            vec![
                "READY=1\nSTATUS=evicting standalone workloads; no eviction threshold met; logind delay lock held"
            ]
        );
        reporter.cycle(&Decision::default(), &[]);
        assert!(
            sent(&socket).is_empty(),
            "an unchanged status is not sent again"
        );
        reporter.cycle(&memory_pressure(), &["default/web".to_string()]);
        assert_eq!(
            sent(&socket),
            vec![
                "STATUS=evicting standalone workloads; threshold met: memory.available; 1 evicted since start, last default/web; logind delay lock held"
            ]
        );
        reporter.ready_anyway();
        assert!(sent(&socket).is_empty(), "ready only once");
    }

    #[test]
    fn ready_anyway_says_ready_with_what_is_missing() {
        let (_dir, socket, reporter) = reporter(false);
        reporter.expect_lock();
        reporter.cycle(&Decision::default(), &[]);
        reporter.ready_anyway();
        assert_eq!(
            sent(&socket),
            vec![
                "READY=1\nSTATUS=evicting standalone workloads; no eviction threshold met; taking the logind delay lock"
            ]
        );
    }

    #[test]
    fn a_dry_run_names_the_pod_it_would_evict_without_counting_each_cycle() {
        let (_dir, socket, reporter) = reporter(true);
        for _ in 0..3 {
            reporter.cycle(&memory_pressure(), &["default/web".to_string()]);
        }
        assert_eq!(
            sent(&socket),
            vec![
                "READY=1\nSTATUS=dry run (evicting standalone workloads only in the log); threshold met: memory.available; would evict default/web"
            ]
        );
    }

    #[test]
    fn the_shutdown_part_follows_the_managers_state() {
        let problem = ManagerStatus {
            lock_problem: Some("cannot connect to the D-Bus system bus".to_string()),
            ..ManagerStatus::default()
        };
        assert_eq!(
            shutdown_text(&problem),
            "no logind delay lock (cannot connect to the D-Bus system bus)"
        );
        let draining = ManagerStatus {
            shutting_down: true,
            ..ManagerStatus::default()
        };
        assert_eq!(
            shutdown_text(&draining),
            "node shutting down: draining pods by priority"
        );
        let released = ManagerStatus {
            shutting_down: true,
            released_for_power_off: true,
            ..ManagerStatus::default()
        };
        assert_eq!(
            shutdown_text(&released),
            "pods drained, delay lock released for the power-off"
        );
    }
}
