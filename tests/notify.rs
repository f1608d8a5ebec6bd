//! Kernel notifiers: the v1 memcg threshold against a real cgroup on this machine, and PSI
//! triggers and `memory.events` on fake files (PSI is disabled on this kernel and the
//! memory controller is on v1, so those cannot be exercised for real here); and, on a
//! fake node, that a crossing while a cycle reads its pods is decided by that cycle, and
//! that a notification then leaves the pods not yet read to their kept figures.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nodekeeper::config::{AgentConfig, Quantity, Threshold, ThresholdValue};
use nodekeeper::notify::{
    CycleWake, Mechanism, MemcgThreshold, MemoryEventsWatch, NotifierSettings, Notifiers,
    PsiReadiness, PsiTrigger, PsiTriggerSpec, WakeReason,
};
use nodekeeper::ports::CycleStart;
use nodekeeper::signals::{CgroupReader, Collection, NotificationSupport, SignalCollector};
use nodekeeper::signals::{NotificationsWaiting, Signal, probe};
use nodekeeper::systemd::notify::{NotifyTarget, ServiceManagerLink};
use support::allocator::{AllocatorPlan, OscillatorPlan, oscillator_grow};
use support::apiserver::eventually;
use support::cgroups::TestCgroups;

const MIB: u64 = 1 << 20;
/// Generous bound for "the notification arrives"; it normally takes milliseconds.
const ARRIVAL: Duration = Duration::from_secs(20);

#[test]
#[ignore = "helper process for the real-cgroup tests, not a test by itself"]
fn allocator_child() {
    support::allocator::run_if_requested();
}

