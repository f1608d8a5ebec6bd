//! Who is asking, and may they: the three gates every request passes in the real API server,
//! in its order.
//!
//! 1. **Authentication.** A bearer token must be one this server issued for its own audience
//!    (the service account authenticator, `tokens.rs`); anything else is `401 Unauthorized`.
//!    A request without one, or with the token of the kubeconfigs this server writes, is
//!    the test's own administrator, as the fake always treated it.
//! 2. **Authorization** (RBAC, plugin/pkg/auth/authorizer/rbac): a service account may do what
//!    the ClusterRoles and Roles stored here grant it through their bindings, nothing else
//!    (`403 Forbidden`, with the real message). Discovery is open to every authenticated user,
//!    as `system:discovery` opens it.
//! 3. **Validating admission policies** (admissionregistration.k8s.io/v1): every stored
//!    ValidatingAdmissionPolicy with a `Deny` binding is applied to the writes it matches,
//!    for every caller, the administrator included. Its match conditions, variables and
//!    validations are CEL, evaluated by the `cel` crate over `object`, `oldObject`,
//!    `request` and `variables` as the real server provides them. Parts this fake does not
//!    evaluate (selectors, params, `matchResources`, `excludeResourceRules`,
//!    `auditAnnotations`) refuse the request with a 500 naming the part, so a policy never
//!    passes here by being half read. An expression using a variable the fake does not
//!    provide (`authorizer`) fails, which denies under `failurePolicy: Fail`.
//!
//! Differences from the real evaluator, on purpose or by the library: variables are
//! evaluated eagerly (an unused variable that fails denies under `failurePolicy: Fail`),
//! and expressions are not type-checked (a real server reports type errors as warnings in
//! the policy's `status.typeChecking`). Denial messages lack the real server's
//! `<resource> "<name>" is forbidden: ` prefix, and RBAC's name a subresource in theirs.

use std::collections::HashMap;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject,
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::status::ApiError;
use super::store::Store;
use super::tokens::{self, Tokens};

/// The user a request without a bearer token, or with [`ADMIN_TOKEN`], acts as.
pub const ADMIN_USER: &str = "nodekeeper-test-admin";
/// The token of the kubeconfigs this server writes for the processes under test.
pub const ADMIN_TOKEN: &str = "nodekeeper-test-token";

/// Who a request comes from.
#[derive(Clone, Debug)]
pub enum Caller {
    /// No bearer token: the test's own client, allowed everything (admission still applies).
    Admin,
    /// A service account token this server issued.
    ServiceAccount(UserInfo),
}

impl Caller {
    /// `request.userInfo` as admission sees it.
    fn user_info(&self) -> Value {
        match self {
            Caller::Admin => json!({
                "username": ADMIN_USER,
                "uid": "",
                "groups": ["system:masters", "system:authenticated"],
                "extra": {},
            }),
            Caller::ServiceAccount(user) => json!({
                "username": user.username.clone().unwrap_or_default(),
                "uid": user.uid.clone().unwrap_or_default(),
                "groups": user.groups.clone().unwrap_or_default(),
                "extra": user.extra.clone().unwrap_or_default(),
            }),
        }
    }
}

/// The `Authorization` header's caller: none is the administrator, a bearer token must be
/// one this server issued for the API audience and still valid.
pub fn authenticate(
    store: &Store,
    tokens: &Tokens,
    authorization: Option<&str>,
) -> Result<Caller, ApiError> {
    let Some(header) = authorization else {
        return Ok(Caller::Admin);
    };
    let token = header
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|token| !token.is_empty())
        .ok_or_else(ApiError::unauthorized)?;
    if token == ADMIN_TOKEN {
        return Ok(Caller::Admin);
    }
    tokens::authenticate_bearer(store, tokens, token)
        .map(Caller::ServiceAccount)
        .map_err(|_| ApiError::unauthorized())
}

/// What a request asks to do, in RBAC's terms.
pub struct Attributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub plural: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

impl Attributes<'_> {
    fn resource(&self) -> String {
        match self.subresource {
            Some(subresource) => format!("{}/{subresource}", self.plural),
            None => self.plural.to_string(),
        }
    }
}

fn stored<K: DeserializeOwned>(store: &Store, group: &str, plural: &str) -> Vec<K> {
    store
        .list_by_key(group, plural)
        .into_iter()
        .filter_map(|object| serde_json::from_value(object).ok())
        .collect()
}

fn subject_is(subject: &Subject, user: &UserInfo) -> bool {
    let username = user.username.as_deref().unwrap_or_default();
    match subject.kind.as_str() {
        "User" => subject.name == username,
        "Group" => user
            .groups
            .iter()
            .flatten()
            .any(|group| *group == subject.name),
        "ServiceAccount" => {
            let namespace = subject.namespace.as_deref().unwrap_or_default();
            username == format!("system:serviceaccount:{namespace}:{}", subject.name)
        }
        _ => false,
    }
}

