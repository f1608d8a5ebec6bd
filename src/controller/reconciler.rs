//! The reconciler, in kube-rs `controller-rs` form: a [`Context`] shared by every
//! reconcile, [`reconcile`] for one NodeFence, and [`error_policy`] for a failed one.
//!
//! One reconcile reads the facts (the NodeFence fresh from the API server, its Node from
//! the node store, the node's pods and claims, its fence configuration), asks the pure
//! [`decide`] what comes next, writes the new status guarded by the object's
//! resourceVersion, and only once that write succeeded starts executions, changes
//! taints, deletes pods and publishes Events. A write that loses a race (409) does
//! nothing else: the next reconcile decides again on the newer object. That ordering is
//! what makes a restart at any instant safe: an execution is in the status before its
//! agent starts, and a taint or deletion is asked for again by the next reconcile if the
//! controller died before making it (they are level-based).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use crate::fencing::{FencePlan, FenceRunner};
use crate::kubernetes::fencing::load_fence_objects;

use super::decide::{
    Action, Decision, ExecutionReport, FenceEvent, ReportedState, TaintChange, decide,
};
use super::executor::{Clock, Executor, FenceId};
use super::facts::{NodeFacts, NodeHealth, PlanOutline, Readiness, pod_needs_fencing};
use super::hearing::Hearing;
use super::lease::Leadership;
use super::liveness::Liveness;
use super::metrics::{CONFIRMED_WITHOUT_A_STEP, ControllerMetrics, ExecutionLabels, StepLabels};
use super::observe;
use super::policy::{
    ControllerPolicy, OUT_OF_SERVICE_TAINT, OUT_OF_SERVICE_VALUE, REMEDIATION_TAINT,
};
use super::resource::{FIELD_MANAGER, NodeFence, NodeFenceStatus};
use super::storm::{Assessment, Guard, StormMemory, StormState, assess_with_silent};
use super::views::GuardViews;

/// Everything a reconcile needs, shared by all of them.
pub struct Context {
    pub client: kube::Client,
    pub policy: ControllerPolicy,
    pub runner: Arc<FenceRunner>,
    pub executor: Arc<dyn Executor>,
    /// Every watched node (see `nodes.rs`), stripped of what the controller never reads.
    pub nodes: Store<Node>,
    /// The storm guard's view of the selected nodes, kept by the node watch.
    pub guard_views: Mutex<GuardViews>,
    /// What the controller hears from the nodes besides their Ready conditions: Lease
    /// renewals and agent reports.
    pub hearing: Arc<Hearing>,
    /// Every NodeFence, as the controller's watch last saw it.
    pub fences: Store<NodeFence>,
    /// Whether this replica may act, and the storm guard's memory, which the Lease
    /// carries across restarts and failovers.
    pub leadership: Arc<Leadership>,
    /// The storm memory the previous leader left in the Lease; merged on first use with
    /// what the fences' statuses tell, so a restart never ends a cooldown early.
    pub inherited_storm: Option<StormMemory>,
    /// When this replica became leader. An execution it does not know may still have an
    /// agent (or an agent's child) of the previous leader acting until one agent call's
    /// deadline after that; it is verified only then.
    pub leader_since: std::time::Instant,
    pub metrics: Arc<ControllerMetrics>,
    pub clock: Clock,
    /// Names this replica in the Events it publishes.
    pub identity: String,
    /// Fence starts, so concurrent reconciles keep to the zone rates.
    pub starts: StartGate,
}

/// Reconciles run concurrently, and two fences of one zone must not both see the zone's
/// rate unused: a reconcile that may start a new fence holds `lock` from reading the
/// zone's starts to writing its own, and `recent` keeps the starts this replica wrote
/// until the fence watch shows them.
#[derive(Default)]
pub struct StartGate {
    lock: tokio::sync::Mutex<()>,
    recent: Mutex<Vec<(String, Timestamp)>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("NodeFence {fence}: {doing}: {source}")]
    Kube {
        fence: String,
        doing: String,
        source: kube::Error,
    },
    #[error(
        "NodeFence {fence}: {doing}: the object changed since it was read; deciding again on the new one"
    )]
    Conflict { fence: String, doing: String },
    #[error("NodeFence {fence}: not acted on: this replica's hold on the leader Lease lapsed")]
    NotLeading { fence: String },
    #[error(
        "NodeFence {fence}: the decision failed on its status ({message}); nothing was done, it is tried again later"
    )]
    Undecidable { fence: String, message: String },
}

