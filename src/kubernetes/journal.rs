//! The API writes the agent still owes, kept in a file (`kubernetes.stateFile`) so that an
//! agent killed while they wait (SIGKILL, an OOM kill, a crash) sends them when it starts
//! again instead of losing them: pod deletes and `DisruptionTarget` conditions (evictions,
//! shutdown terminations) and events. A delete lost that way would leave a pod the agent
//! already killed listed and not being deleted, to be restarted by the kubelet and chosen
//! again; its Evicted event would never say why it stopped. Node conditions and taints are
//! not kept: a restarted agent publishes them again from what it sees.
//!
//! The file is replaced whole at every change, without fsync: it must outlive the agent's
//! process, not the node. A reboot ends every pod with the pressure that chose it (and the
//! kubelet starts them again), so writes owed from an earlier boot are dropped unsent.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};

use super::outbox::{ApiAction, ConditionRecord, EventRecord, EventType, InvolvedObject, PodRef};
use crate::act::is_path_component;

/// The file's format; a file of another version is refused, naming both.
const VERSION: u32 = 1;
/// A larger file is not read: the outbox holds at most a few thousand writes.
const MAX_BYTES: u64 = 16 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{path}: {message}")]
pub struct JournalError {
    pub path: String,
    pub message: String,
}

/// What was found at start-up.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// The writes owed, in the order they were made (pod writes, then events).
    pub writes: Vec<ApiAction>,
    /// Writes dropped because the file is from an earlier boot.
    pub from_earlier_boot: usize,
    /// Why each write that could not be read was skipped.
    pub skipped: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JournalFile<W> {
    version: u32,
    /// The boot the writes were owed in; `None` when the agent could not read it.
    #[serde(default)]
    boot_id: Option<String>,
    /// Read one by one (as JSON values first), so that one write this agent cannot read
    /// costs only itself.
    writes: Vec<W>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase", deny_unknown_fields)]
enum Write {
    #[serde(rename_all = "camelCase")]
    PodCondition {
        pod: PodRef,
        condition_type: String,
        status: bool,
        reason: String,
        message: String,
        last_transition: SystemTime,
    },
    #[serde(rename_all = "camelCase")]
    PodDelete {
        pod: PodRef,
        grace_period_seconds: i64,
    },
    #[serde(rename_all = "camelCase")]
    Event {
        name: String,
        namespace: String,
        /// `Pod` or `Node`.
        involved_kind: String,
        involved_namespace: Option<String>,
        involved_name: String,
        involved_uid: String,
        warning: bool,
        reason: String,
        message: String,
        #[serde(default)]
        annotations: std::collections::BTreeMap<String, String>,
        count: i32,
        first_seen: SystemTime,
        last_seen: SystemTime,
    },
}

fn write_of(action: &ApiAction) -> Option<Write> {
    Some(match action {
        ApiAction::SetPodCondition { pod, condition } => Write::PodCondition {
            pod: pod.clone(),
            condition_type: condition.condition_type.clone(),
            status: condition.status,
            reason: condition.reason.clone(),
            message: condition.message.clone(),
            last_transition: condition.last_transition,
        },
        ApiAction::DeletePod {
            pod,
            grace_period_seconds,
        } => Write::PodDelete {
            pod: pod.clone(),
            grace_period_seconds: *grace_period_seconds,
        },
        ApiAction::CreateEvent(event) => Write::Event {
            name: event.name.clone(),
            namespace: event.namespace.clone(),
            involved_kind: event.involved.kind.to_string(),
            involved_namespace: event.involved.namespace.clone(),
            involved_name: event.involved.name.clone(),
            involved_uid: event.involved.uid.clone(),
            warning: event.event_type == EventType::Warning,
            reason: event.reason.clone(),
            message: event.message.clone(),
            annotations: event.annotations.clone(),
            count: event.count,
            first_seen: event.first_seen,
            last_seen: event.last_seen,
        },
        ApiAction::SetNodeConditions(_) | ApiAction::SetNodeTaints(_) => return None,
    })
}

/// `text` may name an API object: it becomes part of a request's path.
fn name(field: &str, text: String) -> Result<String, String> {
    if is_path_component(&text) && !text.contains(['?', '#', '%']) {
        Ok(text)
    } else {
        Err(format!("{field} {text:?} cannot name an API object"))
    }
}

fn pod_ref(index: usize, pod: PodRef) -> Result<PodRef, String> {
    let field = |part: &str| format!("writes[{index}].pod.{part}");
    Ok(PodRef {
        namespace: name(&field("namespace"), pod.namespace)?,
        name: name(&field("name"), pod.name)?,
        uid: name(&field("uid"), pod.uid)?,
    })
}

fn action_of(index: usize, write: Write) -> Result<ApiAction, String> {
    Ok(match write {
        Write::PodCondition {
            pod,
            condition_type,
            status,
            reason,
            message,
            last_transition,
        } => ApiAction::SetPodCondition {
            pod: pod_ref(index, pod)?,
            condition: ConditionRecord {
                condition_type,
                status,
                reason,
                message,
                last_transition,
                last_heartbeat: None,
            },
        },
        Write::PodDelete {
            pod,
            grace_period_seconds,
        } => ApiAction::DeletePod {
            pod: pod_ref(index, pod)?,
            grace_period_seconds,
        },
        Write::Event {
            name: event_name,
            namespace,
            involved_kind,
            involved_namespace,
            involved_name,
            involved_uid,
            warning,
            reason,
            message,
            annotations,
            count,
            first_seen,
            last_seen,
        } => {
            let field = |part: &str| format!("writes[{index}].{part}");
            let kind = match involved_kind.as_str() {
                "Pod" => "Pod",
                "Node" => "Node",
                other => {
                    return Err(format!(
                        "{} {other:?} is not Pod or Node",
                        field("involvedKind")
                    ));
                }
            };
            ApiAction::CreateEvent(EventRecord {
                name: name(&field("name"), event_name)?,
                namespace: name(&field("namespace"), namespace)?,
                involved: InvolvedObject {
                    kind,
                    namespace: involved_namespace
                        .map(|text| name(&field("involvedNamespace"), text))
                        .transpose()?,
                    name: name(&field("involvedName"), involved_name)?,
                    uid: involved_uid,
                },
                event_type: if warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason,
                message,
                annotations,
                count,
                first_seen,
                last_seen,
            })
        }
    })
}

/// The journal file of one agent, for one boot.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    boot_id: Option<String>,
    /// The outbox generation last written: an older one never overwrites it. Read
    /// without the lock, so that a push or a sender never waits on a write in progress.
    written: AtomicU64,
    /// The last write failed: the next look retries it whatever the generation.
    failing: AtomicBool,
    /// Held while the file is replaced, so that writes never interleave.
    writing: Mutex<()>,
    /// `nodekeeper_state_write_errors_total{file="api_writes"}`, once metrics are set.
    failures: OnceLock<Counter>,
}

