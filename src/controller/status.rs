//! What `nodekeeper controller status` shows: every watched node's health and fence, and
//! the storm guard's verdict, computed from the cluster alone (Nodes and NodeFences) with
//! the same pure functions the controller uses, so it needs no connection to the
//! controller and reads the same after any restart.

use std::fmt::Write as _;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use super::facts::Readiness;
use super::observe;
use super::policy::ControllerPolicy;
use super::resource::NodeFence;
use super::storm::{StormState, ZoneView, assess, zone_name};
use crate::report::AgentView;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerStatus {
    pub storm: StormState,
    pub watched_nodes: usize,
    pub unhealthy_nodes: usize,
    pub zones: Vec<ZoneStatus>,
    pub nodes: Vec<NodeStatus>,
    /// Whether the controller's agent reports were read (`--controller-url`).
    pub agent_reports_read: bool,
    /// NodeFences whose node is not among the watched nodes (deleted, or outside the
    /// node selector), so nothing an operator should know about is hidden.
    pub other_fences: Vec<FenceStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ZoneStatus {
    pub zone: String,
    #[serde(flatten)]
    pub view: ZoneView,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    pub name: String,
    pub zone: String,
    pub readiness: Readiness,
    /// When the Ready condition last changed.
    pub since: Option<Timestamp>,
    pub excluded: bool,
    pub fence: Option<FenceStatus>,
    /// The node's latest agent report, when the controller was asked and has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentStatus>,
}

/// What a node's agent last reported, in brief.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    pub summary: String,
    pub age_seconds: f64,
    /// Reported within three report intervals.
    pub fresh: bool,
    pub boot_id: String,
    pub agent_version: String,
}

