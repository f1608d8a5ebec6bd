//! The fence controller against a simulated cluster, as a real process of its own talking
//! to the test API server (tests/support/apiserver) over loopback.
//!
//! 1. **Scale.** 500 and 5,000 nodes as a kubelet reports them (conditions, capacity,
//!    addresses, node info and a list of images), one node Lease each in
//!    `kube-node-lease` and four pods each. Measured on the controller process: resident
//!    memory, CPU to start and list the nodes, and CPU per node event for the two kinds of
//!    node event a cluster sends: a status report (new heartbeat times, with a Lease
//!    renewal beside it) and a readiness change (which moves the storm guard).
//!    Baseline, in the same run and fed the same events: a bare kube-rs reflector over
//!    Nodes, stripping them as the controller does, in a process of its own (this binary
//!    re-executed): the least any controller caching nodes with kube-rs pays. Each phase
//!    ends with a sentinel node both processes must show, and each process's idle CPU
//!    (measured first) is subtracted.
//! 2. **Start latency.** From the moment a node's `unhealthyDuration` has elapsed (its
//!    Ready condition's `lastTransitionTime`, a whole second, plus the duration) to the
//!    fence agent's process starting, repeated. The agent is the real `fence_dummy` behind
//!    a bash wrapper that stamps `$EPOCHREALTIME` first. Baseline: the same wrapper spawned
//!    directly by this process, the least any launcher pays to start it.
//!
//! Run: cargo bench --bench controller_scale
//! Environment: NK_SCALE_SIZES (default "500,5000"), NK_SCALE_EVENTS (status reports per
//! size, default 10000), NK_SCALE_FLIPS (readiness changes per size, default 2000),
//! NK_LATENCY_SAMPLES (default 20). Needs fence-agents for the latency part and fails
//! without it.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;

use support::apiserver::FakeApiServer;
use support::controller::{
    ControllerProcess, config_map, crd, enabled_fabric, fence_of, metric_value,
    write_controller_config,
};
use support::process_usage;

/// Set in the re-executed child that plays the bare reflector: the API server's URL.
const BARE_WATCHER: &str = "NK_BENCH_BARE_NODE_WATCHER";
const ZONES: usize = 10;
const PODS_PER_NODE: usize = 4;
const IMAGES_PER_NODE: usize = 25;
/// Writes go to the server in batches with a pause between, so its watch fan-out (a
/// bounded broadcast) never drops a watcher into a relist, which would be measured.
const BATCH: usize = 100;
const PAUSE: Duration = Duration::from_millis(10);
/// A node added at the end of each phase: once both processes show it, they have handled
/// every event before it (one watch delivers events in order).
const SENTINEL: &str = "sentinel-";
/// How long each process's idle CPU is measured before the events: the controller's
/// period, its 15 s sweep of the nodes without a fence, so the window holds one sweep.
const IDLE_WINDOW: Duration = Duration::from_secs(15);

fn main() {
    if let Ok(url) = std::env::var(BARE_WATCHER) {
        bare_watcher(&url);
        return;
    }
    if std::env::args().any(|arg| arg == "--list") {
        // `cargo bench -- --list` and test discovery: nothing to list.
        return;
    }
    let sizes: Vec<usize> = env_or("NK_SCALE_SIZES", "500,5000")
        .split(',')
        .map(|size| {
            size.trim()
                .parse()
                .expect("NK_SCALE_SIZES: comma-separated counts")
        })
        .collect();
    let reports: usize = env_or("NK_SCALE_EVENTS", "10000")
        .parse()
        .expect("NK_SCALE_EVENTS");
    let flips: usize = env_or("NK_SCALE_FLIPS", "2000")
        .parse()
        .expect("NK_SCALE_FLIPS");
    let samples: usize = env_or("NK_LATENCY_SAMPLES", "20")
        .parse()
        .expect("NK_LATENCY_SAMPLES");
    let runtime = runtime();
    runtime.block_on(async {
        let mut results = Vec::new();
        for size in &sizes {
            results.push(scale(*size, reports, flips).await);
        }
        print_scale(&results);
        if samples > 0 {
            start_latency(samples).await;
        }
    });
}

