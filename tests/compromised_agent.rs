//! A compromised agent (docs/security.md). Someone with root on one node holds what that
//! node's agent holds: its ServiceAccount token for the API server and its report token
//! for the controller, both valid. They must be able to hurt only that node: not get
//! another node fenced, tainted out of service or marked NotReady, nor its pods deleted.
//!
//! The agent's rights are the shipped manifests (packaging/kubernetes/agent: RBAC and the
//! ValidatingAdmissionPolicy), applied as an operator applies them; the tokens come from
//! the TokenRequest API, bound to the agent's pod, as the kubelet gets them. The API
//! server is the wire-level fake, which authenticates bearer tokens, authorizes them by
//! the stored RBAC and applies stored admission policies; with
//! `NODEKEEPER_REAL_CLUSTER=1` the first test runs against the cluster in `KUBECONFIG`
//! (Kubernetes 1.30 or later), where it creates two Node objects of its own.

mod support;

use std::path::Path;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use nodekeeper::kubernetes::api::ApiWriter;
use nodekeeper::kubernetes::outbox::{ApiAction, ConditionRecord, Outcome, PodRef, TaintRecord};
use serde_json::{Value, json};

use support::apiserver::{TestCluster, cluster, projected_token};
use support::reports::post_report;

const AGENTS_NAMESPACE: &str = "nodekeeper-system";
const AGENT_ACCOUNT: &str = "nodekeeper-agent";
const REPORT_AUDIENCE: &str = "nodekeeper-controller";
const FIELD_MANAGER: &str = "nodekeeper-test";

/// The agent's manifests that grant or limit its rights, as `kubectl apply` installs them.
const AGENT_MANIFESTS: [&str; 3] = [
    "agent/namespace.yaml",
    "agent/rbac.yaml",
    "agent/admission-policy.yaml",
];

fn api_resource(object: &Value) -> (ApiResource, bool) {
    let api_version = object["apiVersion"].as_str().expect("apiVersion");
    let kind = object["kind"].as_str().expect("kind");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let (plural, namespaced) = match kind {
        "Namespace" => ("namespaces", false),
        "ServiceAccount" => ("serviceaccounts", true),
        "ClusterRole" => ("clusterroles", false),
        "ClusterRoleBinding" => ("clusterrolebindings", false),
        "Role" => ("roles", true),
        "RoleBinding" => ("rolebindings", true),
        "ValidatingAdmissionPolicy" => ("validatingadmissionpolicies", false),
        "ValidatingAdmissionPolicyBinding" => ("validatingadmissionpolicybindings", false),
        other => panic!("the agent's manifests hold a {other}, which this test cannot apply"),
    };
    let resource = ApiResource {
        group: group.to_string(),
        version: version.to_string(),
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        plural: plural.to_string(),
    };
    (resource, namespaced)
}

/// Server-side applies every object of [`AGENT_MANIFESTS`].
async fn install_agent_rights(client: &kube::Client) {
    let packaging = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/kubernetes");
    for file in AGENT_MANIFESTS {
        let text = std::fs::read_to_string(packaging.join(file)).expect("a manifest");
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let object: Value = serde::Deserialize::deserialize(document).expect("YAML");
            if object.is_null() {
                continue;
            }
            let (resource, namespaced) = api_resource(&object);
            let name = object["metadata"]["name"].as_str().expect("a name");
            let api: Api<DynamicObject> = if namespaced {
                let namespace = object["metadata"]["namespace"].as_str().expect("namespace");
                Api::namespaced_with(client.clone(), namespace, &resource)
            } else {
                Api::all_with(client.clone(), &resource)
            };
            api.patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&object),
            )
            .await
            .unwrap_or_else(|error| panic!("applying {file} {name}: {error}"));
        }
    }
}

/// A name unique to this run, so a real cluster's objects of an earlier run never clash.
fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos())
        .unwrap_or_default();
    format!("{prefix}-{}-{nanos:x}", std::process::id())
}

