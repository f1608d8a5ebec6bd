//! Service account tokens as the real API server issues and checks them: the `token`
//! subresource of ServiceAccounts (`authentication.k8s.io/v1` TokenRequest, from
//! pkg/registry/core/serviceaccount/storage/token.go) and TokenReview
//! (pkg/registry/authentication/tokenreview, pkg/serviceaccount/jwt.go and claims.go).
//!
//! Tokens look like the real JWTs (header, claims, a random 256-byte "signature", all
//! base64url) but are not signed: the server remembers every token it issued and a review
//! looks the whole string up, so a token is as unguessable as its random signature.

use std::collections::BTreeMap;
use std::io::Read;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenReview, UserInfo};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use super::status::ApiError;
use super::store::{ObjectKey, Store};
use super::verbs::{self, text_at};

/// The server's own audience (`--api-audiences`, defaulting to the issuer): what a request
/// without audiences gets and what a review without audiences checks.
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";
/// The issuer (`iss`) written into tokens.
pub const ISSUER: &str = API_AUDIENCE;
/// `TokenRequestSpec.expirationSeconds` when the request leaves it out.
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
const MIN_EXPIRATION_SECONDS: i64 = 600;
const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;
/// go-jose's `jwt.DefaultLeeway`: expiry and deletion are judged with one minute of slack.
const LEEWAY: SignedDuration = SignedDuration::from_secs(60);

const TOKEN_REQUEST_GROUP: &str = "authentication.k8s.io";
const TOKEN_REQUEST_KIND: &str = "TokenRequest";

/// The extra keys a review reports for a pod-bound token (KEP-4193).
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
pub const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";
pub const EXTRA_NODE_UID: &str = "authentication.kubernetes.io/node-uid";
pub const EXTRA_CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

/// An object a token names, as its claims record it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectRef {
    pub name: String,
    pub uid: String,
}

/// The node a token names: for a pod-bound token, the pod's `spec.nodeName` at issue time,
/// with the Node's uid when that Node existed then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRef {
    pub name: String,
    pub uid: Option<String>,
}

/// What the server knows about a token it issued: the facts of its claims.
#[derive(Clone, Debug)]
pub struct IssuedToken {
    pub token: String,
    pub namespace: String,
    pub service_account: ObjectRef,
    pub audiences: Vec<String>,
    pub issued_at: Timestamp,
    pub expires_at: Timestamp,
    /// The bound pod (`boundObjectRef` of kind Pod).
    pub pod: Option<ObjectRef>,
    /// The bound secret (`boundObjectRef` of kind Secret).
    pub secret: Option<ObjectRef>,
    /// The bound node (kind Node), or the node of the bound pod.
    pub node: Option<NodeRef>,
    /// The `jti` claim; reviews report it as `JTI=<id>`.
    pub credential_id: String,
    /// Set by `FakeApiServer::expire_tokens`.
    pub forced_expiry: bool,
}

impl IssuedToken {
    fn is_expired(&self, now: Timestamp) -> bool {
        self.forced_expiry
            || self
                .expires_at
                .checked_add(LEEWAY)
                .is_ok_and(|deadline| now > deadline)
    }
}

/// Every token issued so far, and how new ones are made.
#[derive(Debug)]
pub struct Tokens {
    issued: Vec<IssuedToken>,
    /// Whether pod-bound tokens carry the pod's node (ServiceAccountTokenPodNodeInfo, on since
    /// Kubernetes 1.30).
    pub node_info: bool,
}

impl Default for Tokens {
    fn default() -> Self {
        Self {
            issued: Vec::new(),
            node_info: true,
        }
    }
}

impl Tokens {
    pub fn issued(&self) -> &[IssuedToken] {
        &self.issued
    }

    pub fn expire_all(&mut self) {
        for token in &mut self.issued {
            token.forced_expiry = true;
        }
    }

    fn find(&self, token: &str) -> Option<&IssuedToken> {
        self.issued.iter().find(|issued| issued.token == token)
    }
}

