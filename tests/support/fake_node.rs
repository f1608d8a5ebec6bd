//! A Kubernetes node as the agent sees it, faked in a temporary directory: a cgroup v2
//! tree in the kubelet's cgroupfs layout with a cgroup per pod, a meminfo, and the pods
//! the API server lists for it. The agent's own tests (in process, `kube_agent.rs`) and
//! the agent binary's (`kube_agent_cli.rs`) share it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, Pod as ApiPod, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use nodekeeper::config::{AgentConfig, Overrides, from_yaml_str};

/// The deletes of the pod named `pod_name` that the API server took.
pub fn successful_deletes(
    server: &super::apiserver::FakeApiServer,
    pod_name: &str,
) -> Vec<super::apiserver::RecordedRequest> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.method == "DELETE" && r.path.ends_with(&format!("/pods/{pod_name}")))
        .filter(|r| r.status < 300)
        .collect()
}

pub const NODE: &str = "node-a";
pub const MI: u64 = 1 << 20;

/// A fake host: cgroup v2 tree with the kubelet's cgroupfs layout, and a meminfo.
pub struct Host {
    pub dir: tempfile::TempDir,
}

impl Host {
    pub fn new(mem_free: u64) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let cgroup = dir.path().join("cgroup");
        std::fs::create_dir_all(cgroup.join("kubepods")).unwrap();
        std::fs::write(cgroup.join("cgroup.controllers"), "memory pids\n").unwrap();
        std::fs::write(cgroup.join("memory.stat"), "inactive_file 0\n").unwrap();
        std::fs::create_dir_all(dir.path().join("proc/sys/kernel")).unwrap();
        std::fs::create_dir_all(dir.path().join("nodefs")).unwrap();
        let host = Host { dir };
        host.set_free_memory(mem_free);
        host
    }

    pub fn set_free_memory(&self, free: u64) {
        self.set_memory(free, 0);
    }

    /// Free memory, and `hugepages` of 2 MiB reserved (which the kernel takes from the
    /// free pages, so they are in MemTotal but not in MemFree, nor in the root
    /// memory.stat's `anon`, which holds the rest).
    pub fn set_memory(&self, free: u64, hugepages: u64) {
        let total_kib = 8192 * 1024;
        let anon = (total_kib * 1024 - free).saturating_sub(hugepages * 2 * MI);
        std::fs::write(
            self.dir.path().join("cgroup/memory.stat"),
            format!("anon {anon}\nfile 0\ninactive_file 0\n"),
        )
        .unwrap();
        std::fs::write(
            self.dir.path().join("proc/meminfo"),
            format!(
                "MemTotal: {total_kib} kB\nMemFree: {} kB\nMemAvailable: {} kB\nInactive(file): 0 kB\nHugePages_Total: {hugepages}\nHugePages_Surp: 0\nHugepagesize: 2048 kB\nHugetlb: {} kB\n",
                free / 1024,
                free / 1024,
                hugepages * 2048
            ),
        )
        .unwrap();
    }

    pub fn add_pod_cgroup(&self, qos_dir: &str, uid: &str, working_set: u64) {
        let dir = self
            .dir
            .path()
            .join("cgroup/kubepods")
            .join(qos_dir)
            .join(format!("pod{uid}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("memory.current"), format!("{working_set}\n")).unwrap();
        std::fs::write(dir.join("memory.stat"), "inactive_file 0\n").unwrap();
        std::fs::write(dir.join("memory.max"), "max\n").unwrap();
        std::fs::write(dir.join("cgroup.procs"), "").unwrap();
    }

    /// A cgroup for the one container (`app`) of the pod with `uid`, in the pod's (made
    /// by [`Host::add_pod_cgroup`]), named as containerd names it under the cgroupfs
    /// driver, using `working_set` bytes.
    pub fn add_container_cgroup(&self, qos_dir: &str, uid: &str, working_set: u64) {
        let dir = self.pod_cgroup(qos_dir, uid).join(container_id(uid));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("memory.current"), format!("{working_set}\n")).unwrap();
        std::fs::write(dir.join("memory.stat"), "inactive_file 0\n").unwrap();
        std::fs::write(dir.join("cgroup.procs"), "").unwrap();
    }

    /// The cgroup directory of the pod with `uid` in the QoS directory `qos_dir`.
    pub fn pod_cgroup(&self, qos_dir: &str, uid: &str) -> std::path::PathBuf {
        self.dir
            .path()
            .join("cgroup/kubepods")
            .join(qos_dir)
            .join(format!("pod{uid}"))
    }

    /// Seeds `fixture` on `server` as a BestEffort pod, and gives it a cgroup here that
    /// holds a real process of the caller's (`sleep`), ended when the returned guard is
    /// dropped: the agent's local kill signals it.
    pub fn bind_running(
        &self,
        server: &super::apiserver::FakeApiServer,
        fixture: &PodFixture,
    ) -> PodProcess {
        server.seed(&api_pod(fixture));
        self.add_pod_cgroup("besteffort", fixture.uid, fixture.working_set);
        let process = PodProcess(
            std::process::Command::new("sleep")
                .arg("600")
                .spawn()
                .expect("start sleep"),
        );
        std::fs::write(
            self.pod_cgroup("besteffort", fixture.uid)
                .join("cgroup.procs"),
            format!("{}\n", process.0.id()),
        )
        .unwrap();
        process
    }

    /// The pod's containers run (again): its fake cgroup has a process.
    pub fn start_pod_processes(&self, qos_dir: &str, uid: &str) {
        let procs = self
            .dir
            .path()
            .join("cgroup/kubepods")
            .join(qos_dir)
            .join(format!("pod{uid}"))
            .join("cgroup.procs");
        std::fs::write(procs, "4242\n").unwrap();
    }

    /// The agent's configuration for this host, as YAML: a hard `memory.available`
    /// threshold of 100Mi, the host's files, and `extra` (lines continuing the
    /// `kubernetes:` section, then top-level ones; `{root}` stands for the host's root).
    pub fn yaml(&self, extra: &str) -> String {
        let root = self.dir.path().display();
        format!(
            "apiVersion: nodekeeper.io/v1alpha1
kind: AgentConfiguration
evictionHard:
  memory.available: 100Mi
cgroupRoot: {root}/cgroup
procRoot: {root}/proc
nodefsPath: {root}/nodefs
nodeName: {NODE}
kubernetes:
  cgroupDriver: cgroupfs
  podLogsPath: {root}/logs
  kubeletRootPath: {root}/kubelet
  stateFile: {root}/run/api-writes.json
{extra}",
            extra = extra.replace("{root}", &root.to_string())
        )
    }

    /// Writes the agent's configuration ([`Host::yaml`] with `extra`) and a kubeconfig
    /// for `server` into this host's directory; returns their paths, in that order.
    pub fn write_agent_files(
        &self,
        server: &super::apiserver::FakeApiServer,
        extra: &str,
    ) -> (std::path::PathBuf, std::path::PathBuf) {
        let config = self.dir.path().join("agent.yaml");
        std::fs::write(&config, self.yaml(extra)).unwrap();
        let kubeconfig = self.dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        (config, kubeconfig)
    }

    /// [`Host::yaml`], loaded.
    pub fn config(&self, extra: &str) -> AgentConfig {
        from_yaml_str(&self.yaml(extra), "test.yaml", &Overrides::default()).unwrap()
    }

    /// Where the agent keeps the API writes it owes.
    pub fn api_writes_file(&self) -> std::path::PathBuf {
        self.dir.path().join("run/api-writes.json")
    }

    /// This host's boot id, under its procRoot.
    pub fn set_boot_id(&self, boot_id: &str) {
        let random = self.dir.path().join("proc/sys/kernel/random");
        std::fs::create_dir_all(&random).unwrap();
        std::fs::write(random.join("boot_id"), format!("{boot_id}\n")).unwrap();
    }
}

