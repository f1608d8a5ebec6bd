//! The storm guard: a partition or a control-plane failure makes many nodes look dead at
//! once, and answering that with power-offs is the worst thing a fencer can do. Three
//! rules, all pure:
//!
//! 1. no fence starts while more than `maxUnhealthy` of the watched nodes are unhealthy
//!    (NodeHealthCheck's `maxUnhealthy`), nor for `stormCooldown` after such a storm;
//! 2. fences start per zone at most at the node lifecycle controller's rates: the normal
//!    rate, a reduced one in a partially disrupted zone (none in a small one), and none at
//!    all when every zone is fully disrupted;
//! 3. the guard's memory (a storm seen, a cooldown running) is rebuilt from the NodeFence
//!    statuses after a restart, so restarting the controller never ends a cooldown early.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::facts::Readiness;
use super::policy::StormPolicy;
use super::resource::PauseReason;

/// A watched node as the guard counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub zone: String,
    pub readiness: Readiness,
    /// `node.kubernetes.io/exclude-disruption`: left out of the zone states, as the node
    /// lifecycle controller does (it still counts for `maxUnhealthy`).
    pub excluded_from_zone: bool,
}

/// Node views by name, replaced and removed one at a time (see `views.rs`, which keeps
/// them from the node watch).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchedNodes {
    views: Vec<NodeView>,
    /// Where each node's view is in `views`.
    positions: HashMap<String, usize>,
}

impl WatchedNodes {
    /// Adds or replaces the view of `view.name`; returns the one it replaced.
    pub fn upsert(&mut self, view: NodeView) -> Option<NodeView> {
        match self.positions.get(&view.name) {
            Some(&at) => Some(std::mem::replace(&mut self.views[at], view)),
            None => {
                self.positions.insert(view.name.clone(), self.views.len());
                self.views.push(view);
                None
            }
        }
    }

    /// Forgets node `name`; returns its view.
    pub fn remove(&mut self, name: &str) -> Option<NodeView> {
        let at = self.positions.remove(name)?;
        let removed = self.views.swap_remove(at);
        if let Some(moved) = self.views.get(at) {
            self.positions.insert(moved.name.clone(), at);
        }
        Some(removed)
    }

    /// Every view, in no particular order (the guard counts; it does not list).
    pub fn views(&self) -> &[NodeView] {
        &self.views
    }

    /// Node `name`'s view.
    pub fn get(&self, name: &str) -> Option<&NodeView> {
        self.positions.get(name).map(|&at| &self.views[at])
    }
}

/// What the guard remembers between evaluations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StormMemory {
    /// A storm was under way at the last evaluation.
    pub storm_active: bool,
    /// A cooldown runs until then.
    pub cooldown_until: Option<Timestamp>,
}

/// The cluster-wide verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum StormState {
    Calm,
    Storm {
        unhealthy: usize,
        total: usize,
        allowed: usize,
    },
    Cooldown {
        until: Timestamp,
    },
}

/// A zone's state, computed as `ComputeZoneState` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ZoneState {
    Normal,
    PartialDisruption,
    FullDisruption,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ZoneView {
    pub state: ZoneState,
    pub ready: usize,
    pub not_ready: usize,
    /// Fences that may start per second in this zone.
    pub rate: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Assessment {
    pub storm: StormState,
    /// The nodes counted, and how many of them are unhealthy (not Ready, or silent).
    pub watched: usize,
    pub unhealthy: usize,
    pub zones: BTreeMap<String, ZoneView>,
    /// To be kept for the next evaluation.
    pub memory: StormMemory,
}

/// Why the guard holds a fence back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuardBlock {
    pub reason: PauseReason,
    pub message: String,
    /// When the block ends by itself, if known.
    pub until: Option<Timestamp>,
}

impl StormMemory {
    /// Both memories at once: a storm either saw, the later cooldown.
    pub fn merge(self, other: StormMemory) -> StormMemory {
        StormMemory {
            storm_active: self.storm_active || other.storm_active,
            cooldown_until: match (self.cooldown_until, other.cooldown_until) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
        }
    }
}

/// Evaluates the guard over every watched node, by their Ready conditions alone.
pub fn assess(
    nodes: &[NodeView],
    memory: StormMemory,
    policy: &StormPolicy,
    now: Timestamp,
) -> Assessment {
    assess_with_silent(nodes, &[], memory, policy, now)
}

