//! Configuration: kubelet-style YAML documents, Kubernetes quantities and Go durations,
//! merged into one effective [`AgentConfig`].

pub mod duration;
mod load;
mod model;
pub mod quantity;

pub use duration::GoDuration;
pub use load::{ConfigError, Overrides, from_yaml_str, load, parse_inline};
pub use model::{
    AgentConfig, EvictionConfig, HostPaths, ShutdownConfig, ShutdownPhaseConfig, Threshold,
    ThresholdValue,
};
pub use quantity::Quantity;
