//! Watches a RayService, its HTTPRoute and its RayClusters and checks the controller invariants on every
//! version it sees:
//! - route weights sum to 100;
//! - a cluster's route weight never exceeds its target capacity (the active cluster's may by the dip a
//!   ResourceAware upgrade allows, `with_dip`; the pending cluster's never);
//! - active + pending capacity ≤ 100 + maxSurgePercent;
//! - no weight moved onto a cluster whose Serve apps are not RUNNING (per the dashboard, fake or real);
//! - the cluster carrying traffic is never deleted.
//!
//! Weight and capacity live in two objects seen through two watches, which can deliver out of order (after
//! a kube-apiserver restart one watch may relist before the other). So a route version is checked against
//! the capacity the RayService had just before it, ordered by resourceVersion (etcd's revision, which
//! orders writes across kinds on this test control plane), and not at all when a relist of the RayService
//! skipped versions around it (that capacity is unknown, not wrong).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Instant,
};

use futures::StreamExt;
use gateway_api::httproutes::HttpRoute;
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use rayshift_api::{RayCluster, RayService};

use super::dashboard::FakeDashboard;

/// Whether a cluster may carry `weight`% of traffic: Err(why not) when its Serve apps are not RUNNING.
pub type Serving = Arc<dyn Fn(&str, i64) -> Result<(), String> + Send + Sync>;

impl FakeDashboard {
    /// The fake dashboard's view: a cluster serves once it got a config, is up and its apps run.
    pub fn serving(&self, ns: &str) -> Serving {
        let (dashboard, ns) = (self.clone(), ns.to_string());
        Arc::new(move |cluster, _weight| {
            let state = dashboard.get(&ns, cluster);
            let running = state.config.is_some()
                && !state.down
                && state.app_status.as_deref().is_none_or(|s| s == "RUNNING");
            if running {
                Ok(())
            } else {
                Err("its apps are not RUNNING".into())
            }
        })
    }
}

#[derive(Debug, Default)]
pub struct Seen {
    pub violations: Vec<String>,
    /// Every distinct route weight set seen: (when, cluster -> weight).
    pub routes: Vec<(Instant, BTreeMap<String, i64>)>,
    /// Latest target capacity per cluster from the RayService status.
    pub capacity: BTreeMap<String, i64>,
    pub peak_total_capacity: i64,
    /// Each distinct `status.lastTrafficStepTime`: the controller's own clock at each traffic step, free of
    /// the watch's delivery jitter.
    pub step_times: Vec<jiff::Timestamp>,
    pub rayservice_versions: usize,
    /// Every RayCluster of the namespace that existed while watched (a duplicate shows up here).
    pub clusters: std::collections::BTreeSet<String>,
    /// ResourceAware: how far the active cluster's capacity may be below its traffic (0: not at all).
    pub dip: i64,
    /// Target capacity per cluster as the RayService status had it: (resourceVersion, cluster, percent, how
    /// far its traffic could be above it then: 0 for the pending cluster, `dip` for the active one).
    capacity_log: Vec<(u64, String, i64, i64)>,
    /// resourceVersion ranges a relist of the RayService skipped (versions never seen).
    capacity_gaps: Vec<(u64, u64)>,
    /// Route versions: (resourceVersion, weights), checked against `capacity_log` in `violations()`.
    route_log: Vec<(u64, BTreeMap<String, i64>)>,
}

fn rv<K: kube::Resource>(o: &K) -> u64 {
    o.meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl Seen {
    /// Route weights above the capacity the RayService had right before that route version.
    fn weights_over_capacity(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (route_rv, weights) in &self.route_log {
            if self
                .capacity_gaps
                .iter()
                .any(|(a, b)| a < route_rv && route_rv <= b)
            {
                continue;
            }
            for (cluster, w) in weights.iter().filter(|(_, w)| **w > 0) {
                let tc = self
                    .capacity_log
                    .iter()
                    .filter(|(r, c, _, _)| r < route_rv && c == cluster)
                    .max_by_key(|(r, _, _, _)| *r)
                    .map(|(_, _, tc, dip)| (*tc, *dip));
                if let Some((tc, _)) = tc.filter(|(tc, dip)| w > &(tc + dip)) {
                    out.push(format!("route: {w}% to {cluster} with target capacity {tc}%"));
                }
            }
        }
        out
    }
}

/// A route's weight per RayCluster (an HTTPRoute or GRPCRoute, as JSON), from the backendRefs to
/// `<cluster>-serve-svc`: only those are rayshift's (an adopted route has rules of its own). 1 when unset, as
/// the API says.
pub fn route_weights(route: &serde_json::Value) -> BTreeMap<String, i64> {
    let rules = route["spec"]["rules"].as_array().into_iter().flatten();
    rules
        .flat_map(|r| r["backendRefs"].as_array().into_iter().flatten())
        .filter_map(|b| {
            let cluster = b["name"].as_str()?.strip_suffix("-serve-svc")?;
            Some((cluster.to_string(), b["weight"].as_i64().unwrap_or(1)))
        })
        .collect()
}

pub struct Observer {
    pub seen: Arc<Mutex<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.tasks.iter().for_each(|t| t.abort());
    }
}

