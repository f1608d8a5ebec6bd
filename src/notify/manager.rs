//! Starts the notifiers the host supports for the configured memory thresholds and funnels
//! their wakeups, through the storm limiter, into the decision cycle's [`CycleWake`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::error::NotifyError;
use super::events::MemoryEventsWatch;
use super::limiter::{ForwardCounts, forward_limited};
use super::memcg::{MemcgThreshold, RefreshPolicy, Registered, memcg_trigger_bytes, page_size};
use super::psi::{PsiReadiness, PsiTrigger, PsiTriggerSpec};
use super::waiting::{AskedKey, WaitingNotifications};
use super::wake::CycleWake;
use crate::config::{AgentConfig, ThresholdValue};
use crate::signals::{CgroupReader, Collection, NotificationSupport, Signal};

/// Tunables of the notifiers; the defaults suit production.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotifierSettings {
    /// Evaluations woken by notifications are at least this far apart.
    pub min_spacing: Duration,
    pub psi_trigger: PsiTriggerSpec,
    pub psi_readiness: PsiReadiness,
    pub memcg_refresh: RefreshPolicy,
}

impl Default for NotifierSettings {
    fn default() -> Self {
        NotifierSettings {
            min_spacing: Duration::from_millis(100),
            psi_trigger: PsiTriggerSpec::default(),
            psi_readiness: PsiReadiness::PollPriority,
            memcg_refresh: RefreshPolicy::default(),
        }
    }
}

/// The kernel mechanisms, named as in the agent's `notification_mechanism` metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mechanism {
    MemcgThreshold,
    Psi,
    MemoryEvents,
}

impl Mechanism {
    pub fn as_str(&self) -> &'static str {
        match self {
            Mechanism::MemcgThreshold => "memcg_eventfd_v1",
            Mechanism::Psi => "psi",
            Mechanism::MemoryEvents => "memory_events_v2",
        }
    }
}

/// One armed notifier, for logs and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArmedNotifier {
    pub mechanism: Mechanism,
    /// The file the kernel signals through (`cgroup.event_control`'s directory for
    /// memcg thresholds).
    pub path: PathBuf,
    /// The registered trigger: bytes for memcg thresholds, the trigger text for PSI.
    pub trigger: String,
}

/// Counters since start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NotifierCounts {
    pub memcg_crossings: u64,
    /// memcg thresholds registered, first registrations and refreshes alike.
    pub memcg_registrations: u64,
    pub psi_events: u64,
    pub memory_events: u64,
    /// Notifications that reached the storm limiter (bursts are already merged).
    pub wakeups: u64,
    /// Evaluations the limiter let through to the agent loop.
    pub evaluations: u64,
}

#[derive(Debug, Default)]
struct SourceCounts {
    memcg: AtomicU64,
    psi: AtomicU64,
    memory_events: AtomicU64,
}

/// A memory threshold watched through a v1 memcg eventfd, re-registered as its trigger
/// point moves.
struct MemcgWatch {
    signal: Signal,
    value: ThresholdValue,
    dir: PathBuf,
    registered: Option<(Registered, JoinHandle<()>)>,
    /// The registered trigger's eventfd among the [`WaitingNotifications`].
    asked: Option<AskedKey>,
    last_error: Option<String>,
}

/// The running notifiers. Dropping this stops them all.
pub struct Notifiers {
    runtime: Handle,
    source: Arc<Notify>,
    sources: Arc<SourceCounts>,
    forwarded: Arc<ForwardCounts>,
    tasks: Vec<JoinHandle<()>>,
    armed: Vec<ArmedNotifier>,
    memcg: Vec<MemcgWatch>,
    reader: Option<CgroupReader>,
    refresh: RefreshPolicy,
    /// The kernel counts memcg thresholds in pages.
    page_size: u64,
    epoch: std::time::Instant,
    memcg_registrations: u64,
    /// The eventfds and inotify instances, asked while a cycle reads its pods.
    waiting: Option<Arc<WaitingNotifications>>,
    /// An eventfd or inotify instance could not be asked (logged once at warn).
    ask_failed: std::sync::atomic::AtomicBool,
}

