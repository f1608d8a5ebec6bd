//! The pure part of isolation: what an instruction leads to from the current record,
//! whether the evidence shows the node isolated, and what the report says. No I/O.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::boot_clock::whole_millis;
use crate::report::protocol::{Instruction, IsolationReport, IsolationState};

/// After a failed isolation, how long before the controller's instruction is followed
/// again (it falls back to a power fence meanwhile; a retry every report would only
/// stop and kill over and over).
pub const RETRY_AFTER: Duration = Duration::from_secs(30);

/// A moment on both clocks: the wall time, which the report carries, and the boot
/// clock, which no wall-clock jump moves and on which every wait is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moment {
    pub wall: Timestamp,
    pub since_boot: Duration,
}

/// The isolation of this boot, as kept in the state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IsolationRecord {
    /// The boot it belongs to: the kubelet's runtime mask ends with the boot, and so
    /// does the isolation.
    pub boot_id: String,
    pub phase: RecordPhase,
    /// When the controller's instruction was first followed.
    pub requested_at: Timestamp,
    /// When `phase` began.
    pub since: Timestamp,
    /// The same moment on the boot clock, in milliseconds (the record ends with the
    /// boot, so it is this boot's clock): the pause before a failure is retried, and
    /// whether a failure answers the guardian's request, are counted on it. Absent in a
    /// record written by an agent from before this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_boot_millis: Option<u64>,
    /// The controller's reason.
    #[serde(default)]
    pub reason: String,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The controller's request this isolation answers.
    #[serde(default)]
    pub request: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RecordPhase {
    /// Begun: the kubelet is being stopped and the pods killed (a restarted agent goes
    /// on from the start; every step may be repeated).
    Isolating,
    Isolated,
    Failed,
}

impl IsolationRecord {
    pub fn new(boot_id: &str, reason: &str, request: u64, now: Moment) -> IsolationRecord {
        IsolationRecord {
            boot_id: boot_id.to_string(),
            phase: RecordPhase::Isolating,
            requested_at: now.wall,
            since: now.wall,
            since_boot_millis: Some(whole_millis(now.since_boot)),
            reason: reason.to_string(),
            message: None,
            request,
        }
    }

    /// Moves to `phase` (keeping `since` when it stays) with `message`.
    pub fn enter(&mut self, phase: RecordPhase, message: Option<String>, now: Moment) {
        if self.phase != phase {
            self.since = now.wall;
            self.since_boot_millis = Some(whole_millis(now.since_boot));
        }
        self.phase = phase;
        self.message = message;
    }

    /// When `phase` began, on the boot clock, if the record says.
    pub fn since_boot(&self) -> Option<Duration> {
        self.since_boot_millis.map(Duration::from_millis)
    }
}

/// What the agent does about one instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Nothing,
    /// Not done here, and why (the report says so, and the controller falls back).
    Refuse(String),
    /// Stop the kubelet and kill the pods (again, for a begun or failed isolation).
    Isolate {
        reason: String,
        request: u64,
    },
    /// The isolation as it stands answers this request too (a new request from the
    /// controller, for instance after it restarted).
    Adopt {
        request: u64,
    },
    /// Let the kubelet run again and forget the isolation.
    End,
}

/// The step for `instruction`, given the current record and, when this agent does not
/// isolate its node at all, why.
pub fn step_for(
    record: Option<&IsolationRecord>,
    instruction: &Instruction,
    refusal: Option<&str>,
    now: Moment,
) -> Step {
    match instruction {
        Instruction::Isolate { reason, request } => {
            let request = *request;
            let isolate = || Step::Isolate {
                reason: reason.clone(),
                request,
            };
            let Some(record) = record else {
                return match refusal {
                    Some(why) => Step::Refuse(why.to_string()),
                    None => isolate(),
                };
            };
            let new_request = record.request != request;
            match record.phase {
                // Under way or done: the checks go on by themselves.
                RecordPhase::Isolating | RecordPhase::Isolated if new_request => {
                    Step::Adopt { request }
                }
                RecordPhase::Isolating | RecordPhase::Isolated => Step::Nothing,
                // A failure is tried again for a new request at once, for the same one
                // after a pause on the boot clock (a wall-clock jump back would hold the
                // retry back for as long as the jump). A record that does not say when
                // on that clock (an older agent's) is past its pause.
                RecordPhase::Failed
                    if refusal.is_none()
                        && (new_request
                            || record
                                .since_boot()
                                .is_none_or(|since| now.since_boot >= since + RETRY_AFTER)) =>
                {
                    isolate()
                }
                RecordPhase::Failed if new_request => Step::Adopt { request },
                RecordPhase::Failed => Step::Nothing,
            }
        }
        Instruction::EndIsolation => match record {
            Some(_) => Step::End,
            None => Step::Nothing,
        },
    }
}

/// What the node shows at one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    pub checked_at: Timestamp,
    /// The same moment on the boot clock, which no wall-clock jump moves: how old the
    /// evidence is, for the guardian.
    pub checked_since_boot: std::time::Duration,
    /// The kubelet's unit is inactive (or failed) and masked.
    pub kubelet_stopped: bool,
    /// The unit's state, for the message when it is not.
    pub kubelet_state: String,
    /// Processes in the pods cgroup; `Err` when it cannot be read.
    pub pod_processes: Result<usize, String>,
}

