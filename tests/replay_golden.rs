//! `nodekeeper replay` on the traces under tests/traces/, against reviewed snapshots.
//! Each snapshot was checked by hand against the kubelet's behaviour described in the
//! trace's header comment.

use std::process::Command;

fn replay(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .arg("replay")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "replay {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn trace(name: &str) -> String {
    replay(&[&format!("tests/traces/{name}.yaml")])
}

#[test]
fn memory_pressure_with_soft_grace() {
    insta::assert_snapshot!(trace("memory-soft-grace"));
}

#[test]
fn disk_pressure_bytes_and_inodes() {
    insta::assert_snapshot!(trace("disk-pressure"));
}

#[test]
fn pid_pressure() {
    insta::assert_snapshot!(trace("pid-pressure"));
}

/// The agent records process counts only when it has a `pid.available` threshold, so a
/// trace it recorded without one, replayed with one, has pods that would rank as if they
/// ran nothing: `replay` says so, naming them, and still replays. A trace with the counts
/// gets no warning.
#[test]
fn a_pid_threshold_over_a_trace_without_process_counts_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("uncounted.yaml");
    std::fs::write(
        &trace,
        "config:\n  evictionHard:\n    pid.available: 2000\n    memory.available: 100Mi\n\
         steps:\n- at: 0s\n  signals:\n    pid.available: {available: 1500, capacity: 32768}\n  \
         pods:\n  - {namespace: ci, name: web, usage: {memory: 100Mi}}\n  \
         - {namespace: ci, name: batch, usage: {memory: 200Mi, pids: 12}}\n  \
         - {namespace: ci, name: starting}\n",
    )
    .unwrap();
    let run = |path: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
            .arg("replay")
            .arg(path)
            .output()
            .unwrap()
    };
    let output = run(&trace);
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("warning: the trace records no process count for ci/web (the agent records counts only when it has a pid.available threshold, and only those it could read)"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&output.stdout).is_empty());

    let counted =
        run(&std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/traces/pid-pressure.yaml"));
    assert!(counted.status.success(), "{counted:?}");
    assert_eq!(String::from_utf8_lossy(&counted.stderr), "");
}

#[test]
fn transition_damping() {
    insta::assert_snapshot!(trace("transition-damping"));
}

#[test]
fn min_reclaim() {
    insta::assert_snapshot!(trace("min-reclaim"));
}

#[test]
fn critical_pods() {
    insta::assert_snapshot!(trace("critical-pods"));
}

#[test]
fn a_dedicated_imagefs_ranks_each_disk_signal_by_its_own_storage() {
    insta::assert_snapshot!(trace("dedicated-imagefs"));
}

#[test]
fn local_storage_limits() {
    insta::assert_snapshot!(trace("local-storage"));
}

#[test]
fn kubelet_defaults_without_any_config() {
    insta::assert_snapshot!(trace("no-inline-config"));
}

#[test]
fn config_file_when_the_trace_has_no_inline_config() {
    insta::assert_snapshot!(replay(&[
        "--config",
        "tests/traces/configs/memory-1gi.yaml",
        "tests/traces/no-inline-config.yaml",
    ]));
}

#[test]
fn inline_config_wins_over_the_config_file() {
    // The inline evictionHard replaces the whole default set, and --config is unused.
    let with_file = replay(&[
        "--config",
        "tests/traces/configs/memory-1gi.yaml",
        "tests/traces/min-reclaim.yaml",
    ]);
    assert_eq!(with_file, trace("min-reclaim"));
}

#[test]
fn json_traces_replay_like_yaml() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    std::fs::write(
        &path,
        r#"{"config":{"evictionHard":{"memory.available":"1Gi"}},"steps":[{"at":"0s",
        "signals":{"memory.available":{"available":"900Mi","capacity":"10Gi"}},
        "pods":[{"namespace":"default","name":"web-1","usage":{"memory":"150Mi"}}]}]}"#,
    )
    .unwrap();
    assert_eq!(
        replay(&[path.to_str().unwrap()]),
        "{\"at\":\"0s\",\"conditions\":[\"MemoryPressure\"],\"thresholdsMet\":[\"memory.available<1Gi\"],\
         \"evicted\":[{\"namespace\":\"default\",\"name\":\"web-1\",\"signal\":\"memory.available\",\
         \"gracePeriodSeconds\":1}]}\n"
    );
}
