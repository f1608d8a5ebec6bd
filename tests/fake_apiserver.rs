//! The fake API server, exercised through the real kube client over HTTP.

mod support;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec,
    TokenReviewStatus,
};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, ServiceAccount};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, Preconditions, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::{Value, json};

use support::apiserver::{
    CustomResource, FakeApiServer, RbacAccess, RequestMatcher, projected_token,
};

const PATIENCE: Duration = Duration::from_secs(20);

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
}

fn running_pod(name: &str, node: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}], "terminationGracePeriodSeconds": 45},
        "status": {"phase": "Running"},
    }))
    .unwrap()
}

fn api_error(error: kube::Error) -> (u16, String) {
    let (code, reason, _message) = api_failure(error);
    (code, reason)
}

#[tokio::test]
async fn create_get_list_replace_delete() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let created = api
        .create(&PostParams::default(), &config_map("one"))
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(api.get("one").await.unwrap().data.unwrap()["k"], "v");

    let generated: ConfigMap =
        serde_json::from_value(json!({"metadata": {"generateName": "gen-"}})).unwrap();
    let generated = api
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    assert!(generated.metadata.name.unwrap().starts_with("gen-"));

    let duplicate = api
        .create(&PostParams::default(), &config_map("one"))
        .await
        .unwrap_err();
    assert_eq!(api_error(duplicate), (409, "AlreadyExists".to_string()));

    let mut changed = created.clone();
    changed.data = Some([("k".to_string(), "w".to_string())].into());
    let replaced = api
        .replace("one", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert_ne!(
        replaced.metadata.resource_version,
        created.metadata.resource_version
    );

    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 2);
    assert!(list.metadata.resource_version.is_some());

    api.delete("one", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        api_error(api.get("one").await.unwrap_err()),
        (404, "NotFound".to_string())
    );
}

#[tokio::test]
async fn update_with_an_old_resource_version_is_rejected() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let first = api
        .create(&PostParams::default(), &config_map("cm"))
        .await
        .unwrap();
    let mut newer = first.clone();
    newer.data = Some([("k".to_string(), "newer".to_string())].into());
    api.replace("cm", &PostParams::default(), &newer)
        .await
        .unwrap();
    let mut stale = first;
    stale.data = Some([("k".to_string(), "stale".to_string())].into());
    let error = api
        .replace("cm", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(api_error(error), (409, "Conflict".to_string()));
    assert_eq!(api.get("cm").await.unwrap().data.unwrap()["k"], "newer");
}

