//! Self-isolation, the pure part: when an agent that can no longer show the fence
//! controller its node is alive isolates the node by itself, and when it resets it
//! instead. For nodes with no fence device (the case Self Node Remediation exists for),
//! off unless `report.isolation.isolateAfter` is set; docs/fencing.md gives the reasoning
//! and the risks.
//!
//! The controller hears a node through its agent's reports and its kubelet's Lease. An
//! agent that has had neither for `isolateAfter` (see [`crate::report::contact`] for
//! how a contact is counted, never later than the controller's own hearing) must assume
//! the controller takes the node for dead and will release its pods. So it isolates the
//! node as on the controller's instruction; if that fails, or is not done within the
//! isolation's budget, it resets the node. The watchdog it holds covers the agent
//! itself: a hung agent stops petting it and the node is reset one watchdog timeout
//! later. Together that is the promise an armed agent reports: no pod process runs
//! later than [`SelfIsolationPlan::within`] after its last contact.
//!
//! Every time here is on the boot clock (`CLOCK_BOOTTIME`).

use std::time::Duration;

/// Added to twice the kubelet's stop timeout for the isolation's budget: the isolator's
/// worst case besides those two waits (six systemd calls of at most 10 s each, 5 s after
/// SIGKILL) and a little more.
pub const ISOLATION_SLACK: Duration = Duration::from_secs(70);

/// The agent's self-isolation settings, in the terms of its promise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelfIsolationPlan {
    /// No contact this long: isolate.
    pub isolate_after: Duration,
    /// Then at most this long to be isolated, else reset.
    pub budget: Duration,
    /// A hung agent's node is reset this long after the last pet.
    pub watchdog_timeout: Duration,
}

impl SelfIsolationPlan {
    pub fn new(
        isolate_after: Duration,
        stop_timeout: Duration,
        watchdog_timeout: Duration,
    ) -> SelfIsolationPlan {
        SelfIsolationPlan {
            isolate_after,
            budget: 2 * stop_timeout + ISOLATION_SLACK,
            watchdog_timeout,
        }
    }

    /// The promise: no pod process runs later than this after the last contact. The
    /// isolation's deadline, its budget, then the watchdog's timeout for an agent that
    /// hung at the last moment (or whose reset call failed: it stops petting first).
    pub fn within(&self) -> Duration {
        self.isolate_after + self.budget + self.watchdog_timeout
    }

    /// This plan, kept within a promise the controller may still hold from an earlier
    /// agent of the boot (`held`): until the controller has heard this plan's promise,
    /// it isolates early enough for the older one too.
    pub fn within_held(&self, held: Option<Duration>) -> SelfIsolationPlan {
        let Some(held) = held else { return *self };
        let room = held.saturating_sub(self.budget + self.watchdog_timeout);
        SelfIsolationPlan {
            isolate_after: self.isolate_after.min(room),
            ..*self
        }
    }
}

/// How the agent's own attempt at isolating the node went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Not asked for (or under way).
    Pending,
    /// It ended without the node isolated.
    Failed,
}

/// What the guardian does now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The controller hears the node; pet the watchdog. Isolate at `isolate_at` unless
    /// heard again.
    InContact { isolate_at: Duration },
    /// Isolated (by the agent, or on the controller's instruction); pet the watchdog.
    Isolated,
    /// Cut off: isolate the node now (once), keep petting; reset at `reset_at` unless
    /// isolated by then.
    Isolate { reset_at: Duration },
    /// Reset the node: stop petting the watchdog, then reboot. `why` is logged.
    Reset { why: String },
}

