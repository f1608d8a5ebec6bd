//! The agent process with a fake logind on a private bus:
//! - it keeps answering while its decision cycle is stuck in the kernel. `/proc/meminfo` is
//!   replaced (through `procRoot`) by a FIFO that nobody writes: reading it blocks exactly
//!   like a read from a hung NFS mount or a `statvfs` on one. Meanwhile logind's
//!   PrepareForShutdown and `/healthz` must be answered within 100 ms, and the agent must
//!   still stop on SIGTERM;
//! - in dry-run mode a node shutdown is planned and logged, and no workload is stopped;
//! - as a systemd service (a test's NOTIFY_SOCKET, WATCHDOG_USEC and LISTEN_FDS), it says
//!   READY once the lock is held, pings the watchdog from its decision loop only (not
//!   while a cycle hangs on a FIFO), stores the lock in the file descriptor store, leaves
//!   it there when it stops, takes it back when it starts again, and lets a stored lock
//!   go at once when graceful shutdown is off or it cannot start.
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
    pub mod poll;
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

    let (proc_root, config) = fake_host(dir.path(), &bus);
    let meminfo = proc_root.join("meminfo");
    std::fs::remove_file(&meminfo).unwrap();
    nix::unistd::mkfifo(&meminfo, Mode::S_IRUSR | Mode::S_IWUSR).unwrap();

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
    logind.wait_for_release();
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
    support::poll::Wait::for_(&format!("{held} and {sufficient}"), Duration::from_secs(10))
        .showing(|| http_get(&agent.address, "/metrics").1)
        .until_true(|| {
            let (_, metrics) = http_get(&agent.address, "/metrics");
            metrics.contains(held) && metrics.contains(sufficient)
        });

    runtime.block_on(logind.announce(true));
    let (_, line) = agent.wait_for_line("would stop pod", Duration::from_secs(10));
    assert!(line.contains("/web"), "{line}");
    logind.wait_for_release();
    assert!(
        cgroups.child_running(pid),
        "a dry run must not stop the workload"
    );
    stop(&mut agent);
}

/// The service manager's end of sd_notify(3): a datagram socket in a temporary
/// directory; every message is read with the descriptors it carried.
struct NotifySocket {
    path: PathBuf,
    messages: std::sync::mpsc::Receiver<(Instant, String, Vec<std::os::fd::OwnedFd>)>,
}

impl NotifySocket {
    fn bind(dir: &Path) -> NotifySocket {
        let path = dir.join("notify.sock");
        let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let (tx, messages) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            while let Ok((text, fds)) =
                nodekeeper::systemd::notify::receive(std::os::fd::AsFd::as_fd(&socket))
            {
                if tx.send((Instant::now(), text, fds)).is_err() {
                    return;
                }
            }
        });
        NotifySocket { path, messages }
    }

    /// The next message starting with `prefix`, skipping others (kept in `skipped`).
    fn next(
        &self,
        prefix: &str,
        within: Duration,
        skipped: &mut Vec<String>,
    ) -> (Instant, String, Vec<std::os::fd::OwnedFd>) {
        let give_up = Instant::now() + within;
        loop {
            let left = give_up.saturating_duration_since(Instant::now());
            match self.messages.recv_timeout(left) {
                Ok(message) if message.1.starts_with(prefix) => return message,
                Ok((_, other, _)) => skipped.push(other),
                Err(_) => panic!("no {prefix:?} message within {within:?}; others: {skipped:?}"),
            }
        }
    }

    /// Every message so far.
    fn drain(&self) -> Vec<String> {
        self.messages.try_iter().map(|(_, text, _)| text).collect()
    }
}

/// A dry-run agent's configuration (written by [`write_config`]) on a host of files:
/// The agent binary as systemd starts it: messages to `manager`, the watchdog to be
/// pinged every 200 ms, and `passed` (a stored descriptor's name and a copy of it) handed
/// over as fd 3 with `LISTEN_FDS`, `LISTEN_FDNAMES` and this process's `LISTEN_PID`.
fn as_systemd_starts_it(
    manager: &NotifySocket,
    passed: Option<(&str, &std::os::fd::OwnedFd)>,
) -> std::process::Command {
    let mut command = match passed {
        None => std::process::Command::new(support::agent_process::BINARY),
        Some((name, descriptor)) => {
            let mut command = std::process::Command::new("sh");
            command
                .args([
                    "-c",
                    "export LISTEN_PID=$$; exec \"$0\" \"$@\" 3<&0 0</dev/null",
                    support::agent_process::BINARY,
                ])
                .env("LISTEN_FDS", "1")
                .env("LISTEN_FDNAMES", name)
                .stdin(std::process::Stdio::from(descriptor.try_clone().unwrap()));
            command
        }
    };
    command
        .env("NOTIFY_SOCKET", &manager.path)
        .env("WATCHDOG_USEC", "400000");
    command
}

