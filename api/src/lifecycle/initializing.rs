//! KubeRay 1.6's `ray.io/initializing-timeout`: a RayService that is not Ready within the timeout of its
//! creation fails for good. Its clusters are let go (deleted after the deletion delay), its Ready condition
//! says `InitializingTimeout`, and a spec change does not bring it back: it must be deleted and created again.
//! On scarce GPUs this frees what a cluster that cannot start holds.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::{
    conditions::{READY, reason, says_initializing},
    validation::go_duration_seconds,
};

pub const INITIALIZING_TIMEOUT_ANNOTATION: &str = "ray.io/initializing-timeout";

/// Where a RayService stands against its initializing timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Initialization {
    /// No timeout set (or one admission would deny), or the RayService has served.
    Unlimited,
    /// Still initializing; it fails at `deadline` unless Ready by then.
    Until { deadline: Timestamp },
    /// Failed this pass, after `spent` initializing.
    TimedOut {
        timeout: SignedDuration,
        spent: SignedDuration,
    },
    /// Failed in an earlier pass. Terminal.
    Failed,
}

impl Initialization {
    /// Failed, this pass or before: the RayService keeps no cluster.
    pub fn failed(&self) -> bool {
        matches!(self, Initialization::TimedOut { .. } | Initialization::Failed)
    }

    /// KubeRay's Ready message for it.
    pub fn message(timeout: SignedDuration, spent: SignedDuration) -> String {
        format!(
            "RayService failed to become ready within the configured timeout of {}. Time spent initializing: {}",
            go_duration(timeout),
            go_duration(spent)
        )
    }
}

/// Judges the RayService from its annotations, its previous conditions and whether a cluster was ever
/// active. Initializing means never Ready and no cluster active yet: Ready is False with reason
/// `Initializing`, or `DashboardUnreachable` (rayshift's reason while a first head's dashboard does not answer).
/// KubeRay also fails a RayService whose first cluster is active but has no serve endpoint; rayshift does not,
/// so it never lets go of a cluster the serve Service selects. The time counts from Ready's last transition,
/// as KubeRay counts it.
pub fn judge(
    annotations: &BTreeMap<String, String>,
    conditions: &[Condition],
    had_active: bool,
    now: Timestamp,
) -> Initialization {
    let ready = conditions.iter().find(|c| c.type_ == READY);
    if ready.is_some_and(|c| c.status == "False" && c.reason == reason::INITIALIZING_TIMEOUT) {
        return Initialization::Failed;
    }
    let (Some(timeout), Some(ready)) = (timeout(annotations), ready) else {
        return Initialization::Unlimited;
    };
    let initializing = !had_active && ready.status == "False" && says_initializing(ready, had_active);
    if !initializing {
        return Initialization::Unlimited;
    }
    let since = ready.last_transition_time.0;
    match since.checked_add(timeout) {
        Ok(deadline) if now >= deadline => Initialization::TimedOut {
            timeout,
            spent: now.duration_since(since),
        },
        Ok(deadline) => Initialization::Until { deadline },
        // Past the last representable instant: never.
        Err(_) => Initialization::Unlimited,
    }
}

/// The annotation as KubeRay reads it: a Go duration, else whole seconds; `None` unless positive.
fn timeout(annotations: &BTreeMap<String, String>) -> Option<SignedDuration> {
    let raw = annotations.get(INITIALIZING_TIMEOUT_ANNOTATION)?;
    let secs = go_duration_seconds(raw).or_else(|| raw.parse::<i64>().ok().map(|n| n as f64))?;
    // Admission lets any positive duration through, `9999999999999h` included: too long for a timestamp is never.
    SignedDuration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| d.is_positive())
}

