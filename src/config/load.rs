//! Loading a configuration file: split the YAML documents, merge them (our document
//! overrides the kubelet's), apply command-line overrides and defaults, then validate
//! into the effective [`AgentConfig`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::documents::{
    AGENT_API_VERSION, AGENT_KIND, AgentDocument, FeatureGateMap, KUBELET_API_VERSION,
    KUBELET_KIND, KubeletDocument, Origins, RawIsolation, RawKubernetes, RawNodeReclaim, RawReport,
    RawWorkloads, ScalarMap, ScalarText,
};
use super::duration::GoDuration;
use super::lenient_yaml::{self, LenientDocument};
use super::model::{
    AgentConfig, CgroupDriver, DEFAULT_LOGIND_DROP_IN_PATH, DEFAULT_SHUTDOWN_STATE_FILE,
    EvictionConfig, HostPaths, IsolationConfig, KubernetesConfig, NodeReclaimConfig, ReclaimMethod,
    ReportConfig, ShutdownConfig, ShutdownPhaseConfig, WorkloadPodConfig, WorkloadsConfig,
};
use super::thresholds::{
    FieldError, FieldWarning, FilesystemLayout, ThresholdMaps, add_allocatable_thresholds,
    mirror_containerfs_thresholds, parse_thresholds,
};
use crate::pods::ResourceAmounts;
use crate::quantity::Quantity;
use crate::signal_names::Contention;

/// Command-line settings that override the file, in the kubelet's flag syntax.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `memory.available<1Gi,nodefs.available<10%`
    pub eviction_hard: Option<String>,
    pub eviction_soft: Option<String>,
    /// `memory.available=1m30s`
    pub eviction_soft_grace_period: Option<String>,
    pub eviction_minimum_reclaim: Option<String>,
    pub eviction_pressure_transition_period: Option<String>,
    pub eviction_max_pod_grace_period: Option<i64>,
    pub node_name: Option<String>,
    pub dry_run: Option<bool>,
    pub metrics_address: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("{origin}: {message}")]
    Document { origin: String, message: String },
    #[error("{origin}: {field}{}: {message}", key.as_ref().map(|k| format!("[{k:?}]")).unwrap_or_default())]
    Field {
        origin: String,
        field: String,
        key: Option<String>,
        message: String,
    },
}

/// An effective configuration plus the non-fatal findings an operator should see.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub config: AgentConfig,
    pub warnings: Vec<String>,
    /// The merged settings as one `AgentConfiguration` document, defaults filled in.
    pub effective_document: AgentDocument,
}

/// Load a configuration file, or the built-in defaults when `path` is `None`.
pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<AgentConfig, ConfigError> {
    load_with_warnings(path, overrides).map(|loaded| loaded.config)
}

pub fn load_with_warnings(
    path: Option<&Path>,
    overrides: &Overrides,
) -> Result<LoadedConfig, ConfigError> {
    match path {
        None => build(AgentDocument::default(), Origins::new(), overrides),
        Some(path) => {
            let text = read_file(path)?;
            from_yaml_str_with_warnings(&text, &path.display().to_string(), overrides)
        }
    }
}

/// A configuration file's text, read once (it may be a pipe), with an error naming it.
pub fn read_file(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
        path: path.display().to_string(),
        error,
    })
}

/// Parse the text of a configuration file holding one or more YAML documents.
pub fn from_yaml_str(
    text: &str,
    source_name: &str,
    overrides: &Overrides,
) -> Result<AgentConfig, ConfigError> {
    from_yaml_str_with_warnings(text, source_name, overrides).map(|loaded| loaded.config)
}

pub fn from_yaml_str_with_warnings(
    text: &str,
    source_name: &str,
    overrides: &Overrides,
) -> Result<LoadedConfig, ConfigError> {
    let mut kubelet: Option<(AgentDocument, String)> = None;
    let mut agent: Option<(AgentDocument, String)> = None;
    let mut document_warnings = Vec::new();
    for (index, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let label = format!("{source_name} document {}", index + 1);
        let LenientDocument {
            value,
            repeated_keys,
        } = lenient_yaml::read(document).map_err(|e| ConfigError::Document {
            origin: label.clone(),
            message: format!("invalid YAML: {e}"),
        })?;
        if value.is_null() {
            continue;
        }
        let text_field = |name: &str| value.get(name).and_then(|v| v.as_str()).map(str::to_string);
        let (api_version, kind) = (text_field("apiVersion"), text_field("kind"));
        match (api_version.as_deref(), kind.as_deref()) {
            (Some(KUBELET_API_VERSION), Some(KUBELET_KIND)) => {
                let label = format!("{label} ({KUBELET_KIND})");
                if kubelet.is_some() {
                    return Err(duplicate(label));
                }
                // The kubelet falls back to lenient decoding, where the last one wins.
                document_warnings.extend(repeated_keys.iter().map(|key| {
                    format!(
                        "{label}: {key} is given more than once; as in the kubelet (lenient decoding), the last value is used"
                    )
                }));
                let doc: KubeletDocument = decode(value, &label)?;
                kubelet = Some((doc.into(), label));
            }
            (Some(AGENT_API_VERSION), Some(AGENT_KIND)) => {
                let label = format!("{label} ({AGENT_KIND})");
                if agent.is_some() {
                    return Err(duplicate(label));
                }
                // nodekeeper's own document is strict, as it is with unknown fields.
                if let Some(key) = repeated_keys.first() {
                    return Err(ConfigError::Document {
                        origin: label,
                        message: format!(
                            "{key} is given more than once; keep one (the kubelet's document tolerates this, nodekeeper's does not)"
                        ),
                    });
                }
                agent = Some((decode(value, &label)?, label));
            }
            _ => {
                return Err(ConfigError::Document {
                    origin: label,
                    message: format!(
                        "unsupported document apiVersion {:?} kind {:?}; expected {KUBELET_API_VERSION} {KUBELET_KIND} or {AGENT_API_VERSION} {AGENT_KIND}",
                        api_version.unwrap_or_default(),
                        kind.unwrap_or_default()
                    ),
                });
            }
        }
    }
    let mut origins = Origins::new();
    let mut merged = AgentDocument::default();
    for (doc, label) in [kubelet, agent].into_iter().flatten() {
        merged = merged.overridden_by(doc, &label, &mut origins);
    }
    let mut loaded = build(merged, origins, overrides)?;
    loaded.warnings.splice(0..0, document_warnings);
    Ok(loaded)
}

/// Parse an inline `AgentConfiguration` body (as embedded in a trace file), where
/// `apiVersion` and `kind` may be omitted.
pub fn parse_inline(
    value: &serde_yaml_ng::Value,
    source_name: &str,
) -> Result<AgentConfig, ConfigError> {
    let label = format!("{source_name} (inline {AGENT_KIND})");
    let doc: AgentDocument = decode(value.clone(), &label)?;
    for (field, actual, expected) in [
        ("apiVersion", &doc.api_version, AGENT_API_VERSION),
        ("kind", &doc.kind, AGENT_KIND),
    ] {
        if let Some(actual) = actual.as_deref().filter(|a| *a != expected) {
            return Err(ConfigError::Field {
                origin: label,
                field: field.to_string(),
                key: None,
                message: format!("{actual:?} is not {expected:?}"),
            });
        }
    }
    let mut origins = Origins::new();
    let doc = AgentDocument::default().overridden_by(doc, &label, &mut origins);
    build(doc, origins, &Overrides::default()).map(|loaded| loaded.config)
}

