//! The timed recovery scenarios of issue 13, end to end: the real controller, the real
//! agent on a node booted with systemd-nspawn (real systemd and logind), the test API
//! server, and `ipmi_sim` as the node's BMC. Each scenario prints its time; the figures
//! are in docs/performance.md.
//!
//! (a) Graceful shutdown: `systemctl poweroff` on the node; the agent drains its pods
//! through the API and says so over TLS; once the node is silent, the controller takes it
//! out of service (the StatefulSet pod's volume is released) with no power action,
//! within `silenceTimeout` + 2 s of the agent's final report.
//!
//! (c) Partition: the node loses the API server (its connections through a proxy the
//! test cuts; its kubelet stops renewing the Lease) but its agent still reaches the
//! controller. The controller asks the agent to isolate the node; the agent masks and
//! stops the kubelet's unit and kills the pods cgroup; the controller takes the node out
//! of service on the agent's report, with no power action. When the partition heals, the
//! agent is told to end the isolation and the node comes back.

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
use support::node_units::{STAND_IN_KUBELET, agent_unit, pod_unit};
use support::nspawn::{Booted, NSPAWN};
use support::proxy::TcpProxy;

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

/// The cluster both scenarios start from, with the controller running: node-a (the
/// container) with a database whose volume is attached to it, two more Ready nodes, the
/// kubelets' Leases at the kubelet's defaults, the node's report token, and a fence
/// configuration through the BMC that must never be used.
struct Cluster {
    server: Arc<FakeApiServer>,
    /// The storage fabric port the configuration names (`on`, never touched).
    fabric: std::path::PathBuf,
    kubelets: Kubelets,
    controller: ControllerProcess,
}

impl Cluster {
    async fn start(dir: &std::path::Path, bmc: &IpmiSim, served: &support::tls::Pair) -> Cluster {
        let server = Arc::new(ready_cluster(&["node-b", "node-c"]).await);
        server.seed(&node_with_volume(NODE));
        seed_database(&server, NODE, "db-0");
        let fabric = enabled_fabric(dir);
        seed_fence_config(&server, NODE, bmc.port(), &fabric);
        seed_node_tokens(&server, &[(NODE, token())]);
        let kubelets = Kubelets::with_defaults(&server, &[NODE, "node-b", "node-c"]).await;
        let controller = ControllerProcess::start_logging(
            dir,
            &server,
            &controller_config(
                dir,
                &format!(
                    "reports: {{address: \"127.0.0.1:0\", nodeTokensSecret: node-tokens, {}}}\n",
                    served.reports_setting()
                ),
            ),
            DEBUG_LOG,
        );
        controller.synced().await;
        Cluster {
            server,
            fabric,
            kubelets,
            controller,
        }
    }

    /// Nothing was done to the machine: the BMC saw no power command and the storage
    /// fabric port is as it was.
    fn assert_untouched(&self, bmc: &IpmiSim) {
        assert!(bmc.power_is_on(), "the BMC was never told to power off");
        assert!(
            !bmc.chassis_log().contains("set power"),
            "{}",
            bmc.chassis_log()
        );
        assert_eq!(
            std::fs::read_to_string(&self.fabric)
                .expect("fabric port")
                .trim(),
            "on",
            "the storage fabric was never touched"
        );
    }
}

/// The node's NodeFence, released with no step of its own: lost for `evidence`, confirmed
/// by a proof that says `proof`, no execution, and `events` among its Events.
fn released_without_a_step(
    server: &FakeApiServer,
    evidence: &str,
    proof: &str,
    events: &[&str],
) -> Value {
    let fence = fence_of(server, NODE).expect("the NodeFence");
    let status = &fence["status"];
    assert_eq!(status["lost"]["evidence"], evidence, "{fence}");
    assert!(
        status["confirmedBy"]
            .as_str()
            .is_some_and(|said| said.contains(proof)),
        "{fence}"
    );
    assert!(executions(&fence).is_empty(), "{fence}");
    let reasons = reasons(server, NODE, "NodeFence");
    for event in events {
        assert!(reasons.contains(&event.to_string()), "{reasons:?}");
    }
    fence
}

/// A CA and the controller's certificate signed by it.
fn certificates(dir: &std::path::Path) -> Result<(support::tls::Pair, support::tls::Pair), String> {
    let ca = support::tls::certificate_authority(dir, "ca")?;
    let served = support::tls::server_certificate(dir, "controller", &ca)?;
    Ok((ca, served))
}

