//! `nodekeeper agent --kubeconfig` as a process: it connects to the API server named in
//! the kubeconfig with its own User-Agent, watches only its own node's pods, and still
//! stops cleanly on SIGTERM.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::apiserver::FakeApiServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_with_a_kubeconfig_watches_its_node_pods_through_the_api() {
    let server = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\ndryRun: true\nhousekeepingInterval: 1s\nmetricsAddress: 127.0.0.1:0\n",
    )
    .unwrap();
    let mut agent = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
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
    let stderr = agent.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });

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
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = agent.wait().unwrap();
    let log = log.join().unwrap().join("\n");
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
