//! `nodekeeper crd`: prints the NodeFence CustomResourceDefinition generated from the
//! Rust types, for `kubectl apply -f -` (packaging/kubernetes/controller/crd.yaml is
//! this output, kept equal by a test).

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;

#[derive(clap::Args, Debug)]
#[command(after_help = "Example:\n  nodekeeper crd | kubectl apply -f -")]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    let yaml = nodekeeper::controller::resource::crd_yaml()
        .context("rendering the NodeFence CustomResourceDefinition")?;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(yaml.as_bytes())
        .context("writing to standard output")?;
    Ok(ExitCode::SUCCESS)
}
