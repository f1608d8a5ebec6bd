//! The shutdown manager against a private dbus-daemon and a fake logind/systemd written
//! with zbus: the delay lock, PrepareForShutdown, cancellation, a bus restart, the logind
//! drop-in reload, and resuming after an agent restart. Needs `dbus-daemon` (Debian
//! package `dbus`); fails under `CI=true` without it, skips with a message otherwise.

mod support {
    pub mod logind_fake;
    #[allow(dead_code)]
    pub mod poll;
    #[allow(dead_code)]
    pub mod real;
}

use nodekeeper::pods::Pod;
use nodekeeper::shutdown::logind::{Backoff, BusAddress, INHIBITOR_WHO};
use nodekeeper::shutdown::manager::{
    ManagerOptions, ManagerStatus, PodLister, run_shutdown_manager,
};
use nodekeeper::shutdown::plan::{PhaseSpec, PlannedPod};
use nodekeeper::shutdown::runner::{PodTerminator, SystemClock, TerminateError, Termination};
use nodekeeper::shutdown::state::{PhaseStatus, ShutdownOutcome, ShutdownState, StateStore};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::logind_fake::{FakeLogind, PrivateBus, fake_state, wait_until};
use tokio::sync::watch;

// ---------------------------------------------------------------- workloads

/// Records every termination; pods named `hang-*` never stop.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<(String, Duration, Instant)>>,
}

impl Recorder {
    fn names(&self) -> Vec<String> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.0.clone())
            .collect()
    }
    fn first_at(&self) -> Option<Instant> {
        self.calls.lock().unwrap().first().map(|c| c.2)
    }
}

impl PodTerminator for Recorder {
    async fn terminate(
        &self,
        pod: &PlannedPod,
        grace: Duration,
    ) -> Result<Termination, TerminateError> {
        self.calls
            .lock()
            .unwrap()
            .push((pod.key(), grace, Instant::now()));
        if pod.name.starts_with("hang") {
            std::future::pending::<()>().await;
        }
        Ok(Termination::Graceful)
    }
}

fn pod(name: &str, priority: i32) -> Pod {
    Pod {
        namespace: "default".into(),
        name: name.into(),
        priority,
        ..Pod::default()
    }
}

struct Agent {
    status: watch::Receiver<ManagerStatus>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    recorder: Arc<Recorder>,
    state_path: PathBuf,
}

impl Agent {
    fn start(
        bus: &PrivateBus,
        dir: &Path,
        phases: &[(i32, i64)],
        pods: Vec<Pod>,
        tune: impl FnOnce(&mut ManagerOptions),
    ) -> Agent {
        Agent::listing(bus, dir, phases, Arc::new(move || Ok(pods.clone())), tune)
    }

    /// [`Agent::start`] with the pods read from `source`.
    fn listing(
        bus: &PrivateBus,
        dir: &Path,
        phases: &[(i32, i64)],
        source: PodLister,
        tune: impl FnOnce(&mut ManagerOptions),
    ) -> Agent {
        let phases: Vec<PhaseSpec> = phases
            .iter()
            .map(|&(priority, seconds)| PhaseSpec { priority, seconds })
            .collect();
        let mut options = ManagerOptions::new(phases, "test-boot".into());
        options.bus = BusAddress::Address(bus.address());
        options.state_path = dir.join("state/graceful_shutdown_state.json");
        options.logind_dropin_path = dir.join("logind.conf.d/99-nodekeeper.conf");
        options.reconnect_period = Duration::from_millis(100);
        options.reload_backoff = Backoff {
            initial: Duration::from_millis(10),
            attempts: 4,
        };
        tune(&mut options);
        let state_path = options.state_path.clone();
        let recorder = Arc::new(Recorder::default());
        let (status_tx, status) = watch::channel(ManagerStatus::default());
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run_shutdown_manager(
            options,
            Arc::clone(&recorder),
            source,
            Arc::new(SystemClock),
            status_tx,
            stop_rx,
        ));
        Agent {
            status,
            stop,
            task,
            recorder,
            state_path,
        }
    }

    /// Waits until the agent is on the bus and listens for PrepareForShutdown.
    async fn subscribed(&self) {
        wait_until("the agent to subscribe", || {
            self.status.borrow().bus_connected
        })
        .await;
    }

    fn saved(&self) -> Option<ShutdownState> {
        StateStore::new(&self.state_path).load().unwrap()
    }

    async fn shut_down(self) {
        self.stop.send(true).unwrap();
        self.task.await.unwrap();
    }
}

