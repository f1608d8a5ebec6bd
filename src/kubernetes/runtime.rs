//! Connecting to the cluster and plugging the Kubernetes parts into the agent.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Pod as ApiPod;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::Store;

use super::api::ApiWriter;
use super::cgroups::PodCgroupNaming;
use super::evictor::{KubeEvictor, LocalKiller};
use super::journal::Journal;
use super::node::NodeStatusTracker;
use super::outbox::ApiAction;
use super::shutdown::{KubeTerminator, NodeShutdownPublisher, node_pods};
use super::source::{ApiPodSource, TaskGuard, start_pod_reflector};
use super::usage::PodUsageReader;
use super::worker::{OutboxHandle, RetryPolicy, run_outbox};
use crate::act::CgroupKiller;
use crate::config::AgentConfig;
use crate::metrics::Metrics;
use crate::ports::{
    CycleObserver, CycleReport, Integration, PendingWrites, ResumedEviction, ShutdownHooks,
};
use crate::signals::{Host, ProcessCounts};

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig { path: String, message: String },
    #[error("in-cluster Kubernetes configuration: {0}")]
    InCluster(String),
    #[error("Kubernetes client: {0}")]
    Client(String),
    #[error("cannot determine this node's name: set --node-name or NODE_NAME ({0})")]
    NodeName(String),
}

/// This node's name: the configured name (`--node-name`, `nodeName`), else `NODE_NAME`,
/// else the hostname, lowercased as the kubelet does.
pub fn node_name(config: &AgentConfig) -> Result<String, KubeError> {
    if let Some(name) = config.node_name.as_deref().filter(|n| !n.is_empty()) {
        return Ok(name.to_string());
    }
    if let Ok(name) = std::env::var("NODE_NAME")
        && !name.trim().is_empty()
    {
        return Ok(name.trim().to_string());
    }
    let path = config.paths.proc_root.join("sys/kernel/hostname");
    let hostname = std::fs::read_to_string(&path)
        .map_err(|e| KubeError::NodeName(format!("{}: {e}", path.display())))?;
    let hostname = hostname.trim().to_lowercase();
    if hostname.is_empty() {
        return Err(KubeError::NodeName(format!("{} is empty", path.display())));
    }
    Ok(hostname)
}

/// Connect when configured to: an explicit kubeconfig (`kubeconfig_flag`, then
/// `kubernetes.kubeconfig`, then `KUBECONFIG`), else the in-cluster service account
/// when running in a pod. `Ok(None)` means standalone mode.
pub async fn connect(
    config: &AgentConfig,
    host: &Host,
    kubeconfig_flag: Option<&Path>,
) -> Result<Option<KubeRuntime>, KubeError> {
    if config.kubernetes.enabled == Some(false) {
        return Ok(None);
    }
    let explicit = kubeconfig_flag
        .map(Path::to_path_buf)
        .or_else(|| config.kubernetes.kubeconfig.clone());
    let client_config = match client_config(explicit.as_deref()).await? {
        Some(client_config) => client_config,
        None if config.kubernetes.enabled == Some(true) => {
            return Err(KubeError::InCluster(
                "kubernetes.enabled is true but there is no kubeconfig and no service account"
                    .to_string(),
            ));
        }
        None => return Ok(None),
    };
    let client = build_client(client_config)?;
    let node = node_name(config)?;
    Ok(Some(KubeRuntime::start(
        client,
        node,
        config,
        host,
        RetryPolicy::default(),
    )))
}

