//! The collector's one-file readers, public so benchmarks can hold them against other
//! implementations (the `procfs` crate) on the same files. One `read(2)` into a stack
//! buffer and a parse over the borrowed text, as the collector does every cycle.

use std::path::Path;

use super::error::FileError;
use super::fileio::with_file_text;
use super::parse::{MemInfo, loadavg_process_count, meminfo};
use super::pressure::{PressureReading, PressureResource, PressureScope, parse_pressure};

/// `/proc/meminfo`: the fields the memory signals need.
pub fn read_meminfo(path: &Path) -> Result<MemInfo, FileError> {
    with_file_text(path, meminfo)
}

/// `/proc/loadavg`: the number of processes and threads (the pid signal's usage).
pub fn read_process_count(path: &Path) -> Result<u64, FileError> {
    with_file_text(path, loadavg_process_count)
}

/// A PSI file (`/proc/pressure/memory`): its `some` and `full` lines appended to `out`.
pub fn read_pressure(
    path: &Path,
    resource: PressureResource,
    out: &mut Vec<PressureReading>,
) -> Result<(), FileError> {
    with_file_text(path, |text| {
        parse_pressure(text, resource, &PressureScope::Node, out)
    })
}
