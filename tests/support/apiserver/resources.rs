//! The resource types the fake server knows: the built-in kinds nodekeeper touches, plus custom
//! resources registered by tests. Built-in bodies are decoded into their k8s-openapi types on every
//! write, so a shape the real server would reject fails here too and stored objects keep the real
//! field layout.

use k8s_openapi::api::{
    admissionregistration, apps, authentication, batch, coordination, core, discovery, events,
    policy, rbac,
};
use k8s_openapi::apiextensions_apiserver;

use super::tables::PrinterColumn;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Decodes a body into the kind's typed struct and back, dropping unknown fields.
type Normalizer = fn(Value) -> Result<Value, String>;

#[derive(Clone, Debug)]
pub struct ResourceType {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub namespaced: bool,
    /// Whether a `/status` subresource exists; then the main resource ignores `.status`.
    pub has_status: bool,
    normalizer: Option<Normalizer>,
    /// Field selector labels beyond `metadata.name` and `metadata.namespace`.
    pub field_labels: &'static [&'static str],
    /// Short names for discovery (`kubectl get nf`), from a CRD.
    pub short_names: Vec<String>,
    /// The `additionalPrinterColumns` of a CRD, for the Table form.
    pub columns: Vec<PrinterColumn>,
    /// The verbs discovery lists and the router accepts.
    pub verbs: &'static [&'static str],
    /// Subresources beyond `status`, e.g. `serviceaccounts/token`.
    pub subresources: &'static [Subresource],
    /// False for kinds the server answers without storing them (TokenReview).
    pub stored: bool,
}

/// Every verb of a stored kind.
pub const ALL_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// A subresource with its own kind and verbs, as discovery lists it (`serviceaccounts/token`
/// takes an `authentication.k8s.io/v1` TokenRequest).
#[derive(Clone, Debug)]
pub struct Subresource {
    pub name: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub verbs: &'static [&'static str],
}

const SERVICE_ACCOUNT_SUBRESOURCES: &[Subresource] = &[Subresource {
    name: "token",
    group: "authentication.k8s.io",
    version: "v1",
    kind: "TokenRequest",
    verbs: &["create"],
}];

/// A custom resource definition, reduced to what routing and storage need.
#[derive(Clone, Debug)]
pub struct CustomResource {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub namespaced: bool,
    pub has_status: bool,
}

impl ResourceType {
    #[allow(clippy::too_many_arguments)]
    pub fn custom(
        group: &str,
        version: &str,
        kind: &str,
        plural: &str,
        namespaced: bool,
        has_status: bool,
        short_names: Vec<String>,
        columns: Vec<PrinterColumn>,
    ) -> ResourceType {
        ResourceType {
            group: group.to_string(),
            version: version.to_string(),
            kind: kind.to_string(),
            plural: plural.to_string(),
            namespaced,
            has_status,
            normalizer: None,
            field_labels: &[],
            short_names,
            columns,
            verbs: ALL_VERBS,
            subresources: &[],
            stored: true,
        }
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn singular(&self) -> String {
        self.kind.to_lowercase()
    }

    /// A custom resource (no built-in type to decode it into): the server prints it.
    pub fn normalizer_is_none(&self) -> bool {
        self.normalizer.is_none()
    }

    pub fn normalize(&self, object: Value) -> Result<Value, String> {
        match self.normalizer {
            Some(normalize) => normalize(object),
            None => Ok(object),
        }
    }

    pub fn subresource(&self, name: &str) -> Option<&Subresource> {
        self.subresources
            .iter()
            .find(|subresource| subresource.name == name)
    }

    pub fn supports_field_label(&self, label: &str) -> bool {
        label == "metadata.name"
            || label == "metadata.namespace"
            || self.field_labels.contains(&label)
    }
}

fn through<T: DeserializeOwned + Serialize>(object: Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(object).map_err(|error| error.to_string())?;
    serde_json::to_value(typed).map_err(|error| error.to_string())
}

const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];
const CORE_EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];
const EVENTS_V1_FIELDS: &[&str] = &[
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "reason",
    "reportingController",
    "type",
];

#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    namespaced: bool,
    has_status: bool,
    normalizer: Normalizer,
    field_labels: &'static [&'static str],
) -> ResourceType {
    ResourceType {
        normalizer: Some(normalizer),
        field_labels,
        ..ResourceType::custom(
            group,
            version,
            kind,
            plural,
            namespaced,
            has_status,
            Vec::new(),
            Vec::new(),
        )
    }
}

#[derive(Clone, Debug)]
pub struct Registry {
    types: Vec<ResourceType>,
}

