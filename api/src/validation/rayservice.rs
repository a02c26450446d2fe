//! RayService rules.
use super::{ValidationConfig, Verdict};
use crate::RayService;

pub fn validate(_new: &RayService, _old: Option<&RayService>, _cfg: &ValidationConfig) -> Verdict {
    Verdict::default()
}
