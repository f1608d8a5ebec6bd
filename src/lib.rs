//! nodekeeper: node-pressure eviction and graceful node shutdown for Kubernetes nodes.
//!
//! The crate is a functional core (threshold evaluation, ranking, shutdown planning) with
//! an I/O shell (cgroupfs/procfs readers, HTTP, the agent loop) around it.

pub mod act;
pub mod agent;
pub mod backoff;
pub mod boot_clock;
pub mod config;
pub mod controller;
pub mod cri;
pub mod eviction;
pub mod fencing;
pub mod isolation;
pub mod kubernetes;
pub mod metrics;
pub mod notify;
pub mod pods;
pub mod ports;
pub mod process;
pub mod quantity;
pub mod report;
pub mod shutdown;
pub mod signal_names;
pub mod signals;
pub mod state_file;
pub mod systemd;
pub mod text;
pub mod trace;
