//! Table tests: the kubelet's eviction behaviours, one scenario each.

use std::collections::BTreeSet;

use super::*;
use crate::config::{
    EvictionConfig, FilesystemLayout, GoDuration, Quantity, Threshold, ThresholdValue,
};
use crate::pods::{
    AmountFormats, ContainerKind, ContainerStats, ContainerUsage, DiskAmount, EmptyDirStats, Pod,
    PodUsage, ResourceAmounts, StorageUsage,
};
use crate::signals::{NodeCondition, Observation, Observations, Signal};

const MI: i64 = 1 << 20;
const GI: i64 = 1 << 30;

fn quantity(value: i64) -> ThresholdValue {
    ThresholdValue::Quantity(Quantity::from_value(value))
}

fn hard(signal: Signal, value: ThresholdValue) -> Threshold {
    Threshold {
        signal,
        value,
        grace_period: GoDuration::ZERO,
        min_reclaim: None,
    }
}

fn soft(signal: Signal, value: ThresholdValue, grace_secs: i64) -> Threshold {
    Threshold {
        grace_period: GoDuration::from_secs(grace_secs),
        ..hard(signal, value)
    }
}

fn config(thresholds: Vec<Threshold>) -> EvictionConfig {
    EvictionConfig {
        thresholds,
        max_pod_grace_period_seconds: 0,
        pressure_transition_period: GoDuration::from_secs(300),
        local_storage_capacity_isolation: true,
        hugepage_aware: true,
    }
}

fn observe(entries: &[(Signal, i64, i64)]) -> Observations {
    entries
        .iter()
        .map(|&(signal, available, capacity)| {
            (
                signal,
                Observation {
                    available,
                    capacity,
                    sampled_at_ms: None,
                },
            )
        })
        .collect()
}

fn memory(available: i64) -> Observations {
    observe(&[(Signal::MemoryAvailable, available, 10 * GI)])
}

fn pod(name: &str) -> Pod {
    Pod {
        namespace: "default".into(),
        name: name.into(),
        ..Pod::default()
    }
}

fn mem_pod(name: &str, usage: i64, request: Option<i64>, priority: i32) -> Pod {
    Pod {
        priority,
        requests: ResourceAmounts {
            memory: request,
            ..ResourceAmounts::default()
        },
        usage: PodUsage {
            memory: Some(usage),
            ..PodUsage::default()
        },
        ..pod(name)
    }
}

fn at(secs: u64) -> Millis {
    Millis(secs * 1000)
}

/// Run a sequence of cycles, returning each decision.
fn run(
    config: &EvictionConfig,
    cycles: &[(Millis, Observations)],
    pods: &[Pod],
    options: &SyncOptions,
) -> Vec<Decision> {
    let mut state = EvictionState::default();
    cycles
        .iter()
        .map(|(now, observations)| {
            let decision = synchronize(config, &state, observations, pods, *now, options);
            state = decision.state.clone();
            decision
        })
        .collect()
}

fn evicted(decision: &Decision) -> Vec<String> {
    decision.evictions.iter().map(EvictionOrder::key).collect()
}

fn names(pods: Vec<&Pod>) -> Vec<&str> {
    pods.into_iter().map(|p| p.name.as_str()).collect()
}

fn conditions(list: &[NodeCondition]) -> BTreeSet<NodeCondition> {
    list.iter().copied().collect()
}

// ---- thresholds met -------------------------------------------------------------

#[test]
fn a_threshold_is_met_only_when_available_is_strictly_below_it() {
    let cfg = config(vec![hard(Signal::MemoryAvailable, quantity(GI))]);
    let pods = [mem_pod("a", 100 * MI, None, 0)];
    for (available, expect_met) in [(GI + 1, false), (GI, false), (GI - 1, true)] {
        let d = synchronize(
            &cfg,
            &EvictionState::default(),
            &memory(available),
            &pods,
            at(0),
            &SyncOptions::default(),
        );
        assert_eq!(
            !d.thresholds_met.is_empty(),
            expect_met,
            "available {available}"
        );
        assert_eq!(d.evictions.len(), usize::from(expect_met));
    }
}

#[test]
fn percentage_thresholds_resolve_against_capacity() {
    let cfg = config(vec![hard(
        Signal::NodeFsAvailable,
        ThresholdValue::Percentage(0.10),
    )]);
    let capacity = 100 * GI;
    let ten_percent = (capacity as f64 * f64::from(0.10f32)) as i64;
    for (available, expect_met) in [(ten_percent, false), (ten_percent - 1, true)] {
        let obs = observe(&[(Signal::NodeFsAvailable, available, capacity)]);
        let d = synchronize(
            &cfg,
            &EvictionState::default(),
            &obs,
            &[],
            at(0),
            &SyncOptions::default(),
        );
        assert_eq!(
            !d.thresholds_met.is_empty(),
            expect_met,
            "available {available}"
        );
    }
}

#[test]
fn a_signal_without_observation_is_ignored() {
    let cfg = config(vec![hard(Signal::PidAvailable, quantity(1000))]);
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &memory(0),
        &[pod("a")],
        at(0),
        &SyncOptions::default(),
    );
    assert!(d.thresholds_met.is_empty() && d.conditions.is_empty() && d.evictions.is_empty());
}

#[test]
fn nothing_happens_without_thresholds_or_storage_isolation() {
    let cfg = EvictionConfig {
        local_storage_capacity_isolation: false,
        ..config(vec![])
    };
    let mut p = pod("a");
    p.limits.ephemeral_storage = Some(1);
    p.usage.ephemeral_storage = Some(GI);
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &memory(0),
        &[p],
        at(0),
        &SyncOptions::default(),
    );
    assert_eq!(d, Decision::default());
}

// ---- hard and soft thresholds, grace ---------------------------------------------

