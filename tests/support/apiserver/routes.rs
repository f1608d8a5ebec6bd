//! HTTP routing: the Kubernetes REST paths, query parameters and content types, mapped onto the
//! verbs, watch streams and discovery documents.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::{Bytes, Incoming};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIGroup, APIGroupList, APIResource, APIResourceList, APIVersions, DeleteOptions,
    GroupVersionForDiscovery, ServerAddressByClientCIDR,
};
use serde::Serialize;
use serde_json::{Value, json};

use super::access;
use super::faults::RecordedRequest;
use super::paging;
use super::resources::ResourceType;
use super::selectors::{FieldSelector, LabelSelector};
use super::server::{Body, Shared, full_body};
use super::status::ApiError;
use super::tables;
use super::tokens;
use super::verbs::{self, Deleted, PatchBody};
use super::watch;

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'+' => decoded.push(b' '),
            b'%' if index + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[index + 1..index + 3]).ok();
                match hex.and_then(|hex| u8::from_str_radix(hex, 16).ok()) {
                    Some(byte) => {
                        decoded.push(byte);
                        index += 2;
                    }
                    None => decoded.push(b'%'),
                }
            }
            other => decoded.push(other),
        }
        index += 1;
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// `a=1&b=x%3Dy` into decoded pairs.
pub fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(key), percent_decode(value))
        })
        .collect()
}

/// A resource path: `/api/v1/namespaces/ns/pods/name/status` and its shorter forms.
#[derive(Clone, Debug, PartialEq)]
pub struct ResourcePath {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

pub fn parse_resource_path(path: &str) -> Option<ResourcePath> {
    let segments: Vec<&str> = path
        .split('/')
        .filter(|segment| !segment.is_empty())
        .collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", namespace, rest @ ..] if !rest.is_empty() && rest != ["status"] => {
            (Some((*namespace).to_string()), rest)
        }
        _ => (None, rest),
    };
    let (plural, name, subresource) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(*name), None),
        [plural, name, subresource] => (*plural, Some(*name), Some(*subresource)),
        _ => return None,
    };
    Some(ResourcePath {
        group: group.to_string(),
        version: version.to_string(),
        plural: plural.to_string(),
        namespace,
        name: name.map(str::to_string),
        subresource: subresource.map(str::to_string),
    })
}

fn json_response<T: Serialize>(status: u16, body: &T) -> Response<Body> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json")
        .body(full_body(Bytes::from(bytes)))
        .unwrap_or_else(|_| Response::new(full_body(Bytes::new())))
}

pub fn error_response(error: &ApiError) -> Response<Body> {
    json_response(error.code, &error.to_status())
}

/// Serves one request: log it, apply injected latency and failures, route it.
pub async fn handle(
    shared: Arc<Shared>,
    request: http::Request<Incoming>,
) -> Result<Response<Body>, std::convert::Infallible> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|collected| collected.to_bytes())
        .unwrap_or_default();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or_default().to_string();
    let params = parse_query(&query);
    let is_watch = params
        .iter()
        .any(|(key, value)| key == "watch" && (value == "true" || value == "1"));
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    let accept = parts
        .headers
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let authorization = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    let user_agent = parts
        .headers
        .get(header::USER_AGENT)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_string();

    let (latency, injected) = match shared.faults.lock() {
        Ok(mut faults) => (
            faults.latency,
            faults.take_failure(
                parts.method.as_str(),
                &path,
                is_watch,
                &String::from_utf8_lossy(&body),
            ),
        ),
        Err(_) => (Duration::ZERO, None),
    };
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    // The log stays locked while the request is routed: a test that sees the request's
    // effect in the store and then reads the log always finds the request there (pushed
    // after routing, it could be missing for a moment, and was once under CI's load).
    let mut log = shared
        .log
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let response = match injected {
        Some(code) => error_response(&ApiError::injected(code)),
        None => {
            let call = Call {
                method: &parts.method,
                path: &path,
                params: &params,
                accept: &accept,
                content_type: content_type.as_deref().unwrap_or_default(),
                user_agent: &user_agent,
                authorization: authorization.as_deref(),
                body: &body,
            };
            route(&shared, &call).unwrap_or_else(|error| error_response(&error))
        }
    };
    log.push(RecordedRequest {
        method: parts.method.to_string(),
        path,
        query,
        content_type,
        accept,
        user_agent,
        body: String::from_utf8_lossy(&body).into_owned(),
        status: response.status().as_u16(),
        answered_at: std::time::Instant::now(),
    });
    drop(log);
    Ok(response)
}

