//! systemd's manager over D-Bus: the calls nodekeeper makes to units (a signal to
//! logind after its drop-in changed; stopping, masking and starting the kubelet when the
//! node isolates itself). One connection type for the system bus or a test's bus.

use std::future::Future;
use std::path::{Path, PathBuf};

use zbus::proxy::CacheProperties;

pub mod notify;

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1",
    gen_blocking = false
)]
pub trait SystemdManager {
    fn kill_unit(&self, name: &str, whom: &str, signal: i32) -> zbus::Result<()>;

    /// Loads the unit if it is not loaded (a unit that does not exist loads as
    /// `not-found`) and returns its object path.
    fn load_unit(&self, name: &str) -> zbus::Result<zbus::zvariant::OwnedObjectPath>;

    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<zbus::zvariant::OwnedObjectPath>;

    fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<zbus::zvariant::OwnedObjectPath>;

    /// Reloads the unit files (a mask takes effect only then).
    fn reload(&self) -> zbus::Result<()>;
}

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Unit",
    default_service = "org.freedesktop.systemd1",
    gen_blocking = false
)]
pub trait SystemdUnit {
    #[zbus(property)]
    fn active_state(&self) -> zbus::Result<String>;

    #[zbus(property)]
    fn load_state(&self) -> zbus::Result<String>;

    #[zbus(property)]
    fn sub_state(&self) -> zbus::Result<String>;
}

/// Which bus to talk to. `System` honours `DBUS_SYSTEM_BUS_ADDRESS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BusAddress {
    System,
    Address(String),
}

impl BusAddress {
    /// The configured address, or the system bus.
    pub fn from_config(address: Option<&str>) -> BusAddress {
        address.map_or(BusAddress::System, |a| BusAddress::Address(a.to_string()))
    }

    /// Connects; an error comes with the bus's name.
    pub async fn connect(&self) -> Result<zbus::Connection, (String, zbus::Error)> {
        let builder = match self {
            BusAddress::System => zbus::connection::Builder::system(),
            BusAddress::Address(address) => zbus::connection::Builder::address(address.as_str()),
        };
        let builder = builder.map_err(|error| (self.to_string(), error))?;
        builder
            .build()
            .await
            .map_err(|error| (self.to_string(), error))
    }
}

impl std::fmt::Display for BusAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BusAddress::System => f.write_str("system bus"),
            BusAddress::Address(address) => write!(f, "bus at {address}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    #[error("cannot connect to systemd on the D-Bus {bus}: {error}")]
    Connect {
        bus: String,
        error: Box<zbus::Error>,
    },
    #[error("systemd {what} failed: {error}")]
    Call {
        what: String,
        error: Box<zbus::Error>,
    },
    #[error("{path}: {error}")]
    File { path: String, error: std::io::Error },
}

/// Where a runtime mask goes: the runtime unit directory systemd reads first, before
/// `/etc/systemd/system`. `systemctl mask --runtime` writes to `/run/systemd/system`,
/// which a unit file in `/etc/systemd/system` overrides, and kubelet units live there on
/// many nodes. Like every runtime mask it is gone at the next boot.
pub const RUNTIME_CONTROL_DIR: &str = "/run/systemd/system.control";

/// A unit's state as systemd reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitState {
    /// `loaded`, `not-found`, `masked`, `error`, ...
    pub load: String,
    /// `active`, `inactive`, `failed`, `activating`, `deactivating`, ...
    pub active: String,
}

impl UnitState {
    /// Nothing of the unit runs.
    pub fn is_stopped(&self) -> bool {
        matches!(self.active.as_str(), "inactive" | "failed")
    }

    /// The unit cannot be started (until it is unmasked, or the boot ends for a runtime
    /// mask).
    pub fn is_masked(&self) -> bool {
        self.load == "masked"
    }

    /// systemd has no such unit.
    pub fn is_missing(&self) -> bool {
        self.load == "not-found"
    }
}

impl std::fmt::Display for UnitState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}, {}", self.active, self.load)
    }
}

