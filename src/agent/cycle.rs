//! One agent cycle: collect, decide, act, publish.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;

use super::record::Recorder;
use super::standalone::workload_pods;
use crate::act::CgroupEvictor;
use crate::config::AgentConfig;
use crate::eviction::{
    Decision, EvictionOrder, EvictionReason, EvictionState, Millis, SyncOptions,
    pressure_remains_after_reclaim, synchronize,
};
use crate::metrics::{
    ConditionLabels, CycleLabels, MechanismLabels, Metrics, PressureLabels, ThresholdLabels,
};
use crate::notify::{NotifierSettings, Notifiers};
use crate::pods::Pod;
use crate::ports::{
    CycleObserver, CycleReport, CycleStart, Evictor, Integration, PendingWrites, PodSource,
};
use crate::signals::contention::{ContentionReport, ContentionTracker, stall_averages};
use crate::signals::{
    Collection, Host, NodeCondition, NotificationSupport, PodFigures, ProcessCounts, Resource,
    SignalCollector, probe_host, with_pod_figures, with_pod_figures_until_notified,
};

const CONDITIONS: [NodeCondition; 3] = [
    NodeCondition::MemoryPressure,
    NodeCondition::DiskPressure,
    NodeCondition::PidPressure,
];

/// The kubelet's `podCleanupTimeout`: how long to wait for an evicted pod's resources
/// to be released before choosing the next victim.
const POD_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
const POD_CLEANUP_POLL: Duration = Duration::from_millis(50);

/// The agent's state between cycles.
pub struct Agent {
    config: AgentConfig,
    host: Host,
    collector: SignalCollector,
    metrics: Arc<Metrics>,
    state: EvictionState,
    epoch: Instant,
    sync_options: SyncOptions,
    /// Errors already logged, so a persistently broken file is reported once, not
    /// every cycle; the error counter still counts every failure.
    logged_errors: BTreeSet<String>,
    reclaimer: Option<super::reclaim::Reclaimer>,
    /// The last node-level reclaim failed (logged once per streak).
    reclaim_failing: bool,
    /// A threshold met with no pod to evict was said in this streak of cycles.
    nothing_to_evict_said: bool,
    evictor: Option<Box<dyn Evictor + Send>>,
    recorder: Option<Recorder>,
    pod_source: Option<Box<dyn PodSource>>,
    observers: Vec<Box<dyn CycleObserver>>,
    pending_writes: Option<Arc<dyn PendingWrites>>,
    notifiers: Option<Notifiers>,
    /// Whether the API server answers, when the agent uses one (for its reports).
    api_reachability: Option<crate::report::ApiReachability>,
    /// The kubelet's pods cgroup, when the agent knows the node's pods (Kubernetes mode):
    /// what isolating the node kills.
    pods_cgroup: Option<Arc<crate::isolation::PodsCgroup>>,
    /// The node's Lease, when the agent uses the API (for self-isolation).
    node_lease: Option<Arc<dyn crate::report::contact::LeaseSource>>,
    /// Pods evicted and still listed, left out of the candidates once they have ended
    /// here (the kubelet's "known terminated").
    evicted: super::evicted::Evicted,
    summary: super::summary::Summary,
    /// The KEP-5394 contention conditions, when any threshold is set.
    contention: ContentionTracker,
    /// What systemd shows of the agent (`systemctl status`), when it runs as a service.
    service: Option<Arc<super::service::ServiceReporter>>,
    /// The pods this cycle evicted (in dry-run mode: would have), for the service status.
    evicted_this_cycle: Vec<String>,
    /// When a cycle last read every pod's figures afresh (with `podStatsMaxAge` only).
    pods_read_afresh_at: Option<Instant>,
    /// Whether the last cycle ranked on kept pod figures.
    reused_pod_figures: bool,
    /// `nodekeeper_cycles_total`, one counter per `started_by` label.
    cycles_started_by: Vec<(&'static str, Counter)>,
}

/// What a cycle keeps from deciding to its bookkeeping after the act.
struct Aftermath {
    collection: Collection,
    previous_conditions: BTreeSet<NodeCondition>,
    now: Millis,
    /// Observed into their histograms by `publish`: a histogram takes a lock that a
    /// scrape on the runtime thread may hold, which a real-time cycle thread must not
    /// wait for before it acts.
    collection_time: Duration,
    decision_time: Duration,
}

impl Agent {
    /// An agent for the host under the configured paths, detected here.
    pub fn new(config: AgentConfig, metrics: Arc<Metrics>) -> Self {
        let host = Host::detect(&config.paths);
        Self::on_host(config, host, metrics)
    }

    /// An agent for a host already detected (with `config.paths`): every part of the agent
    /// that reads the host uses this one detection.
    pub fn on_host(mut config: AgentConfig, host: Host, metrics: Arc<Metrics>) -> Self {
        debug_assert_eq!(
            host.paths(),
            &config.paths,
            "the host must be detected with the agent's own paths"
        );
        let collector =
            SignalCollector::for_host(&host).hugepage_aware(config.eviction.hugepage_aware);
        // The layout by the filesystems' devices, as the kubelet's first synchronize finds
        // it: the containerfs thresholds and the disk ranking follow it, not the paths.
        let fs_layout = host.fs_layout();
        match host.filesystems() {
            Ok(found) => tracing::info!("filesystems: {}", found.describe()),
            Err(error) => tracing::warn!(
                layout = fs_layout.describe(),
                "{error}; the filesystem layout is taken from the configured paths"
            ),
        }
        let by_paths = config.paths.fs_layout();
        if fs_layout != by_paths {
            tracing::info!(
                by_paths = by_paths.describe(),
                by_devices = fs_layout.describe(),
                "the configured filesystem paths are not on the devices they suggest; evicting by the devices, as the kubelet does"
            );
        }
        config.eviction.use_fs_layout(fs_layout);
        let reclaimer =
            super::reclaim::Reclaimer::from_config(&config.node_reclaim, fs_layout, config.dry_run);
        let sync_options = SyncOptions {
            fs_layout,
            node_reclaimer_configured: reclaimer.is_some(),
        };
        // Each series exists at 0 from the start; the handles are counted through
        // without a lookup on the cycle thread.
        let cycles_started_by = CycleStart::names()
            .map(|name| {
                let counter = metrics
                    .cycles
                    .get_or_create(&CycleLabels::started_by(name))
                    .clone();
                (name, counter)
            })
            .collect();
        let contention = ContentionTracker::new(&config.contention_thresholds);
        for (condition, fraction) in &config.contention_thresholds {
            tracing::info!(
                %condition,
                threshold = fraction,
                "publishing a PSI contention condition (KEP-5394)"
            );
        }
        metrics.start_signal_series(
            config
                .eviction
                .thresholds
                .iter()
                .map(|threshold| threshold.signal.as_str()),
        );
        Agent {
            config,
            host,
            collector,
            metrics,
            state: EvictionState::default(),
            epoch: Instant::now(),
            sync_options,
            logged_errors: BTreeSet::new(),
            reclaimer,
            reclaim_failing: false,
            nothing_to_evict_said: false,
            evictor: None,
            recorder: None,
            pod_source: None,
            observers: Vec::new(),
            pending_writes: None,
            api_reachability: None,
            pods_cgroup: None,
            node_lease: None,
            notifiers: None,
            evicted: super::evicted::Evicted::default(),
            summary: super::summary::Summary::new(super::summary::SUMMARY_PERIOD, Duration::ZERO),
            service: None,
            evicted_this_cycle: Vec::new(),
            pods_read_afresh_at: None,
            reused_pod_figures: false,
            contention,
            cycles_started_by,
        }
        .with_standalone_evictor()
    }

