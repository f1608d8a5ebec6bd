//! The fence controller's end-to-end rig, shared by the controller's test binaries: a
//! test API server serving NodeFences with Ready nodes, StatefulSet pods with their
//! claims, the original design's fence ConfigMaps (isolation by a `fence_dummy` "fabric
//! port", power by `fence_ipmilan` against `ipmi_sim`), the controller's configuration,
//! and the controller binary as a process of its own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::apiserver::{CustomResource, FakeApiServer, RequestLog};
use super::fence_emulators::{IpmiSim, LOOPBACK};

/// The agents the rig fences with: `fence_ipmilan` for the BMC, `fence_dummy` for the
/// storage fabric.
pub fn fence_agents() -> Result<(), String> {
    super::real::program("fence_ipmilan", "fence-agents")?;
    super::real::program("fence_dummy", "fence-agents")
}

pub const NAMESPACE: &str = "fencing";

pub fn crd() -> CustomResource {
    CustomResource {
        group: "fencing.nodekeeper.io".into(),
        version: "v1alpha1".into(),
        kind: "NodeFence".into(),
        plural: "nodefences".into(),
        namespaced: false,
        has_status: true,
    }
}

/// A test API server serving NodeFences, with `names` as Ready nodes.
pub async fn ready_cluster(names: &[&str]) -> FakeApiServer {
    ready_cluster_on(std::net::Ipv4Addr::LOCALHOST, names).await
}

/// [`ready_cluster`] with the API server on `address`.
pub async fn ready_cluster_on(address: std::net::Ipv4Addr, names: &[&str]) -> FakeApiServer {
    let server = FakeApiServer::start_on(address).await;
    server.register(crd());
    let since = Timestamp::now();
    for name in names {
        server.seed(&node(name, "True", since));
    }
    server
}

/// The storage fabric port `fence_dummy` switches, enabled.
pub fn enabled_fabric(dir: &Path) -> PathBuf {
    let fabric = dir.join("fabric.port");
    std::fs::write(&fabric, "on").expect("fabric port");
    fabric
}

/// What the storage fabric port says: "on" or "off".
pub fn fabric_state(fabric: &Path) -> String {
    std::fs::read_to_string(fabric)
        .expect("fabric")
        .trim()
        .to_string()
}

pub fn node(name: &str, ready: &str, since: Timestamp) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {"conditions": [{
            "type": "Ready", "status": ready, "reason": "test",
            "lastTransitionTime": since.to_string(),
            "lastHeartbeatTime": since.to_string(),
        }]}
    }))
    .expect("node")
}

/// [`node`], its kubelet reporting boot `boot` (`status.nodeInfo.bootID`), as a real
/// kubelet does with every status update.
pub fn node_on_boot(name: &str, ready: &str, since: Timestamp, boot: &str) -> Node {
    let mut node = serde_json::to_value(node(name, ready, since)).expect("node");
    node["status"]["nodeInfo"] = json!({
        "architecture": "amd64", "bootID": boot, "containerRuntimeVersion": "containerd://1.7",
        "kernelVersion": "6.1.0", "kubeProxyVersion": "", "kubeletVersion": "v1.31.0",
        "machineID": name, "operatingSystem": "linux", "osImage": "Debian GNU/Linux 12",
        "systemUUID": name,
    });
    serde_json::from_value(node).expect("node")
}

/// Creates ServiceAccount `namespace/name` through the API.
pub async fn create_service_account(server: &FakeApiServer, namespace: &str, name: &str) {
    let accounts: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
        kube::Api::namespaced(server.client(), namespace);
    let account = serde_json::from_value(json!({"metadata": {"name": name}})).expect("account");
    accounts
        .create(&kube::api::PostParams::default(), &account)
        .await
        .expect("create the ServiceAccount");
}

/// Creates pod `namespace/name` on `node`, running as ServiceAccount `account`, through
/// the API (so the server assigns its uid, which tokens bound to it carry).
pub async fn create_pod(
    server: &FakeApiServer,
    namespace: &str,
    name: &str,
    account: &str,
    node: &str,
) {
    let pods: kube::Api<Pod> = kube::Api::namespaced(server.client(), namespace);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "serviceAccountName": account,
                 "containers": [{"name": "c", "image": "nodekeeper"}]}
    }))
    .expect("pod");
    pods.create(&kube::api::PostParams::default(), &pod)
        .await
        .expect("create the pod");
}

