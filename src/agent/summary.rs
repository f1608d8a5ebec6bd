//! The agent's periodic one-line summary. State changes (a condition on or off, an
//! eviction, a notifier armed or failing) are logged as they happen; what only repeats
//! (cycles, memcg trigger refreshes, notifier wakeups) is counted here and logged once per
//! period, so an idle agent shows it is alive without writing a line per cycle.

use std::time::Duration;

use crate::notify::NotifierCounts;

/// How often the summary is logged.
pub const SUMMARY_PERIOD: Duration = Duration::from_secs(600);

/// What happened during one period.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Activity {
    /// How long the period lasted: the summary period, or longer after a stall.
    pub over: Duration,
    pub cycles: u64,
    /// Pods evicted (in dry-run mode: that would have been).
    pub evictions: u64,
    /// Signal reads that failed.
    pub collection_errors: u64,
    /// memcg thresholds registered (first registrations and refreshes as usage moved).
    pub memcg_registrations: u64,
    /// Kernel notifications that woke the loop (bursts merged).
    pub notifier_wakeups: u64,
}

/// Counts cycles and reports each period's [`Activity`] once it has ended.
#[derive(Debug)]
pub struct Summary {
    period: Duration,
    period_start: Duration,
    activity: Activity,
    /// The notifiers' running totals at the start of the period.
    notifiers_before: NotifierCounts,
}

impl Summary {
    /// A summary whose first period starts at `now` (time since the agent's epoch).
    pub fn new(period: Duration, now: Duration) -> Self {
        Summary {
            period,
            period_start: now,
            activity: Activity::default(),
            notifiers_before: NotifierCounts::default(),
        }
    }

    /// Count one eviction (in dry-run mode: one the agent would have made).
    pub fn count_eviction(&mut self) {
        self.activity.evictions += 1;
    }

    /// Count one cycle that ended at `now`; `notifiers` are the notifiers' running totals.
    /// Returns the activity of the period this cycle completes, once per period.
    pub fn record(
        &mut self,
        now: Duration,
        collection_errors: usize,
        notifiers: Option<NotifierCounts>,
    ) -> Option<Activity> {
        self.activity.cycles += 1;
        self.activity.collection_errors += collection_errors as u64;
        let elapsed = now.saturating_sub(self.period_start);
        if elapsed < self.period {
            return None;
        }
        let mut activity = std::mem::take(&mut self.activity);
        activity.over = elapsed;
        if let Some(totals) = notifiers {
            let before = std::mem::replace(&mut self.notifiers_before, totals);
            activity.memcg_registrations = totals
                .memcg_registrations
                .saturating_sub(before.memcg_registrations);
            activity.notifier_wakeups = totals.wakeups.saturating_sub(before.wakeups);
        }
        self.period_start = now;
        Some(activity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(memcg_registrations: u64, wakeups: u64) -> Option<NotifierCounts> {
        Some(NotifierCounts {
            memcg_registrations,
            wakeups,
            ..NotifierCounts::default()
        })
    }

    #[test]
    fn one_summary_per_period_with_that_periods_counts_only() {
        let second = Duration::from_secs(1);
        let mut summary = Summary::new(60 * second, Duration::ZERO);
        // Cycles every 10 s: the sixth, at 60 s, closes the first period.
        for at in 1..6 {
            assert_eq!(
                summary.record(at * 10 * second, 0, totals(u64::from(at), 0)),
                None
            );
        }
        summary.count_eviction();
        let first = summary.record(60 * second, 2, totals(6, 3));
        assert_eq!(
            first,
            Some(Activity {
                over: 60 * second,
                cycles: 6,
                evictions: 1,
                collection_errors: 2,
                memcg_registrations: 6,
                notifier_wakeups: 3,
            })
        );
        // The next period counts from there: its own cycles and the notifiers' increase.
        for at in 7..12 {
            assert_eq!(summary.record(at * 10 * second, 0, totals(6, 3)), None);
        }
        // A cycle late by 4 s closes a period of 64 s, and says so.
        let next = summary.record(124 * second, 0, totals(10, 3));
        assert_eq!(
            next,
            Some(Activity {
                over: 64 * second,
                cycles: 6,
                memcg_registrations: 4,
                ..Activity::default()
            })
        );
    }

    #[test]
    fn a_long_stall_gives_one_summary_not_one_per_missed_period() {
        let mut summary = Summary::new(Duration::from_secs(60), Duration::ZERO);
        let late = summary.record(Duration::from_secs(3600), 0, None);
        assert_eq!(
            late.map(|a| (a.cycles, a.over)),
            Some((1, Duration::from_secs(3600)))
        );
        assert_eq!(summary.record(Duration::from_secs(3610), 0, None), None);
    }
}
