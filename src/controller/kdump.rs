//! Hearing a crashed node's kdump kernel. A node configured with `kdump=true` in its
//! `fence-config-<node>` runs ClusterLabs' `fence_kdump_send` from its crash kernel: an
//! 8-byte UDP datagram (a magic number and a message version, each a 32-bit word in the
//! sender's byte order) every 10 s by default, to port 7410. Such a node runs no pods (its
//! kernel crashed), but powering it off destroys the dump an operator wants, so the fence
//! releases its pods on the notification and holds its power step back while the
//! notifications keep coming (see `decide.rs`).
//!
//! This module only hears: `decode` checks a datagram, [`KdumpLog`] keeps each source
//! address's current run of notifications on the monotonic clock, and [`listen`] is the
//! socket loop. Which node an address is, and whether a run counts (only from the node's
//! InternalIP, and only after its last sign of life), is decided in `decide.rs` from the
//! facts. A datagram is easy to forge from the node's address; docs/fencing.md says what
//! trust that places in the network, as Pacemaker's `fence_kdump` does.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use super::metrics::{ControllerMetrics, OutcomeLabels};

/// `fence_kdump_send`'s magic number.
pub const MAGIC: u32 = 0x1B30_2A40;
/// The only message version there is.
pub const VERSION_1: u32 = 1;
/// `fence_kdump_send`'s default port.
pub const DEFAULT_PORT: u16 = 7410;
/// At most this many source addresses are remembered, so a flood of forged sources
/// cannot grow the log. When it is full, runs that ended are dropped (at most once a
/// second, so a flood costs no scan per datagram), and a new source is refused while it
/// stays full: a dump in progress is never pushed out by a flood.
pub const MAX_SOURCES: usize = 16_384;
/// How often a full log looks for runs that ended.
const PRUNE_EVERY: Duration = Duration::from_secs(1);

/// Why a datagram is not a kdump notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotificationError {
    #[error("{0} bytes, not the 8 of a kdump notification")]
    Length(usize),
    #[error("not fence_kdump_send's magic number")]
    Magic,
    #[error("message version {0}, not 1")]
    Version(u32),
}

/// Checks one datagram. The sender writes its words in its own byte order, so a
/// big-endian node's notification is taken as well as a little-endian one's (the magic
/// number tells which); both words must be in the same order.
pub fn decode(datagram: &[u8]) -> Result<(), NotificationError> {
    let words: [u8; 8] = datagram
        .try_into()
        .map_err(|_| NotificationError::Length(datagram.len()))?;
    let [m0, m1, m2, m3, v0, v1, v2, v3] = words;
    let version = if u32::from_le_bytes([m0, m1, m2, m3]) == MAGIC {
        u32::from_le_bytes([v0, v1, v2, v3])
    } else if u32::from_be_bytes([m0, m1, m2, m3]) == MAGIC {
        u32::from_be_bytes([v0, v1, v2, v3])
    } else {
        return Err(NotificationError::Magic);
    };
    if version != VERSION_1 {
        return Err(NotificationError::Version(version));
    }
    Ok(())
}

/// One source's notifications, as the decision reads them: on the decision's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KdumpHeard {
    pub from: IpAddr,
    /// The first notification of the current run (no gap longer than `kdumpSilence`).
    pub first: Timestamp,
    pub last: Timestamp,
    /// Notifications in the run.
    pub notifications: u64,
}

#[derive(Debug, Clone, Copy)]
struct Run {
    first: Instant,
    last: Instant,
    notifications: u64,
}

/// Every source address's current run of notifications.
pub struct KdumpLog {
    runs: Mutex<Runs>,
    /// A gap longer than this starts a new run (`kdumpSilence`).
    run_gap: Duration,
    /// Since when this log hears: a notification it has not heard may have come before.
    listening_since: Instant,
}

#[derive(Default)]
struct Runs {
    by_source: HashMap<IpAddr, Run>,
    pruned_at: Option<Instant>,
}

impl KdumpLog {
    pub fn new(run_gap: Duration) -> KdumpLog {
        KdumpLog {
            runs: Mutex::new(Runs::default()),
            run_gap,
            listening_since: Instant::now(),
        }
    }