#[test]
fn hard_threshold_evicts_at_once_with_one_second_grace_and_the_kubelet_message() {
    let cfg = config(vec![hard(Signal::MemoryAvailable, quantity(GI))]);
    let mut p = mem_pod("web-1", 150 * MI, Some(100 * MI), 0);
    p.uid = Some("uid-1".into());
    p.termination_grace_period_seconds = Some(30);
    p.containers = vec![
        ContainerStats {
            name: "app".into(),
            requests: ResourceAmounts {
                memory: Some(100 * MI),
                ..ResourceAmounts::default()
            },
            usage: ContainerUsage {
                memory: Some(140 * MI),
                ..ContainerUsage::default()
            },
            ..ContainerStats::default()
        },
        ContainerStats {
            name: "sidecar".into(),
            usage: ContainerUsage {
                memory: Some(10 * MI),
                ..ContainerUsage::default()
            },
            ..ContainerStats::default()
        },
        ContainerStats {
            name: "quiet".into(),
            requests: ResourceAmounts {
                memory: Some(50 * MI),
                ..ResourceAmounts::default()
            },
            usage: ContainerUsage {
                memory: Some(MI),
                ..ContainerUsage::default()
            },
            ..ContainerStats::default()
        },
    ];
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &memory(900 * MI),
        &[p],
        at(0),
        &SyncOptions::default(),
    );
    assert_eq!(d.conditions, conditions(&[NodeCondition::MemoryPressure]));
    assert_eq!(d.starved.map(|s| s.resource), Some(Resource::Memory));
    let order = &d.evictions[0];
    assert_eq!(
        order,
        &EvictionOrder {
            namespace: "default".into(),
            name: "web-1".into(),
            uid: Some("uid-1".into()),
            reason: EvictionReason::Threshold(Signal::MemoryAvailable),
            grace_period_seconds: 1,
            message: "The node was low on resource: memory. Threshold quantity: 1Gi, available: 900Mi. \
                      Container app was using 140Mi, request is 100Mi, has larger consumption of memory. \
                      Container sidecar was using 10Mi, request is 0, has larger consumption of memory. "
                .into(),
            annotations: [
                ("offending_containers", "app,sidecar"),
                ("offending_containers_usage", "140Mi,10Mi"),
                ("starved_resource", "memory"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            disruption_target: true,
        }
    );
}

#[test]
fn messages_print_quantities_in_the_format_the_user_wrote_them() {
    // `evictionMessage` prints the threshold and the container's request as the
    // `Quantity` values they are (`String()`: the canonical form in the format they were
    // written in), usage and what is available as `NewQuantity(n, BinarySI)`, and inodes
    // as `NewQuantity(n, DecimalSI)` (`makeSignalObservations`).
    let parsed = |text: &str| Quantity::parse(text).unwrap();
    let cfg = config(vec![hard(
        Signal::MemoryAvailable,
        ThresholdValue::Quantity(parsed("1000M")),
    )]);
    let mut p = mem_pod("web-1", 1_500_000_000, None, 0);
    let request = parsed("1G");
    p.containers = vec![ContainerStats {
        name: "app".into(),
        requests: ResourceAmounts {
            memory: Some(request.value()),
            formats: AmountFormats {
                memory: request.format(),
                ..AmountFormats::default()
            },
            ..ResourceAmounts::default()
        },
        usage: ContainerUsage {
            memory: Some(1_500_000_000),
            ..ContainerUsage::default()
        },
        ..ContainerStats::default()
    }];
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &memory(900_000_000),
        &[p],
        at(0),
        &SyncOptions::default(),
    );
    assert_eq!(
        d.evictions[0].message,
        "The node was low on resource: memory. Threshold quantity: 1G, available: 900000000. \
         Container app was using 1500000000, request is 1G, has larger consumption of memory. "
    );

    let cfg = config(vec![hard(
        Signal::NodeFsInodesFree,
        ThresholdValue::Quantity(parsed("40k")),
    )]);
    let mut p = pod("files");
    p.usage.inodes = Some(5);
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &observe(&[(Signal::NodeFsInodesFree, 30_000, 1_000_000)]),
        &[p],
        at(0),
        &SyncOptions::default(),
    );
    assert_eq!(
        d.evictions[0].message,
        "The node was low on resource: inodes. Threshold quantity: 40k, available: 30k. "
    );
}

#[test]
fn a_pod_without_stats_gets_a_bare_message_and_no_annotations() {
    let cfg = config(vec![hard(
        Signal::NodeFsAvailable,
        ThresholdValue::Percentage(0.10),
    )]);
    let obs = observe(&[(Signal::NodeFsAvailable, 5 * GI, 100 * GI)]);
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &obs,
        &[pod("blind")],
        at(0),
        &SyncOptions::default(),
    );
    let order = &d.evictions[0];
    assert_eq!(
        order.message,
        "The node was low on resource: ephemeral-storage. \
         Threshold quantity: 10737418400, available: 5Gi. "
    );
    assert!(order.annotations.is_empty());
}

#[test]
fn soft_threshold_raises_the_condition_at_once_but_evicts_only_after_grace() {
    let cfg = EvictionConfig {
        max_pod_grace_period_seconds: 60,
        ..config(vec![soft(Signal::MemoryAvailable, quantity(GI), 90)])
    };
    let pods = [mem_pod("a", 500 * MI, None, 0)];
    let cycles: Vec<_> = [0, 60, 89, 90]
        .iter()
        .map(|&s| (at(s), memory(500 * MI)))
        .collect();
    let ds = run(&cfg, &cycles, &pods, &SyncOptions::default());
    for d in &ds[..3] {
        assert_eq!(d.conditions, conditions(&[NodeCondition::MemoryPressure]));
        assert!(d.thresholds_met.is_empty() && d.evictions.is_empty());
    }
    assert_eq!(ds[3].thresholds_met.len(), 1);
    assert_eq!(evicted(&ds[3]), ["default/a"]);
    assert_eq!(ds[3].evictions[0].grace_period_seconds, 60);
}

/// The eviction manager's override is `min(evictionMaxPodGracePeriod, the pod's
/// terminationGracePeriodSeconds)`; the pod worker (`calculateEffectiveGracePeriod`)
/// then takes a 0 as "no value" and uses the pod's own grace period, and raises
/// anything below 1 to 1. So the default maximum of 0 lets the pod use its own grace
/// period, a negative one stops it in 1 s, and the result is never 0, which the API
/// server would take as a forced delete.
#[test]
fn soft_grace_is_the_minimum_of_max_pod_grace_and_the_pods_own_as_the_pod_worker_applies_it() {
    let soft_now = soft(Signal::MemoryAvailable, quantity(GI), 1);
    for (max, pod_grace, expected) in [
        (60, Some(30), 30),
        (60, Some(120), 60),
        (60, None, 60),
        (0, Some(30), 30),
        (0, None, 1),
        (-1, Some(30), 1),
        (-1, None, 1),
        (60, Some(0), 1),
        (60, Some(-7), 1),
    ] {
        let cfg = EvictionConfig {
            max_pod_grace_period_seconds: max,
            ..config(vec![soft_now.clone()])
        };
        let mut p = mem_pod("a", 500 * MI, None, 0);
        p.termination_grace_period_seconds = pod_grace;
        let ds = run(
            &cfg,
            &[(at(0), memory(0)), (at(1), memory(0))],
            &[p],
            &SyncOptions::default(),
        );
        assert_eq!(
            ds[1].evictions[0].grace_period_seconds, expected,
            "max {max} pod {pod_grace:?}"
        );
    }
}

