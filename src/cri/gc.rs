//! What node-level reclaim removes, decided as the kubelet's garbage collectors decide
//! when the eviction manager calls them (`DeleteAllUnusedContainers`, which is
//! `containerGC.GarbageCollect` with `evictNonDeletedPods`, and `DeleteUnusedImages`).
//! Pure functions over what the runtime listed; `super::reclaimer` does the I/O.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// The kubelet's `--maximum-dead-containers-per-container` default: one dead container
/// per (pod, container name) is kept while its pod lives, for `kubectl logs --previous`
/// and the restart count.
pub const DEAD_CONTAINERS_KEPT_PER_CONTAINER: usize = 1;

/// One image as the runtime lists it (`ListImages`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeImage {
    pub id: String,
    pub tags: Vec<String>,
    /// Its repository digests (`name@sha256:…`).
    pub digests: Vec<String>,
    pub size: u64,
    /// The runtime asks that it never be removed (CRI `pinned`; the sandbox image, for
    /// runtimes that pin it).
    pub pinned: bool,
}

/// Container states as the CRI names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

/// One container as the runtime lists it (`ListContainers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeContainer {
    pub id: String,
    pub sandbox_id: String,
    /// The kubelet's container name (CRI metadata name).
    pub name: String,
    /// The pod's UID: the kubelet's `io.kubernetes.pod.uid` label, else the sandbox's.
    pub pod_uid: String,
    pub state: ContainerState,
    /// Nanoseconds since the epoch, as the runtime reports it.
    pub created_at: i64,
    /// The image references the container runs (CRI `image_ref` and `image_id`): an
    /// image named by any of them is in use.
    pub image_refs: Vec<String>,
}

/// One pod sandbox as the runtime lists it (`ListPodSandbox`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeSandbox {
    pub id: String,
    pub pod_uid: String,
    pub ready: bool,
    pub created_at: i64,
}

/// What the agent knows of the node's pods when it collects containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodsKnown {
    /// No list of the node's pods (standalone mode, or the pod list has not synced
    /// yet): every pod counts as still there, so only what the kubelet removes for a
    /// living pod is removed.
    Unknown,
    /// The UIDs of the pods the node still runs (`running`: the API's active pods,
    /// synced), and of those this agent evicted lately, with when (`evicted`: nanoseconds
    /// since the epoch, the runtime's scale).
    ///
    /// The kubelet removes the runtime of a pod it evicted in the reclaim before its next
    /// eviction, whatever the API still lists and however young the pod (the pod is
    /// evicted, `ShouldPodContentBeRemoved`, and terminated by the time `killPodNow`
    /// returns, `ShouldPodRuntimeBeRemoved` with `evictNonDeletedPods`). So may the agent,
    /// for a pod it evicted, once none of its sandboxes is ready, and only while its
    /// newest sandbox was made before the eviction: unlike the kubelet's, the agent's
    /// eviction does not stop the kubelet from starting the pod again (its delete held
    /// up by an outage, or refused), and a pod started again is a living pod. Otherwise a
    /// pod it evicted for disk would keep its newest dead containers (their writable
    /// layers) until its deletion reached the list and two minutes passed, and the next
    /// pod would go for disk the first still held.
    Active {
        running: BTreeSet<String>,
        evicted: BTreeMap<String, i64>,
    },
}

/// How long a pod's newest sandbox must exist before the pod can count as gone: the
/// agent's pod list may lag the kubelet's, and a pod whose sandbox is being set up is not
/// ready yet.
pub const GONE_POD_MINIMUM_AGE: Duration = Duration::from_secs(120);

impl PodsKnown {
    /// The pods the node runs, none evicted lately.
    pub fn active(running: BTreeSet<String>) -> PodsKnown {
        PodsKnown::Active {
            running,
            evicted: BTreeMap::new(),
        }
    }

    /// The same, with the UIDs of the pods this agent evicted lately and when (nothing
    /// without a list of the pods).
    pub fn with_evicted(self, evicted: BTreeMap<String, i64>) -> PodsKnown {
        match self {
            PodsKnown::Unknown => PodsKnown::Unknown,
            PodsKnown::Active { running, .. } => PodsKnown::Active { running, evicted },
        }
    }

