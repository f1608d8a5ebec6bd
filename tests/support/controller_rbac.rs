//! The fence controller's rights as the shipped manifests grant them
//! (packaging/kubernetes/controller/rbac.yaml, and optional/ for settings that are off by
//! default), and the check every controller test makes when its controller process ends:
//! the controller asked the API server for nothing its ServiceAccount would be refused.
//! [`granted_to`] reads the agent's rights the same way (tests/kube_agent.rs).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use nodekeeper::controller::ControllerPolicy;
use nodekeeper::controller::policy::ExecutorPolicy;

use super::apiserver::RecordedRequest;

/// The controller's ServiceAccount in the manifests: (namespace, name).
pub const SERVICE_ACCOUNT: (&str, &str) = ("nodekeeper-fencing", "nodekeeper-controller");
/// The namespace the manifests' controller configuration names (`namespace`); a test's
/// controller may use another, and its Roles are then read as if they were there.
pub const MANIFEST_NAMESPACE: &str = "nodekeeper-fencing";

/// The rights of the default configuration.
pub const BASE: &str = "controller/rbac.yaml";
/// With `release.deletePods: true`.
pub const DELETE_PODS: &str = "controller/optional/delete-pods/rbac.yaml";
/// With `executor.type: job`.
pub const JOB_EXECUTOR: &str = "controller/optional/job-executor/rbac.yaml";

/// One verb on one resource, everywhere (`namespace` None) or in one namespace.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Right {
    pub verb: String,
    pub group: String,
    /// Plural, with `/subresource`, as RBAC rules name them.
    pub resource: String,
    pub namespace: Option<String>,
}

impl Right {
    pub fn new(verb: &str, group: &str, resource: &str, namespace: Option<&str>) -> Right {
        Right {
            verb: verb.to_string(),
            group: group.to_string(),
            resource: resource.to_string(),
            namespace: namespace.map(str::to_string),
        }
    }
}

pub fn packaging() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/kubernetes")
}

fn rights_of(rules: &[PolicyRule], namespace: Option<&str>) -> Vec<Right> {
    let mut rights = Vec::new();
    for rule in rules {
        // Neither is counted here: a rule limited to some names would read as a full
        // grant, and a wildcard as none. The manifests use neither.
        assert!(
            rule.resource_names.is_none() && rule.non_resource_urls.is_none(),
            "resourceNames and nonResourceURLs are not read by this check: {rule:?}"
        );
        let all = [
            &rule.verbs,
            rule.api_groups.as_ref().unwrap_or(&Vec::new()),
            rule.resources.as_ref().unwrap_or(&Vec::new()),
        ]
        .into_iter()
        .any(|list| list.iter().any(|item| item.contains('*')));
        assert!(!all, "a wildcard grants more than its code uses: {rule:?}");
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    rights.push(Right::new(verb, group, resource, namespace));
                }
            }
        }
    }
    rights
}

/// Every right `file` (under packaging/kubernetes) gives the controller's ServiceAccount
/// (see [`granted_to`]).
pub fn granted_by(file: &str) -> BTreeSet<Right> {
    granted_to(file, SERVICE_ACCOUNT)
}

