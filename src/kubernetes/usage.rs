//! Per-pod measurements on the node: working set and process count from the pod's
//! cgroup (each container's child cgroup only on request, for an eviction's message),
//! log and writable-layer bytes and inodes
//! from the configured directories, and the usage of the volumes the kubelet counts as
//! local storage (emptyDirs, configMaps, gitRepos) under its pod directory. A pod whose
//! cgroup does not exist yet has no stats, as in the kubelet. A pod cgroup whose files
//! cannot be read for a cycle keeps the figures last read from it, as the kubelet's
//! stats do (cAdvisor keeps each container's samples for two minutes).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::cgroups::{PodCgroupNaming, container_cgroup};
use super::convert::NodePod;
use super::disk_walk::{DiskUsage, DiskWalker, PodDirectories};
use crate::act::is_path_component;
use crate::config::KubernetesConfig;
use crate::pods::{DiskAmount, Pod};
use crate::signals::{CgroupReader, PodCgroupUsage, ProcessCounts};

/// How long a pod cgroup's last figures stand in for ones that cannot be read: cAdvisor's
/// default `storage_duration`, for which the kubelet's stats still hold a container's
/// last sample.
const LAST_FIGURES_KEPT: Duration = Duration::from_secs(120);

/// Measures each pod on the node: its cgroup's figures, read by the cycle, and its disk
/// figures, from the background walker.
#[derive(Debug, Clone)]
pub struct PodUsageReader {
    reader: CgroupReader,
    naming: PodCgroupNaming,
    pod_logs_path: PathBuf,
    kubelet_root_path: PathBuf,
    writable_layer_path: Option<String>,
    disk: DiskWalker,
    /// Whether each pod's processes are counted (only a `pid.available` threshold ranks
    /// by the count).
    process_counts: ProcessCounts,
    /// The cgroup figures last read for each pod, by UID, and when.
    last_figures: Arc<Mutex<HashMap<String, LastFigures>>>,
}

/// A pod cgroup that no longer exists, with no figures of it standing.
#[derive(Debug)]
struct CgroupGone;

/// A pod cgroup's figures as last read: the memory ones and the process count each with
/// the time it was read, since a count can fail to read while the memory files do not.
#[derive(Debug, Clone, Copy)]
struct LastFigures {
    memory_read_at: Instant,
    working_set_bytes: u64,
    usage_bytes: u64,
    process_count: Option<(Instant, u64)>,
}

impl LastFigures {
    /// The figures still standing at `now` (each read within [`LAST_FIGURES_KEPT`]):
    /// `None` without recent memory figures.
    fn standing_at(&self, now: Instant) -> Option<PodCgroupUsage> {
        let recent = now.saturating_duration_since(self.memory_read_at) <= LAST_FIGURES_KEPT;
        recent.then(|| PodCgroupUsage {
            working_set_bytes: self.working_set_bytes,
            usage_bytes: self.usage_bytes,
            process_count: self.process_count_standing_at(now),
            memory_kept_from: None,
        })
    }

    /// The process count if it was read within [`LAST_FIGURES_KEPT`] of `now`, whatever
    /// the age of the memory figures.
    fn process_count_standing_at(&self, now: Instant) -> Option<u64> {
        self.process_count
            .filter(|(read_at, _)| now.saturating_duration_since(*read_at) <= LAST_FIGURES_KEPT)
            .map(|(_, count)| count)
    }
}

impl PodUsageReader {
    pub fn new(reader: CgroupReader, naming: PodCgroupNaming, config: &KubernetesConfig) -> Self {
        PodUsageReader {
            reader,
            naming,
            pod_logs_path: config.pod_logs_path.clone(),
            kubelet_root_path: config.kubelet_root_path.clone(),
            writable_layer_path: config.writable_layer_path.clone(),
            disk: DiskWalker::new(config.disk_walk_max_entries),
            process_counts: ProcessCounts::Read,
            last_figures: Arc::default(),
        }
    }

    /// Count each pod's processes only as `process_counts` says (they are counted
    /// unless told otherwise).
    pub fn counting_processes(mut self, process_counts: ProcessCounts) -> Self {
        self.process_counts = process_counts;
        self
    }

