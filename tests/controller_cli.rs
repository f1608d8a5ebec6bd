//! The controller's command-line surface that needs no cluster: `nodekeeper crd` and the
//! CustomResourceDefinition shipped in packaging/kubernetes/.

use std::process::Command;

fn nodekeeper(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn crd_output() -> String {
    let output = nodekeeper(&["crd"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

#[test]
fn the_shipped_manifest_is_the_output_of_nodekeeper_crd() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/kubernetes/controller/crd.yaml"
    );
    let shipped = std::fs::read_to_string(path).expect("the manifest exists");
    let body: String = shipped
        .lines()
        .skip_while(|line| line.starts_with('#'))
        .map(|line| format!("{line}\n"))
        .collect();
    assert_eq!(
        body,
        crd_output(),
        "packaging/kubernetes/controller/crd.yaml is stale: regenerate it with `cargo run -q -- crd` (see its header)"
    );
}

/// The API server refuses a CRD whose schema is not structural: every node must say its
/// type (unless it preserves unknown fields or is an int-or-string).
fn assert_structural(schema: &serde_yaml_ng::Value, path: &str) {
    let map = schema
        .as_mapping()
        .unwrap_or_else(|| panic!("{path} is not a mapping"));
    let get = |key: &str| map.get(serde_yaml_ng::Value::String(key.to_string()));
    let exempt = get("x-kubernetes-preserve-unknown-fields").is_some()
        || get("x-kubernetes-int-or-string").is_some();
    assert!(
        get("type").is_some() || exempt,
        "{path} has no type: {schema:?}"
    );
    for forbidden in ["$ref", "anyOf", "oneOf", "allOf", "definitions", "$defs"] {
        assert!(get(forbidden).is_none(), "{path} uses {forbidden}");
    }
    if let Some(properties) = get("properties").and_then(|p| p.as_mapping()) {
        for (name, child) in properties {
            assert_structural(child, &format!("{path}.{}", name.as_str().unwrap_or("?")));
        }
    }
    if let Some(items) = get("items") {
        assert_structural(items, &format!("{path}[]"));
    }
}

#[test]
fn the_crd_is_cluster_scoped_structural_and_lists_the_columns_an_operator_needs() {
    let crd: serde_yaml_ng::Value = serde_yaml_ng::from_str(&crd_output()).expect("YAML");
    assert_eq!(crd["apiVersion"].as_str(), Some("apiextensions.k8s.io/v1"));
    assert_eq!(
        crd["metadata"]["name"].as_str(),
        Some("nodefences.fencing.nodekeeper.io")
    );
    assert_eq!(crd["spec"]["scope"].as_str(), Some("Cluster"));
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"].as_str(), Some("v1alpha1"));
    assert!(version["subresources"]["status"].is_mapping());
    let schema = &version["schema"]["openAPIV3Schema"];
    assert_structural(schema, "openAPIV3Schema");
    let required = schema["properties"]["spec"]["required"]
        .as_sequence()
        .expect("spec.required");
    assert!(
        required
            .iter()
            .any(|field| field.as_str() == Some("nodeName"))
    );
    let columns: Vec<(&str, &str)> = version["additionalPrinterColumns"]
        .as_sequence()
        .expect("printer columns")
        .iter()
        .map(|column| {
            (
                column["name"].as_str().unwrap_or_default(),
                column["jsonPath"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    for expected in [
        ("Node", ".spec.nodeName"),
        ("Step", ".status.step"),
        ("Phase", ".status.phase"),
        ("Age", ".metadata.creationTimestamp"),
        ("Last Result", ".status.lastResult"),
    ] {
        assert!(
            columns.contains(&expected),
            "{expected:?} missing from {columns:?}"
        );
    }
}

#[test]
fn check_config_validates_the_shipped_controller_configuration() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/controller.yaml");
    let output = nodekeeper(&["check-config", path]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("kind: ControllerConfiguration"), "{stdout}");
    assert!(stdout.contains("unhealthyDuration: 1m0s"), "{stdout}");
    assert!(stdout.contains("maxUnhealthy: 40%"), "{stdout}");
}

#[test]
fn check_config_names_the_file_and_every_bad_controller_field() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("controller.yaml");
    std::fs::write(
        &path,
        "apiVersion: nodekeeper.io/v1alpha1\nkind: ControllerConfiguration\nunhealthyDuration: soon\nstormGuard:\n  maxUnhealthy: 150%\n",
    )
    .expect("written");
    let output = nodekeeper(&["check-config", path.to_str().expect("UTF-8 path")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("controller.yaml: unhealthyDuration:"),
        "{stderr}"
    );
    assert!(
        stderr.contains("controller.yaml: stormGuard.maxUnhealthy: \"150%\""),
        "{stderr}"
    );
}
