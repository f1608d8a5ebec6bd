use std::process::ExitCode;

use anyhow::Context;
use k8s_openapi::jiff;
use nodekeeper::fencing::{self, FenceRunner, Step, report, run_step};

use super::{FenceSourceArgs, OutputFormat};

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  nodekeeper fence run --node worker-1 --step power-management --from ./fencing/\n  nodekeeper fence run --node worker-1 --step power-management --namespace nodekeeper --yes"
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Subcommand)]
pub enum Command {
    /// Carry out one fence step for one node by hand (prints the plan unless --yes).
    Run(RunArgs),
    /// Run one execution the fence controller hands a Kubernetes Job (the Job executor's
    /// container command); credentials are read from the mounted Secret volume.
    Execute(ExecuteArgs),
}

#[derive(clap::Args)]
#[command(
    after_help = "The Job executor's wrapper: the controller writes this command into each Job it creates. It reads the credentials the execution document names from the Secret volume, gives the agent every option on its standard input, confirms every off and on with status, and writes the outcome (JSON) to the result file, which Kubernetes reports as the container's termination message, and to standard output.\n\nExit status: 0 when the execution succeeded; 1 otherwise (the result file says why).\n\nExample (as a Job's container runs it):\n  nodekeeper fence execute --execution \"$(cat execution.json)\" --secrets-dir /run/nodekeeper/secrets"
)]
pub struct ExecuteArgs {
    /// The execution document (JSON) the controller wrote into the Job.
    #[arg(long, value_name = "JSON")]
    pub execution: String,
    /// Where the Secret volumes are mounted: one directory per Secret, one file per key.
    #[arg(long, value_name = "DIR", default_value = "/run/nodekeeper/secrets")]
    pub secrets_dir: std::path::PathBuf,
    /// Where the outcome is written (the container's terminationMessagePath).
    #[arg(long, value_name = "FILE", default_value = "/dev/termination-log")]
    pub result_file: std::path::PathBuf,
    /// Where the fence agents are installed in this image.
    #[arg(long, value_name = "DIR", default_value = fencing::runner::DEFAULT_AGENTS_DIR)]
    pub agents_dir: std::path::PathBuf,
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
    /// How to print the result: `table` for people, `json` for programs.
    #[arg(long, value_enum, default_value = "table")]
    pub output: OutputFormat,
}

fn parse_step(text: &str) -> Result<Step, String> {
    text.parse()
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.command {
        Command::Run(args) => super::block_on(run_fence_step(args)),
        Command::Execute(args) => super::block_on(execute_for_job(args)),
    }
}

/// The Job executor's wrapper. Every way it ends writes a result, so the controller
/// always learns why: a document it cannot read, a missing Secret key, an agent whose
/// metadata refuses the method, SIGTERM at the Job's deadline.
async fn execute_for_job(args: ExecuteArgs) -> anyhow::Result<ExitCode> {
    use fencing::ExecutionResult;
    use fencing::job::{JobExecution, encode_result};

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("watching for SIGTERM")?;
    let parsed = JobExecution::parse(&args.execution);
    // A document that cannot be read still gets a runner, for the uniform ending below.
    let runner = FenceRunner::new(match &parsed {
        Ok(execution) => execution.runner_settings(&args.agents_dir),
        Err(_) => fencing::RunnerSettings {
            agents_dir: args.agents_dir.clone(),
            ..fencing::RunnerSettings::default()
        },
    });
    let run = async {
        let execution = parsed.map_err(|e| e.to_string())?;
        execution.check_start(jiff::Timestamp::now())?;
        let mut method = execution
            .method_plan(&args.secrets_dir)
            .map_err(|e| format!("node {}, method {}: {e}", execution.node, execution.method))?;
        let metadata = runner
            .metadata(&method.agent)
            .await
            .map_err(|e| e.to_string())?;
        let problems = fencing::metadata::check_method(&mut method, &metadata, &execution.node);
        if !problems.is_empty() {
            let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
            return Err(problems.join("; "));
        }
        announce(&execution);
        Ok(fencing::execute(&runner, &method, execution.mode).await)
    };
    // SIGTERM (the Job's deadline, or its deletion) wins over anything about to start.
    let result = tokio::select! {
        biased;
        _ = terminate.recv() => {
            runner.kill_running();
            ExecutionResult::failed(
                "terminated (the Job's deadline passed or it was deleted): the running agent, if any, was killed; the outcome is unknown",
            )
        }
        outcome = run => match outcome {
            Ok(result) => result,
            Err(reason) => ExecutionResult::failed(reason),
        },
    };
    let text = encode_result(&result);
    println!("{text}");
    if let Err(error) = std::fs::write(&args.result_file, &text) {
        eprintln!(
            "warning: cannot write the result to {}: {error}",
            args.result_file.display()
        );
    }
    Ok(if result.succeeded {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// One line in the Job's log saying what runs, with no parameter values.
fn announce(execution: &fencing::job::JobExecution) {
    eprintln!(
        "node {}: method {} ({} {}, {:?})",
        execution.node, execution.method, execution.agent, execution.action, execution.mode
    );
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
