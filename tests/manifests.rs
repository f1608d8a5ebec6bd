//! The Kubernetes manifests an operator installs (`packaging/kubernetes`): every object is
//! a well-formed object of its kind, the parts fit together (names, ports, labels, the
//! report token's audience, the paths the configurations expect), the controller is
//! granted exactly the rights its code uses, and Debian's kubectl renders the
//! kustomization and applies it.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodSpec, PodTemplateSpec, Service, ServiceAccount, Volume,
    VolumeMount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use support::apiserver::{CustomResource, FakeApiServer};
use support::controller_rbac::{self, Right};
use support::real;

fn packaging() -> PathBuf {
    controller_rbac::packaging()
}

/// One object of a manifest file, as written.
#[derive(Clone, Debug)]
struct Manifest {
    /// Relative to packaging/kubernetes.
    file: String,
    value: Value,
}

impl Manifest {
    fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or_default()
    }

    fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or_default()
    }

    fn namespace(&self) -> Option<&str> {
        self.value["metadata"]["namespace"].as_str()
    }

    fn id(&self) -> String {
        format!(
            "{} {}/{}",
            self.kind(),
            self.namespace().unwrap_or("-"),
            self.name()
        )
    }

    fn typed<T: serde::de::DeserializeOwned>(&self) -> T {
        serde_json::from_value(self.value.clone())
            .unwrap_or_else(|e| panic!("{}: {}: {e}", self.file, self.id()))
    }
}

fn yaml_documents(text: &str, origin: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|document| Value::deserialize(document).unwrap_or_else(|e| panic!("{origin}: {e}")))
        .filter(|value| !value.is_null())
        .collect()
}

fn read(file: &str) -> Vec<Manifest> {
    let path = packaging().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    yaml_documents(&text, file)
        .into_iter()
        .map(|value| Manifest {
            file: file.to_string(),
            value,
        })
        .collect()
}

/// Every manifest file under packaging/kubernetes (kustomizations aside), relative.
fn manifest_files() -> Vec<String> {
    fn walk(dir: &Path, root: &Path, files: &mut Vec<String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, root, files);
            } else if path.extension().is_some_and(|e| e == "yaml")
                && path.file_name().is_some_and(|n| n != "kustomization.yaml")
            {
                let relative = path.strip_prefix(root).unwrap();
                files.push(relative.display().to_string());
            }
        }
    }
    let mut files = Vec::new();
    walk(&packaging(), &packaging(), &mut files);
    files
}

/// The `resources` a kustomization lists, relative to packaging/kubernetes.
fn kustomization(dir: &str) -> Vec<String> {
    let file = Path::new(dir).join("kustomization.yaml");
    let file = file.to_str().unwrap();
    let documents = read(file);
    assert_eq!(documents.len(), 1, "{file}");
    let value = &documents[0].value;
    assert_eq!(value["kind"], "Kustomization", "{file}");
    value["resources"]
        .as_array()
        .unwrap_or_else(|| panic!("{file} lists no resources"))
        .iter()
        .map(|resource| {
            let resource = resource.as_str().unwrap();
            Path::new(dir).join(resource).display().to_string()
        })
        .map(|path| path.trim_start_matches("./").to_string())
        .collect()
}

/// The objects the base installs (`kubectl apply -k packaging/kubernetes`).
fn base() -> Vec<Manifest> {
    kustomization(".")
        .iter()
        .flat_map(|file| read(file))
        .collect()
}

fn find<'a>(
    objects: &'a [Manifest],
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) -> &'a Manifest {
    objects
        .iter()
        .find(|o| o.kind() == kind && o.namespace() == namespace && o.name() == name)
        .unwrap_or_else(|| panic!("no {kind} {}/{name} in the base", namespace.unwrap_or("-")))
}

// ---- every object is an object of its kind ----

/// The Prometheus Operator's PodMonitor and ServiceMonitor, as far as the manifests use
/// them; an unknown field is an error, as it would be silently ignored by the operator.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Monitor {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: MonitorSpec,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct MonitorSpec {
    selector: LabelSelector,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_metrics_endpoints: Option<Vec<MonitorEndpoint>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    endpoints: Option<Vec<MonitorEndpoint>>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct MonitorEndpoint {
    port: String,
    path: String,
    interval: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    relabelings: Option<Vec<Relabeling>>,
}

/// The Prometheus Operator's PrometheusRule: its groups are Prometheus's own rule file
/// format, checked by promtool in tests/observability.rs.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PrometheusRule {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: PrometheusRuleSpec,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PrometheusRuleSpec {
    groups: Vec<serde_json::Value>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Relabeling {
    source_labels: Vec<String>,
    target_label: String,
}

/// Decodes `manifest` into `T` and encodes it again: a field `T` does not have (a typo,
/// a field at the wrong level) is lost on the way and fails the comparison.
fn round_trip<T: Serialize + serde::de::DeserializeOwned>(
    manifest: &Manifest,
) -> Result<(), String> {
    let typed: T = serde_json::from_value(manifest.value.clone()).map_err(|e| e.to_string())?;
    let again = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    if again == manifest.value {
        Ok(())
    } else {
        Err(format!(
            "does not survive decoding: written {}\n  decoded {}",
            manifest.value, again
        ))
    }
}

