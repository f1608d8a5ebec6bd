//! Who sent a report. An agent in a DaemonSet presents its projected ServiceAccount
//! token (audience `nodekeeper-controller` by default); the controller asks the API
//! server with a TokenReview whose token it is, and accepts it only from the agent's
//! ServiceAccount and only for the node its bound pod runs on, the Kubernetes convention
//! for node-bound credentials. An agent run as a systemd unit presents the node's own
//! token from a Secret instead. So a compromised agent can speak only for its own node.
//!
//! The rules are pure functions over the TokenReview's answer and the pod; the
//! [`Authenticator`] around them does the calls, bounds how many run at once, and caches
//! verdicts briefly so 5,000 agents reporting every 2 s cost the API server a review per
//! token and cache period, not per report.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, PostParams};

use super::ledger::{Credential, Identity};
use super::protocol::RefusalReason;

/// The TokenReview `user.extra` keys the API server fills for a pod-bound ServiceAccount
/// token (KEP-4193; the node keys since Kubernetes 1.30, on by default since 1.32).
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
pub const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";

/// What the controller accepts as an agent's credential.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuthPolicy {
    /// The audience agents' projected tokens are issued for. A token for the API
    /// server's own audience is refused, so a stolen report token cannot call the API.
    pub audience: String,
    /// The ServiceAccounts (`namespace/name`) whose tokens may report.
    pub service_accounts: Vec<String>,
    /// A Secret in the controller's namespace holding one token per node (key: node
    /// name), for agents outside Kubernetes.
    pub node_tokens_secret: Option<String>,
    /// How long an accepted token is trusted without a new review (never past the
    /// token's own expiry). A refusal is remembered for at most 10 s.
    pub cache_ttl: Duration,
    /// TokenReviews in flight at most; more wait.
    pub max_reviews_in_flight: usize,
}

impl Default for AuthPolicy {
    fn default() -> AuthPolicy {
        AuthPolicy {
            audience: "nodekeeper-controller".to_string(),
            service_accounts: vec!["nodekeeper-system/nodekeeper-agent".to_string()],
            node_tokens_secret: None,
            // kube-apiserver caches webhook token verdicts for 2 min; a minute keeps
            // TokenReviews at 5,000 agents near 80 per second.
            cache_ttl: Duration::from_secs(60),
            max_reviews_in_flight: 16,
        }
    }
}

/// Why a credential was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthFailure {
    #[error("no bearer token in the Authorization header")]
    Missing,
    #[error("the token was not accepted: {0}")]
    NotAccepted(String),
    #[error("{username} is not an agent ServiceAccount ({allowed})")]
    NotAgent { username: String, allowed: String },
    #[error("the token's pod {pod} runs on node {actual:?}, not on {reported:?}")]
    OtherNode {
        pod: String,
        actual: String,
        reported: String,
    },
    #[error("the token is not bound to a pod; agents must use a projected token")]
    Unbound,
    #[error("the token cannot be checked now: {0}")]
    Unavailable(String),
    #[error("too many unknown tokens waiting for review; retry shortly")]
    Overloaded,
}

impl AuthFailure {
    pub fn reason(&self) -> RefusalReason {
        match self {
            AuthFailure::Missing | AuthFailure::NotAccepted(_) | AuthFailure::Unbound => {
                RefusalReason::Unauthenticated
            }
            AuthFailure::NotAgent { .. } | AuthFailure::OtherNode { .. } => {
                RefusalReason::Forbidden
            }
            AuthFailure::Unavailable(_) => RefusalReason::Unavailable,
            AuthFailure::Overloaded => RefusalReason::Overloaded,
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header.
pub fn bearer_token(header: Option<&str>) -> Result<&str, AuthFailure> {
    let header = header.ok_or(AuthFailure::Missing)?;
    let (scheme, token) = header.split_once(' ').ok_or(AuthFailure::Missing)?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(AuthFailure::Missing);
    }
    Ok(token)
}

/// Whether a token has the shape of a JWT (three base64url parts), so garbage is refused
/// without a TokenReview.
pub fn looks_like_jwt(token: &str) -> bool {
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(_signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    token.len() <= 16 * 1024
        && !header.is_empty()
        && !payload.is_empty()
        && token
            .bytes()
            .all(|b| b == b'.' || b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'=')
}

/// `namespace/name` into the username the API server gives its tokens.
pub fn service_account_username(service_account: &str) -> Option<String> {
    let (namespace, name) = service_account.split_once('/')?;
    (!namespace.is_empty() && !name.is_empty() && !name.contains('/'))
        .then(|| format!("system:serviceaccount:{namespace}:{name}"))
}

/// A reviewed token's facts, as far as the TokenReview told them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewedToken {
    pub username: String,
    pub pod_namespace: String,
    pub pod_name: String,
    pub pod_uid: Option<String>,
    /// The bound pod's node, when the API server embeds it (Kubernetes 1.30+); else the
    /// pod must be looked up.
    pub node: Option<String>,
}

fn first_extra<'a>(extra: Option<&'a BTreeMap<String, Vec<String>>>, key: &str) -> Option<&'a str> {
    extra?
        .get(key)?
        .first()
        .map(String::as_str)
        .filter(|value| !value.is_empty())
}

