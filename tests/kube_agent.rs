//! The agent on Kubernetes, end to end against the fake API server over HTTP with the
//! real kube client: pods from the watch, usage from a fake cgroup tree, evictions the
//! cluster sees, node conditions, an API outage, watch expiry, a status conflict, the
//! RBAC manifest checked against the requests the agent made, evictions that do not wait
//! behind failing bookkeeping writes, what every request says about the agent (User-Agent,
//! field manager, only its own conditions), and a dry run that writes nothing.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Event, Node, NodeCondition, NodeSpec, NodeStatus, Pod as ApiPod, Taint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use nodekeeper::agent::Agent;
use nodekeeper::kubernetes::KubeRuntime;
use nodekeeper::kubernetes::evictor::LocalKiller;
use nodekeeper::kubernetes::worker::RetryPolicy;
use nodekeeper::metrics::Metrics;
use nodekeeper::pods::Pod;
use nodekeeper::ports::CycleReport;
use nodekeeper::signals::Signal;
use support::apiserver::{FakeApiServer, RecordedRequest, RequestMatcher, eventually};
use support::fake_node::{
    Host, MI, NODE, PODS, PodFixture, api_pod, container_id, qos_dir, successful_deletes,
};

const WAIT: Duration = Duration::from_secs(10);

/// Records local kills instead of sending signals; a killed pod's fake cgroup (under
/// the cgroup root given) is left without processes, as a real kill leaves it.
#[derive(Clone, Default)]
struct KillLog(Arc<Mutex<Vec<String>>>, Option<PathBuf>);

impl LocalKiller for KillLog {
    fn kill(&mut self, pod: &Pod) -> Result<(), String> {
        self.0.lock().unwrap().push(pod.key());
        if let (Some(root), Some(cgroup)) = (&self.1, &pod.cgroup) {
            let procs = root
                .join(cgroup.strip_prefix("/").unwrap_or(cgroup))
                .join("cgroup.procs");
            std::fs::write(procs, "").map_err(|error| error.to_string())?;
        }
        Ok(())
    }
}

impl KillLog {
    fn kills(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

struct Scenario {
    server: FakeApiServer,
    host: Host,
    agent: Agent,
    kills: KillLog,
    outbox: nodekeeper::kubernetes::worker::OutboxHandle,
    /// The proxy between the agent and the API server, when the scenario has one.
    proxy: Option<support::proxy::TcpProxy>,
}

async fn scenario(extra_config: &str) -> Scenario {
    scenario_with(
        extra_config,
        RetryPolicy {
            base: Duration::from_millis(20),
            max: Duration::from_millis(200),
        },
    )
    .await
}

async fn scenario_with(extra_config: &str, retry: RetryPolicy) -> Scenario {
    scenario_through(extra_config, retry, false).await
}

/// [`scenario_with`], the agent reaching the API server through a proxy the test can
/// turn into a black hole when `proxied`.
async fn scenario_through(extra_config: &str, retry: RetryPolicy, proxied: bool) -> Scenario {
    scenario_of(extra_config, retry, proxied, Cgroups::ForEveryPod, &[]).await
}

/// Which of the listed pods have a cgroup on the scenario's host.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cgroups {
    /// [`PODS`] have theirs.
    ForEveryPod,
    /// No pod has one: the pods cgroup named wrongly, or pods without cgroups of their own.
    ForNoPod,
}

/// [`scenario_through`], with the host's pod cgroups as `cgroups` says, and `ended` (no
/// cgroup, as for a pod that ended and was cleaned up) listed beside [`PODS`].
async fn scenario_of(
    extra_config: &str,
    retry: RetryPolicy,
    proxied: bool,
    cgroups: Cgroups,
    ended: &[&PodFixture],
) -> Scenario {
    let server = FakeApiServer::start().await;
    let proxy = if proxied {
        let upstream = server.url().trim_start_matches("http://").parse().unwrap();
        Some(support::proxy::TcpProxy::start(upstream).await)
    } else {
        None
    };
    server.seed(&Node {
        metadata: ObjectMeta {
            name: Some(NODE.to_string()),
            ..Default::default()
        },
        ..Default::default()
    });
    let host = Host::new(50 * MI);
    for fixture in &PODS {
        server.seed(&api_pod(fixture));
        if cgroups == Cgroups::ForEveryPod {
            host.add_pod_cgroup(qos_dir(fixture), fixture.uid, fixture.working_set);
        }
    }
    for fixture in ended {
        server.seed(&api_pod(fixture));
    }
    let config = host.config(extra_config);
    // Built as `connect` builds it, so requests carry the agent's User-Agent.
    let url = proxy.as_ref().map_or_else(
        || server.url(),
        |proxy| format!("http://{}", proxy.address()),
    );
    let client =
        nodekeeper::kubernetes::build_client(kube::Config::new(url.parse().unwrap())).unwrap();
    let host_facts = nodekeeper::signals::Host::detect(&config.paths);
    let mut runtime = KubeRuntime::start(client, NODE.to_string(), &config, &host_facts, retry);
    let kills = KillLog(Arc::default(), Some(host.dir.path().join("cgroup")));
    runtime.set_local_killer(Some(Box::new(kills.clone())));
    runtime.wait_until_ready().await;
    let outbox = runtime.outbox();
    let cgroup_root = config.paths.cgroup_root.clone();
    let mut agent = Agent::on_host(config, host_facts, Arc::new(Metrics::new()));
    agent.integrate(runtime.integration(agent.metrics(), &cgroup_root));
    Scenario {
        server,
        host,
        agent,
        kills,
        outbox,
        proxy,
    }
}

fn pod(server: &FakeApiServer, name: &str) -> ApiPod {
    server.object::<ApiPod>("default", name).unwrap()
}

fn evicted_events(server: &FakeApiServer, pod_name: &str) -> Vec<Event> {
    server
        .objects::<Event>()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Evicted"))
        .filter(|e| e.involved_object.name.as_deref() == Some(pod_name))
        .collect()
}

fn condition(pod: &ApiPod, condition_type: &str) -> Option<(String, String)> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == condition_type)
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

