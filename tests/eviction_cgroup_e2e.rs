//! End to end on this machine's real cgroup v1 memory controller: the agent, in
//! standalone mode, evicts the workload the kubelet's ranking picks, before the kernel
//! OOM killer fires, and leaves the others running; also while workloads end between its
//! listing and its reads.
//!
//! Needs root and the v1 memory and freezer hierarchies (fails under `CI=true` without
//! them, skips with a message otherwise). Every cgroup it creates lives under a parent it
//! owns, and is removed at the end.

#[allow(dead_code)]
mod support {
    pub mod agent_process;
    pub mod allocator;
    pub mod cgroups;
    pub mod exposition;
    pub mod poll;
    pub mod real;
}

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::agent_process::RecordingAgent;
use support::allocator::AllocatorPlan;
use support::cgroups::{CgroupChurn, TestCgroups};

const MIB: u64 = 1 << 20;

#[test]
#[ignore = "helper process for the end-to-end test, not a test by itself"]
fn allocator_child() {
    support::allocator::run_if_requested();
}

/// Workload cgroups under a memory-limited parent this test owns, in the v1 memory and
/// freezer hierarchies, each running a held allocator.
struct Fixture {
    cgroups: TestCgroups,
    /// (name, cgroup relative to the hierarchy roots, allocator PID)
    workloads: Vec<(String, PathBuf, u32)>,
}

impl Fixture {
    /// The parent cgroups, or why they cannot be made here.
    fn create(limit: u64) -> Result<Fixture, String> {
        let cgroups = TestCgroups::create(&["memory", "freezer"])?;
        cgroups.set_memory_limit(&cgroups.parent, limit);
        Ok(Fixture {
            cgroups,
            workloads: Vec::new(),
        })
    }

    /// Start a workload that touches `mib` MiB at `mib_per_sec` once let go.
    fn start_workload(&mut self, name: &str, mib: u64, mib_per_sec: u64) {
        let cgroup = self.cgroups.child(name);
        let plan = AllocatorPlan {
            bytes: mib * MIB,
            rate: mib_per_sec * MIB,
            ignore_sigterm: false,
            report_crossing: None,
        };
        let pid = self.cgroups.spawn_held_allocator(&cgroup, &plan);
        self.workloads.push((name.to_string(), cgroup, pid));
    }

    /// Two steady workloads below their requests, which must survive, allocated; and a
    /// hog with no request, held until let go, which grows past the threshold and which
    /// the kubelet's memory ranking puts first.
    fn start_steady_workloads_and_a_hog(&mut self) {
        self.start_workload("steady-high-priority", 40, 200);
        self.start_workload("steady-with-request", 30, 200);
        self.start_workload("hog", 230, 60);
        for name in ["steady-high-priority", "steady-with-request"] {
            self.go(name);
        }
        wait_for(
            "steady workloads to allocate",
            Duration::from_secs(30),
            || {
                self.working_set("steady-high-priority") >= 38 * MIB
                    && self.working_set("steady-with-request") >= 28 * MIB
            },
        );
    }

    fn workload(&self, name: &str) -> &(String, PathBuf, u32) {
        self.workloads.iter().find(|(n, ..)| n == name).unwrap()
    }

    fn go(&mut self, name: &str) {
        let pid = self.workload(name).2;
        self.cgroups.release_allocator(pid);
    }

