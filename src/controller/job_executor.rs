//! The Job executor: one Kubernetes Job per execution, as the original node-fencing
//! design ran its agents (see `jobs.rs` for the Job itself).
//!
//! - A Job's name is a function of the NodeFence's uid and the execution, and the Jobs
//!   live in the cluster, not in this process: a restarted controller or a new leader
//!   finds the running Job in its Job watch and waits for its result instead of
//!   starting a second one.
//! - Executions for one node run one at a time: a Job is created only once no other Job
//!   of that node may still run an agent (its pod stopped, or its deadline and the
//!   agent's own deadlines are over).
//! - A Job that cannot be created, ends without a readable result, or passes its
//!   deadline is a failed execution; nothing but a result the agent wrote confirms a
//!   fence.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

use crate::fencing::job::JobExecution;
use crate::fencing::{AgentCheck, FencePlan};

use super::decide::{ExecutionRequest, Outcome, ReportedState};
use super::executor::{Clock, Executor, FenceId, find_method, mode};
use super::jobs::{
    FENCE_ANNOTATION, FENCE_UID_LABEL, JobInput, MANAGED_BY, MANAGED_BY_LABEL, NODE_ANNOTATION,
    belongs_to, build_job, job_name, job_state, not_started, pod_may_act,
};
use super::policy::{AgentsPolicy, JobPolicy};
use super::resource::FIELD_MANAGER;

type Key = (String, String);

/// Added to every "ends by" time the controller compares with its own clock, for a
/// node's clock that runs a little ahead or behind.
const CLOCK_MARGIN: Duration = Duration::from_secs(30);

/// How long creating a Job is retried against a failing API server before the
/// execution counts as failed (it never started, so a retry is safe).
const CREATE_RETRY: Duration = Duration::from_secs(60);

struct Queued {
    key: Key,
    fence: FenceId,
    job: Job,
    since: Timestamp,
    ends_by: Option<Timestamp>,
}

/// A Job this process created (or found already created).
struct Created {
    node: String,
    job: String,
    /// When any agent of it has certainly ended.
    ends_by: Option<Timestamp>,
}

#[derive(Default)]
struct Pending {
    /// Waiting for the node's previous Job to end, or for the API server.
    queued: Vec<Queued>,
    created: HashMap<Key, Created>,
    /// Ended without a Job (no method, a credential a Job cannot receive, creation
    /// failing).
    failed: HashMap<Key, Outcome>,
}

pub struct JobExecutor {
    client: kube::Client,
    namespace: String,
    policy: JobPolicy,
    agents: AgentsPolicy,
    clock: Clock,
    jobs: Store<Job>,
    pods: Store<Pod>,
    pending: Mutex<Pending>,
    dispatch: tokio::sync::Notify,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    finished: tokio::sync::mpsc::UnboundedSender<String>,
}

