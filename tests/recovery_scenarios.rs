//! The timed recovery scenarios of issue 13, end to end: the real controller, the real
//! agent on a node booted with systemd-nspawn (real systemd and logind), the test API
//! server, and `ipmi_sim` as the node's BMC. Each scenario prints its time; the figures
//! are in docs/performance.md.
//!
//! Each runs on a network of its own (`support::netns`): the test, the API server, the
//! controller and the BMC in a hub namespace, on the service addresses [`API_SERVICE`]
//! and [`CONTROLLER_SERVICE`]; each node in a namespace of its own, reaching them over
//! veth links, where its kubelet's Lease renewals come from too. A failure is a link
//! taken down at the hub: the node's packets are lost without an error, as behind a
//! failed switch port.
//!
//! (a) Graceful shutdown: `systemctl poweroff` on the node; the agent drains its pods
//! through the API and says so over TLS; once the node is silent, the controller takes it
//! out of service (the StatefulSet pod's volume is released) with no power action,
//! within `silenceTimeout` + 2 s of the agent's final report.
//!
//! (b) Dead node: the node's machine stops (the container killed, its link cut, its
//! Lease no longer renewed). Once its Lease and its agent have been silent for
//! `silenceTimeout`, the controller powers it off through `fence_ipmilan` and `ipmi_sim`
//! and, on the BMC's confirmation, takes it out of service.
//!
//! (c) Partition: the node loses the API server (the link that carries its API traffic
//! is cut, so its kubelet renews no more) but its agent still reaches the controller over
//! another link. The controller asks the agent to isolate the node; the agent masks and
//! stops the kubelet's unit and kills the pods cgroup; the controller takes the node out
//! of service on the agent's report, with no power action. When the partition heals, the
//! agent is told to end the isolation and the node comes back.
//!
//! (d) Storm: a rack's switch fails and half the cluster's nodes fall silent at once. The
//! storm guard holds every fence: nothing is powered off or isolated, not even once the
//! nodes read NotReady; when the switch comes back, the fences end on their own.
//!
//! (e) kdump: two nodes configured with `kdump=true` crash; node-a's crash kernel runs the
//! real `fence_kdump_send` from node-a's InternalIP. Its pods are released on that with no
//! power action, and its power-off waits `kdumpWait`. For node-b only another address
//! sends the same datagram: it changes nothing, node-b is powered off as a dead node.

mod support;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{AttachedVolume, Node, Pod};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use support::agent_process::{AgentProcess, BINARY};
use support::apiserver::FakeApiServer;
use support::controller::*;
use support::fence_emulators::IpmiSim;
use support::kubelet::{Kubelets, finish_deletions};
use support::netns::{Link, NETNS, Netns};
use support::node_units::{STAND_IN_KUBELET, agent_unit, pod_unit};
use support::nspawn::{BootOptions, Booted, NSPAWN};
use support::reports::token_of;

/// The node the container plays.
const NODE: &str = "node-a";
/// The defaults: the controller's silence timeout, the agent's report interval, the
/// kubelet's Lease renewal.
const SILENCE: Duration = Duration::from_secs(20);
const REPORT_INTERVAL: Duration = Duration::from_secs(2);
const RENEWAL: Duration = Duration::from_secs(10);
const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

/// The hub's service addresses: the API server's, and the controller's report endpoint.
const API_SERVICE: Ipv4Addr = Ipv4Addr::new(10, 231, 0, 1);
const CONTROLLER_SERVICE: &str = "10.231.0.2";
/// Both, as a node's link routes to them.
const SERVICES: [&str; 2] = ["10.231.0.1", CONTROLLER_SERVICE];

/// The hub: creates its namespace with the service addresses and moves the calling
/// thread (the test's, before it builds its runtime) into it.
fn hub() -> Result<Netns, String> {
    let hub = Netns::create("hub")?;
    for service in SERVICES {
        hub.add_service_address(service)?;
    }
    hub.enter()?;
    Ok(hub)
}

/// A namespace of its own for `role`, linked to the hub on `subnet` with routes to
/// `services`.
fn linked(hub: &Netns, role: &str, subnet: u8, services: &[&str]) -> Result<(Netns, Link), String> {
    let netns = Netns::create(role)?;
    let link = Link::connect(hub, &netns, subnet, services)?;
    Ok((netns, link))
}

/// The namespaces of a scenario with one node, which reaches the API server over its
/// link `api` and the controller over `control` (the same link unless the scenario
/// separates them).
struct Network {
    _hub: Netns,
    node: Netns,
    api: Link,
    _control: Option<Link>,
}

impl Network {
    /// The node reaches both services over one link.
    fn one_link() -> Result<Network, String> {
        let hub = hub()?;
        let (node, api) = linked(&hub, "node", 1, &SERVICES)?;
        Ok(Network {
            _hub: hub,
            node,
            api,
            _control: None,
        })
    }

    /// The node reaches the API server over one link and the controller over another.
    fn two_links() -> Result<Network, String> {
        let hub = hub()?;
        let node = Netns::create("node")?;
        let api = Link::connect(&hub, &node, 1, &[&API_SERVICE.to_string()])?;
        let control = Link::connect(&hub, &node, 2, &[CONTROLLER_SERVICE])?;
        Ok(Network {
            _hub: hub,
            node,
            api,
            _control: Some(control),
        })
    }
}

/// Runs a scenario on a runtime built on this thread, after it entered the hub: the
/// runtime's threads, and every process they start, are in the hub too.
fn run(scenario: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(scenario)
}

