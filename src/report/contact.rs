//! When the agent last knew the fence controller could hear its node, for self-isolation
//! (see `crate::isolation::self_isolation`). The controller hears a node through two
//! channels: the agent's reports and the kubelet's Lease renewals. The agent counts a
//! contact on either only at a moment no later than the controller's own hearing of it:
//!
//! - a report the controller answered counts from when it was *sent* (the controller
//!   received it after that);
//! - a Lease renewal counts from the agent's *previous* read of the Lease, the last
//!   moment it still saw the older renewal (the renewal, and so the controller's view of
//!   it, came after that).
//!
//! So the agent's deadline, counted from its last contact, never falls after the moment
//! the controller counts the node's silence from. Times are `CLOCK_BOOTTIME` (it goes on
//! across a suspend and is the same for every process of the boot), kept in a state file
//! under /run so a restarted agent does not start its count again.

use prometheus_client::metrics::counter::Counter;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::boot_clock::{since_boot, whole_millis};

/// What the state file keeps, for the agents of one boot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContactRecord {
    boot_id: String,
    /// `CLOCK_BOOTTIME` milliseconds of the last contact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_contact_millis: Option<u64>,
    /// When an agent of this boot first armed self-isolation: with no contact since,
    /// the count starts there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    armed_since_millis: Option<u64>,
    /// The largest promise (`withinMillis`) a report the controller answered carried:
    /// the controller may hold it until it hears a new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    promised_within_millis: Option<u64>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The latest contact on either channel.
    last: Option<Duration>,
    /// The latest report the controller answered, by when it was sent.
    report_sent: Option<Duration>,
    /// The previous read of the Lease: when, and the renewal it showed.
    lease_read: Option<(Duration, String)>,
    armed_since: Option<Duration>,
    promised_within: Option<Duration>,
    /// What an earlier agent of this boot left could not be read: count from boot.
    unreadable: bool,
    /// Changed since the state file was last written.
    dirty: bool,
}

/// Shared by the report sender and the Lease reader (which post contacts) and the
/// self-isolation guardian (which reads them, and writes the state file off the
/// runtime thread).
#[derive(Debug)]
pub struct ContactClock {
    inner: Mutex<Inner>,
    state_file: Option<(PathBuf, String)>,
    /// Counts every failed write of the state file.
    write_failures: Counter,
}

impl ContactClock {
    /// A clock with no state file (tests, and agents without self-isolation).
    pub fn in_memory() -> ContactClock {
        ContactClock {
            inner: Mutex::new(Inner::default()),
            state_file: None,
            write_failures: Counter::default(),
        }
    }

