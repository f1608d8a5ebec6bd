//! The raw YAML documents a configuration file may hold, before validation.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const KUBELET_API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
pub const KUBELET_KIND: &str = "KubeletConfiguration";
pub const AGENT_API_VERSION: &str = "nodekeeper.io/v1alpha1";
pub const AGENT_KIND: &str = "AgentConfiguration";

/// A `signal: value` map whose values may be written as YAML strings or bare numbers
/// (`pid.available: 1000`); numbers are kept in their decimal text form.
pub type ScalarMap = BTreeMap<String, ScalarText>;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ScalarText(pub String);

impl<'de> Deserialize<'de> for ScalarText {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ScalarText;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string (such as 900Mi or 1m30s) or a number")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<ScalarText, E> {
                if v.fract() == 0.0 && v.abs() < 9.0e15 {
                    Ok(ScalarText(format!("{}", v as i64)))
                } else {
                    Ok(ScalarText(v.to_string()))
                }
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl From<i64> for ScalarText {
    fn from(v: i64) -> Self {
        ScalarText(v.to_string())
    }
}

/// `featureGates`: gate name to on or off.
pub type FeatureGateMap = BTreeMap<String, bool>;

/// `shutdownGracePeriodByPodPriority` entries, spelled as in the kubelet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawShutdownPhase {
    pub priority: i32,
    pub shutdown_grace_period_seconds: i64,
}

/// The eviction and shutdown fields the agent takes from a `KubeletConfiguration`.
/// Every other kubelet field is ignored, so the node's own config file loads as is.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletDocument {
    pub eviction_hard: Option<ScalarMap>,
    pub eviction_soft: Option<ScalarMap>,
    pub eviction_soft_grace_period: Option<ScalarMap>,
    pub eviction_max_pod_grace_period: Option<i64>,
    pub eviction_minimum_reclaim: Option<ScalarMap>,
    pub eviction_pressure_transition_period: Option<String>,
    pub merge_default_eviction_settings: Option<bool>,
    pub shutdown_grace_period: Option<String>,
    pub shutdown_grace_period_critical_pods: Option<String>,
    pub shutdown_grace_period_by_pod_priority: Option<Vec<RawShutdownPhase>>,
    pub enforce_node_allocatable: Option<Vec<String>>,
    pub local_storage_capacity_isolation: Option<bool>,
    pub feature_gates: Option<FeatureGateMap>,
    pub container_runtime_endpoint: Option<String>,
    pub image_service_endpoint: Option<String>,
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: Option<String>,
}

/// nodekeeper's own document. Unknown fields are errors: a typo must not silently
/// leave a node unprotected.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentDocument {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_hard: Option<ScalarMap>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_soft: Option<ScalarMap>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_soft_grace_period: Option<ScalarMap>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_max_pod_grace_period: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_minimum_reclaim: Option<ScalarMap>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_pressure_transition_period: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merge_default_eviction_settings: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_period: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_period_critical_pods: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_period_by_pod_priority: Option<Vec<RawShutdownPhase>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enforce_node_allocatable: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_storage_capacity_isolation: Option<bool>,
    /// The kubelet's feature gates; only those that change eviction or shutdown are
    /// read, and a name the agent does not know is ignored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feature_gates: Option<FeatureGateMap>,
    /// The container runtime's CRI socket (node-level reclaim talks to it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_runtime_endpoint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_service_endpoint: Option<String>,
    /// How long an image must have been known before reclaim may remove it.
    #[serde(rename = "imageMinimumGCAge", skip_serializing_if = "Option::is_none")]
    pub image_minimum_gc_age: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub housekeeping_interval: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_root: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proc_root: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodefs_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub imagefs_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub containerfs_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pods_cgroup: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
    /// SCHED_FIFO priority (1–99) of the thread between a kernel notification and the
    /// eviction decision (the decision cycle thread); 0 or unset keeps it on the normal
    /// scheduler.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub realtime_priority: Option<i64>,
    /// How old a pod's memory figures may be in a cycle a notification starts; 0 or unset
    /// reads them afresh in every cycle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_stats_max_age: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_state_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logind_drop_in_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dbus_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_reclaim: Option<RawNodeReclaim>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workloads: Option<RawWorkloads>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<RawKubernetes>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<RawReport>,
    /// The PSI contention conditions of KEP-5394 (opt-in): each a fraction of wall time
    /// (0.1 is 10%) in which every task of its scope was stalled; 0 or unset is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_memory_contention_threshold: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_disk_contention_threshold: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubepods_memory_contention_threshold: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubepods_disk_contention_threshold: Option<f64>,
}

/// Where and how the agent reports to the fence controller (the `report:` section).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawReport {
    /// The controller's report endpoint, e.g.
    /// `http://nodekeeper-controller.nodekeeper-system.svc:9849`.
    #[serde(rename = "controllerURL", skip_serializing_if = "Option::is_none")]
    pub controller_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// The bearer token, read again for every report (projected tokens rotate).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// With an https controllerURL: the CA the controller's certificate is checked
    /// against (without it, the system's roots).
    #[serde(rename = "caFile", skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// Isolating the node when the controller asks (see docs/protocol.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolation: Option<RawIsolation>,
}

/// `report.isolation`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawIsolation {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet_unit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_file: Option<String>,
    /// Self-isolation (docs/fencing.md): cut off from the controller and the Lease this
    /// long, the agent isolates its node by itself. Unset or `0s`: never.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolate_after: Option<String>,
    /// The watchdog that backs self-isolation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watchdog_device: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watchdog_timeout: Option<String>,
}

