//! The eviction core at node scale: one `synchronize` cycle under memory pressure
//! (thresholds, local-storage limits, choosing the pod) and a full ranking, for 110,
//! 1,000 and 10,000 pods. After criterion's runs, the growth from 110 pods is measured
//! again in the same process and compared with n log n.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use nodekeeper::config::{EvictionConfig, GoDuration, Quantity, Threshold, ThresholdValue};
use nodekeeper::eviction::{EvictionState, Millis, SyncOptions, rank, synchronize};
use nodekeeper::pods::{
    ContainerStats, ContainerUsage, EmptyDirStats, Pod, PodUsage, ResourceAmounts,
};
use nodekeeper::signals::{Observation, Observations, Signal};

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
                },
                limits: ResourceAmounts {
                    memory: None,
                    ephemeral_storage: Some(4 * GI),
                },
                usage: PodUsage {
                    memory: Some(memory),
                    ephemeral_storage: Some(next(1024) * MI),
                    inodes: Some(next(100_000)),
                    pids: Some(next(500)),
                },
                containers: vec![ContainerStats {
                    name: "app".into(),
                    requests: ResourceAmounts {
                        memory: Some(256 * MI),
                        ephemeral_storage: None,
                    },
                    limits: ResourceAmounts {
                        memory: None,
                        ephemeral_storage: Some(2 * GI),
                    },
                    usage: ContainerUsage {
                        memory: Some(memory),
                        rootfs: Some(100 * MI),
                        logs: Some(10 * MI),
                    },
                }],
                empty_dirs: vec![EmptyDirStats {
                    name: "scratch".into(),
                    size_limit: Some(GI),
                    used: Some(MI),
                }],
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
    pods: Vec<Pod>,
}

impl Scenario {
    fn new(count: usize) -> Self {
        let config = config();
        let observations = observations();
        let pods = pods(count);
        let options = SyncOptions::default();
        let first = synchronize(
            &config,
            &EvictionState::default(),
            &observations,
            &pods,
            Millis(0),
            &options,
        );
        Scenario {
            config,
            state: first.state,
            observations,
            pods,
        }
    }

    /// Decide and produce the full memory ranking, as `nodekeeper rank` and the agent's
    /// explanation log would.
    fn cycle(&self) -> usize {
        let decision = synchronize(
            &self.config,
            &self.state,
            &self.observations,
            &self.pods,
            Millis(10_000),
            &SyncOptions::default(),
        );
        assert_eq!(decision.evictions.len(), 1);
        rank(Signal::MemoryAvailable, &self.pods).len() + decision.evictions.len()
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("eviction_core");
    for count in SIZES {
        let scenario = Scenario::new(count);
        group.throughput(Throughput::Elements(count as u64));
        group.bench_with_input(
            BenchmarkId::new("synchronize_and_rank", count),
            &scenario,
            |b, s| b.iter(|| black_box(s.cycle())),
        );
        group.bench_with_input(BenchmarkId::new("rank_only", count), &scenario, |b, s| {
            b.iter(|| black_box(rank(Signal::MemoryAvailable, black_box(&s.pods)).len()))
        });
    }
    group.finish();
}

/// Median time of one cycle over many short batches.
fn median_cycle(scenario: &Scenario) -> Duration {
    let per_batch = (200_000 / scenario.pods.len()).max(1) as u32;
    for _ in 0..per_batch {
        black_box(scenario.cycle());
    }
    let mut samples: Vec<Duration> = (0..31)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..per_batch {
                black_box(scenario.cycle());
            }
            start.elapsed() / per_batch
        })
        .collect();
    samples.sort();
    samples[samples.len() / 2]
}

fn growth_report() {
    let times: Vec<(usize, Duration)> = SIZES
        .iter()
        .map(|&count| (count, median_cycle(&Scenario::new(count))))
        .collect();
    let (base_n, base_time) = times[0];
    let n_log_n = |n: usize| n as f64 * (n as f64).log2();
    println!("\nGrowth of synchronize + rank against {base_n} pods (same run):");
    println!(
        "{:>7} {:>12} {:>10} {:>14} {:>9}",
        "pods", "median", "ratio", "n log n ratio", "within"
    );
    for (count, time) in &times {
        let ratio = time.as_secs_f64() / base_time.as_secs_f64();
        let bound = n_log_n(*count) / n_log_n(base_n);
        println!(
            "{count:>7} {:>10.1}µs {ratio:>10.2} {bound:>14.2} {:>9}",
            time.as_secs_f64() * 1e6,
            if ratio <= bound * 1.25 { "yes" } else { "NO" }
        );
    }
    if let Some((count, time)) = times.last() {
        let goal = Duration::from_millis(2);
        println!(
            "{count} pods: {:.3} ms per cycle (goal < 2 ms: {})",
            time.as_secs_f64() * 1e3,
            if *time < goal { "met" } else { "MISSED" }
        );
    }
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