#[tokio::test]
async fn memory_pressure_evicts_the_right_pod_through_the_api() {
    let mut s = scenario("").await;
    // The hog's and modest's one container each, with the pod's working set.
    for fixture in &PODS[..2] {
        s.host
            .add_container_cgroup(qos_dir(fixture), fixture.uid, fixture.working_set);
    }
    let (report, evicted) = s.agent.run_cycle().await;
    assert!(evicted, "{:?}", report.decision);
    assert_eq!(report.pods.len(), 4);
    // The containers' figures word the evicted pod's message; no other pod's are read.
    let container_memory = |name: &str| {
        let pod = report.pods.iter().find(|pod| pod.name == name).unwrap();
        pod.containers[0].usage.memory
    };
    assert_eq!(container_memory("hog"), Some(2048 * MI as i64));
    assert_eq!(container_memory("modest"), None);
    assert_eq!(
        s.kills.kills(),
        vec!["default/hog"],
        "hard threshold: killed locally at once"
    );

    let hog = eventually(WAIT, "hog deleted gracefully", || {
        let hog = pod(&s.server, "hog");
        hog.metadata.deletion_timestamp.is_some().then_some(hog)
    })
    .await;
    assert_eq!(hog.metadata.deletion_grace_period_seconds, Some(1));
    assert_eq!(
        condition(&hog, "DisruptionTarget"),
        Some(("True".to_string(), "TerminationByKubelet".to_string()))
    );
    let deletes = successful_deletes(&s.server, "hog");
    assert_eq!(deletes.len(), 1);
    let body = deletes[0].json_body().unwrap();
    assert_eq!(body["preconditions"]["uid"], "11111111-aaaa", "{body}");

    // Pod actions have their own queue, so the event may land after the delete.
    eventually(WAIT, "outbox flushed", || s.outbox.is_empty().then_some(())).await;
    let events = evicted_events(&s.server, "hog");
    assert_eq!(events.len(), 1);
    let event = &events[0];
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        event
            .message
            .as_deref()
            .unwrap_or_default()
            .starts_with("The node was low on resource: memory. "),
        "{event:?}"
    );
    // The kubelet's words for the container over its request, read from its cgroup.
    assert!(
        event.message.as_deref().unwrap_or_default().ends_with(
            "Container app was using 2Gi, request is 100Mi, has larger consumption of memory. "
        ),
        "{event:?}"
    );
    let annotations = event.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("starved_resource").map(String::as_str),
        Some("memory")
    );
    assert_eq!(
        annotations.get("offending_containers").map(String::as_str),
        Some("app")
    );
    assert_eq!(
        annotations
            .get("offending_containers_usage")
            .map(String::as_str),
        Some("2Gi")
    );
    assert_eq!(event.involved_object.uid.as_deref(), Some("11111111-aaaa"));

    let node = eventually(WAIT, "node condition", || {
        let node = s.server.object::<Node>("", NODE)?;
        let conditions = node.status.as_ref()?.conditions.clone()?;
        conditions
            .iter()
            .any(|c| c.type_ == "NodekeeperMemoryPressure" && c.status == "True")
            .then_some(conditions)
    })
    .await;
    assert_eq!(node.len(), 3, "our three conditions: {node:?}");
    eventually(WAIT, "EvictionThresholdMet event", || {
        s.server
            .objects::<Event>()
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("EvictionThresholdMet"))
            .filter(|e| e.message.as_deref() == Some("Attempting to reclaim memory"))
    })
    .await;

    // The next cycles never touch the static or the critical pod, even though they use
    // the most memory: the terminating hog is skipped and modest goes next.
    // Cycles until the watch delivers the hog's deletion and modest is chosen.
    cycles_until(&mut s.agent, 250, |_, _| {
        pod(&s.server, "modest").metadata.deletion_timestamp
    })
    .await;
    eventually(WAIT, "modest deleted", || {
        pod(&s.server, "modest").metadata.deletion_timestamp
    })
    .await;
    // Let the watch deliver modest's deletion too.
    eventually(WAIT, "outbox flushed", || s.outbox.is_empty().then_some(())).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (report, evicted) = s.agent.run_cycle().await;
    assert!(
        !evicted,
        "only critical pods are left: {:?}",
        report.decision.evictions
    );
    for protected in ["static-etcd", "dns"] {
        assert!(
            pod(&s.server, protected)
                .metadata
                .deletion_timestamp
                .is_none()
        );
        assert!(successful_deletes(&s.server, protected).is_empty());
        assert!(evicted_events(&s.server, protected).is_empty());
    }
    let kills: BTreeSet<String> = s.kills.kills().into_iter().collect();
    assert_eq!(
        kills,
        BTreeSet::from(["default/hog".to_string(), "default/modest".to_string()])
    );
}

/// PID pressure, ranked as the kubelet's `rankPIDPressure` does: by priority, then by
/// process count, largest first. The agent counts each pod's processes only when a
/// threshold ranks by them, so this is also the check that a `pid.available` threshold
/// turns the counting on: without the counts, hog and modest (the same priority) would
/// tie, and the tie goes to hog.
#[tokio::test]
async fn pid_pressure_evicts_the_pod_with_the_most_processes() {
    let mut s = scenario(
        "evictionSoft:\n  pid.available: \"1000\"\nevictionSoftGracePeriod:\n  pid.available: 0s\n",
    )
    .await;
    // No memory pressure; 4096 pids, 3500 in use.
    s.host.set_free_memory(4096 * MI);
    let proc_root = s.host.dir.path().join("proc");
    std::fs::write(proc_root.join("sys/kernel/pid_max"), "4096\n").unwrap();
    std::fs::write(proc_root.join("sys/kernel/threads-max"), "60000\n").unwrap();
    std::fs::write(proc_root.join("loadavg"), "0.10 0.20 0.30 2/3500 4321\n").unwrap();
    for (fixture, procs) in [(&PODS[0], "100\n"), (&PODS[1], "200\n201\n202\n")] {
        std::fs::write(
            s.host
                .pod_cgroup(qos_dir(fixture), fixture.uid)
                .join("cgroup.procs"),
            procs,
        )
        .unwrap();
    }
    let (report, _) = s.agent.run_cycle().await;
    let chosen: Vec<String> = report
        .decision
        .evictions
        .iter()
        .map(|order| order.key())
        .collect();
    assert_eq!(chosen, ["default/modest"], "{:?}", report.decision);
    let counts: BTreeMap<String, Option<i64>> = report
        .pods
        .iter()
        .map(|pod| (pod.name.clone(), pod.usage.pids))
        .collect();
    assert_eq!(counts["hog"], Some(1), "{counts:?}");
    assert_eq!(counts["modest"], Some(3), "{counts:?}");
    eventually(WAIT, "modest deleted", || {
        pod(&s.server, "modest").metadata.deletion_timestamp
    })
    .await;
    assert!(pod(&s.server, "hog").metadata.deletion_timestamp.is_none());
}

/// Without a `pid.available` threshold (the kubelet's defaults have none) no pod's
/// processes are counted: the cycle reads no file for them.
#[tokio::test]
async fn without_a_pid_threshold_no_pod_processes_are_counted() {
    let mut s = scenario("").await;
    s.host.set_free_memory(4096 * MI);
    let (report, _) = s.agent.run_cycle().await;
    assert_eq!(report.pods.len(), 4);
    for pod in &report.pods {
        assert!(pod.usage.memory.is_some(), "{}: {:?}", pod.name, pod.usage);
        assert_eq!(pod.usage.pids, None, "{}", pod.name);
    }
}

