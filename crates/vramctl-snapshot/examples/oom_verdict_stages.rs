//! Times what `vramctl run` does with the OOM observer's snapshot, stage by stage: the
//! read of the file, the parse, and the verdict (`observed_oom`), for issue 33's "verdict
//! within 2 s" (docs/benchmarks.md).
//!
//!     cargo run --release -p vramctl-snapshot --example oom_verdict_stages -- FILE [SEGMENT_BYTES]

use std::time::Instant;

use vramctl_snapshot::observed_oom::{self, Observed};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: oom_verdict_stages FILE [SEGMENT_BYTES]")?;
    let segment_bytes: u64 = std::env::args()
        .nth(2)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(2 << 20);
    let t0 = Instant::now();
    let bytes = std::fs::read(&path)?;
    let t1 = Instant::now();
    let snap = vramctl_snapshot::model::from_slice(&bytes, vramctl_snapshot::Limits::default())?;
    let t2 = Instant::now();
    let entries: usize = snap.device_traces.iter().map(|t| t.len()).sum();
    let device = snap
        .device_traces
        .iter()
        .position(|t| !t.is_empty())
        .unwrap_or(0);
    drop(snap);
    let observed = Observed {
        device: i64::try_from(device)?,
        segment_bytes,
        device_free_bytes: None,
        device_total_bytes: None,
        unix_ms: None,
    };
    let t3 = Instant::now();
    let verdict = observed_oom::verdict(&bytes, observed)?;
    let t4 = Instant::now();
    println!(
        "figure read_s {:.3}\nfigure parse_s {:.3}\nfigure verdict_s {:.3} (parse and classify)\n\
         figure classify_s {:.3}\n{} bytes, {entries} trace entries; cause {} fix {:?}",
        (t1 - t0).as_secs_f64(),
        (t2 - t1).as_secs_f64(),
        (t4 - t3).as_secs_f64(),
        (t4 - t3).saturating_sub(t2 - t1).as_secs_f64(),
        bytes.len(),
        verdict.verdict.cause.as_str(),
        verdict.verdict.fix,
    );
    Ok(())
}
