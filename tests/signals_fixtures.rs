//! The live collectors against fake cgroupfs/procfs trees in tests/fixtures.

mod support {
    #[allow(dead_code)]
    pub mod real;
}

use std::path::{Path, PathBuf};

use nodekeeper::config::HostPaths;
use nodekeeper::signals::{
    CgroupLayout, CgroupUsage, Collection, ErrorSubject, Observation, PressureKind,
    PressureResource, PressureScope, Signal, SignalCollector, probe,
};

const MEM_TOTAL: i64 = 16_384_000 * 1024;
const MEM_FREE: i64 = 8_000_000 * 1024;
const MEMINFO_INACTIVE_FILE: i64 = 2_000_000 * 1024;
const GIB: i64 = 1 << 30;
const MIB: i64 = 1 << 20;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn host(cgroup_root: &Path, proc_root: &Path, pods: Option<&str>) -> HostPaths {
    HostPaths {
        cgroup_root: cgroup_root.to_path_buf(),
        proc_root: proc_root.to_path_buf(),
        nodefs: fixtures(),
        imagefs: None,
        containerfs: None,
        pods_cgroup: pods.map(PathBuf::from),
    }
}

fn fixture_host(tree: &str, pods: &str) -> HostPaths {
    host(&fixtures().join(tree), &fixtures().join("proc"), Some(pods))
}

/// The signals collected from `copy` (of the fixtures), its cgroup tree `tree` with
/// `pods` as the pods cgroup.
fn collect_copy(copy: &tempfile::TempDir, tree: &str, pods: Option<&str>) -> Collection {
    SignalCollector::new(&host(
        &copy.path().join(tree),
        &copy.path().join("proc"),
        pods,
    ))
    .collect()
}

/// A writable copy of the fixtures, for tests that break files.
fn copy_of_fixtures() -> tempfile::TempDir {
    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy_dir(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), target).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixtures(), dir.path());
    dir
}

fn observed(collection: &Collection, signal: Signal) -> Observation {
    *collection
        .observations
        .get(&signal)
        .unwrap_or_else(|| panic!("{signal} missing; errors: {:?}", collection.errors))
}

fn memory(available: i64, capacity: i64) -> (i64, i64) {
    (available, capacity)
}

fn pair(observation: Observation) -> (i64, i64) {
    (observation.available, observation.capacity)
}

fn errored_signals(collection: &Collection) -> Vec<Signal> {
    collection
        .errors
        .iter()
        .filter_map(|e| e.signal())
        .collect()
}

#[test]
fn cgroup_v1_memory_and_pid_signals_are_exact() {
    let collector = SignalCollector::new(&fixture_host("cgroup-v1", "kubepods"));
    assert_eq!(collector.layout(), Some(CgroupLayout::Legacy));
    let collection = collector.collect();
    assert!(collection.errors.is_empty(), "{:?}", collection.errors);

    // Root working set: usage_in_bytes 6Gi − total_inactive_file 1Gi.
    assert_eq!(
        pair(observed(&collection, Signal::MemoryAvailable)),
        memory(MEM_TOTAL - 5 * GIB, MEM_TOTAL)
    );
    // kubepods: limit 14Gi, usage 4Gi − total_inactive_file 512Mi.
    assert_eq!(
        pair(observed(&collection, Signal::AllocatableMemoryAvailable)),
        memory(14 * GIB - (4 * GIB - 512 * MIB), 14 * GIB)
    );
    // min(pid_max 4194304, threads-max 127853) − 1234 from loadavg.
    assert_eq!(
        pair(observed(&collection, Signal::PidAvailable)),
        (127_853 - 1234, 127_853)
    );
}

