//! Pod memory figures kept from one cycle for the next ones, when `podStatsMaxAge` lets a
//! cycle that a kernel notification starts rank pods on figures read a moment before,
//! as the kubelet ranks them on cAdvisor's (refreshed every housekeeping interval).
//!
//! The decision after a memory crossing waits for the pods' figures. On cgroup v1 the
//! kernel generates each pod's `memory.stat` afresh for every read: at 110 pods, reading
//! each pod's three files took it 1–1.4 ms on the bench machine, most of a 2 ms budget
//! from crossing to decision. Reusing the memory figures of the last timer cycle leaves
//! the node's own files, the listing of the pods (and, where a `pid.available` threshold
//! asks for them, their process counts) between the crossing and the decision.
//!
//! A listing that reads every pod afresh may be cut short: once a kernel notification
//! waits unread ([`with_pod_figures_until_notified`]), the pods not yet read are served
//! from their kept figures within an age, as a cycle a notification starts ranks them.
//! Reading 110 pods afresh takes a timer cycle 2–3 ms; a crossing during those reads would
//! otherwise wait for all of them before the cycle reads the node's signals and decides.
//!
//! Only pod figures are kept, and only inside [`with_pod_figures`], which the cycle wraps
//! around its pod listing: the node-level signals that show the crossing are read fresh
//! outside it, and through another method. The figures are those of
//! [`CgroupReader::pod_memory_usage`] for the cgroups read inside, on the thread that
//! reads them (the decision cycle's own), keyed by the memory directory's path. Process
//! counts are never kept.
//!
//! [`CgroupReader::pod_memory_usage`]: super::CgroupReader::pod_memory_usage

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsString;
use std::hash::BuildHasherDefault;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::FileError;
use super::fileio::PathHasher;
use super::memory::MemoryUsage;

/// How a pod listing gets its memory figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodFigures {
    /// Read every pod's files, and keep what was read for the cycles that may reuse it
    /// (the timer's cycles).
    ReadAndKeep,
    /// Use the figures kept within `max_age`; read, and keep, those older or missing (a
    /// cycle a notification started).
    ReuseWithin(Duration),
}

/// Whether a kernel notification waits, not yet read by its notifier. Asked between the
/// pods' reads, so it must be cheap, and must leave the notification to its reader.
pub trait NotificationsWaiting: Send + Sync {
    fn any(&self) -> bool;
}

/// Run `list` (a pod listing) with its pod memory reads served as `figures` says, `now`
/// being the time of the reads. A cgroup not read inside `list` is forgotten at its end:
/// its pod has gone, and the kept figures stay as many as the pods.
/// A listing inside another ends as it began: the outer one decides what is forgotten.
pub fn with_pod_figures<R>(figures: PodFigures, now: Instant, list: impl FnOnce() -> R) -> R {
    listing(figures, now, None, list).0
}

/// Run `list` as [`PodFigures::ReadAndKeep`] does until `waiting` tells of a kernel
/// notification; from then on the listing's reads are served as
/// [`PodFigures::ReuseWithin`] `max_age`. Also returns whether a kept figure was used
/// then: otherwise every pod was read afresh after all.
pub fn with_pod_figures_until_notified<R>(
    max_age: Duration,
    now: Instant,
    waiting: Arc<dyn NotificationsWaiting>,
    list: impl FnOnce() -> R,
) -> (R, bool) {
    let cut = CutShort {
        max_age,
        waiting,
        notified: false,
        reused: false,
    };
    listing(PodFigures::ReadAndKeep, now, Some(cut), list)
}

fn listing<R>(
    figures: PodFigures,
    now: Instant,
    cut_short: Option<CutShort>,
    list: impl FnOnce() -> R,
) -> (R, bool) {
    let previous = KEPT.with_borrow_mut(|kept| kept.begin(figures, now, cut_short));
    // Restores the mode even if `list` panics, so no read outside a listing is served
    // from the kept figures.
    struct EndListingOnDrop(Option<Previous>);
    impl Drop for EndListingOnDrop {
        fn drop(&mut self) {
            if let Some(previous) = self.0.take() {
                // `try_with`: nothing to end once the thread's locals are being torn down.
                let _ = KEPT.try_with(|kept| kept.borrow_mut().end(previous));
            }
        }
    }
    let mut end = EndListingOnDrop(Some(previous));
    let listed = list();
    let cut = match end.0.take() {
        Some(previous) => KEPT.with_borrow_mut(|kept| kept.end(previous)),
        None => false,
    };
    (listed, cut)
}