/// Two workers, as the controller's own runtime has.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

// ---------------------------------------------------------------------------------------
// Measuring another process
// ---------------------------------------------------------------------------------------

/// CPU time of a process in nanoseconds: the sum of its threads' run time from
/// `/proc/<pid>/task/*/schedstat` (exact, unlike the 10 ms ticks of `stat`). A thread that
/// ends takes its time with it, so the thread set is returned too and a window over which
/// it shrank falls back to `stat`.
fn cpu(pid: u32) -> (u64, BTreeSet<u32>) {
    let mut total = 0;
    let mut threads = BTreeSet::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process is alive");
    for task in tasks.flatten() {
        let Ok(tid) = task.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(text) = std::fs::read_to_string(task.path().join("schedstat"))
            && let Some(ns) = text
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
        {
            total += ns;
            threads.insert(tid);
        }
    }
    (total, threads)
}

/// A CPU reading of one process at one moment.
struct CpuMark {
    exact: u64,
    threads: BTreeSet<u32>,
    ticks: u64,
    at: Instant,
}

/// CPU used over a window, with how it was read.
#[derive(Clone, Copy)]
struct CpuUse {
    ns: f64,
    /// False when a thread ended within the window, so the 10 ms ticks were used.
    exact: bool,
}

impl CpuMark {
    fn take(pid: u32) -> CpuMark {
        let (exact, threads) = cpu(pid);
        CpuMark {
            exact,
            threads,
            // utime + stime: ended threads included, in 10 ms ticks.
            ticks: process_usage::cpu_time(pid).as_nanos() as u64,
            at: Instant::now(),
        }
    }

    /// CPU from `self` to `later`, less what the process uses idle over that time
    /// (`idle_ns_per_s`: Lease renewals, the 15 s sweep), so only the events' cost is left.
    fn until(&self, later: &CpuMark, idle_ns_per_s: f64) -> CpuUse {
        let exact = self.threads.is_subset(&later.threads);
        let used = if exact {
            later.exact.saturating_sub(self.exact)
        } else {
            later.ticks.saturating_sub(self.ticks)
        };
        let idle = idle_ns_per_s * later.at.duration_since(self.at).as_secs_f64();
        CpuUse {
            ns: (used as f64 - idle).max(0.0),
            exact,
        }
    }
}

/// Resident and peak resident memory in KiB.
fn memory(pid: u32) -> (u64, u64) {
    (
        process_usage::status_kib(pid, "VmRSS:"),
        process_usage::status_kib(pid, "VmHWM:"),
    )
}

/// Waits until every process in `pids` has used under 2 ms of CPU over 500 ms: the events
/// sent are all handled. Fails after two minutes.
async fn quiet(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last: Vec<u64> = pids.iter().map(|pid| cpu(*pid).0).collect();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now: Vec<u64> = pids.iter().map(|pid| cpu(*pid).0).collect();
        if now
            .iter()
            .zip(&last)
            .all(|(now, last)| now.saturating_sub(*last) < 2_000_000)
        {
            return;
        }
        assert!(Instant::now() < deadline, "the processes never went quiet");
        last = now;
    }
}

// ---------------------------------------------------------------------------------------
// The simulated cluster
// ---------------------------------------------------------------------------------------

fn node_name(index: usize) -> String {
    format!("node-{index:05}")
}

