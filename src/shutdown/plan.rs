//! Pure shutdown planning: configuration to priority phases, pods to phases, per-pod
//! grace periods and the total inhibit budget, following the kubelet's node shutdown
//! manager (`migrateConfig`, `groupByPriority`, `killPods`, `periodRequested`).

use serde::{Deserialize, Serialize};

use crate::config::ShutdownConfig;
use crate::pods::{Pod, SYSTEM_CRITICAL_PRIORITY, effective_grace_period_seconds};

/// One configured phase: pods grouped under `priority` get at most `seconds` to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseSpec {
    pub priority: i32,
    pub seconds: i64,
}

/// The phases the configuration asks for, sorted by priority ascending (execution order).
/// An empty list means graceful shutdown is disabled and the node shuts down immediately.
///
/// `shutdownGracePeriodByPodPriority` wins when it is non-empty; otherwise
/// `shutdownGracePeriod`/`shutdownGracePeriodCriticalPods` become two phases, priority 0
/// (the rest of the period) and the system-critical priority (the critical period).
pub fn phases_from_config(config: &ShutdownConfig) -> Vec<PhaseSpec> {
    let mut phases: Vec<PhaseSpec> = if config.by_pod_priority.is_empty() {
        migrate_grace_periods(config)
    } else {
        config
            .by_pod_priority
            .iter()
            .map(|entry| PhaseSpec {
                priority: entry.priority,
                seconds: entry.shutdown_grace_period_seconds,
            })
            .collect()
    };
    phases.sort_by_key(|phase| phase.priority);
    phases
}

fn migrate_grace_periods(config: &ShutdownConfig) -> Vec<PhaseSpec> {
    let requested = config.grace_period.nanos();
    let critical = config.grace_period_critical_pods.nanos();
    if requested == 0 {
        return Vec::new();
    }
    let Some(default_nanos) = requested.checked_sub(critical) else {
        return Vec::new();
    };
    if default_nanos < 0 {
        return Vec::new();
    }
    // Whole seconds, truncated, as `int64(d / time.Second)`.
    vec![
        PhaseSpec {
            priority: 0,
            seconds: default_nanos / 1_000_000_000,
        },
        PhaseSpec {
            priority: SYSTEM_CRITICAL_PRIORITY,
            seconds: critical / 1_000_000_000,
        },
    ]
}

/// A pod as the plan terminates it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedPod {
    pub namespace: String,
    pub name: String,
    /// Kept for the API terminator's delete precondition; not part of the printed plan.
    #[serde(skip)]
    pub uid: Option<String>,
    pub grace_period_seconds: i64,
}

impl PlannedPod {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedPhase {
    pub priority: i32,
    pub seconds: i64,
    pub pods: Vec<PlannedPod>,
}

/// The whole shutdown: phases in execution order, empty ones included.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownPlan {
    /// The delay-inhibitor time the plan needs: the phases run one after another.
    pub total_seconds: i64,
    pub phases: Vec<PlannedPhase>,
}

/// The budget logind must grant: the sum of all configured phases, empty or not.
pub fn total_budget_seconds(phases: &[PhaseSpec]) -> i64 {
    phases
        .iter()
        .fold(0i64, |sum, phase| sum.saturating_add(phase.seconds.max(0)))
}

/// Assign every pod to a phase; phases come out in execution order (priority ascending).
/// With no phases there is nothing to plan.
pub fn plan(phases: &[PhaseSpec], pods: &[Pod]) -> ShutdownPlan {
    let mut sorted = phases.to_vec();
    sorted.sort_by_key(|phase| phase.priority);
    let phases = sorted.as_slice();
    let mut planned: Vec<PlannedPhase> = phases
        .iter()
        .map(|phase| PlannedPhase {
            priority: phase.priority,
            seconds: phase.seconds,
            pods: Vec::new(),
        })
        .collect();
    if !planned.is_empty() {
        for pod in pods {
            let index = phase_index_for(phases, pod.priority);
            let phase = &mut planned[index];
            phase.pods.push(PlannedPod {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                grace_period_seconds: pod_grace_seconds(
                    phase.seconds,
                    pod.termination_grace_period_seconds,
                ),
            });
        }
    }
    for phase in &mut planned {
        phase
            .pods
            .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    }
    ShutdownPlan {
        total_seconds: total_budget_seconds(phases),
        phases: planned,
    }
}