/// The memory figures of the cgroup whose memory directory is `dir`: kept ones where the
/// listing under way may reuse them, with the time they were read, otherwise those
/// `read` returns now (`None`), kept for later listings inside a listing.
pub(crate) fn memory_usage(
    dir: PathBuf,
    read: impl FnOnce(&Path) -> Result<MemoryUsage, FileError>,
) -> Result<(MemoryUsage, Option<Instant>), FileError> {
    let scope = KEPT.with_borrow_mut(Kept::scope_of_next_read);
    let Some(scope) = scope else {
        return read(&dir).map(|usage| (usage, None));
    };
    if let PodFigures::ReuseWithin(max_age) = scope.figures {
        let reused = KEPT.with_borrow_mut(|kept| kept.reuse(&dir, max_age, scope));
        if let Some((usage, read_at)) = reused {
            return Ok((usage, Some(read_at)));
        }
    }
    let usage = read(&dir);
    KEPT.with_borrow_mut(|kept| match &usage {
        Ok(usage) => kept.keep(dir, *usage, scope),
        // Unreadable now: the kept figure of a cgroup that may be gone must not stand
        // in for it later.
        Err(_) => {
            kept.entries.remove(dir.as_os_str());
        }
    });
    usage.map(|usage| (usage, None))
}

/// How many cgroups' figures this thread keeps (tests).
#[cfg(test)]
pub(crate) fn kept_count() -> usize {
    KEPT.with_borrow(|kept| kept.entries.len())
}

thread_local! {
    static KEPT: RefCell<Kept> = RefCell::new(Kept::default());
}

#[derive(Debug, Clone, Copy)]
struct Scope {
    figures: PodFigures,
    now: Instant,
    /// Which listing this is: an entry not touched by the listing ending is dropped.
    listing: u64,
}

#[derive(Default)]
struct Kept {
    entries: HashMap<OsString, KeptUsage, BuildHasherDefault<PathHasher>>,
    /// The listing under way, if any.
    scope: Option<Scope>,
    /// What may cut the listing under way short (an inner listing has none of its own).
    cut_short: Option<CutShort>,
    listings: u64,
}

/// A listing that reads afresh until a notification waits.
struct CutShort {
    max_age: Duration,
    waiting: Arc<dyn NotificationsWaiting>,
    /// A notification was seen: every read after is served within `max_age`.
    notified: bool,
    /// A read was served from a kept figure since.
    reused: bool,
}

/// What a listing ending restores.
struct Previous {
    scope: Option<Scope>,
    cut_short: Option<CutShort>,
}

struct KeptUsage {
    read_at: Instant,
    usage: MemoryUsage,
    touched_in: u64,
}

impl Kept {
    fn begin(
        &mut self,
        figures: PodFigures,
        now: Instant,
        cut_short: Option<CutShort>,
    ) -> Previous {
        // A listing inside another counts as part of it.
        let listing = match self.scope {
            Some(outer) => outer.listing,
            None => {
                self.listings += 1;
                self.listings
            }
        };
        let scope = Scope {
            figures,
            now,
            listing,
        };
        Previous {
            scope: self.scope.replace(scope),
            cut_short: std::mem::replace(&mut self.cut_short, cut_short),
        }
    }

    /// Ends the listing under way, restoring `previous`; whether it was cut short and
    /// served a kept figure.
    fn end(&mut self, previous: Previous) -> bool {
        // Only the outermost listing lists every pod: an inner one would forget the
        // figures the outer one read before it.
        if let (Some(ended), None) = (self.scope, previous.scope) {
            self.entries
                .retain(|_, kept| kept.touched_in == ended.listing);
        }
        self.scope = previous.scope;
        std::mem::replace(&mut self.cut_short, previous.cut_short).is_some_and(|cut| cut.reused)
    }

