//! Leader election over a `coordination.k8s.io` Lease, so two replicas never act
//! together. The rules are client-go's: a Lease another replica holds is taken over only
//! after it has gone unrenewed for its `leaseDurationSeconds`, measured on our own
//! monotonic clock from when we last saw it change (so clock skew between replicas cannot
//! shorten it); every write is guarded by the Lease's resourceVersion; and a leader that
//! could not renew within `renewDeadline` (shorter than the lease duration) stops acting
//! before anyone may take over.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};

use super::policy::LeaderElectionPolicy;
use super::resource::FIELD_MANAGER;
use super::storm::StormMemory;

/// The Lease annotation that carries the storm guard's memory across a restart or a
/// failover: a cooldown must not end early because the leader changed.
pub const STORM_ANNOTATION: &str = "fencing.nodekeeper.io/storm-guard";

/// Whether this replica may act now: it renewed the Lease less than `renewDeadline` ago,
/// counted from when the renewal was sent. Shared with every reconcile, which checks it
/// before each write.
#[derive(Debug)]
pub struct Leadership {
    renewed: Mutex<Option<Instant>>,
    deadline: Duration,
    /// The storm guard's memory as the reconciles last left it, written into the Lease
    /// with each renewal.
    pub storm: Mutex<Option<StormMemory>>,
}

impl Leadership {
    pub fn new(deadline: Duration) -> Leadership {
        Leadership {
            renewed: Mutex::new(None),
            deadline,
            storm: Mutex::new(None),
        }
    }

    pub fn is_leading(&self) -> bool {
        self.renewed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|at| at.elapsed() < self.deadline)
    }

    fn renewed_at(&self, sent: Instant) {
        *self.renewed.lock().unwrap_or_else(PoisonError::into_inner) = Some(sent);
    }

    fn last_renewed(&self) -> Option<Instant> {
        *self.renewed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn resign(&self) {
        *self.renewed.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    fn storm_text(&self) -> Option<String> {
        let memory = (*self.storm.lock().unwrap_or_else(PoisonError::into_inner))?;
        serde_json::to_string(&memory).ok()
    }
}

/// The storm memory a Lease carries, if it carries a readable one.
pub fn storm_memory_of(lease: &Lease) -> Option<StormMemory> {
    let text = lease.metadata.annotations.as_ref()?.get(STORM_ANNOTATION)?;
    serde_json::from_str(text).ok()
}

/// What to do with the Lease as it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseStep {
    /// No Lease yet: create it, holding it.
    Create,
    /// We hold it: renew it.
    Renew,
    /// Nobody holds it, or its holder stopped renewing: take it over.
    TakeOver,
    /// Another replica holds it and renews it.
    Wait,
}

/// The decision, given the Lease and how long (on our clock) it has gone unchanged.
pub fn lease_step(
    lease: Option<&LeaseSpec>,
    identity: &str,
    unchanged_for: Duration,
    default_duration: Duration,
) -> LeaseStep {
    let Some(spec) = lease else {
        return LeaseStep::Create;
    };
    match spec.holder_identity.as_deref() {
        Some(holder) if holder == identity => LeaseStep::Renew,
        None | Some("") => LeaseStep::TakeOver,
        Some(_) => {
            let duration = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(default_duration, Duration::from_secs);
            if unchanged_for >= duration {
                LeaseStep::TakeOver
            } else {
                LeaseStep::Wait
            }
        }
    }
}

/// One replica's side of the election.
pub struct LeaderElector {
    api: Api<Lease>,
    policy: LeaderElectionPolicy,
    identity: String,
    /// The Lease's resourceVersion when we last saw it change, and when that was.
    observed: Option<(String, Instant)>,
    leadership: Arc<Leadership>,
    /// The storm memory the Lease carried when we took it.
    inherited_storm: Option<StormMemory>,
}

