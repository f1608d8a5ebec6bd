//! The shutdown manager: holds logind's delay lock, waits for `PrepareForShutdown`, runs
//! the phases, releases the lock, and survives bus restarts, cancellations and its own
//! restart in the middle of a shutdown.

use prometheus_client::metrics::counter::Counter;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use zbus::export::futures_core::Stream;

use super::logind::{
    Backoff, BusAddress, DEFAULT_DROPIN_PATH, INHIBITOR_WHY, InhibitDelayReport, InhibitLock,
    Logind, LogindError, PrepareForShutdownStream,
};
use super::plan::{PhaseSpec, plan, total_budget_seconds};
use super::runner::{PodTerminator, RunOutcome, ShutdownClock, run_phases};
use super::state::{ShutdownOutcome, ShutdownState, StateStore};
use crate::pods::Pod;
use crate::systemd::notify::ServiceManagerLink;

pub const DEFAULT_STATE_PATH: &str = "/var/lib/nodekeeper/graceful_shutdown_state.json";

/// The names the delay lock is stored under in the service manager's file descriptor
/// store begin with this (then `.<pid>.<nanoseconds since boot>`: each lock a name of its
/// own, even for a restarted agent given its predecessor's pid, so that letting go of the
/// old one after taking a new one never removes the new one).
pub const STORED_LOCK_PREFIX: &str = "nodekeeper-delay-lock";

/// Settings the shutdown manager needs beyond the phases. The YAML fields that feed these
/// belong to the agent configuration (owned by the config module).
#[derive(Debug, Clone)]
pub struct ManagerOptions {
    pub bus: BusAddress,
    /// Sorted phases from [`super::plan::phases_from_config`]; empty disables the manager.
    pub phases: Vec<PhaseSpec>,
    pub state_path: PathBuf,
    pub logind_dropin_path: PathBuf,
    /// Pause before reconnecting after the bus went away (the kubelet uses 1 s).
    pub reconnect_period: Duration,
    pub reload_backoff: Backoff,
    /// This boot's `/proc/sys/kernel/random/boot_id`: only this boot's record is resumed.
    pub boot_id: String,
    /// The service manager that keeps the lock while the agent restarts (inert outside
    /// systemd).
    pub service: Arc<ServiceManagerLink>,
    /// Counts every failed write of the state file.
    pub state_write_failures: Counter,
}

impl ManagerOptions {
    pub fn new(phases: Vec<PhaseSpec>, boot_id: String) -> Self {
        ManagerOptions {
            bus: BusAddress::System,
            phases,
            state_path: PathBuf::from(DEFAULT_STATE_PATH),
            logind_dropin_path: PathBuf::from(DEFAULT_DROPIN_PATH),
            reconnect_period: Duration::from_secs(1),
            reload_backoff: Backoff::default(),
            boot_id,
            service: Arc::new(ServiceManagerLink::none()),
            state_write_failures: Counter::default(),
        }
    }
}

/// What the rest of the agent reads: admission, node condition and taint, metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ManagerStatus {
    pub bus_connected: bool,
    pub lock_held: bool,
    /// A shutdown is under way (or finished and waiting for power-off): admit nothing.
    pub shutting_down: bool,
    /// `Err` carries the message for the metric and node condition when logind's limit
    /// stays below the budget.
    pub inhibit_delay: Option<Result<InhibitDelayReport, String>>,
    /// Why the lock is not held, once an attempt to take it failed (logind unreachable,
    /// the call refused); `None` while it is held or not yet tried.
    pub lock_problem: Option<String>,
    pub last_shutdown: Option<ShutdownState>,
    /// This process finished the shutdown's phases and released the lock for the power
    /// off. A restarted agent that finds a finished record (the power off failed, or a
    /// soft reboot kept the boot) has not.
    pub released_for_power_off: bool,
}

/// The pods to drain, read when a shutdown begins.
pub type PodLister = Arc<dyn Fn() -> Result<Vec<Pod>, String> + Send + Sync>;

struct ActiveRun {
    cancel: watch::Sender<bool>,
    handle: JoinHandle<(ShutdownState, RunOutcome)>,
}

struct Manager<T: PodTerminator> {
    options: ManagerOptions,
    store: StateStore,
    terminator: Arc<T>,
    pods: PodLister,
    clock: Arc<dyn ShutdownClock>,
    status: watch::Sender<ManagerStatus>,
    lock: Option<HeldLock>,
    lock_problem: Option<String>,
    run: Option<ActiveRun>,
    /// All phases done and the lock released: logind is powering off.
    released_for_power_off: bool,
    last: Option<ShutdownState>,
}