#[test]
fn cgroup_hybrid_reads_memory_from_v1_and_pressure_from_unified() {
    let collector = SignalCollector::new(&fixture_host("cgroup-hybrid", "kubepods"));
    assert_eq!(collector.layout(), Some(CgroupLayout::Hybrid));
    let collection = collector.collect();
    assert!(collection.errors.is_empty(), "{:?}", collection.errors);
    assert_eq!(
        pair(observed(&collection, Signal::MemoryAvailable)),
        memory(MEM_TOTAL - 6 * GIB, MEM_TOTAL)
    );
    assert_eq!(
        pair(observed(&collection, Signal::AllocatableMemoryAvailable)),
        memory(12 * GIB - GIB, 12 * GIB)
    );
    let pods_pressure: Vec<_> = collection
        .pressure
        .iter()
        .filter(|r| r.scope == PressureScope::Cgroup(PathBuf::from("kubepods")))
        .collect();
    assert_eq!(pods_pressure.len(), 2);
    assert_eq!(pods_pressure[0].total_microseconds, 424_242);
    assert_eq!(pods_pressure[1].kind, PressureKind::Full);
}

/// The root memory.stat's `anon` and `file` (the fixture's figures).
const V2_ROOT_ANON_AND_FILE: i64 = 4_288_413_696 + 4 * GIB;

/// The real v2 root has no memory.current: the kubelet's cgroup library
/// (opencontainers/cgroups `rootStatsFromMeminfo`, runc 1.2 and later, runc#3933) takes
/// usage as `anon + file` from the root memory.stat, and cAdvisor subtracts its
/// `inactive_file` for the working set.
#[test]
fn cgroup_v2_root_without_memory_current_uses_anon_and_file_of_the_root_memory_stat() {
    let collector = SignalCollector::new(&fixture_host("cgroup-v2", "kubepods.slice"));
    assert_eq!(collector.layout(), Some(CgroupLayout::Unified));
    let collection = collector.collect();
    assert!(collection.errors.is_empty(), "{:?}", collection.errors);
    // usage = anon + file; inactive_file 2Gi from the root memory.stat.
    let working_set = V2_ROOT_ANON_AND_FILE - 2 * GIB;
    assert_eq!(
        pair(observed(&collection, Signal::MemoryAvailable)),
        memory(MEM_TOTAL - working_set, MEM_TOTAL)
    );
    // kubepods.slice has memory.max "max": capacity is MemTotal.
    assert_eq!(
        pair(observed(&collection, Signal::AllocatableMemoryAvailable)),
        memory(MEM_TOTAL - (4 * GIB - GIB), MEM_TOTAL)
    );
}

/// A kernel without a root memory.stat: usage as runc took it before 1.2.
#[test]
fn cgroup_v2_root_without_memory_stat_takes_usage_and_inactive_file_from_meminfo() {
    let copy = copy_of_fixtures();
    std::fs::remove_file(copy.path().join("cgroup-v2/memory.stat")).unwrap();
    let collection = collect_copy(&copy, "cgroup-v2", None);
    let working_set = MEM_TOTAL - MEM_FREE - MEMINFO_INACTIVE_FILE;
    assert_eq!(
        pair(observed(&collection, Signal::MemoryAvailable)),
        memory(MEM_TOTAL - working_set, MEM_TOTAL)
    );
}

