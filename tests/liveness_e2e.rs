//! Silence detection end to end: the real controller process, real agent processes
//! reporting to it (each for its own node, with its node token), the nodes' kubelets
//! played by a task renewing their Leases in `kube-node-lease` through the API, and
//! fencing through `fence_ipmilan` against `ipmi_sim`. What is asserted is what an
//! operator sees: when a NodeFence appears and why, the emulator's power, the pod, the
//! storm guard's state.
//!
//! Nothing here ever marks a node NotReady unless the test is about a node that is, so a
//! fence can only come from the silence of both channels.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use support::agent_process::AgentProcess;
use support::apiserver::FakeApiServer;
use support::controller::*;
use support::fence_emulators::IpmiSim;
use support::kubelet::Kubelets;
use support::reports::{PromiseRig, Reporting, report_from, token_of};

/// Short enough for a test; every node is heard every half second on each channel.
const SILENCE: Duration = Duration::from_secs(3);

/// The real agent of `node`, in dry-run mode, reporting every half second to
/// `reports` with its node token.
fn start_agent(dir: &Path, node: &str, reports: &str) -> AgentProcess {
    AgentProcess::dry_run(&AgentProcess::reporting_config(
        dir,
        node,
        reports,
        &token_of(node),
        "",
    ))
}

/// The controller with silence detection (`silenceTimeout` 3 s), node-token reports on
/// `reports_address`, and `settings`.
fn start_controller(
    dir: &Path,
    server: &FakeApiServer,
    reports_address: &str,
    settings: &str,
) -> ControllerProcess {
    let config = controller_config(
        dir,
        &format!(
            "silenceTimeout: {}s\n{settings}\
             reports: {{address: \"{reports_address}\", nodeTokensSecret: node-tokens, reconnectGrace: 20s}}\n",
            SILENCE.as_secs()
        ),
    );
    ControllerProcess::start_logging(dir, server, &config, DEBUG_LOG)
}

/// Waits until the controller has a report from each of `nodes`.
async fn all_heard(controller: &ControllerProcess, nodes: &[&str]) {
    wait_for(controller, "every agent's first report", || {
        let views = controller.agent_views();
        let heard: BTreeSet<String> = views
            .as_array()?
            .iter()
            .filter_map(|view| view["report"]["node"].as_str().map(str::to_string))
            .collect();
        nodes.iter().all(|node| heard.contains(*node)).then_some(())
    })
    .await;
}

/// A database (StatefulSet pod with a ReadWriteOnce claim) and a fence configuration
/// (fabric port, then IPMI) for each of `nodes`.
fn databases_on(server: &FakeApiServer, nodes: &[&str], bmc: &IpmiSim, fabric: &Path) {
    for (index, node) in nodes.iter().enumerate() {
        seed_database(server, node, &format!("db-{index}"));
        seed_fence_config(server, node, bmc.port(), fabric);
    }
}

/// The test's cluster: `nodes` Ready, their node tokens, their kubelets renewing their
/// Leases, and a database with a fence configuration on each of `databases`; and the
/// storage fabric port.
async fn cluster_of(
    dir: &Path,
    bmc: &IpmiSim,
    nodes: &[&str],
    databases: &[&str],
) -> (FakeApiServer, PathBuf, Kubelets) {
    let fabric = enabled_fabric(dir);
    let server = ready_cluster(nodes).await;
    let tokens: Vec<(&str, String)> = nodes.iter().map(|node| (*node, token_of(node))).collect();
    seed_node_tokens(&server, &tokens);
    databases_on(&server, databases, bmc, &fabric);
    let kubelets = Kubelets::start(&server, nodes).await;
    (server, fabric, kubelets)
}

