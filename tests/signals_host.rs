//! The live collectors against this real host, cross-checked with independent sources
//! (/proc/meminfo's MemAvailable, `df`, /proc/self/mounts) and a real test cgroup.

#[allow(dead_code)]
mod support {
    pub mod allocator;
    pub mod cgroups;
    pub mod real;
}

use std::path::{Path, PathBuf};
use std::process::Command;

use support::cgroups::TestCgroups;

use nodekeeper::config::HostPaths;
use nodekeeper::signals::{
    CgroupLayout, CgroupReader, MemoryController, Signal, SignalCollector, V1Memory,
    end_kernel_file_cycle, keep_kernel_files_open_on_this_thread, kernel_files_kept_open, probe,
};

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

/// How far `value` lies outside the range of `readings` (0 inside it).
fn outside(value: i64, readings: [i64; 2]) -> i64 {
    let (low, high) = (readings[0].min(readings[1]), readings[0].max(readings[1]));
    (low - value).max(value - high).max(0)
}

/// The kubelet's working set counts active page cache as used (kubernetes#43916), while
/// MemAvailable counts most page cache as free. So the comparison with MemAvailable allows
/// 5% of capacity plus Active(file); the meminfo form of the kubelet's own definition,
/// MemFree + Inactive(file), must agree within 5% plus the slab no cgroup is charged for.
#[test]
fn memory_available_agrees_with_meminfo_within_5_percent_of_capacity() {
    // /proc/meminfo is read just before and just after the collection: other processes
    // (a build beside the tests) may allocate gigabytes in between, and the agent's figure
    // must then lie within 5% of the range the two readings span.
    let free_plus_inactive = || (meminfo_kib("MemFree") + meminfo_kib("Inactive(file)")) * 1024;
    let mem_available = || meminfo_kib("MemAvailable") * 1024;
    let before = (free_plus_inactive(), mem_available());
    let collection = SignalCollector::new(&this_host()).collect();
    let after = (free_plus_inactive(), mem_available());
    let memory = collection
        .observations
        .get(&Signal::MemoryAvailable)
        .unwrap_or_else(|| panic!("no memory.available: {:?}", collection.errors));
    let mem_total = meminfo_kib("MemTotal") * 1024;
    assert_eq!(memory.capacity, mem_total);

    // The kubelet takes the root cgroup's usage, which leaves out kernel memory no cgroup
    // is charged for (mostly slab: dentries and inodes, gigabytes on a machine that has
    // just walked many files); meminfo's MemFree counts it as used.
    let slab = meminfo_kib("Slab") * 1024;
    let difference = outside(memory.available, [before.0, after.0]);
    assert!(
        difference <= mem_total / 20 + slab,
        "memory.available {} vs MemFree+Inactive(file) {}..{} differ by {difference} (Slab {slab}) of {mem_total}",
        memory.available,
        before.0,
        after.0,
    );

    let active_file = meminfo_kib("Active(file)") * 1024;
    let difference = outside(memory.available, [before.1, after.1]);
    assert!(
        difference <= mem_total / 20 + active_file,
        "memory.available {} vs MemAvailable {}..{} differ by {difference} (Active(file) {active_file}) of {mem_total}",
        memory.available,
        before.1,
        after.1,
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
    // The tests' own cgroups find the v2 hierarchy where the mount table has it.
    let v2 = support::cgroups::mount_point(support::cgroups::V2);
    match expected {
        CgroupLayout::Unified => assert_eq!(v2, Ok(PathBuf::from("/sys/fs/cgroup"))),
        CgroupLayout::Hybrid => assert_eq!(v2, Ok(PathBuf::from("/sys/fs/cgroup/unified"))),
        CgroupLayout::Legacy => {}
    }
    let support = probe(&this_host());
    assert_eq!(support.memcg_eventfd_v1, expected.memory_is_v1());
}

#[test]
fn real_v1_cgroup_usage_reports_limit_and_processes() {
    let mut cgroups = require!(
        "the cgroup v1 memory hierarchy",
        TestCgroups::create(&["memory"])
    );
    let parent = cgroups.parent.clone();
    cgroups.set_memory_limit(&parent, 64 << 20);
    cgroups.spawn_shell(&parent, "exec sleep 30", "sleep");

    let reader = CgroupReader::detect(&cgroups.v1_root()).unwrap();
    let usage = reader.read_cgroup_usage(&parent).unwrap();
    assert_eq!(usage.limit_bytes, Some(64 << 20));
    assert_eq!(usage.process_count, 1);
    assert!(usage.working_set_bytes <= usage.usage_bytes);
    assert!(
        reader
            .list_child_cgroups(Path::new("/"))
            .unwrap()
            .contains(&PathBuf::from("/").join(&parent))
    );
}

/// The cycle thread keeps the kernel files it reads open between cycles. A pod cgroup
/// removed and made again under the same name must be read as the new cgroup, not
/// through the removed one's file, and a removed cgroup's file must not stay open.
#[test]
fn a_cgroup_made_again_under_its_name_is_read_afresh_by_a_thread_that_keeps_files_open() {
    let mut cgroups = require!(
        "the cgroup v1 memory hierarchy",
        TestCgroups::create(&["memory"])
    );
    let pod = cgroups.child("pod");
    cgroups.set_memory_limit(&pod, 64 << 20);
    let dir = cgroups.dir("memory", &pod);
    std::thread::spawn(move || {
        keep_kernel_files_open_on_this_thread();
        assert_eq!(V1Memory.limit(&dir).unwrap(), Some(64 << 20));
        assert_eq!(kernel_files_kept_open(), 1, "the limit file is kept open");
        end_kernel_file_cycle();

        // rmdir succeeds with the file open: the kernel drains it.
        std::fs::remove_dir(&dir).unwrap();
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(
            dir.join("memory.limit_in_bytes"),
            (128u64 << 20).to_string(),
        )
        .unwrap();
        assert_eq!(V1Memory.limit(&dir).unwrap(), Some(128 << 20));
        assert_eq!(kernel_files_kept_open(), 1, "the new cgroup's file is kept");

        std::fs::remove_dir(&dir).unwrap();
        let error = V1Memory.limit(&dir).unwrap_err();
        assert!(
            error.to_string().contains("memory.limit_in_bytes"),
            "{error}"
        );
        assert_eq!(
            kernel_files_kept_open(),
            0,
            "the removed cgroup's file is closed"
        );
    })
    .join()
    .unwrap();
}

/// Where no pids controller covers a cgroup, its processes are the entries of its
/// `cgroup.procs`, which the kernel hands out about a page (some 600 pids) per read: a
/// cgroup of a thousand processes must count a thousand, not one page's worth.
#[test]
fn a_cgroup_of_a_thousand_processes_is_counted_whole_without_the_pids_controller() {
    const SLEEPERS: usize = 1000;
    /// SIGKILLs every process of this test's cgroup when dropped, whatever happened.
    struct Sleepers(PathBuf);
    impl Drop for Sleepers {
        fn drop(&mut self) {
            let procs = std::fs::read_to_string(&self.0).unwrap_or_default();
            for pid in procs.lines().filter_map(|line| line.parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    let mut cgroups = require!(
        "the cgroup v1 memory hierarchy",
        TestCgroups::create(&["memory"])
    );
    let parent = cgroups.parent.clone();
    let _sleepers = Sleepers(cgroups.dir("memory", &parent).join("cgroup.procs"));
    // The shell forks only once it is in the test's cgroup, so every sleeper is in it.
    let script = format!(
        "until grep -q ':memory:/{}$' /proc/$$/cgroup; do :; done; \
         for i in $(seq {SLEEPERS}); do sleep 120 & done; exec sleep 120",
        parent.display()
    );
    cgroups.spawn_shell(&parent, &script, "sleep");
    let reader = CgroupReader::detect(&cgroups.v1_root()).unwrap();
    assert!(
        !cgroups.v1_root().join("pids").join(&parent).exists(),
        "the test's cgroup has no pids controller, so cgroup.procs is counted"
    );
    assert_eq!(
        cgroups.procs("memory", &parent).len(),
        SLEEPERS + 1,
        "every sleeper is in the cgroup"
    );
    assert_eq!(
        reader.process_count(&parent).expect("counted"),
        (SLEEPERS + 1) as u64
    );
}

/// The tests find cgroup hierarchies in the mount table, wherever a host mounts them.
#[test]
fn test_cgroups_find_each_hierarchy_in_mountinfo() {
    use support::cgroups::{CgroupMount, cgroup_mounts};
    let hybrid = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:14 - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
";
    let mounts = cgroup_mounts(hybrid);
    assert_eq!(
        mounts.iter().map(|m| m.point.clone()).collect::<Vec<_>>(),
        [
            "/sys/fs/cgroup/memory",
            "/sys/fs/cgroup/cpu,cpuacct",
            "/sys/fs/cgroup/unified"
        ]
        .map(PathBuf::from)
    );
    assert_eq!(mounts[1].super_options, ["rw", "cpu", "cpuacct"]);
    let unified = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n\
                   30 23 0:27 / /mnt/odd\\040place rw - cgroup2 none rw\n";
    assert_eq!(
        cgroup_mounts(unified),
        [
            CgroupMount {
                point: PathBuf::from("/sys/fs/cgroup"),
                fstype: "cgroup2".into(),
                super_options: vec!["rw".into(), "nsdelegate".into()],
            },
            CgroupMount {
                point: PathBuf::from("/mnt/odd place"),
                fstype: "cgroup2".into(),
                super_options: vec!["rw".into()],
            },
        ]
    );
}

/// The kubelet tells its filesystems apart by device, not by path: `HasDedicatedImageFs`
/// compares the image filesystem's device with the root filesystem's, and
/// `HasDedicatedContainerFs` the container filesystem's with the image filesystem's
/// (pkg/kubelet/stats/provider.go); `buildSignalToRankFunc` and
/// `UpdateContainerFsThresholds` test the dedicated image filesystem first. Each case
/// marked `paths differ` is one where the configured paths alone suggest another layout.
#[test]
fn the_filesystem_layout_is_decided_by_devices_not_by_paths() {
    use nodekeeper::config::FilesystemLayout::{ImageFs, SingleDisk, SplitImageFs};
    use nodekeeper::signals::Host;
    let disk = tempfile::tempdir().unwrap();
    let tmpfs = require!(
        "a separate filesystem (tmpfs) at /dev/shm",
        support::real::tmpfs_dir_apart_from(disk.path())
    );
    let (on_disk, on_tmpfs) = (disk.path(), tmpfs.path());
    for sub in ["kubelet", "containerd", "layers"] {
        std::fs::create_dir(on_disk.join(sub)).unwrap();
        std::fs::create_dir(on_tmpfs.join(sub)).unwrap();
    }
    let nodefs = on_disk.join("kubelet");
    let cases: [(Option<PathBuf>, Option<PathBuf>, _, bool); 7] = [
        (None, None, SingleDisk, false),
        // imagefsPath on the nodefs device: one filesystem (paths differ).
        (Some(on_disk.join("containerd")), None, SingleDisk, true),
        (Some(on_tmpfs.join("containerd")), None, ImageFs, false),
        // Not created yet: its nearest existing ancestor's device.
        (Some(on_tmpfs.join("not/yet")), None, ImageFs, false),
        (
            Some(on_tmpfs.join("containerd")),
            Some(on_disk.join("layers")),
            SplitImageFs,
            false,
        ),
        // Writable layers on the image filesystem's device (paths differ).
        (
            Some(on_tmpfs.join("containerd")),
            Some(on_tmpfs.join("layers")),
            ImageFs,
            true,
        ),
        // Images on nodefs, layers apart: not a dedicated image filesystem, so one
        // filesystem to the kubelet (paths differ).
        (
            Some(on_disk.join("containerd")),
            Some(on_tmpfs.join("layers")),
            SingleDisk,
            true,
        ),
    ];
    for (imagefs, containerfs, expected, paths_differ) in cases {
        let paths = HostPaths {
            nodefs: nodefs.clone(),
            imagefs: imagefs.clone(),
            containerfs: containerfs.clone(),
            ..this_host()
        };
        let host = Host::detect(&paths);
        let label = format!("imagefs {imagefs:?}, containerfs {containerfs:?}");
        assert_eq!(host.fs_layout(), expected, "{label}");
        assert_eq!(paths.fs_layout() != expected, paths_differ, "{label}");
        let found = host.filesystems().unwrap();
        let names: Vec<&str> = found.devices.iter().map(|(name, _, _)| *name).collect();
        let expected_names = std::iter::once("nodefs")
            .chain(imagefs.as_ref().map(|_| "imagefs"))
            .chain(containerfs.as_ref().map(|_| "containerfs"));
        assert!(
            names.iter().copied().eq(expected_names),
            "{label}: {names:?}"
        );
        assert!(found.describe().starts_with(expected.describe()), "{label}");
    }
}
