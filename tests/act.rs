//! The cgroup killers against real cgroups on this machine: the standalone evictor and the
//! shutdown terminator, on the v1 memory + freezer hierarchies and on the v2 hierarchy
//! wherever it is mounted (`/sys/fs/cgroup` on a unified host, `/sys/fs/cgroup/unified` on
//! a hybrid one, found in the mount table). Every process killed is one this test started.
//! Under `CI=true` these tests fail when real cgroups cannot be used.

mod support;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nodekeeper::act::{CgroupEvictor, DryRunEvictor, KillMethod, KillTarget, Stopped, kill_target};
use nodekeeper::eviction::{EvictionOrder, EvictionReason};
use nodekeeper::pods::Pod;
use nodekeeper::ports::Evictor;
use nodekeeper::shutdown::cgroup_kill::CgroupTerminator;
use nodekeeper::shutdown::plan::PlannedPod;
use nodekeeper::shutdown::runner::{PodTerminator, Termination};
use nodekeeper::signals::{CgroupLayout, Signal};
use support::allocator::AllocatorPlan;
use support::cgroups::{TestCgroups, V2};

const MIB: u64 = 1 << 20;
const EXIT_WAIT: Duration = Duration::from_secs(10);

#[test]
#[ignore = "helper process for the real-cgroup tests, not a test by itself"]
fn allocator_child() {
    support::allocator::run_if_requested();
}

fn holder(ignore_sigterm: bool) -> AllocatorPlan {
    AllocatorPlan {
        bytes: 8 * MIB,
        rate: 0,
        ignore_sigterm,
        report_crossing: None,
    }
}

fn pod(name: &str, cgroup: &Path) -> Pod {
    Pod {
        namespace: "standalone".into(),
        name: name.into(),
        cgroup: Some(cgroup.to_path_buf()),
        ..Pod::default()
    }
}

fn order(name: &str, grace_period_seconds: i64) -> EvictionOrder {
    EvictionOrder {
        namespace: "standalone".into(),
        name: name.into(),
        uid: None,
        reason: EvictionReason::Threshold(Signal::AllocatableMemoryAvailable),
        grace_period_seconds,
        message: "The node was low on resource: memory.".into(),
        annotations: Default::default(),
        disruption_target: true,
    }
}

const V1: &str = "the cgroup v1 memory and freezer hierarchies";
const UNIFIED: &str = "the cgroup v2 hierarchy";

fn v1_evictor(cgroups: &TestCgroups, parent: &Path) -> CgroupEvictor {
    CgroupEvictor::new(&cgroups.v1_root(), CgroupLayout::Hybrid, parent).unwrap()
}

#[tokio::test]
async fn hard_eviction_freezes_kills_and_thaws_only_the_chosen_v1_cgroup() {
    let mut cgroups = require!(V1, TestCgroups::create(&["memory", "freezer"]));
    let victim = cgroups.child("pod-a");
    let bystander = cgroups.child("pod-b");
    let victim_pid = cgroups.spawn_allocator(&victim, &holder(false)).id();
    let bystander_pid = cgroups.spawn_allocator(&bystander, &holder(false)).id();
    wait_until_resident(victim_pid);
    wait_until_resident(bystander_pid);

    let mut evictor = v1_evictor(&cgroups, &cgroups.parent);
    evictor
        .evict(&order("pod-a", 1), &pod("pod-a", &victim))
        .unwrap();

    let status = cgroups
        .wait_child(victim_pid, EXIT_WAIT)
        .expect("victim survived");
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert!(cgroups.child_running(bystander_pid));
    let state = std::fs::read_to_string(cgroups.dir("freezer", &victim).join("freezer.state"));
    assert_eq!(state.unwrap().trim(), "THAWED");
    assert!(cgroups.procs("memory", &victim).is_empty());
}

#[tokio::test]
async fn soft_eviction_returns_at_once_then_escalates_to_sigkill_after_the_grace_period() {
    let mut cgroups = require!(V1, TestCgroups::create(&["memory", "freezer"]));
    let stubborn = cgroups.child("stubborn");
    let pid = cgroups.spawn_allocator(&stubborn, &holder(true)).id();
    // Let the child install its SIGTERM handler before it is signalled.
    wait_until_resident(pid);

    let mut evictor = v1_evictor(&cgroups, &cgroups.parent);
    evictor
        .evict(&order("stubborn", 2), &pod("stubborn", &stubborn))
        .unwrap();
    assert_eq!(evictor.pending(), 1);
    assert!(
        cgroups.child_running(pid),
        "SIGTERM is ignored, so it must still run"
    );
    // A repeated order during the grace period does not start a second escalation.
    evictor
        .evict(&order("stubborn", 2), &pod("stubborn", &stubborn))
        .unwrap();

    let outcomes = evictor.settle().await;
    assert_eq!(outcomes.len(), 1);
    let Ok(Stopped::Killed(report)) = &outcomes[0].result else {
        panic!("not escalated to SIGKILL: {outcomes:?}");
    };
    assert_eq!(report.method, KillMethod::FreezeKillThaw);
    let status = cgroups.wait_child(pid, EXIT_WAIT).expect("not killed");
    assert_eq!(status.signal(), Some(libc::SIGKILL));
}

