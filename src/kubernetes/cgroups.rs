//! Where the kubelet puts a pod's cgroup: the pods cgroup, then a QoS tier (Guaranteed
//! pods sit directly in the pods cgroup), then `pod<uid>`. The cgroupfs driver uses those
//! names as directories; the systemd driver turns the same name into nested slices,
//! `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`, with
//! every `-` inside a part written as `_`. The paths are the same in v1 and v2
//! hierarchies; [`crate::signals::CgroupReader`] adds the controller directory.

use std::path::{Path, PathBuf};

use super::resources::QosClass;
use crate::config::CgroupDriver;
use crate::signals::CgroupReader;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCgroupNaming {
    driver: CgroupDriver,
    /// The pods cgroup as name parts, `["kubepods"]` for `/kubepods`.
    pods_root: Vec<String>,
}

impl PodCgroupNaming {
    /// `pods_cgroup_name` is in cgroupfs notation (`/kubepods`), whatever the driver.
    pub fn new(driver: CgroupDriver, pods_cgroup_name: &str) -> Self {
        PodCgroupNaming {
            driver,
            pods_root: pods_cgroup_name
                .split('/')
                .filter(|part| !part.is_empty())
                .map(str::to_string)
                .collect(),
        }
    }

    /// The driver whose pods cgroup exists under `reader`'s memory hierarchy; systemd
    /// when both or neither exist, since that is the kubelet's recommended driver.
    pub fn detect(reader: &CgroupReader, pods_cgroup_name: &str) -> Self {
        let cgroupfs = PodCgroupNaming::new(CgroupDriver::Cgroupfs, pods_cgroup_name);
        let systemd = PodCgroupNaming::new(CgroupDriver::Systemd, pods_cgroup_name);
        let exists =
            |naming: &PodCgroupNaming| reader.paths().memory_dir(&naming.pods_cgroup()).is_dir();
        if exists(&cgroupfs) && !exists(&systemd) {
            cgroupfs
        } else {
            systemd
        }
    }

    pub fn driver(&self) -> CgroupDriver {
        self.driver
    }

    /// The pods cgroup itself, relative to the hierarchy root.
    pub fn pods_cgroup(&self) -> PathBuf {
        self.render(&self.pods_root)
    }

    /// The cgroup of the pod with this UID and QoS class, relative to the hierarchy root.
    pub fn pod_cgroup(&self, uid: &str, qos: QosClass) -> PathBuf {
        let mut parts = self.pods_root.clone();
        match qos {
            QosClass::Guaranteed => {}
            QosClass::Burstable => parts.push("burstable".to_string()),
            QosClass::BestEffort => parts.push("besteffort".to_string()),
        }
        parts.push(format!("pod{uid}"));
        self.render(&parts)
    }

    fn render(&self, parts: &[String]) -> PathBuf {
        match self.driver {
            CgroupDriver::Cgroupfs => {
                let mut path = PathBuf::from("/");
                for part in parts {
                    path.push(part);
                }
                path
            }
            CgroupDriver::Systemd => {
                // Each level is a slice named by all the parts above it joined by `-`.
                let mut path = PathBuf::from("/");
                let mut prefix = String::new();
                for part in parts {
                    if !prefix.is_empty() {
                        prefix.push('-');
                    }
                    prefix.push_str(&part.replace('-', "_"));
                    path.push(format!("{prefix}.slice"));
                }
                path
            }
        }
    }
}

/// The child cgroup of `pod_cgroup` that belongs to the container with this runtime id
/// (`<id>` under cgroupfs, `cri-containerd-<id>.scope`, `crio-<id>.scope` or
/// `docker-<id>.scope` under systemd, and the same names without `.scope`).
pub fn container_cgroup(
    reader: &CgroupReader,
    pod_cgroup: &Path,
    container_id: &str,
) -> Option<PathBuf> {
    if container_id.is_empty() {
        return None;
    }
    let children = reader.list_child_cgroups(pod_cgroup).ok()?;
    children.into_iter().find(|child| {
        child
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| names_container(name, container_id))
    })
}

/// Whether a cgroup named `name` is the one a runtime made for the container `id`. Not
/// any name that holds the id: CRI-O puts its monitor of the container in
/// `crio-conmon-<id>.scope`, beside the container's `crio-<id>.scope`.
fn names_container(name: &str, id: &str) -> bool {
    let name = name.strip_suffix(".scope").unwrap_or(name);
    let Some(prefix) = name.strip_suffix(id) else {
        return false;
    };
    ["", "cri-containerd-", "crio-", "docker-"].contains(&prefix)
}