    /// A clock kept in `path` for this boot, starting from what an earlier agent of the
    /// boot left there. A record of another boot, or none, starts afresh; one that
    /// cannot be read counts from the boot's start (see [`Self::count_from`]).
    pub fn persistent(path: &Path, boot_id: &str) -> ContactClock {
        let mut inner = Inner::default();
        let unreadable = |error: &dyn std::fmt::Display| {
            tracing::warn!(file = %path.display(), %error, "the last contact with the controller cannot be read; counting from the boot's start");
        };
        match std::fs::read(path) {
            Ok(bytes) => match serde_json::from_slice::<ContactRecord>(&bytes) {
                Ok(record) if record.boot_id == boot_id => {
                    inner.last = record.last_contact_millis.map(Duration::from_millis);
                    inner.armed_since = record.armed_since_millis.map(Duration::from_millis);
                    inner.promised_within =
                        record.promised_within_millis.map(Duration::from_millis);
                }
                Ok(_) => {}
                Err(error) => {
                    unreadable(&error);
                    inner.unreadable = true;
                }
            },
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                unreadable(&error);
                inner.unreadable = true;
            }
        }
        ContactClock {
            inner: Mutex::new(inner),
            state_file: Some((path.to_path_buf(), boot_id.to_string())),
            write_failures: Counter::default(),
        }
    }

    /// Count every failed write of the state file in `failures`.
    pub fn counting_failures(mut self, failures: Counter) -> Self {
        self.write_failures = failures;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The latest contact, on the boot clock; `None`: none this boot.
    pub fn last_contact(&self) -> Option<Duration> {
        self.lock().last
    }

    /// Where the silence counts from for an agent that started at `started`: the last
    /// contact of this boot; without one, when an agent of this boot first armed (an
    /// earlier agent's promise may have reached the controller before it stopped), or
    /// this agent's start; with an earlier agent's record unreadable, the boot's start.
    pub fn count_from(&self, started: Duration) -> Duration {
        let inner = self.lock();
        if let Some(last) = inner.last {
            return last;
        }
        if inner.unreadable {
            return Duration::ZERO;
        }
        inner
            .armed_since
            .map_or(started, |since| since.min(started))
    }

    /// Self-isolation is armed from `now` (kept if an earlier agent of the boot armed
    /// first).
    pub fn arm(&self, now: Duration) {
        let mut inner = self.lock();
        if inner.armed_since.is_none() {
            inner.armed_since = Some(now);
            inner.dirty = true;
        }
    }

    /// A promise withdrawn and heard: the next agent of this boot owes nothing to this
    /// one (it counts from its own start).
    pub fn forget(&self) {
        let mut inner = self.lock();
        inner.last = None;
        inner.armed_since = None;
        inner.promised_within = None;
        inner.dirty = true;
    }

    /// The largest promise the controller may hold from this boot.
    pub fn promised_within(&self) -> Option<Duration> {
        self.lock().promised_within
    }

    /// The controller answered a report carrying a promise of `within`.
    pub fn promise_delivered(&self, within: Duration) {
        let mut inner = self.lock();
        if inner.promised_within.is_none_or(|held| held < within) {
            inner.promised_within = Some(within);
            inner.dirty = true;
        }
    }

    /// Whether the controller answered a report sent at or after `moment`.
    pub fn report_answered_since(&self, moment: Duration) -> bool {
        self.lock().report_sent.is_some_and(|sent| sent >= moment)
    }

    /// The controller answered a report sent at `sent_at`.
    pub fn report_answered(&self, sent_at: Duration) {
        let mut inner = self.lock();
        inner.report_sent = Some(inner.report_sent.map_or(sent_at, |s| s.max(sent_at)));
        advance(&mut inner, sent_at);
    }

    /// The Lease read at `at` showed `renewal` (its `renewTime`, `None` when unset).
    /// Only a renewal that differs from the previous read's is a contact, counted from
    /// that previous read.
    pub fn lease_read(&self, at: Duration, renewal: Option<&str>) {
        let mut inner = self.lock();
        let renewal = renewal.unwrap_or_default().to_string();
        let previous = inner.lease_read.replace((at, renewal.clone()));
        if let Some((previous_at, previous_renewal)) = previous
            && previous_renewal != renewal
            && !renewal.is_empty()
        {
            advance(&mut inner, previous_at);
        }
    }

    /// The Lease could not be read: the next read that succeeds has nothing to compare
    /// with before this moment, so it counts no renewal from before the gap.
    pub fn lease_unread(&self) {
        self.lock().lease_read = None;
    }

    /// Writes the state file if anything changed since the last write (blocking: the
    /// guardian calls it off the runtime thread). A failure keeps the change pending.
    pub fn flush(&self) -> std::io::Result<()> {
        let Some((path, boot_id)) = &self.state_file else {
            return Ok(());
        };
        let record = {
            let mut inner = self.lock();
            if !inner.dirty {
                return Ok(());
            }
            inner.dirty = false;
            ContactRecord {
                boot_id: boot_id.clone(),
                last_contact_millis: inner.last.map(whole_millis),
                armed_since_millis: inner.armed_since.map(whole_millis),
                promised_within_millis: inner.promised_within.map(whole_millis),
            }
        };
        let written = crate::state_file::write_json(path, &record);
        if written.is_err() {
            self.write_failures.inc();
            self.lock().dirty = true;
        }
        written
    }
}

fn advance(inner: &mut Inner, at: Duration) {
    if inner.last.is_some_and(|last| last >= at) {
        return;
    }
    inner.last = Some(at);
    inner.dirty = true;
}

/// Reads the node's Lease (the kubelet's renewals), for the contact clock.
pub trait LeaseSource: Send + Sync + 'static {
    /// The Lease's `renewTime` as the API server has it now; `Ok(None)` when it has none
    /// (or there is no Lease); `Err` when the API server did not answer.
    fn renewal(
        &self,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Option<String>, String>> + Send + '_>,
    >;
}