#[tokio::test]
async fn soft_eviction_of_a_cooperative_workload_ends_with_sigterm() {
    let mut cgroups = require!(V1, TestCgroups::create(&["memory", "freezer"]));
    let polite = cgroups.child("polite");
    let pid = cgroups.spawn_allocator(&polite, &holder(false)).id();
    wait_until_resident(pid);

    let mut evictor = v1_evictor(&cgroups, &cgroups.parent);
    evictor
        .evict(&order("polite", 2), &pod("polite", &polite))
        .unwrap();
    let status = cgroups.wait_child(pid, EXIT_WAIT).expect("SIGTERM ignored");
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    let outcomes = evictor.settle().await;
    assert!(
        matches!(outcomes[0].result, Ok(Stopped::Exited)),
        "{outcomes:?}"
    );
}

#[tokio::test]
async fn cgroups_outside_the_workload_parent_are_never_touched() {
    let mut workloads = require!(V1, TestCgroups::create(&["memory", "freezer"]));
    let mut elsewhere = TestCgroups::create(&["memory", "freezer"]).unwrap();
    let outside = elsewhere.child("not-a-workload");
    let pid = elsewhere.spawn_allocator(&outside, &holder(false)).id();
    wait_until_resident(pid);

    let unused = workloads.child("unused");
    let mut evictor = v1_evictor(&workloads, &unused);
    let escape = workloads.parent.join("unused/../../").join(&outside);
    for cgroup in [outside.clone(), escape, PathBuf::from("/")] {
        let error = evictor
            .evict(&order("x", 1), &pod("x", &cgroup))
            .unwrap_err();
        assert!(
            error.to_string().contains("not below the workload parent"),
            "{error}"
        );
    }
    assert!(elsewhere.child_running(pid));
}

#[tokio::test]
async fn a_pod_without_a_cgroup_is_an_error_naming_it() {
    let mut evictor = CgroupEvictor::new(
        Path::new("/nonexistent"),
        CgroupLayout::Hybrid,
        Path::new("w"),
    )
    .unwrap();
    let nameless = Pod {
        namespace: "standalone".into(),
        name: "ghost".into(),
        ..Pod::default()
    };
    let error = evictor.evict(&order("ghost", 1), &nameless).unwrap_err();
    assert!(
        error.to_string().contains("standalone/ghost has no cgroup"),
        "{error}"
    );
}

#[tokio::test]
async fn v2_hard_eviction_uses_cgroup_kill() {
    let mut cgroups = require!(UNIFIED, TestCgroups::create(&[V2]));
    let victim = cgroups.child("pod-a");
    let bystander = cgroups.child("pod-b");
    let victim_pid = cgroups.spawn_allocator(&victim, &holder(true)).id();
    let bystander_pid = cgroups.spawn_allocator(&bystander, &holder(false)).id();
    wait_until_resident(victim_pid);
    wait_until_resident(bystander_pid);

    let mut evictor =
        CgroupEvictor::new(cgroups.mount(V2), CgroupLayout::Unified, &cgroups.parent).unwrap();
    evictor
        .evict(&order("pod-a", 0), &pod("pod-a", &victim))
        .unwrap();
    let status = cgroups
        .wait_child(victim_pid, EXIT_WAIT)
        .expect("victim survived");
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert!(cgroups.child_running(bystander_pid));
}

#[test]
fn dry_run_only_records_what_it_would_evict() {
    let mut evictor = DryRunEvictor::default();
    let cgroup = PathBuf::from("workloads/pod-a");
    evictor
        .evict(&order("pod-a", 1), &pod("pod-a", &cgroup))
        .unwrap();
    evictor
        .evict(&order("pod-b", 30), &pod("pod-b", &cgroup))
        .unwrap();
    assert_eq!(
        evictor.would_evict(),
        ["standalone/pod-a", "standalone/pod-b"]
    );
}