    /// Every pod with a sandbox created less than `minimum_age` ([`GONE_POD_MINIMUM_AGE`])
    /// before `now_nanos` (the runtime's clock: nanoseconds since the epoch) counts as
    /// living.
    pub fn with_recent_pods(
        self,
        sandboxes: &[RuntimeSandbox],
        now_nanos: i64,
        minimum_age: Duration,
    ) -> PodsKnown {
        match self {
            PodsKnown::Unknown => PodsKnown::Unknown,
            PodsKnown::Active {
                mut running,
                evicted,
            } => {
                let margin = i64::try_from(minimum_age.as_nanos()).unwrap_or(i64::MAX);
                running.extend(
                    sandboxes
                        .iter()
                        .filter(|s| s.created_at > now_nanos.saturating_sub(margin))
                        .map(|s| s.pod_uid.clone()),
                );
                PodsKnown::Active { running, evicted }
            }
        }
    }

    /// The kubelet's `ShouldPodRuntimeBeRemoved` for a pod the agent cannot see inside
    /// the kubelet: the pod is gone or has ended (not among the active pods), or this
    /// agent evicted it after its newest sandbox was made, *and* none of its sandboxes
    /// is ready. The second half is stricter than the kubelet, which knows its pods
    /// first-hand; a pod whose sandbox is being recreated, or that the agent's watch has
    /// not shown yet, keeps its containers.
    fn runtime_removable(&self, pod_uid: &str, sandboxes: &PodSandboxes) -> bool {
        match self {
            PodsKnown::Unknown => false,
            PodsKnown::Active { running, evicted } => {
                let evicted_since_made = evicted.get(pod_uid).is_some_and(|evicted_at| {
                    sandboxes
                        .newest
                        .get(pod_uid)
                        .is_none_or(|made| made < evicted_at)
                });
                !sandboxes.ready.contains(pod_uid)
                    && (evicted_since_made || !running.contains(pod_uid))
            }
        }
    }
}

/// Newest first, as the kubelet's `byCreated` sorts; ties by ID for a stable order.
fn newest_first<T>(items: &mut [&T], key: impl Fn(&T) -> (i64, &str)) {
    items.sort_by(|a, b| {
        let ((a_created, a_id), (b_created, b_id)) = (key(a), key(b));
        b_created.cmp(&a_created).then_with(|| a_id.cmp(b_id))
    });
}

/// What the sandboxes say of the pods: which have one ready, and when each one's newest
/// was made.
struct PodSandboxes<'a> {
    ready: BTreeSet<&'a str>,
    newest: BTreeMap<&'a str, i64>,
}

fn pod_sandboxes(sandboxes: &[RuntimeSandbox]) -> PodSandboxes<'_> {
    let mut pods = PodSandboxes {
        ready: BTreeSet::new(),
        newest: BTreeMap::new(),
    };
    for sandbox in sandboxes {
        let uid = sandbox.pod_uid.as_str();
        if sandbox.ready {
            pods.ready.insert(uid);
        }
        let newest = pods.newest.entry(uid).or_insert(sandbox.created_at);
        *newest = (*newest).max(sandbox.created_at);
    }
    pods
}

/// The containers the kubelet's container GC removes when the eviction manager asks
/// (`evictContainers` with `evictNonDeletedPods`, the default policy: no minimum age,
/// one dead container kept per container of a living pod, no node-wide cap). A running
/// container is never removed, and neither is one in an unknown state, which may still
/// run (the kubelet kills it first; the agent leaves it to the kubelet). A pod whose
/// runtime may go loses all the others; a living pod keeps its newest dead container of
/// each name.
pub fn containers_to_remove<'a>(
    containers: &'a [RuntimeContainer],
    sandboxes: &[RuntimeSandbox],
    pods: &PodsKnown,
) -> Vec<&'a RuntimeContainer> {
    let pod_sandboxes = pod_sandboxes(sandboxes);
    // The kubelet's evict units: (pod UID, container name).
    let mut units: BTreeMap<(&str, &str), Vec<&RuntimeContainer>> = BTreeMap::new();
    for container in containers {
        if matches!(
            container.state,
            ContainerState::Created | ContainerState::Exited
        ) {
            units
                .entry((container.pod_uid.as_str(), container.name.as_str()))
                .or_default()
                .push(container);
        }
    }
    let mut removed = Vec::new();
    for ((pod_uid, _), mut unit) in units {
        newest_first(&mut unit, |c| (c.created_at, c.id.as_str()));
        let keep = if pods.runtime_removable(pod_uid, &pod_sandboxes) {
            0
        } else {
            DEAD_CONTAINERS_KEPT_PER_CONTAINER
        };
        removed.extend(unit.into_iter().skip(keep));
    }
    removed
}

