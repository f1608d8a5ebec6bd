//! Kernel notifiers: wake the agent loop the moment the kernel reports memory pressure,
//! instead of waiting for the next poll.
//!
//! - cgroup v1: memcg thresholds ([`MemcgThreshold`]), an eventfd registered in
//!   `cgroup.event_control` on `memory.usage_in_bytes`, the first whole page past
//!   `capacity − threshold + inactive_file` ([`memcg_trigger_bytes`]).
//! - PSI ([`PsiTrigger`]): `some|full <stall> <window>` written to a pressure file, then
//!   `POLLPRI`.
//! - cgroup v2 `memory.events` ([`MemoryEventsWatch`]): inotify, waking when `high`,
//!   `max`, `oom` or `oom_kill` grow.
//!
//! All of them feed one [`StormLimiter`], so a notification evaluates at once but a storm
//! cannot run evaluations back to back; it wakes the decision cycle through a
//! [`CycleWake`], saying whether the notification was held back. [`Notifiers`] starts
//! what the host supports. While the cycle reads its pods, [`WaitingNotifications`] tells
//! it of a notification its notifiers have not yet read.

mod error;
mod events;
mod inotify;
mod limiter;
mod manager;
mod memcg;
mod pollable;
mod psi;
mod waiting;
mod wake;

pub use error::NotifyError;
pub use events::{MemoryEventCounts, MemoryEventsWatch};
pub use inotify::FileWatch;
pub use limiter::{ForwardCounts, Next, StormLimiter, forward_limited};
pub use manager::{ArmedNotifier, Mechanism, NotifierCounts, NotifierSettings, Notifiers};
pub use memcg::{MemcgThreshold, RefreshPolicy, Registered, memcg_trigger_bytes, page_size};
pub use psi::{PsiReadiness, PsiTrigger, PsiTriggerSpec};
pub use waiting::WaitingNotifications;
pub use wake::{CycleWake, WakeReason, Wakeup};
