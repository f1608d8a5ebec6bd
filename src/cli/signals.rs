use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use nodekeeper::config;
use nodekeeper::signals::{SignalCollector, probe, report};

use super::{EvictionFlags, OutputFormat};

#[derive(clap::Args)]
#[command(
    after_help = "Exit status is 1 when a signal could not be read (the output names the file), else 0.\n\nExamples:\n  nodekeeper signals\n  nodekeeper signals --config config/agent.yaml --output json\n  nodekeeper signals --eviction-hard='memory.available<1Gi,nodefs.available<10%'"
)]
pub struct Args {
    /// Configuration file (KubeletConfiguration and/or AgentConfiguration); built-in defaults
    /// when omitted.
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// How to print the result: `table` for people, `json` for programs.
    #[arg(long, value_enum, default_value = "table")]
    pub output: OutputFormat,
    #[command(flatten)]
    pub eviction: EvictionFlags,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config = config::load(args.config.as_deref(), &args.eviction.overrides())?;
    let collector = SignalCollector::new(&config.paths);
    let collection = collector.collect();
    let support = probe(&config.paths);
    let rows = report::report_rows(&collection, &config.eviction.thresholds);
    let mut problems = collector.notes().to_vec();
    problems.extend(report::other_problems(&collection));
    let text = match args.output {
        OutputFormat::Table => {
            format!(
                "cgroup layout: {}\n\n{}",
                collector.describe_layout(),
                report::render_table(&rows, &collection.pressure, &support, &problems)
            )
        }
        OutputFormat::Json => {
            let mut json = report::render_json(&rows, &collection.pressure, &support, &problems);
            json["cgroupLayout"] =
                serde_json::to_value(collector.layout()).context("rendering the cgroup layout")?;
            serde_json::to_string_pretty(&json).context("rendering the report")? + "\n"
        }
    };
    // A reader that stops early (`| head`) is not an error worth a panic.
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            return Err(e).context("writing the report");
        }
        _ => {}
    }
    let signal_failed = collection.errors.iter().any(|e| e.signal().is_some());
    Ok(if signal_failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
