//! Where one attempt of one step stands, read from its recorded executions alone: which
//! method runs next (and whether it must first ask the device what an interrupted run
//! did), or which alternative won, or that all of them failed. The alternatives rule is
//! the fencing toolkit's (`fencing::step`); here it is replayed from the NodeFence status
//! instead of from results held in memory, so a restarted controller reads the same.

use crate::fencing::FenceAction;

use super::facts::MethodOutline;
use super::resource::{Execution, ExecutionKind, ExecutionResult, PowerSeen};

/// A method's action is done at most this often within one attempt: a second run only
/// after a `Verify` showed the first one (interrupted) had not taken effect.
pub const MAX_ACTS_PER_ATTEMPT: usize = 2;
/// An interrupted `Verify` (harmless: only `status`) is asked again up to this often.
pub const MAX_VERIFIES_PER_ATTEMPT: usize = 3;

/// What to do next in a step attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Run this method of this (1-based) alternative.
    Next {
        alternative: u32,
        method: MethodOutline,
        kind: ExecutionKind,
    },
    /// The alternative succeeded; `confirmed` when every method of it that turns
    /// something off had `status` prove it off.
    Succeeded {
        alternative: u32,
        confirmed: bool,
        methods: Vec<String>,
    },
    /// Every alternative failed.
    Failed,
}

/// How a method stands, given its executions in this attempt, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MethodState {
    NotStarted,
    NeedsVerify,
    /// Acting again is safe: a verify showed the interrupted act had no effect.
    ActAgain,
    Succeeded {
        off_confirmed: bool,
    },
    Failed,
}

/// The power state a method's action leaves the device in once it took effect, as far as
/// the fence is concerned: a reboot's fence is its confirmed off.
fn target(action: FenceAction) -> PowerSeen {
    match action {
        FenceAction::Off | FenceAction::Reboot => PowerSeen::Off,
        FenceAction::On => PowerSeen::On,
    }
}

fn method_state(method: &MethodOutline, runs: &[&Execution]) -> MethodState {
    let Some(last) = runs.last() else {
        return MethodState::NotStarted;
    };
    let acts = runs.iter().filter(|r| r.kind == ExecutionKind::Act).count();
    let Some(result) = last.result else {
        // Still running: the caller never asks while something runs.
        return MethodState::Failed;
    };
    match (last.kind, result) {
        (ExecutionKind::Act, ExecutionResult::Succeeded) => MethodState::Succeeded {
            off_confirmed: last.off_confirmed,
        },
        (ExecutionKind::Act, ExecutionResult::Failed | ExecutionResult::TimedOut) => {
            MethodState::Failed
        }
        (ExecutionKind::Act, ExecutionResult::Interrupted) => MethodState::NeedsVerify,
        (ExecutionKind::Verify, ExecutionResult::Succeeded) => {
            if last.power == Some(target(method.action)) {
                MethodState::Succeeded {
                    off_confirmed: target(method.action) == PowerSeen::Off,
                }
            } else if acts < MAX_ACTS_PER_ATTEMPT {
                MethodState::ActAgain
            } else {
                MethodState::Failed
            }
        }
        (ExecutionKind::Verify, ExecutionResult::Interrupted) => {
            let trailing_verifies = runs
                .iter()
                .rev()
                .take_while(|r| r.kind == ExecutionKind::Verify)
                .count();
            if trailing_verifies < MAX_VERIFIES_PER_ATTEMPT {
                MethodState::NeedsVerify
            } else {
                MethodState::Failed
            }
        }
        // The device could not say: whether the action took effect is unknown, so the
        // method failed; a retry after the backoff starts the step again.
        (ExecutionKind::Verify, ExecutionResult::Failed | ExecutionResult::TimedOut) => {
            MethodState::Failed
        }
    }
}

