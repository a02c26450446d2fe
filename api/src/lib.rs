//! rayshift's pure core: `ray.io/v1` types, admission rules, defaulting and the upgrade planner.
//!
//! Nothing in this crate performs I/O; the webhook and the controller call into it.

pub mod cluster_spec;
pub mod conditions;
pub mod crd;
pub mod defaulting;
pub mod documents;
pub mod error;
pub mod feature_gates;
pub mod gateway_attachment;
pub mod lifecycle;
pub mod observed;
pub mod progress;
pub mod quantity;
pub mod raycluster;
pub mod rayservice;
mod schema;
pub mod serve_grpc;
pub mod slo;
pub mod stall;
pub mod template_view;
pub mod upgrade;
pub mod upgrade_control;
pub mod validation;

pub use error::{Error, Result};
pub use feature_gates::{FeatureGates, KubeRayVersion};
pub use raycluster::{RayCluster, RayClusterSpec, RayClusterStatus};
pub use rayservice::{RayService, RayServiceSpec, RayServiceStatuses, UpgradeType};