/// Evaluates the guard over every watched node; the nodes in `silent` (views from
/// `nodes`, see `liveness.rs`) count as unhealthy even while they still read Ready,
/// because the node lifecycle controller has not noticed yet.
pub fn assess_with_silent(
    nodes: &[NodeView],
    silent: &[&NodeView],
    memory: StormMemory,
    policy: &StormPolicy,
    now: Timestamp,
) -> Assessment {
    let total = nodes.len();
    let silent_but_ready: Vec<&NodeView> = silent
        .iter()
        .copied()
        .filter(|node| node.readiness == Readiness::Ready)
        .collect();
    let unhealthy = nodes
        .iter()
        .filter(|node| node.readiness != Readiness::Ready)
        .count()
        + silent_but_ready.len();
    let allowed = policy.max_unhealthy.allowed(total);
    let mut memory = memory;
    let storm = if unhealthy > allowed {
        memory.storm_active = true;
        StormState::Storm {
            unhealthy,
            total,
            allowed,
        }
    } else {
        if memory.storm_active {
            // The storm ended at this evaluation: the cooldown starts now.
            memory.storm_active = false;
            let until = now + policy.storm_cooldown;
            memory.cooldown_until = Some(memory.cooldown_until.map_or(until, |u| u.max(until)));
        }
        match memory.cooldown_until {
            Some(until) if until > now => StormState::Cooldown { until },
            _ => {
                memory.cooldown_until = None;
                StormState::Calm
            }
        }
    };
    Assessment {
        storm,
        watched: total,
        unhealthy,
        zones: zones(nodes, &silent_but_ready, policy),
        memory,
    }
}

fn zones(
    nodes: &[NodeView],
    silent_but_ready: &[&NodeView],
    policy: &StormPolicy,
) -> BTreeMap<String, ZoneView> {
    // Keyed by borrowed names: one allocation per zone, not one per node.
    let mut counts: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for node in nodes.iter().filter(|node| !node.excluded_from_zone) {
        let entry = counts.entry(node.zone.as_str()).or_default();
        if node.readiness == Readiness::Ready {
            entry.0 += 1;
        } else {
            entry.1 += 1;
        }
    }
    // A silent node still reading Ready was counted ready above; it is not.
    for node in silent_but_ready
        .iter()
        .filter(|node| !node.excluded_from_zone)
    {
        if let Some(entry) = counts.get_mut(node.zone.as_str())
            && entry.0 > 0
        {
            entry.0 -= 1;
            entry.1 += 1;
        }
    }
    let states: BTreeMap<&str, (ZoneState, usize, usize)> = counts
        .into_iter()
        .map(|(zone, (ready, not_ready))| {
            (
                zone,
                (zone_state(ready, not_ready, policy), ready, not_ready),
            )
        })
        .collect();
    let all_fully_disrupted = !states.is_empty()
        && states
            .values()
            .all(|(state, _, _)| *state == ZoneState::FullDisruption);
    states
        .into_iter()
        .map(|(zone, (state, ready, not_ready))| {
            let rate = if all_fully_disrupted {
                0.0
            } else {
                match state {
                    // A zone wholly down while others are fine is treated as healthy:
                    // that is what a dead rack looks like.
                    ZoneState::Normal | ZoneState::FullDisruption => policy.zone_fence_rate,
                    ZoneState::PartialDisruption => {
                        if ready + not_ready > policy.large_cluster_size_threshold {
                            policy.secondary_zone_fence_rate
                        } else {
                            0.0
                        }
                    }
                }
            };
            (
                zone.to_string(),
                ZoneView {
                    state,
                    ready,
                    not_ready,
                    rate,
                },
            )
        })
        .collect()
}

/// `ComputeZoneState`: fully disrupted with no Ready node and some NotReady; partially
/// with more than two NotReady making up at least the threshold.
pub fn zone_state(ready: usize, not_ready: usize, policy: &StormPolicy) -> ZoneState {
    if ready == 0 && not_ready > 0 {
        ZoneState::FullDisruption
    } else if not_ready > 2
        && (not_ready as f64) / ((ready + not_ready) as f64) >= policy.unhealthy_zone_threshold
    {
        ZoneState::PartialDisruption
    } else {
        ZoneState::Normal
    }
}

/// The storm state's block, if any: it holds back every power action.
pub fn storm_block(assessment: &Assessment) -> Option<GuardBlock> {
    match &assessment.storm {
        StormState::Storm {
            unhealthy,
            total,
            allowed,
        } => Some(GuardBlock {
            reason: PauseReason::StormGuard,
            message: format!(
                "{unhealthy} of {total} watched nodes are unhealthy and at most {allowed} may be: a partition or a control-plane failure is not a dead node"
            ),
            until: None,
        }),
        StormState::Cooldown { until } => Some(GuardBlock {
            reason: PauseReason::StormCooldown,
            message: format!("a storm ended recently; fencing resumes at {until}"),
            until: Some(*until),
        }),
        StormState::Calm => None,
    }
}

