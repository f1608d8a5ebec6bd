//! The eviction core at node scale, for 110, 1,000 and 10,000 pods.
//!
//! The goal case is one agent cycle's decision (`synchronize`: thresholds, grace and
//! min-reclaim bookkeeping, local-storage limits, and the choice of the one pod to evict)
//! on a pod list built afresh for that cycle, as the agent's pod source builds it, never
//! a warm vector reused across cycles. Two baselines run on the same fresh lists in the
//! same run: one bare pass over every pod's rank inputs (the floor of any choice that
//! looks at each pod once) and "rank every pod, then take the first evictable one" (the
//! sort-based choice). The full ranking that `nodekeeper rank` prints is timed as well.

#[path = "../tests/support/process_usage.rs"]
#[allow(dead_code)]
mod process_usage;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput};
use nodekeeper::config::{
    EvictionConfig, FilesystemLayout, GoDuration, Quantity, Threshold, ThresholdValue,
};
use nodekeeper::eviction::{EvictionState, Millis, SyncOptions, rank, synchronize};
use nodekeeper::pods::{
    ContainerStats, ContainerUsage, EmptyDirStats, Pod, PodUsage, ResourceAmounts,
};
use nodekeeper::signals::{Observation, Observations, Signal};
use process_usage::thread_cpu_time;

const SIZES: [usize; 3] = [110, 1_000, 10_000];
const MI: i64 = 1 << 20;

/// Deterministic pseudo-random pods: varied priorities, requests and usage, each with a
/// container and an emptyDir inside their limits so every local-storage check runs.
fn pods(count: usize) -> Vec<Pod> {
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move |modulo: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((seed >> 33) % modulo) as i64
    };
    (0..count)
        .map(|i| {
            let memory = (next(2048) + 1) * MI;
            Pod {
                namespace: format!("ns-{}", i % 37),
                name: format!("pod-{i}"),
                uid: Some(format!("uid-{i}")),
                priority: [0, 0, 100, 1000, 2_000_000_000][next(5) as usize],
                termination_grace_period_seconds: Some(30),
                critical: i % 50 == 0,
                requests: ResourceAmounts {
                    memory: Some((next(1024) + 1) * MI),
                    ephemeral_storage: Some(GI),
                    ..Default::default()
                },
                limits: ResourceAmounts {
                    memory: None,
                    ephemeral_storage: Some(4 * GI),
                    ..Default::default()
                },
                usage: PodUsage {
                    memory: Some(memory),
                    ephemeral_storage: Some(next(1024) * MI),
                    inodes: Some(next(100_000)),
                    pids: Some(next(500)),
                    storage: Default::default(),
                },
                containers: vec![ContainerStats {
                    name: "app".into(),
                    kind: Default::default(),
                    requests: ResourceAmounts {
                        memory: Some(256 * MI),
                        ephemeral_storage: None,
                        ..Default::default()
                    },
                    limits: ResourceAmounts {
                        memory: None,
                        ephemeral_storage: Some(2 * GI),
                        ..Default::default()
                    },
                    usage: ContainerUsage {
                        memory: Some(memory),
                        rootfs: Some(100 * MI),
                        logs: Some(10 * MI),
                    },
                }],
                empty_dirs: vec![EmptyDirStats {
                    name: "scratch".into(),
                    size_limit: Some(nodekeeper::quantity::Quantity::from_value(GI)),
                    used: Some(MI),
                    memory_backed: false,
                }],
                cgroup: None,
                terminating: false,
            }
        })
        .collect()
}

const GI: i64 = 1 << 30;

fn config() -> EvictionConfig {
    let threshold = |signal, value| Threshold {
        signal,
        value,
        grace_period: GoDuration::ZERO,
        min_reclaim: Some(ThresholdValue::Quantity(Quantity::from_value(512 * MI))),
    };
    EvictionConfig {
        thresholds: vec![
            threshold(
                Signal::MemoryAvailable,
                ThresholdValue::Quantity(Quantity::from_value(GI)),
            ),
            threshold(Signal::NodeFsAvailable, ThresholdValue::Percentage(0.10)),
            threshold(Signal::NodeFsInodesFree, ThresholdValue::Percentage(0.05)),
            threshold(
                Signal::PidAvailable,
                ThresholdValue::Quantity(Quantity::from_value(1000)),
            ),
        ],
        ..EvictionConfig::default()
    }
}

