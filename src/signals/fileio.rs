//! Reading small kernel files without an allocation per read: each thread reads into one
//! buffer of its own, reused from read to read.
//!
//! The thread that runs the decision cycles reads the same few dozen kernel files every
//! cycle; opening and closing them was a third of its CPU, most of it path lookups through
//! kernfs. On that thread (see [`keep_kernel_files_open_on_this_thread`]) a file of a
//! kernel pseudo-filesystem stays open and is read again from its start, which makes the
//! kernel generate it afresh. A file whose cgroup was removed fails that read (`ENODEV`:
//! the kernel drains the files of a removed cgroup), and is then opened again by its path,
//! so a cgroup removed and made again under the same name is read as the new one. Files
//! not read in a cycle are closed at its end, so a removed pod's files are not held (a
//! cycle that ranked on kept pod figures, with `podStatsMaxAge`, ends none: the pods'
//! files wait for the next cycle that reads every pod, within about two housekeeping
//! intervals).
//!
//! Not every kernel file starts afresh when read again from its start: a v1
//! `cgroup.procs` or `tasks` serves the pid list made for that open file for about a
//! second, and `/proc/<pid>/maps`, `environ` and the like hold the process's memory as
//! it was at open. None of them is read through this module (pid lists are walked with
//! `std::fs`), and none may be.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::error::{FileError, FileProblem};

/// Big enough for every cgroup and proc file we read (a v1 `memory.stat` is ~1.5 KiB,
/// `/proc/meminfo` ~1.5 KiB); a file that fills it is read to the end on the heap.
const READ_BUFFER_SIZE: usize = 8 * 1024;

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
    // Taken out of its entry while in use, so a parser that reads a file itself cannot
    // find the set borrowed; the entry and its key stay, for the file to go back to.
    let kept = KEPT_OPEN.with_borrow_mut(|kept| kept.as_mut().map(|kept| kept.take(path)));
    let Some(kept) = kept else {
        // This thread keeps no files.
        let file = File::open(path).map_err(|e| FileError::new(path, e))?;
        return read_and_parse(&file, ReadAt::Position, path, parse, &mut false);
    };
    if let Some(file) = kept {
        // Read at offset 0 (`pread`): no seek back first. A file that cannot be read
        // at an offset (ESPIPE: none of the kernel files read here is such a stream)
        // fails like a removed cgroup's, and is opened again by its path below, each
        // time it is read.
        let mut unreadable = false;
        let read = read_and_parse(&file, ReadAt::Offsets, path, parse, &mut unreadable);
        if !unreadable {
            // Its figure, or what is wrong with its text: this read's answer.
            keep(path, file);
            return read;
        }
        // Its cgroup was removed: the file is closed and the path opened again.
        forget(path);
    }
    let file = File::open(path).map_err(|e| FileError::new(path, e))?;
    let read = read_and_parse(&file, ReadAt::Position, path, parse, &mut false);
    // The filesystem is asked only when there is room to keep the file: past the limit,
    // a read costs no more than on a thread that keeps none.
    if read.is_ok() && has_room_for(path) && is_kernel_pseudo_file(&file) {
        keep(path, file);
    }
    read
}

/// How a file is read: at explicit offsets from 0 whatever its position (`pread`, for a
/// file kept open and read again), or on from where it stands (a fresh open, at its
/// start).
#[derive(Clone, Copy, PartialEq, Eq)]
enum ReadAt {
    Offsets,
    Position,
}

/// Read `file` to its end (from offset 0, or from where it stands) and parse the text;
/// `unreadable` is set when the file itself could not be read (rather than holding bad
/// text).
fn read_and_parse<T>(
    file: &File,
    from: ReadAt,
    path: &Path,
    parse: &mut impl FnMut(&str) -> Result<T, FileProblem>,
    unreadable: &mut bool,
) -> Result<T, FileError> {
    // The thread's buffer, taken while in use (a parser that reads a file itself gets a
    // new one): a buffer zeroed on the stack for every read cost 8 KiB of writes a read,
    // hundreds of times a cycle on a node with many pods.
    let mut buffer = READ_BUFFER.take();
    buffer.resize(READ_BUFFER_SIZE, 0);
    let read = read_and_parse_with(file, from, path, parse, unreadable, &mut buffer);
    READ_BUFFER.set(buffer);
    read
}

