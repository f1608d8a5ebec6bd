//! Network namespaces a test creates for itself, and veth links between them that the
//! test can cut: a real network partition, with nothing of the host's network touched.
//!
//! A test that uses them runs *in* one of them, the hub: [`Netns::enter`] moves the test's
//! thread there before the test builds its tokio runtime, so every thread of the runtime
//! and every process the test starts (the controller, `ipmi_sim`, the fence agents) shares
//! the hub's loopback as before. The nodes live in other namespaces and reach the hub only
//! over their links. Every namespace is named `nk<pid>-<role>` and deleted when dropped.

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

/// What a netns test needs, for `require!`.
pub const NETNS: &str = "network namespaces (root and iproute2)";

/// A named network namespace (`/run/netns/<name>`), with its loopback up.
pub struct Netns {
    name: String,
}

impl Netns {
    /// A new namespace for `role`; `Err` says why this machine cannot make one.
    pub fn create(role: &str) -> Result<Netns, String> {
        super::real::root()?;
        super::real::program("ip", "iproute2")?;
        remove_stale();
        // The process and a count: tests of one binary may run as threads of one process.
        static CREATED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let number = CREATED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("nk{}-{number}-{role}", std::process::id());
        ip(&["netns", "add", &name])?;
        let netns = Netns { name };
        netns.ip(&["link", "set", "lo", "up"])?;
        Ok(netns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`, as `systemd-nspawn --network-namespace-path` takes it.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// `ip ARGS` inside the namespace.
    pub fn ip(&self, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Gives the namespace's loopback `address` as well (a /32): a service address its
    /// peers reach over whichever link routes it.
    pub fn add_service_address(&self, address: &str) -> Result<(), String> {
        self.ip(&["addr", "add", &format!("{address}/32"), "dev", "lo"])
    }

    /// Moves the calling thread into the namespace. Threads it creates afterwards (a
    /// tokio runtime's) and processes it spawns are in the namespace too.
    pub fn enter(&self) -> Result<(), String> {
        enter_path(&self.path())
    }

    /// `command`, set to start inside the namespace (whatever namespace its parent is in).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(program);
        let file = std::fs::File::open(self.path())
            .unwrap_or_else(|error| panic!("{}: {error}", self.path().display()));
        // SAFETY: the closure runs in the forked child before exec and only calls setns,
        // which is async-signal-safe; `file` is moved into it and stays open until then.
        unsafe {
            command.pre_exec(move || join(&file));
        }
        command
    }

    /// Runs `work` on a thread of its own inside the namespace, and returns what it
    /// returned: a test reaching an address only the namespace can reach.
    pub fn run<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> T {
        let path = self.path();
        std::thread::spawn(move || {
            enter_path(&path).unwrap_or_else(|error| panic!("{error}"));
            work()
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Processes still inside keep the namespace alive; only the name goes.
        let _ = ip(&["netns", "delete", &self.name]);
    }
}

/// A veth pair between two namespaces, each end with an address of its own /30 subnet
/// `10.231.<subnet>.0/30`: the hub end `.1`, the node end `.2`; the node reaches the hub's
/// service addresses it is given through it. Cutting it takes the hub end down, as a
/// failed switch port does: the node's end loses its carrier, what either side sends is
/// lost, open connections hang rather than reset, and new ones time out or fail as
/// unreachable.
pub struct Link {
    hub_end: String,
    hub_name: String,
    pub hub_address: String,
    pub node_address: String,
}

impl Link {
    pub fn connect(
        hub: &Netns,
        node: &Netns,
        subnet: u8,
        services: &[&str],
    ) -> Result<Link, String> {
        let hub_end = format!("h{subnet}");
        let node_end = format!("n{subnet}");
        ip(&[
            "link",
            "add",
            &hub_end,
            "netns",
            hub.name(),
            "type",
            "veth",
            "peer",
            "name",
            &node_end,
            "netns",
            node.name(),
        ])?;
        let hub_address = format!("10.231.{subnet}.1");
        let node_address = format!("10.231.{subnet}.2");
        hub.ip(&["addr", "add", &format!("{hub_address}/30"), "dev", &hub_end])?;
        node.ip(&[
            "addr",
            "add",
            &format!("{node_address}/30"),
            "dev",
            &node_end,
        ])?;
        hub.ip(&["link", "set", &hub_end, "up"])?;
        node.ip(&["link", "set", &node_end, "up"])?;
        for service in services {
            node.ip(&[
                "route",
                "add",
                &format!("{service}/32"),
                "via",
                &hub_address,
            ])?;
        }
        Ok(Link {
            hub_end,
            hub_name: hub.name().to_string(),
            hub_address,
            node_address,
        })
    }

    /// The partition: nothing passes any more, in either direction.
    pub fn cut(&self) {
        self.set(false);
    }

    /// The link is back; connections that survived the cut resume.
    pub fn mend(&self) {
        self.set(true);
    }

    fn set(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.hub_name, "link", "set", &self.hub_end, state])
            .unwrap_or_else(|error| panic!("setting {} {state}: {error}", self.hub_end));
    }
}

/// Deletes the namespaces of test processes that are gone (killed before they could
/// delete their own): named `nk<pid>-...` by [`Netns::create`], with no process `pid`.
fn remove_stale() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("nk")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "delete", &name]);
        }
    }
}

/// Moves the calling thread into the network namespace at `path` (see [`Netns::enter`]).
pub fn enter_path(path: &std::path::Path) -> Result<(), String> {
    let file = std::fs::File::open(path).map_err(|error| format!("{}: {error}", path.display()))?;
    join(&file).map_err(|error| format!("setns into {}: {error}", path.display()))
}

/// Moves the calling thread into the network namespace `file` opens.
fn join(file: &std::fs::File) -> std::io::Result<()> {
    // SAFETY: setns only reads the descriptor, which `file` keeps open.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|error| format!("cannot run ip: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}
