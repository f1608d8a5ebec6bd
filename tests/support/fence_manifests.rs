//! What the fence-command tests share: ConfigMap and Secret manifests in the original
//! node-fencing design's format, written into a directory for `--from`, and the
//! `nodekeeper` binary run as an operator runs it (no ambient cluster).

use std::process::{Command, Output};

/// A ConfigMap `name` whose data key `key` holds `properties`, as one YAML document.
pub fn config_map(name: &str, key: &str, properties: &str) -> String {
    let indented: String = properties
        .lines()
        .map(|line| format!("    {line}\n"))
        .collect();
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  {key}: |\n{indented}---\n"
    )
}

/// A Secret `name` holding `key: value`, labelled as a fence credential.
pub fn secret(name: &str, key: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  labels:\n    fencing.nodekeeper.io/credentials: \"true\"\nstringData:\n  {key}: {value:?}\n---\n"
    )
}

/// Writes `files` (name → YAML) into a new directory.
pub fn config_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, yaml) in files {
        std::fs::write(dir.path().join(name), yaml).expect("write config");
    }
    dir
}

/// Runs `nodekeeper args` with `RUST_LOG=level` and without `KUBECONFIG` or an in-cluster
/// service account, so only `--from` or `--kubeconfig` name the configuration's source.
pub fn nodekeeper(args: &[&str], level: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(args)
        .env("RUST_LOG", level)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("run nodekeeper")
}

/// Output bytes as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
