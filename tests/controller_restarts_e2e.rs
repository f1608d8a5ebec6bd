//! The fence controller killed (SIGKILL) at every step of one fence and started again:
//! the real binary against the test API server, `fence_ipmilan` against OpenIPMI's
//! `ipmi_sim`, and `fence_dummy` as the storage fabric. Its own test binary: it waits out
//! a leader Lease after every kill.

mod support;

use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use support::apiserver::{FakeApiServer, RequestMatcher};
use support::controller::*;
use support::fence_emulators::IpmiSim;

/// One place in a fence where the controller is stopped: the API server refuses one
/// write (500, for as long as it takes) and the controller is killed while it retries.
struct Hold {
    step: &'static str,
    matcher: RequestMatcher,
    /// The power and fabric state at the kill, proving where the fence stood.
    power_on: bool,
    fabric: &'static str,
}

/// The writes of one fence, in the order the controller makes them: each hold is the
/// next write not yet done.
fn holds() -> Vec<Hold> {
    let status = |fragment: &str| {
        RequestMatcher::method("PUT")
            .and_path("/nodefences/worker-2/status")
            .and_body(fragment)
    };
    vec![
        Hold {
            step: "creating the NodeFence",
            matcher: RequestMatcher::method("POST").and_path("/nodefences"),
            power_on: true,
            fabric: "on",
        },
        Hold {
            step: "recording the isolation's execution before its agent runs",
            matcher: status("\"method\":\"fabric-off\""),
            power_on: true,
            fabric: "on",
        },
        Hold {
            step: "recording the isolation's result after its agent ran",
            matcher: status("\"confirmedBy\""),
            power_on: true,
            fabric: "off",
        },
        Hold {
            step: "adding the out-of-service taint",
            matcher: RequestMatcher::method("PATCH")
                .and_path("/nodes/worker-2")
                .and_body("node.kubernetes.io/out-of-service"),
            power_on: true,
            fabric: "off",
        },
        Hold {
            step: "deleting the pod",
            matcher: RequestMatcher::method("DELETE").and_path("/pods/db-0"),
            power_on: true,
            fabric: "off",
        },
        Hold {
            step: "recording the power-off's execution before its agent runs",
            matcher: status("\"method\":\"ipmi-off\""),
            power_on: true,
            fabric: "off",
        },
        Hold {
            step: "recording the power-off's result after its agent ran",
            matcher: status("\"step\":\"PowerManagement\",\"phase\":\"Done\""),
            power_on: false,
            fabric: "off",
        },
    ]
}

/// Whether the server refused a request `hold` matches since `since` requests were logged.
fn refused(server: &FakeApiServer, since: usize, hold: &Hold) -> bool {
    server
        .requests()
        .iter()
        .skip(since)
        .any(|request| request.status == 500 && hold.matcher.hits(request))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_at_every_step_of_a_fence_acts_once_on_each() {
    require!("fence-agents", fence_agents());
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let (server, fabric) = one_database_node(dir.path(), &bmc).await;
    // The power step waits this long after the isolation, so that it cannot start while
    // the pods' release (which it does not wait for) is held: each hold is then the one
    // write the fence is waiting on.
    let config = controller_config(dir.path(), "powerManagementDelay: 30s\n");
    let fabric_state = || {
        std::fs::read_to_string(&fabric)
            .expect("fabric")
            .trim()
            .to_string()
    };

    let mut lost = false;
    let mut killed_at: Option<Instant> = None;
    for hold in holds() {
        let since = server.requests().len();
        server.fail_matching(hold.matcher.clone(), 500, None);
        let controller = ControllerProcess::start(dir.path(), &server, &config);
        if !lost {
            controller.synced().await;
            server.seed(&node("worker-2", "Unknown", Timestamp::now()));
            lost = true;
        }
        wait_for(&controller, hold.step, || {
            refused(&server, since, &hold).then_some(())
        })
        .await;
        if let Some(killed) = killed_at {
            eprintln!(
                "{:.1}s from the last kill to the controller {} (Lease 4 s)",
                killed.elapsed().as_secs_f64(),
                hold.step
            );
        }
        assert_eq!(
            (bmc.power_is_on(), fabric_state().as_str()),
            (hold.power_on, hold.fabric),
            "power and fabric when the controller is killed {}",
            hold.step
        );
        controller.kill();
        killed_at = Some(Instant::now());
        server.clear_failures();
    }

    let last = ControllerProcess::start(dir.path(), &server, &config);
    last.powered_off(&server, "worker-2").await;

    // The BMC and the fabric are off. The proof that each acted once is in the status:
    // every action is recorded before its agent starts, so one recorded Act per step,
    // verified after its controller died, is one run of its agent. (The BMC's log alone
    // would not show a second `off`: fence_ipmilan asks the power state first and sends
    // nothing to a machine already off.)
    let chassis = bmc.chassis_log();
    assert_eq!(
        chassis.matches("set power 0").count(),
        1,
        "one power-off reached the BMC: {chassis}"
    );
    assert!(!bmc.power_is_on());
    assert_eq!(fabric_state(), "off");
    let fence = fence_of(&server, "worker-2").expect("the NodeFence");
    for (step, method) in [("Isolation", "fabric-off"), ("PowerManagement", "ipmi-off")] {
        let runs = step_executions(&fence, step);
        let acts: Vec<&Value> = runs.iter().filter(|run| run["kind"] == "Act").collect();
        assert_eq!(acts.len(), 1, "one {method} action: {fence:#}");
        assert_eq!(acts[0]["method"], method, "{fence:#}");
        assert_eq!(
            acts[0]["result"], "Interrupted",
            "its result died with the controller: {fence:#}"
        );
        let verified = runs
            .iter()
            .any(|run| run["kind"] == "Verify" && run["power"] == "Off");
        assert!(
            verified,
            "the restarted controller asked the device: {fence:#}"
        );
    }
    assert!(fence.pointer("/status/confirmedAt").is_some(), "{fence:#}");
    assert!(
        server.object::<Pod>("shop", "db-0").is_none(),
        "the pod is released"
    );
    let deletes = server
        .requests()
        .iter()
        .filter(|r| r.method == "DELETE" && r.path.ends_with("/pods/db-0") && r.status != 500)
        .count();
    assert_eq!(deletes, 1, "the pod deleted once, never asked again");
    let taints = taint_keys(&server, "worker-2");
    assert_eq!(
        taints
            .iter()
            .filter(|key| *key == "node.kubernetes.io/out-of-service")
            .count(),
        1,
        "{taints:?}"
    );
}
