//! The effective configuration after all documents, defaults and flags are merged.
//! Everything downstream (signals, eviction, shutdown, the agent loop) reads only these
//! plain types, never the raw YAML documents.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::duration::GoDuration;
use crate::quantity::Quantity;
use crate::signal_names::Signal;

/// A threshold or minimum-reclaim amount: an absolute quantity or a fraction of capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdValue {
    Quantity(Quantity),
    /// A fraction in `0.0..=1.0`, held as f32 like the kubelet so percentages round alike.
    Percentage(f32),
}

impl ThresholdValue {
    /// The absolute amount against a capacity, like `GetThresholdQuantity`:
    /// `int64(float64(capacity) * float64(pct))` for percentages. A `NaN%` (which the
    /// kubelet's parser lets through) converts as Go converts it on amd64, to the
    /// smallest int64: a threshold never met, a minimum reclaim that relieves.
    pub fn resolve(&self, capacity: i64) -> Quantity {
        match self {
            ThresholdValue::Quantity(q) => *q,
            ThresholdValue::Percentage(p) if p.is_nan() => Quantity::from_value(i64::MIN),
            ThresholdValue::Percentage(p) => {
                Quantity::from_value((capacity as f64 * f64::from(*p)) as i64)
            }
        }
    }
}

impl std::fmt::Display for ThresholdValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ThresholdValue::Quantity(q) => write!(f, "{q}"),
            ThresholdValue::Percentage(p) => {
                let pct = f64::from(*p) * 100.0;
                // Print the shortest decimal that round-trips through f32 (10%, 7.5%).
                let rounded = (pct * 1e4).round() / 1e4;
                write!(f, "{rounded}%")
            }
        }
    }
}

/// One eviction threshold. A zero grace period makes it hard, exactly as in the kubelet.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: ThresholdValue,
    pub grace_period: GoDuration,
    pub min_reclaim: Option<ThresholdValue>,
}

impl Threshold {
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }

    /// `memory.available<1Gi`, the form used in flags, logs and replay output.
    pub fn describe(&self) -> String {
        format!("{}<{}", self.signal, self.value)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct EvictionConfig {
    /// Hard and soft thresholds together; `Threshold::is_hard` tells them apart.
    pub thresholds: Vec<Threshold>,
    pub max_pod_grace_period_seconds: i64,
    pub pressure_transition_period: GoDuration,
    pub local_storage_capacity_isolation: bool,
    /// `memory.available` leaves out the huge page pool (the kubelet's
    /// `HugepageAwareEviction` gate, on by default from 1.37).
    pub hugepage_aware: bool,
}

impl EvictionConfig {
    /// Whether any threshold, met, ranks pods by their process count: a `pid.available`
    /// one. Without one, the cycle need not count each pod's processes.
    pub fn ranks_by_process_count(&self) -> bool {
        self.thresholds
            .iter()
            .any(|threshold| threshold.signal.resource() == crate::signal_names::Resource::Pids)
    }

    /// Derive the `containerfs.*` thresholds for `layout` instead of the one they were
    /// loaded for: the agent learns the real layout only when it compares the
    /// filesystems' devices at start, as the kubelet's first synchronize does.
    pub fn use_fs_layout(&mut self, layout: super::FilesystemLayout) {
        super::thresholds::derive_containerfs_thresholds(&mut self.thresholds, layout);
    }
}

/// One entry of `shutdownGracePeriodByPodPriority`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownPhaseConfig {
    pub priority: i32,
    pub shutdown_grace_period_seconds: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShutdownConfig {
    pub grace_period: GoDuration,
    pub grace_period_critical_pods: GoDuration,
    pub by_pod_priority: Vec<ShutdownPhaseConfig>,
}

/// Where the agent reads the host from. Every path is injectable so tests can point the
/// agent at a fake cgroupfs/procfs tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPaths {
    pub cgroup_root: PathBuf,
    pub proc_root: PathBuf,
    pub nodefs: PathBuf,
    pub imagefs: Option<PathBuf>,
    pub containerfs: Option<PathBuf>,
    /// The pods cgroup, relative to the memory hierarchy root (e.g. `kubepods` or
    /// `kubepods.slice`); enables `allocatableMemory.available`.
    pub pods_cgroup: Option<PathBuf>,
}

