//! The controller's report endpoint: `POST /v1/reports` on its own listener. Every
//! request is bounded (header and body deadlines, a body size limit, a cap on open
//! connections and on reports handled at once, a lifetime per connection), so slow or
//! flooding clients cost a bounded share and good agents keep being served.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{HeaderValue, Method, Response, StatusCode, header};
use hyper::body::Bytes;
use k8s_openapi::jiff::Timestamp;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::metrics::ReportResultLabels;

use super::auth::{AuthPolicy, Authenticator, bearer_token};
use super::http1::{self, BodyError, BodyReader, Head, HeadError};
use super::ledger::{AgentView, Census, ReportLedger};
use super::protocol::{
    self, Acknowledgement, Instruction, REPORTS_PATH, Refusal, RefusalReason, decode_report,
};
use super::tls::ServerIdentity;

/// How the endpoint listens, and its limits.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReportsPolicy {
    /// Serve the endpoint at all.
    pub enabled: bool,
    pub address: String,
    pub auth: AuthPolicy,
    pub max_body_bytes: usize,
    /// The deadline for a request's headers, and then for its body.
    pub request_timeout: Duration,
    /// Open connections at most; further clients wait to be accepted.
    pub max_connections: usize,
    /// Report bodies read at once at most; further ones get 429.
    pub max_in_flight: usize,
    /// A connection is closed (gracefully) after this long, so no client holds one for
    /// ever.
    pub connection_lifetime: Duration,
    /// After this replica starts leading, how long a node no agent has reported for yet
    /// counts as "not known yet" rather than "has no agent": every running agent reaches a
    /// new controller within its backoff (at most 30 s) plus one report timeout.
    pub reconnect_grace: Duration,
    /// Serve over TLS with this certificate and key; `None`: plain HTTP.
    pub tls: Option<TlsFiles>,
    /// The Service (in the controller's namespace, without a selector) agents report
    /// to, whose EndpointSlice the leader points at itself (`report_endpoint.rs`);
    /// `None`: the deployment routes reports to the leader some other way.
    pub leader_service: Option<String>,
}

/// The report endpoint's certificate and key, PEM files (a `kubernetes.io/tls` Secret's
/// `tls.crt` and `tls.key`), read again when they change.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TlsFiles {
    pub cert_file: std::path::PathBuf,
    pub key_file: std::path::PathBuf,
}

impl Default for ReportsPolicy {
    fn default() -> ReportsPolicy {
        ReportsPolicy {
            enabled: true,
            address: "0.0.0.0:9849".to_string(),
            auth: AuthPolicy::default(),
            max_body_bytes: protocol::DEFAULT_MAX_BODY_BYTES,
            request_timeout: Duration::from_secs(5),
            max_connections: 10_000,
            max_in_flight: 512,
            connection_lifetime: Duration::from_secs(600),
            reconnect_grace: Duration::from_secs(40),
            tls: None,
            leader_service: None,
        }
    }
}

/// Agents silent this long are forgotten (their nodes were removed, most likely).
const FORGET_AFTER: Duration = Duration::from_secs(3600);
/// The most header bytes a client may send; a real report's headers are about 1.5 KiB.
/// With the connection cap it bounds what slow clients can make the controller hold.
const MAX_HEADER_BYTES: usize = 16 * 1024;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgentStateLabels {
    state: String,
}

/// The endpoint's metrics, registered in the controller's registry.
pub struct ReportMetrics {
    /// By `result`: `accepted`, or the refusal reason.
    reports: Family<ReportResultLabels, Counter>,
    handling: Histogram,
    agents: Family<AgentStateLabels, Gauge>,
}

