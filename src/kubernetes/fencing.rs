//! Reads the fence configuration from the cluster: every ConfigMap of the namespace (the
//! original design's names are conventions, not labels, so they are found by listing),
//! and only the Secrets those ConfigMaps reference (`<option>_secret=<secret>/<key>`),
//! each read by name, so the controller needs no right to list Secrets.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::ListParams;

use crate::fencing::config::{METHOD_KEY, TEMPLATE_KEY};
use crate::fencing::objects::{FenceObjects, ObjectOrigin};
use crate::fencing::properties;

/// Why the fence configuration could not be read from the cluster.
#[derive(Debug, thiserror::Error)]
pub enum FenceLoadError {
    #[error("listing ConfigMaps in namespace {namespace}: {source}")]
    ListConfigMaps {
        namespace: String,
        source: kube::Error,
    },
    #[error("reading Secret {name} in namespace {namespace}: {source}")]
    GetSecret {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error(transparent)]
    Objects(#[from] crate::fencing::ObjectsError),
}

/// The ConfigMaps of `namespace` and the Secrets they reference. A referenced Secret that
/// does not exist is left out; resolving the plan reports it by name.
pub async fn load_fence_objects(
    client: &kube::Client,
    namespace: &str,
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
    let mut wanted = BTreeSet::new();
    for config_map in &list.items {
        objects.add_config_map(config_map, ObjectOrigin::Cluster)?;
        for (key, text) in config_map.data.iter().flatten() {
            if key == METHOD_KEY || key == TEMPLATE_KEY || key.starts_with("fence-method-") {
                wanted.extend(referenced_secrets(text));
            }
        }
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for name in wanted {
        match secrets.get_opt(&name).await {
            Ok(Some(secret)) => objects.add_secret(&secret, ObjectOrigin::Cluster)?,
            Ok(None) => {}
            Err(source) => {
                return Err(FenceLoadError::GetSecret {
                    namespace: namespace.to_string(),
                    name,
                    source,
                });
            }
        }
    }
    Ok(objects)
}

/// The Secret names a properties text references; unreadable text references none (the
/// resolver reports its syntax error).
fn referenced_secrets(text: &str) -> Vec<String> {
    properties::parse(text)
        .map(|properties| {
            properties
                .into_iter()
                .filter(|p| p.key.ends_with("_secret"))
                .filter_map(|p| {
                    p.value
                        .split_once('/')
                        .map(|(secret, _)| secret.to_string())
                })
                .filter(|secret| !secret.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_secrets_a_method_references() {
        let text = "template=t\npassword_secret=bmc-worker-1/password\nsnmp-priv-passwd_secret=pdu/priv\nplug=2";
        assert_eq!(referenced_secrets(text), ["bmc-worker-1", "pdu"]);
        assert!(referenced_secrets("not properties").is_empty());
    }
}
