//! The shipped systemd units, as an operator installs them, on a node booted with
//! systemd-nspawn (real systemd and logind, a cgroup v2 tree). `systemd-analyze verify`
//! accepts both units; the agent's unit (`systemd/nodekeeper-agent.service`, changed only
//! by a drop-in that sends its log to the test and shortens the watchdog to 3 s) runs the
//! agent in standalone mode with two workloads of user `nobody`, and shows:
//!
//! - READY: the unit is active only once the agent said so (`Type=notify`), and
//!   `systemctl status` shows what it does;
//! - the hardening blocks none of its work: it reads the node's signals, kills a workload
//!   of another user (an always-met threshold), raises logind's limit with a drop-in in
//!   `/etc`, takes the delay lock over D-Bus, serves /healthz, and at power-off drains the
//!   other workload and writes its state under `/var/lib/nodekeeper`;
//! - the lock kept across restarts: after a SIGKILL, after the watchdog aborted an agent
//!   stopped in its tracks, and through `systemctl restart`, logind lists the lock at
//!   every look, and the restarted agent takes it back from systemd's file descriptor
//!   store; `systemctl stop` lets it go;
//! - a power-off not held up by the stored copy: once the agent has drained and let go,
//!   the node goes down without waiting for logind's limit;
//! - `realtimePriority` refused by the unit's hardening (the agent warns and works on the
//!   normal scheduler) until the drop-in docs/install.md gives is added: then its decision
//!   cycle thread (on which the kernel notifiers wait) runs at SCHED_FIFO, and no other
//!   thread does.

mod support;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use nodekeeper::shutdown::state::{PhaseStatus, ShutdownOutcome, ShutdownState, StateStore};
use support::nspawn::{BootOptions, Booted, Container, NSPAWN};

const AGENT_UNIT: &str = include_str!("../systemd/nodekeeper-agent.service");
const CONTROLLER_UNIT: &str = include_str!("../systemd/nodekeeper-controller.service");

/// logind's limit the agent must raise (its default is 5 s).
const BUDGET_SECONDS: u64 = 8;

/// Standalone mode; `memory.available` below 1000Ti is always met, so the agent evicts
/// every workload that is not critical (the victim), one per cycle.
fn agent_config() -> String {
    format!(
        "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\n\
         housekeepingInterval: 1s\nmetricsAddress: 127.0.0.1:0\n\
         realtimePriority: {REALTIME_PRIORITY}\n\
         evictionHard: {{memory.available: 1000Ti}}\n\
         shutdownGracePeriod: {BUDGET_SECONDS}s\nshutdownGracePeriodCriticalPods: 3s\n\
         workloads:\n  parentCgroup: workloads.slice\n  namespace: default\n  pods:\n\
         \x20 - {{name: keeper.service, critical: true}}\n"
    )
}

/// The agent's `realtimePriority`.
const REALTIME_PRIORITY: u32 = 10;

/// The drop-in docs/install.md gives for `realtimePriority`: its one `ini` block.
fn realtime_drop_in() -> String {
    let install = include_str!("../docs/install.md");
    let (_, after) = install
        .split_once("```ini\n")
        .expect("an ini block in docs/install.md");
    let (block, _) = after.split_once("```").expect("the ini block's end");
    let block: String = block
        .lines()
        .map(|line| line.trim())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(block.contains("RestrictRealtime=no"), "{block}");
    block + "\n"
}

/// The agent's threads, seen from inside the node: name, policy and priority.
fn agent_threads(container: &Container) -> Vec<(String, (i32, u32))> {
    let pid = property(container, "MainPID");
    support::scheduling::threads_in_stats(
        &container.stdout(&format!("cat /proc/{pid}/task/*/stat")),
    )
}

/// Whether the decision cycle thread (on which the kernel notifiers wait) runs at
/// SCHED_FIFO with `REALTIME_PRIORITY` (`realtime`) or on the normal scheduler; every
/// other thread is always on the normal scheduler.
fn assert_realtime_threads(container: &Container, realtime: bool) {
    support::scheduling::assert_real_time_only_on_the_decision_path(
        &agent_threads(container),
        realtime.then_some(REALTIME_PRIORITY),
    );
}

