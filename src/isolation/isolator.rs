//! The isolator: follows the controller's instructions from the answers to the agent's
//! reports, carries out an isolation (the kubelet's unit masked for this boot and
//! stopped, then every pod process killed until none is left), keeps it in the state
//! file, checks the evidence again every report interval, and posts what it finds to the
//! report board. It ends an isolation when the controller says so.

use prometheus_client::metrics::counter::Counter;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;

use super::guardian::SelfRequest;
use super::pods::PodProcesses;
use super::record::{
    Evidence, IsolationRecord, Moment, RecordPhase, Refused, Step, report, step_for,
};
use crate::report::protocol::Instruction;
use crate::report::{IsolationBootTimes, ReportBoard};
use crate::systemd::ServiceManager;

/// The request number of an isolation the agent began by itself (the controller's
/// requests are never 0, so its next request adopts this isolation).
const SELF_REQUEST: u64 = 0;

/// Now, on the wall and the boot clocks.
fn read_clocks() -> Moment {
    Moment {
        wall: Timestamp::now(),
        since_boot: crate::boot_clock::since_boot(),
    }
}

/// The guardian's next request to isolate; pending for ever without a guardian, or once
/// it is gone.
async fn next_request(requests: &mut Option<watch::Receiver<SelfRequest>>) -> Option<String> {
    let Some(receiver) = requests else {
        return std::future::pending().await;
    };
    if receiver.changed().await.is_err() {
        *requests = None;
        return None;
    }
    receiver.borrow_and_update().clone()
}

/// How long a kubelet that did not stop in time gets after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How often a stop is looked at.
const POLL: Duration = Duration::from_millis(100);
/// How often pod processes that survived are killed again while waiting.
const KILL_AGAIN: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct IsolatorSettings {
    pub kubelet_unit: String,
    /// How long the kubelet may take to stop, and then the pod processes to exit.
    pub stop_timeout: Duration,
    pub state_file: PathBuf,
    pub boot_id: String,
    /// How often an isolation's evidence is checked again (the report interval).
    pub check_every: Duration,
    /// Why this agent never isolates its node; `None`: it does.
    pub refusal: Option<String>,
    /// Counts every failed write of the state file.
    pub write_failures: Counter,
}

pub struct Isolator<M, P> {
    settings: IsolatorSettings,
    systemd: M,
    pods: Option<Arc<P>>,
    board: Arc<ReportBoard>,
    record: Option<IsolationRecord>,
    evidence: Option<Evidence>,
    /// The last isolate instruction this agent refused.
    refused: Option<Refused>,
    /// The self-isolation guardian's requests (see `super::guardian`), when armed.
    self_requests: Option<watch::Receiver<SelfRequest>>,
}

impl<M: ServiceManager, P: PodProcesses> Isolator<M, P> {
    /// An isolator with the record this boot left in the state file, if any.
    pub fn new(
        settings: IsolatorSettings,
        systemd: M,
        pods: Option<Arc<P>>,
        board: Arc<ReportBoard>,
    ) -> Self {
        let record = load(&settings);
        let isolator = Isolator {
            settings,
            systemd,
            pods,
            board,
            record,
            evidence: None,
            refused: None,
            self_requests: None,
        };
        isolator.publish();
        isolator
    }

    /// Also follows the self-isolation guardian's requests: isolate the node when the
    /// controller can no longer hear it.
    pub fn with_self_requests(mut self, requests: watch::Receiver<SelfRequest>) -> Self {
        self.self_requests = Some(requests);
        self
    }

    /// The current record, for tests and the agent's status.
    pub fn record(&self) -> Option<&IsolationRecord> {
        self.record.as_ref()
    }