/// A node as a kubelet reports it: about 6 KiB of JSON, most of it the image list.
fn node(index: usize, ready: bool, transition: Timestamp, heartbeat: Timestamp) -> Node {
    let name = node_name(index);
    let zone = index % ZONES;
    let condition = |kind: &str, status: &str, reason: &str| {
        json!({"type": kind, "status": status, "reason": reason, "message": format!("kubelet reports {reason}"),
               "lastHeartbeatTime": heartbeat.to_string(), "lastTransitionTime": transition.to_string()})
    };
    let images: Vec<_> = (0..IMAGES_PER_NODE)
        .map(|image| {
            json!({"names": [format!("registry.example/team-{image}/service@sha256:{:064x}", image * 7919 + 1),
                             format!("registry.example/team-{image}/service:v1.{image}.0")],
                   "sizeBytes": 50_000_000 + image * 1_000_003})
        })
        .collect();
    let resources = json!({"cpu": "16", "memory": "65843340Ki", "pods": "110", "ephemeral-storage": "203056560Ki",
                           "hugepages-1Gi": "0", "hugepages-2Mi": "0"});
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "m6i.4xlarge",
                "topology.kubernetes.io/region": "region-1",
                "topology.kubernetes.io/zone": format!("region-1{}", (b'a' + zone as u8) as char),
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "csi.volume.kubernetes.io/nodeid": format!("{{\"ebs.csi.aws.com\":\"i-{index:017x}\"}}"),
            },
        },
        "spec": {"podCIDR": format!("10.{}.{}.0/24", index / 256, index % 256), "providerID": format!("aws:///zone/i-{index:017x}")},
        "status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                if ready { condition("Ready", "True", "KubeletReady") } else { condition("Ready", "False", "KubeletNotReady") },
            ],
            "addresses": [{"type": "InternalIP", "address": format!("10.0.{}.{}", index / 256, index % 256)},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": format!("{index:032x}"), "systemUUID": format!("ec2{index:029x}"),
                         "bootID": format!("{index:032x}"), "kernelVersion": "6.1.0-27-cloud-amd64",
                         "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://1.7.22",
                         "kubeletVersion": "v1.31.2", "kubeProxyVersion": "v1.31.2",
                         "operatingSystem": "linux", "architecture": "amd64"},
            "images": images,
        }
    }))
    .expect("node")
}

fn lease(index: usize, renewed: Timestamp) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": node_name(index), "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node_name(index), "leaseDurationSeconds": 40,
                 "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}
    }))
    .expect("lease")
}

/// A Deployment's pod: nothing the controller would fence for.
fn pod(node_index: usize, number: usize) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("web-{node_index:05}-{number}"), "namespace": "shop",
                     "labels": {"app": "web"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f",
                                          "uid": "6b1e2f0a-0000-4000-8000-000000000002", "controller": true}]},
        "spec": {"nodeName": node_name(node_index),
                 "containers": [{"name": "web", "image": "registry.example/web:v1",
                                 "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]},
        "status": {"phase": "Running", "podIP": format!("10.{}.{}.{}", node_index / 256, node_index % 256, number + 2)}
    }))
    .expect("pod")
}

async fn simulated_cluster(size: usize) -> FakeApiServer {
    let server = FakeApiServer::start().await;
    server.register(crd());
    let since = Timestamp::now() - Duration::from_secs(3600);
    for index in 0..size {
        server.seed(&node(index, true, since, Timestamp::now()));
        server.seed(&lease(index, Timestamp::now()));
        for number in 0..PODS_PER_NODE {
            server.seed(&pod(index, number));
        }
    }
    server
}

/// Makes `count` writes (`write(0)`, `write(1)`, ...), pausing after each batch.
async fn send<F: FnMut(usize)>(count: usize, mut write: F) {
    for index in 0..count {
        write(index);
        if index % BATCH == BATCH - 1 {
            tokio::time::sleep(PAUSE).await;
        }
    }
}

// ---------------------------------------------------------------------------------------
// The bare reflector (baseline)
// ---------------------------------------------------------------------------------------

