//! Pods bound to this node, from a kube-runtime reflector (`fieldSelector=
//! spec.nodeName=<node>`): the watcher lists, then watches from the list's
//! resourceVersion, resumes after a dropped watch, and relists on 410 Gone. The agent
//! reads the cache each cycle, so an unreachable API server leaves it with the last
//! known pods instead of none. When the API server answers again after it did not, the
//! watch starts afresh: a watch whose connection a partition left silent gets no error,
//! and would otherwise leave the cache stale until kube's idle timeout, five minutes on.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod as ApiPod;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::task::JoinHandle;

use super::convert::{
    CONFIG_HASH_ANNOTATION, CONFIG_MIRROR_ANNOTATION, NodePod, convert_pod, is_active,
};
use super::usage::{PodCgroupsListed, PodPlaces, PodUsageReader};
use crate::pods::Pod;
use crate::ports::PodSource;

/// Aborts the background tasks when the last owner goes away.
pub struct TaskGuard(pub Vec<JoinHandle<()>>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Start watching this node's pods; the store fills as the first list arrives.
pub fn start_pod_reflector(
    client: kube::Client,
    node_name: &str,
    reachability: crate::report::ApiReachability,
) -> (Store<ApiPod>, JoinHandle<()>) {
    let api: Api<ApiPod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let (reader, writer) = reflector::store();
    let pods = renewed_on_return(
        reachability.subscribe(),
        move || {
            watcher(api.clone(), config.clone())
                .default_backoff()
                .boxed()
        },
        from_the_server,
    );
    let stream = reflector::reflector(writer, pods);
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        let mut failing = false;
        while let Some(event) = stream.next().await {
            let answered = watch_answered(&event);
            if let Some(answered) = answered {
                reachability.saw(answered);
            }
            match event {
                Err(error) if !failing => {
                    failing = true;
                    tracing::warn!(%error, "pod watch failed; keeping the last known pods and retrying");
                }
                Err(error) => tracing::debug!(%error, "pod watch still failing"),
                // Recovered only on something from the API server.
                Ok(_) if failing && answered.is_some() => {
                    failing = false;
                    tracing::info!("pod watch recovered");
                }
                Ok(_) => {}
            }
        }
    });
    (reader, task)
}

/// How long a watcher that has not yet listed may go without anything from the API
/// server before it is started again: half again the server's own one-minute request
/// timeout, past kube's longest backoff between attempts (30 s). The list has no client
/// timeout, and one sent on a connection an outage left silent would never end.
const LIST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(90);

/// The stream `start` makes, made again
/// - when `changes` (a reachability subscription) sees the API server answer again after
///   it did not, if the stream delivered nothing from the server since it was lost: a
///   watch that recovered by itself (its own error was the loss) goes on, as kube resumes
///   it, without a relist;
/// - when it has not listed yet and nothing came from it for [`LIST_DEADLINE`].
///
/// `answered` tells an item the server sent from one the watcher made up itself (kube's
/// `Init`, before it lists). The new watcher lists before it watches; the reflector keeps
/// serving the old list until the new one is whole.
fn renewed_on_return<T, E, S>(
    changes: tokio::sync::watch::Receiver<bool>,
    start: impl Fn() -> S + Send + 'static,
    answered: fn(&T) -> bool,
) -> impl futures::Stream<Item = Result<T, E>> + Send
where
    S: futures::Stream<Item = Result<T, E>> + Unpin + Send + 'static,
    T: Send + 'static,
    E: Send + 'static,
{
    struct Renewed<S, F> {
        stream: S,
        changes: tokio::sync::watch::Receiver<bool>,
        start: F,
        /// Whether the stream delivered anything from the server since it was last lost.
        delivered: bool,
        /// Whether this stream has had anything from the server since it started.
        listed: bool,
        /// When the stream started or last yielded anything.
        active: tokio::time::Instant,
    }
    impl<S, F: Fn() -> S> Renewed<S, F> {
        fn restart(&mut self) {
            self.stream = (self.start)();
            self.delivered = true;
            self.listed = false;
            self.active = tokio::time::Instant::now();
        }
    }
    let first = Renewed {
        stream: start(),
        changes,
        start,
        delivered: true,
        listed: false,
        active: tokio::time::Instant::now(),
    };
    futures::stream::unfold(first, move |mut state| async move {
        loop {
            tokio::select! {
                // A loss is taken in before what the stream delivered after it.
                biased;
                changed = state.changes.changed() => {
                    if changed.is_err() {
                        // No reachability any more: only the stream matters.
                        let item = state.stream.next().await?;
                        return Some((item, state));
                    }
                    let reachable = *state.changes.borrow_and_update();
                    if !reachable {
                        state.delivered = false;
                    } else if !state.delivered {
                        tracing::info!("the API server answers again; watching the node's pods afresh");
                        state.restart();
                    }
                }
                item = state.stream.next() => {
                    let item = item?;
                    let from_server = item.as_ref().is_ok_and(answered);
                    state.delivered |= from_server;
                    state.listed |= from_server;
                    state.active = tokio::time::Instant::now();
                    return Some((item, state));
                }
                () = tokio::time::sleep_until(state.active + LIST_DEADLINE), if !state.listed => {
                    tracing::warn!(
                        "the node's pods got no answer within {LIST_DEADLINE:?}; listing them again"
                    );
                    state.restart();
                }
            }
        }
    })
}

