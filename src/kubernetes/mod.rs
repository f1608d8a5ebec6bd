//! The agent on a Kubernetes node: pods from the API server, per-pod usage from their
//! cgroups and files, evictions the cluster sees (event, `DisruptionTarget`, delete with
//! a UID precondition), and our own node conditions, taints and events. API writes go
//! through a bounded [`outbox::Outbox`], so an unreachable API server never stops local
//! protection.

pub mod api;
pub mod cgroups;
pub mod convert;
pub mod disk_walk;
pub mod evictor;
pub mod fencing;
pub mod journal;
pub mod node;
pub mod outbox;
pub mod probe;
pub mod resources;
pub mod runtime;
pub mod shutdown;
pub mod source;
pub mod usage;
pub mod worker;

pub use runtime::{
    CONTROLLER_USER_AGENT, KubeError, KubeRuntime, USER_AGENT, build_client, build_client_as,
    client_config, connect, node_name,
};
