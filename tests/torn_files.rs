//! Files cut short, garbage and cgroups removed under a running agent: the agent binary,
//! in Kubernetes mode on a fake node with plenty of free memory, while the files it reads
//! every cycle are rewritten a piece at a time (so that a read may find them empty or
//! cut anywhere), held cut or full of garbage across cycles, and a pod's cgroup is
//! removed and made again between one cycle's listing and its reads.
//!
//! A read cut short must never pass for a figure: `inactive_file 42236` cut from
//! `4223664128` on a node full of page cache, read as a number, would make the node look
//! out of memory and evict pods for nothing; a root `memory.stat` read empty must not
//! switch to the meminfo formula, which counts kernel memory too. So: `memory.available`
//! never other than the node's true figure while the files are torn, no eviction, the
//! agent live all along, each broken node-level file named in the log and counted. Once
//! the files are whole again, real pressure evicts the pod the kubelet would choose, the
//! largest, even while its own files are broken: it keeps the figures last read from
//! them, as the kubelet's stats do.

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
    /// The root `memory.stat` cut inside `inactive_file`'s figure for a second and a
    /// half (so a cycle reads it), cut inside another line for a fifth of a second, then
    /// garbage and empty for a cycle each; then rewritten in two pieces.
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

    /// The largest pod's `memory.current` cut short, its `memory.stat` garbage.
    fn break_big_pod_files(&self) {
        std::fs::write(self.big.join("memory.current"), "314").unwrap();
        std::fs::write(self.big.join("memory.stat"), "inactive_file x\n").unwrap();
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
                    // Each held across a cycle, but for the cut inside a line, which
                    // the kernel files' own fuzzing covers.
                    for (broken, held) in [
                        (&text[..text.len() - 6], 1500),
                        (&text[..text.len() / 2], 200),
                        ("\u{0}\u{1}\u{7f}garbage\n\n", 1200),
                        ("", 1200),
                    ] {
                        std::fs::write(path, broken).unwrap();
                        std::thread::sleep(Duration::from_millis(held));
                    }
                    write_torn(path, text, times * 11);
                }
                Fault::PodFilesBroken => files.break_big_pod_files(),
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

/// The thread tearing the files; stopped and waited for when the test ends, a failed
/// assertion included, so that it never writes into a removed directory.
struct Tearing {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<BTreeMap<Fault, usize>>>,
}