/// A duration as Go prints one (`1h2m3.5s`, `45s`, `250ms`), to the millisecond.
pub fn go_duration(d: SignedDuration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    let sign = if ms < 0 { "-" } else { "" };
    let ms = ms.unsigned_abs();
    if ms < 1000 {
        return format!("{sign}{ms}ms");
    }
    let (h, m, s, frac) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    let secs = match frac {
        0 => format!("{s}s"),
        f => format!("{s}.{}s", format!("{f:03}").trim_end_matches('0')),
    };
    match (h, m) {
        (0, 0) => format!("{sign}{secs}"),
        (0, m) => format!("{sign}{m}m{secs}"),
        (h, m) => format!("{sign}{h}h{m}m{secs}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn ready(status: &str, reason: &str, since: i64) -> Vec<Condition> {
        vec![Condition {
            type_: READY.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: Time(at(since)),
        }]
    }

    fn timeout_of(raw: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(INITIALIZING_TIMEOUT_ANNOTATION.to_string(), raw.to_string())])
    }

    #[test]
    fn a_never_ready_rayservice_times_out_once_the_timeout_has_passed() {
        let initializing = ready("False", reason::INITIALIZING, 100);
        for raw in ["30s", "30", "0.5m"] {
            assert_eq!(
                judge(&timeout_of(raw), &initializing, false, at(110)),
                Initialization::Until { deadline: at(130) },
                "{raw}"
            );
        }
        let out = judge(&timeout_of("30s"), &initializing, false, at(131));
        assert_eq!(
            out,
            Initialization::TimedOut {
                timeout: SignedDuration::from_secs(30),
                spent: SignedDuration::from_secs(31),
            }
        );
        // A first head's dashboard that never answered is initializing too; after a cluster was active it is not.
        let unreachable = ready("False", reason::DASHBOARD_UNREACHABLE, 100);
        assert!(judge(&timeout_of("30s"), &unreachable, false, at(131)).failed());
        for after_a_cluster_was_active in [&unreachable, &initializing] {
            let out = judge(&timeout_of("30s"), after_a_cluster_was_active, true, at(131));
            assert_eq!(out, Initialization::Unlimited);
        }
    }

    #[test]
    fn served_unset_or_invalid_timeouts_never_fire() {
        let initializing = ready("False", reason::INITIALIZING, 0);
        let late = at(1_000_000);
        assert_eq!(
            judge(&BTreeMap::new(), &initializing, false, late),
            Initialization::Unlimited
        );
        for bad in [
            "0",
            "-5s",
            "5 minutes",
            "",
            "99999999999999999999h",
            "2000000000h",
        ] {
            assert_eq!(
                judge(&timeout_of(bad), &initializing, false, late),
                Initialization::Unlimited,
                "{bad}"
            );
        }
        for served in [
            ready("True", reason::NON_ZERO_SERVE_ENDPOINTS, 0),
            ready("False", reason::ZERO_SERVE_ENDPOINTS, 0),
        ] {
            assert_eq!(
                judge(&timeout_of("1s"), &served, true, late),
                Initialization::Unlimited
            );
        }
        // The first pass has no Ready condition yet: it sets it, the clock starts there.
        assert_eq!(
            judge(&timeout_of("1s"), &[], false, late),
            Initialization::Unlimited
        );
    }

    #[test]
    fn a_timed_out_rayservice_stays_failed_whatever_changes() {
        let failed = ready("False", reason::INITIALIZING_TIMEOUT, 100);
        for annotations in [timeout_of("30s"), BTreeMap::new()] {
            assert_eq!(
                judge(&annotations, &failed, false, at(500)),
                Initialization::Failed
            );
        }
    }

    #[test]
    fn durations_read_as_go_prints_them() {
        let ms = SignedDuration::from_millis;
        assert_eq!(go_duration(ms(0)), "0s");
        assert_eq!(go_duration(ms(250)), "250ms");
        assert_eq!(go_duration(ms(30_000)), "30s");
        assert_eq!(go_duration(ms(31_500)), "31.5s");
        assert_eq!(go_duration(ms(60_000)), "1m0s");
        assert_eq!(go_duration(ms(3_723_040)), "1h2m3.04s");
        assert_eq!(
            Initialization::message(ms(30_000), ms(31_020)),
            "RayService failed to become ready within the configured timeout of 30s. Time spent initializing: 31.02s"
        );
    }
}