/// A StatefulSet pod with a ReadWriteOnce volume on `node`, and its claim.
pub fn seed_database(server: &FakeApiServer, node: &str, name: &str) {
    let claim = format!("data-{name}");
    let pvc: k8s_openapi::api::core::v1::PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": claim, "namespace": "shop"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"]}
    }))
    .expect("pvc");
    server.seed(&pvc);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop", "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
            "uid": "6b1e2f0a-0000-4000-8000-000000000001", "controller": true
        }]},
        "spec": {"nodeName": node, "containers": [{"name": "db", "image": "postgres"}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]},
        "status": {"phase": "Running"}
    }))
    .expect("pod");
    server.seed(&pod);
}

pub fn config_map(
    name: &str,
    key: &str,
    properties: &str,
) -> k8s_openapi::api::core::v1::ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": {key: properties}
    }))
    .expect("config map")
}

/// The original design's ConfigMaps for `node`: isolation by a storage fabric port
/// (fence_dummy keeping its state in `fabric`), power management by IPMI, and recovery
/// switching both back on. The BMC password comes from a labelled Secret.
pub fn seed_fence_config(server: &FakeApiServer, node: &str, bmc_port: u16, fabric: &Path) {
    seed_fence_steps(
        server,
        node,
        bmc_port,
        fabric,
        "isolation=fabric-off\npower_management=ipmi-off\nrecovery=fabric-on ipmi-on",
    );
}

/// [`seed_fence_config`] with power management as the only fencing step: no storage
/// isolation, so the pods are released once the BMC confirms the power is off.
pub fn seed_power_fence_config(server: &FakeApiServer, node: &str, bmc_port: u16, fabric: &Path) {
    seed_fence_steps(
        server,
        node,
        bmc_port,
        fabric,
        "power_management=ipmi-off\nrecovery=ipmi-on",
    );
}

/// [`seed_power_fence_config`] for a node whose crash kernel sends kdump notifications
/// (`kdump=true`).
pub fn seed_kdump_fence_config(server: &FakeApiServer, node: &str, bmc_port: u16, fabric: &Path) {
    seed_fence_steps(
        server,
        node,
        bmc_port,
        fabric,
        "power_management=ipmi-off\nrecovery=ipmi-on\nkdump=true",
    );
}

/// A fence configuration for `node` whose one step is storage isolation (`fence_dummy`
/// switching off the shared `fabric` port): its pods are released once the port is off,
/// with no power action.
pub fn seed_isolation_only_config(server: &FakeApiServer, node: &str, fabric: &Path) {
    server.seed(&config_map(
        &format!("fence-config-{node}"),
        "config.properties",
        &format!("node_name={node}\nisolation=fabric-off"),
    ));
    server.seed(&config_map(
        &format!("fence-method-fabric-off-{node}"),
        "method.properties",
        &format!("agent_name=fence_dummy\nstatus_file={}", fabric.display()),
    ));
}

/// A cluster of `names`, all Ready, with a database on each of the first `databases`,
/// fenced by storage isolation only ([`seed_isolation_only_config`]); and the fabric
/// port they share.
pub async fn isolation_only_cluster(
    dir: &Path,
    names: &[&str],
    databases: usize,
) -> (FakeApiServer, PathBuf) {
    let fabric = enabled_fabric(dir);
    let server = ready_cluster(names).await;
    for (index, name) in names[..databases].iter().enumerate() {
        seed_database(&server, name, &format!("db-{index}"));
        seed_isolation_only_config(&server, name, &fabric);
    }
    (server, fabric)
}

