//! The agent process with a fake logind on a private bus:
//! - it keeps answering while its decision cycle is stuck in the kernel. `/proc/meminfo` is
//!   replaced (through `procRoot`) by a FIFO that nobody writes: reading it blocks exactly
//!   like a read from a hung NFS mount or a `statvfs` on one. Meanwhile logind's
//!   PrepareForShutdown and `/healthz` must be answered within 100 ms, and the agent must
//!   still stop on SIGTERM;
//! - in dry-run mode a node shutdown is planned and logged, and no workload is stopped.
//!
//! Needs `dbus-daemon` (and, for the dry-run test, real cgroups); fails under `CI=true`
//! without them.

mod support {
    #[allow(dead_code)]
    pub mod agent_process;
    #[allow(dead_code)]
    pub mod allocator;
    #[allow(dead_code)]
    pub mod cgroups;
    pub mod logind_fake;
    #[allow(dead_code)]
    pub mod real;
}

use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{OFlag, open};
use nix::sys::stat::Mode;
use support::agent_process::{AgentProcess, http_get};
use support::cgroups::TestCgroups;
use support::logind_fake::{FakeLogind, PrivateBus, fake_state};

const DBUS: &str = "a private dbus-daemon";
/// What the issue asks of a node agent under load; an idle loopback answer takes ~1 ms.
const ANSWER_WITHIN: Duration = Duration::from_millis(100);

/// Stop the agent as an operator would and expect a clean exit.
fn stop(agent: &mut AgentProcess) {
    let status = agent.stop(Duration::from_secs(20));
    assert!(
        status.success(),
        "agent exit: {status:?} (signal {:?})",
        status.signal()
    );
}

/// Write an agent configuration for a dry-run, standalone agent that talks to the fake
/// logind on `bus` and keeps its files in `dir`, plus `specific` lines of the test's own.
fn write_config(dir: &Path, bus: &PrivateBus, specific: &str) -> PathBuf {
    let root = dir.display();
    let config = dir.join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: nodekeeper.io/v1alpha1
kind: AgentConfiguration
dryRun: true
metricsAddress: 127.0.0.1:0
shutdownStateFile: {root}/state/graceful_shutdown_state.json
logindDropInPath: {root}/logind.conf.d/99-nodekeeper.conf
dbusAddress: {bus}
kubernetes:
  enabled: false
{specific}",
            bus = bus.address()
        ),
    )
    .unwrap();
    config
}