/// The controller with `settings`, leading and synced, and the agent of each of `nodes`
/// (in order), once the controller has heard them all; and where it takes reports.
async fn controller_hearing(
    dir: &Path,
    server: &FakeApiServer,
    settings: &str,
    nodes: &[&str],
) -> (ControllerProcess, String, Vec<AgentProcess>) {
    let controller = start_controller(dir, server, "127.0.0.1:0", settings);
    controller.synced().await;
    let reports = controller.reports_address();
    let agents = nodes
        .iter()
        .map(|node| start_agent(dir, node, &reports))
        .collect();
    all_heard(&controller, nodes).await;
    (controller, reports, agents)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_lease_and_agent_fall_silent_is_fenced_before_it_ever_reads_not_ready() {
    require!("fence-agents", fence_agents());
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let nodes = ["worker-1", "worker-2", "worker-3"];
    let (server, fabric, kubelets) = cluster_of(dir.path(), &bmc, &nodes, &["worker-2"]).await;
    // unhealthyDuration is ten minutes: only silence can fence within this test.
    let (controller, _, mut agents) =
        controller_hearing(dir.path(), &server, "unhealthyDuration: 10m\n", &nodes).await;
    tokio::time::sleep(SILENCE * 2).await;
    assert!(
        fence_of(&server, "worker-2").is_none(),
        "nothing is fenced while every node is heard"
    );

    // worker-2 loses its power: its agent and its kubelet stop at the same instant.
    let died = Instant::now();
    drop(agents.remove(1));
    kubelets.stop("worker-2");

    let fenced = wait_for(&controller, "worker-2's NodeFence", || {
        fence_of(&server, "worker-2").map(|_| Instant::now())
    })
    .await;
    let released = wait_for(&controller, "the pod to be released", || {
        server
            .object::<Pod>("shop", "db-0")
            .is_none()
            .then(Instant::now)
    })
    .await;
    let node = server.object::<Node>("", "worker-2").expect("node");
    let ready = node
        .status
        .and_then(|status| status.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|condition| condition.type_ == "Ready")
        .map(|condition| condition.status);
    assert_eq!(
        ready.as_deref(),
        Some("True"),
        "the pod was released while the node still read Ready: silence, not NotReady, found it"
    );
    let fence = fence_of(&server, "worker-2").expect("the NodeFence");
    assert_eq!(
        fence.pointer("/status/lost/evidence"),
        Some(&json!("Silence"))
    );
    let events = reasons(&server, "worker-2", "NodeFence");
    assert!(events.iter().any(|r| r == "NodeSilent"), "{events:?}");
    assert_eq!(
        fabric_state(&fabric),
        "off",
        "the isolation that released the pod really disabled the fabric port"
    );
    controller.powered_off(&server, "worker-2").await;
    assert!(!bmc.power_is_on(), "the emulated machine is off");
    assert_eq!(
        bmc.chassis_log().matches("set power 0").count(),
        1,
        "exactly one power-off"
    );
    let to_fence = fenced.duration_since(died);
    let to_release = released.duration_since(died);
    eprintln!(
        "agent and Lease silent to NodeFence: {:.1}s, to pod released: {:.1}s (silenceTimeout {}s)",
        to_fence.as_secs_f64(),
        to_release.as_secs_f64(),
        SILENCE.as_secs()
    );
    // The controller last heard the node up to one report interval before it died.
    assert!(
        to_fence + Duration::from_millis(600) >= SILENCE,
        "fenced {to_fence:?} after the node died, before silenceTimeout"
    );
    assert!(
        to_release < SILENCE + Duration::from_secs(15),
        "released {to_release:?} after the node died"
    );
    for healthy in ["worker-1", "worker-3"] {
        assert!(
            fence_of(&server, healthy).is_none(),
            "{healthy} is heard and never fenced"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_heard_on_either_channel_is_never_fenced_not_even_by_a_restarted_controller() {
    require!("fence-agents", fence_agents());
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let nodes = ["worker-1", "worker-2", "worker-3", "worker-4", "worker-5"];
    let (server, fabric, kubelets) =
        cluster_of(dir.path(), &bmc, &nodes, &["worker-2", "worker-3"]).await;
    // Two seconds of NotReady would fence a node without an agent.
    let settings = "unhealthyDuration: 2s\n";
    let (controller, reports, mut agents) =
        controller_hearing(dir.path(), &server, settings, &nodes).await;

    // worker-2 is cut off from the API server: its Lease stops and the node lifecycle
    // controller marks it Unknown, but its agent still reaches the controller.
    kubelets.stop("worker-2");
    server.seed(&node("worker-2", "Unknown", Timestamp::now()));
    // worker-3's agent dies; its kubelet is fine.
    drop(agents.remove(2));
    tokio::time::sleep(SILENCE * 3).await;
    for node in ["worker-2", "worker-3"] {
        if let Some(fence) = fence_of(&server, node) {
            assert!(
                executions(&fence).is_empty(),
                "{node} is alive on one channel and must not be acted on: {fence:#}"
            );
        }
    }
    assert_eq!(
        metric_value(&controller.metrics(), "nodekeeper_controller_silent_nodes"),
        Some(0.0)
    );

    // The controller restarts. The partitioned node has been Unknown far longer than
    // unhealthyDuration; the new controller must hear its agent before judging it.
    controller.kill();
    let controller = start_controller(dir.path(), &server, &reports, settings);
    controller.synced().await;
    // The agents were refused a connection meanwhile and back off; the partitioned
    // node is held until its agent is heard again, never taken for agentless.
    wait_for(
        &controller,
        "the partitioned node's agent to be heard again",
        || controller.agent_view("worker-2").map(drop),
    )
    .await;
    tokio::time::sleep(SILENCE * 2).await;
    assert!(
        !bmc.chassis_log().contains("set power 0"),
        "nothing was powered off: {}",
        bmc.chassis_log()
    );
    assert_eq!(fabric_state(&fabric), "on", "nothing was isolated");
    if let Some(fence) = fence_of(&server, "worker-2") {
        assert_eq!(
            fence.pointer("/status/pause/reason"),
            Some(&json!("NodeAlive")),
            "{fence:#}"
        );
    }

    // The partitioned node's agent stops too: both channels silent, it is fenced.
    drop(agents.remove(1));
    let fence = wait_for(&controller, "worker-2's fence to start", || {
        fence_of(&server, "worker-2").filter(|fence| !executions(fence).is_empty())
    })
    .await;
    assert_eq!(
        fence.pointer("/status/lost/evidence"),
        Some(&json!("Silence"))
    );
    assert!(
        fence_of(&server, "worker-3").is_none_or(|fence| executions(&fence).is_empty()),
        "worker-3's kubelet still renews its Lease"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_the_nodes_falling_silent_at_once_is_a_storm_and_nothing_is_powered_off() {
    require!("fence-agents", fence_agents());
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let nodes = ["worker-1", "worker-2", "worker-3", "worker-4", "worker-5"];
    let cut_off = ["worker-1", "worker-2", "worker-3"];
    let (server, fabric, kubelets) = cluster_of(dir.path(), &bmc, &nodes, &cut_off).await;
    let (controller, _, mut agents) =
        controller_hearing(dir.path(), &server, "unhealthyDuration: 10m\n", &nodes).await;

    // A switch fails: three of five nodes go quiet on both channels at once. They were
    // last heard at their own times within the last report and renewal intervals.
    // The agents of the cut-off nodes are the first three; each node goes quiet a
    // little after the previous one, as their last reports and renewals would differ.
    for (node, agent) in cut_off.iter().zip(agents.drain(..cut_off.len())) {
        kubelets.stop(node);
        drop(agent);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let metrics = wait_for(&controller, "the storm guard to see the storm", || {
        let metrics = controller.metrics();
        (metric_value(&metrics, "nodekeeper_storm_guard_state{state=\"storm\"}") == Some(1.0))
            .then_some(metrics)
    })
    .await;
    assert_eq!(
        metric_value(&metrics, "nodekeeper_controller_silent_nodes"),
        Some(3.0),
        "{metrics}"
    );
    // Long past silenceTimeout: the fences exist, held by the storm guard.
    tokio::time::sleep(SILENCE * 3).await;
    for node in cut_off {
        let fence = wait_for(&controller, "the fence of a silent node", || {
            fence_of(&server, node).filter(|fence| fence.pointer("/status/pause").is_some())
        })
        .await;
        assert_eq!(
            fence.pointer("/status/pause/reason"),
            Some(&json!("StormGuard")),
            "{fence:#}"
        );
        assert!(executions(&fence).is_empty(), "{fence:#}");
    }
    assert!(!bmc.chassis_log().contains("set power 0"));
    assert_eq!(fabric_state(&fabric), "on");
    for pod in ["db-0", "db-1", "db-2"] {
        assert!(server.object::<Pod>("shop", pod).is_some(), "{pod} is kept");
    }
}

/// A power device that is another machine's switches that machine off, and says so:
/// the fence is confirmed and the pod released. The node runs on, cut off from the API
/// server (it reads NotReady), but its agent reaches the controller again, from the boot
/// the power-off should have ended. Its kubelet cannot say anything; the agent's report
/// alone must pause the fence and page, before anyone runs recovery by hand (which would
/// give the storage back to a node whose processes never stopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_reporting_from_the_boot_its_power_off_should_have_ended_pauses_the_fence() {
    require!("fence-agents", fence_agents());
    require!("openssl", support::real::program("openssl", "openssl"));
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let ca = support::tls::certificate_authority(dir.path(), "ca").expect("a CA");
    let served =
        support::tls::server_certificate(dir.path(), "controller", &ca).expect("a certificate");
    const BOOT: &str = "0d2f6b1e-3c4a-4e58-8b7d-1a2b3c4d5e6f";
    let nodes = ["worker-1", "worker-2", "worker-3"];
    let (server, _fabric, kubelets) = cluster_of(dir.path(), &bmc, &nodes, &["worker-2"]).await;
    server.seed(&node_on_boot("worker-2", "True", Timestamp::now(), BOOT));
    let config = controller_config(
        dir.path(),
        &format!(
            "silenceTimeout: {}s\nunhealthyDuration: 10m\n\
             reports: {{address: \"127.0.0.1:0\", nodeTokensSecret: node-tokens, reconnectGrace: 20s, {}}}\n",
            SILENCE.as_secs(),
            served.reports_setting()
        ),
    );
    let controller = ControllerProcess::start_logging(dir.path(), &server, &config, DEBUG_LOG);
    controller.synced().await;
    let unarmed = || json!({"armed": false});
    let report = move |sequence| report_from("worker-2", BOOT, sequence, unarmed());
    let reporting = Reporting::start(
        controller.reports_address(),
        ca.cert.clone(),
        "worker-2",
        1,
        report,
    );
    wait_for(&controller, "worker-2's first report", || {
        controller.agent_view("worker-2").map(|_| ())
    })
    .await;

    // worker-2 falls silent on both channels and is fenced.
    let next_sequence = reporting.stop().await;
    kubelets.stop("worker-2");
    controller.powered_off(&server, "worker-2").await;
    let fence = fence_of(&server, "worker-2").expect("the NodeFence");
    assert_eq!(fence["status"]["powerOffBoot"], BOOT, "{fence:#}");
    // The node lifecycle controller marks it NotReady; its agent speaks again.
    server.seed(&node_on_boot("worker-2", "Unknown", Timestamp::now(), BOOT));
    let reporting = Reporting::start(
        controller.reports_address(),
        ca.cert.clone(),
        "worker-2",
        next_sequence,
        report,
    );
    let pause = wait_for(&controller, "the fence to pause", || {
        fence_of(&server, "worker-2")?
            .pointer("/status/pause")
            .filter(|pause| pause["reason"] == "PowerOffContradicted")
            .cloned()
    })
    .await;
    assert!(
        pause["message"]
            .as_str()
            .is_some_and(|message| message.contains(&format!("its agent reports boot \"{BOOT}\""))),
        "{pause:#}"
    );
    reporting.stop().await;
    controller.paused_for("PowerOffContradicted").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_with_no_fence_device_is_released_once_its_agents_promise_runs_out() {
    let dir = tempfile::tempdir().expect("temp dir");
    require!("openssl", support::real::program("openssl", "openssl"));
    // A database on worker-2, and no fence configuration: the node has no fence device.
    let rig = PromiseRig::start(dir.path()).await;
    let (server, kubelets) = (&rig.server, &rig.kubelets);
    let margin = Duration::from_secs(5);
    let config = rig.controller_config(dir.path(), SILENCE, margin);
    let controller = ControllerProcess::start_logging(dir.path(), server, &config, DEBUG_LOG);
    controller.synced().await;

    // worker-2's agent promises over TLS that its node isolates itself within 2 s of
    // losing the controller.
    let within = Duration::from_secs(2);
    let reporting = rig.promise(&controller, within).await;
    tokio::time::sleep(SILENCE).await;
    assert!(
        fence_of(server, "worker-2").is_none(),
        "a node that is heard is not fenced"
    );

    // The node goes quiet on both channels.
    reporting.stop().await;
    kubelets.stop("worker-2");
    let silent_at = Instant::now();
    let waiting = wait_for(&controller, "the fence waiting on the promise", || {
        fence_of(server, "worker-2").filter(|fence| {
            fence.pointer("/status/pause/reason") == Some(&json!("WaitingForSelfIsolation"))
        })
    })
    .await;
    assert!(
        !taint_keys(server, "worker-2").contains(&"node.kubernetes.io/out-of-service".to_string()),
        "nothing is released before the promise runs out: {waiting:#}"
    );
    // Released as the shipped configuration does it: the out-of-service taint, for the
    // pod garbage collector (deletePods is off, so the controller runs with the base
    // RBAC alone).
    wait_for(&controller, "the pod released", || {
        taint_keys(server, "worker-2")
            .contains(&"node.kubernetes.io/out-of-service".to_string())
            .then_some(())
    })
    .await;
    let waited = silent_at.elapsed();
    println!(
        "released on its agent's promise {waited:?} after the node fell silent (promise 2 s, margin 5 s)"
    );
    // Last heard at most half a second before the silence began, counted in whole
    // seconds: never before the promise and the margin have passed.
    assert!(
        waited + Duration::from_millis(600) >= within + margin,
        "{waited:?}"
    );
    let fence = fence_of(server, "worker-2").expect("the NodeFence");
    let confirmed_by = fence
        .pointer("/status/confirmedBy")
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    assert!(
        confirmed_by.contains("promised"),
        "released on the promise, nothing else: {fence:#}"
    );
    assert!(
        executions(&fence).is_empty(),
        "no fence agent ran: {fence:#}"
    );
    // Before releasing, the controller read the node's Lease afresh: a read after the
    // fence began waiting on the promise and before the release.
    let log = server.requests();
    let released = log
        .iter()
        .position(|r| {
            r.method == "PATCH"
                && r.path.ends_with("/nodes/worker-2")
                && r.body.contains("out-of-service")
        })
        .expect("the release");
    let waiting_written = log[..released]
        .iter()
        .rposition(|r| {
            r.path.ends_with("/nodefences/worker-2/status")
                && r.body.contains("WaitingForSelfIsolation")
        })
        .expect("the fence waited on the promise");
    assert!(
        log[waiting_written..released].iter().any(|r| {
            r.method == "GET"
                && r.path
                    .ends_with("/namespaces/kube-node-lease/leases/worker-2")
        }),
        "the Lease is read between the wait and the release"
    );
    support::controller_rbac::assert_exercised(
        &server.requests(),
        "a_silent_node_with_no_fence_device_is_released_once_its_agents_promise_runs_out",
        NAMESPACE,
    );
}
