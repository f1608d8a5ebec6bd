//! Executors carry out the executions `decide` asks for. The port is [`Executor`]: start
//! an execution already recorded in the status, and say how a recorded one stands. The
//! [`LocalExecutor`] runs the agents as child processes of the controller through the
//! fencing toolkit's runner (credentials on standard input only, a deadline per call,
//! `status` confirming every `off`).
//!
//! An executor's memory is the controller process's: after a restart it knows nothing,
//! and an execution it does not know is reported [`ReportedState::Lost`], which the
//! state machine answers with a `status` call, never with a repeated action.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::jiff::Timestamp;

use crate::fencing::{
    AgentCheck, ExecutionMode, ExecutionResult, FencePlan, FenceRunner, MethodPlan, execute,
};

use super::decide::{ExecutionRequest, Outcome, ReportedState};
use super::resource::ExecutionKind;

/// The clock every controller part reads; injected so tests can move it.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// Which fence an execution belongs to: its resource's uid (so a deleted and recreated
/// NodeFence never inherits an old execution), its name and its node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FenceId {
    pub uid: String,
    pub name: String,
    pub node: String,
}

/// Carries out executions and reports on them.
pub trait Executor: Send + Sync {
    /// Starts `request`, one method of `plan`. Returns at once; the end is reported by
    /// [`Executor::report`] and announced through the executor's wake-up channel.
    fn start(&self, fence: &FenceId, request: &ExecutionRequest, plan: Arc<FencePlan>);
    /// How the execution `name` of `fence` stands.
    fn report(&self, fence: &FenceId, name: &str) -> ReportedState;
    /// The outcome is safely recorded in the status: the executor may drop it.
    fn forget(&self, fence: &FenceId, name: &str);
    /// This replica stops acting (shutdown or a lost Lease).
    fn stop(&self);
    /// Resolves once reports can be trusted (what the executor watches is listed).
    fn ready(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
    /// Why `plan` cannot run with this executor, beyond `check`'s own problems.
    fn plan_problems(&self, plan: &FencePlan, check: &AgentCheck) -> Vec<String>;
}

/// Finished outcomes nobody collected (their fence was deleted) are dropped after this.
const UNCOLLECTED: std::time::Duration = std::time::Duration::from_secs(3600);

type Key = (String, String);

/// Runs fence agents as child processes of the controller.
pub struct LocalExecutor {
    runner: Arc<FenceRunner>,
    clock: Clock,
    executions: Arc<Mutex<HashMap<Key, ReportedState>>>,
    /// One lock per node: a NodeFence deleted and applied again while its agent still
    /// runs must not start a second one for the same node before the first ends.
    nodes: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The tasks running executions, to stop them all at once.
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    /// Told the fence's name when one of its executions ends, so it is reconciled at once.
    finished: tokio::sync::mpsc::UnboundedSender<String>,
}

impl LocalExecutor {
    pub fn new(
        runner: Arc<FenceRunner>,
        clock: Clock,
        finished: tokio::sync::mpsc::UnboundedSender<String>,
    ) -> LocalExecutor {
        LocalExecutor {
            runner,
            clock,
            executions: Arc::new(Mutex::new(HashMap::new())),
            nodes: Mutex::new(HashMap::new()),
            tasks: Mutex::new(Vec::new()),
            finished,
        }
    }

