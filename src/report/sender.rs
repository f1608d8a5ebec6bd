//! The agent's side of the report protocol: a report every interval and at once on every
//! change, best-effort. Nothing the agent decides waits on it: a controller that is down,
//! slow or refusing costs a log line and a metric, and reports resume with backoff.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;

use super::board::ReportBoard;
use super::contact::ContactClock;
use super::ledger::AgentView;
use super::protocol::{
    self, Acknowledgement, AgentReport, Instruction, REPORTS_PATH, Refusal, Trigger,
};
use crate::boot_clock::{since_boot, since_boot_ms};
use crate::metrics::{Metrics, ReportResultLabels};

/// Where and how this agent reports.
#[derive(Debug, Clone)]
pub struct SenderSettings {
    /// `http://host:port`, without a path.
    pub controller_url: String,
    pub node: String,
    pub boot_id: String,
    /// When this boot began.
    pub boot_time: Timestamp,
    pub interval: Duration,
    pub timeout: Duration,
    /// Read again for every report; `None` sends no credential.
    pub token_file: Option<PathBuf>,
    /// With an https URL, the CA the controller's certificate must chain to (read again
    /// when it changes); `None`: the system's roots.
    pub ca_file: Option<PathBuf>,
    pub dry_run: bool,
}

impl SenderSettings {
    /// Reports go over TLS (an https URL): only then may the controller's answer ask
    /// anything of the agent.
    pub fn over_tls(&self) -> bool {
        self.controller_url.starts_with("https://")
    }
}

/// The longest pause between attempts while the controller fails.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The largest answer read from the controller.
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;
/// How long a stopping agent tries to deliver its last report.
const FINAL_REPORT_DEADLINE: Duration = Duration::from_secs(1);

/// Why one exchange with the controller failed.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("{0}")]
    Url(String),
    #[error("cannot read the token file {path}: {error}")]
    Token { path: String, error: std::io::Error },
    #[error("TLS: {0}")]
    Tls(#[from] super::tls::TlsError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Transport(String),
    #[error("the controller refused the report ({status}): {message}")]
    Refused { status: u16, message: String },
    #[error("the controller's answer is not understood: {0}")]
    Answer(String),
}

impl SendError {
    /// What kind of failure this is, for telling a new problem from the same one again:
    /// a refusal by its status, anything else by its variant.
    fn kind(&self) -> String {
        match self {
            SendError::Refused { status, .. } => format!("refused {status}"),
            SendError::Url(_) => "url".to_string(),
            SendError::Token { .. } => "token".to_string(),
            SendError::Tls(_) => "tls".to_string(),
            SendError::Timeout(_) => "timeout".to_string(),
            SendError::Transport(_) => "transport".to_string(),
            SendError::Answer(_) => "answer".to_string(),
        }
    }
}

pub type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A client for http and https URLs; https certificates are checked against `ca_file`,
/// or the system's roots without one.
pub fn http_client(ca_file: Option<&std::path::Path>) -> Result<HttpClient, SendError> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(Duration::from_secs(3)));
    connector.set_nodelay(true);
    connector.enforce_http(false);
    let tls = super::tls::client_config(ca_file)?;
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .build(connector))
}

/// The sender's client, built again when its CA file changes (a rotated CA is trusted
/// from the next report on) and while the file cannot be used.
struct Clients {
    ca_file: Option<PathBuf>,
    built: Option<(Option<super::tls::FileStamp>, HttpClient)>,
}

impl Clients {
    fn new(ca_file: Option<PathBuf>) -> Clients {
        Clients {
            ca_file,
            built: None,
        }
    }

    fn current(&mut self) -> Result<HttpClient, SendError> {
        let stamp = self.ca_file.as_deref().and_then(super::tls::file_stamp);
        if let Some((built_for, client)) = &self.built
            && *built_for == stamp
        {
            return Ok(client.clone());
        }
        let client = http_client(self.ca_file.as_deref())?;
        if self.built.is_some() {
            tracing::info!(
                "the CA file changed; the controller's certificate is checked against the new one"
            );
        }
        self.built = Some((stamp, client.clone()));
        Ok(client)
    }
}

/// A sequence number that grows within a boot, also across agent restarts: milliseconds
/// since boot (`CLOCK_BOOTTIME`), kept above the last one sent.
fn next_sequence(last: u64) -> u64 {
    since_boot_ms().max(last + 1)
}

/// When this boot began: the `btime` line (seconds since the epoch) of `<proc_root>/stat`.
pub fn read_boot_time(proc_root: &std::path::Path) -> std::io::Result<Timestamp> {
    let path = proc_root.join("stat");
    let stat = std::fs::read_to_string(&path)?;
    parse_boot_time(&stat).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} has no btime line", path.display()),
        )
    })
}

