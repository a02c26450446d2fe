//! Kubernetes Events (`events.k8s.io/v1`) about RayServices, one per thing that happened.
//!
//! kube-runtime's recorder folds every event with the same reason and object into one series and keeps the
//! first note, so nine of ten traffic steps would vanish from `kubectl get events`. Here the note is part of
//! the key: only the very same message repeated (a condition that persists) becomes a series.

use std::{collections::HashMap, sync::Mutex};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event as K8sEvent, events::v1::EventSeries},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};

/// Repeats of one message after this long start a new Event (as `kubectl` users expect from Kubernetes).
const SERIES_TTL: SignedDuration = SignedDuration::from_mins(6);

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

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    regarding: String,
    occurrence: Occurrence,
}

struct Published {
    name: String,
    count: i32,
    last: Timestamp,
}

/// Publishes Events as `controller` (and `instance`, the Pod).
pub struct EventLog {
    client: Client,
    controller: String,
    instance: String,
    published: Mutex<HashMap<Key, Published>>,
}

impl EventLog {
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        Self {
            client,
            controller: controller.to_string(),
            instance: instance.unwrap_or_else(|| controller.to_string()),
            published: Mutex::new(HashMap::new()),
        }
    }

    /// Creates the Event, or counts a repeat of the same message within the TTL into its series.
    pub async fn publish(&self, regarding: &ObjectReference, occurrence: Occurrence) -> kube::Result<()> {
        let now = Timestamp::now();
        let key = Key {
            regarding: regarding.uid.clone().unwrap_or_default(),
            occurrence,
        };
        let repeat = self.repeat_of(&key, now);
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
                let event = self.event(regarding, &key.occurrence, now);
                api.create(&PostParams::default(), &event)
                    .await?
                    .metadata
                    .name
                    .unwrap_or_default()
            }
        };
        let mut published = self.published.lock().unwrap_or_else(|e| e.into_inner());
        published.insert(
            key,
            Published {
                name,
                count,
                last: now,
            },
        );
        Ok(())
    }

    /// The Event to extend and its next count, if this message was published within the TTL.
    fn repeat_of(&self, key: &Key, now: Timestamp) -> Option<(String, i32)> {
        let mut published = self.published.lock().unwrap_or_else(|e| e.into_inner());
        published.retain(|_, p| now.duration_since(p.last) < SERIES_TTL);
        published.get(key).map(|p| (p.name.clone(), p.count + 1))
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
            note: Some(o.note.clone()),
            type_: Some(o.type_.as_str().to_string()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..K8sEvent::default()
        }
    }

    /// Forgets the series of an object that is gone.
    pub fn forget(&self, uid: &str) {
        let mut published = self.published.lock().unwrap_or_else(|e| e.into_inner());
        published.retain(|k, _| k.regarding != uid);
    }
}