#[test]
fn every_manifest_is_an_object_of_its_kubernetes_kind() {
    let mut kinds = BTreeSet::new();
    let mut errors = Vec::new();
    for file in manifest_files() {
        for manifest in read(&file) {
            let api_version = manifest.value["apiVersion"].as_str().unwrap_or_default();
            let checked = match (api_version, manifest.kind()) {
                ("v1", "Namespace") => round_trip::<Namespace>(&manifest),
                ("v1", "ServiceAccount") => round_trip::<ServiceAccount>(&manifest),
                ("v1", "ConfigMap") => round_trip::<ConfigMap>(&manifest),
                ("v1", "Service") => round_trip::<Service>(&manifest),
                ("apps/v1", "DaemonSet") => round_trip::<DaemonSet>(&manifest),
                ("apps/v1", "Deployment") => round_trip::<Deployment>(&manifest),
                ("policy/v1", "PodDisruptionBudget") => {
                    round_trip::<PodDisruptionBudget>(&manifest)
                }
                ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
                    round_trip::<ClusterRole>(&manifest)
                }
                ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                    round_trip::<ClusterRoleBinding>(&manifest)
                }
                ("rbac.authorization.k8s.io/v1", "Role") => round_trip::<Role>(&manifest),
                ("rbac.authorization.k8s.io/v1", "RoleBinding") => {
                    round_trip::<RoleBinding>(&manifest)
                }
                ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
                    round_trip::<ValidatingAdmissionPolicy>(&manifest)
                }
                ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
                    round_trip::<ValidatingAdmissionPolicyBinding>(&manifest)
                }
                ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
                    round_trip::<CustomResourceDefinition>(&manifest)
                }
                ("monitoring.coreos.com/v1", "PodMonitor" | "ServiceMonitor") => {
                    round_trip::<Monitor>(&manifest)
                }
                ("monitoring.coreos.com/v1", "PrometheusRule") => {
                    round_trip::<PrometheusRule>(&manifest)
                }
                (api_version, kind) => Err(format!(
                    "{api_version} {kind} is not a kind this test knows"
                )),
            };
            if let Err(error) = checked {
                errors.push(format!("{}: {}: {error}", manifest.file, manifest.id()));
            }
            kinds.insert(manifest.kind().to_string());
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    // The files are there at all: a test that read nothing could not fail.
    for kind in [
        "DaemonSet",
        "Deployment",
        "ClusterRole",
        "ValidatingAdmissionPolicy",
        "CustomResourceDefinition",
        "PodMonitor",
        "ServiceMonitor",
        "PrometheusRule",
    ] {
        assert!(kinds.contains(kind), "no {kind} among {kinds:?}");
    }
}

#[test]
fn the_base_lists_exactly_its_parts_and_each_part_every_file_in_it() {
    let parts: Vec<String> = kustomization("agent")
        .into_iter()
        .chain(kustomization("controller"))
        .collect();
    assert_eq!(
        kustomization("."),
        parts,
        "the base is the agent and the controller parts"
    );
    // Every other directory is a kustomization of the manifests in it, so an overlay
    // can take it whole (kustomize loads files outside an overlay only as directories).
    let files = manifest_files();
    let dirs: BTreeSet<&Path> = files
        .iter()
        .filter_map(|file| Path::new(file).parent())
        .collect();
    assert!(dirs.len() >= 5, "{dirs:?}");
    for dir in dirs {
        let dir = dir.to_str().unwrap();
        let listed: BTreeSet<String> = kustomization(dir).into_iter().collect();
        let here: BTreeSet<String> = files
            .iter()
            .filter(|file| Path::new(file).parent() == Some(Path::new(dir)))
            .cloned()
            .collect();
        assert_eq!(
            listed, here,
            "{dir}/kustomization.yaml lists every manifest in {dir}/, no other"
        );
    }
    // The optional rights are not in the base; the rights test says what each is for.
    assert!(!parts.iter().any(|file| file.contains("optional")));
    // Every object's name is its own: kustomize refuses two objects with one id.
    let mut ids = BTreeSet::new();
    for object in base() {
        assert!(ids.insert(object.id()), "{} twice", object.id());
    }
}

// ---- the parts fit together ----

fn template_of(manifest: &Manifest) -> PodTemplateSpec {
    match manifest.kind() {
        "DaemonSet" => manifest.typed::<DaemonSet>().spec.unwrap().template,
        "Deployment" => manifest.typed::<Deployment>().spec.unwrap().template,
        kind => panic!("{kind} has no pod template"),
    }
}

fn agent_daemonset(objects: &[Manifest]) -> &Manifest {
    find(
        objects,
        "DaemonSet",
        Some("nodekeeper-system"),
        "nodekeeper-agent",
    )
}

fn controller_deployment(objects: &[Manifest]) -> &Manifest {
    find(
        objects,
        "Deployment",
        Some("nodekeeper-fencing"),
        "nodekeeper-controller",
    )
}