    fn working_set(&self, name: &str) -> u64 {
        let dir = self.cgroups.dir("memory", &self.workload(name).1);
        let usage: u64 = fs::read_to_string(dir.join("memory.usage_in_bytes"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let stat = fs::read_to_string(dir.join("memory.stat")).unwrap();
        let inactive: u64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("total_inactive_file "))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        usage.saturating_sub(inactive)
    }

    fn exited(&mut self, name: &str) -> Option<std::process::ExitStatus> {
        let pid = self.workload(name).2;
        self.cgroups.wait_child(pid, Duration::ZERO)
    }
}

/// The agent's configuration for the fixture's workloads under `parent`: a hard threshold
/// of 100Mi on the parent's memory, and the two steady workloads' priority and requests,
/// which the kubelet's ranking spares while a workload without a request grows.
fn agent_config(cgroup_root: &Path, parent: &str, housekeeping: &str) -> String {
    let cgroup_root = cgroup_root.display();
    format!(
        "apiVersion: nodekeeper.io/v1alpha1
kind: AgentConfiguration
housekeepingInterval: {housekeeping}
metricsAddress: 127.0.0.1:0
cgroupRoot: {cgroup_root}
podsCgroup: {parent}
evictionHard:
  allocatableMemory.available: 100Mi
workloads:
  parentCgroup: {parent}
  namespace: e2e
  pods:
  - name: steady-high-priority
    priority: 1000
    requests: {{memory: 200Mi}}
  - name: steady-with-request
    requests: {{memory: 100Mi}}
"
    )
}

fn wait_for(what: &str, timeout: Duration, condition: impl FnMut() -> bool) {
    support::poll::Wait::for_(what, timeout).until_true(condition);
}

/// The agent binary for the fixture's workloads ([`agent_config`], housekeeping every
/// `housekeeping`), logging as `RUST_LOG=log_filter` says and recording a trace; its
/// configuration and trace written into `dir`.
fn start_recording_agent(
    dir: &Path,
    fixture: &Fixture,
    housekeeping: &str,
    log_filter: &str,
) -> RecordingAgent {
    let config = dir.join("agent.yaml");
    let parent = fixture.cgroups.parent.display().to_string();
    let text = agent_config(&fixture.cgroups.v1_root(), &parent, housekeeping);
    fs::write(&config, text).unwrap();
    RecordingAgent::start(&config, &dir.join("trace.yaml"), log_filter, &[])
}

/// What both runs must end with: the hog killed (SIGKILL) by the agent before the kernel's
/// OOM killer, no steady workload chosen or dead, and the agent (stopped with
/// `agent_status`, its whole `log`) exited cleanly.
fn assert_the_hog_alone_was_evicted(
    fixture: &mut Fixture,
    log: &str,
    agent_status: std::process::ExitStatus,
) {
    let hog = fixture.exited("hog");
    fixture
        .cgroups
        .assert_killed_by_the_agent("the hog", hog, log);
    assert!(
        log.contains("evicted pod") && log.contains("e2e/hog"),
        "{log}"
    );
    assert!(
        !log.contains("e2e/steady"),
        "a steady workload was chosen:\n{log}"
    );
    for name in ["steady-high-priority", "steady-with-request"] {
        assert!(fixture.exited(name).is_none(), "{name} died");
    }
    assert!(
        agent_status.success(),
        "the agent exited with {agent_status:?}:\n{log}"
    );
}

#[test]
fn agent_evicts_the_ranked_workload_before_the_oom_killer() {
    let mut fixture = require!(
        "the cgroup v1 memory and freezer hierarchies",
        Fixture::create(256 * MIB)
    );
    fixture.start_steady_workloads_and_a_hog();
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_recording_agent(dir.path(), &fixture, "1s", "info");

    fixture.go("hog");
    let started = Instant::now();
    wait_for("the hog to be evicted", Duration::from_secs(60), || {
        fixture.exited("hog").is_some()
    });
    std::thread::sleep(Duration::from_millis(500));
    let (_, metrics) = support::agent_process::http_get(&agent.process.address, "/metrics");
    let agent_status = agent.process.stop(Duration::from_secs(5));
    let log = agent.process.whole_log().join("\n");
    assert_the_hog_alone_was_evicted(&mut fixture, &log, agent_status);
    // What started the cycles: the hog's crossing woke one through the kernel's memcg
    // notification, and the eviction was followed by a look again at once.
    let cycles = |started_by: &str| {
        support::exposition::metric_value(
            &metrics,
            &format!("nodekeeper_cycles_total{{started_by=\"{started_by}\"}}"),
        )
    };
    for started_by in ["notification", "after_eviction"] {
        assert!(
            cycles(started_by).is_some_and(|count| count >= 1.0),
            "no cycle started by {started_by}:\n{metrics}"
        );
    }
    eprintln!(
        "hog evicted {:?} after it started growing",
        started.elapsed()
    );

    // The recorded trace replays to the same decision offline.
    agent.assert_replay_evicts(&["e2e/hog"], "");
}

/// issue 16, fault injection: workloads that end and are cleaned up between the agent's
/// listing of the workload parent and its reads of their files, while memory runs short.
/// The agent must still evict the workload the kubelet's ranking picks before the OOM
/// killer, and its record must read back as it saw the workloads: one whose cgroup it
/// found but could not read has stats (ranked as using nothing), while a pod recorded
/// with no figure and no cgroup reads back without stats, the first a replay evicts.
#[test]
fn workloads_ending_while_they_are_listed_mislead_neither_the_agent_nor_its_record() {
    const RACE: &str = "workload ended while it was read";
    let mut fixture = require!(
        "the cgroup v1 memory and freezer hierarchies",
        Fixture::create(256 * MIB)
    );
    fixture.start_steady_workloads_and_a_hog();
    // Overlapping, so one is nearly always there to be listed and each is gone a moment
    // later.
    let parent_dir = fixture.cgroups.dir("memory", &fixture.cgroups.parent);
    let mut churn = CgroupChurn::start(
        ["ended-a", "ended-b", "ended-c"]
            .map(|name| parent_dir.join(name))
            .to_vec(),
    );

    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_recording_agent(
        dir.path(),
        &fixture,
        "100ms",
        "info,nodekeeper::agent::standalone=debug",
    );
    let races = |agent: &RecordingAgent| {
        agent
            .process
            .whole_log()
            .iter()
            .filter(|line| line.contains(RACE))
            .count()
    };
    // Both races must be hit on this kernel, or the test shows nothing: a cgroup gone (or
    // all but gone: its `cgroup.procs` already removed) by its read, which the agent leaves
    // out; and one whose memory files the kernel had removed while its `cgroup.procs` was
    // still there (`rmdir` clears a controller's files first) or that was made again
    // before the agent looked, which the agent lists with no figure: it has stats, its
    // cgroup was found.
    let pods_recorded_unread = || {
        agent
            .steps_so_far()
            .iter()
            .flat_map(|step| &step.pods)
            .filter(|pod| pod.usage.memory.is_none())
            .count()
    };
    let waited = Instant::now();
    support::poll::Wait::for_(
        "the agent to find three churning cgroups gone by their reads, and to record one \
         found but unread",
        Duration::from_secs(60),
    )
    .every(Duration::from_millis(100))
    .showing(|| {
        format!(
            "{} gone at their reads, {} recorded unread; agent log:\n{}",
            races(&agent),
            pods_recorded_unread(),
            agent.process.whole_log().join("\n")
        )
    })
    .until_true(|| {
        if churn.failed() {
            churn.stop(); // panics with the churn's error
        }
        races(&agent) >= 3 && pods_recorded_unread() >= 1
    });
    let both_races_after = waited.elapsed();
    let races_before_pressure = races(&agent);

    fixture.go("hog");
    let started = Instant::now();
    wait_for("the hog to be evicted", Duration::from_secs(60), || {
        fixture.exited("hog").is_some()
    });
    let evicted_after = started.elapsed();
    let races_under_pressure = races(&agent) - races_before_pressure;
    std::thread::sleep(Duration::from_millis(500));
    let made_and_removed = churn.stop();
    let (_, metrics) = support::agent_process::http_get(&agent.process.address, "/metrics");
    let agent_status = agent.process.stop(Duration::from_secs(5));
    let log = agent.process.whole_log().join("\n");
    assert_the_hog_alone_was_evicted(&mut fixture, &log, agent_status);
    assert!(
        !log.contains("e2e/ended"),
        "a workload gone before its read was taken for a pod:\n{log}"
    );
    let cycles: f64 = [
        "timer",
        "notification",
        "notification_trailing",
        "after_eviction",
    ]
    .iter()
    .filter_map(|started_by| {
        support::exposition::metric_value(
            &metrics,
            &format!("nodekeeper_cycles_total{{started_by=\"{started_by}\"}}"),
        )
    })
    .sum();

    // The record reads back as the agent saw it: every workload it listed had a cgroup,
    // so each has stats, a churning one found again but not read (made again between its
    // read and the check) included; read back as a pod without stats, it would be the
    // first a replay evicts.
    let steps = agent
        .recorded_steps()
        .unwrap_or_else(|error| panic!("{error}"));
    let recorded_unread: Vec<String> = steps
        .iter()
        .flat_map(|step| &step.pods)
        .filter(|pod| pod.usage.memory.is_none())
        .map(|pod| format!("{} ({:?})", pod.key(), pod.cgroup))
        .collect();
    let read_back_without_stats: Vec<String> = steps
        .iter()
        .flat_map(|step| {
            step.pods
                .iter()
                .filter(|pod| !pod.has_stats())
                .map(move |pod| format!("{} at {}", pod.key(), step.at))
        })
        .collect();
    assert!(
        read_back_without_stats.is_empty(),
        "read back from the record without stats: {read_back_without_stats:?}"
    );
    agent.assert_replay_evicts(&["e2e/hog"], "the hog once, as the agent did");
    eprintln!(
        "{made_and_removed} cgroups made and removed; in {cycles} cycles, {} found gone at \
         their reads ({races_under_pressure} after the hog began to grow), recorded found but \
         unread: {recorded_unread:?}; both races seen {both_races_after:?} after the agent \
         began serving; the hog evicted {evicted_after:?} after it began",
        races(&agent)
    );
}
