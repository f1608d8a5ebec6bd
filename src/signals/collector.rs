//! The live collector: reads cgroupfs, procfs and statvfs into [`Observations`] once per call.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::cgroup::CgroupReader;
use super::error::{ErrorSubject, FileError, FileProblem, SignalError};
use super::fileio::{is_not_found, read_u64, with_file_text};
use super::filesystem::{FsStats, FsTarget, stat_filesystem};
use super::host::Host;
use super::layout::{CgroupLayout, LayoutError};
use super::memory::MemoryUsage;
use super::parse::{MemInfo, flat_keyed_u64, loadavg_process_count, meminfo};
use super::pressure::{PressureReading, PressureResource, PressureScope, read_pressure_file};
use super::{Observation, Observations, Signal};
use crate::config::HostPaths;

/// Everything one collection saw. A signal whose files could not be read is missing from
/// `observations` and has an entry in `errors`; the other signals are unaffected.
#[derive(Debug, Default)]
pub struct Collection {
    pub observations: Observations,
    /// The cgroup memory figures behind each memory signal's observation (the root
    /// cgroup's for `memory.available`, the pods cgroup's for
    /// `allocatableMemory.available`), so the memcg notifiers set their triggers from
    /// this collection's reads instead of reading the same files again.
    pub memory_usage: BTreeMap<Signal, MemoryUsage>,
    pub pressure: Vec<PressureReading>,
    pub errors: Vec<SignalError>,
    /// The huge page pool taken out of `memory.available` (0 when there is none, or the
    /// gate is off), so a person reading the figure knows why it is lower than
    /// `MemTotal` less the working set.
    pub hugepages_subtracted: u64,
}

/// Reads the node's eviction signals. Paths are resolved once, at construction, so a
/// collection only opens and reads files.
#[derive(Debug)]
pub struct SignalCollector {
    cgroups: Result<CgroupReader, LayoutError>,
    meminfo: PathBuf,
    loadavg: PathBuf,
    pid_max: PathBuf,
    threads_max: PathBuf,
    pods_cgroup: Option<PathBuf>,
    nodefs: FsTarget,
    imagefs: Option<FsTarget>,
    containerfs: Option<FsTarget>,
    node_pressure: [(PressureResource, PathBuf); 3],
    /// The pods cgroup's `memory.pressure` and `io.pressure`, on a v2 hierarchy.
    pods_pressure: Vec<(PressureResource, PressureScope, PathBuf)>,
    /// Take the huge page pool out of `memory.available` (`HugepageAwareEviction`).
    hugepage_aware: bool,
    notes: Vec<String>,
}

impl SignalCollector {
    /// A collector for the host under `paths`, detecting its cgroup layout itself: for
    /// one-off commands and tests. The agent detects its host once and uses
    /// [`SignalCollector::for_host`].
    pub fn new(paths: &HostPaths) -> Self {
        Self::for_host(&Host::detect(paths))
    }

    /// A collector for a host already detected.
    pub fn for_host(host: &Host) -> Self {
        let paths = host.paths();
        let cgroups = host.cgroup_detection().clone();
        let proc_root = &paths.proc_root;
        let mut notes = Vec::new();
        let mut resolve = |name: &str, configured: &Path| {
            let target = FsTarget::resolve(configured);
            if target.is_fallback() {
                let note = format!(
                    "{name} path {} does not exist; measuring the filesystem of its nearest existing ancestor {}",
                    target.configured.display(),
                    target.measured.display()
                );
                tracing::warn!("{note}");
                notes.push(note);
            }
            target
        };
        let nodefs = resolve("nodefs", &paths.nodefs);
        let imagefs = paths.imagefs.as_deref().map(|p| resolve("imagefs", p));
        let containerfs = paths
            .containerfs
            .as_deref()
            .map(|p| resolve("containerfs", p));
        let pressure_dir = proc_root.join("pressure");
        let node_pressure =
            PressureResource::ALL.map(|resource| (resource, pressure_dir.join(resource.as_str())));
        let pods_pressure = match (&cgroups, &paths.pods_cgroup) {
            (Ok(reader), Some(pods)) => reader
                .paths()
                .v2_dir(pods)
                .map(|dir| {
                    [PressureResource::Memory, PressureResource::Io].map(|resource| {
                        (
                            resource,
                            PressureScope::Cgroup(pods.clone()),
                            dir.join(format!("{resource}.pressure")),
                        )
                    })
                })
                .into_iter()
                .flatten()
                .collect(),
            _ => Vec::new(),
        };
        SignalCollector {
            cgroups,
            meminfo: proc_root.join("meminfo"),
            loadavg: proc_root.join("loadavg"),
            pid_max: proc_root.join("sys/kernel/pid_max"),
            threads_max: proc_root.join("sys/kernel/threads-max"),
            pods_cgroup: paths.pods_cgroup.clone(),
            nodefs,
            imagefs,
            containerfs,
            node_pressure,
            pods_pressure,
            hugepage_aware: true,
            notes,
        }
    }

