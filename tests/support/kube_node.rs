//! A node's pods for the benches that run the agent's Kubernetes pod source without an
//! API server: cgroups where the kubelet makes them (cgroupfs driver) and the API's pods
//! in a reflector store, filled as the agent's pod watch fills it.

use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod as ApiPod;
use kube::runtime::{reflector, watcher};
use nodekeeper::config::{AgentConfig, CgroupDriver, KubernetesConfig};
use nodekeeper::kubernetes::cgroups::PodCgroupNaming;
use nodekeeper::kubernetes::source::{ApiPodSource, TaskGuard};
use nodekeeper::kubernetes::usage::PodUsageReader;
use nodekeeper::ports::PodSource;
use nodekeeper::signals::{Host, ProcessCounts};

use super::cgroups::TestCgroups;

/// A node's pods as the kubelet lays them out (cgroupfs driver) and as the API lists them:
/// `kubepods/burstable/pod<uid>/<container id>` under the test's parent, and one API pod
/// each in a reflector store, as the agent's pod watch fills it.
#[derive(Clone)]
pub struct KubeNode {
    /// The kubelet's pods cgroup, relative to the hierarchy roots.
    pub kubepods: PathBuf,
    /// Each pod, its cgroup and its container's, relative to the hierarchy roots.
    pub pods: Vec<(ApiPod, PathBuf, PathBuf)>,
}

impl KubeNode {
    /// `kubepods` under the test's parent, its memory limited to `limit` bytes.
    pub fn create(cgroups: &mut TestCgroups, limit: u64) -> KubeNode {
        let kubepods = cgroups.child("kubepods");
        cgroups.set_memory_limit(&kubepods, limit);
        cgroups.child("kubepods/burstable");
        KubeNode {
            kubepods,
            pods: Vec::new(),
        }
    }

    pub fn grow_to(&mut self, cgroups: &mut TestCgroups, count: usize) {
        while self.pods.len() < count {
            let index = self.pods.len();
            let uid = format!("0be0c0de-0000-4000-8000-{index:012}");
            let container_id = format!("{:064x}", index + 1);
            let pod = cgroups.child(&format!("kubepods/burstable/pod{uid}"));
            let container = cgroups.child(&format!("kubepods/burstable/pod{uid}/{container_id}"));
            self.pods
                .push((api_pod(index, &uid, &container_id), pod, container));
        }
    }

    /// Each pod's cgroup, in the order the pod source reads them (a container's cgroup is
    /// read only for an eviction's message).
    pub fn measured_dirs(&self) -> Vec<PathBuf> {
        self.pods.iter().map(|(_, pod, _)| pod.clone()).collect()
    }

    /// The agent's Kubernetes pod source over these pods, from a store filled as a watch's
    /// first list fills it.
    pub fn pod_source(&self, config: &AgentConfig) -> Box<dyn PodSource> {
        let (store, mut writer) = reflector::store::<ApiPod>();
        writer.apply_watcher_event(&watcher::Event::Init);
        for (pod, _, _) in &self.pods {
            writer.apply_watcher_event(&watcher::Event::InitApply(pod.clone()));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let host = Host::detect(&config.paths);
        let reader = host
            .cgroups()
            .expect("the test cgroups' hierarchies")
            .clone();
        let naming = PodCgroupNaming::new(
            CgroupDriver::Cgroupfs,
            &format!("/{}", self.kubepods.display()),
        );
        let usage = PodUsageReader::new(reader, naming, &KubernetesConfig::default())
            .counting_processes(ProcessCounts::for_ranking(
                config.eviction.ranks_by_process_count(),
            ));
        // The store keeps serving its pods without the writer: nothing changes them.
        drop(writer);
        Box::new(ApiPodSource::new(
            store,
            Some(usage),
            Arc::new(TaskGuard(Vec::new())),
        ))
    }
}

/// A Burstable pod of one container with a memory request and limit, an emptyDir and the
/// projected service-account volume every pod gets, running; every third one also has
/// an init container that has completed (as a service mesh's sidecar injector adds one):
/// its status keeps the id of a container whose cgroup is gone.
pub fn api_pod(index: usize, uid: &str, container_id: &str) -> ApiPod {
    let mut pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("pod-{index:03}"),
            "namespace": "bench",
            "uid": uid,
            "resourceVersion": "1",
            "labels": {"app": "bench"},
        },
        "spec": {
            "nodeName": "bench-node",
            "priority": 0,
            "containers": [{
                "name": "app",
                "image": "registry.example/bench:1",
                "resources": {
                    "requests": {"cpu": "100m", "memory": "64Mi", "ephemeral-storage": "1Gi"},
                    "limits": {"memory": "256Mi", "ephemeral-storage": "2Gi"},
                },
                "volumeMounts": [
                    {"name": "scratch", "mountPath": "/scratch"},
                    {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
                ],
            }],
            "volumes": [
                {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}},
                {"name": "kube-api-access", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                ]}},
            ],
        },
        "status": {
            "phase": "Running",
            "qosClass": "Burstable",
            "containerStatuses": [{
                "name": "app",
                "containerID": format!("containerd://{container_id}"),
                "image": "registry.example/bench:1",
                "imageID": "registry.example/bench@sha256:00",
                "ready": true,
                "restartCount": 0,
                "state": {"running": {"startedAt": "2026-12-07T00:00:00Z"}},
            }],
        },
    });
    if index.is_multiple_of(3) {
        pod["spec"]["initContainers"] = serde_json::json!([{
            "name": "init",
            "image": "registry.example/init:1",
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
        }]);
        pod["status"]["initContainerStatuses"] = serde_json::json!([{
            "name": "init",
            "containerID": format!("containerd://{:064x}", index + 1_000_000),
            "image": "registry.example/init:1",
            "imageID": "registry.example/init@sha256:00",
            "ready": true,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
        }]);
    }
    serde_json::from_value(pod).expect("a valid pod")
}