/// The methods of [`seed_fence_config`], with `steps` as the node's configuration.
pub fn seed_fence_steps(
    server: &FakeApiServer,
    node: &str,
    bmc_port: u16,
    fabric: &Path,
    steps: &str,
) {
    server.seed(&config_map(
        &format!("fence-config-{node}"),
        "config.properties",
        &format!("node_name={node}\n{steps}"),
    ));
    for (method, action) in [("fabric-off", "off"), ("fabric-on", "on")] {
        server.seed(&config_map(
            &format!("fence-method-{method}-{node}"),
            "method.properties",
            &format!(
                "agent_name=fence_dummy\nstatus_file={}\naction={action}",
                fabric.display()
            ),
        ));
    }
    for (method, action) in [("ipmi-off", "off"), ("ipmi-on", "on")] {
        server.seed(&config_map(
            &format!("fence-method-{method}-{node}"),
            "method.properties",
            &format!("template=fence-method-template-ipmi\nipport={bmc_port}\naction={action}"),
        ));
    }
    server.seed(&config_map(
        "fence-method-template-ipmi",
        "template.properties",
        &format!(
            "agent_name=fence_ipmilan\nip={LOOPBACK}\nusername={}\npassword_secret=bmc/password\npower_wait=0\npower_timeout=5",
            IpmiSim::USER
        ),
    ));
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "bmc", "namespace": NAMESPACE,
                     "labels": {"fencing.nodekeeper.io/credentials": "true"}},
        "data": {"password": base64(IpmiSim::PASSWORD.as_bytes())}
    }))
    .expect("secret");
    server.seed(&secret);
}

pub fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The report endpoint of every test controller unless a test configures it: a free
/// port, since tests and benchmarks run side by side; and no reconnect grace, since no
/// agent reports in most tests and a node without reports is then known to have no agent
/// at once, not after the grace a restarted controller gives agents.
const REPORTS: &str = "reports: {address: \"127.0.0.1:0\", reconnectGrace: 0s}";

/// `dir/controller.yaml`: a `ControllerConfiguration` for [`NAMESPACE`] with `settings`,
/// after each of `defaults` (one top-level field per line) that `settings` does not set.
fn write_config(dir: &Path, defaults: &[&str], settings: &str) -> PathBuf {
    let set_in_settings = |line: &&str| {
        let key = line.split(':').next().unwrap_or_default();
        settings
            .lines()
            .any(|given| given.starts_with(&format!("{key}:")))
    };
    let defaults: String = defaults
        .iter()
        .filter(|line| !set_in_settings(line))
        .map(|line| format!("{line}\n"))
        .collect();
    let path = dir.join("controller.yaml");
    std::fs::write(
        &path,
        format!(
            "apiVersion: nodekeeper.io/v1alpha1\nkind: ControllerConfiguration\nnamespace: {NAMESPACE}\n{defaults}{settings}"
        ),
    )
    .expect("write the controller's configuration");
    path
}

/// `dir/controller.yaml` with `settings` and the test report endpoint ([`REPORTS`])
/// unless `settings` configures one.
pub fn write_controller_config(dir: &Path, settings: &str) -> PathBuf {
    write_config(dir, &[REPORTS], settings)
}

/// The controller's configuration for a test: short waits, fast leader election, the
/// cluster fence on (nothing in the test API server plays the pod garbage collector
/// that acts on the out-of-service taint). A top-level field `extra` sets replaces the
/// rig's line for it.
pub fn controller_config(dir: &Path, extra: &str) -> PathBuf {
    write_config(
        dir,
        &[
            "unhealthyDuration: 2s",
            "powerManagementDelay: 1s",
            "retry: {limit: 1, backoff: 1s, maxBackoff: 2s}",
            "release: {outOfServiceTaint: true, deletePods: true}",
            "agents: {callTimeout: 5s, verifyTimeout: 5s, allowedOptions: [status_file]}",
            "leaderElection: {leaseDuration: 4s, renewInterval: 500ms, renewDeadline: 3s}",
            REPORTS,
        ],
        extra,
    )
}

/// The controller's `executor` setting for the Job executor in a test: the wrapper is
/// this build's nodekeeper, and the Secret volumes and the termination message live in
/// the sandbox of the runner [`job_runner`] starts (there are no container roots here).
pub fn job_executor(dir: &Path) -> String {
    let sandbox = dir.join("pods");
    format!(
        "executor:\n  type: job\n  job:\n    image: nodekeeper:test\n    command: [{}]\n    \
         secretsPath: {}\n    resultPath: {}\n    startTimeout: 30s\n",
        env!("CARGO_BIN_EXE_nodekeeper"),
        sandbox.join("secrets").display(),
        sandbox.join("termination-log").display(),
    )
}