/// Replays the alternatives rule over `executions` (this step and attempt only).
pub fn progress(alternatives: &[Vec<MethodOutline>], executions: &[&Execution]) -> Progress {
    for (index, methods) in alternatives.iter().enumerate() {
        let alternative = index as u32 + 1;
        let mut any_succeeded = false;
        let mut failed = false;
        let mut confirmed = true;
        let mut turns_off = false;
        let mut ran = Vec::new();
        for method in methods {
            let runs: Vec<&Execution> = executions
                .iter()
                .copied()
                .filter(|e| e.alternative == alternative && e.method == method.name)
                .collect();
            let state = method_state(method, &runs);
            let kind = match state {
                MethodState::NotStarted | MethodState::ActAgain => Some(ExecutionKind::Act),
                MethodState::NeedsVerify => Some(ExecutionKind::Verify),
                _ => None,
            };
            if let Some(kind) = kind {
                return Progress::Next {
                    alternative,
                    method: method.clone(),
                    kind,
                };
            }
            ran.push(method.name.clone());
            let off = target(method.action) == PowerSeen::Off;
            turns_off |= off;
            match state {
                MethodState::Succeeded { off_confirmed } => {
                    any_succeeded = true;
                    if off && !off_confirmed {
                        confirmed = false;
                    }
                }
                _ => {
                    // A failed method that was allowed to fail still leaves whatever it
                    // was to turn off unproven.
                    if off {
                        confirmed = false;
                    }
                    if method.must_succeed {
                        failed = true;
                        break;
                    }
                }
            }
        }
        if !failed && any_succeeded {
            return Progress::Succeeded {
                alternative,
                confirmed: turns_off && confirmed,
                methods: ran,
            };
        }
    }
    Progress::Failed
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::controller::resource::{FenceStep, MethodAction};

    fn method(name: &str, action: FenceAction, must_succeed: bool) -> MethodOutline {
        MethodOutline {
            name: name.to_string(),
            agent: "fence_ipmilan".to_string(),
            action,
            must_succeed,
        }
    }

    fn run(
        alternative: u32,
        method: &str,
        kind: ExecutionKind,
        result: ExecutionResult,
        off_confirmed: bool,
        power: Option<PowerSeen>,
    ) -> Execution {
        Execution {
            name: format!("{method}-{kind:?}"),
            step: FenceStep::PowerManagement,
            attempt: 1,
            alternative,
            method: method.to_string(),
            agent: "fence_ipmilan".to_string(),
            kind,
            action: MethodAction::Off,
            started_at: Time(Timestamp::UNIX_EPOCH),
            finished_at: Some(Time(Timestamp::UNIX_EPOCH)),
            result: Some(result),
            off_confirmed,
            power,
            detail: None,
        }
    }

    #[test]
    fn the_first_method_of_the_first_alternative_starts() {
        let alternatives = vec![vec![method("ipmi", FenceAction::Off, true)]];
        assert_eq!(
            progress(&alternatives, &[]),
            Progress::Next {
                alternative: 1,
                method: method("ipmi", FenceAction::Off, true),
                kind: ExecutionKind::Act
            }
        );
    }

    #[test]
    fn an_interrupted_off_is_verified_not_repeated() {
        let alternatives = vec![vec![method("ipmi", FenceAction::Off, true)]];
        let lost = run(
            1,
            "ipmi",
            ExecutionKind::Act,
            ExecutionResult::Interrupted,
            false,
            None,
        );
        assert!(matches!(
            progress(&alternatives, &[&lost]),
            Progress::Next {
                kind: ExecutionKind::Verify,
                ..
            }
        ));
        let off = run(
            1,
            "ipmi",
            ExecutionKind::Verify,
            ExecutionResult::Succeeded,
            false,
            Some(PowerSeen::Off),
        );
        assert_eq!(
            progress(&alternatives, &[&lost, &off]),
            Progress::Succeeded {
                alternative: 1,
                confirmed: true,
                methods: vec!["ipmi".into()]
            }
        );
        // Still on: the interrupted off never happened, so it is done once more, once.
        let on = run(
            1,
            "ipmi",
            ExecutionKind::Verify,
            ExecutionResult::Succeeded,
            false,
            Some(PowerSeen::On),
        );
        assert!(matches!(
            progress(&alternatives, &[&lost, &on]),
            Progress::Next {
                kind: ExecutionKind::Act,
                ..
            }
        ));
        let lost_again = run(
            1,
            "ipmi",
            ExecutionKind::Act,
            ExecutionResult::Interrupted,
            false,
            None,
        );
        assert_eq!(
            progress(&alternatives, &[&lost, &on, &lost_again, &on]),
            Progress::Failed
        );
    }

    #[test]
    fn a_failed_alternative_moves_to_the_next_and_unconfirmed_success_is_not_a_fence() {
        let alternatives = vec![
            vec![method("ipmi", FenceAction::Off, true)],
            vec![method("pdu", FenceAction::Off, true)],
        ];
        let failed = run(
            1,
            "ipmi",
            ExecutionKind::Act,
            ExecutionResult::TimedOut,
            false,
            None,
        );
        assert!(matches!(
            progress(&alternatives, &[&failed]),
            Progress::Next { alternative: 2, .. }
        ));
        let unconfirmed = run(
            2,
            "pdu",
            ExecutionKind::Act,
            ExecutionResult::Succeeded,
            false,
            None,
        );
        assert_eq!(
            progress(&alternatives, &[&failed, &unconfirmed]),
            Progress::Succeeded {
                alternative: 2,
                confirmed: false,
                methods: vec!["pdu".into()]
            }
        );
    }

    #[test]
    fn an_optional_off_that_failed_leaves_the_alternative_unconfirmed() {
        let alternatives = vec![vec![
            method("psu1", FenceAction::Off, true),
            method("psu2", FenceAction::Off, false),
        ]];
        let first = run(
            1,
            "psu1",
            ExecutionKind::Act,
            ExecutionResult::Succeeded,
            true,
            Some(PowerSeen::Off),
        );
        let second = run(
            1,
            "psu2",
            ExecutionKind::Act,
            ExecutionResult::Failed,
            false,
            None,
        );
        assert_eq!(
            progress(&alternatives, &[&first, &second]),
            Progress::Succeeded {
                alternative: 1,
                confirmed: false,
                methods: vec!["psu1".into(), "psu2".into()]
            }
        );
    }

    #[test]
    fn recovery_methods_succeed_without_confirming_anything() {
        let alternatives = vec![vec![method("ipmi-on", FenceAction::On, true)]];
        let on = run(
            1,
            "ipmi-on",
            ExecutionKind::Act,
            ExecutionResult::Succeeded,
            false,
            Some(PowerSeen::On),
        );
        assert_eq!(
            progress(&alternatives, &[&on]),
            Progress::Succeeded {
                alternative: 1,
                confirmed: false,
                methods: vec!["ipmi-on".into()]
            }
        );
    }
}
