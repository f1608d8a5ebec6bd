//! From the API's `Pod` to the eviction core's [`Pod`]: identity, priority, QoS class,
//! pod-effective requests and limits, grace period, and whether the pod is static or a
//! mirror pod (and therefore critical, never evicted).

use k8s_openapi::api::core::v1::Pod as ApiPod;

use super::resources::{
    Amounts, QosClass, QuantityReader, QuantityWarning, compute_qos, init_kind, pod_limits,
    pod_requests,
};
use crate::pods::{
    AmountFormats, ContainerKind, ContainerStats, EmptyDirStats, Pod, ResourceAmounts,
};
use crate::quantity::Quantity;

/// The annotation naming where the kubelet got a pod from; anything but `api` is static.
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// Present on the API server's mirror of a static pod.
pub const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// The kubelet's hash of a pod's config: a static pod's UID on the node.
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";

/// A pod as the agent sees it on this node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodePod {
    pub pod: Pod,
    pub qos: QosClass,
    /// Runtime ids (`containerd://…` stripped) by container name, for per-container
    /// cgroups and writable layers.
    pub container_ids: Vec<(String, String)>,
    /// The containers whose status says they are not running (terminated, or waiting to
    /// start again) under the id in `container_ids`: that container has no cgroup, so
    /// none is looked for (a completed init container keeps its id for the pod's life).
    pub stopped_containers: Vec<String>,
    /// The pod's volumes other than emptyDirs that the kubelet counts in its local
    /// storage.
    pub file_volumes: Vec<FileVolume>,
    pub warnings: Vec<QuantityWarning>,
}

/// A volume of files the kubelet writes for the pod on the node's disk, which it counts in
/// the pod's local storage as it counts an emptyDir on the default medium (its
/// `IsLocalEphemeralVolume`): a configMap, or a gitRepo. Secret, downwardAPI and
/// projected volumes are tmpfs, and a hostPath has no usage figure in the kubelet's stats,
/// so none of them counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileVolume {
    pub name: String,
    /// The directory of the volume's plugin under the pod's `volumes/`, where the
    /// kubelet keeps the volume's files: `<kubelet root>/pods/<uid>/volumes/<this>/<name>`.
    pub plugin_dir: &'static str,
}

/// The plugin directories of the volumes in [`FileVolume`].
pub const CONFIG_MAP_DIR: &str = "kubernetes.io~configmap";
pub const GIT_REPO_DIR: &str = "kubernetes.io~git-repo";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}: {field} is missing")]
pub struct ConvertError {
    pub pod: String,
    pub field: &'static str,
}

fn amounts(list: &Amounts) -> ResourceAmounts {
    let memory = list.get("memory");
    let ephemeral_storage = list.get("ephemeral-storage");
    ResourceAmounts {
        memory: memory.map(Quantity::value),
        ephemeral_storage: ephemeral_storage.map(Quantity::value),
        formats: AmountFormats {
            memory: memory.map(Quantity::format).unwrap_or_default(),
            ephemeral_storage: ephemeral_storage.map(Quantity::format).unwrap_or_default(),
        },
    }
}

/// Whether the pod has finished: its phase is terminal (`Succeeded` or `Failed`), so no
/// container of it runs or will run again. The one test of this, for the agent and the
/// controller alike.
pub fn has_finished(pod: &ApiPod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// Whether the pod may still be an eviction candidate: it has not finished. A pod being
/// deleted stays one while it still runs here, as the kubelet's active pods keep a pod
/// whose termination was requested until it is known terminated
/// (`filterOutInactivePods`); the agent leaves it out once no process of it is left.
pub fn is_active(pod: &ApiPod) -> bool {
    !has_finished(pod)
}

/// Static (`config.source` other than `api`) or mirror pod.
pub fn is_static_or_mirror(pod: &ApiPod) -> bool {
    let annotations = pod.metadata.annotations.as_ref();
    let source = annotations.and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION));
    let mirror = annotations.is_some_and(|a| a.contains_key(CONFIG_MIRROR_ANNOTATION));
    mirror || source.is_some_and(|s| s != "api")
}