/// The test's stand-in for the Job controller and a kubelet on worker-1, running the
/// Jobs of [`NAMESPACE`] in the sandbox [`job_executor`] names.
pub fn job_runner(server: &FakeApiServer, dir: &Path) -> super::job_runner::JobRunner {
    super::job_runner::JobRunner::start(server.client(), NAMESPACE, "worker-1", &dir.join("pods"))
}

/// A log filter for the controller at debug level, so a secret in any of its own log
/// lines would be seen, with the libraries' chatter at info.
pub const DEBUG_LOG: &str = "debug,kube=info,hyper=info,tower=info";

/// The Secret `node-tokens` in [`NAMESPACE`] (`reports.nodeTokensSecret`): one token per
/// node, as systemd agents present them.
pub fn seed_node_tokens<T: AsRef<str>>(server: &FakeApiServer, tokens: &[(&str, T)]) {
    let data: serde_json::Map<String, Value> = tokens
        .iter()
        .map(|(node, token)| (node.to_string(), json!(base64(token.as_ref().as_bytes()))))
        .collect();
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "node-tokens", "namespace": NAMESPACE},
        "data": data
    }))
    .expect("secret");
    server.seed(&secret);
}

pub use super::exposition::metric_value;

/// The controller process; killed (by its PID) when dropped.
pub struct ControllerProcess {
    child: Child,
    log: PathBuf,
    /// What the API server was asked, and the configuration the controller ran with: when
    /// the process ends, every request it made must be one the shipped RBAC allows.
    requests: RequestLog,
    policy: nodekeeper::controller::ControllerPolicy,
}

impl ControllerProcess {
    pub fn start(dir: &Path, server: &FakeApiServer, config: &Path) -> ControllerProcess {
        ControllerProcess::start_logging(dir, server, config, "info,kube=warn")
    }

    /// [`ControllerProcess::start`] as the pod `name` at `ip` with `uid` (`POD_NAME`,
    /// `POD_IP`, `POD_UID`), as the Deployment's downward API sets them.
    pub fn start_as_pod(
        dir: &Path,
        server: &FakeApiServer,
        config: &Path,
        (name, ip, uid): (&str, &str, &str),
    ) -> ControllerProcess {
        ControllerProcess::spawn(
            dir,
            server,
            config,
            "info,kube=warn",
            &[("POD_NAME", name), ("POD_IP", ip), ("POD_UID", uid)],
        )
    }

    /// [`ControllerProcess::start`] with `environment` added to the process's.
    pub fn start_with_environment(
        dir: &Path,
        server: &FakeApiServer,
        config: &Path,
        environment: &[(&str, &str)],
    ) -> ControllerProcess {
        ControllerProcess::spawn(dir, server, config, "info,kube=warn", environment)
    }

    /// [`ControllerProcess::start`] with `RUST_LOG` set to `filter`.
    pub fn start_logging(
        dir: &Path,
        server: &FakeApiServer,
        config: &Path,
        filter: &str,
    ) -> ControllerProcess {
        ControllerProcess::spawn(dir, server, config, filter, &[])
    }