    fn runs(&self) -> std::sync::MutexGuard<'_, Runs> {
        self.runs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Since when this log hears, on the decision's clock: `now` is its reading at
    /// `instant`.
    pub fn listening_since(&self, now: Timestamp, instant: Instant) -> Timestamp {
        now - instant.saturating_duration_since(self.listening_since)
    }

    /// A notification from `from`, received at `at`; `false` when the log is full of
    /// other sources' runs and refused it.
    pub fn record(&self, from: IpAddr, at: Instant) -> bool {
        let from = from.to_canonical();
        let mut guard = self.runs();
        let runs = &mut *guard;
        if let Some(run) = runs.by_source.get_mut(&from) {
            if at.saturating_duration_since(run.last) > self.run_gap {
                *run = Run {
                    first: at,
                    last: at,
                    notifications: 1,
                };
            } else {
                run.last = run.last.max(at);
                run.notifications = run.notifications.saturating_add(1);
            }
            return true;
        }
        if runs.by_source.len() >= MAX_SOURCES {
            let due = runs
                .pruned_at
                .is_none_or(|then| at.saturating_duration_since(then) >= PRUNE_EVERY);
            if due {
                runs.pruned_at = Some(at);
                let gap = self.run_gap;
                runs.by_source
                    .retain(|_, run| at.saturating_duration_since(run.last) <= gap);
            }
            if runs.by_source.len() >= MAX_SOURCES {
                return false;
            }
        }
        runs.by_source.insert(
            from,
            Run {
                first: at,
                last: at,
                notifications: 1,
            },
        );
        true
    }

    /// The latest run heard from any of `addresses` (a node's InternalIPs), as timestamps
    /// on the decision's clock: `now` is the decision's clock reading at `instant`.
    pub fn heard(
        &self,
        addresses: &[IpAddr],
        now: Timestamp,
        instant: Instant,
    ) -> Option<KdumpHeard> {
        let stamp = |then: Instant| now - instant.saturating_duration_since(then);
        let runs = self.runs();
        addresses
            .iter()
            .filter_map(|address| {
                let address = address.to_canonical();
                runs.by_source.get(&address).map(|run| (address, *run))
            })
            .max_by_key(|(_, run)| run.last)
            .map(|(from, run)| KdumpHeard {
                from,
                first: stamp(run.first),
                last: stamp(run.last),
                notifications: run.notifications,
            })
    }
}

