//! Agent reports end to end: the real controller process takes reports on loopback,
//! authenticates them with TokenReviews against the test API server (tokens issued by its
//! TokenRequest API, as a kubelet gets them for a projected volume), and the real agent
//! process reports to it. Every refusal a hostile or broken client can cause is checked
//! on the wire, and good agents must keep being served meanwhile.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::agent_process::AgentProcess;
use support::apiserver::{FakeApiServer, projected_token};
use support::controller::*;
use support::reports::{exchange, parse_answer, post, post_report, report_request};

const AGENTS_NAMESPACE: &str = "nodekeeper-system";
const AGENT_ACCOUNT: &str = "nodekeeper-agent";
const AUDIENCE: &str = "nodekeeper-controller";
const BOOT: &str = "5d0c6f8e-1111-4222-8333-944455556666";

/// A cluster with two Ready nodes, the agent ServiceAccount, an agent pod on each node
/// and a web pod (another ServiceAccount) on worker-1.
async fn cluster() -> FakeApiServer {
    let server = ready_cluster(&["worker-1", "worker-2"]).await;
    for (namespace, account) in [(AGENTS_NAMESPACE, AGENT_ACCOUNT), ("shop", "web")] {
        create_service_account(&server, namespace, account).await;
    }
    for (namespace, name, account, node) in [
        (AGENTS_NAMESPACE, "agent-w1", AGENT_ACCOUNT, "worker-1"),
        (AGENTS_NAMESPACE, "agent-w2", AGENT_ACCOUNT, "worker-2"),
        ("shop", "web-0", "web", "worker-1"),
    ] {
        create_pod(&server, namespace, name, account, node).await;
    }
    server
}

/// A report token for the agent pod `pod`, as its projected volume holds it.
async fn agent_token(server: &FakeApiServer, pod: &str) -> String {
    projected_token(
        &server.client(),
        AGENTS_NAMESPACE,
        AGENT_ACCOUNT,
        pod,
        Some(AUDIENCE),
    )
    .await
}

/// A controller taking reports (`reports: {SETTINGS}`), logging at debug level so a token
/// in any log line would be seen, that leads and has listed the nodes; and the address
/// it takes reports on.
async fn reporting_controller(
    dir: &Path,
    server: &FakeApiServer,
    settings: &str,
) -> (ControllerProcess, std::path::PathBuf, String) {
    let config = reports_config(dir, settings);
    let controller = ControllerProcess::start_logging(dir, server, &config, DEBUG_LOG);
    controller.synced().await;
    let address = controller.reports_address();
    (controller, config, address)
}

fn report(node: &str, sequence: u64) -> Value {
    json!({
        "version": "1.0", "node": node, "bootId": BOOT, "bootTime": "2026-11-20T08:00:00Z",
        "sequence": sequence, "agentVersion": "test", "intervalMillis": 1000,
        "sentAt": "2026-11-24T05:00:00Z", "trigger": "interval",
        "conditions": ["MemoryPressure"],
        "shutdown": {"state": "none", "lockHeld": true},
        "apiServer": {"state": "reachable"}, "isolation": {"state": "none"}
    })
}

fn assert_refused(answer: &(u16, Value), status: u16, reason: &str, message_part: &str) {
    let (code, body) = answer;
    assert_eq!(*code, status, "{body}");
    assert_eq!(body["reason"], reason, "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(message_part),
        "{message_part:?} not in {message:?}"
    );
}

/// The report endpoint on a free loopback port.
const ANY_PORT: &str = "address: \"127.0.0.1:0\"";

/// The rig's controller configuration with `reports: {SETTINGS}`.
fn reports_config(dir: &Path, settings: &str) -> std::path::PathBuf {
    controller_config(dir, &format!("reports: {{{settings}}}\n"))
}