/// Reads a TokenReview's answer: authenticated, for our audience, one of the agent
/// ServiceAccounts, bound to a pod.
pub fn judge_review(
    status: &TokenReviewStatus,
    policy: &AuthPolicy,
) -> Result<ReviewedToken, AuthFailure> {
    if status.authenticated != Some(true) {
        let why = status
            .error
            .clone()
            .filter(|error| !error.is_empty())
            .unwrap_or_else(|| "the API server did not authenticate it".to_string());
        return Err(AuthFailure::NotAccepted(why));
    }
    // An audience-aware authenticator answers with the audiences it matched; a token
    // for another audience must never pass, whatever else the review says.
    let audiences = status.audiences.as_deref().unwrap_or_default();
    if !audiences
        .iter()
        .any(|audience| audience == &policy.audience)
    {
        return Err(AuthFailure::NotAccepted(format!(
            "it is not for audience {:?}",
            policy.audience
        )));
    }
    let user = status.user.clone().unwrap_or_default();
    let username = user.username.unwrap_or_default();
    let allowed: Vec<String> = policy
        .service_accounts
        .iter()
        .filter_map(|account| service_account_username(account))
        .collect();
    if !allowed.contains(&username) {
        return Err(AuthFailure::NotAgent {
            username,
            allowed: policy.service_accounts.join(", "),
        });
    }
    let namespace = username
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .map(|(namespace, _)| namespace.to_string())
        .unwrap_or_default();
    let extra = user.extra.as_ref();
    let pod_name = first_extra(extra, EXTRA_POD_NAME).ok_or(AuthFailure::Unbound)?;
    Ok(ReviewedToken {
        username: username.clone(),
        pod_namespace: namespace,
        pod_name: pod_name.to_string(),
        pod_uid: first_extra(extra, EXTRA_POD_UID).map(str::to_string),
        node: first_extra(extra, EXTRA_NODE_NAME).map(str::to_string),
    })
}

/// Where the token's pod runs, from the pod itself (clusters before 1.30 do not embed
/// the node). A pod recreated under the same name is not the token's pod.
pub fn node_of_pod(token: &ReviewedToken, pod: Option<&Pod>) -> Result<String, AuthFailure> {
    let pod_ref = format!("{}/{}", token.pod_namespace, token.pod_name);
    let pod = pod.ok_or_else(|| AuthFailure::NotAccepted(format!("its pod {pod_ref} is gone")))?;
    if let Some(uid) = &token.pod_uid
        && pod.metadata.uid.as_ref() != Some(uid)
    {
        return Err(AuthFailure::NotAccepted(format!(
            "its pod {pod_ref} was replaced"
        )));
    }
    pod.spec
        .as_ref()
        .and_then(|spec| spec.node_name.clone())
        .filter(|node| !node.is_empty())
        .ok_or_else(|| AuthFailure::NotAccepted(format!("its pod {pod_ref} is not on a node")))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The `exp` claim of a JWT, read without checking the signature: only used to stop
/// trusting a token the API server has already vouched for once it expires.
pub fn token_expiry(token: &str) -> Option<u64> {
    let claims = token.split('.').nth(1)?;
    let bytes = base64url_decode(claims)?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims.get("exp")?.as_u64()
}

/// RFC 4648 base64url, padding optional.
fn base64url_decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text.trim_end_matches('='))
        .ok()
}

