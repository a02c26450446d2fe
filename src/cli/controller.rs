//! `rayshift controller` and `rayshift run` (webhook and controller in one process).

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};
use prometheus::Registry;
use rayshift_api::upgrade_control::ResourceAwareMode;
use rayshift_api::{FeatureGates, rayservice::RAYSHIFT_MANAGER};
use rayshift_controller::{ControllerOptions, Mode, apiserver, dashboard};

use super::{
    CliError, DeadlineArgs, GateArgs, duration_at_least, logging::LogArgs, runtime, serve_metrics, shutdown,
    webhook,
};

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum ModeArg {
    Observe,
    Reconcile,
}

#[derive(Debug, clap::Args)]
pub struct ControllerArgs {
    /// Kubeconfig file; in-cluster configuration (or KUBECONFIG) when unset.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Talk HTTP/2 to kube-apiserver when it offers it (one connection for every request and watch, as
    /// client-go); false keeps kube-rs's HTTP/1.1 stack, a connection per request in flight.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    kube_api_http2: bool,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long = "namespace", env = "RAYSHIFT_WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// observe: reconcile nothing, export metrics of every RayService from its status (beside an unmodified
    /// KubeRay); reconcile: also run the RayServices whose spec.managedBy is --managed-by (needs
    /// manifests/components/reconcile on KubeRay's CRD).
    #[arg(long, value_enum, default_value_t = ModeArg::Observe)]
    mode: ModeArg,
    /// Ray dashboard URL; {cluster}, {namespace}, {dashboardPort} (the head's port named dashboard, else
    /// 8265) and {clusterDomain} are filled in. A path prefix works.
    #[arg(long, default_value = dashboard::DEFAULT_URL_TEMPLATE)]
    dashboard_url_template: String,
    /// Health check of a head Pod's Serve proxy (it joins the serve Service only while healthy); {podIP},
    /// {port}, {pod}, {cluster} and {namespace} are filled in. Unused with --use-kubernetes-proxy.
    #[arg(long, default_value = dashboard::DEFAULT_HEALTH_URL_TEMPLATE)]
    serve_health_url_template: String,
    /// Check settled RayServices' Serve status and head proxies this often (one shared timer; a pass follows a change).
    #[arg(long, default_value = "10", value_parser = duration_at_least(0.5))]
    serve_health_interval_seconds: Duration,
    /// Reach dashboards (and head Pods' Serve proxies) through the apiserver's proxy instead.
    #[arg(long)]
    use_kubernetes_proxy: bool,
    /// Prometheus server (its root URL, e.g. http://prometheus.monitoring:9090) that evaluates RayServices'
    /// SLO checks (rayshift.io/slo-checks). Without it, a RayService with checks takes no traffic step after
    /// its first.
    #[arg(long, value_parser = http_url)]
    prometheus_url: Option<String>,
    /// When incremental upgrades of RayServices without rayshift.io/resource-aware pace ResourceAware (the
    /// active cluster gives way first): never, on-stall (once the pending cluster's Pods cannot be scheduled for
    /// lack of a resource) or always.
    #[arg(long, default_value = "never", value_parser = resource_aware_mode)]
    resource_aware: ResourceAwareMode,
    /// The cluster's DNS domain, for {clusterDomain} in --dashboard-url-template (KubeRay's CLUSTER_DOMAIN).
    #[arg(long, env = "CLUSTER_DOMAIN", default_value = "cluster.local")]
    cluster_domain: String,
    /// KubeRay's operator setting of the same name: true gives <rayservice>-head-svc a cluster IP when its type
    /// is ClusterIP or unset, instead of making it headless. As in KubeRay, only "true" (any case) turns it on.
    #[arg(
        long,
        env = "ENABLE_RAY_HEAD_CLUSTER_IP_SERVICE",
        value_name = "BOOL",
        default_value = "false",
        value_parser = only_true,
        action = clap::ArgAction::Set
    )]
    enable_ray_head_cluster_ip_service: bool,
    #[command(flatten)]
    zero_downtime: super::ZeroDowntime,
    /// Timeout of one Ray dashboard request.
    #[arg(long, default_value = "2", value_parser = duration_at_least(0.1))]
    dashboard_timeout_seconds: Duration,
    /// Ray dashboard and Serve proxy requests in flight at once, every cluster together.
    #[arg(long, default_value_t = dashboard::DEFAULT_MAX_IN_FLIGHT, value_parser = clap::value_parser!(u16).range(1..))]
    dashboard_max_in_flight: u16,
    /// Re-read Serve status this often while waiting for applications to run.
    #[arg(long, default_value = "2", value_parser = duration_at_least(0.05))]
    serve_poll_interval_seconds: Duration,
    /// Re-read Serve status this often while a due traffic step waits only for its capacity to be verified.
    #[arg(long, default_value = "0.05", value_parser = duration_at_least(0.01))]
    capacity_poll_interval_seconds: Duration,
    #[command(flatten)]
    drain: super::Drain,
    /// Run a full pass of a settled RayService this often (writes only on change); in between, the shared
    /// health timer checks its Serve status and head proxies every --serve-health-interval-seconds.
    #[arg(long, default_value = "300", value_parser = duration_at_least(1.0))]
    resync_interval_seconds: Duration,
    /// RayServices reconciled at once (0: no bound).
    #[arg(long, default_value_t = rayshift_controller::DEFAULT_CONCURRENCY)]
    concurrency: u16,
    /// Move traffic without waiting for Gateway/HTTPRoute status (Gateway controllers that publish none).
    #[arg(long)]
    skip_gateway_status_check: bool,
    /// Reconcile only while holding a coordination.k8s.io Lease (run several replicas safely).
    #[arg(long)]
    leader_elect: bool,
    /// Namespace of the leader Lease (default: POD_NAMESPACE, else the watched namespace, else default).
    #[arg(long)]
    leader_election_namespace: Option<String>,
    /// Name of the leader Lease.
    #[arg(long, default_value = "rayshift-controller")]
    leader_election_id: String,
    /// How long a leader Lease lasts unrenewed before another replica may take it.
    #[arg(long, default_value = "10s", value_parser = duration_at_least(0.1))]
    leader_elect_lease_duration: Duration,
    /// How long the leader keeps writing after its last renewal (shorter than the lease duration).
    #[arg(long, default_value = "7s", value_parser = duration_at_least(0.1))]
    leader_elect_renew_deadline: Duration,
    /// How often replicas try to take or renew the Lease (shorter than the renew deadline).
    #[arg(long, default_value = "2s", value_parser = duration_at_least(0.05))]
    leader_elect_retry_period: Duration,
}

