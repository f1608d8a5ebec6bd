//! Graceful node shutdown: plan priority phases like the kubelet, hold a logind delay
//! inhibitor, run the phases when logind announces a shutdown, and persist progress so a
//! restarted agent resumes instead of admitting work.

pub mod plan;
pub mod pod_list;
pub mod state;
