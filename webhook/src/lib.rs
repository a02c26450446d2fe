//! Admission webhook server for RayService (see issue: webhook server). Calls the pure rules in `rayshift-api`.
