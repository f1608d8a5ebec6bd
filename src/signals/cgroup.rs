//! Per-cgroup usage for pods and workloads: memory, limit and process count of one cgroup,
//! and the child cgroups of a parent (standalone mode treats those as pods).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::error::{ErrorSubject, FileError, FileProblem, SignalError};
use super::fileio::{is_not_found, read_u64};
use super::layout::{CgroupLayout, CgroupPaths, LayoutError, detect_layout};
use super::memory::{MemoryController, MemoryUsage, V1Memory, V2Memory};
use super::parse::count_lines;

/// One cgroup's resource use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CgroupUsage {
    pub working_set_bytes: u64,
    pub usage_bytes: u64,
    /// `None` when the cgroup has no memory limit.
    pub limit_bytes: Option<u64>,
    /// Processes and threads in the cgroup and all its descendants.
    pub process_count: u64,
}

/// A pod's cgroup as ranking reads it every cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodCgroupUsage {
    pub working_set_bytes: u64,
    pub usage_bytes: u64,
    /// Processes and threads in the cgroup and all its descendants; `None` when not
    /// read ([`ProcessCounts::NotNeeded`]).
    pub process_count: Option<u64>,
    /// When the memory figures were read, where they are figures kept from an earlier
    /// listing ([`with_pod_figures`](super::with_pod_figures)); `None`: read now.
    pub memory_kept_from: Option<Instant>,
}

/// Whether a cycle counts each pod's processes. Only the PID ranking uses a pod's count,
/// and only a `pid.available` threshold can call for it (the kubelet sets none by
/// default): without one, the count is a file per pod per cycle that no decision reads,
/// or on a host without the pids controller a walk of every pod's `cgroup.procs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessCounts {
    Read,
    NotNeeded,
}

impl ProcessCounts {
    /// Read when a threshold can rank pods by their process count.
    pub fn for_ranking(ranks_by_process_count: bool) -> Self {
        if ranks_by_process_count {
            ProcessCounts::Read
        } else {
            ProcessCounts::NotNeeded
        }
    }
}

/// The memory backend for a layout: an enum dispatcher, so readers need no trait objects.
#[derive(Debug, Clone, Copy)]
enum AnyMemory {
    V1(V1Memory),
    V2(V2Memory),
}

impl AnyMemory {
    fn controller(&self) -> &dyn MemoryController {
        match self {
            AnyMemory::V1(v1) => v1,
            AnyMemory::V2(v2) => v2,
        }
    }
}

/// Reads cgroups of one host (or fake tree), whatever its layout.
#[derive(Debug, Clone)]
pub struct CgroupReader {
    paths: CgroupPaths,
    memory: AnyMemory,
}

impl CgroupReader {
    pub fn new(cgroup_root: &Path, layout: CgroupLayout) -> Self {
        let memory = if layout.memory_is_v1() {
            AnyMemory::V1(V1Memory)
        } else {
            AnyMemory::V2(V2Memory)
        };
        CgroupReader {
            paths: CgroupPaths::new(cgroup_root, layout),
            memory,
        }
    }

    pub fn detect(cgroup_root: &Path) -> Result<Self, LayoutError> {
        Ok(Self::new(cgroup_root, detect_layout(cgroup_root)?))
    }

    pub fn layout(&self) -> CgroupLayout {
        self.paths.layout()
    }

    pub fn paths(&self) -> &CgroupPaths {
        &self.paths
    }

    pub fn memory_controller(&self) -> &dyn MemoryController {
        self.memory.controller()
    }

    /// Memory usage of `cgroup` (relative to the hierarchy root; `/` is the root cgroup).
    pub fn memory_usage(&self, cgroup: &Path) -> Result<MemoryUsage, FileError> {
        self.memory
            .controller()
            .usage(&self.paths.memory_dir(cgroup))
    }

    /// The memory usage of a pod's (or a pod container's) cgroup: inside a pod listing
    /// that may reuse figures ([`with_pod_figures`]), those an earlier listing read,
    /// with the time they were read; otherwise read now (`None`). Only pod cgroups are
    /// read through here, so no node-level figure can be served from kept ones.
    ///
    /// [`with_pod_figures`]: super::with_pod_figures
    pub fn pod_memory_usage(
        &self,
        cgroup: &Path,
    ) -> Result<(MemoryUsage, Option<Instant>), FileError> {
        let controller = self.memory.controller();
        super::kept_figures::memory_usage(self.paths.memory_dir(cgroup), |dir| {
            controller.usage(dir)
        })
    }

    pub fn memory_limit(&self, cgroup: &Path) -> Result<Option<u64>, FileError> {
        self.memory
            .controller()
            .limit(&self.paths.memory_dir(cgroup))
    }

