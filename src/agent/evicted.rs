//! The pods this agent has evicted, left out of the candidates while they have ended
//! here but are still listed. The kubelet's pod workers keep an evicted pod out of the
//! active pods once it is known terminated (`filterOutInactivePods`), even while the API
//! server still lists it; a pod still running is active and may be chosen again (its
//! kill failed, or the kubelet restarted its containers while the delete could not
//! reach the API server). Without this, a pod whose deletion has not reached the API
//! server yet (an outage, a partition: the delete waits in the outbox), or that has no
//! cgroup on this node, would be chosen again at once, every cycle, and the agent would
//! spin on it instead of moving on to the next pod.

use std::collections::BTreeSet;

use crate::pods::Pod;

/// Evicted pods, by UID (by `namespace/name` for a pod without one, as standalone
/// workloads are).
#[derive(Debug, Default)]
pub struct Evicted {
    pods: BTreeSet<String>,
}

impl Evicted {
    /// `pod` was evicted: leave it out from now on.
    pub fn remember(&mut self, pod: &Pod) {
        self.pods.insert(identity(pod));
    }

    /// The pods that may be chosen: `listed` without the evicted ones that have ended
    /// here (`running` says whether a pod still has a process on this node). An evicted
    /// pod no longer listed is gone, and forgotten.
    pub fn active(&mut self, listed: Vec<Pod>, running: impl Fn(&Pod) -> bool) -> Vec<Pod> {
        if self.pods.is_empty() {
            return listed;
        }
        let present: BTreeSet<String> = listed.iter().map(identity).collect();
        self.pods.retain(|pod| present.contains(pod));
        listed
            .into_iter()
            .filter(|pod| !self.pods.contains(&identity(pod)) || running(pod))
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

    #[test]
    fn an_evicted_pod_that_ended_is_left_out_while_it_is_still_listed() {
        let mut evicted = Evicted::default();
        let (db, web) = (pod("db-0", Some("u-db")), pod("web", Some("u-web")));
        evicted.remember(&db);
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
        evicted.remember(&db);
        let active = evicted.active(vec![db.clone()], |_| true);
        assert_eq!(names(&active), ["db-0"]);
        // Once it has ended it is left out again.
        assert!(evicted.active(vec![db], ENDED).is_empty());
    }

    #[test]
    fn an_evicted_pod_that_went_is_forgotten_and_a_new_pod_of_its_name_is_active() {
        let mut evicted = Evicted::default();
        evicted.remember(&pod("db-0", Some("u-old")));
        assert!(evicted.active(vec![pod("web", Some("u-web"))], ENDED).len() == 1);
        assert!(evicted.is_empty(), "the evicted pod ended and is forgotten");
        // The StatefulSet's replacement has the same name and a new UID.
        evicted.remember(&pod("db-0", Some("u-old")));
        let active = evicted.active(vec![pod("db-0", Some("u-new"))], ENDED);
        assert_eq!(names(&active), ["db-0"]);
    }

    #[test]
    fn a_pod_without_a_uid_is_known_by_its_name() {
        let mut evicted = Evicted::default();
        evicted.remember(&pod("job", None));
        assert!(evicted.active(vec![pod("job", None)], ENDED).is_empty());
        assert_eq!(evicted.len(), 1);
    }
}