impl ReportMetrics {
    pub fn register(registry: &mut Registry) -> ReportMetrics {
        let metrics = ReportMetrics {
            reports: Family::default(),
            handling: Histogram::new(exponential_buckets(0.0001, 4.0, 10)),
            agents: Family::default(),
        };
        registry.register(
            "controller_reports",
            "Agent reports received, by result: accepted, or why refused",
            metrics.reports.clone(),
        );
        registry.register(
            "controller_report_handling_seconds",
            "Time from a report's headers to the answer, authentication included",
            metrics.handling.clone(),
        );
        registry.register(
            "controller_agents",
            "Agents by what their latest report says: reporting, silent (no report in three intervals), under_pressure, shutting_down, shut_down, api_unreachable",
            metrics.agents.clone(),
        );
        metrics
    }

    fn count(&self, result: &str) {
        self.reports
            .get_or_create(&ReportResultLabels {
                result: result.to_string(),
            })
            .inc();
    }

    fn publish(&self, census: &Census) {
        for (state, count) in [
            ("reporting", census.reporting),
            ("silent", census.silent),
            ("under_pressure", census.under_pressure),
            ("shutting_down", census.shutting_down),
            ("shut_down", census.shut_down),
            ("api_unreachable", census.api_unreachable),
        ] {
            self.agents
                .get_or_create(&AgentStateLabels {
                    state: state.to_string(),
                })
                .set(count as i64);
        }
    }
}

/// Everything the endpoint shares: the ledger, the authenticator, the limits.
pub struct ReportHub {
    ledger: Mutex<ReportLedger>,
    auth: Authenticator,
    policy: ReportsPolicy,
    metrics: Arc<ReportMetrics>,
    in_flight: tokio::sync::Semaphore,
    /// The certificate the endpoint serves, when it serves TLS.
    identity: Option<Arc<ServerIdentity>>,
    /// What the controller asks of each node's agent, handed out with every answer to
    /// that node's reports (only over TLS).
    instructions: Mutex<HashMap<String, Vec<Instruction>>>,
    /// This replica leads (its answers say so: only the leader's hearing counts).
    leading: std::sync::atomic::AtomicBool,
}

type Answer = Response<Bytes>;

