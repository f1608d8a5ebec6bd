//! Whether the agent reaches the API server, as its own traffic shows it: the pod watch
//! and the queued writes (`kubernetes` posts them here). No extra requests are made for
//! it.

use std::sync::Arc;

use tokio::sync::watch;

/// Shared by the pod watch and the write queue; read by the agent's reports.
#[derive(Clone, Debug)]
pub struct ApiReachability {
    state: Arc<watch::Sender<bool>>,
}

impl Default for ApiReachability {
    fn default() -> Self {
        ApiReachability::new()
    }
}

impl ApiReachability {
    /// Starts reachable: the agent connected before it watches or writes.
    pub fn new() -> ApiReachability {
        ApiReachability {
            state: Arc::new(watch::channel(true).0),
        }
    }

    /// Records the outcome of one exchange with the API server.
    pub fn saw(&self, reachable: bool) {
        self.state.send_if_modified(|state| {
            let changed = *state != reachable;
            *state = reachable;
            changed
        });
    }

    pub fn is_reachable(&self) -> bool {
        *self.state.borrow()
    }

    /// Changes from now on.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.state.subscribe()
    }
}

/// Resolves when the API server answers again after it did not: the next change to
/// reachable that `changes` (from [`ApiReachability::subscribe`]) has not seen. Never
/// resolves once every [`ApiReachability`] is gone. Cancel-safe.
pub async fn answered_again(changes: &mut watch::Receiver<bool>) {
    loop {
        if changes.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        if *changes.borrow_and_update() {
            return;
        }
    }
}