struct Call<'a> {
    method: &'a Method,
    path: &'a str,
    params: &'a [(String, String)],
    /// The `Accept` header: `as=Table` asks for the kubectl table form.
    accept: &'a str,
    content_type: &'a str,
    user_agent: &'a str,
    /// The `Authorization` header: a bearer token, or none for the test's own client.
    authorization: Option<&'a str>,
    body: &'a [u8],
}

impl Call<'_> {
    fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    fn flag(&self, name: &str) -> bool {
        matches!(self.param(name), Some("true" | "1"))
    }

    fn json_body(&self) -> Result<Value, ApiError> {
        serde_json::from_slice(self.body).map_err(|error| {
            ApiError::bad_request(format!("the request body is not JSON: {error}"))
        })
    }

    /// `fieldManager`, else the client's user agent up to the first '/', as the real server does.
    fn manager(&self) -> String {
        match self.param("fieldManager") {
            Some(manager) if !manager.is_empty() => manager.to_string(),
            _ => {
                let agent = self.user_agent.split('/').next().unwrap_or_default();
                if agent.is_empty() {
                    "unknown".to_string()
                } else {
                    agent.to_string()
                }
            }
        }
    }
}

fn route(shared: &Arc<Shared>, call: &Call) -> Result<Response<Body>, ApiError> {
    let caller = match call.authorization {
        None => access::Caller::Admin,
        Some(_) => {
            let store = shared.store.lock().map_err(|_| ApiError::injected(500))?;
            let tokens = shared.tokens.lock().map_err(|_| ApiError::injected(500))?;
            access::authenticate(&store, &tokens, call.authorization)?
        }
    };
    if let Some(document) = discovery(shared, call) {
        return Ok(document);
    }
    let target =
        parse_resource_path(call.path).ok_or_else(|| ApiError::path_not_found(call.path))?;
    // As in the real server, authorization comes before the path is resolved: a caller
    // without the right gets 403 even for a resource the server does not serve.
    let verb = verbs::verb(
        call.method.as_str(),
        target.name.is_some(),
        call.flag("watch"),
    );
    if let (access::Caller::ServiceAccount(_), Some(verb)) = (&caller, verb) {
        let store = shared.store.lock().map_err(|_| ApiError::injected(500))?;
        let asked = access::Attributes {
            verb,
            group: &target.group,
            plural: &target.plural,
            subresource: target.subresource.as_deref(),
            namespace: target.namespace.as_deref(),
            name: target.name.as_deref(),
        };
        access::authorize(&store, &caller, &asked)?;
    }
    let resource_type = shared
        .registry
        .lock()
        .ok()
        .and_then(|registry| {
            registry
                .find(&target.group, &target.version, &target.plural)
                .cloned()
        })
        .ok_or_else(|| ApiError::path_not_found(call.path))?;
    if !resource_type.namespaced && target.namespace.is_some() {
        return Err(ApiError::path_not_found(call.path));
    }
    let allowed_verbs = match target.subresource.as_deref() {
        None => resource_type.verbs,
        Some("status") if resource_type.has_status => &["get", "patch", "update"][..],
        Some(other) => match resource_type.subresource(other) {
            Some(subresource) => subresource.verbs,
            None => return Err(ApiError::path_not_found(call.path)),
        },
    };
    let namespace = target.namespace.clone().unwrap_or_default();
    if resource_type.namespaced
        && namespace.is_empty()
        && (target.name.is_some() || call.method != Method::GET)
    {
        return Err(ApiError::path_not_found(call.path));
    }
    if !verb.is_some_and(|verb| allowed_verbs.contains(&verb)) {
        return Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        ));
    }
    if let Some(subresource) = target
        .subresource
        .as_deref()
        .filter(|name| *name != "status")
    {
        return subresource_call(shared, call, &resource_type, &target, subresource);
    }
    if !resource_type.stored {
        if target.name.is_some() {
            return Err(ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource",
            ));
        }
        return unstored_call(shared, call, &resource_type);
    }
    let manager = call.manager();
    let name = target.name.clone().unwrap_or_default();
    let mut store = shared.store.lock().map_err(|_| ApiError::injected(500))?;
    // Only writes are admitted; reads skip reading the policies.
    let admission = (call.method != Method::GET).then(|| {
        access::Admission::new(
            &store,
            caller,
            &resource_type.group,
            &resource_type.version,
            &resource_type.plural,
            &resource_type.kind,
            target.subresource.as_deref(),
            &namespace,
            &name,
        )
    });
    let request = verbs::Request {
        resource_type: &resource_type,
        namespace: &namespace,
        name: &name,
        subresource: target.subresource.as_deref(),
        manager: &manager,
        admission: admission.as_ref(),
    };
    match (call.method.clone(), target.name.is_some()) {
        (Method::GET, true) => store
            .get(&super::store::ObjectKey::new(
                &resource_type,
                &namespace,
                &name,
            ))
            .map(|object| {
                if tables::wants_table(call.accept) && resource_type.normalizer_is_none() {
                    json_response(
                        200,
                        &tables::table(
                            &resource_type,
                            std::slice::from_ref(object),
                            store.revision(),
                        ),
                    )
                } else {
                    json_response(200, object)
                }
            })
            .ok_or_else(|| ApiError::not_found(&resource_type.group, &resource_type.plural, &name)),
        (Method::GET, false) => {
            let labels = LabelSelector::parse(call.param("labelSelector").unwrap_or_default())
                .map_err(ApiError::bad_request)?;
            let fields = FieldSelector::parse(
                call.param("fieldSelector").unwrap_or_default(),
                &resource_type,
            )
            .map_err(ApiError::bad_request)?;
            let scope = target.namespace.as_deref();
            if call.flag("watch") {
                let options = watch::WatchOptions {
                    namespace: target.namespace.clone(),
                    labels,
                    fields,
                    resource_version: call
                        .param("resourceVersion")
                        .unwrap_or_default()
                        .to_string(),
                    bookmarks: call.flag("allowWatchBookmarks"),
                    timeout: call
                        .param("timeoutSeconds")
                        .and_then(|seconds| seconds.parse().ok())
                        .map(Duration::from_secs),
                };
                return watch::start(shared, &mut store, resource_type.clone(), options);
            }
            check_list_version(&store, call)?;
            let filtered = call.param("labelSelector").is_some_and(|s| !s.is_empty())
                || call.param("fieldSelector").is_some_and(|s| !s.is_empty());
            let items: Vec<Value> = store
                .list(&resource_type, scope)
                .into_iter()
                .filter(|object| labels.matches(object) && fields.matches(object))
                .collect();
            let paging = paging::Paging {
                limit: call.param("limit"),
                continue_token: call.param("continue"),
                resource_version: call.param("resourceVersion"),
                filtered,
            };
            let page = paging::page(items, &paging, store.revision(), store.oldest_resumable())?;
            let mut metadata = json!({"resourceVersion": page.revision.to_string()});
            if let Some(token) = &page.continue_token {
                metadata["continue"] = json!(token);
            }
            if let Some(remaining) = page.remaining {
                metadata["remainingItemCount"] = json!(remaining);
            }
            // Custom resources are printed by the server, from their CRD's columns.
            if tables::wants_table(call.accept) && resource_type.normalizer_is_none() {
                let mut table = tables::table(&resource_type, &page.items, page.revision);
                table["metadata"] = metadata;
                return Ok(json_response(200, &table));
            }
            Ok(json_response(
                200,
                &json!({
                    "apiVersion": resource_type.api_version(),
                    "kind": format!("{}List", resource_type.kind),
                    "metadata": metadata,
                    "items": page.items,
                }),
            ))
        }
        (Method::POST, false) => {
            let created = verbs::create(&mut store, &request, call.json_body()?)?;
            define_if_crd(shared, &resource_type, &created);
            Ok(json_response(201, &created))
        }
        (Method::PUT, true) => {
            let updated = verbs::update(&mut store, &request, call.json_body()?)?;
            define_if_crd(shared, &resource_type, &updated);
            Ok(json_response(200, &updated))
        }
        (Method::PATCH, true) => {
            let body = patch_body(call)?;
            let existed = store
                .get(&super::store::ObjectKey::new(
                    &resource_type,
                    &namespace,
                    &name,
                ))
                .is_some();
            let object = verbs::patch(&mut store, &request, body)?;
            Ok(json_response(if existed { 200 } else { 201 }, &object))
        }
        (Method::DELETE, true) => {
            match verbs::delete(&mut store, &request, &delete_options(call)?)? {
                Deleted::Gone(object) => Ok(json_response(200, &object)),
                Deleted::Terminating(object) => Ok(json_response(202, &object)),
            }
        }
        (Method::DELETE, false) => {
            let labels = LabelSelector::parse(call.param("labelSelector").unwrap_or_default())
                .map_err(ApiError::bad_request)?;
            let fields = FieldSelector::parse(
                call.param("fieldSelector").unwrap_or_default(),
                &resource_type,
            )
            .map_err(ApiError::bad_request)?;
            let options = delete_options(call)?;
            let mut deleted = Vec::new();
            for object in store.list(&resource_type, target.namespace.as_deref()) {
                if !(labels.matches(&object) && fields.matches(&object)) {
                    continue;
                }
                let object_name = object
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let object_namespace = object
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let each = verbs::Request {
                    namespace: &object_namespace,
                    name: &object_name,
                    ..request
                };
                match verbs::delete(&mut store, &each, &options)? {
                    Deleted::Gone(object) | Deleted::Terminating(object) => deleted.push(object),
                }
            }
            Ok(json_response(
                200,
                &json!({
                    "apiVersion": resource_type.api_version(),
                    "kind": format!("{}List", resource_type.kind),
                    "metadata": {"resourceVersion": store.revision().to_string()},
                    "items": deleted,
                }),
            ))
        }
        (method, _) => Err(ApiError::method_not_allowed(format!(
            "{method} is not supported on {}",
            call.path
        ))),
    }
}

