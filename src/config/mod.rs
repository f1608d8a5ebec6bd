//! Configuration: kubelet-style YAML documents, Kubernetes quantities and Go durations,
//! merged into one effective [`AgentConfig`].

mod documents;
pub mod duration;
mod lenient_yaml;
mod load;
mod model;
mod thresholds;

pub use crate::quantity::{Quantity, QuantityFormat};
pub use documents::{AgentDocument, ScalarText};
pub use duration::GoDuration;
pub use load::{
    ConfigError, LoadedConfig, Overrides, from_yaml_str, from_yaml_str_with_warnings, load,
    load_with_warnings, parse_inline, read_file, unset_settings,
};
pub use model::{
    AgentConfig, CgroupDriver, DEFAULT_REPORT_TOKEN_FILE, EvictionConfig, HostPaths,
    IsolationConfig, KubernetesConfig, NodeReclaimConfig, ReclaimMethod, ReportConfig,
    ShutdownConfig, ShutdownPhaseConfig, Threshold, ThresholdValue, WorkloadPodConfig,
    WorkloadsConfig, lease_read_interval, runtime_endpoint_socket,
};
pub use thresholds::FilesystemLayout;
