//! A private dbus-daemon and a fake logind/systemd written with zbus, shared by the
//! D-Bus tests and the latency benchmark.
#![allow(dead_code)]

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::poll::Wait;

// ---------------------------------------------------------------- private bus

/// A dbus-daemon this test started, stopped by its PID.
pub struct PrivateBus {
    dir: PathBuf,
    socket: PathBuf,
    daemon: Option<Child>,
}

impl PrivateBus {
    /// Start a private bus in `dir`; `Err` when no dbus-daemon can run here.
    pub fn start(dir: &Path) -> Result<PrivateBus, String> {
        match Command::new("dbus-daemon").arg("--version").output() {
            Ok(output) if output.status.success() => {}
            Ok(output) => return Err(format!("dbus-daemon --version failed: {}", output.status)),
            Err(error) => {
                return Err(format!(
                    "dbus-daemon cannot run ({error}; apt-get install -y dbus)"
                ));
            }
        }
        let socket = dir.join("bus.sock");
        let config = dir.join("bus.conf");
        std::fs::write(
            &config,
            format!(
                r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>custom</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_type="method_return"/>
    <allow send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="signal"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
  </policy>
</busconfig>
"#,
                socket.display()
            ),
        )
        .unwrap();
        let mut bus = PrivateBus {
            dir: dir.to_path_buf(),
            socket,
            daemon: None,
        };
        bus.restart();
        Ok(bus)
    }

    pub fn address(&self) -> String {
        format!("unix:path={}", self.socket.display())
    }

    pub fn restart(&mut self) {
        self.stop();
        let _ = std::fs::remove_file(&self.socket);
        let child = Command::new("dbus-daemon")
            .arg(format!(
                "--config-file={}",
                self.dir.join("bus.conf").display()
            ))
            .arg("--nofork")
            .arg("--nopidfile")
            .stdout(Stdio::null())
            .spawn()
            .expect("start dbus-daemon");
        self.daemon = Some(child);
        // The socket file appears at bind(), before listen(): wait until it accepts.
        wait_for("the bus socket to accept connections", || {
            std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
        });
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.daemon.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateBus {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How long a wait on the bus may take.
const BUS_WAIT: Duration = Duration::from_secs(20);

/// Blocks until `done` holds, checking every 5 ms, at most [`BUS_WAIT`].
pub fn wait_for(what: &str, done: impl FnMut() -> bool) {
    Wait::for_(what, BUS_WAIT)
        .every(Duration::from_millis(5))
        .until_true(done)
}

/// Waits until `done` holds, checking every 2 ms, at most [`BUS_WAIT`].
pub async fn wait_until(what: &str, done: impl FnMut() -> bool) {
    Wait::for_(what, BUS_WAIT)
        .every(Duration::from_millis(2))
        .eventually_true(done)
        .await
}

// ---------------------------------------------------------------- fake logind

pub struct HeldLock {
    pub what: String,
    pub who: String,
    pub mode: String,
    read_end: OwnedFd,
}

impl HeldLock {
    /// The lock is held while some process keeps the write end open.
    pub fn released(&self) -> bool {
        let mut fds = [PollFd::new(self.read_end.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::ZERO).unwrap();
        fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLHUP))
    }
}

#[derive(Default)]
pub struct FakeLogindState {
    pub delay_usec: u64,
    pub preparing: bool,
    pub locks: Vec<HeldLock>,
    pub kill_unit_calls: Vec<(String, String, i32)>,
    /// On SIGHUP, read InhibitDelayMaxSec from here (as logind reads its drop-ins).
    pub dropin: Option<PathBuf>,
}

impl FakeLogindState {
    pub fn held(&self) -> usize {
        self.locks.iter().filter(|l| !l.released()).count()
    }
}

pub type Shared = Arc<Mutex<FakeLogindState>>;

pub struct FakeLogin(Shared);

#[zbus::interface(name = "org.freedesktop.login1.Manager")]
impl FakeLogin {
    fn inhibit(
        &self,
        what: String,
        who: String,
        _why: String,
        mode: String,
    ) -> zbus::fdo::Result<zbus::zvariant::OwnedFd> {
        let (read_end, write_end) =
            nix::unistd::pipe().map_err(|e| zbus::fdo::Error::Failed(e.to_string()))?;
        self.0.lock().unwrap().locks.push(HeldLock {
            what,
            who,
            mode,
            read_end,
        });
        Ok(write_end.into())
    }

    #[zbus(property, name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> u64 {
        self.0.lock().unwrap().delay_usec
    }

    #[zbus(property)]
    fn preparing_for_shutdown(&self) -> bool {
        self.0.lock().unwrap().preparing
    }

    #[zbus(signal)]
    async fn prepare_for_shutdown(
        emitter: &zbus::object_server::SignalEmitter<'_>,
        start: bool,
    ) -> zbus::Result<()>;
}

pub struct FakeSystemd(Shared);

#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl FakeSystemd {
    fn kill_unit(&self, name: String, whom: String, signal: i32) {
        let mut state = self.0.lock().unwrap();
        state.kill_unit_calls.push((name, whom, signal));
        let reloaded = state
            .dropin
            .as_ref()
            .and_then(|path| std::fs::read_to_string(path).ok())
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("InhibitDelayMaxSec="))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            });
        if let Some(seconds) = reloaded {
            state.delay_usec = seconds * 1_000_000;
        }
    }
}

pub struct FakeLogind {
    pub shared: Shared,
    pub connection: zbus::Connection,
}

impl FakeLogind {
    pub async fn serve(bus: &PrivateBus, shared: Shared) -> FakeLogind {
        let connection = zbus::connection::Builder::address(bus.address().as_str())
            .unwrap()
            .name("org.freedesktop.login1")
            .unwrap()
            .name("org.freedesktop.systemd1")
            .unwrap()
            .serve_at("/org/freedesktop/login1", FakeLogin(Arc::clone(&shared)))
            .unwrap()
            .serve_at(
                "/org/freedesktop/systemd1",
                FakeSystemd(Arc::clone(&shared)),
            )
            .unwrap()
            .build()
            .await
            .expect("fake logind on the private bus");
        FakeLogind { shared, connection }
    }

    pub async fn announce(&self, start: bool) -> Instant {
        self.shared.lock().unwrap().preparing = start;
        let iface = self
            .connection
            .object_server()
            .interface::<_, FakeLogin>("/org/freedesktop/login1")
            .await
            .unwrap();
        let sent = Instant::now();
        FakeLogin::prepare_for_shutdown(iface.signal_emitter(), start)
            .await
            .unwrap();
        sent
    }

    pub fn held(&self) -> usize {
        self.shared.lock().unwrap().held()
    }

    /// Blocks (the calling thread, not a runtime's) until no delay lock is held: the
    /// drain released it. Panics after 10 s.
    pub fn wait_for_release(&self) {
        Wait::for_(
            "the drain to release the delay lock",
            Duration::from_secs(10),
        )
        .every(Duration::from_millis(10))
        .until_true(|| self.held() == 0)
    }

    pub fn inhibit_calls(&self) -> usize {
        self.shared.lock().unwrap().locks.len()
    }
}

pub fn fake_state(delay_seconds: u64) -> Shared {
    Arc::new(Mutex::new(FakeLogindState {
        delay_usec: delay_seconds * 1_000_000,
        ..FakeLogindState::default()
    }))
}
