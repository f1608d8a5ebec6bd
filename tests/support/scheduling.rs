//! How the kernel schedules a process's threads, as `/proc` shows it.

/// The agent's thread `realtimePriority` moves, the decision cycle thread (on which the
/// kernel notifiers wait too), by its name in `/proc` (`comm` keeps 15 bytes of
/// `nodekeeper-cycle`).
pub const CYCLE_THREAD: &str = "nodekeeper-cycl";

/// What `realtimePriority` promises of the agent's `threads`: the decision cycle thread is
/// there, at SCHED_FIFO with `priority` (or on the normal scheduler without one), and
/// every other thread is on the normal scheduler.
pub fn assert_real_time_only_on_the_decision_path(
    threads: &[(String, (i32, u32))],
    priority: Option<u32>,
) {
    assert!(
        threads.iter().any(|(name, _)| name == CYCLE_THREAD),
        "no {CYCLE_THREAD} thread in {threads:?}"
    );
    for (name, scheduling) in threads {
        let on_the_path = name == CYCLE_THREAD;
        let wanted = match priority {
            Some(priority) if on_the_path => (libc::SCHED_FIFO, priority),
            _ => (libc::SCHED_OTHER, 0),
        };
        assert_eq!(*scheduling, wanted, "thread {name}: {threads:?}");
    }
}

/// Each thread of `pid`: its name (`comm`, at most 15 bytes) and its scheduling policy
/// and real-time priority (`SCHED_OTHER` and 0 for a normal thread).
pub fn thread_policies(pid: u32) -> Vec<(String, (i32, u32))> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap_or_else(|error| panic!("/proc/{pid}/task: {error}"));
    let mut stats = String::new();
    for task in tasks.flatten() {
        // A thread that ended since the listing is no longer of interest.
        if let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) {
            stats.push_str(&stat);
        }
    }
    threads_in_stats(&stats)
}

/// The threads in `stats`, the `stat` lines of a process's tasks one after another (as
/// `cat /proc/PID/task/*/stat` prints them): name, policy and real-time priority.
pub fn threads_in_stats(stats: &str) -> Vec<(String, (i32, u32))> {
    stats
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|stat| {
            let name = stat
                .split_once('(')
                .and_then(|(_, rest)| rest.rsplit_once(')'))
                .map(|(name, _)| name.to_string())
                .unwrap_or_else(|| panic!("no name in stat {stat:?}"));
            (name, policy_in_stat(stat))
        })
        .collect()
}

/// The scheduling policy and real-time priority in a task's `stat` (fields 41 and 40;
/// the fields after the parenthesised name start at field 3).
pub fn policy_in_stat(stat: &str) -> (i32, u32) {
    let (_, after_name) = stat
        .rsplit_once(')')
        .unwrap_or_else(|| panic!("no name in stat {stat:?}"));
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |number: usize| {
        fields
            .get(number - 3)
            .unwrap_or_else(|| panic!("no field {number} in stat {stat:?}"))
    };
    let priority = field(40).parse().expect("rt_priority");
    let policy = field(41).parse().expect("policy");
    (policy, priority)
}
