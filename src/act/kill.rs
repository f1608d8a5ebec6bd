//! The one way nodekeeper stops the processes of a cgroup subtree, used by eviction and by
//! graceful shutdown alike:
//! - listing: one recursive `cgroup.procs` walk that never yields pid 0, negative pids,
//!   init or the agent itself (a containerized agent without hostPID reads 0 for tasks
//!   outside its PID namespace, and `kill(0)`/`kill(-1)` would hit its own process group or
//!   every process on the host);
//! - killing, race-free where the kernel allows it: v2 `cgroup.kill`; else freeze (v1
//!   freezer, or v2 `cgroup.freeze`), SIGKILL every task, thaw so the signals are
//!   delivered; else SIGKILL repeated until no new task appears;
//! - stopping: SIGTERM, the grace period, then the kill, then a bounded wait for the exit.
//!
//! Everything here except [`stop_gracefully`] blocks on cgroupfs (a freezer can take up to
//! `FREEZE_WAIT`); async callers run it on the blocking pool.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::error::ActError;
use crate::signals::{CgroupLayout, CgroupPaths, join_relative};

/// How long to wait for a freezer to report frozen. Tasks stuck in uninterruptible sleep
/// can hold it in FREEZING; the kill goes ahead regardless.
const FREEZE_WAIT: Duration = Duration::from_secs(1);
const FREEZE_POLL: Duration = Duration::from_millis(1);
/// Without a freezer, tasks forked during the kill are caught by repeating it.
const UNFROZEN_ROUNDS: usize = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillMethod {
    /// v2 `cgroup.kill`.
    CgroupKill,
    /// Freezer (v1 `freezer.state` or v2 `cgroup.freeze`): frozen, SIGKILL each task, thawed.
    FreezeKillThaw,
    /// Signal each task, repeated until no new one appears (no freezer available).
    SignalEach,
    /// SIGTERM to each task: the first step of a graceful stop.
    Terminate,
}

impl std::fmt::Display for KillMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KillMethod::CgroupKill => "cgroup.kill",
            KillMethod::FreezeKillThaw => "freeze, SIGKILL each task, thaw",
            KillMethod::SignalEach => "SIGKILL each task, and each new one that appears",
            KillMethod::Terminate => "SIGTERM each task",
        })
    }
}

/// What a kill did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillReport {
    pub method: KillMethod,
    /// Processes signalled (for `cgroup.kill`: those listed just before).
    pub signalled: usize,
}

/// One workload's cgroup, as the directories the killer works in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillTarget {
    /// The directory whose `cgroup.procs` (with its descendants') lists the processes; on
    /// v2 it also holds `cgroup.kill` and `cgroup.freeze`.
    pub tasks: PathBuf,
    /// The same workload in the v1 freezer hierarchy, when the host has one.
    pub v1_freezer: Option<PathBuf>,
}

impl KillTarget {
    /// A cgroup in a single hierarchy: a v2 cgroup, or a v1 freezer cgroup (which lists its
    /// own tasks).
    pub fn directory(dir: impl Into<PathBuf>) -> Self {
        let tasks = dir.into();
        KillTarget {
            v1_freezer: Some(tasks.clone()),
            tasks,
        }
    }

    fn name(&self) -> &Path {
        &self.tasks
    }
}

/// Maps cgroups of one host (or test) hierarchy, given relative to its root, to targets.
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

    /// Where `cgroup`'s processes are listed (the memory hierarchy on v1, the unified one
    /// on v2) and its v1 freezer twin.
    pub fn target(&self, cgroup: &Path) -> KillTarget {
        KillTarget {
            tasks: self.paths.memory_dir(cgroup),
            v1_freezer: self
                .paths
                .layout()
                .memory_is_v1()
                .then(|| join_relative(&self.root.join("freezer"), cgroup)),
        }
    }

    /// SIGKILL every process in `cgroup` and its descendants. Returns once the signals
    /// are sent; the processes exit asynchronously.
    pub fn kill(&self, cgroup: &Path) -> Result<KillReport, ActError> {
        kill_target(&self.target(cgroup))
    }
}

/// Every process that may be signalled in the target and below it. A cgroup removed
/// meanwhile is empty.
fn processes(target: &KillTarget) -> Result<BTreeSet<Pid>, ActError> {
    let mut pids = BTreeSet::new();
    collect_procs(&target.tasks, &mut pids)?;
    if let Some(freezer) = target.v1_freezer.as_ref().filter(|f| **f != target.tasks) {
        collect_procs(freezer, &mut pids)?;
    }
    Ok(pids)
}