impl HostPaths {
    /// Which filesystem holds images and writable layers, as far as the configured paths
    /// tell: no imagefs path (or the nodefs path again) means one disk; an imagefs path
    /// without a different containerfs path means the image filesystem also holds the
    /// writable layers. Tools that read no host (`replay`, `rank`, `check-config`) use
    /// this; the agent compares the paths' devices instead, as the kubelet does
    /// (`signals::Host::fs_layout`).
    pub fn fs_layout(&self) -> super::FilesystemLayout {
        super::FilesystemLayout::of(
            self.nodefs.as_path(),
            self.imagefs.as_deref(),
            self.containerfs.as_deref(),
        )
    }
}

impl Default for HostPaths {
    fn default() -> Self {
        HostPaths {
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            proc_root: PathBuf::from("/proc"),
            nodefs: PathBuf::from("/var/lib/kubelet"),
            imagefs: None,
            containerfs: None,
            pods_cgroup: None,
        }
    }
}

/// How node-level reclaim frees disk before pods are evicted for disk pressure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReclaimMethod {
    /// Through the container runtime's CRI socket, as the kubelet does: dead containers
    /// and sandboxes, then unused images.
    Cri,
    /// The configured commands (e.g. `crictl rmi --prune`), in order.
    Commands,
    /// None: pods are evicted without trying.
    None,
}

impl ReclaimMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            ReclaimMethod::Cri => "cri",
            ReclaimMethod::Commands => "commands",
            ReclaimMethod::None => "none",
        }
    }
}

/// The kubelet's default `containerRuntimeEndpoint` (containerd's socket).
pub const DEFAULT_CONTAINER_RUNTIME_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// The socket of a CRI endpoint as the kubelet writes it (`containerRuntimeEndpoint`):
/// `unix:///path`, or a bare absolute path, which the kubelet still takes as a Unix
/// socket. Other schemes are not served on Linux.
pub fn runtime_endpoint_socket(endpoint: &str) -> Result<std::path::PathBuf, String> {
    let path = match endpoint.split_once("://") {
        Some(("unix", path)) => path,
        Some((scheme, _)) => {
            return Err(format!(
                "scheme {scheme:?} is not supported; use unix:///path/to/socket"
            ));
        }
        None => endpoint,
    };
    if !path.starts_with('/') {
        return Err("the socket must be an absolute path".to_string());
    }
    Ok(std::path::PathBuf::from(path))
}

/// Node-level reclaim before evicting for disk pressure: through the CRI by default,
/// or commands an operator configures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReclaimConfig {
    pub method: ReclaimMethod,
    pub commands: Vec<String>,
    /// The whole reclaim's time limit (each command's, with commands).
    pub timeout: GoDuration,
    /// The kubelet's `containerRuntimeEndpoint` and `imageServiceEndpoint`.
    pub runtime_endpoint: String,
    pub image_endpoint: String,
    /// The kubelet's `imageMinimumGCAge`: an image known for less is kept.
    pub image_minimum_gc_age: GoDuration,
}

impl Default for NodeReclaimConfig {
    fn default() -> Self {
        NodeReclaimConfig {
            method: ReclaimMethod::Cri,
            commands: Vec::new(),
            timeout: GoDuration::from_secs(120),
            runtime_endpoint: DEFAULT_CONTAINER_RUNTIME_ENDPOINT.to_string(),
            image_endpoint: DEFAULT_CONTAINER_RUNTIME_ENDPOINT.to_string(),
            image_minimum_gc_age: GoDuration::from_secs(120),
        }
    }
}

/// How standalone mode turns workload cgroups into pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadsConfig {
    /// The parent of the workload cgroups, relative to the memory hierarchy root.
    pub parent_cgroup: PathBuf,
    /// The namespace reported for every workload.
    pub namespace: String,
    pub pods: Vec<WorkloadPodConfig>,
}