/// A lock and the name its copy is kept under in the service manager, if it is.
struct HeldLock {
    lock: InhibitLock,
    stored_as: Option<String>,
}

/// Run until `stop` turns true. Returns at once when no phases are configured (graceful
/// shutdown disabled, as in the kubelet).
pub async fn run_shutdown_manager<T: PodTerminator>(
    options: ManagerOptions,
    terminator: Arc<T>,
    pods: PodLister,
    clock: Arc<dyn ShutdownClock>,
    status: watch::Sender<ManagerStatus>,
    mut stop: watch::Receiver<bool>,
) {
    if options.phases.is_empty() {
        tracing::info!("no graceful shutdown configured; node shutdown will be immediate");
        return;
    }
    let store = StateStore::new(&options.state_path)
        .counting_failures(options.state_write_failures.clone());
    let last = match store.load() {
        Ok(state) => state,
        Err(error) => {
            tracing::error!(%error, "ignoring the previous shutdown record");
            None
        }
    };
    let mut manager = Manager {
        options,
        store,
        terminator,
        pods,
        clock,
        status,
        lock: None,
        lock_problem: None,
        run: None,
        released_for_power_off: false,
        last,
    };
    manager.take_back_stored_lock();
    manager.settle_previous_boot().await;
    if manager
        .last
        .as_ref()
        .is_some_and(|s| s.needs_resume(&manager.options.boot_id))
    {
        tracing::warn!("resuming a shutdown interrupted by an agent restart");
        manager.start_shutdown().await;
    }
    manager.publish(false);
    // Log an unreachable bus once per outage, not on every reconnect attempt.
    let mut unreachable_since: Option<String> = None;
    loop {
        if *stop.borrow_and_update() {
            break;
        }
        let logind = tokio::select! {
            connected = Logind::connect(&manager.options.bus) => connected,
            _ = stop.changed() => break,
        };
        match logind {
            Ok(logind) => {
                if unreachable_since.take().is_some() {
                    tracing::info!("logind reachable again");
                }
                if let Err(error) = manager.serve(&logind, &mut stop).await {
                    tracing::warn!(%error, "logind session ended");
                    manager.lock_problem = Some(error.to_string());
                }
            }
            Err(error) => {
                let text = error.to_string();
                manager.lock_problem = Some(text.clone());
                if unreachable_since.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %text, "logind unreachable; retrying every {:?}", manager.options.reconnect_period);
                }
                unreachable_since = Some(text);
            }
        }
        manager.publish(false);
        if *stop.borrow() {
            break;
        }
        // Keep draining while the bus is away; reconnect after the pause.
        let pause = tokio::time::sleep(manager.options.reconnect_period);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                () = &mut pause => break,
                finished = wait_run(&mut manager.run) => manager.run_ended(finished).await,
                _ = stop.changed() => break,
            }
        }
    }
    if let Some(run) = manager.run.take() {
        run.handle.abort();
    }
}

/// The name a lock taken at `nanoseconds` after boot by process `pid` is stored under.
pub fn stored_lock_name(pid: u32, nanoseconds: u128) -> String {
    format!("{STORED_LOCK_PREFIX}.{pid}.{nanoseconds}")
}

async fn wait_run(
    run: &mut Option<ActiveRun>,
) -> Result<(ShutdownState, RunOutcome), tokio::task::JoinError> {
    let Some(active) = run.as_mut() else {
        return std::future::pending().await;
    };
    let result = (&mut active.handle).await;
    *run = None;
    result
}

async fn next_signal(stream: &mut PrepareForShutdownStream) -> Option<bool> {
    loop {
        let signal = std::future::poll_fn(|cx| Pin::new(&mut *stream).poll_next(cx)).await?;
        match signal.args() {
            Ok(args) => return Some(args.start),
            Err(error) => tracing::warn!(%error, "ignoring a malformed PrepareForShutdown"),
        }
    }
}

impl<T: PodTerminator> Manager<T> {
    /// A record left in progress by an earlier boot can never be resumed.
    async fn settle_previous_boot(&mut self) {
        if let Some(state) = self.last.as_mut()
            && state.outcome == ShutdownOutcome::InProgress
            && state.boot_id != self.options.boot_id
        {
            state.abandon();
            if let Err(error) = self.store.save_in_background(state).await {
                tracing::error!(%error, "cannot mark the previous boot's shutdown abandoned");
            }
        }
    }

