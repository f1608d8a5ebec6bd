//! What one decision cycle of the agent costs as the pods grow: the agent's own cycle
//! (node signals, the pod cgroups listed and read, the eviction core, the dry-run
//! eviction, the bookkeeping), over 10, 110 (the kubelet's default maxPods) and 250 real
//! pod cgroups, with a memory threshold met in every cycle so that every cycle ranks the
//! pods, as the cycle that decides after a crossing does.
//!
//! The cycles run back to back on one thread that keeps the kernel files open between
//! cycles, as the agent's cycle thread does. Each row reports, over its cycles, the time
//! from the cycle's start to its decision (what a crossing waits for once its cycle has
//! begun; benches/detection_latency.rs measures it from the crossing) and the thread's
//! CPU time per cycle.
//!
//! The baseline, measured in the same run: the same pod files read with nothing else, one
//! `pread` each on files held open (`memory.usage_in_bytes`, `memory.stat` and
//! `pids.current` of every pod, and no parsing). It is the kernel's part, which the agent
//! cannot go below by reading these files; the per-pod cost above it is the agent's.
//!
//! The pod cgroups are empty (no processes, no child cgroups): the kernel generates their
//! files as it does a busy pod's, but a v1 `memory.stat` sums a pod's descendants, so a
//! pod with container cgroups costs a little more in the kernel.
//!
//! Run (as root, on cgroup v1 memory and pids hierarchies): `cargo bench --bench cycle_cost`.
//! `NODEKEEPER_BENCH_CYCLES` sets the cycles per row (2,000); `NODEKEEPER_BENCH_GAP_MS`
//! sleeps that long between cycles (0), as the agent's cycles are spaced in production,
//! so that each cycle starts with what the machine did meanwhile in its caches.

#[path = "../tests/support/mod.rs"]
mod support;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nodekeeper::agent::Agent;
use nodekeeper::config::AgentConfig;
use nodekeeper::metrics::Metrics;
use nodekeeper::ports::{CycleObserver, CycleReport};
use nodekeeper::signals::{Host, end_kernel_file_cycle, keep_kernel_files_open_on_this_thread};
use support::cgroups::TestCgroups;
use support::process_usage::thread_cpu_time;

const MIB: u64 = 1 << 20;
/// The pods cgroup's limit, and a threshold above it: allocatable memory is always short.
const LIMIT: u64 = 512 * MIB;
const THRESHOLD: u64 = 1024 * MIB;
const ROWS: [usize; 3] = [10, 110, 250];
const WARM_UP: usize = 50;

fn main() {
    let mut cgroups = require!(
        "the cgroup v1 memory and pids hierarchies",
        TestCgroups::create(&["memory", "pids"])
    );
    let cycles = env_count("NODEKEEPER_BENCH_CYCLES", 2000).max(1);
    let gap = Duration::from_millis(env_count("NODEKEEPER_BENCH_GAP_MS", 0) as u64);
    let parent = cgroups.parent.clone();
    cgroups.set_memory_limit(&parent, LIMIT);
    let config = cgroups.standalone_agent_config(THRESHOLD, Duration::from_secs(10));
    println!(
        "{cycles} cycles per row, {gap:?} between them; milliseconds: median / p99 / max (nearest rank); CPU: the cycle thread's user + system time per cycle"
    );
    println!(
        "| pods | baseline: the pods' files alone, median / p99 | cycle start → decision, median / p99 / max | CPU per cycle | cycle / baseline (medians) |"
    );
    println!("|---|---|---|---|---|");
    let mut pods = Vec::new();
    let mut per_row = Vec::new();
    for row in ROWS {
        while pods.len() < row {
            pods.push(cgroups.child(&format!("pod-{:03}", pods.len())));
        }
        let files = PodFiles::open(&cgroups, &pods);
        let (baseline, decisions, cpu) = agent_cycles(&config, files, cycles, gap);
        let (baseline, decisions) = (spread(baseline), spread(decisions));
        println!(
            "| {row} | {} / {} | {} / {} / {} | {} | {:.2} |",
            ms(baseline.median),
            ms(baseline.p99),
            ms(decisions.median),
            ms(decisions.p99),
            ms(decisions.max),
            ms(cpu),
            decisions.median.as_secs_f64() / baseline.median.as_secs_f64()
        );
        per_row.push((row, baseline, decisions, cpu));
    }
    // What each pod past the first ten adds, from the medians.
    let first = &per_row[0];
    for (row, baseline, decisions, cpu) in &per_row[1..] {
        let extra = (*row - first.0) as f64;
        let per_pod =
            |now: Duration, then: Duration| (now.as_secs_f64() - then.as_secs_f64()) / extra * 1e6;
        println!(
            "{} → {row} pods, per extra pod: cycle {:.2} µs, CPU {:.2} µs, baseline {:.2} µs",
            first.0,
            per_pod(decisions.median, first.2.median),
            per_pod(*cpu, first.3),
            per_pod(baseline.median, first.1.median),
        );
    }
}

