//! `agent --record FILE`: append every live observation to a trace that `replay` and
//! `rank` read, so a real incident can be replayed offline.
//!
//! The file is YAML: a `steps:` header, then one step per line in JSON flow style (valid
//! YAML), so appending never rewrites earlier steps and a crash loses at most one line.
//! At the size limit the file is renamed to `FILE.1` (replacing an older one) and a new
//! trace starts.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::config::GoDuration;
use crate::pods::Pod;
use crate::signals::Observations;
use crate::trace::{Amount, TracePod, TraceSignal, TraceStep, TraceStorage};

#[derive(Debug, thiserror::Error)]
#[error("trace recording {path}: {error}")]
pub struct RecordError {
    path: String,
    error: std::io::Error,
}

pub struct Recorder {
    path: PathBuf,
    max_bytes: u64,
    file: Option<File>,
    written: u64,
    /// Milliseconds on the agent clock at which the current file's trace started.
    started_at_ms: Option<u64>,
}

impl Recorder {
    pub fn new(path: PathBuf, max_bytes: u64) -> Self {
        Recorder {
            path,
            max_bytes: max_bytes.max(4096),
            file: None,
            written: 0,
            started_at_ms: None,
        }
    }

    fn error(&self, error: std::io::Error) -> RecordError {
        RecordError {
            path: self.path.display().to_string(),
            error,
        }
    }

    fn open(&mut self, now_ms: u64) -> Result<(), RecordError> {
        // A new recorder always starts a new trace: step offsets restart at zero, so an
        // existing file from an earlier run is rotated away rather than appended to.
        if self.path.exists() {
            self.rotate_file()?;
        }
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| self.error(e))?;
        let header = b"# nodekeeper trace recorded by `nodekeeper agent --record`\nsteps:\n";
        file.write_all(header).map_err(|e| self.error(e))?;
        self.written = header.len() as u64;
        self.file = Some(file);
        self.started_at_ms = Some(now_ms);
        Ok(())
    }

    fn rotate_file(&self) -> Result<(), RecordError> {
        let rotated = rotated_path(&self.path);
        std::fs::rename(&self.path, rotated).map_err(|e| self.error(e))
    }

    /// Append one step. Errors are returned for the caller to log; recording never
    /// stops the agent from protecting the node.
    pub fn record(
        &mut self,
        now_ms: u64,
        observations: &Observations,
        pods: &[Pod],
    ) -> Result<(), RecordError> {
        if self.file.is_none() {
            self.open(now_ms)?;
        }
        let started = self.started_at_ms.unwrap_or(now_ms);
        let step = trace_step(now_ms.saturating_sub(started), observations, pods);
        let mut line = String::from("- ");
        line.push_str(&serde_json::to_string(&step).map_err(|e| self.error(e.into()))?);
        line.push('\n');
        if self.written + line.len() as u64 > self.max_bytes {
            self.file = None;
            self.open(now_ms)?;
            return self.record(now_ms, observations, pods);
        }
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        let result = file.write_all(line.as_bytes());
        result.map_err(|e| self.error(e))?;
        self.written += line.len() as u64;
        Ok(())
    }
}

fn rotated_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

fn trace_step(offset_ms: u64, observations: &Observations, pods: &[Pod]) -> TraceStep {
    let at = GoDuration::from_nanos(
        i64::try_from(offset_ms.saturating_mul(1_000_000)).unwrap_or(i64::MAX),
    );
    TraceStep {
        at: at.to_string(),
        signals: observations
            .iter()
            .map(|(signal, o)| {
                (
                    signal.to_string(),
                    TraceSignal {
                        available: Amount::from(o.available),
                        capacity: Amount::from(o.capacity),
                    },
                )
            })
            .collect(),
        pods: pods.iter().map(trace_pod).collect(),
    }
}

