//! Reads a node's fence configuration from the cluster: every ConfigMap of the namespace
//! (the original design's names are conventions, not labels, so they are found by
//! listing), and only the Secrets that node's methods and templates reference, each read by
//! name, so the controller needs no right to list Secrets. Only Secrets labelled
//! `fencing.nodekeeper.io/credentials=true` are used (see `fencing::objects`).

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::ListParams;

use crate::fencing::config::referenced_secrets;
use crate::fencing::objects::{FenceObjects, ObjectOrigin};

/// Why the fence configuration could not be read from the cluster.
#[derive(Debug, thiserror::Error)]
pub enum FenceLoadError {
    #[error("listing ConfigMaps in namespace {namespace}: {source}")]
    ListConfigMaps {
        namespace: String,
        source: kube::Error,
    },
    #[error(transparent)]
    Objects(#[from] crate::fencing::ObjectsError),
}

/// The ConfigMaps of `namespace` and the Secrets `node`'s configuration references. A
/// referenced Secret that is missing, unreadable (e.g. forbidden) or unlabelled does not
/// stop the load: resolving the plan reports it where it is referenced, and other nodes'
/// fencing is unaffected.
pub async fn load_fence_objects(
    client: &kube::Client,
    namespace: &str,
    node: &str,
) -> Result<FenceObjects, FenceLoadError> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let list = config_maps
        .list(&ListParams::default())
        .await
        .map_err(|source| FenceLoadError::ListConfigMaps {
            namespace: namespace.to_string(),
            source,
        })?;
    let mut objects = FenceObjects::new();
    for config_map in &list.items {
        objects.add_config_map(config_map, ObjectOrigin::Cluster)?;
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for name in referenced_secrets(&objects, node) {
        match secrets.get_opt(&name).await {
            Ok(Some(secret)) => objects.add_secret(&secret, ObjectOrigin::Cluster)?,
            Ok(None) => {}
            Err(error) => objects.refuse_secret(
                &name,
                format!("reading it from namespace {namespace} failed: {error}"),
            ),
        }
    }
    Ok(objects)
}
