//! One agent cycle: collect, decide, act, publish.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use crate::config::{AgentConfig, HostPaths};
use crate::eviction::{Decision, EvictionState, FsLayout, Millis, SyncOptions, synchronize};
use crate::metrics::{ConditionLabels, MechanismLabels, Metrics, PressureLabels, ThresholdLabels};
use crate::signals::{Collection, NodeCondition, Observations, SignalCollector, probe};

const CONDITIONS: [NodeCondition; 3] = [
    NodeCondition::MemoryPressure,
    NodeCondition::DiskPressure,
    NodeCondition::PidPressure,
];

/// What one cycle saw and decided, for logs and tests.
#[derive(Debug, Clone)]
pub struct CycleReport {
    pub observations: Observations,
    pub decision: Decision,
    pub collection_errors: usize,
}

/// The agent's state between cycles.
pub struct Agent {
    config: AgentConfig,
    collector: SignalCollector,
    metrics: Arc<Metrics>,
    state: EvictionState,
    epoch: Instant,
    sync_options: SyncOptions,
    /// Errors already logged, so a persistently broken file is reported once, not
    /// every cycle; the error counter still counts every failure.
    logged_errors: BTreeSet<String>,
}

/// The kubelet's filesystem layouts, from which paths are configured.
pub fn fs_layout(paths: &HostPaths) -> FsLayout {
    match (&paths.imagefs, &paths.containerfs) {
        (None, _) => FsLayout::SingleDisk,
        (Some(image), Some(container)) if image != container => FsLayout::SplitImageFs,
        (Some(_), _) => FsLayout::ImageFs,
    }
}

impl Agent {
    pub fn new(config: AgentConfig, metrics: Arc<Metrics>) -> Self {
        let collector = SignalCollector::new(&config.paths);
        let sync_options = SyncOptions {
            fs_layout: fs_layout(&config.paths),
            node_reclaimer_configured: false,
        };
        Agent {
            config,
            collector,
            metrics,
            state: EvictionState::default(),
            epoch: Instant::now(),
            sync_options,
            logged_errors: BTreeSet::new(),
        }
    }

    /// Log how the agent sees this host, once at startup, and export which kernel
    /// notification mechanisms it offers.
    pub fn announce(&self) {
        let support = probe(&self.config.paths);
        tracing::info!(
            layout = ?self.collector.layout(),
            dry_run = self.config.dry_run,
            interval = %self.config.housekeeping_interval,
            thresholds = %self
                .config
                .eviction
                .thresholds
                .iter()
                .map(|t| t.describe())
                .collect::<Vec<_>>()
                .join(","),
            "agent started"
        );
        for (mechanism, available, detail) in [
            ("psi", support.psi, &support.psi_detail),
            (
                "memcg_eventfd_v1",
                support.memcg_eventfd_v1,
                &support.memcg_eventfd_v1_detail,
            ),
            (
                "memory_events_v2",
                support.memory_events_v2,
                &support.memory_events_v2_detail,
            ),
        ] {
            tracing::info!(
                mechanism,
                available,
                "kernel notification mechanism: {detail}"
            );
            self.metrics
                .notification_mechanism
                .get_or_create(&MechanismLabels {
                    mechanism: mechanism.to_string(),
                })
                .set(i64::from(available));
        }
    }

    fn now(&self) -> Millis {
        Millis(self.epoch.elapsed().as_millis() as u64)
    }

    pub fn run_cycle(&mut self) -> CycleReport {
        let started = Instant::now();
        let collection = self.collector.collect();
        self.metrics
            .collection_duration
            .observe(started.elapsed().as_secs_f64());
        self.publish_collection(&collection);

        let decision_started = Instant::now();
        let decision = synchronize(
            &self.config.eviction,
            &self.state,
            &collection.observations,
            &[],
            self.now(),
            &self.sync_options,
        );
        self.metrics
            .eviction_decision_duration
            .observe(decision_started.elapsed().as_secs_f64());
        let previous_conditions =
            std::mem::replace(&mut self.state, decision.state.clone()).node_conditions;
        self.publish_decision(&decision, &previous_conditions);
        self.act(&decision);
        CycleReport {
            observations: collection.observations,
            collection_errors: collection.errors.len(),
            decision,
        }
    }

    fn publish_collection(&mut self, collection: &Collection) {
        let m = &self.metrics;
        for (signal, observation) in &collection.observations {
            let labels = Metrics::signal(signal.as_str());
            m.signal_available
                .get_or_create(&labels)
                .set(observation.available);
            m.signal_capacity
                .get_or_create(&labels)
                .set(observation.capacity);
        }
        let mut current = BTreeSet::new();
        for error in &collection.errors {
            let subject = error.subject.to_string();
            m.collection_errors
                .get_or_create(&Metrics::signal(&subject))
                .inc();
            let text = error.to_string();
            if !self.logged_errors.contains(&text) {
                tracing::warn!(error = %text, "signal collection failed; other signals are unaffected");
            }
            current.insert(text);
        }
        for recovered in self.logged_errors.difference(&current) {
            tracing::info!(error = %recovered, "signal collection recovered");
        }
        self.logged_errors = current;
        for reading in &collection.pressure {
            if reading.scope != crate::signals::PressureScope::Node {
                continue;
            }
            for (window, value) in [
                ("10s", reading.avg10),
                ("60s", reading.avg60),
                ("300s", reading.avg300),
            ] {
                m.pressure_stall
                    .get_or_create(&PressureLabels {
                        resource: reading.resource.to_string(),
                        kind: reading.kind.to_string(),
                        window: window.to_string(),
                    })
                    .set(value / 100.0);
            }
        }
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        m.last_collection_timestamp.set(unix);
    }

    fn publish_decision(&self, decision: &Decision, previous: &BTreeSet<NodeCondition>) {
        let met: BTreeSet<String> = decision
            .thresholds_met
            .iter()
            .map(|t| t.describe())
            .collect();
        for threshold in &self.config.eviction.thresholds {
            let labels = ThresholdLabels {
                signal: threshold.signal.to_string(),
                threshold: threshold.describe(),
                kind: if threshold.is_hard() { "hard" } else { "soft" }.to_string(),
            };
            let is_met = met.contains(&labels.threshold);
            self.metrics
                .threshold_met
                .get_or_create(&labels)
                .set(i64::from(is_met));
        }
        for condition in CONDITIONS {
            let on = decision.conditions.contains(&condition);
            self.metrics
                .node_condition
                .get_or_create(&ConditionLabels {
                    condition: condition.to_string(),
                })
                .set(i64::from(on));
        }
        for condition in decision.conditions.difference(previous) {
            tracing::warn!(%condition, "node condition on");
        }
        for condition in previous.difference(&decision.conditions) {
            tracing::info!(%condition, "node condition off");
        }
    }

    fn act(&self, decision: &Decision) {
        if let Some(starved) = decision.starved {
            tracing::warn!(
                signal = %starved.signal,
                "Attempting to reclaim {}",
                starved.resource
            );
        }
        for order in &decision.evictions {
            self.metrics
                .evictions
                .get_or_create(&Metrics::signal(order.reason.label()))
                .inc();
            if self.config.dry_run {
                tracing::warn!(
                    pod = %order.key(),
                    signal = order.reason.label(),
                    grace_period_seconds = order.grace_period_seconds,
                    message = %order.message,
                    "dry run: would evict pod"
                );
            }
        }
    }
}