fn token() -> String {
    token_of(NODE)
}

/// The agents' eviction thresholds: memory only. The containers' filesystems are the
/// test machine's, and how full its disk is has no part in a scenario (with the
/// kubelet's default disk thresholds, a full disk would have the agent evict the
/// database for DiskPressure). As with the kubelet, setting `evictionHard` replaces the
/// default thresholds.
const MEMORY_ONLY: &str = "evictionHard: {memory.available: 100Mi}\n";

/// The agent's configuration: graceful shutdown in two phases, reports to the controller
/// over https with the node's token, checked against the test CA; memory thresholds
/// only; every other setting the default.
fn agent_config(reports: &str) -> String {
    format!(
        "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\nnodeName: {NODE}\n\
         shutdownGracePeriodByPodPriority:\n\
         - {{priority: 0, shutdownGracePeriodSeconds: 5}}\n\
         - {{priority: 2000000000, shutdownGracePeriodSeconds: 2}}\n\
         shutdownStateFile: /shared/state.json\n{MEMORY_ONLY}\
         report: {{controllerURL: \"https://{reports}\", tokenFile: /shared/token, caFile: /shared/ca.crt}}\n"
    )
}

/// The cluster the node scenarios start from, with the controller running: node-a (the
/// container, in the namespace `node`) with a database whose volume is attached to it,
/// two more Ready nodes, the kubelets' Leases at the kubelet's defaults (node-a's renewed
/// from its namespace), the node's report token, and a fence configuration through the
/// BMC (`seed`) that only the dead node's scenario may use.
struct Cluster {
    server: Arc<FakeApiServer>,
    /// The storage fabric port the configuration names (`on`, never touched).
    fabric: std::path::PathBuf,
    /// node-a's kubelet, renewing over the node's link.
    kubelet: Kubelets,
    /// The other nodes' kubelets.
    _others: Kubelets,
    controller: ControllerProcess,
}

type FenceConfig = fn(&FakeApiServer, &str, u16, &std::path::Path);

impl Cluster {
    async fn start(
        dir: &std::path::Path,
        bmc: &IpmiSim,
        served: &support::tls::Pair,
        node: &Netns,
        seed: FenceConfig,
    ) -> Cluster {
        let server = Arc::new(ready_cluster_on(API_SERVICE, &["node-b", "node-c"]).await);
        server.seed(&node_with_volume(NODE));
        seed_database(&server, NODE, "db-0");
        let fabric = enabled_fabric(dir);
        seed(&server, NODE, bmc.port(), &fabric);
        seed_node_tokens(&server, &[(NODE, token())]);
        let kubelet = Kubelets::with_defaults_in(node, &server.url(), &server, &[NODE]).await;
        let others = Kubelets::with_defaults(&server, &["node-b", "node-c"]).await;
        let controller = ControllerProcess::start_logging(
            dir,
            &server,
            &controller_config(
                dir,
                &format!(
                    "reports: {{address: \"{CONTROLLER_SERVICE}:0\", nodeTokensSecret: node-tokens, {}}}\n",
                    served.reports_setting()
                ),
            ),
            DEBUG_LOG,
        );
        controller.synced().await;
        Cluster {
            server,
            fabric,
            kubelet,
            _others: others,
            controller,
        }
    }

    /// Nothing was done to the machine (see [`assert_untouched`]).
    fn assert_untouched(&self, bmc: &IpmiSim) {
        assert_untouched(bmc, &self.fabric);
    }
}

/// Nothing was done to a machine: its BMC saw no power command and the storage fabric
/// port is as it was.
fn assert_untouched(bmc: &IpmiSim, fabric: &std::path::Path) {
    assert!(bmc.power_is_on(), "the BMC was never told to power off");
    assert!(
        !bmc.chassis_log().contains("set power"),
        "{}",
        bmc.chassis_log()
    );
    assert_eq!(
        std::fs::read_to_string(fabric).expect("fabric port").trim(),
        "on",
        "the storage fabric was never touched"
    );
}

/// What each node scenario starts from: the fence agents, a BMC, a CA and the
/// controller's certificate, and the cluster with its controller running. Fields drop in
/// this order: the controller first, the temporary directory last.
struct Scene {
    cluster: Cluster,
    bmc: IpmiSim,
    ca: support::tls::Pair,
    _dir: tempfile::TempDir,
}