impl Journal {
    /// The journal at `path` for the boot `boot_id` (`None`: unknown, so a file's boot
    /// is not checked).
    pub fn new(path: impl Into<PathBuf>, boot_id: Option<String>) -> Journal {
        Journal {
            path: path.into(),
            boot_id,
            written: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            writing: Mutex::new(()),
            failures: OnceLock::new(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Count failed writes in `counter` from now on.
    pub fn count_failures_in(&self, counter: Counter) {
        let _ = self.failures.set(counter);
    }

    fn error(&self, message: impl Into<String>) -> JournalError {
        JournalError {
            path: self.path.display().to_string(),
            message: message.into(),
        }
    }

    /// The writes owed by an earlier run of the agent in this boot. A missing file owes
    /// nothing; one from an earlier boot (or from an unknown boot, when this one's is
    /// known) is removed, its writes dropped and counted. A write that cannot be read is
    /// skipped and reported in [`Loaded::skipped`]; the others are kept. A file that is
    /// not a journal at all, or of another version, is an error.
    pub fn load(&self) -> Result<Loaded, JournalError> {
        let bytes = match std::fs::File::open(&self.path) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Loaded::default());
            }
            Err(error) => return Err(self.error(error.to_string())),
            Ok(file) => {
                use std::io::Read;
                let mut bytes = Vec::new();
                file.take(MAX_BYTES + 1)
                    .read_to_end(&mut bytes)
                    .map_err(|error| self.error(error.to_string()))?;
                if bytes.len() as u64 > MAX_BYTES {
                    return Err(self.error(format!("larger than {MAX_BYTES} bytes")));
                }
                bytes
            }
        };
        let file: JournalFile<serde_json::Value> = serde_json::from_slice(&bytes)
            .map_err(|error| self.error(format!("not a journal of API writes: {error}")))?;
        if file.version != VERSION {
            return Err(self.error(format!(
                "version {} is not the version this agent reads ({VERSION})",
                file.version
            )));
        }
        if let Some(ours) = &self.boot_id
            && file.boot_id.as_ref() != Some(ours)
        {
            let dropped = file.writes.len();
            self.remove()?;
            return Ok(Loaded {
                from_earlier_boot: dropped,
                ..Loaded::default()
            });
        }
        let mut loaded = Loaded::default();
        for (index, write) in file.writes.into_iter().enumerate() {
            match serde_json::from_value(write)
                .map_err(|error| format!("writes[{index}]: {error}"))
                .and_then(|write| action_of(index, write))
            {
                Ok(action) => loaded.writes.push(action),
                Err(message) => loaded.skipped.push(message),
            }
        }
        Ok(loaded)
    }

