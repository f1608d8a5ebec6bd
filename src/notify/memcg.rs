//! cgroup v1 memory thresholds: the kernel signals an eventfd when a memory cgroup's
//! `memory.usage_in_bytes` crosses a registered value, in either direction.
//!
//! Usage includes reclaimable page cache while eviction thresholds are about the working
//! set, so like the kubelet the trigger point is moved up by the cgroup's inactive file
//! pages, and re-registered as those move.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::error::NotifyError;
use super::pollable::register;
use crate::config::ThresholdValue;

/// The first `memory.usage_in_bytes` value at which the threshold is met: one byte past
/// `capacity − threshold + inactive_file`, the usage at which the working set reaches
/// `capacity − threshold` (kubelet §4).
///
/// The kubelet registers that point itself, but the kernel signals a crossing when usage
/// *reaches* a trigger, while a threshold is met only when available is *below* it: a
/// cycle woken at exactly that usage would find the threshold not met, with the kernel's
/// one signal for the crossing spent. The byte past it is the first usage that meets it
/// (usage moves in whole pages, so the kernel signals at the next page). A threshold larger
/// than the capacity puts the trigger just past the inactive file pages, so any working
/// set fires it.
pub fn memcg_trigger_bytes(capacity: i64, threshold: ThresholdValue, inactive_file: u64) -> u64 {
    let threshold_bytes = threshold.resolve(capacity).value();
    let working_set_limit = u64::try_from(capacity.saturating_sub(threshold_bytes)).unwrap_or(0);
    working_set_limit
        .saturating_add(inactive_file)
        .saturating_add(1)
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
    /// Whether to register `wanted` now, given what is registered (if anything) and
    /// whether it fired since.
    ///
    /// - A threshold fires once per crossing. If it fired early (inactive file pages grew
    ///   since it was computed, so the working set is still below the eviction
    ///   threshold), it stays silent while usage keeps growing. So a trigger that fired
    ///   is replaced as soon as it moved at all, whatever the tolerance and the interval.
    /// - A trigger above the wanted one by more than the tolerance (inactive file pages
    ///   were reclaimed, as they are under pressure) would fire late: replaced at once.
    /// - Otherwise the trigger is replaced only when it moved by more than the tolerance
    ///   and the interval has passed, so page-cache jitter does not churn registrations.
    pub fn should_register(
        &self,
        current: Option<Registered>,
        wanted: u64,
        now: Duration,
        fired_since: bool,
    ) -> bool {
        let Some(current) = current else {
            return true;
        };
        if fired_since {
            return current.trigger_bytes != wanted;
        }
        let moved = current.trigger_bytes.abs_diff(wanted) > self.tolerance_bytes;
        let fires_late = wanted < current.trigger_bytes;
        moved && (fires_late || now.saturating_sub(current.at) >= self.min_interval)
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

    #[test]
    fn trigger_is_capacity_minus_threshold_plus_inactive_file() {
        let threshold = ThresholdValue::Quantity(Quantity::from_value(100 * MI));
        assert_eq!(
            memcg_trigger_bytes(1024 * MI, threshold, 50 << 20),
            ((1024 - 100 + 50) << 20) + 1
        );
        let quarter = ThresholdValue::Percentage(0.25);
        assert_eq!(
            memcg_trigger_bytes(1000 * MI, quarter, 0),
            (1000 * MI - 250 * MI) as u64 + 1
        );
    }

    #[test]
    fn a_threshold_above_capacity_triggers_just_past_the_inactive_pages() {
        let threshold = ThresholdValue::Quantity(Quantity::from_value(2048 * MI));
        assert_eq!(memcg_trigger_bytes(1024 * MI, threshold, 7), 8);
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
        #[test]
        fn the_kernel_signals_the_first_page_at_which_the_threshold_is_met(
            limit_pages in 256u64..(1 << 28),
            hugepage_share in 0u64..50,
            threshold_share in 0u64..=100,
            percentage in proptest::bool::ANY,
            inactive_pages in 0u64..(1 << 28),
        ) {
            const PAGE: u64 = 4096;
            let limit = limit_pages * PAGE;
            let hugepages = limit / 100 * hugepage_share / PAGE * PAGE;
            let capacity = limit - hugepages;
            let threshold = if percentage {
                ThresholdValue::Percentage(threshold_share as f32 / 100.0)
            } else {
                ThresholdValue::Quantity(Quantity::from_value((capacity / 100 * threshold_share) as i64))
            };
            // A threshold of zero is never met (available cannot go below it).
            let threshold_bytes = u64::try_from(threshold.resolve(capacity as i64).value()).unwrap_or(0);
            proptest::prop_assume!(threshold_bytes > 0);
            let inactive = inactive_pages * PAGE;
            let trigger = memcg_trigger_bytes(capacity as i64, threshold, inactive);
            // The first whole page the kernel can report at or past the trigger.
            let signalled = trigger.div_ceil(PAGE) * PAGE;
            proptest::prop_assert!(
                met_at_usage(limit, hugepages, &threshold, signalled, inactive),
                "not met at the signalled usage {signalled} (trigger {trigger})"
            );
            if threshold_bytes <= capacity {
                let page_before = signalled - PAGE;
                proptest::prop_assert!(
                    !met_at_usage(limit, hugepages, &threshold, page_before, inactive),
                    "met a page before the signalled usage {signalled}"
                );
            }
        }
    }

    #[test]
    fn refresh_waits_for_the_interval_and_a_real_move() {
        let policy = RefreshPolicy {
            min_interval: Duration::from_secs(10),
            tolerance_bytes: 1 << 20,
        };
        let current = Some(Registered {
            trigger_bytes: 500 << 20,
            at: Duration::from_secs(100),
        });
        assert!(policy.should_register(None, 1, Duration::ZERO, false));
        // Moved far, but too soon.
        assert!(!policy.should_register(current, 600 << 20, Duration::from_secs(105), false));
        // Late enough, but only jitter.
        assert!(!policy.should_register(
            current,
            (500 << 20) + 4096,
            Duration::from_secs(200),
            false
        ));
        // Moved far up, late enough.
        assert!(policy.should_register(current, 600 << 20, Duration::from_secs(110), false));
    }

    const REGISTERED_500_MIB_AT_100_S: Registered = Registered {
        trigger_bytes: 500 << 20,
        at: Duration::from_secs(100),
    };

    #[test]
    fn a_trigger_that_would_fire_late_is_replaced_at_once() {
        let policy = RefreshPolicy::default();
        let (current, soon) = (Some(REGISTERED_500_MIB_AT_100_S), Duration::from_secs(101));
        assert!(policy.should_register(current, 400 << 20, soon, false));
        // Within the tolerance, it waits like any other move.
        assert!(!policy.should_register(current, (500 << 20) - 4096, soon, false));
    }

    #[test]
    fn a_trigger_that_fired_is_replaced_at_once_when_it_moved_at_all() {
        let policy = RefreshPolicy::default();
        let (current, soon) = (Some(REGISTERED_500_MIB_AT_100_S), Duration::from_secs(101));
        assert!(policy.should_register(current, 510 << 20, soon, true));
        // A page of inactive file pages, well within the tolerance: it may have fired
        // early, and the kernel will not signal again while usage grows.
        assert!(policy.should_register(current, (500 << 20) + 4096, soon, true));
        assert!(!policy.should_register(current, 500 << 20, soon, true));
    }
}
