//! The node watch: keeps the node store the storm guard and the reconciles read, creates
//! a NodeFence for a node that is lost (see `liveness.rs`: its Ready condition for
//! `unhealthyDuration`, or for a node with an agent both its Lease and its reports silent
//! for `silenceTimeout`) and runs pods that need fencing, and wakes the fences a node
//! change concerns.
//!
//! A fence is created at the moment the node becomes due, not on the next periodic
//! sweep: each unhealthy node's due time is kept and the watch sleeps until the earliest.
//! Silence comes without any event, so the watch also looks at the silent nodes every
//! second: a change among them moves the storm guard, like a readiness change.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{self, ObjectRef, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::task::JoinSet;

use super::facts::Readiness;
use super::liveness::{Evidence, Liveness, NodeState, judge};
use super::observe;
use super::policy::FencePolicy;
use super::reconciler::Context;
use super::resource::{FIELD_MANAGER, NodeFence, NodeFenceSpec};

/// How soon a due node whose pods need no fencing (or whose check failed) is looked at
/// again.
const RECHECK: Duration = Duration::from_secs(15);

/// How often the silent nodes are looked at.
const SILENCE_TICK: Duration = Duration::from_secs(1);

/// How `node` stands for a fence, if it can be fenced at all: selected and not excluded.
fn judged(
    node: &Node,
    selector: Option<&kube::core::Selector>,
    liveness: &Liveness,
    policy: &FencePolicy,
    now: Timestamp,
) -> Option<NodeState> {
    if !observe::is_selected(node, selector) || observe::is_excluded(node) {
        return None;
    }
    Some(judge(&observe::node_health(node), liveness, policy, now))
}

/// When a node in `state` is to be looked at for a fence: a lost node when the rule that
/// found it lost says (the Ready condition's transition plus `unhealthyDuration`, the
/// moment both its channels fell silent, or a drained node's agent and kubelet stopped);
/// a held one when its hold may end; a healthy one never.
fn due_of(state: &NodeState) -> Option<Timestamp> {
    match state {
        NodeState::Healthy => None,
        NodeState::Lost { fence_at, .. } => Some(*fence_at),
        // Due at once: its agent is asked to isolate it.
        NodeState::Partitioned { since, .. } => Some(*since),
        NodeState::Held { until, .. } => Some(*until),
    }
}

/// When `node` is to be looked at for a fence, if it can become due at all: selected,
/// not excluded, not healthy (see [`due_of`]).
pub fn fence_due(
    node: &Node,
    selector: Option<&kube::core::Selector>,
    liveness: &Liveness,
    policy: &FencePolicy,
    now: Timestamp,
) -> Option<Timestamp> {
    due_of(&judged(node, selector, liveness, policy, now)?)
}

/// [`judged`] for a node of the store, with what the controller hears of it.
fn state_in(ctx: &Context, node: &Node, now: Timestamp) -> Option<NodeState> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    judged(
        node,
        ctx.policy.node_selector.as_ref(),
        &ctx.hearing.liveness(name, now),
        &ctx.policy.fence,
        now,
    )
}

/// [`fence_due`] for a node of the store.
fn due_in(ctx: &Context, node: &Node, now: Timestamp) -> Option<Timestamp> {
    due_of(&state_in(ctx, node, now)?)
}

/// Drops what the controller never reads, so 5,000 nodes stay small in memory: managed
/// fields, annotations, the image list, volume device paths, capacity, node info and
/// every address but the InternalIPs. Which volumes are attached is kept (a drained node
/// is released for them), and the InternalIPs (its kdump notifications come from one).
pub fn strip(node: &mut Node) {
    node.metadata.managed_fields = None;
    node.metadata.annotations = None;
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        for volume in status.volumes_attached.iter_mut().flatten() {
            volume.device_path = String::new();
        }
        status.volumes_in_use = None;
        // Only the boot ID: a self-isolation promise counts only for the boot that made
        // it.
        status.node_info =
            status
                .node_info
                .take()
                .map(|info| k8s_openapi::api::core::v1::NodeSystemInfo {
                    boot_id: info.boot_id,
                    ..Default::default()
                });
        status.capacity = None;
        status.allocatable = None;
        if let Some(addresses) = status.addresses.as_mut() {
            addresses.retain(|address| address.type_ == "InternalIP");
        }
        status.daemon_endpoints = None;
        status.config = None;
    }
}

/// How often every node without a fence is looked at again: a NodeFence deleted by an
/// operator (to start over) or cancelled while its node stays lost is created anew.
const SWEEP: Duration = Duration::from_secs(15);