fn observations() -> Observations {
    let observe = |available, capacity| Observation {
        available,
        capacity,
        sampled_at_ms: None,
    };
    [
        (Signal::MemoryAvailable, observe(512 * MI, 64 * GI)),
        (Signal::NodeFsAvailable, observe(8 * GI, 100 * GI)),
        (Signal::NodeFsInodesFree, observe(900_000, 1_000_000)),
        (Signal::PidAvailable, observe(30_000, 32_768)),
    ]
    .into_iter()
    .collect()
}

/// A cycle in steady pressure: the previous cycle already met the thresholds, so the
/// min-reclaim and grace bookkeeping run too.
struct Scenario {
    config: EvictionConfig,
    state: EvictionState,
    observations: Observations,
    /// Cloned into a fresh list for every measured cycle.
    template: Vec<Pod>,
}

impl Scenario {
    fn new(count: usize) -> Self {
        let config = config();
        let observations = observations();
        let template = pods(count);
        let first = synchronize(
            &config,
            &EvictionState::default(),
            &observations,
            &template,
            Millis(0),
            &SyncOptions::default(),
        );
        Scenario {
            config,
            state: first.state,
            observations,
            template,
        }
    }

    /// This cycle's pod list: new allocations, as the agent's pod source returns them.
    fn fresh_pods(&self) -> Vec<Pod> {
        self.template.clone()
    }

    /// The goal case: decide one cycle and choose the pod to evict.
    fn decide(&self, pods: &[Pod]) -> usize {
        let decision = synchronize(
            &self.config,
            &self.state,
            &self.observations,
            pods,
            Millis(10_000),
            &SyncOptions::default(),
        );
        assert_eq!(decision.evictions.len(), 1);
        decision.evictions.len()
    }
}

/// Baseline: read each pod's memory rank inputs once (usage, request, priority,
/// criticality) and keep the largest, the least any one-pass choice must do.
fn linear_pass(pods: &[Pod]) -> usize {
    pods.iter()
        .enumerate()
        .filter(|(_, pod)| !pod.is_critical())
        .max_by_key(|(_, pod)| {
            let usage = pod.usage.memory.unwrap_or(0);
            let above = usage.saturating_sub(pod.requests.memory.unwrap_or(0));
            (
                usage > pod.requests.memory.unwrap_or(0),
                -pod.priority,
                above,
            )
        })
        .map_or(0, |(index, _)| index)
}

/// Baseline: the sort-based choice, ranking every pod and taking the first evictable.
fn sort_then_pick(pods: &[Pod]) -> usize {
    let ranked = rank(Signal::MemoryAvailable, FilesystemLayout::SingleDisk, pods);
    let victim = ranked.iter().position(|pod| !pod.is_critical());
    victim.unwrap_or(ranked.len())
}

type Case = (&'static str, fn(&Scenario, &[Pod]) -> usize);

/// Every case runs on a fresh pod list; `synchronize` is the goal, the rest baselines.
const CASES: [Case; 3] = [
    ("synchronize", |s, pods| s.decide(pods)),
    ("baseline_linear_pass", |_, pods| linear_pass(pods)),
    ("baseline_sort_then_pick", |_, pods| sort_then_pick(pods)),
];

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("eviction_core");
    for count in SIZES {
        let scenario = Scenario::new(count);
        group.throughput(Throughput::Elements(count as u64));
        for (name, case) in CASES {
            group.bench_with_input(BenchmarkId::new(name, count), &scenario, |b, s| {
                // By reference, so the list is dropped outside the timed routine.
                b.iter_batched_ref(
                    || s.fresh_pods(),
                    |pods| black_box(case(s, black_box(pods))),
                    BatchSize::PerIteration,
                )
            });
        }
        group.bench_with_input(BenchmarkId::new("rank_only", count), &scenario, |b, s| {
            b.iter(|| {
                black_box(
                    rank(
                        Signal::MemoryAvailable,
                        FilesystemLayout::SingleDisk,
                        black_box(&s.template),
                    )
                    .len(),
                )
            })
        });
    }
    group.finish();
}

