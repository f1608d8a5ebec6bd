//! What the agent will say in its next report. The parts of the agent that know a fact
//! (the decision cycle, the shutdown manager, the API connection) post it here; the
//! sender reads a snapshot for every report and is woken at once when a fact changes.

use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::sync::Notify;

use super::protocol::{
    ApiServerReport, ApiServerState, EvictionReport, IsolationReport, SelfIsolationReport,
    ShutdownReport,
};

/// The facts a report carries besides its envelope.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentFacts {
    pub conditions: Vec<String>,
    pub shutdown: ShutdownReport,
    pub last_eviction: Option<EvictionReport>,
    pub api_server: ApiServerReport,
    pub isolation: IsolationReport,
    /// The isolation's times on the boot clock, for the guardian. Not reported; the
    /// report carries the wall times for the controller.
    pub isolation_on_boot_clock: IsolationBootTimes,
    pub self_isolation: SelfIsolationReport,
}

/// When, on the boot clock, the isolator last checked its evidence (the wall time is
/// `isolation.checked_at`) and when the isolation record's state began (`isolation.since`,
/// except for a refusal, which has no record): how
/// the guardian tells fresh evidence from stale, and a failure that answers its request
/// from an earlier one, whatever the wall clock does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IsolationBootTimes {
    pub checked: Option<Duration>,
    pub state_since: Option<Duration>,
}

#[derive(Debug, Default)]
pub struct ReportBoard {
    facts: Mutex<AgentFacts>,
    changed: Notify,
}

impl ReportBoard {
    pub fn new() -> ReportBoard {
        ReportBoard::default()
    }

    pub fn snapshot(&self) -> AgentFacts {
        self.facts.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Resolves after a fact changed (a change since the last wait counts).
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// Applies `change`; wakes the sender when anything differs.
    fn update(&self, change: impl FnOnce(&mut AgentFacts)) {
        let mut facts = self.facts.lock().unwrap_or_else(|e| e.into_inner());
        let before = facts.clone();
        change(&mut facts);
        if *facts != before {
            // One stored permit: a change while the sender is busy is not lost.
            self.changed.notify_one();
        }
    }

    /// The node conditions the agent holds true, by Kubernetes name.
    pub fn set_conditions(&self, mut conditions: Vec<String>) {
        conditions.sort();
        self.update(|facts| facts.conditions = conditions);
    }

    pub fn set_shutdown(&self, shutdown: ShutdownReport) {
        self.update(|facts| facts.shutdown = shutdown);
    }

    pub fn set_last_eviction(&self, eviction: EvictionReport) {
        self.update(|facts| facts.last_eviction = Some(eviction));
    }

    /// The node's isolation, as the isolator last found it, and its times on the boot
    /// clock.
    pub fn set_isolation(&self, isolation: IsolationReport, on_boot_clock: IsolationBootTimes) {
        self.update(|facts| {
            facts.isolation = isolation;
            facts.isolation_on_boot_clock = on_boot_clock;
        });
    }

    /// The same isolation checked again with the same result: the next report carries
    /// the new check time, without a report of its own.
    pub fn refresh_isolation(&self, isolation: IsolationReport, on_boot_clock: IsolationBootTimes) {
        let mut facts = self.facts.lock().unwrap_or_else(|e| e.into_inner());
        facts.isolation = isolation;
        facts.isolation_on_boot_clock = on_boot_clock;
    }

    /// Whether the agent isolates its node by itself, and its promise.
    pub fn set_self_isolation(&self, self_isolation: SelfIsolationReport) {
        self.update(|facts| facts.self_isolation = self_isolation);
    }

    /// Whether the agent reaches the API server; `since` moves only when the state does.
    pub fn set_api_server(&self, state: ApiServerState, now: Timestamp) {
        self.update(|facts| {
            if facts.api_server.state != state {
                facts.api_server = ApiServerReport {
                    state,
                    since: Some(now),
                };
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_change_wakes_the_sender_and_a_repeat_does_not() {
        let board = ReportBoard::new();
        board.set_conditions(vec!["MemoryPressure".to_string()]);
        tokio::time::timeout(Duration::from_millis(100), board.changed())
            .await
            .expect("the change woke the sender");
        board.set_conditions(vec!["MemoryPressure".to_string()]);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), board.changed())
                .await
                .is_err(),
            "the same conditions again are no change"
        );
        let at: Timestamp = "2026-11-24T05:00:00Z".parse().expect("time");
        board.set_api_server(ApiServerState::Unreachable, at);
        let later: Timestamp = "2026-11-24T05:00:09Z".parse().expect("time");
        board.set_api_server(ApiServerState::Unreachable, later);
        assert_eq!(board.snapshot().api_server.since, Some(at), "since stays");
    }
}
