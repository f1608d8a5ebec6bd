//! The agent loop: the I/O shell around the eviction core. Every housekeeping interval
//! (or sooner, when a kernel notification wakes it) it collects the node's signals,
//! runs one eviction cycle, acts on the decision, and publishes metrics.

mod cycle;
mod evicted;
mod reclaim;
mod record;
mod report;
pub mod service;
mod shutdown;
mod standalone;
mod summary;

pub use cycle::Agent;
pub use record::{RecordError, Recorder};
pub use shutdown::start as start_shutdown_manager;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};

use crate::config::AgentConfig;
use crate::metrics::{self, Health, Metrics};
use crate::notify::{CycleWake, WakeReason, Wakeup};
use crate::ports::CycleStart;
use crate::systemd::notify::ServiceManagerLink;

/// How long a stop waits for the running cycle.
pub const CYCLE_STOP_WAIT: Duration = Duration::from_secs(10);
/// How long the API writes still queued at stop (an eviction's event, the node's
/// conditions) may take to go out: long enough for a few retries, short enough to stay
/// well inside a pod's default 30 s termination grace and a unit's stop timeout.
pub const API_FLUSH_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot start the decision cycle thread: {0}")]
    CycleThread(std::io::Error),
    #[error("metricsAddress {address}: {error}")]
    Metrics {
        address: String,
        error: std::io::Error,
    },
}

/// Handles the agent exposes while it runs, for the binary and for tests.
pub struct RunHandles {
    /// Wakes the loop for an immediate evaluation (kernel notifiers use it).
    pub wake: Arc<CycleWake>,
    /// Receives the bound metrics address once the HTTP server listens.
    pub metrics_bound: oneshot::Receiver<SocketAddr>,
}

