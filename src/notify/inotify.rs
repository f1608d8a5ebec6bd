//! Waiting for "this file was modified" on tokio. Works for kernfs files whose changes the
//! kernel announces (`memory.events`, `cgroup.events`) and for regular files, which is
//! how fake PSI and `memory.events` files stand in for the kernel in tests.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::error::NotifyError;
use super::pollable::{OwnsFd, register};

/// `AsyncFd` wants `AsRawFd`; nix's `Inotify` only offers `AsFd`.
struct InotifyFd(Inotify);

impl OwnsFd for InotifyFd {}

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// One watched file. Modifications that happen between two waits are queued by the
/// kernel, so none is missed.
pub struct FileWatch {
    inotify: AsyncFd<InotifyFd>,
    path: PathBuf,
}

impl FileWatch {
    /// Must be called inside a tokio runtime.
    pub fn new(path: &Path) -> Result<Self, NotifyError> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| NotifyError::io(path, "create an inotify instance for", e))?;
        inotify
            .add_watch(
                path,
                AddWatchFlags::IN_MODIFY | AddWatchFlags::IN_DELETE_SELF,
            )
            .map_err(|e| NotifyError::io(path, "watch", e))?;
        let inotify = register(InotifyFd(inotify), Interest::READABLE)
            .map_err(|e| NotifyError::io(path, "register the inotify watch of", e))?;
        Ok(FileWatch {
            inotify,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The inotify instance, readable while a modification waits.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inotify.get_ref().0.as_fd()
    }

    /// Wait until the file was modified at least once since the last call; all queued
    /// events are consumed together.
    pub async fn modified(&mut self) -> Result<(), NotifyError> {
        loop {
            let mut guard = self
                .inotify
                .readable()
                .await
                .map_err(|e| NotifyError::io(&self.path, "wait for inotify events on", e))?;
            match guard.try_io(|fd| fd.get_ref().0.read_events().map_err(std::io::Error::from)) {
                Ok(Ok(events)) => {
                    let gone = events.iter().any(|event| {
                        event
                            .mask
                            .intersects(AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_IGNORED)
                    });
                    if gone {
                        return Err(NotifyError::SourceGone {
                            path: self.path.clone(),
                        });
                    }
                    if events
                        .iter()
                        .any(|event| event.mask.contains(AddWatchFlags::IN_MODIFY))
                    {
                        return Ok(());
                    }
                }
                Ok(Err(e)) => {
                    return Err(NotifyError::io(&self.path, "read inotify events of", e));
                }
                Err(_would_block) => continue,
            }
        }
    }
}
