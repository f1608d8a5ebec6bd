//! The kubelet's eviction signals, the resources they starve and the node conditions they
//! set, by name: a leaf every layer can use (the config model keys thresholds by them).

use std::fmt;
use std::str::FromStr;

/// The kubelet's eviction signals, in the kubelet's spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    MemoryAvailable,
    AllocatableMemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    ContainerFsAvailable,
    ContainerFsInodesFree,
    PidAvailable,
}

/// The resource a signal starves, as named in eviction messages and events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    Memory,
    EphemeralStorage,
    Inodes,
    Pids,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeCondition {
    DiskPressure,
    MemoryPressure,
    PidPressure,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported eviction signal {0}")]
pub struct UnknownSignal(pub String);

impl Signal {
    pub const ALL: [Signal; 9] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
        Signal::PidAvailable,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::ContainerFsAvailable => "containerfs.available",
            Signal::ContainerFsInodesFree => "containerfs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    pub fn resource(&self) -> Resource {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Resource::Memory,
            Signal::NodeFsAvailable | Signal::ImageFsAvailable | Signal::ContainerFsAvailable => {
                Resource::EphemeralStorage
            }
            Signal::NodeFsInodesFree
            | Signal::ImageFsInodesFree
            | Signal::ContainerFsInodesFree => Resource::Inodes,
            Signal::PidAvailable => Resource::Pids,
        }
    }

    pub fn node_condition(&self) -> NodeCondition {
        match self.resource() {
            Resource::Memory => NodeCondition::MemoryPressure,
            Resource::EphemeralStorage | Resource::Inodes => NodeCondition::DiskPressure,
            Resource::Pids => NodeCondition::PidPressure,
        }
    }

    pub fn is_memory(&self) -> bool {
        self.resource() == Resource::Memory
    }
}

impl FromStr for Signal {
    type Err = UnknownSignal;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Signal::ALL
            .into_iter()
            .find(|signal| signal.as_str() == s)
            .ok_or_else(|| UnknownSignal(s.to_string()))
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Resource {
    pub fn as_str(&self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::EphemeralStorage => "ephemeral-storage",
            Resource::Inodes => "inodes",
            Resource::Pids => "pids",
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl NodeCondition {
    pub fn as_str(&self) -> &'static str {
        match self {
            NodeCondition::MemoryPressure => "MemoryPressure",
            NodeCondition::DiskPressure => "DiskPressure",
            NodeCondition::PidPressure => "PIDPressure",
        }
    }
}

impl fmt::Display for NodeCondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One of the PSI contention node conditions of KEP-5394; `signals::contention` decides
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum Contention {
    SystemMemory,
    SystemDisk,
    KubepodsMemory,
    KubepodsDisk,
}

impl Contention {
    pub const ALL: [Contention; 4] = [
        Contention::SystemMemory,
        Contention::SystemDisk,
        Contention::KubepodsMemory,
        Contention::KubepodsDisk,
    ];

    /// The node condition type, as the KEP names it.
    pub fn condition_type(self) -> &'static str {
        match self {
            Contention::SystemMemory => "SystemMemoryContentionPressure",
            Contention::SystemDisk => "SystemDiskContentionPressure",
            Contention::KubepodsMemory => "KubepodsMemoryContentionPressure",
            Contention::KubepodsDisk => "KubepodsDiskContentionPressure",
        }
    }

    /// The configuration field holding its threshold, as the KEP names it.
    pub fn threshold_field(self) -> &'static str {
        match self {
            Contention::SystemMemory => "systemMemoryContentionThreshold",
            Contention::SystemDisk => "systemDiskContentionThreshold",
            Contention::KubepodsMemory => "kubepodsMemoryContentionThreshold",
            Contention::KubepodsDisk => "kubepodsDiskContentionThreshold",
        }
    }

    /// Whether it watches the pods cgroup rather than the whole node.
    pub fn is_kubepods(self) -> bool {
        matches!(self, Contention::KubepodsMemory | Contention::KubepodsDisk)
    }

    /// Whether it watches stalls on IO (the KEP's "disk") rather than on memory.
    pub fn is_disk(self) -> bool {
        matches!(self, Contention::SystemDisk | Contention::KubepodsDisk)
    }

    /// `memory` or `disk`, for the taint a condition of this kind adds.
    pub fn kind(self) -> &'static str {
        if self.is_disk() { "disk" } else { "memory" }
    }
}

impl fmt::Display for Contention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.condition_type())
    }
}
