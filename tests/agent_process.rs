//! The agent as an operator runs it: a real process, scraped over HTTP, stopped by SIGTERM.

mod support {
    #![allow(dead_code)]
    pub mod agent_process;
    pub mod allocator;
    pub mod cgroups;
    pub mod poll;
    pub mod real;
    pub mod scheduling;
}

use std::process::Command;
use std::time::Duration;

use support::agent_process::{AgentProcess, http_get, http_get_accepting};
use support::poll::Wait;
use support::scheduling::{
    assert_real_time_only_on_the_decision_path, policy_in_stat, thread_policies,
};

/// Writes `dir/agent.yaml`, an AgentConfiguration with `settings`; its path.
fn config_with(dir: &tempfile::TempDir, settings: &str) -> std::path::PathBuf {
    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        format!("apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\n{settings}"),
    )
    .unwrap();
    config
}

/// The `Accept` header Prometheus 2.x scrapes with.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// Parse OpenMetrics text into (name with labels, value) samples, rejecting any line a
/// Prometheus scrape would reject.
fn parse_exposition(text: &str) -> Vec<(String, f64)> {
    let mut samples = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.last(),
        Some(&"# EOF"),
        "exposition must end with # EOF"
    );
    for line in &lines[..lines.len() - 1] {
        if let Some(comment) = line.strip_prefix("# ") {
            let kind = comment.split_whitespace().next().unwrap_or("");
            assert!(
                ["HELP", "TYPE", "UNIT"].contains(&kind),
                "bad comment line {line:?}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad sample {line:?}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            name.starts_with("nodekeeper_"),
            "metric without prefix: {line:?}"
        );
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "bad name {line:?}"
        );
        if name_end < series.len() {
            assert!(series.ends_with('}'), "unterminated labels {line:?}");
        }
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        samples.push((series.to_string(), value));
    }
    samples
}

fn sample(samples: &[(String, f64)], series: &str) -> Option<f64> {
    samples.iter().find(|(s, _)| s == series).map(|(_, v)| *v)
}

