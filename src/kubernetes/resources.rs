//! Pod-effective requests and limits and the QoS class, computed from the pod spec the
//! way the kubelet's resource helpers do: init containers run one at a time, restartable
//! init containers (sidecars) keep running beside everything started after them, pod
//! overhead is added on top of what is already non-zero, and pod-level resources replace
//! the container sums. Each total keeps the format Go's `Quantity.Add` would leave it
//! in, so messages print it as the kubelet does.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};

use crate::config::Quantity;
use crate::pods::{ContainerKind, aggregate_containers};

/// Resource name to amount, exact for every Kubernetes quantity that matters here
/// (`500m` CPU is 500,000,000 nano-units), with the format it prints in.
pub type Amounts = BTreeMap<String, Quantity>;

/// Resources pod-level `resources` may set (the rest still come from containers).
const POD_LEVEL_RESOURCES: [&str; 2] = ["cpu", "memory"];
/// The resources whose requests and limits decide the QoS class.
const QOS_RESOURCES: [&str; 2] = ["cpu", "memory"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    /// The value of `status.qosClass`.
    pub fn as_str(&self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }

    pub fn parse(text: &str) -> Option<QosClass> {
        [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ]
        .into_iter()
        .find(|class| class.as_str() == text)
    }
}

impl std::fmt::Display for QosClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A quantity the API server accepted but this crate cannot parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}[{resource:?}]: invalid quantity {value:?}")]
pub struct QuantityWarning {
    pub field: String,
    pub resource: String,
    pub value: String,
}

/// Reads quantities, collecting the ones that do not parse instead of failing the pod.
#[derive(Debug, Default)]
pub struct QuantityReader {
    pub warnings: Vec<QuantityWarning>,
}

impl QuantityReader {
    fn read(
        &mut self,
        field: &str,
        list: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    ) -> Amounts {
        let mut out = Amounts::new();
        for (resource, quantity) in list.into_iter().flatten() {
            match Quantity::parse(&quantity.0) {
                Ok(parsed) => {
                    out.insert(resource.clone(), parsed);
                }
                Err(_) => self.warnings.push(QuantityWarning {
                    field: field.to_string(),
                    resource: resource.clone(),
                    value: quantity.0.clone(),
                }),
            }
        }
        out
    }

    /// Requests and limits of one requirements block, with the API server's defaulting
    /// applied: a resource with a limit but no request requests its limit.
    pub fn requirements(
        &mut self,
        field: &str,
        requirements: Option<&ResourceRequirements>,
    ) -> (Amounts, Amounts) {
        let requests_field = format!("{field}.requests");
        let limits_field = format!("{field}.limits");
        let mut requests = self.read(
            &requests_field,
            requirements.and_then(|r| r.requests.as_ref()),
        );
        let limits = self.read(&limits_field, requirements.and_then(|r| r.limits.as_ref()));
        for (resource, limit) in &limits {
            requests.entry(resource.clone()).or_insert(*limit);
        }
        (requests, limits)
    }

    fn overhead(&mut self, spec: &PodSpec) -> Amounts {
        self.read("spec.overhead", spec.overhead.as_ref())
    }
}

/// `addResourceList`: a resource new to `total` is copied, an existing one summed.
fn add_into(total: &mut Amounts, more: &Amounts) {
    for (resource, amount) in more {
        total
            .entry(resource.clone())
            .and_modify(|sum| *sum = sum.plus(*amount))
            .or_insert(*amount);
    }
}

/// A restartable init container: `restartPolicy: Always`.
fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

#[derive(Clone, Copy)]
enum Which {
    Requests,
    Limits,
}

/// The container sum with the init-container rule, for requests or limits, each
/// resource added up by [`aggregate_containers`].
fn aggregate(reader: &mut QuantityReader, spec: &PodSpec, which: Which) -> Amounts {
    let mut pick = |field: String, container: &Container| {
        let (requests, limits) = reader.requirements(&field, container.resources.as_ref());
        match which {
            Which::Requests => requests,
            Which::Limits => limits,
        }
    };
    let mut containers: Vec<(ContainerKind, Amounts)> = Vec::new();
    for (index, container) in spec.containers.iter().enumerate() {
        let own = pick(format!("spec.containers[{index}].resources"), container);
        containers.push((ContainerKind::Regular, own));
    }
    for (index, container) in spec.init_containers.iter().flatten().enumerate() {
        let own = pick(format!("spec.initContainers[{index}].resources"), container);
        containers.push((init_kind(container), own));
    }
    let resources: BTreeSet<&String> = containers
        .iter()
        .flat_map(|(_, amounts)| amounts.keys())
        .collect();
    resources
        .into_iter()
        .filter_map(|resource| {
            let amounts = containers
                .iter()
                .map(|(kind, amounts)| (*kind, amounts.get(resource).copied()));
            Some((resource.clone(), aggregate_containers(amounts)?))
        })
        .collect()
}