/// `memory.usage_in_bytes` of the v1 memory cgroup directory `dir`, as the kernel
/// compares it with a threshold.
fn usage_in(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join("memory.usage_in_bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Start an allocator of `bytes` in the test's parent cgroup and wait until the parent
/// uses at least `at_least`.
async fn grow_past(cgroups: &mut TestCgroups, bytes: u64, at_least: u64) {
    let parent = cgroups.parent.clone();
    cgroups.spawn_allocator(&parent, &growing_to(bytes));
    let dir = cgroups.dir("memory", &parent);
    let what = format!("{} to use {at_least} bytes", dir.display());
    eventually(ARRIVAL, &what, || {
        (usage_in(&dir) >= at_least).then_some(())
    })
    .await;
}

/// An allocator that grows to `bytes` at 400 MiB/s and holds them.
fn growing_to(bytes: u64) -> AllocatorPlan {
    AllocatorPlan {
        bytes,
        rate: 400 * MIB,
        ignore_sigterm: false,
        report_crossing: None,
    }
}

#[tokio::test]
async fn memcg_threshold_fires_when_a_real_cgroup_crosses_it() {
    let mut cgroups = require!(
        "the cgroup v1 memory hierarchy",
        TestCgroups::create(&["memory"])
    );
    let parent = cgroups.parent.clone();
    cgroups.set_memory_limit(&parent, 256 * MIB);
    let dir = cgroups.dir("memory", &parent);
    let usage = || usage_in(&dir);
    let trigger = 100 * MIB;
    let mut threshold = MemcgThreshold::register(&dir, trigger).unwrap();
    assert!(usage() < trigger);

    cgroups.spawn_allocator(&parent, &growing_to(160 * MIB));
    let crossings = tokio::time::timeout(ARRIVAL, threshold.crossed())
        .await
        .expect("no memcg threshold notification")
        .unwrap();
    assert!(crossings >= 1);
    assert!(
        usage() >= trigger,
        "notified at {} bytes, below the trigger",
        usage()
    );
}

/// An agent configuration whose one threshold is `allocatableMemory.available<150Mi`,
/// measured on the pods cgroup `parent`.
fn allocatable_threshold_on(parent: &Path) -> AgentConfig {
    let mut config = AgentConfig::default();
    config.paths.pods_cgroup = Some(parent.to_path_buf());
    config.eviction.thresholds = vec![Threshold {
        signal: Signal::AllocatableMemoryAvailable,
        value: ThresholdValue::Quantity(Quantity::from_value((150 * MIB) as i64)),
        grace_period: Default::default(),
        min_reclaim: None,
    }];
    config
}

/// A v1 memory cgroup of 256 MiB standing for the pods cgroup, with the 150 MiB
/// `allocatableMemory.available` threshold of [`allocatable_threshold_on`] on it.
fn pods_cgroup_of_256_mib() -> Result<(TestCgroups, AgentConfig), String> {
    let cgroups = TestCgroups::create(&["memory"])?;
    let parent = cgroups.parent.clone();
    cgroups.set_memory_limit(&parent, 256 * MIB);
    Ok((cgroups, allocatable_threshold_on(&parent)))
}

/// The notifiers for `config` as the agent starts them, on a host with memcg thresholds.
fn memcg_notifiers(
    config: &AgentConfig,
    settings: NotifierSettings,
    wake: Arc<CycleWake>,
) -> Notifiers {
    let support = probe(&config.paths);
    assert!(support.memcg_eventfd_v1, "{support}");
    Notifiers::start(
        config,
        CgroupReader::detect(&config.paths.cgroup_root).ok(),
        &support,
        settings,
        wake,
    )
}

/// The trigger is set from the cycle's own collection: the notifiers read no memory file
/// of their own, so a figure the collection holds (here, 20 MiB of inactive file pages
/// the new cgroup does not really have) is the one the trigger follows.
#[tokio::test]
async fn the_memcg_trigger_follows_the_collections_figures_without_reading_again() {
    let (_cgroups, config) = require!("the cgroup v1 memory hierarchy", pods_cgroup_of_256_mib());
    let mut notifiers = memcg_notifiers(
        &config,
        NotifierSettings::default(),
        Arc::new(CycleWake::new()),
    );
    let mut collection = SignalCollector::new(&config.paths).collect();
    let usage = collection
        .memory_usage
        .get_mut(&Signal::AllocatableMemoryAvailable)
        .expect("the pods cgroup's memory figures are in the collection");
    assert!(usage.inactive_file_bytes < MIB, "{usage:?}");
    usage.inactive_file_bytes = 20 * MIB;
    notifiers.update(&collection);
    // 256 MiB capacity − 150 MiB threshold + the collection's 20 MiB.
    let trigger = registered_trigger(&notifiers);
    assert!(
        (126 * MIB..127 * MIB).contains(&trigger),
        "trigger {trigger}"
    );
}

#[tokio::test]
async fn notifiers_register_the_allocatable_trigger_and_wake_the_agent() {
    let (mut cgroups, config) =
        require!("the cgroup v1 memory hierarchy", pods_cgroup_of_256_mib());
    let parent = cgroups.parent.clone();
    let wake = Arc::new(CycleWake::new());
    let mut notifiers = memcg_notifiers(&config, NotifierSettings::default(), wake.clone());
    let collection = SignalCollector::new(&config.paths).collect();
    notifiers.update(&collection);

    let armed = notifiers.armed();
    assert_eq!(armed.len(), 1, "{armed:?}");
    assert_eq!(armed[0].mechanism, Mechanism::MemcgThreshold);
    assert_eq!(armed[0].path, cgroups.dir("memory", &parent));
    // 256 MiB capacity − 150 MiB threshold + inactive file pages (none in a new cgroup).
    let trigger: u64 = armed[0].trigger.parse().unwrap();
    assert!(
        (106 * MIB..107 * MIB).contains(&trigger),
        "trigger {trigger}"
    );

    let waiting = notifiers.waiting().expect("notifications can be asked for");
    assert!(!waiting.any(), "a notification waits before any crossing");
    cgroups.spawn_allocator(&parent, &growing_to(180 * MIB));
    // The kernel's signal, seen without awaiting (the notifier's task, which would read
    // it, does not run meanwhile), as a cycle reading its pods sees it.
    support::poll::Wait::for_("the crossing to wait unread", ARRIVAL).until_true(|| waiting.any());
    tokio::time::timeout(ARRIVAL, wake.woken())
        .await
        .expect("the agent was not woken: asking took the notification");
    let counts = notifiers.counts();
    assert!(counts.memcg_crossings >= 1, "{counts:?}");
    assert!(counts.evaluations >= 1, "{counts:?}");
}

/// The one memcg trigger `notifiers` hold registered now.
fn registered_trigger(notifiers: &Notifiers) -> u64 {
    let armed = notifiers.armed();
    assert_eq!(armed.len(), 1, "{armed:?}");
    armed[0].trigger.parse().unwrap()
}

/// Wait until the kernel has signalled `crossings` memcg threshold crossings in all.
async fn memcg_crossings(notifiers: &Notifiers, crossings: u64) {
    let what = format!("{crossings} memcg crossings signalled");
    eventually(ARRIVAL, &what, || {
        (notifiers.counts().memcg_crossings >= crossings).then_some(())
    })
    .await;
}

/// The kernel stores a memcg threshold in whole pages and treats one that usage has
/// reached as crossed, while the threshold is met only when available is below it. With
/// the threshold's point exactly at today's usage (available equal to the threshold, not
/// met), the trigger must be the next page: a trigger at the point itself would count as
/// crossed already, and growth past the threshold would never be signalled.
#[tokio::test]
async fn a_threshold_at_todays_usage_is_signalled_when_usage_grows_past_it() {
    let (mut cgroups, allocatable_config) =
        require!("the cgroup v1 memory hierarchy", pods_cgroup_of_256_mib());
    let parent = cgroups.parent.clone();
    let workload = cgroups.child("workload");
    let dir = cgroups.dir("memory", &parent);
    let oscillator = cgroups.spawn_oscillator(
        &workload,
        &OscillatorPlan {
            base: 8 * MIB,
            top: 24 * MIB,
            usage_file: dir.join("memory.usage_in_bytes"),
        },
    );
    let signal = Signal::AllocatableMemoryAvailable;
    let page = nodekeeper::notify::page_size();
    // The kernel's per-CPU charge batches can move an idle cgroup's usage by a few pages
    // at any time: set up again until usage held still from the collection to the
    // registration.
    let (notifiers, trigger) = (0..10)
        .find_map(|_| {
            let mut config = allocatable_config.clone();
            let collection = SignalCollector::new(&config.paths).collect();
            let (observation, usage) = (
                collection.observations[&signal],
                collection.memory_usage[&signal],
            );
            // Available equals the threshold: capacity − threshold + inactive_file is
            // the usage.
            config.eviction.thresholds[0].value = ThresholdValue::Quantity(Quantity::from_value(
                observation.capacity - usage.working_set_bytes() as i64,
            ));
            let mut notifiers = memcg_notifiers(
                &config,
                NotifierSettings::default(),
                Arc::new(CycleWake::new()),
            );
            notifiers.update(&collection);
            let trigger = registered_trigger(&notifiers);
            assert_eq!(trigger, usage.usage_bytes + page, "{usage:?}");
            (usage_in(&dir) == usage.usage_bytes).then_some((notifiers, trigger))
        })
        .expect("usage never held still for a registration");
    // Time for a signal to arrive, were there one to come before growth.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        notifiers.counts().memcg_crossings,
        0,
        "signalled before usage grew (usage now {})",
        usage_in(&dir)
    );

    let grown = oscillator_grow(cgroups.child_mut(oscillator), trigger, 0);
    assert!(grown.is_some(), "usage never reached the trigger {trigger}");
    memcg_crossings(&notifiers, 1).await;
}

/// The kernel does not signal a trigger that usage had already reached when it was
/// registered. A registration wakes a cycle for a crossing that happened after the
/// collection it was computed from, and only then: a crossing the collection showed was
/// decided on by the cycle that read it, and waking again would repeat that decision for
/// every cycle the trigger moves in.
#[tokio::test]
async fn a_registration_wakes_a_cycle_only_for_a_crossing_its_collection_did_not_show() {
    let (mut cgroups, config) =
        require!("the cgroup v1 memory hierarchy", pods_cgroup_of_256_mib());
    let collector = SignalCollector::new(&config.paths);
    let before_the_crossing = collector.collect();
    // 256 MiB − 150 MiB: the trigger sits at about 106 MiB.
    grow_past(&mut cgroups, 120 * MIB, 115 * MIB).await;

    let mut shown = memcg_notifiers(
        &config,
        NotifierSettings::default(),
        Arc::new(CycleWake::new()),
    );
    shown.update(&collector.collect());
    let trigger = registered_trigger(&shown);
    assert!(
        trigger < 115 * MIB,
        "the trigger {trigger} is not below usage"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(shown.counts().wakeups, 0, "{:?}", shown.counts());

    let mut missed = memcg_notifiers(
        &config,
        NotifierSettings::default(),
        Arc::new(CycleWake::new()),
    );
    missed.update(&before_the_crossing);
    eventually(
        ARRIVAL,
        "a wake-up for the crossing after the collection",
        || (missed.counts().wakeups > 0).then_some(()),
    )
    .await;
}

/// Settings that hold a registered memcg trigger against any move of up to 64 MiB for an
/// hour, so that only the rules that replace one at once can move it.
fn slow_to_refresh() -> NotifierSettings {
    NotifierSettings {
        memcg_refresh: nodekeeper::notify::RefreshPolicy {
            min_interval: Duration::from_secs(3600),
            tolerance_bytes: 64 * MIB,
        },
        ..NotifierSettings::default()
    }
}

/// `collection` as if the pods cgroup held `bytes` more of inactive file pages (page cache
/// grown since): the same usage, a smaller working set.
fn with_more_inactive_file(mut collection: Collection, bytes: u64) -> Collection {
    collection
        .memory_usage
        .get_mut(&Signal::AllocatableMemoryAvailable)
        .expect("the pods cgroup's memory figures are in the collection")
        .inactive_file_bytes += bytes;
    collection
}

/// The kernel signals a memcg threshold once per crossing. When the cycle it woke finds
/// more inactive file pages than the trigger was computed with (page cache grew since),
/// the working set is still below the threshold and usage is already past the trigger, so
/// the kernel will not signal again while usage grows. The trigger follows that cycle's
/// collection at once, however small the move (a 64 MiB tolerance and an hour's interval
/// would hold any other), and the next crossing is signalled.
#[tokio::test]
async fn a_trigger_reached_under_an_unmet_threshold_follows_the_collection_and_fires_again() {
    let (mut cgroups, config) =
        require!("the cgroup v1 memory hierarchy", pods_cgroup_of_256_mib());
    let parent = cgroups.parent.clone();
    let mut notifiers = memcg_notifiers(&config, slow_to_refresh(), Arc::new(CycleWake::new()));
    let collector = SignalCollector::new(&config.paths);
    notifiers.update(&collector.collect());
    let first = registered_trigger(&notifiers);
    // 256 MiB − 150 MiB: the first trigger sits at about 106 MiB.
    cgroups.spawn_allocator(&parent, &growing_to(112 * MIB));
    memcg_crossings(&notifiers, 1).await;

    notifiers.update(&with_more_inactive_file(collector.collect(), 32 * MIB));
    let second = registered_trigger(&notifiers);
    assert!(
        second > first + 30 * MIB,
        "the trigger usage reached stayed at {second} (first {first})"
    );
    let usage = collector.collect().memory_usage[&Signal::AllocatableMemoryAvailable].usage_bytes;
    assert!(
        usage < second,
        "usage {usage} is already past the new trigger {second}: the test proves nothing"
    );

    cgroups.spawn_allocator(&parent, &growing_to(48 * MIB));
    memcg_crossings(&notifiers, 2).await;
}

/// A trigger registered while the threshold is met is one the kernel holds as crossed
/// from the start: it signals it only on the way down, never a second time on the way
/// up. When a later collection finds the threshold no longer met (here 32 MiB more of
/// inactive file pages), the trigger follows it at once, whatever the tolerance (64 MiB)
/// and the interval (an hour), without any signal having come, and growth past it is
/// signalled.
#[tokio::test]
async fn a_trigger_registered_under_a_met_threshold_follows_once_it_is_unmet() {
    let (mut cgroups, config) =
        require!("the cgroup v1 memory hierarchy", pods_cgroup_of_256_mib());
    // 256 MiB − 150 MiB: the trigger sits at about 106 MiB.
    grow_past(&mut cgroups, 112 * MIB, 110 * MIB).await;
    let mut notifiers = memcg_notifiers(&config, slow_to_refresh(), Arc::new(CycleWake::new()));
    let collector = SignalCollector::new(&config.paths);
    notifiers.update(&collector.collect());
    let first = registered_trigger(&notifiers);
    assert!(
        first < 110 * MIB,
        "the first trigger {first} is not below usage"
    );
    // Usage is past it, and the kernel says nothing.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(notifiers.counts().memcg_crossings, 0, "a signal came");

    notifiers.update(&with_more_inactive_file(collector.collect(), 32 * MIB));
    let second = registered_trigger(&notifiers);
    assert!(
        second > first + 30 * MIB,
        "the trigger stayed at {second} (first {first})"
    );

    let parent = cgroups.parent.clone();
    cgroups.spawn_allocator(&parent, &growing_to(48 * MIB));
    memcg_crossings(&notifiers, 1).await;
}

/// One cycle as the agent hands it on: whether its decision met a threshold, what
/// started it, and when its collection began.
#[derive(Debug)]
struct Decided {
    met: bool,
    started_by: CycleStart,
    collection_started: std::time::Instant,
    /// The names of the pods the cycle chose to evict.
    evicted: Vec<String>,
}

/// Sends each cycle's [`Decided`].
struct MetThresholds(std::sync::mpsc::Sender<Decided>);

impl nodekeeper::ports::CycleObserver for MetThresholds {
    fn observe(&mut self, report: &nodekeeper::ports::CycleReport) {
        let _ = self.0.send(Decided {
            met: !report.decision.thresholds_met.is_empty(),
            started_by: report.started_by,
            collection_started: report.collection_started,
            evicted: report
                .decision
                .evictions
                .iter()
                .map(|order| order.name.clone())
                .collect(),
        });
    }
}

/// The agent run in-process (`agent::run`, dry-run, metrics on a free port) on a thread of
/// its own, with a handle on its main runtime, to stall it, and whether each cycle's
/// decision met a threshold. `service`: the link to a service manager, if any.
struct InProcessAgent {
    main_runtime: tokio::runtime::Handle,
    decided: std::sync::mpsc::Receiver<Decided>,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl InProcessAgent {
    fn start(
        mut config: AgentConfig,
        service: nodekeeper::systemd::notify::ServiceManagerLink,
    ) -> InProcessAgent {
        config.dry_run = true;
        config.metrics_address = "127.0.0.1:0".to_string();
        let (decided_tx, decided) = std::sync::mpsc::channel();
        let (runtime_tx, runtime) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let main_runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let handle = main_runtime.handle().clone();
            main_runtime
                .block_on(nodekeeper::agent::run(
                    config.clone(),
                    nodekeeper::signals::Host::detect(&config.paths),
                    None::<
                        nodekeeper::ports::ShutdownHooks<
                            nodekeeper::shutdown::runner::DryRunTerminator,
                        >,
                    >,
                    Arc::new(service),
                    async {
                        let _ = stopped.await;
                    },
                    move |agent| agent.add_cycle_observer(Box::new(MetThresholds(decided_tx))),
                    move |_| {
                        let _ = runtime_tx.send(handle);
                    },
                ))
                .unwrap();
        });
        let main_runtime = runtime.recv().unwrap();
        InProcessAgent {
            main_runtime,
            decided,
            stop,
            thread,
        }
    }

    /// Blocks the main runtime's thread, as a hung call on it would, until the returned
    /// sender is used or dropped (or after a minute at most).
    fn stall_main_runtime(&self) -> std::sync::mpsc::Sender<()> {
        let (stalling_tx, stalling) = std::sync::mpsc::channel();
        let (end_stall, stall_ended) = std::sync::mpsc::channel::<()>();
        self.main_runtime.spawn(async move {
            let _ = stalling_tx.send(());
            let _ = stall_ended.recv_timeout(Duration::from_secs(60));
        });
        stalling.recv().unwrap();
        end_stall
    }

    fn stop(self) {
        let _ = self.stop.send(());
        self.thread.join().unwrap();
    }
}

/// The kernel notifiers wait on the agent's decision cycle thread itself, which decides
/// on their word alone: a crossing is decided on while the main runtime thread (API
/// writes, scrapes, the pod watch) is stalled.
#[test]
fn a_crossing_is_decided_on_while_the_main_runtime_thread_is_stalled() {
    const DECIDED_WITHIN: Duration = Duration::from_secs(5);
    let (mut cgroups, mut config) =
        require!("the cgroup v1 memory hierarchy", pods_cgroup_of_256_mib());
    let parent = cgroups.parent.clone();
    config.paths.cgroup_root = cgroups.v1_root();
    // Only the first cycle comes from the timer.
    config.housekeeping_interval = Duration::from_secs(3600).into();
    let agent = InProcessAgent::start(config, ServiceManagerLink::none());
    let first = agent.decided.recv_timeout(ARRIVAL).expect("no first cycle");
    assert!(
        !first.met,
        "a threshold was met before anything was allocated"
    );
    assert_eq!(first.started_by, CycleStart::Timer, "{first:?}");

    let end_stall = agent.stall_main_runtime();
    let stalled_at = std::time::Instant::now();
    cgroups.spawn_allocator(&parent, &growing_to(180 * MIB));
    let decided_in_time = loop {
        let left = DECIDED_WITHIN.saturating_sub(stalled_at.elapsed());
        match agent.decided.recv_timeout(left) {
            Ok(cycle) if cycle.met => break Some(cycle),
            Ok(_) => continue,
            Err(_) => break None,
        }
    };
    let _ = end_stall.send(());
    let decided = decided_in_time.unwrap_or_else(|| panic!(
        "no decision on the crossing within {DECIDED_WITHIN:?} while the main runtime thread was stalled"
    ));
    // The cycle says the kernel's notification started it, and since when it was wanted:
    // after the stall began (just before the allocation), before the cycle's collection.
    let CycleStart::Woken(wakeup) = decided.started_by else {
        panic!("the deciding cycle was not woken: {decided:?}");
    };
    assert!(
        matches!(
            wakeup.reason,
            WakeReason::Notification | WakeReason::TrailingNotification
        ),
        "{decided:?}"
    );
    let since = wakeup.since.into_std();
    assert!(
        stalled_at <= since && since <= decided.collection_started,
        "woken at {:?} after the stall began, collection at {:?}",
        since.checked_duration_since(stalled_at),
        decided
            .collection_started
            .checked_duration_since(stalled_at)
    );
    agent.stop();
}

/// How many files this process has open under `dir` (its own `/proc/self/fd` links).
fn files_open_under(dir: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

/// Which pod the first cycle a memcg notification starts chooses, with `podStatsMaxAge`
/// set to `max_age` or not: two workloads of the pods cgroup (256 MiB, the 150 MiB
/// threshold of [`allocatable_threshold_on`]), `early` using 30 MiB from before the
/// agent's first (timer) cycle, `late` empty then, and then growing to 100 MiB, which
/// crosses the threshold with `late` at about 76 MiB, the larger of the two. Returns the
/// deciding cycle on `late`'s crossing, and how many of the two workloads' cgroup files
/// the agent (in this process) holds open a moment after it: the timer cycle read them
/// and kept them open, and the notified cycles since did or did not read them.
fn pod_chosen_on_a_notification(max_age: Option<Duration>) -> Option<(Decided, usize)> {
    let (mut cgroups, mut config) = require!(
        "the cgroup v1 memory hierarchy",
        pods_cgroup_of_256_mib(),
        else None
    );
    let parent = cgroups.parent.clone();
    let early = cgroups.child("early");
    let late = cgroups.child("late");
    config.paths.cgroup_root = cgroups.v1_root();
    config.workloads = Some(nodekeeper::config::WorkloadsConfig {
        parent_cgroup: parent.clone(),
        namespace: "test".to_string(),
        pods: Vec::new(),
    });
    config.pod_stats_max_age = max_age.map(Into::into);
    // Only the first cycle comes from the timer.
    config.housekeeping_interval = Duration::from_secs(3600).into();
    cgroups.spawn_allocator(&early, &growing_to(30 * MIB));
    let early_dir = cgroups.dir("memory", &early);
    support::poll::Wait::for_("`early` to use 30 MiB", ARRIVAL)
        .until_true(|| usage_in(&early_dir) >= 30 * MIB);

    let agent = InProcessAgent::start(config, ServiceManagerLink::none());
    let first = agent.decided.recv_timeout(ARRIVAL).expect("no first cycle");
    assert!(!first.met, "a threshold was met before `late` grew");
    assert_eq!(first.started_by, CycleStart::Timer, "{first:?}");

    cgroups.spawn_allocator(&late, &growing_to(100 * MIB));
    let decided = loop {
        match agent.decided.recv_timeout(ARRIVAL) {
            Ok(cycle) if cycle.met => break cycle,
            Ok(_) => continue,
            Err(_) => panic!("no decision on the crossing within {ARRIVAL:?}"),
        }
    };
    // The observer hears of the decision before the cycle ends: wait for its end, and for
    // any cycle after it (woken too: the timer's next is an hour away), each of which
    // would have closed the files it did not read.
    std::thread::sleep(Duration::from_millis(500));
    let files_open = [&early, &late]
        .into_iter()
        .map(|workload| files_open_under(&cgroups.dir("memory", workload)))
        .sum();
    agent.stop();
    assert!(
        matches!(decided.started_by, CycleStart::Woken(_)),
        "the deciding cycle was not woken: {decided:?}"
    );
    Some((decided, files_open))
}

/// By default every cycle reads each pod's figures afresh: the one a notification starts
/// chooses the pod that grew since the last timer cycle, the larger now.
#[test]
fn without_pod_stats_max_age_a_notified_cycle_ranks_pods_on_fresh_figures() {
    let Some((decided, _)) = pod_chosen_on_a_notification(None) else {
        return;
    };
    assert_eq!(decided.evicted, ["late"], "{decided:?}");
}

/// With `podStatsMaxAge`, a cycle a notification starts ranks the pods on the figures of
/// the last timer cycle, as the kubelet ranks on cAdvisor's: `late` was empty then, and
/// `early` is chosen although `late` is the larger now. The files the timer cycle read
/// stay open through the cycles that reused its figures (each workload's
/// `memory.usage_in_bytes` and `memory.stat`), so the next timer cycle need not open them
/// again.
#[test]
fn with_pod_stats_max_age_a_notified_cycle_ranks_pods_on_the_timer_cycles_figures() {
    let Some((decided, files_open)) = pod_chosen_on_a_notification(Some(Duration::from_secs(120)))
    else {
        return;
    };
    assert_eq!(decided.evicted, ["early"], "{decided:?}");
    assert!(
        files_open >= 4,
        "{files_open} of the two workloads' cgroup files open after the reusing cycles"
    );
}

/// The housekeeping timer runs on the decision cycle thread too: while the main runtime
/// thread is stalled, the signals no kernel notification covers (disk, inodes, PIDs) are
/// still looked at every `housekeepingInterval`.
#[test]
fn housekeeping_cycles_go_on_while_the_main_runtime_thread_is_stalled() {
    const STALLED_FOR: Duration = Duration::from_secs(2);
    const INTERVAL: Duration = Duration::from_millis(100);
    let agent = InProcessAgent::start(without_thresholds(INTERVAL), ServiceManagerLink::none());
    agent.decided.recv_timeout(ARRIVAL).expect("no first cycle");

    let end_stall = agent.stall_main_runtime();
    // Cycles that ended before the stall began are not counted.
    while agent.decided.try_recv().is_ok() {}
    std::thread::sleep(STALLED_FOR);
    let while_stalled: Vec<Decided> = agent.decided.try_iter().collect();
    let cycles_while_stalled = while_stalled.len();
    let _ = end_stall.send(());
    // With no threshold no notifier is armed: each of them was the timer's.
    assert!(
        while_stalled
            .iter()
            .all(|cycle| cycle.started_by == CycleStart::Timer),
        "{while_stalled:?}"
    );
    // Twenty intervals; half of them leaves room for a slow machine.
    assert!(
        cycles_while_stalled >= 10,
        "{cycles_while_stalled} housekeeping cycles in {STALLED_FOR:?} of a stalled main runtime (interval {INTERVAL:?})"
    );
    agent.stop();
}

/// The agent with no threshold (so no cycle ever waits for a reclaim or an eviction's
/// cleanup, whatever the host's figures), a cycle every `interval`.
fn without_thresholds(interval: Duration) -> AgentConfig {
    let mut config = AgentConfig::default();
    config.eviction.thresholds.clear();
    config.housekeeping_interval = interval.into();
    config
}

/// The watchdog pings come from the cycle thread, which no longer needs the main runtime
/// thread for its timer, and they vouch for that thread too: while it is stalled (the API
/// writes, `/healthz` and the shutdown handling with it), no ping goes out, so systemd
/// restarts the agent; once it runs again, the pings resume.
#[test]
fn the_watchdog_is_not_pinged_while_the_main_runtime_thread_is_stalled() {
    const PINGS_EVERY: Duration = Duration::from_millis(100);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let manager = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    let pings_within = |within: Duration| {
        let deadline = std::time::Instant::now() + within;
        let mut pings = 0;
        let mut message = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return pings;
            }
            manager.set_read_timeout(Some(left)).unwrap();
            if let Ok(length) = manager.recv(&mut message)
                && &message[..length] == b"WATCHDOG=1"
            {
                pings += 1;
            }
        }
    };
    let agent = InProcessAgent::start(
        without_thresholds(Duration::from_millis(100)),
        ServiceManagerLink::to(NotifyTarget::Path(path.clone()), Some(PINGS_EVERY)),
    );
    agent.decided.recv_timeout(ARRIVAL).expect("no first cycle");
    let before = pings_within(Duration::from_secs(1));
    assert!(before >= 5, "{before} pings in a second before the stall");

    let end_stall = agent.stall_main_runtime();
    // A ping may go out while the last beat is younger than the ping interval.
    pings_within(PINGS_EVERY * 3);
    let while_stalled = pings_within(Duration::from_secs(1));
    let _ = end_stall.send(());
    assert_eq!(
        while_stalled, 0,
        "watchdog pings while the main runtime thread was stalled"
    );
    let after = pings_within(Duration::from_secs(1));
    assert!(after >= 5, "{after} pings in a second after the stall");
    agent.stop();
}

