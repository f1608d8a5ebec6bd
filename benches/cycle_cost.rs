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
//! Two pod sources, each with its own rows:
//! - **standalone**: the pods are the children of the pods cgroup, listed and read each
//!   cycle (the baseline: each pod's `memory.usage_in_bytes`, `memory.stat` and
//!   `pids.current`);
//! - **kubernetes**: the pods come from a reflector's store as the agent's pod watch fills
//!   it (one container and two volumes each, every third with a completed init container,
//!   Burstable; the store does not change during a row), listed and measured each cycle
//!   by the agent's Kubernetes pod source in their cgroups where the kubelet makes
//!   them (`kubepods/burstable/pod<uid>/<container id>`, cgroupfs driver); the baseline:
//!   the pod's `memory.usage_in_bytes` and `memory.stat`, the files that source reads
//!   every cycle (a container's are read only for an eviction's message; until
//!   2026-12-07 every container's were read too, and the baseline had them).
//!
//! With `NODEKEEPER_BENCH_POD_STATS_MAX_AGE` (a Go duration) the agent's `podStatsMaxAge`
//! is set, and each timer cycle is followed by a cycle a kernel notification would start
//! (after the gap), which may rank on the figures the timer cycle kept; those cycles get
//! rows of their own ("woken").
//!
//! Run (as root, on cgroup v1 memory and pids hierarchies): `cargo bench --bench cycle_cost`.
//! `NODEKEEPER_BENCH_CYCLES` sets the cycles per row (2,000); `NODEKEEPER_BENCH_GAP_MS`
//! sleeps that long between cycles (0), as the agent's cycles are spaced in production,
//! so that each cycle starts with what the machine did meanwhile in its caches;
//! `NODEKEEPER_BENCH_SOURCES` keeps the named pod sources (`standalone,kubernetes`);
//! `NODEKEEPER_BENCH_NOTIFIERS=1` starts the agent's kernel notifiers on the cycle thread,
//! as the agent does, with a `memory.available` threshold the node never meets (0.1%), so
//! that a memcg trigger is registered that is never reached: with `podStatsMaxAge` a timer
//! cycle then asks between its pods' reads whether a notification waits, and none ever
//! does (the rows show what asking costs).