/// Run until `shutdown` resolves. The HTTP server and the loop stop together; the
/// current cycle completes (waited for up to [`CYCLE_STOP_WAIT`]), so no decision is
/// half-applied.
///
/// The decision cycle runs on a thread of its own: its procfs, cgroupfs and statvfs reads,
/// disk walks, cgroup kills and trace writes block, and a hung filesystem or a memory-
/// starved disk must not stall what the async runtime serves meanwhile (logind's
/// PrepareForShutdown, `/healthz` and `/metrics`, the pod watch and the API writes).
///
/// Under systemd (`service` connected) the agent says when it is ready and what it is
/// doing ([`service::ServiceReporter`]), pings the watchdog from the cycle thread, and
/// keeps its delay lock in the service manager's file descriptor store.
pub async fn run<T: crate::shutdown::runner::PodTerminator>(
    config: AgentConfig,
    host: crate::signals::Host,
    kube_shutdown: Option<crate::ports::ShutdownHooks<T>>,
    service: Arc<ServiceManagerLink>,
    shutdown: impl Future<Output = ()>,
    customize: impl FnOnce(&mut Agent),
    on_start: impl FnOnce(RunHandles),
) -> Result<(), AgentError> {
    let mut metrics = Metrics::new();
    if !crate::shutdown::plan::phases_from_config(&config.shutdown).is_empty() {
        metrics.export_inhibitor_lock();
    }
    metrics.dry_run.set(i64::from(config.dry_run));
    let metrics = Arc::new(metrics);
    let interval = config
        .housekeeping_interval
        .to_std()
        .max(Duration::from_millis(10));
    let health = Arc::new(Health::new(interval * 3 + Duration::from_secs(5)));
    let address: SocketAddr =
        config
            .metrics_address
            .parse()
            .map_err(|e: std::net::AddrParseError| AgentError::Metrics {
                address: config.metrics_address.clone(),
                error: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
            })?;
    let (stop_tx, _) = watch::channel(false);
    let (bound_tx, bound_rx) = oneshot::channel();
    let server_stop = {
        let mut rx = stop_tx.subscribe();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|error| AgentError::Metrics {
            address: config.metrics_address.clone(),
            error,
        })?;
    let server = tokio::spawn(metrics::serve(
        listener,
        metrics.clone(),
        health.clone(),
        bound_tx,
        server_stop,
    ));

    let wake = Arc::new(CycleWake::new());
    on_start(RunHandles {
        wake: wake.clone(),
        metrics_bound: bound_rx,
    });

    let reporter = Arc::new(service::ServiceReporter::new(
        service.clone(),
        kube_shutdown.is_some(),
        config.dry_run,
    ));
    let mut agent = Agent::on_host(config, host, metrics.clone());
    agent.set_service(reporter.clone());
    customize(&mut agent);
    let reporting = report::start(&mut agent, stop_tx.subscribe());
    let shutdown_manager = shutdown::start(
        agent.config(),
        kube_shutdown,
        agent.host(),
        metrics.clone(),
        reporting.as_ref().map(|reporting| reporting.board.clone()),
        &reporter,
        stop_tx.subscribe(),
    );
    if shutdown_manager.is_none() {
        // No manager holds a delay lock an earlier run kept in the service manager: it
        // must not delay the node's shutdown now.
        service.discard_passed(crate::shutdown::manager::STORED_LOCK_PREFIX);
    }
    let support = agent.announce();
    let realtime_priority = agent.config().realtime_priority;
    let (pinger, heartbeat) = WatchdogPinger::start(&service).unzip();
    agent.start_image_tracking(stop_tx.subscribe());
    // Taken before the agent moves to its thread: it keeps the API senders alive after
    // the agent is gone, until the queue is flushed.
    let pending_writes = agent.pending_writes();
    let cycles = start_cycle_thread(
        agent,
        support,
        realtime_priority,
        interval,
        wake,
        health,
        pinger,
        stop_tx.subscribe(),
    )
    .await?;
    let ready_anyway = {
        let reporter = reporter.clone();
        tokio::spawn(async move {
            tokio::time::sleep(service::READY_AT_THE_LATEST).await;
            reporter.ready_anyway();
        })
    };
    shutdown.await;
    tracing::info!("agent stopping");
    ready_anyway.abort();
    reporter.stopping();
    let _ = stop_tx.send(true);
    // The running cycle completes, so no decision is half-applied; a cycle stuck in the
    // kernel (a hung filesystem) cannot hold the stop up forever.
    match tokio::time::timeout(CYCLE_STOP_WAIT, cycles).await {
        Ok(_) => {}
        Err(_) => tracing::error!(
            "the decision cycle did not finish within {CYCLE_STOP_WAIT:?} (stuck on a hung filesystem?); stopping without it"
        ),
    }
    if let Some(heartbeat) = heartbeat {
        heartbeat.abort();
    }
    if let Some((manager, publisher)) = shutdown_manager {
        // The manager finishes a running drain phase bookkeeping and releases the lock.
        let _ = manager.await;
        publisher.abort();
    }
    // The last report (a finished drain) and the last API writes go out together: an
    // unreachable API server must not hold up the report, nor the other way round.
    let flush = async {
        if let Some(pending) = pending_writes {
            let deadline = tokio::time::Instant::now() + API_FLUSH_WAIT;
            if !pending.flush(deadline).await {
                tracing::warn!(
                    "stopping with API writes still queued after {API_FLUSH_WAIT:?} (listed above)"
                );
            }
        }
    };
    let last_report = async {
        if let Some(reporting) = reporting {
            reporting.stop().await;
        }
    };
    tokio::join!(flush, last_report);
    match server.await {
        Ok(Err(error)) => tracing::warn!(%error, "metrics server ended with an error"),
        Err(error) => tracing::warn!(%error, "metrics server task failed"),
        Ok(Ok(())) => {}
    }
    Ok(())
}

