//! `nodekeeper agent --kubeconfig` as a process: it connects to the API server named in
//! the kubeconfig with its own User-Agent, watches only its own node's pods, and still
//! stops cleanly on SIGTERM. Killed (SIGKILL) while an eviction's delete waits for the
//! API server, the agent started again sends that delete and does not evict the pod
//! again.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::apiserver::FakeApiServer;
use support::fake_node::successful_deletes;

/// `nodekeeper agent --kubeconfig` for node worker-7 against `server`, with `settings`
/// added to a minimal configuration (1 s cycles, metrics on a free port); its log is
/// collected until it exits.
struct AgentProcess {
    child: std::process::Child,
    log: std::thread::JoinHandle<Vec<String>>,
    _dir: tempfile::TempDir,
}

/// Writes `dir/kubeconfig` for `server` and `dir/agent.yaml` (1 s cycles, metrics on a
/// free port, the API writes owed kept in `dir`, then `settings`); returns both paths.
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
             housekeepingInterval: 1s\nmetricsAddress: 127.0.0.1:0\n\
             kubernetes:\n  stateFile: {}\n{settings}",
            dir.join("run/api-writes.json").display()
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

/// Node node-a under hard memory pressure (50Mi free, `memory.available<100Mi`), with hog,
/// the one pod that may be evicted, and a static and a critical pod that may not; the API
/// server refuses every pod delete. The agent evicts hog (its `DisruptionTarget` and
/// Evicted event go through, its delete is refused and retried) and is killed with
/// SIGKILL while the delete waits. Returns the server, the node, and the agent's
/// arguments for starting it again.
async fn agent_killed_owing_a_delete() -> (FakeApiServer, support::fake_node::Host, Vec<String>) {
    use support::agent_process::AgentProcess as Agent;
    use support::apiserver::RequestMatcher;
    use support::fake_node::{Host, MI, NODE, PODS, api_pod, qos_dir};

    let server = FakeApiServer::start().await;
    server.seed(&k8s_openapi::api::core::v1::Node {
        metadata: kube::api::ObjectMeta {
            name: Some(NODE.to_string()),
            ..Default::default()
        },
        ..Default::default()
    });
    let host = Host::new(50 * MI);
    host.set_boot_id("restart-test-boot");
    for fixture in PODS.iter().filter(|fixture| fixture.name != "modest") {
        server.seed(&api_pod(fixture));
        host.add_pod_cgroup(qos_dir(fixture), fixture.uid, fixture.working_set);
    }
    server.fail_matching(
        RequestMatcher::method("DELETE").and_path("/pods/"),
        500,
        None,
    );
    let (config, kubeconfig) = host.write_agent_files(&server, "housekeepingInterval: 1s\n");
    let args: Vec<String> = vec![
        "--metrics-addr".into(),
        "127.0.0.1:0".into(),
        "--config".into(),
        config.display().to_string(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
    ];
    let mut first = Agent::start(&args);
    first.wait_for_line("evicted pod", Duration::from_secs(30));
    // Killed once the delete has been refused and everything else has gone out: the
    // journal holds the delete alone (the server logs a request before the agent has
    // its answer, so the request log alone would be too early).
    let refused = || refused_deletes(&server, "hog") > 0;
    let owes_the_delete_alone = || {
        std::fs::read_to_string(host.api_writes_file())
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
            .and_then(|file| {
                let writes = file["writes"].as_array()?.clone();
                Some(writes.len() == 1 && writes[0]["kind"] == "podDelete")
            })
            .unwrap_or(false)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(refused() && owes_the_delete_alone()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // SIGKILL, to the agent this test started.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let log = first.whole_log().join("\n");
    assert!(refused(), "hog's delete was never refused:\n{log}");
    assert_eq!(evicted_events(&server, "hog"), 1, "{log}");
    let owed = std::fs::read_to_string(host.api_writes_file()).unwrap_or_default();
    assert!(
        owes_the_delete_alone() && owed.contains("11111111-aaaa"),
        "the journal does not hold hog's delete alone: {owed:?}\n{log}"
    );
    (server, host, args)
}

fn refused_deletes(server: &FakeApiServer, pod: &str) -> usize {
    let path = format!("/api/v1/namespaces/default/pods/{pod}");
    server
        .requests()
        .iter()
        .filter(|r| r.method == "DELETE" && r.path == path && r.status == 500)
        .count()
}

/// Evicted events posted about `pod`, whatever the answer.
fn evicted_events(server: &FakeApiServer, pod: &str) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path == "/api/v1/namespaces/default/events")
        .filter_map(|r| r.json_body())
        .filter(|event| event["involvedObject"]["name"] == pod && event["reason"] == "Evicted")
        .count()
}

/// The pressure is over when the agent comes back (its local kill freed the memory),
/// so nothing would make it evict hog again: the delete it owed is what removes the pod,
/// which the kubelet would otherwise restart as if nothing had happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_owed_when_the_agent_was_killed_is_sent_once_it_is_back() {
    use support::agent_process::AgentProcess as Agent;
    let (server, host, args) = agent_killed_owing_a_delete().await;
    host.set_free_memory(4096 * support::fake_node::MI);
    server.clear_failures();
    let mut second = Agent::start(&args);
    let serving = Instant::now();
    let deadline = serving + Duration::from_secs(15);
    while successful_deletes(&server, "hog").is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!(
        "the owed delete went out within {:?} of the restarted agent serving",
        serving.elapsed()
    );
    let status = second.stop(Duration::from_secs(20));
    let log = second.whole_log().join("\n");
    let deletes: Vec<serde_json::Value> = successful_deletes(&server, "hog")
        .iter()
        .map(|r| r.json_body().unwrap_or_default())
        .collect();
    assert_eq!(deletes.len(), 1, "hog's delete was not sent once:\n{log}");
    // The eviction's own delete: its grace period and the UID it was made for.
    assert_eq!(deletes[0]["gracePeriodSeconds"], 1, "{}", deletes[0]);
    assert_eq!(
        deletes[0]["preconditions"]["uid"], "11111111-aaaa",
        "{}",
        deletes[0]
    );
    assert!(
        log.contains("the agent restarted owing API writes")
            && log.contains("pod_delete pod default/hog"),
        "{log}"
    );
    assert!(!log.contains("evicted pod"), "evicted again:\n{log}");
    assert_eq!(evicted_events(&server, "hog"), 1, "{log}");
    assert!(status.success(), "agent exited with {status}:\n{log}");
    assert!(
        !host.api_writes_file().exists(),
        "nothing is owed, yet the journal is left:\n{log}"
    );
}

