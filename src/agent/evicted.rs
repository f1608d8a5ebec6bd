//! The pods this agent has evicted and not yet seen go: the kubelet's pod workers mark an
//! evicted pod "termination requested", and its active-pods list leaves such a pod out
//! from then on (`filterOutInactivePods`), so the pod is never chosen twice. Without
//! this, a pod whose deletion has not reached the API server yet (an outage, a
//! partition: the delete waits in the outbox), or whose emptied cgroup the runtime
//! leaves behind, would be chosen again at once, every cycle, and the agent would spin
//! on it instead of moving on to the next pod.

use std::collections::BTreeSet;

use crate::pods::Pod;

/// Evicted pods, by UID (by `namespace/name` for a pod without one).
#[derive(Debug, Default)]
pub struct Evicted {
    pods: BTreeSet<String>,
}

impl Evicted {
    /// `pod` was evicted: leave it out from now on.
    pub fn remember(&mut self, pod: &Pod) {
        self.pods.insert(identity(pod));
    }

    /// The pods that may still be chosen: `listed` without the evicted ones. An evicted
    /// pod no longer listed has ended, and is forgotten.
    pub fn active(&mut self, listed: Vec<Pod>) -> Vec<Pod> {
        if self.pods.is_empty() {
            return listed;
        }
        let present: BTreeSet<String> = listed.iter().map(identity).collect();
        self.pods.retain(|pod| present.contains(pod));
        listed
            .into_iter()
            .filter(|pod| !self.pods.contains(&identity(pod)))
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

    #[test]
    fn an_evicted_pod_is_left_out_while_it_is_still_listed() {
        let mut evicted = Evicted::default();
        let (db, web) = (pod("db-0", Some("u-db")), pod("web", Some("u-web")));
        evicted.remember(&db);
        for _ in 0..3 {
            let active = evicted.active(vec![db.clone(), web.clone()]);
            assert_eq!(names(&active), ["web"]);
        }
    }

    #[test]
    fn an_evicted_pod_that_went_is_forgotten_and_a_new_pod_of_its_name_is_active() {
        let mut evicted = Evicted::default();
        evicted.remember(&pod("db-0", Some("u-old")));
        assert!(evicted.active(vec![pod("web", Some("u-web"))]).len() == 1);
        assert!(evicted.is_empty(), "the evicted pod ended and is forgotten");
        // The StatefulSet's replacement has the same name and a new UID.
        evicted.remember(&pod("db-0", Some("u-old")));
        let active = evicted.active(vec![pod("db-0", Some("u-new"))]);
        assert_eq!(names(&active), ["db-0"]);
    }

    #[test]
    fn a_pod_without_a_uid_is_known_by_its_name() {
        let mut evicted = Evicted::default();
        evicted.remember(&pod("job", None));
        assert!(evicted.active(vec![pod("job", None)]).is_empty());
        assert_eq!(evicted.len(), 1);
    }
}
