//! End to end with a real systemd-logind: a Debian bookworm tree booted with
//! systemd-nspawn runs `nodekeeper shutdown-manager` as a service next to workloads in
//! priority tiers; `systemctl poweroff` inside must wait for the agent's phases.
//!
//! Needs root, systemd-nspawn (package systemd-container) and debootstrap; the tree is
//! cached in /var/cache/nodekeeper-test/bookworm (override with NODEKEEPER_NSPAWN_TREE).
//! Skips with a message when any of that is unavailable.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nodekeeper::shutdown::state::{PhaseStatus, ShutdownOutcome, ShutdownState, StateStore};

fn skip(reason: &str) {
    eprintln!("skipping the systemd-nspawn end-to-end test: {reason}");
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
    })
}

fn debian_mirror() -> String {
    if let Ok(mirror) = std::env::var("NODEKEEPER_DEBIAN_MIRROR") {
        return mirror;
    }
    let sources = std::fs::read_to_string("/etc/apt/sources.list.d/debian.sources")
        .or_else(|_| std::fs::read_to_string("/etc/apt/sources.list"))
        .unwrap_or_default();
    sources
        .split_whitespace()
        .find(|word| word.starts_with("http") && !word.contains("security"))
        .unwrap_or("http://deb.debian.org/debian")
        .to_string()
}

