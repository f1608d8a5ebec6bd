//! The boot clock (`CLOCK_BOOTTIME`): time since this boot, counting suspend, never set
//! and never stepped. Durations that must outlive a restart of the agent within a boot
//! (a shutdown phase's timer, the last contact with the controller, a report's sequence)
//! are measured on it, so a wall-clock jump (NTP stepping the time, an operator setting
//! it) neither ends nor stretches them.

use std::time::Duration;

/// Time since this boot; zero if the kernel cannot tell (it always can on Linux).
pub fn since_boot() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(Duration::from)
        .unwrap_or_default()
}

/// [`since_boot`] in whole milliseconds.
pub fn since_boot_ms() -> u64 {
    whole_millis(since_boot())
}

/// `duration` in whole milliseconds, as the state files keep boot-clock times
/// (saturating, where no boot lasts that long).
pub fn whole_millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_grows_and_follows_the_monotonic_clock() {
        let first = since_boot();
        std::thread::sleep(Duration::from_millis(20));
        let second = since_boot();
        assert!(first > Duration::ZERO);
        assert!(
            second >= first + Duration::from_millis(20),
            "{first:?} {second:?}"
        );
    }
}
