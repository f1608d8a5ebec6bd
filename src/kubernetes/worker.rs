//! The async side of the outbox: one sender per lane, each sending its queued writes in
//! order, backing off on its own while the API server fails, and exporting what happened
//! as metrics. Callers on the synchronous eviction path only lock, push and wake it; they
//! never wait on the API.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::api::ApiWriter;
use super::journal::Journal;
use super::outbox::{ApiAction, Lane, Outbox, Outcome, Pushed};
use crate::metrics::{ApiActionLabels, Metrics};
use crate::report::reachability::answered_again;

/// The `outcome` labels of the API actions counter.
const OUTCOMES: [&str; 5] = ["done", "retried", "rejected", "dropped", "dry_run"];

/// Shared access to the outbox, cheap to clone.
#[derive(Clone)]
pub struct OutboxHandle {
    outbox: Arc<Mutex<Outbox>>,
    /// One per lane: a push wakes only the sender of its own lane, so a sender sleeping
    /// out a backoff is never the one woken for the other lane's write.
    wake: Arc<[Notify; 2]>,
    /// Signalled whenever an attempt ends, for [`OutboxHandle::flush`].
    progress: Arc<Notify>,
    /// Set while [`OutboxHandle::flush`] runs (the agent is stopping): a sender waiting
    /// out a long backoff tries again at once, and meanwhile every `retry.base`.
    hurry: Arc<(AtomicBool, Notify)>,
    metrics: Arc<OnceLock<Arc<Metrics>>>,
    /// Where the writes owed are kept for a restarted agent, once set.
    journal: Arc<OnceLock<Journal>>,
    /// Every attempt's outcome says whether the API server answers.
    pub reachability: crate::report::ApiReachability,
}

impl OutboxHandle {
    pub fn new(capacity: usize) -> Self {
        OutboxHandle {
            outbox: Arc::new(Mutex::new(Outbox::new(capacity))),
            wake: Arc::new([Notify::new(), Notify::new()]),
            progress: Arc::new(Notify::new()),
            hurry: Arc::new((AtomicBool::new(false), Notify::new())),
            metrics: Arc::new(OnceLock::new()),
            journal: Arc::new(OnceLock::new()),
            reachability: Default::default(),
        }
    }

    /// Dry run: from now on every pushed write is logged and counted, never sent.
    pub fn set_dry_run(&self, dry_run: bool) {
        self.lock().set_dry_run(dry_run);
    }

    pub fn is_dry_run(&self) -> bool {
        self.lock().is_dry_run()
    }

    /// Export counts to `metrics` from now on, from every clone of this handle, every
    /// series starting at zero.
    pub fn set_metrics(&self, metrics: Arc<Metrics>) {
        metrics.start_api_action_series(&ApiAction::KINDS, &OUTCOMES);
        if let Some(journal) = self.journal.get() {
            journal.count_failures_in(metrics.state_write_failures("api_writes"));
        }
        let _ = self.metrics.set(metrics);
    }

    /// Keep the writes owed in `journal` from now on, for an agent restarted after a
    /// crash; each change to them rewrites it. Set once; a second journal is ignored.
    pub fn set_journal(&self, journal: Journal) {
        let _ = self.journal.set(journal);
    }

    /// The journal's new contents, taken under the outbox lock, when what it keeps has
    /// changed since it was written. Written by [`OutboxHandle::write_journal`] after the
    /// lock is released, so senders never wait on the file.
    fn journal_update(&self, outbox: &Outbox) -> Option<(u64, Vec<ApiAction>)> {
        let journal = self.journal.get()?;
        let generation = outbox.generation();
        journal
            .is_behind(generation)
            .then(|| (generation, outbox.kept().cloned().collect()))
    }

