//! One step of a fence for one node, with the alternatives rule: alternatives are tried
//! in order; within one, methods run in order and the alternative succeeds only if every
//! method that must succeed did (and at least one method did); the first alternative
//! that succeeds ends the step. Without `|` a step is one alternative, which is the
//! original design's meaning of a method list.

use serde::Serialize;

use super::config::{FenceAction, MethodPlan, Step, StepPlan};
use super::runner::{FenceRunner, MethodResult};

/// Carries out one method; the runner in production, a script in tests.
pub trait MethodExecutor {
    fn execute(&self, method: &MethodPlan) -> impl Future<Output = MethodResult> + Send;
}

impl MethodExecutor for FenceRunner {
    fn execute(&self, method: &MethodPlan) -> impl Future<Output = MethodResult> + Send {
        FenceRunner::execute(self, method)
    }
}

/// What one alternative did.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AlternativeResult {
    /// 1-based, as an operator counts them.
    pub alternative: usize,
    pub succeeded: bool,
    pub methods: Vec<MethodResult>,
}

/// What one step did.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepResult {
    pub step: Step,
    pub succeeded: bool,
    /// Whether the winning alternative proves the node off (see [`off_confirmed`]).
    pub off_confirmed: bool,
    pub alternatives: Vec<AlternativeResult>,
}

/// Whether an alternative succeeded, given `(must_succeed, succeeded)` per method run.
pub fn alternative_succeeded(outcomes: &[(bool, bool)]) -> bool {
    outcomes.iter().any(|&(_, succeeded)| succeeded)
        && outcomes
            .iter()
            .all(|&(must_succeed, succeeded)| succeeded || !must_succeed)
}

/// Runs `plan`'s alternatives until one succeeds.
pub async fn run_step<E: MethodExecutor>(executor: &E, plan: &StepPlan) -> StepResult {
    let mut alternatives = Vec::new();
    for (index, alternative) in plan.alternatives.iter().enumerate() {
        let mut results = Vec::new();
        let mut outcomes = Vec::new();
        for method in &alternative.methods {
            let result = executor.execute(method).await;
            outcomes.push((method.must_succeed, result.succeeded));
            let stop = !result.succeeded && method.must_succeed;
            results.push(result);
            if stop {
                // The alternative has failed; its remaining methods would not help.
                break;
            }
        }
        let complete = results.len() == alternative.methods.len();
        let succeeded = complete && alternative_succeeded(&outcomes);
        alternatives.push(AlternativeResult {
            alternative: index + 1,
            succeeded,
            methods: results,
        });
        if succeeded {
            break;
        }
    }
    let winner = alternatives.iter().find(|a| a.succeeded);
    StepResult {
        step: plan.step,
        succeeded: winner.is_some(),
        off_confirmed: winner.is_some_and(|winner| off_confirmed(&winner.methods)),
        alternatives,
    }
}

