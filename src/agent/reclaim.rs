//! The agent's node-level reclaim: through the container runtime (the default, as the
//! kubelet does it) or the operator's commands. In a dry run nothing is removed and no
//! command runs: the runtime's plan is logged, and pods are (would be) evicted as if
//! reclaim had freed nothing.

use crate::config::{FilesystemLayout, NodeReclaimConfig, ReclaimMethod};
use crate::cri::CriReclaimer;
use crate::cri::gc::PodsKnown;
use crate::eviction::{CommandReclaimer, NodeReclaimer, ReclaimCommand, ReclaimError};
use crate::signals::Signal;

pub enum Reclaimer {
    /// The commands, and whether this is a dry run (then they do not run).
    Commands(CommandReclaimer, bool),
    /// The runtime reclaimer knows the dry run itself.
    Runtime(Box<CriReclaimer>),
}

impl Reclaimer {
    /// The configured reclaimer; none when reclaim is off.
    pub fn from_config(
        config: &NodeReclaimConfig,
        layout: FilesystemLayout,
        dry_run: bool,
    ) -> Option<Reclaimer> {
        match config.method {
            ReclaimMethod::None => None,
            ReclaimMethod::Commands => {
                let commands: Vec<ReclaimCommand> = config
                    .commands
                    .iter()
                    .filter_map(|line| ReclaimCommand::from_command_line(line))
                    .collect();
                (!commands.is_empty()).then(|| {
                    let reclaimer = CommandReclaimer::new(commands, config.timeout.to_std());
                    Reclaimer::Commands(reclaimer, dry_run)
                })
            }
            ReclaimMethod::Cri => match CriReclaimer::new(config, layout, dry_run) {
                Ok(reclaimer) => {
                    tracing::info!(
                        runtime = %config.runtime_endpoint,
                        images = %config.image_endpoint,
                        "node-level reclaim through the container runtime (containerRuntimeEndpoint)"
                    );
                    Some(Reclaimer::Runtime(Box::new(reclaimer)))
                }
                Err(error) => {
                    // The loader checked the endpoints; this cannot happen with a config
                    // it built, and evicting without reclaim is the safe side.
                    tracing::error!(%error, "node-level reclaim is off");
                    None
                }
            },
        }
    }

    /// The runtime reclaimer, to track images in the background.
    pub fn runtime(&self) -> Option<&CriReclaimer> {
        match self {
            Reclaimer::Runtime(reclaimer) => Some(reclaimer),
            Reclaimer::Commands(..) => None,
        }
    }

    pub async fn reclaim(&mut self, signal: Signal, pods: PodsKnown) -> Result<(), ReclaimError> {
        match self {
            Reclaimer::Commands(_, true) => {
                tracing::warn!(%signal, "dry run: would run the node-level reclaim commands");
                Ok(())
            }
            Reclaimer::Commands(commands, false) => commands.reclaim(signal).await,
            Reclaimer::Runtime(runtime) => {
                runtime.set_pods(pods);
                runtime.reclaim(signal).await
            }
        }
    }
}
