//! Fault injection and the request log.

use std::time::Duration;

use serde_json::Value;

/// Which requests a failure rule hits. Empty fields match everything.
#[derive(Clone, Debug, Default)]
pub struct RequestMatcher {
    /// HTTP method, e.g. "PATCH".
    pub method: Option<String>,
    /// A substring of the path, e.g. "/pods/" or "/status".
    pub path_contains: Option<String>,
    /// Whether the rule hits watch requests (`Some(true)`), everything but watches (`Some(false)`), or both.
    pub watch: Option<bool>,
    /// A substring of the request body, e.g. `"method":"ipmi-off"` to hit only the status
    /// write that records a given execution.
    pub body_contains: Option<String>,
}

impl RequestMatcher {
    pub fn any() -> Self {
        Self::default()
    }

    pub fn method(method: &str) -> Self {
        Self {
            method: Some(method.to_string()),
            ..Self::default()
        }
    }

    pub fn path(fragment: &str) -> Self {
        Self {
            path_contains: Some(fragment.to_string()),
            ..Self::default()
        }
    }

    pub fn and_path(mut self, fragment: &str) -> Self {
        self.path_contains = Some(fragment.to_string());
        self
    }

    pub fn and_body(mut self, fragment: &str) -> Self {
        self.body_contains = Some(fragment.to_string());
        self
    }

    /// Whether a request already made (from [`super::FakeApiServer::requests`]) is one
    /// this matcher hits.
    pub fn hits(&self, request: &RecordedRequest) -> bool {
        self.matches(
            &request.method,
            &request.path,
            request.is_watch(),
            &request.body,
        )
    }

    fn matches(&self, method: &str, path: &str, is_watch: bool, body: &str) -> bool {
        self.method
            .as_deref()
            .is_none_or(|wanted| wanted.eq_ignore_ascii_case(method))
            && self
                .path_contains
                .as_deref()
                .is_none_or(|fragment| path.contains(fragment))
            && self.watch.is_none_or(|wanted| wanted == is_watch)
            && self
                .body_contains
                .as_deref()
                .is_none_or(|fragment| body.contains(fragment))
    }
}

#[derive(Clone, Debug)]
struct FailureRule {
    matcher: RequestMatcher,
    status: u16,
    /// `None` fails forever, until `clear_failures`.
    remaining: Option<usize>,
}

#[derive(Default)]
pub struct Faults {
    pub latency: Duration,
    rules: Vec<FailureRule>,
}

impl Faults {
    pub fn add_rule(&mut self, matcher: RequestMatcher, status: u16, times: Option<usize>) {
        self.rules.push(FailureRule {
            matcher,
            status,
            remaining: times,
        });
    }

    pub fn clear(&mut self) {
        self.rules.clear();
    }

    /// The injected status for this request, if a rule hits it; counts the hit.
    pub fn take_failure(
        &mut self,
        method: &str,
        path: &str,
        is_watch: bool,
        body: &str,
    ) -> Option<u16> {
        let rule = self.rules.iter_mut().find(|rule| {
            rule.remaining != Some(0) && rule.matcher.matches(method, path, is_watch, body)
        })?;
        if let Some(remaining) = rule.remaining.as_mut() {
            *remaining -= 1;
        }
        let status = rule.status;
        self.rules.retain(|rule| rule.remaining != Some(0));
        Some(status)
    }
}

/// One request as the server received it, and how it answered.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    /// The raw query string, percent-encoded as sent.
    pub query: String,
    pub content_type: Option<String>,
    /// The `Accept` header; empty when the client sent none.
    pub accept: String,
    /// The `User-Agent` header; empty when the client sent none.
    pub user_agent: String,
    pub body: String,
    pub status: u16,
    /// When the server answered it (and logged it).
    pub answered_at: std::time::Instant,
}

/// The RBAC view of a request: which verb on which resource.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RbacAccess {
    pub verb: String,
    /// API group, "" for core.
    pub group: String,
    /// Plural resource, with `/subresource` when there is one, as RBAC rules name them.
    pub resource: String,
}

impl RecordedRequest {
    /// A query parameter, percent-decoded.
    pub fn query_param(&self, name: &str) -> Option<String> {
        super::routes::parse_query(&self.query)
            .into_iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value)
    }

    pub fn json_body(&self) -> Option<Value> {
        serde_json::from_str(&self.body).ok()
    }

    pub fn is_watch(&self) -> bool {
        matches!(self.query_param("watch").as_deref(), Some("true" | "1"))
    }

    /// The namespace the request is in; None for a cluster-scoped or all-namespaces one.
    pub fn namespace(&self) -> Option<String> {
        super::routes::parse_resource_path(&self.path)?.namespace
    }

    /// The verb and resource RBAC would check for this request (None for discovery paths).
    pub fn rbac_access(&self) -> Option<RbacAccess> {
        let target = super::routes::parse_resource_path(&self.path)?;
        let verb = super::verbs::verb(&self.method, target.name.is_some(), self.is_watch())?;
        let resource = match target.subresource {
            Some(subresource) => format!("{}/{subresource}", target.plural),
            None => target.plural,
        };
        Some(RbacAccess {
            verb: verb.to_string(),
            group: target.group,
            resource,
        })
    }
}
