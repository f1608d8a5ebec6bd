//! `agent --record FILE`: append every live observation to a trace that `replay` and
//! `rank` read, so a real incident can be replayed offline.
//!
//! The file is YAML: a `steps:` header, then one step per line in JSON flow style (valid
//! YAML), so appending never rewrites earlier steps and a crash loses at most one line.
//! At the size limit the file is renamed to `FILE.1` (replacing an older one) and a new
//! trace starts.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use prometheus_client::metrics::counter::Counter;

use crate::config::GoDuration;
use crate::pods::{ContainerKind, Pod};
use crate::signals::Observations;
use crate::trace::{
    Amount, TraceContainer, TraceEmptyDir, TracePod, TraceSignal, TraceStep, TraceStorage,
};

#[derive(Debug, thiserror::Error)]
#[error("trace recording {path}: {error}")]
pub struct RecordError {
    path: String,
    error: std::io::Error,
}

const HEADER: &[u8] = b"# nodekeeper trace recorded by `nodekeeper agent --record`\nsteps:\n";

pub struct Recorder {
    path: PathBuf,
    max_bytes: u64,
    file: Option<File>,
    /// Bytes of whole lines in the current file: where the next step starts.
    written: u64,
    /// Milliseconds on the agent clock at which the current file's trace started.
    started_at_ms: Option<u64>,
    /// Whether this recorder has made `path` its own, moving an earlier run's trace to
    /// `FILE.1`. From then on a file at `path` is this run's, and a failed start begins
    /// it again rather than rotating it over the earlier trace.
    claimed: bool,
    /// A write failed part-way through a line: the file is cut back to `written` before
    /// the next step.
    torn: bool,
    /// Steps not recorded since the last one that was: a run of failures is logged once.
    steps_lost: u64,
    failures: Counter,
}

impl Recorder {
    pub fn new(path: PathBuf, max_bytes: u64) -> Self {
        Recorder {
            path,
            max_bytes: max_bytes.max(4096),
            file: None,
            written: 0,
            started_at_ms: None,
            claimed: false,
            torn: false,
            steps_lost: 0,
            failures: Counter::default(),
        }
    }

    /// Count every step that could not be recorded in `failures` (the agent's
    /// `nodekeeper_state_write_errors_total{file="trace"}`).
    pub fn count_failures_in(&mut self, failures: Counter) {
        self.failures = failures;
    }

    fn error(&self, error: std::io::Error) -> RecordError {
        RecordError {
            path: self.path.display().to_string(),
            error,
        }
    }

    /// Start a trace at `path`: a new recorder always starts a new trace (step offsets
    /// restart at zero), so a file an earlier run left there is rotated away rather than
    /// appended to.
    fn start_file(&mut self, now_ms: u64) -> Result<(), RecordError> {
        // A file with no step (an earlier run that could not even write its header, on a
        // full disk) is not worth keeping, and must not replace a real trace in FILE.1.
        if !self.claimed && holds_a_step(&self.path) {
            self.rotate_file()?;
        }
        self.claimed = true;
        let mut file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&self.path)
            .map_err(|e| self.error(e))?;
        file.write_all(HEADER).map_err(|e| self.error(e))?;
        self.written = HEADER.len() as u64;
        self.torn = false;
        self.file = Some(file);
        self.started_at_ms = Some(now_ms);
        Ok(())
    }

    fn rotate_file(&self) -> Result<(), RecordError> {
        let rotated = rotated_path(&self.path);
        std::fs::rename(&self.path, rotated).map_err(|e| self.error(e))
    }

    /// Append one step. A failure is counted, and logged once for a run of failures
    /// (a warning naming the file and the error, then how many steps were lost when
    /// recording resumes); it is not returned, since recording never stops the agent from
    /// protecting the node.
    pub fn record_or_log(&mut self, now_ms: u64, observations: &Observations, pods: &[Pod]) {
        match self.record(now_ms, observations, pods) {
            Ok(()) if self.steps_lost > 0 => {
                tracing::info!(
                    path = %self.path.display(),
                    steps_lost = self.steps_lost,
                    "trace recording resumed"
                );
                self.steps_lost = 0;
            }
            Ok(()) => {}
            Err(error) => {
                if self.steps_lost == 0 {
                    tracing::warn!(%error, "cannot record trace steps; retrying every cycle");
                } else {
                    tracing::debug!(%error, "trace step not recorded");
                }
                self.steps_lost += 1;
            }
        }
    }

    /// Append one step, or say why not (the failure counted). The file stays a readable
    /// trace either way: a step is in it whole or not at all.
    pub fn record(
        &mut self,
        now_ms: u64,
        observations: &Observations,
        pods: &[Pod],
    ) -> Result<(), RecordError> {
        let result = self.append(now_ms, observations, pods);
        if result.is_err() {
            self.failures.inc();
        }
        result
    }

    fn append(
        &mut self,
        now_ms: u64,
        observations: &Observations,
        pods: &[Pod],
    ) -> Result<(), RecordError> {
        if self.file.is_none() {
            self.start_file(now_ms)?;
        }
        if self.torn {
            self.cut_torn_line()?;
        }
        let started = self.started_at_ms.unwrap_or(now_ms);
        let step = trace_step(now_ms.saturating_sub(started), observations, pods);
        let mut line = String::from("- ");
        line.push_str(&serde_json::to_string(&step).map_err(|e| self.error(e.into()))?);
        line.push('\n');
        // A step larger than the limit on its own still goes into a file of its own,
        // whole: a trace file holds at least one step.
        let has_steps = self.written > HEADER.len() as u64;
        if has_steps && self.written + line.len() as u64 > self.max_bytes {
            // Rotated first: while the rename fails, the steps stay where they are and
            // the rotation is tried again at the next step.
            self.rotate_file()?;
            self.file = None;
            self.start_file(now_ms)?;
            return self.append(now_ms, observations, pods);
        }
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        if let Err(error) = file.write_all(line.as_bytes()) {
            // A full disk may have taken part of the line: cut it off, so the file
            // still reads as a trace and the next step starts a line of its own.
            self.torn = true;
            let _ = self.cut_torn_line();
            return Err(self.error(error));
        }
        self.written += line.len() as u64;
        Ok(())
    }

    /// Cut the current file back to its whole lines.
    fn cut_torn_line(&mut self) -> Result<(), RecordError> {
        let written = self.written;
        let cut = match self.file.as_mut() {
            Some(file) => file
                .set_len(written)
                .and_then(|()| file.seek(SeekFrom::Start(written)).map(|_| ())),
            None => Ok(()),
        };
        cut.map_err(|e| self.error(e))?;
        self.torn = false;
        Ok(())
    }
}

