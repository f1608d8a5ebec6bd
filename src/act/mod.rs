//! Acting on eviction decisions without a Kubernetes API: the standalone evictor kills a
//! pod's cgroup (`cgroup.kill` on v2; freeze, SIGKILL, thaw on v1), soft evictions get
//! SIGTERM first and SIGKILL after their grace period, and the dry-run evictor only logs.
//! The same killer (`kill.rs`) stops workloads at node shutdown.
//! Only cgroups strictly below the configured workload parent are ever touched.

mod error;
mod evictor;
mod kill;
mod scope;

pub use error::ActError;
pub use evictor::{CgroupEvictor, DryRunEvictor, Escalation};
pub use kill::{
    CgroupKiller, KillMethod, KillReport, KillTarget, StopTiming, Stopped, count_direct_members,
    count_processes, kill_direct_members, kill_target, signalable, signalable_members,
    stop_gracefully,
};
pub use scope::{is_path_component, workload_cgroup, workload_parent};