    /// Follows `instructions` (the latest answer's) until the sender ends; the agent
    /// aborts it when it stops (a record under way is resumed by the next agent).
    pub async fn run(mut self, mut instructions: watch::Receiver<Vec<Instruction>>) {
        if let Some(record) = &self.record {
            tracing::warn!(phase = ?record.phase, since = %record.since, file = %self.settings.state_file.display(), "this boot's node isolation is kept from before the agent restarted");
            if record.phase == RecordPhase::Isolating {
                let (reason, request) = (record.reason.clone(), record.request);
                self.isolate(&reason, request).await;
            } else {
                self.check().await;
            }
        }
        let mut ticker = tokio::time::interval(self.settings.check_every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut own = self.self_requests.take();
        loop {
            tokio::select! {
                request = next_request(&mut own) => {
                    if let Some(reason) = request {
                        self.isolate_by_itself(&reason).await;
                    }
                }
                changed = instructions.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let current = instructions.borrow_and_update().clone();
                    self.follow(&current).await;
                }
                _ = ticker.tick() => {
                    // Again every interval: a failed isolation is retried after a pause
                    // while the controller still asks, and the evidence is checked.
                    let current = instructions.borrow().clone();
                    self.follow(&current).await;
                    if self.record.is_some() {
                        self.check().await;
                    }
                }
            }
        }
    }

    /// The guardian's request: isolate the node unless it is (or is being) isolated.
    pub async fn isolate_by_itself(&mut self, reason: &str) {
        if self
            .record
            .as_ref()
            .is_some_and(|r| matches!(r.phase, RecordPhase::Isolating | RecordPhase::Isolated))
        {
            return;
        }
        self.isolate(reason, SELF_REQUEST).await;
    }

    /// Acts on the latest answer's instructions.
    pub async fn follow(&mut self, instructions: &[Instruction]) {
        if !instructions
            .iter()
            .any(|i| matches!(i, Instruction::Isolate { .. }))
            && self.refused.take().is_some()
        {
            // The controller no longer asks: nothing refused any more.
            self.publish();
        }
        for instruction in instructions {
            let now = read_clocks();
            let step = step_for(
                self.record.as_ref(),
                instruction,
                self.settings.refusal.as_deref(),
                now,
            );
            match step {
                Step::Nothing => {}
                Step::Refuse(why) => {
                    let request = match instruction {
                        Instruction::Isolate { request, .. } => *request,
                        Instruction::EndIsolation => 0,
                    };
                    if self.refused.as_ref().is_none_or(|r| r.request != request) {
                        tracing::warn!(%why, "the controller asks this node to isolate itself; refused");
                        self.refused = Some(Refused {
                            why,
                            since: now.wall,
                            request,
                        });
                        self.publish();
                    }
                }
                Step::Isolate { reason, request } => self.isolate(&reason, request).await,
                Step::Adopt { request } => {
                    if let Some(record) = self.record.as_mut() {
                        record.request = request;
                    }
                    self.save();
                    self.publish();
                }
                Step::End => self.end().await,
            }
        }
    }

    /// Stops the kubelet and kills every pod process; the record says how it went.
    pub async fn isolate(&mut self, reason: &str, request: u64) {
        let now = read_clocks();
        let mut record = self
            .record
            .take()
            .unwrap_or_else(|| IsolationRecord::new(&self.settings.boot_id, reason, request, now));
        record.request = request;
        record.enter(RecordPhase::Isolating, None, now);
        self.record = Some(record);
        self.refused = None;
        self.save();
        self.publish();
        let unit = self.settings.kubelet_unit.clone();
        // The log says who asked: an operator reading it after a self-isolation must not
        // go looking for a controller's instruction that never came.
        let asked = if request == SELF_REQUEST {
            "by itself"
        } else {
            "on the controller's instruction"
        };
        tracing::warn!(%reason, %unit, "isolating the node {asked}: the kubelet is stopped (and masked for this boot) and every pod process killed");
        let started = Instant::now();
        let done = self.stop_kubelet_and_pods().await;
        let evidence = self.gather().await;
        let verdict = done.and_then(|()| evidence.holds(&unit));
        self.evidence = Some(evidence);
        let now = read_clocks();
        if let Some(record) = self.record.as_mut() {
            match verdict {
                Ok(()) => {
                    record.enter(RecordPhase::Isolated, None, now);
                    tracing::warn!(took = ?started.elapsed(), %unit, "the node is isolated: the kubelet is stopped and masked, no pod process is left");
                }
                Err(message) => {
                    let next = if request == SELF_REQUEST {
                        "the agent resets it"
                    } else {
                        "the controller falls back to its fence"
                    };
                    tracing::error!(%message, "the node could not be isolated; {next}");
                    record.enter(RecordPhase::Failed, Some(message), now);
                }
            }
        }
        self.save();
        self.publish();
    }