fn kube_error(fence: &str, doing: impl Into<String>) -> impl FnOnce(kube::Error) -> ReconcileError {
    let fence = fence.to_string();
    let doing = doing.into();
    move |source| match &source {
        kube::Error::Api(status) if status.code == 409 => ReconcileError::Conflict { fence, doing },
        _ => ReconcileError::Kube {
            fence,
            doing,
            source,
        },
    }
}

/// A failed reconcile is tried again: at once after a lost race, else after a pause
/// that keeps a failing API server from being hammered.
pub fn error_policy(_fence: Arc<NodeFence>, error: &ReconcileError, ctx: Arc<Context>) -> Requeue {
    match error {
        ReconcileError::Conflict { .. } => {
            tracing::debug!(%error, "reconcile lost a race");
            Requeue::requeue(Duration::from_millis(100))
        }
        ReconcileError::NotLeading { .. } => Requeue::requeue(Duration::from_secs(1)),
        ReconcileError::Kube { .. } => {
            ctx.metrics.reconcile_errors.inc();
            tracing::warn!(%error, "reconcile failed; retrying in 5s");
            Requeue::requeue(Duration::from_secs(5))
        }
        ReconcileError::Undecidable { .. } => {
            ctx.metrics.reconcile_errors.inc();
            tracing::error!(%error);
            Requeue::requeue(Duration::from_secs(60))
        }
    }
}

impl Context {
    /// The watched nodes as the storm guard counts them, and the guard's verdict over
    /// them; the memory is kept for the next evaluation.
    pub fn assess(&self, now: Timestamp) -> Assessment {
        // The ledger scan runs before the views are locked, so the node watch is not kept
        // waiting for it.
        let silent_names = self.hearing.silent_nodes(now);
        let guard_views = self.guard_views();
        let mut memory = self
            .leadership
            .storm
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let current = memory.unwrap_or_else(|| {
            let fences = self.fences.state();
            let rebuilt = observe::storm_memory_from(fences.iter().map(|fence| fence.as_ref()));
            rebuilt.merge(self.inherited_storm.unwrap_or_default())
        });
        let silent: Vec<_> = silent_names
            .iter()
            .filter_map(|name| guard_views.view(name))
            .collect();
        let assessment = assess_with_silent(
            guard_views.views(),
            &silent,
            current,
            &self.policy.storm,
            now,
        );
        let silent_count = silent.len();
        *memory = Some(assessment.memory);
        drop(memory);
        drop(guard_views);
        self.metrics.silent_nodes.set(silent_count as i64);
        self.metrics.watched_nodes.set(assessment.watched as i64);
        self.metrics
            .unhealthy_nodes
            .set(assessment.unhealthy as i64);
        self.metrics.set_storm_state(match assessment.storm {
            StormState::Calm => "calm",
            StormState::Storm { .. } => "storm",
            StormState::Cooldown { .. } => "cooldown",
        });
        assessment
    }

    /// The storm guard's view of the selected nodes. Held by `assess` before the storm
    /// memory; nothing takes the two the other way round.
    pub fn guard_views(&self) -> std::sync::MutexGuard<'_, GuardViews> {
        self.guard_views
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The guard's word on a fence in `zone`.
    fn guard(&self, zone: &str, now: Timestamp) -> Guard {
        let assessment = self.assess(now);
        let fences = self.fences.state();
        let mut starts = observe::starts_in_zone(fences.iter().map(|fence| fence.as_ref()), zone);
        let mut recent = self
            .starts
            .recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Starts older than a day no longer bound any rate worth configuring.
        recent.retain(|(_, at)| now.duration_since(*at).as_secs() < 86_400);
        starts.extend(recent.iter().filter(|(z, _)| z == zone).map(|(_, at)| *at));
        Guard::for_node(&assessment, zone, &starts, now)
    }

