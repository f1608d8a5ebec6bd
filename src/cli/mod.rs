//! One file per subcommand: its clap arguments and a `run` that returns the exit code.
//! These are the binary's edge, so they may use anyhow; the library stays typed.

pub mod agent;
pub mod check_config;
pub mod rank;
pub mod replay;
pub mod shutdown_manager;
pub mod shutdown_plan;
pub mod signals;

use nodekeeper::config::Overrides;

/// Kubelet-form eviction flags; each replaces the matching field of the config file.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct EvictionFlags {
    /// Hard thresholds, e.g. `memory.available<1Gi,nodefs.available<10%`.
    #[arg(long, value_name = "SIGNAL<VALUE,...")]
    pub eviction_hard: Option<String>,
    /// Soft thresholds, e.g. `memory.available<1.5Gi`; each needs a grace period.
    #[arg(long, value_name = "SIGNAL<VALUE,...")]
    pub eviction_soft: Option<String>,
    /// Soft grace periods, e.g. `memory.available=1m30s`.
    #[arg(long, value_name = "SIGNAL=DURATION,...")]
    pub eviction_soft_grace_period: Option<String>,
    /// Minimum reclaim per signal, e.g. `memory.available=500Mi,nodefs.available=5%`.
    #[arg(long, value_name = "SIGNAL=VALUE,...")]
    pub eviction_minimum_reclaim: Option<String>,
    /// How long a pressure condition stays on after the last observation, e.g. `5m`.
    #[arg(long, value_name = "DURATION")]
    pub eviction_pressure_transition_period: Option<String>,
    /// Upper bound, in seconds, of the grace period given to soft-evicted pods.
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub eviction_max_pod_grace_period: Option<i64>,
}

impl EvictionFlags {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            eviction_hard: self.eviction_hard.clone(),
            eviction_soft: self.eviction_soft.clone(),
            eviction_soft_grace_period: self.eviction_soft_grace_period.clone(),
            eviction_minimum_reclaim: self.eviction_minimum_reclaim.clone(),
            eviction_pressure_transition_period: self.eviction_pressure_transition_period.clone(),
            eviction_max_pod_grace_period: self.eviction_max_pod_grace_period,
            ..Overrides::default()
        }
    }
}

/// `--output` for commands that print either for people or for programs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutputFormat {
    #[default]
    Table,
    Json,
}
