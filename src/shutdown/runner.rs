//! Runs a shutdown's phases: lowest priority first, empty phases skipped without waiting,
//! the pods of a phase terminated in parallel, every phase bounded by its timer, and a
//! cancellation seen even in the middle of a phase. Progress is persisted after each step.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::plan::PlannedPod;
use super::state::{ClockReading, PhaseStatus, ShutdownState, StateError, StateStore};

/// How a pod ended up after [`PodTerminator::terminate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Termination {
    /// Stopped within its grace period.
    Graceful,
    /// Still running when the grace period ran out, then killed.
    Killed,
    /// Nothing to stop (no such workload, or already gone).
    NotFound,
    /// Dry-run mode: only logged, nothing was stopped.
    DryRun,
}

impl std::fmt::Display for Termination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Termination::Graceful => "stopped within its grace period",
            Termination::Killed => "killed when its grace period ran out",
            Termination::NotFound => "nothing to stop",
            Termination::DryRun => "dry run, not stopped",
        })
    }
}

/// The terminator of a dry run: says which pod it would stop, with which grace period,
/// and touches nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct DryRunTerminator;

impl PodTerminator for DryRunTerminator {
    async fn terminate(
        &self,
        pod: &PlannedPod,
        grace: Duration,
    ) -> Result<Termination, TerminateError> {
        tracing::warn!(
            pod = %pod.key(),
            grace_period_seconds = grace.as_secs(),
            "dry run: would stop pod for node shutdown"
        );
        Ok(Termination::DryRun)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot terminate {pod}: {message}")]
pub struct TerminateError {
    pub pod: String,
    pub message: String,
}

/// Stops one pod within `grace`. Standalone mode kills a workload cgroup; the Kubernetes
/// mode deletes the pod through the API. Implementations return once the pod is gone or
/// they gave up; the runner bounds the whole phase regardless.
pub trait PodTerminator: Send + Sync + 'static {
    fn terminate(
        &self,
        pod: &PlannedPod,
        grace: Duration,
    ) -> impl Future<Output = Result<Termination, TerminateError>> + Send;
}

/// The clocks a shutdown reads, injected so tests control them: the wall clock for its
/// record, the boot clock for its timers (see [`ClockReading`]).
pub trait ShutdownClock: Send + Sync {
    fn now_unix_ms(&self) -> u64;
    fn since_boot_ms(&self) -> u64;
    fn read(&self) -> ClockReading {
        ClockReading {
            unix_ms: self.now_unix_ms(),
            boot_ms: self.since_boot_ms(),
        }
    }
}

pub struct SystemClock;

impl ShutdownClock for SystemClock {
    fn now_unix_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    fn since_boot_ms(&self) -> u64 {
        crate::boot_clock::since_boot_ms()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    Finished,
    Cancelled,
}

/// The status of a phase whose pods have all ended at `now`: timed out if the budget ran
/// out first. A pod that ignored SIGTERM is killed at the end of a grace period cut to the
/// budget, so its termination ends just as the phase's timer does, and the runtime may see
/// either first (the agent's shutdown test once saw a 4 s phase end "completed" at 4,003
/// ms); the phase used its whole budget and timed out either way.
fn all_ended(now: tokio::time::Instant, deadline: tokio::time::Instant) -> PhaseStatus {
    if now >= deadline {
        PhaseStatus::TimedOut
    } else {
        PhaseStatus::Completed
    }
}

/// Run every phase of `state` that is not done yet. `cancelled` turning true stops the
/// run at once (terminations in flight are abandoned, later phases never start).
/// A state file that cannot be written is logged, not fatal: draining matters more.
pub async fn run_phases<T: PodTerminator>(
    state: &mut ShutdownState,
    terminator: Arc<T>,
    store: &StateStore,
    clock: &dyn ShutdownClock,
    mut cancelled: watch::Receiver<bool>,
) -> RunOutcome {
    let mut cancel_sender_gone = false;
    for index in 0..state.phases.len() {
        if state.phases[index].is_done() {
            continue;
        }
        if *cancelled.borrow_and_update() {
            return cancel(state, store, clock).await;
        }
        let priority = state.phases[index].priority;
        if state.phases[index].pods.is_empty() {
            state.end_phase(index, PhaseStatus::Skipped, vec![], clock.read());
            persist(store, state).await;
            continue;
        }
        let now = clock.read();
        let budget = Duration::from_millis(state.remaining_budget_ms(index, now));
        state.start_phase(index, now);
        persist(store, state).await;
        tracing::info!(
            priority,
            pods = state.phases[index].pods.len(),
            budget_ms = budget.as_millis() as u64,
            "shutdown phase started"
        );

        let mut terminations = JoinSet::new();
        for stored in &state.phases[index].pods {
            let mut pod = PlannedPod::from(stored);
            let grace_ms = u64::try_from(pod.grace_period_seconds.max(0))
                .unwrap_or(0)
                .saturating_mul(1000);
            // The phase's remaining time bounds the grace period, even below the pod
            // worker's 1 s (the plan already applied it): once the budget is spent logind
            // powers off regardless, so a pod must be gone before the lock is released.
            // The API terminator still never asks for a 0 s delete (kubernetes::api).
            let grace = Duration::from_millis(grace_ms).min(budget);
            pod.grace_period_seconds = i64::try_from(grace.as_secs()).unwrap_or(i64::MAX);
            let terminator = Arc::clone(&terminator);
            terminations.spawn(async move {
                let result = terminator.terminate(&pod, grace).await;
                (pod.key(), result)
            });
        }

        let mut failed = Vec::new();
        let deadline = tokio::time::Instant::now() + budget;
        let timer = tokio::time::sleep_until(deadline);
        tokio::pin!(timer);
        let status = loop {
            tokio::select! {
                joined = terminations.join_next() => match joined {
                    None => break all_ended(tokio::time::Instant::now(), deadline),
                    Some(Ok((key, Ok(outcome)))) => {
                        tracing::info!(pod = %key, %outcome, "pod terminated for node shutdown");
                    }
                    Some(Ok((key, Err(error)))) => {
                        tracing::warn!(pod = %key, %error, "pod termination failed");
                        failed.push(key);
                    }
                    Some(Err(error)) => tracing::warn!(%error, "pod termination task failed"),
                },
                () = &mut timer => {
                    tracing::warn!(priority, "shutdown phase timed out with pods still terminating");
                    // Like the kubelet, the next phase starts; stragglers finish on their own.
                    terminations.detach_all();
                    break PhaseStatus::TimedOut;
                }
                changed = cancelled.changed(), if !cancel_sender_gone => {
                    // A dropped sender can never cancel; stop listening to it.
                    cancel_sender_gone = changed.is_err();
                    if !cancel_sender_gone && *cancelled.borrow_and_update() {
                        terminations.abort_all();
                        return cancel(state, store, clock).await;
                    }
                }
            }
        };
        failed.sort();
        state.end_phase(index, status, failed, clock.read());
        persist(store, state).await;
        tracing::info!(priority, %status, "shutdown phase ended");
    }
    state.finish(clock.now_unix_ms());
    persist(store, state).await;
    RunOutcome::Finished
}

async fn cancel(
    state: &mut ShutdownState,
    store: &StateStore,
    clock: &dyn ShutdownClock,
) -> RunOutcome {
    state.cancel(clock.now_unix_ms());
    persist(store, state).await;
    tracing::info!("shutdown cancelled; remaining phases will not run");
    RunOutcome::Cancelled
}

/// Save the progress on the blocking pool: the fsync can take seconds on a disk starved
/// by memory pressure, and the runtime must keep serving D-Bus and the API meanwhile.
async fn persist(store: &StateStore, state: &ShutdownState) {
    let (store, state) = (store.clone(), state.clone());
    match tokio::task::spawn_blocking(move || store.save(&state)).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => log_state_error(&error),
        Err(error) => {
            tracing::error!(%error, "shutdown progress not persisted: the save task failed")
        }
    }
}

fn log_state_error(error: &StateError) {
    tracing::error!(%error, "shutdown progress not persisted");
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::pods::Pod;
    use crate::shutdown::plan::{PhaseSpec, plan};
    use crate::shutdown::state::ShutdownOutcome;

    /// Pods named `hang-*` never stop; others stop after `stop-after-<ms>` or at once.
    #[derive(Default)]
    struct FakeTerminator {
        calls: Mutex<Vec<(String, Duration, tokio::time::Instant)>>,
    }

    impl PodTerminator for FakeTerminator {
        async fn terminate(
            &self,
            pod: &PlannedPod,
            grace: Duration,
        ) -> Result<Termination, TerminateError> {
            self.calls
                .lock()
                .unwrap()
                .push((pod.key(), grace, tokio::time::Instant::now()));
            if pod.name.starts_with("hang") {
                std::future::pending::<()>().await;
            }
            if pod.name.starts_with("fail") {
                return Err(TerminateError {
                    pod: pod.key(),
                    message: "boom".into(),
                });
            }
            if let Some(ms) = pod.name.strip_prefix("stop-after-") {
                tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
            }
            Ok(Termination::Graceful)
        }
    }

    /// Clocks that follow tokio's paused clock; the wall clock can be set (`base_ms`),
    /// the boot clock cannot.
    struct PausedClock {
        origin: tokio::time::Instant,
        base_ms: AtomicU64,
    }

    /// The boot clock's reading at the paused clock's origin.
    const BOOTED_MS_AGO: u64 = 50_000;

    impl PausedClock {
        /// Sets the wall clock `by_ms` forward (or back, when negative).
        fn jump(&self, by_ms: i64) {
            let base = self.base_ms.load(Ordering::Relaxed);
            let moved = base.saturating_add_signed(by_ms).max(1);
            self.base_ms.store(moved, Ordering::Relaxed);
        }

        fn boot_ms_at(&self, at: tokio::time::Instant) -> u64 {
            BOOTED_MS_AGO + (at - self.origin).as_millis() as u64
        }
    }

    impl ShutdownClock for PausedClock {
        fn now_unix_ms(&self) -> u64 {
            self.base_ms.load(Ordering::Relaxed) + self.origin.elapsed().as_millis() as u64
        }

        fn since_boot_ms(&self) -> u64 {
            self.boot_ms_at(tokio::time::Instant::now())
        }
    }

    fn clock() -> PausedClock {
        PausedClock {
            origin: tokio::time::Instant::now(),
            base_ms: AtomicU64::new(10_000_000_000),
        }
    }

    fn pod(name: &str, priority: i32, tgps: Option<i64>) -> Pod {
        Pod {
            namespace: "ns".into(),
            name: name.into(),
            priority,
            termination_grace_period_seconds: tgps,
            ..Pod::default()
        }
    }

    fn state_for(phases: &[(i32, i64)], pods: &[Pod]) -> ShutdownState {
        let specs: Vec<PhaseSpec> = phases
            .iter()
            .map(|&(priority, seconds)| PhaseSpec { priority, seconds })
            .collect();
        ShutdownState::begin(&plan(&specs, pods), "boot", 1_000_000)
    }

    fn offsets(fake: &FakeTerminator, start: tokio::time::Instant) -> Vec<(String, u64, u64)> {
        fake.calls
            .lock()
            .unwrap()
            .iter()
            .map(|(key, grace, at)| {
                (
                    key.clone(),
                    grace.as_secs(),
                    (*at - start).as_millis() as u64,
                )
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn phases_run_lowest_priority_first_each_bounded_by_its_timer() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("state.json"));
        let pods = [
            pod("hang-low", 0, None),
            pod("stop-after-2000", 0, Some(5)),
            pod("critical", 2_000_000_000, None),
            pod("mid", 500, Some(3)),
        ];
        let mut state = state_for(&[(2_000_000_000, 10), (0, 20), (100, 7), (500, 30)], &pods);
        let fake = Arc::new(FakeTerminator::default());
        let clock = clock();
        let start = tokio::time::Instant::now();
        let (_tx, cancelled) = watch::channel(false);
        let outcome = run_phases(&mut state, Arc::clone(&fake), &store, &clock, cancelled).await;
        assert_eq!(outcome, RunOutcome::Finished);
        // Phase 0 waits its full 20 s for the hanging pod; phase 100 is empty and costs
        // nothing; phase 500 finishes as soon as its pod stops.
        assert_eq!(
            offsets(&fake, start),
            vec![
                ("ns/hang-low".into(), 20, 0),
                ("ns/stop-after-2000".into(), 5, 0),
                ("ns/mid".into(), 3, 20_000),
                ("ns/critical".into(), 10, 20_000),
            ]
        );
        let statuses: Vec<PhaseStatus> = state.phases.iter().map(|p| p.status).collect();
        assert_eq!(
            statuses,
            vec![
                PhaseStatus::TimedOut,
                PhaseStatus::Skipped,
                PhaseStatus::Completed,
                PhaseStatus::Completed,
            ]
        );
        assert_eq!(state.outcome, ShutdownOutcome::Finished);
        assert_eq!(store.load().unwrap(), Some(state));
    }

    /// Pods that all ended as the budget ran out, or after it (the timer's wake-up seen
    /// late), timed the phase out; ended before it, they completed it.
    #[test]
    fn pods_ending_as_the_budget_runs_out_time_the_phase_out() {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
        let at = |ms: i64| {
            let offset = Duration::from_millis(ms.unsigned_abs());
            if ms < 0 {
                deadline - offset
            } else {
                deadline + offset
            }
        };
        assert_eq!(all_ended(at(-1), deadline), PhaseStatus::Completed);
        assert_eq!(all_ended(at(0), deadline), PhaseStatus::TimedOut);
        assert_eq!(all_ended(at(3), deadline), PhaseStatus::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn cancellation_is_seen_in_the_middle_of_a_phase() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("state.json"));
        let pods = [pod("hang", 0, None), pod("later", 1000, None)];
        let mut state = state_for(&[(0, 60), (1000, 60)], &pods);
        let fake = Arc::new(FakeTerminator::default());
        let clock = clock();
        let (tx, cancelled) = watch::channel(false);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            tx.send(true).unwrap();
            tx.closed().await;
        });
        let start = tokio::time::Instant::now();
        let outcome = run_phases(&mut state, Arc::clone(&fake), &store, &clock, cancelled).await;
        assert_eq!(outcome, RunOutcome::Cancelled);
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        assert_eq!(
            fake.calls.lock().unwrap().len(),
            1,
            "later phase must not start"
        );
        let saved = store.load().unwrap().unwrap();
        assert_eq!(saved.outcome, ShutdownOutcome::Cancelled);
        assert_eq!(saved.phases[1].status, PhaseStatus::Cancelled);
    }