/// What an init container is: a sidecar when it restarts always, else run once.
pub(super) fn init_kind(container: &Container) -> ContainerKind {
    if is_sidecar(container) {
        ContainerKind::Sidecar
    } else {
        ContainerKind::Init
    }
}

fn pod_level(reader: &mut QuantityReader, spec: &PodSpec) -> (Amounts, Amounts) {
    let (mut requests, mut limits) = reader.requirements("spec.resources", spec.resources.as_ref());
    requests.retain(|resource, _| POD_LEVEL_RESOURCES.contains(&resource.as_str()));
    limits.retain(|resource, _| POD_LEVEL_RESOURCES.contains(&resource.as_str()));
    (requests, limits)
}

/// The requests eviction ranks by (`GetResourceRequestQuantity`): the container sum
/// (init-aware), pod-level values where set, and the pod overhead only on top of a
/// request that is not zero. A pod that requests no memory keeps a memory request of 0
/// whatever its RuntimeClass's overhead, as in the kubelet.
pub fn pod_requests(reader: &mut QuantityReader, spec: &PodSpec) -> Amounts {
    let mut requests = aggregate(reader, spec, Which::Requests);
    let (pod_requests, _) = pod_level(reader, spec);
    requests.extend(pod_requests);
    for (resource, amount) in reader.overhead(spec) {
        if let Some(request) = requests.get_mut(&resource)
            && *request != Quantity::ZERO
        {
            *request = request.plus(amount);
        }
    }
    requests
}

/// `PodLimits`: like requests, but overhead is only added to resources that have a
/// limit, since a missing limit means unlimited.
pub fn pod_limits(reader: &mut QuantityReader, spec: &PodSpec) -> Amounts {
    let mut limits = aggregate(reader, spec, Which::Limits);
    let (_, pod_limits) = pod_level(reader, spec);
    limits.extend(pod_limits);
    for (resource, amount) in reader.overhead(spec) {
        if let Some(limit) = limits.get_mut(&resource) {
            *limit = limit.plus(amount);
        }
    }
    limits
}

