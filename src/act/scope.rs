//! Which cgroups the standalone evictor may touch: only strict descendants of the
//! configured workload parent. Checked on the path text alone, before any file is opened,
//! so a bad pod list can never point the evictor at the agent, the kubelet or the host.

use std::path::{Path, PathBuf};

use crate::signals::relative_cgroup;

use super::error::ActError;

/// The workload parent as a normalized relative path; the hierarchy root is refused,
/// since it would put every process on the host in scope.
pub fn workload_parent(parent: &Path) -> Result<PathBuf, ActError> {
    let normalized = relative_cgroup(parent).ok_or_else(|| ActError::InvalidWorkloadParent {
        parent: parent.to_path_buf(),
    })?;
    if normalized.as_os_str().is_empty() {
        return Err(ActError::InvalidWorkloadParent {
            parent: parent.to_path_buf(),
        });
    }
    Ok(normalized)
}

/// `cgroup` as a normalized relative path, if it lies strictly below `parent` (itself
/// normalized by [`workload_parent`]).
pub fn workload_cgroup(parent: &Path, cgroup: &Path) -> Result<PathBuf, ActError> {
    let outside = || ActError::OutsideWorkloadParent {
        cgroup: cgroup.to_path_buf(),
        parent: parent.to_path_buf(),
    };
    let normalized = relative_cgroup(cgroup).ok_or_else(outside)?;
    if normalized.starts_with(parent) && normalized != parent {
        Ok(normalized)
    } else {
        Err(outside())
    }
}

/// Whether `text` names exactly one entry of a directory: not empty, not `.` or `..`, and
/// without `/` or NUL. Names from a pod list or the API must pass before they are joined
/// to a host path, or an absolute name would replace the base and `..` would climb out.
pub fn is_path_component(text: &str) -> bool {
    !text.is_empty() && text != "." && text != ".." && !text.contains(['/', '\0'])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parent() -> PathBuf {
        workload_parent(Path::new("/kubepods.slice")).unwrap()
    }

    #[test]
    fn descendants_of_the_parent_are_in_scope_whatever_their_spelling() {
        for cgroup in [
            "kubepods.slice/pod-a",
            "/kubepods.slice/pod-a",
            "./kubepods.slice/burstable/pod-b",
        ] {
            assert!(
                workload_cgroup(&parent(), Path::new(cgroup)).is_ok(),
                "{cgroup}"
            );
        }
        assert_eq!(
            workload_cgroup(&parent(), Path::new("/kubepods.slice/pod-a")).unwrap(),
            Path::new("kubepods.slice/pod-a")
        );
    }

    #[test]
    fn the_parent_itself_siblings_and_escapes_are_refused() {
        for cgroup in [
            "kubepods.slice",
            "/",
            "system.slice/kubelet.service",
            "kubepods.slice-evil/pod",
            "kubepods.slice/../system.slice",
            "kubepods.slice/pod-a/../../init.scope",
        ] {
            let error = workload_cgroup(&parent(), Path::new(cgroup)).unwrap_err();
            assert!(error.to_string().contains(cgroup), "{error}");
        }
    }

    #[test]
    fn the_hierarchy_root_is_not_a_workload_parent() {
        for parent in ["/", "", ".", "a/../b"] {
            assert!(workload_parent(Path::new(parent)).is_err(), "{parent}");
        }
    }
}
