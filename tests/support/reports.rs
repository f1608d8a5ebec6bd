//! Talking to the controller's report endpoint: the way a hostile or broken client does,
//! raw HTTP/1.1 over TCP, so the tests control every byte, and the answer read whole; and
//! as a well-behaved agent played by the test does ([`Reporting`]: reports over TLS with
//! a node token, from [`report_from`]).

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A report request's bytes: `POST /v1/reports` with `body`, the bearer `token` if any,
/// and `Connection: close` if `close`.
pub fn report_request(token: Option<&str>, body: &[u8], close: bool) -> Vec<u8> {
    let mut head = format!(
        "POST /v1/reports HTTP/1.1\r\nHost: nodekeeper\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    if close {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    request
}

/// One HTTP/1.1 exchange; the status and the JSON body.
pub async fn post(address: &str, token: Option<&str>, body: &[u8]) -> (u16, Value) {
    exchange(address, &report_request(token, body, true)).await
}

/// Writes `request` while reading the answer: a server that refuses a body it has not
/// read answers and closes early, and the answer must still be read (a write into the
/// closed connection fails, and is ignored).
pub async fn exchange(address: &str, request: &[u8]) -> (u16, Value) {
    let stream = TcpStream::connect(address).await.expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    let request = request.to_vec();
    // The write half stays open until the answer is read: closing it would end the
    // request early.
    let writing = tokio::spawn(async move {
        let _ = writer.write_all(&request).await;
        writer
    });
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), reader.read_to_end(&mut answer))
        .await
        .expect("an answer within 20 s");
    if let Err(error) = read {
        // A reset after the answer (the server dropped unread body bytes) is fine.
        assert!(!answer.is_empty(), "no answer: {error}");
    }
    drop(writing);
    parse_answer(&answer)
}

pub fn parse_answer(answer: &[u8]) -> (u16, Value) {
    let text = String::from_utf8_lossy(answer);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {text:?}"));
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// POSTs `report` as JSON, with the bearer `token` if any; the status and the JSON body.
pub async fn post_report(address: &str, token: Option<&str>, report: &Value) -> (u16, Value) {
    post(address, token, &serde_json::to_vec(report).expect("json")).await
}

/// The node token the tests give `node`'s agent (in the `node-tokens` Secret).
pub fn token_of(node: &str) -> String {
    format!("node-token-of-{node}-0123456789abcdef")
}

/// A report of `node`'s agent (protocol 1.3) from boot `boot`, saying `self_isolation`.
pub fn report_from(node: &str, boot: &str, sequence: u64, self_isolation: Value) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "version": "1.3", "node": node, "bootId": boot,
        "bootTime": "2026-11-20T08:00:00Z", "sequence": sequence, "agentVersion": "test",
        "intervalMillis": 500, "sentAt": k8s_openapi::jiff::Timestamp::now().to_string(),
        "trigger": "interval",
        "conditions": [], "shutdown": {"state": "none", "lockHeld": true},
        "apiServer": {"state": "reachable"}, "isolation": {"state": "none"},
        "selfIsolation": self_isolation,
    }))
    .expect("a report")
}

/// The boot of the node whose agent promises to isolate it.
pub const PROMISING_BOOT: &str = "5c1e2f4a-0d8b-4a51-9d6e-6f3b0b1c2d3e";

/// A report of `node`'s agent promising, backed by its watchdog, that no pod process
/// runs later than `within` after it last heard the controller.
pub fn promising_report(node: &str, sequence: u64, within: Duration) -> Vec<u8> {
    report_from(
        node,
        PROMISING_BOOT,
        sequence,
        serde_json::json!({
            "armed": true, "isolateAfterMillis": 1000, "withinMillis": within.as_millis() as u64,
            "watchdogTimeoutMillis": 1000, "watchdog": "/dev/watchdog (test)",
        }),
    )
}

/// An agent played by the test: `node`'s reports posted over TLS with its node token
/// ([`token_of`]) every half second, each answered 200, until [`Reporting::stop`].
pub struct Reporting {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<u64>,
}

impl Reporting {
    /// Starts posting `report` of each sequence number from `first_sequence` to the
    /// controller's report endpoint at `address`, trusting `ca`.
    pub fn start(
        address: String,
        ca: std::path::PathBuf,
        node: &'static str,
        first_sequence: u64,
        report: impl Fn(u64) -> Vec<u8> + Send + 'static,
    ) -> Reporting {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = tokio::spawn(Self::post(
            address,
            ca,
            node,
            first_sequence,
            stop.clone(),
            report,
        ));
        Reporting { stop, task }
    }

