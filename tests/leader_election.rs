//! Fault injection: two controller replicas whose leader Lease flaps (issue 16). Round
//! after round, for longer than the renew deadline, the API server (the test's fake)
//! refuses every Lease write, or answers too late, or the leader alone is cut off from it
//! (its connection, through a proxy of its own, turned into a black hole) while the other
//! replica still reaches it; then all is well again for a while. Each replica runs as
//! `nodekeeper controller` does: wait for the Lease, act while holding it, and on losing
//! it stop (a new process with a new identity starts in its place).
//!
//! What must hold: at no moment do both replicas believe they may act, the flapping does
//! move the leadership (so the check is not vacuous), and once the API server is steady,
//! one replica leads again within two of the Lease's durations.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nodekeeper::controller::lease::{LeaderElector, Leadership};
use nodekeeper::controller::policy::LeaderElectionPolicy;
use support::apiserver::{RequestMatcher, cluster, fake_only};
use support::proxy::TcpProxy;

const NAMESPACE: &str = "nodekeeper-system";

fn policy() -> LeaderElectionPolicy {
    LeaderElectionPolicy {
        lease_name: "nodekeeper-controller".to_string(),
        lease_duration: Duration::from_secs(2),
        renew_interval: Duration::from_millis(200),
        renew_deadline: Duration::from_millis(1200),
    }
}

/// One replica slot: the leadership of the process that runs in it now.
#[derive(Default)]
struct Slot {
    current: Mutex<Option<Arc<Leadership>>>,
    /// How many times a process in this slot took the lead.
    led: AtomicUsize,
}

impl Slot {
    fn leading(&self) -> bool {
        self.current
            .lock()
            .expect("slot")
            .as_ref()
            .is_some_and(|leadership| leadership.is_leading())
    }
}

/// Runs replica `name` in `slot` until `stop`: each process waits for the Lease, holds
/// it until it may no longer act, then ends and is replaced by a new one.
async fn replica(client: kube::Client, name: &'static str, slot: Arc<Slot>, stop: Arc<AtomicBool>) {
    let mut generation = 0;
    while !stop.load(Ordering::SeqCst) {
        generation += 1;
        let mut elector = LeaderElector::new(
            client.clone(),
            NAMESPACE,
            policy(),
            format!("{name}-{generation}"),
        );
        *slot.current.lock().expect("slot") = Some(elector.leadership());
        tokio::select! {
            _ = elector.acquire() => {}
            _ = wait_for(&stop) => return,
        }
        slot.led.fetch_add(1, Ordering::SeqCst);
        tokio::select! {
            _ = elector.hold() => {}
            _ = wait_for(&stop) => return,
        }
    }
}

async fn wait_for(stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_lease_never_lets_two_replicas_act_at_once() {
    let cluster = cluster().await;
    let server = require!("the fake API server", fake_only(&cluster));
    let stop = Arc::new(AtomicBool::new(false));
    let first_leader = Instant::now();
    let slots = [Arc::new(Slot::default()), Arc::new(Slot::default())];
    // Each replica reaches the API server through a proxy of its own, to cut it off alone.
    let upstream = server
        .url()
        .trim_start_matches("http://")
        .parse()
        .expect("address");
    let proxies = [
        TcpProxy::start(upstream).await,
        TcpProxy::start(upstream).await,
    ];
    let replicas: Vec<_> = ["a", "b"]
        .into_iter()
        .zip(&slots)
        .zip(&proxies)
        .map(|((name, slot), proxy)| {
            let url = format!("http://{}", proxy.address());
            let client = kube::Client::try_from(kube::Config::new(url.parse().expect("a URI")))
                .expect("a client through the proxy");
            tokio::spawn(replica(client, name, slot.clone(), stop.clone()))
        })
        .collect();

    // Look every 2 ms for a moment where both may act; note the moments none may.
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = {
        let (slots, watching) = (slots.clone(), watching.clone());
        tokio::task::spawn_blocking(move || {
            let (mut looks, mut both) = (0u64, 0u64);
            let mut leaderless_since: Option<Instant> = None;
            let mut longest_leaderless = Duration::ZERO;
            while watching.load(Ordering::SeqCst) {
                let leading = slots.iter().filter(|slot| slot.leading()).count();
                looks += 1;
                if leading == 2 {
                    both += 1;
                }
                match (leading, leaderless_since) {
                    (0, None) => leaderless_since = Some(Instant::now()),
                    (0, Some(_)) => {}
                    (_, Some(since)) => {
                        longest_leaderless = longest_leaderless.max(since.elapsed());
                        leaderless_since = None;
                    }
                    (_, None) => {}
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            (looks, both, longest_leaderless)
        })
    };

    support::apiserver::eventually(Duration::from_secs(10), "a first leader", || {
        slots.iter().any(|slot| slot.leading()).then_some(())
    })
    .await;
    let elected_in = first_leader.elapsed();

    // Eight rounds of trouble, each longer than the renew deadline, each followed by
    // 2.5 s of a steady API server: every Lease write refused (500); every answer late;
    // the leader cut off for a while, or for longer than the Lease's duration, while
    // the other replica reaches the API server.
    let lease_writes = || RequestMatcher::method("PUT").and_path("/leases/");
    let a_leader = || slots.iter().position(|slot| slot.leading());
    let mut longest_to_lead = Duration::ZERO;
    for round in 0..8 {
        let leader =
            support::apiserver::eventually(Duration::from_secs(10), "a leader", a_leader).await;
        let trouble = match round % 4 {
            0 => {
                server.fail_matching(lease_writes(), 500, None);
                Duration::from_millis(1600)
            }
            1 => {
                server.set_latency(Duration::from_millis(1600));
                Duration::from_millis(1600)
            }
            2 => {
                proxies[leader].swallow();
                Duration::from_millis(1600)
            }
            _ => {
                proxies[leader].swallow();
                Duration::from_millis(4000)
            }
        };
        tokio::time::sleep(trouble).await;
        server.set_latency(Duration::ZERO);
        server.clear_failures();
        for proxy in &proxies {
            proxy.mend();
        }
        let steady = Instant::now();
        support::apiserver::eventually(Duration::from_secs(6), "a leader once steady", a_leader)
            .await;
        longest_to_lead = longest_to_lead.max(steady.elapsed());
        tokio::time::sleep(Duration::from_millis(2500).saturating_sub(steady.elapsed())).await;
    }

    watching.store(false, Ordering::SeqCst);
    let (looks, both, longest_leaderless) = watcher.await.expect("the watcher");
    stop.store(true, Ordering::SeqCst);
    for replica in replicas {
        replica.await.expect("a replica");
    }
    let terms: usize = slots
        .iter()
        .map(|slot| slot.led.load(Ordering::SeqCst))
        .sum();
    println!(
        "flapping Lease: {looks} looks, {both} with two leaders; {terms} terms of leadership \
         (each time a replica took the Lease, the first included); first leader in \
         {elected_in:?}; longest leaderless {longest_leaderless:?}; a leader at most \
         {longest_to_lead:?} after the trouble ended"
    );
    assert_eq!(
        both, 0,
        "two replicas could act at once at {both} of {looks} looks"
    );
    assert!(
        terms >= 3,
        "the flapping should have cost the leader its Lease more than once: {terms} terms"
    );
    // Within two Lease durations: a renewal the slow server applied after its sender gave
    // up restarts the other replica's wait once.
    assert!(
        longest_to_lead <= policy().lease_duration * 2 + Duration::from_secs(1),
        "{longest_to_lead:?}"
    );
}