/// A subresource other than `status`: so far `serviceaccounts/{name}/token` (TokenRequest).
fn subresource_call(
    shared: &Arc<Shared>,
    call: &Call,
    resource_type: &ResourceType,
    target: &ResourcePath,
    subresource: &str,
) -> Result<Response<Body>, ApiError> {
    let (Some(namespace), Some(name)) = (target.namespace.as_deref(), target.name.as_deref())
    else {
        return Err(ApiError::path_not_found(call.path));
    };
    match (
        resource_type.group.as_str(),
        resource_type.plural.as_str(),
        subresource,
    ) {
        ("", "serviceaccounts", "token") => {
            let store = shared.store.lock().map_err(|_| ApiError::injected(500))?;
            let mut tokens = shared.tokens.lock().map_err(|_| ApiError::injected(500))?;
            let issued =
                tokens::request_token(&store, &mut tokens, namespace, name, call.json_body()?)?;
            Ok(json_response(201, &issued))
        }
        _ => Err(ApiError::path_not_found(call.path)),
    }
}

/// Kinds the server answers without storing: so far `authentication.k8s.io/v1` TokenReview.
fn unstored_call(
    shared: &Arc<Shared>,
    call: &Call,
    resource_type: &ResourceType,
) -> Result<Response<Body>, ApiError> {
    match (resource_type.group.as_str(), resource_type.plural.as_str()) {
        ("authentication.k8s.io", "tokenreviews") => {
            let store = shared.store.lock().map_err(|_| ApiError::injected(500))?;
            let tokens = shared.tokens.lock().map_err(|_| ApiError::injected(500))?;
            let review = tokens::review(&store, &tokens, call.json_body()?)?;
            Ok(json_response(201, &review))
        }
        _ => Err(ApiError::path_not_found(call.path)),
    }
}

