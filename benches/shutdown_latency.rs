//! PrepareForShutdown to first pod termination, through a private dbus-daemon and a fake
//! logind, against a baseline in the same run: one plain D-Bus method round trip on the
//! same bus. The ratio shows how much the manager adds on top of the bus itself.

#[path = "../tests/support/logind_fake.rs"]
mod logind_fake;
#[allow(dead_code)]
#[path = "../tests/support/poll.rs"]
mod poll;
#[allow(dead_code)]
#[path = "../tests/support/real.rs"]
pub mod real;
/// Where `require!` looks for its helpers: without a dbus-daemon the bench fails under
/// `CI=true`.
mod support {
    pub use super::real;
}

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use logind_fake::{FakeLogind, PrivateBus, fake_state, wait_until};
use nodekeeper::pods::Pod;
use nodekeeper::shutdown::logind::{BusAddress, Logind};
use nodekeeper::shutdown::manager::{ManagerOptions, ManagerStatus, run_shutdown_manager};
use nodekeeper::shutdown::plan::{PhaseSpec, PlannedPod};
use nodekeeper::shutdown::runner::{PodTerminator, SystemClock, TerminateError, Termination};
use tokio::sync::watch;

#[derive(Default)]
struct FirstCall(Mutex<Option<Instant>>);

impl PodTerminator for FirstCall {
    async fn terminate(&self, _: &PlannedPod, _: Duration) -> Result<Termination, TerminateError> {
        self.0.lock().unwrap().get_or_insert_with(Instant::now);
        Ok(Termination::Graceful)
    }
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let bus = require!("a private dbus-daemon", PrivateBus::start(dir.path()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (logind, client, first, status, _stop) = runtime.block_on(async {
        let logind = FakeLogind::serve(&bus, fake_state(3600)).await;
        let client = Logind::connect(&BusAddress::Address(bus.address()))
            .await
            .unwrap();
        let mut options = ManagerOptions::new(
            vec![PhaseSpec {
                priority: 0,
                seconds: 30,
            }],
            "bench-boot".into(),
        );
        options.bus = BusAddress::Address(bus.address());
        options.state_path = dir.path().join("state.json");
        options.logind_dropin_path = dir.path().join("99-nodekeeper.conf");
        let first = Arc::new(FirstCall::default());
        let (status_tx, status) = watch::channel(ManagerStatus::default());
        let (stop, stop_rx) = watch::channel(false);
        let pods = vec![Pod {
            namespace: "default".into(),
            name: "web".into(),
            ..Pod::default()
        }];
        tokio::spawn(run_shutdown_manager(
            options,
            Arc::clone(&first),
            Arc::new(move || Ok(pods.clone())),
            Arc::new(SystemClock),
            status_tx,
            stop_rx,
        ));
        wait_until("the agent", || {
            status.borrow().bus_connected && status.borrow().lock_held
        })
        .await;
        (logind, client, first, status, stop)
    });

    let mut group = c.benchmark_group("shutdown");
    group.sample_size(30);
    group.bench_function("baseline_dbus_property_round_trip", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    client.inhibit_delay_max().await.unwrap();
                }
                start.elapsed()
            })
        });
    });
    group.bench_function("prepare_for_shutdown_to_first_termination", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    *first.0.lock().unwrap() = None;
                    let sent = logind.announce(true).await;
                    wait_until("the first termination", || {
                        first.0.lock().unwrap().is_some()
                    })
                    .await;
                    total += first.0.lock().unwrap().unwrap() - sent;
                    // Let the run finish, then cancel so the agent re-takes the lock.
                    wait_until("the run", || logind.held() == 0).await;
                    logind.announce(false).await;
                    wait_until("the lock again", || {
                        logind.held() == 1 && !status.borrow().shutting_down
                    })
                    .await;
                }
                total
            })
        });
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
