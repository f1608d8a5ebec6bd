//! The `nodekeeper agent` binary as an operator runs it: a child process whose log lines
//! are read as they come, reached over HTTP on the metrics address it reports, and
//! stopped by SIGTERM. Only the process this helper started is ever signalled.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long the agent may take to report its metrics address.
const START_WAIT: Duration = Duration::from_secs(30);

/// The binary under test.
pub const BINARY: &str = env!("CARGO_BIN_EXE_nodekeeper");

pub struct AgentProcess {
    pub child: Child,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub address: String,
    /// Log lines not read yet, with the time each was read.
    lines: mpsc::Receiver<(Instant, String)>,
    /// Every log line so far, read or not.
    history: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl AgentProcess {
    /// Start `nodekeeper agent ARGS` in standalone mode (no kubeconfig from the
    /// environment) and wait until it serves HTTP.
    pub fn start<S: AsRef<OsStr>>(args: &[S]) -> AgentProcess {
        AgentProcess::start_from(Command::new(BINARY), args)
    }

    /// The agent in Kubernetes mode, as a DaemonSet runs it: its configuration and the
    /// kubeconfig of the API server it talks to, metrics on a free loopback port.
    pub fn start_in_kubernetes(
        config: &std::path::Path,
        kubeconfig: &std::path::Path,
    ) -> AgentProcess {
        AgentProcess::start_in_kubernetes_from(Command::new(BINARY), config, kubeconfig)
    }

    /// [`AgentProcess::start_in_kubernetes`] with `command` (see
    /// [`AgentProcess::start_from`]).
    pub fn start_in_kubernetes_from(
        command: Command,
        config: &std::path::Path,
        kubeconfig: &std::path::Path,
    ) -> AgentProcess {
        AgentProcess::start_from(
            command,
            &[
                "--metrics-addr".as_ref(),
                "127.0.0.1:0".as_ref(),
                "--config".as_ref(),
                config.as_os_str(),
                "--kubeconfig".as_ref(),
                kubeconfig.as_os_str(),
            ],
        )
    }

    /// [`AgentProcess::start`] with `command` (which runs the binary under test, as
    /// `BINARY`) prepared by the caller: placed in a network namespace, for one.
    pub fn start_from<S: AsRef<OsStr>>(mut command: Command, args: &[S]) -> AgentProcess {
        // At `info` unless the caller set `RUST_LOG` (which must keep `info` for the
        // `serving /metrics` line waited for below).
        if !command.get_envs().any(|(key, _)| key == "RUST_LOG") {
            command.env("RUST_LOG", "info");
        }
        let mut child = command
            .arg("agent")
            .args(args)
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start nodekeeper agent");
        let stderr = child.stderr.take().expect("the agent's stderr is piped");
        let (tx, lines) = mpsc::channel();
        let history = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = history.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                kept.lock().expect("log history").push(line.clone());
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        let mut agent = AgentProcess {
            child,
            address: String::new(),
            lines,
            history,
        };
        let (_, line) = agent.wait_for_line("serving /metrics", START_WAIT);
        agent.address = metrics_address(&line)
            .expect("the metrics address in the log")
            .to_string();
        agent
    }

    /// The agent in dry-run mode with the configuration file `config`, serving metrics on
    /// a free port.
    #[allow(dead_code)] // not every test binary that includes this module uses it
    pub fn dry_run(config: &std::path::Path) -> AgentProcess {
        AgentProcess::dry_run_from(Command::new(BINARY), config, &[])
    }

    /// [`AgentProcess::dry_run`] with `command` (see [`AgentProcess::start_from`]) and the
    /// arguments `more`.
    #[allow(dead_code)] // not every test binary that includes this module uses it
    pub fn dry_run_from(
        command: Command,
        config: &std::path::Path,
        more: &[&OsStr],
    ) -> AgentProcess {
        let mut args: Vec<&OsStr> = vec![
            "--dry-run".as_ref(),
            "--metrics-addr".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
        ];
        args.extend_from_slice(more);
        AgentProcess::start_from(command, &args)
    }

    /// Writes `dir/agent-NODE.yaml`, the configuration of node `node`'s agent reporting
    /// every half second to the controller at `controller` (an address) with `token` (in
    /// `dir/token-NODE`), no graceful shutdown, and the `extra` top-level lines; returns
    /// its path, for [`AgentProcess::dry_run`].
    #[allow(dead_code)] // not every test binary that includes this module uses it
    pub fn reporting_config(
        dir: &std::path::Path,
        node: &str,
        controller: &str,
        token: &str,
        extra: &str,
    ) -> std::path::PathBuf {
        Self::write_reporting_config(
            dir,
            node,
            &format!("http://{controller}"),
            None,
            token,
            extra,
            Some("500ms"),
        )
    }

    /// [`reporting_config`](Self::reporting_config) over https, checking the controller's
    /// certificate against `ca_file`.
    #[allow(dead_code)] // not every test binary that includes this module uses it
    pub fn tls_reporting_config(
        dir: &std::path::Path,
        node: &str,
        controller: &str,
        ca_file: &std::path::Path,
        token: &str,
    ) -> std::path::PathBuf {
        Self::write_reporting_config(
            dir,
            node,
            &format!("https://{controller}"),
            Some(ca_file),
            token,
            "",
            Some("500ms"),
        )
    }

    /// Writes `dir/agent-NODE.yaml` (see [`reporting_config`](Self::reporting_config)):
    /// reports to `url` with `token`, checked against `ca_file` if given, every `interval`
    /// (the default when `None`), and the `extra` top-level lines.
    #[allow(dead_code)] // not every test binary that includes this module uses it
    pub fn write_reporting_config(
        dir: &std::path::Path,
        node: &str,
        url: &str,
        ca_file: Option<&std::path::Path>,
        token: &str,
        extra: &str,
        interval: Option<&str>,
    ) -> std::path::PathBuf {
        let token_file = dir.join(format!("token-{node}"));
        std::fs::write(&token_file, token).expect("token file");
        let ca = ca_file
            .map(|path| format!(", caFile: {}", path.display()))
            .unwrap_or_default();
        let interval = interval
            .map(|interval| format!("interval: {interval}, "))
            .unwrap_or_default();
        let config = dir.join(format!("agent-{node}.yaml"));
        std::fs::write(
            &config,
            format!(
                "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\nnodeName: {node}\n\
                 shutdownGracePeriod: 0s\n{extra}\
                 report: {{controllerURL: \"{url}\", {interval}tokenFile: {}{ca}}}\n",
                token_file.display()
            ),
        )
        .expect("agent config");
        config
    }

    /// Polls `check` every 50 ms until it holds, at most `within`; fails naming `what`,
    /// with the agent's whole log.
    pub async fn until(&self, within: Duration, what: &str, check: impl Fn() -> bool) {
        super::poll::Wait::for_(what, within)
            .every(Duration::from_millis(50))
            .showing(|| format!("agent log:\n{}", self.whole_log().join("\n")))
            .eventually_true(check)
            .await
    }

    /// The first log line not read yet that contains `text`, with the time it was read.
    pub fn wait_for_line(&self, text: &str, within: Duration) -> (Instant, String) {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok((at, line)) if line.contains(text) => return (at, line),
                Ok((_, line)) => seen.push(line),
                Err(_) => break,
            }
        }
        panic!(
            "no log line with {text:?} within {within:?}; log:\n{}",
            seen.join("\n")
        );
    }

    /// A log line containing `text` among all the agent wrote, whether or not a wait
    /// (the start's, for its metrics address) has read past it; waits at most `within`.
    #[allow(dead_code)] // not every test binary that includes this module uses it
    pub fn logged(&self, text: &str, within: Duration) -> String {
        super::poll::Wait::for_(&format!("a log line with {text:?}"), within)
            .showing(|| format!("log:\n{}", self.whole_log().join("\n")))
            .until(|| {
                self.whole_log()
                    .into_iter()
                    .find(|line| line.contains(text))
            })
    }

    /// Every log line the agent wrote so far, consumed or not.
    #[allow(dead_code)] // not every test binary that includes this module uses it
    pub fn whole_log(&self) -> Vec<String> {
        self.history.lock().expect("log history").clone()
    }

    /// Every log line read so far and not consumed by [`AgentProcess::wait_for_line`].
    pub fn lines_so_far(&self) -> Vec<String> {
        self.lines.try_iter().map(|(_, line)| line).collect()
    }

    /// Send SIGTERM and wait (at most `within`) for the agent to exit.
    pub fn stop(&mut self, within: Duration) -> ExitStatus {
        let pid = i32::try_from(self.child.id()).expect("a pid fits i32");
        kill(Pid::from_raw(pid), Signal::SIGTERM).expect("signal the agent");
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the agent") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "agent did not exit within {within:?} of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The agent binary recording its decisions (`--record`), with the configuration it runs
/// with and its trace, for `nodekeeper replay`.
#[allow(dead_code)] // not every test binary that includes this module uses it
pub struct RecordingAgent {
    pub process: AgentProcess,
    pub config: std::path::PathBuf,
    pub trace: std::path::PathBuf,
}

#[allow(dead_code)] // not every test binary that includes this module uses it
impl RecordingAgent {
    /// `nodekeeper agent --config CONFIG --record TRACE MORE...`, logging as
    /// `RUST_LOG=log_filter` says (which must keep `info`, see
    /// [`AgentProcess::start_from`]).
    pub fn start(
        config: &std::path::Path,
        trace: &std::path::Path,
        log_filter: &str,
        more: &[&OsStr],
    ) -> RecordingAgent {
        let mut command = Command::new(BINARY);
        command.env("RUST_LOG", log_filter);
        let mut args: Vec<&OsStr> = vec![
            "--config".as_ref(),
            config.as_os_str(),
            "--record".as_ref(),
            trace.as_os_str(),
        ];
        args.extend_from_slice(more);
        RecordingAgent {
            process: AgentProcess::start_from(command, &args),
            config: config.to_path_buf(),
            trace: trace.to_path_buf(),
        }
    }

    /// The steps recorded so far.
    pub fn recorded_steps(&self) -> Result<Vec<nodekeeper::trace::ParsedStep>, String> {
        nodekeeper::trace::TraceFile::from_path(&self.trace)
            .and_then(|file| file.parsed_steps("the recorded trace"))
            .map_err(|error| format!("the recorded trace: {error}"))
    }

    /// The steps recorded so far, none while the record cannot be read yet (its first
    /// step still being written): for a test that polls the record while the agent runs.
    pub fn steps_so_far(&self) -> Vec<nodekeeper::trace::ParsedStep> {
        self.recorded_steps().unwrap_or_default()
    }

    /// [`replay`] of the trace under the agent's configuration.
    pub fn replay(&self) -> String {
        replay(&self.config, &self.trace)
    }

    /// The evictions the replay of the trace makes, in order, and the replay's output
    /// (for messages).
    pub fn replayed_evictions(&self) -> (Vec<ReplayedEviction>, String) {
        let replay = self.replay();
        let evictions = replay
            .lines()
            .flat_map(|line| {
                let line: serde_json::Value = serde_json::from_str(line)
                    .unwrap_or_else(|error| panic!("a replay line {line}: {error}"));
                let at = line["at"].as_str().unwrap_or_default().to_string();
                line["evicted"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(move |eviction| ReplayedEviction {
                        pod: format!(
                            "{}/{}",
                            eviction["namespace"].as_str().unwrap_or_default(),
                            eviction["name"].as_str().unwrap_or_default()
                        ),
                        at: at.clone(),
                    })
            })
            .collect();
        (evictions, replay)
    }

    /// Asserts that the replay of the trace evicts `pods` (`namespace/name`), in this
    /// order and no other; its evictions. `context` ends the message.
    pub fn assert_replay_evicts<S: AsRef<str>>(
        &self,
        pods: &[S],
        context: &str,
    ) -> Vec<ReplayedEviction> {
        let (evictions, replay) = self.replayed_evictions();
        let replayed: Vec<&str> = evictions.iter().map(|e| e.pod.as_str()).collect();
        let expected: Vec<&str> = pods.iter().map(AsRef::as_ref).collect();
        assert_eq!(
            replayed, expected,
            "the replay of the record:\n{replay}\n{context}"
        );
        evictions
    }
}

/// One eviction of a replay: the pod (`namespace/name`) and its step's time as the trace
/// has it.
#[allow(dead_code)] // not every test binary that includes this module uses it
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayedEviction {
    pub pod: String,
    pub at: String,
}

/// `nodekeeper replay --config CONFIG TRACE`, which must succeed: its output, one JSON
/// line per step.
#[allow(dead_code)] // not every test binary that includes this module uses it
pub fn replay(config: &std::path::Path, trace: &std::path::Path) -> String {
    let output = Command::new(BINARY)
        .args(["replay", "--config"])
        .arg(config)
        .arg(trace)
        .output()
        .expect("run nodekeeper replay");
    assert!(
        output.status.success(),
        "nodekeeper replay of {}: {}",
        trace.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The metrics address in the agent's "serving /metrics" log line.
pub fn metrics_address(line: &str) -> Option<&str> {
    if !line.contains("serving /metrics") {
        return None;
    }
    line.split("address=").nth(1)?.split_whitespace().next()
}

/// `GET path` from the agent: the status code and the body.
pub fn http_get(address: &str, path: &str) -> (u16, String) {
    let (status, _, body) = http_get_accepting(address, path, None);
    (status, body)
}

/// `GET path` with `accept` as the `Accept` header (none if `None`): the status code,
/// the response's header lines and the body.
pub fn http_get_accepting(
    address: &str,
    path: &str,
    accept: Option<&str>,
) -> (u16, String, String) {
    let mut stream = TcpStream::connect(address).expect("connect to the agent");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("set a read timeout");
    let accept = accept
        .map(|accept| format!("Accept: {accept}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\n{accept}Connection: close\r\n\r\n"
    )
    .expect("send the request");
    read_response(&mut stream)
}

/// Reads an HTTP response to its end (the server closes the connection): the status
/// code, the header lines and the body. A body sent in chunks is returned as sent.
pub fn read_response(stream: &mut impl Read) -> (u16, String, String) {
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .map(|(head, body)| (head.to_string(), body.to_string()))
        .unwrap_or_default();
    (status, head, body)
}
