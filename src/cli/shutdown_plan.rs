use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use nodekeeper::config::{self, Overrides};
use nodekeeper::shutdown::plan::{ShutdownPlan, phases_from_config, plan};
use nodekeeper::shutdown::pod_list::{pods_from_path, pods_from_str};

use super::OutputFormat;

#[derive(clap::Args)]
#[command(
    after_help = "PODS is a YAML or JSON list of pods in the trace pod schema, or a trace file (its last step is used); `-` reads standard input.\n\nExample:\n  nodekeeper shutdown-plan --config config/agent.yaml --output json pods.yaml"
)]
pub struct Args {
    /// Agent configuration file (shutdownGracePeriod, shutdownGracePeriodCriticalPods,
    /// shutdownGracePeriodByPodPriority); built-in defaults when omitted.
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// How to print the result: `table` for people, `json` for programs.
    #[arg(long, value_enum, default_value = "table")]
    pub output: OutputFormat,
    /// Pods to plan for.
    #[arg(value_name = "PODS")]
    pub pods: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config = config::load(args.config.as_deref(), &Overrides::default())?;
    let pods = if args.pods.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read pods from standard input")?;
        pods_from_str(&text, "standard input")?
    } else {
        pods_from_path(&args.pods)?
    };
    let shutdown_plan = plan(&phases_from_config(&config.shutdown), &pods);
    match args.output {
        OutputFormat::Json => println!("{}", serde_json::to_string(&shutdown_plan)?),
        OutputFormat::Table => print!("{}", render_table(&shutdown_plan)),
    }
    Ok(ExitCode::SUCCESS)
}

fn render_table(shutdown_plan: &ShutdownPlan) -> String {
    if shutdown_plan.phases.is_empty() {
        return "Graceful shutdown is disabled (shutdownGracePeriod is 0 and \
                shutdownGracePeriodByPodPriority is empty): the node shuts down immediately.\n"
            .to_string();
    }
    let mut rows = vec![[
        "PHASE".to_string(),
        "PRIORITY".to_string(),
        "BUDGET".to_string(),
        "POD".to_string(),
        "GRACE".to_string(),
    ]];
    for (index, phase) in shutdown_plan.phases.iter().enumerate() {
        let head = [
            (index + 1).to_string(),
            phase.priority.to_string(),
            format!("{}s", phase.seconds),
        ];
        if phase.pods.is_empty() {
            let [a, b, c] = head.clone();
            rows.push([a, b, c, "(no pods: skipped)".to_string(), String::new()]);
        }
        for (pod_index, pod) in phase.pods.iter().enumerate() {
            let [a, b, c] = if pod_index == 0 {
                head.clone()
            } else {
                Default::default()
            };
            rows.push([a, b, c, pod.key(), format!("{}s", pod.grace_period_seconds)]);
        }
    }
    let mut widths = [0usize; 5];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out.push_str(&format!(
        "\nTotal budget: {}s (sum of {} phases; logind's InhibitDelayMaxSec must be at least this)\n",
        shutdown_plan.total_seconds,
        shutdown_plan.phases.len()
    ));
    out
}
