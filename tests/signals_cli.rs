//! `nodekeeper signals` end to end, pointed at the fake cgroup v2 tree by a config file.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn config_for(dir: &Path, cgroup_root: &Path, proc_root: &Path) -> PathBuf {
    let config = dir.join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\ncgroupRoot: {}\nprocRoot: {}\nnodefsPath: {}\npodsCgroup: kubepods.slice\nevictionHard:\n  memory.available: 100Mi\n  nodefs.available: 10%\nevictionSoft:\n  memory.available: 4Gi\nevictionSoftGracePeriod:\n  memory.available: 1m30s\n",
            cgroup_root.display(),
            proc_root.display(),
            dir.display()
        ),
    )
    .unwrap();
    config
}

fn run(args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code().unwrap(),
        String::from_utf8(output.stdout).unwrap(),
    )
}

#[test]
fn json_report_carries_fixture_numbers_and_thresholds() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_for(
        dir.path(),
        &fixtures().join("cgroup-v2"),
        &fixtures().join("proc"),
    );
    let pressure_before = std::fs::read(fixtures().join("proc/pressure/memory")).unwrap();
    let (code, stdout) = run(&[
        "signals",
        "--config",
        config.to_str().unwrap(),
        "--output",
        "json",
    ]);
    assert_eq!(code, 0, "{stdout}");
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["cgroupLayout"], "unified");
    let signals = json["signals"].as_array().unwrap();
    let memory = signals
        .iter()
        .find(|s| s["signal"] == "memory.available")
        .unwrap();
    assert_eq!(memory["available"], 10_339_483_648i64);
    assert_eq!(memory["capacity"], 16_777_216_000i64);
    let soft = memory["thresholds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["hard"] == false)
        .unwrap();
    assert_eq!(soft["gracePeriod"], "1m30s");
    assert_eq!(soft["resolved"], 4i64 << 30);
    let allocatable = signals
        .iter()
        .find(|s| s["signal"] == "allocatableMemory.available")
        .unwrap();
    assert_eq!(allocatable["available"], 13_555_990_528i64);
    assert_eq!(json["notifications"]["memoryEventsV2"]["supported"], true);
    // Each pressure reading says whose stalls it measures in one plain word, and a
    // cgroup's reading names the cgroup.
    let pressure = json["pressure"].as_array().unwrap();
    let scopes: Vec<&str> = pressure
        .iter()
        .map(|r| r["scope"].as_str().unwrap())
        .collect();
    assert!(
        scopes.contains(&"node") && scopes.contains(&"cgroup"),
        "{pressure:?}"
    );
    for reading in pressure {
        assert_eq!(
            reading.get("cgroup").is_some(),
            reading["scope"] == "cgroup",
            "{reading}"
        );
    }
    // The probe must never write a trigger into a fake pressure file.
    assert_eq!(
        std::fs::read(fixtures().join("proc/pressure/memory")).unwrap(),
        pressure_before
    );
}

#[test]
fn unreadable_signal_exits_1_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    std::fs::create_dir_all(proc_root.join("sys/kernel")).unwrap();
    for file in ["meminfo", "sys/kernel/pid_max", "sys/kernel/threads-max"] {
        std::fs::copy(fixtures().join("proc").join(file), proc_root.join(file)).unwrap();
    }
    std::fs::write(proc_root.join("loadavg"), "garbage\n").unwrap();
    let config = config_for(dir.path(), &fixtures().join("cgroup-v2"), &proc_root);
    let (code, stdout) = run(&["signals", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.starts_with("cgroup layout: unified"), "{stdout}");
    let pid_line = stdout
        .lines()
        .find(|line| line.starts_with("pid.available"))
        .unwrap();
    assert!(pid_line.contains("loadavg"), "{pid_line}");
    let memory_line = stdout
        .lines()
        .find(|line| line.starts_with("memory.available"))
        .unwrap();
    assert!(
        memory_line.contains("<100Mi (hard), <4Gi (soft 1m30s)"),
        "{memory_line}"
    );
    // No /proc/pressure in this proc tree: only the pods cgroup's memory.pressure shows.
    assert!(stdout.contains("cgroup kubepods.slice"), "{stdout}");
    assert!(
        !stdout.lines().any(|line| line.starts_with("cpu ")),
        "{stdout}"
    );
}

#[test]
fn the_kubelets_eviction_flags_replace_the_files_thresholds() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_for(
        dir.path(),
        &fixtures().join("cgroup-v2"),
        &fixtures().join("proc"),
    );
    let (code, stdout) = run(&[
        "signals",
        "-c",
        config.to_str().unwrap(),
        "--eviction-hard=memory.available<2Gi,nodefs.available<20%",
        "--eviction-soft=memory.available<3Gi",
        "--eviction-soft-grace-period=memory.available=30s",
    ]);
    assert_eq!(code, 0, "{stdout}");
    let line = |signal: &str| {
        stdout
            .lines()
            .find(|line| line.starts_with(signal))
            .unwrap_or_else(|| panic!("no {signal} line in {stdout}"))
            .to_string()
    };
    // The flags replace the file's maps whole, as the kubelet's flags replace its file.
    assert!(
        line("memory.available").contains("<2Gi (hard), <3Gi (soft 30s)"),
        "{stdout}"
    );
    assert!(!line("memory.available").contains("100Mi"), "{stdout}");
    assert!(line("nodefs.available").contains("<20%"), "{stdout}");
}
