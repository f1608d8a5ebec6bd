//! The PSI contention node conditions of KEP-5394: opt-in, and ahead of the kubelet,
//! whose `PSINodeCondition` gate is still alpha. Each condition watches the share of
//! wall time in which every non-idle task of its scope was stalled on one resource (the
//! PSI `full` line): the whole node's memory or IO (`/proc/pressure/*`), or the pods
//! cgroup's (`memory.pressure`, `io.pressure`). Eviction never reads them; they tell the
//! scheduler and operators that a node is thrashing before any threshold is met.
//!
//! The KEP's rules, for a condition with threshold `t` (a fraction: 0.1 is 10%):
//! - the 60 s average at or above `t` records an event that the pressure is high;
//! - the 60 s and the 10 s averages both at or above `t` turn the condition True;
//! - while True, a 10 s average below `t` (the 60 s one still above) records an event
//!   that the pressure is trending lower, and the condition stays True;
//! - the 60 s average below `t` turns it False.
//!
//! A threshold of 0 turns the condition off: it is never published. A PSI file that
//! cannot be read for a cycle or two leaves the condition as it was; one that stays
//! unreadable for [`MISSED_READINGS_LIMIT`] cycles withdraws it, so a condition (and its
//! taint) never outlives the evidence for it. Pure: the agent passes each cycle's
//! readings.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

pub use crate::signal_names::Contention;

use super::pressure::{PressureKind, PressureReading, PressureResource, PressureScope};

/// Which PSI file a condition reads.
fn resource_of(contention: Contention) -> PressureResource {
    if contention.is_disk() {
        PressureResource::Io
    } else {
        PressureResource::Memory
    }
}

/// The `full` averages of one PSI file, in percent of wall time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StallAverages {
    pub avg10: f64,
    pub avg60: f64,
}

/// Each condition's `full` averages found in a collection's PSI readings: the node's
/// files for the system conditions, the pods cgroup's for the kubepods ones. A condition
/// whose file was not read is missing.
pub fn stall_averages(
    readings: &[PressureReading],
    pods_cgroup: Option<&Path>,
) -> BTreeMap<Contention, StallAverages> {
    let mut found = BTreeMap::new();
    for reading in readings.iter().filter(|r| r.kind == PressureKind::Full) {
        let kubepods = match &reading.scope {
            PressureScope::Node => false,
            PressureScope::Cgroup(cgroup) if Some(cgroup.as_path()) == pods_cgroup => true,
            PressureScope::Cgroup(_) => continue,
        };
        let averages = StallAverages {
            avg10: reading.avg10,
            avg60: reading.avg60,
        };
        for contention in Contention::ALL {
            if contention.is_kubepods() == kubepods && resource_of(contention) == reading.resource {
                found.insert(contention, averages);
            }
        }
    }
    found
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ContentionEventKind {
    /// The 60 s average reached the threshold.
    High,
    /// True, and the 10 s average fell below the threshold.
    TrendingLower,
}

/// Something the KEP says to record as an event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContentionEvent {
    pub contention: Contention,
    pub kind: ContentionEventKind,
    pub averages: StallAverages,
    /// The threshold, in percent.
    pub threshold_percent: f64,
}

impl ContentionEvent {
    /// The event's reason, e.g. `SystemMemoryContentionHigh`.
    pub fn reason(&self) -> String {
        let base = self
            .contention
            .condition_type()
            .trim_end_matches("Pressure");
        match self.kind {
            ContentionEventKind::High => format!("{base}High"),
            ContentionEventKind::TrendingLower => format!("{base}TrendingLower"),
        }
    }

    pub fn message(&self) -> String {
        let scope = if self.contention.is_kubepods() {
            "the pods cgroup"
        } else {
            "the node"
        };
        let resource = resource_of(self.contention);
        let StallAverages { avg10, avg60 } = self.averages;
        let threshold = self.threshold_percent;
        match self.kind {
            ContentionEventKind::High => format!(
                "every task of {scope} was stalled on {resource} {avg60:.2}% of the last 60 s (threshold {threshold}%)"
            ),
            ContentionEventKind::TrendingLower => format!(
                "{resource} stalls of {scope} are trending lower: {avg10:.2}% of the last 10 s, {avg60:.2}% of the last 60 s (threshold {threshold}%)"
            ),
        }
    }
}

/// One cycle's outcome: each enabled condition that has been read at least once, with
/// its state, and the events to record.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContentionReport {
    pub conditions: BTreeMap<Contention, bool>,
    pub events: Vec<ContentionEvent>,
    /// The conditions that turned on (`true`) or off this cycle.
    pub transitions: Vec<(Contention, bool)>,
}

/// Consecutive cycles without a reading after which a condition is withdrawn.
pub const MISSED_READINGS_LIMIT: u32 = 3;

#[derive(Debug, Clone, Copy, Default)]
struct State {
    /// Cycles in a row without a reading.
    missed: u32,
    on: bool,
    /// The 60 s average is at or above the threshold (its event was recorded).
    high: bool,
    /// The trending-lower event was recorded for this spell of True.
    trending_lower: bool,
}

