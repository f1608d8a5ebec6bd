//! The shipped dashboard and alerting rules against real Prometheus tools (Debian's
//! package prometheus, unpacked by scripts/test):
//! - `promtool check rules` loads packaging/prometheus/rules.yaml, and `promtool test
//!   rules` runs its unit tests, in which every alert fires on the series it is for and
//!   stays quiet where it must (no shutdown alert for an agent without graceful shutdown,
//!   no controller alert from a follower);
//! - the Prometheus Operator's PrometheusRule holds the same groups;
//! - the Grafana dashboard is well formed: unique ids, panels inside the grid without
//!   overlapping, every query on the data source variable;
//! - a real Prometheus on loopback scrapes a running agent (Kubernetes mode, dry run,
//!   graceful shutdown on with a fake logind, reporting) and a running controller that
//!   has just fenced one node (fence_dummy) and paused another: every metric the
//!   dashboard and the rules name comes back from its query API with data, every query
//!   of the dashboard runs, every rule evaluates without error, and the alerts pending
//!   are exactly those the situation calls for. `promtool check metrics` passes on both
//!   /metrics pages, and every `nodekeeper_*` metric README.md and docs/ name is on one
//!   of them.
//!
//! Fails under `CI=true` without Debian's prometheus, `dbus-daemon` or `fence-agents`.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use support::agent_process::{AgentProcess, http_get_accepting};
use support::apiserver::{FakeApiServer, projected_token};
use support::controller::*;
use support::logind_fake::{FakeLogind, PrivateBus, fake_state};
use support::real;

const PROMETHEUS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/prometheus");
const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/packaging/grafana/nodekeeper.json"
);
const PROMETHEUS_RULE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/packaging/kubernetes/monitoring/prometheusrule.yaml"
);

fn yaml_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn rules() -> Value {
    yaml_file(&Path::new(PROMETHEUS_DIR).join("rules.yaml"))
}

fn dashboard() -> Value {
    let text = std::fs::read_to_string(DASHBOARD).expect("the dashboard");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// Every rule of rules.yaml: (alert name, expression).
fn alerts() -> Vec<(String, String)> {
    let rules = rules();
    let mut alerts = Vec::new();
    for group in rules["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            alerts.push((
                rule["alert"]
                    .as_str()
                    .expect("only alerting rules")
                    .to_string(),
                rule["expr"].as_str().expect("expr").to_string(),
            ));
        }
    }
    alerts
}

/// Every panel of the dashboard that queries (rows hold no queries).
fn query_panels(dashboard: &Value) -> Vec<&Value> {
    dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .filter(|panel| panel["type"] != "row")
        .collect()
}

/// Every query expression of the dashboard.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    query_panels(dashboard)
        .iter()
        .flat_map(|panel| panel["targets"].as_array().expect("targets").iter())
        .map(|target| target["expr"].as_str().expect("expr").to_string())
        .collect()
}

/// The metric names an expression reads: `nodekeeper_*` words, and `up` where it is
/// selected (`up{`; the word also appears in label values and text).
fn metric_names(expression: &str) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = expression
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("nodekeeper_"))
        .map(str::to_string)
        .collect();
    if expression.contains("up{") {
        names.insert("up".to_string());
    }
    names
}

/// Every name a /metrics page answers to, from its `# TYPE` lines: each family's own name,
/// and a counter's `_total`, an info's `_info`, a histogram's `_bucket`, `_sum` and
/// `_count` (never a gauge's `_total`). A labelled family with no series yet is not on
/// the page at all.
fn sample_names(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("# TYPE ")?.split_whitespace();
            Some((words.next()?, words.next()?))
        })
        .flat_map(|(family, kind)| {
            let suffixes: &[&str] = match kind {
                // The family's own name too: in the classic text format a counter's
                // TYPE line names it with its `_total`, and the docs name histograms
                // by family.
                "counter" => &["", "_total"],
                "info" => &["", "_info"],
                "histogram" | "summary" => &["", "_bucket", "_sum", "_count"],
                _ => &[""],
            };
            suffixes
                .iter()
                .map(move |suffix| format!("{family}{suffix}"))
        })
        .collect()
}