/// Runs the node watch until the stream ends (never, unless the client is dropped).
/// `wake` takes the names of fences to reconcile now.
pub async fn watch_nodes(
    ctx: Arc<Context>,
    writer: Writer<Node>,
    wake: tokio::sync::mpsc::UnboundedSender<String>,
) {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default())
            .modify(strip)
            .default_backoff(),
    );
    let mut stream = std::pin::pin!(stream);
    let mut readiness: HashMap<String, Readiness> = HashMap::new();
    let mut due: HashMap<String, Timestamp> = HashMap::new();
    // Creations run beside the watch, so the node store stays current while they list
    // pods: the storm guard must never count stale readiness.
    let mut creating: JoinSet<(String, Option<Timestamp>)> = JoinSet::new();
    let mut in_progress: HashSet<String> = HashSet::new();
    let mut sweep = tokio::time::interval(SWEEP);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut silence_tick = tokio::time::interval(SILENCE_TICK);
    silence_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut silent: BTreeSet<String> = BTreeSet::new();
    // The guard is assessed only over a complete node list.
    let mut listed = false;
    loop {
        let now = (ctx.clock)();
        let next = due.values().min().copied();
        let sleep = next.map_or(Duration::from_secs(3600), |at| {
            Duration::try_from(at.duration_since(now)).unwrap_or(Duration::ZERO)
        });
        tokio::select! {
            event = stream.next() => {
                let Some(event) = event else { return };
                if let Ok(event) = &event {
                    ctx.guard_views().apply(event, ctx.policy.node_selector.as_ref());
                }
                match event {
                    Ok(watcher::Event::Apply(node)) => {
                        observe_node(&ctx, &node, &mut readiness, &mut due, &wake, true);
                    }
                    Ok(watcher::Event::InitApply(node)) => {
                        // The store is swapped in at InitDone; a storm judged on half a
                        // list would be wrong both ways.
                        observe_node(&ctx, &node, &mut readiness, &mut due, &wake, false);
                    }
                    Ok(watcher::Event::Delete(node)) => {
                        let name = node.metadata.name.clone().unwrap_or_default();
                        readiness.remove(&name);
                        due.remove(&name);
                        let _ = wake.send(name);
                        ctx.assess((ctx.clock)());
                    }
                    Ok(watcher::Event::InitDone) => {
                        listed = true;
                        ctx.assess((ctx.clock)());
                    }
                    Ok(watcher::Event::Init) => {}
                    Err(error) => tracing::warn!(%error, "node watch failed; it is restarted with backoff"),
                }
            }
            Some(finished) = creating.join_next(), if !creating.is_empty() => {
                if let Ok((name, again)) = finished {
                    in_progress.remove(&name);
                    if let Some(at) = again {
                        due.entry(name).or_insert(at);
                    }
                }
            }
            _ = sweep.tick() => {
                let now = (ctx.clock)();
                for node in ctx.nodes.state() {
                    let name = node.metadata.name.clone().unwrap_or_default();
                    if due.contains_key(&name)
                        || in_progress.contains(&name)
                        || ctx.fences.get(&ObjectRef::new(&name)).is_some()
                    {
                        continue;
                    }
                    if let Some(at) = due_in(&ctx, &node, now) {
                        due.insert(name, at);
                    }
                }
            }
            _ = silence_tick.tick(), if listed && ctx.hearing.enabled() => {
                let now = (ctx.clock)();
                let quiet = ctx.hearing.quiet_nodes(now);
                let heard_silent: BTreeSet<String> = quiet.silent.into_iter().collect();
                if heard_silent != silent {
                    for name in heard_silent.difference(&silent) {
                        tracing::warn!(node = %name, "the node's Lease and its agent's reports are both falling silent");
                    }
                    for name in silent.difference(&heard_silent) {
                        tracing::info!(node = %name, "the node is heard again");
                    }
                    silent = heard_silent;
                    // Silence moves the storm guard as readiness does.
                    ctx.assess(now);
                    for fence in ctx.fences.state() {
                        let _ = wake.send(fence.metadata.name.clone().unwrap_or_default());
                    }
                }
                // A silent node becomes due the moment its silence is long enough; one
                // that said it drained, as soon as its agent and kubelet stopped.
                for name in silent.iter().chain(quiet.drained.iter()) {
                    if due.contains_key(name)
                        || in_progress.contains(name)
                        || ctx.fences.get(&ObjectRef::new(name)).is_some()
                    {
                        continue;
                    }
                    if let Some(node) = ctx.nodes.get(&ObjectRef::new(name))
                        && let Some(at) = due_in(&ctx, &node, now)
                    {
                        due.insert(name.clone(), at);
                    }
                }
            }
            _ = tokio::time::sleep(sleep) => {
                let now = (ctx.clock)();
                let ready: Vec<String> = due
                    .iter()
                    .filter(|(_, at)| **at <= now)
                    .map(|(name, _)| name.clone())
                    .collect();
                for name in ready {
                    due.remove(&name);
                    if in_progress.insert(name.clone()) {
                        let ctx = ctx.clone();
                        creating.spawn(async move {
                            let again = create_if_needed(&ctx, &name, now).await;
                            (name, again)
                        });
                    }
                }
            }
        }
    }
}

