//! Kubernetes Events (`events.k8s.io/v1`) about RayServices, one per thing that happened.
//!
//! kube-runtime's recorder folds every event with the same reason and object into one series and keeps the
//! first note, so nine of ten traffic steps would vanish from `kubectl get events`. Here the note is part of
//! the key: only the very same message repeated (a condition that persists) becomes a series.

use std::collections::HashMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event as K8sEvent, events::v1::EventSeries},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use tokio::sync::{mpsc, oneshot};

/// Repeats of one message after this long start a new Event (as `kubectl` users expect from Kubernetes).
const SERIES_TTL: SignedDuration = SignedDuration::from_mins(6);

/// Events waiting to be written per publishing task (client-go's broadcaster holds 1,000).
const QUEUE_LENGTH: usize = 1024;

/// Tasks writing Events, each its own objects'.
const PUBLISHERS: usize = 4;

/// Normal or Warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One thing that happened to an object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Occurrence {
    pub type_: EventType,
    pub reason: String,
    pub action: String,
    pub note: String,
}

struct Published {
    name: String,
    count: i32,
    last: Timestamp,
}

/// An Event to write, stamped when it happened (not when its turn to be written comes).
struct Pending {
    regarding: ObjectReference,
    occurrence: Occurrence,
    at: Timestamp,
}

/// Why an Event was not queued (it is never written).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dropped {
    /// Its publishing task has this many Events waiting already.
    QueueFull,
    /// Its publishing task is gone (the runtime is shutting down).
    PublisherGone,
}

impl Dropped {
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::QueueFull => "the queue of Events to write is full",
            Dropped::PublisherGone => "the task writing Events has stopped",
        }
    }
}

/// What the publishing task is asked to do, in order.
enum Queued {
    Publish(Box<Pending>),
    Forget(String),
    Flush(oneshot::Sender<()>),
}

/// Events queued for tasks that publish them in order per object, as client-go's broadcaster does: a pass
/// never waits for an Event's write (a slow or failing Events API would hold reconcile slots), and a full
/// queue drops Events rather than stalling passes. An object's Events all go to one task (its series are that
/// task's); a few tasks keep a burst (1,000 RayServices starting) draining.
pub struct EventLog {
    queues: Vec<mpsc::Sender<Queued>>,
}

impl EventLog {
    /// Starts the publishing tasks (inside a Tokio runtime).
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        let instance = instance.unwrap_or_else(|| controller.to_string());
        let queues = (0..PUBLISHERS)
            .map(|_| {
                let publisher = Publisher {
                    client: client.clone(),
                    controller: controller.to_string(),
                    instance: instance.clone(),
                    series: Series::default(),
                };
                let (queue, queued) = mpsc::channel(QUEUE_LENGTH);
                tokio::spawn(publisher.run(queued));
                queue
            })
            .collect();
        Self { queues }
    }

    /// Queues the Event, or says why it was dropped.
    pub fn record(&self, regarding: ObjectReference, occurrence: Occurrence) -> Result<(), Dropped> {
        let queue = self.queue_of(regarding.uid.as_deref().unwrap_or_default());
        let pending = Pending {
            regarding,
            occurrence,
            at: Timestamp::now(),
        };
        queue
            .try_send(Queued::Publish(Box::new(pending)))
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => Dropped::QueueFull,
                mpsc::error::TrySendError::Closed(_) => Dropped::PublisherGone,
            })
    }

    /// Forgets the series of an object that is gone (after its Events queued before).
    pub fn forget(&self, uid: &str) {
        let _ = self.queue_of(uid).try_send(Queued::Forget(uid.to_string()));
    }

    /// Waits until every Event queued so far is written (or failed), up to `timeout`: before the process exits.
    pub async fn flush(&self, timeout: std::time::Duration) {
        let flushed = self.queues.iter().map(|queue| async move {
            let (done, written) = oneshot::channel();
            if queue.send(Queued::Flush(done)).await.is_ok() {
                let _ = written.await;
            }
        });
        let _ = tokio::time::timeout(timeout, futures::future::join_all(flushed)).await;
    }

    fn queue_of(&self, uid: &str) -> &mpsc::Sender<Queued> {
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(uid, &mut hasher);
        let shard = std::hash::Hasher::finish(&hasher) as usize % self.queues.len();
        &self.queues[shard]
    }
}

/// Publishes Events as `controller` (and `instance`, the Pod); owned by the publishing task.
struct Publisher {
    client: Client,
    controller: String,
    instance: String,
    series: Series,
}

/// The Events published within the TTL, by object uid then message: a lookup per Event and forgetting an
/// object stay O(1) with thousands of RayServices; expired entries go in a sweep at most once per minute.
#[derive(Default)]
struct Series {
    by_object: HashMap<String, HashMap<Occurrence, Published>>,
    swept: Option<Timestamp>,
}