/// The agent's pods: active pods from the cache, measured on the node.
pub struct ApiPodSource {
    store: Store<ApiPod>,
    usage: Option<PodUsageReader>,
    logged: BTreeSet<String>,
    /// Each listed pod as last converted, by UID, with the API object it came from.
    converted: HashMap<String, Converted>,
    /// Listings started so far (during `pods()`, the number of the one under way).
    listing: u64,
    /// How many distinct UIDs the listing under way has converted.
    listed_uids: usize,
    _tasks: Arc<TaskGuard>,
}

/// A pod's conversion, kept while the store holds the same object: the watch replaces a
/// pod's object with a new one for every change, so the same allocation is the same
/// pod. Converting parses every quantity of every container, which every cycle did for
/// every pod while pods change rarely (docs/performance.md, "Kubernetes mode").
struct Converted {
    /// Held, so that its allocation cannot be reused for another object meanwhile.
    from: Arc<ApiPod>,
    pod: NodePod,
    /// Where the pod's files are (with a pod usage reader): worked out with the
    /// conversion, not every cycle.
    places: Option<Arc<PodPlaces>>,
    /// The last listing that listed this UID.
    listed_in: u64,
}

impl ApiPodSource {
    pub fn new(store: Store<ApiPod>, usage: Option<PodUsageReader>, tasks: Arc<TaskGuard>) -> Self {
        ApiPodSource {
            store,
            usage,
            logged: BTreeSet::new(),
            converted: HashMap::new(),
            listing: 0,
            listed_uids: 0,
            _tasks: tasks,
        }
    }

    /// `api_pod` converted, with where its files are: the kept conversion while the
    /// store holds the same object, otherwise converted now (its warnings logged once)
    /// and kept. `None` for a pod that cannot be converted. A pod converted is counted
    /// as listed, once per UID.
    fn convert(&mut self, api_pod: &Arc<ApiPod>) -> Option<(NodePod, Option<Arc<PodPlaces>>)> {
        let uid = api_pod.metadata.uid.as_deref();
        let listing = self.listing;
        if let Some(kept) = uid.and_then(|uid| self.converted.get_mut(uid))
            && Arc::ptr_eq(&kept.from, api_pod)
        {
            if kept.listed_in != listing {
                kept.listed_in = listing;
                self.listed_uids += 1;
            }
            return Some((kept.pod.clone(), kept.places.clone()));
        }
        let mut node_pod = match convert_pod(api_pod) {
            Ok(node_pod) => node_pod,
            Err(error) => {
                self.log_once(error.to_string());
                return None;
            }
        };
        for warning in std::mem::take(&mut node_pod.warnings) {
            self.log_once(format!("pod {}: {warning}", node_pod.pod.key()));
        }
        let mut places = self
            .usage
            .as_ref()
            .and_then(|usage| usage.places(&node_pod));
        if let Some(uid) = uid {
            let earlier = self.converted.get(uid);
            // Most changes of a pod (its status) leave its files where they were: the
            // places handed to the disk walker stay the same allocation, which it finds
            // unchanged without comparing the paths.
            if let Some(earlier) = earlier
                && earlier.places == places
            {
                places = earlier.places.clone();
            }
            // Two objects with one UID (a corrupt API) are one pod here.
            if earlier.is_none_or(|earlier| earlier.listed_in != listing) {
                self.listed_uids += 1;
            }
            self.converted.insert(
                uid.to_string(),
                Converted {
                    from: api_pod.clone(),
                    pod: node_pod.clone(),
                    places: places.clone(),
                    listed_in: listing,
                },
            );
        }
        Some((node_pod, places))
    }

    fn log_once(&mut self, message: String) {
        if self.logged.len() > 1000 {
            self.logged.clear();
        }
        if self.logged.insert(message.clone()) {
            tracing::warn!("{message}");
        }
    }
}

