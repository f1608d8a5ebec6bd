//! Agent footprint while idle: resident memory and CPU of a real `nodekeeper agent`
//! process at a 1 s housekeeping interval with 110 standalone workloads (the kubelet's
//! default maxPods) on a generated cgroup v2 tree. The baseline, measured in the same
//! run, is the same agent at the kubelet's 10 s interval.
//!
//! Run: cargo bench --bench agent_footprint   (NK_FOOTPRINT_SECONDS sets the window, default 30)

#[allow(dead_code)]
#[path = "../tests/support/process_usage.rs"]
mod process_usage;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use process_usage::{cpu_time, status_kib};

const PODS: usize = 110;

fn write(path: &Path, text: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, text).unwrap();
}

/// A cgroup v2 host with `PODS` workload cgroups under `kubepods.slice`, and a proc tree.
fn fake_host(root: &Path) {
    let cgroup = root.join("cgroup");
    write(
        &cgroup.join("cgroup.controllers"),
        "cpuset cpu io memory hugetlb pids rdma misc\n",
    );
    write(
        &cgroup.join("memory.stat"),
        "anon 1073741824\nfile 2147483648\ninactive_file 1073741824\nactive_file 1073741824\n",
    );
    let pods = cgroup.join("kubepods.slice");
    write(&pods.join("memory.current"), "4294967296\n");
    write(&pods.join("memory.max"), "max\n");
    write(
        &pods.join("memory.stat"),
        "anon 3221225472\nfile 1073741824\ninactive_file 536870912\n",
    );
    for i in 0..PODS {
        let pod = pods.join(format!("pod-{i:04}"));
        let usage = 8_388_608 * (1 + i as u64 % 64);
        write(&pod.join("memory.current"), &format!("{usage}\n"));
        write(&pod.join("memory.max"), "max\n");
        write(
            &pod.join("memory.stat"),
            &format!(
                "anon {}\nfile {}\ninactive_file {}\n",
                usage / 2,
                usage / 2,
                usage / 4
            ),
        );
        write(&pod.join("pids.current"), &format!("{}\n", 1 + i % 20));
        write(&pod.join("cgroup.procs"), "");
    }
    let proc_root = root.join("proc");
    write(
        &proc_root.join("meminfo"),
        "MemTotal:       32768000 kB\nMemFree:        16384000 kB\nMemAvailable:   24576000 kB\nInactive(file):  1048576 kB\n",
    );
    write(&proc_root.join("loadavg"), "0.10 0.20 0.30 2/812 4242\n");
    write(&proc_root.join("sys/kernel/pid_max"), "4194304\n");
    write(&proc_root.join("sys/kernel/threads-max"), "255000\n");
    for resource in ["memory", "cpu", "io"] {
        write(
            &proc_root.join(format!("pressure/{resource}")),
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        );
    }
}

fn config(root: &Path, interval: &str) -> PathBuf {
    let path = root.join(format!("agent-{interval}.yaml"));
    write(
        &path,
        &format!(
            "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\nhousekeepingInterval: {interval}\n\
             metricsAddress: 127.0.0.1:0\ndryRun: true\ncgroupRoot: {cg}\nprocRoot: {proc}\nnodefsPath: {root}\n\
             podsCgroup: kubepods.slice\nworkloads:\n  parentCgroup: kubepods.slice\n",
            cg = root.join("cgroup").display(),
            proc = root.join("proc").display(),
            root = root.display(),
        ),
    );
    path
}

struct Measurement {
    rss_mib: f64,
    peak_rss_mib: f64,
    cpu_percent_of_one_core: f64,
}

fn measure(config: &Path, window: Duration) -> Measurement {
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["agent", "--config"])
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    std::thread::sleep(Duration::from_secs(3));
    let (cpu_start, wall_start) = (cpu_time(pid).as_secs_f64(), Instant::now());
    std::thread::sleep(window);
    let cpu = cpu_time(pid).as_secs_f64() - cpu_start;
    let wall = wall_start.elapsed().as_secs_f64();
    let measurement = Measurement {
        rss_mib: status_kib(pid, "VmRSS:") as f64 / 1024.0,
        peak_rss_mib: status_kib(pid, "VmHWM:") as f64 / 1024.0,
        cpu_percent_of_one_core: 100.0 * cpu / wall,
    };
    let _ = child.kill();
    let _ = child.wait();
    measurement
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let window = Duration::from_secs(
        std::env::var("NK_FOOTPRINT_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(30),
    );
    let dir = tempfile::tempdir().unwrap();
    fake_host(dir.path());
    let fast = measure(&config(dir.path(), "1s"), window);
    let baseline = measure(&config(dir.path(), "10s"), window);
    println!(
        "agent footprint, {PODS} workloads, {}s window",
        window.as_secs()
    );
    println!("| interval | RSS (MiB) | peak RSS (MiB) | CPU (% of one core) |");
    println!("|---|---|---|---|");
    for (name, m) in [("1s", &fast), ("10s (baseline)", &baseline)] {
        println!(
            "| {name} | {:.1} | {:.1} | {:.3} |",
            m.rss_mib, m.peak_rss_mib, m.cpu_percent_of_one_core
        );
    }
    println!("ratio 1s/10s RSS: {:.2}x", fast.rss_mib / baseline.rss_mib);
    if baseline.cpu_percent_of_one_core > 0.0 {
        println!(
            "ratio 1s/10s CPU: {:.2}x",
            fast.cpu_percent_of_one_core / baseline.cpu_percent_of_one_core
        );
    } else {
        println!("ratio 1s/10s CPU: n/a (the 10 s agent used less than one clock tick)");
    }
}