/// Compares in time independent of where the texts differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A verdict on a token, kept for the cache period.
#[derive(Debug, Clone)]
struct Cached {
    until: Instant,
    verdict: Result<(String, Credential), AuthFailure>,
}

/// The cache key: a token's SHA-256, so no bearer token is kept in memory and a long
/// one costs no more than a short one.
type TokenDigest = [u8; 32];

fn digest(token: &str) -> TokenDigest {
    let mut key = [0u8; 32];
    key.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref());
    key
}

/// The most accepted tokens remembered (only real agents' tokens get here); beyond it,
/// expired verdicts are dropped, then all.
const CACHE_LIMIT: usize = 50_000;
/// The most refused tokens remembered, kept apart so a flood of made-up tokens can never
/// push good agents' verdicts out.
const REFUSED_LIMIT: usize = 10_000;
const REFUSED_TTL: Duration = Duration::from_secs(10);
/// Unknown tokens waiting for a review at most; more are refused at once (429), so a
/// flood of made-up tokens queues no deeper than this while known agents, whose
/// verdicts are cached, pass straight through.
const REVIEWS_WAITING: usize = 256;
/// How long the node-token Secret is reused before it is read again.
const NODE_TOKENS_TTL: Duration = Duration::from_secs(30);
/// The deadline of one call to the API server (the kube client sets none).
const API_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Longer bearer tokens are refused unread; a projected token is about 1 KiB.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// How long an accepted token is trusted: the cache period, shortened by up to a quarter
/// (from the token's digest) so the tokens reviewed together after a restart come due
/// apart, and never past the token's own expiry.
pub fn trust_period(
    cache_ttl: Duration,
    expiry_unix: Option<u64>,
    now_unix: u64,
    spread: u8,
) -> Duration {
    let spread = cache_ttl.mul_f64(0.25 * f64::from(spread) / 255.0);
    let period = cache_ttl.saturating_sub(spread);
    match expiry_unix {
        Some(expiry) => period.min(Duration::from_secs(expiry.saturating_sub(now_unix))),
        None => period,
    }
}

/// The node tokens, and when they were last read (or tried).
#[derive(Default)]
struct NodeTokens {
    read: Option<Instant>,
    /// Node name to the SHA-256 of its token.
    tokens: HashMap<String, TokenDigest>,
    /// Why the last read failed, while it did.
    failure: Option<String>,
}

/// Checks credentials against the cluster.
pub struct Authenticator {
    client: kube::Client,
    namespace: String,
    policy: AuthPolicy,
    cache: Mutex<HashMap<TokenDigest, Cached>>,
    refused: Mutex<HashMap<TokenDigest, Cached>>,
    reviews: tokio::sync::Semaphore,
    /// Reviews running or waiting.
    review_queue: tokio::sync::Semaphore,
    node_tokens: Mutex<NodeTokens>,
    /// Held by the one request that reads the Secret again; the others use what was read.
    node_tokens_refresh: tokio::sync::Mutex<()>,
}

impl Authenticator {
    /// `namespace` holds the node-token Secret.
    pub fn new(client: kube::Client, namespace: &str, policy: AuthPolicy) -> Authenticator {
        Authenticator {
            client,
            namespace: namespace.to_string(),
            reviews: tokio::sync::Semaphore::new(policy.max_reviews_in_flight.max(1)),
            review_queue: tokio::sync::Semaphore::new(
                policy.max_reviews_in_flight.max(1) + REVIEWS_WAITING,
            ),
            policy,
            cache: Mutex::new(HashMap::new()),
            refused: Mutex::new(HashMap::new()),
            node_tokens: Mutex::new(NodeTokens::default()),
            node_tokens_refresh: tokio::sync::Mutex::new(()),
        }
    }

