//! One execution of a method as the fence controller runs it, wherever it runs (a child
//! process of the controller, or a Kubernetes Job through `nodekeeper fence execute`):
//! the method's action confirmed by `status` ([`ExecutionMode::Act`]), or `status` alone
//! ([`ExecutionMode::Verify`]: what did an interrupted action do?).

use serde::{Deserialize, Serialize};

use super::config::MethodPlan;
use super::runner::{Exit, FenceRunner, PowerState};

/// What an execution does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionMode {
    /// The method's action, every `off` and `on` confirmed by `status`.
    Act,
    /// One `status` call.
    Verify,
}

/// How an execution ended: what the controller records in the NodeFence status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionResult {
    pub succeeded: bool,
    pub timed_out: bool,
    /// `status` reported the power OFF after the action: the only thing that lets pods
    /// be released.
    pub off_confirmed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<PowerState>,
    /// One line for a person, credentials redacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl ExecutionResult {
    /// An execution that failed before (or instead of) running an agent.
    pub fn failed(detail: impl Into<String>) -> ExecutionResult {
        ExecutionResult {
            succeeded: false,
            timed_out: false,
            off_confirmed: false,
            power: None,
            detail: Some(detail.into()),
        }
    }
}

/// Runs one execution of `method`.
pub async fn execute(
    runner: &FenceRunner,
    method: &MethodPlan,
    mode: ExecutionMode,
) -> ExecutionResult {
    match mode {
        ExecutionMode::Act => {
            let result = runner.execute(method).await;
            let timed_out = !result.succeeded
                && result
                    .calls
                    .iter()
                    .any(|call| matches!(call.exit, Exit::TimedOut { .. }));
            ExecutionResult {
                succeeded: result.succeeded,
                timed_out,
                off_confirmed: result.off_confirmed,
                power: result.power,
                detail: result.detail,
            }
        }
        ExecutionMode::Verify => {
            let call = runner
                .call(&method.agent, "status", &method.parameters)
                .await;
            let power = call.power.filter(|_| call.succeeded());
            ExecutionResult {
                succeeded: power.is_some(),
                timed_out: matches!(call.exit, Exit::TimedOut { .. }),
                off_confirmed: power == Some(PowerState::Off),
                power,
                detail: Some(match power {
                    Some(power) => format!("status reports {power}"),
                    None => format!("status could not tell ({})", call.summary()),
                }),
            }
        }
    }
}