/// SIGKILL every process of the target, with the safest method the kernel offers.
pub fn kill_target(target: &KillTarget) -> Result<KillReport, ActError> {
    let cgroup_kill = target.tasks.join("cgroup.kill");
    if cgroup_kill.exists() {
        let signalled = processes(target)?.len();
        let written = write_control(&cgroup_kill, "1", "write 1 to")?;
        if !written {
            // Removed since it was found: a v2 cgroup is removed only once empty.
            tracing::debug!(cgroup = %target.name().display(), "cgroup removed before cgroup.kill; its processes had ended");
        }
        return Ok(KillReport {
            method: KillMethod::CgroupKill,
            signalled: if written { signalled } else { 0 },
        });
    }
    // The freezer is chosen by freezing, not by looking for its file first: a cgroup
    // removed in between (its last process ended) is told by the write itself.
    for freezer in freezers_of(target) {
        if !freezer.freeze()? {
            continue;
        }
        let pids = freezer.wait_frozen().and_then(|frozen| {
            if !frozen {
                tracing::warn!(file = %freezer.control.display(), "cgroup did not freeze in time; killing anyway");
            }
            processes(target)
        });
        if let Ok(pids) = &pids {
            signal_each(pids, Signal::SIGKILL);
        }
        // Thaw even when waiting or listing failed, so nothing stays frozen behind us.
        freezer.thaw()?;
        return Ok(KillReport {
            method: KillMethod::FreezeKillThaw,
            signalled: pids?.len(),
        });
    }
    tracing::debug!(cgroup = %target.name().display(), "no freezer for this cgroup; killing without freezing");
    kill_each(target)
}

/// SIGTERM every process of the target.
pub fn terminate_target(target: &KillTarget) -> Result<KillReport, ActError> {
    let pids = processes(target)?;
    signal_each(&pids, Signal::SIGTERM);
    Ok(KillReport {
        method: KillMethod::Terminate,
        signalled: pids.len(),
    })
}

/// How a graceful stop ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// The cgroup was missing or held no process.
    NothingToStop,
    /// Every process exited within the grace period after SIGTERM.
    Exited,
    /// Processes were left when the grace period ended and were killed.
    Killed(KillReport),
}

/// The pace of [`stop_gracefully`].
#[derive(Debug, Clone, Copy)]
pub struct StopTiming {
    /// How often to look whether the processes are gone.
    pub poll: Duration,
    /// How long processes may take to disappear after SIGKILL before it is an error.
    pub kill_wait: Duration,
}

impl Default for StopTiming {
    fn default() -> Self {
        StopTiming {
            poll: Duration::from_millis(20),
            kill_wait: Duration::from_secs(5),
        }
    }
}

/// SIGTERM, up to `grace` for the processes to exit, then the kill and a bounded wait
/// until the cgroup is empty. Blocking steps run on the blocking pool.
pub async fn stop_gracefully(
    target: KillTarget,
    grace: Duration,
    timing: StopTiming,
) -> Result<Stopped, ActError> {
    let target = std::sync::Arc::new(target);
    let terminated = blocking(&target, terminate_target).await?;
    if terminated.signalled == 0 {
        return Ok(Stopped::NothingToStop);
    }
    escalate(target, grace, timing).await
}

/// The rest of a graceful stop whose SIGTERM was already sent: wait up to `grace` for the
/// processes to exit, then kill what is left and wait (bounded) until the cgroup is empty.
pub async fn escalate_after_sigterm(
    target: KillTarget,
    grace: Duration,
    timing: StopTiming,
) -> Result<Stopped, ActError> {
    escalate(std::sync::Arc::new(target), grace, timing).await
}

async fn escalate(
    target: std::sync::Arc<KillTarget>,
    grace: Duration,
    timing: StopTiming,
) -> Result<Stopped, ActError> {
    let deadline = tokio::time::Instant::now() + grace;
    loop {
        if blocking(&target, processes).await?.is_empty() {
            return Ok(Stopped::Exited);
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            break;
        }
        tokio::time::sleep(timing.poll.min(deadline - now)).await;
    }
    let report = blocking(&target, kill_target).await?;
    let deadline = tokio::time::Instant::now() + timing.kill_wait;
    loop {
        let left = blocking(&target, processes).await?;
        if left.is_empty() {
            return Ok(Stopped::Killed(report));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ActError::Survived {
                cgroup: target.tasks.clone(),
                pids: left.iter().map(|pid| pid.as_raw()).collect(),
            });
        }
        tokio::time::sleep(timing.poll).await;
    }
}

