use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use nodekeeper::config::Overrides;
use nodekeeper::pods::Pod;
use nodekeeper::shutdown::plan::{ShutdownPlan, phases_from_config, plan};
use nodekeeper::trace::{TraceFile, TracePod};

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
    let config = super::load_config(args.config.as_deref(), &Overrides::default())?;
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

// Pods given on the command line (here and to the hidden shutdown-manager): a YAML/JSON
// list in the trace format's pod schema, or a whole trace file whose last step is used.

#[derive(Debug, thiserror::Error)]
pub enum PodListError {
    #[error("cannot read pods from {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("pods in {source_name}: {message}")]
    Invalid {
        source_name: String,
        message: String,
    },
}

pub fn pods_from_path(path: &Path) -> Result<Vec<Pod>, PodListError> {
    let text = std::fs::read_to_string(path).map_err(|error| PodListError::Read {
        path: path.display().to_string(),
        error,
    })?;
    pods_from_str(&text, &path.display().to_string())
}

/// A top-level sequence is a pod list; a mapping is a trace file.
pub fn pods_from_str(text: &str, source_name: &str) -> Result<Vec<Pod>, PodListError> {
    let invalid = |message: String| PodListError::Invalid {
        source_name: source_name.to_string(),
        message,
    };
    let document: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(text).map_err(|e| invalid(e.to_string()))?;
    let trace_pods: Vec<TracePod> = match document {
        serde_yaml_ng::Value::Sequence(_) => {
            serde_yaml_ng::from_value(document).map_err(|e| invalid(e.to_string()))?
        }
        serde_yaml_ng::Value::Mapping(_) => {
            let trace = TraceFile::from_str(text, source_name)
                .map_err(|e| invalid(format!("not a pod list and not a trace file: {e}")))?;
            match trace.steps.last() {
                Some(step) => step.pods.clone(),
                None => return Err(invalid("the trace has no steps".to_string())),
            }
        }
        serde_yaml_ng::Value::Null => Vec::new(),
        _ => {
            return Err(invalid(
                "expected a list of pods or a trace file with steps".to_string(),
            ));
        }
    };
    trace_pods
        .iter()
        .enumerate()
        .map(|(index, pod)| pod.to_pod().map_err(|e| invalid(format!("[{index}]: {e}"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_plain_list_in_yaml_or_json() {
        let yaml = pods_from_str("- {namespace: a, name: b, priority: 7}\n", "x").unwrap();
        let json = pods_from_str(r#"[{"namespace":"a","name":"b","priority":7}]"#, "x").unwrap();
        assert_eq!(yaml, json);
        assert_eq!(yaml[0].priority, 7);
    }

    #[test]
    fn uses_the_last_step_of_a_trace() {
        let text = "steps:\n- at: 0s\n  pods: [{namespace: a, name: old}]\n- at: 10s\n  pods: [{namespace: a, name: new}]\n";
        let pods = pods_from_str(text, "t").unwrap();
        assert_eq!(pods.iter().map(Pod::key).collect::<Vec<_>>(), vec!["a/new"]);
    }

    #[test]
    fn names_the_source_and_index_of_a_bad_pod() {
        let error = pods_from_str("- {namespace: a, name: b}\n- {namespace: a}\n", "pods.yaml")
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("pods in pods.yaml:"), "{error}");
        assert!(error.contains("name"), "{error}");
        let error = pods_from_str("42", "p.json").unwrap_err().to_string();
        assert!(error.contains("expected a list of pods"), "{error}");
        let error = pods_from_str("steps: []\n", "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(error.contains("no steps"), "{error}");
    }
}