/// The sandboxes the kubelet's `evictSandboxes` removes once the containers are gone:
/// a sandbox is active while it is ready or still holds a container, and is never
/// removed then. A pod whose runtime may go loses every inactive sandbox; a living pod
/// keeps its newest sandbox, whatever its state.
pub fn sandboxes_to_remove<'a>(
    containers: &[RuntimeContainer],
    sandboxes: &'a [RuntimeSandbox],
    pods: &PodsKnown,
) -> Vec<&'a RuntimeSandbox> {
    let pod_sandboxes = pod_sandboxes(sandboxes);
    let holding: BTreeSet<&str> = containers.iter().map(|c| c.sandbox_id.as_str()).collect();
    let mut by_pod: BTreeMap<&str, Vec<&RuntimeSandbox>> = BTreeMap::new();
    for sandbox in sandboxes {
        by_pod
            .entry(sandbox.pod_uid.as_str())
            .or_default()
            .push(sandbox);
    }
    let mut removed = Vec::new();
    for (pod_uid, mut group) in by_pod {
        newest_first(&mut group, |s| (s.created_at, s.id.as_str()));
        let keep = if pods.runtime_removable(pod_uid, &pod_sandboxes) {
            0
        } else {
            1
        };
        removed.extend(
            group
                .into_iter()
                .skip(keep)
                .filter(|s| !s.ready && !holding.contains(s.id.as_str())),
        );
    }
    removed
}

