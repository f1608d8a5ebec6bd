//! Points the report Service at the leader. Agents send their reports to one Service;
//! only the leader may hear them, because a node whose reports reached another replica
//! would look silent to the leader, and a partitioned node that still reports could be
//! taken for dead. The Service (`reports.leaderService`) has no selector; the leader
//! writes its one EndpointSlice with its own pod address as soon as it takes the Lease,
//! and keeps it so. A replica that loses the Lease writes nothing more, and the next
//! leader overwrites the slice, so it never holds two addresses. Every replica can then
//! be Ready (a rolling update and a PodDisruptionBudget work) while reports reach the
//! leader only. The slice is owned by the leader's pod, so it goes when the pod goes and
//! never sends reports to an address another pod may be given. Another EndpointSlice of
//! the Service (the Service was given a selector, or kept the slices of one it had) is
//! reported, loudly and in `nodekeeper_controller_report_service_at_leader`, not fought.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, ListParams, PostParams};
use prometheus_client::metrics::gauge::Gauge;

use super::lease::Leadership;

/// The label that ties an EndpointSlice to its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Tells the EndpointSlice controllers (and people) that we manage this slice.
const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
const MANAGED_BY: &str = "nodekeeper-controller";
/// The Service port the slice serves; the Service must name its port the same.
pub const PORT_NAME: &str = "reports";
/// How often the leader checks that the slice still points at it (someone may have
/// deleted or edited it).
const RECHECK: Duration = Duration::from_secs(10);

/// Where this replica takes reports, as the report Service should reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderEndpoint {
    /// The Service, in `namespace`.
    pub service: String,
    pub namespace: String,
    /// This pod's address (`POD_IP` from the downward API).
    pub address: IpAddr,
    /// The port the report endpoint listens on.
    pub port: u16,
    /// This pod's name (`POD_NAME`), for the endpoint's reference.
    pub pod: Option<String>,
    /// This pod's uid (`POD_UID`): the slice's owner, so it goes with the pod.
    pub pod_uid: Option<String>,
}

/// What this replica's pod is, as the downward API tells it (`POD_IP`, `POD_NAME`,
/// `POD_UID`).
#[derive(Debug, Clone, Copy, Default)]
pub struct PodEnvironment<'a> {
    pub ip: Option<&'a str>,
    pub name: Option<&'a str>,
    pub uid: Option<&'a str>,
}

impl LeaderEndpoint {
    /// The endpoint for `service` from this pod's environment, the report endpoint
    /// listening on `bound`; an error names what is missing, or why the Service could
    /// not reach this pod there.
    pub fn from_pod_environment(
        service: &str,
        namespace: &str,
        bound: SocketAddr,
        pod: PodEnvironment<'_>,
    ) -> Result<LeaderEndpoint, String> {
        let given = |value: Option<&str>| {
            value
                .map(str::trim)
                .filter(|value| !value.is_empty())
                .map(str::to_string)
        };
        let Some(pod_ip) = given(pod.ip) else {
            return Err(format!(
                "reports.leaderService {service:?} needs this pod's address in POD_IP (env: valueFrom: fieldRef: status.podIP)"
            ));
        };
        let address: IpAddr = pod_ip
            .parse()
            .map_err(|_| format!("POD_IP {pod_ip:?} is not an IP address"))?;
        // Reachable at POD_IP: listening on it, on every address of its family, or on
        // `[::]` (which takes IPv4 as well).
        let listens_there = bound.ip() == address
            || (bound.ip().is_unspecified()
                && (bound.is_ipv6() || address.is_ipv4() == bound.is_ipv4()));
        if !listens_there {
            return Err(format!(
                "reports.address {bound} does not take connections to POD_IP {address}, where reports.leaderService {service:?} sends the agents (listen on {})",
                if address.is_ipv6() { "[::]" } else { "0.0.0.0" }
            ));
        }
        Ok(LeaderEndpoint {
            service: service.to_string(),
            namespace: namespace.to_string(),
            address,
            port: bound.port(),
            pod: given(pod.name),
            pod_uid: given(pod.uid),
        })
    }

    /// The slice's name: one per Service, so a new leader replaces the old one's.
    pub fn slice_name(&self) -> String {
        format!("{}-leader", self.service)
    }

