//! Detection latency through the agent's own cycle, on a real cgroup v1 memory cgroup.
//!
//! The agent runs as the binary runs it: `agent::run` with its cycle thread, its kernel
//! notifiers, its housekeeping timer competing with them (every 100 ms, so a crossing
//! often finds a timer cycle under way), its pod source (one growing workload and idle
//! pods beside it: 10 pods, then 110, the kubelet's maxPods, each read fresh every
//! cycle), its metrics and a trace recorder. Its one threshold is
//! `allocatableMemory.available<412Mi` on a pods cgroup limited to 512 MiB; it runs in
//! dry-run mode, so it decides and never kills, and one workload process (the
//! oscillator) swings its memory across the trigger and back for every crossing.
//!
//! The pods' cgroups lie where the kubelet makes them (cgroupfs driver):
//! `kubepods/burstable/pod<uid>/<container id>`, the workload in its pod's container
//! cgroup. Each setup is measured with two pod sources, each with an agent of its own:
//! - **standalone**: the pods are the children of `kubepods/burstable`, each read (its
//!   `memory.usage_in_bytes` and `memory.stat`) every cycle;
//! - **kubernetes**: the agent's Kubernetes pod source over the API's pods in a reflector
//!   store, filled as its pod watch fills it (one container each, every third with a
//!   completed init container; no API server: the store does not change during a row),
//!   which reads each pod's cgroup (a container's only for the pod a memory threshold
//!   evicts, to word its message).
//!
//! Each crossing is timed by the workload itself: it reads the cgroup's usage after
//! every 64 KiB step and reports the CLOCK_MONOTONIC time at which the step that
//! reached the trigger started, so a latency includes up to one step more than the true
//! crossing (conservative). Each crossing starts about 4 MiB below the trigger: before
//! each, the workload's memory at rest is moved back there if what others hold in the
//! pods cgroup moved it by 1 MiB or more (the kernel charges it its own memory for every pod cgroup made below
//! it), and a crossing that would start nearer than 2 MiB stops the run, because the
//! kernel checks thresholds too seldom to be sure to signal it. Each row states the
//! least and most its crossings started below the trigger. The decision is timed by a
//! cycle observer the moment the cycle's decision names the workload.
//!
//! Baseline, in the same run before the agent starts: the kernel's own notification
//! (our `MemcgThreshold` on the same cgroup and trigger, read by a thread that does
//! nothing else). memcg v1 checks thresholds only every 128 page events per CPU, so this
//! floor depends on how fast the workload grows.
//!
//! Some rows run SCHED_IDLE spinners on every CPU, which yield to any other task at once;
//! the others run with idle CPUs. Each setup is measured with the listening threads on the
//! normal scheduler and at SCHED_FIFO (the agent's `realtimePriority`): a thread of the
//! normal scheduler, woken while the workload keeps its CPU busy, may wait for the next
//! scheduler tick (4 ms at HZ=250), which is where the baseline's slowest few percent
//! came from (docs/performance.md).
//!
//! Run: `sudo cargo bench --bench detection_latency` (root and the v1 memory controller
//! are required: without them it fails under `CI=true`, and prints SKIPPED and exits 0
//! otherwise). `NODEKEEPER_BENCH_CROSSINGS` sets the crossings per row (default 1000),
//! `NODEKEEPER_BENCH_MAX_PODS` leaves out the agent's rows with more pods than that,
//! `NODEKEEPER_BENCH_MIN_PODS` those with fewer,
//! `NODEKEEPER_BENCH_SCHEDULER=normal` or `=SCHED_FIFO` keeps only the rows of that
//! scheduler, `NODEKEEPER_BENCH_POD_STATS_MAX_AGE` (a Go duration such as `10s`) sets the
//! agent's `podStatsMaxAge`, so that a cycle a notification starts ranks on the pod
//! figures of the last timer cycle; `NODEKEEPER_BENCH_SOURCES` keeps the named pod
//! sources (`standalone,kubernetes`). A full run takes about 75 minutes.
//!
//! During the agent's rows a witness listens too: the same `MemcgThreshold`, registered
//! at the crossing's trigger, read by a thread that does nothing else at a real-time
//! priority above the agent's. The kernel signals both in one pass, so a slow decision
//! whose notification reached both late had a late signal, and one the witness received
//! on time lost its time in the agent thread's wake-up. A row where the witness saw no
//! notification for more than 1% of the crossings (most likely the kernel sent none) did
//! not measure the agent's reaction: its verdict is UNSOUND instead of met or MISSED. Each row also
//! records the CPU time the host stole from the virtual machine, and the header the
//! guest's idle polling (haltpoll), where it has it.
//!
//! Each agent row is also taken apart: crossing → the deciding cycle's start (the
//! notification, and any cycle it had to wait behind) and that start → the decision (the
//! cycle's own collection and decision), with the decisions that waited behind a cycle
//! that read the node's signals before the crossing (a cycle reads its pods first), and,
//! for the slowest, the time since the last decision
//! before the crossing (a cycle goes on after its decision).

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use nodekeeper::agent::RunHandles;
use nodekeeper::config::{AgentConfig, Quantity, ThresholdValue};
use nodekeeper::notify::{MemcgThreshold, memcg_trigger_bytes, page_size};
use nodekeeper::ports::{CycleObserver, CycleReport, CycleStart, ShutdownHooks};
use nodekeeper::shutdown::runner::DryRunTerminator;
use nodekeeper::signals::Host;
use support::allocator::{
    OscillatorPlan, monotonic_nanos, oscillator_grow, oscillator_rebase, oscillator_release,
};
use support::cgroups::TestCgroups;
use support::kube_node::KubeNode;

