//! The API server out for minutes while the node is under memory pressure: the agent
//! binary, in Kubernetes mode on a fake node, against the fake API server behind a proxy,
//! through three outages of 40 s each, one after the other:
//!
//! 1. every request answered 500, the pod watch included (cut, and refused each time it
//!    starts again: the agent knows only the pods it listed before);
//! 2. every packet swallowed, then the partition heals for new connections only: the
//!    connections it swallowed stay open and silent for good, as those to an API server
//!    instance that went away without a reset do;
//! 3. every connection refused, the watch history compacted meanwhile, and a pod bound to
//!    the node while the server was out.
//!
//! In each the pressure comes and the agent evicts the largest pod locally, at once,
//! without the API. Once the server is back every write it owed is sent, each once:
//! one delete per evicted pod, one Evicted event, its `DisruptionTarget`, the node's
//! memory condition as it stands (False again); nothing is dropped. After the second and
//! third the agent sees the pods bound to the node meanwhile, and the next pressure
//! evicts the one the kubelet would choose, not a pod from a stale list.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Pod as ApiPod};
use support::agent_process::{AgentProcess, http_get};
use support::apiserver::{FakeApiServer, RequestMatcher};
use support::controller::metric_value;
use support::fake_node::{
    Host, MI, PodFixture, PodProcess, best_effort, node_condition, pods_listed, seed_node,
    successful_deletes,
};
use support::process_usage::status_kib;
use support::proxy::TcpProxy;

/// How long each outage lasts.
const OUTAGE: Duration = Duration::from_secs(40);
/// How long the agent may take to send what it owes once the API server is back, and to
/// see the pods bound meanwhile: the probe's default interval (10 s) and timeout (5 s),
/// and the sender's longest backoff (10 s), with room to spare.
const RECOVERY: Duration = Duration::from_secs(30);

/// The agent's log line for each eviction it decides.
const EVICTED: &str = "nodekeeper::agent::cycle: evicted pod";

/// How long a pod bound to the node is given to reach the agent through its watch.
const WATCH_DELIVERY: Duration = Duration::from_secs(3);

/// BestEffort pods, evicted largest first.
const WAVE_1: PodFixture = best_effort("wave-1", "0000000a-0001", 3000);
const WAVE_2: PodFixture = best_effort("wave-2", "0000000a-0002", 2500);
const WAVE_3: PodFixture = best_effort("wave-3", "0000000a-0003", 2000);
const WAVE_4: PodFixture = best_effort("wave-4", "0000000a-0004", 1500);
/// Bound to the node after the second outage, while the agent's watch is stranded.
const LATE_A: PodFixture = best_effort("late-a", "0000000b-000a", 4000);
/// Bound to the node during the third outage.
const LATE_B: PodFixture = best_effort("late-b", "0000000b-000b", 4000);

struct Outage {
    server: FakeApiServer,
    proxy: TcpProxy,
    host: Host,
    agent: AgentProcess,
    /// The pods evicted, in order.
    evicted: Vec<String>,
    /// A process of this test's own in each pod's cgroup, by pod name: the agent's
    /// local kill signals it, and then waits for its cgroup to empty.
    processes: BTreeMap<&'static str, PodProcess>,
}

