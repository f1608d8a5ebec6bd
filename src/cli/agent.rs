use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use nodekeeper::agent::Recorder;
use nodekeeper::config::{self, Overrides};
use nodekeeper::shutdown::manager::STORED_LOCK_PREFIX;
use nodekeeper::systemd::notify::ServiceManagerLink;

use super::EvictionFlags;

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One line per event, for people.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  nodekeeper agent --config config/agent.yaml\n  nodekeeper agent --config /var/lib/kubelet/config.yaml --dry-run\n  nodekeeper agent --config config/agent.yaml --record /var/log/nodekeeper/trace.yaml\n  nodekeeper agent --config /etc/nodekeeper/agent.yaml --eviction-hard='memory.available<1Gi' --metrics-addr 0.0.0.0:9847\n\nLog verbosity follows RUST_LOG (default: info)."
)]
pub struct Args {
    /// Configuration file (KubeletConfiguration and/or AgentConfiguration); built-in
    /// defaults when omitted.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// This node's name (default: the NODE_NAME variable, then the hostname).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Decide and report, but evict nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Kubeconfig for the Kubernetes API (default: `kubernetes.kubeconfig`, then
    /// KUBECONFIG, then the in-cluster service account; none of them: standalone).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Address for /metrics, /healthz and /readyz, e.g. 127.0.0.1:9847.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    /// How to write log lines to standard error: `text` for people, `json` (one object
    /// per line) for log collectors.
    #[arg(long, value_enum, default_value_t)]
    pub log_format: LogFormat,
    /// Append every observation to this trace file, for `nodekeeper replay` later.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Rotate the trace file (to FILE.1) when it reaches this many bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 20)]
    pub record_max_bytes: u64,
    #[command(flatten)]
    pub eviction: EvictionFlags,
}

pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(super::colored_logs());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    init_logging(args.log_format);
    // First, while the process is one thread: what systemd passed (the notification
    // socket, the watchdog, a delay lock kept from the agent's previous run).
    let service = Arc::new(ServiceManagerLink::from_environment());
    let result = run_agent(args, service.clone());
    if result.is_err() {
        // An agent that cannot start cannot drain: a lock its previous run kept must not
        // hold the node's shutdown up while systemd restarts it again and again.
        service.discard_passed(STORED_LOCK_PREFIX);
    }
    result
}

fn run_agent(args: Args, service: Arc<ServiceManagerLink>) -> anyhow::Result<ExitCode> {
    let overrides = Overrides {
        node_name: args.node_name.clone(),
        dry_run: args.dry_run.then_some(true),
        metrics_address: args.metrics_addr.clone(),
        ..args.eviction.overrides()
    };
    let mut loaded = config::load_with_warnings(args.config.as_deref(), &overrides)?;
    for warning in &loaded.warnings {
        tracing::warn!("{warning}");
    }
    if loaded.config.report.is_some() && loaded.config.node_name.is_none() {
        // Reports name their node, found the way the API connection finds it. Reporting
        // is best-effort: without a name the agent protects its node all the same.
        match nodekeeper::kubernetes::node_name(&loaded.config) {
            Ok(node) => loaded.config.node_name = Some(node),
            Err(error) => {
                tracing::error!(%error, "report: cannot tell which node this is; not reporting")
            }
        }
    }
    // Before the decision cycle thread starts: it keeps up to a quarter of the soft limit
    // of pod cgroup files open between cycles, and systemd's default of 1024 would hold
    // the files of fewer than a hundred pods.
    super::raise_open_files_limit("the decision cycle keeps the pods' cgroup files open");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        // Both signals are watched from here on, before anything starts: a SIGTERM while
        // the agent is still starting (a stop right after a start) ends it cleanly too,
        // instead of by the signal's default action.
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate())
            .map_err(|error| tracing::error!(%error, "cannot watch SIGTERM; stop with SIGINT"))
            .ok();
        let mut interrupt = signal(SignalKind::interrupt())
            .map_err(|error| tracing::error!(%error, "cannot watch SIGINT"))
            .ok();
        let shutdown = async move {
            tokio::select! {
                () = next_signal(&mut terminate) => tracing::info!("SIGTERM received"),
                () = next_signal(&mut interrupt) => tracing::info!("SIGINT received"),
            }
        };
        // The one look at the host: its cgroup layout and boot id, shared by the pod
        // usage reader, the collector, the notifiers, the shutdown manager and the reports.
        let host = nodekeeper::signals::Host::detect(&loaded.config.paths);
        let kube =
            nodekeeper::kubernetes::connect(&loaded.config, &host, args.kubeconfig.as_deref())
                .await
                .context("connecting to the Kubernetes API")?;
        match &kube {
            Some(runtime) => tracing::info!(
                node = runtime.node_name(),
                "evicting through the Kubernetes API"
            ),
            None => tracing::info!("no Kubernetes API configured: standalone mode"),
        }
        // The kubelet measures allocatableMemory.available on its pods cgroup; with the
        // API the agent knows that cgroup too, so podsCgroup need not repeat it.
        let pods_cgroup = kube.as_ref().and_then(|runtime| runtime.pods_cgroup());
        let host = match pods_cgroup {
            Some(pods) if loaded.config.paths.pods_cgroup.is_none() => {
                tracing::info!(pods_cgroup = %pods.display(), "allocatableMemory.available is measured on the pods cgroup");
                loaded.config.paths.pods_cgroup = Some(pods.clone());
                host.with_pods_cgroup(pods)
            }
            None if kube.is_some() && loaded.config.paths.pods_cgroup.is_none() => {
                tracing::warn!(
                    pods_cgroup_name = %loaded.config.kubernetes.pods_cgroup_name,
                    "the kubelet's pods cgroup was not found at start; allocatableMemory.available is not observed until the agent restarts (podsCgroup names it explicitly)"
                );
                host
            }
            _ => host,
        };
        let record = args
            .record
            .clone()
            .map(|path| Recorder::new(path, args.record_max_bytes));
        let kube_shutdown = kube.as_ref().map(|runtime| runtime.shutdown_hooks());
        let customize = move |agent: &mut nodekeeper::agent::Agent| {
            if let Some(recorder) = record {
                agent.set_recorder(recorder);
            }
            if let Some(runtime) = kube {
                let cgroup_root = agent.config().paths.cgroup_root.clone();
                agent.integrate(runtime.integration(agent.metrics(), &cgroup_root));
            }
        };
        nodekeeper::agent::run(
            loaded.config,
            host,
            kube_shutdown,
            service,
            shutdown,
            customize,
            |handles| {
                tokio::spawn(async move {
                    if let Ok(address) = handles.metrics_bound.await {
                        tracing::info!(%address, "serving /metrics, /healthz and /readyz");
                    }
                });
            },
        )
        .await
        .map_err(anyhow::Error::from)
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The next delivery of `signal`; never, for a signal that could not be watched.
async fn next_signal(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}
