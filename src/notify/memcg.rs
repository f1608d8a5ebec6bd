//! cgroup v1 memory thresholds: the kernel signals an eventfd when a memory cgroup's
//! `memory.usage_in_bytes` crosses a registered value, in either direction.
//!
//! Usage includes reclaimable page cache while eviction thresholds are about the working
//! set, so like the kubelet the trigger point is moved up by the cgroup's inactive file
//! pages, and re-registered as those move.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::error::NotifyError;
use super::pollable::register;
use crate::config::ThresholdValue;

/// The first `memory.usage_in_bytes` value the kernel can report at which the threshold is
/// met: the first whole page past `capacity − threshold + inactive_file`, the usage at
/// which the working set reaches `capacity − threshold` (kubelet §4).
///
/// The kubelet registers that point itself, but the kernel counts a threshold in whole
/// pages, rounded down, and signals a crossing when usage *reaches* it, while a threshold
/// is met only when available is *below* it: at that point, or at the page below it when
/// the point is not page-aligned (a percentage, a decimal quantity), a cycle woken by the
/// signal finds the threshold not met, with the kernel's one signal for the crossing
/// spent. The next whole page is the first usage that meets it.
///
/// `None` when no usage changes the answer: a threshold of zero is never met (available
/// cannot go below it), one above the capacity always is, and a point past the largest
/// usage there is cannot be reached.
pub fn memcg_trigger_bytes(
    capacity: i64,
    threshold: ThresholdValue,
    inactive_file: u64,
    page_size: u64,
) -> Option<u64> {
    let threshold_bytes = threshold.resolve(capacity).value();
    if threshold_bytes <= 0 || threshold_bytes > capacity {
        return None;
    }
    let working_set_limit = u64::try_from(capacity - threshold_bytes).ok()?;
    let page_size = page_size.max(1);
    let met_past = working_set_limit.checked_add(inactive_file)?;
    (met_past / page_size + 1).checked_mul(page_size)
}

/// The kernel's page size, the unit it counts memory cgroup thresholds in (4 KiB on x86,
/// up to 64 KiB on arm64 and ppc64 kernels).
pub fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|size| u64::try_from(size).ok())
        .filter(|size| *size > 0)
        .unwrap_or(4096)
}

/// When a registered trigger is replaced by a freshly computed one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefreshPolicy {
    /// Re-register at most this often (the kubelet refreshes every 10 s).
    pub min_interval: Duration,
    /// Ignore moves of the trigger smaller than this, so page-cache jitter does not
    /// churn registrations.
    pub tolerance_bytes: u64,
}

impl Default for RefreshPolicy {
    fn default() -> Self {
        RefreshPolicy {
            min_interval: Duration::from_secs(10),
            tolerance_bytes: 1 << 20,
        }
    }
}

/// A trigger currently registered with the kernel, and when it was registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registered {
    pub trigger_bytes: u64,
    pub at: Duration,
}

impl RefreshPolicy {
    /// Whether to register `wanted` now, given what is registered (if anything) and the
    /// usage the cycle's collection read (`usage_bytes`). The kernel holds a trigger
    /// that usage has reached as crossed and signals it again only on the way down; the
    /// collection's usage stands in for what the kernel saw, which it checks only every
    /// 128 page events per CPU.
    ///
    /// - A trigger that usage has reached while the threshold is not met (the wanted
    ///   trigger is above usage: inactive file pages grew since the trigger was computed,
    ///   or it was registered under a threshold that no longer holds) would stay silent
    ///   while usage grows to the threshold: replaced at once, however little it moved.
    /// - Near the threshold (usage within the tolerance of either trigger), any move is
    ///   followed at once: a trigger below the wanted one would signal early and start
    ///   the storm spacing just before the real crossing, one above it would signal late.
    /// - A trigger above the wanted one (inactive file pages were reclaimed, as they are
    ///   under pressure) would fire late: replaced at once when off by more than the
    ///   tolerance, otherwise once the interval has passed.
    /// - Any other move is followed when it is larger than the tolerance and the interval
    ///   has passed: each registration costs the kernel an RCU grace period, and
    ///   page-cache jitter far from the threshold must not churn them.
    pub fn should_register(
        &self,
        current: Option<Registered>,
        wanted: u64,
        usage_bytes: u64,
        now: Duration,
    ) -> bool {
        let Some(current) = current else {
            return true;
        };
        if current.trigger_bytes == wanted {
            return false;
        }
        let reached = current.trigger_bytes <= usage_bytes;
        if reached && usage_bytes < wanted {
            return true;
        }
        let near =
            usage_bytes.saturating_add(self.tolerance_bytes) >= current.trigger_bytes.min(wanted);
        let fires_late = !reached && wanted < current.trigger_bytes;
        let moved = current.trigger_bytes.abs_diff(wanted) > self.tolerance_bytes;
        let interval_passed = now.saturating_sub(current.at) >= self.min_interval;
        (!reached && near) || (fires_late && moved) || ((moved || fires_late) && interval_passed)
    }
}