const MIB: u64 = 1 << 20;
const LIMIT: u64 = 512 * MIB;
/// allocatableMemory.available<412Mi against a 512 MiB limit: trigger at ~100 MiB.
const THRESHOLD: u64 = 412 * MIB;
/// The oscillator rests this far below the trigger and grows this far above it.
const BELOW: u64 = 4 * MIB;
const ABOVE: u64 = 8 * MIB;
/// The oscillator's rest is moved back to BELOW when it has drifted this far from it.
const REBASE_AFTER: u64 = MIB;
/// A crossing begun nearer the trigger than this is not measured. memcg v1 checks
/// thresholds only every 128 page events per CPU (512 KiB with 4 KiB pages), and each
/// CPU may hold up to 64 pages charged ahead, so usage resting that near can cross the
/// trigger and fall back between two checks. With rests 0.14–0.44 MiB below it (before the
/// rest was moved back), the witness saw no notification for a quarter to nearly all of
/// the crossings, and the agent's timer decided them, up to 100 ms late. 2 MiB, four
/// checks' worth, is a judgement, not a measured bound: the UNSOUND verdict is the check.
const LEAST_BELOW: u64 = 2 * MIB;
/// A row where the witness saw no notification for more than this share of crossings
/// is not a measurement of the agent: most likely the kernel did not signal them.
const MOST_UNWITNESSED: f64 = 0.01;
/// The agent's housekeeping timer, competing with the notifier for the cycle thread.
const HOUSEKEEPING: Duration = Duration::from_millis(100);
const GIB_PER_S: (&str, u64) = ("1 GiB/s", 1 << 30);
/// The real-time rows' SCHED_FIFO priority: the listening thread's in the baseline, the
/// agent's `realtimePriority`.
const REALTIME_PRIORITY: u8 = 10;
/// One configuration measured: how fast the workload grows, whether the other CPUs are
/// kept awake, and whether the listening threads run real-time.
#[derive(Clone, Copy, PartialEq)]
struct Setup {
    rate: (&'static str, u64),
    awake: bool,
    realtime: bool,
}

impl Setup {
    const fn new(rate: (&'static str, u64), awake: bool, realtime: bool) -> Setup {
        Setup {
            rate,
            awake,
            realtime,
        }
    }

    fn describe(&self) -> String {
        format!(
            "{} | {} | {}",
            self.rate.0,
            if self.awake { "kept awake" } else { "idle" },
            if self.realtime {
                "SCHED_FIFO"
            } else {
                "normal"
            }
        )
    }
}
/// The baseline's rows: the kernel's notification to a thread that waits for nothing
/// else, for a fast-growing process (at 200 MiB/s the kernel's batching of threshold
/// checks, 2.5 ms at that rate, sets the floor; docs/performance.md has that run).
const KERNEL_ROWS: [Setup; 4] = [
    Setup::new(GIB_PER_S, true, false),
    Setup::new(GIB_PER_S, false, false),
    Setup::new(GIB_PER_S, true, true),
    Setup::new(GIB_PER_S, false, true),
];
/// The agent's rows, in order (pods only grow): pods listed per cycle, and the setup,
/// each with an agent of its own.
const ROWS: [(usize, Setup); 6] = [
    (10, Setup::new(GIB_PER_S, true, false)),
    (10, Setup::new(GIB_PER_S, true, true)),
    (10, Setup::new(GIB_PER_S, false, false)),
    (10, Setup::new(GIB_PER_S, false, true)),
    (110, Setup::new(GIB_PER_S, true, false)),
    (110, Setup::new(GIB_PER_S, true, true)),
];
const GOAL: Duration = Duration::from_millis(2);
/// A decision (or, in a kernel row, a notification) later than this counts as missed: the
/// row goes on, and its verdict says so.
const MISSED_AFTER: Duration = Duration::from_secs(5);
/// A row ends after this many crossings in a row missed: each costs `MISSED_AFTER`.
const MOST_MISSED_IN_A_ROW: usize = 10;
/// A cycle that chose the workload but began reading the node's signals more than this
/// before a crossing cannot have seen it (reading them takes well under a millisecond):
/// its decision is a late one of an earlier crossing, missed.
const STALE_BEFORE: u64 = 1_000_000;
/// The agent's `podStatsMaxAge`, from `NODEKEEPER_BENCH_POD_STATS_MAX_AGE`.
fn pod_stats_max_age() -> Option<nodekeeper::config::GoDuration> {
    const VARIABLE: &str = "NODEKEEPER_BENCH_POD_STATS_MAX_AGE";
    let text = std::env::var(VARIABLE).ok()?;
    let age = nodekeeper::config::GoDuration::parse(&text)
        .unwrap_or_else(|error| panic!("{VARIABLE}={text}: {error}"));
    (!age.is_zero()).then_some(age)
}

/// Twice the notifier's storm spacing, plus margin.
const AFTER_RELEASE: Duration = Duration::from_millis(230);

fn main() {
    support::allocator::run_if_requested();
    let cgroups = require!(
        "the cgroup v1 memory and pids hierarchies",
        TestCgroups::create(&["memory", "pids"])
    );
    let crossings = env_count("NODEKEEPER_BENCH_CROSSINGS", 1000).max(1);
    let scheduler = std::env::var("NODEKEEPER_BENCH_SCHEDULER").ok();
    let measured = |setup: &Setup| match scheduler.as_deref() {
        Some("normal") => !setup.realtime,
        Some("SCHED_FIFO") => setup.realtime,
        _ => true,
    };
    if let Some(other) = scheduler
        .as_deref()
        .filter(|name| !["normal", "SCHED_FIFO"].contains(name))
    {
        panic!("NODEKEEPER_BENCH_SCHEDULER={other}: normal or SCHED_FIFO");
    }
    let mut bench = Bench::new(cgroups);
    let pod_figures = match pod_stats_max_age() {
        Some(age) => format!("pod figures kept for the notified cycles up to {age}"),
        None => "every pod read afresh in every cycle".to_string(),
    };
    println!(
        "{crossings} crossings per row, housekeeping every {HOUSEKEEPING:?}, {pod_figures}; {}",
        halt_polling()
    );

    let kernel_rows: Vec<Setup> = KERNEL_ROWS
        .iter()
        .copied()
        .filter(|setup| measured(setup))
        .collect();
    let (kernel, not_signalled): (Vec<Vec<u64>>, Vec<usize>) = kernel_rows
        .iter()
        .map(|setup| {
            let _spinners = setup.awake.then(Spinners::start);
            let (samples, missed) = bench.kernel_notifications(setup, crossings);
            // Each row as it is measured, so a run cut short keeps what it measured.
            println!(
                "kernel | {} | {} | {missed} not signalled within {MISSED_AFTER:?} | {}",
                setup.describe(),
                spread(&samples),
                bench.take_rest_margins()
            );
            (samples, missed)
        })
        .unzip();
    let max_pods = env_count("NODEKEEPER_BENCH_MAX_PODS", usize::MAX);
    let min_pods = env_count("NODEKEEPER_BENCH_MIN_PODS", 0);
    let sources: Vec<Source> = std::env::var("NODEKEEPER_BENCH_SOURCES")
        .unwrap_or_else(|_| "standalone,kubernetes".to_string())
        .split(',')
        .map(|name| Source::parse(name.trim()))
        .collect();
    // Each setup with each source in turn, so that the two sources' rows of a setup are
    // measured minutes apart, not a whole run.
    let rows: Vec<(usize, Setup, Source)> = ROWS
        .iter()
        .copied()
        .filter(|(pods, setup)| (min_pods..=max_pods).contains(pods) && measured(setup))
        .flat_map(|(pods, setup)| sources.iter().map(move |source| (pods, setup, *source)))
        .collect();
    // The first columns of each agent row in the tables: pods, source and setup.
    let describe_row = |(pods, setup, source): &(usize, Setup, Source)| {
        format!("{pods} | {} | {}", source.as_str(), setup.describe())
    };
    let (decisions, undecided): (Vec<Vec<Decided>>, Vec<usize>) = rows
        .iter()
        .map(|(pods, setup, source)| {
            bench.list_pods(*pods);
            let agent = bench.start_agent(setup.realtime, *source);
            let witness = Witness::start(bench.parent_dir.clone());
            let _spinners = setup.awake.then(Spinners::start);
            let stolen = StolenTime::since_now();
            let (samples, missed) =
                bench.agent_decisions(&agent, &witness, setup.rate.1, crossings);
            let stolen = stolen.so_far();
            agent.stop();
            let triggers = witness.stop();
            println!(
                "agent | {pods} | {} | {} | {} | {} | {} | {} | {missed} undecided within {MISSED_AFTER:?} | {triggers} trigger(s), {stolen}, {}",
                source.as_str(),
                setup.describe(),
                spread(&latencies(&samples)),
                taken_apart(&samples),
                started_by(&samples),
                witnessed(&samples),
                bench.take_rest_margins()
            );
            (samples, missed)
        })
        .unzip();

    println!();
    println!("Milliseconds from the crossing: median / p99 / p99.9 / max.");
    println!();
    println!(
        "| growth | other CPUs | listening thread | crossings | kernel notification (baseline) | not signalled within {MISSED_AFTER:?} |"
    );
    println!("|---|---|---|---|---|---|");
    for ((setup, samples), missed) in kernel_rows.iter().zip(&kernel).zip(&not_signalled) {
        // The baseline of a row whose crossings the kernel did not signal is not the
        // kernel's latency: the bench's own setup is at fault (see "Crossings the kernel
        // never signalled" in docs/performance.md).
        let unsound = *missed as f64 > (samples.len() + missed) as f64 * MOST_UNWITNESSED;
        println!(
            "| {} | {} | {} | {missed}{} |",
            setup.describe(),
            samples.len() + missed,
            spread(samples),
            if unsound { ": UNSOUND" } else { "" }
        );
    }
    println!();
    println!(
        "| pods | source | growth | other CPUs | agent's threads | crossings | agent decision | agent / kernel at median, p99 | p99 goal < 2 ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for ((row, decided), undecided) in rows.iter().zip(&decisions).zip(&undecided) {
        let baseline = kernel_rows
            .iter()
            .position(|kernel| *kernel == row.1)
            .expect("a baseline row for every agent row");
        let kernel = &kernel[baseline];
        let unwitnessed = unwitnessed(decided);
        let decided = &latencies(decided);
        let p99 = percentile(decided, 0.99);
        // Undecided crossings are the agent's failure whatever the kernel did (its timer
        // decides them too): said beside an UNSOUND, never hidden by it.
        let mut verdicts = Vec::new();
        if unwitnessed as f64 > (decided.len() + undecided) as f64 * MOST_UNWITNESSED {
            verdicts.push(format!("UNSOUND: {unwitnessed} crossings not witnessed"));
        }
        if *undecided > 0 {
            verdicts.push(format!(
                "MISSED: {undecided} crossings undecided within {MISSED_AFTER:?}"
            ));
        }
        if verdicts.is_empty() {
            verdicts.push(
                if Duration::from_nanos(p99) < GOAL {
                    "met"
                } else {
                    "MISSED"
                }
                .to_string(),
            );
        }
        let verdict = verdicts.join("; ");
        println!(
            "| {} | {} | {} | {:.2}×, {:.2}× | {verdict} |",
            describe_row(row),
            decided.len() + undecided,
            spread(decided),
            percentile(decided, 0.5) as f64 / percentile(kernel, 0.5).max(1) as f64,
            p99 as f64 / percentile(kernel, 0.99).max(1) as f64,
        );
    }
    println!();
    println!(
        "The agent's decisions taken apart, ms: crossing → the deciding cycle's start, and that start → the decision (median / p99 / p99.9 / max each); decisions that waited behind a cycle that read the node's signals before the crossing and did not choose the workload; decisions after a cycle that read them after the crossing and did not. The slowest list gives, per decision, also the ms from the last decision before the crossing."
    );
    println!();
    println!(
        "| pods | source | growth | other CPUs | agent's threads | crossing → cycle start | cycle start → decision | behind a cycle that read before | after a cycle that missed it |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (row, samples) in rows.iter().zip(&decisions) {
        println!("| {} | {} |", describe_row(row), taken_apart(samples));
    }
    println!();
    println!(
        "What started each deciding cycle (the timer, a notification evaluated at once, notifications the storm limiter held back, a look again after an eviction), and how many of them stopped reading their pods afresh for a notification waiting (`podStatsMaxAge`); over the decisions a notification started, ms: the crossing → the agent's notifier received the kernel's notification, and that → the cycle's start (median / p99 / p99.9 / max each)."
    );
    println!();
    println!(
        "| pods | source | growth | other CPUs | agent's threads | deciding cycles started by | crossing → notification received | notification received → cycle start |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (row, samples) in rows.iter().zip(&decisions) {
        println!("| {} | {} |", describe_row(row), started_by(samples));
    }
    println!();
    println!(
        "The witness (a real-time thread above the agent's, registered at the crossing's trigger) against the agent's notifier, over the decisions a notification started, ms: the crossing → the witness's receipt, and that → the agent's notifier's receipt; the decisions over the goal whose notification reached both more than {LATE_SIGNAL} ns after the crossing (late signal), those where the agent's notifier read it more than {LATE_WAKE_UP} ns after the first receipt (late wake-up), and the others; decisions the witness saw no notification for."
    );
    println!();
    println!(
        "| pods | source | growth | other CPUs | agent's threads | crossing → witness received | witness → agent received | over the goal: late signal, late wake-up, other | not witnessed |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (row, samples) in rows.iter().zip(&decisions) {
        println!("| {} | {} |", describe_row(row), witnessed(samples));
    }
    println!();
    for (setup, samples) in kernel_rows.iter().zip(&kernel) {
        println!("kernel, {}: slowest {}", setup.describe(), slowest(samples));
    }
    for ((pods, setup, source), samples) in rows.iter().zip(&decisions) {
        println!(
            "agent, {pods} pods, {}, {}: slowest {}",
            source.as_str(),
            setup.describe(),
            slowest_taken_apart(samples)
        );
    }
}

/// The agent's decision on one crossing, taken apart (ns).
#[derive(Clone, Copy)]
struct Decided {
    /// Crossing → decision: what the goal is about.
    latency: u64,
    /// Crossing → the deciding cycle's collection start; 0 when the collection began
    /// before the crossing and still read it.
    wake: u64,
    /// The deciding cycle's collection start (or the crossing, if later) → its decision:
    /// `wake + cycle == latency`.
    cycle: u64,
    /// Cycles that read the node's signals before the crossing and decided after it
    /// without choosing the workload: the decision waited behind them.
    behind: usize,
    /// Cycles that read the node's signals after the crossing and did not choose the
    /// workload (the crossing is timed from the start of the step that reached the
    /// trigger, so one may read before usage reached it).
    missed: usize,
    /// The last decision before the crossing → the crossing. The cycle goes on after its
    /// decision (the act, the bookkeeping): a crossing soon after a decision may find
    /// the cycle thread still busy, and wait in `wake`.
    since_last_decision: Option<u64>,
    /// What started the deciding cycle (`timer`, `notification`,
    /// `notification_trailing`, `after_eviction`).
    started_by: &'static str,
    /// The deciding cycle stopped reading its pods afresh for a notification waiting.
    cut_short: bool,
    /// For a deciding cycle woken ahead of its timer: the crossing → when the wake-up was
    /// wanted (the agent's notifier received the kernel's notification, or the first
    /// one held back); negative when it was wanted before the crossing.
    notified: Option<i128>,
    /// The witness's receipt of the kernel's notification of the same crossing.
    witnessed: Option<Witnessed>,
    /// The CPU the agent's cycle thread decided on.
    cpu: i32,
}

/// When the witness received the kernel's notification of a crossing, and where.
#[derive(Clone, Copy)]
struct Witnessed {
    /// Crossing → receipt (ns).
    after_crossing: u64,
    /// The CPU the witness ran on when it read the notification.
    cpu: i32,
}

fn latencies(samples: &[Decided]) -> Vec<u64> {
    samples.iter().map(|sample| sample.latency).collect()
}

/// The row's "crossing → cycle start | cycle start → decision | behind a cycle that read
/// the node's signals before | missed by a cycle that read them after" cells.
fn taken_apart(samples: &[Decided]) -> String {
    let wake: Vec<u64> = samples.iter().map(|sample| sample.wake).collect();
    let cycle: Vec<u64> = samples.iter().map(|sample| sample.cycle).collect();
    let behind = samples.iter().filter(|sample| sample.behind > 0).count();
    let missed = samples.iter().filter(|sample| sample.missed > 0).count();
    format!(
        "{} | {} | {behind} | {missed}",
        spread(&wake),
        spread(&cycle)
    )
}

/// The row's "what started the deciding cycles | crossing → notification received |
/// notification received → cycle start" cells, the last two over the decisions a
/// notification evaluated at once started.
fn started_by(samples: &[Decided]) -> String {
    let count = |name: &str| {
        samples
            .iter()
            .filter(|sample| sample.started_by == name)
            .count()
    };
    let mut counts: Vec<String> = nodekeeper::ports::CycleStart::names()
        .map(|name| format!("{name} {}", count(name)))
        .collect();
    let cut_short = samples.iter().filter(|sample| sample.cut_short).count();
    counts.push(format!("pod reads cut short {cut_short}"));
    // (crossing → received, received → cycle start) of each decision a notification
    // started. Received before the crossing is 0 here: the crossing is timed from the
    // start of the step that reached the trigger.
    let (received, to_cycle): (Vec<u64>, Vec<u64>) = samples
        .iter()
        .filter(|sample| sample.started_by == "notification")
        .filter_map(|sample| {
            let received = u64::try_from(sample.notified?.max(0)).unwrap_or(u64::MAX);
            Some((received, sample.wake.saturating_sub(received)))
        })
        .unzip();
    format!(
        "{} | {} | {}",
        counts.join(", "),
        spread(&received),
        spread(&to_cycle)
    )
}

/// The row's "crossing → witness received | witness → agent's notifier received |
/// decisions over the goal: late signal (both receipts late), late agent wake-up (the
/// agent's notifier late after the first receipt), neither | decisions without a witness
/// receipt" cells, the first two over the decisions a notification evaluated at once
/// started. The agent's notifier may read the notification before the witness (on the
/// other CPU): those count as 0 in the second cell.
fn witnessed(samples: &[Decided]) -> String {
    let pairs: Vec<(u64, i128)> = samples
        .iter()
        .filter(|sample| sample.started_by == "notification")
        .filter_map(|sample| {
            let witness = sample.witnessed?.after_crossing;
            Some((witness, sample.notified? - i128::from(witness)))
        })
        .collect();
    let to_witness: Vec<u64> = pairs.iter().map(|(witness, _)| *witness).collect();
    let to_agent: Vec<u64> = pairs
        .iter()
        .map(|(_, after)| u64::try_from((*after).max(0)).unwrap_or(u64::MAX))
        .collect();
    let agent_first = pairs.iter().filter(|(_, after)| *after < 0).count();
    let goal = u64::try_from(GOAL.as_nanos()).unwrap_or(u64::MAX);
    let (mut late_signal, mut late_agent, mut neither) = (0, 0, 0);
    for sample in samples.iter().filter(|sample| sample.latency > goal) {
        let witness = sample.witnessed.map(|w| i128::from(w.after_crossing));
        // The first of the two receipts: either thread's wake-up can be late on its own.
        let first = match (witness, sample.notified) {
            (Some(witness), Some(notified)) => Some(witness.min(notified)),
            (witness, notified) => witness.or(notified),
        };
        if first.is_some_and(|first| first > i128::from(LATE_SIGNAL)) {
            late_signal += 1;
        } else if sample
            .notified
            .zip(first)
            .is_some_and(|(notified, first)| notified - first > i128::from(LATE_WAKE_UP))
        {
            late_agent += 1;
        } else {
            neither += 1;
        }
    }
    let unwitnessed = unwitnessed(samples);
    format!(
        "{} | {} (agent first {agent_first}) | {late_signal}, {late_agent}, {neither} | {unwitnessed}",
        spread(&to_witness),
        spread(&to_agent)
    )
}

/// The decisions whose crossing the witness saw no notification for.
fn unwitnessed(samples: &[Decided]) -> usize {
    samples.iter().filter(|s| s.witnessed.is_none()).count()
}

/// A notification that reached both the witness and the agent's notifier later than this
/// after the crossing was late in the kernel's signal (or the machine): the real-time
/// baseline's median is about 0.3 ms, and its p99 0.6 ms in most runs.
const LATE_SIGNAL: u64 = 1_000_000;
/// An agent notifier that read the notification later than this after the first receipt
/// was woken late.
const LATE_WAKE_UP: u64 = 500_000;

/// The ten slowest decisions, each as "latency (crossing → start + start → decision;
/// cycles behind, missed; ms since the last decision before the crossing; what started
/// the deciding cycle, with the ms from the crossing to the wake-up it answered, and the
/// CPU the cycle decided on; the ms from the crossing to the witness's receipt, and its
/// CPU)", in ms.
fn slowest_taken_apart(samples: &[Decided]) -> String {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable_by_key(|sample| std::cmp::Reverse(sample.latency));
    let ms = |nanos: u64| nanos as f64 / 1e6;
    let slowest: Vec<String> = sorted
        .iter()
        .take(10)
        .map(|sample| {
            let since = sample
                .since_last_decision
                .map_or("-".to_string(), |nanos| format!("{:.1}", ms(nanos)));
            let mut started_by = match sample.notified {
                Some(nanos) => format!("{} {:.3}", sample.started_by, nanos as f64 / 1e6),
                None => sample.started_by.to_string(),
            };
            if sample.cut_short {
                started_by.push_str(", cut short");
            }
            let witness = sample.witnessed.map_or("no witness".to_string(), |w| {
                format!("witness {:.3} on CPU {}", ms(w.after_crossing), w.cpu)
            });
            format!(
                "{:.3} ({:.3} + {:.3}; {}, {}; {since}; {started_by} on CPU {}; {witness})",
                ms(sample.latency),
                ms(sample.wake),
                ms(sample.cycle),
                sample.behind,
                sample.missed,
                sample.cpu
            )
        })
        .collect();
    slowest.join(", ")
}

/// The five largest samples, in ms: whether a tail is one outlier or a shoulder.
fn slowest(values: &[u64]) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let ms: Vec<String> = sorted
        .iter()
        .take(5)
        .map(|nanos| format!("{:.3}", *nanos as f64 / 1e6))
        .collect();
    ms.join(", ")
}

/// CPU time the host took from this virtual machine's CPUs (`steal` in /proc/stat),
/// from a start: a vCPU the host does not run cannot take a wake-up.
struct StolenTime {
    ticks: Option<u64>,
    started: std::time::Instant,
}

impl StolenTime {
    fn since_now() -> StolenTime {
        StolenTime {
            ticks: steal_ticks(),
            started: std::time::Instant::now(),
        }
    }

