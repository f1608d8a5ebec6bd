//! `nodekeeper check-config` as an operator runs it: exit codes and messages.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};

/// `nodekeeper check-config ARGS...`.
fn check_config_with(args: &[&OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .arg("check-config")
        .args(args)
        .output()
        .expect("run nodekeeper")
}

fn check_config(path: &Path) -> Output {
    check_config_with(&[path.as_os_str()])
}

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/config")
        .join(name)
}

#[test]
fn accepts_kubelet_documented_configs_and_prints_effective_settings() {
    for (name, expected) in [
        ("kubeadm-kubelet-config.yaml", "memory.available: 100Mi"),
        (
            "eviction-example.yaml",
            "#   memory.available<1536Mi (soft, grace 1m30s, minimum reclaim 0)",
        ),
        (
            "shutdown-by-priority.yaml",
            "shutdownGracePeriodSeconds: 180",
        ),
        ("kubelet-plus-agent.yaml", "memory.available: 500Mi"),
    ] {
        let out = check_config(&fixture(name));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains(expected), "{name}: {stdout}");
        assert!(
            stdout.contains("kind: AgentConfiguration"),
            "{name}: {stdout}"
        );
    }
}

#[test]
fn the_effective_output_is_itself_a_valid_config() {
    let out = check_config(&fixture("kubelet-plus-agent.yaml"));
    assert!(out.status.success());
    assert_round_trips(&out);
}

/// `first`, check-config's output, read back by check-config gives the same settings.
fn assert_round_trips(first: &Output) {
    let dir = tempfile::tempdir().unwrap();
    let again = dir.path().join("effective.yaml");
    std::fs::write(&again, &first.stdout).unwrap();
    let second = check_config(&again);
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    // The first line names the file read.
    let body = |o: &Output| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .skip(1)
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(body(first), body(&second));
}