/// How often expired series are swept out (their lookups already ignore them).
const SWEEP_EVERY: SignedDuration = SignedDuration::from_mins(1);

impl Series {
    /// The Event to extend and its next count, if this message was published within the TTL.
    fn repeat_of(&mut self, uid: &str, occurrence: &Occurrence, now: Timestamp) -> Option<(String, i32)> {
        self.sweep(now);
        let p = self.by_object.get(uid)?.get(occurrence)?;
        live(p, now).then(|| (p.name.clone(), p.count + 1))
    }

    fn insert(&mut self, uid: String, occurrence: Occurrence, published: Published) {
        self.by_object
            .entry(uid)
            .or_default()
            .insert(occurrence, published);
    }

    fn forget(&mut self, uid: &str) {
        self.by_object.remove(uid);
    }

    fn sweep(&mut self, now: Timestamp) {
        if self.swept.is_some_and(|at| now.duration_since(at) < SWEEP_EVERY) {
            return;
        }
        self.swept = Some(now);
        self.by_object.retain(|_, messages| {
            messages.retain(|_, p| live(p, now));
            !messages.is_empty()
        });
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_object.values().map(HashMap::len).sum()
    }
}

fn live(p: &Published, now: Timestamp) -> bool {
    now.duration_since(p.last) < SERIES_TTL
}

impl Publisher {
    async fn run(mut self, mut queued: mpsc::Receiver<Queued>) {
        while let Some(item) = queued.recv().await {
            match item {
                Queued::Publish(pending) => {
                    let Pending {
                        regarding,
                        occurrence,
                        at,
                    } = *pending;
                    let reason = occurrence.reason.clone();
                    if let Err(error) = self.publish(&regarding, occurrence, at).await {
                        tracing::warn!(%error, reason, "event not recorded");
                    }
                }
                Queued::Forget(uid) => self.series.forget(&uid),
                Queued::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    }

    /// Creates the Event, or counts a repeat of the same message within the TTL into its series.
    async fn publish(
        &mut self,
        regarding: &ObjectReference,
        occurrence: Occurrence,
        now: Timestamp,
    ) -> kube::Result<()> {
        let uid = regarding.uid.clone().unwrap_or_default();
        let repeat = self.series.repeat_of(&uid, &occurrence, now);
        let count = repeat.as_ref().map_or(1, |(_, count)| *count);
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        let name = match repeat {
            Some((name, count)) => {
                let series = EventSeries {
                    count,
                    last_observed_time: MicroTime(now),
                };
                let patch = serde_json::json!({"series": series});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                name
            }
            None => {
                let event = self.event(regarding, &occurrence, now);
                api.create(&PostParams::default(), &event)
                    .await?
                    .metadata
                    .name
                    .unwrap_or_default()
            }
        };
        let published = Published {
            name,
            count,
            last: now,
        };
        self.series.insert(uid, occurrence, published);
        Ok(())
    }

    fn event(&self, regarding: &ObjectReference, o: &Occurrence, now: Timestamp) -> K8sEvent {
        let object = regarding.name.as_deref().unwrap_or(&self.controller);
        K8sEvent {
            metadata: ObjectMeta {
                // As kubectl and client-go name them: object name and a unique suffix.
                name: Some(format!("{object}.{:x}", now.as_nanosecond())),
                namespace: regarding.namespace.clone(),
                ..ObjectMeta::default()
            },
            action: Some(o.action.clone()),
            reason: Some(o.reason.clone()),
            note: Some(within_note_limit(&o.note).to_string()),
            type_: Some(o.type_.as_str().to_string()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..K8sEvent::default()
        }
    }
}

/// The apiserver refuses an Event whose note is over 1 KiB (an error message can be longer): cut at a
/// character boundary instead of losing the Event.
const NOTE_LIMIT: usize = 1024;

fn within_note_limit(note: &str) -> &str {
    // str::floor_char_boundary would do this, but only from Rust 1.91 (the workspace's MSRV is 1.89).
    let mut end = note.len().min(NOTE_LIMIT);
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    &note[..end]
}

#[cfg(test)]
mod tests {
    use std::{
        convert::Infallible,
        sync::{Arc, Mutex},
        time::Duration,
    };

    use kube::client::Body;

    use super::*;

    type Requests = Arc<Mutex<Vec<(String, String)>>>;

    /// A client whose apiserver answers every request with an Event named `llm.1`, and notes each request.
    fn answering(requests: Requests) -> Client {
        let service = tower::service_fn(move |req: http::Request<Body>| {
            requests
                .lock()
                .unwrap()
                .push((req.method().to_string(), req.uri().path().to_string()));
            let event = serde_json::json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "llm.1"}});
            let body = Body::from(serde_json::to_vec(&event).unwrap());
            async move { Ok::<_, Infallible>(http::Response::new(body)) }
        });
        Client::new(service, "default")
    }

