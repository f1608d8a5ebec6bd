//! cgroup v2 `memory.events`: the kernel announces every change of the file, so watching
//! it reveals the moment the pods cgroup hits `memory.high`, `memory.max` or the OOM
//! killer, without polling.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use super::error::NotifyError;
use super::inotify::FileWatch;

/// The counters of `memory.events` that mean memory is running out. `low` is left out:
/// reclaim below `memory.low` is protection working, not pressure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryEventCounts {
    pub high: u64,
    pub max: u64,
    pub oom: u64,
    pub oom_kill: u64,
}

impl MemoryEventCounts {
    /// Parse the flat keyed file; unknown keys (newer kernels add some) are ignored and
    /// missing ones count as zero.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut counts = MemoryEventCounts::default();
        // Whole lines only: a line cut short is not a count (`oom_kill 1` of `oom_kill
        // 12`); the file is read to its end, so only a file rewritten meanwhile has one.
        for line in crate::signals::parse::complete_lines(text).lines() {
            let mut fields = line.split_ascii_whitespace();
            let (Some(key), Some(value)) = (fields.next(), fields.next()) else {
                continue;
            };
            let slot = match key {
                "high" => &mut counts.high,
                "max" => &mut counts.max,
                "oom" => &mut counts.oom,
                "oom_kill" => &mut counts.oom_kill,
                _ => continue,
            };
            *slot = value
                .parse()
                .map_err(|_| format!("`{key}` has non-integer value {value:?}"))?;
        }
        Ok(counts)
    }

    /// Whether any pressure counter grew since `earlier`. Counters only grow; a smaller
    /// value means the cgroup was recreated, which is not pressure by itself.
    pub fn moved_since(&self, earlier: &MemoryEventCounts) -> bool {
        self.high > earlier.high
            || self.max > earlier.max
            || self.oom > earlier.oom
            || self.oom_kill > earlier.oom_kill
    }
}

/// Watches one `memory.events` file.
pub struct MemoryEventsWatch {
    watch: FileWatch,
    path: PathBuf,
    /// Shared with [`super::WaitingNotifications`], which tells a change the watch would
    /// wake a cycle for from one it would skip.
    last: Arc<Mutex<MemoryEventCounts>>,
}

impl MemoryEventsWatch {
    /// Start watching `path` (a cgroup's `memory.events`). Must be called inside a tokio
    /// runtime.
    pub fn new(path: &Path) -> Result<Self, NotifyError> {
        let watch = FileWatch::new(path)?;
        let last = read_counts(path)?;
        Ok(MemoryEventsWatch {
            watch,
            path: path.to_path_buf(),
            last: Arc::new(Mutex::new(last)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The inotify instance, readable while a modification waits.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.watch.fd()
    }

    /// The counts the watch last read.
    pub fn seen(&self) -> Arc<Mutex<MemoryEventCounts>> {
        self.last.clone()
    }

    /// Wait until a pressure counter grows; returns the new counts. Changes of other
    /// counters are read and skipped.
    pub async fn pressure(&mut self) -> Result<MemoryEventCounts, NotifyError> {
        loop {
            self.watch.modified().await?;
            let counts = read_counts(&self.path)?;
            let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
            let moved = counts.moved_since(&last);
            *last = counts;
            drop(last);
            if moved {
                return Ok(counts);
            }
        }
    }
}

pub(super) fn read_counts(path: &Path) -> Result<MemoryEventCounts, NotifyError> {
    let text = std::fs::read_to_string(path).map_err(|e| NotifyError::io(path, "read", e))?;
    MemoryEventCounts::parse(&text).map_err(|reason| NotifyError::Malformed {
        path: path.to_path_buf(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_pressure_counters_and_ignores_the_rest() {
        let text = "low 3\nhigh 10\nmax 2\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(
            MemoryEventCounts::parse(text).unwrap(),
            MemoryEventCounts {
                high: 10,
                max: 2,
                oom: 1,
                oom_kill: 1
            }
        );
        assert!(MemoryEventCounts::parse("oom x\n").is_err());
    }

    #[test]
    fn only_growth_of_a_pressure_counter_counts_as_pressure() {
        let before = MemoryEventCounts::parse("low 0\nhigh 1\nmax 0\noom 0\n").unwrap();
        let low_only = MemoryEventCounts::parse("low 9\nhigh 1\nmax 0\noom 0\n").unwrap();
        let high = MemoryEventCounts::parse("low 0\nhigh 2\nmax 0\noom 0\n").unwrap();
        let oom = MemoryEventCounts::parse("high 1\noom 1\n").unwrap();
        assert!(!low_only.moved_since(&before));
        assert!(high.moved_since(&before));
        assert!(oom.moved_since(&before));
        assert!(!before.moved_since(&high));
    }
}