#[test]
fn agent_serves_metrics_and_stops_cleanly_on_sigterm() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/config/agent.yaml");
    let mut agent = AgentProcess::start(&["--config", config, "--metrics-addr", "127.0.0.1:0"]);

    let (status, _) = http_get(&agent.address, "/healthz");
    assert_eq!(status, 200);
    // The first cycle runs at start; wait for readiness rather than sleeping blindly.
    wait_until_ready(&agent);

    // Prometheus asks for OpenMetrics and gets it.
    let (status, head, body) =
        http_get_accepting(&agent.address, "/metrics", Some(PROMETHEUS_ACCEPT));
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    let samples = parse_exposition(&body);
    // Any other client (curl, promtool) gets the Prometheus text format 0.0.4: the same
    // samples, counters and info metrics typed by their sample names, no OpenMetrics-only
    // lines. (`promtool check metrics` reads it in tests/observability.rs.)
    let (status, head, text) = http_get_accepting(&agent.address, "/metrics", None);
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    assert!(
        text.contains("# TYPE nodekeeper_evictions_total counter\n")
            && text.contains("# TYPE nodekeeper_build_info gauge\n")
            && !text.contains("# EOF")
            && !text.contains("# UNIT"),
        "{text}"
    );
    assert!(
        text.contains("\nnodekeeper_evictions_total{signal=\"memory.available\"} 0\n"),
        "{text}"
    );
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let mem_total_kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    let capacity = sample(
        &samples,
        "nodekeeper_signal_capacity{signal=\"memory.available\"}",
    )
    .expect("memory capacity gauge");
    assert_eq!(capacity, mem_total_kib * 1024.0);
    let available = sample(
        &samples,
        "nodekeeper_signal_available{signal=\"memory.available\"}",
    )
    .expect("memory available gauge");
    assert!(
        available > 0.0 && available <= capacity,
        "{available} of {capacity}"
    );
    for signal in ["nodefs.available", "nodefs.inodesFree", "pid.available"] {
        let available = sample(
            &samples,
            &format!("nodekeeper_signal_available{{signal=\"{signal}\"}}"),
        );
        assert!(
            available.is_some_and(|v| v > 0.0),
            "{signal} missing or zero"
        );
    }
    assert_eq!(
        sample(
            &samples,
            "nodekeeper_threshold_met{signal=\"memory.available\",threshold=\"memory.available<100Mi\",kind=\"hard\"}"
        ),
        Some(0.0)
    );
    // Each threshold's amount, beside its signal: a quantity as given, a percentage of
    // the signal's capacity as the kubelet resolves it: its percentages are float32, so
    // 10% is 0.1f32 widened (0.10000000149...), and the product is truncated.
    assert_eq!(
        sample(
            &samples,
            "nodekeeper_threshold_amount{signal=\"memory.available\",threshold=\"memory.available<100Mi\",kind=\"hard\"}"
        ),
        Some(100.0 * 1024.0 * 1024.0)
    );
    let nodefs_capacity = sample(
        &samples,
        "nodekeeper_signal_capacity{signal=\"nodefs.available\"}",
    )
    .expect("nodefs capacity");
    assert_eq!(
        sample(
            &samples,
            "nodekeeper_threshold_amount{signal=\"nodefs.available\",threshold=\"nodefs.available<10%\",kind=\"hard\"}"
        ),
        Some((nodefs_capacity * f64::from(0.1_f32)).trunc())
    );
    assert_eq!(
        sample(
            &samples,
            "nodekeeper_node_condition{condition=\"MemoryPressure\"}"
        ),
        Some(0.0)
    );
    assert!(
        sample(&samples, "nodekeeper_collection_duration_seconds_count").is_some_and(|c| c >= 1.0)
    );
    assert!(
        samples
            .iter()
            .any(|(s, v)| s.starts_with("nodekeeper_build_info{") && *v == 1.0)
    );
    // Counters an alert or a rate reads exist before their first event.
    assert_eq!(
        sample(
            &samples,
            "nodekeeper_evictions_total{signal=\"memory.available\"}"
        ),
        Some(0.0),
        "{body}"
    );
    // Cycles are counted by what started them, each way from the start: the first
    // cycle is the timer's.
    assert!(
        sample(&samples, "nodekeeper_cycles_total{started_by=\"timer\"}").is_some_and(|c| c >= 1.0),
        "{body}"
    );
    for started_by in ["notification", "notification_trailing", "after_eviction"] {
        assert!(
            sample(
                &samples,
                &format!("nodekeeper_cycles_total{{started_by=\"{started_by}\"}}")
            )
            .is_some(),
            "no {started_by} series in {body}"
        );
    }
    // The shipped configuration is a dry run, and says so (the storm alert reads it).
    assert_eq!(sample(&samples, "nodekeeper_dry_run"), Some(1.0));
    // This configuration has no graceful shutdown: no lock, so no lock gauge to alert on.
    assert!(!body.contains("inhibit"), "{body}");
    // Stall ratios keep the kernel's decimals, without float noise.
    for line in body.lines() {
        if line.starts_with("nodekeeper_pressure_stall_ratio{") {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.len() <= 6, "float noise in {line:?}");
        }
    }

    let status = agent.stop(Duration::from_secs(2));
    assert!(status.success(), "agent exited with {status}");
    let log = agent.lines_so_far();
    assert!(
        log.iter().any(|l| l.contains("SIGTERM received")),
        "{log:?}"
    );
    // Log lines speak to people: no Rust debug formatting of options or structs.
    let log = agent.whole_log();
    assert!(
        log.iter()
            .any(|l| l.contains("agent started") && l.contains("layout=")),
        "{log:?}"
    );
    for line in &log {
        for leak in ["Some(", "None", " { ", "\\\""] {
            assert!(!line.contains(leak), "{leak:?} in the log line {line:?}");
        }
    }
}