/// The `nodekeeper_*` metric names README.md and docs/*.md mention, each with the first
/// file that does.
fn documented_metrics() -> BTreeMap<String, String> {
    let root = support::documents::repository();
    let mut names = BTreeMap::new();
    for file in support::documents::documents() {
        let text = std::fs::read_to_string(&file).expect("a documentation file");
        let shown = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            // `nodekeeper_0.1.0-1_amd64.deb` is a file, not a metric.
            let is_metric = word
                .strip_prefix("nodekeeper_")
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_lowercase()));
            if is_metric {
                names
                    .entry(word.to_string())
                    .or_insert_with(|| shown.clone());
            }
        }
    }
    names
}

fn run(program: &Path, args: &[&str], dir: &Path, stdin: Option<&str>) -> (bool, String) {
    let mut child = Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    let mut input = child.stdin.take().expect("stdin");
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).expect("write stdin");
    }
    drop(input);
    let output = child.wait_with_output().expect("wait");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[test]
fn the_alerting_rules_load_and_pass_their_unit_tests() {
    let promtool = require!("Debian's promtool", real::debian_prometheus("promtool"));
    let dir = Path::new(PROMETHEUS_DIR);
    let alerts = alerts();
    let (ok, out) = run(&promtool, &["check", "rules", "rules.yaml"], dir, None);
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{out}"
    );
    let (ok, out) = run(&promtool, &["test", "rules", "rules_test.yaml"], dir, None);
    assert!(ok, "{out}");
    assert!(out.contains("SUCCESS"), "{out}");

    // Every alert has a case in which it fires, and one in which it stays quiet.
    let tests = yaml_file(&dir.join("rules_test.yaml"));
    let mut fired = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for test in tests["tests"].as_array().expect("tests") {
        for case in test["alert_rule_test"].as_array().expect("alert_rule_test") {
            let name = case["alertname"].as_str().expect("alertname").to_string();
            let expected = case["exp_alerts"].as_array().map_or(0, Vec::len);
            if expected == 0 {
                quiet.insert(name);
            } else {
                fired.insert(name);
            }
        }
    }
    let names: BTreeSet<String> = alerts.into_iter().map(|(name, _)| name).collect();
    assert_eq!(fired, names, "alerts without a case in which they fire");
    assert_eq!(
        quiet, names,
        "alerts without a case in which they stay quiet"
    );
}

#[test]
fn the_prometheus_rule_manifest_holds_the_same_rules() {
    let manifest = yaml_file(Path::new(PROMETHEUS_RULE));
    assert_eq!(manifest["kind"], "PrometheusRule");
    assert_eq!(
        manifest["spec"]["groups"],
        rules()["groups"],
        "{PROMETHEUS_RULE} differs from packaging/prometheus/rules.yaml: run scripts/prometheus-rule"
    );
}

