//! The `nodekeeper` binary: command-line dispatch only.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Keeps Kubernetes nodes alive under pressure and drains them cleanly on shutdown.
#[derive(Parser)]
#[command(name = "nodekeeper", version, about, long_about = None)]
#[command(
    after_help = "Examples:\n  nodekeeper agent --config config/agent.yaml\n  nodekeeper signals --output json\n  nodekeeper check-config /var/lib/kubelet/config.yaml"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the per-node agent: collect signals, evaluate thresholds, act, serve metrics.
    Agent(cli::agent::Args),
    /// Print this host's eviction signals once, with the thresholds they are compared to.
    Signals(cli::signals::Args),
    /// Validate a configuration file and print the effective settings.
    CheckConfig(cli::check_config::Args),
    /// Feed a recorded or hand-written trace through the eviction core, one JSON line per step.
    Replay(cli::replay::Args),
    /// Print the eviction order for one signal at the last step of a trace.
    Rank(cli::rank::Args),
    /// Print the graceful-shutdown phases for a set of pods.
    ShutdownPlan(cli::shutdown_plan::Args),
    /// Check a node's fence configuration (ConfigMaps of the node-fencing design); --probe
    /// runs a fire drill against every fence device.
    FenceConfig(cli::fence_config::Args),
    /// Carry out a fence step for a node by hand through ClusterLabs fence agents.
    Fence(cli::fence::Args),
    /// Print the NodeFence CustomResourceDefinition (YAML) for `kubectl apply -f -`.
    Crd(cli::crd::Args),
    /// Run the fence controller: fence lost nodes through fence agents, then release
    /// their pods.
    Controller(cli::controller::Args),
    /// Run only the graceful-shutdown manager in standalone mode (workload cgroups).
    #[command(hide = true)]
    ShutdownManager(cli::shutdown_manager::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Agent(args) => cli::agent::run(args),
        Command::Signals(args) => cli::signals::run(args),
        Command::CheckConfig(args) => cli::check_config::run(args),
        Command::Replay(args) => cli::replay::run(args),
        Command::Rank(args) => cli::rank::run(args),
        Command::ShutdownPlan(args) => cli::shutdown_plan::run(args),
        Command::FenceConfig(args) => cli::fence_config::run(args),
        Command::Fence(args) => cli::fence::run(args),
        Command::Crd(args) => cli::crd::run(args),
        Command::Controller(args) => cli::controller::run(args),
        Command::ShutdownManager(args) => cli::shutdown_manager::run(args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
