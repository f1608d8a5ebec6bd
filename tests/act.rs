//! The standalone evictor against real cgroups on this machine: v1 memory + freezer
//! hierarchies, and the v2 hierarchy mounted at /sys/fs/cgroup/unified (no controllers,
//! but `cgroup.kill` works there). Every process killed is one this test started.

mod support;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nodekeeper::act::{CgroupEvictor, DryRunEvictor, KillMethod};
use nodekeeper::eviction::{EvictionOrder, EvictionReason, Evictor};
use nodekeeper::pods::Pod;
use nodekeeper::signals::{CgroupLayout, Signal};
use support::allocator::AllocatorPlan;
use support::cgroups::{CGROUP_ROOT, TestCgroups};

const MIB: u64 = 1 << 20;
const EXIT_WAIT: Duration = Duration::from_secs(10);

#[test]
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

fn v1_evictor(parent: &Path) -> CgroupEvictor {
    CgroupEvictor::new(Path::new(CGROUP_ROOT), CgroupLayout::Hybrid, parent).unwrap()
}

#[tokio::test]
async fn hard_eviction_freezes_kills_and_thaws_only_the_chosen_v1_cgroup() {
    require_cgroups!("memory", "freezer");
    let mut cgroups = TestCgroups::create(&["memory", "freezer"]);
    let victim = cgroups.child("pod-a");
    let bystander = cgroups.child("pod-b");
    let victim_pid = cgroups.spawn_allocator(&victim, &holder(false)).id();
    let bystander_pid = cgroups.spawn_allocator(&bystander, &holder(false)).id();
    wait_until_resident(victim_pid);
    wait_until_resident(bystander_pid);

    let mut evictor = v1_evictor(&cgroups.parent);
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
    require_cgroups!("memory", "freezer");
    let mut cgroups = TestCgroups::create(&["memory", "freezer"]);
    let stubborn = cgroups.child("stubborn");
    let pid = cgroups.spawn_allocator(&stubborn, &holder(true)).id();
    // Let the child install its SIGTERM handler before it is signalled.
    wait_until_resident(pid);

    let mut evictor = v1_evictor(&cgroups.parent);
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
    let report = outcomes[0]
        .result
        .as_ref()
        .unwrap()
        .as_ref()
        .expect("escalated");
    assert_eq!(report.method, KillMethod::FreezeKillThaw);
    let status = cgroups.wait_child(pid, EXIT_WAIT).expect("not killed");
    assert_eq!(status.signal(), Some(libc::SIGKILL));
}

#[tokio::test]
async fn soft_eviction_of_a_cooperative_workload_ends_with_sigterm() {
    require_cgroups!("memory", "freezer");
    let mut cgroups = TestCgroups::create(&["memory", "freezer"]);
    let polite = cgroups.child("polite");
    let pid = cgroups.spawn_allocator(&polite, &holder(false)).id();
    wait_until_resident(pid);

    let mut evictor = v1_evictor(&cgroups.parent);
    evictor
        .evict(&order("polite", 2), &pod("polite", &polite))
        .unwrap();
    let status = cgroups.wait_child(pid, EXIT_WAIT).expect("SIGTERM ignored");
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    let outcomes = evictor.settle().await;
    assert!(matches!(outcomes[0].result, Ok(None)), "{outcomes:?}");
}

#[tokio::test]
async fn cgroups_outside_the_workload_parent_are_never_touched() {
    require_cgroups!("memory", "freezer");
    let mut workloads = TestCgroups::create(&["memory", "freezer"]);
    let mut elsewhere = TestCgroups::create(&["memory", "freezer"]);
    let outside = elsewhere.child("not-a-workload");
    let pid = elsewhere.spawn_allocator(&outside, &holder(false)).id();
    wait_until_resident(pid);

    let mut evictor = v1_evictor(&workloads.child("unused"));
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
    require_cgroups!("unified");
    let mut cgroups = TestCgroups::create(&["unified"]);
    let victim = cgroups.child("pod-a");
    let bystander = cgroups.child("pod-b");
    let victim_pid = cgroups.spawn_allocator(&victim, &holder(true)).id();
    let bystander_pid = cgroups.spawn_allocator(&bystander, &holder(false)).id();
    wait_until_resident(victim_pid);
    wait_until_resident(bystander_pid);

    let unified = Path::new(CGROUP_ROOT).join("unified");
    let mut evictor = CgroupEvictor::new(&unified, CgroupLayout::Unified, &cgroups.parent).unwrap();
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
