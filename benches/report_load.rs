//! Agent reports at scale: N simulated agents (default 5,000), each on its own keep-alive
//! connection and with its own projected token, report every 2 s to the real
//! `nodekeeper controller` process, which authenticates them with TokenReviews against
//! the test API server (tests/support/apiserver) over loopback.
//!
//! Measured on the controller over the window, after a warm-up in which every agent
//! reported (and its token was reviewed) once: CPU (utime + stime), resident and peak
//! memory, and, at the agents, how long each report took to be answered (p50, p99, max).
//! The controller is measured twice: over plain HTTP, and over TLS (a certificate made with
//! `openssl`, each agent with its own TLS 1.3 session). Baseline, in the same run and
//! under the same load: a bare HTTP/1 server in a process of its own (this binary
//! re-executed) that reads each body and answers a fixed acknowledgement: what any
//! endpoint pays for the HTTP alone.
//!
//! Run: cargo bench --bench report_load
//! Environment: NK_REPORT_AGENTS (default 5000), NK_REPORT_WINDOW_SECONDS (default 30).

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use nodekeeper::report::protocol::{self, AgentReport};
use serde_json::json;

use support::apiserver::{FakeApiServer, projected_token};
use support::controller::{ControllerProcess, crd, node, write_controller_config};
use support::process_usage;

/// Set in the re-executed child that plays the bare server.
const BARE_SERVER: &str = "NK_BENCH_BARE_REPORT_SERVER";
const INTERVAL: Duration = Duration::from_secs(2);
/// Every agent reports (and is reviewed) at least once before the window opens.
const WARM_UP: Duration = Duration::from_secs(6);
const NAMESPACE: &str = "nodekeeper-system";
const ACCOUNT: &str = "nodekeeper-agent";
const AUDIENCE: &str = "nodekeeper-controller";

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn main() {
    if std::env::var(BARE_SERVER).is_ok() {
        bare_server();
        return;
    }
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    let agents: usize = env_or("NK_REPORT_AGENTS", "5000")
        .parse()
        .expect("NK_REPORT_AGENTS: a count");
    let window = Duration::from_secs(
        env_or("NK_REPORT_WINDOW_SECONDS", "30")
            .parse()
            .expect("NK_REPORT_WINDOW_SECONDS: seconds"),
    );
    raise_open_files_limit();
    runtime().block_on(run(agents, window));
}

/// Both roles (the load and the bare server) run on two worker threads.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn raise_open_files_limit() {
    nodekeeper::process::raise_open_files_limit().expect("raise the open files limit");
}

/// One process under load, and what it cost.
struct Measured {
    name: &'static str,
    /// Before the agents connect.
    idle_kib: u64,
    cpu: Duration,
    rss_kib: u64,
    peak_kib: u64,
    load: Load,
}

