//! Bounding how often kernel notifications may wake an evaluation.
//!
//! A memory cgroup hovering around its threshold, or a PSI trigger in a thrashing cgroup,
//! can notify hundreds of times a second. Each notification should cause an evaluation
//! promptly, but evaluations must stay at least `min_spacing` apart so a storm cannot burn
//! the CPU. The rule: a wakeup after a quiet spell evaluates at once; wakeups that arrive
//! too soon collapse into one trailing evaluation at the earliest allowed moment, so the
//! last wakeup of a burst is always followed by an evaluation that sees its effects.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::wake::{CycleWake, WakeReason, Wakeup};

/// What the caller does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Evaluate now; the limiter has recorded this moment as the latest evaluation.
    EvaluateNow,
    /// A trailing evaluation is due at this moment; call [`StormLimiter::deadline`] then.
    WaitUntil(Duration),
    /// Nothing is pending.
    Idle,
}

/// The pure state machine. Times are offsets on any monotonic clock the caller chooses,
/// so tests drive it with plain numbers.
#[derive(Debug, Clone)]
pub struct StormLimiter {
    min_spacing: Duration,
    last_evaluation: Option<Duration>,
    trailing_at: Option<Duration>,
}

impl StormLimiter {
    pub fn new(min_spacing: Duration) -> Self {
        StormLimiter {
            min_spacing,
            last_evaluation: None,
            trailing_at: None,
        }
    }

    /// A notification arrived at `now`.
    pub fn wakeup(&mut self, now: Duration) -> Next {
        if let Some(at) = self.trailing_at {
            return Next::WaitUntil(at);
        }
        match self.last_evaluation {
            Some(last) if now < last + self.min_spacing => {
                let at = last + self.min_spacing;
                self.trailing_at = Some(at);
                Next::WaitUntil(at)
            }
            _ => {
                self.last_evaluation = Some(now);
                Next::EvaluateNow
            }
        }
    }

    /// The timer set for a [`Next::WaitUntil`] fired at `now`.
    pub fn deadline(&mut self, now: Duration) -> Next {
        match self.trailing_at {
            None => Next::Idle,
            Some(at) if now < at => Next::WaitUntil(at),
            Some(_) => {
                self.trailing_at = None;
                self.last_evaluation = Some(now);
                Next::EvaluateNow
            }
        }
    }
}

/// Counts of what the forwarder saw and did, for metrics and tests.
#[derive(Debug, Default)]
pub struct ForwardCounts {
    pub wakeups: AtomicU64,
    pub evaluations: AtomicU64,
}

impl ForwardCounts {
    pub fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    pub fn evaluations(&self) -> u64 {
        self.evaluations.load(Ordering::Relaxed)
    }
}

