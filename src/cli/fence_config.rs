use std::process::ExitCode;

use anyhow::Context;
use nodekeeper::fencing::{self, FenceRunner, report};

use super::{FenceSourceArgs, OutputFormat};

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  nodekeeper fence-config check --node worker-1 --from ./fencing/\n  nodekeeper fence-config check --node worker-1 --namespace nodekeeper --probe"
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Subcommand)]
pub enum Command {
    /// Print a node's merged fence plan; with --probe, check every method's device.
    Check(CheckArgs),
}

#[derive(clap::Args)]
#[command(
    after_help = "Reads fence-config-<node>, its fence-method-<method>-<node> ConfigMaps, their templates and the Secrets they reference. Prints every step, each alternative, each method with its agent and merged parameters (credentials as ***) and where each value came from. Checks every parameter against the agent's own metadata when the agent is installed here.\n\nExit status: 0 when the configuration is valid (and, with --probe, every device answered); 1 otherwise, with each error naming the ConfigMap, key and node.\n\nExamples:\n  nodekeeper fence-config check --node worker-1 --from ./fencing/\n  nodekeeper fence-config check --node worker-1 --namespace nodekeeper --probe\n  nodekeeper fence-config check --node worker-1 --from ./fencing/ --output json"
)]
pub struct CheckArgs {
    /// The node whose fence configuration to check.
    #[arg(long, value_name = "NAME")]
    pub node: String,
    #[command(flatten)]
    pub source: FenceSourceArgs,
    /// The fire drill: run every method's agent with `status` (or `monitor` where it has
    /// none) and report whether the device answered, accepted the credentials, and its
    /// power state. Never changes power.
    #[arg(long)]
    pub probe: bool,
    /// How to print the result: `table` for people, `json` for programs.
    #[arg(long, value_enum, default_value = "table")]
    pub output: OutputFormat,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Command::Check(args) = args.command;
    super::block_on(check(args))
}

async fn check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let objects = args.source.objects(&args.node).await?;
    let runner = FenceRunner::new(args.source.runner_settings());
    let (mut plan, mut errors): (_, Vec<String>) =
        match fencing::config::resolve_with(&objects, &args.node, &args.source.policy()) {
            Ok(plan) => (Some(plan), Vec::new()),
            Err(errors) => (None, errors.0.iter().map(ToString::to_string).collect()),
        };
    let mut agent_check = None;
    if let Some(plan) = plan.as_mut() {
        let found = fencing::check_agents(plan, &runner).await;
        errors.extend(found.problems());
        agent_check = Some(found);
    }
    let mut probes = Vec::new();
    let probe_skipped = args.probe && !errors.is_empty();
    if args.probe
        && errors.is_empty()
        && let Some(plan) = &plan
    {
        // One probe per method name: a method used by two steps is one device.
        let mut seen = Vec::new();
        for (_, method) in plan.methods() {
            if seen.contains(&&method.name) {
                continue;
            }
            seen.push(&method.name);
            probes.push(runner.probe(method).await);
        }
    }
    let failed = !errors.is_empty() || probes.iter().any(|p| !p.ok);

    match args.output {
        OutputFormat::Json => {
            let json = serde_json::json!({
                "node": args.node,
                "valid": errors.is_empty(),
                "plan": plan,
                "errors": errors,
                "warnings": plan.as_ref().map(|p| p.warnings.iter().map(ToString::to_string).collect::<Vec<_>>()).unwrap_or_default(),
                "notInstalled": agent_check.as_ref().map(|c| c.not_installed.clone()).unwrap_or_default(),
                "probe": if args.probe && !probe_skipped { Some(&probes) } else { None },
            });
            println!(
                "{}",
                serde_json::to_string_pretty(&json).context("rendering the result")?
            );
        }
        OutputFormat::Table => {
            if let Some(plan) = &plan {
                print!("{}", report::render_plan(plan, agent_check.as_ref()));
            }
            if !probes.is_empty() {
                println!("\nProbe (status only; power was not changed):");
                print!("{}", report::render_probe(&probes));
            }
            for error in &errors {
                eprintln!("error: {error}");
            }
            if probe_skipped {
                eprintln!("error: probe skipped: fix the configuration errors first");
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