/// Whether an alternative's results prove the node off: it turned something off, and
/// every method that was to turn something off had `status` confirm it, including one
/// allowed to fail (a second power supply still on keeps the node running).
pub fn off_confirmed(methods: &[MethodResult]) -> bool {
    let mut turning_off = methods
        .iter()
        .filter(|m| matches!(m.action, FenceAction::Off | FenceAction::Reboot))
        .peekable();
    turning_off.peek().is_some() && turning_off.all(|m| m.off_confirmed)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::fencing::config::{Alternative, Layer, Source};

    /// Succeeds or fails each method by name, recording the order of calls.
    struct Scripted {
        failing: Vec<&'static str>,
        calls: Mutex<Vec<String>>,
    }

    impl MethodExecutor for Scripted {
        async fn execute(&self, method: &MethodPlan) -> MethodResult {
            self.calls
                .lock()
                .expect("not poisoned")
                .push(method.name.clone());
            let succeeded = !self.failing.contains(&method.name.as_str());
            MethodResult {
                method: method.name.clone(),
                agent: method.agent.clone(),
                action: method.action,
                succeeded,
                detail: None,
                off_confirmed: succeeded && method.action == FenceAction::Off,
                power: None,
                calls: Vec::new(),
                duration: Duration::ZERO,
            }
        }
    }

    fn method(name: &str, must_succeed: bool) -> MethodPlan {
        MethodPlan {
            name: name.to_string(),
            source: Source {
                config_map: format!("fence-method-{name}-n1"),
                key: "method.properties".to_string(),
            },
            template: None,
            agent: "fence_dummy".to_string(),
            action: FenceAction::Off,
            action_layer: Layer::Default,
            must_succeed,
            parameters: Vec::new(),
        }
    }

    /// `"a b | c"`, with a trailing `?` marking a method that may fail.
    fn plan(text: &str) -> StepPlan {
        StepPlan {
            step: Step::PowerManagement,
            alternatives: text
                .split('|')
                .map(|part| Alternative {
                    methods: part
                        .split_whitespace()
                        .map(|name| match name.strip_suffix('?') {
                            Some(name) => method(name, false),
                            None => method(name, true),
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    async fn run(text: &str, failing: &[&'static str]) -> (StepResult, Vec<String>) {
        let executor = Scripted {
            failing: failing.to_vec(),
            calls: Mutex::new(Vec::new()),
        };
        let result = run_step(&executor, &plan(text)).await;
        let calls = executor.calls.into_inner().expect("not poisoned");
        (result, calls)
    }

    #[tokio::test]
    async fn the_first_alternative_that_succeeds_ends_the_step() {
        let (result, calls) = run("ipmi | pdu-a pdu-b", &[]).await;
        assert!(result.succeeded && result.off_confirmed);
        assert_eq!(calls, ["ipmi"]);
    }

    #[tokio::test]
    async fn a_failed_alternative_hands_over_to_the_next() {
        let (result, calls) = run("ipmi | pdu-a pdu-b", &["ipmi"]).await;
        assert!(result.succeeded);
        assert_eq!(calls, ["ipmi", "pdu-a", "pdu-b"]);
        let verdicts: Vec<bool> = result.alternatives.iter().map(|a| a.succeeded).collect();
        assert_eq!(verdicts, [false, true]);
    }

    #[tokio::test]
    async fn an_alternative_needs_all_its_methods_and_stops_at_the_first_failure() {
        let (result, calls) = run("pdu-a pdu-b pdu-c | ipmi", &["pdu-b", "ipmi"]).await;
        assert!(!result.succeeded && !result.off_confirmed);
        assert_eq!(calls, ["pdu-a", "pdu-b", "ipmi"], "pdu-c is never run");
    }

    #[tokio::test]
    async fn a_list_without_bars_keeps_the_original_meaning() {
        let (result, calls) = run("eaton-off eaton-on", &[]).await;
        assert!(result.succeeded);
        assert_eq!(calls, ["eaton-off", "eaton-on"]);
        assert_eq!(result.alternatives.len(), 1);
    }

    #[tokio::test]
    async fn a_method_that_may_fail_does_not_fail_its_alternative_but_cannot_carry_it_alone() {
        let (result, calls) = run("cordon? ipmi", &["cordon"]).await;
        assert!(result.succeeded);
        assert!(!result.off_confirmed, "the failed off is not confirmed");
        assert_eq!(calls, ["cordon", "ipmi"]);
        let (result, _) = run("cordon?", &["cordon"]).await;
        assert!(!result.succeeded, "no method succeeded at all");
    }

    #[test]
    fn the_alternative_rule_as_a_table() {
        assert!(alternative_succeeded(&[(true, true), (true, true)]));
        assert!(!alternative_succeeded(&[(true, true), (true, false)]));
        assert!(alternative_succeeded(&[(false, false), (true, true)]));
        assert!(!alternative_succeeded(&[(false, false)]));
        assert!(!alternative_succeeded(&[]));
    }
}
