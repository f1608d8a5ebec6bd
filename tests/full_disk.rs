//! Fault injection: the disk the agent writes to fills up (issue 16). A real full
//! filesystem, a tmpfs of the test's own filled to its last byte, under the real agent
//! binary: the agent keeps protecting the node and serving its health, counts and logs
//! what it could not write (once per run of failures, not every cycle), and what it did
//! write stays whole and readable; when space comes back, it writes again on its own.
//!
//! - `--record`: the trace. A run of failures costs the steps of that run, never a step
//!   half-written, nor the earlier run's trace rotated to `FILE.1`.
//! - The shutdown state: with a node shutdown under way (a fake logind on a private bus
//!   announces it) and its state file unwritable, the drain still stops the workload
//!   (a real cgroup v1 workload) and lets logind's delay lock go.
//!
//! Needs root (to mount the tmpfs), and for the shutdown a `dbus-daemon` and the cgroup
//! v1 memory and freezer hierarchies; fails under `CI=true` without them.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::agent_process::{AgentProcess, BINARY, http_get};
use support::cgroups::TestCgroups;
use support::controller::metric_value;
use support::full_disk::FullDisk;
use support::logind_fake::{FakeLogind, PrivateBus, fake_state};

/// The agent's own `nodekeeper_state_write_errors_total` for `file`, as scraped.
fn write_errors(agent: &AgentProcess, file: &str) -> u64 {
    let (status, body) = http_get(&agent.address, "/metrics");
    assert_eq!(status, 200, "{body}");
    let series = format!("nodekeeper_state_write_errors_total{{file=\"{file}\"}}");
    metric_value(&body, &series)
        .unwrap_or_else(|| panic!("no {series} in the agent's metrics:\n{body}")) as u64
}

/// Polls `check` every 50 ms for up to `within`; panics with `what` if it never holds.
fn wait_until(what: &str, within: Duration, check: impl FnMut() -> bool) {
    support::poll::Wait::for_(what, within)
        .every(Duration::from_millis(50))
        .until_true(check)
}

/// How many steps the trace file holds so far (one line each).
fn steps_in(trace: &Path) -> usize {
    std::fs::read_to_string(trace)
        .map(|text| text.lines().filter(|line| line.starts_with("- ")).count())
        .unwrap_or(0)
}

fn log_lines_with(agent: &AgentProcess, text: &str) -> usize {
    agent
        .whole_log()
        .iter()
        .filter(|line| line.contains(text))
        .count()
}

const FAILING: &str = "cannot record trace steps";
const RESUMED: &str = "trace recording resumed";

#[test]
fn a_full_disk_costs_trace_steps_but_never_the_earlier_trace_a_whole_step_or_the_agent() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut disk = require!(
        "a tmpfs of the test's own (mount, as root)",
        FullDisk::mount(&dir.path().join("disk"), 64)
    );
    // What an earlier run of the agent recorded: a new run moves it to trace.yaml.1.
    let trace = disk.path().join("trace.yaml");
    let earlier = "# an earlier run's trace\nsteps:\n- {\"at\": \"0s\", \"signals\": {}}\n";
    std::fs::write(&trace, earlier).expect("the earlier trace");
    disk.fill();
    assert!(
        disk.is_full(),
        "the disk should be full before the agent starts"
    );

    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\n\
             housekeepingInterval: 100ms\nnodefsPath: {}\n\
             evictionHard:\n  memory.available: 1Ki\n",
            dir.path().display()
        ),
    )
    .expect("config");
    let mut agent = AgentProcess::dry_run_from(
        Command::new(BINARY),
        &config,
        &["--record".as_ref(), trace.as_os_str()],
    );

    // Full from the start: nothing recorded, every cycle counted, one warning, and the
    // agent healthy and cycling.
    wait_until(
        "ten failed trace steps counted",
        Duration::from_secs(20),
        || write_errors(&agent, "trace") >= 10,
    );
    assert_eq!(http_get(&agent.address, "/healthz").0, 200);
    assert_eq!(http_get(&agent.address, "/readyz").0, 200);
    assert_eq!(
        log_lines_with(&agent, FAILING),
        1,
        "a run of failures is logged once, not every cycle:\n{}",
        agent.whole_log().join("\n")
    );
    let warning = agent
        .whole_log()
        .into_iter()
        .find(|line| line.contains(FAILING))
        .unwrap_or_default();
    assert!(
        warning.contains(&trace.display().to_string()) && warning.contains("No space left"),
        "the warning names the file and the error: {warning}"
    );
    let rotated = disk.path().join("trace.yaml.1");
    assert_eq!(
        std::fs::read_to_string(&rotated).ok().as_deref(),
        Some(earlier),
        "the earlier run's trace is kept whole in trace.yaml.1"
    );

    // Space comes back: recording resumes on its own.
    disk.free();
    agent.wait_for_line(RESUMED, Duration::from_secs(10));
    wait_until("three steps recorded", Duration::from_secs(10), || {
        steps_in(&trace) >= 3
    });

    // The disk fills while the agent writes: a step that only partly fits is cut off.
    disk.fill();
    wait_until("a second run of failures", Duration::from_secs(10), || {
        log_lines_with(&agent, FAILING) == 2
    });
    let failed = write_errors(&agent, "trace");
    wait_until("five more failed steps", Duration::from_secs(10), || {
        write_errors(&agent, "trace") >= failed + 5
    });
    assert_eq!(log_lines_with(&agent, FAILING), 2);
    assert_eq!(http_get(&agent.address, "/healthz").0, 200);
    let failed_in_all = write_errors(&agent, "trace");

    disk.free();
    agent.wait_for_line(RESUMED, Duration::from_secs(10));
    let before = steps_in(&trace);
    wait_until("three more steps recorded", Duration::from_secs(10), || {
        steps_in(&trace) >= before + 3
    });
    assert!(agent.stop(Duration::from_secs(10)).success());

    // The file is a trace: every step whole, in order, and `replay` reads it.
    let text = std::fs::read_to_string(&trace).expect("the trace");
    for line in text.lines().skip(2) {
        let step = line.strip_prefix("- ").unwrap_or(line);
        assert!(
            serde_json::from_str::<serde_json::Value>(step).is_ok_and(|step| step.is_object()),
            "a torn step in the trace: {line:?}"
        );
    }
    let parsed = nodekeeper::trace::TraceFile::from_path(&trace)
        .and_then(|file| file.parsed_steps("trace.yaml"))
        .unwrap_or_else(|error| panic!("the trace does not read back: {error}\n{text}"));
    assert!(parsed.len() >= 6, "{} steps", parsed.len());
    println!(
        "full disk under --record: {failed_in_all} steps not recorded in two full spells, \
         logged in 2 warnings; {} whole steps recorded",
        parsed.len()
    );
    assert!(
        parsed.windows(2).all(|pair| pair[0].at < pair[1].at),
        "steps in time order"
    );
    // Replays whole (it fails the test otherwise).
    support::agent_process::replay(&config, &trace);
    assert_eq!(
        std::fs::read_to_string(&rotated).ok().as_deref(),
        Some(earlier),
        "the earlier run's trace is still whole"
    );
}