/// What the kubelet's image manager remembers of each image (`imageRecord`): when it
/// first saw it and when it last saw a container use it, on the monotonic clock. The
/// agent starts with none, as a restarted kubelet does.
#[derive(Debug, Clone, Default)]
pub struct ImageRecords {
    records: HashMap<String, ImageRecord>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ImageRecord {
    first_detected: Instant,
    last_used: Option<Instant>,
}

impl ImageRecords {
    /// The kubelet's `detectImages`: a new image is detected now, an image a container
    /// uses was used now, and an image the runtime no longer lists is forgotten.
    pub fn detect(
        &mut self,
        images: &[RuntimeImage],
        containers: &[RuntimeContainer],
        now: Instant,
    ) {
        let in_use = images_in_use(containers);
        let listed: BTreeSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.records.retain(|id, _| listed.contains(id.as_str()));
        for image in images {
            let record = self.records.entry(image.id.clone()).or_insert(ImageRecord {
                first_detected: now,
                last_used: None,
            });
            if is_used(image, &in_use) {
                record.last_used = Some(now);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Forget an image removed.
    pub fn forget(&mut self, id: &str) {
        self.records.remove(id);
    }
}

fn images_in_use(containers: &[RuntimeContainer]) -> BTreeSet<&str> {
    containers
        .iter()
        .flat_map(|c| c.image_refs.iter())
        .filter(|r| !r.is_empty())
        .map(String::as_str)
        .collect()
}

/// Whether a container names `image`: by its ID, or (as runtimes before CRI 1.36 may
/// give `image_ref`) by a digest or a tag.
fn is_used(image: &RuntimeImage, in_use: &BTreeSet<&str>) -> bool {
    std::iter::once(&image.id)
        .chain(&image.tags)
        .chain(&image.digests)
        .any(|name| in_use.contains(name.as_str()))
}

/// The images the kubelet's `DeleteUnusedImages` removes, in its order (least recently
/// used first, then first detected): every image no container uses (a container in any
/// state keeps its image), not pinned, and first detected at least `minimum_age`
/// (`imageMinimumGCAge`) ago, since an image pulled a moment ago may be about to run.
/// Call [`ImageRecords::detect`] with the same lists first, as the kubelet does.
///
/// `protected` are names the runtime needs and may not pin (containerd 1.6 does not pin
/// its sandbox image, which every new pod starts from): an image tagged with one of them
/// is kept. The kubelet before 1.29 kept the sandbox image the same way.
pub fn images_to_remove<'a>(
    images: &'a [RuntimeImage],
    containers: &[RuntimeContainer],
    records: &ImageRecords,
    protected: &BTreeSet<String>,
    minimum_age: Duration,
    now: Instant,
) -> Vec<&'a RuntimeImage> {
    // A container that names no image could be using any: then none is removed.
    if containers.iter().any(|c| c.image_refs.is_empty()) {
        return Vec::new();
    }
    let in_use = images_in_use(containers);
    let mut candidates: Vec<(&RuntimeImage, ImageRecord)> = images
        .iter()
        .filter(|image| !is_used(image, &in_use) && !image.pinned)
        .filter(|image| {
            !protected.contains(&image.id) && !image.tags.iter().any(|t| protected.contains(t))
        })
        .filter_map(|image| {
            let record = records.records.get(&image.id)?;
            (now.saturating_duration_since(record.first_detected) >= minimum_age)
                .then_some((image, *record))
        })
        .collect();
    candidates.sort_by(|(a, ra), (b, rb)| {
        ra.last_used
            .cmp(&rb.last_used)
            .then(ra.first_detected.cmp(&rb.first_detected))
            .then_with(|| a.id.cmp(&b.id))
    });
    candidates.into_iter().map(|(image, _)| image).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(
        id: &str,
        pod: &str,
        name: &str,
        state: ContainerState,
        created: i64,
    ) -> RuntimeContainer {
        RuntimeContainer {
            id: id.to_string(),
            sandbox_id: format!("sandbox-{pod}"),
            name: name.to_string(),
            pod_uid: pod.to_string(),
            state,
            created_at: created,
            image_refs: vec![format!("sha256:{name}")],
        }
    }

    fn sandbox(id: &str, pod: &str, ready: bool, created: i64) -> RuntimeSandbox {
        RuntimeSandbox {
            id: id.to_string(),
            pod_uid: pod.to_string(),
            ready,
            created_at: created,
        }
    }

    fn ids<T>(items: &[&T], id: impl Fn(&T) -> &str) -> Vec<String> {
        items.iter().map(|item| id(item).to_string()).collect()
    }

    fn active(uids: &[&str]) -> PodsKnown {
        PodsKnown::active(uids.iter().map(|u| u.to_string()).collect())
    }

    use ContainerState::*;

    // kuberuntime_gc.go `evictableContainers`: running containers are never evictable.
    // `evictContainers` with MaxPerPodContainer 1: a living pod keeps its newest dead
    // container per container name (`enforceMaxContainersPerEvictUnit`, `removeOldestN`).
    #[test]
    fn a_living_pod_keeps_its_newest_dead_container_of_each_name() {
        let containers = [
            container("app-0", "a", "app", Exited, 100),
            container("app-1", "a", "app", Exited, 200),
            container("app-2", "a", "app", Running, 300),
            container("init-0", "a", "init", Exited, 50),
            container("side-0", "a", "side", Unknown, 10),
            container("side-1", "a", "side", Created, 20),
        ];
        let sandboxes = [sandbox("sandbox-a", "a", true, 1)];
        for pods in [PodsKnown::Unknown, active(&["a"])] {
            let removed = containers_to_remove(&containers, &sandboxes, &pods);
            // side-0 is in an unknown state and may run; side-1 is the newest dead one.
            assert_eq!(ids(&removed, |c| &c.id), ["app-0"], "{pods:?}");
        }
    }

    // `evictContainers`: with evictNonDeletedPods, every evictable container of a pod
    // whose runtime should be removed goes (`removeOldestN(unit, len(unit))`).
    #[test]
    fn a_pod_gone_from_the_node_loses_every_dead_container() {
        let containers = [
            container("b-app-0", "b", "app", Exited, 100),
            container("b-app-1", "b", "app", Exited, 200),
            container("a-app-0", "a", "app", Exited, 100),
        ];
        let sandboxes = [
            sandbox("sandbox-b", "b", false, 1),
            sandbox("sandbox-a", "a", true, 1),
        ];
        let removed = containers_to_remove(&containers, &sandboxes, &active(&["a"]));
        assert_eq!(ids(&removed, |c| &c.id), ["b-app-1", "b-app-0"]);
    }

    /// A pod this agent evicted loses its runtime as soon as its sandbox has stopped, as
    /// the kubelet's does once it has terminated the pod: though the API still lists it
    /// (the delete not through yet, or the pod still terminating) and its sandbox is a
    /// minute old. While a sandbox of it is ready (the kubelet started it again), it
    /// keeps what a living pod keeps; without a pod list nothing changes.
    #[test]
    fn a_pod_this_agent_evicted_loses_its_runtime_once_stopped_however_young_and_listed() {
        let minute = 60_000_000_000_i64;
        let now = 100 * minute;
        let containers = [
            container("e-app-0", "e", "app", Exited, 100),
            container("e-app-1", "e", "app", Exited, 200),
            container("a-app-0", "a", "app", Exited, 100),
            container("a-app-1", "a", "app", Exited, 200),
        ];
        let stopped = [sandbox("sandbox-e", "e", false, now - minute)];
        // Evicted 10 s ago, its sandbox made a minute ago.
        let evicted = BTreeMap::from([("e".to_string(), now - minute / 6)]);
        let pods = active(&["a", "e"])
            .with_evicted(evicted.clone())
            .with_recent_pods(&stopped, now, GONE_POD_MINIMUM_AGE);
        let removed = containers_to_remove(&containers, &stopped, &pods);
        assert_eq!(ids(&removed, |c| &c.id), ["a-app-0", "e-app-1", "e-app-0"]);
        assert_eq!(
            ids(&sandboxes_to_remove(&[], &stopped, &pods), |s| &s.id),
            ["sandbox-e"]
        );
        // Not evicted: the young, listed pod keeps its newest dead container and its
        // sandbox.
        let listed = active(&["a", "e"]).with_recent_pods(&stopped, now, GONE_POD_MINIMUM_AGE);
        let removed = containers_to_remove(&containers, &stopped, &listed);
        assert_eq!(ids(&removed, |c| &c.id), ["a-app-0", "e-app-0"]);
        assert!(sandboxes_to_remove(&[], &stopped, &listed).is_empty());
        // Started again: a ready sandbox; or a new one made since the eviction, not
        // ready yet (its network being set up), the old one stopped.
        let ready = [sandbox("sandbox-e", "e", true, now - minute)];
        let removed = containers_to_remove(&containers, &ready, &pods);
        assert_eq!(ids(&removed, |c| &c.id), ["a-app-0", "e-app-0"]);
        let remade = [
            sandbox("sandbox-e", "e", false, now - minute),
            sandbox("sandbox-e2", "e", false, now - minute / 12),
        ];
        let pods = active(&["a", "e"])
            .with_evicted(evicted.clone())
            .with_recent_pods(&remade, now, GONE_POD_MINIMUM_AGE);
        let removed = containers_to_remove(&containers, &remade, &pods);
        assert_eq!(ids(&removed, |c| &c.id), ["a-app-0", "e-app-0"]);
        assert_eq!(
            ids(&sandboxes_to_remove(&[], &remade, &pods), |s| &s.id),
            ["sandbox-e"],
            "the newest sandbox stays, as a living pod's does"
        );
        let unknown = PodsKnown::Unknown.with_evicted(evicted);
        assert_eq!(unknown, PodsKnown::Unknown);
    }

    #[test]
    fn without_a_synced_pod_list_or_with_a_ready_sandbox_a_pod_counts_as_living() {
        let containers = [
            container("b-app-0", "b", "app", Exited, 100),
            container("b-app-1", "b", "app", Exited, 200),
        ];
        let not_ready = [sandbox("sandbox-b", "b", false, 1)];
        let removed = containers_to_remove(&containers, &not_ready, &PodsKnown::Unknown);
        assert_eq!(ids(&removed, |c| &c.id), ["b-app-0"]);
        // Not among the active pods (the watch may lag), but its sandbox is ready.
        let ready = [sandbox("sandbox-b", "b", true, 1)];
        let removed = containers_to_remove(&containers, &ready, &active(&[]));
        assert_eq!(ids(&removed, |c| &c.id), ["b-app-0"]);
    }

    // `evictSandboxes`: a sandbox is active while ready or holding a container; a living
    // pod keeps its newest sandbox (`removeOldestNSandboxes(len-1)`), a removed one none.
    #[test]
    fn sandboxes_go_when_inactive_and_not_a_living_pods_newest() {
        let sandboxes = [
            sandbox("a-old", "a", false, 1),
            sandbox("a-held", "a", false, 2),
            sandbox("a-new", "a", false, 3),
            sandbox("b-1", "b", false, 1),
            sandbox("b-2", "b", false, 2),
            sandbox("c-1", "c", true, 1),
        ];
        let mut held = container("x", "a", "app", Exited, 1);
        held.sandbox_id = "a-held".to_string();
        let removed = sandboxes_to_remove(&[held], &sandboxes, &active(&["a", "c"]));
        assert_eq!(ids(&removed, |s| &s.id), ["a-old", "b-2", "b-1"]);
        let removed = sandboxes_to_remove(&[], &sandboxes, &PodsKnown::Unknown);
        assert_eq!(ids(&removed, |s| &s.id), ["a-held", "a-old", "b-1"]);
    }

    fn image(id: &str, tags: &[&str], pinned: bool) -> RuntimeImage {
        RuntimeImage {
            id: id.to_string(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            digests: Vec::new(),
            size: 1000,
            pinned,
        }
    }

    // image_gc_manager.go `imagesInEvictionOrder` and `freeSpace`: images used by any
    // container (not only running ones) and pinned images are skipped, images first
    // detected less than MinAge ago are skipped, the rest are removed least recently
    // used first, then first detected first.
    #[test]
    fn unused_unpinned_images_older_than_the_minimum_age_are_removed() {
        let start = Instant::now();
        let minute = Duration::from_secs(60);
        let images = [
            image("sha256:app", &["example/app:1"], false),
            image("sha256:old", &["example/old:1"], false),
            image("sha256:older", &[], false),
            image("sha256:pinned", &["example/pinned:1"], true),
            image("sha256:pause", &["registry.k8s.io/pause:3.9"], false),
            image("sha256:fresh", &["example/fresh:1"], false),
        ];
        let mut app = container("c", "a", "app", Exited, 1);
        app.image_refs = vec!["sha256:app".to_string()];
        let mut old_user = container("d", "a", "old", Running, 1);
        old_user.image_refs = vec!["sha256:old".to_string()];
        let mut records = ImageRecords::default();
        // First seen at start; "old" was in use then, "older" never.
        records.detect(&images[..5], &[app.clone(), old_user], start);
        let now = start + 3 * minute;
        records.detect(&images, std::slice::from_ref(&app), now);
        let protected = BTreeSet::from(["registry.k8s.io/pause:3.9".to_string()]);
        let removed = images_to_remove(
            &images,
            std::slice::from_ref(&app),
            &records,
            &protected,
            2 * minute,
            now,
        );
        assert_eq!(ids(&removed, |i| &i.id), ["sha256:older", "sha256:old"]);
        // With no minimum age the fresh image goes too, last (detected last).
        let removed = images_to_remove(
            &images,
            std::slice::from_ref(&app),
            &records,
            &protected,
            Duration::ZERO,
            now,
        );
        assert_eq!(
            ids(&removed, |i| &i.id),
            ["sha256:older", "sha256:fresh", "sha256:old"]
        );
    }

    #[test]
    fn an_image_named_by_tag_or_digest_is_in_use_and_a_container_naming_none_stops_the_gc() {
        let now = Instant::now();
        let mut tagged = image("sha256:a", &["example/a:1"], false);
        tagged.digests = vec!["example/a@sha256:d".to_string()];
        let images = [tagged, image("sha256:b", &[], false)];
        let mut records = ImageRecords::default();
        records.detect(&images, &[], now);
        let remove = |containers: &[RuntimeContainer]| {
            let removed = images_to_remove(
                &images,
                containers,
                &records,
                &BTreeSet::new(),
                Duration::ZERO,
                now,
            );
            ids(&removed, |i| &i.id)
        };
        let mut by_tag = container("c", "p", "app", Exited, 1);
        by_tag.image_refs = vec!["example/a:1".to_string()];
        assert_eq!(remove(std::slice::from_ref(&by_tag)), ["sha256:b"]);
        by_tag.image_refs = vec!["example/a@sha256:d".to_string()];
        assert_eq!(remove(std::slice::from_ref(&by_tag)), ["sha256:b"]);
        by_tag.image_refs = Vec::new();
        assert!(remove(std::slice::from_ref(&by_tag)).is_empty());
    }

    #[test]
    fn a_pod_with_a_recent_sandbox_counts_as_living() {
        let minute = 60_000_000_000_i64;
        let now = 100 * minute;
        let sandboxes = [
            sandbox("old", "gone", false, now - 3 * minute),
            sandbox("new", "starting", false, now - minute),
        ];
        let pods = active(&["a"]).with_recent_pods(&sandboxes, now, GONE_POD_MINIMUM_AGE);
        assert_eq!(pods, active(&["a", "starting"]));
        let unknown = PodsKnown::Unknown.with_recent_pods(&sandboxes, now, GONE_POD_MINIMUM_AGE);
        assert_eq!(unknown, PodsKnown::Unknown);
    }

    #[test]
    fn an_image_never_detected_is_not_removed_and_a_vanished_one_is_forgotten() {
        let now = Instant::now();
        let images = [image("sha256:a", &[], false)];
        let mut records = ImageRecords::default();
        assert!(
            images_to_remove(
                &images,
                &[],
                &records,
                &BTreeSet::new(),
                Duration::ZERO,
                now
            )
            .is_empty()
        );
        records.detect(&images, &[], now);
        assert_eq!(records.len(), 1);
        records.detect(&[], &[], now);
        assert!(records.is_empty());
    }
}