fn duplicate(label: String) -> ConfigError {
    ConfigError::Document {
        origin: label,
        message: "a file may hold at most one document of each kind".to_string(),
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    value: serde_yaml_ng::Value,
    label: &str,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        match path.as_str() {
            "." => ConfigError::Document {
                origin: label.to_string(),
                message,
            },
            _ => ConfigError::Field {
                origin: label.to_string(),
                field: path,
                key: None,
                message,
            },
        }
    })
}

/// Parse `k<v,k<v` (kubelet `LangleSeparatedMapStringString`) or `k=v,k=v`.
fn parse_flag_map(flag: &str, text: &str, separator: char) -> Result<ScalarMap, ConfigError> {
    let mut map = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once(separator)
            .ok_or_else(|| ConfigError::Field {
                origin: format!("flag --{flag}"),
                field: flag.to_string(),
                key: None,
                message: format!("malformed pair {pair:?}, expect string{separator}string"),
            })?;
        map.insert(key.trim().to_string(), ScalarText(value.trim().to_string()));
    }
    Ok(map)
}

fn apply_overrides(
    doc: AgentDocument,
    origins: &mut Origins,
    o: &Overrides,
) -> Result<AgentDocument, ConfigError> {
    let mut flag_doc = AgentDocument::default();
    let mut set =
        |field: &str| origins.insert(field.to_string(), format!("flag --{}", kebab(field)));
    if let Some(text) = &o.eviction_hard {
        flag_doc.eviction_hard = Some(parse_flag_map("eviction-hard", text, '<')?);
        set("evictionHard");
    }
    if let Some(text) = &o.eviction_soft {
        flag_doc.eviction_soft = Some(parse_flag_map("eviction-soft", text, '<')?);
        set("evictionSoft");
    }
    if let Some(text) = &o.eviction_soft_grace_period {
        flag_doc.eviction_soft_grace_period =
            Some(parse_flag_map("eviction-soft-grace-period", text, '=')?);
        set("evictionSoftGracePeriod");
    }
    if let Some(text) = &o.eviction_minimum_reclaim {
        flag_doc.eviction_minimum_reclaim =
            Some(parse_flag_map("eviction-minimum-reclaim", text, '=')?);
        set("evictionMinimumReclaim");
    }
    if let Some(text) = &o.eviction_pressure_transition_period {
        flag_doc.eviction_pressure_transition_period = Some(text.clone());
        set("evictionPressureTransitionPeriod");
    }
    if let Some(seconds) = o.eviction_max_pod_grace_period {
        flag_doc.eviction_max_pod_grace_period = Some(seconds);
        set("evictionMaxPodGracePeriod");
    }
    if let Some(name) = &o.node_name {
        flag_doc.node_name = Some(name.clone());
        set("nodeName");
    }
    if let Some(dry_run) = o.dry_run {
        flag_doc.dry_run = Some(dry_run);
        set("dryRun");
    }
    if let Some(address) = &o.metrics_address {
        flag_doc.metrics_address = Some(address.clone());
        set("metricsAddress");
    }
    let mut unused = Origins::new();
    Ok(doc.overridden_by(flag_doc, "", &mut unused))
}