#[test]
fn hard_grace_ignores_both_max_and_pod_grace() {
    let cfg = EvictionConfig {
        max_pod_grace_period_seconds: 60,
        ..config(vec![hard(Signal::MemoryAvailable, quantity(GI))])
    };
    let mut p = mem_pod("a", 500 * MI, None, 0);
    p.termination_grace_period_seconds = Some(30);
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &memory(0),
        &[p],
        at(0),
        &SyncOptions::default(),
    );
    assert_eq!(d.evictions[0].grace_period_seconds, 1);
}

#[test]
fn one_clean_observation_resets_the_grace_timer() {
    let cfg = config(vec![soft(Signal::MemoryAvailable, quantity(GI), 60)]);
    let pods = [mem_pod("a", 500 * MI, None, 0)];
    let low = memory(500 * MI);
    let clean = memory(2 * GI);
    let cycles = [
        (at(0), low.clone()),
        (at(50), clean),
        (at(60), low.clone()),
        (at(110), low.clone()),
        (at(120), low),
    ];
    let ds = run(&cfg, &cycles, &pods, &SyncOptions::default());
    assert!(ds[1].state.thresholds_first_observed_at.is_empty());
    assert_eq!(
        ds[2].state.thresholds_first_observed_at[0].first_observed_at,
        at(60)
    );
    assert!(ds[3].evictions.is_empty(), "grace restarts at 60s");
    assert_eq!(evicted(&ds[4]), ["default/a"]);
}

// ---- node conditions ---------------------------------------------------------------

#[test]
fn conditions_turn_off_only_after_the_transition_period_without_pressure() {
    let cfg = config(vec![hard(Signal::MemoryAvailable, quantity(GI))]);
    let cycles = [
        (at(0), memory(500 * MI)),
        (at(10), memory(2 * GI)),
        (at(299), memory(2 * GI)),
        (at(300), memory(2 * GI)),
    ];
    let ds = run(&cfg, &cycles, &[], &SyncOptions::default());
    let pressure = conditions(&[NodeCondition::MemoryPressure]);
    assert_eq!(ds[0].conditions, pressure);
    assert_eq!(ds[1].conditions, pressure);
    assert!(ds[1].thresholds_met.is_empty());
    assert_eq!(ds[2].conditions, pressure);
    assert!(ds[3].conditions.is_empty());
}

#[test]
fn renewed_pressure_restarts_the_transition_period() {
    let cfg = config(vec![hard(Signal::NodeFsInodesFree, quantity(1000))]);
    let inodes = |free| observe(&[(Signal::NodeFsInodesFree, free, 100_000)]);
    let cycles = [
        (at(0), inodes(10)),
        (at(200), inodes(10)),
        (at(400), inodes(50_000)),
        (at(499), inodes(50_000)),
        (at(500), inodes(50_000)),
    ];
    let ds = run(&cfg, &cycles, &[], &SyncOptions::default());
    let disk = conditions(&[NodeCondition::DiskPressure]);
    assert_eq!(ds[2].conditions, disk);
    assert_eq!(ds[3].conditions, disk);
    assert!(ds[4].conditions.is_empty());
}

#[test]
fn a_zero_transition_period_reports_no_conditions_like_the_kubelet() {
    let cfg = EvictionConfig {
        pressure_transition_period: GoDuration::ZERO,
        ..config(vec![hard(Signal::MemoryAvailable, quantity(GI))])
    };
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &memory(0),
        &[],
        at(0),
        &SyncOptions::default(),
    );
    assert!(d.conditions.is_empty());
    assert_eq!(d.thresholds_met.len(), 1);
}

#[test]
fn each_signal_maps_to_its_condition() {
    let cfg = config(vec![
        hard(Signal::PidAvailable, quantity(1000)),
        hard(Signal::ImageFsAvailable, quantity(GI)),
    ]);
    let obs = observe(&[
        (Signal::PidAvailable, 10, 32768),
        (Signal::ImageFsAvailable, 0, 10 * GI),
    ]);
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &obs,
        &[],
        at(0),
        &SyncOptions::default(),
    );
    assert_eq!(
        d.conditions,
        conditions(&[NodeCondition::DiskPressure, NodeCondition::PidPressure])
    );
}

// ---- min-reclaim --------------------------------------------------------------------

#[test]
fn min_reclaim_holds_a_threshold_that_passed_grace_until_enough_is_freed() {
    let threshold = Threshold {
        min_reclaim: Some(quantity(500 * MI)),
        ..hard(Signal::MemoryAvailable, quantity(GI))
    };
    let cfg = config(vec![threshold]);
    let pods = [mem_pod("a", 500 * MI, None, 0)];
    let cycles = [
        (at(0), memory(900 * MI)),
        (at(10), memory(GI + 100 * MI)), // above 1Gi but below 1.5Gi: still met
        (at(20), memory(GI + 499 * MI)),
        (at(30), memory(GI + 500 * MI)), // exactly 1.5Gi: cleared
        (at(40), memory(GI + 100 * MI)), // not held any more: plain threshold not met
    ];
    let ds = run(&cfg, &cycles, &pods, &SyncOptions::default());
    for d in &ds[..3] {
        assert_eq!(d.thresholds_met.len(), 1);
        assert_eq!(evicted(d), ["default/a"]);
    }
    assert!(ds[3].thresholds_met.is_empty() && ds[3].evictions.is_empty());
    assert!(ds[4].thresholds_met.is_empty() && ds[4].evictions.is_empty());
}

#[test]
fn min_reclaim_as_a_percentage_is_taken_against_capacity() {
    let threshold = Threshold {
        min_reclaim: Some(ThresholdValue::Percentage(0.05)),
        ..hard(Signal::NodeFsAvailable, ThresholdValue::Percentage(0.10))
    };
    let cfg = config(vec![threshold]);
    let fs = |available| observe(&[(Signal::NodeFsAvailable, available, 100 * GI)]);
    let ds = run(
        &cfg,
        &[
            (at(0), fs(9 * GI)),
            (at(10), fs(14 * GI)),
            (at(20), fs(16 * GI)),
        ],
        &[],
        &SyncOptions::default(),
    );
    assert_eq!(ds[1].thresholds_met.len(), 1, "14Gi < 10% + 5% of 100Gi");
    assert!(ds[2].thresholds_met.is_empty());
}

#[test]
fn min_reclaim_does_not_hold_a_soft_threshold_still_in_its_grace_period() {
    let threshold = Threshold {
        min_reclaim: Some(quantity(GI)),
        ..soft(Signal::MemoryAvailable, quantity(GI), 60)
    };
    let cfg = config(vec![threshold]);
    let ds = run(
        &cfg,
        &[(at(0), memory(900 * MI)), (at(10), memory(GI + MI))],
        &[],
        &SyncOptions::default(),
    );
    assert!(ds[1].state.thresholds_first_observed_at.is_empty());
}