    /// Outside dry-run mode, standalone workloads are killed through their cgroups.
    fn with_standalone_evictor(mut self) -> Self {
        let (Some(workloads), Some(layout), false) = (
            &self.config.workloads,
            self.collector.layout(),
            self.config.dry_run,
        ) else {
            return self;
        };
        match CgroupEvictor::new(
            &self.config.paths.cgroup_root,
            layout,
            &workloads.parent_cgroup,
        ) {
            Ok(evictor) => self.evictor = Some(Box::new(evictor)),
            Err(error) => tracing::error!(%error, "cannot evict standalone workloads"),
        }
        self
    }

    /// Start the kernel notifiers this host supports; each wakes `wake` for an
    /// immediate cycle. Must run inside the tokio runtime the cycles are driven by: the
    /// notifiers' tasks run there, and the cycles' refreshes of memcg triggers spawn
    /// there too.
    pub fn start_notifiers(
        &mut self,
        support: &NotificationSupport,
        wake: std::sync::Arc<crate::notify::CycleWake>,
    ) {
        // Each notifier logs itself as it is armed.
        let notifiers = Notifiers::start(
            &self.config,
            self.host.cgroups().cloned(),
            support,
            NotifierSettings::default(),
            wake,
        );
        self.notifiers = Some(notifiers);
    }

    /// The evictor used outside dry-run mode. Without one, decisions are only logged.
    pub fn set_evictor(&mut self, evictor: Box<dyn Evictor + Send>) {
        self.evictor = Some(evictor);
    }

    /// Take pods from `source` instead of the standalone workload cgroups.
    /// Look at the container runtime's images in the background until `stop`, when
    /// reclaim goes through the runtime, so that their age counts from now.
    pub fn start_image_tracking(&self, stop: tokio::sync::watch::Receiver<bool>) {
        if let Some(runtime) = self.reclaimer.as_ref().and_then(|r| r.runtime()) {
            tokio::spawn(runtime.clone().track_images(stop));
        }
    }

    pub fn set_pod_source(&mut self, source: Box<dyn PodSource>) {
        self.pod_source = Some(source);
    }

    /// Show every cycle's report to `observer` once the decision is made.
    pub fn add_cycle_observer(&mut self, observer: Box<dyn CycleObserver>) {
        self.observers.push(observer);
    }

    /// Take pods, evictions, cycle observers and the report's inputs from an
    /// integration (the Kubernetes API) instead of the standalone workload cgroups.
    pub fn integrate(&mut self, integration: Integration) {
        let Integration {
            pod_source,
            evictor,
            observers,
            api_reachability,
            node_lease,
            pods_cgroup,
            pending_writes,
            resumed_evictions,
        } = integration;
        self.pending_writes = pending_writes;
        let now = Instant::now();
        for resumed in resumed_evictions {
            self.evicted
                .resume(&resumed.uid, resumed.grace_period_seconds, now);
        }
        self.set_pod_source(pod_source);
        self.set_evictor(evictor);
        for observer in observers {
            self.add_cycle_observer(observer);
        }
        if let Some(reachability) = api_reachability {
            self.set_api_reachability(reachability);
        }
        if let Some(lease) = node_lease {
            self.set_node_lease(lease);
        }
        if let Some(pods) = pods_cgroup {
            self.set_pods_cgroup(pods);
        }
    }