#[tokio::test]
async fn psi_trigger_is_written_and_its_readiness_wakes_the_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("memory.pressure");
    std::fs::write(&file, "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n").unwrap();
    let spec = PsiTriggerSpec {
        stall: Duration::from_millis(150),
        ..PsiTriggerSpec::default()
    };
    let mut trigger = PsiTrigger::arm(&file, spec, PsiReadiness::FileModified).unwrap();
    let written = std::fs::read(&file).unwrap();
    assert!(
        written.starts_with(b"some 150000 1000000\0"),
        "{:?}",
        String::from_utf8_lossy(&written)
    );

    let waiter = tokio::spawn(async move { trigger.fired().await });
    std::fs::write(&file, "some avg10=42.00 avg60=0.00 avg300=0.00 total=1\n").unwrap();
    tokio::time::timeout(ARRIVAL, waiter)
        .await
        .expect("the PSI waiter did not wake")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn psi_poll_priority_refuses_a_regular_file_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("memory");
    std::fs::write(&file, "").unwrap();
    let error = PsiTrigger::arm(&file, PsiTriggerSpec::default(), PsiReadiness::PollPriority)
        .err()
        .expect("epoll cannot watch a regular file");
    assert!(
        error.to_string().contains(&file.display().to_string()),
        "{error}"
    );
}

