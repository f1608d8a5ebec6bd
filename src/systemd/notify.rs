//! The service manager's side channel (sd_notify(3), sd_listen_fds(3)), spoken directly:
//! readiness (`READY=1`), a status line for `systemctl status` (`STATUS=`), the watchdog
//! (`WATCHDOG=1`), and the file descriptor store (`FDSTORE=1`, `FDSTOREREMOVE=1`), which
//! keeps logind's delay lock open in systemd while the agent restarts and hands it back
//! through `LISTEN_FDS` when the agent starts again.
//!
//! Outside systemd (a DaemonSet, a shell) there is no `NOTIFY_SOCKET`, and every call is a
//! no-op. A message that cannot be sent is logged once per kind of failure; it never stops
//! the agent, which protects its node with or without a service manager.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::socket::{
    AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, UnixAddr, sendmsg, socket,
};

/// The first descriptor a service manager passes (sd_listen_fds(3)).
const FIRST_PASSED_FD: RawFd = 3;
/// How long a message may wait for room in the service manager's socket.
const SEND_TIMEOUT_MICROS: nix::libc::suseconds_t = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("NOTIFY_SOCKET={0:?}: only a socket path or an abstract socket (@name) is supported")]
    UnsupportedSocket(String),
    #[error("WATCHDOG_USEC={0:?} is not a positive number of microseconds")]
    WatchdogPeriod(String),
    #[error("LISTEN_FDS={0:?} is not a number of descriptors")]
    ListenFds(String),
    #[error("FDNAME {0:?}: a stored descriptor's name is 1-255 printable ASCII characters, no ':'")]
    FdName(String),
    #[error("telling the service manager {what}: {error}")]
    Send { what: String, error: std::io::Error },
}

/// Where `NOTIFY_SOCKET` points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifyTarget {
    Path(PathBuf),
    /// A Linux abstract socket, written `@name` (the `@` stands for the leading NUL).
    Abstract(Vec<u8>),
}

impl NotifyTarget {
    pub fn parse(value: &str) -> Result<NotifyTarget, NotifyError> {
        if let Some(name) = value.strip_prefix('@')
            && !name.is_empty()
        {
            return Ok(NotifyTarget::Abstract(name.as_bytes().to_vec()));
        }
        if value.starts_with('/') {
            return Ok(NotifyTarget::Path(PathBuf::from(value)));
        }
        // vsock: and relative paths are for virtual machines and odd set-ups, not a node
        // agent's unit.
        Err(NotifyError::UnsupportedSocket(value.to_string()))
    }

    fn address(&self) -> nix::Result<UnixAddr> {
        match self {
            NotifyTarget::Path(path) => UnixAddr::new(path.as_path()),
            NotifyTarget::Abstract(name) => UnixAddr::new_abstract(name),
        }
    }
}

/// How often to ping, from `WATCHDOG_USEC` and `WATCHDOG_PID`: half the period systemd
/// allows, as sd_watchdog_enabled(3) advises; `None` when the watchdog is off or meant
/// for another process.
pub fn watchdog_ping_interval(
    usec: Option<&str>,
    pid: Option<&str>,
    own_pid: u32,
) -> Result<Option<Duration>, NotifyError> {
    let Some(usec) = usec else {
        return Ok(None);
    };
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok() != Some(own_pid)
    {
        return Ok(None);
    }
    match usec.trim().parse::<u64>() {
        Ok(period) if period > 0 => Ok(Some(Duration::from_micros(period) / 2)),
        _ => Err(NotifyError::WatchdogPeriod(usec.to_string())),
    }
}

/// The descriptors passed to this process (sd_listen_fds_with_names(3)): `(fd, name)`
/// from fd 3 on, or none when `LISTEN_PID` names another process (the variables were
/// inherited). A name missing from `LISTEN_FDNAMES` reads `unknown`, as in libsystemd.
pub fn passed_descriptors(
    listen_pid: Option<&str>,
    listen_fds: Option<&str>,
    names: Option<&str>,
    own_pid: u32,
) -> Result<Vec<(RawFd, String)>, NotifyError> {
    let (Some(pid), Some(count)) = (listen_pid, listen_fds) else {
        return Ok(Vec::new());
    };
    if pid.trim().parse::<u32>().ok() != Some(own_pid) {
        return Ok(Vec::new());
    }
    let count: RawFd = count
        .trim()
        .parse()
        .ok()
        .filter(|count| (0..=4096).contains(count))
        .ok_or_else(|| NotifyError::ListenFds(count.to_string()))?;
    let mut names = names.unwrap_or_default().split(':');
    Ok((0..count)
        .map(|index| {
            let name = names.next().filter(|name| !name.is_empty());
            (
                FIRST_PASSED_FD + index,
                name.unwrap_or("unknown").to_string(),
            )
        })
        .collect())
}