impl Notifiers {
    /// Start every mechanism `support` offers for the memory thresholds of `config`.
    /// A mechanism that fails is logged and skipped; the poll remains the safety net.
    /// memcg thresholds are registered by the first [`Notifiers::update`], which needs
    /// the memory capacity observed by a collection. Must be called inside a tokio
    /// runtime, the one that is to run the notifiers' tasks (the agent's cycle thread's):
    /// `update` spawns the memcg watches on it too.
    pub fn start(
        config: &AgentConfig,
        cgroups: Option<CgroupReader>,
        support: &NotificationSupport,
        settings: NotifierSettings,
        wake: Arc<CycleWake>,
    ) -> Notifiers {
        let runtime = Handle::current();
        let source = Arc::new(Notify::new());
        let forwarded = Arc::new(ForwardCounts::default());
        let forwarder = runtime.spawn(forward_limited(
            source.clone(),
            wake,
            settings.min_spacing,
            forwarded.clone(),
        ));
        let mut notifiers = Notifiers {
            runtime,
            source,
            sources: Arc::new(SourceCounts::default()),
            forwarded,
            tasks: vec![forwarder],
            armed: Vec::new(),
            memcg: Vec::new(),
            reader: cgroups,
            refresh: settings.memcg_refresh,
            page_size: page_size(),
            epoch: std::time::Instant::now(),
            memcg_registrations: 0,
            waiting: match WaitingNotifications::new() {
                Ok(waiting) => Some(Arc::new(waiting)),
                Err(error) => {
                    tracing::warn!(%error, "cannot ask for waiting notifications; a cycle reading its pods afresh reads them all");
                    None
                }
            },
            ask_failed: std::sync::atomic::AtomicBool::new(false),
        };
        let memory_thresholds: Vec<_> = config
            .eviction
            .thresholds
            .iter()
            .filter(|t| t.signal.is_memory())
            .collect();
        if memory_thresholds.is_empty() {
            tracing::info!("no memory thresholds configured; kernel notifiers not started");
            return notifiers;
        }
        let pods = config.paths.pods_cgroup.as_deref();
        let watches_node = memory_thresholds
            .iter()
            .any(|t| t.signal == Signal::MemoryAvailable);
        let watches_pods = memory_thresholds
            .iter()
            .any(|t| t.signal == Signal::AllocatableMemoryAvailable);

        if support.memcg_eventfd_v1 {
            for threshold in &memory_thresholds {
                notifiers.watch_memcg(threshold.signal, threshold.value, pods);
            }
        }
        if support.psi {
            let mut files = Vec::new();
            if watches_node {
                files.push(config.paths.proc_root.join("pressure/memory"));
            }
            if let (true, Some(pods)) = (watches_pods, pods) {
                match notifiers.v2_dir(pods) {
                    Some(dir) => files.push(dir.join("memory.pressure")),
                    None => {
                        tracing::info!("no cgroup v2 hierarchy for the pods cgroup; node PSI only")
                    }
                }
            }
            for file in files {
                notifiers.start_psi(&file, settings.psi_trigger, settings.psi_readiness);
            }
        }
        if support.memory_events_v2 {
            match pods.and_then(|pods| notifiers.v2_dir(pods)) {
                Some(dir) => notifiers.start_memory_events(&dir.join("memory.events")),
                None => tracing::warn!(
                    "memory.events watching needs podsCgroup on a cgroup v2 host; not started"
                ),
            }
        }
        notifiers
    }