impl Outage {
    async fn start() -> Outage {
        let server = FakeApiServer::start().await;
        let upstream = server.url().trim_start_matches("http://").parse().unwrap();
        let proxy = TcpProxy::start(upstream).await;
        seed_node(&server);
        let host = Host::new(4096 * MI);
        let config = host.dir.path().join("agent.yaml");
        // The probe and the sender's backoff at their defaults, as operators run them.
        std::fs::write(
            &config,
            host.yaml("housekeepingInterval: 1s\nevictionPressureTransitionPeriod: 5s\n"),
        )
        .unwrap();
        let kubeconfig = host.dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            server
                .kubeconfig_yaml()
                .replace(&server.url(), &format!("http://{}", proxy.address())),
        )
        .unwrap();
        // The pods are on the node before the agent starts, so that its first list holds
        // them all: one bound later reaches it only through its watch, which the first
        // outage may find failing.
        let mut processes = BTreeMap::new();
        for fixture in [&WAVE_1, &WAVE_2, &WAVE_3, &WAVE_4] {
            processes.insert(fixture.name, host.bind_running(&server, fixture));
        }
        let agent = AgentProcess::start_in_kubernetes(&config, &kubeconfig);
        let outage = Outage {
            server,
            proxy,
            host,
            agent,
            evicted: Vec::new(),
            processes,
        };
        // Steady first: the pods listed, the node's conditions published.
        outage
            .until(RECOVERY, "the node's pods listed", |o| {
                pods_listed(&o.server).then_some(())
            })
            .await;
        outage
            .until(RECOVERY, "the node's conditions published", |o| {
                (memory_pressure(&o.server).as_deref() == Some("False")).then_some(())
            })
            .await;
        outage
    }

    /// Binds `fixture` to the node while the agent runs.
    fn bind(&mut self, fixture: &'static PodFixture) {
        let process = self.host.bind_running(&self.server, fixture);
        self.processes.insert(fixture.name, process);
    }

    /// Memory pressure until the agent evicts a pod, which it names; then the memory
    /// comes back and the pod's cgroup empties, as they do once its processes are gone.
    async fn pressure_evicts(&mut self) -> String {
        self.host.set_free_memory(50 * MI);
        let evicted =
            support::poll::Wait::for_("an eviction under pressure", Duration::from_secs(20))
                .showing(|| format!("log:\n{}", self.log()))
                .eventually(|| {
                    self.agent
                        .lines_so_far()
                        .into_iter()
                        .find(|line| line.contains(EVICTED))
                })
                .await;
        let pod = field(&evicted, "pod").unwrap_or_else(|| panic!("no pod in {evicted:?}"));
        self.host.set_free_memory(4096 * MI);
        let fixture = [&WAVE_1, &WAVE_2, &WAVE_3, &WAVE_4, &LATE_A, &LATE_B]
            .into_iter()
            .find(|fixture| pod == format!("default/{}", fixture.name))
            .unwrap_or_else(|| panic!("{pod} is no pod of this test"));
        let procs = self
            .host
            .pod_cgroup("besteffort", fixture.uid)
            .join("cgroup.procs");
        std::fs::write(procs, "").unwrap();
        self.evicted.push(pod.clone());
        pod
    }

    /// Waits until `check` holds, at most `within`; fails naming `what` with the log.
    async fn until<T>(
        &self,
        within: Duration,
        what: &str,
        mut check: impl FnMut(&Outage) -> Option<T>,
    ) -> T {
        support::poll::Wait::for_(what, within)
            .every(Duration::from_millis(50))
            .showing(|| format!("agent log:\n{}", self.log()))
            .eventually(|| check(self))
            .await
    }

    /// Waits until every write owed for the pods evicted so far is on the server: each
    /// deleted once, marked `DisruptionTarget`, one Evicted event; the node's memory
    /// condition False again, and the agent's outbox empty. Returns how long it took.
    async fn flushed(&self) -> Duration {
        let back = Instant::now();
        self.until(RECOVERY, "every write owed sent", |o| {
            o.evicted
                .iter()
                .all(|pod| {
                    let name = pod.trim_start_matches("default/");
                    !successful_deletes(&o.server, name).is_empty()
                        && has_disruption_target(&o.server, name)
                        && evicted_events(&o.server, name).len() == 1
                })
                .then_some(())
                .filter(|()| memory_pressure(&o.server).as_deref() == Some("False"))
                .filter(|()| metric(&o.agent, "nodekeeper_api_outbox_pending") == Some(0.0))
        })
        .await;
        back.elapsed()
    }

    fn log(&self) -> String {
        self.agent.whole_log().join("\n")
    }
}

/// `name=value` (or `name="value"`) from a log line.
fn field(line: &str, name: &str) -> Option<String> {
    let start = line.find(&format!(" {name}="))? + name.len() + 2;
    let rest = &line[start..];
    let value = rest.split_whitespace().next()?;
    Some(value.trim_matches('"').to_string())
}

fn memory_pressure(server: &FakeApiServer) -> Option<String> {
    node_condition(server, "NodekeeperMemoryPressure")
}

fn has_disruption_target(server: &FakeApiServer, pod: &str) -> bool {
    server
        .object::<ApiPod>("default", pod)
        .and_then(|pod| pod.status?.conditions)
        .unwrap_or_default()
        .iter()
        .any(|condition| condition.type_ == "DisruptionTarget")
}

/// The Evicted event objects about `pod`.
fn evicted_events(server: &FakeApiServer, pod: &str) -> Vec<Event> {
    server
        .objects::<Event>()
        .into_iter()
        .filter(|event| event.involved_object.name.as_deref() == Some(pod))
        .filter(|event| event.reason.as_deref() == Some("Evicted"))
        .collect()
}

/// The value of the series `series` (a name with its labels, as exported) on the agent's
/// `/metrics`.
fn metric(agent: &AgentProcess, series: &str) -> Option<f64> {
    metric_value(&http_get(&agent.address, "/metrics").1, series)
}