impl Observer {
    pub fn start(client: Client, ns: &str, rs: &str, max_surge: i64, serving: Serving) -> Self {
        Self::start_on(client, ns, rs, &format!("{rs}-httproute"), max_surge, serving)
    }

    /// Watches only the RayService's own clusters (KubeRay's association labels), not every cluster of the
    /// namespace: for many observers in a namespace of many RayServices (the scale test).
    #[allow(dead_code)]
    pub fn start_scoped(client: Client, ns: &str, rs: &str, max_surge: i64, serving: Serving) -> Self {
        let clusters = watcher::Config::default().labels(&format!(
            "ray.io/originated-from-cr-name={rs},ray.io/originated-from-crd=RayService"
        ));
        Self::start_with(
            client,
            ns,
            rs,
            &format!("{rs}-httproute"),
            max_surge,
            serving,
            clusters,
        )
    }

    /// Watches `route` for the weights (an adopted route has a name of its own).
    pub fn start_on(
        client: Client,
        ns: &str,
        rs: &str,
        route: &str,
        max_surge: i64,
        serving: Serving,
    ) -> Self {
        Self::start_with(
            client,
            ns,
            rs,
            route,
            max_surge,
            serving,
            watcher::Config::default(),
        )
    }

    fn start_with(
        client: Client,
        ns: &str,
        rs: &str,
        route: &str,
        max_surge: i64,
        serving: Serving,
        clusters_watched: watcher::Config,
    ) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let by_name = |n: &str| watcher::Config::default().fields(&format!("metadata.name={n}"));
        let mut tasks = Vec::new();

        let s = seen.clone();
        let services: Api<RayService> = Api::namespaced(client.clone(), ns);
        let cfg = by_name(rs);
        tasks.push(tokio::spawn(async move {
            let mut stream = watcher(services, cfg).default_backoff().boxed();
            let mut last_rv = 0;
            let mut relisting = false;
            // An error (the apiserver restarting) is retried by the watcher; the observer keeps watching.
            while let Some(event) = stream.next().await {
                let rs = match event {
                    Ok(watcher::Event::Init) => {
                        relisting = last_rv > 0;
                        continue;
                    }
                    Ok(watcher::Event::InitApply(rs) | watcher::Event::Apply(rs)) => rs,
                    _ => continue,
                };
                let mut seen = s.lock().unwrap();
                let version = rv(&rs);
                if std::mem::take(&mut relisting) {
                    seen.capacity_gaps.push((last_rv, version));
                }
                last_rv = version;
                seen.rayservice_versions += 1;
                let status = rs.status.clone().unwrap_or_default();
                if let Some(t) = status.progress.last_traffic_step_time
                    && seen.step_times.last() != Some(&t)
                {
                    seen.step_times.push(t);
                }
                let mut total = 0;
                let mut traffic = 0;
                let sides = [
                    (&status.active_service_status, false),
                    (&status.pending_service_status, true),
                ];
                for (side, pending) in sides.into_iter().filter_map(|(s, p)| Some((s.as_ref()?, p))) {
                    let (Some(name), Some(tc)) = (side.ray_cluster_name.clone(), side.target_capacity) else {
                        continue;
                    };
                    total += i64::from(tc);
                    seen.capacity.insert(name.clone(), i64::from(tc));
                    let dip = if pending { 0 } else { seen.dip };
                    seen.capacity_log
                        .push((version, name.clone(), i64::from(tc), dip));
                    let trp = i64::from(side.traffic_routed_percent.unwrap_or(0));
                    traffic += trp;
                    if trp > i64::from(tc) + dip {
                        seen.violations
                            .push(format!("status: {name} has traffic {trp}% over capacity {tc}%"));
                    }
                }
                let both = status
                    .pending_service_status
                    .as_ref()
                    .and_then(|p| p.ray_cluster_name.as_ref())
                    .is_some();
                if both && traffic != 100 {
                    seen.violations.push(format!("status: traffic sums to {traffic}"));
                }
                if total > 100 + max_surge {
                    seen.violations.push(format!(
                        "status: total capacity {total}% over {}%",
                        100 + max_surge
                    ));
                }
                seen.peak_total_capacity = seen.peak_total_capacity.max(total);
            }
        }));