/// The baseline process: a kube-rs reflector over every Node, stripping them as the
/// controller does, nothing else. Prints `synced` once its store holds the first list and
/// `saw <name>` for each sentinel node.
fn bare_watcher(url: &str) {
    let runtime = runtime();
    runtime.block_on(async {
        let uri: http::Uri = url.parse().expect("URL");
        let client = kube::Client::try_from(kube::Config::new(uri)).expect("client");
        let (reader, writer) = reflector::store::<Node>();
        let stream = reflector::reflector(
            writer,
            watcher(kube::Api::<Node>::all(client), watcher::Config::default())
                .modify(nodekeeper::controller::nodes::strip)
                .default_backoff(),
        );
        let mut stream = std::pin::pin!(stream);
        let mut announced = false;
        let mut out = std::io::stdout();
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::InitDone) if !announced => {
                    announced = true;
                    let _ = writeln!(out, "synced {}", reader.state().len());
                }
                Ok(watcher::Event::Apply(node))
                    if node
                        .metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with(SENTINEL)) =>
                {
                    let _ = writeln!(out, "saw {}", node.metadata.name.unwrap_or_default());
                }
                _ => continue,
            }
            let _ = out.flush();
        }
    });
}

struct BareWatcher {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl BareWatcher {
    fn start(server: &FakeApiServer) -> BareWatcher {
        let mut child = Command::new(std::env::current_exe().expect("this bench"))
            .env(BARE_WATCHER, server.url())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the bare node watcher");
        let stdout = child.stdout.take().expect("piped");
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        let first = lines
            .recv_timeout(Duration::from_secs(120))
            .expect("the bare watcher's first line");
        assert!(
            first.starts_with("synced"),
            "the bare watcher said {first:?}"
        );
        BareWatcher {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    fn saw(&mut self, sentinel: &str) -> bool {
        self.seen.extend(self.lines.try_iter());
        self.seen
            .iter()
            .any(|line| line == &format!("saw {sentinel}"))
    }
}

impl Drop for BareWatcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------
// Scale
// ---------------------------------------------------------------------------------------

struct ProcessFigures {
    rss_kib: u64,
    peak_kib: u64,
    /// CPU with no events, in µs per second.
    idle_us_per_s: f64,
    /// CPU per status report and per readiness change.
    report: CpuUse,
    flip: CpuUse,
}

struct ScaleResult {
    size: usize,
    controller_start_ms: f64,
    controller: ProcessFigures,
    bare: ProcessFigures,
}

async fn scale(size: usize, size_reports: usize, flips_sent: usize) -> ScaleResult {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = simulated_cluster(size).await;
    // Long enough that no node becomes due during the run: this measures watching.
    let config = write_controller_config(dir.path(), "unhealthyDuration: 10m\n");
    let controller = ControllerProcess::start(dir.path(), &server, &config);
    controller.synced().await;
    let controller_pid = controller.pid();
    // utime + stime: threads that ran only during the start (and ended) count too.
    let start_cpu = CpuMark::take(controller_pid).ticks;
    let mut bare = BareWatcher::start(&server);
    let bare_pid = bare.child.id();
    let pids = [controller_pid, bare_pid];
    quiet(&pids).await;

    // What each process uses with no events, subtracted from every window below.
    let idle_from = [CpuMark::take(controller_pid), CpuMark::take(bare_pid)];
    tokio::time::sleep(IDLE_WINDOW).await;
    let idle_to = [CpuMark::take(controller_pid), CpuMark::take(bare_pid)];
    let idle: Vec<f64> = (0..2)
        .map(|which| idle_from[which].until(&idle_to[which], 0.0).ns / IDLE_WINDOW.as_secs_f64())
        .collect();

    // Status reports: every node in turn gets new heartbeat times and its Lease renewed.
    let before = [CpuMark::take(controller_pid), CpuMark::take(bare_pid)];
    let since = Timestamp::now() - Duration::from_secs(3600);
    send(size_reports, |event| {
        let index = event % size;
        server.seed(&node(index, true, since, Timestamp::now()));
        server.seed(&lease(index, Timestamp::now()));
    })
    .await;
    let after_reports = phase_end(&server, &controller, &mut bare, size, 1).await;

    // Readiness changes: a node goes NotReady and comes back, one at a time.
    send(flips_sent, |event| {
        let index = (event / 2) % size;
        let ready = event % 2 == 1;
        server.seed(&node(index, ready, Timestamp::now(), Timestamp::now()));
    })
    .await;
    let after_flips = phase_end(&server, &controller, &mut bare, size, 2).await;

    let metrics = controller.metrics();
    assert!(
        metrics.contains("nodekeeper_controller_unhealthy_nodes 0"),
        "the controller saw every return to Ready:\n{metrics}"
    );
    let lists = server
        .requests()
        .iter()
        .filter(|request| {
            request.path == "/api/v1/nodes"
                && !request.query.contains("watch=true")
                && !request.query.contains("continue=")
        })
        .count();
    assert_eq!(
        lists, 2,
        "each process listed the nodes once: no watch fell into a relist"
    );

    let figures = |which: usize, pid: u32| {
        let (rss_kib, peak_kib) = memory(pid);
        // Each phase's sentinel is one more event.
        let reports = before[which].until(&after_reports[which], idle[which]);
        let flips = after_reports[which].until(&after_flips[which], idle[which]);
        ProcessFigures {
            rss_kib,
            peak_kib,
            idle_us_per_s: idle[which] / 1000.0,
            report: CpuUse {
                ns: reports.ns / (size_reports + 1) as f64,
                ..reports
            },
            flip: CpuUse {
                ns: flips.ns / (flips_sent + 1) as f64,
                ..flips
            },
        }
    };
    ScaleResult {
        size,
        controller_start_ms: start_cpu as f64 / 1e6,
        controller: figures(0, controller_pid),
        bare: figures(1, bare_pid),
    }
}

/// Ends a phase: adds sentinel node `number` and waits until the controller counts it
/// and the bare reflector has seen it, and both are quiet; returns their CPU readings.
async fn phase_end(
    server: &FakeApiServer,
    controller: &ControllerProcess,
    bare: &mut BareWatcher,
    size: usize,
    number: usize,
) -> [CpuMark; 2] {
    let sentinel = format!("{SENTINEL}{number}");
    let mut node = node(size + number, true, Timestamp::now(), Timestamp::now());
    node.metadata.name = Some(sentinel.clone());
    server.seed(&node);
    let counted = format!("nodekeeper_controller_watched_nodes {}", size + number);
    let pids = [controller.pid(), bare.child.id()];
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        quiet(&pids).await;
        let marks = [CpuMark::take(pids[0]), CpuMark::take(pids[1])];
        // The scrape comes after the readings: its cost falls into the next window.
        if bare.saw(&sentinel) && controller.metrics().contains(&counted) {
            return marks;
        }
        assert!(
            Instant::now() < deadline,
            "{sentinel} never reached both processes"
        );
    }
}

/// A per-event CPU figure in µs; `*` marks one read from 10 ms ticks because a thread
/// ended within its window.
fn per_event(cpu: CpuUse) -> String {
    format!("{:.1}{}", cpu.ns / 1000.0, if cpu.exact { "" } else { "*" })
}

fn print_scale(results: &[ScaleResult]) {
    println!("\ncontroller at scale (CPU per event, less idle; memory after the run)");
    println!(
        "{:>6}  {:<22} {:>8} {:>9} {:>14} {:>13} {:>10} {:>9}",
        "nodes",
        "process",
        "RSS MiB",
        "peak MiB",
        "µs/status rpt",
        "µs/readiness",
        "idle µs/s",
        "start ms"
    );
    for result in results {
        for (name, figures, start) in [
            (
                "nodekeeper controller",
                &result.controller,
                format!("{:.0}", result.controller_start_ms),
            ),
            ("bare node reflector", &result.bare, "-".to_string()),
        ] {
            println!(
                "{:>6}  {:<22} {:>8.1} {:>9.1} {:>14} {:>13} {:>10.0} {:>9}",
                result.size,
                name,
                figures.rss_kib as f64 / 1024.0,
                figures.peak_kib as f64 / 1024.0,
                per_event(figures.report),
                per_event(figures.flip),
                figures.idle_us_per_s,
                start
            );
        }
        println!(
            "{:>6}  ratio controller/bare: RSS {:.2}x, status report {:.2}x, readiness change {:.2}x",
            result.size,
            result.controller.rss_kib as f64 / result.bare.rss_kib as f64,
            result.controller.report.ns / result.bare.report.ns,
            result.controller.flip.ns / result.bare.flip.ns,
        );
    }
    if let (Some(small), Some(large)) = (results.first(), results.last())
        && large.size > small.size
    {
        let growth = |large: f64, small: f64| large / small;
        println!(
            "growth {}→{} nodes (controller): RSS {:.2}x, status report {:.2}x, readiness change {:.2}x, start {:.2}x",
            small.size,
            large.size,
            growth(
                large.controller.rss_kib as f64,
                small.controller.rss_kib as f64
            ),
            growth(large.controller.report.ns, small.controller.report.ns),
            growth(large.controller.flip.ns, small.controller.flip.ns),
            growth(large.controller_start_ms, small.controller_start_ms),
        );
        let added = (large.size - small.size) as f64;
        println!(
            "memory per added node: controller {:.1} KiB, bare reflector {:.1} KiB",
            (large.controller.rss_kib as f64 - small.controller.rss_kib as f64) / added,
            (large.bare.rss_kib as f64 - small.bare.rss_kib as f64) / added,
        );
    }
}

// ---------------------------------------------------------------------------------------
// Start latency
// ---------------------------------------------------------------------------------------

/// A `fence_dummy` that stamps the time it started (bash's `$EPOCHREALTIME`, no fork)
/// and the action it was given, then hands its standard input to the real agent.
fn stamping_agent(dir: &Path, stamps: &Path) -> PathBuf {
    let agents = dir.join("agents");
    std::fs::create_dir_all(&agents).expect("agents dir");
    let path = agents.join("fence_dummy");
    std::fs::write(
        &path,
        format!(
            "#!/bin/bash\nstarted=$EPOCHREALTIME\ninput=$(cat)\n\
             action=$(printf '%s\\n' \"$input\" | sed -n 's/^action=//p' | tail -n 1)\n\
             echo \"$started ${{action:-${{2:-none}}}}\" >> {stamps}\n\
             printf '%s\\n' \"$input\" | exec /usr/sbin/fence_dummy \"$@\"\n",
            stamps = stamps.display()
        ),
    )
    .expect("write the stamping agent");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    agents
}

/// Stamps (seconds since the epoch) of agent starts with `action`.
fn stamps(file: &Path, action: &str) -> Vec<f64> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (stamp, what) = line.split_once(' ')?;
            (what == action).then(|| stamp.parse().ok()).flatten()
        })
        .collect()
}