/// The field the downward API puts in `container`'s environment variable `name`.
fn downward_field(container: &Container, name: &str) -> Option<String> {
    container
        .env
        .iter()
        .flatten()
        .find(|var| var.name == name)
        .and_then(|var| var.value_from.as_ref()?.field_ref.as_ref())
        .map(|field| field.field_path.clone())
}

fn only_container(spec: &PodSpec) -> &Container {
    assert_eq!(spec.containers.len(), 1);
    &spec.containers[0]
}

/// The port of `address`, typed as Kubernetes types ports.
fn port_of(address: &str) -> i32 {
    i32::from(support::port_of(address))
}

/// The container port named `name`.
fn container_port(container: &Container, name: &str) -> i32 {
    container
        .ports
        .iter()
        .flatten()
        .find(|port| port.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("container {} has no port {name}", container.name))
        .container_port
}

fn argument_after<'a>(container: &'a Container, flag: &str) -> &'a str {
    let args = container.args.as_deref().unwrap_or_default();
    let at = args
        .iter()
        .position(|arg| arg == flag)
        .unwrap_or_else(|| panic!("{} runs without {flag}: {args:?}", container.name));
    &args[at + 1]
}

/// The file `container` sees at `path`: (the ConfigMap, its key) mounted there.
fn config_map_file(spec: &PodSpec, container: &Container, path: &str) -> (String, String) {
    let path = Path::new(path);
    let mount = directory_mount_of(container, path)
        .unwrap_or_else(|| panic!("nothing is mounted where {} is", path.display()));
    let volume = volume_of(spec, mount).unwrap();
    let config_map = volume.config_map.as_ref().expect("a ConfigMap volume");
    let key = path.file_name().unwrap().to_str().unwrap().to_string();
    (config_map.name.clone(), key)
}

/// The mount in `container` that holds `path`: the deepest one at or above it.
/// The mount of the directory `file` is in, in `container`.
fn directory_mount_of<'a>(container: &'a Container, file: &Path) -> Option<&'a VolumeMount> {
    container
        .volume_mounts
        .iter()
        .flatten()
        .find(|mount| file.parent() == Some(Path::new(&mount.mount_path)))
}

/// The pod's volume that `mount` mounts.
fn volume_of<'a>(spec: &'a PodSpec, mount: &VolumeMount) -> Option<&'a Volume> {
    spec.volumes
        .iter()
        .flatten()
        .find(|volume| volume.name == mount.name)
}

fn mount_of<'a>(container: &'a Container, path: &Path) -> Option<&'a VolumeMount> {
    container
        .volume_mounts
        .iter()
        .flatten()
        .filter(|mount| path.starts_with(&mount.mount_path))
        .max_by_key(|mount| mount.mount_path.len())
}

/// The host path mounted at `path` or above it in `container`, and the path on the host.
fn host_path_of(spec: &PodSpec, container: &Container, path: &Path) -> Option<PathBuf> {
    let mount = mount_of(container, path)?;
    let volume = volume_of(spec, mount)?;
    let host = volume.host_path.as_ref()?;
    let below = path.strip_prefix(&mount.mount_path).unwrap();
    Some(Path::new(&host.path).join(below))
}

fn config_text(objects: &[Manifest], namespace: &str, name: &str, key: &str) -> String {
    let config_map: ConfigMap = find(objects, "ConfigMap", Some(namespace), name).typed();
    config_map
        .data
        .unwrap_or_default()
        .remove(key)
        .unwrap_or_else(|| panic!("ConfigMap {namespace}/{name} has no {key}"))
}

fn matches(selector: &BTreeMap<String, String>, labels: &Option<BTreeMap<String, String>>) -> bool {
    let labels = labels.clone().unwrap_or_default();
    !selector.is_empty()
        && selector
            .iter()
            .all(|(key, value)| labels.get(key) == Some(value))
}

