//! Points the report Service at the leader. Agents send their reports to one Service;
//! only the leader may hear them, because a node whose reports reached another replica
//! would look silent to the leader, and a partitioned node that still reports could be
//! taken for dead. The Service (`reports.leaderService`) has no selector; the leader
//! writes its one EndpointSlice with its own pod address as soon as it takes the Lease,
//! and keeps it so. A replica that loses the Lease writes nothing more, and the next
//! leader overwrites the slice, so it never holds two addresses. Every replica can then
//! be Ready (a rolling update and a PodDisruptionBudget work) while reports reach the
//! leader only.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};

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
}

impl LeaderEndpoint {
    /// The endpoint for `service` from this pod's `POD_IP` and `POD_NAME`, as the
    /// downward API sets them; an error names what is missing.
    pub fn from_pod_environment(
        service: &str,
        namespace: &str,
        port: u16,
        pod_ip: Option<&str>,
        pod_name: Option<&str>,
    ) -> Result<LeaderEndpoint, String> {
        let Some(pod_ip) = pod_ip.map(str::trim).filter(|ip| !ip.is_empty()) else {
            return Err(format!(
                "reports.leaderService {service:?} needs this pod's address in POD_IP (env: valueFrom: fieldRef: status.podIP)"
            ));
        };
        let address = pod_ip
            .parse()
            .map_err(|_| format!("POD_IP {pod_ip:?} is not an IP address"))?;
        Ok(LeaderEndpoint {
            service: service.to_string(),
            namespace: namespace.to_string(),
            address,
            port,
            pod: pod_name
                .map(str::trim)
                .filter(|name| !name.is_empty())
                .map(str::to_string),
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
}

/// Whether `current` already sends the Service's traffic where `desired` does (its
/// labels, address type, endpoints and ports; metadata the server owns aside).
fn points_like(current: &EndpointSlice, desired: &EndpointSlice) -> bool {
    current.metadata.labels == desired.metadata.labels
        && current.address_type == desired.address_type
        && current.endpoints == desired.endpoints
        && current.ports == desired.ports
}

/// Makes the slice `endpoint` describes exist as described; whether it had to write.
async fn ensure(api: &Api<EndpointSlice>, endpoint: &LeaderEndpoint) -> Result<bool, kube::Error> {
    let mut desired = endpoint.slice();
    match api.get_opt(&endpoint.slice_name()).await? {
        Some(current) if points_like(&current, &desired) => Ok(false),
        Some(current) => {
            // Guarded by the version read: a write that races another leader's loses
            // (409) and is tried again at the next check.
            desired.metadata.resource_version = current.metadata.resource_version;
            api.replace(&endpoint.slice_name(), &PostParams::default(), &desired)
                .await?;
            Ok(true)
        }
        None => {
            api.create(&PostParams::default(), &desired).await?;
            Ok(true)
        }
    }
}

/// Keeps the report Service pointing at this replica while it leads (the caller aborts
/// the task when it stops leading). Failures are logged and retried; they never stop
/// the controller, which fences the same either way.
pub async fn keep_pointing_at_us(client: kube::Client, endpoint: LeaderEndpoint) {
    let api: Api<EndpointSlice> = Api::namespaced(client, &endpoint.namespace);
    let mut failing = false;
    loop {
        match ensure(&api, &endpoint).await {
            Ok(wrote) => {
                if wrote || failing {
                    tracing::info!(service = %endpoint.service, slice = %endpoint.slice_name(), address = %endpoint.address, port = endpoint.port, "the report Service points at this replica");
                }
                failing = false;
            }
            Err(error) => {
                if !failing {
                    tracing::error!(service = %endpoint.service, slice = %endpoint.slice_name(), %error, "cannot point the report Service at this replica; agents' reports may reach no one, and their nodes are then judged by their Leases alone; retrying");
                }
                failing = true;
            }
        }
        tokio::time::sleep(if failing { RECHECK / 5 } else { RECHECK }).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint() -> LeaderEndpoint {
        LeaderEndpoint::from_pod_environment(
            "nodekeeper-controller",
            "nodekeeper-fencing",
            9849,
            Some("10.244.1.17"),
            Some("nodekeeper-controller-7d9f-abcde"),
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
            LeaderEndpoint::from_pod_environment("svc", "ns", 9849, None, None).unwrap_err();
        assert!(
            missing.contains("POD_IP") && missing.contains("status.podIP"),
            "{missing}"
        );
        let wrong = LeaderEndpoint::from_pod_environment("svc", "ns", 9849, Some("pod-1"), None)
            .unwrap_err();
        assert!(wrong.contains("\"pod-1\" is not an IP address"), "{wrong}");
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
        assert!(
            points_like(&stored, &ours),
            "server metadata is not a difference"
        );
    }
}
