//! The timed recovery scenarios of issue 13, end to end: the real controller, the real
//! agent on a node booted with systemd-nspawn (real systemd and logind), the test API
//! server, and `ipmi_sim` as the node's BMC. Each scenario prints its time; the figures
//! are in docs/performance.md.
//!
//! (a) Graceful shutdown: `systemctl poweroff` on the node; the agent drains its pods
//! through the API and says so over TLS; once the node is silent, the controller takes it
//! out of service (the StatefulSet pod's volume is released) with no power action,
//! within `silenceTimeout` + 2 s of the agent's final report.

mod support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{AttachedVolume, Node, Pod};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use support::apiserver::FakeApiServer;
use support::controller::*;
use support::fence_emulators::IpmiSim;
use support::kubelet::{Kubelets, finish_deletions};
use support::nspawn::{Booted, NSPAWN};

/// The node the container plays.
const NODE: &str = "node-a";
/// The defaults: the controller's silence timeout, the agent's report interval, the
/// kubelet's Lease renewal.
const SILENCE: Duration = Duration::from_secs(20);
const REPORT_INTERVAL: Duration = Duration::from_secs(2);
const RENEWAL: Duration = Duration::from_secs(10);
const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

fn token() -> String {
    format!("node-token-of-{NODE}-0123456789abcdef")
}

/// The agent as a systemd unit, in Kubernetes mode against the test API server.
const AGENT_UNIT: &str = "\
[Unit]
Description=nodekeeper agent
Wants=dbus.service
After=dbus.service systemd-logind.service

[Service]
ExecStart=/usr/local/bin/nodekeeper agent --config /shared/agent.yaml --kubeconfig /shared/kubeconfig --metrics-addr 127.0.0.1:0
Environment=RUST_LOG=info,kube=warn
Environment=NO_COLOR=1
Restart=always
RestartSec=200ms
StandardOutput=append:/shared/agent.log
StandardError=append:/shared/agent.log

[Install]
WantedBy=multi-user.target
";

/// The agent's configuration: graceful shutdown in two phases, reports to the controller
/// over https with the node's token, checked against the test CA; every other setting
/// the default.
fn agent_config(reports: &str) -> String {
    format!(
        "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\nnodeName: {NODE}\n\
         shutdownGracePeriodByPodPriority:\n\
         - {{priority: 0, shutdownGracePeriodSeconds: 5}}\n\
         - {{priority: 2000000000, shutdownGracePeriodSeconds: 2}}\n\
         shutdownStateFile: /shared/state.json\n\
         report: {{controllerURL: \"https://{reports}\", tokenFile: /shared/token, caFile: /shared/ca.crt}}\n"
    )
}

/// `node`, Ready, with the database's volume attached (as the attach/detach controller
/// records it) and in use.
fn node_with_volume(name: &str) -> Node {
    let mut node = node(name, "True", Timestamp::now());
    let status = node.status.as_mut().expect("status");
    let volume = "kubernetes.io/csi/pd.csi.storage.gke.io^vol-data-db-0".to_string();
    status.volumes_attached = Some(vec![AttachedVolume {
        name: volume.clone(),
        device_path: String::new(),
    }]);
    status.volumes_in_use = Some(vec![volume]);
    node
}

/// When the node's kubelet last renewed its Lease.
async fn last_renewal(server: &FakeApiServer, node: &str) -> Timestamp {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(server.client(), support::kubelet::NODE_LEASES);
    leases
        .get(node)
        .await
        .expect("the node Lease")
        .spec
        .and_then(|spec| spec.renew_time)
        .map(|time| time.0)
        .expect("a renewal time")
}