fn parse_boot_time(stat: &str) -> Option<Timestamp> {
    let seconds = stat
        .lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse::<i64>()
        .ok()?;
    Timestamp::from_second(seconds).ok()
}

/// The report of this moment.
pub fn build_report(
    settings: &SenderSettings,
    board: &ReportBoard,
    sequence: u64,
    trigger: Trigger,
    now: Timestamp,
) -> AgentReport {
    let facts = board.snapshot();
    AgentReport {
        version: protocol::version(),
        node: settings.node.clone(),
        boot_id: settings.boot_id.clone(),
        boot_time: settings.boot_time,
        sequence,
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        interval_millis: (settings.interval.as_millis() as u64)
            .clamp(protocol::MIN_INTERVAL_MILLIS, protocol::MAX_INTERVAL_MILLIS),
        sent_at: now,
        trigger,
        dry_run: settings.dry_run,
        conditions: facts.conditions,
        shutdown: facts.shutdown,
        last_eviction: facts.last_eviction,
        api_server: facts.api_server,
        isolation: facts.isolation,
        self_isolation: facts.self_isolation,
    }
}

async fn exchange(
    client: &HttpClient,
    request: Request<Full<Bytes>>,
    timeout: Duration,
) -> Result<(StatusCode, Bytes), SendError> {
    let answer = async {
        let response = client
            .request(request)
            .await
            .map_err(|error| SendError::Transport(transport_error(&error)))?;
        let status = response.status();
        let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|error| SendError::Transport(error.to_string()))?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, answer)
        .await
        .map_err(|_| SendError::Timeout(timeout))?
}

/// The innermost cause, which says what went wrong ("Connection refused").
fn transport_error(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

/// Sends one report and reads the acknowledgement.
pub async fn send_report(
    client: &HttpClient,
    settings: &SenderSettings,
    report: &AgentReport,
) -> Result<Acknowledgement, SendError> {
    let url = format!("{}{REPORTS_PATH}", settings.controller_url);
    let body = serde_json::to_vec(report).map_err(|e| SendError::Answer(e.to_string()))?;
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(&url)
        .header(header::CONTENT_TYPE, "application/json")
        .header(
            header::USER_AGENT,
            concat!("nodekeeper-agent/", env!("CARGO_PKG_VERSION")),
        );
    if let Some(path) = &settings.token_file {
        let token = std::fs::read_to_string(path).map_err(|error| SendError::Token {
            path: path.display().to_string(),
            error,
        })?;
        request = request.header(header::AUTHORIZATION, format!("Bearer {}", token.trim()));
    }
    let request = request
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| SendError::Url(format!("{url}: {e}")))?;
    let (status, body) = exchange(client, request, settings.timeout).await?;
    if status != StatusCode::OK {
        let message = serde_json::from_slice::<Refusal>(&body)
            .map(|refusal| refusal.message)
            .unwrap_or_else(|_| String::from_utf8_lossy(&body).chars().take(200).collect());
        return Err(SendError::Refused {
            status: status.as_u16(),
            message,
        });
    }
    serde_json::from_slice(&body).map_err(|e| SendError::Answer(e.to_string()))
}

/// The pause after `failures` failed attempts in a row.
pub fn backoff(interval: Duration, failures: u32) -> Duration {
    crate::backoff::doubling(interval, failures, MAX_BACKOFF).max(interval)
}

/// Hands the instructions of an accepted answer to whoever follows them: the latest
/// answer's list replaces the one before (an answer without instructions empties it).
fn pass_on(
    settings: &SenderSettings,
    answer: &Acknowledgement,
    instructions: &watch::Sender<Vec<Instruction>>,
) {
    if !settings.over_tls() {
        if !answer.instructions.is_empty() {
            tracing::warn!(
                "the controller's answer over plain http holds instructions; none is followed except over https"
            );
        }
        return;
    }
    if answer.node != settings.node {
        tracing::warn!(answered = %answer.node, node = %settings.node, "the controller's answer names another node; its instructions are ignored");
        return;
    }
    let (known, unknown) = answer.known_instructions();
    if unknown > 0 {
        tracing::debug!(
            unknown,
            "the controller's answer holds instructions this agent does not know; ignored"
        );
    }
    instructions.send_if_modified(|current| {
        if *current == known {
            return false;
        }
        for instruction in known.iter().filter(|i| !current.contains(i)) {
            tracing::info!(
                kind = instruction.kind(),
                "the controller instructs this agent"
            );
        }
        *current = known;
        true
    });
}

/// An answer from the leading replica, about this node, is a contact from when its
/// report was sent (see `super::contact`).
fn count_contact(
    settings: &SenderSettings,
    answer: &Acknowledgement,
    contact: &ContactClock,
    sent_at: Duration,
) {
    if answer.node == settings.node && answer.heard_by_leader {
        contact.report_answered(sent_at);
    }
}

