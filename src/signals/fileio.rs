//! Reading small kernel files without heap allocation: one stack buffer per read.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use super::error::{FileError, FileProblem};

/// Big enough for every cgroup and proc file we read (a v1 `memory.stat` is ~1.5 KiB,
/// `/proc/meminfo` ~1.5 KiB); larger files fall back to a heap read.
const STACK_BUFFER: usize = 8 * 1024;

/// Read `path` and hand its text to `parse`. Kernel files generate their whole content on
/// the first read, so this is usually one `read(2)` plus the one that sees end of file.
pub(crate) fn with_file_text<T>(
    path: &Path,
    parse: impl FnOnce(&str) -> Result<T, FileProblem>,
) -> Result<T, FileError> {
    let mut file = File::open(path).map_err(|e| FileError::new(path, e))?;
    let mut buffer = [0u8; STACK_BUFFER];
    let mut filled = 0;
    loop {
        match file.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => {
                filled += n;
                if filled == buffer.len() {
                    return read_rest_on_heap(&mut file, &buffer, path, parse);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(FileError::new(path, e)),
        }
    }
    let text = std::str::from_utf8(&buffer[..filled])
        .map_err(|_| FileError::new(path, FileProblem::Malformed("not UTF-8".into())))?;
    parse(text).map_err(|problem| FileError::new(path, problem))
}

fn read_rest_on_heap<T>(
    file: &mut File,
    head: &[u8],
    path: &Path,
    parse: impl FnOnce(&str) -> Result<T, FileProblem>,
) -> Result<T, FileError> {
    let mut all = head.to_vec();
    file.read_to_end(&mut all)
        .map_err(|e| FileError::new(path, e))?;
    let text = std::str::from_utf8(&all)
        .map_err(|_| FileError::new(path, FileProblem::Malformed("not UTF-8".into())))?;
    parse(text).map_err(|problem| FileError::new(path, problem))
}

/// Read a file holding one unsigned integer (`memory.current`, `pid_max`, ...).
pub(crate) fn read_u64(path: &Path) -> Result<u64, FileError> {
    with_file_text(path, super::parse::single_u64)
}

pub(crate) fn is_not_found(problem: &FileError) -> bool {
    matches!(&problem.problem, FileProblem::Io(e) if e.kind() == std::io::ErrorKind::NotFound)
}