#[test]
fn the_dashboard_is_well_formed() {
    let dashboard = dashboard();
    assert_eq!(dashboard["uid"], "nodekeeper");
    let variables: BTreeMap<&str, &Value> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .map(|variable| (variable["name"].as_str().expect("name"), variable))
        .collect();
    assert_eq!(variables["datasource"]["type"], "datasource");
    assert_eq!(variables["datasource"]["query"], "prometheus");
    // All nodes is `.*`, which also matches series without a node label (a static scrape
    // configuration without one).
    assert_eq!(variables["node"]["allValue"], ".*");

    let mut ids = BTreeSet::new();
    let mut cells: BTreeMap<(i64, i64), String> = BTreeMap::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().expect("title").to_string();
        assert!(ids.insert(panel["id"].as_i64().expect("id")), "{title}: id");
        let grid = &panel["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|key| grid[key].as_i64().expect(key));
        assert!(x >= 0 && w > 0 && x + w <= 24 && h > 0, "{title}: {grid}");
        for column in x..x + w {
            for row in y..y + h {
                if let Some(other) = cells.insert((column, row), title.clone()) {
                    panic!("{title} overlaps {other}");
                }
            }
        }
        if panel["type"] == "row" {
            continue;
        }
        assert!(
            !panel["description"].as_str().unwrap_or_default().is_empty(),
            "{title}: no description"
        );
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let mut references = BTreeSet::new();
        for target in panel["targets"].as_array().expect("targets") {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
            assert!(
                references.insert(target["refId"].as_str().expect("refId")),
                "{title}: refIds repeat"
            );
            let expression = target["expr"].as_str().expect("expr");
            assert!(
                !metric_names(expression).is_empty(),
                "{title}: {expression}"
            );
        }
    }
    // What the dashboard is for, each with the metric that shows it.
    let used: BTreeSet<String> = dashboard_queries(&dashboard)
        .iter()
        .flat_map(|query| metric_names(query))
        .collect();
    for (what, metric) in [
        ("signals", "nodekeeper_signal_available"),
        ("against thresholds", "nodekeeper_threshold_amount"),
        ("evictions by signal", "nodekeeper_evictions_total"),
        (
            "detection latency",
            "nodekeeper_eviction_decision_duration_seconds_bucket",
        ),
        (
            "shutdown phase timings",
            "nodekeeper_graceful_shutdown_phase_duration_seconds",
        ),
        ("fences by result", "nodekeeper_fence_executions_total"),
        ("storm guard", "nodekeeper_storm_guard_state"),
    ] {
        assert!(used.contains(metric), "no {what} ({metric}) in {used:?}");
    }
}

// ---- a real Prometheus scraping a real agent and controller ----