async fn blocking<T: Send + 'static>(
    target: &std::sync::Arc<KillTarget>,
    step: fn(&KillTarget) -> Result<T, ActError>,
) -> Result<T, ActError> {
    let shared = target.clone();
    tokio::task::spawn_blocking(move || step(&shared))
        .await
        .unwrap_or_else(|e| {
            Err(ActError::Escalation {
                cgroup: target.tasks.clone(),
                reason: e.to_string(),
            })
        })
}

fn kill_each(target: &KillTarget) -> Result<KillReport, ActError> {
    let mut signalled = BTreeSet::new();
    for _ in 0..UNFROZEN_ROUNDS {
        let pids = processes(target)?;
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

/// A cgroup freezer: the v1 `freezer.state` file or the v2 `cgroup.freeze` one.
struct Freezer {
    control: PathBuf,
    v1: bool,
}

/// The freezers to try, in order: the workload's v1 freezer cgroup's, then v2's.
fn freezers_of(target: &KillTarget) -> impl Iterator<Item = Freezer> + '_ {
    let v1 = target.v1_freezer.as_ref().map(|dir| Freezer {
        control: dir.join("freezer.state"),
        v1: true,
    });
    let v2 = Freezer {
        control: target.tasks.join("cgroup.freeze"),
        v1: false,
    };
    v1.into_iter().chain(std::iter::once(v2))
}

impl Freezer {
    /// `false` when there is no such freezer, or its cgroup was removed (nothing to
    /// freeze).
    fn freeze(&self) -> Result<bool, ActError> {
        self.write(if self.v1 { "FROZEN" } else { "1" })
    }

    /// A cgroup removed since it was frozen holds nothing to thaw.
    fn thaw(&self) -> Result<(), ActError> {
        if !self.write(if self.v1 { "THAWED" } else { "0" })? {
            tracing::debug!(file = %self.control.display(), "cgroup removed while frozen");
        }
        Ok(())
    }

    fn write(&self, value: &str) -> Result<bool, ActError> {
        write_control(&self.control, value, "write the freezer state to")
    }

    /// Poll (bounded) until the freezer reports frozen: the v1 freezer has no
    /// notification, and a v2 freeze completes in microseconds.
    fn wait_frozen(&self) -> Result<bool, ActError> {
        let deadline = Instant::now() + FREEZE_WAIT;
        loop {
            if self.is_frozen()? {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(FREEZE_POLL);
        }
    }

    fn is_frozen(&self) -> Result<bool, ActError> {
        let file = if self.v1 {
            self.control.clone()
        } else {
            self.control.with_file_name("cgroup.events")
        };
        let text = match std::fs::read_to_string(&file) {
            Ok(text) => text,
            // Removed: nothing is left running in it.
            Err(e) if cgroup_gone(&e) => return Ok(true),
            Err(e) => return Err(ActError::io(&file, "read the freezer state from", e)),
        };
        Ok(if self.v1 {
            text.trim() == "FROZEN"
        } else {
            text.lines().any(|line| line.trim() == "frozen 1")
        })
    }
}

/// Whether `error`, from a cgroup's file or directory, says the cgroup is gone: not found,
/// or `ENODEV`, which the kernel answers for a file of a cgroup removed as it was opened
/// or read (a pod's processes ended and its cgroup removed while it is walked).
fn cgroup_gone(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::NotFound || error.raw_os_error() == Some(libc::ENODEV)
}

/// Write `value` to the cgroup control file `file` (never creating it); `false` when the
/// cgroup was removed since the file was found (not found, or `ENODEV`), which a pod whose
/// processes all ended meets when its runtime removes its cgroup.
/// `action` words the error ("write 1 to").
fn write_control(file: &Path, value: &str, action: &'static str) -> Result<bool, ActError> {
    use std::io::Write;
    // Truncating as a shell's `echo 1 >` does (cgroupfs ignores it; a test tree's file
    // holds just the value), but never creating.
    let written = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(file)
        .and_then(|mut control| control.write_all(value.as_bytes()));
    match written {
        Ok(()) => Ok(true),
        Err(e) if cgroup_gone(&e) => Ok(false),
        Err(e) => Err(ActError::io(file, action, e)),
    }
}

/// The text of `dir`'s `cgroup.procs`, read to its end; `None` when there is none (the
/// cgroup is gone).
fn procs_text(dir: &Path) -> Result<Option<String>, ActError> {
    let procs = dir.join("cgroup.procs");
    match std::fs::read_to_string(&procs) {
        Ok(text) => Ok(Some(text)),
        Err(e) if cgroup_gone(&e) => Ok(None),
        Err(e) => Err(ActError::io(&procs, "read", e)),
    }
}

fn collect_procs(dir: &Path, pids: &mut BTreeSet<Pid>) -> Result<(), ActError> {
    let Some(text) = procs_text(dir)? else {
        return Ok(());
    };
    pids.extend(signalable_members(&text));
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if cgroup_gone(&e) => return Ok(()),
        Err(e) => return Err(ActError::io(dir, "list", e)),
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_procs(&entry.path(), pids)?;
        }
    }
    Ok(())
}

