//! An in-process fake Kubernetes API server speaking the real wire protocol, so
//! the real `kube` client runs against it unmodified. See tests/support/apiserver/README.md.

mod access;
mod apply;
mod faults;
mod paging;
mod patch;
mod resources;
mod routes;
mod selectors;
mod server;
mod status;
mod store;
mod tables;
mod tokens;
mod verbs;
mod watch;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use faults::{RbacAccess, RecordedRequest, RequestMatcher};
pub use resources::CustomResource;
// Not every test binary names these; they are the fake's public API all the same.
#[allow(unused_imports)]
pub use tokens::{
    API_AUDIENCE, EXTRA_CREDENTIAL_ID, EXTRA_NODE_NAME, EXTRA_NODE_UID, EXTRA_POD_NAME,
    EXTRA_POD_UID, IssuedToken, NodeRef, ObjectRef,
};

use resources::ResourceType;
use server::Listener;
use store::ObjectKey;

/// The fake API server. Dropping it stops it.
pub struct FakeApiServer {
    listener: Listener,
}

/// A typed built-in kind the server knows (k8s-openapi types).
pub trait Kind: kube::Resource<DynamicType = ()> + Serialize + DeserializeOwned {}
impl<K> Kind for K where K: kube::Resource<DynamicType = ()> + Serialize + DeserializeOwned {}