/// A list at an exact or minimum version older than the retained history is `410 Gone`.
fn check_list_version(store: &super::store::Store, call: &Call) -> Result<(), ApiError> {
    let Some(requested) = call
        .param("resourceVersion")
        .filter(|version| !version.is_empty() && *version != "0")
    else {
        return Ok(());
    };
    let requested: u64 = requested
        .parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {requested:?}")))?;
    if matches!(call.param("resourceVersionMatch"), Some("Exact"))
        && requested < store.oldest_resumable()
    {
        return Err(ApiError::too_old(requested, store.oldest_resumable()));
    }
    Ok(())
}

fn patch_body(call: &Call) -> Result<PatchBody, ApiError> {
    let media_type = call
        .content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim();
    match media_type {
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            Ok(PatchBody::Merge(call.json_body()?))
        }
        "application/json-patch+json" => Ok(PatchBody::Json(call.json_body()?)),
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
            if call.param("fieldManager").is_none_or(str::is_empty) {
                return Err(ApiError::invalid(
                    "meta.k8s.io",
                    "PatchOptions",
                    "",
                    "fieldManager: Required value: is required for apply patch",
                ));
            }
            let object: Value = serde_yaml_ng::from_slice(call.body).map_err(|error| {
                ApiError::bad_request(format!("the apply body is not YAML: {error}"))
            })?;
            Ok(PatchBody::Apply {
                object,
                force: call.flag("force"),
            })
        }
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

fn delete_options(call: &Call) -> Result<DeleteOptions, ApiError> {
    let mut options: DeleteOptions = if call.body.iter().all(u8::is_ascii_whitespace) {
        DeleteOptions::default()
    } else {
        serde_json::from_slice(call.body)
            .map_err(|error| ApiError::bad_request(format!("decoding DeleteOptions: {error}")))?
    };
    if let Some(seconds) = call.param("gracePeriodSeconds") {
        options.grace_period_seconds = Some(seconds.parse().map_err(|_| {
            ApiError::bad_request(format!("invalid gracePeriodSeconds {seconds:?}"))
        })?);
    }
    Ok(options)
}

