use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`replay` is not implemented yet")
}
