//! Child processes that must not outlive their deadline: each runs in its own process
//! group, and past the deadline the whole group is killed, so a shell's or an agent's
//! children (ipmitool, snmpget) cannot linger. Used by the node-reclaim commands and the
//! fence-agent runner.

use std::process::ExitStatus;
use std::time::Duration;

use tokio::process::{Child, Command};

/// How a waited-for child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    Exited(ExitStatus),
    /// The deadline passed; the process group was killed and the child reaped.
    TimedOut,
}

/// Makes `command` start in a new process group of its own, killed if the handle drops.
pub fn in_own_group(command: &mut Command) -> &mut Command {
    command.process_group(0).kill_on_drop(true)
}

/// Waits for `child` at most `timeout`; past it, SIGKILLs the child's whole process
/// group and reaps the child.
pub async fn wait_or_kill_group(child: &mut Child, timeout: Duration) -> std::io::Result<Waited> {
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(status) => status.map(Waited::Exited),
        Err(_) => {
            // The child is not reaped yet, so its pid still names its group.
            if let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) {
                kill_group(pid);
            }
            // Reap it; an error means it exited meanwhile.
            let _ = child.kill().await;
            Ok(Waited::TimedOut)
        }
    }
}

/// SIGKILLs process group `group`. Called for a group this process created, while its
/// leader is unreaped or just after: a group id is not reused while any member lives.
pub fn kill_group(group: i32) {
    if group > 1 {
        // ESRCH means the group is already gone.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(group),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}