/// `ComputePodQOS`: BestEffort without any CPU or memory request or limit, Guaranteed
/// when every container (or the pod level) limits both and requests equal limits,
/// Burstable otherwise.
pub fn compute_qos(reader: &mut QuantityReader, spec: &PodSpec) -> QosClass {
    let positive_qos = |amounts: Amounts| -> Amounts {
        amounts
            .into_iter()
            .filter(|(resource, amount)| {
                QOS_RESOURCES.contains(&resource.as_str()) && amount.is_positive()
            })
            .collect()
    };
    let mut requests = Amounts::new();
    let mut limits = Amounts::new();
    let mut guaranteed = true;
    let pod_level_set = spec.resources.as_ref().is_some_and(|r| {
        r.requests.as_ref().is_some_and(|m| !m.is_empty())
            || r.limits.as_ref().is_some_and(|m| !m.is_empty())
    });
    if pod_level_set {
        let (pod_requests, pod_limits) = pod_level(reader, spec);
        requests = positive_qos(pod_requests);
        limits = positive_qos(pod_limits);
        guaranteed = QOS_RESOURCES.iter().all(|r| limits.contains_key(*r));
    } else {
        let containers = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter());
        for container in containers {
            let (own_requests, own_limits) =
                reader.requirements("resources", container.resources.as_ref());
            let own_limits = positive_qos(own_limits);
            add_into(&mut requests, &positive_qos(own_requests));
            if !QOS_RESOURCES.iter().all(|r| own_limits.contains_key(*r)) {
                guaranteed = false;
            }
            add_into(&mut limits, &own_limits);
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return QosClass::BestEffort;
    }
    let requests_equal_limits = requests.len() == limits.len()
        && requests
            .iter()
            .all(|(resource, request)| limits.get(resource) == Some(request));
    if guaranteed && requests_equal_limits {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

    /// `"memory=1Gi,cpu=1"` as a resource list.
    fn list(text: &str) -> Option<BTreeMap<String, K8sQuantity>> {
        (!text.is_empty()).then(|| {
            text.split(',')
                .map(|pair| {
                    let (k, v) = pair.split_once('=').unwrap();
                    (k.to_string(), K8sQuantity(v.to_string()))
                })
                .collect()
        })
    }

    fn container(name: &str, requests: &str, limits: &str) -> Container {
        Container {
            name: name.to_string(),
            resources: Some(ResourceRequirements {
                requests: list(requests),
                limits: list(limits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn sidecar(name: &str, requests: &str, limits: &str) -> Container {
        Container {
            restart_policy: Some("Always".to_string()),
            ..container(name, requests, limits)
        }
    }

    fn memory(amounts: &Amounts) -> Option<i64> {
        amounts.get("memory").map(Quantity::value)
    }

    const MI: i64 = 1 << 20;

    #[test]
    fn effective_memory_requests_follow_the_init_and_sidecar_rules() {
        struct Case {
            name: &'static str,
            spec: PodSpec,
            requests: Option<i64>,
            limits: Option<i64>,
        }
        let cases = [
            Case {
                name: "sum of regular containers",
                spec: PodSpec {
                    containers: vec![
                        container("a", "memory=100Mi", ""),
                        container("b", "memory=50Mi", "memory=80Mi"),
                    ],
                    ..Default::default()
                },
                requests: Some(150 * MI),
                limits: Some(80 * MI),
            },
            Case {
                name: "a large init container dominates",
                spec: PodSpec {
                    containers: vec![container("a", "memory=100Mi", "")],
                    init_containers: Some(vec![container("init", "memory=300Mi", "")]),
                    ..Default::default()
                },
                requests: Some(300 * MI),
                limits: None,
            },
            Case {
                name: "sidecars add to the regular sum",
                spec: PodSpec {
                    containers: vec![container("a", "memory=100Mi", "")],
                    init_containers: Some(vec![sidecar("proxy", "memory=20Mi", "")]),
                    ..Default::default()
                },
                requests: Some(120 * MI),
                limits: None,
            },
            Case {
                name: "an init container after a sidecar runs beside it",
                spec: PodSpec {
                    containers: vec![container("a", "memory=100Mi", "")],
                    init_containers: Some(vec![
                        sidecar("proxy", "memory=50Mi", ""),
                        container("migrate", "memory=200Mi", ""),
                    ]),
                    ..Default::default()
                },
                requests: Some(250 * MI),
                limits: None,
            },
            Case {
                name: "an init container before the sidecar does not",
                spec: PodSpec {
                    containers: vec![container("a", "memory=100Mi", "")],
                    init_containers: Some(vec![
                        container("migrate", "memory=200Mi", ""),
                        sidecar("proxy", "memory=50Mi", ""),
                    ]),
                    ..Default::default()
                },
                requests: Some(200 * MI),
                limits: None,
            },
            Case {
                name: "overhead adds to requests, and to limits only where a limit exists",
                spec: PodSpec {
                    containers: vec![container("a", "memory=100Mi", "")],
                    overhead: list("memory=10Mi"),
                    ..Default::default()
                },
                requests: Some(110 * MI),
                limits: None,
            },
            Case {
                // `GetResourceRequestQuantity`: "Add overhead for running a pod to the
                // total requests if the resource total is non-zero".
                name: "overhead never turns no memory request into one",
                spec: PodSpec {
                    containers: vec![container("a", "cpu=1", "")],
                    overhead: list("memory=10Mi,cpu=250m"),
                    ..Default::default()
                },
                requests: None,
                limits: None,
            },
            Case {
                name: "nor an explicit zero request",
                spec: PodSpec {
                    containers: vec![container("a", "memory=0", "")],
                    overhead: list("memory=10Mi"),
                    ..Default::default()
                },
                requests: Some(0),
                limits: None,
            },
            Case {
                name: "limits default requests",
                spec: PodSpec {
                    containers: vec![container("a", "", "memory=64Mi")],
                    overhead: list("memory=1Mi"),
                    ..Default::default()
                },
                requests: Some(65 * MI),
                limits: Some(65 * MI),
            },
            Case {
                name: "pod-level resources replace the container sums",
                spec: PodSpec {
                    containers: vec![
                        container("a", "memory=100Mi", ""),
                        container("b", "memory=100Mi", ""),
                    ],
                    resources: Some(ResourceRequirements {
                        requests: list("memory=150Mi"),
                        limits: list("memory=300Mi"),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                requests: Some(150 * MI),
                limits: Some(300 * MI),
            },
            Case {
                name: "no requests at all",
                spec: PodSpec {
                    containers: vec![container("a", "", "")],
                    ..Default::default()
                },
                requests: None,
                limits: None,
            },
        ];
        for case in cases {
            let mut reader = QuantityReader::default();
            assert_eq!(
                memory(&pod_requests(&mut reader, &case.spec)),
                case.requests,
                "{} requests",
                case.name
            );
            assert_eq!(
                memory(&pod_limits(&mut reader, &case.spec)),
                case.limits,
                "{} limits",
                case.name
            );
            assert!(reader.warnings.is_empty(), "{}", case.name);
        }
    }

    #[test]
    fn ephemeral_storage_uses_the_same_rules() {
        let spec = PodSpec {
            containers: vec![container(
                "a",
                "ephemeral-storage=1Gi",
                "ephemeral-storage=2Gi",
            )],
            init_containers: Some(vec![sidecar("log", "ephemeral-storage=1Gi", "")]),
            ..Default::default()
        };
        let mut reader = QuantityReader::default();
        let requests = pod_requests(&mut reader, &spec);
        assert_eq!(
            requests.get("ephemeral-storage").map(Quantity::value),
            Some(2 << 30)
        );
        // Only the regular container has a limit: the sidecar's absence is not summed.
        let limits = pod_limits(&mut reader, &spec);
        assert_eq!(
            limits.get("ephemeral-storage").map(Quantity::value),
            Some(2 << 30)
        );
    }

    #[test]
    fn qos_class_table() {
        let cases = [
            (
                "no resources",
                vec![container("a", "", "")],
                None,
                QosClass::BestEffort,
            ),
            (
                "only a non-QoS resource",
                vec![container("a", "ephemeral-storage=1Gi", "")],
                None,
                QosClass::BestEffort,
            ),
            (
                "requests only",
                vec![container("a", "memory=1Gi", "")],
                None,
                QosClass::Burstable,
            ),
            (
                "equal cpu and memory",
                vec![container("a", "memory=1Gi,cpu=500m", "memory=1Gi,cpu=0.5")],
                None,
                QosClass::Guaranteed,
            ),
            (
                "limits only (requests default to them)",
                vec![container("a", "", "memory=1Gi,cpu=1")],
                None,
                QosClass::Guaranteed,
            ),
            (
                "memory limit only",
                vec![container("a", "", "memory=1Gi")],
                None,
                QosClass::Burstable,
            ),
            (
                "request below limit",
                vec![container("a", "memory=512Mi,cpu=1", "memory=1Gi,cpu=1")],
                None,
                QosClass::Burstable,
            ),
            (
                "one container without limits spoils guaranteed",
                vec![
                    container("a", "", "memory=1Gi,cpu=1"),
                    container("b", "memory=1Mi", ""),
                ],
                None,
                QosClass::Burstable,
            ),
            (
                "pod-level limits make it guaranteed",
                vec![container("a", "", "")],
                Some(ResourceRequirements {
                    limits: list("memory=1Gi,cpu=1"),
                    ..Default::default()
                }),
                QosClass::Guaranteed,
            ),
            (
                "pod-level memory only is burstable",
                vec![container("a", "", "memory=1Gi,cpu=1")],
                Some(ResourceRequirements {
                    requests: list("memory=1Gi"),
                    ..Default::default()
                }),
                QosClass::Burstable,
            ),
        ];
        for (name, containers, resources, expected) in cases {
            let spec = PodSpec {
                containers,
                resources,
                ..Default::default()
            };
            assert_eq!(
                compute_qos(&mut QuantityReader::default(), &spec),
                expected,
                "{name}"
            );
        }
        // Init containers count toward QoS too.
        let spec = PodSpec {
            containers: vec![container("a", "", "memory=1Gi,cpu=1")],
            init_containers: Some(vec![container("init", "memory=1Mi", "")]),
            ..Default::default()
        };
        assert_eq!(
            compute_qos(&mut QuantityReader::default(), &spec),
            QosClass::Burstable
        );
    }

    #[test]
    fn invalid_quantities_are_reported_and_skipped() {
        let spec = PodSpec {
            containers: vec![container("a", "memory=lots", "")],
            ..Default::default()
        };
        let mut reader = QuantityReader::default();
        assert_eq!(memory(&pod_requests(&mut reader, &spec)), None);
        assert_eq!(
            reader.warnings[0].to_string(),
            "spec.containers[0].resources.requests[\"memory\"]: invalid quantity \"lots\""
        );
    }
}
