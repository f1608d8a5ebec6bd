//! Cost of one signal collection: node signals plus per-pod usage from a generated cgroup v2
//! tree with 110 pods (the kubelet's default maxPods) and with 1,000 pods, and node signals
//! from this real host. Ratios are against a bare read of /proc/meminfo measured in the same
//! run. Afterwards it measures CPU time per host collection with getrusage.
//!
//! Run: cargo bench --bench signal_collection

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::Criterion;
use nodekeeper::config::HostPaths;
use nodekeeper::signals::SignalCollector;

const PODS_PARENT: &str = "kubepods.slice";

fn write(path: &Path, text: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, text).unwrap();
}

fn memory_stat(usage: u64, inactive_file: u64) -> String {
    let file = inactive_file * 2;
    let anon = usage.saturating_sub(file);
    let mut text = format!(
        "anon {anon}\nfile {file}\nkernel 6553600\nkernel_stack 540672\npagetables 2375680\n\
         sec_pagetables 0\npercpu 1234560\nsock 0\nvmalloc 0\nshmem 1048576\nzswap 0\nzswapped 0\n\
         file_mapped 1048576\nfile_dirty 135168\nfile_writeback 0\nswapcached 0\nanon_thp 0\n\
         file_thp 0\nshmem_thp 0\ninactive_anon {}\nactive_anon {}\ninactive_file {inactive_file}\n\
         active_file {}\nunevictable 0\nslab_reclaimable 3145728\nslab_unreclaimable 2097152\n\
         slab 5242880\n",
        anon / 4,
        anon - anon / 4,
        file - inactive_file
    );
    for key in [
        "workingset_refault_anon",
        "workingset_refault_file",
        "workingset_activate_anon",
        "workingset_activate_file",
        "workingset_restore_anon",
        "workingset_restore_file",
        "workingset_nodereclaim",
        "pgscan",
        "pgsteal",
        "pgscan_kswapd",
        "pgscan_direct",
        "pgsteal_kswapd",
        "pgsteal_direct",
        "pgfault",
        "pgmajfault",
        "pgrefill",
        "pgactivate",
        "pgdeactivate",
        "pglazyfree",
        "pglazyfreed",
        "thp_fault_alloc",
        "thp_collapse_alloc",
    ] {
        text.push_str(&format!("{key} 12345\n"));
    }
    text
}

/// A cgroup v2 tree with `pods` pod cgroups, plus a proc tree, in a temporary directory.
fn fake_host(pods: usize) -> (tempfile::TempDir, HostPaths) {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = dir.path().join("cgroup");
    let proc_root = dir.path().join("proc");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/proc");
    for file in [
        "meminfo",
        "loadavg",
        "sys/kernel/pid_max",
        "sys/kernel/threads-max",
        "pressure/memory",
        "pressure/cpu",
        "pressure/io",
    ] {
        write(
            &proc_root.join(file),
            &std::fs::read_to_string(fixtures.join(file)).unwrap(),
        );
    }
    write(&cgroup.join("cgroup.controllers"), "cpu io memory pids\n");
    write(&cgroup.join("memory.stat"), &memory_stat(8 << 30, 2 << 30));
    let parent = cgroup.join(PODS_PARENT);
    write(&parent.join("memory.current"), "4294967296\n");
    write(&parent.join("memory.stat"), &memory_stat(4 << 30, 1 << 30));
    write(&parent.join("memory.max"), "max\n");
    write(
        &parent.join("memory.pressure"),
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
    );
    for pod in 0..pods {
        let pod_dir = parent.join(format!(
            "kubepods-burstable-pod{pod:08x}_1111_4c3e_9d2a_{pod:012x}.slice"
        ));
        let usage = (64 + pod as u64 % 512) << 20;
        write(&pod_dir.join("memory.current"), &format!("{usage}\n"));
        write(&pod_dir.join("memory.stat"), &memory_stat(usage, usage / 8));
        write(&pod_dir.join("memory.max"), "1073741824\n");
        write(&pod_dir.join("pids.current"), "12\n");
        write(&pod_dir.join("cgroup.procs"), "");
    }
    let paths = HostPaths {
        cgroup_root: cgroup,
        proc_root,
        nodefs: dir.path().to_path_buf(),
        imagefs: None,
        containerfs: None,
        pods_cgroup: Some(PathBuf::from(PODS_PARENT)),
    };
    (dir, paths)
}

