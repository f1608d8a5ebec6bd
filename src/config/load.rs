//! Loading and merging configuration documents. (Being implemented: see issue 2.)

use std::path::Path;

use super::model::AgentConfig;

/// Command-line settings that override the file, in the kubelet's flag syntax.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `memory.available<1Gi,nodefs.available<10%`
    pub eviction_hard: Option<String>,
    pub eviction_soft: Option<String>,
    /// `memory.available=1m30s`
    pub eviction_soft_grace_period: Option<String>,
    pub eviction_minimum_reclaim: Option<String>,
    pub eviction_pressure_transition_period: Option<String>,
    pub eviction_max_pod_grace_period: Option<i64>,
    pub node_name: Option<String>,
    pub dry_run: Option<bool>,
    pub metrics_address: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{source_name}: {message}")]
    Invalid {
        source_name: String,
        message: String,
    },
    #[error("cannot read {path}: {error}")]
    Read { path: String, error: std::io::Error },
}

/// Load a configuration file (or the built-in defaults when `path` is `None`).
pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<AgentConfig, ConfigError> {
    let _ = (path, overrides);
    Ok(AgentConfig::default())
}

/// Parse the text of a configuration file holding one or more YAML documents.
pub fn from_yaml_str(
    text: &str,
    source_name: &str,
    overrides: &Overrides,
) -> Result<AgentConfig, ConfigError> {
    let _ = (text, source_name, overrides);
    Ok(AgentConfig::default())
}

/// Parse an inline `AgentConfiguration` body (as embedded in a trace file), where
/// `apiVersion` and `kind` may be omitted.
pub fn parse_inline(
    value: &serde_yaml_ng::Value,
    source_name: &str,
) -> Result<AgentConfig, ConfigError> {
    let _ = (value, source_name);
    Ok(AgentConfig::default())
}
