//! The API verbs over the store: create, update, patch, apply, delete, with the metadata the real
//! server maintains (uid, resourceVersion, generation, timestamps, managedFields) and its checks
//! (stale resourceVersion, delete preconditions, graceful deletion, finalizers, status isolation).

use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use super::access::Admission;
use super::apply::{self, Scope, Writer};
use super::patch::{self, JsonPatchError};
use super::resources::ResourceType;
use super::status::ApiError;
use super::store::{ObjectKey, Store};

pub fn timestamp(at: Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub fn now() -> String {
    timestamp(Timestamp::now())
}

static UNIQUE: AtomicU64 = AtomicU64::new(0);

/// SplitMix64 over a process-wide counter seeded by the clock: unique, well spread, no RNG crate.
pub fn unique_bits() -> u64 {
    let seed = Timestamp::now().as_nanosecond() as u64;
    let mut value = seed.wrapping_add(
        UNIQUE
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    value = (value ^ (value >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    value ^ (value >> 31)
}

/// A random (version 4) UUID, as the real server makes `metadata.uid`.
pub(super) fn new_uid() -> String {
    let high = unique_bits();
    let low = unique_bits();
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        high >> 32,
        (high >> 16) & 0xffff,
        high & 0xfff,
        (low >> 48) & 0xfff,
        low & 0xffff_ffff_ffff
    )
}

/// The five-character suffix alphabet of `generateName` (no vowels, no look-alikes).
fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut bits = unique_bits();
    (0..5)
        .map(|_| {
            let character = ALPHABET[(bits % ALPHABET.len() as u64) as usize] as char;
            bits /= ALPHABET.len() as u64;
            character
        })
        .collect()
}

/// The string at a JSON pointer; empty when absent or not a string.
pub(super) fn text_at<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The Kubernetes verb RBAC checks and discovery lists for a request: its HTTP method, whether
/// the path names one object, and whether it asks to watch. None for a method no verb maps to.
pub(super) fn verb(method: &str, named: bool, watch: bool) -> Option<&'static str> {
    match (method, named) {
        ("GET", true) => Some("get"),
        ("GET", false) if watch => Some("watch"),
        ("GET", false) => Some("list"),
        ("POST", _) => Some("create"),
        ("PUT", _) => Some("update"),
        ("PATCH", _) => Some("patch"),
        ("DELETE", true) => Some("delete"),
        ("DELETE", false) => Some("deletecollection"),
        _ => None,
    }
}

fn metadata_mut(object: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !object.get("metadata").is_some_and(Value::is_object) {
        object["metadata"] = json!({});
    }
    match object.get_mut("metadata").and_then(Value::as_object_mut) {
        Some(metadata) => metadata,
        None => unreachable!("metadata was just made an object"),
    }
}

fn scope_for(resource_type: &ResourceType, subresource: Option<&str>) -> Scope {
    match (resource_type.has_status, subresource) {
        (true, Some("status")) => Scope::StatusOnly,
        (true, _) => Scope::MainWithoutStatus,
        (false, _) => Scope::Whole,
    }
}

/// Who a write is attributed to, and where.
pub struct Request<'a> {
    pub resource_type: &'a ResourceType,
    pub namespace: &'a str,
    pub name: &'a str,
    pub subresource: Option<&'a str>,
    pub manager: &'a str,
    /// The validating admission policies a write must pass; None for the test's own seeding.
    pub admission: Option<&'a Admission>,
}

impl Request<'_> {
    fn key(&self) -> ObjectKey {
        ObjectKey::new(self.resource_type, self.namespace, self.name)
    }

    /// Admission of a write: `old` absent for a create, `new` absent for a delete.
    fn admit(&self, old: Option<&Value>, new: Option<&Value>) -> Result<(), ApiError> {
        match self.admission {
            Some(admission) => admission.check(old, new),
            None => Ok(()),
        }
    }

    fn scope(&self) -> Scope {
        scope_for(self.resource_type, self.subresource)
    }

    fn not_found(&self) -> ApiError {
        ApiError::not_found(
            &self.resource_type.group,
            &self.resource_type.plural,
            self.name,
        )
    }

    fn writer<'a>(&'a self, api_version: &'a str, time: &'a str) -> Writer<'a> {
        Writer {
            manager: self.manager,
            api_version,
            time,
            scope: self.scope(),
        }
    }
}

