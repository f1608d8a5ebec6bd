//! Pod disk usage, measured in the background. Walking a pod's log directories,
//! writable layers and emptyDir volumes can visit 100,000 entries per pod, and a slow or
//! hung disk can make that take seconds; the decision cycle must not wait for it (memory
//! pressure is decided in milliseconds). So the cycle only registers each pod's
//! directories and reads the figures of the last walk, and one walker thread, like
//! cAdvisor's per-container disk usage handlers, walks them: at once when a pod appears or
//! its directories change, else every [`WALK_PERIOD`]. Figures are therefore up to one
//! period old, as the kubelet's are.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

/// How often every registered pod is walked again.
pub const WALK_PERIOD: Duration = Duration::from_secs(10);

/// Bytes on disk (allocated blocks, like `du`) and distinct inodes under a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskUsage {
    pub bytes: i64,
    pub inodes: i64,
    /// The walk stopped at its entry budget; the figures are a lower bound.
    pub truncated: bool,
}

impl DiskUsage {
    fn add(&mut self, other: DiskUsage) {
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.inodes = self.inodes.saturating_add(other.inodes);
        self.truncated |= other.truncated;
    }
}

/// Walk `root` without following symlinks, visiting at most `*budget` entries.
/// `None` when `root` does not exist.
pub fn disk_usage(root: &Path, budget: &mut u64) -> Option<DiskUsage> {
    let metadata = std::fs::symlink_metadata(root).ok()?;
    let mut seen = HashSet::new();
    let mut usage = DiskUsage::default();
    let mut stack = vec![(root.to_path_buf(), metadata)];
    while let Some((path, metadata)) = stack.pop() {
        if *budget == 0 {
            usage.truncated = true;
            break;
        }
        *budget -= 1;
        if seen.insert((metadata.dev(), metadata.ino())) {
            usage.bytes = usage.bytes.saturating_add(
                i64::try_from(metadata.blocks().saturating_mul(512)).unwrap_or(i64::MAX),
            );
            usage.inodes += 1;
        }
        if metadata.is_dir() {
            let Ok(entries) = std::fs::read_dir(&path) else {
                continue;
            };
            for entry in entries.flatten() {
                if let Ok(child) = entry.metadata() {
                    stack.push((entry.path(), child));
                }
            }
        }
    }
    Some(usage)
}

/// The directories of one pod that hold its local storage, already validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodDirectories {
    /// Per container: its name, its log directory and its writable layer.
    pub containers: Vec<(String, Option<PathBuf>, Option<PathBuf>)>,
    /// Per emptyDir volume: its name and directory.
    pub volumes: Vec<(String, PathBuf)>,
}

/// What the last walk of one pod found; `None` where a directory does not exist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodDiskFigures {
    /// Per container name: its logs and its writable layer.
    pub containers: HashMap<String, (Option<DiskUsage>, Option<DiskUsage>)>,
    /// Per volume name: what it holds.
    pub volumes: HashMap<String, DiskUsage>,
    /// Everything above together; `None` when no directory existed.
    pub total: Option<DiskUsage>,
}

impl PodDirectories {
    /// Walk every directory, `max_entries` entries at most in all.
    pub fn walk(&self, max_entries: u64) -> PodDiskFigures {
        let mut budget = max_entries;
        let mut figures = PodDiskFigures::default();
        let mut count = |usage: Option<DiskUsage>| {
            if let Some(usage) = usage {
                figures
                    .total
                    .get_or_insert_with(DiskUsage::default)
                    .add(usage);
            }
            usage
        };
        let mut containers = HashMap::new();
        for (name, logs, layer) in &self.containers {
            let logs = count(logs.as_deref().and_then(|dir| disk_usage(dir, &mut budget)));
            let layer = count(
                layer
                    .as_deref()
                    .and_then(|dir| disk_usage(dir, &mut budget)),
            );
            containers.insert(name.clone(), (logs, layer));
        }
        let mut volumes = HashMap::new();
        for (name, dir) in &self.volumes {
            if let Some(usage) = count(disk_usage(dir, &mut budget)) {
                volumes.insert(name.clone(), usage);
            }
        }
        figures.containers = containers;
        figures.volumes = volumes;
        figures
    }
}