fn counter(metrics: &str, result: &str) -> u64 {
    metric_value(
        metrics,
        &format!("nodekeeper_controller_reports_total{{result=\"{result}\"}}"),
    )
    .map_or(0, |value| value as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_nodes_own_agent_may_report_for_it_and_only_forward() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = cluster().await;
    seed_node_tokens(&server, &[("worker-2", "worker-2-unit-token\n")]);
    let (controller, _, address) = reporting_controller(
        dir.path(),
        &server,
        &format!("{ANY_PORT}, nodeTokensSecret: node-tokens"),
    )
    .await;

    let agent_w1 = agent_token(&server, "agent-w1").await;
    let accepted = post_report(&address, Some(&agent_w1), &report("worker-1", 100)).await;
    assert_eq!(accepted.0, 200, "{}", accepted.1);
    assert_eq!(accepted.1["sequence"], 100);

    // Replayed, then behind: the same boot only moves forward.
    let replayed = post_report(&address, Some(&agent_w1), &report("worker-1", 100)).await;
    assert_refused(&replayed, 409, "Stale", "already received");
    let behind = post_report(&address, Some(&agent_w1), &report("worker-1", 99)).await;
    assert_refused(&behind, 409, "Stale", "behind the last one received (100)");

    // worker-1's agent cannot speak for worker-2.
    let other_node = post_report(&address, Some(&agent_w1), &report("worker-2", 5)).await;
    assert_refused(&other_node, 403, "Forbidden", "not on \"worker-2\"");
    // Another workload on worker-1 cannot speak for worker-1.
    let web = projected_token(&server.client(), "shop", "web", "web-0", Some(AUDIENCE)).await;
    let not_agent = post_report(&address, Some(&web), &report("worker-1", 101)).await;
    assert_refused(
        &not_agent,
        403,
        "Forbidden",
        "system:serviceaccount:shop:web",
    );
    // A token for the API server's audience is not a report token.
    let api_token = projected_token(
        &server.client(),
        AGENTS_NAMESPACE,
        AGENT_ACCOUNT,
        "agent-w1",
        None,
    )
    .await;
    let wrong_audience = post_report(&address, Some(&api_token), &report("worker-1", 102)).await;
    assert_refused(&wrong_audience, 401, "Unauthenticated", "not accepted");
    let forged = post_report(
        &address,
        Some("eyJhbGciOi.eyJzdWIi.Zm9yZ2Vk"),
        &report("worker-1", 103),
    )
    .await;
    assert_refused(&forged, 401, "Unauthenticated", "not accepted");
    let garbage = post_report(&address, Some("let me in"), &report("worker-1", 104)).await;
    assert_refused(&garbage, 401, "Unauthenticated", "not accepted");
    let anonymous = post_report(&address, None, &report("worker-1", 105)).await;
    assert_refused(&anonymous, 401, "Unauthenticated", "no bearer token");
    // The token of a pod that is gone is no longer good.
    let agent_w2 = agent_token(&server, "agent-w2").await;
    let pods: Api<Pod> = Api::namespaced(server.client(), AGENTS_NAMESPACE);
    pods.delete("agent-w2", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete agent-w2");
    let gone = post_report(&address, Some(&agent_w2), &report("worker-2", 1)).await;
    assert_refused(&gone, 401, "Unauthenticated", "not accepted");

    // A node's own token from the node-token Secret (an agent run by systemd).
    let unit = post_report(
        &address,
        Some("worker-2-unit-token"),
        &report("worker-2", 7),
    )
    .await;
    assert_eq!(unit.0, 200, "{}", unit.1);
    let unit_elsewhere = post_report(
        &address,
        Some("worker-2-unit-token"),
        &report("worker-1", 106),
    )
    .await;
    assert_refused(
        &unit_elsewhere,
        401,
        "Unauthenticated",
        "neither this node's token",
    );

    // Bodies the controller cannot read.
    let mut future = report("worker-1", 107);
    future["version"] = json!("2.0");
    future["nodeName"] = json!("worker-1");
    let unsupported = post_report(&address, Some(&agent_w1), &future).await;
    assert_refused(
        &unsupported,
        400,
        "UnsupportedVersion",
        "report version 2.0 is not supported",
    );
    let malformed = post(
        &address,
        Some(&agent_w1),
        b"{\"version\": \"1.0\", \"node\": ",
    )
    .await;
    assert_refused(&malformed, 400, "Malformed", "not a JSON object");
    let mut wrong_type = report("worker-1", 108);
    wrong_type["shutdown"]["phasesTotal"] = json!("three");
    let typed = post_report(&address, Some(&agent_w1), &wrong_type).await;
    assert_refused(&typed, 400, "Malformed", "shutdown.phasesTotal");
    // A declared size over the limit is refused before the body is read.
    let declared = format!(
        "POST /v1/reports HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {agent_w1}\r\nContent-Length: 204800\r\n\r\n"
    );
    let too_large = exchange(&address, declared.as_bytes()).await;
    assert_refused(&too_large, 413, "TooLarge", "exceeds 65536 bytes");
    // Chunked, so the size is not declared: refused once the limit is passed.
    let mut chunked = format!(
        "POST /v1/reports HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {agent_w1}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    for _ in 0..20 {
        chunked.extend_from_slice(format!("{:x}\r\n", 8192).as_bytes());
        chunked.extend(std::iter::repeat_n(b' ', 8192));
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    assert_refused(
        &exchange(&address, &chunked).await,
        413,
        "TooLarge",
        "exceeds",
    );
    let (status, _) = exchange(
        &address,
        b"GET /v1/reports HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 405);

    // The next report of the boot is taken, and a new boot starts again low.
    let mut next = report("worker-1", 109);
    next["conditions"] = json!(["MemoryPressure", "DiskPressure"]);
    assert_eq!(post_report(&address, Some(&agent_w1), &next).await.0, 200);
    let mut rebooted = report("worker-1", 3);
    rebooted["bootId"] = json!("another-boot");
    rebooted["bootTime"] = json!("2026-11-24T04:00:00Z");
    assert_eq!(
        post_report(&address, Some(&agent_w1), &rebooted).await.0,
        200
    );
    let mut late = report("worker-1", 110);
    late["bootId"] = json!(BOOT);
    assert_refused(
        &post_report(&address, Some(&agent_w1), &late).await,
        409,
        "Stale",
        "not after the current boot",
    );

    // What the controller kept: the latest accepted report of each node.
    let views = controller.agent_views();
    let views = views.as_array().expect("a list");
    assert_eq!(views.len(), 2, "{views:?}");
    assert_eq!(views[0]["report"]["node"], "worker-1");
    assert_eq!(views[0]["report"]["bootId"], "another-boot");
    assert_eq!(views[0]["credential"], "serviceAccount");
    assert_eq!(views[1]["report"]["sequence"], 7);
    assert_eq!(views[1]["credential"], "nodeToken");
    let metrics = controller.metrics();
    assert_eq!(counter(&metrics, "accepted"), 4, "{metrics}");
    assert_eq!(counter(&metrics, "stale"), 3, "{metrics}");
    assert_eq!(counter(&metrics, "forbidden"), 2, "{metrics}");
    assert_eq!(counter(&metrics, "unauthenticated"), 6, "{metrics}");
    assert_eq!(counter(&metrics, "too_large"), 2, "{metrics}");
    assert!(
        !controller.log().contains(&agent_w1) && !controller.log().contains("worker-2-unit-token"),
        "no token in the log"
    );
    assert!(
        server
            .rbac_accesses()
            .iter()
            .any(|access| format!("{access:?}").contains("tokenreviews")),
        "the controller asked the API server"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_node_information_in_the_token_the_pod_says_where_it_runs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = cluster().await;
    // A cluster before Kubernetes 1.30: the TokenReview does not name the node.
    server.set_token_node_info(false);
    let (_controller, _, address) = reporting_controller(dir.path(), &server, ANY_PORT).await;
    let agent_w1 = agent_token(&server, "agent-w1").await;
    let accepted = post_report(&address, Some(&agent_w1), &report("worker-1", 1)).await;
    assert_eq!(accepted.0, 200, "{}", accepted.1);
    let elsewhere = post_report(&address, Some(&agent_w1), &report("worker-2", 2)).await;
    assert_refused(&elsewhere, 403, "Forbidden", "runs on node \"worker-1\"");
    assert!(
        server
            .requests()
            .iter()
            .any(|request| request.method == "GET" && request.path.ends_with("/pods/agent-w1")),
        "the controller read the token's pod"
    );
    support::controller_rbac::assert_exercised(
        &server.requests(),
        "without_node_information_in_the_token_the_pod_says_where_it_runs",
        support::controller::NAMESPACE,
    );
}

/// Opens a connection that sends its headers one byte at a time, slower than any
/// deadline allows; how long the server let it hold the connection.
async fn slow_client(address: String) -> Duration {
    let mut stream = TcpStream::connect(&address)
        .await
        .expect("the slow client connects");
    let started = Instant::now();
    for byte in b"POST /v1/reports HTTP/1.1\r\nHost: slow\r\nContent-Length: 100\r\n" {
        if stream.write_all(&[*byte]).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    // The server closed the connection (or we ran out of header).
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut rest)).await;
    started.elapsed()
}

/// Sends complete headers and then never the body it declared.
async fn stalled_body(address: String, token: String) -> (u16, Value) {
    let mut stream = TcpStream::connect(&address).await.expect("connect");
    let head = format!(
        "POST /v1/reports HTTP/1.1\r\nHost: s\r\nAuthorization: Bearer {token}\r\nContent-Length: 1000\r\n\r\n{{"
    );
    stream.write_all(head.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    // The answer comes while the connection is still open.
    loop {
        match tokio::time::timeout(Duration::from_secs(20), stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                answer.extend_from_slice(&buffer[..n]);
                if answer.windows(4).any(|w| w == b"\r\n\r\n") && answer.ends_with(b"}") {
                    break;
                }
            }
        }
    }
    parse_answer(&answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_flooding_clients_do_not_keep_good_agents_out() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = cluster().await;
    let (controller, _, address) = reporting_controller(
        dir.path(),
        &server,
        &format!("{ANY_PORT}, requestTimeout: 1s, maxInFlight: 128"),
    )
    .await;
    let agent_w1 = agent_token(&server, "agent-w1").await;
    // The agent is known before the attack starts (as every running agent is).
    let known = post_report(&address, Some(&agent_w1), &report("worker-1", 1)).await;
    assert_eq!(known.0, 200, "{}", known.1);

    // 200 clients trickle their headers, 50 never send their body, and 300 requests
    // with made-up tokens arrive at once.
    let slow: Vec<_> = (0..200)
        .map(|_| tokio::spawn(slow_client(address.clone())))
        .collect();
    let stalled: Vec<_> = (0..50)
        .map(|_| tokio::spawn(stalled_body(address.clone(), agent_w1.clone())))
        .collect();
    let flood: Vec<_> = (0..300)
        .map(|i| {
            let address = address.clone();
            tokio::spawn(async move {
                let forged = format!("eyJhbGciOi.eyJmbG9vZCI{i}.c2ln");
                post_report(&address, Some(&forged), &report("worker-1", 1))
                    .await
                    .0
            })
        })
        .collect();

    // Meanwhile worker-1's agent reports every 100 ms for 4 s: every report is taken,
    // each within the default report interval (2 s), so under attack the controller
    // still hears the agent as often as it normally would. (Answers take a few ms when
    // idle; a CI machine running other heavy tests on its two cores has been measured
    // at just over 1 s.)
    let mut slowest = Duration::ZERO;
    for sequence in 2..=41u64 {
        let started = Instant::now();
        let answer = post_report(&address, Some(&agent_w1), &report("worker-1", sequence)).await;
        slowest = slowest.max(started.elapsed());
        assert_eq!(answer.0, 200, "report {sequence}: {}", answer.1);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("slowest good report under attack: {slowest:?}");
    assert!(
        slowest < Duration::from_secs(2),
        "slowest good report took {slowest:?}, longer than the default report interval"
    );

    for task in flood {
        let status = task.await.expect("flood client");
        assert!(
            status == 401 || status == 429,
            "a forged token got {status}"
        );
    }
    for task in stalled {
        let (status, body) = task.await.expect("stalled client");
        assert_eq!(status, 408, "{body}");
        assert_eq!(body["reason"], "Timeout");
    }
    for task in slow {
        let held = task.await.expect("slow client");
        // Cut off by the header deadline (1 s), long before the ~25 s the trickle takes.
        assert!(
            held < Duration::from_secs(10),
            "a slow client held on for {held:?}"
        );
    }
    assert!(!controller.exited(), "the controller is still running");
    let accepted = post_report(&address, Some(&agent_w1), &report("worker-1", 42)).await;
    assert_eq!(accepted.0, 200, "{}", accepted.1);
}

/// The `controller status` table row of `node`.
fn status_row<'a>(status: &'a str, node: &str) -> &'a str {
    status
        .lines()
        .find(|line| line.starts_with(&format!("{node} ")))
        .unwrap_or_else(|| panic!("no {node} row:\n{status}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_reports_its_pressure_and_survives_the_controller_going_away() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = cluster().await;
    let (controller, _, address) = reporting_controller(dir.path(), &server, ANY_PORT).await;
    // A threshold this node always meets, so the agent holds MemoryPressure.
    let agent_config = AgentProcess::reporting_config(
        dir.path(),
        "worker-1",
        &address,
        &agent_token(&server, "agent-w1").await,
        "housekeepingInterval: 200ms\nevictionHard: {memory.available: 64Ti}\n",
    );
    let mut agent = AgentProcess::dry_run(&agent_config);
    let reported = |controller: &ControllerProcess| {
        let controller_views = controller.agent_views();
        controller_views
            .as_array()
            .and_then(|views| views.first().cloned())
            .filter(|view| view["report"]["conditions"] == json!(["MemoryPressure"]))
    };
    let view = wait_for(&controller, "the agent's report of MemoryPressure", || {
        reported(&controller)
    })
    .await;
    assert_eq!(view["report"]["node"], "worker-1");
    assert_eq!(view["report"]["apiServer"]["state"], "notConfigured");
    assert_eq!(view["report"]["dryRun"], true);
    assert_eq!(
        view["report"]["bootId"],
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .expect("boot id")
            .trim()
    );
    let first_sequence = view["report"]["sequence"].as_u64().expect("sequence");

    // The controller goes away: the agent keeps protecting its node.
    drop(controller);
    agent.wait_for_line(
        "cannot report to the fence controller",
        Duration::from_secs(10),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, _) = support::agent_process::http_get(&agent.address, "/healthz");
    assert_eq!(status, 200, "the agent's loop keeps running");
    let (_, metrics) = support::agent_process::http_get(&agent.address, "/metrics");
    let failed = support::controller::metric_value(
        &metrics,
        "nodekeeper_agent_reports_total{result=\"failed\"}",
    );
    assert!(failed.is_some_and(|count| count >= 1.0), "{metrics}");

    // A new controller on the same address (stateless) hears the running agent again
    // within its backoff, with no help.
    let (controller, config, _) =
        reporting_controller(dir.path(), &server, &format!("address: \"{address}\"")).await;
    agent.wait_for_line(
        "reports reach the controller again",
        Duration::from_secs(40),
    );
    let view = wait_for(&controller, "the running agent's report", || {
        reported(&controller)
    })
    .await;
    let recovered_sequence = view["report"]["sequence"].as_u64().expect("sequence");
    assert!(recovered_sequence > first_sequence);

    // A stopping agent's last act is one more report (on a powering-off node, the one
    // that says its drain finished).
    agent.stop(Duration::from_secs(10));
    let (_, line) = agent.wait_for_line(
        "last report before stopping delivered",
        Duration::from_secs(1),
    );
    let last_sequence: u64 = line
        .split("sequence=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|number| number.parse().ok())
        .unwrap_or_else(|| panic!("no sequence in {line:?}"));
    assert!(last_sequence > recovered_sequence);
    let view = reported(&controller).expect("the last report");
    assert_eq!(view["report"]["sequence"].as_u64(), Some(last_sequence));
    assert_eq!(view["report"]["trigger"], "change");

    // A restarted agent (same boot) continues the sequence.
    let _agent = AgentProcess::dry_run(&agent_config);
    wait_for(&controller, "the restarted agent's report", || {
        // The old agent has stopped: a later sequence is the new agent's.
        reported(&controller)
            .filter(|view| view["report"]["sequence"].as_u64() > Some(last_sequence))
    })
    .await;
    let url = format!("http://{}", controller.metrics_address());
    let status = controller_status(dir.path(), &config, &["--controller-url", &url]).await;
    assert!(
        status_row(&status, "worker-1").ends_with("MemoryPressure"),
        "{status}"
    );
    assert!(
        status.contains("Agent reports: 1 of 2 watched nodes reporting"),
        "{status}"
    );
    assert!(
        status_row(&status, "worker-2").ends_with("no report"),
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_house_answers_429_and_refused_clients_do_not_keep_their_connection() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = cluster().await;
    let (_controller, _, address) = reporting_controller(
        dir.path(),
        &server,
        &format!("{ANY_PORT}, requestTimeout: 3s, maxInFlight: 2"),
    )
    .await;
    let agent_w1 = agent_token(&server, "agent-w1").await;
    // Two bodies that never come take both places.
    let stalled: Vec<_> = (0..2)
        .map(|_| tokio::spawn(stalled_body(address.clone(), agent_w1.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let body = serde_json::to_vec(&report("worker-1", 1)).expect("json");
    // No `Connection: close` from the client: the server closes it after refusing.
    let mut stream = TcpStream::connect(&address).await.expect("connect");
    stream
        .write_all(&report_request(Some(&agent_w1), &body, false))
        .await
        .expect("send");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the server closes the refused connection")
        .expect("read");
    let text = String::from_utf8_lossy(&answer).to_lowercase();
    assert!(text.starts_with("http/1.1 429"), "{text}");
    assert!(text.contains("retry-after: 1"), "{text}");
    assert!(text.contains("connection: close"), "{text}");
    assert!(text.contains("\"reason\":\"overloaded\""), "{text}");
    for task in stalled {
        assert_eq!(task.await.expect("stalled client").0, 408);
    }
    // Once the stalled bodies have timed out, the agent's report is taken, and its
    // connection stays open for the next one.
    let mut stream = TcpStream::connect(&address).await.expect("connect");
    for sequence in [2, 3] {
        let body = serde_json::to_vec(&report("worker-1", sequence)).expect("json");
        stream
            .write_all(&report_request(Some(&agent_w1), &body, false))
            .await
            .expect("send");
        let mut buffer = vec![0u8; 4096];
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer))
            .await
            .expect("an answer")
            .expect("read");
        let text = String::from_utf8_lossy(&buffer[..read]).to_lowercase();
        assert!(
            text.starts_with("http/1.1 200"),
            "report {sequence}: {text}"
        );
        assert!(!text.contains("connection: close"), "{text}");
    }
}

/// The test's TLS files: a CA (`ca-N`) and a server certificate it signed, installed
/// where the controller reads them (`tls.crt`, `tls.key`).
fn issued(dir: &Path, ca: &str) -> Result<(support::tls::Pair, support::tls::Pair), String> {
    support::real::program("openssl", "openssl")?;
    let ca_pair = support::tls::certificate_authority(dir, ca)?;
    let server = support::tls::server_certificate(dir, &format!("server-{ca}"), &ca_pair)?;
    Ok((ca_pair, server))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_over_tls_take_a_rotated_certificate_and_refuse_what_cannot_check_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (ca_one, server_one) = require!("openssl", issued(dir.path(), "ca-1"));
    let (ca_two, server_two) = issued(dir.path(), "ca-2").expect("a second CA");
    let served = support::tls::Pair {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    };
    support::tls::install(&server_one, &served);
    let server = cluster().await;
    let (controller, _, address) = reporting_controller(
        dir.path(),
        &server,
        &format!(
            "{ANY_PORT}, requestTimeout: 1s, {}",
            served.reports_setting()
        ),
    )
    .await;

    // An agent that trusts the controller's CA reports over TLS.
    let trusting = AgentProcess::tls_reporting_config(
        dir.path(),
        "worker-1",
        &address,
        &ca_one.cert,
        &agent_token(&server, "agent-w1").await,
    );
    let _trusting = AgentProcess::dry_run(&trusting);
    wait_for(&controller, "worker-1's report over TLS", || {
        controller.agent_view("worker-1")
    })
    .await;

    // One that checks against another CA refuses the controller and sends nothing.
    let doubting = AgentProcess::tls_reporting_config(
        dir.path(),
        "worker-2",
        &address,
        &ca_two.cert,
        &agent_token(&server, "agent-w2").await,
    );
    let doubting = AgentProcess::dry_run(&doubting);
    let (_, line) = doubting.wait_for_line(
        "cannot report to the fence controller",
        Duration::from_secs(10),
    );
    assert!(
        line.contains("certificate") && line.contains("UnknownIssuer"),
        "{line}"
    );
    assert!(
        controller.agent_view("worker-2").is_none(),
        "no report came through"
    );

    // Plain HTTP to the TLS port gets no HTTP answer; a client that connects and never
    // starts the handshake is let go after the request timeout. Neither costs the
    // controller anything.
    let handshakes = counter(&controller.metrics(), "tls_handshake_failed");
    let mut plain = TcpStream::connect(&address).await.expect("connect");
    let _ = plain.write_all(&report_request(None, b"{}", true)).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut answer)).await;
    assert!(
        !String::from_utf8_lossy(&answer).starts_with("HTTP/"),
        "plain HTTP must not be answered: {:?}",
        String::from_utf8_lossy(&answer)
    );
    let started = Instant::now();
    let mut silent = TcpStream::connect(&address).await.expect("connect");
    let closed = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut [0; 16])).await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
    let held = started.elapsed();
    println!("a client that never starts the TLS handshake was let go after {held:?}");
    assert!(held >= Duration::from_millis(900) && held < Duration::from_secs(4));
    wait_for(&controller, "both failed handshakes counted", || {
        (counter(&controller.metrics(), "tls_handshake_failed") >= handshakes + 2).then_some(())
    })
    .await;

    // A broken pair (another certificate with the old key) is refused and the old
    // certificate stays in use; the rotated pair is then served without a restart, so
    // the agent that trusts the new CA gets through.
    let broken = support::tls::Pair {
        cert: server_two.cert.clone(),
        key: server_one.key.clone(),
    };
    support::tls::install(&broken, &served);
    let mut log_seen = String::new();
    wait_for(&controller, "the broken pair refused", || {
        log_seen = controller.log();
        log_seen
            .contains("the report endpoint's new certificate cannot be used")
            .then_some(())
    })
    .await;
    assert!(
        log_seen.contains("the key does not belong to the certificate"),
        "the error says why"
    );
    assert!(
        controller.agent_view("worker-2").is_none(),
        "still the first certificate"
    );
    support::tls::install(&server_two, &served);
    let rotated = Instant::now();
    wait_for(&controller, "worker-2's report after the rotation", || {
        controller.agent_view("worker-2")
    })
    .await;
    println!(
        "the rotated certificate was served {:?} after it was installed",
        rotated.elapsed()
    );
    assert!(
        controller
            .log()
            .contains("the report endpoint's certificate changed")
    );
    assert!(!controller.exited());

    // A controller given a pair that does not belong together does not start, and says
    // which files.
    let mismatched = support::tls::Pair {
        cert: server_one.cert.clone(),
        key: server_two.key.clone(),
    };
    let config = reports_config(
        dir.path(),
        &format!("{ANY_PORT}, {}", mismatched.reports_setting()),
    );
    let refused = ControllerProcess::start(dir.path(), &server, &config);
    wait_for(&refused, "the controller to refuse the pair", || {
        refused.exited().then_some(())
    })
    .await;
    let log = refused.log();
    assert!(
        log.contains("reports.tls")
            && log.contains(&format!(
                "{} and {}",
                server_one.cert.display(),
                server_two.key.display()
            )),
        "{log}"
    );
}

/// worker-1's token in the node-token Secret.
const WORKER_1_TOKEN: &str = "node-token-of-worker-1-0123456789abcdef";

/// A report hub over plain HTTP on loopback that takes worker-1's node token: the API
/// server it checks tokens against, the hub, and its address.
async fn plain_hub_for_worker_1() -> (
    FakeApiServer,
    std::sync::Arc<nodekeeper::report::ReportHub>,
    String,
) {
    use nodekeeper::report::auth::AuthPolicy;
    use nodekeeper::report::{ReportHub, ReportMetrics, ReportsPolicy, server};

    let server = ready_cluster(&["worker-1"]).await;
    let token = WORKER_1_TOKEN;
    seed_node_tokens(&server, &[("worker-1", token)]);
    let policy = ReportsPolicy {
        auth: AuthPolicy {
            node_tokens_secret: Some("node-tokens".to_string()),
            ..AuthPolicy::default()
        },
        ..ReportsPolicy::default()
    };
    let metrics = std::sync::Arc::new(ReportMetrics::register(
        &mut prometheus_client::registry::Registry::default(),
    ));
    let hub = std::sync::Arc::new(ReportHub::new(
        server.client(),
        NAMESPACE,
        policy,
        metrics,
        None,
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let address = listener.local_addr().expect("address").to_string();
    tokio::spawn(server::serve(listener, hub.clone(), std::future::pending()));
    (server, hub, address)
}

/// Instructions go out over TLS only: over plain HTTP anyone on the path could forge or
/// drop them, so a hub without a certificate answers with none, whatever the controller
/// asks of the node. (Over TLS they reach the agent: tests/isolation_nspawn.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instructions_are_never_handed_out_over_plain_http() {
    use nodekeeper::report::protocol::Instruction;

    let (_server, hub, address) = plain_hub_for_worker_1().await;
    let token = WORKER_1_TOKEN;
    hub.instruct(
        "worker-1",
        vec![Instruction::Isolate {
            reason: "a test".to_string(),
            request: 1,
        }],
    );
    let (status, answer) = post_report(&address, Some(token), &report("worker-1", 1)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["instructions"], json!([]), "{answer}");
}

/// A self-isolating agent may count only the leader's hearing as contact (a follower's
/// ledger decides nothing), so every answer says whether the leader heard the report,
/// and the real sender counts a contact only from such an answer, from when it sent it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leaders_answer_counts_as_contact() {
    use nodekeeper::boot_clock::since_boot;
    use nodekeeper::report::sender::{SenderSettings, run_sender};
    use nodekeeper::report::{ContactClock, ReportBoard};

    let (_server, hub, address) = plain_hub_for_worker_1().await;
    let token = WORKER_1_TOKEN;

    let (status, answer) = post_report(&address, Some(token), &report("worker-1", 1)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["heardByLeader"], false, "a follower: {answer}");

    // The agent's sender, reporting every 200 ms to a replica that does not lead yet.
    let dir = tempfile::tempdir().expect("temp dir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, token).expect("token");
    let settings = SenderSettings {
        controller_url: format!("http://{address}"),
        node: "worker-1".to_string(),
        // The boot the hand-made report above came from.
        boot_id: BOOT.to_string(),
        boot_time: "2026-11-20T08:00:00Z".parse().expect("time"),
        interval: Duration::from_millis(200),
        timeout: Duration::from_secs(2),
        token_file: Some(token_file),
        ca_file: None,
        dry_run: false,
    };
    let contact = std::sync::Arc::new(ContactClock::in_memory());
    let (instructions, _followed) = tokio::sync::watch::channel(Vec::new());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let sender = tokio::spawn(run_sender(
        settings,
        std::sync::Arc::new(ReportBoard::new()),
        std::sync::Arc::new(nodekeeper::metrics::Metrics::new()),
        instructions,
        contact.clone(),
        async move {
            let mut stopped = stopped;
            let _ = stopped.wait_for(|stop| *stop).await;
        },
    ));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        contact.last_contact(),
        None,
        "answers from a replica that does not lead are no contact"
    );
    let leading_from = since_boot();
    hub.set_leading(true);
    let counted = support::poll::Wait::for_(
        "the leader's answer to count as a contact",
        Duration::from_secs(5),
    )
    .every(Duration::from_millis(50))
    .eventually(|| contact.last_contact())
    .await;
    // Counted from a send at most one interval before the leader took over, never
    // from later than the answer arrived.
    assert!(
        counted + Duration::from_millis(250) >= leading_from,
        "{counted:?}"
    );
    assert!(counted <= since_boot());
    // A replica that stops leading says so again.
    hub.withdraw_instructions();
    let (_, answer) = post_report(&address, Some(token), &report("worker-1", u64::MAX / 2)).await;
    assert_eq!(answer["heardByLeader"], false, "{answer}");
    stop.send_replace(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), sender).await;
}

/// Reads one answer from a connection the server keeps open: its status, its head
/// (lowercase) and its JSON body.
async fn next_answer(stream: &mut TcpStream, pending: &mut Vec<u8>) -> (u16, String, Value) {
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).to_lowercase();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length: "))
                .and_then(|value| value.trim().parse().ok())
                .unwrap_or(0);
            if pending.len() >= end + 4 + length {
                let message: Vec<u8> = pending.drain(..end + 4 + length).collect();
                let (status, body) = parse_answer(&message);
                return (status, head, body);
            }
        }
        let mut buffer = [0u8; 4096];
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer))
            .await
            .expect("an answer within 10 s")
            .expect("read");
        assert!(
            read > 0,
            "the server closed the connection; had {pending:?}"
        );
        pending.extend_from_slice(&buffer[..read]);
    }
}

