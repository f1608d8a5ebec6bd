//! What the controller hears from each node besides its Ready condition: its kubelet's
//! Lease renewals (watched in `kube-node-lease`) and its agent's reports (the report
//! ledger). Both are measured on the monotonic clock, as they arrive here, never from
//! the timestamps the node writes: a node's clock can be wrong, and a wall-clock jump on
//! the controller must neither fence a node nor spare one. They are handed to the pure
//! judge (`liveness.rs`) as timestamps on the decision's clock.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

use crate::report::ReportHub;
use crate::report::ledger::AgentHeard;

use super::kdump::{KdumpHeard, KdumpLog};
use super::liveness::{Channels, Liveness};
use super::policy::ControllerPolicy;

/// Where kubelets keep their node Leases, each named after its node.
pub use crate::kubernetes::probe::NODE_LEASE_NAMESPACE;

/// The kubelet's `nodeLeaseDurationSeconds` default, for a Lease that does not say.
const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(40);

#[derive(Debug, Clone, Copy)]
struct LeaseSeen {
    renew_time: Option<Timestamp>,
    /// When this controller saw `renew_time` change (or first saw the Lease).
    heard: Instant,
    /// Two renewal intervals: half the Lease's duration (the kubelet renews every
    /// quarter).
    fresh_within: Duration,
}

/// The node channels as the controller hears them.
pub struct Hearing {
    reports: Option<Arc<ReportHub>>,
    /// kdump notifications, when the controller listens for them (`kdumpAddress`).
    kdump: Option<Arc<KdumpLog>>,
    /// Reports arrive over TLS, so what they say may decide something (a drained node's
    /// release); over plain HTTP only their arrival counts.
    content_trusted: bool,
    silence_timeout: Duration,
    reconnect_grace: Duration,
    leases: Mutex<HashMap<String, LeaseSeen>>,
    /// When this replica began listening as the leader; until then, and for
    /// `reconnect_grace` after, a node no agent has reported for may still have one.
    listening_since: OnceLock<Instant>,
}

impl Hearing {
    /// `reports` is the report endpoint, if the controller serves one; `kdump` the kdump
    /// notifications, if it listens for them.
    pub fn new(
        reports: Option<Arc<ReportHub>>,
        kdump: Option<Arc<KdumpLog>>,
        policy: &ControllerPolicy,
    ) -> Hearing {
        Hearing {
            kdump,
            content_trusted: reports.as_ref().is_some_and(|hub| hub.is_tls()),
            reports,
            silence_timeout: policy.fence.silence_timeout,
            reconnect_grace: policy.reports.reconnect_grace,
            leases: Mutex::new(HashMap::new()),
            listening_since: OnceLock::new(),
        }
    }

    /// Silence detection runs: reports are served and `silenceTimeout` is not zero.
    pub fn enabled(&self) -> bool {
        self.reports.is_some() && !self.silence_timeout.is_zero()
    }

    /// This replica leads and the nodes are listed: from now on it hears them.
    pub fn begin(&self) {
        let _ = self.listening_since.set(Instant::now());
        if let Some(hub) = &self.reports {
            hub.set_leading(true);
        }
    }

    fn leases(&self) -> std::sync::MutexGuard<'_, HashMap<String, LeaseSeen>> {
        self.leases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A Lease as the watch delivers it: heard now if its renewal time moved.
    pub fn observe_lease(&self, lease: &Lease) {
        let Some(name) = lease.metadata.name.clone() else {
            return;
        };
        let spec = lease.spec.as_ref();
        let renew_time = spec.and_then(|spec| spec.renew_time.as_ref()).map(|t| t.0);
        let fresh_within = spec
            .and_then(|spec| spec.lease_duration_seconds)
            .and_then(|seconds| u64::try_from(seconds).ok())
            .filter(|seconds| *seconds > 0)
            .map_or(DEFAULT_LEASE_DURATION, Duration::from_secs)
            / 2;
        let mut leases = self.leases();
        match leases.get_mut(&name) {
            Some(seen) if seen.renew_time == renew_time => seen.fresh_within = fresh_within,
            _ => {
                leases.insert(
                    name,
                    LeaseSeen {
                        renew_time,
                        heard: Instant::now(),
                        fresh_within,
                    },
                );
            }
        }
    }

    fn forget_lease(&self, name: &str) {
        self.leases().remove(name);
    }

    fn retain_leases(&self, names: &HashSet<String>) {
        self.leases().retain(|name, _| names.contains(name));
    }

    /// The report endpoint, while silence detection runs.
    fn listening(&self) -> Option<&ReportHub> {
        self.reports.as_deref().filter(|_| self.enabled())
    }