impl ControllerArgs {
    fn options(&self, gates: FeatureGates, managed_by: &str, deadline: &DeadlineArgs) -> ControllerOptions {
        ControllerOptions {
            managed_by: managed_by.to_string(),
            mode: match self.mode {
                ModeArg::Observe => Mode::Observe,
                ModeArg::Reconcile => Mode::Reconcile,
            },
            feature_gates: gates,
            serve_poll_interval: self.serve_poll_interval_seconds,
            capacity_poll_interval: self.capacity_poll_interval_seconds,
            resync_interval: self.resync_interval_seconds,
            skip_gateway_status_check: self.skip_gateway_status_check,
            progress_deadline_seconds: deadline.progress_deadline_seconds,
            drain_seconds: self.drain.seconds,
            serve_health_url_template: self.serve_health_url_template.clone(),
            serve_health_interval: self.serve_health_interval_seconds,
            concurrency: self.concurrency,
            prometheus_url: self.prometheus_url.clone(),
            resource_aware: self.resource_aware,
            zero_downtime: self.zero_downtime.enabled,
            head_cluster_ip: self.enable_ray_head_cluster_ip_service,
            ..ControllerOptions::default()
        }
    }

    fn run_config(
        &self,
        gates: FeatureGates,
        managed_by: &str,
        deadline: &DeadlineArgs,
    ) -> Result<rayshift_controller::RunConfig, CliError> {
        let timing = rayshift_controller::leader::LeaseTiming {
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry: self.leader_elect_retry_period,
        }
        .checked()?;
        let leader_election = self.leader_elect.then(|| {
            let ns = self
                .leader_election_namespace
                .clone()
                .or_else(|| std::env::var("POD_NAMESPACE").ok())
                .or_else(|| self.namespace.clone())
                .unwrap_or_else(|| "default".into());
            let identity = std::env::var("POD_NAME").unwrap_or_else(|_| {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
                format!("{}-{}", host.trim(), std::process::id())
            });
            rayshift_controller::leader::LeaderElection::with_timing(
                ns,
                self.leader_election_id.clone(),
                identity,
                timing,
            )
        });
        Ok(rayshift_controller::RunConfig {
            namespace: self.namespace.clone(),
            options: self.options(gates, managed_by, deadline),
            dashboard_route: self.route(),
            dashboard_timeout: self.dashboard_timeout_seconds,
            dashboard_max_in_flight: self.dashboard_max_in_flight,
            leader_election,
            readiness: rayshift_controller::Readiness::default(),
        })
    }

    fn route(&self) -> dashboard::Route {
        if self.use_kubernetes_proxy {
            dashboard::Route::KubernetesProxy
        } else {
            let template = &self.dashboard_url_template;
            dashboard::Route::Template(dashboard::Dashboard::in_domain(template, &self.cluster_domain))
        }
    }

    async fn client(&self) -> Result<Client, CliError> {
        let config = match &self.kubeconfig {
            Some(path) => {
                let kc = Kubeconfig::read_from(path)?;
                Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?
            }
            None => Config::infer().await?,
        };
        let protocol = if self.kube_api_http2 {
            apiserver::Protocol::Http2
        } else {
            apiserver::Protocol::Http1
        };
        apiserver::client(config, protocol).map_err(CliError::Client)
    }
}

