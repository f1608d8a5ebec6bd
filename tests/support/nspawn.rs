//! A node for end-to-end tests: a copy of the cached Debian tree (`debian.rs`) booted
//! with systemd-nspawn, so systemd and logind are real. The container shares the test's
//! network namespace, so what runs inside reaches the test's servers on loopback, unless
//! the test boots it in a namespace of its own ([`BootOptions::netns`]). `/shared` inside
//! is a directory of the test; the `nodekeeper` binary under test is bound at
//! `/usr/local/bin/nodekeeper` and at `/usr/bin/nodekeeper`, where the shipped units
//! expect it (unless the test installs the Debian package instead).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

/// What an nspawn test needs, for `require!`.
pub const NSPAWN: &str = "systemd-nspawn with a debootstrap'ed Debian tree";

pub struct Container {
    nspawn: Child,
}

impl Container {
    /// The container's systemd: the child of systemd-nspawn running `systemd` (nspawn
    /// may have helper children of its own).
    fn init_pid(&self) -> Option<u32> {
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.nspawn.id()))
                .ok()?;
        children
            .split_whitespace()
            .filter_map(|pid| pid.parse::<u32>().ok())
            .find(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm.trim() == "systemd")
            })
    }

    /// Runs `command` with `sh -c` in the container's namespaces.
    pub fn exec(&self, command: &str) -> std::process::Output {
        let pid = self.init_pid().expect("container init");
        Command::new("nsenter")
            .args(["-t", &pid.to_string(), "-a", "sh", "-c", command])
            .output()
            .expect("nsenter")
    }

    /// The standard output of `command` (`sh -c`), trimmed, whether it succeeds or not
    /// (`systemctl is-active` of a stopped unit exits 3).
    pub fn stdout(&self, command: &str) -> String {
        String::from_utf8_lossy(&self.exec(command).stdout)
            .trim()
            .to_string()
    }

    /// A property of a systemd unit in the container (`systemctl show`), e.g. `MainPID`.
    pub fn unit_property(&self, unit: &str, name: &str) -> String {
        self.stdout(&format!("systemctl show --property={name} --value {unit}"))
    }

    /// Whether the container is gone (it powered off).
    pub fn exited(&mut self) -> bool {
        self.nspawn.try_wait().ok().flatten().is_some()
    }

    pub fn exited_within(&mut self, limit: Duration) -> bool {
        let give_up = Instant::now() + limit;
        while Instant::now() < give_up {
            if self.exited() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Runs `systemctl poweroff` inside and waits (up to 60 s, else the test fails) until
    /// the container is gone. Returns how long that took from the command.
    pub fn power_off(&mut self) -> Duration {
        let asked = Instant::now();
        let poweroff = self.exec("systemctl poweroff");
        assert!(poweroff.status.success(), "{poweroff:?}");
        assert!(
            self.exited_within(Duration::from_secs(60)),
            "the container did not power off"
        );
        asked.elapsed()
    }

    /// Kills the container at once, as a power loss stops a machine, and returns whether
    /// it is gone within 10 s. Its init goes first: killing it ends every process of the
    /// container's PID namespace, while killing only systemd-nspawn would leave the
    /// container running, orphaned.
    pub fn kill(&mut self) -> bool {
        if let Some(init) = self.init_pid() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(init as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        self.exited_within(Duration::from_secs(10))
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if self.exited() {
            return;
        }
        if !self.kill() {
            let pid = nix::unistd::Pid::from_raw(self.nspawn.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = self.nspawn.wait();
        }
    }
}

/// One container at a time on this machine, across test binaries (a file lock): two
/// booting at once on a small machine blur the timings, and the first one builds the
/// cached tree.
fn one_at_a_time() -> Result<Flock<File>, String> {
    let dir = Path::new("/var/cache/nodekeeper-test");
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join("nspawn.lock");
    let file = File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Flock::lock(file, FlockArg::LockExclusive)
        .map_err(|(_, errno)| format!("locking {}: {errno}", path.display()))
}

/// A booted container and what goes with it; dropping it kills the container if it is
/// still running, removes its tree, then lets the next test boot one. Keep it whole
/// (`let booted = ...`, not a destructuring with `..`, which would drop the tree at once).
pub struct Booted {
    pub container: Container,
    /// The container's root directory.
    pub root: PathBuf,
    /// `/shared` inside.
    pub shared: PathBuf,
    _work: tempfile::TempDir,
    _serial: Flock<File>,
}

/// Boots a container with the systemd `units` (name, text) installed and enabled, and
/// `files` (name, contents) in `/shared`, and waits until `/shared/agent.log` holds
/// `ready_line`. `Err` says why this machine cannot run the test.
pub fn boot(
    units: &[(&str, String)],
    files: &[(&str, Vec<u8>)],
    ready_line: &str,
) -> Result<Booted, String> {
    boot_with(units, files, ready_line, BootOptions::default())
}

/// How a container boots, beyond its units and files.
#[derive(Default)]
pub struct BootOptions {
    /// Its cgroups a writable cgroup v2 tree (see [`boot_unified`]).
    pub unified: bool,
    /// The network namespace it runs in (`/run/netns/<name>`), instead of the test's.
    pub netns: Option<PathBuf>,
    /// Files written into the tree before it boots: (absolute path inside, contents).
    pub tree_files: Vec<(String, Vec<u8>)>,
    /// Leave `/usr/bin` and `/usr/local/bin` as the tree has them, without the binary under
    /// test: for a test that installs the Debian package, which puts it there itself.
    pub without_test_binary: bool,
}

/// [`boot`], with the container's cgroups a writable cgroup v2 tree (a unified
/// hierarchy, with `cgroup.kill`) whatever the host's layout: on a hybrid or legacy host
/// nspawn otherwise hands the container read-only v1 controllers.
pub fn boot_unified(
    units: &[(&str, String)],
    files: &[(&str, Vec<u8>)],
    ready_line: &str,
) -> Result<Booted, String> {
    let options = BootOptions {
        unified: true,
        ..BootOptions::default()
    };
    boot_with(units, files, ready_line, options)
}

/// [`boot`] with `options`.
pub fn boot_with(
    units: &[(&str, String)],
    files: &[(&str, Vec<u8>)],
    ready_line: &str,
    options: BootOptions,
) -> Result<Booted, String> {
    super::real::root()?;
    super::real::program("systemd-nspawn", "systemd-container")?;
    super::real::program("nsenter", "util-linux")?;
    let serial = one_at_a_time()?;
    let tree = super::debian::cached_tree()?;
    let work = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
    let root = work.path().join("root");
    let shared = work.path().join("shared");
    std::fs::create_dir_all(&shared).expect("the shared directory");
    let copied = Command::new("cp")
        .args(["-a", "--reflink=auto"])
        .arg(&tree)
        .arg(&root)
        .status()
        .expect("cp");
    assert!(copied.success(), "copying {}", tree.display());
    for (name, contents) in files {
        std::fs::write(shared.join(name), contents).expect("a shared file");
    }
    for (inside, contents) in &options.tree_files {
        let path = root.join(inside.trim_start_matches('/'));
        std::fs::create_dir_all(path.parent().expect("a file in a directory"))
            .expect("the file's directory");
        std::fs::write(&path, contents).expect("a file in the tree");
    }
    let unit_dir = root.join("etc/systemd/system");
    let wants = unit_dir.join("multi-user.target.wants");
    std::fs::create_dir_all(&wants).expect("the unit directory");
    for (name, text) in units {
        std::fs::write(unit_dir.join(name), text).expect("a unit");
        std::os::unix::fs::symlink(format!("/etc/systemd/system/{name}"), wants.join(name))
            .expect("enable the unit");
    }

    let binary = env!("CARGO_BIN_EXE_nodekeeper");
    let mut nspawn = Command::new("systemd-nspawn");
    if options.unified {
        nspawn.env("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY", "1");
    }
    if let Some(netns) = &options.netns {
        nspawn.arg(format!("--network-namespace-path={}", netns.display()));
    }
    let nspawn = nspawn
        .args([
            "--register=no",
            "--keep-unit",
            "--console=passive",
            "-b",
            "-D",
        ])
        .arg(&root)
        .arg(format!("--bind={}:/shared", shared.display()))
        .args(if options.without_test_binary {
            Vec::new()
        } else {
            vec![
                format!("--bind-ro={binary}:/usr/local/bin/nodekeeper"),
                format!("--bind-ro={binary}:/usr/bin/nodekeeper"),
            ]
        })
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut container = Container {
        nspawn: nspawn.map_err(|e| format!("systemd-nspawn cannot start: {e}"))?,
    };
    let booted = Instant::now();
    let agent_log = shared.join("agent.log");
    if !wait_for_file_line(&agent_log, ready_line, Duration::from_secs(90)) {
        if let Ok(Some(status)) = container.nspawn.try_wait() {
            return Err(format!(
                "systemd-nspawn exited during boot ({status}; no container support here?)"
            ));
        }
        panic!(
            "the agent never logged {ready_line:?}; its log:\n{}",
            std::fs::read_to_string(&agent_log).unwrap_or_default()
        );
    }
    println!(
        "container booted and the agent logged {ready_line:?} after {:?}",
        booted.elapsed()
    );
    Ok(Booted {
        container,
        root,
        shared,
        _work: work,
        _serial: serial,
    })
}

pub fn wait_for_file_line(path: &Path, needle: &str, limit: Duration) -> bool {
    let give_up = Instant::now() + limit;
    while Instant::now() < give_up {
        if std::fs::read_to_string(path).is_ok_and(|t| t.contains(needle)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}
