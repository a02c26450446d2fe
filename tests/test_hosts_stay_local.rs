//! Test traffic never leaves the machine: a real Ray head is started in its network namespace, used, and
//! stopped; afterwards its dashboard and Serve addresses fail locally at once ("no route to host" from the
//! unreachable route of tests/env/local-routes.sh), and so does every other invented address.

mod support;

use std::{
    io::ErrorKind,
    net::{SocketAddr, TcpStream},
    process::Command,
    time::{Duration, Instant},
};

use support::{cluster::repo, kuberay, local_routes, ray};

/// Head indexes of its own (this and the one below): the real-Ray tests count theirs from 1 to about 250.
const INDEX: u32 = 253;
const DASHBOARD: u16 = 8265;
const SERVE: u16 = 8000;

/// What `ip route get` says about an address.
fn route_get(ip: &str) -> (bool, String) {
    let out = Command::new("ip")
        .args(["route", "get", ip])
        .output()
        .expect("run ip route get");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn default_gateway() -> Option<String> {
    let out = Command::new("ip")
        .args(["-4", "route", "show", "default"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut words = text.split_whitespace();
    words.find(|w| *w == "via")?;
    words.next().map(str::to_string)
}

/// Connecting to `ip:port` must fail with "no route to host" within a second, never reach anything.
fn assert_fails_locally(ip: &str, port: u16) {
    let addr: SocketAddr = format!("{ip}:{port}").parse().unwrap();
    let start = Instant::now();
    let outcome = TcpStream::connect_timeout(&addr, Duration::from_secs(3));
    let took = start.elapsed();
    match outcome {
        Ok(_) => panic!("{addr} accepted a connection: something answers at an address with no test host"),
        Err(e) => {
            assert_eq!(
                e.kind(),
                ErrorKind::HostUnreachable,
                "{addr}: expected 'no route to host' from the local unreachable route, got {e}"
            );
            assert!(
                took < Duration::from_secs(1),
                "{addr} took {took:?} to fail: not local"
            );
        }
    }
    let (ok, text) = route_get(ip);
    assert!(
        !ok && text.contains("No route to host"),
        "ip route get {ip}: {text}"
    );
    if let Some(gw) = default_gateway() {
        assert!(
            !text.contains(&gw),
            "ip route get {ip} names the default gateway {gw}: {text}"
        );
    }
}

fn ray_sh(args: &[&str]) -> std::process::Output {
    Command::new("bash")
        .arg(ray::script())
        .args(args)
        .env("RAYSHIFT_OWNER_PID", std::process::id().to_string())
        .output()
        .expect("run ray.sh")
}

#[test]
fn a_stopped_heads_addresses_fail_locally() {
    a_stopped_head_fails_locally(INDEX, None);
}

/// As the real-Ray test runs them: the head takes the IP kwok gave KubeRay's head Pod (a point-to-point veth).
#[test]
fn a_stopped_head_at_a_pod_ip_fails_locally() {
    a_stopped_head_fails_locally(INDEX - 1, Some("10.250.143.250"));
}

fn a_stopped_head_fails_locally(index: u32, address: Option<&str>) {
    local_routes::require();
    let netns = format!("rayshift-{}-{index}", std::process::id());
    let app_dir = repo().join("tests/env/ray-app");
    let (index_arg, app_arg) = (index.to_string(), app_dir.to_string_lossy().into_owned());
    let mut args = vec!["start", &netns, &index_arg, &app_arg];
    args.extend(address);
    let started = ray_sh(&args);
    let stop = || ray_sh(&["stop", &netns]);
    if !started.status.success() {
        stop();
        panic!(
            "the head did not start: {}",
            String::from_utf8_lossy(&started.stderr)
        );
    }
    let ip = address.map_or_else(|| format!("10.250.{index}.2"), str::to_string);
    // While the head lives, its address is reached through its own, more specific route.
    let live = TcpStream::connect_timeout(
        &format!("{ip}:{DASHBOARD}").parse().unwrap(),
        Duration::from_secs(3),
    );
    let (_, live_route) = route_get(&ip);
    let stopped = stop();
    assert!(stopped.status.success(), "ray.sh stop failed");
    assert!(
        live.is_ok(),
        "the live head's dashboard was not reachable: {live:?}"
    );
    assert!(
        live_route.contains(&format!("rs{index}h")),
        "a live head is reached over its veth: {live_route}"
    );

    assert_fails_locally(&ip, DASHBOARD);
    assert_fails_locally(&ip, SERVE);
}

#[test]
fn every_invented_address_fails_locally() {
    local_routes::require();
    let ranges = local_routes::ranges();
    assert!(ranges.len() >= 2, "ranges: {ranges:?}");
    // The stand-in's made-up Pod and Service addresses, and the first and last of every range.
    let mut addresses = vec![
        kuberay::MADE_UP_POD_IP.to_string(),
        kuberay::MADE_UP_SERVICE_IP.to_string(),
    ];
    for r in &ranges {
        let (base, len) = r.split_once('/').expect("a CIDR");
        let base: std::net::Ipv4Addr = base.parse().expect("an IPv4 range");
        let size = 1u32 << (32 - len.parse::<u32>().expect("a prefix length"));
        let first = u32::from(base) + 1;
        addresses.push(std::net::Ipv4Addr::from(first).to_string());
        addresses.push(std::net::Ipv4Addr::from(first + size - 3).to_string());
    }
    for a in addresses {
        assert!(
            ranges.iter().any(|r| in_range(&a, r)),
            "{a} is outside every local range {ranges:?}"
        );
        assert_fails_locally(&a, 80);
    }
}

fn in_range(ip: &str, cidr: &str) -> bool {
    let (base, len) = cidr.split_once('/').unwrap();
    let (ip, base): (std::net::Ipv4Addr, std::net::Ipv4Addr) = (ip.parse().unwrap(), base.parse().unwrap());
    let mask = u32::MAX << (32 - len.parse::<u32>().unwrap());
    u32::from(ip) & mask == u32::from(base) & mask
}