/// The files the node's agent reads from `/shared`: its configuration, a kubeconfig (with
/// a CA: the minimal Debian tree has no certificate store, see the helper), its report
/// token and the CA that signs the controller's certificate.
fn node_files(
    agent_yaml: String,
    kubeconfig: String,
    ca: &support::tls::Pair,
) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("agent.yaml", agent_yaml.into_bytes()),
        ("kubeconfig", kubeconfig.into_bytes()),
        ("token", token().into_bytes()),
        (
            "ca.crt",
            std::fs::read(&ca.cert).expect("the CA certificate"),
        ),
    ]
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
    let (ca, served) = require!("openssl", certificates(dir.path()));

    let cluster = Cluster::start(dir.path(), &bmc, &served).await;
    let (server, kubelets, controller) = (&cluster.server, &cluster.kubelets, &cluster.controller);
    let kubelet = tokio::spawn(finish_deletions(server.clone(), |_| true));
    let reports = controller.reports_address();
    let kubeconfig = server.kubeconfig_yaml_naming_ca(Some(&ca.cert));
    let files = node_files(agent_config(&reports), kubeconfig, &ca);
    let booted = tokio::task::spawn_blocking(move || {
        support::nspawn::boot(
            &[("nodekeeper-agent.service", agent_unit(""))],
            &files,
            "logind delay lock held",
        )
    })
    .await
    .expect("boot");
    let booted: Booted = require!(NSPAWN, booted);
    wait_for(controller, "the agent's first report over TLS", || {
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

    let released_at = wait_for(controller, "the out-of-service taint", || {
        taint_keys(server, NODE)
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
    let renewed = last_renewal(server, NODE).await;
    assert!(
        released_at >= renewed + RENEWAL,
        "released at {released_at}, before the kubelet missed the renewal due {RENEWAL:?} after {renewed}"
    );

    // Why, in the NodeFence; and nothing was done to the machine.
    released_without_a_step(server, "Drained", "drained cleanly", &["NodeDrained"]);
    cluster.assert_untouched(&bmc);
    kubelet.abort();
}

/// The agent for scenario (c): Kubernetes mode with the systemd cgroup driver, reports
/// over https; isolation with its defaults.
fn partition_agent_config(reports: &str) -> String {
    format!(
        "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\nnodeName: {NODE}\n\
         kubernetes: {{cgroupDriver: systemd}}\n\
         report: {{controllerURL: \"https://{reports}\", tokenFile: /shared/token, caFile: /shared/ca.crt}}\n"
    )
}

/// What the node lifecycle controller writes: the node's Ready condition, by a status
/// patch (the controller's taints stay).
async fn set_ready(server: &FakeApiServer, status: &str, since: Timestamp) {
    let nodes: kube::Api<Node> = kube::Api::all(server.client());
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": "Ready", "status": status, "reason": "test",
        "lastTransitionTime": since.to_string(), "lastHeartbeatTime": since.to_string(),
    }]}});
    nodes
        .patch_status(
            NODE,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("the Ready condition");
}

