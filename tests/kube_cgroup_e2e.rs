//! Kubernetes mode end to end on this machine's real cgroup v1 memory and freezer
//! hierarchies: the agent binary, told of its node's pods by the test API server, finds
//! their cgroups where the kubelet makes them (`kubepods/<qos>/pod<uid>/<container>` with
//! the cgroupfs driver, nested slices and a container scope with the systemd driver,
//! under a parent this test owns; the driver detected from the tree, as the agent does
//! when none is configured), measures them, kills the pod the
//! kubelet's ranking picks before the kernel's OOM killer fires, and deletes it through
//! the API; also while another pod's cgroup comes and goes between the agent's listing
//! and its reads, as a pod's does when it ends and is cleaned up before the API server
//! hears of it.
//!
//! Needs root and the v1 memory and freezer hierarchies (fails under `CI=true` without
//! them, skips with a message otherwise). Every cgroup it creates lives under a parent it
//! owns, and is removed at the end.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::agent_process::{RecordingAgent, ReplayedEviction};
use support::allocator::AllocatorPlan;
use support::apiserver::FakeApiServer;
use support::cgroups::{CgroupChurn, TestCgroups};
use support::fake_node::{
    MI, NODE, PodFixture, api_pod, best_effort, container_id, qos_dir, seed_node,
    successful_deletes,
};

#[test]
#[ignore = "helper process for the end-to-end tests, not a test by itself"]
fn allocator_child() {
    support::allocator::run_if_requested();
}

/// No request: over it as soon as it holds a page, so the kubelet's memory ranking puts
/// it first while it grows.
const HOG: PodFixture = best_effort("hog", "0000000e-0001", 0);
/// Below its request and of a higher priority: never chosen while the hog is there.
const STEADY: PodFixture = PodFixture {
    name: "steady",
    uid: "0000000e-0002",
    memory_request: Some("200Mi"),
    priority: Some(1000),
    annotations: &[],
    working_set: 0,
};
/// Listed as running by the API server, its cgroup (empty) made and removed again and
/// again: with its figures read it uses nothing and comes after the hog; found without
/// a cgroup it has no stats, and the kubelet evicts a pod without stats first.
const ENDING: PodFixture = best_effort("ending", "0000000e-0003", 0);

/// The agent's log line for each eviction it makes.
const EVICTED: &str = "evicted pod";

/// How the kubelet's cgroup driver names the pods' cgroups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Driver {
    /// `kubepods/besteffort/pod<uid>/<container id>`.
    Cgroupfs,
    /// `P.slice/P-kubepods.slice/P-kubepods-besteffort.slice/
    /// P-kubepods-besteffort-pod<uid with _>.slice/cri-containerd-<container id>.scope`, for
    /// a pods cgroup named `/P/kubepods`.
    Systemd,
}

/// The kubelet's pods cgroup (`kubepods`, limited to 256 MiB as the kubelet limits it to
/// the node's allocatable memory) under a parent this test owns, in the v1 memory and
/// freezer hierarchies, with a cgroup per pod and per container as `driver` names them,
/// each container running a held allocator.
struct Node {
    cgroups: TestCgroups,
    driver: Driver,
    /// Each pod's allocator PID, by pod name.
    allocators: Vec<(&'static str, u32)>,
}

impl Node {
    fn create(driver: Driver) -> Result<Node, String> {
        let hierarchies = ["memory", "freezer"];
        let cgroups = match driver {
            Driver::Cgroupfs => TestCgroups::create(&hierarchies)?,
            Driver::Systemd => TestCgroups::create_slice(&hierarchies)?,
        };
        let mut node = Node {
            cgroups,
            driver,
            allocators: Vec::new(),
        };
        let kubepods = node.cgroups.child(&node.kubepods());
        node.cgroups.set_memory_limit(&kubepods, 256 * MI);
        for qos in ["burstable", "besteffort"] {
            node.cgroups.child(&node.qos_cgroup(qos));
        }
        Ok(node)
    }