async fn run(agents: usize, window: Duration) {
    let dir = tempfile::tempdir().expect("temp dir");
    println!("report load: {agents} agents, one report each every {INTERVAL:?}, {window:?} window");
    let server = FakeApiServer::start().await;
    server.register(crd());
    let since = Timestamp::now();
    let names: Vec<String> = (0..agents).map(|i| format!("node-{i:05}")).collect();
    for name in &names {
        server.seed(&node(name, "True", since));
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(server.client(), NAMESPACE);
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ACCOUNT}})).expect("account"),
        )
        .await
        .expect("the agent ServiceAccount");
    for name in &names {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("agent-{name}"), "namespace": NAMESPACE,
                         "uid": format!("uid-{name}")},
            "spec": {"nodeName": name, "serviceAccountName": ACCOUNT,
                     "containers": [{"name": "agent", "image": "nodekeeper"}]}
        }))
        .expect("pod");
        server.seed(&pod);
    }
    let started = Instant::now();
    let client = server.client();
    let tokens: Vec<(String, String)> = futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let client = client.clone();
            async move {
                let pod = format!("agent-{name}");
                let token =
                    projected_token(&client, NAMESPACE, ACCOUNT, &pod, Some(AUDIENCE)).await;
                (name, token)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    println!("  {agents} tokens issued in {:.1?}", started.elapsed());
    let tokens = Arc::new(tokens);

    let config = write_controller_config(dir.path(), "unhealthyDuration: 10m\n");
    let controller = ControllerProcess::start(dir.path(), &server, &config);
    controller.synced().await;
    let reviews_before = reviews(&server);
    let measured_controller = measure(
        "controller",
        controller.pid(),
        &controller.reports_address(),
        None,
        &tokens,
        window,
        &|| controller.log(),
    )
    .await;
    let reviews_in_window = reviews(&server) - reviews_before;
    drop(controller);

    let ca = support::tls::certificate_authority(dir.path(), "bench-ca").expect("openssl: a CA");
    let pair = support::tls::server_certificate(dir.path(), "bench-server", &ca)
        .expect("openssl: a server certificate");
    let config = write_controller_config(
        dir.path(),
        &format!(
            "unhealthyDuration: 10m\nreports: {{address: \"127.0.0.1:0\", reconnectGrace: 0s, {}}}\n",
            pair.reports_setting()
        ),
    );
    let controller = ControllerProcess::start(dir.path(), &server, &config);
    controller.synced().await;
    let tls = tls_connector(&ca.cert);
    let measured_tls = measure(
        "controller, TLS",
        controller.pid(),
        &controller.reports_address(),
        Some(tls),
        &tokens,
        window,
        &|| controller.log(),
    )
    .await;
    drop(controller);

    let mut bare = BareServer::start();
    let measured_bare = measure(
        "bare HTTP/1",
        bare.pid(),
        &bare.address,
        None,
        &tokens,
        window,
        &|| String::new(),
    )
    .await;
    bare.stop();

    report(&[measured_controller, measured_tls, measured_bare], window);
    println!(
        "  TokenReviews: {reviews_in_window} over the warm-up and window ({:.0} per second)",
        reviews_in_window as f64 / (WARM_UP + window).as_secs_f64()
    );
}

fn reviews(server: &FakeApiServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|request| request.path.ends_with("/tokenreviews"))
        .count()
}

/// The load against `address` for the warm-up and the window, with the process's CPU and
/// memory over the window.
async fn measure(
    name: &'static str,
    pid: u32,
    address: &str,
    tls: Option<tokio_rustls::TlsConnector>,
    tokens: &Arc<Vec<(String, String)>>,
    window: Duration,
    log: &dyn Fn() -> String,
) -> Measured {
    let idle_kib = process_usage::status_kib(pid, "VmRSS:");
    let start = tokio::time::Instant::now() + Duration::from_secs(1);
    let window_start = start + WARM_UP;
    let end = window_start + window;
    let load = tokio::spawn(generate(
        address.to_string(),
        tls,
        tokens.clone(),
        start,
        window_start,
        end,
    ));
    tokio::time::sleep_until(window_start).await;
    let cpu_before = process_usage::cpu_time(pid);
    tokio::time::sleep_until(end).await;
    let cpu = process_usage::cpu_time(pid).saturating_sub(cpu_before);
    assert!(
        !process_usage::exited(pid),
        "{name} ended under the load; its log:\n{}",
        log()
    );
    let rss_kib = process_usage::status_kib(pid, "VmRSS:");
    let peak_kib = process_usage::status_kib(pid, "VmHWM:");
    let load = load.await.expect("the load generator");
    Measured {
        name,
        idle_kib,
        cpu,
        rss_kib,
        peak_kib,
        load,
    }
}

/// What the agents saw in the window.
#[derive(Default)]
struct Load {
    accepted: usize,
    refused: usize,
    /// Refusals by HTTP status, and how many came before the window opened.
    refusals: std::collections::BTreeMap<u16, usize>,
    refused_in_warm_up: usize,
    failed: usize,
    /// Microseconds from sending a report to its answer.
    latencies: Vec<u32>,
}

