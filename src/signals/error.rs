//! Errors from the collectors. Every error names what it was collecting for and the file
//! it could not use, so an operator can go straight to the broken file.

use std::fmt;
use std::path::{Path, PathBuf};

use super::Signal;
use super::pressure::PressureResource;

/// What a failed read was for: one eviction signal, one pressure file, or a cgroup's usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorSubject {
    Signal(Signal),
    Pressure(PressureResource),
    CgroupUsage,
    ChildCgroups,
}

impl fmt::Display for ErrorSubject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorSubject::Signal(signal) => write!(f, "{signal}"),
            ErrorSubject::Pressure(resource) => write!(f, "{resource} pressure"),
            ErrorSubject::CgroupUsage => f.write_str("cgroup usage"),
            ErrorSubject::ChildCgroups => f.write_str("child cgroups"),
        }
    }
}

/// Why a file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FileProblem {
    #[error("cannot read: {0}")]
    Io(#[from] std::io::Error),
    #[error("no `{0}` entry")]
    MissingKey(&'static str),
    #[error("malformed content: {0}")]
    Malformed(String),
    /// The text ends without the newline the kernel writes after every line, so the last
    /// value may be the first digits of a larger one.
    #[error("cut short: {0:?} has no newline after it, so it may be part of a longer value")]
    CutShort(String),
}

impl FileProblem {
    /// Whether the file (or its directory) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, FileProblem::Io(e) if e.kind() == std::io::ErrorKind::NotFound)
    }
}

/// A read failure scoped to one subject; other subjects of the same collection still succeed.
#[derive(Debug, thiserror::Error)]
#[error("{subject}: {path}: {problem}", path = .path.display())]
pub struct SignalError {
    pub subject: ErrorSubject,
    pub path: PathBuf,
    #[source]
    pub problem: FileProblem,
}

impl SignalError {
    pub(crate) fn new(subject: ErrorSubject, path: &Path, problem: FileProblem) -> Self {
        SignalError {
            subject,
            path: path.to_path_buf(),
            problem,
        }
    }

    /// Whether the file (or its directory) does not exist: a cgroup removed, or never made.
    pub fn is_not_found(&self) -> bool {
        self.problem.is_not_found()
    }

    /// The signal this error cost, if it was collecting for one.
    pub fn signal(&self) -> Option<Signal> {
        match self.subject {
            ErrorSubject::Signal(signal) => Some(signal),
            _ => None,
        }
    }
}

/// A file that could not be used, not yet tied to a subject; the collector ties it to one.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {problem}", path = .path.display())]
pub struct FileError {
    pub path: PathBuf,
    #[source]
    pub problem: FileProblem,
}

impl FileError {
    pub(crate) fn new(path: &Path, problem: impl Into<FileProblem>) -> Self {
        FileError {
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }

    pub(crate) fn for_subject(self, subject: ErrorSubject) -> SignalError {
        SignalError {
            subject,
            path: self.path,
            problem: self.problem,
        }
    }
}

impl FileError {
    /// A copy for a second subject that failed on the same file (`io::Error` is not `Clone`).
    pub(crate) fn duplicate(&self) -> FileError {
        let problem = match &self.problem {
            FileProblem::Io(e) => FileProblem::Io(match e.raw_os_error() {
                Some(code) => std::io::Error::from_raw_os_error(code),
                None => std::io::Error::new(e.kind(), e.to_string()),
            }),
            FileProblem::MissingKey(key) => FileProblem::MissingKey(key),
            FileProblem::Malformed(why) => FileProblem::Malformed(why.clone()),
            FileProblem::CutShort(text) => FileProblem::CutShort(text.clone()),
        };
        FileError {
            path: self.path.clone(),
            problem,
        }
    }
}