#[test]
fn the_agent_daemonset_runs_its_configuration_with_what_it_needs_from_the_host() {
    let objects = base();
    let daemonset = agent_daemonset(&objects);
    let template = template_of(daemonset);
    let spec = template.spec.clone().unwrap();
    let agent = only_container(&spec);

    // Its ServiceAccount and its configuration are in the base.
    let account = spec.service_account_name.as_deref().unwrap();
    find(
        &objects,
        "ServiceAccount",
        Some("nodekeeper-system"),
        account,
    );
    let config_path = argument_after(agent, "--config");
    let (config_map, key) = config_map_file(&spec, agent, config_path);
    let text = config_text(&objects, "nodekeeper-system", &config_map, &key);
    let loaded = nodekeeper::config::from_yaml_str_with_warnings(
        &text,
        "the agent's ConfigMap",
        &Default::default(),
    )
    .unwrap_or_else(|e| panic!("the agent's ConfigMap: {e}"));
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let config = loaded.config;

    // As the issue and the kubelet's own static pods have it.
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert_eq!(spec.host_pid, Some(true));
    assert_eq!(
        agent.security_context.as_ref().and_then(|c| c.privileged),
        Some(true)
    );
    assert_eq!(
        downward_field(agent, "NODE_NAME").as_deref(),
        Some("spec.nodeName")
    );
    // Guaranteed QoS: requests equal limits for CPU and memory.
    let resources = agent.resources.clone().unwrap();
    let (requests, limits) = (resources.requests.unwrap(), resources.limits.unwrap());
    for resource in ["cpu", "memory"] {
        assert!(requests.contains_key(resource), "no {resource} request");
        assert_eq!(requests.get(resource), limits.get(resource), "{resource}");
    }

    // The probes ask the agent's own metrics address.
    let metrics_port = container_port(agent, "metrics");
    assert_eq!(metrics_port, port_of(&config.metrics_address));
    for (probe, path) in [
        (&agent.liveness_probe, "/healthz"),
        (&agent.readiness_probe, "/readyz"),
    ] {
        let get = probe.as_ref().and_then(|p| p.http_get.clone()).unwrap();
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(
            get.port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("metrics".into())
        );
    }

    // Every host path the configuration reads or writes is the host's own.
    let host = |path: &Path| host_path_of(&spec, agent, path);
    assert_eq!(
        host(&config.paths.cgroup_root),
        Some("/sys/fs/cgroup".into())
    );
    assert_eq!(host(&config.paths.proc_root), Some("/proc".into()));
    let kubernetes = &config.kubernetes;
    for path in [
        config.paths.nodefs.clone(),
        kubernetes.kubelet_root_path.clone(),
        kubernetes.pod_logs_path.clone(),
        config.shutdown_state_file.clone(),
        config.logind_drop_in_path.clone(),
        config.report.as_ref().unwrap().isolation.state_file.clone(),
        kubernetes.state_file.clone(),
        // logind's delay lock and systemd, for shutdown and isolation.
        "/run/dbus/system_bus_socket".into(),
        "/run/systemd/system.control".into(),
        // The container runtime, for node-level reclaim.
        nodekeeper::config::runtime_endpoint_socket(&config.node_reclaim.runtime_endpoint).unwrap(),
        nodekeeper::config::runtime_endpoint_socket(&config.node_reclaim.image_endpoint).unwrap(),
    ] {
        assert_eq!(
            host(&path).as_deref(),
            Some(path.as_path()),
            "{} on the host",
            path.display()
        );
    }
    assert!(
        config.dbus_address.is_none(),
        "the system bus at its usual socket"
    );
    // What the agent writes is mounted writable: cgroup kills, its state and records,
    // logind's drop-in, the kubelet's mask, and connecting to the bus socket.
    for path in [
        config.paths.cgroup_root.clone(),
        config.shutdown_state_file.clone(),
        config.logind_drop_in_path.clone(),
        config.report.as_ref().unwrap().isolation.state_file.clone(),
        config.kubernetes.state_file.clone(),
        "/run/systemd/system.control".into(),
        "/run/dbus/system_bus_socket".into(),
        nodekeeper::config::runtime_endpoint_socket(&config.node_reclaim.runtime_endpoint).unwrap(),
    ] {
        let mount = mount_of(agent, &path).unwrap();
        assert_ne!(
            mount.read_only,
            Some(true),
            "{} must be writable",
            path.display()
        );
        // A ConfigMap, Secret or projected volume is read-only whatever the mount says.
        let volume = volume_of(&spec, mount).unwrap();
        assert!(
            volume.host_path.is_some(),
            "{} must be on the host",
            path.display()
        );
    }
}