// ---- randomness and encoding ----

/// Bytes from the kernel's random pool; the clock-seeded mix of `verbs` if that is unreadable.
fn random_bytes(count: usize) -> Vec<u8> {
    let mut bytes = vec![0; count];
    let from_kernel = std::fs::File::open("/dev/urandom")
        .and_then(|mut source| source.read_exact(&mut bytes))
        .is_ok();
    if !from_kernel {
        for chunk in bytes.chunks_mut(8) {
            let bits = verbs::unique_bits().to_le_bytes();
            chunk.copy_from_slice(&bits[..chunk.len()]);
        }
    }
    bytes
}

/// Unpadded base64url (RFC 4648 §5), as JWTs use.
fn base64url(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Go's `%q` of a `[]string`: `["a" "b"]`.
fn go_quoted_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|item| format!("{item:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

// ---- store access ----

fn core_key(plural: &str, namespace: &str, name: &str) -> ObjectKey {
    ObjectKey {
        group: String::new(),
        version: "v1".to_string(),
        resource: plural.to_string(),
        namespace: namespace.to_string(),
        name: name.to_string(),
    }
}

fn uid_of(object: &Value) -> String {
    text_at(object, "/metadata/uid").to_string()
}

/// Deleted before `now - leeway` (a graceful deletion whose deadline has passed): what the
/// real validator treats as gone.
fn deleted_before(object: &Value, limit: Timestamp) -> bool {
    text_at(object, "/metadata/deletionTimestamp")
        .parse::<Timestamp>()
        .is_ok_and(|deleted| deleted < limit)
}

// ---- TokenRequest ----

fn invalid_request(name: &str, why: String) -> ApiError {
    ApiError::invalid(TOKEN_REQUEST_GROUP, TOKEN_REQUEST_KIND, name, why)
}

/// `POST /api/v1/namespaces/{namespace}/serviceaccounts/{name}/token`: checks the request as
/// the real server does, issues a token, records its facts and answers the TokenRequest with
/// `status.token` and `status.expirationTimestamp`.
pub fn request_token(
    store: &Store,
    tokens: &mut Tokens,
    namespace: &str,
    name: &str,
    body: Value,
) -> Result<Value, ApiError> {
    let kind = text_at(&body, "/kind");
    if !kind.is_empty() && kind != TOKEN_REQUEST_KIND {
        return Err(ApiError::bad_request(format!(
            "the kind {kind:?} does not match the subresource serviceaccounts/token ({TOKEN_REQUEST_KIND})"
        )));
    }
    let mut request: TokenRequest = serde_json::from_value(body).map_err(|error| {
        ApiError::bad_request(format!("decoding {TOKEN_REQUEST_KIND} body: {error}"))
    })?;
    let sent_name = request.metadata.name.clone().unwrap_or_default();
    if !sent_name.is_empty() && sent_name != name {
        return Err(invalid_request(
            name,
            format!(
                "metadata.name: Invalid value: {sent_name:?}: must match the service account name if specified"
            ),
        ));
    }
    let sent_namespace = request.metadata.namespace.clone().unwrap_or_default();
    if !sent_namespace.is_empty() && sent_namespace != namespace {
        return Err(invalid_request(
            name,
            format!(
                "metadata.namespace: Invalid value: {sent_namespace:?}: must match the service account namespace if specified"
            ),
        ));
    }
    let service_account = store
        .get(&core_key("serviceaccounts", namespace, name))
        .ok_or_else(|| ApiError::not_found("", "serviceaccounts", name))?;
    if request.spec.audiences.is_empty() {
        request.spec.audiences = vec![API_AUDIENCE.to_string()];
    }
    let expiration = *request
        .spec
        .expiration_seconds
        .get_or_insert(DEFAULT_EXPIRATION_SECONDS);
    if expiration < MIN_EXPIRATION_SECONDS {
        return Err(invalid_request(
            "",
            format!(
                "spec.expirationSeconds: Invalid value: {expiration}: may not specify a duration less than 10 minutes"
            ),
        ));
    }
    if expiration > MAX_EXPIRATION_SECONDS {
        return Err(invalid_request(
            "",
            format!(
                "spec.expirationSeconds: Invalid value: {expiration}: may not specify a duration larger than 2^32 seconds"
            ),
        ));
    }

    let mut pod = None;
    let mut secret = None;
    let mut node = None;
    if let Some(reference) = &request.spec.bound_object_ref {
        let api_version = reference.api_version.as_deref().unwrap_or_default();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let kind = reference.kind.as_deref().unwrap_or_default();
        let bound_name = reference.name.as_deref().unwrap_or_default();
        let lookup = |plural: &str, scope: &str| -> Result<&Value, ApiError> {
            if bound_name.is_empty() {
                return Err(ApiError::bad_request("resource name may not be empty"));
            }
            store
                .get(&core_key(plural, scope, bound_name))
                .ok_or_else(|| ApiError::not_found("", plural, bound_name))
        };
        let uid = match (group, kind) {
            ("", "Pod") => {
                let object = lookup("pods", namespace)?;
                // Admission (the ServiceAccount plugin) fills in "default" when a pod names none.
                let pod_account = [
                    text_at(object, "/spec/serviceAccountName"),
                    text_at(object, "/spec/serviceAccount"),
                ]
                .into_iter()
                .find(|account| !account.is_empty())
                .unwrap_or("default");
                if pod_account != name {
                    return Err(ApiError::bad_request(format!(
                        "cannot bind token for serviceaccount {name:?} to pod running with different serviceaccount name."
                    )));
                }
                let node_name = text_at(object, "/spec/nodeName");
                if tokens.node_info && !node_name.is_empty() {
                    // A missing Node still leaves its name in the claims, without a uid.
                    node = Some(NodeRef {
                        name: node_name.to_string(),
                        uid: store.get(&core_key("nodes", "", node_name)).map(uid_of),
                    });
                }
                pod = Some(ObjectRef {
                    name: bound_name.to_string(),
                    uid: uid_of(object),
                });
                uid_of(object)
            }
            ("", "Node") => {
                let object = lookup("nodes", "")?;
                node = Some(NodeRef {
                    name: bound_name.to_string(),
                    uid: Some(uid_of(object)),
                });
                uid_of(object)
            }
            ("", "Secret") => {
                let object = lookup("secrets", namespace)?;
                secret = Some(ObjectRef {
                    name: bound_name.to_string(),
                    uid: uid_of(object),
                });
                uid_of(object)
            }
            _ => {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token to object of type {group}/{version}, Kind={kind}"
                )));
            }
        };
        if let Some(wanted) = reference.uid.as_deref().filter(|wanted| !wanted.is_empty())
            && wanted != uid
        {
            return Err(ApiError::conflict(
                "",
                kind,
                bound_name,
                &format!(
                    "the UID in the bound object reference ({wanted}) does not match the UID in record. The object might have been deleted and then recreated"
                ),
            ));
        }
    }

    let now = Timestamp::now();
    let expires_at = now
        .checked_add(SignedDuration::from_secs(expiration))
        .map_err(|error| ApiError::bad_request(format!("expirationSeconds: {error}")))?;
    let issued = IssuedToken {
        token: String::new(),
        namespace: namespace.to_string(),
        service_account: ObjectRef {
            name: name.to_string(),
            uid: uid_of(service_account),
        },
        audiences: request.spec.audiences.clone(),
        issued_at: now,
        expires_at,
        pod,
        secret,
        node,
        credential_id: verbs::new_uid(),
        forced_expiry: false,
    };
    let token = jwt(&issued);
    tokens.issued.push(IssuedToken {
        token: token.clone(),
        ..issued
    });

    let mut answer = serde_json::to_value(&request).map_err(|error| {
        ApiError::bad_request(format!("encoding {TOKEN_REQUEST_KIND}: {error}"))
    })?;
    answer["apiVersion"] = json!(format!("{TOKEN_REQUEST_GROUP}/v1"));
    answer["kind"] = json!(TOKEN_REQUEST_KIND);
    answer["metadata"] = json!({
        "name": name,
        "namespace": namespace,
        "creationTimestamp": verbs::timestamp(now),
    });
    answer["status"] = json!({
        "token": token,
        "expirationTimestamp": verbs::timestamp(expires_at),
    });
    Ok(answer)
}