    /// What the integration still owes the cluster, to flush when the agent stops.
    pub fn pending_writes(&self) -> Option<Arc<dyn PendingWrites>> {
        self.pending_writes.clone()
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Where the API connection posts whether the API server answers.
    pub fn set_api_reachability(&mut self, reachability: crate::report::ApiReachability) {
        self.api_reachability = Some(reachability);
    }

    pub fn api_reachability(&self) -> Option<crate::report::ApiReachability> {
        self.api_reachability.clone()
    }

    /// Where the agent reads its node's Lease (Kubernetes mode).
    pub fn set_node_lease(&mut self, lease: Arc<dyn crate::report::contact::LeaseSource>) {
        self.node_lease = Some(lease);
    }

    pub fn node_lease(&self) -> Option<Arc<dyn crate::report::contact::LeaseSource>> {
        self.node_lease.clone()
    }

    pub fn set_pods_cgroup(&mut self, pods: crate::isolation::PodsCgroup) {
        self.pods_cgroup = Some(Arc::new(pods));
    }

    /// The kubelet's pods cgroup, in Kubernetes mode.
    pub fn pods_cgroup(&self) -> Option<Arc<crate::isolation::PodsCgroup>> {
        self.pods_cgroup.clone()
    }

    /// The cgroup reader the agent measures with, when the host has a cgroup tree.
    pub fn cgroup_reader(&self) -> Option<&crate::signals::CgroupReader> {
        self.host.cgroups()
    }

    /// The host as detected when the agent was made.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// Append every observation to a trace file (`agent --record`).
    pub fn set_recorder(&mut self, mut recorder: Recorder) {
        recorder.count_failures_in(self.metrics.state_write_failures("trace"));
        self.recorder = Some(recorder);
    }

    /// Tell `service` about every cycle (for the service manager's status line).
    pub fn set_service(&mut self, service: Arc<super::service::ServiceReporter>) {
        self.service = Some(service);
    }

    /// Log how the agent sees this host, once at startup, and export which kernel
    /// notification mechanisms it offers. The probe result is returned so the notifiers
    /// start from the same verdict without probing (and writing a PSI trigger) again.
    pub fn announce(&self) -> NotificationSupport {
        let support = probe_host(&self.host);
        tracing::info!(
            layout = %self.collector.describe_layout(),
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
        support
    }

    /// The effective configuration the agent runs with.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    fn now(&self) -> Millis {
        Millis(self.epoch.elapsed().as_millis() as u64)
    }

    /// One full cycle: observe, decide, act. Returns the report, and whether the caller
    /// should start the next cycle at once, as the kubelet does after its cleanup wait:
    /// after an eviction for memory or process IDs, unless the pods evicted had no cgroup
    /// here and neither has any other candidate (see `look_again_after`).
    pub async fn run_cycle(&mut self) -> (CycleReport, bool) {
        self.run_cycle_started_by(CycleStart::Timer).await
    }

    /// [`run_cycle`](Self::run_cycle), for a cycle `started_by` a wake-up or the timer
    /// (counted in `nodekeeper_cycles_total`, and in the report).
    pub async fn run_cycle_started_by(&mut self, started_by: CycleStart) -> (CycleReport, bool) {
        let (report, aftermath) = self.observe_and_decide(started_by);
        self.evicted_this_cycle.clear();
        let evicted = self.act(&report, aftermath).await;
        self.summarize(&report);
        if let Some(service) = &self.service {
            service.cycle(&report.decision, &self.evicted_this_cycle);
        }
        (report, evicted)
    }

    /// Once per summary period, one INFO line of what repeated without being news.
    fn summarize(&mut self, report: &CycleReport) {
        let counts = self.notifiers.as_ref().map(Notifiers::counts);
        let Some(activity) =
            self.summary
                .record(self.epoch.elapsed(), report.collection_errors, counts)
        else {
            return;
        };
        let conditions = if report.decision.conditions.is_empty() {
            "none".to_string()
        } else {
            let names: Vec<String> = report
                .decision
                .conditions
                .iter()
                .map(ToString::to_string)
                .collect();
            names.join(",")
        };
        tracing::info!(
            cycles = activity.cycles,
            evictions = activity.evictions,
            collection_errors = activity.collection_errors,
            memcg_registrations = activity.memcg_registrations,
            notifier_wakeups = activity.notifier_wakeups,
            %conditions,
            "activity in the last {}",
            crate::config::GoDuration::from(Duration::from_secs(activity.over.as_secs()))
        );
    }

    /// Collect the pods, then the node's signals, run the eviction core and show the
    /// decision to the observers. No side effects on the node; what is only bookkeeping
    /// (metrics, the notifiers' triggers, the trace) is left to
    /// [`publish`](Self::publish), so none of it stands between a crossing and the
    /// evictions.
    fn observe_and_decide(&mut self, started_by: CycleStart) -> (CycleReport, Aftermath) {
        let started = Instant::now();
        // The pods first and the node's signals last, just before the decision: a
        // crossing while the pods are read (most of a timer cycle with many pods) is then
        // decided by this cycle instead of by one more after it.
        let (mut pods, pod_reads_cut_short) = self.collect_pods(started_by);
        let signals_read_at = Instant::now();
        let collection = self.collector.collect();
        let collection_time = started.elapsed();
        let now = self.now();
        let decision_started = Instant::now();
        let decide = |pods: &[Pod]| {
            synchronize(
                &self.config.eviction,
                &self.state,
                &collection.observations,
                pods,
                now,
                &self.sync_options,
            )
        };
        let evicted = &self.evicted;
        let stopping = |pod: &Pod, order: &EvictionOrder| {
            evicted.already_stopping(pod, order.grace_period_seconds, Instant::now())
        };
        let decision = word_with_containers(
            decide(&pods),
            &mut pods,
            self.pod_source.as_deref_mut(),
            stopping,
            decide,
        );
        // With the containers' reads of an eviction for memory, which word its message.
        let decision_time = decision_started.elapsed();
        let previous_conditions =
            std::mem::replace(&mut self.state, decision.state.clone()).node_conditions;
        let contention = if self.contention.is_enabled() {
            self.contention.update(&stall_averages(
                &collection.pressure,
                self.config.paths.pods_cgroup.as_deref(),
            ))
        } else {
            ContentionReport::default()
        };
        let report = CycleReport {
            started_by,
            collection_started: started,
            signals_read_at,
            pod_reads_cut_short,
            observations: collection.observations.clone(),
            collection_errors: collection.errors.len(),
            pods,
            decision,
            contention,
        };
        for observer in &mut self.observers {
            observer.observe(&report);
        }
        let aftermath = Aftermath {
            collection,
            previous_conditions,
            now,
            collection_time,
            decision_time,
        };
        (report, aftermath)
    }

    /// The cycle's bookkeeping: metrics, the memcg triggers refreshed from this
    /// collection, the trace step.
    fn publish(&mut self, report: &CycleReport, aftermath: Aftermath) {
        let Aftermath {
            collection,
            previous_conditions,
            now,
            collection_time,
            decision_time,
        } = aftermath;
        self.metrics
            .collection_duration
            .observe(collection_time.as_secs_f64());
        self.metrics
            .eviction_decision_duration
            .observe(decision_time.as_secs_f64());
        self.publish_collection(&collection);
        self.publish_decision(&report.decision, &collection, &previous_conditions);
        self.publish_contention(&report.contention);
        let started_by = report.started_by.as_str();
        if let Some((_, cycles)) = self
            .cycles_started_by
            .iter()
            .find(|(name, _)| *name == started_by)
        {
            cycles.inc();
        }
        if let Some(notifiers) = self.notifiers.as_mut() {
            notifiers.update(&collection);
        }
        if let Some(recorder) = self.recorder.as_mut() {
            recorder.record_or_log(now.0, &report.observations, &report.pods);
        }
    }

    /// The pods that may be chosen: those listed, less those evicted or being deleted
    /// that have ended here. A pod being deleted that still runs stays a candidate, as
    /// in the kubelet, whose active pods keep it until it is known terminated. Also
    /// whether a notification cut the fresh reads short.
    ///
    /// With `podStatsMaxAge`, a cycle that reads every pod afresh stops doing so once a
    /// kernel notification waits (one its notifiers, which run on this thread, cannot
    /// read until the cycle ends): the pods not yet read are ranked on their kept figures,
    /// as a cycle a notification starts ranks them, and the cycle goes on to read the
    /// node's signals and decide. It still reads the figures older than two
    /// `housekeepingInterval`s (those the last timer cycle read are about one old):
    /// however often notifications cut the fresh reads short, no figure used grows older
    /// than that, nor than `podStatsMaxAge`. A cycle that used a kept figure so does not
    /// count as a fresh read of every pod.
    fn collect_pods(&mut self, started_by: CycleStart) -> (Vec<Pod>, bool) {
        let (listed, cut_short) = match self.config.pod_stats_max_age {
            None => (self.list_pods(), false),
            Some(max_age) => {
                let now = Instant::now();
                let figures = pod_figures(
                    started_by,
                    max_age.to_std(),
                    self.pods_read_afresh_at,
                    self.config.housekeeping_interval.to_std(),
                    now,
                );
                // Asked for only by a cycle that reads every pod afresh.
                let waiting = (figures == PodFigures::ReadAndKeep)
                    .then(|| self.notifiers.as_ref().and_then(Notifiers::waiting))
                    .flatten();
                let (listed, cut_short) = match (figures, waiting) {
                    (PodFigures::ReadAndKeep, Some(waiting)) => {
                        let interval = self.config.housekeeping_interval.to_std();
                        let kept_at_most = max_age.to_std().min(interval.saturating_mul(2));
                        with_pod_figures_until_notified(kept_at_most, now, waiting, || {
                            self.list_pods()
                        })
                    }
                    (figures, _) => (with_pod_figures(figures, now, || self.list_pods()), false),
                };
                if figures == PodFigures::ReadAndKeep && !cut_short {
                    self.pods_read_afresh_at = Some(now);
                }
                self.reused_pod_figures = figures != PodFigures::ReadAndKeep || cut_short;
                (listed, cut_short)
            }
        };
        let reader = self.collector.cgroups();
        let running = |pod: &Pod| {
            let (Some(reader), Some(cgroup)) = (reader, pod.cgroup.as_ref()) else {
                return false;
            };
            reader.process_count(cgroup).is_ok_and(|count| count > 0)
        };
        // The evicted set sees every listed pod first, those being deleted too, so that
        // it forgets each pod only once the API server no longer lists it.
        let mut active = self.evicted.active(listed, running);
        active.retain(|pod| !pod.terminating || running(pod));
        (active, cut_short)
    }

    /// Read the node's signals once, with nothing decided: on the cycle thread as it
    /// starts, so that the node's files, which lie between a crossing and its decision,
    /// take their kept-open slots (first come, first served) before the pods' files do,
    /// which a cycle reads first.
    pub(super) fn open_node_files_first(&self) {
        let _ = self.collector.collect();
    }

    /// Whether the last cycle could rank on pod figures kept from an earlier one: it read
    /// only the pods new to it or whose figures had aged out, so the other pods' files
    /// must stay open for the cycle that reads them next.
    pub fn reused_pod_figures(&self) -> bool {
        self.reused_pod_figures
    }

    fn list_pods(&mut self) -> Vec<Pod> {
        if let Some(source) = self.pod_source.as_mut() {
            return source.pods();
        }
        let (Some(workloads), Some(reader)) = (&self.config.workloads, self.collector.cgroups())
        else {
            return Vec::new();
        };
        let process_counts =
            ProcessCounts::for_ranking(self.config.eviction.ranks_by_process_count());
        match workload_pods(reader, workloads, process_counts) {
            Ok((pods, errors)) => {
                for error in errors {
                    tracing::debug!(%error, "workload figures unreadable");
                }
                pods
            }
            Err(error) => {
                tracing::warn!(%error, "cannot list workload cgroups");
                Vec::new()
            }
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
                    .set(stall_ratio(value));
            }
        }
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        m.last_collection_timestamp.set(unix);
    }