#[derive(Debug, Default)]
struct Board {
    /// Shared with the pod source, which keeps each pod's until the pod changes: most
    /// cycles hand the same ones back, found unchanged without comparing the paths.
    directories: HashMap<String, Arc<PodDirectories>>,
    /// Handed to each cycle without copying the maps.
    figures: HashMap<String, Arc<PodDiskFigures>>,
    /// Pods registered or changed since the last walk began.
    changed: bool,
}

#[derive(Debug, Default)]
struct Shared {
    board: Mutex<Board>,
    wake: Condvar,
}

/// The cycle's side of the background walk, cheap to clone. The walker thread starts with
/// the first registration and ends within one period of the last clone being dropped.
#[derive(Debug, Clone)]
pub struct DiskWalker {
    shared: Arc<Shared>,
    max_entries: u64,
    period: Duration,
    started: Arc<OnceLock<()>>,
}

impl DiskWalker {
    pub fn new(max_entries: u64) -> Self {
        DiskWalker {
            shared: Arc::new(Shared::default()),
            max_entries,
            period: WALK_PERIOD,
            started: Arc::new(OnceLock::new()),
        }
    }

    fn board(&self) -> MutexGuard<'_, Board> {
        lock(&self.shared.board)
    }

    /// Keep walking `directories` for pod `uid`, and return the figures of its last walk
    /// (`None` until the first walk of this pod finished). Never touches the disk.
    pub fn track(
        &self,
        uid: &str,
        directories: &Arc<PodDirectories>,
    ) -> Option<Arc<PodDiskFigures>> {
        self.start_thread();
        let mut board = self.board();
        let unchanged = board
            .directories
            .get(uid)
            .is_some_and(|kept| Arc::ptr_eq(kept, directories) || kept == directories);
        if !unchanged {
            board
                .directories
                .insert(uid.to_string(), directories.clone());
            board.changed = true;
            self.shared.wake.notify_one();
        }
        board.figures.get(uid).cloned()
    }

    /// Stop walking pods that are no longer on the node.
    pub fn retain(&self, uids: &HashSet<String>) {
        let mut board = self.board();
        board.directories.retain(|uid, _| uids.contains(uid));
        board.figures.retain(|uid, _| uids.contains(uid));
    }

    /// One walk of every registered pod, on the calling thread.
    pub fn walk_all(&self) {
        walk_round(&self.shared, self.max_entries);
    }

    fn start_thread(&self) {
        self.started.get_or_init(|| {
            let shared = Arc::downgrade(&self.shared);
            let (max_entries, period) = (self.max_entries, self.period);
            let spawned = std::thread::Builder::new()
                .name("nodekeeper-disk-walk".to_string())
                .spawn(move || walk_forever(shared, max_entries, period));
            if let Err(error) = spawned {
                tracing::error!(%error, "cannot start the disk usage walker; pods get no storage figures");
            }
        });
    }
}

fn lock(board: &Mutex<Board>) -> MutexGuard<'_, Board> {
    // Plain data: a panic elsewhere while holding the lock leaves nothing half-written
    // that matters more than the next walk.
    board
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How often a waiting walker looks whether its owner is gone: the wait holds the shared
/// state, so a wakeup alone cannot be relied on to end it.
const OWNER_CHECK: Duration = Duration::from_secs(1);