// ---- stale stats ---------------------------------------------------------------------

#[test]
fn stale_stats_are_not_acted_on_twice() {
    let cfg = config(vec![hard(Signal::MemoryAvailable, quantity(GI))]);
    let pods = [mem_pod("a", 500 * MI, None, 0)];
    let sampled = |ms| {
        let mut obs = memory(500 * MI);
        if let Some(o) = obs.get_mut(&Signal::MemoryAvailable) {
            o.sampled_at_ms = ms;
        }
        obs
    };
    let cycles = [
        (at(0), sampled(Some(1_000))),
        (at(1), sampled(Some(1_000))),
        (at(2), sampled(Some(2_000))),
        (at(3), sampled(None)),
        (at(4), sampled(None)),
    ];
    let ds = run(&cfg, &cycles, &pods, &SyncOptions::default());
    assert_eq!(evicted(&ds[0]), ["default/a"]);
    assert!(
        ds[1].evictions.is_empty(),
        "same sample as the previous cycle"
    );
    assert_eq!(
        ds[1].thresholds_met.len(),
        1,
        "the threshold is still reported"
    );
    assert_eq!(
        ds[1].conditions,
        conditions(&[NodeCondition::MemoryPressure])
    );
    assert_eq!(evicted(&ds[2]), ["default/a"]);
    assert_eq!(
        evicted(&ds[3]),
        ["default/a"],
        "no timestamp is always fresh"
    );
    assert_eq!(evicted(&ds[4]), ["default/a"]);
}

// ---- selection -----------------------------------------------------------------------

#[test]
fn at_most_one_pod_is_evicted_per_cycle_for_a_threshold() {
    let cfg = config(vec![hard(Signal::MemoryAvailable, quantity(GI))]);
    let pods: Vec<Pod> = (0..5)
        .map(|i| mem_pod(&format!("p{i}"), GI, None, 0))
        .collect();
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &memory(0),
        &pods,
        at(0),
        &SyncOptions::default(),
    );
    assert_eq!(d.evictions.len(), 1);
}

#[test]
fn memory_signals_are_handled_before_disk_and_pids() {
    let cfg = config(vec![
        hard(Signal::NodeFsAvailable, quantity(GI)),
        hard(Signal::PidAvailable, quantity(100)),
        hard(Signal::MemoryAvailable, quantity(GI)),
    ]);
    let obs = observe(&[
        (Signal::NodeFsAvailable, 0, 100 * GI),
        (Signal::PidAvailable, 0, 32768),
        (Signal::MemoryAvailable, 0, 10 * GI),
    ]);
    let mut disk_hog = pod("disk-hog");
    disk_hog.usage = PodUsage {
        memory: Some(MI),
        ephemeral_storage: Some(50 * GI),
        ..PodUsage::default()
    };
    let mut mem_hog = pod("mem-hog");
    mem_hog.usage = PodUsage {
        memory: Some(5 * GI),
        ephemeral_storage: Some(1),
        ..PodUsage::default()
    };
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &obs,
        &[disk_hog, mem_hog],
        at(0),
        &SyncOptions::default(),
    );
    assert_eq!(d.starved.map(|s| s.signal), Some(Signal::MemoryAvailable));
    assert_eq!(evicted(&d), ["default/mem-hog"]);
    assert_eq!(d.evictions[0].reason.label(), "memory.available");
}

#[test]
fn critical_pods_are_never_evicted_the_next_pod_is() {
    let cfg = config(vec![hard(Signal::MemoryAvailable, quantity(GI))]);
    let mut static_pod = mem_pod("static", 9 * GI, None, 0);
    static_pod.critical = true;
    let system = mem_pod("system", 8 * GI, None, 2_000_000_000);
    let node_critical = mem_pod("node-critical", 7 * GI, None, 2_000_001_000);
    let ordinary = mem_pod("ordinary", MI, Some(0), 0);
    let all = [static_pod, system, node_critical, ordinary];
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &memory(0),
        &all,
        at(0),
        &SyncOptions::default(),
    );
    assert_eq!(evicted(&d), ["default/ordinary"]);
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &memory(0),
        &all[..3],
        at(0),
        &SyncOptions::default(),
    );
    assert!(d.evictions.is_empty());
    assert_eq!(d.conditions, conditions(&[NodeCondition::MemoryPressure]));
}

// ---- local storage -------------------------------------------------------------------

fn storage_pod(name: &str) -> Pod {
    let mut p = pod(name);
    p.usage.ephemeral_storage = Some(0);
    p
}

#[test]
fn every_local_storage_offender_is_evicted_in_one_cycle_with_the_kubelet_messages() {
    let mut empty_dir = storage_pod("empty-dir");
    empty_dir.empty_dirs = vec![
        EmptyDirStats {
            name: "ok".into(),
            size_limit: Some(Quantity::from_value(GI)),
            used: Some(MI),
            memory_backed: false,
        },
        EmptyDirStats {
            name: "cache".into(),
            size_limit: Some(Quantity::parse("100Mi").unwrap()),
            used: Some(101 * MI),
            memory_backed: false,
        },
    ];
    let mut pod_limit = storage_pod("pod-limit");
    pod_limit.limits.ephemeral_storage = Some(GI);
    pod_limit.usage.ephemeral_storage = Some(GI + 1);
    let mut container_limit = storage_pod("container-limit");
    container_limit.containers = vec![ContainerStats {
        name: "writer".into(),
        limits: ResourceAmounts {
            ephemeral_storage: Some(500 * MI),
            ..ResourceAmounts::default()
        },
        usage: ContainerUsage {
            rootfs: Some(400 * MI),
            logs: Some(200 * MI),
            ..ContainerUsage::default()
        },
        ..ContainerStats::default()
    }];
    container_limit.limits.ephemeral_storage = Some(2 * GI);
    let mut at_limit = storage_pod("at-limit");
    at_limit.limits.ephemeral_storage = Some(GI);
    at_limit.usage.ephemeral_storage = Some(GI);
    let mut critical = storage_pod("critical");
    critical.critical = true;
    critical.limits.ephemeral_storage = Some(1);
    critical.usage.ephemeral_storage = Some(GI);
    let mut no_stats = pod("no-stats");
    no_stats.limits.ephemeral_storage = Some(1);

    let cfg = config(vec![hard(Signal::MemoryAvailable, quantity(GI))]);
    let pods = [
        empty_dir,
        pod_limit,
        container_limit,
        at_limit,
        critical,
        no_stats,
    ];
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &memory(0),
        &pods,
        at(0),
        &SyncOptions::default(),
    );
    // Local-storage evictions pre-empt the memory threshold for this cycle.
    let summary: Vec<_> = d
        .evictions
        .iter()
        .map(|o| {
            (
                o.name.as_str(),
                o.reason.label(),
                o.grace_period_seconds,
                o.disruption_target,
                o.message.as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "empty-dir",
                "emptydirfs.limit",
                1,
                false,
                "Usage of EmptyDir volume \"cache\" exceeds the limit \"100Mi\". "
            ),
            (
                "pod-limit",
                "ephemeralpodfs.limit",
                1,
                false,
                "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi. "
            ),
            (
                "container-limit",
                "ephemeralcontainerfs.limit",
                1,
                false,
                "Container writer exceeded its local ephemeral storage limit \"500Mi\". "
            ),
        ]
    );
    assert!(d.evictions.iter().all(|o| o.annotations.is_empty()));
    assert_eq!(d.conditions, conditions(&[NodeCondition::MemoryPressure]));
}

