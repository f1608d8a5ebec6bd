//! Wires the controller together: the leader Lease first, then the node watch, the
//! NodeFence controller (kube-runtime's `Controller` around [`reconcile`]), the
//! executor (local processes or Kubernetes Jobs) and the metrics. Only the leader watches and acts; a replica that loses the
//! Lease kills the agents it started and stops, so two replicas never act together (the
//! executions it leaves are verified by the next leader, never repeated blind).

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, watcher};

use crate::fencing::FenceRunner;
use crate::metrics::Health;

use super::executor::{Clock, Executor, LocalExecutor};
use super::hearing::{Hearing, watch_node_leases};
use super::job_executor::JobExecutor;
use super::lease::LeaderElector;
use super::metrics::ControllerMetrics;
use super::nodes::watch_nodes;
use super::policy::{ControllerPolicy, ExecutorPolicy};
use super::reconciler::{Context, StartGate, error_policy, reconcile};
use super::resource::NodeFence;

/// How often the leader brings the gauges over all NodeFences (`nodekeeper_fences`,
/// `nodekeeper_failed_fences`, `nodekeeper_fences_paused`) up to date with its watch,
/// besides after every reconcile.
const FENCE_GAUGES_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("stopped acting: {0}")]
    LostLease(String),
    #[error("the node watch ended")]
    NodeWatchEnded,
}

