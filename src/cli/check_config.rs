use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use nodekeeper::config;

use super::EvictionFlags;

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  nodekeeper check-config config/agent.yaml\n  nodekeeper check-config /var/lib/kubelet/config.yaml\n  nodekeeper check-config --strict /var/lib/kubelet/config.yaml\n  nodekeeper check-config config/controller.yaml\n  nodekeeper check-config config/agent.yaml --eviction-hard='memory.available<1Gi'"
)]
pub struct Args {
    /// Configuration file: a KubeletConfiguration, an AgentConfiguration, or both; or a
    /// ControllerConfiguration (recognised by its kind).
    #[arg(value_name = "FILE", required_unless_present = "config")]
    pub file: Option<PathBuf>,
    /// The configuration file, given the way the other commands take it (instead of FILE).
    #[arg(long, short, value_name = "FILE", conflicts_with = "file")]
    pub config: Option<PathBuf>,
    /// Refuse an agent configuration that draws warnings: values the kubelet accepts
    /// but that are surely mistakes (a negative evictionMaxPodGracePeriod, an
    /// evictionMinimumReclaim above 100%, a priority listed twice, ...).
    #[arg(long)]
    pub strict: bool,
    #[command(flatten)]
    pub eviction: EvictionFlags,
}

impl Args {
    fn file(&self) -> &Path {
        // clap requires one of the two.
        self.file
            .as_deref()
            .or(self.config.as_deref())
            .unwrap_or(Path::new(""))
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let file = args.file();
    // Read once: the file may be a pipe (`-c <(...)`, `-c /dev/stdin`), which a second
    // read would find empty, showing the defaults as if they were its contents.
    let text = config::read_file(file)?;
    if nodekeeper::controller::policy::is_controller_configuration(&text) {
        return check_controller(&args, &text);
    }
    let loaded = config::from_yaml_str_with_warnings(
        &text,
        &file.display().to_string(),
        &args.eviction.overrides(),
    )?;
    if args.strict && !loaded.warnings.is_empty() {
        anyhow::bail!(
            "{} refused by --strict; the agent would start with it, but:\n  {}",
            file.display(),
            loaded.warnings.join("\n  ")
        );
    }
    super::print_warnings(&loaded.warnings);
    let yaml = serde_yaml_ng::to_string(&loaded.effective_document)
        .context("rendering the effective configuration")?;
    println!(
        "# Effective configuration of {}, defaults filled in.",
        file.display()
    );
    print!("{yaml}");
    let unset = config::unset_settings(&loaded.config);
    if !unset.is_empty() {
        println!("# Not set, so:");
        for (field, meaning) in unset {
            println!("#   {field}: {meaning}");
        }
    }
    println!(
        "# Thresholds in force (derived ones included), for {} as the paths tell it; the agent",
        loaded.config.paths.fs_layout().describe()
    );
    println!(
        "# compares the paths' devices at start, as the kubelet does (`nodekeeper signals` shows the result):"
    );
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
    let origin = args.file().display().to_string();
    let policy = nodekeeper::controller::policy::parse(text, &origin)?;
    let yaml = serde_yaml_ng::to_string(&policy.effective_document())
        .context("rendering the effective configuration")?;
    println!("# Effective controller configuration of {origin}, defaults filled in.");
    print!("{yaml}");
    Ok(ExitCode::SUCCESS)
}
