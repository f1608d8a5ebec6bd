//! The pods this agent has evicted, left out of the candidates while they have ended
//! here but are still listed. The kubelet's pod workers keep an evicted pod out of the
//! active pods once it is known terminated (`filterOutInactivePods`), even while the API
//! server still lists it; a pod still running is active and may be chosen again (its
//! kill failed, or the kubelet restarted its containers while the delete could not
//! reach the API server). Without this, a pod whose deletion has not reached the API
//! server yet (an outage, a partition: the delete waits in the outbox), or that has no
//! cgroup on this node, would be chosen again at once, every cycle, and the agent would
//! spin on it instead of moving on to the next pod.
//!
//! A pod evicted but still running is given the time the kubelet's eviction gives it
//! before anything else happens: `killPodNow` waits for the kill up to its grace period
//! and a half (at least 10 s), and the eviction manager does nothing else meanwhile.
//! Chosen again within that window, it is not evicted again (no second event, condition
//! or delete) unless the new eviction is harsher, a shorter grace period, as a hard
//! threshold met during a soft eviction's grace is.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::pods::Pod;

/// The least time `killPodNow` waits for a kill.
const MIN_KILL_WAIT: Duration = Duration::from_secs(10);

/// How long after its eviction a pod no longer listed is still known to node-level
/// reclaim as evicted here: the container GC counts a pod as living for as long after
/// its newest sandbox was made, listed or not, and the sandbox was made before.
const RECLAIM_WINDOW: Duration = crate::cri::gc::GONE_POD_MINIMUM_AGE;

/// Evicted pods, by UID (by `namespace/name` for a pod without one, as standalone
/// workloads are).
#[derive(Debug, Default)]
pub struct Evicted {
    pods: BTreeMap<String, Stopping>,
    /// When each pod with a UID was evicted here, on the monotonic clock and in
    /// nanoseconds since the epoch (the runtime's scale), kept past its listing for
    /// node-level reclaim (see [`Evicted::lately`]).
    at: BTreeMap<String, (Instant, i64)>,
}

/// One eviction: the grace period it gave, until when the pod is left to it, whether
/// the pod has been seen without a process since (the kill is done; a pod running after
/// that was started again and is a new run), and whether it has been seen listed since
/// this run of the agent took the eviction on.
#[derive(Debug, Clone, Copy)]
struct Stopping {
    grace_period_seconds: i64,
    until: Instant,
    ended: bool,
    listed: bool,
}

/// How long `killPodNow` waits for a pod stopped with `grace_period_seconds`: the grace
/// period and half again (in whole seconds, as Go divides), at least 10 s.
fn kill_wait(grace_period_seconds: i64) -> Duration {
    let grace = u64::try_from(grace_period_seconds).unwrap_or(0);
    Duration::from_secs(grace.saturating_add(grace / 2)).max(MIN_KILL_WAIT)
}

impl Evicted {
    /// `pod` was evicted at `now` (`wall_nanos`, in nanoseconds since the epoch) with
    /// `grace_period_seconds`: leave it out once it has ended, and to this eviction
    /// until its kill wait is over.
    pub fn remember(
        &mut self,
        pod: &Pod,
        grace_period_seconds: i64,
        now: Instant,
        wall_nanos: i64,
    ) {
        self.insert(identity(pod), grace_period_seconds, now, true);
        if let Some(uid) = &pod.uid {
            self.at.insert(uid.clone(), (now, wall_nanos));
        }
        self.forget_old(now);
    }

    /// The pod with `uid` was evicted by an earlier run of the agent, whose delete this
    /// run sends: it is left to that eviction as if evicted at `now`.
    /// It is kept until the pod is seen listed: the cycles after a start may see no pods
    /// for as long as the API server does not answer, which must not forget it.
    /// Not known to node-level reclaim: when the earlier run evicted it is not known,
    /// and the pod may have been started again since.
    pub fn resume(&mut self, uid: &str, grace_period_seconds: i64, now: Instant) {
        self.insert(uid.to_string(), grace_period_seconds, now, false);
    }