#[test]
fn sections_left_unset_show_their_defaults_and_optional_fields_say_what_unset_means() {
    // `-c FILE`, the way every other command takes its configuration.
    let out = check_config_with(&[
        "-c".as_ref(),
        fixture("kubeadm-kubelet-config.yaml").as_os_str(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A kubelet file sets none of the agent's sections; their defaults are shown.
    for shown in [
        "\nkubernetes:\n  podsCgroupName: /kubepods\n",
        "  podLogsPath: /var/log/pods\n",
        "  apiProbeInterval: 10s\n",
        "  outboxSize: 1000\n",
        "  localKill: true\n",
        "\nnodeReclaim:\n  method: cri\n  commands: []\n  timeout: 2m0s\n",
        // kubeadm's empty endpoint and 0s minimum age are the kubelet's defaults.
        "\ncontainerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n",
        "\nimageMinimumGCAge: 2m0s\n",
        "\nmergeDefaultEvictionSettings: false\n",
    ] {
        assert!(stdout.contains(shown), "{shown:?} missing from\n{stdout}");
    }
    // Optional settings with no default value are named, with what unset means.
    // The kubeadm file's `cgroupDriver: systemd` is not taken: the kubelet itself asks
    // the runtime.
    for unset in [
        "#   podsCgroup: ",
        "#   report: no reports to a fence controller",
        "#   kubernetes.cgroupDriver: detected from the cgroup tree",
    ] {
        assert!(stdout.contains(unset), "{unset:?} missing from\n{stdout}");
    }

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\npodsCgroup: kubepods\nreport:\n  controllerURL: https://nodekeeper-controller:9849\n",
    )
    .unwrap();
    let out = check_config(&config);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("\nreport:\n  controllerURL: https://nodekeeper-controller:9849\n"),
        "{stdout}"
    );
    assert!(!stdout.contains("#   report:"), "{stdout}");
    assert!(!stdout.contains("#   podsCgroup:"), "{stdout}");
    // No kubelet file here: the driver is left to detection, and the output says so.
    assert!(
        stdout.contains(
            "#   kubernetes.cgroupDriver: detected from the cgroup tree (a KubeletConfiguration's cgroupDriver is not read: the kubelet asks the container runtime, which names the cgroups)"
        ),
        "{stdout}"
    );
}

#[test]
fn check_config_takes_its_file_once() {
    let file = fixture("kubeadm-kubelet-config.yaml");
    let out = check_config_with(&[file.as_os_str(), "--config".as_ref(), file.as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot be used with"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = check_config_with(&[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn every_section_round_trips_with_values_other_than_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        "apiVersion: nodekeeper.io/v1alpha1
kind: AgentConfiguration
podsCgroup: kubepods
nodeReclaim:
  commands: [\"/usr/bin/crictl rmi --prune\"]
  timeout: 90s
kubernetes:
  enabled: true
  kubeconfig: /etc/kubernetes/kubelet.conf
  cgroupDriver: cgroupfs
  podsCgroupName: /kubepods
  podLogsPath: /srv/logs/pods
  kubeletRootPath: /srv/kubelet
  writableLayerPath: /var/lib/containerd/{containerId}/rootfs
  diskWalkMaxEntries: 5
  taints: true
  conditionHeartbeat: 1m
  apiProbeInterval: 0s
  apiProbeTimeout: 2s
  outboxSize: 10
  localKill: false
report:
  controllerURL: https://nodekeeper-controller:9849
  interval: 5s
  caFile: /etc/nodekeeper/ca.crt
",
    )
    .unwrap();
    let first = check_config(&config);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let stdout = String::from_utf8_lossy(&first.stdout);
    for kept in [
        "  cgroupDriver: cgroupfs\n",
        "  diskWalkMaxEntries: 5\n",
        "  apiProbeInterval: 0s\n",
        "  localKill: false\n",
        "  timeout: 1m30s\n",
        "  writableLayerPath: /var/lib/containerd/{containerId}/rootfs\n",
    ] {
        assert!(stdout.contains(kept), "{kept:?} missing from\n{stdout}");
    }
    assert!(!stdout.contains("#   kubernetes."), "{stdout}");
    assert!(!stdout.contains("#   report.caFile"), "{stdout}");
    assert_round_trips(&first);
}

#[test]
fn shipped_example_config_is_valid() {
    let out = check_config(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config/agent.yaml"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("dryRun: true"));
}

#[test]
fn rejects_each_class_of_bad_file_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    let agent = "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\n";
    let cases = [
        (
            "unknown-signal",
            format!("{kubelet}evictionHard: {{memory.free: 1Gi}}\n"),
            "evictionHard[\"memory.free\"]: unsupported eviction signal memory.free",
        ),
        (
            "bad-quantity",
            format!("{kubelet}evictionHard: {{memory.available: 1GB}}\n"),
            "evictionHard[\"memory.available\"]: \"1GB\"",
        ),
        (
            "negative-duration",
            format!(
                "{kubelet}evictionSoft: {{memory.available: 1Gi}}\nevictionSoftGracePeriod: {{memory.available: -1m}}\n"
            ),
            "evictionSoftGracePeriod[\"memory.available\"]: invalid eviction grace period specified: -1m, must be a positive value",
        ),
        (
            "unknown-field",
            format!("{agent}housekeepingIntreval: 1s\n"),
            "unknown field `housekeepingIntreval`",
        ),
        (
            "soft-without-grace",
            format!("{agent}evictionSoft: {{memory.available: 1Gi}}\n"),
            "grace period must be specified for the soft eviction threshold memory.available",
        ),
        (
            "wrong-type",
            format!("{agent}dryRun: sometimes\n"),
            "dryRun: invalid type",
        ),
        (
            "bad-yaml",
            format!("{agent}evictionHard: [\n"),
            "invalid YAML",
        ),
        (
            "shutdown",
            format!("{kubelet}shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 1m\n"),
            "shutdownGracePeriodCriticalPods 1m0s must be <= shutdownGracePeriod 10s",
        ),
    ];
    for (name, text, needle) in cases {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, text).unwrap();
        let out = check_config(&path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(
            stderr.contains(needle),
            "{name}: {stderr:?} lacks {needle:?}"
        );
        assert!(
            stderr.contains(&format!("{name}.yaml")),
            "{name}: error does not name the file: {stderr}"
        );
        assert!(
            out.stdout.is_empty(),
            "{name}: printed settings despite the error"
        );
    }
    let missing = check_config(&dir.path().join("absent.yaml"));
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read"));
}

/// A node's own kubelet config with values the kubelet runs with although they are surely
/// mistakes: `check-config` accepts it (the agent would start) and warns naming the file
/// and each field; `--strict` refuses it with the same findings; a clean file passes
/// `--strict`.
#[test]
fn strict_turns_warnings_into_a_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let warned = dir.path().join("kubelet.yaml");
    std::fs::write(
        &warned,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionMaxPodGracePeriod: -1\nevictionMinimumReclaim: {memory.available: 120%}\n",
    )
    .unwrap();
    let findings = [
        "kubelet.yaml document 1 (KubeletConfiguration): evictionMaxPodGracePeriod: -1 is negative",
        "kubelet.yaml document 1 (KubeletConfiguration): evictionMinimumReclaim[\"memory.available\"]: 120% is more than the whole capacity",
    ];

    let lenient = check_config(&warned);
    let stderr = String::from_utf8_lossy(&lenient.stderr);
    assert!(lenient.status.success(), "{stderr}");
    for finding in findings {
        assert!(stderr.contains(finding), "{stderr}");
    }
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.starts_with("warning: "))
            .count(),
        2,
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&lenient.stdout).contains("evictionMaxPodGracePeriod: -1"));

    let strict = check_config_with(&["--strict".as_ref(), warned.as_os_str()]);
    let stderr = String::from_utf8_lossy(&strict.stderr);
    assert_eq!(strict.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("refused by --strict"), "{stderr}");
    for finding in findings {
        assert!(stderr.contains(finding), "{stderr}");
    }
    assert!(
        strict.stdout.is_empty(),
        "printed settings despite refusing"
    );

    let clean = check_config_with(&[
        "--strict".as_ref(),
        fixture("eviction-example.yaml").as_os_str(),
    ]);
    assert!(
        clean.status.success(),
        "{}",
        String::from_utf8_lossy(&clean.stderr)
    );
}

#[test]
fn a_configuration_read_from_a_pipe_is_checked_as_written() {
    // `check-config -c <(...)` and `-c /dev/stdin` give a pipe, which can be read once.
    let mut child = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["check-config", "-c", "/dev/stdin"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("nodekeeper check-config");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(
                b"apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\n\
                  evictionHard: {memory.available: 1Gi}\nshutdownGracePeriod: 8s\n",
            )
            .expect("the configuration");
    }
    let output = child.wait_with_output().expect("check-config's output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(stdout.contains("memory.available: 1Gi"), "{stdout}");
    assert!(stdout.contains("shutdownGracePeriod: 8s"), "{stdout}");
}
