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
    pub mod allocator;
    #[allow(dead_code)]
    pub mod cgroups;
    pub mod logind_fake;
    #[allow(dead_code)]
    pub mod real;
}

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::fcntl::{OFlag, open};
use nix::sys::signal::{Signal, kill};
use nix::sys::stat::Mode;
use nix::unistd::Pid;
use support::cgroups::TestCgroups;
use support::logind_fake::{FakeLogind, PrivateBus, fake_state};

const DBUS: &str = "a private dbus-daemon";
/// What the issue asks of a node agent under load; an idle loopback answer takes ~1 ms.
const ANSWER_WITHIN: Duration = Duration::from_millis(100);

struct AgentProcess {
    child: Child,
    lines: mpsc::Receiver<(Instant, String)>,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        // Only the agent this test started, by its PID.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl AgentProcess {
    fn start(config: &Path) -> AgentProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
            .args(["agent", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start nodekeeper agent");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        AgentProcess { child, lines }
    }

    /// The first log line containing `text`, with the time it was read.
    fn wait_for_line(&self, text: &str, within: Duration) -> (Instant, String) {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok((at, line)) if line.contains(text) => return (at, line),
                Ok((_, line)) => seen.push(line),
                Err(_) => break,
            }
        }
        panic!(
            "no log line with {text:?} within {within:?}; log:\n{}",
            seen.join("\n")
        );
    }
}

fn metrics_address(agent: &AgentProcess) -> String {
    let (_, line) = agent.wait_for_line("serving /metrics", Duration::from_secs(30));
    line.split("address=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the metrics address in the log")
        .to_string()
}

fn stop(agent: &mut AgentProcess) {
    kill(Pid::from_raw(agent.child.id() as i32), Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = agent.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        status.success(),
        "agent exit: {status:?} (signal {:?})",
        status.signal()
    );
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

fn http_status(address: &str, path: &str) -> u16 {
    let mut stream = TcpStream::connect(address).expect("connect to the agent");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
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
    std::fs::create_dir_all(&proc_root).unwrap();
    std::fs::create_dir_all(&cgroup_root).unwrap();
    let meminfo = proc_root.join("meminfo");
    nix::unistd::mkfifo(&meminfo, Mode::S_IRUSR | Mode::S_IWUSR).unwrap();
    let config = dir.path().join("agent.yaml");
    let root = dir.path().display();
    std::fs::write(
        &config,
        format!(
            "apiVersion: nodekeeper.io/v1alpha1
kind: AgentConfiguration
dryRun: true
housekeepingInterval: 100ms
metricsAddress: 127.0.0.1:0
procRoot: {root}/proc
cgroupRoot: {root}/cgroup
nodefsPath: {root}
shutdownGracePeriod: 30s
shutdownStateFile: {root}/state/graceful_shutdown_state.json
logindDropInPath: {root}/logind.conf.d/99-nodekeeper.conf
dbusAddress: {bus}
kubernetes:
  enabled: false
",
            bus = bus.address()
        ),
    )
    .unwrap();

    let mut agent = AgentProcess::start(&config);
    let address = metrics_address(&agent);
    let writer = hold_fifo_writer(&meminfo, Duration::from_secs(10));
    agent.wait_for_line("logind delay lock held", Duration::from_secs(10));
    assert_eq!(logind.held(), 1);
    // The cycle is now blocked reading meminfo, and stays so until the writer writes.
    std::thread::sleep(Duration::from_millis(200));

    let asked = Instant::now();
    let status = http_status(&address, "/healthz");
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
    let deadline = Instant::now() + Duration::from_secs(10);
    while logind.held() != 0 {
        assert!(
            Instant::now() < deadline,
            "the drain never released the delay lock"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
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
    let config = dir.path().join("agent.yaml");
    let root = dir.path().display();
    std::fs::write(
        &config,
        format!(
            "apiVersion: nodekeeper.io/v1alpha1
kind: AgentConfiguration
dryRun: true
metricsAddress: 127.0.0.1:0
cgroupRoot: {cgroup_root}
shutdownGracePeriod: 5s
shutdownStateFile: {root}/state/graceful_shutdown_state.json
logindDropInPath: {root}/logind.conf.d/99-nodekeeper.conf
dbusAddress: {bus}
workloads:
  parentCgroup: {parent}
kubernetes:
  enabled: false
",
            cgroup_root = cgroups.v1_root().display(),
            parent = cgroups.parent.display(),
            bus = bus.address()
        ),
    )
    .unwrap();
    let mut agent = AgentProcess::start(&config);
    metrics_address(&agent);
    agent.wait_for_line("logind delay lock held", Duration::from_secs(10));

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