    /// The identity behind `token`, for a report that names `reported_node`.
    pub async fn authenticate(
        &self,
        token: &str,
        reported_node: &str,
    ) -> Result<Identity, AuthFailure> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(AuthFailure::NotAccepted(format!(
                "it is longer than {MAX_TOKEN_BYTES} bytes"
            )));
        }
        let key = digest(token);
        let mut node_tokens_unreadable = None;
        if self.policy.node_tokens_secret.is_some() {
            match self.node_token_matches(&key, reported_node).await {
                Ok(true) => {
                    return Ok(Identity {
                        node: reported_node.to_string(),
                        credential: Credential::NodeToken,
                    });
                }
                Ok(false) => {}
                // ServiceAccount tokens are still checked; only a node token cannot be.
                Err(failure) => node_tokens_unreadable = Some(failure),
            }
        }
        let (node, credential) = match self.cached(&key) {
            Some(verdict) => verdict?,
            None => {
                // Only JWT-shaped tokens are ever reviewed, so only they are in the
                // cache: the shape is checked on a miss alone.
                if !looks_like_jwt(token) {
                    return Err(node_tokens_unreadable.unwrap_or_else(|| {
                        AuthFailure::NotAccepted(
                            "it is neither this node's token nor a ServiceAccount token"
                                .to_string(),
                        )
                    }));
                }
                let verdict = self.review(token).await;
                // An unreachable or busy API server says nothing about the token.
                if !matches!(
                    verdict,
                    Err(AuthFailure::Unavailable(_) | AuthFailure::Overloaded)
                ) {
                    self.remember(key, token, verdict.clone());
                }
                verdict?
            }
        };
        if node != reported_node {
            let pod = match &credential {
                Credential::ServiceAccount { pod, .. } => pod.clone(),
                Credential::NodeToken => String::new(),
            };
            return Err(AuthFailure::OtherNode {
                pod,
                actual: node,
                reported: reported_node.to_string(),
            });
        }
        Ok(Identity { node, credential })
    }

    fn cached(&self, key: &TokenDigest) -> Option<Result<(String, Credential), AuthFailure>> {
        let now = Instant::now();
        for map in [&self.cache, &self.refused] {
            let map = map.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(cached) = map.get(key).filter(|cached| cached.until > now) {
                return Some(cached.verdict.clone());
            }
        }
        None
    }

    fn remember(
        &self,
        key: TokenDigest,
        token: &str,
        verdict: Result<(String, Credential), AuthFailure>,
    ) {
        let now = Instant::now();
        let (map, limit, ttl) = match &verdict {
            Ok(_) => (
                &self.cache,
                CACHE_LIMIT,
                trust_period(
                    self.policy.cache_ttl,
                    token_expiry(token),
                    unix_now(),
                    key[0],
                ),
            ),
            Err(_) => (
                &self.refused,
                REFUSED_LIMIT,
                self.policy.cache_ttl.min(REFUSED_TTL),
            ),
        };
        let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= limit {
            map.retain(|_, cached| cached.until > now);
            if map.len() >= limit {
                map.clear();
            }
        }
        map.insert(
            key,
            Cached {
                until: now + ttl,
                verdict,
            },
        );
    }

    async fn review(&self, token: &str) -> Result<(String, Credential), AuthFailure> {
        let Ok(_queued) = self.review_queue.try_acquire() else {
            return Err(AuthFailure::Overloaded);
        };
        let _permit = self
            .reviews
            .acquire()
            .await
            .map_err(|_| AuthFailure::Unavailable("stopping".to_string()))?;
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: Some(vec![self.policy.audience.clone()]),
            },
            ..TokenReview::default()
        };
        let reviews: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api_call(
            "a TokenReview",
            reviews.create(&PostParams::default(), &review),
        )
        .await?;
        let reviewed = judge_review(&answer.status.unwrap_or_default(), &self.policy)?;
        let node = match &reviewed.node {
            Some(node) => node.clone(),
            None => {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), &reviewed.pod_namespace);
                let pod =
                    api_call("reading the token's pod", pods.get_opt(&reviewed.pod_name)).await?;
                node_of_pod(&reviewed, pod.as_ref())?
            }
        };
        Ok((
            node,
            Credential::ServiceAccount {
                username: reviewed.username,
                pod: format!("{}/{}", reviewed.pod_namespace, reviewed.pod_name),
            },
        ))
    }

    /// Whether `key` is the digest of `node`'s token in the node-token Secret. The Secret
    /// is read again every 30 s by one request at a time, never under the lock the
    /// others read through; a failed read keeps the tokens read before.
    async fn node_token_matches(&self, key: &TokenDigest, node: &str) -> Result<bool, AuthFailure> {
        let Some(secret_name) = &self.policy.node_tokens_secret else {
            return Ok(false);
        };
        let due = {
            let tokens = self.node_tokens.lock().unwrap_or_else(|e| e.into_inner());
            tokens
                .read
                .is_none_or(|read| read.elapsed() > NODE_TOKENS_TTL)
        };
        if due && let Ok(_refreshing) = self.node_tokens_refresh.try_lock() {
            let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
            let read = api_call(
                "reading the node-token Secret",
                secrets.get_opt(secret_name),
            )
            .await;
            let mut tokens = self.node_tokens.lock().unwrap_or_else(|e| e.into_inner());
            tokens.read = Some(Instant::now());
            match read {
                Ok(secret) => {
                    tokens.tokens = secret
                        .and_then(|secret| secret.data)
                        .unwrap_or_default()
                        .into_iter()
                        .filter_map(|(node, value)| {
                            let token = String::from_utf8_lossy(&value.0).trim().to_string();
                            (!token.is_empty()).then(|| (node, digest(&token)))
                        })
                        .collect();
                    tokens.failure = None;
                }
                Err(failure) => {
                    tracing::warn!(
                        secret = %format!("{}/{secret_name}", self.namespace),
                        %failure,
                        "cannot read the node-token Secret; using the tokens read before, if any"
                    );
                    tokens.failure = Some(failure.to_string());
                }
            }
        }
        let tokens = self.node_tokens.lock().unwrap_or_else(|e| e.into_inner());
        match tokens.tokens.get(node) {
            Some(expected) => Ok(constant_time_eq(expected, key)),
            None if tokens.failure.is_some() && tokens.tokens.is_empty() => Err(
                AuthFailure::Unavailable("the node tokens cannot be read now".to_string()),
            ),
            None => Ok(false),
        }
    }
}

