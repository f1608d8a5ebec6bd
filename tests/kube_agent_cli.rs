//! `nodekeeper agent --kubeconfig` as a process: it connects to the API server named in
//! the kubeconfig with its own User-Agent, watches only its own node's pods, and still
//! stops cleanly on SIGTERM.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::apiserver::FakeApiServer;

/// `nodekeeper agent --kubeconfig` for node worker-7 against `server`, with `settings`
/// added to a minimal configuration (1 s cycles, metrics on a free port); its log is
/// collected until it exits.
struct AgentProcess {
    child: std::process::Child,
    log: std::thread::JoinHandle<Vec<String>>,
    _dir: tempfile::TempDir,
}

/// Writes `dir/kubeconfig` for `server` and `dir/agent.yaml` (1 s cycles, metrics on a
/// free port, then `settings`); returns both paths.
fn write_files(
    dir: &std::path::Path,
    server: &FakeApiServer,
    settings: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let config = dir.join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\n\
             housekeepingInterval: 1s\nmetricsAddress: 127.0.0.1:0\n{settings}"
        ),
    )
    .unwrap();
    (kubeconfig, config)
}

impl AgentProcess {
    fn start(server: &FakeApiServer, settings: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (kubeconfig, config) = write_files(dir.path(), server, settings);
        let mut child = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
            .args(["agent", "--node-name", "worker-7", "--config"])
            .arg(&config)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .env("RUST_LOG", "info")
            .env_remove("KUBECONFIG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = std::thread::spawn(move || {
            BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
                .collect::<Vec<_>>()
        });
        AgentProcess {
            child,
            log,
            _dir: dir,
        }
    }

    /// SIGTERM, then wait for the exit: its status and the whole log.
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = self.child.wait().unwrap();
        (status, self.log.join().unwrap().join("\n"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_with_a_kubeconfig_watches_its_node_pods_through_the_api() {
    let server = FakeApiServer::start().await;
    let agent = AgentProcess::start(&server, "dryRun: true\n");

    let deadline = Instant::now() + Duration::from_secs(30);
    let watched = loop {
        let watch = server.requests().into_iter().find(|r| {
            r.path == "/api/v1/pods"
                && r.query_param("fieldSelector").as_deref() == Some("spec.nodeName=worker-7")
        });
        if watch.is_some() || Instant::now() > deadline {
            break watch;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (status, log) = agent.stop();
    assert!(
        watched.is_some(),
        "no pod list/watch for the node; agent log:\n{log}"
    );
    assert!(log.contains("evicting through the Kubernetes API"), "{log}");
    let agent = format!("nodekeeper/{}", env!("CARGO_PKG_VERSION"));
    for request in server.requests() {
        assert_eq!(
            request.user_agent, agent,
            "{} {}",
            request.method, request.path
        );
    }
    assert!(status.success(), "agent exited with {status}:\n{log}");
}

/// Writes still queued when the agent stops go out before it exits: the API server
/// refuses the node's conditions until the moment the agent gets SIGTERM, and the
/// conditions must be on the Node when the agent has exited, though the sender was
/// waiting out a backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_writes_still_queued_at_stop_are_sent_before_the_agent_exits() {
    use k8s_openapi::api::core::v1::Node;
    use support::apiserver::RequestMatcher;

    let server = FakeApiServer::start().await;
    server.seed(&Node {
        metadata: kube::api::ObjectMeta {
            name: Some("worker-7".to_string()),
            ..Default::default()
        },
        ..Default::default()
    });
    let status_patch = RequestMatcher::method("PATCH").and_path("/api/v1/nodes/worker-7/status");
    server.fail_matching(status_patch, 500, None);
    // Not a dry run (a dry run writes nothing to flush), and no pods, so nothing is
    // evicted: the only writes are the node's own conditions.
    let agent = AgentProcess::start(&server, "");

    // Three refusals: the sender's next try is 0.8 s away when the agent is told to stop.
    let refused = || {
        server
            .requests()
            .iter()
            .filter(|r| r.method == "PATCH" && r.path == "/api/v1/nodes/worker-7/status")
            .filter(|r| r.status == 500)
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while refused() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refusals = refused();
    server.clear_failures();
    let (status, log) = agent.stop();
    assert!(
        refusals >= 3,
        "the conditions were not refused 3 times:\n{log}"
    );
    assert!(status.success(), "agent exited with {status}:\n{log}");
    let conditions: Vec<String> = server
        .object::<Node>("", "worker-7")
        .and_then(|node| node.status?.conditions)
        .unwrap_or_default()
        .into_iter()
        .map(|condition| condition.type_)
        .collect();
    for ours in [
        "NodekeeperMemoryPressure",
        "NodekeeperDiskPressure",
        "NodekeeperPIDPressure",
    ] {
        assert!(
            conditions.iter().any(|c| c == ours),
            "{ours} in {conditions:?}; agent log:\n{log}"
        );
    }
    assert!(
        log.contains("sending the API writes still queued before stopping"),
        "{log}"
    );
}

/// The kubelet measures `allocatableMemory.available` on its pods cgroup whenever
/// `enforceNodeAllocatable` holds `pods` (its default). With the API the agent finds that
/// cgroup from the pod cgroup naming, so the default threshold is observed without the
/// podsCgroup option: 4Gi limit, 1Gi working set, 3Gi available.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_kubernetes_mode_allocatable_memory_is_measured_on_the_pods_cgroup() {
    use support::agent_process::{AgentProcess as Agent, http_get};
    let server = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    // A cgroup v2 tree with the cgroupfs driver's pods cgroup.
    let cgroups = dir.path().join("cgroup");
    let pods = cgroups.join("kubepods");
    std::fs::create_dir_all(&pods).unwrap();
    std::fs::write(cgroups.join("cgroup.controllers"), "memory pids\n").unwrap();
    std::fs::write(pods.join("memory.current"), "1073741824\n").unwrap();
    std::fs::write(pods.join("memory.stat"), "inactive_file 0\n").unwrap();
    std::fs::write(pods.join("memory.max"), "4294967296\n").unwrap();
    let settings = format!("cgroupRoot: {}\n", cgroups.display());
    let (kubeconfig, config) = write_files(dir.path(), &server, &settings);
    let mut agent = Agent::dry_run_from(
        Command::new(support::agent_process::BINARY),
        &config,
        &[
            "--node-name".as_ref(),
            "worker-7".as_ref(),
            "--kubeconfig".as_ref(),
            kubeconfig.as_os_str(),
        ],
    );
    let expected = "nodekeeper_signal_available{signal=\"allocatableMemory.available\"} 3221225472";
    let deadline = Instant::now() + Duration::from_secs(30);
    let metrics = loop {
        let (_, body) = http_get(&agent.address, "/metrics");
        if body.contains(expected) || Instant::now() > deadline {
            break body;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let status = agent.stop(Duration::from_secs(20));
    let log = agent.whole_log().join("\n");
    assert!(metrics.contains(expected), "{metrics}\nagent log:\n{log}");
    assert!(
        log.contains("allocatableMemory.available is measured on the pods cgroup")
            && log.contains("pods_cgroup=/kubepods"),
        "{log}"
    );
    assert!(status.success(), "agent exited with {status}:\n{log}");
}
