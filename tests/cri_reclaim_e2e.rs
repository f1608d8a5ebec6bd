//! Node-level reclaim against a real containerd (Debian's, with its CRI plugin and runc):
//! what the agent removes before evicting for disk pressure is what the kubelet's
//! container and image garbage collectors remove when its eviction manager calls them
//! (`DeleteAllUnusedContainers`, `DeleteUnusedImages`), and a dry run removes nothing.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use nodekeeper::config::GoDuration;
use nodekeeper::config::{FilesystemLayout, NodeReclaimConfig, ReclaimMethod};
use nodekeeper::cri::CriReclaimer;
use nodekeeper::cri::gc::PodsKnown;
use nodekeeper::eviction::NodeReclaimer;
use nodekeeper::signals::Signal;
use support::agent_process::AgentProcess;
use support::containerd::{self, Containerd, SANDBOX_IMAGE};
use support::full_disk::FullDisk;

fn reclaimer(runtime: &Containerd, minimum_age: GoDuration, dry_run: bool) -> CriReclaimer {
    let config = NodeReclaimConfig {
        method: ReclaimMethod::Cri,
        runtime_endpoint: runtime.endpoint(),
        image_endpoint: runtime.endpoint(),
        image_minimum_gc_age: minimum_age,
        timeout: GoDuration::from_secs(60),
        ..NodeReclaimConfig::default()
    };
    let mut reclaimer = CriReclaimer::new(&config, FilesystemLayout::SingleDisk, dry_run)
        .expect("the endpoint is a socket path");
    reclaimer.set_pods(PodsKnown::active(BTreeSet::from([
        "live-uid".to_string(),
        "stopped-uid".to_string(),
    ])));
    // The pods here are seconds old: shorter than the two minutes a pod's newest
    // sandbox must exist before it counts as gone.
    reclaimer.set_gone_pod_minimum_age(GONE_AFTER);
    reclaimer
}

const GONE_AFTER: Duration = Duration::from_secs(2);

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

// kuberuntime_gc.go (`evictContainers`, `evictSandboxes` with evictNonDeletedPods) and
// image_gc_manager.go (`DeleteUnusedImages`): a living pod keeps its newest dead
// container of each name and its sandbox; a pod gone from the node loses its dead
// containers and its stopped sandbox; images no container uses go once they are older
// than imageMinimumGCAge, except the runtime's sandbox image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_removes_what_the_kubelets_garbage_collectors_remove() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = require!("containerd", Containerd::start(dir.path()));
    for (name, command) in [
        (SANDBOX_IMAGE, &["/bin/sleep", "1000000"][..]),
        ("nodekeeper.test/app:1", &["/bin/true"][..]),
        ("nodekeeper.test/unused:1", &["/bin/sleep", "1"][..]),
        ("nodekeeper.test/unused:2", &["/bin/sleep", "2"][..]),
    ] {
        runtime.import_image(name, command);
    }
    let mut client = runtime.client().await;
    let app = "nodekeeper.test/app:1";
    let live = runtime.run_sandbox(&mut client, "live", "live-uid").await;
    let live_first = runtime
        .run_to_exit(&mut client, &live, ("live", "live-uid"), "app", 0, app)
        .await;
    let live_second = runtime
        .run_to_exit(&mut client, &live, ("live", "live-uid"), "app", 1, app)
        .await;
    let gone = runtime.run_sandbox(&mut client, "gone", "gone-uid").await;
    let gone_container = runtime
        .run_to_exit(&mut client, &gone, ("gone", "gone-uid"), "app", 0, app)
        .await;
    runtime.stop_sandbox(&mut client, &gone).await;
    // A pod still on the node whose sandbox is not ready (stopped, or being recreated):
    // it keeps its newest dead container and its sandbox.
    let stopped = runtime
        .run_sandbox(&mut client, "stopped", "stopped-uid")
        .await;
    let stopped_first = runtime
        .run_to_exit(
            &mut client,
            &stopped,
            ("stopped", "stopped-uid"),
            "app",
            0,
            app,
        )
        .await;
    let stopped_second = runtime
        .run_to_exit(
            &mut client,
            &stopped,
            ("stopped", "stopped-uid"),
            "app",
            1,
            app,
        )
        .await;
    runtime.stop_sandbox(&mut client, &stopped).await;

    // Until the gone pod's sandbox is old enough it counts as living: only what a living
    // pod loses goes.
    let mut early = reclaimer(&runtime, GoDuration::ZERO, true);
    early.set_gone_pod_minimum_age(Duration::from_secs(3600));
    early
        .reclaim(Signal::NodeFsAvailable)
        .await
        .expect("dry run");
    assert_eq!(
        sorted(early.last_removed().containers.clone()),
        sorted(vec![live_first.clone(), stopped_first.clone()])
    );
    assert!(early.last_removed().sandboxes.is_empty());
    tokio::time::sleep(GONE_AFTER).await;
    let images_before = containerd::image_names(&mut client).await;
    let container_ids = |list: Vec<nodekeeper::cri::wire::Container>| {
        sorted(list.into_iter().map(|c| c.id).collect())
    };
    let sandbox_ids = |list: Vec<nodekeeper::cri::wire::PodSandbox>| {
        sorted(list.into_iter().map(|s| s.id).collect())
    };

    // A dry run names what would go and removes nothing.
    let mut dry = reclaimer(&runtime, GoDuration::ZERO, true);
    dry.reclaim(Signal::NodeFsAvailable).await.expect("dry run");
    let plan = dry.last_removed().clone();
    assert_eq!(
        sorted(plan.containers.clone()),
        sorted(vec![
            live_first.clone(),
            gone_container.clone(),
            stopped_first.clone()
        ])
    );
    assert_eq!(plan.sandboxes, [gone.as_str()]);
    assert_eq!(plan.images.len(), 2, "{plan:?}");
    assert_eq!(
        container_ids(containerd::list_containers(&mut client).await),
        sorted(vec![
            live_first.clone(),
            live_second.clone(),
            gone_container.clone(),
            stopped_first.clone(),
            stopped_second.clone()
        ])
    );
    assert_eq!(
        sandbox_ids(containerd::list_sandboxes(&mut client).await),
        sorted(vec![live.clone(), gone.clone(), stopped.clone()])
    );
    assert_eq!(containerd::image_names(&mut client).await, images_before);

    // Images younger than imageMinimumGCAge stay; the containers and sandbox go.
    let mut young = reclaimer(&runtime, GoDuration::from_secs(3600), false);
    young
        .reclaim(Signal::NodeFsAvailable)
        .await
        .expect("reclaim");
    assert_eq!(
        container_ids(containerd::list_containers(&mut client).await),
        sorted(vec![live_second.clone(), stopped_second.clone()])
    );
    assert_eq!(
        sandbox_ids(containerd::list_sandboxes(&mut client).await),
        sorted(vec![live.clone(), stopped.clone()])
    );
    assert_eq!(containerd::image_names(&mut client).await, images_before);
    assert!(young.last_removed().images.is_empty());

    // Old enough, the unused images go; the one a dead container still names and the
    // sandbox image (not pinned by containerd 1.6, named by its status) stay.
    let mut old = reclaimer(&runtime, GoDuration::ZERO, false);
    old.reclaim(Signal::ImageFsAvailable)
        .await
        .expect("reclaim");
    assert_eq!(
        containerd::image_names(&mut client).await,
        [app.to_string(), SANDBOX_IMAGE.to_string()]
    );
    assert_eq!(
        sorted(old.last_removed().images.clone()),
        sorted(plan.images.clone())
    );
    assert!(old.last_removed().image_bytes > 0);
    drop(client);
    drop(runtime);
}

