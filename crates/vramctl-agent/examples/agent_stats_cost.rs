//! What one poll of an agent costs the asking side: `cargo run --release -p vramctl-core
//! --example agent_stats_cost -- PID [N]` asks PID's agent for `stats` N times (default
//! 1000) through `agent_client::stats_of`, as `serve` and `record` do, and prints the wall
//! time and this process's CPU time per exchange (docs/benchmarks.md, "Agent figures").
//! A PID without an agent measures the cost of looking for one.

use std::time::{Duration, Instant};

/// This process's CPU time (user + system) from /proc/self/stat, in clock ticks' resolution.
fn cpu_time() -> Duration {
    let ticks = procfs::process::Process::myself()
        .and_then(|p| p.stat())
        .map_or(0, |s| s.utime + s.stime);
    Duration::from_secs_f64(ticks as f64 / procfs::ticks_per_second() as f64)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(pid) = args.next().and_then(|a| a.parse::<u32>().ok()) else {
        eprintln!("usage: agent_stats_cost PID [N]");
        std::process::exit(2);
    };
    let n: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let mut walls = Vec::with_capacity(n as usize);
    let mut answered = 0u32;
    let cpu_before = cpu_time();
    for _ in 0..n {
        let started = Instant::now();
        answered += u32::from(
            vramctl_agent::agent_client::stats_of(pid, Duration::from_millis(250)).is_some(),
        );
        walls.push(started.elapsed());
    }
    let cpu = cpu_time() - cpu_before;
    walls.sort_unstable();
    let pct = |p: f64| walls[((walls.len() - 1) as f64 * p) as usize];
    println!(
        "pid {pid}: {answered}/{n} answered; wall p50 {:?} p99 {:?}; client CPU {:?} per exchange",
        pct(0.5),
        pct(0.99),
        cpu / n
    );
}