#[tokio::test]
async fn memory_events_wake_on_a_pressure_counter() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("memory.events");
    std::fs::write(&file, "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n").unwrap();
    let mut watch = MemoryEventsWatch::new(&file).unwrap();
    let waiter = tokio::spawn(async move { watch.pressure().await });
    std::fs::write(&file, "low 0\nhigh 0\nmax 1\noom 0\noom_kill 0\n").unwrap();
    let counts = tokio::time::timeout(ARRIVAL, waiter)
        .await
        .expect("memory.events watch did not wake")
        .unwrap()
        .unwrap();
    assert_eq!(counts.max, 1);
}

#[tokio::test]
async fn memory_events_watch_reports_a_removed_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("memory.events");
    std::fs::write(&file, "oom 0\n").unwrap();
    let mut watch = MemoryEventsWatch::new(&file).unwrap();
    std::fs::remove_file(&file).unwrap();
    let error = tokio::time::timeout(ARRIVAL, watch.pressure())
        .await
        .expect("no error for a removed file")
        .unwrap_err();
    assert!(error.to_string().contains("gone"), "{error}");
}

/// A fake unified host: cgroup.controllers at the root, a pods cgroup with PSI and
/// memory.events, and a procfs with /proc/pressure/memory.
fn fake_v2_host(root: &Path) -> AgentConfig {
    let cgroup_root = root.join("cgroup");
    let pods = cgroup_root.join("kubepods");
    std::fs::create_dir_all(&pods).unwrap();
    std::fs::write(cgroup_root.join("cgroup.controllers"), "memory pids\n").unwrap();
    std::fs::write(
        pods.join("memory.events"),
        "high 0\nmax 0\noom 0\noom_kill 0\n",
    )
    .unwrap();
    std::fs::write(pods.join("memory.pressure"), "").unwrap();
    std::fs::create_dir_all(root.join("proc/pressure")).unwrap();
    std::fs::write(root.join("proc/pressure/memory"), "").unwrap();
    let mut config = AgentConfig::default();
    config.paths.cgroup_root = cgroup_root;
    config.paths.proc_root = root.join("proc");
    config.paths.pods_cgroup = Some("kubepods".into());
    config.eviction.thresholds.push(Threshold {
        signal: Signal::AllocatableMemoryAvailable,
        value: ThresholdValue::Percentage(0.1),
        grace_period: Default::default(),
        min_reclaim: None,
    });
    config
}