impl FakeApiServer {
    /// Starts a server on 127.0.0.1 with an ephemeral port, on the current tokio runtime.
    pub async fn start() -> Self {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST).await
    }

    /// [`start`](Self::start) on `address` instead of 127.0.0.1: a test in network
    /// namespaces serves its nodes on the hub's end of their links.
    pub async fn start_on(address: std::net::Ipv4Addr) -> Self {
        let listener = Listener::bind((address, 0).into())
            .await
            .unwrap_or_else(|error| panic!("bind the fake API server on {address}: {error}"));
        Self { listener }
    }

    fn shared(&self) -> &server::Shared {
        &self.listener.shared
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.shared().address)
    }

    /// A real kube client for this server, with default namespace `default`.
    pub fn client(&self) -> kube::Client {
        let uri: http::Uri = self.url().parse().expect("the server URL is a URI");
        let config = kube::Config::new(uri);
        kube::Client::try_from(config).expect("build a kube client for the fake API server")
    }

    /// A kubeconfig whose current context points at this server (namespace `default`).
    pub fn kubeconfig_yaml(&self) -> String {
        self.kubeconfig_yaml_naming_ca(None)
    }

    /// [`kubeconfig_yaml`](Self::kubeconfig_yaml) with `certificate-authority-data` from
    /// the PEM file `ca`: with no CA of its own, kube's client looks for the system's
    /// certificate store even for this plain-http server, and a minimal system has none.
    pub fn kubeconfig_yaml_naming_ca(&self, ca: Option<&Path>) -> String {
        let ca = ca
            .map(|path| {
                let pem = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                use base64::Engine as _;
                let data = base64::engine::general_purpose::STANDARD.encode(pem);
                format!("    certificate-authority-data: {data}\n")
            })
            .unwrap_or_default();
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {url}\n{ca}\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
             current-context: fake\nusers:\n- name: fake\n  user:\n    token: {token}\n",
            url = self.url(),
            token = access::ADMIN_TOKEN
        )
    }

    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml())
    }

    // ---- resources and objects ----

    pub fn register(&self, custom: CustomResource) {
        self.shared().registry.lock().unwrap().register(custom);
    }

    fn resource_type(&self, group: &str, version: &str, plural: &str) -> ResourceType {
        self.shared()
            .registry
            .lock()
            .unwrap()
            .find(group, version, plural)
            .cloned()
            .unwrap_or_else(|| {
                panic!("the fake API server does not serve {group}/{version} {plural}")
            })
    }

    fn type_of<K: Kind>(&self) -> ResourceType {
        self.resource_type(&K::group(&()), &K::version(&()), &K::plural(&()))
    }

    /// Stores an object as given, status included, bypassing the API (fixtures, or what the
    /// kubelet or a controller would have written). Replaces any object of the same name.
    pub fn seed<K: Kind>(&self, object: &K) -> K {
        let resource_type = self.type_of::<K>();
        let value = serde_json::to_value(object).unwrap();
        serde_json::from_value(self.seed_value(&resource_type, value)).unwrap()
    }

    /// `seed` for custom resources: `group`, `version`, `plural` must be registered.
    pub fn seed_custom(&self, group: &str, version: &str, plural: &str, object: Value) -> Value {
        let resource_type = self.resource_type(group, version, plural);
        self.seed_value(&resource_type, object)
    }

    fn seed_value(&self, resource_type: &ResourceType, object: Value) -> Value {
        let namespace = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .expect("a seeded object needs metadata.name")
            .to_string();
        let request = verbs::Request {
            resource_type,
            namespace: &namespace,
            name: &name,
            subresource: None,
            manager: "seed",
            admission: None,
        };
        let mut store = self.shared().store.lock().unwrap();
        verbs::seed(&mut store, &request, object)
            .unwrap_or_else(|error| panic!("seeding {name}: {}", error.message))
    }

    /// The stored object, straight from the store (no request is logged).
    pub fn object<K: Kind>(&self, namespace: &str, name: &str) -> Option<K> {
        let resource_type = self.type_of::<K>();
        let store = self.shared().store.lock().unwrap();
        store
            .get(&ObjectKey::new(&resource_type, namespace, name))
            .map(|value| serde_json::from_value(value.clone()).unwrap())
    }

    /// All stored objects of a kind, in every namespace.
    pub fn objects<K: Kind>(&self) -> Vec<K> {
        let resource_type = self.type_of::<K>();
        let store = self.shared().store.lock().unwrap();
        store
            .list(&resource_type, None)
            .into_iter()
            .map(|value| serde_json::from_value(value).unwrap())
            .collect()
    }

    /// All stored objects of a registered custom resource, as JSON.
    pub fn custom_objects(&self, group: &str, version: &str, plural: &str) -> Vec<Value> {
        let resource_type = self.resource_type(group, version, plural);
        let store = self.shared().store.lock().unwrap();
        store.list(&resource_type, None)
    }

    /// Ends a graceful deletion as the kubelet would once containers are gone: the object is
    /// removed and watchers see DELETED. Returns false if there was no such object.
    pub fn finalize<K: Kind>(&self, namespace: &str, name: &str) -> bool {
        let resource_type = self.type_of::<K>();
        let request = verbs::Request {
            resource_type: &resource_type,
            namespace,
            name,
            subresource: None,
            manager: "kubelet",
            admission: None,
        };
        verbs::finalize(&mut self.shared().store.lock().unwrap(), &request).is_ok()
    }

    /// The current (latest) resourceVersion.
    pub fn revision(&self) -> u64 {
        self.shared().store.lock().unwrap().revision()
    }

    /// Forgets the change history: any earlier resourceVersion is now expired (410 Gone).
    pub fn compact_history(&self) {
        self.shared().store.lock().unwrap().compact();
    }

    /// How often watches with `allowWatchBookmarks=true` get a BOOKMARK (default 1 s).
    pub fn set_bookmark_interval(&self, interval: Duration) {
        *self.shared().bookmark_interval.lock().unwrap() = interval;
    }

    // ---- service account tokens ----

    /// Whether tokens issued from now on for a pod carry the pod's node (claims, and the
    /// `node-name` / `node-uid` extras of a review). Default true, as since Kubernetes 1.30;
    /// false behaves like an older cluster, where the reviewer must look the pod up itself.
    pub fn set_token_node_info(&self, enabled: bool) {
        self.shared().tokens.lock().unwrap().node_info = enabled;
    }

    /// Every token issued so far counts as expired from now on (reviews answer "service
    /// account token has expired"); tokens issued later are fresh.
    pub fn expire_tokens(&self) {
        self.shared().tokens.lock().unwrap().expire_all();
    }

    /// The facts of every token issued so far, oldest first.
    pub fn issued_tokens(&self) -> Vec<IssuedToken> {
        self.shared().tokens.lock().unwrap().issued().to_vec()
    }

    // ---- fault injection ----

    /// Delay before every request is served.
    pub fn set_latency(&self, latency: Duration) {
        self.shared().faults.lock().unwrap().latency = latency;
    }

    /// The next `count` requests fail with `status` and a matching `Status` body.
    pub fn fail_next(&self, count: usize, status: u16) {
        self.fail_matching(RequestMatcher::any(), status, Some(count));
    }

    /// Requests hit by `matcher` fail with `status`, `times` times or (None) until cleared.
    pub fn fail_matching(&self, matcher: RequestMatcher, status: u16, times: Option<usize>) {
        self.shared()
            .faults
            .lock()
            .unwrap()
            .add_rule(matcher, status, times);
    }

    pub fn clear_failures(&self) {
        self.shared().faults.lock().unwrap().clear();
    }

    /// Cuts every open watch connection mid-stream, as a load balancer or apiserver restart would.
    pub fn drop_watches(&self) {
        self.shared()
            .drop_watches
            .send_modify(|generation| *generation += 1);
    }

    /// Makes the server unreachable: the port refuses connections and open ones are reset.
    /// Stored objects survive.
    pub async fn go_down(&self) {
        self.listener.stop().await;
    }

    /// Listens again on the same port after `go_down`.
    pub async fn come_back(&self) {
        self.listener
            .restart()
            .await
            .expect("rebind the fake API server's port");
    }

    // ---- request log ----

    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared()
            .log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn clear_requests(&self) {
        self.shared().log.lock().unwrap().clear();
    }

    /// A handle on the request log that does not borrow the server, for guards that read
    /// it when they are dropped.
    pub fn request_log(&self) -> RequestLog {
        RequestLog(self.listener.shared.clone())
    }

    /// Every (verb, group, resource) the clients used so far, for RBAC checks.
    pub fn rbac_accesses(&self) -> BTreeSet<RbacAccess> {
        self.requests()
            .iter()
            .filter_map(RecordedRequest::rbac_access)
            .collect()
    }
}

