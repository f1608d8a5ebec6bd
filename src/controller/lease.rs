//! Leader election over a `coordination.k8s.io` Lease, so two replicas never act
//! together. The rules are client-go's: a Lease another replica holds is taken over only
//! after it has gone unrenewed for its `leaseDurationSeconds`, measured on our own
//! monotonic clock from when we last saw it change (so clock skew between replicas cannot
//! shorten it); every write is guarded by the Lease's resourceVersion; and a leader that
//! could not renew within `renewDeadline` (shorter than the lease duration) stops acting
//! before anyone may take over.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};

use super::policy::LeaderElectionPolicy;
use super::resource::FIELD_MANAGER;

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
            policy,
            identity,
            observed: None,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    fn spec(&self, now: Timestamp, previous: Option<&LeaseSpec>, take: bool) -> LeaseSpec {
        let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.policy.lease_duration.as_secs().max(1) as i32),
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
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
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

    /// Waits until this replica leads.
    pub async fn acquire(&mut self) {
        loop {
            match self.try_acquire_or_renew().await {
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
    /// replica holds the Lease, or no renewal succeeded within `renewDeadline`.
    pub async fn hold(&mut self) -> String {
        let mut last_renewed = Instant::now();
        loop {
            tokio::time::sleep(self.policy.renew_interval).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_renewed = Instant::now(),
                Ok(false) => return "another replica holds the leader Lease".to_string(),
                Err(error) => {
                    tracing::warn!(%error, "renewing the leader Lease failed");
                    if last_renewed.elapsed() >= self.policy.renew_deadline {
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