    /// Whether `memory.available` leaves out the huge page pool, as the kubelet's
    /// `HugepageAwareEviction` gate (on by default from 1.37) makes it; on unless turned
    /// off here.
    pub fn hugepage_aware(mut self, enabled: bool) -> Self {
        self.hugepage_aware = enabled;
        self
    }

    /// The cgroup reader, when a cgroup hierarchy was found; per-pod usage goes through it.
    pub fn cgroups(&self) -> Option<&CgroupReader> {
        self.cgroups.as_ref().ok()
    }

    pub fn layout(&self) -> Option<CgroupLayout> {
        self.cgroups().map(CgroupReader::layout)
    }

    /// The layout for people: `hybrid (cgroup v1 memory, v2 at unified/)`, or `none found`.
    pub fn describe_layout(&self) -> String {
        self.layout()
            .map_or_else(|| "none found".to_string(), |layout| layout.to_string())
    }

    /// Things an operator should know about how this host is measured (path fallbacks),
    /// worked out once at construction.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    pub fn collect(&self) -> Collection {
        let mut collection = Collection {
            observations: Observations::new(),
            memory_usage: BTreeMap::new(),
            pressure: Vec::with_capacity(8),
            errors: Vec::new(),
            hugepages_subtracted: 0,
        };
        let meminfo = with_file_text(&self.meminfo, meminfo);
        self.collect_memory(&meminfo, &mut collection);
        self.collect_allocatable(&meminfo, &mut collection);
        self.collect_filesystems(&mut collection);
        self.collect_pids(&mut collection);
        self.collect_pressure(&mut collection);
        collection
    }

    fn collect_memory(&self, meminfo: &Result<MemInfo, FileError>, out: &mut Collection) {
        let result = self.reader().and_then(|reader| {
            let info = meminfo.as_ref().map_err(FileError::duplicate)?;
            let (usage, counts_hugepages) = root_memory_usage(reader, info, &self.meminfo)?;
            // The pool is in MemTotal but in no memory cgroup's working set.
            let hugepages = if self.hugepage_aware && !counts_hugepages {
                info.hugepage_pool
            } else {
                0
            };
            out.hugepages_subtracted = hugepages;
            Ok((memory_observation(info.total, hugepages, usage), usage))
        });
        record_memory(out, Signal::MemoryAvailable, result);
    }

    fn collect_allocatable(&self, meminfo: &Result<MemInfo, FileError>, out: &mut Collection) {
        let Some(pods) = &self.pods_cgroup else {
            return;
        };
        let result = self.reader().and_then(|reader| {
            let usage = reader.memory_usage(pods)?;
            let capacity = match reader.memory_limit(pods)? {
                Some(limit) => limit,
                None => meminfo.as_ref().map_err(FileError::duplicate)?.total,
            };
            // The kubelet adjusts only the node's figure, not the pods container's.
            Ok((memory_observation(capacity, 0, usage), usage))
        });
        record_memory(out, Signal::AllocatableMemoryAvailable, result);
    }

    fn collect_filesystems(&self, out: &mut Collection) {
        let stat = |target: &FsTarget| {
            stat_filesystem(&target.measured).map_err(|p| FileError::new(&target.measured, p))
        };
        let nodefs = stat(&self.nodefs);
        // Without a dedicated imagefs the kubelet reports imagefs from the nodefs
        // filesystem, and containerfs follows imagefs unless it has its own.
        let imagefs = match &self.imagefs {
            Some(target) => stat(target),
            None => copy_result(&nodefs),
        };
        let containerfs = match &self.containerfs {
            Some(target) => stat(target),
            None => copy_result(&imagefs),
        };
        for (stats, available, inodes) in [
            (nodefs, Signal::NodeFsAvailable, Signal::NodeFsInodesFree),
            (imagefs, Signal::ImageFsAvailable, Signal::ImageFsInodesFree),
            (
                containerfs,
                Signal::ContainerFsAvailable,
                Signal::ContainerFsInodesFree,
            ),
        ] {
            record(
                out,
                available,
                copy_result(&stats).map(|s| observation(s.available_bytes, s.capacity_bytes)),
            );
            record(
                out,
                inodes,
                stats.map(|s| observation(s.inodes_free, s.inodes)),
            );
        }
    }

    fn collect_pids(&self, out: &mut Collection) {
        let result = (|| {
            let max_pid = read_u64(&self.pid_max)?.min(read_u64(&self.threads_max)?);
            let running = with_file_text(&self.loadavg, loadavg_process_count)?;
            Ok(Observation {
                available: to_i64(max_pid) - to_i64(running),
                capacity: to_i64(max_pid),
                sampled_at_ms: None,
            })
        })();
        record(out, Signal::PidAvailable, result);
    }

    fn collect_pressure(&self, out: &mut Collection) {
        let node = PressureScope::Node;
        for (resource, path) in &self.node_pressure {
            if let Err(e) = read_pressure_file(path, *resource, &node, &mut out.pressure) {
                out.errors
                    .push(e.for_subject(ErrorSubject::Pressure(*resource)));
            }
        }
        for (resource, scope, path) in &self.pods_pressure {
            if let Err(e) = read_pressure_file(path, *resource, scope, &mut out.pressure) {
                out.errors
                    .push(e.for_subject(ErrorSubject::Pressure(*resource)));
            }
        }
    }

    fn reader(&self) -> Result<&CgroupReader, FileError> {
        self.cgroups.as_ref().map_err(|layout| {
            FileError::new(
                &layout.cgroup_root,
                FileProblem::Malformed(layout.to_string()),
            )
        })
    }
}