    /// The gauges over every fence the watch knows: all, failed, paused by reason.
    pub fn update_fence_gauges(&self) {
        let fences = self.fences.state();
        let figures = observe::fence_figures(fences.iter().map(|fence| fence.as_ref()));
        self.metrics.fences.set(figures.total as i64);
        self.metrics.failed_fences.set(figures.failed as i64);
        self.metrics.set_paused(&figures.paused);
    }
}

/// Reads the node's fence configuration and checks it against the installed agents.
async fn load_plan(ctx: &Context, node: &str) -> Result<FencePlan, String> {
    let objects = load_fence_objects(&ctx.client, &ctx.policy.namespace, node)
        .await
        .map_err(|error| error.to_string())?;
    let mut plan =
        crate::fencing::config::resolve_with(&objects, node, &ctx.policy.agents.resolve_policy())
            .map_err(|errors| errors.to_string())?;
    let check = crate::fencing::check_agents(&mut plan, &ctx.runner).await;
    let mut problems = check.problems();
    problems.extend(ctx.executor.plan_problems(&plan, &check));
    if problems.is_empty() {
        Ok(plan)
    } else {
        Err(format!(
            "the fence configuration of node {node} cannot be used: {}",
            problems.join("; ")
        ))
    }
}

/// Every pod bound to `node`.
async fn list_node_pods(
    ctx: &Context,
    fence: &str,
    node: &str,
) -> Result<Vec<Pod>, ReconcileError> {
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    pods.list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map(|list| list.items)
        .map_err(kube_error(
            fence,
            format!("listing the pods of node {node}"),
        ))
}

/// The node's pods and whether any of them needs fencing.
async fn node_pods(
    ctx: &Context,
    fence: &str,
    node: &str,
) -> Result<(usize, bool), ReconcileError> {
    let pods = list_node_pods(ctx, fence, node).await?;
    let mut single_node_claims = BTreeSet::new();
    for (namespace, claim) in pods.iter().flat_map(observe::claims) {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &namespace);
        let found = claims.get_opt(&claim).await.map_err(kube_error(
            fence,
            format!("reading PersistentVolumeClaim {namespace}/{claim}"),
        ))?;
        if found.as_ref().is_some_and(observe::is_single_node_claim) {
            single_node_claims.insert((namespace, claim));
        }
    }
    let selector = ctx.policy.pod_selector.as_ref();
    let needs_fencing = pods
        .iter()
        .any(|pod| pod_needs_fencing(&observe::pod_facts(pod, &single_node_claims), selector));
    let releasable = pods
        .iter()
        .filter(|pod| observe::is_releasable(pod))
        .count();
    Ok((releasable, needs_fencing))
}

/// Everything `decide` needs about the fence's node, and the full plan for the executor.
async fn gather(
    ctx: &Context,
    fence: &str,
    node_name: &str,
    status: Option<&NodeFenceStatus>,
) -> Result<(NodeFacts, Option<Arc<FencePlan>>), ReconcileError> {
    let Some(node) = ctx.nodes.get(&ObjectRef::new(node_name)) else {
        let facts = NodeFacts {
            exists: false,
            health: NodeHealth {
                readiness: Readiness::Unknown,
                since: None,
            },
            liveness: Liveness::NoAgent,
            zone: String::new(),
            excluded: false,
            runs_pods_needing_fencing: false,
            pods_to_release: 0,
            volumes_attached: 0,
            taints: Default::default(),
            plan: Err(format!("node {node_name} does not exist")),
            kdump: None,
            kdump_listening_since: None,
            lease_heard: None,
            boot_id: None,
            lease_unchanged: None,
        };
        return Ok((facts, None));
    };
    let (pods_to_release, runs_pods_needing_fencing) = node_pods(ctx, fence, node_name).await?;
    let plan = load_plan(ctx, node_name).await;
    let outline = plan
        .as_ref()
        .map(PlanOutline::from_plan)
        .map_err(Clone::clone);
    let now = (ctx.clock)();
    // Everything heard, at `now`, before the Lease read below.
    let liveness = ctx.hearing.liveness(node_name, now);
    let kdump = ctx.hearing.kdump(&observe::internal_ips(&node), now);
    let kdump_listening_since = ctx.hearing.kdump_listening_since(now);
    let lease_heard = ctx.hearing.lease_heard(node_name, now);
    // A release on a self-isolation promise rests on the Lease's silence as this
    // controller's watch saw it; a watch that stalled or missed a renewal would make a
    // live node look silent. So a fence that may release a node with no fence device on
    // its promise reads the Lease afresh (a quorum read).
    let promise_heard = matches!(liveness, Liveness::Heard(channels) if channels.promise.is_some());
    let promise_recorded = status.is_some_and(|status| status.promise.is_some());
    let unconfirmed = status.is_none_or(|status| status.confirmed_at.is_none());
    let no_device = !outline.as_ref().is_ok_and(|plan| plan.can_fence());
    let lease_unchanged = if unconfirmed && no_device && (promise_recorded || promise_heard) {
        lease_unchanged(ctx, node_name).await
    } else {
        None
    };
    let facts = NodeFacts {
        exists: true,
        health: observe::node_health(&node),
        liveness,
        boot_id: observe::boot_id(&node),
        lease_unchanged,
        kdump,
        kdump_listening_since,
        lease_heard,
        zone: observe::node_zone(&node),
        excluded: observe::is_excluded(&node),
        runs_pods_needing_fencing,
        pods_to_release,
        volumes_attached: observe::volumes_attached(&node),
        taints: observe::node_taints(&node),
        plan: outline,
    };
    Ok((facts, plan.ok().map(Arc::new)))
}