    /// Node `node`'s liveness at `now` (the decision's clock).
    pub fn liveness(&self, node: &str, now: Timestamp) -> Liveness {
        let Some(reports) = self.listening() else {
            return Liveness::NoAgent;
        };
        match reports.heard(node) {
            Some(heard) => Liveness::Heard(self.channels(node, heard, now, Instant::now())),
            None => self.without_reports(now),
        }
    }

    /// A node no agent has reported for since this controller started: unknown while
    /// a running agent may still be on its way back, then without an agent.
    fn without_reports(&self, now: Timestamp) -> Liveness {
        let listened = self
            .listening_since
            .get()
            .map_or(Duration::ZERO, Instant::elapsed);
        if listened < self.reconnect_grace {
            Liveness::AgentUnknown {
                until: now + (self.reconnect_grace - listened),
            }
        } else {
            Liveness::NoAgent
        }
    }

    fn channels(
        &self,
        node: &str,
        heard: AgentHeard,
        now: Timestamp,
        instant: Instant,
    ) -> Channels {
        let stamp = |then: Instant| now - instant.saturating_duration_since(then);
        let lease = self.leases().get(node).copied();
        // A node whose Lease this replica has not seen is silent on that channel since
        // it began listening.
        let lease_heard = lease
            .map(|seen| seen.heard)
            .or_else(|| self.listening_since.get().copied())
            .unwrap_or(instant);
        Channels {
            lease: stamp(lease_heard),
            lease_fresh_within: lease.map_or(DEFAULT_LEASE_DURATION / 2, |seen| seen.fresh_within),
            report: stamp(heard.received),
            reports_fresh_within: heard.fresh_within,
            drained: heard.drained.filter(|_| self.content_trusted),
            isolation: self.content_trusted.then_some(heard.isolation),
            api_reachable_since: heard
                .api_reachable_since
                .filter(|_| self.content_trusted)
                .map(stamp),
            promise: heard.promise.filter(|_| self.content_trusted),
            boot: self.content_trusted.then_some(heard.boot_id),
        }
    }

    /// The renewal time of `node`'s Lease as this replica last heard it (`Some(None)`:
    /// a Lease without one); `None` when it has not heard the Lease at all, or does not
    /// listen.
    pub fn lease_renewal(&self, node: &str) -> Option<Option<Timestamp>> {
        self.listening()?;
        self.leases().get(node).map(|seen| seen.renew_time)
    }

    /// The last renewal of `node`'s Lease this replica saw, or when it began listening
    /// if it saw none (on the decision's clock, `now`); `None` while silence detection
    /// is off or this replica does not lead.
    pub fn lease_heard(&self, node: &str, now: Timestamp) -> Option<Timestamp> {
        self.listening()?;
        let instant = Instant::now();
        let heard = self
            .leases()
            .get(node)
            .map(|seen| seen.heard)
            .or_else(|| self.listening_since.get().copied())?;
        Some(now - instant.saturating_duration_since(heard))
    }

    /// The latest run of kdump notifications from any of a node's `addresses` (its
    /// InternalIPs), on the decision's clock (`now`).
    pub fn kdump(&self, addresses: &[std::net::IpAddr], now: Timestamp) -> Option<KdumpHeard> {
        self.kdump
            .as_ref()
            .and_then(|log| log.heard(addresses, now, Instant::now()))
    }

    /// Since when the kdump notifications are heard, on the decision's clock (`now`).
    pub fn kdump_listening_since(&self, now: Timestamp) -> Option<Timestamp> {
        self.kdump
            .as_ref()
            .map(|log| log.listening_since(now, Instant::now()))
    }

    /// From now on, answer node `node`'s reports with `instructions` (only over TLS; see
    /// [`ReportHub::instruct`]).
    pub fn instruct(&self, node: &str, instructions: Vec<crate::report::protocol::Instruction>) {
        if let Some(hub) = &self.reports {
            hub.instruct(node, instructions);
        }
    }

    /// Asks nothing of any agent any more (see [`ReportHub::withdraw_instructions`]).
    pub fn withdraw_instructions(&self) {
        if let Some(hub) = &self.reports {
            hub.withdraw_instructions();
        }
    }

    /// The nodes the storm guard counts as silent at `now`, by name (see
    /// [`Channels::counted_as_silent`]). Only agents whose reports are overdue are
    /// looked at.
    pub fn silent_nodes(&self, now: Timestamp) -> Vec<String> {
        self.quiet_nodes(now).silent
    }