/// Every right `file` (under packaging/kubernetes) gives the ServiceAccount `account`
/// (namespace, name) through its own bindings to its own roles. A binding to a role the
/// file does not define fails: neither component is given a built-in role.
pub fn granted_to(file: &str, account: (&str, &str)) -> BTreeSet<Right> {
    let path = packaging().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut cluster_roles = Vec::new();
    let mut roles = Vec::new();
    let mut cluster_bindings = Vec::new();
    let mut bindings = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let value: serde_json::Value = serde::Deserialize::deserialize(document)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        match value["kind"].as_str() {
            Some("ClusterRole") => {
                cluster_roles.push(serde_json::from_value::<ClusterRole>(value).unwrap())
            }
            Some("Role") => roles.push(serde_json::from_value::<Role>(value).unwrap()),
            Some("ClusterRoleBinding") => {
                cluster_bindings.push(serde_json::from_value::<ClusterRoleBinding>(value).unwrap())
            }
            Some("RoleBinding") => {
                bindings.push(serde_json::from_value::<RoleBinding>(value).unwrap())
            }
            _ => {}
        }
    }
    let (sa_namespace, sa_name) = account;
    let binds_account = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.iter().flatten().any(|subject| {
            subject.kind == "ServiceAccount"
                && subject.name == sa_name
                && subject.namespace.as_deref() == Some(sa_namespace)
        })
    };
    let cluster_role = |name: &str| {
        cluster_roles
            .iter()
            .find(|role| role.metadata.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("{file}: ClusterRole {name} is bound but not defined here"))
    };
    let mut granted = BTreeSet::new();
    for binding in cluster_bindings
        .iter()
        .filter(|b| binds_account(&b.subjects))
    {
        assert_eq!(binding.role_ref.kind, "ClusterRole", "{file}");
        let role = cluster_role(&binding.role_ref.name);
        granted.extend(rights_of(role.rules.as_deref().unwrap_or_default(), None));
    }
    for binding in bindings.iter().filter(|b| binds_account(&b.subjects)) {
        let namespace = binding.metadata.namespace.as_deref();
        assert!(
            namespace.is_some(),
            "{file}: a RoleBinding without a namespace"
        );
        let rules = match binding.role_ref.kind.as_str() {
            "ClusterRole" => cluster_role(&binding.role_ref.name).rules.clone(),
            _ => {
                let role = roles
                    .iter()
                    .find(|role| {
                        role.metadata.name.as_deref() == Some(binding.role_ref.name.as_str())
                            && role.metadata.namespace.as_deref() == namespace
                    })
                    .unwrap_or_else(|| {
                        panic!(
                            "{file}: Role {} is bound but not defined here",
                            binding.role_ref.name
                        )
                    });
                role.rules.clone()
            }
        };
        granted.extend(rights_of(rules.as_deref().unwrap_or_default(), namespace));
    }
    granted
}

/// What the manifests grant a controller running with `policy`: the base rights and the
/// optional ones its settings need, with the manifests' namespace read as `policy`'s.
pub fn granted_for(policy: &ControllerPolicy) -> BTreeSet<Right> {
    let mut files = vec![BASE];
    if policy.fence.delete_pods {
        files.push(DELETE_PODS);
    }
    if matches!(policy.executor, ExecutorPolicy::Job(_)) {
        files.push(JOB_EXECUTOR);
    }
    files
        .into_iter()
        .flat_map(granted_by)
        .map(|mut right| {
            if right.namespace.as_deref() == Some(MANIFEST_NAMESPACE) {
                right.namespace = Some(policy.namespace.clone());
            }
            right
        })
        .collect()
}

/// Whether `broad` covers `narrow`: the same verb on the same resource, everywhere or in
/// the same namespace.
fn covers(broad: &Right, narrow: &Right) -> bool {
    broad.verb == narrow.verb
        && broad.group == narrow.group
        && broad.resource == narrow.resource
        && (broad.namespace.is_none() || broad.namespace == narrow.namespace)
}

/// Whether `granted` allows `wanted` (a request in one namespace, or cluster-wide).
pub fn allows(granted: &BTreeSet<Right>, wanted: &Right) -> bool {
    granted.iter().any(|right| covers(right, wanted))
}

/// Every right the controller's requests in `log` needed (those with its user agent).
pub fn used_by_controller(log: &[RecordedRequest]) -> BTreeSet<Right> {
    // The controller's user agent, not the agents' or the test's own client.
    let controller = nodekeeper::kubernetes::CONTROLLER_USER_AGENT;
    log.iter()
        .filter(|request| request.user_agent == controller)
        .filter_map(|request| {
            let access = request.rbac_access()?;
            Some(Right {
                verb: access.verb,
                group: access.group,
                resource: access.resource,
                namespace: request.namespace(),
            })
        })
        .collect()
}

/// The rights in `log` that the manifests do not grant a controller with `policy`.
pub fn ungranted(log: &[RecordedRequest], policy: &ControllerPolicy) -> Vec<Right> {
    let granted = granted_for(policy);
    used_by_controller(log)
        .into_iter()
        .filter(|used| !allows(&granted, used))
        .collect()
}

/// Where a right is granted: everywhere, or in the controller's namespace, or among the
/// kubelets' node Leases.
#[derive(Clone, Copy, Debug)]
pub enum Scope {
    Cluster,
    Fencing,
    NodeLeases,
}