fn normalize(resource_type: &ResourceType, object: Value) -> Result<Value, ApiError> {
    resource_type.normalize(object).map_err(|why| {
        ApiError::bad_request(format!("decoding {} body: {why}", resource_type.kind))
    })
}

fn set_type_meta(resource_type: &ResourceType, object: &mut Value) -> Result<(), ApiError> {
    let kind = text_at(object, "/kind");
    if !kind.is_empty() && kind != resource_type.kind {
        return Err(ApiError::bad_request(format!(
            "the kind {kind:?} does not match the resource {}",
            resource_type.plural
        )));
    }
    object["apiVersion"] = json!(resource_type.api_version());
    object["kind"] = json!(resource_type.kind);
    Ok(())
}

/// POST: a new object (name or generateName), stamped with uid, timestamps and version 1.
pub fn create(store: &mut Store, request: &Request, body: Value) -> Result<Value, ApiError> {
    create_object(store, request, body, true)
}

fn create_object(
    store: &mut Store,
    request: &Request,
    mut object: Value,
    track_update: bool,
) -> Result<Value, ApiError> {
    let resource_type = request.resource_type;
    if !object.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    set_type_meta(resource_type, &mut object)?;
    let body_namespace = text_at(&object, "/metadata/namespace").to_string();
    if resource_type.namespaced && !body_namespace.is_empty() && body_namespace != request.namespace
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let mut name = text_at(&object, "/metadata/name").to_string();
    if name.is_empty() {
        let prefix = text_at(&object, "/metadata/generateName");
        if prefix.is_empty() {
            return Err(ApiError::invalid(
                &resource_type.group,
                &resource_type.plural,
                "",
                "metadata.name: Required value: name or generateName is required",
            ));
        }
        name = format!("{prefix}{}", name_suffix());
    }
    let key = ObjectKey::new(resource_type, request.namespace, &name);
    if store.get(&key).is_some() {
        return Err(ApiError::already_exists(
            &resource_type.group,
            &resource_type.plural,
            &name,
        ));
    }
    match request.scope() {
        Scope::MainWithoutStatus
            if resource_type.kind == "Pod" && resource_type.group.is_empty() =>
        {
            object["status"] = json!({"phase": "Pending"});
        }
        Scope::MainWithoutStatus => {
            if let Some(fields) = object.as_object_mut() {
                fields.remove("status");
            }
        }
        _ => {}
    }
    let time = now();
    let revision = store.next_revision();
    let metadata = metadata_mut(&mut object);
    metadata.insert("name".into(), json!(name));
    if resource_type.namespaced {
        metadata.insert("namespace".into(), json!(request.namespace));
    } else {
        metadata.remove("namespace");
    }
    metadata.insert("uid".into(), json!(new_uid()));
    metadata.insert("creationTimestamp".into(), json!(time));
    metadata.insert("resourceVersion".into(), json!(revision.to_string()));
    metadata.insert("generation".into(), json!(1));
    for system_field in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
    ] {
        metadata.remove(system_field);
    }
    if track_update {
        metadata.remove("managedFields");
    }
    let mut object = normalize(resource_type, object)?;
    if track_update {
        let api_version = resource_type.api_version();
        apply::record_update(None, &mut object, &request.writer(&api_version, &time));
    }
    request.admit(None, Some(&object))?;
    store.put(key, object.clone(), revision);
    Ok(object)
}

/// Everything but status, metadata and type, to tell whether `generation` must move.
fn desired_state(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(fields) = copy.as_object_mut() {
        for ignored in ["metadata", "status", "apiVersion", "kind"] {
            fields.remove(ignored);
        }
    }
    copy
}

fn without_volatile_metadata(object: &Value) -> Value {
    let mut copy = object.clone();
    let metadata = metadata_mut(&mut copy);
    metadata.remove("resourceVersion");
    metadata.remove("managedFields");
    copy
}

