#![allow(dead_code)]
pub mod agent_process;
pub mod allocator;
pub mod apiserver;
pub mod cgroups;
pub mod controller;
pub mod debian;
pub mod fake_fence_agents;
pub mod fence_emulators;
pub mod fence_manifests;
pub mod job_runner;
pub mod kubelet;
pub mod node_units;
pub mod nspawn;
pub mod process_usage;
pub mod proxy;
pub mod real;
pub mod tls;
