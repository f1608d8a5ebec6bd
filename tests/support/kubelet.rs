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
use super::netns::Netns;

pub const NODE_LEASES: &str = "kube-node-lease";

/// The kubelets of a test's nodes: each renews its node's Lease every `renew` (with
/// `leaseDurationSeconds` of `duration`) until it is stopped.
pub struct Kubelets {
    renewing: Arc<Mutex<BTreeSet<String>>>,
    leases: Api<Lease>,
    renewer: Renewer,
}

/// Where the renewals run: a task of the test's runtime, or a thread of their own in the
/// nodes' network namespace.
enum Renewer {
    Task(tokio::task::JoinHandle<()>),
    /// Dropping the sender ends the thread's renewals.
    Thread {
        _stop: tokio::sync::oneshot::Sender<()>,
    },
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
        let (leases, renewing) = create_leases(server, nodes, duration).await;
        let task = tokio::spawn(renew_every(leases.clone(), renewing.clone(), renew));
        Kubelets {
            renewing,
            leases,
            renewer: Renewer::Task(task),
        }
    }

    /// The kubelets of `nodes` at the kubelet's defaults, renewing from inside `netns`
    /// through the API server's `url` as the nodes reach it: when their link is cut, the
    /// renewals stop on their own, as a real kubelet's do.
    pub async fn with_defaults_in(
        netns: &Netns,
        url: &str,
        server: &FakeApiServer,
        nodes: &[&str],
    ) -> Kubelets {
        let (leases, renewing) = create_leases(server, nodes, Duration::from_secs(40)).await;
        let uri: http::Uri = url.parse().expect("the API server's URL");
        let names = renewing.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let path = netns.path();
        // The first renewal's outcome, so a kubelet that cannot reach the API server from
        // the namespace fails the test at once instead of looking like a node cut off.
        let (started, first_renewal) = tokio::sync::oneshot::channel::<Result<(), String>>();
        std::thread::spawn(move || {
            if let Err(error) = super::netns::enter_path(&path) {
                let _ = started.send(Err(error));
                return;
            }
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the kubelets");
            runtime.block_on(async move {
                let client = kube::Client::try_from(kube::Config::new(uri)).expect("a client");
                let leases: Api<Lease> = Api::namespaced(client, NODE_LEASES);
                let renew = Duration::from_secs(10);
                let _ = started.send(renew_all(&leases, &names, renew).await);
                tokio::select! {
                    () = renew_every(leases, names, renew) => {}
                    _ = stopped => {}
                }
            });
        });
        let first = first_renewal
            .await
            .unwrap_or_else(|_| Err("the kubelets' thread ended".to_string()));
        if let Err(error) = first {
            panic!("the kubelets in {} cannot renew: {error}", netns.name());
        }
        Kubelets {
            renewing,
            leases,
            renewer: Renewer::Thread { _stop: stop },
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
        renew(&self.leases, node)
            .await
            .expect("renew the node Lease");
    }
}

impl Drop for Kubelets {
    fn drop(&mut self) {
        if let Renewer::Task(task) = &self.renewer {
            task.abort();
        }
    }
}

/// Creates the Leases of `nodes`, renewed now, through the test's own client.
async fn create_leases(
    server: &FakeApiServer,
    nodes: &[&str],
    duration: Duration,
) -> (Api<Lease>, Arc<Mutex<BTreeSet<String>>>) {
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
    let renewing = nodes.iter().map(|node| node.to_string()).collect();
    (leases, Arc::new(Mutex::new(renewing)))
}

/// Renews the Lease of every node in `names` each `renew`, forever.
async fn renew_every(leases: Api<Lease>, names: Arc<Mutex<BTreeSet<String>>>, renew: Duration) {
    loop {
        tokio::time::sleep(renew).await;
        let _ = renew_all(&leases, &names, renew).await;
    }
}

/// Renews the Lease of every node in `names` now; the last failure, if any. A renewal
/// that gets no answer `within` is given up, as the kubelet's is (it retries on its next
/// tick): a node cut off from the API server hangs no longer than that.
async fn renew_all(
    leases: &Api<Lease>,
    names: &Mutex<BTreeSet<String>>,
    within: Duration,
) -> Result<(), String> {
    let now: Vec<String> = names.lock().expect("names").iter().cloned().collect();
    let mut outcome = Ok(());
    for node in now {
        let failure = match tokio::time::timeout(within, renew(leases, &node)).await {
            Ok(Ok(())) => continue,
            Ok(Err(error)) => error.to_string(),
            Err(_) => format!("no answer within {within:?}"),
        };
        outcome = Err(format!("renewing {node}'s Lease: {failure}"));
    }
    outcome
}

/// Renews `node`'s Lease now.
async fn renew(leases: &Api<Lease>, node: &str) -> Result<(), kube::Error> {
    let patch = json!({"spec": {"renewTime": micro_time(Timestamp::now())}});
    leases
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
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