impl PodSource for ApiPodSource {
    fn running_pod_uids(&self) -> Option<BTreeSet<String>> {
        // Whole once the first list is in; later the watch keeps it so, and after a lost
        // watch it holds the last known pods until the relist replaces them.
        if !matches!(
            futures::FutureExt::now_or_never(self.store.wait_until_ready()),
            Some(Ok(()))
        ) {
            return None;
        }
        let mut uids = BTreeSet::new();
        for pod in self.store.state() {
            if !is_active(&pod) {
                continue;
            }
            uids.extend(pod.metadata.uid.clone());
            // The runtime knows a static pod by the kubelet's own UID, its config hash,
            // which the mirror pod carries.
            if let Some(annotations) = &pod.metadata.annotations {
                for key in [CONFIG_MIRROR_ANNOTATION, CONFIG_HASH_ANNOTATION] {
                    uids.extend(annotations.get(key).filter(|v| !v.is_empty()).cloned());
                }
            }
        }
        Some(uids)
    }

    fn pods(&mut self) -> Vec<Pod> {
        let mut pods = Vec::new();
        let mut listed = PodCgroupsListed::default();
        self.listing += 1;
        self.listed_uids = 0;
        for api_pod in self.store.state() {
            if !is_active(&api_pod) {
                continue;
            }
            let Some((mut node_pod, places)) = self.convert(&api_pod) else {
                continue;
            };
            if let Some(usage) = &self.usage {
                usage.measure_placed(&mut node_pod, places.as_deref(), &mut listed);
            }
            pods.push(node_pod.pod);
        }
        // Every UID just listed is in `converted`, and whatever is kept of a pod elsewhere
        // was kept for a pod listed then: only a pod gone (or finished, or no longer
        // convertible) since leaves more there, and only then is anything to forget. Most
        // cycles list the same pods, and skip building the set and looking up each pod
        // in it.
        if self.converted.len() != self.listed_uids {
            let uids: HashSet<String> = pods.iter().filter_map(|pod| pod.uid.clone()).collect();
            if let Some(usage) = &self.usage {
                usage.retain_pods(&uids);
            }
            self.converted.retain(|uid, _| uids.contains(uid));
        }
        // A stable order for traces and logs. Comparing the fields, not `Pod::key()`,
        // allocates nothing: a key per comparison cost milliseconds at 10,000 pods.
        pods.sort_unstable_by(|a, b| {
            (a.namespace.as_str(), a.name.as_str()).cmp(&(b.namespace.as_str(), b.name.as_str()))
        });
        pods
    }

    fn measure_containers(&mut self, pod: &mut Pod) -> bool {
        // The containers' runtime ids are in the pod as converted, kept for the pods of
        // the last listing.
        let (Some(usage), Some(uid)) = (&self.usage, pod.uid.as_deref()) else {
            return false;
        };
        let Some(converted) = self.converted.get(uid) else {
            return false;
        };
        usage.measure_containers(&converted.pod, pod)
    }
}

/// Whether a watch event came from the API server: all but kube's `Init`, which the
/// watcher says itself before it asks for each list.
fn from_the_server<K>(event: &watcher::Event<K>) -> bool {
    !matches!(event, watcher::Event::Init)
}