/// Start the thread that runs the decision cycles: every `interval`, or at once when
/// `wake` fires, until `stop` turns true. Resolves when the thread has finished.
///
/// The thread runs a current-thread runtime of its own, and waits there for its timer and
/// for the kernel notifiers `support` offers (started on that runtime): a
/// notification wakes this thread directly, whatever the main runtime is busy with (API
/// writes, scrapes, the pod watch), and with `realtimePriority` this thread is the one
/// that runs real-time, so nothing the API server or a scraper sends runs at that
/// priority. A cycle itself runs in the main runtime's context ([`InRuntime`]): what it
/// spawns (a SIGKILL that follows a grace period, a blocking kill step) runs there, not
/// behind the next blocking cycle on this thread.
///
/// The service manager's watchdog (`pinger`, when it is on) is pinged from this thread,
/// between cycles and while a cycle awaits (a reclaim command, the cleanup after a kill),
/// but not while it is stuck in a blocking call, nor while the runtime thread is stalled
/// ([`WatchdogPinger`]): a
/// cycle hung in the kernel, or a runtime thread that no longer serves the API writes,
/// `/healthz` and the shutdown handling, gets the agent restarted.
#[allow(clippy::too_many_arguments)]
async fn start_cycle_thread(
    mut agent: Agent,
    support: crate::signals::NotificationSupport,
    realtime_priority: Option<u8>,
    interval: Duration,
    wake: Arc<CycleWake>,
    health: Arc<Health>,
    pinger: Option<WatchdogPinger>,
    mut stop: watch::Receiver<bool>,
) -> Result<oneshot::Receiver<()>, AgentError> {
    let main_runtime = tokio::runtime::Handle::current();
    let (started_tx, started_rx) = oneshot::channel();
    let (done_tx, done_rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("nodekeeper-cycle".to_string())
        .spawn(move || {
            // Built on this thread, so that no runtime is ever dropped inside the main
            // runtime's (which panics).
            let cycle_runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = started_tx.send(Err(error));
                    return;
                }
            };
            {
                // The notifiers' tasks wait in the runtime's queue until it runs below.
                let _cycle = cycle_runtime.enter();
                agent.start_notifiers(&support, wake.clone());
            }
            let _ = started_tx.send(Ok(()));
            if let Some(priority) = realtime_priority {
                go_realtime(priority, "decision cycle");
            }
            // The cycle reads the same kernel files every time: kept open, each read
            // skips the path lookup, the open and the close.
            let kept = crate::signals::keep_kernel_files_open_on_this_thread();
            agent.open_node_files_first();
            tracing::debug!(at_most = kept, "kernel files kept open between cycles");
            cycle_runtime.block_on(async move {
                let mut ticker = tokio::time::interval(interval);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                // Its timer on this thread's runtime: the pings do not wait for the
                // runtime thread's.
                let mut watchdog = pinger.map(|pinger| {
                    let mut pings = tokio::time::interval(pinger.interval);
                    pings.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    (pinger, pings)
                });
                // Set after a cycle that evicted: the next one starts at once.
                let mut look_again: Option<tokio::time::Instant> = None;
                loop {
                    let started_by = match look_again.take() {
                        Some(since) => {
                            if *stop.borrow() {
                                break;
                            }
                            // What else is pending is answered by this cycle too.
                            let _ = wake.take_pending();
                            CycleStart::Woken(Wakeup {
                                reason: WakeReason::AfterEviction,
                                since,
                            })
                        }
                        None => tokio::select! {
                            biased;
                            _ = stop.wait_for(|stop| *stop) => break,
                            () = next_ping(&mut watchdog) => {
                                ping(&mut watchdog);
                                continue;
                            }
                            // A wake-up that came meanwhile is answered by this cycle,
                            // and counted as what started it.
                            _ = ticker.tick() => wake
                                .take_pending()
                                .map_or(CycleStart::Timer, CycleStart::Woken),
                            wakeup = wake.woken() => CycleStart::Woken(wakeup),
                        },
                    };
                    let (_, evicted) = {
                        let cycle = agent.run_cycle_started_by(started_by);
                        tokio::pin!(cycle);
                        let mut cycle = InRuntime {
                            runtime: &main_runtime,
                            future: cycle,
                        };
                        loop {
                            tokio::select! {
                                biased;
                                done = &mut cycle => break done,
                                () = next_ping(&mut watchdog) => ping(&mut watchdog),
                            }
                        }
                    };
                    // A cycle that ranked on kept pod figures read few of the pods'
                    // files (new or expired ones only): the others stay open for the
                    // next cycle that reads every pod.
                    if !agent.reused_pod_figures() {
                        crate::signals::end_kernel_file_cycle();
                    }
                    health.tick();
                    if evicted {
                        // Like the kubelet after its cleanup wait: look again at once.
                        look_again = Some(tokio::time::Instant::now());
                    }
                }
            });
            let _ = done_tx.send(());
        })
        .map_err(AgentError::CycleThread)?;
    started_rx
        .await
        .map_err(|_| {
            AgentError::CycleThread(std::io::Error::other("the thread ended at its start"))
        })?
        .map_err(AgentError::CycleThread)?;
    Ok(done_rx)
}

/// When the runtime thread last ran a task. The watchdog is pinged from the cycle thread,
/// whose timer no longer depends on the runtime thread; the heartbeat lets the pings
/// vouch for the runtime thread too.
#[derive(Debug)]
struct RuntimeHeartbeat {
    started: Instant,
    /// Nanoseconds from `started` to the last beat.
    last_beat: AtomicU64,
}

