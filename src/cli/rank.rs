use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use super::replay::last_step;
use anyhow::Context;
use nodekeeper::eviction::rank;
use nodekeeper::signals::Signal;

#[derive(Clone, Copy, clap::ValueEnum)]
enum Output {
    /// One `namespace/name` per line.
    Table,
    /// A JSON array of `namespace/name` strings.
    Json,
}

/// Print the eviction order for one signal at the last step of a trace.
#[derive(clap::Args)]
#[command(after_help = "\
Pods are listed first-evicted first, using the kubelet's ranking for the signal:
  memory.available, allocatableMemory.available: usage above request, priority, usage - request
  pid.available: priority, process count
  nodefs/imagefs/containerfs.available: usage above request, priority, usage - request
  *.inodesFree: the same, but inodes have no request, so in effect priority comes first
Disk signals count the parts of a pod's storage on their own filesystem: with one
filesystem all of it; when imagefsPath is set, nodefs.* counts logs and local volumes
and imagefs.*/containerfs.* the writable layers; when containerfsPath differs from it
too, nodefs.*/containerfs.* count all of it and imagefs.* nothing. The layout comes
from the trace's inline config, else --config.
Pods without any stats come first; a pod with stats but without the figure being
ranked counts it as 0. Ties go by namespace/name.
Critical pods (static, mirror, priority >= 2000000000) are never evicted, so they are
left out; a note on standard error names them.

Examples:
  nodekeeper rank --signal memory.available incident.yaml
  nodekeeper rank --signal nodefs.inodesFree --output json incident.yaml
  nodekeeper rank --signal imagefs.available --config /etc/nodekeeper/agent.yaml incident.yaml")]
pub struct Args {
    /// The eviction signal to rank for, e.g. memory.available or pid.available.
    #[arg(long, value_name = "SIGNAL", value_parser = parse_signal)]
    signal: Signal,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    output: Output,
    /// Configuration file (for the filesystem layout) when the trace has no inline
    /// `config`.
    #[arg(long, short, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Trace file, YAML or JSON; its last step is ranked.
    #[arg(value_name = "TRACE")]
    trace: PathBuf,
}

fn parse_signal(text: &str) -> Result<Signal, String> {
    text.parse().map_err(|error| {
        let known: Vec<&str> = Signal::ALL.iter().map(Signal::as_str).collect();
        format!("{error} (expected one of: {})", known.join(", "))
    })
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (step, config) = last_step(&args.trace, args.config.as_deref())?;
    if args.signal.resource() == nodekeeper::signals::Resource::Pids {
        super::replay::warn_uncounted(&super::replay::uncounted_pods(std::slice::from_ref(&step)));
    }
    let layout = config.paths.fs_layout();
    let (critical, ranked): (Vec<_>, Vec<_>) = rank(args.signal, layout, &step.pods)
        .into_iter()
        .partition(|pod| pod.is_critical());
    let keys: Vec<String> = ranked.iter().map(|pod| pod.key()).collect();
    let mut out = std::io::stdout().lock();
    match args.output {
        Output::Table => {
            for key in &keys {
                writeln!(out, "{key}").context("writing to standard output")?;
            }
        }
        Output::Json => {
            writeln!(out, "{}", serde_json::to_string(&keys)?)
                .context("writing to standard output")?;
        }
    }
    out.flush().context("writing to standard output")?;
    if !critical.is_empty() {
        let names: Vec<String> = critical.iter().map(|pod| pod.key()).collect();
        eprintln!(
            "note: critical pods are never evicted: {}",
            names.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}