#[test]
fn agent_refuses_a_bad_config_with_the_field_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\nevictionHard: {memory.available: lots}\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["agent", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("evictionHard[\"memory.available\"]") && stderr.contains("\"lots\""),
        "{stderr}"
    );
}

/// What `realtimePriority` promises: the thread between a kernel notification and the
/// eviction decision (the decision cycle thread, on which the notifiers wait) runs at
/// SCHED_FIFO with that priority, and no other thread of the agent does, so neither the
/// API server nor a scraper gets work run at it.
#[test]
fn realtime_priority_runs_the_cycle_thread_real_time_and_no_other() {
    require!("CAP_SYS_NICE (root)", support::real::root());
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::dry_run(&config_with(&dir, "realtimePriority: 7\n"));
    // The cycle thread may say so before the metrics server does, which the start
    // waits for: look through the whole log.
    agent.logged(
        "the decision cycle thread runs real-time",
        Duration::from_secs(10),
    );
    assert_real_time_only_on_the_decision_path(&thread_policies(agent.child.id()), Some(7));
}

/// Without `realtimePriority` (the default) every thread of the agent stays on the
/// normal scheduler.
#[test]
fn by_default_no_thread_of_the_agent_runs_real_time() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::dry_run(&config_with(&dir, ""));
    wait_until_ready(&agent);
    assert_real_time_only_on_the_decision_path(&thread_policies(agent.child.id()), None);
}

/// An agent that may not run real-time (no CAP_SYS_NICE, as under systemd's
/// `RestrictRealtime=yes` or in a container without it) says so, naming the setting,
/// and protects the node on the normal scheduler: it starts, answers `/healthz` and runs
/// its cycles.
#[test]
fn realtime_priority_without_the_privilege_is_a_warning_and_the_agent_runs_on() {
    require!("root, to drop CAP_SYS_NICE", support::real::root());
    let dir = tempfile::tempdir().unwrap();
    let config = config_with(&dir, "realtimePriority: 7\n");
    // No real-time budget for an unprivileged process, and no CAP_SYS_NICE.
    let mut command = Command::new("prlimit");
    command.args([
        "--rtprio=0:0",
        "setpriv",
        "--bounding-set=-sys_nice",
        "--inh-caps=-sys_nice",
        "--",
        support::agent_process::BINARY,
    ]);
    let agent = AgentProcess::dry_run_from(command, &config, &[]);
    let line = agent.logged(
        "realtimePriority 7: the decision cycle thread stays on the normal scheduler",
        Duration::from_secs(10),
    );
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("Operation not permitted"), "{line}");
    wait_until_ready(&agent);
    assert_eq!(http_get(&agent.address, "/healthz").0, 200);
    assert_real_time_only_on_the_decision_path(&thread_policies(agent.child.id()), None);
}