/// The token: a JWT with the claims a real bound token carries, and a random signature.
fn jwt(issued: &IssuedToken) -> String {
    let reference = |object: &ObjectRef| json!({"name": object.name, "uid": object.uid});
    let mut kubernetes = json!({
        "namespace": issued.namespace,
        "serviceaccount": reference(&issued.service_account),
    });
    if let Some(pod) = &issued.pod {
        kubernetes["pod"] = reference(pod);
    }
    if let Some(secret) = &issued.secret {
        kubernetes["secret"] = reference(secret);
    }
    if let Some(node) = &issued.node {
        kubernetes["node"] = match &node.uid {
            Some(uid) => json!({"name": node.name, "uid": uid}),
            None => json!({"name": node.name}),
        };
    }
    let claims = json!({
        "aud": issued.audiences,
        "exp": issued.expires_at.as_second(),
        "iat": issued.issued_at.as_second(),
        "iss": ISSUER,
        "jti": issued.credential_id,
        "kubernetes.io": kubernetes,
        "nbf": issued.issued_at.as_second(),
        "sub": format!(
            "system:serviceaccount:{}:{}",
            issued.namespace, issued.service_account.name
        ),
    });
    let header = json!({"alg": "RS256", "kid": "nodekeeper-fake-apiserver"});
    format!(
        "{}.{}.{}",
        base64url(header.to_string().as_bytes()),
        base64url(claims.to_string().as_bytes()),
        base64url(&random_bytes(256))
    )
}

