//! `nodekeeper manpages DIR`: manual pages (roff, section 1) for the binary and each of its
//! commands, generated from the clap definition so they never disagree with `--help`
//! (`nodekeeper.1`, `nodekeeper-agent.1`, `nodekeeper-controller-status.1`, ...). The Debian
//! package ships them; `scripts/package-deb` writes them.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Example:\n  nodekeeper manpages /usr/local/share/man/man1 && man nodekeeper-agent"
)]
pub struct Args {
    /// Directory to write the pages into (created if missing); existing pages of the same
    /// names are replaced.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

/// The manual all pages belong to (the centre of a page's footer line).
const MANUAL: &str = "nodekeeper manual";

pub fn run(args: Args, command: clap::Command) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    // Built once so that each subcommand knows its full name (`nodekeeper-agent`) and
    // inherits the version; no `help` pseudo-command gets a page.
    let mut command = command.disable_help_subcommand(true);
    command.build();
    // The footer's left side, on every page (clap gives only the top command a version).
    let source = format!(
        "{} {}",
        command.get_name(),
        command.get_version().unwrap_or_default()
    );
    for page in write_pages(&command, &source, &args.dir)? {
        println!("{}", page.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes the page of `command` and of every command under it that `--help` lists (hidden
/// ones get none); returns the files written.
fn write_pages(command: &clap::Command, source: &str, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let page = clap_mangen::Man::new(command.clone())
        .manual(MANUAL)
        .source(source);
    let path = page
        .generate_to(dir)
        .with_context(|| format!("writing {}", dir.join(page.get_filename()).display()))?;
    let mut written = vec![path];
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        written.extend(write_pages(sub, source, dir)?);
    }
    Ok(written)
}