impl Tearing {
    fn start(files: &Files) -> Tearing {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (files, stop) = (files.clone(), stop.clone());
            std::thread::spawn(move || tear(&files, &stop))
        };
        Tearing {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops it; how many times each fault was applied.
    fn finish(mut self) -> BTreeMap<Fault, usize> {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.take().expect("finished once");
        thread.join().expect("the fault thread")
    }
}

impl Drop for Tearing {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn memory_pressure(server: &FakeApiServer) -> Option<String> {
    node_condition(server, "NodekeeperMemoryPressure")
}

/// The agent's collection cycles so far: its collection-time histogram's count.
const CYCLES_RUN: &str = "nodekeeper_collection_duration_seconds_count";

/// `memory.available` as the agent last observed it.
const MEMORY_AVAILABLE: &str = "nodekeeper_signal_available{signal=\"memory.available\"}";

/// The errors the agent has counted collecting `memory.available`, the signal the torn
/// node-level files feed. (This fake node has no `pid_max` nor a pods cgroup of its own,
/// so other signals fail every cycle.)
const MEMORY_AVAILABLE_ERRORS: &str =
    "nodekeeper_collection_errors_total{signal=\"memory.available\"}";

/// One series of the agent's metrics, scraped now.
fn scraped(agent: &AgentProcess, series: &str) -> Option<f64> {
    metric_value(&http_get(&agent.address, "/metrics").1, series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_files_and_vanishing_cgroups_neither_stop_nor_mislead_the_agent() {
    let server = FakeApiServer::start().await;
    seed_node(&server);
    let host = Host::new(4096 * MI);
    // A node whose memory is mostly page cache, half of it inactive: 68 MiB free, about
    // 4 GiB available of 8. Its working set is `anon + file - inactive_file`, so an
    // `inactive_file` read short would put it out of memory (92 MiB available, below the
    // 100Mi threshold). Its kernel takes 24 MiB more, so the meminfo formula would give
    // another figure (4096 MiB, not 4120).
    std::fs::write(
        host.dir.path().join("proc/meminfo"),
        "MemTotal: 8388608 kB\nMemFree: 69632 kB\nMemAvailable: 4194304 kB\n\
         Inactive(file): 4124672 kB\nHugePages_Total: 0\nHugePages_Surp: 0\n\
         Hugepagesize: 2048 kB\nHugetlb: 0 kB\n",
    )
    .unwrap();
    let (anon, file, inactive_file) = (1024 * MI, 7076 * MI, 4028 * MI);
    std::fs::write(
        host.dir.path().join("cgroup/memory.stat"),
        format!("anon {anon}\nfile {file}\ninactive_file {inactive_file}\n"),
    )
    .unwrap();
    let true_available = (8192 * MI - (anon + file - inactive_file)) as f64;
    let _processes: Vec<_> = [&BIG, &MID, &SMALL]
        .into_iter()
        .map(|fixture| host.bind_running(&server, fixture))
        .collect();
    let (config, kubeconfig) = host.write_agent_files(&server, "housekeepingInterval: 1s\n");
    let mut agent = AgentProcess::start_in_kubernetes(&config, &kubeconfig);
    // Steady first: the pods listed, the node's conditions published, the true figure.
    agent
        .until(Duration::from_secs(30), "the node's pods listed", || {
            pods_listed(&server)
        })
        .await;
    agent
        .until(Duration::from_secs(30), "conditions published", || {
            memory_pressure(&server).as_deref() == Some("False")
        })
        .await;
    agent
        .until(Duration::from_secs(30), "the true figure", || {
            scraped(&agent, MEMORY_AVAILABLE) == Some(true_available)
        })
        .await;

    let files = Files::of(&host);
    let tearing = Tearing::start(&files);
    // Liveness, looked at as a kubelet's probe would, and memory.available, all along.
    let began = Instant::now();
    let mut looks = Vec::new();
    let mut available_seen = BTreeMap::<u64, usize>::new();
    while began.elapsed() < CHAOS {
        looks.push(http_get(&agent.address, "/healthz").0);
        let available = scraped(&agent, MEMORY_AVAILABLE);
        *available_seen
            .entry(available.map_or(0, |bytes| bytes as u64))
            .or_default() += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let applied = tearing.finish();
    files.restore();
    println!(
        "faults applied: {applied:?}; {} liveness looks; memory.available seen (bytes: looks): {available_seen:?}",
        looks.len()
    );
    assert_eq!(
        applied.keys().copied().collect::<Vec<_>>(),
        FAULTS,
        "every fault applied at least once"
    );
    assert!(
        looks.iter().all(|status| *status == 200),
        "liveness failed while the files were torn: {looks:?}\n{}",
        agent.whole_log().join("\n")
    );
    // Nothing read from a torn file passed for a figure: not a cut `inactive_file`, not
    // the meminfo formula in place of an empty memory.stat.
    assert_eq!(
        available_seen.keys().copied().collect::<Vec<_>>(),
        [true_available as u64],
        "memory.available other than the node's while the files were torn\n{}",
        agent.whole_log().join("\n")
    );
    // Whole again: after one cycle to read them, two more without a collection error, in
    // which an eviction decided on a torn read would still show.
    let cycles = || scraped(&agent, CYCLES_RUN).unwrap_or(0.0);
    let errors = || scraped(&agent, MEMORY_AVAILABLE_ERRORS).unwrap_or(0.0);
    let restored_at = cycles();
    agent
        .until(Duration::from_secs(10), "a cycle on whole files", || {
            cycles() >= restored_at + 1.0
        })
        .await;
    let (errors_then, cycles_then) = (errors(), cycles());
    agent
        .until(Duration::from_secs(10), "two more cycles", || {
            cycles() >= cycles_then + 2.0
        })
        .await;
    assert_eq!(
        errors(),
        errors_then,
        "memory.available errors on whole files:\n{}",
        agent.whole_log().join("\n")
    );
    let torn_log = agent.whole_log().join("\n");
    assert!(!torn_log.contains(EVICTED), "{torn_log}");
    assert!(
        !server.requests().iter().any(|r| r.method == "DELETE"),
        "{torn_log}"
    );
    assert!(!torn_log.contains("panicked"), "{torn_log}");
    // Each broken node-level file is named, with what was wrong with it: the dangerous
    // cut quoted.
    let root = host.dir.path().display().to_string();
    for (file, problem) in [
        ("proc/meminfo", "MemTotal"),
        ("cgroup/memory.stat", "inactive_file 42236"),
    ] {
        let path = format!("{root}/{file}");
        assert!(
            torn_log
                .lines()
                .any(|line| line.contains("signal collection failed")
                    && line.contains(&path)
                    && line.contains(problem)),
            "no error naming {path} with {problem:?}:\n{torn_log}"
        );
    }
    assert!(errors() > 0.0, "{}", http_get(&agent.address, "/metrics").1);
    assert!(
        torn_log
            .lines()
            .any(|line| line.contains("signal collection recovered")
                && line.contains("inactive_file 42236")),
        "the end of the cut not said:\n{torn_log}"
    );

    // Real pressure while the largest pod's own files are broken: the agent keeps the
    // figures last read from them, and evicts it, as the kubelet would. (Measured as
    // empty, it would rank last, and `mid` would go.)
    files.break_big_pod_files();
    let pressured_at = Instant::now();
    host.set_free_memory(50 * MI);
    let (evicted_at, evicted) = agent.wait_for_line(EVICTED, Duration::from_secs(20));
    assert!(evicted_at >= pressured_at, "{evicted}");
    assert!(evicted.contains("pod=default/big"), "{evicted}");
    agent
        .until(Duration::from_secs(20), "big deleted", || {
            !support::fake_node::successful_deletes(&server, "big").is_empty()
        })
        .await;
    // Its containers gone, as the runtime would see to: the agent stops waiting for them.
    std::fs::write(files.big.join("cgroup.procs"), "").unwrap();
    host.set_free_memory(4096 * MI);
    let log = agent.whole_log().join("\n");
    let status = agent.stop(Duration::from_secs(20));
    assert!(status.success(), "agent exited with {status}:\n{log}");
    assert!(
        !log.contains("evicted workloads still have processes"),
        "{log}"
    );
}
