//! Isolating a node on the controller's instruction, end to end on a node booted with
//! systemd-nspawn (real systemd, a cgroup v2 tree): the agent in Kubernetes mode reports
//! over TLS to the controller's report endpoint (the real one, in this process); the
//! endpoint answers with the `isolate` instruction; the agent masks and stops the
//! kubelet's unit through systemd and kills every process of the pods cgroup
//! (`kubepods.slice`, pods as the systemd cgroup driver lays them out), then reports the
//! evidence. The agent itself runs in a pod slice, as a DaemonSet's agent does, and
//! spares its own pod. A restarted agent keeps the isolation; `endIsolation` lets the
//! kubelet run again.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use nodekeeper::report::auth::AuthPolicy;
use nodekeeper::report::protocol::{Instruction, IsolationReport, IsolationState};
use nodekeeper::report::tls::ServerIdentity;
use nodekeeper::report::{ReportHub, ReportMetrics, ReportsPolicy, server};
use prometheus_client::registry::Registry;

use support::apiserver::FakeApiServer;
use support::controller::{NAMESPACE, node, seed_node_tokens};
use support::node_units::{STAND_IN_KUBELET, agent_unit, pod_unit};
use support::nspawn::{Booted, NSPAWN};

const NODE: &str = "node-a";

fn token() -> String {
    format!("node-token-of-{NODE}-0123456789abcdef")
}

fn agent_config(reports: &str) -> String {
    format!(
        "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\nnodeName: {NODE}\n\
         kubernetes: {{cgroupDriver: systemd}}\n\
         report: {{controllerURL: \"https://{reports}\", interval: 1s, tokenFile: /shared/token, caFile: /shared/ca.crt, \
         isolation: {{stopTimeout: 10s}}}}\n"
    )
}