#[test]
fn the_agents_report_to_the_controller_service_with_a_token_it_accepts() {
    let objects = base();
    let daemonset = agent_daemonset(&objects);
    let agent_spec = template_of(daemonset).spec.unwrap();
    let agent = only_container(&agent_spec);
    let agent_config = nodekeeper::config::from_yaml_str(
        &config_text(
            &objects,
            "nodekeeper-system",
            "nodekeeper-agent",
            "agent.yaml",
        ),
        "agent.yaml",
        &Default::default(),
    )
    .unwrap();
    let deployment_object = controller_deployment(&objects);
    let deployment: Deployment = deployment_object.typed();
    let template = template_of(deployment_object);
    let spec = template.spec.clone().unwrap();
    let controller = only_container(&spec);
    let (config_map, key) =
        config_map_file(&spec, controller, argument_after(controller, "--config"));
    let policy = nodekeeper::controller::policy::parse(
        &config_text(&objects, "nodekeeper-fencing", &config_map, &key),
        "controller.yaml",
    )
    .unwrap_or_else(|e| panic!("the controller's ConfigMap: {e}"));

    // Two replicas, one acting: the Lease is in the namespace the Role grants it in.
    assert_eq!(deployment.spec.as_ref().unwrap().replicas, Some(2));
    assert_eq!(policy.namespace, controller_rbac::MANIFEST_NAMESPACE);
    assert_eq!(
        Some(policy.namespace.as_str()),
        deployment_object.namespace()
    );
    find(
        &objects,
        "ServiceAccount",
        Some(&policy.namespace),
        spec.service_account_name.as_deref().unwrap(),
    );
    assert_eq!(
        downward_field(controller, "POD_NAME").as_deref(),
        Some("metadata.name"),
        "the replica's name in the Lease"
    );
    assert_eq!(
        container_port(controller, "metrics"),
        port_of(argument_after(controller, "--metrics-addr"))
    );
    assert_eq!(
        container_port(controller, "reports"),
        port_of(&policy.reports.address)
    );

    // The agent's controllerURL is the report Service. It selects no pod: the leader
    // points its EndpointSlice at its own address (POD_IP) and the port it listens on,
    // under the Service port's name, so reports reach the leader and no other replica.
    let report = agent_config.report.as_ref().expect("the agents report");
    let url = report.controller_url.trim_start_matches("http://");
    let (host, port) = url.split_once(':').unwrap();
    let (service_name, service_namespace) = host.trim_end_matches(".svc").split_once('.').unwrap();
    assert_eq!(policy.reports.leader_service.as_deref(), Some(service_name));
    assert_eq!(
        service_namespace, policy.namespace,
        "the slice is written beside its Lease"
    );
    let service: Service = find(&objects, "Service", Some(service_namespace), service_name).typed();
    let service_spec = service.spec.unwrap();
    assert_eq!(
        service_spec.selector, None,
        "the leader alone decides where reports go"
    );
    let service_port = service_spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.port.to_string() == port)
        .unwrap_or_else(|| panic!("{service_name} has no port {port}"));
    assert_eq!(
        service_port.name.as_deref(),
        Some(nodekeeper::controller::report_endpoint::PORT_NAME)
    );
    assert_eq!(
        downward_field(controller, "POD_IP").as_deref(),
        Some("status.podIP")
    );
    assert_eq!(
        downward_field(controller, "POD_UID").as_deref(),
        Some("metadata.uid"),
        "the slice's owner, so it goes with the pod"
    );
    // Every serving replica is Ready, so a rolling update and the disruption budget work.
    let readiness = controller
        .readiness_probe
        .as_ref()
        .and_then(|p| p.http_get.clone());
    assert_eq!(
        readiness.and_then(|get| get.path).as_deref(),
        Some("/healthz")
    );

    // The token: projected for the controller's audience, where the agent reads it, and
    // from a ServiceAccount the controller accepts.
    let token_file = report
        .token_file
        .clone()
        .unwrap_or_else(|| nodekeeper::config::DEFAULT_REPORT_TOKEN_FILE.into());
    let mount = directory_mount_of(agent, &token_file).expect("the token's directory is mounted");
    let volume = volume_of(&agent_spec, mount).unwrap();
    let projected = volume
        .projected
        .as_ref()
        .expect("a projected token")
        .sources
        .clone()
        .unwrap();
    let token = projected[0].service_account_token.as_ref().unwrap();
    assert_eq!(
        token.path,
        token_file.file_name().unwrap().to_str().unwrap()
    );
    assert_eq!(
        token.audience.as_deref(),
        Some(policy.reports.auth.audience.as_str())
    );
    let agent_account = format!(
        "{}/{}",
        daemonset.namespace().unwrap(),
        agent_spec.service_account_name.as_deref().unwrap()
    );
    assert!(
        policy
            .reports
            .auth
            .service_accounts
            .contains(&agent_account),
        "{agent_account} not in {:?}",
        policy.reports.auth.service_accounts
    );
}

#[test]
fn the_monitors_scrape_every_agent_and_both_controller_replicas() {
    let objects = base();
    let monitors: Vec<Manifest> = kustomization("monitoring")
        .iter()
        .flat_map(|f| read(f))
        .collect();
    let pod_monitor: Monitor = find(
        &monitors,
        "PodMonitor",
        Some("nodekeeper-system"),
        "nodekeeper-agent",
    )
    .typed();
    let daemonset = agent_daemonset(&objects);
    let template = template_of(daemonset);
    assert!(matches(
        pod_monitor.spec.selector.match_labels.as_ref().unwrap(),
        &template.metadata.as_ref().unwrap().labels
    ));
    let agent = template.spec.unwrap().containers[0].clone();
    for endpoint in pod_monitor.spec.pod_metrics_endpoints.unwrap() {
        container_port(&agent, &endpoint.port);
        assert_eq!(endpoint.path, "/metrics");
    }

    let service_monitor: Monitor = find(
        &monitors,
        "ServiceMonitor",
        Some("nodekeeper-fencing"),
        "nodekeeper-controller",
    )
    .typed();
    let services: Vec<Service> = objects
        .iter()
        .filter(|o| o.kind() == "Service" && o.namespace() == Some("nodekeeper-fencing"))
        .map(|o| o.typed())
        .collect();
    let selected: Vec<&Service> = services
        .iter()
        .filter(|s| {
            matches(
                service_monitor.spec.selector.match_labels.as_ref().unwrap(),
                &s.metadata.labels,
            )
        })
        .collect();
    assert_eq!(selected.len(), 1, "one metrics Service");
    let metrics_service = selected[0].spec.clone().unwrap();
    assert_eq!(
        metrics_service.publish_not_ready_addresses,
        Some(true),
        "the follower (not ready) is scraped too"
    );
    let deployment = controller_deployment(&objects);
    let template = template_of(deployment);
    assert!(matches(
        metrics_service.selector.as_ref().unwrap(),
        &template.metadata.as_ref().unwrap().labels
    ));
    let controller = template.spec.unwrap().containers[0].clone();
    for endpoint in service_monitor.spec.endpoints.unwrap() {
        let port = metrics_service
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(endpoint.port.as_str()))
            .expect("the endpoint names a Service port");
        let target = match port.target_port.clone().unwrap() {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(name) => name,
            other => panic!("{other:?}"),
        };
        container_port(&controller, &target);
    }
}

