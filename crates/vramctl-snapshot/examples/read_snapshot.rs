//! Reads and summarizes a snapshot, printing each phase's time: what `vramctl snapshot FILE`
//! spends, without the CLI around it (for profilers: `valgrind --tool=callgrind`, `perf`).
//!
//!     cargo run --release -p vramctl-snapshot --example read_snapshot -- FILE

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: read_snapshot FILE")?;
    let t0 = Instant::now();
    // As `vramctl snapshot FILE` reads it; VRAMCTL_TRACE_STACKS=1 reads the entries' stacks too.
    let stacks = if std::env::var_os("VRAMCTL_TRACE_STACKS").is_some() {
        vramctl_snapshot::TraceStacks::Read
    } else {
        vramctl_snapshot::TraceStacks::Skip
    };
    let snap =
        vramctl_snapshot::open_with(path.as_ref(), vramctl_snapshot::Limits::default(), stacks)?;
    let t1 = Instant::now();
    let summary = vramctl_snapshot::summarize(&snap);
    let t2 = Instant::now();
    println!(
        "read {:.3} s, summary {:.3} s: {} trace entries, {} stacks, {} frames, {} devices",
        (t1 - t0).as_secs_f64(),
        (t2 - t1).as_secs_f64(),
        summary.trace_entries,
        snap.stacks.len(),
        snap.frames.len(),
        summary.devices.len()
    );
    Ok(())
}