/// `HugepageAwareEviction` (kubelet PR #138127, on by default from 1.37): the summary
/// provider's `adjustForHugePages` takes the huge page pool out of the node's available
/// memory before the eviction manager compares it, since no memory cgroup's working set
/// (here the v2 root's `anon + file`) holds those pages. With 60 MiB really free and
/// 256 MiB of huge pages reserved, memory.available is 60 MiB, under the 100 MiB hard
/// threshold, and the agent evicts; a kubelet with the gate off sees 316 MiB and evicts
/// nothing.
#[tokio::test]
async fn a_reserved_huge_page_pool_counts_as_used_unless_the_gate_is_off() {
    for (extra, pressure) in [
        ("", true),
        ("featureGates:\n  HugepageAwareEviction: false\n", false),
    ] {
        let mut s = scenario(extra).await;
        s.host.set_memory(60 * MI, 128);
        let (report, evicted) = s.agent.run_cycle().await;
        let available = report.observations[&Signal::MemoryAvailable].available;
        let expected = if pressure { 60 * MI } else { 316 * MI };
        assert_eq!(available, expected as i64, "gate config {extra:?}");
        assert_eq!(evicted, pressure, "{extra:?}: {:?}", report.decision);
        if pressure {
            assert_eq!(report.decision.evictions[0].name, "hog");
        }
    }
}

/// Writes a PSI file with the given `full` averages (and a `some` line above them).
fn write_pressure(path: &Path, avg10: f64, avg60: f64) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(
        path,
        format!(
            "some avg10={:.2} avg60={:.2} avg300=0.00 total=100\nfull avg10={avg10:.2} avg60={avg60:.2} avg300=0.00 total=50\n",
            avg10 + 1.0,
            avg60 + 1.0
        ),
    )
    .unwrap();
}

/// The PSI contention conditions of KEP-5394, turned on: the node's memory stalls
/// (`/proc/pressure/memory`, 10% threshold) and the pods cgroup's IO stalls
/// (`io.pressure`, 20%) go onto the Node under the KEP's condition names, with the KEP's
/// "high" event and the taints; when the 60 s averages fall below, the conditions turn
/// False and the taints go. The node's IO and the pods' memory stay calm and False.
#[tokio::test]
async fn psi_contention_conditions_reach_the_node_when_turned_on() {
    let mut s = scenario(
        "  taints: true\npodsCgroup: kubepods\nsystemMemoryContentionThreshold: 0.1\nsystemDiskContentionThreshold: 0.1\nkubepodsMemoryContentionThreshold: 0.1\nkubepodsDiskContentionThreshold: 0.2\n",
    )
    .await;
    s.host.set_free_memory(4096 * MI);
    let root = s.host.dir.path().to_path_buf();
    let kubepods = root.join("cgroup/kubepods");
    for (file, text) in [
        ("memory.current", "0\n"),
        ("memory.stat", "inactive_file 0\n"),
        ("memory.max", "max\n"),
    ] {
        std::fs::write(kubepods.join(file), text).unwrap();
    }
    let set = |node_memory: (f64, f64), pods_io: (f64, f64)| {
        write_pressure(
            &root.join("proc/pressure/memory"),
            node_memory.0,
            node_memory.1,
        );
        write_pressure(&root.join("proc/pressure/io"), 0.5, 0.5);
        write_pressure(&kubepods.join("memory.pressure"), 0.0, 0.0);
        write_pressure(&kubepods.join("io.pressure"), pods_io.0, pods_io.1);
    };
    let contention = |node: &Node| -> BTreeMap<String, (String, String)> {
        let conditions = node
            .status
            .as_ref()
            .and_then(|status| status.conditions.clone());
        conditions
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.type_.contains("Contention"))
            .map(|c| (c.type_, (c.status, c.reason.unwrap_or_default())))
            .collect()
    };
    let taints = |node: &Node| -> BTreeSet<String> {
        let taints = node.spec.as_ref().and_then(|spec| spec.taints.clone());
        taints
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.key)
            .collect()
    };

    set((30.0, 15.0), (50.0, 25.0));
    let (report, evicted) = s.agent.run_cycle().await;
    assert!(!evicted, "{:?}", report.decision);
    let on = |name: &str| {
        (
            name.to_string(),
            ("True".to_string(), format!("NodekeeperHas{name}")),
        )
    };
    let off = |name: &str| {
        (
            name.to_string(),
            ("False".to_string(), format!("NodekeeperHasNo{name}")),
        )
    };
    // The conditions, then the taints, are written one after the other: the node is read
    // once both are sent.
    let node = eventually(WAIT, "contention conditions on", || {
        let node = sent_node(&s)?;
        (contention(&node).len() == 4).then_some(node)
    })
    .await;
    assert_eq!(
        contention(&node),
        BTreeMap::from([
            on("SystemMemoryContentionPressure"),
            off("SystemDiskContentionPressure"),
            off("KubepodsMemoryContentionPressure"),
            on("KubepodsDiskContentionPressure"),
        ])
    );
    assert_eq!(
        taints(&node),
        BTreeSet::from([
            "nodekeeper.io/memory-contention-pressure".to_string(),
            "nodekeeper.io/disk-contention-pressure".to_string(),
        ])
    );
    eventually(WAIT, "outbox flushed", || s.outbox.is_empty().then_some(())).await;
    let high: BTreeSet<String> = s
        .server
        .objects::<Event>()
        .into_iter()
        .filter_map(|event| event.reason)
        .filter(|reason| reason.ends_with("ContentionHigh"))
        .collect();
    assert_eq!(
        high,
        BTreeSet::from([
            "SystemMemoryContentionHigh".to_string(),
            "KubepodsDiskContentionHigh".to_string(),
        ])
    );

    // The pods cgroup's io.pressure cannot be read any more: after three cycles its
    // condition is withdrawn from the node, with its taint; the others stay.
    std::fs::remove_file(kubepods.join("io.pressure")).unwrap();
    for _ in 0..3 {
        s.agent.run_cycle().await;
    }
    let node = eventually(WAIT, "the unreadable condition withdrawn", || {
        let node = sent_node(&s)?;
        (contention(&node).len() == 3).then_some(node)
    })
    .await;
    assert!(
        !contention(&node).contains_key("KubepodsDiskContentionPressure"),
        "{:?}",
        contention(&node)
    );
    assert_eq!(
        taints(&node),
        BTreeSet::from(["nodekeeper.io/memory-contention-pressure".to_string()])
    );

    // The 60 s averages fall below the thresholds: False, and the taints go.
    set((30.0, 9.0), (50.0, 19.0));
    s.agent.run_cycle().await;
    let node = eventually(WAIT, "contention conditions off", || {
        let node = sent_node(&s)?;
        contention(&node)
            .values()
            .all(|(status, _)| status == "False")
            .then_some(node)
    })
    .await;
    assert!(taints(&node).is_empty(), "{:?}", taints(&node));
}

/// The node as the server holds it once the agent has sent every write it queued.
fn sent_node(s: &Scenario) -> Option<Node> {
    if s.outbox.is_empty() {
        s.server.object::<Node>("", NODE)
    } else {
        None
    }
}