#[derive(Debug, clap::Args)]
pub struct Command {
    #[command(flatten)]
    controller: ControllerArgs,
    /// spec.managedBy value of the RayServices this controller owns.
    #[arg(long, default_value = RAYSHIFT_MANAGER)]
    managed_by: String,
    #[command(flatten)]
    gates: GateArgs,
    #[command(flatten)]
    deadline: DeadlineArgs,
    /// Plain-HTTP address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080", env = "RAYSHIFT_METRICS_ADDR")]
    metrics_addr: SocketAddr,
    #[command(flatten)]
    log: LogArgs,
}

pub fn run(cmd: Command) -> Result<ExitCode, CliError> {
    cmd.log.init();
    runtime()?.block_on(async move {
        let registry = Registry::new();
        let shutdown = shutdown::on_signal();
        let client = cmd.controller.client().await?;
        let config = cmd
            .controller
            .run_config(cmd.gates.gates(), &cmd.managed_by, &cmd.deadline)?;
        let readiness = rayshift_controller::Readiness::for_config(&config);
        let ready = Arc::new(move || readiness.ready());
        let admin_task = serve_metrics(cmd.metrics_addr, &registry, ready, &shutdown).await?;
        rayshift_controller::run(client, config, &registry, shutdown).await?;
        admin_task.abort();
        Ok(ExitCode::SUCCESS)
    })
}

/// `rayshift run`: the webhook and the controller in one process, one metrics endpoint.
#[derive(Debug, clap::Args)]
pub struct RunCommand {
    #[command(flatten)]
    controller: ControllerArgs,
    #[command(flatten)]
    webhook: webhook::Args,
    #[arg(long, default_value = "0.0.0.0:8080", env = "RAYSHIFT_METRICS_ADDR")]
    metrics_addr: SocketAddr,
    #[command(flatten)]
    log: LogArgs,
}

pub fn run_all(cmd: RunCommand) -> Result<ExitCode, CliError> {
    cmd.log.init();
    let webhook_options = cmd.webhook.options()?;
    runtime()?.block_on(async move {
        let registry = Registry::new();
        let shutdown = shutdown::on_signal();
        let client = cmd.controller.client().await?;
        let hook = rayshift_webhook::Webhook::bind(webhook_options, &registry).await?;
        let config = cmd.controller.run_config(
            cmd.webhook.gates.gates(),
            &cmd.webhook.managed_by,
            &cmd.webhook.deadline,
        )?;
        // One process, one /readyz: both halves must be ready.
        let (hook_ready, controller) = (
            hook.readiness(),
            rayshift_controller::Readiness::for_config(&config),
        );
        let ready = Arc::new(move || hook_ready() && controller.ready());
        let admin_task = serve_metrics(cmd.metrics_addr, &registry, ready, &shutdown).await?;
        let hook_task = tokio::spawn(hook.run(shutdown.clone()));
        rayshift_controller::run(client, config, &registry, shutdown).await?;
        hook_task
            .await
            .map_err(|e| CliError::Runtime(std::io::Error::other(e)))??;
        admin_task.abort();
        Ok(ExitCode::SUCCESS)
    })
}

/// An http(s) URL.
fn http_url(s: &str) -> Result<String, String> {
    let scheme_ok = s.starts_with("http://") || s.starts_with("https://");
    let host = s.split_once("://").map_or("", |(_, rest)| rest);
    if scheme_ok && !host.is_empty() && !host.contains(char::is_whitespace) {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not an http:// or https:// URL"))
    }
}

/// KubeRay's reading of `ENABLE_RAY_HEAD_CLUSTER_IP_SERVICE`: only "true", in any case, turns it on.
fn only_true(s: &str) -> Result<bool, String> {
    Ok(s.trim().eq_ignore_ascii_case("true"))
}

fn resource_aware_mode(s: &str) -> Result<ResourceAwareMode, String> {
    ResourceAwareMode::parse(s).ok_or_else(|| format!("{s:?} is not never, on-stall or always"))
}

#[cfg(test)]
mod tests {
    use super::{super::zero_downtime, only_true};

    #[test]
    fn only_true_gives_the_head_a_cluster_ip() {
        assert_eq!(only_true("TRUE"), Ok(true));
        for off in ["false", "1", "yes", ""] {
            assert_eq!(only_true(off), Ok(false), "{off}");
        }
    }

    #[test]
    fn only_false_turns_zero_downtime_off() {
        for off in ["false", "FALSE", "False"] {
            assert_eq!(zero_downtime(off), Ok(false), "{off}");
        }
        for on in ["true", "0", "no", "off", ""] {
            assert_eq!(zero_downtime(on), Ok(true), "{on}: KubeRay reads only \"false\"");
        }
    }
}