#[test]
fn namespaces_images_and_references_resolve() {
    let objects = base();
    let namespaces: BTreeSet<&str> = objects
        .iter()
        .filter(|o| o.kind() == "Namespace")
        .map(Manifest::name)
        .collect();
    for object in &objects {
        if let Some(namespace) = object.namespace() {
            assert!(
                namespaces.contains(namespace) || namespace == "kube-node-lease",
                "{} is in a namespace the base does not create",
                object.id()
            );
        }
        // The admission policy's binding names the policy, and the policy holds the
        // agent DaemonSet's own ServiceAccount: under another name it would hold nothing.
        if object.kind() == "ValidatingAdmissionPolicyBinding" {
            let policy_name = object.value["spec"]["policyName"].as_str().unwrap();
            let policy = find(&objects, "ValidatingAdmissionPolicy", None, policy_name);
            let agent = template_of(agent_daemonset(&objects));
            let account = agent.spec.unwrap().service_account_name.unwrap();
            let daemonset = agent_daemonset(&objects);
            let user = format!(
                "system:serviceaccount:{}:{account}",
                daemonset.namespace().unwrap()
            );
            let conditions = policy.value["spec"]["matchConditions"].to_string();
            assert!(
                conditions.contains(&format!("'{user}'")),
                "{policy_name} applies to {conditions}, not to the agent's {user}"
            );
            continue;
        }
        // Bindings name roles and ServiceAccounts the base defines.
        if object.kind().ends_with("Binding") {
            let role_ref = &object.value["roleRef"];
            let role_kind = role_ref["kind"].as_str().unwrap();
            let role_namespace = if role_kind == "Role" {
                object.namespace()
            } else {
                None
            };
            find(
                &objects,
                role_kind,
                role_namespace,
                role_ref["name"].as_str().unwrap(),
            );
            for subject in object.value["subjects"].as_array().unwrap() {
                find(
                    &objects,
                    "ServiceAccount",
                    subject["namespace"].as_str(),
                    subject["name"].as_str().unwrap(),
                );
            }
        }
    }
    // The images are this version's.
    for (kind, namespace, name) in [
        ("DaemonSet", "nodekeeper-system", "nodekeeper-agent"),
        ("Deployment", "nodekeeper-fencing", "nodekeeper-controller"),
    ] {
        let template = template_of(find(&objects, kind, Some(namespace), name));
        let image = template.spec.unwrap().containers[0].image.clone().unwrap();
        assert!(
            image.ends_with(&format!(":{}", env!("CARGO_PKG_VERSION"))),
            "{kind} {name} runs {image}, not version {}",
            env!("CARGO_PKG_VERSION")
        );
    }
    // The CRD is `nodekeeper crd`'s output: tests/controller_cli.rs.
    find(
        &objects,
        "CustomResourceDefinition",
        None,
        "nodefences.fencing.nodekeeper.io",
    );
}

// ---- the controller's rights ----

fn rights(list: &[(&str, &str, &str, Option<&str>)]) -> BTreeSet<Right> {
    list.iter()
        .map(|(verb, group, resource, namespace)| Right::new(verb, group, resource, *namespace))
        .collect()
}

/// Every test file's text, to find the tests `controller_rbac::EXERCISED` names.
fn test_sources() -> Vec<(PathBuf, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            (path, text)
        })
        .collect()
}

#[test]
fn the_controller_is_granted_the_rights_its_code_uses_and_no_other() {
    // Every right granted, the optional ones too, is one a named test shows the
    // controller using; and every test that runs a controller checks that it used
    // nothing else (`ControllerProcess`'s drop).
    let granted: BTreeSet<Right> = [
        controller_rbac::BASE,
        controller_rbac::DELETE_PODS,
        controller_rbac::JOB_EXECUTOR,
    ]
    .into_iter()
    .flat_map(controller_rbac::granted_by)
    .collect();
    let exercised = controller_rbac::exercised();
    let unused: Vec<_> = granted.difference(&exercised).collect();
    let ungranted: Vec<_> = exercised.difference(&granted).collect();
    assert!(
        unused.is_empty(),
        "granted, but no test shows it used: {unused:?}"
    );
    assert!(ungranted.is_empty(), "used, but not granted: {ungranted:?}");

    // Each of those tests exists and makes its check.
    let sources = test_sources();
    for (test, _) in controller_rbac::EXERCISED {
        let found = sources.iter().find(|(_, text)| {
            text.contains(&format!("fn {test}()")) && text.contains(&format!("\"{test}\""))
        });
        assert!(
            found.is_some(),
            "no test {test} calling assert_exercised with its name"
        );
    }

    // The optional files hold what their settings need, and nothing of the base.
    const FENCING: Option<&str> = Some(controller_rbac::MANIFEST_NAMESPACE);
    assert_eq!(
        controller_rbac::granted_by(controller_rbac::DELETE_PODS),
        rights(&[("delete", "", "pods", None)])
    );
    assert_eq!(
        controller_rbac::granted_by(controller_rbac::JOB_EXECUTOR),
        rights(&[
            ("get", "batch", "jobs", FENCING),
            ("list", "batch", "jobs", FENCING),
            ("watch", "batch", "jobs", FENCING),
            ("create", "batch", "jobs", FENCING),
            ("list", "", "pods", FENCING),
            ("watch", "", "pods", FENCING),
        ])
    );
    // No secret is ever listed or watched: only the ones the configuration names are read.
    assert!(
        !granted
            .iter()
            .any(|r| r.resource == "secrets" && r.verb != "get"),
        "{granted:?}"
    );
}

