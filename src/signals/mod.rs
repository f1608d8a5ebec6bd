//! Eviction signals: their names, and the observations the collectors produce.

mod name;

pub use name::{NodeCondition, Resource, Signal, UnknownSignal};

use std::collections::BTreeMap;

/// One observed signal: how much is left, out of how much.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub available: i64,
    pub capacity: i64,
    /// When the underlying stats were sampled, in the caller's clock (milliseconds).
    /// `None` means "always fresh", as a zero timestamp does in the kubelet.
    pub sampled_at_ms: Option<u64>,
}

/// All signals observed in one collection, keyed by signal.
pub type Observations = BTreeMap<Signal, Observation>;
