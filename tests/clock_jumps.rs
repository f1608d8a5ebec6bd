//! Fault injection: the controller's wall clock jumps (issue 16). The real controller
//! runs with libfaketime (Debian `libfaketime`) preloaded, its wall clock offset by what
//! the test writes into a file, its monotonic clock untouched, as an NTP step or an
//! operator's `date -s` would leave them. A node is lost; while the controller waits out
//! `unhealthyDuration`, its clock jumps two hours forward (the wait must not end early:
//! no fence starts), then two hours back (the wait must not grow: the fence starts on
//! time). Storage isolation by `fence_dummy`, then the power-off through `fence_ipmilan`
//! against `ipmi_sim`, as in `controller_e2e.rs`. The same two jumps come during each of
//! the controller's other waits: a failed step's retry backoff, the zone's fence rate, a
//! storm's cooldown, a partitioned node's isolation timeout, a fence Job's time,
//! `powerManagementDelay`, a release on a self-isolation promise and `kdumpWait`.
//!
//! The agent, under the same library, must not be judged stalled by its `/healthz` for a
//! jump forward, nor judged live for a jump back while its decision loop is stuck; and
//! its soft threshold's grace period and pressure transition period, as the kubelet's,
//! must neither end early nor run long; nor may its node conditions' heartbeat and an
//! event series' pace be silenced or hurried.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;

use support::agent_process::{AgentProcess, http_get};
use support::controller::*;
use support::fence_emulators::IpmiSim;

/// Debian's libfaketime preload library for multi-threaded programs, in this machine's
/// multiarch directory (`/usr/lib/<triplet>/faketime/`).
fn libfaketime() -> Result<String, String> {
    let found = std::fs::read_dir("/usr/lib")
        .map_err(|e| format!("/usr/lib: {e}"))?
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("faketime/libfaketimeMT.so.1"))
        .find(|path| path.exists());
    found.map(|path| path.display().to_string()).ok_or_else(|| {
        "no /usr/lib/*/faketime/libfaketimeMT.so.1 (Debian package libfaketime)".to_string()
    })
}

/// Sets the controller's wall clock `seconds` away from the real one. Replaced whole
/// (libfaketime reads the file at every clock read, and must never see it half written).
fn offset_clock(file: &Path, seconds: i64) {
    let next = file.with_extension("next");
    std::fs::write(&next, format!("{seconds:+}\n")).expect("the faketime offset file");
    std::fs::rename(&next, file).expect("the faketime offset file");
}

const UNHEALTHY: Duration = Duration::from_secs(10);

/// Fails unless at least 3 s of a wait of `due` from `since` are left to check with the
/// clock jumped forward (the check stops 3 s before the wait ends); `log` for the message.
fn assert_window_left(since: Instant, due: Duration, log: impl FnOnce() -> String) {
    let window = (due - Duration::from_secs(3)).saturating_sub(since.elapsed());
    assert!(
        window >= Duration::from_secs(3),
        "only {window:?} of the wait is left to jump the clock in\n{}",
        log()
    );
}

/// How late a wait may end, on a busy machine.
const LATE: Duration = Duration::from_secs(5);

/// `took` is when a wait of `due` ended as the test saw it: never more than `seen_late`
/// (how late the test can see its start) early, nor more than the 1 % by which the
/// controller's time may run off the monotonic clock while it takes a jump in; and at
/// most [`LATE`] late.
fn assert_on_time(
    what: &str,
    took: Duration,
    due: Duration,
    seen_late: Duration,
    controller: &ControllerProcess,
) {
    assert!(
        took + seen_late + due.mul_f64(0.01) >= due,
        "{what} after {took:?}, before {due:?}\n{}",
        controller.log()
    );
    assert!(
        took < due + LATE,
        "{what} only after {took:?}\n{}",
        controller.log()
    );
}

