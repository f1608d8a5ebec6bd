//! Waking the decision cycle ahead of its timer, and saying why.
//!
//! The notifiers wake the cycle through the storm limiter. Each wake-up carries its
//! reason and when it was first asked for, so a cycle can report what started it: an
//! operator sees how many cycles the kernel's notifications drive, and a slow decision
//! can be taken apart (a notification that came late, one the storm limiter held back,
//! or none at all). A look again after an eviction starts the next cycle from the cycle
//! loop itself, not through here: a notification pending then must not take its place.

use std::sync::Mutex;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Why a cycle was woken ahead of its timer. The order of declaration is the order of
/// precedence when wake-ups are merged (the first says most about the cycle).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WakeReason {
    /// A kernel notification after a quiet spell (or a memcg trigger found already
    /// reached as it was registered), evaluated at once.
    Notification,
    /// Notifications that came within the storm limiter's spacing of the last
    /// evaluation, held back and evaluated together at the end of the spacing.
    TrailingNotification,
    /// The cycle evicted and looks again at once, as the kubelet does after its cleanup
    /// wait.
    AfterEviction,
}

impl WakeReason {
    pub const ALL: [WakeReason; 3] = [
        WakeReason::Notification,
        WakeReason::TrailingNotification,
        WakeReason::AfterEviction,
    ];

    /// The name in the `nodekeeper_cycles_total` metric's `started_by` label.
    pub fn as_str(self) -> &'static str {
        match self {
            WakeReason::Notification => "notification",
            WakeReason::TrailingNotification => "notification_trailing",
            WakeReason::AfterEviction => "after_eviction",
        }
    }
}

/// One wake-up of the cycle: why, and since when it was wanted (for a held-back
/// notification, when the first of those held back arrived).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wakeup {
    pub reason: WakeReason,
    /// On tokio's clock (paused in tests); `into_std` compares it with the cycle
    /// report's other instants.
    pub since: Instant,
}

impl Wakeup {
    /// Merge two wake-ups the cycle takes as one: the one whose reason says most (a
    /// notification over a held-back one over a look after an eviction), with its own
    /// moment; of two with the same reason, the earlier moment.
    fn merge(self, other: Wakeup) -> Wakeup {
        match self.reason.cmp(&other.reason) {
            std::cmp::Ordering::Less => self,
            std::cmp::Ordering::Greater => other,
            std::cmp::Ordering::Equal => Wakeup {
                reason: self.reason,
                since: self.since.min(other.since),
            },
        }
    }
}

/// The decision cycle's wake-up: a [`Notify`] (at most one pending permit, so a burst is
/// one wake-up) with the reasons of what it merged.
#[derive(Debug, Default)]
pub struct CycleWake {
    notify: Notify,
    pending: Mutex<Option<Wakeup>>,
}

impl CycleWake {
    pub fn new() -> CycleWake {
        CycleWake::default()
    }

    /// Wake the cycle (or the next one to wait) for `wakeup`.
    pub fn wake(&self, wakeup: Wakeup) {
        {
            let mut pending = self.pending();
            *pending = Some(match *pending {
                Some(earlier) => earlier.merge(wakeup),
                None => wakeup,
            });
        }
        self.notify.notify_one();
    }

    /// Wait for a wake-up; what arrived since the last one, merged. Cancel-safe: a
    /// wake-up not taken stays pending for the next call.
    pub async fn woken(&self) -> Wakeup {
        loop {
            self.notify.notified().await;
            // Nothing pending: taken by `take_pending` since its permit was given.
            if let Some(wakeup) = self.take_pending() {
                return wakeup;
            }
        }
    }

    /// The wake-up pending now, if any, taken without waiting: a cycle the timer starts
    /// answers it too. (Its permit stays behind; the next [`woken`](Self::woken) finds
    /// nothing pending and waits on.)
    pub fn take_pending(&self) -> Option<Wakeup> {
        self.pending().take()
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Option<Wakeup>> {
        // A poisoned lock only means a panic elsewhere while holding it; the data is a
        // plain value, still whole.
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::time::Duration;

    impl CycleWake {
        /// Wake the cycle for `reason`, as of now.
        fn wake_now(&self, reason: WakeReason) {
            self.wake(Wakeup {
                reason,
                since: Instant::now(),
            });
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_wakeup_carries_its_reason_and_moment() {
        let wake = CycleWake::new();
        let at = Instant::now();
        wake.wake_now(WakeReason::AfterEviction);
        assert_eq!(
            wake.woken().await,
            Wakeup {
                reason: WakeReason::AfterEviction,
                since: at
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn wakeups_before_the_cycle_waits_are_one_with_the_strongest_reason_and_its_moment() {
        let wake = CycleWake::new();
        let first = Instant::now();
        wake.wake_now(WakeReason::AfterEviction);
        tokio::time::advance(Duration::from_millis(5)).await;
        wake.wake_now(WakeReason::TrailingNotification);
        tokio::time::advance(Duration::from_millis(5)).await;
        wake.wake_now(WakeReason::Notification);
        tokio::time::advance(Duration::from_millis(5)).await;
        wake.wake_now(WakeReason::Notification);
        // The notification's own moment (the first of the two), not the look after an
        // eviction's, which came earlier.
        assert_eq!(
            wake.woken().await,
            Wakeup {
                reason: WakeReason::Notification,
                since: first + Duration::from_millis(10)
            }
        );
        // All four were one wake-up: nothing is left pending.
        assert!(
            tokio::time::timeout(Duration::from_secs(1), wake.woken())
                .await
                .is_err()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_given_up_after_its_wakeup_came_loses_nothing() {
        let wake = CycleWake::new();
        // The cycle loop waits on its timer and the wake-up together: the wake-up comes
        // while it waits, and the timer's branch is taken all the same.
        let mut waiting = Box::pin(wake.woken());
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(waiting.as_mut().poll(&mut context).is_pending());
        wake.wake_now(WakeReason::Notification);
        drop(waiting);
        let woken = tokio::time::timeout(Duration::from_secs(1), wake.woken()).await;
        assert_eq!(
            woken.map(|wakeup| wakeup.reason),
            Ok(WakeReason::Notification)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_wakeup_taken_without_waiting_is_not_answered_again() {
        let wake = CycleWake::new();
        wake.wake_now(WakeReason::TrailingNotification);
        assert_eq!(
            wake.take_pending().map(|wakeup| wakeup.reason),
            Some(WakeReason::TrailingNotification)
        );
        // Its permit is left, but no wake-up: the next wait goes on waiting.
        assert!(
            tokio::time::timeout(Duration::from_secs(1), wake.woken())
                .await
                .is_err()
        );
    }

    #[test]
    fn every_reason_is_listed_once_in_order_of_precedence() {
        // A reason added to the enum must be added here (the match is exhaustive) and
        // to `ALL`.
        let position = |reason: WakeReason| match reason {
            WakeReason::Notification => 0,
            WakeReason::TrailingNotification => 1,
            WakeReason::AfterEviction => 2,
        };
        const REASONS: usize = 3;
        assert_eq!(WakeReason::ALL.len(), REASONS);
        for (index, reason) in WakeReason::ALL.into_iter().enumerate() {
            assert_eq!(position(reason), index, "{reason:?}");
        }
        assert!(WakeReason::ALL.is_sorted());
    }
}
