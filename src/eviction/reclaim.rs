//! Node-level reclaim before pod eviction: freeing images and dead containers can end
//! disk pressure without evicting anyone.

use std::process::Stdio;
use std::time::Duration;

use crate::config::FilesystemLayout as FsLayout;
use crate::process::Waited;
use crate::signals::Signal;

/// Frees node-level resources for a starved signal (images, exited containers).
pub trait NodeReclaimer {
    fn reclaim(
        &mut self,
        signal: Signal,
    ) -> impl std::future::Future<Output = Result<(), ReclaimError>> + Send;
}

/// The kubelet's node-level reclaim functions for a signal (`buildSignalToNodeReclaimFuncs`):
/// its container GC (dead containers and sandboxes) and its image GC (unused images),
/// each run where what it frees lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReclaimFunctions {
    pub containers: bool,
    pub images: bool,
}

impl ReclaimFunctions {
    pub fn any(self) -> bool {
        self.containers || self.images
    }
}

/// Which reclaim functions the kubelet runs for `signal` on this layout:
///
/// | layout | nodefs | imagefs | containerfs |
/// |---|---|---|---|
/// | one filesystem | containers, images | containers, images | containers, images |
/// | imagefs holding the containers | none | containers, images | containers, images |
/// | split imagefs and containerfs | containers | images | containers |
///
/// Memory and PIDs have none.
pub fn reclaim_functions(signal: Signal, layout: FsLayout) -> ReclaimFunctions {
    let both = ReclaimFunctions {
        containers: true,
        images: true,
    };
    let containers = ReclaimFunctions {
        containers: true,
        images: false,
    };
    let images = ReclaimFunctions {
        containers: false,
        images: true,
    };
    let none = ReclaimFunctions::default();
    match (signal, layout) {
        (
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable | Signal::PidAvailable,
            _,
        ) => none,
        (_, FsLayout::SingleDisk) => both,
        (Signal::NodeFsAvailable | Signal::NodeFsInodesFree, FsLayout::ImageFs) => none,
        (_, FsLayout::ImageFs) => both,
        (Signal::ImageFsAvailable | Signal::ImageFsInodesFree, FsLayout::SplitImageFs) => images,
        (_, FsLayout::SplitImageFs) => containers,
    }
}

/// Whether the kubelet has node-level reclaim functions for `signal` on this layout.
pub(super) fn reclaim_applies(signal: Signal, layout: FsLayout) -> bool {
    reclaim_functions(signal, layout).any()
}

/// One external command, e.g. `crictl rmi --prune`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimCommand {
    pub program: String,
    pub args: Vec<String>,
}

impl ReclaimCommand {
    /// Split a command line on whitespace; no shell quoting is interpreted.
    pub fn from_command_line(line: &str) -> Option<ReclaimCommand> {
        let mut words = line.split_whitespace().map(str::to_string);
        let program = words.next()?;
        Some(ReclaimCommand {
            program,
            args: words.collect(),
        })
    }
}

