//! The trace format: recorded or hand-written observations that `replay`, `rank` and
//! `shutdown-plan` read, and that `agent --record` writes. Documented in
//! docs/trace-format.md; field names here are the wire format and must not change.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// A quantity as written in a trace: a string (`900Mi`) or a bare YAML/JSON number; the
/// same scalar the configuration documents accept.
pub use crate::config::ScalarText as Amount;
use crate::config::{GoDuration, Quantity};
use crate::pods::{
    ContainerKind, ContainerStats, ContainerUsage, DiskAmount, EmptyDirStats, Pod, PodUsage,
    ResourceAmounts, StorageUsage,
};
use crate::signals::{Observation, Observations, Signal};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceFile {
    /// Inline `AgentConfiguration` fields; apiVersion/kind may be omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_yaml_ng::Value>,
    #[serde(default)]
    pub steps: Vec<TraceStep>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceStep {
    /// Offset from the start of the trace, Go duration syntax.
    pub at: String,
    #[serde(default)]
    pub signals: BTreeMap<String, TraceSignal>,
    #[serde(default)]
    pub pods: Vec<TracePod>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceSignal {
    pub available: Amount,
    pub capacity: Amount,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TracePod {
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub critical: Option<bool>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, Amount>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, Amount>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub usage: BTreeMap<String, Amount>,
    /// Optional: the pod's local storage by where it lives, which decides what each
    /// disk signal ranks when images have their own filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<TraceStorage>,
    /// Optional per-container detail (eviction messages, container storage limits).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<TraceContainer>,
    /// Optional emptyDir volumes (sizeLimit evictions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub empty_dirs: Vec<TraceEmptyDir>,
    /// Optional: the pod's cgroup, found although none of its figures could be read. Such
    /// a pod has stats, each figure counting as 0, as a pod in the kubelet's summary whose
    /// memory figures are missing; without its cgroup it would read back as a pod
    /// without stats, which is evicted first. `agent --record` writes it only then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TraceContainer {
    pub name: String,
    /// `regular` (the default), `init` or `sidecar`: where the container sits in the
    /// pod spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, Amount>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, Amount>,
    /// `memory` (working set), `rootfs` and `logs` bytes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub usage: BTreeMap<String, Amount>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TraceEmptyDir {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_limit: Option<Amount>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<Amount>,
    /// `Memory` for a tmpfs volume, `HugePages` or `HugePages-<size>` for a hugetlbfs
    /// one; absent or empty for one on disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub medium: Option<String>,
}

/// A pod's local storage by part; a part left out was not measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TraceStorage {
    /// Its containers' writable layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writable_layers: Option<TraceDiskAmount>,
    /// Its containers' logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<TraceDiskAmount>,
    /// Its local volumes (emptyDirs not backed by memory, configMaps, gitRepos).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_volumes: Option<TraceDiskAmount>,
}

/// Bytes and inodes of one storage part; a missing figure is 0.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TraceDiskAmount {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<Amount>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes: Option<Amount>,
}

impl TraceStorage {
    pub fn from_usage(storage: &StorageUsage) -> Option<TraceStorage> {
        let part = |amount: Option<DiskAmount>| {
            amount.map(|amount| TraceDiskAmount {
                bytes: Some(Amount::from(amount.bytes)),
                inodes: Some(Amount::from(amount.inodes)),
            })
        };
        storage.is_measured().then(|| TraceStorage {
            writable_layers: part(storage.writable_layers),
            logs: part(storage.logs),
            local_volumes: part(storage.local_volumes),
        })
    }

    fn to_usage(&self, who: &str) -> Result<StorageUsage, String> {
        let part = |field: &str, amount: &Option<TraceDiskAmount>| {
            let Some(amount) = amount else {
                return Ok(None);
            };
            let figure = |name: &str, value: &Option<Amount>| {
                value.as_ref().map_or(Ok(0), |text| {
                    parse_amount(&text.0).map_err(|e| format!("{who}: storage.{field}.{name}: {e}"))
                })
            };
            Ok::<_, String>(Some(DiskAmount {
                bytes: figure("bytes", &amount.bytes)?,
                inodes: figure("inodes", &amount.inodes)?,
            }))
        };
        Ok(StorageUsage {
            writable_layers: part("writableLayers", &self.writable_layers)?,
            logs: part("logs", &self.logs)?,
            local_volumes: part("localVolumes", &self.local_volumes)?,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read trace {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("trace {source_name}: {message}")]
    Invalid {
        source_name: String,
        message: String,
    },
}

/// A trace step with every string parsed.
#[derive(Debug, Clone)]
pub struct ParsedStep {
    pub at: GoDuration,
    pub observations: Observations,
    pub pods: Vec<Pod>,
}

impl TraceFile {
    pub fn from_path(path: &Path) -> Result<Self, TraceError> {
        let text = std::fs::read_to_string(path).map_err(|error| TraceError::Read {
            path: path.display().to_string(),
            error,
        })?;
        Self::from_str(&text, &path.display().to_string())
    }

    /// Parse YAML or JSON (JSON is a subset of the YAML we accept).
    pub fn from_str(text: &str, source_name: &str) -> Result<Self, TraceError> {
        serde_yaml_ng::from_str(text).map_err(|e| TraceError::Invalid {
            source_name: source_name.to_string(),
            message: e.to_string(),
        })
    }

    pub fn parsed_steps(&self, source_name: &str) -> Result<Vec<ParsedStep>, TraceError> {
        self.steps
            .iter()
            .enumerate()
            .map(|(index, step)| {
                step.parse().map_err(|message| TraceError::Invalid {
                    source_name: source_name.to_string(),
                    message: format!("steps[{index}]: {message}"),
                })
            })
            .collect()
    }
}

impl TraceStep {
    pub fn parse(&self) -> Result<ParsedStep, String> {
        let at = GoDuration::parse(&self.at).map_err(|e| format!("at: {e}"))?;
        if at.is_negative() {
            return Err(format!("at: {:?} must not be negative", self.at));
        }
        let mut observations = Observations::new();
        for (name, sample) in &self.signals {
            let signal: Signal = name.parse().map_err(|e| format!("signals: {e}"))?;
            let available = parse_amount(&sample.available.0)
                .map_err(|e| format!("signals.{name}.available: {e}"))?;
            let capacity = parse_amount(&sample.capacity.0)
                .map_err(|e| format!("signals.{name}.capacity: {e}"))?;
            observations.insert(
                signal,
                Observation {
                    available,
                    capacity,
                    sampled_at_ms: None,
                },
            );
        }
        let pods = self
            .pods
            .iter()
            .enumerate()
            .map(|(i, pod)| pod.to_pod().map_err(|e| format!("pods[{i}]: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        // A pod is its namespace and name, as on a node: a name listed twice would make
        // an eviction that names it ambiguous.
        let mut seen = std::collections::BTreeMap::new();
        for (index, pod) in pods.iter().enumerate() {
            if let Some(first) = seen.insert((&pod.namespace, &pod.name), index) {
                return Err(format!(
                    "pods[{index}]: {}/{} is already listed as pods[{first}]",
                    pod.namespace, pod.name
                ));
            }
        }
        Ok(ParsedStep {
            at,
            observations,
            pods,
        })
    }
}

/// Requests or limits: memory and ephemeral-storage (cpu is accepted and ignored).
fn resource_amounts(
    who: &str,
    field: &str,
    map: &BTreeMap<String, Amount>,
) -> Result<ResourceAmounts, String> {
    let mut out = ResourceAmounts::default();
    for (resource, text) in map {
        let quantity =
            parse_quantity(&text.0).map_err(|e| format!("{who}: {field}.{resource}: {e}"))?;
        let value = Some(quantity.value());
        match resource.as_str() {
            "memory" => {
                out.memory = value;
                out.formats.memory = quantity.format();
            }
            "ephemeral-storage" => {
                out.ephemeral_storage = value;
                out.formats.ephemeral_storage = quantity.format();
            }
            "cpu" => {}
            other => return Err(format!("{who}: {field}: unknown resource {other:?}")),
        }
    }
    Ok(out)
}

impl TraceContainer {
    fn to_stats(&self, who: &str) -> Result<ContainerStats, String> {
        let who = format!("{who}: containers[{}]", self.name);
        let mut usage = ContainerUsage::default();
        for (key, text) in &self.usage {
            let value = parse_amount(&text.0).map_err(|e| format!("{who}: usage.{key}: {e}"))?;
            match key.as_str() {
                "memory" => usage.memory = Some(value),
                "rootfs" => usage.rootfs = Some(value),
                "logs" => usage.logs = Some(value),
                "cpu" => {}
                other => {
                    return Err(format!(
                        "{who}: usage: unknown field {other:?} (expected memory, rootfs or logs)"
                    ));
                }
            }
        }
        let kind = match self.kind.as_deref() {
            None | Some("regular") => ContainerKind::Regular,
            Some("init") => ContainerKind::Init,
            Some("sidecar") => ContainerKind::Sidecar,
            Some(other) => {
                return Err(format!(
                    "{who}: kind: {other:?} is not a container kind (expected regular, init or sidecar)"
                ));
            }
        };
        Ok(ContainerStats {
            name: self.name.clone(),
            kind,
            requests: resource_amounts(&who, "requests", &self.requests)?,
            limits: resource_amounts(&who, "limits", &self.limits)?,
            usage,
        })
    }
}

impl TraceEmptyDir {
    fn to_stats(&self, who: &str) -> Result<EmptyDirStats, String> {
        let who = format!("{who}: emptyDirs[{}]", self.name);
        let quantity = |field: &str, value: &Option<Amount>| {
            value
                .as_ref()
                .map(|text| parse_quantity(&text.0).map_err(|e| format!("{who}: {field}: {e}")))
                .transpose()
        };
        let memory_backed = match self.medium.as_deref() {
            None | Some("") => false,
            Some("Memory" | "HugePages") => true,
            Some(huge) if huge.starts_with("HugePages-") => true,
            Some(other) => {
                return Err(format!(
                    "{who}: medium: {other:?} is not a medium (expected Memory, HugePages, HugePages-<size>, or none for disk)"
                ));
            }
        };
        Ok(EmptyDirStats {
            name: self.name.clone(),
            size_limit: quantity("sizeLimit", &self.size_limit)?,
            used: quantity("used", &self.used)?.map(|used| used.value()),
            memory_backed,
        })
    }
}

impl TracePod {
    pub fn to_pod(&self) -> Result<Pod, String> {
        let who = format!("{}/{}", self.namespace, self.name);
        let amounts =
            |field: &str, map: &BTreeMap<String, Amount>| resource_amounts(&who, field, map);
        let mut usage = PodUsage::default();
        for (resource, text) in &self.usage {
            let value =
                parse_amount(&text.0).map_err(|e| format!("{who}: usage.{resource}: {e}"))?;
            match resource.as_str() {
                "memory" => usage.memory = Some(value),
                "ephemeral-storage" => usage.ephemeral_storage = Some(value),
                "inodes" => usage.inodes = Some(value),
                "pids" => usage.pids = Some(value),
                "cpu" => {}
                other => return Err(format!("{who}: usage: unknown resource {other:?}")),
            }
        }
        if let Some(storage) = &self.storage {
            usage.storage = storage.to_usage(&who)?;
            // Given only by part, the pod's total is the parts together.
            if let Some(total) = usage.storage.total() {
                usage.ephemeral_storage.get_or_insert(total.bytes);
                usage.inodes.get_or_insert(total.inodes);
            }
        }
        Ok(Pod {
            // A trace holds the candidates the agent saw: a pod being deleted was
            // recorded only while it still ran, so it is a candidate on replay too.
            terminating: false,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            priority: self.priority.unwrap_or(0),
            termination_grace_period_seconds: self.termination_grace_period_seconds,
            critical: self.critical.unwrap_or(false),
            requests: amounts("requests", &self.requests)?,
            limits: amounts("limits", &self.limits)?,
            usage,
            containers: self
                .containers
                .iter()
                .map(|container| container.to_stats(&who))
                .collect::<Result<_, _>>()?,
            empty_dirs: self
                .empty_dirs
                .iter()
                .map(|volume| volume.to_stats(&who))
                .collect::<Result<_, _>>()?,
            cgroup: self.cgroup.as_ref().map(std::path::PathBuf::from),
        })
    }
}

/// A non-negative integer amount in quantity syntax (bytes, inodes, pids).
fn parse_amount(text: &str) -> Result<i64, String> {
    parse_quantity(text).map(|quantity| quantity.value())
}

/// A figure of a trace, kept in the format it was written in for messages.
fn parse_quantity(text: &str) -> Result<Quantity, String> {
    let quantity = Quantity::parse(text).map_err(|e| format!("{text:?}: {e}"))?;
    if quantity.is_negative() {
        return Err(format!("{text:?} must not be negative"));
    }
    Ok(quantity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_documented_example() {
        let trace = TraceFile::from_str(
            r#"
config:
  evictionHard:
    memory.available: 1Gi
steps:
- at: 0s
  signals:
    memory.available: {available: 900Mi, capacity: 10Gi}
    nodefs.inodesFree: {available: 900000, capacity: 1000000}
  pods:
  - namespace: default
    name: web-1
    priority: 0
    terminationGracePeriodSeconds: 30
    critical: false
    requests: {memory: 100Mi, ephemeral-storage: 1Gi}
    limits: {memory: 200Mi}
    usage: {memory: 150Mi, ephemeral-storage: 2Gi, inodes: 1200, pids: 12}
"#,
            "example",
        )
        .unwrap();
        let steps = trace.parsed_steps("example").unwrap();
        let obs = steps[0].observations[&Signal::MemoryAvailable];
        assert_eq!((obs.available, obs.capacity), (900 << 20, 10 << 30));
        let pod = &steps[0].pods[0];
        assert_eq!(pod.usage.pids, Some(12));
        assert_eq!(pod.usage.memory, Some(150 << 20));
        assert_eq!(pod.requests.ephemeral_storage, Some(1 << 30));
        assert_eq!(pod.termination_grace_period_seconds, Some(30));
    }

    #[test]
    fn storage_given_by_part_also_gives_the_pods_total() {
        let trace = TraceFile::from_str(
            r#"
steps:
- at: 0s
  pods:
  - namespace: a
    name: by-part
    storage:
      writableLayers: {bytes: 3Gi, inodes: 30}
      logs: {bytes: 1Gi}
  - namespace: a
    name: total-wins
    usage: {ephemeral-storage: 10Gi}
    storage:
      localVolumes: {bytes: 1Gi, inodes: 5}
    emptyDirs:
    - {name: shm, medium: Memory, used: 1Mi}
    - {name: huge, medium: HugePages-2Mi, used: 2Mi}
    - {name: disk, used: 1Mi}
"#,
            "t",
        )
        .unwrap();
        let pods = &trace.parsed_steps("t").unwrap()[0].pods;
        let by_part = &pods[0].usage;
        assert_eq!(by_part.ephemeral_storage, Some(4 << 30));
        assert_eq!(by_part.inodes, Some(30), "a missing inode figure is 0");
        assert_eq!(
            by_part.storage.logs,
            Some(DiskAmount {
                bytes: 1 << 30,
                inodes: 0
            })
        );
        assert_eq!(by_part.storage.local_volumes, None, "not measured");
        assert_eq!(pods[1].usage.ephemeral_storage, Some(10 << 30));
        assert_eq!(pods[1].usage.inodes, Some(5));
        let backed: Vec<bool> = pods[1].empty_dirs.iter().map(|v| v.memory_backed).collect();
        assert_eq!(backed, [true, true, false]);
    }

    #[test]
    fn containers_carry_their_kind_and_figures_keep_their_format() {
        let text = "steps:\n- at: 0s\n  pods:\n  - namespace: a\n    name: b\n    containers:\n    - {name: init, kind: init}\n    - {name: proxy, kind: sidecar, requests: {memory: 1G}}\n    - {name: app, limits: {ephemeral-storage: 40k}}\n    emptyDirs:\n    - {name: scratch, sizeLimit: \"1e3\"}\n";
        let trace = TraceFile::from_str(text, "t.yaml").unwrap();
        let steps = trace.parsed_steps("t.yaml").unwrap();
        let pod = &steps[0].pods[0];
        let kinds: Vec<ContainerKind> = pod.containers.iter().map(|c| c.kind).collect();
        assert_eq!(
            kinds,
            [
                ContainerKind::Init,
                ContainerKind::Sidecar,
                ContainerKind::Regular
            ]
        );
        let shown = |q: Option<Quantity>| q.map(|q| q.to_string());
        assert_eq!(
            shown(pod.containers[1].requests.memory_quantity()).as_deref(),
            Some("1G")
        );
        assert_eq!(
            shown(pod.containers[2].limits.ephemeral_storage_quantity()).as_deref(),
            Some("40k")
        );
        assert_eq!(shown(pod.empty_dirs[0].size_limit).as_deref(), Some("1e3"));
    }

    #[test]
    fn a_bad_storage_figure_or_medium_is_named() {
        for (pod, expected) in [
            (
                "{namespace: a, name: b, storage: {logs: {bytes: -1}}}",
                "a/b: storage.logs.bytes",
            ),
            (
                "{namespace: a, name: b, storage: {images: {bytes: 1}}}",
                "unknown field `images`",
            ),
            (
                "{namespace: a, name: b, emptyDirs: [{name: v, medium: Disk}]}",
                "a/b: emptyDirs[v]: medium: \"Disk\" is not a medium",
            ),
            (
                "{namespace: a, name: b, containers: [{name: c, kind: ephemeral}]}",
                "a/b: containers[c]: kind: \"ephemeral\" is not a container kind",
            ),
        ] {
            let text = format!("steps:\n- at: 0s\n  pods:\n  - {pod}\n");
            let error = match TraceFile::from_str(&text, "t.yaml") {
                Err(error) => error.to_string(),
                Ok(trace) => trace.parsed_steps("t.yaml").unwrap_err().to_string(),
            };
            assert!(error.contains(expected), "{pod}: {error}");
        }
    }

    #[test]
    fn names_the_step_and_field_of_a_bad_value() {
        let trace = TraceFile::from_str(
            "steps:\n- at: 0s\n  pods:\n  - {namespace: a, name: b, usage: {memory: 12XB}}\n",
            "t.yaml",
        )
        .unwrap();
        let error = trace.parsed_steps("t.yaml").unwrap_err().to_string();
        assert!(
            error.contains("steps[0]: pods[0]: a/b: usage.memory"),
            "{error}"
        );
    }

    /// Found in review of the trace fuzz target: with a name listed twice, an eviction of it
    /// could not say which of the two pods went (one of them critical, say).
    #[test]
    fn refuses_a_pod_listed_twice_in_one_step() {
        let trace = TraceFile::from_str(
            "steps:\n- at: 0s\n  pods:\n  - {namespace: a, name: b, critical: true}\n  \
             - {namespace: a, name: c}\n  - {namespace: a, name: b}\n",
            "t.yaml",
        )
        .unwrap();
        let error = trace.parsed_steps("t.yaml").unwrap_err().to_string();
        assert!(
            error.contains("steps[0]: pods[2]: a/b is already listed as pods[0]"),
            "{error}"
        );
        // The same name in another namespace, or at another step, is another pod.
        let trace = TraceFile::from_str(
            "steps:\n- at: 0s\n  pods:\n  - {namespace: a, name: b}\n  - {namespace: z, name: b}\n\
             - at: 1s\n  pods:\n  - {namespace: a, name: b}\n",
            "t.yaml",
        )
        .unwrap();
        assert_eq!(trace.parsed_steps("t.yaml").unwrap().len(), 2);
    }
}