/// A root memory.stat cut short (twice, so the read again is cut too), emptied or
/// garbled while read is an error for memory.available alone, and never a switch to the
/// meminfo formula: that usage counts kernel memory as well (the fixture's meminfo makes
/// it 2 GiB larger), and would take gigabytes off available for a cycle. Cut before
/// `inactive_file` and after `anon` and `file`, in the middle of `anon`'s line, at a
/// line's end after `anon`, to nothing, or garbage without a key the kernel writes.
#[test]
fn cgroup_v2_root_memory_stat_cut_short_is_an_error_never_the_meminfo_formula() {
    let copy = copy_of_fixtures();
    let stat = copy.path().join("cgroup-v2/memory.stat");
    let whole = std::fs::read_to_string(&stat).unwrap();
    let before_inactive = whole.find("inactive_file").expect("the fixture has it") + 6;
    let in_anon = whole.find("anon ").expect("the fixture has it") + 7;
    // At a line's end too: `anon` and `file` whole, `inactive_file` cut off.
    let after_file = whole.find("\nfile ").expect("the fixture has it") + 1;
    let after_file = after_file + whole[after_file..].find('\n').expect("a whole line") + 1;
    // At the end of `anon`'s line: `file` and `inactive_file` cut off.
    let after_anon = in_anon + whole[in_anon..].find('\n').expect("a whole line") + 1;
    let cuts = [before_inactive, in_anon, after_file, after_anon, 0];
    let broken = cuts
        .iter()
        .map(|&end| whole[..end].to_string())
        .chain(["\u{0}\u{1}\u{7f}garbage\n\n".to_string()]);
    for text in broken {
        std::fs::write(&stat, &text).unwrap();
        let collection = collect_copy(&copy, "cgroup-v2", Some("kubepods.slice"));
        assert_eq!(
            errored_signals(&collection),
            vec![Signal::MemoryAvailable],
            "memory.stat of {text:?}"
        );
        let message = collection.errors[0].to_string();
        assert!(
            message.contains("memory.stat")
                && ["cut short", "`anon`", "`file`", "`inactive_file`"]
                    .iter()
                    .any(|problem| message.contains(problem)),
            "{message}"
        );
    }
}

#[test]
fn cgroup_v2_root_with_memory_current_uses_it() {
    // Inside a container the namespaced v2 root does have memory.current.
    let copy = copy_of_fixtures();
    std::fs::write(copy.path().join("cgroup-v2/memory.current"), "3221225472\n").unwrap();
    let collection = collect_copy(&copy, "cgroup-v2", None);
    assert_eq!(
        pair(observed(&collection, Signal::MemoryAvailable)),
        memory(MEM_TOTAL - GIB, MEM_TOTAL)
    );
}

#[test]
fn filesystem_signals_follow_nodefs_without_dedicated_imagefs() {
    let collection = SignalCollector::new(&fixture_host("cgroup-v1", "kubepods")).collect();
    let nodefs = observed(&collection, Signal::NodeFsAvailable);
    assert!(nodefs.capacity > 0 && nodefs.available <= nodefs.capacity);
    for (signal, same_as) in [
        (Signal::ImageFsAvailable, Signal::NodeFsAvailable),
        (Signal::ContainerFsAvailable, Signal::NodeFsAvailable),
        (Signal::ImageFsInodesFree, Signal::NodeFsInodesFree),
        (Signal::ContainerFsInodesFree, Signal::NodeFsInodesFree),
    ] {
        let a = observed(&collection, signal);
        let b = observed(&collection, same_as);
        // Both come from one statvfs, so they are identical.
        assert_eq!(a, b, "{signal} differs from {same_as}");
    }
}

#[test]
fn containerfs_follows_a_dedicated_imagefs() {
    let shm = require!(
        "a separate filesystem (tmpfs) at /dev/shm",
        support::real::tmpfs_dir_apart_from(&fixtures())
    );
    let mut paths = fixture_host("cgroup-v1", "kubepods");
    paths.imagefs = Some(shm.path().to_path_buf());
    let collection = SignalCollector::new(&paths).collect();
    let stat = nix::sys::statvfs::statvfs(shm.path()).unwrap();
    let imagefs = observed(&collection, Signal::ImageFsAvailable);
    assert_eq!(
        imagefs.capacity,
        (stat.fragment_size() * stat.blocks()) as i64
    );
    assert_eq!(observed(&collection, Signal::ContainerFsAvailable), imagefs);
    assert_eq!(
        observed(&collection, Signal::ContainerFsInodesFree),
        observed(&collection, Signal::ImageFsInodesFree)
    );
}

