//! One file per subcommand: its clap arguments and a `run` that returns the exit code.
//! These are the binary's edge, so they may use anyhow; the library stays typed.

pub mod agent;
pub mod check_config;
pub mod completions;
pub mod controller;
pub mod crd;
pub mod fence;
pub mod fence_config;
pub mod manpages;
pub mod rank;
pub mod replay;
pub mod shutdown_manager;
pub mod shutdown_plan;
pub mod signals;

use std::path::Path;

use nodekeeper::config::{self, AgentConfig, ConfigError, Overrides};

/// Load the agent configuration as every command does, printing its warnings (values the
/// kubelet accepts but that are surely mistakes) on standard error.
pub fn load_config(path: Option<&Path>, overrides: &Overrides) -> Result<AgentConfig, ConfigError> {
    let loaded = config::load_with_warnings(path, overrides)?;
    print_warnings(&loaded.warnings);
    Ok(loaded.config)
}

/// Configuration warnings on standard error, one `warning: ` line each.
pub fn print_warnings(warnings: &[String]) {
    for warning in warnings {
        eprintln!("warning: {warning}");
    }
}

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
    /// Aligned columns, for people.
    #[default]
    Table,
    /// One JSON document, for programs.
    Json,
}

/// Where `fence-config` and `fence` read the fence configuration, and how they run agents.
#[derive(clap::Args, Debug, Clone)]
pub struct FenceSourceArgs {
    /// Read the ConfigMaps and Secrets from the YAML files in DIR (several documents per
    /// file, any file names) instead of from the cluster.
    #[arg(long, value_name = "DIR")]
    pub from: Option<std::path::PathBuf>,
    /// Namespace of the fence ConfigMaps and Secrets in the cluster (default: the
    /// kubeconfig context's namespace, or the pod's).
    #[arg(long, short = 'n', value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// Kubeconfig for reading the cluster (default: KUBECONFIG, then the in-cluster service
    /// account).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Directory the fence agents are installed in; agents are never looked up on PATH.
    #[arg(long, value_name = "DIR", default_value = nodekeeper::fencing::runner::DEFAULT_AGENTS_DIR)]
    pub agents_dir: std::path::PathBuf,
    /// Deadline of one agent call, e.g. 60s; an agent still running then is killed with
    /// its process group and counts as failed.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub timeout: std::time::Duration,
    /// Pass this agent option although it names a file or program (e.g. fence_dummy's
    /// `status_file` on a test rig); repeatable. ConfigMaps cannot allow it themselves.
    #[arg(long = "allow-option", value_name = "OPTION")]
    pub allowed_options: Vec<String>,
}

impl FenceSourceArgs {
    /// The ConfigMaps and Secrets for `node`, from `--from DIR` or from the cluster.
    pub async fn objects(&self, node: &str) -> anyhow::Result<nodekeeper::fencing::FenceObjects> {
        use anyhow::Context;
        if let Some(dir) = &self.from {
            return Ok(nodekeeper::fencing::FenceObjects::from_dir(dir)?);
        }
        let Some(config) =
            nodekeeper::kubernetes::client_config(self.kubeconfig.as_deref()).await?
        else {
            anyhow::bail!(
                "no cluster to read the fence configuration from: give --kubeconfig, set KUBECONFIG, or read files with --from DIR"
            );
        };
        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = nodekeeper::kubernetes::build_client(config)?;
        nodekeeper::kubernetes::fencing::load_fence_objects(&client, &namespace, node)
            .await
            .with_context(|| format!("reading the fence configuration in namespace {namespace}"))
    }

    /// What the operator allowed beyond the safe defaults.
    pub fn policy(&self) -> nodekeeper::fencing::config::ResolvePolicy {
        nodekeeper::fencing::config::ResolvePolicy {
            allowed_options: self
                .allowed_options
                .iter()
                .map(|option| option.replace('-', "_"))
                .collect(),
        }
    }

    pub fn runner_settings(&self) -> nodekeeper::fencing::RunnerSettings {
        nodekeeper::fencing::RunnerSettings {
            agents_dir: self.agents_dir.clone(),
            call_timeout: self.timeout,
            ..nodekeeper::fencing::RunnerSettings::default()
        }
    }
}

/// A Go-style duration (`90s`, `1m30s`) as a positive `std::time::Duration`.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let duration = nodekeeper::config::GoDuration::parse(text).map_err(|e| e.to_string())?;
    if duration.is_negative() || duration.is_zero() {
        return Err(format!("{text:?} must be a positive duration"));
    }
    Ok(duration.to_std())
}

/// Logs to stderr, filtered by `RUST_LOG` (else `default`), for the one-shot commands.
pub fn init_stderr_logging(default: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(colored_logs())
        .init();
}

/// Raises the soft limit on open files to the hard one (as Go programs, the kubelet
/// among them, do at start), logging what came of it; `why` says what needs the files.
pub fn raise_open_files_limit(why: &str) {
    match nodekeeper::process::raise_open_files_limit() {
        Ok((from, to)) if from < to => {
            tracing::debug!(from, to, why, "raised the open files limit")
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, why, "cannot raise the open files limit"),
    }
}

/// Whether the log on stderr is colored: on a terminal, unless `NO_COLOR` is set to
/// anything (no-color.org), as a serial console or a log collector on a pty needs.
pub fn colored_logs() -> bool {
    colors(
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

fn colors(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
}

/// Runs a one-shot command's future on a current-thread runtime, logging to stderr at
/// `warn` unless `RUST_LOG` says otherwise.
pub fn block_on(
    command: impl std::future::Future<Output = anyhow::Result<std::process::ExitCode>>,
) -> anyhow::Result<std::process::ExitCode> {
    use anyhow::Context;
    init_stderr_logging("warn");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(command)
}

#[cfg(test)]
mod tests {
    use super::colors;

    #[test]
    fn no_color_set_to_anything_turns_colors_off_on_a_terminal() {
        assert!(colors(true, None));
        assert!(colors(true, Some("".as_ref())));
        assert!(!colors(true, Some("1".as_ref())));
        assert!(!colors(false, None));
    }
}