/// Priority, requests and limits for the workloads whose cgroup name matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadPodConfig {
    /// An exact child cgroup name, or a prefix ending in `*`.
    pub name: String,
    pub priority: i32,
    pub termination_grace_period_seconds: Option<i64>,
    pub critical: bool,
    pub requests: crate::pods::ResourceAmounts,
    pub limits: crate::pods::ResourceAmounts,
}

impl WorkloadPodConfig {
    pub fn matches(&self, cgroup_name: &str) -> bool {
        match self.name.strip_suffix('*') {
            Some(prefix) => cgroup_name.starts_with(prefix),
            None => cgroup_name == self.name,
        }
    }
}

pub const DEFAULT_SHUTDOWN_STATE_FILE: &str = "/var/lib/nodekeeper/graceful_shutdown_state.json";
pub const DEFAULT_LOGIND_DROP_IN_PATH: &str = "/etc/systemd/logind.conf.d/99-nodekeeper.conf";

/// The agent's complete effective configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    pub eviction: EvictionConfig,
    pub shutdown: ShutdownConfig,
    pub housekeeping_interval: GoDuration,
    pub paths: HostPaths,
    pub metrics_address: String,
    pub dry_run: bool,
    /// SCHED_FIFO priority of the decision cycle thread, on which the kernel notifiers
    /// wait (`None`: the normal scheduler, the default). A waking thread of the normal
    /// scheduler may wait for the next scheduler tick behind a busy process; a real-time
    /// one runs at once.
    pub realtime_priority: Option<u8>,
    /// How old a pod's memory figures may be in a cycle a kernel notification (or a look
    /// again after an eviction) starts: `None`, the default, reads every pod's cgroup
    /// afresh in every cycle. The timer's cycles read afresh, and keep what they read for
    /// the others; so does any cycle when none has for a housekeeping interval. The
    /// kubelet ranks on cAdvisor's figures, refreshed every housekeeping interval;
    /// reading 110 pods' files costs more than the decision.
    pub pod_stats_max_age: Option<GoDuration>,
    pub node_name: Option<String>,
    /// Where graceful-shutdown progress is persisted (the shutdown report).
    pub shutdown_state_file: PathBuf,
    /// The logind drop-in written when InhibitDelayMaxSec is below the shutdown budget.
    pub logind_drop_in_path: PathBuf,
    /// A D-Bus address to use instead of the system bus (tests, containers).
    pub dbus_address: Option<String>,
    pub node_reclaim: NodeReclaimConfig,
    /// Standalone mode's workload cgroups; `None` means no pods are known locally.
    pub workloads: Option<WorkloadsConfig>,
    pub kubernetes: KubernetesConfig,
    /// Reports to the fence controller; `None`: the agent does not report.
    pub report: Option<ReportConfig>,
    /// The KEP-5394 contention conditions that are on, each with its threshold as a
    /// fraction of wall time; empty (the default) publishes none.
    pub contention_thresholds: BTreeMap<crate::signal_names::Contention, f64>,
}

/// Where and how often the agent reports to the fence controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportConfig {
    /// `http://host:port` or `https://host:port` of the controller's report endpoint.
    pub controller_url: String,
    pub interval: GoDuration,
    /// One report's deadline.
    pub timeout: GoDuration,
    pub token_file: Option<PathBuf>,
    /// The CA that signs the controller's certificate (https only; `None`: the system's
    /// roots).
    pub ca_file: Option<PathBuf>,
    /// How the agent isolates its node when the controller asks.
    pub isolation: IsolationConfig,
}

