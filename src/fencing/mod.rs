//! The fencing toolkit: the original node-fencing design's ConfigMaps resolved into a plan
//! per node (`config.rs`, over the objects in `objects.rs`), each method checked against
//! its agent's own metadata (`metadata.rs`), ClusterLabs fence agents run safely
//! (`runner.rs`), one step carried out with its alternatives (`step.rs`), one execution
//! as the controller runs it (`execution.rs`), and the documents a Kubernetes Job
//! receives and returns (`job.rs`).
//!
//! Resolution and the alternatives rule are pure; the runner is the only part that starts
//! processes. Credentials travel as [`SecretValue`]s, which print as `***`, and reach an
//! agent only on its standard input.

pub mod config;
pub mod execution;
pub mod job;
pub mod metadata;
pub mod objects;
pub mod properties;
pub mod report;
pub mod runner;
pub mod secret;
pub mod step;

pub use config::{
    ConfigErrors, ConfigWarning, FenceAction, FenceConfigError, FencePlan, MethodPlan, Step,
    StepPlan, resolve,
};
pub use execution::{ExecutionMode, ExecutionResult, execute};
pub use objects::{FenceObjects, ObjectOrigin, ObjectsError};
pub use runner::{
    AgentCall, Exit, FenceRunner, MethodResult, PowerState, ProbeResult, RunnerError,
    RunnerSettings,
};
pub use secret::SecretValue;
pub use step::{MethodExecutor, StepResult, run_step};

/// What checking a plan against the agents installed here found.
#[derive(Debug, Default)]
pub struct AgentCheck {
    /// Configuration errors found in the agents' metadata.
    pub errors: Vec<FenceConfigError>,
    /// Agents not installed here, whose parameters were therefore not checked.
    pub not_installed: Vec<String>,
    /// Agents whose metadata could not be read: their methods are unchecked, so nothing
    /// may run them until this is fixed.
    pub unreadable: Vec<(String, String)>,
}

impl AgentCheck {
    /// Every reason not to run the plan, one line each.
    pub fn problems(&self) -> Vec<String> {
        self.errors
            .iter()
            .map(ToString::to_string)
            .chain(self.unreadable.iter().map(|(agent, reason)| {
                format!("cannot check the methods using {agent}, so they may not run: {reason}")
            }))
            .collect()
    }
}

/// Checks every method of `plan` against its agent's metadata, settling option aliases
/// in the plan. An agent that is not installed here is noted, not an error: the
/// controller may run agents in another image.
pub async fn check_agents(plan: &mut FencePlan, runner: &FenceRunner) -> AgentCheck {
    let mut check = AgentCheck::default();
    let node = plan.node.clone();
    for (_, method) in plan.methods_mut() {
        match runner.metadata(&method.agent).await {
            Ok(metadata) => check
                .errors
                .extend(metadata::check_method(method, &metadata, &node)),
            Err(RunnerError::NotInstalled { agent, .. }) => {
                if !check.not_installed.contains(&agent) {
                    check.not_installed.push(agent);
                }
            }
            Err(error) => {
                let entry = (method.agent.clone(), error.to_string());
                if !check.unreadable.contains(&entry) {
                    check.unreadable.push(entry);
                }
            }
        }
    }
    check
}