    /// The kubelet stopped first, so that no killed container is started again, then
    /// every pod process.
    async fn stop_kubelet_and_pods(&self) -> Result<(), String> {
        self.stop_kubelet().await?;
        self.kill_pods().await
    }

    /// The kubelet's unit masked for this boot (nothing starts it again, not even its own
    /// `Restart=`), then stopped, within the stop timeout (then SIGKILL).
    async fn stop_kubelet(&self) -> Result<(), String> {
        let unit = &self.settings.kubelet_unit;
        let state = bounded(self.systemd.unit_state(unit)).await?;
        if state.is_missing() {
            return Err(format!(
                "the kubelet's unit {unit} does not exist on this node (report.isolation.kubeletUnit)"
            ));
        }
        bounded_by(RELOAD_TIMEOUT, self.systemd.mask(unit)).await?;
        bounded(self.systemd.stop(unit)).await?;
        if self.wait_stopped(self.settings.stop_timeout).await? {
            return Ok(());
        }
        tracing::warn!(%unit, timeout = ?self.settings.stop_timeout, "the kubelet did not stop in time; killing it");
        bounded(self.systemd.kill(unit, libc::SIGKILL)).await?;
        if self.wait_stopped(KILL_WAIT).await? {
            return Ok(());
        }
        let state = bounded(self.systemd.unit_state(unit)).await?;
        Err(format!(
            "{unit} did not stop within {:?} and SIGKILL: it is {state}",
            self.settings.stop_timeout
        ))
    }