    /// Stop measuring the disk usage of pods that are no longer on the node.
    pub fn retain_pods(&self, uids: &HashSet<String>) {
        self.disk.retain(uids);
        self.last_figures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|uid, _| uids.contains(uid));
    }

    /// Walk every tracked pod's directories now, on this thread (tests and tools; the
    /// agent leaves it to the background walker).
    pub fn walk_disks_now(&self) {
        self.disk.walk_all();
    }

    pub fn naming(&self) -> &PodCgroupNaming {
        &self.naming
    }

    /// The cgroup tree the pods are measured in.
    pub fn cgroups(&self) -> &CgroupReader {
        &self.reader
    }

    /// The pod cgroup's figures: read now, or, when its files cannot be read (cut short,
    /// garbage, a read error), the last ones read within [`LAST_FIGURES_KEPT`]. Without
    /// them the pod would look empty and be ranked as the smallest, and the kubelet's
    /// choice, a larger pod, would be spared for the one cycle a file was unreadable. A
    /// process count alone unreadable takes the last count so read, beside the memory
    /// figures read now. `Err(CgroupGone)` when the cgroup no longer exists and no
    /// figures stand: the pod has no stats, as in the kubelet's summary.
    fn pod_cgroup_usage(
        &self,
        uid: &str,
        cgroup: &std::path::Path,
        now: Instant,
    ) -> Result<Option<PodCgroupUsage>, CgroupGone> {
        let read = self.reader.read_pod_usage(cgroup, self.process_counts);
        let mut last_figures = self
            .last_figures
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match read {
            Ok((usage, count_error)) => {
                let last = last_figures.get(uid).copied();
                // A count read now, or the last one read (its own time kept with it).
                let process_count = match (usage.process_count, &count_error) {
                    (Some(count), _) => Some((now, count)),
                    (None, Some(_)) => last.and_then(|last| last.process_count),
                    (None, None) => None,
                };
                let figures = LastFigures {
                    // Figures kept from an earlier listing stand in for two minutes
                    // from their own read, not from this reuse.
                    memory_read_at: usage.memory_kept_from.unwrap_or(now),
                    working_set_bytes: usage.working_set_bytes,
                    usage_bytes: usage.usage_bytes,
                    process_count,
                };
                // Overwritten in place: no new key for each pod at every cycle.
                match last_figures.get_mut(uid) {
                    Some(kept) => *kept = figures,
                    None => {
                        last_figures.insert(uid.to_string(), figures);
                    }
                }
                // The memory figures just read (or kept within `podStatsMaxAge`, which a
                // woken cycle may use) stand as they are; only a count read earlier is
                // held to its two minutes, from its own read (not the memory figures':
                // those may be kept from up to two minutes before).
                let process_count = figures.process_count_standing_at(now);
                if let Some(error) = count_error {
                    tracing::debug!(%uid, %error, ?process_count, "pod process count unreadable; the last one read stands");
                }
                Ok(Some(PodCgroupUsage {
                    process_count,
                    ..usage
                }))
            }
            Err(error) => {
                let last = last_figures.get(uid).and_then(|last| last.standing_at(now));
                match last {
                    Some(_) => {
                        tracing::debug!(%uid, %error, "pod cgroup unreadable; its last figures stand")
                    }
                    // Removed since the listing found it (a pod ending): no stats, as
                    // for a pod whose cgroup the listing did not find. Told by the
                    // directory, not the error: a file of a cgroup removed as it was
                    // opened reads as ENODEV, and a file missing from a cgroup that
                    // exists (a controller not enabled for it) as ENOENT.
                    None if !self.reader.paths().memory_dir(cgroup).is_dir() => {
                        tracing::debug!(%uid, %error, "pod cgroup gone; no stats");
                        return Err(CgroupGone);
                    }
                    None => tracing::debug!(%uid, %error, "pod cgroup unreadable; no figures"),
                }
                Ok(last)
            }
        }
    }

    /// Fill in `node_pod.pod`'s cgroup and usage, all but its containers' memory
    /// ([`PodUsageReader::measure_containers`]). Leaves usage empty when the pod's cgroup
    /// does not exist (not started yet, or already gone).
    pub fn measure(&self, node_pod: &mut NodePod) {
        self.measure_listed(node_pod, &mut PodCgroupsListed::default());
    }

    /// [`PodUsageReader::measure`] for one pod of a listing: whether the pod's cgroup
    /// exists is looked up in its parent's children, listed once for the whole listing
    /// in `listed`.
    pub fn measure_listed(&self, node_pod: &mut NodePod, listed: &mut PodCgroupsListed) {
        self.measure_at(node_pod, listed, Instant::now());
    }

    /// Whether the pod cgroup `cgroup` exists, by its parent's children as `listed` has
    /// them, or (a parent that cannot be listed) by the cgroup's own directory.
    fn pod_cgroup_exists(&self, cgroup: &Path, listed: &mut PodCgroupsListed) -> bool {
        let own_directory = || self.reader.paths().memory_dir(cgroup).is_dir();
        let (Some(parent), Some(name)) = (cgroup.parent(), cgroup.file_name()) else {
            return own_directory();
        };
        if !listed.children.contains_key(parent.as_os_str()) {
            let children = match self.reader.child_cgroup_names(parent) {
                Ok(names) => Some(names.into_iter().collect()),
                // No QoS cgroup yet: none of its pods has a cgroup.
                Err(error) if error.is_not_found() => Some(HashSet::new()),
                Err(error) => {
                    tracing::debug!(%error, "pod cgroups not listed; each pod's is looked up");
                    None
                }
            };
            listed
                .children
                .insert(parent.as_os_str().to_owned(), children);
        }
        match listed.children.get(parent.as_os_str()) {
            Some(Some(children)) => children.contains(name),
            _ => own_directory(),
        }
    }

    /// Fill in the memory working set of each of `pod`'s running containers, read now
    /// from its cgroup (found among the children of the pod's, which `pod` has when
    /// [`PodUsageReader::measure`] found it); `node_pod` is the pod as converted, with its
    /// containers' runtime ids. Whether any figure was read. Only an eviction's message
    /// uses these figures ("Container app was using …"): see
    /// [`PodSource::measure_containers`](crate::ports::PodSource::measure_containers).
    pub fn measure_containers(&self, node_pod: &NodePod, pod: &mut Pod) -> bool {
        // Without a cgroup the pod's containers have none either. This also keeps the
        // figures from giving stats to a pod that had none, which would change its rank.
        let Some(cgroup) = pod.cgroup.as_deref() else {
            return false;
        };
        let pod_key = pod.key();
        let mut measured = false;
        for container in &mut pod.containers {
            // A container stopped under its id has no cgroup: none is looked for.
            if node_pod.stopped_containers.contains(&container.name) {
                continue;
            }
            let Some(id) = container_id(&node_pod.container_ids, &container.name, &pod_key) else {
                continue;
            };
            let Some(child) = container_cgroup(&self.reader, cgroup, id) else {
                continue;
            };
            match self.reader.pod_memory_usage(&child) {
                Ok((memory, _)) => {
                    container.usage.memory = Some(saturating(memory.working_set_bytes()));
                    measured = true;
                }
                Err(error) => {
                    tracing::debug!(pod = %pod_key, container = %container.name, %error, "container memory unreadable");
                }
            }
        }
        measured
    }

    /// [`PodUsageReader::measure_listed`] at `now`.
    fn measure_at(&self, node_pod: &mut NodePod, listed: &mut PodCgroupsListed, now: Instant) {
        let places = self.places(node_pod);
        self.measure_placed_at(node_pod, places.as_deref(), listed, now);
    }

    /// [`PodUsageReader::measure_listed`] with the pod's [`PodPlaces`] as
    /// [`PodUsageReader::places`] gave them for this pod as converted.
    pub fn measure_placed(
        &self,
        node_pod: &mut NodePod,
        places: Option<&PodPlaces>,
        listed: &mut PodCgroupsListed,
    ) {
        self.measure_placed_at(node_pod, places, listed, Instant::now());
    }

    /// Where `node_pod`'s files are on this node: its cgroup, and the directories of its
    /// logs, writable layers and volumes. `None` for a pod without a UID, or one whose
    /// UID, namespace or name cannot be part of a host path (logged). A container or
    /// volume whose name cannot be is left out (logged). The same for every cycle while
    /// the pod's API object is the same: the pod source keeps them with its conversion.
    pub fn places(&self, node_pod: &NodePod) -> Option<Arc<PodPlaces>> {
        let pod = &node_pod.pod;
        let uid = pod.uid.as_deref()?;
        // These names come from the API and become host paths; a hostile or corrupt one
        // (`..`, `/etc`, `a/b`) must not point the walk or the cgroup reads elsewhere.
        let pod_key = pod.key();
        for (field, value) in [
            ("metadata.uid", uid),
            ("metadata.namespace", pod.namespace.as_str()),
            ("metadata.name", pod.name.as_str()),
        ] {
            if !is_path_component(value) {
                tracing::warn!(pod = %pod_key, field, value, "not usable in a host path; the pod gets no stats");
                return None;
            }
        }
        let log_dir = self
            .pod_logs_path
            .join(format!("{}_{}_{}", pod.namespace, pod.name, uid));
        let mut directories = PodDirectories::default();
        for container in &pod.containers {
            let id = container_id(&node_pod.container_ids, &container.name, &pod_key);
            let logs = usable_in_path(&pod_key, "container name", &container.name)
                .then(|| log_dir.join(&container.name));
            let layer = self
                .writable_layer_path
                .as_ref()
                .zip(id)
                .map(|(template, id)| PathBuf::from(template.replace("{containerId}", id)));
            directories
                .containers
                .push((container.name.clone(), logs, layer));
        }
        let volumes = self
            .kubelet_root_path
            .join("pods")
            .join(uid)
            .join("volumes");
        let empty_dirs = pod
            .empty_dirs
            .iter()
            .map(|volume| (volume.name.as_str(), EMPTY_DIR_DIR));
        let files = node_pod
            .file_volumes
            .iter()
            .map(|volume| (volume.name.as_str(), volume.plugin_dir));
        for (name, plugin_dir) in empty_dirs.chain(files) {
            if usable_in_path(&pod_key, "volume name", name) {
                directories
                    .volumes
                    .push((name.to_string(), volumes.join(plugin_dir).join(name)));
            }
        }
        Some(Arc::new(PodPlaces {
            cgroup: self.naming.pod_cgroup(uid, node_pod.qos),
            directories: Arc::new(directories),
        }))
    }

    /// [`PodUsageReader::measure_placed`] at `now`.
    fn measure_placed_at(
        &self,
        node_pod: &mut NodePod,
        places: Option<&PodPlaces>,
        listed: &mut PodCgroupsListed,
        now: Instant,
    ) {
        let pod = &mut node_pod.pod;
        let Some(uid) = pod.uid.as_deref() else {
            return;
        };
        let Some(places) = places else {
            // Not usable in a host path: the eviction core reads per-container entries
            // as "has stats", and this pod must have none.
            pod.containers.clear();
            return;
        };
        let cgroup = &places.cgroup;
        if !self.pod_cgroup_exists(cgroup, listed) {
            // The eviction core reads per-container entries as "has stats"; the
            // kubelet has none for a pod that has not started.
            pod.containers.clear();
            return;
        }
        let Ok(usage) = self.pod_cgroup_usage(uid, cgroup, now) else {
            pod.containers.clear();
            return;
        };
        if let Some(usage) = usage {
            pod.usage.memory = Some(saturating(usage.working_set_bytes));
            pod.usage.pids = usage.process_count.map(saturating);
        }
        pod.cgroup = Some(cgroup.clone());
        let Some(figures) = self.disk.track(uid, &places.directories) else {
            return;
        };
        let storage = &mut pod.usage.storage;
        for container in &mut pod.containers {
            if let Some((logs, layer)) = figures.containers.get(&container.name) {
                container.usage.logs = logs.map(|usage| usage.bytes);
                container.usage.rootfs = layer.map(|usage| usage.bytes);
                add_part(&mut storage.logs, *logs);
                add_part(&mut storage.writable_layers, *layer);
            }
        }
        for volume in &mut pod.empty_dirs {
            let usage = figures.volumes.get(&volume.name).copied();
            volume.used = usage.map(|usage| usage.bytes);
            // A tmpfs volume is memory, not local storage (the kubelet's
            // IsLocalEphemeralVolume); its sizeLimit is still checked against `used`.
            if !volume.memory_backed {
                add_part(&mut storage.local_volumes, usage);
            }
        }
        for volume in &node_pod.file_volumes {
            add_part(
                &mut storage.local_volumes,
                figures.volumes.get(&volume.name).copied(),
            );
        }
        if let Some(total) = storage.total() {
            pod.usage.ephemeral_storage = Some(total.bytes);
            pod.usage.inodes = Some(total.inodes);
        }
    }
}