/// A Ready node with the taint `dedicated=db:NoSchedule`, as another team set it.
async fn create_node(admin: &kube::Client, name: &str) -> Node {
    let nodes: Api<Node> = Api::all(admin.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "tier": "db"}},
        "spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]},
    }))
    .expect("a node");
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("create a node");
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastTransitionTime": now, "lastHeartbeatTime": now,
    }]}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("a Ready node")
}

async fn create_pod(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    node: &str,
    account: Option<&str>,
) -> Pod {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), namespace);
    let mut spec = json!({"nodeName": node, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]});
    if let Some(account) = account {
        spec["serviceAccountName"] = json!(account);
    }
    let pod: Pod =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("a pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create a pod")
}

/// A real API server takes in new RBAC and admission policies a moment after they are
/// written: waits until a dry-run delete of `other_node_pod` with the agent's token is
/// refused by the policy.
async fn policy_in_force(agent: &kube::Client, namespace: &str, other_node_pod: &Pod) {
    let pods: Api<Pod> = Api::namespaced(agent.clone(), namespace);
    let name = other_node_pod.metadata.name.as_deref().unwrap_or_default();
    let dry_run = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match pods.delete(name, &dry_run).await {
            Err(kube::Error::Api(status))
                if status.code == 403 && status.message.contains("nodekeeper agent") =>
            {
                return;
            }
            other => assert!(
                std::time::Instant::now() < deadline,
                "the agent's admission policy is not in force after 60 s: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A client that presents `token` and nothing else, at the cluster's address.
async fn client_with_token(cluster: &TestCluster, token: &str) -> kube::Client {
    let mut config = match cluster.fake() {
        Some(server) => kube::Config::new(server.url().parse().expect("a URI")),
        None => kube::Config::infer()
            .await
            .expect("the real cluster's configuration"),
    };
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_string().into()),
        ..kube::config::AuthInfo::default()
    };
    kube::Client::try_from(config).expect("a client with the agent's token")
}

fn pod_ref(pod: &Pod) -> PodRef {
    PodRef {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
    }
}

fn condition(condition_type: &str, status: bool) -> ConditionRecord {
    ConditionRecord {
        condition_type: condition_type.to_string(),
        status,
        reason: "Test".to_string(),
        message: "written by tests/compromised_agent.rs".to_string(),
        last_transition: SystemTime::now(),
        last_heartbeat: Some(SystemTime::now()),
    }
}

/// What the agent writes for its node in one eviction: its condition and taint on the
/// node, the pod's `DisruptionTarget`, the pod's deletion.
fn agent_work(pod: &Pod, taint: &str) -> [ApiAction; 4] {
    [
        ApiAction::SetNodeConditions(vec![condition("NodekeeperMemoryPressure", true)]),
        ApiAction::SetNodeTaints(vec![TaintRecord {
            key: taint.to_string(),
            effect: "NoSchedule".to_string(),
        }]),
        ApiAction::SetPodCondition {
            pod: pod_ref(pod),
            condition: ConditionRecord {
                last_heartbeat: None,
                ..condition("DisruptionTarget", true)
            },
        },
        ApiAction::DeletePod {
            pod: pod_ref(pod),
            grace_period_seconds: 30,
        },
    ]
}

/// The API server's refusal of a call, as `code reason: message`.
fn refusal<T>(result: Result<T, kube::Error>, what: &str) -> String {
    match result {
        Err(kube::Error::Api(status)) => {
            format!("{} {}: {}", status.code, status.reason, status.message)
        }
        Err(other) => panic!("{what}: expected the API server to refuse it, got {other}"),
        Ok(_) => panic!("{what}: the API server allowed it"),
    }
}

fn assert_forbidden(refused: &str, what: &str, message_part: &str) {
    assert!(
        refused.starts_with("403 Forbidden"),
        "{what} must be forbidden, got {refused}"
    );
    assert!(
        refused.contains(message_part),
        "{what}: {message_part:?} not in {refused:?}"
    );
}

fn taint_keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|spec| spec.taints.as_ref())
        .into_iter()
        .flatten()
        .map(|taint| taint.key.clone())
        .collect()
}

fn condition_status(node: &Node, condition_type: &str) -> Option<String> {
    node.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|condition| condition.type_ == condition_type)
        .map(|condition| condition.status.clone())
}