fn trace_pod(pod: &Pod) -> TracePod {
    let amounts = |pairs: &[(&str, Option<i64>)]| -> BTreeMap<String, Amount> {
        pairs
            .iter()
            .filter_map(|(k, v)| v.map(|v| (k.to_string(), Amount::from(v))))
            .collect()
    };
    // Requests and limits as the pod spec wrote them (`1G`, `1Gi`), so that a replay
    // words its messages as the live agent did.
    let quantities = |amounts: &crate::pods::ResourceAmounts| -> BTreeMap<String, Amount> {
        [
            ("memory", amounts.memory_quantity()),
            ("ephemeral-storage", amounts.ephemeral_storage_quantity()),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_string(), Amount(v.to_string()))))
        .collect()
    };
    TracePod {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        priority: Some(pod.priority),
        termination_grace_period_seconds: pod.termination_grace_period_seconds,
        critical: pod.critical.then_some(true),
        requests: quantities(&pod.requests),
        limits: quantities(&pod.limits),
        usage: amounts(&[
            ("memory", pod.usage.memory),
            ("ephemeral-storage", pod.usage.ephemeral_storage),
            ("inodes", pod.usage.inodes),
            ("pids", pod.usage.pids),
        ]),
        storage: TraceStorage::from_usage(&pod.usage.storage),
        ..TracePod::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::{Observation, Signal};
    use crate::trace::TraceFile;

    fn observations(available: i64) -> Observations {
        [(
            Signal::MemoryAvailable,
            Observation {
                available,
                capacity: 8 << 30,
                sampled_at_ms: None,
            },
        )]
        .into_iter()
        .collect()
    }

    #[test]
    fn recorded_steps_read_back_as_a_trace() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("incident.yaml");
        let mut recorder = Recorder::new(path.clone(), 1 << 20);
        let decimal = crate::quantity::Quantity::parse("1G").unwrap().format();
        let pod = Pod {
            namespace: "default".into(),
            name: "web-1".into(),
            priority: 5,
            // A request the pod spec wrote as 1G, a limit of 1Gi.
            requests: crate::pods::ResourceAmounts {
                memory: Some(1_000_000_000),
                formats: crate::pods::AmountFormats {
                    memory: decimal,
                    ..Default::default()
                },
                ..Default::default()
            },
            limits: crate::pods::ResourceAmounts {
                ephemeral_storage: Some(1 << 30),
                ..Default::default()
            },
            usage: crate::pods::PodUsage {
                memory: Some(300 << 20),
                pids: Some(4),
                ephemeral_storage: Some(7 << 20),
                inodes: Some(30),
                storage: crate::pods::StorageUsage {
                    writable_layers: Some(crate::pods::DiskAmount {
                        bytes: 5 << 20,
                        inodes: 20,
                    }),
                    logs: Some(crate::pods::DiskAmount {
                        bytes: 2 << 20,
                        inodes: 10,
                    }),
                    local_volumes: None,
                },
            },
            ..Pod::default()
        };
        let usage = pod.usage;
        recorder
            .record(1_000, &observations(1 << 30), std::slice::from_ref(&pod))
            .unwrap();
        recorder
            .record(2_500, &observations(512 << 20), &[pod])
            .unwrap();
        let trace = TraceFile::from_path(&path).unwrap();
        let steps = trace.parsed_steps("incident.yaml").unwrap();
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0].at, GoDuration::ZERO);
        assert_eq!(steps[1].at, GoDuration::from_nanos(1_500_000_000));
        assert_eq!(
            steps[1].observations[&Signal::MemoryAvailable].available,
            512 << 20
        );
        assert_eq!(
            steps[1].pods[0].usage, usage,
            "every figure, storage parts included, reads back"
        );
        assert_eq!(steps[1].pods[0].priority, 5);
        let shown = |q: Option<crate::quantity::Quantity>| q.map(|q| q.to_string());
        let read = &steps[1].pods[0];
        assert_eq!(
            shown(read.requests.memory_quantity()).as_deref(),
            Some("1G")
        );
        assert_eq!(
            shown(read.limits.ephemeral_storage_quantity()).as_deref(),
            Some("1Gi")
        );
    }

    #[test]
    fn rotates_at_the_size_limit_and_keeps_both_files_readable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.yaml");
        let mut recorder = Recorder::new(path.clone(), 4096);
        for i in 0..100 {
            recorder
                .record(i * 1000, &observations(i as i64), &[])
                .unwrap();
        }
        let current = std::fs::metadata(&path).unwrap().len();
        assert!(current <= 4096, "{current}");
        let rotated = dir.path().join("t.yaml.1");
        for file in [&path, &rotated] {
            let trace = TraceFile::from_path(file).unwrap();
            let steps = trace.parsed_steps("t").unwrap();
            assert!(!steps.is_empty());
            assert_eq!(
                steps[0].at,
                GoDuration::ZERO,
                "each file restarts its clock"
            );
        }
    }
}
