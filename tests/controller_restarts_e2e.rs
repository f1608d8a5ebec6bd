//! The fence controller killed (SIGKILL) at every step of one fence and started again:
//! the real binary against the test API server, `fence_ipmilan` against OpenIPMI's
//! `ipmi_sim`, and `fence_dummy` as the storage fabric; once with the agents run as the
//! controller's own child processes (the default executor), once as Kubernetes Jobs run
//! by the test's stand-in for the Job controller and a kubelet (`support::job_runner`),
//! which go on running while no controller does. Its own test binary: it waits out a
//! leader Lease after every kill.

mod support;

use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use nodekeeper::controller::jobs::job_name;
use support::apiserver::{FakeApiServer, RequestMatcher};
use support::controller::*;
use support::fence_emulators::IpmiSim;
use support::job_runner::JobRunner;

/// How the controller runs the fence agents.
#[derive(Clone, Copy, PartialEq)]
enum Executor {
    /// As its own child processes, which die with it.
    Process,
    /// As Kubernetes Jobs, which outlive it.
    Job,
}

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
/// next write not yet done. With the Job executor an agent's run is a write too, the
/// Job's creation, between recording the execution and its result.
fn holds(executor: Executor) -> Vec<Hold> {
    let status = |fragment: &str| {
        RequestMatcher::method("PUT")
            .and_path("/nodefences/worker-2/status")
            .and_body(fragment)
    };
    // A Job's arguments name the fence agent it runs.
    let job = |agent: &str| {
        RequestMatcher::method("POST")
            .and_path("/jobs")
            .and_body(agent)
    };
    let holds = vec![
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
            step: "creating the isolation's Job",
            matcher: job("fence_dummy"),
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
            step: "creating the power-off's Job",
            matcher: job("fence_ipmilan"),
            power_on: true,
            fabric: "off",
        },
        Hold {
            step: "recording the power-off's result after its agent ran",
            matcher: status("\"step\":\"PowerManagement\",\"phase\":\"Done\""),
            power_on: false,
            fabric: "off",
        },
    ];
    // The Jobs' creations are writes of the Job executor only.
    holds
        .into_iter()
        .filter(|hold| executor == Executor::Job || !hold.step.ends_with("Job"))
        .collect()
}

/// Whether the server refused a request `hold` matches since `since` requests were logged.
fn refused(server: &FakeApiServer, since: usize, hold: &Hold) -> bool {
    server
        .requests()
        .iter()
        .skip(since)
        .any(|request| request.status == 500 && hold.matcher.hits(request))
}

/// What a fence whose controller was killed at every step leaves for the assertions.
struct Fenced {
    server: FakeApiServer,
    bmc: IpmiSim,
    fabric: std::path::PathBuf,
    /// The Job executor's runner, still running.
    jobs: Option<JobRunner>,
    _dir: tempfile::TempDir,
}

/// One fence, its controller killed at every hold of `executor` and a last one started
/// after them; returns once the device is confirmed off. `None` when a real part is
/// missing (see `require!`: under CI that fails the test).
async fn killed_at_every_step(executor: Executor) -> Option<Fenced> {
    require!("fence-agents", fence_agents(), else None);
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()), else None);
    let (server, fabric) = one_database_node(dir.path(), &bmc).await;
    // The power step waits this long after the isolation, so that it cannot start while
    // the pods' release (which it does not wait for) is held: each hold is then the one
    // write the fence is waiting on.
    let mut settings = "powerManagementDelay: 30s\n".to_string();
    let jobs = (executor == Executor::Job).then(|| {
        settings.push_str(&job_executor(dir.path()));
        job_runner(&server, dir.path())
    });
    let config = controller_config(dir.path(), &settings);

    let mut lost = false;
    let mut killed_at: Option<Instant> = None;
    for hold in holds(executor) {
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
            (bmc.power_is_on(), fabric_state(&fabric).as_str()),
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
    drop(last);
    Some(Fenced {
        server,
        bmc,
        fabric,
        jobs,
        _dir: dir,
    })
}