/// Whether a pod watch event shows the API server answering: every event does but a
/// request that got no answer (as [`super::api::answered`] rules for writes). A `410
/// Gone` that makes the watcher list again, or a refusal, is an answer. `None` for
/// kube's `Init`, which the watcher says itself before each list it tries: it shows
/// nothing either way (counted as an answer, a watcher starting over against a silent
/// API server would mark it reached at every attempt).
fn watch_answered<K>(event: &Result<watcher::Event<K>, watcher::Error>) -> Option<bool> {
    Some(match event {
        Ok(event) if !from_the_server(event) => return None,
        Ok(_) => true,
        Err(
            watcher::Error::InitialListFailed(error)
            | watcher::Error::WatchStartFailed(error)
            | watcher::Error::WatchFailed(error),
        ) => super::api::answered(error),
        Err(watcher::Error::WatchError(_) | watcher::Error::NoResourceVersion) => true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;
    use std::path::Path;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(Status::failure("test", "Test").with_code(code)))
    }

    #[tokio::test]
    async fn the_watch_starts_afresh_when_the_api_server_answers_again_unless_it_recovered() {
        use std::sync::Mutex;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let reachability = crate::report::ApiReachability::new();
        let starts = Arc::new(AtomicUsize::new(0));
        let counted = starts.clone();
        // The first watch delivers what the test sends it; each later one its number
        // once, then goes silent.
        let (first_items, first) = futures::channel::mpsc::unbounded::<Result<usize, ()>>();
        let first = Mutex::new(Some(first));
        let stream = renewed_on_return(
            reachability.subscribe(),
            move || {
                let number = counted.fetch_add(1, Ordering::SeqCst) + 1;
                match first.lock().unwrap().take() {
                    Some(first) => first.boxed(),
                    None => futures::stream::iter([Ok(number)])
                        .chain(futures::stream::pending())
                        .boxed(),
                }
            },
            |_| true,
        );
        futures::pin_mut!(stream);
        let silent = |stream: &mut std::pin::Pin<&mut _>| {
            futures::FutureExt::now_or_never(StreamExt::next(stream)).is_none()
        };
        first_items.unbounded_send(Ok(1)).unwrap();
        assert_eq!(stream.next().await, Some(Ok(1)));
        // The watch's own error was the loss, and it recovered by itself: it goes on,
        // as kube resumes it, with no relist.
        first_items.unbounded_send(Err(())).unwrap();
        assert_eq!(stream.next().await, Some(Err(())));
        reachability.saw(false);
        first_items.unbounded_send(Ok(11)).unwrap();
        assert_eq!(stream.next().await, Some(Ok(11)));
        reachability.saw(true);
        assert!(silent(&mut stream));
        assert_eq!(starts.load(Ordering::SeqCst), 1);
        // Lost, and silent since (a partition): answering again starts a new watch.
        reachability.saw(false);
        assert!(silent(&mut stream));
        assert_eq!(starts.load(Ordering::SeqCst), 1, "not on the loss itself");
        reachability.saw(true);
        assert_eq!(stream.next().await, Some(Ok(2)));
        // And again after the next loss.
        reachability.saw(false);
        assert!(silent(&mut stream));
        reachability.saw(true);
        assert_eq!(stream.next().await, Some(Ok(3)));
        assert!(silent(&mut stream));
    }

    /// Watches made by `make` for their number (an item 0 stands for kube's `Init`, made
    /// up before the list); and how many were started.
    fn scripted_watches(
        make: fn(usize) -> futures::stream::BoxStream<'static, Result<usize, ()>>,
    ) -> (
        impl futures::Stream<Item = Result<usize, ()>>,
        Arc<std::sync::atomic::AtomicUsize>,
        crate::report::ApiReachability,
    ) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let reachability = crate::report::ApiReachability::new();
        let starts = Arc::new(AtomicUsize::new(0));
        let counted = starts.clone();
        let stream = renewed_on_return(
            reachability.subscribe(),
            move || make(counted.fetch_add(1, Ordering::SeqCst) + 1),
            |item| *item != 0,
        );
        (stream, starts, reachability)
    }

    /// `items`, then nothing, ever.
    fn then_silent(
        items: Vec<Result<usize, ()>>,
    ) -> futures::stream::BoxStream<'static, Result<usize, ()>> {
        futures::stream::iter(items)
            .chain(futures::stream::pending())
            .boxed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_that_never_gets_an_answer_is_asked_again() {
        use std::sync::atomic::Ordering;
        // Each watch makes up its Init, then its list hangs.
        let (stream, starts, reachability) = scripted_watches(|_| then_silent(vec![Ok(0)]));
        futures::pin_mut!(stream);
        assert_eq!(stream.next().await, Some(Ok(0)));
        let started = tokio::time::Instant::now();
        let second = tokio::time::timeout(2 * LIST_DEADLINE, stream.next()).await;
        assert_eq!(second, Ok(Some(Ok(0))), "a second watch");
        assert_eq!(started.elapsed(), LIST_DEADLINE);
        assert_eq!(starts.load(Ordering::SeqCst), 2);
        // The Init is no answer: a loss and a return start a third at once.
        reachability.saw(false);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), stream.next()).await;
        reachability.saw(true);
        assert_eq!(
            tokio::time::timeout(std::time::Duration::from_secs(1), stream.next()).await,
            Ok(Some(Ok(0)))
        );
        assert_eq!(starts.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_listed_or_keeps_failing_is_left_to_go_on() {
        use std::sync::atomic::Ordering;
        // Listed, then quiet for an hour: a watch with nothing to say.
        let (stream, starts, _reachability) = scripted_watches(|_| then_silent(vec![Ok(0), Ok(1)]));
        futures::pin_mut!(stream);
        assert_eq!(stream.next().await, Some(Ok(0)));
        assert_eq!(stream.next().await, Some(Ok(1)));
        let quiet = tokio::time::timeout(std::time::Duration::from_secs(3600), stream.next());
        assert!(quiet.await.is_err());
        assert_eq!(starts.load(Ordering::SeqCst), 1);
        // Failing: kube's backoff paces the errors, each a request that ended.
        let (stream, starts, _reachability) = scripted_watches(|_| {
            let errors = futures::stream::unfold((), |()| async {
                tokio::time::sleep(std::time::Duration::from_secs(30)).await;
                Some((Err(()), ()))
            });
            futures::stream::iter([Ok(0)]).chain(errors).boxed()
        });
        let items: Vec<_> = stream.take(10).collect().await;
        assert_eq!(items.len(), 10);
        assert_eq!(starts.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_watch_answered_by_the_api_server_counts_as_reaching_it_even_when_refused() {
        let answered: [Result<watcher::Event<()>, watcher::Error>; 5] = [
            Ok(watcher::Event::Apply(())),
            Ok(watcher::Event::InitDone),
            Err(watcher::Error::WatchError(Box::new(
                Status::failure("too old", "Expired").with_code(410),
            ))),
            Err(watcher::Error::InitialListFailed(api(403))),
            Err(watcher::Error::WatchFailed(api(500))),
        ];
        for event in &answered {
            assert_eq!(watch_answered(event), Some(true), "{event:?}");
        }
        let unanswered: [Result<watcher::Event<()>, watcher::Error>; 2] = [
            Err(watcher::Error::WatchStartFailed(api(503))),
            Err(watcher::Error::InitialListFailed(
                kube::Error::LinesCodecMaxLineLengthExceeded,
            )),
        ];
        for event in &unanswered {
            assert_eq!(watch_answered(event), Some(false), "{event:?}");
        }
        // The watcher's own word before a list says nothing of the API server.
        assert_eq!(watch_answered::<()>(&Ok(watcher::Event::Init)), None);
    }

    /// kube's watcher says `Init` before each list it tries: that comes from the watcher,
    /// not from the API server. An API server that refuses every connection must never
    /// count as reached, however often the watcher starts over (its backoff begins at
    /// 0.8 s).
    #[tokio::test]
    async fn a_watcher_starting_over_against_a_silent_api_server_never_counts_as_reaching_it() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let address = closed.local_addr().expect("its address");
        drop(closed);
        let config = kube::Config::new(format!("http://{address}").parse().expect("a URL"));
        let client = kube::Client::try_from(config).expect("a client");
        let reachability = crate::report::ApiReachability::new();
        let mut changes = reachability.subscribe();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorded = seen.clone();
        let recorder = tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                let reachable = *changes.borrow_and_update();
                recorded.lock().expect("changes").push(reachable);
            }
        });
        let (_store, task) = start_pod_reflector(client, "node-a", reachability.clone());
        tokio::time::sleep(std::time::Duration::from_secs(4)).await;
        task.abort();
        recorder.abort();
        // Reachable at first (the agent connected before it watches), then lost for good.
        let seen = seen.lock().expect("changes").clone();
        assert_eq!(seen, [false], "reachability changes while nothing answered");
    }

    /// A pod as the watch delivers it: `priority` and a memory request of `request`.
    fn api_pod(uid: &str, priority: i32, request: &str) -> ApiPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("pod-{uid}"), "namespace": "shop", "uid": uid},
            "spec": {
                "priority": priority,
                "containers": [{"name": "app", "resources": {"requests": {"memory": request}}}],
            },
            "status": {"phase": "Running"},
        }))
        .expect("a pod")
    }

    /// A pod's conversion is kept while the store holds the same object, and every change
    /// the watch delivers (a new object) is seen at the next listing: a priority changed,
    /// a request resized in place, a pod gone.
    #[test]
    fn a_pod_changed_in_the_api_is_seen_at_the_next_listing() {
        let (store, mut writer) = reflector::store::<ApiPod>();
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(api_pod("a", 0, "64Mi")));
        writer.apply_watcher_event(&watcher::Event::InitApply(api_pod("b", 0, "64Mi")));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let mut source = ApiPodSource::new(store, None, Arc::new(TaskGuard(Vec::new())));
        let seen = |source: &mut ApiPodSource| {
            source
                .pods()
                .into_iter()
                .map(|pod| {
                    (
                        pod.name.clone(),
                        pod.priority,
                        pod.requests.memory_quantity(),
                    )
                })
                .collect::<Vec<_>>()
        };
        let mib = |n: i64| Some(crate::quantity::Quantity::from_value(n << 20));
        let first = seen(&mut source);
        assert_eq!(
            first,
            [("pod-a".into(), 0, mib(64)), ("pod-b".into(), 0, mib(64))]
        );
        assert_eq!(seen(&mut source), first, "the same objects, the same pods");
        writer.apply_watcher_event(&watcher::Event::Apply(api_pod("a", 1000, "128Mi")));
        assert_eq!(
            seen(&mut source),
            [
                ("pod-a".into(), 1000, mib(128)),
                ("pod-b".into(), 0, mib(64))
            ]
        );
        writer.apply_watcher_event(&watcher::Event::Delete(api_pod("b", 0, "64Mi")));
        assert_eq!(seen(&mut source), [("pod-a".into(), 1000, mib(128))]);
        assert_eq!(source.converted.len(), 1, "a pod gone is forgotten");
    }

    /// What is kept of a pod is its conversion, never its measurement: the same object
    /// listed again is measured afresh, so a pod whose cgroup appeared since (it started)
    /// has its figures at once.
    #[test]
    fn a_pod_listed_again_unchanged_is_measured_afresh() {
        let cgroups = tempfile::tempdir().unwrap();
        let files = tempfile::tempdir().unwrap();
        let usage = usage_reader(cgroups.path(), files.path());
        let (store, mut writer) = reflector::store::<ApiPod>();
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(api_pod("a", 0, "64Mi")));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let mut source = ApiPodSource::new(store, Some(usage), Arc::new(TaskGuard(Vec::new())));
        let pods = source.pods();
        assert!(!pods[0].has_stats(), "no cgroup yet: {:?}", pods[0]);
        assert!(pods[0].containers.is_empty());
        write_pod_cgroup(cgroups.path(), "a", "900\n");
        let pods = source.pods();
        assert_eq!(pods[0].usage.memory, Some(800));
        assert_eq!(
            pods[0].containers.len(),
            1,
            "its containers are listed again"
        );
    }

    /// A pod usage reader over temporary trees: v2 cgroups, and the kubelet's files with
    /// writable layers at `layers/<container id>`.
    fn usage_reader(cgroups: &Path, files: &Path) -> PodUsageReader {
        use crate::config::{CgroupDriver, KubernetesConfig};
        use crate::kubernetes::cgroups::PodCgroupNaming;
        use crate::signals::CgroupReader;
        std::fs::write(cgroups.join("cgroup.controllers"), "memory pids\n").unwrap();
        PodUsageReader::new(
            CgroupReader::detect(cgroups).unwrap(),
            PodCgroupNaming::new(CgroupDriver::Cgroupfs, "/kubepods"),
            &KubernetesConfig {
                pod_logs_path: files.join("logs"),
                kubelet_root_path: files.join("kubelet"),
                writable_layer_path: Some(format!("{}/layers/{{containerId}}", files.display())),
                ..Default::default()
            },
        )
    }

    /// Pod `uid`'s v2 cgroup (cgroupfs driver, Burstable) in `cgroups`, with `current` in
    /// its `memory.current` and 100 inactive file bytes; its path.
    fn write_pod_cgroup(cgroups: &Path, uid: &str, current: &str) -> std::path::PathBuf {
        let cgroup = cgroups.join(format!("kubepods/burstable/pod{uid}"));
        std::fs::create_dir_all(&cgroup).unwrap();
        std::fs::write(cgroup.join("memory.current"), current).unwrap();
        std::fs::write(cgroup.join("memory.stat"), "inactive_file 100\n").unwrap();
        cgroup
    }

    /// `api_pod("a", …)` with its container running under the runtime id `id`.
    fn running_as(id: &str) -> ApiPod {
        let mut pod = api_pod("a", 0, "64Mi");
        pod.status = Some(
            serde_json::from_value(serde_json::json!({
                "phase": "Running",
                "containerStatuses": [{
                    "name": "app", "image": "app", "imageID": "", "ready": true,
                    "restartCount": 0, "containerID": format!("containerd://{id}"),
                    "state": {"running": {}},
                }],
            }))
            .expect("a pod status"),
        );
        pod
    }

    /// Where a pod's files are is kept with its conversion, not worked out every cycle,
    /// and follows the pod: a container started again under a new id has its new
    /// writable layer measured, not the old one's. A change that leaves them as they
    /// were keeps the very same places, which the disk walker tells unchanged by pointer.
    #[test]
    fn a_pods_files_are_looked_for_where_its_current_object_says() {
        let cgroups = tempfile::tempdir().unwrap();
        let files = tempfile::tempdir().unwrap();
        write_pod_cgroup(cgroups.path(), "a", "900\n");
        for (id, bytes) in [("one", 16 << 10), ("two", 256 << 10)] {
            let layer = files.path().join("layers").join(id);
            std::fs::create_dir_all(&layer).unwrap();
            std::fs::write(layer.join("data"), vec![b'z'; bytes]).unwrap();
        }
        let usage = usage_reader(cgroups.path(), files.path());
        let walker = usage.clone();
        let (store, mut writer) = reflector::store::<ApiPod>();
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(running_as("one")));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let mut source = ApiPodSource::new(store, Some(usage), Arc::new(TaskGuard(Vec::new())));
        // A listing registers the pod's directories with the walker, the walk measures
        // them, and the next listing has the figures.
        let layer_after_a_walk = |source: &mut ApiPodSource| {
            source.pods();
            walker.walk_disks_now();
            let pods = source.pods();
            pods[0].containers[0]
                .usage
                .rootfs
                .expect("the layer measured")
        };
        let places = |source: &ApiPodSource| {
            let kept = source.converted["a"].places.clone();
            kept.expect("places for a pod with a usable name")
        };
        let first = layer_after_a_walk(&mut source);
        assert!((16 << 10..256 << 10).contains(&first), "{first}");
        let first_places = places(&source);
        assert_eq!(layer_after_a_walk(&mut source), first, "the same object");
        assert!(Arc::ptr_eq(&places(&source), &first_places));
        // A new object (as for a status change) with the files where they were.
        writer.apply_watcher_event(&watcher::Event::Apply(running_as("one")));
        assert_eq!(layer_after_a_walk(&mut source), first);
        assert!(
            Arc::ptr_eq(&places(&source), &first_places),
            "the same places"
        );

        writer.apply_watcher_event(&watcher::Event::Apply(running_as("two")));
        let second = layer_after_a_walk(&mut source);
        assert!(second >= 256 << 10, "the new container's layer: {second}");
        assert!(!Arc::ptr_eq(&places(&source), &first_places));
    }

    /// What is kept of a pod that left is forgotten, also when another pod took its
    /// place in the same listing: a pod listed again later (a watch that lists afresh
    /// delivers the same UID) does not get figures read before it left.
    #[test]
    fn a_pod_gone_is_forgotten_even_when_another_came_meanwhile() {
        let cgroups = tempfile::tempdir().unwrap();
        let files = tempfile::tempdir().unwrap();
        for uid in ["a", "b", "c"] {
            write_pod_cgroup(cgroups.path(), uid, "900\n");
        }
        let usage = usage_reader(cgroups.path(), files.path());
        let (store, mut writer) = reflector::store::<ApiPod>();
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(api_pod("a", 0, "64Mi")));
        writer.apply_watcher_event(&watcher::Event::InitApply(api_pod("b", 0, "64Mi")));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let mut source = ApiPodSource::new(store, Some(usage), Arc::new(TaskGuard(Vec::new())));
        let memory = |source: &mut ApiPodSource| {
            source
                .pods()
                .into_iter()
                .map(|pod| (pod.name, pod.usage.memory))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            memory(&mut source),
            [("pod-a".into(), Some(800)), ("pod-b".into(), Some(800))]
        );
        // Pod a's figures would stand for two minutes if its file could not be read.
        writer.apply_watcher_event(&watcher::Event::Delete(api_pod("a", 0, "64Mi")));
        writer.apply_watcher_event(&watcher::Event::Apply(api_pod("c", 0, "64Mi")));
        assert_eq!(
            memory(&mut source),
            [("pod-b".into(), Some(800)), ("pod-c".into(), Some(800))]
        );
        write_pod_cgroup(cgroups.path(), "a", "garbage\n");
        writer.apply_watcher_event(&watcher::Event::Apply(api_pod("a", 0, "64Mi")));
        assert_eq!(
            memory(&mut source),
            [
                ("pod-a".into(), None),
                ("pod-b".into(), Some(800)),
                ("pod-c".into(), Some(800))
            ],
            "pod a's figures from before it left"
        );
    }

    /// A pod that finished, or whose object can no longer be converted, is forgotten
    /// like a pod deleted: listed again later, it does not get figures read before.
    #[test]
    fn a_pod_finished_or_unconvertible_is_forgotten() {
        let cgroups = tempfile::tempdir().unwrap();
        let files = tempfile::tempdir().unwrap();
        let current = write_pod_cgroup(cgroups.path(), "a", "900\n").join("memory.current");
        let usage = usage_reader(cgroups.path(), files.path());
        let (store, mut writer) = reflector::store::<ApiPod>();
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let mut source = ApiPodSource::new(store, Some(usage), Arc::new(TaskGuard(Vec::new())));
        let finished = || {
            let mut pod = api_pod("a", 0, "64Mi");
            pod.status = Some(
                serde_json::from_value(serde_json::json!({"phase": "Succeeded"}))
                    .expect("a status"),
            );
            pod
        };
        let unconvertible = || {
            let mut pod = api_pod("a", 0, "64Mi");
            pod.spec = None;
            pod
        };
        for (how, gone) in [("finished", finished()), ("unconvertible", unconvertible())] {
            std::fs::write(&current, "900\n").unwrap();
            writer.apply_watcher_event(&watcher::Event::Apply(api_pod("a", 0, "64Mi")));
            assert_eq!(source.pods()[0].usage.memory, Some(800), "{how}");
            writer.apply_watcher_event(&watcher::Event::Apply(gone));
            assert!(source.pods().is_empty(), "{how}");
            assert!(source.converted.is_empty(), "{how}");
            std::fs::write(&current, "garbage\n").unwrap();
            writer.apply_watcher_event(&watcher::Event::Apply(api_pod("a", 0, "64Mi")));
            assert_eq!(
                source.pods()[0].usage.memory,
                None,
                "{how}: figures from before"
            );
        }
    }

    /// Two objects with one UID (a corrupt API server) are one pod for what is kept:
    /// another pod gone is still forgotten.
    #[test]
    fn a_pod_gone_is_forgotten_beside_two_objects_with_one_uid() {
        let cgroups = tempfile::tempdir().unwrap();
        let files = tempfile::tempdir().unwrap();
        for uid in ["a", "r"] {
            write_pod_cgroup(cgroups.path(), uid, "900\n");
        }
        let usage = usage_reader(cgroups.path(), files.path());
        let twin = |name: &str| {
            let mut pod = api_pod("a", 0, "64Mi");
            pod.metadata.name = Some(name.to_string());
            pod
        };
        let (store, mut writer) = reflector::store::<ApiPod>();
        writer.apply_watcher_event(&watcher::Event::Init);
        for pod in [twin("one"), twin("two"), api_pod("r", 0, "64Mi")] {
            writer.apply_watcher_event(&watcher::Event::InitApply(pod));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let mut source = ApiPodSource::new(store, Some(usage), Arc::new(TaskGuard(Vec::new())));
        assert_eq!(source.pods().len(), 3);
        writer.apply_watcher_event(&watcher::Event::Delete(api_pod("r", 0, "64Mi")));
        assert_eq!(source.pods().len(), 2);
        assert!(
            !source.converted.contains_key("r"),
            "pod r is forgotten: {:?}",
            source.converted.keys().collect::<Vec<_>>()
        );
        // And its figures: back with an unreadable file, it has none.
        write_pod_cgroup(cgroups.path(), "r", "garbage\n");
        writer.apply_watcher_event(&watcher::Event::Apply(api_pod("r", 0, "64Mi")));
        let pods = source.pods();
        let r = pods.iter().find(|pod| pod.name == "pod-r").expect("pod r");
        assert_eq!(r.usage.memory, None);
    }

    /// A pod whose name cannot be part of a host path is said once for its object, not
    /// at every cycle (ten a second when notifications drive them).
    #[test]
    fn a_name_unusable_in_a_host_path_is_logged_once_per_object() {
        use std::io::Write;
        #[derive(Clone, Default)]
        struct Log(Arc<std::sync::Mutex<Vec<u8>>>);
        impl Write for Log {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().expect("log").extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let log = Log::default();
        let writer_log = log.clone();
        let _logging = tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_ansi(false)
                .with_writer(move || writer_log.clone())
                .finish(),
        );
        // Other tests meet the same log line on threads without a subscriber. With one
        // subscriber registered in the process, tracing would decide whether the line is
        // wanted by the thread that met it first; with a second one alive, it asks each
        // (as tests/notify.rs does).
        let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
        let cgroups = tempfile::tempdir().unwrap();
        let files = tempfile::tempdir().unwrap();
        let usage = usage_reader(cgroups.path(), files.path());
        let hostile = |priority| {
            let mut pod = api_pod("a", priority, "64Mi");
            pod.metadata.name = Some("..".to_string());
            pod
        };
        let (store, mut writer) = reflector::store::<ApiPod>();
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(hostile(0)));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let mut source = ApiPodSource::new(store, Some(usage), Arc::new(TaskGuard(Vec::new())));
        let warnings = || {
            let text = String::from_utf8(log.0.lock().expect("log").clone()).expect("text");
            text.matches("not usable in a host path").count()
        };
        for _ in 0..3 {
            let pods = source.pods();
            assert!(!pods[0].has_stats(), "{:?}", pods[0]);
        }
        assert_eq!(warnings(), 1);
        writer.apply_watcher_event(&watcher::Event::Apply(hostile(10)));
        for _ in 0..3 {
            source.pods();
        }
        assert_eq!(warnings(), 2, "once more for the new object");
    }
}
