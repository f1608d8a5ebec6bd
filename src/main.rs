//! The `nodekeeper` binary: command-line dispatch only.

mod cli;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

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
    /// Print the shell completion script for bash, zsh, fish, elvish or PowerShell.
    Completions(cli::completions::Args),
    /// Write the manual pages of every command into a directory.
    Manpages(cli::manpages::Args),
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
        Command::Completions(args) => cli::completions::run(args, Cli::command()),
        Command::Manpages(args) => cli::manpages::run(args, Cli::command()),
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every command and its subcommands, with their path (`controller status`).
    fn commands() -> Vec<(String, clap::Command)> {
        fn walk(prefix: &str, command: &clap::Command, out: &mut Vec<(String, clap::Command)>) {
            for sub in command.get_subcommands() {
                let path = format!("{prefix} {}", sub.get_name()).trim().to_string();
                out.push((path.clone(), sub.clone()));
                walk(&path, sub, out);
            }
        }
        let mut out = Vec::new();
        walk("", &super::Cli::command(), &mut out);
        out
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }

    #[test]
    fn every_option_and_argument_says_what_it_is_for() {
        let mut silent = Vec::new();
        for (path, command) in commands() {
            for arg in command.get_arguments() {
                let builtin = ["help", "version"].contains(&arg.get_id().as_str());
                if !builtin && arg.get_help().is_none() {
                    silent.push(format!("{path} {}", arg.get_id()));
                }
            }
        }
        assert!(silent.is_empty(), "without help text: {silent:?}");
    }

    #[test]
    fn every_config_option_also_takes_the_short_c() {
        let mut long_only = Vec::new();
        for (path, command) in commands() {
            for arg in command.get_arguments() {
                if arg.get_long() == Some("config") && arg.get_short() != Some('c') {
                    long_only.push(path.clone());
                }
            }
        }
        assert!(long_only.is_empty(), "--config without -c: {long_only:?}");
    }

    #[test]
    fn every_visible_command_shows_examples_in_its_help() {
        let mut without = Vec::new();
        for (path, mut command) in commands() {
            if command.is_hide_set() || path == "help" || path.starts_with("help ") {
                continue;
            }
            let help = command.render_long_help().to_string();
            if !help.contains("Example") {
                without.push(path);
            }
        }
        assert!(without.is_empty(), "no examples in --help: {without:?}");
    }
}
