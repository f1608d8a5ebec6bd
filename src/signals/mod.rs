//! Eviction signals: their names, the observations the collectors produce, and the live
//! collectors that read them from cgroupfs, procfs and statvfs.

mod cgroup;
mod collector;
pub mod contention;
mod error;
mod fileio;
mod filesystem;
mod host;
mod kept_figures;
mod layout;
mod memory;
pub mod parse;
mod pressure;
mod probe;
pub mod readers;

pub use crate::signal_names::{Contention, NodeCondition, Resource, Signal, UnknownSignal};
pub use cgroup::{CgroupReader, CgroupUsage, PodCgroupUsage, ProcessCounts};
#[cfg(test)]
pub(crate) use collector::memory_observation;
pub use collector::{Collection, SignalCollector};
pub use error::{ErrorSubject, FileError, FileProblem, SignalError};
pub(crate) use fileio::read_u64;
pub use fileio::{
    end_kernel_file_cycle, keep_kernel_files_open_on_this_thread, kernel_files_kept_open,
};
pub use filesystem::{Filesystems, FsDevice, FsStats, FsTarget, Mount, device_of, parse_mountinfo};
pub use host::{Host, read_boot_id};
pub use kept_figures::{
    NotificationsWaiting, PodFigures, with_pod_figures, with_pod_figures_until_notified,
};
pub use layout::{
    CgroupLayout, CgroupPaths, LayoutError, detect_layout, join_relative, relative_cgroup,
};
pub use memory::{MemoryController, MemoryUsage, V1Memory, V2Memory};
pub use parse::MemInfo;
pub use pressure::{
    PressureKind, PressureReading, PressureResource, PressureScope, parse_pressure,
};
pub use probe::{NotificationSupport, probe, probe_host};

use std::collections::BTreeMap;

/// One observed signal: how much is left, out of how much.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub available: i64,
    pub capacity: i64,
    /// When the underlying stats were sampled, in the caller's clock (milliseconds).
    /// `None` means "always fresh", as a zero timestamp does in the kubelet.
    pub sampled_at_ms: Option<u64>,
}

/// All signals observed in one collection, keyed by signal.
pub type Observations = BTreeMap<Signal, Observation>;