fn json_answer<T: serde::Serialize>(status: StatusCode, body: &T) -> Answer {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut response = Response::new(Bytes::from(bytes));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn refusal(reason: RefusalReason, message: impl Into<String>) -> Answer {
    let status =
        StatusCode::from_u16(reason.http_status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let mut response = json_answer(status, &Refusal::new(reason, message));
    if reason == RefusalReason::Overloaded || reason == RefusalReason::Unavailable {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    // A client that is refused does not keep its connection: only agents whose reports
    // are taken hold one open, so unknown clients cannot sit on the connection slots.
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

impl ReportHub {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        policy: ReportsPolicy,
        metrics: Arc<ReportMetrics>,
        identity: Option<Arc<ServerIdentity>>,
    ) -> ReportHub {
        ReportHub {
            identity,
            ledger: Mutex::new(ReportLedger::default()),
            auth: Authenticator::new(client, namespace, policy.auth.clone()),
            in_flight: tokio::sync::Semaphore::new(policy.max_in_flight.max(1)),
            policy,
            metrics,
            instructions: Mutex::new(HashMap::new()),
            leading: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// From now on, answer node `node`'s reports with `instructions` (none: nothing).
    /// Instructions are handed out over TLS only: over plain HTTP anyone on the path
    /// could forge or drop them, and an agent follows none that came that way.
    pub fn instruct(&self, node: &str, instructions: Vec<Instruction>) {
        let mut all = self.instructions.lock().unwrap_or_else(|e| e.into_inner());
        if instructions.is_empty() {
            all.remove(node);
        } else {
            all.insert(node.to_string(), instructions);
        }
    }

    /// Asks nothing of any agent any more (this replica stopped leading: the next leader
    /// decides what to ask).
    pub fn withdraw_instructions(&self) {
        self.set_leading(false);
        self.instructions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Whether this replica leads, as its answers tell the agents.
    pub fn set_leading(&self, leading: bool) {
        self.leading
            .store(leading, std::sync::atomic::Ordering::SeqCst);
    }

    /// What node `node`'s agent is asked in the answer to its report.
    fn instructions_for(&self, node: &str) -> Vec<serde_json::Value> {
        if !self.is_tls() {
            return Vec::new();
        }
        let all = self.instructions.lock().unwrap_or_else(|e| e.into_inner());
        all.get(node)
            .into_iter()
            .flatten()
            .filter_map(|instruction| serde_json::to_value(instruction).ok())
            .collect()
    }

    pub fn policy(&self) -> &ReportsPolicy {
        &self.policy
    }

    /// Reports arrive over TLS, so a token cannot be read off the wire and a report's
    /// content may decide something.
    pub fn is_tls(&self) -> bool {
        self.identity.is_some()
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, ReportLedger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every node's latest report, as `/reports` serves it.
    pub fn views(&self) -> Vec<AgentView> {
        self.ledger().views(Instant::now())
    }

    pub fn census(&self) -> Census {
        self.ledger().census(Instant::now())
    }

    /// When node `node`'s agent was last heard, if it has reported.
    pub fn heard(&self, node: &str) -> Option<super::ledger::AgentHeard> {
        self.ledger().heard(node)
    }

    /// The agents whose next report is overdue by half an interval.
    pub fn overdue(&self) -> Vec<(String, super::ledger::AgentHeard)> {
        self.ledger().overdue(Instant::now())
    }

    /// Answers one request, whose body `body` reads.
    async fn handle<IO>(&self, head: &Head, body: &mut BodyReader<'_, IO>) -> Answer
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let started = Instant::now();
        // Boxed: the connection's task keeps room for its largest future for as long as
        // the connection is open, and answering one (reading the body, a TokenReview
        // through the kube client) takes kilobytes; 5,000 agents between reports would
        // hold that room for nothing. A box per report costs far less.
        let answer = Box::pin(self.answer(head, body)).await;
        self.metrics
            .handling
            .observe(started.elapsed().as_secs_f64());
        answer
    }

    async fn answer<IO>(&self, head: &Head, body: &mut BodyReader<'_, IO>) -> Answer
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        if head.path != REPORTS_PATH {
            return self.refuse(
                RefusalReason::NotFound,
                format!("reports go to POST {REPORTS_PATH}"),
            );
        }
        if head.method != Method::POST {
            let mut answer = self.refuse(
                RefusalReason::NotFound,
                format!("reports go to POST {REPORTS_PATH}"),
            );
            *answer.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
            return answer;
        }
        // The permit covers reading and decoding the body (what costs memory); it is
        // given back before authentication, which known agents pass from the cache.
        let Ok(permit) = self.in_flight.try_acquire() else {
            return self.refuse(
                RefusalReason::Overloaded,
                "too many reports at once; retry shortly",
            );
        };
        let limit = self.policy.max_body_bytes;
        if matches!(body.framing, http1::Framing::Length(length) if length > limit as u64) {
            return self.refuse(
                RefusalReason::TooLarge,
                format!("the body exceeds {limit} bytes"),
            );
        }
        let token = match bearer_token(
            head.headers
                .get(header::AUTHORIZATION)
                .and_then(|value| value.to_str().ok()),
        ) {
            Ok(token) => token.to_string(),
            Err(failure) => return self.refuse(failure.reason(), failure.to_string()),
        };
        let body =
            match tokio::time::timeout(self.policy.request_timeout, body.read_all(limit)).await {
                Err(_) => {
                    return self.refuse(
                        RefusalReason::Timeout,
                        format!(
                            "the body did not arrive within {:?}",
                            self.policy.request_timeout
                        ),
                    );
                }
                Ok(Err(BodyError::TooLarge(_))) => {
                    return self.refuse(
                        RefusalReason::TooLarge,
                        format!("the body exceeds {limit} bytes"),
                    );
                }
                Ok(Err(error)) => {
                    return self.refuse(
                        RefusalReason::Malformed,
                        format!("reading the body: {error}"),
                    );
                }
                Ok(Ok(bytes)) => bytes,
            };
        let report = match decode_report(&body) {
            Ok(report) => report,
            Err(error) => return self.refuse(error.reason(), error.to_string()),
        };
        drop(body);
        drop(permit);
        // Boxed too: only a token not in the cache needs the large TokenReview future.
        let identity = match Box::pin(self.auth.authenticate(&token, &report.node)).await {
            Ok(identity) => identity,
            Err(failure) => {
                tracing::debug!(node = %report.node, %failure, "report refused");
                return self.refuse(failure.reason(), failure.to_string());
            }
        };
        let node = report.node.clone();
        let sequence = report.sequence;
        let accepted = self
            .ledger()
            .accept(&identity, report, Instant::now(), Timestamp::now());
        match accepted {
            Ok(outcome) => {
                self.metrics.count("accepted");
                if let super::ledger::Accepted::NewBoot { previous } = &outcome {
                    tracing::info!(%node, %previous, "the node's agent reports from a new boot");
                } else if outcome == super::ledger::Accepted::First {
                    tracing::debug!(%node, "first report from the node's agent");
                }
                let instructions = self.instructions_for(&node);
                let heard_by_leader = self.leading.load(std::sync::atomic::Ordering::SeqCst);
                let mut answer = json_answer(
                    StatusCode::OK,
                    &Acknowledgement {
                        version: protocol::version(),
                        node,
                        sequence,
                        instructions,
                        heard_by_leader,
                    },
                );
                // An agent that reached a replica that does not lead (the report Service
                // pointed here before another took over) must not keep its connection:
                // its next report goes through the Service again, to the leader.
                if !heard_by_leader {
                    answer
                        .headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                answer
            }
            Err(refused) => {
                tracing::debug!(%node, %refused, "report refused");
                self.refuse(refused.reason(), refused.to_string())
            }
        }
    }

    fn refuse(&self, reason: RefusalReason, message: impl Into<String>) -> Answer {
        self.metrics.count(reason.as_str());
        refusal(reason, message)
    }
}

/// Serves the endpoint on `listener` until `shutdown` resolves, over TLS when the hub
/// has a certificate.
pub async fn serve(
    listener: tokio::net::TcpListener,
    hub: Arc<ReportHub>,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = match hub
        .identity
        .as_ref()
        .map(|identity| identity.server_config())
    {
        Some(Ok(config)) => Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
        Some(Err(error)) => {
            tracing::error!(%error, "the report endpoint cannot serve TLS; no reports are taken");
            return;
        }
        None => None,
    };
    let connections = Arc::new(tokio::sync::Semaphore::new(
        hub.policy.max_connections.max(1),
    ));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
            _ = &mut shutdown => return,
        };
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, usually: pause instead of spinning.
                    tracing::warn!(%error, "accepting a report connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => return,
        };
        let _ = stream.set_nodelay(true);
        let hub = hub.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            // The permit is held through the handshake too: a client that connects and
            // never finishes it holds a slot for at most one request timeout.
            let _permit = permit;
            let timeout = hub.policy.request_timeout;
            let lifetime = hub.policy.connection_lifetime;
            match acceptor {
                None => serve_connection(stream, hub, lifetime).await,
                Some(acceptor) => {
                    match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => serve_connection(tls, hub, lifetime).await,
                        Ok(Err(error)) => {
                            hub.metrics.count("tls_handshake_failed");
                            tracing::debug!(%error, "a report connection's TLS handshake failed");
                        }
                        Err(_) => {
                            hub.metrics.count("tls_handshake_failed");
                            tracing::debug!(
                                "a report connection did not finish its TLS handshake in time"
                            );
                        }
                    }
                }
            }
        });
    }
}

/// Serves the requests of one connection, plain or TLS, one after the other, closing it
/// after `lifetime` (between requests) or when the client waits longer than the request
/// timeout to start the next one. Between requests it holds no buffer (see `http1`).
async fn serve_connection<I>(mut io: I, hub: Arc<ReportHub>, lifetime: Duration)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let request_timeout = hub.policy.request_timeout;
    let closes_at = tokio::time::Instant::now() + lifetime;
    // What the client sent after its last request's end (it need not wait for answers).
    let mut pipelined: Vec<u8> = Vec::new();
    loop {
        let now = tokio::time::Instant::now();
        if now >= closes_at {
            http1::close(&mut io, request_timeout).await;
            return;
        }
        let head_deadline = now + request_timeout;
        let mut buffer = if pipelined.is_empty() {
            let Some(first) = http1::await_request(&mut io, head_deadline.min(closes_at)).await
            else {
                http1::close(&mut io, request_timeout).await;
                return;
            };
            let mut buffer = Vec::with_capacity(4096);
            buffer.push(first);
            buffer
        } else {
            std::mem::take(&mut pipelined)
        };
        let (head, head_length) =
            match http1::read_head(&mut io, &mut buffer, head_deadline, MAX_HEADER_BYTES).await {
                Ok(Some(parsed)) => parsed,
                // The client went away, or sent its head too slowly.
                Ok(None) => {
                    http1::close(&mut io, request_timeout).await;
                    return;
                }
                Err(error) => {
                    let status = match error {
                        HeadError::TooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                        HeadError::Malformed(_) => StatusCode::BAD_REQUEST,
                    };
                    // Counted like every other refusal, under the reason the answer gives.
                    let mut answer = hub.refuse(RefusalReason::Malformed, error.to_string());
                    *answer.status_mut() = status;
                    send(&mut io, &answer, true, request_timeout).await;
                    return;
                }
            };
        buffer.drain(..head_length);
        let mut body = BodyReader {
            io: &mut io,
            buffered: &mut buffer,
            framing: head.framing,
            expects_continue: head.expects_continue,
            finished: false,
        };
        let answer = hub.handle(&head, &mut body).await;
        // A body left unread would be taken for the next request: such a connection
        // (a refusal before the body, mostly) ends with its answer. So does one past its
        // lifetime, saying so, so the client does not send its next report into a close.
        let close = !body.finished
            || !head.keep_alive
            || answer.headers().get(header::CONNECTION).is_some()
            || tokio::time::Instant::now() >= closes_at;
        if !send(&mut io, &answer, close, request_timeout).await || close {
            return;
        }
        if !buffer.is_empty() {
            pipelined = buffer;
        }
    }
}

/// Writes `answer`; false when it could not be written in time.
async fn send<I>(io: &mut I, answer: &Answer, close: bool, within: Duration) -> bool
where
    I: tokio::io::AsyncWrite + Unpin,
{
    let bytes = http1::encode_response(answer.status(), answer.headers(), answer.body(), close);
    http1::write_response(io, &bytes, close, within).await
}

/// Publishes the agents' census every second, and forgets agents silent for an hour,
/// until `stop` resolves.
pub async fn publish_census(hub: Arc<ReportHub>, stop: impl Future<Output = ()>) {
    let mut stop = std::pin::pin!(stop);
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                let (forgotten, census) = {
                    let mut ledger = hub.ledger();
                    let now = Instant::now();
                    (ledger.forget_silent(now, FORGET_AFTER), ledger.census(now))
                };
                if forgotten > 0 {
                    tracing::info!(forgotten, "forgot agents silent for an hour");
                }
                hub.metrics.publish(&census);
            }
            _ = &mut stop => return,
        }
    }
}

/// The path on the metrics listener where the latest reports are served as JSON.
pub const VIEWS_PATH: &str = "/reports";

/// `GET /reports` for the metrics listener: every node's latest report (what
/// `nodekeeper controller status --controller-url` reads). Read-only, like `/metrics`.
pub fn views_route(hub: Arc<ReportHub>) -> axum::Router {
    axum::Router::new().route(
        VIEWS_PATH,
        axum::routing::get(move || {
            let hub = hub.clone();
            async move {
                (
                    [(header::CONTENT_TYPE, "application/json")],
                    serde_json::to_string(&hub.views()).unwrap_or_else(|_| "[]".to_string()),
                )
            }
        }),
    )
}