/// A Prometheus server this test started, ended by its PID when dropped.
struct Prometheus {
    child: Child,
    address: String,
    log: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts `binary` on a free loopback port with `config`, keeping its data and log
    /// in `dir`, and waits until it is ready. The port is free when chosen; should
    /// another process take it before Prometheus binds it, Prometheus exits and is
    /// started again on another.
    fn start(binary: &Path, dir: &Path, config: &Path) -> Prometheus {
        for _ in 0..3 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|listener| listener.local_addr())
                .expect("a free port")
                .port();
            let address = format!("127.0.0.1:{port}");
            let log = dir.join("prometheus.log");
            let child = Command::new(binary)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("tsdb").display()
                ))
                .arg(format!("--web.listen-address={address}"))
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("log file"))
                .spawn()
                .expect("start prometheus");
            let mut prometheus = Prometheus {
                child,
                address,
                log: log.clone(),
            };
            // Ready, or exited (its port taken meanwhile).
            let exited =
                support::poll::Wait::for_("Prometheus to become ready", Duration::from_secs(30))
                    .every(Duration::from_millis(100))
                    .showing(|| std::fs::read_to_string(&log).unwrap_or_default())
                    .until(|| match prometheus.child.try_wait() {
                        Ok(Some(status)) => Some(Some(status)),
                        _ => (prometheus.get("/-/ready").0 == 200).then_some(None),
                    });
            match exited {
                None => return prometheus,
                Some(status) => eprintln!("Prometheus exited ({status}):\n{}", prometheus.log()),
            }
        }
        panic!("Prometheus could not start on any of three ports");
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET path` over HTTP/1.0 (so the body is never chunked): status and body.
    fn get(&self, path: &str) -> (u16, String) {
        let Ok(mut stream) = std::net::TcpStream::connect(&self.address) else {
            return (0, String::new());
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        if write!(
            stream,
            "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n",
            self.address
        )
        .is_err()
        {
            return (0, String::new());
        }
        let (status, _, body) = support::agent_process::read_response(&mut stream);
        (status, body)
    }

    /// `path` of the HTTP API as JSON; panics unless Prometheus answers `success`.
    fn api(&self, path: &str) -> Value {
        let (status, body) = self.get(path);
        let answer: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("GET {path}: {status} {e}: {body}"));
        assert_eq!(answer["status"], "success", "GET {path}: {answer}");
        answer["data"].clone()
    }

    /// An instant query's result vector.
    fn query(&self, expression: &str) -> Vec<Value> {
        let data = self.api(&format!("/api/v1/query?query={}", encode(expression)));
        match &data["result"] {
            Value::Array(result) => result.clone(),
            // A scalar or a string (not what the dashboard asks) counts as one value.
            other => vec![other.clone()],
        }
    }
}

/// Percent-encodes a query parameter's value.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// A dashboard query with Grafana's variables as Grafana fills them in: every node, a
/// rate interval of four scrapes, the last minute as the range.
fn as_grafana_sends(query: &str) -> String {
    query
        .replace("$node", ".*")
        .replace("$__rate_interval", "4s")
        .replace("$__range", "1m")
}

const AGENTS_NAMESPACE: &str = "nodekeeper-system";
const AGENT_ACCOUNT: &str = "nodekeeper-agent";
const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

/// Five Ready nodes (so two lost ones stay within the storm guard's 40%), the agent's
/// ServiceAccount and its pod on worker-1, and a web pod beside it.
async fn cluster() -> FakeApiServer {
    let server = ready_cluster(&["worker-1", "worker-2", "worker-3", "worker-4", "worker-5"]).await;
    create_service_account(&server, AGENTS_NAMESPACE, AGENT_ACCOUNT).await;
    create_pod(
        &server,
        AGENTS_NAMESPACE,
        "agent-w1",
        AGENT_ACCOUNT,
        "worker-1",
    )
    .await;
    create_pod(&server, "shop", "web-0", "default", "worker-1").await;
    server
}

/// A finished graceful shutdown of an earlier boot, as the agent's state file keeps it:
/// two phases, 4 s and 11 s.
fn last_shutdown(path: &Path) {
    use nodekeeper::shutdown::state::*;
    let start = 1_790_000_000_000;
    let phase = |priority, seconds, started, finished| PhaseProgress {
        priority,
        seconds,
        pods: Vec::new(),
        status: PhaseStatus::Completed,
        started_unix_ms: Some(started),
        finished_unix_ms: Some(finished),
        // That boot's clock read 60 s at the start.
        started_boot_ms: Some(started - start + 60_000),
        finished_boot_ms: Some(finished - start + 60_000),
        failed_pods: Vec::new(),
    };
    let state = ShutdownState {
        version: STATE_FORMAT_VERSION,
        boot_id: "00000000-0000-4000-8000-000000000001".to_string(),
        start_unix_ms: start,
        end_unix_ms: Some(start + 15_000),
        total_seconds: 30,
        outcome: ShutdownOutcome::Finished,
        phases: vec![
            phase(0, 20, start, start + 4_000),
            phase(2_000_000_000, 10, start + 4_000, start + 15_000),
        ],
        about_to_power_off: true,
        pods_listed: true,
    };
    std::fs::create_dir_all(path.parent().expect("state dir")).expect("state dir");
    StateStore::new(path)
        .save(&state)
        .expect("write the state file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_every_metric_the_dashboard_and_the_rules_use() {
    let prometheus_binary = require!("Debian's prometheus", real::debian_prometheus("prometheus"));
    let promtool = require!("Debian's promtool", real::debian_prometheus("promtool"));
    require!("ClusterLabs fence agents", fence_agents());
    let dir = tempfile::tempdir().expect("temp dir");
    let bus = require!("dbus-daemon", PrivateBus::start(dir.path()));
    let logind = FakeLogind::serve(&bus, fake_state(3600)).await;

    // The controller, as a pod publishing the report Service's endpoint, with worker-2's
    // storage fabric as its fence device.
    let server = cluster().await;
    let fabric = enabled_fabric(dir.path());
    seed_fence_steps(
        &server,
        "worker-2",
        0,
        &fabric,
        "isolation=fabric-off\nrecovery=fabric-on",
    );
    let config = controller_config(
        dir.path(),
        "reports: {address: \"127.0.0.1:0\", reconnectGrace: 0s, leaderService: nodekeeper-controller}\n\
         kdumpAddress: \"127.0.0.1:0\"\n",
    );
    let controller = ControllerProcess::start_as_pod(
        dir.path(),
        &server,
        &config,
        ("nodekeeper-controller-0", "127.0.0.1", "uid-0"),
    );
    controller.synced().await;

    // The agent on worker-1: Kubernetes mode in a dry run, a memory threshold this host
    // always meets (and one of each other kind it does not), graceful shutdown with logind, a finished shutdown on record, and
    // reports to the controller.
    let token_file = dir.path().join("token");
    let token = projected_token(
        &server.client(),
        AGENTS_NAMESPACE,
        AGENT_ACCOUNT,
        "agent-w1",
        Some("nodekeeper-controller"),
    )
    .await;
    std::fs::write(&token_file, token).expect("token file");
    let state_file = dir.path().join("state/graceful_shutdown_state.json");
    last_shutdown(&state_file);
    let kubeconfig = dir.path().join("agent-kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let agent_config = dir.path().join("agent.yaml");
    std::fs::write(
        &agent_config,
        format!(
            "apiVersion: nodekeeper.io/v1alpha1
kind: AgentConfiguration
nodeName: worker-1
housekeepingInterval: 500ms
evictionHard: {{memory.available: 64Ti, nodefs.available: 1%, nodefs.inodesFree: 1%, pid.available: 1%}}
shutdownGracePeriod: 30s
shutdownGracePeriodCriticalPods: 10s
shutdownStateFile: {state}
logindDropInPath: {root}/logind.conf.d/99-nodekeeper.conf
dbusAddress: {bus}
report: {{controllerURL: \"http://{controller}\", interval: 500ms, tokenFile: {token}}}
",
            state = state_file.display(),
            root = dir.path().display(),
            bus = bus.address(),
            controller = controller.reports_address(),
            token = token_file.display(),
        ),
    )
    .expect("agent config");
    let agent = AgentProcess::dry_run_from(
        Command::new(support::agent_process::BINARY),
        &agent_config,
        &["--kubeconfig".as_ref(), kubeconfig.as_os_str()],
    );
    agent.wait_for_line("logind delay lock held", Duration::from_secs(20));
    wait_for(&controller, "the agent's report", || {
        controller.agent_view("worker-1")
    })
    .await;

    // worker-2 is lost and fenced; worker-3 is lost with no fence configuration. Each
    // runs a database pod, which only a fence may release.
    seed_database(&server, "worker-2", "db-0");
    seed_database(&server, "worker-3", "db-1");
    let lost_at = Timestamp::now();
    server.seed(&node("worker-2", "Unknown", lost_at));
    server.seed(&node("worker-3", "Unknown", lost_at));
    wait_for(&controller, "worker-2 fenced and released", || {
        taint_keys(&server, "worker-2")
            .contains(&OUT_OF_SERVICE.to_string())
            .then_some(())
    })
    .await;

    // Prometheus scrapes both every second and evaluates the rules every second.
    let prometheus_dir = dir.path().join("prometheus");
    std::fs::create_dir_all(&prometheus_dir).expect("prometheus dir");
    let prometheus_config = prometheus_dir.join("prometheus.yml");
    std::fs::write(
        &prometheus_config,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: [{rules}]
scrape_configs:
  - job_name: nodekeeper-agent
    static_configs: [{{targets: [\"{agent}\"], labels: {{node: worker-1}}}}]
  - job_name: nodekeeper-controller
    static_configs: [{{targets: [\"{controller}\"]}}]
",
            rules = Path::new(PROMETHEUS_DIR).join("rules.yaml").display(),
            agent = agent.address,
            controller = controller.metrics_address(),
        ),
    )
    .expect("prometheus config");
    let prometheus = Prometheus::start(&prometheus_binary, &prometheus_dir, &prometheus_config);

    // Every metric the dashboard and the rules read comes back with data.
    let dashboard = dashboard();
    let queries = dashboard_queries(&dashboard);
    let alerts = alerts();
    let expressions: Vec<&String> = alerts
        .iter()
        .map(|(_, expression)| expression)
        .chain(&queries)
        .collect();
    let wanted: BTreeSet<String> = expressions
        .iter()
        .flat_map(|expression| metric_names(expression))
        .collect();
    assert!(wanted.len() > 40, "{wanted:?}");
    let missing = || -> Vec<&String> {
        wanted
            .iter()
            .filter(|name| prometheus.query(name).is_empty())
            .collect()
    };
    support::poll::Wait::for_(
        "data in Prometheus for every metric the alerts and the dashboard use",
        Duration::from_secs(60),
    )
    .every(Duration::from_millis(500))
    .showing(|| {
        format!(
            "none for {:?}\nagent:\n{}\ncontroller:\n{}",
            missing(),
            http_get_accepting(&agent.address, "/metrics", None).2,
            http_get_accepting(&controller.metrics_address(), "/metrics", None).2,
        )
    })
    .eventually_true(|| missing().is_empty())
    .await;

    // Data that shows the situation: the fence, the pause, the last shutdown, the
    // threshold met and the evictions it caused (counted in a dry run), the reports.
    let value = |query: &str| -> f64 {
        let result = prometheus.query(query);
        let sample = result
            .first()
            .unwrap_or_else(|| panic!("no result for {query}"));
        sample["value"][1]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{query}: {sample}"))
    };
    let check = |query: &str, expected: f64| {
        assert_eq!(value(query), expected, "{query}");
    };
    check(
        "nodekeeper_fence_executions_total{step=\"Isolation\",method=\"fabric-off\",agent=\"fence_dummy\",result=\"Succeeded\"}",
        1.0,
    );
    check("nodekeeper_fences_confirmed_total{step=\"Isolation\"}", 1.0);
    check("nodekeeper_fences_paused{reason=\"NoConfiguration\"}", 1.0);
    check("nodekeeper_failed_fences", 0.0);
    check("nodekeeper_storm_guard_state{state=\"calm\"}", 1.0);
    check("nodekeeper_controller_report_service_at_leader", 1.0);
    check(
        "nodekeeper_graceful_shutdown_phase_duration_seconds{priority=\"2000000000\"}",
        11.0,
    );
    check("nodekeeper_shutdown_inhibit_lock_held", 1.0);
    check(
        "nodekeeper_threshold_met{threshold=\"memory.available<64Ti\"}",
        1.0,
    );
    check(
        "nodekeeper_threshold_amount{threshold=\"memory.available<64Ti\"}",
        64.0 * 1024f64.powi(4),
    );
    assert!(value("sum(nodekeeper_evictions_total{node=\"worker-1\"})") >= 1.0);
    assert!(value("nodekeeper_controller_reports_total{result=\"accepted\"}") >= 1.0);
    assert!(value("nodekeeper_agent_reports_total{result=\"accepted\"}") >= 1.0);

    check("nodekeeper_dry_run", 1.0);

    // Every rule evaluates without error, and the alerts under way are exactly those this
    // situation calls for: worker-1's threshold met and worker-3's paused fence (both
    // pending: they need minutes), and nothing else (no storm from a dry run's counts, no
    // shutdown alert for an agent whose lock is held, no alert on the healthy controller).
    let unhealthy_rules = || -> Vec<String> {
        let groups = prometheus.api("/api/v1/rules");
        let rules: Vec<&Value> = groups["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .flat_map(|group| group["rules"].as_array().expect("rules").iter())
            .collect();
        assert_eq!(rules.len(), alerts.len(), "{groups}");
        rules
            .iter()
            .filter(|rule| rule["health"] != "ok")
            .map(|rule| format!("{}: {} {}", rule["name"], rule["health"], rule["lastError"]))
            .collect()
    };
    support::poll::Wait::for_("every rule evaluated", Duration::from_secs(30))
        .every(Duration::from_millis(200))
        .showing(|| format!("not evaluated: {:?}", unhealthy_rules()))
        .eventually_true(|| unhealthy_rules().is_empty())
        .await;
    let expected: BTreeSet<(String, String)> = [
        ("NodekeeperEvictionThresholdMetTooLong", "pending"),
        ("NodekeeperFencePaused", "pending"),
    ]
    .map(|(name, state)| (name.to_string(), state.to_string()))
    .into();
    let alerting = || -> BTreeSet<(String, String)> {
        prometheus.api("/api/v1/alerts")["alerts"]
            .as_array()
            .expect("alerts")
            .iter()
            .map(|alert| {
                (
                    alert["labels"]["alertname"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    alert["state"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    };
    // The dry-run agent counts its would-be eviction every cycle: enough for a storm by
    // count, which the storm alert must not take for one.
    let storm_by_count =
        "sum by (job, instance, node) (increase(nodekeeper_evictions_total[10m])) > 5";
    support::poll::Wait::for_("the dry run to count 6 evictions", Duration::from_secs(30))
        .every(Duration::from_millis(200))
        .eventually_true(|| !prometheus.query(storm_by_count).is_empty())
        .await;
    // The rules are evaluated every second, each group on its own timer; the set must
    // then hold for a few more evaluations.
    support::poll::Wait::for_(
        "exactly the alerts this situation calls for",
        Duration::from_secs(20),
    )
    .every(Duration::from_millis(200))
    .showing(|| {
        format!(
            "alerts under way: {:?}, expected {expected:?}; rules: {}",
            alerting(),
            prometheus.api("/api/v1/rules")
        )
    })
    .eventually_true(|| alerting() == expected)
    .await;
    for _ in 0..3 {
        assert_eq!(
            alerting(),
            expected,
            "alerts under way; rules: {}",
            prometheus.api("/api/v1/rules")
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // Every query of the dashboard runs as Grafana sends it (with seconds of data by
    // now), and those that do not keep
    // only events (`> 0`) or states that are on (`== 1`) show data.
    let mut empty = Vec::new();
    for query in &queries {
        let result = prometheus.query(&as_grafana_sends(query));
        if result.is_empty() && !query.contains("> 0") && !query.contains("== 1") {
            empty.push(query.clone());
        }
    }
    assert!(
        empty.is_empty(),
        "dashboard queries without data: {empty:#?}"
    );

    // promtool's lint passes on both pages as any client but Prometheus gets them.
    let mut exported = BTreeSet::new();
    for (what, address) in [
        ("agent", agent.address.clone()),
        ("controller", controller.metrics_address()),
    ] {
        let (status, _, page) = http_get_accepting(&address, "/metrics", None);
        assert_eq!(status, 200, "{what}");
        let (ok, out) = run(&promtool, &["check", "metrics"], dir.path(), Some(&page));
        assert!(
            ok,
            "promtool check metrics on the {what}'s page: {out}\n{page}"
        );
        assert!(out.trim().is_empty(), "{what}: lint findings: {out}");
        exported.extend(sample_names(&page));
    }
    // Every metric the documentation names is one of them: a renamed or dropped metric
    // leaves no page, query or runbook pointing at nothing.
    let documented = documented_metrics();
    assert!(documented.len() > 40, "{documented:?}");
    let undocumented_in_pages: Vec<_> = documented
        .iter()
        .filter(|(name, _)| !exported.contains(*name))
        .collect();
    assert!(
        undocumented_in_pages.is_empty(),
        "named in the documentation but exported by neither /metrics page: {undocumented_in_pages:?}"
    );
    drop(prometheus);
    drop(logind);
}
