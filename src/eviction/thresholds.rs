//! Threshold bookkeeping, one function per step of the kubelet's synchronize.

use std::collections::{BTreeMap, BTreeSet};

use super::{Millis, ObservedThreshold};
use crate::config::{Threshold, ThresholdValue};
use crate::signals::{NodeCondition, Observations};

/// Two thresholds are the same one when signal, value and grace period agree; the
/// minimum reclaim is not part of the identity (the kubelet's `hasThreshold`).
pub(super) fn same_threshold(a: &Threshold, b: &Threshold) -> bool {
    a.signal == b.signal && a.grace_period == b.grace_period && same_value(&a.value, &b.value)
}

fn same_value(a: &ThresholdValue, b: &ThresholdValue) -> bool {
    match (a, b) {
        (ThresholdValue::Quantity(x), ThresholdValue::Quantity(y)) => x == y,
        (ThresholdValue::Percentage(x), ThresholdValue::Percentage(y)) => {
            x.to_bits() == y.to_bits()
        }
        _ => false,
    }
}

/// Thresholds whose observation is strictly below the threshold quantity. With
/// `enforce_min_reclaim`, the minimum reclaim is added on top, so a threshold stays met
/// until that much has been freed beyond it. Signals without an observation are skipped.
pub(super) fn thresholds_met(
    thresholds: &[Threshold],
    observations: &Observations,
    enforce_min_reclaim: bool,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|threshold| {
            let Some(observed) = observations.get(&threshold.signal) else {
                return false;
            };
            let mut quantity = i128::from(threshold.value.resolve(observed.capacity).value());
            if enforce_min_reclaim && let Some(min_reclaim) = &threshold.min_reclaim {
                quantity += i128::from(min_reclaim.resolve(observed.capacity).value());
            }
            quantity > i128::from(observed.available)
        })
        .cloned()
        .collect()
}

/// `a` followed by the thresholds of `b` that `a` does not already hold.
pub(super) fn merge_thresholds(mut a: Vec<Threshold>, b: Vec<Threshold>) -> Vec<Threshold> {
    for threshold in b {
        if !a.iter().any(|held| same_threshold(held, &threshold)) {
            a.push(threshold);
        }
    }
    a
}

/// Keep the first-observed time of thresholds still met; stamp new ones with `now`.
/// A threshold missing from `met` is dropped, which restarts its grace period.
pub(super) fn first_observed_at(
    met: &[Threshold],
    previous: &[ObservedThreshold],
    now: Millis,
) -> Vec<ObservedThreshold> {
    met.iter()
        .map(|threshold| ObservedThreshold {
            threshold: threshold.clone(),
            first_observed_at: previous
                .iter()
                .find(|seen| same_threshold(&seen.threshold, threshold))
                .map_or(now, |seen| seen.first_observed_at),
        })
        .collect()
}

pub(super) fn node_conditions(met: &[Threshold]) -> BTreeSet<NodeCondition> {
    met.iter().map(|t| t.signal.node_condition()).collect()
}

/// Current conditions observed `now`; the others keep their last time.
pub(super) fn conditions_last_observed_at(
    current: &BTreeSet<NodeCondition>,
    previous: &BTreeMap<NodeCondition, Millis>,
    now: Millis,
) -> BTreeMap<NodeCondition, Millis> {
    let mut result = previous.clone();
    for condition in current {
        result.insert(*condition, now);
    }
    result
}

/// Conditions observed within the transition period. A zero period reports nothing,
/// as in the kubelet, because "less than zero" never holds.
pub(super) fn conditions_observed_since(
    last_observed_at: &BTreeMap<NodeCondition, Millis>,
    period: crate::config::GoDuration,
    now: Millis,
) -> BTreeSet<NodeCondition> {
    last_observed_at
        .iter()
        .filter(|(_, at)| now.since(**at) < period)
        .map(|(condition, _)| *condition)
        .collect()
}

/// Thresholds that have been met for at least their grace period.
pub(super) fn met_grace_period(observed: &[ObservedThreshold], now: Millis) -> Vec<Threshold> {
    observed
        .iter()
        .filter(|seen| now.since(seen.first_observed_at) >= seen.threshold.grace_period)
        .map(|seen| seen.threshold.clone())
        .collect()
}

/// Thresholds whose stats advanced since the last cycle, so one sample is acted on
/// once. A threshold without an observation is dropped; a missing timestamp, or no
/// previous observation, counts as fresh.
pub(super) fn updated_stats(
    thresholds: Vec<Threshold>,
    observations: &Observations,
    last: &Observations,
) -> Vec<Threshold> {
    thresholds
        .into_iter()
        .filter(|threshold| {
            let Some(observed) = observations.get(&threshold.signal) else {
                return false;
            };
            match (observed.sampled_at_ms, last.get(&threshold.signal)) {
                (None, _) | (_, None) => true,
                (Some(now), Some(previous)) => Some(now) > previous.sampled_at_ms,
            }
        })
        .collect()
}

/// Memory thresholds first (the kubelet's `byEvictionPriority`; every signal we know
/// has a resource). The kubelet leaves the rest to Go's map order; here a hard threshold
/// goes before a soft one, then configuration order, so the choice is reproducible.
pub(super) fn by_eviction_priority(mut thresholds: Vec<Threshold>) -> Vec<Threshold> {
    thresholds.sort_by_key(|t| (!t.signal.is_memory(), !t.is_hard()));
    thresholds
}
