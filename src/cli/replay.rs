use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use nodekeeper::eviction::replay::replay_file;

/// Replay a trace through the eviction core and print one JSON line per step.
#[derive(clap::Args)]
#[command(after_help = "\
Each line holds the step offset, the node conditions after transition damping, the
thresholds met after grace periods and the pods evicted at that step, e.g.
  {\"at\":\"0s\",\"conditions\":[\"MemoryPressure\"],\"thresholdsMet\":[\"memory.available<1Gi\"],\"evicted\":[{\"namespace\":\"default\",\"name\":\"web-1\",\"signal\":\"memory.available\",\"gracePeriodSeconds\":1}]}

The trace's inline `config` wins over --config; without either the kubelet defaults apply.
The trace format is described in docs/trace-format.md.

Examples:
  nodekeeper replay incident.yaml
  nodekeeper replay --config /etc/nodekeeper/agent.yaml last-night.yaml | jq -c 'select(.evicted != [])'")]
pub struct Args {
    /// Configuration file to replay with when the trace has no inline `config`.
    #[arg(long, short, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Trace file, YAML or JSON.
    #[arg(value_name = "TRACE")]
    trace: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let lines = replay_file(&args.trace, args.config.as_deref())?;
    let mut out = std::io::stdout().lock();
    for line in lines {
        writeln!(out, "{}", line.to_json()).context("writing to standard output")?;
    }
    out.flush().context("writing to standard output")?;
    Ok(ExitCode::SUCCESS)
}