/// Receives notifications until `stop` resolves. Every replica listens, not only the
/// leader, so a replica that takes over may already know the dumps in progress (when the
/// notifications reach it: a Service routes to the leader only).
pub async fn listen(
    socket: tokio::net::UdpSocket,
    log: std::sync::Arc<KdumpLog>,
    metrics: std::sync::Arc<ControllerMetrics>,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut stop = std::pin::pin!(stop);
    // Every outcome's series from the start, at 0: a counter's first datagram is then an
    // increase Prometheus sees, and a listening controller shows the metric at all.
    for outcome in ["notification", "refused", "malformed"] {
        metrics
            .kdump_datagrams
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc_by(0);
    }
    // Larger than a notification, so a longer datagram is seen as too long rather than
    // cut to 8 bytes.
    let mut buffer = [0u8; 64];
    loop {
        let received = tokio::select! {
            received = socket.recv_from(&mut buffer) => received,
            _ = &mut stop => return,
        };
        let (length, source) = match received {
            Ok(received) => received,
            Err(error) => {
                // A transient failure: go on, without spinning on one that persists.
                tracing::debug!(%error, "kdump socket");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let datagram = buffer.get(..length).unwrap_or_default();
        let outcome = match decode(datagram) {
            Ok(()) if log.record(source.ip(), Instant::now()) => {
                tracing::debug!(from = %source, "kdump notification");
                "notification"
            }
            Ok(()) => {
                tracing::debug!(from = %source, "kdump notification refused: the log is full of other sources' runs");
                "refused"
            }
            Err(problem) => {
                tracing::debug!(from = %source, %problem, "ignored a datagram on the kdump address");
                "malformed"
            }
        };
        metrics
            .kdump_datagrams
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn little(magic: u32, version: u32) -> Vec<u8> {
        [magic.to_le_bytes(), version.to_le_bytes()].concat()
    }

    #[test]
    fn only_an_eight_byte_version_1_notification_in_either_byte_order_is_one() {
        // What Debian's fence_kdump_send (fence-agents 4.12) sends on x86-64.
        assert_eq!(decode(&[0x40, 0x2a, 0x30, 0x1b, 0x01, 0, 0, 0]), Ok(()));
        assert_eq!(decode(&little(MAGIC, 1)), Ok(()));
        let big = [MAGIC.to_be_bytes(), 1u32.to_be_bytes()].concat();
        assert_eq!(decode(&big), Ok(()));
        assert_eq!(
            decode(&little(MAGIC, 2)),
            Err(NotificationError::Version(2))
        );
        assert_eq!(
            decode(&little(0x1B30_2A41, 1)),
            Err(NotificationError::Magic)
        );
        // Mixed byte orders are no message a sender writes.
        let mixed = [MAGIC.to_le_bytes(), 1u32.to_be_bytes()].concat();
        assert_eq!(decode(&mixed), Err(NotificationError::Version(0x0100_0000)));
        let mut long = little(MAGIC, 1);
        long.push(0);
        assert_eq!(decode(&long), Err(NotificationError::Length(9)));
        assert_eq!(decode(&[]), Err(NotificationError::Length(0)));
    }

    #[test]
    fn a_run_lasts_while_the_gaps_stay_within_the_silence_and_a_later_one_starts_afresh() {
        let log = KdumpLog::new(Duration::from_secs(30));
        let start = Instant::now();
        let node: IpAddr = "10.0.0.7".parse().expect("address");
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        for seconds in [0, 10, 20, 50] {
            log.record(node, at(seconds));
        }
        let now = Timestamp::from_second(1_800_000_100).expect("in range");
        let heard = log.heard(&[node], now, at(100)).expect("heard");
        assert_eq!(heard.from, node);
        assert_eq!(heard.first, now - Duration::from_secs(100));
        assert_eq!(heard.last, now - Duration::from_secs(50));
        assert_eq!(heard.notifications, 4);
        // 31 s after the last one: a new run.
        log.record(node, at(81));
        let heard = log.heard(&[node], now, at(100)).expect("heard");
        assert_eq!(heard.first, now - Duration::from_secs(19));
        assert_eq!(heard.notifications, 1);
        // Another address is another source; an IPv4-mapped IPv6 source is its IPv4.
        let other: IpAddr = "10.0.0.8".parse().expect("address");
        assert_eq!(log.heard(&[other], now, at(100)), None);
        let mapped: IpAddr = "::ffff:10.0.0.8".parse().expect("address");
        log.record(mapped, at(90));
        assert_eq!(
            log.heard(&[other], now, at(100)).map(|h| h.from),
            Some(other)
        );
        // Of a node's addresses, the one heard last.
        assert_eq!(
            log.heard(&[node, other], now, at(100)).map(|h| h.from),
            Some(other)
        );
    }

    #[test]
    fn a_flood_of_sources_keeps_the_log_bounded_and_never_pushes_out_a_dump_in_progress() {
        let log = KdumpLog::new(Duration::from_secs(30));
        let start = Instant::now();
        let dumping: IpAddr = "10.9.0.0".parse().expect("address");
        assert!(log.record(dumping, start));
        let flood = |index: u32| IpAddr::from(std::net::Ipv4Addr::from(0x0A0A_0000 + index));
        for index in 0..MAX_SOURCES as u32 {
            log.record(flood(index), start + Duration::from_millis(1));
        }
        assert_eq!(log.runs().by_source.len(), MAX_SOURCES);
        // Full: a new source is refused, the dump's next notification is taken.
        let later = start + Duration::from_secs(10);
        assert!(!log.record(flood(MAX_SOURCES as u32), later));
        assert!(log.record(dumping, later));
        let now = Timestamp::from_second(1_800_000_000).expect("in range");
        assert_eq!(
            log.heard(&[dumping], now, later).map(|h| h.notifications),
            Some(2)
        );
        // Once the flood's runs have ended, a new source is heard again.
        let after_flood = start + Duration::from_secs(40);
        assert!(log.record(flood(MAX_SOURCES as u32), after_flood));
        assert_eq!(log.runs().by_source.len(), 2, "only the live runs are left");
        assert!(log.listening_since(now, later) <= now - Duration::from_secs(10));
    }
}