/// A name systemd accepts for a stored descriptor.
pub fn valid_fd_name(name: &str) -> bool {
    (1..=255).contains(&name.len())
        && name
            .bytes()
            .all(|byte| byte.is_ascii_graphic() && byte != b':')
}

/// A descriptor systemd handed back from its store, with the name it was stored under.
#[derive(Debug)]
pub struct StoredFd {
    pub name: String,
    pub fd: OwnedFd,
}

/// The link to the service manager that started this process; inert when none did.
#[derive(Debug, Default)]
pub struct ServiceManagerLink {
    target: Option<NotifyTarget>,
    watchdog: Option<Duration>,
    /// Created on the first message and kept.
    socket: Mutex<Option<OwnedFd>>,
    /// Descriptors handed back at start and not yet claimed by their owner.
    passed: Mutex<Vec<StoredFd>>,
    /// Failures already logged, by kind, so a gone manager is not logged per ping.
    failing: Mutex<Option<String>>,
}

impl ServiceManagerLink {
    /// No service manager: every call does nothing.
    pub fn none() -> ServiceManagerLink {
        ServiceManagerLink::default()
    }

    /// Messages go to `target`, the watchdog is pinged every `watchdog` (tests; the
    /// binary uses [`ServiceManagerLink::from_environment`]).
    pub fn to(target: NotifyTarget, watchdog: Option<Duration>) -> ServiceManagerLink {
        ServiceManagerLink {
            target: Some(target),
            watchdog,
            ..ServiceManagerLink::default()
        }
    }

    /// What systemd set for this process: `NOTIFY_SOCKET`, `WATCHDOG_USEC`/`WATCHDOG_PID`
    /// and the stored descriptors it passed back (`LISTEN_FDS`, `LISTEN_PID`,
    /// `LISTEN_FDNAMES`), which are taken over here (close-on-exec, so no child inherits
    /// them). Call once, early, before anything else opens files; a later call gets no
    /// descriptors (they have an owner already). Bad values are logged and ignored.
    pub fn from_environment() -> ServiceManagerLink {
        static DESCRIPTORS_TAKEN: std::sync::atomic::AtomicBool =
            std::sync::atomic::AtomicBool::new(false);
        let var = |name: &str| std::env::var(name).ok();
        let own_pid = std::process::id();
        let target = var("NOTIFY_SOCKET").and_then(|value| {
            NotifyTarget::parse(&value)
                .map_err(|error| tracing::warn!(%error, "not talking to the service manager"))
                .ok()
        });
        let watchdog = watchdog_ping_interval(
            var("WATCHDOG_USEC").as_deref(),
            var("WATCHDOG_PID").as_deref(),
            own_pid,
        )
        .unwrap_or_else(|error| {
            tracing::warn!(%error, "the service manager's watchdog is not pinged");
            None
        });
        let first_call = !DESCRIPTORS_TAKEN.swap(true, std::sync::atomic::Ordering::SeqCst);
        let passed = match passed_descriptors(
            var("LISTEN_PID").as_deref(),
            var("LISTEN_FDS").as_deref(),
            var("LISTEN_FDNAMES").as_deref(),
            own_pid,
        ) {
            Ok(passed) => passed,
            Err(error) => {
                tracing::warn!(%error, "ignoring the descriptors the service manager passed");
                Vec::new()
            }
        };
        if !first_call && !passed.is_empty() {
            tracing::warn!("the passed descriptors were taken over already; not again");
        }
        let passed = passed
            .into_iter()
            .filter(|_| first_call)
            .filter_map(|(fd, name)| adopt(fd).map(|fd| StoredFd { name, fd }))
            .collect();
        ServiceManagerLink {
            target,
            watchdog,
            passed: Mutex::new(passed),
            ..ServiceManagerLink::default()
        }
    }

    /// A service manager listens.
    pub fn is_connected(&self) -> bool {
        self.target.is_some()
    }