#[tokio::test]
async fn delete_preconditions_guard_against_replacements() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let original = api
        .create(&PostParams::default(), &config_map("cm"))
        .await
        .unwrap();
    api.delete("cm", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &config_map("cm"))
        .await
        .unwrap();

    let old_uid = DeleteParams {
        preconditions: Some(Preconditions {
            uid: original.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(
        api_error(api.delete("cm", &old_uid).await.unwrap_err()),
        (409, "Conflict".to_string())
    );
    let stale_version = DeleteParams {
        preconditions: Some(Preconditions {
            uid: None,
            resource_version: original.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    assert_eq!(
        api_error(api.delete("cm", &stale_version).await.unwrap_err()),
        (409, "Conflict".to_string())
    );
    let current_uid = api.get("cm").await.unwrap().metadata.uid;
    let current = DeleteParams {
        preconditions: Some(Preconditions {
            uid: current_uid,
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    api.delete("cm", &current).await.unwrap();
    assert!(server.object::<ConfigMap>("default", "cm").is_none());
}

#[tokio::test]
async fn graceful_pod_deletion_waits_for_finalize() {
    let server = FakeApiServer::start().await;
    server.seed(&running_pod("web", "node-a", json!({})));
    let api: Api<Pod> = Api::default_namespaced(server.client());
    let start = api
        .get("web")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = api
        .watch(&WatchParams::default(), &start)
        .await
        .unwrap()
        .boxed();

    api.delete(
        "web",
        &DeleteParams {
            grace_period_seconds: Some(20),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    let terminating = api.get("web").await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(20));
    assert!(matches!(
        events.try_next().await.unwrap(),
        Some(WatchEvent::Modified(_))
    ));

    assert!(server.finalize::<Pod>("default", "web"));
    assert!(matches!(
        events.try_next().await.unwrap(),
        Some(WatchEvent::Deleted(_))
    ));
    assert_eq!(api_error(api.get("web").await.unwrap_err()).0, 404);

    // Without an explicit grace period the pod's own terminationGracePeriodSeconds applies; 0 is immediate.
    server.seed(&running_pod("db", "node-a", json!({})));
    api.delete("db", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        api.get("db")
            .await
            .unwrap()
            .metadata
            .deletion_grace_period_seconds,
        Some(45)
    );
    api.delete(
        "db",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    assert!(server.object::<Pod>("default", "db").is_none());
}

#[tokio::test]
async fn watch_resumes_from_a_resource_version_and_sends_bookmarks() {
    let server = FakeApiServer::start().await;
    server.set_bookmark_interval(Duration::from_millis(50));
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    api.create(&PostParams::default(), &config_map("before"))
        .await
        .unwrap();
    let resume_at = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.create(&PostParams::default(), &config_map("after-1"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &config_map("after-2"))
        .await
        .unwrap();

    let params = WatchParams {
        bookmarks: true,
        ..WatchParams::default()
    };
    let mut events = api.watch(&params, &resume_at).await.unwrap().boxed();
    let mut added = Vec::new();
    let mut bookmark = None;
    while bookmark.is_none() {
        match events.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(object) => added.push(object.metadata.name.unwrap()),
            WatchEvent::Bookmark(mark) => bookmark = Some(mark.metadata.resource_version),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(added, ["after-1", "after-2"]);
    assert_eq!(bookmark.unwrap(), server.revision().to_string());
}

#[tokio::test]
async fn expired_resource_version_is_gone() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    api.create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    let old = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.create(&PostParams::default(), &config_map("b"))
        .await
        .unwrap();
    server.compact_history();

    let mut events = api
        .watch(&WatchParams::default(), &old)
        .await
        .unwrap()
        .boxed();
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Error(status)) => assert_eq!(status.code, 410),
        other => panic!("expected a 410 error event, got {other:?}"),
    }
    let exact = ListParams::default()
        .at(&old)
        .matching(kube::api::VersionMatch::Exact);
    assert_eq!(api_error(api.list(&exact).await.unwrap_err()).0, 410);
}

#[tokio::test]
async fn lists_are_paged_with_limit_and_continue() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    for name in ["e", "b", "a", "d", "c"] {
        api.create(&PostParams::default(), &config_map(name))
            .await
            .unwrap();
    }
    let names = |list: &kube::api::ObjectList<ConfigMap>| {
        list.items
            .iter()
            .filter_map(|cm| cm.metadata.name.clone())
            .collect::<Vec<_>>()
    };
    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(names(&first), ["a", "b"]);
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    let token = first.metadata.continue_.clone().expect("a continue token");
    let second = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(&second), ["c", "d"]);
    assert_eq!(second.metadata.remaining_item_count, Some(1));
    assert_eq!(
        second.metadata.resource_version, first.metadata.resource_version,
        "every page reports the first page's version"
    );
    let token = second.metadata.continue_.clone().expect("a continue token");
    let last = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(&last), ["e"]);
    assert!(last.metadata.continue_.is_none_or(|t| t.is_empty()));
    assert_eq!(last.metadata.remaining_item_count, None);

    // A selector hides the remaining count, as on the real server.
    let selected = api
        .list(&ListParams::default().limit(1).fields("metadata.name!=a"))
        .await
        .unwrap();
    assert_eq!(names(&selected), ["b"]);
    assert_eq!(selected.metadata.remaining_item_count, None);

    // A token this server did not issue is refused; an expired one is 410, which makes a
    // client start its list again.
    let bad = ListParams::default().limit(2).continue_token("not-a-token");
    assert_eq!(
        api_error(api.list(&bad).await.unwrap_err()),
        (400, "BadRequest".into())
    );
    let token = first.metadata.continue_.clone().unwrap();
    api.create(&PostParams::default(), &config_map("f"))
        .await
        .unwrap();
    server.compact_history();
    let expired = ListParams::default().limit(2).continue_token(&token);
    assert_eq!(
        api_error(api.list(&expired).await.unwrap_err()),
        (410, "Expired".into())
    );

    // kube-rs watchers list in pages: a reflector with pages of 2 holds all six.
    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(api.clone(), watcher::Config::default().page_size(2)),
    )
    .default_backoff()
    .applied_objects();
    let driver = tokio::spawn(stream.for_each(|_| async {}));
    support::apiserver::eventually(PATIENCE, "all six in the reflector", || {
        (reader.state().len() == 6).then_some(())
    })
    .await;
    let continued = server
        .requests()
        .iter()
        .filter(|r| !r.is_watch() && r.query.contains("limit=2") && r.query.contains("continue="))
        .count();
    assert!(continued >= 2, "the watcher followed the continue tokens");
    driver.abort();
}

#[tokio::test]
async fn reflector_relists_after_410_and_survives_dropped_watches() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    api.create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    let (reader, writer) = reflector::store();
    let stream = reflector(writer, watcher(api.clone(), watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    let driver = tokio::spawn(stream.for_each(|_| async {}));
    let has = |name: &'static str| {
        let reader = reader.clone();
        move || {
            reader
                .state()
                .iter()
                .any(|cm| cm.metadata.name.as_deref() == Some(name))
                .then_some(())
        }
    };
    support::apiserver::eventually(PATIENCE, "the reflector to list a", has("a")).await;

    // A cut watch is resumed: later objects still arrive.
    server.drop_watches();
    api.create(&PostParams::default(), &config_map("b"))
        .await
        .unwrap();
    support::apiserver::eventually(PATIENCE, "b after a dropped watch", has("b")).await;

    // Keep the watcher away while history moves on and is compacted: its version is now too old.
    let watches = RequestMatcher {
        watch: Some(true),
        ..RequestMatcher::default()
    };
    server.fail_matching(watches, 500, None);
    server.drop_watches();
    support::apiserver::eventually(PATIENCE, "a refused re-watch", || {
        server
            .requests()
            .iter()
            .any(|r| r.is_watch() && r.status == 500)
            .then_some(())
    })
    .await;
    api.create(&PostParams::default(), &config_map("c"))
        .await
        .unwrap();
    server.compact_history();
    let lists_before = server
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.ends_with("/configmaps") && !r.is_watch())
        .count();
    server.clear_failures();

    support::apiserver::eventually(PATIENCE, "c after a relist", has("c")).await;
    let lists_after = server
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.ends_with("/configmaps") && !r.is_watch())
        .count();
    assert!(lists_after > lists_before, "410 must trigger a relist");
    driver.abort();
}

#[tokio::test]
async fn field_and_label_selectors() {
    let server = FakeApiServer::start().await;
    server.seed(&running_pod(
        "a1",
        "node-a",
        json!({"app": "web", "tier": "front"}),
    ));
    server.seed(&running_pod("a2", "node-a", json!({"app": "db"})));
    server.seed(&running_pod("b1", "node-b", json!({"app": "web"})));
    let api: Api<Pod> = Api::default_namespaced(server.client());
    let names = |params: ListParams| {
        let api = api.clone();
        async move {
            let mut names: Vec<String> = api
                .list(&params)
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|pod| pod.metadata.name.unwrap())
                .collect();
            names.sort();
            names
        }
    };
    assert_eq!(
        names(ListParams::default().fields("spec.nodeName=node-a")).await,
        ["a1", "a2"]
    );
    assert_eq!(
        names(ListParams::default().fields("spec.nodeName!=node-a")).await,
        ["b1"]
    );
    assert_eq!(
        names(ListParams::default().fields("spec.nodeName==node-a,metadata.name=a2")).await,
        ["a2"]
    );
    assert_eq!(
        names(ListParams::default().labels("app=web")).await,
        ["a1", "b1"]
    );
    assert_eq!(
        names(ListParams::default().labels("app in (db,cache)")).await,
        ["a2"]
    );
    assert_eq!(
        names(ListParams::default().labels("app notin (db),!tier")).await,
        ["b1"]
    );
    assert_eq!(names(ListParams::default().labels("tier")).await, ["a1"]);
    assert_eq!(
        names(
            ListParams::default()
                .labels("app!=web")
                .fields("spec.nodeName=node-a")
        )
        .await,
        ["a2"]
    );
    let unsupported = api
        .list(&ListParams::default().fields("spec.priority=1"))
        .await
        .unwrap_err();
    assert_eq!(api_error(unsupported).0, 400);

    // A pod leaving a watched selection is seen as DELETED.
    let rv = server.revision().to_string();
    let mut events = api
        .watch(&WatchParams::default().fields("spec.nodeName=node-a"), &rv)
        .await
        .unwrap()
        .boxed();
    server.seed(&running_pod("a1", "node-c", json!({})));
    assert!(matches!(
        events.try_next().await.unwrap(),
        Some(WatchEvent::Deleted(_))
    ));
}

#[tokio::test]
async fn merge_json_and_strategic_patches() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    api.create(&PostParams::default(), &config_map("cm"))
        .await
        .unwrap();
    let merged = api
        .patch(
            "cm",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": null, "n": "1"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        merged.data.unwrap(),
        [("n".to_string(), "1".to_string())].into()
    );
    let strategic = api
        .patch(
            "cm",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(strategic.metadata.labels.unwrap()["x"], "y");

    let json_patch = |operations: Value| {
        http::Request::patch(format!(
            "{}/api/v1/namespaces/default/configmaps/cm",
            server.url()
        ))
        .header("content-type", "application/json-patch+json")
        .body(serde_json::to_vec(&operations).unwrap())
        .unwrap()
    };
    let client = server.client();
    let patched: ConfigMap = client
        .request(json_patch(json!([
            {"op": "test", "path": "/data/n", "value": "1"},
            {"op": "add", "path": "/data/m", "value": "2"},
            {"op": "remove", "path": "/data/n"},
        ])))
        .await
        .unwrap();
    assert_eq!(
        patched.data.unwrap(),
        [("m".to_string(), "2".to_string())].into()
    );
    let failed = client
        .request::<ConfigMap>(json_patch(
            json!([{"op": "test", "path": "/data/m", "value": "9"}]),
        ))
        .await
        .unwrap_err();
    assert_eq!(api_error(failed), (422, "Invalid".to_string()));
}

#[tokio::test]
async fn server_side_apply_tracks_owners_and_conflicts() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "1", "shared": "s"}});
    let created = api
        .patch("cm", &PatchParams::apply("alpha"), &Patch::Apply(&applied))
        .await
        .unwrap();
    assert_eq!(
        created.metadata.managed_fields.unwrap()[0]
            .manager
            .as_deref(),
        Some("alpha")
    );

    let mut rival = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "2"}});
    let conflict = api
        .patch("cm", &PatchParams::apply("beta"), &Patch::Apply(&rival))
        .await
        .unwrap_err();
    assert_eq!(api_error(conflict), (409, "Conflict".to_string()));
    // Applying an equal value is shared ownership, not a conflict.
    rival["data"] = json!({"shared": "s", "b": "1"});
    api.patch("cm", &PatchParams::apply("beta"), &Patch::Apply(&rival))
        .await
        .unwrap();
    rival["data"] = json!({"a": "2"});
    let forced = api
        .patch(
            "cm",
            &PatchParams::apply("beta").force(),
            &Patch::Apply(&rival),
        )
        .await
        .unwrap();
    assert_eq!(forced.data.as_ref().unwrap()["a"], "2");
    // beta dropped "b" (its own) but "shared" survives because alpha still owns it.
    assert_eq!(
        forced.data.unwrap().keys().cloned().collect::<Vec<_>>(),
        ["a", "shared"]
    );

    let missing_manager = http::Request::patch(format!(
        "{}/api/v1/namespaces/default/configmaps/cm",
        server.url()
    ))
    .header("content-type", "application/apply-patch+yaml")
    .body(serde_json::to_vec(&applied).unwrap())
    .unwrap();
    assert_eq!(
        api_error(
            server
                .client()
                .request::<ConfigMap>(missing_manager)
                .await
                .unwrap_err()
        )
        .0,
        422
    );
}

