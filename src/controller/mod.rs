//! The fence controller's core: the NodeFence resource (`resource.rs`), the controller's
//! configuration (`policy.rs`), what it knows about nodes (`facts.rs`), the storm guard
//! (`storm.rs`) and the state machine (`decide.rs`, reading step progress from the
//! recorded executions in `progress.rs`). All of it is pure: the reconciler around it
//! reads the cluster, calls `decide`, writes the status and only then acts.

pub mod clock;
pub mod decide;
pub mod executor;
pub mod facts;
pub mod hearing;
pub mod job_executor;
pub mod jobs;
pub mod kdump;
pub mod lease;
pub mod liveness;
pub mod metrics;
pub mod nodes;
pub mod observe;
pub mod policy;
pub mod progress;
pub mod reconciler;
pub mod report_endpoint;
pub mod resource;
pub mod run;
pub mod status;
pub mod storm;
pub mod views;

pub use decide::{
    Action, Decision, ExecutionReport, ExecutionRequest, FenceEvent, Outcome, ReportedState,
    TaintChange, decide,
};
pub use facts::{MethodOutline, NodeFacts, NodeHealth, NodeTaints, PlanOutline, Readiness};
pub use policy::{ControllerPolicy, CountOrPercent, FencePolicy, StormPolicy};
pub use resource::{NodeFence, NodeFenceSpec, NodeFenceStatus};
pub use storm::{Assessment, Guard, GuardBlock, StormMemory, StormState};