/// What the test changes of the shipped unit: where the log goes, and a watchdog period
/// a test can wait for.
const TEST_DROP_IN: &str = "[Service]\n\
    StandardError=append:/shared/agent.log\n\
    Environment=RUST_LOG=info NO_COLOR=1\n\
    WatchdogSec=3s\n";

/// A workload of user `nobody` in `workloads.slice`: the agent needs CAP_KILL to stop it.
fn workload(description: &str) -> String {
    format!(
        "[Unit]\nDescription={description}\n\n[Service]\nSlice=workloads.slice\nUser=nobody\n\
         ExecStart=/bin/sleep infinity\n\n[Install]\nWantedBy=multi-user.target\n"
    )
}

fn boot() -> Result<Booted, String> {
    let units = vec![
        ("victim.service", workload("a workload the agent evicts")),
        ("keeper.service", workload("a critical workload")),
        ("nodekeeper-agent.service", AGENT_UNIT.to_string()),
    ];
    let options = BootOptions {
        unified: true,
        tree_files: vec![
            (
                "/etc/nodekeeper/agent.yaml".to_string(),
                agent_config().into_bytes(),
            ),
            (
                "/etc/systemd/system/nodekeeper-agent.service.d/test.conf".to_string(),
                TEST_DROP_IN.as_bytes().to_vec(),
            ),
            // Installed, not enabled: the controller has no cluster here.
            (
                "/etc/systemd/system/nodekeeper-controller.service".to_string(),
                CONTROLLER_UNIT.as_bytes().to_vec(),
            ),
        ],
        ..BootOptions::default()
    };
    support::nspawn::boot_with(&units, &[], "told systemd the agent is ready", options)
}

/// A property of the agent's unit.
fn property(container: &Container, name: &str) -> String {
    container.unit_property("nodekeeper-agent.service", name)
}

fn lock_listed(container: &Container) -> bool {
    container
        .stdout("systemd-inhibit --list --no-pager")
        .lines()
        .any(|line| line.contains("nodekeeper") && line.contains("delay"))
}

fn agent_log(booted: &Booted) -> String {
    std::fs::read_to_string(booted.shared.join("agent.log")).unwrap_or_default()
}

/// Waits up to `limit` for `check`; fails naming `what`, with the agent's log.
fn wait_until(booted: &Booted, what: &str, limit: Duration, check: impl FnMut() -> bool) {
    support::poll::Wait::for_(what, limit)
        .every(Duration::from_millis(50))
        .showing(|| format!("agent log:\n{}", agent_log(booted)))
        .until_true(check)
}

/// The agent's last /metrics address, from its log.
fn metrics_address(booted: &Booted) -> String {
    let log = agent_log(booted);
    let line = log
        .lines()
        .rev()
        .find(|line| line.contains("serving /metrics"))
        .expect("the agent logs its metrics address");
    let address = line.split("address=").nth(1).expect("an address field");
    address
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn healthz(address: &str) -> String {
    let mut stream = std::net::TcpStream::connect(address).expect("the agent's HTTP server");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("a timeout");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
        .expect("a request");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

/// Looks at logind's inhibitors every 50 ms until `done`, and returns (looks, looks
/// without the agent's lock).
/// Looks at logind's locks every 50 ms until `done`, counting each look in `looks` as
/// it goes; returns how many looks found the agent's lock missing.
fn watch_lock(
    container: &Container,
    done: &std::sync::atomic::AtomicBool,
    looks: &std::sync::atomic::AtomicU32,
) -> u32 {
    let mut missing = 0;
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        if !lock_listed(container) {
            missing += 1;
        }
        looks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
    }
    missing
}

/// Runs `disrupt`, then waits until a new agent process is active and ready, while
/// watching the lock throughout. Returns how long the restart took.
fn restart_keeping_the_lock(
    booted: &Booted,
    what: &str,
    disrupt: impl FnOnce(&Container),
) -> Duration {
    let container = &booted.container;
    let before = property(container, "MainPID");
    let ready_lines = agent_log(booted)
        .matches("told systemd the agent is ready")
        .count();
    let done = std::sync::atomic::AtomicBool::new(false);
    let looked = std::sync::atomic::AtomicU32::new(0);
    let started = Instant::now();
    let (looks, missing) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| watch_lock(container, &done, &looked));
        disrupt(container);
        wait_until(
            booted,
            &format!("the restart after {what}"),
            Duration::from_secs(40),
            || {
                property(container, "ActiveState") == "active"
                    && property(container, "MainPID") != before
                    && agent_log(booted)
                        .matches("told systemd the agent is ready")
                        .count()
                        > ready_lines
            },
        );
        // A few more looks with the new agent holding its own lock, and enough in all to
        // tell on a busy machine, where each look is slow.
        std::thread::sleep(Duration::from_millis(500));
        let enough = Instant::now() + Duration::from_secs(10);
        while looked.load(std::sync::atomic::Ordering::SeqCst) < 10 && Instant::now() < enough {
            std::thread::sleep(Duration::from_millis(50));
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        let missing = watcher.join().expect("the lock watcher");
        (looked.load(std::sync::atomic::Ordering::SeqCst), missing)
    });
    let took = started.elapsed();
    assert_ne!(
        property(container, "MainPID"),
        before,
        "a new agent process"
    );
    println!(
        "{what}: restarted and ready after {:.1}s; logind listed the lock at {} of {looks} looks",
        took.as_secs_f64(),
        looks - missing
    );
    assert!(looks >= 10, "too few looks ({looks}) to tell");
    assert_eq!(
        missing, 0,
        "the delay lock was missing at {missing} of {looks} looks during the restart after {what}"
    );
    took
}