fn observe_node(
    ctx: &Context,
    node: &Node,
    readiness: &mut HashMap<String, Readiness>,
    due: &mut HashMap<String, Timestamp>,
    wake: &tokio::sync::mpsc::UnboundedSender<String>,
    synced: bool,
) {
    let name = node.metadata.name.clone().unwrap_or_default();
    let now = (ctx.clock)();
    let current = observe::node_health(node).readiness;
    let changed = readiness.insert(name.clone(), current) != Some(current);
    if changed && synced {
        // A node's readiness moves the storm guard, which every fence obeys: evaluate it
        // now (a storm is remembered even if no fence exists yet) and wake them all.
        ctx.assess(now);
        for fence in ctx.fences.state() {
            let _ = wake.send(fence.metadata.name.clone().unwrap_or_default());
        }
    } else if ctx.fences.get(&ObjectRef::new(&name)).is_some() {
        let _ = wake.send(name.clone());
    }
    let has_fence = ctx.fences.get(&ObjectRef::new(&name)).is_some();
    match due_in(ctx, node, now) {
        Some(at) if !has_fence => {
            // Keep an earlier due time: a node without a transition time must not have
            // its wait restarted by every update.
            due.entry(name).or_insert(at);
        }
        _ => {
            due.remove(&name);
        }
    }
}