impl Evidence {
    /// `Ok` when the node is isolated by this evidence, else what is wrong.
    pub fn holds(&self, unit: &str) -> Result<(), String> {
        let mut wrong = Vec::new();
        if !self.kubelet_stopped {
            wrong.push(format!(
                "{unit} is {} (it must be inactive and masked)",
                self.kubelet_state
            ));
        }
        match &self.pod_processes {
            Ok(0) => {}
            Ok(left) => wrong.push(format!("{left} pod process(es) still run")),
            Err(error) => wrong.push(format!("the pod processes cannot be counted: {error}")),
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join("; "))
        }
    }
}

/// The `isolation` part of the next report.
/// A refused request: why, since when, and which request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub why: String,
    pub since: Timestamp,
    pub request: u64,
}

pub fn report(
    record: Option<&IsolationRecord>,
    evidence: Option<&Evidence>,
    refused: Option<&Refused>,
) -> IsolationReport {
    let mut report = IsolationReport::default();
    if let Some(evidence) = evidence {
        report.checked_at = Some(evidence.checked_at);
        report.kubelet_stopped = evidence.kubelet_stopped;
        report.pod_processes = evidence
            .pod_processes
            .as_ref()
            .map_or(u32::MAX, |left| u32::try_from(*left).unwrap_or(u32::MAX));
    }
    match record {
        Some(record) => {
            report.state = match record.phase {
                RecordPhase::Isolating => IsolationState::Isolating,
                RecordPhase::Isolated => IsolationState::Isolated,
                RecordPhase::Failed => IsolationState::Failed,
            };
            report.since = Some(record.since);
            report.message = record.message.as_deref().map(bounded);
            report.request = record.request;
        }
        None => {
            if let Some(refused) = refused {
                report.state = IsolationState::Refused;
                report.since = Some(refused.since);
                report.message = Some(bounded(&refused.why));
                report.request = refused.request;
            }
        }
    }
    report
}

