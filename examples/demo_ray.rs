//! The real Ray heads of the demo (`scripts/demo.sh`), the same ones the real-Ray test uses: for every head Pod
//! the real KubeRay operator creates in the namespace, a real Ray head starts at that Pod's IP in a network
//! namespace of its own, and a router stands in for cluster DNS in front of their dashboards. Prints the
//! `--dashboard-url-template` that reaches them, then runs until killed (stopping every head it started).
//!
//!   cargo run --example demo_ray -- KUBECONFIG NAMESPACE

// The test support carries knobs for the tests that the demo does not turn.
#![allow(dead_code)]

// The support modules name each other as `super::...`: at the crate root, that is this file.
mod cluster {
    /// The repository (the scripts and the Serve app live there).
    pub fn repo() -> std::path::PathBuf {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }
}
#[path = "../tests/support/dashboard.rs"]
mod dashboard;
#[path = "../tests/support/local_routes.rs"]
mod local_routes;
#[path = "../tests/support/observer.rs"]
mod observer;
#[path = "../tests/support/ray.rs"]
mod ray;

use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(kubeconfig), Some(ns)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: demo_ray KUBECONFIG NAMESPACE");
        std::process::exit(2);
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kc = Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    let client = Client::try_from(config).expect("client");
    let heads = ray::RayHeads::start(client, ns).await;
    println!("{}", heads.url_template());
    // Until the demo script stops it; dropping the heads stops the Ray processes.
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    drop(heads);
}