/// The four conditions' states from cycle to cycle.
#[derive(Debug, Clone, Default)]
pub struct ContentionTracker {
    /// Thresholds in percent, for the conditions that are on.
    thresholds: BTreeMap<Contention, f64>,
    states: BTreeMap<Contention, State>,
}

impl ContentionTracker {
    /// A tracker for `thresholds` (fractions; a condition at 0 or missing is off).
    pub fn new(thresholds: &BTreeMap<Contention, f64>) -> Self {
        ContentionTracker {
            // In percent, rounded to the hundredth PSI prints, so that 0.07 compares
            // with a reading of exactly 7.00 as 7 and not as 7.000000000000001.
            thresholds: thresholds
                .iter()
                .filter(|(_, fraction)| **fraction > 0.0)
                .map(|(contention, fraction)| (*contention, (fraction * 10_000.0).round() / 100.0))
                .collect(),
            states: BTreeMap::new(),
        }
    }

    pub fn is_enabled(&self) -> bool {
        !self.thresholds.is_empty()
    }

    /// The conditions after this cycle's `averages`. A condition without a reading this
    /// cycle keeps its state for a while (a PSI file briefly unreadable does not clear
    /// it), then is withdrawn.
    pub fn update(&mut self, averages: &BTreeMap<Contention, StallAverages>) -> ContentionReport {
        let mut report = ContentionReport::default();
        for (&contention, &threshold) in &self.thresholds {
            match averages.get(&contention) {
                Some(&reading) => {
                    let state = self.states.entry(contention).or_default();
                    state.observe(contention, reading, threshold, &mut report);
                }
                None => {
                    let withdrawn = self.states.get_mut(&contention).is_some_and(|state| {
                        state.missed += 1;
                        state.missed >= MISSED_READINGS_LIMIT
                    });
                    if withdrawn && self.states.remove(&contention).is_some_and(|s| s.on) {
                        report.transitions.push((contention, false));
                    }
                }
            }
            if let Some(state) = self.states.get(&contention) {
                report.conditions.insert(contention, state.on);
            }
        }
        report
    }
}

