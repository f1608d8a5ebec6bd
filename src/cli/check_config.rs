use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use nodekeeper::config;

use super::EvictionFlags;

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  nodekeeper check-config config/agent.yaml\n  nodekeeper check-config /var/lib/kubelet/config.yaml\n  nodekeeper check-config config/agent.yaml --eviction-hard='memory.available<1Gi'"
)]
pub struct Args {
    /// Configuration file: a KubeletConfiguration, an AgentConfiguration, or both.
    pub file: PathBuf,
    #[command(flatten)]
    pub eviction: EvictionFlags,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
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