/// A created or updated CustomResourceDefinition makes its resource servable at once (the
/// real server takes a moment to establish it; clients retry discovery).
fn define_if_crd(shared: &Arc<Shared>, resource_type: &ResourceType, object: &Value) {
    if resource_type.group == "apiextensions.k8s.io"
        && resource_type.plural == "customresourcedefinitions"
        && let Ok(mut registry) = shared.registry.lock()
    {
        registry.register_types(tables::types_of_crd(object));
    }
}

fn api_resources(types: &[ResourceType], group: &str, version: &str) -> APIResourceList {
    let mut resources = Vec::new();
    for known in types
        .iter()
        .filter(|known| known.group == group && known.version == version)
    {
        resources.push(APIResource {
            name: known.plural.clone(),
            singular_name: known.singular(),
            namespaced: known.namespaced,
            kind: known.kind.clone(),
            verbs: known.verbs.iter().map(|verb| verb.to_string()).collect(),
            short_names: (!known.short_names.is_empty()).then(|| known.short_names.clone()),
            ..APIResource::default()
        });
        if known.has_status {
            resources.push(APIResource {
                name: format!("{}/status", known.plural),
                singular_name: String::new(),
                namespaced: known.namespaced,
                kind: known.kind.clone(),
                verbs: ["get", "patch", "update"]
                    .iter()
                    .map(|verb| verb.to_string())
                    .collect(),
                ..APIResource::default()
            });
        }
        for subresource in known.subresources {
            resources.push(APIResource {
                name: format!("{}/{}", known.plural, subresource.name),
                singular_name: String::new(),
                namespaced: known.namespaced,
                group: Some(subresource.group.to_string()),
                version: Some(subresource.version.to_string()),
                kind: subresource.kind.to_string(),
                verbs: subresource
                    .verbs
                    .iter()
                    .map(|verb| verb.to_string())
                    .collect(),
                ..APIResource::default()
            });
        }
    }
    APIResourceList {
        group_version: if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        },
        resources,
    }
}

fn group_document(types: &[ResourceType], group: &str) -> APIGroup {
    let versions: BTreeSet<&str> = types
        .iter()
        .filter(|known| known.group == group)
        .map(|known| known.version.as_str())
        .collect();
    let versions: Vec<GroupVersionForDiscovery> = versions
        .into_iter()
        .map(|version| GroupVersionForDiscovery {
            group_version: format!("{group}/{version}"),
            version: version.to_string(),
        })
        .collect();
    APIGroup {
        name: group.to_string(),
        preferred_version: versions.first().cloned(),
        versions,
        ..APIGroup::default()
    }
}

/// The legacy discovery documents and `/version`.
fn discovery(shared: &Arc<Shared>, call: &Call) -> Option<Response<Body>> {
    if call.method != Method::GET {
        return None;
    }
    let types = shared.registry.lock().ok()?.all().to_vec();
    let segments: Vec<&str> = call
        .path
        .split('/')
        .filter(|segment| !segment.is_empty())
        .collect();
    match segments.as_slice() {
        ["version"] => Some(json_response(
            200,
            &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-nodekeeper-fake", "gitCommit": "", "gitTreeState": "clean",
                    "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"}),
        )),
        ["api"] => Some(json_response(
            200,
            &APIVersions {
                versions: vec!["v1".to_string()],
                server_address_by_client_cidrs: vec![ServerAddressByClientCIDR {
                    client_cidr: "0.0.0.0/0".to_string(),
                    server_address: shared.address.to_string(),
                }],
            },
        )),
        ["api", version] => Some(json_response(200, &api_resources(&types, "", version))),
        ["apis"] => {
            let groups: BTreeSet<&str> = types
                .iter()
                .filter(|known| !known.group.is_empty())
                .map(|known| known.group.as_str())
                .collect();
            Some(json_response(
                200,
                &APIGroupList {
                    groups: groups
                        .into_iter()
                        .map(|group| group_document(&types, group))
                        .collect(),
                },
            ))
        }
        ["apis", group] => types
            .iter()
            .any(|known| known.group == *group)
            .then(|| json_response(200, &group_document(&types, group))),
        ["apis", group, version] => types
            .iter()
            .any(|known| known.group == *group && known.version == *version)
            .then(|| json_response(200, &api_resources(&types, group, version))),
        _ => None,
    }
}
