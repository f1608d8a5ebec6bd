//! End to end on this machine's real cgroup v1 memory controller: the agent, in
//! standalone mode, evicts the workload the kubelet's ranking picks, before the kernel
//! OOM killer fires, and leaves the others running.
//!
//! Needs root and the v1 memory and freezer hierarchies at /sys/fs/cgroup (fails under
//! `CI=true` without them, skips with a message otherwise). Every cgroup it creates lives
//! under a parent it owns, and is removed at the end.

#[allow(dead_code)]
mod support {
    pub mod allocator;
    pub mod cgroups;
    pub mod real;
}

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const MEMORY: &str = "/sys/fs/cgroup/memory";
const FREEZER: &str = "/sys/fs/cgroup/freezer";
const MIB: u64 = 1 << 20;

/// The memory-allocating workload: run as this test binary in helper mode. It waits for
/// "go" on stdin (so its pages are charged to the cgroup it was moved into), then touches
/// `NK_ALLOC_MIB` MiB at `NK_ALLOC_MIB_PER_SEC`, then sleeps until killed.
#[test]
#[ignore = "helper process for the end-to-end test, not a test by itself"]
fn allocator_process() {
    let Ok(total) = std::env::var("NK_ALLOC_MIB") else {
        return;
    };
    let total: usize = total.parse().unwrap();
    let rate: usize = std::env::var("NK_ALLOC_MIB_PER_SEC")
        .unwrap()
        .parse()
        .unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let step = Duration::from_millis(1000 / rate.max(1) as u64);
    for _ in 0..total {
        chunks.push(vec![0xA5; MIB as usize]);
        std::thread::sleep(step);
    }
    println!("allocated {} MiB", chunks.len());
    loop {
        std::thread::sleep(Duration::from_secs(1));
        std::hint::black_box(&chunks);
    }
}

struct Fixture {
    name: String,
    workloads: Vec<(String, Child)>,
}

impl Fixture {
    fn dirs(&self, child: Option<&str>) -> Vec<PathBuf> {
        [MEMORY, FREEZER]
            .iter()
            .map(|root| {
                let parent = Path::new(root).join(&self.name);
                match child {
                    Some(c) => parent.join(c),
                    None => parent,
                }
            })
            .collect()
    }

    /// The parent cgroups, or why they cannot be made here.
    fn create(name: &str, limit: u64) -> Result<Fixture, String> {
        support::real::root()?;
        for (controller, expected) in [("memory", MEMORY), ("freezer", FREEZER)] {
            let mounted = support::cgroups::mount_point(controller)?;
            if mounted != Path::new(expected) {
                return Err(format!(
                    "the {controller} hierarchy is mounted at {}, not {expected}",
                    mounted.display()
                ));
            }
        }
        let fixture = Fixture {
            name: name.to_string(),
            workloads: Vec::new(),
        };
        for dir in fixture.dirs(None) {
            fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let limit_file = Path::new(MEMORY).join(name).join("memory.limit_in_bytes");
        fs::write(&limit_file, limit.to_string())
            .map_err(|e| format!("{}: {e}", limit_file.display()))?;
        Ok(fixture)
    }

    fn start_workload(&mut self, name: &str, mib: usize, mib_per_sec: usize) {
        for dir in self.dirs(Some(name)) {
            fs::create_dir(&dir).unwrap();
        }
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "allocator_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("NK_ALLOC_MIB", mib.to_string())
            .env("NK_ALLOC_MIB_PER_SEC", mib_per_sec.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        for dir in self.dirs(Some(name)) {
            fs::write(dir.join("cgroup.procs"), child.id().to_string()).unwrap();
        }
        self.workloads.push((name.to_string(), child));
    }

    fn go(&mut self, name: &str) {
        let child = &mut self
            .workloads
            .iter_mut()
            .find(|(n, _)| n == name)
            .unwrap()
            .1;
        writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    }

    fn working_set(&self, name: &str) -> u64 {
        let dir = Path::new(MEMORY).join(&self.name).join(name);
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
        let text = fs::read_to_string(
            Path::new(MEMORY)
                .join(&self.name)
                .join("memory.oom_control"),
        )
        .unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    fn exited(&mut self, name: &str) -> Option<std::process::ExitStatus> {
        let child = &mut self
            .workloads
            .iter_mut()
            .find(|(n, _)| n == name)
            .unwrap()
            .1;
        child.try_wait().unwrap()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for (_, child) in &mut self.workloads {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Thaw in case a freeze was interrupted, then remove children before parents.
        for (name, _) in &self.workloads {
            let _ = fs::write(
                Path::new(FREEZER)
                    .join(&self.name)
                    .join(name)
                    .join("freezer.state"),
                "THAWED",
            );
        }
        for (name, _) in &self.workloads {
            for dir in self.dirs(Some(name)) {
                let _ = fs::remove_dir(dir);
            }
        }
        for dir in self.dirs(None) {
            let _ = fs::remove_dir(dir);
        }
    }
}

fn wait_for(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn agent_evicts_the_ranked_workload_before_the_oom_killer() {
    let name = format!("nodekeeper-e2e-{}", std::process::id());
    let mut fixture = require!(
        "the cgroup v1 memory and freezer hierarchies",
        Fixture::create(&name, 256 * MIB)
    );
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