    fn write_journal(&self, update: Option<(u64, Vec<ApiAction>)>) {
        if let (Some(journal), Some((generation, writes))) = (self.journal.get(), update) {
            journal.save(generation, &writes);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Outbox> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.outbox
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn wake(&self, lane: Lane) -> &Notify {
        match lane {
            Lane::Pods => &self.wake[0],
            Lane::Bookkeeping => &self.wake[1],
        }
    }

    fn count(&self, action: &str, outcome: &'static str) {
        debug_assert!(OUTCOMES.contains(&outcome), "{outcome}");
        if let Some(metrics) = self.metrics.get() {
            metrics
                .api_actions
                .get_or_create(&ApiActionLabels {
                    action: action.to_string(),
                    outcome: outcome.to_string(),
                })
                .inc();
        }
    }

    fn publish_pending(&self, pending: usize) {
        if let Some(metrics) = self.metrics.get() {
            metrics
                .api_outbox_pending
                .set(i64::try_from(pending).unwrap_or(i64::MAX));
        }
    }

    /// Queue a write and wake its lane's sender. Never blocks on the network. In dry-run
    /// mode the write is logged at INFO and counted instead.
    pub fn push(&self, action: ApiAction) -> Pushed {
        match self.push_all([action]).pop() {
            Some(pushed) => pushed,
            None => Pushed::Duplicate,
        }
    }

    /// [`OutboxHandle::push`] for several writes at once (an eviction's event, condition
    /// and delete), in order, under one lock: the journal is written once for them all,
    /// so a crash never finds part of them kept.
    pub fn push_all(&self, actions: impl IntoIterator<Item = ApiAction>) -> Vec<Pushed> {
        let mut outbox = self.lock();
        let dry_run = outbox.is_dry_run();
        let mut pushed = Vec::new();
        // What is logged, counted and woken for each write once the lock is released.
        let mut after = Vec::new();
        for action in actions {
            let (kind, lane) = (action.kind(), action.lane());
            // A dry run logs what it would do; only then is the write described.
            let would = dry_run.then(|| (action.target(), action.describe()));
            let outcome = outbox.push(action);
            after.push((kind, lane, would, outcome.clone()));
            pushed.push(outcome);
        }
        let pending = outbox.len();
        let journal = self.journal_update(&outbox);
        drop(outbox);
        self.write_journal(journal);
        for (kind, lane, would, outcome) in after {
            if let Some((target, describe)) = would {
                tracing::info!(action = kind, %target, "dry run: would {describe}");
                self.count(kind, "dry_run");
                continue;
            }
            match outcome {
                Pushed::QueuedDroppingOldest(dropped) => {
                    tracing::warn!(dropped, "API outbox full; dropped the oldest {dropped}");
                    self.count(dropped, "dropped");
                }
                Pushed::DroppedNew => {
                    tracing::warn!(action = kind, "API outbox full; dropped a new {kind}");
                    self.count(kind, "dropped");
                }
                _ => {}
            }
            self.wake(lane).notify_one();
        }
        if !dry_run {
            self.publish_pending(pending);
        }
        pushed
    }

    /// Write the journal again if the last write of it failed (the disk was full): the
    /// agent's cycle calls this, so a journal left stale is mended without waiting for
    /// the next write to be queued.
    pub fn mend_journal(&self) {
        let update = self.journal_update(&self.lock());
        self.write_journal(update);
    }

    /// Everything still owed: the pod lane in order, then the bookkeeping lane.
    pub fn pending(&self) -> Vec<ApiAction> {
        self.lock().pending().cloned().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// How many writes are still owed (the one being sent included).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Wait until both lanes are empty or `deadline` passes, for a bounded flush on stop:
    /// `handle.flush(Instant::now() + Duration::from_secs(5)).await` before aborting the
    /// sender. The senders stop waiting out their backoff: each retries at once, then
    /// every `retry.base`. Returns whether everything went out; what is left is logged.
    pub async fn flush(&self, deadline: Instant) -> bool {
        /// Ends the hurry however the flush ends (returned or dropped).
        struct Hurrying<'a>(&'a AtomicBool);
        impl Drop for Hurrying<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::SeqCst);
            }
        }
        let (hurrying, hurry) = &*self.hurry;
        hurrying.store(true, Ordering::SeqCst);
        let _hurrying = Hurrying(hurrying);
        hurry.notify_waiters();
        loop {
            // Registered before looking, so progress between the look and the wait wakes us.
            let progress = self.progress.notified();
            tokio::pin!(progress);
            progress.as_mut().enable();
            if self.is_empty() {
                return true;
            }
            if tokio::time::timeout_at(deadline, progress).await.is_err() {
                break;
            }
        }
        let left = self.pending();
        if left.is_empty() {
            return true;
        }
        for lane in Lane::ALL {
            let owed: Vec<String> = left
                .iter()
                .filter(|action| action.lane() == lane)
                .map(|action| format!("{} {}", action.kind(), action.target()))
                .collect();
            if !owed.is_empty() {
                tracing::warn!(
                    lane = lane.as_str(),
                    count = owed.len(),
                    left = %owed.join(", "),
                    "API writes not sent before the flush deadline"
                );
            }
        }
        false
    }
}