fn fake_logind(dir: &Path) -> Result<(PrivateBus, tokio::runtime::Runtime, FakeLogind), String> {
    let bus = PrivateBus::start(dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let logind = runtime.block_on(FakeLogind::serve(&bus, fake_state(3600)));
    Ok((bus, runtime, logind))
}

fn wait_for_release(logind: &FakeLogind) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while logind.held() != 0 {
        assert!(
            Instant::now() < deadline,
            "the drain never released the delay lock"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Open the FIFO's write end once the agent's cycle is blocked opening it for reading
/// (before that, a non-blocking open fails with ENXIO). Holding the write end without
/// writing keeps the reader blocked in `read`.
fn hold_fifo_writer(fifo: &Path, within: Duration) -> std::os::fd::OwnedFd {
    let deadline = Instant::now() + within;
    loop {
        match open(fifo, OFlag::O_WRONLY | OFlag::O_NONBLOCK, Mode::empty()) {
            Ok(fd) => return fd,
            Err(nix::errno::Errno::ENXIO) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(error) => panic!("the agent's cycle never read {}: {error}", fifo.display()),
        }
    }
}

#[test]
fn prepare_for_shutdown_and_healthz_are_answered_while_a_cycle_is_stuck_on_a_hung_file() {
    let dir = tempfile::tempdir().unwrap();
    let (bus, runtime, logind) = require!(DBUS, fake_logind(dir.path()));

    let proc_root = dir.path().join("proc");
    let cgroup_root = dir.path().join("cgroup");
    std::fs::create_dir_all(proc_root.join("sys/kernel/random")).unwrap();
    std::fs::create_dir_all(&cgroup_root).unwrap();
    // The shutdown record names its boot, read under procRoot like every proc file.
    std::fs::write(
        proc_root.join("sys/kernel/random/boot_id"),
        "hung-file-test-boot\n",
    )
    .unwrap();
    let meminfo = proc_root.join("meminfo");
    nix::unistd::mkfifo(&meminfo, Mode::S_IRUSR | Mode::S_IWUSR).unwrap();
    let root = dir.path().display();
    let config = write_config(
        dir.path(),
        &bus,
        &format!(
            "housekeepingInterval: 100ms
procRoot: {root}/proc
cgroupRoot: {root}/cgroup
nodefsPath: {root}
shutdownGracePeriod: 30s
"
        ),
    );

    let mut agent = AgentProcess::start(&[OsStr::new("--config"), config.as_os_str()]);
    let writer = hold_fifo_writer(&meminfo, Duration::from_secs(10));
    agent.wait_for_line("logind delay lock held", Duration::from_secs(10));
    assert_eq!(logind.held(), 1);
    // The cycle is now blocked reading meminfo, and stays so until the writer writes.
    std::thread::sleep(Duration::from_millis(200));

    let asked = Instant::now();
    let (status, _) = http_get(&agent.address, "/healthz");
    let healthz = asked.elapsed();
    assert_eq!(status, 200, "/healthz while the cycle is stuck");
    assert!(healthz < ANSWER_WITHIN, "/healthz took {healthz:?}");

    let sent = runtime.block_on(logind.announce(true));
    let (seen, _) = agent.wait_for_line("PrepareForShutdown(true)", Duration::from_secs(10));
    let reaction = seen.saturating_duration_since(sent);
    assert!(
        reaction < ANSWER_WITHIN,
        "PrepareForShutdown handled after {reaction:?}"
    );
    wait_for_release(&logind);
    println!("stuck cycle: /healthz in {healthz:?}, PrepareForShutdown seen after {reaction:?}");

    // Let the stuck read finish, then stop as an operator would.
    let mut writer = std::fs::File::from(writer);
    writer
        .write_all(b"MemTotal: 1024 kB\nMemAvailable: 512 kB\n")
        .unwrap();
    drop(writer);
    stop(&mut agent);
}

#[test]
fn a_dry_run_plans_and_logs_a_node_shutdown_but_stops_no_workload() {
    let mut cgroups = require!(
        "the cgroup v1 memory and freezer hierarchies",
        TestCgroups::create(&["memory", "freezer"])
    );
    let dir = tempfile::tempdir().unwrap();
    let (bus, runtime, logind) = require!(DBUS, fake_logind(dir.path()));
    let web = cgroups.child("web");
    let pid = cgroups.spawn_shell(&web, "exec sleep 1000", "sleep");
    let config = write_config(
        dir.path(),
        &bus,
        &format!(
            "cgroupRoot: {cgroup_root}
shutdownGracePeriod: 5s
workloads:
  parentCgroup: {parent}
",
            cgroup_root = cgroups.v1_root().display(),
            parent = cgroups.parent.display(),
        ),
    );
    let mut agent = AgentProcess::start(&[OsStr::new("--config"), config.as_os_str()]);
    agent.wait_for_line("logind delay lock held", Duration::from_secs(10));
    // With graceful shutdown on, the lock's gauges are exported, and say it is held.
    let held = "nodekeeper_shutdown_inhibit_lock_held 1";
    let sufficient = "nodekeeper_shutdown_inhibit_delay_sufficient 1";
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, metrics) = http_get(&agent.address, "/metrics");
        if metrics.contains(held) && metrics.contains(sufficient) {
            break;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "{held} and {sufficient} missing:\n{metrics}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    runtime.block_on(logind.announce(true));
    let (_, line) = agent.wait_for_line("would stop pod", Duration::from_secs(10));
    assert!(line.contains("/web"), "{line}");
    wait_for_release(&logind);
    assert!(
        cgroups.child_running(pid),
        "a dry run must not stop the workload"
    );
    stop(&mut agent);
}
