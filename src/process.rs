//! Child processes that must not outlive their deadline: each runs in its own process
//! group, and past the deadline the whole group is killed, so a shell's or an agent's
//! children (ipmitool, snmpget) cannot linger. Used by the node-reclaim commands and the
//! fence-agent runner. Also this process's own limit on open files.

use std::process::ExitStatus;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::process::{Child, Command};

/// How a waited-for child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    Exited(ExitStatus),
    /// The deadline passed; the process group was killed and the child reaped.
    TimedOut,
}

/// Makes `command` start in a new process group of its own, killed if the handle drops
/// and killed by the kernel if this process dies (SIGKILL included): a fence agent must
/// not go on acting for a controller that is gone, while the next one asks the device
/// what happened. (The kernel ties that to the spawning thread; the tokio worker threads
/// that spawn live as long as the runtime.)
///
/// The child also gets back the soft limit of open files this process started with, when
/// [`raise_open_files_limit`] raised it: a program that uses `select()` or closes every
/// descriptor up to its limit expects the usual one (Go gives its children the same).
pub fn in_own_group(command: &mut Command) -> &mut Command {
    let parent = std::process::id();
    let open_files = ORIGINAL_OPEN_FILES_LIMIT
        .get()
        .map(|&(soft, hard)| libc::rlimit {
            rlim_cur: soft as libc::rlim_t,
            rlim_max: hard as libc::rlim_t,
        });
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (prctl, getppid, setrlimit, _exit); it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the prctl took effect: nobody waits for us.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                libc::_exit(1);
            }
            if let Some(limit) = &open_files
                && libc::setrlimit(libc::RLIMIT_NOFILE, limit) == -1
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
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

/// The soft and hard limits of open files this process had before it raised the soft one.
static ORIGINAL_OPEN_FILES_LIMIT: OnceLock<(u64, u64)> = OnceLock::new();

/// Raises this process's soft limit on open files to its hard limit, as Go programs do:
/// a server with thousands of clients (the controller's report endpoint) and the agent's
/// decision cycle, which keeps the pods' cgroup files open, need more than the soft limit
/// systemd gives (1024). The processes [`in_own_group`] starts get the old soft limit
/// back. Returns the limit before and after.
pub fn raise_open_files_limit() -> nix::Result<(u64, u64)> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
        let _ = ORIGINAL_OPEN_FILES_LIMIT.set((soft, hard));
    }
    Ok((soft, hard))
}

/// Moves the calling thread to the real-time scheduler (SCHED_FIFO at `priority`), so
/// that it runs as soon as it wakes instead of waiting behind a busy process for the
/// next scheduler tick. SCHED_RESET_ON_FORK: the threads and processes it starts (a
/// reclaim command, tokio's blocking threads) begin on the normal scheduler. Needs
/// CAP_SYS_NICE, and a real-time budget where the kernel schedules real-time tasks by
/// cgroup (`cpu.rt_runtime_us`); systemd's `RestrictRealtime=yes` forbids it.
pub fn run_this_thread_realtime(priority: u8) -> std::io::Result<()> {
    let param = libc::sched_param {
        sched_priority: i32::from(priority),
    };
    // SAFETY: pid 0 names the calling thread; `param` is a valid sched_param that the
    // call only reads.
    let rc = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `pid` still runs (a zombie no longer runs anything).
    fn runs(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            // The state follows the parenthesised command name.
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
    }

    /// The limit raised for this process is not its children's: a command it starts sees
    /// the soft limit the process started with. (Each test runs in a process of its own
    /// under nextest; raising the limit changes nothing the other tests look at.)
    #[test]
    fn children_get_the_soft_limit_of_open_files_the_process_started_with() {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("the limit");
        let started_with = (hard / 2).min(1024);
        assert!(
            started_with < hard,
            "hard limit {hard} too low for this test"
        );
        setrlimit(Resource::RLIMIT_NOFILE, started_with, hard).expect("lowered");
        assert_eq!(
            raise_open_files_limit().expect("raised"),
            (started_with, hard)
        );
        assert_eq!(
            getrlimit(Resource::RLIMIT_NOFILE).expect("the limit"),
            (hard, hard)
        );
        let output = std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                let mut command = Command::new("sh");
                command.args(["-c", "ulimit -Sn; ulimit -Hn"]);
                in_own_group(&mut command).output().await.expect("sh runs")
            })
        })
        .join()
        .expect("thread");
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            format!("{started_with}\n{hard}\n")
        );
    }

    #[test]
    fn a_child_is_killed_when_what_started_it_is_gone() {
        // The kernel's parent-death signal follows the spawning thread, so a thread that
        // ends stands in for a controller that was SIGKILLed.
        let pid = std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                let mut command = Command::new("sleep");
                command.arg("60");
                let child = in_own_group(&mut command).spawn().expect("spawn sleep");
                let pid = child.id().expect("pid");
                // Not dropped: kill_on_drop must not be what ends it.
                std::mem::forget(child);
                pid
            })
        })
        .join()
        .expect("thread");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while runs(pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "sleep {pid} outlived the thread that started it"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