    fn spawn(
        dir: &Path,
        server: &FakeApiServer,
        config: &Path,
        filter: &str,
        environment: &[(&str, &str)],
    ) -> ControllerProcess {
        let kubeconfig = dir.join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        let policy = nodekeeper::controller::policy::load(config)
            .unwrap_or_else(|e| panic!("the test's controller configuration: {e}"));
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let number = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = dir.join(format!("controller-{number}.log"));
        let stderr = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
            .args(["controller", "--config"])
            .arg(config)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--metrics-addr", "127.0.0.1:0"])
            .env("RUST_LOG", filter)
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("POD_NAME")
            .env_remove("POD_IP")
            .env_remove("POD_UID")
            .envs(environment.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start nodekeeper controller");
        ControllerProcess {
            child,
            log,
            requests: server.request_log(),
            policy,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `node`'s fence finished its power-management step.
    pub async fn powered_off(&self, server: &FakeApiServer, node: &str) {
        wait_for(self, "the power-management step to be done", || {
            let fence = fence_of(server, node)?;
            let status = fence.get("status")?;
            (status["step"] == "PowerManagement" && status["phase"] == "Done").then_some(())
        })
        .await;
    }

    /// An operator powers `node`'s machine back on and the kubelet reports Ready again:
    /// waits until recovery ran and the NodeFence is gone, and checks that recovery
    /// re-enabled the fabric port and that our taints are gone.
    pub async fn recovered(
        &self,
        server: &FakeApiServer,
        bmc: &IpmiSim,
        fabric: &Path,
        node: &str,
    ) {
        bmc.set_power(true);
        server.seed(&self::node(node, "True", Timestamp::now()));
        wait_for(self, "recovery to finish and the NodeFence to go", || {
            fence_of(server, node).is_none().then_some(())
        })
        .await;
        assert_eq!(
            fabric_state(fabric),
            "on",
            "recovery re-enabled the fabric port"
        );
        assert!(bmc.power_is_on());
        assert!(taint_keys(server, node).is_empty(), "our taints are gone");
    }

    /// The process has exited (see [`super::process_usage::exited`]).
    pub fn exited(&self) -> bool {
        super::process_usage::exited(self.child.id())
    }

    /// Kills the process outright (SIGKILL), as an OOM kill or a lost machine would.
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL the controller");
        let _ = self.child.wait();
    }

    /// Waits until this controller leads and has listed every node.
    pub async fn synced(&self) {
        wait_for(self, "the node list to sync", || {
            self.log().contains("node list synced").then_some(())
        })
        .await;
    }

    /// The address the controller logged on the line containing `marker`.
    fn logged_address(&self, marker: &str) -> String {
        let log = self.log();
        let Some(address) = log
            .lines()
            .find(|line| line.contains(marker))
            .and_then(|line| line.split("address=").nth(1))
            .map(|rest| rest.split_whitespace().next().unwrap_or("").to_string())
        else {
            panic!("the controller did not log the address of {marker:?}:\n{log}");
        };
        address
    }

    /// The metrics text, from the address the controller logged.
    pub fn metrics(&self) -> String {
        http_get(&self.metrics_address(), "/metrics")
    }

    /// Waits until `nodekeeper_fences_paused{reason}` reads 1 (the gauge follows the
    /// fence's status write).
    pub async fn paused_for(&self, reason: &str) {
        let series = format!("nodekeeper_fences_paused{{reason=\"{reason}\"}}");
        wait_for(self, &format!("{series} at 1"), || {
            (metric_value(&self.metrics(), &series) == Some(1.0)).then_some(())
        })
        .await;
    }

    pub fn metrics_address(&self) -> String {
        self.logged_address("serving /metrics")
    }

    /// Where the controller takes agent reports (`reports.address` as bound).
    pub fn reports_address(&self) -> String {
        self.logged_address("serving agent reports")
    }

    /// `node`'s latest agent report as the controller holds it, if it has one.
    pub fn agent_view(&self, node: &str) -> Option<Value> {
        self.agent_views()
            .as_array()?
            .iter()
            .find(|view| view["report"]["node"] == node)
            .cloned()
    }

    /// Every node's latest agent report, from `/reports` on the metrics address.
    pub fn agent_views(&self) -> Value {
        let response = http_get(&self.metrics_address(), "/reports");
        let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
        serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("/reports is not JSON ({e}): {response}"))
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A test that failed already says why; a second panic would abort the runner.
        if std::thread::panicking() {
            return;
        }
        let ungranted = super::controller_rbac::ungranted(&self.requests.requests(), &self.policy);
        assert!(
            ungranted.is_empty(),
            "the controller used rights packaging/kubernetes/controller does not grant it: {ungranted:?}"
        );
    }
}

pub fn http_get(address: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).expect("connect to metrics");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    response
}

pub fn fence_of(server: &FakeApiServer, node: &str) -> Option<Value> {
    server
        .custom_objects("fencing.nodekeeper.io", "v1alpha1", "nodefences")
        .into_iter()
        .find(|fence| fence.pointer("/metadata/name").and_then(Value::as_str) == Some(node))
}