/// The API connection to use: `kubeconfig` when given, else `KUBECONFIG`, else the
/// in-cluster service account when running in a pod; `Ok(None)` when there is none.
pub async fn client_config(kubeconfig: Option<&Path>) -> Result<Option<kube::Config>, KubeError> {
    let path: Option<PathBuf> = kubeconfig.map(Path::to_path_buf).or_else(|| {
        std::env::var_os("KUBECONFIG")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    match path {
        Some(path) => {
            let fail = |message: String| KubeError::Kubeconfig {
                path: path.display().to_string(),
                message,
            };
            let kubeconfig = Kubeconfig::read_from(&path).map_err(|e| fail(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map(Some)
                .map_err(|e| fail(e.to_string()))
        }
        None if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => kube::Config::incluster()
            .map(Some)
            .map_err(|e| KubeError::InCluster(e.to_string())),
        None => Ok(None),
    }
}

/// Every request's `User-Agent`, so the API server's audit log and its per-client
/// metrics and priority-and-fairness flow schemas can tell our traffic apart; without
/// it the kube client sends none at all. The agent and the toolkit send this one.
pub const USER_AGENT: &str = concat!("nodekeeper/", env!("CARGO_PKG_VERSION"));

/// The fence controller's `User-Agent`: one controller's traffic is told from a
/// thousand agents' (and its server-side field manager, up to the '/', is its own).
pub const CONTROLLER_USER_AGENT: &str =
    concat!("nodekeeper-controller/", env!("CARGO_PKG_VERSION"));

/// The agent's client for `config`: every request carries our [`USER_AGENT`]. Build every
/// client of the agent through this.
pub fn build_client(config: kube::Config) -> Result<kube::Client, KubeError> {
    build_client_as(config, USER_AGENT)
}

/// A client for `config` whose every request carries `user_agent`.
pub fn build_client_as(
    mut config: kube::Config,
    user_agent: &'static str,
) -> Result<kube::Client, KubeError> {
    config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(user_agent),
    ));
    kube::Client::try_from(config).map_err(|e| KubeError::Client(e.to_string()))
}

/// The running Kubernetes side: the pod watch, the outbox sender, and the parts the
/// agent loop needs. Must be created inside a tokio runtime.
pub struct KubeRuntime {
    node_name: String,
    /// The node's Lease, for self-isolation.
    node_lease: Option<Arc<dyn crate::report::contact::LeaseSource>>,
    store: Store<ApiPod>,
    outbox: OutboxHandle,
    usage: Option<PodUsageReader>,
    local_killer: Option<Box<dyn LocalKiller>>,
    tracker: Arc<Mutex<NodeStatusTracker>>,
    tasks: Arc<TaskGuard>,
    /// The pod deletes owed from before the agent restarted, queued again.
    resumed_evictions: Vec<ResumedEviction>,
}

impl KubeRuntime {
    /// Start the pod watch, the API probe and the write senders for `node_name`, on
    /// `host` as the agent detected it: its cgroup reader (none: no cgroup tree, so pods
    /// have no stats and nothing is killed locally) and its boot id (the writes an
    /// earlier run owed in this boot, kept in `kubernetes.stateFile`, are sent again).
    pub fn start(
        client: kube::Client,
        node_name: String,
        config: &AgentConfig,
        host: &Host,
        retry: RetryPolicy,
    ) -> Self {
        let settings = &config.kubernetes;
        let cgroups = host.cgroups().cloned();
        let outbox = OutboxHandle::new(settings.outbox_size);
        let (store, reflector_task) =
            start_pod_reflector(client.clone(), &node_name, outbox.reachability.clone());
        if config.dry_run {
            // Reads (the pod watch) go on; writes are only logged and counted.
            outbox.set_dry_run(true);
            tracing::info!(node = %node_name, "dry run: Kubernetes API writes are logged, not sent");
        }
        let journal = Journal::new(
            &settings.state_file,
            host.boot_id().ok().map(str::to_string),
        );
        let resumed_evictions = resume_owed_writes(&outbox, journal);
        let probe = super::probe::start_api_probe(
            client.clone(),
            outbox.reachability.clone(),
            settings.api_probe_interval.to_std(),
            settings.api_probe_timeout.to_std(),
        );
        let node_lease = config
            .report
            .as_ref()
            .is_some_and(|report| report.isolation.isolate_after.is_some())
            .then(|| {
                Arc::new(super::probe::NodeLease::new(client.clone(), &node_name))
                    as Arc<dyn crate::report::contact::LeaseSource>
            });
        let writer = ApiWriter::new(client, node_name.clone());
        let sender_task = tokio::spawn(run_outbox(outbox.clone(), writer, retry));
        let reader = cgroups;
        if reader.is_none() {
            tracing::warn!(
                cgroup_root = %config.paths.cgroup_root.display(),
                "no cgroup tree; pods will have no stats"
            );
        }
        let usage = reader.as_ref().map(|reader| {
            let naming = match settings.cgroup_driver {
                Some(driver) => PodCgroupNaming::new(driver, &settings.pods_cgroup_name),
                None => PodCgroupNaming::detect(reader, &settings.pods_cgroup_name),
            };
            tracing::info!(driver = %naming.driver(), pods_cgroup = %naming.pods_cgroup().display(), "pod cgroups");
            PodUsageReader::new(reader.clone(), naming, settings).counting_processes(
                ProcessCounts::for_ranking(config.eviction.ranks_by_process_count()),
            )
        });
        let local_killer = reader.filter(|_| settings.local_kill).map(|reader| {
            Box::new(CgroupKiller::new(
                &config.paths.cgroup_root,
                reader.layout(),
            )) as Box<dyn LocalKiller>
        });
        let heartbeat = config.kubernetes.condition_heartbeat.to_std();
        KubeRuntime {
            tracker: Arc::new(Mutex::new(NodeStatusTracker::new(
                node_name.clone(),
                heartbeat,
                settings.taints,
            ))),
            node_name,
            node_lease,
            store,
            outbox,
            usage,
            local_killer,
            tasks: Arc::new(TaskGuard(
                [reflector_task, sender_task]
                    .into_iter()
                    .chain(probe)
                    .collect(),
            )),
            resumed_evictions,
        }
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The kubelet's pods cgroup (`kubepods` or `kubepods.slice`, as the pod cgroup
    /// naming found it), when it exists in the memory hierarchy: where the kubelet
    /// measures `allocatableMemory.available`.
    pub fn pods_cgroup(&self) -> Option<PathBuf> {
        let usage = self.usage.as_ref()?;
        let pods = usage.naming().pods_cgroup();
        usage
            .cgroups()
            .paths()
            .memory_dir(&pods)
            .is_dir()
            .then_some(pods)
    }

    /// Replace how hard-evicted pods are killed locally (`None`: not at all).
    pub fn set_local_killer(&mut self, killer: Option<Box<dyn LocalKiller>>) {
        self.local_killer = killer;
    }

    /// The queue of API writes, to inspect what is still owed.
    pub fn outbox(&self) -> OutboxHandle {
        self.outbox.clone()
    }

    /// Wait until the first pod list has arrived.
    pub async fn wait_until_ready(&self) {
        let _ = self.store.wait_until_ready().await;
    }

    /// What the shutdown manager needs to drain this node through the API and show the
    /// shutdown on the Node. Call before [`KubeRuntime::integration`].
    pub fn shutdown_hooks(&self) -> ShutdownHooks<KubeTerminator> {
        ShutdownHooks {
            terminator: Arc::new(KubeTerminator::new(
                self.outbox.clone(),
                self.store.clone(),
                self.tasks.clone(),
            )),
            pods: node_pods(self.store.clone()),
            node_status: Box::new(NodeShutdownPublisher::new(
                self.tracker.clone(),
                self.outbox.clone(),
            )),
        }
    }

    /// What makes the agent take its pods from the API, evict through it, and publish
    /// node conditions and events after every cycle (see [`crate::ports::Integration`]).
    /// `metrics` count the API writes; `cgroup_root` is where the pods cgroup is killed
    /// from when the node isolates itself.
    pub fn integration(self, metrics: Arc<Metrics>, cgroup_root: &Path) -> Integration {
        self.outbox.set_metrics(metrics);
        let pods_cgroup = self.usage.as_ref().map(|usage| {
            let killer = CgroupKiller::new(cgroup_root, usage.cgroups().layout());
            crate::isolation::PodsCgroup::new(&killer, &usage.naming().pods_cgroup())
        });
        Integration {
            pod_source: Box::new(ApiPodSource::new(
                self.store,
                self.usage,
                self.tasks.clone(),
            )),
            evictor: Box::new(KubeEvictor::new(self.outbox.clone(), self.local_killer)),
            observers: vec![Box::new(NodeStatusObserver {
                tracker: self.tracker,
                outbox: self.outbox.clone(),
                _tasks: self.tasks.clone(),
            })],
            api_reachability: Some(self.outbox.reachability.clone()),
            node_lease: self.node_lease,
            pods_cgroup,
            pending_writes: Some(Arc::new(OutboxFlusher {
                outbox: self.outbox.clone(),
                _tasks: self.tasks,
            })),
            resumed_evictions: self.resumed_evictions,
        }
    }
}

/// Queue again the writes an earlier run of the agent owed in this boot (`journal`), and
/// keep the outbox's writes in `journal` from now on. Returns the pod deletes among them.
/// A journal that cannot be read is logged and replaced at the next change; the agent
/// goes on without what it owed.
fn resume_owed_writes(outbox: &OutboxHandle, journal: Journal) -> Vec<ResumedEviction> {
    let file = journal.path().display().to_string();
    if outbox.is_dry_run() {
        // A dry run neither sends them nor acts on them, and leaves the file as it is
        // for the agent that owes them.
        if journal.path().exists() {
            tracing::info!(%file, "dry run: API writes owed by an earlier run of the agent are left in their file, not sent");
        }
        return Vec::new();
    }
    let loaded = journal.load();
    outbox.set_journal(journal);
    let loaded = match loaded {
        Ok(loaded) => loaded,
        Err(error) => {
            tracing::error!(%error, "cannot read the API writes owed before the agent restarted; they are not sent");
            return Vec::new();
        }
    };
    if loaded.from_earlier_boot > 0 {
        tracing::info!(
            %file,
            dropped = loaded.from_earlier_boot,
            "API writes owed before the node rebooted are dropped: the reboot ended their pods"
        );
    }
    for reason in &loaded.skipped {
        tracing::error!(%file, %reason, "an API write owed before the agent restarted cannot be read; it is not sent");
    }
    if loaded.writes.is_empty() {
        return Vec::new();
    }
    const LISTED: usize = 20;
    let mut owed: Vec<String> = loaded
        .writes
        .iter()
        .take(LISTED)
        .map(|write| format!("{} {}", write.kind(), write.target()))
        .collect();
    if loaded.writes.len() > LISTED {
        owed.push(format!("and {} more", loaded.writes.len() - LISTED));
    }
    tracing::warn!(
        %file,
        count = loaded.writes.len(),
        writes = %owed.join(", "),
        "the agent restarted owing API writes; sending them"
    );
    let resumed = loaded
        .writes
        .iter()
        .filter_map(|write| match write {
            ApiAction::DeletePod {
                pod,
                grace_period_seconds,
            } => Some(ResumedEviction {
                uid: pod.uid.clone(),
                grace_period_seconds: *grace_period_seconds,
            }),
            _ => None,
        })
        .collect();
    outbox.push_all(loaded.writes);
    resumed
}

/// Flushes the outbox when the agent stops; holds the senders' tasks until then, since
/// they end with the last holder of the task guard.
struct OutboxFlusher {
    outbox: OutboxHandle,
    _tasks: Arc<TaskGuard>,
}

impl PendingWrites for OutboxFlusher {
    fn flush(
        &self,
        deadline: tokio::time::Instant,
    ) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        Box::pin(async move {
            let pending = self.outbox.len();
            if pending > 0 {
                tracing::info!(
                    pending,
                    "sending the API writes still queued before stopping"
                );
            }
            self.outbox.flush(deadline).await
        })
    }
}

struct NodeStatusObserver {
    tracker: Arc<Mutex<NodeStatusTracker>>,
    outbox: OutboxHandle,
    _tasks: Arc<TaskGuard>,
}

impl CycleObserver for NodeStatusObserver {
    fn observe(&mut self, report: &CycleReport) {
        let decision = &report.decision;
        let starved = decision.starved.map(|s| s.resource);
        let mut tracker = self.tracker.lock().unwrap_or_else(PoisonError::into_inner);
        let now = super::node::Moment::now();
        // Pushed under the lock, like the shutdown publisher's, so taint sets stay ordered.
        let contention = tracker.note_contention(&report.contention, now);
        for action in
            contention
                .into_iter()
                .chain(tracker.update(&decision.conditions, starved, now))
        {
            self.outbox.push(action);
        }
        drop(tracker);
        // Once a cycle: a journal whose last write failed is written again.
        self.outbox.mend_journal();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::outbox::tests::{condition, delete, event};

    fn owed(dir: &Path) -> Journal {
        let journal = Journal::new(dir.join("api-writes.json"), Some("boot".to_string()));
        journal.save(1, &[condition("u1"), delete("u1", 1), event("web.1", 1)]);
        journal
    }

    #[test]
    fn a_restarted_agent_queues_what_it_owed_and_resumes_the_deletes_among_it() {
        let dir = tempfile::tempdir().unwrap();
        let journal = owed(dir.path());
        let path = journal.path().to_path_buf();
        let outbox = OutboxHandle::new(10);
        let resumed = resume_owed_writes(&outbox, journal);
        assert_eq!(
            resumed,
            vec![ResumedEviction {
                uid: "u1".to_string(),
                grace_period_seconds: 1
            }]
        );
        assert_eq!(
            outbox.pending(),
            vec![condition("u1"), delete("u1", 1), event("web.1", 1)]
        );
        assert!(path.exists(), "still owed, still kept");
    }

    #[test]
    fn a_dry_run_neither_sends_nor_acts_on_what_an_earlier_run_owed() {
        let dir = tempfile::tempdir().unwrap();
        let journal = owed(dir.path());
        let path = journal.path().to_path_buf();
        let before = std::fs::read(&path).unwrap();
        let outbox = OutboxHandle::new(10);
        outbox.set_dry_run(true);
        assert!(resume_owed_writes(&outbox, journal).is_empty());
        assert!(outbox.is_empty());
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "left for the agent that owes them"
        );
    }
}