/// The runtime's id of container `name` among a pod's `container_ids` (its
/// [`NodePod::container_ids`]), if its status gives one usable in a host path (`pod_key`
/// names the pod in the warning for one that is not).
fn container_id<'a>(
    container_ids: &'a [(String, String)],
    name: &str,
    pod_key: &str,
) -> Option<&'a str> {
    container_ids
        .iter()
        .find(|(container, _)| container == name)
        .map(|(_, id)| id.as_str())
        .filter(|id| usable_in_path(pod_key, "containerID", id))
}

/// Where one pod's files are on the host ([`PodUsageReader::places`]).
#[derive(Debug, PartialEq, Eq)]
pub struct PodPlaces {
    /// The pod's cgroup, relative to the hierarchy roots.
    cgroup: PathBuf,
    /// What the background walker measures; shared with it, so a cycle that hands the
    /// same back is found unchanged without comparing the paths.
    directories: Arc<PodDirectories>,
}

/// The pod cgroups' parents (the QoS cgroups) as one pod listing found them, each listed
/// once: a listing of the few parents costs less than a `stat` of every pod's cgroup,
/// which cost a cycle that ranked on kept figures about as much as the rest of its pod.
#[derive(Debug, Default)]
pub struct PodCgroupsListed {
    /// The names of each parent's child cgroups, by the parent's path (its bytes: a
    /// `PathBuf` key hashes component by component); `None` where it could not be listed.
    children: HashMap<std::ffi::OsString, Option<HashSet<std::ffi::OsString>>>,
}

/// Where the kubelet keeps a pod's emptyDir volumes under its `volumes/` directory.
const EMPTY_DIR_DIR: &str = "kubernetes.io~empty-dir";

/// Add one directory's figures to a storage part; a part stays unmeasured until one of
/// its directories exists.
fn add_part(part: &mut Option<DiskAmount>, usage: Option<DiskUsage>) {
    if let Some(usage) = usage {
        let amount = DiskAmount {
            bytes: usage.bytes,
            inodes: usage.inodes,
        };
        *part = Some(part.unwrap_or_default().saturating_add(amount));
    }
}

fn usable_in_path(pod: &str, field: &str, value: &str) -> bool {
    let usable = is_path_component(value);
    if !usable {
        tracing::warn!(pod, field, value, "not usable in a host path; skipped");
    }
    usable
}

