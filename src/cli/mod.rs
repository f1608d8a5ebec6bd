//! One file per subcommand: its clap arguments and a `run` that returns the exit code.
//! These are the binary's edge, so they may use anyhow; the library stays typed.

pub mod agent;
pub mod check_config;
pub mod rank;
pub mod replay;
pub mod shutdown_plan;
pub mod signals;
