//! A real client against the test API server: Debian's kubectl (kubernetes-client)
//! installs the NodeFence CRD that `nodekeeper crd` generates, applies a NodeFence as an
//! operator does to fence a node by hand, and lists NodeFences with the printer columns
//! that tell an operator what a fence is doing.

mod support;

use std::path::{Path, PathBuf};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};
use nodekeeper::controller::resource::{
    FencePhase, FenceStep, NodeFence, NodeFenceStatus, Pause, PauseReason,
};

use support::apiserver::FakeApiServer;
use support::real;

/// `kubectl ARGS` against the server; (success, stdout, stderr).
async fn kubectl(kubectl: &Path, dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(kubectl)
        .args(args)
        .arg(format!("--kubeconfig={}", dir.join("kubeconfig").display()))
        // A private discovery cache: another test's server on the same port must not
        // answer for this one.
        .arg(format!("--cache-dir={}", dir.join("cache").display()))
        .env_remove("KUBECONFIG")
        .output()
        .await
        .expect("run kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn crd_manifest() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/kubernetes/controller/crd.yaml")
}

/// The columns of `line`, split on runs of two or more spaces as kubectl pads them.
fn columns(line: &str) -> Vec<String> {
    line.split("  ")
        .map(str::trim)
        .filter(|cell| !cell.is_empty())
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_the_crd_and_lists_nodefences_with_their_columns() {
    let kubectl_path = require!("kubectl (Debian kubernetes-client)", real::debian_kubectl());
    let dir = tempfile::tempdir().expect("temp dir");
    let server = FakeApiServer::start().await;
    server
        .write_kubeconfig(&dir.path().join("kubeconfig"))
        .expect("kubeconfig");
    let run = |args: Vec<String>| {
        let kubectl_path = kubectl_path.clone();
        let dir = dir.path().to_path_buf();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            kubectl(&kubectl_path, &dir, &args).await
        }
    };

    // The test server has no OpenAPI document for client-side validation.
    let crd = crd_manifest().display().to_string();
    let (ok, out, err) = run(vec![
        "apply".into(),
        "--validate=false".into(),
        "-f".into(),
        crd,
    ])
    .await;
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(
            "customresourcedefinition.apiextensions.k8s.io/nodefences.fencing.nodekeeper.io created"
        ),
        "{out}"
    );

    // An operator fences worker-2 by hand.
    let manifest = dir.path().join("fence.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: fencing.nodekeeper.io/v1alpha1\nkind: NodeFence\nmetadata:\n  name: worker-2\nspec:\n  nodeName: worker-2\n  force: true\n",
    )
    .expect("manifest");
    let (ok, out, err) = run(vec![
        "apply".into(),
        "--validate=false".into(),
        "-f".into(),
        manifest.display().to_string(),
    ])
    .await;
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("nodefence.fencing.nodekeeper.io/worker-2 created"),
        "{out}"
    );

    // The controller's status, written the way the controller writes it.
    let api: Api<NodeFence> = Api::all(server.client());
    let mut fence = api.get("worker-2").await.expect("the applied NodeFence");
    assert!(fence.spec.force);
    let now = k8s_openapi::jiff::Timestamp::now();
    fence.status = Some(NodeFenceStatus {
        step: Some(FenceStep::PowerManagement),
        phase: Some(FencePhase::New),
        retries: 1,
        last_result: Some("ipmi-off off: Failed".to_string()),
        pause: Some(Pause {
            reason: PauseReason::RetryBackoff,
            message: "retry 1 of the power-management step starts soon".to_string(),
            since: Time(now),
            until: None,
        }),
        ..NodeFenceStatus::default()
    });
    api.replace_status("worker-2", &PostParams::default(), &fence)
        .await
        .expect("write the status");

    let (ok, out, err) = run(vec!["get".into(), "nodefences".into()]).await;
    assert!(ok, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        columns(lines[0]),
        ["NAME", "NODE", "STEP", "PHASE", "AGE", "LAST RESULT"],
        "{out}"
    );
    let row = columns(lines[1]);
    assert_eq!(
        row[..4],
        ["worker-2", "worker-2", "PowerManagement", "New"],
        "{out}"
    );
    assert!(row[4].ends_with('s'), "an age: {out}");
    assert_eq!(row[5], "ipmi-off off: Failed", "{out}");

    // The short name and the wide columns: why it waits, and how often it was retried.
    let (ok, out, err) = run(vec!["get".into(), "nf".into(), "-o".into(), "wide".into()]).await;
    assert!(ok, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        columns(lines[0]),
        [
            "NAME",
            "NODE",
            "STEP",
            "PHASE",
            "AGE",
            "LAST RESULT",
            "PAUSED",
            "RETRIES"
        ],
        "{out}"
    );
    let row = columns(lines[1]);
    assert_eq!(row[6..], ["RetryBackoff", "1"], "{out}");
}
