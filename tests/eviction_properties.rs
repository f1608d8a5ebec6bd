//! Properties of the eviction order and of the decisions built on it.

use std::cmp::Ordering;

use nodekeeper::config::{
    EvictionConfig, FilesystemLayout, GoDuration, Quantity, Threshold, ThresholdValue,
};
use nodekeeper::eviction::{
    Decision, EvictionState, Millis, SyncOptions, measured_storage, rank, rank_cmp, synchronize,
};
use nodekeeper::pods::{ContainerStats, DiskAmount, Pod, PodUsage, ResourceAmounts, StorageUsage};
use nodekeeper::signals::{Observation, Observations, Resource, Signal};
use proptest::prelude::*;

const MI: i64 = 1 << 20;

fn signal() -> impl Strategy<Value = Signal> {
    proptest::sample::select(Signal::ALL.to_vec())
}

fn amount() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![1 => Just(None), 4 => (0i64..8).prop_map(|n| Some(n * 64 * MI))]
}

fn layout() -> impl Strategy<Value = FilesystemLayout> {
    proptest::sample::select(vec![
        FilesystemLayout::SingleDisk,
        FilesystemLayout::ImageFs,
        FilesystemLayout::SplitImageFs,
    ])
}

fn part() -> impl Strategy<Value = Option<DiskAmount>> {
    (amount(), amount()).prop_map(|(bytes, inodes)| {
        bytes.map(|bytes| DiskAmount {
            bytes,
            inodes: inodes.unwrap_or(0) / MI,
        })
    })
}

/// Local storage by part, or (an older trace) only as a total.
fn storage() -> impl Strategy<Value = StorageUsage> {
    prop_oneof![
        1 => Just(StorageUsage::default()),
        2 => (part(), part(), part()).prop_map(|(writable_layers, logs, local_volumes)| {
            StorageUsage { writable_layers, logs, local_volumes }
        }),
    ]
}

fn priority() -> impl Strategy<Value = i32> {
    proptest::sample::select(vec![-10, 0, 0, 1000, 2_000_000_000, 2_000_001_000])
}

prop_compose! {
    fn pod_fields()(
        namespace in proptest::sample::select(vec!["a", "b"]),
        priority in priority(),
        critical in proptest::bool::weighted(0.1),
        memory_request in amount(),
        storage_request in amount(),
        memory in amount(),
        storage in amount(),
        inodes in amount(),
        pids in amount(),
        parts in storage(),
    ) -> Pod {
        Pod {
            namespace: namespace.to_string(),
            priority,
            critical,
            requests: ResourceAmounts { memory: memory_request, ephemeral_storage: storage_request, ..Default::default() },
            usage: PodUsage { memory, ephemeral_storage: storage, inodes, pids, storage: parts },
            ..Pod::default()
        }
    }
}

/// Pods with unique names, as pod keys are unique on a node.
fn pods(max: usize) -> impl Strategy<Value = Vec<Pod>> {
    proptest::collection::vec(pod_fields(), 0..max).prop_map(|pods| {
        pods.into_iter()
            .enumerate()
            .map(|(i, pod)| Pod {
                name: format!("pod-{i}"),
                ..pod
            })
            .collect()
    })
}

fn keys(pods: &[&Pod]) -> Vec<String> {
    pods.iter().map(|p| p.key()).collect()
}

fn hard_thresholds() -> EvictionConfig {
    let hard = |signal, value: i64| Threshold {
        signal,
        value: ThresholdValue::Quantity(Quantity::from_value(value)),
        grace_period: GoDuration::ZERO,
        min_reclaim: None,
    };
    EvictionConfig {
        thresholds: Signal::ALL.iter().map(|&s| hard(s, 256 * MI)).collect(),
        max_pod_grace_period_seconds: 30,
        pressure_transition_period: GoDuration::from_secs(300),
        local_storage_capacity_isolation: true,
        hugepage_aware: true,
    }
}