#[path = "../tests/support/mod.rs"]
mod support;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nodekeeper::agent::Agent;
use nodekeeper::config::{AgentConfig, GoDuration};
use nodekeeper::metrics::Metrics;
use nodekeeper::notify::{CycleWake, WakeReason, Wakeup};
use nodekeeper::ports::{CycleObserver, CycleReport, CycleStart, PodSource};
use nodekeeper::signals::{
    Host, end_kernel_file_cycle, keep_kernel_files_open_on_this_thread, probe_host,
};
use support::cgroups::TestCgroups;
use support::kube_node::KubeNode;
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
    let max_age = std::env::var("NODEKEEPER_BENCH_POD_STATS_MAX_AGE")
        .ok()
        .map(|value| {
            GoDuration::parse(&value)
                .unwrap_or_else(|e| panic!("NODEKEEPER_BENCH_POD_STATS_MAX_AGE={value}: {e}"))
        })
        .filter(|age| !age.is_zero());
    let sources = std::env::var("NODEKEEPER_BENCH_SOURCES")
        .unwrap_or_else(|_| "standalone,kubernetes".to_string());
    let notifiers = std::env::var("NODEKEEPER_BENCH_NOTIFIERS").is_ok_and(|value| value == "1");
    let parent = cgroups.parent.clone();
    cgroups.set_memory_limit(&parent, LIMIT);
    println!(
        "{cycles} cycles per row, {gap:?} between them, podStatsMaxAge {}, kernel notifiers {}; milliseconds: median / p99 / max (nearest rank); CPU: the cycle thread's user + system time per cycle",
        max_age.map_or("off".to_string(), |age| age.to_string()),
        if notifiers { "started" } else { "not started" }
    );
    println!(
        "| pods | source | cycles | baseline: the pods' files alone, median / p99 | cycle start → decision, median / p99 / max | CPU per cycle | cycle / baseline (medians) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for source in sources.split(',').map(str::trim) {
        let mut rows = Vec::new();
        match source {
            "standalone" => {
                let mut config =
                    cgroups.standalone_agent_config(THRESHOLD, Duration::from_secs(10));
                config.pod_stats_max_age = max_age;
                if notifiers {
                    add_a_trigger_never_reached(&mut config);
                }
                let mut pods = Vec::new();
                for row in ROWS {
                    while pods.len() < row {
                        pods.push(cgroups.child(&format!("pod-{:03}", pods.len())));
                    }
                    let files = PodFiles::open(&cgroups, &pods, STANDALONE_FILES);
                    rows.push((
                        row,
                        agent_cycles(&config, None, files, cycles, gap, notifiers),
                    ));
                }
            }
            "kubernetes" => {
                let mut node = KubeNode::create(&mut cgroups, LIMIT);
                let mut config =
                    cgroups.standalone_agent_config(THRESHOLD, Duration::from_secs(10));
                config.workloads = None;
                config.paths.pods_cgroup = Some(node.kubepods.clone());
                config.pod_stats_max_age = max_age;
                if notifiers {
                    add_a_trigger_never_reached(&mut config);
                }
                for row in ROWS {
                    node.grow_to(&mut cgroups, row);
                    let files = PodFiles::open(&cgroups, &node.measured_dirs(), KUBERNETES_FILES);
                    let source = node.pod_source(&config);
                    rows.push((
                        row,
                        agent_cycles(&config, Some(source), files, cycles, gap, notifiers),
                    ));
                }
            }
            other => {
                panic!("NODEKEEPER_BENCH_SOURCES: no pod source {other:?} (standalone, kubernetes)")
            }
        }
        for (row, measured) in &rows {
            for (kind, baseline, decisions, cpu) in measured.rows() {
                println!(
                    "| {row} | {source} | {kind} | {} / {} | {} / {} / {} | {} | {:.2} |",
                    ms(baseline.median),
                    ms(baseline.p99),
                    ms(decisions.median),
                    ms(decisions.p99),
                    ms(decisions.max),
                    ms(cpu),
                    decisions.median.as_secs_f64() / baseline.median.as_secs_f64()
                );
            }
        }
        // What each pod past the first ten adds, from the medians.
        let (first_row, first) = &rows[0];
        for (row, measured) in &rows[1..] {
            let extra = (*row - *first_row) as f64;
            let per_pod = |now: Duration, then: Duration| {
                (now.as_secs_f64() - then.as_secs_f64()) / extra * 1e6
            };
            for (
                (kind, baseline, decisions, cpu),
                (_, first_baseline, first_decisions, first_cpu),
            ) in measured.rows().into_iter().zip(first.rows())
            {
                println!(
                    "{source}, {kind}: {first_row} → {row} pods, per extra pod: cycle {:.2} µs, CPU {:.2} µs, baseline {:.2} µs",
                    per_pod(decisions.median, first_decisions.median),
                    per_pod(cpu, first_cpu),
                    per_pod(baseline.median, first_baseline.median),
                );
            }
        }
    }
}

/// A `memory.available` threshold of 0.1%, which the node does not meet: its memcg
/// trigger, at the root, is registered and never reached.
fn add_a_trigger_never_reached(config: &mut AgentConfig) {
    use nodekeeper::config::{Threshold, ThresholdValue};
    config.eviction.thresholds.push(Threshold {
        signal: nodekeeper::signals::Signal::MemoryAvailable,
        value: ThresholdValue::Percentage(0.001),
        grace_period: GoDuration::ZERO,
        min_reclaim: None,
    });
}

/// The files of each pod a standalone cycle read (the process count since only with a
/// `pid.available` threshold; kept for comparison with earlier figures).
const STANDALONE_FILES: &[(&str, &str)] = &[
    ("memory", "memory.usage_in_bytes"),
    ("memory", "memory.stat"),
    ("pids", "pids.current"),
];
/// The files of each pod cgroup the Kubernetes pod source reads every cycle.
const KUBERNETES_FILES: &[(&str, &str)] = &[
    ("memory", "memory.usage_in_bytes"),
    ("memory", "memory.stat"),
];

/// Every pod's files, held open: the baseline reads each once per pass.
struct PodFiles(Vec<File>);

