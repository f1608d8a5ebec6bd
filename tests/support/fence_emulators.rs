//! Real fence-device emulators on loopback, for tests that drive the real ClusterLabs fence
//! agents (Debian package `fence-agents`) against them:
//!
//! - [`IpmiSim`]: an OpenIPMI `ipmi_sim` BMC (for `fence_ipmilan`), whose chassis power is a
//!   file the test can read and write;
//! - [`Redfish`]: `sushy-emulator` with its fake driver, over HTTPS with a self-signed
//!   certificate and bcrypt htpasswd auth (for `fence_redfish`);
//! - [`SnmpPdu`]: an `snmpsim` command responder playing an APC or Eaton PDU with four
//!   outlets (for `fence_apc_snmp` / `fence_eaton_snmp`).
//!
//! Each emulator listens on 127.0.0.1 only, on a free port chosen when it starts, so tests in
//! parallel processes do not collide. `start` returns once the emulator answers, and its
//! `Err` says what is missing and how to install it, for [`require!`](crate::require).
//! Dropping an emulator stops the one process it started, by PID: SIGTERM, then SIGKILL if
//! it has not exited within [`STOP_GRACE`].
//!
//! The Python emulators come from the virtual environment named by [`VENV_ENV`]
//! (`scripts/test` builds it). The recipes behind the configuration files are in the
//! fence-device emulator reference notes (ipmi_sim, sushy-tools, snmpsim sections).

use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write as _};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::real::{program, root};

/// Every emulator listens on this address only.
pub const LOOPBACK: &str = "127.0.0.1";

/// The environment variable naming the virtual environment with `sushy-emulator` and
/// `snmpsim-command-responder`.
pub const VENV_ENV: &str = "NODEKEEPER_FENCE_VENV";

/// Where `scripts/test` puts that virtual environment when [`VENV_ENV`] is unset.
pub const DEFAULT_VENV: &str = "/var/cache/nodekeeper-test/fence-venv";

/// How long `start` waits for an emulator to answer.
pub const START_DEADLINE: Duration = Duration::from_secs(15);

/// How long `Drop` waits after SIGTERM before it sends SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// How often `start` picks a new port when the emulator could not bind the one it was given
/// (another process took it between our probe and the emulator's bind).
const PORT_ATTEMPTS: u32 = 4;

/// How many lines of an emulator's log an error message quotes.
const LOG_TAIL_LINES: usize = 20;

// ------------------------------------------------------------------ shared plumbing

/// One emulator process we started, stopped by its PID when dropped.
struct EmulatorProcess {
    /// What it is, for messages: "ipmi_sim", "sushy-emulator", "snmpsim".
    name: &'static str,
    child: Child,
    /// Where its stdout and stderr (and whatever else it logs) go, quoted in errors.
    log: PathBuf,
}

impl EmulatorProcess {
    /// Start `command` with stdin closed and stdout + stderr appended to `log`.
    fn spawn(name: &'static str, mut command: Command, log: &Path) -> Result<Self, String> {
        let output = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|error| format!("{name}: cannot open its log {}: {error}", log.display()))?;
        let errors = output
            .try_clone()
            .map_err(|error| format!("{name}: cannot duplicate its log file: {error}"))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(errors)
            .spawn()
            .map_err(|error| format!("{name}: cannot start {command:?}: {error}"))?;
        Ok(Self {
            name,
            child,
            log: log.to_path_buf(),
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited (and been reaped), with how.
    fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(error) => Some(format!("cannot be waited for: {error}")),
        }
    }