/// How long to wait between failed attempts.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub base: Duration,
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_millis(200),
            max: Duration::from_secs(10),
        }
    }
}

/// What carries out one write; the API server in production, a fake in unit tests.
pub trait ActionWriter: Send + Sync {
    fn execute(&self, action: &ApiAction) -> impl Future<Output = Outcome> + Send;
}

impl ActionWriter for ApiWriter {
    fn execute(&self, action: &ApiAction) -> impl Future<Output = Outcome> + Send {
        ApiWriter::execute(self, action)
    }
}

/// Send queued writes forever, both lanes at once; run it as a task and abort it to stop.
pub async fn run_outbox<W: ActionWriter>(handle: OutboxHandle, writer: W, retry: RetryPolicy) {
    tokio::join!(
        run_lane(&handle, &writer, retry, Lane::Pods),
        run_lane(&handle, &writer, retry, Lane::Bookkeeping),
    );
}

/// How long one write may wait for its answer. The API server gives up on a request
/// itself after a minute (`--request-timeout`) and answers 504; a write with no answer
/// at all after this long is on a connection that a partition or a lost server instance
/// left silent. The client sets no read timeout, so such a write would hold its lane
/// until the kernel gives up on the connection (about a quarter of an hour when packets
/// are lost; never when something in between acknowledges them). Every write is safe to
/// send again.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