    /// The EndpointSlice that sends the Service's traffic to this replica only.
    pub fn slice(&self) -> EndpointSlice {
        let labels = BTreeMap::from([
            (SERVICE_NAME_LABEL.to_string(), self.service.clone()),
            (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
        ]);
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some(self.slice_name()),
                namespace: Some(self.namespace.clone()),
                labels: Some(labels),
                owner_references: self.owner(),
                ..ObjectMeta::default()
            },
            address_type: match self.address {
                IpAddr::V4(_) => "IPv4",
                IpAddr::V6(_) => "IPv6",
            }
            .to_string(),
            endpoints: vec![Endpoint {
                addresses: vec![self.address.to_string()],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    serving: Some(true),
                    terminating: Some(false),
                }),
                target_ref: self.pod.as_ref().map(|pod| ObjectReference {
                    kind: Some("Pod".to_string()),
                    name: Some(pod.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..ObjectReference::default()
                }),
                ..Endpoint::default()
            }],
            ports: Some(vec![EndpointPort {
                name: Some(PORT_NAME.to_string()),
                port: Some(i32::from(self.port)),
                protocol: Some("TCP".to_string()),
                app_protocol: None,
            }]),
        }
    }

    /// This pod as the slice's owner, when the downward API named it.
    fn owner(&self) -> Option<Vec<OwnerReference>> {
        let (name, uid) = (self.pod.clone()?, self.pod_uid.clone()?);
        Some(vec![OwnerReference {
            api_version: "v1".to_string(),
            kind: "Pod".to_string(),
            name,
            uid,
            ..OwnerReference::default()
        }])
    }
}

/// Whether `current` already sends the Service's traffic where `desired` does (our
/// labels among its labels, its owner, address type, endpoints and ports; metadata the
/// server owns, and labels others added, aside).
fn points_like(current: &EndpointSlice, desired: &EndpointSlice) -> bool {
    let labels = current.metadata.labels.clone().unwrap_or_default();
    let ours_kept = desired
        .metadata
        .labels
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    ours_kept
        && current.metadata.owner_references == desired.metadata.owner_references
        && current.address_type == desired.address_type
        && current.endpoints == desired.endpoints
        && current.ports == desired.ports
}

/// What one check found and did.
#[derive(Debug, Default, PartialEq, Eq)]
struct Pointing {
    /// It wrote the slice (it was missing, or pointed elsewhere).
    wrote: bool,
    /// The Service's other EndpointSlices: reports may reach other replicas through them.
    others: Vec<String>,
}

/// Makes the slice `endpoint` describes exist as described, and finds the Service's
/// other slices.
async fn ensure(
    api: &Api<EndpointSlice>,
    endpoint: &LeaderEndpoint,
) -> Result<Pointing, kube::Error> {
    let mut desired = endpoint.slice();
    let ours = endpoint.slice_name();
    let selector = format!("{SERVICE_NAME_LABEL}={}", endpoint.service);
    let slices = api.list(&ListParams::default().labels(&selector)).await?;
    let mut current = None;
    let mut others = Vec::new();
    for slice in slices {
        match slice.metadata.name.as_deref() {
            Some(name) if name == ours => current = Some(slice),
            name => others.push(name.unwrap_or_default().to_string()),
        }
    }
    let wrote = match current {
        Some(current) if points_like(&current, &desired) => false,
        Some(current) => {
            // Guarded by the version read: a write that races another leader's loses
            // (409) and is tried again at the next check.
            desired.metadata.resource_version = current.metadata.resource_version;
            api.replace(&ours, &PostParams::default(), &desired).await?;
            true
        }
        None => {
            api.create(&PostParams::default(), &desired).await?;
            true
        }
    };
    Ok(Pointing { wrote, others })
}

