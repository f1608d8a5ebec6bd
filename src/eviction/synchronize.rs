//! One eviction cycle, following the kubelet's `synchronize` step by step.

use super::local_storage::local_storage_evictions;
use super::message::threshold_eviction_message;
use super::rank::first_evictable;
use super::reclaim::reclaim_applies;
use super::thresholds::{
    by_eviction_priority, conditions_last_observed_at, conditions_observed_since,
    first_observed_at, merge_thresholds, met_grace_period, node_conditions, thresholds_met,
    updated_stats,
};
use super::{
    Decision, EvictionOrder, EvictionReason, EvictionState, IMMEDIATE_GRACE_PERIOD_SECONDS, Millis,
    Starvation, SyncOptions,
};
use crate::config::{EvictionConfig, Threshold};
use crate::pods::{Pod, effective_grace_period_seconds};
use crate::signals::Observations;

/// Decide one cycle from the previous state, fresh observations and the active pods.
pub fn synchronize(
    config: &EvictionConfig,
    state: &EvictionState,
    observations: &Observations,
    pods: &[Pod],
    now: Millis,
    options: &SyncOptions,
) -> Decision {
    if config.thresholds.is_empty() && !config.local_storage_capacity_isolation {
        return Decision {
            state: state.clone(),
            conditions: state.node_conditions.clone(),
            ..Decision::default()
        };
    }
    // The containerfs thresholds were already mirrored when the configuration loaded
    // (the kubelet's first-run `UpdateContainerFsThresholds`).
    let mut met = thresholds_met(&config.thresholds, observations, false);
    if !state.thresholds_met.is_empty() {
        // Thresholds that already passed grace stay met until min-reclaim is freed.
        let held = thresholds_met(&state.thresholds_met, observations, true);
        met = merge_thresholds(met, held);
    }
    let first_observed = first_observed_at(&met, &state.thresholds_first_observed_at, now);

    // Conditions ignore grace periods but are damped by the transition period.
    let observed_conditions = node_conditions(&met);
    let conditions_last_observed = conditions_last_observed_at(
        &observed_conditions,
        &state.node_conditions_last_observed_at,
        now,
    );
    let conditions = conditions_observed_since(
        &conditions_last_observed,
        config.pressure_transition_period,
        now,
    );

    let after_grace = met_grace_period(&first_observed, now);
    let acting = updated_stats(after_grace.clone(), observations, &state.last_observations);
    let mut decision = Decision {
        state: EvictionState {
            thresholds_first_observed_at: first_observed,
            node_conditions_last_observed_at: conditions_last_observed,
            thresholds_met: after_grace.clone(),
            last_observations: observations.clone(),
            node_conditions: conditions.clone(),
        },
        conditions,
        thresholds_met: after_grace,
        ..Decision::default()
    };

    if config.local_storage_capacity_isolation {
        let offenders = local_storage_evictions(pods, options.has_dedicated_image_fs());
        if !offenders.is_empty() {
            decision.evictions = offenders;
            return decision;
        }
    }

    let acting = by_eviction_priority(acting);
    let Some(threshold) = acting.first() else {
        return decision;
    };
    let resource = threshold.signal.resource();
    decision.starved = Some(Starvation {
        signal: threshold.signal,
        resource,
    });
    if options.node_reclaimer_configured && reclaim_applies(threshold.signal, options.fs_layout) {
        decision.reclaim_requested = Some(threshold.signal);
    }
    if let Some(pod) = first_evictable(threshold.signal, options.fs_layout, pods) {
        let (message, annotations) =
            threshold_eviction_message(resource, pod, &acting, observations);
        decision.evictions.push(EvictionOrder {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            reason: EvictionReason::Threshold(threshold.signal),
            grace_period_seconds: grace_period_seconds(config, threshold, pod),
            message,
            annotations,
            disruption_target: true,
        });
    }
    decision
}

/// Hard: 1 s. Soft: `evictionMaxPodGracePeriod`, capped by the pod's own
/// terminationGracePeriodSeconds when set (the eviction manager's override), then as the
/// pod worker applies it: a 0 (the default maximum) gives the pod its own grace period,
/// and a negative maximum gives 1 s, as in the kubelet.
fn grace_period_seconds(config: &EvictionConfig, threshold: &Threshold, pod: &Pod) -> i64 {
    if threshold.is_hard() {
        return IMMEDIATE_GRACE_PERIOD_SECONDS;
    }
    let max = config.max_pod_grace_period_seconds;
    let own = pod.termination_grace_period_seconds;
    let requested = own.map_or(max, |pod_grace| max.min(pod_grace));
    effective_grace_period_seconds(requested, own)
}

/// After node-level reclaim: whether any configured threshold is still met on fresh
/// observations, counting min-reclaim and ignoring grace periods. When this is false
/// the cycle's evictions are dropped.
pub fn pressure_remains_after_reclaim(
    config: &EvictionConfig,
    observations: &Observations,
) -> bool {
    !thresholds_met(&config.thresholds, observations, true).is_empty()
}