    /// Refresh memcg thresholds from a fresh collection: the capacity comes from the
    /// observation of each threshold's signal, the inactive file pages from the same
    /// collection's read of the watched cgroup. Re-registers as
    /// [`RefreshPolicy::should_register`] says: at once when usage reached a trigger under
    /// an unmet threshold, near the threshold, or when the trigger is late by more than
    /// the tolerance, otherwise when it moved and the refresh interval passed. A
    /// registration reads `memory.usage_in_bytes` once more. Cheap enough to call every
    /// cycle.
    pub fn update(&mut self, collection: &Collection) {
        let observations = &collection.observations;
        let now = self.epoch.elapsed();
        let _runtime = self.runtime.enter();
        for index in 0..self.memcg.len() {
            let watch = &self.memcg[index];
            let Some(observation) = observations.get(&watch.signal) else {
                continue;
            };
            // Read together with the observation, so present whenever it is.
            let Some(usage) = collection.memory_usage.get(&watch.signal) else {
                continue;
            };
            // A threshold that is never met, or always, needs no signal: a trigger
            // registered for it before would only wake cycles that change nothing.
            let Some(wanted) = memcg_trigger_bytes(
                observation.capacity,
                watch.value,
                usage.inactive_file_bytes,
                self.page_size,
            ) else {
                if let Some((_, task)) = self.memcg[index].registered.take() {
                    self.stop_asking(index);
                    task.abort();
                }
                continue;
            };
            let current = watch.registered.as_ref().map(|(registered, _)| *registered);
            if !self
                .refresh
                .should_register(current, wanted, usage.usage_bytes, now)
            {
                continue;
            }
            match MemcgThreshold::register(&watch.dir, wanted) {
                Ok(threshold) => {
                    // Asked before the old one is retired (below): the kernel signals either.
                    let asked = self.ask(|waiting| waiting.add_eventfd(threshold.eventfd()));
                    let task = self.runtime.spawn(wait_memcg(
                        threshold,
                        self.source.clone(),
                        self.sources.clone(),
                    ));
                    // The kernel does not signal a trigger that usage already reached when
                    // it was registered, so a crossing since this cycle's collection gets
                    // a wake-up right away. One the collection already showed was decided
                    // on by this cycle: waking again for it would only repeat that
                    // decision, every cycle for as long as the trigger keeps moving.
                    if usage.usage_bytes < wanted
                        && usage_now(&watch.dir).is_some_and(|fresh| fresh >= wanted)
                    {
                        self.source.notify_one();
                    }
                    self.stop_asking(index);
                    self.memcg[index].asked = asked;
                    let watch = &mut self.memcg[index];
                    self.memcg_registrations += 1;
                    // The trigger follows usage, so it is refreshed every few cycles: only
                    // the first registration, and one after a failure, are news.
                    if watch.registered.is_none() || watch.last_error.is_some() {
                        tracing::info!(
                            mechanism = Mechanism::MemcgThreshold.as_str(),
                            signal = %watch.signal,
                            cgroup = %watch.dir.display(),
                            trigger_bytes = wanted,
                            "memcg threshold registered; refreshed as usage moves (logged at debug)"
                        );
                    } else {
                        tracing::debug!(
                            mechanism = Mechanism::MemcgThreshold.as_str(),
                            signal = %watch.signal,
                            trigger_bytes = wanted,
                            "memcg threshold refreshed"
                        );
                    }
                    let registered = Registered {
                        trigger_bytes: wanted,
                        at: now,
                    };
                    // The new registration is live before the old one goes away, so no
                    // crossing falls into a gap.
                    if let Some((_, old)) = watch.registered.replace((registered, task)) {
                        old.abort();
                    }
                    watch.last_error = None;
                }
                Err(error) => report_failure(&mut self.memcg[index], error),
            }
        }
    }

    /// The notifiers armed now: PSI and memory.events from start, memcg thresholds once
    /// registered.
    pub fn armed(&self) -> Vec<ArmedNotifier> {
        let mut armed = self.armed.clone();
        for watch in &self.memcg {
            if let Some((registered, _)) = &watch.registered {
                armed.push(ArmedNotifier {
                    mechanism: Mechanism::MemcgThreshold,
                    path: watch.dir.clone(),
                    trigger: registered.trigger_bytes.to_string(),
                });
            }
        }
        armed
    }

