//! `nodekeeper controller`: runs the fence controller against the cluster;
//! `nodekeeper controller status` shows what it sees.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::agent::{LogFormat, init_logging};

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  nodekeeper controller --config config/controller.yaml\n  nodekeeper controller --config /etc/nodekeeper/controller.yaml --kubeconfig ~/.kube/config --metrics-addr 0.0.0.0:9848\n  nodekeeper controller status --config /etc/nodekeeper/controller.yaml\n\nLog verbosity follows RUST_LOG (default: info).",
    args_conflicts_with_subcommands = true
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The ControllerConfiguration (see config/controller.yaml); without one, every
    /// default applies.
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Kubeconfig for the Kubernetes API (default: KUBECONFIG, then the in-cluster
    /// service account).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:9848")]
    pub metrics_addr: String,
    /// How to write log lines to standard error: `text` for people, `json` (one object
    /// per line) for log collectors.
    #[arg(long, value_enum, default_value_t)]
    pub log_format: LogFormat,
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Every watched node's health and fence, and the storm guard's verdict, read from the
    /// cluster (the controller need not run).
    Status(StatusArgs),
}

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  nodekeeper controller status --config /etc/nodekeeper/controller.yaml\n  nodekeeper controller status --kubeconfig ~/.kube/config --output json\n  nodekeeper controller status --controller-url http://127.0.0.1:9848"
)]
pub struct StatusArgs {
    /// The ControllerConfiguration the controller runs with (its node selector and storm
    /// guard settings); without one, the defaults.
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Kubeconfig for the Kubernetes API (default: KUBECONFIG, then the in-cluster
    /// service account).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The controller's metrics address (e.g. http://127.0.0.1:9848 through `kubectl
    /// port-forward`), to show each node's latest agent report from its `/reports`.
    #[arg(long, value_name = "URL")]
    pub controller_url: Option<String>,
    /// How to print the result: `table` for people, `json` for programs.
    #[arg(long, value_enum, default_value = "table")]
    pub output: super::OutputFormat,
}

fn load_policy(
    path: Option<&std::path::Path>,
) -> anyhow::Result<nodekeeper::controller::ControllerPolicy> {
    Ok(match path {
        Some(path) => nodekeeper::controller::policy::load(path)?,
        None => nodekeeper::controller::ControllerPolicy::default(),
    })
}

async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let Some(config) = nodekeeper::kubernetes::client_config(kubeconfig).await? else {
        anyhow::bail!("no cluster to talk to: give --kubeconfig, set KUBECONFIG, or run in a pod");
    };
    // An operator's tool: the controller's own user agent stays the controller's.
    Ok(nodekeeper::kubernetes::build_client(config)?)
}

fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    use nodekeeper::controller::status;
    let policy = load_policy(args.config.as_deref())?;
    super::block_on(async move {
        let client = client(args.kubeconfig.as_deref()).await?;
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
        let fences: kube::Api<nodekeeper::controller::NodeFence> = kube::Api::all(client);
        let params = kube::api::ListParams::default();
        let nodes = nodes.list(&params).await.context("listing the nodes")?;
        let fences = fences.list(&params).await.context(
            "listing the NodeFences (is the CRD installed? nodekeeper crd | kubectl apply -f -)",
        )?;
        let reports = match &args.controller_url {
            Some(url) => Some(nodekeeper::report::sender::fetch_views(url).await?),
            None => None,
        };
        let now = k8s_openapi::jiff::Timestamp::now();
        let report = status::build(
            &nodes.items,
            &fences.items,
            reports.as_deref(),
            &policy,
            now,
        );
        match args.output {
            super::OutputFormat::Table => print!("{}", status::render(&report, now)),
            super::OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(Command::Status(status_args)) = args.command {
        return status(status_args);
    }
    init_logging(args.log_format);
    let policy = load_policy(args.config.as_deref())?;
    if policy.reports.enabled {
        super::raise_open_files_limit("every agent keeps a connection open to the report endpoint");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let Some(config) =
            nodekeeper::kubernetes::client_config(args.kubeconfig.as_deref()).await?
        else {
            anyhow::bail!(
                "no cluster to run against: give --kubeconfig, set KUBECONFIG, or run in a pod"
            );
        };
        let client = nodekeeper::kubernetes::build_client_as(
            config,
            nodekeeper::kubernetes::CONTROLLER_USER_AGENT,
        )?;
        let mut metrics = nodekeeper::controller::metrics::ControllerMetrics::new();
        // The policy allows a leader Service only with reports on.
        if policy.reports.leader_service.is_some() {
            metrics.export_report_service();
        }
        let metrics = Arc::new(metrics);
        let health = Arc::new(nodekeeper::metrics::Health::waiting_for(
            // The controller has no periodic loop to stall; liveness is the process.
            Duration::from_secs(365 * 24 * 3600),
            "waiting for the leader Lease and the first node list\n",
        ));
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = move || {
            let mut stop_rx = stop_rx.clone();
            async move {
                let _ = stop_rx.wait_for(|stop| *stop).await;
            }
        };
        // Reports are taken from the start, also on a replica that does not lead: the
        // Service sends them to the leader (with reports.leaderService, the leader
        // points its EndpointSlice at itself), and a replica that takes over knows the
        // agents within one report interval either way.
        let mut extra_routes = axum::Router::new();
        let mut report_tasks = Vec::new();
        let mut report_hub = None;
        let mut leader_endpoint = None;
        if policy.reports.enabled {
            use nodekeeper::report::{server, tls};
            let identity = match &policy.reports.tls {
                Some(files) => {
                    let identity = tls::ServerIdentity::load(&files.cert_file, &files.key_file)
                        .context("reports.tls: the report endpoint's certificate")?;
                    report_tasks.push(tokio::spawn(tls::watch_identity(
                        identity.clone(),
                        stopped(),
                    )));
                    Some(identity)
                }
                None => {
                    tracing::warn!("reports.tls is not set: agent reports come over plain HTTP, so only their arrival counts; a report's content decides nothing");
                    None
                }
            };
            let hub = Arc::new(nodekeeper::report::ReportHub::new(
                client.clone(),
                &policy.namespace,
                policy.reports.clone(),
                metrics.reports.clone(),
                identity,
            ));
            let address = &policy.reports.address;
            let listener = tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("reports.address {address}: cannot listen"))?;
            let bound = listener.local_addr()?;
            tracing::info!(address = %bound, tls = hub.is_tls(), "serving agent reports on POST /v1/reports");
            if let Some(service) = &policy.reports.leader_service {
                use nodekeeper::controller::report_endpoint::{LeaderEndpoint, PodEnvironment};
                let (ip, name, uid) = (
                    std::env::var("POD_IP").ok(),
                    std::env::var("POD_NAME").ok(),
                    std::env::var("POD_UID").ok(),
                );
                let pod = PodEnvironment {
                    ip: ip.as_deref(),
                    name: name.as_deref(),
                    uid: uid.as_deref(),
                };
                let endpoint =
                    LeaderEndpoint::from_pod_environment(service, &policy.namespace, bound, pod)
                        .map_err(anyhow::Error::msg)?;
                leader_endpoint = Some(endpoint);
            }
            report_tasks.push(tokio::spawn(server::serve(listener, hub.clone(), stopped())));
            report_tasks.push(tokio::spawn(server::publish_census(hub.clone(), stopped())));
            extra_routes = server::views_route(hub.clone());
            report_hub = Some(hub);
        }
        // kdump notifications, like reports, are heard on every replica, so one that takes
        // over already knows the dumps in progress.
        let mut kdump_log = None;
        if let Some(address) = policy.kdump_address {
            use nodekeeper::controller::kdump;
            // Bound at start: a bad or taken address stops the controller with its name.
            let socket = tokio::net::UdpSocket::bind(address)
                .await
                .with_context(|| format!("kdumpAddress {address}: cannot listen"))?;
            tracing::info!(address = %socket.local_addr()?, "listening for kdump notifications (fence_kdump_send)");
            let log = Arc::new(kdump::KdumpLog::new(policy.fence.kdump_silence));
            report_tasks.push(tokio::spawn(kdump::listen(
                socket,
                log.clone(),
                metrics.clone(),
                stopped(),
            )));
            kdump_log = Some(log);
        }
        let listener = tokio::net::TcpListener::bind(&args.metrics_addr)
            .await
            .with_context(|| format!("listening on {} for metrics", args.metrics_addr))?;
        let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
        let server = tokio::spawn(nodekeeper::metrics::serve_with(
            listener,
            metrics.clone(),
            health.clone(),
            extra_routes,
            bound_tx,
            stopped(),
        ));
        if let Ok(address) = bound_rx.await {
            tracing::info!(%address, "serving /metrics, /healthz and /readyz");
        }
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .context("watching for SIGTERM")?;
        let shutdown = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
            tracing::info!("stopping");
        };
        let clock_offset = metrics.clock_offset.clone();
        let result = nodekeeper::controller::run::run(
            client,
            policy,
            report_hub,
            leader_endpoint,
            kdump_log,
            nodekeeper::controller::run::identity(),
            metrics,
            health,
            nodekeeper::controller::clock::steady_clock(clock_offset),
            shutdown,
        )
        .await;
        let _ = stop_tx.send(true);
        let _ = server.await;
        for task in report_tasks {
            let _ = task.await;
        }
        result?;
        Ok(ExitCode::SUCCESS)
    })
}