/// Isolating the node on the controller's instruction (`report.isolation`): the kubelet's
/// unit stopped and masked for this boot, every pod process killed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsolationConfig {
    /// Follow the controller's instruction at all.
    pub enabled: bool,
    /// The kubelet's systemd unit.
    pub kubelet_unit: String,
    /// How long the kubelet may take to stop, and then the pod processes to exit.
    pub stop_timeout: GoDuration,
    /// Where the isolation is recorded, so a restarted agent keeps it (on a tmpfs, so it
    /// ends with the boot, like the unit's runtime mask). The last contact with the
    /// controller is kept beside it (`contact.json`).
    pub state_file: PathBuf,
    /// Self-isolation: with neither the controller nor the Lease heard this long, the
    /// agent isolates its node by itself (see `crate::isolation::self_isolation`).
    /// `None`: never (the default).
    pub isolate_after: Option<GoDuration>,
    /// The watchdog device self-isolation holds open (`/dev/watchdog`).
    pub watchdog_device: PathBuf,
    /// The timeout set on it: a hung agent gets its node reset this long after its last
    /// pet.
    pub watchdog_timeout: GoDuration,
}

/// How often a self-isolating agent reads its node's Lease: as often as it probes the
/// API server (`kubernetes.apiProbeInterval`, the kubelet's renewal interval by default),
/// never more often than it reports, and every 10 s without a probe. The configuration's
/// bound on `isolateAfter` and the agent's reader both use it.
pub fn lease_read_interval(
    api_probe_interval: GoDuration,
    report_interval: GoDuration,
) -> GoDuration {
    if api_probe_interval.is_zero() {
        GoDuration::from_secs(10)
    } else {
        GoDuration::from_nanos(api_probe_interval.nanos().max(report_interval.nanos()))
    }
}

impl IsolationConfig {
    /// Where the last contact with the controller is kept.
    pub fn contact_file(&self) -> PathBuf {
        self.state_file.with_file_name("contact.json")
    }
}

pub const DEFAULT_ISOLATION_STATE_FILE: &str = "/run/nodekeeper/isolation.json";

impl Default for IsolationConfig {
    fn default() -> Self {
        IsolationConfig {
            enabled: true,
            kubelet_unit: "kubelet.service".to_string(),
            stop_timeout: GoDuration::from_secs(20),
            state_file: PathBuf::from(DEFAULT_ISOLATION_STATE_FILE),
            isolate_after: None,
            watchdog_device: PathBuf::from("/dev/watchdog"),
            watchdog_timeout: GoDuration::from_secs(30),
        }
    }
}

/// The projected ServiceAccount token a DaemonSet mounts for the controller's audience.
pub const DEFAULT_REPORT_TOKEN_FILE: &str = "/var/run/secrets/nodekeeper/token";

/// The kubelet's cgroup driver, which decides how pod cgroups are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupDriver {
    Systemd,
    Cgroupfs,
}

impl std::fmt::Display for CgroupDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CgroupDriver::Systemd => "systemd",
            CgroupDriver::Cgroupfs => "cgroupfs",
        })
    }
}

/// Cluster connection and the node-side paths of Kubernetes pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesConfig {
    /// `Some(false)`: never connect. `None`: connect when a kubeconfig or in-cluster
    /// service account is found.
    pub enabled: Option<bool>,
    pub kubeconfig: Option<PathBuf>,
    /// `None`: detect from the cgroup tree.
    pub cgroup_driver: Option<CgroupDriver>,
    /// The kubelet's pods cgroup in cgroupfs notation, e.g. `/kubepods`.
    pub pods_cgroup_name: String,
    /// `/var/log/pods`, holding `<namespace>_<name>_<uid>/<container>/*.log`.
    pub pod_logs_path: PathBuf,
    /// `/var/lib/kubelet`, holding the pods' local volumes:
    /// `pods/<uid>/volumes/kubernetes.io~empty-dir/<volume>` (and `kubernetes.io~configmap`,
    /// `kubernetes.io~git-repo`).
    pub kubelet_root_path: PathBuf,
    /// A container's writable layer; `{containerId}` is replaced by the runtime's id.
    /// `None`: writable layers are not measured.
    pub writable_layer_path: Option<String>,
    /// The most directory entries one pod's disk walk may visit per cycle.
    pub disk_walk_max_entries: u64,
    /// Publish `nodekeeper.io/*-pressure:NoSchedule` taints while under pressure.
    pub taints: bool,
    pub condition_heartbeat: GoDuration,
    /// How often the agent asks the API server for `/version` to learn whether it
    /// answers, beyond what its watch and writes show; zero: never.
    pub api_probe_interval: GoDuration,
    /// How long such a probe waits for an answer before the API server counts as
    /// unreachable.
    pub api_probe_timeout: GoDuration,
    /// Queued API actions kept while the API server is unreachable; events and
    /// heartbeats beyond this are dropped oldest first, deletions never.
    pub outbox_size: usize,
    pub local_kill: bool,
    /// Where the API writes still owed are kept for a restarted agent (on a tmpfs: they
    /// end with the boot, as the pods they are about do).
    pub state_file: PathBuf,
}

