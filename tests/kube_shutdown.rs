//! Graceful node shutdown through the Kubernetes API: a private dbus-daemon with a fake
//! logind announces the shutdown, the fake API server holds the node and its pods, and
//! the cluster must see what the kubelet would show: the node tainted and marked, pods
//! marked `DisruptionTarget` and deleted phase by phase (lowest priority first) with the
//! phase's grace and a UID precondition, and everything undone on cancellation. Needs
//! `dbus-daemon` (Debian package `dbus`); fails under `CI=true` without it, skips with a
//! message otherwise.

#[allow(dead_code)]
mod support {
    pub mod apiserver;
    pub mod kubelet;
    pub mod logind_fake;
    pub mod netns;
    #[allow(dead_code)]
    pub mod poll;
    pub mod real;
}

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Event, Node, Pod as ApiPod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use nodekeeper::agent::service::ServiceReporter;
use nodekeeper::agent::start_shutdown_manager;
use nodekeeper::config::{AgentConfig, Overrides, from_yaml_str};
use nodekeeper::kubernetes::KubeRuntime;
use nodekeeper::kubernetes::worker::RetryPolicy;
use nodekeeper::metrics::Metrics;
use nodekeeper::signals::Host;
use nodekeeper::systemd::notify::ServiceManagerLink;
use serde_json::Value;
use support::apiserver::{FakeApiServer, eventually};
use support::logind_fake::{FakeLogind, PrivateBus, fake_state, wait_until};
use tokio::sync::watch;

const NODE: &str = "node-a";
const WAIT: Duration = Duration::from_secs(20);
const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";

/// (name, uid, priority, terminationGracePeriodSeconds, static)
type Fixture = (&'static str, &'static str, i32, i64, bool);

const PODS: [Fixture; 4] = [
    ("web", "uid-web", 0, 30, false),
    ("batch", "uid-batch", 0, 5, false),
    ("api", "uid-api", 1000, 30, false),
    ("static-etcd", "uid-etcd", 2_000_001_000, 30, true),
];

