//! `nodekeeper completions SHELL`: the shell completion script for the whole command line,
//! generated from its clap definition (the Debian package installs the bash, zsh and fish
//! ones; `scripts/package-deb` writes them).

use std::process::ExitCode;

use anyhow::Context;

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    nodekeeper completions bash > /etc/bash_completion.d/nodekeeper\n  \
    nodekeeper completions zsh > \"${fpath[1]}/_nodekeeper\"\n  \
    nodekeeper completions fish > ~/.config/fish/completions/nodekeeper.fish")]
pub struct Args {
    /// The shell to complete in.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Writes the script for `command` (the binary's whole definition) to standard output.
pub fn run(args: Args, mut command: clap::Command) -> anyhow::Result<ExitCode> {
    let name = command.get_name().to_string();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, name, &mut script);
    std::io::Write::write_all(&mut std::io::stdout().lock(), &script)
        .context("writing to standard output")?;
    Ok(ExitCode::SUCCESS)
}