/// What every run must show at its end, whatever ran the agents: one power-off reached
/// the BMC, the fabric is off, the fence confirmed, the pod deleted once and the node
/// tainted once.
fn assert_fenced_once(fenced: &Fenced) {
    let chassis = fenced.bmc.chassis_log();
    assert_eq!(
        chassis.matches("set power 0").count(),
        1,
        "one power-off reached the BMC: {chassis}"
    );
    assert!(!fenced.bmc.power_is_on());
    assert_eq!(fabric_state(&fenced.fabric), "off");
    let server = &fenced.server;
    let fence = fence_of(server, "worker-2").expect("the NodeFence");
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
    let taints = taint_keys(server, "worker-2");
    assert_eq!(
        taints
            .iter()
            .filter(|key| *key == "node.kubernetes.io/out-of-service")
            .count(),
        1,
        "{taints:?}"
    );
}

/// The steps of the fence and the method each one's action runs.
const STEPS: [(&str, &str); 2] = [("Isolation", "fabric-off"), ("PowerManagement", "ipmi-off")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_at_every_step_of_a_fence_acts_once_on_each() {
    let Some(fenced) = killed_at_every_step(Executor::Process).await else {
        return;
    };
    assert_fenced_once(&fenced);

    // The proof that each agent acted once is in the status: every action is recorded
    // before its agent starts, so one recorded Act per step, verified after its
    // controller died, is one run of its agent. (The BMC's log alone would not show a
    // second `off`: fence_ipmilan asks the power state first and sends nothing to a
    // machine already off.)
    let fence = fence_of(&fenced.server, "worker-2").expect("the NodeFence");
    for (step, method) in STEPS {
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_at_every_step_of_a_fence_run_as_jobs_acts_once_on_each() {
    let Some(fenced) = killed_at_every_step(Executor::Job).await else {
        return;
    };
    assert_fenced_once(&fenced);
    let Some(jobs) = &fenced.jobs else {
        unreachable!("the Job executor's run has its runner")
    };
    assert!(jobs.problems().is_empty(), "{:?}", jobs.problems());

    // Here the proof is in the runner: each pod it ran is one run of an agent. Per step,
    // one pod ran the action, though two were recorded: the first was recorded, then its
    // Job's creation was refused and the controller killed; the next controller found no
    // Job of it, counted it interrupted and asked the device (a Verify, run as a Job too)
    // before it recorded the second. Killed after a Job had run, the next controller
    // read that Job's result instead of running it again.
    let fence = fence_of(&fenced.server, "worker-2").expect("the NodeFence");
    let id = fence_id(&fence);
    let runs = jobs.runs();
    let pods_of = |execution: &Value| {
        let job = job_name(&id, execution["name"].as_str().unwrap_or_default());
        runs.iter().filter(|run| run.job == job).count()
    };
    for (step, method) in STEPS {
        let executions = step_executions(&fence, step);
        let kinds: Vec<&str> = executions
            .iter()
            .map(|e| e["kind"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(kinds, ["Act", "Verify", "Act"], "{step}: {fence:#}");
        let (first, verify, second) = (&executions[0], &executions[1], &executions[2]);
        assert_eq!(first["method"], method, "{fence:#}");
        assert_eq!(first["result"], "Interrupted", "{fence:#}");
        assert_eq!(pods_of(first), 0, "the refused Job never ran: {runs:#?}");
        assert_eq!(verify["result"], "Succeeded", "{fence:#}");
        assert_eq!(verify["power"], "On", "not yet fenced: {fence:#}");
        assert_eq!(pods_of(verify), 1, "the device was asked: {runs:#?}");
        assert_eq!(second["method"], method, "{fence:#}");
        assert_eq!(
            second["result"], "Succeeded",
            "the result of a Job that ran while no controller did: {fence:#}"
        );
        assert_eq!(pods_of(second), 1, "one pod ran the {method}: {runs:#?}");
    }
    assert_eq!(
        runs.len(),
        2 * STEPS.len(),
        "no Job beyond these ran: {runs:#?}"
    );
}
