//! The fence controller's pure core at cluster scale: the storm guard over every watched
//! node (done once per node event) and one `decide` for a running fence, at 500 and
//! 5,000 nodes. The baselines, measured in the same run, are the least each must do: for
//! the guard, one pass over the nodes counting the unhealthy ones; for `decide`, a copy of
//! the status it read (it returns the next status).
//!
//! With agents reporting, every guard evaluation first asks which nodes are silent: a
//! pass over the report ledger (`silent_scan`), measured against the guard itself.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use nodekeeper::controller::decide::{ExecutionReport, Outcome, ReportedState, decide};
use nodekeeper::controller::facts::{
    MethodOutline, NodeFacts, NodeHealth, NodeTaints, PlanOutline, Readiness,
};
use nodekeeper::controller::liveness::Channels;
use nodekeeper::controller::policy::{FencePolicy, StormPolicy};
use nodekeeper::controller::resource::{NodeFence, NodeFenceSpec};
use nodekeeper::controller::storm::{Guard, NodeView, StormMemory, assess};
use nodekeeper::fencing::{FenceAction, Step};
use nodekeeper::report::ledger::{Credential, Identity, ReportLedger};

/// A ledger of `count` agents reporting every 2 s; every `overdue_every`-th has not been
/// heard for 10 s (0: all fresh). `at` is the instant the scan runs at.
fn ledger(count: usize, overdue_every: usize, at: Instant) -> ReportLedger {
    let mut ledger = ReportLedger::default();
    for i in 0..count {
        let node = format!("node-{i}");
        let report = nodekeeper::report::decode_report(
            format!(
                r#"{{"version":"1.0","node":"{node}","bootId":"5d0c6f8e-1111-4222-8333-944455556666","bootTime":"2026-11-20T08:00:00Z","sequence":1,"agentVersion":"bench","intervalMillis":2000,"sentAt":"2026-11-24T05:00:00Z","trigger":"interval","conditions":[],"shutdown":{{"state":"none","lockHeld":true}},"apiServer":{{"state":"reachable"}},"isolation":{{"state":"none"}}}}"#
            )
            .as_bytes(),
        )
        .expect("a valid report");
        let quiet = overdue_every > 0 && i % overdue_every == 0;
        let received = if quiet {
            at - Duration::from_secs(10)
        } else {
            at
        };
        let identity = Identity {
            node,
            credential: Credential::NodeToken,
        };
        ledger
            .accept(&identity, report, received, now())
            .expect("accepted");
    }
    ledger
}

/// What `Hearing::silent_nodes` does over the ledger: the overdue agents, each judged
/// with its Lease (here: renewed 5 s ago).
fn silent_scan(ledger: &ReportLedger, at: Instant) -> usize {
    let silence = Duration::from_secs(20);
    ledger
        .overdue(at)
        .into_iter()
        .filter(|(_, heard)| {
            Channels {
                lease: now() - Duration::from_secs(5),
                lease_fresh_within: Duration::from_secs(20),
                report: now() - at.saturating_duration_since(heard.received),
                reports_fresh_within: heard.fresh_within,
                drained: heard.drained,
                isolation: Some(heard.isolation),
                api_reachable_since: None,
                promise: heard.promise,
                boot: Some(heard.boot_id),
            }
            .counted_as_silent(silence, now())
        })
        .count()
}

const SIZES: [usize; 2] = [500, 5_000];

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).expect("in range")
}

/// Nodes in 10 zones, one in 50 not ready.
fn nodes(count: usize) -> Vec<NodeView> {
    (0..count)
        .map(|i| NodeView {
            name: format!("node-{i}"),
            zone: format!("region:\0:zone-{}", i % 10),
            readiness: if i % 50 == 7 {
                Readiness::Unknown
            } else {
                Readiness::Ready
            },
            excluded_from_zone: false,
        })
        .collect()
}

fn plan() -> PlanOutline {
    let method = |name: &str| MethodOutline {
        name: name.to_string(),
        agent: "fence_ipmilan".to_string(),
        action: FenceAction::Off,
        must_succeed: true,
    };
    let mut plan = PlanOutline::default();
    plan.steps
        .insert(Step::Isolation, vec![vec![method("scsi")]]);
    plan.steps.insert(
        Step::PowerManagement,
        vec![vec![method("ipmi")], vec![method("pdu")]],
    );
    plan
}

fn main() {
    let mut criterion = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let policy = StormPolicy::default();
    let mut group = criterion.benchmark_group("storm_guard");
    for size in SIZES {
        let all = nodes(size);
        group.throughput(Throughput::Elements(size as u64));
        group.bench_with_input(BenchmarkId::new("baseline_count", size), &all, |b, all| {
            b.iter(|| {
                black_box(
                    all.iter()
                        .filter(|n| n.readiness != Readiness::Ready)
                        .count(),
                )
            })
        });
        group.bench_with_input(BenchmarkId::new("assess", size), &all, |b, all| {
            b.iter(|| black_box(assess(all, StormMemory::default(), &policy, now())))
        });
        let at = Instant::now() + Duration::from_secs(60);
        let fresh = ledger(size, 0, at);
        group.bench_with_input(
            BenchmarkId::new("silent_scan_all_fresh", size),
            &fresh,
            |b, ledger| b.iter(|| black_box(silent_scan(ledger, at))),
        );
        let tenth_overdue = ledger(size, 10, at);
        group.bench_with_input(
            BenchmarkId::new("silent_scan_tenth_overdue", size),
            &tenth_overdue,
            |b, ledger| b.iter(|| black_box(silent_scan(ledger, at))),
        );
    }
    group.finish();

    // One reconcile of a fence whose isolation just finished: record the result, confirm,
    // ask for the taints, schedule the power step.
    let fence = NodeFence {
        metadata: ObjectMeta {
            name: Some("node-7".to_string()),
            ..ObjectMeta::default()
        },
        spec: NodeFenceSpec {
            node_name: "node-7".to_string(),
            force: false,
        },
        status: None,
    };
    let facts = NodeFacts {
        exists: true,
        health: NodeHealth {
            readiness: Readiness::Unknown,
            since: Some(Timestamp::from_second(1_799_999_000).expect("in range")),
        },
        liveness: nodekeeper::controller::liveness::Liveness::NoAgent,
        zone: "region:\0:zone-7".to_string(),
        excluded: false,
        runs_pods_needing_fencing: true,
        pods_to_release: 3,
        volumes_attached: 1,
        taints: NodeTaints::default(),
        plan: Ok(plan()),
        kdump: None,
        kdump_listening_since: None,
        lease_heard: None,
        boot_id: None,
        lease_unchanged: None,
    };
    let fence_policy = FencePolicy::default();
    let started = decide(&fence, &facts, &[], &Guard::open(), &fence_policy, now());
    let mut running = fence.clone();
    running.status = Some(started.status);
    let name = running.status.as_ref().expect("status").executions[0]
        .name
        .clone();
    let reports = vec![ExecutionReport {
        name,
        state: ReportedState::Finished(Outcome {
            succeeded: true,
            timed_out: false,
            off_confirmed: true,
            power: None,
            detail: None,
            finished_at: now(),
        }),
    }];
    // decide's baseline: the least it must do, returning a copy of the status it read.
    criterion.bench_function("decide/baseline_clone_status", |b| {
        b.iter(|| black_box(running.status.clone()))
    });
    criterion.bench_function("decide/isolation_confirmed", |b| {
        b.iter(|| {
            black_box(decide(
                &running,
                &facts,
                &reports,
                &Guard::open(),
                &fence_policy,
                now(),
            ))
        })
    });
    criterion.final_summary();
}
