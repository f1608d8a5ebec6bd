//! The fence controller's pure core at cluster scale: the storm guard over every watched
//! node (done once per node event) and one `decide` for a running fence, at 500 and
//! 5,000 nodes. The baselines, measured in the same run, are the least each must do: for
//! the guard, one pass over the nodes counting the unhealthy ones; for `decide`, a copy of
//! the status it read (it returns the next status).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use nodekeeper::controller::decide::{ExecutionReport, Outcome, ReportedState, decide};
use nodekeeper::controller::facts::{
    MethodOutline, NodeFacts, NodeHealth, NodeTaints, PlanOutline, Readiness,
};
use nodekeeper::controller::policy::{FencePolicy, StormPolicy};
use nodekeeper::controller::resource::{NodeFence, NodeFenceSpec};
use nodekeeper::controller::storm::{Guard, NodeView, StormMemory, assess};
use nodekeeper::fencing::{FenceAction, Step};

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
        zone: "region:\0:zone-7".to_string(),
        excluded: false,
        runs_pods_needing_fencing: true,
        pods_to_release: 3,
        taints: NodeTaints::default(),
        plan: Ok(plan()),
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