/// Whether the node's Lease, read now, shows the renewal this controller last heard
/// (`None`: it cannot be read, or this controller has not heard the Lease at all).
async fn lease_unchanged(ctx: &Context, node: &str) -> Option<bool> {
    let heard = ctx.hearing.lease_renewal(node)?;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(ctx.client.clone(), super::hearing::NODE_LEASE_NAMESPACE);
    match tokio::time::timeout(LEASE_READ_TIMEOUT, leases.get_opt(node)).await {
        Err(_) => {
            tracing::warn!(%node, timeout = ?LEASE_READ_TIMEOUT, "the node's Lease did not come within the timeout; no release on a self-isolation promise until it does");
            None
        }
        Ok(Ok(lease)) => {
            let now = lease
                .and_then(|lease| lease.spec)
                .and_then(|spec| spec.renew_time)
                .map(|time| time.0);
            Some(now == heard)
        }
        Ok(Err(error)) => {
            tracing::warn!(%node, %error, "cannot read the node's Lease to confirm its silence; no release on a self-isolation promise until it can be read");
            None
        }
    }
}

/// How long the fresh read of a node's Lease may take.
const LEASE_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Reconciles one NodeFence.
pub async fn reconcile(
    fence: Arc<NodeFence>,
    ctx: Arc<Context>,
) -> Result<Requeue, ReconcileError> {
    let name = fence.name_any();
    let api: Api<NodeFence> = Api::all(ctx.client.clone());
    // The watch may not have delivered our own last write yet; decide on the stored
    // object, so a decision is never made twice from the same status.
    let Some(fence) = api
        .get_opt(&name)
        .await
        .map_err(kube_error(&name, "reading it"))?
    else {
        // Gone: nothing is asked of its node's agent any more (a fence is named after
        // its node).
        ctx.hearing.instruct(&name, Vec::new());
        return Ok(Requeue::await_change());
    };
    let node_name = fence.spec.node_name.clone();
    let (facts, plan) = gather(&ctx, &name, &node_name, fence.status.as_ref()).await?;
    // A fence not started yet may start now: count the zone's starts and write ours under
    // one lock (see [`StartGate`]); the slow reads above stay outside it.
    let starting = fence
        .status
        .as_ref()
        .is_none_or(|status| status.started_at.is_none());
    let _start_guard = if starting {
        Some(ctx.starts.lock.lock().await)
    } else {
        None
    };
    let now = (ctx.clock)();
    let guard = if facts.exists {
        ctx.guard(&facts.zone, now)
    } else {
        Guard::default()
    };
    let id = FenceId {
        uid: fence.uid().unwrap_or_default(),
        name: name.clone(),
        node: node_name.clone(),
    };
    let reports: Vec<ExecutionReport> = fence
        .status
        .iter()
        .flat_map(|status| status.executions.iter())
        .filter(|execution| !execution.is_finished())
        .map(|execution| {
            let state = match ctx.executor.report(&id, &execution.name) {
                // Not ours: the previous leader's agent, or a child it left, may still be
                // acting. It is asked about only once one agent call's deadline has
                // passed since we took over.
                ReportedState::Lost
                    if ctx.leader_since.elapsed() < ctx.policy.agents.call_timeout =>
                {
                    ReportedState::Running
                }
                state => state,
            };
            ExecutionReport {
                name: execution.name.clone(),
                state,
            }
        })
        .collect();
    // decide is pure, but its arithmetic on timestamps a person may have edited into the
    // status can overflow; that must cost this fence a retry, not the daemon.
    let decision = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        decide(&fence, &facts, &reports, &guard, &ctx.policy.fence, now)
    }))
    .map_err(|panic| ReconcileError::Undecidable {
        fence: name.clone(),
        message: panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".to_string()),
    })?;
    if !ctx.leadership.is_leading() {
        return Err(ReconcileError::NotLeading { fence: name });
    }
    let before = fence.status.clone().unwrap_or_default();
    let written = if fence.status.as_ref() != Some(&decision.status) {
        let mut updated = fence.clone();
        updated.status = Some(decision.status.clone());
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        api.replace_status(&name, &params, &updated)
            .await
            .map_err(kube_error(&name, "writing its status"))?
    } else {
        fence
    };
    if starting && let Some(started) = &decision.status.started_at {
        ctx.starts
            .recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((facts.zone.clone(), started.0));
    }
    drop(_start_guard);
    // The outcomes are in the status now; the executor need not keep them.
    for execution in decision
        .status
        .executions
        .iter()
        .filter(|e| e.is_finished())
    {
        ctx.executor.forget(&id, &execution.name);
    }
    record_metrics(&ctx.metrics, &before, &decision.status, &facts.health);
    log_decision(&name, &node_name, &decision);
    // The transitions are in the status: say so before acting, so an action that fails
    // below cannot lose their Events.
    publish_events(&ctx, &written, &node_name, &decision.events).await;
    if !ctx.leadership.is_leading() {
        return Err(ReconcileError::NotLeading { fence: name });
    }
    // What the node's agent is asked, now that the status records why.
    if name == node_name {
        ctx.hearing
            .instruct(&node_name, decision.instructions.clone());
    }
    carry_out(&ctx, &written, &id, &node_name, &decision, plan, now).await?;
    ctx.update_fence_gauges();
    Ok(Requeue::requeue(decision.requeue_after))
}

