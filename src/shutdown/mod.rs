//! Graceful node shutdown: plan priority phases like the kubelet, hold a logind delay
//! inhibitor, run the phases when logind announces a shutdown, and persist progress so a
//! restarted agent resumes instead of admitting work.

pub mod cgroup_kill;
pub mod logind;
pub mod manager;
pub mod plan;
pub mod runner;
pub mod state;