fn api_pod(&(name, uid, priority, grace, is_static): &Fixture) -> ApiPod {
    let annotations = is_static.then(|| {
        [
            ("kubernetes.io/config.source", "file"),
            ("kubernetes.io/config.mirror", "abc"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    });
    ApiPod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some("default".to_string()),
            uid: Some(uid.to_string()),
            annotations,
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(NODE.to_string()),
            priority: Some(priority),
            termination_grace_period_seconds: Some(grace),
            containers: vec![Container {
                name: "app".to_string(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".to_string()),
            ..Default::default()
        }),
    }
}

struct Cluster {
    _dir: tempfile::TempDir,
    _bus: PrivateBus,
    logind: FakeLogind,
    server: Arc<FakeApiServer>,
    stop: watch::Sender<bool>,
    tasks: Option<(tokio::task::JoinHandle<()>, tokio::task::JoinHandle<()>)>,
    kubelet: tokio::task::JoinHandle<()>,
    _runtime: KubeRuntime,
}

impl Cluster {
    /// `Err` when no private dbus-daemon can run here.
    async fn start(pods: &[Fixture]) -> Result<Cluster, String> {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter("nodekeeper=debug")
            .try_init();
        let dir = tempfile::tempdir().unwrap();
        let bus = PrivateBus::start(dir.path())?;
        let logind = FakeLogind::serve(&bus, fake_state(3600)).await;
        let server = Arc::new(FakeApiServer::start().await);
        server.seed(&Node {
            metadata: ObjectMeta {
                name: Some(NODE.to_string()),
                ..Default::default()
            },
            ..Default::default()
        });
        for fixture in pods {
            server.seed(&api_pod(fixture));
        }
        let config = config(dir.path(), &bus.address());
        let host = Host::detect(&config.paths);
        let runtime = KubeRuntime::start(
            server.client(),
            NODE.to_string(),
            &config,
            &host,
            RetryPolicy {
                base: Duration::from_millis(20),
                max: Duration::from_millis(200),
            },
        );
        runtime.wait_until_ready().await;
        let (stop, stop_rx) = watch::channel(false);
        let tasks = start_shutdown_manager(
            &config,
            Some(runtime.shutdown_hooks()),
            &host,
            Arc::new(Metrics::new()),
            None,
            &Arc::new(ServiceReporter::new(
                Arc::new(ServiceManagerLink::none()),
                true,
                false,
            )),
            stop_rx,
        );
        assert!(tasks.is_some(), "graceful shutdown is configured");
        let kubelet = tokio::spawn(fake_kubelet(Arc::clone(&server)));
        wait_until("the delay lock", || logind.held() == 1).await;
        Ok(Cluster {
            _dir: dir,
            _bus: bus,
            logind,
            server,
            stop,
            tasks,
            kubelet,
            _runtime: runtime,
        })
    }

    fn node(&self) -> Node {
        self.server.object::<Node>("", NODE).unwrap()
    }

    fn taints(&self) -> Vec<String> {
        self.node()
            .spec
            .and_then(|spec| spec.taints)
            .unwrap_or_default()
            .into_iter()
            .map(|t| format!("{}:{}", t.key, t.effect))
            .collect()
    }

    fn condition(&self) -> Option<(String, String)> {
        self.node()
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "NodekeeperShuttingDown")
            .map(|c| (c.status, c.reason.unwrap_or_default()))
    }

    fn node_events(&self, message: &str) -> usize {
        self.server
            .objects::<Event>()
            .into_iter()
            .filter(|e| {
                e.involved_object.kind.as_deref() == Some("Node")
                    && e.involved_object.name.as_deref() == Some(NODE)
                    && e.reason.as_deref() == Some("Shutdown")
                    && e.type_.as_deref() == Some("Normal")
                    && e.message.as_deref() == Some(message)
            })
            .count()
    }

    /// (pod name, grace, UID precondition) of every pod delete, in the order received.
    fn deletes(&self) -> Vec<(String, i64, String)> {
        self.server
            .requests()
            .into_iter()
            .filter(|r| r.method == "DELETE" && r.path.contains("/pods/"))
            .map(|r| {
                let body = r.json_body().unwrap_or(Value::Null);
                (
                    r.path.rsplit('/').next().unwrap().to_string(),
                    body["gracePeriodSeconds"].as_i64().unwrap_or(-1),
                    body["preconditions"]["uid"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect()
    }

    /// Pods whose status patch set DisruptionTarget with the kubelet's reason and message.
    fn disruption_targets(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .server
            .requests()
            .into_iter()
            .filter(|r| r.method == "PATCH" && r.path.ends_with("/status") && r.status < 300)
            .filter(|r| r.path.contains("/pods/"))
            .filter(|r| {
                let body = r.json_body().unwrap_or(Value::Null);
                body["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| {
                        c["type"] == "DisruptionTarget"
                            && c["status"] == "True"
                            && c["reason"] == "TerminationByKubelet"
                            && c["message"] == MESSAGE
                    })
            })
            .map(|r| {
                r.path
                    .trim_end_matches("/status")
                    .rsplit('/')
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect();
        names.sort();
        names
    }

    async fn stop(mut self) {
        self.stop.send(true).unwrap();
        if let Some((manager, publisher)) = self.tasks.take() {
            manager.await.unwrap();
            publisher.abort();
        }
        self.kubelet.abort();
    }
}

fn config(dir: &std::path::Path, bus_address: &str) -> AgentConfig {
    // The shutdown record names the boot it began in, read under procRoot.
    let random = dir.join("proc/sys/kernel/random");
    std::fs::create_dir_all(&random).unwrap();
    std::fs::write(random.join("boot_id"), "kube-shutdown-test-boot\n").unwrap();
    let root = dir.display();
    let yaml = format!(
        "apiVersion: nodekeeper.io/v1alpha1
kind: AgentConfiguration
cgroupRoot: {root}/no-cgroups
procRoot: {root}/proc
nodeName: {NODE}
dbusAddress: \"{bus_address}\"
shutdownStateFile: {root}/state/graceful_shutdown_state.json
logindDropInPath: {root}/logind.conf.d/99-nodekeeper.conf
kubernetes:
  stateFile: {root}/run/api-writes.json
shutdownGracePeriodByPodPriority:
- {{priority: 0, shutdownGracePeriodSeconds: 20}}
- {{priority: 1000, shutdownGracePeriodSeconds: 10}}
- {{priority: 2000000000, shutdownGracePeriodSeconds: 5}}
"
    );
    from_yaml_str(&yaml, "test.yaml", &Overrides::default()).unwrap()
}

/// A kubelet whose containers stop promptly, except for pods named `hang-*`.
async fn fake_kubelet(server: Arc<FakeApiServer>) {
    support::kubelet::finish_deletions(server, |pod| {
        !pod.metadata
            .name
            .as_deref()
            .unwrap_or_default()
            .starts_with("hang")
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_taints_the_node_and_deletes_pods_phase_by_phase_through_the_api() {
    let cluster = require!("a private dbus-daemon", Cluster::start(&PODS).await);
    eventually(WAIT, "the NodekeeperShuttingDown=False condition", || {
        (cluster.condition()? == ("False".into(), "NodeNotShuttingDown".into())).then_some(())
    })
    .await;
    assert!(cluster.taints().is_empty());
    assert!(cluster.deletes().is_empty());

    cluster.logind.announce(true).await;
    wait_until("the lock release after the last phase", || {
        cluster.logind.held() == 0
    })
    .await;
    eventually(WAIT, "every pod to be gone", || {
        cluster.server.objects::<ApiPod>().is_empty().then_some(())
    })
    .await;

    let deletes = cluster.deletes();
    let (low, rest) = deletes.split_at(2);
    let mut low = low.to_vec();
    low.sort();
    assert_eq!(
        low,
        vec![
            ("batch".into(), 5, "uid-batch".into()),
            ("web".into(), 20, "uid-web".into()),
        ],
        "priority 0 first; grace = min(pod, phase)"
    );
    assert_eq!(
        rest,
        [
            ("api".into(), 10, "uid-api".into()),
            ("static-etcd".into(), 5, "uid-etcd".into()),
        ],
        "then priority 1000, then the critical static pod"
    );
    assert_eq!(
        cluster.disruption_targets(),
        vec!["api", "batch", "static-etcd", "web"]
    );
    eventually(WAIT, "the shutdown taint, condition and event", || {
        (cluster.taints() == vec!["nodekeeper.io/shutting-down:NoSchedule"]
            && cluster.condition()? == ("True".into(), "NodeShutdown".into())
            && cluster.node_events("Shutdown manager detected shutdown event") == 1)
            .then_some(())
    })
    .await;
    cluster.stop().await;
}

/// A pod asking for `terminationGracePeriodSeconds: 0`: `killPods` passes the 0 on and
/// the pod worker's `calculateEffectiveGracePeriod` raises it to 1 s. Through the API
/// that is a delete with `gracePeriodSeconds: 1`, never 0, which the API server would
/// take as a forced delete that does not wait for the kubelet to stop the containers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_asking_for_no_grace_is_deleted_with_one_second_not_forced() {
    let pods: [Fixture; 1] = [("quick", "uid-quick", 0, 0, false)];
    let cluster = require!("a private dbus-daemon", Cluster::start(&pods).await);
    cluster.logind.announce(true).await;
    eventually(WAIT, "the pod to be gone", || {
        cluster.server.objects::<ApiPod>().is_empty().then_some(())
    })
    .await;
    assert_eq!(
        cluster.deletes(),
        vec![("quick".into(), 1, "uid-quick".into())]
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_shutdown_removes_the_taint_and_stops_deleting() {
    let pods: [Fixture; 2] = [
        ("hang-web", "uid-hang", 0, 30, false),
        ("api", "uid-api", 1000, 30, false),
    ];
    let cluster = require!("a private dbus-daemon", Cluster::start(&pods).await);
    cluster.logind.announce(true).await;
    eventually(WAIT, "the shutdown taint", || {
        (cluster.taints() == vec!["nodekeeper.io/shutting-down:NoSchedule"]).then_some(())
    })
    .await;
    eventually(WAIT, "the first phase's delete", || {
        (!cluster.deletes().is_empty()).then_some(())
    })
    .await;

    cluster.logind.announce(false).await;
    eventually(WAIT, "the taint removed and the condition False", || {
        (cluster.taints().is_empty()
            && cluster.condition()? == ("False".into(), "NodeNotShuttingDown".into())
            && cluster.node_events("Shutdown manager detected shutdown cancellation") == 1)
            .then_some(())
    })
    .await;
    assert_eq!(
        cluster.node_events("Shutdown manager detected shutdown event"),
        1
    );
    assert_eq!(
        cluster.deletes(),
        vec![("hang-web".into(), 20, "uid-hang".into())],
        "the later phase never starts"
    );
    assert_eq!(
        cluster.logind.held(),
        1,
        "the delay lock is kept for the next shutdown"
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_terminator_reports_missing_replaced_and_outliving_pods() {
    use nodekeeper::shutdown::plan::PlannedPod;
    use nodekeeper::shutdown::runner::{PodTerminator, Termination};
    let dir = tempfile::tempdir().unwrap();
    let server = FakeApiServer::start().await;
    server.seed(&api_pod(&("hang-web", "uid-hang", 0, 30, false)));
    let config = config(dir.path(), "unix:path=/nonexistent");
    let runtime = KubeRuntime::start(
        server.client(),
        NODE.to_string(),
        &config,
        &Host::detect(&config.paths),
        RetryPolicy::default(),
    );
    runtime.wait_until_ready().await;
    let terminator = runtime.shutdown_hooks().terminator;
    let planned = |name: &str, uid: &str| PlannedPod {
        namespace: "default".into(),
        name: name.into(),
        uid: Some(uid.into()),
        grace_period_seconds: 1,
    };
    let outcome = |pod: PlannedPod| {
        let terminator = Arc::clone(&terminator);
        async move {
            terminator
                .terminate(&pod, Duration::from_secs(1))
                .await
                .unwrap()
        }
    };
    assert_eq!(
        outcome(planned("gone", "uid-gone")).await,
        Termination::NotFound
    );
    assert_eq!(
        outcome(planned("hang-web", "uid-of-an-older-pod")).await,
        Termination::NotFound,
        "a replacement with the same name is not ours"
    );
    assert!(
        server.requests().iter().all(|r| r.method == "GET"),
        "nothing written for pods that are not there"
    );
    // Deleted, but its containers never stop: the kubelet kills it after the grace.
    assert_eq!(
        outcome(planned("hang-web", "uid-hang")).await,
        Termination::Killed
    );
    let pod = server.object::<ApiPod>("default", "hang-web").unwrap();
    assert!(pod.metadata.deletion_timestamp.is_some());
}