impl State {
    /// The KEP's rules for one reading.
    fn observe(
        &mut self,
        contention: Contention,
        reading: StallAverages,
        threshold: f64,
        report: &mut ContentionReport,
    ) {
        let event = |kind| ContentionEvent {
            contention,
            kind,
            averages: reading,
            threshold_percent: threshold,
        };
        self.missed = 0;
        let was_on = self.on;
        let high = reading.avg60 >= threshold;
        if high && !self.high {
            report.events.push(event(ContentionEventKind::High));
        }
        self.high = high;
        if !high {
            self.on = false;
            self.trending_lower = false;
        } else if reading.avg10 >= threshold {
            self.on = true;
            self.trending_lower = false;
        } else if self.on && !self.trending_lower {
            self.trending_lower = true;
            report
                .events
                .push(event(ContentionEventKind::TrendingLower));
        }
        if self.on != was_on {
            report.transitions.push((contention, self.on));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn averages(avg10: f64, avg60: f64) -> StallAverages {
        StallAverages { avg10, avg60 }
    }

    fn tracker(threshold: f64) -> ContentionTracker {
        ContentionTracker::new(&BTreeMap::from([(Contention::SystemMemory, threshold)]))
    }

    fn step(tracker: &mut ContentionTracker, avg10: f64, avg60: f64) -> (bool, Vec<String>) {
        let report = tracker.update(&BTreeMap::from([(
            Contention::SystemMemory,
            averages(avg10, avg60),
        )]));
        (
            report.conditions[&Contention::SystemMemory],
            report.events.iter().map(ContentionEvent::reason).collect(),
        )
    }

    /// The KEP-5394 rules, at a 10% threshold, through a whole episode.
    #[test]
    fn an_episode_follows_the_keps_rules() {
        let mut t = tracker(0.1);
        // Calm.
        assert_eq!(step(&mut t, 2.0, 3.0), (false, vec![]));
        // A burst: avg10 high, avg60 not yet; nothing.
        assert_eq!(step(&mut t, 40.0, 8.0), (false, vec![]));
        // avg60 reaches the threshold (equality counts) with avg10 above: True, and the
        // "high" event once.
        assert_eq!(
            step(&mut t, 30.0, 10.0),
            (true, vec!["SystemMemoryContentionHigh".to_string()])
        );
        assert_eq!(step(&mut t, 35.0, 20.0), (true, vec![]));
        // avg10 drops below while avg60 stays above: still True, trending lower, once.
        assert_eq!(
            step(&mut t, 5.0, 15.0),
            (
                true,
                vec!["SystemMemoryContentionTrendingLower".to_string()]
            )
        );
        assert_eq!(step(&mut t, 4.0, 12.0), (true, vec![]));
        // avg60 below: False.
        assert_eq!(step(&mut t, 1.0, 9.9), (false, vec![]));
        // avg60 above but avg10 below from False: not True, though high again.
        assert_eq!(
            step(&mut t, 5.0, 11.0),
            (false, vec!["SystemMemoryContentionHigh".to_string()])
        );
    }

    /// A fraction that is not exact in binary still meets a reading equal to it: 0.07
    /// is 7%, and PSI prints two decimals.
    #[test]
    fn thresholds_compare_at_the_precision_psi_prints() {
        for fraction in [0.07, 0.14, 0.55, 0.29] {
            let mut t = tracker(fraction);
            let percent = (fraction * 100.0 * 100.0).round() / 100.0;
            let (on, events) = step(&mut t, percent, percent);
            assert!(on, "{fraction}");
            let report = ContentionEvent {
                contention: Contention::SystemMemory,
                kind: ContentionEventKind::High,
                averages: averages(percent, percent),
                threshold_percent: t.thresholds[&Contention::SystemMemory],
            };
            assert!(!report.message().contains("0000"), "{}", report.message());
            assert_eq!(events.len(), 1);
        }
    }

    #[test]
    fn each_transition_is_reported_once() {
        let mut t = tracker(0.1);
        let mut transitions = |avg10, avg60| {
            t.update(&BTreeMap::from([(
                Contention::SystemMemory,
                averages(avg10, avg60),
            )]))
            .transitions
        };
        assert!(
            transitions(1.0, 1.0).is_empty(),
            "starting off is no transition"
        );
        assert_eq!(transitions(20.0, 20.0), [(Contention::SystemMemory, true)]);
        assert!(transitions(20.0, 20.0).is_empty());
        assert_eq!(transitions(1.0, 1.0), [(Contention::SystemMemory, false)]);
    }

    #[test]
    fn a_zero_threshold_turns_a_condition_off_and_a_missing_reading_keeps_the_state() {
        let mut t = ContentionTracker::new(&BTreeMap::from([
            (Contention::SystemMemory, 0.1),
            (Contention::SystemDisk, 0.0),
        ]));
        assert!(t.is_enabled());
        assert!(!ContentionTracker::new(&BTreeMap::new()).is_enabled());
        let all_high = Contention::ALL
            .into_iter()
            .map(|c| (c, averages(100.0, 100.0)))
            .collect();
        let report = t.update(&all_high);
        assert_eq!(
            report.conditions,
            BTreeMap::from([(Contention::SystemMemory, true)])
        );
        // The file could not be read for a cycle or two: the condition holds.
        for _ in 1..MISSED_READINGS_LIMIT {
            let report = t.update(&BTreeMap::new());
            assert_eq!(
                report.conditions,
                BTreeMap::from([(Contention::SystemMemory, true)])
            );
            assert!(report.events.is_empty() && report.transitions.is_empty());
        }
        // Unreadable for longer: withdrawn, not left True with nothing to show for it.
        let report = t.update(&BTreeMap::new());
        assert!(report.conditions.is_empty());
        assert_eq!(report.transitions, [(Contention::SystemMemory, false)]);
        // Read again: back, from a fresh start.
        let report = t.update(&all_high);
        assert_eq!(report.transitions, [(Contention::SystemMemory, true)]);
        // Never read at all: not published.
        let mut fresh = tracker(0.1);
        assert!(fresh.update(&BTreeMap::new()).conditions.is_empty());
    }

    #[test]
    fn readings_are_matched_to_conditions_by_scope_resource_and_full_line() {
        let reading = |scope: PressureScope, resource, kind, avg10| PressureReading {
            scope,
            resource,
            kind,
            avg10,
            avg60: avg10 / 2.0,
            avg300: 0.0,
            total_microseconds: 0,
        };
        let pods = PathBuf::from("kubepods.slice");
        let other = PressureScope::Cgroup(PathBuf::from("system.slice"));
        let readings = vec![
            reading(
                PressureScope::Node,
                PressureResource::Memory,
                PressureKind::Some,
                99.0,
            ),
            reading(
                PressureScope::Node,
                PressureResource::Memory,
                PressureKind::Full,
                10.0,
            ),
            reading(
                PressureScope::Node,
                PressureResource::Io,
                PressureKind::Full,
                20.0,
            ),
            reading(
                PressureScope::Node,
                PressureResource::Cpu,
                PressureKind::Full,
                50.0,
            ),
            reading(
                PressureScope::Cgroup(pods.clone()),
                PressureResource::Memory,
                PressureKind::Full,
                30.0,
            ),
            reading(other, PressureResource::Io, PressureKind::Full, 70.0),
        ];
        let found = stall_averages(&readings, Some(&pods));
        assert_eq!(
            found,
            BTreeMap::from([
                (Contention::SystemMemory, averages(10.0, 5.0)),
                (Contention::SystemDisk, averages(20.0, 10.0)),
                (Contention::KubepodsMemory, averages(30.0, 15.0)),
            ])
        );
        let event = ContentionEvent {
            contention: Contention::KubepodsDisk,
            kind: ContentionEventKind::TrendingLower,
            averages: averages(1.5, 12.25),
            threshold_percent: 10.0,
        };
        assert_eq!(event.reason(), "KubepodsDiskContentionTrendingLower");
        assert_eq!(
            event.message(),
            "io stalls of the pods cgroup are trending lower: 1.50% of the last 10 s, 12.25% of the last 60 s (threshold 10%)"
        );
    }
}