    /// How often the watchdog wants a ping; `None` when it is off.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.target.as_ref().and(self.watchdog)
    }

    /// Startup is complete; `status` is shown by `systemctl status`.
    pub fn ready(&self, status: &str) {
        self.send_logged(
            "that the agent is ready",
            &format!("READY=1\nSTATUS={}", one_line(status)),
            &[],
        );
    }

    pub fn status(&self, status: &str) {
        self.send_logged("the status", &format!("STATUS={}", one_line(status)), &[]);
    }

    pub fn stopping(&self, status: &str) {
        self.send_logged(
            "that the agent is stopping",
            &format!("STOPPING=1\nSTATUS={}", one_line(status)),
            &[],
        );
    }

    pub fn ping_watchdog(&self) {
        if self.watchdog.is_some() {
            self.send_logged("the watchdog ping", "WATCHDOG=1", &[]);
        }
    }

    /// Keep a copy of `fd` in the service manager under `name`, so that it stays open
    /// while this process restarts and comes back through `LISTEN_FDS`. `Ok(false)` when
    /// no service manager listens.
    pub fn store_fd(&self, name: &str, fd: BorrowedFd<'_>) -> Result<bool, NotifyError> {
        if !valid_fd_name(name) {
            return Err(NotifyError::FdName(name.to_string()));
        }
        if self.target.is_none() {
            return Ok(false);
        }
        self.send(
            &format!("FDSTORE=1\nFDNAME={name}"),
            &[fd.as_raw_fd()],
            || format!("to store descriptor {name}"),
        )?;
        Ok(true)
    }

    /// Close the service manager's copies stored under `name`.
    pub fn remove_stored(&self, name: &str) -> Result<(), NotifyError> {
        if !valid_fd_name(name) {
            return Err(NotifyError::FdName(name.to_string()));
        }
        if self.target.is_none() {
            return Ok(());
        }
        self.send(&format!("FDSTOREREMOVE=1\nFDNAME={name}"), &[], || {
            format!("to remove stored descriptor {name}")
        })
    }

    /// The descriptors passed back at start whose names begin with `prefix`; each is
    /// handed out once.
    pub fn claim_passed(&self, prefix: &str) -> Vec<StoredFd> {
        let mut passed = lock(&self.passed);
        let (claimed, rest) = std::mem::take(&mut *passed)
            .into_iter()
            .partition(|stored| stored.name.starts_with(prefix));
        *passed = rest;
        claimed
    }

    /// Claim the descriptors under `prefix` and let them go: out of the store, closed
    /// here. For what was kept by a run that needed it and is not needed now.
    pub fn discard_passed(&self, prefix: &str) {
        for stored in self.claim_passed(prefix) {
            if let Err(error) = self.remove_stored(&stored.name) {
                tracing::warn!(%error, "a stored descriptor stays with the service manager");
            }
        }
    }

    fn send_logged(&self, what: &str, message: &str, fds: &[RawFd]) {
        if self.target.is_none() {
            return;
        }
        match self.send(message, fds, || what.to_string()) {
            Ok(()) => {
                if lock(&self.failing).take().is_some() {
                    tracing::info!("the service manager hears the agent again");
                }
            }
            Err(error) => {
                let text = error.to_string();
                let mut failing = lock(&self.failing);
                if failing.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %text, "the service manager did not get a message");
                    *failing = Some(text);
                }
            }
        }
    }

    fn send(
        &self,
        message: &str,
        fds: &[RawFd],
        what: impl Fn() -> String,
    ) -> Result<(), NotifyError> {
        let Some(target) = &self.target else {
            return Ok(());
        };
        let failed = |error: std::io::Error| NotifyError::Send {
            what: what(),
            error,
        };
        let address = target.address().map_err(|e| failed(e.into()))?;
        let mut socket_slot = lock(&self.socket);
        if socket_slot.is_none() {
            let created = socket(
                AddressFamily::Unix,
                SockType::Datagram,
                SockFlag::SOCK_CLOEXEC,
                None,
            )
            .map_err(|e| failed(e.into()))?;
            // A service manager too busy to read must not stall the caller (the runtime's
            // thread, the decision loop): a message it cannot take within this is lost,
            // and logged.
            nix::sys::socket::setsockopt(
                &created,
                nix::sys::socket::sockopt::SendTimeout,
                &nix::sys::time::TimeVal::new(0, SEND_TIMEOUT_MICROS),
            )
            .map_err(|e| failed(e.into()))?;
            *socket_slot = Some(created);
        }
        let Some(socket) = socket_slot.as_ref() else {
            return Ok(());
        };
        let rights = [ControlMessage::ScmRights(fds)];
        let control: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
        let sent = sendmsg(
            socket.as_raw_fd(),
            &[std::io::IoSlice::new(message.as_bytes())],
            control,
            MsgFlags::MSG_NOSIGNAL,
            Some(&address),
        )
        .map_err(|e| failed(e.into()))?;
        if sent != message.len() {
            return Err(failed(std::io::Error::other(format!(
                "sent {sent} of {} bytes",
                message.len()
            ))));
        }
        Ok(())
    }
}

