//! The Kubernetes objects a fence configuration is read from, as plain data: ConfigMaps
//! (name → data) and Secrets (name → decoded data). The resolver in `config.rs` works only
//! on this snapshot; it is filled from a directory of YAML files here, or from the
//! cluster by `kubernetes::fencing`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use super::secret::SecretValue;

/// Where an object came from, for messages: a file, or the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectOrigin {
    File(PathBuf),
    Cluster,
}

impl std::fmt::Display for ObjectOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ObjectOrigin::File(path) => write!(f, "{}", path.display()),
            ObjectOrigin::Cluster => f.write_str("the cluster"),
        }
    }
}

/// ConfigMaps and Secrets by name.
#[derive(Debug, Default, Clone)]
pub struct FenceObjects {
    config_maps: BTreeMap<String, (BTreeMap<String, String>, ObjectOrigin)>,
    secrets: BTreeMap<String, (BTreeMap<String, SecretValue>, ObjectOrigin)>,
    /// Secrets that exist but may not be used, with why.
    refused_secrets: BTreeMap<String, String>,
}

/// The label that marks a Secret as a fence credential. Only such Secrets are ever read
/// into a plan: a ConfigMap may name any Secret, and without the mark it could have any
/// Secret of the namespace sent to a device of its choosing.
pub const CREDENTIALS_LABEL: &str = "fencing.nodekeeper.io/credentials";

/// Why the objects could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ObjectsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: document {document}: {reason}")]
    Yaml {
        path: PathBuf,
        document: usize,
        reason: String,
    },
    #[error("{kind} {name} is defined twice: in {first} and in {second}")]
    Duplicate {
        kind: &'static str,
        name: String,
        first: ObjectOrigin,
        second: ObjectOrigin,
    },
    #[error("a {kind} in {origin} has no metadata.name")]
    Unnamed {
        kind: &'static str,
        origin: ObjectOrigin,
    },
}

impl FenceObjects {
    pub fn new() -> FenceObjects {
        FenceObjects::default()
    }

    pub fn config_map(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.config_maps.get(name).map(|(data, _)| data)
    }

    pub fn secret(&self, name: &str) -> Option<&BTreeMap<String, SecretValue>> {
        self.secrets.get(name).map(|(data, _)| data)
    }

    /// Why a Secret that exists cannot be used (unlabelled, unreadable, not text).
    pub fn secret_problem(&self, name: &str) -> Option<&str> {
        self.refused_secrets.get(name).map(String::as_str)
    }

    /// Notes that Secret `name` exists but cannot be used, and why.
    pub fn refuse_secret(&mut self, name: &str, reason: String) {
        self.refused_secrets.insert(name.to_string(), reason);
    }

    pub fn config_map_names(&self) -> impl Iterator<Item = &str> {
        self.config_maps.keys().map(String::as_str)
    }

    pub fn insert_config_map(
        &mut self,
        name: &str,
        data: BTreeMap<String, String>,
        origin: ObjectOrigin,
    ) -> Result<(), ObjectsError> {
        insert_once(&mut self.config_maps, "ConfigMap", name, data, origin)
    }

    pub fn insert_secret(
        &mut self,
        name: &str,
        data: BTreeMap<String, SecretValue>,
        origin: ObjectOrigin,
    ) -> Result<(), ObjectsError> {
        insert_once(&mut self.secrets, "Secret", name, data, origin)
    }

    /// Adds a ConfigMap as the API returns it (data only; binaryData is not properties text).
    pub fn add_config_map(
        &mut self,
        config_map: &ConfigMap,
        origin: ObjectOrigin,
    ) -> Result<(), ObjectsError> {
        let name = config_map.metadata.name.clone().unwrap_or_default();
        if name.is_empty() {
            return Err(ObjectsError::Unnamed {
                kind: "ConfigMap",
                origin,
            });
        }
        self.insert_config_map(&name, config_map.data.clone().unwrap_or_default(), origin)
    }

