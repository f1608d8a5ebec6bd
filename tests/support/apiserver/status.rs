//! API errors rendered as Kubernetes `Status` bodies, with the reasons and messages the real
//! API server uses, so client code that inspects `reason` or `code` behaves the same here.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};

/// A failed API call: HTTP code, `Status.reason` and a human message.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Box<StatusDetails>>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn about(mut self, group: &str, plural: &str, name: &str) -> Self {
        self.details = Some(Box::new(StatusDetails {
            group: (!group.is_empty()).then(|| group.to_string()),
            kind: Some(plural.to_string()),
            name: (!name.is_empty()).then(|| name.to_string()),
            ..StatusDetails::default()
        }));
        self
    }

    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, plural)),
        )
        .about(group, plural, name)
    }

    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, plural)),
        )
        .about(group, plural, name)
    }

    /// A stale `resourceVersion` on update: the message kubectl users know.
    pub fn stale(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, plural)
            ),
        )
        .about(group, plural, name)
    }

    /// Server-side apply found fields owned by other managers.
    pub fn apply_conflicts(
        group: &str,
        plural: &str,
        name: &str,
        conflicts: &[(String, String)],
    ) -> Self {
        let noun = if conflicts.len() == 1 {
            "conflict"
        } else {
            "conflicts"
        };
        let listed: Vec<String> = conflicts
            .iter()
            .map(|(manager, field)| format!("conflict with \"{manager}\": {field}"))
            .collect();
        let mut error = Self::new(
            409,
            "Conflict",
            format!(
                "Apply failed with {} {noun}: {}",
                conflicts.len(),
                listed.join("\n")
            ),
        )
        .about(group, plural, name);
        if let Some(details) = error.details.as_mut() {
            details.causes = Some(
                conflicts
                    .iter()
                    .map(|(manager, field)| StatusCause {
                        reason: Some("FieldManagerConflict".to_string()),
                        message: Some(format!("conflict with \"{manager}\"")),
                        field: Some(field.clone()),
                    })
                    .collect(),
            );
        }
        error
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn too_old(requested: u64, oldest: u64) -> Self {
        Self::gone(format!("too old resource version: {requested} ({oldest})"))
    }

    pub fn invalid(group: &str, plural: &str, name: &str, why: impl Into<String>) -> Self {
        let why = why.into();
        Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {why}", qualified(group, plural)),
        )
        .about(group, plural, name)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json; got {content_type:?}"
            ),
        )
    }

    pub fn path_not_found(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// A failure injected by a test: any code, with the reason the real server pairs with it.
    pub fn injected(code: u16) -> Self {
        let reason = match code {
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            409 => "Conflict",
            404 => "NotFound",
            403 => "Forbidden",
            401 => "Unauthorized",
            _ => "InternalError",
        };
        Self::new(code, reason, format!("injected failure (HTTP {code})"))
    }

    /// A request whose credential the server does not accept.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// A request RBAC or an admission policy refused.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    pub fn with_reason(mut self, reason: &'static str) -> Self {
        self.reason = reason;
        self
    }

    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }

    pub fn to_status(&self) -> Status {
        Status {
            code: Some(i32::from(self.code)),
            details: self.details.as_deref().cloned(),
            message: Some(self.message.clone()),
            reason: Some(self.reason.to_string()),
            status: Some("Failure".to_string()),
            ..Status::default()
        }
    }
}

/// `pods`, or `leases.coordination.k8s.io` for named groups, as in the server's messages.
fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}
