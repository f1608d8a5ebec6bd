//! Isolating a node on the fence controller's instruction. A node cut off from the API
//! server but still reaching the controller is alive: powering it off blind would be
//! wrong, and releasing its pods while they run would be worse. So the controller asks
//! its agent (in the answer to a report, over TLS only) to isolate the node: the kubelet's
//! unit is masked for this boot and stopped through systemd (a killed container would
//! otherwise be restarted by the kubelet), every process of the pods cgroup is killed,
//! and the agent reports the evidence (the kubelet inactive and masked, no pod process
//! left), checked again for every report. See docs/protocol.md.
//!
//! `record.rs` is the pure part (the step for an instruction, the evidence, the report);
//! `pods.rs` kills and counts pod processes with the one cgroup killer; `isolator.rs` is
//! the task that does it, keeps the isolation in a state file under /run (it ends with the
//! boot, as the unit's runtime mask does) and ends it when the controller says so.
//!
//! Self-isolation (off unless configured) is the same isolation begun by the agent
//! itself, for a node with no fence device that the controller can no longer hear:
//! `self_isolation.rs` decides when (pure), `guardian.rs` holds the watchdog and asks
//! the isolator, `watchdog.rs` is the device and the node reset.

pub mod guardian;
mod isolator;
mod pods;
mod record;
pub mod self_isolation;
pub mod watchdog;

pub use isolator::{Isolator, IsolatorSettings};
pub use pods::{PodProcesses, PodsCgroup};
pub use record::{
    Evidence, IsolationRecord, RETRY_AFTER, RecordPhase, Refused, Step, report, step_for,
};
