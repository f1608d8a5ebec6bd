//! The persisted shutdown record: what was planned, how far it got, and whether the node
//! is about to power off. Written atomically after every step so a restarted agent can
//! resume, and so a controller can tell a cleanly drained node from a lost one.

use prometheus_client::metrics::counter::Counter;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::plan::{PlannedPhase, PlannedPod, ShutdownPlan};

pub const STATE_FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ShutdownOutcome {
    InProgress,
    /// Every phase ran (or was skipped); the node is waiting for logind to power off.
    Finished,
    /// logind announced `PrepareForShutdown(false)` before the phases were done.
    Cancelled,
    /// The record belongs to an earlier boot that never finished it (power loss, crash).
    AbandonedByReboot,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PhaseStatus {
    Pending,
    Running,
    /// Every pod of the phase stopped before its timer.
    Completed,
    /// The phase timer fired with pods still terminating.
    TimedOut,
    /// No pods: the phase took no time.
    Skipped,
    Cancelled,
}

impl std::fmt::Display for PhaseStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PhaseStatus::Pending => "pending",
            PhaseStatus::Running => "running",
            PhaseStatus::Completed => "completed",
            PhaseStatus::TimedOut => "timed out",
            PhaseStatus::Skipped => "skipped (no pods)",
            PhaseStatus::Cancelled => "cancelled",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredPod {
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    pub grace_period_seconds: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseProgress {
    pub priority: i32,
    pub seconds: i64,
    pub pods: Vec<StoredPod>,
    pub status: PhaseStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_unix_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_unix_ms: Option<u64>,
    /// The same moments on the boot clock, which the phase's timer is measured on (a
    /// record written before these were kept has only the wall-clock ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_boot_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_boot_ms: Option<u64>,
    /// Pods whose termination failed (the error is logged).
    #[serde(default)]
    pub failed_pods: Vec<String>,
}

impl PhaseProgress {
    pub fn is_done(&self) -> bool {
        matches!(
            self.status,
            PhaseStatus::Completed | PhaseStatus::TimedOut | PhaseStatus::Skipped
        )
    }

    /// Records `now` as the phase's start on both clocks, unless it has started before
    /// (a resumed phase keeps its first start).
    fn mark_started(&mut self, now: ClockReading) {
        if self.started_unix_ms.is_none() {
            self.started_unix_ms = Some(now.unix_ms);
            self.started_boot_ms = Some(now.boot_ms);
        }
    }

    /// How long the phase took, once it has finished: on the boot clock, unaffected by
    /// a wall-clock jump meanwhile.
    pub fn duration_ms(&self) -> Option<u64> {
        match (self.started_boot_ms, self.finished_boot_ms) {
            (Some(started), Some(finished)) => Some(finished.saturating_sub(started)),
            _ => Some(self.finished_unix_ms?.saturating_sub(self.started_unix_ms?)),
        }
    }
}

/// One reading of the two clocks a shutdown keeps: the wall clock for the record people
/// read, and the boot clock (`CLOCK_BOOTTIME`) for its timers, which a wall-clock jump
/// must neither end early nor stretch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockReading {
    pub unix_ms: u64,
    pub boot_ms: u64,
}

/// Both clocks reading `ms` (tests).
#[cfg(test)]
pub(crate) fn at(ms: u64) -> ClockReading {
    ClockReading {
        unix_ms: ms,
        boot_ms: ms,
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownState {
    pub version: u32,
    /// `/proc/sys/kernel/random/boot_id` when the shutdown began.
    pub boot_id: String,
    pub start_unix_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_unix_ms: Option<u64>,
    pub total_seconds: i64,
    pub outcome: ShutdownOutcome,
    pub phases: Vec<PhaseProgress>,
    /// All phases finished and the delay lock was released: logind may power off now.
    pub about_to_power_off: bool,
    /// The pods to drain were listed when the shutdown began. When listing failed the
    /// plan is empty and every phase is skipped: nothing was drained. (A record written
    /// before this field existed reads `false`.)
    #[serde(default)]
    pub pods_listed: bool,
}

impl ShutdownState {
    pub fn begin(plan: &ShutdownPlan, boot_id: &str, now_unix_ms: u64) -> Self {
        ShutdownState {
            version: STATE_FORMAT_VERSION,
            boot_id: boot_id.to_string(),
            start_unix_ms: now_unix_ms,
            end_unix_ms: None,
            total_seconds: plan.total_seconds,
            outcome: ShutdownOutcome::InProgress,
            phases: plan.phases.iter().map(pending_phase).collect(),
            about_to_power_off: false,
            pods_listed: false,
        }
    }

    pub fn all_phases_finished(&self) -> bool {
        self.phases.iter().all(PhaseProgress::is_done)
    }

    /// Every pod of the plan stopped: the shutdown finished from a complete pod list,
    /// each phase completed or had no pods (none timed out), and no pod failed to stop.
    pub fn every_pod_stopped(&self) -> bool {
        self.pods_listed
            && self.outcome == ShutdownOutcome::Finished
            && self.phases.iter().all(|phase| {
                matches!(phase.status, PhaseStatus::Completed | PhaseStatus::Skipped)
                    && phase.failed_pods.is_empty()
            })
    }

    /// Whether a restarted agent on `boot_id` must carry on with this shutdown.
    pub fn needs_resume(&self, boot_id: &str) -> bool {
        self.outcome == ShutdownOutcome::InProgress && self.boot_id == boot_id
    }

    pub fn start_phase(&mut self, index: usize, now: ClockReading) {
        if let Some(phase) = self.phases.get_mut(index) {
            phase.status = PhaseStatus::Running;
            phase.mark_started(now);
        }
    }

    pub fn end_phase(
        &mut self,
        index: usize,
        status: PhaseStatus,
        failed_pods: Vec<String>,
        now: ClockReading,
    ) {
        if let Some(phase) = self.phases.get_mut(index) {
            phase.status = status;
            phase.mark_started(now);
            phase.finished_unix_ms = Some(now.unix_ms);
            phase.finished_boot_ms = Some(now.boot_ms);
            phase.failed_pods = failed_pods;
        }
    }

    pub fn finish(&mut self, now_unix_ms: u64) {
        self.outcome = ShutdownOutcome::Finished;
        self.end_unix_ms = Some(now_unix_ms);
    }

    pub fn cancel(&mut self, now_unix_ms: u64) {
        self.outcome = ShutdownOutcome::Cancelled;
        self.end_unix_ms = Some(now_unix_ms);
        for phase in &mut self.phases {
            if matches!(phase.status, PhaseStatus::Pending | PhaseStatus::Running) {
                phase.status = PhaseStatus::Cancelled;
            }
        }
    }

    pub fn abandon(&mut self) {
        if self.outcome == ShutdownOutcome::InProgress {
            self.outcome = ShutdownOutcome::AbandonedByReboot;
        }
    }

    /// A phase interrupted by an agent restart runs again with what is left of its timer,
    /// measured from when it first started; pods get at most that long. The timer runs
    /// on the boot clock (the record is resumed only within its boot), so a wall-clock
    /// jump between the start and the restart changes nothing; only a record from before
    /// boot times were kept falls back to the wall clock.
    pub fn remaining_budget_ms(&self, index: usize, now: ClockReading) -> u64 {
        let Some(phase) = self.phases.get(index) else {
            return 0;
        };
        let full = u64::try_from(phase.seconds.max(0))
            .unwrap_or(0)
            .saturating_mul(1000);
        let elapsed = match (phase.started_boot_ms, phase.started_unix_ms) {
            (Some(started), _) => now.boot_ms.saturating_sub(started),
            (None, Some(started)) => now.unix_ms.saturating_sub(started),
            (None, None) => 0,
        };
        full.saturating_sub(elapsed)
    }
}

fn pending_phase(phase: &PlannedPhase) -> PhaseProgress {
    PhaseProgress {
        priority: phase.priority,
        seconds: phase.seconds,
        pods: phase
            .pods
            .iter()
            .map(|pod| StoredPod {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                grace_period_seconds: pod.grace_period_seconds,
            })
            .collect(),
        status: PhaseStatus::Pending,
        started_unix_ms: None,
        finished_unix_ms: None,
        started_boot_ms: None,
        finished_boot_ms: None,
        failed_pods: Vec::new(),
    }
}

impl From<&StoredPod> for PlannedPod {
    fn from(pod: &StoredPod) -> Self {
        PlannedPod {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            grace_period_seconds: pod.grace_period_seconds,
        }
    }
}

/// Values for the shutdown gauges; zero means "never", as the kubelet exports them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ShutdownMetrics {
    pub start_time_seconds: f64,
    pub end_time_seconds: f64,
    /// (phase priority, seconds the phase took) for every phase that ran or was skipped.
    pub phase_durations: Vec<(i32, f64)>,
}

pub fn metrics_from_state(state: Option<&ShutdownState>) -> ShutdownMetrics {
    let Some(state) = state else {
        return ShutdownMetrics::default();
    };
    ShutdownMetrics {
        start_time_seconds: state.start_unix_ms as f64 / 1000.0,
        end_time_seconds: state.end_unix_ms.map_or(0.0, |ms| ms as f64 / 1000.0),
        phase_durations: state
            .phases
            .iter()
            .filter_map(|phase| Some((phase.priority, phase.duration_ms()? as f64 / 1000.0)))
            .collect(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot read shutdown state {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("shutdown state {path} is corrupt (delete it to start afresh): {message}")]
    Corrupt { path: String, message: String },
    #[error("cannot write shutdown state {path}: {error}")]
    Write { path: String, error: std::io::Error },
}

/// The state file on disk.
#[derive(Debug, Clone)]
pub struct StateStore {
    path: PathBuf,
    /// Counts every save that failed (the agent's
    /// `nodekeeper_state_write_errors_total{file="shutdown_state"}`).
    failures: Counter,
}

impl StateStore {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        StateStore {
            path: path.into(),
            failures: Counter::default(),
        }
    }

    /// Count every failed save in `failures`.
    pub fn counting_failures(mut self, failures: Counter) -> Self {
        self.failures = failures;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `None` when no shutdown was ever recorded.
    pub fn load(&self) -> Result<Option<ShutdownState>, StateError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(StateError::Read {
                    path: self.path.display().to_string(),
                    error,
                });
            }
        };
        let state: ShutdownState =
            serde_json::from_str(&text).map_err(|e| StateError::Corrupt {
                path: self.path.display().to_string(),
                message: e.to_string(),
            })?;
        if state.version != STATE_FORMAT_VERSION {
            return Err(StateError::Corrupt {
                path: self.path.display().to_string(),
                message: format!(
                    "version {} is not the supported {STATE_FORMAT_VERSION}",
                    state.version
                ),
            });
        }
        Ok(Some(state))
    }

    /// Temp file in the same directory, fsync, rename, fsync the directory: a reader sees
    /// the old record or the new one, never a torn one, even across power loss.
    /// [`StateStore::save`] on the blocking pool: the fsync can take seconds on a disk
    /// starved by memory pressure, and the runtime must keep serving D-Bus, the API and
    /// `/healthz` meanwhile.
    pub async fn save_in_background(&self, state: &ShutdownState) -> Result<(), StateError> {
        let (store, state) = (self.clone(), state.clone());
        tokio::task::spawn_blocking(move || store.save(&state))
            .await
            .unwrap_or_else(|error| {
                Err(StateError::Write {
                    path: self.path.display().to_string(),
                    error: std::io::Error::other(format!("the save task failed: {error}")),
                })
            })
    }

    pub fn save(&self, state: &ShutdownState) -> Result<(), StateError> {
        let write_error = |error| StateError::Write {
            path: self.path.display().to_string(),
            error,
        };
        let written = crate::state_file::write_json(&self.path, state);
        if written.is_err() {
            self.failures.inc();
        }
        written.map_err(write_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::Pod;
    use crate::shutdown::plan::{PhaseSpec, plan};

    fn sample_state() -> ShutdownState {
        let pods = [Pod {
            namespace: "default".into(),
            name: "web-1".into(),
            uid: Some("u-1".into()),
            ..Pod::default()
        }];
        let phases = [
            PhaseSpec {
                priority: 0,
                seconds: 20,
            },
            PhaseSpec {
                priority: 2_000_000_000,
                seconds: 10,
            },
        ];
        ShutdownState::begin(&plan(&phases, &pods), "boot-a", 1_000)
    }

    #[test]
    fn round_trips_through_the_file_and_a_missing_file_is_no_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("sub/graceful_shutdown_state.json"));
        assert_eq!(store.load().unwrap(), None);
        let mut state = sample_state();
        state.start_phase(0, at(1_500));
        store.save(&state).unwrap();
        assert_eq!(store.load().unwrap(), Some(state));
        let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "{leftovers:?}");
    }

    #[test]
    fn a_corrupt_file_is_a_clear_error_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        std::fs::write(&path, "{\"version\": 1, \"bootId\": ").unwrap();
        let error = StateStore::new(&path).load().unwrap_err().to_string();
        assert!(
            error.contains("state.json") && error.contains("corrupt"),
            "{error}"
        );
    }

    #[test]
    fn the_record_tells_a_controller_what_happened() {
        let mut state = sample_state();
        state.start_phase(0, at(2_000));
        state.end_phase(0, PhaseStatus::Completed, vec![], at(4_000));
        state.end_phase(1, PhaseStatus::Skipped, vec![], at(4_000));
        assert!(state.all_phases_finished());
        state.finish(4_000);
        state.about_to_power_off = true;
        let json: serde_json::Value = serde_json::to_value(&state).unwrap();
        assert_eq!(json["outcome"], "finished");
        assert_eq!(json["aboutToPowerOff"], true);
        assert_eq!(json["phases"][0]["status"], "completed");
        assert_eq!(json["phases"][0]["pods"][0]["uid"], "u-1");
        assert_eq!(json["phases"][1]["status"], "skipped");
        let metrics = metrics_from_state(Some(&state));
        assert_eq!(metrics.start_time_seconds, 1.0);
        assert_eq!(metrics.end_time_seconds, 4.0);
        assert_eq!(
            metrics.phase_durations,
            vec![(0, 2.0), (2_000_000_000, 0.0)]
        );
        assert_eq!(metrics_from_state(None), ShutdownMetrics::default());
    }

    #[test]
    fn only_an_unfinished_shutdown_of_this_boot_is_resumed() {
        let mut state = sample_state();
        assert!(state.needs_resume("boot-a"));
        assert!(!state.needs_resume("boot-b"));
        state.cancel(3_000);
        assert!(!state.needs_resume("boot-a"));
        assert_eq!(state.phases[0].status, PhaseStatus::Cancelled);
    }

    #[test]
    fn an_interrupted_phase_resumes_with_what_is_left_of_its_timer() {
        let mut state = sample_state();
        assert_eq!(state.remaining_budget_ms(0, at(50_000)), 20_000);
        state.start_phase(0, at(10_000));
        assert_eq!(state.remaining_budget_ms(0, at(15_500)), 14_500);
        assert_eq!(state.remaining_budget_ms(0, at(90_000)), 0);
    }

    #[test]
    fn a_wall_clock_jump_between_the_start_and_the_restart_changes_nothing() {
        let started = ClockReading {
            unix_ms: 1_800_000_000_000,
            boot_ms: 40_000,
        };
        // 5.5 s later on the boot clock; the wall clock was set an hour either way.
        for wall_jump in [-3_600_000i64, 0, 3_600_000] {
            let mut state = sample_state();
            state.start_phase(0, started);
            let resumed = ClockReading {
                unix_ms: started.unix_ms.saturating_add_signed(5_500 + wall_jump),
                boot_ms: 45_500,
            };
            assert_eq!(state.remaining_budget_ms(0, resumed), 14_500, "{wall_jump}");
            state.end_phase(0, PhaseStatus::Completed, vec![], resumed);
            assert_eq!(state.phases[0].duration_ms(), Some(5_500));
        }
        // A record written before boot times were kept counts on the wall clock.
        let mut state = sample_state();
        state.start_phase(0, started);
        state.phases[0].started_boot_ms = None;
        let resumed = ClockReading {
            unix_ms: started.unix_ms + 5_500,
            boot_ms: 1,
        };
        assert_eq!(state.remaining_budget_ms(0, resumed), 14_500);
    }

    #[test]
    fn a_huge_phase_from_config_or_a_corrupt_state_file_saturates_instead_of_overflowing() {
        let mut state = sample_state();
        state.phases[0].seconds = i64::MAX;
        assert_eq!(state.remaining_budget_ms(0, at(50_000)), u64::MAX);
        state.start_phase(0, at(u64::MAX));
        assert_eq!(state.remaining_budget_ms(0, at(0)), u64::MAX);
        assert_eq!(state.remaining_budget_ms(0, at(u64::MAX)), u64::MAX);
    }
}