#[tokio::test]
async fn status_apply_owns_single_conditions_and_leaves_spec_alone() {
    let server = FakeApiServer::start().await;
    let nodes: Api<Node> = Api::all(server.client());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "node-a"}})).unwrap(),
        )
        .await
        .unwrap();
    let ready = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    nodes
        .patch_status(
            "node-a",
            &PatchParams::apply("kubelet"),
            &Patch::Apply(&ready),
        )
        .await
        .unwrap();
    let ours = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
        "spec": {"unschedulable": true},
        "status": {"conditions": [{"type": "NodekeeperMemoryPressure", "status": "True"}]}});
    let node = nodes
        .patch_status(
            "node-a",
            &PatchParams::apply("nodekeeper"),
            &Patch::Apply(&ours),
        )
        .await
        .unwrap();
    let types: Vec<String> = node
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert_eq!(types, ["Ready", "NodekeeperMemoryPressure"]);
    assert_eq!(
        node.spec.and_then(|spec| spec.unschedulable),
        None,
        "a status write must not touch spec"
    );

    let takeover = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
        "status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    let conflict = nodes
        .patch_status(
            "node-a",
            &PatchParams::apply("nodekeeper"),
            &Patch::Apply(&takeover),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(conflict).0, 409);

    // Main-resource writes cannot change status.
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    server.seed(&running_pod("web", "node-a", json!({})));
    let patched = pods
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"x": "1"}}, "status": {"phase": "Failed"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(patched.status.unwrap().phase.as_deref(), Some("Running"));
    let patched = pods
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"y": "1"}}, "status": {"phase": "Failed"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(patched.status.unwrap().phase.as_deref(), Some("Failed"));
    // The pod status strategy resets only the spec (and owner references): labels written
    // through `status` are kept. That is why NodeRestriction refuses kubelets "cannot
    // update labels through pod status", and why the agent's admission policy guards it.
    assert_eq!(
        patched
            .metadata
            .labels
            .unwrap()
            .get("y")
            .map(String::as_str),
        Some("1")
    );
}