type Use = (&'static str, &'static str, &'static str, Scope);

/// The test that shows each right the manifests grant in use: together, every right of
/// the base and the optional files (tests/manifests.rs checks that), each asserted by
/// its test through [`assert_exercised`], so no right is granted that the code does not
/// use.
#[rustfmt::skip] // a table: one right per line
pub const EXERCISED: &[(&str, &[Use])] = &[
    (
        "a_lost_node_is_isolated_powered_off_released_and_recovered",
        &[
            ("get", "", "nodes", Scope::Cluster),
            ("list", "", "nodes", Scope::Cluster),
            ("watch", "", "nodes", Scope::Cluster),
            ("patch", "", "nodes", Scope::Cluster),
            ("list", "", "pods", Scope::Cluster),
            ("delete", "", "pods", Scope::Cluster),
            ("get", "", "persistentvolumeclaims", Scope::Cluster),
            ("get", "fencing.nodekeeper.io", "nodefences", Scope::Cluster),
            ("list", "fencing.nodekeeper.io", "nodefences", Scope::Cluster),
            ("watch", "fencing.nodekeeper.io", "nodefences", Scope::Cluster),
            ("create", "fencing.nodekeeper.io", "nodefences", Scope::Cluster),
            ("delete", "fencing.nodekeeper.io", "nodefences", Scope::Cluster),
            ("update", "fencing.nodekeeper.io", "nodefences/status", Scope::Cluster),
            ("create", "events.k8s.io", "events", Scope::Cluster),
            ("list", "", "configmaps", Scope::Fencing),
            ("get", "", "secrets", Scope::Fencing),
            ("get", "coordination.k8s.io", "leases", Scope::Fencing),
            ("create", "coordination.k8s.io", "leases", Scope::Fencing),
            ("update", "coordination.k8s.io", "leases", Scope::Fencing),
            ("list", "coordination.k8s.io", "leases", Scope::NodeLeases),
            ("watch", "coordination.k8s.io", "leases", Scope::NodeLeases),
        ],
    ),
    (
        "without_node_information_in_the_token_the_pod_says_where_it_runs",
        &[
            ("create", "authentication.k8s.io", "tokenreviews", Scope::Cluster),
            ("get", "", "pods", Scope::Cluster),
        ],
    ),
    (
        "a_lost_node_is_fenced_through_one_job_per_execution_with_no_credential_in_sight",
        &[
            ("get", "batch", "jobs", Scope::Fencing),
            ("list", "batch", "jobs", Scope::Fencing),
            ("watch", "batch", "jobs", Scope::Fencing),
            ("create", "batch", "jobs", Scope::Fencing),
            ("list", "", "pods", Scope::Fencing),
            ("watch", "", "pods", Scope::Fencing),
        ],
    ),
    (
        "the_report_service_follows_the_leader_and_only_the_leader",
        &[
            ("list", "discovery.k8s.io", "endpointslices", Scope::Fencing),
            ("create", "discovery.k8s.io", "endpointslices", Scope::Fencing),
            ("update", "discovery.k8s.io", "endpointslices", Scope::Fencing),
        ],
    ),
    (
        "a_silent_node_with_no_fence_device_is_released_once_its_agents_promise_runs_out",
        &[("get", "coordination.k8s.io", "leases", Scope::NodeLeases)],
    ),
];

fn right_of(used: &Use, fencing_namespace: &str) -> Right {
    let (verb, group, resource, scope) = *used;
    let namespace = match scope {
        Scope::Cluster => None,
        Scope::Fencing => Some(fencing_namespace),
        Scope::NodeLeases => Some("kube-node-lease"),
    };
    Right::new(verb, group, resource, namespace)
}

/// Every right [`EXERCISED`] names, as the manifests would grant it.
pub fn exercised() -> BTreeSet<Right> {
    EXERCISED
        .iter()
        .flat_map(|(_, uses)| uses.iter())
        .map(|used| right_of(used, MANIFEST_NAMESPACE))
        .collect()
}

/// Asserts that the controller's requests in `log` used every right [`EXERCISED`]
/// assigns to `test` (a cluster-wide right in any namespace).
pub fn assert_exercised(log: &[RecordedRequest], test: &str, fencing_namespace: &str) {
    let (_, uses) = EXERCISED
        .iter()
        .find(|(name, _)| *name == test)
        .unwrap_or_else(|| panic!("{test} is not in controller_rbac::EXERCISED"));
    let used = used_by_controller(log);
    let missing: Vec<Right> = uses
        .iter()
        .map(|right| right_of(right, fencing_namespace))
        .filter(|wanted| !used.iter().any(|used| covers(wanted, used)))
        .collect();
    assert!(
        missing.is_empty(),
        "{test} should show the controller using these rights, and did not: {missing:?}"
    );
}