/// A container with an ephemeral-storage limit written as `limit` and the given use of
/// its writable layer and logs.
fn storage_container(name: &str, kind: ContainerKind, limit: &str, used: i64) -> ContainerStats {
    let limit = Quantity::parse(limit).unwrap();
    ContainerStats {
        name: name.into(),
        kind,
        limits: ResourceAmounts {
            ephemeral_storage: Some(limit.value()),
            formats: AmountFormats {
                ephemeral_storage: limit.format(),
                ..AmountFormats::default()
            },
            ..ResourceAmounts::default()
        },
        usage: ContainerUsage {
            rootfs: Some(used),
            logs: Some(0),
            ..ContainerUsage::default()
        },
        ..ContainerStats::default()
    }
}

fn local_storage_summary(pods: &[Pod]) -> Vec<(String, String)> {
    let d = synchronize(
        &config(vec![]),
        &EvictionState::default(),
        &Observations::new(),
        pods,
        at(0),
        &SyncOptions::default(),
    );
    d.evictions
        .iter()
        .map(|o| (o.name.clone(), o.message.clone()))
        .collect()
}

#[test]
fn only_regular_containers_are_held_to_their_own_storage_limit() {
    // `containerEphemeralStorageLimitEviction` builds its limits from
    // `pod.Spec.Containers` alone: an init container or a sidecar over its own limit is
    // not evicted for it, though its limit counts in the pod's total (`PodLimits`).
    let mut sidecar = storage_pod("sidecar");
    sidecar.containers = vec![
        storage_container("log-shipper", ContainerKind::Sidecar, "100Mi", 200 * MI),
        storage_container("app", ContainerKind::Regular, "1Gi", MI),
    ];
    sidecar.usage.ephemeral_storage = Some(201 * MI);
    let mut init = storage_pod("init");
    init.containers = vec![
        storage_container("unpack", ContainerKind::Init, "100Mi", 200 * MI),
        storage_container("app", ContainerKind::Regular, "1Gi", MI),
    ];
    init.usage.ephemeral_storage = Some(201 * MI);
    let mut regular = storage_pod("regular");
    regular.containers = vec![storage_container(
        "app",
        ContainerKind::Regular,
        "100Mi",
        200 * MI,
    )];
    regular.usage.ephemeral_storage = Some(200 * MI);
    // The pod's own total is not what is tested here.
    regular.limits.ephemeral_storage = Some(2 * GI);
    assert_eq!(
        local_storage_summary(&[sidecar, init, regular]),
        [(
            "regular".to_string(),
            "Container app exceeded its local ephemeral storage limit \"100Mi\". ".to_string()
        )]
    );
}

#[test]
fn the_pod_storage_limit_adds_up_containers_as_pod_limits_does() {
    // `PodLimits`: regular containers and sidecars add up; an init container counts with
    // the sidecars started before it, and the larger of that and the sum wins. The sum
    // prints in the first figure's format (`Quantity.Add`).
    let mut summed = storage_pod("summed");
    summed.containers = vec![
        storage_container("proxy", ContainerKind::Sidecar, "500M", 0),
        storage_container("app", ContainerKind::Regular, "1G", 0),
    ];
    summed.usage.ephemeral_storage = Some(1_500_000_001);
    let mut init_peak = storage_pod("init-peak");
    init_peak.containers = vec![
        storage_container("proxy", ContainerKind::Sidecar, "1Gi", 0),
        storage_container("restore", ContainerKind::Init, "2Gi", 0),
        storage_container("app", ContainerKind::Regular, "1Gi", 0),
    ];
    // The restore step ran beside the proxy: 3Gi, more than 2Gi for proxy and app.
    init_peak.usage.ephemeral_storage = Some(3 * GI);
    let mut over_peak = init_peak.clone();
    over_peak.name = "over-peak".into();
    over_peak.usage.ephemeral_storage = Some(3 * GI + 1);
    assert_eq!(
        local_storage_summary(&[summed, init_peak, over_peak]),
        [
            (
                "summed".to_string(),
                "Pod ephemeral local storage usage exceeds the total limit of containers 1500M. "
                    .to_string()
            ),
            (
                "over-peak".to_string(),
                "Pod ephemeral local storage usage exceeds the total limit of containers 3Gi. "
                    .to_string()
            ),
        ]
    );
}

#[test]
fn a_dedicated_image_filesystem_leaves_the_writable_layer_out_of_container_usage() {
    let mut p = storage_pod("writer");
    p.containers = vec![ContainerStats {
        name: "w".into(),
        limits: ResourceAmounts {
            ephemeral_storage: Some(500 * MI),
            ..ResourceAmounts::default()
        },
        usage: ContainerUsage {
            rootfs: Some(400 * MI),
            logs: Some(200 * MI),
            ..ContainerUsage::default()
        },
        ..ContainerStats::default()
    }];
    p.limits.ephemeral_storage = Some(2 * GI);
    let cfg = config(vec![]);
    let obs = Observations::new();
    let single = synchronize(
        &cfg,
        &EvictionState::default(),
        &obs,
        std::slice::from_ref(&p),
        at(0),
        &SyncOptions::default(),
    );
    assert_eq!(single.evictions.len(), 1);
    let image_fs = SyncOptions {
        fs_layout: FilesystemLayout::ImageFs,
        ..SyncOptions::default()
    };
    let split = synchronize(
        &cfg,
        &EvictionState::default(),
        &obs,
        &[p],
        at(0),
        &image_fs,
    );
    assert!(split.evictions.is_empty());
}