impl Scene {
    /// The scene for node-a in the namespace `node`, its fence configured by `seed`;
    /// `None` when a real part is missing (see `require!`: under CI that fails the test).
    async fn set_up(node: &Netns, seed: FenceConfig) -> Option<Scene> {
        require!("fence-agents", fence_agents(), else None);
        let dir = tempfile::tempdir().expect("temp dir");
        let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()), else None);
        let (ca, served) = require!("openssl", certificates(dir.path()), else None);
        let cluster = Cluster::start(dir.path(), &bmc, &served, node, seed).await;
        Some(Scene {
            cluster,
            bmc,
            ca,
            _dir: dir,
        })
    }

    /// Boots node-a: a container in the namespace `node` (with a unified cgroup tree when
    /// `unified`) with the systemd `units`, the agent configured by `agent_yaml` with a
    /// kubeconfig for this cluster, until its agent logs `ready_line`. `None` when this
    /// machine cannot (see `require!`).
    async fn boot(
        &self,
        node: &Netns,
        agent_yaml: String,
        units: Vec<(&'static str, String)>,
        unified: bool,
        ready_line: &'static str,
    ) -> Option<Booted> {
        let kubeconfig = self
            .cluster
            .server
            .kubeconfig_yaml_naming_ca(Some(&self.ca.cert));
        let files = node_files(agent_yaml, kubeconfig, &self.ca);
        let options = BootOptions {
            unified,
            netns: Some(node.path()),
            ..BootOptions::default()
        };
        let booted = tokio::task::spawn_blocking(move || {
            support::nspawn::boot_with(&units, &files, ready_line, options)
        })
        .await
        .expect("boot");
        Some(require!(NSPAWN, booted, else None))
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

/// A CA and the controller's certificate for its service address, signed by it.
fn certificates(dir: &std::path::Path) -> Result<(support::tls::Pair, support::tls::Pair), String> {
    let ca = support::tls::certificate_authority(dir, "ca")?;
    let served =
        support::tls::server_certificate_for(dir, "controller", &ca, &[CONTROLLER_SERVICE])?;
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

#[test]
fn a_node_that_shuts_down_gracefully_is_released_without_a_power_action() {
    let network = require!(NETNS, Network::one_link());
    run(graceful_shutdown(network));
}

async fn graceful_shutdown(network: Network) {
    let Some(scene) = Scene::set_up(&network.node, seed_fence_config).await else {
        return;
    };
    let (cluster, bmc) = (&scene.cluster, &scene.bmc);
    let (server, kubelet, controller) = (&cluster.server, &cluster.kubelet, &cluster.controller);
    let deletions = tokio::spawn(finish_deletions(server.clone(), |_| true));
    let reports = controller.reports_address();
    let Some(booted) = scene
        .boot(
            &network.node,
            agent_config(&reports),
            vec![("nodekeeper-agent.service", agent_unit(""))],
            false,
            "logind delay lock held",
        )
        .await
    else {
        return;
    };
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
    kubelet.stop(NODE);
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
    cluster.assert_untouched(bmc);
    deletions.abort();
}

/// The times in the BMC's chassis log (`<unix time> <what>`) of its lines containing
/// `what`.
fn chassis_times(bmc: &IpmiSim, what: &str) -> Vec<Timestamp> {
    bmc.chassis_log()
        .lines()
        .filter(|line| line.contains(what))
        .filter_map(|line| {
            let seconds: f64 = line.split_whitespace().next()?.parse().ok()?;
            Timestamp::from_nanosecond((seconds * 1e9) as i128).ok()
        })
        .collect()
}

#[test]
fn a_dead_node_is_powered_off_through_its_bmc_and_released_once_the_bmc_confirms_it() {
    let network = require!(NETNS, Network::one_link());
    run(dead_node(network));
}

async fn dead_node(network: Network) {
    // Power management is the node's only fencing step: its pods may go only once the
    // BMC says the machine is off.
    let Some(scene) = Scene::set_up(&network.node, seed_power_fence_config).await else {
        return;
    };
    let (cluster, bmc) = (&scene.cluster, &scene.bmc);
    let (server, controller) = (&cluster.server, &cluster.controller);
    let reports = controller.reports_address();
    let Some(booted) = scene
        .boot(
            &network.node,
            partition_agent_config(&reports),
            vec![("nodekeeper-agent.service", agent_unit(""))],
            false,
            "reporting to the fence controller",
        )
        .await
    else {
        return;
    };
    wait_for(controller, "the agent's first report", || {
        controller.agent_view(NODE)
    })
    .await;
    tokio::time::sleep(SILENCE / 2).await;
    assert!(
        fence_of(server, NODE).is_none(),
        "a heard node is not fenced"
    );

    // The machine dies: everything on it stops at once, and nothing it sent is answered
    // any more (its kubelet's renewals go over the same link).
    let died_at = Timestamp::now();
    let (gone, booted) = tokio::task::spawn_blocking(move || {
        let mut booted = booted;
        let gone = booted.container.kill();
        (gone, booted)
    })
    .await
    .expect("the container");
    assert!(gone, "the container did not die");
    network.api.cut();

    let fenced_at = wait_for(controller, "the node's NodeFence", || {
        fence_of(server, NODE).map(|_| Timestamp::now())
    })
    .await;
    let released_at = wait_for(controller, "the out-of-service taint", || {
        taint_keys(server, NODE)
            .iter()
            .any(|key| key == OUT_OF_SERVICE)
            .then(Timestamp::now)
    })
    .await;
    wait_for(controller, "the database pod deleted", || {
        server.object::<Pod>("shop", "db-0").is_none().then_some(())
    })
    .await;
    let seconds = |from: Timestamp, to: Timestamp| {
        Duration::try_from(to.duration_since(from))
            .unwrap_or_default()
            .as_secs_f64()
    };
    let powered_off = chassis_times(bmc, "set power 0");
    assert_eq!(powered_off.len(), 1, "one power-off: {}", bmc.chassis_log());
    let powered_off_at = powered_off[0];
    let confirmed_at = chassis_times(bmc, "get power")
        .into_iter()
        .find(|at| *at > powered_off_at)
        .expect("the power state read back after the power-off");
    println!(
        "scenario (b) dead node: fence started {:.1}s after the node died, powered off by fence_ipmilan {:.1}s after, pod released {:.1}s after (reports every {}s, Lease renewed every {}s, silenceTimeout {}s)",
        seconds(died_at, fenced_at),
        seconds(died_at, powered_off_at),
        seconds(died_at, released_at),
        REPORT_INTERVAL.as_secs(),
        RENEWAL.as_secs(),
        SILENCE.as_secs()
    );

    // Fenced for the silence of both channels, not before it: the agent was heard at most
    // one report interval before the node died.
    let fence = fence_of(server, NODE).expect("the NodeFence");
    assert_eq!(fence["status"]["lost"]["evidence"], "Silence", "{fence}");
    assert!(
        seconds(died_at, fenced_at) + REPORT_INTERVAL.as_secs_f64() >= SILENCE.as_secs_f64(),
        "fenced {:.1}s after the node died, before silenceTimeout",
        seconds(died_at, fenced_at)
    );
    // Released only on the BMC's word that the machine is off, and within the goal.
    assert!(
        released_at > confirmed_at,
        "released at {released_at}, before the BMC confirmed the power-off at {confirmed_at}"
    );
    assert!(!bmc.power_is_on(), "the machine is off");
    assert!(
        seconds(died_at, released_at) < 30.0,
        "released {:.1}s after the node died; controller log:\n{}",
        seconds(died_at, released_at),
        controller.log()
    );
    let executions = executions(&fence);
    assert_eq!(executions.len(), 1, "{fence}");
    assert!(
        fence["status"]["confirmedBy"]
            .as_str()
            .is_some_and(|proof| proof.contains("ipmi")),
        "{fence}"
    );
    assert_eq!(
        std::fs::read_to_string(&cluster.fabric)
            .expect("fabric port")
            .trim(),
        "on",
        "power management was the only step"
    );
    drop(booted);
}

/// The agent for scenarios (b) and (c): Kubernetes mode with the systemd cgroup driver,
/// reports over https, memory thresholds only; isolation with its defaults.
fn partition_agent_config(reports: &str) -> String {
    format!(
        "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\nnodeName: {NODE}\n\
         kubernetes: {{cgroupDriver: systemd}}\n{MEMORY_ONLY}\
         report: {{controllerURL: \"https://{reports}\", tokenFile: /shared/token, caFile: /shared/ca.crt}}\n"
    )
}

/// What the node lifecycle controller writes: the node's Ready condition, by a status
/// patch (the controller's taints stay).
async fn set_ready(server: &FakeApiServer, node: &str, status: &str, since: Timestamp) {
    let conditions = serde_json::json!({"conditions": [{
        "type": "Ready", "status": status, "reason": "test",
        "lastTransitionTime": since.to_string(), "lastHeartbeatTime": since.to_string(),
    }]});
    support::controller::patch_node_status(server, node, conditions).await;
}

/// The node lifecycle controller's grace before it marks a silent node Unknown
/// (`node-monitor-grace-period`, 40 s before Kubernetes 1.32).
const NODE_MONITOR_GRACE: Duration = Duration::from_secs(40);

#[test]
fn a_node_cut_off_from_the_api_server_is_isolated_by_its_agent_and_released_without_a_power_action()
{
    let network = require!(NETNS, Network::two_links());
    run(partition(network));
}

async fn partition(network: Network) {
    let Some(scene) = Scene::set_up(&network.node, seed_fence_config).await else {
        return;
    };
    let (cluster, bmc) = (&scene.cluster, &scene.bmc);
    let (server, kubelet, controller) = (&cluster.server, &cluster.kubelet, &cluster.controller);
    let reports = controller.reports_address();
    let units = vec![
        ("kubelet.service", STAND_IN_KUBELET.to_string()),
        // The database pod's containers, where the systemd driver puts a Burstable pod.
        (
            "pod-db.service",
            pod_unit("kubepods-burstable-pod6b1e2f0a.slice"),
        ),
        ("nodekeeper-agent.service", agent_unit("pod-db.service")),
    ];
    let Some(booted) = scene
        .boot(
            &network.node,
            partition_agent_config(&reports),
            units,
            true,
            "reporting to the fence controller",
        )
        .await
    else {
        return;
    };
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
        booted
            .container
            .stdout("systemctl is-active kubelet.service"),
        "active"
    );

    // The partition: the link that carries the node's API traffic fails, so its kubelet
    // renews no more; the agent still reaches the controller over the other link.
    network.api.cut();
    let cut_at = Timestamp::now();
    let renewed = last_renewal(server, NODE).await;
    // The node lifecycle controller marks it Unknown after its grace.
    let grace_ends = renewed + NODE_MONITOR_GRACE;
    if let Ok(wait) = Duration::try_from(grace_ends.duration_since(Timestamp::now())) {
        tokio::time::sleep(wait).await;
    }
    set_ready(server, NODE, "Unknown", Timestamp::now()).await;
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
        booted
            .container
            .stdout("systemctl is-active kubelet.service"),
        "inactive"
    );
    assert_eq!(
        booted.container.stdout(
            "find /sys/fs/cgroup/kubepods.slice -name cgroup.procs -exec cat {} + | grep -c ."
        ),
        "0",
        "no pod process is left"
    );
    cluster.assert_untouched(bmc);

    // The pod is gone (the rig's controller deletes it, as the pod garbage collector
    // would on the out-of-service node), and the partition heals: the agent reaches the
    // API server again and is told to end the isolation; the kubelet starts.
    wait_for(controller, "the database pod gone from the node", || {
        server.object::<Pod>("shop", "db-0").is_none().then_some(())
    })
    .await;
    // The kubelet is stopped, so nothing renews the Lease once the link is back until
    // it runs again.
    kubelet.stop(NODE);
    // While the partition lasts, the isolation holds: the agent knows it cannot reach
    // the API server.
    tokio::time::sleep(3 * REPORT_INTERVAL).await;
    let agent_log = std::fs::read_to_string(booted.shared.join("agent.log")).unwrap_or_default();
    for line in agent_log
        .lines()
        .filter(|line| line.contains("isolat") || line.contains("API") || line.contains("evict"))
    {
        println!("agent: {line}");
    }
    let view = controller
        .agent_view(NODE)
        .expect("the node's latest report");
    assert_eq!(
        view["report"]["apiServer"]["state"], "unreachable",
        "{view}"
    );
    assert_eq!(
        booted
            .container
            .stdout("systemctl is-active kubelet.service"),
        "inactive",
        "the isolation ended while the node was still cut off; agent log:\n{}",
        std::fs::read_to_string(booted.shared.join("agent.log")).unwrap_or_default()
    );
    network.api.mend();
    wait_for(controller, "the kubelet running again", || {
        (booted
            .container
            .stdout("systemctl is-active kubelet.service")
            == "active")
            .then_some(())
    })
    .await;
    kubelet.resume(NODE).await;
    set_ready(server, NODE, "True", Timestamp::now()).await;
    wait_for(controller, "the fence to end and its taints to go", || {
        (fence_of(server, NODE).is_none()
            && !taint_keys(server, NODE)
                .iter()
                .any(|key| key == OUT_OF_SERVICE))
        .then_some(())
    })
    .await;
    cluster.assert_untouched(bmc);
}

/// Scenario (d)'s cluster: two racks of three nodes, each rack behind its own switch (its
/// link to the hub).
struct Racks {
    _hub: Netns,
    racks: [(Netns, Link); 2],
}

impl Racks {
    const NODES: [[&str; 3]; 2] = [["a-1", "a-2", "a-3"], ["b-1", "b-2", "b-3"]];

    fn create() -> Result<Racks, String> {
        let hub = hub()?;
        let racks = [
            linked(&hub, "rack-a", 1, &SERVICES)?,
            linked(&hub, "rack-b", 2, &SERVICES)?,
        ];
        Ok(Racks { _hub: hub, racks })
    }
}

/// The agent of `node` in `rack`, in Kubernetes mode through the rack's link: dry-run
/// (it is a process of the test machine, not a node's), reporting at the default
/// interval over https with the node's token.
fn rack_agent(
    dir: &std::path::Path,
    rack: &Netns,
    node: &str,
    reports: &str,
    extra: &str,
) -> AgentProcess {
    let kubeconfig = dir.join("rack-kubeconfig");
    let config = AgentProcess::write_reporting_config(
        dir,
        node,
        &format!("https://{reports}"),
        Some(&dir.join("ca.crt")),
        &token_of(node),
        extra,
        None,
    );
    AgentProcess::dry_run_from(
        rack.command(BINARY),
        &config,
        &["--kubeconfig".as_ref(), kubeconfig.as_os_str()],
    )
}

/// The controller, synced, for agents run as processes in namespaces (the racks of (d),
/// the nodes of (e)): reports over TLS with the nodes' tokens, and `extra` settings; and
/// the agents' kubeconfig (`rack-kubeconfig`). Returns it and its report address.
async fn start_for_agent_processes(
    dir: &std::path::Path,
    server: &FakeApiServer,
    served: &support::tls::Pair,
    extra: &str,
) -> (ControllerProcess, String) {
    let controller = ControllerProcess::start_logging(
        dir,
        server,
        &controller_config(
            dir,
            &format!(
                "reports: {{address: \"{CONTROLLER_SERVICE}:0\", nodeTokensSecret: node-tokens, {}}}\n{extra}",
                served.reports_setting()
            ),
        ),
        DEBUG_LOG,
    );
    controller.synced().await;
    let reports = controller.reports_address();
    server
        .write_kubeconfig(&dir.join("rack-kubeconfig"))
        .expect("the agents' kubeconfig");
    (controller, reports)
}

#[test]
fn half_the_cluster_behind_a_failed_switch_is_a_storm_and_nothing_is_fenced() {
    let racks = require!(NETNS, Racks::create());
    run(storm(racks));
}

async fn storm(racks: Racks) {
    require!("fence-agents", fence_agents());
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let (_, served) = require!("openssl", certificates(dir.path()));
    let nodes: Vec<&str> = Racks::NODES.iter().flatten().copied().collect();

    // Every node runs a database and has a fence configuration: without the storm
    // guard, each silent node would be fenced.
    let server = Arc::new(ready_cluster_on(API_SERVICE, &nodes).await);
    let fabric = enabled_fabric(dir.path());
    for node in &nodes {
        seed_database(&server, node, &format!("db-{node}"));
        seed_fence_config(&server, node, bmc.port(), &fabric);
    }
    let tokens: Vec<(&str, String)> = nodes.iter().map(|node| (*node, token_of(node))).collect();
    seed_node_tokens(&server, &tokens);
    let mut kubelets = Vec::new();
    for ((rack, _), names) in racks.racks.iter().zip(Racks::NODES) {
        kubelets.push(Kubelets::with_defaults_in(rack, &server.url(), &server, &names).await);
    }
    let (controller, reports) = start_for_agent_processes(dir.path(), &server, &served, "").await;
    // a-1's agent has a hard threshold that is always met and looks every second, so
    // its node is always under memory pressure and its database always the pod it would
    // evict: its own decisions show whether it keeps protecting the node.
    let always_met = "evictionHard: {memory.available: 1000Ti}\nhousekeepingInterval: 1s\n";
    let agents: Vec<AgentProcess> = racks
        .racks
        .iter()
        .zip(Racks::NODES)
        .flat_map(|((rack, _), names)| {
            names.map(|node| {
                let extra = if node == "a-1" {
                    always_met
                } else {
                    MEMORY_ONLY
                };
                rack_agent(dir.path(), rack, node, &reports, extra)
            })
        })
        .collect();
    for node in &nodes {
        wait_for(&controller, "every node's agent heard", || {
            controller.agent_view(node).map(drop)
        })
        .await;
    }

    // Rack a's switch fails: half the cluster falls silent at once.
    let (rack_a_netns, rack_a) = &racks.racks[0];
    let scrape_a_1 = || {
        let address = agents[0].address.clone();
        let metrics =
            rack_a_netns.run(move || support::agent_process::http_get(&address, "/metrics").1);
        let decided = metric_value(
            &metrics,
            "nodekeeper_evictions_total{signal=\"memory.available\"}",
        )
        .unwrap_or(0.0);
        let pressure = metric_value(
            &metrics,
            "nodekeeper_node_condition{condition=\"MemoryPressure\"}",
        );
        (decided, pressure)
    };
    rack_a.cut();
    let cut_at = Timestamp::now();
    let metrics = wait_for(&controller, "the storm guard to see the storm", || {
        let metrics = controller.metrics();
        (metric_value(&metrics, "nodekeeper_storm_guard_state{state=\"storm\"}") == Some(1.0))
            .then_some(metrics)
    })
    .await;
    let storm_at = Timestamp::now();
    assert_eq!(
        metric_value(&metrics, "nodekeeper_controller_silent_nodes"),
        Some(3.0),
        "{metrics}"
    );
    // Behind the failed switch, cut off from the API server, the agents go on protecting
    // their nodes from the pods they last saw: a-1's keeps its node under memory pressure
    // and goes on choosing its database to evict (dry-run: counted, not done).
    let (decided_before, pressure) = scrape_a_1();
    assert_eq!(pressure, Some(1.0), "a-1 is under memory pressure");
    assert!(decided_before >= 1.0, "a-1's agent chose a pod to evict");
    tokio::time::sleep(3 * REPORT_INTERVAL).await;
    let (decided_after, pressure) = scrape_a_1();
    assert_eq!(pressure, Some(1.0), "a-1 is still under memory pressure");
    assert!(
        decided_after > decided_before,
        "a-1's agent stopped deciding when its switch failed ({decided_before} then {decided_after} evictions)"
    );
    // The node lifecycle controller marks them Unknown after its grace; a node without
    // an agent would be fenced unhealthyDuration (2 s here) later.
    let mut last_renewed = Timestamp::now();
    for node in Racks::NODES[0] {
        last_renewed = last_renewed.min(last_renewal(&server, node).await);
    }
    if let Ok(wait) =
        Duration::try_from((last_renewed + NODE_MONITOR_GRACE).duration_since(Timestamp::now()))
    {
        tokio::time::sleep(wait).await;
    }
    for node in Racks::NODES[0] {
        set_ready(&server, node, "Unknown", Timestamp::now()).await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let held_for = Duration::try_from(Timestamp::now().duration_since(cut_at)).unwrap_or_default();
    for node in Racks::NODES[0] {
        let fence = fence_of(&server, node).expect("a silent node's fence");
        assert_eq!(fence["status"]["pause"]["reason"], "StormGuard", "{fence}");
        assert!(executions(&fence).is_empty(), "{fence}");
    }
    for node in Racks::NODES[1] {
        assert!(
            fence_of(&server, node).is_none(),
            "{node} is heard and never fenced"
        );
    }
    assert_untouched(&bmc, &fabric);
    for node in &nodes {
        assert!(
            server
                .object::<Pod>("shop", &format!("db-{node}"))
                .is_some(),
            "no pod is released in a storm"
        );
    }

    // The switch comes back: the nodes are heard and Ready again, and their fences end.
    rack_a.mend();
    let mended_at = Timestamp::now();
    for node in Racks::NODES[0] {
        wait_for(&controller, "the rack's agents heard again", || {
            controller
                .agent_view(node)
                .filter(|view| received_at(view) > mended_at)
                .map(drop)
        })
        .await;
        set_ready(&server, node, "True", Timestamp::now()).await;
    }
    wait_for(&controller, "every fence to end", || {
        Racks::NODES[0]
            .iter()
            .all(|node| fence_of(&server, node).is_none())
            .then_some(())
    })
    .await;
    let healed_at = Timestamp::now();
    let seconds = |from: Timestamp, to: Timestamp| {
        Duration::try_from(to.duration_since(from))
            .unwrap_or_default()
            .as_secs_f64()
    };
    println!(
        "scenario (d) storm: 3 of 6 nodes silent at once; storm guard engaged {:.1}s after the cut, held every fence for {:.0}s (nodes NotReady for the last 10s), nothing powered off or isolated; fences ended {:.1}s after the switch came back (reports every {}s, Lease renewed every {}s, silenceTimeout {}s)",
        seconds(cut_at, storm_at),
        held_for.as_secs_f64(),
        seconds(mended_at, healed_at),
        REPORT_INTERVAL.as_secs(),
        RENEWAL.as_secs(),
        SILENCE.as_secs()
    );
    assert!(
        seconds(cut_at, storm_at) <= (SILENCE + 2 * REPORT_INTERVAL).as_secs_f64(),
        "the storm was seen {:.1}s after the cut",
        seconds(cut_at, storm_at)
    );
    assert_untouched(&bmc, &fabric);
}

/// Debian's kdump notifier (package fence-agents), which a crash kernel's initramfs runs.
const KDUMP_SEND: &str = "/usr/libexec/fence-agents/fence_kdump_send";

fn kdump_sender() -> Result<(), String> {
    if std::path::Path::new(KDUMP_SEND).is_file() {
        Ok(())
    } else {
        Err(format!(
            "{KDUMP_SEND} is not installed (apt-get install -y fence-agents)"
        ))
    }
}

/// The controller's kdump address in the hub, `fence_kdump_send`'s default port.
const KDUMP_PORT: u16 = 7410;
/// How long the power step waits for a dump at most, and after the last notification,
/// in scenario (e); the sender repeats every second.
const KDUMP_WAIT: Duration = Duration::from_secs(20);
const KDUMP_SILENCE: Duration = Duration::from_secs(5);

/// `fence_kdump_send` running in a namespace, as from a crash kernel; stopped on drop.
struct KdumpSender(std::process::Child);

impl KdumpSender {
    fn start(netns: &Netns) -> KdumpSender {
        let child = netns
            .command(KDUMP_SEND)
            .args(["-p", &KDUMP_PORT.to_string(), "-i", "1", "-c", "0"])
            .arg(CONTROLLER_SERVICE)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start fence_kdump_send");
        KdumpSender(child)
    }
}

impl Drop for KdumpSender {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A node whose Node object lists `address` as its InternalIP, with the database's volume
/// attached.
fn node_at(name: &str, address: &str) -> Node {
    let mut node = node_with_volume(name);
    node.status.as_mut().expect("status").addresses = Some(vec![
        k8s_openapi::api::core::v1::NodeAddress {
            type_: "InternalIP".to_string(),
            address: address.to_string(),
        },
        k8s_openapi::api::core::v1::NodeAddress {
            type_: "Hostname".to_string(),
            address: name.to_string(),
        },
    ]);
    node
}

/// Two crashed nodes, each configured with `kdump=true` and its own BMC: node-a's crash
/// kernel announces itself from node-a's address, while for node-b only another machine
/// sends the same datagram.
struct KdumpNetwork {
    _hub: Netns,
    node_a: Netns,
    node_b: Netns,
    impostor: Netns,
    _links: Vec<Link>,
}

impl KdumpNetwork {
    fn create() -> Result<KdumpNetwork, String> {
        let hub = hub()?;
        let (node_a, link_a) = linked(&hub, "node-a", 1, &SERVICES)?;
        let (node_b, link_b) = linked(&hub, "node-b", 2, &SERVICES)?;
        let (impostor, link_impostor) = linked(&hub, "impostor", 3, &[CONTROLLER_SERVICE])?;
        let links = vec![link_a, link_b, link_impostor];
        Ok(KdumpNetwork {
            _hub: hub,
            node_a,
            node_b,
            impostor,
            _links: links,
        })
    }
}

#[test]
fn a_crashed_nodes_kdump_releases_its_pods_with_no_power_action_and_its_power_off_waits_for_the_dump()
 {
    let network = require!(NETNS, KdumpNetwork::create());
    run(kdump(network));
}

async fn kdump(network: KdumpNetwork) {
    require!("fence-agents", fence_agents());
    require!("fence_kdump_send", kdump_sender());
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc_a = require!("ipmi_sim", IpmiSim::start(&dir.path().join("a")));
    let bmc_b = require!("ipmi_sim", IpmiSim::start(&dir.path().join("b")));
    let (_, served) = require!("openssl", certificates(dir.path()));
    let others = ["node-c", "node-d", "node-e", "node-f"];
    let server = Arc::new(ready_cluster_on(API_SERVICE, &others).await);
    let fabric = enabled_fabric(dir.path());
    // Each node's InternalIP is its end of its link.
    for (node, address, bmc, database) in [
        ("node-a", "10.231.1.2", &bmc_a, "db-a"),
        ("node-b", "10.231.2.2", &bmc_b, "db-b"),
    ] {
        server.seed(&node_at(node, address));
        seed_database(&server, node, database);
        seed_kdump_fence_config(&server, node, bmc.port(), &fabric);
    }
    seed_node_tokens(
        &server,
        &[
            ("node-a", token_of("node-a")),
            ("node-b", token_of("node-b")),
        ],
    );
    let kubelet_a =
        Kubelets::with_defaults_in(&network.node_a, &server.url(), &server, &["node-a"]).await;
    let kubelet_b =
        Kubelets::with_defaults_in(&network.node_b, &server.url(), &server, &["node-b"]).await;
    let _others = Kubelets::with_defaults(&server, &others).await;
    let kdump_settings = format!(
        "kdumpAddress: \"{CONTROLLER_SERVICE}:{KDUMP_PORT}\"\nkdumpWait: {}s\nkdumpSilence: {}s\n\
         stormGuard: {{zoneFenceRate: 1}}\n",
        KDUMP_WAIT.as_secs(),
        KDUMP_SILENCE.as_secs()
    );
    let (controller, reports) =
        start_for_agent_processes(dir.path(), &server, &served, &kdump_settings).await;
    let mut agent_a = rack_agent(dir.path(), &network.node_a, "node-a", &reports, MEMORY_ONLY);
    let mut agent_b = rack_agent(dir.path(), &network.node_b, "node-b", &reports, MEMORY_ONLY);
    for node in ["node-a", "node-b"] {
        wait_for(&controller, "both agents heard", || {
            controller.agent_view(node).map(drop)
        })
        .await;
    }
    // A notification while the nodes live changes nothing either: node-b's address is
    // not the impostor's.
    let _impostor = KdumpSender::start(&network.impostor);

    // Both kernels crash: the kubelets and the agents stop at once; a few seconds later
    // node-a's crash kernel starts announcing itself, as its initramfs would.
    let crashed_at = Timestamp::now();
    for (agent, kubelet, node) in [
        (&mut agent_a, &kubelet_a, "node-a"),
        (&mut agent_b, &kubelet_b, "node-b"),
    ] {
        agent.child.kill().expect("kill the agent");
        let _ = agent.child.wait();
        kubelet.stop(node);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let sender = KdumpSender::start(&network.node_a);
    let sending_since = Timestamp::now();

    // node-a: released on its crash kernel's word, with no power action.
    let released_at = wait_for(&controller, "node-a's out-of-service taint", || {
        taint_keys(&server, "node-a")
            .iter()
            .any(|key| key == OUT_OF_SERVICE)
            .then(Timestamp::now)
    })
    .await;
    wait_for(&controller, "node-a's database pod deleted", || {
        server.object::<Pod>("shop", "db-a").is_none().then_some(())
    })
    .await;
    let fence = fence_of(&server, "node-a").expect("node-a's NodeFence");
    assert_eq!(fence["status"]["kdump"]["from"], "10.231.1.2", "{fence}");
    assert!(
        fence["status"]["confirmedBy"]
            .as_str()
            .is_some_and(|proof| proof.starts_with("kdump:")),
        "{fence}"
    );
    assert_eq!(fence["status"]["lost"]["evidence"], "Silence", "{fence}");
    assert!(executions(&fence).is_empty(), "{fence}");
    assert_untouched(&bmc_a, &fabric);
    assert!(reasons(&server, "node-a", "NodeFence").contains(&"FenceConfirmed".to_string()));
    assert_eq!(
        metric_value(
            &controller.metrics(),
            "nodekeeper_fences_confirmed_total{step=\"Kdump\"}"
        ),
        Some(1.0)
    );

    // node-b: the impostor's datagrams count for nothing; it is powered off through its
    // BMC once silent, as any dead node, and released on the BMC's confirmation.
    wait_for(&controller, "node-b's database pod deleted", || {
        server.object::<Pod>("shop", "db-b").is_none().then_some(())
    })
    .await;
    let fence_b = fence_of(&server, "node-b").expect("node-b's NodeFence");
    assert!(fence_b["status"]["kdump"].is_null(), "{fence_b}");
    assert!(
        fence_b["status"]["confirmedBy"]
            .as_str()
            .is_some_and(|proof| proof.contains("ipmi")),
        "{fence_b}"
    );
    assert!(!bmc_b.power_is_on(), "node-b is off");
    let metrics = controller.metrics();
    assert!(
        metric_value(
            &metrics,
            "nodekeeper_controller_kdump_datagrams_total{outcome=\"notification\"}"
        )
        .is_some_and(|count| count >= 10.0),
        "{metrics}"
    );

    // node-a's dump goes on: its power step waits kdumpWait from the first notification,
    // then powers it off through its BMC.
    let powered_off_at = wait_for(&controller, "node-a powered off after kdumpWait", || {
        chassis_times(&bmc_a, "set power 0").first().copied()
    })
    .await;
    let fence = fence_of(&server, "node-a").expect("node-a's NodeFence");
    let first_heard: Timestamp = fence["status"]["kdump"]["firstHeard"]
        .as_str()
        .and_then(|at| at.parse().ok())
        .expect("firstHeard");
    let seconds = |from: Timestamp, to: Timestamp| {
        Duration::try_from(to.duration_since(from))
            .unwrap_or_default()
            .as_secs_f64()
    };
    println!(
        "scenario (e) kdump: pod released {:.1}s after the crash ({:.1}s after the crash kernel's first notification) with no power action; powered off {:.1}s after the first notification (kdumpWait {}s, notifications every 1s); the same datagram from another address released nothing (silenceTimeout {}s)",
        seconds(crashed_at, released_at),
        seconds(sending_since, released_at),
        seconds(first_heard, powered_off_at),
        KDUMP_WAIT.as_secs(),
        SILENCE.as_secs()
    );
    assert!(
        seconds(first_heard, powered_off_at) >= KDUMP_WAIT.as_secs_f64() - 1.0,
        "powered off {:.1}s after the first notification, before kdumpWait; log:\n{}",
        seconds(first_heard, powered_off_at),
        controller.log()
    );
    assert!(
        seconds(crashed_at, released_at) < (SILENCE + Duration::from_secs(5)).as_secs_f64(),
        "released {:.1}s after the crash",
        seconds(crashed_at, released_at)
    );
    assert_eq!(
        chassis_times(&bmc_a, "set power 0").len(),
        1,
        "{}",
        bmc_a.chassis_log()
    );
    drop(sender);
}