fn v2_support(psi: bool) -> NotificationSupport {
    NotificationSupport {
        psi,
        memcg_eventfd_v1: false,
        memory_events_v2: true,
        psi_detail: String::new(),
        memcg_eventfd_v1_detail: String::new(),
        memory_events_v2_detail: String::new(),
    }
}

fn fake_file_settings() -> NotifierSettings {
    NotifierSettings {
        psi_readiness: PsiReadiness::FileModified,
        ..NotifierSettings::default()
    }
}

#[tokio::test]
async fn notifiers_on_a_v2_host_arm_psi_and_memory_events_and_wake_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let config = fake_v2_host(dir.path());
    let wake = Arc::new(CycleWake::new());
    let notifiers = Notifiers::start(
        &config,
        CgroupReader::detect(&config.paths.cgroup_root).ok(),
        &v2_support(true),
        fake_file_settings(),
        wake.clone(),
    );
    let mut armed: Vec<_> = notifiers
        .armed()
        .into_iter()
        .map(|a| {
            (
                a.mechanism,
                a.path.strip_prefix(dir.path()).unwrap().to_path_buf(),
            )
        })
        .collect();
    armed.sort();
    assert_eq!(
        armed,
        vec![
            (Mechanism::Psi, "cgroup/kubepods/memory.pressure".into()),
            (Mechanism::Psi, "proc/pressure/memory".into()),
            (
                Mechanism::MemoryEvents,
                "cgroup/kubepods/memory.events".into()
            ),
        ]
    );

    let events = dir.path().join("cgroup/kubepods/memory.events");
    std::fs::write(&events, "high 0\nmax 0\noom 1\noom_kill 1\n").unwrap();
    tokio::time::timeout(ARRIVAL, wake.woken())
        .await
        .expect("memory.events did not wake the agent");

    std::fs::write(dir.path().join("proc/pressure/memory"), "x").unwrap();
    tokio::time::timeout(ARRIVAL, wake.woken())
        .await
        .expect("PSI did not wake the agent");
    let counts = notifiers.counts();
    assert_eq!(counts.memory_events, 1, "{counts:?}");
    assert_eq!(counts.psi_events, 1, "{counts:?}");
    assert_eq!(counts.evaluations, 2, "{counts:?}");
}