    /// Adds a Secret: `data` (base64-decoded by the API types) and `stringData`, the latter
    /// winning as the API server merges them. A Secret without the [`CREDENTIALS_LABEL`]
    /// set to `true`, or with a value that is not text, is noted as refused instead.
    pub fn add_secret(
        &mut self,
        secret: &Secret,
        origin: ObjectOrigin,
    ) -> Result<(), ObjectsError> {
        let name = secret.metadata.name.clone().unwrap_or_default();
        if name.is_empty() {
            return Err(ObjectsError::Unnamed {
                kind: "Secret",
                origin,
            });
        }
        let labelled = secret
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(CREDENTIALS_LABEL))
            .is_some_and(|value| value == "true");
        if !labelled {
            self.refuse_secret(
                &name,
                format!("it lacks the label {CREDENTIALS_LABEL}=true, which marks the Secrets fence agents may receive"),
            );
            return Ok(());
        }
        let mut data = BTreeMap::new();
        for (key, bytes) in secret.data.iter().flatten() {
            match String::from_utf8(bytes.0.clone()) {
                Ok(text) => {
                    data.insert(key.clone(), SecretValue::new(text));
                }
                Err(_) => {
                    self.refuse_secret(&name, format!("its key {key} is not UTF-8 text"));
                    return Ok(());
                }
            }
        }
        for (key, text) in secret.string_data.iter().flatten() {
            data.insert(key.clone(), SecretValue::new(text.clone()));
        }
        self.insert_secret(&name, data, origin)
    }

    /// Reads every `*.yaml`, `*.yml` and `*.json` file directly in `dir` (in name order):
    /// each may hold several documents, and a document may be a ConfigMap, a Secret, a
    /// `List` of them, or a plain YAML sequence of them. Other kinds are ignored, so the
    /// directory may hold the rest of an application's manifests too.
    pub fn from_dir(dir: &Path) -> Result<FenceObjects, ObjectsError> {
        let read_error = |source| ObjectsError::Read {
            path: dir.to_path_buf(),
            source,
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(read_error)?
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|path| {
                path.is_file()
                    && path
                        .extension()
                        .and_then(|ext| ext.to_str())
                        .is_some_and(|ext| matches!(ext, "yaml" | "yml" | "json"))
            })
            .collect();
        files.sort();
        let mut objects = FenceObjects::new();
        for path in files {
            let text = std::fs::read_to_string(&path).map_err(|source| ObjectsError::Read {
                path: path.clone(),
                source,
            })?;
            objects.add_yaml(&text, &path)?;
        }
        Ok(objects)
    }

    /// Adds the ConfigMaps and Secrets in one file's text.
    pub fn add_yaml(&mut self, text: &str, path: &Path) -> Result<(), ObjectsError> {
        for (index, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
            let document_number = index + 1;
            let yaml_error = |reason: String| ObjectsError::Yaml {
                path: path.to_path_buf(),
                document: document_number,
                reason,
            };
            let value = <serde_yaml_ng::Value as serde::Deserialize>::deserialize(document)
                .map_err(|e| yaml_error(e.to_string()))?;
            let mut pending = vec![value];
            while let Some(value) = pending.pop() {
                match value {
                    serde_yaml_ng::Value::Null => {}
                    serde_yaml_ng::Value::Sequence(items) => {
                        pending.extend(items.into_iter().rev())
                    }
                    serde_yaml_ng::Value::Mapping(ref mapping) => {
                        let kind = mapping
                            .get("kind")
                            .and_then(serde_yaml_ng::Value::as_str)
                            .unwrap_or_default()
                            .to_string();
                        let origin = ObjectOrigin::File(path.to_path_buf());
                        match kind.as_str() {
                            "ConfigMap" => {
                                let config_map: ConfigMap = serde_yaml_ng::from_value(value)
                                    .map_err(|e| yaml_error(format!("ConfigMap: {e}")))?;
                                self.add_config_map(&config_map, origin)?;
                            }
                            "Secret" => {
                                let secret: Secret = serde_yaml_ng::from_value(value)
                                    .map_err(|e| yaml_error(format!("Secret: {e}")))?;
                                self.add_secret(&secret, origin)?;
                            }
                            list if list.ends_with("List") => {
                                if let Some(serde_yaml_ng::Value::Sequence(items)) =
                                    mapping.get("items")
                                {
                                    pending.extend(items.iter().rev().cloned());
                                }
                            }
                            _ => {}
                        }
                    }
                    other => {
                        return Err(yaml_error(format!(
                            "expected a Kubernetes object, found {}",
                            yaml_kind(&other)
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Adds object `name` of `kind`, unless one of that name is already there.
fn insert_once<T>(
    objects: &mut BTreeMap<String, (T, ObjectOrigin)>,
    kind: &'static str,
    name: &str,
    data: T,
    origin: ObjectOrigin,
) -> Result<(), ObjectsError> {
    if let Some((_, first)) = objects.get(name) {
        return Err(ObjectsError::Duplicate {
            kind,
            name: name.to_string(),
            first: first.clone(),
            second: origin,
        });
    }
    objects.insert(name.to_string(), (data, origin));
    Ok(())
}

fn yaml_kind(value: &serde_yaml_ng::Value) -> &'static str {
    match value {
        serde_yaml_ng::Value::Null => "nothing",
        serde_yaml_ng::Value::Bool(_) => "a boolean",
        serde_yaml_ng::Value::Number(_) => "a number",
        serde_yaml_ng::Value::String(_) => "a string",
        serde_yaml_ng::Value::Sequence(_) => "a list",
        serde_yaml_ng::Value::Mapping(_) => "a mapping",
        serde_yaml_ng::Value::Tagged(_) => "a tagged value",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_lists_sequences_and_secrets_from_several_documents() {
        let text = r#"
apiVersion: v1
kind: List
items:
- kind: ConfigMap
  apiVersion: v1
  metadata: {name: fence-config-a}
  data: {config.properties: "power_management=m"}
---
- kind: ConfigMap
  apiVersion: v1
  metadata: {name: fence-method-m-a}
  data: {method.properties: "template=t"}
---
apiVersion: v1
kind: Secret
metadata: {name: bmc, labels: {fencing.nodekeeper.io/credentials: "true"}}
data: {password: czNjcmV0}
stringData: {user: admin}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: ignored}
"#;
        let mut objects = FenceObjects::new();
        objects
            .add_yaml(text, Path::new("fence.yaml"))
            .expect("valid objects");
        assert!(objects.config_map("fence-config-a").is_some());
        assert_eq!(
            objects
                .config_map("fence-method-m-a")
                .and_then(|d| d.get("method.properties")),
            Some(&"template=t".to_string())
        );
        let secret = objects.secret("bmc").expect("secret read");
        assert_eq!(
            secret.get("password").map(SecretValue::expose),
            Some("s3cret")
        );
        assert_eq!(secret.get("user").map(SecretValue::expose), Some("admin"));
    }

    #[test]
    fn a_name_defined_twice_names_both_places() {
        let text = "kind: ConfigMap\napiVersion: v1\nmetadata: {name: x}\n";
        let mut objects = FenceObjects::new();
        objects.add_yaml(text, Path::new("a.yaml")).expect("first");
        let error = objects
            .add_yaml(text, Path::new("b.yaml"))
            .expect_err("duplicate");
        assert_eq!(
            error.to_string(),
            "ConfigMap x is defined twice: in a.yaml and in b.yaml"
        );
    }

    #[test]
    fn an_object_without_a_name_is_an_error() {
        let error = FenceObjects::new()
            .add_yaml("kind: Secret\nstringData: {a: b}\n", Path::new("s.yaml"))
            .expect_err("unnamed");
        assert_eq!(error.to_string(), "a Secret in s.yaml has no metadata.name");
    }

    #[test]
    fn malformed_documents_name_the_file_and_document() {
        let mut objects = FenceObjects::new();
        let error = objects
            .add_yaml(
                "kind: ConfigMap\nmetadata: {name: a}\n---\nkind: ConfigMap\ndata: [1]\n",
                Path::new("x.yaml"),
            )
            .expect_err("bad data");
        assert!(
            error
                .to_string()
                .starts_with("x.yaml: document 2: ConfigMap:"),
            "{error}"
        );
        let error = objects
            .add_yaml("just text", Path::new("y.yaml"))
            .expect_err("not an object");
        assert_eq!(
            error.to_string(),
            "y.yaml: document 1: expected a Kubernetes object, found a string"
        );
    }
}