#[tokio::test]
async fn injected_failures_and_latency_reach_the_client() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    api.create(&PostParams::default(), &config_map("cm"))
        .await
        .unwrap();
    server.fail_next(1, 500);
    assert_eq!(
        api_error(api.get("cm").await.unwrap_err()),
        (500, "InternalError".to_string())
    );
    api.get("cm").await.unwrap();

    server.fail_matching(RequestMatcher::method("PATCH"), 500, Some(1));
    api.get("cm").await.unwrap();
    let patch = Patch::Merge(json!({"data": {"x": "1"}}));
    assert_eq!(
        api_error(
            api.patch("cm", &PatchParams::default(), &patch)
                .await
                .unwrap_err()
        )
        .0,
        500
    );
    api.patch("cm", &PatchParams::default(), &patch)
        .await
        .unwrap();

    // kube retries 429, 503 and 504 on its own: the caller sees success, the log both attempts.
    server.clear_requests();
    server.fail_next(1, 503);
    api.get("cm").await.unwrap();
    let statuses: Vec<u16> = server
        .requests()
        .iter()
        .map(|request| request.status)
        .collect();
    assert_eq!(statuses, [503, 200]);

    server.set_latency(Duration::from_millis(300));
    let started = std::time::Instant::now();
    api.get("cm").await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn unreachable_server_comes_back_on_the_same_port() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    api.create(&PostParams::default(), &config_map("cm"))
        .await
        .unwrap();
    server.go_down().await;
    assert!(
        api.get("cm").await.is_err(),
        "a request to a server that is down must fail"
    );
    server.come_back().await;
    assert_eq!(
        api.get("cm").await.unwrap().metadata.name.as_deref(),
        Some("cm")
    );
}

#[tokio::test]
async fn request_log_names_rbac_verbs() {
    let server = FakeApiServer::start().await;
    server.seed(&running_pod("web", "node-a", json!({})));
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    pods.list(&ListParams::default().fields("spec.nodeName=node-a"))
        .await
        .unwrap();
    pods.patch_status("web", &PatchParams::apply("nodekeeper"), &Patch::Apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}, "status": {"conditions": [{"type": "DisruptionTarget", "status": "True"}]}}))).await.unwrap();
    pods.delete("web", &DeleteParams::default()).await.unwrap();
    let accesses: Vec<(String, String)> = server
        .rbac_accesses()
        .into_iter()
        .map(|access| (access.verb, access.resource))
        .collect();
    let expected = [
        ("delete", "pods"),
        ("list", "pods"),
        ("patch", "pods/status"),
    ]
    .map(|(verb, resource)| (verb.to_string(), resource.to_string()));
    assert_eq!(accesses, expected);
    let list = &server.requests()[0];
    assert_eq!(
        list.query_param("fieldSelector").as_deref(),
        Some("spec.nodeName=node-a")
    );
    let apply = &server.requests()[1];
    assert_eq!(
        apply.content_type.as_deref(),
        Some("application/apply-patch+yaml")
    );
    assert_eq!(
        apply.query_param("fieldManager").as_deref(),
        Some("nodekeeper")
    );
}