/// The cached minimal tree, built once with debootstrap.
fn cached_tree() -> Result<PathBuf, String> {
    let tree = std::env::var("NODEKEEPER_NSPAWN_TREE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("/var/cache/nodekeeper-test/bookworm"));
    if tree.join("usr/lib/systemd/systemd").exists() {
        return Ok(tree);
    }
    let partial = tree.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(tree.parent().unwrap()).map_err(|e| e.to_string())?;
    let status = Command::new("debootstrap")
        .args([
            "--variant=minbase",
            "--include=systemd,systemd-sysv,dbus",
            "bookworm",
        ])
        .arg(&partial)
        .arg(debian_mirror())
        .status()
        .map_err(|e| format!("debootstrap: {e}"))?;
    if !status.success() {
        return Err(format!("debootstrap failed ({status})"));
    }
    std::fs::rename(&partial, &tree).map_err(|e| e.to_string())?;
    Ok(tree)
}

struct Container {
    nspawn: Child,
}

impl Container {
    fn init_pid(&self) -> Option<u32> {
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.nspawn.id()))
                .ok()?;
        children.split_whitespace().next()?.parse().ok()
    }

    fn exec(&self, command: &str) -> std::process::Output {
        let pid = self.init_pid().expect("container init");
        Command::new("nsenter")
            .args(["-t", &pid.to_string(), "-a", "sh", "-c", command])
            .output()
            .expect("nsenter")
    }

    fn exited_within(&mut self, limit: Duration) -> bool {
        let give_up = Instant::now() + limit;
        while Instant::now() < give_up {
            if self.nspawn.try_wait().ok().flatten().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if self.nspawn.try_wait().ok().flatten().is_none() {
            let pid = nix::unistd::Pid::from_raw(self.nspawn.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = self.nspawn.wait();
        }
    }
}

fn wait_for_file_line(path: &Path, needle: &str, limit: Duration) -> bool {
    let give_up = Instant::now() + limit;
    while Instant::now() < give_up {
        if std::fs::read_to_string(path).is_ok_and(|t| t.contains(needle)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn copy_fixture(name: &str, to: &Path) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/nspawn")
        .join(name);
    std::fs::copy(&from, to).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
}

/// (seconds since epoch, workload id, event) from the workloads' log.
fn events(shared: &Path) -> Vec<(f64, String, String)> {
    std::fs::read_to_string(shared.join("events.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            Some((
                parts.next()?.parse().ok()?,
                parts.next()?.to_string(),
                parts.next()?.to_string(),
            ))
        })
        .collect()
}

fn skip_with<T>(reason: &str) -> Option<T> {
    skip(reason);
    None
}

/// One container at a time: two booting at once on a small machine blur the timings.
static ONE_CONTAINER_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct Booted {
    _serial: std::sync::MutexGuard<'static, ()>,
    _work: tempfile::TempDir,
    root: PathBuf,
    shared: PathBuf,
    container: Container,
}

/// Boot the container with the agent and workloads and wait until the agent holds its
/// lock; `None` (after a message) when this machine cannot run the test.
fn boot() -> Option<Booted> {
    if !is_root() {
        return skip_with("not running as root");
    }
    for program in ["systemd-nspawn", "debootstrap", "nsenter"] {
        if !have(program) {
            return skip_with(&format!(
                "{program} is missing (apt-get install -y systemd-container debootstrap)"
            ));
        }
    }
    let serial = ONE_CONTAINER_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let tree = match cached_tree() {
        Ok(tree) => tree,
        Err(error) => return skip_with(&format!("no Debian tree: {error}")),
    };
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    let shared = work.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let copied = Command::new("cp")
        .args(["-a", "--reflink=auto"])
        .arg(&tree)
        .arg(&root)
        .status()
        .unwrap();
    assert!(copied.success(), "copying {}", tree.display());
    for name in [
        "config.yaml",
        "pods.yaml",
        "workload.sh",
        "start-workloads.sh",
    ] {
        copy_fixture(name, &shared.join(name));
    }
    let units = root.join("etc/systemd/system");
    let wants = units.join("multi-user.target.wants");
    std::fs::create_dir_all(&wants).unwrap();
    for unit in ["nodekeeper-shutdown.service", "workloads.service"] {
        copy_fixture(unit, &units.join(unit));
        std::os::unix::fs::symlink(format!("/etc/systemd/system/{unit}"), wants.join(unit))
            .unwrap();
    }

    let binary = env!("CARGO_BIN_EXE_nodekeeper");
    let nspawn = Command::new("systemd-nspawn")
        .args([
            "--register=no",
            "--keep-unit",
            "--console=passive",
            "-b",
            "-D",
        ])
        .arg(&root)
        .arg(format!("--bind={}:/shared", shared.display()))
        .arg(format!("--bind-ro={binary}:/usr/local/bin/nodekeeper"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut container = match nspawn {
        Ok(child) => Container { nspawn: child },
        Err(error) => return skip_with(&format!("systemd-nspawn cannot start: {error}")),
    };
    let booted = Instant::now();
    let agent_log = shared.join("agent.log");
    if !wait_for_file_line(
        &agent_log,
        "logind delay lock held",
        Duration::from_secs(90),
    ) {
        if container.nspawn.try_wait().ok().flatten().is_some() {
            return skip_with("systemd-nspawn exited during boot (no container support here?)");
        }
        panic!(
            "the agent never took the delay lock; its log:\n{}",
            std::fs::read_to_string(&agent_log).unwrap_or_default()
        );
    }
    println!(
        "container booted and agent holds the lock after {:?}",
        booted.elapsed()
    );
    Some(Booted {
        _serial: serial,
        _work: work,
        root,
        shared,
        container,
    })
}

#[test]
fn real_logind_waits_for_the_phases_and_the_container_powers_off() {
    let Some(Booted {
        _serial,
        _work,
        root,
        shared,
        mut container,
    }) = boot()
    else {
        return;
    };
    let agent_log = shared.join("agent.log");
    // The lock is visible to logind, and logind honours the raised limit.
    let inhibitors = container.exec("systemd-inhibit --list --no-pager");
    let inhibitors = String::from_utf8_lossy(&inhibitors.stdout);
    assert!(
        inhibitors
            .lines()
            .any(|l| l.contains("nodekeeper") && l.contains("shutdown") && l.contains("delay")),
        "{inhibitors}"
    );
    let delay = container.exec(
        "busctl get-property org.freedesktop.login1 /org/freedesktop/login1 \
         org.freedesktop.login1.Manager InhibitDelayMaxUSec",
    );
    assert_eq!(String::from_utf8_lossy(&delay.stdout).trim(), "t 9000000");
    let dropin =
        std::fs::read_to_string(root.join("etc/systemd/logind.conf.d/99-nodekeeper.conf")).unwrap();
    assert!(dropin.contains("InhibitDelayMaxSec=9"), "{dropin}");

    let give_up = Instant::now() + Duration::from_secs(30);
    while events(&shared).iter().filter(|e| e.2 == "START").count() < 4 {
        assert!(
            Instant::now() < give_up,
            "workloads did not start: {:?}",
            events(&shared)
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let poweroff_at = Instant::now();
    let poweroff = container.exec("systemctl poweroff");
    assert!(poweroff.status.success(), "{poweroff:?}");
    assert!(
        container.exited_within(Duration::from_secs(60)),
        "the container did not power off"
    );
    let gone_after = poweroff_at.elapsed();

    let log = std::fs::read_to_string(&agent_log).unwrap();
    assert!(log.contains("PrepareForShutdown(true)"), "{log}");
    assert!(log.contains("delay lock released"), "{log}");
    let state: ShutdownState = StateStore::new(shared.join("state.json"))
        .load()
        .unwrap()
        .expect("state file");
    assert_eq!(state.outcome, ShutdownOutcome::Finished);
    assert!(state.about_to_power_off);
    let priorities: Vec<i32> = state.phases.iter().map(|p| p.priority).collect();
    assert_eq!(priorities, vec![0, 1000, 2_000_000_000]);
    let mut previous_end = 0;
    for phase in &state.phases {
        let (start, end) = (
            phase.started_unix_ms.unwrap(),
            phase.finished_unix_ms.unwrap(),
        );
        assert!(start >= previous_end, "phases overlap: {state:?}");
        previous_end = end;
        let overshoot = (end - start) as i64 - phase.seconds * 1000;
        println!(
            "phase {} ({:?}): took {} ms of its {} s budget (overshoot {} ms)",
            phase.priority,
            phase.status,
            end - start,
            phase.seconds,
            overshoot
        );
        assert!(
            overshoot <= 500,
            "phase {} overran its budget",
            phase.priority
        );
    }
    assert_eq!(
        state.phases[0].status,
        PhaseStatus::TimedOut,
        "batch ignores SIGTERM"
    );
    assert_eq!(state.phases[1].status, PhaseStatus::Completed);

    let term_at = |id: &str| {
        events(&shared)
            .iter()
            .find(|e| e.1 == id && e.2 == "TERM")
            .map(|e| e.0)
            .unwrap_or_else(|| panic!("{id} never got SIGTERM: {:?}", events(&shared)))
    };
    let (web, batch) = (term_at("default/web"), term_at("default/batch"));
    let (postgres, dns) = (term_at("db/postgres"), term_at("kube-system/dns"));
    assert!(
        web.max(batch) < postgres && postgres < dns,
        "{:?}",
        events(&shared)
    );
    println!(
        "poweroff to container gone: {gone_after:?} (logind's default limit is 5 s; budget 9 s)"
    );
    assert!(
        gone_after > Duration::from_secs(5),
        "the drain took longer than 5 s, so logind must have honoured the raised limit"
    );
}

/// Killing the agent mid-shutdown: systemd restarts it and it finishes the remaining
/// phases. Killing closes the agent's lock, so a second delay lock (as another component
/// on a real node might hold) keeps logind waiting meanwhile, up to the raised 9 s limit.
#[test]
fn an_agent_killed_mid_shutdown_resumes_the_remaining_phases() {
    let Some(Booted {
        _serial,
        _work,
        shared,
        mut container,
        ..
    }) = boot()
    else {
        return;
    };
    let give_up = Instant::now() + Duration::from_secs(30);
    while events(&shared).iter().filter(|e| e.2 == "START").count() < 4 {
        assert!(Instant::now() < give_up, "workloads did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let other = container.exec(
        "systemd-run --unit=other-delay-lock systemd-inhibit --what=shutdown --mode=delay \
         --who=other --why=test sleep 60",
    );
    assert!(other.status.success(), "{other:?}");
    let poweroff = container.exec("systemctl poweroff");
    assert!(poweroff.status.success(), "{poweroff:?}");
    let give_up = Instant::now() + Duration::from_secs(10);
    while !events(&shared)
        .iter()
        .any(|e| e.1 == "default/web" && e.2 == "TERM")
    {
        assert!(Instant::now() < give_up, "phase 0 never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let killed = container.exec("systemctl kill --signal=SIGKILL nodekeeper-shutdown.service");
    assert!(killed.status.success(), "{killed:?}");
    assert!(
        container.exited_within(Duration::from_secs(60)),
        "the container did not power off"
    );
    let log = std::fs::read_to_string(shared.join("agent.log")).unwrap();
    assert!(
        log.contains("resuming a shutdown interrupted by an agent restart"),
        "{log}"
    );
    let state: ShutdownState = StateStore::new(shared.join("state.json"))
        .load()
        .unwrap()
        .expect("state file");
    assert_eq!(state.outcome, ShutdownOutcome::Finished, "{state:?}");
    for phase in &state.phases {
        println!(
            "resumed run: phase {} {:?} in {:?} ms",
            phase.priority,
            phase.status,
            phase.duration_ms()
        );
    }
    for id in ["db/postgres", "kube-system/dns"] {
        assert!(
            events(&shared).iter().any(|e| e.1 == id && e.2 == "TERM"),
            "{id} was not drained after the restart: {:?}",
            events(&shared)
        );
    }
}
