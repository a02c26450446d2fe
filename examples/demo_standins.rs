//! The stand-ins of the demo (`scripts/demo.sh`), the same ones the tests use: a fake Ray dashboard with
//! the real Serve API's shapes (the Pods kwok runs have no Ray in them) and a Gateway controller that
//! accepts Gateways and HTTPRoutes (Traefik comes with the Gateway issue). KubeRay's RayCluster controller
//! is the real one. Prints the dashboard URL template, then runs until killed.
//!
//!   cargo run --example demo_standins -- KUBECONFIG NAMESPACE

// The stand-ins carry knobs for the tests that the demo does not turn.
#![allow(dead_code)]

#[path = "../tests/support/dashboard.rs"]
mod dashboard;
#[path = "../tests/support/gateway.rs"]
mod gateway;

use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(kubeconfig), Some(ns)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: demo_standins KUBECONFIG NAMESPACE");
        std::process::exit(2);
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kc = Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    let client = Client::try_from(config).expect("client");
    let dash = dashboard::FakeDashboard::start().await;
    let _gateway = gateway::GatewayStandIn::start(client, ns);
    println!("{}", dash.url_template());
    std::future::pending::<()>().await;
}