/// A process of the test's own in a fake pod cgroup, ended (by its PID, which only this
/// test started) when dropped, a failed assertion included.
pub struct PodProcess(std::process::Child);

impl Drop for PodProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub struct PodFixture {
    pub name: &'static str,
    pub uid: &'static str,
    pub memory_request: Option<&'static str>,
    pub priority: Option<i32>,
    pub annotations: &'static [(&'static str, &'static str)],
    pub working_set: u64,
}

/// A BestEffort pod of `working_set_mi` MiB: no request, no priority.
pub const fn best_effort(name: &'static str, uid: &'static str, working_set_mi: u64) -> PodFixture {
    PodFixture {
        name,
        uid,
        memory_request: None,
        priority: None,
        annotations: &[],
        working_set: working_set_mi * MI,
    }
}

/// Seeds this host's Node object, empty, on `server`.
pub fn seed_node(server: &super::apiserver::FakeApiServer) {
    server.seed(&k8s_openapi::api::core::v1::Node {
        metadata: ObjectMeta {
            name: Some(NODE.to_string()),
            ..Default::default()
        },
        ..Default::default()
    });
}

/// Whether the agent knows its node's pods: `server` answered a list of pods and then
/// a watch of them. The watch comes only once the listed pods are in the agent's store;
/// right after the list answer, the agent may still think it has none.
pub fn pods_listed(server: &super::apiserver::FakeApiServer) -> bool {
    let pods = |watch: bool| {
        move |request: &super::apiserver::RecordedRequest| {
            request.method == "GET"
                && request.path == "/api/v1/pods"
                && request.is_watch() == watch
                && request.status == 200
        }
    };
    let requests = server.requests();
    requests
        .iter()
        .position(pods(false))
        .is_some_and(|listed| requests[listed..].iter().any(pods(true)))
}

