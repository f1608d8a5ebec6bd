//! The watchdog behind self-isolation, and the node reset. Ports with one real
//! implementation each: the Linux watchdog device (`/dev/watchdog`: a hardware timer,
//! or the kernel's `softdog`) and the `reboot(2)` system call. Tests use fakes: nothing
//! here may ever reset the machine a test runs on.
//!
//! Opening the device starts its timer; every pet restarts it; a node whose agent stops
//! petting is reset when it runs out. A clean close (the "magic" `V` written first)
//! stops it, where the driver allows; any other close (the agent crashed or was killed)
//! leaves it running, so the node is reset unless an agent opens it again in time.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A watchdog held open.
pub trait Watchdog: Send + 'static {
    /// Restarts its timer.
    fn pet(&mut self) -> Result<(), String>;
    /// Stops it and lets it go (a clean stop of the agent, which told the controller).
    fn disarm(self: Box<Self>) -> Result<(), String>;
    /// Its timeout, as the device took it.
    fn timeout(&self) -> Duration;
    /// The device and its driver, for the report and the log.
    fn describe(&self) -> String;
}

/// Resets the node. Called after the watchdog has stopped being petted, so a reset that
/// fails (or hangs) still ends in the watchdog's.
pub trait NodeReset: Send + Sync + 'static {
    fn reset(&self, why: &str);
}

/// `struct watchdog_info` of `<linux/watchdog.h>`.
#[repr(C)]
#[derive(Default)]
struct WatchdogInfo {
    options: u32,
    firmware_version: u32,
    identity: [u8; 32],
}

/// The driver honours the magic close character. Without it, the kernel stops the
/// watchdog on *any* close, a crashed agent's included, so it backs nothing.
const WDIOF_MAGICCLOSE: u32 = 0x0100;

nix::ioctl_read!(wdioc_getsupport, b'W', 0, WatchdogInfo);
nix::ioctl_read!(wdioc_keepalive, b'W', 5, libc::c_int);
nix::ioctl_readwrite!(wdioc_settimeout, b'W', 6, libc::c_int);
nix::ioctl_read!(wdioc_gettimeout, b'W', 7, libc::c_int);

/// A Linux watchdog device.
pub struct DeviceWatchdog {
    file: File,
    path: PathBuf,
    identity: String,
    timeout: Duration,
    /// The kernel never stops it (`nowayout`): not even a clean stop of the agent does.
    nowayout: bool,
}

/// Whether the watchdog at `path` runs with `nowayout` (its sysfs attribute; `/dev/watchdog`
/// is `watchdog0`). Unknown counts as not.
fn nowayout(path: &Path) -> bool {
    let name = match path.file_name().and_then(|name| name.to_str()) {
        Some("watchdog") => "watchdog0".to_string(),
        Some(name) => name.to_string(),
        None => return false,
    };
    std::fs::read_to_string(Path::new("/sys/class/watchdog").join(name).join("nowayout"))
        .is_ok_and(|value| value.trim() == "1")
}