/// Keeps the report Service pointing at this replica while it leads. The caller aborts
/// the task when it stops leading, and the task writes nothing once its hold on the
/// Lease is no longer current, so a replica that lost the Lease never points the
/// Service back at itself. Failures are logged and retried; they never stop the
/// controller, and `at_leader` (the `report_service_at_leader` gauge) shows them.
pub async fn keep_pointing_at_us(
    client: kube::Client,
    endpoint: LeaderEndpoint,
    leadership: Arc<Leadership>,
    at_leader: Gauge,
) {
    let api: Api<EndpointSlice> = Api::namespaced(client, &endpoint.namespace);
    let mut last: Option<Result<Vec<String>, String>> = None;
    loop {
        if !leadership.is_leading() {
            at_leader.set(0);
            tokio::time::sleep(RECHECK / 5).await;
            continue;
        }
        let (wrote, now) = match ensure(&api, &endpoint).await {
            Ok(pointing) => (pointing.wrote, Ok(pointing.others)),
            Err(error) => (false, Err(error.to_string())),
        };
        let in_place = matches!(&now, Ok(others) if others.is_empty());
        at_leader.set(i64::from(in_place));
        let changed = last.as_ref() != Some(&now);
        match &now {
            Ok(_) if in_place => {
                if wrote || changed {
                    tracing::info!(service = %endpoint.service, slice = %endpoint.slice_name(), address = %endpoint.address, port = endpoint.port, "the report Service points at this replica");
                }
            }
            Ok(others) => {
                if changed {
                    tracing::error!(service = %endpoint.service, ?others, "the report Service has other EndpointSlices besides this leader's: agents' reports may reach other replicas, and their nodes look silent to this one. Remove the Service's selector and those slices");
                }
            }
            Err(error) => {
                if changed {
                    tracing::error!(service = %endpoint.service, slice = %endpoint.slice_name(), %error, "cannot point the report Service at this replica: agents' reports reach no one (or another replica), and their nodes are then judged by their Leases alone; retrying");
                }
            }
        }
        last = Some(now);
        tokio::time::sleep(if in_place { RECHECK } else { RECHECK / 5 }).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ip: &str) -> PodEnvironment<'_> {
        PodEnvironment {
            ip: Some(ip),
            name: Some("nodekeeper-controller-7d9f-abcde"),
            uid: Some("0f6a-uid"),
        }
    }

    fn any_v4() -> SocketAddr {
        "0.0.0.0:9849".parse().unwrap()
    }

    fn endpoint() -> LeaderEndpoint {
        LeaderEndpoint::from_pod_environment(
            "nodekeeper-controller",
            "nodekeeper-fencing",
            any_v4(),
            pod("10.244.1.17"),
        )
        .expect("valid")
    }

    #[test]
    fn the_slice_sends_the_service_to_this_pod_alone() {
        let slice = endpoint().slice();
        assert_eq!(
            slice.metadata.name.as_deref(),
            Some("nodekeeper-controller-leader")
        );
        assert_eq!(
            slice.metadata.labels.as_ref().unwrap()[SERVICE_NAME_LABEL],
            "nodekeeper-controller"
        );
        assert_eq!(slice.address_type, "IPv4");
        assert_eq!(slice.endpoints.len(), 1);
        assert_eq!(slice.endpoints[0].addresses, ["10.244.1.17"]);
        assert_eq!(
            slice.endpoints[0].conditions.as_ref().unwrap().ready,
            Some(true)
        );
        assert_eq!(
            slice.endpoints[0]
                .target_ref
                .as_ref()
                .and_then(|r| r.name.as_deref()),
            Some("nodekeeper-controller-7d9f-abcde")
        );
        let port = &slice.ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.name.as_deref(), port.port),
            (Some(PORT_NAME), Some(9849))
        );
        // It goes with the pod, so its address never outlives it.
        let owner = &slice.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Pod", "nodekeeper-controller-7d9f-abcde", "0f6a-uid")
        );
    }

    #[test]
    fn the_pod_address_must_be_one_the_endpoint_listens_on() {
        let at = |bound: &str, ip: &str| {
            LeaderEndpoint::from_pod_environment("svc", "ns", bound.parse().unwrap(), pod(ip))
                .map(|endpoint| endpoint.port)
        };
        assert_eq!(at("0.0.0.0:9849", "10.0.0.1"), Ok(9849));
        assert_eq!(at("10.0.0.1:9850", "10.0.0.1"), Ok(9850));
        assert_eq!(at("[::]:9849", "10.0.0.1"), Ok(9849));
        assert_eq!(at("[::]:9849", "fd00::1"), Ok(9849));
        let refused = at("0.0.0.0:9849", "fd00::1").unwrap_err();
        assert!(
            refused.contains("does not take connections to POD_IP fd00::1")
                && refused.contains("[::]"),
            "{refused}"
        );
        assert!(at("10.0.0.2:9849", "10.0.0.1").is_err());
    }

    #[test]
    fn an_ipv6_pod_gets_an_ipv6_slice() {
        let mut endpoint = endpoint();
        endpoint.address = "fd00::17".parse().unwrap();
        assert_eq!(endpoint.slice().address_type, "IPv6");
    }

    #[test]
    fn without_a_pod_address_the_error_says_how_to_give_one() {
        let missing =
            LeaderEndpoint::from_pod_environment("svc", "ns", any_v4(), PodEnvironment::default())
                .unwrap_err();
        assert!(
            missing.contains("POD_IP") && missing.contains("status.podIP"),
            "{missing}"
        );
        let wrong =
            LeaderEndpoint::from_pod_environment("svc", "ns", any_v4(), pod("pod-1")).unwrap_err();
        assert!(wrong.contains("\"pod-1\" is not an IP address"), "{wrong}");
        // Without a uid there is no owner; the slice is still written.
        let unowned = LeaderEndpoint::from_pod_environment(
            "svc",
            "ns",
            any_v4(),
            PodEnvironment {
                uid: None,
                ..pod("10.0.0.1")
            },
        )
        .unwrap();
        assert_eq!(unowned.slice().metadata.owner_references, None);
    }

    #[test]
    fn another_leaders_slice_is_replaced_and_ours_left_alone() {
        let ours = endpoint().slice();
        let mut theirs = endpoint();
        theirs.address = "10.244.2.9".parse().unwrap();
        assert!(!points_like(&theirs.slice(), &ours));
        let mut stored = ours.clone();
        stored.metadata.resource_version = Some("42".to_string());
        stored.metadata.uid = Some("u".to_string());
        stored
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".to_string(), "infra".to_string());
        assert!(
            points_like(&stored, &ours),
            "server metadata and others' labels are not a difference"
        );
        stored.metadata.labels = None;
        assert!(
            !points_like(&stored, &ours),
            "our labels tie it to the Service"
        );
    }
}