#[test]
fn missing_nodefs_path_is_measured_at_its_nearest_ancestor_and_noted_once() {
    let mut paths = fixture_host("cgroup-v1", "kubepods");
    paths.nodefs = fixtures().join("var/lib/kubelet");
    let collector = SignalCollector::new(&paths);
    assert_eq!(collector.notes().len(), 1);
    assert!(collector.notes()[0].contains("var/lib/kubelet"));
    let fallback = collector.collect();
    paths.nodefs = fixtures();
    let direct = SignalCollector::new(&paths).collect();
    assert_eq!(
        observed(&fallback, Signal::NodeFsInodesFree).capacity,
        observed(&direct, Signal::NodeFsInodesFree).capacity
    );
}

#[test]
fn node_pressure_files_are_parsed() {
    let collection = SignalCollector::new(&fixture_host("cgroup-v1", "kubepods")).collect();
    let node: Vec<_> = collection
        .pressure
        .iter()
        .filter(|r| r.scope == PressureScope::Node)
        .collect();
    assert_eq!(node.len(), 6);
    let memory_some = node
        .iter()
        .find(|r| r.resource == PressureResource::Memory && r.kind == PressureKind::Some)
        .unwrap();
    assert_eq!(
        (memory_some.avg10, memory_some.avg60, memory_some.avg300),
        (1.25, 0.80, 0.25)
    );
    assert_eq!(memory_some.total_microseconds, 12_345_678);
    let cpu_some = node
        .iter()
        .find(|r| r.resource == PressureResource::Cpu && r.kind == PressureKind::Some)
        .unwrap();
    assert_eq!(cpu_some.total_microseconds, 98_765_432);
}

#[test]
fn v1_pod_usage_reads_pids_controller_or_counts_procs_recursively() {
    let collector = SignalCollector::new(&fixture_host("cgroup-v1", "kubepods"));
    let cgroups = collector.cgroups().unwrap();
    let pods = cgroups.list_child_cgroups(Path::new("kubepods")).unwrap();
    assert_eq!(
        pods,
        vec![
            PathBuf::from("kubepods/pod0f6a4b2c-1111-4c3e-9d2a-aaaaaaaaaaaa"),
            PathBuf::from("kubepods/podb7e1d9f0-2222-4a5b-8c7d-bbbbbbbbbbbb"),
        ]
    );
    assert_eq!(
        cgroups.read_cgroup_usage(&pods[0]).unwrap(),
        CgroupUsage {
            working_set_bytes: (GIB - 256 * MIB) as u64,
            usage_bytes: GIB as u64,
            limit_bytes: Some(2 * GIB as u64),
            process_count: 7,
        }
    );
    // No pids controller for pod B: 1 process in the pod cgroup + 2 in its container.
    // inactive_file above usage floors the working set at zero.
    assert_eq!(
        cgroups.read_cgroup_usage(&pods[1]).unwrap(),
        CgroupUsage {
            working_set_bytes: 0,
            usage_bytes: 512 * MIB as u64,
            limit_bytes: None,
            process_count: 3,
        }
    );
}

#[test]
fn v2_pod_usage_reads_pids_current_or_counts_procs_recursively() {
    let collector = SignalCollector::new(&fixture_host("cgroup-v2", "kubepods.slice"));
    let cgroups = collector.cgroups().unwrap();
    let pods = cgroups
        .list_child_cgroups(Path::new("/kubepods.slice"))
        .unwrap();
    assert_eq!(pods.len(), 2);
    assert_eq!(
        cgroups.read_cgroup_usage(&pods[0]).unwrap(),
        CgroupUsage {
            working_set_bytes: (640 * MIB) as u64,
            usage_bytes: (768 * MIB) as u64,
            limit_bytes: Some(GIB as u64),
            process_count: 12,
        }
    );
    let second = cgroups.read_cgroup_usage(&pods[1]).unwrap();
    assert_eq!((second.working_set_bytes, second.process_count), (0, 4));
}