/// The shared tail of PUT, PATCH and apply: checks, scope, system metadata, then the write.
fn commit_update(
    store: &mut Store,
    request: &Request,
    old: &Value,
    mut new: Value,
    track_update: bool,
) -> Result<Value, ApiError> {
    let resource_type = request.resource_type;
    if !new.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    set_type_meta(resource_type, &mut new)?;
    let sent_name = text_at(&new, "/metadata/name");
    if !sent_name.is_empty() && sent_name != request.name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({sent_name}) does not match the name on the URL ({})",
            request.name
        )));
    }
    let sent_version = text_at(&new, "/metadata/resourceVersion");
    if !sent_version.is_empty() && sent_version != text_at(old, "/metadata/resourceVersion") {
        return Err(ApiError::stale(
            &resource_type.group,
            &resource_type.plural,
            request.name,
        ));
    }
    match request.scope() {
        Scope::Whole => {}
        Scope::MainWithoutStatus => match old.get("status") {
            Some(status) => new["status"] = status.clone(),
            None => {
                if let Some(fields) = new.as_object_mut() {
                    fields.remove("status");
                }
            }
        },
        Scope::StatusOnly => {
            let status = new.get("status").cloned();
            let managed = new.pointer("/metadata/managedFields").cloned();
            // The Pod and Node status strategies reset the spec, not the metadata: labels
            // and annotations written through `status` are kept, as the real server keeps
            // them (what the agent's admission policy must also guard).
            let kept_metadata = keeps_metadata_on_status_writes(resource_type).then(|| {
                (
                    new.pointer("/metadata/labels").cloned(),
                    new.pointer("/metadata/annotations").cloned(),
                )
            });
            new = old.clone();
            if let Some((labels, annotations)) = kept_metadata {
                let metadata = metadata_mut(&mut new);
                for (field, value) in [("labels", labels), ("annotations", annotations)] {
                    match value {
                        Some(value) => metadata.insert(field.into(), value),
                        None => metadata.remove(field),
                    };
                }
            }
            match status {
                Some(status) => new["status"] = status,
                None => {
                    if let Some(fields) = new.as_object_mut() {
                        fields.remove("status");
                    }
                }
            }
            if let Some(managed) = managed {
                metadata_mut(&mut new).insert("managedFields".into(), managed);
            }
        }
    }
    let old_metadata = old.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let metadata = metadata_mut(&mut new);
    for system_field in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "resourceVersion",
    ] {
        match old_metadata.get(system_field) {
            Some(value) => metadata.insert(system_field.into(), value.clone()),
            None => metadata.remove(system_field),
        };
    }
    if !track_update && new.pointer("/metadata/managedFields").is_none() {
        metadata_mut(&mut new).insert("managedFields".into(), json!([]));
    }
    let mut new = normalize(resource_type, new)?;
    let time = now();
    if track_update {
        let api_version = resource_type.api_version();
        apply::record_update(Some(old), &mut new, &request.writer(&api_version, &time));
    }
    request.admit(Some(old), Some(&new))?;
    if without_volatile_metadata(&new) == without_volatile_metadata(old)
        && new.pointer("/metadata/managedFields") == old.pointer("/metadata/managedFields")
    {
        return Ok(old.clone());
    }
    if desired_state(&new) != desired_state(old) {
        let generation = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        metadata_mut(&mut new).insert("generation".into(), json!(generation + 1));
    }
    let revision = store.next_revision();
    metadata_mut(&mut new).insert("resourceVersion".into(), json!(revision.to_string()));
    let key = request.key();
    if is_ready_to_vanish(&new) {
        store.remove(&key, new.clone(), revision);
    } else {
        store.put(key, new.clone(), revision);
    }
    Ok(new)
}

/// Built-in kinds whose status writes keep metadata changes (their status strategies copy
/// back only the spec); for the others the fake keeps nothing but the status.
fn keeps_metadata_on_status_writes(resource_type: &ResourceType) -> bool {
    resource_type.group.is_empty() && matches!(resource_type.kind.as_str(), "Pod" | "Node")
}

