//! The controller's clock: wall time that does not jump.
//!
//! The waits the controller decides on are counted from wall-clock times, so that a
//! restarted replica, or another one, carries on: `unhealthyDuration` from a Ready
//! condition's transition, the isolation timeout, the retry backoff and the zone's fence
//! rate from times in the NodeFence status, the storm guard's cooldown from the leader
//! Lease, a Job's deadline from the Job. Read from the system clock directly, a jump of
//! that clock (an NTP step, an operator setting the time) would end every such wait at
//! once when it goes forward, fencing a node before its time, and hold them all when it
//! goes back.
//!
//! So the controller reads the system clock once, when it starts, and from then on advances
//! its own time by the monotonic clock. A jump of the system clock moves it by no more than
//! [`SLEW_RATE`] of the time that passes: like NTP's slewing, the difference is taken in
//! gradually (a 1 s step in 100 s; an hour in about four days, unless the controller is
//! restarted, which reads the system clock anew). Within one run, every wait it measures
//! is within that rate of the monotonic time that passed, and its time never goes
//! backwards. The price: started before its host's clock is set, it stays off by the later
//! step for as long; `nodekeeper_controller_clock_offset_seconds` shows the difference
//! still to take in, and docs/controller.md says what to do about it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::executor::Clock;
use crate::metrics::FloatGauge;

/// How fast the controller's time may close a gap with the system clock: 1 % of the time
/// that passes.
pub const SLEW_RATE: f64 = 0.01;

/// A gap with the system clock this large is logged: it is a jump, not drift.
const JUMP_WORTH_LOGGING: Duration = Duration::from_secs(1);

/// The controller's time after `elapsed` of monotonic time since it read `previous`,
/// given that the system clock now reads `wall`: `previous + elapsed`, moved towards
/// `wall` by at most `rate` of `elapsed`.
pub fn advance(previous: Timestamp, elapsed: Duration, wall: Timestamp, rate: f64) -> Timestamp {
    let elapsed = SignedDuration::try_from(elapsed).unwrap_or(SignedDuration::MAX);
    let predicted = previous.saturating_add(elapsed).unwrap_or(previous);
    let gap = wall.duration_since(predicted);
    let allowed = elapsed.mul_f64(rate.clamp(0.0, 1.0));
    let correction = gap.clamp(-allowed, allowed);
    predicted.saturating_add(correction).unwrap_or(predicted)
}

struct Reading {
    time: Timestamp,
    at: Instant,
    /// Whether the gap with the system clock is large enough that it was logged.
    jumped: bool,
}

/// The controller's clock (see the module's description), with the gap it has still to
/// take in shown on `offset` (seconds, the system clock minus the controller's time).
pub fn steady_clock(offset: FloatGauge) -> Clock {
    let last = Mutex::new(Reading {
        time: Timestamp::now(),
        at: Instant::now(),
        jumped: false,
    });
    Arc::new(move || {
        let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
        let at = Instant::now();
        let wall = Timestamp::now();
        let time = advance(last.time, at.duration_since(last.at), wall, SLEW_RATE);
        let gap = wall.duration_since(time);
        offset.set(gap.as_secs_f64());
        let large = gap.unsigned_abs() >= JUMP_WORTH_LOGGING;
        if large && !last.jumped {
            tracing::warn!(
                gap_seconds = gap.as_secs_f64(),
                "the system clock jumped; the controller keeps counting its waits on the monotonic clock and takes the difference in slowly (1% of the time that passes), or at once if restarted"
            );
        } else if !large && last.jumped {
            tracing::info!("the controller's time is back in step with the system clock");
        }
        *last = Reading {
            time,
            at,
            jumped: large,
        };
        time
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    #[test]
    fn in_step_it_is_the_system_clock() {
        assert_eq!(advance(t(0), Duration::from_secs(5), t(5), 0.01), t(5));
    }

    #[test]
    fn a_jump_either_way_moves_it_by_the_slew_rate_only() {
        let forward = advance(t(0), Duration::from_secs(10), t(10 + 3600), 0.01);
        assert_eq!(forward, t(10) + SignedDuration::from_millis(100));
        let back = advance(t(0), Duration::from_secs(10), t(10 - 3600), 0.01);
        assert_eq!(back, t(10) - SignedDuration::from_millis(100));
    }

    #[test]
    fn a_small_gap_is_closed_once_enough_time_passed() {
        let mut time = t(0);
        let mut wall = t(0) + SignedDuration::from_millis(500);
        for _ in 0..60 {
            time = advance(
                time,
                Duration::from_secs(1),
                wall + SignedDuration::from_secs(1),
                0.01,
            );
            wall += SignedDuration::from_secs(1);
        }
        assert_eq!(time, wall, "a 0.5 s gap is closed within 50 s at 1 %");
    }

    proptest::proptest! {
        /// Whatever the system clock does, the controller's time never goes back, and
        /// moves by the monotonic time that passed give or take the slew rate.
        #[test]
        fn never_backwards_and_within_the_rate_of_monotonic_time(
            steps in proptest::collection::vec((0u64..100_000, -86_400_000i64..86_400_000), 1..50),
        ) {
            let mut time = t(0);
            let mut wall = t(0);
            for (elapsed_ms, jump_ms) in steps {
                let elapsed = Duration::from_millis(elapsed_ms);
                wall = wall + SignedDuration::from_millis(elapsed_ms as i64) + SignedDuration::from_millis(jump_ms);
                let next = advance(time, elapsed, wall, SLEW_RATE);
                let moved = next.duration_since(time).as_secs_f64();
                let expected = elapsed.as_secs_f64();
                proptest::prop_assert!(next >= time);
                proptest::prop_assert!(
                    (moved - expected).abs() <= expected * SLEW_RATE + 1e-6,
                    "moved {moved} s for {expected} s"
                );
                time = next;
            }
        }
    }
}