    /// "stolen N ms of M CPU-seconds", or that /proc/stat does not say.
    fn so_far(&self) -> String {
        match self.ticks.zip(steal_ticks()) {
            Some((before, now)) => {
                // SAFETY: sysconf has no preconditions.
                let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
                let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
                format!(
                    "stolen {} ms of {:.0} CPU-seconds",
                    now.saturating_sub(before) * 1000 / per_second,
                    self.started.elapsed().as_secs_f64() * cpus as f64
                )
            }
            None => "stolen time unknown".to_string(),
        }
    }
}

/// The `steal` field of /proc/stat's `cpu` line, all CPUs together (USER_HZ ticks).
fn steal_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().find(|line| line.starts_with("cpu "))?;
    cpu.split_whitespace().nth(8)?.parse().ok()
}

/// The guest's idle polling (haltpoll), if it has it: a vCPU that polls before it
/// halts takes a wake-up without an exit to the host.
fn halt_polling() -> String {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .map(|s| s.trim().to_string())
    };
    match (
        read("/sys/devices/system/cpu/cpuidle/current_driver"),
        read("/sys/module/haltpoll/parameters/guest_halt_poll_ns"),
    ) {
        (Some(driver), Some(poll)) => format!("cpuidle driver {driver}, guest_halt_poll_ns {poll}"),
        (Some(driver), None) => format!("cpuidle driver {driver}"),
        _ => "no cpuidle driver".to_string(),
    }
}

