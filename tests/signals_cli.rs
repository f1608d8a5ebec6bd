//! `nodekeeper signals` end to end, pointed at the fake cgroup v2 tree by a config file.

mod support {
    #[allow(dead_code)]
    pub mod real;
}

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
    assert_eq!(memory["available"], 10_341_318_656i64);
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

/// `dir/proc` holding `files` copied from the fixture's proc tree; the test writes the rest.
fn fixture_proc(dir: &std::path::Path, files: &[&str]) -> std::path::PathBuf {
    let proc_root = dir.join("proc");
    std::fs::create_dir_all(proc_root.join("sys/kernel")).unwrap();
    for file in files {
        std::fs::copy(fixtures().join("proc").join(file), proc_root.join(file)).unwrap();
    }
    proc_root
}

#[test]
fn unreadable_signal_exits_1_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let proc_root = fixture_proc(
        dir.path(),
        &["meminfo", "sys/kernel/pid_max", "sys/kernel/threads-max"],
    );
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

/// `signals` shows the filesystem layout the devices make, and compares containerfs with
/// the thresholds that layout gives it, as the agent does: the kubelet's
/// `UpdateContainerFsThresholds` copies imagefs's thresholds where the image filesystem is
/// dedicated, else nodefs's. The same file with imagefsPath on the nodefs disk and on a
/// tmpfs.
#[test]
fn the_filesystem_layout_and_the_containerfs_thresholds_follow_the_devices() {
    let dir = tempfile::tempdir().unwrap();
    let tmpfs = require!(
        "a separate filesystem (tmpfs) at /dev/shm",
        support::real::tmpfs_dir_apart_from(dir.path())
    );
    let on_disk = dir.path().join("images");
    std::fs::create_dir(&on_disk).unwrap();
    for (imagefs, layout, containerfs_threshold) in [
        (on_disk.as_path(), "singleDisk", "10%"),
        (tmpfs.path(), "imageFs", "15%"),
    ] {
        let config = dir.path().join("agent.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\ncgroupRoot: {}\nprocRoot: {}\nnodefsPath: {}\nimagefsPath: {}\nevictionHard:\n  nodefs.available: 10%\n  imagefs.available: 15%\n",
                fixtures().join("cgroup-v2").display(),
                fixtures().join("proc").display(),
                dir.path().display(),
                imagefs.display()
            ),
        )
        .unwrap();
        let config = config.to_str().unwrap();
        let (code, stdout) = run(&["signals", "--config", config, "--output", "json"]);
        assert_eq!(code, 0, "{stdout}");
        let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(json["filesystemLayout"], layout, "{stdout}");
        let filesystems = json["filesystems"].as_array().unwrap();
        assert_eq!(filesystems[1]["filesystem"], "imagefs");
        assert_eq!(filesystems[1]["path"], imagefs.display().to_string());
        let same_device = filesystems[0]["device"] == filesystems[1]["device"];
        assert_eq!(same_device, layout == "singleDisk", "{filesystems:?}");
        let containerfs = json["signals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["signal"] == "containerfs.available")
            .unwrap();
        assert_eq!(
            containerfs["thresholds"][0]["value"],
            containerfs_threshold,
            "imagefsPath {}",
            imagefs.display()
        );
        let (_, table) = run(&["signals", "--config", config]);
        let line = table
            .lines()
            .find(|line| line.starts_with("filesystems: "))
            .unwrap_or_default();
        let expected = if layout == "singleDisk" {
            "filesystems: one filesystem"
        } else {
            "filesystems: a dedicated image filesystem"
        };
        assert!(line.starts_with(expected), "{table}");
        assert!(
            line.contains(&format!("imagefs {} on ", imagefs.display())),
            "{line}"
        );
    }
}

/// A node with huge pages reserved: `signals` shows memory.available without the pool,
/// says how much it left out and why, and gives the figure a kubelet before 1.37 would
/// when the kubelet's configuration turns `HugepageAwareEviction` off.
#[test]
fn the_huge_page_pool_is_shown_and_left_out_unless_the_gate_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let proc_root = fixture_proc(
        dir.path(),
        &["loadavg", "sys/kernel/pid_max", "sys/kernel/threads-max"],
    );
    // The fixture meminfo with 512 pages of 2 MiB reserved (1 GiB).
    let meminfo = std::fs::read_to_string(fixtures().join("proc/meminfo"))
        .unwrap()
        .replace("HugePages_Total:       0", "HugePages_Total:     512")
        .replace(
            "Hugepagesize:       2048 kB",
            "Hugepagesize:       2048 kB\nHugetlb:     1048576 kB",
        );
    std::fs::write(proc_root.join("meminfo"), meminfo).unwrap();
    let config = config_for(dir.path(), &fixtures().join("cgroup-v2"), &proc_root);
    let memory_available = |stdout: &str| {
        let json: serde_json::Value = serde_json::from_str(stdout).unwrap();
        let memory = json["signals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["signal"] == "memory.available")
            .unwrap()
            .clone();
        (
            memory["available"].as_i64().unwrap(),
            memory["capacity"].as_i64().unwrap(),
            json["hugepagesSubtractedBytes"].as_u64().unwrap(),
        )
    };
    let (code, stdout) = run(&["signals", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 0, "{stdout}");
    assert!(
        stdout.contains(
            "huge pages: 1Gi reserved, left out of memory.available (HugepageAwareEviction)"
        ),
        "{stdout}"
    );
    let args = [
        "signals",
        "--config",
        config.to_str().unwrap(),
        "--output",
        "json",
    ];
    let (code, stdout) = run(&args);
    assert_eq!(code, 0, "{stdout}");
    // The fixture's figures (json_report_carries_fixture_numbers_and_thresholds) less 1 GiB.
    assert_eq!(
        memory_available(&stdout),
        (
            10_341_318_656 - (1 << 30),
            16_777_216_000 - (1 << 30),
            1 << 30
        )
    );

    let gate_off = std::fs::read_to_string(&config).unwrap()
        + "featureGates:\n  HugepageAwareEviction: false\n";
    std::fs::write(&config, gate_off).unwrap();
    let (code, stdout) = run(&args);
    assert_eq!(code, 0, "{stdout}");
    assert_eq!(
        memory_available(&stdout),
        (10_341_318_656, 16_777_216_000, 0)
    );
    let (_, table) = run(&["signals", "--config", config.to_str().unwrap()]);
    assert!(!table.contains("huge pages:"), "{table}");
}