    #[tokio::test(start_paused = true)]
    async fn a_resumed_run_skips_done_phases_and_shortens_the_interrupted_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("state.json"));
        let pods = [
            pod("a", 0, None),
            pod("hang-b", 10, None),
            pod("c", 20, None),
        ];
        let mut state = state_for(&[(0, 5), (10, 30), (20, 5)], &pods);
        let clock = clock();
        let ago = |ms: u64| ClockReading {
            unix_ms: clock.now_unix_ms() - ms,
            boot_ms: clock.since_boot_ms() - ms,
        };
        state.end_phase(0, PhaseStatus::Completed, vec![], ago(20_000));
        state.start_phase(1, ago(12_000));
        let fake = Arc::new(FakeTerminator::default());
        let start = tokio::time::Instant::now();
        let (_tx, cancelled) = watch::channel(false);
        run_phases(&mut state, Arc::clone(&fake), &store, &clock, cancelled).await;
        assert_eq!(
            offsets(&fake, start),
            vec![("ns/hang-b".into(), 18, 0), ("ns/c".into(), 5, 18_000)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failed_terminations_are_recorded_and_do_not_stop_the_phase() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("state.json"));
        let pods = [pod("fail-1", 0, None), pod("ok", 0, None)];
        let mut state = state_for(&[(0, 10)], &pods);
        let (tx, cancelled) = watch::channel(false);
        drop(tx);
        let fake = Arc::new(FakeTerminator::default());
        run_phases(&mut state, fake, &store, &clock(), cancelled).await;
        assert_eq!(state.phases[0].status, PhaseStatus::Completed);
        assert_eq!(state.phases[0].failed_pods, vec!["ns/fail-1".to_string()]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_huge_grace_period_is_bounded_by_the_phase_instead_of_overflowing() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("state.json"));
        let pods = [pod("ok", 0, None)];
        let mut state = state_for(&[(0, 10)], &pods);
        // As read back from a corrupt or hand-edited state file.
        state.phases[0].pods[0].grace_period_seconds = i64::MAX;
        let (_tx, cancelled) = watch::channel(false);
        let fake = Arc::new(FakeTerminator::default());
        let start = tokio::time::Instant::now();
        run_phases(&mut state, Arc::clone(&fake), &store, &clock(), cancelled).await;
        assert_eq!(offsets(&fake, start), vec![("ns/ok".into(), 10, 0)]);
    }

    /// How a pod of the budget property responds to its termination.
    #[derive(Debug, Clone, Copy)]
    enum Response {
        StopsAfterMs(u64),
        Hangs,
        Fails,
    }

    /// Answers each pod (named `p<index>`) as its script says, recording every call.
    struct ScriptedTerminator {
        responses: Vec<Response>,
        calls: Mutex<Vec<(usize, Duration, tokio::time::Instant)>>,
    }

    impl PodTerminator for ScriptedTerminator {
        async fn terminate(
            &self,
            pod: &PlannedPod,
            grace: Duration,
        ) -> Result<Termination, TerminateError> {
            let index: usize = pod.name[1..].parse().expect("pods are named p<index>");
            self.calls
                .lock()
                .unwrap()
                .push((index, grace, tokio::time::Instant::now()));
            match self.responses[index] {
                Response::StopsAfterMs(ms) => {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Ok(Termination::Graceful)
                }
                Response::Hangs => std::future::pending().await,
                Response::Fails => Err(TerminateError {
                    pod: pod.key(),
                    message: "refused".into(),
                }),
            }
        }
    }

    fn response() -> impl proptest::strategy::Strategy<Value = Response> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u64..45_000).prop_map(Response::StopsAfterMs),
            1 => Just(Response::Hangs),
            1 => Just(Response::Fails),
        ]
    }

    /// How far the wall clock is set while the agent is down: mostly not at all, else
    /// up to a day forward or back.
    fn wall_clock_jump() -> impl proptest::strategy::Strategy<Value = i64> {
        use proptest::prelude::*;
        prop_oneof![
            2 => Just(0i64),
            1 => -86_400_000i64..86_400_000,
        ]
    }

    fn priority() -> impl proptest::strategy::Strategy<Value = i32> {
        proptest::sample::select(vec![-10, 0, 1, 100, 1000, 2_000_000_000])
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(192))]

        /// Shutdown phases never exceed their budget: for any phases (duplicate and
        /// negative ones included), pods that stop late, hang or fail, and agent restarts
        /// in the middle (the run dropped, then resumed from the state file after a
        /// pause), no phase runs past its own period counted from its first start, unless
        /// the agent came back only after it had run out, and whatever the wall clock was
        /// set to while the agent was down; no pod is given a grace period
        /// that reaches past its phase's end; phases run in order, every pod of the plan
        /// is asked to stop, and without restarts the whole drain fits the budget logind
        /// is asked for.
        #[test]
        fn shutdown_phases_never_exceed_their_budget(
            phases in proptest::collection::vec((priority(), -3i64..40), 0..5),
            pods in proptest::collection::vec(
                (priority(), proptest::option::of(-2i64..60), response()),
                0..7,
            ),
            restarts in proptest::collection::vec(
                (0u64..90_000, 0u64..5_000, wall_clock_jump()),
                0..3,
            ),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            runtime.block_on(check_budget(phases, pods, restarts));
        }
    }

    /// A period of whole seconds in milliseconds; a negative one is none.
    fn period_ms(seconds: i64) -> u64 {
        u64::try_from(seconds.max(0)).unwrap() * 1000
    }

    async fn check_budget(
        phases: Vec<(i32, i64)>,
        pods: Vec<(i32, Option<i64>, Response)>,
        restarts: Vec<(u64, u64, i64)>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("state.json"));
        let listed: Vec<Pod> = pods
            .iter()
            .enumerate()
            .map(|(index, &(priority, tgps, _))| pod(&format!("p{index}"), priority, tgps))
            .collect();
        let specs: Vec<PhaseSpec> = phases
            .iter()
            .map(|&(priority, seconds)| PhaseSpec { priority, seconds })
            .collect();
        let planned = plan(&specs, &listed);
        assert_eq!(
            planned.total_seconds,
            phases
                .iter()
                .map(|&(_, seconds)| seconds.max(0))
                .sum::<i64>()
        );
        let clock = clock();
        let mut state = ShutdownState::begin(&planned, "boot", clock.now_unix_ms());
        let terminator = Arc::new(ScriptedTerminator {
            responses: pods.iter().map(|&(_, _, response)| response).collect(),
            calls: Mutex::new(Vec::new()),
        });
        let (_tx, cancelled) = watch::channel(false);
        // Every time below is on the boot clock: the wall clock may jump.
        let began = clock.since_boot_ms();
        let mut resumed_at = Vec::new();
        for (run_for, down_for, jump) in restarts {
            let run = run_phases(
                &mut state,
                Arc::clone(&terminator),
                &store,
                &clock,
                cancelled.clone(),
            );
            if tokio::time::timeout(Duration::from_millis(run_for), run)
                .await
                .is_ok()
            {
                break;
            }
            // The agent is killed, stays down a while, and starts again from its file.
            tokio::time::sleep(Duration::from_millis(down_for)).await;
            clock.jump(jump);
            state = store.load().unwrap().expect("a begun shutdown was stored");
            resumed_at.push(clock.since_boot_ms());
        }
        if state.outcome == ShutdownOutcome::InProgress {
            let outcome = run_phases(
                &mut state,
                Arc::clone(&terminator),
                &store,
                &clock,
                cancelled,
            )
            .await;
            assert_eq!(outcome, RunOutcome::Finished);
        }
        assert!(state.all_phases_finished(), "{state:?}");

        let calls = terminator.calls.lock().unwrap().clone();
        let mut previous_end = began;
        for phase in &state.phases {
            let (Some(started), Some(finished)) = (phase.started_boot_ms, phase.finished_boot_ms)
            else {
                panic!("phase {phase:?} did not record its run");
            };
            assert!(started >= previous_end, "phases overlap: {state:?}");
            let end_ms = started + period_ms(phase.seconds);
            // A restart that came only after the phase's time ran out ends it at once.
            let late_return = resumed_at
                .iter()
                .copied()
                .filter(|&at| at <= finished)
                .max()
                .unwrap_or(0);
            assert!(
                finished <= end_ms.max(late_return),
                "phase of priority {} ran {} ms of its {} ms: {state:?}",
                phase.priority,
                finished - started,
                period_ms(phase.seconds),
            );
            previous_end = finished;
            for stopped in &phase.pods {
                let pod_index: usize = stopped.name[1..].parse().unwrap();
                let asked: Vec<_> = calls.iter().filter(|call| call.0 == pod_index).collect();
                assert!(
                    !asked.is_empty(),
                    "{} was never asked to stop",
                    stopped.name
                );
                for (_, grace, at) in asked {
                    let at_ms = clock.boot_ms_at(*at);
                    assert!(
                        at_ms >= started,
                        "{} asked to stop before its phase began",
                        stopped.name
                    );
                    assert!(
                        at_ms + grace.as_millis() as u64 <= end_ms.max(at_ms),
                        "{} given {grace:?} at {at_ms}, past its phase's end at {end_ms}",
                        stopped.name
                    );
                }
            }
        }
        if resumed_at.is_empty() {
            let total_ms = period_ms(planned.total_seconds);
            assert!(
                clock.since_boot_ms() - began <= total_ms,
                "the drain took {} ms of a {total_ms} ms budget",
                clock.since_boot_ms() - began
            );
        }
    }
}