/// Tests wait for a change in the store, then read the log for the request that made it:
/// the request must be there by then. Patchers on the runtime's workers race the test's
/// own thread, which reads the store, then the log, as fast as it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_in_the_log_as_soon_as_its_effect_is_in_the_store() {
    const PATCHERS: usize = 6;
    const PATCHES: usize = 300;
    let server = FakeApiServer::start().await;
    let mut patching = Vec::new();
    for patcher in 0..PATCHERS {
        let name = format!("counter-{patcher}");
        server.seed(&config_map(&name));
        let api: Api<ConfigMap> = Api::default_namespaced(server.client());
        patching.push(tokio::spawn(async move {
            for n in 1..=PATCHES {
                let patch = Patch::Merge(json!({"data": {"k": n.to_string()}}));
                api.patch(&name, &PatchParams::default(), &patch)
                    .await
                    .unwrap();
            }
        }));
    }
    let mut reads = 0;
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            std::time::Instant::now() < give_up,
            "the patches never all landed"
        );
        let stored: usize = server
            .objects::<ConfigMap>()
            .iter()
            .filter_map(|map| map.data.as_ref()?.get("k")?.parse::<usize>().ok())
            .sum();
        let logged = server
            .requests()
            .iter()
            .filter(|request| request.method == "PATCH")
            .count();
        assert!(
            logged >= stored,
            "{stored} patches are in the store but only {logged} in the log"
        );
        reads += 1;
        if stored == PATCHERS * PATCHES {
            break;
        }
    }
    for patcher in patching {
        patcher.await.unwrap();
    }
    assert!(reads > 100, "the reads ran alongside the patches: {reads}");
}

#[tokio::test]
async fn custom_resources_discovery_and_kubeconfig() {
    let server = FakeApiServer::start().await;
    server.register(CustomResource {
        group: "nodekeeper.io".into(),
        version: "v1alpha1".into(),
        kind: "Fence".into(),
        plural: "fences".into(),
        namespaced: false,
        has_status: true,
    });
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("kubeconfig");
    server.write_kubeconfig(&path).unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();

    let gvk = GroupVersionKind::gvk("nodekeeper.io", "v1alpha1", "Fence");
    let (resource, _) = kube::discovery::pinned_kind(&client, &gvk).await.unwrap();
    assert_eq!(resource.plural, "fences");
    let fences: Api<DynamicObject> =
        Api::all_with(client, &ApiResource::from_gvk_with_plural(&gvk, "fences"));
    let fence: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "nodekeeper.io/v1alpha1", "kind": "Fence",
        "metadata": {"name": "f1"}, "spec": {"node": "node-a"}}),
    )
    .unwrap();
    fences.create(&PostParams::default(), &fence).await.unwrap();
    assert_eq!(
        fences.get("f1").await.unwrap().data["spec"]["node"],
        "node-a"
    );
}

// ---- service accounts: TokenRequest and TokenReview ----

const CONTROLLER_AUDIENCE: &str = "nodekeeper-controller";

fn api_failure(error: kube::Error) -> (u16, String, String) {
    match error {
        kube::Error::Api(status) => (status.code, status.reason.clone(), status.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn agent_pod(name: &str, service_account: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"serviceAccountName": service_account, "nodeName": node,
                 "containers": [{"name": "agent", "image": "nodekeeper"}]},
    }))
    .unwrap()
}

/// A ServiceAccount `agent`, a Node `node-a` and a pod `agent-1` running as `agent` on it.
async fn agent_fixture(server: &FakeApiServer) -> (ServiceAccount, Node, Pod) {
    let client = server.client();
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "agent"}})).unwrap();
    let account = Api::<ServiceAccount>::default_namespaced(client.clone())
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "node-a"}})).unwrap();
    let node = Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let pod = Api::<Pod>::default_namespaced(client)
        .create(
            &PostParams::default(),
            &agent_pod("agent-1", "agent", "node-a"),
        )
        .await
        .unwrap();
    (account, node, pod)
}

fn token_request(audiences: &[&str], bound: Option<(&str, &str, Option<&str>)>) -> TokenRequest {
    TokenRequest {
        spec: TokenRequestSpec {
            audiences: audiences
                .iter()
                .map(|audience| audience.to_string())
                .collect(),
            bound_object_ref: bound.map(|(kind, name, uid)| BoundObjectReference {
                api_version: Some("v1".to_string()),
                kind: Some(kind.to_string()),
                name: Some(name.to_string()),
                uid: uid.map(str::to_string),
            }),
            expiration_seconds: None,
        },
        ..TokenRequest::default()
    }
}

/// A token for `agent` bound to `pod` (uid included), for the controller's audience.
async fn pod_token(server: &FakeApiServer, pod: &Pod) -> String {
    let name = pod.metadata.name.as_deref().unwrap();
    projected_token(
        &server.client(),
        "default",
        "agent",
        name,
        Some(CONTROLLER_AUDIENCE),
    )
    .await
}

