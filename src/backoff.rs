//! The one retry schedule every loop uses (API writes, reports to the controller, fence
//! retries, logind's reload poll): double the wait after each failure, up to a ceiling.

use std::time::Duration;

/// The wait after `failures` failures in a row: `base` after the first (and for 0),
/// doubling with each further one, never above `ceiling`. Saturates instead of
/// overflowing, however many failures.
pub fn doubling(base: Duration, failures: u32, ceiling: Duration) -> Duration {
    let doublings = failures.saturating_sub(1).min(31);
    base.saturating_mul(1u32 << doublings).min(ceiling)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_the_base_up_to_the_ceiling() {
        let base = Duration::from_millis(500);
        let ceiling = Duration::from_secs(30);
        let waits: Vec<u128> = (0..10)
            .map(|n| doubling(base, n, ceiling).as_millis())
            .collect();
        assert_eq!(
            waits,
            [500, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
    }

    #[test]
    fn never_overflows() {
        let huge = Duration::from_secs(u64::MAX / 4);
        assert_eq!(doubling(huge, u32::MAX, Duration::MAX), Duration::MAX);
        assert_eq!(
            doubling(Duration::from_secs(1), u32::MAX, Duration::from_secs(60)),
            Duration::from_secs(60)
        );
        assert_eq!(
            doubling(Duration::from_millis(100), 40, Duration::MAX),
            Duration::from_millis(100) * (1 << 31)
        );
    }
}
