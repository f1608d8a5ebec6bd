use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`rank` is not implemented yet")
}