#[test]
fn corrupt_root_memory_stat_fails_only_memory_available() {
    let copy = copy_of_fixtures();
    let stat = copy.path().join("cgroup-v1/memory/memory.stat");
    std::fs::write(&stat, "cache 1\ntotal_cache 2\n").unwrap();
    let collection = collect_copy(&copy, "cgroup-v1", Some("kubepods"));
    assert_eq!(errored_signals(&collection), vec![Signal::MemoryAvailable]);
    let error = &collection.errors[0];
    assert_eq!(error.path, stat);
    let message = error.to_string();
    assert!(message.starts_with("memory.available: "), "{message}");
    assert!(message.contains("memory.stat"), "{message}");
    assert!(message.contains("total_inactive_file"), "{message}");
    assert_eq!(collection.observations.len(), Signal::ALL.len() - 1);
}

#[test]
fn missing_meminfo_fails_memory_available_but_not_a_limited_pods_cgroup() {
    let copy = copy_of_fixtures();
    let meminfo = copy.path().join("proc/meminfo");
    std::fs::remove_file(&meminfo).unwrap();
    let collection = collect_copy(&copy, "cgroup-v1", Some("kubepods"));
    assert_eq!(errored_signals(&collection), vec![Signal::MemoryAvailable]);
    assert_eq!(collection.errors[0].path, meminfo);
    assert!(collection.errors[0].to_string().contains("cannot read"));
    observed(&collection, Signal::AllocatableMemoryAvailable);
    observed(&collection, Signal::PidAvailable);
}

#[test]
fn corrupt_loadavg_or_missing_pid_max_fails_only_pid_available() {
    for (file, content) in [
        ("proc/loadavg", Some("0.42 0.37 0.31 3-1234 98765\n")),
        ("proc/sys/kernel/pid_max", None),
        ("proc/sys/kernel/threads-max", Some("lots\n")),
    ] {
        let copy = copy_of_fixtures();
        let path = copy.path().join(file);
        match content {
            Some(text) => std::fs::write(&path, text).unwrap(),
            None => std::fs::remove_file(&path).unwrap(),
        }
        let collection = collect_copy(&copy, "cgroup-v2", Some("kubepods.slice"));
        assert_eq!(
            errored_signals(&collection),
            vec![Signal::PidAvailable],
            "{file}"
        );
        assert_eq!(collection.errors[0].path, path);
        assert!(
            collection.errors[0]
                .to_string()
                .starts_with("pid.available: ")
        );
        assert_eq!(collection.observations.len(), Signal::ALL.len() - 1);
    }
}

#[test]
fn corrupt_pods_memory_max_fails_only_allocatable() {
    let copy = copy_of_fixtures();
    let max = copy.path().join("cgroup-v2/kubepods.slice/memory.max");
    std::fs::write(&max, "unlimited\n").unwrap();
    let collection = collect_copy(&copy, "cgroup-v2", Some("kubepods.slice"));
    assert_eq!(
        errored_signals(&collection),
        vec![Signal::AllocatableMemoryAvailable]
    );
    assert_eq!(collection.errors[0].path, max);
    observed(&collection, Signal::MemoryAvailable);
}

#[test]
fn missing_cgroup_hierarchy_fails_memory_signals_only() {
    let empty = tempfile::tempdir().unwrap();
    let collection = SignalCollector::new(&host(
        empty.path(),
        &fixtures().join("proc"),
        Some("kubepods"),
    ))
    .collect();
    assert_eq!(
        errored_signals(&collection),
        vec![Signal::MemoryAvailable, Signal::AllocatableMemoryAvailable]
    );
    assert!(
        collection.errors[0]
            .to_string()
            .contains("no cgroup hierarchy")
    );
    observed(&collection, Signal::PidAvailable);
    observed(&collection, Signal::NodeFsAvailable);
}