impl JobExecutor {
    /// Starts the Job and pod watches (this controller's Jobs in `namespace`) and the
    /// task that creates queued Jobs. Wait for [`Executor::ready`] before reporting.
    pub fn start(
        client: kube::Client,
        namespace: &str,
        policy: JobPolicy,
        agents: AgentsPolicy,
        clock: Clock,
        finished: tokio::sync::mpsc::UnboundedSender<String>,
    ) -> Arc<JobExecutor> {
        let (jobs, job_writer) = reflector::store::<Job>();
        let (pods, pod_writer) = reflector::store::<Pod>();
        let executor = Arc::new(JobExecutor {
            client: client.clone(),
            namespace: namespace.to_string(),
            policy,
            agents,
            clock,
            jobs,
            pods,
            pending: Mutex::new(Pending::default()),
            dispatch: tokio::sync::Notify::new(),
            tasks: Mutex::new(Vec::new()),
            finished: finished.clone(),
        });
        let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY}");
        let config = watcher::Config::default().labels(&selector);
        let job_watch = watch(
            "Job",
            Api::<Job>::namespaced(client.clone(), namespace),
            config.clone(),
            job_writer,
            finished.clone(),
        );
        let pod_watch = watch(
            "Job pod",
            Api::<Pod>::namespaced(client, namespace),
            config,
            pod_writer,
            finished,
        );
        let dispatcher = {
            let executor = Arc::downgrade(&executor);
            async move {
                loop {
                    let Some(strong) = executor.upgrade() else {
                        return;
                    };
                    strong.dispatch_queued().await;
                    let wake = async {
                        tokio::select! {
                            _ = strong.dispatch.notified() => {}
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                    };
                    wake.await;
                }
            }
        };
        let handles = [
            tokio::spawn(job_watch).abort_handle(),
            tokio::spawn(pod_watch).abort_handle(),
            tokio::spawn(dispatcher).abort_handle(),
        ];
        executor.lock_tasks().extend(handles);
        executor
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_tasks(&self) -> std::sync::MutexGuard<'_, Vec<tokio::task::AbortHandle>> {
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn job(&self, name: &str) -> Option<Arc<Job>> {
        self.jobs.get(&ObjectRef::new(name).within(&self.namespace))
    }

    fn pods_of(&self, job: &Job) -> Vec<Arc<Pod>> {
        let Some(uid) = job.uid() else {
            return Vec::new();
        };
        self.pods
            .state()
            .into_iter()
            // Only the pods the Job controller made for it: its controller reference.
            .filter(|pod| {
                pod.owner_references()
                    .iter()
                    .any(|owner| owner.uid == uid && owner.controller == Some(true))
            })
            .collect()
    }

    fn state_of(&self, job: &Job, now: Timestamp) -> ReportedState {
        let pods = self.pods_of(job);
        let pods: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
        job_state(job, &pods, now, CLOCK_MARGIN)
    }

    /// Whether an agent for `node` may still run: a Job of it not over, a pod of ours
    /// for it still running (also one whose Job was deleted), or a Job this process
    /// created that the watch does not show yet.
    fn node_busy(&self, node: &str, now: Timestamp) -> bool {
        let for_node = |meta: &ObjectMeta| {
            meta.annotations
                .as_ref()
                .and_then(|annotations| annotations.get(NODE_ANNOTATION))
                .is_some_and(|n| n == node)
        };
        let job_running = self.jobs.state().into_iter().any(|job| {
            for_node(&job.metadata) && self.state_of(&job, now) == ReportedState::Running
        });
        let pod_running = self
            .pods
            .state()
            .into_iter()
            .any(|pod| for_node(&pod.metadata) && pod_may_act(&pod, now, CLOCK_MARGIN));
        job_running
            || pod_running
            || self.lock().created.values().any(|created| {
                created.node == node
                    && self.job(&created.job).is_none()
                    && !over(created.ends_by, now)
            })
    }

    /// Nodes where earlier Jobs of this fence ran and failed: a retry prefers others.
    fn failed_nodes(&self, fence: &FenceId, now: Timestamp) -> Vec<String> {
        let mut nodes: Vec<String> = Vec::new();
        for job in self.jobs.state() {
            if job.labels().get(FENCE_UID_LABEL) != Some(&fence.uid) {
                continue;
            }
            let failed = matches!(
                self.state_of(&job, now),
                ReportedState::Finished(ref outcome) if !outcome.succeeded
            );
            if !failed {
                continue;
            }
            for pod in self.pods_of(&job) {
                if let Some(node) = pod.spec.as_ref().and_then(|spec| spec.node_name.clone())
                    && !nodes.contains(&node)
                {
                    nodes.push(node);
                }
            }
        }
        nodes
    }

    /// Creates every queued Job whose node has no other Job running.
    async fn dispatch_queued(&self) {
        let now = (self.clock)();
        let candidates: Vec<(Key, FenceId, Job)> = self
            .lock()
            .queued
            .iter()
            .map(|q| (q.key.clone(), q.fence.clone(), q.job.clone()))
            .collect();
        let mut started_nodes: Vec<String> = Vec::new();
        for (key, fence, job) in candidates {
            if started_nodes.contains(&fence.node) || self.node_busy(&fence.node, now) {
                continue;
            }
            let api: Api<Job> = Api::namespaced(self.client.clone(), &self.namespace);
            let params = PostParams {
                field_manager: Some(FIELD_MANAGER.to_string()),
                ..PostParams::default()
            };
            let name = job.name_any();
            let created = if self.job(&name).is_some() {
                // Ours from before a restart, or from the previous leader: adopted.
                Ok(())
            } else {
                match api.create(&params, &job).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(status)) if status.reason == "AlreadyExists" => Ok(()),
                    // A request that failed on its way back may have created it.
                    Err(error) => match api.get_opt(&name).await {
                        Ok(Some(_)) => Ok(()),
                        _ => Err(error.to_string()),
                    },
                }
            };
            let mut pending = self.lock();
            let Some(index) = pending.queued.iter().position(|q| q.key == key) else {
                continue;
            };
            match created {
                Ok(()) => {
                    let queued = pending.queued.remove(index);
                    pending.created.insert(
                        key,
                        Created {
                            node: fence.node.clone(),
                            job: name.clone(),
                            ends_by: queued.ends_by,
                        },
                    );
                    started_nodes.push(fence.node.clone());
                    tracing::info!(fence = %fence.name, node = %fence.node, job = %name, "Job created");
                }
                Err(error) => {
                    let since = pending.queued[index].since;
                    if now.duration_since(since).as_secs() >= CREATE_RETRY.as_secs() as i64 {
                        pending.queued.remove(index);
                        let detail = format!("could not create Job {name}: {error}");
                        tracing::error!(fence = %fence.name, node = %fence.node, "{detail}");
                        pending.failed.insert(key, not_started(detail, now));
                        drop(pending);
                        let _ = self.finished.send(fence.name.clone());
                    } else {
                        tracing::warn!(fence = %fence.name, job = %name, %error, "could not create Job; retrying");
                    }
                }
            }
        }
    }

    fn fail(&self, key: Key, fence: &FenceId, detail: String) {
        let now = (self.clock)();
        tracing::error!(fence = %fence.name, node = %fence.node, "{detail}");
        self.lock().failed.insert(key, not_started(detail, now));
        let _ = self.finished.send(fence.name.clone());
    }
}