/// Node signals plus the usage of every pod: one agent housekeeping pass.
fn collect_with_pods(collector: &SignalCollector) -> usize {
    let collection = collector.collect();
    let cgroups = collector.cgroups().expect("fake tree has a cgroup layout");
    let pods = cgroups
        .list_child_cgroups(Path::new(PODS_PARENT))
        .expect("pods parent is listable");
    let read = pods
        .iter()
        .filter(|pod| cgroups.read_cgroup_usage(pod).is_ok())
        .count();
    black_box(collection);
    read
}

fn host_paths() -> HostPaths {
    HostPaths {
        cgroup_root: PathBuf::from("/sys/fs/cgroup"),
        proc_root: PathBuf::from("/proc"),
        nodefs: PathBuf::from("/"),
        imagefs: None,
        containerfs: None,
        pods_cgroup: None,
    }
}

const BASELINE: &str = "baseline/read_proc_meminfo";
const CASES: [&str; 3] = [
    "collection/fake_110_pods",
    "collection/fake_1000_pods",
    "collection/host_node_signals",
];

fn benches(c: &mut Criterion) {
    c.bench_function(BASELINE, |b| {
        b.iter(|| black_box(std::fs::read("/proc/meminfo").unwrap()))
    });
    for (name, pods) in [(CASES[0], 110), (CASES[1], 1000)] {
        let (_dir, paths) = fake_host(pods);
        let collector = SignalCollector::new(&paths);
        assert_eq!(collect_with_pods(&collector), pods);
        c.bench_function(name, |b| b.iter(|| collect_with_pods(&collector)));
    }
    let host = SignalCollector::new(&host_paths());
    c.bench_function(CASES[2], |b| b.iter(|| black_box(host.collect())));
}

fn mean_ns(output: &Path, id: &str) -> Option<f64> {
    // Criterion stores `group/name` under `group_name`.
    let dir = output.join(id.replace('/', "_"));
    let text = std::fs::read_to_string(dir.join("new/estimates.json")).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["mean"]["point_estimate"].as_f64()
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes into the struct we pass; all-zero is a valid rusage.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    assert_eq!(rc, 0, "getrusage failed");
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// CPU time (user + system) per call, over enough calls that rusage's granularity is noise.
fn cpu_per_call(iterations: u32, mut call: impl FnMut()) -> f64 {
    let before = cpu_seconds();
    for _ in 0..iterations {
        call();
    }
    (cpu_seconds() - before) / f64::from(iterations)
}

fn main() {
    let output = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/criterion");
    let mut criterion = Criterion::default()
        .output_directory(&output)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
        .configure_from_args();
    benches(&mut criterion);
    criterion.final_summary();

    if let Some(baseline) = mean_ns(&output, BASELINE) {
        println!(
            "\nmean time, ratio to {BASELINE} ({:.1} µs):",
            baseline / 1e3
        );
        for case in CASES {
            if let Some(mean) = mean_ns(&output, case) {
                println!(
                    "  {case:<32} {:>10.1} µs  {:>8.1}x",
                    mean / 1e3,
                    mean / baseline
                );
            }
        }
        if let (Some(small), Some(large)) = (mean_ns(&output, CASES[0]), mean_ns(&output, CASES[1]))
        {
            println!("  1000 pods / 110 pods: {:.2}x", large / small);
        }
    }

    let iterations = 2000;
    let baseline_cpu = cpu_per_call(iterations, || {
        black_box(std::fs::read("/proc/meminfo").unwrap());
    });
    let host = SignalCollector::new(&host_paths());
    let host_cpu = cpu_per_call(iterations, || {
        black_box(host.collect());
    });
    let (_dir, paths) = fake_host(110);
    let fake = SignalCollector::new(&paths);
    let fake_cpu = cpu_per_call(iterations / 10, || {
        black_box(collect_with_pods(&fake));
    });
    println!(
        "\nCPU time per call (getrusage user+system):\n  \
         read /proc/meminfo               {:>8.1} µs\n  \
         host collection                  {:>8.1} µs  ({:.1}x)\n  \
         fake tree, 110 pods with usage   {:>8.1} µs  ({:.1}x)",
        baseline_cpu * 1e6,
        host_cpu * 1e6,
        host_cpu / baseline_cpu,
        fake_cpu * 1e6,
        fake_cpu / baseline_cpu
    );
}