    fn regarding(uid: &str) -> ObjectReference {
        ObjectReference {
            name: Some("llm".into()),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            ..ObjectReference::default()
        }
    }

    fn step(note: &str) -> Occurrence {
        Occurrence {
            type_: EventType::Normal,
            reason: "UpdatedHTTPRoute".into(),
            action: "Update".into(),
            note: note.into(),
        }
    }

    #[tokio::test]
    async fn queued_events_are_written_in_order_and_a_repeat_extends_its_series() {
        let requests = Requests::default();
        let log = EventLog::new(answering(requests.clone()), "rayshift", None);
        for note in ["25 to 50", "25 to 50", "50 to 75"] {
            assert_eq!(log.record(regarding("u1"), step(note)), Ok(()));
        }
        log.flush(Duration::from_secs(5)).await;
        let events = "/apis/events.k8s.io/v1/namespaces/ns/events";
        let expected = [
            ("POST".to_string(), events.to_string()),
            ("PATCH".to_string(), format!("{events}/llm.1")),
            ("POST".to_string(), events.to_string()),
        ];
        assert_eq!(*requests.lock().unwrap(), expected);
    }

    #[tokio::test]
    async fn a_full_queue_drops_events_instead_of_waiting() {
        // An apiserver that never answers: the first Event's write hangs, the rest queue up.
        let service = tower::service_fn(|_: http::Request<Body>| {
            std::future::pending::<Result<http::Response<Body>, Infallible>>()
        });
        let log = EventLog::new(Client::new(service, "default"), "rayshift", None);
        let accepted = (0..QUEUE_LENGTH + 2)
            .take_while(|i| log.record(regarding("u1"), step(&i.to_string())).is_ok())
            .count();
        // One object's Events share one queue; the task may already hold the first.
        assert!(
            (QUEUE_LENGTH..=QUEUE_LENGTH + 1).contains(&accepted),
            "{accepted}"
        );
        // Another object's queue may still take one.
        let others = (0..16).any(|i| log.record(regarding(&format!("other-{i}")), step("x")).is_ok());
        assert!(others);
        assert_eq!(log.record(regarding("u1"), step("more")), Err(Dropped::QueueFull));
    }

    fn published(name: &str, last: Timestamp) -> Published {
        Published {
            name: name.into(),
            count: 1,
            last,
        }
    }

    #[test]
    fn a_long_note_is_cut_at_a_character_within_the_apiservers_limit() {
        assert_eq!(within_note_limit("short"), "short");
        let long = "é".repeat(600);
        let cut = within_note_limit(&long);
        assert_eq!(cut.len(), 1024);
        assert!(long.starts_with(cut));
        let odd = format!("a{long}");
        assert_eq!(within_note_limit(&odd).len(), 1023, "never half a character");
    }

    #[test]
    fn a_series_lasts_its_ttl_and_expired_ones_are_swept() {
        let start = Timestamp::UNIX_EPOCH;
        let mut series = Series::default();
        series.insert("u1".into(), step("25 to 50"), published("llm.1", start));
        series.insert("u2".into(), step("25 to 50"), published("llm.2", start));
        let later = start + SERIES_TTL - SignedDuration::from_secs(1);
        assert_eq!(
            series.repeat_of("u1", &step("25 to 50"), later),
            Some(("llm.1".into(), 2))
        );
        // Another message, another object: not a repeat.
        assert_eq!(series.repeat_of("u1", &step("50 to 75"), later), None);
        assert_eq!(series.repeat_of("u3", &step("25 to 50"), later), None);
        // Expired: no longer a repeat, even before a sweep removes it.
        let expired = start + SERIES_TTL;
        series.swept = Some(expired);
        assert_eq!(series.repeat_of("u1", &step("25 to 50"), expired), None);
        assert_eq!(series.len(), 2);
        // The next sweep is due a minute later and removes both.
        assert_eq!(
            series.repeat_of("u1", &step("25 to 50"), expired + SWEEP_EVERY),
            None
        );
        assert_eq!(series.len(), 0);
    }

    #[test]
    fn forgetting_an_object_drops_only_its_series() {
        let now = Timestamp::UNIX_EPOCH;
        let mut series = Series::default();
        series.insert("u1".into(), step("a"), published("llm.1", now));
        series.insert("u1".into(), step("b"), published("llm.2", now));
        series.insert("u2".into(), step("a"), published("llm.3", now));
        series.forget("u1");
        assert_eq!(series.len(), 1);
        assert_eq!(series.repeat_of("u2", &step("a"), now), Some(("llm.3".into(), 2)));
    }

    #[test]
    fn an_event_after_the_publishers_stopped_is_reported_dropped() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let log = runtime.block_on(async { EventLog::new(answering(Requests::default()), "rayshift", None) });
        // The publishing tasks end with their runtime.
        drop(runtime);
        assert_eq!(
            log.record(regarding("u1"), step("25 to 50")),
            Err(Dropped::PublisherGone)
        );
    }
}