/// The endpoint's HTTP/1.1 is its own (so an idle connection holds no buffer): what
/// clients other than the agent may send must work as any HTTP/1.1 server has it work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_takes_pipelined_chunked_and_continued_requests_and_ends_bad_ones() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = cluster().await;
    let (controller, _, address) = reporting_controller(dir.path(), &server, ANY_PORT).await;
    let token = agent_token(&server, "agent-w1").await;
    let bytes = |sequence| serde_json::to_vec(&report("worker-1", sequence)).expect("json");

    // Two reports in one write, then a third: answered in order on the one connection.
    let mut stream = TcpStream::connect(&address).await.expect("connect");
    let mut both = report_request(Some(&token), &bytes(1), false);
    both.extend(report_request(Some(&token), &bytes(2), false));
    stream.write_all(&both).await.expect("send");
    let mut pending = Vec::new();
    for sequence in [1, 2] {
        let (status, head, body) = next_answer(&mut stream, &mut pending).await;
        assert_eq!(status, 200, "{head}\n{body}");
        assert_eq!(body["sequence"], sequence, "{body}");
        assert!(!head.contains("connection: close"), "{head}");
    }
    // `Expect: 100-continue` (curl sends it for large bodies): the go-ahead comes first.
    let body = bytes(3);
    let head = format!(
        "POST /v1/reports HTTP/1.1\r\nHost: c\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("send");
    let mut go_ahead = [0u8; 25];
    tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut go_ahead))
        .await
        .expect("the go-ahead")
        .expect("read");
    assert_eq!(&go_ahead, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(&body).await.expect("send");
    let (status, _, answer) = next_answer(&mut stream, &mut pending).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["sequence"], 3);

    // A chunked body, split anywhere, with a query on the path.
    let body = bytes(4);
    let mut chunked = format!(
        "POST /v1/reports?from=curl HTTP/1.1\r\nHost: c\r\nAuthorization: Bearer {token}\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for piece in body.chunks(100) {
        chunked.extend(format!("{:x}\r\n", piece.len()).into_bytes());
        chunked.extend_from_slice(piece);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    for piece in chunked.chunks(7) {
        stream.write_all(piece).await.expect("send");
    }
    let (status, _, answer) = next_answer(&mut stream, &mut pending).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["sequence"], 4);

    // HTTP/1.0 without keep-alive: answered, then closed.
    let mut request = report_request(Some(&token), &bytes(5), false);
    request.splice(
        ..b"POST /v1/reports HTTP/1.1".len(),
        b"POST /v1/reports HTTP/1.0".iter().copied(),
    );
    let started = Instant::now();
    let (status, answer) = exchange(&address, &request).await;
    assert_eq!(status, 200, "{answer}");
    // Closed with the answer, not when the 5 s wait for a next request runs out.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the HTTP/1.0 connection stayed open for {:?}",
        started.elapsed()
    );

    // Garbage, a head past 16 KiB, and framing two readers could split differently:
    // each answered with a refusal and closed (`exchange` reads to the close), and
    // counted as malformed.
    let malformed_before = counter(&controller.metrics(), "malformed");
    let huge = format!(
        "POST /v1/reports HTTP/1.1\r\nHost: c\r\nX-Padding: {}\r\n\r\n",
        "a".repeat(17 * 1024)
    );
    let smuggled = format!(
        "POST /v1/reports HTTP/1.1\r\nHost: c\r\nAuthorization: Bearer {token}\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    );
    for (request, status, message) in [
        (
            "\u{16}\u{3}\u{1}\u{2}\u{0}hello\r\n\r\n".to_string(),
            400,
            "the request head is malformed",
        ),
        (huge, 431, "the request head exceeds 16384 bytes"),
        (smuggled, 400, "both Transfer-Encoding and Content-Length"),
    ] {
        let (got, answer) = exchange(&address, request.as_bytes()).await;
        assert_eq!(got, status, "{answer}");
        assert_eq!(answer["reason"], "Malformed", "{answer}");
        let said = answer["message"].as_str().unwrap_or_default();
        assert!(said.contains(message), "{said:?} should say {message:?}");
    }
    // Another path or method: 404 and 405, counted as not_found.
    let not_found_before = counter(&controller.metrics(), "not_found");
    for (request, status) in [
        ("GET /v1/reports HTTP/1.1\r\nHost: c\r\n\r\n", 405),
        (
            "POST /v1/other HTTP/1.1\r\nHost: c\r\nContent-Length: 0\r\n\r\n",
            404,
        ),
    ] {
        let (got, answer) = exchange(&address, request.as_bytes()).await;
        assert_eq!(got, status, "{answer}");
        assert_eq!(answer["reason"], "NotFound", "{answer}");
    }
    let metrics = controller.metrics();
    assert_eq!(
        counter(&metrics, "malformed"),
        malformed_before + 3,
        "{metrics}"
    );
    assert_eq!(
        counter(&metrics, "not_found"),
        not_found_before + 2,
        "{metrics}"
    );
    assert!(!controller.exited(), "the controller is still running");
    let (status, answer) = post_report(&address, Some(&token), &report("worker-1", 6)).await;
    assert_eq!(status, 200, "{answer}");
}