    /// Poll `answers` until it is true while this process holds `port`, or until the process
    /// exits, another process turns out to hold the port, or [`START_DEADLINE`] passes.
    fn wait_until_ready(
        &mut self,
        protocol: Protocol,
        port: u16,
        mut answers: impl FnMut() -> bool,
    ) -> Readiness {
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if let Some(status) = self.exited() {
                return Readiness::Exited(status);
            }
            // snmpsim keeps running when it cannot bind its port, and an answer may come from
            // whoever holds the port instead: so the port must be ours (and the callers' probes
            // also check an identity of their own instance).
            let holders = PortHolders::find(protocol, port, self.pid());
            if holders.others && !holders.ours {
                return Readiness::PortTaken;
            }
            if holders.ours && answers() {
                return Readiness::Ready;
            }
            if Instant::now() >= deadline {
                return Readiness::TimedOut;
            }
            sleep(Duration::from_millis(100));
        }
    }

    /// The error for an emulator that did not come up, with the end of its log.
    fn not_ready(&self, what: &str) -> String {
        format!(
            "{} (pid {}) {what}; last lines of {}:\n{}",
            self.name,
            self.pid(),
            self.log.display(),
            log_tail(&self.log)
        )
    }

    /// Whether its log says it could not bind its port.
    fn lost_port_race(&self) -> bool {
        let log = fs::read_to_string(&self.log).unwrap_or_default();
        log.contains("Address already in use") || log.contains("EADDRINUSE")
    }
}

impl Drop for EmulatorProcess {
    fn drop(&mut self) {
        if self.exited().is_some() {
            return;
        }
        let Ok(pid) = i32::try_from(self.pid()) else {
            return;
        };
        // Only this PID is signalled: the child is not reaped yet, so the PID is still ours.
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            sleep(Duration::from_millis(20));
        }
        eprintln!(
            "{} (pid {pid}) ignored SIGTERM for {STOP_GRACE:?}; sending SIGKILL",
            self.name
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

enum Readiness {
    Ready,
    /// The process exited before it answered, with its exit status.
    Exited(String),
    /// Another process holds the port, and this one does not.
    PortTaken,
    TimedOut,
}

/// Who has a socket bound to a local port, from the emulator's own `/proc/PID/net/{udp,tcp}`
/// (the table of the network namespace it runs in, which need not be the test process's
/// main thread's) and the socket inodes among a process's open files.
struct PortHolders {
    /// The emulator process has one.
    ours: bool,
    /// Some other process has one.
    others: bool,
}

impl PortHolders {
    fn find(protocol: Protocol, port: u16, pid: u32) -> Self {
        let (table, bound_state) = match protocol {
            Protocol::Udp => (format!("/proc/{pid}/net/udp"), None),
            // TCP: only a listening socket holds the port; the probes' closed connections
            // linger in the table, but without an inode.
            Protocol::Tcp => (format!("/proc/{pid}/net/tcp"), Some("0A")),
        };
        let bound_inodes: Vec<u64> = fs::read_to_string(&table)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .filter_map(|line| {
                // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
                let fields: Vec<&str> = line.split_whitespace().collect();
                let local_port = fields.get(1)?.rsplit(':').next()?;
                let state = fields.get(3)?;
                let inode: u64 = fields.get(9)?.parse().ok()?;
                let on_port = u16::from_str_radix(local_port, 16).ok()? == port;
                let bound = bound_state.is_none_or(|wanted| *state == wanted);
                (on_port && bound && inode != 0).then_some(inode)
            })
            .collect();
        let our_sockets = socket_inodes(pid);
        Self {
            ours: bound_inodes.iter().any(|inode| our_sockets.contains(inode)),
            others: bound_inodes
                .iter()
                .any(|inode| !our_sockets.contains(inode)),
        }
    }
}

/// The inodes of the sockets process `pid` has open (`/proc/PID/fd/N -> socket:[INODE]`).
fn socket_inodes(pid: u32) -> Vec<u64> {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    fds.filter_map(|fd| {
        let target = fs::read_link(fd.ok()?.path()).ok()?;
        let target = target.to_str()?;
        target
            .strip_prefix("socket:[")?
            .strip_suffix(']')?
            .parse()
            .ok()
    })
    .collect()
}

/// Start an emulator on a fresh port, again on a new port when it lost the port to another
/// process. `launch(port)` writes the emulator's files for `port` and spawns it; `answers(port)`
/// probes it once.
fn start_on_free_port(
    name: &'static str,
    protocol: Protocol,
    mut launch: impl FnMut(u16) -> Result<EmulatorProcess, String>,
    mut answers: impl FnMut(u16) -> bool,
) -> Result<(EmulatorProcess, u16), String> {
    for attempt in 1..=PORT_ATTEMPTS {
        let port = free_loopback_port(protocol)?;
        let mut process = launch(port)?;
        match process.wait_until_ready(protocol, port, || answers(port)) {
            Readiness::Ready => return Ok((process, port)),
            Readiness::PortTaken if attempt < PORT_ATTEMPTS => continue,
            Readiness::Exited(_) if process.lost_port_race() && attempt < PORT_ATTEMPTS => {
                continue;
            }
            Readiness::PortTaken => {
                return Err(
                    process.not_ready(&format!("found {LOOPBACK}:{port} taken by another process"))
                );
            }
            Readiness::Exited(status) => {
                return Err(process.not_ready(&format!(
                    "exited ({status}) before it answered on {LOOPBACK}:{port}"
                )));
            }
            Readiness::TimedOut => {
                return Err(process.not_ready(&format!(
                    "did not answer on {LOOPBACK}:{port} within {START_DEADLINE:?}"
                )));
            }
        }
    }
    Err(format!(
        "{name}: every one of {PORT_ATTEMPTS} ports was taken before it could bind it"
    ))
}

#[derive(Clone, Copy)]
enum Protocol {
    Udp,
    Tcp,
}

/// A loopback port that was free a moment ago: bind port 0, read what the kernel chose,
/// release it. Another process may take it before the emulator binds it, hence the retries
/// in [`start_on_free_port`].
fn free_loopback_port(protocol: Protocol) -> Result<u16, String> {
    let any_port: SocketAddr = (std::net::Ipv4Addr::LOCALHOST, 0).into();
    let address = match protocol {
        Protocol::Udp => UdpSocket::bind(any_port).and_then(|socket| socket.local_addr()),
        Protocol::Tcp => TcpListener::bind(any_port).and_then(|socket| socket.local_addr()),
    };
    address
        .map(|address| address.port())
        .map_err(|error| format!("cannot find a free loopback port: {error}"))
}

/// A token that differs between instances, across processes and within one: the emulators
/// carry it in an answer, so a readiness probe knows it reached its own instance.
fn instance_token() -> u128 {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    (u128::from(std::process::id()) << 96) ^ (u128::from(count) << 64) ^ nanos
}

fn log_tail(log: &Path) -> String {
    let mut text = String::new();
    if let Err(error) = fs::File::open(log).and_then(|mut file| file.read_to_string(&mut text)) {
        return format!("  (cannot read it: {error})");
    }
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
    if tail.is_empty() {
        return "  (empty)".to_string();
    }
    tail.iter().fold(String::new(), |mut out, line| {
        let _ = writeln!(out, "  {line}");
        out
    })
}

fn create_dir(path: &Path) -> Result<(), String> {
    fs::create_dir_all(path).map_err(|error| format!("cannot create {}: {error}", path.display()))
}

fn write_file(path: &Path, contents: &str) -> Result<(), String> {
    fs::write(path, contents).map_err(|error| format!("cannot write {}: {error}", path.display()))
}

fn set_mode(path: &Path, mode: u32) -> Result<(), String> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|error| format!("cannot chmod {mode:o} {}: {error}", path.display()))
}

