//! What `/proc` says about the CPU and memory of another process, for the benchmarks that
//! measure a process of their own (the agent, the controller), and the CPU time of the
//! calling thread, for those that measure in their own process.

use std::time::Duration;

/// utime + stime of the whole process, its ended threads included. The kernel counts in
/// clock ticks (10 ms on Linux), so this is coarse; sum the threads' `schedstat` for
/// nanoseconds.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|error| panic!("/proc/{pid}/stat: {error}"));
    // The command name in parentheses may hold spaces; the fields after it are fixed.
    let (_, after_command) = stat
        .rsplit_once(')')
        .unwrap_or_else(|| panic!("/proc/{pid}/stat without a command name: {stat}"));
    let fields: Vec<&str> = after_command.split_whitespace().collect();
    let field = |index: usize| -> u64 {
        fields
            .get(index)
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("/proc/{pid}/stat field {}: {stat}", index + 3))
    };
    let ticks = field(11) + field(12);
    // SAFETY: sysconf only reads a system constant.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Duration::from_secs_f64(ticks as f64 / per_second)
}

/// CPU time of the calling thread, in nanoseconds: unlike wall time it does not count the
/// time the scheduler gives to other processes, which dominates multi-millisecond samples
/// on a busy host.
pub fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// A `kB` figure of `/proc/<pid>/status`, such as `VmRSS:` or `VmHWM:`, in KiB.
pub fn status_kib(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|error| panic!("/proc/{pid}/status: {error}"));
    status
        .lines()
        .find_map(|line| line.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .unwrap_or_else(|| panic!("/proc/{pid}/status has no {key}"))
}

/// Whether process `pid` has exited: gone, or a zombie nobody waited for yet. Read from
/// `/proc`, so a child is not reaped behind its `Child`'s back.
pub fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next())
        })
        .is_none_or(|state| state == 'Z' || state == 'X')
}
