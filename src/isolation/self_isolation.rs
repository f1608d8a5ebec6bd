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
/// SIGKILL) and a little more. The mask's reload may take up to 30 s; a systemd that slow
/// everywhere runs into the budget, and the node is reset then, as for a failed
/// isolation: the promise holds either way.
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

    /// When the node is isolated unless the controller hears it before (see
    /// [`Count`]).
    pub fn isolate_at(&self, count: &Count) -> Duration {
        let normal = count.counted_from + self.isolate_after;
        if count.answered_since_start {
            return normal;
        }
        // Before this agent's first answer: a restarted agent waits its grace for that
        // answer rather than isolating a node the controller hears at once, but never
        // past what a promise an earlier agent of this boot made still requires.
        let waited = normal.max(count.started + count.grace);
        match count.held {
            Some(held) => waited.min(
                (count.counted_from + held).saturating_sub(self.budget + self.watchdog_timeout),
            ),
            None => waited,
        }
    }
}

/// What the isolation's deadline is counted from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    /// The last contact, or without one this boot, when the boot first armed (see
    /// `ContactClock::count_from`).
    pub counted_from: Duration,
    /// When this agent started.
    pub started: Duration,
    /// The largest promise an earlier agent of this boot delivered, which the
    /// controller may still hold.
    pub held: Option<Duration>,
    /// The leader has answered a report this agent sent: from then on the controller
    /// holds this agent's word (its promise, or none), not an earlier agent's.
    pub answered_since_start: bool,
    /// How long a starting agent waits for that first answer.
    pub grace: Duration,
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

/// The verdict at `now`, the node to be isolated at `isolate_at` (see
/// [`SelfIsolationPlan::isolate_at`]).
pub fn verdict(
    plan: &SelfIsolationPlan,
    isolate_at: Duration,
    isolated: bool,
    attempt: Attempt,
    now: Duration,
) -> Verdict {
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

    /// A count from `from` of an agent that has been answered.
    fn answered(from: u64) -> Count {
        Count {
            counted_from: s(from),
            started: Duration::ZERO,
            held: None,
            answered_since_start: true,
            grace: s(6),
        }
    }

    #[test]
    fn the_promise_adds_the_isolation_budget_and_the_watchdog_timeout() {
        assert_eq!(plan().budget, s(110));
        assert_eq!(plan().within(), s(200));
    }

    #[test]
    fn cut_off_for_isolate_after_the_node_is_isolated_then_reset_if_that_does_not_hold() {
        let plan = plan();
        let at = plan.isolate_at(&answered(100));
        assert_eq!(at, s(160));
        assert_eq!(
            verdict(&plan, at, false, Attempt::Pending, s(159)),
            Verdict::InContact { isolate_at: s(160) }
        );
        assert_eq!(
            verdict(&plan, at, false, Attempt::Pending, s(160)),
            Verdict::Isolate { reset_at: s(270) }
        );
        assert_eq!(
            verdict(&plan, at, true, Attempt::Pending, s(200)),
            Verdict::Isolated
        );
        assert!(matches!(
            verdict(&plan, at, false, Attempt::Failed, s(170)),
            Verdict::Reset { .. }
        ));
        let late = verdict(&plan, at, false, Attempt::Pending, s(270));
        assert!(
            matches!(&late, Verdict::Reset { why } if why.contains("within 110s")),
            "{late:?}"
        );
    }

    #[test]
    fn contact_again_before_the_deadline_puts_it_off_and_an_isolation_stays_without_a_reset() {
        let plan = plan();
        let at = plan.isolate_at(&answered(150));
        assert_eq!(
            verdict(&plan, at, false, Attempt::Pending, s(170)),
            Verdict::InContact { isolate_at: s(210) }
        );
        let at = plan.isolate_at(&answered(300));
        assert_eq!(
            verdict(&plan, at, true, Attempt::Pending, s(301)),
            Verdict::InContact { isolate_at: s(360) }
        );
    }

    #[test]
    fn a_starting_agent_waits_for_its_first_answer_but_not_past_an_earlier_promise() {
        let plan = plan();
        // Restarted at 1000 s, last heard at 100 s, no promise held (the earlier agent
        // withdrew it, or never delivered one): the grace for a first answer.
        let restarted = Count {
            counted_from: s(100),
            started: s(1000),
            held: None,
            answered_since_start: false,
            grace: s(6),
        };
        assert_eq!(plan.isolate_at(&restarted), s(1006));
        // An earlier agent's promise of 300 s from 900 s: isolated by 900 + 300 - 110 -
        // 30 = 1060 at the latest, however long this agent's own isolateAfter.
        let held = Count {
            counted_from: s(900),
            held: Some(s(300)),
            ..restarted
        };
        assert_eq!(plan.isolate_at(&held), s(1006));
        let slow = SelfIsolationPlan::new(s(600), s(20), s(30));
        assert_eq!(slow.isolate_at(&held), s(1060));
        // Already overdue by that promise: at once.
        let overdue = Count {
            counted_from: s(500),
            ..held
        };
        assert_eq!(slow.isolate_at(&overdue), s(660));
        // Once answered, the agent's own plan alone.
        let answered = Count {
            answered_since_start: true,
            ..held
        };
        assert_eq!(slow.isolate_at(&answered), s(1500));
    }

    proptest! {
        /// Whatever happens, an agent that is not isolated by its deadline plus the
        /// budget resets the node, and that keeps any promise the controller holds:
        /// together with the watchdog, no pod process runs past the promise.
        #[test]
        fn nothing_runs_past_the_promise(
            from in 0u64..10_000,
            started in 0u64..10_000,
            late in 0u64..10_000,
            isolated in any::<bool>(),
            failed in any::<bool>(),
            held in proptest::option::of(0u64..1_000),
            answered in any::<bool>(),
            isolate_after in 30u64..3_600,
        ) {
            let plan = SelfIsolationPlan::new(s(isolate_after), s(20), s(30));
            let count = Count {
                counted_from: s(from),
                started: s(started),
                held: held.map(s),
                answered_since_start: answered,
                grace: s(6),
            };
            let at = plan.isolate_at(&count);
            let now = at + plan.budget + s(late);
            let attempt = if failed { Attempt::Failed } else { Attempt::Pending };
            let verdict = verdict(&plan, at, isolated, attempt, now);
            prop_assert!(
                isolated && verdict == Verdict::Isolated || matches!(verdict, Verdict::Reset { .. }),
                "{verdict:?}"
            );
            // The promise the controller holds: this agent's own once answered, else
            // the earlier one (if any).
            if answered {
                prop_assert!(at + plan.budget + plan.watchdog_timeout <= s(from) + plan.within());
            } else if let Some(held) = held {
                let promised = s(from) + s(held);
                prop_assert!(
                    at + plan.budget + plan.watchdog_timeout <= promised
                        || at == Duration::ZERO && plan.budget + plan.watchdog_timeout > promised,
                    "isolated at {at:?} for a promise running out at {promised:?}"
                );
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
            let at = plan.isolate_at(&answered(contact));
            let now = s(contact) + plan.isolate_after - s(early) - Duration::from_millis(1);
            let verdict = verdict(&plan, at, isolated, Attempt::Failed, now);
            prop_assert!(matches!(verdict, Verdict::InContact { .. }), "{verdict:?}");
        }
    }
}