    /// The scope the next read is served in: a listing that reads afresh until a
    /// notification waits, and one does (or did), serves it from the kept figures.
    fn scope_of_next_read(&mut self) -> Option<Scope> {
        let mut scope = self.scope?;
        if let (PodFigures::ReadAndKeep, Some(cut_short)) = (scope.figures, &mut self.cut_short) {
            cut_short.notified = cut_short.notified || cut_short.waiting.any();
            if cut_short.notified {
                scope.figures = PodFigures::ReuseWithin(cut_short.max_age);
            }
        }
        Some(scope)
    }

    fn reuse(
        &mut self,
        dir: &Path,
        max_age: Duration,
        scope: Scope,
    ) -> Option<(MemoryUsage, Instant)> {
        let kept = self.entries.get_mut(dir.as_os_str())?;
        // A figure read after `now` (a clock handed in by a test) is as good as new.
        let age = scope.now.saturating_duration_since(kept.read_at);
        if age > max_age {
            return None;
        }
        kept.touched_in = scope.listing;
        if let Some(cut_short) = self.cut_short.as_mut() {
            // Only a listing cut short reuses while it has one.
            cut_short.reused = true;
        }
        Some((kept.usage, kept.read_at))
    }

    fn keep(&mut self, dir: PathBuf, usage: MemoryUsage, scope: Scope) {
        let figures = KeptUsage {
            read_at: scope.now,
            usage,
            touched_in: scope.listing,
        };
        // Overwritten in place: no new key for each pod at every timer cycle.
        match self.entries.get_mut(dir.as_os_str()) {
            Some(kept) => *kept = figures,
            None => {
                self.entries.insert(dir.into_os_string(), figures);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::{CgroupLayout, CgroupReader};

    fn write_usage(root: &Path, cgroup: &str, usage: u64, inactive: u64) {
        let dir = root.join(cgroup);
        std::fs::create_dir_all(&dir).expect("a cgroup directory");
        std::fs::write(dir.join("memory.current"), format!("{usage}\n")).expect("usage");
        std::fs::write(
            dir.join("memory.stat"),
            format!("anon 0\ninactive_file {inactive}\n"),
        )
        .expect("memory.stat");
    }

    fn working_set(reader: &CgroupReader, cgroup: &str) -> Option<u64> {
        reader
            .pod_memory_usage(Path::new(cgroup))
            .ok()
            .map(|(usage, _)| usage.working_set_bytes())
    }

    /// A listing that may reuse gets the figures of the last listing that read them,
    /// within the age allowed, and reads afresh those older, missing or never read.
    #[test]
    fn a_listing_reuses_figures_only_within_their_age() {
        let root = tempfile::tempdir().expect("a fake cgroup tree");
        let reader = CgroupReader::new(root.path(), CgroupLayout::Unified);
        write_usage(root.path(), "pods/a", 300, 100);
        let start = Instant::now();
        let max_age = Duration::from_secs(10);

        let read = with_pod_figures(PodFigures::ReadAndKeep, start, || {
            working_set(&reader, "pods/a")
        });
        assert_eq!(read, Some(200));

        // The pod grew; a new pod appeared.
        write_usage(root.path(), "pods/a", 900, 100);
        write_usage(root.path(), "pods/b", 50, 0);
        let within = start + Duration::from_secs(10);
        let (a, b) = with_pod_figures(PodFigures::ReuseWithin(max_age), within, || {
            (
                working_set(&reader, "pods/a"),
                working_set(&reader, "pods/b"),
            )
        });
        assert_eq!(a, Some(200), "kept from the last read, 10 s old");
        assert_eq!(b, Some(50), "never read before: read now");

        // Past the age the figure is read again, and kept from then on.
        let past = start + Duration::from_millis(10_001);
        let a = with_pod_figures(PodFigures::ReuseWithin(max_age), past, || {
            working_set(&reader, "pods/a")
        });
        assert_eq!(a, Some(800));

        // Outside a listing, and in a listing that keeps, every read is fresh.
        write_usage(root.path(), "pods/a", 1_000, 0);
        assert_eq!(working_set(&reader, "pods/a"), Some(1_000));
        let a = with_pod_figures(PodFigures::ReadAndKeep, past, || {
            working_set(&reader, "pods/a")
        });
        assert_eq!(a, Some(1_000));
    }

    /// A cgroup not read by a listing has gone with its pod: its figures are dropped, so
    /// the kept figures stay as many as the pods, and a pod of the same name made after
    /// that listing is read, not given the old one's figures. A cgroup that cannot be
    /// read is not given its last figures either.
    #[test]
    fn figures_of_cgroups_gone_or_unreadable_are_not_kept() {
        let root = tempfile::tempdir().expect("a fake cgroup tree");
        let reader = CgroupReader::new(root.path(), CgroupLayout::Unified);
        write_usage(root.path(), "pods/a", 300, 0);
        write_usage(root.path(), "pods/b", 400, 0);
        let now = Instant::now();
        let reuse = PodFigures::ReuseWithin(Duration::from_secs(10));
        with_pod_figures(PodFigures::ReadAndKeep, now, || {
            working_set(&reader, "pods/a");
            working_set(&reader, "pods/b");
        });
        assert_eq!(kept_count(), 2);

        // `b` is not listed any more.
        with_pod_figures(reuse, now, || working_set(&reader, "pods/a"));
        assert_eq!(kept_count(), 1);
        write_usage(root.path(), "pods/b", 700, 0);
        let b = with_pod_figures(reuse, now, || working_set(&reader, "pods/b"));
        assert_eq!(b, Some(700), "a new pod under the old name is read");

        // `a`'s files turn to garbage: read fresh, the error stands.
        std::fs::write(root.path().join("pods/a/memory.current"), "lots\n").expect("garbage");
        let a = with_pod_figures(PodFigures::ReadAndKeep, now, || {
            working_set(&reader, "pods/a")
        });
        assert_eq!(a, None);
        let a = with_pod_figures(reuse, now, || working_set(&reader, "pods/a"));
        assert_eq!(a, None, "no kept figure stands in for an unreadable cgroup");
    }

    /// Kept figures come with the time they were read (for the Kubernetes mode's
    /// two-minute stand-ins); figures read now come without. A listing inside another is
    /// part of it: what either read stays kept.
    #[test]
    fn kept_figures_carry_their_read_time_and_nested_listings_keep_both() {
        let root = tempfile::tempdir().expect("a fake cgroup tree");
        let reader = CgroupReader::new(root.path(), CgroupLayout::Unified);
        write_usage(root.path(), "pods/a", 300, 0);
        write_usage(root.path(), "pods/b", 400, 0);
        let start = Instant::now();
        let read_at = |now, figures| {
            with_pod_figures(figures, now, || {
                reader
                    .pod_memory_usage(Path::new("pods/a"))
                    .expect("pod a's figures")
                    .1
            })
        };
        assert_eq!(read_at(start, PodFigures::ReadAndKeep), None);
        let later = start + Duration::from_secs(3);
        let reuse = PodFigures::ReuseWithin(Duration::from_secs(10));
        assert_eq!(read_at(later, reuse), Some(start));

        with_pod_figures(PodFigures::ReadAndKeep, later, || {
            working_set(&reader, "pods/a");
            with_pod_figures(PodFigures::ReadAndKeep, later, || {
                working_set(&reader, "pods/b");
            });
        });
        assert_eq!(kept_count(), 2);
    }

    /// Whether a notification waits, as a test sets it.
    #[derive(Default)]
    struct Waiting(std::sync::atomic::AtomicBool);

    impl NotificationsWaiting for Waiting {
        fn any(&self) -> bool {
            self.0.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    /// A listing that reads afresh until a notification waits reads every pod afresh
    /// while none does. Once one waits, the pods read after are served as in a cycle a
    /// notification starts: from the figures kept within the age allowed, and afresh
    /// where none is kept. The figures read before stay fresh, and are kept.
    #[test]
    fn a_notification_waiting_serves_the_pods_not_yet_read_from_kept_figures() {
        let root = tempfile::tempdir().expect("a fake cgroup tree");
        let reader = CgroupReader::new(root.path(), CgroupLayout::Unified);
        for (pod, usage) in [("pods/a", 100), ("pods/b", 200), ("pods/c", 300)] {
            write_usage(root.path(), pod, usage, 0);
        }
        let start = Instant::now();
        let max_age = Duration::from_secs(10);
        let waiting = Arc::new(Waiting::default());
        let read_all = |now, pods: &[&str]| {
            with_pod_figures_until_notified(max_age, now, waiting.clone(), || {
                pods.iter()
                    .map(|pod| {
                        let usage = working_set(&reader, pod);
                        // A notification arrives once `a` has been read at 111.
                        if *pod == "pods/a" && usage == Some(111) {
                            waiting.0.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                        usage
                    })
                    .collect::<Vec<_>>()
            })
        };
        let (read, cut) = read_all(start, &["pods/a", "pods/b", "pods/c"]);
        assert_eq!(read, [Some(100), Some(200), Some(300)]);
        assert!(!cut);

        for (pod, usage) in [
            ("pods/a", 111),
            ("pods/b", 222),
            ("pods/c", 333),
            ("pods/d", 444),
        ] {
            write_usage(root.path(), pod, usage, 0);
        }
        let later = start + Duration::from_secs(5);
        let (read, cut) = read_all(later, &["pods/a", "pods/b", "pods/d", "pods/c"]);
        assert_eq!(
            read,
            [Some(111), Some(200), Some(444), Some(300)],
            "`a` afresh, then `b` and `c` kept, `d` afresh: it has no kept figure"
        );
        assert!(cut);
        // Past their age, figures are read afresh after a notification too (`b`, `c`);
        // `a` and `d`, kept 5 s before, are reused.
        let past = start + Duration::from_millis(10_001);
        let (read, cut) = read_all(past, &["pods/a", "pods/b", "pods/d", "pods/c"]);
        assert_eq!(read, [Some(111), Some(222), Some(444), Some(333)]);
        assert!(cut);
        // A notification while every kept figure is past its age: every pod is read
        // afresh, and the listing is not one cut short.
        write_usage(root.path(), "pods/b", 200, 0);
        write_usage(root.path(), "pods/c", 330, 0);
        let (read, cut) = read_all(past + Duration::from_secs(11), &["pods/b", "pods/c"]);
        assert_eq!(read, [Some(200), Some(330)]);
        assert!(!cut, "no kept figure was used");
        // The same listing once the notification has been read: every pod afresh.
        waiting.0.store(false, std::sync::atomic::Ordering::Relaxed);
        write_usage(root.path(), "pods/a", 100, 0);
        write_usage(root.path(), "pods/d", 400, 0);
        let (read, cut) = read_all(past, &["pods/a", "pods/b", "pods/d", "pods/c"]);
        assert_eq!(read, [Some(100), Some(200), Some(400), Some(330)]);
        assert!(!cut);
        // A listing served from kept figures throughout is not one cut short.
        let (_, cut) = listing(PodFigures::ReuseWithin(max_age), past, None, || {
            working_set(&reader, "pods/a")
        });
        assert!(!cut);
    }

    /// A listing that panics leaves the thread reading fresh: no later read outside a
    /// listing is served from kept figures.
    #[test]
    fn a_panicking_listing_ends_its_reuse() {
        let root = tempfile::tempdir().expect("a fake cgroup tree");
        let reader = CgroupReader::new(root.path(), CgroupLayout::Unified);
        write_usage(root.path(), "pods/a", 300, 0);
        let now = Instant::now();
        with_pod_figures(PodFigures::ReadAndKeep, now, || {
            working_set(&reader, "pods/a")
        });
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_pod_figures(
                PodFigures::ReuseWithin(Duration::from_secs(10)),
                now,
                || panic!("a listing that fails"),
            )
        }));
        assert!(panicked.is_err());
        write_usage(root.path(), "pods/a", 600, 0);
        assert_eq!(working_set(&reader, "pods/a"), Some(600));
    }
}