/// A dry-run agent's configuration's meminfo and a boot id, an empty `cgroupRoot`, graceful
/// shutdown on, a cycle every 100 ms. Returns `procRoot` and the configuration's path.
fn fake_host(dir: &Path, bus: &PrivateBus) -> (PathBuf, PathBuf) {
    let proc_root = dir.join("proc");
    std::fs::create_dir_all(proc_root.join("sys/kernel/random")).unwrap();
    std::fs::create_dir_all(dir.join("cgroup")).unwrap();
    // The shutdown record names its boot, read under procRoot like every proc file.
    std::fs::write(
        proc_root.join("sys/kernel/random/boot_id"),
        "fake-host-boot\n",
    )
    .unwrap();
    std::fs::copy("/proc/meminfo", proc_root.join("meminfo")).unwrap();
    let root = dir.display();
    let config = write_config(
        dir,
        bus,
        &format!(
            "housekeepingInterval: 100ms
procRoot: {root}/proc
cgroupRoot: {root}/cgroup
nodefsPath: {root}
shutdownGracePeriod: 30s
"
        ),
    );
    (proc_root, config)
}

#[test]
fn as_a_systemd_service_it_says_ready_pings_from_its_decision_loop_and_keeps_its_lock_stored() {
    let dir = tempfile::tempdir().unwrap();
    let (bus, _runtime, logind) = require!(DBUS, fake_logind(dir.path()));
    let (proc_root, config) = fake_host(dir.path(), &bus);
    let manager = NotifySocket::bind(dir.path());
    let mut agent = AgentProcess::start_from(
        as_systemd_starts_it(&manager, None),
        &[OsStr::new("--config"), config.as_os_str()],
    );

    // The lock goes to the store as soon as it is taken, and READY follows it, with a
    // Status line a person can read.
    let mut seen = Vec::new();
    let (stored_at, stored, mut fds) =
        manager.next("FDSTORE=1", Duration::from_secs(10), &mut seen);
    let name = stored
        .strip_prefix("FDSTORE=1\nFDNAME=")
        .expect("a named descriptor")
        .to_string();
    assert!(name.starts_with("nodekeeper-delay-lock."), "{name}");
    assert_eq!(
        fds.len(),
        1,
        "the lock's descriptor travels with the message"
    );
    let kept_by_systemd = fds.remove(0);
    let (ready_at, ready, _) = manager.next("READY=1", Duration::from_secs(10), &mut seen);
    assert!(ready_at >= stored_at, "READY before the lock was held");
    assert!(
        ready.contains("STATUS=dry run (evicting standalone workloads only in the log)")
            && ready.contains("logind delay lock held"),
        "{ready}"
    );

    // The decision loop pings the watchdog every 200 ms...
    let pings_from = Instant::now();
    let mut pings = 0;
    while pings_from.elapsed() < Duration::from_secs(1) {
        if let Ok((_, text, _)) = manager.messages.recv_timeout(Duration::from_millis(100))
            && text == "WATCHDOG=1"
        {
            pings += 1;
        }
    }
    assert!(pings >= 3, "{pings} pings in a second");

    // ... and stops when a cycle hangs in the kernel (meminfo becomes a FIFO nobody
    // writes, as a read from a hung mount blocks), while /healthz still answers: systemd
    // would restart this agent.
    let meminfo = proc_root.join("meminfo");
    let fifo = dir.path().join("meminfo.fifo");
    nix::unistd::mkfifo(&fifo, Mode::S_IRUSR | Mode::S_IWUSR).unwrap();
    std::fs::rename(&fifo, &meminfo).unwrap();
    let writer = hold_fifo_writer(&meminfo, Duration::from_secs(10));
    // Pings sent before the cycle blocked may still be on their way to the channel.
    std::thread::sleep(Duration::from_millis(300));
    manager.drain();
    std::thread::sleep(Duration::from_secs(1));
    let (status, _) = http_get(&agent.address, "/healthz");
    assert_eq!(status, 200, "/healthz while the cycle is stuck");
    let while_stuck = manager.drain();
    assert!(
        !while_stuck.iter().any(|message| message == "WATCHDOG=1"),
        "pinged while the decision loop was stuck: {while_stuck:?}"
    );
    // The read ends: the loop pings again.
    let real = dir.path().join("meminfo.real");
    std::fs::copy("/proc/meminfo", &real).unwrap();
    std::fs::rename(&real, &meminfo).unwrap();
    let mut writer = std::fs::File::from(writer);
    writer
        .write_all(std::fs::read("/proc/meminfo").unwrap().as_slice())
        .unwrap();
    drop(writer);
    manager.next("WATCHDOG=1", Duration::from_secs(2), &mut seen);

    // A stop keeps the stored copy: the lock outlives the agent.
    stop(&mut agent);
    let (_, stopping, _) = manager.next("STOPPING=1", Duration::from_secs(1), &mut seen);
    seen.extend(manager.drain());
    assert!(
        !seen
            .iter()
            .any(|message| message.starts_with("FDSTOREREMOVE")),
        "the stopping agent took its lock out of the store: {seen:?} {stopping}"
    );

    // The next agent gets it back as systemd passes it (fd 3, LISTEN_FDS), holds it until
    // it has a new lock, then lets the old one go, in the store too.
    let mut agent = AgentProcess::start_from(
        as_systemd_starts_it(&manager, Some((&name, &kept_by_systemd))),
        &[OsStr::new("--config"), config.as_os_str()],
    );
    agent.wait_for_line(
        "logind delay lock taken back from the service manager",
        Duration::from_secs(10),
    );
    let mut seen = Vec::new();
    let (_, new_lock, mut fds) = manager.next("FDSTORE=1", Duration::from_secs(10), &mut seen);
    assert_ne!(new_lock, stored, "a lock of its own, under its own name");
    let new_name = new_lock
        .strip_prefix("FDSTORE=1\nFDNAME=")
        .expect("a named descriptor")
        .to_string();
    let new_kept_by_systemd = fds.remove(0);
    let (_, removed, _) = manager.next("FDSTOREREMOVE=1", Duration::from_secs(10), &mut seen);
    assert_eq!(removed, format!("FDSTOREREMOVE=1\nFDNAME={name}"));
    // systemd closes its copy on FDSTOREREMOVE; the agent already closed its own.
    drop(kept_by_systemd);
    support::poll::Wait::for_("one lock held of two taken", Duration::from_secs(5))
        .every(Duration::from_millis(10))
        .showing(|| format!("held {} of {} locks", logind.held(), logind.inhibit_calls()))
        .until_true(|| logind.held() == 1 && logind.inhibit_calls() == 2);
    stop(&mut agent);

    // An agent whose configuration no longer asks for graceful shutdown lets a stored
    // lock go at once: nothing would release it before logind's limit otherwise.
    let config = write_config(
        dir.path(),
        &bus,
        &format!(
            "procRoot: {root}/proc\ncgroupRoot: {root}/cgroup\nnodefsPath: {root}\n",
            root = dir.path().display()
        ),
    );
    let mut agent = AgentProcess::start_from(
        as_systemd_starts_it(&manager, Some((&new_name, &new_kept_by_systemd))),
        &[OsStr::new("--config"), config.as_os_str()],
    );
    let mut seen = Vec::new();
    let (_, removed, _) = manager.next("FDSTOREREMOVE=1", Duration::from_secs(10), &mut seen);
    assert_eq!(removed, format!("FDSTOREREMOVE=1\nFDNAME={new_name}"));
    drop(new_kept_by_systemd);
    support::poll::Wait::for_("the stored lock to be let go", Duration::from_secs(5))
        .every(Duration::from_millis(10))
        .until_true(|| logind.held() == 0);
    stop(&mut agent);
}

#[test]
fn an_agent_that_cannot_start_lets_a_stored_lock_go() {
    // Restarted again and again by systemd, it could never drain: the lock its previous
    // run kept must not hold the node's shutdown up until logind's limit.
    let dir = tempfile::tempdir().unwrap();
    let manager = NotifySocket::bind(dir.path());
    let config = dir.path().join("agent.yaml");
    std::fs::write(&config, "evictionHard: {memory.available: plenty}\n").unwrap();
    let (_logind_end, lock) = nix::unistd::pipe().unwrap();
    let name = "nodekeeper-delay-lock.4242.1";
    let output = as_systemd_starts_it(&manager, Some((name, &lock)))
        .args(["agent", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!output.status.success(), "{output:?}");
    let mut seen = Vec::new();
    let (_, removed, _) = manager.next("FDSTOREREMOVE=1", Duration::from_secs(5), &mut seen);
    assert_eq!(removed, format!("FDSTOREREMOVE=1\nFDNAME={name}"));
}
