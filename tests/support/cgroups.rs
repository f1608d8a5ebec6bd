//! Real cgroups (v1 controllers and the v2 hierarchy, wherever this machine mounts them)
//! owned by one test: created under a unique name, and always removed, after killing the
//! test's own children by PID.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use super::allocator::{ALLOCATOR_ENV, AllocatorPlan, OSCILLATOR_ENV, OscillatorPlan};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The tests' name for the unified (cgroup v2) hierarchy; every other name is a v1
/// controller (`memory`, `freezer`).
pub const V2: &str = "v2";

/// One cgroup mount of this machine, from `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    pub point: PathBuf,
    /// `cgroup` (v1) or `cgroup2`.
    pub fstype: String,
    /// The super options; for v1 they name the controllers (`rw,memory`).
    pub super_options: Vec<String>,
}

/// The cgroup mounts listed in a mountinfo text (see proc(5)): the mount point is the
/// fifth field, and after the ` - ` separator come the filesystem type, the source and
/// the super options. Octal escapes (`\040` for a space) in the mount point are decoded.
pub fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (mount, filesystem) = line.split_once(" - ")?;
            let point = mount.split(' ').nth(4)?;
            let mut filesystem = filesystem.split(' ');
            let fstype = filesystem.next()?;
            let _source = filesystem.next()?;
            let super_options = filesystem.next().unwrap_or_default();
            matches!(fstype, "cgroup" | "cgroup2").then(|| CgroupMount {
                point: PathBuf::from(unescape_mount_point(point)),
                fstype: fstype.to_string(),
                super_options: super_options.split(',').map(str::to_string).collect(),
            })
        })
        .collect()
}

/// A mount point as mountinfo escapes it (`\040` for a space), decoded.
pub fn unescape_mount_point(escaped: &str) -> String {
    let bytes = escaped.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)));
        match octal {
            Some(digits) => {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where this machine mounts `hierarchy` ([`V2`] or a v1 controller), as this process
/// sees it in `/proc/self/mountinfo`: `/sys/fs/cgroup` on a unified host,
/// `/sys/fs/cgroup/unified` for v2 on a hybrid one.
pub fn mount_point(hierarchy: &str) -> Result<PathBuf, String> {
    find_mount(&this_process_mounts()?, hierarchy)
}

/// The cgroup mounts this process sees.
pub fn this_process_mounts() -> Result<Vec<CgroupMount>, String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|mountinfo| cgroup_mounts(&mountinfo))
        .map_err(|e| format!("/proc/self/mountinfo: {e}"))
}

fn find_mount(mounts: &[CgroupMount], hierarchy: &str) -> Result<PathBuf, String> {
    let found = if hierarchy == V2 {
        mounts.iter().find(|m| m.fstype == "cgroup2")
    } else {
        mounts
            .iter()
            .find(|m| m.fstype == "cgroup" && m.super_options.iter().any(|o| o == hierarchy))
    };
    found.map(|m| m.point.clone()).ok_or_else(|| {
        if hierarchy == V2 {
            "no cgroup2 filesystem is mounted".to_string()
        } else {
            format!("no cgroup v1 hierarchy with the {hierarchy} controller is mounted")
        }
    })
}

/// A parent cgroup's name no other test (of this process or another) uses:
/// `nodekeeper`, `kind`, this process's PID and a count, joined by `separator`.
fn unique_name(kind: &str, separator: &str) -> String {
    let pid = std::process::id().to_string();
    let count = NEXT.fetch_add(1, Ordering::Relaxed).to_string();
    ["nodekeeper", kind, &pid, &count].join(separator)
}

pub struct TestCgroups {
    /// The parent, relative to each hierarchy root, e.g. `nodekeeper-test-123-0`.
    pub parent: PathBuf,
    /// (name, mount point) of each hierarchy the cgroups are made in.
    hierarchies: Vec<(String, PathBuf)>,
    created: Vec<PathBuf>,
    children: Vec<Child>,
    /// Arguments that make the re-executed binary run only the allocator: libtest needs
    /// a filter naming the (ignored) test that calls `run_if_requested`; a harness-less
    /// bench none.
    pub allocator_args: Vec<String>,
}

/// The test every real-cgroup test binary must define (`#[ignore]`d), calling
/// `support::allocator::run_if_requested()`.
pub const ALLOCATOR_TEST: &str = "allocator_child";

