//! Whether a kernel notification waits unread, asked while the decision cycle's thread is
//! busy reading pods and its notifiers' tasks cannot run (they run on that thread).
//!
//! One epoll instance of our own holds the notifiers' descriptors, level-triggered, beside
//! the tokio driver's own registration of each: asking it is one `epoll_wait` that does
//! not block, and it leaves the notification to its reader. An eventfd (a memcg
//! threshold) and an inotify instance (`memory.events`) stay readable until read.
//!
//! Only what would start a cycle counts: a memcg threshold's eventfd that is readable, and
//! a `memory.events` whose pressure counters moved past what its watch last saw (the
//! file also changes for counters the watch skips). A trigger replaced is retired at
//! once: the kernel drops its registration here only when the task that owns it has
//! closed it, which may come later. A PSI trigger is not added: the kernel clears its
//! event when it answers a poll, so asking would take the notification from the task that
//! wakes the cycle.

use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

use super::events::{MemoryEventCounts, read_counts};
use crate::signals::NotificationsWaiting;

/// The descriptors of the notifiers whose readiness can be asked without taking it.
pub struct WaitingNotifications {
    epoll: Epoll,
    asked: Mutex<Asked>,
}

/// Names one descriptor added, to retire it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AskedKey(u64);

#[derive(Default)]
struct Asked {
    next: u64,
    live: HashMap<u64, Kind>,
}

enum Kind {
    /// Readable means a crossing waits.
    Eventfd,
    /// Readable means the file changed; a crossing waits if its pressure counters moved
    /// past `seen`, the counts its watch last read.
    MemoryEvents {
        path: PathBuf,
        seen: Arc<Mutex<MemoryEventCounts>>,
    },
}

impl WaitingNotifications {
    pub fn new() -> std::io::Result<WaitingNotifications> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        Ok(WaitingNotifications {
            epoll,
            asked: Mutex::new(Asked::default()),
        })
    }

    /// Ask a memcg threshold's eventfd from now on.
    pub fn add_eventfd(&self, fd: BorrowedFd<'_>) -> std::io::Result<AskedKey> {
        self.add(fd, Kind::Eventfd)
    }

    /// Ask the inotify instance `fd` of the `memory.events` at `path`, whose watch last
    /// read the counts in `seen`.
    pub fn add_memory_events(
        &self,
        fd: BorrowedFd<'_>,
        path: PathBuf,
        seen: Arc<Mutex<MemoryEventCounts>>,
    ) -> std::io::Result<AskedKey> {
        self.add(fd, Kind::MemoryEvents { path, seen })
    }

    fn add(&self, fd: BorrowedFd<'_>, kind: Kind) -> std::io::Result<AskedKey> {
        let mut asked = self.asked();
        let key = asked.next;
        asked.next += 1;
        self.epoll
            .add(fd, EpollEvent::new(EpollFlags::EPOLLIN, key))
            .map_err(std::io::Error::from)?;
        asked.live.insert(key, kind);
        Ok(AskedKey(key))
    }

    /// No longer count what the descriptor of `key` signals. Its registration goes when
    /// its owner closes it.
    pub fn retire(&self, key: AskedKey) {
        self.asked().live.remove(&key.0);
    }

    /// Whether nothing is asked: then no cycle need ask.
    pub fn is_empty(&self) -> bool {
        self.asked().live.is_empty()
    }

    fn asked(&self) -> MutexGuard<'_, Asked> {
        // A poisoned lock only means a panic elsewhere while holding it; the map is whole.
        self.asked.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// As many ready descriptors as one ask looks at: the live ones are few (a memcg
/// threshold or two, one `memory.events`), a retired one may still be among them.
const READY_AT_ONCE: usize = 8;

