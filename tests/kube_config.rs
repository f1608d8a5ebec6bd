//! The `kubernetes:` section of an AgentConfiguration: defaults, every field, and the
//! errors that name the field to fix.

use std::path::PathBuf;

use nodekeeper::config::{CgroupDriver, GoDuration, KubernetesConfig, Overrides, from_yaml_str};

const AGENT: &str = "apiVersion: nodekeeper.io/v1alpha1\nkind: AgentConfiguration\n";

fn parse(body: &str) -> Result<KubernetesConfig, String> {
    from_yaml_str(
        &format!("{AGENT}{body}"),
        "test.yaml",
        &Overrides::default(),
    )
    .map(|config| config.kubernetes)
    .map_err(|e| e.to_string())
}

#[test]
fn omitted_section_gives_the_documented_defaults() {
    let config = parse("").unwrap();
    assert_eq!(config, KubernetesConfig::default());
    assert_eq!(config.enabled, None);
    assert_eq!(config.pods_cgroup_name, "/kubepods");
    assert_eq!(config.pod_logs_path, PathBuf::from("/var/log/pods"));
    assert_eq!(config.condition_heartbeat, GoDuration::from_secs(300));
    assert!(!config.taints);
    assert!(config.local_kill);
}

#[test]
fn every_field_is_read() {
    let config = parse(
        "kubernetes:
  enabled: true
  kubeconfig: /etc/kubeconfig
  cgroupDriver: systemd
  podsCgroupName: custom/kubepods/
  podLogsPath: /logs
  kubeletRootPath: /kubelet
  writableLayerPath: /var/lib/docker/overlay2/{containerId}/diff
  diskWalkMaxEntries: 50
  taints: true
  conditionHeartbeat: 1m
  apiProbeInterval: 3s
  apiProbeTimeout: 1500ms
  outboxSize: 7
  localKill: false
  stateFile: /var/run/nk/writes.json
",
    )
    .unwrap();
    assert_eq!(
        config,
        KubernetesConfig {
            enabled: Some(true),
            kubeconfig: Some(PathBuf::from("/etc/kubeconfig")),
            cgroup_driver: Some(CgroupDriver::Systemd),
            pods_cgroup_name: "/custom/kubepods".to_string(),
            pod_logs_path: PathBuf::from("/logs"),
            kubelet_root_path: PathBuf::from("/kubelet"),
            writable_layer_path: Some("/var/lib/docker/overlay2/{containerId}/diff".to_string()),
            disk_walk_max_entries: 50,
            taints: true,
            condition_heartbeat: GoDuration::from_secs(60),
            api_probe_interval: GoDuration::from_secs(3),
            api_probe_timeout: GoDuration::from_nanos(1_500_000_000),
            outbox_size: 7,
            local_kill: false,
            state_file: PathBuf::from("/var/run/nk/writes.json"),
        }
    );
}

#[test]
fn invalid_values_name_the_field() {
    for (body, expected) in [
        (
            "kubernetes:\n  cgroupDriver: docker\n",
            "cgroupDriver: \"docker\"",
        ),
        (
            "kubernetes:\n  podsCgroupName: kubepods.slice\n",
            "podsCgroupName: \"kubepods.slice\"",
        ),
        (
            "kubernetes:\n  podLogsPath: logs\n",
            "podLogsPath: \"logs\" must be an absolute path",
        ),
        (
            "kubernetes:\n  stateFile: api-writes.json\n",
            "stateFile: \"api-writes.json\" must be an absolute path",
        ),
        (
            "kubernetes:\n  writableLayerPath: /var/lib/layers\n",
            "writableLayerPath",
        ),
        (
            "kubernetes:\n  apiProbeTimeout: 50ms\n",
            "apiProbeTimeout: 50ms must be at least",
        ),
        ("kubernetes:\n  apiProbeInterval: -1s\n", "apiProbeInterval"),
        (
            "kubernetes:\n  apiProbeInterval: 1ns\n",
            "apiProbeInterval: 1ns must be 0s (no probe) or at least 100ms",
        ),
        (
            "kubernetes:\n  apiProbeInterval: 4s\n",
            "apiProbeTimeout: 5s must be shorter than apiProbeInterval (4s)",
        ),
        (
            "kubernetes:\n  outboxSize: 0\n",
            "outboxSize must be positive",
        ),
        (
            "kubernetes:\n  diskWalkMaxEntries: 0\n",
            "diskWalkMaxEntries must be positive",
        ),
        (
            "kubernetes:\n  conditionHeartbeat: 10ms\n",
            "conditionHeartbeat: 10ms must be at least 1s",
        ),
        (
            "kubernetes:\n  conditionHeartbeat: soon\n",
            "conditionHeartbeat:",
        ),
        ("kubernetes:\n  taint: true\n", "unknown field `taint`"),
    ] {
        let error = parse(body).unwrap_err();
        assert!(error.contains(expected), "{body}: {error}");
        assert!(error.contains("test.yaml"), "{body}: {error}");
    }
}

/// Kubelets since 1.34 take the cgroup driver from the container runtime
/// (`KubeletCgroupDriverFromCRI`) and ignore their own `cgroupDriver` setting, so the
/// agent does not take it either: a stale value there must not send it to pod cgroups
/// that do not exist. Only its own `kubernetes.cgroupDriver` overrides detection.
#[test]
fn the_kubelets_cgroup_driver_setting_is_not_taken() {
    const KUBELET: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    let driver = |text: &str| {
        from_yaml_str(text, "node.yaml", &Overrides::default())
            .map(|config| config.kubernetes.cgroup_driver)
            .map_err(|e| e.to_string())
    };
    assert_eq!(
        driver(&format!("{KUBELET}cgroupDriver: cgroupfs\n")),
        Ok(None)
    );
    assert_eq!(
        driver(&format!(
            "{KUBELET}cgroupDriver: cgroupfs\n---\n{AGENT}kubernetes:\n  cgroupDriver: systemd\n"
        )),
        Ok(Some(CgroupDriver::Systemd))
    );
}