pub fn taint_keys(server: &FakeApiServer, node: &str) -> Vec<String> {
    server
        .object::<Node>("", node)
        .and_then(|node| node.spec)
        .and_then(|spec| spec.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|taint| taint.key)
        .collect()
}

pub fn reasons(server: &FakeApiServer, name: &str, kind: &str) -> Vec<String> {
    server
        .objects::<Event>()
        .into_iter()
        .filter(|event| {
            event
                .regarding
                .as_ref()
                .is_some_and(|r| r.name.as_deref() == Some(name) && r.kind.as_deref() == Some(kind))
        })
        .filter_map(|event| event.reason)
        .collect()
}

pub const LIMIT: Duration = Duration::from_secs(90);

/// What a kubelet writes: `node`'s status, by a status patch, so the node's spec and the
/// controller's taints stay (seeding the node again would replace it whole, and a
/// controller that had released the node would have its out-of-service taint wiped).
pub async fn post_status(server: &FakeApiServer, node: &Node) {
    let name = node.metadata.name.as_deref().expect("the node's name");
    patch_node_status(server, name, serde_json::json!(node.status)).await;
}

/// Merge-patches node `name`'s status with `status`, as [`post_status`] does.
pub async fn patch_node_status(server: &FakeApiServer, name: &str, status: serde_json::Value) {
    let nodes: kube::Api<Node> = kube::Api::all(server.client());
    let patch = serde_json::json!({ "status": status });
    nodes
        .patch_status(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("the node's status");
}

/// Fails with the controller's log when `check` does not hold within [`LIMIT`].
pub async fn wait_for<T>(
    controller: &ControllerProcess,
    what: &str,
    check: impl FnMut() -> Option<T>,
) -> T {
    wait_for_within(controller, what, LIMIT, check).await
}

/// [`wait_for`] with a limit of `limit`.
pub async fn wait_for_within<T>(
    controller: &ControllerProcess,
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    super::poll::Wait::for_(what, limit)
        .every(Duration::from_millis(50))
        .showing(|| format!("controller log:\n{}", controller.log()))
        .eventually(|| {
            if let Some(found) = check() {
                return Some(found);
            }
            assert!(
                !controller.exited(),
                "the controller exited while waiting for {what}; its log:\n{}",
                controller.log()
            );
            None
        })
        .await
}

/// The cluster of the first test, with the controller not yet started: three Ready
/// nodes, a database on worker-2 and its fence configuration; returns the fabric port.
pub async fn one_database_node(dir: &Path, bmc: &IpmiSim) -> (FakeApiServer, PathBuf) {
    let fabric = enabled_fabric(dir);
    let server = ready_cluster(&["worker-1", "worker-2", "worker-3"]).await;
    seed_database(&server, "worker-2", "db-0");
    seed_fence_config(&server, "worker-2", bmc.port(), &fabric);
    (server, fabric)
}

/// The identity the controller names a NodeFence's Jobs by.
pub fn fence_id(fence: &Value) -> nodekeeper::controller::executor::FenceId {
    let text = |pointer: &str| {
        fence
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    nodekeeper::controller::executor::FenceId {
        uid: text("/metadata/uid"),
        name: text("/metadata/name"),
        node: text("/spec/nodeName"),
    }
}

/// The executions of one step (`"PowerManagement"`), in order.
pub fn step_executions(fence: &Value, step: &str) -> Vec<Value> {
    executions(fence)
        .into_iter()
        .filter(|execution| execution["step"] == step)
        .collect()
}

pub fn executions(fence: &Value) -> Vec<Value> {
    fence
        .pointer("/status/executions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// `nodekeeper controller status ARGS` against the test API server, with the rig's
/// kubeconfig; its standard output (the command must succeed).
pub async fn controller_status(dir: &Path, config: &Path, args: &[&str]) -> String {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["controller", "status", "--config"])
        .arg(config)
        .arg("--kubeconfig")
        .arg(dir.join("kubeconfig"))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .await
        .expect("run controller status");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "controller status failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