#[test]
fn the_shipped_unit_runs_the_agent_hardened_ready_watched_and_keeping_its_lock() {
    let mut booted: Booted = require!(NSPAWN, boot());
    let container = &booted.container;

    // Both shipped units pass systemd's own checks, on a full Debian tree. Their manual
    // pages (`Documentation=man:...`) come with the Debian package, which
    // tests/debian_package.rs checks for them.
    let verify = container.exec(
        "systemd-analyze verify --man=no /etc/systemd/system/nodekeeper-agent.service \
         /etc/systemd/system/nodekeeper-controller.service 2>&1",
    );
    let verdict = String::from_utf8_lossy(&verify.stdout).to_string();
    assert!(verify.status.success(), "systemd-analyze verify: {verdict}");
    assert!(
        !verdict.contains("nodekeeper"),
        "systemd-analyze verify found fault with a unit: {verdict}"
    );

    // READY: a Type=notify unit is active only once the agent has said it is ready.
    assert_eq!(property(container, "Type"), "notify");
    assert_eq!(property(container, "ActiveState"), "active");
    assert_eq!(property(container, "NRestarts"), "0");
    let status = property(container, "StatusText");
    println!("Status: {status}");
    assert!(
        status.contains("evicting standalone workloads")
            && status.contains("logind delay lock held"),
        "{status}"
    );
    assert!(
        property(container, "WatchdogUSec") == "3s",
        "the drop-in's watchdog"
    );

    // The hardening lets it do its work: the drop-in in /etc, the lock over D-Bus, HTTP.
    assert!(lock_listed(container), "logind lists the agent's lock");
    let drop_in = std::fs::read_to_string(
        booted
            .root
            .join("etc/systemd/logind.conf.d/99-nodekeeper.conf"),
    )
    .expect("the logind drop-in");
    assert!(
        drop_in.contains(&format!("InhibitDelayMaxSec={BUDGET_SECONDS}")),
        "{drop_in}"
    );
    let answer = healthz(&metrics_address(&booted));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // The shipped unit refuses real-time scheduling (RestrictRealtime=yes, no
    // CAP_SYS_NICE): the agent says so, naming the setting, and works on regardless.
    let log = agent_log(&booted);
    assert!(
        log.contains(&format!(
            "realtimePriority {REALTIME_PRIORITY}: the decision cycle thread stays on the normal scheduler"
        )),
        "{log}"
    );
    assert_realtime_threads(container, false);

    // ... and kill a workload of another user.
    wait_until(
        &booted,
        "the victim's eviction",
        Duration::from_secs(30),
        || container.stdout("systemctl is-active victim.service") != "active",
    );
    assert!(
        agent_log(&booted).contains("evicted pod"),
        "{}",
        agent_log(&booted)
    );
    assert_eq!(
        container.stdout("systemctl is-active keeper.service"),
        "active"
    );
    wait_until(
        &booted,
        "the eviction on the Status line",
        Duration::from_secs(10),
        || property(container, "StatusText").contains("last default/victim.service"),
    );
    println!("Status: {}", property(container, "StatusText"));

    // A crash: systemd restarts the agent after RestartSec, keeping the lock meanwhile.
    restart_keeping_the_lock(&booted, "a SIGKILL", |container| {
        let killed = container.exec("systemctl kill --signal=SIGKILL nodekeeper-agent.service");
        assert!(killed.status.success(), "{killed:?}");
    });
    assert_eq!(property(&booted.container, "NRestarts"), "1");
    let log = agent_log(&booted);
    assert!(
        log.contains("logind delay lock taken back from the service manager"),
        "{log}"
    );

    // A hung agent: stopped in its tracks, it pings no more; the watchdog aborts it.
    restart_keeping_the_lock(&booted, "the watchdog", |container| {
        let pid = property(container, "MainPID");
        let stopped = container.exec(&format!("kill -STOP {pid}"));
        assert!(stopped.status.success(), "{stopped:?}");
    });
    assert_eq!(property(&booted.container, "NRestarts"), "2");
    let journal = booted
        .container
        .stdout("journalctl --no-pager -u nodekeeper-agent.service");
    assert!(journal.contains("Watchdog timeout"), "{journal}");

    // An operator's restart (an upgrade) keeps it the same way; here the operator adds
    // the drop-in that lets the agent run real-time.
    std::fs::write(
        booted
            .root
            .join("etc/systemd/system/nodekeeper-agent.service.d/realtime.conf"),
        realtime_drop_in(),
    )
    .expect("the realtime drop-in");
    restart_keeping_the_lock(&booted, "systemctl restart", |container| {
        let restarted =
            container.exec("systemctl daemon-reload && systemctl restart nodekeeper-agent.service");
        assert!(restarted.status.success(), "{restarted:?}");
    });
    let log = agent_log(&booted);
    assert!(
        log.contains("the decision cycle thread runs real-time"),
        "{log}"
    );
    assert_realtime_threads(&booted.container, true);

    // A stop is for good: systemd closes the store with the unit, and the lock goes.
    let container = &booted.container;
    let stopped = container.exec("systemctl stop nodekeeper-agent.service");
    assert!(stopped.status.success(), "{stopped:?}");
    wait_until(
        &booted,
        "the lock let go after a stop",
        Duration::from_secs(5),
        || !lock_listed(container),
    );
    let started = container.exec("systemctl start nodekeeper-agent.service");
    assert!(started.status.success(), "{started:?}");
    assert!(lock_listed(container), "READY comes after the lock");

    // Power-off: the agent drains the critical workload, writes its state, lets go of
    // the lock (and of systemd's copy), and the node goes down without waiting for
    // logind's limit.
    let container = &mut booted.container;
    let took = container.power_off();
    println!(
        "powered off {:.1}s after systemctl poweroff",
        took.as_secs_f64()
    );
    let log = agent_log(&booted);
    assert!(log.contains("delay lock released"), "{log}");
    let state: ShutdownState = StateStore::new(
        booted
            .root
            .join("var/lib/nodekeeper/graceful_shutdown_state.json"),
    )
    .load()
    .expect("the state file")
    .expect("a shutdown record");
    assert_eq!(state.outcome, ShutdownOutcome::Finished, "{state:?}");
    // Its phase completed: the SIGTERM reached a process of another user (CAP_KILL),
    // which ended, instead of the phase running out and the cgroup being killed.
    let keeper_phase = state
        .phases
        .iter()
        .find(|phase| phase.pods.iter().any(|pod| pod.name == "keeper.service"))
        .expect("the critical workload was drained");
    assert_eq!(keeper_phase.status, PhaseStatus::Completed, "{state:?}");
    assert!(
        took < Duration::from_secs(BUDGET_SECONDS),
        "the power-off waited {took:?}, as long as logind's limit: a copy of the lock was left open"
    );
}
