//! What an idle node costs: each cland's CPU time per second of a cluster that runs
//! nothing, with N sleeping processes on every node against none (the heartbeat's
//! samplers read every process of their node).

use crate::cluster::{cpu_time, Cluster};
use crate::report::Report;
use crate::stats::Samples;
use std::time::{Duration, Instant};

/// Length of one window of CPU time.
const WINDOW: Duration = Duration::from_secs(5);

/// Windows per phase.
const WINDOWS: usize = 3;

/// Each cland's CPU time per second of wall time, `WINDOWS` windows of `WINDOW`, one
/// sample per node and window (as a duration: CPU time in one second).
fn cland_cpu(c: &Cluster) -> Samples {
    let pids: Vec<i32> = (1..=c.nodes).filter_map(|n| c.cland_pid(n)).collect();
    let mut s = Samples::default();
    for _ in 0..WINDOWS {
        let before: Vec<Duration> = pids.iter().map(|&p| cpu_time(p)).collect();
        let t = Instant::now();
        std::thread::sleep(WINDOW);
        let wall = t.elapsed().as_secs_f64();
        for (&p, b) in pids.iter().zip(before) {
            s.push(cpu_time(p).saturating_sub(b).div_f64(wall));
        }
    }
    s
}

/// cland's CPU per second on the idle cluster `c`, then with `per_node` sleeping processes
/// on each node (started by one shell per node, as `ps` and `proc` do), against the
/// same cluster without them.
pub fn idle_cost(c: &Cluster, r: &mut Report, per_node: usize) {
    let g = format!("idle node, {per_node} processes");
    println!("{g} (each cland's CPU time per second, {WINDOWS} windows of {WINDOW:?}):");
    let none = cland_cpu(c);
    let parents = c.sleepers(per_node, 3702);
    // The starts' own work (forks seen, genealogy) over before the windows begin.
    std::thread::sleep(Duration::from_secs(2));
    let with = cland_cpu(c);
    let base = "cland CPU per s, no process of its own";
    r.latency(&g, base, &none, None);
    r.latency(
        &g,
        &format!("cland CPU per s, {per_node} sleeping processes"),
        &with,
        Some(base),
    );
    for p in parents {
        c.kill_and_wait(p, true);
    }
}