/// The pressure is still there and the API server still refuses the delete when the
/// agent comes back. hog has no process left (the kill before the crash ended it), so
/// the kubelet would not choose it again: the restarted agent leaves it to the eviction
/// under way, with no second kill or Evicted event, and sends the delete once the server
/// takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_does_not_evict_again_a_pod_whose_delete_it_owes() {
    use support::agent_process::AgentProcess as Agent;
    let (server, host, args) = agent_killed_owing_a_delete().await;
    let refused_before = refused_deletes(&server, "hog");
    let mut second = Agent::start(&args);
    // Three cycles under pressure while the delete is still refused.
    let deadline = Instant::now() + Duration::from_secs(20);
    while refused_deletes(&server, "hog") < refused_before + 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.clear_failures();
    let deadline = Instant::now() + Duration::from_secs(20);
    while successful_deletes(&server, "hog").is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = second.stop(Duration::from_secs(20));
    let log = second.whole_log().join("\n");
    assert!(
        refused_deletes(&server, "hog") >= refused_before + 2,
        "the restarted agent did not retry the owed delete:\n{log}"
    );
    // The restarted agent did decide under pressure, cycle after cycle, with hog listed.
    assert!(
        log.matches("Attempting to reclaim memory").count() >= 3,
        "no cycles under pressure:\n{log}"
    );
    assert!(!log.contains("evicted pod"), "hog evicted again:\n{log}");
    assert_eq!(
        evicted_events(&server, "hog"),
        1,
        "a second Evicted event:\n{log}"
    );
    assert_eq!(successful_deletes(&server, "hog").len(), 1, "{log}");
    assert!(status.success(), "agent exited with {status}:\n{log}");
    assert!(!host.api_writes_file().exists(), "{log}");
}