/// One API call with a deadline. What went wrong is logged here; the client is told only
/// that the check cannot be made now (API errors name objects it has no business seeing).
async fn api_call<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, AuthFailure> {
    match tokio::time::timeout(API_CALL_TIMEOUT, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => {
            tracing::warn!(%error, "{what} failed");
            Err(AuthFailure::Unavailable(format!("{what} failed")))
        }
        Err(_) => {
            tracing::warn!("{what} took longer than {API_CALL_TIMEOUT:?}");
            Err(AuthFailure::Unavailable(format!("{what} timed out")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo;

    fn status(username: &str, audiences: &[&str], extra: &[(&str, &str)]) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(true),
            audiences: Some(audiences.iter().map(|a| a.to_string()).collect()),
            error: None,
            user: Some(UserInfo {
                username: Some(username.to_string()),
                extra: Some(
                    extra
                        .iter()
                        .map(|(k, v)| (k.to_string(), vec![v.to_string()]))
                        .collect(),
                ),
                ..UserInfo::default()
            }),
        }
    }

    const AGENT: &str = "system:serviceaccount:nodekeeper-system:nodekeeper-agent";

    #[test]
    fn an_agent_token_bound_to_a_pod_names_its_node() {
        let reviewed = judge_review(
            &status(
                AGENT,
                &["nodekeeper-controller"],
                &[
                    (EXTRA_POD_NAME, "agent-x1"),
                    (EXTRA_POD_UID, "u1"),
                    (EXTRA_NODE_NAME, "worker-1"),
                ],
            ),
            &AuthPolicy::default(),
        )
        .expect("accepted");
        assert_eq!(reviewed.node.as_deref(), Some("worker-1"));
        assert_eq!(reviewed.pod_namespace, "nodekeeper-system");
        assert_eq!(reviewed.pod_name, "agent-x1");
    }

    #[test]
    fn other_accounts_audiences_and_unbound_tokens_are_refused() {
        let policy = AuthPolicy::default();
        let bound = [(EXTRA_POD_NAME, "p"), (EXTRA_NODE_NAME, "worker-1")];
        let other_account = judge_review(
            &status(
                "system:serviceaccount:default:web",
                &["nodekeeper-controller"],
                &bound,
            ),
            &policy,
        );
        assert!(matches!(other_account, Err(AuthFailure::NotAgent { .. })));
        assert_eq!(
            other_account.expect_err("refused").reason(),
            RefusalReason::Forbidden
        );
        let api_audience = judge_review(
            &status(
                AGENT,
                &["https://kubernetes.default.svc.cluster.local"],
                &bound,
            ),
            &policy,
        );
        assert!(matches!(api_audience, Err(AuthFailure::NotAccepted(_))));
        let unbound = judge_review(&status(AGENT, &["nodekeeper-controller"], &[]), &policy);
        assert_eq!(unbound, Err(AuthFailure::Unbound));
        let mut failed = status(AGENT, &["nodekeeper-controller"], &bound);
        failed.authenticated = Some(false);
        failed.error = Some("token has expired".to_string());
        assert_eq!(
            judge_review(&failed, &policy),
            Err(AuthFailure::NotAccepted("token has expired".to_string()))
        );
    }

    #[test]
    fn without_node_information_the_pod_decides() {
        let token = ReviewedToken {
            username: AGENT.to_string(),
            pod_namespace: "nodekeeper-system".to_string(),
            pod_name: "agent-x1".to_string(),
            pod_uid: Some("u1".to_string()),
            node: None,
        };
        let mut pod = Pod::default();
        pod.metadata.uid = Some("u1".to_string());
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: Some("worker-3".to_string()),
            ..Default::default()
        });
        assert_eq!(node_of_pod(&token, Some(&pod)), Ok("worker-3".to_string()));
        assert!(node_of_pod(&token, None).is_err(), "a deleted pod");
        pod.metadata.uid = Some("u2".to_string());
        let replaced = node_of_pod(&token, Some(&pod)).expect_err("replaced");
        assert!(replaced.to_string().contains("replaced"), "{replaced}");
    }

    #[test]
    fn bearer_tokens_are_read_from_the_header() {
        assert_eq!(bearer_token(Some("Bearer abc")), Ok("abc"));
        assert_eq!(bearer_token(Some("bearer  abc ")), Ok("abc"));
        assert_eq!(bearer_token(Some("Basic abc")), Err(AuthFailure::Missing));
        assert_eq!(bearer_token(Some("Bearer ")), Err(AuthFailure::Missing));
        assert_eq!(bearer_token(None), Err(AuthFailure::Missing));
    }

    #[test]
    fn only_jwt_shaped_tokens_are_reviewed() {
        assert!(looks_like_jwt("eyJhbGciOi.eyJpc3Mi.c2lnbmF0dXJl"));
        assert!(!looks_like_jwt("not-a-jwt"));
        assert!(!looks_like_jwt("a.b"));
        assert!(!looks_like_jwt("a.b.c d"));
        assert!(!looks_like_jwt(&format!("{}.b.c", "a".repeat(20_000))));
    }

    #[test]
    fn the_expiry_is_read_from_the_claims() {
        // {"aud":["x"],"exp":1790000000,"sub":"s"}
        let claims = "eyJhdWQiOlsieCJdLCJleHAiOjE3OTAwMDAwMDAsInN1YiI6InMifQ";
        assert_eq!(
            token_expiry(&format!("aGVhZA.{claims}.c2ln")),
            Some(1_790_000_000)
        );
        assert_eq!(token_expiry("aGVhZA.bm90IGpzb24.c2ln"), None, "not JSON");
        assert_eq!(token_expiry("aGVhZA.%%%.c2ln"), None, "not base64url");
        assert_eq!(base64url_decode("aGk"), Some(b"hi".to_vec()));
        assert_eq!(base64url_decode("aGk="), Some(b"hi".to_vec()));
        assert_eq!(base64url_decode("a"), None);
    }

    #[test]
    fn trust_ends_with_the_token_and_is_spread() {
        let minute = Duration::from_secs(60);
        assert_eq!(trust_period(minute, None, 1000, 0), minute);
        assert_eq!(
            trust_period(minute, None, 1000, 255),
            Duration::from_secs(45),
            "at most a quarter shorter"
        );
        assert_eq!(
            trust_period(minute, Some(1020), 1000, 0),
            Duration::from_secs(20),
            "never past the token's expiry"
        );
        assert_eq!(trust_period(minute, Some(900), 1000, 0), Duration::ZERO);
        assert_eq!(trust_period(Duration::ZERO, None, 1000, 9), Duration::ZERO);
    }

    #[test]
    fn tokens_compare_in_full() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
    }

    #[test]
    fn service_accounts_become_usernames() {
        assert_eq!(
            service_account_username("ns/name").as_deref(),
            Some("system:serviceaccount:ns:name")
        );
        assert_eq!(service_account_username("name"), None);
        assert_eq!(service_account_username("ns/"), None);
    }
}
