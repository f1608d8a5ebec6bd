//! PSI triggers: ask the kernel to signal `POLLPRI` when memory stalls exceed a budget
//! within a window, on `/proc/pressure/memory` or a v2 cgroup's `memory.pressure`.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::error::NotifyError;
use super::inotify::FileWatch;
use super::pollable::register;
use crate::signals::PressureKind;

/// The kernel accepts windows from 500 ms to 10 s.
const MIN_WINDOW: Duration = Duration::from_millis(500);
const MAX_WINDOW: Duration = Duration::from_secs(10);

/// `<some|full> <stall µs> <window µs>`: fire when tasks stalled for `stall` within any
/// `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PsiTriggerSpec {
    pub kind: PressureKind,
    pub stall: Duration,
    pub window: Duration,
}

impl Default for PsiTriggerSpec {
    /// systemd's default memory pressure watch: 100 ms of partial stall per second.
    fn default() -> Self {
        PsiTriggerSpec {
            kind: PressureKind::Some,
            stall: Duration::from_millis(100),
            window: Duration::from_secs(1),
        }
    }
}

impl PsiTriggerSpec {
    /// Check the limits the kernel enforces, so a bad configuration fails with a reason
    /// instead of a bare EINVAL.
    pub fn validate(&self) -> Result<(), NotifyError> {
        let invalid = |reason: String| NotifyError::InvalidTrigger {
            trigger: self.to_string(),
            reason,
        };
        if self.window < MIN_WINDOW || self.window > MAX_WINDOW {
            return Err(invalid(format!(
                "the window must be between {MIN_WINDOW:?} and {MAX_WINDOW:?}"
            )));
        }
        if self.stall.is_zero() || self.stall > self.window {
            return Err(invalid(
                "the stall must be positive and no longer than the window".to_string(),
            ));
        }
        Ok(())
    }

    /// The bytes to write. The kernel overwrites the last byte written with a NUL before
    /// parsing, so the text must carry its own terminator or lose its last digit.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = self.to_string().into_bytes();
        bytes.push(0);
        bytes
    }
}

impl fmt::Display for PsiTriggerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {}",
            self.kind,
            self.stall.as_micros(),
            self.window.as_micros()
        )
    }
}

/// How a trigger learns that it fired. The kernel signals `POLLPRI` on the trigger's file
/// descriptor; regular files cannot be polled that way, so tests use file modification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PsiReadiness {
    #[default]
    PollPriority,
    FileModified,
}

enum Waiter {
    Priority(AsyncFd<File>),
    Modified { _file: File, watch: FileWatch },
}

/// One armed trigger. Closing it (dropping) removes the trigger from the kernel; each
/// trigger needs its own open file.
pub struct PsiTrigger {
    waiter: Waiter,
    path: PathBuf,
    spec: PsiTriggerSpec,
}

impl PsiTrigger {
    /// Write `spec` to `path` and start waiting for it. Must be called inside a tokio
    /// runtime.
    pub fn arm(
        path: &Path,
        spec: PsiTriggerSpec,
        readiness: PsiReadiness,
    ) -> Result<Self, NotifyError> {
        spec.validate()?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| NotifyError::io(path, "open", e))?;
        file.write_all(&spec.to_bytes())
            .map_err(|e| NotifyError::io(path, "write a PSI trigger to", e))?;
        let waiter = match readiness {
            PsiReadiness::PollPriority => Waiter::Priority(
                register(file, Interest::PRIORITY).map_err(|e| NotifyError::io(path, "poll", e))?,
            ),
            PsiReadiness::FileModified => Waiter::Modified {
                _file: file,
                watch: FileWatch::new(path)?,
            },
        };
        Ok(PsiTrigger {
            waiter,
            path: path.to_path_buf(),
            spec,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn spec(&self) -> PsiTriggerSpec {
        self.spec
    }

    /// Wait until the trigger fires. The kernel rate-limits a trigger to one event per
    /// window, so this never spins.
    pub async fn fired(&mut self) -> Result<(), NotifyError> {
        match &mut self.waiter {
            Waiter::Priority(fd) => {
                let mut guard = fd
                    .ready(Interest::PRIORITY)
                    .await
                    .map_err(|e| NotifyError::io(&self.path, "wait for POLLPRI on", e))?;
                if guard.ready().is_error() {
                    return Err(NotifyError::SourceGone {
                        path: self.path.clone(),
                    });
                }
                guard.clear_ready();
                Ok(())
            }
            Waiter::Modified { watch, .. } => watch.modified().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trigger_text_is_kind_stall_and_window_in_microseconds_nul_terminated() {
        let spec = PsiTriggerSpec {
            kind: PressureKind::Full,
            stall: Duration::from_millis(150),
            window: Duration::from_secs(1),
        };
        assert_eq!(spec.to_string(), "full 150000 1000000");
        assert_eq!(spec.to_bytes(), b"full 150000 1000000\0");
        assert_eq!(PsiTriggerSpec::default().to_string(), "some 100000 1000000");
    }

    #[test]
    fn windows_outside_the_kernel_range_and_oversized_stalls_are_rejected() {
        let spec = |stall_ms, window_ms| PsiTriggerSpec {
            kind: PressureKind::Some,
            stall: Duration::from_millis(stall_ms),
            window: Duration::from_millis(window_ms),
        };
        assert!(spec(100, 500).validate().is_ok());
        assert!(spec(100, 10_000).validate().is_ok());
        let short = spec(100, 499).validate().unwrap_err().to_string();
        assert!(short.contains("some 100000 499000"), "{short}");
        assert!(short.contains("window"), "{short}");
        assert!(spec(100, 10_001).validate().is_err());
        assert!(spec(0, 1000).validate().is_err());
        assert!(spec(1001, 1000).validate().is_err());
    }
}