#[tokio::test]
async fn a_failing_mechanism_is_skipped_and_the_others_still_run() {
    let dir = tempfile::tempdir().unwrap();
    let config = fake_v2_host(dir.path());
    std::fs::remove_file(dir.path().join("proc/pressure/memory")).unwrap();
    std::fs::remove_file(dir.path().join("cgroup/kubepods/memory.pressure")).unwrap();
    let wake = Arc::new(CycleWake::new());
    let notifiers = Notifiers::start(
        &config,
        CgroupReader::detect(&config.paths.cgroup_root).ok(),
        &v2_support(true),
        fake_file_settings(),
        wake.clone(),
    );
    let mechanisms: Vec<_> = notifiers.armed().iter().map(|a| a.mechanism).collect();
    assert_eq!(mechanisms, vec![Mechanism::MemoryEvents]);

    let events = dir.path().join("cgroup/kubepods/memory.events");
    std::fs::write(&events, "high 3\nmax 0\noom 0\noom_kill 0\n").unwrap();
    tokio::time::timeout(ARRIVAL, wake.woken())
        .await
        .expect("memory.events did not wake the agent");
}

#[tokio::test]
async fn without_memory_thresholds_nothing_is_armed() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = fake_v2_host(dir.path());
    config.eviction.thresholds.retain(|t| !t.signal.is_memory());
    let notifiers = Notifiers::start(
        &config,
        CgroupReader::detect(&config.paths.cgroup_root).ok(),
        &v2_support(true),
        fake_file_settings(),
        Arc::new(CycleWake::new()),
    );
    assert!(notifiers.armed().is_empty());
}