// ---- TokenReview ----

/// A successful authentication: the user and the audiences it was accepted for.
struct Authenticated {
    user: UserInfo,
    audiences: Vec<String>,
}

/// `POST /apis/authentication.k8s.io/v1/tokenreviews`: the review with `status` filled in as
/// the real server fills it (`authenticated` is left out when false, as Go's `omitempty` does).
pub fn review(store: &Store, tokens: &Tokens, body: Value) -> Result<Value, ApiError> {
    let kind = text_at(&body, "/kind");
    if !kind.is_empty() && kind != "TokenReview" {
        return Err(ApiError::bad_request(format!(
            "the kind {kind:?} does not match the resource tokenreviews"
        )));
    }
    let review: TokenReview = serde_json::from_value(body)
        .map_err(|error| ApiError::bad_request(format!("decoding TokenReview body: {error}")))?;
    let token = review.spec.token.clone().unwrap_or_default();
    if token.is_empty() {
        return Err(ApiError::bad_request(
            "token is required for TokenReview in authentication",
        ));
    }
    let requested = review
        .spec
        .audiences
        .clone()
        .filter(|audiences| !audiences.is_empty())
        .unwrap_or_else(|| vec![API_AUDIENCE.to_string()]);
    let mut answer = serde_json::to_value(&review)
        .map_err(|error| ApiError::bad_request(format!("encoding TokenReview: {error}")))?;
    answer["apiVersion"] = json!("authentication.k8s.io/v1");
    answer["kind"] = json!("TokenReview");
    answer["status"] = match authenticate(store, tokens, &token, &requested) {
        Ok(authenticated) => json!({
            "authenticated": true,
            "user": authenticated.user,
            "audiences": authenticated.audiences,
        }),
        Err(error) => json!({"user": {}, "error": error}),
    };
    Ok(answer)
}

/// A bearer token on an API request: accepted only for the server's own audience.
pub fn authenticate_bearer(
    store: &Store,
    tokens: &Tokens,
    token: &str,
) -> Result<UserInfo, String> {
    authenticate(store, tokens, token, &[API_AUDIENCE.to_string()]).map(|accepted| accepted.user)
}