pub fn convert_pod(api: &ApiPod) -> Result<NodePod, ConvertError> {
    let meta = &api.metadata;
    let name = meta.name.clone().ok_or_else(|| ConvertError {
        pod: "<unnamed>".to_string(),
        field: "metadata.name",
    })?;
    let namespace = meta
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_string());
    let key = format!("{namespace}/{name}");
    let uid = meta.uid.clone().ok_or_else(|| ConvertError {
        pod: key.clone(),
        field: "metadata.uid",
    })?;
    let spec = api.spec.as_ref().ok_or(ConvertError {
        pod: key,
        field: "spec",
    })?;
    let mut reader = QuantityReader::default();
    let requests = pod_requests(&mut reader, spec);
    let limits = pod_limits(&mut reader, spec);
    let computed_qos = compute_qos(&mut reader, spec);
    let status = api.status.as_ref();
    let qos = status
        .and_then(|s| s.qos_class.as_deref())
        .and_then(QosClass::parse)
        .unwrap_or(computed_qos);

    let mut containers = Vec::new();
    let all_containers = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| ("spec.initContainers", init_kind(c), c))
        .chain(
            spec.containers
                .iter()
                .map(|c| ("spec.containers", ContainerKind::Regular, c)),
        );
    for (field, kind, container) in all_containers {
        let (requests, limits) = reader.requirements(
            &format!("{field}[{}].resources", container.name),
            container.resources.as_ref(),
        );
        containers.push(ContainerStats {
            name: container.name.clone(),
            kind,
            requests: amounts(&requests),
            limits: amounts(&limits),
            ..ContainerStats::default()
        });
    }
    // Every container's status, init containers first.
    let statuses = || {
        status.into_iter().flat_map(|s| {
            s.init_container_statuses
                .iter()
                .flatten()
                .chain(s.container_statuses.iter().flatten())
        })
    };
    let container_ids = statuses()
        .filter_map(|cs| {
            let id = cs.container_id.as_deref()?;
            Some((
                cs.name.clone(),
                super::cgroups::runtime_container_id(id).to_string(),
            ))
        })
        .collect();
    let stopped_containers = statuses()
        .filter(|cs| {
            cs.state
                .as_ref()
                .is_some_and(|state| state.terminated.is_some() || state.waiting.is_some())
        })
        .map(|cs| cs.name.clone())
        .collect();
    let empty_dirs = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|volume| {
            let empty_dir = volume.empty_dir.as_ref()?;
            let size_limit = empty_dir
                .size_limit
                .as_ref()
                .and_then(|q| Quantity::parse(&q.0).ok());
            Some(EmptyDirStats {
                name: volume.name.clone(),
                size_limit,
                used: None,
                // Memory or HugePages: only the default medium is on the node's disk.
                memory_backed: empty_dir.medium.as_deref().is_some_and(|m| !m.is_empty()),
            })
        })
        .collect();
    let file_volumes = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|volume| {
            let plugin_dir = if volume.config_map.is_some() {
                CONFIG_MAP_DIR
            } else if volume.git_repo.is_some() {
                GIT_REPO_DIR
            } else {
                return None;
            };
            Some(FileVolume {
                name: volume.name.clone(),
                plugin_dir,
            })
        })
        .collect();
    let mut warnings = reader.warnings;
    warnings.dedup();
    Ok(NodePod {
        pod: Pod {
            namespace,
            name,
            uid: Some(uid),
            priority: spec.priority.unwrap_or(0),
            termination_grace_period_seconds: spec.termination_grace_period_seconds,
            critical: is_static_or_mirror(api),
            requests: amounts(&requests),
            limits: amounts(&limits),
            usage: Default::default(),
            containers,
            empty_dirs,
            cgroup: None,
            terminating: api.metadata.deletion_timestamp.is_some(),
        },
        qos,
        container_ids,
        stopped_containers,
        file_volumes,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, ContainerStatus, EmptyDirVolumeSource, PodSpec, PodStatus, ResourceRequirements,
        Volume,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use std::collections::BTreeMap;

    fn api_pod(annotations: &[(&str, &str)], priority: Option<i32>) -> ApiPod {
        ApiPod {
            metadata: ObjectMeta {
                name: Some("web".to_string()),
                namespace: Some("shop".to_string()),
                uid: Some("uid-1".to_string()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(PodSpec {
                priority,
                termination_grace_period_seconds: Some(45),
                containers: vec![Container {
                    name: "app".to_string(),
                    resources: Some(ResourceRequirements {
                        requests: Some(BTreeMap::from([(
                            "memory".to_string(),
                            K8sQuantity("1Gi".to_string()),
                        )])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                volumes: Some(vec![Volume {
                    name: "scratch".to_string(),
                    empty_dir: Some(EmptyDirVolumeSource {
                        size_limit: Some(K8sQuantity("500Mi".to_string())),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: Some(PodStatus {
                container_statuses: Some(vec![ContainerStatus {
                    name: "app".to_string(),
                    container_id: Some("containerd://abc123".to_string()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn converts_identity_priority_resources_and_containers() {
        let converted =
            convert_pod(&api_pod(&[("kubernetes.io/config.source", "api")], Some(7))).unwrap();
        let pod = &converted.pod;
        assert_eq!(pod.key(), "shop/web");
        assert_eq!(pod.uid.as_deref(), Some("uid-1"));
        assert_eq!(pod.priority, 7);
        assert_eq!(pod.termination_grace_period_seconds, Some(45));
        assert_eq!(pod.requests.memory, Some(1 << 30));
        assert_eq!(pod.limits.memory, None);
        assert!(!pod.is_critical());
        assert_eq!(converted.qos, QosClass::Burstable);
        assert_eq!(pod.containers.len(), 1);
        assert_eq!(pod.containers[0].name, "app");
        assert_eq!(pod.containers[0].requests.memory, Some(1 << 30));
        assert_eq!(
            converted.container_ids,
            vec![("app".to_string(), "abc123".to_string())]
        );
        let size_limit = pod.empty_dirs[0].size_limit.expect("a size limit");
        assert_eq!(size_limit.value(), 500 << 20);
        assert_eq!(size_limit.to_string(), "500Mi");
        assert!(
            !pod.empty_dirs[0].memory_backed,
            "the default medium is the disk"
        );
        assert!(!pod.has_stats(), "a spec is not stats");
        assert_eq!(
            pod.usage,
            Default::default(),
            "usage comes from cgroups, not the API"
        );
        assert!(
            converted.stopped_containers.is_empty(),
            "no state: not known stopped"
        );
    }

    /// A container whose status is terminated (a completed init container) or waiting
    /// (to start again after a crash) is stopped under the id its status gives; a running
    /// one, or one without a state, is not.
    #[test]
    fn containers_whose_status_says_they_stopped_are_known() {
        let mut pod = api_pod(&[], None);
        let state = |state: serde_json::Value| {
            serde_json::from_value::<k8s_openapi::api::core::v1::ContainerState>(state)
                .expect("a state")
        };
        let status = |name: &str, state_of: Option<k8s_openapi::api::core::v1::ContainerState>| {
            ContainerStatus {
                name: name.to_string(),
                container_id: Some(format!("containerd://{name}-id")),
                state: state_of,
                ..Default::default()
            }
        };
        let pod_status = pod.status.as_mut().expect("a status");
        pod_status.init_container_statuses = Some(vec![status(
            "init",
            Some(state(serde_json::json!({"terminated": {"exitCode": 0}}))),
        )]);
        pod_status.container_statuses = Some(vec![
            status(
                "crashing",
                Some(state(
                    serde_json::json!({"waiting": {"reason": "CrashLoopBackOff"}}),
                )),
            ),
            status(
                "app",
                Some(state(
                    serde_json::json!({"running": {"startedAt": "2026-12-07T00:00:00Z"}}),
                )),
            ),
            status("unknown", None),
            // Restarted and running again under a new id: its last run's end is history.
            status(
                "restarted",
                Some(state(
                    serde_json::json!({"running": {"startedAt": "2026-12-07T00:00:00Z"}}),
                )),
            ),
        ]);
        pod_status
            .container_statuses
            .as_mut()
            .expect("statuses")
            .last_mut()
            .expect("the restarted one")
            .last_state = Some(state(serde_json::json!({"terminated": {"exitCode": 1}})));
        // A sidecar (a restartable init container) that runs.
        pod_status
            .init_container_statuses
            .as_mut()
            .expect("init statuses")
            .push(status(
                "sidecar",
                Some(state(
                    serde_json::json!({"running": {"startedAt": "2026-12-07T00:00:00Z"}}),
                )),
            ));
        let converted = convert_pod(&pod).unwrap();
        assert_eq!(converted.stopped_containers, ["init", "crashing"]);
        assert_eq!(converted.container_ids.len(), 6, "every id is still known");
    }

    /// Only an emptyDir with the default medium is local storage (the kubelet's
    /// `IsLocalEphemeralVolume`); Memory and HugePages volumes are not.
    #[test]
    fn empty_dirs_not_on_the_default_medium_are_not_local_storage() {
        for (medium, backed) in [
            (None, false),
            (Some(""), false),
            (Some("Memory"), true),
            (Some("HugePages"), true),
            (Some("HugePages-2Mi"), true),
        ] {
            let mut api = api_pod(&[], None);
            let spec = api.spec.as_mut().unwrap();
            spec.volumes.as_mut().unwrap()[0].empty_dir = Some(EmptyDirVolumeSource {
                medium: medium.map(str::to_string),
                ..Default::default()
            });
            let pod = convert_pod(&api).unwrap().pod;
            assert_eq!(pod.empty_dirs[0].memory_backed, backed, "{medium:?}");
        }
    }

    /// The kubelet's `localVolumeNames`: a hostPath or `IsLocalEphemeralVolume` (gitRepo,
    /// emptyDir on the default medium, configMap), matched with the volume stats of its
    /// summary API, which a hostPath (`MetricsNil`) never has. So besides the emptyDirs,
    /// a pod's configMap and gitRepo volumes are its local storage, and its secret,
    /// downwardAPI, projected and hostPath volumes are not.
    #[test]
    fn config_map_and_git_repo_volumes_are_local_storage_and_no_other_kind() {
        let volume = |name: &str, source: serde_json::Value| -> Volume {
            let mut value = source;
            value["name"] = name.into();
            serde_json::from_value(value).expect("a volume")
        };
        let mut api = api_pod(&[], None);
        api.spec
            .as_mut()
            .unwrap()
            .volumes
            .as_mut()
            .unwrap()
            .extend([
                volume(
                    "settings",
                    serde_json::json!({"configMap": {"name": "app"}}),
                ),
                volume(
                    "source",
                    serde_json::json!({"gitRepo": {"repository": "r"}}),
                ),
                volume("token", serde_json::json!({"secret": {"secretName": "t"}})),
                volume("labels", serde_json::json!({"downwardAPI": {}})),
                volume("account", serde_json::json!({"projected": {"sources": []}})),
                volume(
                    "host",
                    serde_json::json!({"hostPath": {"path": "/var/log"}}),
                ),
                volume(
                    "data",
                    serde_json::json!({"persistentVolumeClaim": {"claimName": "d"}}),
                ),
            ]);
        let converted = convert_pod(&api).unwrap();
        assert_eq!(
            converted.file_volumes,
            vec![
                FileVolume {
                    name: "settings".to_string(),
                    plugin_dir: "kubernetes.io~configmap",
                },
                FileVolume {
                    name: "source".to_string(),
                    plugin_dir: "kubernetes.io~git-repo",
                },
            ]
        );
        assert_eq!(
            converted.pod.empty_dirs.len(),
            1,
            "the emptyDir stays apart"
        );
    }

    #[test]
    fn containers_keep_their_kind_and_the_format_of_their_quantities() {
        let resources = |requests: &str, limits: &str| {
            let list = |text: &str| {
                text.split_once('=').map(|(resource, amount)| {
                    BTreeMap::from([(resource.to_string(), K8sQuantity(amount.to_string()))])
                })
            };
            Some(ResourceRequirements {
                requests: list(requests),
                limits: list(limits),
                ..Default::default()
            })
        };
        let mut api = api_pod(&[], None);
        let spec = api.spec.as_mut().unwrap();
        spec.containers[0].resources = resources("memory=1G", "ephemeral-storage=40k");
        spec.init_containers = Some(vec![
            Container {
                name: "unpack".to_string(),
                ..Default::default()
            },
            Container {
                name: "proxy".to_string(),
                restart_policy: Some("Always".to_string()),
                resources: resources("memory=64Mi", ""),
                ..Default::default()
            },
        ]);
        let pod = convert_pod(&api).unwrap().pod;
        let kinds: Vec<(&str, ContainerKind)> = pod
            .containers
            .iter()
            .map(|c| (c.name.as_str(), c.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                ("unpack", ContainerKind::Init),
                ("proxy", ContainerKind::Sidecar),
                ("app", ContainerKind::Regular),
            ]
        );
        let app = &pod.containers[2];
        let shown = |q: Option<Quantity>| q.map(|q| q.to_string());
        assert_eq!(shown(app.requests.memory_quantity()).as_deref(), Some("1G"));
        assert_eq!(
            shown(app.limits.ephemeral_storage_quantity()).as_deref(),
            Some("40k")
        );
        // `GetResourceRequestQuantity` sums in the first figure's format: 1G + 64Mi.
        assert_eq!(
            shown(pod.requests.memory_quantity()).as_deref(),
            Some("1067108864")
        );
    }

    #[test]
    fn static_mirror_and_critical_pods_table() {
        type Annotations<'a> = &'a [(&'a str, &'a str)];
        let cases: [(Annotations, Option<i32>, bool); 6] = [
            (&[], None, false),
            (&[("kubernetes.io/config.source", "api")], None, false),
            (&[("kubernetes.io/config.source", "file")], None, true),
            (&[("kubernetes.io/config.source", "http")], None, true),
            (&[("kubernetes.io/config.mirror", "hash")], None, true),
            (&[], Some(2_000_000_000), true),
        ];
        for (annotations, priority, critical) in cases {
            let converted = convert_pod(&api_pod(annotations, priority)).unwrap();
            assert_eq!(
                converted.pod.is_critical(),
                critical,
                "{annotations:?} {priority:?}"
            );
        }
        assert_eq!(convert_pod(&api_pod(&[], None)).unwrap().pod.priority, 0);
    }

    #[test]
    fn the_reported_qos_class_wins_over_the_computed_one() {
        let mut pod = api_pod(&[], None);
        pod.status.as_mut().unwrap().qos_class = Some("Guaranteed".to_string());
        assert_eq!(convert_pod(&pod).unwrap().qos, QosClass::Guaranteed);
    }

    #[test]
    fn only_a_terminal_phase_is_finished() {
        let mut pod = api_pod(&[], None);
        for (phase, finished) in [
            (Some("Succeeded"), true),
            (Some("Failed"), true),
            (Some("Running"), false),
            (Some("Pending"), false),
            (Some("Unknown"), false),
            (None, false),
        ] {
            pod.status.as_mut().unwrap().phase = phase.map(str::to_string);
            assert_eq!(has_finished(&pod), finished, "{phase:?}");
        }
        pod.status = None;
        assert!(!has_finished(&pod));
    }

    #[test]
    fn terminal_pods_are_inactive_and_terminating_ones_are_marked() {
        let mut pod = api_pod(&[], None);
        assert!(is_active(&pod));
        assert!(!convert_pod(&pod).unwrap().pod.terminating);
        pod.status.as_mut().unwrap().phase = Some("Failed".to_string());
        assert!(!is_active(&pod));
        let mut pod = api_pod(&[], None);
        pod.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(is_active(&pod), "a pod being deleted may still run");
        assert!(convert_pod(&pod).unwrap().pod.terminating);
    }

    #[test]
    fn missing_identity_is_an_error_naming_the_field() {
        let mut pod = api_pod(&[], None);
        pod.metadata.uid = None;
        assert_eq!(
            convert_pod(&pod).unwrap_err().to_string(),
            "pod shop/web: metadata.uid is missing"
        );
    }
}