    /// The name the agent is given for the pods cgroup (`podsCgroupName`), in cgroupfs
    /// notation whatever the driver.
    fn pods_cgroup_name(&self) -> String {
        let parent = self.cgroups.parent.display().to_string();
        match self.driver {
            Driver::Cgroupfs => format!("/{parent}/kubepods"),
            Driver::Systemd => format!("/{}/kubepods", slice_stem(&parent)),
        }
    }

    /// The pods cgroup, relative to the parent.
    fn kubepods(&self) -> String {
        match self.driver {
            Driver::Cgroupfs => "kubepods".to_string(),
            Driver::Systemd => format!("{}-kubepods.slice", self.stem()),
        }
    }

    /// The QoS tier's cgroup (`burstable`, `besteffort`), relative to the parent.
    fn qos_cgroup(&self, qos: &str) -> String {
        match self.driver {
            Driver::Cgroupfs => format!("kubepods/{qos}"),
            Driver::Systemd => format!("{}/{}-kubepods-{qos}.slice", self.kubepods(), self.stem()),
        }
    }

    /// The pod's cgroup, relative to the parent, as the kubelet's driver names it.
    fn pod_cgroup(&self, fixture: &PodFixture) -> String {
        let qos = qos_dir(fixture);
        match self.driver {
            Driver::Cgroupfs => format!("kubepods/{qos}/pod{}", fixture.uid),
            Driver::Systemd => format!(
                "{}/{}-kubepods-{qos}-pod{}.slice",
                self.qos_cgroup(qos),
                self.stem(),
                fixture.uid.replace('-', "_")
            ),
        }
    }

    /// The container's cgroup, relative to the parent, as containerd names it.
    fn container_cgroup(&self, fixture: &PodFixture) -> String {
        let id = container_id(fixture.uid);
        match self.driver {
            Driver::Cgroupfs => format!("{}/{id}", self.pod_cgroup(fixture)),
            Driver::Systemd => format!("{}/cri-containerd-{id}.scope", self.pod_cgroup(fixture)),
        }
    }

    /// The parent's name without `.slice`: the first part of every slice below it.
    fn stem(&self) -> String {
        slice_stem(&self.cgroups.parent.display().to_string())
    }

    /// Makes the pod's cgroup and its container's, and starts a held allocator in the
    /// container that touches `mib` MiB at `mib_per_sec` once let go.
    fn start_pod(&mut self, fixture: &'static PodFixture, mib: u64, mib_per_sec: u64) {
        self.cgroups.child(&self.pod_cgroup(fixture));
        let container = self.cgroups.child(&self.container_cgroup(fixture));
        let plan = AllocatorPlan {
            bytes: mib * MI,
            rate: mib_per_sec * MI,
            ignore_sigterm: false,
            report_crossing: None,
        };
        let pid = self.cgroups.spawn_held_allocator(&container, &plan);
        self.allocators.push((fixture.name, pid));
    }

    fn allocator(&self, name: &str) -> u32 {
        self.allocators
            .iter()
            .find(|(pod, _)| *pod == name)
            .map(|(_, pid)| *pid)
            .unwrap_or_else(|| panic!("no allocator for {name}"))
    }

    fn go(&mut self, name: &str) {
        let pid = self.allocator(name);
        self.cgroups.release_allocator(pid);
    }

    fn exited(&mut self, name: &str) -> Option<std::process::ExitStatus> {
        let pid = self.allocator(name);
        self.cgroups.wait_child(pid, Duration::ZERO)
    }

