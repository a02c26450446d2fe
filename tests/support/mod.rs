//! Test support shared by the end-to-end tests.
#![allow(dead_code)]

pub mod autoscaler;
pub mod cluster;
pub mod controller;
pub mod dashboard;
pub mod gpu_workers;
pub mod image;
pub mod incremental;
pub mod kuberay;
pub mod load;
pub mod local_routes;
pub mod observer;
pub mod prometheus;
pub mod ray;
pub mod signal;
pub mod status;
pub mod traefik;
pub mod wait;
pub mod webhook;
