use std::process::ExitCode;

use anyhow::Context;
use nodekeeper::fencing::{self, FenceRunner, Step, report, run_step};

use super::{FenceSourceArgs, OutputFormat};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Subcommand)]
pub enum Command {
    /// Carry out one fence step for one node by hand (prints the plan unless --yes).
    Run(RunArgs),
}

#[derive(clap::Args)]
#[command(
    after_help = "The manual tool for when automation is off. Alternatives (a | b) are tried in order until one succeeds; within one, every method must succeed. An off counts only once the agent's status reports OFF; a reboot is a confirmed off, then on.\n\nExit status: 0 when the step succeeded (or, without --yes, the plan is valid); 1 otherwise.\n\nExamples:\n  nodekeeper fence run --node worker-1 --step power-management --from ./fencing/\n  nodekeeper fence run --node worker-1 --step power-management --from ./fencing/ --yes\n  nodekeeper fence run --node worker-1 --step recovery --namespace nodekeeper --yes"
)]
pub struct RunArgs {
    /// The node to fence.
    #[arg(long, value_name = "NAME")]
    pub node: String,
    /// The step to carry out.
    #[arg(long, value_parser = parse_step, value_name = "isolation|power-management|recovery")]
    pub step: Step,
    #[command(flatten)]
    pub source: FenceSourceArgs,
    /// Really run the agents; without it, only print what would be done.
    #[arg(long)]
    pub yes: bool,
    /// How long `status` may take to confirm an off or on the agent reported done.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = super::parse_duration)]
    pub verify_timeout: std::time::Duration,
    /// Table for people, JSON for programs.
    #[arg(long, value_enum, default_value = "table")]
    pub output: OutputFormat,
}

fn parse_step(text: &str) -> Result<Step, String> {
    text.parse()
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Command::Run(args) = args.command;
    super::block_on(run_fence_step(args))
}

async fn run_fence_step(args: RunArgs) -> anyhow::Result<ExitCode> {
    let objects = args.source.objects(&args.node).await?;
    let runner = FenceRunner::new(fencing::RunnerSettings {
        verify_timeout: args.verify_timeout,
        ..args.source.runner_settings()
    });
    let mut plan = fencing::config::resolve_with(&objects, &args.node, &args.source.policy())?;
    let check = fencing::check_agents(&mut plan, &runner).await;
    let problems = check.problems();
    if !problems.is_empty() {
        anyhow::bail!(problems.join("\nerror: "));
    }
    for warning in &plan.warnings {
        eprintln!("warning: {warning}");
    }
    let Some(step) = plan.step(args.step) else {
        anyhow::bail!(
            "node {}: ConfigMap {} has no {} step",
            plan.node,
            plan.config_map,
            args.step.property()
        );
    };
    if !args.yes {
        let mut text = String::new();
        report::render_step_plan(&mut text, step);
        match args.output {
            OutputFormat::Table => {
                println!("Would run on node {}:\n{text}", plan.node);
                println!("Nothing was done; add --yes to run these agents.");
            }
            OutputFormat::Json => {
                let json = serde_json::json!({"node": plan.node, "ran": false, "step": step});
                println!("{}", serde_json::to_string_pretty(&json)?);
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    // The agents run in process groups of their own, so Ctrl-C at the terminal does not
    // reach them: on SIGINT or SIGTERM, kill them before exiting.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("watching for SIGTERM")?;
    let result = tokio::select! {
        result = run_step(&runner, step) => result,
        _ = tokio::signal::ctrl_c() => {
            runner.kill_running();
            anyhow::bail!("interrupted: the running fence agents were killed; the step's outcome is unknown");
        }
        _ = terminate.recv() => {
            runner.kill_running();
            anyhow::bail!("terminated: the running fence agents were killed; the step's outcome is unknown");
        }
    };
    match args.output {
        OutputFormat::Table => print!("{}", report::render_step_result(&plan.node, &result)),
        OutputFormat::Json => {
            let json = serde_json::json!({"node": plan.node, "ran": true, "result": result});
            println!("{}", serde_json::to_string_pretty(&json)?);
        }
    }
    Ok(if result.succeeded {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
