//! Which cgroup hierarchies a host mounts, and where a cgroup's files live in each.
//!
//! Like youki's libcgroups this distinguishes unified (v2 only), hybrid (v1 controllers plus
//! a v2 mount at `unified/`) and legacy (v1 only). It looks at files rather than the mount
//! table so that a fake tree in a temporary directory is detected the same way as
//! `/sys/fs/cgroup`.

use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupLayout {
    /// cgroup v2 only: the root holds `cgroup.controllers`.
    Unified,
    /// v1 controllers (memory among them) plus a v2 hierarchy at `unified/`.
    Hybrid,
    /// v1 controllers only.
    Legacy,
}

impl CgroupLayout {
    /// Whether the memory controller is a v1 hierarchy (it is in hybrid as well as legacy).
    pub fn memory_is_v1(&self) -> bool {
        !matches!(self, CgroupLayout::Unified)
    }
}

impl fmt::Display for CgroupLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CgroupLayout::Unified => "unified (cgroup v2)",
            CgroupLayout::Hybrid => "hybrid (cgroup v1 memory, v2 at unified/)",
            CgroupLayout::Legacy => "legacy (cgroup v1)",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no cgroup hierarchy under {}: neither cgroup.controllers (v2) nor a memory/ directory (v1)",
    .cgroup_root.display()
)]
pub struct LayoutError {
    pub cgroup_root: PathBuf,
}

/// Detect the layout from the files under `cgroup_root`.
pub fn detect_layout(cgroup_root: &Path) -> Result<CgroupLayout, LayoutError> {
    if cgroup_root.join("cgroup.controllers").is_file() {
        return Ok(CgroupLayout::Unified);
    }
    if cgroup_root.join("memory").is_dir() {
        if cgroup_root
            .join("unified")
            .join("cgroup.controllers")
            .is_file()
        {
            return Ok(CgroupLayout::Hybrid);
        }
        return Ok(CgroupLayout::Legacy);
    }
    Err(LayoutError {
        cgroup_root: cgroup_root.to_path_buf(),
    })
}

/// Where one cgroup's controller files are for a given layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupPaths {
    root: PathBuf,
    layout: CgroupLayout,
}

impl CgroupPaths {
    pub fn new(cgroup_root: &Path, layout: CgroupLayout) -> Self {
        CgroupPaths {
            root: cgroup_root.to_path_buf(),
            layout,
        }
    }

    pub fn layout(&self) -> CgroupLayout {
        self.layout
    }

    /// The directory with `memory.*` files for `cgroup` (relative to the hierarchy root).
    pub fn memory_dir(&self, cgroup: &Path) -> PathBuf {
        self.controller_dir("memory", cgroup)
    }

    /// The directory with `pids.*` files for `cgroup`.
    pub fn pids_dir(&self, cgroup: &Path) -> PathBuf {
        self.controller_dir("pids", cgroup)
    }

    /// The cgroup's directory in the v2 hierarchy, where PSI and `memory.events` live;
    /// `None` on legacy hosts, which have no v2 hierarchy.
    pub fn v2_dir(&self, cgroup: &Path) -> Option<PathBuf> {
        match self.layout {
            CgroupLayout::Unified => Some(join_relative(&self.root, cgroup)),
            CgroupLayout::Hybrid => Some(join_relative(&self.root.join("unified"), cgroup)),
            CgroupLayout::Legacy => None,
        }
    }

    fn controller_dir(&self, controller: &str, cgroup: &Path) -> PathBuf {
        match self.layout {
            CgroupLayout::Unified => join_relative(&self.root, cgroup),
            CgroupLayout::Hybrid | CgroupLayout::Legacy => {
                join_relative(&self.root.join(controller), cgroup)
            }
        }
    }
}

/// Join a cgroup path onto a hierarchy root. Cgroup paths are often written absolute
/// (`/kubepods`), and `Path::join` would then discard the root. Only the path's names are
/// joined: `/`, `.` and `..` parts are dropped, so the result never leaves `base`; where a
/// `..` must be refused rather than dropped (anything that kills), check the path with
/// [`relative_cgroup`] first. The one place cgroup paths are normalized.
pub fn join_relative(base: &Path, cgroup: &Path) -> PathBuf {
    let mut joined = base.to_path_buf();
    for component in cgroup.components() {
        if let Component::Normal(part) = component {
            joined.push(part);
        }
    }
    joined
}

/// A cgroup path relative to its hierarchy's root (`/kubepods`, `kubepods` and
/// `./kubepods` are the same cgroup, `kubepods`); `None` when it has a `..` part, which
/// could climb out of the cgroup it seems to name.
pub fn relative_cgroup(cgroup: &Path) -> Option<PathBuf> {
    let climbs = cgroup
        .components()
        .any(|part| matches!(part, Component::ParentDir | Component::Prefix(_)));
    (!climbs).then(|| join_relative(Path::new(""), cgroup))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_each_layout_from_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert!(detect_layout(root).is_err());
        std::fs::create_dir(root.join("memory")).unwrap();
        assert_eq!(detect_layout(root).unwrap(), CgroupLayout::Legacy);
        std::fs::create_dir(root.join("unified")).unwrap();
        // An empty mount point is not a v2 hierarchy.
        assert_eq!(detect_layout(root).unwrap(), CgroupLayout::Legacy);
        std::fs::write(root.join("unified/cgroup.controllers"), "").unwrap();
        assert_eq!(detect_layout(root).unwrap(), CgroupLayout::Hybrid);
        std::fs::write(root.join("cgroup.controllers"), "memory pids\n").unwrap();
        assert_eq!(detect_layout(root).unwrap(), CgroupLayout::Unified);
    }

    #[test]
    fn absolute_cgroup_paths_stay_under_the_root() {
        let paths = CgroupPaths::new(Path::new("/sys/fs/cgroup"), CgroupLayout::Hybrid);
        assert_eq!(
            paths.memory_dir(Path::new("/kubepods")),
            Path::new("/sys/fs/cgroup/memory/kubepods")
        );
        assert_eq!(
            paths.v2_dir(Path::new("kubepods")).unwrap(),
            Path::new("/sys/fs/cgroup/unified/kubepods")
        );
        let unified = CgroupPaths::new(Path::new("/cg"), CgroupLayout::Unified);
        assert_eq!(
            unified.pids_dir(Path::new("/kubepods.slice")),
            Path::new("/cg/kubepods.slice")
        );
        let legacy = CgroupPaths::new(Path::new("/cg"), CgroupLayout::Legacy);
        assert_eq!(legacy.v2_dir(Path::new("x")), None);
    }

    #[test]
    fn a_path_that_climbs_is_refused_by_the_check_and_kept_inside_by_the_join() {
        for same in ["/kubepods/pod-a", "kubepods/pod-a", "./kubepods/./pod-a/"] {
            assert_eq!(
                relative_cgroup(Path::new(same)).unwrap(),
                Path::new("kubepods/pod-a"),
                "{same}"
            );
        }
        assert_eq!(relative_cgroup(Path::new("/")).unwrap(), Path::new(""));
        for climbing in ["../etc", "/kubepods/../..", "kubepods/.."] {
            assert_eq!(relative_cgroup(Path::new(climbing)), None, "{climbing}");
            assert!(
                join_relative(Path::new("/cg"), Path::new(climbing)).starts_with("/cg"),
                "{climbing}"
            );
        }
    }
}