/// One registered threshold. Dropping it closes the eventfd, which unregisters it.
pub struct MemcgThreshold {
    eventfd: AsyncFd<EventFd>,
    /// The kernel only needs this during registration; keeping it open costs nothing and
    /// matches what the kubelet does.
    _usage_file: File,
    memcg_dir: PathBuf,
    trigger_bytes: u64,
}

impl MemcgThreshold {
    /// Register `trigger_bytes` on the v1 memory cgroup directory `memcg_dir`. Must be
    /// called inside a tokio runtime.
    pub fn register(memcg_dir: &Path, trigger_bytes: u64) -> Result<Self, NotifyError> {
        let usage_path = memcg_dir.join("memory.usage_in_bytes");
        let usage_file =
            File::open(&usage_path).map_err(|e| NotifyError::io(&usage_path, "open", e))?;
        let control_path = memcg_dir.join("cgroup.event_control");
        let mut control = OpenOptions::new()
            .write(true)
            .open(&control_path)
            .map_err(|e| NotifyError::io(&control_path, "open", e))?;
        let eventfd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(|e| NotifyError::io(&control_path, "create an eventfd for", e))?;
        let line = format!(
            "{} {} {}",
            eventfd.as_raw_fd(),
            usage_file.as_raw_fd(),
            trigger_bytes
        );
        control
            .write_all(line.as_bytes())
            .map_err(|e| NotifyError::io(&control_path, "register a threshold in", e))?;
        let eventfd = register(eventfd, Interest::READABLE)
            .map_err(|e| NotifyError::io(&control_path, "poll the eventfd of", e))?;
        Ok(MemcgThreshold {
            eventfd,
            _usage_file: usage_file,
            memcg_dir: memcg_dir.to_path_buf(),
            trigger_bytes,
        })
    }

    pub fn trigger_bytes(&self) -> u64 {
        self.trigger_bytes
    }

    pub fn memcg_dir(&self) -> &Path {
        &self.memcg_dir
    }

