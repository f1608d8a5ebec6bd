//! logind and systemd over D-Bus: the delay inhibitor, the PrepareForShutdown signal, the
//! InhibitDelayMaxUSec limit, and reloading logind after writing a drop-in.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use zbus::proxy::CacheProperties;

#[zbus::proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1",
    gen_blocking = false
)]
pub trait LoginManager {
    fn inhibit(
        &self,
        what: &str,
        who: &str,
        why: &str,
        mode: &str,
    ) -> zbus::Result<zbus::zvariant::OwnedFd>;

    #[zbus(property, name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> zbus::Result<u64>;

    #[zbus(property)]
    fn preparing_for_shutdown(&self) -> zbus::Result<bool>;

    #[zbus(signal)]
    fn prepare_for_shutdown(&self, start: bool) -> zbus::Result<()>;
}

pub const INHIBITOR_WHO: &str = "nodekeeper";
pub const INHIBITOR_WHY: &str = "nodekeeper drains workloads before the node shuts down";
pub const DEFAULT_DROPIN_PATH: &str = "/etc/systemd/logind.conf.d/99-nodekeeper.conf";
const LOGIND_UNIT: &str = "systemd-logind.service";

pub use crate::systemd::BusAddress;
use crate::systemd::{ServiceManager, Systemd};

#[derive(Debug, thiserror::Error)]
pub enum LogindError {
    #[error("cannot connect to the D-Bus {bus}: {error}")]
    Connect {
        bus: String,
        error: Box<zbus::Error>,
    },
    #[error("logind {what} failed: {error}")]
    Call {
        what: &'static str,
        error: Box<zbus::Error>,
    },
    #[error("reloading logind: {0}")]
    Systemd(#[from] crate::systemd::SystemdError),
    #[error("cannot write logind drop-in {path}: {error}")]
    DropIn { path: String, error: std::io::Error },
    #[error(
        "logind InhibitDelayMaxSec is still {current:?} after {attempts} reads, \
         below the {required:?} the shutdown phases need; another logind.conf.d drop-in \
         sorting after {dropin} may override it"
    )]
    DelayNotRaised {
        required: Duration,
        current: Duration,
        attempts: u32,
        dropin: String,
    },
}

/// A held delay inhibitor. Dropping it closes the fd, which releases the lock unless
/// another copy of the fd is open (the service manager's file descriptor store keeps one
/// across the agent's restarts).
#[derive(Debug)]
pub struct InhibitLock {
    fd: OwnedFd,
}

impl InhibitLock {
    /// A lock taken by an earlier run of the agent, handed back by the service manager.
    pub fn from_fd(fd: OwnedFd) -> InhibitLock {
        InhibitLock { fd }
    }

    /// Whether logind still holds the other end. An inhibitor is the write end of a pipe
    /// whose read end logind keeps; once logind lets go (it restarted while the agent
    /// was away), polling the write end reports an error. Anything but a pipe is no lock.
    pub fn is_live(&self) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use nix::sys::stat::{SFlag, fstat};
        let Ok(stat) = fstat(&self.fd) else {
            return false;
        };
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFIFO {
            return false;
        }
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::empty())];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(_) => !fds[0].revents().is_some_and(|events| {
                events.intersects(PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL)
            }),
            Err(_) => false,
        }
    }
}

impl AsFd for InhibitLock {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// One connection to the bus with the two proxies nodekeeper needs.
#[derive(Clone)]
pub struct Logind {
    connection: zbus::Connection,
    login: LoginManagerProxy<'static>,
}

impl Logind {
    pub async fn connect(bus: &BusAddress) -> Result<Logind, LogindError> {
        let connection = bus
            .connect()
            .await
            .map_err(|(bus, error)| LogindError::Connect {
                bus,
                error: Box::new(error),
            })?;
        let connect_error = |error| LogindError::Connect {
            bus: bus.to_string(),
            error: Box::new(error),
        };
        // Never cache: InhibitDelayMaxUSec changes on reload without a change signal.
        let login = LoginManagerProxy::builder(&connection)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(connect_error)?;
        Ok(Logind { connection, login })
    }

    pub fn connection(&self) -> &zbus::Connection {
        &self.connection
    }

    pub async fn inhibit_delay_max(&self) -> Result<Duration, LogindError> {
        let usec =
            self.login
                .inhibit_delay_max_usec()
                .await
                .map_err(|error| LogindError::Call {
                    what: "InhibitDelayMaxUSec",
                    error: Box::new(error),
                })?;
        Ok(Duration::from_micros(usec))
    }

