//! Files cut short, garbage and cgroups removed under a running agent: the agent binary,
//! in Kubernetes mode on a fake node with plenty of free memory, while the files it reads
//! every cycle are rewritten a piece at a time (so that a read may find them empty or
//! cut anywhere), held cut or full of garbage across cycles, and a pod's cgroup is
//! removed and made again between one cycle's listing and its reads.
//!
//! A read cut short must never pass for a figure: `inactive_file 42236` cut from
//! `4223664128` on a node full of page cache, read as a number, would make the node look
//! out of memory and evict pods for nothing. So: no eviction while the files are torn, the
//! agent live all along, each broken node-level file named in the log and counted; once
//! the files are whole again, real pressure evicts the pod the kubelet would choose.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use support::agent_process::{AgentProcess, http_get};
use support::apiserver::FakeApiServer;
use support::controller::metric_value;
use support::fake_node::{
    Host, MI, PodFixture, best_effort, node_condition, pods_listed, seed_node,
};

/// How long the files are torn.
const CHAOS: Duration = Duration::from_secs(24);

/// The agent's log line for each eviction it decides.
const EVICTED: &str = "nodekeeper::agent::cycle: evicted pod";

/// The largest: the kubelet's choice under memory pressure.
const BIG: PodFixture = best_effort("big", "0000000c-0001", 3000);
/// Its `cgroup.procs` holds garbage for a while.
const MID: PodFixture = best_effort("mid", "0000000c-0002", 2000);
/// Its cgroup is removed and made again, over and over.
const SMALL: PodFixture = best_effort("small", "0000000c-0003", 1000);

/// The faults, one after the other, each for a second and a half or so.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// `/proc/meminfo` rewritten in two pieces, again and again.
    MeminfoTorn,
    /// `/proc/meminfo` cut inside its first number.
    MeminfoCut,
    /// The root `memory.stat` cut inside `inactive_file`'s figure, inside another line,
    /// or garbage, for a fifth of a second; then rewritten in two pieces.
    RootStatBroken,
    /// The largest pod's `memory.current` cut, its `memory.stat` garbage.
    PodFilesBroken,
    /// A pod's `cgroup.procs` garbage.
    ProcsGarbage,
    /// A pod's cgroup removed and made again.
    CgroupRemoved,
}

const FAULTS: [Fault; 6] = [
    Fault::MeminfoTorn,
    Fault::MeminfoCut,
    Fault::RootStatBroken,
    Fault::PodFilesBroken,
    Fault::ProcsGarbage,
    Fault::CgroupRemoved,
];

/// The files the faults touch, with their whole contents.
#[derive(Clone)]
struct Files {
    meminfo: (PathBuf, String),
    root_stat: (PathBuf, String),
    big: PathBuf,
    mid: PathBuf,
    small: PathBuf,
    /// What each pod cgroup's files hold when whole, by file name.
    pod_files: BTreeMap<PathBuf, BTreeMap<String, String>>,
}

impl Files {
    fn of(host: &Host) -> Files {
        let whole = |path: PathBuf| {
            let text = std::fs::read_to_string(&path).unwrap();
            (path, text)
        };
        let mut pod_files = BTreeMap::new();
        for fixture in [&BIG, &MID, &SMALL] {
            let dir = host.pod_cgroup("besteffort", fixture.uid);
            let files = std::fs::read_dir(&dir)
                .unwrap()
                .map(|entry| entry.unwrap())
                .map(|entry| {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    (name, std::fs::read_to_string(entry.path()).unwrap())
                })
                .collect();
            pod_files.insert(dir, files);
        }
        let root = host.dir.path();
        Files {
            meminfo: whole(root.join("proc/meminfo")),
            root_stat: whole(root.join("cgroup/memory.stat")),
            big: host.pod_cgroup("besteffort", BIG.uid),
            mid: host.pod_cgroup("besteffort", MID.uid),
            small: host.pod_cgroup("besteffort", SMALL.uid),
            pod_files,
        }
    }