fn log_decision(fence: &str, node: &str, decision: &Decision) {
    let step = decision
        .status
        .step
        .map_or_else(|| "none".to_string(), |step| step.to_string());
    for event in &decision.events {
        if event.warning {
            tracing::warn!(%fence, %node, %step, reason = event.reason, "{}", event.message);
        } else {
            tracing::info!(%fence, %node, %step, reason = event.reason, "{}", event.message);
        }
    }
}

/// The actions of a decision whose status is written.
async fn carry_out(
    ctx: &Context,
    fence: &NodeFence,
    id: &FenceId,
    node: &str,
    decision: &Decision,
    plan: Option<Arc<FencePlan>>,
    now: Timestamp,
) -> Result<(), ReconcileError> {
    let name = &id.name;
    for action in &decision.actions {
        if let Action::Start(request) = action {
            match &plan {
                Some(plan) => {
                    tracing::info!(fence = %name, %node, execution = %request.name, method = %request.method, "starting execution");
                    ctx.executor.start(id, request, plan.clone());
                }
                None => tracing::error!(
                    fence = %name,
                    execution = %request.name,
                    "no fence configuration to start the execution with; it will be reported lost and verified"
                ),
            }
        }
    }
    let taint_changes: Vec<TaintChange> = decision
        .actions
        .iter()
        .filter_map(|action| match action {
            Action::Taint(change) => Some(*change),
            _ => None,
        })
        .collect();
    if !taint_changes.is_empty() {
        change_taints(ctx, name, node, &taint_changes, now).await?;
    }
    if decision.actions.contains(&Action::DeletePods) {
        delete_pods(ctx, name, node).await?;
    }
    if decision.actions.contains(&Action::DeleteFence) {
        let api: Api<NodeFence> = Api::all(ctx.client.clone());
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: fence.uid(),
                resource_version: fence.resource_version(),
            }),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => tracing::info!(fence = %name, %node, "NodeFence deleted"),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(kube_error(name, "deleting it")(error)),
        }
    }
    Ok(())
}

