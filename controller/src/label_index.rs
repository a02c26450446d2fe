//! Names of cached objects by namespace and the value of one label, kept beside a reflector store: a pass finds
//! a RayService's clusters, or a cluster's head Pod, without scanning the whole store. A scan in every pass made
//! one health period cost O(n²) at 1,000 RayServices (issue 16).
//!
//! Fed by the same watch events as the store, after the store: an object is in the store before it is
//! indexed, and a lookup checks the store, so a name the index still holds for a deleted object finds nothing.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, RwLock},
};

use kube::{Resource, ResourceExt, runtime::watcher};

type Key = (String, String);

#[derive(Clone, Debug)]
pub struct LabelIndex {
    label: &'static str,
    inner: Arc<RwLock<Indexed>>,
}

#[derive(Debug, Default)]
struct Indexed {
    /// (namespace, label value) → names.
    names: HashMap<Key, BTreeSet<String>>,
    /// (namespace, name) → label value.
    value_of: HashMap<Key, String>,
    /// A re-list in progress: what it has listed so far (it replaces everything when done).
    relist: Option<HashMap<Key, String>>,
    /// The first list is done.
    synced: bool,
}

impl Indexed {
    fn insert(&mut self, (ns, name): Key, value: String) {
        self.remove(&ns, &name);
        self.names
            .entry((ns.clone(), value.clone()))
            .or_default()
            .insert(name.clone());
        self.value_of.insert((ns, name), value);
    }

    fn remove(&mut self, ns: &str, name: &str) {
        let key = (ns.to_string(), name.to_string());
        let Some(value) = self.value_of.remove(&key) else {
            return;
        };
        let by_value = (key.0, value);
        if let Some(names) = self.names.get_mut(&by_value) {
            names.remove(name);
            if names.is_empty() {
                self.names.remove(&by_value);
            }
        }
    }
}

impl LabelIndex {
    pub fn new(label: &'static str) -> Self {
        Self {
            label,
            inner: Arc::default(),
        }
    }

    /// Follows one watch event.
    pub fn apply<K: Resource>(&self, event: &watcher::Event<K>) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(o) => match self.entry(o) {
                (key, Some(value)) => inner.insert(key, value),
                ((ns, name), None) => inner.remove(&ns, &name),
            },
            watcher::Event::Delete(o) => {
                let (ns, name) = self.entry(o).0;
                inner.remove(&ns, &name);
            }
            watcher::Event::Init => inner.relist = Some(HashMap::new()),
            watcher::Event::InitApply(o) => {
                if let (key, Some(value)) = self.entry(o) {
                    inner.relist.get_or_insert_default().insert(key, value);
                }
            }
            watcher::Event::InitDone => {
                let listed = inner.relist.take().unwrap_or_default();
                *inner = Indexed {
                    synced: true,
                    ..Indexed::default()
                };
                for (key, value) in listed {
                    inner.insert(key, value);
                }
            }
        }
    }

    /// Names of the objects in `ns` whose label has `value`; `None` until the first list is done.
    pub fn names(&self, ns: &str, value: &str) -> Option<Vec<String>> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let names = inner.names.get(&(ns.to_string(), value.to_string()));
        inner
            .synced
            .then(|| names.map(|n| n.iter().cloned().collect()).unwrap_or_default())
    }

    fn entry<K: Resource>(&self, o: &K) -> (Key, Option<String>) {
        let key = (o.namespace().unwrap_or_default(), o.name_any());
        (key, o.labels().get(self.label).cloned())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    use super::LabelIndex;

    fn pod(ns: &str, name: &str, cluster: Option<&str>) -> Pod {
        let labels = cluster.map(|c| json!({"ray.io/cluster": c})).unwrap_or(json!({}));
        serde_json::from_value(json!({"metadata": {"namespace": ns, "name": name, "labels": labels}}))
            .unwrap()
    }

    fn names(index: &LabelIndex, ns: &str, value: &str) -> Vec<String> {
        index.names(ns, value).expect("listed")
    }

    #[test]
    fn follows_applies_deletes_and_relabels() {
        let index = LabelIndex::new("ray.io/cluster");
        assert_eq!(index.names("a", "llm-x"), None, "not listed yet");
        index.apply(&Event::<Pod>::Init);
        index.apply(&Event::<Pod>::InitDone);
        index.apply(&Event::Apply(pod("a", "h1", Some("llm-x"))));
        index.apply(&Event::Apply(pod("b", "h1", Some("llm-x"))));
        index.apply(&Event::Apply(pod("a", "h2", Some("llm-x"))));
        assert_eq!(names(&index, "a", "llm-x"), ["h1", "h2"]);
        assert_eq!(names(&index, "b", "llm-x"), ["h1"], "per namespace");
        index.apply(&Event::Apply(pod("a", "h2", Some("llm-y"))));
        assert_eq!(names(&index, "a", "llm-x"), ["h1"], "a relabelled object moves");
        assert_eq!(names(&index, "a", "llm-y"), ["h2"]);
        index.apply(&Event::Apply(pod("a", "h2", None)));
        assert!(names(&index, "a", "llm-y").is_empty(), "label removed");
        index.apply(&Event::Delete(pod("a", "h1", Some("llm-x"))));
        assert!(names(&index, "a", "llm-x").is_empty());
        assert_eq!(names(&index, "b", "llm-x"), ["h1"]);
    }

    #[test]
    fn a_relist_replaces_everything_when_done() {
        let index = LabelIndex::new("ray.io/cluster");
        index.apply(&Event::<Pod>::Init);
        index.apply(&Event::<Pod>::InitDone);
        index.apply(&Event::Apply(pod("a", "gone", Some("llm-x"))));
        index.apply(&Event::<Pod>::Init);
        index.apply(&Event::InitApply(pod("a", "h1", Some("llm-x"))));
        assert_eq!(
            names(&index, "a", "llm-x"),
            ["gone"],
            "the old state serves until the list is done"
        );
        index.apply(&Event::<Pod>::InitDone);
        assert_eq!(names(&index, "a", "llm-x"), ["h1"]);
    }
}