fn walk_forever(shared: Weak<Shared>, max_entries: u64, period: Duration) {
    loop {
        let Some(strong) = shared.upgrade() else {
            return;
        };
        let deadline = std::time::Instant::now() + period;
        loop {
            let board = lock(&strong.board);
            if board.changed {
                break;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            drop(
                strong
                    .wake
                    .wait_timeout_while(board, left.min(OWNER_CHECK), |board| !board.changed),
            );
            if Arc::strong_count(&strong) == 1 {
                // Only this thread still holds it: the walker was dropped.
                return;
            }
        }
        walk_round(&strong, max_entries);
    }
}

fn walk_round(shared: &Shared, max_entries: u64) {
    let pods: Vec<(String, Arc<PodDirectories>)> = {
        let mut board = lock(&shared.board);
        board.changed = false;
        board
            .directories
            .iter()
            .map(|(uid, dirs)| (uid.clone(), dirs.clone()))
            .collect()
    };
    for (uid, directories) in pods {
        let figures = directories.walk(max_entries);
        if figures.total.is_some_and(|total| total.truncated) {
            tracing::debug!(%uid, "disk walk budget reached; storage usage is a lower bound");
        }
        let mut board = lock(&shared.board);
        // Skip a pod that left, or whose directories changed, while it was walked.
        if board.directories.get(&uid) == Some(&directories) {
            board.figures.insert(uid, Arc::new(figures));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_stops_at_its_budget_and_counts_hard_links_once() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..10 {
            std::fs::write(dir.path().join(format!("f{i}")), b"data").unwrap();
        }
        std::fs::hard_link(dir.path().join("f0"), dir.path().join("link")).unwrap();
        let mut budget = 100;
        let full = disk_usage(dir.path(), &mut budget).unwrap();
        assert_eq!(full.inodes, 11, "the directory and ten distinct files");
        assert!(!full.truncated);
        assert_eq!(budget, 100 - 12);
        let mut small = 4;
        let partial = disk_usage(dir.path(), &mut small).unwrap();
        assert!(partial.truncated);
        assert!(partial.inodes <= 4);
        assert_eq!(disk_usage(&dir.path().join("missing"), &mut 10), None);
    }

    fn volume(dir: &Path) -> Arc<PodDirectories> {
        Arc::new(PodDirectories {
            containers: Vec::new(),
            volumes: vec![("scratch".to_string(), dir.to_path_buf())],
        })
    }

    #[test]
    fn tracking_never_walks_the_figures_come_from_the_walker() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("data"), vec![b'z'; 32 * 1024]).unwrap();
        let walker = DiskWalker {
            period: Duration::from_secs(3600),
            ..DiskWalker::new(1000)
        };
        // Keep the background thread from racing this test's own walk.
        walker.started.get_or_init(|| ());
        assert_eq!(walker.track("u1", &volume(dir.path())), None);
        walker.walk_all();
        let figures = walker.track("u1", &volume(dir.path())).unwrap();
        assert!(figures.volumes["scratch"].bytes >= 32 * 1024, "{figures:?}");
        assert_eq!(figures.volumes["scratch"].inodes, 2);
        assert_eq!(figures.total.unwrap().inodes, 2);

        walker.retain(&HashSet::new());
        assert_eq!(walker.track("u1", &volume(dir.path())), None, "forgotten");
    }

    #[test]
    fn the_background_thread_walks_a_new_pod_at_once_and_stops_with_its_owner() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("data"), vec![b'z'; 8 * 1024]).unwrap();
        let walker = DiskWalker {
            period: Duration::from_secs(3600),
            ..DiskWalker::new(1000)
        };
        let weak = Arc::downgrade(&walker.shared);
        let mut figures = walker.track("u1", &volume(dir.path()));
        for _ in 0..500 {
            if figures.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
            figures = walker.track("u1", &volume(dir.path()));
        }
        assert!(
            figures.is_some(),
            "a new pod is walked at once, not after the period"
        );
        drop(walker);
        // The thread holds the shared state only while it waits or walks; with a long
        // period it keeps it until woken, so wake it as a new registration would.
        if let Some(shared) = weak.upgrade() {
            lock(&shared.board).changed = true;
            shared.wake.notify_one();
        }
        for _ in 0..500 {
            if weak.strong_count() == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the walker thread outlived its owner");
    }
}