/// Ready `False` since an hour ago: what would get a node without an agent fenced at once.
fn not_ready_for_an_hour() -> Value {
    let an_hour_ago = k8s_openapi::jiff::Timestamp::now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(3600))
        .expect("an hour ago")
        .to_string();
    json!({"status": {"conditions": [{
        "type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "forged",
        "lastTransitionTime": an_hour_ago, "lastHeartbeatTime": an_hour_ago,
    }]}})
}

fn out_of_service(node: &Node) -> Value {
    let mut taints: Vec<Value> = node
        .spec
        .as_ref()
        .and_then(|spec| spec.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|taint| serde_json::to_value(taint).expect("a taint"))
        .collect();
    taints.push(json!({"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}));
    json!({"spec": {"taints": taints}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_own_token_changes_only_its_own_node() {
    let cluster = cluster().await;
    let admin = cluster.client();
    let namespace = cluster.namespace();
    install_agent_rights(&admin).await;

    let (own, other) = (unique("nk-own"), unique("nk-other"));
    create_node(&admin, &own).await;
    let other_before = create_node(&admin, &other).await;
    let agent_pod = unique("nodekeeper-agent");
    create_pod(
        &admin,
        AGENTS_NAMESPACE,
        &agent_pod,
        &own,
        Some(AGENT_ACCOUNT),
    )
    .await;
    let own_web = create_pod(&admin, &namespace, &unique("web"), &own, None).await;
    let own_api = create_pod(&admin, &namespace, &unique("api"), &own, None).await;
    let other_db = create_pod(&admin, &namespace, &unique("db"), &other, None).await;

    // The token the kubelet mounts into the agent's pod (the API server's audience).
    let token = projected_token(&admin, AGENTS_NAMESPACE, AGENT_ACCOUNT, &agent_pod, None).await;
    let agent = client_with_token(&cluster, &token).await;
    if cluster.fake().is_none() {
        policy_in_force(&agent, &namespace, &other_db).await;
    }

    // The agent's own work, through the agent's own code: allowed.
    let own_writer = ApiWriter::new(agent.clone(), own.clone());
    let allowed = agent_work(&own_web, "nodekeeper.io/memory-pressure");
    for action in &allowed {
        let outcome = own_writer.execute(action).await;
        assert_eq!(outcome, Outcome::Done, "the agent's own {action:?}");
    }
    let nodes: Api<Node> = Api::all(admin.clone());
    let own_node = nodes.get(&own).await.expect("the agent's node");
    let admin_pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let web = admin_pods
        .get_opt(own_web.metadata.name.as_deref().unwrap_or_default())
        .await
        .expect("read the agent's node's pod");
    assert!(
        web.is_none_or(|web| web.metadata.deletion_timestamp.is_some()),
        "the pod on the agent's own node is being deleted"
    );
    assert!(taint_keys(&own_node).contains(&"nodekeeper.io/memory-pressure".to_string()));
    assert_eq!(
        condition_status(&own_node, "NodekeeperMemoryPressure").as_deref(),
        Some("True")
    );

    // The same code pointed at another node: refused.
    let other_writer = ApiWriter::new(agent.clone(), other.clone());
    let pod_refused =
        format!("may only delete or update pods bound to its own node, not to {other}");
    let node_refused = format!("may not change node {other}");
    for action in agent_work(&other_db, "nodekeeper.io/shutting-down") {
        let expected = match action {
            ApiAction::SetPodCondition { .. } | ApiAction::DeletePod { .. } => &pod_refused,
            _ => &node_refused,
        };
        let outcome = other_writer.execute(&action).await;
        assert!(
            matches!(&outcome, Outcome::Rejected(why) if why.contains(expected.as_str())),
            "{action:?} against another node: {outcome:?}, not refused with {expected:?}"
        );
    }

    // Whatever else the token is tried for.
    let pods: Api<Pod> = Api::namespaced(agent.clone(), &namespace);
    let agent_nodes: Api<Node> = Api::all(agent.clone());
    let merge = PatchParams::default();
    let other_name = other_db.metadata.name.clone().unwrap_or_default();
    let not_other_node = format!("may not change node {other}");
    let attempts: Vec<(&str, String, &str)> = vec![
        (
            "deleting another node's pod",
            refusal(pods.delete(&other_name, &DeleteParams::default()).await, "delete"),
            "may only delete or update pods bound to its own node, not to",
        ),
        (
            "force-deleting another node's pod",
            refusal(
                pods.delete(&other_name, &DeleteParams::default().grace_period(0)).await,
                "force delete",
            ),
            "pods bound to its own node",
        ),
        (
            "evicting another node's pod",
            refusal(
                pods.evict(&other_name, &Default::default()).await,
                "eviction",
            ),
            "cannot create resource \"pods/eviction\"",
        ),
        (
            "marking another node NotReady",
            refusal(
                agent_nodes
                    .patch_status(&other, &merge, &Patch::Merge(&not_ready_for_an_hour()))
                    .await,
                "NotReady",
            ),
            &not_other_node,
        ),
        (
            "tainting another node out of service",
            refusal(
                agent_nodes
                    .patch(&other, &merge, &Patch::Merge(&out_of_service(&other_before)))
                    .await,
                "out-of-service",
            ),
            &not_other_node,
        ),
        (
            "removing another node's taints",
            refusal(
                agent_nodes
                    .patch(&other, &merge, &Patch::Merge(&json!({"spec": {"taints": []}})))
                    .await,
                "untaint",
            ),
            &not_other_node,
        ),
        (
            "tainting its own node out of service",
            refusal(
                agent_nodes
                    .patch(&own, &merge, &Patch::Merge(&out_of_service(&own_node)))
                    .await,
                "own out-of-service",
            ),
            "may only add or remove nodekeeper.io/ taints",
        ),
        (
            "relabelling its own node",
            refusal(
                agent_nodes
                    .patch(
                        &own,
                        &merge,
                        &Patch::Merge(&json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}})),
                    )
                    .await,
                "label",
            ),
            "may not change labels or annotations",
        ),
        (
            "relabelling its own node through its status",
            refusal(
                agent_nodes
                    .patch_status(
                        &own,
                        &merge,
                        &Patch::Merge(&json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}})),
                    )
                    .await,
                "status label",
            ),
            "may not change labels or annotations",
        ),
        (
            "relabelling a pod of its own node into another Service",
            refusal(
                pods.patch_status(
                    own_api.metadata.name.as_deref().unwrap_or_default(),
                    &merge,
                    &Patch::Merge(&json!({"metadata": {"labels": {"app": "payments"}}})),
                )
                .await,
                "pod label",
            ),
            "may not change labels or annotations",
        ),
        (
            "marking its own node NotReady",
            refusal(
                agent_nodes
                    .patch_status(&own, &merge, &Patch::Merge(&not_ready_for_an_hour()))
                    .await,
                "own NotReady",
            ),
            "may only set the Nodekeeper* conditions",
        ),
        (
            "reading the fence credentials",
            refusal(
                Api::<Secret>::all(agent.clone()).list(&Default::default()).await,
                "secrets",
            ),
            "cannot list resource \"secrets\"",
        ),
        (
            "renewing another node's Lease",
            refusal(
                Api::<Lease>::namespaced(agent.clone(), "kube-node-lease")
                    .patch(
                        &other,
                        &merge,
                        &Patch::Merge(&json!({"spec": {"renewTime": "2026-01-01T00:00:00.000000Z"}})),
                    )
                    .await,
                "lease",
            ),
            "cannot patch resource \"leases\"",
        ),
        (
            "creating a pod on another node",
            refusal(
                pods.create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({
                        "metadata": {"name": "intruder"},
                        "spec": {"nodeName": other, "containers": [{"name": "c", "image": "x"}]}
                    }))
                    .expect("a pod"),
                )
                .await,
                "create pod",
            ),
            "cannot create resource \"pods\"",
        ),
    ];
    for (what, refused, message_part) in &attempts {
        assert_forbidden(refused, what, message_part);
    }

    // Nothing of the other node changed.
    let other_after = nodes.get(&other).await.expect("the other node");
    // (A real API server's own node.kubernetes.io/ taints come and go on a Node no kubelet
    // runs.)
    let taints: Vec<String> = taint_keys(&other_after)
        .into_iter()
        .filter(|key| !key.starts_with("node.kubernetes.io/"))
        .collect();
    assert_eq!(taints, vec!["dedicated".to_string()]);
    assert_eq!(
        condition_status(&other_after, "Ready").as_deref(),
        Some("True")
    );
    assert_eq!(
        condition_status(&other_after, "NodekeeperMemoryPressure"),
        None
    );
    assert_eq!(other_after.metadata.labels, other_before.metadata.labels);
    let db = admin_pods
        .get(&other_name)
        .await
        .expect("the other node's pod is still there");
    assert!(db.metadata.deletion_timestamp.is_none());
    assert!(
        db.status
            .and_then(|status| status.conditions)
            .unwrap_or_default()
            .is_empty(),
        "no condition was set on the other node's pod"
    );
    println!(
        "compromised agent of {own}: its own work allowed ({} writes), {} attempts against \
         other nodes or beyond its rights refused",
        allowed.len(),
        attempts.len() + 4
    );

    if cluster.fake().is_none() {
        // No kubelet ends these pods: delete them at once.
        let now = DeleteParams::default().grace_period(0);
        for pod in [&own_web, &own_api, &other_db] {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let _ = admin_pods.delete(name, &now).await;
        }
        let _ = Api::<Pod>::namespaced(admin.clone(), AGENTS_NAMESPACE)
            .delete(&agent_pod, &now)
            .await;
        for name in [&own, &other] {
            let _ = nodes.delete(name, &DeleteParams::default()).await;
        }
    }
}