    pub fn counts(&self) -> NotifierCounts {
        NotifierCounts {
            memcg_crossings: self.sources.memcg.load(Ordering::Relaxed),
            memcg_registrations: self.memcg_registrations,
            psi_events: self.sources.psi.load(Ordering::Relaxed),
            memory_events: self.sources.memory_events.load(Ordering::Relaxed),
            wakeups: self.forwarded.wakeups(),
            evaluations: self.forwarded.evaluations(),
        }
    }

    fn v2_dir(&self, cgroup: &Path) -> Option<PathBuf> {
        self.reader.as_ref()?.paths().v2_dir(cgroup)
    }

    fn watch_memcg(&mut self, signal: Signal, value: ThresholdValue, pods: Option<&Path>) {
        let cgroup = match signal {
            Signal::AllocatableMemoryAvailable => match pods {
                Some(pods) => pods.to_path_buf(),
                None => {
                    // The default threshold set has it; it is simply not observed here.
                    tracing::info!(
                        "allocatableMemory.available is not observed without podsCgroup; no memcg threshold for it"
                    );
                    return;
                }
            },
            _ => PathBuf::from("/"),
        };
        let Some(reader) = &self.reader else {
            return;
        };
        let dir = reader.paths().memory_dir(&cgroup);
        self.memcg.push(MemcgWatch {
            signal,
            value,
            dir,
            registered: None,
            asked: None,
            last_error: None,
        });
    }

    fn start_psi(&mut self, file: &Path, spec: PsiTriggerSpec, readiness: PsiReadiness) {
        let _runtime = self.runtime.enter();
        // Without CAP_SYS_RESOURCE (common in containers) the kernel accepts only windows
        // that are whole multiples of 2 s; keep the same stall ratio over a 2 s window.
        let unprivileged = PsiTriggerSpec {
            stall: spec.stall * 2 * 1000
                / u32::try_from(spec.window.as_millis())
                    .unwrap_or(1000)
                    .max(1),
            window: std::time::Duration::from_secs(2),
            ..spec
        };
        let armed = PsiTrigger::arm(file, spec, readiness)
            .map(|t| (t, spec))
            .or_else(|error| {
                if spec.window.as_millis().is_multiple_of(2000) {
                    return Err(error);
                }
                tracing::debug!(%error, "retrying the PSI trigger with a 2 s window");
                PsiTrigger::arm(file, unprivileged, readiness).map(|t| (t, unprivileged))
            });
        match armed {
            Ok((trigger, spec)) => {
                tracing::info!(
                    mechanism = Mechanism::Psi.as_str(),
                    file = %file.display(),
                    trigger = %spec,
                    "PSI trigger armed"
                );
                self.armed.push(ArmedNotifier {
                    mechanism: Mechanism::Psi,
                    path: file.to_path_buf(),
                    trigger: spec.to_string(),
                });
                let task = wait_psi(trigger, self.source.clone(), self.sources.clone());
                self.tasks.push(self.runtime.spawn(task));
            }
            Err(error) => tracing::warn!(
                mechanism = Mechanism::Psi.as_str(),
                %error,
                "PSI trigger not armed; relying on the poll"
            ),
        }
    }

    fn start_memory_events(&mut self, file: &Path) {
        let _runtime = self.runtime.enter();
        match MemoryEventsWatch::new(file) {
            Ok(watch) => {
                let (fd, seen) = (watch.fd(), watch.seen());
                self.ask(|waiting| waiting.add_memory_events(fd, file.to_path_buf(), seen));
                tracing::info!(
                    mechanism = Mechanism::MemoryEvents.as_str(),
                    file = %file.display(),
                    "watching memory.events"
                );
                self.armed.push(ArmedNotifier {
                    mechanism: Mechanism::MemoryEvents,
                    path: file.to_path_buf(),
                    trigger: "high,max,oom,oom_kill".to_string(),
                });
                let task = wait_memory_events(watch, self.source.clone(), self.sources.clone());
                self.tasks.push(self.runtime.spawn(task));
            }
            Err(error) => tracing::warn!(
                mechanism = Mechanism::MemoryEvents.as_str(),
                %error,
                "memory.events not watched; relying on the poll"
            ),
        }
    }
}