    pub async fn preparing_for_shutdown(&self) -> Result<bool, LogindError> {
        self.login
            .preparing_for_shutdown()
            .await
            .map_err(|error| LogindError::Call {
                what: "PreparingForShutdown",
                error: Box::new(error),
            })
    }

    pub async fn take_delay_lock(&self, why: &str) -> Result<InhibitLock, LogindError> {
        let fd = self
            .login
            .inhibit("shutdown", INHIBITOR_WHO, why, "delay")
            .await
            .map_err(|error| LogindError::Call {
                what: "Inhibit",
                error: Box::new(error),
            })?;
        Ok(InhibitLock { fd: fd.into() })
    }

    /// `PrepareForShutdown` arguments; the stream ends when the connection is lost.
    pub async fn prepare_for_shutdown_signals(
        &self,
    ) -> Result<PrepareForShutdownStream, LogindError> {
        self.login
            .receive_prepare_for_shutdown()
            .await
            .map_err(|error| LogindError::Call {
                what: "subscribing to PrepareForShutdown",
                error: Box::new(error),
            })
    }

    pub async fn reload_logind(&self) -> Result<(), LogindError> {
        let systemd = Systemd::on(self.connection.clone()).await?;
        systemd.kill(LOGIND_UNIT, libc::SIGHUP).await?;
        Ok(())
    }

    /// Make logind allow at least `required`: if its limit is lower, write the drop-in,
    /// reload logind and poll (bounded backoff) until the new limit is visible.
    pub async fn ensure_inhibit_delay(
        &self,
        required: Duration,
        dropin: &Path,
        backoff: &Backoff,
    ) -> Result<InhibitDelayReport, LogindError> {
        let before = self.inhibit_delay_max().await?;
        if before >= required {
            return Ok(InhibitDelayReport {
                before,
                after: before,
                dropin_written: None,
            });
        }
        write_dropin(dropin, required)?;
        self.reload_logind().await?;
        let mut current = before;
        for attempt in 1..=backoff.attempts {
            tokio::time::sleep(crate::backoff::doubling(
                backoff.initial,
                attempt,
                Duration::MAX,
            ))
            .await;
            current = self.inhibit_delay_max().await?;
            if current >= required {
                return Ok(InhibitDelayReport {
                    before,
                    after: current,
                    dropin_written: Some(dropin.to_path_buf()),
                });
            }
        }
        Err(LogindError::DelayNotRaised {
            required,
            current,
            attempts: backoff.attempts,
            dropin: dropin.display().to_string(),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InhibitDelayReport {
    pub before: Duration,
    pub after: Duration,
    pub dropin_written: Option<PathBuf>,
}

/// Polling after a reload: `initial`, doubled each time, `attempts` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub attempts: u32,
}

impl Default for Backoff {
    /// 0.1 s doubling over 6 reads: up to 6.3 s, a little more patience than the kubelet's 5.
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(100),
            attempts: 6,
        }
    }
}

/// The drop-in text for a limit of `delay`, rounded up to whole seconds.
pub fn dropin_contents(delay: Duration) -> String {
    let seconds = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
    format!(
        "# Written by nodekeeper: graceful node shutdown needs this long.\n[Login]\nInhibitDelayMaxSec={seconds}\n"
    )
}

pub fn write_dropin(path: &Path, delay: Duration) -> Result<(), LogindError> {
    crate::state_file::atomic_write(path, dropin_contents(delay).as_bytes()).map_err(|error| {
        LogindError::DropIn {
            path: path.display().to_string(),
            error,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropin_names_the_login_section_and_whole_seconds() {
        assert_eq!(
            dropin_contents(Duration::from_secs(370)),
            "# Written by nodekeeper: graceful node shutdown needs this long.\n[Login]\nInhibitDelayMaxSec=370\n"
        );
        assert!(dropin_contents(Duration::from_millis(1500)).ends_with("InhibitDelayMaxSec=2\n"));
    }

    #[test]
    fn a_lock_is_live_while_its_pipe_has_a_reader() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let lock = InhibitLock::from_fd(write);
        assert!(lock.is_live());
        drop(read); // logind let go
        assert!(!lock.is_live());
        let file = tempfile::tempfile().unwrap();
        assert!(
            !InhibitLock::from_fd(OwnedFd::from(file)).is_live(),
            "not a pipe"
        );
    }

    #[test]
    fn dropin_is_written_atomically_creating_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logind.conf.d/99-nodekeeper.conf");
        write_dropin(&path, Duration::from_secs(30)).unwrap();
        write_dropin(&path, Duration::from_secs(45)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with("InhibitDelayMaxSec=45\n"), "{text}");
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1
        );
    }
}