/// Runs cycles 20 ms apart, at most `rounds` of them, until `done` finds what it waits
/// for in a cycle's report (and whether that cycle evicted); `None` if it never did.
async fn cycles_until<T>(
    agent: &mut Agent,
    rounds: usize,
    mut done: impl FnMut(&CycleReport, bool) -> Option<T>,
) -> Option<T> {
    for _ in 0..rounds {
        let (report, evicted) = agent.run_cycle().await;
        if let Some(found) = done(&report, evicted) {
            return Some(found);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Delete `name` as a rollout would, with 30 s of grace, and run cycles without pressure
/// until the agent's candidates show that its watch has delivered the deletion (`seen`).
async fn delete_gracefully_and_wait_until(
    s: &mut Scenario,
    name: &str,
    seen: impl Fn(&[Pod]) -> bool,
) {
    s.host.set_free_memory(4096 * MI);
    let client =
        nodekeeper::kubernetes::build_client(kube::Config::new(s.server.url().parse().unwrap()))
            .unwrap();
    kube::Api::<ApiPod>::namespaced(client, "default")
        .delete(
            name,
            &kube::api::DeleteParams {
                grace_period_seconds: Some(30),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    cycles_until(&mut s.agent, 250, |report, evicted| {
        assert!(!evicted, "no pressure yet: {:?}", report.decision);
        seen(&report.pods).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("the agent never saw the deletion of {name}"));
}

/// The kubelet keeps a pod whose deletion was requested among its active pods until it
/// is known terminated (`filterOutInactivePods`), so a pod a rollout is deleting, still
/// running, is ranked like any other: the hard eviction kills it and shortens its grace
/// to 1 s (a repeated delete may only shorten it). Once no process of it is left, it is
/// passed over for the next pod.
#[tokio::test]
async fn a_pod_being_deleted_that_still_runs_is_still_evicted_first() {
    let mut s = scenario("").await;
    s.host.start_pod_processes("burstable", "11111111-aaaa");
    delete_gracefully_and_wait_until(&mut s, "hog", |pods| {
        pods.iter().any(|pod| pod.name == "hog" && pod.terminating)
    })
    .await;
    assert_eq!(
        pod(&s.server, "hog").metadata.deletion_grace_period_seconds,
        Some(30)
    );
    hard_eviction_kills_hog_and_cuts_its_grace(&mut s).await;
}

/// Memory below the hard threshold: hog is evicted at once, killed locally, and its
/// pending deletion's grace is cut to 1 s (a repeated delete may only shorten it).
async fn hard_eviction_kills_hog_and_cuts_its_grace(s: &mut Scenario) {
    s.host.set_free_memory(50 * MI);
    let (report, evicted) = s.agent.run_cycle().await;
    assert!(evicted, "{:?}", report.decision);
    assert_eq!(report.decision.evictions[0].name, "hog");
    assert_eq!(s.kills.kills(), vec!["default/hog"]);
    eventually(WAIT, "hog's grace cut to 1 s", || {
        (pod(&s.server, "hog").metadata.deletion_grace_period_seconds == Some(1)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_pod_being_deleted_with_no_process_left_is_passed_over() {
    let mut s = scenario("").await;
    // The fake hog's cgroup has no process: its containers have already stopped.
    delete_gracefully_and_wait_until(&mut s, "hog", |pods| {
        pods.iter().all(|pod| pod.name != "hog")
    })
    .await;
    s.host.set_free_memory(50 * MI);
    let (report, evicted) = s.agent.run_cycle().await;
    assert!(evicted, "{:?}", report.decision);
    assert!(report.pods.iter().all(|pod| pod.name != "hog"));
    assert_eq!(s.kills.kills(), vec!["default/modest"]);
    assert_eq!(
        successful_deletes(&s.server, "hog").len(),
        1,
        "only the rollout's"
    );
}

/// A pod soft-evicted with its own 30 s of grace keeps running while it stops. The
/// kubelet waits for that kill (`killPodNow`: the grace period and half again) before its
/// eviction manager does anything else, so it never repeats the eviction meanwhile:
/// chosen again, the pod is left to its first eviction, with no second event or delete
/// and no other pod evicted in its place. A hard threshold met during that time is
/// harsher (1 s of grace) and goes ahead: the pod is killed locally and its grace cut.
#[tokio::test]
async fn a_pod_still_stopping_from_its_eviction_is_not_evicted_again() {
    let mut s = scenario(
        "evictionSoft:\n  memory.available: 200Mi\nevictionSoftGracePeriod:\n  memory.available: 1s\n",
    )
    .await;
    s.host.set_free_memory(150 * MI);
    s.agent.run_cycle().await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (report, evicted) = s.agent.run_cycle().await;
    assert!(evicted, "{:?}", report.decision);
    // Its containers are still stopping: the kubelet has 30 s to do it.
    s.host.start_pod_processes("burstable", "11111111-aaaa");
    cycles_until(&mut s.agent, 250, |report, evicted| {
        assert!(!evicted, "evicted again: {:?}", report.decision.evictions);
        assert_eq!(
            report.decision.evictions.first().map(|o| o.name.as_str()),
            Some("hog"),
            "hog is still the one to go"
        );
        let terminating = report.pods.iter().any(|p| p.name == "hog" && p.terminating);
        terminating.then_some(())
    })
    .await;
    eventually(WAIT, "outbox flushed", || s.outbox.is_empty().then_some(())).await;
    assert_eq!(successful_deletes(&s.server, "hog").len(), 1);
    assert_eq!(evicted_events(&s.server, "hog")[0].count, Some(1));
    assert!(successful_deletes(&s.server, "modest").is_empty());
    assert!(
        s.kills.kills().is_empty(),
        "a soft eviction kills nothing locally"
    );

    // Below the hard threshold now: a harsher eviction of the same pod.
    hard_eviction_kills_hog_and_cuts_its_grace(&mut s).await;
}

/// Which pod goes for nodefs pressure depends on what lives on the node filesystem, and
/// the kubelet decides that by devices (`HasDedicatedImageFs`), not by the configured
/// paths. hog has an 8 MiB writable layer and no logs, modest 2 MiB of logs. With
/// imagefsPath on the nodefs device the node has one filesystem: nodefs counts
/// writable layers too (`buildSignalToRankFunc` without an imagefs), so hog goes. With
/// imagefsPath on another filesystem the layers are there, nodefs counts logs and
/// volumes only, and modest goes.
#[tokio::test]
async fn nodefs_pressure_ranks_by_the_filesystems_the_devices_make() {
    let on_disk = "{root}/images".to_string();
    let tmpfs = require!(
        "a separate filesystem (tmpfs) at /dev/shm",
        support::real::tmpfs_dir_apart_from(&std::env::temp_dir())
    );
    for (imagefs, expected) in [
        (on_disk, "hog"),
        (tmpfs.path().display().to_string(), "modest"),
    ] {
        let mut s = scenario(&format!(
            "  writableLayerPath: {{root}}/layers/{{containerId}}/diff
imagefsPath: {imagefs}
dryRun: true
evictionSoft:
  nodefs.available: 1Ei
evictionSoftGracePeriod:
  nodefs.available: 0s
"
        ))
        .await;
        let root = s.host.dir.path().to_path_buf();
        std::fs::create_dir_all(root.join("images")).unwrap();
        s.host.set_free_memory(4096 * MI);
        let write = |dir: PathBuf, file: &str, bytes: usize| {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(file), vec![7u8; bytes]).unwrap();
        };
        let hog_layer = root
            .join("layers")
            .join(container_id("11111111-aaaa"))
            .join("diff");
        write(hog_layer, "blob", 8 << 20);
        let modest_logs = root.join("logs/default_modest_22222222-bbbb/app");
        write(modest_logs, "0.log", 2 << 20);
        // The disk walk runs in the background; a dry run decides without acting.
        let measured = |pods: &[Pod]| {
            let storage = |name: &str| {
                pods.iter()
                    .find(|pod| pod.name == name)
                    .map(|pod| pod.usage.storage)
            };
            storage("hog").is_some_and(|s| s.writable_layers.is_some())
                && storage("modest").is_some_and(|s| s.logs.is_some())
        };
        let chosen = cycles_until(&mut s.agent, 200, |report, _| {
            let first = report.decision.evictions.first();
            measured(&report.pods).then(|| first.map(|order| order.name.clone()))
        })
        .await
        .flatten();
        assert_eq!(chosen.as_deref(), Some(expected), "imagefsPath {imagefs}");
    }
}

/// A soft eviction with the kubelet's default `evictionMaxPodGracePeriod: 0`: the eviction
/// manager asks for min(0, 30) = 0 s, and the pod worker's `calculateEffectiveGracePeriod`
/// takes 0 as "no value" and uses the pod's own 30 s. Through the API that must be a
/// delete with `gracePeriodSeconds: 30`, so the pod object stays until the kubelet has
/// stopped it; a 0 would be a forced delete that removes the object at once.
#[tokio::test]
async fn a_soft_eviction_with_the_default_maximum_gives_the_pods_own_grace_not_a_forced_delete() {
    let mut s = scenario(
        "evictionSoft:\n  memory.available: 200Mi\nevictionSoftGracePeriod:\n  memory.available: 1s\n",
    )
    .await;
    // Below the soft threshold, above the hard one.
    s.host.set_free_memory(150 * MI);
    let (report, evicted) = s.agent.run_cycle().await;
    assert!(
        !evicted,
        "the grace period has only begun: {:?}",
        report.decision
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (report, evicted) = s.agent.run_cycle().await;
    assert!(evicted, "{:?}", report.decision);
    let hog = eventually(WAIT, "hog deleted gracefully", || {
        let hog = pod(&s.server, "hog");
        hog.metadata.deletion_timestamp.is_some().then_some(hog)
    })
    .await;
    assert_eq!(hog.metadata.deletion_grace_period_seconds, Some(30));
    let graces: Vec<Option<i64>> = successful_deletes(&s.server, "hog")
        .iter()
        .map(|r| r.json_body().and_then(|b| b["gracePeriodSeconds"].as_i64()))
        .collect();
    assert_eq!(graces, vec![Some(30)]);
}

#[tokio::test]
async fn an_api_outage_keeps_local_protection_and_flushes_every_action_once() {
    let mut s = scenario("").await;
    s.server.go_down().await;
    let (_, evicted) = s.agent.run_cycle().await;
    assert!(evicted, "the agent still decides from its cached pods");
    assert_eq!(
        s.kills.kills(),
        vec!["default/hog"],
        "local kill without the API"
    );
    let kinds: BTreeSet<&str> = s.outbox.pending().iter().map(|a| a.kind()).collect();
    assert!(
        kinds.is_superset(&BTreeSet::from([
            "event",
            "pod_condition",
            "pod_delete",
            "node_conditions"
        ])),
        "{kinds:?}"
    );
    // Still down, and the pressure stays: the API server still lists hog, but as the
    // kubelet's pod workers do, the agent never chooses a pod it evicted again. It moves
    // on to the next one, and down the ranking, each pod once.
    let (_, evicted) = s.agent.run_cycle().await;
    assert!(evicted);
    assert_eq!(s.kills.kills(), vec!["default/hog", "default/modest"]);
    for _ in 0..20 {
        s.agent.run_cycle().await;
    }
    let kills = s.kills.kills();
    let distinct: BTreeSet<&String> = kills.iter().collect();
    assert_eq!(
        distinct.len(),
        kills.len(),
        "each pod is evicted once, however many cycles run: {kills:?}"
    );
    // The kubelet, which never heard of the delete, starts hog's containers again: a
    // pod running again is chosen again, and killed again.
    s.host.start_pod_processes("burstable", "11111111-aaaa");
    s.agent.run_cycle().await;
    assert_eq!(
        s.kills
            .kills()
            .iter()
            .filter(|pod| *pod == "default/hog")
            .count(),
        2,
        "{:?}",
        s.kills.kills()
    );

    let pending = s.outbox.pending().len();
    s.server.come_back().await;
    let back = std::time::Instant::now();
    eventually(WAIT, "outbox flushed", || s.outbox.is_empty().then_some(())).await;
    println!(
        "{pending} queued API writes flushed {:?} after the API server came back",
        back.elapsed()
    );
    let hog = pod(&s.server, "hog");
    assert_eq!(hog.metadata.deletion_grace_period_seconds, Some(1));
    assert!(condition(&hog, "DisruptionTarget").is_some());
    // Each pod deleted once (the repeated delete merged in the outbox); one Evicted
    // event object each, counting hog's two evictions.
    for (evicted, times) in [("hog", 2), ("modest", 1)] {
        assert_eq!(
            successful_deletes(&s.server, evicted).len(),
            1,
            "{evicted} deleted once"
        );
        let events = evicted_events(&s.server, evicted);
        assert_eq!(events.len(), 1, "one Evicted event object for {evicted}");
        assert_eq!(events[0].count, Some(times), "{:?}", events[0]);
    }
}

#[tokio::test]
async fn an_api_server_that_silently_stops_answering_is_reported_unreachable_and_back() {
    // The agent reaches the API server through a proxy that can swallow every packet, as
    // a partition does: no error, no reset, the pod watch just waits.
    let probe = "  apiProbeInterval: 300ms\n  apiProbeTimeout: 200ms\n";
    let s = scenario_through(probe, RetryPolicy::default(), true).await;
    let proxy = s.proxy.as_ref().expect("the proxy");
    let reachability = s.agent.api_reachability().expect("Kubernetes mode");
    assert!(reachability.is_reachable());

    proxy.swallow();
    eventually(WAIT, "the agent to see the API server gone", || {
        (!reachability.is_reachable()).then_some(())
    })
    .await;
    proxy.mend();
    eventually(WAIT, "the agent to see the API server back", || {
        reachability.is_reachable().then_some(())
    })
    .await;
}

#[tokio::test]
async fn watch_expiry_relists_and_a_status_conflict_is_retried() {
    let mut s = scenario("").await;
    // Expire every old resourceVersion and cut the watch: the reflector must relist.
    s.host.set_free_memory(4096 * MI);
    s.server.compact_history();
    s.server.drop_watches();
    let newcomer = PodFixture {
        name: "newcomer",
        uid: "55555555-eeee",
        memory_request: Some("10Mi"),
        priority: None,
        annotations: &[],
        working_set: 3000 * MI,
    };
    s.server.seed(&api_pod(&newcomer));
    s.host
        .add_pod_cgroup("burstable", newcomer.uid, newcomer.working_set);
    let seen = cycles_until(&mut s.agent, 250, |report, _| {
        report
            .pods
            .iter()
            .any(|p| p.name == "newcomer")
            .then_some(())
    })
    .await;
    assert!(
        seen.is_some(),
        "the pod created after the expired watch is listed"
    );
    assert!(
        s.server
            .requests()
            .iter()
            .any(|r| r.path.ends_with("/pods") && !r.is_watch() && r.status == 200),
        "relisted"
    );

    // A conflicting writer on pods/status: the agent reads again and retries.
    s.server.fail_matching(
        RequestMatcher::method("PATCH").and_path("/pods/newcomer/status"),
        409,
        Some(1),
    );
    s.host.set_free_memory(50 * MI);
    let (_, evicted) = s.agent.run_cycle().await;
    assert!(evicted);
    let newcomer_pod = eventually(WAIT, "newcomer marked and deleted", || {
        let p = pod(&s.server, "newcomer");
        (condition(&p, "DisruptionTarget").is_some() && p.metadata.deletion_timestamp.is_some())
            .then_some(p)
    })
    .await;
    assert_eq!(
        condition(&newcomer_pod, "DisruptionTarget").map(|c| c.1),
        Some("TerminationByKubelet".to_string())
    );
    let conflicts = s
        .server
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/newcomer/status"))
        .map(|r| r.status)
        .collect::<Vec<_>>();
    assert_eq!(conflicts.first(), Some(&409), "{conflicts:?}");
    assert_eq!(conflicts.last(), Some(&200), "{conflicts:?}");
}

#[tokio::test]
async fn the_cluster_role_grants_exactly_what_the_agent_uses() {
    // Taints on, and a 1 s heartbeat so a repeated threshold event is aggregated (patch).
    let mut s = scenario("  taints: true\n  conditionHeartbeat: 1s\n").await;
    s.agent.run_cycle().await;
    eventually(WAIT, "first flush", || s.outbox.is_empty().then_some(())).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    s.agent.run_cycle().await;
    eventually(WAIT, "second flush", || s.outbox.is_empty().then_some(())).await;
    let node = s.server.object::<Node>("", NODE).unwrap();
    let taints = node.spec.and_then(|spec| spec.taints).unwrap_or_default();
    assert!(
        taints
            .iter()
            .any(|t| t.key == "nodekeeper.io/memory-pressure" && t.effect == "NoSchedule")
    );

    // Self-isolation reads the node's Lease (it needs a watchdog to arm, so the agent
    // here does not: its reader is asked directly).
    use nodekeeper::report::contact::LeaseSource;
    let lease = nodekeeper::kubernetes::probe::NodeLease::new(s.server.client(), NODE);
    assert_eq!(lease.renewal().await, Ok(None), "no Lease for the node yet");
    let used: BTreeSet<(String, String, String)> = s
        .server
        .rbac_accesses()
        .into_iter()
        .map(|a| (a.verb, a.group, a.resource))
        .collect();
    // What the manifest's roles give the agent's ServiceAccount through its bindings, in
    // whichever namespace (the agent's requests are compared by verb and resource).
    let granted: BTreeSet<(String, String, String)> = support::controller_rbac::granted_to(
        "agent/rbac.yaml",
        ("nodekeeper-system", "nodekeeper-agent"),
    )
    .into_iter()
    .map(|right| (right.verb, right.group, right.resource))
    .collect();
    let missing: Vec<_> = used.difference(&granted).collect();
    let unused: Vec<_> = granted.difference(&used).collect();
    assert!(missing.is_empty(), "used but not granted: {missing:?}");
    assert!(unused.is_empty(), "granted but never used: {unused:?}");
}

/// A backoff slow enough to see: five failures in a row cost 0.1 + 0.2 + 0.4 + 0.8 + 1.6 =
/// 3.1 s before the sixth attempt.
const SLOW_RETRY: RetryPolicy = RetryPolicy {
    base: Duration::from_millis(100),
    max: Duration::from_secs(10),
};
/// Well under that backoff: an eviction that waited behind it could not make this.
const PROMPT: Duration = Duration::from_millis(1500);

fn position(log: &[RecordedRequest], wanted: impl Fn(&RecordedRequest) -> bool) -> Option<usize> {
    log.iter().position(wanted)
}

fn is_hog_delete(request: &RecordedRequest) -> bool {
    request.method == "DELETE" && request.path.ends_with("/pods/hog") && request.status < 300
}

fn is_hog_condition(request: &RecordedRequest) -> bool {
    request.method == "PATCH" && request.path.ends_with("/pods/hog/status") && request.status < 300
}

/// Indices in `log` of the requests `failed` matches that the server answered with 500.
fn failures(log: &[RecordedRequest], failed: impl Fn(&RecordedRequest) -> bool) -> Vec<usize> {
    log.iter()
        .enumerate()
        .filter(|(_, r)| r.status == 500 && failed(r))
        .map(|(index, _)| index)
        .collect()
}

/// The hog's DELETE went out within [`PROMPT`] of the cycle that evicted it, after its
/// DisruptionTarget condition and before the failing bookkeeping write had used up its
/// five failures.
async fn assert_delete_overtook(
    s: &Scenario,
    started: std::time::Instant,
    failed: impl Fn(&RecordedRequest) -> bool,
) {
    eventually(PROMPT, "the hog's DELETE", || {
        position(&s.server.requests(), is_hog_delete)
    })
    .await;
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
    println!(
        "the DELETE went out {:?} after the evicting cycle began",
        started.elapsed()
    );
    let log = s.server.requests();
    let delete = position(&log, is_hog_delete).unwrap();
    let condition = position(&log, is_hog_condition).expect("DisruptionTarget was set");
    assert!(
        condition < delete,
        "DisruptionTarget goes before the delete"
    );
    let failed_before = failures(&log[..delete], &failed).len();
    assert!(
        (1..5).contains(&failed_before),
        "the delete went out while the bookkeeping write was still failing ({failed_before} failures before it)"
    );
}

#[tokio::test]
async fn failing_event_posts_do_not_delay_the_eviction() {
    let mut s = scenario_with("", SLOW_RETRY).await;
    let is_event_post = |r: &RecordedRequest| r.method == "POST" && r.path.ends_with("/events");
    s.server.fail_matching(
        RequestMatcher::method("POST").and_path("/events"),
        500,
        Some(5),
    );
    let started = std::time::Instant::now();
    let (_, evicted) = s.agent.run_cycle().await;
    assert!(evicted);
    assert_delete_overtook(&s, started, is_event_post).await;

    // The events still arrive once the server accepts them, each once.
    eventually(WAIT, "outbox flushed", || s.outbox.is_empty().then_some(())).await;
    assert_eq!(evicted_events(&s.server, "hog").len(), 1);
    assert!(
        s.server
            .objects::<Event>()
            .iter()
            .any(|e| e.reason.as_deref() == Some("EvictionThresholdMet"))
    );
    assert_eq!(failures(&s.server.requests(), is_event_post).len(), 5);
}

#[tokio::test]
async fn failing_node_status_patches_do_not_delay_the_eviction() {
    let mut s = scenario_with("", SLOW_RETRY).await;
    let is_node_status = |r: &RecordedRequest| {
        r.method == "PATCH" && r.path.ends_with(&format!("/nodes/{NODE}/status"))
    };
    s.server.fail_matching(
        RequestMatcher::method("PATCH").and_path(&format!("/nodes/{NODE}/status")),
        500,
        Some(5),
    );
    // A calm first cycle queues the node conditions, which start failing...
    s.host.set_free_memory(4096 * MI);
    let (_, evicted) = s.agent.run_cycle().await;
    assert!(!evicted);
    eventually(WAIT, "the first node status failure", || {
        (!failures(&s.server.requests(), is_node_status).is_empty()).then_some(())
    })
    .await;
    // ...and the eviction under pressure does not queue behind them.
    s.host.set_free_memory(50 * MI);
    let started = std::time::Instant::now();
    let (_, evicted) = s.agent.run_cycle().await;
    assert!(evicted);
    assert_delete_overtook(&s, started, is_node_status).await;

    eventually(WAIT, "outbox flushed", || s.outbox.is_empty().then_some(())).await;
    let node = s.server.object::<Node>("", NODE).unwrap();
    let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "NodekeeperMemoryPressure" && c.status == "True"),
        "{conditions:?}"
    );
    assert_eq!(failures(&s.server.requests(), is_node_status).len(), 5);
}

/// Requests that would change the cluster.
fn writes(server: &FakeApiServer) -> Vec<RecordedRequest> {
    server
        .requests()
        .into_iter()
        .filter(|r| matches!(r.method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE"))
        .collect()
}

#[tokio::test]
async fn dry_run_writes_nothing_to_the_cluster() {
    // Memory pressure with taints on: for real, the agent writes conditions, events, its
    // taint and the eviction.
    let mut real = scenario("  taints: true\n").await;
    real.agent.run_cycle().await;
    eventually(WAIT, "outbox flushed", || {
        real.outbox.is_empty().then_some(())
    })
    .await;
    let methods: BTreeSet<String> = writes(&real.server).into_iter().map(|r| r.method).collect();
    assert_eq!(
        methods,
        BTreeSet::from(["DELETE".into(), "PATCH".into(), "POST".into()])
    );

    let mut s = scenario("  taints: true\ndryRun: true\n").await;
    assert!(s.outbox.is_dry_run());
    for _ in 0..3 {
        s.agent.run_cycle().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        s.outbox.is_empty(),
        "nothing queued: {:?}",
        s.outbox.pending()
    );
    // Time for a sender to (wrongly) send anything it had.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let written = writes(&s.server);
    assert!(written.is_empty(), "dry run wrote: {written:?}");
    assert!(
        s.server.requests().iter().any(RecordedRequest::is_watch),
        "the pod watch goes on"
    );
    let node = s.server.object::<Node>("", NODE).unwrap();
    assert_eq!(node.spec.and_then(|spec| spec.taints), None);
    assert_eq!(node.status.and_then(|status| status.conditions), None);
    let metrics = s.agent.metrics().encode();
    for action in ["node_conditions", "node_taints", "event"] {
        // Every series exists from the start at 0; these counted what was not written.
        let series = format!("api_actions_total{{action=\"{action}\",outcome=\"dry_run\"}} ");
        let count: u64 = metrics
            .lines()
            .find_map(|line| line.split_once(&series).map(|(_, value)| value))
            .unwrap_or_else(|| panic!("{series} missing:\n{metrics}"))
            .trim()
            .parse()
            .expect("a count");
        assert!(count >= 1, "{series}{count}");
        let done = format!("api_actions_total{{action=\"{action}\",outcome=\"done\"}} 0");
        assert!(metrics.contains(&done), "{done} missing:\n{metrics}");
    }
}

fn at(rfc3339: &str) -> Time {
    Time(rfc3339.parse().unwrap())
}

fn kubelet_condition(condition_type: &str, status: &str, reason: &str) -> NodeCondition {
    NodeCondition {
        type_: condition_type.to_string(),
        status: status.to_string(),
        reason: Some(reason.to_string()),
        message: Some(format!("kubelet says {reason}")),
        last_heartbeat_time: Some(at("2026-01-01T10:00:00Z")),
        last_transition_time: Some(at("2025-12-01T00:00:00Z")),
    }
}

#[tokio::test]
async fn writes_name_the_agent_and_touch_only_its_own_conditions() {
    let mut s = scenario("  taints: true\n").await;
    let ours = [
        "NodekeeperMemoryPressure",
        "NodekeeperDiskPressure",
        "NodekeeperPIDPressure",
    ];
    // The kubelet's conditions, someone else's taint, and our memory condition as an
    // earlier run of the agent left it (already True).
    let seeded = s.server.seed(&Node {
        metadata: ObjectMeta {
            name: Some(NODE.to_string()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(vec![Taint {
                key: "example.com/dedicated".to_string(),
                effect: "NoSchedule".to_string(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![
                kubelet_condition("Ready", "True", "KubeletReady"),
                kubelet_condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                NodeCondition {
                    last_transition_time: Some(at("2025-06-01T00:00:00Z")),
                    ..kubelet_condition(ours[0], "True", "NodekeeperHasInsufficientMemory")
                },
            ]),
            ..Default::default()
        }),
    });
    let (_, evicted) = s.agent.run_cycle().await;
    assert!(evicted);
    eventually(WAIT, "outbox flushed", || s.outbox.is_empty().then_some(())).await;

    let log = s.server.requests();
    let agent = format!("nodekeeper/{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(nodekeeper::kubernetes::USER_AGENT, agent);
    for request in &log {
        assert_eq!(
            request.user_agent, agent,
            "{} {}",
            request.method, request.path
        );
    }
    let writes = writes(&s.server);
    let kinds: BTreeSet<(String, String)> = writes
        .iter()
        .map(|r| {
            (
                r.method.clone(),
                r.path.rsplit('/').next().unwrap().to_string(),
            )
        })
        .collect();
    for expected in [
        ("POST", "events"),
        ("PATCH", "status"),
        ("PATCH", NODE),
        ("DELETE", "hog"),
    ] {
        assert!(
            kinds.contains(&(expected.0.to_string(), expected.1.to_string())),
            "{expected:?} missing from {kinds:?}"
        );
    }
    // DELETE has no fieldManager: a deletion records no managed fields.
    for write in writes.iter().filter(|r| r.method != "DELETE") {
        assert_eq!(
            write.query_param("fieldManager").as_deref(),
            Some("nodekeeper"),
            "{} {}",
            write.method,
            write.path
        );
    }

    // Conditions are applied, and carry only our own condition types.
    let status_writes: Vec<&RecordedRequest> = writes
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/status"))
        .collect();
    for write in &status_writes {
        assert_eq!(
            write.content_type.as_deref(),
            Some("application/apply-patch+yaml"),
            "{}",
            write.path
        );
        assert_eq!(write.query_param("force").as_deref(), Some("true"));
        let body = write.json_body().unwrap();
        let types: Vec<&str> = body["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        let allowed: &[&str] = if write.path.contains("/pods/") {
            &["DisruptionTarget"]
        } else {
            &ours
        };
        assert!(
            !types.is_empty() && types.iter().all(|t| allowed.contains(t)),
            "{}: {types:?}",
            write.path
        );
    }
    assert!(status_writes.iter().any(|r| r.path.contains("/nodes/")));
    assert!(status_writes.iter().any(|r| r.path.contains("/pods/hog/")));

    let node = s.server.object::<Node>("", NODE).unwrap();
    let conditions = node.status.as_ref().unwrap().conditions.clone().unwrap();
    let find = |list: &[NodeCondition], t: &str| list.iter().find(|c| c.type_ == t).cloned();
    let before = seeded.status.unwrap().conditions.unwrap();
    for kubelets in ["Ready", "MemoryPressure"] {
        assert_eq!(
            serde_json::to_string(&find(&conditions, kubelets)).unwrap(),
            serde_json::to_string(&find(&before, kubelets)).unwrap(),
            "the kubelet's {kubelets} condition is untouched"
        );
    }
    let memory = find(&conditions, ours[0]).unwrap();
    assert_eq!(memory.status, "True");
    assert_eq!(
        memory.last_transition_time,
        Some(at("2025-06-01T00:00:00Z")),
        "still True since the earlier run: not a transition"
    );
    assert_ne!(memory.last_heartbeat_time, Some(at("2026-01-01T10:00:00Z")));
    assert_eq!(conditions.len(), 5, "{conditions:?}");

    let taints: Vec<String> = node
        .spec
        .unwrap()
        .taints
        .unwrap()
        .into_iter()
        .map(|t| t.key)
        .collect();
    assert_eq!(
        taints,
        vec!["example.com/dedicated", "nodekeeper.io/memory-pressure"]
    );
    let managers: BTreeSet<(String, String, String)> = node
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .map(|m| {
            (
                m.manager.unwrap_or_default(),
                m.operation.unwrap_or_default(),
                m.subresource.unwrap_or_default(),
            )
        })
        .filter(|m| m.0 == "nodekeeper")
        .collect();
    assert_eq!(
        managers,
        BTreeSet::from([
            ("nodekeeper".into(), "Apply".into(), "status".into()),
            ("nodekeeper".into(), "Update".into(), "".into()),
        ])
    );
}

/// A pod the API server lists as running, with no cgroup on the node, has no stats and is
/// evicted first, as the kubelet evicts a pod missing from its summary. Evicted for
/// memory, it freed none: while the other pods' cgroups are found, the agent must look
/// again at once (the hog goes next, not a housekeeping interval later, after the
/// kernel's OOM killer; `tests/kube_cgroup_e2e.rs` shows it on real cgroups). The timer
/// paces the next eviction when no pod's cgroup is found (an evicted pod may hold memory
/// the agent cannot see go: deciding again at once would delete one pod after another
/// before any is gone), and when the pod was evicted for disk (an ended pod's logs and
/// volumes stay until the kubelet cleans them up after the delete).
#[tokio::test]
async fn after_evicting_a_pod_without_a_cgroup_for_memory_the_agent_looks_again_at_once() {
    const ENDED: PodFixture = support::fake_node::best_effort("ended", "77777777-0000", 0);
    let retry = RetryPolicy {
        base: Duration::from_millis(20),
        max: Duration::from_millis(200),
    };
    let chosen = |report: &CycleReport| -> Vec<String> {
        let orders = &report.decision.evictions;
        orders.iter().map(|order| order.name.clone()).collect()
    };
    let mut s = scenario_of("", retry, false, Cgroups::ForEveryPod, &[&ENDED]).await;
    let (report, look_again) = s.agent.run_cycle().await;
    assert_eq!(chosen(&report), ["ended"], "{:?}", report.decision);
    assert!(
        look_again,
        "the hog waits for the timer after an eviction that freed nothing"
    );
    let (report, look_again) = s.agent.run_cycle().await;
    assert_eq!(chosen(&report), ["hog"], "{:?}", report.decision);
    assert!(look_again);

    // No pod's cgroup found: one eviction a cycle, the timer's.
    let mut s = scenario_of("", retry, false, Cgroups::ForNoPod, &[]).await;
    let mut evicted = Vec::new();
    for _ in 0..2 {
        let (report, look_again) = s.agent.run_cycle().await;
        assert_eq!(chosen(&report).len(), 1, "{:?}", report.decision);
        assert!(
            !look_again,
            "with no pod's cgroup found, an eviction is followed at once by the next: {:?}",
            report.decision
        );
        evicted.extend(chosen(&report));
    }
    evicted.sort();
    assert_eq!(
        evicted,
        ["hog", "modest"],
        "the next cycle evicts the next pod"
    );

    // Disk: the ended pod's files go only once the kubelet has cleaned them up.
    let disk = "evictionSoft:\n  nodefs.available: 1Ei\nevictionSoftGracePeriod:\n  nodefs.available: 0s\n";
    let mut s = scenario_of(disk, retry, false, Cgroups::ForEveryPod, &[&ENDED]).await;
    s.host.set_free_memory(4096 * MI);
    let (first, look_again) = cycles_until(&mut s.agent, 200, |report, look_again| {
        (!report.decision.evictions.is_empty()).then(|| (chosen(report), look_again))
    })
    .await
    .expect("an eviction for nodefs.available");
    assert_eq!(first, ["ended"]);
    assert!(
        !look_again,
        "an eviction for disk of a pod without a cgroup is followed at once by the next"
    );
}