#[test]
fn the_pod_limit_falls_back_to_the_sum_of_container_limits() {
    let mut p = storage_pod("summed");
    p.usage.ephemeral_storage = Some(3 * GI);
    p.containers = ["a", "b"]
        .iter()
        .map(|name| ContainerStats {
            name: (*name).into(),
            limits: ResourceAmounts {
                ephemeral_storage: Some(GI),
                ..ResourceAmounts::default()
            },
            ..ContainerStats::default()
        })
        .collect();
    let d = synchronize(
        &config(vec![]),
        &EvictionState::default(),
        &Observations::new(),
        &[p],
        at(0),
        &SyncOptions::default(),
    );
    assert_eq!(
        d.evictions[0].message,
        "Pod ephemeral local storage usage exceeds the total limit of containers 2Gi. "
    );
}

#[test]
fn local_storage_limits_are_ignored_without_capacity_isolation() {
    let mut p = storage_pod("big");
    p.limits.ephemeral_storage = Some(1);
    p.usage.ephemeral_storage = Some(GI);
    let cfg = EvictionConfig {
        local_storage_capacity_isolation: false,
        ..config(vec![hard(Signal::MemoryAvailable, quantity(GI))])
    };
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &memory(2 * GI),
        &[p],
        at(0),
        &SyncOptions::default(),
    );
    assert!(d.evictions.is_empty());
}

// ---- node-level reclaim ---------------------------------------------------------------

#[test]
fn disk_pressure_requests_node_reclaim_only_when_a_reclaimer_is_configured() {
    let cfg = config(vec![hard(Signal::NodeFsAvailable, quantity(10 * GI))]);
    let obs = observe(&[(Signal::NodeFsAvailable, 5 * GI, 100 * GI)]);
    let mut p = pod("a");
    p.usage.ephemeral_storage = Some(GI);
    let pods = [p];
    let without = synchronize(
        &cfg,
        &EvictionState::default(),
        &obs,
        &pods,
        at(0),
        &SyncOptions::default(),
    );
    assert_eq!(without.reclaim_requested, None);
    assert_eq!(evicted(&without), ["default/a"]);
    let with = SyncOptions {
        node_reclaimer_configured: true,
        ..SyncOptions::default()
    };
    let d = synchronize(&cfg, &EvictionState::default(), &obs, &pods, at(0), &with);
    assert_eq!(d.reclaim_requested, Some(Signal::NodeFsAvailable));
    assert_eq!(
        evicted(&d),
        ["default/a"],
        "the fallback if reclaim is not enough"
    );
    let image_fs = SyncOptions {
        fs_layout: FilesystemLayout::ImageFs,
        node_reclaimer_configured: true,
    };
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &obs,
        &pods,
        at(0),
        &image_fs,
    );
    assert_eq!(
        d.reclaim_requested, None,
        "nothing reclaimable lives on nodefs"
    );
}

#[test]
fn memory_pressure_never_requests_node_reclaim() {
    let cfg = config(vec![hard(Signal::MemoryAvailable, quantity(GI))]);
    let with = SyncOptions {
        node_reclaimer_configured: true,
        ..SyncOptions::default()
    };
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &memory(0),
        &[],
        at(0),
        &with,
    );
    assert_eq!(d.reclaim_requested, None);
    assert_eq!(d.starved.map(|s| s.signal), Some(Signal::MemoryAvailable));
}

#[test]
fn the_post_reclaim_check_uses_min_reclaim_and_every_threshold() {
    let cfg = config(vec![
        Threshold {
            min_reclaim: Some(quantity(5 * GI)),
            ..hard(Signal::NodeFsAvailable, quantity(10 * GI))
        },
        soft(Signal::MemoryAvailable, quantity(GI), 600),
    ]);
    let check = |fs, mem| {
        let obs = observe(&[
            (Signal::NodeFsAvailable, fs, 100 * GI),
            (Signal::MemoryAvailable, mem, 10 * GI),
        ]);
        pressure_remains_after_reclaim(&cfg, &obs)
    };
    assert!(check(12 * GI, 5 * GI), "12Gi free is below 10Gi + 5Gi");
    assert!(!check(15 * GI, 5 * GI));
    assert!(
        check(15 * GI, 0),
        "a soft memory threshold counts, without its grace period"
    );
}

/// `evictionMinimumReclaim: NaN%` passes the kubelet's parser, and `GetThresholdQuantity`
/// turns it into int64(NaN), the smallest int64 on amd64. `thresholdsMet` with
/// `enforceMinReclaim` then never finds the threshold met: after node-level reclaim the
/// node counts as relieved however little is free, and a crossed threshold is not held.
#[test]
fn a_nan_minimum_reclaim_counts_as_relieved_wherever_minimum_reclaim_is_checked() {
    let cfg = config(vec![Threshold {
        min_reclaim: Some(ThresholdValue::Percentage(f32::NAN)),
        ..hard(Signal::NodeFsAvailable, quantity(10 * GI))
    }]);
    let nearly_full = observe(&[(Signal::NodeFsAvailable, GI, 100 * GI)]);
    assert!(!pressure_remains_after_reclaim(&cfg, &nearly_full));
    // The threshold itself is still crossed without minimum reclaim.
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &nearly_full,
        &[pod("a")],
        at(0),
        &SyncOptions::default(),
    );
    assert_eq!(d.thresholds_met.len(), 1);
}

// ---- ranking ---------------------------------------------------------------------------

#[test]
fn memory_rank_exceeds_request_then_priority_then_usage_above_request() {
    let pods = [
        mem_pod("under-low-prio", 50 * MI, Some(100 * MI), -10),
        mem_pod("over-high-prio", 200 * MI, Some(100 * MI), 1000),
        mem_pod("over-small", 120 * MI, Some(100 * MI), 0),
        mem_pod("over-big", 900 * MI, Some(800 * MI), 0), // 100Mi above request
        mem_pod("best-effort", 150 * MI, None, 0),        // 150Mi above request 0
        mem_pod("over-low-prio", 101 * MI, Some(100 * MI), -5),
        Pod {
            priority: 5000,
            ..pod("no-stats")
        },
    ];
    assert_eq!(
        names(rank(
            Signal::MemoryAvailable,
            FilesystemLayout::SingleDisk,
            &pods
        )),
        [
            "no-stats",
            "over-low-prio",
            "best-effort",
            "over-big",
            "over-small",
            "over-high-prio",
            "under-low-prio"
        ]
    );
    assert_eq!(
        names(rank(
            Signal::AllocatableMemoryAvailable,
            FilesystemLayout::SingleDisk,
            &pods
        )),
        names(rank(
            Signal::MemoryAvailable,
            FilesystemLayout::SingleDisk,
            &pods
        ))
    );
}