impl TestCgroups {
    /// Create a parent cgroup this test owns in each of `hierarchies` (v1 controllers such
    /// as `memory` and `freezer`, or [`V2`]), found through the mount table. `Err` says
    /// why real cgroups cannot be used here (not root, not mounted, not writable).
    pub fn create(hierarchies: &[&str]) -> Result<TestCgroups, String> {
        TestCgroups::create_named(hierarchies, PathBuf::from(unique_name("test", "-")))
    }

    /// [`TestCgroups::create`] with the parent named as a systemd slice would be,
    /// `nodekeeper_slicetest_<pid>_<n>.slice` (no `-`, which in a slice's name marks a level),
    /// for tests of the kubelet's systemd cgroup driver; systemd itself does not manage it.
    pub fn create_slice(hierarchies: &[&str]) -> Result<TestCgroups, String> {
        // Not `nodekeeper_test_…`: the systemd driver's name for a cgroupfs test's
        // `/nodekeeper-test-<pid>-<n>/kubepods`, whose driver a left-over slice of that
        // name would change.
        let slice = format!("{}.slice", unique_name("slicetest", "_"));
        TestCgroups::create_named(hierarchies, PathBuf::from(slice))
    }

    fn create_named(hierarchies: &[&str], parent: PathBuf) -> Result<TestCgroups, String> {
        super::real::root()?;
        let mounts = this_process_mounts()?;
        let mut resolved = Vec::new();
        for hierarchy in hierarchies {
            resolved.push((hierarchy.to_string(), find_mount(&mounts, hierarchy)?));
        }
        let mut cgroups = TestCgroups {
            parent: parent.clone(),
            hierarchies: resolved,
            created: Vec::new(),
            children: Vec::new(),
            allocator_args: [
                ALLOCATOR_TEST,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ]
            .map(String::from)
            .to_vec(),
        };
        cgroups.make(&parent)?;
        Ok(cgroups)
    }

    /// The mount point of one of this test's hierarchies.
    pub fn mount(&self, hierarchy: &str) -> &Path {
        self.hierarchies
            .iter()
            .find(|(name, _)| name == hierarchy)
            .map(|(_, mount)| mount.as_path())
            .unwrap_or_else(|| panic!("{hierarchy} is not one of this test's hierarchies"))
    }

    /// The directory holding the v1 controller mounts (`/sys/fs/cgroup`), which is what
    /// the agent's `cgroupRoot` names; it must hold this test's v1 hierarchies under their
    /// controller names, as the agent expects.
    pub fn v1_root(&self) -> PathBuf {
        let memory = self.mount("memory");
        let root = memory.parent().expect("a v1 mount below a directory");
        for (name, mount) in &self.hierarchies {
            if name != V2 {
                assert_eq!(
                    mount,
                    &root.join(name),
                    "v1 hierarchies are expected side by side"
                );
            }
        }
        root.to_path_buf()
    }

    /// Create a child cgroup (relative to the parent) in every hierarchy; returns its path
    /// relative to the hierarchy roots.
    pub fn child(&mut self, name: &str) -> PathBuf {
        let relative = self.parent.join(name);
        self.make(&relative).unwrap();
        relative
    }

    /// Create `relative` in every hierarchy, noting each directory for removal.
    fn make(&mut self, relative: &Path) -> Result<(), String> {
        for (_, mount) in self.hierarchies.clone() {
            let dir = mount.join(relative);
            std::fs::create_dir(&dir)
                .map_err(|e| format!("cannot create a test cgroup {}: {e}", dir.display()))?;
            self.created.push(dir);
        }
        Ok(())
    }

    pub fn dir(&self, hierarchy: &str, relative: &Path) -> PathBuf {
        self.mount(hierarchy).join(relative)
    }