impl LeaderElector {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        policy: LeaderElectionPolicy,
        identity: String,
    ) -> LeaderElector {
        LeaderElector {
            api: Api::namespaced(client, namespace),
            leadership: Arc::new(Leadership::new(policy.renew_deadline)),
            policy,
            identity,
            observed: None,
            inherited_storm: None,
        }
    }

    pub fn leadership(&self) -> Arc<Leadership> {
        self.leadership.clone()
    }

    /// The storm guard's memory the previous leader left in the Lease.
    pub fn inherited_storm(&self) -> Option<StormMemory> {
        self.inherited_storm
    }

    fn spec(&self, now: Timestamp, previous: Option<&LeaseSpec>, take: bool) -> LeaseSpec {
        let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            // Rounded up: a Lease must never claim less time than the leader keeps it.
            lease_duration_seconds: Some(
                i32::try_from(self.policy.lease_duration.as_secs_f64().ceil().max(1.0) as u64)
                    .unwrap_or(i32::MAX),
            ),
            acquire_time: if take {
                Some(MicroTime(now))
            } else {
                previous.and_then(|p| p.acquire_time.clone())
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(if take && previous.is_some() {
                transitions + 1
            } else {
                transitions
            }),
            ..LeaseSpec::default()
        }
    }

    /// One round: acquire, renew or wait. `Ok(true)` while we lead.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let name = self.policy.lease_name.clone();
        let current = self.api.get_opt(&name).await?;
        let unchanged_for = match (&current, &self.observed) {
            (Some(lease), Some((version, since)))
                if lease.metadata.resource_version.as_ref() == Some(version) =>
            {
                since.elapsed()
            }
            (Some(lease), _) => {
                self.observed = lease
                    .metadata
                    .resource_version
                    .clone()
                    .map(|version| (version, Instant::now()));
                Duration::ZERO
            }
            (None, _) => Duration::ZERO,
        };
        let spec = current.as_ref().and_then(|lease| lease.spec.as_ref());
        let step = lease_step(
            spec,
            &self.identity,
            unchanged_for,
            self.policy.lease_duration,
        );
        if step != LeaseStep::Renew {
            self.inherited_storm = current.as_ref().and_then(storm_memory_of);
        }
        let storm = self.leadership.storm_text();
        let now = Timestamp::now();
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        let result = match step {
            LeaseStep::Wait => return Ok(false),
            LeaseStep::Create => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        annotations: storm
                            .map(|text| [(STORM_ANNOTATION.to_string(), text)].into()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(self.spec(now, None, true)),
                };
                self.api.create(&params, &lease).await
            }
            LeaseStep::Renew | LeaseStep::TakeOver => {
                let Some(mut lease) = current.clone() else {
                    return Ok(false);
                };
                let take = step == LeaseStep::TakeOver;
                if take {
                    tracing::warn!(
                        lease = %name,
                        previous = spec.and_then(|s| s.holder_identity.as_deref()).unwrap_or(""),
                        "taking over the leader Lease"
                    );
                }
                lease.spec = Some(self.spec(now, lease.spec.as_ref(), take));
                if let Some(text) = storm {
                    lease
                        .metadata
                        .annotations
                        .get_or_insert_with(Default::default)
                        .insert(STORM_ANNOTATION.to_string(), text);
                }
                // The object carries the resourceVersion we read: a concurrent writer
                // makes this fail with 409 instead of both believing they lead.
                self.api.replace(&name, &params, &lease).await
            }
        };
        match result {
            Ok(lease) => {
                self.observed = lease
                    .metadata
                    .resource_version
                    .map(|version| (version, Instant::now()));
                Ok(true)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// One round, bounded: a request the API server never answers must not keep a
    /// leader believing it leads. The renewal counts from when it was sent.
    async fn round(&mut self, limit: Duration) -> Result<bool, String> {
        let sent = Instant::now();
        match tokio::time::timeout(limit, self.try_acquire_or_renew()).await {
            Ok(Ok(true)) => {
                self.leadership.renewed_at(sent);
                Ok(true)
            }
            Ok(Ok(false)) => Ok(false),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("no answer within {:.1}s", limit.as_secs_f64())),
        }
    }

    /// Waits until this replica leads.
    pub async fn acquire(&mut self) {
        loop {
            match self.round(self.policy.renew_deadline).await {
                Ok(true) => {
                    tracing::info!(identity = %self.identity, lease = %self.policy.lease_name, "leading");
                    return;
                }
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, "reading the leader Lease failed"),
            }
            tokio::time::sleep(self.policy.renew_interval).await;
        }
    }

    /// Renews while we lead; returns (with the reason) once we no longer may act: another
    /// replica holds the Lease, or no renewal succeeded within `renewDeadline` (each
    /// round is cut off at that deadline, so a hung request cannot stretch it).
    pub async fn hold(&mut self) -> String {
        let mut last_renewed = self.leadership.last_renewed().unwrap_or_else(Instant::now);
        loop {
            tokio::time::sleep(self.policy.renew_interval).await;
            let left = self
                .policy
                .renew_deadline
                .saturating_sub(last_renewed.elapsed());
            let sent = Instant::now();
            match self.round(left.max(Duration::from_millis(1))).await {
                Ok(true) => last_renewed = sent,
                Ok(false) => {
                    self.leadership.resign();
                    return "another replica holds the leader Lease".to_string();
                }
                Err(error) => {
                    tracing::warn!(%error, "renewing the leader Lease failed");
                    if last_renewed.elapsed() >= self.policy.renew_deadline {
                        self.leadership.resign();
                        return format!(
                            "the leader Lease could not be renewed for {}s ({error})",
                            self.policy.renew_deadline.as_secs()
                        );
                    }
                }
            }
        }
    }

    /// Gives the Lease up (on a clean stop), so another replica takes over at once.
    pub async fn release(&mut self) {
        self.leadership.resign();
        let name = self.policy.lease_name.clone();
        let Ok(Some(mut lease)) = self.api.get_opt(&name).await else {
            return;
        };
        let ours = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some(self.identity.as_str());
        if !ours {
            return;
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
        }
        if let Some(text) = self.leadership.storm_text() {
            lease
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(STORM_ANNOTATION.to_string(), text);
        }
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        if let Err(error) = self.api.replace(&name, &params, &lease).await {
            tracing::warn!(%error, "could not release the leader Lease; it expires by itself");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(holder: &str, seconds: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.to_string()),
            lease_duration_seconds: Some(seconds),
            ..LeaseSpec::default()
        }
    }

    const DEFAULT: Duration = Duration::from_secs(15);

    #[test]
    fn a_missing_lease_is_created_and_our_own_renewed() {
        assert_eq!(
            lease_step(None, "me", Duration::ZERO, DEFAULT),
            LeaseStep::Create
        );
        assert_eq!(
            lease_step(
                Some(&held_by("me", 15)),
                "me",
                Duration::from_secs(99),
                DEFAULT
            ),
            LeaseStep::Renew
        );
    }

    #[test]
    fn another_holder_is_waited_for_until_its_lease_ran_out_on_our_clock() {
        let other = held_by("other", 15);
        assert_eq!(
            lease_step(Some(&other), "me", Duration::from_secs(14), DEFAULT),
            LeaseStep::Wait
        );
        assert_eq!(
            lease_step(Some(&other), "me", Duration::from_secs(15), DEFAULT),
            LeaseStep::TakeOver
        );
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        let released = LeaseSpec {
            holder_identity: None,
            ..LeaseSpec::default()
        };
        assert_eq!(
            lease_step(Some(&released), "me", Duration::ZERO, DEFAULT),
            LeaseStep::TakeOver
        );
    }
}