/// Forward wakeups from `source` to `target` through a [`StormLimiter`], forever, each
/// with its reason: a notification evaluated at once, or ones held back for a trailing
/// evaluation (since the first of them arrived).
/// `Notify` keeps at most one pending permit, so a burst that arrives while this task
/// is busy is already one wakeup when it gets here.
pub async fn forward_limited(
    source: Arc<Notify>,
    target: Arc<CycleWake>,
    min_spacing: Duration,
    counts: Arc<ForwardCounts>,
) {
    let epoch = Instant::now();
    let mut limiter = StormLimiter::new(min_spacing);
    let mut trailing: Option<Duration> = None;
    // When the first wakeup held back for the trailing evaluation arrived.
    let mut held_since: Option<Instant> = None;
    loop {
        let woken_at;
        let next = match trailing {
            None => {
                source.notified().await;
                counts.wakeups.fetch_add(1, Ordering::Relaxed);
                woken_at = Some(Instant::now());
                limiter.wakeup(epoch.elapsed())
            }
            Some(at) => {
                tokio::select! {
                    () = source.notified() => {
                        counts.wakeups.fetch_add(1, Ordering::Relaxed);
                        woken_at = Some(Instant::now());
                        limiter.wakeup(epoch.elapsed())
                    }
                    () = tokio::time::sleep_until(epoch + at) => {
                        woken_at = None;
                        limiter.deadline(epoch.elapsed())
                    }
                }
            }
        };
        trailing = match next {
            Next::EvaluateNow => {
                counts.evaluations.fetch_add(1, Ordering::Relaxed);
                // The limiter evaluates a wakeup at once only when nothing is held back;
                // an evaluation at a deadline is the trailing one.
                let wakeup = match (woken_at, held_since.take()) {
                    (Some(at), _) => Wakeup {
                        reason: WakeReason::Notification,
                        since: at,
                    },
                    (None, since) => Wakeup {
                        reason: WakeReason::TrailingNotification,
                        since: since.unwrap_or_else(Instant::now),
                    },
                };
                target.wake(wakeup);
                None
            }
            Next::WaitUntil(at) => {
                held_since = held_since.or(woken_at);
                Some(at)
            }
            Next::Idle => {
                held_since = None;
                None
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(value: u64) -> Duration {
        Duration::from_millis(value)
    }

    /// Drive the limiter the way `forward_limited` does: wakeups in time order, with the
    /// trailing timer firing exactly on time. Returns the evaluation times.
    fn simulate(spacing: Duration, wakeups: &[Duration]) -> Vec<Duration> {
        let mut limiter = StormLimiter::new(spacing);
        let mut evaluations = Vec::new();
        let mut timer: Option<Duration> = None;
        let mut handle = |next: Next, now: Duration, timer: &mut Option<Duration>| match next {
            Next::EvaluateNow => {
                evaluations.push(now);
                *timer = None;
            }
            Next::WaitUntil(at) => *timer = Some(at),
            Next::Idle => *timer = None,
        };
        for &now in wakeups {
            while let Some(at) = timer.filter(|at| *at <= now) {
                let next = limiter.deadline(at);
                handle(next, at, &mut timer);
            }
            let next = limiter.wakeup(now);
            handle(next, now, &mut timer);
        }
        while let Some(at) = timer {
            let next = limiter.deadline(at);
            handle(next, at, &mut timer);
        }
        evaluations
    }

    #[test]
    fn a_wakeup_after_quiet_evaluates_at_once() {
        let mut limiter = StormLimiter::new(ms(100));
        assert_eq!(limiter.wakeup(ms(5)), Next::EvaluateNow);
        assert_eq!(limiter.wakeup(ms(500)), Next::EvaluateNow);
    }

    #[test]
    fn wakeups_inside_the_spacing_share_one_trailing_evaluation() {
        let mut limiter = StormLimiter::new(ms(100));
        assert_eq!(limiter.wakeup(ms(0)), Next::EvaluateNow);
        assert_eq!(limiter.wakeup(ms(10)), Next::WaitUntil(ms(100)));
        assert_eq!(limiter.wakeup(ms(60)), Next::WaitUntil(ms(100)));
        assert_eq!(limiter.deadline(ms(99)), Next::WaitUntil(ms(100)));
        assert_eq!(limiter.deadline(ms(100)), Next::EvaluateNow);
        assert_eq!(limiter.deadline(ms(101)), Next::Idle);
        // The trailing evaluation counts as the latest one.
        assert_eq!(limiter.wakeup(ms(150)), Next::WaitUntil(ms(200)));
    }

    #[test]
    fn a_burst_of_a_thousand_wakeups_gives_two_evaluations() {
        let burst: Vec<Duration> = (0..1000).map(Duration::from_micros).collect();
        let evaluations = simulate(ms(100), &burst);
        assert_eq!(evaluations, vec![ms(0), ms(100)]);
    }

    #[test]
    fn a_steady_storm_evaluates_once_per_spacing() {
        // One wakeup per millisecond for a second.
        let storm: Vec<Duration> = (0..1000).map(ms).collect();
        let evaluations = simulate(ms(100), &storm);
        assert_eq!(evaluations.len(), 11);
        assert_eq!(evaluations.first(), Some(&ms(0)));
        assert_eq!(evaluations.last(), Some(&ms(1000)));
    }

    #[tokio::test(start_paused = true)]
    async fn each_forwarded_wakeup_says_whether_it_was_held_back_and_since_when() {
        let source = Arc::new(Notify::new());
        let target = Arc::new(CycleWake::new());
        let counts = Arc::new(ForwardCounts::default());
        let forwarder = tokio::spawn(forward_limited(
            source.clone(),
            target.clone(),
            ms(100),
            counts.clone(),
        ));
        let start = Instant::now();
        // Let the forwarder wait on its source before the first notification.
        tokio::task::yield_now().await;
        source.notify_one();
        let first = target.woken().await;
        assert_eq!(
            first,
            Wakeup {
                reason: WakeReason::Notification,
                since: start
            }
        );
        // Two more inside the spacing: held back, evaluated once at its end, as of the
        // first of them.
        tokio::time::advance(ms(10)).await;
        source.notify_one();
        tokio::task::yield_now().await;
        tokio::time::advance(ms(40)).await;
        source.notify_one();
        let trailing = target.woken().await;
        assert_eq!(
            trailing,
            Wakeup {
                reason: WakeReason::TrailingNotification,
                since: start + ms(10)
            }
        );
        assert_eq!(Instant::now(), start + ms(100));
        // After a quiet spell, at once again.
        tokio::time::advance(ms(300)).await;
        source.notify_one();
        assert_eq!(
            target.woken().await,
            Wakeup {
                reason: WakeReason::Notification,
                since: start + ms(400)
            }
        );
        assert_eq!((counts.wakeups(), counts.evaluations()), (4, 3));
        forwarder.abort();
    }

    proptest! {
        #[test]
        fn evaluations_are_spaced_and_no_wakeup_is_lost(
            spacing_ms in 1u64..200,
            mut offsets in proptest::collection::vec(0u64..5_000_000, 1..300),
        ) {
            offsets.sort_unstable();
            let spacing = ms(spacing_ms);
            let wakeups: Vec<Duration> = offsets.iter().map(|&us| Duration::from_micros(us)).collect();
            let evaluations = simulate(spacing, &wakeups);

            for pair in evaluations.windows(2) {
                prop_assert!(pair[1] - pair[0] >= spacing, "evaluations {:?} too close", pair);
            }
            // The last wakeup is followed by an evaluation no later than one spacing after it.
            let last_wakeup = *wakeups.last().unwrap();
            let last_evaluation = *evaluations.last().unwrap();
            prop_assert!(last_evaluation >= last_wakeup);
            prop_assert!(last_evaluation <= last_wakeup + spacing);
            // Every wakeup is followed by an evaluation within one spacing.
            for wakeup in &wakeups {
                prop_assert!(evaluations.iter().any(|e| e >= wakeup && *e <= *wakeup + spacing));
            }
            let span = last_evaluation - evaluations[0];
            let bound = span.as_micros() / spacing.as_micros() + 1;
            prop_assert!(evaluations.len() as u128 <= bound);
        }

        #[test]
        fn a_wakeup_a_full_spacing_after_the_last_evaluation_is_not_delayed(
            spacing_ms in 1u64..200,
            gap_ms in 0u64..400,
        ) {
            let spacing = ms(spacing_ms);
            let evaluations = simulate(spacing, &[ms(0), ms(spacing_ms + gap_ms)]);
            prop_assert_eq!(evaluations, vec![ms(0), ms(spacing_ms + gap_ms)]);
        }
    }
}