/// Whether `end` (plus the clock margin) has passed; an unknown end never passes.
fn over(end: Option<Timestamp>, now: Timestamp) -> bool {
    end.and_then(|end| end.checked_add(CLOCK_MARGIN).ok())
        .is_some_and(|end| now > end)
}

impl Pending {
    fn contains(&self, key: &Key) -> bool {
        self.created.contains_key(key)
            || self.failed.contains_key(key)
            || self.queued.iter().any(|q| &q.key == key)
    }
}

/// Watches `api` into a store and wakes the fence of every object that changes.
async fn watch<K>(
    what: &'static str,
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    wake: tokio::sync::mpsc::UnboundedSender<String>,
) where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K: Send + Sync + 'static,
{
    let stream = watcher(api, config)
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(object) => {
                if let Some(fence) = object.annotations().get(FENCE_ANNOTATION) {
                    let _ = wake.send(fence.clone());
                }
            }
            // A 403 here means the controller's Role lacks list/watch on this kind.
            Err(error) => tracing::warn!(%error, "the {what} watch failed; retrying"),
        }
    }
}

impl Executor for JobExecutor {
    fn start(&self, fence: &FenceId, request: &ExecutionRequest, plan: Arc<FencePlan>) {
        let key = (fence.uid.clone(), request.name.clone());
        let name = job_name(fence, &request.name);
        if self.lock().contains(&key) || self.job(&name).is_some() {
            // Already under way, here or (adopted) in the cluster: never twice.
            return;
        }
        let method = match find_method(&plan, request) {
            Ok(method) => method,
            Err(result) => {
                let detail = result.detail.unwrap_or_default();
                return self.fail(key, fence, detail);
            }
        };
        let now = (self.clock)();
        let execution = match JobExecution::new(
            &fence.node,
            method,
            mode(request.kind),
            self.agents.call_timeout,
            self.agents.verify_timeout,
        ) {
            Ok(execution) => execution.starting_by(now + self.policy.start_timeout),
            Err(error) => return self.fail(key, fence, error.to_string()),
        };
        let avoid = self.failed_nodes(fence, now);
        let job = build_job(&JobInput {
            policy: &self.policy,
            agents_dir: &self.agents.directory,
            namespace: &self.namespace,
            fence,
            request,
            execution: &execution,
            avoid_nodes: &avoid,
        });
        self.lock().queued.push(Queued {
            key,
            fence: fence.clone(),
            job,
            since: now,
            ends_by: execution.ends_by(),
        });
        self.dispatch.notify_one();
    }

    fn report(&self, fence: &FenceId, name: &str) -> ReportedState {
        let key = (fence.uid.clone(), name.to_string());
        let now = (self.clock)();
        if let Some(outcome) = self.lock().failed.get(&key) {
            return ReportedState::Finished(outcome.clone());
        }
        let job_name = job_name(fence, name);
        if let Some(job) = self.job(&job_name) {
            if !belongs_to(&job, fence, name) {
                return ReportedState::Finished(not_started(
                    format!(
                        "Job {job_name} exists but was not made for execution {name} of this NodeFence; \
                         delete it if nothing should run it"
                    ),
                    now,
                ));
            }
            return self.state_of(&job, now);
        }
        let pending = self.lock();
        if pending.queued.iter().any(|q| q.key == key) {
            return ReportedState::Running;
        }
        match pending.created.get(&key) {
            // Not in the watch yet, or deleted before its result was read: running until
            // no agent of it can be, then lost, which the state machine answers by
            // asking the device.
            Some(created) if !over(created.ends_by, now) => ReportedState::Running,
            _ => ReportedState::Lost,
        }
    }

    fn forget(&self, fence: &FenceId, name: &str) {
        let key = (fence.uid.clone(), name.to_string());
        let mut pending = self.lock();
        pending.failed.remove(&key);
        pending.created.remove(&key);
        pending.queued.retain(|queued| queued.key != key);
    }

    fn stop(&self) {
        // The Jobs keep running in the cluster; the next leader adopts them.
        for task in self.lock_tasks().drain(..) {
            task.abort();
        }
    }

    fn ready(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            let _ = self.jobs.wait_until_ready().await;
            let _ = self.pods.wait_until_ready().await;
        })
    }

    fn plan_problems(&self, plan: &FencePlan, check: &AgentCheck) -> Vec<String> {
        // Agents missing here are fine: they run in the Job's image, which checks them.
        let _ = check;
        plan.methods()
            .filter_map(|(_, method)| {
                JobExecution::new(
                    &plan.node,
                    method,
                    crate::fencing::ExecutionMode::Act,
                    self.agents.call_timeout,
                    self.agents.verify_timeout,
                )
                .err()
                .map(|error| error.to_string())
            })
            .collect()
    }
}
