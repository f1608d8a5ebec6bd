//! Reading small kernel files without heap allocation: one stack buffer per read.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use super::error::{FileError, FileProblem};

/// Big enough for every cgroup and proc file we read (a v1 `memory.stat` is ~1.5 KiB,
/// `/proc/meminfo` ~1.5 KiB); a file that fills it is read to the end on the heap.
const STACK_BUFFER: usize = 8 * 1024;

/// Read `path` and hand its text to `parse`. Kernel files of one record (sysfs, sysctl,
/// `meminfo`, `memory.stat`, PSI) produce their whole content on the first read, and so
/// do regular files this small, so a read that leaves room in the buffer is taken as the
/// end of the file: one `read(2)` per file. (Not for files of one record per line, such
/// as `cgroup.procs`: the kernel hands those out about a page per read.)
///
/// Text cut short (see [`super::parse::complete_lines`]) is read once more: it is
/// transient, a file being rewritten or a short read, and one bad read should not cost a
/// signal its cycle, nor a pod its figure.
pub(crate) fn with_file_text<T>(
    path: &Path,
    mut parse: impl FnMut(&str) -> Result<T, FileProblem>,
) -> Result<T, FileError> {
    match read_once(path, &mut parse) {
        Err(error) if matches!(error.problem, FileProblem::CutShort(_)) => {
            read_once(path, &mut parse)
        }
        read => read,
    }
}

fn read_once<T>(
    path: &Path,
    parse: &mut impl FnMut(&str) -> Result<T, FileProblem>,
) -> Result<T, FileError> {
    let mut file = File::open(path).map_err(|e| FileError::new(path, e))?;
    let mut buffer = [0u8; STACK_BUFFER];
    let filled = loop {
        match file.read(&mut buffer) {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(FileError::new(path, e)),
        }
    };
    if filled == buffer.len() {
        return read_rest_on_heap(&mut file, &buffer, path, parse);
    }
    let text = std::str::from_utf8(&buffer[..filled])
        .map_err(|_| FileError::new(path, FileProblem::Malformed("not UTF-8".into())))?;
    parse(text).map_err(|problem| FileError::new(path, problem))
}

fn read_rest_on_heap<T>(
    file: &mut File,
    head: &[u8],
    path: &Path,
    parse: &mut impl FnMut(&str) -> Result<T, FileProblem>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_larger_than_the_stack_buffer_are_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.stat");
        let mut text = "filler 1\n".repeat(STACK_BUFFER / 9 + 10);
        text.push_str("inactive_file 4242\n");
        std::fs::write(&path, &text).unwrap();
        let value = with_file_text(&path, |t| {
            super::super::parse::flat_keyed_u64(t, "inactive_file")
        });
        assert_eq!(value.unwrap(), 4242);
    }

    /// A file read cut short the first time (`41` of a `pid_max` of `4194304`, the file
    /// being rewritten) is read again; the second, whole read is the figure.
    #[test]
    fn a_read_cut_short_is_read_once_more() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pid_max");
        std::fs::write(&path, "41").unwrap();
        let mut reads = Vec::new();
        let value = with_file_text(&path, |text| {
            reads.push(text.to_string());
            // The writer finishes between the two reads.
            std::fs::write(&path, "4194304\n").unwrap();
            super::super::parse::single_u64(text)
        });
        assert_eq!(value.expect("read again, whole"), 4194304);
        assert_eq!(reads, ["41", "4194304\n"]);
        // Cut short twice, it is an error naming the file.
        std::fs::write(&path, "41").unwrap();
        let error = with_file_text(&path, super::super::parse::single_u64).unwrap_err();
        assert!(matches!(error.problem, FileProblem::CutShort(_)), "{error}");
        assert!(error.to_string().contains("pid_max"), "{error}");
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.current");
        std::fs::write(&path, "12 kB\n").unwrap();
        let error = read_u64(&path).unwrap_err();
        assert_eq!(error.path, path);
        assert!(error.to_string().contains("memory.current"));
        assert!(is_not_found(
            &read_u64(&dir.path().join("absent")).unwrap_err()
        ));
    }
}