#[test]
fn corrupt_pressure_file_is_reported_and_other_readings_kept() {
    let copy = copy_of_fixtures();
    let io = copy.path().join("proc/pressure/io");
    std::fs::write(&io, "some avg10=0.00 avg60=0.00\n").unwrap();
    let collection = collect_copy(&copy, "cgroup-v1", None);
    assert_eq!(collection.errors.len(), 1);
    assert_eq!(
        collection.errors[0].subject,
        ErrorSubject::Pressure(PressureResource::Io)
    );
    assert_eq!(collection.errors[0].path, io);
    assert_eq!(collection.pressure.len(), 4);
    assert!(
        collection
            .pressure
            .iter()
            .all(|r| r.resource != PressureResource::Io)
    );
}

#[test]
fn kernel_without_psi_gives_no_readings_and_no_errors() {
    let copy = copy_of_fixtures();
    std::fs::remove_dir_all(copy.path().join("proc/pressure")).unwrap();
    let collection = collect_copy(&copy, "cgroup-v1", None);
    assert!(collection.errors.is_empty(), "{:?}", collection.errors);
    assert!(collection.pressure.is_empty());
}

#[test]
fn probe_reports_mechanisms_per_layout() {
    let v1 = probe(&fixture_host("cgroup-v1", "kubepods"));
    assert!(v1.memcg_eventfd_v1 && !v1.memory_events_v2);
    assert!(v1.psi, "{}", v1.psi_detail);
    assert!(v1.psi_detail.contains("psi=1"), "{}", v1.psi_detail);

    let v2 = probe(&fixture_host("cgroup-v2", "kubepods.slice"));
    assert!(!v2.memcg_eventfd_v1 && v2.memory_events_v2);
    assert!(
        v2.memory_events_v2_detail
            .contains("kubepods.slice/memory.events")
    );

    let hybrid = probe(&fixture_host("cgroup-hybrid", "kubepods"));
    assert!(hybrid.memcg_eventfd_v1 && !hybrid.memory_events_v2);

    let text = v2.to_string();
    assert!(text.contains("PSI triggers:"), "{text}");
    assert!(text.contains("memory.events (v2):      yes"), "{text}");
}

#[test]
fn probe_without_pressure_files_says_psi_is_unavailable() {
    let copy = copy_of_fixtures();
    std::fs::remove_dir_all(copy.path().join("proc/pressure")).unwrap();
    let support = probe(&host(
        &copy.path().join("cgroup-v2"),
        &copy.path().join("proc"),
        None,
    ));
    assert!(!support.psi);
    assert!(
        support.psi_detail.contains("CONFIG_PSI"),
        "{}",
        support.psi_detail
    );
    // The v2 root cgroup has no memory.events of its own.
    assert!(!support.memory_events_v2);
}

/// Writes the fixture meminfo with a huge page pool: `pages` of 2 MiB in the default
/// size, `gib_pages` of 1 GiB beside them (seen only in `Hugetlb`), `surplus` of the
/// 2 MiB ones overcommitted.
fn with_hugepages(proc_root: &Path, pages: u64, gib_pages: u64, surplus: u64) {
    let meminfo = proc_root.join("meminfo");
    let text = std::fs::read_to_string(&meminfo).unwrap();
    let hugetlb_kib = (pages * 2048) + (gib_pages << 20);
    let text = text
        .replace(
            "HugePages_Total:       0",
            &format!("HugePages_Total:       {pages}\nHugePages_Surp:        {surplus}"),
        )
        .replace(
            "Hugepagesize:       2048 kB",
            &format!("Hugepagesize:       2048 kB\nHugetlb:        {hugetlb_kib} kB"),
        );
    std::fs::write(meminfo, text).unwrap();
}

