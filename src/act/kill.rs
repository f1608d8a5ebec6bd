//! Killing every process of a cgroup subtree, race-free where the kernel allows it:
//! `cgroup.kill` on v2; on v1, freeze the subtree so nothing can fork, SIGKILL every task,
//! then thaw so the signals are delivered.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::error::ActError;
use crate::signals::{CgroupLayout, CgroupPaths};

/// How long to wait for a v1 freezer to report FROZEN. Tasks stuck in uninterruptible
/// sleep can hold it in FREEZING; the kill goes ahead regardless.
const FREEZE_WAIT: Duration = Duration::from_secs(1);
const FREEZE_POLL: Duration = Duration::from_millis(1);
/// Without a freezer, tasks forked during the kill are caught by repeating it.
const UNFROZEN_ROUNDS: usize = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillMethod {
    /// v2 `cgroup.kill`.
    CgroupKill,
    /// v1 freezer: FROZEN, SIGKILL each task, THAWED.
    FreezeKillThaw,
    /// Signal each task, repeated until the cgroup is empty (no freezer available).
    SignalEach,
    /// SIGTERM to each task: the first step of a soft eviction.
    Terminate,
}

/// What a kill did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillReport {
    pub method: KillMethod,
    /// Processes signalled (for `cgroup.kill`: those listed just before).
    pub signalled: usize,
}

/// Kills cgroups of one host (or test) hierarchy.
#[derive(Debug, Clone)]
pub struct CgroupKiller {
    root: PathBuf,
    paths: CgroupPaths,
}

impl CgroupKiller {
    pub fn new(cgroup_root: &Path, layout: CgroupLayout) -> Self {
        CgroupKiller {
            root: cgroup_root.to_path_buf(),
            paths: CgroupPaths::new(cgroup_root, layout),
        }
    }

    /// SIGKILL every process in `cgroup` and its descendants. Returns once the signals
    /// are sent; the processes exit asynchronously.
    pub fn kill(&self, cgroup: &Path) -> Result<KillReport, ActError> {
        if self.paths.layout().memory_is_v1() {
            self.kill_v1(cgroup)
        } else {
            self.kill_v2(cgroup)
        }
    }

    /// SIGTERM every process in `cgroup` and its descendants.
    pub fn terminate(&self, cgroup: &Path) -> Result<KillReport, ActError> {
        let pids = self.pids(cgroup)?;
        signal_each(&pids, Signal::SIGTERM);
        Ok(KillReport {
            method: KillMethod::Terminate,
            signalled: pids.len(),
        })
    }

    /// Whether no process is left in `cgroup` or below it.
    pub fn is_empty(&self, cgroup: &Path) -> Result<bool, ActError> {
        Ok(self.pids(cgroup)?.is_empty())
    }

    fn kill_v2(&self, cgroup: &Path) -> Result<KillReport, ActError> {
        let dir = self.task_dir(cgroup);
        let control = dir.join("cgroup.kill");
        if !control.exists() {
            // Kernels before 5.14 have no cgroup.kill.
            return self.kill_each(cgroup);
        }
        let signalled = procs_recursive(&dir)?.len();
        std::fs::write(&control, "1").map_err(|e| ActError::io(&control, "write 1 to", e))?;
        Ok(KillReport {
            method: KillMethod::CgroupKill,
            signalled,
        })
    }

    fn kill_v1(&self, cgroup: &Path) -> Result<KillReport, ActError> {
        let freezer = under(&self.root.join("freezer"), cgroup);
        let state = freezer.join("freezer.state");
        if !state.exists() {
            tracing::debug!(cgroup = %cgroup.display(), "no matching freezer cgroup; killing without freezing");
            return self.kill_each(cgroup);
        }
        write_state(&state, "FROZEN")?;
        if !wait_frozen(&state)? {
            tracing::warn!(file = %state.display(), "cgroup did not reach FROZEN in time; killing anyway");
        }
        let mut pids = self.pids(cgroup)?;
        pids.extend(procs_recursive(&freezer)?);
        signal_each(&pids, Signal::SIGKILL);
        write_state(&state, "THAWED")?;
        Ok(KillReport {
            method: KillMethod::FreezeKillThaw,
            signalled: pids.len(),
        })
    }

    fn kill_each(&self, cgroup: &Path) -> Result<KillReport, ActError> {
        let mut signalled = BTreeSet::new();
        for _ in 0..UNFROZEN_ROUNDS {
            let pids = self.pids(cgroup)?;
            let fresh: BTreeSet<Pid> = pids.difference(&signalled).copied().collect();
            if fresh.is_empty() {
                break;
            }
            signal_each(&fresh, Signal::SIGKILL);
            signalled.extend(fresh);
        }
        Ok(KillReport {
            method: KillMethod::SignalEach,
            signalled: signalled.len(),
        })
    }

    /// The directory whose `cgroup.procs` lists the cgroup's tasks: the memory hierarchy
    /// on v1, the unified hierarchy on v2.
    fn task_dir(&self, cgroup: &Path) -> PathBuf {
        self.paths.memory_dir(cgroup)
    }

    fn pids(&self, cgroup: &Path) -> Result<BTreeSet<Pid>, ActError> {
        procs_recursive(&self.task_dir(cgroup))
    }
}

/// `cgroup` below a hierarchy root, even when written absolute (`/kubepods`).
fn under(hierarchy: &Path, cgroup: &Path) -> PathBuf {
    let mut dir = hierarchy.to_path_buf();
    dir.extend(
        cgroup
            .components()
            .filter(|c| matches!(c, std::path::Component::Normal(_))),
    );
    dir
}

fn write_state(state: &Path, value: &str) -> Result<(), ActError> {
    std::fs::write(state, value).map_err(|e| ActError::io(state, "write the freezer state to", e))
}

/// Poll (with a sleep, bounded) until the v1 freezer reports FROZEN; the v1 freezer has
/// no notification for it.
fn wait_frozen(state: &Path) -> Result<bool, ActError> {
    let deadline = Instant::now() + FREEZE_WAIT;
    loop {
        let text = std::fs::read_to_string(state)
            .map_err(|e| ActError::io(state, "read the freezer state from", e))?;
        if text.trim() == "FROZEN" {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(FREEZE_POLL);
    }
}

/// The processes of `dir` and every cgroup below it. A cgroup removed meanwhile is empty.
fn procs_recursive(dir: &Path) -> Result<BTreeSet<Pid>, ActError> {
    let mut pids = BTreeSet::new();
    collect_procs(dir, &mut pids)?;
    Ok(pids)
}

fn collect_procs(dir: &Path, pids: &mut BTreeSet<Pid>) -> Result<(), ActError> {
    let procs = dir.join("cgroup.procs");
    let text = match std::fs::read_to_string(&procs) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ActError::io(&procs, "read", e)),
    };
    let own = std::process::id();
    for line in text.lines() {
        match line.trim().parse::<u32>() {
            // Never signal ourselves, nor init, whatever the cgroup says.
            Ok(pid) if pid > 1 && pid != own => {
                if let Ok(pid) = i32::try_from(pid) {
                    pids.insert(Pid::from_raw(pid));
                }
            }
            _ => {}
        }
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ActError::io(dir, "list", e)),
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_procs(&entry.path(), pids)?;
        }
    }
    Ok(())
}

fn signal_each(pids: &BTreeSet<Pid>, signal: Signal) {
    for pid in pids {
        match kill(*pid, signal) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(error) => {
                tracing::warn!(pid = pid.as_raw(), %signal, %error, "cannot signal process")
            }
        }
    }
}