/// Takes over a descriptor the service manager passed: it must be open, and is made
/// close-on-exec so that no child (a reclaim command) holds the lock after we let go.
fn adopt(fd: RawFd) -> Option<OwnedFd> {
    use nix::fcntl::{F_SETFD, FdFlag, fcntl};
    // SAFETY: F_GETFD only asks whether the number is an open descriptor.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        tracing::warn!(
            fd,
            "a descriptor the service manager passed is not open; ignored"
        );
        return None;
    }
    // SAFETY: descriptors 3 to 3+LISTEN_FDS-1 were passed to this process for it to own
    // (LISTEN_PID named it), the number is open, and nothing else in the process has
    // taken it: this runs once, at start.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    if let Err(error) = fcntl(&owned, F_SETFD(FdFlag::FD_CLOEXEC)) {
        tracing::warn!(fd, %error, "cannot mark a passed descriptor close-on-exec");
    }
    Some(owned)
}

/// Reads one message at the service manager's end of the socket, with the descriptors
/// it carried (up to 16): what systemd does with what [`ServiceManagerLink`] sends. For
/// tests, and for a tool standing in for systemd.
pub fn receive(socket: BorrowedFd<'_>) -> std::io::Result<(String, Vec<OwnedFd>)> {
    let mut buffer = [0u8; 4096];
    let mut control = nix::cmsg_space!([RawFd; 16]);
    let mut iov = [std::io::IoSliceMut::new(&mut buffer)];
    let message = nix::sys::socket::recvmsg::<UnixAddr>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut control),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for cmsg in message.cmsgs()? {
        if let nix::sys::socket::ControlMessageOwned::ScmRights(received) = cmsg {
            // SAFETY: the kernel has just installed these descriptors in this process,
            // and nothing else knows their numbers.
            fds.extend(
                received
                    .into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    let length = message.bytes;
    Ok((String::from_utf8_lossy(&buffer[..length]).into_owned(), fds))
}

fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::UnixDatagram;

    /// A service manager's socket in a temporary directory.
    struct Manager {
        _dir: tempfile::TempDir,
        socket: UnixDatagram,
        path: PathBuf,
    }

    impl Manager {
        fn new() -> Manager {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("notify");
            let socket = UnixDatagram::bind(&path).unwrap();
            socket
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            Manager {
                _dir: dir,
                socket,
                path,
            }
        }

        fn link(&self) -> ServiceManagerLink {
            ServiceManagerLink::to(
                NotifyTarget::Path(self.path.clone()),
                Some(Duration::from_secs(1)),
            )
        }

        /// One message and the descriptors it carried.
        fn receive(&self) -> (String, Vec<OwnedFd>) {
            receive(self.socket.as_fd()).unwrap()
        }
    }

    #[test]
    fn ready_status_watchdog_and_stopping_are_the_documented_messages() {
        let manager = Manager::new();
        let link = manager.link();
        link.ready("protecting the node\nsecond line");
        assert_eq!(
            manager.receive().0,
            "READY=1\nSTATUS=protecting the node second line"
        );
        link.status("draining");
        assert_eq!(manager.receive().0, "STATUS=draining");
        link.ping_watchdog();
        assert_eq!(manager.receive().0, "WATCHDOG=1");
        link.stopping("stopping");
        assert_eq!(manager.receive().0, "STOPPING=1\nSTATUS=stopping");
    }

    #[test]
    fn a_stored_descriptor_arrives_as_the_same_open_file() {
        let manager = Manager::new();
        let link = manager.link();
        let file = tempfile::tempfile().unwrap();
        assert!(link.store_fd("lock-1", file.as_fd()).unwrap());
        let (message, fds) = manager.receive();
        assert_eq!(message, "FDSTORE=1\nFDNAME=lock-1");
        assert_eq!(fds.len(), 1);
        let (ours, theirs) = (
            nix::sys::stat::fstat(file.as_fd()).unwrap(),
            nix::sys::stat::fstat(fds[0].as_fd()).unwrap(),
        );
        assert_eq!((ours.st_dev, ours.st_ino), (theirs.st_dev, theirs.st_ino));
        link.remove_stored("lock-1").unwrap();
        let (message, fds) = manager.receive();
        assert_eq!(message, "FDSTOREREMOVE=1\nFDNAME=lock-1");
        assert!(fds.is_empty());
    }

    #[test]
    fn abstract_sockets_are_reached_too() {
        let name = format!("nodekeeper-notify-test-{}", std::process::id());
        let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let socket = UnixDatagram::bind_addr(&address).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let link = ServiceManagerLink::to(NotifyTarget::parse(&format!("@{name}")).unwrap(), None);
        link.status("hello");
        let mut buffer = [0u8; 64];
        let length = socket.recv(&mut buffer).unwrap();
        assert_eq!(&buffer[..length], b"STATUS=hello");
    }

    #[test]
    fn without_a_service_manager_nothing_is_sent_and_nothing_fails() {
        let link = ServiceManagerLink::none();
        assert!(!link.is_connected());
        assert_eq!(link.watchdog_interval(), None);
        link.ready("x");
        link.ping_watchdog();
        let file = tempfile::tempfile().unwrap();
        assert!(!link.store_fd("lock-1", file.as_fd()).unwrap());
        assert!(link.remove_stored("lock-1").is_ok());
    }

    #[test]
    fn a_gone_manager_is_a_logged_failure_not_an_error() {
        let manager = Manager::new();
        let link = manager.link();
        drop(manager);
        link.ping_watchdog(); // logged, not panicking
        let file = tempfile::tempfile().unwrap();
        let error = link.store_fd("lock-1", file.as_fd()).unwrap_err();
        assert!(
            error.to_string().contains("to store descriptor lock-1"),
            "{error}"
        );
    }

    #[test]
    fn notify_socket_values() {
        assert_eq!(
            NotifyTarget::parse("/run/systemd/notify").unwrap(),
            NotifyTarget::Path(PathBuf::from("/run/systemd/notify"))
        );
        assert_eq!(
            NotifyTarget::parse("@sd-notify").unwrap(),
            NotifyTarget::Abstract(b"sd-notify".to_vec())
        );
        for bad in ["", "@", "relative/path", "vsock:2:1234"] {
            let error = NotifyTarget::parse(bad).unwrap_err();
            assert!(error.to_string().starts_with("NOTIFY_SOCKET="), "{error}");
        }
    }

    #[test]
    fn the_watchdog_is_pinged_at_half_its_period_and_only_by_its_process() {
        assert_eq!(
            watchdog_ping_interval(Some("30000000"), None, 7).unwrap(),
            Some(Duration::from_secs(15))
        );
        assert_eq!(
            watchdog_ping_interval(Some("3000000"), Some("7"), 7).unwrap(),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            watchdog_ping_interval(Some("3000000"), Some("8"), 7).unwrap(),
            None
        );
        assert_eq!(watchdog_ping_interval(None, Some("7"), 7).unwrap(), None);
        for bad in ["0", "-5", "soon"] {
            assert!(watchdog_ping_interval(Some(bad), None, 7).is_err(), "{bad}");
        }
    }

    #[test]
    fn passed_descriptors_start_at_three_with_their_names() {
        assert_eq!(
            passed_descriptors(Some("42"), Some("3"), Some("a:b"), 42).unwrap(),
            vec![
                (3, "a".to_string()),
                (4, "b".to_string()),
                (5, "unknown".to_string())
            ]
        );
        // Inherited from a parent that was passed them: not ours.
        assert!(
            passed_descriptors(Some("41"), Some("3"), None, 42)
                .unwrap()
                .is_empty()
        );
        assert!(
            passed_descriptors(None, Some("3"), None, 42)
                .unwrap()
                .is_empty()
        );
        assert!(passed_descriptors(Some("42"), Some("many"), None, 42).is_err());
    }

    #[test]
    fn descriptor_names_systemd_accepts() {
        assert!(valid_fd_name("nodekeeper-delay-lock.1234.1"));
        for bad in ["", "a:b", "with space", &"x".repeat(256)] {
            assert!(!valid_fd_name(bad), "{bad:?}");
        }
    }
}