async fn run_lane<W: ActionWriter>(
    handle: &OutboxHandle,
    writer: &W,
    retry: RetryPolicy,
    lane: Lane,
) {
    let mut changes = handle.reachability.subscribe();
    loop {
        let next = handle.lock().begin(lane);
        let Some((id, action)) = next else {
            handle.wake(lane).notified().await;
            continue;
        };
        // Only a return from now on abandons this write, not one seen before it began.
        changes.borrow_and_update();
        let (outcome, abandoned) = tokio::select! {
            // An answer that came first is taken, never sent again.
            biased;
            outcome = writer.execute(&action) => (outcome, false),
            () = tokio::time::sleep(ATTEMPT_TIMEOUT) => (
                Outcome::Unreachable(format!("no answer within {ATTEMPT_TIMEOUT:?}")),
                false,
            ),
            // Whatever answered (the probe, the watch, the other lane) did so on a
            // connection of its own; this write may sit on one the outage left dead.
            () = answered_again(&mut changes) => (
                Outcome::Unreachable(
                    "abandoned: the API server answers again and this write had no answer"
                        .to_string(),
                ),
                true,
            ),
        };
        let kind = action.kind();
        let (attempts, pending, journal) = {
            let mut outbox = handle.lock();
            let attempts = outbox.finish(id, outcome.clone());
            (attempts, outbox.len(), handle.journal_update(&outbox))
        };
        // A file replaced on /run: tens of microseconds, not worth a blocking thread.
        handle.write_journal(journal);
        handle.publish_pending(pending);
        handle.progress.notify_waiters();
        // A refusal or a conflict is an answer too; an abandoned write tells nothing.
        if !abandoned {
            handle
                .reachability
                .saw(!matches!(outcome, Outcome::Unreachable(_)));
        }
        match outcome {
            Outcome::Done => {
                tracing::debug!(action = kind, "API write done");
                handle.count(kind, "done");
            }
            Outcome::Rejected(reason) => {
                tracing::error!(action = kind, target = %action.target(), %reason, write = %action.describe(), "API server refused a write; dropping it");
                handle.count(kind, "rejected");
            }
            Outcome::Retry(reason) | Outcome::Unreachable(reason) => {
                if attempts == 1 || abandoned {
                    tracing::warn!(action = kind, target = %action.target(), lane = lane.as_str(), %reason, pending, "API write failed; queued for retry");
                }
                handle.count(kind, "retried");
                if abandoned {
                    continue;
                }
                let (hurrying, hurry) = &*handle.hurry;
                let woken = hurry.notified();
                tokio::pin!(woken);
                woken.as_mut().enable();
                let wait = if hurrying.load(Ordering::SeqCst) {
                    retry.base
                } else {
                    crate::backoff::doubling(retry.base, attempts, retry.max)
                };
                changes.borrow_and_update();
                // The server back after an outage: what waited out the outage goes now.
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = woken => {}
                    () = answered_again(&mut changes) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::outbox::tests::{condition, delete, event};
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Records what it was asked to write; events fail while `events_fail` is set.
    #[derive(Clone, Default)]
    struct Scripted {
        sent: Arc<Mutex<Vec<&'static str>>>,
        events_fail: Arc<AtomicBool>,
        /// Every write finds no API server.
        unreachable: Arc<AtomicBool>,
        /// How many of the next writes get no answer at all, ever.
        silent: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl ActionWriter for Scripted {
        fn execute(&self, action: &ApiAction) -> impl Future<Output = Outcome> + Send {
            self.sent.lock().unwrap().push(action.kind());
            let silent = self
                .silent
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                    left.checked_sub(1)
                })
                .is_ok();
            let outcome = if self.unreachable.load(Ordering::SeqCst) {
                Outcome::Unreachable("connection refused".to_string())
            } else if action.kind() == "event" && self.events_fail.load(Ordering::SeqCst) {
                Outcome::Retry("500 injected".to_string())
            } else {
                Outcome::Done
            };
            async move {
                if silent {
                    std::future::pending::<()>().await;
                }
                outcome
            }
        }
    }

    /// The senders of `handle`'s lanes, writing through `writer` with the default backoff.
    fn sending(handle: &OutboxHandle, writer: &Scripted) -> tokio::task::JoinHandle<()> {
        tokio::spawn(run_outbox(
            handle.clone(),
            writer.clone(),
            RetryPolicy::default(),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn writes_tell_whether_the_api_server_answers() {
        let handle = OutboxHandle::new(10);
        let writer = Scripted::default();
        let mut reachable = handle.reachability.subscribe();
        let sender = sending(&handle, &writer);
        // A server that answers with errors is still reached.
        writer.events_fail.store(true, Ordering::SeqCst);
        handle.push(evicted_event());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(handle.reachability.is_reachable(), "a 500 is an answer");
        writer.unreachable.store(true, Ordering::SeqCst);
        reachable.changed().await.expect("a change");
        assert!(!*reachable.borrow_and_update(), "no answer: unreachable");
        writer.unreachable.store(false, Ordering::SeqCst);
        writer.events_fail.store(false, Ordering::SeqCst);
        reachable.changed().await.expect("a change");
        assert!(*reachable.borrow(), "answered again");
        sender.abort();
    }

    fn evicted_event() -> ApiAction {
        event("web.1", 1)
    }

    /// What the journal file holds: each write's kind, in order; empty when there is no
    /// file.
    fn journaled(path: &std::path::Path) -> Vec<String> {
        let Ok(text) = std::fs::read_to_string(path) else {
            return Vec::new();
        };
        let file: serde_json::Value = serde_json::from_str(&text).unwrap();
        file["writes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|write| write["kind"].as_str().unwrap().to_string())
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_journal_follows_what_is_owed_about_pods_and_events() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api-writes.json");
        let handle = OutboxHandle::new(10);
        handle.set_journal(Journal::new(&path, Some("boot".to_string())));
        let writer = Scripted::default();
        writer.unreachable.store(true, Ordering::SeqCst);
        let sender = sending(&handle, &writer);
        // Kept as soon as queued, before anything is sent; node conditions are not kept.
        for action in eviction() {
            handle.push(action);
        }
        handle.push(ApiAction::SetNodeConditions(Vec::new()));
        assert_eq!(
            journaled(&path),
            ["podCondition", "podDelete", "event"],
            "the pod lane in order, then the events"
        );
        // The server answers again: once everything is sent, nothing is owed.
        writer.unreachable.store(false, Ordering::SeqCst);
        assert!(handle.flush(Instant::now() + Duration::from_secs(5)).await);
        assert!(!path.exists(), "{:?}", journaled(&path));
        sender.abort();
        // A dry run queues nothing, so it keeps nothing either.
        let dry = OutboxHandle::new(10);
        dry.set_journal(Journal::new(&path, None));
        dry.set_dry_run(true);
        for action in eviction() {
            dry.push(action);
        }
        assert!(!path.exists());
    }

    /// What an eviction queues: the Evicted event, the DisruptionTarget condition, the
    /// delete.
    fn eviction() -> [ApiAction; 3] {
        [evicted_event(), condition("u1"), delete("u1", 1)]
    }

    #[tokio::test(start_paused = true)]
    async fn the_pod_lane_is_sent_while_an_event_keeps_failing_and_flush_is_bounded() {
        let handle = OutboxHandle::new(10);
        let writer = Scripted::default();
        writer.events_fail.store(true, Ordering::SeqCst);
        let sender = sending(&handle, &writer);
        for action in eviction() {
            handle.push(action);
        }
        let started = Instant::now();
        assert!(
            !handle.flush(started + Duration::from_secs(3)).await,
            "the event is still failing"
        );
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(3),
            "flush waits until its deadline, no longer"
        );
        assert_eq!(handle.pending(), vec![evicted_event()]);
        let sent = writer.sent.lock().unwrap().clone();
        let pod_writes: Vec<_> = sent.iter().filter(|kind| **kind != "event").collect();
        assert_eq!(pod_writes, vec![&"pod_condition", &"pod_delete"]);
        assert!(
            sent.iter().filter(|kind| **kind == "event").count() > 1,
            "the event was retried: {sent:?}"
        );

        writer.events_fail.store(false, Ordering::SeqCst);
        assert!(handle.flush(Instant::now() + Duration::from_secs(60)).await);
        assert!(handle.is_empty());
        sender.abort();
    }

    /// A sender whose backoff may grow to a minute, with one Evicted event that fails
    /// until `events_fail` is cleared.
    fn an_event_failing_with_a_minute_ceiling()
    -> (OutboxHandle, Scripted, tokio::task::JoinHandle<()>) {
        let handle = OutboxHandle::new(10);
        let writer = Scripted::default();
        writer.events_fail.store(true, Ordering::SeqCst);
        let retry = RetryPolicy {
            base: Duration::from_millis(200),
            max: Duration::from_secs(60),
        };
        let sender = tokio::spawn(run_outbox(handle.clone(), writer.clone(), retry));
        handle.push(evicted_event());
        (handle, writer, sender)
    }

    #[tokio::test(start_paused = true)]
    async fn a_flush_cuts_a_long_backoff_short() {
        let (handle, writer, sender) = an_event_failing_with_a_minute_ceiling();
        // Eight failures: the sender now waits 25.6 s before its ninth try.
        let attempts = || {
            let sent = writer.sent.lock().unwrap();
            sent.iter().filter(|kind| **kind == "event").count()
        };
        while attempts() < 8 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The API server recovers as the agent stops.
        writer.events_fail.store(false, Ordering::SeqCst);
        let started = Instant::now();
        assert!(handle.flush(started + Duration::from_secs(5)).await);
        assert!(
            started.elapsed() < Duration::from_millis(10),
            "retried at once, not after the backoff: {:?}",
            started.elapsed()
        );
        assert_eq!(attempts(), 9);
        sender.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn while_flushing_a_failing_write_is_retried_every_base_interval() {
        let (handle, writer, sender) = an_event_failing_with_a_minute_ceiling();
        assert!(!handle.flush(Instant::now() + Duration::from_secs(2)).await);
        let tries = writer.sent.lock().unwrap().len();
        // One at once, then one every 200 ms: no hot loop, no doubling.
        assert!((9..=12).contains(&tries), "{tries} tries in 2 s");
        // Once the flush is over, the backoff doubles again: far fewer tries in 20 s.
        tokio::time::sleep(Duration::from_secs(20)).await;
        let later = writer.sent.lock().unwrap().len() - tries;
        assert!(later <= 3, "{later} tries in the 20 s after the flush");
        sender.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn flush_returns_at_once_when_empty_and_at_the_deadline_without_a_sender() {
        let handle = OutboxHandle::new(10);
        let started = Instant::now();
        assert!(handle.flush(started + Duration::from_secs(5)).await);
        assert_eq!(started.elapsed(), Duration::ZERO);
        handle.push(evicted_event());
        assert!(!handle.flush(started + Duration::from_secs(5)).await);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert_eq!(handle.pending().len(), 1, "flush sends nothing itself");
    }

    /// How many writes `writer` was asked for.
    fn tries(writer: &Scripted) -> usize {
        writer.sent.lock().unwrap().len()
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_never_gets_an_answer_is_sent_again_after_the_attempt_timeout() {
        let handle = OutboxHandle::new(10);
        let writer = Scripted::default();
        writer.silent.store(1, Ordering::SeqCst);
        let sender = sending(&handle, &writer);
        handle.push(delete("u1", 1));
        tokio::time::sleep(ATTEMPT_TIMEOUT - Duration::from_millis(1)).await;
        assert_eq!(tries(&writer), 1, "still waiting for the first answer");
        assert!(handle.reachability.is_reachable());
        // No answer in time: the server counts as unreachable, and the write goes again
        // after the first backoff.
        let mut changes = handle.reachability.subscribe();
        tokio::time::timeout(Duration::from_millis(2), changes.changed())
            .await
            .expect("no answer in time is a change to unreachable")
            .unwrap();
        assert!(!*changes.borrow_and_update());
        assert!(handle.flush(Instant::now() + Duration::from_secs(1)).await);
        assert_eq!(tries(&writer), 2);
        assert!(
            handle.reachability.is_reachable(),
            "the second try was answered"
        );
        sender.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_left_without_an_answer_by_an_outage_goes_again_once_the_server_answers() {
        let handle = OutboxHandle::new(10);
        let writer = Scripted::default();
        writer.silent.store(1, Ordering::SeqCst);
        let sender = sending(&handle, &writer);
        handle.push(delete("u1", 1));
        tokio::time::sleep(Duration::from_secs(3)).await;
        // The probe finds the server gone: the write waits on, no answer being no proof.
        handle.reachability.saw(false);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(tries(&writer), 1);
        // Back: the write's connection may be one the outage left dead. It goes again at
        // once, 25 s before its own timeout.
        handle.reachability.saw(true);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(tries(&writer), 2, "sent again at once");
        assert!(handle.is_empty());
        assert!(
            handle.reachability.is_reachable(),
            "the abandoned write does not make the server look unreachable"
        );
        // A return seen before a write began does not cut that write short.
        writer.silent.store(1, Ordering::SeqCst);
        handle.reachability.saw(false);
        handle.reachability.saw(true);
        handle.push(delete("u2", 1));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(tries(&writer), 3, "still waiting for its answer");
        sender.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_waiting_out_its_backoff_goes_once_the_server_answers_again() {
        let handle = OutboxHandle::new(10);
        let writer = Scripted::default();
        writer.unreachable.store(true, Ordering::SeqCst);
        let retry = RetryPolicy {
            base: Duration::from_millis(200),
            max: Duration::from_secs(60),
        };
        let sender = tokio::spawn(run_outbox(handle.clone(), writer.clone(), retry));
        handle.push(delete("u1", 1));
        // An outage of ten minutes: the backoff has reached its ceiling of a minute.
        tokio::time::sleep(Duration::from_secs(600)).await;
        let during = tries(&writer);
        assert!(!handle.reachability.is_reachable());
        writer.unreachable.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(tries(&writer), during, "still waiting out the backoff");
        // The probe hears the server: the write goes at once, not up to a minute later.
        handle.reachability.saw(true);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(tries(&writer), during + 1, "sent at once");
        assert!(handle.is_empty());
        sender.abort();
    }

    #[tokio::test]
    async fn dry_run_sends_nothing() {
        let handle = OutboxHandle::new(10);
        handle.set_dry_run(true);
        let writer = Scripted::default();
        let sender = sending(&handle, &writer);
        for action in eviction() {
            assert_eq!(handle.push(action), Pushed::DryRun);
        }
        assert!(handle.flush(Instant::now()).await);
        tokio::task::yield_now().await;
        assert!(writer.sent.lock().unwrap().is_empty());
        sender.abort();
    }
}
