//! The self-isolation guardian: holds the watchdog, pets it while the agent keeps its
//! promise (see [`super::self_isolation`]), asks the isolator to isolate the node once
//! the controller can no longer hear it, and resets the node when that does not hold. It
//! also says in every report whether the promise stands.
//!
//! On a clean stop of the agent, the last report says the promise is withdrawn; the
//! watchdog is stopped only once the controller has answered that report. Otherwise it
//! keeps running, and the node is reset unless an agent opens it again within its
//! timeout: a controller that still believes the promise may release the node's pods.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::self_isolation::{Attempt, Count, SelfIsolationPlan, Verdict, verdict};
use super::watchdog::{NodeReset, Watchdog};
use crate::boot_clock::{since_boot, whole_millis};
use crate::report::protocol::{IsolationState, SelfIsolationReport};
use crate::report::{ContactClock, ReportBoard};

/// What the guardian asks of the isolator: `Some(reason)` isolate the node, `None`
/// nothing (any more).
pub type SelfRequest = Option<String>;

/// Writes the contact clock's state file off the runtime thread.
async fn flush(contact: &Arc<ContactClock>) -> Result<(), String> {
    let contact = contact.clone();
    tokio::task::spawn_blocking(move || contact.flush())
        .await
        .map_err(|error| error.to_string())?
        .map_err(|error| error.to_string())
}

/// The report of an agent that does not isolate its node by itself, and why.
pub fn unarmed(why: &str) -> SelfIsolationReport {
    SelfIsolationReport {
        message: Some(why.to_string()),
        ..SelfIsolationReport::default()
    }
}

/// The withdrawal of the promise by a stopping agent, shared by the report sender (which
/// posts it before its last report) and the guardian (which stops the watchdog only if
/// the controller answered that report).
#[derive(Debug)]
pub struct Withdrawal {
    board: Arc<ReportBoard>,
    at: Mutex<Option<Duration>>,
}

impl Withdrawal {
    pub fn new(board: Arc<ReportBoard>) -> Arc<Withdrawal> {
        Arc::new(Withdrawal {
            board,
            at: Mutex::new(None),
        })
    }

    /// The agent is stopping: from the next report on (sent at `now` or later, on the
    /// boot clock), it promises nothing.
    pub fn announce(&self, now: Duration) {
        self.board
            .set_self_isolation(unarmed("the agent is stopping"));
        let mut at = self.at.lock().unwrap_or_else(|e| e.into_inner());
        at.get_or_insert(now);
    }