    /// The overdue agents' nodes that are silent, and those that said they drained, in
    /// one pass over the ledger.
    pub fn quiet_nodes(&self, now: Timestamp) -> QuietNodes {
        let mut quiet = QuietNodes::default();
        let Some(reports) = self.listening() else {
            return quiet;
        };
        let instant = Instant::now();
        for (node, heard) in reports.overdue() {
            let channels = self.channels(&node, heard, now, instant);
            let silent = channels.counted_as_silent(self.silence_timeout, now);
            match (silent, channels.drained.is_some()) {
                (true, true) => {
                    quiet.drained.push(node.clone());
                    quiet.silent.push(node);
                }
                (true, false) => quiet.silent.push(node),
                (false, true) => quiet.drained.push(node),
                (false, false) => {}
            }
        }
        quiet
    }
}

/// Nodes whose agents are overdue, by name.
#[derive(Debug, Default)]
pub struct QuietNodes {
    /// Those the storm guard counts as silent.
    pub silent: Vec<String>,
    /// Those whose agent last said, over TLS, that the node drained: they may be gone
    /// before `silenceTimeout` (see [`Channels::drained_at`]), so the node watch looks at
    /// them every second too.
    pub drained: Vec<String>,
}

/// Watches the node Leases into `hearing` until the stream ends (never, unless the
/// client is dropped). A relist drops the Leases it no longer finds.
pub async fn watch_node_leases(client: kube::Client, hearing: Arc<Hearing>) {
    let api: Api<Lease> = Api::namespaced(client, NODE_LEASE_NAMESPACE);
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut relisted: HashSet<String> = HashSet::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(lease)) => hearing.observe_lease(&lease),
            Ok(watcher::Event::InitApply(lease)) => {
                relisted.extend(lease.metadata.name.clone());
                hearing.observe_lease(&lease);
            }
            Ok(watcher::Event::Delete(lease)) => {
                hearing.forget_lease(lease.metadata.name.as_deref().unwrap_or_default())
            }
            Ok(watcher::Event::Init) => relisted.clear(),
            Ok(watcher::Event::InitDone) => hearing.retain_leases(&std::mem::take(&mut relisted)),
            Err(error) => tracing::warn!(
                %error,
                namespace = NODE_LEASE_NAMESPACE,
                "node Lease watch failed; it is restarted with backoff (until it is back, Leases count as silent only after silenceTimeout)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lease(name: &str, renewed: &str, duration: i32) -> Lease {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NODE_LEASE_NAMESPACE},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": duration, "renewTime": renewed}
        }))
        .expect("lease")
    }

    fn hearing() -> Hearing {
        Hearing::new(None, None, &ControllerPolicy::default())
    }

    #[test]
    fn a_lease_is_heard_when_its_renewal_time_moves_not_when_it_is_relisted() {
        let hearing = hearing();
        hearing.observe_lease(&lease("a", "2026-11-24T01:00:00.000000Z", 40));
        let first = hearing.leases()["a"];
        assert_eq!(first.fresh_within, Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(5));
        // The same renewal again (a relist, or another field changed): not news.
        hearing.observe_lease(&lease("a", "2026-11-24T01:00:00.000000Z", 40));
        assert_eq!(hearing.leases()["a"].heard, first.heard);
        hearing.observe_lease(&lease("a", "2026-11-24T01:00:10.000000Z", 40));
        assert!(hearing.leases()["a"].heard > first.heard);
    }

    #[test]
    fn a_renewal_time_from_a_wrong_node_clock_still_counts_as_heard_now() {
        let hearing = hearing();
        hearing.observe_lease(&lease("a", "2001-01-01T00:00:00.000000Z", 0));
        let seen = hearing.leases()["a"];
        assert!(seen.heard.elapsed() < Duration::from_secs(5));
        assert_eq!(seen.fresh_within, DEFAULT_LEASE_DURATION / 2);
    }

    #[test]
    fn a_relist_drops_leases_it_no_longer_finds() {
        let hearing = hearing();
        hearing.observe_lease(&lease("a", "2026-11-24T01:00:00.000000Z", 40));
        hearing.observe_lease(&lease("b", "2026-11-24T01:00:00.000000Z", 40));
        hearing.retain_leases(&HashSet::from(["b".to_string()]));
        assert!(!hearing.leases().contains_key("a"));
        assert!(hearing.leases().contains_key("b"));
    }

    #[test]
    fn without_a_report_endpoint_every_node_is_judged_by_its_ready_condition() {
        let hearing = hearing();
        assert!(!hearing.enabled());
        assert_eq!(hearing.liveness("a", Timestamp::now()), Liveness::NoAgent);
        assert!(hearing.silent_nodes(Timestamp::now()).is_empty());
    }
}