        let s = seen.clone();
        let routes: Api<HttpRoute> = Api::namespaced(client.clone(), ns);
        let cfg = by_name(route);
        tasks.push(tokio::spawn(async move {
            let mut stream = watcher(routes, cfg).default_backoff().applied_objects().boxed();
            while let Some(event) = stream.next().await {
                let Ok(route) = event else { continue };
                let weights = route_weights(&serde_json::to_value(&route).unwrap_or_default());
                let mut seen = s.lock().unwrap();
                if seen.routes.last().is_some_and(|(_, w)| *w == weights) {
                    continue;
                }
                let sum: i64 = weights.values().sum();
                if sum != 100 {
                    seen.violations
                        .push(format!("route: weights sum to {sum}: {weights:?}"));
                }
                // Traffic moved onto a cluster: its apps must be RUNNING. Traffic moved off one (a rollback
                // taking it back from a cluster Serve is scaling down, DEPLOYING meanwhile) is not checked.
                let before = seen.routes.last().map(|(_, w)| w.clone()).unwrap_or_default();
                let raised = weights
                    .iter()
                    .filter(|(c, w)| **w > 0 && **w > before.get(*c).copied().unwrap_or(0));
                for (cluster, w) in raised {
                    if let Err(why) = serving(cluster, *w) {
                        seen.violations.push(format!("route: {w}% to {cluster}: {why}"));
                    }
                }
                seen.route_log.push((rv(&route), weights.clone()));
                seen.routes.push((Instant::now(), weights));
            }
        }));

        let s = seen.clone();
        let clusters: Api<RayCluster> = Api::namespaced(client, ns);
        tasks.push(tokio::spawn(async move {
            let mut stream = watcher(clusters, clusters_watched).default_backoff().boxed();
            while let Some(event) = stream.next().await {
                let c = match event {
                    Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c))
                        if c.metadata.deletion_timestamp.is_none() =>
                    {
                        s.lock().unwrap().clusters.insert(c.name_any());
                        continue;
                    }
                    Ok(watcher::Event::Delete(c)) => c,
                    Ok(watcher::Event::Apply(c)) => c,
                    _ => continue,
                };
                let mut seen = s.lock().unwrap();
                let weight = seen
                    .routes
                    .last()
                    .and_then(|(_, w)| w.get(&c.name_any()).copied())
                    .unwrap_or(0);
                if weight > 0 {
                    seen.violations.push(format!(
                        "cluster {} deleted while carrying {weight}% of traffic",
                        c.name_any()
                    ));
                }
            }
        }));
        Observer { seen, tasks }
    }

    pub fn violations(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap();
        let mut all = seen.violations.clone();
        all.extend(seen.weights_over_capacity());
        all
    }

    /// Lets the active cluster carry up to `dip` % more traffic than its capacity (a ResourceAware upgrade).
    pub fn with_dip(self, dip: i64) -> Self {
        self.set_dip(dip);
        self
    }

    /// From now on (0: no more dip).
    pub fn set_dip(&self, dip: i64) {
        self.seen.lock().unwrap().dip = dip;
    }

    /// A cluster's target capacity each time it changed, as the RayService status had it.
    pub fn capacities(&self, cluster: &str) -> Vec<i64> {
        let seen = self.seen.lock().unwrap();
        let mut out: Vec<i64> = Vec::new();
        for (_, _, tc, _) in seen.capacity_log.iter().filter(|(_, c, _, _)| c == cluster) {
            if out.last() != Some(tc) {
                out.push(*tc);
            }
        }
        out
    }

    /// Seconds between consecutive traffic steps on the controller's own clock (`status.lastTrafficStepTime`).
    pub fn step_gaps(&self) -> Vec<f64> {
        let seen = self.seen.lock().unwrap();
        seen.step_times
            .windows(2)
            .map(|w| w[1].duration_since(w[0]).as_secs_f64())
            .collect()
    }

    /// Times at which a given cluster's weight rose, in order.
    pub fn raises(&self, cluster: &str) -> Vec<(Instant, i64)> {
        let seen = self.seen.lock().unwrap();
        let mut out = Vec::new();
        let mut last = 0;
        for (t, w) in &seen.routes {
            let now = w.get(cluster).copied().unwrap_or(0);
            if now > last {
                out.push((*t, now));
            }
            last = now;
        }
        out
    }
}