/// Deletion was requested, no finalizer holds the object and no grace period is running.
fn is_ready_to_vanish(object: &Value) -> bool {
    let terminating = object.pointer("/metadata/deletionTimestamp").is_some();
    let finalizers = object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|list| !list.is_empty());
    let grace = object
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    terminating && !finalizers && grace == 0
}

fn existing(store: &Store, request: &Request) -> Result<Value, ApiError> {
    store
        .get(&request.key())
        .cloned()
        .ok_or_else(|| request.not_found())
}

/// PUT on the resource or its status subresource.
pub fn update(store: &mut Store, request: &Request, body: Value) -> Result<Value, ApiError> {
    let old = existing(store, request)?;
    commit_update(store, request, &old, body, true)
}

/// The body of a PATCH, by content type.
pub enum PatchBody {
    Merge(Value),
    Json(Value),
    Apply { object: Value, force: bool },
}

pub fn patch(store: &mut Store, request: &Request, body: PatchBody) -> Result<Value, ApiError> {
    let resource_type = request.resource_type;
    match body {
        PatchBody::Merge(merge) => {
            let old = existing(store, request)?;
            let mut patched = old.clone();
            patch::merge_patch(&mut patched, &merge);
            commit_update(store, request, &old, patched, true)
        }
        PatchBody::Json(operations) => {
            let old = existing(store, request)?;
            let patched = patch::json_patch(&old, &operations).map_err(|error| match error {
                JsonPatchError::TestFailed(why) | JsonPatchError::Invalid(why) => {
                    ApiError::invalid(
                        &resource_type.group,
                        &resource_type.plural,
                        request.name,
                        why,
                    )
                }
            })?;
            commit_update(store, request, &old, patched, true)
        }
        PatchBody::Apply { object, force } => apply_patch(store, request, object, force),
    }
}

fn apply_patch(
    store: &mut Store,
    request: &Request,
    applied: Value,
    force: bool,
) -> Result<Value, ApiError> {
    let resource_type = request.resource_type;
    let sent_name = text_at(&applied, "/metadata/name");
    if sent_name != request.name {
        return Err(ApiError::bad_request(format!(
            "the name of the applied object ({sent_name:?}) must match the name on the URL ({})",
            request.name
        )));
    }
    let time = now();
    let api_version = resource_type.api_version();
    let writer = request.writer(&api_version, &time);
    let old = store.get(&request.key()).cloned();
    if old.is_none() && request.subresource.is_some() {
        return Err(request.not_found());
    }
    let merged = apply::apply(old.as_ref(), &applied, &writer, force).map_err(|conflicts| {
        ApiError::apply_conflicts(
            &resource_type.group,
            &resource_type.plural,
            request.name,
            &conflicts,
        )
    })?;
    match old {
        Some(old) => commit_update(store, request, &old, merged, false),
        None => create_object(store, request, merged, false),
    }
}

fn precondition_failed(request: &Request, what: &str, wanted: &str, found: &str) -> ApiError {
    ApiError::conflict(
        &request.resource_type.group,
        &request.resource_type.plural,
        request.name,
        &format!(
            "Precondition failed: {what} in precondition: {wanted}, {what} in object meta: {found}"
        ),
    )
}

/// Whether a DELETE removed the object or only marked it for deletion.
pub enum Deleted {
    Gone(Value),
    Terminating(Value),
}