#[test]
fn pid_rank_is_priority_first_then_process_count() {
    let pids = |name: &str, priority, count: Option<i64>| Pod {
        priority,
        usage: PodUsage {
            pids: count,
            ..PodUsage::default()
        },
        ..pod(name)
    };
    let pods = [
        pids("busy-high", 100, Some(5000)),
        pids("few-low", 0, Some(3)),
        pids("many-low", 0, Some(300)),
        pids("no-stats-high", 100, None),
        pids("no-stats-low", 0, None),
    ];
    assert_eq!(
        names(rank(
            Signal::PidAvailable,
            FilesystemLayout::SingleDisk,
            &pods
        )),
        [
            "no-stats-low",
            "many-low",
            "few-low",
            "no-stats-high",
            "busy-high"
        ]
    );
}

#[test]
fn disk_rank_exceeds_request_then_priority_then_usage_above_request() {
    let disk = |name: &str, priority, usage: Option<i64>, request: Option<i64>| Pod {
        priority,
        requests: ResourceAmounts {
            ephemeral_storage: request,
            ..ResourceAmounts::default()
        },
        usage: PodUsage {
            ephemeral_storage: usage,
            ..PodUsage::default()
        },
        ..pod(name)
    };
    let pods = [
        disk("under", -100, Some(GI), Some(2 * GI)),
        disk("over-high", 10, Some(3 * GI), Some(GI)),
        disk("over-lots", 0, Some(10 * GI), Some(8 * GI)), // 2Gi above
        disk("over-more", 0, Some(4 * GI), None),          // 4Gi above
        disk("blind", 10, None, None),
    ];
    let order = ["blind", "over-more", "over-lots", "over-high", "under"];
    for signal in [
        Signal::NodeFsAvailable,
        Signal::ImageFsAvailable,
        Signal::ContainerFsAvailable,
    ] {
        assert_eq!(
            names(rank(signal, FilesystemLayout::SingleDisk, &pods)),
            order,
            "{signal}"
        );
    }
}

#[test]
fn inode_rank_is_priority_first_and_subtracts_the_storage_request() {
    let inodes = |name: &str, priority, used: Option<i64>, storage_request: Option<i64>| Pod {
        priority,
        requests: ResourceAmounts {
            ephemeral_storage: storage_request,
            ..ResourceAmounts::default()
        },
        usage: PodUsage {
            inodes: used,
            ..PodUsage::default()
        },
        ..pod(name)
    };
    let pods = [
        inodes("high", 10, Some(1_000_000), None),
        // 5000 inodes minus a 10000-byte request ranks below 1000 inodes: the quirk.
        inodes("quirk", 0, Some(5000), Some(10_000)),
        inodes("plain", 0, Some(1000), None),
        inodes("none-used", -1, Some(0), None),
        inodes("blind", 10, None, None),
    ];
    assert_eq!(
        names(rank(
            Signal::NodeFsInodesFree,
            FilesystemLayout::SingleDisk,
            &pods
        )),
        ["blind", "plain", "quirk", "high", "none-used"]
    );
}

/// A pod's storage by part: `gib` GiB and 1000 inodes per GiB in each part.
fn stored(name: &str, layers: i64, logs: i64, volumes: i64) -> Pod {
    let part = |gib: i64| {
        Some(DiskAmount {
            bytes: gib * GI,
            inodes: gib * 1000,
        })
    };
    Pod {
        usage: PodUsage {
            storage: StorageUsage {
                writable_layers: part(layers),
                logs: part(logs),
                local_volumes: part(volumes),
            },
            ..PodUsage::default()
        },
        ..pod(name)
    }
}

/// The kubelet's `buildSignalToRankFunc`: each disk signal ranks with
/// `rankDiskPressureFunc` over the stats of its own filesystem. One filesystem: root,
/// logs and local volumes for every signal. imagefs holding the writable layers
/// (`withImageFs && !imageContainerSplitFs`): nodefs.* counts logs and local volumes,
/// imagefs.* the root (writable layer), containerfs.* the same as imagefs.*. Split
/// (`withImageFs && imageContainerSplitFs`): nodefs.* counts all three, containerfs.*
/// the same as nodefs.*, imagefs.* only images, which no pod is charged for.
#[test]
fn each_disk_signal_ranks_the_storage_on_its_own_filesystem() {
    use FilesystemLayout::{ImageFs, SingleDisk, SplitImageFs};
    let mut layers = stored("layers", 10, 0, 0);
    layers.requests.ephemeral_storage = Some(GI);
    let pods = [layers, stored("logs", 0, 6, 0), stored("volume", 0, 0, 8)];
    // Bytes and inodes order alike except where everything counts: there the inode
    // chain subtracts the 1Gi *byte* request from `layers`' 10,000 inodes (the kubelet's
    // quirk), which puts it last.
    let everything = (["layers", "volume", "logs"], ["volume", "logs", "layers"]);
    // `layers` uses nothing here, which does not exceed its request.
    let node_only = ["volume", "logs", "layers"];
    // Only `layers` uses any; the other two tie at 0 and go by name.
    let layers_only = ["layers", "logs", "volume"];
    // Nobody uses any: 0 minus the request puts the pod with a request last.
    let nothing = ["logs", "volume", "layers"];
    let same = |order| (order, order);
    let cases = [
        (SingleDisk, Signal::NodeFsAvailable, everything),
        (SingleDisk, Signal::ImageFsAvailable, everything),
        (SingleDisk, Signal::ContainerFsAvailable, everything),
        (ImageFs, Signal::NodeFsAvailable, same(node_only)),
        (ImageFs, Signal::ImageFsAvailable, same(layers_only)),
        (ImageFs, Signal::ContainerFsAvailable, same(layers_only)),
        (SplitImageFs, Signal::NodeFsAvailable, everything),
        (SplitImageFs, Signal::ContainerFsAvailable, everything),
        (SplitImageFs, Signal::ImageFsAvailable, same(nothing)),
    ];
    for (layout, signal, (bytes, inodes_order)) in cases {
        assert_eq!(
            names(rank(signal, layout, &pods)),
            bytes,
            "{layout:?} {signal}"
        );
        let inodes = match signal {
            Signal::NodeFsAvailable => Signal::NodeFsInodesFree,
            Signal::ImageFsAvailable => Signal::ImageFsInodesFree,
            _ => Signal::ContainerFsInodesFree,
        };
        assert_eq!(
            names(rank(inodes, layout, &pods)),
            inodes_order,
            "{layout:?} {inodes}"
        );
    }
}

