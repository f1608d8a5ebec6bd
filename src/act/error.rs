use std::path::{Path, PathBuf};

/// Why the standalone evictor did not (fully) kill a workload cgroup.
#[derive(Debug, thiserror::Error)]
pub enum ActError {
    #[error(
        "workload parent {parent:?} is not usable: it must be a cgroup below the hierarchy root, without `..`",
        parent = .parent.display().to_string()
    )]
    InvalidWorkloadParent { parent: PathBuf },
    #[error(
        "cgroup {cgroup:?} is not below the workload parent {parent:?}; refusing to touch it",
        cgroup = .cgroup.display().to_string(),
        parent = .parent.display().to_string()
    )]
    OutsideWorkloadParent { cgroup: PathBuf, parent: PathBuf },
    #[error("pod {pod} has no cgroup; the standalone evictor can only kill cgroups")]
    NoCgroup { pod: String },
    #[error("{path}: cannot {action}: {source}", path = .path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("soft eviction of {pod} needs a tokio runtime to escalate after the grace period")]
    NoRuntime { pod: String },
    #[error("the escalation task for {cgroup} failed: {reason}", cgroup = .cgroup.display())]
    Escalation { cgroup: PathBuf, reason: String },
    #[error("{cgroup}: processes {pids:?} survived SIGKILL", cgroup = .cgroup.display())]
    Survived { cgroup: PathBuf, pids: Vec<i32> },
}

impl ActError {
    pub(crate) fn io(path: &Path, action: &'static str, source: std::io::Error) -> Self {
        ActError::Io {
            path: path.to_path_buf(),
            action,
            source,
        }
    }
}