/// Every agent on its own connection, its reports spread evenly over the interval.
async fn generate(
    address: String,
    tls: Option<tokio_rustls::TlsConnector>,
    tokens: Arc<Vec<(String, String)>>,
    start: tokio::time::Instant,
    window_start: tokio::time::Instant,
    end: tokio::time::Instant,
) -> Load {
    let count = tokens.len();
    let boot_id = "bench-boot".to_string();
    let tasks: Vec<_> = (0..count)
        .map(|index| {
            let (address, tokens, boot_id) = (address.clone(), tokens.clone(), boot_id.clone());
            let tls = tls.clone();
            tokio::spawn(async move {
                let (node, token) = &tokens[index];
                let offset = INTERVAL.mul_f64(index as f64 / count as f64);
                agent(
                    &address,
                    tls.as_ref(),
                    node,
                    token,
                    &boot_id,
                    start + offset,
                    window_start,
                    end,
                )
                .await
            })
        })
        .collect();
    let mut total = Load::default();
    for task in tasks {
        let load = task.await.expect("an agent task");
        total.accepted += load.accepted;
        total.refused += load.refused;
        total.refused_in_warm_up += load.refused_in_warm_up;
        for (status, count) in load.refusals {
            *total.refusals.entry(status).or_default() += count;
        }
        total.failed += load.failed;
        total.latencies.extend(load.latencies);
    }
    total
}

#[allow(clippy::too_many_arguments)]
async fn agent(
    address: &str,
    tls: Option<&tokio_rustls::TlsConnector>,
    node: &str,
    token: &str,
    boot_id: &str,
    first: tokio::time::Instant,
    window_start: tokio::time::Instant,
    end: tokio::time::Instant,
) -> Load {
    let mut load = Load::default();
    tokio::time::sleep_until(first).await;
    let mut sender = None;
    let mut next = first;
    let mut sequence = 0u64;
    while next < end {
        tokio::time::sleep_until(next).await;
        next += INTERVAL;
        sequence += 1;
        if sender.is_none() {
            sender = connect(address, tls).await;
        }
        let Some(send) = sender.as_mut() else {
            load.failed += 1;
            continue;
        };
        let report = AgentReport {
            version: protocol::version(),
            node: node.to_string(),
            boot_id: boot_id.to_string(),
            boot_time: Timestamp::from_second(1_763_600_000).expect("time"),
            sequence,
            agent_version: "bench".to_string(),
            interval_millis: INTERVAL.as_millis() as u64,
            sent_at: Timestamp::now(),
            trigger: protocol::Trigger::Interval,
            dry_run: false,
            conditions: Vec::new(),
            shutdown: Default::default(),
            last_eviction: None,
            api_server: protocol::ApiServerReport {
                state: protocol::ApiServerState::Reachable,
                since: None,
            },
            isolation: Default::default(),
            self_isolation: Default::default(),
        };
        let body = serde_json::to_vec(&report).expect("json");
        let request = http::Request::post(protocol::REPORTS_PATH)
            .header(http::header::HOST, address)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Full::new(Bytes::from(body)))
            .expect("request");
        let sent = Instant::now();
        let answer = async {
            let response = send.send_request(request).await.ok()?;
            let status = response.status();
            response.into_body().collect().await.ok()?;
            Some(status)
        };
        let status = tokio::time::timeout(Duration::from_secs(10), answer).await;
        let took = sent.elapsed();
        match status {
            Ok(Some(status)) => {
                if tokio::time::Instant::now() >= window_start {
                    load.latencies
                        .push(took.as_micros().min(u128::from(u32::MAX)) as u32);
                }
                if status == http::StatusCode::OK {
                    load.accepted += 1;
                } else {
                    load.refused += 1;
                    *load.refusals.entry(status.as_u16()).or_default() += 1;
                    if tokio::time::Instant::now() < window_start {
                        load.refused_in_warm_up += 1;
                    }
                }
            }
            _ => {
                load.failed += 1;
                sender = None;
            }
        }
    }
    load
}