/// The status of the node condition `condition_type` the server holds for this host.
pub fn node_condition(
    server: &super::apiserver::FakeApiServer,
    condition_type: &str,
) -> Option<String> {
    node_condition_record(server, condition_type).map(|condition| condition.status)
}

/// The node condition `condition_type` the server holds for this host, whole.
pub fn node_condition_record(
    server: &super::apiserver::FakeApiServer,
    condition_type: &str,
) -> Option<k8s_openapi::api::core::v1::NodeCondition> {
    server
        .object::<k8s_openapi::api::core::v1::Node>("", NODE)?
        .status?
        .conditions?
        .into_iter()
        .find(|condition| condition.type_ == condition_type)
}

pub fn api_pod(fixture: &PodFixture) -> ApiPod {
    ApiPod {
        metadata: ObjectMeta {
            name: Some(fixture.name.to_string()),
            namespace: Some("default".to_string()),
            uid: Some(fixture.uid.to_string()),
            annotations: Some(
                fixture
                    .annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(NODE.to_string()),
            priority: fixture.priority,
            termination_grace_period_seconds: Some(30),
            containers: vec![Container {
                name: "app".to_string(),
                resources: Some(ResourceRequirements {
                    requests: fixture
                        .memory_request
                        .map(|r| BTreeMap::from([("memory".to_string(), Quantity(r.to_string()))])),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".to_string()),
            container_statuses: Some(vec![ContainerStatus {
                name: "app".to_string(),
                container_id: Some(format!("containerd://{}", container_id(fixture.uid))),
                ..Default::default()
            }]),
            qos_class: Some(
                if fixture.memory_request.is_some() {
                    "Burstable"
                } else {
                    "BestEffort"
                }
                .to_string(),
            ),
            ..Default::default()
        }),
    }
}

/// The runtime's id of a fixture pod's one container.
pub fn container_id(uid: &str) -> String {
    format!("{uid}-app")
}

/// hog: over its request (first to go). static and critical: bigger, never evicted.
pub const PODS: [PodFixture; 4] = [
    PodFixture {
        name: "hog",
        uid: "11111111-aaaa",
        memory_request: Some("100Mi"),
        priority: None,
        annotations: &[("kubernetes.io/config.source", "api")],
        working_set: 2048 * MI,
    },
    PodFixture {
        name: "modest",
        uid: "22222222-bbbb",
        memory_request: Some("1Gi"),
        priority: None,
        annotations: &[],
        working_set: 100 * MI,
    },
    PodFixture {
        name: "static-etcd",
        uid: "33333333-cccc",
        memory_request: None,
        priority: None,
        annotations: &[
            ("kubernetes.io/config.source", "file"),
            ("kubernetes.io/config.mirror", "abc"),
        ],
        working_set: 4096 * MI,
    },
    PodFixture {
        name: "dns",
        uid: "44444444-dddd",
        memory_request: None,
        priority: Some(2_000_001_000),
        annotations: &[],
        working_set: 4096 * MI,
    },
];

/// The kubelet's QoS directory of a fixture pod: burstable with a memory request,
/// besteffort without.
pub fn qos_dir(fixture: &PodFixture) -> &'static str {
    if fixture.memory_request.is_some() {
        "burstable"
    } else {
        "besteffort"
    }
}