    fn node_lock(&self, node: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        // Locks nobody holds or waits for are dropped, so the map stays as small as the
        // set of nodes being fenced.
        nodes.retain(|_, lock| Arc::strong_count(lock) > 1);
        nodes.entry(node.to_string()).or_default().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, ReportedState>> {
        self.executions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn key(fence: &FenceId, name: &str) -> Key {
    (fence.uid.clone(), name.to_string())
}

/// The method of `plan` a request names, or the failed result of a request whose method
/// the configuration no longer has.
pub fn find_method<'a>(
    plan: &'a FencePlan,
    request: &ExecutionRequest,
) -> Result<&'a MethodPlan, ExecutionResult> {
    let alternative = plan.step(request.step).and_then(|step| {
        step.alternatives
            .get(request.alternative.checked_sub(1)? as usize)
    });
    alternative
        .and_then(|alternative| {
            alternative
                .methods
                .iter()
                .find(|method| method.name == request.method)
        })
        .ok_or_else(|| {
            ExecutionResult::failed(format!(
                "method {} is not in alternative {} of the {} step of the node's configuration any more",
                request.method, request.alternative, request.step
            ))
        })
}

impl Executor for LocalExecutor {
    fn start(&self, fence: &FenceId, request: &ExecutionRequest, plan: Arc<FencePlan>) {
        let key = key(fence, &request.name);
        {
            let mut executions = self.lock();
            if executions.contains_key(&key) {
                // Already started by this process: never twice.
                return;
            }
            let now = (self.clock)();
            executions.retain(|_, state| match state {
                ReportedState::Finished(outcome) => {
                    now.duration_since(outcome.finished_at).as_secs() < UNCOLLECTED.as_secs() as i64
                }
                _ => true,
            });
            executions.insert(key.clone(), ReportedState::Running);
        }
        let node_lock = self.node_lock(&fence.node);
        let runner = self.runner.clone();
        let clock = self.clock.clone();
        let executions = self.executions.clone();
        let finished = self.finished.clone();
        let request = request.clone();
        let fence_name = fence.name.clone();
        let task = tokio::spawn(async move {
            let _one_per_node = node_lock.lock().await;
            let result = match find_method(&plan, &request) {
                Ok(method) => execute(&runner, method, mode(request.kind)).await,
                Err(missing) => missing,
            };
            let outcome = outcome(result, clock());
            tracing::info!(
                fence = %fence_name,
                execution = %request.name,
                succeeded = outcome.succeeded,
                off_confirmed = outcome.off_confirmed,
                detail = outcome.detail.as_deref().unwrap_or(""),
                "execution finished"
            );
            executions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key, ReportedState::Finished(outcome));
            // The receiver is gone only when the controller stops; the outcome is kept
            // for the next reconcile either way.
            let _ = finished.send(fence_name);
        });
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        tasks.retain(|task| !task.is_finished());
        tasks.push(task.abort_handle());
    }

    fn report(&self, fence: &FenceId, name: &str) -> ReportedState {
        self.lock()
            .get(&key(fence, name))
            .cloned()
            .unwrap_or(ReportedState::Lost)
    }

    fn forget(&self, fence: &FenceId, name: &str) {
        let key = key(fence, name);
        let mut executions = self.lock();
        if matches!(executions.get(&key), Some(ReportedState::Finished(_))) {
            executions.remove(&key);
        }
    }

    /// Stops every execution: the tasks first, so none starts another agent (a reboot's
    /// `on`, another `status`), then the agents still running, with their process
    /// groups.
    fn stop(&self) {
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            task.abort();
        }
        self.runner.kill_running();
    }

    /// The agents run here, so each must be installed here.
    fn plan_problems(&self, _plan: &FencePlan, check: &AgentCheck) -> Vec<String> {
        check
            .not_installed
            .iter()
            .map(|agent| {
                format!(
                    "fence agent {agent} is not installed in {}",
                    self.runner.settings().agents_dir.display()
                )
            })
            .collect()
    }
}

/// The outcome the state machine reads, from an execution's result.
pub fn outcome(result: ExecutionResult, finished_at: Timestamp) -> Outcome {
    Outcome {
        succeeded: result.succeeded,
        timed_out: result.timed_out,
        off_confirmed: result.off_confirmed,
        power: result.power.map(Into::into),
        detail: result.detail,
        finished_at,
    }
}

/// The fencing toolkit's name for what an execution does.
pub fn mode(kind: ExecutionKind) -> ExecutionMode {
    match kind {
        ExecutionKind::Act => ExecutionMode::Act,
        ExecutionKind::Verify => ExecutionMode::Verify,
    }
}