// ---- a real client renders and applies them ----

/// Runs Debian's kubectl with a discovery cache of its own (another test's server on the
/// same port must not answer for this one); (success, stdout, stderr).
fn kubectl(
    kubectl: &Path,
    dir: &Path,
    kubeconfig: Option<&Path>,
    args: &[&str],
) -> (bool, String, String) {
    let mut command = std::process::Command::new(kubectl);
    command
        .args(args)
        .arg(format!("--cache-dir={}", dir.join("cache").display()))
        .current_dir(packaging());
    if let Some(kubeconfig) = kubeconfig {
        command.arg(format!("--kubeconfig={}", kubeconfig.display()));
    }
    let out = command.output().expect("run kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Objects by id, every number as a float: kustomize writes the CRD's `minimum: 0.0`
/// as `0`, the same number.
fn by_id(objects: impl IntoIterator<Item = Manifest>) -> BTreeMap<String, Value> {
    fn numbers_as_floats(value: Value) -> Value {
        match value {
            Value::Number(number) => number
                .as_f64()
                .and_then(serde_json::Number::from_f64)
                .map_or(Value::Null, Value::Number),
            Value::Array(items) => Value::Array(items.into_iter().map(numbers_as_floats).collect()),
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(key, value)| (key, numbers_as_floats(value)))
                    .collect(),
            ),
            other => other,
        }
    }
    objects
        .into_iter()
        .map(|o| (o.id(), numbers_as_floats(o.value)))
        .collect()
}

/// Where two values differ, as JSON pointers (at most a few).
fn differences(left: &Value, right: &Value, at: String, found: &mut Vec<String>) {
    if found.len() >= 5 {
        return;
    }
    match (left, right) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let (x, y) = (
                    a.get(key).unwrap_or(&Value::Null),
                    b.get(key).unwrap_or(&Value::Null),
                );
                differences(x, y, format!("{at}/{key}"), found);
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (index, (x, y)) in a.iter().zip(b).enumerate() {
                differences(x, y, format!("{at}/{index}"), found);
            }
        }
        (a, b) if a != b => found.push(format!("{at}: {a} vs {b}")),
        _ => {}
    }
}

fn assert_same_objects(left: BTreeMap<String, Value>, right: BTreeMap<String, Value>, what: &str) {
    let left_ids: BTreeSet<&String> = left.keys().collect();
    let right_ids: BTreeSet<&String> = right.keys().collect();
    assert_eq!(left_ids, right_ids, "{what}: the objects");
    let mut found = Vec::new();
    for (id, value) in &left {
        differences(value, &right[id], id.clone(), &mut found);
    }
    assert!(found.is_empty(), "{what}:\n{}", found.join("\n"));
}