thread_local! {
    /// The buffer each read on this thread goes into; kept between reads.
    static READ_BUFFER: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

fn read_and_parse_with<T>(
    file: &File,
    from: ReadAt,
    path: &Path,
    parse: &mut impl FnMut(&str) -> Result<T, FileProblem>,
    unreadable: &mut bool,
    buffer: &mut [u8],
) -> Result<T, FileError> {
    let filled = match read_into(file, from, 0, buffer) {
        Ok(filled) => filled,
        Err(e) => {
            *unreadable = true;
            return Err(FileError::new(path, e));
        }
    };
    if filled < buffer.len() {
        return parse_text(&buffer[..filled], path, parse);
    }
    // The buffer is full: the rest on the heap, from where the buffer ended.
    let mut all = buffer.to_vec();
    let mut chunk = vec![0u8; READ_BUFFER_SIZE];
    loop {
        match read_into(file, from, all.len() as u64, &mut chunk) {
            Ok(0) => break,
            Ok(n) => all.extend_from_slice(&chunk[..n]),
            Err(e) => {
                *unreadable = true;
                return Err(FileError::new(path, e));
            }
        }
    }
    parse_text(&all, path, parse)
}

/// One read into `buffer`: at `offset` with [`ReadAt::Offsets`], else where the file
/// stands (`offset` unused: it stands there). Retried when interrupted.
fn read_into(
    mut file: &File,
    from: ReadAt,
    offset: u64,
    buffer: &mut [u8],
) -> std::io::Result<usize> {
    loop {
        let read = match from {
            ReadAt::Offsets => file.read_at(buffer, offset),
            ReadAt::Position => file.read(buffer),
        };
        match read {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            read => return read,
        }
    }
}

fn parse_text<T>(
    bytes: &[u8],
    path: &Path,
    parse: &mut impl FnMut(&str) -> Result<T, FileProblem>,
) -> Result<T, FileError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| FileError::new(path, FileProblem::Malformed("not UTF-8".into())))?;
    parse(text).map_err(|problem| FileError::new(path, problem))
}

/// Read a file holding one unsigned integer (`memory.current`, `pid_max`, ...).
pub(crate) fn read_u64(path: &Path) -> Result<u64, FileError> {
    with_file_text(path, super::parse::single_u64)
}

/// The files kept open on this thread, when it keeps any.
struct KeptOpen {
    /// By the path's bytes: the cycle looks up every file it reads here, and hashing a
    /// `Path` goes component by component, which cost more than some of the reads.
    files: HashMap<OsString, KeptFile, BuildHasherDefault<PathHasher>>,
    /// The cycle now under way; a file last read in an earlier one is closed.
    cycle: u64,
    /// At most this many files: a node with many pods must not run the agent out of
    /// file descriptors. Files past it are opened and closed for every read, as before.
    capacity: usize,
}

struct KeptFile {
    /// `None` while a read has it out.
    file: Option<File>,
    read_in_cycle: u64,
}

impl KeptOpen {
    /// The kept file for `path`, taken out of its entry: `None` when there is none.
    fn take(&mut self, path: &Path) -> Option<File> {
        self.files
            .get_mut(path.as_os_str())
            .and_then(|kept| kept.file.take())
    }

    fn has_room_for(&self, path: &Path) -> bool {
        self.files.len() < self.capacity || self.files.contains_key(path.as_os_str())
    }
}

/// FxHash's step (a rotate, an xor and a multiply per eight bytes): the keys are paths
/// the agent makes itself, so nothing needs SipHash's resistance to chosen keys.
#[derive(Default)]
pub(crate) struct PathHasher(u64);