/// Applies taint changes to the node's current taints, guarded by its resourceVersion.
async fn change_taints(
    ctx: &Context,
    fence: &str,
    node: &str,
    changes: &[TaintChange],
    now: Timestamp,
) -> Result<(), ReconcileError> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let current = nodes
        .get(node)
        .await
        .map_err(kube_error(fence, format!("reading node {node}")))?;
    let mut taints: Vec<Taint> = observe::node_taint_list(&current).to_vec();
    for change in changes {
        match change {
            TaintChange::AddRemediation => {
                if !taints.iter().any(|t| t.key == REMEDIATION_TAINT) {
                    taints.push(Taint {
                        key: REMEDIATION_TAINT.to_string(),
                        effect: "NoSchedule".to_string(),
                        time_added: Some(Time(now)),
                        value: None,
                    });
                }
            }
            TaintChange::RemoveRemediation => taints.retain(|t| t.key != REMEDIATION_TAINT),
            TaintChange::AddOutOfService => {
                if !taints.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT) {
                    taints.push(Taint {
                        key: OUT_OF_SERVICE_TAINT.to_string(),
                        value: Some(OUT_OF_SERVICE_VALUE.to_string()),
                        effect: "NoExecute".to_string(),
                        time_added: Some(Time(now)),
                    });
                }
            }
            TaintChange::RemoveOutOfService => taints.retain(|t| t.key != OUT_OF_SERVICE_TAINT),
        }
    }
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": current.resource_version()},
        "spec": {"taints": taints},
    });
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kube_error(
            fence,
            format!("changing the taints of node {node}"),
        ))?;
    let changes: Vec<&str> = changes.iter().map(TaintChange::describe).collect();
    tracing::info!(%fence, %node, changes = %changes.join(", "), "taints changed");
    Ok(())
}

/// The cluster fence: force-deletes the node's pods (grace period 0), each guarded by its
/// uid so a pod of the same name created elsewhere meanwhile is never touched.
async fn delete_pods(ctx: &Context, fence: &str, node: &str) -> Result<(), ReconcileError> {
    let pods = list_node_pods(ctx, fence, node).await?;
    for pod in pods.iter().filter(|pod| observe::is_releasable(pod)) {
        let namespace = pod.namespace().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let pod_name = pod.name_any();
        match api.delete(&pod_name, &params).await {
            Ok(_) => {
                tracing::info!(%fence, %node, pod = %format!("{namespace}/{pod_name}"), "pod force-deleted")
            }
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
            Err(error) => {
                return Err(kube_error(
                    fence,
                    format!("deleting pod {namespace}/{pod_name}"),
                )(error));
            }
        }
    }
    Ok(())
}