impl RuntimeHeartbeat {
    fn new() -> RuntimeHeartbeat {
        RuntimeHeartbeat {
            started: Instant::now(),
            last_beat: AtomicU64::new(0),
        }
    }

    /// Beats every `period` on the runtime it is spawned on, until aborted.
    async fn beat_every(self: Arc<Self>, period: Duration) {
        let mut beats = tokio::time::interval(period);
        beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            beats.tick().await;
            let since_start = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.last_beat.store(since_start, Ordering::Relaxed);
        }
    }

    fn since_last_beat(&self) -> Duration {
        self.started
            .elapsed()
            .saturating_sub(Duration::from_nanos(self.last_beat.load(Ordering::Relaxed)))
    }
}

/// Whether the runtime thread counts as running: it beats every half ping interval, so
/// a whole interval without a beat is two beats missed.
fn runtime_thread_answers(since_last_beat: Duration, ping_interval: Duration) -> bool {
    since_last_beat < ping_interval
}

/// Pings the service manager's watchdog for the cycle thread, while the runtime thread
/// beats too.
struct WatchdogPinger {
    service: Arc<ServiceManagerLink>,
    /// How often the watchdog wants a ping.
    interval: Duration,
    heartbeat: Arc<RuntimeHeartbeat>,
    /// Pings are withheld because the runtime thread stopped beating (said once).
    withholding: bool,
}

impl WatchdogPinger {
    /// With the service manager's watchdog on: a pinger, and the heartbeat task it
    /// started on the current runtime (the runtime thread's), to abort at stop.
    fn start(
        service: &Arc<ServiceManagerLink>,
    ) -> Option<(WatchdogPinger, tokio::task::JoinHandle<()>)> {
        let interval = service.watchdog_interval()?;
        let heartbeat = Arc::new(RuntimeHeartbeat::new());
        let beats = tokio::spawn(heartbeat.clone().beat_every(interval / 2));
        let pinger = WatchdogPinger {
            service: service.clone(),
            interval,
            heartbeat,
            withholding: false,
        };
        Some((pinger, beats))
    }

    fn ping(&mut self) {
        let since = self.heartbeat.since_last_beat();
        if runtime_thread_answers(since, self.interval) {
            if self.withholding {
                tracing::info!("the runtime thread runs again; pinging the watchdog again");
                self.withholding = false;
            }
            self.service.ping_watchdog();
        } else if !self.withholding {
            tracing::error!(
                "the runtime thread (API writes, /healthz, the shutdown handling) has not run for {since:?}; not pinging the watchdog, so the service manager restarts the agent if it stays so"
            );
            self.withholding = true;
        }
    }
}

/// Polls `future` inside `runtime`'s context, so that what it spawns, and the timers it
/// sets, belong to that runtime whichever thread polls it.
struct InRuntime<'a, F> {
    runtime: &'a tokio::runtime::Handle,
    future: std::pin::Pin<&'a mut F>,
}

impl<F: Future> Future for InRuntime<'_, F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let this = self.get_mut();
        let _entered = this.runtime.enter();
        this.future.as_mut().poll(context)
    }
}

/// Moves the calling thread to SCHED_FIFO at `priority` (`realtimePriority`), or says
/// why it stays on the normal scheduler.
fn go_realtime(priority: u8, thread: &str) {
    match crate::process::run_this_thread_realtime(priority) {
        Ok(()) => tracing::info!(
            priority,
            "the {thread} thread runs real-time (SCHED_FIFO, realtimePriority)"
        ),
        Err(error) => tracing::warn!(
            %error,
            "realtimePriority {priority}: the {thread} thread stays on the normal scheduler, so a crossing may wait for a scheduler tick (needs CAP_SYS_NICE, RestrictRealtime=no under systemd, and a cpu.rt_runtime_us budget where real-time tasks are scheduled by cgroup)"
        ),
    }
}

/// The next watchdog ping is due; never, without a watchdog.
async fn next_ping(watchdog: &mut Option<(WatchdogPinger, tokio::time::Interval)>) {
    match watchdog {
        Some((_, pings)) => {
            pings.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Pings the watchdog, when there is one.
fn ping(watchdog: &mut Option<(WatchdogPinger, tokio::time::Interval)>) {
    if let Some((pinger, _)) = watchdog {
        pinger.ping();
    }
}