/// The zone's block on starting a new fence, if any: its token bucket (burst one, so
/// starts are at least `1 / rate` apart), given when the zone's earlier fences started.
pub fn zone_block(
    assessment: &Assessment,
    zone: &str,
    starts_in_zone: &[Timestamp],
    now: Timestamp,
) -> Option<GuardBlock> {
    let Some(view) = assessment.zones.get(zone) else {
        // A node the guard did not count (not watched): no rate to go by, so no fence.
        return Some(GuardBlock {
            reason: PauseReason::ZoneRateLimit,
            message: "the node is not among the watched nodes the zone rates are computed over"
                .to_string(),
            until: None,
        });
    };
    if view.rate <= 0.0 {
        return Some(GuardBlock {
            reason: PauseReason::ZoneRateLimit,
            message: format!(
                "no fences may start in zone {} now: it is {:?} ({} ready, {} not ready)",
                zone_name(zone),
                view.state,
                view.ready,
                view.not_ready
            ),
            until: None,
        });
    }
    let spacing = Duration::from_secs_f64((1.0 / view.rate).min(86_400.0 * 365.0));
    let next = starts_in_zone
        .iter()
        .filter(|start| **start <= now)
        .max()
        .map(|last| *last + spacing);
    match next {
        Some(next) if next > now => Some(GuardBlock {
            reason: PauseReason::ZoneRateLimit,
            message: format!(
                "zone {} starts at most {} fence(s) per second; the next may start at {next}",
                zone_name(zone),
                view.rate
            ),
            until: Some(next),
        }),
        _ => None,
    }
}

/// The guard's word on one node's fence.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Guard {
    /// Holds back every power action of every fence.
    pub storm: Option<GuardBlock>,
    /// Holds back the start of a new fence in the node's zone.
    pub zone: Option<GuardBlock>,
}

impl Guard {
    pub fn for_node(
        assessment: &Assessment,
        zone: &str,
        starts_in_zone: &[Timestamp],
        now: Timestamp,
    ) -> Guard {
        Guard {
            storm: storm_block(assessment),
            zone: zone_block(assessment, zone, starts_in_zone, now),
        }
    }

    /// Nothing holds anything back.
    pub fn open() -> Guard {
        Guard::default()
    }
}

/// Whether a new fence may start now for a node in `zone`: the storm first, then the
/// zone's rate.
pub fn verdict(
    assessment: &Assessment,
    zone: &str,
    starts_in_zone: &[Timestamp],
    now: Timestamp,
) -> Result<(), GuardBlock> {
    let guard = Guard::for_node(assessment, zone, starts_in_zone, now);
    match guard.storm.or(guard.zone) {
        Some(block) => Err(block),
        None => Ok(()),
    }
}