fn seconds(at: Timestamp) -> f64 {
    at.as_nanosecond() as f64 / 1e9
}

async fn start_latency(samples: usize) {
    if let Err(missing) = support::real::program("fence_dummy", "fence-agents")
        .and_then(|()| support::real::program("bash", "bash"))
    {
        panic!("the start-latency benchmark needs its real agent: {missing}");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let stamp_file = dir.path().join("stamps");
    let agents = stamping_agent(dir.path(), &stamp_file);
    let fabric = enabled_fabric(dir.path());

    // Baseline: the wrapper spawned directly, from just before spawn to its stamp.
    let mut direct = Vec::new();
    for _ in 0..samples {
        let before = seconds(Timestamp::now());
        let mut child = Command::new(agents.join("fence_dummy"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the stamping agent");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(format!("action=monitor\nstatus_file={}\n", fabric.display()).as_bytes())
            .expect("options");
        child.wait().expect("agent");
        let stamp = *stamps(&stamp_file, "monitor").last().expect("a stamp");
        direct.push((stamp - before) * 1000.0);
    }

    let server = FakeApiServer::start().await;
    server.register(crd());
    let long_ago = Timestamp::now() - Duration::from_secs(3600);
    for index in 0..3 {
        server.seed(&node(index, true, long_ago, Timestamp::now()));
    }
    let lost = node_name(1);
    server.seed(&config_map(
        &format!("fence-config-{lost}"),
        "config.properties",
        &format!("node_name={lost}\nisolation=fabric-off\nrecovery=fabric-on"),
    ));
    for (method, action) in [("fabric-off", "off"), ("fabric-on", "on")] {
        server.seed(&config_map(
            &format!("fence-method-{method}-{lost}"),
            "method.properties",
            &format!(
                "agent_name=fence_dummy\nstatus_file={}\naction={action}",
                fabric.display()
            ),
        ));
    }
    let config = write_controller_config(
        dir.path(),
        &format!(
            "unhealthyDuration: 2s\npowerManagementDelay: 10m\n\
             release: {{outOfServiceTaint: true, deletePods: true}}\n\
             # One node is fenced every few seconds: the zone rate must not gate a sample.\n\
             stormGuard: {{zoneFenceRate: 10, stormCooldown: 0s}}\n\
             agents: {{directory: {agents}, callTimeout: 10s, verifyTimeout: 10s, allowedOptions: [status_file]}}\n",
            agents = agents.display()
        ),
    );
    let controller = ControllerProcess::start(dir.path(), &server, &config);
    controller.synced().await;

    let mut measured = Vec::new();
    for sample in 0..samples {
        // The kubelet's condition times have whole seconds; the node is due exactly 2 s on.
        // The previous sample's fence deleted the database pod; its StatefulSet made it anew.
        support::controller::seed_database(&server, &lost, "db-0");
        let lost_at = Timestamp::from_second(Timestamp::now().as_second()).expect("now");
        let due = seconds(lost_at) + 2.0;
        let seen = stamps(&stamp_file, "off").len();
        server.seed(&node(1, false, lost_at, Timestamp::now()));
        let started =
            support::controller::wait_for(&controller, "the isolation agent to start", || {
                stamps(&stamp_file, "off").get(seen).copied()
            })
            .await;
        measured.push((started - due) * 1000.0);
        // Wait for the isolation to be confirmed, then bring the node back and let recovery
        // finish, so every sample starts from a cluster without a fence.
        support::controller::wait_for(&controller, "the isolation to be confirmed", || {
            let fence = fence_of(&server, &lost)?;
            (*fence.pointer("/status/phase")? == "Done").then_some(())
        })
        .await;
        server.seed(&node(1, true, Timestamp::now(), Timestamp::now()));
        support::controller::wait_for(&controller, "recovery to finish", || {
            fence_of(&server, &lost).is_none().then_some(())
        })
        .await;
        eprintln!("sample {sample}: {:.1} ms", measured[sample]);
    }
    let metrics = controller.metrics();
    let delay_sum =
        metric_value(&metrics, "nodekeeper_fence_start_delay_seconds_sum").unwrap_or(0.0);
    let delay_count =
        metric_value(&metrics, "nodekeeper_fence_start_delay_seconds_count").unwrap_or(0.0);

    println!("\nunhealthyDuration elapsed → fence agent started ({samples} samples, ms)");
    println!(
        "{:<34} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "case", "min", "median", "p90", "max", "mean"
    );
    for (name, values) in [
        ("direct spawn (baseline)", &direct),
        ("nodekeeper controller", &measured),
    ] {
        let summary = Summary::of(values);
        println!(
            "{:<34} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
            name, summary.min, summary.median, summary.p90, summary.max, summary.mean
        );
    }
    println!(
        "ratio of medians controller/direct: {:.1}x; the controller's own \
         nodekeeper_fence_start_delay_seconds mean: {:.3} s over {delay_count} fences (unhealthyDuration 2 s)",
        Summary::of(&measured).median / Summary::of(&direct).median,
        delay_sum / delay_count.max(1.0),
    );
}

struct Summary {
    min: f64,
    median: f64,
    p90: f64,
    max: f64,
    mean: f64,
}

impl Summary {
    fn of(values: &[f64]) -> Summary {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let at = |share: f64| sorted[((sorted.len() - 1) as f64 * share).round() as usize];
        Summary {
            min: sorted[0],
            median: at(0.5),
            p90: at(0.9),
            max: sorted[sorted.len() - 1],
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
        }
    }
}