    /// The eventfd the kernel signals a crossing on.
    pub fn eventfd(&self) -> BorrowedFd<'_> {
        self.eventfd.get_ref().as_fd()
    }

    /// Wait for the next crossing. Returns how many crossings the kernel counted since
    /// the last call. The kernel also signals once when the cgroup is removed.
    pub async fn crossed(&mut self) -> Result<u64, NotifyError> {
        loop {
            let mut guard = self.eventfd.readable().await.map_err(|e| {
                NotifyError::io(&self.memcg_dir, "wait for the threshold eventfd of", e)
            })?;
            match guard.try_io(|fd| fd.get_ref().read().map_err(std::io::Error::from)) {
                Ok(Ok(count)) => return Ok(count),
                Ok(Err(e)) => {
                    return Err(NotifyError::io(
                        &self.memcg_dir,
                        "read the threshold eventfd of",
                        e,
                    ));
                }
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Quantity;

    const MI: i64 = 1 << 20;

    const PAGE: u64 = 4096;

    #[test]
    fn trigger_is_the_page_past_capacity_minus_threshold_plus_inactive_file() {
        let threshold = ThresholdValue::Quantity(Quantity::from_value(100 * MI));
        assert_eq!(
            memcg_trigger_bytes(1024 * MI, threshold, 50 << 20, PAGE),
            Some(((1024 - 100 + 50) << 20) + PAGE)
        );
        // 750,000,000 bytes is not page-aligned: the next page past it.
        let quarter = ThresholdValue::Percentage(0.25);
        assert_eq!(
            memcg_trigger_bytes(1_000_000_000, quarter, 0, PAGE),
            Some((750_000_000 / PAGE + 1) * PAGE)
        );
        assert_eq!(
            memcg_trigger_bytes(1024 * MI, threshold, 0, 64 << 10),
            Some(((1024 - 100) << 20) + (64 << 10))
        );
    }

    #[test]
    fn a_threshold_never_or_always_met_needs_no_trigger() {
        let capacity = 1024 * MI;
        let whole = ThresholdValue::Quantity(Quantity::from_value(capacity));
        // Met as soon as there is any working set.
        assert_eq!(
            memcg_trigger_bytes(capacity, whole, 2 * PAGE, PAGE),
            Some(3 * PAGE)
        );
        let above = ThresholdValue::Quantity(Quantity::from_value(capacity + 1));
        assert_eq!(memcg_trigger_bytes(capacity, above, 7, PAGE), None);
        let zero = ThresholdValue::Quantity(Quantity::from_value(0));
        assert_eq!(memcg_trigger_bytes(capacity, zero, 7, PAGE), None);
        assert_eq!(
            memcg_trigger_bytes(capacity, ThresholdValue::Percentage(0.0), 7, PAGE),
            None
        );
        // Past the largest usage there is.
        assert_eq!(
            memcg_trigger_bytes(i64::MAX, whole, u64::MAX - 1, PAGE),
            None
        );
    }

    #[test]
    fn the_page_size_is_the_kernels() {
        let size = page_size();
        assert!(size.is_power_of_two() && size >= 4096, "{size}");
    }

    /// The kernel signals when usage reaches the trigger; the cycle it wakes must find the
    /// threshold met there, and not one page before, as the collector computes
    /// `memory.available` from that usage and the kubelet's rule decides.
    fn met_at_usage(
        limit: u64,
        hugepages: u64,
        threshold: &ThresholdValue,
        usage_bytes: u64,
        inactive_file_bytes: u64,
    ) -> bool {
        use crate::eviction::{EvictionState, SyncOptions, synchronize};
        let observation = crate::signals::memory_observation(
            limit,
            hugepages,
            crate::signals::MemoryUsage {
                usage_bytes,
                inactive_file_bytes,
            },
        );
        let config = crate::config::EvictionConfig {
            thresholds: vec![crate::config::Threshold {
                signal: crate::signals::Signal::AllocatableMemoryAvailable,
                value: *threshold,
                grace_period: Default::default(),
                min_reclaim: None,
            }],
            ..Default::default()
        };
        let observations = [(
            crate::signals::Signal::AllocatableMemoryAvailable,
            observation,
        )]
        .into_iter()
        .collect();
        let decision = synchronize(
            &config,
            &EvictionState::default(),
            &observations,
            &[],
            crate::eviction::Millis(0),
            &SyncOptions::default(),
        );
        !decision.thresholds_met.is_empty()
    }

    proptest::proptest! {
        /// The kernel stores a threshold as whole pages, rounded down, and signals an
        /// upward crossing when usage reaches it (mm/memcontrol-v1.c).
        #[test]
        fn the_kernel_signals_the_first_page_at_which_the_threshold_is_met(
            page in proptest::sample::select(vec![4096u64, 16 << 10, 64 << 10]),
            limit_pages in 256u64..(1 << 24),
            hugepage_share in 0u64..50,
            threshold_share in 0u64..=150,
            percentage in proptest::bool::ANY,
            // Whole pages, as memory.stat and a Mi quantity on a page-aligned limit give
            // them, or not: a decimal quantity, a percentage.
            aligned in proptest::bool::ANY,
            inactive_pages in 0u64..(1 << 24),
            odd_bytes in 1u64..4096,
        ) {
            let limit = limit_pages * page;
            let hugepages = limit / 100 * hugepage_share / page * page;
            let capacity = limit - hugepages;
            let odd_bytes = if aligned { 0 } else { odd_bytes };
            let threshold = if percentage {
                ThresholdValue::Percentage(threshold_share.min(100) as f32 / 100.0)
            } else {
                let bytes = capacity / 100 * threshold_share / page * page;
                ThresholdValue::Quantity(Quantity::from_value((bytes + odd_bytes) as i64))
            };
            let threshold_bytes = threshold.resolve(capacity as i64).value();
            let inactive = inactive_pages * page + odd_bytes;
            let trigger = memcg_trigger_bytes(capacity as i64, threshold, inactive, page);
            if threshold_bytes <= 0 || threshold_bytes > capacity as i64 {
                // Never met, or always: nothing to signal.
                proptest::prop_assert_eq!(trigger, None);
                let always = threshold_bytes > 0;
                proptest::prop_assert_eq!(met_at_usage(limit, hugepages, &threshold, 0, 0), always);
                proptest::prop_assert_eq!(met_at_usage(limit, hugepages, &threshold, limit, 0), always);
            } else {
                let trigger = trigger.expect("a trigger for a threshold within capacity");
                // What the kernel stores.
                let signalled = trigger / page * page;
                proptest::prop_assert_eq!(signalled, trigger, "not page-aligned");
                proptest::prop_assert!(
                    met_at_usage(limit, hugepages, &threshold, signalled, inactive),
                    "not met at the signalled usage {}", signalled
                );
                let page_before = signalled - page;
                proptest::prop_assert!(
                    !met_at_usage(limit, hugepages, &threshold, page_before, inactive),
                    "met at {}, a page before the signalled usage {}", page_before, signalled
                );
            }
        }
    }

    const MIB: u64 = 1 << 20;
    const REGISTERED_500_MIB_AT_100_S: Registered = Registered {
        trigger_bytes: 500 * MIB,
        at: Duration::from_secs(100),
    };
    /// Right after the registration, and long after it.
    const SOON: Duration = Duration::from_secs(101);
    const LATER: Duration = Duration::from_secs(200);

    #[test]
    fn far_from_the_threshold_refresh_waits_for_the_interval_and_a_real_move() {
        let policy = RefreshPolicy::default();
        let current = Some(REGISTERED_500_MIB_AT_100_S);
        // Usage well below every trigger here.
        let usage = 100 * MIB;
        assert!(policy.should_register(None, 1, usage, Duration::ZERO));
        assert!(!policy.should_register(current, 500 * MIB, usage, LATER));
        // Moved far up, but too soon.
        assert!(!policy.should_register(current, 600 * MIB, usage, SOON));
        // Up by a page: only jitter, even late.
        assert!(!policy.should_register(current, 500 * MIB + 4096, usage, LATER));
        // Moved far up, late enough.
        assert!(policy.should_register(current, 600 * MIB, usage, Duration::from_secs(110)));
    }

    #[test]
    fn a_trigger_that_would_fire_late_is_replaced_at_once_when_off_by_more_than_the_tolerance() {
        let policy = RefreshPolicy::default();
        let current = Some(REGISTERED_500_MIB_AT_100_S);
        assert!(policy.should_register(current, 400 * MIB, 100 * MIB, SOON));
        // Off by a page, far from usage: it may wait for the interval, not longer.
        assert!(!policy.should_register(current, 500 * MIB - 4096, 100 * MIB, SOON));
        assert!(policy.should_register(current, 500 * MIB - 4096, 100 * MIB, LATER));
    }

    #[test]
    fn near_the_threshold_any_move_is_followed_at_once() {
        let policy = RefreshPolicy::default();
        let current = Some(REGISTERED_500_MIB_AT_100_S);
        let near = 500 * MIB - 8192;
        // Above the wanted trigger: usage could stop between the two, met and never
        // signalled.
        assert!(policy.should_register(current, 500 * MIB - 4096, near, SOON));
        // Below it: the early signal would start the storm spacing just before the real
        // crossing.
        assert!(policy.should_register(current, 500 * MIB + 4096, near, SOON));
        // Far below, the early signal costs a cycle, not a late decision.
        assert!(!policy.should_register(current, 500 * MIB + 4096, 400 * MIB, SOON));
    }

    #[test]
    fn a_trigger_usage_reached_under_an_unmet_threshold_is_replaced_at_once() {
        let policy = RefreshPolicy::default();
        let current = Some(REGISTERED_500_MIB_AT_100_S);
        // Usage reached the trigger, but inactive file pages grew by a page since it was
        // computed: the threshold is not met, and the kernel will not signal again while
        // usage grows.
        assert!(policy.should_register(current, 500 * MIB + 4096, 500 * MIB, SOON));
        assert!(policy.should_register(current, 510 * MIB, 505 * MIB, SOON));
        // Reached and met: the kernel signals on the way down, and jitter waits.
        assert!(!policy.should_register(current, 500 * MIB + 4096, 500 * MIB + 4096, SOON));
        assert!(!policy.should_register(current, 500 * MIB - 4096, 500 * MIB, SOON));
        assert!(!policy.should_register(current, 500 * MIB, 520 * MIB, SOON));
    }
}