fn received_at(view: &Value) -> Timestamp {
    view["receivedAt"]
        .as_str()
        .and_then(|at| at.parse().ok())
        .unwrap_or_else(|| panic!("no receivedAt in {view}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_shuts_down_gracefully_is_released_without_a_power_action() {
    require!("fence-agents", fence_agents());
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let ca = require!(
        "openssl",
        support::tls::certificate_authority(dir.path(), "ca")
    );
    let served = support::tls::server_certificate(dir.path(), "controller", &ca)
        .expect("a certificate for the controller");

    // The cluster: node-a (the container) with a database whose volume is attached to
    // it, two more Ready nodes, the kubelets' Leases at the kubelet's defaults, and a
    // fence configuration through the BMC that must never be used.
    let server = Arc::new(ready_cluster(&["node-b", "node-c"]).await);
    server.seed(&node_with_volume(NODE));
    seed_database(&server, NODE, "db-0");
    let fabric = enabled_fabric(dir.path());
    seed_fence_config(&server, NODE, bmc.port(), &fabric);
    seed_node_tokens(&server, &[(NODE, token())]);
    let kubelets = Kubelets::with_defaults(&server, &[NODE, "node-b", "node-c"]).await;
    let kubelet = tokio::spawn(finish_deletions(server.clone(), |_| true));

    let controller = ControllerProcess::start_logging(
        dir.path(),
        &server,
        &controller_config(
            dir.path(),
            &format!(
                "reports: {{address: \"127.0.0.1:0\", nodeTokensSecret: node-tokens, {}}}\n",
                served.reports_setting()
            ),
        ),
        DEBUG_LOG,
    );
    controller.synced().await;
    let reports = controller.reports_address();

    let files: Vec<(&str, Vec<u8>)> = vec![
        ("agent.yaml", agent_config(&reports).into_bytes()),
        // (The minimal Debian tree has no certificate store; see the helper.)
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
    let booted = tokio::task::spawn_blocking(move || {
        support::nspawn::boot(
            &[("nodekeeper-agent.service", AGENT_UNIT.to_string())],
            &files,
            "logind delay lock held",
        )
    })
    .await
    .expect("boot");
    let booted: Booted = require!(NSPAWN, booted);
    wait_for(&controller, "the agent's first report over TLS", || {
        controller.agent_view(NODE)
    })
    .await;

    // The operator shuts the node down.
    let poweroff = booted.container.exec("systemctl poweroff");
    assert!(poweroff.status.success(), "{poweroff:?}");
    let (gone, booted) = tokio::task::spawn_blocking(move || {
        let mut booted = booted;
        let gone = booted.container.exited_within(Duration::from_secs(60));
        (gone, booted)
    })
    .await
    .expect("the container");
    let agent_log = || std::fs::read_to_string(booted.shared.join("agent.log")).unwrap_or_default();
    assert!(
        gone,
        "the node did not power off; agent log:\n{}",
        agent_log()
    );
    // Its kubelet stopped with it.
    kubelets.stop(NODE);
    let powered_off_at = Timestamp::now();

    let log = agent_log();
    assert!(log.contains("PrepareForShutdown(true)"), "{log}");
    for line in log.lines().filter(|line| {
        line.contains("report") || line.contains("delay lock") || line.contains("phase")
    }) {
        println!("agent: {line}");
    }
    assert!(
        server.object::<Pod>("shop", "db-0").is_none(),
        "the agent drained the database pod through the API"
    );

    let released_at = wait_for(&controller, "the out-of-service taint", || {
        taint_keys(&server, NODE)
            .iter()
            .any(|key| key == OUT_OF_SERVICE)
            .then(Timestamp::now)
    })
    .await;
    let last = controller.agent_view(NODE).expect("the node's last report");
    let shutdown = &last["report"]["shutdown"];
    assert_eq!(shutdown["state"], "finished", "{last}");
    assert_eq!(shutdown["aboutToPowerOff"], true, "{last}");
    assert_eq!(shutdown["allPodsStopped"], true, "{last}");
    let final_report = received_at(&last);
    let after_report = Duration::try_from(released_at.duration_since(final_report))
        .expect("released after the final report");
    let after_poweroff =
        Duration::try_from(released_at.duration_since(powered_off_at)).unwrap_or_default();
    println!(
        "scenario (a) graceful shutdown: pod and volume released {:.1}s after the agent's final report, {:.1}s after the node powered off, no power action (reports every {}s, Lease renewed every {}s, silenceTimeout {}s)",
        after_report.as_secs_f64(),
        after_poweroff.as_secs_f64(),
        REPORT_INTERVAL.as_secs(),
        RENEWAL.as_secs(),
        SILENCE.as_secs()
    );
    // Not before the agent missed three reports (it stopped, as a powering-off node's
    // agent does; a second of slack for the two clocks the figures come from).
    assert!(
        after_report >= 3 * REPORT_INTERVAL - Duration::from_secs(1),
        "released {after_report:?} after the final report, before the agent missed three reports"
    );
    assert!(
        after_report <= SILENCE + Duration::from_secs(2),
        "released {after_report:?} after the final report, more than silenceTimeout + 2 s; controller log:\n{}",
        controller.log()
    );
    // Nor before the kubelet missed a renewal (it stopped when the node did).
    let renewed = last_renewal(&server, NODE).await;
    assert!(
        released_at >= renewed + RENEWAL,
        "released at {released_at}, before the kubelet missed the renewal due {RENEWAL:?} after {renewed}"
    );

    // Why, in the NodeFence; and nothing was done to the machine.
    let fence = fence_of(&server, NODE).expect("the NodeFence");
    let status = &fence["status"];
    assert_eq!(status["lost"]["evidence"], "Drained", "{fence}");
    assert!(
        status["confirmedBy"]
            .as_str()
            .is_some_and(|proof| proof.contains("drained cleanly")),
        "{fence}"
    );
    assert!(executions(&fence).is_empty(), "{fence}");
    assert!(
        reasons(&server, NODE, "NodeFence").contains(&"NodeDrained".to_string()),
        "{:?}",
        reasons(&server, NODE, "NodeFence")
    );
    assert!(bmc.power_is_on(), "the BMC was never told to power off");
    assert!(
        !bmc.chassis_log().contains("set power"),
        "{}",
        bmc.chassis_log()
    );
    assert_eq!(
        std::fs::read_to_string(&fabric)
            .expect("fabric port")
            .trim(),
        "on",
        "the storage fabric was never touched"
    );
    kubelet.abort();
}