/// The service account authenticator: audience check first (jwt.go), then the claims
/// validator (claims.go). Errors are the strings the real server puts in `status.error`.
fn authenticate(
    store: &Store,
    tokens: &Tokens,
    token: &str,
    requested: &[String],
) -> Result<Authenticated, String> {
    let Some(issued) = tokens.find(token) else {
        return Err("invalid bearer token".to_string());
    };
    let audiences: Vec<String> = issued
        .audiences
        .iter()
        .filter(|audience| requested.contains(audience))
        .cloned()
        .collect();
    if audiences.is_empty() {
        return Err(format!(
            "token audiences {} is invalid for the target audiences {}",
            go_quoted_list(&issued.audiences),
            go_quoted_list(requested)
        ));
    }
    let now = Timestamp::now();
    if issued.is_expired(now) {
        return Err("service account token has expired".to_string());
    }
    let deleted_limit = now.checked_sub(LEEWAY).unwrap_or(now);
    let namespace = &issued.namespace;
    let account = &issued.service_account;
    let Some(service_account) = store.get(&core_key("serviceaccounts", namespace, &account.name))
    else {
        return Err(format!("serviceaccounts {:?} not found", account.name));
    };
    let current_uid = uid_of(service_account);
    if current_uid != account.uid {
        return Err(format!(
            "service account UID ({current_uid}) does not match claim ({})",
            account.uid
        ));
    }
    if deleted_before(service_account, deleted_limit) {
        return Err(format!(
            "service account {namespace}/{} has been deleted",
            account.name
        ));
    }
    let invalidated = || "service account token has been invalidated".to_string();
    // The object a token is bound to must still be there, the same one (uid), and not
    // deleted longer ago than the leeway.
    let check_bound = |kind: &str, plural: &str, namespace: &str, name: &str, claimed: &str| {
        let object = store
            .get(&core_key(plural, namespace, name))
            .ok_or_else(invalidated)?;
        let uid = uid_of(object);
        if uid != claimed {
            return Err(format!(
                "{kind} UID ({uid}) does not match service account {kind} ref claim ({claimed})"
            ));
        }
        if deleted_before(object, deleted_limit) {
            return Err(invalidated());
        }
        Ok(())
    };
    if let Some(secret) = &issued.secret {
        check_bound("secret", "secrets", namespace, &secret.name, &secret.uid)?;
    }
    if let Some(pod) = &issued.pod {
        check_bound("pod", "pods", namespace, &pod.name, &pod.uid)?;
    }
    // A pod-bound token just reports its node claims; a node-bound one checks the Node.
    if let (Some(node), None) = (&issued.node, &issued.pod) {
        let claimed = node.uid.clone().unwrap_or_default();
        check_bound("node", "nodes", "", &node.name, &claimed)?;
    }

    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    if let Some(pod) = &issued.pod {
        extra.insert(EXTRA_POD_NAME.to_string(), vec![pod.name.clone()]);
        extra.insert(EXTRA_POD_UID.to_string(), vec![pod.uid.clone()]);
    }
    extra.insert(
        EXTRA_CREDENTIAL_ID.to_string(),
        vec![format!("JTI={}", issued.credential_id)],
    );
    if let Some(node) = &issued.node {
        extra.insert(EXTRA_NODE_NAME.to_string(), vec![node.name.clone()]);
        if let Some(uid) = node.uid.as_ref().filter(|uid| !uid.is_empty()) {
            extra.insert(EXTRA_NODE_UID.to_string(), vec![uid.clone()]);
        }
    }
    Ok(Authenticated {
        user: UserInfo {
            username: Some(format!(
                "system:serviceaccount:{namespace}:{}",
                account.name
            )),
            uid: Some(account.uid.clone()),
            groups: Some(vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".to_string(),
            ]),
            extra: Some(extra),
        },
        audiences,
    })
}
