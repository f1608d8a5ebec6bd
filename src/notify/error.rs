use std::path::{Path, PathBuf};

/// A notifier could not be set up, or its event source failed. Every variant names the
/// file involved so the log line points at the cgroup or PSI file.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("{path}: cannot {action}: {source}", path = .path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid PSI trigger {trigger:?}: {reason}")]
    InvalidTrigger { trigger: String, reason: String },
    #[error("{path}: the event source is gone (was the cgroup removed?)", path = .path.display())]
    SourceGone { path: PathBuf },
    #[error("{path}: malformed content: {reason}", path = .path.display())]
    Malformed { path: PathBuf, reason: String },
}

impl NotifyError {
    pub(crate) fn io(path: &Path, action: &'static str, source: impl Into<std::io::Error>) -> Self {
        NotifyError::Io {
            path: path.to_path_buf(),
            action,
            source: source.into(),
        }
    }
}