impl NotificationsWaiting for WaitingNotifications {
    /// An error (an interrupted call, a `memory.events` that cannot be read) counts as
    /// nothing waiting: the cycle then reads on afresh, as it would without this.
    fn any(&self) -> bool {
        let mut events = [EpollEvent::empty(); READY_AT_ONCE];
        let ready = match self.epoll.wait(&mut events, EpollTimeout::ZERO) {
            Ok(0) | Err(_) => return false,
            Ok(ready) => ready,
        };
        // The files are read outside the lock.
        let mut changed = Vec::new();
        {
            let asked = self.asked();
            for event in &events[..ready] {
                match asked.live.get(&event.data()) {
                    None => {}
                    Some(Kind::Eventfd) => return true,
                    Some(Kind::MemoryEvents { path, seen }) => {
                        changed.push((path.clone(), seen.clone()));
                    }
                }
            }
        }
        changed.iter().any(|(path, seen)| {
            let seen = *seen.lock().unwrap_or_else(PoisonError::into_inner);
            read_counts(path).is_ok_and(|now| now.moved_since(&seen))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::eventfd::{EfdFlags, EventFd};
    use std::os::fd::AsFd;

    /// A notification waiting is seen, as often as asked, until its reader reads it; a
    /// retired descriptor counts no more, and a closed one drops out by itself.
    #[test]
    fn a_waiting_notification_is_seen_and_left_for_its_reader() {
        let waiting = WaitingNotifications::new().expect("an epoll instance");
        assert!(waiting.is_empty());
        assert!(!waiting.any(), "nothing watched");
        let eventfd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK).expect("an eventfd");
        let key = waiting
            .add_eventfd(eventfd.as_fd())
            .expect("the eventfd added");
        assert!(!waiting.is_empty());
        assert!(!waiting.any(), "nothing signalled yet");
        eventfd.write(1).expect("a notification");
        assert!(waiting.any());
        assert!(waiting.any(), "asking took nothing");
        assert_eq!(eventfd.read().expect("its reader reads it"), 1);
        assert!(!waiting.any(), "read");

        eventfd.write(1).expect("another notification");
        waiting.retire(key);
        assert!(waiting.is_empty());
        assert!(!waiting.any(), "retired, still open");

        let other = EventFd::from_flags(EfdFlags::EFD_NONBLOCK).expect("an eventfd");
        waiting
            .add_eventfd(other.as_fd())
            .expect("the eventfd added");
        other.write(1).expect("a notification");
        drop(other);
        assert!(!waiting.any(), "a closed descriptor counts no more");
    }

    /// A `memory.events` that changed counts only when a pressure counter moved past what
    /// its watch last saw: `low`, which the watch skips, does not.
    #[test]
    fn memory_events_count_only_for_the_counters_that_wake_a_cycle() {
        let dir = tempfile::tempdir().expect("a directory");
        let path = dir.path().join("memory.events");
        std::fs::write(&path, "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n").expect("written");
        let inotify = nix::sys::inotify::Inotify::init(nix::sys::inotify::InitFlags::IN_NONBLOCK)
            .expect("an inotify instance");
        inotify
            .add_watch(&path, nix::sys::inotify::AddWatchFlags::IN_MODIFY)
            .expect("the file watched");
        let seen = Arc::new(Mutex::new(MemoryEventCounts::default()));
        let waiting = WaitingNotifications::new().expect("an epoll instance");
        waiting
            .add_memory_events(inotify.as_fd(), path.clone(), seen.clone())
            .expect("the watch added");
        assert!(!waiting.any());
        std::fs::write(&path, "low 7\nhigh 0\nmax 0\noom 0\noom_kill 0\n").expect("written");
        assert!(!waiting.any(), "only `low` moved");
        std::fs::write(&path, "low 7\nhigh 0\nmax 1\noom 0\noom_kill 0\n").expect("written");
        assert!(waiting.any(), "`max` moved");
        *seen.lock().expect("the counts") = MemoryEventCounts {
            max: 1,
            ..MemoryEventCounts::default()
        };
        assert!(!waiting.any(), "the watch has seen it");
    }
}