impl Default for Registry {
    fn default() -> Self {
        let types = vec![
            builtin(
                "",
                "v1",
                "Pod",
                "pods",
                true,
                true,
                through::<core::v1::Pod>,
                POD_FIELDS,
            ),
            builtin(
                "",
                "v1",
                "Node",
                "nodes",
                false,
                true,
                through::<core::v1::Node>,
                &["spec.unschedulable"],
            ),
            builtin(
                "",
                "v1",
                "Event",
                "events",
                true,
                false,
                through::<core::v1::Event>,
                CORE_EVENT_FIELDS,
            ),
            builtin(
                "",
                "v1",
                "ConfigMap",
                "configmaps",
                true,
                false,
                through::<core::v1::ConfigMap>,
                &[],
            ),
            builtin(
                "",
                "v1",
                "Secret",
                "secrets",
                true,
                false,
                through::<core::v1::Secret>,
                &["type"],
            ),
            builtin(
                "",
                "v1",
                "Namespace",
                "namespaces",
                false,
                true,
                through::<core::v1::Namespace>,
                &["status.phase"],
            ),
            builtin(
                "",
                "v1",
                "PersistentVolumeClaim",
                "persistentvolumeclaims",
                true,
                true,
                through::<core::v1::PersistentVolumeClaim>,
                &[],
            ),
            ResourceType {
                subresources: SERVICE_ACCOUNT_SUBRESOURCES,
                ..builtin(
                    "",
                    "v1",
                    "ServiceAccount",
                    "serviceaccounts",
                    true,
                    false,
                    through::<core::v1::ServiceAccount>,
                    &[],
                )
            },
            // Answered, never stored: see tokens.rs.
            ResourceType {
                verbs: &["create"],
                stored: false,
                ..builtin(
                    "authentication.k8s.io",
                    "v1",
                    "TokenReview",
                    "tokenreviews",
                    false,
                    false,
                    through::<authentication::v1::TokenReview>,
                    &[],
                )
            },
            builtin(
                "apiextensions.k8s.io",
                "v1",
                "CustomResourceDefinition",
                "customresourcedefinitions",
                false,
                true,
                through::<
                    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
                >,
                &[],
            ),
            builtin(
                "events.k8s.io",
                "v1",
                "Event",
                "events",
                true,
                false,
                through::<events::v1::Event>,
                EVENTS_V1_FIELDS,
            ),
            builtin(
                "coordination.k8s.io",
                "v1",
                "Lease",
                "leases",
                true,
                false,
                through::<coordination::v1::Lease>,
                &[],
            ),
            builtin(
                "batch",
                "v1",
                "Job",
                "jobs",
                true,
                true,
                through::<batch::v1::Job>,
                &["status.successful"],
            ),
            // What nodekeeper's manifests install (packaging/kubernetes), so kubectl can
            // apply them here.
            builtin(
                "",
                "v1",
                "Service",
                "services",
                true,
                true,
                through::<core::v1::Service>,
                &[],
            ),
            builtin(
                "apps",
                "v1",
                "DaemonSet",
                "daemonsets",
                true,
                true,
                through::<apps::v1::DaemonSet>,
                &[],
            ),
            builtin(
                "apps",
                "v1",
                "Deployment",
                "deployments",
                true,
                true,
                through::<apps::v1::Deployment>,
                &[],
            ),
            // The report Service's EndpointSlice, which the leading controller writes.
            builtin(
                "discovery.k8s.io",
                "v1",
                "EndpointSlice",
                "endpointslices",
                true,
                false,
                through::<discovery::v1::EndpointSlice>,
                &[],
            ),
            builtin(
                "policy",
                "v1",
                "PodDisruptionBudget",
                "poddisruptionbudgets",
                true,
                true,
                through::<policy::v1::PodDisruptionBudget>,
                &[],
            ),
            // The agent's admission policy (packaging/kubernetes/agent), which the server
            // applies to writes (access.rs).
            builtin(
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingAdmissionPolicy",
                "validatingadmissionpolicies",
                false,
                true,
                through::<admissionregistration::v1::ValidatingAdmissionPolicy>,
                &[],
            ),
            builtin(
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingAdmissionPolicyBinding",
                "validatingadmissionpolicybindings",
                false,
                false,
                through::<admissionregistration::v1::ValidatingAdmissionPolicyBinding>,
                &[],
            ),
            builtin(
                "rbac.authorization.k8s.io",
                "v1",
                "ClusterRole",
                "clusterroles",
                false,
                false,
                through::<rbac::v1::ClusterRole>,
                &[],
            ),
            builtin(
                "rbac.authorization.k8s.io",
                "v1",
                "ClusterRoleBinding",
                "clusterrolebindings",
                false,
                false,
                through::<rbac::v1::ClusterRoleBinding>,
                &[],
            ),
            builtin(
                "rbac.authorization.k8s.io",
                "v1",
                "Role",
                "roles",
                true,
                false,
                through::<rbac::v1::Role>,
                &[],
            ),
            builtin(
                "rbac.authorization.k8s.io",
                "v1",
                "RoleBinding",
                "rolebindings",
                true,
                false,
                through::<rbac::v1::RoleBinding>,
                &[],
            ),
        ];
        Self { types }
    }
}

impl Registry {
    pub fn register(&mut self, custom: CustomResource) {
        self.register_types(vec![ResourceType::custom(
            &custom.group,
            &custom.version,
            &custom.kind,
            &custom.plural,
            custom.namespaced,
            custom.has_status,
            Vec::new(),
            Vec::new(),
        )]);
    }

    /// Registers a CRD's versions, replacing what was known of its resource.
    pub fn register_types(&mut self, types: Vec<ResourceType>) {
        for custom in &types {
            self.types
                .retain(|known| !(known.group == custom.group && known.plural == custom.plural));
        }
        self.types.extend(types);
    }

    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceType> {
        self.types.iter().find(|known| {
            known.group == group && known.version == version && known.plural == plural
        })
    }

    pub fn all(&self) -> &[ResourceType] {
        &self.types
    }
}
