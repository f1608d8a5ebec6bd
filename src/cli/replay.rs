//! `nodekeeper replay`: run a trace's steps through the eviction core's `synchronize`
//! with the step offsets as the clock, printing what the agent would have reported and
//! evicted at each step.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use nodekeeper::config::{AgentConfig, ConfigError, EvictionConfig, Overrides, load, parse_inline};
use nodekeeper::eviction::{EvictionState, Millis, SyncOptions, synchronize};
use nodekeeper::trace::{ParsedStep, TraceError, TraceFile};
use serde::Serialize;

/// Replay a trace through the eviction core and print one JSON line per step.
#[derive(clap::Args)]
#[command(after_help = "\
Each line holds the step offset, the node conditions after transition damping, the
thresholds met after grace periods and the pods evicted at that step, e.g. (one line)
  {\"at\":\"0s\",\"conditions\":[\"MemoryPressure\"],
   \"thresholdsMet\":[\"memory.available<1Gi\"],
   \"evicted\":[{\"namespace\":\"default\",\"name\":\"web-1\",
                \"signal\":\"memory.available\",\"gracePeriodSeconds\":1}]}

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
    let Replayed { lines, uncounted } = replay_file(&args.trace, args.config.as_deref())?;
    warn_uncounted(&uncounted);
    let mut out = std::io::stdout().lock();
    for line in lines {
        writeln!(out, "{}", line.to_json()).context("writing to standard output")?;
    }
    out.flush().context("writing to standard output")?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// Names the trace's inline config or the configuration file and the field.
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(
        "trace {trace}: steps[{index}].at: {at} is earlier than the previous step's {previous}; steps must be in time order"
    )]
    OutOfOrder {
        trace: String,
        index: usize,
        at: String,
        previous: String,
    },
    #[error("trace {trace}: it has no steps")]
    NoSteps { trace: String },
}

/// One output line of `nodekeeper replay`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayLine {
    /// The step offset, in Go duration form.
    pub at: String,
    /// Node conditions after transition damping, sorted by name.
    pub conditions: Vec<String>,
    /// Thresholds met after grace periods, as `signal<value>`, sorted.
    pub thresholds_met: Vec<String>,
    pub evicted: Vec<ReplayEviction>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayEviction {
    pub namespace: String,
    pub name: String,
    /// The threshold signal, or a local-storage label such as `ephemeralpodfs.limit`.
    pub signal: String,
    pub grace_period_seconds: i64,
}