/// The root cgroup's memory, and whether its usage already counts the huge page pool.
///
/// A v1 memory root, and a v2 root inside a container, have usage files, which leave the
/// pool out (huge pages are charged to the hugetlb controller). The real v2 root has no
/// `memory.current`; the kubelet's cgroup library (opencontainers/cgroups, as runc 1.2
/// and later) then takes usage as `anon + file` from the root `memory.stat`, which also
/// leaves the pool out. Only where the root has no `memory.stat` at all (older kernels)
/// does usage come from `/proc/meminfo` as `MemTotal − MemFree`, as runc before 1.2 took
/// it; the pool is not free memory, so that usage already counts it.
fn root_memory_usage(
    reader: &CgroupReader,
    info: &MemInfo,
    meminfo_path: &Path,
) -> Result<(MemoryUsage, bool), FileError> {
    let root = Path::new("/");
    match reader.memory_usage(root) {
        Ok(usage) => Ok((usage, false)),
        Err(e)
            if reader.layout() == CgroupLayout::Unified
                && is_not_found(&e)
                && e.path.ends_with("memory.current") =>
        {
            let stat = reader.paths().memory_dir(root).join("memory.stat");
            // One read of the file for all three figures. A kernel without a root
            // memory.stat takes the figure from meminfo. A file there is written whole by
            // the kernel, so one cut short, emptied, garbled or lacking any of the three
            // is an error, never a switch to the other formula, whose usage also counts
            // kernel memory and would take gigabytes off available for a cycle.
            let figures = with_file_text(&stat, |text| {
                Ok((
                    flat_keyed_u64(text, "anon")?,
                    flat_keyed_u64(text, "file")?,
                    flat_keyed_u64(text, "inactive_file")?,
                ))
            });
            let (anon, file, inactive_file_bytes) = match figures {
                Ok(figures) => figures,
                Err(error) if is_not_found(&error) => {
                    let inactive_file_bytes = info.inactive_file.ok_or_else(|| {
                        FileError::new(meminfo_path, FileProblem::MissingKey("Inactive(file)"))
                    })?;
                    return Ok((
                        MemoryUsage {
                            usage_bytes: info.total.saturating_sub(info.free),
                            inactive_file_bytes,
                        },
                        true,
                    ));
                }
                Err(error) => return Err(error),
            };
            let usage = MemoryUsage {
                usage_bytes: anon.saturating_add(file),
                inactive_file_bytes,
            };
            Ok((usage, false))
        }
        Err(e) => Err(e),
    }
}

/// As the kubelet's summary and eviction helpers compute it: available is the limit
/// less the working set (and less the huge page pool when that is subtracted), floored
/// at zero; capacity is available plus the working set. Capacity is the limit itself
/// unless the floor was hit, and the limit less the pool when one is subtracted, so
/// percentage thresholds and memcg triggers apply to the memory pods can really use.
pub(crate) fn memory_observation(limit: u64, hugepages: u64, usage: MemoryUsage) -> Observation {
    let working_set = usage.working_set_bytes();
    let available = limit.saturating_sub(working_set).saturating_sub(hugepages);
    observation(available, available.saturating_add(working_set))
}

fn observation(available: u64, capacity: u64) -> Observation {
    Observation {
        available: to_i64(available),
        capacity: to_i64(capacity),
        sampled_at_ms: None,
    }
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn copy_result(result: &Result<FsStats, FileError>) -> Result<FsStats, FileError> {
    result.as_ref().copied().map_err(FileError::duplicate)
}

fn record_memory(
    out: &mut Collection,
    signal: Signal,
    result: Result<(Observation, MemoryUsage), FileError>,
) {
    let observation = result.map(|(observation, usage)| {
        out.memory_usage.insert(signal, usage);
        observation
    });
    record(out, signal, observation);
}

fn record(out: &mut Collection, signal: Signal, result: Result<Observation, FileError>) {
    match result {
        Ok(observation) => {
            out.observations.insert(signal, observation);
        }
        Err(e) => out.errors.push(e.for_subject(ErrorSubject::Signal(signal))),
    }
}