    /// The contention conditions as metrics (beside the pressure conditions), and the
    /// KEP's events in the log.
    fn publish_contention(&self, contention: &ContentionReport) {
        for (condition, on) in &contention.conditions {
            self.metrics
                .node_condition
                .get_or_create(&ConditionLabels {
                    condition: condition.to_string(),
                })
                .set(i64::from(*on));
        }
        for event in &contention.events {
            tracing::warn!(reason = event.reason(), "{}", event.message());
        }
        for (condition, on) in &contention.transitions {
            if *on {
                tracing::warn!(%condition, "node condition on");
            } else {
                tracing::info!(%condition, "node condition off");
            }
        }
    }

    fn publish_decision(
        &self,
        decision: &Decision,
        collection: &Collection,
        previous: &BTreeSet<NodeCondition>,
    ) {
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
            // The amount the signal is compared with, a percentage resolved against this
            // collection's capacity (as the kubelet resolves it), for graphs beside the
            // signal. Unknown while the signal could not be read.
            if let Some(observation) = collection.observations.get(&threshold.signal) {
                self.metrics
                    .threshold_amount
                    .get_or_create(&labels)
                    .set(threshold.value.resolve(observation.capacity).value());
            }
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

    /// Act on the decision: node-level reclaim when the core asks for it, then the
    /// evictions, then the wait for the evicted workloads to be gone. The cycle's
    /// bookkeeping is published as soon as nothing urgent is left, and before anything
    /// that waits (reclaim commands, the cleanup wait). Returns whether to start the
    /// next cycle at once.
    async fn act(&mut self, report: &CycleReport, aftermath: Aftermath) -> bool {
        let decision = &report.decision;
        if let Some(starved) = decision.starved {
            tracing::warn!(signal = %starved.signal, "Attempting to reclaim {}", starved.resource);
        }
        let evicted = match decision.reclaim_requested {
            Some(signal) => {
                // The reclaim commands are awaited: publish before them.
                self.publish(report, aftermath);
                if !self.reclaim_node_resources(signal).await {
                    // The pressure ended without an eviction: a streak of "no pod to
                    // evict" ends with it, and a new one is said again.
                    self.nothing_to_evict_said = false;
                    return false;
                }
                self.evict(report)
            }
            None => {
                let evicted = self.evict(report);
                self.publish(report, aftermath);
                evicted
            }
        };
        if evicted.is_empty() {
            return false;
        }
        let cgroups: Vec<std::path::PathBuf> = evicted
            .iter()
            .filter_map(|pod| pod.cgroup.clone())
            .collect();
        self.wait_for_cleanup(&cgroups).await;
        look_again_after(&evicted, &report.pods)
    }

    /// Issue this cycle's evictions (or, in dry-run mode, log them). Returns the pods
    /// evicted here, none in a dry run.
    fn evict(&mut self, report: &CycleReport) -> Vec<EvictedHere> {
        self.say_if_nothing_to_evict(report);
        let decision = &report.decision;
        let mut evicted = Vec::new();
        for order in &decision.evictions {
            let Some(pod) = report.pods.iter().find(|pod| order.is_for(pod)) else {
                continue;
            };
            if self
                .evicted
                .already_stopping(pod, order.grace_period_seconds, Instant::now())
            {
                // The kubelet waits for a kill before anything else (`killPodNow`); a
                // repeat would only add an event and a delete that change nothing.
                tracing::debug!(
                    pod = %order.key(),
                    "still stopping from its eviction; not evicted again yet"
                );
                continue;
            }
            self.metrics
                .evictions
                .get_or_create(&Metrics::signal(order.reason.label()))
                .inc();
            self.summary.count_eviction();
            if self.config.dry_run {
                self.evicted_this_cycle.push(order.key());
                tracing::warn!(
                    pod = %order.key(),
                    signal = order.reason.label(),
                    grace_period_seconds = order.grace_period_seconds,
                    message = %order.message,
                    "dry run: would evict pod"
                );
                continue;
            }
            let Some(evictor) = self.evictor.as_mut() else {
                tracing::warn!(pod = %order.key(), "no evictor configured; eviction only logged");
                continue;
            };
            // Before the local kill: a sandbox made after this is a new run of the pod
            // (see `cri::gc::PodsKnown`).
            let evicting_at = crate::cri::unix_nanos_now();
            match evictor.evict(order, pod) {
                Ok(()) => {
                    tracing::warn!(
                        pod = %order.key(),
                        signal = order.reason.label(),
                        grace_period_seconds = order.grace_period_seconds,
                        message = %order.message,
                        "evicted pod"
                    );
                    self.evicted.remember(
                        pod,
                        order.grace_period_seconds,
                        Instant::now(),
                        evicting_at,
                    );
                    self.evicted_this_cycle.push(order.key());
                    evicted.push(EvictedHere {
                        reason: order.reason,
                        cgroup: pod.cgroup.clone(),
                    });
                }
                Err(error) => tracing::error!(pod = %order.key(), %error, "eviction failed"),
            }
        }
        evicted
    }

    /// The kubelet's errors when a threshold must be acted on and no pod can be chosen:
    /// none is active, or every one is critical. Said once per streak (the cycles run
    /// every second and on every kernel notification, the kubelet's every ten seconds),
    /// and again once a pod has been chosen or the pressure has ended. An agent that
    /// knows no pod on a node under pressure is worth a look: the pod list may be stale.
    fn say_if_nothing_to_evict(&mut self, report: &CycleReport) {
        let decision = &report.decision;
        let Some(starved) = decision.starved.filter(|_| decision.evictions.is_empty()) else {
            self.nothing_to_evict_said = false;
            return;
        };
        if std::mem::replace(&mut self.nothing_to_evict_said, true) {
            return;
        }
        if report.pods.is_empty() {
            tracing::warn!(
                signal = %starved.signal,
                "eviction thresholds have been met, but no pods are active to evict (said once until a pod is chosen or the pressure ends)"
            );
        } else {
            tracing::warn!(
                signal = %starved.signal,
                active_pods = report.pods.len(),
                "unable to evict any pods from the node: every active pod is critical (said once until a pod is chosen or the pressure ends)"
            );
        }
    }

    /// Run node-level reclaim (the commands are awaited, not polled), then re-check. Returns whether pods
    /// must still be evicted.
    async fn reclaim_node_resources(&mut self, signal: crate::signals::Signal) -> bool {
        // A pod missing from a whole list of the node's pods is gone: its dead
        // containers may all go, and so may those of a pod evicted here, once stopped.
        // The cycle's candidates leave some out, so not them.
        let known = match self.pod_source.as_ref().and_then(|s| s.running_pod_uids()) {
            Some(uids) => crate::cri::gc::PodsKnown::active(uids)
                .with_evicted(self.evicted.lately(Instant::now())),
            None => crate::cri::gc::PodsKnown::Unknown,
        };
        let Some(reclaimer) = self.reclaimer.as_mut() else {
            return true;
        };
        // A runtime that stays unreachable is said once per failure streak, not at
        // every cycle of a long disk pressure.
        match reclaimer.reclaim(signal, known).await {
            Err(error) if !self.reclaim_failing => {
                self.reclaim_failing = true;
                tracing::warn!(%error, "node-level reclaim failed; pods are evicted as if it freed nothing (said once until it works again)");
            }
            Err(error) => tracing::debug!(%error, "node-level reclaim still failing"),
            Ok(()) if self.reclaim_failing => {
                self.reclaim_failing = false;
                tracing::info!("node-level reclaim works again");
            }
            Ok(()) => {}
        }
        let fresh = self.collector.collect();
        let remains = pressure_remains_after_reclaim(&self.config.eviction, &fresh.observations);
        if !remains {
            tracing::info!(%signal, "able to reduce resource pressure without evicting pods");
        }
        remains
    }

    /// Wait (bounded) until every evicted workload's cgroup holds no process, so the
    /// next cycle measures the node after the kill, not before it.
    async fn wait_for_cleanup(&self, cgroups: &[std::path::PathBuf]) {
        let Some(reader) = self.collector.cgroups() else {
            return;
        };
        let deadline = Instant::now() + POD_CLEANUP_TIMEOUT;
        while Instant::now() < deadline {
            let cleaned = cgroups.iter().all(|cgroup| {
                reader
                    .process_count(cgroup)
                    .map_or(true, |count| count == 0)
            });
            if cleaned {
                return;
            }
            tokio::time::sleep(POD_CLEANUP_POLL).await;
        }
        tracing::warn!("evicted workloads still have processes after {POD_CLEANUP_TIMEOUT:?}");
    }
}

/// A pod a cycle evicted: why, and its cgroup here, if it had one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct EvictedHere {
    reason: EvictionReason,
    cgroup: Option<std::path::PathBuf>,
}

/// Whether to decide again at once after evicting `evicted`, with `candidates` listed: as
/// the kubelet looks again right after its cleanup wait, once what the evicted pods held
/// is gone. That is known only for memory and process IDs, which only a pod's processes
/// hold: the cleanup wait saw an evicted pod's processes go, and a pod without a cgroup
/// here (ended, or not started) had none, provided other candidates' cgroups are found.
/// Then the pressure stands as measured, and the next pod the kubelet's ranking picks
/// must go now, not a housekeeping interval later, after the kernel's OOM killer.
/// Otherwise the timer paces the evictions, one a cycle: with no candidate's cgroup found
/// (the pods cgroup named wrongly, pods without cgroups of their own) an evicted pod may
/// hold memory this agent cannot see go, and deciding again at once would delete one pod
/// after another before any is gone; and disk, a threshold's or a local-storage limit's,
/// is held by a pod's logs and volumes until the kubelet cleans them up after the
/// delete, so deciding at once would evict the next pod for disk the last one still holds.
fn look_again_after(evicted: &[EvictedHere], candidates: &[Pod]) -> bool {
    let held_by_processes_only = evicted.iter().all(|pod| {
        matches!(
            pod.reason,
            EvictionReason::Threshold(signal)
                if matches!(signal.resource(), Resource::Memory | Resource::Pids)
        )
    });
    let pods_seen_here = evicted.iter().any(|pod| pod.cgroup.is_some())
        || candidates.iter().any(|pod| pod.cgroup.is_some());
    held_by_processes_only && pods_seen_here
}

/// The decision `first`, made on `pods`, worded with the containers' memory of the pods it
/// evicts for memory ([`measure_evicted_containers`]): `decide` made again on the pods
/// with those figures. The choice stays: the kubelet ranks by the pod's figures, and a
/// container's count only toward whether a pod has stats, which a pod with a cgroup (the
/// only kind whose containers are read) has. Should it ever differ, `first` stands, and
/// the pods lose the figures again, so that the observers and the trace see the pods it
/// was decided on.
fn word_with_containers(
    first: Decision,
    pods: &mut [Pod],
    source: Option<&mut (dyn PodSource + 'static)>,
    stopping: impl Fn(&Pod, &EvictionOrder) -> bool,
    decide: impl Fn(&[Pod]) -> Decision,
) -> Decision {
    let measured = measure_evicted_containers(source, &first, pods, stopping);
    if measured.is_empty() {
        return first;
    }
    let worded = decide(pods);
    if same_choice(&first, &worded) {
        return worded;
    }
    tracing::error!(
        "the eviction changed with its pod's container figures; it stands as first decided"
    );
    for (index, containers) in measured {
        pods[index].containers = containers;
    }
    first
}

/// Read the containers' memory of the pods `decision` evicts for a memory threshold, in
/// `pods` (those the decision saw), through `source` ([`PodSource::measure_containers`]):
/// the kubelet's message for such an eviction names each container over its request,
/// with its usage. Not for a pod still `stopping` from an earlier eviction, which this
/// cycle does not evict again. The pods given figures, by their index in `pods`, each
/// with its containers as they were before.
fn measure_evicted_containers(
    source: Option<&mut (dyn PodSource + 'static)>,
    decision: &Decision,
    pods: &mut [Pod],
    stopping: impl Fn(&Pod, &EvictionOrder) -> bool,
) -> Vec<(usize, Vec<crate::pods::ContainerStats>)> {
    let mut measured = Vec::new();
    let Some(source) = source else {
        return measured;
    };
    for order in &decision.evictions {
        let EvictionReason::Threshold(signal) = order.reason else {
            continue;
        };
        if signal.resource() != Resource::Memory {
            continue;
        }
        let evicted = pods
            .iter_mut()
            .enumerate()
            .find(|(_, pod)| order.is_for(pod));
        if let Some((index, pod)) = evicted
            && !stopping(pod, order)
        {
            let before = pod.containers.clone();
            if source.measure_containers(pod) {
                measured.push((index, before));
            }
        }
    }
    measured
}

/// Whether two decisions choose alike: the same evictions (but for their messages and
/// annotations), conditions and remembered state.
fn same_choice(first: &Decision, second: &Decision) -> bool {
    let unworded = |decision: &Decision| {
        let mut decision = decision.clone();
        for order in &mut decision.evictions {
            order.message.clear();
            order.annotations.clear();
        }
        decision
    };
    unworded(first) == unworded(second)
}

/// With `podStatsMaxAge` (`max_age`), how a cycle gets the pods' memory figures. A cycle
/// a notification (or a look again after an eviction) starts must decide at once, and
/// ranks on the figures kept within `max_age`, as the kubelet ranks on cAdvisor's; the
/// others read every pod afresh and keep the figures. So do woken cycles once none has
/// read afresh (last `read_afresh_at`) for a housekeeping `interval`: a timer tick that
/// finds a wake-up pending counts as woken, and looks again after evictions chain, and
/// the figures must still be refreshed at least that often, as cAdvisor's are.
fn pod_figures(
    started_by: CycleStart,
    max_age: Duration,
    read_afresh_at: Option<Instant>,
    interval: Duration,
    now: Instant,
) -> PodFigures {
    let refreshed_within_interval =
        read_afresh_at.is_some_and(|at| now.saturating_duration_since(at) < interval);
    match started_by {
        CycleStart::Woken(_) if refreshed_within_interval => PodFigures::ReuseWithin(max_age),
        _ => PodFigures::ReadAndKeep,
    }
}

/// A PSI average (the kernel prints a percentage with two decimals) as a ratio. Counted
/// in hundredths of a percent, so the exported value keeps its short decimal form
/// (0.0185, not the 0.018500000000000004 that `percent / 100.0` gives).
fn stall_ratio(percent: f64) -> f64 {
    (percent * 100.0).round() / 10_000.0
}

#[cfg(test)]
mod tests {
    use super::{CycleStart, Duration, Instant, PodFigures, pod_figures, stall_ratio};

    /// A pod source that records which pods' containers it was asked to measure, and
    /// gives each container a figure when `reads`.
    struct ContainerReads {
        asked: Vec<String>,
        reads: bool,
    }

    impl crate::ports::PodSource for ContainerReads {
        fn pods(&mut self) -> Vec<crate::pods::Pod> {
            Vec::new()
        }

        fn measure_containers(&mut self, pod: &mut crate::pods::Pod) -> bool {
            self.asked.push(pod.name.clone());
            if self.reads {
                for container in &mut pod.containers {
                    container.usage.memory = Some(1);
                }
            }
            self.reads
        }
    }

    fn order(
        name: &str,
        reason: crate::eviction::EvictionReason,
    ) -> crate::eviction::EvictionOrder {
        crate::eviction::EvictionOrder {
            namespace: "ns".to_string(),
            name: name.to_string(),
            uid: None,
            reason,
            grace_period_seconds: 0,
            message: String::new(),
            annotations: std::collections::BTreeMap::new(),
            disruption_target: true,
        }
    }

    /// Pods in namespace `ns` named `names`, each with one container without figures.
    fn pods_of_one_container(names: &[&str]) -> Vec<crate::pods::Pod> {
        names
            .iter()
            .map(|name| crate::pods::Pod {
                namespace: "ns".to_string(),
                name: name.to_string(),
                containers: vec![crate::pods::ContainerStats::default()],
                ..crate::pods::Pod::default()
            })
            .collect()
    }

    /// A pod's containers are read only for an eviction for memory (their figures word
    /// its message, "Container app was using …"), not for disk, process IDs or a local
    /// storage limit, not for a pod the decision did not see, and not for a pod still
    /// stopping from an earlier eviction (not evicted again); without a pod source
    /// (standalone) nothing is.
    #[test]
    fn containers_are_read_only_for_a_pod_evicted_for_memory() {
        use super::measure_evicted_containers;
        use crate::eviction::{Decision, EvictionReason};
        use crate::pods::Pod;
        use crate::signals::Signal;
        let names = [
            "memory",
            "allocatable",
            "nodefs",
            "pids",
            "scratch",
            "stopping",
        ];
        let decision = Decision {
            evictions: vec![
                order("memory", EvictionReason::Threshold(Signal::MemoryAvailable)),
                order(
                    "allocatable",
                    EvictionReason::Threshold(Signal::AllocatableMemoryAvailable),
                ),
                order("nodefs", EvictionReason::Threshold(Signal::NodeFsAvailable)),
                order("pids", EvictionReason::Threshold(Signal::PidAvailable)),
                order("scratch", EvictionReason::EmptyDirLimit),
                order(
                    "stopping",
                    EvictionReason::Threshold(Signal::MemoryAvailable),
                ),
                order("unseen", EvictionReason::Threshold(Signal::MemoryAvailable)),
            ],
            ..Decision::default()
        };
        let pods = || pods_of_one_container(&names);
        let stopping = |pod: &Pod, _: &crate::eviction::EvictionOrder| pod.name == "stopping";
        for reads in [true, false] {
            let mut source = ContainerReads {
                asked: Vec::new(),
                reads,
            };
            let mut measured = pods();
            let read =
                measure_evicted_containers(Some(&mut source), &decision, &mut measured, stopping);
            let read: Vec<usize> = read.into_iter().map(|(index, _)| index).collect();
            assert_eq!(read, if reads { vec![0, 1] } else { vec![] });
            assert_eq!(source.asked, ["memory", "allocatable"]);
            let figures: Vec<Option<i64>> = measured
                .iter()
                .map(|pod| pod.containers[0].usage.memory)
                .collect();
            let given = reads.then_some(1);
            assert_eq!(figures, [given, given, None, None, None, None]);
        }
        assert!(measure_evicted_containers(None, &decision, &mut pods(), stopping).is_empty());
    }

    /// The decision is made again with the evicted pod's container figures, which word
    /// its message; should the choice differ with them, the first decision stands and the
    /// pods lose the figures it did not see.
    #[test]
    fn the_first_choice_stands_if_the_container_figures_would_change_it() {
        use super::word_with_containers;
        use crate::eviction::{Decision, EvictionOrder, EvictionReason};
        use crate::pods::Pod;
        use crate::signals::Signal;
        let memory = EvictionReason::Threshold(Signal::MemoryAvailable);
        let pods = || pods_of_one_container(&["hog", "other"]);
        let measured = |pods: &[Pod]| pods[0].containers[0].usage.memory.is_some();
        let evicting = |name: &str, message: &str| Decision {
            evictions: vec![EvictionOrder {
                message: message.to_string(),
                ..order(name, memory)
            }],
            ..Decision::default()
        };
        let not_stopping = |_: &Pod, _: &EvictionOrder| false;
        // Worded: the same pod, a message naming its container.
        let decide = |pods: &[Pod]| {
            evicting(
                "hog",
                if measured(pods) {
                    "with containers"
                } else {
                    ""
                },
            )
        };
        let mut worded = pods();
        let mut source = ContainerReads {
            asked: Vec::new(),
            reads: true,
        };
        let decision = word_with_containers(
            decide(&worded),
            &mut worded,
            Some(&mut source),
            not_stopping,
            decide,
        );
        assert_eq!(decision, evicting("hog", "with containers"));
        assert!(measured(&worded));
        // A choice that would change: the first stands, the figures are gone again.
        let decide = |pods: &[Pod]| {
            if measured(pods) {
                evicting("other", "with containers")
            } else {
                evicting("hog", "")
            }
        };
        let mut changed = pods();
        let decision = word_with_containers(
            decide(&changed),
            &mut changed,
            Some(&mut source),
            not_stopping,
            decide,
        );
        assert_eq!(decision, evicting("hog", ""));
        assert_eq!(changed, pods());
    }

    /// Two decisions choose alike when only their messages and annotations differ.
    #[test]
    fn decisions_worded_differently_choose_alike() {
        use super::same_choice;
        use crate::eviction::{Decision, EvictionReason};
        use crate::signals::Signal;
        let memory = EvictionReason::Threshold(Signal::MemoryAvailable);
        let decision = |name: &str, message: &str| Decision {
            evictions: vec![crate::eviction::EvictionOrder {
                message: message.to_string(),
                ..order(name, memory)
            }],
            ..Decision::default()
        };
        let first = decision("hog", "The node was low on resource: memory. ");
        let mut worded = decision(
            "hog",
            "The node was low on resource: memory. Container app was using 2Gi, request is 0, has larger consumption of memory. ",
        );
        worded.evictions[0]
            .annotations
            .insert("offending_containers".to_string(), "app".to_string());
        assert!(same_choice(&first, &worded));
        assert!(!same_choice(&first, &decision("modest", "")));
        let mut other_grace = worded.clone();
        other_grace.evictions[0].grace_period_seconds = 30;
        assert!(!same_choice(&first, &other_grace));
    }

    /// After an eviction the agent decides again at once only when what the evicted pods
    /// held is known gone: memory or process IDs, held by processes alone, of a pod whose
    /// cgroup the cleanup wait watched, or of one without a cgroup while other candidates
    /// have theirs found. Disk (a threshold's, a local-storage limit's) is held by files
    /// the kubelet removes after the delete, and with no cgroup found anywhere an evicted
    /// pod's memory cannot be seen to go: the timer paces those.
    #[test]
    fn the_agent_looks_again_at_once_only_when_what_was_short_is_known_freed() {
        use super::{EvictedHere, look_again_after};
        use crate::eviction::EvictionReason;
        use crate::pods::Pod;
        use crate::signals::Signal;
        let evicted = |reason, cgroup: Option<&str>| EvictedHere {
            reason,
            cgroup: cgroup.map(std::path::PathBuf::from),
        };
        let candidate = |cgroup: Option<&str>| Pod {
            name: "next".to_string(),
            cgroup: cgroup.map(std::path::PathBuf::from),
            ..Pod::default()
        };
        let seen = [candidate(None), candidate(Some("/kubepods/podnext"))];
        let unseen = [candidate(None)];
        let memory = EvictionReason::Threshold(Signal::MemoryAvailable);
        for reason in [
            memory,
            EvictionReason::Threshold(Signal::AllocatableMemoryAvailable),
            EvictionReason::Threshold(Signal::PidAvailable),
        ] {
            let with_cgroup = [evicted(reason, Some("/kubepods/podgone"))];
            assert!(look_again_after(&with_cgroup, &unseen), "{reason:?}");
            assert!(look_again_after(&with_cgroup, &seen), "{reason:?}");
            assert!(
                look_again_after(&[evicted(reason, None)], &seen),
                "{reason:?}"
            );
            assert!(
                !look_again_after(&[evicted(reason, None)], &unseen),
                "{reason:?}"
            );
        }
        for reason in [
            EvictionReason::Threshold(Signal::NodeFsAvailable),
            EvictionReason::Threshold(Signal::NodeFsInodesFree),
            EvictionReason::Threshold(Signal::ImageFsAvailable),
            EvictionReason::Threshold(Signal::ContainerFsAvailable),
            EvictionReason::EmptyDirLimit,
            EvictionReason::PodEphemeralStorageLimit,
            EvictionReason::ContainerEphemeralStorageLimit,
        ] {
            for cgroup in [Some("/kubepods/podgone"), None] {
                let pods = [evicted(reason, cgroup)];
                assert!(!look_again_after(&pods, &seen), "{reason:?} {cgroup:?}");
            }
        }
        // Local-storage limits evict every pod over its own in one cycle: one among them
        // for disk holds the next look back.
        let both = [
            evicted(memory, Some("/kubepods/poda")),
            evicted(EvictionReason::EmptyDirLimit, Some("/kubepods/podb")),
        ];
        assert!(!look_again_after(&both, &seen));
    }

    /// With `podStatsMaxAge`, only a woken cycle reuses kept figures, and only while a
    /// cycle has read every pod afresh within the housekeeping interval: timer cycles,
    /// the first cycle, and woken cycles after an interval without a fresh read (a tick
    /// that found a wake-up pending, looks again chained after evictions) read afresh.
    #[test]
    fn woken_cycles_reuse_pod_figures_only_while_a_fresh_read_is_recent() {
        use crate::notify::{WakeReason, Wakeup};
        let max_age = Duration::from_secs(120);
        let interval = Duration::from_secs(10);
        let start = Instant::now();
        let woken = |reason| {
            CycleStart::Woken(Wakeup {
                reason,
                since: tokio::time::Instant::now(),
            })
        };
        let figures = |started_by, read_afresh_at, after_secs| {
            pod_figures(
                started_by,
                max_age,
                read_afresh_at,
                interval,
                start + Duration::from_secs(after_secs),
            )
        };
        let reuse = PodFigures::ReuseWithin(max_age);
        for reason in [
            WakeReason::Notification,
            WakeReason::TrailingNotification,
            WakeReason::AfterEviction,
        ] {
            assert_eq!(figures(woken(reason), Some(start), 0), reuse);
            assert_eq!(figures(woken(reason), Some(start), 9), reuse);
            assert_eq!(
                figures(woken(reason), Some(start), 10),
                PodFigures::ReadAndKeep
            );
            assert_eq!(figures(woken(reason), None, 0), PodFigures::ReadAndKeep);
        }
        assert_eq!(
            figures(CycleStart::Timer, Some(start), 1),
            PodFigures::ReadAndKeep
        );
    }

    #[test]
    fn stall_ratios_print_as_the_kernels_decimals() {
        for (percent, printed) in [
            (1.85, "0.0185"),
            (0.3, "0.003"),
            (30.0, "0.3"),
            (99.99, "0.9999"),
            (100.0, "1"),
            (0.0, "0"),
            (12.34, "0.1234"),
        ] {
            assert_eq!(stall_ratio(percent).to_string(), printed, "{percent}");
        }
        // Every value the kernel can print keeps its short form.
        for hundredths in 0..=10_000u32 {
            let percent: f64 = format!("{}.{:02}", hundredths / 100, hundredths % 100)
                .parse()
                .unwrap();
            let ratio = stall_ratio(percent).to_string();
            assert!(ratio.len() <= 6, "{percent}% gives {ratio}");
        }
    }
}
