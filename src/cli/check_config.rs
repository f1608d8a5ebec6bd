use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use nodekeeper::config;

use super::EvictionFlags;

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  nodekeeper check-config config/agent.yaml\n  nodekeeper check-config /var/lib/kubelet/config.yaml\n  nodekeeper check-config config/controller.yaml\n  nodekeeper check-config config/agent.yaml --eviction-hard='memory.available<1Gi'"
)]
pub struct Args {
    /// Configuration file: a KubeletConfiguration, an AgentConfiguration, or both; or a
    /// ControllerConfiguration (recognised by its kind).
    pub file: PathBuf,
    #[command(flatten)]
    pub eviction: EvictionFlags,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Ok(text) = std::fs::read_to_string(&args.file)
        && nodekeeper::controller::policy::is_controller_configuration(&text)
    {
        return check_controller(&args, &text);
    }
    let loaded = config::load_with_warnings(Some(&args.file), &args.eviction.overrides())?;
    for warning in &loaded.warnings {
        eprintln!("warning: {warning}");
    }
    let yaml = serde_yaml_ng::to_string(&loaded.effective_document)
        .context("rendering the effective configuration")?;
    println!(
        "# Effective configuration of {}, defaults filled in.",
        args.file.display()
    );
    print!("{yaml}");
    println!("# Thresholds in force (derived ones included):");
    for threshold in &loaded.config.eviction.thresholds {
        let kind = if threshold.is_hard() {
            "hard".to_string()
        } else {
            format!("soft, grace {}", threshold.grace_period)
        };
        let reclaim = threshold
            .min_reclaim
            .map(|r| format!(", minimum reclaim {r}"))
            .unwrap_or_default();
        println!("#   {} ({kind}{reclaim})", threshold.describe());
    }
    Ok(ExitCode::SUCCESS)
}

/// `check-config` of a `ControllerConfiguration`: every error at once, else the
/// effective settings.
fn check_controller(args: &Args, text: &str) -> anyhow::Result<ExitCode> {
    if args.eviction.overrides() != nodekeeper::config::Overrides::default() {
        anyhow::bail!(
            "the eviction flags apply to agent configurations, not to a ControllerConfiguration"
        );
    }
    let origin = args.file.display().to_string();
    let policy = nodekeeper::controller::policy::parse(text, &origin)?;
    let yaml = serde_yaml_ng::to_string(&policy.effective_document())
        .context("rendering the effective configuration")?;
    println!("# Effective controller configuration of {origin}, defaults filled in.");
    print!("{yaml}");
    Ok(ExitCode::SUCCESS)
}