    fn remove(&self) -> Result<(), JournalError> {
        match std::fs::remove_file(&self.path) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                Err(self.error(error.to_string()))
            }
            _ => Ok(()),
        }
    }

    /// Whether the outbox at `generation` differs from what was last written, or the
    /// last write failed. Never waits.
    pub fn is_behind(&self, generation: u64) -> bool {
        self.failing.load(Ordering::SeqCst) || self.written.load(Ordering::SeqCst) != generation
    }

    /// Replace the file with `writes` (those [`ApiAction::kept_across_restart`]), the
    /// outbox's state at
    /// `generation`; remove it when none are owed. An older generation than the one
    /// written is skipped. A failure is logged (once until the next success) and
    /// counted, and the agent goes on: the writes are still queued in memory, and the
    /// next look retries.
    pub fn save<'a>(&self, generation: u64, writes: impl IntoIterator<Item = &'a ApiAction>) {
        let _writing = self
            .writing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let written = self.written.load(Ordering::SeqCst);
        let failing = self.failing.load(Ordering::SeqCst);
        if generation < written || (generation == written && !failing) {
            return;
        }
        let writes: Vec<Write> = writes.into_iter().filter_map(write_of).collect();
        let result = if writes.is_empty() {
            self.remove()
        } else {
            let file = JournalFile {
                version: VERSION,
                boot_id: self.boot_id.clone(),
                writes,
            };
            serde_json::to_vec(&file)
                .map_err(|error| self.error(error.to_string()))
                .and_then(|mut bytes| {
                    bytes.push(b'\n');
                    crate::state_file::replace_unsynced(&self.path, &bytes)
                        .map_err(|error| self.error(error.to_string()))
                })
        };
        match result {
            Ok(()) => {
                if failing {
                    tracing::info!(file = %self.path.display(), "the journal of API writes owed is written again");
                }
                self.written.store(generation, Ordering::SeqCst);
                self.failing.store(false, Ordering::SeqCst);
            }
            Err(error) => {
                if !failing {
                    tracing::error!(%error, "cannot keep the API writes owed; an agent restarted now would not send them");
                }
                if let Some(failures) = self.failures.get() {
                    failures.inc();
                }
                self.failing.store(true, Ordering::SeqCst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::outbox::tests::{condition, delete, event};
    use std::time::Duration;

    fn journal(dir: &Path, boot: &str) -> Journal {
        Journal::new(dir.join("run/api-writes.json"), Some(boot.to_string()))
    }

    fn node_conditions() -> ApiAction {
        ApiAction::SetNodeConditions(Vec::new())
    }

    #[test]
    fn owed_pod_writes_and_events_come_back_as_they_were_queued() {
        let dir = tempfile::tempdir().unwrap();
        let mut evicted = event("web.1", 2);
        if let ApiAction::CreateEvent(record) = &mut evicted {
            record
                .annotations
                .insert("starved_resource".into(), "memory".into());
            record.last_seen = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        }
        let owed = vec![condition("u1"), delete("u1", 1), evicted];
        let mut queued = owed.clone();
        queued.push(node_conditions());
        journal(dir.path(), "boot-a").save(1, &queued);
        let loaded = journal(dir.path(), "boot-a").load().unwrap();
        assert_eq!(loaded.writes, owed);
        assert_eq!(loaded.from_earlier_boot, 0);
    }

    #[test]
    fn nothing_owed_leaves_no_file_and_a_missing_file_owes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(dir.path(), "boot-a");
        journal.save(1, &[delete("u1", 30)]);
        assert!(journal.path().exists());
        journal.save(2, &[node_conditions()]);
        assert!(!journal.path().exists());
        assert_eq!(journal.load().unwrap(), Loaded::default());
    }

    #[test]
    fn an_older_generation_never_overwrites_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(dir.path(), "boot-a");
        journal.save(5, &[delete("u1", 30), delete("u2", 30)]);
        journal.save(4, &[delete("u1", 30)]);
        assert_eq!(journal.load().unwrap().writes.len(), 2);
        assert!(!journal.is_behind(5));
        assert!(journal.is_behind(6));
    }

    #[test]
    fn writes_owed_in_an_earlier_boot_are_dropped_and_their_file_removed() {
        let dir = tempfile::tempdir().unwrap();
        journal(dir.path(), "boot-a").save(1, &[delete("u1", 1), delete("u2", 1)]);
        let after_reboot = journal(dir.path(), "boot-b");
        assert_eq!(
            after_reboot.load().unwrap(),
            Loaded {
                from_earlier_boot: 2,
                ..Loaded::default()
            }
        );
        assert!(!after_reboot.path().exists());
        // An agent that cannot read its boot id keeps what the file owes.
        journal(dir.path(), "boot-a").save(1, &[delete("u1", 1)]);
        let unknown = Journal::new(after_reboot.path(), None);
        assert_eq!(unknown.load().unwrap().writes, vec![delete("u1", 1)]);
        // A file written without a boot id is from an unknown boot: not this one.
        unknown.save(1, &[delete("u1", 1)]);
        assert_eq!(after_reboot.load().unwrap().from_earlier_boot, 1);
        assert!(!after_reboot.path().exists());
    }

    #[test]
    fn a_corrupt_or_foreign_file_is_an_error_naming_the_file_and_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(dir.path(), "boot-a");
        std::fs::create_dir_all(journal.path().parent().unwrap()).unwrap();
        let cases = [
            ("{not json", "not a journal of API writes"),
            (
                r#"{"version":2,"writes":[]}"#,
                "version 2 is not the version this agent reads (1)",
            ),
            (
                r#"{"version":1,"bootId":"boot-a"}"#,
                "missing field `writes`",
            ),
        ];
        for (text, expected) in cases {
            std::fs::write(journal.path(), text).unwrap();
            let error = journal.load().unwrap_err();
            assert_eq!(error.path, journal.path().display().to_string());
            assert!(error.message.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn a_write_that_cannot_be_read_is_skipped_naming_it_and_the_others_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(dir.path(), "boot-a");
        std::fs::create_dir_all(journal.path().parent().unwrap()).unwrap();
        let good = r#"{"kind":"podDelete","pod":{"namespace":"shop","name":"pod-u1","uid":"u1"},"gracePeriodSeconds":1}"#;
        let bad = [
            (
                r#"{"kind":"podDelete","pod":{"namespace":"shop","name":"../../nodes/x","uid":"u"},"gracePeriodSeconds":1}"#,
                "writes[1].pod.name \"../../nodes/x\" cannot name an API object",
            ),
            (
                r#"{"kind":"podDelete","pod":{"namespace":"shop","name":"web","uid":""},"gracePeriodSeconds":1}"#,
                "writes[1].pod.uid \"\" cannot name an API object",
            ),
            (
                r#"{"kind":"podEvict","pod":{}}"#,
                "writes[1]: unknown variant `podEvict`",
            ),
            (
                r#"{"kind":"podDelete","pod":{"namespace":"shop","name":"web","uid":"u"},"gracePeriodSeconds":1,"force":true}"#,
                "writes[1]: unknown field `force`",
            ),
        ];
        for (write, expected) in bad {
            std::fs::write(
                journal.path(),
                format!(r#"{{"version":1,"bootId":"boot-a","writes":[{good},{write}]}}"#),
            )
            .unwrap();
            let loaded = journal.load().unwrap();
            assert_eq!(loaded.writes, vec![delete("u1", 1)], "{write}");
            assert_eq!(loaded.skipped.len(), 1, "{write}");
            assert!(loaded.skipped[0].contains(expected), "{:?}", loaded.skipped);
        }
    }

    #[test]
    fn a_failed_write_is_survived_and_the_next_one_retried() {
        let dir = tempfile::tempdir().unwrap();
        // The journal's directory is a file: every write fails.
        let blocked = dir.path().join("run");
        std::fs::write(&blocked, "").unwrap();
        let journal = journal(dir.path(), "boot-a");
        let failures = Counter::default();
        journal.count_failures_in(failures.clone());
        journal.save(1, &[delete("u1", 1)]);
        assert!(
            journal.is_behind(1),
            "a failed write is retried at the next look"
        );
        assert_eq!(failures.get(), 1);
        std::fs::remove_file(&blocked).unwrap();
        // Retried at the same generation: nothing else changed in the outbox.
        journal.save(1, &[delete("u1", 1)]);
        assert!(!journal.is_behind(1));
        assert_eq!(journal.load().unwrap().writes, vec![delete("u1", 1)]);
        assert_eq!(failures.get(), 1);
    }
}