    /// A standalone dry-run agent's configuration whose workloads are this test's
    /// children: a hard `allocatableMemory.available` threshold of `threshold_bytes` on the
    /// parent (its `podsCgroup`), and the housekeeping timer at `housekeeping`.
    pub fn standalone_agent_config(
        &self,
        threshold_bytes: u64,
        housekeeping: Duration,
    ) -> nodekeeper::config::AgentConfig {
        use nodekeeper::config::{
            AgentConfig, GoDuration, Quantity, Threshold, ThresholdValue, WorkloadsConfig,
        };
        let mut config = AgentConfig {
            dry_run: true,
            housekeeping_interval: GoDuration::from(housekeeping),
            metrics_address: "127.0.0.1:0".to_string(),
            ..AgentConfig::default()
        };
        config.paths.cgroup_root = self.v1_root();
        config.paths.pods_cgroup = Some(self.parent.clone());
        let threshold = i64::try_from(threshold_bytes).expect("a threshold in i64");
        config.eviction.thresholds = vec![Threshold {
            signal: nodekeeper::signals::Signal::AllocatableMemoryAvailable,
            value: ThresholdValue::Quantity(Quantity::from_value(threshold)),
            grace_period: GoDuration::ZERO,
            min_reclaim: None,
        }];
        config.workloads = Some(WorkloadsConfig {
            parent_cgroup: self.parent.clone(),
            namespace: "bench".to_string(),
            pods: Vec::new(),
        });
        config
    }

    /// The kernel's OOM kills in this test's memory cgroups: the `oom_kill` count of the
    /// parent and of every cgroup below it, summed. On cgroup v1 a memory cgroup counts
    /// only the tasks killed in it, not those killed in its descendants, even when the
    /// limit they ran into is its own: a workload's OOM kill under a limited parent shows
    /// in the workload's `memory.oom_control` alone. A cgroup removed meanwhile (a test's
    /// churn) is passed over; the kills it counted are lost with it, so a test must count
    /// before it removes a cgroup that held tasks. A count that cannot be read is a panic,
    /// never a 0.
    pub fn oom_kills(&self) -> u64 {
        // A cgroup removed meanwhile reads as gone (ENOENT) or as its files' ENODEV.
        fn removed(error: &std::io::Error) -> bool {
            error.kind() == std::io::ErrorKind::NotFound
                || error.raw_os_error() == Some(libc::ENODEV)
        }
        /// The count of `dir` itself; `None` if it was removed meanwhile.
        fn own(dir: &Path) -> Option<u64> {
            let file = dir.join("memory.oom_control");
            let text = match std::fs::read_to_string(&file) {
                Ok(text) => text,
                Err(error) if removed(&error) => return None,
                Err(error) => panic!("{}: {error}", file.display()),
            };
            let count = text
                .lines()
                .find_map(|line| line.strip_prefix("oom_kill "))
                .and_then(|count| count.trim().parse::<u64>().ok());
            Some(count.unwrap_or_else(|| panic!("no oom_kill count in {}: {text}", file.display())))
        }
        fn under(dir: &Path) -> u64 {
            let entries = match std::fs::read_dir(dir) {
                Ok(entries) => entries,
                Err(error) if removed(&error) => return 0,
                Err(error) => panic!("{}: {error}", dir.display()),
            };
            let children: u64 = entries
                .filter_map(Result::ok)
                .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
                .map(|entry| under(&entry.path()))
                .sum();
            own(dir).unwrap_or(0) + children
        }
        let parent = self.dir("memory", &self.parent);
        assert!(
            own(&parent).is_some(),
            "no memory.oom_control in {}: not a cgroup v1 memory cgroup",
            parent.display()
        );
        under(&parent)
    }