/// One SCHED_IDLE busy loop per CPU, stopped when dropped: it keeps every CPU out of
/// its idle state and yields to any other task at once.
struct Spinners {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Spinners {
    fn start() -> Spinners {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = (0..cpus)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let param = libc::sched_param { sched_priority: 0 };
                    // SAFETY: `param` is valid for the call; pid 0 is this thread.
                    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
                    assert_eq!(rc, 0, "sched_setscheduler(SCHED_IDLE) failed");
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Spinners { stop, threads }
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Bench {
    cgroups: TestCgroups,
    /// The standalone agent's configuration; the Kubernetes rows' is made from it.
    config: AgentConfig,
    /// The pods, the workload's first, as the kubelet lays out their cgroups and as the
    /// API lists them.
    node: KubeNode,
    /// The pods cgroup in the memory hierarchy.
    parent_dir: PathBuf,
    oscillator: u32,
    /// What the oscillator holds at rest.
    base: u64,
    /// The most it can hold at rest (its mapping's size less its swing).
    most_base: u64,
    /// How far below the trigger each crossing of the row so far began (bytes).
    rest_margins: Vec<u64>,
    random: u64,
}

/// Where the agent's cycles get the pods from.
#[derive(Clone, Copy, PartialEq)]
enum Source {
    /// The standalone pod listing: every child of the pods' QoS cgroup is a pod.
    Standalone,
    /// The Kubernetes pod source, over a reflector store of the API's pods.
    Kubernetes,
}

impl Source {
    fn parse(name: &str) -> Source {
        match name {
            "standalone" => Source::Standalone,
            "kubernetes" => Source::Kubernetes,
            other => {
                panic!("NODEKEEPER_BENCH_SOURCES: no pod source {other:?} (standalone, kubernetes)")
            }
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Source::Standalone => "standalone",
            Source::Kubernetes => "kubernetes",
        }
    }
}

impl Bench {
    fn new(mut cgroups: TestCgroups) -> Bench {
        cgroups.allocator_args = Vec::new();
        let mut node = KubeNode::create(&mut cgroups, LIMIT);
        node.grow_to(&mut cgroups, 1);
        let workload = node.pods[0].2.clone();
        let parent_dir = cgroups.dir("memory", &node.kubepods);
        let mut config = cgroups.standalone_agent_config(THRESHOLD, HOUSEKEEPING);
        config.paths.pods_cgroup = Some(node.kubepods.clone());
        // Standalone, each pod cgroup is a pod: the workload's holds its container's.
        if let Some(workloads) = config.workloads.as_mut() {
            workloads.parent_cgroup = node.kubepods.join("burstable");
        }
        config.pod_stats_max_age = pod_stats_max_age();
        // Rest BELOW under the trigger, counting what the cgroup already holds.
        let room = trigger(&parent_dir)
            .saturating_sub(read_u64(&parent_dir.join("memory.usage_in_bytes")));
        let step = 64 << 10;
        let base = room.saturating_sub(BELOW) / step * step;
        assert!(base > 0, "the idle pods leave no room below the trigger");
        let plan = OscillatorPlan {
            base,
            top: base + (BELOW + ABOVE) / step * step,
            usage_file: parent_dir.join("memory.usage_in_bytes"),
        };
        let oscillator = cgroups.spawn_oscillator(&workload, &plan);
        Bench {
            cgroups,
            config,
            node,
            parent_dir,
            oscillator,
            base,
            most_base: plan.most_base(),
            rest_margins: Vec::new(),
            random: monotonic_nanos() | 1,
        }
    }

    /// Move the oscillator's rest back to BELOW under `trigger` if it has drifted: every
    /// pod cgroup made below the pods cgroup charges it the kernel's own memory for that
    /// cgroup (about 2.3 MiB for 110 pods' 220 cgroups, of 3.1 MiB more held at rest),
    /// which would leave the crossings of a 110-pod row starting a few hundred KiB below
    /// the trigger. Records how far below it the crossing will start (for the row's
    /// line), and refuses one that would start nearer than LEAST_BELOW.
    fn rest_below(&mut self, trigger: u64) {
        let usage_file = self.parent_dir.join("memory.usage_in_bytes");
        let margin = |usage: u64| i128::from(trigger) - i128::from(usage);
        let drift = margin(read_u64(&usage_file)) - i128::from(BELOW);
        if drift.unsigned_abs() >= u128::from(REBASE_AFTER) {
            let step = 64 << 10;
            let wanted = (i128::from(self.base) + drift) / step * step;
            let base = u64::try_from(wanted)
                .ok()
                .filter(|base| (1..=self.most_base).contains(base))
                .unwrap_or_else(|| {
                    panic!(
                        "the pods cgroup holds {} bytes at rest, the workload {} of them: it cannot hold {wanted} (1 to {} bytes) to rest {BELOW} bytes below the trigger {trigger}",
                        read_u64(&usage_file),
                        self.base,
                        self.most_base
                    )
                });
            oscillator_rebase(self.cgroups.child_mut(self.oscillator), base);
            self.base = base;
        }
        let usage = read_u64(&usage_file);
        let below = u64::try_from(margin(usage)).unwrap_or(0);
        assert!(
            below >= LEAST_BELOW,
            "the crossing would start {below} bytes below the trigger {trigger} (usage {usage}), nearer than {LEAST_BELOW}: the kernel might not signal it"
        );
        self.rest_margins.push(below);
    }

    /// "rest a–b MiB below the trigger" over the crossings since the last call.
    fn take_rest_margins(&mut self) -> String {
        let margins = std::mem::take(&mut self.rest_margins);
        let mib = |bytes: Option<&u64>| bytes.map_or(0.0, |b| *b as f64 / MIB as f64);
        format!(
            "rest {:.2}–{:.2} MiB below the trigger",
            mib(margins.iter().min()),
            mib(margins.iter().max())
        )
    }

    /// Grow to `pods` pods. The idle ones have no processes: reading an idle pod's
    /// cgroups costs what reading a busy one's does (the same files), and they leave the
    /// memory under the trigger unchanged.
    fn list_pods(&mut self, pods: usize) {
        self.node.grow_to(&mut self.cgroups, pods);
    }

    /// The workload's pod as `source` names it: its cgroup's name standalone, its API
    /// name in Kubernetes mode.
    fn workload_name(&self, source: Source) -> String {
        let (api, cgroup, _) = &self.node.pods[0];
        match source {
            Source::Standalone => cgroup
                .file_name()
                .and_then(|name| name.to_str())
                .expect("a pod cgroup's name")
                .to_string(),
            Source::Kubernetes => api.metadata.name.clone().expect("a pod's name"),
        }
    }

    /// Rest between crossings for `at_least`, plus up to 100 ms at random so crossings
    /// fall at random phases of the agent's timer.
    fn rest(&mut self, at_least: Duration) {
        self.random ^= self.random << 13;
        self.random ^= self.random >> 7;
        self.random ^= self.random << 17;
        std::thread::sleep(at_least + Duration::from_millis(self.random % 100));
    }

    /// Grow across the trigger at `rate`; the crossing time.
    fn cross(&mut self, rate: u64, trigger: u64) -> u64 {
        let child = self.cgroups.child_mut(self.oscillator);
        oscillator_grow(child, trigger, rate).unwrap_or_else(|| {
            panic!("usage never reached the trigger {trigger} (inactive file pages moved it by more than {ABOVE} bytes?)")
        })
    }

    fn release(&mut self) {
        oscillator_release(self.cgroups.child_mut(self.oscillator));
    }

    /// The baseline: crossing → the kernel's eventfd notification, read by a thread that
    /// does nothing else; and how many crossings the kernel did not signal.
    fn kernel_notifications(&mut self, setup: &Setup, crossings: usize) -> (Vec<u64>, usize) {
        let trigger = trigger(&self.parent_dir);
        let realtime = setup.realtime;
        let (events, notified) = mpsc::channel();
        let dir = self.parent_dir.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let listener = on_runtime_thread(move || async move {
            if realtime {
                nodekeeper::process::run_this_thread_realtime(REALTIME_PRIORITY)
                    .expect("SCHED_FIFO for the listening thread");
            }
            let mut threshold = MemcgThreshold::register(&dir, trigger).unwrap();
            let _ = events.send(0);
            let listen = async {
                while threshold.crossed().await.is_ok() {
                    if events.send(monotonic_nanos()).is_err() {
                        break;
                    }
                }
            };
            tokio::select! {
                () = listen => {}
                _ = stopped => {}
            }
        });
        notified.recv().unwrap();
        let samples = self.time_crossings(
            &notified,
            |events, _, crossed| {
                first_after(events, crossed, MISSED_AFTER, |at| *at).map(|at| at - crossed)
            },
            setup.rate.1,
            crossings,
            Duration::from_millis(20),
            |_| trigger,
            "kernel notification",
        );
        let _ = stop.send(());
        listener.join().unwrap();
        samples
    }

    /// An agent of its own for a row; with `realtime`, its decision cycle thread (on
    /// which the kernel notifiers wait) runs at SCHED_FIFO (checked).
    fn start_agent(&self, realtime: bool, source: Source) -> RunningAgent {
        let (cycles_tx, cycles) = mpsc::channel();
        let (started_tx, started) = mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let mut config = self.config.clone();
        config.realtime_priority = realtime.then_some(REALTIME_PRIORITY);
        let workload = self.workload_name(source);
        let node = (source == Source::Kubernetes).then(|| {
            config.workloads = None;
            self.node.clone()
        });
        let trace = tempfile::tempdir().unwrap();
        let trace_path = trace.path().join("trace.jsonl");
        let thread = on_runtime_thread(move || async move {
            let host = Host::detect(&config.paths);
            let pod_source = node.map(|node| node.pod_source(&config));
            let customize = move |agent: &mut nodekeeper::agent::Agent| {
                agent.set_recorder(nodekeeper::agent::Recorder::new(trace_path, 64 << 20));
                agent.add_cycle_observer(Box::new(DecisionClock {
                    cycles: cycles_tx,
                    workload,
                }));
                if let Some(source) = pod_source {
                    agent.set_pod_source(source);
                }
            };
            let on_start = move |_: RunHandles| {
                let _ = started_tx.send(());
            };
            nodekeeper::agent::run(
                config,
                host,
                None::<ShutdownHooks<DryRunTerminator>>,
                std::sync::Arc::new(nodekeeper::systemd::notify::ServiceManagerLink::none()),
                async {
                    let _ = stopped.await;
                },
                customize,
                on_start,
            )
            .await
            .unwrap();
        });
        started.recv().unwrap();
        // The agent starts its threads after it says it has started, and each thread
        // moves itself to the real-time scheduler as it begins.
        let named = [support::scheduling::CYCLE_THREAD];
        let wanted = if realtime {
            (libc::SCHED_FIFO, u32::from(REALTIME_PRIORITY))
        } else {
            (libc::SCHED_OTHER, 0)
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let policies = support::scheduling::thread_policies(std::process::id());
            let as_wanted = named.iter().all(|thread| {
                policies
                    .iter()
                    .any(|(name, scheduling)| name == thread && *scheduling == wanted)
            });
            if as_wanted {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the agent's {named:?} threads are not at {wanted:?}: {policies:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        RunningAgent {
            cycles,
            stop,
            thread,
            _trace: trace,
        }
    }

    /// Crossing → the agent's decision to evict the workload, through its own cycle, and
    /// → the witness's receipt of the kernel's notification of the same crossing; and how
    /// many crossings the agent did not decide on.
    fn agent_decisions(
        &mut self,
        agent: &RunningAgent,
        witness: &Witness,
        rate: u64,
        crossings: usize,
    ) -> (Vec<Decided>, usize) {
        // The release's own crossing woke the agent, and the notifier's storm limiter
        // holds a wake-up within 100 ms of that one for a trailing evaluation at its end:
        // rest past both, so the next crossing is news. The agent's trigger follows the
        // inactive file pages, so each crossing's is computed afresh, and the witness
        // registered at it.
        self.time_crossings(
            &agent.cycles,
            |cycles, last, crossed| {
                let mut decided = decision_after(cycles, last, crossed)?;
                decided.witnessed = witness.received_after(crossed);
                Some(decided)
            },
            rate,
            crossings,
            AFTER_RELEASE,
            |parent_dir| {
                let trigger = trigger(parent_dir);
                witness.arm(trigger);
                trigger
            },
            "agent decision",
        )
    }

    /// Cross the trigger `crossings` times at `rate`, resting `rest` (plus up to 100 ms)
    /// before each; each sample is what `sample` makes of `events` after the crossing
    /// (given the last event before the crossing began, and the crossing's time).
    /// `trigger_now`: the trigger to cross, asked after each rest. Also returns how many
    /// crossings had no sample (`what` is logged for each): the row goes on, and its
    /// verdict says so.
    #[allow(clippy::too_many_arguments)]
    fn time_crossings<E, S>(
        &mut self,
        events: &mpsc::Receiver<E>,
        sample: impl Fn(&mpsc::Receiver<E>, Option<E>, u64) -> Option<S>,
        rate: u64,
        crossings: usize,
        rest: Duration,
        mut trigger_now: impl FnMut(&Path) -> u64,
        what: &str,
    ) -> (Vec<S>, usize) {
        let mut samples = Vec::with_capacity(crossings);
        let (mut missed, mut missed_in_a_row) = (0, 0);
        for _ in 0..crossings {
            self.rest(rest);
            let mut last = None;
            while let Ok(event) = events.try_recv() {
                last = Some(event);
            }
            let trigger = trigger_now(&self.parent_dir);
            self.rest_below(trigger);
            let crossed = self.cross(rate, trigger);
            match sample(events, last, crossed) {
                Some(taken) => {
                    samples.push(taken);
                    missed_in_a_row = 0;
                }
                None => {
                    missed += 1;
                    missed_in_a_row += 1;
                    eprintln!("no {what} within {MISSED_AFTER:?} of a crossing");
                }
            }
            self.release();
            if missed_in_a_row == MOST_MISSED_IN_A_ROW {
                eprintln!(
                    "{MOST_MISSED_IN_A_ROW} crossings in a row without a {what}: the row ends"
                );
                break;
            }
        }
        (samples, missed)
    }
}

struct RunningAgent {
    cycles: mpsc::Receiver<Cycle>,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
    _trace: tempfile::TempDir,
}

impl RunningAgent {
    fn stop(self) {
        let _ = self.stop.send(());
        self.thread.join().unwrap();
    }
}

/// A second listener on the agent's rows: our `MemcgThreshold` registered at the trigger
/// the bench computes for the crossing (the agent computes its own from the same
/// figures), read by a thread that does nothing else, at a real-time priority above the
/// agent's, so that when both are woken on one CPU it reads first. The kernel signals
/// every threshold a charge crosses in one pass, so the two receipts come from the same
/// signal: a decision whose notification reached both late had a late signal (or the
/// whole virtual machine stalled); one whose notification reached the witness on time
/// and the agent late lost its time in the agent thread's wake-up. Reading its
/// notification, the witness preempts whatever runs on its CPU (the agent's thread too)
/// for as long as that takes (not measured).
struct Witness {
    triggers: tokio::sync::watch::Sender<u64>,
    /// The triggers the witness has registered, in order.
    registered: mpsc::Receiver<u64>,
    /// (CLOCK_MONOTONIC ns, CPU) of each notification read.
    received: mpsc::Receiver<(u64, i32)>,
    armed: std::cell::Cell<Option<u64>>,
    /// Different triggers registered over the row.
    distinct: std::cell::Cell<usize>,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

/// The witness's real-time priority: above the agent's, so it reads first.
const WITNESS_PRIORITY: u8 = REALTIME_PRIORITY + 1;

impl Witness {
    fn start(dir: PathBuf) -> Witness {
        let (triggers, mut wanted) = tokio::sync::watch::channel(0_u64);
        let (registered_tx, registered) = mpsc::channel();
        let (received_tx, received) = mpsc::channel();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = on_runtime_thread(move || async move {
            nodekeeper::process::run_this_thread_realtime(WITNESS_PRIORITY)
                .expect("SCHED_FIFO for the witness");
            let mut threshold: Option<MemcgThreshold> = None;
            loop {
                // The branches' futures end with the select, before `threshold` is
                // replaced.
                let crossed = tokio::select! {
                    changed = wanted.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        None
                    }
                    read = async {
                        match threshold.as_mut() {
                            Some(threshold) => threshold.crossed().await,
                            None => std::future::pending().await,
                        }
                    } => Some(read),
                    _ = &mut stopped => return,
                };
                match crossed {
                    Some(read) => {
                        read.expect("read the witness's eventfd");
                        let at = monotonic_nanos();
                        // SAFETY: sched_getcpu has no arguments and no preconditions.
                        let cpu = unsafe { libc::sched_getcpu() };
                        if received_tx.send((at, cpu)).is_err() {
                            return;
                        }
                    }
                    None => {
                        let trigger = *wanted.borrow_and_update();
                        // The old registration is dropped (unregistered) first.
                        drop(threshold.take());
                        threshold = Some(
                            MemcgThreshold::register(&dir, trigger)
                                .expect("register the witness's threshold"),
                        );
                        if registered_tx.send(trigger).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Witness {
            triggers,
            registered,
            received,
            armed: std::cell::Cell::new(None),
            distinct: std::cell::Cell::new(0),
            stop,
            thread,
        }
    }

    /// Registered at `trigger` (at once if it already is), before the crossing begins.
    fn arm(&self, trigger: u64) {
        if self.armed.get() == Some(trigger) {
            return;
        }
        self.triggers
            .send(trigger)
            .expect("the witness is listening");
        loop {
            let registered = self
                .registered
                .recv_timeout(Duration::from_secs(5))
                .expect("the witness registers its threshold within 5 s");
            if registered == trigger {
                break;
            }
        }
        self.armed.set(Some(trigger));
        self.distinct.set(self.distinct.get() + 1);
    }

    /// The witness's first receipt at or after `crossed` (waited for briefly: it comes
    /// before or about when the agent decides).
    fn received_after(&self, crossed: u64) -> Option<Witnessed> {
        let (at, cpu) = first_after(
            &self.received,
            crossed,
            Duration::from_millis(200),
            |(at, _)| *at,
        )?;
        Some(Witnessed {
            after_crossing: at - crossed,
            cpu,
        })
    }

    /// Stop; the number of different triggers it registered.
    fn stop(self) -> usize {
        let _ = self.stop.send(());
        self.thread.join().unwrap();
        self.distinct.get()
    }
}

/// Run the future `make` builds on a current-thread runtime of its own thread (as the
/// agent binary runs), until it completes.
fn on_runtime_thread<F, Fut>(make: F) -> std::thread::JoinHandle<()>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(make());
    })
}

/// One cycle of the agent, CLOCK_MONOTONIC ns: when its collection started, when it
/// decided, and whether it chose the workload.
struct Cycle {
    started: u64,
    /// When it began reading the node's signals (after its pods).
    signals_read: u64,
    decided: u64,
    evicts: bool,
    /// What started it (the `started_by` label of `nodekeeper_cycles_total`).
    started_by: &'static str,
    /// It stopped reading its pods afresh for a notification waiting.
    cut_short: bool,
    /// For a cycle woken ahead of its timer: since when the wake-up was wanted (for a
    /// notification, when the agent's notifier received the kernel's; for one the storm
    /// limiter held back, the first of those held).
    woken_since: Option<u64>,
    /// The CPU the cycle thread decided on.
    cpu: i32,
}

/// Timestamps every cycle as it hands its report on (right after the decision).
struct DecisionClock {
    cycles: mpsc::Sender<Cycle>,
    /// The workload's pod, as the row's pod source names it.
    workload: String,
}

impl CycleObserver for DecisionClock {
    fn observe(&mut self, report: &CycleReport) {
        let decided = monotonic_nanos();
        let since = |at: std::time::Instant| {
            decided.saturating_sub(u64::try_from(at.elapsed().as_nanos()).unwrap_or(u64::MAX))
        };
        let woken_since = match report.started_by {
            CycleStart::Timer => None,
            CycleStart::Woken(wakeup) => Some(since(wakeup.since.into_std())),
        };
        // SAFETY: sched_getcpu has no arguments and no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        let _ = self.cycles.send(Cycle {
            cpu,
            started: since(report.collection_started),
            signals_read: since(report.signals_read_at),
            decided,
            evicts: report
                .decision
                .evictions
                .iter()
                .any(|e| e.name == self.workload),
            started_by: report.started_by.as_str(),
            cut_short: report.pod_reads_cut_short,
            woken_since,
        });
    }
}

/// The first cycle to decide on the workload at or after `crossed`, taken apart;
/// `last`: the last cycle seen before the crossing began.
fn decision_after(
    cycles: &mpsc::Receiver<Cycle>,
    mut last: Option<Cycle>,
    crossed: u64,
) -> Option<Decided> {
    let deadline = std::time::Instant::now() + MISSED_AFTER;
    let (mut behind, mut missed) = (0, 0);
    loop {
        let left = deadline.checked_duration_since(std::time::Instant::now())?;
        let cycle = cycles.recv_timeout(left).ok()?;
        if cycle.decided < crossed {
            last = Some(cycle);
            continue;
        }
        if !cycle.evicts {
            if cycle.signals_read < crossed {
                behind += 1;
            } else {
                missed += 1;
            }
            continue;
        }
        if cycle.signals_read.saturating_add(STALE_BEFORE) < crossed {
            last = Some(cycle);
            continue;
        }
        let begun = cycle.started.max(crossed);
        return Some(Decided {
            latency: cycle.decided - crossed,
            wake: begun - crossed,
            cycle: cycle.decided - begun,
            behind,
            missed,
            since_last_decision: last.map(|last| crossed.saturating_sub(last.decided)),
            started_by: cycle.started_by,
            cut_short: cycle.cut_short,
            notified: cycle
                .woken_since
                .map(|since| i128::from(since) - i128::from(crossed)),
            witnessed: None,
            cpu: cycle.cpu,
        });
    }
}

/// The first event timestamped (`at`) at or after `crossed`, waited for up to `wait`;
/// earlier ones belong to the last crossing.
fn first_after<E>(
    events: &mpsc::Receiver<E>,
    crossed: u64,
    wait: Duration,
    at: impl Fn(&E) -> u64,
) -> Option<E> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        let left = deadline.checked_duration_since(std::time::Instant::now())?;
        match events.recv_timeout(left) {
            Ok(event) if at(&event) >= crossed => return Some(event),
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

fn threshold() -> ThresholdValue {
    ThresholdValue::Quantity(Quantity::from_value(THRESHOLD as i64))
}

/// The usage at which the agent's threshold is met now, as its notifier computes it.
fn trigger(parent_dir: &Path) -> u64 {
    let stat = std::fs::read_to_string(parent_dir.join("memory.stat")).unwrap();
    let inactive_file = stat
        .lines()
        .find_map(|line| line.strip_prefix("total_inactive_file "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0);
    memcg_trigger_bytes(LIMIT as i64, threshold(), inactive_file, page_size())
        .expect("the threshold is within the limit")
}

fn read_u64(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Nearest-rank percentile (the p99 of fewer than 100 samples is the maximum).
fn percentile(values: &[u64], p: f64) -> u64 {
    let mut sorted = values.to_vec();
    if sorted.is_empty() {
        return 0;
    }
    sorted.sort_unstable();
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn spread(values: &[u64]) -> String {
    let ms = |nanos: u64| nanos as f64 / 1e6;
    format!(
        "{:.3} / {:.3} / {:.3} / {:.3}",
        ms(percentile(values, 0.5)),
        ms(percentile(values, 0.99)),
        ms(percentile(values, 0.999)),
        ms(percentile(values, 1.0))
    )
}