impl PodFiles {
    fn open(cgroups: &TestCgroups, dirs: &[PathBuf], names: &[(&str, &str)]) -> PodFiles {
        let mut files = Vec::new();
        for dir in dirs {
            for (hierarchy, name) in names {
                let path = cgroups.dir(hierarchy, dir).join(name);
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

/// What one row measured: the baseline passes, and each kind of cycle's decisions and
/// CPU time per cycle.
struct Measured {
    baseline: Vec<Duration>,
    timer: (Vec<Duration>, Duration),
    /// The cycles a notification started after each timer cycle, with `podStatsMaxAge`.
    woken: Option<(Vec<Duration>, Duration)>,
}

impl Measured {
    /// (cycles, baseline, decisions, CPU per cycle) for each kind of cycle.
    fn rows(&self) -> Vec<(&'static str, Spread, Spread, Duration)> {
        std::iter::once(("timer", &self.timer))
            .chain(self.woken.as_ref().map(|woken| ("woken", woken)))
            .map(|(kind, (decisions, cpu))| {
                (
                    kind,
                    spread(self.baseline.clone()),
                    spread(decisions.clone()),
                    *cpu,
                )
            })
            .collect()
    }
}

/// `cycles` decision cycles of an agent over the pods now under the parent (or from
/// `source`), after a warm-up, on a thread of their own that keeps kernel files open as
/// the agent's cycle thread does, each after one baseline pass over `files` on the same
/// thread (so that the two see the same machine, whose speed drifts from minute to minute
/// on shared vCPUs). With `podStatsMaxAge` set, each timer cycle is followed by a cycle a
/// notification starts, measured apart. With `notifiers`, the agent's kernel notifiers
/// run on that thread, as on the agent's cycle thread.
fn agent_cycles(
    config: &AgentConfig,
    source: Option<Box<dyn PodSource>>,
    files: PodFiles,
    cycles: usize,
    gap: Duration,
    notifiers: bool,
) -> Measured {
    let config = config.clone();
    std::thread::spawn(move || {
        keep_kernel_files_open_on_this_thread();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let woken_too = config.pod_stats_max_age.is_some();
        let host = Host::detect(&config.paths);
        // Probed only for the notifiers, before the agent takes the host.
        let support = notifiers.then(|| probe_host(&host));
        let decisions = Arc::new(Mutex::new(Vec::with_capacity(2 * (cycles + WARM_UP))));
        let mut agent = Agent::on_host(config, host, Arc::new(Metrics::new()));
        if let Some(support) = support {
            let _runtime = runtime.enter();
            agent.start_notifiers(&support, Arc::new(CycleWake::new()));
        }
        if let Some(source) = source {
            agent.set_pod_source(source);
        }
        agent.add_cycle_observer(Box::new(DecisionClock(decisions.clone())));
        // One cycle started as `started_by` says; its CPU time.
        let mut cycle = |started_by: CycleStart| {
            let cpu_before = thread_cpu_time();
            let (report, _) = runtime.block_on(agent.run_cycle_started_by(started_by));
            assert_eq!(
                report.decision.evictions.len(),
                1,
                "every cycle must rank the pods and choose one"
            );
            if !agent.reused_pod_figures() {
                end_kernel_file_cycle();
            }
            thread_cpu_time() - cpu_before
        };
        // The baseline passes and the cycles' CPU time (timer, woken) of `count` rounds.
        let mut run = |count: usize| {
            let mut baseline = Vec::with_capacity(count);
            let (mut timer_cpu, mut woken_cpu) = (Duration::ZERO, Duration::ZERO);
            for _ in 0..count {
                // A gap before each, so none starts warm from the one before.
                std::thread::sleep(gap);
                baseline.push(files.read_all());
                std::thread::sleep(gap);
                timer_cpu += cycle(CycleStart::Timer);
                if woken_too {
                    std::thread::sleep(gap);
                    woken_cpu += cycle(CycleStart::Woken(Wakeup {
                        reason: WakeReason::Notification,
                        since: tokio::time::Instant::now(),
                    }));
                }
            }
            (baseline, timer_cpu, woken_cpu)
        };
        run(WARM_UP);
        let (baseline, timer_cpu, woken_cpu) = run(cycles);
        let per_cycle = |cpu: Duration| cpu / u32::try_from(cycles).unwrap_or(u32::MAX);
        let decisions =
            decisions
                .lock()
                .unwrap()
                .split_off(if woken_too { 2 * WARM_UP } else { WARM_UP });
        let (timer, woken): (Vec<_>, Vec<_>) = decisions
            .into_iter()
            .partition(|(started_by, _)| *started_by == CycleStart::Timer);
        let times = |cycles: Vec<(CycleStart, Duration)>| -> Vec<Duration> {
            cycles.into_iter().map(|(_, elapsed)| elapsed).collect()
        };
        Measured {
            baseline,
            timer: (times(timer), per_cycle(timer_cpu)),
            woken: woken_too.then(|| (times(woken), per_cycle(woken_cpu))),
        }
    })
    .join()
    .expect("the cycle thread")
}

/// Each cycle's start → its decision: observers see the report right after the decision.
struct DecisionClock(Arc<Mutex<Vec<(CycleStart, Duration)>>>);

impl CycleObserver for DecisionClock {
    fn observe(&mut self, report: &CycleReport) {
        let elapsed = report.collection_started.elapsed();
        self.0.lock().unwrap().push((report.started_by, elapsed));
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