impl ReplayLine {
    pub fn to_json(&self) -> String {
        // Plain strings and integers always serialize.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The configuration a trace is replayed with: its inline `config`, else the given
/// configuration file, else the built-in defaults.
pub fn trace_config(
    trace: &TraceFile,
    trace_name: &str,
    config_file: Option<&Path>,
) -> Result<AgentConfig, ReplayError> {
    let result = match (&trace.config, config_file) {
        (Some(inline), _) => parse_inline(inline, &format!("{trace_name}: config")),
        (None, Some(path)) => super::load_config(Some(path), &Overrides::default()),
        // The same defaults the agent starts with when it has no file.
        (None, None) => load(None, &Overrides::default()),
    };
    Ok(result?)
}

/// Parse every step and check they are in time order.
pub fn parse_steps(trace: &TraceFile, trace_name: &str) -> Result<Vec<ParsedStep>, ReplayError> {
    let steps = trace.parsed_steps(trace_name)?;
    for (index, pair) in steps.windows(2).enumerate() {
        if pair[1].at < pair[0].at {
            return Err(ReplayError::OutOfOrder {
                trace: trace_name.to_string(),
                index: index + 1,
                at: pair[1].at.to_string(),
                previous: pair[0].at.to_string(),
            });
        }
    }
    Ok(steps)
}

/// Run the steps in order. Each step's pod list is authoritative: a pod evicted at one
/// step that is listed again at the next is simply still there. (The agent records the
/// pods it may choose, without those it evicted that have ended but are still listed, so
/// the replay of its own trace makes its decisions.)
pub fn replay(
    config: &EvictionConfig,
    steps: &[ParsedStep],
    options: &SyncOptions,
) -> Vec<ReplayLine> {
    let mut state = EvictionState::default();
    steps
        .iter()
        .map(|step| {
            let now = Millis::from_duration(step.at);
            let decision =
                synchronize(config, &state, &step.observations, &step.pods, now, options);
            state = decision.state;
            let mut thresholds_met: Vec<String> = decision
                .thresholds_met
                .iter()
                .map(|t| t.describe())
                .collect();
            thresholds_met.sort();
            thresholds_met.dedup();
            let mut conditions: Vec<String> =
                decision.conditions.iter().map(|c| c.to_string()).collect();
            conditions.sort();
            ReplayLine {
                at: step.at.to_string(),
                conditions,
                thresholds_met,
                evicted: decision
                    .evictions
                    .into_iter()
                    .map(|order| ReplayEviction {
                        signal: order.reason.label().to_string(),
                        namespace: order.namespace,
                        name: order.name,
                        grace_period_seconds: order.grace_period_seconds,
                    })
                    .collect(),
            }
        })
        .collect()
}

/// What `nodekeeper replay` prints, and the pods it warns about.
pub struct Replayed {
    pub lines: Vec<ReplayLine>,
    /// Pods with stats but no process count, by key, when a threshold ranks by the count
    /// (for [`warn_uncounted`]).
    pub uncounted: Vec<String>,
}

/// Load, configure and replay a trace file.
pub fn replay_file(trace_path: &Path, config_file: Option<&Path>) -> Result<Replayed, ReplayError> {
    let trace_name = trace_path.display().to_string();
    let trace = TraceFile::from_path(trace_path)?;
    let config = trace_config(&trace, &trace_name, config_file)?;
    let steps = parse_steps(&trace, &trace_name)?;
    let uncounted = if config.eviction.ranks_by_process_count() {
        uncounted_pods(&steps)
    } else {
        Vec::new()
    };
    let lines = replay(
        &config.eviction,
        &steps,
        &SyncOptions::for_paths(&config.paths, false),
    );
    Ok(Replayed { lines, uncounted })
}

/// Says on stderr which pods a PID ranking would count as running no process, because
/// the trace has no count for them. The agent records counts only when it has a
/// `pid.available` threshold, so a trace it recorded without one, read with one, would
/// rank all its pods as if they ran nothing.
pub fn warn_uncounted(uncounted: &[String]) {
    const NAMED: usize = 10;
    if uncounted.is_empty() {
        return;
    }
    let shown: Vec<&str> = uncounted.iter().take(NAMED).map(String::as_str).collect();
    let mut named = shown.join(", ");
    if uncounted.len() > NAMED {
        named.push_str(&format!(" and {} more", uncounted.len() - NAMED));
    }
    eprintln!(
        "warning: the trace records no process count for {named} (the agent records counts only when it has a pid.available threshold, and only those it could read); a pid.available threshold ranks them as running 0 processes"
    );
}

/// The pods with stats but no process count in any of `steps`.
pub fn uncounted_pods(steps: &[ParsedStep]) -> Vec<String> {
    let keys: std::collections::BTreeSet<String> = steps
        .iter()
        .flat_map(|step| &step.pods)
        .filter(|pod| pod.has_stats() && pod.usage.pids.is_none())
        .map(|pod| pod.key())
        .collect();
    keys.into_iter().collect()
}

/// The pods of a trace's last step and the configuration it is read with, for
/// `nodekeeper rank`.
pub fn last_step(
    trace_path: &Path,
    config_file: Option<&Path>,
) -> Result<(ParsedStep, AgentConfig), ReplayError> {
    let trace_name = trace_path.display().to_string();
    let trace = TraceFile::from_path(trace_path)?;
    let config = trace_config(&trace, &trace_name, config_file)?;
    let mut steps = parse_steps(&trace, &trace_name)?;
    let last = steps
        .pop()
        .ok_or(ReplayError::NoSteps { trace: trace_name })?;
    Ok((last, config))
}
