//! Signals to processes the tests started, by syscall rather than `/usr/bin/kill`: Debian 12's procps-ng 4.0.2
//! reads `kill -TERM -PGID` as `kill(-1, SIGTERM)`, which as root signals every process on the machine. It took
//! down CI runs and the shells around them whenever a test stopped a process group that way.
use rustix::process::{Pid, kill_process, kill_process_group};

pub use rustix::process::Signal as Sig;

/// Signals one process. False when it is gone (or the PID is not one a test could own).
pub fn process(pid: u32, sig: Sig) -> bool {
    own(pid).is_some_and(|p| kill_process(p, sig).is_ok())
}

/// Signals every process in the group `pgid` (a child spawned with `process_group(0)`).
pub fn group(pgid: u32, sig: Sig) -> bool {
    own(pgid).is_some_and(|p| kill_process_group(p, sig).is_ok())
}

/// Never 0 (our own group) or 1 (init, or with a group: everything).
fn own(pid: u32) -> Option<Pid> {
    i32::try_from(pid).ok().filter(|&p| p > 1).and_then(Pid::from_raw)
}
