//! The parts of a kubelet the tests play through the API: renewing the node Leases in
//! `kube-node-lease`, and ending the graceful deletion of pods whose containers stopped.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::apiserver::FakeApiServer;

pub const NODE_LEASES: &str = "kube-node-lease";

/// The kubelets of a test's nodes: each renews its node's Lease every `renew` (with
/// `leaseDurationSeconds` of `duration`) until it is stopped.
pub struct Kubelets {
    renewing: Arc<Mutex<BTreeSet<String>>>,
    leases: Api<Lease>,
    task: tokio::task::JoinHandle<()>,
}

impl Kubelets {
    /// Every half second, `leaseDurationSeconds: 2` (two renewals fit in a second).
    pub async fn start(server: &FakeApiServer, nodes: &[&str]) -> Kubelets {
        Kubelets::with_rhythm(
            server,
            nodes,
            Duration::from_secs(2),
            Duration::from_millis(500),
        )
        .await
    }

    /// The kubelet's own defaults: a 40 s Lease renewed every 10 s.
    pub async fn with_defaults(server: &FakeApiServer, nodes: &[&str]) -> Kubelets {
        Kubelets::with_rhythm(
            server,
            nodes,
            Duration::from_secs(40),
            Duration::from_secs(10),
        )
        .await
    }

    pub async fn with_rhythm(
        server: &FakeApiServer,
        nodes: &[&str],
        duration: Duration,
        renew: Duration,
    ) -> Kubelets {
        let leases: Api<Lease> = Api::namespaced(server.client(), NODE_LEASES);
        for node in nodes {
            let lease: Lease = serde_json::from_value(json!({
                "metadata": {"name": node},
                "spec": {"holderIdentity": node, "leaseDurationSeconds": duration.as_secs(),
                         "renewTime": micro_time(Timestamp::now())}
            }))
            .expect("lease");
            leases
                .create(&PostParams::default(), &lease)
                .await
                .expect("create the node Lease");
        }
        let renewing: Arc<Mutex<BTreeSet<String>>> = Arc::new(Mutex::new(
            nodes.iter().map(|node| node.to_string()).collect(),
        ));
        let names = renewing.clone();
        let kept = leases.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(renew).await;
                let now: Vec<String> = names.lock().expect("names").iter().cloned().collect();
                for node in now {
                    let patch = json!({"spec": {"renewTime": micro_time(Timestamp::now())}});
                    let _ = leases
                        .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                }
            }
        });
        Kubelets {
            renewing,
            leases: kept,
            task,
        }
    }

    /// The node's kubelet stops renewing (it died, or lost the API server).
    pub fn stop(&self, node: &str) {
        self.renewing.lock().expect("names").remove(node);
    }

    /// The node's kubelet renews again, at once and then in its rhythm (it started, or
    /// reaches the API server again).
    pub async fn resume(&self, node: &str) {
        self.renewing
            .lock()
            .expect("names")
            .insert(node.to_string());
        let patch = json!({"spec": {"renewTime": micro_time(Timestamp::now())}});
        self.leases
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("renew the node Lease");
    }
}

impl Drop for Kubelets {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn micro_time(at: Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// Ends the graceful deletion of every deleted pod for which `stops` holds, every 20 ms,
/// as a kubelet whose containers stop promptly would. Runs until aborted.
pub async fn finish_deletions(server: Arc<FakeApiServer>, stops: fn(&Pod) -> bool) {
    loop {
        for pod in server.objects::<Pod>() {
            if pod.metadata.deletion_timestamp.is_some() && stops(&pod) {
                server.finalize::<Pod>(
                    pod.metadata.namespace.as_deref().unwrap_or_default(),
                    pod.metadata.name.as_deref().unwrap_or_default(),
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