// A runtime that is not there is a failure naming its socket; the agent then evicts as
// it would have without reclaim.
#[tokio::test]
async fn an_absent_runtime_is_an_error_naming_its_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("absent.sock");
    let config = NodeReclaimConfig {
        runtime_endpoint: format!("unix://{}", socket.display()),
        image_endpoint: format!("unix://{}", socket.display()),
        timeout: GoDuration::from_secs(5),
        ..NodeReclaimConfig::default()
    };
    let mut reclaimer = CriReclaimer::new(&config, FilesystemLayout::SingleDisk, false).unwrap();
    let started = std::time::Instant::now();
    let error = reclaimer
        .reclaim(Signal::NodeFsAvailable)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains(&socket.display().to_string()), "{error}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// The agent's own default, end to end: a node filesystem short of space because of an
/// image no container uses. The kubelet's eviction manager would delete the image and
/// find the pressure gone (`reclaimNodeLevelResources`); so does the agent, through the
/// runtime the configuration names, with no reclaim configured. A dry run only says what
/// it would remove.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_frees_disk_through_the_runtime_before_it_would_evict() {
    const MIB: usize = 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let disk = require!(
        "a tmpfs of the test's own (mount, as root)",
        FullDisk::mount(&dir.path().join("disk"), 96 * 1024)
    );
    let store = disk.path().join("containerd");
    let runtime = require!(
        "containerd",
        Containerd::start_storing_in(dir.path(), Some(&store))
    );
    runtime.import_image(SANDBOX_IMAGE, &["/bin/sleep", "1000000"]);
    // 24 MiB of layer and 24 MiB of snapshot: 96 MiB less about 52 leaves under 60 MiB.
    let big = "nodekeeper.test/big:1";
    runtime.import_image_with_ballast(big, &["/bin/true"], 24 * MIB);
    let mut client = runtime.client().await;
    assert!(
        containerd::image_names(&mut client)
            .await
            .contains(&big.to_string())
    );

    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\n\
             housekeepingInterval: 100ms\nnodefsPath: {}\n\
             evictionHard: {{nodefs.available: 60Mi}}\n\
             containerRuntimeEndpoint: {}\nimageMinimumGCAge: 1ms\n\
             shutdownGracePeriod: 0s\n",
            disk.path().display(),
            runtime.endpoint()
        ),
    )
    .unwrap();

    let mut dry = AgentProcess::dry_run(&config);
    let (_, line) = dry.wait_for_line(
        "dry run: node-level reclaim would remove",
        Duration::from_secs(30),
    );
    assert!(
        line.contains("0 containers, 0 pod sandboxes, 1 images"),
        "{line}"
    );
    dry.stop(Duration::from_secs(10));
    assert!(
        containerd::image_names(&mut client)
            .await
            .contains(&big.to_string())
    );

    let config_arg = config.display().to_string();
    let mut agent =
        AgentProcess::start(&["--metrics-addr", "127.0.0.1:0", "--config", &config_arg]);
    let (_, line) = agent.wait_for_line("node-level reclaim removed", Duration::from_secs(30));
    assert!(
        line.contains("0 containers, 0 pod sandboxes, 1 images"),
        "{line}"
    );
    agent.wait_for_line(
        "able to reduce resource pressure without evicting pods",
        Duration::from_secs(10),
    );
    agent.stop(Duration::from_secs(10));
    assert_eq!(
        containerd::image_names(&mut client).await,
        [SANDBOX_IMAGE.to_string()]
    );
    drop(client);
    drop(runtime);
    drop(disk);
}