/// The controller with libfaketime preloaded, its wall clock offset by what
/// [`offset_clock`] writes into the returned file (nothing at first), leading and synced.
async fn faked_controller(
    dir: &Path,
    server: &support::apiserver::FakeApiServer,
    config: &Path,
    preload: &str,
) -> (ControllerProcess, std::path::PathBuf) {
    let offset = dir.join("faketime");
    offset_clock(&offset, 0);
    let offset_path = offset.display().to_string();
    let controller = ControllerProcess::start_with_environment(
        dir,
        server,
        config,
        &[
            ("LD_PRELOAD", preload),
            ("FAKETIME_TIMESTAMP_FILE", &offset_path),
            ("FAKETIME_NO_CACHE", "1"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    controller.synced().await;
    (controller, offset)
}

/// The controller's clock, jumped around a wait: `offset` is its faketime file, `node` the
/// object written again after each jump so that the controller looks at once with its new
/// time (a changed object is reconciled).
struct Jumps<'a> {
    offset: &'a Path,
    server: &'a support::apiserver::FakeApiServer,
    node: &'a Node,
    controller: &'a ControllerProcess,
}

impl Jumps<'_> {
    /// Sets the clock two hours forward; then, every 100 ms until 3 s before `due` after
    /// `since` (at least 3 s of it), `holds` must say the wait goes on (an error says what
    /// ended it early). Last, the controller must show the jump it does not follow, so a
    /// test whose clock never jumped cannot pass.
    async fn forward_while(
        &self,
        (since, due): (Instant, Duration),
        holds: impl Fn() -> Result<(), String>,
    ) {
        assert_window_left(since, due, || self.controller.log());
        offset_clock(self.offset, 7200);
        self.server.seed(self.node);
        while since.elapsed() < due - Duration::from_secs(3) {
            if let Err(what) = holds() {
                panic!(
                    "{what}, {:?} into a wait of {due:?}, after the clock jumped forward\n{}",
                    since.elapsed(),
                    self.controller.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let seen = metric_value(
            &self.controller.metrics(),
            "nodekeeper_controller_clock_offset_seconds",
        );
        assert!(
            seen.is_some_and(|offset| (7190.0..7210.0).contains(&offset)),
            "the controller shows no two-hour gap with the system clock: {seen:?}\n{}",
            self.controller.log()
        );
    }

    /// Sets the clock two hours back (four from the jump forward), then waits until
    /// `ended` sees the wait over; how long after `since` it did.
    async fn back_until(
        &self,
        what: &str,
        since: Instant,
        ended: impl FnMut() -> Option<Instant>,
    ) -> Duration {
        offset_clock(self.offset, -7200);
        self.server.seed(self.node);
        wait_for(self.controller, what, ended)
            .await
            .duration_since(since)
    }

    /// A power-off that waits through both jumps: none through `bmc` during the jump
    /// forward, then one when due; how long after `since` it came, asserted on time (the
    /// test sees the wait's start within 300 ms).
    async fn power_off_through(
        &self,
        bmc: &IpmiSim,
        (since, due): (Instant, Duration),
    ) -> Duration {
        let powered = || bmc.chassis_log().contains("set power");
        self.forward_while((since, due), || match powered() {
            false => Ok(()),
            true => Err(format!("the node was powered off: {}", bmc.chassis_log())),
        })
        .await;
        let took = self
            .back_until("the power-off", since, || powered().then(Instant::now))
            .await;
        self.on_time("the power-off", took, due, Duration::from_millis(300));
        took
    }

    /// [`assert_on_time`] for this controller.
    fn on_time(&self, what: &str, took: Duration, due: Duration, seen_late: Duration) {
        assert_on_time(what, took, due, seen_late, self.controller);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_jump_neither_fences_a_node_early_nor_holds_its_fence_back() {
    require!("fence-agents", fence_agents());
    let preload = require!("libfaketime", libfaketime());
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let (server, _fabric) = one_database_node(dir.path(), &bmc).await;
    let config = controller_config(dir.path(), "unhealthyDuration: 10s");
    let (controller, offset) = faked_controller(dir.path(), &server, &config, &preload).await;

    // worker-2 is lost; the node lifecycle controller marks it Unknown.
    let lost = Instant::now();
    let lost_at = Timestamp::now();
    server.seed(&node("worker-2", "Unknown", lost_at));
    tokio::time::sleep(Duration::from_secs(1)).await;

    let lost_node = node("worker-2", "Unknown", lost_at);
    let jumps = Jumps {
        offset: &offset,
        server: &server,
        node: &lost_node,
        controller: &controller,
    };
    jumps
        .forward_while((lost, UNHEALTHY), || match fence_of(&server, "worker-2") {
            Some(fence) if !executions(&fence).is_empty() => {
                Err(format!("a fence started: {fence:#}"))
            }
            _ if server.object::<Pod>("shop", "db-0").is_none() => {
                Err("the pod was released".to_string())
            }
            _ => Ok(()),
        })
        .await;

    // The fence must start when it is due.
    let took = jumps
        .back_until("the pod to be released", lost, || {
            server
                .object::<Pod>("shop", "db-0")
                .is_none()
                .then(Instant::now)
        })
        .await;
    println!(
        "the clock jumped +2 h then -2 h; the pod was released {:.1}s after the node was lost (unhealthyDuration {}s)",
        took.as_secs_f64(),
        UNHEALTHY.as_secs()
    );
    // The condition's time is in whole seconds: the node counts as lost up to 1 s
    // earlier than `lost`.
    jumps.on_time("released", took, UNHEALTHY, Duration::from_millis(1200));
    controller.powered_off(&server, "worker-2").await;
    assert_eq!(bmc.chassis_log().matches("set power 0").count(), 1);
    assert!(
        controller.log().contains("the system clock jumped"),
        "{}",
        controller.log()
    );
}

const BACKOFF: Duration = Duration::from_secs(10);

/// A failed step waits out its retry backoff on the same clock: two hours forward must
/// not start the retry early, two hours back must not hold it back. The storage
/// isolation fails first (`fence_dummy` with `type=fail`), then works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_jump_neither_hurries_nor_holds_back_a_retry() {
    require!("fence-agents", fence_agents());
    let preload = require!("libfaketime", libfaketime());
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let (server, fabric) = one_database_node(dir.path(), &bmc).await;
    let fabric_off = |fails: &str| {
        server.seed(&config_map(
            "fence-method-fabric-off-worker-2",
            "method.properties",
            &format!(
                "agent_name=fence_dummy\nstatus_file={}\naction=off\n{fails}",
                fabric.display()
            ),
        ));
    };
    fabric_off("type=fail");
    let config = controller_config(
        dir.path(),
        &format!(
            "retry: {{limit: 2, backoff: {}s, maxBackoff: {}s}}\n\
             agents: {{callTimeout: 5s, verifyTimeout: 5s, allowedOptions: [status_file, type]}}",
            BACKOFF.as_secs(),
            BACKOFF.as_secs()
        ),
    );
    let (controller, offset) = faked_controller(dir.path(), &server, &config, &preload).await;
    let lost_at = Timestamp::now();
    server.seed(&node("worker-2", "Unknown", lost_at));
    let isolations = |fence: &serde_json::Value| step_executions(fence, "Isolation").len();
    let failed = wait_for(
        &controller,
        "the isolation to fail and its retry to wait",
        || {
            let fence = fence_of(&server, "worker-2")?;
            (fence.pointer("/status/pause/reason")? == "RetryBackoff").then(Instant::now)
        },
    )
    .await;
    let tried = isolations(&fence_of(&server, "worker-2").expect("the NodeFence"));
    fabric_off("");

    let lost_node = node("worker-2", "Unknown", lost_at);
    let jumps = Jumps {
        offset: &offset,
        server: &server,
        node: &lost_node,
        controller: &controller,
    };
    jumps
        .forward_while((failed, BACKOFF), || {
            let fence = fence_of(&server, "worker-2").expect("the NodeFence");
            match isolations(&fence) == tried {
                true => Ok(()),
                false => Err(format!("the retry started: {fence:#}")),
            }
        })
        .await;

    // The retry starts when it is due.
    let took = jumps
        .back_until("the retry", failed, || {
            let fence = fence_of(&server, "worker-2")?;
            (isolations(&fence) > tried).then(Instant::now)
        })
        .await;
    println!(
        "the clock jumped +2 h then -2 h; the retry started {:.1}s after the failure was seen (backoff {}s)",
        took.as_secs_f64(),
        BACKOFF.as_secs()
    );
    // The failure is seen up to a poll (and a status write) after it happened.
    jumps.on_time("retried", took, BACKOFF, Duration::from_millis(1500));
    wait_for(
        &controller,
        "the retried isolation to release the pod",
        || server.object::<Pod>("shop", "db-0").is_none().then_some(()),
    )
    .await;
    assert_eq!(fabric_state(&fabric), "off", "the retry isolated the node");
}

/// The agent binary's command with libfaketime preloaded, its wall clock offset by what
/// [`offset_clock`] writes into the returned file (nothing at first).
fn faked_agent(dir: &Path, preload: &str) -> (std::process::Command, std::path::PathBuf) {
    let offset = dir.join("faketime");
    offset_clock(&offset, 0);
    let mut command = std::process::Command::new(support::agent_process::BINARY);
    command
        .env("LD_PRELOAD", preload)
        .env("FAKETIME_TIMESTAMP_FILE", &offset)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    (command, offset)
}

/// The agent binary under libfaketime ([`faked_agent`]) in Kubernetes mode on `host`'s
/// fake node, configured with `extra` ([`support::fake_node::Host::yaml`]), once it knows
/// its node's pods and has published `NodekeeperMemoryPressure` as `pressure`; the agent
/// and its clock's offset file.
async fn faked_agent_on(
    host: &support::fake_node::Host,
    server: &support::apiserver::FakeApiServer,
    preload: &str,
    extra: &str,
    pressure: &str,
) -> (AgentProcess, std::path::PathBuf) {
    use support::fake_node::{node_condition, pods_listed};
    let (config, kubeconfig) = host.write_agent_files(server, extra);
    let (command, offset) = faked_agent(host.dir.path(), preload);
    let agent = AgentProcess::start_in_kubernetes_from(command, &config, &kubeconfig);
    agent
        .until(Duration::from_secs(30), "the node's pods listed", || {
            pods_listed(server)
        })
        .await;
    agent
        .until(
            Duration::from_secs(30),
            &format!("NodekeeperMemoryPressure {pressure}"),
            || node_condition(server, "NodekeeperMemoryPressure").as_deref() == Some(pressure),
        )
        .await;
    (agent, offset)
}

/// `/healthz` status codes for `within`, one look every 20 ms.
fn healthz_during(agent: &AgentProcess, within: Duration) -> Vec<u16> {
    let until = Instant::now() + within;
    let mut codes = Vec::new();
    while Instant::now() < until {
        codes.push(http_get(&agent.address, "/healthz").0);
        std::thread::sleep(Duration::from_millis(20));
    }
    codes
}

/// The agent's `/healthz` fails once no decision cycle has completed for three intervals
/// and 5 s (8 s here), counted on the boot clock. Set two hours forward, the agent's
/// wall clock must not make its working loop look stalled until the next cycle; set two
/// hours back while a cycle is stuck (reading a `/proc/meminfo` that is a FIFO nobody
/// writes, as a read from a dead NFS mount hangs), it must not hide the stall.
#[test]
fn a_wall_clock_jump_neither_fails_the_agents_liveness_nor_hides_a_stall() {
    let preload = require!("libfaketime", libfaketime());
    let dir = tempfile::tempdir().expect("temp dir");
    let proc_root = dir.path().join("proc");
    std::fs::create_dir_all(proc_root.join("sys/kernel/random")).unwrap();
    std::fs::create_dir_all(dir.path().join("cgroup")).unwrap();
    std::fs::write(proc_root.join("sys/kernel/random/boot_id"), "jump-boot\n").unwrap();
    let meminfo = proc_root.join("meminfo");
    std::fs::copy("/proc/meminfo", &meminfo).unwrap();
    let root = dir.path().display();
    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\n\
             housekeepingInterval: 1s\nprocRoot: {root}/proc\ncgroupRoot: {root}/cgroup\n\
             nodefsPath: {root}\n"
        ),
    )
    .unwrap();
    let (command, offset) = faked_agent(dir.path(), &preload);
    let mut agent = AgentProcess::dry_run_from(command, &config, &[]);
    // A cycle or two done.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(http_get(&agent.address, "/healthz").0, 200);

    // Two hours forward: every look until well past the next cycle still finds it live.
    offset_clock(&offset, 7200);
    let codes = healthz_during(&agent, Duration::from_secs(3));
    let failed = codes.iter().filter(|code| **code != 200).count();
    assert_eq!(
        failed,
        0,
        "{failed} of {} looks failed after the jump forward",
        codes.len()
    );

    // The loop stuck on a read that never ends; then two hours back.
    std::fs::remove_file(&meminfo).unwrap();
    nix::unistd::mkfifo(
        &meminfo,
        nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
    )
    .unwrap();
    let stuck = Instant::now();
    let writer = loop {
        // Opening the FIFO for writing succeeds once a reader has it open: the cycle.
        match nix::fcntl::open(
            &meminfo,
            nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_NONBLOCK,
            nix::sys::stat::Mode::empty(),
        ) {
            Ok(fd) => break fd,
            Err(nix::errno::Errno::ENXIO) if stuck.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(error) => panic!(
                "the agent's cycle never read {}: {error}",
                meminfo.display()
            ),
        }
    };
    offset_clock(&offset, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    let unhealthy = loop {
        if http_get(&agent.address, "/healthz").0 != 200 {
            break Some(stuck.elapsed());
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Let the stuck read end, then stop the agent as an operator would.
    use std::io::Write as _;
    let mut writer = std::fs::File::from(writer);
    writer
        .write_all(b"MemTotal: 1024 kB\nMemAvailable: 512 kB\n")
        .unwrap();
    drop(writer);
    let status = agent.stop(Duration::from_secs(20));
    let took = unhealthy.unwrap_or_else(|| {
        panic!(
            "/healthz still said live 20 s into the stall:\n{}",
            agent.whole_log().join("\n")
        )
    });
    println!(
        "the jump forward: {} looks, all live; the stall with the clock set back: unhealthy after {:.1}s",
        codes.len(),
        took.as_secs_f64()
    );
    assert!(
        took >= Duration::from_secs(7),
        "unhealthy after only {took:?}"
    );
    assert!(status.success(), "agent exited with {status}");
}

/// Whether `node`'s fence has started (its first step began).
fn fence_started(server: &support::apiserver::FakeApiServer, node: &str) -> bool {
    fence_of(server, node).is_some_and(|fence| fence.pointer("/status/startedAt").is_some())
}

/// When `node`'s fence is paused for `reason`: the instant the test saw it, and how long
/// the pause has left by its `until` (kept in whole seconds: never later than the wait's
/// true end), by the test's clock (not faked).
fn paused_until(
    server: &support::apiserver::FakeApiServer,
    node: &str,
    reason: &str,
) -> Option<(Instant, Duration)> {
    let fence = fence_of(server, node)?;
    (fence.pointer("/status/pause/reason")? == reason).then_some(())?;
    let until: Timestamp = fence
        .pointer("/status/pause/until")?
        .as_str()?
        .parse()
        .ok()?;
    let left = Duration::try_from(until.duration_since(Timestamp::now())).unwrap_or_default();
    Some((Instant::now(), left))
}

/// For [`jump_forward_while`]: `node`'s fence has not started.
fn not_started(server: &support::apiserver::FakeApiServer, node: &str) -> Result<(), String> {
    match fence_started(server, node) {
        false => Ok(()),
        true => Err(format!(
            "{node}'s fence started: {:#}",
            fence_of(server, node).unwrap_or_default()
        )),
    }
}

/// One fence per 10 s in a zone (`zoneFenceRate: 0.1`).
const ZONE_SPACING: Duration = Duration::from_secs(10);

/// The zone's fence rate spaces the starts of its fences by the times they started, kept
/// in the NodeFences: two hours forward must not let a held fence start early, two hours
/// back must not hold it longer. Two nodes of one zone are lost at once; storage
/// isolation only (`fence_dummy`), so nothing waits on a power device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_jump_neither_hurries_nor_holds_back_the_zone_rate() {
    require!(
        "fence-agents",
        support::real::program("fence_dummy", "fence-agents")
    );
    let preload = require!("libfaketime", libfaketime());
    let dir = tempfile::tempdir().expect("temp dir");
    let names = ["worker-1", "worker-2", "worker-3", "worker-4", "worker-5"];
    let (server, _fabric) = isolation_only_cluster(dir.path(), &names, 2).await;
    let config = controller_config(dir.path(), "stormGuard: {zoneFenceRate: 0.1}\n");
    let (controller, offset) = faked_controller(dir.path(), &server, &config, &preload).await;
    let lost_at = Timestamp::now();
    for name in &names[..2] {
        server.seed(&node(name, "Unknown", lost_at));
    }
    let mut first_seen = None;
    let held = wait_for(
        &controller,
        "one fence started, the other held by the zone rate",
        || {
            let started = names[..2]
                .iter()
                .filter(|name| fence_started(&server, name))
                .count();
            if started > 0 {
                first_seen.get_or_insert_with(Instant::now);
            }
            let held: Vec<&str> = names[..2]
                .iter()
                .copied()
                .filter(|name| {
                    fence_of(&server, name).is_some_and(|fence| {
                        fence.pointer("/status/pause/reason") == Some(&"ZoneRateLimit".into())
                    })
                })
                .collect();
            (started == 1 && held.len() == 1).then(|| held[0])
        },
    )
    .await;

    // The second fence may start ZONE_SPACING after the first did.
    let first_seen = first_seen.expect("the first fence seen started");
    let held_node = node(held, "Unknown", lost_at);
    let jumps = Jumps {
        offset: &offset,
        server: &server,
        node: &held_node,
        controller: &controller,
    };
    jumps
        .forward_while((first_seen, ZONE_SPACING), || not_started(&server, held))
        .await;

    let took = jumps
        .back_until("the held fence to start", first_seen, || {
            fence_started(&server, held).then(Instant::now)
        })
        .await;
    println!(
        "the clock jumped +2 h then -2 h; the zone's second fence started {:.1}s after the test saw the first start (one fence per {}s)",
        took.as_secs_f64(),
        ZONE_SPACING.as_secs()
    );
    // The leader counts from the first fence's start as it recorded it; the test sees
    // that start up to a poll and a status write later.
    jumps.on_time(
        "the second fence started",
        took,
        ZONE_SPACING,
        Duration::from_millis(1200),
    );
    wait_for(&controller, "both pods to be released", || {
        (server.object::<Pod>("shop", "db-0").is_none()
            && server.object::<Pod>("shop", "db-1").is_none())
        .then_some(())
    })
    .await;
}

const COOLDOWN: Duration = Duration::from_secs(10);

/// After a storm, no fence acts until its cooldown is over, counted from when the storm
/// ended (kept in the leader Lease): two hours forward must not end the cooldown early,
/// two hours back must not stretch it. Three of five nodes are lost at once (a storm,
/// beyond 40 %), then two come back; the third's fence must wait out the cooldown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_jump_neither_shortens_nor_stretches_a_storm_cooldown() {
    require!(
        "fence-agents",
        support::real::program("fence_dummy", "fence-agents")
    );
    let preload = require!("libfaketime", libfaketime());
    let dir = tempfile::tempdir().expect("temp dir");
    let names = ["worker-1", "worker-2", "worker-3", "worker-4", "worker-5"];
    let (server, _fabric) = isolation_only_cluster(dir.path(), &names, 3).await;
    let config = controller_config(
        dir.path(),
        &format!("stormGuard: {{stormCooldown: {}s}}\n", COOLDOWN.as_secs()),
    );
    let (controller, offset) = faked_controller(dir.path(), &server, &config, &preload).await;
    let lost_at = Timestamp::now();
    for name in &names[..3] {
        server.seed(&node(name, "Unknown", lost_at));
    }
    for name in &names[..3] {
        wait_for(&controller, "a NodeFence held by the storm guard", || {
            let fence = fence_of(&server, name)?;
            (fence.pointer("/status/pause/reason")? == "StormGuard").then_some(())
        })
        .await;
    }

    // Two come back: the storm is over, and its cooldown begins after this instant.
    let calm = Instant::now();
    for name in &names[1..3] {
        server.seed(&node(name, "True", Timestamp::now()));
    }
    wait_for(&controller, "worker-1's fence held by the cooldown", || {
        let fence = fence_of(&server, "worker-1")?;
        (fence.pointer("/status/pause/reason")? == "StormCooldown").then_some(())
    })
    .await;
    let lost_node = node("worker-1", "Unknown", lost_at);
    let jumps = Jumps {
        offset: &offset,
        server: &server,
        node: &lost_node,
        controller: &controller,
    };
    jumps
        .forward_while((calm, COOLDOWN), || not_started(&server, "worker-1"))
        .await;

    let took = jumps
        .back_until("the fence to start after the cooldown", calm, || {
            fence_started(&server, "worker-1").then(Instant::now)
        })
        .await;
    println!(
        "the clock jumped +2 h then -2 h; the fence started {:.1}s after the storm ended (cooldown {}s)",
        took.as_secs_f64(),
        COOLDOWN.as_secs()
    );
    // The cooldown begins after `calm`.
    jumps.on_time(
        "the fence started",
        took,
        COOLDOWN,
        Duration::from_millis(200),
    );
    wait_for(&controller, "worker-1's pod to be released", || {
        server.object::<Pod>("shop", "db-0").is_none().then_some(())
    })
    .await;
}

const ISOLATION_TIMEOUT: Duration = Duration::from_secs(10);

/// A partitioned node's agent is asked to isolate the node, and the fence waits
/// `isolationTimeout` for its confirmation, counted from the request's time in the
/// NodeFence: two hours forward must not give the isolation up early (which would fall
/// back to the configured steps, a power-off where there is one), two hours back must not
/// stretch the wait. The agent is played by the test: it reports over TLS and never
/// confirms. worker-2's kubelet stops renewing its Lease and the node reads NotReady.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_jump_neither_ends_nor_stretches_the_wait_for_an_isolation() {
    use support::reports::{Reporting, report_from, token_of};
    require!(
        "fence-agents",
        support::real::program("fence_dummy", "fence-agents")
    );
    require!("openssl", support::real::program("openssl", "openssl"));
    let preload = require!("libfaketime", libfaketime());
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = support::tls::certificate_authority(dir.path(), "ca").expect("a CA");
    let served =
        support::tls::server_certificate(dir.path(), "controller", &ca).expect("a certificate");
    let nodes = ["worker-1", "worker-2", "worker-3"];
    let fabric = enabled_fabric(dir.path());
    let server = ready_cluster(&nodes).await;
    let tokens: Vec<(&str, String)> = nodes.iter().map(|node| (*node, token_of(node))).collect();
    seed_node_tokens(&server, &tokens);
    seed_database(&server, "worker-2", "db-0");
    seed_isolation_only_config(&server, "worker-2", &fabric);
    let kubelets = support::kubelet::Kubelets::start(&server, &nodes).await;
    let config = controller_config(
        dir.path(),
        &format!(
            "silenceTimeout: 3s\nunhealthyDuration: 10m\nisolationTimeout: {}s\n\
             reports: {{address: \"127.0.0.1:0\", nodeTokensSecret: node-tokens, reconnectGrace: 20s, {}}}\n",
            ISOLATION_TIMEOUT.as_secs(),
            served.reports_setting()
        ),
    );
    let (controller, offset) = faked_controller(dir.path(), &server, &config, &preload).await;
    const BOOT: &str = "7a3c1d2e-5f60-4b8a-9c0d-1e2f3a4b5c6d";
    let reporting = Reporting::start(
        controller.reports_address(),
        ca.cert.clone(),
        "worker-2",
        1,
        |sequence| {
            report_from(
                "worker-2",
                BOOT,
                sequence,
                serde_json::json!({"armed": false}),
            )
        },
    );
    wait_for(&controller, "worker-2's first report", || {
        controller.agent_view("worker-2").map(|_| ())
    })
    .await;

    // The partition: the kubelet's Lease falls silent and the node reads NotReady, while
    // its agent still reports.
    kubelets.stop("worker-2");
    let cut_at = Timestamp::now();
    server.seed(&node("worker-2", "Unknown", cut_at));
    let (asked, due) = wait_for(
        &controller,
        "the agent to be asked to isolate the node",
        || paused_until(&server, "worker-2", "WaitingForIsolation"),
    )
    .await;
    let outcome = || {
        fence_of(&server, "worker-2")
            .and_then(|fence| fence.pointer("/status/selfIsolation/outcome").cloned())
    };
    let cut_node = node("worker-2", "Unknown", cut_at);
    let jumps = Jumps {
        offset: &offset,
        server: &server,
        node: &cut_node,
        controller: &controller,
    };
    jumps
        .forward_while((asked, due), || match (outcome(), fabric_state(&fabric)) {
            (None, fabric) if fabric == "on" => Ok(()),
            (outcome, fabric) => Err(format!(
                "the isolation was decided ({outcome:?}, the fabric port {fabric})"
            )),
        })
        .await;

    let took = jumps
        .back_until("the isolation to be given up", asked, || {
            outcome().is_some().then(Instant::now)
        })
        .await;
    println!(
        "the clock jumped +2 h then -2 h; the isolation was given up {:.1}s after the test saw the request, due at {:.1}s (isolationTimeout {}s from the request's time, in whole seconds)",
        took.as_secs_f64(),
        due.as_secs_f64(),
        ISOLATION_TIMEOUT.as_secs()
    );
    assert_eq!(outcome(), Some("TimedOut".into()));
    jumps.on_time(
        "the isolation given up",
        took,
        due,
        Duration::from_millis(300),
    );
    // The fence falls back to its configured steps: the fabric port, then the release.
    wait_for(
        &controller,
        "the configured isolation to release the pod",
        || server.object::<Pod>("shop", "db-0").is_none().then_some(()),
    )
    .await;
    assert_eq!(fabric_state(&fabric), "off");
    reporting.stop().await;
}

/// How far past a Job's `ends-by` time the controller still counts it as running
/// (`CLOCK_MARGIN` in src/controller/job_executor.rs: for a node whose clock runs ahead).
const JOB_CLOCK_MARGIN: Duration = Duration::from_secs(30);

/// A fence step run as a Job counts as running until the Job's `ends-by` time (its start
/// deadline plus the agent calls' deadlines) and a clock margin have passed, whatever the
/// Job says: until then an agent of it may still act on the node, and no other action
/// for the node may start beside it. Two hours forward must not end that early (two
/// power actions could then run at once); two hours back must not hold a Job that never
/// ran any longer. Nothing runs the Job here (no Job controller, no kubelet), as on a
/// cluster where its pod cannot be scheduled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_jump_neither_ends_a_jobs_time_early_nor_stretches_it() {
    use k8s_openapi::api::batch::v1::Job;
    let preload = require!("libfaketime", libfaketime());
    let dir = tempfile::tempdir().expect("temp dir");
    let fabric = enabled_fabric(dir.path());
    let server = ready_cluster(&["worker-1", "worker-2", "worker-3"]).await;
    seed_database(&server, "worker-2", "db-0");
    seed_isolation_only_config(&server, "worker-2", &fabric);
    let config = controller_config(
        dir.path(),
        &format!(
            "{}agents: {{callTimeout: 1s, verifyTimeout: 1s, allowedOptions: [status_file]}}\n",
            job_executor(dir.path()).replace("startTimeout: 30s", "startTimeout: 3s")
        ),
    );
    let (controller, offset) = faked_controller(dir.path(), &server, &config, &preload).await;
    let lost_at = Timestamp::now();
    server.seed(&node("worker-2", "Unknown", lost_at));
    let (created, ends_by) = wait_for(&controller, "the isolation's Job", || {
        let job = server.objects::<Job>().into_iter().next()?;
        let ends_by: Timestamp = job
            .metadata
            .annotations?
            .get("fencing.nodekeeper.io/ends-by")?
            .parse()
            .ok()?;
        Some((Instant::now(), ends_by))
    })
    .await;
    // By the test's clock (not faked), from the moment the Job was seen.
    let due = Duration::try_from(ends_by.duration_since(Timestamp::now()))
        .unwrap_or(Duration::ZERO)
        + JOB_CLOCK_MARGIN;
    let results = || {
        fence_of(&server, "worker-2")
            .map(|fence| {
                executions(&fence)
                    .iter()
                    .filter(|execution| execution.get("result").is_some())
                    .count()
            })
            .unwrap_or(0)
    };

    let lost_node = node("worker-2", "Unknown", lost_at);
    let jumps = Jumps {
        offset: &offset,
        server: &server,
        node: &lost_node,
        controller: &controller,
    };
    jumps
        .forward_while(
            (created, due),
            || match (results(), server.objects::<Job>().len()) {
                (0, 1) => Ok(()),
                (results, jobs) => Err(format!(
                    "the controller ended the Job or started another ({results} results, {jobs} Jobs): {:#}",
                    fence_of(&server, "worker-2").unwrap_or_default()
                )),
            },
        )
        .await;

    // A running execution is looked at again every 5 s; the node written again every
    // quarter second has the controller look when the Job's time is over.
    let mut looks = 0;
    let took = jumps
        .back_until("the Job to count as over", created, || {
            looks += 1;
            if looks % 5 == 0 {
                server.seed(&lost_node);
            }
            (results() > 0).then(Instant::now)
        })
        .await;
    println!(
        "the clock jumped +2 h then -2 h; the Job that never ran counted as over {:.1}s after it was created (due {:.1}s: its ends-by time and {}s)",
        took.as_secs_f64(),
        due.as_secs_f64(),
        JOB_CLOCK_MARGIN.as_secs()
    );
    jumps.on_time("the Job over", took, due, Duration::from_millis(300));
    let fence = fence_of(&server, "worker-2").expect("the NodeFence");
    let first = &executions(&fence)[0];
    assert_eq!(first["result"], "TimedOut", "{fence:#}");
}

/// A soft threshold's grace period (`evictionSoftGracePeriod`) in the test below.
const SOFT_GRACE: Duration = Duration::from_secs(10);
/// Its `evictionPressureTransitionPeriod`.
const TRANSITION: Duration = Duration::from_secs(10);

/// The agent's two waits that the kubelet counts on its monotonic clock: a soft
/// threshold's grace period before an eviction, and the pressure transition period before
/// a node condition turns False again. The agent binary in Kubernetes mode on a fake node
/// (its memory files written by the test), its wall clock two hours forward while each
/// wait runs, then two hours back: the pod must not be evicted early nor the condition
/// cleared early, and neither may be held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_jump_neither_hurries_nor_holds_back_a_soft_eviction_or_the_pressure_condition()
 {
    use support::fake_node::{
        Host, MI, best_effort, node_condition, seed_node, successful_deletes,
    };
    let preload = require!("libfaketime", libfaketime());
    let server = support::apiserver::FakeApiServer::start().await;
    seed_node(&server);
    let host = Host::new(4096 * MI);
    let pod = best_effort("big", "0000000d-0001", 1000);
    let _process = host.bind_running(&server, &pod);
    let (agent, offset) = faked_agent_on(
        &host,
        &server,
        &preload,
        &format!(
            "housekeepingInterval: 1s\nevictionSoft: {{memory.available: 1Gi}}\n\
             evictionSoftGracePeriod: {{memory.available: {}s}}\n\
             evictionPressureTransitionPeriod: {}s\n",
            SOFT_GRACE.as_secs(),
            TRANSITION.as_secs()
        ),
        "False",
    )
    .await;
    let pressure = || node_condition(&server, "NodekeeperMemoryPressure");

    // Below the soft threshold: the condition turns True at once, the eviction waits out
    // the grace period, counted from a cycle after this instant.
    let pressed = Instant::now();
    host.set_free_memory(512 * MI);
    agent
        .until(
            Duration::from_secs(10),
            "NodekeeperMemoryPressure True",
            || pressure().as_deref() == Some("True"),
        )
        .await;
    assert_window_left(pressed, SOFT_GRACE, || agent.whole_log().join("\n"));
    offset_clock(&offset, 7200);
    while pressed.elapsed() < SOFT_GRACE - Duration::from_secs(3) {
        assert!(
            successful_deletes(&server, pod.name).is_empty(),
            "evicted {:?} after the soft threshold was crossed, within its {SOFT_GRACE:?} grace period\n{}",
            pressed.elapsed(),
            agent.whole_log().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    offset_clock(&offset, -7200);
    agent
        .until(Duration::from_secs(30), "the soft eviction", || {
            !successful_deletes(&server, pod.name).is_empty()
        })
        .await;
    // Seen within a look (50 ms) of the delete.
    let evicted_after = pressed.elapsed();
    // The agent killed the pod's process; its cgroup is empty now, as the kernel would
    // show it (a fake tree keeps what was written), so the agent's wait for the pod's
    // cleanup ends, as the kubelet's does.
    std::fs::write(
        host.pod_cgroup("besteffort", pod.uid).join("cgroup.procs"),
        "",
    )
    .expect("the pod's cgroup.procs");

    // Memory back: the condition stays True for the transition period after the last
    // cycle that saw the threshold crossed: the eviction's, or one right after the pod's
    // cgroup was seen empty, just before this instant.
    let relieved = Instant::now();
    host.set_free_memory(4096 * MI);
    assert_window_left(relieved, TRANSITION, || agent.whole_log().join("\n"));
    offset_clock(&offset, 7200);
    while relieved.elapsed() < TRANSITION - Duration::from_secs(3) {
        assert_eq!(
            pressure().as_deref(),
            Some("True"),
            "NodekeeperMemoryPressure cleared {:?} after the memory came back, within the {TRANSITION:?} transition period\n{}",
            relieved.elapsed(),
            agent.whole_log().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    offset_clock(&offset, -7200);
    agent
        .until(
            Duration::from_secs(30),
            "NodekeeperMemoryPressure False again",
            || pressure().as_deref() == Some("False"),
        )
        .await;
    let cleared_after = relieved.elapsed();
    println!(
        "the agent's clock jumped +2 h then -2 h during each wait: evicted {:.1}s after the crossing (grace period {}s), NodekeeperMemoryPressure False {:.1}s after the memory came back (transition period {}s)",
        evicted_after.as_secs_f64(),
        SOFT_GRACE.as_secs(),
        cleared_after.as_secs_f64(),
        TRANSITION.as_secs()
    );
    let log = || agent.whole_log().join("\n");
    assert!(
        evicted_after >= SOFT_GRACE && evicted_after < SOFT_GRACE + LATE,
        "evicted {evicted_after:?} after the crossing\n{}",
        log()
    );
    assert!(
        cleared_after + Duration::from_millis(1100) >= TRANSITION
            && cleared_after < TRANSITION + LATE,
        "NodekeeperMemoryPressure False {cleared_after:?} after the memory came back\n{}",
        log()
    );
    assert_eq!(successful_deletes(&server, pod.name).len(), 1);
    // The jumps reached the agent: it dated the condition's change on its clock, set
    // two hours back.
    let changed = support::fake_node::node_condition_record(&server, "NodekeeperMemoryPressure")
        .and_then(|condition| condition.last_transition_time)
        .expect("the condition's transition time");
    let behind = Timestamp::now().duration_since(changed.0).as_secs();
    assert!(
        (7100..7300).contains(&behind),
        "the condition changed {behind}s before the test's now, not two hours\n{}",
        log()
    );
}

const POWER_DELAY: Duration = Duration::from_secs(10);

/// After a done storage isolation, power management waits `powerManagementDelay`,
/// counted from the isolation's end kept in the NodeFence: two hours forward must not
/// power the node off early, two hours back must not hold the power-off back.
/// `fence_dummy` isolates, `fence_ipmilan` powers off through `ipmi_sim`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_jump_neither_hurries_nor_holds_back_the_power_off_after_an_isolation() {
    require!("fence-agents", fence_agents());
    let preload = require!("libfaketime", libfaketime());
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let (server, fabric) = one_database_node(dir.path(), &bmc).await;
    let config = controller_config(
        dir.path(),
        &format!("powerManagementDelay: {}s\n", POWER_DELAY.as_secs()),
    );
    let (controller, offset) = faked_controller(dir.path(), &server, &config, &preload).await;
    let lost_at = Timestamp::now();
    server.seed(&node("worker-2", "Unknown", lost_at));
    let (isolated, due) = wait_for(
        &controller,
        "the isolation done, the power-off waiting",
        || paused_until(&server, "worker-2", "WaitingForPowerManagementDelay"),
    )
    .await;
    assert_eq!(fabric_state(&fabric), "off", "the isolation was done");

    let lost_node = node("worker-2", "Unknown", lost_at);
    let jumps = Jumps {
        offset: &offset,
        server: &server,
        node: &lost_node,
        controller: &controller,
    };
    let took = jumps.power_off_through(&bmc, (isolated, due)).await;
    println!(
        "the clock jumped +2 h then -2 h; the power-off came {:.1}s after the test saw the isolation done, due at {:.1}s (powerManagementDelay {}s)",
        took.as_secs_f64(),
        due.as_secs_f64(),
        POWER_DELAY.as_secs()
    );
    controller.powered_off(&server, "worker-2").await;
    assert_eq!(bmc.chassis_log().matches("set power 0").count(), 1);
}

/// The agent's promise in the test below: no pod process later than this after it last
/// heard the controller...
const PROMISE: Duration = Duration::from_secs(2);
/// ...and the controller's `selfIsolationMargin` on top.
const PROMISE_MARGIN: Duration = Duration::from_secs(10);

/// A node with no fence device, whose agent promised to isolate it, is released once the
/// promise and the margin have run out after it was last heard, counted from times kept
/// in the NodeFence: two hours forward must not release its pods early (they could then
/// run twice), two hours back must not hold them. The agent is played by the test, over
/// TLS; the node's kubelet renews its Lease until the node falls silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_jump_neither_hurries_nor_holds_back_a_release_on_an_agents_promise() {
    require!("openssl", support::real::program("openssl", "openssl"));
    let preload = require!("libfaketime", libfaketime());
    let dir = tempfile::tempdir().expect("temp dir");
    // A database on worker-2, and no fence configuration: the node has no fence device.
    let rig = support::reports::PromiseRig::start(dir.path()).await;
    let server = &rig.server;
    let config = rig.controller_config(dir.path(), Duration::from_secs(3), PROMISE_MARGIN);
    let (controller, offset) = faked_controller(dir.path(), server, &config, &preload).await;
    let reporting = rig.promise(&controller, PROMISE).await;

    // The node falls silent on both channels.
    reporting.stop().await;
    rig.kubelets.stop("worker-2");
    let (waiting, due) = wait_for(&controller, "the fence waiting on the promise", || {
        paused_until(server, "worker-2", "WaitingForSelfIsolation")
    })
    .await;
    let released = || {
        taint_keys(server, "worker-2").contains(&"node.kubernetes.io/out-of-service".to_string())
    };
    let silent_node = server
        .object::<Node>("", "worker-2")
        .expect("worker-2's Node");
    let jumps = Jumps {
        offset: &offset,
        server,
        node: &silent_node,
        controller: &controller,
    };
    jumps
        .forward_while((waiting, due), || match released() {
            false => Ok(()),
            true => Err("the node's pods were released".to_string()),
        })
        .await;

    let took = jumps
        .back_until("the release", waiting, || released().then(Instant::now))
        .await;
    println!(
        "the clock jumped +2 h then -2 h; released on the promise {:.1}s after the test saw the fence wait for it, due at {:.1}s (promise {}s, selfIsolationMargin {}s)",
        took.as_secs_f64(),
        due.as_secs_f64(),
        PROMISE.as_secs(),
        PROMISE_MARGIN.as_secs()
    );
    jumps.on_time("the release", took, due, Duration::from_millis(300));
}

/// How long the power step waits for a crashed node's dump at most (`kdumpWait`), in the
/// test below; its crash kernel announces itself every second throughout, so the dump
/// never ends by itself (`kdumpSilence` is a minute).
const KDUMP_WAIT: Duration = Duration::from_secs(12);

/// Debian's kdump notifier (package fence-agents), as a crash kernel's initramfs runs it.
const KDUMP_SEND: &str = "/usr/libexec/fence-agents/fence_kdump_send";

/// `fence_kdump_send` announcing a crash kernel to `port` on the loopback every second;
/// ended (by the PID this test started) when dropped.
struct KdumpSender(std::process::Child);

impl Drop for KdumpSender {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A crashed node whose crash kernel announces itself (`kdump=true`): its pods are
/// released on the notification, and the power-off waits for the dump, at most
/// `kdumpWait` after the first notification (kept in the NodeFence): two hours forward
/// must not cut the dump short, two hours back must not hold the power-off. The node's
/// InternalIP is the loopback, where the notifications come from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_jump_neither_cuts_a_dump_short_nor_holds_back_the_power_off_after_it() {
    require!("fence-agents", fence_agents());
    require!(
        "fence_kdump_send",
        match Path::new(KDUMP_SEND).is_file() {
            true => Ok(()),
            false => Err(format!("{KDUMP_SEND} (Debian package fence-agents)")),
        }
    );
    let preload = require!("libfaketime", libfaketime());
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let (server, fabric) = one_database_node(dir.path(), &bmc).await;
    seed_kdump_fence_config(&server, "worker-2", bmc.port(), &fabric);
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|socket| socket.local_addr())
        .expect("a free UDP port")
        .port();
    let config = controller_config(
        dir.path(),
        &format!(
            "kdumpAddress: \"127.0.0.1:{port}\"\nkdumpWait: {}s\nkdumpSilence: 60s\n",
            KDUMP_WAIT.as_secs()
        ),
    );
    let (controller, offset) = faked_controller(dir.path(), &server, &config, &preload).await;
    let mut crashed = node("worker-2", "Unknown", Timestamp::now());
    crashed.status.as_mut().expect("status").addresses =
        Some(vec![k8s_openapi::api::core::v1::NodeAddress {
            type_: "InternalIP".to_string(),
            address: "127.0.0.1".to_string(),
        }]);
    server.seed(&crashed);
    let _sender = KdumpSender(
        std::process::Command::new(KDUMP_SEND)
            .args(["-p", &port.to_string(), "-i", "1", "-c", "0", "127.0.0.1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start fence_kdump_send"),
    );
    let (dumping, due) = wait_for(&controller, "the power-off waiting for the dump", || {
        let (seen, _) = paused_until(&server, "worker-2", "WaitingForKdump")?;
        let fence = fence_of(&server, "worker-2")?;
        let first: Timestamp = fence
            .pointer("/status/kdump/firstHeard")?
            .as_str()?
            .parse()
            .ok()?;
        let left = (first + KDUMP_WAIT).duration_since(Timestamp::now());
        Some((seen, Duration::try_from(left).unwrap_or_default()))
    })
    .await;
    wait_for(&controller, "the pod released on the notification", || {
        server.object::<Pod>("shop", "db-0").is_none().then_some(())
    })
    .await;

    let jumps = Jumps {
        offset: &offset,
        server: &server,
        node: &crashed,
        controller: &controller,
    };
    let took = jumps.power_off_through(&bmc, (dumping, due)).await;
    println!(
        "the clock jumped +2 h then -2 h; the power-off came {:.1}s after the test saw it wait for the dump, due at {:.1}s (kdumpWait {}s after the first notification)",
        took.as_secs_f64(),
        due.as_secs_f64(),
        KDUMP_WAIT.as_secs()
    );
    controller.powered_off(&server, "worker-2").await;
}

/// The agent's `kubernetes.conditionHeartbeat` in the test below.
const HEARTBEAT: Duration = Duration::from_secs(4);

/// The first of `server`'s requests from the `seen`th on that `matches`, looked for every
/// 50 ms for up to `within`; `seen` moves past it.
async fn next_request(
    server: &support::apiserver::FakeApiServer,
    seen: &mut usize,
    within: Duration,
    what: &str,
    matches: impl Fn(&support::apiserver::RecordedRequest) -> bool,
) -> support::apiserver::RecordedRequest {
    let until = Instant::now() + within;
    loop {
        let requests = server.requests();
        if let Some(found) = requests[*seen..].iter().position(&matches) {
            *seen += found + 1;
            return requests[*seen - 1].clone();
        }
        assert!(Instant::now() < until, "no {what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The agent's two paces counted on the boot clock, as the kubelet counts them: its node
/// conditions' heartbeat (`conditionHeartbeat`) and an `EvictionThresholdMet` event
/// series, repeated once per heartbeat while the node stays starved. The agent binary in
/// Kubernetes mode on a fake node, its memory below the hard threshold with no pod to
/// evict. Its wall clock is set two hours back right after a heartbeat and an event, then
/// four hours forward (two ahead) right after another pair: neither may silence the
/// heartbeat or the series for the length of the jump, nor send one early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_jump_neither_silences_nor_hurries_the_agents_heartbeat_or_event_series() {
    use support::apiserver::RecordedRequest;
    use support::fake_node::{Host, MI, node_condition_record, seed_node};
    let preload = require!("libfaketime", libfaketime());
    let server = support::apiserver::FakeApiServer::start().await;
    seed_node(&server);
    // Below the default hard threshold (100Mi), and nothing to evict.
    let host = Host::new(50 * MI);
    let (agent, offset) = faked_agent_on(
        &host,
        &server,
        &preload,
        &format!(
            "  conditionHeartbeat: {}s\nhousekeepingInterval: 1s\n",
            HEARTBEAT.as_secs()
        ),
        "True",
    )
    .await;
    let log = || agent.whole_log().join("\n");
    let heartbeat = |r: &RecordedRequest| {
        r.method == "PATCH"
            && r.path == format!("/api/v1/nodes/{}/status", support::fake_node::NODE)
            && r.status < 300
            && r.body.contains("NodekeeperMemoryPressure")
    };
    // A repeat of the series: the agent creates the series' Event again, which exists
    // (409), then patches its count; a series begun afresh would be created (201).
    let repeat = |r: &RecordedRequest| {
        r.method == "POST"
            && r.path.contains("/events")
            && r.body.contains("EvictionThresholdMet")
            && r.status == 409
    };
    let mut seen = server.requests().len();
    // Four heartbeats' time after each jump: three or four of each at a 4 s pace rounded
    // up to the 1 s cycle; at least two, and none early (a heartbeat sent at the jump
    // would come within a cycle of it).
    let watched = 4 * HEARTBEAT;
    let early = HEARTBEAT - Duration::from_millis(1500);
    for (jump, label) in [(-7200, "two hours back"), (7200, "four hours forward")] {
        let last_heartbeat =
            next_request(&server, &mut seen, 2 * HEARTBEAT, "heartbeat", heartbeat)
                .await
                .answered_at;
        let last_event = next_request(&server, &mut seen, 2 * HEARTBEAT, "series' event", repeat)
            .await
            .answered_at;
        offset_clock(&offset, jump);
        tokio::time::sleep(watched).await;
        let after = server.requests()[seen..].to_vec();
        seen += after.len();
        let paced = |last: Instant, kind: &dyn Fn(&RecordedRequest) -> bool| -> Vec<f64> {
            std::iter::once(last)
                .chain(after.iter().filter(|r| kind(r)).map(|r| r.answered_at))
                .collect::<Vec<_>>()
                .windows(2)
                .map(|pair| pair[1].duration_since(pair[0]).as_secs_f64())
                .collect()
        };
        let (heartbeats, events) = (
            paced(last_heartbeat, &heartbeat),
            paced(last_event, &repeat),
        );
        println!(
            "clock set {label} right after a heartbeat and an event: heartbeats {heartbeats:.1?} s apart, the series' events {events:.1?} s apart (conditionHeartbeat {}s)",
            HEARTBEAT.as_secs()
        );
        for (kind, gaps) in [
            ("heartbeats", &heartbeats),
            ("EvictionThresholdMet repeats", &events),
        ] {
            assert!(
                gaps.len() >= 2,
                "{} {kind} in {watched:?} after the clock was set {label}\n{}",
                gaps.len(),
                log()
            );
            let first_early = gaps.iter().find(|gap| **gap < early.as_secs_f64());
            assert!(
                first_early.is_none(),
                "{kind} {gaps:?} s apart, with the clock set {label}: one came early\n{}",
                log()
            );
        }
        // The jump reached the agent: it stamps its heartbeats with its wall clock.
        let stamped = node_condition_record(&server, "NodekeeperMemoryPressure")
            .and_then(|condition| condition.last_heartbeat_time)
            .expect("the condition's heartbeat");
        let ahead = stamped.0.duration_since(Timestamp::now()).as_secs();
        assert!(
            (jump - 100..jump + 100).contains(&ahead),
            "the last heartbeat is stamped {ahead}s from the test's now, not {jump}s\n{}",
            log()
        );
    }
}