async fn review(server: &FakeApiServer, token: &str, audiences: &[&str]) -> TokenReviewStatus {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            audiences: Some(
                audiences
                    .iter()
                    .map(|audience| audience.to_string())
                    .collect(),
            ),
        },
        ..TokenReview::default()
    };
    Api::<TokenReview>::all(server.client())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap()
}

fn extra(status: &TokenReviewStatus, key: &str) -> Option<String> {
    let values = status.user.as_ref()?.extra.as_ref()?.get(key)?;
    assert_eq!(values.len(), 1, "{key}: {values:?}");
    values.first().cloned()
}

fn rejection(status: &TokenReviewStatus) -> String {
    assert_ne!(status.authenticated, Some(true), "{status:?}");
    status.error.clone().unwrap_or_default()
}

#[tokio::test]
async fn pod_bound_tokens_are_issued_and_reviewed_like_a_real_cluster() {
    let server = FakeApiServer::start().await;
    let (account, node, pod) = agent_fixture(&server).await;
    let accounts: Api<ServiceAccount> = Api::default_namespaced(server.client());
    let request = token_request(
        &[CONTROLLER_AUDIENCE],
        Some(("Pod", "agent-1", pod.metadata.uid.as_deref())),
    );
    let issued = accounts
        .create_token_request("agent", &PostParams::default(), &request)
        .await
        .unwrap();
    assert_eq!(issued.metadata.name.as_deref(), Some("agent"));
    assert_eq!(issued.spec.expiration_seconds, Some(3600));
    assert_eq!(issued.spec.audiences, [CONTROLLER_AUDIENCE]);
    let status = issued.status.unwrap();
    let lifetime = status
        .expiration_timestamp
        .0
        .duration_since(k8s_openapi::jiff::Timestamp::now());
    assert!((3590..=3600).contains(&lifetime.as_secs()), "{lifetime:?}");
    let token = status.token;
    let segments: Vec<&str> = token.split('.').collect();
    assert_eq!(segments.len(), 3, "{token}");
    assert!(segments.iter().all(|segment| {
        !segment.is_empty()
            && segment
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
    }));
    assert!(segments[0].starts_with("eyJ"), "a JSON header: {token}");
    assert_ne!(pod_token(&server, &pod).await, token, "tokens are random");

    let facts = server.issued_tokens();
    let fact = facts.iter().find(|fact| fact.token == token).unwrap();
    assert_eq!(
        fact.service_account.uid,
        account.metadata.uid.clone().unwrap()
    );
    assert_eq!(fact.pod.as_ref().unwrap().name, "agent-1");
    let node_fact = fact.node.as_ref().unwrap();
    assert_eq!(node_fact.name, "node-a");
    assert_eq!(node_fact.uid, node.metadata.uid.clone());

    let accepted = review(&server, &token, &[CONTROLLER_AUDIENCE, "other"]).await;
    assert_eq!(accepted.authenticated, Some(true), "{accepted:?}");
    assert_eq!(accepted.error, None);
    assert_eq!(
        accepted.audiences.as_deref(),
        Some(&[CONTROLLER_AUDIENCE.to_string()][..])
    );
    let user = accepted.user.clone().unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:default:agent")
    );
    assert_eq!(user.uid, account.metadata.uid);
    assert_eq!(
        user.groups.unwrap(),
        [
            "system:serviceaccounts",
            "system:serviceaccounts:default",
            "system:authenticated"
        ]
    );
    for (key, expected) in [
        ("pod-name", Some("agent-1".to_string())),
        ("pod-uid", pod.metadata.uid.clone()),
        ("node-name", Some("node-a".to_string())),
        ("node-uid", node.metadata.uid.clone()),
        ("credential-id", Some(format!("JTI={}", fact.credential_id))),
    ] {
        assert_eq!(
            extra(&accepted, &format!("authentication.kubernetes.io/{key}")),
            expected,
            "{key}"
        );
    }

    let wrong_audience = review(&server, &token, &["someone-else"]).await;
    assert_eq!(
        wrong_audience.authenticated, None,
        "false is omitted, as Go's omitempty does"
    );
    assert_eq!(
        rejection(&wrong_audience),
        r#"token audiences ["nodekeeper-controller"] is invalid for the target audiences ["someone-else"]"#
    );
    assert_eq!(wrong_audience.user.unwrap().username, None);
    let server_audience = review(&server, &token, &[]).await;
    assert_eq!(
        rejection(&server_audience),
        r#"token audiences ["nodekeeper-controller"] is invalid for the target audiences ["https://kubernetes.default.svc.cluster.local"]"#
    );

    let unknown = review(&server, "not-a-token", &[CONTROLLER_AUDIENCE]).await;
    assert_eq!(rejection(&unknown), "invalid bearer token");
    let mut forged = token.clone();
    let last = forged.pop().unwrap();
    forged.push(if last == 'A' { 'B' } else { 'A' });
    let forged = review(&server, &forged, &[CONTROLLER_AUDIENCE]).await;
    assert_eq!(rejection(&forged), "invalid bearer token");

    let accesses = server.rbac_accesses();
    for (verb, group, resource) in [
        ("create", "", "serviceaccounts/token"),
        ("create", "authentication.k8s.io", "tokenreviews"),
    ] {
        assert!(
            accesses.contains(&RbacAccess {
                verb: verb.to_string(),
                group: group.to_string(),
                resource: resource.to_string(),
            }),
            "{accesses:?}"
        );
    }
    assert!(
        server
            .requests()
            .iter()
            .any(|request| request.method == "POST"
                && request.path == "/api/v1/namespaces/default/serviceaccounts/agent/token"
                && request.status == 201)
    );
    assert!(
        server
            .requests()
            .iter()
            .any(|request| request.method == "POST"
                && request.path == "/apis/authentication.k8s.io/v1/tokenreviews"
                && request.status == 201)
    );
}