    /// `workload` (its exit status: `None` while it runs) was killed by the agent, not by
    /// the kernel's OOM killer: both send SIGKILL, so no OOM kill may be counted anywhere
    /// under the test's parent ([`oom_kills`](Self::oom_kills)). `log` is the agent's, for
    /// the messages.
    pub fn assert_killed_by_the_agent(
        &self,
        workload: &str,
        status: Option<std::process::ExitStatus>,
        log: &str,
    ) {
        assert_eq!(
            self.oom_kills(),
            0,
            "the kernel OOM killer fired first:\n{log}"
        );
        let status = status.unwrap_or_else(|| panic!("{workload} still runs:\n{log}"));
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL),
            "{workload} ended with {status:?}, not SIGKILL:\n{log}"
        );
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
        let pid = self.spawn_held_allocator(relative, plan);
        self.release_allocator(pid);
        self.child_mut(pid)
    }

    /// Start an allocator child inside `relative` in every hierarchy, waiting until
    /// [`release_allocator`](Self::release_allocator) lets it allocate; returns its PID.
    pub fn spawn_held_allocator(&mut self, relative: &Path, plan: &AllocatorPlan) -> u32 {
        self.spawn_held_child(relative, ALLOCATOR_ENV, &plan.to_env())
    }

    /// Start an oscillator child inside `relative` in every hierarchy and let it go;
    /// returns its PID once it holds its base memory.
    pub fn spawn_oscillator(&mut self, relative: &Path, plan: &OscillatorPlan) -> u32 {
        let pid = self.spawn_held_child(relative, OSCILLATOR_ENV, &plan.to_env());
        self.release_allocator(pid);
        super::allocator::oscillator_ready(self.child_mut(pid));
        pid
    }

    /// Re-execute this binary as the child that `env` (set to `value`) selects, inside
    /// `relative`, waiting for its go byte.
    fn spawn_held_child(&mut self, relative: &Path, env: &str, value: &str) -> u32 {
        let child = Command::new(std::env::current_exe().unwrap())
            .args(&self.allocator_args)
            .env(env, value)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        self.adopt(relative, child)
    }

    /// Let a held allocator start allocating.
    pub fn release_allocator(&mut self, pid: u32) {
        let stdin = self.child_mut(pid).stdin.as_mut().unwrap();
        stdin.write_all(b"g").unwrap();
    }

    /// Move a child this test started into `relative` in every hierarchy, and own it: it is
    /// killed by its PID at cleanup.
    fn adopt(&mut self, relative: &Path, child: Child) -> u32 {
        let pid = child.id();
        self.children.push(child);
        for (_, mount) in &self.hierarchies {
            std::fs::write(mount.join(relative).join("cgroup.procs"), pid.to_string()).unwrap();
        }
        pid
    }

    /// Start `sh -c script` inside `relative` in every hierarchy; returns its PID once the
    /// shell has exec'd the script's last command (so a `trap` in it is in force).
    pub fn spawn_shell(&mut self, relative: &Path, script: &str, execs: &str) -> u32 {
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let pid = self.adopt(relative, child);
        let comm = format!("/proc/{pid}/comm");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&comm).unwrap_or_default().trim() != execs {
            assert!(
                std::time::Instant::now() < deadline,
                "pid {pid} never became {execs}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        pid
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
        for (name, mount) in &self.hierarchies {
            if name == "freezer" {
                for dir in &self.created {
                    if dir.starts_with(mount) {
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

/// Empty cgroups made and removed again as fast as the kernel allows, beside a test's
/// real workloads: an agent that lists them (or is told of them) finds some gone by the
/// time it reads their files, as it finds a workload that has just ended and been
/// cleaned up. Each directory is made in turn, then each removed in turn, over and over.
pub struct CgroupChurn {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<u64, String>>>,
    dirs: Vec<PathBuf>,
}

impl CgroupChurn {
    /// Churn `dirs` (absolute, in a test's own cgroups): several names under one parent
    /// overlap, so one is nearly always there to be listed; one cgroup in several
    /// hierarchies comes and goes in all of them, as a pod's does.
    pub fn start(dirs: Vec<PathBuf>) -> CgroupChurn {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (dirs, stop) = (dirs.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut made_and_removed = 0;
                while !stop.load(Ordering::Relaxed) {
                    for dir in &dirs {
                        std::fs::create_dir(dir)
                            .map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
                    }
                    for dir in &dirs {
                        std::fs::remove_dir(dir)
                            .map_err(|e| format!("cannot remove {}: {e}", dir.display()))?;
                        made_and_removed += 1;
                    }
                }
                Ok(made_and_removed)
            })
        };
        CgroupChurn {
            stop,
            thread: Some(thread),
            dirs,
        }
    }

    /// Whether the churn has stopped by itself: it failed (see [`CgroupChurn::stop`]).
    pub fn failed(&self) -> bool {
        self.thread
            .as_ref()
            .is_some_and(|thread| thread.is_finished())
    }

    /// Stops the churn; how many cgroup directories were made and removed.
    pub fn stop(&mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let made_and_removed = match self.thread.take().map(|thread| thread.join()) {
            Some(Ok(Ok(count))) => count,
            Some(Ok(Err(error))) => panic!("the cgroup churn failed: {error}"),
            Some(Err(_)) => panic!("the cgroup churn panicked"),
            None => 0,
        };
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
        made_and_removed
    }
}

impl Drop for CgroupChurn {
    fn drop(&mut self) {
        // Before the test's own cleanup, which removes the parent.
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
