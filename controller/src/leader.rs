//! Leader election with a coordination.k8s.io Lease, so that only one replica reconciles.
//!
//! The holder renews the Lease every `retry` period; others take it over once it has not been renewed for
//! `lease_duration`. Every write carries the resourceVersion it read, so two candidates can never both win
//! (the apiserver rejects the second with a conflict). A leader that cannot renew within `renew_deadline`
//! steps down before its Lease can expire. On shutdown the leader releases the Lease for a fast handover.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use jiff::Timestamp;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use tokio::sync::watch;

use crate::{Error, Result};

#[derive(Clone, Debug)]
pub struct LeaderElection {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub timing: LeaseTiming,
    /// Read right before every write.
    pub leadership: Arc<Leadership>,
}

/// Whether this replica may write, from the instant of its last successful renewal: a replica that was
/// frozen or cut off finds on its own clock that the renewal is too old, before any other replica can have
/// taken the Lease (`renew_deadline` < `lease_duration`), and without waiting for its campaign to notice.
#[derive(Debug)]
pub struct Leadership {
    renewed: Mutex<Option<Instant>>,
    renew_deadline: Duration,
    /// A campaign attempt has read the Lease: this replica knows whether it leads.
    known: std::sync::atomic::AtomicBool,
}

impl Leadership {
    fn new(renew_deadline: Duration) -> Self {
        Self {
            renewed: Mutex::new(None),
            renew_deadline,
            known: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether a campaign attempt has ended (readiness waits for it).
    pub fn known(&self) -> bool {
        self.known.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn leading(&self) -> bool {
        let renewed = *self.renewed.lock().unwrap_or_else(|e| e.into_inner());
        renewed.is_some_and(|t| t.elapsed() < self.renew_deadline)
    }

    fn set(&self, renewed: Option<Instant>) {
        *self.renewed.lock().unwrap_or_else(|e| e.into_inner()) = renewed;
    }
}

/// How long a Lease lasts, how long a leader keeps writing without renewing it, and how often replicas try:
/// `retry < renew_deadline < lease_duration` (kube-controller-manager's rule), so a leader stops writing before
/// another replica can take the Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTiming {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(10),
            renew_deadline: Duration::from_secs(7),
            retry: Duration::from_secs(2),
        }
    }
}

impl LeaseTiming {
    pub fn checked(self) -> Result<Self> {
        match self.retry < self.renew_deadline && self.renew_deadline < self.lease_duration {
            true => Ok(self),
            false => Err(Error::LeaseTiming(self)),
        }
    }
}

impl LeaderElection {
    pub fn new(namespace: String, name: String, identity: String) -> Self {
        Self::with_timing(namespace, name, identity, LeaseTiming::default())
    }

    /// `timing` must be `checked()`.
    pub fn with_timing(namespace: String, name: String, identity: String, timing: LeaseTiming) -> Self {
        Self {
            namespace,
            name,
            identity,
            timing,
            leadership: Arc::new(Leadership::new(timing.renew_deadline)),
        }
    }

    /// Campaigns until `shutdown`; `leader` tells whether this replica holds the Lease right now.
    pub async fn run(self, client: Client, leader: watch::Sender<bool>, mut shutdown: watch::Receiver<bool>) {
        let api: Api<Lease> = Api::namespaced(client, &self.namespace);
        loop {
            // One attempt never outlasts the renew deadline: a hung request must not keep a leader leading.
            let started = Instant::now();
            let attempt =
                tokio::time::timeout(self.timing.renew_deadline, self.try_acquire_or_renew(&api)).await;
            let held = match attempt {
                Ok(Ok(held)) => {
                    // The Lease counts from when the renewal was sent, not from when its answer came.
                    self.leadership.set(held.then_some(started));
                    self.leadership
                        .known
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                    held
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, lease = %self.name, "leader election: lease not updated");
                    self.leadership.leading()
                }
                Err(_) => {
                    tracing::warn!(lease = %self.name, "leader election: renewal timed out");
                    self.leadership.leading()
                }
            };
            if !held {
                self.leadership.set(None);
            }
            if held != *leader.borrow() {
                tracing::info!(identity = %self.identity, leader = held, "leadership changed");
                let _ = leader.send(held);
            }
            tokio::select! {
                _ = shutdown.wait_for(|s| *s) => break,
                _ = tokio::time::sleep(self.timing.retry) => {}
            }
        }
        if *leader.borrow() {
            self.leadership.set(None);
            self.release(&api).await;
            let _ = leader.send(false);
        }
    }

    async fn try_acquire_or_renew(&self, api: &Api<Lease>) -> Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let duration_secs = i32::try_from(self.timing.lease_duration.as_secs()).unwrap_or(15);
        let Some(mut lease) = api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.is_conflict() || s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let expired = spec.renew_time.as_ref().is_none_or(|t| {
            let ttl = jiff::SignedDuration::from_secs(i64::from(
                spec.lease_duration_seconds.unwrap_or(duration_secs),
            ));
            t.0.checked_add(ttl).is_ok_and(|until| until < now.0)
        });
        let mine = holder == self.identity;
        if !mine && !holder.is_empty() && !expired {
            return Ok(false);
        }
        let mut next = spec.clone();
        if !mine {
            next.acquire_time = Some(now.clone());
            next.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        next.holder_identity = Some(self.identity.clone());
        next.lease_duration_seconds = Some(duration_secs);
        next.renew_time = Some(now);
        lease.spec = Some(next);
        // `replace` sends the resourceVersion read above: a concurrent winner makes this a conflict.
        match api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn release(&self, api: &Api<Lease>) {
        let Ok(Some(mut lease)) = api.get_opt(&self.name).await else {
            return;
        };
        if lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) != Some(self.identity.as_str()) {
            return;
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.renew_time = None;
        }
        match api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => tracing::info!(lease = %self.name, "leadership released"),
            Err(error) => tracing::warn!(%error, "leadership not released; it expires on its own"),
        }
    }
}