#[tokio::test]
async fn service_accounts_and_token_apis_are_discoverable() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let core = client.list_core_api_resources("v1").await.unwrap();
    let accounts = core
        .resources
        .iter()
        .find(|resource| resource.name == "serviceaccounts")
        .unwrap();
    assert!(accounts.namespaced);
    assert_eq!(accounts.kind, "ServiceAccount");
    let token = core
        .resources
        .iter()
        .find(|resource| resource.name == "serviceaccounts/token")
        .unwrap();
    assert_eq!(token.kind, "TokenRequest");
    assert_eq!(token.group.as_deref(), Some("authentication.k8s.io"));
    assert_eq!(token.verbs, ["create"]);

    let authentication = client
        .list_api_group_resources("authentication.k8s.io/v1")
        .await
        .unwrap();
    let reviews = authentication
        .resources
        .iter()
        .find(|resource| resource.name == "tokenreviews")
        .unwrap();
    assert!(!reviews.namespaced);
    assert_eq!(reviews.kind, "TokenReview");
    assert_eq!(reviews.verbs, ["create"]);
    let groups = client.list_api_groups().await.unwrap();
    assert!(
        groups
            .groups
            .iter()
            .any(|group| group.name == "authentication.k8s.io")
    );

    // Create-only: a list is refused as the real server refuses it.
    let list = Api::<TokenReview>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert_eq!(api_error(list), (405, "MethodNotAllowed".to_string()));
}

#[tokio::test]
async fn deleted_or_replaced_pods_and_service_accounts_invalidate_tokens() {
    let server = FakeApiServer::start().await;
    let (_, _, pod) = agent_fixture(&server).await;
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let token = pod_token(&server, &pod).await;

    // A graceful deletion still running: the pod is there, its token still works.
    pods.delete("agent-1", &DeleteParams::default())
        .await
        .unwrap();
    let terminating = review(&server, &token, &[CONTROLLER_AUDIENCE]).await;
    assert_eq!(terminating.authenticated, Some(true), "{terminating:?}");
    assert!(server.finalize::<Pod>("default", "agent-1"));
    let deleted = review(&server, &token, &[CONTROLLER_AUDIENCE]).await;
    assert_eq!(
        rejection(&deleted),
        "service account token has been invalidated"
    );

    let replacement = pods
        .create(
            &PostParams::default(),
            &agent_pod("agent-1", "agent", "node-a"),
        )
        .await
        .unwrap();
    let replaced = review(&server, &token, &[CONTROLLER_AUDIENCE]).await;
    assert_eq!(
        rejection(&replaced),
        format!(
            "pod UID ({}) does not match service account pod ref claim ({})",
            replacement.metadata.uid.clone().unwrap(),
            pod.metadata.uid.clone().unwrap()
        )
    );

    let token = pod_token(&server, &replacement).await;
    let accounts: Api<ServiceAccount> = Api::default_namespaced(server.client());
    let old_account = accounts
        .delete("agent", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    let orphaned = review(&server, &token, &[CONTROLLER_AUDIENCE]).await;
    assert_eq!(rejection(&orphaned), r#"serviceaccounts "agent" not found"#);
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "agent"}})).unwrap();
    let new_account = accounts
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let recreated = review(&server, &token, &[CONTROLLER_AUDIENCE]).await;
    assert_eq!(
        rejection(&recreated),
        format!(
            "service account UID ({}) does not match claim ({})",
            new_account.metadata.uid.unwrap(),
            old_account.metadata.uid.unwrap()
        )
    );
}