    /// The memory the pods cgroup holds.
    fn pods_usage(&self) -> u64 {
        let dir = self
            .cgroups
            .dir("memory", &self.cgroups.parent.join(self.kubepods()));
        std::fs::read_to_string(dir.join("memory.usage_in_bytes"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// OOM kills anywhere in this node's cgroups: on cgroup v1 they show in the cgroup of
    /// the task killed, not in the pods cgroup whose limit it ran into (see
    /// [`TestCgroups::oom_kills`]).
    fn oom_kills(&self) -> u64 {
        self.cgroups.oom_kills()
    }

    /// The steady pod allocated, the hog held: what both tests start from.
    fn start_steady_pod_and_a_hog(&mut self) {
        self.start_pod(&STEADY, 40, 200);
        self.start_pod(&HOG, 230, 60);
        self.go("steady");
        support::poll::Wait::for_("the steady pod to allocate", Duration::from_secs(30))
            .until_true(|| self.pods_usage() >= 38 * MI);
    }
}

/// A slice's name without its `.slice`.
fn slice_stem(slice: &str) -> String {
    slice.strip_suffix(".slice").unwrap_or(slice).to_string()
}

/// The agent binary in Kubernetes mode for `node`, told of its pods by `server`: cycles
/// every `housekeeping`, a hard threshold of 100Mi on the pods cgroup's memory, its
/// configuration, kubeconfig and record in `dir`, logging as `RUST_LOG=log_filter` says.
fn start_kube_agent(
    dir: &Path,
    node: &Node,
    server: &FakeApiServer,
    housekeeping: &str,
    log_filter: &str,
) -> RecordingAgent {
    let root = dir.display();
    let config = dir.join("agent.yaml");
    std::fs::create_dir_all(dir.join("nodefs")).unwrap();
    std::fs::write(
        &config,
        format!(
            "apiVersion: nodekeeper.io/v1alpha1
kind: AgentConfiguration
housekeepingInterval: {housekeeping}
nodeName: {NODE}
cgroupRoot: {cgroup_root}
nodefsPath: {root}/nodefs
evictionHard:
  allocatableMemory.available: 100Mi
kubernetes:
  podsCgroupName: {pods_cgroup_name}
  podLogsPath: {root}/logs
  kubeletRootPath: {root}/kubelet
  stateFile: {root}/api-writes.json
",
            cgroup_root = node.cgroups.v1_root().display(),
            pods_cgroup_name = node.pods_cgroup_name(),
        ),
    )
    .unwrap();
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    RecordingAgent::start(
        &config,
        &dir.join("trace.yaml"),
        log_filter,
        &[
            "--metrics-addr".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--kubeconfig".as_ref(),
            kubeconfig.as_os_str(),
        ],
    )
}

/// The pods `agent` evicted, in order, from its log.
fn evictions(agent: &RecordingAgent) -> Vec<String> {
    agent
        .process
        .whole_log()
        .iter()
        .filter(|line| line.contains(EVICTED) && !line.contains("dry run"))
        .map(|line| {
            ["default/hog", "default/steady", "default/ending"]
                .into_iter()
                .find(|key| line.contains(&format!("pod={key} ")))
                .unwrap_or_else(|| panic!("an eviction of an unknown pod: {line}"))
                .to_string()
        })
        .collect()
}

/// The API server for this node, its pods seeded, the agent knowing them.
async fn api_server_with(pods: &[&PodFixture]) -> FakeApiServer {
    let server = FakeApiServer::start().await;
    seed_node(&server);
    for fixture in pods {
        server.seed(&api_pod(fixture));
    }
    server
}

/// Waits until `server` has answered the agent's list and watch of its pods.
fn wait_until_pods_are_known(server: &FakeApiServer) {
    support::poll::Wait::for_(
        "the agent to list and watch its pods",
        Duration::from_secs(30),
    )
    .until_true(|| support::fake_node::pods_listed(server));
}

/// What both tests must end with: the hog killed (SIGKILL) by the agent before the
/// kernel's OOM killer, through its container's cgroup, and deleted through the API once;
/// the steady pod neither chosen nor touched; the agent (stopped with `agent_status`, its
/// whole `log`) exited cleanly.
fn assert_the_hog_was_killed_and_deleted(
    node: &mut Node,
    server: &FakeApiServer,
    log: &str,
    agent_status: std::process::ExitStatus,
) {
    let hog = node.exited("hog");
    node.cgroups.assert_killed_by_the_agent("the hog", hog, log);
    assert_eq!(
        successful_deletes(server, "hog").len(),
        1,
        "the hog's deletes: {:?}\n{log}",
        successful_deletes(server, "hog")
    );
    assert!(
        successful_deletes(server, "steady").is_empty(),
        "the steady pod was deleted:\n{log}"
    );
    assert!(
        node.exited("steady").is_none(),
        "the steady pod died:\n{log}"
    );
    assert!(
        agent_status.success(),
        "the agent exited with {agent_status:?}:\n{log}"
    );
}

/// The hog's Evicted event names its container's usage, as the kubelet's does: read from
/// the container's own cgroup, as the runtime names it under the driver, for the pod
/// evicted.
fn assert_the_hogs_event_names_its_container(server: &FakeApiServer) {
    let event = support::poll::Wait::for_("the hog's Evicted event", Duration::from_secs(10))
        .until(|| {
            server
                .objects::<k8s_openapi::api::core::v1::Event>()
                .into_iter()
                .find(|event| {
                    event.reason.as_deref() == Some("Evicted")
                        && event.involved_object.name.as_deref() == Some("hog")
                })
        });
    let message = event.message.clone().unwrap_or_default();
    assert!(
        message.contains("Container app was using ")
            && message.ends_with(", request is 0, has larger consumption of memory. "),
        "{event:?}"
    );
    let annotations = event.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("offending_containers").map(String::as_str),
        Some("app"),
        "{event:?}"
    );
}

/// The hog grows past the threshold with `listed` on the API server (the steady pod and
/// the hog, and any other), on real cgroups in the layout of the kubelet's `driver`; the
/// hog must be killed before the OOM killer and deleted once, the steady pod spared, and
/// the agent's evictions must be `expected` (in order) and the same as its record's
/// replay.
async fn grow_the_hog_with(driver: Driver, listed: &[&PodFixture], expected: &[&str]) {
    let mut node = require!(
        "the cgroup v1 memory and freezer hierarchies",
        Node::create(driver)
    );
    node.start_steady_pod_and_a_hog();
    let server = api_server_with(listed).await;
    let dir = tempfile::tempdir().unwrap();
    // Cycles far apart (none falls within the test after the first): the crossing must
    // be seen through the kernel's notification, and after an eviction the agent must
    // look again at once, not wait for the timer.
    let mut agent = start_kube_agent(dir.path(), &node, &server, "1m", "info");
    wait_until_pods_are_known(&server);

    node.go("hog");
    let started = Instant::now();
    support::poll::Wait::for_("the hog to be killed", Duration::from_secs(60))
        .until_true(|| node.exited("hog").is_some());
    let killed_after = started.elapsed();
    // Killed by the kernel, the hog would not be deleted: say so rather than time out.
    assert_eq!(
        node.oom_kills(),
        0,
        "the kernel OOM killer fired first:\n{}",
        agent.process.whole_log().join("\n")
    );
    support::poll::Wait::for_("the hog's delete", Duration::from_secs(10))
        .until_true(|| !successful_deletes(&server, "hog").is_empty());
    assert_the_hogs_event_names_its_container(&server);
    // Each eviction is followed by a look again at once (the timer's next cycle is a
    // minute away).
    let looks_again = || {
        let (_, metrics) = support::agent_process::http_get(&agent.process.address, "/metrics");
        let count = support::exposition::metric_value(
            &metrics,
            "nodekeeper_cycles_total{started_by=\"after_eviction\"}",
        );
        (count, metrics)
    };
    support::poll::Wait::for_(
        "a cycle started after each eviction",
        Duration::from_secs(10),
    )
    .showing(|| format!("{:?}", looks_again()))
    .until_true(|| {
        looks_again()
            .0
            .is_some_and(|count| count >= expected.len() as f64)
    });
    std::thread::sleep(Duration::from_millis(500));
    let agent_status = agent.process.stop(Duration::from_secs(10));
    let log = agent.process.whole_log().join("\n");
    assert_the_hog_was_killed_and_deleted(&mut node, &server, &log, agent_status);
    assert_eq!(evictions(&agent), expected, "{log}");
    for fixture in listed {
        let key = format!("default/{}", fixture.name);
        let evicted = expected.iter().filter(|evicted| **evicted == key).count();
        assert_eq!(
            successful_deletes(&server, fixture.name).len(),
            evicted,
            "{key}'s deletes against its evictions:\n{log}"
        );
    }

    agent.assert_replay_evicts(expected, "");
    eprintln!("evictions {expected:?}; the hog killed {killed_after:?} after it began to grow");
}

/// The kubelet's choice under memory pressure, found through real cgroups in the
/// kubelet's layout: the pod over its request goes, killed at once in its container's
/// cgroup, before the kernel would have to; the pod below its request with the higher
/// priority stays; the record replays to the same eviction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_the_kubelet_would_choose_is_killed_before_the_oom_killer_and_deleted() {
    grow_the_hog_with(Driver::Cgroupfs, &[&HOG, &STEADY], &["default/hog"]).await;
}

/// The same with the pods' cgroups as the kubelet's systemd driver names them (nested
/// slices, the container's scope), the driver detected from the tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_systemd_driver_the_pod_the_kubelet_would_choose_is_killed_and_deleted() {
    grow_the_hog_with(Driver::Systemd, &[&HOG, &STEADY], &["default/hog"]).await;
}

/// A pod the API server still lists as running whose cgroup is already gone (it ended and
/// was cleaned up before its status reached the API server) has no stats, and the
/// kubelet evicts a pod without stats first. It is deleted, with nothing to kill, and the
/// agent looks again at once: the hog is still killed before the OOM killer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_pod_without_a_cgroup_goes_first_and_the_hog_still_before_the_oom_killer() {
    grow_the_hog_with(
        Driver::Cgroupfs,
        &[&HOG, &STEADY, &ENDING],
        &["default/ending", "default/hog"],
    )
    .await;
}

