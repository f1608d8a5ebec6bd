//! Real v1 (and hybrid v2) cgroups owned by one test: created under a unique name, and
//! always removed, after killing the test's own children by PID.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::allocator::{ALLOCATOR_ENV, AllocatorPlan};

pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
static NEXT: AtomicU32 = AtomicU32::new(0);

pub struct TestCgroups {
    /// The parent, relative to each hierarchy root, e.g. `nodekeeper-test-123-0`.
    pub parent: PathBuf,
    hierarchies: Vec<PathBuf>,
    created: Vec<PathBuf>,
    children: Vec<Child>,
    /// Arguments that make the re-executed binary run only the allocator: libtest needs
    /// a filter naming the test that calls `run_if_requested`; a harness-less bench none.
    pub allocator_args: Vec<String>,
}

/// The test every real-cgroup test binary must define, calling
/// `support::allocator::run_if_requested()`.
pub const ALLOCATOR_TEST: &str = "allocator_child";

/// Why a real-cgroup test cannot run here, or `None` when it can.
pub fn skip_reason(hierarchies: &[&str]) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".to_string());
    }
    for hierarchy in hierarchies {
        let dir = Path::new(CGROUP_ROOT).join(hierarchy);
        let marker = if *hierarchy == "unified" {
            "cgroup.controllers"
        } else {
            "cgroup.procs"
        };
        if !dir.join(marker).exists() {
            return Some(format!("{} is not a cgroup hierarchy", dir.display()));
        }
    }
    None
}

/// Skip (return early) with a message when the test cannot run here.
#[macro_export]
macro_rules! require_cgroups {
    ($($hierarchy:expr),+) => {
        if let Some(reason) = support::cgroups::skip_reason(&[$($hierarchy),+]) {
            eprintln!("SKIPPED: needs root and cgroup hierarchies {:?}: {reason}", [$($hierarchy),+]);
            return;
        }
    };
}

impl TestCgroups {
    /// Create the parent in each of `hierarchies` (`memory`, `freezer`, `unified`).
    pub fn create(hierarchies: &[&str]) -> TestCgroups {
        let parent = PathBuf::from(format!(
            "nodekeeper-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let mut cgroups = TestCgroups {
            parent: parent.clone(),
            hierarchies: hierarchies
                .iter()
                .map(|h| Path::new(CGROUP_ROOT).join(h))
                .collect(),
            created: Vec::new(),
            children: Vec::new(),
            allocator_args: [ALLOCATOR_TEST, "--exact", "--nocapture", "--test-threads=1"]
                .map(String::from)
                .to_vec(),
        };
        cgroups.make(&parent);
        cgroups
    }

    /// Create a child cgroup (relative to the parent) in every hierarchy; returns its path
    /// relative to the hierarchy roots.
    pub fn child(&mut self, name: &str) -> PathBuf {
        let relative = self.parent.join(name);
        self.make(&relative);
        relative
    }

    fn make(&mut self, relative: &Path) {
        for hierarchy in self.hierarchies.clone() {
            let dir = hierarchy.join(relative);
            std::fs::create_dir(&dir).unwrap();
            self.created.push(dir);
        }
    }

    pub fn dir(&self, hierarchy: &str, relative: &Path) -> PathBuf {
        Path::new(CGROUP_ROOT).join(hierarchy).join(relative)
    }

    pub fn set_memory_limit(&self, relative: &Path, bytes: u64) {
        std::fs::write(
            self.dir("memory", relative).join("memory.limit_in_bytes"),
            bytes.to_string(),
        )
        .unwrap();
    }

    /// Start an allocator child inside `relative` in every hierarchy, then let it go.
    /// The child's stdout is piped for crossing reports.
    pub fn spawn_allocator(&mut self, relative: &Path, plan: &AllocatorPlan) -> &mut Child {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(&self.allocator_args)
            .env(ALLOCATOR_ENV, plan.to_env())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        for hierarchy in &self.hierarchies {
            std::fs::write(
                hierarchy.join(relative).join("cgroup.procs"),
                child.id().to_string(),
            )
            .unwrap();
        }
        child.stdin.as_mut().unwrap().write_all(b"g").unwrap();
        self.children.push(child);
        self.children.last_mut().unwrap()
    }

    /// The PIDs in a cgroup of one hierarchy (not its descendants).
    pub fn procs(&self, hierarchy: &str, relative: &Path) -> Vec<u32> {
        std::fs::read_to_string(self.dir(hierarchy, relative).join("cgroup.procs"))
            .unwrap()
            .lines()
            .map(|line| line.parse().unwrap())
            .collect()
    }

    pub fn child_mut(&mut self, pid: u32) -> &mut Child {
        self.children.iter_mut().find(|c| c.id() == pid).unwrap()
    }

    /// Drop a child that has been reaped, so cleanup does not touch its (reusable) PID.
    pub fn forget_child(&mut self, pid: u32) {
        self.children.retain(|c| c.id() != pid);
    }

    /// Whether a child this test started is still running (not yet reaped).
    pub fn child_running(&mut self, pid: u32) -> bool {
        let child = self.children.iter_mut().find(|c| c.id() == pid).unwrap();
        child.try_wait().unwrap().is_none()
    }

    /// Wait (bounded) for a child this test started to exit; returns its exit status.
    pub fn wait_child(&mut self, pid: u32, limit: Duration) -> Option<std::process::ExitStatus> {
        let child = self.children.iter_mut().find(|c| c.id() == pid).unwrap();
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for TestCgroups {
    fn drop(&mut self) {
        for hierarchy in &self.hierarchies {
            if hierarchy.ends_with("freezer") {
                for dir in &self.created {
                    if dir.starts_with(hierarchy) {
                        let _ = std::fs::write(dir.join("freezer.state"), "THAWED");
                    }
                }
            }
        }
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Deepest first; a cgroup whose last task is still exiting refuses rmdir briefly.
        for dir in self.created.iter().rev() {
            for _ in 0..200 {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }
    }
}
