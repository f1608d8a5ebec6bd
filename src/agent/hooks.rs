//! Narrow extension points for the agent loop, so an integration (the Kubernetes API)
//! can supply pods and react to decisions without the loop knowing about it.

use super::CycleReport;
use crate::pods::Pod;

/// Where the agent's pods come from, instead of standalone workload cgroups. Called
/// once per cycle on the loop's thread; it must not block on the network (serve from a
/// cache kept fresh elsewhere).
pub trait PodSource: Send {
    fn pods(&mut self) -> Vec<Pod>;
}

/// Sees every cycle's observations and decision, after the decision is made and before
/// the agent acts on it. Must not block.
pub trait CycleObserver: Send {
    fn observe(&mut self, report: &CycleReport);
}