/// issue 16, fault injection: a pod's cgroup removed (and made again) between the
/// agent's listing of its pods and its reads, in Kubernetes mode, while memory runs
/// short. Each cycle the agent must rank that pod as the kubelet would from what it
/// found: with no cgroup, a pod without stats, which the kubelet evicts first; with its
/// files gone between the agent's look and its read, by the figures last read from them
/// (cAdvisor's summary still holds a removed container's last sample). Whatever came
/// first, the hog must be killed before the OOM killer and deleted once, the steady pod
/// spared; every eviction the agent made must be one its record replays, at the same
/// step, and the ending pod chosen only where the record shows it without stats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_cgroup_removed_between_listing_and_reads_under_pressure_misleads_nothing() {
    const KEPT: &str = "pod cgroup unreadable; its last figures stand";
    let mut node = require!(
        "the cgroup v1 memory and freezer hierarchies",
        Node::create(Driver::Cgroupfs)
    );
    node.start_steady_pod_and_a_hog();
    let ending_cgroup = node.cgroups.parent.join(node.pod_cgroup(&ENDING));
    let mut churn = CgroupChurn::start(vec![
        node.cgroups.dir("memory", &ending_cgroup),
        node.cgroups.dir("freezer", &ending_cgroup),
    ]);
    let server = api_server_with(&[&HOG, &STEADY, &ENDING]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_kube_agent(
        dir.path(),
        &node,
        &server,
        "100ms",
        "info,nodekeeper::kubernetes::usage=debug",
    );
    wait_until_pods_are_known(&server);

    let kept_figures = |agent: &RecordingAgent| {
        agent
            .process
            .whole_log()
            .iter()
            .filter(|line| line.contains(KEPT) && line.contains(ENDING.uid))
            .count()
    };
    let steps_without_stats = |agent: &RecordingAgent| {
        agent
            .steps_so_far()
            .iter()
            .filter(|step| {
                step.pods
                    .iter()
                    .any(|pod| pod.name == ENDING.name && !pod.has_stats())
            })
            .count()
    };
    // Both races must be hit on this kernel, or the test shows nothing: the ending pod's
    // cgroup gone when the agent looked for it (no stats), and there when it looked but
    // its files gone by its read (the figures last read stand).
    let waited = Instant::now();
    support::poll::Wait::for_(
        "the agent to keep the ending pod's last figures three times, and to record it \
         once without stats",
        Duration::from_secs(60),
    )
    .every(Duration::from_millis(100))
    .showing(|| {
        format!(
            "{} kept, {} steps without stats; agent log:\n{}",
            kept_figures(&agent),
            steps_without_stats(&agent),
            agent.process.whole_log().join("\n")
        )
    })
    .until_true(|| {
        if churn.failed() {
            churn.stop(); // panics with the churn's error
        }
        kept_figures(&agent) >= 3 && steps_without_stats(&agent) >= 1
    });
    let both_races_after = waited.elapsed();
    assert!(
        evictions(&agent).is_empty(),
        "an eviction without pressure:\n{}",
        agent.process.whole_log().join("\n")
    );
    let kept_before_pressure = kept_figures(&agent);

    node.go("hog");
    let started = Instant::now();
    support::poll::Wait::for_("the hog to be killed", Duration::from_secs(60))
        .until_true(|| node.exited("hog").is_some());
    let killed_after = started.elapsed();
    support::poll::Wait::for_("the hog's delete", Duration::from_secs(10))
        .until_true(|| !successful_deletes(&server, "hog").is_empty());
    assert_the_hogs_event_names_its_container(&server);
    let kept_under_pressure = kept_figures(&agent) - kept_before_pressure;
    std::thread::sleep(Duration::from_millis(500));
    let made_and_removed = churn.stop();
    let agent_status = agent.process.stop(Duration::from_secs(10));
    let log = agent.process.whole_log().join("\n");
    assert_the_hog_was_killed_and_deleted(&mut node, &server, &log, agent_status);

    // The agent's evictions are the replay's, in order; the ending pod is chosen only
    // at a step where the agent found no cgroup for it.
    let evictions = evictions(&agent);
    let steps = agent
        .recorded_steps()
        .unwrap_or_else(|error| panic!("{error}"));
    let replayed = agent.assert_replay_evicts(&evictions, &format!("agent log:\n{log}"));
    for ReplayedEviction { pod, at } in &replayed {
        if pod != "default/ending" {
            continue;
        }
        let step = steps
            .iter()
            .find(|step| step.at.to_string() == *at)
            .unwrap_or_else(|| panic!("no recorded step at {at}"));
        let ending = step
            .pods
            .iter()
            .find(|pod| pod.name == ENDING.name)
            .unwrap_or_else(|| panic!("the ending pod is not in the step at {at}"));
        assert!(
            !ending.has_stats(),
            "the ending pod was evicted at {at} with stats: {ending:?}"
        );
    }
    let ending_deletes = successful_deletes(&server, "ending").len();
    assert_eq!(
        ending_deletes,
        evictions
            .iter()
            .filter(|key| *key == "default/ending")
            .count(),
        "the ending pod's deletes against its evictions:\n{log}"
    );
    // Found by the listing and gone by the read, with no figures standing: no stats.
    let found_gone = agent
        .process
        .whole_log()
        .iter()
        .filter(|line| line.contains("pod cgroup gone; no stats") && line.contains(ENDING.uid))
        .count();
    eprintln!(
        "{made_and_removed} cgroup directories made and removed; the ending pod's last \
         figures kept {} times ({kept_under_pressure} after the hog began to grow), found \
         and gone by its read {found_gone} times, {} recorded steps without its stats; both \
         races seen {both_races_after:?} after the agent began serving; evictions \
         {evictions:?}; the hog killed {killed_after:?} after it began to grow",
        kept_figures(&agent),
        steps_without_stats(&agent),
    );
}