pub const DEFAULT_API_WRITES_FILE: &str = "/run/nodekeeper/api-writes.json";

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            enabled: None,
            kubeconfig: None,
            cgroup_driver: None,
            pods_cgroup_name: "/kubepods".to_string(),
            pod_logs_path: PathBuf::from("/var/log/pods"),
            kubelet_root_path: PathBuf::from("/var/lib/kubelet"),
            writable_layer_path: None,
            disk_walk_max_entries: 100_000,
            taints: false,
            condition_heartbeat: GoDuration::from_secs(300),
            api_probe_interval: GoDuration::from_secs(10),
            api_probe_timeout: GoDuration::from_secs(5),
            outbox_size: 1000,
            local_kill: true,
            state_file: PathBuf::from(DEFAULT_API_WRITES_FILE),
        }
    }
}

impl Default for EvictionConfig {
    /// The kubelet's Linux defaults: `memory.available<100Mi, nodefs.available<10%,
    /// nodefs.inodesFree<5%, imagefs.available<15%, imagefs.inodesFree<5%`, all hard,
    /// with the copies the kubelet derives on one filesystem under its default
    /// `enforceNodeAllocatable: [pods]`: `allocatableMemory.available<100Mi` and
    /// `containerfs.*` mirroring `nodefs.*`. The same as loading an empty file.
    fn default() -> Self {
        let hard = |signal, value| Threshold {
            signal,
            value,
            grace_period: GoDuration::ZERO,
            min_reclaim: None,
        };
        // In the loader's order: the hard map by signal name, then the derived copies.
        let mut thresholds = vec![
            hard(Signal::ImageFsAvailable, ThresholdValue::Percentage(0.15)),
            hard(Signal::ImageFsInodesFree, ThresholdValue::Percentage(0.05)),
            hard(
                Signal::MemoryAvailable,
                ThresholdValue::Quantity(Quantity::from_value(100 << 20)),
            ),
            hard(Signal::NodeFsAvailable, ThresholdValue::Percentage(0.10)),
            hard(Signal::NodeFsInodesFree, ThresholdValue::Percentage(0.05)),
        ];
        super::thresholds::add_allocatable_thresholds(&mut thresholds);
        super::thresholds::mirror_containerfs_thresholds(
            &mut thresholds,
            super::FilesystemLayout::SingleDisk,
            &mut Vec::new(),
        );
        EvictionConfig {
            thresholds,
            max_pod_grace_period_seconds: 0,
            pressure_transition_period: GoDuration::from_secs(300),
            local_storage_capacity_isolation: true,
            hugepage_aware: true,
        }
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            eviction: EvictionConfig::default(),
            shutdown: ShutdownConfig::default(),
            housekeeping_interval: GoDuration::from_secs(10),
            paths: HostPaths::default(),
            metrics_address: "127.0.0.1:9847".to_string(),
            dry_run: false,
            realtime_priority: None,
            pod_stats_max_age: None,
            node_name: None,
            shutdown_state_file: PathBuf::from(DEFAULT_SHUTDOWN_STATE_FILE),
            logind_drop_in_path: PathBuf::from(DEFAULT_LOGIND_DROP_IN_PATH),
            dbus_address: None,
            node_reclaim: NodeReclaimConfig::default(),
            workloads: None,
            kubernetes: KubernetesConfig::default(),
            report: None,
            contention_thresholds: BTreeMap::new(),
        }
    }
}
