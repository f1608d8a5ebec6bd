//! The controller's Prometheus metrics, all `nodekeeper_*`: fences and executions by
//! outcome, the three latencies an operator cares about (NotReady to fence start, start
//! to confirmation, NotReady to pods released), paused fences by reason, the storm
//! guard's state and whether this replica leads.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::fencing::config::Step;
use crate::metrics::Exposition;

/// The `step` labels of fences confirmed without a fencing step's own proof: by the
/// node's crash kernel, its agent's promise or isolation, or its own word that it drained.
pub const CONFIRMED_WITHOUT_A_STEP: [&str; 4] =
    ["Kdump", "SelfIsolationPromise", "SelfIsolation", "Drained"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExecutionLabels {
    pub step: String,
    pub method: String,
    pub agent: String,
    /// `Succeeded`, `Failed`, `TimedOut` or `Interrupted`.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    pub step: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: String,
}

pub struct ControllerMetrics {
    registry: Registry,
    pub fences_started: Counter,
    pub fences_confirmed: Family<StepLabels, Counter>,
    pub fences_failed: Family<StepLabels, Counter>,
    pub fences_recovered: Counter,
    pub executions: Family<ExecutionLabels, Counter>,
    pub fence_start_delay: Histogram,
    pub fence_confirm_duration: Histogram,
    pub pods_release_delay: Histogram,
    pub fences_paused: Family<ReasonLabels, Gauge>,
    /// The reasons `fences_paused` has a series for, so a reason no longer seen is
    /// removed without clearing the others first (a scrape between the two would find no
    /// series, and restart an alert's `for`).
    paused_reasons: std::sync::Mutex<std::collections::BTreeSet<String>>,
    pub fences: Gauge,
    /// NodeFences whose Failed condition is True now.
    pub failed_fences: Gauge,
    pub storm_guard: Family<StateLabels, Gauge>,
    pub watched_nodes: Gauge,
    pub unhealthy_nodes: Gauge,
    pub silent_nodes: Gauge,
    /// kdump datagrams by outcome: `notification` (well formed), `refused` (well formed,
    /// but the log is full of other sources' live runs) or `malformed`.
    pub kdump_datagrams: Family<OutcomeLabels, Counter>,
    pub leader: Gauge,
    /// The system clock minus the controller's own time (see `controller::clock`).
    pub clock_offset: crate::metrics::FloatGauge,
    /// 1 while this leader's EndpointSlice is the report Service's only one.
    pub report_service_at_leader: Gauge,
    pub reconcile_errors: Counter,
    /// The report endpoint's metrics.
    pub reports: std::sync::Arc<crate::report::ReportMetrics>,
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Seconds from a quarter second to about 17 minutes.
fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.25, 2.0, 13)
}