/// The verdict at `now`, the silence counted from `counted_from` (the last contact; see
/// `ContactClock::count_from` for a boot without one).
pub fn verdict(
    plan: &SelfIsolationPlan,
    counted_from: Duration,
    isolated: bool,
    attempt: Attempt,
    now: Duration,
) -> Verdict {
    let isolate_at = counted_from + plan.isolate_after;
    if now < isolate_at {
        return Verdict::InContact { isolate_at };
    }
    if isolated {
        return Verdict::Isolated;
    }
    let reset_at = isolate_at + plan.budget;
    if attempt == Attempt::Failed {
        return Verdict::Reset {
            why: "the node could not be isolated after the agent lost contact with the controller"
                .to_string(),
        };
    }
    if now >= reset_at {
        return Verdict::Reset {
            why: format!(
                "the node was not isolated within {}s of losing contact with the controller for {}s",
                plan.budget.as_secs(),
                plan.isolate_after.as_secs()
            ),
        };
    }
    Verdict::Isolate { reset_at }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn s(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    /// isolateAfter 60 s, stop timeout 20 s (budget 110 s), watchdog 30 s.
    fn plan() -> SelfIsolationPlan {
        SelfIsolationPlan::new(s(60), s(20), s(30))
    }

    #[test]
    fn the_promise_adds_the_isolation_budget_and_the_watchdog_timeout() {
        assert_eq!(plan().budget, s(110));
        assert_eq!(plan().within(), s(200));
    }

    #[test]
    fn cut_off_for_isolate_after_the_node_is_isolated_then_reset_if_that_does_not_hold() {
        let plan = plan();
        let contact = s(100);
        assert_eq!(
            verdict(&plan, contact, false, Attempt::Pending, s(159)),
            Verdict::InContact { isolate_at: s(160) }
        );
        assert_eq!(
            verdict(&plan, contact, false, Attempt::Pending, s(160)),
            Verdict::Isolate { reset_at: s(270) }
        );
        assert_eq!(
            verdict(&plan, contact, true, Attempt::Pending, s(200)),
            Verdict::Isolated
        );
        assert!(matches!(
            verdict(&plan, contact, false, Attempt::Failed, s(170)),
            Verdict::Reset { .. }
        ));
        let late = verdict(&plan, contact, false, Attempt::Pending, s(270));
        assert!(
            matches!(&late, Verdict::Reset { why } if why.contains("within 110s")),
            "{late:?}"
        );
    }

    #[test]
    fn contact_again_before_the_deadline_puts_it_off_and_an_isolation_stays_without_a_reset() {
        let plan = plan();
        assert_eq!(
            verdict(&plan, s(150), false, Attempt::Pending, s(170)),
            Verdict::InContact { isolate_at: s(210) }
        );
        assert_eq!(
            verdict(&plan, s(300), true, Attempt::Pending, s(301)),
            Verdict::InContact { isolate_at: s(360) }
        );
    }

    #[test]
    fn an_older_promise_the_controller_may_hold_brings_the_isolation_forward() {
        let plan = plan();
        assert_eq!(plan.within_held(None), plan);
        assert_eq!(
            plan.within_held(Some(s(500))),
            plan,
            "a longer one: no change"
        );
        let held = plan.within_held(Some(s(170)));
        assert_eq!(held.isolate_after, s(30));
        assert_eq!(held.within(), s(170));
        assert_eq!(plan.within_held(Some(s(100))).isolate_after, Duration::ZERO);
    }

    proptest! {
        /// Whatever happens, an agent that is not isolated by `contact + isolateAfter +
        /// budget` resets the node: together with the watchdog, no pod process runs
        /// past the promise.
        #[test]
        fn nothing_runs_past_the_promise(
            contact in 0u64..10_000,
            late in 0u64..10_000,
            isolated in any::<bool>(),
            failed in any::<bool>(),
            held in proptest::option::of(0u64..1_000),
        ) {
            let plan = plan().within_held(held.map(s));
            let now = s(contact) + plan.isolate_after + plan.budget + s(late);
            let attempt = if failed { Attempt::Failed } else { Attempt::Pending };
            let verdict = verdict(&plan, s(contact), isolated, attempt, now);
            prop_assert!(
                isolated && verdict == Verdict::Isolated || matches!(verdict, Verdict::Reset { .. }),
                "{verdict:?}"
            );
            // And that deadline keeps the promise the controller holds.
            if let Some(held) = held {
                prop_assert!(plan.isolate_after + plan.budget + plan.watchdog_timeout <= s(held).max(plan.budget + plan.watchdog_timeout));
            }
        }

        /// And none of it happens while the controller still hears the node.
        #[test]
        fn nothing_happens_within_isolate_after_of_a_contact(
            contact in 0u64..10_000,
            early in 0u64..60,
            isolated in any::<bool>(),
        ) {
            let plan = plan();
            let now = s(contact) + plan.isolate_after - s(early) - Duration::from_millis(1);
            let verdict = verdict(&plan, s(contact), isolated, Attempt::Failed, now);
            prop_assert!(matches!(verdict, Verdict::InContact { .. }), "{verdict:?}");
        }
    }
}