/// Every `nodekeeper_api_actions_total` series with its value, by its labels.
fn api_actions(agent: &AgentProcess) -> BTreeMap<String, f64> {
    let (_, body) = http_get(&agent.address, "/metrics");
    body.lines()
        .filter_map(|line| line.strip_prefix("nodekeeper_api_actions_total"))
        .filter_map(|rest| {
            let (labels, value) = rest.rsplit_once(' ')?;
            Some((labels.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The agent's resident memory, from `/proc/PID/status`.
fn resident_kib(agent: &AgentProcess) -> u64 {
    status_kib(agent.child.id(), "VmRSS:")
}

/// Holds until `OUTAGE` has passed since `began`.
async fn rest_of_outage(began: Instant) {
    if let Some(left) = OUTAGE.checked_sub(began.elapsed()) {
        tokio::time::sleep(left).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_outages_of_minutes_keep_the_node_protected_and_lose_no_write() {
    let mut o = Outage::start().await;
    let resident_before = resident_kib(&o.agent);

    // 1. Every request answered 500, the watch included: it is cut, and each time it
    //    starts again it is answered 500.
    let began = Instant::now();
    o.server.fail_matching(RequestMatcher::any(), 500, None);
    o.server.drop_watches();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(o.pressure_evicts().await, "default/wave-1");
    rest_of_outage(began).await;
    o.server.clear_failures();
    let after_errors = o.flushed().await;

    // 2. Every packet swallowed; then new connections pass, old ones stay silent.
    let began = Instant::now();
    o.proxy.swallow();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(o.pressure_evicts().await, "default/wave-2");
    rest_of_outage(began).await;
    o.proxy.heal_stranding();
    let after_silence = o.flushed().await;
    // Sent again once the probe heard the server, not 30 s after it was sent.
    assert!(
        o.log().contains("abandoned: the API server answers again"),
        "no write was sent again on the server's return:\n{}",
        o.log()
    );
    // A pod bound to the node now is the largest: the kubelet would evict it first. A
    // watch that works delivers it in milliseconds.
    o.bind(&LATE_A);
    tokio::time::sleep(WATCH_DELIVERY).await;
    assert_eq!(o.pressure_evicts().await, "default/late-a");
    o.flushed().await;

    // 3. Every connection refused; the history compacted and a pod bound meanwhile.
    let began = Instant::now();
    o.server.go_down().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(o.pressure_evicts().await, "default/wave-3");
    o.server.compact_history();
    o.bind(&LATE_B);
    rest_of_outage(began).await;
    o.server.come_back().await;
    let after_refusals = o.flushed().await;
    tokio::time::sleep(WATCH_DELIVERY).await;
    assert_eq!(o.pressure_evicts().await, "default/late-b");
    o.flushed().await;

    let resident_after = resident_kib(&o.agent);
    let actions = api_actions(&o.agent);
    let log = o.log();
    println!(
        "writes owed flushed {after_errors:?} after the 500s ended, {after_silence:?} after the \
         silence healed, {after_refusals:?} after the server came back; resident memory \
         {resident_before} KiB before, {resident_after} KiB after"
    );
    // Each pod evicted once, in the kubelet's order; each deleted once, one event each.
    assert_eq!(
        o.evicted,
        ["wave-1", "wave-2", "late-a", "wave-3", "late-b"].map(|pod| format!("default/{pod}")),
        "{log}"
    );
    assert_eq!(log.matches(EVICTED).count(), 5, "{log}");
    for pod in &o.evicted {
        let name = pod.trim_start_matches("default/");
        assert_eq!(successful_deletes(&o.server, name).len(), 1, "{pod}\n{log}");
        let events = evicted_events(&o.server, name);
        assert_eq!(events.len(), 1, "{pod}: {events:?}");
        assert_eq!(events[0].count, Some(1), "{pod}: {events:?}");
    }
    assert!(
        successful_deletes(&o.server, "wave-4").is_empty(),
        "wave-4 was never the largest"
    );
    // Nothing dropped, nothing refused for good.
    assert!(
        actions
            .iter()
            .any(|(labels, value)| labels.contains("outcome=\"done\"") && *value > 0.0),
        "no writes counted done: {actions:?}"
    );
    for (labels, value) in &actions {
        if labels.contains("outcome=\"dropped\"") || labels.contains("outcome=\"rejected\"") {
            assert_eq!(*value, 0.0, "{labels}: {actions:?}");
        }
    }
    assert!(
        resident_after < resident_before + 16 * 1024,
        "resident memory grew from {resident_before} KiB to {resident_after} KiB"
    );
    let status = o.agent.stop(Duration::from_secs(20));
    assert!(status.success(), "agent exited with {status}:\n{log}");
}
