//! `nodekeeper shutdown-plan` as an operator runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(relative)
}

fn shutdown_plan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .arg("shutdown-plan")
        .args(args)
        .output()
        .expect("run nodekeeper")
}

fn stdout_of(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn json_output_is_the_documented_shape() {
    let dir = tempfile::tempdir().unwrap();
    let pods = dir.path().join("pods.json");
    std::fs::write(&pods, r#"[{"namespace":"default","name":"web-1"}]"#).unwrap();
    let config = fixture("shutdown/legacy-30s-10s.yaml");
    let out = shutdown_plan(&[
        "--config",
        config.to_str().unwrap(),
        "--output",
        "json",
        pods.to_str().unwrap(),
    ]);
    assert_eq!(
        stdout_of(&out).trim_end(),
        r#"{"totalSeconds":30,"phases":[{"priority":0,"seconds":20,"pods":[{"namespace":"default","name":"web-1","gracePeriodSeconds":20}]},{"priority":2000000000,"seconds":10,"pods":[]}]}"#
    );
}

#[test]
fn by_priority_config_groups_pods_and_sums_the_budget() {
    let config = fixture("config/shutdown-by-priority.yaml");
    let pods = fixture("shutdown/pods.yaml");
    let out = shutdown_plan(&[
        "--config",
        config.to_str().unwrap(),
        "--output",
        "json",
        pods.to_str().unwrap(),
    ]);
    let plan: serde_json::Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    assert_eq!(plan["totalSeconds"], 370);
    let summary: Vec<(i64, i64, Vec<String>)> = plan["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|phase| {
            (
                phase["priority"].as_i64().unwrap(),
                phase["seconds"].as_i64().unwrap(),
                phase["pods"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| {
                        format!(
                            "{}/{}={}",
                            p["namespace"], p["name"], p["gracePeriodSeconds"]
                        )
                        .replace('"', "")
                    })
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (0, 60, vec!["default/web-1=60".to_string()]),
            (1000, 120, vec!["default/batch=5".to_string()]),
            (10000, 180, vec!["db/postgres-0=180".to_string()]),
            (100000, 10, vec!["kube-system/coredns=10".to_string()]),
        ]
    );
}

#[test]
fn table_output_shows_phases_pods_graces_and_budget() {
    let config = fixture("shutdown/legacy-30s-10s.yaml");
    let pods = fixture("shutdown/pods.yaml");
    let table = stdout_of(&shutdown_plan(&[
        "--config",
        config.to_str().unwrap(),
        pods.to_str().unwrap(),
    ]));
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("PHASE"), "{table}");
    assert!(lines[1].contains("db/postgres-0"), "{table}");
    assert!(
        lines[2].contains("default/batch") && lines[2].ends_with(" 5s"),
        "{table}"
    );
    assert!(
        lines.iter().any(|l| l.contains("kube-system/coredns")),
        "{table}"
    );
    assert!(table.contains("Total budget: 30s"), "{table}");
}

#[test]
fn a_trace_file_uses_its_last_step() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.yaml");
    std::fs::write(
        &trace,
        "steps:\n- at: 0s\n  pods: [{namespace: a, name: gone}]\n- at: 5s\n  pods: [{namespace: a, name: left}]\n",
    )
    .unwrap();
    let config = fixture("shutdown/legacy-30s-10s.yaml");
    let out = shutdown_plan(&[
        "--config",
        config.to_str().unwrap(),
        "--output",
        "json",
        trace.to_str().unwrap(),
    ]);
    let text = stdout_of(&out);
    assert!(
        text.contains(r#""name":"left""#) && !text.contains("gone"),
        "{text}"
    );
}

#[test]
fn without_grace_periods_shutdown_is_reported_disabled() {
    let pods = fixture("shutdown/pods.yaml");
    let table = stdout_of(&shutdown_plan(&[pods.to_str().unwrap()]));
    assert!(table.contains("disabled"), "{table}");
    let json = stdout_of(&shutdown_plan(&[
        "--output",
        "json",
        pods.to_str().unwrap(),
    ]));
    assert_eq!(json.trim_end(), r#"{"totalSeconds":0,"phases":[]}"#);
}

#[test]
fn a_missing_pods_file_is_named_in_the_error() {
    let out = shutdown_plan(&["/nonexistent/pods.yaml"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/pods.yaml"), "{stderr}");
}