/// A message as the protocol carries it: printable ASCII, at most 512 bytes.
fn bounded(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .take(512)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wall(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("time")
    }

    /// `seconds` into the test on both clocks, as when the wall clock is not set.
    fn at(seconds: i64) -> Moment {
        Moment {
            wall: wall(seconds),
            since_boot: Duration::from_secs(
                1000 + u64::try_from(seconds).expect("not before the test"),
            ),
        }
    }

    fn isolate() -> Instruction {
        Instruction::Isolate {
            reason: "cut off from the API server".to_string(),
            request: 7,
        }
    }

    fn record(phase: RecordPhase, since: i64) -> IsolationRecord {
        let mut record = IsolationRecord::new("boot", "why", 7, at(0));
        record.enter(phase, None, at(since));
        record
    }

    #[test]
    fn an_instruction_to_isolate_is_followed_once_and_a_failure_is_retried_only_after_a_pause() {
        assert_eq!(
            step_for(None, &isolate(), None, at(0)),
            Step::Isolate {
                reason: "cut off from the API server".to_string(),
                request: 7,
            }
        );
        for phase in [RecordPhase::Isolating, RecordPhase::Isolated] {
            assert_eq!(
                step_for(Some(&record(phase, 0)), &isolate(), None, at(100)),
                Step::Nothing
            );
        }
        let failed = record(RecordPhase::Failed, 10);
        assert_eq!(
            step_for(Some(&failed), &isolate(), None, at(39)),
            Step::Nothing
        );
        assert!(matches!(
            step_for(Some(&failed), &isolate(), None, at(40)),
            Step::Isolate { .. }
        ));
    }

    /// The pause before a failure is tried again is counted on the boot clock: the wall
    /// clock set two hours forward does not end it early, nor set two hours back hold
    /// the retry back for two hours.
    #[test]
    fn a_wall_clock_jump_neither_hurries_nor_holds_back_the_retry_of_a_failure() {
        let failed = record(RecordPhase::Failed, 10);
        let jumped = |seconds: i64, jump: i64| Moment {
            wall: wall(seconds + jump),
            ..at(seconds)
        };
        let hours = 2 * 3600;
        assert_eq!(
            step_for(Some(&failed), &isolate(), None, jumped(39, hours)),
            Step::Nothing
        );
        assert!(matches!(
            step_for(Some(&failed), &isolate(), None, jumped(40, -hours)),
            Step::Isolate { .. }
        ));
        // An older agent's record, which does not say when on the boot clock, is retried.
        let older = IsolationRecord {
            since_boot_millis: None,
            ..failed
        };
        assert!(matches!(
            step_for(Some(&older), &isolate(), None, at(11)),
            Step::Isolate { .. }
        ));
    }

    #[test]
    fn a_record_keeps_when_its_phase_began_on_both_clocks_and_an_older_one_still_reads() {
        let record = record(RecordPhase::Failed, 10);
        assert_eq!(record.since, wall(10));
        assert_eq!(record.since_boot(), Some(Duration::from_secs(1010)));
        let mut kept = record.clone();
        kept.enter(RecordPhase::Failed, Some("again".to_string()), at(20));
        assert_eq!(
            kept.since_boot(),
            Some(Duration::from_secs(1010)),
            "the phase stayed"
        );
        let json = serde_json::to_value(&record).expect("json");
        assert_eq!(json["sinceBootMillis"], 1_010_000);
        let mut older = json.clone();
        older
            .as_object_mut()
            .expect("an object")
            .remove("sinceBootMillis");
        let read: IsolationRecord = serde_json::from_value(older).expect("an older record");
        assert_eq!(read.since_boot(), None);
        assert_eq!(read.since, wall(10));
    }

    #[test]
    fn a_new_request_is_answered_by_the_isolation_as_it_stands_and_retries_a_failure_at_once() {
        let again = Instruction::Isolate {
            reason: "the controller restarted".to_string(),
            request: 8,
        };
        for phase in [RecordPhase::Isolating, RecordPhase::Isolated] {
            assert_eq!(
                step_for(Some(&record(phase, 0)), &again, None, at(1)),
                Step::Adopt { request: 8 }
            );
        }
        assert!(matches!(
            step_for(Some(&record(RecordPhase::Failed, 0)), &again, None, at(1)),
            Step::Isolate { request: 8, .. }
        ));
        // An agent that refuses now still answers the new request with its failure.
        assert_eq!(
            step_for(
                Some(&record(RecordPhase::Failed, 0)),
                &again,
                Some("dry-run mode"),
                at(1)
            ),
            Step::Adopt { request: 8 }
        );
    }

    #[test]
    fn an_agent_that_does_not_isolate_says_why() {
        assert_eq!(
            step_for(None, &isolate(), Some("dry-run mode"), at(0)),
            Step::Refuse("dry-run mode".to_string())
        );
        // An isolation already done is kept, whatever changed since.
        assert_eq!(
            step_for(
                Some(&record(RecordPhase::Isolated, 0)),
                &isolate(),
                Some("dry-run mode"),
                at(0)
            ),
            Step::Nothing
        );
    }

    #[test]
    fn ending_applies_to_any_isolation_and_to_none_is_nothing() {
        assert_eq!(
            step_for(None, &Instruction::EndIsolation, None, at(0)),
            Step::Nothing
        );
        for phase in [
            RecordPhase::Isolating,
            RecordPhase::Isolated,
            RecordPhase::Failed,
        ] {
            assert_eq!(
                step_for(
                    Some(&record(phase, 0)),
                    &Instruction::EndIsolation,
                    None,
                    at(0)
                ),
                Step::End
            );
        }
    }

    #[test]
    fn the_evidence_holds_only_with_the_kubelet_held_down_and_no_pod_process() {
        let evidence = Evidence {
            checked_at: wall(0),
            checked_since_boot: std::time::Duration::ZERO,
            kubelet_stopped: true,
            kubelet_state: "inactive, masked".to_string(),
            pod_processes: Ok(0),
        };
        assert_eq!(evidence.holds("kubelet.service"), Ok(()));
        let running = Evidence {
            kubelet_stopped: false,
            kubelet_state: "active, loaded".to_string(),
            pod_processes: Ok(3),
            ..evidence.clone()
        };
        assert_eq!(
            running.holds("kubelet.service"),
            Err("kubelet.service is active, loaded (it must be inactive and masked); 3 pod process(es) still run".to_string())
        );
        let unreadable = Evidence {
            pod_processes: Err("permission denied".to_string()),
            ..evidence
        };
        assert!(unreadable.holds("kubelet.service").is_err());
    }

    #[test]
    fn the_report_shows_the_record_with_its_evidence_and_a_refusal_only_without_one() {
        let evidence = Evidence {
            checked_at: wall(5),
            checked_since_boot: std::time::Duration::ZERO,
            kubelet_stopped: true,
            kubelet_state: "inactive, masked".to_string(),
            pod_processes: Ok(0),
        };
        let shown = report(
            Some(&record(RecordPhase::Isolated, 4)),
            Some(&evidence),
            None,
        );
        assert!(shown.is_confirmed());
        assert_eq!(shown.since, Some(wall(4)));
        assert_eq!(shown.checked_at, Some(wall(5)));
        let unreadable = Evidence {
            pod_processes: Err("gone".to_string()),
            ..evidence
        };
        let shown = report(
            Some(&record(RecordPhase::Isolated, 4)),
            Some(&unreadable),
            None,
        );
        assert!(!shown.is_confirmed(), "an unreadable count is no evidence");
        let refused = Refused {
            why: "dry-run mode\n".to_string(),
            since: wall(1),
            request: 9,
        };
        let shown = report(None, None, Some(&refused));
        assert_eq!(shown.state, IsolationState::Refused);
        assert_eq!(shown.message.as_deref(), Some("dry-run mode?"));
        assert_eq!(shown.request, 9, "it names the request it refused");
        assert_eq!(report(None, None, None), IsolationReport::default());
    }
}