/// A report saying `node` drained cleanly and shut down: over TLS, what gets a node's
/// pods released without a fence.
fn report(node: &str) -> Value {
    json!({
        "version": "1.1", "node": node, "bootId": "5d0c6f8e-1111-4222-8333-944455556666",
        "bootTime": "2026-11-20T08:00:00Z", "sequence": 1, "agentVersion": "test",
        "intervalMillis": 1000, "sentAt": "2026-11-24T05:00:00Z", "trigger": "shutdown",
        "conditions": [],
        "shutdown": {"state": "complete", "lockHeld": false, "allPodsStopped": true},
        "apiServer": {"state": "reachable"}, "isolation": {"state": "none"}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compromised_agent_cannot_get_a_healthy_node_fenced() {
    use support::controller::{
        ControllerProcess, controller_config, crd, enabled_fabric, fence_of, node, seed_database,
        seed_fence_steps,
    };
    require!(
        "fence_dummy (fence-agents)",
        support::controller::fence_agents()
    );
    let cluster = cluster().await;
    let server = require!(
        "the fake API server",
        support::apiserver::fake_only(&cluster)
    );
    let dir = tempfile::tempdir().expect("a temporary directory");
    server.register(crd());
    let since = k8s_openapi::jiff::Timestamp::now();
    for name in ["worker-1", "worker-2", "worker-3"] {
        server.seed(&node(name, "True", since));
    }
    // worker-2 runs a database and has no agent: the controller judges it by its Ready
    // condition, and would isolate it from its storage after unhealthyDuration (2 s).
    let fabric = enabled_fabric(dir.path());
    seed_database(server, "worker-2", "db-0");
    seed_fence_steps(
        server,
        "worker-2",
        9,
        &fabric,
        "isolation=fabric-off\nrecovery=fabric-on",
    );
    let admin = server.client();
    install_agent_rights(&admin).await;
    create_pod(
        &admin,
        AGENTS_NAMESPACE,
        "agent-w1",
        "worker-1",
        Some(AGENT_ACCOUNT),
    )
    .await;
    let api_token =
        projected_token(&admin, AGENTS_NAMESPACE, AGENT_ACCOUNT, "agent-w1", None).await;
    let report_token = projected_token(
        &admin,
        AGENTS_NAMESPACE,
        AGENT_ACCOUNT,
        "agent-w1",
        Some(REPORT_AUDIENCE),
    )
    .await;
    let agent = client_with_token(&cluster, &api_token).await;

    let controller =
        ControllerProcess::start(dir.path(), server, &controller_config(dir.path(), ""));
    controller.synced().await;

    // worker-1's agent, with its own credentials, against worker-2.
    let nodes: Api<Node> = Api::all(agent.clone());
    let merge = PatchParams::default();
    let worker_2: Node = server.object("", "worker-2").expect("worker-2");
    let fences = ApiResource {
        group: "fencing.nodekeeper.io".to_string(),
        version: "v1alpha1".to_string(),
        api_version: "fencing.nodekeeper.io/v1alpha1".to_string(),
        kind: "NodeFence".to_string(),
        plural: "nodefences".to_string(),
    };
    let forced_fence: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "fencing.nodekeeper.io/v1alpha1", "kind": "NodeFence",
        "metadata": {"name": "worker-2"}, "spec": {"nodeName": "worker-2", "force": true}
    }))
    .expect("a NodeFence");
    let attempts = [
        (
            "marking worker-2 NotReady for an hour",
            refusal(
                nodes
                    .patch_status("worker-2", &merge, &Patch::Merge(&not_ready_for_an_hour()))
                    .await,
                "NotReady",
            ),
            "may not change node worker-2",
        ),
        (
            "tainting worker-2 out of service",
            refusal(
                nodes
                    .patch(
                        "worker-2",
                        &merge,
                        &Patch::Merge(&out_of_service(&worker_2)),
                    )
                    .await,
                "out-of-service",
            ),
            "may not change node worker-2",
        ),
        (
            "asking for a forced fence of worker-2",
            refusal(
                Api::<DynamicObject>::all_with(agent.clone(), &fences)
                    .create(&PostParams::default(), &forced_fence)
                    .await,
                "NodeFence",
            ),
            "cannot create resource \"nodefences\"",
        ),
    ];
    for (what, refused, message_part) in &attempts {
        assert_forbidden(refused, what, message_part);
    }
    // The report token is for the controller only: the API server does not take it.
    let with_report_token = client_with_token(&cluster, &report_token).await;
    let refused = refusal(
        Api::<Node>::all(with_report_token)
            .list(&Default::default())
            .await,
        "the report token on the API",
    );
    assert!(refused.starts_with("401"), "{refused}");
    // The report channel: worker-1's report token speaks for worker-1 only, and the API
    // token is not a report token.
    let address = controller.reports_address();
    for (token, expected) in [(&report_token, 403), (&api_token, 401)] {
        let (code, answer) = post_report(&address, Some(token), &report("worker-2")).await;
        assert_eq!(code, expected, "a drained report for worker-2: {answer}");
    }

    // Twice unhealthyDuration and more: nothing happens to worker-2.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        fence_of(server, "worker-2").is_none(),
        "worker-2 got a NodeFence"
    );
    assert_eq!(
        std::fs::read_to_string(&fabric)
            .expect("the fabric port")
            .trim(),
        "on"
    );
    assert!(server.object::<Pod>("shop", "db-0").is_some());

    // The control: the same forged condition, written by someone allowed to, gets
    // worker-2 fenced. The refusals above are what kept it healthy.
    Api::<Node>::all(admin.clone())
        .patch_status("worker-2", &merge, &Patch::Merge(&not_ready_for_an_hour()))
        .await
        .expect("the administrator's patch");
    support::poll::Wait::for_(
        "worker-2 fenced on the administrator's NotReady",
        Duration::from_secs(30),
    )
    .every(Duration::from_millis(50))
    .showing(|| {
        format!(
            "fence {:?}; controller log:\n{}",
            fence_of(server, "worker-2"),
            controller.log()
        )
    })
    .eventually_true(|| {
        std::fs::read_to_string(&fabric)
            .expect("the fabric port")
            .trim()
            == "off"
    })
    .await;
    assert!(fence_of(server, "worker-2").is_some());
    println!(
        "compromised agent vs the controller: {} attempts refused; worker-2 untouched for 5 s \
         (unhealthyDuration 2 s), fenced once the same NotReady came from the administrator",
        attempts.len() + 3
    );
}