/// How the agent talks to the cluster and finds pods' cgroups and files on the node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawKubernetes {
    /// `false` keeps the agent standalone even in a cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<String>,
    /// `systemd` or `cgroupfs`; detected from the cgroup tree when omitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_driver: Option<String>,
    /// The kubelet's pods cgroup in cgroupfs notation (`/kubepods`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pods_cgroup_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_logs_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet_root_path: Option<String>,
    /// A container's writable layer, with `{containerId}` standing for the runtime's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writable_layer_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_walk_max_entries: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub taints: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition_heartbeat: Option<String>,
    /// How often the agent asks the API server whether it answers (`0s`: never).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_probe_interval: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_probe_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outbox_size: Option<usize>,
    /// Kill a hard-evicted pod's cgroup at once instead of waiting for the kubelet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_kill: Option<bool>,
    /// Where the API writes still owed (pod deletes, pod conditions, events) are kept,
    /// so that an agent restarted after a crash sends them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_file: Option<String>,
}

/// Commands that free node-level disk resources before pods are evicted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawNodeReclaim {
    /// `cri` (the default without commands), `commands` (the default with them) or
    /// `none`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default)]
    pub commands: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// Standalone mode: the child cgroups of `parentCgroup` are the "pods".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawWorkloads {
    pub parent_cgroup: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default)]
    pub pods: Vec<RawWorkloadPod>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawWorkloadPod {
    /// A child cgroup name, or a prefix ending in `*`.
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub critical: Option<bool>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: ScalarMap,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: ScalarMap,
}

impl From<KubeletDocument> for AgentDocument {
    fn from(k: KubeletDocument) -> Self {
        AgentDocument {
            eviction_hard: k.eviction_hard,
            eviction_soft: k.eviction_soft,
            eviction_soft_grace_period: k.eviction_soft_grace_period,
            eviction_max_pod_grace_period: k.eviction_max_pod_grace_period,
            eviction_minimum_reclaim: k.eviction_minimum_reclaim,
            eviction_pressure_transition_period: k.eviction_pressure_transition_period,
            merge_default_eviction_settings: k.merge_default_eviction_settings,
            shutdown_grace_period: k.shutdown_grace_period,
            shutdown_grace_period_critical_pods: k.shutdown_grace_period_critical_pods,
            shutdown_grace_period_by_pod_priority: k.shutdown_grace_period_by_pod_priority,
            enforce_node_allocatable: k.enforce_node_allocatable,
            local_storage_capacity_isolation: k.local_storage_capacity_isolation,
            feature_gates: k.feature_gates,
            container_runtime_endpoint: k.container_runtime_endpoint,
            image_service_endpoint: k.image_service_endpoint,
            image_minimum_gc_age: k.image_minimum_gc_age,
            ..AgentDocument::default()
        }
    }
}

/// Which document (or flag) each field's value came from, keyed by camelCase field name,
/// so an error can name the document that must be fixed.
pub type Origins = BTreeMap<String, String>;

fn camel_case(snake: &str) -> String {
    let mut words = snake.split('_');
    let mut out = words.next().unwrap_or_default().to_string();
    for word in words {
        // The kubelet spells this initialism in capitals (`imageMinimumGCAge`).
        if word == "gc" {
            out.push_str("GC");
            continue;
        }
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            out.push(first.to_ascii_uppercase());
            out.extend(chars);
        }
    }
    out
}

impl AgentDocument {
    /// Field-by-field override: every field set in `over` replaces the one in `self`, and
    /// `origins` records `origin` for it. Maps are replaced whole, as a kubelet flag
    /// replaces its config-file field; feature gates alone merge gate by gate.
    pub fn overridden_by(
        mut self,
        mut over: AgentDocument,
        origin: &str,
        origins: &mut Origins,
    ) -> AgentDocument {
        // Feature gates merge gate by gate, as the kubelet's `--feature-gates` flag
        // merges with its file: a later document changes only the gates it names.
        if let Some(later) = over.feature_gates.as_mut() {
            for (gate, enabled) in self.feature_gates.take().unwrap_or_default() {
                later.entry(gate).or_insert(enabled);
            }
        }

        macro_rules! pick {
            ($($field:ident),*) => {
                AgentDocument { $($field: match over.$field {
                    Some(value) => {
                        origins.insert(camel_case(stringify!($field)), origin.to_string());
                        Some(value)
                    }
                    None => self.$field,
                }),* }
            };
        }
        pick!(
            api_version,
            kind,
            eviction_hard,
            eviction_soft,
            eviction_soft_grace_period,
            eviction_max_pod_grace_period,
            eviction_minimum_reclaim,
            eviction_pressure_transition_period,
            merge_default_eviction_settings,
            shutdown_grace_period,
            shutdown_grace_period_critical_pods,
            shutdown_grace_period_by_pod_priority,
            enforce_node_allocatable,
            local_storage_capacity_isolation,
            feature_gates,
            container_runtime_endpoint,
            image_service_endpoint,
            image_minimum_gc_age,
            housekeeping_interval,
            cgroup_root,
            proc_root,
            nodefs_path,
            imagefs_path,
            containerfs_path,
            pods_cgroup,
            metrics_address,
            dry_run,
            realtime_priority,
            pod_stats_max_age,
            node_name,
            shutdown_state_file,
            logind_drop_in_path,
            dbus_address,
            node_reclaim,
            workloads,
            kubernetes,
            report,
            system_memory_contention_threshold,
            system_disk_contention_threshold,
            kubepods_memory_contention_threshold,
            kubepods_disk_contention_threshold
        )
    }
}