/// The kubelet's `groupByPriority` on phases sorted by priority: the first phase whose
/// priority is the pod's own; otherwise the last phase below it; pods below every phase
/// go to the first, pods above every phase to the last. With a priority listed twice, a
/// pod of exactly that priority takes the first of the two and a pod above it the
/// second, as the kubelet's binary search does.
fn phase_index_for(phases: &[PhaseSpec], pod_priority: i32) -> usize {
    let first_not_below = phases.partition_point(|phase| phase.priority < pod_priority);
    if first_not_below == phases.len() {
        phases.len().saturating_sub(1)
    } else if first_not_below > 0 && phases[first_not_below].priority > pod_priority {
        first_not_below - 1
    } else {
        first_not_below
    }
}

/// The phase's period, or the pod's own terminationGracePeriodSeconds when it is not
/// longer (`killPods`), as the pod worker applies it: a request of 0 s (a `0s` phase, a
/// pod asking for 0 s) falls back to the pod's own grace period, and the result is never
/// below 1 s (a negative phase, a pod whose own grace is 0).
fn pod_grace_seconds(phase_seconds: i64, own: Option<i64>) -> i64 {
    let requested = match own {
        Some(own) if own <= phase_seconds => own,
        _ => phase_seconds,
    };
    effective_grace_period_seconds(requested, own)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{GoDuration, ShutdownPhaseConfig};

    fn pod(namespace: &str, name: &str, priority: i32, tgps: Option<i64>) -> Pod {
        Pod {
            namespace: namespace.into(),
            name: name.into(),
            priority,
            termination_grace_period_seconds: tgps,
            ..Pod::default()
        }
    }

    fn legacy(grace: &str, critical: &str) -> ShutdownConfig {
        ShutdownConfig {
            grace_period: GoDuration::parse(grace).unwrap(),
            grace_period_critical_pods: GoDuration::parse(critical).unwrap(),
            by_pod_priority: vec![],
        }
    }

    fn by_priority(entries: &[(i32, i64)]) -> ShutdownConfig {
        ShutdownConfig {
            by_pod_priority: entries
                .iter()
                .map(|&(priority, seconds)| ShutdownPhaseConfig {
                    priority,
                    shutdown_grace_period_seconds: seconds,
                })
                .collect(),
            ..ShutdownConfig::default()
        }
    }

    fn spec(priority: i32, seconds: i64) -> PhaseSpec {
        PhaseSpec { priority, seconds }
    }

    fn names(phase: &PlannedPhase) -> Vec<String> {
        phase.pods.iter().map(PlannedPod::key).collect()
    }

    #[test]
    fn legacy_periods_become_a_default_and_a_critical_phase() {
        let table = [
            (
                ("30s", "10s"),
                vec![spec(0, 20), spec(SYSTEM_CRITICAL_PRIORITY, 10)],
            ),
            (
                ("30s", "0s"),
                vec![spec(0, 30), spec(SYSTEM_CRITICAL_PRIORITY, 0)],
            ),
            (
                ("10s", "10s"),
                vec![spec(0, 0), spec(SYSTEM_CRITICAL_PRIORITY, 10)],
            ),
            // Seconds are truncated after the subtraction, as the kubelet does.
            (
                ("2.9s", "1.5s"),
                vec![spec(0, 1), spec(SYSTEM_CRITICAL_PRIORITY, 1)],
            ),
            (("0s", "0s"), vec![]),
            (("0s", "10s"), vec![]),
            (("5s", "10s"), vec![]),
        ];
        for ((grace, critical), expected) in table {
            assert_eq!(
                phases_from_config(&legacy(grace, critical)),
                expected,
                "shutdownGracePeriod={grace} shutdownGracePeriodCriticalPods={critical}"
            );
        }
    }

    #[test]
    fn by_pod_priority_is_used_sorted_and_wins_over_legacy_periods() {
        let mut config = by_priority(&[(100_000, 20), (0, 10), (SYSTEM_CRITICAL_PRIORITY, 5)]);
        config.grace_period = GoDuration::from_secs(600);
        assert_eq!(
            phases_from_config(&config),
            vec![
                spec(0, 10),
                spec(100_000, 20),
                spec(SYSTEM_CRITICAL_PRIORITY, 5)
            ]
        );
        assert_eq!(phases_from_config(&ShutdownConfig::default()), vec![]);
    }

    #[test]
    fn pods_go_to_the_greatest_phase_priority_not_above_their_own() {
        let phases = [
            spec(0, 10),
            spec(100_000, 20),
            spec(SYSTEM_CRITICAL_PRIORITY, 5),
        ];
        let pods = [
            pod("a", "below-lowest", -5, None),
            pod("a", "zero", 0, None),
            pod("a", "between", 99_999, None),
            pod("a", "exact", 100_000, None),
            pod("a", "cluster-critical", SYSTEM_CRITICAL_PRIORITY, None),
            pod("a", "node-critical", 2_000_001_000, None),
        ];
        let result = plan(&phases, &pods);
        let grouped: Vec<Vec<String>> = result.phases.iter().map(names).collect();
        assert_eq!(
            grouped,
            vec![
                vec!["a/below-lowest", "a/between", "a/zero"],
                vec!["a/exact"],
                vec!["a/cluster-critical", "a/node-critical"],
            ]
        );
    }

    #[test]
    fn lowest_phase_above_zero_still_takes_low_priority_pods() {
        let result = plan(&[spec(1000, 7)], &[pod("x", "p", 0, None)]);
        assert_eq!(names(&result.phases[0]), vec!["x/p"]);
        assert_eq!(result.phases[0].pods[0].grace_period_seconds, 7);
    }

    #[test]
    fn a_pod_gets_its_own_grace_when_shorter_than_the_phase() {
        let phases = [spec(0, 20)];
        let pods = [
            pod("d", "short", 0, Some(3)),
            pod("d", "long", 0, Some(60)),
            pod("d", "unset", 0, None),
            pod("d", "zero", 0, Some(0)),
        ];
        let graces: Vec<(String, i64)> = plan(&phases, &pods).phases[0]
            .pods
            .iter()
            .map(|p| (p.name.clone(), p.grace_period_seconds))
            .collect();
        assert_eq!(
            graces,
            vec![
                ("long".into(), 20),
                ("short".into(), 3),
                ("unset".into(), 20),
                // killPods passes 0 on; the pod worker's fallback, the pod's own 0, is
                // raised to 1.
                ("zero".into(), 1),
            ]
        );
    }

    /// `killPods` hands the phase's 0 s to the pod worker, whose
    /// `calculateEffectiveGracePeriod` takes 0 as "no value" and uses the pod's own grace
    /// period (1 s when the pod has none); the phase itself does not wait.
    #[test]
    fn a_critical_phase_of_zero_seconds_leaves_its_pods_their_own_grace() {
        let phases = phases_from_config(&legacy("30s", "0s"));
        let result = plan(
            &phases,
            &[
                pod("kube-system", "dns", SYSTEM_CRITICAL_PRIORITY, Some(30)),
                pod("kube-system", "proxy", SYSTEM_CRITICAL_PRIORITY, None),
            ],
        );
        assert_eq!(result.total_seconds, 30);
        assert!(result.phases[0].pods.is_empty());
        assert_eq!(result.phases[1].seconds, 0);
        assert_eq!(result.phases[1].pods[0].grace_period_seconds, 30);
        assert_eq!(result.phases[1].pods[1].grace_period_seconds, 1);
    }

    /// `groupByPriority` searches the sorted entries for the first priority not below the
    /// pod's and steps back one when that entry is above it. A priority listed twice
    /// therefore takes pods of exactly that priority in its first entry, and pods above
    /// it (below the next priority) in its second. The kubelet's `sort.Slice` keeps the
    /// file order of equal priorities for lists this short; so does the stable sort here.
    #[test]
    fn a_priority_listed_twice_splits_pods_as_the_kubelet_binary_search_does() {
        let phases = phases_from_config(&by_priority(&[(1000, 30), (0, 10), (1000, 5), (5000, 7)]));
        assert_eq!(
            phases,
            vec![spec(0, 10), spec(1000, 30), spec(1000, 5), spec(5000, 7)]
        );
        let pods = [
            pod("a", "low", 10, None),
            pod("a", "exact", 1000, None),
            pod("a", "above", 2000, None),
            pod("a", "top", 9000, None),
        ];
        let result = plan(&phases, &pods);
        let grouped: Vec<Vec<String>> = result.phases.iter().map(names).collect();
        assert_eq!(
            grouped,
            vec![
                vec!["a/low"],
                vec!["a/exact"],
                vec!["a/above"],
                vec!["a/top"]
            ]
        );
        assert_eq!(result.phases[1].pods[0].grace_period_seconds, 30);
        assert_eq!(result.phases[2].pods[0].grace_period_seconds, 5);
        // Every entry counts toward the delay asked of logind (`periodRequested`).
        assert_eq!(result.total_seconds, 52);

        // With only the two equal entries, a pod above them lands in the last.
        let phases = phases_from_config(&by_priority(&[(100, 1), (100, 2)]));
        let result = plan(
            &phases,
            &[
                pod("b", "equal", 100, None),
                pod("b", "above", 101, None),
                pod("b", "below", 0, None),
            ],
        );
        let grouped: Vec<Vec<String>> = result.phases.iter().map(names).collect();
        assert_eq!(grouped, vec![vec!["b/below", "b/equal"], vec!["b/above"]]);
    }

    /// A negative `shutdownGracePeriodSeconds` (accepted by the kubelet's validation):
    /// its pods get the pod worker's 1 s, the phase does not wait, and unlike the
    /// kubelet's `periodRequested`, which would subtract it, it adds nothing to the
    /// delay asked of logind, so the other phases keep all their time.
    #[test]
    fn a_negative_phase_gives_one_second_and_takes_no_budget() {
        let phases = phases_from_config(&by_priority(&[(0, -5), (1000, 20)]));
        let result = plan(
            &phases,
            &[pod("c", "p", 0, Some(30)), pod("c", "q", 0, Some(-3))],
        );
        assert_eq!(result.phases[0].seconds, -5);
        assert!(
            result.phases[0]
                .pods
                .iter()
                .all(|p| p.grace_period_seconds == 1)
        );
        assert_eq!(result.total_seconds, 20);
    }

    #[test]
    fn the_budget_is_the_sum_of_all_phases_including_empty_ones() {
        let phases = [
            spec(0, 10),
            spec(5, 0),
            spec(100, 20),
            spec(SYSTEM_CRITICAL_PRIORITY, 5),
        ];
        assert_eq!(plan(&phases, &[]).total_seconds, 35);
        assert_eq!(total_budget_seconds(&[]), 0);
    }

    #[test]
    fn pods_are_sorted_by_namespace_then_name() {
        let pods = [
            pod("b", "a", 0, None),
            pod("a", "z", 0, None),
            pod("a", "b", 0, None),
        ];
        assert_eq!(
            names(&plan(&[spec(0, 1)], &pods).phases[0]),
            vec!["a/b", "a/z", "b/a"]
        );
    }

    #[test]
    fn no_phases_means_an_empty_plan() {
        let result = plan(&[], &[pod("a", "b", 0, None)]);
        assert_eq!(
            result,
            ShutdownPlan {
                total_seconds: 0,
                phases: vec![]
            }
        );
    }

    #[test]
    fn json_matches_the_documented_shape() {
        let phases = phases_from_config(&legacy("30s", "10s"));
        let result = plan(&phases, &[pod("default", "web-1", 0, None)]);
        assert_eq!(
            serde_json::to_string(&result).unwrap(),
            r#"{"totalSeconds":30,"phases":[{"priority":0,"seconds":20,"pods":[{"namespace":"default","name":"web-1","gracePeriodSeconds":20}]},{"priority":2000000000,"seconds":10,"pods":[]}]}"#
        );
    }
}