/// Whether the trace at `path` has at least one step (a line starting `- ` after the
/// header, which comes first); only its beginning is read.
fn holds_a_step(path: &Path) -> bool {
    use std::io::Read;
    let mut beginning = Vec::new();
    let read = File::open(path).and_then(|file| file.take(64 * 1024).read_to_end(&mut beginning));
    read.is_ok() && beginning.windows(3).any(|window| window == b"\n- ")
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
    let mut traced = TracePod {
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
        // The containers and emptyDirs too: their limits evict a pod at once, and the
        // containers word the eviction's message; a replay without them would do neither.
        containers: pod
            .containers
            .iter()
            .map(|container| TraceContainer {
                name: container.name.clone(),
                kind: match container.kind {
                    ContainerKind::Regular => None,
                    ContainerKind::Init => Some("init".to_string()),
                    ContainerKind::Sidecar => Some("sidecar".to_string()),
                },
                requests: quantities(&container.requests),
                limits: quantities(&container.limits),
                usage: amounts(&[
                    ("memory", container.usage.memory),
                    ("rootfs", container.usage.rootfs),
                    ("logs", container.usage.logs),
                ]),
            })
            .collect(),
        empty_dirs: pod
            .empty_dirs
            .iter()
            .map(|volume| TraceEmptyDir {
                name: volume.name.clone(),
                size_limit: volume.size_limit.map(|limit| Amount(limit.to_string())),
                used: volume.used.map(Amount::from),
                // Memory and huge pages alike are not the node's disk, all that the
                // decisions ask of the medium.
                medium: volume.memory_backed.then(|| "Memory".to_string()),
            })
            .collect(),
        cgroup: None,
    };
    // A pod whose cgroup was found but none of whose figures could be read (a workload
    // whose cgroup the kernel was removing, its memory files gone before the rest, or
    // one removed and made again between the read and the look; a file the kernel would
    // not give) was ranked as having stats: its cgroup says so on replay, which would
    // otherwise rank it first as a pod without stats.
    if !records_a_figure(&traced) {
        traced.cgroup = pod
            .cgroup
            .as_ref()
            .map(|cgroup| cgroup.display().to_string());
    }
    traced
}