    async fn wait_stopped(&self, limit: Duration) -> Result<bool, String> {
        let give_up = Instant::now() + limit;
        loop {
            let state = bounded(self.systemd.unit_state(&self.settings.kubelet_unit)).await?;
            if state.is_stopped() {
                return Ok(true);
            }
            if Instant::now() >= give_up {
                return Ok(false);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Every pod process killed, again each second, until none is left or the stop
    /// timeout passes.
    async fn kill_pods(&self) -> Result<(), String> {
        let Some(pods) = self.pods.clone() else {
            return Err("no pods cgroup is known (standalone mode)".to_string());
        };
        let give_up = Instant::now() + self.settings.stop_timeout;
        let mut signalled = 0;
        loop {
            let killer = pods.clone();
            signalled += blocking(move || killer.kill_all()).await?;
            let round = Instant::now() + KILL_AGAIN;
            loop {
                let counter = pods.clone();
                let left = blocking(move || counter.count()).await?;
                if left == 0 {
                    tracing::info!(signalled, "every pod process is gone");
                    return Ok(());
                }
                if Instant::now() >= give_up {
                    return Err(format!(
                        "{left} pod process(es) still run {:?} after SIGKILL",
                        self.settings.stop_timeout
                    ));
                }
                if Instant::now() >= round {
                    break;
                }
                tokio::time::sleep(POLL).await;
            }
        }
    }

    /// What the node shows now.
    async fn gather(&self) -> Evidence {
        let unit = &self.settings.kubelet_unit;
        let (kubelet_stopped, kubelet_state) = match bounded(self.systemd.unit_state(unit)).await {
            Ok(state) => (state.is_stopped() && state.is_masked(), state.to_string()),
            Err(error) => (false, format!("unknown ({error})")),
        };
        let pod_processes = match self.pods.clone() {
            Some(pods) => blocking(move || pods.count()).await,
            None => Err("no pods cgroup is known (standalone mode)".to_string()),
        };
        Evidence {
            checked_at: Timestamp::now(),
            checked_since_boot: crate::boot_clock::since_boot(),
            kubelet_stopped,
            kubelet_state,
            pod_processes,
        }
    }

    /// The evidence again. An isolated node whose evidence slipped (a pod process
    /// appeared, the kubelet runs) is put right once; what still does not hold fails it.
    /// A failed isolation whose evidence holds now is isolated after all.
    pub async fn check(&mut self) {
        let Some(phase) = self.record.as_ref().map(|r| r.phase) else {
            return;
        };
        if phase == RecordPhase::Isolating {
            return;
        }
        let unit = self.settings.kubelet_unit.clone();
        let mut evidence = self.gather().await;
        if phase == RecordPhase::Isolated
            && let Err(wrong) = evidence.holds(&unit)
        {
            // Reported at once, so no report claims the old evidence while the repair
            // runs.
            self.evidence = Some(evidence.clone());
            self.publish();
            tracing::warn!(%wrong, "the node's isolation slipped; putting it right");
            if let Err(error) = self.stop_kubelet_and_pods().await {
                tracing::warn!(%error, "the isolation could not be put right");
            }
            evidence = self.gather().await;
        }
        let verdict = evidence.holds(&unit);
        let changed = self.evidence.as_ref().is_none_or(|before| {
            (before.kubelet_stopped, &before.pod_processes)
                != (evidence.kubelet_stopped, &evidence.pod_processes)
        });
        self.evidence = Some(evidence);
        let now = read_clocks();
        let mut saved = false;
        if let Some(record) = self.record.as_mut() {
            match (phase, verdict) {
                (RecordPhase::Isolated, Err(message)) => {
                    tracing::error!(%message, "the node is no longer isolated");
                    record.enter(RecordPhase::Failed, Some(message), now);
                    saved = true;
                }
                (RecordPhase::Failed, Ok(())) => {
                    tracing::warn!("the node's isolation holds now");
                    record.enter(RecordPhase::Isolated, None, now);
                    saved = true;
                }
                _ => {}
            }
        }
        if saved {
            self.save();
        }
        if saved || changed {
            self.publish();
        } else {
            self.board
                .refresh_isolation(self.current_report(), self.on_boot_clock());
        }
    }

    /// The kubelet may start again: unmasked and started; the record goes.
    pub async fn end(&mut self) {
        let unit = self.settings.kubelet_unit.clone();
        tracing::warn!(%unit, "ending the node's isolation on the controller's instruction: the kubelet starts again");
        let ended = async {
            bounded_by(RELOAD_TIMEOUT, self.systemd.unmask(&unit)).await?;
            bounded(self.systemd.start(&unit)).await
        }
        .await;
        match ended {
            Ok(()) => {
                self.record = None;
                self.evidence = None;
                remove(&self.settings.state_file);
            }
            Err(error) => {
                let message = format!("the isolation could not be ended: {error}");
                tracing::error!(%message);
                if let Some(record) = self.record.as_mut() {
                    record.enter(RecordPhase::Failed, Some(message), read_clocks());
                }
                self.save();
            }
        }
        self.publish();
    }

    fn current_report(&self) -> crate::report::protocol::IsolationReport {
        report(
            self.record.as_ref(),
            self.evidence.as_ref(),
            self.refused.as_ref(),
        )
    }

    /// Posts the isolation to the board; a change is reported at once.
    fn publish(&self) {
        self.board
            .set_isolation(self.current_report(), self.on_boot_clock());
    }

    /// When the evidence was last gathered, and when the record's phase began, on the
    /// boot clock.
    fn on_boot_clock(&self) -> IsolationBootTimes {
        IsolationBootTimes {
            checked: self
                .evidence
                .as_ref()
                .map(|evidence| evidence.checked_since_boot),
            state_since: self.record.as_ref().and_then(IsolationRecord::since_boot),
        }
    }

    fn save(&self) {
        let Some(record) = &self.record else { return };
        if let Err(error) = save(&self.settings.state_file, record) {
            self.settings.write_failures.inc();
            tracing::error!(file = %self.settings.state_file.display(), %error, "cannot record the node's isolation; a restarted agent would not know of it");
        }
    }
}

/// How long one call to systemd may take; a hung one is a failure, not a wait.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a mask or its removal may take: systemd reloads its units for it, its slowest
/// call, which a busy node stretches (over 10 s on a starved emulated machine in
/// `tests/self_isolation_vm.rs`; an isolation that gave up then had the node reset for
/// nothing). A self-isolation stays bounded by its budget all the same.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(30);

/// A systemd call within [`CALL_TIMEOUT`], its error as text.
async fn bounded<T>(
    call: impl Future<Output = Result<T, crate::systemd::SystemdError>>,
) -> Result<T, String> {
    bounded_by(CALL_TIMEOUT, call).await
}

/// A systemd call within `limit`, its error as text.
async fn bounded_by<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, crate::systemd::SystemdError>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result.map_err(|error| error.to_string()),
        Err(_) => Err(format!("systemd did not answer within {limit:?}")),
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| format!("the blocking task failed: {error}"))?
}

/// This boot's record from the state file. A record of another boot is over (the
/// runtime mask went with that boot); one that cannot be read is kept as a failed
/// isolation, so the kubelet's mask can still be lifted by the controller.
fn load(settings: &IsolatorSettings) -> Option<IsolationRecord> {
    let path = &settings.state_file;
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
        Err(error) => {
            return Some(unreadable(
                settings,
                format!("cannot read {}: {error}", path.display()),
            ));
        }
    };
    match serde_json::from_str::<IsolationRecord>(&text) {
        Ok(record) if record.boot_id == settings.boot_id => Some(record),
        Ok(record) => {
            tracing::info!(file = %path.display(), boot = %record.boot_id, "an isolation record of an earlier boot is over");
            remove(path);
            None
        }
        Err(error) => Some(unreadable(
            settings,
            format!("{} is not an isolation record: {error}", path.display()),
        )),
    }
}