/// Log lines written while it is the thread's default subscriber, at debug and above.
#[derive(Clone, Default)]
struct CapturedLog(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLog {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLog {
    fn lines_with(&self, level: &str, text: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|line| line.contains(level) && line.contains(text))
            .count()
    }
}

#[tokio::test]
async fn a_memcg_trigger_is_logged_once_and_its_refreshes_only_at_debug() {
    let (_cgroups, config) = require!("the cgroup v1 memory hierarchy", pods_cgroup_of_256_mib());
    let log = CapturedLog::default();
    let writer = log.clone();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish(),
    );
    // Another test of this binary runs an agent whose threads have no subscriber. With
    // one subscriber registered in the process, tracing decides whether a log line is
    // wanted by the default subscriber of the thread that first meets it, and would remember
    // "never" for a line the agent's thread met first. With a second one alive, it asks
    // every registered subscriber, this one included.
    let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());

    // Refresh whenever the trigger moves at all, as a busy node's does every few cycles.
    let settings = NotifierSettings {
        memcg_refresh: nodekeeper::notify::RefreshPolicy {
            min_interval: Duration::ZERO,
            tolerance_bytes: 0,
        },
        ..NotifierSettings::default()
    };
    let mut notifiers = memcg_notifiers(&config, settings, Arc::new(CycleWake::new()));
    let mut collection = SignalCollector::new(&config.paths).collect();
    notifiers.update(&collection);
    for _ in 0..3 {
        let observation = collection
            .observations
            .get_mut(&Signal::AllocatableMemoryAvailable)
            .expect("the pods cgroup's memory is observed");
        observation.capacity += 4 * MIB as i64;
        notifiers.update(&collection);
    }

    assert_eq!(notifiers.counts().memcg_registrations, 4);
    assert_eq!(log.lines_with("INFO", "memcg threshold registered"), 1);
    assert_eq!(log.lines_with("DEBUG", "memcg threshold refreshed"), 3);
}

/// A cycle reads the node's signals after its pods, just before the decision: a crossing
/// while it reads the pods (most of a timer cycle with many pods) is decided by that
/// cycle, not left to one more after it, which a notification could start only once this
/// one is done.
#[tokio::test]
async fn a_crossing_while_the_pods_are_read_is_decided_by_that_cycle() {
    use nodekeeper::pods::{Pod, PodUsage};
    use support::fake_node::{Host, MI};
    struct ShortWhileListed(Arc<Host>);
    impl nodekeeper::ports::PodSource for ShortWhileListed {
        fn pods(&mut self) -> Vec<Pod> {
            // Memory runs short (under the 100Mi threshold) while the pods are read.
            self.0.set_free_memory(50 * MI);
            vec![Pod {
                namespace: "default".to_string(),
                name: "hog".to_string(),
                usage: PodUsage {
                    memory: Some(2048 * MI as i64),
                    ..Default::default()
                },
                ..Pod::default()
            }]
        }
    }
    let host = Arc::new(Host::new(4096 * MI));
    let config = host.config("");
    let host_facts = nodekeeper::signals::Host::detect(&config.paths);
    let metrics = Arc::new(nodekeeper::metrics::Metrics::new());
    let mut agent = nodekeeper::agent::Agent::on_host(config, host_facts, metrics);
    agent.set_pod_source(Box::new(ShortWhileListed(host.clone())));
    let (report, _) = agent.run_cycle().await;
    let available = report.observations[&nodekeeper::signals::Signal::MemoryAvailable].available;
    assert_eq!(available, 50 * MI as i64, "memory read before the pods");
    assert_eq!(evicted(&report), ["hog"], "{:?}", report.decision);
}

/// A pod source that reads two BestEffort pods' memory through the agent's cgroup reader,
/// as the Kubernetes pod source does, and once it has read the first, when asked to, has
/// memory run short and the pods cgroup's `memory.events` tell of it (a `high` event).
struct NotifiedWhileListed {
    host: Arc<support::fake_node::Host>,
    reader: CgroupReader,
    notify: bool,
}

impl nodekeeper::ports::PodSource for NotifiedWhileListed {
    fn pods(&mut self) -> Vec<nodekeeper::pods::Pod> {
        use nodekeeper::pods::{Pod, PodUsage};
        let mut pods = Vec::new();
        for uid in ["a", "b"] {
            let cgroup = Path::new("kubepods/besteffort").join(format!("pod{uid}"));
            let memory = self
                .reader
                .pod_memory_usage(&cgroup)
                .ok()
                .map(|(usage, _)| usage.working_set_bytes() as i64);
            if uid == "a" && std::mem::take(&mut self.notify) {
                self.host.set_free_memory(50 * support::fake_node::MI);
                std::fs::write(
                    self.host.dir.path().join("cgroup/kubepods/memory.events"),
                    "low 0\nhigh 1\nmax 0\noom 0\noom_kill 0\n",
                )
                .expect("memory.events written");
            }
            pods.push(Pod {
                namespace: "default".to_string(),
                name: uid.to_string(),
                uid: Some(uid.to_string()),
                usage: PodUsage {
                    memory,
                    ..Default::default()
                },
                cgroup: Some(cgroup),
                ..Pod::default()
            });
        }
        pods
    }
}