    /// Every file whole again, every pod cgroup there.
    fn restore(&self) {
        std::fs::write(&self.meminfo.0, &self.meminfo.1).unwrap();
        std::fs::write(&self.root_stat.0, &self.root_stat.1).unwrap();
        for (dir, files) in &self.pod_files {
            std::fs::create_dir_all(dir).unwrap();
            for (name, text) in files {
                std::fs::write(dir.join(name), text).unwrap();
            }
        }
    }
}

/// Writes `text` to `path` in two pieces, cut at `cut`, with a pause between: a read
/// meanwhile finds the file empty or cut there, as one of a file being rewritten does.
fn write_torn(path: &Path, text: &str, cut: usize) {
    use std::io::Write;
    let cut = cut % (text.len() + 1);
    let mut file = std::fs::File::create(path).unwrap();
    file.write_all(&text.as_bytes()[..cut]).unwrap();
    std::thread::sleep(Duration::from_millis(3));
    file.write_all(&text.as_bytes()[cut..]).unwrap();
}

/// Applies the faults in turn until `stop`; returns how many times each was applied.
fn tear(files: &Files, stop: &AtomicBool) -> BTreeMap<Fault, usize> {
    let mut applied = BTreeMap::new();
    let mut round = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let fault = FAULTS[round % FAULTS.len()];
        round += 1;
        let until = Instant::now() + Duration::from_millis(1500);
        let mut times = 0usize;
        while Instant::now() < until && !stop.load(Ordering::SeqCst) {
            times += 1;
            match fault {
                Fault::MeminfoTorn => {
                    let (path, text) = &files.meminfo;
                    write_torn(path, text, times * 7);
                }
                Fault::MeminfoCut => {
                    std::fs::write(&files.meminfo.0, "MemTotal: 83").unwrap();
                }
                Fault::RootStatBroken => {
                    let (path, text) = &files.root_stat;
                    // Cut inside `inactive_file`'s figure, inside a line, garbage.
                    let broken = match times % 3 {
                        0 => text[..text.len() - 6].to_string(),
                        1 => text[..text.len() / 2].to_string(),
                        _ => "\u{0}\u{1}\u{7f}garbage\n\n".to_string(),
                    };
                    std::fs::write(path, broken).unwrap();
                    std::thread::sleep(Duration::from_millis(200));
                    write_torn(path, text, times * 11);
                }
                Fault::PodFilesBroken => {
                    std::fs::write(files.big.join("memory.current"), "314").unwrap();
                    std::fs::write(files.big.join("memory.stat"), "inactive_file x\n").unwrap();
                }
                Fault::ProcsGarbage => {
                    std::fs::write(files.mid.join("cgroup.procs"), "not-a-pid\n-1\n").unwrap();
                }
                Fault::CgroupRemoved => {
                    std::fs::remove_dir_all(&files.small).unwrap();
                    std::thread::sleep(Duration::from_millis(30));
                    files.restore();
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        files.restore();
        *applied.entry(fault).or_default() += times;
    }
    applied
}

/// The pods' processes, this test's own, ended when it ends, a failed assertion included.
struct Processes(Vec<std::process::Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for process in &mut self.0 {
            let _ = process.kill();
            let _ = process.wait();
        }
    }
}

fn memory_pressure(server: &FakeApiServer) -> Option<String> {
    node_condition(server, "NodekeeperMemoryPressure")
}

/// Polls `check` every 50 ms until it holds, at most `within`; fails naming `what`.
async fn until(agent: &AgentProcess, within: Duration, what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}; agent log:\n{}",
            agent.whole_log().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_files_and_vanishing_cgroups_neither_stop_nor_mislead_the_agent() {
    let server = FakeApiServer::start().await;
    seed_node(&server);
    let host = Host::new(4096 * MI);
    // A node whose memory is mostly page cache, half of it inactive: 4 GiB available of
    // 8, but 68 MiB free. Its working set is `anon + file - inactive_file`, so an
    // `inactive_file` read short would put it out of memory.
    std::fs::write(
        host.dir.path().join("proc/meminfo"),
        "MemTotal: 8388608 kB\nMemFree: 69632 kB\nMemAvailable: 4194304 kB\n\
         Inactive(file): 4124672 kB\nHugePages_Total: 0\nHugePages_Surp: 0\n\
         Hugepagesize: 2048 kB\nHugetlb: 0 kB\n",
    )
    .unwrap();
    std::fs::write(
        host.dir.path().join("cgroup/memory.stat"),
        format!(
            "anon {}\nfile {}\ninactive_file {}\n",
            1024 * MI,
            7100 * MI,
            4028 * MI
        ),
    )
    .unwrap();
    let _processes = Processes(
        [&BIG, &MID, &SMALL]
            .into_iter()
            .map(|fixture| host.bind_running(&server, fixture))
            .collect(),
    );
    let config = host.dir.path().join("agent.yaml");
    std::fs::write(&config, host.yaml("housekeepingInterval: 1s\n")).unwrap();
    let kubeconfig = host.dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let mut agent = AgentProcess::start(&[
        "--metrics-addr".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--config".as_ref(),
        config.as_os_str(),
        "--kubeconfig".as_ref(),
        kubeconfig.as_os_str(),
    ]);
    // Steady first: the pods listed, the node's conditions published.
    until(
        &agent,
        Duration::from_secs(30),
        "the node's pods listed",
        || pods_listed(&server),
    )
    .await;
    until(
        &agent,
        Duration::from_secs(30),
        "conditions published",
        || memory_pressure(&server).as_deref() == Some("False"),
    )
    .await;

    let files = Files::of(&host);
    let stop = Arc::new(AtomicBool::new(false));
    let chaos = {
        let (files, stop) = (files.clone(), stop.clone());
        std::thread::spawn(move || tear(&files, &stop))
    };
    // Liveness, looked at as a kubelet's probe would, all along.
    let began = Instant::now();
    let mut looks = Vec::new();
    while began.elapsed() < CHAOS {
        looks.push(http_get(&agent.address, "/healthz").0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let applied = chaos.join().expect("the fault thread");
    files.restore();
    let torn_log = agent.whole_log().join("\n");
    let metrics = http_get(&agent.address, "/metrics").1;

    println!(
        "faults applied: {applied:?}; {} liveness looks",
        looks.len()
    );
    assert_eq!(
        applied.keys().copied().collect::<Vec<_>>(),
        FAULTS,
        "every fault applied at least once"
    );
    assert!(
        looks.iter().all(|status| *status == 200),
        "liveness failed while the files were torn: {looks:?}\n{torn_log}"
    );
    // Nothing read from a torn file passed for pressure.
    assert!(!torn_log.contains(EVICTED), "{torn_log}");
    assert!(
        !server.requests().iter().any(|r| r.method == "DELETE"),
        "{torn_log}"
    );
    assert!(!torn_log.contains("panicked"), "{torn_log}");
    // Each broken node-level file is named, with what was wrong with it.
    let root = host.dir.path().display().to_string();
    for (file, problem) in [("proc/meminfo", "MemTotal"), ("cgroup/memory.stat", "")] {
        let path = format!("{root}/{file}");
        assert!(
            torn_log
                .lines()
                .any(|line| line.contains("signal collection failed")
                    && line.contains(&path)
                    && line.contains(problem)),
            "no error naming {path}:\n{torn_log}"
        );
    }
    assert!(
        metric_value(
            &metrics,
            "nodekeeper_collection_errors_total{signal=\"memory.available\"}"
        )
        .is_some_and(|count| count > 0.0),
        "{metrics}"
    );

    // The files whole again: the agent reads them again, and real pressure evicts the
    // pod the kubelet would choose.
    until(
        &agent,
        Duration::from_secs(10),
        "collection recovered",
        || {
            agent
                .whole_log()
                .iter()
                .any(|line| line.contains("signal collection recovered"))
        },
    )
    .await;
    host.set_free_memory(50 * MI);
    let (_, evicted) = agent.wait_for_line(EVICTED, Duration::from_secs(20));
    assert!(evicted.contains("pod=default/big"), "{evicted}");
    until(&agent, Duration::from_secs(20), "big deleted", || {
        !support::fake_node::successful_deletes(&server, "big").is_empty()
    })
    .await;
    let log = agent.whole_log().join("\n");
    let status = agent.stop(Duration::from_secs(20));
    assert!(status.success(), "agent exited with {status}:\n{log}");
}