/// The controller's report endpoint over TLS, with node tokens from the test API server.
async fn report_endpoint(
    server: &FakeApiServer,
    served: &support::tls::Pair,
) -> (Arc<ReportHub>, String) {
    let identity = ServerIdentity::load(&served.cert, &served.key).expect("the certificate");
    let policy = ReportsPolicy {
        address: "127.0.0.1:0".to_string(),
        auth: AuthPolicy {
            node_tokens_secret: Some("node-tokens".to_string()),
            ..AuthPolicy::default()
        },
        ..ReportsPolicy::default()
    };
    let metrics = Arc::new(ReportMetrics::register(&mut Registry::default()));
    let hub = Arc::new(ReportHub::new(
        server.client(),
        NAMESPACE,
        policy,
        metrics,
        Some(identity),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let address = listener.local_addr().expect("address").to_string();
    tokio::spawn(server::serve(listener, hub.clone(), std::future::pending()));
    (hub, address)
}

/// The latest report's isolation, once the agent has reported.
fn isolation(hub: &ReportHub) -> Option<IsolationReport> {
    hub.views()
        .into_iter()
        .find(|view| view.report.node == NODE)
        .map(|view| view.report.isolation)
}

/// Waits up to `limit` for `check`; fails with the agent's log.
async fn wait_until<T>(
    booted: &Booted,
    what: &str,
    limit: Duration,
    check: impl FnMut() -> Option<T>,
) -> T {
    support::poll::Wait::for_(what, limit)
        .every(Duration::from_millis(50))
        .showing(|| {
            format!(
                "agent log:\n{}",
                std::fs::read_to_string(booted.shared.join("agent.log")).unwrap_or_default()
            )
        })
        .eventually(check)
        .await
}

/// The agent runs in a pod of its own, as a DaemonSet's agent does.
const AGENT_POD: &str = "kubepods-burstable-podagent.slice";

/// Every process of the pods cgroup but the agent's own pod, as the kernel lists them.
fn pod_processes(booted: &Booted) -> usize {
    let command = format!(
        "find /sys/fs/cgroup/kubepods.slice -name {AGENT_POD} -prune -o -name cgroup.procs \
         -print | xargs cat | grep -c ."
    );
    booted.container.stdout(&command).parse().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_isolates_itself_on_the_controllers_instruction_and_rejoins_when_told() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = require!(
        "openssl",
        support::tls::certificate_authority(dir.path(), "ca")
    );
    let served = support::tls::server_certificate(dir.path(), "controller", &ca)
        .expect("a certificate for the controller");
    let server = FakeApiServer::start().await;
    server.seed(&node(NODE, "True", k8s_openapi::jiff::Timestamp::now()));
    seed_node_tokens(&server, &[(NODE, token())]);
    let (hub, reports) = report_endpoint(&server, &served).await;

    let files: Vec<(&str, Vec<u8>)> = vec![
        ("agent.yaml", agent_config(&reports).into_bytes()),
        (
            "kubeconfig",
            server
                .kubeconfig_yaml_naming_ca(Some(&ca.cert))
                .into_bytes(),
        ),
        ("token", token().into_bytes()),
        (
            "ca.crt",
            std::fs::read(&ca.cert).expect("the CA certificate"),
        ),
    ];
    let units = vec![
        ("kubelet.service", STAND_IN_KUBELET.to_string()),
        (
            "pod-web.service",
            pod_unit("kubepods-besteffort-pod1a2b.slice"),
        ),
        (
            "pod-db.service",
            pod_unit("kubepods-burstable-pod3c4d.slice"),
        ),
        // A Guaranteed pod sits right under kubepods.slice.
        ("pod-batch.service", pod_unit("kubepods-pod5e6f.slice")),
        (
            "nodekeeper-agent.service",
            // In a pod slice of its own, as a DaemonSet's agent is: it must spare itself.
            agent_unit("pod-web.service pod-db.service pod-batch.service")
                .replace("[Service]\n", &format!("[Service]\nSlice={AGENT_POD}\n")),
        ),
    ];
    let booted = tokio::task::spawn_blocking(move || {
        support::nspawn::boot_unified(&units, &files, "reporting to the fence controller")
    })
    .await
    .expect("boot");
    let booted: Booted = require!(NSPAWN, booted);

    // Before any instruction: the kubelet and the pods run, and the agent says nothing
    // about isolation.
    let before = wait_until(
        &booted,
        "the agent's first report",
        Duration::from_secs(30),
        || isolation(&hub),
    )
    .await;
    assert_eq!(before.state, IsolationState::None, "{before:?}");
    assert_eq!(
        booted
            .container
            .stdout("systemctl is-active kubelet.service"),
        "active"
    );
    let running = pod_processes(&booted);
    assert_eq!(running, 6, "three pods of two processes each");

    // The controller asks.
    let asked = Instant::now();
    hub.instruct(
        NODE,
        vec![Instruction::Isolate {
            reason: "the node's Lease is silent but its agent reports".to_string(),
            request: 42,
        }],
    );
    let isolated = wait_until(
        &booted,
        "a report of the isolation with its evidence",
        Duration::from_secs(30),
        || isolation(&hub).filter(IsolationReport::is_confirmed),
    )
    .await;
    assert_eq!(
        isolated.request, 42,
        "the report names the request it answers"
    );
    let took = asked.elapsed();
    println!(
        "isolated {:.2}s after the instruction was posted (reports every 1 s): {isolated:?}",
        took.as_secs_f64()
    );

    // What the report says is what the node shows.
    assert_eq!(
        booted
            .container
            .stdout("systemctl is-active kubelet.service"),
        "inactive"
    );
    assert_eq!(
        booted
            .container
            .stdout("systemctl show --property=LoadState --value kubelet.service"),
        "masked"
    );
    assert_eq!(pod_processes(&booted), 0, "no pod process is left");
    // Nothing can start the kubelet again, not its Restart=, not an operator by mistake.
    let start = booted.container.exec("systemctl start kubelet.service");
    assert!(
        !start.status.success(),
        "the masked kubelet started: {start:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        booted
            .container
            .stdout("systemctl is-active kubelet.service"),
        "inactive"
    );

    // A restarted agent keeps the isolation and goes on proving it.
    let restart = booted
        .container
        .exec("systemctl restart nodekeeper-agent.service");
    assert!(restart.status.success(), "{restart:?}");
    // (systemctl waits for the restart: the old agent's last report is in by now.)
    let restarted_at = k8s_openapi::jiff::Timestamp::now();
    wait_until(
        &booted,
        "the restarted agent's report of the kept isolation",
        Duration::from_secs(30),
        || {
            hub.views()
                .into_iter()
                .find(|view| view.report.node == NODE && view.received_at > restarted_at)
                .filter(|view| view.report.isolation.is_confirmed())
        },
    )
    .await;
    let log = std::fs::read_to_string(booted.shared.join("agent.log")).unwrap_or_default();
    assert!(
        log.contains("isolation is kept from before the agent restarted"),
        "{log}"
    );

    // The controller ends it: the kubelet runs again, unmasked.
    hub.instruct(NODE, vec![Instruction::EndIsolation]);
    wait_until(
        &booted,
        "a report without isolation",
        Duration::from_secs(30),
        || isolation(&hub).filter(|report| report.state == IsolationState::None),
    )
    .await;
    hub.instruct(NODE, Vec::new());
    wait_until(
        &booted,
        "the kubelet running again",
        Duration::from_secs(10),
        || {
            (booted
                .container
                .stdout("systemctl is-active kubelet.service")
                == "active")
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        booted
            .container
            .stdout("systemctl show --property=LoadState --value kubelet.service"),
        "loaded"
    );
    assert!(
        booted
            .container
            .stdout("ls /run/nodekeeper/ 2>/dev/null")
            .is_empty(),
        "the isolation record is gone"
    );
}