/// DELETE with `DeleteOptions`: preconditions, then graceful deletion for running pods and
/// finalizer-held objects, immediate removal otherwise.
pub fn delete(
    store: &mut Store,
    request: &Request,
    options: &DeleteOptions,
) -> Result<Deleted, ApiError> {
    let old = existing(store, request)?;
    if let Some(preconditions) = &options.preconditions {
        let uid = text_at(&old, "/metadata/uid");
        if let Some(wanted) = preconditions.uid.as_deref().filter(|wanted| *wanted != uid) {
            return Err(precondition_failed(request, "UID", wanted, uid));
        }
        let version = text_at(&old, "/metadata/resourceVersion");
        if let Some(wanted) = preconditions
            .resource_version
            .as_deref()
            .filter(|wanted| *wanted != version)
        {
            return Err(precondition_failed(
                request,
                "ResourceVersion",
                wanted,
                version,
            ));
        }
    }
    request.admit(Some(&old), None)?;
    let grace = grace_period(request.resource_type, &old, options);
    let has_finalizers = old
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|list| !list.is_empty());
    let current_grace = old
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64);
    let already_terminating = old.pointer("/metadata/deletionTimestamp").is_some();

    if grace == 0 && !has_finalizers {
        let revision = store.next_revision();
        let mut final_state = old.clone();
        metadata_mut(&mut final_state)
            .insert("resourceVersion".into(), json!(revision.to_string()));
        store.remove(&request.key(), final_state.clone(), revision);
        return Ok(Deleted::Gone(final_state));
    }
    // A repeated delete may only shorten a running grace period, as in the real server.
    if already_terminating && current_grace.is_some_and(|current| grace >= current) {
        return Ok(Deleted::Terminating(old));
    }
    let mut marked = old.clone();
    let deadline = Timestamp::now()
        .checked_add(SignedDuration::from_secs(grace))
        .unwrap_or_else(|_| Timestamp::now());
    let revision = store.next_revision();
    let metadata = metadata_mut(&mut marked);
    metadata.insert("deletionTimestamp".into(), json!(timestamp(deadline)));
    metadata.insert("deletionGracePeriodSeconds".into(), json!(grace));
    metadata.insert("resourceVersion".into(), json!(revision.to_string()));
    if is_ready_to_vanish(&marked) {
        store.remove(&request.key(), marked.clone(), revision);
        return Ok(Deleted::Gone(marked));
    }
    store.put(request.key(), marked.clone(), revision);
    Ok(Deleted::Terminating(marked))
}

/// Seconds of grace: only pods bound to a node and not yet finished get any.
fn grace_period(resource_type: &ResourceType, object: &Value, options: &DeleteOptions) -> i64 {
    let is_pod = resource_type.group.is_empty() && resource_type.plural == "pods";
    if !is_pod {
        return 0;
    }
    let unscheduled = text_at(object, "/spec/nodeName").is_empty();
    let finished = matches!(text_at(object, "/status/phase"), "Succeeded" | "Failed");
    if unscheduled || finished {
        return 0;
    }
    options
        .grace_period_seconds
        .or_else(|| {
            object
                .pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
        })
        .unwrap_or(30)
        .max(0)
}

/// What the kubelet does when a terminating pod's containers are gone: remove it for good.
pub fn finalize(store: &mut Store, request: &Request) -> Result<Value, ApiError> {
    let old = existing(store, request)?;
    let revision = store.next_revision();
    let mut final_state = old;
    metadata_mut(&mut final_state).insert("resourceVersion".into(), json!(revision.to_string()));
    store.remove(&request.key(), final_state.clone(), revision);
    Ok(final_state)
}

/// Stores an object as given (status included), for seeding test fixtures.
pub fn seed(store: &mut Store, request: &Request, mut object: Value) -> Result<Value, ApiError> {
    let resource_type = request.resource_type;
    set_type_meta(resource_type, &mut object)?;
    let key = request.key();
    let previous = store.get(&key).cloned();
    let revision = store.next_revision();
    let metadata = metadata_mut(&mut object);
    let uid = previous
        .as_ref()
        .map(|old| text_at(old, "/metadata/uid").to_string())
        .unwrap_or_else(new_uid);
    metadata.entry("uid").or_insert_with(|| json!(uid));
    metadata
        .entry("creationTimestamp")
        .or_insert_with(|| json!(now()));
    metadata.entry("generation").or_insert_with(|| json!(1));
    metadata.insert("name".into(), json!(request.name));
    if resource_type.namespaced {
        metadata.insert("namespace".into(), json!(request.namespace));
    }
    metadata.insert("resourceVersion".into(), json!(revision.to_string()));
    let object = normalize(resource_type, object)?;
    store.put(key, object.clone(), revision);
    Ok(object)
}