/// Run a helper program to completion; its stdout on success, a message with its stderr
/// otherwise.
fn run(command: &mut Command) -> Result<String, String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("cannot run {command:?}: {error}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{command:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// The virtual environment with the Python emulators.
fn venv() -> PathBuf {
    std::env::var_os(VENV_ENV).map_or_else(|| PathBuf::from(DEFAULT_VENV), PathBuf::from)
}

/// `bin/<program>` of the virtual environment, or why it is not there.
fn venv_program(program: &str) -> Result<PathBuf, String> {
    let venv = venv();
    let path = venv.join("bin").join(program);
    if path.is_file() {
        Ok(path)
    } else {
        let source = match std::env::var_os(VENV_ENV) {
            Some(_) => format!("{VENV_ENV}={}", venv.display()),
            None => format!("{VENV_ENV} is unset, default {}", venv.display()),
        };
        Err(format!(
            "{program} not found at {} ({source}): set {VENV_ENV} or run scripts/test",
            path.display()
        ))
    }
}

// ------------------------------------------------------------------ ipmi_sim

/// How an [`IpmiSim`] BMC misbehaves.
#[derive(Clone, Copy, Debug, Default)]
pub struct IpmiOptions {
    /// "Stuck relay": the BMC accepts a power-off command (and logs it), but the power
    /// stays on.
    pub ignore_power_off: bool,
}

/// One OpenIPMI `ipmi_sim` BMC on loopback (IPMI 1.5 `lan`, and `lanplus` with cipher 3),
/// with user [`IpmiSim::USER`]. Its chassis power is the file `power` in its directory
/// (`1` on, `0` off), switched by a chassis-control script that logs every get and set.
pub struct IpmiSim {
    process: EmulatorProcess,
    port: u16,
    dir: PathBuf,
}

impl IpmiSim {
    pub const USER: &'static str = "admin";
    pub const PASSWORD: &'static str = "s3cretPW-ipmi";

    /// A BMC in `dir/ipmi`, power initially on.
    pub fn start(dir: &Path) -> Result<IpmiSim, String> {
        Self::start_with(dir, IpmiOptions::default())
    }

    pub fn start_with(dir: &Path, options: IpmiOptions) -> Result<IpmiSim, String> {
        program("ipmi_sim", "openipmi")?;
        // The readiness probe; fence_ipmilan needs it too.
        program("ipmitool", "ipmitool")?;
        let dir = dir.join("ipmi");
        create_dir(&dir.join("state"))?;
        write_file(&dir.join("sim.emu"), SIM_EMU)?;
        let chassis_script = dir.join("chassis.sh");
        write_file(&chassis_script, &chassis_script_text(&dir, options))?;
        set_mode(&chassis_script, 0o755)?;
        write_file(&dir.join("power"), "1\n")?;

        let launch = |port: u16| {
            write_file(&dir.join("lan.conf"), &lan_conf(&dir, port))?;
            let mut command = Command::new("ipmi_sim");
            command
                .arg("-n") // no console on stdin
                .arg("-c")
                .arg(dir.join("lan.conf"))
                .arg("-f")
                .arg(dir.join("sim.emu"))
                .arg("-s")
                .arg(dir.join("state"));
            EmulatorProcess::spawn("ipmi_sim", command, &dir.join("sim.log"))
        };
        // Ready when ipmitool reads the power state through *our* chassis script: an answer
        // from another BMC on the same port would not appear in our chassis log.
        let chassis_log = dir.join("chassis.log");
        let answers = |port: u16| {
            ipmitool_power_status(port).is_ok()
                && fs::read_to_string(&chassis_log).is_ok_and(|log| log.contains("get power"))
        };
        let (process, port) = start_on_free_port("ipmi_sim", Protocol::Udp, launch, answers)?;
        Ok(Self { process, port, dir })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The PID of the `ipmi_sim` process.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Whether the chassis power file says on.
    pub fn power_is_on(&self) -> bool {
        fs::read_to_string(self.power_file()).is_ok_and(|power| power.trim() == "1")
    }

    /// Switch the power behind the BMC's back, as a person at the machine would.
    pub fn set_power(&self, on: bool) {
        let power = if on { "1\n" } else { "0\n" };
        if let Err(error) = fs::write(self.power_file(), power) {
            panic!("cannot write {}: {error}", self.power_file().display());
        }
    }

    /// Every chassis get and set the BMC passed to its control script, one per line
    /// (`<unix time> get power`, `<unix time> set power 0`), including the readiness probe's.
    pub fn chassis_log(&self) -> String {
        fs::read_to_string(self.dir.join("chassis.log")).unwrap_or_default()
    }

    fn power_file(&self) -> PathBuf {
        self.dir.join("power")
    }
}

/// One BMC (IPMB address 0x20) with no sensors.
const SIM_EMU: &str = "\
mc_setbmc 0x20
mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr
sel_enable 0x20 1000 0x0a
mc_enable 0x20
";

/// The BMC's LAN configuration: loopback only, no serial console, one admin user.
fn lan_conf(dir: &Path, port: u16) -> String {
    let password = IpmiSim::PASSWORD;
    let user = IpmiSim::USER;
    let script = dir.join("chassis.sh");
    let auths = "none md2 md5 straight";
    format!(
        "name \"nodekeeper-bmc-{port}\"
set_working_mc 0x20
  startlan 1
    addr {LOOPBACK} {port}
    priv_limit admin
    allowed_auths_callback {auths}
    allowed_auths_user {auths}
    allowed_auths_operator {auths}
    allowed_auths_admin {auths}
    guid {token:032x}
  endlan
  chassis_control \"{script}\"
  user 2 true \"{user}\" \"{password}\" admin 10 {auths}
",
        token = instance_token(),
        script = script.display(),
    )
}

/// ipmi_sim runs `chassis.sh get power` and expects `power:<0|1>` back, and runs
/// `chassis.sh set power <0|1>` to switch it. With `ignore_power_off` a `set power 0` is
/// logged but changes nothing.
fn chassis_script_text(dir: &Path, options: IpmiOptions) -> String {
    let power_off = if options.ignore_power_off {
        "          0) ;; # stuck relay: accepted, but the power stays on\n"
    } else {
        ""
    };
    format!(
        r#"#!/bin/sh
dir='{dir}'
echo "$(date +%s.%N) $*" >> "$dir/chassis.log"
operation=$1; shift
if [ "$operation" = get ]; then
  for item in "$@"; do
    case $item in
      power) echo "power:$(cat "$dir/power" 2>/dev/null || echo 1)";;
      boot) echo "boot:none";;
    esac
  done
else
  while [ $# -gt 1 ]; do
    if [ "$1" = power ]; then
      case $2 in
{power_off}          *) echo "$2" > "$dir/power";;
      esac
    fi
    shift 2
  done
fi
"#,
        dir = dir.display()
    )
}

