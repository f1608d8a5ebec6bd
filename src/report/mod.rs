//! Agent-to-controller reports (see docs/protocol.md): the wire format, the
//! controller's ledger of each node's latest report, how a report's sender is
//! authenticated, the controller's endpoint, the agent's sender, and the channel's TLS.

pub mod auth;
pub mod board;
pub mod contact;
pub mod http1;
pub mod ledger;
pub mod protocol;
pub mod reachability;
pub mod sender;
pub mod server;
pub mod tls;

pub use board::{AgentFacts, IsolationBootTimes, ReportBoard};
pub use contact::ContactClock;
pub use ledger::{AgentView, Census, Credential, Identity, ReportLedger};
pub use protocol::{AgentReport, decode_report};
pub use reachability::ApiReachability;
pub use server::{ReportHub, ReportMetrics, ReportsPolicy, TlsFiles};
