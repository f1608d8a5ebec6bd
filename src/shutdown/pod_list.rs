//! Pods given on the command line or to the standalone manager: a YAML/JSON list in the
//! trace format's pod schema, or a whole trace file whose last step is used.

use std::path::Path;

use crate::pods::Pod;
use crate::trace::{TraceFile, TracePod};

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
