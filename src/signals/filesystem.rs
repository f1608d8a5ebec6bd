//! Filesystem signals from statvfs(3), with cAdvisor's arithmetic.

use std::path::{Path, PathBuf};

use super::error::FileProblem;

/// One statvfs sample reduced to what the eviction signals use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    /// `f_frsize * f_bavail`: what unprivileged writers can still use.
    pub available_bytes: u64,
    /// `f_frsize * f_blocks`.
    pub capacity_bytes: u64,
    /// `f_ffree`.
    pub inodes_free: u64,
    /// `f_files`.
    pub inodes: u64,
}

pub(crate) fn stat_filesystem(path: &Path) -> Result<FsStats, FileProblem> {
    let stat = nix::sys::statvfs::statvfs(path)
        .map_err(|errno| FileProblem::Io(std::io::Error::from(errno)))?;
    let fragment = stat.fragment_size() as u64;
    Ok(FsStats {
        available_bytes: fragment.saturating_mul(stat.blocks_available() as u64),
        capacity_bytes: fragment.saturating_mul(stat.blocks() as u64),
        inodes_free: stat.files_free() as u64,
        inodes: stat.files() as u64,
    })
}

/// A filesystem to measure: the configured path, or its nearest existing ancestor when the
/// path does not exist yet (a host without a kubelet has no `/var/lib/kubelet`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsTarget {
    pub configured: PathBuf,
    pub measured: PathBuf,
}

impl FsTarget {
    pub fn resolve(configured: &Path) -> Self {
        let measured = configured
            .ancestors()
            .find(|candidate| !candidate.as_os_str().is_empty() && candidate.exists())
            .unwrap_or(configured)
            .to_path_buf();
        FsTarget {
            configured: configured.to_path_buf(),
            measured,
        }
    }

    pub fn is_fallback(&self) -> bool {
        self.configured != self.measured
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_path_falls_back_to_nearest_existing_ancestor() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("var/lib/kubelet");
        let target = FsTarget::resolve(&missing);
        assert_eq!(target.measured, dir.path());
        assert!(target.is_fallback());
        let present = FsTarget::resolve(dir.path());
        assert!(!present.is_fallback());
    }

    #[test]
    fn statvfs_reports_consistent_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let stats = stat_filesystem(dir.path()).unwrap();
        assert!(stats.capacity_bytes > 0);
        assert!(stats.available_bytes <= stats.capacity_bytes);
        assert!(stats.inodes_free <= stats.inodes);
        assert!(stat_filesystem(&dir.path().join("absent")).is_err());
    }
}