/// The processes listed directly in `dir`'s `cgroup.procs` (not its descendants'), as
/// the file lists them; a missing file lists none.
fn direct_members(dir: &Path) -> Result<Vec<String>, ActError> {
    Ok(procs_text(dir)?
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(str::to_string)
        .collect())
}

/// SIGKILL the processes directly in `dir`, not those of its descendants (for a cgroup
/// one of whose children must be spared); how many were signalled.
pub fn kill_direct_members(dir: &Path) -> Result<usize, ActError> {
    let text = procs_text(dir)?.unwrap_or_default();
    let pids: BTreeSet<Pid> = signalable_members(&text).collect();
    signal_each(&pids, Signal::SIGKILL);
    Ok(pids.len())
}

/// How many processes `dir` holds directly, every entry counted (see
/// [`count_processes`]).
pub fn count_direct_members(dir: &Path) -> Result<usize, ActError> {
    Ok(direct_members(dir)?.len())
}

/// How many processes the target and its descendants hold, every `cgroup.procs` entry
/// counted: also those the killer never signals by pid (0 for a task outside the agent's
/// PID namespace), since "none left" must mean none. A missing cgroup holds none.
pub fn count_processes(target: &KillTarget) -> Result<usize, ActError> {
    fn count(dir: &Path) -> Result<usize, ActError> {
        // A directory without the file still has its children looked at: counting too
        // many is safe, too few is not.
        let mut total = direct_members(dir)?.len();
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if cgroup_gone(&e) => return Ok(total),
            Err(e) => return Err(ActError::io(dir, "list", e)),
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                total += count(&entry.path())?;
            }
        }
        Ok(total)
    }
    let mut total = count(&target.tasks)?;
    if let Some(freezer) = target.v1_freezer.as_ref().filter(|f| **f != target.tasks) {
        // The same processes, listed twice on v1: the larger count is the truth.
        total = total.max(count(freezer)?);
    }
    Ok(total)
}

/// The pids of a `cgroup.procs` text that may be signalled, from whole lines only: a last
/// line without its newline may be the first digits of a longer pid (`12` of `1234`), a
/// process outside the cgroup. The kernel writes whole lines, so such a line means a
/// read cut short: it is left to the next read (every `cgroup.procs` entry is read again
/// before a stop is judged done), never guessed at. Public for the `kernel_files` fuzz
/// target.
pub fn signalable_members(text: &str) -> impl Iterator<Item = Pid> + '_ {
    crate::signals::parse::complete_lines(text)
        .lines()
        .filter_map(signalable)
}