fn observations() -> impl Strategy<Value = Observations> {
    proptest::collection::btree_map(signal(), 0i64..512, 0..4).prop_map(|m| {
        m.into_iter()
            .map(|(signal, mib)| {
                let observation = Observation {
                    available: mib * MI,
                    capacity: 1024 * MI,
                    sampled_at_ms: None,
                };
                (signal, observation)
            })
            .collect()
    })
}

proptest! {
    #[test]
    fn ranking_does_not_depend_on_input_order(
        (pods, shuffled) in pods(24).prop_flat_map(|p| (Just(p.clone()), Just(p).prop_shuffle())),
        signal in signal(),
        layout in layout(),
    ) {
        let ranked = rank(signal, layout, &pods);
        prop_assert_eq!(keys(&ranked), keys(&rank(signal, layout, &shuffled)));
        let cmp = rank_cmp(signal, layout);
        for pair in ranked.windows(2) {
            prop_assert_eq!(cmp(pair[0], pair[1]), Ordering::Less, "rank agrees with rank_cmp");
        }
    }

    #[test]
    fn the_rank_comparator_is_a_total_order(
        pods in pods(8),
        signal in signal(),
        layout in layout(),
    ) {
        let cmp = rank_cmp(signal, layout);
        for a in &pods {
            for b in &pods {
                prop_assert_eq!(cmp(a, b), cmp(b, a).reverse());
                prop_assert_eq!(cmp(a, b) == Ordering::Equal, a.key() == b.key());
                for c in &pods {
                    if cmp(a, b) == Ordering::Less && cmp(b, c) == Ordering::Less {
                        prop_assert_eq!(cmp(a, c), Ordering::Less);
                    }
                }
            }
        }
    }

    #[test]
    fn below_request_never_ranks_ahead_of_above_request_at_equal_priority(
        pods in pods(16),
        signal in proptest::sample::select(vec![
            Signal::MemoryAvailable, Signal::AllocatableMemoryAvailable,
            Signal::NodeFsAvailable, Signal::ImageFsAvailable, Signal::ContainerFsAvailable,
        ]),
        layout in layout(),
    ) {
        // `None` for a pod without stats, which ranks first whatever its figures.
        let exceeds = |pod: &Pod| -> Option<bool> {
            if !pod.has_stats() {
                return None;
            }
            let parts = measured_storage(signal, layout);
            let (usage, request) = if signal.is_memory() {
                (pod.usage.memory.unwrap_or(0), pod.requests.memory)
            } else if parts.is_empty() {
                (0, pod.requests.ephemeral_storage)
            } else if pod.usage.storage.is_measured() {
                let bytes = parts
                    .iter()
                    .filter_map(|part| pod.usage.storage.part(*part))
                    .map(|amount| amount.bytes)
                    .sum();
                (bytes, pod.requests.ephemeral_storage)
            } else {
                (pod.usage.ephemeral_storage.unwrap_or(0), pod.requests.ephemeral_storage)
            };
            Some(usage > request.unwrap_or(0))
        };
        let ranked = rank(signal, layout, &pods);
        for (i, earlier) in ranked.iter().enumerate() {
            for later in &ranked[i + 1..] {
                if earlier.priority == later.priority {
                    prop_assert!(
                        !(exceeds(earlier) == Some(false) && exceeds(later) == Some(true)),
                        "{} (below request) ranked ahead of {} (above request)",
                        earlier.key(), later.key()
                    );
                }
            }
        }
    }

    #[test]
    fn pods_without_stats_rank_ahead_of_pods_with_stats_except_by_priority_for_pids(
        pods in pods(16),
        signal in signal(),
        layout in layout(),
    ) {
        let ranked = rank(signal, layout, &pods);
        for (i, earlier) in ranked.iter().enumerate() {
            for later in &ranked[i + 1..] {
                let out_of_order = earlier.has_stats() && !later.has_stats();
                let pid_priority = signal == Signal::PidAvailable && earlier.priority < later.priority;
                prop_assert!(
                    !out_of_order || pid_priority,
                    "{signal}: {} (stats) ranked ahead of {} (no stats)",
                    earlier.key(), later.key()
                );
            }
        }
    }

    #[test]
    fn no_critical_pod_is_ever_chosen_and_decisions_ignore_input_order(
        (pods, shuffled) in pods(16).prop_flat_map(|p| (Just(p.clone()), Just(p).prop_shuffle())),
        cycles in proptest::collection::vec(observations(), 1..5),
        layout in layout(),
    ) {
        let config = hard_thresholds();
        let options = SyncOptions { fs_layout: layout, ..SyncOptions::default() };
        let (mut state, mut state_shuffled) = (EvictionState::default(), EvictionState::default());
        for (i, observations) in cycles.iter().enumerate() {
            let now = Millis(i as u64 * 10_000);
            let decision = synchronize(&config, &state, observations, &pods, now, &options);
            let other = synchronize(&config, &state_shuffled, observations, &shuffled, now, &options);
            for order in &decision.evictions {
                let pod = pods.iter().find(|p| p.key() == order.key());
                prop_assert!(pod.is_some_and(|p| !p.is_critical()), "evicted {}", order.key());
            }
            let mut ours: Vec<_> = decision.evictions.iter().map(|o| (o.key(), o.message.clone())).collect();
            let mut theirs: Vec<_> = other.evictions.iter().map(|o| (o.key(), o.message.clone())).collect();
            // Local-storage evictions follow pod list order; compare them as sets.
            ours.sort();
            theirs.sort();
            prop_assert_eq!(ours, theirs);
            prop_assert!(decision.evictions.iter().filter(|o| o.disruption_target).count() <= 1);
            state = decision.state;
            state_shuffled = other.state;
        }
    }

    /// The agent counts each pod's processes only when a threshold ranks by them (a
    /// `pid.available` one; `EvictionConfig::ranks_by_process_count`). That is sound
    /// only if no other decision reads the counts: with any other thresholds, every
    /// cycle decides the same with the counts as without. The reader gives a pod a count
    /// only with its memory figure, so a pod without memory has no count in either.
    #[test]
    fn process_counts_change_no_decision_without_a_pid_threshold(
        pods in pods(16),
        cycles in proptest::collection::vec(observations(), 1..5),
        layout in layout(),
        kept in proptest::collection::vec(proptest::bool::ANY, Signal::ALL.len()),
    ) {
        let mut config = hard_thresholds();
        let mut keep = kept.into_iter();
        config.thresholds.retain(|threshold| {
            keep.next().unwrap_or(true) && threshold.signal.resource() != Resource::Pids
        });
        prop_assert!(!config.ranks_by_process_count());
        let counted: Vec<Pod> = pods
            .into_iter()
            .map(|mut pod| {
                if pod.usage.memory.is_none() {
                    pod.usage.pids = None;
                }
                pod
            })
            .collect();
        let uncounted: Vec<Pod> = counted
            .iter()
            .cloned()
            .map(|mut pod| {
                pod.usage.pids = None;
                pod
            })
            .collect();
        let options = SyncOptions { fs_layout: layout, ..SyncOptions::default() };
        let (mut state, mut state_uncounted) = (EvictionState::default(), EvictionState::default());
        for (i, observations) in cycles.iter().enumerate() {
            let now = Millis(i as u64 * 10_000);
            let decision = synchronize(&config, &state, observations, &counted, now, &options);
            let other = synchronize(&config, &state_uncounted, observations, &uncounted, now, &options);
            prop_assert_eq!(&decision, &other);
            state = decision.state;
            state_uncounted = other.state;
        }
    }

    /// The agent reads the containers' memory only for a pod it evicts for memory, after
    /// the decision, and decides again so that the message names them. That is sound
    /// only if those figures choose nothing: given them for pods with a cgroup (the only
    /// ones whose containers the agent can read), every cycle decides the same as
    /// without them, but for the words of the messages and annotations.
    #[test]
    fn container_memory_figures_change_no_choice(
        pods in pods(16),
        containers in proptest::collection::vec(
            (proptest::bool::ANY, proptest::collection::vec(amount(), 0..3)),
            16,
        ),
        cycles in proptest::collection::vec(observations(), 1..5),
        layout in layout(),
    ) {
        let config = hard_thresholds();
        let mut without = Vec::new();
        let mut with = Vec::new();
        for (mut pod, (has_cgroup, memory)) in pods.into_iter().zip(containers) {
            if has_cgroup {
                pod.cgroup = Some(format!("/kubepods/pod{}", pod.name).into());
            }
            pod.containers = (0..memory.len())
                .map(|i| ContainerStats { name: format!("c{i}"), ..ContainerStats::default() })
                .collect();
            let mut measured = pod.clone();
            if has_cgroup {
                for (container, memory) in measured.containers.iter_mut().zip(memory) {
                    container.usage.memory = memory;
                }
            }
            without.push(pod);
            with.push(measured);
        }
        let choice = |decision: &Decision| {
            let mut choice = decision.clone();
            for order in &mut choice.evictions {
                order.message.clear();
                order.annotations.clear();
            }
            choice
        };
        let options = SyncOptions { fs_layout: layout, ..SyncOptions::default() };
        let (mut state, mut state_with) = (EvictionState::default(), EvictionState::default());
        for (i, observations) in cycles.iter().enumerate() {
            let now = Millis(i as u64 * 10_000);
            let decision = synchronize(&config, &state, observations, &without, now, &options);
            let other = synchronize(&config, &state_with, observations, &with, now, &options);
            prop_assert_eq!(choice(&decision), choice(&other));
            state = decision.state;
            state_with = other.state;
        }
    }

    /// The kubelet's grace periods: a soft eviction asks for
    /// min(evictionMaxPodGracePeriod, terminationGracePeriodSeconds), the pod worker
    /// (`calculateEffectiveGracePeriod`) reads a 0 as the pod's own value and never goes
    /// below 1 s; storage limits ask for 1 s. Whatever the configuration and the pods say,
    /// no order is below 1 s, above the pod's own grace period or above a positive
    /// maximum.
    #[test]
    fn every_eviction_gets_at_least_one_second_and_never_more_than_asked(
        pods in pods(12),
        own in proptest::collection::vec(proptest::option::of(-10i64..120), 12),
        max_pod_grace in -100i64..120,
        cycles in proptest::collection::vec(observations(), 2..5),
    ) {
        let pods: Vec<Pod> = pods
            .into_iter()
            .zip(own)
            .map(|(pod, own)| Pod { termination_grace_period_seconds: own, ..pod })
            .collect();
        let mut config = hard_thresholds();
        for threshold in &mut config.thresholds {
            threshold.grace_period = GoDuration::from_secs(5);
        }
        config.max_pod_grace_period_seconds = max_pod_grace;
        let mut state = EvictionState::default();
        for (i, observations) in cycles.iter().enumerate() {
            let now = Millis(i as u64 * 10_000);
            let decision = synchronize(&config, &state, observations, &pods, now, &SyncOptions::default());
            for order in &decision.evictions {
                let grace = order.grace_period_seconds;
                prop_assert!(grace >= 1, "{}: {}", order.key(), grace);
                let pod = pods.iter().find(|p| p.key() == order.key()).unwrap();
                if !order.disruption_target {
                    prop_assert_eq!(grace, 1, "storage limits ask for 1 s");
                    continue;
                }
                // Never longer than the pod's own grace period, nor than a positive
                // maximum; a negative maximum always means 1 s.
                if let Some(own) = pod.termination_grace_period_seconds {
                    prop_assert!(grace <= own.max(1), "{}: {} above its own {}", order.key(), grace, own);
                }
                if max_pod_grace > 0 {
                    prop_assert!(grace <= max_pod_grace);
                }
                if max_pod_grace < 0 {
                    prop_assert_eq!(grace, 1);
                }
            }
            state = decision.state;
        }
    }
}
