//! What this host is, found once when the agent starts: where its files are, its cgroup
//! layout and this boot's id. Every component that reads the host (the collector, the
//! notifier probe, the notifiers, the Kubernetes pod usage, the shutdown manager, the
//! reports) takes this instead of detecting again, so they all agree, and the configured
//! `procRoot` and `cgroupRoot` are honoured everywhere.

use std::path::Path;

use super::cgroup::CgroupReader;
use super::filesystem::Filesystems;
use super::layout::{CgroupLayout, LayoutError};
use crate::config::{FilesystemLayout, HostPaths};

#[derive(Debug, Clone)]
pub struct Host {
    paths: HostPaths,
    cgroups: Result<CgroupReader, LayoutError>,
    /// This boot's id, or why it could not be read.
    boot_id: Result<String, String>,
    /// The filesystems' devices and the layout they make, or why they could not be told.
    filesystems: Result<Filesystems, String>,
}

impl Host {
    /// Look at the host under `paths`: the cgroup layout under `cgroupRoot`, the boot id
    /// under `procRoot` and the filesystems' devices. Never fails; what is missing is kept
    /// as its error.
    pub fn detect(paths: &HostPaths) -> Host {
        Host {
            paths: paths.clone(),
            cgroups: CgroupReader::detect(&paths.cgroup_root),
            boot_id: read_boot_id(&paths.proc_root)
                .map_err(|error| format!("{}: {error}", paths.proc_root.join(BOOT_ID).display())),
            filesystems: Filesystems::detect(paths),
        }
    }

    pub fn paths(&self) -> &HostPaths {
        &self.paths
    }

    /// The same host with its pods cgroup found after detection (from the Kubernetes pod
    /// cgroup naming), for `allocatableMemory.available` and the pod-level notifiers.
    pub fn with_pods_cgroup(mut self, pods: std::path::PathBuf) -> Host {
        self.paths.pods_cgroup = Some(pods);
        self
    }

    /// The cgroup reader, when a cgroup hierarchy was found.
    pub fn cgroups(&self) -> Option<&CgroupReader> {
        self.cgroups.as_ref().ok()
    }

    /// Why no cgroup hierarchy was found, if none was.
    pub fn cgroup_error(&self) -> Option<&LayoutError> {
        self.cgroups.as_ref().err()
    }

    /// The detection itself: the reader, or why there is none.
    pub fn cgroup_detection(&self) -> &Result<CgroupReader, LayoutError> {
        &self.cgroups
    }

    pub fn layout(&self) -> Option<CgroupLayout> {
        self.cgroups().map(CgroupReader::layout)
    }

    /// The filesystem layout, by the devices of the configured paths as the kubelet
    /// decides it; where they could not be told apart, by the paths themselves.
    pub fn fs_layout(&self) -> FilesystemLayout {
        self.filesystems
            .as_ref()
            .map_or_else(|_| self.paths.fs_layout(), |found| found.layout)
    }

    /// The filesystems found, or why their devices could not be told.
    pub fn filesystems(&self) -> Result<&Filesystems, &str> {
        self.filesystems.as_ref().map_err(String::as_str)
    }

    /// This boot's id (`<procRoot>/sys/kernel/random/boot_id`), or a message naming the
    /// file and why it could not be read.
    pub fn boot_id(&self) -> Result<&str, &str> {
        self.boot_id.as_deref().map_err(String::as_str)
    }
}

const BOOT_ID: &str = "sys/kernel/random/boot_id";

/// This boot's id from `<proc_root>/sys/kernel/random/boot_id`.
pub fn read_boot_id(proc_root: &Path) -> std::io::Result<String> {
    let text = std::fs::read_to_string(proc_root.join(BOOT_ID))?;
    let id = text.trim();
    if id.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the boot id is empty",
        ));
    }
    Ok(id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(root: &Path) -> HostPaths {
        HostPaths {
            cgroup_root: root.join("cgroup"),
            proc_root: root.join("proc"),
            ..HostPaths::default()
        }
    }

    #[test]
    fn the_layout_and_the_boot_id_come_from_the_configured_roots() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("cgroup")).unwrap();
        std::fs::write(root.join("cgroup/cgroup.controllers"), "memory pids\n").unwrap();
        std::fs::create_dir_all(root.join("proc/sys/kernel/random")).unwrap();
        std::fs::write(
            root.join("proc/sys/kernel/random/boot_id"),
            "6a3c1e0c-9d1b-4c55-8a0e-3f1f7a2b9c41\n",
        )
        .unwrap();
        let host = Host::detect(&paths(root));
        assert_eq!(host.layout(), Some(CgroupLayout::Unified));
        assert_eq!(host.boot_id(), Ok("6a3c1e0c-9d1b-4c55-8a0e-3f1f7a2b9c41"));
        assert_eq!(host.paths().proc_root, root.join("proc"));
    }

    #[test]
    fn what_is_missing_is_kept_with_the_file_it_names() {
        let dir = tempfile::tempdir().unwrap();
        let host = Host::detect(&paths(dir.path()));
        assert!(host.cgroups().is_none());
        assert!(host.cgroup_error().is_some());
        let error = host.boot_id().unwrap_err();
        assert!(error.contains("proc/sys/kernel/random/boot_id"), "{error}");
        std::fs::create_dir_all(dir.path().join("proc/sys/kernel/random")).unwrap();
        std::fs::write(dir.path().join("proc/sys/kernel/random/boot_id"), "\n").unwrap();
        let error = Host::detect(&paths(dir.path()))
            .boot_id()
            .unwrap_err()
            .to_string();
        assert!(error.contains("empty"), "{error}");
    }
}
