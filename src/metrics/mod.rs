//! Prometheus metrics, all named `nodekeeper_*`, and the HTTP endpoints that serve them.

mod http;
pub mod text_format;

pub use http::{Exposition, Health, serve, serve_with};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabels {
    pub signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ThresholdLabels {
    pub signal: String,
    /// `memory.available<100Mi`
    pub threshold: String,
    /// `hard` or `soft`
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionLabels {
    pub condition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PressureLabels {
    pub resource: String,
    /// `some` or `full`
    pub kind: String,
    /// `10s`, `60s` or `300s`
    pub window: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MechanismLabels {
    pub mechanism: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiActionLabels {
    /// `event`, `pod_condition`, `pod_delete`, `node_conditions` or `node_taints`
    pub action: String,
    /// `done`, `retried`, `rejected`, `dropped` or `dry_run`
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateFileLabels {
    /// `trace`, `shutdown_state`, `isolation_record`, `controller_contact` or `api_writes`
    pub file: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CycleLabels {
    /// `timer`, `notification`, `notification_trailing` or `after_eviction`
    pub started_by: String,
}

impl CycleLabels {
    pub fn started_by(started_by: &str) -> CycleLabels {
        CycleLabels {
            started_by: started_by.to_string(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub priority: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

/// A gauge of fractional values (seconds, ratios).
pub type FloatGauge = Gauge<f64, AtomicU64>;

/// Every metric the agent exports. Cheap to clone handles; share it behind an `Arc`.
pub struct Metrics {
    registry: Registry,
    pub signal_available: Family<SignalLabels, Gauge>,
    pub signal_capacity: Family<SignalLabels, Gauge>,
    pub threshold_met: Family<ThresholdLabels, Gauge>,
    pub threshold_amount: Family<ThresholdLabels, Gauge>,
    pub node_condition: Family<ConditionLabels, Gauge>,
    pub collection_duration: Histogram,
    pub collection_errors: Family<SignalLabels, Counter>,
    pub pressure_stall: Family<PressureLabels, FloatGauge>,
    pub notification_mechanism: Family<MechanismLabels, Gauge>,
    pub evictions: Family<SignalLabels, Counter>,
    pub eviction_decision_duration: Histogram,
    pub cycles: Family<CycleLabels, Counter>,
    pub last_collection_timestamp: FloatGauge,
    pub api_actions: Family<ApiActionLabels, Counter>,
    pub api_outbox_pending: Gauge,
    pub shutdown_in_progress: Gauge,
    pub shutdown_inhibit_lock_held: Gauge,
    pub shutdown_inhibit_delay_sufficient: Gauge,
    pub graceful_shutdown_start_time: FloatGauge,
    pub graceful_shutdown_end_time: FloatGauge,
    pub graceful_shutdown_phase_duration: Family<PhaseLabels, FloatGauge>,
    pub reports: Family<ReportResultLabels, Counter>,
    pub report_last_accepted: FloatGauge,
    pub dry_run: Gauge,
    state_write_errors: Family<StateFileLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReportResultLabels {
    /// On the agent: `accepted`, `refused` (the controller answered with an error) or
    /// `failed` (no answer: unreachable, timed out). On the controller: `accepted`, or
    /// the refusal reason.
    pub result: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("nodekeeper");
        let signal_available = Family::<SignalLabels, Gauge>::default();
        registry.register(
            "signal_available",
            "Amount of the signal's resource still available (bytes for memory and filesystem signals, a count for inodes and PIDs)",
            signal_available.clone(),
        );
        let signal_capacity = Family::<SignalLabels, Gauge>::default();
        registry.register(
            "signal_capacity",
            "Capacity the signal is measured against (bytes, or a count for inodes and PIDs)",
            signal_capacity.clone(),
        );
        let threshold_met = Family::<ThresholdLabels, Gauge>::default();
        registry.register(
            "threshold_met",
            "1 when the eviction threshold is met (after its grace period), else 0",
            threshold_met.clone(),
        );
        let threshold_amount = Family::<ThresholdLabels, Gauge>::default();
        registry.register(
            "threshold_amount",
            "The eviction threshold's amount in its signal's units, a percentage resolved against the signal's capacity: the signal is below its threshold when nodekeeper_signal_available is less than this",
            threshold_amount.clone(),
        );
        let node_condition = Family::<ConditionLabels, Gauge>::default();
        registry.register(
            "node_condition",
            "1 while the node condition is on (a pressure condition after transition damping, or an opt-in PSI contention condition), else 0",
            node_condition.clone(),
        );
        let collection_duration = Histogram::new(exponential_buckets(0.000_05, 2.0, 14));
        registry.register(
            "collection_duration_seconds",
            "Wall time of one signal collection",
            collection_duration.clone(),
        );
        let collection_errors = Family::<SignalLabels, Counter>::default();
        registry.register(
            "collection_errors",
            "Signal reads that failed (missing or corrupt file), by signal",
            collection_errors.clone(),
        );
        let pressure_stall = Family::<PressureLabels, FloatGauge>::default();
        registry.register(
            "pressure_stall_ratio",
            "Pressure stall information: share of wall time some or all tasks stalled, averaged over the window",
            pressure_stall.clone(),
        );
        let notification_mechanism = Family::<MechanismLabels, Gauge>::default();
        registry.register(
            "notification_mechanism_available",
            "1 when this host supports the kernel pressure notification mechanism, else 0",
            notification_mechanism.clone(),
        );
        let evictions = Family::<SignalLabels, Counter>::default();
        registry.register(
            "evictions",
            "Pods evicted (or, in dry-run mode, that would have been), by eviction signal",
            evictions.clone(),
        );
        let eviction_decision_duration = Histogram::new(exponential_buckets(0.000_01, 2.0, 16));
        registry.register(
            "eviction_decision_duration_seconds",
            "Time from the start of an evaluation to the eviction decision",
            eviction_decision_duration.clone(),
        );
        let cycles = Family::<CycleLabels, Counter>::default();
        registry.register(
            "cycles",
            "Decision cycles, by what started them: timer (the housekeeping interval), notification (a kernel notification, evaluated at once), notification_trailing (notifications the storm limiter held back until its spacing, 100 ms by default, had passed), after_eviction (a look again after evicting)",
            cycles.clone(),
        );
        let last_collection_timestamp = FloatGauge::default();
        registry.register(
            "last_collection_timestamp_seconds",
            "Unix time of the last completed signal collection",
            last_collection_timestamp.clone(),
        );
        let api_actions = Family::<ApiActionLabels, Counter>::default();
        registry.register(
            "api_actions",
            "Kubernetes API writes by action and outcome (dropped: discarded from a full outbox; dry_run: logged, not sent)",
            api_actions.clone(),
        );
        let api_outbox_pending = Gauge::default();
        registry.register(
            "api_outbox_pending",
            "Kubernetes API writes waiting to be sent",
            api_outbox_pending.clone(),
        );
        let shutdown_in_progress = Gauge::default();
        registry.register(
            "shutdown_in_progress",
            "1 while a graceful node shutdown is draining pods (or waiting for power-off)",
            shutdown_in_progress.clone(),
        );
        // The inhibitor lock's gauges are registered by `export_inhibitor_lock`, only
        // where graceful shutdown is on: a 0 for a lock never wanted would page for nothing.
        let shutdown_inhibit_lock_held = Gauge::default();
        let shutdown_inhibit_delay_sufficient = Gauge::default();
        let graceful_shutdown_start_time = FloatGauge::default();
        registry.register(
            "graceful_shutdown_start_time_seconds",
            "Unix time the last graceful shutdown started (0 if none)",
            graceful_shutdown_start_time.clone(),
        );
        let graceful_shutdown_end_time = FloatGauge::default();
        registry.register(
            "graceful_shutdown_end_time_seconds",
            "Unix time the last graceful shutdown finished (0 if none or unfinished)",
            graceful_shutdown_end_time.clone(),
        );
        let graceful_shutdown_phase_duration = Family::<PhaseLabels, FloatGauge>::default();
        registry.register(
            "graceful_shutdown_phase_duration_seconds",
            "How long each priority phase of the last graceful shutdown took",
            graceful_shutdown_phase_duration.clone(),
        );
        registry.register(
            "build",
            "nodekeeper build information",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
            }),
        );
        let reports = Family::<ReportResultLabels, Counter>::default();
        registry.register(
            "agent_reports",
            "Reports sent to the fence controller, by result: accepted, refused, failed",
            reports.clone(),
        );
        let report_last_accepted = FloatGauge::default();
        registry.register(
            "agent_report_last_accepted_timestamp_seconds",
            "When the fence controller last accepted a report (Unix time; 0 before the first)",
            report_last_accepted.clone(),
        );
        let dry_run = Gauge::default();
        registry.register(
            "dry_run",
            "1 when the agent runs in dry-run mode: it logs and counts what it would do (evictions included, again every cycle while the pressure lasts) and changes nothing",
            dry_run.clone(),
        );
        let state_write_errors = Family::<StateFileLabels, Counter>::default();
        registry.register(
            "state_write_errors",
            "Writes of a file the agent keeps that failed (a full or read-only disk), by file: trace, shutdown_state, isolation_record, controller_contact, api_writes. The agent goes on without it; what it could not write is lost to a restart",
            state_write_errors.clone(),
        );
        Metrics {
            registry,
            dry_run,
            state_write_errors,
            signal_available,
            signal_capacity,
            threshold_met,
            threshold_amount,
            node_condition,
            collection_duration,
            collection_errors,
            pressure_stall,
            notification_mechanism,
            evictions,
            eviction_decision_duration,
            cycles,
            last_collection_timestamp,
            api_actions,
            api_outbox_pending,
            shutdown_in_progress,
            shutdown_inhibit_lock_held,
            shutdown_inhibit_delay_sufficient,
            graceful_shutdown_start_time,
            graceful_shutdown_end_time,
            graceful_shutdown_phase_duration,
            reports,
            report_last_accepted,
        }
    }

    /// Export the logind inhibitor lock's gauges: call at startup when graceful shutdown
    /// handling is on. Both read 0 until the shutdown manager has taken the lock and
    /// checked logind's delay, so a manager that never starts shows as a problem.
    pub fn export_inhibitor_lock(&mut self) {
        self.registry.register(
            "shutdown_inhibit_lock_held",
            "1 while the agent holds its systemd-logind delay inhibitor lock (exported only when graceful shutdown is on)",
            self.shutdown_inhibit_lock_held.clone(),
        );
        self.registry.register(
            "shutdown_inhibit_delay_sufficient",
            "0 when logind's InhibitDelayMaxSec stayed below the shutdown budget, else 1 (exported only when graceful shutdown is on)",
            self.shutdown_inhibit_delay_sufficient.clone(),
        );
    }

    /// Start each of these counters' series at zero, so a rate or an alert sees them
    /// before their first event: evictions and collection errors per signal.
    pub fn start_signal_series<'a>(&self, signals: impl IntoIterator<Item = &'a str>) {
        for signal in signals {
            let labels = Metrics::signal(signal);
            self.evictions.get_or_create(&labels).inc_by(0);
            self.collection_errors.get_or_create(&labels).inc_by(0);
        }
    }

    /// Start every action × outcome series of `api_actions` at zero (Kubernetes mode).
    pub fn start_api_action_series(&self, actions: &[&str], outcomes: &[&str]) {
        for action in actions {
            for outcome in outcomes {
                self.api_actions
                    .get_or_create(&ApiActionLabels {
                        action: action.to_string(),
                        outcome: outcome.to_string(),
                    })
                    .inc_by(0);
            }
        }
    }

    /// Start the report results' series at zero (reporting to a fence controller on).
    pub fn start_report_series(&self, results: &[&str]) {
        for result in results {
            self.reports
                .get_or_create(&ReportResultLabels {
                    result: result.to_string(),
                })
                .inc_by(0);
        }
    }

    /// The failure counter of the file the agent keeps as `file` (see
    /// [`StateFileLabels`]); its series starts at zero when the file is first used.
    pub fn state_write_failures(&self, file: &str) -> Counter {
        self.state_write_errors
            .get_or_create(&StateFileLabels {
                file: file.to_string(),
            })
            .clone()
    }

    /// The registry, for subsystems that register their own metrics at startup.
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// OpenMetrics text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    pub fn signal(name: &str) -> SignalLabels {
        SignalLabels {
            signal: name.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_uses_the_nodekeeper_prefix_and_prometheus_suffixes() {
        let metrics = Metrics::new();
        metrics
            .signal_available
            .get_or_create(&Metrics::signal("memory.available"))
            .set(42);
        metrics
            .collection_errors
            .get_or_create(&Metrics::signal("pid.available"))
            .inc();
        metrics.collection_duration.observe(0.0002);
        let text = metrics.encode();
        assert!(
            text.contains("nodekeeper_signal_available{signal=\"memory.available\"} 42"),
            "{text}"
        );
        assert!(
            text.contains("nodekeeper_collection_errors_total{signal=\"pid.available\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("nodekeeper_collection_duration_seconds_count 1"),
            "{text}"
        );
        assert!(text.contains("nodekeeper_build_info{version=\""), "{text}");
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }

    #[test]
    fn the_inhibitor_lock_is_exported_only_where_graceful_shutdown_is_on() {
        let off = Metrics::new().encode();
        assert!(!off.contains("inhibit"), "{off}");
        assert!(off.contains("nodekeeper_shutdown_in_progress 0"), "{off}");
        let mut on = Metrics::new();
        on.export_inhibitor_lock();
        let text = on.encode();
        // Nothing checked yet: not known to be sufficient.
        assert!(
            text.contains("nodekeeper_shutdown_inhibit_delay_sufficient 0"),
            "{text}"
        );
        assert!(
            text.contains("nodekeeper_shutdown_inhibit_lock_held 0"),
            "{text}"
        );
    }

    #[test]
    fn known_counter_series_exist_at_zero_before_their_first_event() {
        let metrics = Metrics::new();
        metrics.start_signal_series(["memory.available", "nodefs.available"]);
        metrics.start_api_action_series(&["pod_delete"], &["done", "dry_run"]);
        metrics.start_report_series(&["accepted", "failed"]);
        let text = metrics.encode();
        for series in [
            "nodekeeper_evictions_total{signal=\"memory.available\"} 0",
            "nodekeeper_evictions_total{signal=\"nodefs.available\"} 0",
            "nodekeeper_collection_errors_total{signal=\"nodefs.available\"} 0",
            "nodekeeper_api_actions_total{action=\"pod_delete\",outcome=\"done\"} 0",
            "nodekeeper_api_actions_total{action=\"pod_delete\",outcome=\"dry_run\"} 0",
            "nodekeeper_agent_reports_total{result=\"failed\"} 0",
        ] {
            assert!(text.contains(series), "{series} missing from {text}");
        }
    }
}
