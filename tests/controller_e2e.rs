//! `nodekeeper controller` end to end: the real binary as its own process against the
//! test API server, fencing through real ClusterLabs fence agents (`fence_ipmilan`
//! against OpenIPMI's `ipmi_sim`; `fence_dummy` standing in for a storage fabric, since
//! no SCSI device can be made here). What an operator would see is asserted: the
//! NodeFence and its status, the emulator's power, the taints, the pod, the Events and
//! the metrics.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use support::apiserver::FakeApiServer;
use support::controller::*;
use support::fence_emulators::IpmiSim;
use support::real;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_node_is_isolated_powered_off_released_and_recovered() {
    require!("fence-agents", fence_agents());
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let fabric = enabled_fabric(dir.path());

    let server = ready_cluster(&["worker-1", "worker-2", "worker-3"]).await;
    seed_database(&server, "worker-2", "db-0");
    seed_fence_config(&server, "worker-2", bmc.port(), &fabric);
    let config = controller_config(dir.path(), "");
    let controller = ControllerProcess::start(dir.path(), &server, &config);
    controller.synced().await;
    assert!(
        fence_of(&server, "worker-2").is_none(),
        "nothing is fenced while every node is Ready"
    );

    // worker-2 stops reporting: the node lifecycle controller marks it Unknown.
    let lost_at = Timestamp::now();
    server.seed(&node("worker-2", "Unknown", lost_at));

    let released = wait_for(&controller, "the pod to be released", || {
        server
            .object::<Pod>("shop", "db-0")
            .is_none()
            .then(Timestamp::now)
    })
    .await;
    let fence = fence_of(&server, "worker-2").expect("the NodeFence exists");
    let confirmed_by = fence
        .pointer("/status/confirmedBy")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    assert!(
        confirmed_by.starts_with("isolation step"),
        "the storage isolation is the proof that released the pod: {fence:#}"
    );
    assert_eq!(
        fabric_state(&fabric),
        "off",
        "the fabric port is really disabled"
    );
    let taints = taint_keys(&server, "worker-2");
    assert!(
        taints.contains(&"node.kubernetes.io/out-of-service".to_string())
            && taints.contains(&"fencing.nodekeeper.io/remediation".to_string()),
        "{taints:?}"
    );
    let out_of_service = server
        .object::<Node>("", "worker-2")
        .and_then(|n| n.spec?.taints)
        .unwrap_or_default()
        .into_iter()
        .find(|t| t.key == "node.kubernetes.io/out-of-service")
        .expect("taint");
    assert_eq!(out_of_service.value.as_deref(), Some("nodeshutdown"));
    assert_eq!(out_of_service.effect, "NoExecute");
    assert!(out_of_service.time_added.is_some());

    // After powerManagementDelay the power step switches the BMC off, confirmed.
    controller.powered_off(&server, "worker-2").await;
    assert!(!bmc.power_is_on(), "the emulated machine is off");
    let chassis = bmc.chassis_log();
    assert_eq!(
        chassis.matches("set power 0").count(),
        1,
        "exactly one power-off: {chassis}"
    );
    let loss_to_release = released.duration_since(lost_at);
    eprintln!(
        "power loss to pod released: {:.1}s (unhealthyDuration 2s)",
        loss_to_release.as_secs_f64()
    );

    let fence_events = reasons(&server, "worker-2", "NodeFence");
    for reason in ["FenceStarted", "StepSucceeded", "FenceConfirmed"] {
        assert!(
            fence_events.iter().any(|r| r == reason),
            "{reason} in {fence_events:?}"
        );
    }
    let node_events = reasons(&server, "worker-2", "Node");
    assert!(
        node_events.iter().any(|r| r == "FenceConfirmed"),
        "{node_events:?}"
    );

    // The counters follow the status write that reported the step done (the reconcile
    // counts what it wrote), so wait for the power-off's execution to be counted.
    let power_off_counted = "nodekeeper_fence_executions_total{step=\"PowerManagement\",method=\"ipmi-off\",agent=\"fence_ipmilan\",result=\"Succeeded\"} 1";
    let metrics = wait_for(&controller, "the power-off to be counted", || {
        let metrics = controller.metrics();
        metrics.contains(power_off_counted).then_some(metrics)
    })
    .await;
    for line in [
        "nodekeeper_fences_started_total 1",
        "nodekeeper_fences_confirmed_total{step=\"Isolation\"} 1",
        "nodekeeper_controller_leader 1",
        "nodekeeper_storm_guard_state{state=\"calm\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }

    // An operator powers the machine back on; the kubelet reports Ready again.
    controller
        .recovered(&server, &bmc, &fabric, "worker-2")
        .await;
    assert_eq!(bmc.chassis_log().matches("set power 0").count(), 1);
    let log = controller.log();
    assert!(
        !log.contains(IpmiSim::PASSWORD),
        "the BMC password never shows in the log"
    );
    // What the shipped RBAC grants is what a fence uses (tests/manifests.rs).
    support::controller_rbac::assert_exercised(
        &server.requests(),
        "a_lost_node_is_isolated_powered_off_released_and_recovered",
        support::controller::NAMESPACE,
    );
}

/// The node's pause reason, if its NodeFence is paused.
fn pause_reason(server: &FakeApiServer, node: &str) -> Option<String> {
    fence_of(server, node)?
        .pointer("/status/pause/reason")?
        .as_str()
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_on_its_old_boot_after_a_confirmed_power_off_is_not_recovered() {
    require!("fence-agents", fence_agents());
    let dir = tempfile::tempdir().expect("temp dir");
    // The BMC the configuration names is another machine's: powering it off leaves
    // worker-2 running.
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let (server, fabric) = one_database_node(dir.path(), &bmc).await;
    server.seed(&node_on_boot(
        "worker-2",
        "True",
        Timestamp::now(),
        "boot-a",
    ));
    let controller =
        ControllerProcess::start(dir.path(), &server, &controller_config(dir.path(), ""));
    controller.synced().await;
    server.seed(&node_on_boot(
        "worker-2",
        "Unknown",
        Timestamp::now(),
        "boot-a",
    ));
    controller.powered_off(&server, "worker-2").await;
    let fence = fence_of(&server, "worker-2").expect("the NodeFence");
    assert_eq!(fence["status"]["powerOffBoot"], "boot-a", "{fence:#}");

    // worker-2's kubelet is back, Ready, on the boot it ran all along: a Ready posted
    // after the power-off (condition times have whole seconds; one from the second the
    // step ended could be the one posted before it).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    post_status(
        &server,
        &node_on_boot("worker-2", "True", Timestamp::now(), "boot-a"),
    )
    .await;
    // Recovery would end the fence: either way the wait ends.
    let paused = wait_for(&controller, "the fence to pause or end", || match fence_of(
        &server, "worker-2",
    ) {
        None => Some(false),
        Some(_) => (pause_reason(&server, "worker-2").as_deref() == Some("PowerOffContradicted"))
            .then_some(true),
    })
    .await;
    assert!(paused, "the fence ended: recovery ran on the old boot");
    assert_eq!(
        fabric_state(&fabric),
        "off",
        "no recovery: the storage of a node whose processes never stopped stays cut off"
    );
    let taints = taint_keys(&server, "worker-2");
    assert!(
        taints.contains(&"node.kubernetes.io/out-of-service".to_string()),
        "{taints:?}"
    );
    // The Event and the gauge follow the status write.
    let said = wait_for(&controller, "a FencePaused Event saying why", || {
        server
            .objects::<k8s_openapi::api::events::v1::Event>()
            .into_iter()
            .find(|event| {
                event.reason.as_deref() == Some("FencePaused")
                    && event
                        .note
                        .as_deref()
                        .is_some_and(|note| note.starts_with("PowerOffContradicted"))
            })
    })
    .await;
    assert_eq!(said.type_.as_deref(), Some("Warning"));
    controller.paused_for("PowerOffContradicted").await;

    // Someone power-cycles it for real: a new boot, and recovery runs.
    post_status(
        &server,
        &node_on_boot("worker-2", "True", Timestamp::now(), "boot-b"),
    )
    .await;
    wait_for(
        &controller,
        "recovery to finish and the NodeFence to go",
        || fence_of(&server, "worker-2").is_none().then_some(()),
    )
    .await;
    assert_eq!(
        fabric_state(&fabric),
        "on",
        "recovery re-enabled the fabric port"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_of_five_nodes_lost_is_a_storm_and_nothing_is_powered_off() {
    require!(
        "fence-agents",
        real::program("fence_ipmilan", "fence-agents")
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let names = FIVE_NODES;
    let (server, fabric, config, controller) = five_nodes_under_control(dir.path(), &bmc, "").await;

    // A partition: three of five nodes go silent at once (40% allows two).
    storm_of_three(&controller, &server).await;
    // Give the controller time to do something it must not.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for name in &names[..3] {
        let fence = fence_of(&server, name).expect("fence");
        let status = &fence["status"];
        assert_eq!(status["pause"]["reason"], "StormGuard", "{fence:#}");
        assert!(
            status["pause"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("3 of 5 watched nodes are unhealthy")),
            "{fence:#}"
        );
        assert!(
            status
                .get("executions")
                .is_none_or(|e| e.as_array().is_none_or(Vec::is_empty)),
            "no agent ran: {fence:#}"
        );
        let events = reasons(&server, name, "NodeFence");
        assert!(events.iter().any(|r| r == "FencePaused"), "{events:?}");
    }
    assert!(
        !bmc.chassis_log().contains("set power"),
        "no power action reached the BMC"
    );
    assert_eq!(fabric_state(&fabric), "on");
    for index in 0..3 {
        assert!(
            server
                .object::<Pod>("shop", &format!("db-{index}"))
                .is_some()
        );
    }
    for name in &names[..3] {
        assert!(
            taint_keys(&server, name)
                .iter()
                .all(|t| t != "node.kubernetes.io/out-of-service")
        );
    }
    let metrics = controller.metrics();
    for line in [
        "nodekeeper_storm_guard_state{state=\"storm\"} 1",
        "nodekeeper_fences_paused{reason=\"StormGuard\"} 3",
        "nodekeeper_controller_unhealthy_nodes 3",
        "nodekeeper_controller_watched_nodes 5",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }

    // An operator asks what is going on.
    let table = controller_status(dir.path(), &config, &["--output", "table"]).await;
    assert!(
        table.starts_with("Storm guard: STORM: 3 of 5 watched nodes unhealthy, at most 2 may be"),
        "{table}"
    );
    for name in &names[..3] {
        let row = table
            .lines()
            .find(|line| line.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row for {name}:\n{table}"));
        assert!(
            row.contains("Unknown") && row.contains("StormGuard"),
            "{row}"
        );
    }
    let json: Value =
        serde_json::from_str(&controller_status(dir.path(), &config, &["--output", "json"]).await)
            .expect("json");
    assert_eq!(json["storm"]["Storm"]["unhealthy"], 3, "{json:#}");
    assert_eq!(json["nodes"].as_array().map(Vec::len), Some(5), "{json:#}");
    assert_eq!(
        json["nodes"][0]["fence"]["paused"], "StormGuard",
        "{json:#}"
    );
}

/// [`three_databases_of_five`] with a controller (its configuration plus `extra`) that
/// leads and has listed the nodes.
async fn five_nodes_under_control(
    dir: &Path,
    bmc: &IpmiSim,
    extra: &str,
) -> (FakeApiServer, PathBuf, PathBuf, ControllerProcess) {
    let (server, fabric) = three_databases_of_five(dir, bmc).await;
    let config = controller_config(dir, extra);
    let controller = ControllerProcess::start(dir, &server, &config);
    controller.synced().await;
    (server, fabric, config, controller)
}

/// The first three of [`FIVE_NODES`] go silent at once; waits until each has a NodeFence
/// the storm guard holds.
async fn storm_of_three(controller: &ControllerProcess, server: &FakeApiServer) {
    let lost_at = Timestamp::now();
    for name in &FIVE_NODES[..3] {
        server.seed(&node(name, "Unknown", lost_at));
    }
    for name in &FIVE_NODES[..3] {
        wait_for(controller, "a NodeFence paused by the storm guard", || {
            let fence = fence_of(server, name)?;
            (fence.pointer("/status/pause/reason")? == "StormGuard").then_some(())
        })
        .await;
    }
}

const FIVE_NODES: [&str; 5] = ["worker-1", "worker-2", "worker-3", "worker-4", "worker-5"];

/// Five Ready nodes, the first three each running a database with a fence configuration;
/// returns the fabric port they share.
async fn three_databases_of_five(dir: &Path, bmc: &IpmiSim) -> (FakeApiServer, PathBuf) {
    let fabric = enabled_fabric(dir);
    let server = ready_cluster(&FIVE_NODES).await;
    for (index, name) in FIVE_NODES[..3].iter().enumerate() {
        seed_database(&server, name, &format!("db-{index}"));
        seed_fence_config(&server, name, bmc.port(), &fabric);
    }
    (server, fabric)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_during_the_power_off_never_powers_off_twice() {
    require!("fence-agents", fence_agents());
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let (server, _fabric) = one_database_node(dir.path(), &bmc).await;
    let config = controller_config(dir.path(), "");
    let first = ControllerProcess::start(dir.path(), &server, &config);
    first.synced().await;
    server.seed(&node("worker-2", "Unknown", Timestamp::now()));
    // The power-off is recorded before its agent starts: kill the controller (SIGKILL,
    // the process, not a task) the moment it is.
    wait_for(&first, "the power-off to be recorded as running", || {
        let fence = fence_of(&server, "worker-2")?;
        executions(&fence)
            .iter()
            .any(|e| e["method"] == "ipmi-off" && e["kind"] == "Act" && e.get("result").is_none())
            .then_some(())
    })
    .await;
    first.kill();
    let killed = std::time::Instant::now();

    // The Lease the dead controller held must run out (4 s) before the next one acts.
    let second = ControllerProcess::start(dir.path(), &server, &config);
    second.powered_off(&server, "worker-2").await;
    eprintln!(
        "controller killed mid power-off: the restarted one confirmed the fence {:.1}s later (Lease 4 s)",
        killed.elapsed().as_secs_f64()
    );
    let fence = fence_of(&server, "worker-2").expect("fence");
    let power = step_executions(&fence, "PowerManagement");
    assert_eq!(power[0]["result"], "Interrupted", "{fence:#}");
    assert_eq!(
        power[1]["kind"], "Verify",
        "the restarted controller asked the BMC instead of acting again: {fence:#}"
    );
    // Two honest outcomes, depending on whether the killed controller got its agent
    // started: the BMC already reports off (the verify confirms the fence), or it never
    // got the command (the verify shows on, and only then is the action done again).
    if power[1]["power"] == "Off" {
        assert_eq!(power.len(), 2, "{fence:#}");
    } else {
        assert_eq!(power[1]["power"], "On", "{fence:#}");
        assert_eq!(power[2]["kind"], "Act", "{fence:#}");
        assert_eq!(power[2]["result"], "Succeeded", "{fence:#}");
        assert_eq!(power.len(), 3, "{fence:#}");
    }
    assert!(fence.pointer("/status/confirmedAt").is_some());
    assert!(!bmc.power_is_on());
    let chassis = bmc.chassis_log();
    assert_eq!(
        chassis.matches("set power 0").count(),
        1,
        "exactly one power-off reached the BMC: {chassis}"
    );
    assert!(
        second.log().contains("taking over the leader Lease"),
        "{}",
        second.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_controllers_exactly_one_acts() {
    require!("fence-agents", fence_agents());
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let (server, _fabric) = one_database_node(dir.path(), &bmc).await;
    let config = controller_config(dir.path(), "");
    let replicas = [
        ControllerProcess::start(dir.path(), &server, &config),
        ControllerProcess::start(dir.path(), &server, &config),
    ];
    let leader = wait_for(&replicas[0], "one replica to lead", || {
        replicas
            .iter()
            .position(|replica| replica.log().contains("node list synced"))
    })
    .await;
    server.seed(&node("worker-2", "Unknown", Timestamp::now()));
    replicas[leader].powered_off(&server, "worker-2").await;
    let follower = &replicas[1 - leader];
    let log = follower.log();
    assert!(log.contains("waiting for the leader Lease"), "{log}");
    assert!(
        !log.contains("node list synced") && !log.contains("starting execution"),
        "the follower never acts:\n{log}"
    );
    assert!(replicas[leader].log().contains("starting execution"));
    assert_eq!(bmc.chassis_log().matches("set power 0").count(), 1);
    let lease = server
        .object::<k8s_openapi::api::coordination::v1::Lease>(NAMESPACE, "nodekeeper-controller")
        .expect("the leader Lease");
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(
        replicas[leader].log().contains(&holder),
        "the Lease names the replica that acts ({holder})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_lost_at_once_in_one_zone_start_at_the_zone_rate() {
    require!("fence-agents", real::program("fence_dummy", "fence-agents"));
    let dir = tempfile::tempdir().expect("temp dir");
    let names = ["worker-1", "worker-2", "worker-3", "worker-4", "worker-5"];
    // Isolation only: the zone rate holds back the first step of a new fence, whichever.
    let (server, _fabric) = isolation_only_cluster(dir.path(), &names, 2).await;
    // Both nodes were lost a while ago and their NodeFences exist (a previous controller
    // created them): the new one reconciles both at once, as after a restart.
    let lost_at = Timestamp::now() - Duration::from_secs(10);
    for name in &names[..2] {
        server.seed(&node(name, "Unknown", lost_at));
        server.seed_custom(
            "fencing.nodekeeper.io",
            "v1alpha1",
            "nodefences",
            json!({"apiVersion": "fencing.nodekeeper.io/v1alpha1", "kind": "NodeFence",
                   "metadata": {"name": name}, "spec": {"nodeName": name}}),
        );
    }
    // One fence per 30 s in a zone; two of five nodes unhealthy is within maxUnhealthy.
    let config = controller_config(dir.path(), "stormGuard: {zoneFenceRate: 0.0333}\n");
    // Slow requests make the two reconciles overlap, as on a busy API server.
    server.set_latency(Duration::from_millis(30));
    let controller = ControllerProcess::start(dir.path(), &server, &config);
    let (started, held) = wait_for(&controller, "one fence started, one held back", || {
        let fences: Vec<Value> = names[..2]
            .iter()
            .filter_map(|name| fence_of(&server, name))
            .collect();
        let started: Vec<&Value> = fences
            .iter()
            .filter(|f| f.pointer("/status/startedAt").is_some())
            .collect();
        let held: Vec<&Value> = fences
            .iter()
            .filter(|f| {
                f.pointer("/status/pause/reason")
                    .is_some_and(|r| r == "ZoneRateLimit")
            })
            .collect();
        assert!(
            started.len() < 2,
            "both fences started at once, beyond the zone's rate:\n{}",
            controller.log()
        );
        (started.len() == 1 && held.len() == 1).then(|| (started[0].clone(), held[0].clone()))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held_name = held["metadata"]["name"].as_str().expect("name").to_string();
    let held_now = fence_of(&server, &held_name).expect("fence");
    assert!(
        held_now.pointer("/status/startedAt").is_none(),
        "the second fence waits for the zone's rate: {held_now:#}"
    );
    let message = held_now
        .pointer("/status/pause/message")
        .and_then(Value::as_str)
        .unwrap_or_default();
    assert!(message.contains("the next may start at"), "{message}");
    assert!(
        started.pointer("/status/executions/0").is_some(),
        "the first fence runs: {started:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_cooldown_survives_a_restart_even_with_no_fence_left() {
    require!(
        "fence-agents",
        real::program("fence_ipmilan", "fence-agents")
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let names = FIVE_NODES;
    let (server, fabric, config, first) =
        five_nodes_under_control(dir.path(), &bmc, "stormGuard: {stormCooldown: 2m}\n").await;
    // A storm: three of five lost, then back. Their fences are cancelled and deleted, so
    // no NodeFence is left to say that a cooldown runs.
    storm_of_three(&first, &server).await;
    for name in &names[..3] {
        server.seed(&node(name, "True", Timestamp::now()));
    }
    wait_for(
        &first,
        "the cooldown to be in the Lease and no fence left",
        || {
            let lease = server.object::<k8s_openapi::api::coordination::v1::Lease>(
                NAMESPACE,
                "nodekeeper-controller",
            )?;
            let memory = lease
                .metadata
                .annotations?
                .get("fencing.nodekeeper.io/storm-guard")?
                .clone();
            let none_left = names[..3]
                .iter()
                .all(|name| fence_of(&server, name).is_none());
            (memory.contains("cooldownUntil") && none_left).then_some(())
        },
    )
    .await;
    first.kill();

    // A new controller; then one node is lost, well within maxUnhealthy.
    let second = ControllerProcess::start(dir.path(), &server, &config);
    second.synced().await;
    server.seed(&node("worker-1", "Unknown", Timestamp::now()));
    let fence = wait_for(&second, "the new fence to be held by the cooldown", || {
        let fence = fence_of(&server, "worker-1")?;
        (fence.pointer("/status/pause/reason")? == "StormCooldown").then_some(fence)
    })
    .await;
    assert!(fence.pointer("/status/startedAt").is_none(), "{fence:#}");
    assert!(!bmc.chassis_log().contains("set power"));
    assert_eq!(fabric_state(&fabric), "on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_nodefence_is_created_again_while_its_node_stays_lost() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ready_cluster(&["worker-1", "worker-2", "worker-3"]).await;
    // No fence configuration: the NodeFence says so and waits.
    seed_database(&server, "worker-2", "db-0");
    let config = controller_config(dir.path(), "");
    let controller = ControllerProcess::start(dir.path(), &server, &config);
    controller.synced().await;
    server.seed(&node("worker-2", "Unknown", Timestamp::now()));
    let first = wait_for(
        &controller,
        "a NodeFence waiting for a configuration",
        || {
            let fence = fence_of(&server, "worker-2")?;
            (fence.pointer("/status/pause/reason")? == "NoConfiguration").then_some(fence)
        },
    )
    .await;
    let message = first
        .pointer("/status/pause/message")
        .and_then(Value::as_str)
        .unwrap_or_default();
    assert!(
        message.contains("worker-2"),
        "the pause names the node: {message}"
    );

    // The operator deletes it to start over (say, after adding the ConfigMaps).
    let api: kube::Api<nodekeeper::controller::NodeFence> = kube::Api::all(server.client());
    api.delete("worker-2", &Default::default())
        .await
        .expect("delete the NodeFence");
    let uid = |fence: &Value| fence.pointer("/metadata/uid").cloned();
    wait_for(&controller, "the NodeFence to be created again", || {
        let fence = fence_of(&server, "worker-2")?;
        (uid(&fence) != uid(&first)).then_some(())
    })
    .await;
}

/// The storm guard counts the nodes the API server has, also after a watch outage: nodes
/// deleted while the controller could not see them leave its count when the node list is
/// read again, and the guard judges the cluster that is left. Two unhealthy of five is
/// within 40%; two of the three that remain is a storm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_deleted_during_a_watch_outage_leave_the_storm_guards_count() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ready_cluster(&FIVE_NODES).await;
    let lost_at = Timestamp::now();
    for name in &FIVE_NODES[3..] {
        server.seed(&node(name, "Unknown", lost_at));
    }
    let controller =
        ControllerProcess::start(dir.path(), &server, &controller_config(dir.path(), ""));
    controller.synced().await;
    let metrics_show = |lines: &'static [&'static str]| {
        let controller = &controller;
        move || {
            let metrics = controller.metrics();
            lines
                .iter()
                .all(|line| metrics.contains(line))
                .then_some(())
        }
    };
    wait_for(
        &controller,
        "five watched nodes, two unhealthy, no storm",
        metrics_show(&[
            "nodekeeper_controller_watched_nodes 5",
            "nodekeeper_controller_unhealthy_nodes 2",
            "nodekeeper_storm_guard_state{state=\"calm\"} 1",
        ]),
    )
    .await;

    // The API server is away; two Ready nodes are deleted and the history the watch would
    // resume from is compacted, so the controller must read the node list anew.
    server.go_down().await;
    for name in &FIVE_NODES[..2] {
        assert!(server.finalize::<Node>("", name), "{name} deleted");
    }
    server.compact_history();
    server.come_back().await;

    wait_for(
        &controller,
        "three watched nodes, two unhealthy: a storm",
        metrics_show(&[
            "nodekeeper_controller_watched_nodes 3",
            "nodekeeper_controller_unhealthy_nodes 2",
            "nodekeeper_storm_guard_state{state=\"storm\"} 1",
        ]),
    )
    .await;
    let node_lists = server
        .requests()
        .iter()
        .filter(|r| {
            r.method == "GET" && r.path == "/api/v1/nodes" && !r.query.contains("watch=true")
        })
        .count();
    assert!(
        node_lists >= 2,
        "the node list was read again after the outage"
    );
}

/// The report Service's EndpointSlices: (name, addresses, port, owner uid).
fn report_slices(server: &FakeApiServer) -> Vec<(String, Vec<String>, i32, Option<String>)> {
    server
        .objects::<EndpointSlice>()
        .into_iter()
        .filter(|slice| {
            slice
                .metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get("kubernetes.io/service-name"))
                .is_some_and(|service| service == "nodekeeper-controller")
        })
        .map(|slice| {
            let addresses = slice
                .endpoints
                .iter()
                .flat_map(|endpoint| endpoint.addresses.clone())
                .collect();
            let port = slice
                .ports
                .as_ref()
                .and_then(|ports| ports.first()?.port)
                .unwrap_or_default();
            let owner = slice
                .metadata
                .owner_references
                .as_ref()
                .and_then(|owners| Some(owners.first()?.uid.clone()));
            (
                slice.metadata.name.unwrap_or_default(),
                addresses,
                port,
                owner,
            )
        })
        .collect()
}

/// What [`report_slices`] holds while `replica`, running as pod `(name, ip, uid)`, leads:
/// its own slice alone, to its address and report port, owned by its pod.
fn only_the_slice_of(
    (_, ip, uid): (&str, &str, &str),
    replica: &ControllerProcess,
) -> Vec<(String, Vec<String>, i32, Option<String>)> {
    let address = replica.reports_address();
    let port = i32::from(support::port_of(&address));
    vec![(
        "nodekeeper-controller-leader".to_string(),
        vec![ip.to_string()],
        port,
        Some(uid.to_string()),
    )]
}

/// Posts one report of worker-1's agent to `address`; the answer's head and body.
async fn report_to(address: &str) -> (String, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = json!({
        "version": "1.0", "node": "worker-1", "bootId": "b", "bootTime": "2026-11-20T08:00:00Z",
        "sequence": Timestamp::now().as_millisecond(), "agentVersion": "test",
        "intervalMillis": 1000, "sentAt": Timestamp::now().to_string(), "trigger": "interval",
        "conditions": [], "shutdown": {"state": "none"}, "apiServer": {"state": "reachable"},
        "isolation": {"state": "none"}
    })
    .to_string();
    let request = format!(
        "POST /v1/reports HTTP/1.1\r\nHost: c\r\nContent-Type: application/json\r\n\
         Authorization: Bearer {WORKER_1_TOKEN}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    // Read until the whole body is in (the server may keep the connection open).
    loop {
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer))
            .await
            .expect("an answer")
            .expect("read");
        answer.extend_from_slice(&buffer[..read]);
        let text = String::from_utf8_lossy(&answer).to_string();
        if read == 0 || text.ends_with('}') {
            let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
            return (
                head.to_lowercase(),
                serde_json::from_str(body).expect("JSON"),
            );
        }
    }
}

const WORKER_1_TOKEN: &str = "worker-1-node-token-0123456789abcdef";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_service_follows_the_leader_and_only_the_leader() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ready_cluster(&["worker-1"]).await;
    seed_node_tokens(&server, &[("worker-1", WORKER_1_TOKEN)]);
    // Two pods, each at a loopback address of its own, its report endpoint listening
    // there, as a pod's listens on its pod IP.
    let pods = [
        ("controller-a", "127.0.0.1", "uid-a"),
        ("controller-b", "127.0.0.2", "uid-b"),
    ];
    let config_of = |(name, ip, _): (&str, &str, &str)| {
        let home = dir.path().join(name);
        std::fs::create_dir_all(&home).expect("the pod's directory");
        let config = controller_config(
            &home,
            &format!(
                "reports: {{address: \"{ip}:0\", reconnectGrace: 0s, nodeTokensSecret: node-tokens, leaderService: nodekeeper-controller}}"
            ),
        );
        (home, config)
    };
    let mut replicas: Vec<Option<ControllerProcess>> = pods
        .iter()
        .map(|pod| {
            let (home, config) = config_of(*pod);
            Some(ControllerProcess::start_as_pod(
                &home, &server, &config, *pod,
            ))
        })
        .collect();
    let leads = |replica: &Option<ControllerProcess>| {
        replica
            .as_ref()
            .is_some_and(|replica| replica.log().contains("node list synced"))
    };
    let first = replicas[0].as_ref().unwrap();
    let leader = wait_for(first, "one replica to lead", || {
        replicas.iter().position(leads)
    })
    .await;
    let follower = 1 - leader;
    let leading = replicas[leader].as_ref().unwrap();
    let only_the_leader = only_the_slice_of(pods[leader], leading);
    wait_for(leading, "the report Service at the leader", || {
        (report_slices(&server) == only_the_leader).then_some(())
    })
    .await;
    let gauge = "nodekeeper_controller_report_service_at_leader";
    wait_for(leading, "the leader to count its slice in place", || {
        (metric_value(&leading.metrics(), gauge) == Some(1.0)).then_some(())
    })
    .await;
    let following = replicas[follower].as_ref().unwrap();
    // A replica that lost the race may still be starting on a busy machine.
    wait_for(
        following,
        "the follower to serve its metrics and reports",
        || {
            let log = following.log();
            (log.contains("serving /metrics") && log.contains("serving agent reports"))
                .then_some(())
        },
    )
    .await;
    assert_eq!(metric_value(&following.metrics(), gauge), Some(0.0));
    // Only the leader ever wrote the slice.
    let slice_writes: Vec<String> = server
        .requests()
        .into_iter()
        .filter(|r| {
            r.path.contains("/endpointslices") && matches!(r.method.as_str(), "POST" | "PUT")
        })
        .map(|r| r.body)
        .collect();
    assert!(!slice_writes.is_empty());
    assert!(
        slice_writes
            .iter()
            .all(|body| body.contains(pods[leader].1) && !body.contains(pods[follower].1)),
        "{slice_writes:?}"
    );
    // An agent that reached the follower (the Service pointed there before) is heard but
    // told to reconnect, so its next report goes through the Service to the leader.
    let (head, answer) = report_to(&following.reports_address()).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert_eq!(answer["heardByLeader"], false, "{answer}");
    assert!(head.contains("connection: close"), "{head}");
    let (head, answer) = report_to(&leading.reports_address()).await;
    assert_eq!(answer["heardByLeader"], true, "{answer}");
    assert!(
        !head.contains("connection: close"),
        "the leader keeps its agents: {head}"
    );

    // Someone deletes the slice, and the Service gains another one (given a selector):
    // the leader writes its slice again within its check, and says the Service is not
    // the leader's alone until the other is gone.
    let slices: kube::Api<EndpointSlice> = kube::Api::namespaced(server.client(), NAMESPACE);
    slices
        .delete("nodekeeper-controller-leader", &Default::default())
        .await
        .expect("delete the slice");
    let foreign: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "nodekeeper-controller-abcde", "namespace": NAMESPACE,
                     "labels": {"kubernetes.io/service-name": "nodekeeper-controller"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [pods[follower].1]}],
        "ports": [{"name": "reports", "port": 9849}]
    }))
    .expect("a slice");
    slices
        .create(&Default::default(), &foreign)
        .await
        .expect("another slice");
    wait_for(leading, "the other slice reported", || {
        leading
            .log()
            .contains("the report Service has other EndpointSlices")
            .then_some(())
    })
    .await;
    assert_eq!(metric_value(&leading.metrics(), gauge), Some(0.0));
    assert!(
        report_slices(&server)
            .iter()
            .any(|slice| slice.0 == "nodekeeper-controller-leader"),
        "the leader's slice is back"
    );
    slices
        .delete("nodekeeper-controller-abcde", &Default::default())
        .await
        .expect("delete the other slice");
    wait_for(leading, "the Service the leader's alone again", || {
        (metric_value(&leading.metrics(), gauge) == Some(1.0)).then_some(())
    })
    .await;
    assert_eq!(report_slices(&server), only_the_leader);

    // The leader's machine is lost: once its Lease runs out, the other replica leads and
    // the Service sends reports to it alone.
    replicas[leader].take().unwrap().kill();
    let next = replicas[follower].as_ref().unwrap();
    wait_for(next, "the follower to lead", || {
        leads(&replicas[follower]).then_some(())
    })
    .await;
    let only_the_new_leader = only_the_slice_of(pods[follower], next);
    wait_for(next, "the report Service at the new leader", || {
        (report_slices(&server) == only_the_new_leader).then_some(())
    })
    .await;
    support::controller_rbac::assert_exercised(
        &server.requests(),
        "the_report_service_follows_the_leader_and_only_the_leader",
        NAMESPACE,
    );

    // A replica told to keep the Service but not told its own address says so, and stops.
    let (_, config) = config_of(pods[0]);
    let lost = ControllerProcess::start(dir.path(), &server, &config);
    wait_for(&lost, "the replica without POD_IP to stop", || {
        lost.exited().then_some(())
    })
    .await;
    assert!(lost.log().contains("POD_IP"), "{}", lost.log());
}