impl Hasher for PathHasher {
    fn write(&mut self, bytes: &[u8]) {
        const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(SEED);
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(SEED);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

thread_local! {
    static KEPT_OPEN: RefCell<Option<KeptOpen>> = const { RefCell::new(None) };
}

/// At most this many files are kept open, and at most a quarter of the process's soft
/// limit of open files (the agent raises its soft limit to the hard one at start). Each
/// costs the kernel about 4.3–4.7 KiB (its open file and the page its text is generated
/// into), charged to the agent's cgroup: 2,048 come to about 9–10 MiB. Enough for 250 pods
/// of one container in Kubernetes mode (four files each: the pod's usage and
/// `memory.stat`, the container's usage and `memory.stat`; five with a `pid.available`
/// threshold, which adds the pod's process count), and for standalone mode's two or
/// three per pod.
const MOST_KEPT_OPEN: usize = 2048;

/// Whether this thread would keep the file of `path` (at most [`KeptOpen::capacity`]).
fn has_room_for(path: &Path) -> bool {
    KEPT_OPEN.with_borrow(|kept| kept.as_ref().is_some_and(|kept| kept.has_room_for(path)))
}

/// Put `file` (back) in the entry for `path`, read in this cycle. A new entry, with its
/// key, is made only the first time (or after the file failed), within the limit.
fn keep(path: &Path, file: File) {
    KEPT_OPEN.with_borrow_mut(|kept| {
        let Some(kept) = kept.as_mut() else {
            return;
        };
        let read_in_cycle = kept.cycle;
        if let Some(entry) = kept.files.get_mut(path.as_os_str()) {
            entry.file = Some(file);
            entry.read_in_cycle = read_in_cycle;
            return;
        }
        if !kept.has_room_for(path) {
            return;
        }
        kept.files.insert(
            path.as_os_str().to_os_string(),
            KeptFile {
                file: Some(file),
                read_in_cycle,
            },
        );
    });
}

/// Drop the entry for `path`: its file could not be read (its cgroup was removed).
fn forget(path: &Path) {
    KEPT_OPEN.with_borrow_mut(|kept| {
        if let Some(kept) = kept.as_mut() {
            kept.files.remove(path.as_os_str());
        }
    });
}

/// Files of the kernel's pseudo-filesystems (cgroupfs, procfs, sysfs) are generated
/// afresh by each read from the start, and those of a removed cgroup fail to read. A
/// regular file could be replaced under its name with no error on the old one, so it is
/// never kept.
fn is_kernel_pseudo_file(file: &File) -> bool {
    use nix::sys::statfs::{
        CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC, PROC_SUPER_MAGIC, SYSFS_MAGIC, fstatfs,
    };
    fstatfs(file).is_ok_and(|fs| {
        let kind = fs.filesystem_type();
        [
            CGROUP_SUPER_MAGIC,
            CGROUP2_SUPER_MAGIC,
            PROC_SUPER_MAGIC,
            SYSFS_MAGIC,
        ]
        .contains(&kind)
    })
}

/// From now on this thread keeps the kernel files it reads open between cycles (the
/// module's documentation says why and how). For the one thread that runs the decision
/// cycles, which calls [`end_kernel_file_cycle`] after each. Returns how many files it
/// keeps at most.
pub fn keep_kernel_files_open_on_this_thread() -> usize {
    let soft_limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft);
    let capacity = usize::try_from(soft_limit / 4)
        .unwrap_or(MOST_KEPT_OPEN)
        .min(MOST_KEPT_OPEN);
    keep_at_most_on_this_thread(capacity);
    capacity
}

fn keep_at_most_on_this_thread(capacity: usize) {
    KEPT_OPEN.with_borrow_mut(|kept| {
        kept.get_or_insert_with(|| KeptOpen {
            files: HashMap::default(),
            cycle: 0,
            capacity,
        });
    });
}

/// A cycle has ended on this thread: close the kept files it did not read (a pod gone,
/// a signal no longer collected). Nothing on a thread that keeps no files. The agent
/// does not call it after a cycle that ranked on kept pod figures, which read few of the
/// pods' files.
pub fn end_kernel_file_cycle() {
    KEPT_OPEN.with_borrow_mut(|kept| {
        if let Some(kept) = kept.as_mut() {
            let cycle = kept.cycle;
            kept.files.retain(|_, file| file.read_in_cycle == cycle);
            kept.cycle += 1;
        }
    });
}

/// How many files this thread keeps open now.
pub fn kernel_files_kept_open() -> usize {
    KEPT_OPEN.with_borrow(|kept| {
        kept.as_ref().map_or(0, |kept| {
            kept.files
                .values()
                .filter(|entry| entry.file.is_some())
                .count()
        })
    })
}

pub(crate) fn is_not_found(problem: &FileError) -> bool {
    problem.problem.is_not_found()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// On its own thread: the kept files are per thread.
    fn on_a_new_thread(test: impl FnOnce() + Send + 'static) {
        std::thread::spawn(test).join().unwrap();
    }

    fn name(text: &str) -> Result<String, FileProblem> {
        Ok(text.trim().to_string())
    }

    /// Ends the child however the test ends.
    struct Sleeper(std::process::Child);

    impl Drop for Sleeper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A procfs file this thread can change: its own name.
    const COMM: &str = "/proc/thread-self/comm";

    #[test]
    fn a_kept_kernel_file_is_read_afresh_and_closed_after_a_cycle_without_a_read() {
        on_a_new_thread(|| {
            let comm = Path::new(COMM);
            std::fs::write(comm, "not-kept").unwrap();
            assert_eq!(with_file_text(comm, name).unwrap(), "not-kept");
            assert_eq!(
                kernel_files_kept_open(),
                0,
                "kept on a thread that keeps none"
            );

            keep_kernel_files_open_on_this_thread();
            std::fs::write(comm, "kept-first").unwrap();
            assert_eq!(with_file_text(comm, name).unwrap(), "kept-first");
            assert_eq!(kernel_files_kept_open(), 1);
            // Through the kept file: what the kernel makes of it now.
            std::fs::write(comm, "kept-second").unwrap();
            assert_eq!(with_file_text(comm, name).unwrap(), "kept-second");
            assert_eq!(with_file_text(comm, name).unwrap(), "kept-second");
            assert_eq!(kernel_files_kept_open(), 1);

            end_kernel_file_cycle();
            assert_eq!(kernel_files_kept_open(), 1, "read in the cycle that ended");
            end_kernel_file_cycle();
            assert_eq!(kernel_files_kept_open(), 0, "not read in the last cycle");
        });
    }

    /// A parser that reads a file itself, the very file being parsed included, finds
    /// neither the kept files nor the read buffer in use: each read gets its own, both
    /// answers are whole, and one file stays kept for the path.
    #[test]
    fn a_read_inside_a_parse_gets_its_own_file_and_buffer() {
        on_a_new_thread(|| {
            keep_kernel_files_open_on_this_thread();
            let comm = Path::new(COMM);
            std::fs::write(comm, "outer").unwrap();
            assert_eq!(with_file_text(comm, name).unwrap(), "outer");
            let nested = with_file_text(comm, |outer| {
                std::fs::write(comm, "inner").unwrap();
                let inner = with_file_text(comm, name)
                    .map_err(|e| FileProblem::Malformed(e.to_string()))?;
                let loadavg = with_file_text(Path::new("/proc/loadavg"), name)
                    .map_err(|e| FileProblem::Malformed(e.to_string()))?;
                Ok((outer.trim().to_string(), inner, loadavg.split(' ').count()))
            })
            .unwrap();
            assert_eq!(nested, ("outer".to_string(), "inner".to_string(), 5));
            assert_eq!(kernel_files_kept_open(), 2, "comm and loadavg");
            std::fs::write(comm, "after").unwrap();
            assert_eq!(with_file_text(comm, name).unwrap(), "after");
            assert_eq!(kernel_files_kept_open(), 2);
        });
    }

    /// A kept file that can no longer be read (here a process's, once it has ended; a
    /// removed cgroup's fails the same way) is closed, and its path opened again.
    #[test]
    fn a_kept_file_that_fails_to_read_is_closed_and_its_path_opened_again() {
        on_a_new_thread(|| {
            keep_kernel_files_open_on_this_thread();
            let child = Sleeper(
                std::process::Command::new("sleep")
                    .arg("30")
                    .spawn()
                    .unwrap(),
            );
            let comm = PathBuf::from(format!("/proc/{}/comm", child.0.id()));
            assert_eq!(with_file_text(&comm, name).unwrap(), "sleep");
            assert_eq!(kernel_files_kept_open(), 1);
            drop(child);
            let error = with_file_text(&comm, name).unwrap_err();
            assert!(is_not_found(&error), "the path is read again: {error}");
            assert_eq!(kernel_files_kept_open(), 0);
        });
    }

    /// A regular file can be replaced under its name with no error on the old one: it
    /// is never kept, so a replacement is read.
    #[test]
    fn regular_files_are_not_kept() {
        on_a_new_thread(|| {
            keep_kernel_files_open_on_this_thread();
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("memory.current");
            std::fs::write(&path, "1\n").unwrap();
            assert_eq!(read_u64(&path).unwrap(), 1);
            let replacement = dir.path().join("replacement");
            std::fs::write(&replacement, "2\n").unwrap();
            std::fs::rename(&replacement, &path).unwrap();
            assert_eq!(read_u64(&path).unwrap(), 2);
            assert_eq!(kernel_files_kept_open(), 0);
        });
    }

    #[test]
    fn no_more_files_are_kept_than_the_limit_and_the_others_are_still_read() {
        on_a_new_thread(|| {
            keep_at_most_on_this_thread(2);
            for file in ["/proc/loadavg", "/proc/meminfo", "/proc/uptime"] {
                with_file_text(Path::new(file), name).unwrap();
            }
            assert_eq!(kernel_files_kept_open(), 2);
            // The third is read every time without being kept.
            std::fs::write(COMM, "over-the-limit").unwrap();
            assert_eq!(
                with_file_text(Path::new(COMM), name).unwrap(),
                "over-the-limit"
            );
            assert_eq!(kernel_files_kept_open(), 2);
        });
    }

    #[test]
    fn the_limit_is_a_quarter_of_the_open_file_limit_and_at_most_2048() {
        on_a_new_thread(|| {
            let (soft, _) =
                nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
            keep_kernel_files_open_on_this_thread();
            let capacity = KEPT_OPEN.with_borrow(|kept| kept.as_ref().unwrap().capacity);
            assert_eq!(capacity as u64, (soft / 4).min(2048));
        });
    }

    #[test]
    fn files_larger_than_the_read_buffer_are_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.stat");
        let mut text = "filler 1\n".repeat(READ_BUFFER_SIZE / 9 + 10);
        text.push_str("inactive_file 4242\n");
        std::fs::write(&path, &text).unwrap();
        let value = with_file_text(&path, |t| {
            super::super::parse::flat_keyed_u64(t, "inactive_file")
        });
        assert_eq!(value.unwrap(), 4242);
    }