/// The agent of a fake node with two BestEffort pods, `a` (100Mi) and `b` (200Mi), its
/// `memory.events` watched, `extra` in its configuration (and `podStatsMaxAge` 10s unless
/// it says otherwise); its first (timer) cycle has run. Then `a` grows to 300Mi and `b` to 900Mi, and after `pause` a notification comes
/// while the second timer cycle reads its pods, after `a`: returns that cycle's report
/// (with the agent and the wake-up the notifiers give).
async fn notified_while_reading(
    extra: &str,
    pause: Duration,
) -> (
    nodekeeper::ports::CycleReport,
    nodekeeper::agent::Agent,
    Arc<CycleWake>,
) {
    use support::fake_node::{Host, MI};
    let host = Arc::new(Host::new(4096 * MI));
    std::fs::write(
        host.dir.path().join("cgroup/kubepods/memory.events"),
        "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
    )
    .expect("memory.events");
    host.add_pod_cgroup("besteffort", "a", 100 * MI);
    host.add_pod_cgroup("besteffort", "b", 200 * MI);
    let max_age = if extra.contains("podStatsMaxAge") {
        ""
    } else {
        "podStatsMaxAge: 10s\n"
    };
    let config = host.config(&format!("podsCgroup: kubepods\n{max_age}{extra}"));
    let host_facts = nodekeeper::signals::Host::detect(&config.paths);
    let reader = host_facts
        .cgroups()
        .cloned()
        .expect("the fake host's cgroup reader");
    let metrics = Arc::new(nodekeeper::metrics::Metrics::new());
    let mut agent = nodekeeper::agent::Agent::on_host(config, host_facts, metrics);
    let wake = Arc::new(CycleWake::new());
    agent.start_notifiers(&v2_support(false), wake.clone());
    agent.set_pod_source(Box::new(NotifiedWhileListed {
        host: host.clone(),
        reader: reader.clone(),
        notify: false,
    }));
    let (first, _) = agent.run_cycle().await;
    assert!(!first.pod_reads_cut_short);
    assert_eq!(memory_of(&first, "b"), Some(200 * MI as i64));

    for (uid, usage) in [("a", 300 * MI), ("b", 900 * MI)] {
        let file = host.pod_cgroup("besteffort", uid).join("memory.current");
        std::fs::write(file, format!("{usage}\n")).expect("a pod grew");
    }
    agent.set_pod_source(Box::new(NotifiedWhileListed {
        host,
        reader,
        notify: true,
    }));
    std::thread::sleep(pause);
    let (second, _) = agent.run_cycle().await;
    (second, agent, wake)
}

fn memory_of(report: &nodekeeper::ports::CycleReport, name: &str) -> Option<i64> {
    let pod = report.pods.iter().find(|pod| pod.name == name);
    pod.and_then(|pod| pod.usage.memory)
}

fn evicted(report: &nodekeeper::ports::CycleReport) -> Vec<String> {
    let evictions = &report.decision.evictions;
    evictions.iter().map(|e| e.name.clone()).collect()
}

/// With `podStatsMaxAge`, a timer cycle reads every pod afresh, which with many pods takes
/// milliseconds. A kernel notification that comes meanwhile cannot be read by its
/// notifier (it runs on the cycle's thread) until the cycle ends: the cycle sees it
/// waiting, ranks the pods it has not yet read on their kept figures, as a cycle a
/// notification starts ranks them, and decides at once. Here `b`, read after the notification,
/// is ranked on the 200Mi of the last timer cycle although it uses 900Mi now, and `a`
/// (300Mi, read before it) is chosen. Once the notification is read, a timer cycle reads
/// every pod afresh again.
#[tokio::test]
async fn a_notification_while_the_pods_are_read_afresh_leaves_the_rest_to_kept_figures() {
    const MI: i64 = support::fake_node::MI as i64;
    let (second, mut agent, wake) = notified_while_reading("", Duration::ZERO).await;
    assert!(second.pod_reads_cut_short, "{:?}", second.pods);
    assert_eq!(memory_of(&second, "a"), Some(300 * MI), "read before");
    assert_eq!(memory_of(&second, "b"), Some(200 * MI), "kept");
    assert_eq!(evicted(&second), ["a"], "{:?}", second.decision);

    // The notifier reads the notification once the cycle is done.
    tokio::time::timeout(ARRIVAL, wake.woken())
        .await
        .expect("the notification woke no cycle");
    let (third, _) = agent.run_cycle().await;
    assert!(!third.pod_reads_cut_short);
    assert_eq!(memory_of(&third, "b"), Some(900 * MI), "read afresh");
    assert_eq!(evicted(&third), ["b"], "{:?}", third.decision);
}

/// A cycle a notification cuts short ranks on the figures the last timer cycle kept,
/// about one `housekeepingInterval` old (here 1.5 s with an interval of 1 s), but reads
/// afresh those older than two, or than `podStatsMaxAge`: however often notifications
/// come, no figure used grows older than that. A cycle that so used no kept figure counts
/// as a fresh read of every pod; one that did does not, and the cycle the notification
/// then starts, with no fresh read of every pod for an interval, reads every pod afresh.
#[tokio::test]
async fn a_notification_leaves_no_figure_older_than_two_housekeeping_intervals() {
    const MI: i64 = support::fake_node::MI as i64;
    let pause = Duration::from_millis(1500);
    let (second, mut agent, wake) =
        notified_while_reading("housekeepingInterval: 1s\n", pause).await;
    assert!(second.pod_reads_cut_short, "{:?}", second.pods);
    assert!(agent.reused_pod_figures());
    assert_eq!(memory_of(&second, "b"), Some(200 * MI), "1.5 s old: kept");
    let wakeup = tokio::time::timeout(ARRIVAL, wake.woken())
        .await
        .expect("the notification woke no cycle");
    let (woken, _) = agent.run_cycle_started_by(CycleStart::Woken(wakeup)).await;
    assert!(!agent.reused_pod_figures());
    assert_eq!(memory_of(&woken, "b"), Some(900 * MI), "read afresh");

    let (second, _, _) = notified_while_reading("podStatsMaxAge: 1s\n", pause).await;
    assert!(!second.pod_reads_cut_short, "{:?}", second.pods);
    assert_eq!(
        memory_of(&second, "b"),
        Some(900 * MI),
        "over podStatsMaxAge: read afresh"
    );

    let pause = Duration::from_millis(5);
    let (second, agent, _) = notified_while_reading("housekeepingInterval: 1ms\n", pause).await;
    assert!(!second.pod_reads_cut_short, "{:?}", second.pods);
    assert!(!agent.reused_pod_figures(), "a fresh read of every pod");
    assert_eq!(
        memory_of(&second, "b"),
        Some(900 * MI),
        "over 2ms old: read afresh"
    );
    assert_eq!(evicted(&second), ["b"], "{:?}", second.decision);
}
