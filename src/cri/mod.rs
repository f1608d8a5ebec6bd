//! The container runtime through its CRI socket, for node-level reclaim: the kubelet
//! frees disk by removing dead containers and unused images before it evicts a pod for
//! disk pressure, and so does the agent, deciding as the kubelet decides.
//!
//! - [`gc`]: what to remove, pure functions over what the runtime listed;
//! - [`client`]: unary gRPC calls over the runtime's Unix socket;
//! - [`wire`]: the CRI messages used, written by hand;
//! - [`reclaimer`]: [`CriReclaimer`], the [`crate::eviction::NodeReclaimer`] that lists,
//!   decides and removes.

pub mod client;
pub mod gc;
pub mod reclaimer;
pub mod wire;

pub use client::{CriClient, CriError, socket_path};
pub use reclaimer::{CriReclaimer, IMAGE_DETECTION_PERIOD, Removed, unix_nanos_now};