    /// A kept file is read at offset 0 however far the last read went, and one larger
    /// than the read buffer is read on at the offsets that follow, every time.
    ///
    /// The file is a process's environment, in procfs: larger than the buffer, and its
    /// text stays the same, so each read can be checked whole. The agent itself must not
    /// keep such a file (the module's note), and it is not a seq_file, as the cgroup and
    /// proc files the agent reads are: this shows the offsets, not the kernel's
    /// regeneration, which the test of `comm` above shows.
    #[test]
    fn a_kept_kernel_file_larger_than_the_read_buffer_is_read_whole_every_time() {
        on_a_new_thread(|| {
            let big = "x".repeat(3 * READ_BUFFER_SIZE + 100);
            let child = Sleeper(
                std::process::Command::new("sleep")
                    .arg("60")
                    .env_clear()
                    .env("BIG", &big)
                    .spawn()
                    .expect("sleep starts"),
            );
            let path = PathBuf::from(format!("/proc/{}/environ", child.0.id()));
            keep_kernel_files_open_on_this_thread();
            let whole = |text: &str| Ok(text.to_string());
            let reads: Vec<_> = (0..3).map(|_| with_file_text(&path, whole)).collect();
            let kept = kernel_files_kept_open();
            drop(child);
            let expected = format!("BIG={big}\0");
            for read in reads {
                let read = read.map(|text| text.len()).map_err(|e| e.to_string());
                assert_eq!(read, Ok(expected.len()));
            }
            assert_eq!(kept, 1, "the environ file was kept open between the reads");
        });
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