/// Memory pressure on a node whose only pods are critical (a static pod and one of
/// system-node-critical priority): the agent evicts nothing and says why, as the
/// kubelet's "unable to evict any pods from the node", once for the streak of pressured
/// cycles rather than every second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pressure_with_only_critical_pods_is_said_once_and_evicts_nothing() {
    use support::agent_process::AgentProcess as Agent;
    use support::fake_node::{Host, MI, PODS, api_pod, pods_listed, qos_dir, seed_node};
    const CRITICAL_ONLY: &str =
        "unable to evict any pods from the node: every active pod is critical";
    const PRESSED: &str = "Attempting to reclaim memory";

    let server = FakeApiServer::start().await;
    seed_node(&server);
    let host = Host::new(4096 * MI);
    let critical = ["static-etcd", "dns"];
    for fixture in PODS
        .iter()
        .filter(|fixture| critical.contains(&fixture.name))
    {
        server.seed(&api_pod(fixture));
        host.add_pod_cgroup(qos_dir(fixture), fixture.uid, fixture.working_set);
    }
    let (config, kubeconfig) = host.write_agent_files(&server, "housekeepingInterval: 1s\n");
    let agent = Agent::start_in_kubernetes(&config, &kubeconfig);
    let count = |text: &str| {
        agent
            .whole_log()
            .iter()
            .filter(|line| line.contains(text))
            .count()
    };
    agent
        .until(Duration::from_secs(30), "the node's pods listed", || {
            pods_listed(&server)
        })
        .await;
    host.set_free_memory(50 * MI);
    agent
        .until(Duration::from_secs(20), "4 cycles under pressure", || {
            count(PRESSED) >= 4
        })
        .await;
    let log = agent.whole_log();
    assert_eq!(count(CRITICAL_ONLY), 1, "{log:#?}");
    assert!(
        log.iter()
            .any(|line| line.contains(CRITICAL_ONLY) && line.contains("active_pods=2")),
        "{log:#?}"
    );
    assert!(
        !log.iter().any(|line| line.contains("evicted pod")),
        "{log:#?}"
    );
    assert!(
        !server.requests().iter().any(|r| r.method == "DELETE"),
        "{log:#?}"
    );
}

/// `agent --record` in Kubernetes mode keeps what a replay needs to decide as the agent
/// did: a pod whose emptyDir holds more than its `sizeLimit` is evicted by the agent for
/// the volume's limit (dry run), and `nodekeeper replay` of the record evicts it at once
/// for the same reason. The record once left out the pods' emptyDirs and containers, and
/// its replay evicted nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_the_record_evicts_for_an_empty_dir_limit_as_the_agent_did() {
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Volume};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use support::agent_process::AgentProcess as Agent;
    use support::fake_node::{Host, MI, api_pod, best_effort, seed_node};

    let server = FakeApiServer::start().await;
    seed_node(&server);
    let host = Host::new(4096 * MI);
    let scratchy = best_effort("scratchy", "55555555-eeee", 10);
    let bystander = best_effort("bystander", "66666666-ffff", 20);
    for fixture in [&scratchy, &bystander] {
        let mut pod = api_pod(fixture);
        if fixture.name == "scratchy" {
            let spec = pod.spec.as_mut().expect("a pod spec");
            spec.volumes = Some(vec![Volume {
                name: "scratch".to_string(),
                empty_dir: Some(EmptyDirVolumeSource {
                    size_limit: Some(Quantity("1Mi".to_string())),
                    ..Default::default()
                }),
                ..Default::default()
            }]);
        }
        server.seed(&pod);
        host.add_pod_cgroup("besteffort", fixture.uid, fixture.working_set);
    }
    let scratch = host
        .dir
        .path()
        .join("kubelet/pods")
        .join(scratchy.uid)
        .join("volumes/kubernetes.io~empty-dir/scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    std::fs::write(scratch.join("data"), vec![7u8; 2 * MI as usize]).unwrap();

    let (config, kubeconfig) = host.write_agent_files(&server, "housekeepingInterval: 200ms\n");
    let trace = host.dir.path().join("trace.yaml");
    let mut agent = Agent::dry_run_from(
        Command::new(support::agent_process::BINARY),
        &config,
        &[
            "--kubeconfig".as_ref(),
            kubeconfig.as_os_str(),
            "--record".as_ref(),
            trace.as_os_str(),
        ],
    );
    let evicted = agent.logged("dry run: would evict pod", Duration::from_secs(30));
    let status = agent.stop(Duration::from_secs(20));
    let log = agent.whole_log().join("\n");
    assert!(status.success(), "agent exited with {status}:\n{log}");
    assert!(
        evicted.contains("default/scratchy") && evicted.contains("emptydirfs.limit"),
        "the agent's eviction: {evicted}\n{log}"
    );

    let replay = support::agent_process::replay(&config, &trace);
    let first_eviction = replay
        .lines()
        .find(|line| !line.contains(r#""evicted":[]"#))
        .unwrap_or_else(|| panic!("the replay evicted nothing:\n{replay}"));
    assert!(
        first_eviction.contains(r#""name":"scratchy""#)
            && first_eviction.contains(r#""signal":"emptydirfs.limit""#)
            && !first_eviction.contains("bystander"),
        "the replay's first eviction: {first_eviction}"
    );
}