impl std::fmt::Display for ReclaimCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.program)?;
        for arg in &self.args {
            write!(f, " {arg}")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CommandFailure {
    #[error("`{command}` could not start: {error}")]
    Spawn {
        command: String,
        error: std::io::Error,
    },
    #[error("`{command}` exited with {status}")]
    Exit { command: String, status: String },
    #[error("`{command}` did not finish within {timeout:?} and was killed")]
    TimedOut { command: String, timeout: Duration },
}

/// One part of a reclaim that failed; the others still ran.
#[derive(Debug, thiserror::Error)]
pub enum ReclaimFailure {
    #[error(transparent)]
    Command(#[from] CommandFailure),
    /// A call to the container runtime, or a removal it refused.
    #[error("{0}")]
    Runtime(String),
}

#[derive(Debug, thiserror::Error)]
#[error("node-level reclaim for {signal} failed: {}", list(.failures))]
pub struct ReclaimError {
    pub signal: Signal,
    pub failures: Vec<ReclaimFailure>,
}

fn list(failures: &[ReclaimFailure]) -> String {
    failures
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Runs the configured commands in order, each under a timeout. A failing command
/// does not stop the next one, as in the kubelet; all failures are reported together.
#[derive(Debug, Clone)]
pub struct CommandReclaimer {
    commands: Vec<ReclaimCommand>,
    timeout: Duration,
}

impl CommandReclaimer {
    pub fn new(commands: Vec<ReclaimCommand>, timeout: Duration) -> Self {
        CommandReclaimer { commands, timeout }
    }

    /// With no commands the reclaim step is skipped entirely.
    pub fn is_configured(&self) -> bool {
        !self.commands.is_empty()
    }

    /// Run one command in its own process group, waiting asynchronously; past the
    /// timeout the whole group is killed, so a shell's children cannot linger.
    async fn run(&self, command: &ReclaimCommand) -> Result<(), CommandFailure> {
        let name = command.to_string();
        let mut child = crate::process::in_own_group(
            tokio::process::Command::new(&command.program)
                .args(&command.args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .spawn()
        .map_err(|error| CommandFailure::Spawn {
            command: name.clone(),
            error,
        })?;
        match crate::process::wait_or_kill_group(&mut child, self.timeout).await {
            Ok(Waited::Exited(status)) if status.success() => Ok(()),
            Ok(Waited::Exited(status)) => Err(CommandFailure::Exit {
                command: name,
                status: status.to_string(),
            }),
            Ok(Waited::TimedOut) => Err(CommandFailure::TimedOut {
                command: name,
                timeout: self.timeout,
            }),
            Err(error) => Err(CommandFailure::Spawn {
                command: name,
                error,
            }),
        }
    }
}

impl NodeReclaimer for CommandReclaimer {
    async fn reclaim(&mut self, signal: Signal) -> Result<(), ReclaimError> {
        let mut failures = Vec::new();
        for command in &self.commands {
            if let Err(failure) = self.run(command).await {
                failures.push(failure.into());
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(ReclaimError { signal, failures })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reclaimer(lines: &[&str], timeout: Duration) -> CommandReclaimer {
        CommandReclaimer::new(
            lines
                .iter()
                .filter_map(|line| ReclaimCommand::from_command_line(line))
                .collect(),
            timeout,
        )
    }

    #[tokio::test]
    async fn succeeds_when_every_command_succeeds() {
        let mut r = reclaimer(&["true", "sh -c exit"], Duration::from_secs(10));
        assert!(r.is_configured());
        r.reclaim(Signal::NodeFsAvailable).await.unwrap();
    }

    #[tokio::test]
    async fn runs_every_command_and_reports_each_failure() {
        let mut r = reclaimer(
            &["false", "true", "/nonexistent/nodekeeper-reclaim"],
            Duration::from_secs(10),
        );
        let error = r.reclaim(Signal::ImageFsAvailable).await.unwrap_err();
        assert_eq!(error.failures.len(), 2);
        let text = error.to_string();
        assert!(
            text.starts_with("node-level reclaim for imagefs.available failed"),
            "{text}"
        );
        assert!(text.contains("`false` exited with"), "{text}");
        assert!(
            text.contains("/nonexistent/nodekeeper-reclaim` could not start"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_command_past_its_timeout_is_killed_with_its_children() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("grandchild.pid");
        let script = dir.path().join("reclaim.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nsleep 30 &\necho $! > {}\nwait\n",
                pid_file.display()
            ),
        )
        .unwrap();
        // Run through `sh`: executing a file just written races other tests' forks
        // (ETXTBSY).
        let line = format!("sh {}", script.display());
        let mut r = reclaimer(&[line.as_str()], Duration::from_millis(300));
        let started = std::time::Instant::now();
        let error = r.reclaim(Signal::NodeFsAvailable).await.unwrap_err();
        assert!(
            matches!(
                error.failures[..],
                [ReclaimFailure::Command(CommandFailure::TimedOut { .. })]
            ),
            "{error}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not killed in time"
        );
        let grandchild: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let gone = || {
            std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
                .map_or(true, |stat| stat.contains(") Z "))
        };
        for _ in 0..200 {
            if gone() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the command's child {grandchild} outlived the timeout");
    }

    #[test]
    fn no_commands_means_not_configured() {
        assert!(!reclaimer(&[], Duration::from_secs(1)).is_configured());
    }

    // helpers.go `buildSignalToNodeReclaimFuncs`: single disk, every disk signal runs
    // both; imagefs holding the containers, nodefs none and imagefs (and containerfs,
    // the same filesystem) both; split, nodefs and containerfs the container GC and
    // imagefs the image GC.
    #[test]
    fn reclaim_functions_per_layout_follow_the_kubelet() {
        use FsLayout::*;
        use Signal::*;
        let f = |containers, images| ReclaimFunctions { containers, images };
        for (signal, layout, expected) in [
            (NodeFsAvailable, SingleDisk, f(true, true)),
            (ImageFsInodesFree, SingleDisk, f(true, true)),
            (ContainerFsAvailable, SingleDisk, f(true, true)),
            (NodeFsAvailable, ImageFs, f(false, false)),
            (NodeFsInodesFree, ImageFs, f(false, false)),
            (ImageFsAvailable, ImageFs, f(true, true)),
            (ContainerFsInodesFree, ImageFs, f(true, true)),
            (NodeFsAvailable, SplitImageFs, f(true, false)),
            (ImageFsAvailable, SplitImageFs, f(false, true)),
            (ImageFsInodesFree, SplitImageFs, f(false, true)),
            (ContainerFsAvailable, SplitImageFs, f(true, false)),
            (MemoryAvailable, SingleDisk, f(false, false)),
            (PidAvailable, SplitImageFs, f(false, false)),
        ] {
            assert_eq!(
                reclaim_functions(signal, layout),
                expected,
                "{signal} {layout:?}"
            );
        }
    }

    #[test]
    fn reclaim_applies_per_layout() {
        use FsLayout::*;
        use Signal::*;
        for (signal, layout, expected) in [
            (MemoryAvailable, SingleDisk, false),
            (PidAvailable, SingleDisk, false),
            (NodeFsAvailable, SingleDisk, true),
            (NodeFsAvailable, ImageFs, false),
            (NodeFsAvailable, SplitImageFs, true),
            (ImageFsInodesFree, ImageFs, true),
            (ContainerFsAvailable, ImageFs, true),
            (ImageFsAvailable, SplitImageFs, true),
        ] {
            assert_eq!(
                reclaim_applies(signal, layout),
                expected,
                "{signal} {layout:?}"
            );
        }
    }
}