/// The bare id from a status `containerID` like `containerd://0123abcd`.
pub fn runtime_container_id(status_id: &str) -> &str {
    status_id.split_once("://").map_or(status_id, |(_, id)| id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A container's cgroup is the one its runtime names for it, under either driver;
    /// not another whose name holds the id (CRI-O's monitor, a longer id, a slice).
    #[test]
    fn a_containers_cgroup_is_told_by_the_name_its_runtime_gives_it() {
        let id = "0123abcd";
        for name in [
            "0123abcd",
            "cri-containerd-0123abcd.scope",
            "crio-0123abcd.scope",
            "docker-0123abcd.scope",
            "crio-0123abcd",
            "cri-containerd-0123abcd",
        ] {
            assert!(names_container(name, id), "{name}");
        }
        for name in [
            "crio-conmon-0123abcd.scope",
            "crio-conmon-0123abcd",
            "xcrio-0123abcd.scope",
            "a-0123abcd",
            "0123abcd.slice",
            "0123abcdef",
            "ff0123abcd",
            "cri-containerd-0123abcd.scope.x",
        ] {
            assert!(!names_container(name, id), "{name}");
        }
    }

    #[test]
    fn pod_cgroup_for_every_driver_and_qos_tier() {
        let uid = "0f3c-42-aa";
        let cases = [
            (
                CgroupDriver::Systemd,
                QosClass::Guaranteed,
                "/kubepods.slice/kubepods-pod0f3c_42_aa.slice",
            ),
            (
                CgroupDriver::Systemd,
                QosClass::Burstable,
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f3c_42_aa.slice",
            ),
            (
                CgroupDriver::Systemd,
                QosClass::BestEffort,
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f3c_42_aa.slice",
            ),
            (
                CgroupDriver::Cgroupfs,
                QosClass::Guaranteed,
                "/kubepods/pod0f3c-42-aa",
            ),
            (
                CgroupDriver::Cgroupfs,
                QosClass::Burstable,
                "/kubepods/burstable/pod0f3c-42-aa",
            ),
            (
                CgroupDriver::Cgroupfs,
                QosClass::BestEffort,
                "/kubepods/besteffort/pod0f3c-42-aa",
            ),
        ];
        for (driver, qos, expected) in cases {
            let naming = PodCgroupNaming::new(driver, "/kubepods");
            assert_eq!(
                naming.pod_cgroup(uid, qos),
                PathBuf::from(expected),
                "{driver} {qos}"
            );
        }
    }

    #[test]
    fn a_nested_pods_cgroup_expands_into_nested_slices() {
        let naming = PodCgroupNaming::new(CgroupDriver::Systemd, "/node-agent/kubepods");
        assert_eq!(
            naming.pod_cgroup("u", QosClass::Burstable),
            PathBuf::from(
                "/node_agent.slice/node_agent-kubepods.slice/node_agent-kubepods-burstable.slice/node_agent-kubepods-burstable-podu.slice"
            )
        );
        let naming = PodCgroupNaming::new(CgroupDriver::Cgroupfs, "/node-agent/kubepods");
        assert_eq!(naming.pods_cgroup(), PathBuf::from("/node-agent/kubepods"));
    }

    #[test]
    fn detects_the_driver_from_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.controllers"), "memory pids\n").unwrap();
        let reader = CgroupReader::detect(dir.path()).unwrap();
        assert_eq!(
            PodCgroupNaming::detect(&reader, "/kubepods").driver(),
            CgroupDriver::Systemd
        );
        std::fs::create_dir(dir.path().join("kubepods")).unwrap();
        assert_eq!(
            PodCgroupNaming::detect(&reader, "/kubepods").driver(),
            CgroupDriver::Cgroupfs
        );
        std::fs::create_dir(dir.path().join("kubepods.slice")).unwrap();
        assert_eq!(
            PodCgroupNaming::detect(&reader, "/kubepods").driver(),
            CgroupDriver::Systemd
        );
    }

    #[test]
    fn runtime_ids_lose_their_scheme() {
        assert_eq!(runtime_container_id("containerd://abc"), "abc");
        assert_eq!(runtime_container_id("cri-o://def"), "def");
        assert_eq!(runtime_container_id("abc"), "abc");
    }
}
