//! Hidden `shutdown-manager` subcommand: the graceful-shutdown manager on its own, in
//! standalone mode (workload cgroups, no Kubernetes API). Used by the systemd-nspawn
//! end-to-end test and handy for trying the manager on a node.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use super::shutdown_plan::pods_from_path;
use anyhow::Context;
use nodekeeper::config::Overrides;
use nodekeeper::pods::Pod;
use nodekeeper::shutdown::cgroup_kill::CgroupTerminator;
use nodekeeper::shutdown::logind::{BusAddress, DEFAULT_DROPIN_PATH};
use nodekeeper::shutdown::manager::{
    DEFAULT_STATE_PATH, ManagerOptions, ManagerStatus, run_shutdown_manager,
};
use nodekeeper::shutdown::plan::phases_from_config;
use nodekeeper::shutdown::runner::SystemClock;
use nodekeeper::signals::read_boot_id;
use tokio::sync::watch;

#[derive(clap::Args)]
pub struct Args {
    /// Agent configuration (shutdownGracePeriod, shutdownGracePeriodCriticalPods or
    /// shutdownGracePeriodByPodPriority).
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Directory holding `<namespace>/<name>` workload cgroups (a v2 directory or one in
    /// the v1 freezer hierarchy).
    #[arg(long, value_name = "DIR")]
    pub workload_cgroup_parent: PathBuf,
    /// Pods with priorities and grace periods (trace pod schema), read when a shutdown
    /// begins. Without it, every `<namespace>/<name>` cgroup is a pod of priority 0.
    #[arg(long, value_name = "FILE")]
    pub pods: Option<PathBuf>,
    /// Where the shutdown record is kept, so a restarted manager resumes its phases.
    #[arg(long, value_name = "FILE", default_value = DEFAULT_STATE_PATH)]
    pub state_file: PathBuf,
    /// The logind drop-in written when InhibitDelayMaxSec must grow to fit the phases.
    #[arg(long, value_name = "FILE", default_value = DEFAULT_DROPIN_PATH)]
    pub logind_dropin: PathBuf,
    /// D-Bus address to use instead of the system bus (also `DBUS_SYSTEM_BUS_ADDRESS`).
    #[arg(long, value_name = "ADDRESS")]
    pub bus_address: Option<String>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    super::init_stderr_logging("info");
    let config = super::load_config(args.config.as_deref(), &Overrides::default())?;
    let phases = phases_from_config(&config.shutdown);
    let boot_id = read_boot_id(&config.paths.proc_root).with_context(|| {
        format!(
            "cannot read this boot's id under procRoot {}",
            config.paths.proc_root.display()
        )
    })?;
    let mut options = ManagerOptions::new(phases, boot_id);
    options.state_path = args.state_file;
    options.logind_dropin_path = args.logind_dropin;
    if let Some(address) = args.bus_address {
        options.bus = BusAddress::Address(address);
    }
    let parent = args.workload_cgroup_parent;
    let terminator = Arc::new(CgroupTerminator::new(&parent));
    let pods_file = args.pods;
    let pods = Arc::new(move || match &pods_file {
        Some(path) => pods_from_path(path).map_err(|e| e.to_string()),
        None => discover_workloads(&parent),
    });
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let (status, _status_rx) = watch::channel(ManagerStatus::default());
        let (stop_tx, stop) = watch::channel(false);
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .context("cannot listen for SIGTERM")?;
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
            let _ = stop_tx.send(true);
        });
        run_shutdown_manager(
            options,
            terminator,
            pods,
            Arc::new(SystemClock),
            status,
            stop,
        )
        .await;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

fn discover_workloads(parent: &std::path::Path) -> Result<Vec<Pod>, String> {
    let list = |dir: &std::path::Path| -> Result<Vec<String>, String> {
        let entries =
            std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        Ok(entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect())
    };
    let mut pods = Vec::new();
    for namespace in list(parent)? {
        for name in list(&parent.join(&namespace))? {
            pods.push(Pod {
                namespace: namespace.clone(),
                name,
                ..Pod::default()
            });
        }
    }
    Ok(pods)
}