    /// The pods evicted here that node-level reclaim may treat as the kubelet treats a
    /// pod it evicted (`cri::gc::PodsKnown`), by UID, with when they were evicted
    /// (nanoseconds since the epoch): those still listed, and those evicted within
    /// [`RECLAIM_WINDOW`] of `now`. A pod seen running again after it had ended here is
    /// not among them: started again, it is a living pod.
    pub fn lately(&mut self, now: Instant) -> BTreeMap<String, i64> {
        self.forget_old(now);
        self.at
            .iter()
            .map(|(uid, (_, wall_nanos))| (uid.clone(), *wall_nanos))
            .collect()
    }

    /// Forgets for reclaim the pods neither listed nor evicted within the window.
    fn forget_old(&mut self, now: Instant) {
        let pods = &self.pods;
        self.at.retain(|uid, (at, _)| {
            pods.contains_key(uid) || now.saturating_duration_since(*at) < RECLAIM_WINDOW
        });
    }

    fn insert(&mut self, identity: String, grace_period_seconds: i64, now: Instant, listed: bool) {
        self.pods.insert(
            identity,
            Stopping {
                grace_period_seconds,
                until: now + kill_wait(grace_period_seconds),
                ended: false,
                listed,
            },
        );
    }

    /// Whether evicting `pod` with `grace_period_seconds` at `now` would only repeat an
    /// eviction still under way: one as harsh or harsher, whose kill wait is not over,
    /// of a pod not seen ended since.
    pub fn already_stopping(&self, pod: &Pod, grace_period_seconds: i64, now: Instant) -> bool {
        self.pods.get(&identity(pod)).is_some_and(|stopping| {
            !stopping.ended
                && now < stopping.until
                && grace_period_seconds >= stopping.grace_period_seconds
        })
    }