/// The `result` labels of the reports counter: the controller accepted the report,
/// answered with an error, or did not answer.
const ACCEPTED: &str = "accepted";
const REFUSED: &str = "refused";
const FAILED: &str = "failed";

/// Reports until `stop` resolves; the instructions in the controller's answers go to
/// `instructions`, and each answer (from this node's controller) is a contact on
/// `contact`, from the moment its report was sent.
pub async fn run_sender(
    settings: SenderSettings,
    board: Arc<ReportBoard>,
    metrics: Arc<Metrics>,
    instructions: watch::Sender<Vec<Instruction>>,
    contact: Arc<ContactClock>,
    stop: impl Future<Output = ()>,
) {
    let mut clients = Clients::new(settings.ca_file.clone());
    let mut stop = std::pin::pin!(stop);
    let mut sequence = 0;
    let mut failures: u32 = 0;
    // The last failure's kind, so a new kind of failure is logged as a warning again.
    let mut last_failure = String::new();
    let mut trigger = Trigger::Start;
    metrics.start_report_series(&[ACCEPTED, REFUSED, FAILED]);
    tracing::info!(controller = %settings.controller_url, node = %settings.node, interval = ?settings.interval, "reporting to the fence controller");
    loop {
        sequence = next_sequence(sequence);
        let sent_at = since_boot();
        let report = build_report(&settings, &board, sequence, trigger, Timestamp::now());
        let result = match clients.current() {
            Ok(client) => {
                let send = send_report(&client, &settings, &report);
                let mut send = std::pin::pin!(send);
                tokio::select! {
                    result = &mut send => result,
                    _ = &mut stop => {
                        // This report may be the one that says the drain finished: it is
                        // let finish (briefly) rather than started over.
                        let _ = tokio::time::timeout(FINAL_REPORT_DEADLINE, send).await;
                        break;
                    }
                }
            }
            Err(error) => Err(error),
        };
        let label = match &result {
            Ok(_) => ACCEPTED,
            Err(SendError::Refused { .. }) => REFUSED,
            Err(_) => FAILED,
        };
        metrics
            .reports
            .get_or_create(&ReportResultLabels {
                result: label.to_string(),
            })
            .inc();
        match result {
            Ok(answer) => {
                count_contact(&settings, &answer, &contact, sent_at);
                pass_on(&settings, &answer, &instructions);
                if failures > 0 {
                    tracing::info!(controller = %settings.controller_url, "reports reach the controller again");
                }
                failures = 0;
                last_failure.clear();
                metrics
                    .report_last_accepted
                    .set(Timestamp::now().as_millisecond() as f64 / 1000.0);
            }
            Err(error) => {
                // No answer: nothing is asked any more (instructions hold while the
                // controller answers; a stale one must not be followed later, say an
                // endIsolation undoing an isolation the agent began since by itself).
                instructions.send_if_modified(|current| {
                    let had = !current.is_empty();
                    current.clear();
                    had
                });
                failures = failures.saturating_add(1);
                let kind = error.kind();
                if kind != last_failure {
                    tracing::warn!(controller = %settings.controller_url, %error, "cannot report to the fence controller; the node stays protected locally, retrying with backoff");
                    last_failure = kind;
                } else {
                    tracing::debug!(%error, failures, "report failed again");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff(settings.interval, failures)) => trigger = Trigger::Interval,
            _ = board.changed() => trigger = Trigger::Change,
            _ = &mut stop => break,
        }
    }
    // On a node that is powering off, systemd stops the agent right after the drain
    // released the logind lock, maybe before the report saying so went out; the
    // controller releases a drained node only on that word. So the agent's last act is
    // one more report of what it knows, within a short deadline.
    sequence = next_sequence(sequence);
    let sent_at = since_boot();
    let report = build_report(
        &settings,
        &board,
        sequence,
        Trigger::Change,
        Timestamp::now(),
    );
    let deadline = settings.timeout.min(FINAL_REPORT_DEADLINE);
    let sent = match clients.current() {
        Ok(client) => tokio::time::timeout(deadline, send_report(&client, &settings, &report))
            .await
            .unwrap_or(Err(SendError::Timeout(deadline))),
        Err(error) => Err(error),
    };
    match sent {
        Ok(answer) => {
            count_contact(&settings, &answer, &contact, sent_at);
            tracing::info!(sequence, "last report before stopping delivered")
        }
        Err(error) => tracing::info!(%error, "last report before stopping not delivered"),
    }
}

/// Every node's latest report from a controller's `/reports` (its metrics address).
pub async fn fetch_views(base_url: &str) -> Result<Vec<AgentView>, SendError> {
    let base = base_url.trim_end_matches('/');
    let url = format!("{base}{}", super::server::VIEWS_PATH);
    let request = Request::builder()
        .method(Method::GET)
        .uri(&url)
        .body(Full::new(Bytes::new()))
        .map_err(|e| SendError::Url(format!("{url}: {e}")))?;
    let (status, body) = exchange(&http_client(None)?, request, Duration::from_secs(10))
        .await
        .map_err(|error| SendError::Transport(format!("{url}: {error}")))?;
    if status != StatusCode::OK {
        return Err(SendError::Refused {
            status: status.as_u16(),
            message: format!("{url}: {}", String::from_utf8_lossy(&body)),
        });
    }
    serde_json::from_slice(&body).map_err(|e| SendError::Answer(format!("{url}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_time_is_btime() {
        let stat = "cpu  1 2 3\nintr 5\nbtime 1763600000\nprocesses 42\n";
        assert_eq!(
            parse_boot_time(stat),
            Some(Timestamp::from_second(1_763_600_000).expect("time"))
        );
        assert_eq!(parse_boot_time("cpu 1\n"), None);
        assert!(
            read_boot_time(std::path::Path::new("/proc")).is_ok(),
            "this machine's /proc/stat has btime"
        );
    }

    fn settings_for(url: &str) -> SenderSettings {
        SenderSettings {
            controller_url: url.to_string(),
            node: "worker-1".to_string(),
            boot_id: "boot".to_string(),
            boot_time: Timestamp::UNIX_EPOCH,
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(5),
            token_file: None,
            ca_file: None,
            dry_run: false,
        }
    }

    fn answer_for(node: &str) -> Acknowledgement {
        Acknowledgement {
            version: "1.3".to_string(),
            node: node.to_string(),
            sequence: 7,
            instructions: vec![
                serde_json::json!({"kind": "isolate", "reason": "cut off", "request": 3}),
            ],
            heard_by_leader: true,
        }
    }

    /// docs/security.md: only the controller the agent checked by its certificate may ask
    /// anything of it, and only for its own node. Anyone on the path of a plain-http
    /// report could otherwise have the node isolated.
    #[test]
    fn instructions_are_followed_only_over_tls_and_only_for_this_node() {
        let followed = |url: &str, answer: &Acknowledgement| {
            let (sender, receiver) = watch::channel(Vec::new());
            pass_on(&settings_for(url), answer, &sender);
            receiver.borrow().clone()
        };
        let isolate = Instruction::Isolate {
            reason: "cut off".to_string(),
            request: 3,
        };
        assert_eq!(
            followed("https://controller:9849", &answer_for("worker-1")),
            vec![isolate]
        );
        assert!(followed("http://controller:9849", &answer_for("worker-1")).is_empty());
        assert!(followed("https://controller:9849", &answer_for("worker-2")).is_empty());
    }

    #[test]
    fn backoff_doubles_from_the_interval_up_to_a_ceiling() {
        let interval = Duration::from_secs(2);
        assert_eq!(backoff(interval, 0), interval);
        assert_eq!(backoff(interval, 1), interval);
        assert_eq!(backoff(interval, 2), Duration::from_secs(4));
        assert_eq!(backoff(interval, 4), Duration::from_secs(16));
        assert_eq!(backoff(interval, 40), MAX_BACKOFF);
        // An interval above the ceiling is never shortened.
        assert_eq!(backoff(Duration::from_secs(60), 3), Duration::from_secs(60));
    }

    #[test]
    fn sequences_grow_and_count_time_since_boot() {
        let first = next_sequence(0);
        assert!(first > 0, "milliseconds since boot");
        let second = next_sequence(first);
        assert!(second > first);
        assert_eq!(next_sequence(u64::MAX / 2), u64::MAX / 2 + 1);
    }

    #[test]
    fn a_report_carries_the_boards_facts() {
        let board = ReportBoard::new();
        board.set_conditions(vec!["DiskPressure".to_string()]);
        let settings = SenderSettings {
            controller_url: "http://127.0.0.1:1".to_string(),
            node: "worker-1".to_string(),
            boot_id: "b".to_string(),
            boot_time: "2026-11-20T08:00:00Z".parse().expect("time"),
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            token_file: None,
            ca_file: None,
            dry_run: true,
        };
        let now: Timestamp = "2026-11-24T05:00:00Z".parse().expect("time");
        let report = build_report(&settings, &board, 7, Trigger::Change, now);
        assert_eq!(report.conditions, ["DiskPressure"]);
        assert_eq!(report.sequence, 7);
        assert!(report.dry_run);
        let decoded =
            protocol::decode_report(&serde_json::to_vec(&report).expect("json")).expect("valid");
        assert_eq!(decoded, report);
    }
}