    fn announced_at(&self) -> Option<Duration> {
        *self.at.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub struct Guardian {
    plan: SelfIsolationPlan,
    watchdog: Box<dyn Watchdog>,
    reset: Arc<dyn NodeReset>,
    contact: Arc<ContactClock>,
    board: Arc<ReportBoard>,
    requests: watch::Sender<SelfRequest>,
    withdrawal: Arc<Withdrawal>,
    /// The boot clock (a test's own in tests).
    clock: Clock,
    /// When this agent started, on that clock.
    started: Duration,
    /// An isolation whose evidence is older than this counts as not isolated (the
    /// isolator checks it every report interval; one that stopped checking is stuck).
    /// Also how long a starting agent waits for its first answer (see
    /// [`Count::grace`]): three report intervals, at least 10 s, both.
    stale_after: Duration,
}

/// A clock on the boot clock's scale.
pub type Clock = Arc<dyn Fn() -> Duration + Send + Sync>;

/// What the guardian shares with the rest of the agent: the contact clock (with the
/// sender and the Lease reader), the report board, the isolator's requests and the
/// withdrawal (with the sender).
pub struct GuardianLinks {
    pub contact: Arc<ContactClock>,
    pub board: Arc<ReportBoard>,
    pub requests: watch::Sender<SelfRequest>,
    pub withdrawal: Arc<Withdrawal>,
}

impl Guardian {
    pub fn new(
        plan: SelfIsolationPlan,
        watchdog: Box<dyn Watchdog>,
        reset: Arc<dyn NodeReset>,
        links: GuardianLinks,
        stale_after: Duration,
    ) -> Guardian {
        let GuardianLinks {
            contact,
            board,
            requests,
            withdrawal,
        } = links;
        Guardian {
            plan,
            watchdog,
            reset,
            contact,
            board,
            requests,
            withdrawal,
            clock: Arc::new(since_boot),
            started: since_boot(),
            stale_after,
        }
    }

    /// The same guardian on another clock.
    pub fn with_clock(mut self, clock: Clock) -> Guardian {
        self.started = clock();
        self.clock = clock;
        self
    }

    /// The promise this guardian makes.
    pub fn promise(&self) -> SelfIsolationReport {
        SelfIsolationReport {
            armed: true,
            isolate_after_millis: self.plan.isolate_after.as_millis() as u64,
            within_millis: self.plan.within().as_millis() as u64,
            watchdog_timeout_millis: self.watchdog.timeout().as_millis() as u64,
            watchdog: Some(self.watchdog.describe()),
            message: None,
        }
    }

    /// How often the watchdog is petted and the verdict taken: a quarter of the
    /// watchdog's timeout, between 250 ms and 5 s.
    fn pet_every(&self) -> Duration {
        (self.watchdog.timeout() / 4).clamp(Duration::from_millis(250), Duration::from_secs(5))
    }

    /// Guards until `stop` turns true (after the agent's last report went out).
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        // Recorded before any report can carry the promise: a restarted agent of this
        // boot must count from here even if it never heard the controller.
        self.contact.arm((self.clock)());
        if let Err(error) = flush(&self.contact).await {
            let why = format!("self-isolation cannot be recorded in its state file: {error}");
            tracing::error!(%why, "self-isolation is not armed");
            self.board.set_self_isolation(unarmed(&why));
            if let Err(error) = self.watchdog.disarm() {
                tracing::error!(%error, "the watchdog could not be stopped");
            }
            return;
        }
        self.board.set_self_isolation(self.promise());
        // Every report sent from here on carries the promise.
        let published = (self.clock)();
        let mut delivered = false;
        let mut flush_failing = false;
        tracing::info!(
            watchdog = %self.watchdog.describe(),
            timeout = ?self.watchdog.timeout(),
            isolate_after = ?self.plan.isolate_after,
            within = ?self.plan.within(),
            "self-isolation armed: cut off from the controller and the Lease, the agent isolates the node (or resets it)"
        );
        // When this agent asked for the isolation, on its clock: a failure answers the
        // request only if its state began at or after it, on the same clock (the wall
        // clock set back in between would pass over the answer, set forward take an
        // earlier failure for it).
        let mut requested: Option<Duration> = None;
        loop {
            let now = (self.clock)();
            // The controller may hold this promise from here on (kept for a restarted
            // agent of this boot).
            if !delivered && self.contact.report_answered_since(published) {
                self.contact.promise_delivered(self.plan.within());
                delivered = true;
            }
            let plan = self.plan;
            let count = Count {
                counted_from: self.contact.count_from(self.started),
                started: self.started,
                held: self.contact.promised_within(),
                answered_since_start: self.contact.report_answered_since(self.started),
                grace: self.stale_after,
            };
            let isolate_at = plan.isolate_at(&count);
            let facts = self.board.snapshot();
            let isolation = facts.isolation;
            let times = facts.isolation_on_boot_clock;
            // Aged on the boot clock: a wall-clock jump must neither reset an isolated
            // node nor keep a stuck isolator's last word alive.
            let fresh = times
                .checked
                .is_some_and(|checked| now.saturating_sub(checked) <= self.stale_after);
            let attempt = match (requested, times.state_since) {
                (Some(asked), Some(since))
                    if isolation.state == IsolationState::Failed && since >= asked =>
                {
                    Attempt::Failed
                }
                _ => Attempt::Pending,
            };
            let verdict = verdict(
                &plan,
                isolate_at,
                isolation.is_confirmed() && fresh,
                attempt,
                now,
            );
            match verdict {
                Verdict::InContact { .. } => {
                    if requested.take().is_some() {
                        tracing::info!("the controller hears the node again");
                        self.requests.send_replace(None);
                    }
                    self.pet();
                }
                Verdict::Isolated => self.pet(),
                Verdict::Isolate { reset_at } => {
                    if requested.is_none() {
                        let reason = format!(
                            "self-isolation: neither the controller nor the node's Lease heard for {}s",
                            plan.isolate_after.as_secs()
                        );
                        tracing::error!(%reason, reset_in = ?reset_at.saturating_sub(now), "isolating the node by itself; it is reset unless isolated in time");
                        self.requests.send_replace(Some(reason));
                        // `now` was read before the board: a failure posted since counts
                        // as the answer even if it began before the request, which only
                        // resets an unisolated node sooner. In whole milliseconds, as the
                        // record keeps the time its state began.
                        requested = Some(Duration::from_millis(whole_millis(now)));
                    }
                    self.pet();
                }
                Verdict::Reset { why } => {
                    // The watchdog is no longer petted from here on: if the reset fails
                    // or hangs, it resets the node itself.
                    self.reset.reset(&why);
                    tracing::error!(
                        "the node was not reset; the watchdog, no longer petted, will reset it"
                    );
                    let _ = stop.wait_for(|stop| *stop).await;
                    return;
                }
            }
            // After the pet: a slow write must not delay it.
            match flush(&self.contact).await {
                Ok(()) => flush_failing = false,
                Err(error) if !flush_failing => {
                    tracing::warn!(%error, "cannot keep the last contact with the controller; a restarted agent would count from an earlier one");
                    flush_failing = true;
                }
                Err(_) => {}
            }
            tokio::select! {
                _ = tokio::time::sleep(self.pet_every()) => {}
                _ = stop.wait_for(|stop| *stop) => break,
            }
        }
        self.stop().await;
    }

    fn pet(&mut self) {
        if let Err(error) = self.watchdog.pet() {
            tracing::error!(%error, "cannot pet the watchdog; it will reset the node");
        }
    }

    /// A clean stop: the watchdog stops only if the controller heard the promise
    /// withdrawn; then the next agent of the boot owes nothing to this one's promise.
    async fn stop(self) {
        let told = self
            .withdrawal
            .announced_at()
            .is_some_and(|at| self.contact.report_answered_since(at));
        let timeout = self.watchdog.timeout();
        if !told {
            tracing::error!(
                ?timeout,
                "the controller was not told that this agent withdraws its self-isolation promise: the watchdog stays armed and resets the node unless an agent opens it again in time"
            );
            return;
        }
        self.contact.forget();
        if let Err(error) = flush(&self.contact).await {
            tracing::warn!(%error, "cannot record that the promise was withdrawn; the next agent counts from this one's last contact");
        }
        match self.watchdog.disarm() {
            Ok(()) => tracing::info!("self-isolation withdrawn; the watchdog is stopped"),
            Err(error) => tracing::error!(%error, "the watchdog could not be stopped"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::IsolationBootTimes;
    use crate::report::protocol::IsolationReport;
    use k8s_openapi::jiff::Timestamp;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    struct Pets {
        pets: AtomicUsize,
        disarmed: AtomicUsize,
    }

    struct FakeWatchdog(Arc<Pets>);

    impl Watchdog for FakeWatchdog {
        fn pet(&mut self) -> Result<(), String> {
            self.0.pets.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn disarm(self: Box<Self>) -> Result<(), String> {
            self.0.disarmed.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn timeout(&self) -> Duration {
            Duration::from_secs(1)
        }
        fn describe(&self) -> String {
            "fake".to_string()
        }
    }

    #[derive(Default)]
    struct FakeReset(Mutex<Vec<String>>);

    impl NodeReset for FakeReset {
        fn reset(&self, why: &str) {
            self.0.lock().expect("resets").push(why.to_string());
        }
    }

    struct Rig {
        pets: Arc<Pets>,
        reset: Arc<FakeReset>,
        contact: Arc<ContactClock>,
        board: Arc<ReportBoard>,
        requests: watch::Receiver<SelfRequest>,
        withdrawal: Arc<Withdrawal>,
        stop: watch::Sender<bool>,
        task: tokio::task::JoinHandle<()>,
    }

    /// A guardian that isolates after 500 ms of silence and resets 600 ms after that,
    /// looking every 250 ms.
    fn rig() -> Rig {
        rig_with(Arc::new(ContactClock::in_memory()), true)
    }

    /// A guardian on `contact`, answered by the leader as it starts if `answered`.
    fn rig_with(contact: Arc<ContactClock>, answered: bool) -> Rig {
        let pets = Arc::new(Pets::default());
        let reset = Arc::new(FakeReset::default());
        let board = Arc::new(ReportBoard::new());
        let (requests, requested) = watch::channel(None);
        let withdrawal = Withdrawal::new(board.clone());
        let plan = SelfIsolationPlan {
            isolate_after: Duration::from_millis(500),
            budget: Duration::from_millis(600),
            watchdog_timeout: Duration::from_secs(1),
        };
        let guardian = Guardian::new(
            plan,
            Box::new(FakeWatchdog(pets.clone())),
            reset.clone(),
            GuardianLinks {
                contact: contact.clone(),
                board: board.clone(),
                requests,
                withdrawal: withdrawal.clone(),
            },
            Duration::from_secs(6),
        )
        .with_clock(Arc::new(clock));
        if answered {
            contact.report_answered(clock());
        }
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(guardian.run(stopped));
        Rig {
            pets,
            reset,
            contact,
            board,
            requests: requested,
            withdrawal,
            stop,
            task,
        }
    }

    /// Tokio's (paused) clock, on the boot clock's scale.
    fn clock() -> Duration {
        thread_local! {
            static START: tokio::time::Instant = tokio::time::Instant::now();
        }
        Duration::from_secs(1000) + START.with(|start| start.elapsed())
    }

    impl Rig {
        /// Stops the guardian as a stopping agent does, and waits for it.
        async fn stop(self) {
            self.stop.send_replace(true);
            self.task.await.expect("guardian");
        }
    }

    /// The isolator's report of a node isolated, its evidence checked at `checked_at`.
    fn isolated(checked_at: Timestamp) -> IsolationReport {
        IsolationReport {
            state: IsolationState::Isolated,
            since: Some(Timestamp::now()),
            checked_at: Some(checked_at),
            kubelet_stopped: true,
            pod_processes: 0,
            ..IsolationReport::default()
        }
    }

    /// The isolator's times on the boot clock: its state began, and its evidence was
    /// checked, at `at`.
    fn at(at: Duration) -> IsolationBootTimes {
        IsolationBootTimes {
            checked: Some(at),
            state_since: Some(at),
        }
    }

    /// The isolator's report of an isolation that failed at `since` (wall clock).
    fn failed(since: Timestamp) -> IsolationReport {
        IsolationReport {
            state: IsolationState::Failed,
            since: Some(since),
            ..IsolationReport::default()
        }
    }

    fn resets(rig: &Rig) -> Vec<String> {
        rig.reset.0.lock().expect("resets").clone()
    }

    /// The node was reset once, and why says `why` (a failed isolation, or the budget).
    fn assert_reset_once_for(rig: &Rig, why: &str) {
        let said = resets(rig);
        assert!(
            said.len() == 1 && said[0].contains(why),
            "one reset for {why:?}: {said:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_armed_agent_says_so_and_pets_while_it_is_heard() {
        let rig = rig();
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            rig.contact.report_answered(clock());
        }
        let promise = rig.board.snapshot().self_isolation;
        assert!(promise.armed, "{promise:?}");
        assert_eq!(promise.within_millis, 2100);
        assert_eq!(promise.watchdog.as_deref(), Some("fake"));
        assert!(rig.pets.pets.load(Ordering::SeqCst) >= 3);
        assert_eq!(*rig.requests.borrow(), None);
        assert!(resets(&rig).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn cut_off_it_asks_for_the_isolation_and_resets_the_node_when_it_does_not_come() {
        let rig = rig();
        tokio::time::sleep(Duration::from_millis(900)).await;
        let asked = rig.requests.borrow().clone();
        assert!(
            asked
                .as_deref()
                .is_some_and(|r| r.contains("self-isolation")),
            "{asked:?}"
        );
        assert!(resets(&rig).is_empty(), "not before the budget is spent");
        tokio::time::sleep(Duration::from_millis(700)).await;
        let resets = resets(&rig);
        assert_eq!(resets.len(), 1, "{resets:?}");
        let pets = rig.pets.pets.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(
            rig.pets.pets.load(Ordering::SeqCst),
            pets,
            "no pet after the reset was called: the watchdog backs it"
        );
        rig.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_isolation_in_time_keeps_the_watchdog_petted_and_a_failed_one_resets_at_once() {
        let rig = rig();
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(rig.requests.borrow().is_some());
        rig.board
            .set_isolation(isolated(Timestamp::now()), at(clock()));
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(resets(&rig).is_empty(), "{:?}", resets(&rig));
        let pets = rig.pets.pets.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(rig.pets.pets.load(Ordering::SeqCst) > pets);
        // The isolation slips and cannot be put right: reset.
        rig.board
            .set_isolation(failed(Timestamp::now()), at(clock()));
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(resets(&rig).len(), 1);
        rig.stop().await;
    }

    /// Whether a failure answers the agent's own request is read on the boot clock: the
    /// wall clock set two hours back between the request and the failure must not hold
    /// the reset back until the budget runs out (the node would stay unisolated and
    /// unreset meanwhile), nor one set two hours forward have a failure from before the
    /// request reset the node before the isolator tried.
    #[tokio::test(start_paused = true)]
    async fn a_wall_clock_jump_neither_passes_over_a_failure_nor_takes_an_earlier_one_for_it() {
        let hours = Duration::from_secs(2 * 3600);
        let rig = rig();
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(rig.requests.borrow().is_some());
        rig.board
            .set_isolation(failed(Timestamp::now() - hours), at(clock()));
        // The next look, at 1000 ms, resets: before the budget runs out at 1100 ms.
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_reset_once_for(&rig, "could not be isolated");
        rig.stop().await;

        // A failure of an isolation the controller asked for, before this agent lost
        // contact, with the wall clock set forward since.
        let rig = super::tests::rig();
        rig.board
            .set_isolation(failed(Timestamp::now() + hours), at(clock()));
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(rig.requests.borrow().is_some());
        assert!(resets(&rig).is_empty(), "{:?}", resets(&rig));
        // Its own attempt never ends: reset once the budget runs out.
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_reset_once_for(&rig, "was not isolated within");
        rig.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_agent_waits_for_its_first_answer_unless_an_earlier_promise_is_due() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("contact.json");
        // An earlier agent of this boot, heard long ago, withdrew its promise cleanly:
        // the next one counts from its own start and waits for its first answer.
        let earlier = ContactClock::persistent(&path, "boot");
        earlier.report_answered(clock().saturating_sub(Duration::from_secs(900)));
        earlier.forget();
        earlier.flush().expect("write");
        let rig = rig_with(Arc::new(ContactClock::persistent(&path, "boot")), false);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(*rig.requests.borrow(), None, "no isolation at start");
        rig.contact.report_answered(clock());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(*rig.requests.borrow(), None);
        rig.stop().await;

        // One that crashed, having delivered a promise of 2 s a second ago: the next one
        // isolates by that promise (2 s - budget 0.6 s - watchdog 1 s = 0.4 s after the
        // last contact) without waiting for its grace.
        let crashed = ContactClock::persistent(&path, "boot");
        crashed.report_answered(clock().saturating_sub(Duration::from_millis(100)));
        crashed.promise_delivered(Duration::from_secs(2));
        crashed.flush().expect("write");
        let rig = rig_with(Arc::new(ContactClock::persistent(&path, "boot")), false);
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(
            rig.requests.borrow().is_some(),
            "isolated by the earlier promise"
        );
        rig.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_isolation_whose_evidence_went_stale_is_no_isolation() {
        let rig = rig();
        tokio::time::sleep(Duration::from_millis(900)).await;
        // The isolator reported the node isolated, then stopped checking (stuck).
        let minute = Duration::from_secs(60);
        rig.board.set_isolation(
            isolated(Timestamp::now() - minute),
            at(clock().saturating_sub(minute)),
        );
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(resets(&rig).len(), 1, "reset once the budget ran out");
        rig.stop().await;
    }

    /// The evidence's age is read on the boot clock, not from its wall time: the wall
    /// clock set an hour forward since the check must not reset an isolated node, nor
    /// one set an hour back keep a stuck isolator's last word alive.
    #[tokio::test(start_paused = true)]
    async fn a_wall_clock_jump_neither_ages_an_isolation_nor_keeps_it_fresh() {
        let hour = Duration::from_secs(3600);
        let rig = rig();
        tokio::time::sleep(Duration::from_millis(900)).await;
        rig.board
            .set_isolation(isolated(Timestamp::now() - hour), at(clock()));
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(resets(&rig).is_empty(), "{:?}", resets(&rig));
        rig.stop().await;

        let rig = super::tests::rig();
        tokio::time::sleep(Duration::from_millis(900)).await;
        rig.board.set_isolation(
            isolated(Timestamp::now() + hour),
            at(clock().saturating_sub(Duration::from_secs(60))),
        );
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(resets(&rig).len(), 1, "stale on the boot clock");
        rig.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_clean_stop_stops_the_watchdog_only_once_the_controller_heard_the_withdrawal() {
        let rig = rig();
        tokio::time::sleep(Duration::from_millis(100)).await;
        rig.withdrawal.announce(clock());
        assert!(!rig.board.snapshot().self_isolation.armed);
        // The last report did not get through: the watchdog stays armed.
        let pets = rig.pets.clone();
        rig.stop().await;
        assert_eq!(pets.disarmed.load(Ordering::SeqCst), 0);

        let rig = super::tests::rig();
        tokio::time::sleep(Duration::from_millis(100)).await;
        rig.withdrawal.announce(clock());
        rig.contact.report_answered(clock());
        let pets = rig.pets.clone();
        rig.stop().await;
        assert_eq!(pets.disarmed.load(Ordering::SeqCst), 1);
    }
}
