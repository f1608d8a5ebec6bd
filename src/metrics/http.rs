//! `/metrics`, `/healthz` and `/readyz` on one small HTTP server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::boot_clock::since_boot_ms;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use super::Metrics;
use super::text_format::Format;

/// Liveness and readiness as the agent loop reports them.
#[derive(Debug)]
pub struct Health {
    ready: AtomicBool,
    /// The last tick on the boot clock, so that a wall-clock jump neither makes a
    /// working loop look stalled nor hides a stalled one.
    last_tick_ms: AtomicU64,
    /// A loop that has not ticked for this long is reported unhealthy.
    stall_after: Duration,
    /// What `/readyz` says before the first tick.
    waiting_for: &'static str,
}

impl Health {
    pub fn new(stall_after: Duration) -> Self {
        Self::waiting_for(stall_after, "no signal collection has completed yet\n")
    }

    /// A health whose `/readyz` answers `waiting_for` until the first tick.
    pub fn waiting_for(stall_after: Duration, waiting_for: &'static str) -> Self {
        Health {
            ready: AtomicBool::new(false),
            last_tick_ms: AtomicU64::new(since_boot_ms()),
            stall_after,
            waiting_for,
        }
    }

    /// Called by the loop after each completed evaluation.
    pub fn tick(&self) {
        self.last_tick_ms.store(since_boot_ms(), Ordering::Relaxed);
        self.ready.store(true, Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    pub fn is_live(&self) -> bool {
        let last = self.last_tick_ms.load(Ordering::Relaxed);
        since_boot_ms().saturating_sub(last) <= self.stall_after.as_millis() as u64
    }
}

/// Anything that renders an OpenMetrics exposition: the agent's metrics and the
/// controller's are served by the same server (which rewrites it in the Prometheus text
/// format for clients that do not ask for OpenMetrics).
pub trait Exposition: Send + Sync {
    fn encode(&self) -> String;
}

impl Exposition for Metrics {
    fn encode(&self) -> String {
        Metrics::encode(self)
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<dyn Exposition>,
    health: Arc<Health>,
}

/// OpenMetrics for a scraper that asks for it (Prometheus does), the Prometheus text
/// format 0.0.4 for every other client.
async fn metrics_handler(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
) -> impl IntoResponse {
    let accept: Vec<&str> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .collect();
    let format = Format::negotiate((!accept.is_empty()).then(|| accept.join(",")).as_deref());
    (
        [
            (header::CONTENT_TYPE, format.content_type()),
            (header::VARY, "Accept"),
        ],
        format.render(state.metrics.encode()),
    )
}

async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    if state.health.is_live() {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "loop stalled\n")
    }
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if state.health.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, state.health.waiting_for)
    }
}

/// Serve on `listener` until `shutdown` resolves. Reports the bound address (useful
/// with port 0) through `bound` before serving.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<dyn Exposition>,
    health: Arc<Health>,
    bound: tokio::sync::oneshot::Sender<SocketAddr>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, metrics, health, Router::new(), bound, shutdown).await
}

/// [`serve`] with more read-only routes beside the three (the controller's `/reports`).
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    metrics: Arc<dyn Exposition>,
    health: Arc<Health>,
    extra: Router,
    bound: tokio::sync::oneshot::Sender<SocketAddr>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let _ = bound.send(listener.local_addr()?);
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics, health })
        .merge(extra);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
