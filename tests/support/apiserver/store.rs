//! Object storage with one global resourceVersion counter, a bounded change history for watch
//! resumption, and a broadcast of every change to open watches.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast;

use super::resources::ResourceType;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(resource_type: &ResourceType, namespace: &str, name: &str) -> Self {
        Self {
            group: resource_type.group.clone(),
            version: resource_type.version.clone(),
            resource: resource_type.plural.clone(),
            namespace: if resource_type.namespaced {
                namespace.to_string()
            } else {
                String::new()
            },
            name: name.to_string(),
        }
    }

    pub fn same_resource(&self, resource_type: &ResourceType) -> bool {
        self.group == resource_type.group && self.resource == resource_type.plural
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

#[derive(Debug)]
pub struct Change {
    pub revision: u64,
    pub kind: ChangeKind,
    pub key: ObjectKey,
    pub object: Value,
    /// The object before a modification, so a filtered watch can tell when it leaves or enters the filter.
    pub previous: Option<Value>,
}

pub struct Store {
    objects: BTreeMap<ObjectKey, Value>,
    revision: u64,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
    /// Watches may resume from any revision at or after this one.
    oldest_resumable: u64,
    changes: broadcast::Sender<Arc<Change>>,
}

const BROADCAST_CAPACITY: usize = 8192;

impl Store {
    pub fn new(history_limit: usize) -> Self {
        let (changes, _) = broadcast::channel(BROADCAST_CAPACITY);
        // Start above 1 so "0" (any version) and real revisions never collide in tests.
        Self {
            objects: BTreeMap::new(),
            revision: 100,
            history: VecDeque::new(),
            history_limit,
            oldest_resumable: 100,
            changes,
        }
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn oldest_resumable(&self) -> u64 {
        self.oldest_resumable
    }

    pub fn get(&self, key: &ObjectKey) -> Option<&Value> {
        self.objects.get(key)
    }

    /// Objects of one resource type, optionally in one namespace, ordered by namespace and name.
    pub fn list(&self, resource_type: &ResourceType, namespace: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|(key, _)| {
                key.same_resource(resource_type) && namespace.is_none_or(|ns| key.namespace == ns)
            })
            .map(|(_, object)| object.clone())
            .collect()
    }

    /// Every object of one resource, by group and plural, in any namespace.
    pub fn list_by_key(&self, group: &str, plural: &str) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|(key, _)| key.group == group && key.resource == plural)
            .map(|(_, object)| object.clone())
            .collect()
    }

    /// The next resourceVersion, to stamp into an object before `put`.
    pub fn next_revision(&mut self) -> u64 {
        self.revision += 1;
        self.revision
    }

    /// Stores an object already stamped with `revision` and announces the change.
    pub fn put(&mut self, key: ObjectKey, object: Value, revision: u64) -> ChangeKind {
        let previous = self.objects.insert(key.clone(), object.clone());
        let kind = if previous.is_some() {
            ChangeKind::Modified
        } else {
            ChangeKind::Added
        };
        self.record(Change {
            revision,
            kind,
            key,
            object,
            previous,
        });
        kind
    }

    /// Removes an object; the DELETED event carries the final state stamped with `revision`.
    pub fn remove(&mut self, key: &ObjectKey, final_state: Value, revision: u64) -> Option<Value> {
        let previous = self.objects.remove(key)?;
        self.record(Change {
            revision,
            kind: ChangeKind::Deleted,
            key: key.clone(),
            object: final_state,
            previous: Some(previous.clone()),
        });
        Some(previous)
    }

    fn record(&mut self, change: Change) {
        let change = Arc::new(change);
        self.history.push_back(change.clone());
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.oldest_resumable = dropped.revision;
            }
        }
        // No receivers is normal: nobody is watching.
        let _ = self.changes.send(change);
    }

    /// Forgets all history, so every earlier revision is "too old" (410 Gone) for watches.
    pub fn compact(&mut self) {
        self.history.clear();
        self.oldest_resumable = self.revision;
    }

    /// Changes after `revision` plus a receiver for later ones, taken atomically so none is missed.
    pub fn changes_since(
        &self,
        revision: u64,
    ) -> (Vec<Arc<Change>>, broadcast::Receiver<Arc<Change>>) {
        let backlog = self
            .history
            .iter()
            .filter(|change| change.revision > revision)
            .cloned()
            .collect();
        (backlog, self.changes.subscribe())
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }
}