    /// Stops after the report on its way; returns the next sequence number.
    pub async fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.task.await.expect("the reports")
    }

    async fn post(
        address: String,
        ca: std::path::PathBuf,
        node: &'static str,
        first_sequence: u64,
        stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
        report: impl Fn(u64) -> Vec<u8>,
    ) -> u64 {
        use http_body_util::BodyExt;
        let client = nodekeeper::report::sender::http_client(Some(&ca)).expect("a TLS client");
        let mut sequence = first_sequence;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let request = http::Request::post(format!("https://{address}/v1/reports"))
                .header("content-type", "application/json")
                .header("authorization", format!("Bearer {}", token_of(node)))
                .body(http_body_util::Full::new(hyper::body::Bytes::from(report(
                    sequence,
                ))))
                .expect("a request");
            sequence += 1;
            let answer = client
                .request(request)
                .await
                .expect("the controller answers");
            let status = answer.status();
            let body = answer
                .into_body()
                .collect()
                .await
                .expect("the answer")
                .to_bytes();
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        sequence
    }
}

/// The rig of the tests of a release on a self-isolation promise: worker-1 to worker-3
/// Ready, with their node tokens and their kubelets renewing their Leases; worker-2 on
/// [`PROMISING_BOOT`], running a database, with no fence configuration (the node has no
/// fence device); a CA, and the certificate the controller serves reports with.
pub struct PromiseRig {
    pub server: super::apiserver::FakeApiServer,
    pub kubelets: super::kubelet::Kubelets,
    pub ca: super::tls::Pair,
    pub served: super::tls::Pair,
}

impl PromiseRig {
    /// The rig, its certificates in `dir` (openssl must be there: `require!` it first).
    pub async fn start(dir: &std::path::Path) -> PromiseRig {
        use super::controller::{node_on_boot, ready_cluster, seed_database, seed_node_tokens};
        let ca = super::tls::certificate_authority(dir, "ca").expect("a CA");
        let served = super::tls::server_certificate(dir, "controller", &ca).expect("a certificate");
        let nodes = ["worker-1", "worker-2", "worker-3"];
        let server = ready_cluster(&nodes).await;
        server.seed(&node_on_boot(
            "worker-2",
            "True",
            k8s_openapi::jiff::Timestamp::now(),
            PROMISING_BOOT,
        ));
        let tokens: Vec<(&str, String)> =
            nodes.iter().map(|node| (*node, token_of(node))).collect();
        seed_node_tokens(&server, &tokens);
        seed_database(&server, "worker-2", "db-0");
        let kubelets = super::kubelet::Kubelets::start(&server, &nodes).await;
        PromiseRig {
            server,
            kubelets,
            ca,
            served,
        }
    }

    /// The controller's configuration for it in `dir`: silence detection after `silence`,
    /// no fence for NotReady alone, `margin` of `selfIsolationMargin`, the release by the
    /// out-of-service taint only (as shipped: the pod garbage collector deletes), node-token
    /// reports over TLS.
    pub fn controller_config(
        &self,
        dir: &std::path::Path,
        silence: Duration,
        margin: Duration,
    ) -> std::path::PathBuf {
        super::controller::controller_config(
            dir,
            &format!(
                "silenceTimeout: {}s\nunhealthyDuration: 10m\nselfIsolationMargin: {}s\n\
                 release: {{outOfServiceTaint: true, deletePods: false}}\n\
                 reports: {{address: \"127.0.0.1:0\", nodeTokensSecret: node-tokens, reconnectGrace: 20s, {}}}\n",
                silence.as_secs(),
                margin.as_secs(),
                self.served.reports_setting()
            ),
        )
    }

    /// worker-2's agent, played by the test, promising over TLS that no pod process runs
    /// later than `within` after it last heard the controller; once `controller` holds
    /// the promise.
    pub async fn promise(
        &self,
        controller: &super::controller::ControllerProcess,
        within: Duration,
    ) -> Reporting {
        let reporting = Reporting::start(
            controller.reports_address(),
            self.ca.cert.clone(),
            "worker-2",
            1,
            move |sequence| promising_report("worker-2", sequence, within),
        );
        super::controller::wait_for(controller, "worker-2's promise", || {
            controller
                .agent_view("worker-2")
                .filter(|view| view["report"]["selfIsolation"]["armed"] == true)
        })
        .await;
        reporting
    }
}
