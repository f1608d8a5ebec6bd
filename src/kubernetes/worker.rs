//! The async side of the outbox: one task that sends queued writes in order, backs off
//! while the API server fails, and exports what happened as metrics. Callers on the
//! synchronous eviction path only lock, push and wake it; they never wait on the API.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;

use super::api::ApiWriter;
use super::outbox::{ApiAction, Outbox, Outcome, Pushed, retry_delay};
use crate::metrics::{ApiActionLabels, Metrics};

/// Shared access to the outbox, cheap to clone.
#[derive(Clone)]
pub struct OutboxHandle {
    outbox: Arc<Mutex<Outbox>>,
    wake: Arc<Notify>,
    metrics: Arc<OnceLock<Arc<Metrics>>>,
}

impl OutboxHandle {
    pub fn new(capacity: usize) -> Self {
        OutboxHandle {
            outbox: Arc::new(Mutex::new(Outbox::new(capacity))),
            wake: Arc::new(Notify::new()),
            metrics: Arc::new(OnceLock::new()),
        }
    }

    /// Export counts to `metrics` from now on, from every clone of this handle.
    pub fn set_metrics(&self, metrics: Arc<Metrics>) {
        let _ = self.metrics.set(metrics);
    }

    fn lock(&self) -> MutexGuard<'_, Outbox> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.outbox
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn count(&self, action: &str, outcome: &str) {
        if let Some(metrics) = self.metrics.get() {
            metrics
                .api_actions
                .get_or_create(&ApiActionLabels {
                    action: action.to_string(),
                    outcome: outcome.to_string(),
                })
                .inc();
        }
    }

    fn publish_pending(&self, pending: usize) {
        if let Some(metrics) = self.metrics.get() {
            metrics
                .api_outbox_pending
                .set(i64::try_from(pending).unwrap_or(i64::MAX));
        }
    }

    /// Queue a write and wake the sender. Never blocks on the network.
    pub fn push(&self, action: ApiAction) -> Pushed {
        let kind = action.kind();
        let (pushed, pending) = {
            let mut outbox = self.lock();
            let pushed = outbox.push(action);
            (pushed, outbox.len())
        };
        match &pushed {
            Pushed::QueuedDroppingOldest(dropped) => {
                tracing::warn!(dropped, "API outbox full; dropped the oldest {dropped}");
                self.count(dropped, "dropped");
            }
            Pushed::DroppedNew => {
                tracing::warn!(action = kind, "API outbox full; dropped a new {kind}");
                self.count(kind, "dropped");
            }
            _ => {}
        }
        self.publish_pending(pending);
        self.wake.notify_one();
        pushed
    }

    pub fn pending(&self) -> Vec<ApiAction> {
        self.lock().pending().cloned().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

/// How long to wait between failed attempts.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub base: Duration,
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_millis(200),
            max: Duration::from_secs(10),
        }
    }
}

/// Send queued writes forever; run it as a task and abort it to stop.
pub async fn run_outbox(handle: OutboxHandle, writer: ApiWriter, retry: RetryPolicy) {
    loop {
        let next = handle.lock().begin();
        let Some((id, action)) = next else {
            handle.wake.notified().await;
            continue;
        };
        let outcome = writer.execute(&action).await;
        let kind = action.kind();
        let (attempts, pending) = {
            let mut outbox = handle.lock();
            let attempts = outbox.finish(id, outcome.clone());
            (attempts, outbox.len())
        };
        handle.publish_pending(pending);
        match outcome {
            Outcome::Done => {
                tracing::debug!(action = kind, "API write done");
                handle.count(kind, "done");
            }
            Outcome::Rejected(reason) => {
                tracing::error!(action = kind, %reason, ?action, "API server refused a write; dropping it");
                handle.count(kind, "rejected");
            }
            Outcome::Retry(reason) => {
                if attempts == 1 {
                    tracing::warn!(action = kind, %reason, pending, "API write failed; queued for retry");
                }
                handle.count(kind, "retried");
                tokio::time::sleep(retry_delay(attempts, retry.base, retry.max)).await;
            }
        }
    }
}