impl DeviceWatchdog {
    /// Opens `path` (which starts its timer) and sets its timeout to `timeout` (whole
    /// seconds). The device may round the timeout; [`Watchdog::timeout`] tells what it
    /// took. A file that is not a watchdog, or a device that will not tell its timeout,
    /// is let go cleanly and refused.
    pub fn open(path: &Path, timeout: Duration) -> Result<DeviceWatchdog, String> {
        let named = |what: &str, error: &dyn std::fmt::Display| {
            format!("{}: {what}: {error}", path.display())
        };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| named("cannot open the watchdog", &e))?;
        let fd = file.as_raw_fd();
        let mut info = WatchdogInfo::default();
        // SAFETY: `fd` is open for the call, and `info` is the struct the ioctl fills.
        if let Err(error) = unsafe { wdioc_getsupport(fd, &mut info) } {
            // Not a watchdog (a regular file says ENOTTY). Nothing was started, but a
            // device that did start is stopped if it can be.
            let _ = (&file).write_all(b"V");
            return Err(named("not a watchdog device", &error));
        }
        let identity = String::from_utf8_lossy(&info.identity)
            .trim_end_matches('\0')
            .trim()
            .to_string();
        let nowayout = nowayout(path);
        // (With nowayout the kernel never stops it on a close, so it backs a crashed
        // agent all the same.)
        if info.options & WDIOF_MAGICCLOSE == 0 && !nowayout {
            let _ = (&file).write_all(b"V");
            return Err(named(
                "refused",
                &format!(
                    "its driver ({identity}) stops it whenever the device is closed, also when the agent crashes or is killed, so it would not reset a node whose agent died"
                ),
            ));
        }
        let mut seconds = libc::c_int::try_from(timeout.as_secs().max(1)).unwrap_or(60);
        // SAFETY: as above; the kernel reads and writes one int.
        if let Err(error) = unsafe { wdioc_settimeout(fd, &mut seconds) } {
            tracing::warn!(device = %path.display(), %error, "the watchdog's timeout cannot be set; using the one it has");
        }
        let mut current: libc::c_int = 0;
        // SAFETY: as above.
        let taken = unsafe { wdioc_gettimeout(fd, &mut current) };
        let timeout = match taken {
            Ok(_) if current > 0 => Duration::from_secs(current as u64),
            _ => {
                let _ = (&file).write_all(b"V");
                return Err(named(
                    "the watchdog does not tell its timeout",
                    &taken.map_or_else(|e| e.to_string(), |_| format!("{current}s")),
                ));
            }
        };
        Ok(DeviceWatchdog {
            file,
            path: path.to_path_buf(),
            identity,
            timeout,
            nowayout,
        })
    }
}

impl Watchdog for DeviceWatchdog {
    fn pet(&mut self) -> Result<(), String> {
        let mut ignored: libc::c_int = 0;
        // SAFETY: the file is open; the kernel ignores the argument.
        match unsafe { wdioc_keepalive(self.file.as_raw_fd(), &mut ignored) } {
            Ok(_) => Ok(()),
            // Every driver takes a write as a pet.
            Err(_) => self
                .file
                .write_all(b"\0")
                .map_err(|e| format!("{}: cannot pet the watchdog: {e}", self.path.display())),
        }
    }

    fn disarm(self: Box<Self>) -> Result<(), String> {
        let this = *self;
        let mut file = this.file;
        file.write_all(b"V")
            .map_err(|e| format!("{}: cannot stop the watchdog: {e}", this.path.display()))?;
        drop(file);
        if this.nowayout {
            Err(format!(
                "{}: the watchdog runs with nowayout and cannot be stopped; it resets the node unless an agent opens it again",
                this.path.display()
            ))
        } else {
            Ok(())
        }
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn describe(&self) -> String {
        if self.identity.is_empty() {
            self.path.display().to_string()
        } else {
            format!("{} ({})", self.path.display(), self.identity)
        }
    }
}

/// The real reset: the file systems synced (for at most [`SYNC_WAIT`], since a dead NFS
/// mount can hang a sync for ever), then `reboot(2)`, at once and without the service
/// manager (which may be what hangs).
pub struct RebootNode;

/// How long a reset waits for the sync.
pub const SYNC_WAIT: Duration = Duration::from_secs(5);

impl NodeReset for RebootNode {
    fn reset(&self, why: &str) {
        tracing::error!(%why, "resetting the node");
        let (done, synced) = std::sync::mpsc::channel();
        let _ = std::thread::Builder::new()
            .name("nodekeeper-sync".to_string())
            .spawn(move || {
                nix::unistd::sync();
                let _ = done.send(());
            });
        if synced.recv_timeout(SYNC_WAIT).is_err() {
            tracing::warn!("the file systems did not sync within {SYNC_WAIT:?}; resetting anyway");
        }
        let Err(error) = nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_AUTOBOOT);
        tracing::error!(%error, "reboot(2) failed; the watchdog, no longer petted, resets the node");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_a_watchdog_is_refused_naming_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("watchdog");
        std::fs::write(&path, "").expect("write");
        let error = DeviceWatchdog::open(&path, Duration::from_secs(30))
            .err()
            .expect("a regular file is no watchdog");
        assert!(
            error.contains(&path.display().to_string()) && error.contains("not a watchdog device"),
            "{error}"
        );
        let missing = dir.path().join("missing");
        let error = DeviceWatchdog::open(&missing, Duration::from_secs(30))
            .err()
            .expect("no such device");
        assert!(error.contains("cannot open the watchdog"), "{error}");
    }
}
