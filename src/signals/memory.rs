//! Memory accounting of one cgroup, with a backend per cgroup version behind one trait
//! (the libcgroups shape: callers never branch on the version).

use std::path::Path;

use super::error::FileError;
use super::fileio::{read_u64, with_file_text};
use super::parse::{flat_keyed_u64, memory_limit};

/// Usage as the kernel charges it, and the part of it that is reclaimable page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryUsage {
    pub usage_bytes: u64,
    pub inactive_file_bytes: u64,
}

impl MemoryUsage {
    /// cAdvisor's working set: usage minus inactive file pages, never below zero.
    pub fn working_set_bytes(&self) -> u64 {
        self.usage_bytes.saturating_sub(self.inactive_file_bytes)
    }
}

/// Reads the memory files of one cgroup directory of the memory hierarchy.
pub trait MemoryController {
    fn usage(&self, dir: &Path) -> Result<MemoryUsage, FileError>;
    /// The hard limit; `None` when the cgroup is unlimited.
    fn limit(&self, dir: &Path) -> Result<Option<u64>, FileError>;
}

/// cgroup v1: `memory.usage_in_bytes`, `total_inactive_file` (hierarchical) in `memory.stat`,
/// `memory.limit_in_bytes`.
#[derive(Debug, Clone, Copy, Default)]
pub struct V1Memory;

/// cgroup v2: `memory.current`, `inactive_file` (always hierarchical) in `memory.stat`,
/// `memory.max`.
#[derive(Debug, Clone, Copy, Default)]
pub struct V2Memory;

impl MemoryController for V1Memory {
    fn usage(&self, dir: &Path) -> Result<MemoryUsage, FileError> {
        usage_from(dir, "memory.usage_in_bytes", "total_inactive_file")
    }

    fn limit(&self, dir: &Path) -> Result<Option<u64>, FileError> {
        limit_from(dir, "memory.limit_in_bytes")
    }
}

impl MemoryController for V2Memory {
    fn usage(&self, dir: &Path) -> Result<MemoryUsage, FileError> {
        usage_from(dir, "memory.current", "inactive_file")
    }

    fn limit(&self, dir: &Path) -> Result<Option<u64>, FileError> {
        limit_from(dir, "memory.max")
    }
}

fn usage_from(
    dir: &Path,
    usage_file: &str,
    inactive_key: &'static str,
) -> Result<MemoryUsage, FileError> {
    let mut path = dir.join(usage_file);
    let usage_bytes = read_u64(&path)?;
    path.set_file_name("memory.stat");
    let inactive_file_bytes = with_file_text(&path, |text| flat_keyed_u64(text, inactive_key))?;
    Ok(MemoryUsage {
        usage_bytes,
        inactive_file_bytes,
    })
}

fn limit_from(dir: &Path, file: &str) -> Result<Option<u64>, FileError> {
    with_file_text(&dir.join(file), memory_limit)
}