impl AgentStatus {
    fn of(view: &AgentView) -> AgentStatus {
        AgentStatus {
            summary: view.summary(),
            age_seconds: view.age_seconds,
            fresh: view.fresh,
            boot_id: view.report.boot_id.clone(),
            agent_version: view.report.agent_version.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FenceStatus {
    pub name: String,
    pub node: String,
    pub step: Option<String>,
    pub phase: Option<String>,
    pub paused: Option<String>,
    pub pause_message: Option<String>,
    pub confirmed: bool,
    pub retries: u32,
    pub last_result: Option<String>,
}

fn fence_status(fence: &NodeFence) -> FenceStatus {
    let status = fence.status.clone().unwrap_or_default();
    FenceStatus {
        name: fence.metadata.name.clone().unwrap_or_default(),
        node: fence.spec.node_name.clone(),
        step: status.step.map(|step| format!("{step:?}")),
        phase: status.phase.map(|phase| format!("{phase:?}")),
        paused: status.pause.as_ref().map(|p| format!("{:?}", p.reason)),
        pause_message: status.pause.as_ref().map(|p| p.message.clone()),
        confirmed: status.confirmed_at.is_some(),
        retries: status.retries,
        last_result: status.last_result,
    }
}

/// The status of every watched node and fence at `now`, with the agents' latest reports
/// when the controller was asked for them.
pub fn build(
    nodes: &[Node],
    fences: &[NodeFence],
    reports: Option<&[AgentView]>,
    policy: &ControllerPolicy,
    now: Timestamp,
) -> ControllerStatus {
    let watched: Vec<&Node> = nodes
        .iter()
        .filter(|node| observe::is_selected(node, policy.node_selector.as_ref()))
        .collect();
    let views: Vec<_> = watched
        .iter()
        .map(|node| observe::node_view(node))
        .collect();
    let memory = observe::storm_memory_from(fences);
    let assessment = assess(&views, memory, &policy.storm, now);
    let fence_of = |name: &str| {
        fences
            .iter()
            .find(|fence| fence.spec.node_name == name)
            .map(fence_status)
    };
    // By node, so thousands of nodes are matched with their agents in one pass.
    let agents: std::collections::HashMap<&str, &AgentView> = reports
        .unwrap_or_default()
        .iter()
        .map(|view| (view.report.node.as_str(), view))
        .collect();
    let mut node_statuses: Vec<NodeStatus> = watched
        .iter()
        .map(|node| {
            let name = node.metadata.name.clone().unwrap_or_default();
            let health = observe::node_health(node);
            let agent = agents.get(name.as_str()).map(|view| AgentStatus::of(view));
            NodeStatus {
                agent,
                fence: fence_of(&name),
                zone: zone_name(&observe::node_zone(node)),
                readiness: health.readiness,
                since: health.since,
                excluded: observe::is_excluded(node),
                name,
            }
        })
        .collect();
    node_statuses.sort_by(|a, b| a.name.cmp(&b.name));
    let mut other_fences: Vec<FenceStatus> = fences
        .iter()
        .filter(|fence| !node_statuses.iter().any(|n| n.name == fence.spec.node_name))
        .map(fence_status)
        .collect();
    other_fences.sort_by(|a, b| a.name.cmp(&b.name));
    ControllerStatus {
        storm: assessment.storm.clone(),
        watched_nodes: views.len(),
        unhealthy_nodes: views
            .iter()
            .filter(|view| view.readiness != Readiness::Ready)
            .count(),
        zones: assessment
            .zones
            .iter()
            .map(|(zone, view)| ZoneStatus {
                zone: zone_name(zone),
                view: view.clone(),
            })
            .collect(),
        nodes: node_statuses,
        agent_reports_read: reports.is_some(),
        other_fences,
    }
}

fn ago(since: Option<Timestamp>, now: Timestamp) -> String {
    let Some(since) = since else {
        return "-".to_string();
    };
    let seconds = Duration::try_from(now.duration_since(since))
        .unwrap_or_default()
        .as_secs();
    match seconds {
        0..=119 => format!("{seconds}s"),
        120..=7199 => format!("{}m", seconds / 60),
        _ => format!("{}h", seconds / 3600),
    }
}

/// The status for a person.
pub fn render(status: &ControllerStatus, now: Timestamp) -> String {
    let mut out = String::new();
    let storm = match &status.storm {
        StormState::Calm => format!(
            "calm: {} of {} watched nodes unhealthy",
            status.unhealthy_nodes, status.watched_nodes
        ),
        StormState::Storm {
            unhealthy,
            total,
            allowed,
        } => format!(
            "STORM: {unhealthy} of {total} watched nodes unhealthy, at most {allowed} may be; no fence acts"
        ),
        StormState::Cooldown { until } => {
            format!("cooldown after a storm: no fence acts until {until}")
        }
    };
    let _ = writeln!(out, "Storm guard: {storm}");
    if status.agent_reports_read {
        let fresh = status
            .nodes
            .iter()
            .filter(|node| node.agent.as_ref().is_some_and(|agent| agent.fresh))
            .count();
        let _ = writeln!(
            out,
            "Agent reports: {fresh} of {} watched nodes reporting",
            status.nodes.len()
        );
    }
    out.push('\n');
    let mut zones = vec![vec![
        "ZONE".to_string(),
        "STATE".to_string(),
        "READY".to_string(),
        "NOT READY".to_string(),
        "FENCES/S".to_string(),
    ]];
    zones.extend(status.zones.iter().map(|zone| {
        vec![
            zone.zone.clone(),
            format!("{:?}", zone.view.state),
            zone.view.ready.to_string(),
            zone.view.not_ready.to_string(),
            zone.view.rate.to_string(),
        ]
    }));
    out.push_str(&crate::text::aligned(&zones));
    out.push('\n');
    let mut rows = vec![
        [
            "NODE",
            "READY",
            "SINCE",
            "FENCE STEP",
            "PHASE",
            "PAUSED",
            "LAST RESULT",
        ]
        .map(String::from)
        .to_vec(),
    ];
    if status.agent_reports_read {
        rows[0].push("AGENT".to_string());
    }
    let agent_cell = |agent: Option<&AgentStatus>| match agent {
        None => "no report".to_string(),
        Some(agent) if agent.fresh => agent.summary.clone(),
        Some(agent) => format!(
            "silent {}s (last: {})",
            agent.age_seconds.round(),
            agent.summary
        ),
    };
    let dash = || "-".to_string();
    let fence_cells = |fence: Option<&FenceStatus>| match fence {
        None => vec![dash(), dash(), dash(), dash()],
        Some(fence) => vec![
            fence
                .step
                .clone()
                .unwrap_or_else(|| "(waiting)".to_string()),
            fence.phase.clone().unwrap_or_else(dash),
            fence.paused.clone().unwrap_or_else(dash),
            fence.last_result.clone().unwrap_or_else(dash),
        ],
    };
    for node in &status.nodes {
        let readiness = match node.readiness {
            Readiness::Ready => "Ready",
            Readiness::NotReady => "NotReady",
            Readiness::Unknown => "Unknown",
        };
        let mut row = vec![
            node.name.clone(),
            if node.excluded {
                format!("{readiness} (excluded)")
            } else {
                readiness.to_string()
            },
            ago(node.since, now),
        ];
        row.extend(fence_cells(node.fence.as_ref()));
        if status.agent_reports_read {
            row.push(agent_cell(node.agent.as_ref()));
        }
        rows.push(row);
    }
    for fence in &status.other_fences {
        let mut row = vec![fence.node.clone(), "(not watched)".to_string(), dash()];
        row.extend(fence_cells(Some(fence)));
        if status.agent_reports_read {
            row.push(dash());
        }
        rows.push(row);
    }
    out.push_str(&crate::text::aligned(&rows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::resource::{NodeFenceSpec, NodeFenceStatus, Pause, PauseReason};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn node(name: &str, ready: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": ready,
                "lastTransitionTime": "2026-11-24T01:00:00Z"}]}
        }))
        .expect("node")
    }

    fn paused_fence(node: &str, reason: PauseReason) -> NodeFence {
        let mut fence = NodeFence::new(
            node,
            NodeFenceSpec {
                node_name: node.to_string(),
                force: false,
            },
        );
        fence.status = Some(NodeFenceStatus {
            pause: Some(Pause {
                reason,
                message: "held".to_string(),
                since: Time("2026-11-24T01:00:30Z".parse().expect("time")),
                until: None,
            }),
            ..NodeFenceStatus::default()
        });
        fence
    }

    #[test]
    fn a_storm_is_shown_with_every_node_and_its_paused_fence() {
        let nodes = [
            node("a", "Unknown"),
            node("b", "Unknown"),
            node("c", "Unknown"),
            node("d", "True"),
            node("e", "True"),
        ];
        let fences = [
            paused_fence("a", PauseReason::StormGuard),
            paused_fence("gone", PauseReason::NodeGone),
        ];
        let now: Timestamp = "2026-11-24T01:01:00Z".parse().expect("time");
        let status = build(&nodes, &fences, None, &ControllerPolicy::default(), now);
        assert_eq!(
            status.storm,
            StormState::Storm {
                unhealthy: 3,
                total: 5,
                allowed: 2
            }
        );
        assert_eq!(status.nodes.len(), 5);
        assert_eq!(
            status.nodes[0]
                .fence
                .as_ref()
                .and_then(|f| f.paused.as_deref()),
            Some("StormGuard")
        );
        assert_eq!(
            status.other_fences.len(),
            1,
            "a fence of a gone node is shown"
        );
        let text = render(&status, now);
        assert!(
            text.starts_with("Storm guard: STORM: 3 of 5 watched nodes unhealthy, at most 2"),
            "{text}"
        );
        let row_a = text
            .lines()
            .find(|l| l.starts_with("a "))
            .expect("row for a");
        assert!(
            row_a.contains("Unknown") && row_a.contains("60s"),
            "{row_a}"
        );
        assert!(
            row_a.contains("(waiting)") && row_a.contains("StormGuard"),
            "{row_a}"
        );
        assert!(text.contains("(not watched)"), "{text}");
        assert!(
            !text.contains("AGENT"),
            "reports were not asked for: {text}"
        );
    }

    #[test]
    fn agent_reports_are_shown_per_node_when_read() {
        let nodes = [node("a", "True"), node("b", "True"), node("c", "Unknown")];
        let view = |name: &str, fresh: bool, age_seconds: f64| {
            let mut report = crate::report::protocol::sample();
            report.node = name.to_string();
            AgentView {
                received_at: "2026-11-24T01:00:55Z".parse().expect("time"),
                age_seconds,
                fresh,
                credential: "serviceAccount".to_string(),
                report,
            }
        };
        let reports = [view("a", true, 1.2), view("c", false, 41.0)];
        let now: Timestamp = "2026-11-24T01:01:00Z".parse().expect("time");
        let status = build(
            &nodes,
            &[],
            Some(&reports),
            &ControllerPolicy::default(),
            now,
        );
        assert_eq!(
            status.nodes[0].agent.as_ref().map(|a| a.summary.as_str()),
            Some("MemoryPressure")
        );
        assert!(status.nodes[1].agent.is_none());
        let text = render(&status, now);
        assert!(
            text.contains("Agent reports: 1 of 3 watched nodes reporting"),
            "{text}"
        );
        let row = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_default()
                .to_string()
        };
        assert!(row("a").ends_with("MemoryPressure"), "{text}");
        assert!(row("b").ends_with("no report"), "{text}");
        assert!(
            row("c").ends_with("silent 41s (last: MemoryPressure)"),
            "{text}"
        );
    }
}
