//! `nodekeeper rank` and the error exits of `rank` and `replay`.

use std::path::Path;
use std::process::{Command, Output};

fn nodekeeper(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> &str {
    std::str::from_utf8(&output.stdout).unwrap()
}

fn stderr(output: &Output) -> &str {
    std::str::from_utf8(&output.stderr).unwrap()
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn rank_prints_the_last_steps_memory_order_one_pod_per_line() {
    let out = nodekeeper(&[
        "rank",
        "--signal",
        "memory.available",
        "tests/traces/memory-soft-grace.yaml",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Last step: web-2 and report exceed their requests (report has higher priority);
    // cache is under its request.
    assert_eq!(stdout(&out), "shop/web-2\nbatch/report\nshop/cache\n");
}

#[test]
fn rank_json_is_an_array_of_keys() {
    let out = nodekeeper(&[
        "rank",
        "--signal",
        "pid.available",
        "--output",
        "json",
        "tests/traces/pid-pressure.yaml",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "[\"ci/fork-bomb\"]\n");
}

/// Ranked for pid.available, pods with stats but no process count (a trace the agent
/// recorded without a pid.available threshold has none) are named on stderr; they rank
/// as running no process. The pid-pressure trace, which has the counts, gets no warning.
#[test]
fn rank_for_pids_names_the_pods_without_a_process_count() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write(
        dir.path(),
        "uncounted.yaml",
        "steps:\n- at: 0s\n  pods:\n  - {namespace: ci, name: web, usage: {memory: 100Mi}}\n  \
         - {namespace: ci, name: batch, usage: {memory: 200Mi, pids: 12}}\n",
    );
    let out = nodekeeper(&["rank", "--signal", "pid.available", &trace]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "ci/batch\nci/web\n");
    assert!(
        stderr(&out).starts_with("warning: the trace records no process count for ci/web ("),
        "{}",
        stderr(&out)
    );
    let memory = nodekeeper(&["rank", "--signal", "memory.available", &trace]);
    assert_eq!(
        stderr(&memory),
        "",
        "no warning when the counts are not ranked"
    );
    let counted = nodekeeper(&[
        "rank",
        "--signal",
        "pid.available",
        "tests/traces/pid-pressure.yaml",
    ]);
    assert_eq!(stderr(&counted), "");
}

#[test]
fn rank_leaves_out_critical_pods_and_names_them_on_stderr() {
    let out = nodekeeper(&[
        "rank",
        "--signal",
        "memory.available",
        "tests/traces/critical-pods.yaml",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    assert_eq!(
        stderr(&out),
        "note: critical pods are never evicted: kube-system/etcd-node1, kube-system/coredns, kube-system/kube-proxy\n"
    );
}

#[test]
fn rank_orders_inodes_by_priority_first() {
    let out = nodekeeper(&[
        "rank",
        "--signal",
        "nodefs.inodesFree",
        "tests/traces/disk-pressure.yaml",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "default/under-request\ndefault/builder\n");
}

#[test]
fn rank_counts_only_the_storage_on_the_signals_own_filesystem() {
    // The trace's inline config sets imagefsPath: writable layers live on imagefs.
    let trace = "tests/traces/dedicated-imagefs.yaml";
    for (signal, order) in [
        ("nodefs.available", "default/cache\ndefault/builder\n"),
        ("nodefs.inodesFree", "default/cache\ndefault/builder\n"),
        ("imagefs.available", "default/builder\ndefault/cache\n"),
        ("containerfs.inodesFree", "default/builder\ndefault/cache\n"),
    ] {
        let out = nodekeeper(&["rank", "--signal", signal, trace]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(stdout(&out), order, "{signal}");
    }
}

#[test]
fn rank_takes_the_filesystem_layout_from_config_when_the_trace_has_none() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write(
        dir.path(),
        "t.yaml",
        "steps:\n- at: 0s\n  pods:\n  \
         - {namespace: a, name: layer, requests: {ephemeral-storage: 2Gi}, storage: {writableLayers: {bytes: 9Gi}}}\n  \
         - {namespace: a, name: volume, requests: {ephemeral-storage: 1Gi}, storage: {localVolumes: {bytes: 1Gi}}}\n",
    );
    let split = write(
        dir.path(),
        "split.yaml",
        "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\n\
         imagefsPath: /var/lib/images\ncontainerfsPath: /var/lib/kubelet\n",
    );
    let rank = |extra: &[&str]| {
        let mut args = vec!["rank", "--signal", "imagefs.available"];
        args.extend_from_slice(extra);
        args.push(&trace);
        let out = nodekeeper(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out).to_string()
    };
    // One filesystem (the default): the 9Gi layer is 7Gi over its request.
    assert_eq!(rank(&[]), "a/layer\na/volume\n");
    // Split: imagefs holds only images, so the smaller storage request goes first.
    assert_eq!(rank(&["--config", &split]), "a/volume\na/layer\n");
}

#[test]
fn an_unknown_signal_is_rejected_with_the_valid_names() {
    let out = nodekeeper(&[
        "rank",
        "--signal",
        "swap.available",
        "tests/traces/pid-pressure.yaml",
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("unsupported eviction signal swap.available"),
        "{err}"
    );
    assert!(
        err.contains("memory.available, allocatableMemory.available"),
        "{err}"
    );
}

#[test]
fn a_malformed_trace_names_the_step_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let bad_quantity = write(
        dir.path(),
        "bad.yaml",
        "steps:\n- at: 0s\n- at: 5s\n  signals:\n    memory.available: {available: lots, capacity: 1Gi}\n",
    );
    for command in ["replay", "rank"] {
        let mut args = vec![command];
        if command == "rank" {
            args.extend(["--signal", "memory.available"]);
        }
        args.push(&bad_quantity);
        let out = nodekeeper(&args);
        assert!(!out.status.success(), "{command}");
        let err = stderr(&out);
        assert!(
            err.contains("bad.yaml")
                && err.contains("steps[1]: signals.memory.available.available"),
            "{command}: {err}"
        );
    }
}

#[test]
fn unknown_fields_and_signals_in_a_trace_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let unknown_field = write(
        dir.path(),
        "field.yaml",
        "steps:\n- at: 0s\n  pods:\n  - {namespace: a, name: b, prio: 3}\n",
    );
    let out = nodekeeper(&["replay", &unknown_field]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("unknown field `prio`"),
        "{}",
        stderr(&out)
    );

    let unknown_signal = write(
        dir.path(),
        "signal.yaml",
        "steps:\n- at: 0s\n  signals:\n    swap.available: {available: 1, capacity: 2}\n",
    );
    let out = nodekeeper(&["replay", &unknown_signal]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("steps[0]: signals: unsupported eviction signal swap.available"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn steps_out_of_time_order_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "order.yaml", "steps:\n- at: 1m\n- at: 30s\n");
    let out = nodekeeper(&["replay", &path]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("steps[1].at: 30s is earlier than the previous step's 1m0s"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn an_invalid_inline_config_names_the_trace_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "config.yaml",
        "config:\n  evictionHard:\n    memory.available: -1Gi\nsteps:\n- at: 0s\n",
    );
    let out = nodekeeper(&["replay", &path]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("config.yaml") && err.contains("memory.available"),
        "{err}"
    );
}

#[test]
fn rank_of_a_trace_without_steps_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "empty.yaml", "steps: []\n");
    let out = nodekeeper(&["rank", "--signal", "memory.available", &path]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("it has no steps"), "{}", stderr(&out));
}

#[test]
fn a_missing_trace_file_is_named() {
    let out = nodekeeper(&["replay", "tests/traces/does-not-exist.yaml"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("cannot read trace tests/traces/does-not-exist.yaml"),
        "{}",
        stderr(&out)
    );
}

/// `localStorageCapacityIsolation: false` turns off the local-storage limit evictions
/// (the kubelet's synchronize skips `localStorageEviction`), here from a trace's inline
/// configuration as the agent reads it from a KubeletConfiguration.
#[test]
fn local_storage_capacity_isolation_false_turns_off_limit_evictions() {
    let dir = tempfile::tempdir().unwrap();
    let steps = "steps:\n- at: 0s\n  pods:\n  \
                 - {namespace: a, name: hog, limits: {ephemeral-storage: 1Gi}, usage: {ephemeral-storage: 2Gi}}\n";
    let on = write(dir.path(), "on.yaml", steps);
    let off = write(
        dir.path(),
        "off.yaml",
        &format!("config:\n  localStorageCapacityIsolation: false\n{steps}"),
    );
    let replay = |path: &str| {
        let out = nodekeeper(&["replay", path]);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out).to_string()
    };
    assert!(
        replay(&on).contains(r#""name":"hog","signal":"ephemeralpodfs.limit""#),
        "{}",
        replay(&on)
    );
    assert!(replay(&off).contains(r#""evicted":[]"#), "{}", replay(&off));
}