/// What isolating a node asks of its service manager (systemd; a fake in unit tests).
pub trait ServiceManager: Send + Sync {
    fn unit_state(
        &self,
        unit: &str,
    ) -> impl Future<Output = Result<UnitState, SystemdError>> + Send;
    /// Masks the unit for this boot (in [`RUNTIME_CONTROL_DIR`]) and reloads, so nothing
    /// can start it.
    fn mask(&self, unit: &str) -> impl Future<Output = Result<(), SystemdError>> + Send;
    /// Removes the runtime mask and reloads.
    fn unmask(&self, unit: &str) -> impl Future<Output = Result<(), SystemdError>> + Send;
    /// Queues a stop job; returns once it is queued.
    fn stop(&self, unit: &str) -> impl Future<Output = Result<(), SystemdError>> + Send;
    /// Queues a start job; returns once it is queued.
    fn start(&self, unit: &str) -> impl Future<Output = Result<(), SystemdError>> + Send;
    /// Sends `signal` to every process of the unit.
    fn kill(
        &self,
        unit: &str,
        signal: i32,
    ) -> impl Future<Output = Result<(), SystemdError>> + Send;
}

/// systemd on a D-Bus connection.
#[derive(Clone)]
pub struct Systemd {
    connection: zbus::Connection,
    manager: SystemdManagerProxy<'static>,
    /// Where runtime masks are made ([`RUNTIME_CONTROL_DIR`]; a test's directory).
    control_dir: PathBuf,
}

impl Systemd {
    pub async fn connect(bus: &BusAddress) -> Result<Systemd, SystemdError> {
        let connection = bus
            .connect()
            .await
            .map_err(|(bus, error)| SystemdError::Connect {
                bus,
                error: Box::new(error),
            })?;
        Systemd::on(connection).await
    }

    /// systemd on an existing connection.
    pub async fn on(connection: zbus::Connection) -> Result<Systemd, SystemdError> {
        let manager = SystemdManagerProxy::new(&connection)
            .await
            .map_err(|error| call("the manager proxy", error))?;
        Ok(Systemd {
            connection,
            manager,
            control_dir: PathBuf::from(RUNTIME_CONTROL_DIR),
        })
    }

    fn mask_path(&self, unit: &str) -> PathBuf {
        self.control_dir.join(unit)
    }

    async fn reload(&self) -> Result<(), SystemdError> {
        self.manager
            .reload()
            .await
            .map_err(|error| call("Reload", error))
    }
}

fn call(what: impl Into<String>, error: zbus::Error) -> SystemdError {
    SystemdError::Call {
        what: what.into(),
        error: Box::new(error),
    }
}

impl ServiceManager for Systemd {
    async fn unit_state(&self, unit: &str) -> Result<UnitState, SystemdError> {
        let path = self
            .manager
            .load_unit(unit)
            .await
            .map_err(|error| call(format!("LoadUnit({unit})"), error))?;
        // Never cached: the state is what is being watched.
        let proxy = SystemdUnitProxy::builder(&self.connection)
            .path(path)
            .map_err(|error| call(format!("the proxy of {unit}"), error))?
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|error| call(format!("the proxy of {unit}"), error))?;
        let load = proxy
            .load_state()
            .await
            .map_err(|error| call(format!("{unit} LoadState"), error))?;
        let active = proxy
            .active_state()
            .await
            .map_err(|error| call(format!("{unit} ActiveState"), error))?;
        Ok(UnitState { load, active })
    }

    async fn mask(&self, unit: &str) -> Result<(), SystemdError> {
        let path = self.mask_path(unit);
        make_mask(&path).map_err(|error| SystemdError::File {
            path: path.display().to_string(),
            error,
        })?;
        self.reload().await
    }

    async fn unmask(&self, unit: &str) -> Result<(), SystemdError> {
        let path = self.mask_path(unit);
        remove_mask(&path).map_err(|error| SystemdError::File {
            path: path.display().to_string(),
            error,
        })?;
        self.reload().await
    }

    async fn stop(&self, unit: &str) -> Result<(), SystemdError> {
        self.manager
            .stop_unit(unit, "replace")
            .await
            .map(drop)
            .map_err(|error| call(format!("StopUnit({unit})"), error))
    }

    async fn start(&self, unit: &str) -> Result<(), SystemdError> {
        self.manager
            .start_unit(unit, "replace")
            .await
            .map(drop)
            .map_err(|error| call(format!("StartUnit({unit})"), error))
    }

    async fn kill(&self, unit: &str, signal: i32) -> Result<(), SystemdError> {
        self.manager
            .kill_unit(unit, "all", signal)
            .await
            .map_err(|error| call(format!("KillUnit({unit}, all, {signal})"), error))
    }
}