/// Creates the node's NodeFence if it still needs one; returns when to look again if it
/// does not (yet).
async fn create_if_needed(ctx: &Context, name: &str, now: Timestamp) -> Option<Timestamp> {
    if ctx.fences.get(&ObjectRef::new(name)).is_some() {
        return None;
    }
    let node = ctx.nodes.get(&ObjectRef::new(name))?;
    let state = state_in(ctx, &node, now)?;
    // A held node's hold always ends after now, so only a lost one gets past this.
    let due = due_of(&state)?;
    if due > now {
        return Some(due);
    }
    // A node that drained cleanly runs no pods any more, but the volumes it leaves
    // attached are released with it.
    let drained_with_volumes = observe::volumes_attached(&node) > 0
        && matches!(
            state,
            NodeState::Lost {
                evidence: Evidence::Drained,
                ..
            }
        );
    if !drained_with_volumes {
        match super::reconciler::node_needs_fencing(ctx, name).await {
            Ok(true) => {}
            Ok(false) => return Some(now + RECHECK),
            Err(error) => {
                tracing::warn!(node = %name, %error, "cannot tell whether the node needs fencing");
                return Some(now + RECHECK);
            }
        }
    }
    let fence = NodeFence::new(
        name,
        NodeFenceSpec {
            node_name: name.to_string(),
            force: false,
        },
    );
    let api: Api<NodeFence> = Api::all(ctx.client.clone());
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PostParams::default()
    };
    match api.create(&params, &fence).await {
        Ok(_) => {
            tracing::warn!(node = %name, "node lost: NodeFence created");
            None
        }
        Err(kube::Error::Api(status)) if status.code == 409 => None,
        Err(error) => {
            tracing::warn!(node = %name, %error, "could not create the NodeFence");
            Some(now + Duration::from_secs(5))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(yaml: &str) -> Node {
        serde_yaml_ng::from_str(yaml).expect("node")
    }

    fn at(text: &str) -> Timestamp {
        text.parse().expect("time")
    }

    fn waiting(unhealthy: u64) -> FencePolicy {
        FencePolicy {
            unhealthy_duration: Duration::from_secs(unhealthy),
            ..FencePolicy::default()
        }
    }

    #[test]
    fn a_node_is_due_unhealthy_duration_after_its_ready_condition_turned() {
        let lost = node(
            "metadata: {name: a}\nstatus: {conditions: [{type: Ready, status: Unknown, lastTransitionTime: '2026-11-24T01:00:00Z'}]}\n",
        );
        assert_eq!(
            fence_due(
                &lost,
                None,
                &Liveness::NoAgent,
                &waiting(60),
                at("2026-11-24T01:00:10Z")
            ),
            Some(at("2026-11-24T01:01:00Z"))
        );
        let ready = node("status: {conditions: [{type: Ready, status: 'True'}]}\n");
        assert_eq!(
            fence_due(
                &ready,
                None,
                &Liveness::NoAgent,
                &waiting(60),
                at("2026-11-24T01:00:10Z")
            ),
            None
        );
    }

    #[test]
    fn excluded_or_unselected_nodes_are_never_due() {
        let excluded = node(
            "metadata: {labels: {fencing.nodekeeper.io/exclude: 'true'}}\nstatus: {conditions: [{type: Ready, status: 'False'}]}\n",
        );
        assert_eq!(
            fence_due(
                &excluded,
                None,
                &Liveness::NoAgent,
                &waiting(0),
                at("2026-11-24T01:00:00Z")
            ),
            None
        );
        let worker = node(
            "metadata: {labels: {role: db}}\nstatus: {conditions: [{type: Ready, status: 'False'}]}\n",
        );
        let selector = kube::core::Selector::from_iter([("role", "worker")]);
        assert_eq!(
            fence_due(
                &worker,
                Some(&selector),
                &Liveness::NoAgent,
                &waiting(0),
                at("2026-11-24T01:00:00Z")
            ),
            None
        );
    }

    #[test]
    fn a_future_or_missing_transition_counts_from_now() {
        let skewed = node(
            "status: {conditions: [{type: Ready, status: 'False', lastTransitionTime: '2026-11-24T02:00:00Z'}]}\n",
        );
        assert_eq!(
            fence_due(
                &skewed,
                None,
                &Liveness::NoAgent,
                &waiting(60),
                at("2026-11-24T01:00:00Z")
            ),
            Some(at("2026-11-24T01:01:00Z"))
        );
    }

    #[test]
    fn a_ready_node_with_an_agent_is_due_when_both_channels_fell_silent() {
        let ready = node(
            "metadata: {name: a}\nstatus: {conditions: [{type: Ready, status: 'True', lastTransitionTime: '2026-11-24T00:00:00Z'}]}\n",
        );
        let channels = crate::controller::liveness::Channels {
            lease: at("2026-11-24T01:00:00Z"),
            lease_fresh_within: Duration::from_secs(20),
            report: at("2026-11-24T01:00:01Z"),
            reports_fresh_within: Duration::from_secs(6),
            drained: None,
            isolation: None,
            api_reachable_since: None,
            promise: None,
            boot: None,
        };
        let policy = waiting(300);
        for (now, due) in [
            // Heard a second ago: healthy, nothing due.
            ("2026-11-24T01:00:02Z", None),
            // Both silent for silenceTimeout (20 s): due then, not unhealthyDuration later.
            ("2026-11-24T01:00:30Z", Some(at("2026-11-24T01:00:21Z"))),
        ] {
            assert_eq!(
                fence_due(&ready, None, &Liveness::Heard(channels), &policy, at(now)),
                due,
                "at {now}"
            );
        }
    }

    #[test]
    fn stripping_keeps_what_the_controller_reads() {
        let mut n = node(
            "metadata:\n  name: a\n  labels: {topology.kubernetes.io/zone: z}\n  annotations: {big: x}\n\
             spec: {taints: [{key: k, effect: NoSchedule}]}\n\
             status:\n  conditions: [{type: Ready, status: 'True'}]\n  images: [{names: [a], sizeBytes: 1}]\n  \
             volumesAttached: [{name: kubernetes.io/csi/pd^vol-1, devicePath: /dev/disk/by-id/long}]\n  \
             addresses: [{type: Hostname, address: a}, {type: InternalIP, address: 10.0.0.5}, \
             {type: ExternalIP, address: 203.0.113.5}, {type: InternalIP, address: 'fd00::5'}]\n",
        );
        strip(&mut n);
        assert_eq!(
            observe::internal_ips(&n),
            [
                "10.0.0.5".parse::<std::net::IpAddr>().expect("address"),
                "fd00::5".parse().expect("address")
            ]
        );
        assert_eq!(
            n.status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .map(Vec::len),
            Some(2)
        );
        assert_eq!(observe::volumes_attached(&n), 1);
        assert_eq!(
            n.status
                .as_ref()
                .and_then(|s| s.volumes_attached.as_ref())
                .map(|v| v[0].device_path.as_str()),
            Some("")
        );
        assert!(n.metadata.annotations.is_none());
        assert!(n.status.as_ref().and_then(|s| s.images.as_ref()).is_none());
        assert_eq!(observe::node_zone(&n), ":\0:z");
        assert!(observe::node_health(&n).is_ready());
        assert_eq!(observe::node_taint_list(&n).len(), 1);
    }
}