/// The ids `kubectl apply` printed with `outcome` (`created`, `unchanged`, ...), as
/// `kind/name` the way kubectl names them.
fn applied(stdout: &str, outcome: &str) -> BTreeSet<String> {
    stdout
        .lines()
        .filter_map(|line| line.strip_suffix(outcome))
        .map(|name| name.trim().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_renders_the_kustomizations_and_applies_them() {
    let kubectl_path = require!("kubectl (Debian kubernetes-client)", real::debian_kubectl());
    let dir = tempfile::tempdir().expect("temp dir");
    let run = |kubeconfig: Option<&Path>, args: &[&str]| {
        kubectl(&kubectl_path, dir.path(), kubeconfig, args)
    };

    // kustomize renders exactly the files' objects, unchanged, for the base and for
    // every directory an overlay may take.
    let dirs: BTreeSet<String> = manifest_files()
        .iter()
        .filter_map(|file| Path::new(file).parent())
        .map(|dir| dir.display().to_string())
        .collect();
    let renderings =
        std::iter::once((".".to_string(), base())).chain(dirs.into_iter().map(|dir| {
            let objects = kustomization(&dir).iter().flat_map(|f| read(f)).collect();
            (dir, objects)
        }));
    for (kustomization, objects) in renderings {
        let kustomization = kustomization.as_str();
        let (ok, out, err) = run(None, &["kustomize", kustomization]);
        assert!(ok, "kubectl kustomize {kustomization}: {err}");
        let rendered = yaml_documents(&out, "kubectl kustomize")
            .into_iter()
            .map(|value| Manifest {
                file: "kustomize".into(),
                value,
            });
        assert_same_objects(
            by_id(rendered),
            by_id(objects),
            &format!("kubectl kustomize {kustomization}"),
        );
    }

    // What `kubectl apply` calls the base's objects: kind.group/name.
    let names: BTreeSet<String> = base()
        .iter()
        .map(|o| {
            let api_version = o.value["apiVersion"].as_str().unwrap();
            let kind = o.kind().to_lowercase();
            match api_version.split_once('/') {
                Some((group, _)) => format!("{kind}.{group}/{}", o.name()),
                None => format!("{kind}/{}", o.name()),
            }
        })
        .collect();

    let fake = (!support::apiserver::wants_real_cluster()).then(FakeApiServer::start);
    let fake = match fake {
        Some(starting) => Some(starting.await),
        None => None,
    };
    let kubeconfig = match &fake {
        // A real cluster is only asked, never changed.
        None => std::env::var_os("KUBECONFIG")
            .map(PathBuf::from)
            .expect("NODEKEEPER_REAL_CLUSTER=1 needs KUBECONFIG"),
        Some(fake) => {
            // The Prometheus Operator's kinds, as its CRDs would define them.
            for (kind, plural) in [
                ("PodMonitor", "podmonitors"),
                ("ServiceMonitor", "servicemonitors"),
                ("PrometheusRule", "prometheusrules"),
            ] {
                fake.register(CustomResource {
                    group: "monitoring.coreos.com".into(),
                    version: "v1".into(),
                    kind: kind.into(),
                    plural: plural.into(),
                    namespaced: true,
                    has_status: false,
                });
            }
            let path = dir.path().join("kubeconfig");
            fake.write_kubeconfig(&path).expect("kubeconfig");
            path
        }
    };
    let kubeconfig = Some(kubeconfig.as_path());

    // The check the issue names: a client-side dry run (no OpenAPI document here).
    let (ok, out, err) = run(
        kubeconfig,
        &["apply", "--dry-run=client", "--validate=false", "-k", "."],
    );
    assert!(ok, "{out}{err}");
    let dry = applied(&out, " created (dry run)")
        .union(&applied(&out, " configured (dry run)"))
        .cloned()
        .collect::<BTreeSet<_>>()
        .union(&applied(&out, " unchanged (dry run)"))
        .cloned()
        .collect::<BTreeSet<_>>();
    assert_eq!(dry, names, "{out}");
    let (ok, out, err) = run(
        kubeconfig,
        &[
            "apply",
            "--dry-run=client",
            "--validate=false",
            "-k",
            "monitoring",
        ],
    );
    assert!(ok, "{out}{err}");
    assert_eq!(out.lines().count(), 3, "{out}");

    let Some(fake) = &fake else {
        return;
    };
    assert!(
        fake.object::<DaemonSet>("nodekeeper-system", "nodekeeper-agent")
            .is_none(),
        "a dry run stores nothing"
    );
    // Applied for real, every object goes through its k8s-openapi type in the server;
    // applied again, nothing changes.
    let (ok, out, err) = run(kubeconfig, &["apply", "--validate=false", "-k", "."]);
    assert!(ok, "{out}{err}");
    assert_eq!(applied(&out, " created"), names, "{out}");
    assert!(
        fake.object::<DaemonSet>("nodekeeper-system", "nodekeeper-agent")
            .is_some(),
        "the DaemonSet is stored"
    );
    // Every object as the server stored it (decoded through its type there) holds what
    // the file says: the same labels, and every other field as written.
    let (ok, out, err) = run(kubeconfig, &["get", "-k", ".", "-o", "json"]);
    assert!(ok, "{out}{err}");
    let list: Value = serde_json::from_str(&out).expect("kubectl get -o json");
    let stored = by_id(
        list["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|value| Manifest {
                file: "stored".into(),
                value: value.clone(),
            }),
    );
    let mut found = Vec::new();
    for (id, written) in by_id(base()) {
        let Some(kept) = stored.get(&id) else {
            found.push(format!("{id} is not stored"));
            continue;
        };
        for (field, value) in written.as_object().unwrap() {
            let (value, kept) = match field.as_str() {
                "metadata" => (&value["labels"], &kept["metadata"]["labels"]),
                _ => (value, &kept[field]),
            };
            differences(value, kept, format!("{id}/{field}"), &mut found);
        }
    }
    assert!(
        found.is_empty(),
        "stored differently:\n{}",
        found.join("\n")
    );
    let (ok, out, err) = run(kubeconfig, &["apply", "--validate=false", "-k", "."]);
    assert!(ok, "{out}{err}");
    assert_eq!(applied(&out, " unchanged"), names, "{out}");
    let (ok, out, err) = run(
        kubeconfig,
        &["apply", "--validate=false", "-k", "monitoring"],
    );
    assert!(ok, "{out}{err}");
    assert_eq!(
        applied(&out, " created"),
        [
            "podmonitor.monitoring.coreos.com/nodekeeper-agent",
            "prometheusrule.monitoring.coreos.com/nodekeeper",
            "servicemonitor.monitoring.coreos.com/nodekeeper-controller"
        ]
        .map(String::from)
        .into(),
        "{out}"
    );
}