fn container_shell(booted: &Booted, command: &str) -> String {
    let output = booted.container.exec(command);
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// The node lifecycle controller's grace before it marks a silent node Unknown
/// (`node-monitor-grace-period`, 40 s before Kubernetes 1.32).
const NODE_MONITOR_GRACE: Duration = Duration::from_secs(40);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_the_api_server_is_isolated_by_its_agent_and_released_without_a_power_action()
 {
    require!("fence-agents", fence_agents());
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let (ca, served) = require!("openssl", certificates(dir.path()));

    let cluster = Cluster::start(dir.path(), &bmc, &served).await;
    let (server, kubelets, controller) = (&cluster.server, &cluster.kubelets, &cluster.controller);
    // The node reaches the API server through a proxy the test can cut.
    let api_address = server
        .url()
        .trim_start_matches("http://")
        .parse()
        .expect("the API server's address");
    let node_link = TcpProxy::start(api_address).await;
    let reports = controller.reports_address();
    let kubeconfig = server
        .kubeconfig_yaml_naming_ca(Some(&ca.cert))
        .replace(&server.url(), &format!("http://{}", node_link.address()));
    let files = node_files(partition_agent_config(&reports), kubeconfig, &ca);
    let units = vec![
        ("kubelet.service", STAND_IN_KUBELET.to_string()),
        // The database pod's containers, where the systemd driver puts a Burstable pod.
        (
            "pod-db.service",
            pod_unit("kubepods-burstable-pod6b1e2f0a.slice"),
        ),
        ("nodekeeper-agent.service", agent_unit("pod-db.service")),
    ];
    let booted = tokio::task::spawn_blocking(move || {
        support::nspawn::boot_unified(&units, &files, "reporting to the fence controller")
    })
    .await
    .expect("boot");
    let booted: Booted = require!(NSPAWN, booted);
    wait_for(
        controller,
        "the agent's report that it reaches the API server",
        || {
            controller
                .agent_view(NODE)
                .filter(|view| view["report"]["apiServer"]["state"] == "reachable")
        },
    )
    .await;
    assert_eq!(
        container_shell(&booted, "systemctl is-active kubelet.service"),
        "active"
    );

    // The partition: the node's connections to the API server are cut, so its kubelet
    // renews no more; the agent still reaches the controller.
    node_link.cut();
    kubelets.stop(NODE);
    let cut_at = Timestamp::now();
    let renewed = last_renewal(server, NODE).await;
    // The node lifecycle controller marks it Unknown after its grace.
    let grace_ends = renewed + NODE_MONITOR_GRACE;
    if let Ok(wait) = Duration::try_from(grace_ends.duration_since(Timestamp::now())) {
        tokio::time::sleep(wait).await;
    }
    set_ready(server, "Unknown", Timestamp::now()).await;
    let not_ready_at = Timestamp::now();

    let released_at = wait_for(controller, "the out-of-service taint", || {
        taint_keys(server, NODE)
            .iter()
            .any(|key| key == OUT_OF_SERVICE)
            .then(Timestamp::now)
    })
    .await;
    let seconds = |from: Timestamp| {
        Duration::try_from(released_at.duration_since(from))
            .unwrap_or_default()
            .as_secs_f64()
    };
    println!(
        "scenario (c) partition: pod released {:.1}s after the node was cut off from the API server, {:.1}s after it was marked NotReady ({}s after its last renewal), no power action (reports every {}s, Lease renewed every {}s, silenceTimeout {}s)",
        seconds(cut_at),
        seconds(not_ready_at),
        NODE_MONITOR_GRACE.as_secs(),
        REPORT_INTERVAL.as_secs(),
        RENEWAL.as_secs(),
        SILENCE.as_secs()
    );
    assert!(
        seconds(not_ready_at) <= 10.0,
        "released {:.1}s after NotReady; controller log:\n{}",
        seconds(not_ready_at),
        controller.log()
    );

    // Why, in the NodeFence; what the node shows; and nothing was done to the machine.
    let fence = released_without_a_step(
        server,
        "Partitioned",
        "no pod process is left",
        &["IsolationRequested", "NodeIsolated"],
    );
    assert_eq!(
        fence["status"]["selfIsolation"]["outcome"], "Confirmed",
        "{fence}"
    );
    assert_eq!(
        container_shell(&booted, "systemctl is-active kubelet.service"),
        "inactive"
    );
    assert_eq!(
        container_shell(
            &booted,
            "find /sys/fs/cgroup/kubepods.slice -name cgroup.procs -exec cat {} + | grep -c ."
        ),
        "0",
        "no pod process is left"
    );
    cluster.assert_untouched(&bmc);

    // The pod is gone (the rig's controller deletes it, as the pod garbage collector
    // would on the out-of-service node), and the partition heals: the agent reaches the
    // API server again and is told to end the isolation; the kubelet starts.
    wait_for(controller, "the database pod gone from the node", || {
        server.object::<Pod>("shop", "db-0").is_none().then_some(())
    })
    .await;
    node_link.mend();
    wait_for(controller, "the kubelet running again", || {
        (container_shell(&booted, "systemctl is-active kubelet.service") == "active").then_some(())
    })
    .await;
    kubelets.resume(NODE).await;
    set_ready(server, "True", Timestamp::now()).await;
    wait_for(controller, "the fence to end and its taints to go", || {
        (fence_of(server, NODE).is_none()
            && !taint_keys(server, NODE)
                .iter()
                .any(|key| key == OUT_OF_SERVICE))
        .then_some(())
    })
    .await;
    cluster.assert_untouched(&bmc);
}