/// The server's request log, readable after the server is dropped.
#[derive(Clone)]
pub struct RequestLog(std::sync::Arc<server::Shared>);

impl RequestLog {
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.0
            .log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Where a test's Kubernetes calls go: the fake server (default) or, with
/// `NODEKEEPER_REAL_CLUSTER=1`, the cluster named by `KUBECONFIG` (or in-cluster config).
pub enum TestCluster {
    Fake(FakeApiServer),
    Real(kube::Client),
}

impl TestCluster {
    pub fn client(&self) -> kube::Client {
        match self {
            TestCluster::Fake(server) => server.client(),
            TestCluster::Real(client) => client.clone(),
        }
    }

    /// The fake server, for seeding and fault injection; None on a real cluster.
    pub fn fake(&self) -> Option<&FakeApiServer> {
        match self {
            TestCluster::Fake(server) => Some(server),
            TestCluster::Real(_) => None,
        }
    }

    /// The namespace tests should use: `default` on the fake, `NODEKEEPER_TEST_NAMESPACE` (else
    /// `default`) on a real cluster.
    pub fn namespace(&self) -> String {
        match self {
            TestCluster::Fake(_) => "default".to_string(),
            TestCluster::Real(_) => {
                std::env::var("NODEKEEPER_TEST_NAMESPACE").unwrap_or_else(|_| "default".to_string())
            }
        }
    }
}

pub fn wants_real_cluster() -> bool {
    std::env::var("NODEKEEPER_REAL_CLUSTER").is_ok_and(|value| value == "1")
}

pub async fn cluster() -> TestCluster {
    if wants_real_cluster() {
        let client = kube::Client::try_default()
            .await
            .expect("NODEKEEPER_REAL_CLUSTER=1 needs a usable KUBECONFIG");
        TestCluster::Real(client)
    } else {
        TestCluster::Fake(FakeApiServer::start().await)
    }
}

/// The fake server, for tests that need fault injection or direct store access; `Err` when
/// running against a real cluster. Take it with
/// `require!("the fake API server", fake_only(&cluster))`, so such a test fails under
/// `CI=true` and is reported as skipped otherwise, never counted as passed.
pub fn fake_only(cluster: &TestCluster) -> Result<&FakeApiServer, String> {
    cluster.fake().ok_or_else(|| {
        "running against a real cluster (NODEKEEPER_REAL_CLUSTER=1); this test needs the fake"
            .to_string()
    })
}

/// Polls `check` every 20 ms until it returns Some, or panics after `limit`.
pub async fn eventually<T>(limit: Duration, what: &str, check: impl FnMut() -> Option<T>) -> T {
    super::poll::Wait::for_(what, limit).eventually(check).await
}

/// A token for `account` bound to the pod `pod` (its uid included) and valid an hour, as
/// the kubelet requests one for a projected volume, through the TokenRequest API of any
/// server (this fake or a real one). `audience` `None` means the API server's own.
pub async fn projected_token(
    client: &kube::Client,
    namespace: &str,
    account: &str,
    pod: &str,
    audience: Option<&str>,
) -> String {
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequest, TokenRequestSpec,
    };
    use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
    use kube::api::{Api, PostParams};
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let uid = pods
        .get(pod)
        .await
        .expect("the token's pod")
        .metadata
        .uid
        .expect("the pod's uid");
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: audience.map(|a| vec![a.to_string()]).unwrap_or_default(),
            expiration_seconds: Some(3600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".to_string()),
                kind: Some("Pod".to_string()),
                name: Some(pod.to_string()),
                uid: Some(uid),
            }),
        },
        ..TokenRequest::default()
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .expect("a token from the TokenRequest API")
        .status
        .expect("the TokenRequest's status")
        .token
}
