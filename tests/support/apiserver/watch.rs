//! Watch streams: newline-delimited JSON events from a resourceVersion, filtered by namespace and
//! selectors, with bookmarks, `timeoutSeconds`, `410 Gone` for expired versions, and a fault hook
//! that cuts every open stream.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use http::{Response, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::WatchEvent;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use super::resources::ResourceType;
use super::selectors::{FieldSelector, LabelSelector};
use super::server::{Body, Shared};
use super::status::ApiError;
use super::store::{Change, ChangeKind, Store};

pub struct WatchOptions {
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub resource_version: String,
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
}

struct Filter {
    resource_type: ResourceType,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn matches(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }

    /// The event this watch sees for a change: objects entering or leaving the selection are
    /// reported as ADDED or DELETED, as the real server does.
    fn translate(&self, change: &Change) -> Option<WatchEvent<Value>> {
        if !change.key.same_resource(&self.resource_type)
            || self
                .namespace
                .as_deref()
                .is_some_and(|namespace| namespace != change.key.namespace)
        {
            return None;
        }
        let was_selected = change
            .previous
            .as_ref()
            .is_some_and(|previous| self.matches(previous));
        let is_selected = self.matches(&change.object);
        let object = change.object.clone();
        match change.kind {
            ChangeKind::Added => is_selected.then_some(WatchEvent::Added(object)),
            ChangeKind::Modified => match (was_selected, is_selected) {
                (true, true) => Some(WatchEvent::Modified(object)),
                (false, true) => Some(WatchEvent::Added(object)),
                (true, false) => Some(WatchEvent::Deleted(object)),
                (false, false) => None,
            },
            ChangeKind::Deleted => {
                (was_selected || is_selected).then_some(WatchEvent::Deleted(object))
            }
        }
    }
}

fn line(event: &WatchEvent<Value>) -> Bytes {
    let mut bytes = serde_json::to_vec(event).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// kube requires `kind` and `apiVersion` on bookmark objects, which the real server sends.
fn bookmark_line(resource_type: &ResourceType, revision: u64) -> Bytes {
    let event = json!({
        "type": "BOOKMARK",
        "object": {
            "kind": resource_type.kind,
            "apiVersion": resource_type.api_version(),
            "metadata": {"resourceVersion": revision.to_string()},
        },
    });
    let mut bytes = serde_json::to_vec(&event).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

fn gone_line(error: &ApiError) -> Bytes {
    line(&WatchEvent::ErrorStatus(error.to_status()))
}

type Chunk = Result<Frame<Bytes>, std::io::Error>;

/// Opens a watch. The store lock is held by the caller, so the backlog and the live feed meet
/// without a gap.
pub fn start(
    shared: &Arc<Shared>,
    store: &mut Store,
    resource_type: ResourceType,
    options: WatchOptions,
) -> Result<Response<Body>, ApiError> {
    let filter = Filter {
        resource_type,
        namespace: options.namespace,
        labels: options.labels,
        fields: options.fields,
    };
    let mut opening = Vec::new();
    let (start_revision, backlog, changes, expired) = match options.resource_version.as_str() {
        "" | "0" => {
            for object in store.list(&filter.resource_type, filter.namespace.as_deref()) {
                if filter.matches(&object) {
                    opening.push(line(&WatchEvent::Added(object)));
                }
            }
            (store.revision(), Vec::new(), store.subscribe(), None)
        }
        text => {
            let requested: u64 = text
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {text:?}")))?;
            if requested < store.oldest_resumable() {
                (
                    requested,
                    Vec::new(),
                    store.subscribe(),
                    Some(ApiError::too_old(requested, store.oldest_resumable())),
                )
            } else {
                let (backlog, changes) = store.changes_since(requested);
                (requested, backlog, changes, None)
            }
        }
    };
    let (sender, receiver) = mpsc::channel::<Chunk>(64);
    let bookmark_interval = options.bookmarks.then(|| shared.bookmark_interval());
    let pump = Pump {
        filter,
        seen_revision: start_revision,
        sender,
        cut: shared.drop_watches.subscribe(),
        bookmark_interval,
        deadline: options
            .timeout
            .map(|timeout| tokio::time::Instant::now() + timeout),
    };
    tokio::spawn(pump.run(opening, backlog, changes, expired));
    let stream = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|chunk| (chunk, receiver))
    });
    Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::TRANSFER_ENCODING, "chunked")
        .body(BodyExt::boxed_unsync(StreamBody::new(stream.boxed())))
        .map_err(|error| ApiError::bad_request(error.to_string()))
}

struct Pump {
    filter: Filter,
    seen_revision: u64,
    sender: mpsc::Sender<Chunk>,
    cut: tokio::sync::watch::Receiver<u64>,
    bookmark_interval: Option<Duration>,
    deadline: Option<tokio::time::Instant>,
}

impl Pump {
    async fn send(&self, bytes: Bytes) -> bool {
        self.sender.send(Ok(Frame::data(bytes))).await.is_ok()
    }

    async fn run(
        mut self,
        opening: Vec<Bytes>,
        backlog: Vec<Arc<Change>>,
        mut changes: broadcast::Receiver<Arc<Change>>,
        expired: Option<ApiError>,
    ) {
        if let Some(error) = expired {
            self.send(gone_line(&error)).await;
            return;
        }
        for bytes in opening {
            if !self.send(bytes).await {
                return;
            }
        }
        for change in backlog {
            if !self.forward(&change).await {
                return;
            }
        }
        let far_future = tokio::time::Instant::now() + Duration::from_secs(24 * 3600);
        let deadline = self.deadline.unwrap_or(far_future);
        let mut bookmarks = tokio::time::interval(
            self.bookmark_interval
                .unwrap_or(Duration::from_secs(24 * 3600)),
        );
        bookmarks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        bookmarks.tick().await;
        loop {
            tokio::select! {
                _ = self.sender.closed() => return,
                _ = tokio::time::sleep_until(deadline) => return,
                _ = self.cut.changed() => {
                    let _ = self.sender.send(Err(std::io::Error::other("watch cut by fault injection"))).await;
                    return;
                }
                _ = bookmarks.tick(), if self.bookmark_interval.is_some() => {
                    if !self.send(bookmark_line(&self.filter.resource_type, self.seen_revision)).await {
                        return;
                    }
                }
                received = changes.recv() => match received {
                    Ok(change) => {
                        if change.revision > self.seen_revision && !self.forward(&change).await {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        self.send(gone_line(&ApiError::gone("watch fell behind; too old resource version"))).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    }

    async fn forward(&mut self, change: &Change) -> bool {
        self.seen_revision = self.seen_revision.max(change.revision);
        match self.filter.translate(change) {
            Some(event) => self.send(line(&event)).await,
            None => true,
        }
    }
}