/// The kubelet's reclaim before its next eviction removes the runtime of a pod it has
/// terminated (`ShouldPodRuntimeBeRemoved`, with `evictNonDeletedPods`), whatever the API
/// server still lists and however young the pod. So does the agent for a pod it evicted,
/// once the pod's sandbox has stopped: its dead containers (their writable layers) and
/// its sandbox go. Evicted before its sandbox was made (an earlier run of the pod, as
/// after a delete that never went through), the pod, listed and seconds old, keeps its
/// newest dead container and its sandbox, as a living pod does; before, so did a pod
/// just evicted, and the next pod was evicted for disk the first still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_the_agent_evicted_loses_its_runtime_once_stopped_however_young() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = require!("containerd", Containerd::start(dir.path()));
    let app = "nodekeeper.test/app:1";
    runtime.import_image(SANDBOX_IMAGE, &["/bin/sleep", "1000000"]);
    runtime.import_image(app, &["/bin/true"]);
    let mut client = runtime.client().await;
    let pod = ("evicted", "evicted-uid");
    // An eviction before the sandbox was made is one of an earlier run of the pod.
    let before_the_sandbox = nodekeeper::cri::unix_nanos_now();
    let sandbox = runtime.run_sandbox(&mut client, pod.0, pod.1).await;
    let first = runtime
        .run_to_exit(&mut client, &sandbox, pod, "app", 0, app)
        .await;
    let second = runtime
        .run_to_exit(&mut client, &sandbox, pod, "app", 1, app)
        .await;
    // Evicted: the kubelet stopped its containers and its sandbox.
    let evicted_at = nodekeeper::cri::unix_nanos_now();
    runtime.stop_sandbox(&mut client, &sandbox).await;
    let config = NodeReclaimConfig {
        method: ReclaimMethod::Cri,
        runtime_endpoint: runtime.endpoint(),
        image_endpoint: runtime.endpoint(),
        timeout: GoDuration::from_secs(60),
        ..NodeReclaimConfig::default()
    };
    // The default two minutes before a pod counts as gone: this one is seconds old.
    let mut reclaimer = CriReclaimer::new(&config, FilesystemLayout::SingleDisk, false)
        .expect("the endpoint is a socket path");
    let listed = BTreeSet::from([pod.1.to_string()]);
    let containers = |list: Vec<nodekeeper::cri::wire::Container>| {
        sorted(list.into_iter().map(|c| c.id).collect())
    };
    let sandboxes = |list: Vec<nodekeeper::cri::wire::PodSandbox>| {
        sorted(list.into_iter().map(|s| s.id).collect())
    };

    let evicted = |at: i64| BTreeMap::from([(pod.1.to_string(), at)]);
    reclaimer.set_pods(PodsKnown::active(listed.clone()).with_evicted(evicted(before_the_sandbox)));
    reclaimer
        .reclaim(Signal::NodeFsAvailable)
        .await
        .expect("reclaim");
    assert_eq!(
        reclaimer.last_removed().containers,
        [first],
        "evicted before this run of the pod: the newest dead container stays"
    );
    assert_eq!(
        containers(containerd::list_containers(&mut client).await),
        std::slice::from_ref(&second)
    );
    assert_eq!(
        sandboxes(containerd::list_sandboxes(&mut client).await),
        std::slice::from_ref(&sandbox)
    );

    reclaimer.set_pods(PodsKnown::active(listed).with_evicted(evicted(evicted_at)));
    reclaimer
        .reclaim(Signal::NodeFsAvailable)
        .await
        .expect("reclaim");
    assert_eq!(reclaimer.last_removed().containers, [second]);
    assert_eq!(reclaimer.last_removed().sandboxes, [sandbox]);
    assert!(containerd::list_containers(&mut client).await.is_empty());
    assert!(containerd::list_sandboxes(&mut client).await.is_empty());
    drop(client);
    drop(runtime);
}