#[tokio::test]
async fn node_info_knob_node_bound_tokens_and_expiry() {
    let server = FakeApiServer::start().await;
    let (_, node, pod) = agent_fixture(&server).await;

    server.set_token_node_info(false);
    let without_node = pod_token(&server, &pod).await;
    let status = review(&server, &without_node, &[CONTROLLER_AUDIENCE]).await;
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    assert_eq!(
        extra(&status, "authentication.kubernetes.io/pod-name").as_deref(),
        Some("agent-1")
    );
    assert_eq!(
        extra(&status, "authentication.kubernetes.io/node-name"),
        None
    );
    assert_eq!(
        extra(&status, "authentication.kubernetes.io/node-uid"),
        None
    );
    server.set_token_node_info(true);

    // The pod's node has no Node object: its name is still claimed, without a uid.
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let elsewhere = pods
        .create(
            &PostParams::default(),
            &agent_pod("agent-2", "agent", "node-gone"),
        )
        .await
        .unwrap();
    let status = review(
        &server,
        &pod_token(&server, &elsewhere).await,
        &[CONTROLLER_AUDIENCE],
    )
    .await;
    assert_eq!(
        extra(&status, "authentication.kubernetes.io/node-name").as_deref(),
        Some("node-gone")
    );
    assert_eq!(
        extra(&status, "authentication.kubernetes.io/node-uid"),
        None
    );

    // Bound to the Node itself: node extras, no pod extras; deleting the Node invalidates it.
    let accounts: Api<ServiceAccount> = Api::default_namespaced(server.client());
    let node_token = accounts
        .create_token_request(
            "agent",
            &PostParams::default(),
            &token_request(&[CONTROLLER_AUDIENCE], Some(("Node", "node-a", None))),
        )
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let status = review(&server, &node_token, &[CONTROLLER_AUDIENCE]).await;
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    assert_eq!(
        extra(&status, "authentication.kubernetes.io/node-uid"),
        node.metadata.uid
    );
    assert_eq!(
        extra(&status, "authentication.kubernetes.io/pod-name"),
        None
    );

    // No audiences: the server's own, which a review without audiences accepts.
    let unbound = accounts
        .create_token_request("agent", &PostParams::default(), &token_request(&[], None))
        .await
        .unwrap();
    assert_eq!(unbound.spec.audiences, [support::apiserver::API_AUDIENCE]);
    let unbound = unbound.status.unwrap().token;
    let status = review(&server, &unbound, &[]).await;
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    assert_eq!(
        extra(&status, "authentication.kubernetes.io/pod-name"),
        None
    );
    assert!(extra(&status, "authentication.kubernetes.io/credential-id").is_some());

    let pod_bound = pod_token(&server, &pod).await;
    server.expire_tokens();
    for token in [&pod_bound, &node_token] {
        let expired = review(&server, token, &[CONTROLLER_AUDIENCE]).await;
        assert_eq!(rejection(&expired), "service account token has expired");
    }
    let fresh = pod_token(&server, &pod).await;
    let status = review(&server, &fresh, &[CONTROLLER_AUDIENCE]).await;
    assert_eq!(
        status.authenticated,
        Some(true),
        "tokens issued later are fresh: {status:?}"
    );

    Api::<Node>::all(server.client())
        .delete("node-a", &DeleteParams::default())
        .await
        .unwrap();
    let node_token = accounts
        .create_token_request(
            "agent",
            &PostParams::default(),
            &token_request(&[CONTROLLER_AUDIENCE], Some(("Node", "node-a", None))),
        )
        .await
        .unwrap_err();
    assert_eq!(
        api_failure(node_token),
        (
            404,
            "NotFound".to_string(),
            r#"nodes "node-a" not found"#.to_string()
        )
    );
}

#[tokio::test]
async fn token_requests_are_refused_as_the_real_server_refuses_them() {
    let server = FakeApiServer::start().await;
    let (_, _, pod) = agent_fixture(&server).await;
    let accounts: Api<ServiceAccount> = Api::default_namespaced(server.client());
    let refuse = |request: TokenRequest, account: &'static str| {
        let accounts = accounts.clone();
        async move {
            api_failure(
                accounts
                    .create_token_request(account, &PostParams::default(), &request)
                    .await
                    .unwrap_err(),
            )
        }
    };

    assert_eq!(
        refuse(token_request(&[CONTROLLER_AUDIENCE], None), "ghost").await,
        (
            404,
            "NotFound".to_string(),
            r#"serviceaccounts "ghost" not found"#.to_string()
        )
    );

    let mut short = token_request(&[CONTROLLER_AUDIENCE], None);
    short.spec.expiration_seconds = Some(60);
    assert_eq!(
        refuse(short, "agent").await,
        (
            422,
            "Invalid".to_string(),
            r#"TokenRequest.authentication.k8s.io "" is invalid: spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 10 minutes"#
                .to_string()
        )
    );

    assert_eq!(
        refuse(
            token_request(&[CONTROLLER_AUDIENCE], Some(("Pod", "missing", None))),
            "agent"
        )
        .await,
        (
            404,
            "NotFound".to_string(),
            r#"pods "missing" not found"#.to_string()
        )
    );

    let (code, reason, message) = refuse(
        token_request(
            &[CONTROLLER_AUDIENCE],
            Some(("Pod", "agent-1", Some("stale-uid"))),
        ),
        "agent",
    )
    .await;
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert_eq!(
        message,
        r#"Operation cannot be fulfilled on Pod "agent-1": the UID in the bound object reference (stale-uid) does not match the UID in record. The object might have been deleted and then recreated"#
    );

    let other: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "other"}})).unwrap();
    accounts
        .create(&PostParams::default(), &other)
        .await
        .unwrap();
    assert_eq!(
        refuse(
            token_request(&[CONTROLLER_AUDIENCE], Some(("Pod", "agent-1", pod.metadata.uid.as_deref()))),
            "other"
        )
        .await,
        (
            400,
            "BadRequest".to_string(),
            r#"cannot bind token for serviceaccount "other" to pod running with different serviceaccount name."#
                .to_string()
        )
    );

    assert_eq!(
        refuse(
            token_request(
                &[CONTROLLER_AUDIENCE],
                Some(("ConfigMap", "settings", None))
            ),
            "agent"
        )
        .await,
        (
            400,
            "BadRequest".to_string(),
            "cannot bind token to object of type /v1, Kind=ConfigMap".to_string()
        )
    );

    let empty = TokenReview::default();
    let error = Api::<TokenReview>::all(server.client())
        .create(&PostParams::default(), &empty)
        .await
        .unwrap_err();
    assert_eq!(
        api_failure(error),
        (
            400,
            "BadRequest".to_string(),
            "token is required for TokenReview in authentication".to_string()
        )
    );
    assert!(server.issued_tokens().is_empty());
}