/// Whether a rule's list (verbs, groups, versions, operations) holds `wanted` or `*`.
fn lists<'a>(items: impl IntoIterator<Item = &'a String>, wanted: &str) -> bool {
    items.into_iter().any(|item| item == "*" || item == wanted)
}

/// One rule of a role, matched as `rbac/v1` helpers match it.
fn rule_allows(rule: &PolicyRule, asked: &Attributes) -> bool {
    let resource = asked.resource();
    let resource_matches = rule.resources.iter().flatten().any(|item| {
        item == "*"
            || *item == resource
            || asked
                .subresource
                .is_some_and(|subresource| *item == format!("*/{subresource}"))
    });
    let name_matches = match &rule.resource_names {
        None => true,
        Some(names) if names.is_empty() => true,
        Some(names) => asked
            .name
            .is_some_and(|name| names.iter().any(|allowed| allowed == name)),
    };
    lists(&rule.verbs, asked.verb)
        && lists(rule.api_groups.iter().flatten(), asked.group)
        && resource_matches
        && name_matches
}

/// RBAC for a service account: allowed when a binding of it to a role grants the verb on
/// the resource (cluster-wide through a ClusterRoleBinding, in one namespace through a
/// RoleBinding there).
pub fn authorize(store: &Store, caller: &Caller, asked: &Attributes) -> Result<(), ApiError> {
    let Caller::ServiceAccount(user) = caller else {
        return Ok(());
    };
    let cluster_roles: Vec<ClusterRole> =
        stored(store, "rbac.authorization.k8s.io", "clusterroles");
    let cluster_role = |name: &str| {
        cluster_roles
            .iter()
            .find(|role| role.metadata.name.as_deref() == Some(name))
            .map(|role| role.rules.clone().unwrap_or_default())
    };
    let mut granted: Vec<PolicyRule> = Vec::new();
    for binding in
        stored::<ClusterRoleBinding>(store, "rbac.authorization.k8s.io", "clusterrolebindings")
    {
        let bound = binding
            .subjects
            .iter()
            .flatten()
            .any(|s| subject_is(s, user));
        if bound && binding.role_ref.kind == "ClusterRole" {
            granted.extend(cluster_role(&binding.role_ref.name).unwrap_or_default());
        }
    }
    if let Some(namespace) = asked.namespace {
        let roles: Vec<Role> = stored(store, "rbac.authorization.k8s.io", "roles");
        for binding in stored::<RoleBinding>(store, "rbac.authorization.k8s.io", "rolebindings") {
            if binding.metadata.namespace.as_deref() != Some(namespace)
                || !binding
                    .subjects
                    .iter()
                    .flatten()
                    .any(|s| subject_is(s, user))
            {
                continue;
            }
            let rules = match binding.role_ref.kind.as_str() {
                "ClusterRole" => cluster_role(&binding.role_ref.name),
                "Role" => roles
                    .iter()
                    .find(|role| {
                        role.metadata.name.as_deref() == Some(binding.role_ref.name.as_str())
                            && role.metadata.namespace.as_deref() == Some(namespace)
                    })
                    .map(|role| role.rules.clone().unwrap_or_default()),
                _ => None,
            };
            granted.extend(rules.unwrap_or_default());
        }
    }
    if granted.iter().any(|rule| rule_allows(rule, asked)) {
        return Ok(());
    }
    let username = user.username.as_deref().unwrap_or_default();
    let object = match asked.name {
        Some(name) => format!("{} {name:?}", qualified(asked.group, &asked.resource())),
        None => qualified(asked.group, &asked.resource()),
    };
    let scope = match asked.namespace {
        Some(namespace) => format!("in the namespace {namespace:?}"),
        None => "at the cluster scope".to_string(),
    };
    Err(ApiError::forbidden(format!(
        "{object} is forbidden: User {username:?} cannot {} resource {:?} in API group {:?} {scope}",
        asked.verb,
        asked.resource(),
        asked.group,
    )))
}

fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

// ---- validating admission policies ----

/// The policies that apply to one write, read from the store when the request arrives.
pub struct Admission {
    caller: Caller,
    policies: Vec<(ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding)>,
    group: String,
    version: String,
    plural: String,
    kind: String,
    subresource: Option<String>,
    namespace: String,
    name: String,
}

const ADMISSION_GROUP: &str = "admissionregistration.k8s.io";

