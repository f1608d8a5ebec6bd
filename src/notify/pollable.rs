//! Registering owned file descriptors with the tokio reactor.

use std::os::fd::AsRawFd;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Marks types that own the descriptor they expose, so it stays open and unchanged for
/// as long as the value lives, which is what `AsyncFd::register` requires.
pub(crate) trait OwnsFd: AsRawFd {}

impl OwnsFd for std::fs::File {}
impl OwnsFd for nix::sys::eventfd::EventFd {}

/// Register `inner` for `interest`. Must be called inside a tokio runtime.
pub(crate) fn register<T: OwnsFd>(inner: T, interest: Interest) -> std::io::Result<AsyncFd<T>> {
    // SAFETY: `OwnsFd` types own their descriptor; the `AsyncFd` owns the value, so the
    // descriptor is open and refers to the same file until the `AsyncFd` is dropped.
    unsafe { AsyncFd::register_with_interest(inner, interest) }.map_err(std::io::Error::from)
}