impl ControllerMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("nodekeeper");
        let fences_started = Counter::default();
        registry.register(
            "fences_started",
            "Fences whose first agent execution started",
            fences_started.clone(),
        );
        let fences_confirmed = Family::<StepLabels, Counter>::default();
        registry.register(
            "fences_confirmed",
            "Fences proven (power off or storage isolation confirmed by status), by the step that proved them",
            fences_confirmed.clone(),
        );
        let fences_failed = Family::<StepLabels, Counter>::default();
        registry.register(
            "fences_failed",
            "Fences that used up their retries and stay failed, by step",
            fences_failed.clone(),
        );
        let fences_recovered = Counter::default();
        registry.register(
            "fences_recovered",
            "Fenced nodes that came back and were recovered",
            fences_recovered.clone(),
        );
        let executions = Family::<ExecutionLabels, Counter>::default();
        registry.register(
            "fence_executions",
            "Fence agent executions by step, method, agent and result",
            executions.clone(),
        );
        let fence_start_delay = Histogram::new(latency_buckets());
        registry.register(
            "fence_start_delay_seconds",
            "From the node's trouble beginning (its Ready condition turning False or Unknown, or for a node with an agent its last sign of life) to the fence's first agent starting",
            fence_start_delay.clone(),
        );
        let fence_confirm_duration = Histogram::new(latency_buckets());
        registry.register(
            "fence_confirm_duration_seconds",
            "From a fence's first agent starting to the fence being confirmed",
            fence_confirm_duration.clone(),
        );
        let pods_release_delay = Histogram::new(latency_buckets());
        registry.register(
            "fence_pods_release_delay_seconds",
            "From the node's trouble beginning (Ready turning False or Unknown, or its last sign of life) to its pods being released (out-of-service taint or deletion asked for)",
            pods_release_delay.clone(),
        );
        let fences_paused = Family::<ReasonLabels, Gauge>::default();
        registry.register(
            "fences_paused",
            "NodeFences paused now, by reason (StormGuard, ZoneRateLimit, NoConfiguration, ...)",
            fences_paused.clone(),
        );
        let fences = Gauge::default();
        registry.register("fences", "NodeFences that exist now", fences.clone());
        let failed_fences = Gauge::default();
        registry.register(
            "failed_fences",
            "NodeFences whose Failed condition is True now: their retries are used up and the node's pods stay where they are until a person acts",
            failed_fences.clone(),
        );
        let storm_guard = Family::<StateLabels, Gauge>::default();
        registry.register(
            "storm_guard_state",
            "1 for the storm guard's current state (calm, storm, cooldown), 0 for the others",
            storm_guard.clone(),
        );
        let watched_nodes = Gauge::default();
        registry.register(
            "controller_watched_nodes",
            "Nodes the controller watches (its nodeSelector)",
            watched_nodes.clone(),
        );
        let unhealthy_nodes = Gauge::default();
        registry.register(
            "controller_unhealthy_nodes",
            "Watched nodes the storm guard counts as unhealthy: Ready not True, or silent",
            unhealthy_nodes.clone(),
        );
        let silent_nodes = Gauge::default();
        registry.register(
            "controller_silent_nodes",
            "Nodes with an agent whose Lease and reports are both silent (or falling silent with others), whatever their Ready condition",
            silent_nodes.clone(),
        );
        let kdump_datagrams = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "controller_kdump_datagrams",
            "Datagrams received on kdumpAddress, by outcome: notification (a well-formed fence_kdump_send message, from any address), refused (well formed, but the log is full of other sources' live runs) or malformed",
            kdump_datagrams.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "controller_leader",
            "1 while this replica holds the leader Lease and acts",
            leader.clone(),
        );
        let clock_offset = crate::metrics::FloatGauge::default();
        registry.register(
            "controller_clock_offset_seconds",
            "The system clock minus the controller's own time, which follows the monotonic clock and takes a jump of the system clock in at 1% of the time that passes",
            clock_offset.clone(),
        );
        // Registered by `export_report_service`, only where reports.leaderService is set:
        // a leader's 0 for a Service never wanted would page for nothing.
        let report_service_at_leader = Gauge::default();
        let reconcile_errors = Counter::default();
        registry.register(
            "controller_reconcile_errors",
            "Reconciles that failed and were retried",
            reconcile_errors.clone(),
        );
        let reports = std::sync::Arc::new(crate::report::ReportMetrics::register(&mut registry));
        // Counters an alert or a rate reads exist at 0 before their first event: a series
        // that first appears at 1 has no increase to see.
        for step in Step::ALL {
            let labels = StepLabels {
                step: format!("{step:?}"),
            };
            fences_confirmed.get_or_create(&labels).inc_by(0);
            fences_failed.get_or_create(&labels).inc_by(0);
        }
        for step in CONFIRMED_WITHOUT_A_STEP {
            fences_confirmed
                .get_or_create(&StepLabels {
                    step: step.to_string(),
                })
                .inc_by(0);
        }
        ControllerMetrics {
            registry,
            reports,
            fences_started,
            fences_confirmed,
            fences_failed,
            fences_recovered,
            executions,
            fence_start_delay,
            fence_confirm_duration,
            pods_release_delay,
            fences_paused,
            paused_reasons: Default::default(),
            fences,
            failed_fences,
            storm_guard,
            watched_nodes,
            unhealthy_nodes,
            silent_nodes,
            kdump_datagrams,
            leader,
            clock_offset,
            report_service_at_leader,
            reconcile_errors,
        }
    }

    /// Export the report Service's gauge: call at startup when `reports.leaderService`
    /// is set.
    pub fn export_report_service(&mut self) {
        self.registry.register(
            "controller_report_service_at_leader",
            "1 while this leader's EndpointSlice is the only one of the report Service (reports.leaderService), so every agent's report reaches it; 0 on a follower, before the slice is written, while it cannot be, or while another EndpointSlice serves the Service too (exported only with reports.leaderService)",
            self.report_service_at_leader.clone(),
        );
    }

    /// Sets `fences_paused` to `counts` (paused fences by reason): each reason's series
    /// is set in place, and those of reasons gone are removed.
    pub fn set_paused(&self, counts: &std::collections::BTreeMap<String, i64>) {
        let mut reasons = self
            .paused_reasons
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (reason, count) in counts {
            self.fences_paused
                .get_or_create(&ReasonLabels {
                    reason: reason.clone(),
                })
                .set(*count);
        }
        for gone in reasons
            .iter()
            .filter(|reason| !counts.contains_key(*reason))
        {
            self.fences_paused.remove(&ReasonLabels {
                reason: gone.clone(),
            });
        }
        *reasons = counts.keys().cloned().collect();
    }

    /// Sets the storm guard's state gauges: the current one to 1, the others to 0.
    pub fn set_storm_state(&self, current: &str) {
        for state in ["calm", "storm", "cooldown"] {
            self.storm_guard
                .get_or_create(&StateLabels {
                    state: state.to_string(),
                })
                .set(i64::from(state == current));
        }
    }
}

impl Exposition for ControllerMetrics {
    fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_an_alert_reads_start_at_zero_and_the_report_service_gauge_only_when_wanted() {
        let mut metrics = ControllerMetrics::new();
        let text = metrics.encode();
        for series in [
            "nodekeeper_fences_failed_total{step=\"PowerManagement\"} 0",
            "nodekeeper_fences_failed_total{step=\"Isolation\"} 0",
            "nodekeeper_fences_confirmed_total{step=\"Drained\"} 0",
            "nodekeeper_fences_confirmed_total{step=\"Recovery\"} 0",
            "nodekeeper_failed_fences 0",
        ] {
            assert!(text.contains(&format!("\n{series}\n")), "{series}: {text}");
        }
        assert!(!text.contains("report_service_at_leader"), "{text}");
        let paused = |counts: &[(&str, i64)]| {
            metrics.set_paused(&counts.iter().map(|(r, n)| (r.to_string(), *n)).collect());
            metrics.encode()
        };
        let text = paused(&[("NoConfiguration", 2), ("StormGuard", 1)]);
        assert!(text.contains("\nnodekeeper_fences_paused{reason=\"NoConfiguration\"} 2\n"));
        let text = paused(&[("NoConfiguration", 1)]);
        assert!(text.contains("\nnodekeeper_fences_paused{reason=\"NoConfiguration\"} 1\n"));
        assert!(!text.contains("reason=\"StormGuard\""), "{text}");
        metrics.export_report_service();
        assert!(
            metrics
                .encode()
                .contains("\nnodekeeper_controller_report_service_at_leader 0\n")
        );
    }
}
