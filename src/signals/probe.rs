//! Which kernel notification mechanisms this host offers, so the agent can react between
//! polls. Only probes; the notifiers themselves live elsewhere.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::error::FileProblem;
use super::fileio::with_file_text;
use super::host::Host;
use super::layout::{CgroupLayout, CgroupPaths};
use super::pressure::{PressureResource, PressureScope, parse_pressure, psi_unavailable};
use crate::config::HostPaths;

/// A trigger with a 2 s window: the only windows unprivileged processes may use (kernel
/// commit d82caa273565), so the probe needs no CAP_SYS_RESOURCE. The kernel overwrites the
/// last byte written with a NUL, so the text must carry its own terminator or the window
/// loses a digit and the write fails with EINVAL.
const UNPRIVILEGED_TRIGGER: &[u8] = b"some 150000 2000000\0";
/// A 1 s window, which only CAP_SYS_RESOURCE holders may register.
const PRIVILEGED_TRIGGER: &[u8] = b"some 100000 1000000\0";

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotificationSupport {
    /// PSI is enabled and a memory pressure trigger can be registered.
    pub psi: bool,
    /// cgroup v1 memory thresholds through `cgroup.event_control` and an eventfd.
    pub memcg_eventfd_v1: bool,
    /// cgroup v2 `memory.events` to watch with inotify or poll.
    pub memory_events_v2: bool,
    /// One sentence per mechanism explaining the verdict, for the operator.
    pub psi_detail: String,
    pub memcg_eventfd_v1_detail: String,
    pub memory_events_v2_detail: String,
}

/// Probe the host under `paths`, detecting its cgroup layout itself: for one-off commands
/// and tests. The agent probes the host it detected once, with [`probe_host`].
pub fn probe(paths: &HostPaths) -> NotificationSupport {
    probe_host(&Host::detect(paths))
}

pub fn probe_host(host: &Host) -> NotificationSupport {
    let paths = host.paths();
    let (psi, psi_detail) = probe_psi(&paths.proc_root);
    let cgroups = host.cgroups().map(|reader| reader.paths().clone());
    let (memcg_eventfd_v1, memcg_eventfd_v1_detail) = probe_memcg_eventfd(cgroups.as_ref());
    let (memory_events_v2, memory_events_v2_detail) =
        probe_memory_events(cgroups.as_ref(), paths.pods_cgroup.as_deref());
    NotificationSupport {
        psi,
        memcg_eventfd_v1,
        memory_events_v2,
        psi_detail,
        memcg_eventfd_v1_detail,
        memory_events_v2_detail,
    }
}

fn probe_psi(proc_root: &Path) -> (bool, String) {
    let path = proc_root.join("pressure/memory");
    let boot = boot_setting(proc_root);
    let read = with_file_text(&path, |text| {
        let mut readings = Vec::new();
        parse_pressure(
            text,
            PressureResource::Memory,
            &PressureScope::Node,
            &mut readings,
        )
    });
    if let Err(e) = read {
        let why = if psi_unavailable(&e.problem) {
            "PSI is not available: the kernel lacks CONFIG_PSI, or PSI is disabled at boot \
             (psi=0, or CONFIG_PSI_DEFAULT_DISABLED without psi=1)"
                .to_string()
        } else {
            format!("PSI file is unreadable: {}", e.problem)
        };
        return (false, format!("{why}; {} {boot}", path.display()));
    }
    if !is_procfs(&path) {
        return (
            true,
            format!(
                "{} is readable; trigger not tried because it is not on procfs {boot}",
                path.display()
            ),
        );
    }
    match try_trigger(&path, UNPRIVILEGED_TRIGGER) {
        Ok(()) => {
            let windows = match try_trigger(&path, PRIVILEGED_TRIGGER) {
                Ok(()) => "any window from 500ms to 10s",
                Err(_) => "windows in multiples of 2s only (no CAP_SYS_RESOURCE)",
            };
            (
                true,
                format!(
                    "memory triggers accepted by {}: {windows} {boot}",
                    path.display()
                ),
            )
        }
        Err(e) => (
            false,
            format!(
                "{} reads, but the kernel rejected a memory trigger ({e}) {boot}",
                path.display()
            ),
        ),
    }
}

/// The kernel's boot-time PSI switch, quoted for the operator: `psi=1` on the command line
/// overrides CONFIG_PSI_DEFAULT_DISABLED.
fn boot_setting(proc_root: &Path) -> String {
    let cmdline = with_file_text(&proc_root.join("cmdline"), |text| {
        Ok::<_, FileProblem>(
            text.split_ascii_whitespace()
                .find(|arg| arg.starts_with("psi="))
                .map(str::to_string),
        )
    });
    match cmdline {
        Ok(Some(arg)) => format!("(kernel command line has {arg})"),
        Ok(None) => "(no psi= on the kernel command line)".to_string(),
        Err(_) => "(kernel command line unreadable)".to_string(),
    }
}

/// Only a real PSI file accepts a trigger; writing one into a fake tree would overwrite
/// the fixture.
fn is_procfs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .map(|fs| fs.filesystem_type() == nix::sys::statfs::PROC_SUPER_MAGIC)
        .unwrap_or(false)
}

/// Register and immediately drop a trigger: closing the file removes it.
fn try_trigger(path: &Path, trigger: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    file.write_all(trigger)
}

fn probe_memcg_eventfd(cgroups: Option<&CgroupPaths>) -> (bool, String) {
    let Some(cgroups) = cgroups.filter(|c| c.layout().memory_is_v1()) else {
        return (false, "no cgroup v1 memory hierarchy".to_string());
    };
    let control = cgroups
        .memory_dir(Path::new("/"))
        .join("cgroup.event_control");
    if control.exists() {
        (true, format!("{} present", control.display()))
    } else {
        (false, format!("{} missing", control.display()))
    }
}

fn probe_memory_events(cgroups: Option<&CgroupPaths>, pods: Option<&Path>) -> (bool, String) {
    let Some(cgroups) = cgroups else {
        return (false, "no cgroup hierarchy found".to_string());
    };
    if cgroups.layout() != CgroupLayout::Unified {
        return (
            false,
            "the memory controller is on cgroup v1, so no v2 memory.events".to_string(),
        );
    }
    // The v2 root cgroup has no memory.events; the pods cgroup is what the agent watches.
    let candidates: Vec<PathBuf> = pods
        .into_iter()
        .map(|pods| cgroups.memory_dir(pods).join("memory.events"))
        .chain(std::iter::once(
            cgroups.memory_dir(Path::new("/")).join("memory.events"),
        ))
        .collect();
    match candidates.iter().find(|path| path.is_file()) {
        Some(path) => (true, format!("{} present", path.display())),
        None => (
            false,
            format!(
                "no memory.events at {}",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        ),
    }
}

impl fmt::Display for NotificationSupport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = |supported: bool| if supported { "yes" } else { "no " };
        writeln!(
            f,
            "PSI triggers:            {}  {}",
            verdict(self.psi),
            self.psi_detail
        )?;
        writeln!(
            f,
            "memcg eventfd (v1):      {}  {}",
            verdict(self.memcg_eventfd_v1),
            self.memcg_eventfd_v1_detail
        )?;
        write!(
            f,
            "memory.events (v2):      {}  {}",
            verdict(self.memory_events_v2),
            self.memory_events_v2_detail
        )
    }
}