/// Whether `pod` as recorded carries a figure, which reads back as stats.
fn records_a_figure(pod: &TracePod) -> bool {
    !pod.usage.is_empty()
        || pod.storage.is_some()
        || pod
            .containers
            .iter()
            .any(|container| !container.usage.is_empty())
        || pod.empty_dirs.iter().any(|volume| volume.used.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::{Observation, Signal};
    use crate::trace::{ParsedStep, TraceFile};

    /// The steps of the trace at `path`, which must read as one.
    fn steps_in(path: &Path) -> Vec<ParsedStep> {
        TraceFile::from_path(path)
            .unwrap()
            .parsed_steps("the trace")
            .unwrap()
    }

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
        let steps = steps_in(&path);
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

    /// A workload whose cgroup the agent found but could read no figure of (being
    /// removed, or removed and made again, as `eviction_cgroup_e2e.rs` meets on a real
    /// kernel) has stats and ranks as using nothing; a pod with no cgroup and no figure
    /// has none and ranks first. Replayed, the record must rank them as the
    /// agent did: both read back as they were, and the replayed memory ranking matches.
    #[test]
    fn a_pod_found_without_figures_reads_back_with_stats() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("incident.yaml");
        let mut recorder = Recorder::new(path.clone(), 1 << 20);
        let pod = |name: &str, cgroup: Option<&str>, memory: Option<i64>| Pod {
            namespace: "e2e".into(),
            name: name.into(),
            cgroup: cgroup.map(PathBuf::from),
            usage: crate::pods::PodUsage {
                memory,
                ..Default::default()
            },
            ..Pod::default()
        };
        let live = [
            pod("found-unread", Some("pods/found-unread"), None),
            pod("running", Some("pods/running"), Some(10 << 20)),
            pod("not-found", None, None),
        ];
        recorder
            .record(1_000, &observations(1 << 30), &live)
            .unwrap();
        let recorded = TraceFile::from_path(&path).unwrap();
        let cgroups: Vec<Option<&str>> = recorded.steps[0]
            .pods
            .iter()
            .map(|pod| pod.cgroup.as_deref())
            .collect();
        assert_eq!(
            cgroups,
            [Some("pods/found-unread"), None, None],
            "only the pod found without figures names its cgroup"
        );
        let replayed = &steps_in(&path)[0].pods;
        let stats = |pods: &[Pod]| -> Vec<bool> { pods.iter().map(Pod::has_stats).collect() };
        assert_eq!(stats(replayed), stats(&live));
        assert_eq!(stats(replayed), [true, true, false]);
        let ranked = |pods: &[Pod]| -> Vec<String> {
            crate::eviction::rank(
                crate::signals::Signal::MemoryAvailable,
                crate::config::FilesystemLayout::SingleDisk,
                pods,
            )
            .iter()
            .map(|pod| pod.name.clone())
            .collect()
        };
        assert_eq!(ranked(replayed), ranked(&live));
        assert_eq!(ranked(replayed), ["not-found", "running", "found-unread"]);
    }

    /// A pod in Kubernetes mode carries its containers and emptyDirs: a container's own
    /// ephemeral-storage limit and an emptyDir's sizeLimit evict it at once, and the
    /// containers word the eviction's message. Recorded and read back, the pod is the one
    /// the agent decided on (its cgroup aside: the figures stand for it), so a replay
    /// decides and words as the agent did.
    #[test]
    fn containers_and_empty_dirs_read_back_as_the_agent_saw_them() {
        use crate::pods::{ContainerStats, ContainerUsage, EmptyDirStats, ResourceAmounts};
        use crate::quantity::Quantity;
        let amounts = |memory: Option<&str>, storage: Option<&str>| {
            let mut amounts = ResourceAmounts::default();
            if let Some(memory) = memory.map(|text| Quantity::parse(text).unwrap()) {
                amounts.memory = Some(memory.value());
                amounts.formats.memory = memory.format();
            }
            if let Some(storage) = storage.map(|text| Quantity::parse(text).unwrap()) {
                amounts.ephemeral_storage = Some(storage.value());
                amounts.formats.ephemeral_storage = storage.format();
            }
            amounts
        };
        let container = |name: &str, kind, requests, limits, usage| ContainerStats {
            name: name.into(),
            kind,
            requests,
            limits,
            usage,
        };
        let live = Pod {
            namespace: "shop".into(),
            name: "web-1".into(),
            uid: Some("0b5e".into()),
            requests: amounts(Some("1G"), None),
            limits: amounts(None, Some("1Gi")),
            usage: crate::pods::PodUsage {
                memory: Some(300 << 20),
                ..Default::default()
            },
            containers: vec![
                container(
                    "setup",
                    ContainerKind::Init,
                    ResourceAmounts::default(),
                    ResourceAmounts::default(),
                    ContainerUsage::default(),
                ),
                container(
                    "proxy",
                    ContainerKind::Sidecar,
                    amounts(Some("64Mi"), None),
                    ResourceAmounts::default(),
                    ContainerUsage {
                        memory: Some(20 << 20),
                        ..Default::default()
                    },
                ),
                container(
                    "app",
                    ContainerKind::Regular,
                    amounts(Some("500M"), None),
                    amounts(None, Some("40k")),
                    ContainerUsage {
                        memory: Some(280 << 20),
                        rootfs: Some(30_000),
                        logs: Some(20_000),
                    },
                ),
            ],
            empty_dirs: vec![
                EmptyDirStats {
                    name: "scratch".into(),
                    size_limit: Some(Quantity::parse("1e3").unwrap()),
                    used: Some(4096),
                    memory_backed: false,
                },
                EmptyDirStats {
                    name: "shm".into(),
                    size_limit: Some(Quantity::parse("64Mi").unwrap()),
                    used: None,
                    memory_backed: true,
                },
            ],
            cgroup: Some(PathBuf::from("kubepods/burstable/pod0b5e")),
            ..Pod::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("incident.yaml");
        let mut recorder = Recorder::new(path.clone(), 1 << 20);
        recorder
            .record(1_000, &observations(1 << 30), std::slice::from_ref(&live))
            .unwrap();
        let read_back = &steps_in(&path)[0].pods[0];
        // Quantities compare by value: their formats, which the messages print, too.
        let size_limits = |pod: &Pod| -> Vec<Option<String>> {
            let shown = |volume: &EmptyDirStats| volume.size_limit.map(|q| q.to_string());
            pod.empty_dirs.iter().map(shown).collect()
        };
        assert_eq!(size_limits(read_back), size_limits(&live));
        assert_eq!(size_limits(read_back)[0].as_deref(), Some("1e3"));
        assert_eq!(
            read_back,
            &Pod {
                cgroup: None,
                ..live
            }
        );
    }

    #[test]
    fn a_step_larger_than_the_limit_gets_a_file_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.yaml");
        let mut recorder = Recorder::new(path.clone(), 4096);
        let pods: Vec<Pod> = (0..100)
            .map(|i| Pod {
                namespace: "default".into(),
                name: format!("web-{i}"),
                ..Pod::default()
            })
            .collect();
        recorder.record(0, &observations(1), &pods).unwrap();
        recorder.record(1000, &observations(2), &pods).unwrap();
        for file in [path.clone(), dir.path().join("t.yaml.1")] {
            let steps = steps_in(&file);
            assert_eq!(steps.len(), 1, "{}", file.display());
            assert_eq!(steps[0].pods.len(), 100);
        }
    }

    #[test]
    fn a_file_with_no_step_never_replaces_the_earlier_trace() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.yaml");
        let rotated = dir.path().join("t.yaml.1");
        std::fs::write(&rotated, "the earlier trace").unwrap();
        // What a run left that could write no more than its header (a full disk).
        std::fs::write(&path, HEADER).unwrap();
        let mut recorder = Recorder::new(path.clone(), 1 << 20);
        recorder.record(0, &observations(1), &[]).unwrap();
        assert_eq!(
            std::fs::read_to_string(&rotated).unwrap(),
            "the earlier trace"
        );
        let steps = steps_in(&path);
        assert_eq!(steps.len(), 1);
    }

    #[test]
    fn a_rotation_that_fails_keeps_the_steps_and_is_tried_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.yaml");
        let rotated = dir.path().join("t.yaml.1");
        let mut recorder = Recorder::new(path.clone(), 4096);
        let mut recorded = 0;
        while std::fs::metadata(&path).map_or(0, |m| m.len()) < 3500 {
            recorder
                .record(recorded * 1000, &observations(1), &[])
                .unwrap();
            recorded += 1;
        }
        // The rename onto FILE.1 fails while a directory with something in it is there.
        std::fs::create_dir(&rotated).unwrap();
        std::fs::write(rotated.join("in the way"), "").unwrap();
        let mut failed = 0;
        for i in 0..20 {
            if recorder
                .record((recorded + i) * 1000, &observations(1), &[])
                .is_err()
            {
                failed += 1;
            }
        }
        assert!(failed > 0, "the rotation was due and failed");
        let steps = steps_in(&path);
        assert!(
            steps.len() as u64 >= recorded,
            "{} of {recorded} steps kept",
            steps.len()
        );
        std::fs::remove_dir_all(&rotated).unwrap();
        recorder.record(100_000, &observations(1), &[]).unwrap();
        let kept = steps_in(&rotated);
        assert!(
            kept.len() as u64 >= recorded,
            "the steps moved to FILE.1 whole"
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
            let steps = steps_in(file);
            assert!(!steps.is_empty());
            assert_eq!(
                steps[0].at,
                GoDuration::ZERO,
                "each file restarts its clock"
            );
        }
    }
}