fn setup() -> Result<(tempfile::TempDir, PrivateBus), String> {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("nodekeeper=debug")
        .try_init();
    let dir = tempfile::tempdir().unwrap();
    let bus = PrivateBus::start(dir.path())?;
    Ok((dir, bus))
}

// ---------------------------------------------------------------- tests

const DBUS: &str = "a private dbus-daemon";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_a_delay_lock_then_drains_in_priority_order_and_releases_it() {
    let (dir, bus) = require!(DBUS, setup());
    let logind = FakeLogind::serve(&bus, fake_state(3600)).await;
    let pods = vec![
        pod("critical", 2_000_000_000),
        pod("web", 0),
        pod("batch", 0),
    ];
    let agent = Agent::start(
        &bus,
        dir.path(),
        &[(0, 20), (2_000_000_000, 10)],
        pods,
        |_| {},
    );
    wait_until("the delay lock", || logind.held() == 1).await;
    {
        let state = logind.shared.lock().unwrap();
        let lock = &state.locks[0];
        assert_eq!(
            (lock.what.as_str(), lock.who.as_str(), lock.mode.as_str()),
            ("shutdown", INHIBITOR_WHO, "delay")
        );
    }
    agent.subscribed().await;

    let sent = logind.announce(true).await;
    wait_until("the lock release", || logind.held() == 0).await;
    let latency = agent.recorder.first_at().unwrap() - sent;
    println!("PrepareForShutdown -> first termination: {latency:?}");
    let mut order = agent.recorder.names();
    let first_phase: std::collections::BTreeSet<String> = order.drain(..2).collect();
    assert_eq!(
        first_phase,
        ["default/batch", "default/web"].map(String::from).into()
    );
    assert_eq!(order, vec!["default/critical"]);
    let saved = agent.saved().unwrap();
    assert_eq!(saved.outcome, ShutdownOutcome::Finished);
    assert!(saved.about_to_power_off);
    assert!(saved.pods_listed);
    // The status is published just after the lock is dropped.
    wait_until("the status saying the lock went for the power off", || {
        agent.status.borrow().released_for_power_off
    })
    .await;
    assert!(agent.status.borrow().shutting_down);
    agent.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_whose_pods_cannot_be_listed_records_that_nothing_was_drained() {
    let (dir, bus) = require!(DBUS, setup());
    let logind = FakeLogind::serve(&bus, fake_state(3600)).await;
    let agent = Agent::listing(
        &bus,
        dir.path(),
        &[(0, 20)],
        Arc::new(|| Err("the pod cache has not been filled".to_string())),
        |_| {},
    );
    wait_until("the delay lock", || logind.held() == 1).await;
    agent.subscribed().await;
    logind.announce(true).await;
    // The node still powers off: a failed list must not hold the shutdown up.
    wait_until("the lock release", || logind.held() == 0).await;
    let saved = agent.saved().unwrap();
    assert_eq!(saved.outcome, ShutdownOutcome::Finished);
    assert!(saved.about_to_power_off);
    assert!(
        !saved.pods_listed,
        "every phase was skipped for want of a list: {saved:?}"
    );
    assert!(agent.recorder.names().is_empty());
    agent.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_mid_phase_stops_the_phases_and_keeps_the_lock() {
    let (dir, bus) = require!(DBUS, setup());
    let logind = FakeLogind::serve(&bus, fake_state(3600)).await;
    let pods = vec![pod("hang-web", 0), pod("later", 1000)];
    let agent = Agent::start(&bus, dir.path(), &[(0, 600), (1000, 600)], pods, |_| {});
    agent.subscribed().await;
    logind.announce(true).await;
    wait_until("the first phase", || !agent.recorder.names().is_empty()).await;
    logind.announce(false).await;
    wait_until("the cancelled record", || {
        agent
            .saved()
            .is_some_and(|s| s.outcome == ShutdownOutcome::Cancelled)
    })
    .await;
    wait_until("the agent to stop shutting down", || {
        !agent.status.borrow().shutting_down
    })
    .await;
    assert_eq!(agent.recorder.names(), vec!["default/hang-web"]);
    assert_eq!(
        agent.saved().unwrap().phases[1].status,
        PhaseStatus::Cancelled
    );
    assert_eq!(
        logind.held(),
        1,
        "the agent must keep blocking the next shutdown"
    );

    // A later shutdown still drains (the subscription and lock survived the cancel).
    logind.announce(true).await;
    wait_until("a second drain", || agent.recorder.names().len() == 2).await;
    agent.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_the_bus_restarts_and_takes_the_lock_again() {
    let (dir, mut bus) = require!(DBUS, setup());
    let shared = fake_state(3600);
    let logind = FakeLogind::serve(&bus, Arc::clone(&shared)).await;
    let agent = Agent::start(&bus, dir.path(), &[(0, 5)], vec![pod("web", 0)], |_| {});
    wait_until("the delay lock", || logind.held() == 1).await;
    agent.subscribed().await;

    drop(logind);
    bus.restart();
    wait_until("the agent to notice", || {
        !agent.status.borrow().bus_connected
    })
    .await;
    let logind = FakeLogind::serve(&bus, shared).await;
    wait_until("a second Inhibit call", || logind.inhibit_calls() == 2).await;
    wait_until("the old lock to be released", || logind.held() == 1).await;
    assert!(!logind.shared.lock().unwrap().locks[1].released());
    agent.subscribed().await;

    logind.announce(true).await;
    wait_until("the drain after reconnect", || logind.held() == 0).await;
    assert_eq!(agent.recorder.names(), vec!["default/web"]);
    agent.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raises_inhibit_delay_max_with_a_dropin_and_a_logind_reload() {
    let (dir, bus) = require!(DBUS, setup());
    let shared = fake_state(5);
    shared.lock().unwrap().dropin = Some(dir.path().join("logind.conf.d/99-nodekeeper.conf"));
    let logind = FakeLogind::serve(&bus, Arc::clone(&shared)).await;
    let agent = Agent::start(&bus, dir.path(), &[(0, 20), (100, 10)], vec![], |_| {});
    wait_until("the inhibit delay check", || {
        agent.status.borrow().inhibit_delay.is_some()
    })
    .await;
    let report = agent
        .status
        .borrow()
        .inhibit_delay
        .clone()
        .unwrap()
        .unwrap();
    assert_eq!(report.before, Duration::from_secs(5));
    assert_eq!(report.after, Duration::from_secs(30));
    assert_eq!(
        logind.shared.lock().unwrap().kill_unit_calls,
        vec![("systemd-logind.service".to_string(), "all".to_string(), 1)]
    );
    let dropin =
        std::fs::read_to_string(dir.path().join("logind.conf.d/99-nodekeeper.conf")).unwrap();
    assert!(
        dropin.contains("[Login]\nInhibitDelayMaxSec=30\n"),
        "{dropin}"
    );
    agent.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_an_error_when_logind_never_shows_the_new_limit() {
    let (dir, bus) = require!(DBUS, setup());
    let _logind = FakeLogind::serve(&bus, fake_state(5)).await;
    let agent = Agent::start(&bus, dir.path(), &[(0, 30)], vec![], |_| {});
    wait_until("the inhibit delay check", || {
        agent.status.borrow().inhibit_delay.is_some()
    })
    .await;
    let error = agent
        .status
        .borrow()
        .inhibit_delay
        .clone()
        .unwrap()
        .unwrap_err();
    assert!(error.contains("InhibitDelayMaxSec is still 5s"), "{error}");
    assert!(error.contains("99-nodekeeper.conf"), "{error}");
    // The agent still holds a lock: 5 s of drain is better than none.
    wait_until("the delay lock", || agent.status.borrow().lock_held).await;
    agent.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_started_while_logind_prepares_for_shutdown_drains_at_once() {
    let (dir, bus) = require!(DBUS, setup());
    let shared = fake_state(3600);
    shared.lock().unwrap().preparing = true;
    let logind = FakeLogind::serve(&bus, shared).await;
    let agent = Agent::start(&bus, dir.path(), &[(0, 5)], vec![pod("web", 0)], |_| {});
    wait_until("the drain", || {
        logind.inhibit_calls() == 1 && logind.held() == 0
    })
    .await;
    assert_eq!(agent.recorder.names(), vec!["default/web"]);
    agent.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_shutdown_resumes_the_remaining_phases() {
    let (dir, bus) = require!(DBUS, setup());
    let logind = FakeLogind::serve(&bus, fake_state(3600)).await;
    let phases = [(0, 2), (1000, 600), (2000, 600)];
    let pods = vec![pod("hang-web", 0), pod("db", 1000), pod("dns", 2000)];
    let first = Agent::start(&bus, dir.path(), &phases, pods.clone(), |_| {});
    first.subscribed().await;
    logind.announce(true).await;
    wait_until("the first phase", || !first.recorder.names().is_empty()).await;
    first.shut_down().await;
    // logind no longer says anything: the record alone must bring the agent back to work.
    logind.shared.lock().unwrap().preparing = false;
    let phase_pods: Vec<Pod> = vec![pod("web-new-replica", 0)];
    let second = Agent::start(&bus, dir.path(), &phases, phase_pods, |_| {});
    wait_until("the resumed phases", || second.recorder.names().len() == 3).await;
    assert_eq!(
        second.recorder.names(),
        vec!["default/hang-web", "default/db", "default/dns"],
        "the interrupted phase runs again, then the rest, from the recorded plan"
    );
    wait_until("the finished record", || {
        second
            .saved()
            .is_some_and(|s| s.outcome == ShutdownOutcome::Finished && s.about_to_power_off)
    })
    .await;
    second.shut_down().await;
}

/// The bus (and logind with it) restarts while a shutdown drains: the drain goes on
/// through its phases without the bus, the agent reconnects, and once the drain is done
/// no delay lock of the agent's holds the shutdown back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bus_restart_during_a_shutdown_neither_stops_the_drain_nor_leaves_a_lock_behind() {
    let (dir, mut bus) = require!(DBUS, setup());
    let shared = fake_state(3600);
    let logind = FakeLogind::serve(&bus, Arc::clone(&shared)).await;
    let pods = vec![pod("hang-web", 0), pod("db", 1000)];
    let agent = Agent::start(&bus, dir.path(), &[(0, 2), (1000, 5)], pods, |_| {});
    wait_until("the delay lock", || logind.held() == 1).await;
    agent.subscribed().await;
    logind.announce(true).await;
    wait_until("the first phase", || !agent.recorder.names().is_empty()).await;

    drop(logind);
    let restarted = Instant::now();
    bus.restart();
    let logind = FakeLogind::serve(&bus, shared).await;
    wait_until("the drain to finish", || {
        agent
            .saved()
            .is_some_and(|s| s.outcome == ShutdownOutcome::Finished)
    })
    .await;
    let drained = restarted.elapsed();
    assert_eq!(
        agent.recorder.names(),
        vec!["default/hang-web", "default/db"]
    );
    let saved = agent.saved().expect("the record");
    assert!(
        saved
            .phases
            .iter()
            .all(|phase| phase.status != PhaseStatus::Cancelled),
        "{saved:#?}"
    );
    agent.subscribed().await;
    // Whatever lock the agent took on the new bus, the finished drain lets it go: none
    // is held for half a second on end (the release follows the record's writes, which
    // a busy disk may slow).
    let give_up = Instant::now() + Duration::from_secs(10);
    let mut free_since: Option<Instant> = None;
    loop {
        if logind.held() == 0 {
            if free_since.get_or_insert_with(Instant::now).elapsed() >= Duration::from_millis(500) {
                break;
            }
        } else {
            free_since = None;
        }
        assert!(
            Instant::now() < give_up,
            "a lock held after the drain would delay the shutdown for nothing"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("the drain finished {drained:?} after the bus restart");
    agent.shut_down().await;
}

/// logind restarts while the bus stays up (as `systemctl restart systemd-logind` does;
/// the real one keeps its inhibitor locks across a restart, as the fake's shared state
/// does): the agent's subscription follows the new logind, and the next shutdown drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logind_restart_on_a_live_bus_still_delivers_the_next_shutdown() {
    let (dir, bus) = require!(DBUS, setup());
    let shared = fake_state(3600);
    let logind = FakeLogind::serve(&bus, Arc::clone(&shared)).await;
    let agent = Agent::start(&bus, dir.path(), &[(0, 5)], vec![pod("web", 0)], |_| {});
    wait_until("the delay lock", || logind.held() == 1).await;
    agent.subscribed().await;

    drop(logind);
    let logind = FakeLogind::serve(&bus, shared).await;
    let announced = Instant::now();
    logind.announce(true).await;
    wait_until("the drain after logind's restart", || logind.held() == 0).await;
    assert_eq!(agent.recorder.names(), vec!["default/web"]);
    assert!(agent.status.borrow().bus_connected);
    eprintln!(
        "drained {:?} after the restarted logind announced the shutdown",
        announced.elapsed()
    );
    agent.shut_down().await;
}
