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
                cgroup: None,
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

/// CPU time of this thread: unlike wall time it does not count the time the scheduler
/// gives to other processes, which dominates multi-millisecond samples on a busy host.
fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// Median (wall, CPU) time of one run of `work` over 31 batches of about 200,000
/// elements each.
fn median_time(count: usize, mut work: impl FnMut() -> usize) -> (Duration, Duration) {
    let per_batch = (200_000 / count).max(1) as u32;
    for _ in 0..per_batch {
        black_box(work());
    }
    let (mut wall, mut cpu): (Vec<Duration>, Vec<Duration>) = (0..31)
        .map(|_| {
            let (start, start_cpu) = (Instant::now(), thread_cpu_time());
            for _ in 0..per_batch {
                black_box(work());
            }
            (
                start.elapsed() / per_batch,
                thread_cpu_time().saturating_sub(start_cpu) / per_batch,
            )
        })
        .unzip();
    wall.sort();
    cpu.sort();
    (wall[wall.len() / 2], cpu[cpu.len() / 2])
}

/// The floor any comparison sort pays on this host: sorting `count` random 128-bit keys
/// with an index, the shape `rank` sorts. On a busy host its growth from 1,000 to
/// 10,000 elements already exceeds n log n because the larger array falls out of cache.
fn bare_sort(count: usize) -> impl FnMut() -> usize {
    let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
    let keys: Vec<(u128, u32)> = (0..count as u32)
        .map(|i| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (u128::from(seed) << 32, i)
        })
        .collect();
    move || {
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        black_box(&sorted).len()
    }
}

fn growth_report() {
    let baseline: Vec<Duration> = SIZES
        .iter()
        .map(|&count| median_time(count, bare_sort(count)).1)
        .collect();
    let times: Vec<(usize, (Duration, Duration))> = SIZES
        .iter()
        .map(|&count| {
            let scenario = Scenario::new(count);
            (count, median_time(count, || scenario.cycle()))
        })
        .collect();
    println!("\nBare sort of random (u128, u32) keys on this host (same run, median CPU):");
    for (count, cpu) in SIZES.iter().zip(&baseline) {
        println!(
            "{count:>7} {:>9.1}µs  ratio {:>7.2}  (n log n ratio {:.2})",
            cpu.as_secs_f64() * 1e6,
            cpu.as_secs_f64() / baseline[0].as_secs_f64(),
            (*count as f64 * (*count as f64).log2()) / (110.0 * 110f64.log2())
        );
    }
    let (base_n, (base_wall, base_cpu)) = times[0];
    let n_log_n = |n: usize| n as f64 * (n as f64).log2();
    println!("\nGrowth of synchronize + full rank against {base_n} pods (same run, medians):");
    println!(
        "{:>7} {:>11} {:>11} {:>10} {:>9} {:>14} {:>7} {:>12}",
        "pods", "wall", "cpu", "wall ratio", "cpu ratio", "n log n ratio", "within", "cpu/bare"
    );
    for ((count, (wall, cpu)), bare) in times.iter().zip(&baseline) {
        let wall_ratio = wall.as_secs_f64() / base_wall.as_secs_f64();
        let cpu_ratio = cpu.as_secs_f64() / base_cpu.as_secs_f64();
        let bound = n_log_n(*count) / n_log_n(base_n);
        println!(
            "{count:>7} {:>9.1}µs {:>9.1}µs {wall_ratio:>10.2} {cpu_ratio:>9.2} {bound:>14.2} {:>7} {:>12.2}",
            wall.as_secs_f64() * 1e6,
            cpu.as_secs_f64() * 1e6,
            // 25% slack for cache effects between sizes
            if cpu_ratio <= bound * 1.25 {
                "yes"
            } else {
                "NO"
            },
            cpu.as_secs_f64() / bare.as_secs_f64(),
        );
    }
    if let Some((count, (wall, cpu))) = times.last() {
        let goal = Duration::from_millis(2);
        println!(
            "{count} pods: {:.3} ms CPU, {:.3} ms wall per cycle (goal < 2 ms: {})",
            cpu.as_secs_f64() * 1e3,
            wall.as_secs_f64() * 1e3,
            if *cpu < goal { "met" } else { "MISSED" }
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
