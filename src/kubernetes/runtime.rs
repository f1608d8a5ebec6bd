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
use super::node::NodeStatusTracker;
use super::shutdown::{KubeTerminator, NodeShutdownPublisher, node_pods};
use super::source::{ApiPodSource, TaskGuard, start_pod_reflector};
use super::usage::PodUsageReader;
use super::worker::{OutboxHandle, RetryPolicy, run_outbox};
use crate::act::CgroupKiller;
use crate::config::AgentConfig;
use crate::metrics::Metrics;
use crate::ports::{CycleObserver, CycleReport, Integration, PendingWrites, ShutdownHooks};
use crate::signals::{CgroupReader, Host};

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
        host.cgroups().cloned(),
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
}

impl KubeRuntime {
    /// Start the pod watch, the API probe and the write senders for `node_name`. `cgroups`
    /// is the host's cgroup reader as the agent detected it (`None`: no cgroup tree, so
    /// pods have no stats and nothing is killed locally).
    pub fn start(
        client: kube::Client,
        node_name: String,
        config: &AgentConfig,
        cgroups: Option<CgroupReader>,
        retry: RetryPolicy,
    ) -> Self {
        let settings = &config.kubernetes;
        let outbox = OutboxHandle::new(settings.outbox_size);
        let (store, reflector_task) =
            start_pod_reflector(client.clone(), &node_name, outbox.reachability.clone());
        if config.dry_run {
            // Reads (the pod watch) go on; writes are only logged and counted.
            outbox.set_dry_run(true);
            tracing::info!(node = %node_name, "dry run: Kubernetes API writes are logged, not sent");
        }
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
            PodUsageReader::new(reader.clone(), naming, settings)
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
        }
    }
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
        let now = std::time::SystemTime::now();
        // Pushed under the lock, like the shutdown publisher's, so taint sets stay ordered.
        let contention = tracker.note_contention(&report.contention, now);
        for action in
            contention
                .into_iter()
                .chain(tracker.update(&decision.conditions, starved, now))
        {
            self.outbox.push(action);
        }
    }
}
