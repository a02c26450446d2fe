//! RayService controller (kube-runtime). Observes, asks the pure planner in `rayshift-api`, applies.
