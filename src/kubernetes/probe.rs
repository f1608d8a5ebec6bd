//! The agent's own check that the API server answers. The pod watch and the queued
//! writes tell only when they fail, and a partition that drops packets silently fails
//! neither for minutes: an idle watch just waits, and a quiet node writes nothing. So
//! every `kubernetes.apiProbeInterval` the agent asks the API server for `/version`
//! (readable by every client through the `system:public-info-viewer` role, so it needs
//! no permission of ours, and cheap for the server) and gives it
//! `kubernetes.apiProbeTimeout` to answer. The verdict goes where the watch's and the
//! writes' go, into the report's `apiServer`: the controller ends a node's isolation only
//! once its agent reaches the API server again, and must not be told so by a stale state.

use std::time::Duration;

use tokio::task::JoinHandle;

use crate::report::ApiReachability;

/// Starts the probe; `None` when `interval` is zero (probing turned off).
pub fn start_api_probe(
    client: kube::Client,
    reachability: ApiReachability,
    interval: Duration,
    timeout: Duration,
) -> Option<JoinHandle<()>> {
    if interval.is_zero() {
        return None;
    }
    Some(tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = true;
        loop {
            ticks.tick().await;
            let outcome = tokio::time::timeout(timeout, client.apiserver_version()).await;
            let answered = answered(&outcome);
            if answered != last {
                if answered {
                    tracing::info!("the API server answers again");
                } else {
                    tracing::warn!(
                        "the API server did not answer within {timeout:?}; reporting it unreachable"
                    );
                }
                last = answered;
            }
            reachability.saw(answered);
        }
    }))
}

/// Where the kubelets keep their node Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// The node's Lease in `kube-node-lease`, read for self-isolation: its renewals reach
/// the fence controller too, so while the agent sees them renewed, the controller hears
/// the node (see `crate::report::contact`). Needs `get` on that Lease.
pub struct NodeLease {
    leases: kube::Api<k8s_openapi::api::coordination::v1::Lease>,
    node: String,
}

impl NodeLease {
    pub fn new(client: kube::Client, node: &str) -> NodeLease {
        NodeLease {
            leases: kube::Api::namespaced(client, NODE_LEASE_NAMESPACE),
            node: node.to_string(),
        }
    }
}

impl crate::report::contact::LeaseSource for NodeLease {
    fn renewal(
        &self,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Option<String>, String>> + Send + '_>,
    > {
        Box::pin(async move {
            match self.leases.get_opt(&self.node).await {
                Ok(lease) => Ok(lease
                    .and_then(|lease| lease.spec)
                    .and_then(|spec| spec.renew_time)
                    .map(|time| time.0.to_string())),
                Err(error) => Err(format!("lease kube-node-lease/{}: {error}", self.node)),
            }
        })
    }
}

/// Whether the API server itself answered the probe in time: any answer of its own
/// counts, even a refusal; no answer, a transport error or a gateway's 502-504 does not.
fn answered<T, E>(outcome: &Result<Result<T, kube::Error>, E>) -> bool {
    match outcome {
        Err(_) => false,
        Ok(Ok(_)) => true,
        Ok(Err(error)) => super::api::answered(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(Status::failure("test", "Test").with_code(code)))
    }

    #[test]
    fn an_answer_in_time_even_a_refusal_is_reaching_the_api_server() {
        assert!(answered::<(), ()>(&Ok(Ok(()))));
        assert!(answered::<(), ()>(&Ok(Err(api(403)))));
        assert!(answered::<(), ()>(&Ok(Err(api(500)))));
    }

    #[test]
    fn no_answer_in_time_or_a_gateway_error_is_not() {
        assert!(!answered::<(), ()>(&Err(())), "timed out");
        assert!(!answered::<(), ()>(&Ok(Err(api(503)))));
        assert!(!answered::<(), ()>(&Ok(Err(
            kube::Error::LinesCodecMaxLineLengthExceeded
        ))));
    }
}