/// Every pod's three files, held open: the baseline reads each once per pass.
struct PodFiles(Vec<File>);

impl PodFiles {
    fn open(cgroups: &TestCgroups, pods: &[PathBuf]) -> PodFiles {
        let mut files = Vec::new();
        for pod in pods {
            for (hierarchy, name) in [
                ("memory", "memory.usage_in_bytes"),
                ("memory", "memory.stat"),
                ("pids", "pids.current"),
            ] {
                let path = cgroups.dir(hierarchy, pod).join(name);
                files.push(File::open(&path).unwrap_or_else(|e| {
                    panic!("cannot open {}: {e}", path.display());
                }));
            }
        }
        PodFiles(files)
    }

    /// One pass: each file read once from its start.
    fn read_all(&self) -> Duration {
        let mut buffer = [0u8; 4096];
        let started = Instant::now();
        for file in &self.0 {
            let read = file.read_at(&mut buffer, 0).expect("a pod file reads");
            assert!(read > 0 && read < buffer.len(), "{read} bytes");
        }
        started.elapsed()
    }
}

/// `cycles` decision cycles of an agent over the pods now under the parent, after a
/// warm-up, on a thread of their own that keeps kernel files open as the agent's cycle
/// thread does, each after one baseline pass over `files` on the same thread (so that the
/// two see the same machine, whose speed drifts from minute to minute on shared vCPUs):
/// the baseline passes, each cycle's start → decision, and the thread's CPU time per cycle
/// (the baseline's passes left out).
fn agent_cycles(
    config: &AgentConfig,
    files: PodFiles,
    cycles: usize,
    gap: Duration,
) -> (Vec<Duration>, Vec<Duration>, Duration) {
    let config = config.clone();
    std::thread::spawn(move || {
        keep_kernel_files_open_on_this_thread();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let host = Host::detect(&config.paths);
        let decisions = Arc::new(Mutex::new(Vec::with_capacity(cycles + WARM_UP)));
        let mut agent = Agent::on_host(config, host, Arc::new(Metrics::new()));
        agent.add_cycle_observer(Box::new(DecisionClock(decisions.clone())));
        // The baseline passes and the cycles' CPU time of `count` cycles.
        let mut run = |count: usize| {
            let mut baseline = Vec::with_capacity(count);
            let mut cpu = Duration::ZERO;
            for _ in 0..count {
                // A gap before each of the two, so neither starts warm from the other.
                std::thread::sleep(gap);
                baseline.push(files.read_all());
                std::thread::sleep(gap);
                let cpu_before = thread_cpu_time();
                let (report, _) = runtime.block_on(agent.run_cycle());
                assert_eq!(
                    report.decision.evictions.len(),
                    1,
                    "every cycle must rank the pods and choose one"
                );
                end_kernel_file_cycle();
                cpu += thread_cpu_time() - cpu_before;
            }
            (baseline, cpu)
        };
        run(WARM_UP);
        let (baseline, cpu) = run(cycles);
        let cpu = cpu / u32::try_from(cycles).unwrap_or(u32::MAX);
        let decisions = decisions.lock().unwrap().split_off(WARM_UP);
        (baseline, decisions, cpu)
    })
    .join()
    .expect("the cycle thread")
}

/// Each cycle's start → its decision: observers see the report right after the decision.
struct DecisionClock(Arc<Mutex<Vec<Duration>>>);

impl CycleObserver for DecisionClock {
    fn observe(&mut self, report: &CycleReport) {
        let elapsed = report.collection_started.elapsed();
        self.0.lock().unwrap().push(elapsed);
    }
}

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Spread {
    median: Duration,
    p99: Duration,
    max: Duration,
}

fn spread(mut samples: Vec<Duration>) -> Spread {
    samples.sort_unstable();
    let rank = |fraction: f64| {
        let index = ((fraction * samples.len() as f64).ceil() as usize).max(1) - 1;
        samples[index.min(samples.len() - 1)]
    };
    Spread {
        median: rank(0.5),
        p99: rank(0.99),
        max: rank(1.0),
    }
}

fn ms(duration: Duration) -> String {
    format!("{:.3}", duration.as_secs_f64() * 1e3)
}