/// On a split image filesystem `imagefs.*` charges no pod anything (`fsStatsImages` only),
/// so `exceedDiskRequests` is false for all, `priority` decides, and `disk` puts the
/// smaller ephemeral-storage request first (0 minus the request).
#[test]
fn on_a_split_layout_imagefs_orders_by_priority_then_storage_request_alone() {
    let with = |mut pod: Pod, priority, request| {
        pod.priority = priority;
        pod.requests.ephemeral_storage = Some(request);
        pod
    };
    let pods = [
        with(stored("huge-layer", 50, 0, 0), 0, GI),
        with(stored("small-request", 0, 0, 0), 0, 100 * MI),
        with(stored("low-priority", 0, 0, 0), -5, 5 * GI),
    ];
    let layout = FilesystemLayout::SplitImageFs;
    assert_eq!(
        names(rank(Signal::ImageFsAvailable, layout, &pods)),
        ["low-priority", "small-request", "huge-layer"]
    );
    assert_eq!(
        names(rank(Signal::NodeFsAvailable, layout, &pods)),
        ["huge-layer", "low-priority", "small-request"],
        "nodefs holds the writable layers here"
    );
}

/// `memoryUsage`, `diskUsage`, `inodeUsage` (helpers.go) return 0 for a nil figure, and
/// `process` counts a nil `ProcessStats` as 0; only a pod missing from the stats summary
/// (`!found`) goes first in each comparator.
#[test]
fn a_pod_with_stats_but_without_the_ranked_figure_counts_it_as_zero() {
    let pids_only = Pod {
        usage: PodUsage {
            pids: Some(3),
            ..PodUsage::default()
        },
        ..pod("pids-only")
    };
    let pods = [
        pids_only,
        mem_pod("small-memory", 10 * MI, None, 0),
        pod("no-stats"),
    ];
    let layout = FilesystemLayout::SingleDisk;
    assert_eq!(
        names(rank(Signal::MemoryAvailable, layout, &pods)),
        ["no-stats", "small-memory", "pids-only"],
        "10Mi exceeds a request of 0; a missing figure of 0 does not"
    );
    assert_eq!(
        names(rank(Signal::PidAvailable, layout, &pods)),
        ["no-stats", "pids-only", "small-memory"]
    );
    // A pod with stats but no storage figure uses 0 bytes and 0 inodes: below a pod
    // that uses some, which exceeds its request of 0.
    let small_disk = Pod {
        usage: PodUsage {
            ephemeral_storage: Some(MI),
            inodes: Some(10),
            ..PodUsage::default()
        },
        ..pod("small-disk")
    };
    let pods = [pods[0].clone(), small_disk, pod("no-stats")];
    for signal in [Signal::NodeFsAvailable, Signal::NodeFsInodesFree] {
        assert_eq!(
            names(rank(signal, layout, &pods)),
            ["no-stats", "small-disk", "pids-only"],
            "{signal}"
        );
    }
}

/// Whatever the signal, a pod the stats summary does not know ranks ahead of every pod
/// it knows, even one of lower priority, except for PIDs where priority comes first.
/// A pod whose containers are listed without usage has no stats.
#[test]
fn a_pod_without_stats_goes_first_except_before_lower_priority_for_pids() {
    let unmeasured = Pod {
        priority: 100,
        containers: vec![ContainerStats {
            name: "app".into(),
            ..ContainerStats::default()
        }],
        ..pod("unmeasured")
    };
    let measured = Pod {
        priority: -100,
        ..mem_pod("measured", MI, Some(GI), 0)
    };
    let pods = [measured, unmeasured];
    assert!(!pods[1].has_stats(), "listed containers are not stats");
    let found = Pod {
        cgroup: Some("/kubepods/pod1".into()),
        ..pod("found")
    };
    assert!(found.has_stats(), "a pod whose cgroup was found has stats");
    for signal in Signal::ALL {
        let order = names(rank(signal, FilesystemLayout::SingleDisk, &pods));
        let expected = if signal == Signal::PidAvailable {
            ["measured", "unmeasured"]
        } else {
            ["unmeasured", "measured"]
        };
        assert_eq!(order, expected, "{signal}");
    }
}

#[test]
fn ties_are_broken_by_namespace_then_name() {
    let mut pods: Vec<Pod> = ["b/x", "a/z", "a/y", "b/a"]
        .iter()
        .map(|key| {
            let (namespace, name) = key.split_once('/').unwrap_or_default();
            Pod {
                namespace: namespace.into(),
                ..mem_pod(name, MI, None, 0)
            }
        })
        .collect();
    let keys = |pods: &[Pod]| {
        rank(Signal::MemoryAvailable, FilesystemLayout::SingleDisk, pods)
            .iter()
            .map(|p| p.key())
            .collect::<Vec<_>>()
    };
    let forward = keys(&pods);
    pods.reverse();
    assert_eq!(forward, ["a/y", "a/z", "b/a", "b/x"]);
    assert_eq!(keys(&pods), forward);
}

#[test]
fn the_evicted_pod_is_the_first_ranked_non_critical_pod() {
    // `pid.available: "1000"` in the kubelet's file.
    let threshold = ThresholdValue::Quantity(Quantity::parse("1000").unwrap());
    let cfg = config(vec![hard(Signal::PidAvailable, threshold)]);
    let obs = observe(&[(Signal::PidAvailable, 10, 32768)]);
    let pids = |name: &str, priority, count| Pod {
        priority,
        usage: PodUsage {
            pids: Some(count),
            ..PodUsage::default()
        },
        ..pod(name)
    };
    let pods = [pids("fork-bomb", 100, 30_000), pids("quiet", 0, 5)];
    let d = synchronize(
        &cfg,
        &EvictionState::default(),
        &obs,
        &pods,
        at(0),
        &SyncOptions::default(),
    );
    assert_eq!(
        evicted(&d),
        ["default/quiet"],
        "priority decides before process count"
    );
    assert_eq!(
        d.evictions[0].message,
        // `Quantity.String()` of "1000" is its canonical "1k".
        "The node was low on resource: pids. Threshold quantity: 1k, available: 10. "
    );
    assert_eq!(d.evictions[0].annotations["starved_resource"], "pids");
}

#[test]
fn a_hard_threshold_is_acted_on_before_a_soft_one_of_the_same_class() {
    let cfg = EvictionConfig {
        max_pod_grace_period_seconds: 30,
        ..config(vec![
            soft(Signal::MemoryAvailable, quantity(2 * GI), 10),
            hard(Signal::MemoryAvailable, quantity(GI)),
        ])
    };
    let pods = [mem_pod("a", GI, None, 0)];
    let ds = run(
        &cfg,
        &[(at(0), memory(GI / 2)), (at(10), memory(GI / 2))],
        &pods,
        &SyncOptions::default(),
    );
    assert_eq!(ds[1].thresholds_met.len(), 2);
    assert_eq!(ds[1].evictions[0].grace_period_seconds, 1);
}