/// Median and p99 (nearest rank) of a sorted sample.
fn median_p99(sorted: &[Duration]) -> (Duration, Duration) {
    let p99 = (sorted.len() * 99).div_ceil(100).max(1) - 1;
    (sorted[sorted.len() / 2], sorted[p99])
}

/// Per-cycle samples of one case: the list is rebuilt before each cycle (not timed),
/// then the case alone is timed in thread CPU and wall time.
struct Samples {
    cpu: Vec<Duration>,
    wall: Vec<Duration>,
}

fn sample(scenario: &Scenario, case: fn(&Scenario, &[Pod]) -> usize) -> Samples {
    // About 2,000,000 pod-cycles per case, at least 200 cycles for the p99.
    let cycles = (2_000_000 / scenario.template.len()).clamp(200, 5_000);
    let mut samples = Samples {
        cpu: Vec::with_capacity(cycles),
        wall: Vec::with_capacity(cycles),
    };
    for round in 0..cycles + cycles / 10 {
        let pods = scenario.fresh_pods();
        let (start, start_cpu) = (Instant::now(), thread_cpu_time());
        black_box(case(scenario, black_box(&pods)));
        let (cpu, wall) = (thread_cpu_time().saturating_sub(start_cpu), start.elapsed());
        // The first tenth warms the allocator and the branch predictors.
        if round >= cycles / 10 {
            samples.cpu.push(cpu);
            samples.wall.push(wall);
        }
        drop(pods);
    }
    samples.cpu.sort();
    samples.wall.sort();
    samples
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

fn growth_report() {
    const GOAL: Duration = Duration::from_micros(500);
    println!("\nPer cycle on a pod list rebuilt for each cycle (same run; CPU = thread CPU time):");
    println!(
        "{:>7} {:>24} {:>11} {:>11} {:>11} {:>11} {:>9}",
        "pods", "case", "cpu median", "cpu p99", "wall median", "wall p99", "vs pass"
    );
    let mut goal_line = String::new();
    for count in SIZES {
        let scenario = Scenario::new(count);
        let results: Vec<(&str, Samples)> = CASES
            .iter()
            .map(|(name, case)| (*name, sample(&scenario, *case)))
            .collect();
        let pass = median_p99(&results[1].1.cpu).0;
        for (name, samples) in &results {
            let (cpu, cpu_p99) = median_p99(&samples.cpu);
            let (wall, wall_p99) = median_p99(&samples.wall);
            println!(
                "{count:>7} {name:>24} {:>9.1}µs {:>9.1}µs {:>9.1}µs {:>9.1}µs {:>8.2}×",
                micros(cpu),
                micros(cpu_p99),
                micros(wall),
                micros(wall_p99),
                cpu.as_secs_f64() / pass.as_secs_f64(),
            );
        }
        let decide = median_p99(&results[0].1.cpu).0;
        let sorted = median_p99(&results[2].1.cpu).0;
        println!(
            "{count:>7} synchronize is {:.2}× the bare pass and {:.3}× the sort-then-pick choice",
            decide.as_secs_f64() / pass.as_secs_f64(),
            decide.as_secs_f64() / sorted.as_secs_f64(),
        );
        if count == SIZES[SIZES.len() - 1] {
            goal_line = format!(
                "{count} pods: synchronize {:.3} ms CPU median, {:.3} ms wall median per cycle (goal < {} ms: {})",
                decide.as_secs_f64() * 1e3,
                median_p99(&results[0].1.wall).0.as_secs_f64() * 1e3,
                GOAL.as_secs_f64() * 1e3,
                if decide < GOAL { "met" } else { "MISSED" }
            );
        }
    }
    println!("{goal_line}");
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    bench(&mut criterion);
    criterion.final_summary();
    let quick_check = std::env::args().any(|a| a == "--test" || a == "--list");
    if !quick_check {
        growth_report();
    }
}