    /// Working set, usage, limit and process count of one cgroup.
    pub fn read_cgroup_usage(&self, cgroup: &Path) -> Result<CgroupUsage, SignalError> {
        let usage_error = |e: FileError| e.for_subject(ErrorSubject::CgroupUsage);
        let usage = self.memory_usage(cgroup).map_err(usage_error)?;
        let process_count = self.process_count(cgroup).map_err(usage_error)?;
        let limit_bytes = self.memory_limit(cgroup).map_err(usage_error)?;
        Ok(CgroupUsage {
            working_set_bytes: usage.working_set_bytes(),
            usage_bytes: usage.usage_bytes,
            limit_bytes,
            process_count,
        })
    }

    /// What ranking a pod needs of its cgroup each cycle: working set and usage, and the
    /// process count when `process_counts` asks for it, without the limit that
    /// [`read_cgroup_usage`](Self::read_cgroup_usage) also reads. Every cycle reads this
    /// for every pod, so each file left out is a file per pod per cycle between a memory
    /// crossing and the decision.
    ///
    /// A count that cannot be read leaves `process_count` empty and comes back beside the
    /// figures: the memory figures stand on their own (as cAdvisor's memory and process
    /// stats do), so configuring a `pid.available` threshold cannot change how a pod
    /// ranks for memory.
    pub fn read_pod_usage(
        &self,
        cgroup: &Path,
        process_counts: ProcessCounts,
    ) -> Result<(PodCgroupUsage, Option<SignalError>), SignalError> {
        let usage_error = |e: FileError| e.for_subject(ErrorSubject::CgroupUsage);
        let (usage, memory_kept_from) = self.pod_memory_usage(cgroup).map_err(usage_error)?;
        let (process_count, count_error) = match process_counts {
            ProcessCounts::Read => match self.process_count(cgroup) {
                Ok(count) => (Some(count), None),
                Err(error) => (None, Some(usage_error(error))),
            },
            ProcessCounts::NotNeeded => (None, None),
        };
        let figures = PodCgroupUsage {
            working_set_bytes: usage.working_set_bytes(),
            usage_bytes: usage.usage_bytes,
            process_count,
            memory_kept_from,
        };
        Ok((figures, count_error))
    }

    /// `pids.current` where the pids controller covers the cgroup; otherwise the
    /// `cgroup.procs` entries of the cgroup and all its descendants (in v1 and v2 alike
    /// `cgroup.procs` lists only the cgroup's own members).
    pub fn process_count(&self, cgroup: &Path) -> Result<u64, FileError> {
        let pids_current = self.paths.pids_dir(cgroup).join("pids.current");
        match read_u64(&pids_current) {
            Ok(count) => Ok(count),
            Err(e) if is_not_found(&e) => count_procs_recursively(&self.paths.memory_dir(cgroup)),
            Err(e) => Err(e),
        }
    }

    /// The direct child cgroups of `parent`, as paths relative to the hierarchy root,
    /// sorted by name.
    pub fn list_child_cgroups(&self, parent: &Path) -> Result<Vec<PathBuf>, SignalError> {
        let mut children: Vec<PathBuf> = self
            .child_cgroup_names(parent)?
            .into_iter()
            .map(|name| parent.join(name))
            .collect();
        // By the bytes of the names: siblings differ only in their last name, so this is
        // the order of their paths, without comparing the paths component by component.
        children.sort_unstable_by(|a, b| a.as_os_str().cmp(b.as_os_str()));
        Ok(children)
    }

    /// The names of `parent`'s direct child cgroups, in the directory's order: for a
    /// look-up of many names, without a path built for each child.
    pub fn child_cgroup_names(&self, parent: &Path) -> Result<Vec<OsString>, SignalError> {
        let dir = self.paths.memory_dir(parent);
        let child_error =
            |e: std::io::Error| SignalError::new(ErrorSubject::ChildCgroups, &dir, e.into());
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(child_error)? {
            let entry = entry.map_err(child_error)?;
            if entry.file_type().map_err(child_error)?.is_dir() {
                names.push(entry.file_name());
            }
        }
        Ok(names)
    }
}

fn count_procs_recursively(dir: &Path) -> Result<u64, FileError> {
    // Read to the end: the kernel hands `cgroup.procs` out about a page (some 500 pids)
    // per read, so the one read of `with_file_text` would count a large cgroup short.
    let procs = dir.join("cgroup.procs");
    let text = std::fs::read_to_string(&procs).map_err(|e| FileError::new(&procs, e))?;
    let mut total = count_lines(&text).map_err(|problem| FileError::new(&procs, problem))?;
    let entries = std::fs::read_dir(dir).map_err(|e| FileError::new(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| FileError::new(dir, e))?;
        let is_dir = entry
            .file_type()
            .map_err(|e| FileError::new(&entry.path(), FileProblem::Io(e)))?
            .is_dir();
        if is_dir {
            total += count_procs_recursively(&entry.path())?;
        }
    }
    Ok(total)
}