/// Reads the Lease every `every` (each read within `timeout`) and posts what it shows to
/// `contact`, until aborted.
pub async fn follow_lease(
    source: std::sync::Arc<dyn LeaseSource>,
    contact: std::sync::Arc<ContactClock>,
    every: Duration,
    timeout: Duration,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        ticks.tick().await;
        // The read's start: the renewal it shows happened no later than its answer, and
        // the next read compares with it from here.
        let at = since_boot();
        match tokio::time::timeout(timeout, source.renewal()).await {
            Ok(Ok(renewal)) => {
                if failing {
                    tracing::info!("the node's Lease can be read again");
                    failing = false;
                }
                contact.lease_read(at, renewal.as_deref());
            }
            outcome => {
                if !failing {
                    let error = match outcome {
                        Ok(Err(error)) => error,
                        _ => format!("no answer within {timeout:?}"),
                    };
                    tracing::warn!(%error, "cannot read the node's Lease; its renewals do not count as contact with the controller");
                    failing = true;
                }
                contact.lease_unread();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    #[test]
    fn an_answered_report_counts_from_when_it_was_sent_and_never_goes_back() {
        let clock = ContactClock::in_memory();
        assert_eq!(clock.last_contact(), None);
        clock.report_answered(s(10));
        clock.report_answered(s(8));
        assert_eq!(clock.last_contact(), Some(s(10)));
    }

    #[test]
    fn a_lease_renewal_counts_from_the_read_before_it_and_an_unchanged_one_not_at_all() {
        let clock = ContactClock::in_memory();
        clock.lease_read(s(10), Some("2026-11-24T10:00:00Z"));
        assert_eq!(
            clock.last_contact(),
            None,
            "a first read has nothing to compare"
        );
        clock.lease_read(s(12), Some("2026-11-24T10:00:00Z"));
        assert_eq!(clock.last_contact(), None, "the same renewal is no news");
        clock.lease_read(s(14), Some("2026-11-24T10:00:10Z"));
        assert_eq!(
            clock.last_contact(),
            Some(s(12)),
            "renewed after the read at 12 s, so heard no earlier than that"
        );
        // A gap in the reads: the renewal seen after it may be from any time in the gap.
        clock.lease_unread();
        clock.lease_read(s(40), Some("2026-11-24T10:00:35Z"));
        assert_eq!(clock.last_contact(), Some(s(12)));
        clock.lease_read(s(42), None);
        assert_eq!(clock.last_contact(), Some(s(12)), "a Lease with no renewal");
    }

    #[test]
    fn a_restarted_agent_keeps_this_boots_count_and_not_an_earlier_boots() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("run/contact.json");
        let clock = ContactClock::persistent(&path, "boot-1");
        assert_eq!(
            clock.count_from(s(50)),
            s(50),
            "nothing yet: from this start"
        );
        clock.arm(s(50));
        clock.flush().expect("write");
        // A restart before any contact: the count goes on from the first arming.
        let restarted = ContactClock::persistent(&path, "boot-1");
        assert_eq!(restarted.count_from(s(80)), s(50));
        restarted.arm(s(80));
        restarted.report_answered(s(90));
        restarted.promise_delivered(s(200));
        restarted.flush().expect("write");
        let again = ContactClock::persistent(&path, "boot-1");
        assert_eq!(again.last_contact(), Some(s(90)));
        assert_eq!(again.count_from(s(300)), s(90));
        assert_eq!(again.promised_within(), Some(s(200)));
        again.promise_delivered(s(100));
        assert_eq!(again.promised_within(), Some(s(200)), "the largest stays");
        // Another boot's record says nothing about this one.
        let next_boot = ContactClock::persistent(&path, "boot-2");
        assert_eq!(next_boot.count_from(s(40)), s(40));
        assert_eq!(next_boot.promised_within(), None);
        // An unreadable one: from the boot's start, the cautious reading.
        std::fs::write(&path, "{garbage").expect("write");
        assert_eq!(
            ContactClock::persistent(&path, "boot-1").count_from(s(300)),
            Duration::ZERO
        );
    }

    #[test]
    fn the_state_file_is_written_only_when_something_changed_and_a_failed_write_is_retried() {
        let dir = tempfile::tempdir().expect("temp dir");
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "").expect("write");
        // A directory that cannot be made (a file is in the way).
        let failures = Counter::default();
        let clock = ContactClock::persistent(&blocker.join("contact.json"), "boot-1")
            .counting_failures(failures.clone());
        clock.report_answered(s(5));
        assert!(clock.flush().is_err());
        assert!(clock.flush().is_err(), "still pending");
        assert_eq!(failures.get(), 2, "each failed write is counted");
        let path = dir.path().join("contact.json");
        let clock = ContactClock::persistent(&path, "boot-1");
        clock.flush().expect("nothing to write");
        assert!(!path.exists());
        clock.report_answered(s(5));
        clock.flush().expect("write");
        assert!(path.exists());
    }
}