impl Admission {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: &Store,
        caller: Caller,
        group: &str,
        version: &str,
        plural: &str,
        kind: &str,
        subresource: Option<&str>,
        namespace: &str,
        name: &str,
    ) -> Self {
        let policies: Vec<ValidatingAdmissionPolicy> =
            stored(store, ADMISSION_GROUP, "validatingadmissionpolicies");
        let bindings: Vec<ValidatingAdmissionPolicyBinding> =
            stored(store, ADMISSION_GROUP, "validatingadmissionpolicybindings");
        let mut bound = Vec::new();
        for binding in bindings {
            let policy_name = binding
                .spec
                .as_ref()
                .and_then(|spec| spec.policy_name.clone())
                .unwrap_or_default();
            if let Some(policy) = policies
                .iter()
                .find(|policy| policy.metadata.name.as_deref() == Some(policy_name.as_str()))
            {
                bound.push((policy.clone(), binding));
            }
        }
        Self {
            caller,
            policies: bound,
            group: group.to_string(),
            version: version.to_string(),
            plural: plural.to_string(),
            kind: kind.to_string(),
            subresource: subresource.map(str::to_string),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// Checks one write: `old` absent for a create, `new` absent for a delete.
    pub fn check(&self, old: Option<&Value>, new: Option<&Value>) -> Result<(), ApiError> {
        if self.policies.is_empty() {
            return Ok(());
        }
        let operation = match (old, new) {
            (None, _) => "CREATE",
            (Some(_), Some(_)) => "UPDATE",
            (Some(_), None) => "DELETE",
        };
        let name = new
            .or(old)
            .and_then(|object| object.pointer("/metadata/name"))
            .and_then(Value::as_str)
            .unwrap_or(&self.name)
            .to_string();
        let request = json!({
            "uid": super::verbs::new_uid(),
            "kind": {"group": self.group, "version": self.version, "kind": self.kind},
            "resource": {"group": self.group, "version": self.version, "resource": self.plural},
            "subResource": self.subresource.clone().unwrap_or_default(),
            "requestKind": {"group": self.group, "version": self.version, "kind": self.kind},
            "requestResource": {"group": self.group, "version": self.version, "resource": self.plural},
            "requestSubResource": self.subresource.clone().unwrap_or_default(),
            "name": name,
            "namespace": self.namespace,
            "operation": operation,
            "userInfo": self.caller.user_info(),
            "dryRun": false,
        });
        for (policy, binding) in &self.policies {
            check_policy(policy, binding, &request, old, new, operation, self)?;
        }
        Ok(())
    }
}

fn unsupported(policy: &str, part: &str) -> ApiError {
    ApiError::injected(500).with_message(format!(
        "the fake API server cannot evaluate {part} of ValidatingAdmissionPolicy {policy:?}"
    ))
}

fn rule_matches(
    rule: &k8s_openapi::api::admissionregistration::v1::NamedRuleWithOperations,
    admission: &Admission,
    operation: &str,
) -> bool {
    let resource = match &admission.subresource {
        Some(subresource) => format!("{}/{subresource}", admission.plural),
        None => admission.plural.clone(),
    };
    let resource_matches = rule.resources.iter().flatten().any(|item| {
        *item == resource
            || (item == "*" && admission.subresource.is_none())
            || item == "*/*"
            || admission.subresource.as_ref().is_some_and(|subresource| {
                *item == format!("*/{subresource}") || *item == format!("{}/*", admission.plural)
            })
    });
    let name_matches = match &rule.resource_names {
        Some(names) if !names.is_empty() => names.contains(&admission.name),
        _ => true,
    };
    lists(rule.api_groups.iter().flatten(), &admission.group)
        && lists(rule.api_versions.iter().flatten(), &admission.version)
        && lists(rule.operations.iter().flatten(), operation)
        && resource_matches
        && name_matches
}

/// A condition or validation: its bool, or why it has none (an error, another type).
fn truth(expression: &str, context: &cel::Context) -> Result<bool, String> {
    match evaluate(expression, context)? {
        cel::Value::Bool(value) => Ok(value),
        other => Err(format!("gave {other:?}, not a bool")),
    }
}

/// What one CEL expression gives: a value, or the error the real server would report.
fn evaluate(expression: &str, context: &cel::Context) -> Result<cel::Value, String> {
    let program =
        cel::Program::compile(expression).map_err(|error| format!("compilation: {error}"))?;
    program.execute(context).map_err(|error| error.to_string())
}

fn denial(reason: Option<&str>, message: String) -> ApiError {
    let (code, reason) = match reason.unwrap_or("Invalid") {
        "Forbidden" => (403, "Forbidden"),
        "Unauthorized" => (401, "Unauthorized"),
        "RequestEntityTooLarge" => (413, "RequestEntityTooLarge"),
        _ => (422, "Invalid"),
    };
    ApiError::injected(code)
        .with_reason(reason)
        .with_message(message)
}

fn check_policy(
    policy: &ValidatingAdmissionPolicy,
    binding: &ValidatingAdmissionPolicyBinding,
    request: &Value,
    old: Option<&Value>,
    new: Option<&Value>,
    operation: &str,
    admission: &Admission,
) -> Result<(), ApiError> {
    let policy_name = policy.metadata.name.clone().unwrap_or_default();
    let binding_name = binding.metadata.name.clone().unwrap_or_default();
    let Some(spec) = &policy.spec else {
        return Ok(());
    };
    let binding_spec = binding.spec.clone().unwrap_or_default();
    if !binding_spec
        .validation_actions
        .iter()
        .flatten()
        .any(|action| action == "Deny")
    {
        return Ok(());
    }
    if binding_spec.param_ref.is_some() || spec.param_kind.is_some() {
        return Err(unsupported(&policy_name, "params"));
    }
    if binding_spec.match_resources.is_some() {
        return Err(unsupported(&policy_name, "its binding's matchResources"));
    }
    if spec.audit_annotations.is_some() {
        return Err(unsupported(&policy_name, "auditAnnotations"));
    }
    let Some(constraints) = &spec.match_constraints else {
        return Ok(());
    };
    let selects =
        |selector: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>| {
            selector.as_ref().is_some_and(|selector| {
                selector
                    .match_labels
                    .as_ref()
                    .is_some_and(|labels| !labels.is_empty())
                    || selector
                        .match_expressions
                        .as_ref()
                        .is_some_and(|list| !list.is_empty())
            })
        };
    if selects(&constraints.namespace_selector) || selects(&constraints.object_selector) {
        return Err(unsupported(&policy_name, "a namespace or object selector"));
    }
    if constraints
        .exclude_resource_rules
        .as_ref()
        .is_some_and(|rules| !rules.is_empty())
    {
        return Err(unsupported(&policy_name, "excludeResourceRules"));
    }
    let matched = constraints
        .resource_rules
        .iter()
        .flatten()
        .any(|rule| rule_matches(rule, admission, operation));
    if !matched {
        return Ok(());
    }
    let fail_closed = spec.failure_policy.as_deref() != Some("Ignore");
    let denied_by = |message: String, reason: Option<&str>| {
        denial(
            reason,
            format!(
                "ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}' denied request: {message}"
            ),
        )
    };
    let mut context = cel::Context::default();
    let add = |context: &mut cel::Context, name: &str, value: &Value| {
        context
            .add_variable(name, value.clone())
            .map_err(|error| unsupported(&policy_name, &format!("the value of {name} ({error})")))
    };
    add(&mut context, "request", request)?;
    add(&mut context, "object", new.unwrap_or(&Value::Null))?;
    add(&mut context, "oldObject", old.unwrap_or(&Value::Null))?;
    add(&mut context, "params", &Value::Null)?;
    add(&mut context, "namespaceObject", &Value::Null)?;
    for condition in spec.match_conditions.iter().flatten() {
        match truth(&condition.expression, &context) {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(error) if fail_closed => {
                return Err(denied_by(
                    format!("matchCondition {:?} failed: {error}", condition.name),
                    None,
                ));
            }
            Err(_) => return Ok(()),
        }
    }
    // Each variable sees the ones before it, as `variables.<name>`.
    let mut variables: HashMap<cel::objects::Key, cel::Value> = HashMap::new();
    for variable in spec.variables.iter().flatten() {
        let value = match evaluate(&variable.expression, &context) {
            Ok(value) => value,
            Err(error) if fail_closed => {
                return Err(denied_by(
                    format!("variable {:?} failed: {error}", variable.name),
                    None,
                ));
            }
            Err(_) => return Ok(()),
        };
        variables.insert(cel::objects::Key::from(variable.name.clone()), value);
        context.add_variable_from_value("variables", cel::Value::Map(variables.clone().into()));
    }
    for validation in spec.validations.iter().flatten() {
        // messageExpression first; when it fails or gives no string, message, then the
        // expression itself, as the real server words it.
        let message = || {
            let from_expression = validation
                .message_expression
                .as_deref()
                .and_then(|expression| match evaluate(expression, &context) {
                    Ok(cel::Value::String(text)) if !text.trim().is_empty() => {
                        Some(text.to_string())
                    }
                    _ => None,
                });
            from_expression
                .or_else(|| validation.message.clone())
                .unwrap_or_else(|| format!("failed expression: {}", validation.expression))
        };
        match truth(&validation.expression, &context) {
            Ok(true) => {}
            Ok(false) => return Err(denied_by(message(), validation.reason.as_deref())),
            Err(error) if fail_closed => {
                return Err(denied_by(
                    format!(
                        "expression '{}' resulted in error: {error}",
                        validation.expression
                    ),
                    None,
                ));
            }
            Err(_) => {}
        }
    }
    Ok(())
}
