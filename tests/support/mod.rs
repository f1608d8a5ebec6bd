#![allow(dead_code)]
pub mod agent_process;
pub mod allocator;
pub mod apiserver;
pub mod cgroups;
pub mod containerd;
pub mod controller;
pub mod controller_rbac;
pub mod debian;
pub mod documents;
pub mod exposition;
pub mod fake_fence_agents;
pub mod fake_node;
pub mod fence_emulators;
pub mod fence_manifests;
pub mod full_disk;
pub mod job_runner;
pub mod kube_node;
pub mod kubelet;
pub mod logind_fake;
pub mod netns;
pub mod node_units;
pub mod nspawn;
pub mod poll;
pub mod process_usage;
pub mod proxy;
pub mod real;
pub mod reports;
pub mod scheduling;
pub mod tls;
pub mod vm;

/// The port of `address` (`host:port`, `[v6]:port` or a URL ending in its port).
pub fn port_of(address: &str) -> u16 {
    address
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("no port in {address}"))
}