fn kebab(camel: &str) -> String {
    let mut out = String::new();
    for c in camel.chars() {
        if c.is_ascii_uppercase() {
            out.push('-');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The `enforceNodeAllocatable` value that makes the kubelet guard the pods cgroup, and
/// with it every hard `memory.available` threshold also applies to
/// `allocatableMemory.available`.
const ENFORCE_PODS: &str = "pods";

/// What the kubelet's configuration validation would refuse in `enforceNodeAllocatable`.
/// The agent only reads `pods` from it, so it warns and goes on.
fn enforce_node_allocatable_warnings(values: &[String]) -> Vec<String> {
    const KNOWN: [&str; 6] = [
        ENFORCE_PODS,
        "system-reserved",
        "kube-reserved",
        "system-reserved-compressible",
        "kube-reserved-compressible",
        "none",
    ];
    let mut warnings: Vec<String> = values
        .iter()
        .filter(|value| !KNOWN.contains(&value.as_str()))
        .map(|value| {
            format!(
                "enforceNodeAllocatable: {value:?} is not one of {}; the kubelet refuses to start with it",
                KNOWN.join(", ")
            )
        })
        .collect();
    if values.len() > 1 && values.iter().any(|value| value == "none") {
        warnings.push(
            "enforceNodeAllocatable: \"none\" may not be combined with other values; the kubelet refuses to start with it"
                .to_string(),
        );
    }
    warnings
}

/// The kubelet feature gates that change what the agent decides, each at the kubelet's
/// default unless `featureGates` names it. Other gates are the kubelet's business: the
/// agent ignores them, whatever kubelet version they come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FeatureGates {
    /// Graceful node shutdown at all; on by default since 1.21.
    graceful_node_shutdown: bool,
    /// `shutdownGracePeriodByPodPriority`; on by default since 1.24.
    graceful_node_shutdown_based_on_pod_priority: bool,
    /// Eviction on a split image filesystem; on by default since 1.31.
    kubelet_separate_disk_gc: bool,
    /// The huge page pool left out of `memory.available`; on by default from 1.37.
    hugepage_aware_eviction: bool,
    /// The kubelet publishes the KEP-5394 contention conditions itself; alpha, off by
    /// default.
    psi_node_condition: bool,
}

impl FeatureGates {
    const GRACEFUL_NODE_SHUTDOWN: &str = "GracefulNodeShutdown";
    const GRACEFUL_NODE_SHUTDOWN_BASED_ON_POD_PRIORITY: &str =
        "GracefulNodeShutdownBasedOnPodPriority";
    const KUBELET_SEPARATE_DISK_GC: &str = "KubeletSeparateDiskGC";
    const HUGEPAGE_AWARE_EVICTION: &str = "HugepageAwareEviction";
    const PSI_NODE_CONDITION: &str = "PSINodeCondition";

    /// Each gate's name beside its setting: the one place that pairs them.
    fn named(&mut self) -> [(&'static str, &mut bool); 5] {
        [
            (
                Self::GRACEFUL_NODE_SHUTDOWN,
                &mut self.graceful_node_shutdown,
            ),
            (
                Self::GRACEFUL_NODE_SHUTDOWN_BASED_ON_POD_PRIORITY,
                &mut self.graceful_node_shutdown_based_on_pod_priority,
            ),
            (
                Self::KUBELET_SEPARATE_DISK_GC,
                &mut self.kubelet_separate_disk_gc,
            ),
            (
                Self::HUGEPAGE_AWARE_EVICTION,
                &mut self.hugepage_aware_eviction,
            ),
            (Self::PSI_NODE_CONDITION, &mut self.psi_node_condition),
        ]
    }

    /// The gates `map` sets, the others at the kubelet's defaults: on, but the alpha
    /// `PSINodeCondition`.
    fn from_map(map: Option<&FeatureGateMap>) -> FeatureGates {
        let mut gates = FeatureGates {
            graceful_node_shutdown: true,
            graceful_node_shutdown_based_on_pod_priority: true,
            kubelet_separate_disk_gc: true,
            hugepage_aware_eviction: true,
            psi_node_condition: false,
        };
        for (gate, enabled) in gates.named() {
            if let Some(set) = map.and_then(|m| m.get(gate)) {
                *enabled = *set;
            }
        }
        gates
    }

    /// The map with every gate the agent reads written out, for the effective document.
    fn fill_in(mut self, map: &mut FeatureGateMap) {
        for (gate, enabled) in self.named() {
            map.insert(gate.to_string(), *enabled);
        }
    }
}

fn default_hard_map() -> ScalarMap {
    [
        ("memory.available", "100Mi"),
        ("nodefs.available", "10%"),
        ("nodefs.inodesFree", "5%"),
        ("imagefs.available", "15%"),
        ("imagefs.inodesFree", "5%"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ScalarText(v.to_string())))
    .collect()
}

const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:9847";

/// The longest `podStatsMaxAge`: cAdvisor's `storage_duration`, for which the kubelet's
/// stats keep a container's last sample.
const POD_STATS_MAX_AGE_LIMIT: GoDuration = GoDuration::from_secs(120);

fn build(
    doc: AgentDocument,
    mut origins: Origins,
    overrides: &Overrides,
) -> Result<LoadedConfig, ConfigError> {
    let mut doc = apply_overrides(doc, &mut origins, overrides)?;
    let origin_of = |field: &str| {
        origins
            .get(field)
            .cloned()
            .unwrap_or_else(|| "built-in defaults".to_string())
    };
    let field_error = |e: FieldError| ConfigError::Field {
        origin: origin_of(e.field),
        field: e.field.to_string(),
        key: e.key,
        message: e.message,
    };
    let simple_error =
        |field: &'static str, message: String| field_error(FieldError::new(field, None, message));
    // A warning reads like an error, naming the document and the field.
    let warning = |finding: FieldWarning| field_error(finding).to_string();
    let simple_warning =
        |field: &'static str, message: String| warning(FieldWarning::new(field, None, message));
    let mut warnings = Vec::new();
    let gates = FeatureGates::from_map(doc.feature_gates.as_ref());

    // Defaults, with the kubelet's rule: setting evictionHard at all drops the other
    // default signals unless mergeDefaultEvictionSettings is true.
    let merge_defaults = doc.merge_default_eviction_settings.unwrap_or(false);
    doc.eviction_hard = Some(match doc.eviction_hard.take() {
        None => default_hard_map(),
        Some(mut map) if merge_defaults => {
            for (k, v) in default_hard_map() {
                map.entry(k).or_insert(v);
            }
            map
        }
        Some(map) => map,
    });
    doc.merge_default_eviction_settings = Some(merge_defaults);
    let empty = ScalarMap::new();
    let (mut thresholds, threshold_warnings) = parse_thresholds(&ThresholdMaps {
        hard: doc.eviction_hard.as_ref().unwrap_or(&empty),
        soft: doc.eviction_soft.as_ref().unwrap_or(&empty),
        soft_grace_period: doc.eviction_soft_grace_period.as_ref().unwrap_or(&empty),
        minimum_reclaim: doc.eviction_minimum_reclaim.as_ref().unwrap_or(&empty),
    })
    .map_err(field_error)?;
    warnings.extend(threshold_warnings.into_iter().map(warning));

    let duration = |field: &'static str, text: &str| {
        GoDuration::parse(text).map_err(|e| simple_error(field, e.to_string()))
    };
    // The kubelet validates neither of these two; it runs with any value.
    const TRANSITION: &str = "evictionPressureTransitionPeriod";
    let default_transition = GoDuration::from_secs(300);
    // The v1beta1 defaulting turns a zero period in the file into the default; only
    // the command-line flag can set it to zero.
    let transition_from_flag = origins
        .get(TRANSITION)
        .is_some_and(|origin| origin.starts_with("flag"));
    let pressure_transition_period = match &doc.eviction_pressure_transition_period {
        None => default_transition,
        Some(text) => {
            let period = duration(TRANSITION, text)?;
            if period.is_zero() && !transition_from_flag {
                default_transition
            } else {
                period
            }
        }
    };
    if pressure_transition_period.nanos() <= 0 {
        // `nodeConditionsObservedSince` keeps a condition while `now - seen < period`.
        warnings.push(simple_warning(
            TRANSITION,
            format!(
                "{pressure_transition_period} is not positive; as in the kubelet, no pressure condition is then ever reported, although pods are still evicted"
            ),
        ));
    }
    let max_pod_grace_period_seconds = doc.eviction_max_pod_grace_period.unwrap_or(0);
    if max_pod_grace_period_seconds < 0 {
        warnings.push(simple_warning(
            "evictionMaxPodGracePeriod",
            format!(
                "{max_pod_grace_period_seconds} is negative; as in the kubelet, soft evictions then give every pod a 1 s grace period (the pod worker's floor), not its own terminationGracePeriodSeconds"
            ),
        ));
    }
    const HOUSEKEEPING: &str = "housekeepingInterval";
    let housekeeping_interval = match &doc.housekeeping_interval {
        None => GoDuration::from_secs(10),
        Some(text) => {
            let interval = duration(HOUSEKEEPING, text)?;
            if interval.is_negative() {
                return Err(simple_error(
                    HOUSEKEEPING,
                    format!("{text} must not be negative"),
                ));
            }
            interval
        }
    };
    if housekeeping_interval.is_zero() {
        return Err(simple_error(
            HOUSEKEEPING,
            "must be greater than zero".to_string(),
        ));
    }

    let (shutdown, shutdown_warnings) = build_shutdown(&doc, gates, &simple_error)?;
    warnings.extend(shutdown_warnings.into_iter().map(warning));

    let defaults = HostPaths::default();
    let path_field = |text: &Option<String>, default: PathBuf| {
        text.as_ref().map(PathBuf::from).unwrap_or(default)
    };
    let paths = HostPaths {
        cgroup_root: path_field(&doc.cgroup_root, defaults.cgroup_root),
        proc_root: path_field(&doc.proc_root, defaults.proc_root),
        nodefs: path_field(&doc.nodefs_path, defaults.nodefs),
        imagefs: doc.imagefs_path.as_ref().map(PathBuf::from),
        containerfs: doc.containerfs_path.as_ref().map(PathBuf::from),
        pods_cgroup: doc.pods_cgroup.as_ref().map(PathBuf::from),
    };
    for (field, value) in [
        ("cgroupRoot", &doc.cgroup_root),
        ("procRoot", &doc.proc_root),
        ("nodefsPath", &doc.nodefs_path),
        ("imagefsPath", &doc.imagefs_path),
        ("containerfsPath", &doc.containerfs_path),
        ("shutdownStateFile", &doc.shutdown_state_file),
        ("logindDropInPath", &doc.logind_drop_in_path),
    ] {
        if let Some(relative) = value.as_deref().filter(|v| !v.starts_with('/')) {
            return Err(simple_error(
                field,
                format!("{relative:?} must be an absolute path"),
            ));
        }
    }
    // The kubelet's default, also when the field is absent; an explicit empty list
    // enforces nothing.
    let enforce_node_allocatable = doc
        .enforce_node_allocatable
        .get_or_insert_with(|| vec![ENFORCE_PODS.to_string()]);
    warnings.extend(enforce_node_allocatable_warnings(enforce_node_allocatable));
    if enforce_node_allocatable.iter().any(|v| v == ENFORCE_PODS) {
        add_allocatable_thresholds(&mut thresholds);
    }
    mirror_containerfs_thresholds(&mut thresholds, paths.fs_layout(), &mut warnings);
    if !gates.kubelet_separate_disk_gc && paths.fs_layout() == FilesystemLayout::SplitImageFs {
        // The kubelet's first synchronize fails with "KubeletSeparateDiskGC is turned off
        // but we still have a split filesystem" and it never ranks pods for a threshold
        // again. An agent that did the same would protect nothing.
        warnings.push(simple_warning(
            "featureGates",
            format!(
                "{} is off but containerfsPath is a separate filesystem; the kubelet's eviction manager stops evicting for thresholds on such a node, nodekeeper evicts by the split layout's rules",
                FeatureGates::KUBELET_SEPARATE_DISK_GC
            ),
        ));
    }
    let local_storage_capacity_isolation =
        *doc.local_storage_capacity_isolation.get_or_insert(true);

    let metrics_address = doc
        .metrics_address
        .clone()
        .unwrap_or_else(|| DEFAULT_METRICS_ADDRESS.to_string());
    if metrics_address.parse::<std::net::SocketAddr>().is_err() {
        return Err(simple_error(
            "metricsAddress",
            format!("{metrics_address:?} is not an address like 127.0.0.1:9847 or [::]:9847"),
        ));
    }
    let realtime_priority = match *doc.realtime_priority.get_or_insert(0) {
        0 => None,
        priority @ 1..=99 => u8::try_from(priority).ok(),
        other => {
            return Err(simple_error(
                "realtimePriority",
                format!(
                    "{other} is not a SCHED_FIFO priority: 1 to 99, or 0 for the normal scheduler"
                ),
            ));
        }
    };
    if let Some(priority) = realtime_priority.filter(|priority| *priority >= 50) {
        // Threaded interrupt handlers run at SCHED_FIFO 50: at or above it, a cycle busy
        // on the CPU (reading a large pod's files, walking its disk use) could hold off
        // the node's own interrupt handling there.
        warnings.push(simple_warning(
            "realtimePriority",
            format!(
                "{priority} is at or above 50, the priority of the kernel's interrupt threads; the agent's decision cycle thread could delay interrupt handling on its CPU: keep it below 50"
            ),
        ));
    }
    const POD_STATS_MAX_AGE: &str = "podStatsMaxAge";
    let pod_stats_max_age = {
        let text = doc
            .pod_stats_max_age
            .get_or_insert_with(|| GoDuration::ZERO.to_string());
        let age = duration(POD_STATS_MAX_AGE, text)?;
        if age.is_negative() {
            return Err(simple_error(
                POD_STATS_MAX_AGE,
                format!("{text} must not be negative"),
            ));
        }
        if age.nanos() > POD_STATS_MAX_AGE_LIMIT.nanos() {
            return Err(simple_error(
                POD_STATS_MAX_AGE,
                format!(
                    "{text} is longer than {POD_STATS_MAX_AGE_LIMIT}: the kubelet's stats keep no sample longer"
                ),
            ));
        }
        (!age.is_zero()).then_some(age)
    };
    if let Some(name) = doc
        .node_name
        .as_deref()
        .filter(|n| !crate::report::protocol::is_node_name(n))
    {
        return Err(simple_error(
            "nodeName",
            format!("{name:?} is not a valid Kubernetes node name (lowercase DNS subdomain)"),
        ));
    }

    let contention_thresholds =
        build_contention_thresholds(&doc, gates, &simple_error, &simple_warning, &mut warnings)?;
    let node_reclaim = build_node_reclaim(&doc, &simple_error)?;
    let workloads = build_workloads(doc.workloads.as_ref(), &simple_error)?;
    let kubernetes = build_kubernetes(doc.kubernetes.as_ref(), &simple_error)?;
    let report = build_report(
        doc.report.as_ref(),
        kubernetes.api_probe_interval,
        &simple_error,
    )?;

    let config = AgentConfig {
        eviction: EvictionConfig {
            thresholds,
            max_pod_grace_period_seconds,
            pressure_transition_period,
            local_storage_capacity_isolation,
            hugepage_aware: gates.hugepage_aware_eviction,
        },
        shutdown,
        housekeeping_interval,
        paths,
        metrics_address: metrics_address.clone(),
        dry_run: doc.dry_run.unwrap_or(false),
        realtime_priority,
        pod_stats_max_age,
        node_name: doc.node_name.clone(),
        shutdown_state_file: path_field(
            &doc.shutdown_state_file,
            PathBuf::from(DEFAULT_SHUTDOWN_STATE_FILE),
        ),
        logind_drop_in_path: path_field(
            &doc.logind_drop_in_path,
            PathBuf::from(DEFAULT_LOGIND_DROP_IN_PATH),
        ),
        dbus_address: doc.dbus_address.clone(),
        node_reclaim,
        workloads,
        kubernetes,
        report,
        contention_thresholds,
    };
    gates.fill_in(doc.feature_gates.get_or_insert_with(FeatureGateMap::new));
    let effective_document = effective_document(doc, &config);
    Ok(LoadedConfig {
        config,
        warnings,
        effective_document,
    })
}

/// The KEP-5394 contention thresholds: each a fraction of time from 0 to 1, 0 (or unset)
/// turning its condition off. When the kubelet's own `PSINodeCondition` gate is on, the
/// kubelet writes these conditions, so the agent leaves them to it.
fn build_contention_thresholds(
    doc: &AgentDocument,
    gates: FeatureGates,
    simple_error: &dyn Fn(&'static str, String) -> ConfigError,
    simple_warning: &dyn Fn(&'static str, String) -> String,
    warnings: &mut Vec<String>,
) -> Result<BTreeMap<Contention, f64>, ConfigError> {
    let mut thresholds = BTreeMap::new();
    for (contention, value) in [
        (
            Contention::SystemMemory,
            doc.system_memory_contention_threshold,
        ),
        (Contention::SystemDisk, doc.system_disk_contention_threshold),
        (
            Contention::KubepodsMemory,
            doc.kubepods_memory_contention_threshold,
        ),
        (
            Contention::KubepodsDisk,
            doc.kubepods_disk_contention_threshold,
        ),
    ] {
        let Some(value) = value else { continue };
        if !(0.0..=1.0).contains(&value) {
            return Err(simple_error(
                contention.threshold_field(),
                format!(
                    "{value} is not a fraction of time from 0 to 1 (0.1 is 10% of the time stalled; 0 turns the condition off)"
                ),
            ));
        }
        if value > 0.0 {
            thresholds.insert(contention, value);
        }
    }
    if gates.psi_node_condition && !thresholds.is_empty() {
        warnings.push(simple_warning(
            "featureGates",
            format!(
                "{} is on, so the kubelet publishes the contention conditions itself; nodekeeper leaves them to it and ignores its contention thresholds",
                FeatureGates::PSI_NODE_CONDITION
            ),
        ));
        thresholds.clear();
    }
    Ok(thresholds)
}

fn build_node_reclaim(
    doc: &AgentDocument,
    simple_error: &dyn Fn(&'static str, String) -> ConfigError,
) -> Result<NodeReclaimConfig, ConfigError> {
    let mut config = NodeReclaimConfig::default();
    // Empty is unset: kubeadm writes `containerRuntimeEndpoint: ""` and passes the
    // endpoint as a flag.
    if let Some(endpoint) = doc
        .container_runtime_endpoint
        .as_ref()
        .filter(|e| !e.is_empty())
    {
        super::model::runtime_endpoint_socket(endpoint)
            .map_err(|e| simple_error("containerRuntimeEndpoint", format!("{endpoint:?}: {e}")))?;
        config.runtime_endpoint = endpoint.clone();
    }
    // The kubelet's default image service is the runtime's own socket.
    config.image_endpoint = match doc.image_service_endpoint.as_deref() {
        Some(endpoint) if !endpoint.is_empty() => {
            super::model::runtime_endpoint_socket(endpoint)
                .map_err(|e| simple_error("imageServiceEndpoint", format!("{endpoint:?}: {e}")))?;
            endpoint.to_string()
        }
        _ => config.runtime_endpoint.clone(),
    };
    if let Some(text) = &doc.image_minimum_gc_age {
        let age = GoDuration::parse(text)
            .map_err(|e| simple_error("imageMinimumGCAge", e.to_string()))?;
        // As the kubelet defaults it, zero is unset (kubeadm writes `0s`); a negative
        // age makes every image old enough.
        if age != GoDuration::ZERO {
            config.image_minimum_gc_age = age.max(GoDuration::from_nanos(1));
        }
    }
    let Some(raw) = doc.node_reclaim.as_ref() else {
        return Ok(config);
    };
    for (index, command) in raw.commands.iter().enumerate() {
        if command.split_whitespace().next().is_none() {
            return Err(simple_error(
                "nodeReclaim",
                format!("commands[{index}] is empty"),
            ));
        }
    }
    config.commands = raw.commands.clone();
    config.method = match raw.method.as_deref() {
        None if config.commands.is_empty() => ReclaimMethod::Cri,
        None => ReclaimMethod::Commands,
        Some("cri") => ReclaimMethod::Cri,
        Some("commands") => ReclaimMethod::Commands,
        Some("none") => ReclaimMethod::None,
        Some(other) => {
            return Err(simple_error(
                "nodeReclaim",
                format!("method: {other:?} is not one of cri, commands, none"),
            ));
        }
    };
    if config.method == ReclaimMethod::Commands && config.commands.is_empty() {
        return Err(simple_error(
            "nodeReclaim",
            "method: commands needs at least one command in commands".to_string(),
        ));
    }
    if config.method != ReclaimMethod::Commands && !config.commands.is_empty() {
        return Err(simple_error(
            "nodeReclaim",
            format!(
                "commands are given but method is {}; set method: commands to run them",
                config.method.as_str()
            ),
        ));
    }
    if let Some(text) = &raw.timeout {
        let timeout = GoDuration::parse(text)
            .map_err(|e| simple_error("nodeReclaim", format!("timeout: {e}")))?;
        if timeout.nanos() <= 0 {
            return Err(simple_error(
                "nodeReclaim",
                format!("timeout: {text} must be positive"),
            ));
        }
        config.timeout = timeout;
    }
    Ok(config)
}

fn build_workloads(
    raw: Option<&RawWorkloads>,
    simple_error: &dyn Fn(&'static str, String) -> ConfigError,
) -> Result<Option<WorkloadsConfig>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    let parent = raw.parent_cgroup.trim_matches('/');
    if parent.is_empty() || parent.split('/').any(|part| part == ".." || part == ".") {
        return Err(simple_error(
            "workloads",
            format!(
                "parentCgroup {:?} must name a cgroup below the root, without . or ..",
                raw.parent_cgroup
            ),
        ));
    }
    let mut pods = Vec::new();
    for (index, pod) in raw.pods.iter().enumerate() {
        let at = |message: String| {
            simple_error(
                "workloads",
                format!("pods[{index}] ({}): {message}", pod.name),
            )
        };
        if pod.name.is_empty() || pod.name.contains('/') {
            return Err(at(
                "name must be a child cgroup name or a prefix ending in *".to_string(),
            ));
        }
        if pod.termination_grace_period_seconds.is_some_and(|s| s < 0) {
            return Err(at(
                "terminationGracePeriodSeconds must not be negative".to_string()
            ));
        }
        let amounts = |field: &str, map: &ScalarMap| -> Result<ResourceAmounts, ConfigError> {
            let mut out = ResourceAmounts::default();
            for (resource, text) in map {
                let quantity = Quantity::parse(&text.0)
                    .map_err(|e| at(format!("{field}.{resource}: {:?}: {e}", text.0)))?;
                if quantity.is_negative() {
                    return Err(at(format!(
                        "{field}.{resource}: {:?} must not be negative",
                        text.0
                    )));
                }
                match resource.as_str() {
                    "memory" => out.memory = Some(quantity.value()),
                    "ephemeral-storage" => out.ephemeral_storage = Some(quantity.value()),
                    other => {
                        return Err(at(format!(
                            "{field}: unsupported resource {other:?} (memory, ephemeral-storage)"
                        )));
                    }
                }
            }
            Ok(out)
        };
        pods.push(WorkloadPodConfig {
            name: pod.name.clone(),
            priority: pod.priority.unwrap_or(0),
            termination_grace_period_seconds: pod.termination_grace_period_seconds,
            critical: pod.critical.unwrap_or(false),
            requests: amounts("requests", &pod.requests)?,
            limits: amounts("limits", &pod.limits)?,
        });
    }
    Ok(Some(WorkloadsConfig {
        parent_cgroup: PathBuf::from(parent),
        namespace: raw
            .namespace
            .clone()
            .unwrap_or_else(|| "standalone".to_string()),
        pods,
    }))
}

/// A duration field of a section (`fail` names the section) that must be at least
/// `least`.
fn duration_at_least(
    fail: &dyn Fn(String) -> ConfigError,
    field: &str,
    text: &str,
    least: GoDuration,
) -> Result<GoDuration, ConfigError> {
    let value = GoDuration::parse(text).map_err(|e| fail(format!("{field}: {e}")))?;
    if value.nanos() < least.nanos() {
        return Err(fail(format!("{field}: {text} must be at least {least}")));
    }
    Ok(value)
}

fn build_report(
    raw: Option<&RawReport>,
    config_probe_interval: GoDuration,
    simple_error: &dyn Fn(&'static str, String) -> ConfigError,
) -> Result<Option<ReportConfig>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    let fail = |message: String| simple_error("report", message);
    let Some(url) = raw.controller_url.as_deref().map(str::trim) else {
        return Err(fail(
            "controllerURL is required: the controller's report endpoint, like http://nodekeeper-controller.nodekeeper-system.svc:9849".to_string(),
        ));
    };
    let url = url.trim_end_matches('/');
    let https = match url.parse::<http::Uri>() {
        Ok(uri)
            if matches!(uri.scheme_str(), Some("http" | "https"))
                && uri.host().is_some()
                && uri
                    .path_and_query()
                    .is_none_or(|p| p.as_str() == "/" || p.as_str().is_empty()) =>
        {
            uri.scheme_str() == Some("https")
        }
        _ => {
            return Err(fail(format!(
                "controllerURL: {url:?} is not an address like https://host:9849 (scheme https or http, a host, no path)"
            )));
        }
    };
    let ca_file = match raw.ca_file.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(_) if !https => {
            return Err(fail(format!(
                "caFile: is for an https controllerURL, and {url:?} is plain http"
            )));
        }
        Some(path) if !path.starts_with('/') => {
            return Err(fail(format!("caFile: {path:?} must be an absolute path")));
        }
        Some(path) => Some(PathBuf::from(path)),
    };
    // The interval's bounds are the protocol's: the controller refuses any other.
    let millis = |ms: u64| GoDuration::from_nanos(ms as i64 * 1_000_000);
    let least = millis(crate::report::protocol::MIN_INTERVAL_MILLIS);
    let interval = match &raw.interval {
        Some(text) => duration_at_least(&fail, "interval", text, least)?,
        None => GoDuration::from_secs(2),
    };
    if interval.nanos() > millis(crate::report::protocol::MAX_INTERVAL_MILLIS).nanos() {
        return Err(fail(format!(
            "interval: {interval} is longer than 1m; the controller would count the agent as silent"
        )));
    }
    let timeout = match &raw.timeout {
        Some(text) => duration_at_least(&fail, "timeout", text, least)?,
        None => GoDuration::from_secs(5),
    };
    let token_file = match raw.token_file.as_deref() {
        Some("") => None,
        Some(path) if !path.starts_with('/') => {
            return Err(fail(format!(
                "tokenFile: {path:?} must be an absolute path"
            )));
        }
        Some(path) => Some(PathBuf::from(path)),
        None => Some(PathBuf::from(
            crate::config::model::DEFAULT_REPORT_TOKEN_FILE,
        )),
    };
    let isolation = build_isolation(raw.isolation.as_ref(), &fail)?;
    if let Some(after) = isolation.isolate_after {
        if !https {
            return Err(fail(format!(
                "isolation.isolateAfter: self-isolation needs an https controllerURL (the controller trusts a node's promise only over TLS), and {url:?} is plain http"
            )));
        }
        if after.nanos() < 3 * interval.nanos() {
            return Err(fail(format!(
                "isolation.isolateAfter: {after} is shorter than three report intervals ({interval} each)"
            )));
        }
        // A renewal shows one to two Lease reads late, three when a read fails.
        let probe = crate::config::model::lease_read_interval(config_probe_interval, interval);
        if after.nanos() < 3 * probe.nanos() + 3 * interval.nanos() {
            return Err(fail(format!(
                "isolation.isolateAfter: {after} is shorter than three Lease reads (every {probe}, kubernetes.apiProbeInterval) and three report intervals: the agent would isolate a node whose kubelet the controller still hears"
            )));
        }
    }
    Ok(Some(ReportConfig {
        controller_url: url.to_string(),
        interval,
        timeout,
        token_file,
        ca_file,
        isolation,
    }))
}

fn build_isolation(
    raw: Option<&RawIsolation>,
    fail: &dyn Fn(String) -> ConfigError,
) -> Result<IsolationConfig, ConfigError> {
    let mut config = IsolationConfig::default();
    let Some(raw) = raw else { return Ok(config) };
    if let Some(enabled) = raw.enabled {
        config.enabled = enabled;
    }
    if let Some(unit) = raw.kubelet_unit.as_deref().map(str::trim) {
        if !is_service_unit_name(unit) {
            return Err(fail(format!(
                "isolation.kubeletUnit: {unit:?} is not a systemd service name like kubelet.service"
            )));
        }
        config.kubelet_unit = unit.to_string();
    }
    if let Some(text) = &raw.stop_timeout {
        config.stop_timeout = duration_at_least(
            fail,
            "isolation.stopTimeout",
            text,
            GoDuration::from_secs(1),
        )?;
    }
    let absolute = |field: &str, text: &Option<String>| -> Result<Option<PathBuf>, ConfigError> {
        match text.as_deref().map(str::trim) {
            Some(path) if !path.starts_with('/') => {
                Err(fail(format!("{field}: {path:?} must be an absolute path")))
            }
            Some(path) => Ok(Some(PathBuf::from(path))),
            None => Ok(None),
        }
    };
    if let Some(path) = absolute("isolation.stateFile", &raw.state_file)? {
        config.state_file = path;
    }
    if let Some(text) = &raw.isolate_after {
        let after = duration_at_least(fail, "isolation.isolateAfter", text, GoDuration::ZERO)?;
        if !after.is_zero() {
            if after.nanos() < MIN_ISOLATE_AFTER.nanos() {
                return Err(fail(format!(
                    "isolation.isolateAfter: {text} must be 0s (no self-isolation) or at least {MIN_ISOLATE_AFTER}: a brief network blip must not stop a node's pods"
                )));
            }
            if !config.enabled {
                return Err(fail(
                    "isolation.isolateAfter: self-isolation needs isolation.enabled: true"
                        .to_string(),
                ));
            }
            if after.nanos() > MAX_ISOLATE_AFTER.nanos() {
                return Err(fail(format!(
                    "isolation.isolateAfter: {text} is longer than {MAX_ISOLATE_AFTER}"
                )));
            }
            config.isolate_after = Some(after);
        }
    }
    if let Some(path) = absolute("isolation.watchdogDevice", &raw.watchdog_device)? {
        config.watchdog_device = path;
    }
    if let Some(text) = &raw.watchdog_timeout {
        config.watchdog_timeout = duration_at_least(
            fail,
            "isolation.watchdogTimeout",
            text,
            GoDuration::from_secs(2),
        )?;
        if config.watchdog_timeout.nanos() > MAX_WATCHDOG_TIMEOUT.nanos() {
            return Err(fail(format!(
                "isolation.watchdogTimeout: {text} is longer than {MAX_WATCHDOG_TIMEOUT}"
            )));
        }
        if config.watchdog_timeout.nanos() % 1_000_000_000 != 0 {
            return Err(fail(format!(
                "isolation.watchdogTimeout: {text} must be whole seconds (the device counts in seconds)"
            )));
        }
    }
    Ok(config)
}

/// The shortest `isolateAfter`: a Lease renewal reaches the agent up to two of the
/// kubelet's 10 s intervals late (a read every `apiProbeInterval`), and a blip of the
/// network must not stop a node's pods.
const MIN_ISOLATE_AFTER: GoDuration = GoDuration::from_secs(30);
/// The longest: the promise it makes must stay within the protocol's day.
const MAX_ISOLATE_AFTER: GoDuration = GoDuration::from_secs(3600);
/// The longest watchdog timeout (drivers take at most minutes; an hour is surely a typo).
const MAX_WATCHDOG_TIMEOUT: GoDuration = GoDuration::from_secs(3600);

/// A systemd service unit's name: `name.service`, the name of letters, digits and
/// `:-_.\\@` (systemd's own rule), at most 255 bytes.
fn is_service_unit_name(unit: &str) -> bool {
    unit.len() <= 255
        && unit.strip_suffix(".service").is_some_and(|name| {
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b":-_.\\@".contains(&b))
        })
}

fn build_kubernetes(
    raw: Option<&RawKubernetes>,
    simple_error: &dyn Fn(&'static str, String) -> ConfigError,
) -> Result<KubernetesConfig, ConfigError> {
    let mut config = KubernetesConfig::default();
    let Some(raw) = raw else { return Ok(config) };
    let fail = |message: String| simple_error("kubernetes", message);
    let absolute = |field: &str, text: &Option<String>| -> Result<Option<PathBuf>, ConfigError> {
        match text {
            Some(path) if !path.starts_with('/') => {
                Err(fail(format!("{field}: {path:?} must be an absolute path")))
            }
            Some(path) => Ok(Some(PathBuf::from(path))),
            None => Ok(None),
        }
    };
    config.enabled = raw.enabled;
    config.kubeconfig = raw.kubeconfig.as_ref().map(PathBuf::from);
    config.cgroup_driver = match raw.cgroup_driver.as_deref() {
        None => None,
        Some("systemd") => Some(CgroupDriver::Systemd),
        Some("cgroupfs") => Some(CgroupDriver::Cgroupfs),
        Some(other) => {
            return Err(fail(format!(
                "cgroupDriver: {other:?} is not \"systemd\" or \"cgroupfs\""
            )));
        }
    };
    if let Some(name) = &raw.pods_cgroup_name {
        let trimmed = name.trim_matches('/');
        if trimmed.is_empty()
            || trimmed.split('/').any(|part| {
                part.is_empty() || part == "." || part == ".." || part.ends_with(".slice")
            })
        {
            return Err(fail(format!(
                "podsCgroupName: {name:?} must name a cgroup in cgroupfs notation, like /kubepods"
            )));
        }
        config.pods_cgroup_name = format!("/{trimmed}");
    }
    if let Some(path) = absolute("podLogsPath", &raw.pod_logs_path)? {
        config.pod_logs_path = path;
    }
    if let Some(path) = absolute("kubeletRootPath", &raw.kubelet_root_path)? {
        config.kubelet_root_path = path;
    }
    if let Some(path) = absolute("stateFile", &raw.state_file)? {
        config.state_file = path;
    }
    if let Some(template) = &raw.writable_layer_path {
        if !template.starts_with('/') || !template.contains("{containerId}") {
            return Err(fail(format!(
                "writableLayerPath: {template:?} must be an absolute path containing {{containerId}}"
            )));
        }
        config.writable_layer_path = Some(template.clone());
    }
    if let Some(entries) = raw.disk_walk_max_entries {
        if entries == 0 {
            return Err(fail("diskWalkMaxEntries must be positive".to_string()));
        }
        config.disk_walk_max_entries = entries;
    }
    if let Some(text) = &raw.condition_heartbeat {
        config.condition_heartbeat =
            duration_at_least(&fail, "conditionHeartbeat", text, GoDuration::from_secs(1))?;
    }
    // Every node probes: a rhythm of nanoseconds is surely a mistake.
    let probe_least = GoDuration::from_nanos(100_000_000);
    if let Some(text) = &raw.api_probe_interval {
        config.api_probe_interval =
            duration_at_least(&fail, "apiProbeInterval", text, GoDuration::ZERO)?;
        if !config.api_probe_interval.is_zero()
            && config.api_probe_interval.nanos() < probe_least.nanos()
        {
            return Err(fail(format!(
                "apiProbeInterval: {text} must be 0s (no probe) or at least {probe_least}"
            )));
        }
    }
    if let Some(text) = &raw.api_probe_timeout {
        config.api_probe_timeout = duration_at_least(&fail, "apiProbeTimeout", text, probe_least)?;
    }
    if !config.api_probe_interval.is_zero()
        && config.api_probe_timeout.nanos() >= config.api_probe_interval.nanos()
    {
        return Err(fail(format!(
            "apiProbeTimeout: {} must be shorter than apiProbeInterval ({})",
            config.api_probe_timeout, config.api_probe_interval
        )));
    }
    if let Some(size) = raw.outbox_size {
        if size == 0 {
            return Err(fail("outboxSize must be positive".to_string()));
        }
        config.outbox_size = size;
    }
    config.taints = raw.taints.unwrap_or(config.taints);
    config.local_kill = raw.local_kill.unwrap_or(config.local_kill);
    Ok(config)
}

/// The shutdown settings, validated as the kubelet's `ValidateKubeletConfiguration`
/// validates them against its feature gates, and resolved as its node shutdown manager
/// resolves them.
fn build_shutdown(
    doc: &AgentDocument,
    gates: FeatureGates,
    simple_error: &dyn Fn(&'static str, String) -> ConfigError,
) -> Result<(ShutdownConfig, Vec<FieldWarning>), ConfigError> {
    const BY_PRIORITY: &str = "shutdownGracePeriodByPodPriority";
    let mut warnings = Vec::new();
    let parse = |field: &'static str, text: &Option<String>| match text {
        None => Ok(GoDuration::ZERO),
        Some(raw) => GoDuration::parse(raw).map_err(|e| simple_error(field, e.to_string())),
    };
    let grace_period = parse("shutdownGracePeriod", &doc.shutdown_grace_period)?;
    let grace_period_critical_pods = parse(
        "shutdownGracePeriodCriticalPods",
        &doc.shutdown_grace_period_critical_pods,
    )?;
    let either_period_set = grace_period.nanos() > 0 || grace_period_critical_pods.nanos() > 0;
    let by_pod_priority: Vec<ShutdownPhaseConfig> = doc
        .shutdown_grace_period_by_pod_priority
        .iter()
        .flatten()
        .map(|p| ShutdownPhaseConfig {
            priority: p.priority,
            shutdown_grace_period_seconds: p.shutdown_grace_period_seconds,
        })
        .collect();

    if gates.graceful_node_shutdown {
        // The kubelet reports every failed check; the first is named here.
        for (field, value) in [
            ("shutdownGracePeriod", grace_period),
            (
                "shutdownGracePeriodCriticalPods",
                grace_period_critical_pods,
            ),
        ] {
            if value.is_negative() || (!value.is_zero() && value.nanos() < 1_000_000_000) {
                return Err(simple_error(
                    field,
                    format!(
                        "invalid configuration: {field} {value} must be either zero or otherwise >= 1 sec"
                    ),
                ));
            }
        }
        if grace_period_critical_pods > grace_period {
            return Err(simple_error(
                "shutdownGracePeriodCriticalPods",
                format!(
                    "invalid configuration: shutdownGracePeriodCriticalPods {grace_period_critical_pods} must be <= shutdownGracePeriod {grace_period}"
                ),
            ));
        }
    } else if either_period_set {
        return Err(simple_error(
            "featureGates",
            format!(
                "invalid configuration: specifying shutdownGracePeriod or shutdownGracePeriodCriticalPods requires feature gate {}",
                FeatureGates::GRACEFUL_NODE_SHUTDOWN
            ),
        ));
    }
    if gates.graceful_node_shutdown_based_on_pod_priority {
        if !by_pod_priority.is_empty() && either_period_set {
            return Err(simple_error(
                BY_PRIORITY,
                "invalid configuration: Cannot specify both shutdownGracePeriodByPodPriority and shutdownGracePeriod at the same time".to_string(),
            ));
        }
    } else if !by_pod_priority.is_empty() {
        return Err(simple_error(
            "featureGates",
            format!(
                "invalid configuration: Specifying shutdownGracePeriodByPodPriority requires feature gate {}",
                FeatureGates::GRACEFUL_NODE_SHUTDOWN_BASED_ON_POD_PRIORITY
            ),
        ));
    }

    // The kubelet checks the entries no further; these are surely mistakes, and they run
    // as they run there (see shutdown::plan).
    let warn = |message: String| FieldWarning::new(BY_PRIORITY, None, message);
    for phase in by_pod_priority
        .iter()
        .filter(|p| p.shutdown_grace_period_seconds < 0)
    {
        warnings.push(warn(format!(
            "priority {}: shutdownGracePeriodSeconds {} is negative; as in the kubelet, that phase does not wait and its pods get a 1 s grace period",
            phase.priority, phase.shutdown_grace_period_seconds
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut reported = std::collections::BTreeSet::new();
    for phase in &by_pod_priority {
        if !seen.insert(phase.priority) && reported.insert(phase.priority) {
            warnings.push(warn(format!(
                "priority {} is listed more than once; as in the kubelet, a pod of exactly that priority goes to the first of these entries, a pod above it (below the next entry) to the last, and every entry's seconds count toward the delay asked of logind",
                phase.priority
            )));
        }
    }

    if !gates.graceful_node_shutdown {
        if !by_pod_priority.is_empty() {
            warnings.push(FieldWarning::new(
                "featureGates",
                None,
                format!(
                    "{} is off, so shutdownGracePeriodByPodPriority is ignored: like the kubelet, the agent does not delay a node shutdown",
                    FeatureGates::GRACEFUL_NODE_SHUTDOWN
                ),
            ));
        }
        return Ok((ShutdownConfig::default(), warnings));
    }
    Ok((
        ShutdownConfig {
            grace_period,
            grace_period_critical_pods,
            by_pod_priority,
        },
        warnings,
    ))
}

/// The merged settings rendered back as one complete `AgentConfiguration`, so that
/// `check-config` output is itself a valid config file.
fn effective_document(mut doc: AgentDocument, config: &AgentConfig) -> AgentDocument {
    doc.api_version = Some(AGENT_API_VERSION.to_string());
    doc.kind = Some(AGENT_KIND.to_string());
    doc.eviction_soft.get_or_insert_with(BTreeMap::new);
    doc.eviction_soft_grace_period
        .get_or_insert_with(BTreeMap::new);
    doc.eviction_minimum_reclaim
        .get_or_insert_with(BTreeMap::new);
    doc.eviction_max_pod_grace_period = Some(config.eviction.max_pod_grace_period_seconds);
    doc.eviction_pressure_transition_period =
        Some(config.eviction.pressure_transition_period.to_string());
    doc.shutdown_grace_period = Some(config.shutdown.grace_period.to_string());
    doc.shutdown_grace_period_critical_pods =
        Some(config.shutdown.grace_period_critical_pods.to_string());
    doc.shutdown_grace_period_by_pod_priority
        .get_or_insert_with(Vec::new);
    doc.housekeeping_interval = Some(config.housekeeping_interval.to_string());
    doc.pod_stats_max_age = Some(
        config
            .pod_stats_max_age
            .unwrap_or(GoDuration::ZERO)
            .to_string(),
    );
    let path = |p: &Path| Some(p.display().to_string());
    doc.cgroup_root = path(&config.paths.cgroup_root);
    doc.proc_root = path(&config.paths.proc_root);
    doc.nodefs_path = path(&config.paths.nodefs);
    doc.metrics_address = Some(config.metrics_address.clone());
    doc.dry_run = Some(config.dry_run);
    doc.shutdown_state_file = path(&config.shutdown_state_file);
    doc.logind_drop_in_path = path(&config.logind_drop_in_path);
    doc.report = config.report.as_ref().map(|report| RawReport {
        controller_url: Some(report.controller_url.clone()),
        interval: Some(report.interval.to_string()),
        timeout: Some(report.timeout.to_string()),
        token_file: Some(
            report
                .token_file
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        ),
        ca_file: report.ca_file.as_ref().map(|p| p.display().to_string()),
        isolation: Some(RawIsolation {
            enabled: Some(report.isolation.enabled),
            kubelet_unit: Some(report.isolation.kubelet_unit.clone()),
            stop_timeout: Some(report.isolation.stop_timeout.to_string()),
            state_file: Some(report.isolation.state_file.display().to_string()),
            isolate_after: Some(
                report
                    .isolation
                    .isolate_after
                    .unwrap_or(GoDuration::ZERO)
                    .to_string(),
            ),
            watchdog_device: Some(report.isolation.watchdog_device.display().to_string()),
            watchdog_timeout: Some(report.isolation.watchdog_timeout.to_string()),
        }),
    });
    doc.container_runtime_endpoint = Some(config.node_reclaim.runtime_endpoint.clone());
    doc.image_service_endpoint = Some(config.node_reclaim.image_endpoint.clone());
    doc.image_minimum_gc_age = Some(config.node_reclaim.image_minimum_gc_age.to_string());
    doc.node_reclaim = Some(RawNodeReclaim {
        method: Some(config.node_reclaim.method.as_str().to_string()),
        commands: config.node_reclaim.commands.clone(),
        timeout: Some(config.node_reclaim.timeout.to_string()),
    });
    let kubernetes = &config.kubernetes;
    doc.kubernetes = Some(RawKubernetes {
        enabled: kubernetes.enabled,
        kubeconfig: kubernetes
            .kubeconfig
            .as_ref()
            .map(|p| p.display().to_string()),
        cgroup_driver: kubernetes.cgroup_driver.map(|driver| driver.to_string()),
        pods_cgroup_name: Some(kubernetes.pods_cgroup_name.clone()),
        pod_logs_path: path(&kubernetes.pod_logs_path),
        kubelet_root_path: path(&kubernetes.kubelet_root_path),
        writable_layer_path: kubernetes.writable_layer_path.clone(),
        disk_walk_max_entries: Some(kubernetes.disk_walk_max_entries),
        taints: Some(kubernetes.taints),
        condition_heartbeat: Some(kubernetes.condition_heartbeat.to_string()),
        api_probe_interval: Some(kubernetes.api_probe_interval.to_string()),
        api_probe_timeout: Some(kubernetes.api_probe_timeout.to_string()),
        outbox_size: Some(kubernetes.outbox_size),
        local_kill: Some(kubernetes.local_kill),
        state_file: path(&kubernetes.state_file),
    });
    doc
}

/// The optional settings `config` leaves unset, each with what unset means, for
/// `check-config` to show beside the effective document (they have no value to print).
pub fn unset_settings(config: &AgentConfig) -> Vec<(&'static str, &'static str)> {
    let kubernetes = &config.kubernetes;
    [
        (
            config.paths.imagefs.is_none(),
            "imagefsPath",
            "images are on the nodefs filesystem",
        ),
        (
            config.paths.containerfs.is_none(),
            "containerfsPath",
            "writable layers are on the imagefs filesystem",
        ),
        (
            config.paths.pods_cgroup.is_none(),
            "podsCgroup",
            "in Kubernetes mode the kubelet's pods cgroup (kubernetes.podsCgroupName); standalone, allocatableMemory.available is not observed (its threshold never fires) and there are no pod-level kernel notifiers",
        ),
        (
            config.node_name.is_none(),
            "nodeName",
            "the NODE_NAME variable, then the hostname",
        ),
        (
            config.dbus_address.is_none(),
            "dbusAddress",
            "the system bus (DBUS_SYSTEM_BUS_ADDRESS, else its standard socket)",
        ),
        (
            config.workloads.is_none(),
            "workloads",
            "standalone mode has no pods to evict, only signals and metrics",
        ),
        (
            config.report.is_none(),
            "report",
            "no reports to a fence controller, and no self-isolation",
        ),
        (
            config
                .report
                .as_ref()
                .is_some_and(|report| report.ca_file.is_none()),
            "report.caFile",
            "the controller's certificate is checked against the system's root certificates",
        ),
        (
            kubernetes.enabled.is_none(),
            "kubernetes.enabled",
            "Kubernetes mode when a kubeconfig or the in-cluster service account is found",
        ),
        (
            kubernetes.kubeconfig.is_none(),
            "kubernetes.kubeconfig",
            "the --kubeconfig flag, then KUBECONFIG, then the in-cluster service account",
        ),
        (
            kubernetes.cgroup_driver.is_none(),
            "kubernetes.cgroupDriver",
            "detected from the cgroup tree (a KubeletConfiguration's cgroupDriver is not read: the kubelet asks the container runtime, which names the cgroups)",
        ),
        (
            kubernetes.writable_layer_path.is_none(),
            "kubernetes.writableLayerPath",
            "containers' writable layers are not measured",
        ),
    ]
    .into_iter()
    .filter(|(unset, _, _)| *unset)
    .map(|(_, field, meaning)| (field, meaning))
    .collect()
}