    fn publish(&self, bus_connected: bool) {
        let shutting_down = self.run.is_some() || self.released_for_power_off;
        let lock_held = self.lock.is_some();
        let last = self.last.clone();
        let released = self.released_for_power_off;
        let lock_problem = if lock_held {
            None
        } else {
            self.lock_problem.clone()
        };
        self.status.send_modify(|status| {
            status.bus_connected = bus_connected;
            status.lock_held = lock_held;
            status.lock_problem = lock_problem;
            status.shutting_down = shutting_down;
            status.last_shutdown = last;
            status.released_for_power_off = released;
        });
    }

    async fn serve(
        &mut self,
        logind: &Logind,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), LogindError> {
        let budget = Duration::from_secs(
            u64::try_from(total_budget_seconds(&self.options.phases)).unwrap_or(0),
        );
        let report = logind
            .ensure_inhibit_delay(
                budget,
                &self.options.logind_dropin_path,
                &self.options.reload_backoff,
            )
            .await;
        match &report {
            Ok(report) => tracing::info!(
                before = %crate::config::GoDuration::from(report.before),
                after = %crate::config::GoDuration::from(report.after),
                drop_in = %report
                    .dropin_written
                    .as_ref()
                    .map_or_else(|| "not needed".to_string(), |path| path.display().to_string()),
                "logind inhibit delay checked"
            ),
            Err(error) => tracing::error!(%error, "logind will not wait long enough"),
        }
        self.status.send_modify(|status| {
            status.inhibit_delay = Some(report.map_err(|e| e.to_string()));
        });

        // Subscribe before reading the property so no announcement falls in between.
        let mut signals = logind.prepare_for_shutdown_signals().await?;
        let preparing = logind.preparing_for_shutdown().await?;
        if !self.released_for_power_off {
            self.retake_lock(logind).await?;
        }
        if preparing && self.run.is_none() && !self.released_for_power_off {
            tracing::warn!("logind is already preparing for shutdown; draining now");
            self.start_shutdown().await;
        }
        self.publish(true);
        loop {
            tokio::select! {
                signal = next_signal(&mut signals) => match signal {
                    None => {
                        return Err(LogindError::Call {
                            what: "PrepareForShutdown stream",
                            error: Box::new(zbus::Error::InputOutput(std::sync::Arc::new(
                                std::io::Error::from(std::io::ErrorKind::ConnectionReset),
                            ))),
                        });
                    }
                    Some(true) => {
                        tracing::info!("PrepareForShutdown(true): node shutdown detected");
                        if self.run.is_none() && !self.released_for_power_off {
                            self.start_shutdown().await;
                        }
                    }
                    Some(false) => {
                        tracing::info!("PrepareForShutdown(false): node shutdown cancelled");
                        self.cancel_shutdown(logind).await?;
                    }
                },
                finished = wait_run(&mut self.run) => self.run_ended(finished).await,
                _ = stop.changed() => return Ok(()),
            }
            self.publish(true);
        }
    }

    /// Take a new lock, then let go of the old one, so there is never a gap.
    async fn retake_lock(&mut self, logind: &Logind) -> Result<(), LogindError> {
        let lock = logind.take_delay_lock(INHIBITOR_WHY).await?;
        self.hold(lock);
        tracing::info!("logind delay lock held");
        Ok(())
    }

    /// Hold `lock` (a copy kept in the service manager, so that it outlives a restart of
    /// the agent), then let go of the lock held before, in the store too.
    fn hold(&mut self, lock: InhibitLock) {
        let name = stored_lock_name(
            std::process::id(),
            crate::boot_clock::since_boot().as_nanos(),
        );
        let stored_as = match self.options.service.store_fd(&name, lock.as_fd()) {
            Ok(true) => Some(name),
            Ok(false) => None,
            Err(error) => {
                tracing::warn!(%error, "the delay lock will not outlive a restart of the agent");
                None
            }
        };
        let previous = self.lock.replace(HeldLock { lock, stored_as });
        self.lock_problem = None;
        if let Some(previous) = previous {
            self.let_go(previous);
        }
    }

    /// Release the lock for good: this process's copy and the service manager's.
    fn release_lock(&mut self) {
        if let Some(held) = self.lock.take() {
            self.let_go(held);
        }
    }

    fn let_go(&self, held: HeldLock) {
        if let Some(name) = &held.stored_as
            && let Err(error) = self.options.service.remove_stored(name)
        {
            tracing::error!(%error, "the service manager still holds a copy of the delay lock");
        }
        drop(held.lock);
    }