fn ipmitool_power_status(port: u16) -> Result<String, String> {
    run(Command::new("ipmitool")
        .args(["-I", "lan", "-H", LOOPBACK, "-p", &port.to_string()])
        .args(["-U", IpmiSim::USER, "-E"]) // -E: the password from IPMI_PASSWORD, not argv
        .env("IPMI_PASSWORD", IpmiSim::PASSWORD)
        .args(["-N", "1", "-R", "1"]) // one retransmission after 1 s: a quick probe
        .args(["chassis", "power", "status"]))
}

// ------------------------------------------------------------------ sushy-emulator (Redfish)

/// `sushy-emulator` with its fake driver: one system, initially On, served over HTTPS with a
/// self-signed certificate for 127.0.0.1, requiring [`Redfish::USER`] / [`Redfish::PASSWORD`].
///
/// The fake driver applies a power change 1–11 s after the request (randomly, server-side),
/// so `fence_redfish` off/on take up to ~12 s; keep its `power_timeout` at the default 20 s.
pub struct Redfish {
    process: EmulatorProcess,
    port: u16,
    system_uuid: String,
}

impl Redfish {
    pub const USER: &'static str = "admin";
    pub const PASSWORD: &'static str = "s3cretPW-redfish";

    /// An emulator in `dir/redfish`, with a fresh state directory: the fake driver keeps its
    /// power states in a database there, and would reuse an old one.
    pub fn start(dir: &Path) -> Result<Redfish, String> {
        let emulator = venv_program("sushy-emulator")?;
        let python = venv_program("python")?;
        program("openssl", "openssl")?;
        program("curl", "curl")?;
        let dir = dir.join("redfish");
        create_dir(&dir)?;
        make_self_signed_certificate(&dir)?;
        write_htpasswd(&python, &dir.join("htpasswd"))?;
        // A UUID of this instance's own, so the readiness probe cannot be answered by another
        // emulator that holds the port.
        let token = format!("{:032x}", instance_token());
        let system_uuid = format!(
            "{}-{}-{}-{}-{}",
            &token[0..8],
            &token[8..12],
            &token[12..16],
            &token[16..20],
            &token[20..32]
        );

        let launch = |port: u16| {
            let config = dir.join("emulator.conf");
            write_file(&config, &sushy_config(&dir, port, &system_uuid))?;
            let mut command = Command::new(&emulator);
            command.arg("--config").arg(&config);
            EmulatorProcess::spawn("sushy-emulator", command, &dir.join("sushy.log"))
        };
        let answers = |port: u16| {
            let url = format!("https://{LOOPBACK}:{port}/redfish/v1/Systems/{system_uuid}");
            redfish_get(&url).is_ok()
        };
        let (process, port) = start_on_free_port("sushy-emulator", Protocol::Tcp, launch, answers)?;
        Ok(Self {
            process,
            port,
            system_uuid,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The PID of the `sushy-emulator` process.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The system's path, for `fence_redfish`'s `systems_uri`.
    pub fn systems_uri(&self) -> String {
        format!("/redfish/v1/Systems/{}", self.system_uuid)
    }

    /// The system's `PowerState` ("On" or "Off"), read over HTTPS.
    pub fn power_state(&self) -> Result<String, String> {
        let url = format!("https://{LOOPBACK}:{}{}", self.port, self.systems_uri());
        let body = redfish_get(&url)?;
        let system: serde_json::Value = serde_json::from_str(&body)
            .map_err(|error| format!("GET {url}: not JSON ({error}): {body}"))?;
        system["PowerState"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("GET {url}: no PowerState in {body}"))
    }
}

/// An EC key and a certificate for 127.0.0.1 (an EC key is much quicker to make than RSA).
fn make_self_signed_certificate(dir: &Path) -> Result<(), String> {
    run(Command::new("openssl")
        .args(["req", "-x509", "-nodes", "-days", "30"])
        .args(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(dir.join("cert.pem")))
    .map(drop)
}

/// sushy-emulator accepts only bcrypt hashes in its htpasswd file; bcrypt comes with it.
fn write_htpasswd(python: &Path, path: &Path) -> Result<(), String> {
    // The fewest bcrypt rounds: the emulator checks the hash on every request.
    let script = "import bcrypt, os\n\
        hashed = bcrypt.hashpw(os.environ['PASSWORD'].encode(), bcrypt.gensalt(rounds=4))\n\
        print(os.environ['USER_NAME'] + ':' + hashed.decode())";
    let line = run(Command::new(python)
        .args(["-c", script])
        .env("USER_NAME", Redfish::USER)
        .env("PASSWORD", Redfish::PASSWORD))?;
    write_file(path, &line)
}

/// The emulator's configuration file (Python syntax; Rust's `{:?}` quoting of these paths
/// is valid Python).
fn sushy_config(dir: &Path, port: u16, system_uuid: &str) -> String {
    let path = |name: &str| format!("{:?}", dir.join(name).display().to_string());
    format!(
        "SUSHY_EMULATOR_LISTEN_IP = '{LOOPBACK}'
SUSHY_EMULATOR_LISTEN_PORT = {port}
SUSHY_EMULATOR_SSL_CERT = {cert}
SUSHY_EMULATOR_SSL_KEY = {key}
SUSHY_EMULATOR_AUTH_FILE = {htpasswd}
SUSHY_EMULATOR_STATE_DIR = {state}
SUSHY_EMULATOR_FAKE_DRIVER = True
SUSHY_EMULATOR_FAKE_SYSTEMS = [
    {{'uuid': '{system_uuid}', 'name': 'node1', 'power_state': 'On',
      'nics': [{{'mac': '00:5c:52:31:3a:9c', 'ip': '{LOOPBACK}'}}]}},
]
",
        cert = path("cert.pem"),
        key = path("key.pem"),
        htpasswd = path("htpasswd"),
        state = path("state"),
    )
}

/// GET `url` with the emulator's credentials, not checking its self-signed certificate.
fn redfish_get(url: &str) -> Result<String, String> {
    run(Command::new("curl")
        .args(["--silent", "--show-error", "--fail", "--insecure"])
        .args(["--max-time", "5"])
        .args([
            "--user",
            &format!("{}:{}", Redfish::USER, Redfish::PASSWORD),
        ])
        .arg(url))
}

// ------------------------------------------------------------------ snmpsim PDUs

/// Which PDU an [`SnmpPdu`] plays, chosen so the fence agent picks OIDs where the outlet's
/// status and control are one OID (which snmpsim's writecache can hold).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PduKind {
    /// An APC MasterSwitch as `fence_apc_snmp`'s fallback device: outlet N at
    /// `.1.3.6.1.4.1.318.1.1.4.4.2.1.3.N`, 1 on, 2 off.
    Apc,
    /// An Eaton Managed ePDU for `fence_eaton_snmp`: outlet N at
    /// `.1.3.6.1.4.1.534.6.6.6.1.2.2.1.3.(N-1)` (0-based on the wire), 1 on, 0 off.
    Eaton,
}

impl PduKind {
    fn name(self) -> &'static str {
        match self {
            PduKind::Apc => "apc",
            PduKind::Eaton => "eaton",
        }
    }

    /// The OID of outlet `plug` as the fence agent numbers it (from 1).
    fn outlet_oid(self, plug: u32) -> Result<String, String> {
        match (self, plug) {
            (_, 0) => Err("outlets are numbered from 1".to_string()),
            (PduKind::Apc, plug) => Ok(format!("{APC_OUTLET_STATE}.{plug}")),
            (PduKind::Eaton, plug) => Ok(format!("{EATON_OUTLET_STATE}.{}", plug - 1)),
        }
    }

    /// Whether an outlet's state value means on, or `None` for a value this PDU never uses.
    fn value_is_on(self, value: i64) -> Option<bool> {
        match (self, value) {
            (_, 1) => Some(true),
            (PduKind::Apc, 2) | (PduKind::Eaton, 0) => Some(false),
            _ => None,
        }
    }

    /// The simulation data: system group (with this instance's own `sysName`) and the four
    /// outlets, 1, 2 and 4 on, 3 off. snmpsim wants the lines sorted by OID.
    fn snmprec(self, sys_name: &str) -> String {
        let mut records = String::new();
        let (description, sys_object_id) = match self {
            PduKind::Apc => ("APC MasterSwitch (snmpsim)", "1.3.6.1.4.1.318.1.3.4.1"),
            PduKind::Eaton => ("Eaton Managed ePDU (snmpsim)", "1.3.6.1.4.1.534.6.6.6"),
        };
        let _ = writeln!(records, "{SYS_DESCR}|4|{description}");
        let _ = writeln!(records, "{SYS_OBJECT_ID}|6|{sys_object_id}");
        let _ = writeln!(records, "1.3.6.1.2.1.1.3.0|67|123456");
        let _ = writeln!(records, "{SYS_NAME}|4|{sys_name}");
        let initially_on = |plug: u32| plug != 3;
        match self {
            PduKind::Apc => {
                for plug in 1..=4 {
                    let value = if initially_on(plug) { 1 } else { 2 };
                    let _ = writeln!(
                        records,
                        "{APC_OUTLET_STATE}.{plug}|2:writecache|value={value}"
                    );
                }
                for plug in 1..=4 {
                    let _ = writeln!(records, "{APC_OUTLET_NAME}.{plug}|4|node{plug}");
                }
            }
            PduKind::Eaton => {
                // fence_eaton_snmp lists outlets from this table and wants integers in it.
                for index in 0..4 {
                    let _ = writeln!(records, "{EATON_OUTLET_ID}.{index}|2|{index}");
                }
                for plug in 1..=4 {
                    let value = i32::from(initially_on(plug));
                    let _ = writeln!(
                        records,
                        "{EATON_OUTLET_STATE}.{}|2:writecache|value={value}",
                        plug - 1
                    );
                }
            }
        }
        records
    }
}

const SYS_DESCR: &str = "1.3.6.1.2.1.1.1.0";
const SYS_OBJECT_ID: &str = "1.3.6.1.2.1.1.2.0";
const SYS_NAME: &str = "1.3.6.1.2.1.1.5.0";
const APC_OUTLET_STATE: &str = "1.3.6.1.4.1.318.1.1.4.4.2.1.3";
const APC_OUTLET_NAME: &str = "1.3.6.1.4.1.318.1.1.4.4.2.1.4";
const EATON_OUTLET_ID: &str = "1.3.6.1.4.1.534.6.6.6.1.2.2.1.1";
const EATON_OUTLET_STATE: &str = "1.3.6.1.4.1.534.6.6.6.1.2.2.1.3";

/// An `snmpsim` command responder playing one PDU with community [`SnmpPdu::COMMUNITY`]
/// (SNMP v1 and v2c). Outlet states live in the process's memory: they are writable, and a
/// new instance starts again from 1, 2, 4 on and 3 off.
pub struct SnmpPdu {
    process: EmulatorProcess,
    port: u16,
    kind: PduKind,
}

impl SnmpPdu {
    pub const COMMUNITY: &'static str = "private";

    /// A PDU in `dir/snmp-apc` or `dir/snmp-eaton`. As root, snmpsim insists on dropping to
    /// nobody:nogroup, so then its files are handed to nobody and `dir` is made traversable.
    pub fn start(dir: &Path, kind: PduKind) -> Result<SnmpPdu, String> {
        let responder = venv_program("snmpsim-command-responder")?;
        program("snmpget", "snmp")?;
        let pdu_dir = dir.join(format!("snmp-{}", kind.name()));
        let data_dir = pdu_dir.join("data");
        let cache_dir = pdu_dir.join("cache");
        create_dir(&data_dir)?;
        create_dir(&cache_dir)?;
        let sys_name = format!("{}-pdu-{:x}", kind.name(), instance_token());
        // The data file's name is the community it answers.
        write_file(
            &data_dir.join(format!("{}.snmprec", Self::COMMUNITY)),
            &kind.snmprec(&sys_name),
        )?;
        let drop_privileges = root().is_ok();
        if drop_privileges {
            set_mode(dir, 0o755)?;
            set_mode(&pdu_dir, 0o755)?;
            run(Command::new("chown")
                .args(["-R", "nobody:nogroup"])
                .arg(&data_dir)
                .arg(&cache_dir))?;
        }

        let launch = |port: u16| {
            let mut command = Command::new(&responder);
            if drop_privileges {
                command.args(["--process-user=nobody", "--process-group=nogroup"]);
            }
            command
                .arg(format!("--data-dir={}", data_dir.display()))
                .arg(format!("--cache-dir={}", cache_dir.display()))
                .arg(format!("--agent-udpv4-endpoint={LOOPBACK}:{port}"))
                // Its log goes to stderr, which is our log file, opened before it drops root.
                .arg("--logging-method=stderr");
            EmulatorProcess::spawn("snmpsim", command, &pdu_dir.join("snmpsim.log"))
        };
        let answers = |port: u16| snmpget(port, SYS_NAME).is_ok_and(|name| name == sys_name);
        let (process, port) = start_on_free_port("snmpsim", Protocol::Udp, launch, answers)?;
        Ok(Self {
            process,
            port,
            kind,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The PID of the `snmpsim-command-responder` process.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Whether outlet `plug` (numbered from 1, as the fence agents number it) is on, read
    /// with `snmpget`.
    pub fn outlet_is_on(&self, plug: u32) -> Result<bool, String> {
        let oid = self.kind.outlet_oid(plug)?;
        let value = snmpget(self.port, &oid)?;
        value
            .parse::<i64>()
            .ok()
            .and_then(|number| self.kind.value_is_on(number))
            .ok_or_else(|| format!("{:?} outlet {plug} ({oid}) has state {value:?}", self.kind))
    }
}

/// One value from `snmpget` (v1, our community), without quotes.
fn snmpget(port: u16, oid: &str) -> Result<String, String> {
    let output = run(Command::new("snmpget")
        .args(["-m", ""]) // no MIBs: numeric OIDs only, and no warnings about missing MIB files
        .args(["-v1", "-c", SnmpPdu::COMMUNITY])
        .args(["-t", "1", "-r", "1"])
        .args(["-Oqv"]) // the value only
        .arg(format!("{LOOPBACK}:{port}"))
        .arg(oid))?;
    Ok(output.trim().trim_matches('"').to_string())
}

/// What one agent run did.
pub struct AgentRun {
    pub exit_code: i32,
    /// stdout and stderr.
    pub output: String,
    pub took: Duration,
}

/// Run `agent` with no arguments and `options` on stdin, one `key=value` a line.
pub fn run_agent(agent: &Path, options: &[(&str, &str)]) -> AgentRun {
    let input: String = options
        .iter()
        .map(|(key, value)| format!("{key}={value}\n"))
        .collect();
    let started = Instant::now();
    let mut child = Command::new(agent)
        // fence_ipmilan imports the deprecated `pipes` module; keep its output to the point.
        .env("PYTHONWARNINGS", "ignore::DeprecationWarning")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the fence agent");
    child
        .stdin
        .take()
        .expect("the agent's stdin")
        .write_all(input.as_bytes())
        .expect("write the agent's options");
    let output = child.wait_with_output().expect("wait for the fence agent");
    AgentRun {
        exit_code: output.status.code().expect("the agent exited, not killed"),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
        took: started.elapsed(),
    }
}