fn saturating(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    use crate::config::CgroupDriver;
    use crate::kubernetes::convert::{CONFIG_MAP_DIR, FileVolume, GIT_REPO_DIR};
    use crate::kubernetes::resources::QosClass;
    use crate::pods::{ContainerStats, EmptyDirStats, Pod};

    /// A fake memory hierarchy: v1 (`memory/…` with `usage_in_bytes`) or v2.
    fn write_cgroup(root: &Path, v1: bool, cgroup: &str, usage: u64, inactive: u64, procs: &str) {
        let dir = if v1 {
            root.join("memory")
        } else {
            root.to_path_buf()
        }
        .join(cgroup.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        let (usage_file, stat) = if v1 {
            (
                "memory.usage_in_bytes",
                format!("total_inactive_file {inactive}\n"),
            )
        } else {
            ("memory.current", format!("inactive_file {inactive}\n"))
        };
        std::fs::write(dir.join(usage_file), format!("{usage}\n")).unwrap();
        std::fs::write(dir.join("memory.stat"), stat).unwrap();
        std::fs::write(
            dir.join(if v1 {
                "memory.limit_in_bytes"
            } else {
                "memory.max"
            }),
            "max\n",
        )
        .unwrap();
        std::fs::write(dir.join("cgroup.procs"), procs).unwrap();
    }

    fn tree(v1: bool) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        if v1 {
            std::fs::create_dir(dir.path().join("memory")).unwrap();
        } else {
            std::fs::write(dir.path().join("cgroup.controllers"), "memory pids\n").unwrap();
        }
        dir
    }

    fn node_pod(qos: QosClass) -> NodePod {
        NodePod {
            pod: Pod {
                namespace: "shop".to_string(),
                name: "web".to_string(),
                uid: Some("1-2".to_string()),
                containers: vec![ContainerStats {
                    name: "app".to_string(),
                    ..Default::default()
                }],
                empty_dirs: vec![EmptyDirStats {
                    name: "scratch".to_string(),
                    size_limit: None,
                    used: None,
                    memory_backed: false,
                }],
                ..Default::default()
            },
            qos,
            container_ids: vec![("app".to_string(), "c0ffee".to_string())],
            stopped_containers: Vec::new(),
            file_volumes: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// The fixture pod's cgroup (cgroupfs driver, Burstable).
    const FIXTURE_POD_CGROUP: &str = "kubepods/burstable/pod1-2";

    /// A tree with the fixture pod's cgroup (usage 900, inactive 100) and its container's
    /// (`c0ffee`: 700 and 50), the files' directory, and a reader of both.
    fn fixture_pod_with_its_container(
        v1: bool,
    ) -> (tempfile::TempDir, tempfile::TempDir, PodUsageReader) {
        let cgroups = tree(v1);
        let files = tempfile::tempdir().unwrap();
        let usage_reader = cgroupfs_reader(cgroups.path(), files.path());
        write_cgroup(cgroups.path(), v1, FIXTURE_POD_CGROUP, 900, 100, "");
        let container = format!("{FIXTURE_POD_CGROUP}/c0ffee");
        write_cgroup(cgroups.path(), v1, &container, 700, 50, "");
        (cgroups, files, usage_reader)
    }

    /// The fixture pod with another UID.
    fn node_pod_with_uid(uid: &str, qos: QosClass) -> NodePod {
        let mut pod = node_pod(qos);
        pod.pod.uid = Some(uid.to_string());
        pod
    }

    fn config(files: &Path) -> KubernetesConfig {
        KubernetesConfig {
            pod_logs_path: files.join("logs"),
            kubelet_root_path: files.join("kubelet"),
            writable_layer_path: Some(format!("{}/layers/{{containerId}}/diff", files.display())),
            ..Default::default()
        }
    }

    #[test]
    fn reads_pod_and_container_usage_on_v1_and_v2_for_both_drivers() {
        for v1 in [true, false] {
            for (driver, pod_cgroup, container_child) in [
                (
                    CgroupDriver::Cgroupfs,
                    "kubepods/burstable/pod1-2",
                    "c0ffee",
                ),
                (
                    CgroupDriver::Systemd,
                    "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice",
                    "cri-containerd-c0ffee.scope",
                ),
            ] {
                let cgroups = tree(v1);
                write_cgroup(cgroups.path(), v1, pod_cgroup, 900, 100, "");
                write_cgroup(
                    cgroups.path(),
                    v1,
                    &format!("{pod_cgroup}/{container_child}"),
                    700,
                    50,
                    "10\n11\n",
                );
                let files = tempfile::tempdir().unwrap();
                let reader = CgroupReader::detect(cgroups.path()).unwrap();
                let usage_reader = PodUsageReader::new(
                    reader,
                    PodCgroupNaming::new(driver, "/kubepods"),
                    &config(files.path()),
                );
                let mut pod = node_pod(QosClass::Burstable);
                usage_reader.measure(&mut pod);
                let label = format!("v1={v1} {driver}");
                assert_eq!(
                    pod.pod.cgroup,
                    Some(PathBuf::from("/").join(pod_cgroup)),
                    "{label}"
                );
                assert_eq!(pod.pod.usage.memory, Some(800), "{label}");
                assert_eq!(pod.pod.usage.pids, Some(2), "{label}");
                // The containers' figures only word an eviction's message: read on
                // request, for the pods evicted.
                assert_eq!(pod.pod.containers[0].usage.memory, None, "{label}");
                assert!(measure_own_containers(&usage_reader, &mut pod), "{label}");
                assert_eq!(pod.pod.containers[0].usage.memory, Some(650), "{label}");
            }
        }
    }

    /// `node_pod`'s containers measured into its own pod, as the pod source measures them
    /// into the listed copy: whether any figure was read.
    fn measure_own_containers(usage_reader: &PodUsageReader, node_pod: &mut NodePod) -> bool {
        let converted = node_pod.clone();
        usage_reader.measure_containers(&converted, &mut node_pod.pod)
    }

    /// A reader of the cgroupfs driver's tree under `cgroups`, with pod files under `files`.
    fn cgroupfs_reader(cgroups: &Path, files: &Path) -> PodUsageReader {
        PodUsageReader::new(
            CgroupReader::detect(cgroups).unwrap(),
            PodCgroupNaming::new(CgroupDriver::Cgroupfs, "/kubepods"),
            &config(files),
        )
    }

    /// Told that no threshold ranks by process count, the reader leaves each pod's count
    /// out (the pod's `cgroup.procs` lists two here) and keeps its memory figure.
    #[test]
    fn process_counts_are_left_out_when_no_threshold_ranks_by_them() {
        let cgroups = tree(false);
        write_cgroup(cgroups.path(), false, "kubepods/pod1-2", 900, 100, "7\n8\n");
        let files = tempfile::tempdir().unwrap();
        let measured = |counts| {
            let usage_reader =
                cgroupfs_reader(cgroups.path(), files.path()).counting_processes(counts);
            let mut pod = node_pod(QosClass::Guaranteed);
            usage_reader.measure(&mut pod);
            (pod.pod.usage.memory, pod.pod.usage.pids)
        };
        assert_eq!(measured(ProcessCounts::NotNeeded), (Some(800), None));
        assert_eq!(measured(ProcessCounts::Read), (Some(800), Some(2)));
    }

    /// In a listing that may reuse pod figures (a cycle a notification starts, with
    /// `podStatsMaxAge`), the pod keeps the memory figures the last timer cycle read; the
    /// process count is read afresh.
    #[test]
    fn a_listing_that_reuses_figures_keeps_the_pods_memory_read_before() {
        use crate::signals::{PodFigures, with_pod_figures};
        let cgroups = tree(false);
        write_cgroup(cgroups.path(), false, "kubepods/pod1-2", 900, 100, "7\n");
        let files = tempfile::tempdir().unwrap();
        let usage_reader = cgroupfs_reader(cgroups.path(), files.path());
        let measured = |figures| {
            let mut pod = node_pod(QosClass::Guaranteed);
            with_pod_figures(figures, Instant::now(), || usage_reader.measure(&mut pod));
            (pod.pod.usage.memory, pod.pod.usage.pids)
        };
        assert_eq!(measured(PodFigures::ReadAndKeep), (Some(800), Some(1)));

        write_cgroup(
            cgroups.path(),
            false,
            "kubepods/pod1-2",
            2_000,
            100,
            "7\n8\n",
        );
        let reuse = PodFigures::ReuseWithin(Duration::from_secs(10));
        assert_eq!(measured(reuse), (Some(800), Some(2)));
        assert_eq!(measured(PodFigures::ReadAndKeep), (Some(1_900), Some(2)));
    }

    /// Figures a woken cycle reused stand in for an unreadable cgroup for two minutes from
    /// their own read, not from the reuse: cAdvisor keeps no sample longer.
    #[test]
    fn reused_figures_stand_in_for_two_minutes_from_their_own_read() {
        use crate::signals::{PodFigures, with_pod_figures};
        let cgroups = tree(false);
        write_cgroup(cgroups.path(), false, "kubepods/pod1-2", 900, 100, "7\n");
        let files = tempfile::tempdir().unwrap();
        let usage_reader = cgroupfs_reader(cgroups.path(), files.path());
        let memory_at = |figures: Option<PodFigures>, now: Instant| {
            let mut pod = node_pod(QosClass::Guaranteed);
            match figures {
                Some(figures) => {
                    with_pod_figures(figures, now, || {
                        usage_reader.measure_at(&mut pod, &mut PodCgroupsListed::default(), now)
                    });
                }
                None => usage_reader.measure_at(&mut pod, &mut PodCgroupsListed::default(), now),
            }
            pod.pod.usage.memory
        };
        let read_at = Instant::now();
        assert_eq!(memory_at(Some(PodFigures::ReadAndKeep), read_at), Some(800));
        let reused_at = read_at + Duration::from_secs(10);
        let reuse = PodFigures::ReuseWithin(Duration::from_secs(10));
        assert_eq!(memory_at(Some(reuse), reused_at), Some(800));

        std::fs::write(
            cgroups.path().join("kubepods/pod1-2/memory.current"),
            "garbage\n",
        )
        .unwrap();
        assert_eq!(
            memory_at(None, read_at + Duration::from_secs(120)),
            Some(800),
            "two minutes after the read the figures still stand"
        );
        assert_eq!(
            memory_at(None, read_at + Duration::from_secs(121)),
            None,
            "past two minutes from the read (111 s after the reuse) they do not"
        );
    }

    /// A count read afresh in a cycle that reuses memory figures kept from nearly two
    /// minutes before stands, even if by the time the pod is measured the kept figures
    /// have passed their two minutes.
    #[test]
    fn a_fresh_process_count_stands_beside_memory_figures_kept_from_two_minutes_before() {
        use crate::signals::{PodFigures, with_pod_figures};
        let cgroups = tree(false);
        write_cgroup(cgroups.path(), false, "kubepods/pod1-2", 900, 100, "7\n8\n");
        let files = tempfile::tempdir().unwrap();
        let usage_reader = cgroupfs_reader(cgroups.path(), files.path());
        let measure_within = |figures: PodFigures, listed_at: Instant, measured_at: Instant| {
            let mut pod = node_pod(QosClass::Guaranteed);
            with_pod_figures(figures, listed_at, || {
                usage_reader.measure_at(&mut pod, &mut PodCgroupsListed::default(), measured_at)
            });
            (pod.pod.usage.memory, pod.pod.usage.pids)
        };
        let read_at = Instant::now();
        assert_eq!(
            measure_within(PodFigures::ReadAndKeep, read_at, read_at),
            (Some(800), Some(2))
        );
        write_cgroup(
            cgroups.path(),
            false,
            "kubepods/pod1-2",
            2000,
            100,
            "7\n8\n9\n",
        );
        let listed_at = read_at + LAST_FIGURES_KEPT;
        let reuse = PodFigures::ReuseWithin(LAST_FIGURES_KEPT);
        assert_eq!(
            measure_within(reuse, listed_at, listed_at + Duration::from_millis(1)),
            (Some(800), Some(3)),
            "memory kept from the listing two minutes on, the count read now"
        );
    }

    #[test]
    fn a_pod_without_a_cgroup_has_no_stats() {
        let cgroups = tree(false);
        let files = tempfile::tempdir().unwrap();
        let usage_reader = cgroupfs_reader(cgroups.path(), files.path());
        let mut pod = node_pod(QosClass::Guaranteed);
        usage_reader.measure(&mut pod);
        assert!(!pod.pod.has_stats());
        assert_eq!(pod.pod.cgroup, None);
    }

    /// A listing finds each pod's cgroup among its QoS parent's children, listed once for
    /// all its pods: a pod whose cgroup is there has stats, one whose cgroup is not (not
    /// started, or gone), or whose QoS parent does not exist yet, has none.
    #[test]
    fn a_listing_finds_each_pods_cgroup_among_its_parents_children() {
        for v1 in [true, false] {
            let cgroups = tree(v1);
            let files = tempfile::tempdir().unwrap();
            let usage_reader = cgroupfs_reader(cgroups.path(), files.path());
            write_cgroup(
                cgroups.path(),
                v1,
                "kubepods/burstable/podstarted",
                900,
                100,
                "",
            );
            write_cgroup(
                cgroups.path(),
                v1,
                "kubepods/burstable/podstarted/c0ffee",
                700,
                50,
                "",
            );
            let pod = node_pod_with_uid;
            let mut listed = PodCgroupsListed::default();
            let mut started = pod("started", QosClass::Burstable);
            let mut waiting = pod("waiting", QosClass::Burstable);
            let mut best_effort = pod("started", QosClass::BestEffort);
            for pod in [&mut started, &mut waiting, &mut best_effort] {
                usage_reader.measure_listed(pod, &mut listed);
            }
            assert_eq!(started.pod.usage.memory, Some(800), "v1={v1}");
            for (label, pod) in [("no cgroup", &waiting), ("no QoS parent", &best_effort)] {
                assert!(!pod.pod.has_stats(), "v1={v1} {label}: {:?}", pod.pod);
                assert_eq!(pod.pod.cgroup, None, "v1={v1} {label}");
            }
            // A cgroup made after its parent was listed is not seen by that listing (the
            // parent is listed once, not each pod looked up), and is by the next one.
            write_cgroup(
                cgroups.path(),
                v1,
                "kubepods/burstable/podwaiting",
                300,
                0,
                "",
            );
            let mut waiting = pod("waiting", QosClass::Burstable);
            usage_reader.measure_listed(&mut waiting, &mut listed);
            assert!(
                !waiting.pod.has_stats(),
                "v1={v1}: listed before it was made"
            );
            usage_reader.measure_listed(&mut waiting, &mut PodCgroupsListed::default());
            assert_eq!(waiting.pod.usage.memory, Some(300), "v1={v1}");
        }
    }

    /// A pod whose cgroup its listing found but which is gone by its read (the pod
    /// ended in between) has no stats, as one the listing did not find, unless figures
    /// read from it within two minutes stand.
    #[test]
    fn a_pod_cgroup_gone_between_the_listing_and_its_read_has_no_stats_without_recent_figures() {
        for v1 in [true, false] {
            let cgroups = tree(v1);
            let files = tempfile::tempdir().unwrap();
            let usage_reader = cgroupfs_reader(cgroups.path(), files.path());
            let memory = if v1 { "memory" } else { "" };
            for uid in ["first", "ending", "known"] {
                write_cgroup(
                    cgroups.path(),
                    v1,
                    &format!("kubepods/burstable/pod{uid}"),
                    500,
                    0,
                    "",
                );
            }
            let pod = |uid| node_pod_with_uid(uid, QosClass::Burstable);
            // Figures of "known" read in an earlier listing.
            usage_reader.measure_listed(&mut pod("known"), &mut PodCgroupsListed::default());
            let mut listed = PodCgroupsListed::default();
            let mut first = pod("first");
            usage_reader.measure_listed(&mut first, &mut listed);
            assert_eq!(first.pod.usage.memory, Some(500), "v1={v1}");
            for uid in ["ending", "known"] {
                let dir = cgroups
                    .path()
                    .join(memory)
                    .join(format!("kubepods/burstable/pod{uid}"));
                std::fs::remove_dir_all(dir).unwrap();
            }
            let (mut ending, mut known) = (pod("ending"), pod("known"));
            usage_reader.measure_listed(&mut ending, &mut listed);
            usage_reader.measure_listed(&mut known, &mut listed);
            assert!(!ending.pod.has_stats(), "v1={v1}: {:?}", ending.pod);
            assert_eq!(ending.pod.cgroup, None, "v1={v1}");
            assert_eq!(
                known.pod.usage.memory,
                Some(500),
                "v1={v1}: its last figures stand"
            );
        }
    }

    /// A container's cgroup is found by its runtime id among its pod cgroup's children,
    /// as the runtime names it, at each request: not a cgroup whose name only holds the id
    /// (CRI-O's `crio-conmon-<id>.scope` beside its container's, which a listing may give
    /// first); once it is gone the container has no figure, and the container that
    /// replaced it (a restart: a new id) is found.
    #[test]
    fn a_containers_cgroup_is_found_by_its_id_until_it_goes_and_its_successor_is_found() {
        for v1 in [true, false] {
            let (cgroups, _files, usage_reader) = fixture_pod_with_its_container(v1);
            let pod_cgroup = FIXTURE_POD_CGROUP;
            let measure = |id: &str| {
                let mut pod = node_pod(QosClass::Burstable);
                pod.container_ids = vec![("app".to_string(), id.to_string())];
                usage_reader.measure(&mut pod);
                let measured = measure_own_containers(&usage_reader, &mut pod);
                let memory = pod.pod.containers[0].usage.memory;
                assert_eq!(measured, memory.is_some(), "v1={v1} {id}");
                memory
            };
            for decoy in ["a-c0ffee", "crio-conmon-c0ffee.scope", "c0ffee-b"] {
                write_cgroup(
                    cgroups.path(),
                    v1,
                    &format!("{pod_cgroup}/{decoy}"),
                    100,
                    0,
                    "",
                );
            }
            assert_eq!(measure("c0ffee"), Some(650), "v1={v1}");
            let memory = if v1 { "memory" } else { "" };
            let container_dir = cgroups.path().join(memory).join(pod_cgroup).join("c0ffee");
            let usage_file = if v1 {
                "memory.usage_in_bytes"
            } else {
                "memory.current"
            };
            std::fs::write(container_dir.join(usage_file), "720\n").unwrap();
            assert_eq!(measure("c0ffee"), Some(670), "v1={v1}: read afresh");
            std::fs::remove_dir_all(&container_dir).unwrap();
            assert_eq!(
                measure("c0ffee"),
                None,
                "v1={v1}: the container's cgroup is gone"
            );
            write_cgroup(
                cgroups.path(),
                v1,
                &format!("{pod_cgroup}/crio-decaf.scope"),
                400,
                0,
                "",
            );
            assert_eq!(
                measure("decaf"),
                Some(400),
                "v1={v1}: the restarted container"
            );
        }
    }

    /// A container whose status says it stopped (a completed init container, one waiting
    /// to start again) has no cgroup under the id the status gives: none is looked for,
    /// and it has no memory figure, while its pod's is read as ever. A pod without a
    /// cgroup has no container figures either.
    #[test]
    fn a_stopped_container_is_not_looked_for() {
        for v1 in [true, false] {
            // A cgroup left under the id (as a runtime leaves none): still not read.
            let (_cgroups, _files, usage_reader) = fixture_pod_with_its_container(v1);
            let mut pod = node_pod(QosClass::Burstable);
            pod.stopped_containers = vec!["app".to_string()];
            usage_reader.measure(&mut pod);
            assert_eq!(pod.pod.usage.memory, Some(800), "v1={v1}");
            assert!(!measure_own_containers(&usage_reader, &mut pod), "v1={v1}");
            assert_eq!(pod.pod.containers[0].usage.memory, None, "v1={v1}");
            let mut unlisted = node_pod(QosClass::Burstable);
            assert!(
                !usage_reader.measure_containers(&pod, &mut unlisted.pod),
                "v1={v1}"
            );
            assert_eq!(unlisted.pod.containers[0].usage.memory, None, "v1={v1}");
        }
    }

    /// A pod cgroup that exists but whose files cannot be read (here its memory usage
    /// file is missing, as where a controller is not enabled for it) is not taken for
    /// gone: the pod keeps its cgroup, so it has stats, with no memory figure.
    #[test]
    fn a_pod_cgroup_with_a_file_missing_is_not_taken_for_gone() {
        let cgroups = tree(false);
        let files = tempfile::tempdir().unwrap();
        let usage_reader = cgroupfs_reader(cgroups.path(), files.path());
        write_cgroup(
            cgroups.path(),
            false,
            "kubepods/burstable/pod1-2",
            900,
            100,
            "",
        );
        let dir = cgroups.path().join("kubepods/burstable/pod1-2");
        std::fs::remove_file(dir.join("memory.current")).unwrap();
        let mut pod = node_pod(QosClass::Burstable);
        usage_reader.measure(&mut pod);
        assert_eq!(
            pod.pod.cgroup,
            Some(PathBuf::from("/kubepods/burstable/pod1-2"))
        );
        assert_eq!(pod.pod.usage.memory, None);
        assert!(pod.pod.has_stats());
    }

    /// The fixture pod's memory and process count, measured at `now`.
    fn memory_and_pids(usage_reader: &PodUsageReader, now: Instant) -> (Option<i64>, Option<i64>) {
        let mut pod = node_pod(QosClass::Guaranteed);
        usage_reader.measure_at(&mut pod, &mut PodCgroupsListed::default(), now);
        (pod.pod.usage.memory, pod.pod.usage.pids)
    }

    /// issue 16: a pod file cut short or garbage for a cycle. The kubelet's stats still
    /// hold the last sample cAdvisor read, for two minutes; a pod measured as empty would
    /// rank as the smallest and spare the pod the kubelet would evict.
    #[test]
    fn an_unreadable_pod_cgroup_keeps_its_last_figures_for_two_minutes() {
        let cgroups = tree(false);
        let whole = || {
            write_cgroup(
                cgroups.path(),
                false,
                "kubepods/pod1-2",
                3000,
                1000,
                "7\n8\n",
            )
        };
        whole();
        let files = tempfile::tempdir().unwrap();
        let usage_reader = cgroupfs_reader(cgroups.path(), files.path());
        let measured = |now| memory_and_pids(&usage_reader, now);
        let start = Instant::now();
        assert_eq!(measured(start), (Some(2000), Some(2)));
        let current = cgroups.path().join("kubepods/pod1-2/memory.current");
        let stat = cgroups.path().join("kubepods/pod1-2/memory.stat");
        for (file, broken) in [
            (&current, "31"),
            (&stat, "inactive_file x\n"),
            (&current, ""),
        ] {
            std::fs::write(file, broken).unwrap();
            assert_eq!(
                measured(start + Duration::from_secs(120)),
                (Some(2000), Some(2)),
                "{} holding {broken:?}",
                file.display()
            );
            assert_eq!(
                measured(start + Duration::from_secs(121)),
                (None, None),
                "{} holding {broken:?}, two minutes on",
                file.display()
            );
            whole();
        }
        // Read again: the new figures are the ones kept.
        write_cgroup(cgroups.path(), false, "kubepods/pod1-2", 500, 100, "7\n");
        let later = start + Duration::from_secs(200);
        assert_eq!(measured(later), (Some(400), Some(1)));
        std::fs::write(&current, "31").unwrap();
        assert_eq!(
            measured(later + Duration::from_secs(1)),
            (Some(400), Some(1))
        );
        // A pod gone from the node takes its figures with it: one with its UID back has none.
        usage_reader.retain_pods(&HashSet::new());
        assert_eq!(measured(later + Duration::from_secs(2)), (None, None));
    }

    /// The process count alone unreadable: the memory figure is the one read now (a
    /// `pid.available` threshold must not change how the pod ranks for memory), and the
    /// count is the last one read, for two minutes from its own read.
    #[test]
    fn an_unreadable_process_count_keeps_the_memory_read_now_and_the_last_count() {
        let cgroups = tree(false);
        write_cgroup(
            cgroups.path(),
            false,
            "kubepods/pod1-2",
            3000,
            1000,
            "7\n8\n",
        );
        let files = tempfile::tempdir().unwrap();
        let usage_reader = cgroupfs_reader(cgroups.path(), files.path());
        let measured = |now| memory_and_pids(&usage_reader, now);
        let start = Instant::now();
        assert_eq!(measured(start), (Some(2000), Some(2)));
        let pod_dir = cgroups.path().join("kubepods/pod1-2");
        std::fs::write(pod_dir.join("pids.current"), "garbage\n").unwrap();
        std::fs::write(pod_dir.join("memory.current"), "5000\n").unwrap();
        assert_eq!(
            measured(start + Duration::from_secs(120)),
            (Some(4000), Some(2))
        );
        assert_eq!(
            measured(start + Duration::from_secs(121)),
            (Some(4000), None),
            "two minutes on, no count; the memory figure still read"
        );
        // The memory files fail too: the memory figures last read (at 121 s, while the
        // count failed) stand for two minutes from then, not from the last whole read.
        std::fs::write(pod_dir.join("memory.current"), "garbage\n").unwrap();
        assert_eq!(
            measured(start + Duration::from_secs(241)),
            (Some(4000), None)
        );
        assert_eq!(measured(start + Duration::from_secs(242)), (None, None));
    }

    #[test]
    fn measures_logs_writable_layer_and_empty_dirs() {
        let cgroups = tree(false);
        write_cgroup(cgroups.path(), false, "kubepods/pod1-2", 10, 0, "");
        let files = tempfile::tempdir().unwrap();
        let logs = files.path().join("logs/shop_web_1-2/app");
        std::fs::create_dir_all(&logs).unwrap();
        std::fs::write(logs.join("0.log"), vec![b'x'; 64 * 1024]).unwrap();
        let layer = files.path().join("layers/c0ffee/diff/tmp");
        std::fs::create_dir_all(&layer).unwrap();
        std::fs::write(layer.join("big"), vec![b'y'; 128 * 1024]).unwrap();
        let volume = files
            .path()
            .join("kubelet/pods/1-2/volumes/kubernetes.io~empty-dir/scratch");
        std::fs::create_dir_all(&volume).unwrap();
        std::fs::write(volume.join("data"), vec![b'z'; 32 * 1024]).unwrap();
        let tmpfs = files
            .path()
            .join("kubelet/pods/1-2/volumes/kubernetes.io~empty-dir/shm");
        std::fs::create_dir_all(&tmpfs).unwrap();
        std::fs::write(tmpfs.join("data"), vec![b'm'; 16 * 1024]).unwrap();
        let with_tmpfs = || {
            let mut pod = node_pod(QosClass::Guaranteed);
            pod.pod.empty_dirs.push(EmptyDirStats {
                name: "shm".to_string(),
                memory_backed: true,
                ..Default::default()
            });
            pod
        };
        let usage_reader = cgroupfs_reader(cgroups.path(), files.path());
        let mut pod = with_tmpfs();
        usage_reader.measure(&mut pod);
        assert_eq!(
            pod.pod.usage.ephemeral_storage, None,
            "the cycle never walks the disk itself"
        );
        usage_reader.walk_disks_now();
        let mut pod = with_tmpfs();
        usage_reader.measure(&mut pod);
        let container = &pod.pod.containers[0].usage;
        let logs_bytes = container.logs.unwrap();
        let rootfs_bytes = container.rootfs.unwrap();
        let volume_bytes = pod.pod.empty_dirs[0].used.unwrap();
        assert!(logs_bytes >= 64 * 1024, "{logs_bytes}");
        assert!(
            rootfs_bytes >= 128 * 1024 && rootfs_bytes > logs_bytes,
            "{rootfs_bytes}"
        );
        assert!(volume_bytes >= 32 * 1024, "{volume_bytes}");
        assert_eq!(
            pod.pod.usage.ephemeral_storage,
            Some(logs_bytes + rootfs_bytes + volume_bytes)
        );
        // Directories count as inodes: app/ + 0.log, diff/ + tmp/ + big, scratch/ + data.
        assert_eq!(pod.pod.usage.inodes, Some(7));
        // The same storage by part, for the disk signals of a dedicated imagefs.
        let storage = pod.pod.usage.storage;
        let part = |bytes, inodes| Some(DiskAmount { bytes, inodes });
        assert_eq!(storage.logs, part(logs_bytes, 2));
        assert_eq!(storage.writable_layers, part(rootfs_bytes, 3));
        assert_eq!(storage.local_volumes, part(volume_bytes, 2));
        // The memory-backed volume is measured for its sizeLimit but is not storage.
        assert!(pod.pod.empty_dirs[1].used.unwrap() >= 16 * 1024);
    }

    /// The kubelet's `podLocalVolumeUsage`: a configMap or gitRepo volume counts in the
    /// pod's local storage as its emptyDir does, so in its ephemeral-storage figure (the
    /// limit checks) and in the local-volume part every nodefs ranking counts.
    #[test]
    fn config_map_and_git_repo_volumes_count_as_local_storage() {
        let cgroups = tree(false);
        write_cgroup(cgroups.path(), false, "kubepods/pod1-2", 10, 0, "");
        let files = tempfile::tempdir().unwrap();
        let volumes = files.path().join("kubelet/pods/1-2/volumes");
        for (dir, bytes) in [
            ("kubernetes.io~empty-dir/scratch", 32),
            ("kubernetes.io~configmap/settings", 8),
            ("kubernetes.io~git-repo/source", 64),
            // Not measured: a secret volume is tmpfs.
            ("kubernetes.io~secret/token", 256),
        ] {
            let dir = volumes.join(dir);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("data"), vec![b'v'; bytes * 1024]).unwrap();
        }
        let with_files = || {
            let mut pod = node_pod(QosClass::Guaranteed);
            pod.file_volumes = vec![
                FileVolume {
                    name: "settings".to_string(),
                    plugin_dir: CONFIG_MAP_DIR,
                },
                FileVolume {
                    name: "source".to_string(),
                    plugin_dir: GIT_REPO_DIR,
                },
            ];
            pod
        };
        let usage_reader = cgroupfs_reader(cgroups.path(), files.path());
        usage_reader.measure(&mut with_files());
        usage_reader.walk_disks_now();
        let mut pod = with_files();
        usage_reader.measure(&mut pod);
        let storage = pod.pod.usage.storage;
        let local = storage.local_volumes.expect("local volumes measured");
        // Three directories and three files, (32 + 8 + 64) KiB of data.
        assert_eq!(local.inodes, 6);
        assert!(
            local.bytes >= 104 * 1024 && local.bytes < 256 * 1024,
            "{} bytes: the emptyDir, configMap and gitRepo, not the secret",
            local.bytes
        );
        assert_eq!(pod.pod.usage.ephemeral_storage, Some(local.bytes));
        assert!(
            pod.pod.empty_dirs[0].used.unwrap() < 64 * 1024,
            "the emptyDir's own figure, for its sizeLimit, is its alone"
        );
    }

    #[test]
    fn names_from_the_api_never_lead_the_walk_outside_the_pod_directories() {
        let cgroups = tree(false);
        write_cgroup(cgroups.path(), false, "kubepods/pod1-2", 10, 0, "");
        let files = tempfile::tempdir().unwrap();
        // Something an escaping name would reach: the whole test directory is bigger than
        // any legitimate figure below.
        let secret = files.path().join("secret");
        std::fs::create_dir_all(&secret).unwrap();
        std::fs::write(secret.join("big"), vec![b's'; 256 * 1024]).unwrap();
        let usage_reader = cgroupfs_reader(cgroups.path(), files.path());
        let absolute = secret.display().to_string();
        for hostile in [absolute.as_str(), "..", "../../secret", "a/b", "."] {
            let mut pod = node_pod(QosClass::Guaranteed);
            pod.pod.containers[0].name = hostile.to_string();
            pod.pod.empty_dirs[0].name = hostile.to_string();
            pod.file_volumes = vec![FileVolume {
                name: hostile.to_string(),
                plugin_dir: CONFIG_MAP_DIR,
            }];
            pod.container_ids[0] = (hostile.to_string(), hostile.to_string());
            usage_reader.measure(&mut pod.clone());
            usage_reader.walk_disks_now();
            usage_reader.measure(&mut pod);
            assert_eq!(pod.pod.containers[0].usage.logs, None, "{hostile}");
            assert_eq!(pod.pod.containers[0].usage.rootfs, None, "{hostile}");
            assert_eq!(pod.pod.empty_dirs[0].used, None, "{hostile}");
            assert_eq!(pod.pod.usage.ephemeral_storage, None, "{hostile}");
            assert_eq!(pod.pod.usage.memory, Some(10), "the cgroup is still read");

            for field in ["uid", "name"] {
                let mut pod = node_pod(QosClass::Guaranteed);
                match field {
                    "uid" => pod.pod.uid = Some(hostile.to_string()),
                    _ => pod.pod.name = hostile.to_string(),
                }
                usage_reader.measure(&mut pod);
                assert!(!pod.pod.has_stats(), "{field}={hostile}");
                assert_eq!(pod.pod.cgroup, None, "{field}={hostile}");
            }
        }
    }
}