fn unreadable(settings: &IsolatorSettings, message: String) -> IsolationRecord {
    tracing::error!(%message, "the isolation record cannot be used; the node counts as a failed isolation until the controller ends it");
    let now = read_clocks();
    let mut record = IsolationRecord::new(&settings.boot_id, "", 0, now);
    record.enter(RecordPhase::Failed, Some(message), now);
    record
}

fn save(path: &std::path::Path, record: &IsolationRecord) -> std::io::Result<()> {
    crate::state_file::write_json(path, record)
}

fn remove(path: &std::path::Path) {
    if let Err(error) = std::fs::remove_file(path)
        && error.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(file = %path.display(), %error, "cannot remove the isolation record");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::protocol::IsolationState;
    use crate::systemd::{SystemdError, UnitState};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// systemd as far as isolation uses it: one unit, and the calls made to it.
    #[derive(Default)]
    struct FakeSystemd {
        missing: bool,
        /// The unit ignores stop (and SIGKILL).
        stuck: bool,
        masked: AtomicBool,
        active: AtomicBool,
        calls: Mutex<Vec<String>>,
    }

    impl FakeSystemd {
        fn running() -> FakeSystemd {
            let fake = FakeSystemd::default();
            fake.active.store(true, Ordering::SeqCst);
            fake
        }

        fn called(&self, call: &str) {
            self.calls.lock().expect("calls").push(call.to_string());
        }

        fn calls(&self) -> Vec<String> {
            self.calls.lock().expect("calls").clone()
        }
    }

    impl ServiceManager for Arc<FakeSystemd> {
        async fn unit_state(&self, _unit: &str) -> Result<UnitState, SystemdError> {
            let load = if self.missing {
                "not-found"
            } else if self.masked.load(Ordering::SeqCst) {
                "masked"
            } else {
                "loaded"
            };
            let active = if self.active.load(Ordering::SeqCst) {
                "active"
            } else {
                "inactive"
            };
            Ok(UnitState {
                load: load.to_string(),
                active: active.to_string(),
            })
        }

        async fn mask(&self, unit: &str) -> Result<(), SystemdError> {
            self.called(&format!("mask {unit}"));
            self.masked.store(true, Ordering::SeqCst);
            Ok(())
        }

        async fn unmask(&self, unit: &str) -> Result<(), SystemdError> {
            self.called(&format!("unmask {unit}"));
            self.masked.store(false, Ordering::SeqCst);
            Ok(())
        }

        async fn stop(&self, unit: &str) -> Result<(), SystemdError> {
            self.called(&format!("stop {unit}"));
            if !self.stuck {
                self.active.store(false, Ordering::SeqCst);
            }
            Ok(())
        }

        async fn start(&self, unit: &str) -> Result<(), SystemdError> {
            self.called(&format!("start {unit}"));
            self.active.store(true, Ordering::SeqCst);
            Ok(())
        }

        async fn kill(&self, unit: &str, signal: i32) -> Result<(), SystemdError> {
            self.called(&format!("kill {unit} {signal}"));
            Ok(())
        }
    }

    /// Pod processes: a kill ends them unless they are stubborn.
    #[derive(Default)]
    struct FakePods {
        left: AtomicUsize,
        stubborn: AtomicBool,
        kills: AtomicUsize,
    }

    impl PodProcesses for FakePods {
        fn kill_all(&self) -> Result<usize, String> {
            self.kills.fetch_add(1, Ordering::SeqCst);
            let left = self.left.load(Ordering::SeqCst);
            if !self.stubborn.load(Ordering::SeqCst) {
                self.left.store(0, Ordering::SeqCst);
            }
            Ok(left)
        }

        fn count(&self) -> Result<usize, String> {
            Ok(self.left.load(Ordering::SeqCst))
        }
    }

    struct Node {
        systemd: Arc<FakeSystemd>,
        pods: Arc<FakePods>,
        board: Arc<ReportBoard>,
        settings: IsolatorSettings,
        _dir: tempfile::TempDir,
    }

    fn node(systemd: FakeSystemd, pod_processes: usize) -> Node {
        let dir = tempfile::tempdir().expect("temp dir");
        let pods = FakePods::default();
        pods.left.store(pod_processes, Ordering::SeqCst);
        Node {
            systemd: Arc::new(systemd),
            pods: Arc::new(pods),
            board: Arc::new(ReportBoard::new()),
            settings: IsolatorSettings {
                kubelet_unit: "kubelet.service".to_string(),
                stop_timeout: Duration::from_millis(300),
                state_file: dir.path().join("run/isolation.json"),
                boot_id: "boot-1".to_string(),
                check_every: Duration::from_secs(2),
                refusal: None,
                write_failures: Counter::default(),
            },
            _dir: dir,
        }
    }

    impl Node {
        fn isolator(&self) -> Isolator<Arc<FakeSystemd>, FakePods> {
            Isolator::new(
                self.settings.clone(),
                self.systemd.clone(),
                Some(self.pods.clone()),
                self.board.clone(),
            )
        }

        fn reported(&self) -> crate::report::protocol::IsolationReport {
            self.board.snapshot().isolation
        }
    }

    fn isolate() -> Instruction {
        Instruction::Isolate {
            reason: "cut off from the API server".to_string(),
            request: 7,
        }
    }

    /// The report's message mentions `text`.
    fn says(reported: &crate::report::protocol::IsolationReport, text: &str) -> bool {
        reported
            .message
            .as_deref()
            .is_some_and(|m| m.contains(text))
    }

    #[tokio::test]
    async fn the_kubelet_is_masked_before_it_is_stopped_then_every_pod_process_is_killed() {
        let node = node(FakeSystemd::running(), 4);
        let mut isolator = node.isolator();
        isolator.follow(&[isolate()]).await;
        assert_eq!(
            node.systemd.calls(),
            ["mask kubelet.service", "stop kubelet.service"],
            "masked first, so its Restart= cannot bring it back between the stop and the kill"
        );
        assert_eq!(node.pods.left.load(Ordering::SeqCst), 0);
        let reported = node.reported();
        assert!(reported.is_confirmed(), "{reported:?}");
        assert_eq!(
            isolator.record().map(|r| r.phase),
            Some(RecordPhase::Isolated)
        );
        // The same instruction again does nothing more.
        isolator.follow(&[isolate()]).await;
        assert_eq!(node.systemd.calls().len(), 2);
        assert_eq!(node.pods.kills.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_restarted_agent_keeps_this_boots_isolation_and_forgets_an_earlier_boots() {
        let node = node(FakeSystemd::running(), 1);
        node.isolator().follow(&[isolate()]).await;
        let mut restarted = node.isolator();
        assert_eq!(
            restarted.record().map(|r| r.phase),
            Some(RecordPhase::Isolated)
        );
        restarted.check().await;
        assert!(node.reported().is_confirmed());

        let mut next_boot = node.settings.clone();
        next_boot.boot_id = "boot-2".to_string();
        let rebooted = Isolator::new(
            next_boot,
            node.systemd.clone(),
            Some(node.pods.clone()),
            node.board.clone(),
        );
        assert!(rebooted.record().is_none());
        assert!(
            !node.settings.state_file.exists(),
            "the old record is removed"
        );
    }

    #[tokio::test]
    async fn an_unreadable_record_is_a_failed_isolation_the_controller_can_still_end() {
        let node = node(FakeSystemd::running(), 0);
        std::fs::create_dir_all(node.settings.state_file.parent().expect("dir")).expect("dir");
        std::fs::write(&node.settings.state_file, "{not json").expect("write");
        let mut isolator = node.isolator();
        let reported = node.reported();
        assert_eq!(reported.state, IsolationState::Failed);
        assert!(says(&reported, "isolation.json"), "{reported:?}");
        isolator.follow(&[Instruction::EndIsolation]).await;
        assert_eq!(
            node.systemd.calls(),
            ["unmask kubelet.service", "start kubelet.service"]
        );
        assert!(isolator.record().is_none());
        assert_eq!(node.reported().state, IsolationState::None);
    }

    #[tokio::test]
    async fn a_missing_kubelet_unit_fails_the_isolation_naming_the_setting() {
        let systemd = FakeSystemd {
            missing: true,
            ..FakeSystemd::default()
        };
        let node = node(systemd, 2);
        let mut isolator = node.isolator();
        let asked = crate::boot_clock::since_boot();
        isolator.follow(&[isolate()]).await;
        let reported = node.reported();
        assert_eq!(reported.state, IsolationState::Failed);
        assert!(
            says(&reported, "report.isolation.kubeletUnit"),
            "{reported:?}"
        );
        // The guardian tells this failure from an earlier one by the time its state
        // began on the boot clock, posted with it (in whole milliseconds, as kept).
        let state_since = node.board.snapshot().isolation_on_boot_clock.state_since;
        assert_eq!(
            state_since,
            isolator.record().and_then(IsolationRecord::since_boot)
        );
        assert!(
            state_since.is_some_and(|since| since.as_millis() >= asked.as_millis()),
            "{state_since:?} before {asked:?}"
        );
        assert!(node.systemd.calls().is_empty(), "nothing masked or stopped");
        assert_eq!(node.pods.kills.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_kubelet_that_does_not_stop_is_killed_and_the_isolation_fails_when_it_survives() {
        let systemd = FakeSystemd {
            stuck: true,
            ..FakeSystemd::running()
        };
        let node = node(systemd, 2);
        let mut isolator = node.isolator();
        isolator.follow(&[isolate()]).await;
        assert!(
            node.systemd
                .calls()
                .contains(&format!("kill kubelet.service {}", libc::SIGKILL))
        );
        let reported = node.reported();
        assert_eq!(reported.state, IsolationState::Failed);
        assert!(!reported.kubelet_stopped);
        assert!(says(&reported, "did not stop"), "{reported:?}");
    }

    #[tokio::test]
    async fn pod_processes_that_survive_the_kill_fail_the_isolation() {
        let node = node(FakeSystemd::running(), 3);
        node.pods.stubborn.store(true, Ordering::SeqCst);
        let mut isolator = node.isolator();
        isolator.follow(&[isolate()]).await;
        let reported = node.reported();
        assert_eq!(reported.state, IsolationState::Failed);
        assert_eq!(reported.pod_processes, 3);
        assert!(!reported.is_confirmed());
    }

    #[tokio::test]
    async fn a_slipped_isolation_is_put_right_or_failed() {
        let node = node(FakeSystemd::running(), 1);
        let mut isolator = node.isolator();
        isolator.follow(&[isolate()]).await;
        // A process appears in the pods cgroup: it is killed at the next check.
        node.pods.left.store(2, Ordering::SeqCst);
        isolator.check().await;
        assert!(node.reported().is_confirmed());
        // One that cannot be killed fails the isolation.
        node.pods.left.store(2, Ordering::SeqCst);
        node.pods.stubborn.store(true, Ordering::SeqCst);
        isolator.check().await;
        assert_eq!(node.reported().state, IsolationState::Failed);
        // Gone after all: isolated again.
        node.pods.stubborn.store(false, Ordering::SeqCst);
        node.pods.left.store(0, Ordering::SeqCst);
        isolator.check().await;
        assert!(node.reported().is_confirmed());
    }

    #[tokio::test]
    async fn an_agent_that_does_not_isolate_says_so_while_asked_and_touches_nothing() {
        let mut node = node(FakeSystemd::running(), 2);
        node.settings.refusal = Some("dry-run mode: the agent stops nothing".to_string());
        let mut isolator = node.isolator();
        isolator.follow(&[isolate()]).await;
        let reported = node.reported();
        assert_eq!(reported.state, IsolationState::Refused);
        assert_eq!(
            reported.message.as_deref(),
            Some("dry-run mode: the agent stops nothing")
        );
        assert!(node.systemd.calls().is_empty());
        assert_eq!(node.pods.kills.load(Ordering::SeqCst), 0);
        isolator.follow(&[]).await;
        assert_eq!(node.reported().state, IsolationState::None);
    }

    #[tokio::test]
    async fn the_guardians_request_isolates_the_node_once_and_the_controllers_request_adopts_it() {
        let node = node(FakeSystemd::running(), 2);
        let mut isolator = node.isolator();
        isolator
            .isolate_by_itself("self-isolation: nothing heard for 60s")
            .await;
        let reported = node.reported();
        assert!(reported.is_confirmed(), "{reported:?}");
        assert_eq!(reported.request, 0, "no controller request is answered");
        isolator.isolate_by_itself("again").await;
        assert_eq!(node.systemd.calls().len(), 2, "nothing stopped twice");
        // The controller hears the node again and asks: the isolation answers it.
        isolator.follow(&[isolate()]).await;
        assert_eq!(node.reported().request, 7);
        assert_eq!(node.systemd.calls().len(), 2);
        assert_eq!(node.pods.kills.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn ending_lets_the_kubelet_start_and_forgets_the_isolation() {
        let node = node(FakeSystemd::running(), 1);
        let mut isolator = node.isolator();
        isolator.follow(&[isolate()]).await;
        isolator.follow(&[Instruction::EndIsolation]).await;
        assert_eq!(
            node.systemd.calls()[2..],
            ["unmask kubelet.service", "start kubelet.service"]
        );
        assert!(node.systemd.active.load(Ordering::SeqCst));
        assert!(isolator.record().is_none());
        assert!(!node.settings.state_file.exists());
        assert_eq!(node.reported().state, IsolationState::None);
    }
}