/// A `cgroup.procs` line as a pid that may be signalled: never 0 (our process group, or
/// a task outside our PID namespace), a negative number (a process group; -1 is every
/// process), init, or the agent itself, whatever the file says. Public so the
/// `kernel_files` fuzz target can hold it to that on any text.
pub fn signalable(line: &str) -> Option<Pid> {
    let pid: i32 = line.trim().parse().ok()?;
    let own = i32::try_from(std::process::id()).ok();
    (pid > 1 && Some(pid) != own).then(|| Pid::from_raw(pid))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A cgroup removed while it is walked holds no processes; it is no failure to kill
    /// or count them (the self-isolation VM test met an `ENODEV` on a pod cgroup's
    /// `cgroup.procs` that systemd removed as its processes ended).
    #[test]
    fn a_cgroup_removed_while_walked_is_gone_not_an_error() {
        use std::io::Error;
        assert!(cgroup_gone(&Error::from_raw_os_error(libc::ENODEV)));
        assert!(cgroup_gone(&Error::from_raw_os_error(libc::ENOENT)));
        assert!(!cgroup_gone(&Error::from_raw_os_error(libc::EACCES)));
        assert!(!cgroup_gone(&Error::from_raw_os_error(libc::EIO)));
    }

    /// A control file written after its cgroup was removed (an eviction of a pod whose
    /// last process just ended) is no failure, and is never created: on a real host the
    /// kernel refuses a new file in cgroupfs, and a file made in a test tree would hide
    /// the missing one.
    #[test]
    fn a_control_file_gone_before_its_write_is_no_failure() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("cgroup.kill");
        assert!(!write_control(&missing, "1", "write 1 to").unwrap());
        assert!(!missing.exists(), "created");
        let removed = dir.path().join("removed/cgroup.freeze");
        assert!(!write_control(&removed, "1", "write 1 to").unwrap());
        let present = dir.path().join("cgroup.freeze");
        std::fs::write(&present, "0\n").unwrap();
        assert!(write_control(&present, "1", "write 1 to").unwrap());
        assert_eq!(std::fs::read_to_string(&present).unwrap(), "1");
        // Any other failure is one, naming the file.
        let error = write_control(dir.path(), "1", "write 1 to").unwrap_err();
        assert!(
            error
                .to_string()
                .contains(&dir.path().display().to_string()),
            "{error}"
        );
    }

    /// A freezer whose cgroup went away (before or after the freeze) neither fails the
    /// kill nor holds it up: there is nothing to freeze, wait for or thaw, and the
    /// freeze says so, so the kill moves on to the next way.
    #[test]
    fn a_freezer_removed_before_its_use_is_no_failure() {
        let dir = tempfile::tempdir().unwrap();
        for (file, v1) in [("freezer.state", true), ("cgroup.freeze", false)] {
            let freezer = Freezer {
                control: dir.path().join("removed").join(file),
                v1,
            };
            assert!(!freezer.freeze().unwrap(), "{file}");
            assert!(freezer.is_frozen().unwrap(), "{file}");
            assert!(freezer.wait_frozen().unwrap(), "{file}");
            freezer.thaw().unwrap();
        }
    }

    /// A kill that fails after freezing (here the freezer's state cannot be read) still
    /// thaws what it froze: a frozen pod left behind would hang every process in it.
    #[test]
    fn a_kill_that_fails_after_freezing_still_thaws() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.procs"), "").unwrap();
        std::fs::write(dir.path().join("cgroup.freeze"), "0").unwrap();
        std::fs::create_dir(dir.path().join("cgroup.events")).unwrap();
        let error = kill_target(&KillTarget::directory(dir.path())).unwrap_err();
        assert!(error.to_string().contains("cgroup.events"), "{error}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("cgroup.freeze")).unwrap(),
            "0",
            "left frozen"
        );
    }

    #[test]
    fn only_real_foreign_processes_are_ever_signalled() {
        let own = std::process::id().to_string();
        let lines = [
            "0",
            "-1",
            "-42",
            "1",
            own.as_str(),
            "",
            "x",
            "4294967297",
            " 77 ",
        ];
        let pids: Vec<i32> = lines
            .iter()
            .filter_map(|line| signalable(line))
            .map(Pid::as_raw)
            .collect();
        assert_eq!(pids, vec![77]);
    }

    #[test]
    fn a_pid_cut_short_is_never_signalled() {
        // `4242\n77` may be `4242\n7731` read short: 77 is some other process.
        let pids: Vec<i32> = signalable_members("4242\n77").map(Pid::as_raw).collect();
        assert_eq!(pids, vec![4242]);
        let pids: Vec<i32> = signalable_members("4242\n7731\n")
            .map(Pid::as_raw)
            .collect();
        assert_eq!(pids, vec![4242, 7731]);
        assert_eq!(signalable_members("77").count(), 0);
    }

    #[test]
    fn every_listed_process_counts_as_left_also_those_never_signalled() {
        let dir = tempfile::tempdir().expect("temp dir");
        let pods = dir.path().join("kubepods");
        let pod = pods.join("burstable/pod-a");
        std::fs::create_dir_all(&pod).expect("dirs");
        std::fs::write(pods.join("cgroup.procs"), "").expect("procs");
        // A task outside the agent's PID namespace reads 0: it is still there.
        std::fs::write(pod.join("cgroup.procs"), "0\n4242\n").expect("procs");
        let target = KillTarget {
            tasks: pods.clone(),
            v1_freezer: None,
        };
        assert_eq!(count_processes(&target).expect("counted"), 2);
        let gone = KillTarget {
            tasks: dir.path().join("absent"),
            v1_freezer: None,
        };
        assert_eq!(count_processes(&gone).expect("counted"), 0);
    }
}