    /// A lock an earlier run of the agent kept in the service manager's store: hold it
    /// until a new one is taken, so a restart leaves no moment without one. A stored lock
    /// logind no longer holds (it restarted meanwhile), and extra copies (a run that died
    /// between storing a new lock and removing its old one), are let go.
    fn take_back_stored_lock(&mut self) {
        for stored in self.options.service.claim_passed(STORED_LOCK_PREFIX) {
            let held = HeldLock {
                lock: InhibitLock::from_fd(stored.fd),
                stored_as: Some(stored.name),
            };
            let live = held.lock.is_live();
            if self.lock.is_none() && live {
                tracing::info!(
                    stored_as = held.stored_as.as_deref().unwrap_or_default(),
                    "logind delay lock taken back from the service manager, held across the agent's restart"
                );
                self.lock = Some(held);
            } else {
                if !live {
                    tracing::warn!(
                        stored_as = held.stored_as.as_deref().unwrap_or_default(),
                        "a stored delay lock is no longer held by logind (restarted?); letting it go"
                    );
                }
                self.let_go(held);
            }
        }
    }

    async fn start_shutdown(&mut self) {
        let state = match self.last.take() {
            Some(state) if state.needs_resume(&self.options.boot_id) => state,
            _ => {
                let (pods, listed) = match (self.pods)() {
                    Ok(pods) => (pods, true),
                    Err(error) => {
                        tracing::error!(%error, "cannot list pods; shutting down without draining");
                        (Vec::new(), false)
                    }
                };
                let planned = plan(&self.options.phases, &pods);
                let mut state =
                    ShutdownState::begin(&planned, &self.options.boot_id, self.clock.now_unix_ms());
                state.pods_listed = listed;
                state
            }
        };
        // Persist before any pod is touched, so a restart knows a shutdown began.
        if let Err(error) = self.store.save_in_background(&state).await {
            tracing::error!(%error, "shutdown start not persisted");
        }
        self.last = Some(state.clone());
        let (cancel, cancelled) = watch::channel(false);
        let terminator = Arc::clone(&self.terminator);
        let store = self.store.clone();
        let clock = Arc::clone(&self.clock);
        let handle = tokio::spawn(async move {
            let mut state = state;
            let outcome =
                run_phases(&mut state, terminator, &store, clock.as_ref(), cancelled).await;
            (state, outcome)
        });
        self.run = Some(ActiveRun { cancel, handle });
    }

    async fn run_ended(
        &mut self,
        result: Result<(ShutdownState, RunOutcome), tokio::task::JoinError>,
    ) {
        let (mut state, outcome) = match result {
            Ok(finished) => finished,
            Err(error) => {
                // A failed run must not keep the node from powering off: treat it as done.
                tracing::error!(%error, "shutdown run failed; releasing the lock");
                let Some(mut state) = self
                    .store
                    .load()
                    .ok()
                    .flatten()
                    .or_else(|| self.last.clone())
                else {
                    self.release_lock();
                    self.released_for_power_off = true;
                    return;
                };
                state.finish(self.clock.now_unix_ms());
                (state, RunOutcome::Finished)
            }
        };
        if outcome == RunOutcome::Finished {
            state.about_to_power_off = true;
            if let Err(error) = self.store.save_in_background(&state).await {
                tracing::error!(%error, "final shutdown state not persisted");
            }
            self.release_lock();
            self.released_for_power_off = true;
            tracing::info!(
                "all shutdown phases finished; delay lock released, node will shut down shortly"
            );
        }
        self.last = Some(state);
    }

    async fn cancel_shutdown(&mut self, logind: &Logind) -> Result<(), LogindError> {
        if let Some(run) = self.run.take() {
            let _ = run.cancel.send(true);
            match run.handle.await {
                Ok((state, _)) => self.last = Some(state),
                Err(error) => tracing::error!(%error, "shutdown run failed while cancelling"),
            }
        } else if let Some(state) = self.last.as_mut()
            && self.released_for_power_off
        {
            state.cancel(self.clock.now_unix_ms());
            state.about_to_power_off = false;
            if let Err(error) = self.store.save_in_background(state).await {
                tracing::error!(%error, "shutdown cancellation not persisted");
            }
        }
        self.released_for_power_off = false;
        if self.lock.is_none() {
            self.retake_lock(logind).await?;
        }
        Ok(())
    }
}