/// `HugepageAwareEviction` (kubelet PR #138127, on by default from 1.37): the summary
/// provider's `adjustForHugePages` takes the node's `hugepages-*` capacity, every size,
/// out of the node's `AvailableBytes`, floored at zero; the eviction helpers then make
/// capacity `AvailableBytes + WorkingSetBytes`. The pods container's figure is left
/// alone. The kubelet's e2e test checks `available + workingSet + hugepages ≈ capacity`.
#[test]
fn the_huge_page_pool_is_left_out_of_memory_available_on_v1_and_v2() {
    let copy = copy_of_fixtures();
    let proc_root = copy.path().join("proc");
    // 32 × 2 MiB (the kubelet e2e test's reservation) and 2 × 1 GiB.
    with_hugepages(&proc_root, 32, 2, 0);
    let pool = 64 * MIB + 2 * GIB;
    for (tree, pods, working_set, allocatable) in [
        // v1: root usage 6Gi − total_inactive_file 1Gi; kubepods limit 14Gi.
        (
            "cgroup-v1",
            "kubepods",
            5 * GIB,
            memory(14 * GIB - (4 * GIB - 512 * MIB), 14 * GIB),
        ),
        // v2 root: anon + file − inactive_file 2Gi; kubepods.slice unlimited.
        (
            "cgroup-v2",
            "kubepods.slice",
            V2_ROOT_ANON_AND_FILE - 2 * GIB,
            memory(MEM_TOTAL - (4 * GIB - GIB), MEM_TOTAL),
        ),
    ] {
        let paths = host(&copy.path().join(tree), &proc_root, Some(pods));
        let collection = SignalCollector::new(&paths).collect();
        assert!(
            collection.errors.is_empty(),
            "{tree}: {:?}",
            collection.errors
        );
        let available = MEM_TOTAL - working_set - pool;
        assert_eq!(
            pair(observed(&collection, Signal::MemoryAvailable)),
            memory(available, available + working_set),
            "{tree}"
        );
        assert_eq!(collection.hugepages_subtracted, pool as u64, "{tree}");
        assert_eq!(
            pair(observed(&collection, Signal::AllocatableMemoryAvailable)),
            allocatable,
            "{tree}: the pods cgroup is not adjusted"
        );

        // With the gate off, the figure is the one kubelets before 1.37 report.
        let collection = SignalCollector::new(&paths).hugepage_aware(false).collect();
        assert_eq!(
            pair(observed(&collection, Signal::MemoryAvailable)),
            memory(MEM_TOTAL - working_set, MEM_TOTAL),
            "{tree}"
        );
        assert_eq!(collection.hugepages_subtracted, 0);
    }

    // A v2 root whose usage comes from meminfo (no root memory.stat) already counts the
    // pool as used (it is not in MemFree), so it is not taken out a second time.
    std::fs::remove_file(copy.path().join("cgroup-v2/memory.stat")).unwrap();
    let paths = host(&copy.path().join("cgroup-v2"), &proc_root, None);
    let collection = SignalCollector::new(&paths).collect();
    let working_set = MEM_TOTAL - MEM_FREE - MEMINFO_INACTIVE_FILE;
    assert_eq!(
        pair(observed(&collection, Signal::MemoryAvailable)),
        memory(MEM_TOTAL - working_set, MEM_TOTAL)
    );
    assert_eq!(collection.hugepages_subtracted, 0);
}

#[test]
fn a_huge_page_pool_larger_than_what_is_left_floors_memory_available_at_zero() {
    let copy = copy_of_fixtures();
    let proc_root = copy.path().join("proc");
    // v1 root: 16,384,000 KiB less a 5 GiB working set leaves about 10.6 GiB; a pool
    // of 12 × 1 GiB and 8 × 2 MiB (surplus ones, which count) is more than that.
    with_hugepages(&proc_root, 8, 12, 8);
    let collection =
        SignalCollector::new(&host(&copy.path().join("cgroup-v1"), &proc_root, None)).collect();
    assert_eq!(
        pair(observed(&collection, Signal::MemoryAvailable)),
        memory(0, 5 * GIB),
        "available 0, capacity the working set alone"
    );
    assert_eq!(
        collection.hugepages_subtracted,
        (12 * GIB + 16 * MIB) as u64
    );
}