/// Counts what changed between two statuses.
fn record_metrics(
    metrics: &ControllerMetrics,
    before: &NodeFenceStatus,
    after: &NodeFenceStatus,
    health: &NodeHealth,
) {
    // Delays count from when the node's trouble began: the recorded evidence's start, or
    // the Ready condition's transition.
    let trouble_since = after
        .lost
        .as_ref()
        .map(|lost| lost.since.0)
        .or(health.since);
    let seconds = |from: Timestamp, to: Timestamp| {
        Duration::try_from(to.duration_since(from))
            .unwrap_or_default()
            .as_secs_f64()
    };
    for execution in after.executions.iter().filter(|e| e.is_finished()) {
        let was_finished = before
            .executions
            .iter()
            .any(|old| old.name == execution.name && old.is_finished());
        if !was_finished {
            metrics
                .executions
                .get_or_create(&ExecutionLabels {
                    step: format!("{:?}", execution.step),
                    method: execution.method.clone(),
                    agent: execution.agent.clone(),
                    result: execution
                        .result
                        .map(|r| format!("{r:?}"))
                        .unwrap_or_default(),
                })
                .inc();
        }
    }
    if before.started_at.is_none()
        && let Some(started) = &after.started_at
    {
        metrics.fences_started.inc();
        if let Some(since) = trouble_since {
            metrics.fence_start_delay.observe(seconds(since, started.0));
        }
    }
    if before.confirmed_at.is_none()
        && let Some(confirmed) = &after.confirmed_at
    {
        // A fence confirmed without a step's own proof is labelled by what confirmed it:
        // the node's crash kernel, the node's own word that it drained, or its agent's
        // isolation.
        let by_kdump = after
            .confirmed_by
            .as_deref()
            .is_some_and(|by| by.starts_with("kdump:"));
        let by_promise = after.is_released_on_promise();
        let [kdump, promise, self_isolation, drained] = CONFIRMED_WITHOUT_A_STEP;
        let step = match (after.step, after.self_isolation.is_some()) {
            _ if by_kdump => kdump.to_string(),
            _ if by_promise => promise.to_string(),
            (Some(step), _) => format!("{step:?}"),
            (None, true) => self_isolation.to_string(),
            (None, false) => drained.to_string(),
        };
        metrics
            .fences_confirmed
            .get_or_create(&StepLabels { step })
            .inc();
        if let Some(started) = &after.started_at {
            metrics
                .fence_confirm_duration
                .observe(seconds(started.0, confirmed.0));
        }
    }
    let released = |status: &NodeFenceStatus| {
        status
            .out_of_service_at
            .as_ref()
            .or(status.pods_deleted_at.as_ref())
            .map(|time| time.0)
    };
    if released(before).is_none()
        && let (Some(at), Some(since)) = (released(after), trouble_since)
    {
        metrics.pods_release_delay.observe(seconds(since, at));
    }
    if !observe::has_failed(before) && observe::has_failed(after) {
        metrics
            .fences_failed
            .get_or_create(&StepLabels {
                step: after.step.map(|s| format!("{s:?}")).unwrap_or_default(),
            })
            .inc();
    }
    if before.recovered_at.is_none() && after.recovered_at.is_some() {
        metrics.fences_recovered.inc();
    }
}

static EVENT_SEQUENCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Publishes the decision's Events on the NodeFence and its Node. An Event that cannot
/// be written is logged and dropped: the transition itself is in the status.
async fn publish_events(ctx: &Context, fence: &NodeFence, node: &str, events: &[FenceEvent]) {
    if events.is_empty() {
        return;
    }
    let fence_ref = fence.object_ref(&());
    let node_ref = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some("Node".to_string()),
        name: Some(node.to_string()),
        // The kubelet and the node lifecycle controller name a Node's Events by its name
        // as uid; kubectl describe node finds them that way.
        uid: Some(node.to_string()),
        ..Default::default()
    };
    let api: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(ctx.client.clone(), "default");
    for event in events {
        for regarding in [&fence_ref, &node_ref] {
            let now = (ctx.clock)();
            let object = regarding.name.clone().unwrap_or_default();
            // Unique per process even within one clock tick (a fence and its node share
            // a name).
            let sequence = EVENT_SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let body = k8s_openapi::api::events::v1::Event {
                metadata: kube::api::ObjectMeta {
                    name: Some(format!("{object}.{:x}.{sequence}", now.as_nanosecond())),
                    namespace: Some("default".to_string()),
                    ..Default::default()
                },
                event_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    now,
                )),
                action: Some("Fence".to_string()),
                reason: Some(event.reason.to_string()),
                note: Some(event.message.clone()),
                type_: Some(if event.warning { "Warning" } else { "Normal" }.to_string()),
                regarding: Some(regarding.clone()),
                reporting_controller: Some("fencing.nodekeeper.io/controller".to_string()),
                reporting_instance: Some(ctx.identity.clone()),
                ..Default::default()
            };
            if let Err(error) = api.create(&PostParams::default(), &body).await {
                tracing::warn!(fence = %fence.name_any(), reason = event.reason, %error, "could not publish an Event");
            }
        }
    }
}

/// Whether `node` runs a pod that needs fencing, for the node watch's "create a fence"
/// rule.
pub async fn node_needs_fencing(ctx: &Context, node: &str) -> Result<bool, ReconcileError> {
    Ok(node_pods(ctx, node, node).await?.1)
}
