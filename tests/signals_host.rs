//! The live collectors against this real host, cross-checked with independent sources
//! (/proc/meminfo's MemAvailable, `df`, /proc/self/mounts) and a real test cgroup.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use nodekeeper::config::HostPaths;
use nodekeeper::signals::{CgroupLayout, CgroupReader, Signal, SignalCollector, probe};

fn this_host() -> HostPaths {
    HostPaths {
        cgroup_root: PathBuf::from("/sys/fs/cgroup"),
        proc_root: PathBuf::from("/proc"),
        nodefs: PathBuf::from("/"),
        imagefs: None,
        containerfs: None,
        pods_cgroup: None,
    }
}

fn meminfo_kib(key: &str) -> i64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let line = text
        .lines()
        .find(|line| line.starts_with(&format!("{key}:")))
        .unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The kubelet's working set counts active page cache as used (kubernetes#43916), while
/// MemAvailable counts most page cache as free. So the comparison with MemAvailable allows
/// 5% of capacity plus Active(file); the meminfo form of the kubelet's own definition,
/// MemFree + Inactive(file), must agree within 5% with no extra allowance.
#[test]
fn memory_available_agrees_with_meminfo_within_5_percent_of_capacity() {
    let collection = SignalCollector::new(&this_host()).collect();
    let memory = collection
        .observations
        .get(&Signal::MemoryAvailable)
        .unwrap_or_else(|| panic!("no memory.available: {:?}", collection.errors));
    let mem_total = meminfo_kib("MemTotal") * 1024;
    assert_eq!(memory.capacity, mem_total);

    let free_plus_inactive = (meminfo_kib("MemFree") + meminfo_kib("Inactive(file)")) * 1024;
    let difference = (memory.available - free_plus_inactive).abs();
    assert!(
        difference * 20 <= mem_total,
        "memory.available {} vs MemFree+Inactive(file) {} differ by {difference} of {mem_total}",
        memory.available,
        free_plus_inactive,
    );

    let mem_available = meminfo_kib("MemAvailable") * 1024;
    let active_file = meminfo_kib("Active(file)") * 1024;
    let difference = (memory.available - mem_available).abs();
    assert!(
        difference <= mem_total / 20 + active_file,
        "memory.available {} vs MemAvailable {} differ by {difference} (Active(file) {active_file}) of {mem_total}",
        memory.available,
        mem_available,
    );
}

#[test]
fn nodefs_available_agrees_with_df_within_1_percent() {
    let collection = SignalCollector::new(&this_host()).collect();
    let nodefs = collection.observations[&Signal::NodeFsAvailable];
    let output = Command::new("df")
        .args(["-B1", "--output=avail", "/"])
        .output()
        .unwrap();
    let df_available: i64 = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .nth(1)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let difference = (nodefs.available - df_available).abs();
    assert!(
        difference * 100 <= nodefs.available.max(df_available),
        "nodefs.available {} vs df {}",
        nodefs.available,
        df_available
    );
}

#[test]
fn pid_available_uses_the_smaller_kernel_limit() {
    let collection = SignalCollector::new(&this_host()).collect();
    let pids = collection.observations[&Signal::PidAvailable];
    let read = |file: &str| -> i64 {
        std::fs::read_to_string(file)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let max_pid = read("/proc/sys/kernel/pid_max").min(read("/proc/sys/kernel/threads-max"));
    assert_eq!(pids.capacity, max_pid);
    assert!(pids.available > 0 && pids.available < max_pid);
}

#[test]
fn detected_layout_matches_the_mount_table() {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let mount_of = |fstype: &str, point: &str| {
        mounts.lines().any(|line| {
            let fields: Vec<_> = line.split_whitespace().collect();
            fields.get(1) == Some(&point) && fields.get(2) == Some(&fstype)
        })
    };
    let expected = if mount_of("cgroup2", "/sys/fs/cgroup") {
        CgroupLayout::Unified
    } else if mount_of("cgroup2", "/sys/fs/cgroup/unified") {
        CgroupLayout::Hybrid
    } else {
        CgroupLayout::Legacy
    };
    let collector = SignalCollector::new(&this_host());
    assert_eq!(collector.layout(), Some(expected));
    let support = probe(&this_host());
    assert_eq!(support.memcg_eventfd_v1, expected.memory_is_v1());
}

/// A v1 memory cgroup this test owns, removed on drop with any child it started.
struct TestCgroup {
    dir: PathBuf,
    child: Option<Child>,
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn real_v1_cgroup_usage_reports_limit_and_processes() {
    let memory_root = Path::new("/sys/fs/cgroup/memory");
    let name = format!("nodekeeper-test-{}-1", std::process::id());
    let dir = memory_root.join(&name);
    if !memory_root.join("cgroup.procs").exists() || std::fs::create_dir(&dir).is_err() {
        eprintln!("skipping: cannot create a v1 memory cgroup here");
        return;
    }
    let mut cgroup = TestCgroup { dir, child: None };
    std::fs::write(cgroup.dir.join("memory.limit_in_bytes"), "67108864").unwrap();
    let child = Command::new("sleep").arg("30").spawn().unwrap();
    std::fs::write(cgroup.dir.join("cgroup.procs"), child.id().to_string()).unwrap();
    cgroup.child = Some(child);

    let reader = CgroupReader::detect(Path::new("/sys/fs/cgroup")).unwrap();
    let usage = reader.read_cgroup_usage(Path::new(&name)).unwrap();
    assert_eq!(usage.limit_bytes, Some(64 << 20));
    assert_eq!(usage.process_count, 1);
    assert!(usage.working_set_bytes <= usage.usage_bytes);
    assert!(
        reader
            .list_child_cgroups(Path::new("/"))
            .unwrap()
            .contains(&PathBuf::from("/").join(&name))
    );
}
