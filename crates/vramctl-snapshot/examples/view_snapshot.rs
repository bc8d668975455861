//! Opens a snapshot for the browser viewer and answers the page's first questions, printing
//! each phase's time and each answer's JSON size: what `vramctl snapshot view FILE` does
//! before and after it prints its URL, without the HTTP server (issue 32's figures in
//! docs/benchmarks.md; `/usr/bin/time -v` around it gives the peak RSS).
//!
//!     cargo run --release -p vramctl-snapshot --example view_snapshot -- FILE

use std::time::Instant;

use vramctl_snapshot::view::SnapshotView;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: view_snapshot FILE")?;
    let t0 = Instant::now();
    let snap = vramctl_snapshot::open_with(
        path.as_ref(),
        vramctl_snapshot::Limits::default(),
        vramctl_snapshot::TraceStacks::Read,
    )?;
    let t1 = Instant::now();
    let bytes = std::fs::metadata(&path)?.len();
    let view = SnapshotView::new(snap, path.clone(), bytes)?;
    let t2 = Instant::now();
    println!(
        "read {:.3} s, index {:.3} s: open {:.3} s",
        (t1 - t0).as_secs_f64(),
        (t2 - t1).as_secs_f64(),
        (t2 - t0).as_secs_f64()
    );
    let info = serde_json::to_vec(&view.info())?;
    println!("info: {} bytes", info.len());
    let devices: Vec<(i64, usize)> = view
        .info()
        .devices
        .iter()
        .map(|d| (d.device, d.events))
        .collect();
    for (device, events) in devices {
        let t = Instant::now();
        let tl = view.timeline(device, 0, None, 1600, 500)?;
        let peak = tl.peak_event;
        let json = serde_json::to_vec(&tl)?;
        println!(
            "device {device}: {events} events; timeline (1600 buckets, 500 bands) {:.3} s, {} bytes",
            t.elapsed().as_secs_f64(),
            json.len()
        );
        let t = Instant::now();
        let zoom = serde_json::to_vec(&view.timeline(
            device,
            (events / 2) as u64,
            Some((events / 2 + 10_000) as u64),
            1600,
            500,
        )?)?;
        println!(
            "  zoom to 10,000 events {:.3} s, {} bytes",
            t.elapsed().as_secs_f64(),
            zoom.len()
        );
        for (what, event) in [("first", 0), ("peak", peak), ("last", events - 1)] {
            let t = Instant::now();
            let state = serde_json::to_vec(&view.state_at(device, event as u64)?)?;
            println!(
                "  state at the {what} event ({event}) {:.3} s, {} bytes",
                t.elapsed().as_secs_f64(),
                state.len()
            );
        }
    }
    Ok(())
}