/// The allocator sets up its signal disposition before touching memory, so once it holds
/// a few MiB the child is past that point and really running.
fn wait_until_resident(pid: u32) {
    let status = format!("/proc/{pid}/status");
    for _ in 0..2000 {
        let text = std::fs::read_to_string(&status).unwrap();
        let rss_kib: u64 = text
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        if rss_kib >= 4096 {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("pid {pid} never reached 4 MiB resident");
}

fn planned(name: &str) -> PlannedPod {
    PlannedPod {
        namespace: "default".into(),
        name: name.into(),
        uid: None,
        grace_period_seconds: 0,
    }
}

/// Standalone shutdown: a cooperative workload ends with SIGTERM within its grace period,
/// one that ignores SIGTERM is killed when the grace period ends, and an empty or missing
/// cgroup has nothing to stop.
async fn shutdown_terminator_sigterm_then_kill(hierarchy: &str, cgroups: &mut TestCgroups) {
    cgroups.child("default");
    let polite_cgroup = cgroups.child("default/polite");
    let stubborn_cgroup = cgroups.child("default/stubborn");
    let polite = cgroups.spawn_shell(&polite_cgroup, "exec sleep 1000", "sleep");
    let stubborn = cgroups.spawn_shell(&stubborn_cgroup, "trap '' TERM; exec sleep 1000", "sleep");
    let terminator = CgroupTerminator::new(cgroups.dir(hierarchy, &cgroups.parent));
    let grace = Duration::from_millis(300);

    let outcome = terminator
        .terminate(&planned("polite"), Duration::from_secs(30))
        .await;
    assert_eq!(outcome.unwrap(), Termination::Graceful);
    let outcome = terminator.terminate(&planned("stubborn"), grace).await;
    assert_eq!(outcome.unwrap(), Termination::Killed);
    let mut signal = |pid| cgroups.wait_child(pid, EXIT_WAIT).and_then(|s| s.signal());
    assert_eq!(
        [signal(polite), signal(stubborn)],
        [Some(libc::SIGTERM), Some(libc::SIGKILL)]
    );
    let outcome = terminator.terminate(&planned("polite"), grace).await;
    assert_eq!(
        outcome.unwrap(),
        Termination::NotFound,
        "an empty cgroup has nothing to stop"
    );
    let outcome = terminator.terminate(&planned("absent"), grace).await;
    assert_eq!(outcome.unwrap(), Termination::NotFound);
}

#[tokio::test]
async fn shutdown_terminator_on_v2_sends_sigterm_then_cgroup_kill() {
    let mut cgroups = require!(UNIFIED, TestCgroups::create(&[V2]));
    shutdown_terminator_sigterm_then_kill(V2, &mut cgroups).await;
}

#[tokio::test]
async fn shutdown_terminator_on_v1_sends_sigterm_then_freezes_kills_and_thaws() {
    let mut cgroups = require!(
        "the cgroup v1 freezer hierarchy",
        TestCgroups::create(&["freezer"])
    );
    shutdown_terminator_sigterm_then_kill("freezer", &mut cgroups).await;
}

/// `cgroup.procs` can list 0 (a task outside a containerized agent's PID namespace), init
/// and the agent itself; `kill(0)` would signal the agent's own process group. One killer
/// serves eviction and shutdown, and it signals none of them. A plain directory stands in
/// for the cgroup (no freezer, no `cgroup.kill`), so the signal-each path runs.
#[test]
fn the_killer_signals_only_real_members_never_pid_0_init_or_itself() {
    let dir = tempfile::tempdir().unwrap();
    let mut member = std::process::Command::new("sleep")
        .arg("1000")
        .spawn()
        .unwrap();
    let mut nested_member = std::process::Command::new("sleep")
        .arg("1000")
        .spawn()
        .unwrap();
    let own = std::process::id();
    std::fs::write(
        dir.path().join("cgroup.procs"),
        format!("0\n1\n{own}\n{}\n", member.id()),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("ctr")).unwrap();
    std::fs::write(
        dir.path().join("ctr/cgroup.procs"),
        format!("{own}\n{}\n", nested_member.id()),
    )
    .unwrap();

    let report = kill_target(&KillTarget::directory(dir.path())).unwrap();
    assert_eq!(report.method, KillMethod::SignalEach);
    assert_eq!(report.signalled, 2, "only the two sleeps: {report:?}");
    for child in [&mut member, &mut nested_member] {
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    }
}

#[tokio::test]
async fn the_shutdown_terminator_never_signals_pid_0_init_or_itself() {
    let dir = tempfile::tempdir().unwrap();
    let workload = dir.path().join("default/listed-but-foreign");
    std::fs::create_dir_all(&workload).unwrap();
    std::fs::write(
        workload.join("cgroup.procs"),
        format!("0\n1\n{}\n", std::process::id()),
    )
    .unwrap();
    let terminator = CgroupTerminator::new(dir.path());
    let outcome = terminator
        .terminate(&planned("listed-but-foreign"), Duration::from_millis(50))
        .await;
    assert_eq!(
        outcome.unwrap(),
        Termination::NotFound,
        "nothing it may signal, so nothing to stop (and this test is still alive)"
    );
}