/// Runs the controller until `shutdown` resolves (then `Ok`) or leadership is lost.
/// `reports` is the agent report endpoint, when the controller serves one: with it, a
/// node with an agent is judged by its Lease and its reports (see `liveness.rs`).
/// `leader_endpoint`, when given, is where the leader points the report Service.
/// `kdump` holds the kdump notifications heard, when the controller listens for them.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: kube::Client,
    policy: ControllerPolicy,
    reports: Option<Arc<crate::report::ReportHub>>,
    leader_endpoint: Option<super::report_endpoint::LeaderEndpoint>,
    kdump: Option<Arc<super::kdump::KdumpLog>>,
    identity: String,
    metrics: Arc<ControllerMetrics>,
    health: Arc<Health>,
    clock: Clock,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut elector = LeaderElector::new(
        client.clone(),
        &policy.namespace,
        policy.leader_election.clone(),
        identity.clone(),
    );
    tracing::info!(%identity, lease = %policy.leader_election.lease_name, namespace = %policy.namespace, "waiting for the leader Lease");
    tokio::select! {
        _ = elector.acquire() => {}
        _ = &mut shutdown => return Ok(()),
    }
    metrics.leader.set(1);
    // Reports reach the leader from now on, also while the nodes are being listed.
    let endpoint_task = leader_endpoint.map(|endpoint| {
        tokio::spawn(super::report_endpoint::keep_pointing_at_us(
            client.clone(),
            endpoint,
            elector.leadership(),
            metrics.report_service_at_leader.clone(),
        ))
    });

    let runner = Arc::new(FenceRunner::new(policy.agents.runner_settings()));
    let (wake_tx, wake_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let executor: Arc<dyn Executor> = match &policy.executor {
        ExecutorPolicy::Local => Arc::new(LocalExecutor::new(
            runner.clone(),
            clock.clone(),
            wake_tx.clone(),
        )),
        ExecutorPolicy::Job(job) => JobExecutor::start(
            client.clone(),
            &policy.namespace,
            job.as_ref().clone(),
            policy.agents.clone(),
            clock.clone(),
            wake_tx.clone(),
        ),
    };
    let (nodes, node_writer) = reflector::store::<Node>();
    let fence_api: Api<NodeFence> = Api::all(client.clone());
    let wakes = futures::stream::unfold(wake_rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|name| (ObjectRef::<NodeFence>::new(&name), rx))
    });
    let controller = Controller::new(fence_api, watcher::Config::default()).reconcile_on(wakes);
    let hearing = Arc::new(Hearing::new(reports, kdump, &policy));
    let ctx = Arc::new(Context {
        hearing: hearing.clone(),
        client: client.clone(),
        policy,
        runner,
        executor: executor.clone(),
        nodes: nodes.clone(),
        guard_views: Default::default(),
        fences: controller.store(),
        leadership: elector.leadership(),
        inherited_storm: elector.inherited_storm(),
        leader_since: std::time::Instant::now(),
        metrics: metrics.clone(),
        clock,
        identity,
        starts: StartGate::default(),
    });
    // The node Leases are one of the two channels silence is judged by; without silence
    // detection nobody reads them.
    let lease_watch_handle = hearing
        .enabled()
        .then(|| tokio::spawn(watch_node_leases(client.clone(), hearing.clone())));
    let outcome = {
        // The Lease is renewed from the moment it is held, also while the nodes are
        // still being listed.
        let lost = elector.hold();
        let mut lost = std::pin::pin!(lost);
        let node_watch = watch_nodes(ctx.clone(), node_writer, wake_tx);
        let mut node_watch = std::pin::pin!(node_watch);
        // Decide nothing before every node is known (the storm guard counts them all)
        // and the executor knows what runs (a Job in the cluster is adopted, never
        // taken for lost).
        let synced = tokio::select! {
            _ = async { let _ = nodes.wait_until_ready().await; executor.ready().await } => Ok(true),
            _ = &mut node_watch => Err(RunError::NodeWatchEnded),
            reason = &mut lost => Err(RunError::LostLease(reason)),
            _ = &mut shutdown => Ok(false),
        };
        match synced {
            Ok(true) => {
                hearing.begin();
                health.tick();
                tracing::info!(
                    nodes = nodes.state().len(),
                    "node list synced; reconciling NodeFences"
                );
                let fences = controller
                    .run(reconcile, error_policy, ctx.clone())
                    .for_each(|result| async move {
                        if let Err(error) = result {
                            tracing::debug!(%error, "controller event");
                        }
                    });
                // The fence gauges follow the watch also where no reconcile runs: a
                // NodeFence deleted, or one whose reconciles keep failing.
                let fence_gauges = async {
                    let mut every = tokio::time::interval(FENCE_GAUGES_INTERVAL);
                    loop {
                        every.tick().await;
                        ctx.update_fence_gauges();
                    }
                };
                tokio::select! {
                    _ = fences => Ok(()),
                    _ = fence_gauges => Ok(()),
                    _ = &mut node_watch => Err(RunError::NodeWatchEnded),
                    reason = &mut lost => Err(RunError::LostLease(reason)),
                    _ = &mut shutdown => Ok(()),
                }
            }
            Ok(false) => Ok(()),
            Err(error) => Err(error),
        }
    };
    if let Some(lease_watch) = lease_watch_handle {
        lease_watch.abort();
    }
    // The next leader points the Service at itself; this replica writes nothing more,
    // and a write under way ends before the Lease is given up.
    if let Some(endpoint_task) = endpoint_task {
        endpoint_task.abort();
        let _ = endpoint_task.await;
    }
    metrics.report_service_at_leader.set(0);
    // A replica that no longer leads asks no agent anything (reports should not reach it,
    // but a Service that still sends them must not hand out its old instructions).
    hearing.withdraw_instructions();
    metrics.leader.set(0);
    // Whatever runs now was recorded before it started; the next leader asks the device
    // with `status` what it did instead of running it again.
    executor.stop();
    if outcome.is_ok() {
        elector.release().await;
    }
    outcome
}

/// This replica's name in the Lease and in Events: the pod name when it runs in one
/// (`POD_NAME`), else the host name, with a random suffix so two processes on one host
/// never share it.
pub fn identity() -> String {
    let base = std::env::var("POD_NAME")
        .ok()
        .filter(|name| !name.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|name| name.trim().to_string())
        })
        .unwrap_or_else(|| "nodekeeper-controller".to_string());
    let suffix = std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .ok()
        .map(|uuid| uuid.chars().take(8).collect::<String>())
        .unwrap_or_else(|| std::process::id().to_string());
    format!("{base}_{suffix}")
}
