//! End to end on this machine's real cgroup v1 memory controller: the agent, in
//! standalone mode, evicts the workload the kubelet's ranking picks, before the kernel
//! OOM killer fires, and leaves the others running.
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
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use support::allocator::AllocatorPlan;
use support::cgroups::TestCgroups;

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

    fn oom_kills(&self) -> u64 {
        let dir = self.cgroups.dir("memory", &self.cgroups.parent);
        let text = fs::read_to_string(dir.join("memory.oom_control")).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    fn exited(&mut self, name: &str) -> Option<std::process::ExitStatus> {
        let pid = self.workload(name).2;
        self.cgroups.wait_child(pid, Duration::ZERO)
    }
}

fn wait_for(what: &str, timeout: Duration, condition: impl FnMut() -> bool) {
    support::poll::Wait::for_(what, timeout).until_true(condition);
}

#[test]
fn agent_evicts_the_ranked_workload_before_the_oom_killer() {
    let mut fixture = require!(
        "the cgroup v1 memory and freezer hierarchies",
        Fixture::create(256 * MIB)
    );
    let name = fixture.cgroups.parent.display().to_string();
    let cgroup_root = fixture.cgroups.v1_root();
    // Below their requests: must survive. The hog has no request and grows past the
    // threshold: the kubelet's memory ranking puts it first.
    fixture.start_workload("steady-high-priority", 40, 200);
    fixture.start_workload("steady-with-request", 30, 200);
    fixture.start_workload("hog", 230, 60);
    for name in ["steady-high-priority", "steady-with-request"] {
        fixture.go(name);
    }
    wait_for(
        "steady workloads to allocate",
        Duration::from_secs(30),
        || {
            fixture.working_set("steady-high-priority") >= 38 * MIB
                && fixture.working_set("steady-with-request") >= 28 * MIB
        },
    );

    let cgroup_root = cgroup_root.display();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.yaml");
    let trace = dir.path().join("trace.yaml");
    fs::write(
        &config,
        format!(
            "apiVersion: nodekeeper.io/v1alpha1
kind: AgentConfiguration
housekeepingInterval: 1s
metricsAddress: 127.0.0.1:0
cgroupRoot: {cgroup_root}
podsCgroup: {name}
evictionHard:
  allocatableMemory.available: 100Mi
workloads:
  parentCgroup: {name}
  namespace: e2e
  pods:
  - name: steady-high-priority
    priority: 1000
    requests: {{memory: 200Mi}}
  - name: steady-with-request
    requests: {{memory: 100Mi}}
"
        ),
    )
    .unwrap();
    let mut agent = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["agent", "--config"])
        .arg(&config)
        .arg("--record")
        .arg(&trace)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let stderr = agent.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut log = Vec::new();
    wait_for("the agent to start", Duration::from_secs(30), || {
        log.extend(rx.try_iter());
        log.iter().any(|l| l.contains("serving /metrics"))
    });

    fixture.go("hog");
    let started = Instant::now();
    wait_for("the hog to be evicted", Duration::from_secs(60), || {
        fixture.exited("hog").is_some()
    });
    let hog_status = fixture.exited("hog").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    log.extend(rx.try_iter());
    // What started the cycles: the hog's crossing woke one through the kernel's memcg
    // notification, and the eviction was followed by a look again at once.
    let address = log
        .iter()
        .find_map(|line| support::agent_process::metrics_address(line))
        .expect("the metrics address in the log");
    let (_, metrics) = support::agent_process::http_get(address, "/metrics");
    let cycles = |started_by: &str| {
        support::exposition::metric_value(
            &metrics,
            &format!("nodekeeper_cycles_total{{started_by=\"{started_by}\"}}"),
        )
    };

    let _ = kill(Pid::from_raw(agent.id() as i32), Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    let agent_status = loop {
        if let Some(status) = agent.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = agent.kill();
            let _ = agent.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    log.extend(rx.try_iter());
    let log_text = log.join("\n");

    assert_eq!(
        fixture.oom_kills(),
        0,
        "the kernel OOM killer fired first:\n{log_text}"
    );
    assert!(
        std::os::unix::process::ExitStatusExt::signal(&hog_status) == Some(9),
        "hog ended with {hog_status:?}, not SIGKILL"
    );
    assert!(
        log_text.contains("evicted pod") && log_text.contains("e2e/hog"),
        "{log_text}"
    );
    assert!(
        !log_text.contains("e2e/steady"),
        "a steady workload was chosen:\n{log_text}"
    );
    assert!(
        fixture.exited("steady-high-priority").is_none(),
        "steady-high-priority died"
    );
    assert!(
        fixture.exited("steady-with-request").is_none(),
        "steady-with-request died"
    );
    assert!(
        matches!(agent_status, Some(s) if s.success()),
        "agent did not exit cleanly: {agent_status:?}"
    );
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
    let mut replay = String::new();
    Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["replay", "--config"])
        .arg(&config)
        .arg(&trace)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut replay)
        .unwrap();
    assert!(
        replay.contains("\"name\":\"hog\""),
        "replay of the recorded trace:\n{replay}"
    );
}
