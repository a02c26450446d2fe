//! The tests stop their own processes and nothing else. Debian 12's `/usr/bin/kill -TERM -PGID` sends
//! `kill(-1, SIGTERM)`: run as root, a test that stopped a Ray worker node's group that way stopped every process
//! on the machine, CI included. Tests signal through `support::signal`, by syscall.

mod support;

use std::{
    os::unix::process::CommandExt,
    process::{Child, Command},
    time::{Duration, Instant},
};

use support::{
    cluster::repo,
    signal::{self, Sig},
};

fn group_leader(script: &str) -> Child {
    Command::new("bash")
        .args(["-c", script])
        .process_group(0)
        .spawn()
        .unwrap()
}

/// PIDs whose process group is `pgid` (field 5 of /proc/PID/stat, after the command's closing parenthesis).
fn members(pgid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let after = stat.rsplit_once(')').map(|(_, a)| a).unwrap_or("");
            let fields: Vec<&str> = after.split_whitespace().collect();
            fields.get(2) == Some(&pgid.to_string().as_str()) && fields.first() != Some(&"Z")
        })
        .collect()
}

#[test]
fn stopping_a_group_stops_all_of_it_and_nothing_else() {
    let mut node = group_leader("sleep 60 & sleep 60 & wait");
    let mut bystander = group_leader("sleep 60");
    let deadline = Instant::now() + Duration::from_secs(10);
    while members(node.id()).len() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(members(node.id()).len(), 3, "bash and its two sleeps");

    assert!(signal::group(node.id(), Sig::TERM));
    node.wait().unwrap();
    while !members(node.id()).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(members(node.id()), Vec::<u32>::new(), "the whole group stopped");
    assert!(
        bystander.try_wait().unwrap().is_none(),
        "another group was signalled"
    );

    assert!(signal::process(bystander.id(), Sig::KILL));
    assert!(!bystander.wait().unwrap().success());
}

/// SIGCONT: harmless to everyone if the guard ever gave way, yet the answer would tell.
#[test]
fn ids_no_test_owns_are_refused() {
    assert!(!signal::group(0, Sig::CONT), "our own group");
    assert!(!signal::group(1, Sig::CONT), "kill(-1): every process");
    assert!(!signal::process(0, Sig::CONT));
    assert!(!signal::process(1, Sig::CONT), "init");
    assert!(!signal::process(u32::MAX, Sig::CONT), "-1 once cast");
}

#[test]
fn no_test_runs_the_kill_binary() {
    let needle = ["Command::new(\"", "kill\")"].concat();
    let mut offenders = vec![];
    let mut dirs = vec![repo().join("tests")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && std::fs::read_to_string(&path).unwrap().contains(&needle)
            {
                offenders.push(path);
            }
        }
    }
    assert!(offenders.is_empty(), "use support::signal instead: {offenders:?}");
}