/// systemd, connected at the first call (and again after a failed connection), so an
/// agent without a bus starts anyway and says why when it is asked to use it.
pub struct LazySystemd {
    bus: BusAddress,
    connected: tokio::sync::OnceCell<Systemd>,
}

impl LazySystemd {
    pub fn new(bus: BusAddress) -> LazySystemd {
        LazySystemd {
            bus,
            connected: tokio::sync::OnceCell::new(),
        }
    }

    async fn get(&self) -> Result<&Systemd, SystemdError> {
        self.connected
            .get_or_try_init(|| Systemd::connect(&self.bus))
            .await
    }
}

impl ServiceManager for LazySystemd {
    async fn unit_state(&self, unit: &str) -> Result<UnitState, SystemdError> {
        self.get().await?.unit_state(unit).await
    }

    async fn mask(&self, unit: &str) -> Result<(), SystemdError> {
        self.get().await?.mask(unit).await
    }

    async fn unmask(&self, unit: &str) -> Result<(), SystemdError> {
        self.get().await?.unmask(unit).await
    }

    async fn stop(&self, unit: &str) -> Result<(), SystemdError> {
        self.get().await?.stop(unit).await
    }

    async fn start(&self, unit: &str) -> Result<(), SystemdError> {
        self.get().await?.start(unit).await
    }

    async fn kill(&self, unit: &str, signal: i32) -> Result<(), SystemdError> {
        self.get().await?.kill(unit, signal).await
    }
}

/// A mask: a symlink to /dev/null in place of the unit file. One already there is
/// kept; anything else there is not ours to replace.
fn make_mask(path: &Path) -> std::io::Result<()> {
    if is_mask(path) {
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::os::unix::fs::symlink("/dev/null", path)
}

/// Removes the mask made by [`make_mask`], and nothing else.
fn remove_mask(path: &Path) -> std::io::Result<()> {
    if !is_mask(path) {
        return Ok(());
    }
    std::fs::remove_file(path)
}

fn is_mask(path: &Path) -> bool {
    std::fs::read_link(path).is_ok_and(|target| target == Path::new("/dev/null"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_is_a_symlink_to_dev_null_made_once_and_removed_only_when_it_is_one() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mask = dir.path().join("system.control/kubelet.service");
        make_mask(&mask).expect("masked");
        make_mask(&mask).expect("masked again: nothing to do");
        assert!(is_mask(&mask));
        remove_mask(&mask).expect("unmasked");
        assert!(!mask.exists());
        remove_mask(&mask).expect("no mask: nothing to do");
        // A unit file someone put there is neither replaced nor removed.
        std::fs::write(&mask, "[Service]\n").expect("a file");
        assert!(make_mask(&mask).is_err());
        remove_mask(&mask).expect("left alone");
        assert!(mask.exists());
    }

    fn state(load: &str, active: &str) -> UnitState {
        UnitState {
            load: load.to_string(),
            active: active.to_string(),
        }
    }

    #[test]
    fn a_unit_is_stopped_when_inactive_or_failed_and_held_down_only_when_masked() {
        assert!(state("masked", "inactive").is_stopped());
        assert!(state("loaded", "failed").is_stopped());
        assert!(!state("masked", "deactivating").is_stopped());
        assert!(!state("loaded", "active").is_stopped());
        assert!(state("masked", "inactive").is_masked());
        assert!(!state("loaded", "inactive").is_masked());
        assert!(state("not-found", "inactive").is_missing());
    }
}