#[test]
fn a_shutdown_whose_state_cannot_be_written_still_drains_and_releases_the_lock() {
    let mut cgroups = require!(
        "the cgroup v1 memory and freezer hierarchies",
        TestCgroups::create(&["memory", "freezer"])
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let mut disk = require!(
        "a tmpfs of the test's own (mount, as root)",
        FullDisk::mount(&dir.path().join("disk"), 64)
    );
    let bus = require!("a private dbus-daemon", PrivateBus::start(dir.path()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let logind = runtime.block_on(FakeLogind::serve(&bus, fake_state(3600)));
    let web = cgroups.child("web");
    let pid = cgroups.spawn_shell(&web, "exec sleep 1000", "sleep");
    let state_file = disk.path().join("state/graceful_shutdown_state.json");
    disk.fill();
    assert!(disk.is_full());
    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\n\
             metricsAddress: 127.0.0.1:0\n\
             shutdownStateFile: {state}\n\
             logindDropInPath: {root}/logind.conf.d/99-nodekeeper.conf\n\
             dbusAddress: {bus}\n\
             kubernetes:\n  enabled: false\n\
             cgroupRoot: {cgroup_root}\n\
             shutdownGracePeriod: 5s\n\
             workloads:\n  parentCgroup: {parent}\n",
            state = state_file.display(),
            root = dir.path().display(),
            bus = bus.address(),
            cgroup_root = cgroups.v1_root().display(),
            parent = cgroups.parent.display(),
        ),
    )
    .expect("config");
    let mut agent = AgentProcess::start(&[std::ffi::OsStr::new("--config"), config.as_os_str()]);
    agent.wait_for_line("logind delay lock held", Duration::from_secs(10));
    assert_eq!(write_errors(&agent, "shutdown_state"), 0);

    let announced = runtime.block_on(logind.announce(true));
    let (_, line) = agent.wait_for_line("shutdown start not persisted", Duration::from_secs(10));
    assert!(
        line.contains(&state_file.display().to_string()) && line.contains("No space left"),
        "the error names the file and the cause: {line}"
    );
    logind.wait_for_release();
    let drained = announced.elapsed();
    assert!(
        !cgroups.child_running(pid),
        "the workload is stopped though its progress could not be recorded"
    );
    // The start, each phase's end and the end of the shutdown: each save failed, and
    // each is counted.
    let failed = write_errors(&agent, "shutdown_state");
    assert!(failed >= 2, "{failed} failed saves counted");
    assert_eq!(http_get(&agent.address, "/healthz").0, 200);
    assert!(
        !state_file.exists(),
        "nothing half-written is left where a restarted agent would read it"
    );
    eprintln!("drained in {drained:?} with the state file unwritable; {failed} saves failed");
    assert!(agent.stop(Duration::from_secs(20)).success());
    disk.free();
}