async fn connect(
    address: &str,
    tls: Option<&tokio_rustls::TlsConnector>,
) -> Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(address).await.ok()?;
    let _ = stream.set_nodelay(true);
    match tls {
        None => {
            let (send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .ok()?;
            tokio::spawn(connection);
            Some(send)
        }
        Some(connector) => {
            let name =
                rustls::pki_types::ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
            let stream = connector.connect(name, stream).await.ok()?;
            let (send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .ok()?;
            tokio::spawn(connection);
            Some(send)
        }
    }
}

/// A TLS client that trusts `ca`, as an agent with `report.caFile` does.
fn tls_connector(ca: &std::path::Path) -> tokio_rustls::TlsConnector {
    let config = nodekeeper::report::tls::client_config(Some(ca)).expect("the bench CA");
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

fn percentile(sorted: &[u32], share: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * share).round() as usize;
    f64::from(sorted[index]) / 1000.0
}

fn report(results: &[Measured], window: Duration) {
    println!(
        "\n| process | reports/s | accepted | refused | failed | CPU (cores) | CPU per report | RSS before | RSS | peak RSS | p50 | p99 | max |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for measured in results {
        let mut latencies = measured.load.latencies.clone();
        latencies.sort_unstable();
        let reports = latencies.len().max(1);
        println!(
            "| {} | {:.0} | {} | {} | {} | {:.3} | {:.1} µs | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.2} ms | {:.2} ms | {:.2} ms |",
            measured.name,
            latencies.len() as f64 / window.as_secs_f64(),
            measured.load.accepted,
            measured.load.refused,
            measured.load.failed,
            measured.cpu.as_secs_f64() / window.as_secs_f64(),
            measured.cpu.as_secs_f64() * 1e6 / reports as f64,
            measured.idle_kib as f64 / 1024.0,
            measured.rss_kib as f64 / 1024.0,
            measured.peak_kib as f64 / 1024.0,
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
            percentile(&latencies, 1.0),
        );
    }
    for measured in results {
        if measured.load.refused > 0 {
            println!(
                "{}: refusals by status {:?}, {} of them in the warm-up",
                measured.name, measured.load.refusals, measured.load.refused_in_warm_up
            );
        }
    }
    if let [controller, tls, bare] = results {
        let ratio = |a: &Measured, b: &Measured| {
            format!(
                "CPU {:.2}x, RSS {:.2}x",
                a.cpu.as_secs_f64() / b.cpu.as_secs_f64().max(1e-9),
                a.rss_kib as f64 / b.rss_kib.max(1) as f64
            )
        };
        println!("\ncontroller / bare: {}", ratio(controller, bare));
        println!(
            "controller over TLS / controller: {}",
            ratio(tls, controller)
        );
    }
}

/// The baseline process, stopped (by its PID) when dropped.
struct BareServer {
    child: Child,
    address: String,
}

impl BareServer {
    fn start() -> BareServer {
        let mut child = Command::new(std::env::current_exe().expect("this binary"))
            .env(BARE_SERVER, "1")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the bare server");
        let stdout = child.stdout.take().expect("piped");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the bare server's address");
        BareServer {
            child,
            address: line.trim().to_string(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for BareServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Reads each body and answers a fixed acknowledgement; prints its address first.
fn bare_server() {
    raise_open_files_limit();
    runtime().block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        println!("{}", listener.local_addr().expect("address"));
        let ack = Bytes::from_static(
            br#"{"version":"1.0","node":"x","sequence":1,"reportIntervalSeconds":2,"instructions":[]}"#,
        );
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let ack = ack.clone();
            let service = hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                let ack = ack.clone();
                async move {
                    let _ = request.into_body().collect().await;
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(ack)))
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
}