    /// The pods that may be chosen: `listed` without the evicted ones that have
    /// ended here (`running` says whether a pod still has a process on this node). An
    /// evicted pod no longer listed is gone, and forgotten (one resumed after a restart,
    /// once it has been seen listed).
    pub fn active(&mut self, listed: Vec<Pod>, running: impl Fn(&Pod) -> bool) -> Vec<Pod> {
        if self.pods.is_empty() {
            return listed;
        }
        let present: BTreeSet<String> = listed.iter().map(identity).collect();
        self.pods
            .retain(|pod, stopping| present.contains(pod) || !stopping.listed);
        listed
            .into_iter()
            .filter(|pod| match self.pods.get_mut(&identity(pod)) {
                None => true,
                Some(stopping) => {
                    stopping.listed = true;
                    let runs = running(pod);
                    if runs && stopping.ended {
                        // Started again: a new run, no longer an evicted pod's runtime.
                        if let Some(uid) = &pod.uid {
                            self.at.remove(uid);
                        }
                    }
                    stopping.ended |= !runs;
                    runs
                }
            })
            .collect()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.pods.len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

fn identity(pod: &Pod) -> String {
    pod.uid.clone().unwrap_or_else(|| pod.key())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: Option<&str>) -> Pod {
        Pod {
            namespace: "shop".to_string(),
            name: name.to_string(),
            uid: uid.map(str::to_string),
            ..Pod::default()
        }
    }

    fn names(pods: &[Pod]) -> Vec<&str> {
        pods.iter().map(|pod| pod.name.as_str()).collect()
    }

    const ENDED: fn(&Pod) -> bool = |_| false;

    fn now() -> Instant {
        Instant::now()
    }

    #[test]
    fn a_pod_still_stopping_is_not_evicted_again_until_its_kill_wait_is_over() {
        // `killPodNow`: the grace period and half again, at least 10 s.
        let mut evicted = Evicted::default();
        let (db, web) = (pod("db-0", Some("u-db")), pod("web", Some("u-web")));
        let start = now();
        evicted.remember(&db, 30, start, 0);
        let at = |seconds| start + Duration::from_secs(seconds);
        assert!(evicted.already_stopping(&db, 30, at(0)));
        assert!(evicted.already_stopping(&db, 30, at(44)));
        assert!(
            !evicted.already_stopping(&db, 30, at(45)),
            "its kill wait is over"
        );
        assert!(!evicted.already_stopping(&web, 30, at(0)), "another pod");
        // A harsher eviction (a hard threshold met meanwhile) goes ahead, and starts its
        // own wait: 1 s of grace waits the minimum 10 s.
        assert!(!evicted.already_stopping(&db, 1, at(5)));
        evicted.remember(&db, 1, at(5), 0);
        assert!(evicted.already_stopping(&db, 1, at(14)));
        assert!(evicted.already_stopping(&db, 30, at(14)));
        assert!(!evicted.already_stopping(&db, 1, at(15)));
        // Go's integer division: 7 s waits 10 s, 21 s waits 31 s.
        assert_eq!(kill_wait(7), Duration::from_secs(10));
        assert_eq!(kill_wait(21), Duration::from_secs(31));
        assert_eq!(kill_wait(-1), Duration::from_secs(10));
    }

    #[test]
    fn a_pod_seen_ended_and_running_again_is_a_new_run() {
        // Killed locally, its containers started again by the kubelet: the eviction is
        // over, and the new run may be evicted at once.
        let mut evicted = Evicted::default();
        let db = pod("db-0", Some("u-db"));
        let start = now();
        evicted.remember(&db, 1, start, 0);
        assert!(evicted.active(vec![db.clone()], ENDED).is_empty());
        assert_eq!(names(&evicted.active(vec![db.clone()], |_| true)), ["db-0"]);
        assert!(!evicted.already_stopping(&db, 1, start));
    }

    #[test]
    fn an_eviction_resumed_after_a_restart_is_left_to_finish_like_one_made_here() {
        // The delete an earlier run owed is sent again: the pod, killed before the
        // restart, is not chosen again while it is listed; still running, it is not
        // evicted again within its kill wait.
        let mut evicted = Evicted::default();
        let (db, web) = (pod("db-0", Some("u-db")), pod("web", Some("u-web")));
        let start = now();
        evicted.resume("u-db", 1, start);
        assert!(evicted.already_stopping(&db, 1, start + Duration::from_secs(9)));
        assert!(!evicted.already_stopping(&web, 1, start));
        // The cycles before the pod list arrives see no pods (the API server may not
        // answer for minutes): that does not forget it.
        assert!(evicted.active(Vec::new(), ENDED).is_empty());
        let active = evicted.active(vec![db.clone(), web.clone()], ENDED);
        assert_eq!(names(&active), ["web"]);
        // Once seen listed, it is forgotten when it goes, as any evicted pod.
        evicted.active(vec![web.clone()], ENDED);
        assert!(evicted.is_empty());
    }

    /// Node-level reclaim may remove the runtime of the pods evicted here, given with
    /// when they were evicted: while they are listed, and for two minutes after their
    /// eviction when they no longer are. Not a pod without a UID (it has no runtime of its
    /// own to name), one an earlier run evicted (when is not known), nor one seen running
    /// again after it had ended (started again, it is a living pod).
    #[test]
    fn the_pods_evicted_lately_are_known_while_listed_and_for_a_window_after() {
        let mut evicted = Evicted::default();
        let (db, web) = (pod("db-0", Some("u-db")), pod("web", Some("u-web")));
        let start = now();
        evicted.remember(&db, 0, start, 7);
        evicted.remember(&pod("no-uid", None), 0, start, 8);
        evicted.resume("u-old", 0, start);
        let lately = |evicted: &mut Evicted, at| -> Vec<(String, i64)> {
            evicted.lately(at).into_iter().collect()
        };
        assert_eq!(lately(&mut evicted, start), [("u-db".to_string(), 7)]);
        // Still listed (ended): known past the window.
        evicted.active(vec![db.clone(), web.clone()], ENDED);
        assert_eq!(
            lately(&mut evicted, start + Duration::from_secs(121)),
            [("u-db".to_string(), 7)]
        );
        // Seen running again: forgotten.
        evicted.active(vec![db.clone(), web.clone()], |_| true);
        assert!(lately(&mut evicted, start + Duration::from_secs(1)).is_empty());

        // Still running, not yet seen ended (its kill or grace period under way): kept.
        let mut evicted = Evicted::default();
        evicted.remember(&db, 30, start, 7);
        evicted.active(vec![db.clone()], |_| true);
        assert_eq!(lately(&mut evicted, start), [("u-db".to_string(), 7)]);

        // Gone from the list: known until the window ends, then forgotten.
        let mut evicted = Evicted::default();
        evicted.remember(&db, 0, start, 7);
        evicted.active(vec![db.clone()], ENDED);
        evicted.active(vec![web.clone()], ENDED);
        assert_eq!(
            lately(&mut evicted, start + Duration::from_secs(119)),
            [("u-db".to_string(), 7)]
        );
        assert!(lately(&mut evicted, start + Duration::from_secs(120)).is_empty());
        // An eviction forgets the old ones too, so the record stays small without
        // reclaim.
        evicted.remember(&db, 0, start, 7);
        evicted.active(vec![web.clone()], ENDED);
        evicted.remember(&web, 0, start + Duration::from_secs(200), 9);
        assert_eq!(evicted.at.len(), 1);
    }

    #[test]
    fn an_evicted_pod_that_ended_is_left_out_while_it_is_still_listed() {
        let mut evicted = Evicted::default();
        let (db, web) = (pod("db-0", Some("u-db")), pod("web", Some("u-web")));
        evicted.remember(&db, 30, now(), 0);
        for _ in 0..3 {
            let active = evicted.active(vec![db.clone(), web.clone()], ENDED);
            assert_eq!(names(&active), ["web"]);
        }
    }

    #[test]
    fn an_evicted_pod_still_running_may_be_chosen_again() {
        // Its kill failed, or its containers were started again: it is active, as the
        // kubelet's pod workers count a pod not yet known terminated.
        let mut evicted = Evicted::default();
        let db = pod("db-0", Some("u-db"));
        evicted.remember(&db, 30, now(), 0);
        let active = evicted.active(vec![db.clone()], |_| true);
        assert_eq!(names(&active), ["db-0"]);
        // Once it has ended it is left out again.
        assert!(evicted.active(vec![db], ENDED).is_empty());
    }

    #[test]
    fn an_evicted_pod_that_went_is_forgotten_and_a_new_pod_of_its_name_is_active() {
        let mut evicted = Evicted::default();
        evicted.remember(&pod("db-0", Some("u-old")), 30, now(), 0);
        assert!(evicted.active(vec![pod("web", Some("u-web"))], ENDED).len() == 1);
        assert!(evicted.is_empty(), "the evicted pod ended and is forgotten");
        // The StatefulSet's replacement has the same name and a new UID.
        evicted.remember(&pod("db-0", Some("u-old")), 30, now(), 0);
        let active = evicted.active(vec![pod("db-0", Some("u-new"))], ENDED);
        assert_eq!(names(&active), ["db-0"]);
    }

    #[test]
    fn a_pod_without_a_uid_is_known_by_its_name() {
        let mut evicted = Evicted::default();
        evicted.remember(&pod("job", None), 30, now(), 0);
        assert!(evicted.active(vec![pod("job", None)], ENDED).is_empty());
        assert_eq!(evicted.len(), 1);
    }
}