/// The zone as a person reads it.
pub fn zone_name(zone: &str) -> String {
    if zone.is_empty() {
        "(no zone labels)".to_string()
    } else {
        zone.replace(":\0:", "/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::policy::CountOrPercent;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("in range")
    }

    fn nodes(zone: &str, ready: usize, not_ready: usize) -> Vec<NodeView> {
        (0..ready + not_ready)
            .map(|i| NodeView {
                name: format!("{zone}-{i}"),
                zone: zone.to_string(),
                readiness: if i < ready {
                    Readiness::Ready
                } else {
                    Readiness::Unknown
                },
                excluded_from_zone: false,
            })
            .collect()
    }

    #[test]
    fn silent_nodes_that_still_read_ready_count_as_unhealthy_in_the_storm_and_the_zone() {
        let policy = StormPolicy::default();
        let all = nodes("a", 5, 0);
        // Three nodes fell silent; the node lifecycle controller has not noticed.
        let silent: Vec<&NodeView> = all.iter().take(3).collect();
        let assessment = assess_with_silent(&all, &silent, StormMemory::default(), &policy, at(0));
        // Exactly as if they were NotReady.
        let not_ready = assess(&nodes("a", 2, 3), StormMemory::default(), &policy, at(0));
        assert_eq!(assessment, not_ready);
        // A silent node already NotReady is not counted twice.
        let mixed = nodes("a", 3, 2);
        let silent: Vec<&NodeView> = mixed.iter().skip(3).collect();
        let assessment =
            assess_with_silent(&mixed, &silent, StormMemory::default(), &policy, at(0));
        assert_eq!(assessment.unhealthy, 2);
        assert_eq!(assessment.zones["a"].not_ready, 2);
    }

    #[test]
    fn three_of_five_unhealthy_is_a_storm_and_blocks_every_fence() {
        let policy = StormPolicy::default();
        let assessment = assess(&nodes("a", 2, 3), StormMemory::default(), &policy, at(0));
        assert_eq!(
            assessment.storm,
            StormState::Storm {
                unhealthy: 3,
                total: 5,
                allowed: 2
            }
        );
        let block = verdict(&assessment, "a", &[], at(0)).expect_err("blocked");
        assert_eq!(block.reason, PauseReason::StormGuard);
        assert!(block.message.contains("3 of 5"), "{}", block.message);
    }

    #[test]
    fn one_of_three_unhealthy_may_be_fenced() {
        let assessment = assess(
            &nodes("a", 2, 1),
            StormMemory::default(),
            &StormPolicy::default(),
            at(0),
        );
        assert_eq!(assessment.storm, StormState::Calm);
        assert_eq!(verdict(&assessment, "a", &[], at(0)), Ok(()));
    }

    #[test]
    fn after_a_storm_fencing_waits_for_the_cooldown_even_across_a_restart() {
        let policy = StormPolicy {
            storm_cooldown: Duration::from_secs(120),
            ..StormPolicy::default()
        };
        let storm = assess(&nodes("a", 2, 3), StormMemory::default(), &policy, at(0));
        let over = assess(&nodes("a", 4, 1), storm.memory, &policy, at(30));
        assert_eq!(over.storm, StormState::Cooldown { until: at(150) });
        assert_eq!(
            verdict(&over, "a", &[], at(30))
                .expect_err("cooling down")
                .reason,
            PauseReason::StormCooldown
        );
        // A restarted controller rebuilds the memory from the paused fences' statuses.
        let rebuilt = StormMemory {
            storm_active: false,
            cooldown_until: Some(at(150)),
        };
        let restarted = assess(&nodes("a", 4, 1), rebuilt, &policy, at(100));
        assert_eq!(restarted.storm, StormState::Cooldown { until: at(150) });
        let calm = assess(&nodes("a", 4, 1), restarted.memory, &policy, at(150));
        assert_eq!(calm.storm, StormState::Calm);
        assert_eq!(calm.memory, StormMemory::default());
    }

    #[test]
    fn zone_states_follow_the_node_lifecycle_controller() {
        let policy = StormPolicy::default();
        assert_eq!(zone_state(0, 1, &policy), ZoneState::FullDisruption);
        assert_eq!(zone_state(2, 3, &policy), ZoneState::PartialDisruption);
        // Two NotReady nodes never make a partial disruption, whatever the share.
        assert_eq!(zone_state(1, 2, &policy), ZoneState::Normal);
        assert_eq!(zone_state(3, 3, &policy), ZoneState::Normal);
        assert_eq!(zone_state(0, 0, &policy), ZoneState::Normal);
    }

    #[test]
    fn zone_rates_normal_reduced_in_large_disrupted_zones_none_in_small_ones() {
        let policy = StormPolicy {
            max_unhealthy: CountOrPercent::Percent(100.0),
            ..StormPolicy::default()
        };
        let mut all = nodes("small", 2, 3);
        all.extend(nodes("large", 20, 40));
        all.extend(nodes("fine", 10, 1));
        all.extend(nodes("dead", 0, 2));
        let assessment = assess(&all, StormMemory::default(), &policy, at(0));
        assert_eq!(assessment.zones["small"].rate, 0.0);
        assert_eq!(assessment.zones["large"].rate, 0.01);
        assert_eq!(assessment.zones["fine"].rate, 0.1);
        assert_eq!(assessment.zones["dead"].state, ZoneState::FullDisruption);
        assert_eq!(assessment.zones["dead"].rate, 0.1);
    }

    #[test]
    fn every_zone_fully_disrupted_stops_all_fencing() {
        let policy = StormPolicy {
            max_unhealthy: CountOrPercent::Percent(100.0),
            ..StormPolicy::default()
        };
        let mut all = nodes("a", 0, 2);
        all.extend(nodes("b", 0, 1));
        let assessment = assess(&all, StormMemory::default(), &policy, at(0));
        assert!(assessment.zones.values().all(|zone| zone.rate == 0.0));
        assert_eq!(
            verdict(&assessment, "a", &[], at(0))
                .expect_err("blocked")
                .reason,
            PauseReason::ZoneRateLimit
        );
    }

    #[test]
    fn fences_in_one_zone_start_at_most_at_its_rate() {
        let assessment = assess(
            &nodes("a", 8, 2),
            StormMemory::default(),
            &StormPolicy::default(),
            at(0),
        );
        let block = verdict(&assessment, "a", &[at(0)], at(4)).expect_err("too soon");
        assert_eq!(block.until, Some(at(10)));
        assert_eq!(verdict(&assessment, "a", &[at(0)], at(10)), Ok(()));
    }

    #[test]
    fn a_node_outside_the_watched_set_is_never_started() {
        let assessment = assess(
            &nodes("a", 3, 0),
            StormMemory::default(),
            &StormPolicy::default(),
            at(0),
        );
        assert!(verdict(&assessment, "elsewhere", &[], at(0)).is_err());
    }

    fn view(name: &str, zone: &str, readiness: Readiness) -> NodeView {
        NodeView {
            name: name.to_string(),
            zone: zone.to_string(),
            readiness,
            excluded_from_zone: false,
        }
    }

    #[test]
    fn watched_nodes_replace_and_forget_by_name() {
        let mut watched = WatchedNodes::default();
        assert_eq!(watched.upsert(view("a", "z1", Readiness::Ready)), None);
        assert_eq!(watched.upsert(view("b", "z1", Readiness::Ready)), None);
        assert_eq!(watched.upsert(view("c", "z2", Readiness::Ready)), None);
        let previous = watched.upsert(view("b", "z1", Readiness::Unknown));
        assert_eq!(previous.map(|v| v.readiness), Some(Readiness::Ready));
        assert_eq!(watched.views().len(), 3);
        // Removing the first moves the last into its place; both stay findable.
        assert_eq!(watched.remove("a").map(|v| v.name), Some("a".to_string()));
        assert_eq!(watched.remove("a"), None);
        let moved = watched.upsert(view("c", "z2", Readiness::NotReady));
        assert_eq!(moved.map(|v| v.zone), Some("z2".to_string()));
        assert_eq!(watched.views().len(), 2);
        // The guard counts what is kept: both of two unhealthy.
        let policy = StormPolicy {
            max_unhealthy: CountOrPercent::Count(0),
            ..StormPolicy::default()
        };
        let assessment = assess(watched.views(), StormMemory::default(), &policy, at(0));
        assert_eq!(
            assessment.storm,
            StormState::Storm {
                unhealthy: 2,
                total: 2,
                allowed: 0
            }
        );
        // The counts come with every verdict, calm included (the metrics read them).
        let lenient = StormPolicy {
            max_unhealthy: CountOrPercent::Count(5),
            ..StormPolicy::default()
        };
        let calm = assess(watched.views(), StormMemory::default(), &lenient, at(0));
        assert_eq!(calm.storm, StormState::Calm);
        assert_eq!((calm.watched, calm.unhealthy), (2, 2));
    }

    proptest::proptest! {
        /// After any sequence of upserts and removals the kept views are exactly the latest
        /// view of every node not removed since.
        #[test]
        fn watched_nodes_match_the_latest_event_of_every_node(
            events in proptest::collection::vec((0u8..12, proptest::option::of(0u8..3)), 0..80)
        ) {
            let mut watched = WatchedNodes::default();
            let mut model: BTreeMap<String, Readiness> = BTreeMap::new();
            for (node, readiness) in events {
                let name = format!("node-{node}");
                match readiness {
                    Some(state) => {
                        let readiness = [Readiness::Ready, Readiness::NotReady, Readiness::Unknown][state as usize];
                        let before = watched.upsert(view(&name, "z", readiness)).map(|v| v.readiness);
                        proptest::prop_assert_eq!(before, model.insert(name, readiness));
                    }
                    None => {
                        let before = watched.remove(&name).map(|v| v.readiness);
                        proptest::prop_assert_eq!(before, model.remove(&name));
                    }
                }
            }
            let mut kept: Vec<(String, Readiness)> = watched
                .views()
                .iter()
                .map(|v| (v.name.clone(), v.readiness))
                .collect();
            kept.sort_by(|a, b| a.0.cmp(&b.0));
            let expected: Vec<(String, Readiness)> = model.into_iter().collect();
            proptest::prop_assert_eq!(&kept, &expected);
        }
    }
}