/// Started with a soft limit of open files below the hard one (systemd's default soft
/// limit is 1024), the agent raises the soft limit to the hard one, as Go programs such
/// as the kubelet do: its decision cycle keeps up to a quarter of the soft limit of the
/// pods' cgroup files open between cycles, and a quarter of 1024 holds the files of fewer
/// than a hundred pods.
#[test]
fn the_agent_raises_its_soft_limit_of_open_files_to_the_hard_one() {
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    let hard = hard.min(8192);
    let soft = (hard / 2).min(1024);
    assert!(
        soft < hard,
        "this test's hard limit of open files ({hard}) is too low"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new("prlimit");
    command.args([
        &format!("--nofile={soft}:{hard}"),
        "--",
        support::agent_process::BINARY,
    ]);
    let agent = AgentProcess::dry_run_from(command, &config_with(&dir, ""), &[]);
    wait_until_ready(&agent);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", agent.child.id())).unwrap();
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("no open files limit in {limits}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    let hard = hard.to_string();
    assert_eq!(fields[3..5], [hard.as_str(), hard.as_str()], "{line}");
}

/// Waits until the agent has completed a cycle (`/readyz` answers 200).
fn wait_until_ready(agent: &AgentProcess) {
    Wait::for_("the agent to be ready", Duration::from_secs(20))
        .every(Duration::from_millis(50))
        .until_true(|| http_get(&agent.address, "/readyz").0 == 200)
}

/// A real-time thread of the agent starts threads and processes (tokio's blocking
/// threads, a reclaim command) on the normal scheduler: a command the operator
/// configured must not inherit a priority above the node's workloads.
#[test]
fn what_a_real_time_thread_starts_begins_on_the_normal_scheduler() {
    require!("CAP_SYS_NICE (root)", support::real::root());
    let own_scheduling =
        || policy_in_stat(&std::fs::read_to_string("/proc/thread-self/stat").unwrap());
    let (own, thread, process) = std::thread::spawn(move || {
        nodekeeper::process::run_this_thread_realtime(5).expect("SCHED_FIFO as root");
        let thread = std::thread::spawn(own_scheduling).join().unwrap();
        let process = Command::new("cat").arg("/proc/self/stat").output().unwrap();
        let process = policy_in_stat(&String::from_utf8_lossy(&process.stdout));
        (own_scheduling(), thread, process)
    })
    .join()
    .unwrap();
    assert_eq!(own, (libc::SCHED_FIFO, 5), "the thread itself");
    assert_eq!(thread, (libc::SCHED_OTHER, 0), "a thread it started");
    assert_eq!(process, (libc::SCHED_OTHER, 0), "a process it started");
}

/// A node under memory pressure whose agent knows no pod to evict: the agent says so,
/// as the kubelet does ("eviction thresholds have been met, but no pods are active to
/// evict"), once for each streak of pressured cycles rather than every second. (An
/// agent whose pod list went stale in an API outage was silent about it.)
#[test]
fn a_threshold_met_with_no_pod_to_evict_is_said_once_per_streak() {
    const MI: u64 = 1 << 20;
    const TOTAL: u64 = 8192 * MI;
    const NO_POD: &str = "eviction thresholds have been met, but no pods are active to evict";
    const PRESSED: &str = "Attempting to reclaim memory";
    // A standalone node without workloads: a cgroup v2 root and a meminfo.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("cgroup")).unwrap();
    std::fs::create_dir_all(root.join("proc/sys/kernel")).unwrap();
    std::fs::create_dir_all(root.join("nodefs")).unwrap();
    std::fs::write(root.join("cgroup/cgroup.controllers"), "memory pids\n").unwrap();
    let set_free = |free: u64| {
        std::fs::write(
            root.join("cgroup/memory.stat"),
            format!("anon {}\nfile 0\ninactive_file 0\n", TOTAL - free),
        )
        .unwrap();
        std::fs::write(
            root.join("proc/meminfo"),
            format!(
                "MemTotal: {} kB\nMemFree: {} kB\nMemAvailable: {} kB\n",
                TOTAL / 1024,
                free / 1024,
                free / 1024
            ),
        )
        .unwrap();
    };
    set_free(4096 * MI);
    let config = root.join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\n\
             housekeepingInterval: 1s\nevictionHard:\n  memory.available: 100Mi\n\
             cgroupRoot: {root}/cgroup\nprocRoot: {root}/proc\nnodefsPath: {root}/nodefs\n",
            root = root.display()
        ),
    )
    .unwrap();
    let mut agent = AgentProcess::start(&[
        "--config".as_ref(),
        config.as_os_str(),
        "--metrics-addr".as_ref(),
        "127.0.0.1:0".as_ref(),
    ]);
    let count = |agent: &AgentProcess, text: &str| {
        agent
            .whole_log()
            .iter()
            .filter(|line| line.contains(text))
            .count()
    };
    // Waits until at least `cycles` cycles have been pressured in all.
    let pressured = |agent: &AgentProcess, cycles: usize| {
        Wait::for_(
            &format!("{cycles} cycles under pressure"),
            Duration::from_secs(20),
        )
        .every(Duration::from_millis(50))
        .showing(|| agent.whole_log().join("\n"))
        .until_true(|| count(agent, PRESSED) >= cycles)
    };

    set_free(50 * MI);
    pressured(&agent, 4);
    assert_eq!(count(&agent, NO_POD), 1, "{:#?}", agent.whole_log());
    // The pressure ends, then comes back: a new streak, said again once.
    set_free(4096 * MI);
    let threshold_met = "nodekeeper_threshold_met{signal=\"memory.available\",threshold=\"memory.available<100Mi\",kind=\"hard\"}";
    Wait::for_("the pressure to end", Duration::from_secs(20))
        .every(Duration::from_millis(50))
        .until_true(|| {
            let metrics = http_get_accepting(&agent.address, "/metrics", Some(PROMETHEUS_ACCEPT));
            sample(&parse_exposition(&metrics.2), threshold_met) == Some(0.0)
        });
    let before = count(&agent, PRESSED);
    set_free(50 * MI);
    pressured(&agent, before + 4);
    let status = agent.stop(Duration::from_secs(5));
    assert!(status.success(), "agent exited with {status}");
    let log = agent.whole_log();
    let said: Vec<_> = log.iter().filter(|line| line.contains(NO_POD)).collect();
    assert_eq!(said.len(), 2, "{log:#?}");
    assert!(
        said.iter()
            .all(|line| line.contains("WARN") && line.contains("signal=memory.available")),
        "{said:#?}"
    );
}