impl Notifiers {
    /// What tells whether a notification waits that the notifiers have not yet read (PSI
    /// triggers excepted: see [`WaitingNotifications`]); none while nothing can be asked.
    pub fn waiting(&self) -> Option<Arc<WaitingNotifications>> {
        self.waiting.clone().filter(|waiting| !waiting.is_empty())
    }

    /// Add a notifier's descriptor with `add` to those a cycle asks.
    fn ask(
        &self,
        add: impl FnOnce(&WaitingNotifications) -> std::io::Result<AskedKey>,
    ) -> Option<AskedKey> {
        let waiting = self.waiting.as_ref()?;
        match add(waiting) {
            Ok(key) => Some(key),
            Err(error) => {
                // The notifier itself still wakes the cycle; only a cycle under way that
                // reads every pod misses it. Once at warn: the kernel's limit of epoll
                // watches reached would turn this off for good.
                if self.ask_failed.swap(true, Ordering::Relaxed) {
                    tracing::debug!(%error, "a notifier not asked while a cycle reads its pods");
                } else {
                    tracing::warn!(%error, "a notifier not asked while a cycle reads its pods; such a cycle reads on afresh after its notifications");
                }
                None
            }
        }
    }

    /// The memcg watch `index`'s eventfd no longer counts as a waiting notification.
    fn stop_asking(&mut self, index: usize) {
        if let (Some(waiting), Some(key)) = (&self.waiting, self.memcg[index].asked.take()) {
            waiting.retire(key);
        }
    }
}

impl Drop for Notifiers {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        for watch in &self.memcg {
            if let Some((_, task)) = &watch.registered {
                task.abort();
            }
        }
    }
}

/// Log a failure once per distinct message, so a broken cgroup does not flood the log
/// every cycle.
fn report_failure(watch: &mut MemcgWatch, error: NotifyError) {
    let text = error.to_string();
    if watch.last_error.as_deref() != Some(text.as_str()) {
        tracing::warn!(
            mechanism = Mechanism::MemcgThreshold.as_str(),
            signal = %watch.signal,
            error = %text,
            "memcg threshold not registered; relying on the poll"
        );
        watch.last_error = Some(text);
    }
}

async fn wait_memcg(mut threshold: MemcgThreshold, source: Arc<Notify>, counts: Arc<SourceCounts>) {
    loop {
        match threshold.crossed().await {
            Ok(_) => {
                counts.memcg.fetch_add(1, Ordering::Relaxed);
                source.notify_one();
            }
            Err(error) => {
                tracing::warn!(mechanism = Mechanism::MemcgThreshold.as_str(), %error, "memcg threshold notifier stopped");
                source.notify_one();
                return;
            }
        }
    }
}

/// The v1 memory cgroup's usage now, from `memory.usage_in_bytes` alone: the one figure
/// the kernel compares a threshold with.
fn usage_now(memcg_dir: &Path) -> Option<u64> {
    crate::signals::read_u64(&memcg_dir.join("memory.usage_in_bytes")).ok()
}

async fn wait_psi(mut trigger: PsiTrigger, source: Arc<Notify>, counts: Arc<SourceCounts>) {
    loop {
        match trigger.fired().await {
            Ok(()) => {
                counts.psi.fetch_add(1, Ordering::Relaxed);
                source.notify_one();
            }
            Err(error) => {
                tracing::warn!(mechanism = Mechanism::Psi.as_str(), %error, "PSI trigger stopped");
                source.notify_one();
                return;
            }
        }
    }
}

async fn wait_memory_events(
    mut watch: MemoryEventsWatch,
    source: Arc<Notify>,
    counts: Arc<SourceCounts>,
) {
    loop {
        match watch.pressure().await {
            Ok(moved) => {
                tracing::debug!(?moved, file = %watch.path().display(), "memory.events moved");
                counts.memory_events.fetch_add(1, Ordering::Relaxed);
                source.notify_one();
            }
            Err(error) => {
                tracing::warn!(mechanism = Mechanism::MemoryEvents.as_str(), %error, "memory.events watch stopped");
                source.notify_one();
                return;
            }
        }
    }
}
