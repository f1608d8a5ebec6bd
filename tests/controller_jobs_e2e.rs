//! `nodekeeper controller` with the Job executor, end to end: the real binary against
//! the test API server, one Kubernetes Job per execution, each Job's container run by
//! the test's stand-in for the Job controller and a kubelet (`support::job_runner`),
//! which runs the real `nodekeeper fence execute` wrapper and through it the real
//! `fence_ipmilan` against `ipmi_sim` and `fence_dummy` as the storage fabric.
//!
//! What an operator would see is asserted: the Jobs and their names, that no credential
//! is in any Job or its log, the emulator's power, the pod released, and that a
//! restarted controller adopts the Job it had started instead of starting another.

mod support;

use std::path::Path;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use nodekeeper::controller::jobs::job_name;
use support::apiserver::FakeApiServer;
use support::controller::*;
use support::fence_emulators::IpmiSim;

/// The controller's configuration with the Job executor.
fn job_config(dir: &Path) -> std::path::PathBuf {
    controller_config(dir, &job_executor(dir))
}

fn jobs(server: &FakeApiServer) -> Vec<Job> {
    server.objects::<Job>()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_node_is_fenced_through_one_job_per_execution_with_no_credential_in_sight() {
    require!("fence-agents", fence_agents());
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let (server, fabric) = one_database_node(dir.path(), &bmc).await;
    let jobs_run = job_runner(&server, dir.path());
    let config = job_config(dir.path());
    let controller = ControllerProcess::start(dir.path(), &server, &config);
    controller.synced().await;
    // The first Job's create fails: the controller looks whether it exists after all
    // (the request may have been carried out), and creates it again.
    server.fail_matching(
        support::apiserver::RequestMatcher::method("POST").and_path("/jobs"),
        500,
        Some(1),
    );

    server.seed(&node("worker-2", "Unknown", Timestamp::now()));
    wait_for(&controller, "the pod to be released", || {
        server.object::<Pod>("shop", "db-0").is_none().then_some(())
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(&fabric).expect("fabric").trim(),
        "off"
    );
    controller.powered_off(&server, "worker-2").await;
    assert!(!bmc.power_is_on(), "the emulated machine is off");
    let fence = fence_of(&server, "worker-2").expect("the NodeFence");
    let id = fence_id(&fence);

    // One Job per execution, named from the fence's uid and the execution.
    let recorded = executions(&fence);
    let all_jobs = jobs(&server);
    for execution in &recorded {
        let name = job_name(&id, execution["name"].as_str().unwrap_or_default());
        assert!(
            all_jobs
                .iter()
                .any(|job| job.metadata.name.as_deref() == Some(name.as_str())),
            "no Job {name} for execution {execution}"
        );
    }
    assert_eq!(all_jobs.len(), recorded.len(), "{recorded:#?}");
    let power_off = recorded
        .iter()
        .find(|e| e["method"] == "ipmi-off")
        .expect("the power-off");
    assert_eq!(power_off["result"], "Succeeded", "{fence:#}");
    assert_eq!(power_off["offConfirmed"], true, "{fence:#}");

    // The password is in the Secret only: not in a Job, not in a container's output,
    // not in the controller's log.
    for job in &all_jobs {
        let text = serde_json::to_string(job).expect("job");
        assert!(!text.contains(IpmiSim::PASSWORD), "{text}");
        assert!(
            text.contains(r#""secretName":"bmc""#) || !text.contains("ipmi"),
            "the BMC Jobs mount the bmc Secret: {text}"
        );
        let affinity = serde_json::to_value(job).expect("json");
        assert_eq!(
            affinity.pointer("/spec/template/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchFields/0/values/0"),
            Some(&Value::from("worker-2")),
            "a fence Job never runs on the node it fences"
        );
    }
    let runs = jobs_run.runs();
    assert_eq!(runs.len(), recorded.len(), "{runs:#?}");
    for run in &runs {
        assert!(!run.output.contains(IpmiSim::PASSWORD), "{}", run.output);
        assert_eq!(run.exit_code, Some(0), "{run:#?}");
    }
    assert!(!controller.log().contains(IpmiSim::PASSWORD));
    assert!(jobs_run.problems().is_empty(), "{:?}", jobs_run.problems());
    assert_eq!(bmc.chassis_log().matches("set power 0").count(), 1);

    // The machine is back: recovery runs as Jobs too, and the fence ends.
    controller
        .recovered(&server, &bmc, &fabric, "worker-2")
        .await;
    assert!(
        jobs(&server).len() > recorded.len(),
        "the recovery ran as Jobs"
    );
    assert_eq!(bmc.chassis_log().matches("set power 0").count(), 1);
    support::controller_rbac::assert_exercised(
        &server.requests(),
        "a_lost_node_is_fenced_through_one_job_per_execution_with_no_credential_in_sight",
        NAMESPACE,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_controller_adopts_its_job_instead_of_starting_another() {
    require!("fence-agents", fence_agents());
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let (server, _fabric) = one_database_node(dir.path(), &bmc).await;
    let jobs_run = job_runner(&server, dir.path());
    // The power-off's Job will be created, but no kubelet starts its pod before the
    // controller dies (SIGKILL, the process).
    jobs_run.hold("power-management");
    let config = job_config(dir.path());
    let first = ControllerProcess::start(dir.path(), &server, &config);
    first.synced().await;
    server.seed(&node("worker-2", "Unknown", Timestamp::now()));
    let power_job = wait_for(&first, "the power-off Job to be created", || {
        let fence = fence_of(&server, "worker-2")?;
        let execution = executions(&fence)
            .into_iter()
            .find(|e| e["method"] == "ipmi-off" && e["kind"] == "Act")?;
        let name = job_name(&fence_id(&fence), execution["name"].as_str()?);
        jobs(&server)
            .iter()
            .any(|job| job.metadata.name.as_deref() == Some(name.as_str()))
            .then_some(name)
    })
    .await;
    first.kill();

    let second = ControllerProcess::start(dir.path(), &server, &config);
    second.synced().await;
    // The new leader has reconciled the fence against the pending Job by now.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    jobs_run.release();
    second.powered_off(&server, "worker-2").await;

    let fence = fence_of(&server, "worker-2").expect("fence");
    let power = step_executions(&fence, "PowerManagement");
    assert_eq!(
        power.len(),
        1,
        "the Job was adopted: no verify, no second action: {fence:#}"
    );
    assert_eq!(power[0]["result"], "Succeeded", "{fence:#}");
    assert_eq!(power[0]["offConfirmed"], true, "{fence:#}");
    let runs: Vec<_> = jobs_run
        .runs()
        .into_iter()
        .filter(|run| run.job == power_job)
        .collect();
    assert_eq!(runs.len(), 1, "one pod ran the power-off: {runs:#?}");
    let named_like_it = jobs(&server)
        .iter()
        .filter(|job| job.metadata.name.as_deref() == Some(power_job.as_str()))
        .count();
    assert_eq!(named_like_it, 1);
    assert_eq!(
        bmc.chassis_log().matches("set power 0").count(),
        1,
        "exactly one power-off reached the BMC"
    );
    assert!(!bmc.power_is_on());
    assert!(jobs_run.problems().is_empty(), "{:?}", jobs_run.problems());
}