/// The agent's cycles keep the kernel files they read open from one cycle to the next
/// (fewer system calls per decision), but a removed pod's cgroup files are closed at the
/// end of the next cycle: the agent must not hold on to what the kubelet removed.
#[test]
fn the_agent_keeps_a_pods_cgroup_files_open_until_the_cgroup_is_removed() {
    let mut cgroups = require!(
        "the cgroup v1 memory hierarchy",
        support::cgroups::TestCgroups::create(&["memory"])
    );
    let parent = cgroups.parent.clone();
    let pod = cgroups.child("pod");
    let pod_dir = cgroups.dir("memory", &pod);
    let dir = tempfile::tempdir().unwrap();
    let config = config_with(
        &dir,
        &format!(
            "housekeepingInterval: 100ms\ncgroupRoot: {root}\npodsCgroup: {parent}\n\
             workloads:\n  parentCgroup: {parent}\n  namespace: test\n",
            root = cgroups.v1_root().display(),
            parent = parent.display()
        ),
    );
    let agent = AgentProcess::dry_run(&config);
    let fd_dir = format!("/proc/{}/fd", agent.child.id());
    // The descriptors open on the pod cgroup's memory files, with what they name (its
    // directory and `cgroup.procs`, walked for its processes, are opened for a moment
    // every cycle).
    let open_on_pod = || -> Vec<(String, String)> {
        let mut open: Vec<(String, String)> = std::fs::read_dir(&fd_dir)
            .unwrap()
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let target = std::fs::read_link(entry.path()).ok()?;
                let memory_file = target.starts_with(&pod_dir)
                    && target
                        .file_name()
                        .is_some_and(|name| name.to_string_lossy().starts_with("memory."));
                memory_file.then(|| {
                    (
                        entry.file_name().to_string_lossy().into_owned(),
                        target.display().to_string(),
                    )
                })
            })
            .collect();
        open.sort();
        open
    };
    let kept = Wait::for_("the pod's memory files kept open", Duration::from_secs(10))
        .showing(|| format!("open now: {:?}", open_on_pod()))
        .until(|| Some(open_on_pod()).filter(|open| open.len() >= 2));
    // Several cycles later the same descriptors: kept, not opened again.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(open_on_pod(), kept, "the pod's files were not kept open");

    std::fs::remove_dir(&pod_dir).unwrap();
    Wait::for_(
        "the removed pod cgroup's files to be closed",
        Duration::from_secs(5),
    )
    .showing(|| format!("open now: {:?}", open_on_pod()))
    .until_true(|| open_on_pod().is_empty());
}
